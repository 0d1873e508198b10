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

    private NativeTestSupport() {}

    /** A fresh sink with workable defaults (lines format, suffix .txt). */
    static long open(File out, String sinkId) {
        return open(out, sinkId, 0, 1, 3_600_000L, -1L, new byte[0][]);
    }

    static long open(
            File out, String sinkId, int subtask, int parallelism, long retentionMs,
            long restoredCheckpointId, byte[][] knownHandles) {
        return NativeBridge.open(
                sinkId, RUN_ID, subtask, parallelism, out.getAbsolutePath(), "part", ".txt", false,
                retentionMs, 10_000L, 60_000L, false, false, 3, 10L, 100L,
                restoredCheckpointId, knownHandles);
    }

    /** {@code [u32 LE length][bytes]} per record, in a direct buffer; returns it with its length as limit. */
    static ByteBuffer batch(String... records) {
        int size = 0;
        for (String r : records) {
            size += 4 + r.getBytes(StandardCharsets.UTF_8).length;
        }
        // Extra capacity: the bridge must read only `length` bytes.
        ByteBuffer buf = ByteBuffer.allocateDirect(size + 16).order(ByteOrder.LITTLE_ENDIAN);
        for (String r : records) {
            byte[] b = r.getBytes(StandardCharsets.UTF_8);
            buf.putInt(b.length).put(b);
        }
        buf.flip();
        return buf;
    }

    static long write(long sink, byte[] handle, String... records) {
        ByteBuffer b = batch(records);
        return NativeBridge.write(sink, handle, b, b.limit());
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
