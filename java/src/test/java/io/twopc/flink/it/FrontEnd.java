package io.twopc.flink.it;

import io.twopc.flink.TwopcSink;
import io.twopc.flink.TwopcSinkBuilder;
import io.twopc.flink.TwopcSinkBuilderBase;

import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.datastream.DataStreamSink;

import java.util.function.Consumer;

/**
 * How a test job attaches the sink: the same settings through either front end. The integration
 * tests are written once against this; they run with {@link #SINK_V2} on Flink 1.20 and 2.x, and
 * the SinkFunction shim's test classes (source set legacyTest) run them again through {@code
 * addSink} on 1.20.
 */
public abstract class FrontEnd {
    /** {@code stream.sinkTo(TwopcSink)}: Flink 1.20 and 2.x. */
    public static final FrontEnd SINK_V2 = new FrontEnd("Sink V2") {
        @Override
        public <IN> DataStreamSink<IN> attach(DataStream<IN> stream, Consumer<TwopcSinkBuilderBase<IN, ?>> settings) {
            TwopcSinkBuilder<IN> builder = TwopcSink.builder();
            settings.accept(builder);
            return stream.sinkTo(builder.build());
        }
    };

    private final String name;

    protected FrontEnd(String name) {
        this.name = name;
    }

    /** Builds the sink with {@code settings} and adds it to {@code stream}. */
    public abstract <IN> DataStreamSink<IN> attach(DataStream<IN> stream, Consumer<TwopcSinkBuilderBase<IN, ?>> settings);

    @Override
    public String toString() {
        return name;
    }
}
