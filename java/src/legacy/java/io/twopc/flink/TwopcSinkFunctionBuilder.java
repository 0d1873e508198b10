package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/**
 * Builds a {@link TwopcSinkFunction}, the SinkFunction shim for {@code stream.addSink(...)} on
 * Flink 1.20. Its settings are those of {@link TwopcSinkBuilderBase}, shared with {@link
 * TwopcSinkBuilder}; on 2.x, and for new jobs on 1.20, build a {@link TwopcSink} instead.
 *
 * @param <IN> the type of records written
 */
@PublicEvolving
public final class TwopcSinkFunctionBuilder<IN> extends TwopcSinkBuilderBase<IN, TwopcSinkFunctionBuilder<IN>> {
    TwopcSinkFunctionBuilder() {}

    @Override
    protected TwopcSinkFunctionBuilder<IN> self() {
        return this;
    }

    /**
     * Validates every setting and builds the sink function.
     *
     * @throws TwopcConfigException listing each setting that cannot work and what to change
     */
    public TwopcSinkFunction<IN> build() {
        TwopcSinkOptions options = buildOptions("TwopcSinkFunction");
        return new TwopcSinkFunction<>(options, serializationSchema);
    }
}
