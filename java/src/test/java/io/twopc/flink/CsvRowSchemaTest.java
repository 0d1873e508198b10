package io.twopc.flink;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.twopc.flink.testing.TestPostgres;

import java.io.StringReader;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Calendar;
import java.util.Date;
import java.util.GregorianCalendar;
import java.util.List;

import org.apache.flink.types.Row;
import org.apache.flink.types.RowKind;
import org.apache.flink.util.InstantiationUtil;
import org.junit.Test;
import org.postgresql.PGConnection;

/** {@link CsvRowSchema}: rows PostgreSQL's COPY CSV reads back as the values that went in. */
public class CsvRowSchemaTest {
    @Test
    public void plainValuesStayUnquotedAndNullIsAnEmptyField() {
        assertThat(CsvRowSchema.formatRow(1, "alpha", 2.5, true, null, 'c'))
                .isEqualTo("1,alpha,2.5,true,,c");
        assertThat(CsvRowSchema.formatRow(new BigDecimal("1E+3"), LocalDate.of(2026, 9, 1),
                        Instant.parse("2026-09-01T10:00:00Z"), new Date(0)))
                .isEqualTo("1000,2026-09-01,2026-09-01T10:00:00Z,1970-01-01T00:00:00Z");
    }

    @Test
    public void specialCharactersAreQuotedWithInnerQuotesDoubled() {
        assertThat(CsvRowSchema.formatRow("", "a,b", "say \"hi\"", "two\nlines", "cr\rlf", "back\\slash", "\\."))
                .isEqualTo("\"\",\"a,b\",\"say \"\"hi\"\"\",\"two\nlines\",\"cr\rlf\",\"back\\slash\",\"\\.\"");
        assertThat(CsvRowSchema.formatRow(new byte[] {0, (byte) 0xff, 0x10})).isEqualTo("\"\\x00ff10\"");
    }

    @Test
    public void arraysRowsAndPojosAreSupportedAndCollectionsRefused() throws Exception {
        assertThat(new String(CsvRowSchema.forArrays().serialize(new Object[] {7, "x"}), StandardCharsets.UTF_8))
                .isEqualTo("7,x");
        assertThat(new String(CsvRowSchema.forRows().serialize(Row.of(8L, null, "\u00e9")), StandardCharsets.UTF_8))
                .isEqualTo("8,,\u00e9");
        CsvRowSchema<Order> pojo = CsvRowSchema.of((Order o) -> new Object[] {o.id, o.customer});
        // Shipped with the job: the lambda must survive Java serialization.
        CsvRowSchema<Order> shipped = InstantiationUtil.clone(pojo);
        assertThat(new String(shipped.serialize(new Order(3, "ACME, Inc.")), StandardCharsets.UTF_8))
                .isEqualTo("3,\"ACME, Inc.\"");

        assertThatThrownBy(() -> CsvRowSchema.formatRow(1, Arrays.asList(1, 2)))
                .isInstanceOf(TwopcRecordRejectedException.class)
                .hasMessageContaining("field 1");
        assertThatThrownBy(() -> CsvRowSchema.formatRow((Object) new int[] {1}))
                .isInstanceOf(TwopcRecordRejectedException.class);
        assertThatThrownBy(() -> CsvRowSchema.of((Order o) -> null).serialize(new Order(1, "a")))
                .isInstanceOf(TwopcRecordRejectedException.class)
                .hasMessageContaining("returned null");
    }

    /**
     * A changelog's retractions (toChangelogStream) carry the removed row's values: written as a
     * CSV row they would insert, or upsert back, the very row the changelog removes.
     */
    @Test
    public void rowsThatRemoveARowAreRefusedNotWrittenAsInserts() {
        CsvRowSchema<Row> rows = CsvRowSchema.forRows();
        assertThat(new String(rows.serialize(Row.ofKind(RowKind.UPDATE_AFTER, 9L, "new")), StandardCharsets.UTF_8))
                .isEqualTo("9,new");
        for (RowKind removal : new RowKind[] {RowKind.DELETE, RowKind.UPDATE_BEFORE}) {
            assertThatThrownBy(() -> rows.serialize(Row.ofKind(removal, 9L, "old")))
                    .as("a Row of kind %s", removal)
                    .isInstanceOf(TwopcRecordRejectedException.class)
                    .hasMessageContaining("Row of kind " + removal)
                    .hasMessageContaining("withOperationField()");
        }
    }

