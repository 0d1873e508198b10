package io.twopc.flink.it;

import io.twopc.flink.TwopcSinkBuilderBase;
import io.twopc.flink.TwopcSinkFunction;
import io.twopc.flink.TwopcSinkFunctionBuilder;

import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.datastream.DataStreamSink;

import java.util.function.Consumer;

/** {@code stream.addSink(TwopcSinkFunction)}: the SinkFunction shim, Flink 1.20 only. */
final class SinkFunctionFrontEnd {
    static final FrontEnd SINK_FUNCTION = new FrontEnd("SinkFunction") {
        @Override
        public <IN> DataStreamSink<IN> attach(DataStream<IN> stream, Consumer<TwopcSinkBuilderBase<IN, ?>> settings) {
            TwopcSinkFunctionBuilder<IN> builder = TwopcSinkFunction.builder();
            settings.accept(builder);
            return stream.addSink(builder.build());
        }
    };

    private SinkFunctionFrontEnd() {}
}
