package io.twopc.flink;

import org.apache.flink.core.io.SimpleVersionedSerialization;
import org.junit.Test;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Golden savepoint-state vectors of the Sink V2 serializers, in {@code tests/vectors/java/}: the
 * bytes Flink stores for a committable and for a writer state (Flink's version-and-length framing
 * around our serializers' output, which is the core's envelope, itself in the Rust vectors). A
 * later release must read them, and must write the same bytes for the same value, or savepoints
 * break across an upgrade.
 *
 * <p>Regenerate only when adding a vector: {@code -Dtwopc.writeVectors=true}.
 */
public class SerializerVectorsTest {
    static Path vectors() {
        String root = System.getProperty("twopc.repoRoot");
        assertThat(root).as("system property twopc.repoRoot (set by build.gradle)").isNotNull();
        return Paths.get(root, "tests", "vectors");
    }

    /** Checks (or, when asked, writes) the vector {@code name} for {@code framed}. */
    static byte[] golden(String name, byte[] framed) throws Exception {
        Path file = vectors().resolve("java").resolve(name);
        if (Boolean.getBoolean("twopc.writeVectors")) {
            Files.write(file, framed);
        }
        assertThat(file).as("golden vector").exists();
        byte[] stored = Files.readAllBytes(file);
        assertThat(framed).as("%s: this release writes other bytes for the same value", name).isEqualTo(stored);
        return stored;
    }

    @Test
    public void committablesReadAndWriteTheirGoldenBytes() throws Exception {
        byte[] handle = Files.readAllBytes(vectors().resolve("handle-prepared-v1.bin"));
        TwopcCommittableSerializer serializer = new TwopcCommittableSerializer();
        for (boolean endOfInput : new boolean[] {false, true}) {
            String name = endOfInput ? "committable-v2-end-of-input.bin" : "committable-v2.bin";
            byte[] stored = golden(name, SimpleVersionedSerialization.writeVersionAndSerialize(serializer,
                    new TwopcCommittable(handle, endOfInput)));
            TwopcCommittable read = SimpleVersionedSerialization.readVersionAndDeSerialize(serializer, stored);
            assertThat(read.handle()).isEqualTo(handle);
            assertThat(read.isEndOfInput()).as(name).isEqualTo(endOfInput);
        }
    }

    @Test
    public void committablesOfEarlierReleasesAreReadWithoutTheEndOfInputMark() throws Exception {
        // Version 1, written by releases before the mark: the handle's bytes alone.
        byte[] handle = Files.readAllBytes(vectors().resolve("handle-prepared-v1.bin"));
        byte[] stored = Files.readAllBytes(vectors().resolve("java").resolve("committable-v1.bin"));
        TwopcCommittable read =
                SimpleVersionedSerialization.readVersionAndDeSerialize(new TwopcCommittableSerializer(), stored);
        assertThat(read.handle()).isEqualTo(handle);
        assertThat(read.isEndOfInput()).isFalse();
    }

    @Test
    public void aDamagedCommittableIsRefusedAsCorrupted() {
        TwopcCommittableSerializer serializer = new TwopcCommittableSerializer();
        for (byte[] bad : new byte[][] {new byte[0], {2, 'T', 'W'}, {(byte) 0x81}}) {
            assertThatThrownBy(() -> serializer.deserialize(2, bad))
                    .hasMessageContaining("twopc committable state is corrupted")
                    .hasMessageContaining("Restore from another checkpoint or savepoint")
                    // Every restart would restore the same bytes: the job stops once.
                    .hasCauseInstanceOf(org.apache.flink.runtime.execution.SuppressRestartsException.class);
        }
    }

    @Test
    public void writerStatesReadAndWriteTheirGoldenBytes() throws Exception {
        byte[] state = Files.readAllBytes(vectors().resolve("writer-state-v1.bin"));
        TwopcWriterStateSerializer serializer = new TwopcWriterStateSerializer();
        byte[] stored = golden("writer-state-v1.bin",
                SimpleVersionedSerialization.writeVersionAndSerialize(serializer, new TwopcWriterState(state)));
        TwopcWriterState read = SimpleVersionedSerialization.readVersionAndDeSerialize(serializer, stored);
        assertThat(read.bytes()).isEqualTo(state);
        assertThat(read.isWriterState()).isTrue();
        assertThat(read.isTransactionHandle()).isFalse();
        // The SinkFunction shim's copy of a prepared transaction, in the same state.
        byte[] handle = Files.readAllBytes(vectors().resolve("handle-prepared-v1.bin"));
        assertThat(new TwopcWriterState(handle).isTransactionHandle()).isTrue();
    }

    @Test
    public void aNewerSerializerVersionIsRefusedWithWhatToDo() {
        assertThatThrownBy(() -> new TwopcWriterStateSerializer().deserialize(2, new byte[8]))
                .hasMessageContaining("version 2")
                .hasMessageContaining("restore with the twopc release that wrote the state")
                .hasCauseInstanceOf(org.apache.flink.runtime.execution.SuppressRestartsException.class)
                .hasRootCauseInstanceOf(TwopcStateException.class);
        assertThatThrownBy(() -> new TwopcCommittableSerializer().deserialize(3, new byte[8]))
                .hasMessageContaining("version 3")
                .hasMessageContaining("restore with the twopc release that wrote the state")
                .hasCauseInstanceOf(org.apache.flink.runtime.execution.SuppressRestartsException.class);
    }
}
