package io.twopc.flink;

import io.twopc.flink.internal.Escalation;

import org.apache.flink.annotation.Internal;
import org.apache.flink.core.io.SimpleVersionedSerializer;

import java.io.IOException;
import java.util.Arrays;

/**
 * Writes {@link TwopcCommittable}s into the committer's checkpoint state, and between writer and
 * committer when Flink does not chain them. The handle's bytes carry the core's own versioned,
 * checksummed envelope; damaged ones are refused by the core when the committable is committed,
 * as a fatal state error naming the sink.
 *
 * <p>Version 2: one flags byte (bit 0: {@link TwopcCommittable#isEndOfInput()}; the other bits
 * zero), then the handle's bytes. Version 1 (earlier releases): the handle's bytes alone, read as
 * a committable without the end-of-input mark.
 */
@Internal
public final class TwopcCommittableSerializer implements SimpleVersionedSerializer<TwopcCommittable> {
    static final int VERSION = 2;
    private static final int END_OF_INPUT = 1;

    @Override
    public int getVersion() {
        return VERSION;
    }

    @Override
    public byte[] serialize(TwopcCommittable committable) {
        byte[] handle = committable.handle();
        byte[] out = new byte[handle.length + 1];
        out[0] = (byte) (committable.isEndOfInput() ? END_OF_INPUT : 0);
        System.arraycopy(handle, 0, out, 1, handle.length);
        return out;
    }

    @Override
    public TwopcCommittable deserialize(int version, byte[] serialized) throws IOException {
        if (version == 1) {
            return new TwopcCommittable(serialized.clone());
        }
        if (version != VERSION) {
            throw Escalation.unreadableState("twopc committable of serializer version " + version + ", but this release "
                    + "reads versions 1.." + VERSION + "; restore with the twopc release that wrote the state, "
                    + "or a newer one");
        }
        if (serialized.length == 0 || (serialized[0] & ~END_OF_INPUT) != 0) {
            throw Escalation.unreadableState("twopc committable state is corrupted: "
                    + (serialized.length == 0 ? "it is empty" : "unknown flags 0x"
                            + Integer.toHexString(serialized[0] & 0xff))
                    + " (serializer version " + VERSION + "). Restore from another checkpoint or savepoint");
        }
        return new TwopcCommittable(Arrays.copyOfRange(serialized, 1, serialized.length),
                (serialized[0] & END_OF_INPUT) != 0);
    }
}
