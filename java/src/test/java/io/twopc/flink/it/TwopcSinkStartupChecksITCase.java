package io.twopc.flink.it;

import io.twopc.flink.FreshStartPolicy;
import io.twopc.flink.TwopcConfigException;
import io.twopc.flink.TwopcFreshStartException;
import io.twopc.flink.TwopcOutput;
import io.twopc.flink.TwopcOwnershipException;
import io.twopc.flink.TwopcRecordRejectedException;
import io.twopc.flink.TwopcSinkBuilderBase;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.RuntimeExecutionMode;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.file.src.FileSource;
import org.apache.flink.connector.file.src.reader.TextLineInputFormat;
import org.apache.flink.core.execution.CheckpointType;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;

import org.junit.After;
import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

import static io.twopc.flink.it.TwopcItSupport.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * Conditions under which the sink must refuse to run, stopping the job once (no restart loop)
 * with a message that says what to change: no checkpointing, a retention a restart would outlive,
 * records the LINES format cannot hold, an output directory the sink may not write, two sinks
 * with one sink id on one destination, and a stateless start over an earlier run's output or
 * prepared transactions (which the fresh-start policies then allow explicitly).
 */
public class TwopcSinkStartupChecksITCase {
    private static final String SINK_ID = "checked";
    private static final int RESTART_ATTEMPTS = 50;
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = cluster(METRICS, 4);

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    @After
    public void resetFailPoints() {
        clearFailPoints();
    }

    /** The front end under test; the shim's subclass runs these tests through {@code addSink}. */
    protected FrontEnd frontEnd() {
        return FrontEnd.SINK_V2;
    }

    /** Numbers 1..count into the sink, configured by {@code more} after the common settings. */
    private void numbersInto(StreamExecutionEnvironment env, long count, Path output,
            Consumer<TwopcSinkBuilderBase<Long, ?>> more) {
        frontEnd().attach(env.fromSequence(1, count).uid("numbers").map(new Throttle(20)).uid("throttle")
                .map(new RecordSeen(output.toString())).uid("seen"), b -> {
            b.forDirectory(output).setSinkId(SINK_ID).setSerializationSchema(new DecimalLine());
            more.accept(b);
        }).uid("twopc-sink");
    }

    private void numbersInto(StreamExecutionEnvironment env, long count, Path output) {
        numbersInto(env, count, output, b -> { });
    }

    /**
     * Runs the job and expects it to be refused with {@code type} in the cause chain: when the job
     * is built (the Sink V2 front end checks what it can see there), or when it starts, then
     * without a single restart.
     */
    private static Throwable expectStoppedBy(StreamExecutionEnvironment env, Class<? extends Throwable> type)
            throws Exception {
        JobID jobId;
        try {
            jobId = submit(CLUSTER.getClusterClient(), env, null);
        } catch (Exception atBuild) {
            Throwable cause = findCause(atBuild, type);
            assertThat(cause).as("%s in the cause chain of %s", type.getSimpleName(), atBuild).isNotNull();
            return cause;
        }
        JobResult result = awaitResult(CLUSTER.getClusterClient(), jobId);
        Throwable failure = failureOf(result);
        Throwable cause = findCause(failure, type);
        assertThat(cause).as("%s in the cause chain of %s", type.getSimpleName(), failure).isNotNull();
        assertThat(sumMetric(METRICS, jobId, "numRestarts")).as("restarts after a fatal error").isZero();
        return cause;
    }

    private static void runToTheEnd(StreamExecutionEnvironment env) throws Exception {
        awaitSuccess(CLUSTER.getClusterClient(), submit(CLUSTER.getClusterClient(), env, null));
    }

    @Test
    public void jobWithoutCheckpointingIsRefused() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        StreamExecutionEnvironment env = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        env.getCheckpointConfig().disableCheckpointing();
        numbersInto(env, 1000, output);

