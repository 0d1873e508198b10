package io.twopc.flink.table;

import io.twopc.flink.TwopcRecordRejectedException;

import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;

import org.junit.Test;

import java.nio.charset.StandardCharsets;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * A row a deterministic format cannot serialize is a refused record (the job stops once); other
 * formats' failures stay theirs (Flink's restart strategy), and rows that serialize pass through.
 */
public class FormatRowSchemaTest {
    /** Throws for a row whose only field is negative, as a format meets a value it has no form for. */
    private static final SerializationSchema<RowData> ENCODER = row -> {
        long v = row.getLong(0);
        if (v < 0) {
            throw new IllegalArgumentException("no form for " + v);
        }
        return Long.toString(v).getBytes(StandardCharsets.UTF_8);
    };

    @Test
    public void aDeterministicFormatsFailureIsARefusedRecord() {
        SerializationSchema<RowData> json = FormatRowSchema.of(ENCODER, "json", "orders");
        assertThat(json.serialize(GenericRowData.of(7L))).isEqualTo("7".getBytes(StandardCharsets.UTF_8));
        assertThatThrownBy(() -> json.serialize(GenericRowData.of(-1L)))
                .isInstanceOf(TwopcRecordRejectedException.class)
                .hasMessageContaining("table orders")
                .hasMessageContaining("'json' format cannot serialize")
                .hasMessageContaining("no form for -1");
    }

    /**
     * Flink's encoders wrap the reason in an exception that quotes the whole row: the refusal
     * gives the reason and keeps the row's values out of its message and its causes.
     */
    @Test
    public void theReasonIsTheInnermostCauseAndTheRowIsNotQuoted() {
        SerializationSchema<RowData> wrapping = row -> {
            throw new RuntimeException("Could not serialize row '" + row + "'.",
                    new RuntimeException("Fail to serialize at field: m.",
                            new UnsupportedOperationException("null map keys are not supported")));
        };
        GenericRowData secret = GenericRowData.of(StringData.fromString("password=hunter2"));
        assertThatThrownBy(() -> FormatRowSchema.of(wrapping, "json", "orders").serialize(secret))
                .isInstanceOf(TwopcRecordRejectedException.class)
                .hasMessageContaining("Fail to serialize at field: m. null map keys are not supported")
                .hasRootCauseInstanceOf(UnsupportedOperationException.class)
                .satisfies(e -> {
                    for (Throwable t = e; t != null; t = t.getCause()) {
                        assertThat(String.valueOf(t.getMessage())).doesNotContain("hunter2");
                    }
                });
    }

    @Test
    public void otherFormatsKeepTheirOwnFailures() {
        assertThat(FormatRowSchema.of(ENCODER, "avro-confluent", "orders")).isSameAs(ENCODER);
        assertThat(FormatRowSchema.of(ENCODER, null, "orders")).isSameAs(ENCODER);
        assertThatThrownBy(() -> FormatRowSchema.of(ENCODER, "avro-confluent", "orders")
                .serialize(GenericRowData.of(-1L))).isInstanceOf(IllegalArgumentException.class);
    }
}
