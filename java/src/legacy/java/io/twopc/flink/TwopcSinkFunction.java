package io.twopc.flink;

import io.twopc.flink.internal.Escalation;
import io.twopc.flink.internal.NativeBridge;
import io.twopc.flink.internal.RecordBatcher;
import io.twopc.flink.internal.SinkFunctionStateSerializer;

import org.apache.flink.annotation.PublicEvolving;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RuntimeContext;
import org.apache.flink.api.common.serialization.RuntimeContextInitializationContextAdapters;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.base.VoidSerializer;
import org.apache.flink.api.common.typeutils.base.array.BytePrimitiveArraySerializer;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.ReadableConfig;
import org.apache.flink.configuration.StateRecoveryOptions;
import org.apache.flink.core.io.SimpleVersionedSerialization;
import org.apache.flink.runtime.state.FunctionInitializationContext;
import org.apache.flink.runtime.state.FunctionSnapshotContext;
import org.apache.flink.streaming.api.functions.sink.TwoPhaseCommitSinkFunction;
import org.apache.flink.streaming.api.operators.StreamingRuntimeContext;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;

/**
 * The exactly-once sink for {@code stream.addSink(...)} on Flink 1.20: Flink's {@code
 * TwoPhaseCommitSinkFunction} driving the twopc core (Rust, over JNI) on a directory or a
 * PostgreSQL table. On Flink 2.x, where {@code SinkFunction} is gone, use {@link TwopcSink} with
 * {@code sinkTo}; on 1.20 both work, and {@link TwopcSink} is the one to choose for new jobs.
 *
 * <p>Per checkpoint, each subtask stages its records into one transaction; at the checkpoint
 * barrier the transaction is prepared (durable, invisible) and its prepared handle goes into
 * Flink's state; when the checkpoint completes it is committed. After a failure Flink restores the
 * handles: prepared ones of the completed checkpoint are committed again (a repeat is recognised,
 * never duplicated), the open one is aborted, and the core aborts whatever no checkpoint knows,
 * once the first checkpoint of the new attempt completes.
 *
 * <p>Besides Flink's own state ({@code "state"}: pending and open handles, kept under {@link
 * SinkFunctionStateSerializer} so that Flink 2.x can load it), every subtask writes
 * state of its own in the format of {@link TwopcSink}'s writer ({@value
 * TwopcWriterState#SINK_FUNCTION_STATE_NAME}): the core's writer state, with the lineage, and a
 * copy of each prepared transaction waiting for its commit. A subtask that receives no writer state
 * after the parallelism grew learns the lineage from the destination; and a savepoint of this
 * function restores into {@link TwopcSink} under the same uid and sink id (the upgrade path: its
 * prepared transactions are committed, its lineage kept). Earlier releases wrote copies of the
 * open handle into {@value #KNOWN_TRANSACTIONS_STATE} instead; they are still read.
 *
 * <p>A checkpoint whose prepare failed leaves the open transaction poisoned: some of its records
 * may be missing at the destination. Flink would prepare the same transaction again at the next
 * checkpoint when checkpoint failures are tolerated; instead, the next record or checkpoint fails
 * the task, and Flink restarts from the last completed checkpoint and replays.
 *
 * @param <IN> the type of records written
 */
@PublicEvolving
@SuppressWarnings("deprecation") // TwoPhaseCommitSinkFunction is deprecated in 1.20, and the only 2PC SinkFunction there
public class TwopcSinkFunction<IN> extends TwoPhaseCommitSinkFunction<IN, TwopcTransaction, Void> {
    private static final long serialVersionUID = 1L;
    private static final Logger LOG = LoggerFactory.getLogger(TwopcSinkFunction.class);

    /** Split list state of earlier releases: handle copies, or the writer state (read, never written). */
    static final String KNOWN_TRANSACTIONS_STATE = "twopc-restored-transactions";
    private static final TwopcWriterStateSerializer WRITER_STATE_SERIALIZER = new TwopcWriterStateSerializer();

