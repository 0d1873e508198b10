package io.twopc.flink.internal;

import static org.assertj.core.api.Assertions.assertThat;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.stream.Collectors;
import java.util.stream.Stream;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.junit.Test;

/**
 * The golden handle encodings in {@code tests/vectors/} (written by the core's
 * golden_vectors test) decode through the JNI library to the fields their
 * sibling {@code .json} files list: checkpoint state written by this release
 * stays readable from Java.
 */
public class GoldenVectorsTest {
    private static final String[] FIELDS = {
        "sink", "transaction", "lineage", "run", "subtask", "parallelism", "begunAtMs", "state",
        "checkpoint", "records", "bytes", "preparedAtMs",
    };

    static Path vectorsDir() {
        String root = System.getProperty("twopc.repoRoot");
        assertThat(root).as("system property twopc.repoRoot (set by build.gradle)").isNotNull();
        return Paths.get(root, "tests", "vectors");
    }

    @Test
    public void everyVectorDecodesToItsFields() throws Exception {
        List<Path> bins;
        try (Stream<Path> files = Files.list(vectorsDir())) {
            bins = files.filter(p -> p.getFileName().toString().matches("handle-.*\\.bin"))
                    .sorted()
                    .collect(Collectors.toList());
        }
        assertThat(bins).as("handle-*.bin vectors in " + vectorsDir()).isNotEmpty();
        List<String> checked = new ArrayList<>();
        for (Path bin : bins) {
            String name = bin.getFileName().toString().replaceAll("\\.bin$", "");
            Path json = bin.resolveSibling(name + ".json");
            assertThat(json).as("expected fields of " + name).exists();
            // Both sides parsed by one mapper: u64 values beyond Long.MAX_VALUE
            // become the same BigInteger nodes and compare exactly.
            JsonNode expected = NativeTestSupport.JSON.readTree(json.toFile());
            JsonNode actual = NativeTestSupport.JSON.readTree(NativeBridge.describeHandle(Files.readAllBytes(bin)));
            for (String field : FIELDS) {
                assertThat(expected.has(field)).as(name + ".json has " + field).isTrue();
                assertThat(actual.get(field)).as(name + ": " + field).isEqualTo(expected.get(field));
            }
            for (Iterator<String> it = expected.fieldNames(); it.hasNext(); ) {
                String field = it.next();
                assertThat(actual.get(field)).as(name + ": " + field).isEqualTo(expected.get(field));
            }
            assertThat(actual.size()).as(name + ": no fields beyond the vector's").isEqualTo(expected.size());
            checked.add(name);
        }
        assertThat(checked).isNotEmpty();
    }
}
