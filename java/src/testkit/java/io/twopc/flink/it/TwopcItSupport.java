package io.twopc.flink.it;

import io.twopc.flink.TwopcOutput;
import io.twopc.flink.internal.NativeBridge;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichMapFunction;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.api.common.state.CheckpointListener;
import org.apache.flink.runtime.state.FunctionInitializationContext;
import org.apache.flink.runtime.state.FunctionSnapshotContext;
import org.apache.flink.streaming.api.checkpoint.CheckpointedFunction;
import org.apache.flink.client.program.ClusterClient;
import org.apache.flink.core.execution.CheckpointType;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.connector.file.src.FileSource;
import org.apache.flink.connector.file.src.reader.TextLineInputFormat;
import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.Gauge;
import org.apache.flink.metrics.Metric;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.jobgraph.SavepointRestoreSettings;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.runtime.testutils.MiniClusterResourceConfiguration;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;
import org.apache.flink.util.CloseableIterator;
import org.apache.flink.util.SerializedThrowable;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.function.LongSupplier;
import java.util.function.Predicate;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Shared pieces of the MiniCluster integration tests: the numbered-record job's functions,
 * fail-point control, job submission through the cluster client, and the exactly-once checks
 * (through {@link TwopcOutput} and through Flink's own {@link FileSource}).
 *
 * <p>Functions report what happened through static maps keyed by a per-test name: MiniCluster
 * tasks run in this JVM and load these test classes through the test's own classloader (they are
 * not in the user jar, which carries only the sink).
 */
public final class TwopcItSupport {
    public static final Duration JOB_TIMEOUT = Duration.ofMinutes(3);
    public static final int MAX_PARALLELISM = 128;

    private TwopcItSupport() {}

    // ------------------------------------------------------------------ environment and jobs

    /** One task manager with {@code slots} slots, reporting its metrics to {@code metrics}. */
    public static MiniClusterWithClientResource cluster(InMemoryReporter metrics, int slots) {
        return new MiniClusterWithClientResource(
                new MiniClusterResourceConfiguration.Builder()
                        .setConfiguration(metrics.addToConfiguration(new Configuration()))
                        .setNumberTaskManagers(1)
                        .setNumberSlotsPerTaskManager(slots)
                        .build());
    }

    /** A streaming environment on the test cluster with checkpointing and a bounded restart strategy. */
    public static StreamExecutionEnvironment environment(int parallelism, long checkpointIntervalMs,
            int restartAttempts, Duration restartDelay) {
        return environment(parallelism, checkpointIntervalMs, restartAttempts, restartDelay, new Configuration());
    }

    /** {@link #environment(int, long, int, Duration)} with the job settings {@code conf} besides. */
    public static StreamExecutionEnvironment environment(int parallelism, long checkpointIntervalMs,
            int restartAttempts, Duration restartDelay, Configuration conf) {
        conf.set(RestartStrategyOptions.RESTART_STRATEGY, "fixed-delay");
        conf.set(RestartStrategyOptions.RESTART_STRATEGY_FIXED_DELAY_ATTEMPTS, restartAttempts);
        conf.set(RestartStrategyOptions.RESTART_STRATEGY_FIXED_DELAY_DELAY, restartDelay);
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(parallelism);
        env.setMaxParallelism(MAX_PARALLELISM);
        env.enableCheckpointing(checkpointIntervalMs);
        return env;
    }

    public static JobID submit(ClusterClient<?> client, StreamExecutionEnvironment env, String restoreFrom)
            throws Exception {
        return submit(client, env, restoreFrom, false);
    }

    /** Submits, restoring from {@code restoreFrom} (if set), optionally allowing state no operator takes. */
    public static JobID submit(ClusterClient<?> client, StreamExecutionEnvironment env, String restoreFrom,
            boolean allowNonRestoredState) throws Exception {
        JobGraph jobGraph = env.getStreamGraph().getJobGraph();
        if (restoreFrom != null) {
            jobGraph.setSavepointRestoreSettings(SavepointRestoreSettings.forPath(restoreFrom, allowNonRestoredState));
        }
        return client.submitJob(jobGraph).get(1, TimeUnit.MINUTES);
    }

