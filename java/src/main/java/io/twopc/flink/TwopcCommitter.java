package io.twopc.flink;

import io.twopc.flink.internal.Escalation;
import io.twopc.flink.internal.NativeBridge;

import org.apache.flink.annotation.Internal;
import org.apache.flink.api.connector.sink2.Committer;
import org.apache.flink.api.connector.sink2.CommitterInitContext;
import org.apache.flink.metrics.groups.SinkCommitterMetricGroup;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.Collection;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The Sink V2 committer of a {@link TwopcSink}: commits the prepared transactions of completed
 * checkpoints (and, on restore, those Flink restored into its state), then runs the core's
 * housekeeping for the completed checkpoint.
 *
 * <p>Retries: a commit whose outcome is unknown is retried inside the core, by transaction id,
 * with back-off ({@code setCommitMaxAttempts}, {@code setCommitRetryBackoff}); if it stays unknown
 * the job stops with an unresolved commit. This committer never calls {@code retryLater} (Flink
 * would retry at once, without back-off) and never {@code signalFailedWithKnownReason} (Flink
 * would drop the committable: silent loss), so Flink's {@code sink.committer.retries} plays no
 * part. A lost transaction or an unresolved commit stops the job without a restart loop.
 */
@Internal
public final class TwopcCommitter implements Committer<TwopcCommittable> {
    private static final Logger LOG = LoggerFactory.getLogger(TwopcCommitter.class);
    private static final Pattern CHECKPOINT = Pattern.compile("\"checkpoint\":(\\d+)");

    private final String scope;
    private final long nativeCommitter;
    private final TwopcMetrics metrics;
    /** The checkpoint the job restored (-1: none): commits up to it are the restart's recovery. */
    private final long restoredCheckpointId;
    private boolean closed;

    TwopcCommitter(TwopcSinkOptions options, CommitterInitContext ctx) {
        int subtask = ctx.getTaskInfo().getIndexOfThisSubtask();
        int parallelism = ctx.getTaskInfo().getNumberOfParallelSubtasks();
        this.scope = "twopc sink '" + options.sinkId + "' committer " + subtask + "/" + parallelism;
        SinkCommitterMetricGroup group = ctx.metricGroup();
        this.metrics = TwopcMetrics.forCommitter(group);
        this.restoredCheckpointId = ctx.getRestoredCheckpointId().orElse(-1L);
        try {
            this.nativeCommitter = NativeBridge.openCommitter(options.toConfigJson(),
                    ctx.getJobInfo().getJobId().toHexString(), subtask, parallelism,
                    ctx.getTaskInfo().getAttemptNumber(), options.resolvePassword(),
                    restoredCheckpointId);
        } catch (TwopcException e) {
            throw Escalation.escalate(LOG, scope, e, "opening the committer");
        }
    }

    @Override
    public void commit(Collection<CommitRequest<TwopcCommittable>> requests) {
        long completed = -1;
        for (CommitRequest<TwopcCommittable> request : requests) {
            byte[] handle = request.getCommittable().handle();
            long checkpoint = checkpointOf(handle);
            long started = System.nanoTime();
            long preparedAgeMs = preparedAgeOf(handle);
            int outcome;
            try {
                outcome = NativeBridge.commit(nativeCommitter, handle);
            } catch (TwopcException e) {
                throw Escalation.escalate(LOG, scope, e, "committing");
            }
            if (outcome == NativeBridge.ALREADY_COMMITTED) {
                // Counted by Flink's committer metrics as already committed.
                request.signalAlreadyCommitted();
            }
            metrics.recordCommit(System.nanoTime() - started, preparedAgeMs, outcome,
                    checkpoint >= 0 && checkpoint <= restoredCheckpointId, checkpoint);
            completed = Math.max(completed, checkpoint);
        }
        if (completed >= 0) {
            long[] report;
            try {
                report = NativeBridge.checkpointCompleted(nativeCommitter, completed);
            } catch (TwopcException e) {
                throw Escalation.escalate(LOG, scope, e, "finishing a decided commit");
            }
            metrics.recordHousekeeping(report);
        }
    }

    /** The checkpoint a prepared handle was prepared for (-1 if it cannot be read). */
    private static long checkpointOf(byte[] handle) {
        try {
            Matcher m = CHECKPOINT.matcher(NativeBridge.describeHandle(handle));
            return m.find() ? Long.parseLong(m.group(1)) : -1;
        } catch (RuntimeException e) {
            return -1; // its commit already reported it
        }
    }

    private static long preparedAgeOf(byte[] handle) {
        try {
            return NativeBridge.preparedAgeMs(handle, System.currentTimeMillis());
        } catch (RuntimeException e) {
            return -1; // its commit reports it
        }
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        try {
            // Housekeeping still due after the last completed checkpoint gets one more try; its
            // failure fails the task, and Flink tries again from the final checkpoint.
            metrics.recordLingeringAborted(NativeBridge.finish(nativeCommitter));
        } catch (TwopcException e) {
            throw Escalation.escalate(LOG, scope, e, "the last housekeeping");
        } finally {
            NativeBridge.close(nativeCommitter);
        }
    }
}
