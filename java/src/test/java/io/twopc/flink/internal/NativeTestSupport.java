package io.twopc.flink.internal;

import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.stream.Collectors;
import java.util.stream.Stream;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;

/** Shared helpers of the NativeBridge tests. */
final class NativeTestSupport {
    static final String RUN_ID = "a1b2c3d4e5f60718293a4b5c6d7e8f90";
    static final ObjectMapper JSON = new ObjectMapper();
    static final long CHECKPOINT_INTERVAL_MS = 10_000L;

    private NativeTestSupport() {}

    /**
     * The configuration the builders write (see {@code TwopcSinkOptions.toConfigJson}), for a
     * directory: lines format, parts {@code part-<txn>.txt}, retry back-off short for tests.
     */
    static String fsConfig(File out, String sinkId, long retentionMs) {
        return fsConfig(out.getAbsolutePath(), sinkId, retentionMs, "FAIL", "FAIL");
    }

    static String fsConfig(String path, String sinkId, long retentionMs, String rewind, String freshStart) {
        return Json.object()
                .put("version", 1)
                .put("sink", Json.object()
                        .put("sinkId", sinkId)
                        .put("instance", "00000000000000aa")
                        .put("retentionMs", retentionMs)
                        .put("restartAllowanceMs", 60_000L)
                        .put("checkpointIntervalMs", 0L)
                        .put("rewindPolicy", rewind)
                        .put("freshStartPolicy", freshStart)
                        .put("commitMaxAttempts", 3)
                        .put("commitInitialBackoffMs", 10L)
                        .put("commitMaxBackoffMs", 100L)
                        .put("ownerWaitMs", 0L))
                .put("destination", Json.object()
                        .put("type", "filesystem")
                        .put("path", path)
                        .put("partPrefix", "part")
                        .put("partSuffix", ".txt")
                        .put("recordFormat", "LINES")
                        .put("ioMode", "AUTO"))
                .end();
    }

    /** A fresh sink (the SinkFunction shim's writer and committer in one) with workable defaults. */
    static long open(File out, String sinkId) {
        return open(out, sinkId, 0, 1, 3_600_000L, -1L, new byte[0][]);
    }

    static long open(
            File out, String sinkId, int subtask, int parallelism, long retentionMs,
            long restoredCheckpointId, byte[][] knownHandles) {
        return NativeBridge.openSink(
                fsConfig(out, sinkId, retentionMs), RUN_ID, subtask, parallelism, 0, CHECKPOINT_INTERVAL_MS,
                null, restoredCheckpointId, new byte[0][], knownHandles);
    }

    /**
     * The records as the writers send them for LINES output (a line break after each), filled by
     * the writers' own {@link RecordBatcher}; buffers larger than the batch, since the bridge must
     * read only what the lengths say.
     */
    static RecordBatcher.Batch batch(String... records) {
        RecordBatcher.Batch[] filled = new RecordBatcher.Batch[1];
        RecordBatcher batcher = new RecordBatcher(1 << 16, records.length + 8, '\n', b -> filled[0] = b);
        for (String r : records) {
            batcher.add(r.getBytes(StandardCharsets.UTF_8));
        }
        batcher.flush();
        return filled[0];
    }

    static long write(long sink, byte[] handle, String... records) {
        if (records.length == 0) {
            return NativeBridge.write(sink, handle, ByteBuffer.allocateDirect(0), 0, ByteBuffer.allocateDirect(0), 0,
                    RecordBatcher.NO_TERMINATOR);
        }
        return NativeBridge.write(sink, handle, batch(records));
    }

    static JsonNode describe(byte[] handle) throws IOException {
        return JSON.readTree(NativeBridge.describeHandle(handle));
    }

    static String transactionOf(byte[] handle) throws IOException {
        return describe(handle).get("transaction").asText();
    }

    /** Visible output files: everything not under a `_` or `.` name. */
    static List<Path> visibleFiles(File out) throws IOException {
        try (Stream<Path> files = Files.list(out.toPath())) {
            return files.filter(p -> {
                String n = p.getFileName().toString();
                return !n.startsWith("_") && !n.startsWith(".");
            }).sorted().collect(Collectors.toList());
        }
    }

    static String read(Path p) throws IOException {
        return new String(Files.readAllBytes(p), StandardCharsets.UTF_8);
    }
}
