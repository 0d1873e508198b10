package io.twopc.flink;

import io.twopc.flink.internal.Escalation;

import org.apache.flink.annotation.Internal;
import org.apache.flink.core.io.SimpleVersionedSerializer;

import java.io.IOException;

/**
 * Writes {@link TwopcWriterState}s into the writer's checkpoint state: the core's versioned,
 * checksummed bytes as they are (see {@link TwopcCommittableSerializer}).
 */
@Internal
public final class TwopcWriterStateSerializer implements SimpleVersionedSerializer<TwopcWriterState> {
    static final int VERSION = 1;

    @Override
    public int getVersion() {
        return VERSION;
    }

    @Override
    public byte[] serialize(TwopcWriterState state) {
        return state.bytes().clone();
    }

    @Override
    public TwopcWriterState deserialize(int version, byte[] serialized) throws IOException {
        if (version != VERSION) {
            throw Escalation.unreadableState("twopc writer state of serializer version " + version + ", but this release "
                    + "reads version " + VERSION + "; restore with the twopc release that wrote the state, "
                    + "or a newer one");
        }
        return new TwopcWriterState(serialized.clone());
    }
}