    /** Byte 6 of the core's envelope: the payload kind. */
    private static final int KIND_OFFSET = 6;
    private static final int KIND_WRITER_STATE = 3;

    private final TwopcSinkOptions options;
    private final SerializationSchema<IN> serializationSchema;

    /** Id of the native sink; 0 while none is open. */
    private transient long nativeSink;
    /** Checkpoint being snapshotted, for preCommit (which Flink does not tell); -1 outside. */
    private transient long snapshottingCheckpointId = -1;
    private transient ListState<byte[]> knownTransactionsState;
    /** {@link TwopcWriterState#SINK_FUNCTION_STATE_NAME}: what {@link TwopcSink} restores. */
    private transient ListState<byte[]> writerState;
    private transient RecordBatcher batcher;
    private transient TwopcTransaction batchFor;
    private transient TwopcMetrics metrics;
    /** Why the open transaction can only be aborted; null while it is usable. */
    private transient String poisoned;
    /** Set by finish(): the end of input. */
    private transient boolean finished;
    /** The first checkpoint snapshotted after the end of input: its transaction holds the last records. */
    private transient long finalCheckpointId;
    /**
     * Set when the transaction of {@link #finalCheckpointId} was committed and no commit of this
     * attempt failed: the subtask's output is complete, so close() runs the last housekeeping.
     */
    private transient boolean endOfInputCommitted;
    /** Set by any failed commit: Flink goes on committing the others, and then fails the task. */
    private transient boolean commitFailed;
    /** Set while close() runs: the base class aborts the open transaction there. */
    private transient boolean closing;
    /** "twopc sink 'id' subtask i/n", for log lines. */
    private transient String scope;

    TwopcSinkFunction(TwopcSinkOptions options, SerializationSchema<IN> serializationSchema) {
        super(TwopcTransactionSerializer.INSTANCE, VoidSerializer.INSTANCE);
        this.options = options;
        this.serializationSchema = serializationSchema;
        // Flink's own warnings measure from a transaction's begin; ours (preparedAgeMs) from its
        // prepare. Both against the retention, the destination's transaction timeout. Failures
        // after the timeout are never ignored: the core decides, and stops the job on loss.
        setTransactionTimeout(options.retentionMs);
        enableTransactionTimeoutWarnings(options.timeoutWarningRatio);
    }

    /** Starts a builder; see {@link TwopcSinkFunctionBuilder}. */
    public static <IN> TwopcSinkFunctionBuilder<IN> builder() {
        return new TwopcSinkFunctionBuilder<>();
    }

    /** Starts a builder writing to {@code directory}. */
    public static <IN> TwopcSinkFunctionBuilder<IN> forDirectory(String directory) {
        return new TwopcSinkFunctionBuilder<IN>().forDirectory(directory);
    }

