package io.twopc.flink;

import org.apache.flink.annotation.Internal;

import io.twopc.flink.internal.NativeBridge;

import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.Gauge;
import org.apache.flink.metrics.Histogram;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.metrics.SimpleCounter;
import org.apache.flink.runtime.metrics.DescriptiveStatisticsHistogram;

/**
 * The sink's own metrics, in a {@code twopc} group under the operator's metric group, with the
 * same names in both front ends: the Sink V2 writer registers the writer's half, its committer the
 * committer's half, and the SinkFunction shim (writer and committer in one operator) both.
 * Counters are updated by the task thread as it goes (once per batch, commit or abort), never
 * polled from the native side: metric reporters run on threads of their own.
 */
@Internal
final class TwopcMetrics {
    static final String GROUP = "twopc";

    // Writer half.
    private final Counter recordsWritten;
    private final Counter bytesWritten;
    private final Counter transactionsPrepared;
    private final Counter transactionsAborted;
    // Committer half.
    private final Counter transactionsCommitted;
    private final Counter commitsFoundAlreadyCommitted;
    private final Counter recoveredCommits;
    private final Counter lingeringAborted;
    private final Counter expired;
    private final Counter housekeepingFailures;
    private final Histogram commitLatencyMs;
    private final Histogram commitDurationMicros;
    private final Histogram commitVisibleMicros;
    private volatile long lastCommittedCheckpoint = -1;
    private volatile int pendingTransactions;
    private volatile long lastCommitDurationMs = -1;

    private TwopcMetrics(MetricGroup operatorGroup, boolean writer, boolean committer) {
        MetricGroup group = operatorGroup.addGroup(GROUP);
        recordsWritten = counter(group, writer, "recordsWritten");
        bytesWritten = counter(group, writer, "bytesWritten");
        transactionsPrepared = counter(group, writer, "transactionsPrepared");
        transactionsAborted = counter(group, writer, "transactionsAborted");
        transactionsCommitted = counter(group, committer, "transactionsCommitted");
        // Commits found done already: a restored transaction committed before the restart, or
        // one whose earlier commit landed although it reported failure (lost response).
        commitsFoundAlreadyCommitted = counter(group, committer, "commitsFoundAlreadyCommitted");
        // Commits of transactions restored from a checkpoint (the restart's recovery).
        recoveredCommits = counter(group, committer, "recoveredCommits");
        lingeringAborted = counter(group, committer, "lingeringAborted");
        expired = counter(group, committer, "expired");
        housekeepingFailures = counter(group, committer, "housekeepingFailures");
        DescriptiveStatisticsHistogram latency = new DescriptiveStatisticsHistogram(500);
        commitLatencyMs = latency;
        DescriptiveStatisticsHistogram duration = new DescriptiveStatisticsHistogram(500);
        commitDurationMicros = duration;
        DescriptiveStatisticsHistogram visible = new DescriptiveStatisticsHistogram(500);
        commitVisibleMicros = visible;
        if (committer) {
            group.gauge("lastCommittedCheckpoint", (Gauge<Long>) () -> lastCommittedCheckpoint);
            group.gauge("pendingTransactions", (Gauge<Integer>) () -> pendingTransactions);
            group.gauge("lastCommitDurationMs", (Gauge<Long>) () -> lastCommitDurationMs);
            // Time from prepare (checkpoint barrier) until the output became visible.
            group.histogram("commitLatencyMs", latency);
            // twopc's own part of it: the native commit call, from its start until it returned
            // (the output became visible inside it), apart from Flink's notification path.
            group.histogram("commitDurationMicros", duration);
            // The part of that call until the output was visible (the call goes on to make the
            // commit durable and clean up); only where the destination tells (a directory).
            group.histogram("commitVisibleMicros", visible);
        }
    }

    private static Counter counter(MetricGroup group, boolean register, String name) {
        return register ? group.counter(name) : new SimpleCounter();
    }

    static TwopcMetrics forWriter(MetricGroup operatorGroup) {
        return new TwopcMetrics(operatorGroup, true, false);
    }

    static TwopcMetrics forCommitter(MetricGroup operatorGroup) {
        return new TwopcMetrics(operatorGroup, false, true);
    }

    /** The SinkFunction shim: writer and committer in one operator. */
    static TwopcMetrics forWriterAndCommitter(MetricGroup operatorGroup) {
        return new TwopcMetrics(operatorGroup, true, true);
    }

    void recordBatch(long records, long bytes) {
        recordsWritten.inc(records);
        bytesWritten.inc(bytes);
    }

    void recordPrepare() {
        transactionsPrepared.inc();
    }

    void setPendingTransactions(int pending) {
        pendingTransactions = pending;
    }

    /** A commit's time until its output was visible; negative (not known) is not recorded. */
    void recordCommitVisible(long visibleNanos) {
        if (visibleNanos >= 0) {
            commitVisibleMicros.update(visibleNanos / 1_000);
        }
    }

    void recordCommit(long durationNanos, long preparedAgeMs, int outcome, boolean recovery, long checkpoint) {
        lastCommitDurationMs = durationNanos / 1_000_000;
        commitDurationMicros.update(durationNanos / 1_000);
        if (preparedAgeMs >= 0) {
            commitLatencyMs.update(preparedAgeMs);
        }
        if (outcome == NativeBridge.COMMITTED) {
            transactionsCommitted.inc();
        } else if (outcome == NativeBridge.ALREADY_COMMITTED) {
            commitsFoundAlreadyCommitted.inc();
        }
        if (recovery) {
            recoveredCommits.inc();
        }
        lastCommittedCheckpoint = Math.max(lastCommittedCheckpoint, checkpoint);
    }

    void recordAbort(boolean removedData) {
        if (removedData) {
            transactionsAborted.inc();
        }
    }

    /** Takes {lingering aborted, expired, failures} from {@code NativeBridge.checkpointCompleted}. */
    void recordHousekeeping(long[] report) {
        lingeringAborted.inc(report[0]);
        expired.inc(report[1]);
        housekeepingFailures.inc(report[2]);
    }

    void recordLingeringAborted(long count) {
        lingeringAborted.inc(count);
    }

    /** The last housekeeping at the end of input failed (reported, not thrown: see TwopcCommitter.close). */
    void recordHousekeepingFailure() {
        housekeepingFailures.inc();
    }
}
