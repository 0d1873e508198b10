package io.twopc.flink.it;

import io.twopc.flink.RewindPolicy;
import io.twopc.flink.TwopcOutput;
import io.twopc.flink.TwopcRewindException;
import io.twopc.flink.TwopcSink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.client.program.ClusterClient;
import org.apache.flink.core.execution.SavepointFormatType;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;

import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static io.twopc.flink.it.TwopcItSupport.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * Savepoints: stop-with-savepoint and restore at other parallelisms, and restores from a
 * savepoint older than output already committed (a rewind), which must be detected and, with
 * {@link RewindPolicy#REPLACE_RANGE}, repaired.
 */
public class TwopcSinkSavepointITCase {
    private static final String SINK_ID = "numbers";
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = cluster(METRICS, 4);

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    static ClusterClient<?> client() {
        return CLUSTER.getClusterClient();
    }

    /** The front end under test; the shim's subclass runs these tests through {@code addSink}. */
    protected FrontEnd frontEnd() {
        return FrontEnd.SINK_V2;
    }

    /** The same job graph shape (and operator uids) in every run, so savepoint state maps back. */
    StreamExecutionEnvironment numbersJob(FrontEnd frontEnd, int parallelism, long count, int recordsPerMs,
            Path output, RewindPolicy rewind) {
        StreamExecutionEnvironment env = environment(parallelism, 100, 100, Duration.ofMillis(100));
        frontEnd.attach(env.fromSequence(1, count).uid("numbers").name("numbers")
                                .map(new Throttle(recordsPerMs)).uid("throttle").name("throttle"),
                        b -> b.forDirectory(output)
                                .setSinkId(SINK_ID)
                                .setSerializationSchema(new DecimalLine())
                                .setRewindPolicy(rewind))
                .uid("twopc-sink").name("twopc-sink");
        return env;
    }

    private StreamExecutionEnvironment numbersJob(int parallelism, long count, int recordsPerMs, Path output,
            RewindPolicy rewind) {
        return numbersJob(frontEnd(), parallelism, count, recordsPerMs, output, rewind);
    }

    String stopWithSavepoint(JobID jobId, Path savepoints) throws Exception {
        String savepoint = client()
                .stopWithSavepoint(jobId, false, savepoints.toUri().toString(), SavepointFormatType.CANONICAL)
                .get(2, TimeUnit.MINUTES);
        awaitSuccess(client(), jobId);
        return savepoint;
    }

    /** The committed output so far: no record twice, and nothing left staged by a stopped job. */
    static long assertConsistentPrefix(Path output) throws Exception {
        List<String> records = TwopcOutput.readCommittedRecords(output);
        assertThat(records).as("records committed so far").doesNotHaveDuplicates();
        assertThat(listNames(stagingDir(output, SINK_ID))).as("staged transactions of a stopped job").isEmpty();
        return records.size();
    }

    // 6 ---------------------------------------------------------------------------------------

    @Test
    public void stopWithSavepointThenRestoreAtLowerAndHigherParallelism() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        Path savepoints = tmp.newFolder("savepoints").toPath();
        long count = 80_000;

        // Parallelism 4 splits the sequence into four ranges, so every later subtask has one.
        JobID first = submit(client(), numbersJob(4, count, 5, output, RewindPolicy.FAIL), null);
        waitUntil("10000 records are committed", Duration.ofMinutes(1), () -> committedRecordCount(output) >= 10_000);
        String savepoint1 = stopWithSavepoint(first, savepoints);
        long afterFirst = assertConsistentPrefix(output);
        assertThat(afterFirst).as("the first run stopped before the end").isLessThan(count);

        JobID second = submit(client(), numbersJob(2, count, 5, output, RewindPolicy.FAIL), savepoint1);
        waitUntil("10000 more records are committed", Duration.ofMinutes(1),
                () -> committedRecordCount(output) >= afterFirst + 10_000);
        String savepoint2 = stopWithSavepoint(second, savepoints);
        long afterSecond = assertConsistentPrefix(output);
        assertThat(afterSecond).as("the second run stopped before the end").isLessThan(count);

        JobID third = submit(client(), numbersJob(3, count, 5, output, RewindPolicy.FAIL), savepoint2);
        awaitSuccess(client(), third);

        assertExactlyOnce(output, SINK_ID, count);
    }

    @Test
    public void anAbortThatFailsAtTheCloseOfAStopWithSavepointDoesNotFailTheStop()
            throws Exception {
        // After the savepoint, close aborts each subtask's open transaction, whose records are in
        // no checkpoint. A failed abort loses nothing (what it staged stays invisible, and the
        // next start aborts it as lingering), so it must not turn the stop into a failed job
        // (the SinkFunction shim's close threw it: "failed during stopping").
        Path output = tmp.newFolder("out").toPath();
        Path savepoints = tmp.newFolder("savepoints").toPath();
        long count = 40_000;
        JobID first = submit(client(), numbersJob(2, count, 5, output, RewindPolicy.FAIL), null);
        waitUntil("5000 records are committed", Duration.ofMinutes(1), () -> committedRecordCount(output) >= 5_000);
        String savepoint;
        configureFailPoints("twopc-abort-before=return");
        try {
            savepoint = stopWithSavepoint(first, savepoints);
        } finally {
            clearFailPoints();
        }
        List<String> records = TwopcOutput.readCommittedRecords(output);
        assertThat(records).as("records committed so far").doesNotHaveDuplicates();

        JobID second = submit(client(), numbersJob(2, count, 5, output, RewindPolicy.FAIL), savepoint);
        awaitSuccess(client(), second);

        assertExactlyOnce(output, SINK_ID, count);
    }

    // 7 ---------------------------------------------------------------------------------------

    @Test
    public void restoreFromASavepointOlderThanCommittedOutputStopsAndReplaceRangeRepairsIt() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        Path savepoints = tmp.newFolder("savepoints").toPath();
        long count = 40_000;

        // Run to the end, with a savepoint taken early on: everything committed after it is
        // output a restore from it would write again.
        // Slow enough (about 10 s of input) that the savepoint is taken while the job still runs.
        JobID original = submit(client(), numbersJob(2, count, 2, output, RewindPolicy.FAIL), null);
        waitUntil("5000 records are committed", Duration.ofMinutes(1), () -> committedRecordCount(output) >= 5_000);
        String oldSavepoint = client()
                .triggerSavepoint(original, savepoints.toUri().toString(), SavepointFormatType.CANONICAL)
                .get(2, TimeUnit.MINUTES);
        awaitSuccess(client(), original);
        assertExactlyOnce(output, SINK_ID, count);
        List<Path> filesBefore = TwopcOutput.committedFiles(output, "part");

        // Default policy: the rewind is detected at start-up and the job stops for good.
        JobID rewound = submit(client(), numbersJob(2, count, 10, output, RewindPolicy.FAIL), oldSavepoint);
        JobResult result = awaitResult(client(), rewound);
        Throwable failure = failureOf(result);
        Throwable rewind = findCause(failure, TwopcRewindException.class);
        assertThat(rewind).as("TwopcRewindException in the cause chain of %s", failure).isNotNull();
        assertThat(rewind.getMessage()).contains("is older than output this sink already committed", "REPLACE_RANGE");
        assertThat(sumMetric(METRICS, rewound, "numRestarts")).as("restarts of the rewound job").isZero();
        assertThat(TwopcOutput.committedFiles(output, "part"))
                .as("the destination is untouched by the refused restore").isEqualTo(filesBefore);
        assertExactlyOnce(output, SINK_ID, count);

        // REPLACE_RANGE: output committed after the savepoint is retracted and written again.
        JobID replaced = submit(client(), numbersJob(2, count, 10, output, RewindPolicy.REPLACE_RANGE), oldSavepoint);
        awaitSuccess(client(), replaced);

        assertExactlyOnce(output, SINK_ID, count);
        assertThat(TwopcOutput.committedFiles(output, "part"))
                .as("the replayed range is in new files").isNotEqualTo(filesBefore);
    }
}
