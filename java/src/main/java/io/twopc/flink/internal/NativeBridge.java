package io.twopc.flink.internal;

import java.nio.ByteBuffer;

/**
 * The JNI surface of the Rust core (crate {@code twopc-jni}). Only this class
 * declares native methods; {@link NativeLoader} loads the library for the
 * classloader that loaded this class.
 *
 * <p>Native sinks are reached through opaque ids, never pointers: the Rust
 * side keeps a registry and validates the id on every call, so a closed,
 * stale or forged id gets an {@link IllegalStateException}. Calls on one sink
 * are serialised on the Rust side.
 *
 * <p>Transaction handles cross as the core's encoded bytes (the versioned
 * envelope). Records cross in batches: {@code [u32 little-endian length][bytes]}
 * repeated, in a direct buffer, from position 0 to {@code length}.
 *
 * <p>Errors become exceptions of {@code io.twopc.flink}: {@code
 * TwopcLostTransactionException}, {@code TwopcUnresolvedCommitException},
 * {@code TwopcRewindException}, {@code TwopcFreshStartException}, {@code
 * TwopcStateException}, {@code TwopcConfigException}, {@code
 * TwopcRecordRejectedException} (all fatal) and {@code
 * TwopcException} (retryable: the job restarts); protocol misuse and unknown
 * ids give {@link IllegalStateException}, a malformed batch {@link
 * IllegalArgumentException}. A Rust panic becomes a {@code TwopcException}.
 */
public final class NativeBridge {
    /** Outcomes of {@link #commit}. */
    public static final int COMMITTED = 0;
    public static final int ALREADY_COMMITTED = 1;
    public static final int EMPTY = 2;
    /** Outcomes of {@link #abort}. */
    public static final int ABORTED = 0;
    public static final int NOTHING_STAGED = 1;

    static {
        NativeLoader.load(NativeBridge.class);
    }

    private NativeBridge() {}

    /** Ensures the library is loaded (runs the static initialiser). */
    public static void ensureLoaded() {}

    /**
     * Starts one subtask's sink on the filesystem destination: runs recovery
     * (rewind check, fresh-start check; lingering transactions are aborted
     * after the first checkpoint of this attempt completes) and the retention
     * check. {@code restoredCheckpointId < 0} means no restored state;
     * {@code knownHandles} are the handles of this subtask's share of the
     * restored state (at least one after any restore, so the core learns the
     * restored lineage). Returns the sink id.
     */
    public static native long open(
            String sinkId,
            String runId,
            int subtask,
            int parallelism,
            String outputDir,
            String partPrefix,
            String partSuffix,
            boolean rawFormat,
            long retentionMs,
            long checkpointIntervalMs,
            long restartAllowanceMs,
            boolean rewindReplaceRange,
            boolean freshStartAbortPrepared,
            int commitMaxAttempts,
            long commitInitialBackoffMs,
            long commitMaxBackoffMs,
            long restoredCheckpointId,
            byte[][] knownHandles);

    /** {@code mode} of {@link #openPostgres}: one prepared transaction per subtask and checkpoint. */
    public static final String PG_TRANSACTIONAL = "transactional";
    /** {@code mode} of {@link #openPostgres}: upserts on the key columns, committed batch by batch. */
    public static final String PG_IDEMPOTENT = "idempotent";
    /** {@code copyFormat} of {@link #openPostgres}: PostgreSQL's COPY text format (tab-separated, {@code \N} = NULL). */
    public static final String COPY_TEXT = "text";
    /** {@code copyFormat} of {@link #openPostgres}: CSV (comma, double quotes, unquoted empty field = NULL). */
    public static final String COPY_CSV = "csv";

