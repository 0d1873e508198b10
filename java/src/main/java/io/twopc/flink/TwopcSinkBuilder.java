package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/**
 * Builds a {@link TwopcSink} (Sink V2, for {@code stream.sinkTo(...)} on Flink 1.20 and 2.x), in
 * the style of Flink's {@code FileSink} and {@code KafkaSink} builders:
 *
 * <pre>{@code
 * TwopcSink<String> sink = TwopcSink.<String>builder()
 *         .forDirectory("/data/out/orders")
 *         .setSinkId("orders")
 *         .setSerializationSchema(new SimpleStringSchema())
 *         .build();
 * stream.sinkTo(sink).uid("orders-sink");
 * }</pre>
 *
 * <p>The settings are those of {@link TwopcSinkBuilderBase}. {@link #build()} checks everything at
 * once and reports every problem in one {@link TwopcConfigException}, each with what to change.
 *
 * @param <IN> the type of records written
 */
@PublicEvolving
public final class TwopcSinkBuilder<IN> extends TwopcSinkBuilderBase<IN, TwopcSinkBuilder<IN>> {
    TwopcSinkBuilder() {}

    @Override
    protected TwopcSinkBuilder<IN> self() {
        return this;
    }

    /**
     * Validates every setting and builds the sink.
     *
     * @throws TwopcConfigException listing each setting that cannot work and what to change
     */
    public TwopcSink<IN> build() {
        TwopcSinkOptions options = buildOptions("TwopcSink");
        return new TwopcSink<>(options, serializationSchema);
    }
}
