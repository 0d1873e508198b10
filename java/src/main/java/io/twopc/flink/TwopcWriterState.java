package io.twopc.flink;

import org.apache.flink.annotation.Internal;

/**
 * One writer subtask's own checkpoint state: the lineage it writes in and the transaction it had
 * open (aborted on restore), as the core encodes it. One small element per subtask, whatever the
 * maximum parallelism; a subtask that gets none after the parallelism grew learns the lineage from
 * the destination.
 */
@Internal
public final class TwopcWriterState {
    /**
     * The split list state in which the SinkFunction shim ({@code TwopcSinkFunction}) writes its
     * state in the Sink V2 writer's format (elements framed by Flink's {@code
     * SimpleVersionedSerialization} with {@link TwopcWriterStateSerializer}): its writer state,
     * and a copy of each prepared transaction still waiting for its commit. {@link TwopcSink}
     * names it as compatible state, so a savepoint of the shim restores into the Sink V2 sink
     * under the same operator uid.
     */
    public static final String SINK_FUNCTION_STATE_NAME = "twopc-writer-state";

    /** Byte 6 of the core's envelope: the payload kind. */
    private static final int KIND_OFFSET = 6;
    private static final int KIND_TRANSACTION_HANDLE = 1;
    private static final int KIND_WRITER_STATE = 3;

    private final byte[] bytes;

    public TwopcWriterState(byte[] bytes) {
        this.bytes = bytes;
    }

    /** The encoded state (not copied: do not change it). */
    public byte[] bytes() {
        return bytes;
    }

    /**
     * True for a transaction handle rather than a writer's state: the shim's copies of its
     * prepared transactions (see {@link #SINK_FUNCTION_STATE_NAME}). Damaged bytes count as
     * writer state, which the core then refuses, naming the sink.
     */
    public boolean isTransactionHandle() {
        return bytes.length > KIND_OFFSET && bytes[KIND_OFFSET] == KIND_TRANSACTION_HANDLE;
    }

    /** True for the core's writer state (the lineage and the open transaction). */
    public boolean isWriterState() {
        return bytes.length > KIND_OFFSET && bytes[KIND_OFFSET] == KIND_WRITER_STATE;
    }

    @Override
    public String toString() {
        return "TwopcWriterState(" + bytes.length + " bytes)";
    }
}
