package io.twopc.flink.table;

import io.twopc.flink.TwopcRecordRejectedException;

import io.twopc.flink.internal.Surrogates;

import org.apache.flink.annotation.Internal;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.table.api.ValidationException;
import org.apache.flink.table.data.ArrayData;
import org.apache.flink.table.data.DecimalData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.TimestampData;
import org.apache.flink.table.types.logical.ArrayType;
import org.apache.flink.table.types.logical.DecimalType;
import org.apache.flink.table.types.logical.LocalZonedTimestampType;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.RowType;
import org.apache.flink.table.types.logical.TimestampType;
import org.apache.flink.types.RowKind;

import java.nio.charset.StandardCharsets;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.util.List;

/**
 * Writes each row of a PostgreSQL table of the SQL connector as one row of PostgreSQL's COPY text
 * format (tab-separated, {@code \N} for NULL, backslash escapes), the columns in the DDL's order;
 * in idempotent mode followed by one more field, the operation: {@code U} for INSERT and
 * UPDATE_AFTER, {@code D} for DELETE (and for an UPDATE_BEFORE, should the planner send one).
 *
 * <p>Every value is written in a form PostgreSQL reads back to the same value (no rounding, no
 * time zone shifts), so that a row read back equals the row written:
 *
 * <table>
 *   <caption>Flink SQL types and their text</caption>
 *   <tr><th>Flink SQL</th><th>written as</th><th>PostgreSQL column</th></tr>
 *   <tr><td>TINYINT, SMALLINT, INT, BIGINT</td><td>decimal digits</td><td>smallint, integer, bigint (or numeric)</td></tr>
 *   <tr><td>DECIMAL(p, s)</td><td>plain decimal, all {@code s} digits, no exponent</td><td>numeric(p, s)</td></tr>
 *   <tr><td>FLOAT, DOUBLE</td><td>Java's shortest text that reads back to the same binary value;
 *       {@code NaN}, {@code Infinity}, {@code -Infinity}, {@code -0.0}</td><td>real, double precision</td></tr>
 *   <tr><td>BOOLEAN</td><td>{@code t}, {@code f}</td><td>boolean</td></tr>
 *   <tr><td>CHAR, VARCHAR, STRING</td><td>the text, escaped</td><td>text, varchar, char</td></tr>
 *   <tr><td>BINARY, VARBINARY, BYTES</td><td>{@code \x} and hex digits</td><td>bytea</td></tr>
 *   <tr><td>DATE</td><td>{@code yyyy-mm-dd}, {@code BC} for years before 1</td><td>date</td></tr>
 *   <tr><td>TIME(p)</td><td>{@code hh:mm:ss.fff}</td><td>time(3) or finer</td></tr>
 *   <tr><td>TIMESTAMP(p), p &lt;= 6</td><td>{@code yyyy-mm-dd hh:mm:ss.ffffff}</td><td>timestamp</td></tr>
 *   <tr><td>TIMESTAMP_LTZ(p), p &lt;= 6</td><td>the instant in UTC, with {@code +00}</td><td>timestamptz</td></tr>
 *   <tr><td>ARRAY of any type above</td><td>a one-dimensional array literal, elements quoted as
 *       needed, {@code NULL} elements kept</td><td>the element type's array</td></tr>
 * </table>
 *
 * <p>Text cannot hold a NUL character in PostgreSQL; a row with one is refused by the sink (the
 * job stops naming it) instead of being altered. TIMESTAMP precisions above 6 (nanoseconds) are
 * refused when the table is planned, since PostgreSQL keeps microseconds.
 */
@Internal
public final class PostgresRowSchema implements SerializationSchema<RowData> {
    private static final long serialVersionUID = 1L;
    private static final char[] HEX = "0123456789abcdef".toCharArray();
    /** PostgreSQL keeps microseconds. */
    static final int MAX_TIMESTAMP_PRECISION = 6;
    /** The nanoseconds one unit of the last kept digit is worth, by the number of digits kept. */
    private static final int[] NANOS_PER_DIGITS = {
        1_000_000_000, 100_000_000, 10_000_000, 1_000_000, 100_000, 10_000, 1_000, 100, 10, 1
    };

    private final LogicalType[] types;
    private final String[] names;
    private final boolean operationField;
    private transient RowData.FieldGetter[] getters;
    private transient StringBuilder buffer;

    /**
     * @param rowType the table's physical columns, in the order of the PostgreSQL columns listed
     * @param operationField whether each row ends with the operation ({@code U} or {@code D})
     */
    public PostgresRowSchema(RowType rowType, boolean operationField) {
        this.types = rowType.getChildren().toArray(new LogicalType[0]);
        this.names = rowType.getFieldNames().toArray(new String[0]);
        this.operationField = operationField;
    }

