package io.twopc.flink;

import io.twopc.flink.internal.Json;

import org.apache.flink.annotation.Internal;

import java.io.Serializable;
import java.time.Duration;

/**
 * The validated, immutable settings of one sink, produced by a builder's {@code build()}. Shipped
 * to the task managers with the sink, so it is plain serializable data; durations are in
 * milliseconds. {@link #toConfigJson()} writes the one configuration the native side reads.
 */
@Internal
public final class TwopcSinkOptions implements Serializable {
    private static final long serialVersionUID = 1L;

    final String sinkId;
    /**
     * Drawn when the sink was built, the same in all its subtasks and attempts: tells two sinks
     * with one sink id in one job apart (see the ownership rules).
     */
    final long instance;
    /** The destination: exactly one of these three is set. */
    final String outputDirectory;
    final PostgresDestination postgres;
    final ObjectStoreDestination objectStore;
    final String partPrefix;
    final String partSuffix;
    final RecordFormat recordFormat;
    final IoMode ioMode;
    final CommitOrder commitOrder;
    final int batchSize;
    final int batchBytes;
    final long retentionMs;
    final long restartAllowanceMs;
    /** 0 when not configured: the sink then relies on the interval it detects. */
    final long checkpointIntervalMs;
    final RewindPolicy rewindPolicy;
    final FreshStartPolicy freshStartPolicy;
    final int commitMaxAttempts;
    final long commitInitialBackoffMs;
    final long commitMaxBackoffMs;
    final long ownerWaitMs;
    final long lineageWaitMs;
    final double timeoutWarningRatio;

    /**
     * The byte the writer puts after each record in a batch ({@code '\n'} for LINES output, none
     * for RAW): batches then cross in the form the output holds, so that the file and object-store
     * destinations append them with one copy. A destination that takes records one by one (a
     * table's rows) is given them without it.
     */
    int recordTerminator() {
        return recordFormat == RecordFormat.LINES ? '\n' : io.twopc.flink.internal.RecordBatcher.NO_TERMINATOR;
    }

    TwopcSinkOptions(TwopcSinkBuilderBase<?, ?> b, String directory, ObjectStoreDestination store,
            long instance) {
        this.sinkId = b.sinkId;
        this.instance = instance;
        this.outputDirectory = directory;
        this.postgres = b.postgres;
        this.objectStore = store;
        this.partPrefix = b.partPrefix;
        this.partSuffix = b.partSuffix;
        this.recordFormat = b.recordFormat;
        this.ioMode = b.ioMode;
        this.commitOrder = b.commitOrder;
        this.batchSize = b.batchSize;
        this.batchBytes = b.batchBytes;
        this.retentionMs = millis(b.retention);
        this.restartAllowanceMs = millis(b.restartAllowance);
        this.checkpointIntervalMs = b.checkpointInterval == null ? 0 : millis(b.checkpointInterval);
        this.rewindPolicy = b.rewindPolicy;
        this.freshStartPolicy = b.freshStartPolicy;
        this.commitMaxAttempts = b.commitMaxAttempts;
        this.commitInitialBackoffMs = millis(b.commitInitialBackoff);
        this.commitMaxBackoffMs = millis(b.commitMaxBackoff);
        this.ownerWaitMs = millis(b.ownerWait);
        this.lineageWaitMs = millis(b.lineageWait);
        this.timeoutWarningRatio = b.timeoutWarningRatio;
    }

    private static long millis(Duration d) {
        try {
            return d.toMillis();
        } catch (ArithmeticException e) {
            return Long.MAX_VALUE;
        }
    }

    public String sinkId() {
        return sinkId;
    }

    /**
     * The instance id of one operator of this sink: the id drawn at build time mixed with the
     * operator's id, so that one sink object added to a job twice still makes two owners the
     * destination tells apart (and refuses, since they share a sink id).
     */
    public long instanceFor(String operatorId) {
        long h = instance;
        if (operatorId != null) {
            for (int i = 0; i < operatorId.length(); i++) {
                h = (h ^ operatorId.charAt(i)) * 0x100000001b3L;
            }
        }
        return h;
    }

    /** The output directory, or null when the sink writes to PostgreSQL or an object store. */
    public String outputDirectory() {
        return outputDirectory;
    }

    /** The object store, or null when the sink writes to a directory or PostgreSQL. */
    public ObjectStoreDestination objectStore() {
        return objectStore;
    }

    public int batchSize() {
        return batchSize;
    }

    public int batchBytes() {
        return batchBytes;
    }

    public long retentionMs() {
        return retentionMs;
    }

    public long checkpointIntervalMs() {
        return checkpointIntervalMs;
    }

    public double timeoutWarningRatio() {
        return timeoutWarningRatio;
    }

