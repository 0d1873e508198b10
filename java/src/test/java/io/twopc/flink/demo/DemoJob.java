package io.twopc.flink.demo;

import io.twopc.flink.CsvRowSchema;
import io.twopc.flink.PostgresDestination;
import io.twopc.flink.TwopcOutput;
import io.twopc.flink.TwopcSink;
import io.twopc.flink.testing.TestPostgres;

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
import org.apache.flink.runtime.util.EnvironmentInformation;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.sql.SQLException;
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
 * <pre>
 * DemoJob [--destination directory|postgres] [--flink VERSION] [output directory]
 * </pre>
 *
 * <p>{@code directory} (the default) writes to the output directory; {@code postgres} writes to
 * table {@code twopc_demo} of the server in {@code TWOPC_PG_URL} (transactional mode). Run with
 * {@code bash scripts/demo.sh [--destination postgres]}, which passes the option through {@code
 * gradle runDemo}. {@code --flink} names the Flink version the classpath was built for ({@code
 * gradle runDemo -PdemoFlink=2} runs on Flink 2.x); the demo checks that it is the one running.
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
        DemoTarget target = targetOf(args);
        String flink = EnvironmentInformation.getVersion();
        String expected = expectedFlinkOf(args);
        if (expected != null && !expected.equals(flink)) {
            System.out.printf("twopc demo: asked for Flink %s, but the classpath holds Flink %s%n", expected, flink);
            System.exit(2);
        }
        target.reset();
        System.out.printf("twopc demo on Flink %s (Sink V2, stream.sinkTo): %,d records, parallelism %d, checkpoint "
                + "every %d ms, one failure after %,d records; output %s%n", flink, RECORDS, PARALLELISM,
                CHECKPOINT_INTERVAL.toMillis(), FAIL_AFTER_RECORDS, target);

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
            JobID jobId = cluster.submitJob(buildJob(conf, target.sink()).getStreamGraph().getJobGraph())
                    .get(1, TimeUnit.MINUTES).getJobID();
            result = cluster.requestJobResult(jobId).get(10, TimeUnit.MINUTES);
            ArchivedExecutionGraph graph = cluster.getArchivedExecutionGraph(jobId).get(1, TimeUnit.MINUTES);
            checkpoints = graph.getCheckpointStatsSnapshot().getCounts();
        }
        double seconds = (System.nanoTime() - start) / 1e9;

        Verdict verdict = target.verify();
        int taskRestarts = MAX_ATTEMPT_BY_SUBTASK.values().stream().mapToInt(Integer::intValue).sum();
        List<String> violations = new ArrayList<>();
        if (!result.isSuccess()) {
            violations.add("the job ended " + (result.isSuccess() ? "SUCCEEDED" : "FAILED") + ": "
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
        System.out.printf("records committed             %,12d   (%s)%n", verdict.committed, verdict.where);
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
        System.out.printf("job status                    %12s   in %.1f s%n", (result.isSuccess() ? "SUCCEEDED" : "FAILED"), seconds);
        if (violations.isEmpty()) {
            System.out.println("EXACTLY ONCE: every record committed once, nothing staged.");
            System.exit(0);
        }
        System.out.println("VIOLATIONS:");
        violations.forEach(v -> System.out.println("  - " + v));
        System.exit(1);
    }

    /** The value of {@code --flink}, or null. */
    static String expectedFlinkOf(String[] args) {
        for (int i = 0; i + 1 < args.length; i++) {
            if (args[i].equals("--flink")) {
                return args[i + 1];
            }
        }
        return null;
    }

    /** Reads {@code [--destination directory|postgres] [--flink VERSION] [output directory]}. */
    static DemoTarget targetOf(String[] args) {
        String destination = "directory";
        String directory = "build/demo-out";
        for (int i = 0; i < args.length; i++) {
            if (args[i].equals("--destination") && i + 1 < args.length) {
                destination = args[++i];
            } else if (args[i].startsWith("--destination=")) {
                destination = args[i].substring("--destination=".length());
            } else if (args[i].equals("--flink") && i + 1 < args.length) {
                i++;
            } else if (args[i].startsWith("--")) {
                throw new IllegalArgumentException("unknown option " + args[i]
                        + "; usage: DemoJob [--destination directory|postgres] [--flink VERSION] [output directory]");
            } else {
                directory = args[i];
            }
        }
        switch (destination) {
            case "directory":
                return new DirectoryTarget(Paths.get(directory).toAbsolutePath());
            case "postgres":
                return new PostgresTarget(TestPostgres.fromEnvironment());
            default:
                throw new IllegalArgumentException("unknown destination '" + destination
                        + "'; use --destination directory (the default) or --destination postgres");
        }
    }

    static StreamExecutionEnvironment buildJob(Configuration conf, TwopcSink<Long> sink) {
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(PARALLELISM);
        env.enableCheckpointing(CHECKPOINT_INTERVAL.toMillis());
        env.fromSequence(1, RECORDS).uid("numbers").name("numbers")
                .map(new PacedFailOnce()).uid("paced-fail-once").name("paced-fail-once")
                .sinkTo(sink)
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

    /** Where the demo writes, and how it reads back what was committed there. */
    interface DemoTarget {
        /** Removes the output of an earlier run. */
        void reset() throws Exception;

        TwopcSink<Long> sink();

        Verdict verify() throws Exception;
    }

    /** Files in a local directory (the default). */
    static final class DirectoryTarget implements DemoTarget {
        private final Path output;

        DirectoryTarget(Path output) {
            this.output = output;
        }

        @Override
        public void reset() throws IOException {
            deleteRecursively(output);
            Files.createDirectories(output);
        }

        @Override
        public TwopcSink<Long> sink() {
            return TwopcSink.<Long>builder()
                    .forDirectory(output)
                    .setSinkId(SINK_ID)
                    .setSerializationSchema(new DecimalLine())
                    .setPartSuffix(".txt")
                    .build();
        }

        @Override
        public Verdict verify() throws IOException {
            long staged = 0;
            Path staging = output.resolve("_twopc").resolve(SINK_ID).resolve("staging");
            if (Files.isDirectory(staging)) {
                try (Stream<Path> s = Files.list(staging)) {
                    staged = s.count();
                }
            }
            int files = TwopcOutput.committedFiles(output, "part").size();
            return Verdict.of(TwopcOutput.readCommittedRecords(output), staged, files + " files");
        }

        @Override
        public String toString() {
            return output.toString();
        }
    }

    /**
     * Table {@code twopc_demo (id bigint)} on the server in {@code TWOPC_PG_URL}, transactional
     * mode. The password is taken out of the URL and handed to the sink the way a job should
     * (here a system property, which the in-process cluster's task manager shares).
     */
    static final class PostgresTarget implements DemoTarget {
        static final String TABLE = "twopc_demo";
        static final String PASSWORD_PROPERTY = "twopc.demo.postgres.password";
        private final TestPostgres server;

        PostgresTarget(TestPostgres server) {
            this.server = server;
        }

        @Override
        public void reset() throws SQLException {
            // A run that was interrupted may have left prepared transactions behind; the sink
            // would (rightly) refuse to start fresh over them.
            server.rollbackAllPrepared(SINK_ID);
            server.execute("DROP TABLE IF EXISTS " + TABLE);
            server.execute("CREATE TABLE " + TABLE + " (id bigint NOT NULL)");
            if (server.password != null) {
                System.setProperty(PASSWORD_PROPERTY, server.password);
            }
        }

        @Override
        public TwopcSink<Long> sink() {
            PostgresDestination table = PostgresDestination.url(server.urlWithoutPassword()).table(TABLE).columns("id");
            if (server.password != null) {
                table = table.passwordFromSystemProperty(PASSWORD_PROPERTY);
            }
            return TwopcSink.<Long>forPostgres(table)
                    .setSinkId(SINK_ID)
                    .setSerializationSchema(CsvRowSchema.of((Long n) -> new Object[] {n}))
                    .build();
        }

        @Override
        public Verdict verify() throws SQLException {
            List<String> ids = server.queryStrings("SELECT id FROM " + TABLE);
            long prepared = server.preparedTransactions(SINK_ID).size();
            return Verdict.of(ids, prepared, "table " + TABLE);
        }

        @Override
        public String toString() {
            return "PostgreSQL table " + TABLE + " at " + server.urlWithoutPassword();
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
        String where;
        long firstDuplicate = -1;
        long firstMissing = -1;

        /** Checks {@code records} (each a decimal number) against {@code 1..RECORDS}. */
        static Verdict of(Iterable<String> records, long staged, String where) {
            Verdict v = new Verdict();
            v.staged = staged;
            v.where = where;
            byte[] seen = new byte[(int) RECORDS + 1];
            for (String line : records) {
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
            return v;
        }
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
