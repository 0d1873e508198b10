package io.twopc.flink.bench;

import org.apache.flink.api.common.JobID;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.metrics.Histogram;
import org.apache.flink.metrics.Metric;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.configuration.RestOptions;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.configuration.WebOptions;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.runtime.checkpoint.AbstractCheckpointStats;
import org.apache.flink.runtime.checkpoint.CheckpointStatsCounts;
import org.apache.flink.runtime.checkpoint.CheckpointStatsSnapshot;
import org.apache.flink.runtime.checkpoint.CheckpointStatsStatus;
import org.apache.flink.runtime.checkpoint.FailedCheckpointStats;
import org.apache.flink.runtime.executiongraph.ArchivedExecutionGraph;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryPoolMXBean;
import java.lang.management.MemoryType;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

/**
 * One benchmark run, in a JVM of its own: the same job (generated numbered records of 100 bytes,
 * parallelism 2, exactly-once checkpoints) into one sink on an in-process Flink cluster, with
 * throughput, commit latency, heap and RSS measured from inside the JVM. Prints one JSON object
 * to the file named by {@code --out}. Also the physical limits that need no Flink: {@code
 * raw-disk} (sequential write of the same bytes through the page cache, fsync every checkpoint
 * interval), {@code raw-disk-direct} (the same with O_DIRECT, past the page cache) and {@code
 * copy-file} (writes the rows for {@code psql \copy}).
 *
 * <pre>
 * java -cp ... io.twopc.flink.bench.BenchJob --sink=twopc-fs --records=20000000 --interval-ms=1000 \
 *      --dir=/tmp/bench/run1 --out=/tmp/bench/run1.json [--pg-url=postgres://...] \
 *      [--s3-endpoint=http://127.0.0.1:54372 --s3-plugins-dir=build/bench/plugins]
 * </pre>
 *
 * Sinks: {@code discard}, {@code twopc-fs}, {@code filesink}, {@code twopc-pg-tx}, {@code
 * twopc-pg-idem}, {@code jdbc-xa}, {@code twopc-s3}, {@code filesink-s3}, {@code raw-disk},
 * {@code raw-disk-direct}, {@code copy-file}. The object-store cases write to a bucket of their
 * own on the local S3 server ({@code --s3-endpoint}; credentials from {@code AWS_ACCESS_KEY_ID} /
 * {@code AWS_SECRET_ACCESS_KEY}), FileSink through the flink-s3-fs-hadoop plugin under {@code
 * --s3-plugins-dir}; the bucket is read back, then emptied and removed.
 */
public final class BenchJob {
    static final int PARALLELISM = 2;

    private BenchJob() {}

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = parseArgs(argv);
        String sink = required(args, "sink");
        long records = Long.parseLong(required(args, "records"));
        long intervalMs = Long.parseLong(args.getOrDefault("interval-ms", "1000"));
        Path dir = Paths.get(required(args, "dir")).toAbsolutePath();
        Path out = Paths.get(required(args, "out")).toAbsolutePath();
        String pgUrl = args.get("pg-url");
        Sinks.S3Settings s3 = new Sinks.S3Settings(args.get("s3-endpoint"),
                args.containsKey("s3-plugins-dir") ? Paths.get(args.get("s3-plugins-dir")).toAbsolutePath() : null);

        Map<String, Object> result = new LinkedHashMap<>();
        result.put("sink", sink);
        result.put("records", records);
        result.put("intervalMs", intervalMs);
        result.put("parallelism", PARALLELISM);
        result.put("recordBytes", BenchRecords.LINE_BYTES);
        result.put("loadAvgStart", Proc.loadAverage());