    /** Where task managers read the PostgreSQL password; null for a directory or no password. */
    public String resolvePassword() {
        return postgres == null ? null : postgres.resolvePassword();
    }

    /**
     * The configuration the native side decodes and validates (crate {@code twopc-jni}, module
     * {@code config}): versioned JSON with the sink's settings and a tagged destination section.
     * It never holds a password, only where each task manager reads one.
     */
    public String toConfigJson() {
        return toConfigJson(instance);
    }

    /**
     * The configuration with another instance id: the sink's own, mixed with what tells its
     * operators apart (see {@link #instanceFor(String)}).
     */
    public String toConfigJson(long instance) {
        Json sink = Json.object()
                .put("sinkId", sinkId)
                .put("instance", String.format("%016x", instance))
                .put("retentionMs", retentionMs)
                .put("restartAllowanceMs", restartAllowanceMs)
                .put("checkpointIntervalMs", checkpointIntervalMs)
                .put("rewindPolicy", rewindPolicy.name())
                .put("freshStartPolicy", freshStartPolicy.name())
                .put("commitMaxAttempts", commitMaxAttempts)
                .put("commitInitialBackoffMs", commitInitialBackoffMs)
                .put("commitMaxBackoffMs", commitMaxBackoffMs)
                .put("ownerWaitMs", ownerWaitMs)
                .put("lineageWaitMs", lineageWaitMs);
        Json destination;
        if (objectStore != null) {
            ObjectStoreDestination o = objectStore;
            destination = Json.object()
                    .put("type", "s3")
                    .put("url", o.url())
                    .put("endpoint", o.endpoint())
                    .put("region", o.region())
                    .put("pathStyle", o.pathStyle())
                    .put("allowHttp", o.httpAllowed())
                    .put("profile", o.profileName())
                    .put("partPrefix", partPrefix)
                    .put("partSuffix", partSuffix)
                    .put("recordFormat", recordFormat.name())
                    .put("partSizeBytes", o.partSizeBytes())
                    .put("savepointRetentionMs", o.savepointRetentionMs());
        } else if (postgres == null) {
            destination = Json.object()
                    .put("type", "filesystem")
                    .put("path", outputDirectory)
                    .put("partPrefix", partPrefix)
                    .put("partSuffix", partSuffix)
                    .put("recordFormat", recordFormat.name())
                    .put("ioMode", ioMode.name())
                    .put("commitOrder", commitOrder.name());
        } else {
            PostgresDestination p = postgres;
            destination = Json.object().put("type", "postgres");
            if (p.url() != null) {
                destination.put("url", p.url());
            } else {
                destination.put("host", p.host())
                        .put("port", p.port())
                        .put("database", p.database())
                        .put("user", p.user());
            }
            destination.put("passwordSource", p.passwordSource())
                    .put("table", p.table())
                    .put("columns", p.columnNames())
                    .put("mode", p.mode().name())
                    .put("keyColumns", p.keyColumnNames());
            if (p.operationField()) {
                // Written only when set, so that configurations without it stay as they were.
                destination.put("operationField", true);
            }
            if (!p.declaredColumnTypes().isEmpty()) {
                destination.put("columnTypes", p.declaredColumnTypes());
            }
            destination
                    .put("copyFormat", p.copyFormat().name())
                    .put("transactionIdColumn", p.transactionIdColumn())
                    .put("controlSchema", p.controlSchema())
                    .put("connectTimeoutMs", p.connectTimeoutMs());
        }
        return Json.object()
                .put("version", 1)
                .put("sink", sink)
                .put("destination", destination)
                .end();
    }

    @Override
    public String toString() {
        // PostgresDestination.toString() never shows a password.
        String destination = postgres != null ? postgres.toString()
                : objectStore != null ? objectStore + " (parts " + partPrefix + "-*" + partSuffix + ", "
                        + recordFormat + ")"
                : outputDirectory + " (parts " + partPrefix + "-*" + partSuffix + ", " + recordFormat
                        + ", I/O " + ioMode + ", commit " + commitOrder + ")";
        return "sink '" + sinkId + "' -> " + destination
                + " (batches of " + batchSize + " records / " + batchBytes + " bytes"
                + ", retention " + Durations.format(retentionMs)
                + ", restart allowance " + Durations.format(restartAllowanceMs)
                + (checkpointIntervalMs > 0 ? ", checkpoint interval " + Durations.format(checkpointIntervalMs) : "")
                + ", rewind " + rewindPolicy + ", fresh start " + freshStartPolicy
                + ", commit attempts " + commitMaxAttempts
                + " (backoff " + Durations.format(commitInitialBackoffMs) + ".."
                + Durations.format(commitMaxBackoffMs) + "))";
    }
}
