package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;
import org.apache.flink.api.common.RuntimeExecutionMode;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.api.connector.sink2.Committer;
import org.apache.flink.api.connector.sink2.CommitterInitContext;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.StatefulSinkWriter;
import org.apache.flink.api.connector.sink2.SupportsCommitter;
import org.apache.flink.api.connector.sink2.SupportsWriterState;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.api.connector.source.Boundedness;
import org.apache.flink.api.dag.Transformation;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.ExecutionOptions;
import org.apache.flink.configuration.ReadableConfig;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.core.io.SimpleVersionedSerializer;
import org.apache.flink.streaming.api.connector.sink2.SupportsPreWriteTopology;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.CheckpointConfig;
import org.apache.flink.streaming.api.transformations.WithBoundedness;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.List;

/**
 * An exactly-once sink for Flink 1.20 and 2.x ({@code stream.sinkTo(sink)}), driving the twopc
 * core (Rust, over JNI) on a directory or on a PostgreSQL table ({@link PostgresDestination}).
 *
 * <p>Per checkpoint, each writer subtask stages its records into one transaction; at the
 * checkpoint barrier the transaction is prepared (durable, invisible) and its handle goes to the
 * committer as a committable, which Flink keeps in the committer's state; when the checkpoint
 * completes it is committed (an atomic rename into the output directory, or {@code COMMIT
 * PREPARED}). After a failure Flink restores the committables and the committer commits them
 * again (a repeat is recognised, never duplicated); each writer aborts the transaction it had open;
 * and once a checkpoint of the new attempt completes, each committer aborts the lingering
 * transactions it owns.
 *
 * <p>Errors the core calls fatal (a lost transaction, a rewind, unreadable state, impossible
 * configuration, another live owner of the sink id) stop the job without a restart loop: they are
 * rethrown inside Flink's {@code SuppressRestartsException}, with the core's message (which names
 * the transaction and the way out) on the cause. Other errors fail the task and Flink restarts
 * from the last completed checkpoint.
 *
 * <p>Build one with {@link #builder()}; give the sink a stable {@code uid} so that its state is
 * found again after a savepoint:
 *
 * <pre>{@code
 * stream.sinkTo(TwopcSink.<String>forDirectory("/data/out")
 *                 .setSinkId("orders")
 *                 .setSerializationSchema(new SimpleStringSchema())
 *                 .build())
 *       .uid("orders-sink");
 * }</pre>
 *
 * @param <IN> the type of records written
 */
