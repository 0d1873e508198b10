package io.twopc.flink.it;

import io.twopc.flink.RewindPolicy;
import io.twopc.flink.TwopcRewindException;

import org.apache.flink.api.common.JobID;
import org.apache.flink.client.program.ClusterClient;
import org.apache.flink.core.execution.SavepointFormatType;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.runtime.util.EnvironmentInformation;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;

import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

import java.io.File;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static io.twopc.flink.it.TwopcItSupport.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * The second step of the upgrade path (README, "Upgrading"): a savepoint of the Sink V2 sink
 * taken on Flink 1.20, with prepared transactions whose commit never happened, restored into the
 * same job on Flink 2.x. The 1.20 half runs in a child JVM on the Flink 1.20 test classpath
 * ({@link #main}); this JVM is the Flink 2.x one. Runs in the {@code test2x} task only: it needs
 * both lines, and Gradle passes the 1.20 classpath in {@code twopc.flink120Classpath}.
 */
public class TwopcSinkLineUpgradeITCase {
    private static final String SINK_ID = "line-upgrade";
    private static final long COUNT = 40_000;
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = cluster(METRICS, 4);

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    /** The job on both lines: the same operators and uids, so the savepoint's state maps back. */
    static StreamExecutionEnvironment job(FrontEnd frontEnd, int parallelism, Path output, int restarts,
            long checkpointIntervalMs, int recordsPerMs) {
        StreamExecutionEnvironment env = environment(parallelism, checkpointIntervalMs, restarts, Duration.ofMillis(100));
        frontEnd.attach(env.fromSequence(1, COUNT).uid("numbers").name("numbers")
                                .map(new Throttle(recordsPerMs)).uid("throttle").name("throttle"),
                        b -> b.forDirectory(output).setSinkId(SINK_ID).setSerializationSchema(new DecimalLine())
                                .setRewindPolicy(RewindPolicy.FAIL))
                .uid("twopc-sink").name("twopc-sink");
        return env;
    }

    @Test
    public void aSinkV2SavepointOfFlink120RestoresOnFlink2ExactlyOnce() throws Exception {
        assertThat(EnvironmentInformation.getVersion()).as("this test's own Flink line").startsWith("2.");
        Path output = tmp.newFolder("out").toPath();
        Path savepoints = tmp.newFolder("savepoints").toPath();
        Path result = tmp.getRoot().toPath().resolve("savepoint-path");

        String savepoint = runOnFlink120("twopc.flink120Classpath", TwopcSinkLineUpgradeITCase.class.getName(),
                output, savepoints, result).get(0);
        assertThat(preparedTransactions(output)).as("prepared transactions the 1.20 savepoint holds").isGreaterThan(0);
        assertThat(committedRecordCount(output)).as("records committed on 1.20").isBetween(1L, COUNT - 1);

        // The upgrade to 2.x, at another parallelism as well: the prepared transactions of the
        // savepoint are committed, the lineage goes on, and the job ends exactly once.
        JobID upgraded = submit(CLUSTER.getClusterClient(), job(FrontEnd.SINK_V2, 3, output, 3, 100, 5), savepoint);
        awaitSuccess(CLUSTER.getClusterClient(), upgraded);
        assertExactlyOnce(output, SINK_ID, COUNT);
        assertThat(sumMetric(METRICS, upgraded, "twopc.transactionsCommitted"))
                .as("transactions the Flink 2.x job committed").isGreaterThan(0);
    }

    /**
     * Both upgrades: the SinkFunction on Flink 1.20, its savepoint restored into the Sink V2 sink
     * on 1.20, and that job's savepoint restored on Flink 2.x under the same uid. The state of
     * Flink's {@code TwoPhaseCommitSinkFunction}, which Flink carries into every later savepoint,
     * must not stop the restore on 2.x; and the SinkFunction's savepoint itself restores on 2.x
     * as well (the one-step path). Both savepoints hold prepared transactions whose commit never
     * happened. After the end, the SinkFunction's savepoint is a rewind of the same lineage: the
     * lineage went on through both upgrades.
     */
    @Test
    public void aSinkFunctionSavepointReachesFlink2ThroughSinkV2OnFlink120AndTheLineageGoesOn() throws Exception {
        assertThat(EnvironmentInformation.getVersion()).as("this test's own Flink line").startsWith("2.");
        Path output = tmp.newFolder("out").toPath();
        Path savepoints = tmp.newFolder("savepoints").toPath();
        Path result = tmp.getRoot().toPath().resolve("savepoint-paths");
        List<String> taken = runOnFlink120("twopc.flink120LegacyClasspath", SINK_FUNCTION_HALF, output,
                savepoints, result);
        assertThat(taken).as("savepoints of the SinkFunction and of the Sink V2 sink on 1.20").hasSize(2);
        String sinkFunctionSavepoint = taken.get(0);
        String sinkV2Savepoint = taken.get(1);
        assertThat(preparedTransactions(output)).as("prepared transactions the 1.20 savepoint holds").isGreaterThan(0);

        // Two steps: the Sink V2 savepoint of 1.20 (which carries the SinkFunction's state).
        JobID upgraded = submit(CLUSTER.getClusterClient(), job(FrontEnd.SINK_V2, 3, output, 3, 100, 5),
                sinkV2Savepoint);
        awaitSuccess(CLUSTER.getClusterClient(), upgraded);
        assertExactlyOnce(output, SINK_ID, COUNT);

        // The lineage went on from the SinkFunction: its savepoint is now a rewind, refused.
        JobID rewound = submit(CLUSTER.getClusterClient(), job(FrontEnd.SINK_V2, 2, output, 0, 100, 5),
                sinkFunctionSavepoint);
        Throwable failure = failureOf(awaitResult(CLUSTER.getClusterClient(), rewound));
        assertThat(findCause(failure, TwopcRewindException.class))
                .as("TwopcRewindException in the cause chain of %s", failure).isNotNull();
        assertExactlyOnce(output, SINK_ID, COUNT);
    }

    /**
     * The one-step path: a savepoint of the SinkFunction on Flink 1.20, with prepared transactions,
     * restored into the Sink V2 sink on Flink 2.x under the same uid.
     */
    @Test
    public void aSinkFunctionSavepointOfFlink120RestoresOnFlink2InOneStep() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        Path savepoints = tmp.newFolder("savepoints").toPath();
        Path result = tmp.getRoot().toPath().resolve("savepoint-paths");
        List<String> taken = runOnFlink120("twopc.flink120LegacyClasspath", SINK_FUNCTION_HALF, output,
                savepoints, result, "one-step");
        assertThat(taken).hasSize(1);
        long prepared = preparedTransactions(output);
        assertThat(prepared).as("prepared transactions the SinkFunction's savepoint holds").isGreaterThan(0);

        JobID upgraded = submit(CLUSTER.getClusterClient(), job(FrontEnd.SINK_V2, 3, output, 3, 100, 5), taken.get(0));
        awaitSuccess(CLUSTER.getClusterClient(), upgraded);
        assertExactlyOnce(output, SINK_ID, COUNT);
        assertThat(preparedTransactions(output)).as("prepared transactions left").isZero();
    }

    /** The 1.20 half of the SinkFunction paths, in the legacyTest source set. */
    private static final String SINK_FUNCTION_HALF = "io.twopc.flink.it.SinkFunctionSavepointsOnFlink120";

    /**
     * Runs a test step whose savepoints are taken by Flink 1.20, each in a JVM of its own: its
     * {@code main} takes the output directory, the savepoint directory and a file into which it
     * writes the savepoints' paths, one per line, then any further arguments.
     */
    private static List<String> runOnFlink120(String classpathProperty, String mainClass, Path output, Path savepoints,
            Path result, String... more) throws Exception {
        String classpath = System.getProperty(classpathProperty);
        assertThat(classpath).as("system property %s (set by the test2x task)", classpathProperty).isNotBlank();
        List<String> command = new ArrayList<>();
        command.add(Paths.get(System.getProperty("java.home"), "bin", "java").toString());
        // The same --add-opens (Flink's JDK 17 needs) and system properties as this JVM.
        for (String arg : ManagementFactory.getRuntimeMXBean().getInputArguments()) {
            if (arg.startsWith("--add-opens") || arg.startsWith("--add-exports") || arg.startsWith("-Dtwopc.")) {
                command.add(arg);
            }
        }
        command.add("-Xmx1g");
        command.add("-cp");
        command.add(classpath);
        command.add(mainClass);
        command.add(output.toString());
        command.add(savepoints.toString());
        command.add(result.toString());
        command.addAll(Arrays.asList(more));
        File log = result.resolveSibling("flink-1.20-job.log").toFile();
        Process child = new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(log).start();
        if (!child.waitFor(5, TimeUnit.MINUTES)) {
            child.destroyForcibly();
            throw new AssertionError("the Flink 1.20 half did not finish within 5 minutes; its log: " + tail(log));
        }
        assertThat(child.exitValue()).as("exit code of the Flink 1.20 half; its log: %s", tail(log)).isZero();
        return Files.readAllLines(result, StandardCharsets.UTF_8);
    }

    private static String tail(File log) throws IOException {
        List<String> lines = Files.readAllLines(log.toPath(), StandardCharsets.UTF_8);
        return String.join("\n", lines.subList(Math.max(0, lines.size() - 60), lines.size()));
    }

    static long preparedTransactions(Path output) throws IOException {
        long prepared = 0;
        Path staging = stagingDir(output, SINK_ID);
        for (String txn : listNames(staging)) {
            if (Files.exists(staging.resolve(txn).resolve("prepared"))) {
                prepared++;
            }
        }
        return prepared;
    }

    /**
     * Runs {@code env} (restored from {@code restoreFrom}, if set) until a checkpoint's output is
     * committed, then takes a savepoint whose commit fails (as if the job died right after it),
     * so that the savepoint holds prepared, uncommitted transactions; returns the savepoint.
     * Checkpoints are triggered by hand (the interval is an hour): a periodic checkpoint
     * completing between the fail point and the savepoint would fail the job first.
     */
    static String savepointWithPreparedTransactions(ClusterClient<?> client, InMemoryReporter metrics,
            StreamExecutionEnvironment env, String restoreFrom, Path output, Path savepoints) throws Exception {
        long before = committedRecordCount(output);
        JobID job = submit(client, env, restoreFrom);
        // Until a checkpoint's records are committed, each time until every subtask's commit of
        // it has returned (a restored savepoint's prepared transactions are committed before the
        // job runs): a commit still running when the fail point is set would fail the job before
        // the savepoint. The output alone does not tell: a subtask that had no records yet
        // commits an empty transaction, which shows nothing.
        checkpointUntilRecordsCommitted(client, metrics, job, env.getParallelism(), before,
                () -> committedRecordCount(output));
        configureFailPoints("twopc-commit-before=return");
        try {
            String savepoint = client
                    .triggerSavepoint(job, savepoints.toUri().toString(), SavepointFormatType.CANONICAL)
                    .get(2, TimeUnit.MINUTES);
            JobResult ended = awaitResult(client, job);
            if (ended.isSuccess()) {
                throw new IllegalStateException("the job was to end at its failed commit, but it finished");
            }
            return savepoint;
        } finally {
            clearFailPoints();
        }
    }

    /**
     * The Flink 1.20 half, in a JVM of its own: a savepoint of the Sink V2 sink with prepared
     * transactions. Writes the savepoint's path to {@code args[2]}.
     */
    public static void main(String[] args) throws Exception {
        Path output = Paths.get(args[0]);
        Path savepoints = Paths.get(args[1]);
        Path result = Paths.get(args[2]);
        if (!EnvironmentInformation.getVersion().startsWith("1.20")) {
            throw new IllegalStateException("the savepoint half must run on Flink 1.20, not "
                    + EnvironmentInformation.getVersion());
        }
        InMemoryReporter metrics = InMemoryReporter.create();
        MiniClusterWithClientResource cluster = cluster(metrics, 2);
        cluster.before();
        try {
            String savepoint = savepointWithPreparedTransactions(cluster.getClusterClient(), metrics,
                    job(FrontEnd.SINK_V2, 2, output, 0, 3_600_000, 1), null, output, savepoints);
            Files.write(result, savepoint.getBytes(StandardCharsets.UTF_8));
            System.out.println("savepoint on Flink " + EnvironmentInformation.getVersion() + ": " + savepoint);
        } finally {
            cluster.after();
        }
        System.exit(0);
    }
}
