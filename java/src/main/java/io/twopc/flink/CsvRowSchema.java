package io.twopc.flink;

import io.twopc.flink.internal.Surrogates;

import org.apache.flink.annotation.PublicEvolving;

import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.types.Row;
import org.apache.flink.types.RowKind;

import java.io.Serializable;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.ZoneId;
import java.time.format.DateTimeFormatter;
import java.time.temporal.ChronoField;
import java.time.temporal.ChronoUnit;
import java.time.temporal.Temporal;
import java.time.temporal.TemporalAccessor;
import java.util.Calendar;
import java.util.Collection;
import java.util.Date;
import java.util.GregorianCalendar;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;

/**
 * Turns each record into one row of PostgreSQL's COPY CSV format ({@link
 * PostgresCopyFormat#CSV}, the default of {@link PostgresDestination}): one value per column, in
 * the order of {@link PostgresDestination#columns(String...)}.
 *
 * <pre>{@code
 * CsvRowSchema.forArrays()                                   // Object[] records
 * CsvRowSchema.forRows()                                     // Flink Row records
 * CsvRowSchema.of((Order o) -> new Object[] {o.id, o.customer, o.amount})   // POJOs
 * }</pre>
 *
 * <p>Values: {@code null} is SQL NULL (an unquoted empty field) and {@code ""} the empty string (a
 * quoted one); numbers, booleans and {@code java.time} values are written as PostgreSQL reads them
 * ({@link BigDecimal} without exponent, {@link Date} as an ISO instant, {@code java.sql.Timestamp}
 * as the JVM's local date and time with its offset, so that a {@code timestamp} column gets the
 * local time and a {@code timestamptz} column the instant); {@code byte[]} is {@code
 * bytea} hex ({@code \x...}); {@code java.time} values and timestamps are cut to microseconds (what
 * PostgreSQL keeps; it would round a finer fraction, possibly into the next day); anything else
 * is {@code String.valueOf}. A value is quoted when it
 * contains a comma, a double quote, a line break or a backslash (which also covers {@code \.}, the
 * end-of-data marker), with inner quotes doubled, so line breaks inside values stay inside one row.
 * Collections, maps, nested {@link Row}s and arrays other than {@code byte[]} are refused: format
 * them into a PostgreSQL array, composite or JSON literal in the extractor instead.
 *
 * @param <T> the record type
 */
@PublicEvolving
public final class CsvRowSchema<T> implements SerializationSchema<T> {
    private static final long serialVersionUID = 1L;
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    /** A record's column values, in the order of the destination's columns. */
    @FunctionalInterface
    public interface FieldExtractor<T> extends Serializable {
        Object[] fieldsOf(T record);
    }

    private final FieldExtractor<T> extractor;

    private CsvRowSchema(FieldExtractor<T> extractor) {
        this.extractor = Objects.requireNonNull(extractor, "extractor");
    }

    /** Records that are already one value per column. */
    public static CsvRowSchema<Object[]> forArrays() {
        return new CsvRowSchema<>(fields -> fields);
    }

    /**
     * Flink {@link Row} records: field {@code i} goes to column {@code i}. A row is written as a
     * row to insert (or, in idempotent mode, to upsert), so rows of kind {@code INSERT} and
     * {@code UPDATE_AFTER} are taken; {@code UPDATE_BEFORE} and {@code DELETE} rows (from {@code
     * toChangelogStream}) are refused: written, they would add or bring back the very row the
     * changelog removes.
     */
    public static CsvRowSchema<Row> forRows() {
        return new CsvRowSchema<>(CsvRowSchema::fieldsOfRow);
    }

    /**
     * Any record type, usually a POJO: {@code extractor} picks its values (a lambda or method
     * reference; it is shipped with the job, so it must not capture anything unserializable).
     */
    public static <T> CsvRowSchema<T> of(FieldExtractor<T> extractor) {
        return new CsvRowSchema<>(extractor);
    }

    @Override
    public byte[] serialize(T record) {
        Object[] fields = extractor.fieldsOf(record);
        if (fields == null) {
            throw new TwopcRecordRejectedException("the CsvRowSchema field extractor returned null for a record; "
                    + "return one value per column (null values are fine)");
        }
        return formatRow(fields).getBytes(StandardCharsets.UTF_8);
    }

    /** One CSV row (without line terminator) of {@code fields}. */
    public static String formatRow(Object... fields) {
        StringBuilder row = new StringBuilder(16 * fields.length);
        for (int i = 0; i < fields.length; i++) {
            if (i > 0) {
                row.append(',');
            }
            appendField(row, fields[i], i);
        }
        return row.toString();
    }

    private static void appendField(StringBuilder row, Object value, int index) {
        if (value == null) {
            return; // unquoted empty: NULL
        }
        String text = textOf(value, index);
        if (text.isEmpty() || needsQuotes(text, index)) {
            row.append('"');
            for (int i = 0; i < text.length(); i++) {
                char c = text.charAt(i);
                if (c == '"') {
                    row.append('"');
                }
                row.append(c);
            }
            row.append('"');
        } else {
            row.append(text);
        }
    }