        Throwable error = expectStoppedBy(env, TwopcConfigException.class);
        assertThat(error.getMessage()).contains("checkpointing is disabled", "enableCheckpointing");
    }

    /**
     * The builder's checkpoint interval is a fallback for when the job's cannot be read: it never
     * stands in for a job that has no checkpoints (the SinkFunction shim handed the native side an
     * interval of 0, which then took the builder's, and the job ran without ever committing).
     */
    @Test
    public void jobWithoutCheckpointingIsRefusedWhateverTheBuildersInterval() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        StreamExecutionEnvironment env = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        env.getCheckpointConfig().disableCheckpointing();
        numbersInto(env, 1000, output, b -> b.setCheckpointInterval(Duration.ofSeconds(30)));

        Throwable error = expectStoppedBy(env, TwopcConfigException.class);
        assertThat(error.getMessage()).contains("checkpointing is disabled", "enableCheckpointing");
    }

    @Test
    public void jobWithoutCheckpointsAfterTasksFinishIsRefused() throws Exception {
        // Without them a subtask whose input ends finishes without a final checkpoint, and the
        // transaction with its last records is never committed: output missing, and no error.
        // Flink 1.20 also reads the older key, and 2.x still does.
        for (String key : new String[] {"execution.checkpointing.checkpoints-after-tasks-finish",
                "execution.checkpointing.checkpoints-after-tasks-finish.enabled"}) {
            Path output = tmp.newFolder().toPath();
            Configuration conf = new Configuration();
            conf.setString(key, "false");
            StreamExecutionEnvironment env = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50), conf);
            numbersInto(env, 1000, output);

            Throwable error = expectStoppedBy(env, TwopcConfigException.class);
            assertThat(error.getMessage()).as("refusal of %s: false", key).contains("'" + SINK_ID + "'",
                    "execution.checkpointing.checkpoints-after-tasks-finish is false", "never be committed",
                    "execution.checkpointing.checkpoints-after-tasks-finish: true");
            assertThat(TwopcOutput.readCommittedRecords(output)).as("records committed").isEmpty();
        }
    }

    /**
     * A BATCH job takes no checkpoints, and Flink would commit each subtask's output at the end of
     * its input: not recoverable exactly once. Refused, whether BATCH is set or AUTOMATIC picks it
     * for bounded sources (the environment's checkpoint settings still say "enabled" there).
     */
    @Test
    public void batchExecutionIsRefused() throws Exception {
        for (RuntimeExecutionMode mode : new RuntimeExecutionMode[] {
                RuntimeExecutionMode.BATCH, RuntimeExecutionMode.AUTOMATIC}) {
            Path output = tmp.newFolder().toPath();
            StreamExecutionEnvironment env = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
            env.setRuntimeMode(mode);
            numbersInto(env, 1000, output);

            Throwable error = expectStoppedBy(env, TwopcConfigException.class);
            assertThat(error.getMessage()).as("refusal in %s mode", mode).contains("BATCH", "STREAMING");
            assertThat(TwopcOutput.readCommittedRecords(output)).as("records committed in %s mode", mode).isEmpty();
        }
    }

    /**
     * AUTOMATIC runs a job in BATCH only when no source of the whole job is unbounded: a bounded
     * branch into the sink beside an unbounded one elsewhere runs in STREAMING, and is not refused.
     */
    @Test
    public void automaticModeWithAnUnboundedSourceElsewhereIsNotRefused() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        StreamExecutionEnvironment env = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        env.setRuntimeMode(RuntimeExecutionMode.AUTOMATIC);
        numbersInto(env, 1000, output);
        env.fromSource(FileSource.forRecordStreamFormat(new TextLineInputFormat(),
                                new org.apache.flink.core.fs.Path(tmp.newFolder("in").toURI()))
                        .monitorContinuously(Duration.ofSeconds(1)).build(),
                WatermarkStrategy.noWatermarks(), "watched").print();
        // Building the graph is where the sink checks; the job itself would run forever.
        assertThat(env.getStreamGraph().getJobGraph().getNumberOfVertices()).isGreaterThan(1);
    }

    /**
     * AT_LEAST_ONCE checkpoints do not align barriers, so a transaction could hold records of the
     * next checkpoint, replayed after a failover: duplicates. Approximate local recovery restarts a
     * task without rewinding its inputs. Both refused.
     */
    @Test
    public void checkpointsWeakerThanExactlyOnceAreRefused() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        Configuration conf = new Configuration();
        conf.setString("execution.checkpointing.mode", "AT_LEAST_ONCE");
        StreamExecutionEnvironment atLeastOnce = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50), conf);
        numbersInto(atLeastOnce, 1000, output);
        Throwable error = expectStoppedBy(atLeastOnce, TwopcConfigException.class);
        assertThat(error.getMessage()).contains("'" + SINK_ID + "'", "AT_LEAST_ONCE", "duplicate",
                "execution.checkpointing.mode: EXACTLY_ONCE");

        // Flink 1.20 does not start this job with approximate local recovery at all when the sink
        // is a SinkFunction ("Could not start the JobMaster"); the Sink V2 sink refuses it first,
        // when the job is built.
        if (frontEnd() == FrontEnd.SINK_V2) {
            StreamExecutionEnvironment approximate = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
            approximate.getCheckpointConfig().enableApproximateLocalRecovery(true);
            numbersInto(approximate, 1000, output);
            error = expectStoppedBy(approximate, TwopcConfigException.class);
            assertThat(error.getMessage()).contains("'" + SINK_ID + "'", "approximate local recovery");
        }
        assertThat(TwopcOutput.readCommittedRecords(output)).as("records committed").isEmpty();
    }

    @Test
    public void retentionShorterThanARestartIsRefused() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        StreamExecutionEnvironment env = environment(2, 1_000, RESTART_ATTEMPTS, Duration.ofMillis(50));
        // Passes the builder (which does not know the interval) but not the core's check
        // against the interval read from the job: 2 x 1000 ms + 1000 ms > 2000 ms.
        numbersInto(env, 1000, output,
                b -> b.setRetention(Duration.ofSeconds(2)).setRestartAllowance(Duration.ofSeconds(1)));

        Throwable error = expectStoppedBy(env, TwopcConfigException.class);
        assertThat(error.getMessage()).contains("(1s each)", "Raise the retention to at least 3s");
    }

    /** Emits text with a line break inside, which LINES output would split into two records. */
    static final class WithNewline implements SerializationSchema<Long> {
        private static final long serialVersionUID = 1L;

        @Override
        public byte[] serialize(Long value) {
            return (value + (value == 500 ? "\nsplit" : "")).getBytes(StandardCharsets.UTF_8);
        }
    }

    @Test
    public void recordWithALineBreakIsRefusedInLinesFormat() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        StreamExecutionEnvironment env = environment(1, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        numbersInto(env, 1000, output, b -> b.setSerializationSchema(new WithNewline()));

        Throwable error = expectStoppedBy(env, TwopcRecordRejectedException.class);
        assertThat(error.getMessage()).contains("line break", "record format RAW", "500\\nsplit");
        // Checkpoints before the record committed what came before it; its transaction never.
        assertThat(TwopcOutput.readCommittedRecords(output))
                .as("records committed").allSatisfy(r -> assertThat(Long.parseLong(r)).isLessThan(500));
    }

    @Test
    public void anOutputDirectoryTheSinkMayNotWriteStopsWithoutARestartLoop() throws Exception {
        // sysfs refuses every new entry, even to root: EPERM, as a read-only or foreign
        // directory gives. A restart cannot fix that.
        Path output = java.nio.file.Paths.get("/sys/twopc-it-" + System.nanoTime());
        StreamExecutionEnvironment env = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        numbersInto(env, 1000, output);

        Throwable error = expectStoppedBy(env, TwopcConfigException.class);
        assertThat(error.getMessage()).contains(output.toString());
    }

    @Test
    public void twoSinksWithOneSinkIdOnOneDirectoryAreRefused() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        StreamExecutionEnvironment env = environment(1, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        frontEnd().attach(env.fromSequence(1, 100_000).map(new Throttle(5)),
                b -> b.forDirectory(output).setSinkId(SINK_ID).setSerializationSchema(new DecimalLine())
                        .setOwnerWait(Duration.ZERO))
                .uid("first-sink");
        frontEnd().attach(env.fromSequence(1, 100_000).map(new Throttle(5)),
                b -> b.forDirectory(output).setSinkId(SINK_ID).setSerializationSchema(new DecimalLine())
                        .setOwnerWait(Duration.ZERO))
                .uid("second-sink");

        Throwable error = expectStoppedBy(env, TwopcOwnershipException.class);
        assertThat(error.getMessage()).contains("'" + SINK_ID + "'", "Give each sink its own sink id");
    }

    @Test
    public void freshStartOntoAnEarlierRunsOutputIsRefusedUnlessAppending() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        long count = 5_000;
        StreamExecutionEnvironment first = environment(2, 100, 0, Duration.ofMillis(50));
        numbersInto(first, count, output);
        runToTheEnd(first);
        assertExactlyOnce(output, SINK_ID, count);
        List<Path> before = TwopcOutput.committedFiles(output, "part");

        // The same job again, without its state: by default it would write everything twice.
        StreamExecutionEnvironment again = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        numbersInto(again, count, output);
        Throwable error = expectStoppedBy(again, TwopcFreshStartException.class);
        assertThat(error.getMessage()).contains("already holds output this sink committed in earlier runs",
                "set the fresh-start policy to APPEND", "restore the earlier run's latest checkpoint");
        assertThat(TwopcOutput.committedFiles(output, "part")).as("nothing written by the refused run")
                .isEqualTo(before);

        // Appending a new run is a choice the operator makes explicitly.
        StreamExecutionEnvironment appended = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        numbersInto(appended, count, output, b -> b.setFreshStartPolicy(FreshStartPolicy.APPEND));
        runToTheEnd(appended);
        List<String> records = TwopcOutput.readCommittedRecords(output);
        assertThat(records).as("two complete runs").hasSize((int) (2 * count));
        assertAllOnce("the second run's files", readFiles(output, before), count);
    }

    /**
     * A new execution under the job id of one that committed output, without its state: what
     * application mode with high availability does when redeployed under the same
     * {@code high-availability.cluster-id} (the job id is derived from it). Found by review: it
     * was taken for a failover of the earlier execution, so its output did not count as earlier
     * output (even the default FAIL let the replay through) and that execution's prepared
     * transactions would have been aborted as its own. Now it stops whatever the policy. The
     * second execution runs on a cluster of its own: the first one keeps the job id's result and
     * refuses to run it again.
     */
    @Test
    public void aNewExecutionUnderAJobIdThatCommittedOutputIsRefusedWhateverThePolicy() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        long count = 3_000;
        JobID fixed = new JobID();
        StreamExecutionEnvironment first = environment(2, 100, 0, Duration.ofMillis(50));
        numbersInto(first, count, output);
        JobGraph firstGraph = first.getStreamGraph().getJobGraph();
        firstGraph.setJobID(fixed);
        awaitSuccess(CLUSTER.getClusterClient(),
                CLUSTER.getClusterClient().submitJob(firstGraph).get(1, TimeUnit.MINUTES));
        assertExactlyOnce(output, SINK_ID, count);
        List<Path> before = TwopcOutput.committedFiles(output, "part");

        MiniCluster another = new MiniCluster(new MiniClusterConfiguration.Builder()
                .setConfiguration(new Configuration())
                .setNumTaskManagers(1)
                .setNumSlotsPerTaskManager(4)
                .build());
        another.start();
        try {
            StreamExecutionEnvironment again = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
            numbersInto(again, count, output, b -> b.setFreshStartPolicy(FreshStartPolicy.APPEND));
            JobGraph againGraph = again.getStreamGraph().getJobGraph();
            againGraph.setJobID(fixed);
            another.submitJob(againGraph).get(1, TimeUnit.MINUTES);
            JobResult result = another.requestJobResult(fixed).get(JOB_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
            Throwable failure = failureOf(result);
            Throwable error = findCause(failure, TwopcFreshStartException.class);
            assertThat(error).as("TwopcFreshStartException in the cause chain of %s", failure).isNotNull();
            assertThat(error.getMessage()).contains("under the same Flink job id",
                    "high-availability.cluster-id", "Nothing was changed");
        } finally {
            another.close();
        }
        assertThat(TwopcOutput.committedFiles(output, "part")).as("nothing written by the refused execution")
                .isEqualTo(before);
        assertExactlyOnce(output, SINK_ID, count);
    }

    /** The committed records of the files not in {@code exclude}. */
    private static List<String> readFiles(Path output, List<Path> exclude) throws Exception {
        List<String> lines = new java.util.ArrayList<>();
        for (Path file : TwopcOutput.committedFiles(output, "part")) {
            if (!exclude.contains(file)) {
                lines.addAll(java.nio.file.Files.readAllLines(file, StandardCharsets.UTF_8));
            }
        }
        return lines;
    }

    @Test
    public void statelessStartOverAnEarlierRunsPreparedTransactionsIsRefusedUnlessAllowed() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        long count = 10_000;

        // An earlier run whose every commit fails and which gives up: its completed
        // checkpoints' transactions stay prepared, and its state is not restored below. Its
        // checkpoint is triggered by hand once records have reached the sink: a checkpoint that
        // came first would hold only empty transactions, which stage nothing.
        configureFailPoints("twopc-commit-before=return");
        StreamExecutionEnvironment broken = environment(2, 3_600_000, 0, Duration.ofMillis(50));
        numbersInto(broken, count, output);
        JobID brokenJob = submit(CLUSTER.getClusterClient(), broken, null);
        waitUntil("records reach the sink", Duration.ofMinutes(1),
                () -> subtasksThatSawRecords(output.toString()) > 0);
        // Not waited for: the job fails at the checkpoint's commit, and the answer to the
        // trigger may then never come.
        CLUSTER.getClusterClient().triggerCheckpoint(brokenJob, CheckpointType.CONFIGURED);
        JobResult brokenResult = awaitResult(CLUSTER.getClusterClient(), brokenJob);
        assertThat(brokenResult.isSuccess()).isFalse();
        clearFailPoints();
        assertThat(listNames(stagingDir(output, SINK_ID))).as("prepared transactions left behind").isNotEmpty();

        // Default policy: a new run without state must not silently abort them.
        StreamExecutionEnvironment fresh = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        numbersInto(fresh, count, output);
        Throwable error = expectStoppedBy(fresh, TwopcFreshStartException.class);
        assertThat(error.getMessage()).contains("without restored state", "prepared, uncommitted",
                "ABORT_PREPARED");

        // The operator decides their output is not wanted: the new run aborts them and writes
        // its own complete output.
        StreamExecutionEnvironment allowed = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        numbersInto(allowed, count, output, b -> b.setFreshStartPolicy(FreshStartPolicy.ABORT_PREPARED));
        runToTheEnd(allowed);
        assertExactlyOnce(output, SINK_ID, count);
    }
}