    /**
     * Refuses, at planning, a column whose type has no exact PostgreSQL counterpart, naming the
     * column, its type and what to declare instead.
     */
    static void checkTypes(String table, RowType rowType) {
        List<RowType.RowField> fields = rowType.getFields();
        for (RowType.RowField field : fields) {
            String problem = typeProblem(field.getType(), false);
            if (problem != null) {
                throw new ValidationException(TwopcDynamicTableSinkFactory.prefix(table) + "column '"
                        + field.getName() + "' has type " + field.getType().asSummaryString() + ", " + problem);
            }
        }
    }

    private static String typeProblem(LogicalType type, boolean element) {
        switch (type.getTypeRoot()) {
            case TINYINT:
            case SMALLINT:
            case INTEGER:
            case BIGINT:
            case DECIMAL:
            case FLOAT:
            case DOUBLE:
            case BOOLEAN:
            case CHAR:
            case VARCHAR:
            case BINARY:
            case VARBINARY:
            case DATE:
            case TIME_WITHOUT_TIME_ZONE:
                return null;
            case TIMESTAMP_WITHOUT_TIME_ZONE:
                return precisionProblem(((TimestampType) type).getPrecision(), "TIMESTAMP");
            case TIMESTAMP_WITH_LOCAL_TIME_ZONE:
                return precisionProblem(((LocalZonedTimestampType) type).getPrecision(), "TIMESTAMP_LTZ");
            case ARRAY:
                if (element) {
                    return "are arrays, which a PostgreSQL table of this sink does not take (PostgreSQL's "
                            + "multi-dimensional arrays must be rectangular); use a one-dimensional ARRAY";
                }
                LogicalType elementType = ((ArrayType) type).getElementType();
                String inner = typeProblem(elementType, true);
                return inner == null ? null : "and its elements, " + elementType.asSummaryString() + ", " + inner;
            default:
                return "which has no PostgreSQL counterpart this sink writes (it takes integers, DECIMAL, FLOAT, "
                        + "DOUBLE, BOOLEAN, CHAR, VARCHAR, STRING, BINARY, VARBINARY, BYTES, DATE, TIME, TIMESTAMP, "
                        + "TIMESTAMP_LTZ and one-dimensional ARRAYs of them); convert the column in the query, e.g. "
                        + "to STRING (for a json or text column)";
        }
    }

    /**
     * Each column's type in the short names the native start-up check compares with the
     * PostgreSQL column ({@code decimal:10:2}, {@code timestamp_ltz:6}, {@code array:double},
     * ...); {@code other} for a type it need not judge. See {@code twopc_pg}'s {@code column_types}.
     */
    static List<String> declaredTypes(RowType rowType) {
        List<String> names = new java.util.ArrayList<>();
        for (LogicalType type : rowType.getChildren()) {
            names.add(declaredType(type));
        }
        return names;
    }

    static String declaredType(LogicalType type) {
        switch (type.getTypeRoot()) {
            case TINYINT:
                return "tinyint";
            case SMALLINT:
                return "smallint";
            case INTEGER:
                return "int";
            case BIGINT:
                return "bigint";
            case DECIMAL: {
                DecimalType d = (DecimalType) type;
                return "decimal:" + d.getPrecision() + ":" + d.getScale();
            }
            case FLOAT:
                return "float";
            case DOUBLE:
                return "double";
            case BOOLEAN:
                return "boolean";
            case CHAR:
            case VARCHAR:
                return "string";
            case BINARY:
            case VARBINARY:
                return "bytes";
            case DATE:
                return "date";
            case TIME_WITHOUT_TIME_ZONE:
                // The precision the writer emits, milliseconds, not the declared one, which the
                // planner reports as 0 whatever the DDL says (FLINK-17224) while values keep their
                // milliseconds: so a time(0) to time(2) column, which would round them without an
                // error, is refused by the start-up check (found by review).
                return "time:3";
            case TIMESTAMP_WITHOUT_TIME_ZONE:
                return "timestamp:" + ((TimestampType) type).getPrecision();
            case TIMESTAMP_WITH_LOCAL_TIME_ZONE:
                return "timestamp_ltz:" + ((LocalZonedTimestampType) type).getPrecision();
            case ARRAY:
                return "array:" + declaredType(((ArrayType) type).getElementType());
            default:
                return "other";
        }
    }

    private static String precisionProblem(int precision, String name) {
        if (precision <= MAX_TIMESTAMP_PRECISION) {
            return null;
        }
        return "but PostgreSQL keeps microseconds, so the nanoseconds of " + name + "(" + precision + ") values "
                + "would be rounded away; declare " + name + "(6) (or less) in the DDL, and cast to it in the query";
    }

