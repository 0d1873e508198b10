package io.twopc.flink.it;

import io.twopc.flink.TwopcConfigException;
import io.twopc.flink.TwopcSinkFunction;

import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.util.InstantiationUtil;

import org.junit.Test;

import java.time.Duration;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The SinkFunction shim's builder shares its settings and checks with the Sink V2 builder (see
 * {@code TwopcSinkBuilderTest}); this checks that it builds a shippable function and names itself.
 */
public class TwopcSinkFunctionBuilderTest {
    @Test
    public void aValidConfigurationBuildsASerializableSinkFunction() throws Exception {
        TwopcSinkFunction<String> sink = TwopcSinkFunction.<String>forDirectory("/data/out")
                .setSinkId("orders")
                .setSerializationSchema(new SimpleStringSchema())
                .setRetention(Duration.ofHours(2))
                .build();
        TwopcSinkFunction<String> copy = InstantiationUtil.clone(sink);
        assertThat(copy.getSinkId()).isEqualTo("orders");
    }

    @Test
    public void mistakesAreRefusedAtBuildNamingTheFunction() {
        assertThatThrownBy(() -> TwopcSinkFunction.<String>forDirectory("/data/out")
                        .setSinkId("orders")
                        .setSerializationSchema(new SimpleStringSchema())
                        .setBatchSize(0)
                        .build())
                .isInstanceOf(TwopcConfigException.class)
                .hasMessageStartingWith("cannot build TwopcSinkFunction 'orders': batch size 0");
    }
}