    /**
     * UTF-8 has no encoding for an unpaired UTF-16 surrogate, and {@code String.getBytes} writes a
     * {@code ?} for it without any error: such a value is refused, naming its field; a pair (a
     * character outside the Basic Multilingual Plane) is written as it is.
     */
    @Test
    public void anUnpairedSurrogateIsRefusedNotWrittenAsAQuestionMark() {
        assertThat(new String(CsvRowSchema.forArrays().serialize(new Object[] {"a\uD83D\uDE00b", "c,d\uD83D\uDE00"}),
                StandardCharsets.UTF_8)).isEqualTo("a\uD83D\uDE00b,\"c,d\uD83D\uDE00\"");
        for (String bad : new String[] {"a\uD800b", "a\uDC00", "\uDBFF", "x,\uDE00\uD83D"}) {
            assertThatThrownBy(() -> CsvRowSchema.forArrays().serialize(new Object[] {1, bad}))
                    .as("%s", bad)
                    .isInstanceOf(TwopcRecordRejectedException.class)
                    .hasMessageContaining("field 1")
                    .hasMessageContaining("unpaired UTF-16 surrogate");
        }
    }

    /** The real check: PostgreSQL's own CSV reader gets back exactly the values written. */
    @Test
    public void postgresReadsBackEveryValue() throws Exception {
        TestPostgres pg = TestPostgres.fromEnvironment();
        String table = TestPostgres.uniqueName("csv_roundtrip");
        List<Object[]> rows = Arrays.asList(
                new Object[] {1, "plain", new byte[] {1, 2}},
                new Object[] {2, "", new byte[0]},
                new Object[] {3, null, null},
                new Object[] {4, "comma, \"quotes\" and\nnewline\r\n", new byte[] {(byte) 0xde, (byte) 0xad}},
                new Object[] {5, "\\.", new byte[] {'\\'}},
                new Object[] {6, "back\\slash \\N tab\tend", new byte[] {0}},
                new Object[] {7, "unicode \u00e9\u4e2d\ud83d\ude00", new byte[] {(byte) 0x80}});
        StringBuilder copy = new StringBuilder();
        for (Object[] row : rows) {
            copy.append(new String(CsvRowSchema.forArrays().serialize(row), StandardCharsets.UTF_8)).append('\n');
        }
        pg.execute("CREATE TABLE " + table + " (id int, body text, data bytea)");
        try (Connection c = pg.connect()) {
            c.unwrap(PGConnection.class).getCopyAPI()
                    .copyIn("COPY " + table + " (id, body, data) FROM STDIN WITH (FORMAT csv)",
                            new StringReader(copy.toString()));
            List<Object[]> back = new ArrayList<>();
            try (Statement s = c.createStatement();
                    ResultSet r = s.executeQuery("SELECT id, body, data FROM " + table + " ORDER BY id")) {
                while (r.next()) {
                    back.add(new Object[] {r.getInt(1), r.getString(2), r.getBytes(3)});
                }
            }
            assertThat(back).hasSize(rows.size());
            for (int i = 0; i < rows.size(); i++) {
                assertThat(back.get(i)).as("row %d", i + 1).isEqualTo(rows.get(i));
            }
        } finally {
            pg.execute("DROP TABLE IF EXISTS " + table);
        }
    }

    /**
     * A {@code java.sql.Timestamp} lands as the same instant in a {@code timestamptz} column and
     * as the JVM's wall-clock time in a {@code timestamp} column, whatever the session's time
     * zone. Before, it was written without an offset, and a session zone other than the JVM's
     * shifted the instant.
     */
    @Test
    public void aSqlTimestampIsTheSameInstantWhateverTheSessionTimeZone() throws Exception {
        TestPostgres pg = TestPostgres.fromEnvironment();
        String table = TestPostgres.uniqueName("csv_ts");
        java.sql.Timestamp ts = java.sql.Timestamp.valueOf("2024-03-01 10:00:00.123456");
        // A session zone whose offset differs from the JVM's.
        boolean jvmAtPlus14 = java.time.ZoneId.systemDefault().getRules()
                .getOffset(ts.toInstant()).getTotalSeconds() == 14 * 3600;
        String sessionZone = jvmAtPlus14 ? "UTC" : "Pacific/Kiritimati";
        String row = new String(CsvRowSchema.forArrays().serialize(new Object[] {ts, ts}), StandardCharsets.UTF_8);
        pg.execute("CREATE TABLE " + table + " (local_ts timestamp(6), at_tz timestamptz(6))");
        try (Connection c = pg.connect()) {
            try (Statement s = c.createStatement()) {
                s.execute("SET TimeZone = '" + sessionZone + "'");
            }
            c.unwrap(PGConnection.class).getCopyAPI()
                    .copyIn("COPY " + table + " (local_ts, at_tz) FROM STDIN WITH (FORMAT csv)",
                            new StringReader(row + "\n"));
            try (Statement s = c.createStatement();
                    ResultSet r = s.executeQuery("SELECT local_ts, at_tz FROM " + table)) {
                assertThat(r.next()).isTrue();
                assertThat(r.getObject(1, java.time.LocalDateTime.class)).as(row).isEqualTo(ts.toLocalDateTime());
                assertThat(r.getObject(2, java.time.OffsetDateTime.class).toInstant()).as(row)
                        .isEqualTo(ts.toInstant());
            }
        } finally {
            pg.execute("DROP TABLE IF EXISTS " + table);
        }
    }

