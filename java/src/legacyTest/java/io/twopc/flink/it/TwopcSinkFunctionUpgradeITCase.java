package io.twopc.flink.it;

import io.twopc.flink.RewindPolicy;
import io.twopc.flink.TwopcFreshStartException;
import io.twopc.flink.TwopcRewindException;

import org.apache.flink.api.common.JobID;
import org.apache.flink.client.program.ClusterClient;
import org.apache.flink.core.execution.SavepointFormatType;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;

import org.junit.After;
import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.TimeUnit;

import static io.twopc.flink.it.TwopcItSupport.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * The upgrade from the SinkFunction shim ({@code addSink}) to the Sink V2 sink ({@code sinkTo})
 * through a savepoint, on Flink 1.20: same operator uid, same sink id. The savepoint holds
 * prepared transactions whose commit never happened; the Sink V2 job must commit them, continue
 * the lineage (so a rewind is still detected) and end exactly once. A restore under another uid
 * must not start fresh over them silently, and neither may the way back (a Sink V2 savepoint
 * restored into the SinkFunction).
 */
public class TwopcSinkFunctionUpgradeITCase {
    private static final String SINK_ID = "upgraded";
    private static final Duration LINEAGE_WAIT = Duration.ofSeconds(15);
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = cluster(METRICS, 4);

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    @After
    public void resetFailPoints() {
        clearFailPoints();
    }

    private static ClusterClient<?> client() {
        return CLUSTER.getClusterClient();
    }

    private static StreamExecutionEnvironment job(FrontEnd frontEnd, int parallelism, long count, Path output,
            int restarts, String sinkUid, RewindPolicy rewind) {
        return job(frontEnd, parallelism, count, output, restarts, sinkUid, rewind, 100, 5);
    }

    private static StreamExecutionEnvironment job(FrontEnd frontEnd, int parallelism, long count, Path output,
            int restarts, String sinkUid, RewindPolicy rewind, long checkpointIntervalMs, int recordsPerMs) {
        StreamExecutionEnvironment env = environment(parallelism, checkpointIntervalMs, restarts, Duration.ofMillis(100));
        frontEnd.attach(env.fromSequence(1, count).uid("numbers").name("numbers")
                                .map(new Throttle(recordsPerMs)).uid("throttle").name("throttle"),
                        b -> b.forDirectory(output).setSinkId(SINK_ID).setSerializationSchema(new DecimalLine())
                                .setRewindPolicy(rewind)
                                // A restore that gives the sink no state (the cases below) waits
                                // this long for a lineage nobody records, then reports.
                                .setLineageWait(LINEAGE_WAIT))
                .uid(sinkUid).name("twopc-sink");
        return env;
    }

    /**
     * Runs the shim until a checkpoint's output is committed, then takes a savepoint whose commit
     * fails (as if the job died right after it): the savepoint holds prepared, uncommitted
     * transactions. Checkpoints are triggered by hand (the interval is an hour): a periodic
     * checkpoint completing between the fail point and the savepoint would fail the job first.
     */
    private String shimSavepointWithPreparedTransactions(Path output, Path savepoints, long count) throws Exception {
        return savepointWithPreparedTransactions(SinkFunctionFrontEnd.SINK_FUNCTION, output, savepoints, count);
    }

    private String savepointWithPreparedTransactions(FrontEnd frontEnd, Path output, Path savepoints, long count)
            throws Exception {
        JobID shim = submit(client(), job(frontEnd, 2, count, output, 0, "twopc-sink",
                RewindPolicy.FAIL, 3_600_000, 1), null);
        // Until a checkpoint's records are committed, each time until both subtasks' commits of
        // it have returned: one still running when the fail point is set fails the job before
        // the savepoint completes (seen once in CI). The output alone does not tell: a subtask
        // that had no records yet commits an empty transaction, which writes no file.
        checkpointUntilRecordsCommitted(client(), METRICS, shim, 2, 0, () -> committedRecordCount(output));
        configureFailPoints("twopc-commit-before=return");
        String savepoint = client()
                .triggerSavepoint(shim, savepoints.toUri().toString(), SavepointFormatType.CANONICAL)
                .get(2, TimeUnit.MINUTES);
        JobResult result = awaitResult(client(), shim);
        assertThat(result.isSuccess()).as("the %s job ends at its failed commit", frontEnd).isFalse();
        clearFailPoints();
        assertThat(preparedTransactions(output)).as("prepared transactions the savepoint holds").isGreaterThan(0);
        return savepoint;
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

    @Test
    public void aShimSavepointRestoresIntoTheSinkV2SinkExactlyOnce() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        Path savepoints = tmp.newFolder("savepoints").toPath();
        long count = 40_000;
        String savepoint = shimSavepointWithPreparedTransactions(output, savepoints, count);

        // The upgrade, at another parallelism as well.
        JobID upgraded = submit(client(), job(FrontEnd.SINK_V2, 3, count, output, 3, "twopc-sink",
                RewindPolicy.FAIL), savepoint);
        awaitSuccess(client(), upgraded);

        assertExactlyOnce(output, SINK_ID, count);
        assertThat(sumMetric(METRICS, upgraded, "twopc.transactionsCommitted"))
                .as("transactions the Sink V2 job committed").isGreaterThan(0);
    }