    /** Starts a builder writing to a PostgreSQL table. */
    public static <IN> TwopcSinkFunctionBuilder<IN> forPostgres(PostgresDestination destination) {
        return new TwopcSinkFunctionBuilder<IN>().forPostgres(destination);
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
        int attempt = runtime.getTaskInfo().getAttemptNumber();
        String runId = runtime.getJobInfo().getJobId().toHexString();
        scope = "twopc sink '" + options.sinkId + "' subtask " + subtask + "/" + parallelism;
        metrics = TwopcMetrics.forWriterAndCommitter(runtime.getMetricGroup());
        // Transient fields skip their initialisers when Flink deserializes the function.
        snapshottingCheckpointId = -1;
        poisoned = null;
        finished = false;
        finalCheckpointId = -1;
        endOfInputCommitted = false;
        commitFailed = false;

        if (runtime instanceof StreamingRuntimeContext) {
            // The job's settings (as the environment had them when the job graph was built).
            try {
                ReadableConfig job = ((StreamingRuntimeContext) runtime).getJobConfiguration();
                TwopcSink.refuseEndOfInputWithoutFinalCheckpoint(job, options.sinkId);
                TwopcSink.refuseWeakerCheckpoints(job.get(CheckpointingOptions.CHECKPOINTING_CONSISTENCY_MODE),
                        job.get(StateRecoveryOptions.APPROXIMATE_LOCAL_RECOVERY), options.sinkId);
            } catch (TwopcConfigException e) {
                throw escalate(e, "opening the sink");
            }
        }

        knownTransactionsState = context.getOperatorStateStore().getListState(
                new ListStateDescriptor<>(KNOWN_TRANSACTIONS_STATE, BytePrimitiveArraySerializer.INSTANCE));
        writerState = context.getOperatorStateStore().getListState(new ListStateDescriptor<>(
                TwopcWriterState.SINK_FUNCTION_STATE_NAME, BytePrimitiveArraySerializer.INSTANCE));
        List<byte[]> writerStates = new ArrayList<>();
        List<byte[]> knownHandles = new ArrayList<>();
        if (context.isRestored()) {
            for (byte[] element : writerState.get()) {
                TwopcWriterState restored;
                try {
                    restored = SimpleVersionedSerialization.readVersionAndDeSerialize(WRITER_STATE_SERIALIZER, element);
                } catch (IOException e) {
                    throw escalate(new TwopcStateException(scope + ": restored state "
                            + TwopcWriterState.SINK_FUNCTION_STATE_NAME + " holds an element that cannot be read ("
                            + e.getMessage() + "); the checkpoint is damaged or was written by an unknown release. "
                            + "Restore an earlier checkpoint"), "restoring");
                }
                // Prepared copies are for TwopcSink; this function restores them from Flink's own
                // state (recoverAndCommit) instead.
                if (!restored.isTransactionHandle()) {
                    writerStates.add(restored.bytes());
                }
            }
            for (byte[] element : knownTransactionsState.get()) {
                if (element != null && element.length > KIND_OFFSET && element[KIND_OFFSET] == KIND_WRITER_STATE) {
                    writerStates.add(element);
                } else {
                    // A handle copy of an earlier release (or damaged bytes: the core says so).
                    knownHandles.add(element);
                }
            }
        }
        long restoredCheckpointId = context.getRestoredCheckpointId().orElse(-1L);
        long checkpointIntervalMs = resolveCheckpointIntervalMs();
        String operatorId = runtime instanceof StreamingRuntimeContext
                ? ((StreamingRuntimeContext) runtime).getOperatorUniqueID() : null;

        LOG.info("{}: opening ({}; run {}, attempt {}, restored checkpoint {}, {} writer states, {} handles, "
                        + "checkpoint interval {})",
                scope, options, runId, attempt, restoredCheckpointId < 0 ? "none" : restoredCheckpointId,
                writerStates.size(), knownHandles.size(), Durations.format(checkpointIntervalMs));
        try {
            nativeSink = NativeBridge.openSink(options.toConfigJson(options.instanceFor(operatorId)), runId,
                    subtask, parallelism, attempt, checkpointIntervalMs, options.resolvePassword(),
                    restoredCheckpointId, writerStates.toArray(new byte[0][]), knownHandles.toArray(new byte[0][]));
        } catch (TwopcException e) {
            throw escalate(e, "opening the sink");
        }

        registerFlinkStateLoadableOnEveryLine(context);
        // Recovery proper: Flink commits each restored pending transaction (recoverAndCommit),
        // aborts the restored open one (recoverAndAbort), then begins the first transaction.
        super.initializeState(context);
        metrics.setPendingTransactions(0);
    }

