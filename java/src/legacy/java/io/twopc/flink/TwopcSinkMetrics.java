package io.twopc.flink;

import io.twopc.flink.internal.NativeBridge;

import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.Gauge;
import org.apache.flink.metrics.Histogram;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.runtime.metrics.DescriptiveStatisticsHistogram;

/**
 * The SinkFunction shim's metrics, in a {@code twopc} group under the operator's metric group.
 * Counters are updated by the task thread as it goes (once per batch, commit or abort), never
 * polled from the native side: metric reporters run on threads of their own.
 */
final class TwopcSinkMetrics {
    static final String GROUP = "twopc";

    private final Counter recordsWritten;
    private final Counter bytesWritten;
    private final Counter transactionsCommitted;
    private final Counter transactionsAborted;
    private final Counter commitsFoundAlreadyCommitted;
    private final Counter recoveredCommits;
    private final Counter lingeringAborted;
    private final Counter expired;
    private final Counter housekeepingFailures;
    private final Histogram commitLatencyMs;
    private volatile long lastCommittedCheckpoint = -1;
    private volatile int pendingTransactions;
    private volatile long lastCommitDurationMs = -1;

    TwopcSinkMetrics(MetricGroup operatorGroup) {
        MetricGroup group = operatorGroup.addGroup(GROUP);
        recordsWritten = group.counter("recordsWritten");
        bytesWritten = group.counter("bytesWritten");
        transactionsCommitted = group.counter("transactionsCommitted");
        transactionsAborted = group.counter("transactionsAborted");
        // Commits found done already: a restored transaction committed before the restart, or
        // one whose earlier commit landed although it reported failure (lost response).
        commitsFoundAlreadyCommitted = group.counter("commitsFoundAlreadyCommitted");
        recoveredCommits = group.counter("recoveredCommits");
        lingeringAborted = group.counter("lingeringAborted");
        expired = group.counter("expired");
        housekeepingFailures = group.counter("housekeepingFailures");
        group.gauge("lastCommittedCheckpoint", (Gauge<Long>) () -> lastCommittedCheckpoint);
        group.gauge("pendingTransactions", (Gauge<Integer>) () -> pendingTransactions);
        group.gauge("lastCommitDurationMs", (Gauge<Long>) () -> lastCommitDurationMs);
        // Time from prepare (checkpoint barrier) until the output became visible.
        commitLatencyMs = group.histogram("commitLatencyMs", new DescriptiveStatisticsHistogram(500));
    }

    void recordBatch(long records, long bytes) {
        recordsWritten.inc(records);
        bytesWritten.inc(bytes);
    }

    void setPendingTransactions(int pending) {
        pendingTransactions = pending;
    }

    void recordCommit(long durationMs, long preparedAgeMs, int outcome, boolean recovery, long checkpoint) {
        lastCommitDurationMs = durationMs;
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
}
