package io.twopc.flink;

import io.twopc.flink.internal.LineBreaks;
import io.twopc.flink.internal.NativeBridge;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RuntimeContext;
import org.apache.flink.api.common.serialization.RuntimeContextInitializationContextAdapters;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.typeutils.base.VoidSerializer;
import org.apache.flink.api.common.typeutils.base.array.BytePrimitiveArraySerializer;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.runtime.execution.SuppressRestartsException;
import org.apache.flink.runtime.state.FunctionInitializationContext;
import org.apache.flink.runtime.state.FunctionSnapshotContext;
import org.apache.flink.streaming.api.functions.sink.TwoPhaseCommitSinkFunction;
import org.apache.flink.streaming.api.operators.StreamingRuntimeContext;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * An exactly-once sink for Flink 1.20: Flink's {@code TwoPhaseCommitSinkFunction} driving the
 * twopc core (Rust, over JNI) on a directory or on a PostgreSQL table ({@link
 * PostgresDestination}).
 *
 * <p>Per checkpoint, each subtask stages its records into one transaction; at the checkpoint
 * barrier the transaction is prepared (durable, invisible) and its prepared handle goes into
 * Flink's state; when the checkpoint completes it is committed (an atomic rename into the output
 * directory, or {@code COMMIT PREPARED}). After a failure Flink restores the handles: prepared
 * ones of the completed checkpoint are committed again (a repeat is recognised, never
 * duplicated), the open one is aborted, and the core aborts whatever no checkpoint knows.
 *
 * <p>Errors the core calls fatal (a lost transaction, a rewind, unreadable state, impossible
 * configuration, a record the destination can never accept) stop the job without a restart loop: they are rethrown inside Flink's {@link
 * SuppressRestartsException}, with the core's message (which names the transaction and the
 * recovery plan) on the cause. Other errors fail the task and Flink restarts from the last
 * completed checkpoint.
 *
 * <p>Build one with {@link #builder()}; give the sink operator a stable {@code uid} so that its
 * state is found again after a savepoint.
 *
 * <p>Every subtask also snapshots its transaction handles into a split list state of its own,
 * with enough copies of its open handle that after a restore at any parallelism (up to the maximum
 * parallelism) every subtask receives at least one, and so learns the lineage of the restored
 * state. No union list state is used: Flink refuses to checkpoint a vertex with union list state
 * once some of its subtasks have finished, which would stall bounded jobs. The core does not need
 * every subtask's handles: it aborts lingering transactions only after the first checkpoint of the
 * new attempt completes, when every subtask has finished its recovery.
 *
 * @param <IN> the type of records written
 */
@SuppressWarnings("deprecation") // TwoPhaseCommitSinkFunction is deprecated in 1.20, and the only 2PC sink API there
public class TwopcSink<IN> extends TwoPhaseCommitSinkFunction<IN, TwopcTransaction, Void> {
    private static final long serialVersionUID = 1L;
    private static final Logger LOG = LoggerFactory.getLogger(TwopcSink.class);

    /**
     * Split list state: this subtask's pending and open handles, plus copies of the open handle so
     * that every subtask of a rescaled restore receives at least one (see the class comment). The
     * core reads the restored lineage from them.
     */
    static final String KNOWN_TRANSACTIONS_STATE = "twopc-restored-transactions";

    private static final Pattern TRANSACTION_FIELD = Pattern.compile("\"transaction\"\\s*:\\s*\"([^\"]+)\"");
    private static final int LENGTH_PREFIX_BYTES = 4;

    private final TwopcSinkOptions options;
    private final SerializationSchema<IN> serializationSchema;

    /** Id of the native sink; 0 while none is open. */
    private transient long nativeSink;
    /** Checkpoint being snapshotted, for preCommit (which Flink does not tell); -1 outside. */
    private transient long snapshottingCheckpointId = -1;
    private transient ListState<byte[]> knownTransactionsState;
    /** Records of the current transaction not yet handed to the core: {@code [u32 LE length][bytes]}*. */
    private transient ByteBuffer batch;
    private transient int batchRecords;
    private transient TwopcSinkMetrics metrics;
    /** "twopc sink 'id' subtask i/n", for log lines. */
    private transient String scope;

    TwopcSink(TwopcSinkOptions options, SerializationSchema<IN> serializationSchema) {
        super(TwopcTransactionSerializer.INSTANCE, VoidSerializer.INSTANCE);
        this.options = options;
        this.serializationSchema = serializationSchema;
        // Flink's own warnings measure from a transaction's begin; ours (preparedAgeMs) from its
        // prepare. Both against the retention, the destination's transaction timeout. Failures
        // after the timeout are never ignored: the core decides, and stops the job on loss.
        setTransactionTimeout(options.retentionMs);
        enableTransactionTimeoutWarnings(options.timeoutWarningRatio);
    }

    /** Starts a builder; see {@link TwopcSinkBuilder}. */
    public static <IN> TwopcSinkBuilder<IN> builder() {
        return new TwopcSinkBuilder<>();
    }

    /** Starts a builder writing to {@code directory}; see {@link TwopcSinkBuilder#forDirectory(String)}. */
    public static <IN> TwopcSinkBuilder<IN> forDirectory(String directory) {
        return new TwopcSinkBuilder<IN>().forDirectory(directory);
    }

    /**
     * Starts a builder writing to a PostgreSQL table; see {@link
     * TwopcSinkBuilder#forPostgres(PostgresDestination)}.
     */
    public static <IN> TwopcSinkBuilder<IN> forPostgres(PostgresDestination destination) {
        return new TwopcSinkBuilder<IN>().forPostgres(destination);
    }

    public String getSinkId() {
        return options.sinkId;
    }

    /** The output directory, or null when the sink writes to PostgreSQL. */
    public String getOutputDirectory() {
        return options.outputDirectory;
    }

    // ------------------------------------------------------------------ lifecycle

    @Override
    public void initializeState(FunctionInitializationContext context) throws Exception {
        RuntimeContext runtime = getRuntimeContext();
        int subtask = runtime.getTaskInfo().getIndexOfThisSubtask();
        int parallelism = runtime.getTaskInfo().getNumberOfParallelSubtasks();
        String runId = runtime.getJobInfo().getJobId().toHexString();
        scope = "twopc sink '" + options.sinkId + "' subtask " + subtask + "/" + parallelism;
        metrics = new TwopcSinkMetrics(runtime.getMetricGroup());

        knownTransactionsState = context.getOperatorStateStore().getListState(
                new ListStateDescriptor<>(KNOWN_TRANSACTIONS_STATE, BytePrimitiveArraySerializer.INSTANCE));
        List<byte[]> knownHandles = new ArrayList<>();
        if (context.isRestored()) {
            for (byte[] handle : knownTransactionsState.get()) {
                knownHandles.add(handle);
            }
        }
        long restoredCheckpointId = context.getRestoredCheckpointId().orElse(-1L);
        long checkpointIntervalMs = resolveCheckpointIntervalMs();
        // Transient fields skip their initialisers when Flink deserializes the function.
        snapshottingCheckpointId = -1;

        LOG.info("{}: opening ({}; run {}, restored checkpoint {}, {} known transactions, "
                        + "checkpoint interval {} ms)",
                scope, options, runId, restoredCheckpointId < 0 ? "none" : restoredCheckpointId,
                knownHandles.size(), checkpointIntervalMs);
        try {
            nativeSink = openNativeSink(runId, subtask, parallelism, checkpointIntervalMs, restoredCheckpointId,
                    knownHandles.toArray(new byte[0][]));
        } catch (TwopcException e) {
            throw escalate(e, "opening the sink");
        }
        refreshStats();

        // Recovery proper: Flink commits each restored pending transaction (recoverAndCommit),
        // aborts the restored open one (recoverAndAbort), then begins the first transaction.
        super.initializeState(context);
        metrics.setPendingTransactions(0);
    }

    /**
     * Opens the native sink on the configured destination. Both take the same recovery settings;
     * only the destination's own settings differ.
     */
    private long openNativeSink(String runId, int subtask, int parallelism, long checkpointIntervalMs,
            long restoredCheckpointId, byte[][] knownHandles) {
        boolean replaceRange = options.rewindPolicy == RewindPolicy.REPLACE_RANGE;
        boolean abortPrepared = options.freshStartPolicy == FreshStartPolicy.ABORT_PREPARED;
        PostgresDestination pg = options.postgres;
        if (pg == null) {
            return NativeBridge.open(
                    options.sinkId, runId, subtask, parallelism,
                    options.outputDirectory,
                    options.partPrefix,
                    options.partSuffix,
                    options.recordFormat == RecordFormat.RAW,
                    options.retentionMs, checkpointIntervalMs, options.restartAllowanceMs,
                    replaceRange, abortPrepared,
                    options.commitMaxAttempts, options.commitInitialBackoffMs, options.commitMaxBackoffMs,
                    restoredCheckpointId, knownHandles);
        }
        return NativeBridge.openPostgres(
                options.sinkId, runId, subtask, parallelism,
                pg.url(), pg.host(), pg.port(), pg.database(), pg.user(),
                // Read here, on the task manager, and handed straight to the native side, which
                // keeps it out of every message and log line.
                pg.resolvePassword(),
                pg.table(),
                pg.columnNames().toArray(new String[0]),
                pg.mode() == PostgresMode.IDEMPOTENT ? NativeBridge.PG_IDEMPOTENT : NativeBridge.PG_TRANSACTIONAL,
                pg.keyColumnNames().toArray(new String[0]),
                pg.copyFormat() == PostgresCopyFormat.CSV ? NativeBridge.COPY_CSV : NativeBridge.COPY_TEXT,
                pg.transactionIdColumn(),
                pg.controlSchema(),
                pg.connectTimeoutMs(),
                options.retentionMs, checkpointIntervalMs, options.restartAllowanceMs,
                replaceRange, abortPrepared,
                options.commitMaxAttempts, options.commitInitialBackoffMs, options.commitMaxBackoffMs,
                restoredCheckpointId, knownHandles);
    }

    @Override
    public void open(OpenContext openContext) throws Exception {
        serializationSchema.open(RuntimeContextInitializationContextAdapters.serializationAdapter(
                getRuntimeContext(), group -> group.addGroup("user")));
        batch = ByteBuffer.allocateDirect(options.batchBytes).order(ByteOrder.LITTLE_ENDIAN);
        batchRecords = 0;
    }

    @Override
    public void snapshotState(FunctionSnapshotContext context) throws Exception {
        snapshottingCheckpointId = context.getCheckpointId();
        try {
            warnAboutAgingPendingTransactions();
            // preCommit(current) -> prepared for this checkpoint; a new transaction begins.
            super.snapshotState(context);
        } finally {
            snapshottingCheckpointId = -1;
        }
        List<byte[]> known = new ArrayList<>();
        pendingTransactions().forEach(entry -> known.add(entry.getValue().handle()));
        TwopcTransaction current = currentTransaction();
        if (current != null) {
            // Flink splits list state into contiguous, near-equal shares of all elements, so
            // ceil(maxParallelism / parallelism) copies per subtask give every subtask of any
            // later parallelism at least one handle.
            RuntimeContext runtime = getRuntimeContext();
            int parallelism = runtime.getTaskInfo().getNumberOfParallelSubtasks();
            int maxParallelism = runtime.getTaskInfo().getMaxNumberOfParallelSubtasks();
            int copies = Math.max(1, (maxParallelism + parallelism - 1) / parallelism);
            for (int i = 0; i < copies; i++) {
                known.add(current.handle());
            }
        }
        knownTransactionsState.update(known);
        metrics.setPendingTransactions((int) pendingTransactions().count());
    }

    @Override
    public void close() throws Exception {
        try {
            // Flink aborts the current transaction here: its records are in no checkpoint and
            // will be replayed.
            super.close();
        } finally {
            if (nativeSink != 0) {
                long id = nativeSink;
                nativeSink = 0;
                NativeBridge.close(id);
            }
            batch = null;
        }
    }

    // ------------------------------------------------------------------ transactions

    @Override
    protected TwopcTransaction beginTransaction() {
        byte[] handle;
        try {
            handle = NativeBridge.begin(nativeSink);
        } catch (TwopcException e) {
            throw escalate(e, "beginning a transaction");
        }
        TwopcTransaction transaction = new TwopcTransaction(handle);
        transaction.setTransactionId(transactionIdOf(handle));
        return transaction;
    }

    @Override
    protected void invoke(TwopcTransaction transaction, IN value, Context context) {
        byte[] record = serializationSchema.serialize(value);
        if (record == null) {
            throw escalate(new TwopcConfigException(scope + ": the serialization schema "
                    + serializationSchema.getClass().getName() + " returned null for a record. The "
                    + "sink writes every record it receives; filter records before the sink instead"),
                    "serializing a record");
        }
        // Only a directory's LINES files are split at newlines; a COPY CSV row may hold one inside
        // quotes, and the native side checks that each record is exactly one COPY row (a record that
        // is not stops the job with TwopcRecordRejectedException).
        if (options.postgres == null && options.recordFormat == RecordFormat.LINES && LineBreaks.containsNewline(record)) {
            throw escalate(new TwopcConfigException(scope + ": a record of " + record.length
                    + " bytes contains a newline, but the record format is LINES (one record per "
                    + "line), so it would read back as several records. Escape newlines in the "
                    + "serialization schema, or use setRecordFormat(RecordFormat.RAW)"),
                    "serializing a record");
        }
        append(transaction, record);
    }

    @Override
    protected void preCommit(TwopcTransaction transaction) {
        long checkpointId = snapshottingCheckpointId;
        if (checkpointId < 0) {
            throw new IllegalStateException(scope + ": preCommit of " + transaction
                    + " outside a checkpoint snapshot; only snapshotState may prepare");
        }
        flush(transaction);
        byte[] prepared;
        try {
            prepared = NativeBridge.prepare(nativeSink, transaction.handle(), checkpointId);
        } catch (TwopcException e) {
            throw escalate(e, "preparing " + transaction + " for checkpoint " + checkpointId);
        }
        transaction.replaceHandle(prepared);
        refreshStats();
        LOG.debug("{}: prepared {} for checkpoint {}", scope, transaction, checkpointId);
    }

    @Override
    protected void commit(TwopcTransaction transaction) {
        commitTransaction(transaction, false);
    }

    @Override
    protected void recoverAndCommit(TwopcTransaction transaction) {
        describe(transaction);
        commitTransaction(transaction, true);
    }

    @Override
    protected void abort(TwopcTransaction transaction) {
        abortTransaction(transaction, false);
    }

    @Override
    protected void recoverAndAbort(TwopcTransaction transaction) {
        describe(transaction);
        abortTransaction(transaction, true);
    }

    private void commitTransaction(TwopcTransaction transaction, boolean recovery) {
        long preparedAgeMs = warnIfNearRetention(transaction, "committing");
        long start = System.nanoTime();
        int outcome;
        try {
            outcome = NativeBridge.commit(nativeSink, transaction.handle());
        } catch (TwopcException e) {
            throw escalate(e, (recovery ? "re-committing restored " : "committing ") + transaction);
        }
        long durationMs = (System.nanoTime() - start) / 1_000_000;
        refreshStats();
        metrics.recordCommit(durationMs, preparedAgeMs, outcome == NativeBridge.ALREADY_COMMITTED, recovery);
        // Flink removes the entry from its pending map right after this returns.
        metrics.setPendingTransactions(Math.max(0, (int) pendingTransactions().count() - 1));
        if (outcome == NativeBridge.ALREADY_COMMITTED && recovery) {
            // The usual case after a restart: the restored checkpoint still lists a transaction
            // committed before the failure (or one whose commit landed but reported failure).
            LOG.info("{}: restored {} was committed before the restart; nothing written twice", scope,
                    transaction);
        } else if (outcome == NativeBridge.ALREADY_COMMITTED) {
            LOG.info("{}: {} was already committed (an earlier commit landed although its outcome "
                    + "was not reported); nothing written twice", scope, transaction);
        } else if (recovery) {
            LOG.info("{}: committed restored {} ({})", scope, transaction,
                    outcome == NativeBridge.EMPTY ? "empty" : "now visible");
        } else {
            LOG.debug("{}: committed {} in {} ms", scope, transaction, durationMs);
        }
    }

    private void abortTransaction(TwopcTransaction transaction, boolean recovery) {
        if (transaction == currentTransaction()) {
            // Unflushed records belong to this transaction only; they are in no checkpoint.
            discardBatch();
        }
        if (nativeSink == 0) {
            return; // open() never succeeded: nothing native to abort
        }
        int outcome;
        try {
            outcome = NativeBridge.abort(nativeSink, transaction.handle());
        } catch (TwopcException e) {
            throw escalate(e, (recovery ? "aborting restored " : "aborting ") + transaction);
        }
        refreshStats();
        if (recovery) {
            LOG.info("{}: aborted restored open {} ({})", scope, transaction,
                    outcome == NativeBridge.NOTHING_STAGED ? "nothing was staged" : "staged data removed");
        }
    }

    // ------------------------------------------------------------------ batching

    /** Adds one record to the batch; hands the batch to the core when it is full. */
    private void append(TwopcTransaction transaction, byte[] record) {
        int needed = LENGTH_PREFIX_BYTES + record.length;
        if (needed < 0) {
            throw new IllegalArgumentException(scope + ": a record of " + record.length
                    + " bytes is too large for one batch");
        }
        if (batch.remaining() < needed) {
            flush(transaction);
            if (batch.capacity() < needed) {
                writeOversized(transaction, record);
                return;
            }
        }
        batch.putInt(record.length);
        batch.put(record);
        batchRecords++;
        if (batchRecords >= options.batchSize || batch.position() >= options.batchBytes) {
            flush(transaction);
        }
    }

    /** A record larger than the batch buffer crosses alone in a buffer of its own. */
    private void writeOversized(TwopcTransaction transaction, byte[] record) {
        ByteBuffer single = ByteBuffer.allocateDirect(LENGTH_PREFIX_BYTES + record.length)
                .order(ByteOrder.LITTLE_ENDIAN);
        single.putInt(record.length);
        single.put(record);
        write(transaction, single, single.position());
    }

    /** One JNI call for the whole batch. */
    private void flush(TwopcTransaction transaction) {
        if (batch == null || batchRecords == 0) {
            return;
        }
        write(transaction, batch, batch.position());
        discardBatch();
    }

    private void write(TwopcTransaction transaction, ByteBuffer buffer, int length) {
        try {
            NativeBridge.write(nativeSink, transaction.handle(), buffer, length);
        } catch (TwopcException e) {
            throw escalate(e, "writing to " + transaction);
        }
        refreshStats();
    }

    private void discardBatch() {
        if (batch != null) {
            batch.clear();
        }
        batchRecords = 0;
    }

    // ------------------------------------------------------------------ helpers

    /**
     * The checkpoint interval for the core's retention check. Read from the job configuration
     * (where {@code enableCheckpointing} puts it in 1.20) so that it cannot drift from the real
     * one; the builder's value is the fallback.
     */
    private long resolveCheckpointIntervalMs() {
        RuntimeContext runtime = getRuntimeContext();
        if (runtime instanceof StreamingRuntimeContext) {
            StreamingRuntimeContext streaming = (StreamingRuntimeContext) runtime;
            if (!streaming.isCheckpointingEnabled()) {
                return 0; // the core refuses to start, saying to enable checkpointing
            }
            Optional<Duration> detected =
                    streaming.getJobConfiguration().getOptional(CheckpointingOptions.CHECKPOINTING_INTERVAL);
            if (detected.isPresent() && detected.get().toMillis() > 0) {
                long detectedMs = detected.get().toMillis();
                if (options.checkpointIntervalMs > 0 && options.checkpointIntervalMs != detectedMs) {
                    LOG.warn("{}: the builder's checkpoint interval ({} ms) differs from the job's ({} ms); "
                            + "using the job's for the retention check", scope, options.checkpointIntervalMs,
                            detectedMs);
                }
                return detectedMs;
            }
        }
        if (options.checkpointIntervalMs > 0) {
            return options.checkpointIntervalMs;
        }
        throw escalate(new TwopcConfigException(scope + ": the checkpoint interval could not be read "
                + "from the job configuration, and none was configured. Set it on the builder with "
                + "setCheckpointInterval(Duration) so that the retention can be checked against it"),
                "opening the sink");
    }

    /**
     * Warns, naming the transaction, when one waiting for its commit has used most of the
     * retention: past it, cleanup may remove it and its output would be lost. Returns its age
     * since prepare (-1 for an open handle or when unknown).
     */
    private long warnIfNearRetention(TwopcTransaction transaction, String activity) {
        long ageMs;
        try {
            ageMs = NativeBridge.preparedAgeMs(transaction.handle(), System.currentTimeMillis());
        } catch (TwopcException e) {
            // Unreadable handle: the commit that follows reports it properly.
            return -1;
        }
        if (ageMs >= 0 && ageMs >= options.timeoutWarningRatio * options.retentionMs) {
            LOG.warn("{}: {} {}: it was prepared {} ms ago, {}% of the retention of {} ms. If it is not "
                            + "committed before the retention runs out, cleanup may remove it and its output "
                            + "is lost (the job would stop with a LOST error). Check why checkpoints are not "
                            + "completing, or raise the retention",
                    scope, activity, transaction, ageMs, Math.round(100.0 * ageMs / options.retentionMs),
                    options.retentionMs);
        }
        return ageMs;
    }

    private void warnAboutAgingPendingTransactions() {
        pendingTransactions()
                .map(Map.Entry::getValue)
                .forEach(t -> warnIfNearRetention(t, "still waiting for its checkpoint to complete:"));
    }

    private void refreshStats() {
        if (nativeSink != 0 && metrics != null) {
            metrics.updateStats(NativeBridge.stats(nativeSink));
        }
    }

    private void describe(TwopcTransaction transaction) {
        if (transaction.transactionId() == null) {
            transaction.setTransactionId(transactionIdOf(transaction.handle()));
        }
    }

    /** The transaction id inside a handle, for log lines; null if it cannot be read. */
    private static String transactionIdOf(byte[] handle) {
        try {
            Matcher m = TRANSACTION_FIELD.matcher(NativeBridge.describeHandle(handle));
            return m.find() ? m.group(1) : null;
        } catch (TwopcException | IllegalArgumentException e) {
            return null; // an unreadable handle fails properly where it is used
        }
    }

    /**
     * Fatal core errors stop the job for good: wrapped in {@link SuppressRestartsException}, which
     * Flink honours anywhere in the cause chain, so no restart loop hides a lost transaction.
     * Retryable ones are rethrown as they are and Flink restarts from the last checkpoint.
     */
    private RuntimeException escalate(TwopcException error, String activity) {
        if (error.isFatal()) {
            LOG.error("{}: {} failed with an error a restart cannot fix; stopping the job without "
                    + "restarting: {}", scope, activity, error.getMessage());
            return new SuppressRestartsException(error);
        }
        LOG.warn("{}: {} failed; Flink restarts from the last completed checkpoint: {}", scope, activity,
                error.getMessage());
        return error;
    }
}
