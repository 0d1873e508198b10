package io.twopc.flink.demo;

import io.twopc.flink.TwopcOutput;
import io.twopc.flink.TwopcSink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.functions.RichMapFunction;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.api.common.state.CheckpointListener;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.runtime.checkpoint.CheckpointStatsCounts;
import org.apache.flink.runtime.executiongraph.ArchivedExecutionGraph;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Stream;

/**
 * The demo: one million numbered records through {@link TwopcSink} on an in-process Flink
 * cluster (parallelism 2, a checkpoint every second), with one failure injected half-way, after a
 * checkpoint has completed. Then it reads the committed output back and checks that every record
 * is there exactly once, printing what it found; it exits non-zero on any violation.
 *
 * <p>Run with {@code gradle runDemo}; the output directory is the first argument.
 */
public final class DemoJob {
    static final long RECORDS = 1_000_000;
    static final int PARALLELISM = 2;
    static final Duration CHECKPOINT_INTERVAL = Duration.ofSeconds(1);
    /** The failure comes after this many records have been processed (all subtasks together). */
    static final long FAIL_AFTER_RECORDS = RECORDS / 2;
    /** About 17 records per millisecond per subtask: the run takes half a minute, ~30 checkpoints. */
    static final int RECORDS_PER_MS = 17;
    static final String SINK_ID = "demo";

    // The cluster runs in this JVM, so the job's functions report here. They count every record
    // processed, replays included, and every attempt, failed ones included (which a job's
    // accumulators would not: Flink keeps only the successful attempt's).
    static final AtomicLong PROCESSED = new AtomicLong();
    static final AtomicBoolean FAILURE_INJECTED = new AtomicBoolean();
    static final Map<Integer, Integer> MAX_ATTEMPT_BY_SUBTASK = new ConcurrentHashMap<>();

    private DemoJob() {}

    public static void main(String[] args) throws Exception {
        Path output = Paths.get(args.length > 0 ? args[0] : "build/demo-out").toAbsolutePath();
        deleteRecursively(output);
        Files.createDirectories(output);
        System.out.printf("twopc demo: %,d records, parallelism %d, checkpoint every %d ms, one failure after %,d "
                + "records; output %s%n", RECORDS, PARALLELISM, CHECKPOINT_INTERVAL.toMillis(), FAIL_AFTER_RECORDS,
                output);

        long start = System.nanoTime();
        Configuration conf = new Configuration();
        conf.set(RestartStrategyOptions.RESTART_STRATEGY, "fixed-delay");
        conf.set(RestartStrategyOptions.RESTART_STRATEGY_FIXED_DELAY_ATTEMPTS, 3);
        conf.set(RestartStrategyOptions.RESTART_STRATEGY_FIXED_DELAY_DELAY, Duration.ofSeconds(1));
        MiniClusterConfiguration clusterConf = new MiniClusterConfiguration.Builder()
                .setConfiguration(conf)
                .setNumTaskManagers(1)
                .setNumSlotsPerTaskManager(PARALLELISM)
                .build();

        JobResult result;
        CheckpointStatsCounts checkpoints;
        try (MiniCluster cluster = new MiniCluster(clusterConf)) {
            cluster.start();
            JobID jobId = cluster.submitJob(buildJob(conf, output).getStreamGraph().getJobGraph())
                    .get(1, TimeUnit.MINUTES).getJobID();
            result = cluster.requestJobResult(jobId).get(10, TimeUnit.MINUTES);
            ArchivedExecutionGraph graph = cluster.getArchivedExecutionGraph(jobId).get(1, TimeUnit.MINUTES);
            checkpoints = graph.getCheckpointStatsSnapshot().getCounts();
        }
        double seconds = (System.nanoTime() - start) / 1e9;

        Verdict verdict = verify(output);
        int taskRestarts = MAX_ATTEMPT_BY_SUBTASK.values().stream().mapToInt(Integer::intValue).sum();
        List<String> violations = new ArrayList<>();
        if (!result.isSuccess()) {
            violations.add("the job ended " + result.getApplicationStatus() + ": "
                    + result.getSerializedThrowable().map(Throwable::getMessage).orElse("no error"));
        }
        if (verdict.duplicates > 0) {
            violations.add(verdict.duplicates + " records committed more than once (first: " + verdict.firstDuplicate + ")");
        }
        if (verdict.missing > 0) {
            violations.add(verdict.missing + " records never committed (first: " + verdict.firstMissing + ")");
        }
        if (verdict.foreign > 0) {
            violations.add(verdict.foreign + " committed lines that are not input records");
        }
        if (verdict.staged > 0) {
            violations.add(verdict.staged + " transactions left staged after the job finished");
        }
        if (!FAILURE_INJECTED.get() || taskRestarts < 1) {
            violations.add("the injected failure did not happen, so recovery was not exercised");
        }
        if (checkpoints.getNumberOfCompletedCheckpoints() < 2) {
            violations.add("fewer than two checkpoints completed");
        }

        System.out.println();
        System.out.println("==== twopc demo result ====");
        System.out.printf("records in (generated)        %,12d%n", RECORDS);
        System.out.printf("records processed (w/ replay) %,12d%n", PROCESSED.get());
        System.out.printf("records committed             %,12d   (%d files)%n", verdict.committed, verdict.files);
        System.out.printf("distinct records committed    %,12d%n", verdict.distinct);
        System.out.printf("duplicates                    %,12d%n", verdict.duplicates);
        System.out.printf("missing                       %,12d%n", verdict.missing);
        System.out.printf("staged transactions left      %,12d%n", verdict.staged);
        System.out.printf("checkpoints completed         %,12d   (failed %d, restored from %d)%n",
                checkpoints.getNumberOfCompletedCheckpoints(), checkpoints.getNumberOfFailedCheckpoints(),
                checkpoints.getNumberOfRestoredCheckpoints());
        System.out.printf("failures injected             %,12d%n", FAILURE_INJECTED.get() ? 1 : 0);
        System.out.printf("task restarts                 %,12d   (by subtask: %s)%n", taskRestarts,
                MAX_ATTEMPT_BY_SUBTASK);
        System.out.printf("job status                    %12s   in %.1f s%n", result.getApplicationStatus(), seconds);
        if (violations.isEmpty()) {
            System.out.println("EXACTLY ONCE: every record committed once, nothing staged.");
            System.exit(0);
        }
        System.out.println("VIOLATIONS:");
        violations.forEach(v -> System.out.println("  - " + v));
        System.exit(1);
    }