    /**
     * Dates and times as PostgreSQL keeps them. Before: a {@code java.sql.Time} lost its
     * milliseconds, a {@code java.sql.Date} lost its era (44 BC became 44 AD) and its year's fifth
     * digit, and a fraction finer than a microsecond was rounded by PostgreSQL, into the next day
     * at the end of one.
     */
    @Test
    public void datesAndTimesKeepWhatPostgresCanHold() throws Exception {
        java.sql.Time time = java.sql.Time.valueOf("12:34:56");
        time.setTime(time.getTime() + 789);
        java.sql.Date bc = sqlDate(GregorianCalendar.BC, 44, Calendar.MARCH, 15);
        java.sql.Date far = sqlDate(GregorianCalendar.AD, 12024, Calendar.MAY, 1);
        LocalDateTime endOfDay = LocalDateTime.of(2024, 12, 31, 23, 59, 59, 999_999_500);
        assertThat(CsvRowSchema.formatRow(time, bc, far, endOfDay))
                .isEqualTo("12:34:56.789,0044-03-15 BC,12024-05-01,2024-12-31T23:59:59.999999");
        assertThat(CsvRowSchema.formatRow(Instant.parse("2024-12-31T23:59:59.999999999Z"),
                        java.sql.Timestamp.valueOf("2024-12-31 23:59:59.999999999")))
                .startsWith("2024-12-31T23:59:59.999999Z,2024-12-31T23:59:59.999999");
        assertThatThrownBy(() -> CsvRowSchema.formatRow(1L, Row.of(2, "x")))
                .isInstanceOf(TwopcRecordRejectedException.class)
                .hasMessageContaining("field 1");

        TestPostgres pg = TestPostgres.fromEnvironment();
        String table = TestPostgres.uniqueName("csv_times");
        String row = new String(CsvRowSchema.forArrays().serialize(new Object[] {time, bc, far, endOfDay}),
                StandardCharsets.UTF_8);
        pg.execute("CREATE TABLE " + table + " (t time(3), bc date, far date, ts timestamp(6))");
        try (Connection c = pg.connect()) {
            c.unwrap(PGConnection.class).getCopyAPI()
                    .copyIn("COPY " + table + " (t, bc, far, ts) FROM STDIN WITH (FORMAT csv)",
                            new StringReader(row + "\n"));
            try (Statement st = c.createStatement();
                    ResultSet r = st.executeQuery(
                            "SELECT t::text, bc::text, far::text, ts::text FROM " + table)) {
                assertThat(r.next()).isTrue();
                assertThat(r.getString(1)).as(row).isEqualTo("12:34:56.789");
                assertThat(r.getString(2)).as(row).isEqualTo("0044-03-15 BC");
                assertThat(r.getString(3)).as(row).isEqualTo("12024-05-01");
                assertThat(r.getString(4)).as(row).isEqualTo("2024-12-31 23:59:59.999999");
            }
        } finally {
            pg.execute("DROP TABLE IF EXISTS " + table);
        }
    }

    private static java.sql.Date sqlDate(int era, int year, int month, int day) {
        GregorianCalendar c = new GregorianCalendar();
        c.clear();
        c.set(Calendar.ERA, era);
        c.set(year, month, day);
        return new java.sql.Date(c.getTimeInMillis());
    }

    static final class Order {
        final long id;
        final String customer;

        Order(long id, String customer) {
            this.id = id;
            this.customer = customer;
        }
    }
}
