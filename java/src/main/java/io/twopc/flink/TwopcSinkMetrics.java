package io.twopc.flink;

import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.Gauge;
import org.apache.flink.metrics.Histogram;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.runtime.metrics.DescriptiveStatisticsHistogram;

/**
 * The sink's metrics, in a {@code twopc} group under the operator's metric group.
 *
 * <p>The counters the core keeps ({@code NativeBridge.stats}) are copied into a volatile snapshot
 * by the task thread after each native call that changes them; gauges read that snapshot. Metric
 * reporters run on their own threads, and reading the native sink from there could race with
 * {@code close()} and hit a released id.
 */
final class TwopcSinkMetrics {
    static final String GROUP = "twopc";

    // Positions in the array NativeBridge.stats returns.
    private static final int RECORDS_WRITTEN = 0;
    private static final int BYTES_WRITTEN = 1;
    private static final int TRANSACTIONS_COMMITTED = 2;
    private static final int TRANSACTIONS_ABORTED = 3;
    private static final int LAST_COMMITTED_CHECKPOINT = 4;
    private static final int RECORDS_IN_OPEN_TRANSACTION = 5;
    private static final int STATS_LENGTH = 6;

    private volatile long[] stats = initialStats();
    private volatile int pendingTransactions;
    private volatile long lastCommitDurationMs = -1;
    private final Counter commitsFoundAlreadyCommitted;
    private final Counter recoveredCommits;
    private final Histogram commitLatencyMs;

    TwopcSinkMetrics(MetricGroup operatorGroup) {
        MetricGroup group = operatorGroup.addGroup(GROUP);
        group.gauge("recordsWritten", (Gauge<Long>) () -> stats[RECORDS_WRITTEN]);
        group.gauge("bytesWritten", (Gauge<Long>) () -> stats[BYTES_WRITTEN]);
        group.gauge("transactionsCommitted", (Gauge<Long>) () -> stats[TRANSACTIONS_COMMITTED]);
        group.gauge("transactionsAborted", (Gauge<Long>) () -> stats[TRANSACTIONS_ABORTED]);
        group.gauge("lastCommittedCheckpoint", (Gauge<Long>) () -> stats[LAST_COMMITTED_CHECKPOINT]);
        group.gauge("recordsInOpenTransaction", (Gauge<Long>) () -> stats[RECORDS_IN_OPEN_TRANSACTION]);
        group.gauge("pendingTransactions", (Gauge<Integer>) () -> pendingTransactions);
        group.gauge("lastCommitDurationMs", (Gauge<Long>) () -> lastCommitDurationMs);
        // Commits found done already: a restored transaction committed before the restart, or
        // one whose earlier commit landed although it reported failure (lost response).
        commitsFoundAlreadyCommitted = group.counter("commitsFoundAlreadyCommitted");
        recoveredCommits = group.counter("recoveredCommits");
        // Time from prepare (checkpoint barrier) until the output became visible.
        commitLatencyMs = group.histogram("commitLatencyMs", new DescriptiveStatisticsHistogram(500));
    }

    private static long[] initialStats() {
        long[] s = new long[STATS_LENGTH];
        s[LAST_COMMITTED_CHECKPOINT] = -1;
        return s;
    }

    /** Takes the counters returned by {@code NativeBridge.stats}. */
    void updateStats(long[] nativeStats) {
        if (nativeStats != null && nativeStats.length >= STATS_LENGTH) {
            stats = nativeStats.clone();
        }
    }

    long lastCommittedCheckpoint() {
        return stats[LAST_COMMITTED_CHECKPOINT];
    }

    void setPendingTransactions(int pending) {
        pendingTransactions = pending;
    }

    void recordCommit(long durationMs, long preparedAgeMs, boolean alreadyCommitted, boolean recovery) {
        lastCommitDurationMs = durationMs;
        if (preparedAgeMs >= 0) {
            commitLatencyMs.update(preparedAgeMs);
        }
        if (alreadyCommitted) {
            commitsFoundAlreadyCommitted.inc();
        }
        if (recovery) {
            recoveredCommits.inc();
        }
    }
}
