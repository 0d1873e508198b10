package io.twopc.flink.it;

import io.twopc.flink.TwopcTransaction;
import io.twopc.flink.TwopcTransactionSerializer;
import io.twopc.flink.internal.SinkFunctionStateSerializer;

import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.base.StringSerializer;
import org.apache.flink.api.common.typeutils.base.VoidSerializer;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.streaming.api.functions.sink.TwoPhaseCommitSinkFunction.State;
import org.apache.flink.streaming.api.functions.sink.TwoPhaseCommitSinkFunction.StateSerializer;
import org.apache.flink.streaming.api.functions.sink.TwoPhaseCommitSinkFunction.TransactionHolder;
import org.apache.flink.util.InstantiationUtil;

import org.junit.Test;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.Collections;
import java.util.Optional;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * {@link SinkFunctionStateSerializer} on Flink 1.20, next to Flink's own serializer of the
 * {@code TwoPhaseCommitSinkFunction} state: the bytes inside its framing are Flink's, the state of
 * earlier releases (under Flink's serializer) is taken over, and the golden vector {@code
 * tests/vectors/java/sink-function-state-v1.bin} stays readable. The Flink 2.x side (the snapshot
 * loads and the bytes are carried unchanged) is {@code SinkFunctionStateCarryTest}.
 */
@SuppressWarnings({"deprecation", "unchecked", "rawtypes"})
public class SinkFunctionStateSerializerTest {
    private static final TypeSerializer<Object> FLINK_FORMAT =
            (TypeSerializer) new StateSerializer<>(TwopcTransactionSerializer.INSTANCE, VoidSerializer.INSTANCE);
    private static final SinkFunctionStateSerializer SERIALIZER = new SinkFunctionStateSerializer(FLINK_FORMAT);

    private static Path vectors() {
        return Paths.get(System.getProperty("twopc.repoRoot"), "tests", "vectors");
    }

    /** A state as the shim snapshots it: the open transaction, and one waiting for its commit. */
    private static State<TwopcTransaction, Void> sampleState() throws IOException {
        TwopcTransaction open = new TwopcTransaction(Files.readAllBytes(vectors().resolve("handle-open-v1.bin")));
        TwopcTransaction prepared =
                new TwopcTransaction(Files.readAllBytes(vectors().resolve("handle-prepared-v1.bin")));
        return new State<>(new TransactionHolder<>(open, 1_700_000_000_123L),
                Collections.singletonList(new TransactionHolder<>(prepared, 1_700_000_000_001L)), Optional.empty());
    }

    private static byte[] flinkBytes(Object state) throws IOException {
        DataOutputSerializer out = new DataOutputSerializer(256);
        FLINK_FORMAT.serialize(state, out);
        return out.getCopyOfBuffer();
    }

    @Test
    public void anElementIsFlinksStateFormatBehindALength() throws Exception {
        State<TwopcTransaction, Void> state = sampleState();
        DataOutputSerializer out = new DataOutputSerializer(256);
        SERIALIZER.serialize(state, out);
        byte[] written = out.getCopyOfBuffer();
        byte[] flink = flinkBytes(state);
        assertThat(written.length).isEqualTo(4 + flink.length);
        assertThat(new DataInputDeserializer(written).readInt()).isEqualTo(flink.length);
        assertThat(Arrays.copyOfRange(written, 4, written.length)).isEqualTo(flink);

        // Read back it is bytes, which the SinkFunction decodes into Flink's state object again.
        Object element = SERIALIZER.deserialize(new DataInputDeserializer(written));
        assertThat(element).isInstanceOf(SinkFunctionStateSerializer.StateBytes.class);
        assertThat(((SinkFunctionStateSerializer.StateBytes) element).bytes()).isEqualTo(flink);
        assertThat(SinkFunctionStateSerializer.decode(element, FLINK_FORMAT)).isEqualTo(state);

        // Bytes are written back as they are, by any instance (a restored one has no format).
        TypeSerializer<Object> restored = SERIALIZER.snapshotConfiguration().restoreSerializer();
        DataOutputSerializer again = new DataOutputSerializer(256);
        restored.serialize(element, again);
        assertThat(again.getCopyOfBuffer()).isEqualTo(written);
        DataOutputSerializer copied = new DataOutputSerializer(256);
        restored.copy(new DataInputDeserializer(written), copied);
        assertThat(copied.getCopyOfBuffer()).isEqualTo(written);
    }

