package io.twopc.flink.table;

import org.apache.flink.table.data.GenericArrayData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.binary.BinaryRowData;
import org.apache.flink.table.data.writer.BinaryRowWriter;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.types.logical.ArrayType;
import org.apache.flink.table.types.logical.BigIntType;
import org.apache.flink.table.types.logical.RowType;
import org.apache.flink.table.types.logical.VarCharType;
import org.apache.flink.types.RowKind;

import org.junit.Test;

import java.nio.charset.StandardCharsets;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The exact COPY text rows of the SQL connector's PostgreSQL tables: escaping, NULLs, array
 * literals, and the operation field of idempotent mode for every kind of change. (The round trip
 * of every type through a real server is {@link TwopcTablePostgresTypesITCase}'s.)
 */
public class PostgresRowSchemaTest {
    private static final RowType ROW = RowType.of(new BigIntType(false), new VarCharType(VarCharType.MAX_LENGTH),
            new ArrayType(new VarCharType(VarCharType.MAX_LENGTH)));

    private static String text(PostgresRowSchema schema, RowData row) {
        return new String(schema.serialize(row), StandardCharsets.UTF_8);
    }

    private static GenericRowData row(RowKind kind) {
        GenericRowData row = GenericRowData.ofKind(kind, 7L, StringData.fromString("a\tb\\c\nd\re"),
                new GenericArrayData(new Object[] {StringData.fromString("NULL"), null, StringData.fromString("q\"\\,")}));
        return row;
    }

    @Test
    public void transactionalRowsAreCopyTextWithoutAnOperation() {
        assertThat(text(new PostgresRowSchema(ROW, false), row(RowKind.INSERT)))
                .isEqualTo("7\ta\\tb\\\\c\\nd\\re\t{\"NULL\",NULL,\"q\\\\\"\\\\\\\\,\"}");
        assertThat(text(new PostgresRowSchema(ROW, false), GenericRowData.of(8L, null, null))).isEqualTo("8\t\\N\t\\N");
    }

    @Test
    public void aNullInANotNullColumnIsWrittenAsNullNotAsZero() {
        // A source or function may send null in spite of a NOT NULL type. Written as NULL,
        // PostgreSQL refuses it in a NOT NULL column and the sink names the row; read with Flink's
        // NOT NULL getter it would become 0 (binary rows) or a NullPointerException (generic ones).
        BinaryRowData binary = new BinaryRowData(3);
        BinaryRowWriter writer = new BinaryRowWriter(binary);
        writer.setNullAt(0);
        writer.writeString(1, StringData.fromString("x"));
        writer.setNullAt(2);
        writer.complete();
        assertThat(text(new PostgresRowSchema(ROW, false), binary)).isEqualTo("\\N\tx\t\\N");
        assertThat(text(new PostgresRowSchema(ROW, false), GenericRowData.of(null, null, null)))
                .isEqualTo("\\N\t\\N\t\\N");
    }

    @Test
    public void idempotentRowsEndWithTheOperationOfTheirKind() {
        PostgresRowSchema schema = new PostgresRowSchema(ROW, true);
        assertThat(text(schema, row(RowKind.INSERT))).endsWith("}\tU");
        assertThat(text(schema, row(RowKind.UPDATE_AFTER))).endsWith("}\tU");
        assertThat(text(schema, row(RowKind.DELETE))).endsWith("}\tD");
        // The planner sends UPDATE_BEFORE to an upsert table when a filter follows an aggregation:
        // the key's old row goes (a following UPDATE_AFTER writes the new one).
        assertThat(text(schema, row(RowKind.UPDATE_BEFORE))).endsWith("}\tD");
    }
}
