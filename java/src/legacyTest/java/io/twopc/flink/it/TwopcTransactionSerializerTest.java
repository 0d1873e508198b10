package io.twopc.flink.it;

import io.twopc.flink.TwopcTransaction;
import io.twopc.flink.TwopcTransactionSerializer;

import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSchemaCompatibility;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.base.StringSerializer;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.util.InstantiationUtil;

import org.junit.Test;

import java.io.IOException;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The transaction serializer puts the core's handle bytes into Flink state unchanged, versions its
 * own layout through its snapshot, and refuses damaged or newer state with a clear message.
 */
public class TwopcTransactionSerializerTest {
    private static final TwopcTransactionSerializer SERIALIZER = TwopcTransactionSerializer.INSTANCE;

    private static byte[] sampleHandle() {
        byte[] handle = new byte[173];
        for (int i = 0; i < handle.length; i++) {
            handle[i] = (byte) (i * 31 + 7);
        }
        return handle;
    }

    @Test
    public void handleBytesRoundTripUnchanged() throws IOException {
        TwopcTransaction txn = new TwopcTransaction(sampleHandle());
        DataOutputSerializer out = new DataOutputSerializer(64);
        SERIALIZER.serialize(txn, out);
        assertThat(out.length()).isEqualTo(4 + 173);

        TwopcTransaction back = SERIALIZER.deserialize(new DataInputDeserializer(out.getCopyOfBuffer()));
        assertThat(back).isEqualTo(txn);
        assertThat(back.handle()).containsExactly(sampleHandle());

        DataOutputSerializer copied = new DataOutputSerializer(64);
        SERIALIZER.copy(new DataInputDeserializer(out.getCopyOfBuffer()), copied);
        assertThat(copied.getCopyOfBuffer()).containsExactly(out.getCopyOfBuffer());
    }

    @Test
    public void copiesAreDeepBecauseTransactionsAreMutable() {
        TwopcTransaction txn = new TwopcTransaction(sampleHandle());
        TwopcTransaction copy = SERIALIZER.copy(txn);
        assertThat(copy).isEqualTo(txn).isNotSameAs(txn);
        assertThat(copy.handle()).isNotSameAs(txn.handle());
        assertThat(SERIALIZER.isImmutableType()).isFalse();
    }

    @Test
    public void corruptLengthsAreRejectedBeforeAllocating() {
        for (int bad : new int[] {-1, Integer.MAX_VALUE, (1 << 20) + 1}) {
            DataOutputSerializer out = new DataOutputSerializer(8);
            try {
                out.writeInt(bad);
            } catch (IOException e) {
                throw new AssertionError(e);
            }
            assertThatThrownBy(() -> SERIALIZER.deserialize(new DataInputDeserializer(out.getCopyOfBuffer())))
                    .isInstanceOf(IOException.class)
                    .hasMessageContaining("twopc transaction state is corrupted")
                    .hasMessageContaining("Restore from another checkpoint or savepoint");
        }
    }

    @Test
    public void snapshotIsVersionedAndRestoresTheSerializer() throws IOException {
        TypeSerializerSnapshot<TwopcTransaction> snapshot = SERIALIZER.snapshotConfiguration();
        assertThat(snapshot.getCurrentVersion()).isEqualTo(1);
        assertThat(snapshot).isInstanceOf(org.apache.flink.api.common.typeutils.SimpleTypeSerializerSnapshot.class);

        DataOutputSerializer out = new DataOutputSerializer(64);
        TypeSerializerSnapshot.writeVersionedSnapshot(out, snapshot);
        TypeSerializerSnapshot<TwopcTransaction> restored = TypeSerializerSnapshot.readVersionedSnapshot(
                new DataInputDeserializer(out.getCopyOfBuffer()), getClass().getClassLoader());

        TypeSerializer<TwopcTransaction> serializer = restored.restoreSerializer();
        assertThat(serializer).isEqualTo(SERIALIZER);
        TypeSerializerSchemaCompatibility<TwopcTransaction> compatibility =
                SERIALIZER.snapshotConfiguration().resolveSchemaCompatibility(restored);
        assertThat(compatibility.isCompatibleAsIs()).isTrue();
    }

    @Test
    @SuppressWarnings({"unchecked", "rawtypes"})
    public void foreignSnapshotsAreIncompatible() {
        TypeSerializerSnapshot foreign = StringSerializer.INSTANCE.snapshotConfiguration();
        assertThat(SERIALIZER.snapshotConfiguration().resolveSchemaCompatibility(foreign).isIncompatible()).isTrue();
    }

    @Test
    public void stateFromANewerReleaseIsRefusedWithAnUpgradeHint() {
        TwopcTransactionSerializer.Snapshot snapshot = new TwopcTransactionSerializer.Snapshot();
        assertThatThrownBy(() -> snapshot.readSnapshot(2, new DataInputDeserializer(new byte[0]),
                getClass().getClassLoader()))
                .isInstanceOf(IOException.class)
                .hasMessageContaining("upgrade twopc");
    }

    /**
     * The golden vector of the shim's state ({@code tests/vectors/java/sink-function-transaction-v1.bin}):
     * a prepared handle as this serializer writes it into the SinkFunction's savepoint, and the
     * serializer snapshot Flink stores beside it. Regenerate only when adding a vector
     * ({@code -Dtwopc.writeVectors=true}).
     */
    @Test
    public void goldenShimStateReadsAndWritesTheSameBytes() throws Exception {
        java.nio.file.Path vectors = java.nio.file.Paths.get(System.getProperty("twopc.repoRoot"), "tests", "vectors");
        byte[] handle = java.nio.file.Files.readAllBytes(vectors.resolve("handle-prepared-v1.bin"));
        DataOutputSerializer out = new DataOutputSerializer(256);
        SERIALIZER.serialize(new TwopcTransaction(handle), out);
        TypeSerializerSnapshot.writeVersionedSnapshot(out, SERIALIZER.snapshotConfiguration());
        byte[] written = out.getCopyOfBuffer();
        java.nio.file.Path file = vectors.resolve("java").resolve("sink-function-transaction-v1.bin");
        if (Boolean.getBoolean("twopc.writeVectors")) {
            java.nio.file.Files.write(file, written);
        }
        byte[] stored = java.nio.file.Files.readAllBytes(file);
        assertThat(written).as("this release writes other bytes for the same shim state").isEqualTo(stored);
        DataInputDeserializer in = new DataInputDeserializer(stored);
        assertThat(SERIALIZER.deserialize(in).handle()).isEqualTo(handle);
        TypeSerializerSnapshot<TwopcTransaction> snapshot =
                TypeSerializerSnapshot.readVersionedSnapshot(in, getClass().getClassLoader());
        assertThat(SERIALIZER.snapshotConfiguration().resolveSchemaCompatibility(snapshot).isCompatibleAsIs())
                .isTrue();
    }

    @Test
    public void serializerSurvivesJavaSerialization() throws Exception {
        assertThat(InstantiationUtil.clone(SERIALIZER)).isEqualTo(SERIALIZER);
    }
}