    @Test
    public void aCopyIsTheBytesSoTheSnapshotCannotSeeLaterChanges() throws Exception {
        State<TwopcTransaction, Void> state = sampleState();
        Object copy = SERIALIZER.copy(state);
        assertThat(copy).isInstanceOf(SinkFunctionStateSerializer.StateBytes.class);
        assertThat(((SinkFunctionStateSerializer.StateBytes) copy).bytes()).isEqualTo(flinkBytes(state));
        state.setPendingCommitTransactions(Collections.emptyList());
        assertThat(SinkFunctionStateSerializer.decode(copy, FLINK_FORMAT)).isEqualTo(sampleState());
    }

    @Test
    public void aCarryingInstanceRefusesStateObjects() throws Exception {
        TypeSerializer<Object> restored = SERIALIZER.snapshotConfiguration().restoreSerializer();
        assertThatThrownBy(() -> restored.serialize(sampleState(), new DataOutputSerializer(64)))
                .isInstanceOf(IllegalStateException.class)
                .hasMessageContaining("only TwopcSinkFunction puts state objects there");
    }

    @Test
    public void theStateOfEarlierReleasesIsTakenOverAndForeignStateRefused() {
        TypeSerializerSnapshot<Object> flinkSnapshot = FLINK_FORMAT.snapshotConfiguration();
        assertThat(flinkSnapshot.getClass().getName())
                .isEqualTo("org.apache.flink.streaming.api.functions.sink.TwoPhaseCommitSinkFunction$StateSerializerSnapshot");
        assertThat(SERIALIZER.snapshotConfiguration().resolveSchemaCompatibility(flinkSnapshot)
                .isCompatibleAfterMigration()).isTrue();
        assertThat(SERIALIZER.snapshotConfiguration().resolveSchemaCompatibility(SERIALIZER.snapshotConfiguration())
                .isCompatibleAsIs()).isTrue();
        TypeSerializerSnapshot foreign = StringSerializer.INSTANCE.snapshotConfiguration();
        assertThat(SERIALIZER.snapshotConfiguration().resolveSchemaCompatibility(foreign).isIncompatible()).isTrue();
    }

    @Test
    public void damagedElementsAreRefusedWithAHint() throws Exception {
        for (int bad : new int[] {-1, Integer.MAX_VALUE, (1 << 28) + 1}) {
            DataOutputSerializer out = new DataOutputSerializer(8);
            out.writeInt(bad);
            assertThatThrownBy(() -> SERIALIZER.deserialize(new DataInputDeserializer(out.getCopyOfBuffer())))
                    .isInstanceOf(IOException.class)
                    .hasMessageContaining("corrupted")
                    .hasMessageContaining("Restore from another checkpoint or savepoint");
        }
        // Trailing bytes after Flink's state: the element is not what this release wrote.
        byte[] flink = flinkBytes(sampleState());
        DataOutputSerializer out = new DataOutputSerializer(256);
        out.writeInt(flink.length + 3);
        out.write(flink);
        out.write(new byte[] {1, 2, 3});
        Object element = SERIALIZER.deserialize(new DataInputDeserializer(out.getCopyOfBuffer()));
        assertThatThrownBy(() -> SinkFunctionStateSerializer.decode(element, FLINK_FORMAT))
                .isInstanceOf(IOException.class)
                .hasMessageContaining("3 bytes follow");
    }

    /** Bytes this thread allocated so far (HotSpot's count). */
    private static long allocatedBytes() {
        return ((com.sun.management.ThreadMXBean) java.lang.management.ManagementFactory.getThreadMXBean())
                .getThreadAllocatedBytes(Thread.currentThread().getId());
    }

    @Test
    public void truncatedElementsAreCorruptedStateAndCostOnlyTheBytesThatAreThere() throws Exception {
        TypeSerializer<Object> restored = SERIALIZER.snapshotConfiguration().restoreSerializer();
        byte[] flink = flinkBytes(sampleState());
        // A whole element's length, but only part of its bytes; and a length close to the bound
        // with almost nothing behind it, as damage or a hostile file gives.
        DataOutputSerializer cut = new DataOutputSerializer(256);
        cut.writeInt(flink.length);
        cut.write(flink, 0, flink.length / 2);
        DataOutputSerializer huge = new DataOutputSerializer(64);
        huge.writeInt((1 << 28) - 1);
        huge.write(new byte[] {1, 2, 3});
        for (byte[] input : Arrays.asList(cut.getCopyOfBuffer(), huge.getCopyOfBuffer())) {
            long before = allocatedBytes();
            assertThatThrownBy(() -> SERIALIZER.deserialize(new DataInputDeserializer(input)))
                    .isInstanceOf(IOException.class)
                    .isNotInstanceOf(java.io.EOFException.class)
                    .hasMessageContaining("the SinkFunction state of twopc is corrupted")
                    .hasMessageContaining("it ends inside an element that declares")
                    .hasMessageContaining("Restore from another checkpoint or savepoint");
            assertThat(allocatedBytes() - before).as("bytes allocated reading %d bytes of input", input.length)
                    .isLessThan(8 << 20);
            assertThatThrownBy(() -> restored.copy(new DataInputDeserializer(input), new DataOutputSerializer(64)))
                    .isInstanceOf(IOException.class)
                    .hasMessageContaining("corrupted");
        }
        assertThatThrownBy(() -> SERIALIZER.deserialize(new DataInputDeserializer(new byte[] {0, 0})))
                .isInstanceOf(IOException.class)
                .hasMessageContaining("corrupted: it ends where an element's length should be");
    }