@PublicEvolving
public final class TwopcSink<IN>
        implements Sink<IN>, SupportsWriterState<IN, TwopcWriterState>, SupportsCommitter<TwopcCommittable>,
                SupportsPreWriteTopology<IN>, SupportsWriterState.WithCompatibleState {
    private static final long serialVersionUID = 1L;

    private final TwopcSinkOptions options;
    private final SerializationSchema<IN> serializationSchema;
    /** The job's checkpoint interval, read when the job graph is built (0 if unknown). */
    private long detectedIntervalMs;

    TwopcSink(TwopcSinkOptions options, SerializationSchema<IN> serializationSchema) {
        this.options = options;
        this.serializationSchema = serializationSchema;
    }

    /** Starts a builder; see {@link TwopcSinkBuilder}. */
    public static <IN> TwopcSinkBuilder<IN> builder() {
        return new TwopcSinkBuilder<>();
    }

    /** Starts a builder writing to {@code directory}; see {@link TwopcSinkBuilderBase#forDirectory(String)}. */
    public static <IN> TwopcSinkBuilder<IN> forDirectory(String directory) {
        return new TwopcSinkBuilder<IN>().forDirectory(directory);
    }

    /** Starts a builder writing to a PostgreSQL table; see {@link PostgresDestination}. */
    public static <IN> TwopcSinkBuilder<IN> forPostgres(PostgresDestination destination) {
        return new TwopcSinkBuilder<IN>().forPostgres(destination);
    }

    /** Starts a builder writing to an object store; see {@link ObjectStoreDestination}. */
    public static <IN> TwopcSinkBuilder<IN> forObjectStore(ObjectStoreDestination destination) {
        return new TwopcSinkBuilder<IN>().forObjectStore(destination);
    }

    /** The sink's stable id. */
    public String getSinkId() {
        return options.sinkId;
    }

    /** The output directory, or null when the sink writes to PostgreSQL. */
    public String getOutputDirectory() {
        return options.outputDirectory;
    }

    /** The validated settings (for front ends built on this sink, such as the SQL connector). */
    public TwopcSinkOptions getOptions() {
        return options;
    }

    @Override
    public SinkWriter<IN> createWriter(WriterInitContext context) throws IOException {
        return restoreWriter(context, Collections.emptyList());
    }

    @Override
    public StatefulSinkWriter<IN, TwopcWriterState> restoreWriter(
            WriterInitContext context, Collection<TwopcWriterState> recoveredState) throws IOException {
        try {
            return new TwopcWriter<>(options, serializationSchema, detectedIntervalMs, context, recoveredState);
        } catch (IOException | RuntimeException e) {
            throw e;
        } catch (Exception e) {
            throw new IOException(e);
        }
    }

    @Override
    public SimpleVersionedSerializer<TwopcWriterState> getWriterStateSerializer() {
        return new TwopcWriterStateSerializer();
    }

    /**
     * The state the SinkFunction shim writes for this sink (see {@link
     * TwopcWriterState#SINK_FUNCTION_STATE_NAME}): a savepoint of a job with {@code
     * addSink(TwopcSinkFunction)} restores into {@code sinkTo(TwopcSink)} under the same uid and
     * sink id, its prepared transactions committed and its lineage kept.
     */
    @Override
    public Collection<String> getCompatibleWriterStateNames() {
        return Collections.singletonList(TwopcWriterState.SINK_FUNCTION_STATE_NAME);
    }

    @Override
    public Committer<TwopcCommittable> createCommitter(CommitterInitContext context) {
        return new TwopcCommitter(options, context);
    }

    @Override
    public SimpleVersionedSerializer<TwopcCommittable> getCommittableSerializer() {
        return new TwopcCommittableSerializer();
    }

    /**
     * Not a topology change: the hook where the sink reads the job's checkpoint interval (for the
     * retention check) while the job graph is built, after the job's settings are final.
     *
     * @throws TwopcConfigException when checkpointing is disabled: output is committed only when a
     *     checkpoint completes, so without checkpoints nothing would ever become visible (and a
     *     BATCH job, which has none, could not recover exactly once); and when checkpoints after
     *     tasks finish are disabled (see {@link #refuseEndOfInputWithoutFinalCheckpoint}); in BATCH
     *     execution mode; with checkpoints weaker than exactly once (see {@link
     *     #refuseWeakerCheckpoints})
     */
    @Override
    public DataStream<IN> addPreWriteTopology(DataStream<IN> inputDataStream) {
        CheckpointConfig checkpoints = inputDataStream.getExecutionEnvironment().getCheckpointConfig();
        if (!checkpoints.isCheckpointingEnabled()) {
            throw new TwopcConfigException("twopc sink '" + options.sinkId + "': checkpointing is disabled, but this "
                    + "sink commits output only when a checkpoint completes. Enable it "
                    + "(env.enableCheckpointing(interval), or execution.checkpointing.interval) and run in STREAMING "
                    + "execution mode");
        }
        ReadableConfig config = inputDataStream.getExecutionEnvironment().getConfiguration();
        refuseEndOfInputWithoutFinalCheckpoint(config, options.sinkId);
        refuseBatchExecution(config.get(ExecutionOptions.RUNTIME_MODE), inputDataStream, options.sinkId);
        refuseWeakerCheckpoints(checkpoints.getCheckpointingConsistencyMode(),
                checkpoints.isApproximateLocalRecoveryEnabled(), options.sinkId);
        detectedIntervalMs = checkpoints.getCheckpointInterval();
        return inputDataStream;
    }

    /**
     * Refuses BATCH execution, and AUTOMATIC where every source before the sink is bounded (Flink
     * then runs the job as BATCH). A BATCH job takes no checkpoints: Flink's committer commits
     * each subtask's output at the end of its input, so after a failure that follows some
     * subtasks' commits the job could not be recovered exactly once. The environment's
     * CheckpointConfig still says "enabled" there (Flink turns checkpoints off in a copy), so the
     * check on it alone does not see this (found by review).
     */
    private static void refuseBatchExecution(RuntimeExecutionMode mode, DataStream<?> input, String sinkId) {
        String why;
        if (mode == RuntimeExecutionMode.BATCH) {
            why = "the job runs in BATCH execution mode (execution.runtime-mode: BATCH)";
        } else if (mode == RuntimeExecutionMode.AUTOMATIC && onlyBoundedSources(input)) {
            why = "execution.runtime-mode is AUTOMATIC and every source before this sink is bounded, so Flink runs "
                    + "the job in BATCH execution mode";
        } else {
            return;
        }
        throw new TwopcConfigException("twopc sink '" + sinkId + "': " + why + ". A BATCH job takes no checkpoints, "
                + "and each subtask's output would be committed at the end of its input: a failure after some "
                + "subtasks committed could not be recovered exactly once. Run the job in STREAMING mode "
                + "(execution.runtime-mode: STREAMING, or env.setRuntimeMode(RuntimeExecutionMode.STREAMING)); "
                + "with bounded sources it finishes all the same, committing at its final checkpoint");
    }

    /**
     * Whether AUTOMATIC picks BATCH: as Flink decides it, when no source of the job is unbounded,
     * those before this sink and those of the job's other branches (the environment's
     * transformations, still all there while the graph is built) alike. A transformation that
     * does not say is bounded to Flink too.
     */
    private static boolean onlyBoundedSources(DataStream<?> input) {
        List<Transformation<?>> roots = new ArrayList<>(input.getExecutionEnvironment().getTransformations());
        roots.add(input.getTransformation());
        for (Transformation<?> root : roots) {
            for (Transformation<?> t : root.getTransitivePredecessors()) {
                if (t instanceof WithBoundedness
                        && ((WithBoundedness) t).getBoundedness() != Boundedness.BOUNDED) {
                    return false;
                }
            }
        }
        return true;
    }

    /**
     * Refuses checkpoints weaker than exactly once. With AT_LEAST_ONCE the barriers are not
     * aligned: records that reach the sink after a checkpoint's barrier on a faster input channel
     * are written into that checkpoint's transaction, committed with it, and replayed again after
     * a failover to it. Approximate local recovery restarts a failed task alone, without rewinding
     * its inputs. Either would duplicate or lose output without an error (found by review). Also
     * called by the SinkFunction shim.
     */
    static void refuseWeakerCheckpoints(CheckpointingMode mode, boolean approximateLocalRecovery, String sinkId) {
        if (mode != CheckpointingMode.EXACTLY_ONCE) {
            throw new TwopcConfigException("twopc sink '" + sinkId + "': checkpoints are " + mode
                    + " (execution.checkpointing.mode), so records that arrive after a checkpoint's barrier on one "
                    + "input channel are committed with that checkpoint and replayed after a failover to it: duplicate "
                    + "output. Set execution.checkpointing.mode: EXACTLY_ONCE (the default; unaligned checkpoints are "
                    + "exactly once too)");
        }
        if (approximateLocalRecovery) {
            throw new TwopcConfigException("twopc sink '" + sinkId + "': approximate local recovery is enabled "
                    + "(execution.state-recovery.approximate-local-recovery), which restarts a failed task alone without "
                    + "rewinding its inputs: output would be lost or duplicated. Disable it");
        }
    }

    /**
     * Refuses {@code execution.checkpointing.checkpoints-after-tasks-finish: false} (the key Flink
     * 1.20 also reads as {@code ...checkpoints-after-tasks-finish.enabled}; {@link
     * CheckpointingOptions#ENABLE_CHECKPOINTS_AFTER_TASKS_FINISH} covers both on 1.20 and 2.x).
     * With it, a subtask whose input ends (a bounded source) finishes without a final checkpoint,
     * and the transaction holding its last records is never committed: Flink commits the
     * committables emitted at the end of input only when a checkpoint after it completes, and the
     * SinkFunction aborts its open transaction at close. Output would be missing without any error.
     * Whether the input is bounded is not known here, so the setting is refused for every job.
     * Also called by the SinkFunction shim.
     */
    static void refuseEndOfInputWithoutFinalCheckpoint(ReadableConfig config, String sinkId) {
        if (!config.get(CheckpointingOptions.ENABLE_CHECKPOINTS_AFTER_TASKS_FINISH)) {
            String key = CheckpointingOptions.ENABLE_CHECKPOINTS_AFTER_TASKS_FINISH.key();
            throw new TwopcConfigException("twopc sink '" + sinkId + "': " + key + " is false (set under this "
                    + "key or its older one, " + key + ".enabled), so a subtask whose input ends finishes without a "
                    + "final checkpoint, and the transaction holding its last records would never be committed: that "
                    + "output would be missing without any error. Remove the setting under both keys, or set "
                    + key + ": true (the default)");
        }
    }
}