    /**
     * Registers the base class's own state ({@value SinkFunctionStateSerializer#STATE_NAME}) under
     * {@link SinkFunctionStateSerializer} before the base class does, which then gets this state
     * (Flink hands out a state once registered, whatever serializer a later descriptor names). So
     * every savepoint holds a serializer that Flink 2.x can load: the state outlives this function
     * in a job upgraded to {@link TwopcSink}, and with Flink's own serializer 2.x could restore
     * none of that job's savepoints. Restored elements come back as bytes and are decoded here
     * for the base class, with Flink's serializer; those of earlier releases are objects already.
     */
    @SuppressWarnings({"unchecked", "rawtypes"})
    private void registerFlinkStateLoadableOnEveryLine(FunctionInitializationContext context) throws Exception {
        TypeSerializer<Object> flinkFormat = (TypeSerializer) new StateSerializer<>(
                TwopcTransactionSerializer.INSTANCE, VoidSerializer.INSTANCE);
        ListState<Object> flinkState = context.getOperatorStateStore().getListState(new ListStateDescriptor<>(
                SinkFunctionStateSerializer.STATE_NAME, new SinkFunctionStateSerializer(flinkFormat)));
        List<Object> decoded = new ArrayList<>();
        for (Object element : flinkState.get()) {
            try {
                decoded.add(SinkFunctionStateSerializer.decode(element, flinkFormat));
            } catch (IOException | RuntimeException e) {
                throw escalate(new TwopcStateException(scope + ": restored state '"
                        + SinkFunctionStateSerializer.STATE_NAME + "' (Flink's TwoPhaseCommitSinkFunction state) "
                        + "holds an element that cannot be read (" + e.getMessage() + "); the checkpoint is "
                        + "damaged or was written by an unknown release. Restore an earlier checkpoint"), "restoring");
            }
        }
        flinkState.update(decoded);
    }

    @Override
    public void open(OpenContext openContext) throws Exception {
        serializationSchema.open(RuntimeContextInitializationContextAdapters.serializationAdapter(
                getRuntimeContext(), group -> group.addGroup("user")));
        try {
            batcher = new RecordBatcher(options.batchBytes, options.batchSize, options.recordTerminator(),
                    this::writeBatch);
        } catch (TwopcConfigException e) {
            // A batch size the TaskManager's direct memory cannot hold: no restart fixes it.
            throw escalate(e, "opening the sink");
        }
        // Once per job class loader: releases this job's copy of the native library.
        RuntimeContext runtime = getRuntimeContext();
        runtime.registerUserCodeClassLoaderReleaseHookIfAbsent(NativeBridge.RELEASE_HOOK_NAME,
                NativeBridge.releaseHookFor(runtime.getUserCodeClassLoader()));
    }

    @Override
    public void snapshotState(FunctionSnapshotContext context) throws Exception {
        if (poisoned != null) {
            throw poisonedError("taking checkpoint " + context.getCheckpointId());
        }
        snapshottingCheckpointId = context.getCheckpointId();
        if (finished && finalCheckpointId < 0) {
            finalCheckpointId = context.getCheckpointId();
        }
        try {
            warnAboutAgingPendingTransactions();
            // preCommit(current) -> prepared for this checkpoint; a new transaction begins.
            super.snapshotState(context);
        } finally {
            snapshottingCheckpointId = -1;
        }
        List<byte[]> state = new ArrayList<>();
        state.add(versioned(NativeBridge.writerState(nativeSink)));
        pendingTransactions().forEach(pending -> state.add(versioned(pending.getValue().handle())));
        writerState.update(state);
        knownTransactionsState.clear();
        metrics.setPendingTransactions((int) pendingTransactions().count());
    }

    /**
     * End of input: Flink's {@code finish()} (final in the base class) calls this. The next
     * checkpoint prepares the last records; once its commit is done, close runs the last
     * housekeeping.
     */
    @Override
    protected void finishProcessing(TwopcTransaction transaction) {
        super.finishProcessing(transaction);
        finished = true;
    }