    private static boolean needsQuotes(String text, int index) {
        boolean quotes = false;
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (c == ',' || c == '"' || c == '\n' || c == '\r' || c == '\\') {
                quotes = true;
            } else if (Character.isSurrogate(c)) {
                i = Surrogates.checkPair(text, i, "CsvRowSchema: field " + index);
            }
        }
        return quotes;
    }

    private static String textOf(Object value, int index) {
        if (value instanceof byte[]) {
            byte[] bytes = (byte[]) value;
            char[] hex = new char[2 + 2 * bytes.length];
            hex[0] = '\\';
            hex[1] = 'x';
            for (int i = 0; i < bytes.length; i++) {
                hex[2 + 2 * i] = HEX[(bytes[i] >> 4) & 0xf];
                hex[3 + 2 * i] = HEX[bytes[i] & 0xf];
            }
            return new String(hex);
        }
        if (value instanceof BigDecimal) {
            return ((BigDecimal) value).toPlainString();
        }
        if (value instanceof java.sql.Timestamp) {
            // The JVM's wall-clock time with its offset: a timestamp column keeps the wall-clock
            // time (PostgreSQL ignores the offset there), a timestamptz column gets the right
            // instant. Without the offset (toString()), timestamptz read the wall-clock time in
            // the session's time zone, a shifted instant whenever that differs from the JVM's
            // (found by review).
            java.sql.Timestamp ts = (java.sql.Timestamp) value;
            return OffsetDateTime.ofInstant(ts.toInstant(), ZoneId.systemDefault())
                    .truncatedTo(ChronoUnit.MICROS)
                    .format(DateTimeFormatter.ISO_OFFSET_DATE_TIME);
        }
        if (value instanceof java.sql.Date) {
            return sqlDate((java.sql.Date) value);
        }
        if (value instanceof java.sql.Time) {
            // Its wall-clock time with the milliseconds it holds (toString() drops them).
            return Instant.ofEpochMilli(((java.sql.Time) value).getTime()).atZone(ZoneId.systemDefault())
                    .toLocalTime().toString();
        }
        if (value instanceof Date) {
            return ((Date) value).toInstant().toString();
        }
        if (value.getClass().isArray() || value instanceof Collection || value instanceof Map
                || value instanceof Row) {
            throw new TwopcRecordRejectedException("CsvRowSchema: field " + index + " is a " + value.getClass().getName()
                    + "; format arrays, collections, maps and nested rows as a PostgreSQL array, composite or "
                    + "JSON literal (a String) in the field extractor");
        }
        // PostgreSQL keeps microseconds and rounds finer fractions, which can carry into the next
        // second or day: cut to microseconds instead (towards the earlier time, as the SQL
        // connector's rows do).
        if (value instanceof Temporal && value instanceof TemporalAccessor
                && ((TemporalAccessor) value).isSupported(ChronoField.NANO_OF_SECOND)) {
            return truncatedToMicros((Temporal) value).toString();
        }
        // Numbers (NaN and Infinity spelled as PostgreSQL reads them), booleans, characters,
        // java.time values (ISO-8601) and strings.
        return value.toString();
    }

    /** {@code t} without its digits finer than a microsecond. */
    private static Temporal truncatedToMicros(Temporal t) {
        long nanos = ((TemporalAccessor) t).getLong(ChronoField.NANO_OF_SECOND);
        return t.with(ChronoField.NANO_OF_SECOND, nanos - nanos % 1000);
    }

    /**
     * A {@code java.sql.Date} by its own fields (the JVM's calendar, as {@code toString()} and JDBC
     * read it) with its era: {@code toString()} prints the year within its era, cut to four
     * digits, so 44 BC was written as 44 AD and the year 12024 as 2024.
     */
    private static String sqlDate(java.sql.Date date) {
        Calendar c = new GregorianCalendar();
        c.setTime(date);
        String text = String.format(Locale.ROOT, "%04d-%02d-%02d", c.get(Calendar.YEAR),
                c.get(Calendar.MONTH) + 1, c.get(Calendar.DAY_OF_MONTH));
        return c.get(Calendar.ERA) == GregorianCalendar.BC ? text + " BC" : text;
    }

    private static Object[] fieldsOfRow(Row row) {
        RowKind kind = row.getKind();
        if (kind == RowKind.UPDATE_BEFORE || kind == RowKind.DELETE) {
            // The CSV row has no field for the kind: a retraction would be written as the row it
            // retracts (inserted again, or upserted back into an idempotent table).
            throw new TwopcRecordRejectedException("CsvRowSchema.forRows(): a Row of kind " + kind + " ("
                    + row.getArity() + " fields) removes a row, but a CSV row can only add or upsert one, so it "
                    + "would be written as the very row the changelog removes. Keep only INSERT and UPDATE_AFTER "
                    + "rows before the sink (e.g. filter on Row.getKind()), or, to apply deletes by key, use "
                    + "PostgresDestination.idempotent(...).withOperationField() with CsvRowSchema.of(...) "
                    + "returning the values followed by \"U\" or \"D\"");
        }
        Object[] fields = new Object[row.getArity()];
        for (int i = 0; i < fields.length; i++) {
            fields[i] = row.getField(i);
        }
        return fields;
    }
}
