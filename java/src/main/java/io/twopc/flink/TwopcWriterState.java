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
    private final byte[] bytes;

    public TwopcWriterState(byte[] bytes) {
        this.bytes = bytes;
    }

    /** The encoded state (not copied: do not change it). */
    public byte[] bytes() {
        return bytes;
    }

    @Override
    public String toString() {
        return "TwopcWriterState(" + bytes.length + " bytes)";
    }
}
