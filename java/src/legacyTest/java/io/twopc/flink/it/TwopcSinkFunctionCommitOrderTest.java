package io.twopc.flink.it;

import io.twopc.flink.TwopcSinkFunction;

import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.streaming.api.operators.StreamSink;
import org.apache.flink.streaming.util.OneInputStreamOperatorTestHarness;

import org.junit.After;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

import java.nio.file.Path;
import java.time.Duration;

import static io.twopc.flink.it.TwopcItSupport.clearFailPoints;
import static io.twopc.flink.it.TwopcItSupport.committedRecordCount;
import static io.twopc.flink.it.TwopcItSupport.configureFailPoints;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The SinkFunction shim driven by Flink's own operator test harness, one step at a time: when one
 * notification commits the transactions of two checkpoints and the first commit fails, the second
 * must not be committed before it (Flink's {@code TwoPhaseCommitSinkFunction} goes on to the next
 * pending transaction after a failure and fails the task only at the end).
 */
@SuppressWarnings("deprecation")
public class TwopcSinkFunctionCommitOrderTest {
    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    @After
    public void resetFailPoints() {
        clearFailPoints();
    }

    @Test
    public void aFailedCommitHoldsBackTheCommitsOfLaterCheckpoints() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        TwopcSinkFunction<String> sink = sink(output, "ordered");
        try (OneInputStreamOperatorTestHarness<String, Object> harness =
                     new OneInputStreamOperatorTestHarness<>(new StreamSink<>(sink))) {
            harness.setup();
            harness.open();
            harness.processElement("first", 1);
            harness.snapshot(1, 1);
            harness.processElement("second", 2);
            harness.snapshot(2, 2);
            // Checkpoint 1's notification never came; checkpoint 2's commits both, and the first
            // commit fails.
            configureFailPoints("twopc-commit-before=1*return");
            assertThatThrownBy(() -> harness.notifyOfCompletedCheckpoint(2))
                    .hasStackTraceContaining("injected");
            assertThat(committedRecordCount(output))
                    .as("checkpoint 2's output is not shown before checkpoint 1's").isZero();
            clearFailPoints();
        }
    }

    /**
     * After the end of input the later commits are held back too: a task whose final
     * notification failed never reached FINISHED and is restored from that checkpoint, whose
     * recovery commits them in order (with stop-with-savepoint --drain, committing the savepoint's
     * transaction here would show output that the failover to an older checkpoint replays).
     */
    @Test
    public void afterTheEndOfInputAFailedCommitHoldsTheLaterOnesBackToo() throws Exception {
        Path output = tmp.newFolder("out").toPath();
        TwopcSinkFunction<String> sink = sink(output, "ending");
        try (OneInputStreamOperatorTestHarness<String, Object> harness =
                     new OneInputStreamOperatorTestHarness<>(new StreamSink<>(sink))) {
            harness.setup();
            harness.open();
            harness.processElement("first", 1);
            harness.snapshot(1, 1);
            harness.processElement("second", 2);
            harness.snapshot(2, 2);
            harness.processElement("last", 3);
            harness.getOneInputOperator().finish();
            harness.snapshot(3, 3);
            configureFailPoints("twopc-commit-before=1*return");
            assertThatThrownBy(() -> harness.notifyOfCompletedCheckpoint(3))
                    .hasStackTraceContaining("injected");
            assertThat(committedRecordCount(output))
                    .as("the final checkpoints' output waits for checkpoint 1's").isZero();
            clearFailPoints();
        }
    }

    private static TwopcSinkFunction<String> sink(Path output, String sinkId) {
        return TwopcSinkFunction.<String>builder()
                .forDirectory(output).setSinkId(sinkId).setSerializationSchema(new SimpleStringSchema())
                // The harness runs no checkpoint coordinator; one attempt, so that the injected
                // failure is the commit's outcome.
                .setCheckpointInterval(Duration.ofSeconds(1)).setCommitMaxAttempts(1).build();
    }
}