    /**
     * Starts one subtask's sink on PostgreSQL (crate {@code twopc-pg}): checks
     * the server and the target table, creates the sink's control tables in
     * {@code controlSchema} when absent, then runs recovery exactly as {@link
     * #open} does. The recovery and restore parameters mean what they mean
     * there. Each record is one COPY row of {@code columns}, in {@code
     * copyFormat}.
     *
     * <p>The server is named either by {@code url} (a libpq URL such as {@code
     * postgres://user@host:5432/db}, or {@code host=... dbname=...}; then
     * {@code host}, {@code database} and {@code user} are null) or by {@code
     * host}, {@code port}, {@code database} and {@code user} (then {@code url}
     * is null). {@code password} (may be null) overrides one in the URL; it
     * never appears in an exception message or a log line.
     *
     * <p>{@code mode} is {@link #PG_TRANSACTIONAL} ({@code keyColumns} empty) or
     * {@link #PG_IDEMPOTENT} ({@code keyColumns}: a primary key or unique index
     * of the table, all in {@code columns}). {@code transactionIdColumn} (may be
     * null; transactional mode only) is a text column the sink fills with each
     * row's transaction id, which rewinds with {@code REPLACE_RANGE} need.
     *
     * <p>Settings that cannot work give {@code TwopcConfigException} (fatal),
     * including a refused login; an unreachable server gives {@code
     * TwopcException} (retryable). Returns the sink id.
     */
    public static native long openPostgres(
            String sinkId,
            String runId,
            int subtask,
            int parallelism,
            String url,
            String host,
            int port,
            String database,
            String user,
            String password,
            String table,
            String[] columns,
            String mode,
            String[] keyColumns,
            String copyFormat,
            String transactionIdColumn,
            String controlSchema,
            long connectTimeoutMs,
            long retentionMs,
            long checkpointIntervalMs,
            long restartAllowanceMs,
            boolean rewindReplaceRange,
            boolean freshStartAbortPrepared,
            int commitMaxAttempts,
            long commitInitialBackoffMs,
            long commitMaxBackoffMs,
            long restoredCheckpointId,
            byte[][] knownHandles);

    /** Begins a transaction; returns its (open) handle. */
    public static native byte[] begin(long sink);

    /**
     * Stages {@code length} bytes of length-prefixed records from {@code batch}
     * (a direct buffer) into the open transaction; returns the records staged
     * in it so far.
     *
     * <p>The buffer is read in place, not copied: it must not be changed or
     * freed by another thread until the call returns. A heap buffer, a
     * negative {@code length} or one beyond the capacity, and a malformed
     * batch give {@link IllegalArgumentException}; nothing of the batch is
     * staged then.
     */
    public static native long write(long sink, byte[] openHandle, ByteBuffer batch, int length);

    /** Prepares the open transaction for a checkpoint; returns the prepared handle. */
    public static native byte[] prepare(long sink, byte[] openHandle, long checkpointId);

    /** Commits a prepared transaction; {@link #COMMITTED}, {@link #ALREADY_COMMITTED} or {@link #EMPTY}. */
    public static native int commit(long sink, byte[] preparedHandle);

    /** Aborts an open transaction; {@link #ABORTED} or {@link #NOTHING_STAGED}. */
    public static native int abort(long sink, byte[] handle);

    /**
     * Counters: records written, bytes written, transactions committed,
     * transactions aborted, last committed checkpoint (-1 if none), records in
     * the open transaction.
     */
    public static native long[] stats(long sink);

    /** Releases a sink. Unknown or already closed ids throw IllegalStateException. */
    public static native void close(long sink);

    /** Decodes a handle into a JSON object of its fields (for tests and tools). */
    public static native String describeHandle(byte[] handle);

    /** Milliseconds since the handle was prepared, or -1 if it is open (for timeout warnings). */
    public static native long preparedAgeMs(byte[] handle, long nowMs);

    /**
     * Configures test-only fail points ({@code name=actions;name=actions}, the
     * fail crate's syntax). Throws IllegalStateException when the library was
     * built without the {@code failpoints} feature.
     */
    public static native void configureFailPoints(String spec);
}