    public static JobResult awaitResult(ClusterClient<?> client, JobID jobId) throws Exception {
        return client.requestJobResult(jobId).get(JOB_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
    }

    /** Waits for a job and fails the test, with the job's error, unless it finished. */
    public static void awaitSuccess(ClusterClient<?> client, JobID jobId) throws Exception {
        JobResult result = awaitResult(client, jobId);
        if (!result.isSuccess()) {
            Throwable cause = result.getSerializedThrowable()
                    .map(t -> t.deserializeError(TwopcItSupport.class.getClassLoader()))
                    .orElse(null);
            throw new AssertionError("job " + jobId + " ended " + (result.isSuccess() ? "SUCCEEDED" : "FAILED"), cause);
        }
    }

    /** Triggers a checkpoint, again while the job's tasks are still being deployed; returns its id. */
    public static long triggerCheckpoint(ClusterClient<?> client, JobID job) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(1);
        while (true) {
            try {
                return client.triggerCheckpoint(job, CheckpointType.CONFIGURED).get(1, TimeUnit.MINUTES);
            } catch (ExecutionException e) {
                if (System.nanoTime() > deadline) {
                    throw e;
                }
                Thread.sleep(100);
            }
        }
    }

    /**
     * Waits until each of the job's {@code parallelism} sink subtasks has finished a commit of
     * {@code checkpoint} or a later one (its {@code twopc.lastCommittedCheckpoint} gauge). Unlike
     * the committed output, the gauge moves for an empty transaction too (a subtask whose source
     * had emitted nothing yet when the checkpoint was triggered), and only once the commit call
     * has returned: a fail point set after this cannot catch that commit still running.
     */
    public static void awaitCommitsOf(InMemoryReporter reporter, JobID job, int parallelism, long checkpoint)
            throws InterruptedException {
        waitUntil("every sink subtask of job " + job + " has committed checkpoint " + checkpoint,
                Duration.ofMinutes(1), () -> {
                    for (int subtask = 0; subtask < parallelism; subtask++) {
                        if (lastCommittedCheckpoint(reporter, job, subtask) < checkpoint) {
                            return false;
                        }
                    }
                    return true;
                });
    }

