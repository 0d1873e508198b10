package io.twopc.flink;

import java.io.Serializable;

/**
 * The validated, immutable settings of one {@link TwopcSink}, produced by {@link
 * TwopcSinkBuilder#build()}. Shipped to the task managers with the sink, so it is plain
 * serializable data; durations are in milliseconds.
 */
final class TwopcSinkOptions implements Serializable {
    private static final long serialVersionUID = 1L;

    final String sinkId;
    /** The destination: exactly one of these two is set. */
    final String outputDirectory;
    final PostgresDestination postgres;
    final String partPrefix;
    final String partSuffix;
    final RecordFormat recordFormat;
    final int batchSize;
    final int batchBytes;
    final long retentionMs;
    final long restartAllowanceMs;
    /** 0 when not configured: the sink then relies on the interval it detects at runtime. */
    final long checkpointIntervalMs;
    final RewindPolicy rewindPolicy;
    final FreshStartPolicy freshStartPolicy;
    final int commitMaxAttempts;
    final long commitInitialBackoffMs;
    final long commitMaxBackoffMs;
    final double timeoutWarningRatio;

    TwopcSinkOptions(
            String sinkId,
            String outputDirectory,
            PostgresDestination postgres,
            String partPrefix,
            String partSuffix,
            RecordFormat recordFormat,
            int batchSize,
            int batchBytes,
            long retentionMs,
            long restartAllowanceMs,
            long checkpointIntervalMs,
            RewindPolicy rewindPolicy,
            FreshStartPolicy freshStartPolicy,
            int commitMaxAttempts,
            long commitInitialBackoffMs,
            long commitMaxBackoffMs,
            double timeoutWarningRatio) {
        this.sinkId = sinkId;
        this.outputDirectory = outputDirectory;
        this.postgres = postgres;
        this.partPrefix = partPrefix;
        this.partSuffix = partSuffix;
        this.recordFormat = recordFormat;
        this.batchSize = batchSize;
        this.batchBytes = batchBytes;
        this.retentionMs = retentionMs;
        this.restartAllowanceMs = restartAllowanceMs;
        this.checkpointIntervalMs = checkpointIntervalMs;
        this.rewindPolicy = rewindPolicy;
        this.freshStartPolicy = freshStartPolicy;
        this.commitMaxAttempts = commitMaxAttempts;
        this.commitInitialBackoffMs = commitInitialBackoffMs;
        this.commitMaxBackoffMs = commitMaxBackoffMs;
        this.timeoutWarningRatio = timeoutWarningRatio;
    }

    @Override
    public String toString() {
        // PostgresDestination.toString() never shows a password.
        String destination = postgres != null ? postgres.toString()
                : outputDirectory + " (parts " + partPrefix + "-*" + partSuffix + ", " + recordFormat + ")";
        return "sink '" + sinkId + "' -> " + destination
                + " (batches of " + batchSize + " records / " + batchBytes + " bytes"
                + ", retention " + retentionMs + " ms"
                + ", restart allowance " + restartAllowanceMs + " ms"
                + (checkpointIntervalMs > 0 ? ", checkpoint interval " + checkpointIntervalMs + " ms" : "")
                + ", rewind " + rewindPolicy + ", fresh start " + freshStartPolicy
                + ", commit attempts " + commitMaxAttempts
                + " (backoff " + commitInitialBackoffMs + ".." + commitMaxBackoffMs + " ms))";
    }
}
