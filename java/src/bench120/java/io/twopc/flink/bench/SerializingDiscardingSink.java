package io.twopc.flink.bench;

import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.streaming.api.functions.sink.SinkFunction;

/**
 * The ceiling as the benchmark's brief defines it: "source and serialisation cost only". Each
 * record is serialized with the schema the byte-writing sinks use ({@code SimpleStringSchema}:
 * the string's UTF-8 bytes), and the bytes are dropped. Flink's own {@code DiscardingSink} drops
 * the record object without serializing it, so it is a ceiling no sink that writes bytes can
 * approach; the report shows both.
 */
final class SerializingDiscardingSink implements SinkFunction<String> {
    private static final long serialVersionUID = 1L;

    private final SerializationSchema<String> schema;
    /** Keeps the JIT from dropping the serialization as dead code. */
    private long bytes;

    SerializingDiscardingSink(SerializationSchema<String> schema) {
        this.schema = schema;
    }

    @Override
    public void invoke(String value, Context context) {
        bytes += schema.serialize(value).length;
    }
}
