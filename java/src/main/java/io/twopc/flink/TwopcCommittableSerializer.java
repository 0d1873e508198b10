package io.twopc.flink;

import org.apache.flink.annotation.Internal;
import org.apache.flink.core.io.SimpleVersionedSerializer;

import java.io.IOException;

/**
 * Writes {@link TwopcCommittable}s into the committer's checkpoint state: the handle's bytes as
 * they are. They carry the core's own versioned, checksummed envelope, so this serializer's
 * version only ever changes if the framing around them does; damaged bytes are refused by the core
 * when the committable is committed, as a fatal state error naming the sink.
 */
@Internal
public final class TwopcCommittableSerializer implements SimpleVersionedSerializer<TwopcCommittable> {
    static final int VERSION = 1;

    @Override
    public int getVersion() {
        return VERSION;
    }

    @Override
    public byte[] serialize(TwopcCommittable committable) {
        return committable.handle().clone();
    }

    @Override
    public TwopcCommittable deserialize(int version, byte[] serialized) throws IOException {
        if (version != VERSION) {
            throw new IOException("twopc committable of serializer version " + version + ", but this release "
                    + "reads version " + VERSION + "; restore with the twopc release that wrote the state, "
                    + "or a newer one");
        }
        return new TwopcCommittable(serialized.clone());
    }
}
