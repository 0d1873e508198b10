package io.twopc.flink.internal;

import org.apache.flink.annotation.Internal;
import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSchemaCompatibility;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.core.memory.DataOutputView;

import java.io.EOFException;
import java.io.IOException;
import java.util.Arrays;

/**
 * The serializer under which {@code TwopcSinkFunction} keeps the state of Flink's {@code
 * TwoPhaseCommitSinkFunction} (state {@value #STATE_NAME}), chosen so that every Flink line can
 * load it.
 *
 * <p>Why not Flink's own serializer: Flink writes an operator's restored state into every later
 * snapshot, even when no code of the new job reads it. A savepoint of the SinkFunction restored
 * into {@code TwopcSink} (the upgrade path) therefore carries this state on and on; under Flink's
 * serializer its snapshot class is {@code ...functions.sink.TwoPhaseCommitSinkFunction
 * $StateSerializerSnapshot}, which Flink 2.x moved to an internal package, so 2.x could not
 * restore any later savepoint of the upgraded job. This class is in the twopc jar, compiled
 * against 2.x and loadable on 1.20 and 2.x alike.
 *
 * <p>An element is written as its length followed by the bytes of Flink's own state format (the
 * pending transaction, the transactions waiting for their commit, the context). Read back, an
 * element is {@link StateBytes}, opaque: only the SinkFunction on Flink 1.20 decodes it, with
 * Flink's serializer, which it passes in as {@code stateFormat}; everywhere else the bytes are
 * carried as they are. The state of earlier releases, under Flink's serializer, is taken over
 * (compatible after migration: Flink has already read it into objects, which this serializer
 * writes in its own framing from then on).
 */
@Internal
public final class SinkFunctionStateSerializer extends TypeSerializer<Object> {
    private static final long serialVersionUID = 1L;

    /** The state name Flink's {@code TwoPhaseCommitSinkFunction} uses for its own state. */
    public static final String STATE_NAME = "state";

    /** The snapshot class of Flink 1.20's serializer of that state, by name (2.x lacks it). */
    static final String FLINK_120_SNAPSHOT_CLASS =
            "org.apache.flink.streaming.api.functions.sink.TwoPhaseCommitSinkFunction$StateSerializerSnapshot";

    /**
     * Bound on an element's length. An element is not one handle (those are at most 1 MiB, and a
     * few hundred bytes in practice) but a subtask's whole state: the open transaction and every
     * transaction still waiting for its commit, one per checkpoint since the last one that
     * completed, which a long run of failing checkpoints makes thousands. A bound near a handle's
     * would make such a state, written without complaint, impossible to restore; so the bound is
     * generous, {@link #serialize} refuses to write beyond it, and reading allocates only as the
     * bytes arrive ({@link #readElement}), so that damaged lengths cost no memory the input does
     * not hold.
     */
    static final int MAX_ELEMENT_LENGTH = 1 << 28;

    /** The first allocation for an element; it doubles as bytes arrive, up to the declared length. */
    private static final int FIRST_READ = 64 << 10;

    /**
     * Flink's serializer of the state objects: set by the SinkFunction on Flink 1.20, where the
     * base class puts objects into the state; null where the state is only carried.
     */
    private final TypeSerializer<Object> stateFormat;

    /** The serializer the SinkFunction registers, with Flink's serializer of its state objects. */
    public SinkFunctionStateSerializer(TypeSerializer<Object> stateFormat) {
        this.stateFormat = stateFormat;
    }

    /** The serializer restored from a snapshot: carries elements as bytes. */
    SinkFunctionStateSerializer() {
        this.stateFormat = null;
    }

    /** One element of the state, as bytes in Flink's state format. Immutable. */
    public static final class StateBytes {
        private final byte[] bytes;

        StateBytes(byte[] bytes) {
            this.bytes = bytes;
        }

        /** A copy of the bytes, in the format of Flink's {@code TwoPhaseCommitSinkFunction} state. */
        public byte[] bytes() {
            return bytes.clone();
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof StateBytes && Arrays.equals(bytes, ((StateBytes) o).bytes);
        }

        @Override
        public int hashCode() {
            return Arrays.hashCode(bytes);
        }

        @Override
        public String toString() {
            return "TwoPhaseCommitSinkFunction state (" + bytes.length + " bytes)";
        }
    }

    /** Decodes an element with Flink's serializer of the state objects (on Flink 1.20). */
    public static Object decode(Object element, TypeSerializer<Object> stateFormat) throws IOException {
        if (!(element instanceof StateBytes)) {
            return element;
        }
        byte[] bytes = ((StateBytes) element).bytes;
        DataInputDeserializer in = new DataInputDeserializer(bytes);
        Object state;
        try {
            state = stateFormat.deserialize(in);
        } catch (EOFException e) {
            throw corrupted("it ends inside the SinkFunction state element of " + bytes.length + " bytes", e);
        }
        if (in.available() != 0) {
            throw new IOException(in.available() + " bytes follow the SinkFunction state element of "
                    + ((StateBytes) element).bytes.length + " bytes: the state is damaged or was written by "
                    + "an unknown release. Restore from another checkpoint or savepoint");
        }
        return state;
    }

    private static IOException corrupted(String what, Throwable cause) {
        return new IOException("the SinkFunction state of twopc is corrupted: " + what + ". Restore from another "
                + "checkpoint or savepoint", cause);
    }

