package io.twopc.flink;

import io.twopc.flink.internal.SinkFunctionStateSerializer;

import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.runtime.util.EnvironmentInformation;
import org.junit.Test;

import java.nio.file.Files;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The state of Flink's {@code TwoPhaseCommitSinkFunction}, as the SinkFunction writes it, on the
 * Flink line this test runs on (1.20 in {@code test}, 2.x in {@code test2x}): a job upgraded from
 * the SinkFunction to {@code TwopcSink} carries it in every savepoint, so each line must load its
 * serializer snapshot and write its elements back byte for byte. Read from the golden vector that
 * {@code SinkFunctionStateSerializerTest} (1.20) checks against Flink's own state format.
 */
public class SinkFunctionStateCarryTest {
    @Test
    public void theSinkFunctionsStateLoadsAndIsCarriedUnchanged() throws Exception {
        byte[] stored = Files.readAllBytes(SerializerVectorsTest.vectors().resolve("java")
                .resolve("sink-function-state-v1.bin"));
        DataInputDeserializer in = new DataInputDeserializer(stored);
        int length = in.readInt();
        in.skipBytesToRead(length);
        int elementEnd = stored.length - in.available();

        // As Flink restores operator state: the snapshot first (by class name, from the user
        // class loader), then the elements with the serializer it restores.
        TypeSerializerSnapshot<Object> snapshot =
                TypeSerializerSnapshot.readVersionedSnapshot(in, getClass().getClassLoader());
        assertThat(in.available()).isZero();
        TypeSerializer<Object> serializer = snapshot.restoreSerializer();
        Object element = serializer.deserialize(new DataInputDeserializer(stored, 0, elementEnd));
        assertThat(element).as("on Flink %s", EnvironmentInformation.getVersion())
                .isInstanceOf(SinkFunctionStateSerializer.StateBytes.class);

        // As Flink snapshots it again: a deep copy, then the element and the serializer snapshot.
        DataOutputSerializer out = new DataOutputSerializer(512);
        serializer.serialize(serializer.copy(element), out);
        TypeSerializerSnapshot.writeVersionedSnapshot(out, serializer.snapshotConfiguration());
        assertThat(out.getCopyOfBuffer()).as("the state written back on Flink %s", EnvironmentInformation.getVersion())
                .isEqualTo(stored);
        assertThat(serializer.snapshotConfiguration().resolveSchemaCompatibility(snapshot).isCompatibleAsIs()).isTrue();
    }
}
