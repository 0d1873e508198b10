package io.twopc.flink;

import org.apache.flink.annotation.Internal;

import org.apache.flink.api.common.typeutils.SimpleTypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.base.TypeSerializerSingleton;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputView;

import java.io.IOException;

/**
 * Writes a {@link TwopcTransaction} into Flink state as {@code [int length][handle bytes]}.
 *
 * <p>Two layers of versioning: this serializer's own layout is versioned through {@link
 * Snapshot} (Flink stores the snapshot, with its version, next to the state), and the handle
 * bytes carry the core's versioned, checksummed envelope, which the core checks when the handle
 * is used. Corrupt lengths are caught here, before any allocation, with a message that says the
 * state is damaged.
 */
@Internal
public final class TwopcTransactionSerializer extends TypeSerializerSingleton<TwopcTransaction> {
    private static final long serialVersionUID = 1L;

    public static final TwopcTransactionSerializer INSTANCE = new TwopcTransactionSerializer();

    /**
     * Far above any real handle (a few hundred bytes); a length beyond it means the state is not
     * ours or is corrupted, and reading it would only allocate garbage.
     */
    static final int MAX_HANDLE_LENGTH = 1 << 20;

    private static final byte[] EMPTY = new byte[0];

    @Override
    public boolean isImmutableType() {
        return false;
    }

    @Override
    public TwopcTransaction createInstance() {
        return new TwopcTransaction(EMPTY);
    }

    @Override
    public TwopcTransaction copy(TwopcTransaction from) {
        return from.deepCopy();
    }

    @Override
    public TwopcTransaction copy(TwopcTransaction from, TwopcTransaction reuse) {
        return from.deepCopy();
    }

    @Override
    public int getLength() {
        return -1;
    }

    @Override
    public void serialize(TwopcTransaction record, DataOutputView target) throws IOException {
        byte[] handle = record.handle();
        target.writeInt(handle.length);
        target.write(handle);
    }

    @Override
    public TwopcTransaction deserialize(DataInputView source) throws IOException {
        return new TwopcTransaction(readHandle(source));
    }

    @Override
    public TwopcTransaction deserialize(TwopcTransaction reuse, DataInputView source) throws IOException {
        return deserialize(source);
    }

    @Override
    public void copy(DataInputView source, DataOutputView target) throws IOException {
        byte[] handle = readHandle(source);
        target.writeInt(handle.length);
        target.write(handle);
    }

    private static byte[] readHandle(DataInputView source) throws IOException {
        int length = source.readInt();
        if (length < 0 || length > MAX_HANDLE_LENGTH) {
            throw new IOException("twopc transaction state is corrupted: handle length " + length
                    + " is outside 0.." + MAX_HANDLE_LENGTH + ". Restore from another checkpoint or "
                    + "savepoint.");
        }
        byte[] handle = new byte[length];
        source.readFully(handle);
        return handle;
    }

    @Override
    public TypeSerializerSnapshot<TwopcTransaction> snapshotConfiguration() {
        return new Snapshot();
    }

    /**
     * The serializer's configuration snapshot, on Flink's base class for serializers without
     * parameters. Version 1 is the {@code [int length][bytes]} layout; it has no parameters, so
     * only the version is written. The base class numbers its own layouts 2 and 3 (where 2 wrote
     * a class name); savepoints of earlier twopc releases hold version 1 with nothing after it,
     * so this snapshot keeps its own version and reading, and takes restoring, compatibility,
     * equality and hashing from the base class. A later layout bumps {@link #CURRENT_VERSION}
     * and keeps reading version 1.
     */
    public static final class Snapshot extends SimpleTypeSerializerSnapshot<TwopcTransaction> {
        static final int CURRENT_VERSION = 1;

        /** Flink instantiates snapshots reflectively when reading state. */
        public Snapshot() {
            super(() -> INSTANCE);
        }

        @Override
        public int getCurrentVersion() {
            return CURRENT_VERSION;
        }

        @Override
        public void writeSnapshot(DataOutputView out) {
            // No parameters: the version Flink writes next to the snapshot is the whole story.
        }

        @Override
        public void readSnapshot(int readVersion, DataInputView in, ClassLoader userCodeClassLoader)
                throws IOException {
            if (readVersion < 1 || readVersion > CURRENT_VERSION) {
                throw new IOException("twopc transaction state was written with serializer version "
                        + readVersion + ", but this twopc release reads versions 1.." + CURRENT_VERSION
                        + (readVersion > CURRENT_VERSION ? ": upgrade twopc to restore this state" : ""));
            }
        }
    }
}