    @Override
    public void close() throws Exception {
        closing = true;
        Throwable failure = null;
        try {
            // Flink aborts the current transaction here: its records are in no checkpoint and
            // will be replayed.
            super.close();
            // The last housekeeping runs only after the commit of the last records: Flink closes
            // a failed or cancelled task too (also one whose input had ended), and such an
            // attempt may be a zombie whose subtask share a newer attempt has taken over; its
            // cleanup would abort that attempt's transactions as lingering.
            if (endOfInputCommitted && !commitFailed && nativeSink != 0) {
                finalHousekeeping();
            }
        } catch (TwopcException e) {
            RuntimeException escalated = escalate(e, "closing");
            failure = escalated;
            throw escalated;
        } catch (Exception | Error e) {
            failure = e;
            throw e;
        } finally {
            if (nativeSink != 0) {
                long id = nativeSink;
                nativeSink = 0;
                NativeBridge.closeAfter(id, failure);
            }
            batcher = null;
        }
    }

    /**
     * Lingering transactions whose cleanup failed after every checkpoint so far get one more try.
     * A retryable failure is reported (a warning and the {@code housekeepingFailures} metric), not
     * thrown: after the final checkpoint Flink redeploys a failed subtask as finished, so nothing
     * would try again and the exception could only cause a pointless restart. Fatal errors (a
     * decided commit it had to finish found lost or unresolved, damaged control data) still stop
     * the job.
     */
    private void finalHousekeeping() {
        try {
            metrics.recordLingeringAborted(NativeBridge.finish(nativeSink));
        } catch (TwopcException e) {
            if (e.isFatal()) {
                throw e;
            }
            metrics.recordHousekeepingFailure();
            LOG.warn(Escalation.unfinishedHousekeeping(scope, Thread.currentThread().isInterrupted(),
                    e.getMessage()));
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
        if (poisoned != null) {
            throw poisonedError("writing a record");
        }
        byte[] record;
        try {
            record = serializationSchema.serialize(value);
        } catch (TwopcException e) {
            // A record the sink's own schemas refuse on every replay: stop once (see TwopcWriter).
            throw escalate(Escalation.refusedBySchema(scope, e), "serializing a record");
        }
        if (record == null) {
            throw escalate(new TwopcConfigException(scope + ": the serialization schema "
                    + serializationSchema.getClass().getName() + " returned null for a record. The "
                    + "sink writes every record it receives; filter records before the sink instead"),
                    "serializing a record");
        }
        batchFor = transaction;
        try {
            batcher.add(record);
        } catch (TwopcRecordRejectedException e) {
            // A record no replay could hand over (see RecordBatcher.add): stop once.
            throw escalate(Escalation.rejected(scope, e), "handing a record over");
        }
    }

    private void writeBatch(RecordBatcher.Batch batch) {
        try {
            NativeBridge.write(nativeSink, batchFor.handle(), batch);
        } catch (TwopcException e) {
            poisoned = "a write to " + batchFor + " failed (" + e.getMessage() + ")";
            throw escalate(e, "writing to " + batchFor);
        } catch (RuntimeException e) {
            poisoned = "a write to " + batchFor + " failed (" + e.getMessage() + ")";
            throw e;
        }
        metrics.recordBatch(batch.records, batch.payloadBytes());
    }

    @Override
    protected void preCommit(TwopcTransaction transaction) {
        long checkpointId = snapshottingCheckpointId;
        if (checkpointId < 0) {
            throw new IllegalStateException(scope + ": preCommit of " + transaction
                    + " outside a checkpoint snapshot; only snapshotState may prepare");
        }
        byte[] prepared;
        try {
            batchFor = transaction;
            batcher.flush();
            prepared = NativeBridge.prepare(nativeSink, transaction.handle(), checkpointId);
        } catch (TwopcException e) {
            poisoned = "its prepare for checkpoint " + checkpointId + " failed (" + e.getMessage() + ")";
            throw escalate(e, "preparing " + transaction + " for checkpoint " + checkpointId);
        } catch (RuntimeException e) {
            poisoned = "its prepare for checkpoint " + checkpointId + " failed (" + e.getMessage() + ")";
            throw e;
        }
        transaction.replaceHandle(prepared);
        LOG.debug("{}: prepared {} for checkpoint {}", scope, transaction, checkpointId);
    }

    /**
     * The error of a poisoned subtask: retryable, so Flink restarts from the last completed
     * checkpoint and replays the records the failed write or prepare may have lost.
     */
    private TwopcException poisonedError(String activity) {
        return new TwopcException(scope + ": " + activity + " refused: the open transaction is poisoned because "
                + poisoned + ". Some of its records may be missing at the destination, so it can only be "
                + "aborted; failing the task so that Flink restarts from the last completed checkpoint and "
                + "replays them");
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
        if (!closing) {
            abortTransaction(transaction, false);
            return;
        }
        // The open transaction at close: its records are in no checkpoint, so a failed abort
        // loses nothing (the next start aborts it as lingering). Failing close() for it would
        // fail a task whose output may be complete and committed, and skip the last
        // housekeeping; the Sink V2 writer only logs it too.
        try {
            abortTransaction(transaction, false);
        } catch (RuntimeException e) {
            LOG.warn("{}: aborting the open {} at close failed; it stays invisible and is aborted at "
                    + "the next start: {}", scope, transaction, e.getMessage());
        }
    }

    @Override
    protected void recoverAndAbort(TwopcTransaction transaction) {
        describe(transaction);
        abortTransaction(transaction, true);
    }

    private void commitTransaction(TwopcTransaction transaction, boolean recovery) {
        if (commitFailed && !recovery) {
            // Flink's notifyCheckpointComplete goes on to the next pending transaction after a
            // failed commit and fails the task only at the end. Committing later checkpoints'
            // transactions meanwhile would show their output before the failed one's, out of
            // checkpoint order, until the restart commits that one (found by review). The restart
            // restores them all as pending and commits them in order; after the end of input too,
            // since a task whose final notification failed never reached FINISHED and is restored
            // from that checkpoint as any other (committing there instead would show a drained
            // savepoint's output that the failover to an older checkpoint then replays). Flink
            // keeps only the first error, so this one is logged.
            String message = scope + ": not committing " + transaction + " yet: the commit of an earlier "
                    + "checkpoint's transaction failed in this task. The task fails, and the recovery that "
                    + "follows commits both, in checkpoint order";
            LOG.warn(message);
            throw new TwopcException(message);
        }
        long preparedAgeMs = warnIfNearRetention(transaction, "committing");
        long start = System.nanoTime();
        int outcome;
        try {
            outcome = NativeBridge.commit(nativeSink, transaction.handle());
        } catch (TwopcException e) {
            commitFailed = true;
            throw escalate(e, (recovery ? "re-committing restored " : "committing ") + transaction);
        } catch (RuntimeException | Error e) {
            commitFailed = true;
            throw e;
        }
        long durationNanos = System.nanoTime() - start;
        long checkpoint = checkpointOf(transaction);
        metrics.recordCommitVisible(NativeBridge.lastCommitVisibleNanos(nativeSink));
        metrics.recordCommit(durationNanos, preparedAgeMs, outcome, recovery, checkpoint);
        if (!recovery && checkpoint >= 0) {
            // Flink commits the pending transactions of checkpoints up to a completed one
            // (notifyCheckpointComplete, final in the base class): so this checkpoint completed,
            // and the core's housekeeping for it runs now (failures are reported, not thrown).
            try {
                metrics.recordHousekeeping(NativeBridge.checkpointCompleted(nativeSink, checkpoint));
            } catch (TwopcException e) {
                commitFailed = true;
                throw escalate(e, "finishing a decided commit after checkpoint " + checkpoint);
            }
            if (finalCheckpointId >= 0 && checkpoint >= finalCheckpointId) {
                endOfInputCommitted = true;
            }
        }
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
            LOG.debug("{}: committed {} in {} µs", scope, transaction, durationNanos / 1_000);
        }
    }

