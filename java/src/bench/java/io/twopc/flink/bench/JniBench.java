package io.twopc.flink.bench;

import io.twopc.flink.TwopcSinkBuilder;
import io.twopc.flink.internal.NativeBridge;
import io.twopc.flink.internal.RecordBatcher;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The cost of crossing into the Rust core per record: {@code NativeBridge.write} with batches of
 * 1 record (one call per record) up to the sink's default batch, the way {@code TwopcSink} calls
 * it (records collected by its {@code RecordBatcher}, then one call per batch). The destination is the
 * filesystem one on a tmpfs directory, so what is measured is the bridge and the core, not a
 * disk. Batch sizes are measured in rotation, several rounds, medians reported.
 *
 * <p>Beside them, at the default batch: the framing alone (the same loop, no native call), and,
 * with {@code --disk-dir}, the same writes into a directory on the disk the sink writes to, where
 * staged data goes through the destination's direct-I/O chunks (the task thread copies, an I/O
 * thread writes) instead of tmpfs's page cache.
 *
 * <pre>java -cp ... io.twopc.flink.bench.JniBench --dir=/dev/shm/x --out=jni.json [--disk-dir=/tmp/y] [--records=2000000] [--rounds=5] [--sizes=4096]</pre>
 */
public final class JniBench {
    private static final int[] ALL_BATCH_SIZES = {1, 4, 16, 64, 256, 1024, TwopcSinkBuilder.DEFAULT_BATCH_SIZE, 16384};
    /** Every size, or those of {@code --sizes=a,b} (for profiling one of them). */
    private static int[] BATCH_SIZES = ALL_BATCH_SIZES;

    private static final java.lang.management.ThreadMXBean THREADS =
            java.lang.management.ManagementFactory.getThreadMXBean();

    private JniBench() {}

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = BenchJob.parseArgs(argv);
        Path dir = Paths.get(BenchJob.required(args, "dir")).toAbsolutePath();
        Path out = Paths.get(BenchJob.required(args, "out")).toAbsolutePath();
        long records = Long.parseLong(args.getOrDefault("records", "2000000"));
        int rounds = Integer.parseInt(args.getOrDefault("rounds", "5"));
        if (args.containsKey("sizes")) {
            BATCH_SIZES = Arrays.stream(args.get("sizes").split(",")).mapToInt(Integer::parseInt).toArray();
        }
        Files.createDirectories(dir);
        Path diskDir = args.containsKey("disk-dir") ? Paths.get(args.get("disk-dir")).toAbsolutePath() : null;

        NativeBridge.ensureLoaded();
        long sink = open(dir);
        long diskSink = diskDir == null ? 0 : open(diskDir);
        byte[][] records100 = new byte[1024][];
        for (int i = 0; i < records100.length; i++) {
            records100[i] = BenchRecords.utf8(BenchRecords.record(i + 1));
        }

        // Warm-up: every size once, untimed, for the JIT.
        for (int size : BATCH_SIZES) {
            measure(sink, records100, size, Math.min(records, 200_000));
        }
        int defaultSize = TwopcSinkBuilder.DEFAULT_BATCH_SIZE;
        measure(0, records100, defaultSize, Math.min(records, 200_000));
        if (diskSink != 0) {
            measure(diskSink, records100, defaultSize, Math.min(records, 200_000));
        }
        List<Double> framingOnly = new ArrayList<>();
        List<Double> onDisk = new ArrayList<>();
        List<Double> onDiskCpu = new ArrayList<>();
        Map<Integer, List<Double>> nsPerRecord = new LinkedHashMap<>();
        for (int size : BATCH_SIZES) {
            nsPerRecord.put(size, new ArrayList<>());
        }
        for (int round = 0; round < rounds; round++) {
            // Rotate the order each round so that drift does not favour one size.
            for (int k = 0; k < BATCH_SIZES.length; k++) {
                int size = BATCH_SIZES[(k + round) % BATCH_SIZES.length];
                // One call per record is slow: fewer records for small batches, same wall time order.
                long n = size < 64 ? Math.max(100_000, records / 8) : records;
                nsPerRecord.get(size).add(measure(sink, records100, size, n));
            }
            framingOnly.add(measure(0, records100, defaultSize, records));
            if (diskSink != 0) {
                long cpu0 = THREADS.getCurrentThreadCpuTime();
                onDisk.add(measure(diskSink, records100, defaultSize, records));
                // The task thread's own CPU time: waiting for the I/O thread (the disk) is not in it.
                onDiskCpu.add((THREADS.getCurrentThreadCpuTime() - cpu0) / (double) records);
            }
        }
        NativeBridge.close(sink);
        if (diskSink != 0) {
            NativeBridge.close(diskSink);
        }

