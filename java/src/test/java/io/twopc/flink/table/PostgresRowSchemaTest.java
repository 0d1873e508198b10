package io.twopc.flink.table;

import io.twopc.flink.TwopcRecordRejectedException;

import org.apache.flink.table.data.GenericArrayData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.binary.BinaryRowData;
import org.apache.flink.table.data.writer.BinaryRowWriter;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.data.TimestampData;
import org.apache.flink.table.types.logical.ArrayType;
import org.apache.flink.table.types.logical.BigIntType;
import org.apache.flink.table.types.logical.DateType;
import org.apache.flink.table.types.logical.TimeType;
import org.apache.flink.table.types.logical.DoubleType;
import org.apache.flink.table.types.logical.DecimalType;
import org.apache.flink.table.types.logical.LocalZonedTimestampType;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.RowType;
import org.apache.flink.table.types.logical.TimestampType;
import org.apache.flink.table.types.logical.VarCharType;
import org.apache.flink.types.RowKind;

import org.junit.Test;

import java.nio.charset.StandardCharsets;
import java.time.LocalDateTime;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

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
    public void anAppendOnlyTableRefusesRowsOtherThanInserts() {
        PostgresRowSchema schema = new PostgresRowSchema(ROW, false);
        for (RowKind kind : new RowKind[] {RowKind.DELETE, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER}) {
            assertThatThrownBy(() -> schema.serialize(row(kind)))
                    .isInstanceOf(TwopcRecordRejectedException.class)
                    .hasMessageContaining("row of kind " + kind).hasMessageContaining("'sink.mode' = 'idempotent'");
        }
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

    /** UTF-8 cannot encode an unpaired surrogate: refused, naming the column; a pair is written. */
    @Test
    public void anUnpairedSurrogateIsRefusedNamingItsColumn() {
        RowType named = RowType.of(new LogicalType[] {new BigIntType(false), new VarCharType(VarCharType.MAX_LENGTH),
                new ArrayType(new VarCharType(VarCharType.MAX_LENGTH))}, new String[] {"id", "name", "tags"});
        PostgresRowSchema schema = new PostgresRowSchema(named, false);
        assertThat(text(schema, GenericRowData.of(1L, StringData.fromString("a\uD83D\uDE00"), null)))
                .isEqualTo("1\ta\uD83D\uDE00\t\\N");
        assertThatThrownBy(() -> schema.serialize(GenericRowData.of(1L, StringData.fromString("a\uD800b"), null)))
                .isInstanceOf(TwopcRecordRejectedException.class)
                .hasMessageContaining("column 'name'")
                .hasMessageContaining("unpaired UTF-16 surrogate");
        assertThatThrownBy(() -> schema.serialize(GenericRowData.of(1L, null,
                new GenericArrayData(new Object[] {StringData.fromString("\uDC00")}))))
                .isInstanceOf(TwopcRecordRejectedException.class)
                .hasMessageContaining("column 'tags'");
    }

    /**
     * A value with more fraction digits than its column declares (Flink does not cut values that
     * reach a table from a DataStream or a function) is cut to the declared precision, towards the
     * earlier instant, before 1970 too; PostgreSQL would round it, here into the next year.
     */
    @Test
    public void timestampFractionsAreCutToTheDeclaredPrecisionNotRounded() {
        LocalDateTime last = LocalDateTime.of(2024, 12, 31, 23, 59, 59, 999_999_999);
        assertThat(PostgresRowSchema.timestamp(last, 6, false)).isEqualTo("2024-12-31 23:59:59.999999000");
        assertThat(PostgresRowSchema.timestamp(last, 3, true)).isEqualTo("2024-12-31 23:59:59.999000000+00");
        assertThat(PostgresRowSchema.timestamp(last, 0, false)).isEqualTo("2024-12-31 23:59:59.000000000");
        LocalDateTime before1970 = LocalDateTime.of(1969, 12, 31, 23, 59, 59, 999_999_900);
        assertThat(PostgresRowSchema.timestamp(before1970, 6, false)).isEqualTo("1969-12-31 23:59:59.999999000");
        assertThat(PostgresRowSchema.timestamp(before1970, 0, false)).isEqualTo("1969-12-31 23:59:59.000000000");
        RowType types = RowType.of(new TimestampType(3), new LocalZonedTimestampType(6));
        TimestampData value = TimestampData.fromLocalDateTime(last);
        assertThat(text(new PostgresRowSchema(types, false), GenericRowData.of(value, value)))
                .isEqualTo("2024-12-31 23:59:59.999000000\t2024-12-31 23:59:59.999999000+00");
    }

    /** The names the native start-up check compares with the PostgreSQL columns' types. */
    @Test
    public void declaredTypesNameEachColumnsTypeForTheStartUpCheck() {
        RowType types = RowType.of(new DecimalType(10, 4), new TimestampType(3), new LocalZonedTimestampType(6),
                new ArrayType(new DoubleType()), new VarCharType(10), new TimeType(0), new DateType(),
                new BigIntType());
        assertThat(PostgresRowSchema.declaredTypes(types)).containsExactly("decimal:10:4", "timestamp:3",
                "timestamp_ltz:6", "array:double", "string", "time:3", "date", "bigint");
    }
}
