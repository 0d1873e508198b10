package io.twopc.flink;

import org.apache.flink.annotation.Internal;

import java.util.Arrays;

/**
 * A prepared transaction, from the writer that prepared it to the committer that commits it when
 * its checkpoint completes: the core's encoded transaction handle (its id, checkpoint, lineage and
 * what the destination needs to finish it), inside the versioned envelope.
 *
 * <p>The one the writer emits after the end of its input is marked ({@link #isEndOfInput()}): the
 * committer runs the subtask's last housekeeping at close only once it committed that one, since
 * only then did the subtask really end rather than fail or get cancelled (see {@link
 * TwopcCommitter#close()}).
 */
@Internal
public final class TwopcCommittable {
    private final byte[] handle;
    private final boolean endOfInput;

    public TwopcCommittable(byte[] handle) {
        this(handle, false);
    }

    public TwopcCommittable(byte[] handle, boolean endOfInput) {
        this.handle = handle;
        this.endOfInput = endOfInput;
    }

    /** The encoded handle (not copied: do not change it). */
    public byte[] handle() {
        return handle;
    }

    /** True for the transaction prepared after the end of the writer's input: its last records. */
    public boolean isEndOfInput() {
        return endOfInput;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof TwopcCommittable && endOfInput == ((TwopcCommittable) o).endOfInput
                && Arrays.equals(handle, ((TwopcCommittable) o).handle);
    }

    @Override
    public int hashCode() {
        return 31 * Arrays.hashCode(handle) + (endOfInput ? 1 : 0);
    }

    @Override
    public String toString() {
        return "TwopcCommittable(" + handle.length + " bytes" + (endOfInput ? ", end of input" : "") + ")";
    }
}
