package io.twopc.flink.it;

import io.twopc.flink.FreshStartPolicy;
import io.twopc.flink.TwopcConfigException;
import io.twopc.flink.TwopcFreshStartException;
import io.twopc.flink.TwopcSink;
import io.twopc.flink.TwopcSinkBuilder;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.runtime.jobmaster.JobResult;
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

import static io.twopc.flink.it.TwopcItSupport.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * Conditions under which the sink must refuse to run, stopping the job once (no restart loop)
 * with a message that says what to change: no checkpointing, a retention a restart would outlive,
 * records the LINES format cannot hold, and a stateless start over prepared transactions of an
 * earlier run (which {@link FreshStartPolicy#ABORT_PREPARED} then clears).
 */
public class TwopcSinkStartupChecksITCase {
    private static final String SINK_ID = "checked";
    private static final int RESTART_ATTEMPTS = 50;
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = cluster(METRICS, 2);

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    @After
    public void resetFailPoints() {
        clearFailPoints();
    }

    private static TwopcSinkBuilder<Long> sink(Path output) {
        return TwopcSink.<Long>builder()
                .forDirectory(output)
                .setSinkId(SINK_ID)
                .setSerializationSchema(new DecimalLine());
    }

    /** Runs the job, expects it to fail without restarting, and returns the named cause. */
    private static Throwable expectStoppedBy(StreamExecutionEnvironment env, Class<? extends Throwable> type)
            throws Exception {
        JobID jobId = submit(CLUSTER.getClusterClient(), env, null);
        JobResult result = awaitResult(CLUSTER.getClusterClient(), jobId);
        Throwable failure = failureOf(result);
        Throwable cause = findCause(failure, type);
        assertThat(cause).as("%s in the cause chain of %s", type.getSimpleName(), failure).isNotNull();
        assertThat(sumMetric(METRICS, jobId, "numRestarts")).as("restarts after a fatal error").isZero();
        return cause;
    }

    @Test
    public void jobWithoutCheckpointingIsRefused() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        StreamExecutionEnvironment env = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        env.getCheckpointConfig().disableCheckpointing();
        env.fromSequence(1, 1000).addSink(sink(output).build());

        Throwable error = expectStoppedBy(env, TwopcConfigException.class);
        assertThat(error.getMessage()).contains("checkpointing is disabled", "enableCheckpointing");
    }

    @Test
    public void retentionShorterThanARestartIsRefused() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        StreamExecutionEnvironment env = environment(2, 1_000, RESTART_ATTEMPTS, Duration.ofMillis(50));
        // Passes the builder (which does not know the interval) but not the core's check
        // against the interval read from the job: 2 x 1000 ms + 1000 ms > 2000 ms.
        env.fromSequence(1, 1000).addSink(sink(output)
                .setRetention(Duration.ofSeconds(2))
                .setRestartAllowance(Duration.ofSeconds(1))
                .build());

        Throwable error = expectStoppedBy(env, TwopcConfigException.class);
        assertThat(error.getMessage()).contains("1000 ms each", "Raise the retention to at least 3000 ms");
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
        env.fromSequence(1, 1000).addSink(TwopcSink.<Long>builder()
                .forDirectory(output)
                .setSinkId(SINK_ID)
                .setSerializationSchema(new WithNewline())
                .build());

        Throwable error = expectStoppedBy(env, TwopcConfigException.class);
        assertThat(error.getMessage()).contains("contains a newline", "RecordFormat.RAW");
        assertThat(committedRecordCount(output)).as("records committed").isZero();
    }

    @Test
    public void statelessStartOverAnEarlierRunsPreparedTransactionsIsRefusedUnlessAllowed() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        long count = 10_000;

        // An earlier run whose every commit fails and which gives up: its completed
        // checkpoints' transactions stay prepared, and its state is not restored below.
        configureFailPoints("twopc-commit-before=return");
        StreamExecutionEnvironment broken = environment(2, 100, 0, Duration.ofMillis(50));
        broken.fromSequence(1, count).map(new Throttle(10)).addSink(sink(output).build());
        JobResult brokenResult = awaitResult(CLUSTER.getClusterClient(),
                submit(CLUSTER.getClusterClient(), broken, null));
        assertThat(brokenResult.isSuccess()).isFalse();
        clearFailPoints();
        assertThat(listNames(stagingDir(output, SINK_ID))).as("prepared transactions left behind").isNotEmpty();

        // Default policy: a new run without state must not silently abort them.
        StreamExecutionEnvironment fresh = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        fresh.fromSequence(1, count).addSink(sink(output).build());
        Throwable error = expectStoppedBy(fresh, TwopcFreshStartException.class);
        assertThat(error.getMessage()).contains("without restored state", "prepared, uncommitted",
                "ABORT_PREPARED");

        // The operator decides their output is not wanted: the new run aborts them and writes
        // its own complete output.
        StreamExecutionEnvironment allowed = environment(2, 100, RESTART_ATTEMPTS, Duration.ofMillis(50));
        allowed.fromSequence(1, count)
                .addSink(sink(output).setFreshStartPolicy(FreshStartPolicy.ABORT_PREPARED).build());
        awaitSuccess(CLUSTER.getClusterClient(), submit(CLUSTER.getClusterClient(), allowed, null));
        assertExactlyOnce(output, SINK_ID, count);
    }
}