    @Override
    public byte[] serialize(RowData row) {
        if (!operationField && row.getRowKind() != RowKind.INSERT) {
            // The planner sends an append-only table inserts only; a row of another kind (a plan
            // compiled with another 'sink.mode', a source that misreports its changelog) would be
            // appended as a new row, a delete written as an insert, without an error (found by
            // review).
            throw new TwopcRecordRejectedException("the append-only (transactional) PostgreSQL table received a "
                    + "row of kind " + row.getRowKind() + ", which it cannot apply: it appends every row. Write "
                    + "only inserts to it, or use an upsert table ('sink.mode' = 'idempotent' with a PRIMARY KEY)");
        }
        if (getters == null) {
            getters = new RowData.FieldGetter[types.length];
            for (int i = 0; i < types.length; i++) {
                // Nullable getters even for NOT NULL columns: Flink's getter of a NOT NULL type reads
                // the field without asking whether it is null, so a null that a source or function
                // sends in spite of the type would be written as 0 or an empty string (binary rows)
                // or fail with a NullPointerException (generic ones). As NULL, PostgreSQL refuses it
                // in a NOT NULL column, and the sink names the row.
                getters[i] = RowData.createFieldGetter(types[i].copy(true), i);
            }
            buffer = new StringBuilder(256);
        }
        StringBuilder out = buffer;
        out.setLength(0);
        for (int i = 0; i < types.length; i++) {
            if (i > 0) {
                out.append('\t');
            }
            Object value = getters[i].getFieldOrNull(row);
            if (value == null) {
                out.append("\\N");
            } else {
                // names is null in a schema serialized by a release before it (a recovered job graph).
                appendEscaped(out, text(types[i], value, false), names != null ? names[i] : "#" + (i + 1));
            }
        }
        if (operationField) {
            RowKind kind = row.getRowKind();
            switch (kind) {
                case INSERT:
                case UPDATE_AFTER:
                    out.append("\tU");
                    break;
                case DELETE:
                case UPDATE_BEFORE:
                    // The planner may still send an UPDATE_BEFORE to an upsert table (a filter after
                    // an aggregation retracts a row that no longer passes): the key's old row is
                    // gone, and the UPDATE_AFTER that follows, if any, writes the new one (the last
                    // operation of a key in a batch wins).
                    out.append("\tD");
                    break;
                default:
                    throw new IllegalStateException("a twopc upsert table received a row of kind " + kind
                            + ", which it does not know; this is a bug, please report it");
            }
        }
        return out.toString().getBytes(StandardCharsets.UTF_8);
    }