        List<Object> rows = new ArrayList<>();
        for (Map.Entry<Integer, List<Double>> e : nsPerRecord.entrySet()) {
            Map<String, Object> row = new LinkedHashMap<>();
            row.put("batchRecords", e.getKey());
            row.put("nsPerRecordRuns", e.getValue());
            row.put("nsPerRecord", median(e.getValue()));
            rows.add(row);
        }
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("recordBytes", BenchRecords.RECORD_CHARS);
        result.put("defaultBatchRecords", TwopcSinkBuilder.DEFAULT_BATCH_SIZE);
        result.put("defaultBatchBytes", TwopcSinkBuilder.DEFAULT_BATCH_BYTES);
        result.put("rounds", rounds);
        result.put("destination", "filesystem destination on " + dir + " (tmpfs)");
        result.put("results", rows);
        // At the default batch: the Java framing alone, and the whole path into the disk's directory.
        result.put("framingOnlyNsPerRecordRuns", framingOnly);
        result.put("framingOnlyNsPerRecord", median(framingOnly));
        if (diskSink != 0) {
            result.put("diskDestination", "filesystem destination on " + diskDir);
            result.put("diskNsPerRecordRuns", onDisk);
            result.put("diskNsPerRecord", median(onDisk));
            result.put("diskCpuNsPerRecordRuns", onDiskCpu);
            result.put("diskCpuNsPerRecord", median(onDiskCpu));
        }
        Files.createDirectories(out.getParent());
        Files.write(out, Json.write(result).getBytes(java.nio.charset.StandardCharsets.UTF_8));
        System.out.println(Json.write(result));
    }

    /** A sink over {@code dir} with the configuration a builder writes (default settings). */
    private static long open(Path dir) {
        String config = io.twopc.flink.TwopcSink.<String>forDirectory(dir.toString())
                .setSinkId("jnibench")
                .setSerializationSchema(new org.apache.flink.api.common.serialization.SimpleStringSchema())
                .setFreshStartPolicy(io.twopc.flink.FreshStartPolicy.APPEND)
                .build()
                .getOptions()
                .toConfigJson();
        return NativeBridge.openSink(config, "0123456789abcdef0123456789abcdef", 0, 1, 0, 1000, null, -1,
                new byte[0][], new byte[0][]);
    }

    /**
     * Writes {@code n} records in batches of {@code size} into a fresh transaction through the
     * writers' own {@link RecordBatcher} (LINES output: a line break after each record); ns per
     * record. With {@code sink} 0 the batches are filled and dropped: the framing's own cost.
     */
    private static double measure(long sink, byte[][] records, int size, long n) {
        byte[] handle = sink == 0 ? null : NativeBridge.begin(sink);
        long[] checksum = {0};
        RecordBatcher batcher = new RecordBatcher(TwopcSinkBuilder.DEFAULT_BATCH_BYTES * 2, size, '\n',
                sink == 0
                        // Read back so that the framing cannot be optimised away.
                        ? batch -> checksum[0] += batch.data.get(batch.length - 1)
                        : batch -> NativeBridge.write(sink, handle, batch));
        long start = System.nanoTime();
        int r = 0;
        for (long written = 0; written < n; written++) {
            batcher.add(records[r]);
            r = (r + 1) & (records.length - 1);
        }
        batcher.flush();
        double ns = (System.nanoTime() - start) / (double) n;
        if (sink != 0) {
            NativeBridge.abort(sink, handle);
        } else if (checksum[0] == 42) {
            System.err.print("");
        }
        return ns;
    }

    static double median(List<Double> values) {
        double[] v = values.stream().mapToDouble(Double::doubleValue).toArray();
        Arrays.sort(v);
        return v.length % 2 == 1 ? v[v.length / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
    }
}