    /**
     * Triggers checkpoints of a job whose own interval is too long to matter, one at a time, each
     * until every sink subtask's commit of it has returned, until {@code committed} (the records
     * committed so far) exceeds {@code before}: the first checkpoints may hold no records at all,
     * if they came before the sources emitted any. Returns the last checkpoint's id.
     */
    public static long checkpointUntilRecordsCommitted(ClusterClient<?> client, InMemoryReporter metrics,
            JobID job, int parallelism, long before, LongSupplier committed) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(2);
        while (true) {
            long checkpoint = triggerCheckpoint(client, job);
            awaitCommitsOf(metrics, job, parallelism, checkpoint);
            if (committed.getAsLong() > before) {
                return checkpoint;
            }
            if (System.nanoTime() > deadline) {
                throw new AssertionError("no records committed by checkpoints up to " + checkpoint + " of job " + job);
            }
            Thread.sleep(50);
        }
    }

    /** The highest {@code twopc.lastCommittedCheckpoint} any attempt of a sink subtask reports; -1 if none. */
    private static long lastCommittedCheckpoint(InMemoryReporter reporter, JobID jobId, int subtask) {
        long last = -1;
        String job = jobId.toString();
        String index = Integer.toString(subtask);
        for (Map.Entry<MetricGroup, Map<String, Metric>> group : reporter.getMetricsByGroup().entrySet()) {
            Map<String, String> variables = group.getKey().getAllVariables();
            if (!job.equals(variables.get("<job_id>")) || !index.equals(variables.get("<subtask_index>"))) {
                continue;
            }
            for (Map.Entry<String, Metric> m : group.getValue().entrySet()) {
                if (group.getKey().getMetricIdentifier(m.getKey()).endsWith(".twopc.lastCommittedCheckpoint")
                        && m.getValue() instanceof Gauge) {
                    Object value = ((Gauge<?>) m.getValue()).getValue();
                    if (value instanceof Number) {
                        last = Math.max(last, ((Number) value).longValue());
                    }
                }
            }
        }
        return last;
    }

    public static void waitUntil(String what, Duration timeout, BooleanSupplier condition) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out after " + timeout + " waiting until " + what);
            }
            Thread.sleep(20);
        }
    }

    /**
     * The numbered-record job shared by the exactly-once ITs of every destination, without its
     * sink: numbers {@code 1..count} -> throttle -> attempt tracker -> [failure injector]. The
     * caller adds the sink (uid {@code twopc-sink}). Operator uids stay the same in every job, so
     * savepoint state maps back.
     */
    public static DataStream<Long> numberedStream(StreamExecutionEnvironment env, long count, int recordsPerMs,
            String testName, MapFunction<Long, Long> injector) {
        DataStream<Long> numbers = env.fromSequence(1, count).uid("numbers").name("numbers")
                .map(new Throttle(recordsPerMs)).uid("throttle").name("throttle")
                .map(new AttemptTracker(testName)).uid("attempts").name("attempts");
        if (injector != null) {
            numbers = numbers.map(injector).uid("injector").name("injector");
        }
        return numbers;
    }

    // ------------------------------------------------------------------ fail points

    /** Configures the core's fail points (the library must be built with the failpoints feature). */
    public static void configureFailPoints(String spec) {
        NativeBridge.configureFailPoints(spec);
    }

    /**
     * Random faults at every protocol point, each with a bounded count so that the job keeps
     * making progress.
     */
    public static final String RANDOM_FAULTS = String.join(";",
            "twopc-begin=3%2*return",
            "twopc-write=3%3*return",
            "twopc-prepare-before=5%3*return",
            "twopc-prepare-after=5%3*return",
            "twopc-commit-before=5%3*return",
            "twopc-commit-after=5%3*return",
            "twopc-abort-before=5%2*return");

    public static void clearFailPoints() {
        try {
            NativeBridge.configureFailPoints("");
        } catch (IllegalStateException e) {
            // built without fail points: nothing to clear
        }
    }

    // ------------------------------------------------------------------ the job's functions

    /** Numbers as decimal text, one per line. */
    public static final class DecimalLine implements SerializationSchema<Long> {
        private static final long serialVersionUID = 1L;

        @Override
        public byte[] serialize(Long value) {
            return Long.toString(value).getBytes(StandardCharsets.UTF_8);
        }
    }

    /**
     * Slows the stream to about {@code recordsPerMs} per millisecond per subtask, so that a job
     * spans many checkpoints and failures land in the middle of it.
     */
    public static final class Throttle extends RichMapFunction<Long, Long> {
        private static final long serialVersionUID = 1L;
        private final int recordsPerMs;
        private transient long seen;

        public Throttle(int recordsPerMs) {
            this.recordsPerMs = recordsPerMs;
        }

        @Override
        public Long map(Long value) throws Exception {
            if (++seen % recordsPerMs == 0) {
                Thread.sleep(1);
            }
            return value;
        }
    }

    /** Highest attempt number seen per test: attempt n means n restarts happened before it. */
    public static final Map<String, AtomicInteger> MAX_ATTEMPT = new ConcurrentHashMap<>();
    /** Distinct user-code classloaders seen per test. */
    public static final Map<String, Set<Integer>> CLASSLOADERS = new ConcurrentHashMap<>();

    /** Records the attempt number (and user classloader) of every subtask that opens. */
    public static final class AttemptTracker extends RichMapFunction<Long, Long> {
        private static final long serialVersionUID = 1L;
        private final String testName;

        public AttemptTracker(String testName) {
            this.testName = testName;
        }

        @Override
        public void open(OpenContext openContext) {
            int attempt = getRuntimeContext().getTaskInfo().getAttemptNumber();
            MAX_ATTEMPT.computeIfAbsent(testName, k -> new AtomicInteger()).accumulateAndGet(attempt, Math::max);
            CLASSLOADERS.computeIfAbsent(testName, k -> ConcurrentHashMap.newKeySet())
                    .add(System.identityHashCode(getRuntimeContext().getUserCodeClassLoader()));
        }

        @Override
        public Long map(Long value) {
            return value;
        }
    }

    /** Sink subtasks (their indices) that a {@link RecordSeen} has passed a record to, per test. */
    public static final Map<String, Set<Integer>> RECORD_SEEN = new ConcurrentHashMap<>();

    /**
     * Notes which subtasks have passed a record on. Chained in front of the sink, a record it has
     * seen is in the sink's open transaction before any checkpoint triggered afterwards.
     */
    public static final class RecordSeen extends RichMapFunction<Long, Long> {
        private static final long serialVersionUID = 1L;
        private final String testName;
        private transient boolean noted;

        public RecordSeen(String testName) {
            this.testName = testName;
        }

        @Override
        public Long map(Long value) {
            if (!noted) {
                noted = true;
                RECORD_SEEN.computeIfAbsent(testName, k -> ConcurrentHashMap.newKeySet())
                        .add(getRuntimeContext().getTaskInfo().getIndexOfThisSubtask());
            }
            return value;
        }
    }

    public static int subtasksThatSawRecords(String testName) {
        Set<Integer> seen = RECORD_SEEN.get(testName);
        return seen == null ? 0 : seen.size();
    }

    public static int maxAttempt(String testName) {
        AtomicInteger a = MAX_ATTEMPT.get(testName);
        return a == null ? 0 : a.get();
    }

    /** Which failures a {@link FailOnce} actually threw, per test. */
    public static final Map<String, List<String>> INJECTED = new ConcurrentHashMap<>();

    public static List<String> injected(String testName) {
        return INJECTED.getOrDefault(testName, Collections.emptyList());
    }

    /**
     * Throws once per listed attempt, on subtask 0, after {@code afterRecords} records, and only
     * if a checkpoint has (or, with {@code requireCheckpoint == false}, has not yet) completed in
     * this attempt: the two sides of the protocol's commit point.
     */
    public static final class FailOnce extends RichMapFunction<Long, Long>
            implements CheckpointListener, CheckpointedFunction {
        private static final long serialVersionUID = 1L;
        private static final Map<String, AtomicBoolean> FIRED = new ConcurrentHashMap<>();
        private final String testName;
        private final long afterRecords;
        private final boolean requireCheckpoint;
        private final int failingAttempts;
        private transient long seen;
        private transient volatile boolean checkpointCompleted;

        public FailOnce(String testName, long afterRecords, boolean requireCheckpoint, int failingAttempts) {
            this.testName = testName;
            this.afterRecords = afterRecords;
            this.requireCheckpoint = requireCheckpoint;
            this.failingAttempts = failingAttempts;
        }

        @Override
        public Long map(Long value) {
            seen++;
            if (seen >= afterRecords && checkpointCompleted == requireCheckpoint) {
                fire();
            }
            return value;
        }

        /**
         * Fails before any checkpoint completed at the latest at the first one's barrier: on a
         * slow machine a checkpoint can complete before subtask 0 has seen {@code afterRecords}.
         */
        @Override
        public void snapshotState(FunctionSnapshotContext context) {
            if (!requireCheckpoint && !checkpointCompleted) {
                fire();
            }
        }

        @Override
        public void initializeState(FunctionInitializationContext context) {}

        private void fire() {
            int attempt = getRuntimeContext().getTaskInfo().getAttemptNumber();
            if (attempt < failingAttempts
                    && getRuntimeContext().getTaskInfo().getIndexOfThisSubtask() == 0
                    && FIRED.computeIfAbsent(testName + "#" + attempt, k -> new AtomicBoolean())
                            .compareAndSet(false, true)) {
                String what = "attempt " + attempt + " after " + seen + " records, "
                        + (checkpointCompleted ? "after a completed checkpoint" : "before any checkpoint completed");
                INJECTED.computeIfAbsent(testName, k -> Collections.synchronizedList(new ArrayList<>())).add(what);
                throw new RuntimeException("injected test failure: " + what);
            }
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            checkpointCompleted = true;
        }
    }

    // ------------------------------------------------------------------ output checks

    public static Path stagingDir(Path output, String sinkId) {
        return output.resolve("_twopc").resolve(sinkId).resolve("staging");
    }

    public static List<String> listNames(Path dir) throws IOException {
        if (!Files.isDirectory(dir)) {
            return Collections.emptyList();
        }
        List<String> names = new ArrayList<>();
        try (Stream<Path> entries = Files.list(dir)) {
            entries.forEach(p -> names.add(p.getFileName().toString()));
        }
        Collections.sort(names);
        return names;
    }

    public static int committedFileCount(Path output) {
        try {
            return TwopcOutput.committedFiles(output, "part").size();
        } catch (IOException e) {
            return 0; // a file renamed away mid-listing; the caller polls again
        }
    }

    public static long committedRecordCount(Path output) {
        try {
            return TwopcOutput.readCommittedRecords(output).size();
        } catch (IOException e) {
            return -1; // a file renamed away mid-listing; the caller polls again
        }
    }

    /** Reads the committed output with Flink's own FileSource on the test cluster. */
    public static List<String> readWithFileSource(Path output) throws Exception {
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.setParallelism(1);
        FileSource<String> source = FileSource
                .forRecordStreamFormat(new TextLineInputFormat(), new org.apache.flink.core.fs.Path(output.toUri()))
                .build();
        List<String> lines = new ArrayList<>();
        try (CloseableIterator<String> it =
                env.fromSource(source, WatermarkStrategy.noWatermarks(), "read-committed-output").executeAndCollect()) {
            it.forEachRemaining(lines::add);
        }
        return lines;
    }

    /**
     * The heart of every test: the committed output, read through our reader and through Flink's
     * FileSource, holds each of {@code 1..count} exactly once, and nothing is left staged.
     */
    public static void assertExactlyOnce(Path output, String sinkId, long count) throws Exception {
        assertAllOnce("TwopcOutput.readCommittedRecords", TwopcOutput.readCommittedRecords(output), count);
        assertAllOnce("Flink FileSource + TextLineInputFormat", readWithFileSource(output), count);
        assertThat(listNames(stagingDir(output, sinkId)))
                .as("staged transactions left in %s after the job finished", stagingDir(output, sinkId))
                .isEmpty();
    }

    public static void assertAllOnce(String reader, List<String> lines, long count) {
        long[] seen = new long[(int) count + 1];
        List<String> foreign = new ArrayList<>();
        for (String line : lines) {
            long v;
            try {
                v = Long.parseLong(line);
            } catch (NumberFormatException e) {
                foreign.add(line);
                continue;
            }
            if (v < 1 || v > count) {
                foreign.add(line);
            } else {
                seen[(int) v]++;
            }
        }
        TreeMap<Long, Long> duplicates = new TreeMap<>();
        List<Long> missing = new ArrayList<>();
        for (int i = 1; i <= count; i++) {
            if (seen[i] == 0) {
                missing.add((long) i);
            } else if (seen[i] > 1) {
                duplicates.put((long) i, seen[i]);
            }
        }
        assertThat(foreign).as("%s: lines that are not input records", reader).isEmpty();
        assertThat(duplicates).as("%s: records committed more than once (record -> times), of %d read",
                reader, lines.size()).isEmpty();
        assertThat(missing).as("%s: records never committed (%d missing, first ones shown), of %d read",
                reader, missing.size(), lines.size()).isEmpty();
        assertThat(lines).as(reader).hasSize((int) count);
    }

    // ------------------------------------------------------------------ failures and metrics

    /**
     * Finds an exception class in a cause chain. Flink may hand back failures as {@link
     * SerializedThrowable}, which keeps the original class name and message.
     */
    public static Throwable findCause(Throwable error, Class<? extends Throwable> type) {
        for (Throwable t = error; t != null; t = t.getCause()) {
            if (type.isInstance(t)) {
                return t;
            }
            if (t instanceof SerializedThrowable
                    && type.getName().equals(((SerializedThrowable) t).getOriginalErrorClassName())) {
                return t;
            }
            if (t.getCause() == t) {
                break;
            }
        }
        return null;
    }

    public static Throwable failureOf(JobResult result) {
        assertThat(result.isSuccess()).as("job %s should have failed", result.getJobId()).isFalse();
        return result.getSerializedThrowable()
                .map(t -> t.deserializeError(TwopcItSupport.class.getClassLoader()))
                .orElseThrow(() -> new AssertionError("failed job " + result.getJobId() + " has no error"));
    }

    /**
     * Sum of a numeric metric over every subtask and attempt of a job (the reporter retains the
     * metrics of finished and failed attempts). {@code name} is the end of the identifier, e.g.
     * {@code twopc.recordsWritten}.
     */
    public static long sumMetric(InMemoryReporter reporter, JobID jobId, String name) {
        return sumMetric(reporter, jobId, name, variables -> true);
    }

    /**
     * {@link #sumMetric(InMemoryReporter, JobID, String)} over the metric groups whose variables
     * ({@code <subtask_index>}, {@code <task_attempt_num>}, ...) pass {@code groups}.
     */
    public static long sumMetric(InMemoryReporter reporter, JobID jobId, String name,
            Predicate<Map<String, String>> groups) {
        long sum = 0;
        String job = jobId.toString();
        for (Map.Entry<MetricGroup, Map<String, Metric>> group : reporter.getMetricsByGroup().entrySet()) {
            Map<String, String> variables = group.getKey().getAllVariables();
            if (!job.equals(variables.get("<job_id>")) || !groups.test(variables)) {
                continue;
            }
            for (Map.Entry<String, Metric> m : group.getValue().entrySet()) {
                if (!group.getKey().getMetricIdentifier(m.getKey()).endsWith("." + name)) {
                    continue;
                }
                Metric metric = m.getValue();
                if (metric instanceof Counter) {
                    sum += ((Counter) metric).getCount();
                } else if (metric instanceof org.apache.flink.metrics.Histogram) {
                    // A histogram counts the values it was given.
                    sum += ((org.apache.flink.metrics.Histogram) metric).getCount();
                } else if (metric instanceof Gauge) {
                    Object v = ((Gauge<?>) metric).getValue();
                    if (v instanceof Number) {
                        sum += ((Number) v).longValue();
                    }
                }
            }
        }
        return sum;
    }

    /** Deletes a directory tree, tolerating entries that vanish meanwhile (the job may be cleaning too). */
    public static void deleteTree(Path root) throws IOException {
        if (!Files.exists(root)) {
            return;
        }
        List<Path> paths = new ArrayList<>();
        try (Stream<Path> walk = Files.walk(root)) {
            walk.forEach(paths::add);
        } catch (java.io.UncheckedIOException e) {
            if (!(e.getCause() instanceof NoSuchFileException)) {
                throw e;
            }
        }
        Collections.reverse(paths);
        for (Path p : paths) {
            try {
                Files.deleteIfExists(p);
            } catch (java.nio.file.DirectoryNotEmptyException e) {
                deleteTree(p);
            }
        }
    }
}