    /**
     * The COPY text escaping of one field: backslash, tab, line feed and carriage return. An
     * unpaired UTF-16 surrogate is refused, naming {@code column} (see {@link Surrogates}).
     */
    private static void appendEscaped(StringBuilder out, String text, String column) {
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (Character.isSurrogate(c)) {
                int low = Surrogates.checkPair(text, i, "column '" + column + "'");
                out.append(c).append(text.charAt(low));
                i = low;
                continue;
            }
            switch (c) {
                case '\\':
                    out.append("\\\\");
                    break;
                case '\t':
                    out.append("\\t");
                    break;
                case '\n':
                    out.append("\\n");
                    break;
                case '\r':
                    out.append("\\r");
                    break;
                default:
                    out.append(c);
            }
        }
    }

    /** The PostgreSQL text of one non-null value; {@code inArray}: as an array element. */
    static String text(LogicalType type, Object value, boolean inArray) {
        switch (type.getTypeRoot()) {
            case TINYINT:
            case SMALLINT:
            case INTEGER:
            case BIGINT:
                return value.toString();
            case DECIMAL:
                return ((DecimalData) value).toBigDecimal().toPlainString();
            case FLOAT:
                return Float.toString((Float) value);
            case DOUBLE:
                return Double.toString((Double) value);
            case BOOLEAN:
                return ((Boolean) value) ? "t" : "f";
            case CHAR:
            case VARCHAR:
                return inArray ? quoted(value.toString()) : value.toString();
            case BINARY:
            case VARBINARY: {
                String hex = hex((byte[]) value);
                return inArray ? quoted(hex) : hex;
            }
            case DATE: {
                String date = date(LocalDate.ofEpochDay((Integer) value));
                return inArray ? quoted(date) : date;
            }
            case TIME_WITHOUT_TIME_ZONE: {
                String time = time((Integer) value);
                return inArray ? quoted(time) : time;
            }
            case TIMESTAMP_WITHOUT_TIME_ZONE: {
                String ts = timestamp(((TimestampData) value).toLocalDateTime(),
                        ((TimestampType) type).getPrecision(), false);
                return inArray ? quoted(ts) : ts;
            }
            case TIMESTAMP_WITH_LOCAL_TIME_ZONE: {
                // The instant, written in UTC: the server's and the session's time zones change nothing.
                TimestampData t = (TimestampData) value;
                String ts = timestamp(LocalDateTime.ofEpochSecond(Math.floorDiv(t.getMillisecond(), 1000L),
                        (int) Math.floorMod(t.getMillisecond(), 1000L) * 1_000_000 + t.getNanoOfMillisecond(),
                        java.time.ZoneOffset.UTC), ((LocalZonedTimestampType) type).getPrecision(), true);
                return inArray ? quoted(ts) : ts;
            }
            case ARRAY:
                return array(((ArrayType) type).getElementType(), (ArrayData) value);
            default:
                throw new IllegalStateException("type " + type + " was not refused at planning");
        }
    }

    private static String array(LogicalType elementType, ArrayData array) {
        ArrayData.ElementGetter getter = ArrayData.createElementGetter(elementType.copy(true));
        StringBuilder out = new StringBuilder("{");
        for (int i = 0; i < array.size(); i++) {
            if (i > 0) {
                out.append(',');
            }
            Object element = getter.getElementOrNull(array, i);
            out.append(element == null ? "NULL" : text(elementType, element, true));
        }
        return out.append('}').toString();
    }

    /** An array element in double quotes, with its quotes and backslashes escaped. */
    private static String quoted(String s) {
        StringBuilder out = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                out.append('\\');
            }
            out.append(c);
        }
        return out.append('"').toString();
    }

    private static String hex(byte[] bytes) {
        char[] out = new char[2 + 2 * bytes.length];
        out[0] = '\\';
        out[1] = 'x';
        for (int i = 0; i < bytes.length; i++) {
            out[2 + 2 * i] = HEX[(bytes[i] >> 4) & 0xf];
            out[3 + 2 * i] = HEX[bytes[i] & 0xf];
        }
        return new String(out);
    }

    /** ISO year-month-day; years before 1 as PostgreSQL writes them (year 0 is 1 BC). */
    static String date(LocalDate d) {
        StringBuilder out = new StringBuilder(16);
        int year = d.getYear();
        pad(out, year > 0 ? year : 1 - year, 4).append('-');
        pad(out, d.getMonthValue(), 2).append('-');
        pad(out, d.getDayOfMonth(), 2);
        if (year <= 0) {
            out.append(" BC");
        }
        return out.toString();
    }

    /**
     * {@code hh:mm:ss.fff} of a time of day in milliseconds (Flink's TIME). Not cut to the declared
     * precision, unlike timestamps: Flink's planner declares every TIME column TIME(0) whatever the
     * DDL says (FLINK-17224), while its values keep their milliseconds.
     */
    static String time(int millisOfDay) {
        StringBuilder out = new StringBuilder(12);
        pad(out, millisOfDay / 3_600_000, 2).append(':');
        pad(out, millisOfDay / 60_000 % 60, 2).append(':');
        pad(out, millisOfDay / 1000 % 60, 2).append('.');
        pad(out, millisOfDay % 1000, 3);
        return out.toString();
    }

    /**
     * A date and time, its fraction cut to {@code precision} digits, towards the earlier instant
     * (before 1970 too: the fields of a {@code LocalDateTime} are never negative). A value may
     * hold more digits than its column's type declares (Flink does not cut values that reach a
     * table from a DataStream or a function), and PostgreSQL would round them instead:
     * 23:59:59.9999995 into a {@code timestamp(6)} becomes the next day.
     */
    static String timestamp(LocalDateTime t, int precision, boolean utc) {
        StringBuilder out = new StringBuilder(40);
        int year = t.getYear();
        pad(out, year > 0 ? year : 1 - year, 4).append('-');
        pad(out, t.getMonthValue(), 2).append('-');
        pad(out, t.getDayOfMonth(), 2).append(' ');
        pad(out, t.getHour(), 2).append(':');
        pad(out, t.getMinute(), 2).append(':');
        pad(out, t.getSecond(), 2).append('.');
        int nanos = t.getNano();
        int unit = NANOS_PER_DIGITS[Math.max(0, Math.min(9, precision))];
        pad(out, nanos - nanos % unit, 9);
        if (utc) {
            out.append("+00");
        }
        if (year <= 0) {
            out.append(" BC");
        }
        return out.toString();
    }

    private static StringBuilder pad(StringBuilder out, long value, int width) {
        String digits = Long.toString(value);
        for (int i = digits.length(); i < width; i++) {
            out.append('0');
        }
        return out.append(digits);
    }
}