    static StreamExecutionEnvironment buildJob(Configuration conf, Path output) {
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(PARALLELISM);
        env.enableCheckpointing(CHECKPOINT_INTERVAL.toMillis());
        env.fromSequence(1, RECORDS).uid("numbers").name("numbers")
                .map(new PacedFailOnce()).uid("paced-fail-once").name("paced-fail-once")
                .addSink(TwopcSink.<Long>builder()
                        .forDirectory(output)
                        .setSinkId(SINK_ID)
                        .setSerializationSchema(new DecimalLine())
                        .setPartSuffix(".txt")
                        .build())
                .uid("twopc-sink").name("twopc-sink");
        return env;
    }

    /** Numbers as decimal text lines. */
    static final class DecimalLine implements SerializationSchema<Long> {
        private static final long serialVersionUID = 1L;

        @Override
        public byte[] serialize(Long value) {
            return Long.toString(value).getBytes(StandardCharsets.UTF_8);
        }
    }

    /**
     * Paces the stream so that it spans many checkpoints, counts what it processes, and throws
     * once, on the first attempt, after {@link #FAIL_AFTER_RECORDS} records and at least one
     * completed checkpoint: the restart must then commit what that checkpoint covered and replay
     * the rest without duplicating or losing anything.
     */
    static final class PacedFailOnce extends RichMapFunction<Long, Long> implements CheckpointListener {
        private static final long serialVersionUID = 1L;
        private transient long seen;
        private transient volatile boolean checkpointCompleted;

        @Override
        public void open(org.apache.flink.api.common.functions.OpenContext openContext) {
            int subtask = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
            int attempt = getRuntimeContext().getTaskInfo().getAttemptNumber();
            MAX_ATTEMPT_BY_SUBTASK.merge(subtask, attempt, Math::max);
        }

        @Override
        public Long map(Long value) throws Exception {
            long processed = PROCESSED.incrementAndGet();
            if (++seen % RECORDS_PER_MS == 0) {
                Thread.sleep(1);
            }
            if (checkpointCompleted
                    && processed >= FAIL_AFTER_RECORDS
                    && getRuntimeContext().getTaskInfo().getAttemptNumber() == 0
                    && FAILURE_INJECTED.compareAndSet(false, true)) {
                System.out.printf("injecting a failure in subtask %d after %,d records processed%n",
                        getRuntimeContext().getTaskInfo().getIndexOfThisSubtask(), processed);
                throw new RuntimeException("demo: injected failure after " + processed + " records");
            }
            return value;
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            checkpointCompleted = true;
        }
    }

    /** What the committed output holds. */
    static final class Verdict {
        long committed;
        long distinct;
        long duplicates;
        long missing;
        long foreign;
        long staged;
        int files;
        long firstDuplicate = -1;
        long firstMissing = -1;
    }

    static Verdict verify(Path output) throws IOException {
        Verdict v = new Verdict();
        byte[] seen = new byte[(int) RECORDS + 1];
        v.files = TwopcOutput.committedFiles(output, "part").size();
        for (String line : TwopcOutput.readCommittedRecords(output)) {
            v.committed++;
            long n;
            try {
                n = Long.parseLong(line);
            } catch (NumberFormatException e) {
                v.foreign++;
                continue;
            }
            if (n < 1 || n > RECORDS) {
                v.foreign++;
                continue;
            }
            if (seen[(int) n] > 0) {
                v.duplicates++;
                if (v.firstDuplicate < 0) {
                    v.firstDuplicate = n;
                }
            } else {
                v.distinct++;
            }
            seen[(int) n] = 1;
        }
        for (int n = 1; n <= RECORDS; n++) {
            if (seen[n] == 0) {
                v.missing++;
                if (v.firstMissing < 0) {
                    v.firstMissing = n;
                }
            }
        }
        Path staging = output.resolve("_twopc").resolve(SINK_ID).resolve("staging");
        if (Files.isDirectory(staging)) {
            try (Stream<Path> s = Files.list(staging)) {
                v.staged = s.count();
            }
        }
        return v;
    }

    private static void deleteRecursively(Path dir) throws IOException {
        if (!Files.exists(dir)) {
            return;
        }
        try (Stream<Path> walk = Files.walk(dir)) {
            for (Path p : (Iterable<Path>) walk.sorted(Comparator.reverseOrder())::iterator) {
                Files.delete(p);
            }
        }
    }
}
