package io.twopc.flink;

import io.twopc.flink.internal.Escalation;
import io.twopc.flink.internal.KnownFlinkIssues;
import io.twopc.flink.internal.NativeBridge;

import org.apache.flink.annotation.Internal;
import org.apache.flink.api.connector.sink2.Committer;
import org.apache.flink.api.connector.sink2.CommitterInitContext;
import org.apache.flink.metrics.groups.SinkCommitterMetricGroup;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.Collection;

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

    private final String scope;
    private final long nativeCommitter;
    private final TwopcMetrics metrics;
    /** The checkpoint the job restored (-1: none): commits up to it are the restart's recovery. */
    private final long restoredCheckpointId;
    /** The destination's transaction timeout, against which a commit's wait is measured. */
    private final long retentionMs;
    /** {@code setTimeoutWarningRatio}: the share of the retention after which a commit warns. */
    private final double timeoutWarningRatio;
    /**
     * Set once this attempt committed the committable its writer emitted at the end of its input
     * (and the rest of that commit call succeeded): the subtask's output is complete and
     * committed, and only then does {@link #close()} run the last housekeeping.
     */
    private boolean endOfInputCommitted;
    private boolean closed;

    TwopcCommitter(TwopcSinkOptions options, CommitterInitContext ctx) {
        int subtask = ctx.getTaskInfo().getIndexOfThisSubtask();
        int parallelism = ctx.getTaskInfo().getNumberOfParallelSubtasks();
        this.scope = "twopc sink '" + options.sinkId + "' committer " + subtask + "/" + parallelism;
        SinkCommitterMetricGroup group = ctx.metricGroup();
        this.metrics = TwopcMetrics.forCommitter(group);
        this.restoredCheckpointId = ctx.getRestoredCheckpointId().orElse(-1L);
        this.retentionMs = options.retentionMs;
        this.timeoutWarningRatio = options.timeoutWarningRatio;
        KnownFlinkIssues.warnIfAffected(LOG);
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
        boolean endOfInput = false;
        // Prepared transactions handed over for this completed checkpoint and not committed yet:
        // above zero for as long as a commit keeps retrying (a destination that went away).
        int pending = requests.size();
        metrics.setPendingTransactions(pending);
        for (CommitRequest<TwopcCommittable> request : requests) {
            byte[] handle = request.getCommittable().handle();
            long checkpoint = checkpointOf(handle);
            // Only a mark this attempt's writer set counts (it numbers checkpoints on from the
            // restored one): a restored mark was set before the restore, and committing it says
            // nothing about how this attempt ends.
            endOfInput |= request.getCommittable().isEndOfInput() && checkpoint > restoredCheckpointId;
            long started = System.nanoTime();
            long preparedAgeMs = preparedAgeOf(handle);
            warnIfNearRetention(handle, checkpoint, preparedAgeMs);
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
            long duration = System.nanoTime() - started;
            metrics.recordCommitVisible(NativeBridge.lastCommitVisibleNanos(nativeCommitter));
            metrics.recordCommit(duration, preparedAgeMs, outcome,
                    checkpoint >= 0 && checkpoint <= restoredCheckpointId, checkpoint);
            completed = Math.max(completed, checkpoint);
            metrics.setPendingTransactions(--pending);
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
        if (endOfInput) {
            endOfInputCommitted = true;
        }
    }

    /** The checkpoint a prepared handle was prepared for (-1 if it cannot be read). */
    private static long checkpointOf(byte[] handle) {
        try {
            return NativeBridge.handleCheckpoint(handle);
        } catch (RuntimeException e) {
            return -1; // its commit already reported it
        }
    }

    /**
     * Warns, naming the transaction, when one reaching its commit waited for most of the
     * retention ({@code setTimeoutWarningRatio}): a little longer and cleanup may have removed
     * it, and its output would be lost.
     */
    private void warnIfNearRetention(byte[] handle, long checkpoint, long preparedAgeMs) {
        if (preparedAgeMs < 0 || preparedAgeMs < timeoutWarningRatio * retentionMs) {
            return;
        }
        LOG.warn("{}: committing transaction {} (checkpoint {}): it was prepared {} ago, {}% of the retention of "
                        + "{}. Had it not been committed before the retention ran out, cleanup could have removed it "
                        + "and its output would be lost (the job would stop with a LOST error). Check why "
                        + "checkpoints take so long to complete, or raise the retention",
                scope, transactionOf(handle), checkpoint < 0 ? "unknown" : String.valueOf(checkpoint),
                Durations.format(preparedAgeMs),
                retentionMs > 0 ? Math.round(100.0 * preparedAgeMs / retentionMs) : 100,
                Durations.format(retentionMs));
    }

    /** The transaction id inside a handle, for log lines ("unknown" if it cannot be read). */
    private static String transactionOf(byte[] handle) {
        try {
            return NativeBridge.handleTransaction(handle);
        } catch (RuntimeException e) {
            return "unknown"; // its commit reports it
        }
    }

    private static long preparedAgeOf(byte[] handle) {
        try {
            return NativeBridge.preparedAgeMs(handle, System.currentTimeMillis());
        } catch (RuntimeException e) {
            return -1; // its commit reports it
        }
    }

    /**
     * Runs the last housekeeping (lingering transactions whose cleanup failed after every
     * checkpoint so far) only when this attempt committed its writer's end-of-input committable.
     * Flink calls {@code close()} also when the task failed or was cancelled; such an attempt may
     * be a zombie whose subtask share a newer attempt has already taken over (an object store's
     * leases pass at once), and its cleanup would abort that attempt's transactions as lingering.
     * A failure is reported (a warning and the {@code housekeepingFailures} metric), not thrown:
     * after the final checkpoint Flink redeploys a failed subtask as finished, so nothing would try
     * again and the exception could only cause a pointless restart. Fatal errors (a decided commit
     * it had to finish found lost or unresolved, damaged control data) still stop the job.
     */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        Throwable failure = null;
        try {
            if (endOfInputCommitted) {
                finalHousekeeping();
            }
        } catch (RuntimeException | Error e) {
            failure = e;
            throw e;
        } finally {
            NativeBridge.closeAfter(nativeCommitter, failure);
        }
    }

    private void finalHousekeeping() {
        try {
            metrics.recordLingeringAborted(NativeBridge.finish(nativeCommitter));
        } catch (TwopcException e) {
            if (e.isFatal()) {
                throw Escalation.escalate(LOG, scope, e, "the last housekeeping after the end of input");
            }
            metrics.recordHousekeepingFailure();
            LOG.warn(Escalation.unfinishedHousekeeping(scope, Thread.currentThread().isInterrupted(),
                    e.getMessage()));
        }
    }
}