    @Test
    public void anElementCutShortInsideFlinksFormatIsCorruptedState() throws Exception {
        byte[] flink = flinkBytes(sampleState());
        for (int cut : new int[] {1, 5, flink.length / 2}) {
            byte[] truncated = Arrays.copyOf(flink, flink.length - cut);
            DataOutputSerializer out = new DataOutputSerializer(256);
            out.writeInt(truncated.length);
            out.write(truncated);
            Object element = SERIALIZER.deserialize(new DataInputDeserializer(out.getCopyOfBuffer()));
            assertThatThrownBy(() -> SinkFunctionStateSerializer.decode(element, FLINK_FORMAT))
                    .as("%d bytes cut", cut)
                    .isInstanceOf(IOException.class)
                    .isNotInstanceOf(java.io.EOFException.class)
                    .hasMessageContaining("the SinkFunction state of twopc is corrupted: it ends inside")
                    .hasMessageContaining("Restore from another checkpoint or savepoint");
        }
    }

    @Test
    public void aSnapshotOfANewerReleaseIsRefusedWithAnUpgradeHint() {
        assertThatThrownBy(() -> new SinkFunctionStateSerializer.Snapshot()
                .readSnapshot(2, new DataInputDeserializer(new byte[0]), getClass().getClassLoader()))
                .isInstanceOf(IOException.class)
                .hasMessageContaining("upgrade twopc");
    }

    /**
     * The golden vector: an element as the shim writes it, then the serializer snapshot Flink
     * stores. Regenerate only when adding a vector ({@code -Dtwopc.writeVectors=true}).
     */
    @Test
    public void goldenSinkFunctionStateReadsAndWritesTheSameBytes() throws Exception {
        DataOutputSerializer out = new DataOutputSerializer(512);
        SERIALIZER.serialize(sampleState(), out);
        TypeSerializerSnapshot.writeVersionedSnapshot(out, SERIALIZER.snapshotConfiguration());
        byte[] written = out.getCopyOfBuffer();
        Path file = vectors().resolve("java").resolve("sink-function-state-v1.bin");
        if (Boolean.getBoolean("twopc.writeVectors")) {
            Files.write(file, written);
        }
        byte[] stored = Files.readAllBytes(file);
        assertThat(written).as("this release writes other bytes for the same SinkFunction state").isEqualTo(stored);
        DataInputDeserializer in = new DataInputDeserializer(stored);
        Object element = SERIALIZER.deserialize(in);
        TypeSerializerSnapshot<Object> snapshot = TypeSerializerSnapshot.readVersionedSnapshot(in, getClass().getClassLoader());
        assertThat(SinkFunctionStateSerializer.decode(element, FLINK_FORMAT)).isEqualTo(sampleState());
        assertThat(SERIALIZER.snapshotConfiguration().resolveSchemaCompatibility(snapshot).isCompatibleAsIs()).isTrue();
    }

    @Test
    public void serializerSurvivesJavaSerializationAndDuplicationWithItsStateFormat() throws Exception {
        // equals() ignores the state format, so check what it does: a clone or a duplicate
        // still writes Flink's state objects, byte for byte as the original.
        DataOutputSerializer original = new DataOutputSerializer(256);
        SERIALIZER.serialize(sampleState(), original);
        for (TypeSerializer<Object> copy : java.util.Arrays.asList(
                InstantiationUtil.clone(SERIALIZER), SERIALIZER.duplicate())) {
            assertThat(copy).isEqualTo(SERIALIZER);
            DataOutputSerializer out = new DataOutputSerializer(256);
            copy.serialize(sampleState(), out);
            assertThat(out.getCopyOfBuffer()).isEqualTo(original.getCopyOfBuffer());
        }
        assertThat(SERIALIZER.duplicate()).isNotSameAs(SERIALIZER);
    }
}