    private void abortTransaction(TwopcTransaction transaction, boolean recovery) {
        if (transaction == currentTransaction() && batcher != null) {
            // Unflushed records belong to this transaction only; they are in no checkpoint.
            batcher.discard();
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
        metrics.recordAbort(outcome == NativeBridge.ABORTED);
        if (recovery) {
            LOG.info("{}: aborted restored open {} ({})", scope, transaction,
                    outcome == NativeBridge.NOTHING_STAGED ? "nothing was staged" : "staged data removed");
        }
    }

    // ------------------------------------------------------------------ helpers

    /** An element of {@link TwopcWriterState#SINK_FUNCTION_STATE_NAME}, framed as Sink V2 reads it. */
    private static byte[] versioned(byte[] coreBytes) {
        try {
            return SimpleVersionedSerialization.writeVersionAndSerialize(WRITER_STATE_SERIALIZER,
                    new TwopcWriterState(coreBytes));
        } catch (IOException e) {
            throw new IllegalStateException("framing " + coreBytes.length + " bytes of writer state", e);
        }
    }

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
                // Refused here whatever the builder's interval says: the native side takes a
                // configured interval when it is given none (found by review).
                throw escalate(new TwopcConfigException(scope + ": checkpointing is disabled, but this sink "
                        + "commits output only when a checkpoint completes, so nothing would ever be committed. "
                        + "Enable it (env.enableCheckpointing(interval), or execution.checkpointing.interval), "
                        + "and run the job in STREAMING execution mode (a job in BATCH mode has no checkpoints)"),
                        "opening the sink");
            }
            Optional<Duration> detected =
                    streaming.getJobConfiguration().getOptional(CheckpointingOptions.CHECKPOINTING_INTERVAL);
            if (detected.isPresent() && detected.get().toMillis() > 0) {
                long detectedMs = detected.get().toMillis();
                if (options.checkpointIntervalMs > 0 && options.checkpointIntervalMs != detectedMs) {
                    LOG.warn("{}: the builder's checkpoint interval ({}) differs from the job's ({}); "
                                    + "the retention must cover the longer", scope,
                            Durations.format(options.checkpointIntervalMs), Durations.format(detectedMs));
                }
                return detectedMs;
            }
        }
        return options.checkpointIntervalMs;
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
            LOG.warn("{}: {} {}: it was prepared {} ago, {}% of the retention of {}. If it is not "
                            + "committed before the retention runs out, cleanup may remove it and its output "
                            + "is lost (the job would stop with a LOST error). Check why checkpoints are not "
                            + "completing, or raise the retention",
                    scope, activity, transaction, Durations.format(ageMs),
                    Math.round(100.0 * ageMs / options.retentionMs), Durations.format(options.retentionMs));
        }
        return ageMs;
    }

    private void warnAboutAgingPendingTransactions() {
        pendingTransactions()
                .map(Map.Entry::getValue)
                .forEach(t -> warnIfNearRetention(t, "still waiting for its checkpoint to complete:"));
    }

    private void describe(TwopcTransaction transaction) {
        if (transaction.transactionId() == null) {
            transaction.setTransactionId(transactionIdOf(transaction.handle()));
        }
    }

    private static long checkpointOf(TwopcTransaction transaction) {
        try {
            return NativeBridge.handleCheckpoint(transaction.handle());
        } catch (RuntimeException e) {
            return -1;
        }
    }

    /** The transaction id inside a handle, for log lines; null if it cannot be read. */
    private static String transactionIdOf(byte[] handle) {
        try {
            return NativeBridge.handleTransaction(handle);
        } catch (TwopcException | IllegalArgumentException e) {
            return null; // an unreadable handle fails properly where it is used
        }
    }

    private RuntimeException escalate(TwopcException error, String activity) {
        return Escalation.escalate(LOG, scope, error, activity);
    }
}