    @Test
    public void theLineageCarriesOverSoARewindIsStillDetected() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        Path savepoints = tmp.newFolder("savepoints").toPath();
        long count = 30_000;
        // The shim runs to the end, with a savepoint taken early on.
        JobID shim = submit(client(), job(SinkFunctionFrontEnd.SINK_FUNCTION, 2, count, output, 0, "twopc-sink",
                RewindPolicy.FAIL), null);
        waitUntil("3000 records are committed", Duration.ofMinutes(1), () -> committedRecordCount(output) >= 3_000);
        String early = client()
                .triggerSavepoint(shim, savepoints.toUri().toString(), SavepointFormatType.CANONICAL)
                .get(2, TimeUnit.MINUTES);
        awaitSuccess(client(), shim);
        assertExactlyOnce(output, SINK_ID, count);

        // Restored into the Sink V2 sink, the savepoint is older than committed output of the
        // same lineage: a rewind, refused under FAIL (a sink that lost the lineage would see a
        // fresh start instead).
        JobID rewound = submit(client(), job(FrontEnd.SINK_V2, 2, count, output, 3, "twopc-sink",
                RewindPolicy.FAIL), early);
        Throwable failure = failureOf(awaitResult(client(), rewound));
        assertThat(findCause(failure, TwopcRewindException.class))
                .as("TwopcRewindException in the cause chain of %s", failure).isNotNull();

        // REPLACE_RANGE repairs it across the upgrade.
        JobID replaced = submit(client(), job(FrontEnd.SINK_V2, 2, count, output, 3, "twopc-sink",
                RewindPolicy.REPLACE_RANGE), early);
        awaitSuccess(client(), replaced);
        assertExactlyOnce(output, SINK_ID, count);
    }

    @Test
    public void aForgottenUidNeverStartsFreshOverTheShimsPreparedTransactions() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        Path savepoints = tmp.newFolder("savepoints").toPath();
        long count = 40_000;
        String savepoint = shimSavepointWithPreparedTransactions(output, savepoints, count);
        long prepared = preparedTransactions(output);

        // Another uid: the sink's state maps to no operator. Flink refuses that unless told to
        // drop it; told so, the sink starts without state and must refuse to go over the
        // prepared transactions of the earlier run.
        JobID dropped = submit(client(), job(FrontEnd.SINK_V2, 2, count, output, 3, "another-uid",
                RewindPolicy.FAIL), savepoint, true);
        Throwable failure = failureOf(awaitResult(client(), dropped));
        Throwable fresh = findCause(failure, TwopcFreshStartException.class);
        assertThat(fresh).as("TwopcFreshStartException in the cause chain of %s", failure).isNotNull();
        assertThat(fresh.getMessage()).contains("prepared, uncommitted");
        assertThat(preparedTransactions(output)).as("prepared transactions left untouched").isEqualTo(prepared);

        // With the uid right, the upgrade goes through.
        JobID upgraded = submit(client(), job(FrontEnd.SINK_V2, 2, count, output, 3, "twopc-sink",
                RewindPolicy.FAIL), savepoint);
        awaitSuccess(client(), upgraded);
        assertExactlyOnce(output, SINK_ID, count);
    }

    /**
     * The way back is not supported: the SinkFunction reads neither the Sink V2 writer's state nor
     * its committer's (the committables of the savepoint). It must not go over the savepoint's
     * prepared transactions either way: Flink refuses the restore (state of an operator the job
     * no longer has), and with that state dropped on purpose the sink starts without state and
     * refuses to start fresh over them. The Sink V2 sink then restores the savepoint exactly once.
     */
    @Test
    public void aSinkV2SavepointNeverRestoresIntoTheSinkFunctionOverItsPreparedTransactions() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        Path savepoints = tmp.newFolder("savepoints").toPath();
        long count = 40_000;
        String savepoint = savepointWithPreparedTransactions(FrontEnd.SINK_V2, output, savepoints, count);
        long prepared = preparedTransactions(output);

        Throwable refused = restoreFailure(job(SinkFunctionFrontEnd.SINK_FUNCTION, 2, count, output, 0,
                "twopc-sink", RewindPolicy.FAIL), savepoint, false);
        assertThat(refused).as("restoring a Sink V2 savepoint into the SinkFunction").isNotNull();
        assertThat(org.apache.flink.util.ExceptionUtils.stringifyException(refused))
                .as("Flink's refusal").contains("Cannot map checkpoint/savepoint state", "allowNonRestoredState");
        assertThat(preparedTransactions(output)).as("prepared transactions left untouched").isEqualTo(prepared);

        Throwable dropped = restoreFailure(job(SinkFunctionFrontEnd.SINK_FUNCTION, 2, count, output, 0,
                "twopc-sink", RewindPolicy.FAIL), savepoint, true);
        Throwable fresh = findCause(dropped, TwopcFreshStartException.class);
        assertThat(fresh).as("TwopcFreshStartException in the cause chain of %s", dropped).isNotNull();
        assertThat(fresh.getMessage()).contains("prepared, uncommitted");
        assertThat(preparedTransactions(output)).as("prepared transactions left untouched").isEqualTo(prepared);

        JobID back = submit(client(), job(FrontEnd.SINK_V2, 2, count, output, 3, "twopc-sink",
                RewindPolicy.FAIL), savepoint);
        awaitSuccess(client(), back);
        assertExactlyOnce(output, SINK_ID, count);
    }

    /** Why a job restored from {@code savepoint} failed (at submission or while running), or null. */
    private static Throwable restoreFailure(StreamExecutionEnvironment env, String savepoint,
            boolean allowNonRestoredState) throws Exception {
        JobID job;
        try {
            job = submit(client(), env, savepoint, allowNonRestoredState);
        } catch (Exception e) {
            return e;
        }
        JobResult result = awaitResult(client(), job);
        return result.isSuccess() ? null : failureOf(result);
    }
}
