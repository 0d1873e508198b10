package io.twopc.flink.bench;

import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;

import java.nio.file.Path;

/**
 * The benchmark's line-specific sinks on Flink 2.x, where SinkFunction is gone: Flink's Sink V2
 * {@code DiscardingSink} and the serialization ceiling as a Sink V2 sink. The SinkFunction shim
 * and Flink's JDBC connector do not exist here (see java/src/bench120).
 */
final class LineSinks {
    static final String LINE = "2.x";

    private LineSinks() {}

    /** Attaches {@code sink} if it is one of these; false otherwise. */
    static boolean attach(String sink, DataStream<String> stream, Path dir, String pgUrl) {
        switch (sink) {
            case "discard":
                stream.sinkTo(new DiscardingSink<>()).uid("sink").name("discard");
                return true;
            case "discard-serialized":
                stream.sinkTo(new SerializingDiscardingSink(new SimpleStringSchema()))
                        .uid("sink").name("discard-serialized");
                return true;
            default:
                return false;
        }
    }

    /**
     * The ceiling (see the 1.20 version): each record serialized with the byte-writing sinks'
     * schema, the bytes dropped.
     */
    static final class SerializingDiscardingSink implements Sink<String> {
        private static final long serialVersionUID = 1L;
        private final SerializationSchema<String> schema;

        SerializingDiscardingSink(SerializationSchema<String> schema) {
            this.schema = schema;
        }

        @Override
        public SinkWriter<String> createWriter(WriterInitContext context) {
            return new SinkWriter<String>() {
                /** Keeps the JIT from dropping the serialization as dead code. */
                private long bytes;

                @Override
                public void write(String element, Context ctx) {
                    bytes += schema.serialize(element).length;
                }

                @Override
                public void flush(boolean endOfInput) {}

                @Override
                public void close() {}
            };
        }
    }
}