        Sampler sampler = new Sampler();
        sampler.start();
        try {
            switch (sink) {
                case "raw-disk":
                    RawDisk.run(dir, records, intervalMs, false, result);
                    break;
                case "raw-disk-direct":
                    RawDisk.run(dir, records, intervalMs, true, result);
                    break;
                case "copy-file":
                    RawDisk.writeCopyFiles(dir, records, PARALLELISM, result);
                    break;
                default:
                    runJob(sink, records, intervalMs, dir, pgUrl, s3, sampler, result);
            }
        } catch (Throwable e) {
            // Reported as a failed run; the cluster's threads must not keep this JVM alive.
            java.io.StringWriter trace = new java.io.StringWriter();
            e.printStackTrace(new java.io.PrintWriter(trace));
            result.put("ok", false);
            result.put("error", trace.toString());
            e.printStackTrace();
        } finally {
            sampler.stop();
        }
        sampler.report(result, records);
        result.put("loadAvgEnd", Proc.loadAverage());
        Files.createDirectories(out.getParent());
        Files.write(out, Json.write(result).getBytes(java.nio.charset.StandardCharsets.UTF_8));
        System.out.println(Json.write(result));
        // Lingering non-daemon threads of the cluster or of a JDBC driver must not keep the run alive.
        System.exit(Boolean.TRUE.equals(result.get("ok")) ? 0 : 1);
    }

    // ------------------------------------------------------------------ the job

    static void runJob(String sink, long records, long intervalMs, Path dir, String pgUrl, Sinks.S3Settings s3,
            Sampler sampler, Map<String, Object> result) throws Exception {
        Files.createDirectories(dir);
        Configuration conf = new Configuration();
        // A failure must surface as a failed run, not be retried into a slower one.
        conf.set(RestartStrategyOptions.RESTART_STRATEGY, "none");
        // Any free port: another cluster on this machine may hold the default one.
        conf.set(RestOptions.BIND_PORT, "0");
        // Every checkpoint's stats are kept, for the commit latencies.
        conf.set(WebOptions.CHECKPOINTS_HISTORY_SIZE, 1_000_000);
        // twopc's own part of each commit (its commitDurationMicros histograms), read after the
        // job, before the cluster closes: the reporter only keeps references, it polls nothing
        // while the job runs.
        InMemoryReporter metrics = InMemoryReporter.createWithRetainedMetrics();
        metrics.addToConfiguration(conf);
        MiniClusterConfiguration clusterConf = new MiniClusterConfiguration.Builder()
                .setConfiguration(conf)
                .setNumTaskManagers(1)
                .setNumSlotsPerTaskManager(PARALLELISM)
                .build();

        Sinks.Target target = Sinks.prepare(sink, dir, pgUrl, s3);
        try {
            runOnCluster(sink, records, intervalMs, dir, pgUrl, target, clusterConf, conf, sampler, metrics, result);
        } finally {
            if (target.store != null) {
                result.put("s3Bucket", target.store.url());
                // The server holds every bucket in its memory: a run's output must not stay
                // there for the runs after it.
                try {
                    target.store.s3.deleteBucket(target.store.bucket);
                    result.put("s3Cleanup", "ok: bucket removed");
                } catch (IOException e) {
                    // In the results, not only on stderr: a bucket left behind weighs on later runs.
                    result.put("s3Cleanup", "failed: " + e.getMessage());
                    System.err.println("could not remove bucket " + target.store.bucket + ": " + e.getMessage());
                }
            }
        }
    }

    /**
     * The values of one of twopc's commit histograms ({@code commitDurationMicros}: each commit
     * call's duration; {@code commitVisibleMicros}: its part until the output was visible), in
     * microseconds, as the committers recorded them, one list per committer subtask in the order
     * of its calls (the last 500: more than a benchmark run commits).
     */
    private static List<List<Long>> commitMicros(InMemoryReporter metrics, String histogram) {
        List<List<Long>> out = new ArrayList<>();
        for (Map.Entry<MetricGroup, Map<String, Metric>> group : metrics.getMetricsByGroup().entrySet()) {
            for (Map.Entry<String, Metric> m : group.getValue().entrySet()) {
                if (m.getValue() instanceof Histogram
                        && group.getKey().getMetricIdentifier(m.getKey()).endsWith(".twopc." + histogram)) {
                    List<Long> calls = new ArrayList<>();
                    for (long v : ((Histogram) m.getValue()).getStatistics().getValues()) {
                        calls.add(v);
                    }
                    out.add(calls);
                }
            }
        }
        return out;
    }

    private static void runOnCluster(String sink, long records, long intervalMs, Path dir, String pgUrl,
            Sinks.Target target, MiniClusterConfiguration clusterConf, Configuration conf, Sampler sampler,
            InMemoryReporter metrics, Map<String, Object> result) throws Exception {
        Watcher watcher = null;
        if (target.watchDirectory) {
            watcher = new OutputWatcher(dir);
        } else if (target.store != null) {
            watcher = new ObjectWatcher(target.store.s3, target.store.bucket, target.store.prefix);
            result.put("visibilityPollMs", ObjectWatcher.POLL_MS);
        }

        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(PARALLELISM);
        env.enableCheckpointing(intervalMs, CheckpointingMode.EXACTLY_ONCE);
        DataStream<String> stream = env.fromSequence(1, records).uid("numbers").name("numbers")
                .map(new BenchRecords.Numbered()).uid("records").name("records");
        Sinks.attach(sink, stream, dir, pgUrl, target);

        long startNs;
        long endNs;
        JobResult jobResult;
        List<long[]> completedCheckpoints = new ArrayList<>();
        try (MiniCluster cluster = new MiniCluster(clusterConf)) {
            cluster.start();
            if (watcher != null) {
                watcher.start();
            }
            startNs = System.nanoTime();
            sampler.markStart(startNs);
            JobID jobId = cluster.submitJob(env.getStreamGraph().getJobGraph()).get(1, TimeUnit.MINUTES).getJobID();
            jobResult = cluster.requestJobResult(jobId).get(60, TimeUnit.MINUTES);
            endNs = System.nanoTime();
            sampler.markEnd(endNs);
            ArchivedExecutionGraph graph = cluster.getArchivedExecutionGraph(jobId).get(1, TimeUnit.MINUTES);
            CheckpointStatsSnapshot stats = graph.getCheckpointStatsSnapshot();
            CheckpointStatsCounts counts = stats.getCounts();
            result.put("checkpointsCompleted", counts.getNumberOfCompletedCheckpoints());
            result.put("checkpointsFailed", counts.getNumberOfFailedCheckpoints());
            java.util.Set<String> failures = new java.util.TreeSet<>();
            for (AbstractCheckpointStats c : stats.getHistory().getCheckpoints()) {
                if (c.getStatus() == CheckpointStatsStatus.COMPLETED) {
                    completedCheckpoints.add(new long[] {c.getCheckpointId(), c.getTriggerTimestamp(),
                            c.getLatestAckTimestamp()});
                } else if (c instanceof FailedCheckpointStats) {
                    // Why, so that a failed checkpoint reads as start-up or shutdown noise (tasks not
                    // yet or no longer running) or as the sink's. Those refused before their trigger
                    // are only counted, not kept in the history.
                    String m = ((FailedCheckpointStats) c).getFailureMessage();
                    failures.add(m == null ? "no message" : m.length() > 300 ? m.substring(0, 300) : m);
                }
            }
            result.put("checkpointFailures", new ArrayList<>(failures));
            // Before the cluster closes: closing the metric registry closes the reporter, which
            // drops what it holds.
            List<List<Long>> calls = commitMicros(metrics, "commitDurationMicros");
            if (!calls.isEmpty()) {
                result.put("commitCallMicros", calls);
            }
            List<List<Long>> visible = commitMicros(metrics, "commitVisibleMicros");
            if (visible.stream().anyMatch(l -> !l.isEmpty())) {
                result.put("commitVisibleMicros", visible);
            }
        }
        if (watcher != null) {
            watcher.stop();
            if (watcher instanceof ObjectWatcher) {
                result.put("visibilityListings", ((ObjectWatcher) watcher).listings());
            }
        }
        completedCheckpoints.sort((a, b) -> Long.compare(a[0], b[0]));
        List<Long> durations = new ArrayList<>();
        for (long[] c : completedCheckpoints) {
            durations.add(c[2] - c[1]);
        }
        result.put("checkpointDurationsMs", durations);
        result.put("jobSeconds", (endNs - startNs) / 1e9);
        result.put("jobStatus", jobResult.isSuccess() ? "SUCCEEDED" : "FAILED");
        boolean ok = jobResult.isSuccess();
        if (!ok) {
            result.put("error", jobResult.getSerializedThrowable()
                    .map(t -> t.getFullStringifiedStackTrace()).orElse("no error"));
        }

        if (watcher != null) {
            result.put("commitLatenciesMs",
                    commitLatencies(sink, committedRecords(sink, dir, target), watcher, completedCheckpoints, result));
        }
        String verified = Sinks.verify(sink, dir, records, pgUrl, target);
        result.put("verification", verified);
        ok &= verified.startsWith("ok");
        result.put("ok", ok);
    }

    /**
     * The names of twopc's commit records ({@code <lineage>-<checkpoint>-<transaction id>}), from
     * the output directory or the bucket; null for the other sinks.
     */
    static List<String> committedRecords(String sink, Path dir, Sinks.Target target) throws IOException {
        List<String> names = new ArrayList<>();
        if (sink.equals("twopc-fs") || sink.equals("twopc-fs-vf")) {
            Path committed = dir.resolve("_twopc").resolve(Sinks.SINK_ID).resolve("committed");
            try (DirectoryStream<Path> entries = Files.newDirectoryStream(committed)) {
                for (Path p : entries) {
                    names.add(p.getFileName().toString());
                }
            }
            return names;
        }
        if (sink.equals("twopc-s3")) {
            // The object store's layout is the directory's: <prefix>/_twopc/<sink>/committed/<name>.
            String area = target.store.prefix + "/_twopc/" + Sinks.SINK_ID + "/committed/";
            for (BenchS3.ObjectInfo o : target.store.s3.list(target.store.bucket, area)) {
                names.add(o.key.substring(area.length()));
            }
            return names;
        }
        return null;
    }

    /**
     * Commit latency: from a checkpoint's completion (its last acknowledgement at the job manager,
     * which precedes the completion itself by its finalisation, so the figure is if anything
     * high) to the moment the file holding its output became visible in the output directory
     * (seen through inotify) or the object in the bucket's listing (polled). twopc's output is
     * mapped to its checkpoint exactly, through the commit records; FileSink's to the last
     * checkpoint completed before the output appeared.
     */
    static List<Long> commitLatencies(String sink, List<String> commitRecords, Watcher watcher,
            List<long[]> checkpoints, Map<String, Object> result) {
        Map<Long, Long> ackById = new HashMap<>();
        TreeMap<Long, Long> idByAck = new TreeMap<>();
        for (long[] c : checkpoints) {
            ackById.put(c[0], c[2]);
            idByAck.put(c[2], c[0]);
        }
        Map<String, Long> checkpointOfTxn = new HashMap<>();
        if (commitRecords != null) {
            for (String name : commitRecords) {
                // <lineage, 16 hex>-<checkpoint>-<transaction id>
                String[] parts = name.split("-", 3);
                if (parts.length == 3) {
                    checkpointOfTxn.put(parts[2], Long.parseLong(parts[1]));
                }
            }
        }
        List<Long> latencies = new ArrayList<>();
        List<Long> latencyCheckpoints = new ArrayList<>();
        int unattributed = 0;
        for (Map.Entry<String, Long> e : watcher.events().entrySet()) {
            String name = e.getKey();
            long seenAt = e.getValue();
            Long ack = null;
            Long checkpoint = null;
            if (commitRecords != null) {
                checkpoint = name.startsWith("part-") ? checkpointOfTxn.get(name.substring(5)) : null;
                ack = checkpoint == null ? null : ackById.get(checkpoint);
            } else {
                Map.Entry<Long, Long> before = idByAck.floorEntry(seenAt);
                ack = before == null ? null : before.getKey();
                checkpoint = before == null ? null : before.getValue();
            }
            if (ack == null) {
                unattributed++;
            } else {
                latencies.add(seenAt - ack);
                latencyCheckpoints.add(checkpoint);
            }
        }
        result.put("visibleFiles", watcher.events().size());
        result.put("visibleFilesUnattributed", unattributed);
        result.put("commitLatencyCheckpoints", latencyCheckpoints);
        return latencies;
    }

    // ------------------------------------------------------------------ memory and progress

    /**
     * Samples, every 20 ms: records accepted by the sinks, heap in use (JMX), heap in use after the
     * last collection, and RSS (/proc/self/status).
     */
    static final class Sampler {
        private final List<long[]> progress = new ArrayList<>(); // {nanoTime, records}
        private volatile boolean running = true;
        private volatile long startNs = -1;
        private volatile long endNs = -1;
        private long peakHeapUsed;
        private long peakHeapAfterGc;
        private long peakRssSampled;
        private final Thread thread = new Thread(this::loop, "bench-sampler");

        void start() {
            thread.setDaemon(true);
            thread.start();
        }

        void markStart(long ns) {
            startNs = ns;
        }

        void markEnd(long ns) {
            endNs = ns;
        }

        void stop() throws InterruptedException {
            running = false;
            thread.join();
        }

        private void loop() {
            List<MemoryPoolMXBean> heapPools = new ArrayList<>();
            for (MemoryPoolMXBean pool : ManagementFactory.getMemoryPoolMXBeans()) {
                if (pool.getType() == MemoryType.HEAP) {
                    heapPools.add(pool);
                }
            }
            while (running) {
                long now = System.nanoTime();
                long heap = ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed();
                long afterGc = 0;
                for (MemoryPoolMXBean pool : heapPools) {
                    if (pool.getCollectionUsage() != null) {
                        afterGc += pool.getCollectionUsage().getUsed();
                    }
                }
                long rss = Proc.statusKb("VmRSS") * 1024;
                synchronized (this) {
                    peakHeapUsed = Math.max(peakHeapUsed, heap);
                    peakHeapAfterGc = Math.max(peakHeapAfterGc, afterGc);
                    peakRssSampled = Math.max(peakRssSampled, rss);
                    progress.add(new long[] {now, BenchRecords.totalProgress()});
                }
                try {
                    Thread.sleep(20);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }

        synchronized void report(Map<String, Object> result, long records) {
            result.put("peakHeapUsedBytes", peakHeapUsed);
            result.put("peakHeapAfterGcBytes", peakHeapAfterGc);
            result.put("peakRssSampledBytes", peakRssSampled);
            result.put("peakRssBytes", Proc.statusKb("VmHWM") * 1024);
            result.put("maxHeapBytes", Runtime.getRuntime().maxMemory());
            if (startNs < 0 || endNs < 0) {
                return;
            }
            // Steady state: the rate between 10% and 90% of the records (start-up, ramp and the
            // final checkpoint left out). End to end: all records, from submission until the job
            // finished, i.e. until the last output was committed.
            long[] at10 = firstReaching(records / 10);
            long[] at90 = firstReaching(records * 9 / 10);
            if (at10 != null && at90 != null && at90[0] > at10[0]) {
                double seconds = (at90[0] - at10[0]) / 1e9;
                double rate = (at90[1] - at10[1]) / seconds;
                result.put("recordsPerSec", rate);
                result.put("mbPerSec", rate * BenchRecords.LINE_BYTES / 1e6);
                result.put("steadySeconds", seconds);
            }
            double e2e = records / ((endNs - startNs) / 1e9);
            result.put("endToEndRecordsPerSec", e2e);
        }

        private long[] firstReaching(long count) {
            for (long[] p : progress) {
                if (p[0] >= startNs && p[1] >= count) {
                    return p;
                }
            }
            return null;
        }
    }

    // ------------------------------------------------------------------ helpers

    static Map<String, String> parseArgs(String[] argv) {
        Map<String, String> args = new HashMap<>();
        for (String a : argv) {
            if (!a.startsWith("--") || !a.contains("=")) {
                throw new IllegalArgumentException("arguments are --name=value, not " + a);
            }
            int eq = a.indexOf('=');
            args.put(a.substring(2, eq), a.substring(eq + 1));
        }
        return args;
    }

    static String required(Map<String, String> args, String name) {
        String v = args.get(name);
        if (v == null || v.isEmpty()) {
            throw new IllegalArgumentException("--" + name + "=... is required");
        }
        return v;
    }

    static Duration millis(long ms) {
        return Duration.ofMillis(ms);
    }
}
