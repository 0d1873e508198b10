package io.twopc.flink;

import io.twopc.flink.internal.Escalation;
import io.twopc.flink.internal.NativeBridge;
import io.twopc.flink.internal.RecordBatcher;

import org.apache.flink.annotation.Internal;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.api.connector.sink2.CommittingSinkWriter;
import org.apache.flink.api.connector.sink2.StatefulSinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.groups.SinkWriterMetricGroup;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.List;

/**
 * The Sink V2 writer of a {@link TwopcSink}: stages records into one transaction per checkpoint
 * (in batches, one native call each), prepares it when Flink asks for the checkpoint's
 * committables, and hands the prepared handle to the {@link TwopcCommitter}. It never commits.
 *
 * <p>The checkpoint id recorded with a prepared transaction is the last checkpoint this writer
 * snapshotted, plus one ({@code prepareCommit} is not told the id). Flink snapshots every subtask
 * for a checkpoint that completes, so the recorded id is never above the true one and never at or
 * below a completed checkpoint the transaction came after: exactly what rewind detection needs.
 */
@Internal
public final class TwopcWriter<IN>
        implements CommittingSinkWriter<IN, TwopcCommittable>, StatefulSinkWriter<IN, TwopcWriterState> {
    private static final Logger LOG = LoggerFactory.getLogger(TwopcWriter.class);

    private final SerializationSchema<IN> schema;
    private final String scope;
    private final long nativeWriter;
    private final RecordBatcher batcher;
    private final Counter recordsOut;
    private final Counter bytesOut;
    private final TwopcMetrics twopcMetrics;
    private byte[] current;
    private long lastCheckpointId;
    /** Set when a write or prepare failed: the transaction can only be aborted now. */
    private String poisoned;
    /**
     * Set by {@code flush(true)}: Flink's end of input. The next {@code prepareCommit} (Flink calls
     * it right after, and never again) prepares the last records, and its committable is marked.
     */
    private boolean endOfInput;
    private boolean closed;

    TwopcWriter(TwopcSinkOptions options, SerializationSchema<IN> schema, long detectedIntervalMs,
            WriterInitContext ctx, Collection<TwopcWriterState> restored) throws Exception {
        this.schema = schema;
        int subtask = ctx.getTaskInfo().getIndexOfThisSubtask();
        int parallelism = ctx.getTaskInfo().getNumberOfParallelSubtasks();
        int attempt = ctx.getTaskInfo().getAttemptNumber();
        String run = ctx.getJobInfo().getJobId().toHexString();
        this.scope = "twopc sink '" + options.sinkId + "' writer " + subtask + "/" + parallelism;
        SinkWriterMetricGroup metrics = ctx.metricGroup();
        this.recordsOut = metrics.getNumRecordsSendCounter();
        this.bytesOut = metrics.getNumBytesSendCounter();
        this.twopcMetrics = TwopcMetrics.forWriter(metrics);
        long restoredId = ctx.getRestoredCheckpointId().orElse(-1L);
        this.lastCheckpointId = Math.max(restoredId, 0);
        schema.open(ctx.asSerializationSchemaInitializationContext());
        // Restored elements are this sink's writer states, and, after an upgrade from the
        // SinkFunction shim, copies of the shim's prepared transactions (see TwopcWriterState).
        List<byte[]> states = new ArrayList<>();
        List<byte[]> shimPrepared = new ArrayList<>();
        for (TwopcWriterState s : restored) {
            (s.isTransactionHandle() ? shimPrepared : states).add(s.bytes());
        }
        String operatorId = metrics.getAllVariables().get("<operator_id>");
        // The retention must cover the longer of the job's interval and the builder's (see the
        // native side's interval_in_force); the job's is handed over as detected.
        long interval = Math.max(detectedIntervalMs, 0);
        LOG.info("{}: opening ({}; run {}, attempt {}, restored checkpoint {}, {} writer states{})", scope, options,
                run, attempt, restoredId < 0 ? "none" : restoredId, states.size(),
                shimPrepared.isEmpty() ? "" : ", " + shimPrepared.size() + " prepared transactions of the SinkFunction");
        String config = options.toConfigJson(options.instanceFor(operatorId));
        try {
            this.nativeWriter = NativeBridge.openWriter(config, run, subtask, parallelism, attempt,
                    Math.max(interval, 0), options.resolvePassword(), restoredId, states.toArray(new byte[0][]),
                    shimPrepared.toArray(new byte[0][]));
        } catch (TwopcException e) {
            throw Escalation.escalate(LOG, scope, e, "opening the writer");
        }
        // Whatever fails from here on (an Error too: the batch buffers are direct memory, which
        // may be short), the native writer is closed: Flink never closes a writer whose
        // construction failed, and it would hold this subtask's ownership and its transaction
        // until the TaskManager ends, so that every restart met "the share is held".
        try {
            commitShimTransactions(config, run, subtask, parallelism, attempt, options, restoredId, shimPrepared);
            this.current = NativeBridge.begin(nativeWriter);
            this.batcher = new RecordBatcher(options.batchBytes, options.batchSize, options.recordTerminator(),
                    this::writeBatch);
            // Once per job class loader: releases this job's copy of the native library.
            ctx.getUserCodeClassLoader().registerReleaseHookIfAbsent(NativeBridge.RELEASE_HOOK_NAME,
                    NativeBridge.releaseHookFor(ctx.getUserCodeClassLoader().asClassLoader()));
        } catch (TwopcException e) {
            RuntimeException escalated = Escalation.escalate(LOG, scope, e, "opening the writer");
            NativeBridge.closeAfter(nativeWriter, escalated);
            throw escalated;
        } catch (RuntimeException | Error e) {
            NativeBridge.closeAfter(nativeWriter, e);
            throw e;
        }
    }

    /**
     * Commits the prepared transactions a SinkFunction shim's savepoint holds (the upgrade to this
     * sink). Their checkpoint completed, so committing is the only way forward, as the shim would
     * on restore; it happens here, while the subtask opens and before any checkpoint of this job
     * can complete, so that no committer's lingering cleanup (after that checkpoint) can meet them
     * still prepared. A repeat is recognised as already committed.
     */
    private static void commitShimTransactions(String config, String run, int subtask, int parallelism, int attempt,
            TwopcSinkOptions options, long restoredId, List<byte[]> prepared) {
        if (prepared.isEmpty()) {
            return;
        }
        long committer = NativeBridge.openCommitter(config, run, subtask, parallelism, attempt,
                options.resolvePassword(), restoredId);
        Throwable failure = null;
        try {
            for (byte[] handle : prepared) {
                NativeBridge.commit(committer, handle);
            }
        } catch (RuntimeException | Error e) {
            failure = e;
            throw e;
        } finally {
            NativeBridge.closeAfter(committer, failure);
        }
    }

    @Override
    public void write(IN element, Context context) {
        if (poisoned != null) {
            throw new TwopcException(scope + ": the open transaction can take no more records because " + poisoned
                    + "; failing the task so that Flink restarts from the last completed checkpoint and replays "
                    + "its records");
        }
        byte[] record;
        try {
            record = schema.serialize(element);
        } catch (TwopcException e) {
            // The sink's own schemas refuse a record that no replay could write (a retraction
            // CsvRowSchema cannot express, an unpaired surrogate): stop once, not restart forever.
            // Other exceptions of a user's schema are left to Flink's restart strategy: they may
            // be transient (a schema registry that did not answer).
            throw Escalation.escalate(LOG, scope, Escalation.refusedBySchema(scope, e), "serializing a record");
        }
        if (record == null) {
            throw Escalation.escalate(LOG, scope, new TwopcConfigException(scope + ": the serialization schema "
                    + schema.getClass().getName() + " returned null for a record. The sink writes every record "
                    + "it receives; filter records before the sink instead"), "serializing a record");
        }
        try {
            batcher.add(record);
        } catch (TwopcRecordRejectedException e) {
            // A record no replay could hand over (see RecordBatcher.add): stop once.
            throw Escalation.escalate(LOG, scope, Escalation.rejected(scope, e), "handing a record over");
        }
    }

    private void writeBatch(RecordBatcher.Batch batch) {
        try {
            NativeBridge.write(nativeWriter, current, batch);
        } catch (TwopcException e) {
            poisoned = "a write failed (" + e.getMessage() + ")";
            throw Escalation.escalate(LOG, scope, e, "writing a batch");
        } catch (RuntimeException e) {
            poisoned = "a write failed (" + e.getMessage() + ")";
            throw e;
        }
        recordsOut.inc(batch.records);
        bytesOut.inc(batch.payloadBytes());
        twopcMetrics.recordBatch(batch.records, batch.payloadBytes());
    }

    @Override
    public void flush(boolean endOfInput) {
        if (endOfInput) {
            this.endOfInput = true;
        }
        if (poisoned == null) {
            batcher.flush();
        }
    }

    @Override
    public Collection<TwopcCommittable> prepareCommit() {
        if (poisoned != null) {
            throw new TwopcException(scope + ": refusing to prepare, because " + poisoned + "; failing the task so "
                    + "that Flink restarts from the last completed checkpoint and replays its records");
        }
        batcher.flush();
        byte[] handle;
        try {
            handle = NativeBridge.prepare(nativeWriter, current, lastCheckpointId + 1);
        } catch (RuntimeException e) {
            poisoned = "its prepare failed (" + e.getMessage() + ")";
            if (e instanceof TwopcException) {
                throw Escalation.escalate(LOG, scope, (TwopcException) e, "preparing a transaction");
            }
            throw e;
        }
        twopcMetrics.recordPrepare();
        try {
            current = NativeBridge.begin(nativeWriter);
        } catch (RuntimeException e) {
            // The prepared handle above is not handed on, so this checkpoint cannot complete with
            // it; should Flink tolerate the failed checkpoint and go on, the records it holds would
            // be in no checkpoint. Poisoned, the next write or prepare fails the task, and the
            // restart replays them (the prepared transaction is aborted then as lingering).
            current = null;
            poisoned = "the next transaction could not begin after a prepare (" + e.getMessage() + ")";
            if (e instanceof TwopcException) {
                throw Escalation.escalate(LOG, scope, (TwopcException) e, "beginning a transaction");
            }
            throw e;
        }
        // The end-of-input mark tells the committer that committing this one ends the subtask
        // normally, so that its close may run the last housekeeping (see TwopcCommitter.close).
        return Collections.singletonList(new TwopcCommittable(handle, endOfInput));
    }

    @Override
    public List<TwopcWriterState> snapshotState(long checkpointId) {
        lastCheckpointId = checkpointId;
        List<TwopcWriterState> state = new ArrayList<>(1);
        state.add(new TwopcWriterState(NativeBridge.writerState(nativeWriter)));
        return state;
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        batcher.discard();
        try {
            if (current != null) {
                // Its records are in no checkpoint: they are replayed.
                twopcMetrics.recordAbort(NativeBridge.abort(nativeWriter, current) == NativeBridge.ABORTED);
            }
        } catch (RuntimeException e) {
            LOG.warn("{}: aborting the open transaction at close failed; it stays invisible and is aborted at "
                    + "the next start: {}", scope, e.getMessage());
        } finally {
            NativeBridge.close(nativeWriter);
        }
    }
}
