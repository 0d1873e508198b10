package io.twopc.flink;

import org.apache.flink.annotation.Internal;

import java.util.Arrays;

/**
 * A prepared transaction, from the writer that prepared it to the committer that commits it when
 * its checkpoint completes: the core's encoded transaction handle (its id, checkpoint, lineage and
 * what the destination needs to finish it), inside the versioned envelope.
 */
@Internal
public final class TwopcCommittable {
    private final byte[] handle;

    public TwopcCommittable(byte[] handle) {
        this.handle = handle;
    }

    /** The encoded handle (not copied: do not change it). */
    public byte[] handle() {
        return handle;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof TwopcCommittable && Arrays.equals(handle, ((TwopcCommittable) o).handle);
    }

    @Override
    public int hashCode() {
        return Arrays.hashCode(handle);
    }

    @Override
    public String toString() {
        return "TwopcCommittable(" + handle.length + " bytes)";
    }
}