    private StateBytes toBytes(Object element) throws IOException {
        if (element instanceof StateBytes) {
            return (StateBytes) element;
        }
        if (stateFormat == null) {
            throw new IllegalStateException("a " + element.getClass().getName() + " in the state of Flink's "
                    + "TwoPhaseCommitSinkFunction, where only bytes restored from a snapshot are expected: "
                    + "only TwopcSinkFunction puts state objects there");
        }
        DataOutputSerializer out = new DataOutputSerializer(256);
        stateFormat.serialize(element, out);
        return new StateBytes(out.getCopyOfBuffer());
    }

    @Override
    public boolean isImmutableType() {
        return false; // the SinkFunction's state objects are mutable; StateBytes are not
    }

    @Override
    public TypeSerializer<Object> duplicate() {
        return stateFormat == null ? this : new SinkFunctionStateSerializer(stateFormat.duplicate());
    }

    @Override
    public Object createInstance() {
        return new StateBytes(new byte[0]);
    }

    /** A copy as bytes: deep, and what a snapshot writes anyway. */
    @Override
    public Object copy(Object from) {
        try {
            return toBytes(from);
        } catch (IOException e) {
            throw new IllegalStateException("copying the state of Flink's TwoPhaseCommitSinkFunction", e);
        }
    }

    @Override
    public Object copy(Object from, Object reuse) {
        return copy(from);
    }

    @Override
    public int getLength() {
        return -1;
    }

    @Override
    public void serialize(Object element, DataOutputView target) throws IOException {
        byte[] bytes = toBytes(element).bytes;
        if (bytes.length > MAX_ELEMENT_LENGTH) {
            // Fails this checkpoint instead of writing one that could not be restored.
            throw new IOException("the SinkFunction state of twopc is " + bytes.length + " bytes for one subtask, "
                    + "above the " + MAX_ELEMENT_LENGTH + " bytes a restore reads: its transactions waiting for "
                    + "their commit have piled up because checkpoints keep failing to complete. Find why "
                    + "checkpoints fail; this checkpoint is not taken");
        }
        target.writeInt(bytes.length);
        target.write(bytes);
    }

    @Override
    public Object deserialize(DataInputView source) throws IOException {
        return new StateBytes(readElement(source));
    }

    @Override
    public Object deserialize(Object reuse, DataInputView source) throws IOException {
        return deserialize(source);
    }

    @Override
    public void copy(DataInputView source, DataOutputView target) throws IOException {
        // Through an array: DataOutputSerializer.write(DataInputView, int) does not grow its buffer.
        byte[] bytes = readElement(source);
        target.writeInt(bytes.length);
        target.write(bytes);
    }

    /**
     * Reads one element: its length, then its bytes into an array that grows as they arrive, so
     * that a damaged length over truncated input fails having allocated about what was there.
     */
    private static byte[] readElement(DataInputView source) throws IOException {
        int length;
        try {
            length = source.readInt();
        } catch (EOFException e) {
            throw corrupted("it ends where an element's length should be", e);
        }
        if (length < 0 || length > MAX_ELEMENT_LENGTH) {
            throw corrupted("an element length of " + length + " bytes is outside 0.." + MAX_ELEMENT_LENGTH, null);
        }
        byte[] bytes = new byte[Math.min(length, FIRST_READ)];
        int filled = 0;
        try {
            while (true) {
                source.readFully(bytes, filled, bytes.length - filled);
                filled = bytes.length;
                if (filled == length) {
                    return bytes;
                }
                bytes = Arrays.copyOf(bytes, (int) Math.min(length, 2L * filled));
            }
        } catch (EOFException e) {
            throw corrupted("it ends inside an element that declares " + length + " bytes (fewer than "
                    + bytes.length + " are there)", e);
        }
    }

    @Override
    public boolean equals(Object obj) {
        return obj instanceof SinkFunctionStateSerializer;
    }

    @Override
    public int hashCode() {
        return SinkFunctionStateSerializer.class.hashCode();
    }

    @Override
    public TypeSerializerSnapshot<Object> snapshotConfiguration() {
        return new Snapshot();
    }

    /** The snapshot: a version and nothing else, since the element framing is fixed. */
    public static final class Snapshot implements TypeSerializerSnapshot<Object> {
        static final int CURRENT_VERSION = 1;

        @Override
        public int getCurrentVersion() {
            return CURRENT_VERSION;
        }

        @Override
        public void writeSnapshot(DataOutputView out) {
            // The version, which Flink writes, is all there is.
        }

        @Override
        public void readSnapshot(int readVersion, DataInputView in, ClassLoader userCodeClassLoader)
                throws IOException {
            if (readVersion != CURRENT_VERSION) {
                throw new IOException("the SinkFunction state of twopc has serializer snapshot version "
                        + readVersion + ", but this release reads version " + CURRENT_VERSION
                        + "; upgrade twopc to the release that wrote the savepoint, or a newer one");
            }
        }

        @Override
        public TypeSerializer<Object> restoreSerializer() {
            return new SinkFunctionStateSerializer();
        }

        @Override
        public TypeSerializerSchemaCompatibility<Object> resolveSchemaCompatibility(
                TypeSerializerSnapshot<Object> oldSerializerSnapshot) {
            if (oldSerializerSnapshot instanceof Snapshot) {
                return TypeSerializerSchemaCompatibility.compatibleAsIs();
            }
            if (FLINK_120_SNAPSHOT_CLASS.equals(oldSerializerSnapshot.getClass().getName())) {
                // Earlier releases, under Flink's own serializer: the restored state is already
                // objects, which this serializer writes from now on.
                return TypeSerializerSchemaCompatibility.compatibleAfterMigration();
            }
            return TypeSerializerSchemaCompatibility.incompatible();
        }
    }
}
