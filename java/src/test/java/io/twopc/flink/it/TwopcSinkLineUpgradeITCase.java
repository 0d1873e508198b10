package io.twopc.flink.it;

import io.twopc.flink.RewindPolicy;

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
    private static StreamExecutionEnvironment job(int parallelism, Path output, int restarts,
            long checkpointIntervalMs, int recordsPerMs) {
        StreamExecutionEnvironment env = environment(parallelism, checkpointIntervalMs, restarts, Duration.ofMillis(100));
        FrontEnd.SINK_V2.attach(env.fromSequence(1, COUNT).uid("numbers").name("numbers")
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

        String savepoint = takeSavepointOnFlink120(output, savepoints, result);
        long prepared = preparedTransactions(output);
        assertThat(prepared).as("prepared transactions the 1.20 savepoint holds").isGreaterThan(0);
        assertThat(committedRecordCount(output)).as("records committed on 1.20").isBetween(1L, COUNT - 1);

        // The upgrade to 2.x, at another parallelism as well: the prepared transactions of the
        // savepoint are committed, the lineage goes on, and the job ends exactly once.
        JobID upgraded = submit(CLUSTER.getClusterClient(), job(3, output, 3, 100, 5), savepoint);
        awaitSuccess(CLUSTER.getClusterClient(), upgraded);
        assertExactlyOnce(output, SINK_ID, COUNT);
        assertThat(sumMetric(METRICS, upgraded, "twopc.transactionsCommitted"))
                .as("transactions the Flink 2.x job committed").isGreaterThan(0);
    }

    /** Runs {@link #main} in a Flink 1.20 JVM and returns the savepoint it took. */
    private static String takeSavepointOnFlink120(Path output, Path savepoints, Path result) throws Exception {
        String classpath = System.getProperty("twopc.flink120Classpath");
        assertThat(classpath).as("system property twopc.flink120Classpath (set by the test2x task)").isNotBlank();
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
        command.add(TwopcSinkLineUpgradeITCase.class.getName());
        command.add(output.toString());
        command.add(savepoints.toString());
        command.add(result.toString());
        File log = result.resolveSibling("flink-1.20-job.log").toFile();
        Process child = new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(log).start();
        if (!child.waitFor(4, TimeUnit.MINUTES)) {
            child.destroyForcibly();
            throw new AssertionError("the Flink 1.20 half did not finish within 4 minutes; its log: " + tail(log));
        }
        assertThat(child.exitValue()).as("exit code of the Flink 1.20 half; its log: %s", tail(log)).isZero();
        return new String(Files.readAllBytes(result), StandardCharsets.UTF_8).trim();
    }

    private static String tail(File log) throws IOException {
        List<String> lines = Files.readAllLines(log.toPath(), StandardCharsets.UTF_8);
        return String.join("\n", lines.subList(Math.max(0, lines.size() - 60), lines.size()));
    }

    private static long preparedTransactions(Path output) throws IOException {
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
     * The Flink 1.20 half, in a JVM of its own: runs the job until a checkpoint's output is
     * committed, then takes a savepoint whose commit fails (as if the job died right after it), so
     * that the savepoint holds prepared, uncommitted transactions. Writes the savepoint's path to
     * {@code args[2]}. Checkpoints are triggered by hand here (the interval is an hour): a periodic
     * checkpoint completing between the fail point and the savepoint would fail the job first.
     */
    public static void main(String[] args) throws Exception {
        Path output = Paths.get(args[0]);
        Path savepoints = Paths.get(args[1]);
        Path result = Paths.get(args[2]);
        if (!EnvironmentInformation.getVersion().startsWith("1.20")) {
            throw new IllegalStateException("the savepoint half must run on Flink 1.20, not "
                    + EnvironmentInformation.getVersion());
        }
        MiniClusterWithClientResource cluster = cluster(InMemoryReporter.create(), 2);
        cluster.before();
        try {
            ClusterClient<?> client = cluster.getClusterClient();
            JobID job = submit(client, job(2, output, 0, 3_600_000, 1), null);
            triggerCheckpoint(client, job);
            waitUntil("the first checkpoint's records are committed", Duration.ofMinutes(2),
                    () -> committedRecordCount(output) > 0);
            configureFailPoints("twopc-commit-before=return");
            String savepoint = client
                    .triggerSavepoint(job, savepoints.toUri().toString(), SavepointFormatType.CANONICAL)
                    .get(2, TimeUnit.MINUTES);
            JobResult ended = awaitResult(client, job);
            if (ended.isSuccess()) {
                throw new IllegalStateException("the job was to end at its failed commit, but it finished");
            }
            clearFailPoints();
            Files.write(result, savepoint.getBytes(StandardCharsets.UTF_8));
            System.out.println("savepoint on Flink " + EnvironmentInformation.getVersion() + ": " + savepoint);
        } finally {
            cluster.after();
        }
        System.exit(0);
    }
}
