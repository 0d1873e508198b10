package io.twopc.flink;

import static org.assertj.core.api.Assertions.assertThat;

import io.twopc.flink.internal.NativeBridge;
import io.twopc.flink.internal.RecordBatcher;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import java.util.OptionalLong;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobInfo;
import org.apache.flink.api.common.JobInfoImpl;
import org.apache.flink.api.common.TaskInfo;
import org.apache.flink.api.common.TaskInfoImpl;
import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.api.connector.sink2.Committer;
import org.apache.flink.api.connector.sink2.CommitterInitContext;
import org.apache.flink.metrics.groups.SinkCommitterMetricGroup;
import org.apache.flink.runtime.metrics.groups.InternalSinkCommitterMetricGroup;
import org.apache.flink.runtime.metrics.groups.UnregisteredMetricGroups;
import org.apache.flink.testutils.logging.TestLoggerResource;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;
import org.slf4j.event.Level;

/**
 * {@code setTimeoutWarningRatio} (SQL: {@code 'sink.timeout-warning-ratio'}) is a setting of the
 * Sink V2 sink too: a transaction that reaches its commit after waiting for that share of the
 * retention is logged as a warning naming it, as the SinkFunction shim does.
 */
public class TwopcCommitterTimeoutWarningTest {
    private static final String SINK_ID = "aging";

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    @Test
    public void aCommitAfterTheWarningShareOfTheRetentionIsLoggedNamingTheTransaction() throws Throwable {
        NativeBridge.ensureLoaded();
        File out = tmp.newFolder("out");
        // A ratio of 0: every transaction has waited long enough to be warned about.
        TwopcSinkOptions options = TwopcSink.<String>forDirectory(out.getAbsolutePath())
                .setSinkId(SINK_ID)
                .setSerializationSchema(new SimpleStringSchema())
                .setRetention(Duration.ofHours(1))
                .setTimeoutWarningRatio(0.0)
                .build()
                .getOptions();
        JobID job = new JobID();
        long writer = NativeBridge.openWriter(options.toConfigJson(options.instanceFor("writer-operator")),
                job.toHexString(), 0, 1, 0, 10_000L, null, -1L, new byte[0][], new byte[0][]);
        try {
            byte[] open = NativeBridge.begin(writer);
            RecordBatcher.Batch[] batch = new RecordBatcher.Batch[1];
            RecordBatcher batcher = new RecordBatcher(1 << 16, 16, '\n', b -> batch[0] = b);
            batcher.add("a record".getBytes(StandardCharsets.UTF_8));
            batcher.flush();
            NativeBridge.write(writer, open, batch[0]);
            byte[] prepared = NativeBridge.prepare(writer, open, 1);
            String transaction = NativeBridge.describeHandle(prepared)
                    .replaceAll("(?s).*\"transaction\"\\s*:\\s*\"([^\"]+)\".*", "$1");

            TwopcCommitter committer = new TwopcCommitter(options, new Context(job));
            try (TestLoggerResource.SingleTestResource log =
                    TestLoggerResource.asSingleTestResource(TwopcCommitter.class.getName(), Level.WARN)) {
                committer.commit(Collections.singletonList(new Request(new TwopcCommittable(prepared))));
                assertThat(log.getMessages())
                        .as("warnings of the committer")
                        .anySatisfy(m -> assertThat(m)
                                .contains("transaction " + transaction)
                                .contains("checkpoint 1")
                                .contains("of the retention of 1h"));
            } finally {
                committer.close();
            }
        } finally {
            NativeBridge.close(writer);
        }
    }

    /** Subtask 0 of 1, attempt 0, not restored. */
    private static final class Context implements CommitterInitContext {
        private final JobID job;

        Context(JobID job) {
            this.job = job;
        }

        @Override
        public SinkCommitterMetricGroup metricGroup() {
            return InternalSinkCommitterMetricGroup.wrap(
                    UnregisteredMetricGroups.createUnregisteredOperatorMetricGroup());
        }

        @Override
        public OptionalLong getRestoredCheckpointId() {
            return OptionalLong.empty();
        }

        @Override
        public JobInfo getJobInfo() {
            return new JobInfoImpl(job, "aging-job");
        }

        @Override
        public TaskInfo getTaskInfo() {
            return new TaskInfoImpl("committer", 1, 0, 1, 0);
        }
    }

    private static final class Request implements Committer.CommitRequest<TwopcCommittable> {
        private final TwopcCommittable committable;

        Request(TwopcCommittable committable) {
            this.committable = committable;
        }

        @Override
        public TwopcCommittable getCommittable() {
            return committable;
        }

        @Override
        public int getNumberOfRetries() {
            return 0;
        }

        @Override
        public void signalFailedWithKnownReason(Throwable t) {
            throw new AssertionError("the committer gave the committable up", t);
        }

        @Override
        public void signalFailedWithUnknownReason(Throwable t) {
            throw new AssertionError("the committer gave the committable up", t);
        }

        @Override
        public void retryLater() {
            throw new AssertionError("the committer asked Flink to retry");
        }

        @Override
        public void updateAndRetryLater(TwopcCommittable committable) {
            throw new AssertionError("the committer asked Flink to retry");
        }

        @Override
        public void signalAlreadyCommitted() {}
    }
}
