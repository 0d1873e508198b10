package io.twopc.flink.table;

import io.twopc.flink.it.TwopcItSupport;
import io.twopc.flink.testing.TestPostgres;

import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.table.api.DataTypes;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.table.runtime.typeutils.ExternalTypeInfo;
import org.apache.flink.table.types.DataType;
import org.apache.flink.test.util.MiniClusterWithClientResource;
import org.apache.flink.types.Row;

import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.ClassRule;
import org.junit.Test;
import org.junit.runner.RunWith;
import org.junit.runners.Parameterized;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

import static io.twopc.flink.table.SqlTestSupport.runToEnd;
import static io.twopc.flink.table.TwopcTablePostgresITCase.PASSWORD_VARIABLE;
import static io.twopc.flink.table.TwopcTablePostgresITCase.pgOptions;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * Every Flink SQL type the PostgreSQL tables take, written by the SQL connector and read back
 * with JDBC, one test per type: each value (edge values, NULLs, NULL array elements, and a few
 * hundred random rows) must come back exactly, through both modes (transactional, and idempotent
 * with its operation field). The rows are written once per mode, into a PostgreSQL table whose
 * columns are in another order than the DDL's and which has a column the DDL does not name. Values are compared as numbers where text could hide a difference: floating point by
 * bits, dates as days and times and timestamps as micro- or milliseconds since the epoch, computed
 * by PostgreSQL.
 */
@RunWith(Parameterized.class)
public class TwopcTablePostgresTypesITCase {
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = TwopcItSupport.cluster(METRICS, 2);

    private static TestPostgres pg;
    /** The PostgreSQL tables written in transactional and in idempotent mode. */
    private static String transactionalTable;
    private static String idempotentTable;
    private static final List<String> SINK_IDS = new ArrayList<>();
    /** The rows written, and the rows each table gave back (by id). */
    private static List<Row> written;
    private static List<Row> transactional;
    private static List<Row> idempotent;

    /** Column name, Flink SQL type, PostgreSQL type, Flink data type of the values. */
    private static final Object[][] COLUMNS = {
        {"id", "BIGINT NOT NULL", "bigint PRIMARY KEY", DataTypes.BIGINT().notNull()},
        {"c_tinyint", "TINYINT", "smallint", DataTypes.TINYINT()},
        {"c_smallint", "SMALLINT", "smallint", DataTypes.SMALLINT()},
        {"c_int", "INT", "integer", DataTypes.INT()},
        {"c_bigint", "BIGINT", "bigint", DataTypes.BIGINT()},
        {"c_dec", "DECIMAL(20, 6)", "numeric(20, 6)", DataTypes.DECIMAL(20, 6)},
        {"c_dec38", "DECIMAL(38, 0)", "numeric(38, 0)", DataTypes.DECIMAL(38, 0)},
        {"c_float", "FLOAT", "real", DataTypes.FLOAT()},
        {"c_double", "DOUBLE", "double precision", DataTypes.DOUBLE()},
        {"c_bool", "BOOLEAN", "boolean", DataTypes.BOOLEAN()},
        {"c_char", "CHAR(3)", "char(3)", DataTypes.CHAR(3)},
        {"c_varchar", "VARCHAR(20)", "varchar(20)", DataTypes.VARCHAR(20)},
        {"c_string", "STRING", "text", DataTypes.STRING()},
        {"c_binary", "BINARY(4)", "bytea", DataTypes.BINARY(4)},
        {"c_bytes", "BYTES", "bytea", DataTypes.BYTES()},
        {"c_date", "DATE", "date", DataTypes.DATE()},
        {"c_time", "TIME(3)", "time(3)", DataTypes.TIME(3)},
        {"c_ts", "TIMESTAMP(6)", "timestamp(6)", DataTypes.TIMESTAMP(6)},
        {"c_ts3", "TIMESTAMP(3)", "timestamp(3)", DataTypes.TIMESTAMP(3)},
        {"c_ltz", "TIMESTAMP_LTZ(6)", "timestamptz", DataTypes.TIMESTAMP_LTZ(6)},
        {"a_int", "ARRAY<INT>", "integer[]", DataTypes.ARRAY(DataTypes.INT())},
        {"a_string", "ARRAY<STRING>", "text[]", DataTypes.ARRAY(DataTypes.STRING())},
        {"a_double", "ARRAY<DOUBLE>", "double precision[]", DataTypes.ARRAY(DataTypes.DOUBLE())},
        {"a_dec", "ARRAY<DECIMAL(10, 2)>", "numeric(10, 2)[]", DataTypes.ARRAY(DataTypes.DECIMAL(10, 2))},
        {"a_bool", "ARRAY<BOOLEAN>", "boolean[]", DataTypes.ARRAY(DataTypes.BOOLEAN())},
        {"a_bytes", "ARRAY<BYTES>", "bytea[]", DataTypes.ARRAY(DataTypes.BYTES())},
        {"a_date", "ARRAY<DATE>", "date[]", DataTypes.ARRAY(DataTypes.DATE())},
        {"a_ts", "ARRAY<TIMESTAMP(6)>", "timestamp(6)[]", DataTypes.ARRAY(DataTypes.TIMESTAMP(6))},
    };

    /** Strings that are special somewhere between Java, COPY text and array literals. */
    private static final String[] TRICKY = {"", "NULL", "null", "\\N", "a\tb", "line\nbreak", "cr\rlf", "back\\slash",
        "\\", "\\.", ".", "quote\"d", "'single'", "{braces}", "comma,separated", " spaced ", "日本語 ü 🎉", "\u00a0",
        "ends with backslash\\"};

    /** One test per column: its type's values, edge values and NULLs, through both modes. */
    @Parameterized.Parameters(name = "{1}")
    public static List<Object[]> columns() {
        List<Object[]> columns = new ArrayList<>();
        for (int c = 1; c < COLUMNS.length; c++) {
            columns.add(new Object[] {c, COLUMNS[c][1] + " -> " + COLUMNS[c][2]});
        }
        return columns;
    }

    @Parameterized.Parameter(0)
    public int column;

    @Parameterized.Parameter(1)
    public String type;

    /**
     * Writes the same rows through both modes, once for all the per-type tests: into PostgreSQL
     * tables whose columns are in the reverse of the DDL's order, with one more column the DDL does
     * not name (the DDL's columns are the table's by name).
     */
    @BeforeClass
    public static void writeEveryTypeThroughBothModes() throws Exception {
        pg = TestPostgres.fromEnvironment();
        written = rows();
        transactionalTable = TestPostgres.uniqueName("sql_types_txn");
        idempotentTable = TestPostgres.uniqueName("sql_types_idem");
        transactional = writeAndReadBack(transactionalTable, "");
        idempotent = writeAndReadBack(idempotentTable, ", 'sink.mode' = 'idempotent'");
    }

    @AfterClass
    public static void cleanUp() throws Exception {
        for (String sinkId : SINK_IDS) {
            pg.rollbackAllPrepared(sinkId);
        }
        for (String table : new String[] {transactionalTable, idempotentTable}) {
            if (table != null) {
                pg.execute("DROP TABLE IF EXISTS " + table);
            }
        }
    }

    @Test
    public void roundTripsExactlyInTransactionalMode() {
        assertColumn(transactional);
    }

    @Test
    public void roundTripsExactlyInIdempotentMode() {
        assertColumn(idempotent);
    }

    private void assertColumn(List<Row> back) {
        assertThat(back).hasSize(written.size());
        int nulls = 0;
        for (int i = 0; i < written.size(); i++) {
            Object value = written.get(i).getField(column);
            nulls += value == null ? 1 : 0;
            assertThat(back.get(i).getField(0)).as("row %d's id", i).isEqualTo(written.get(i).getField(0));
            assertThat(back.get(i).getField(column)).as("row %d column %s (%s): wrote %s", i, COLUMNS[column][0],
                    type, show(value)).isEqualTo(expected(column, value));
        }
        assertThat(nulls).as("NULLs written in column %s", COLUMNS[column][0]).isPositive();
    }

    private static List<Row> writeAndReadBack(String table, String mode) throws Exception {
        String sinkId = TestPostgres.uniqueName("types").replace('_', '-');
        SINK_IDS.add(sinkId);
        List<String> pgColumns = new ArrayList<>();
        List<String> flinkColumns = new ArrayList<>();
        List<DataTypes.Field> fields = new ArrayList<>();
        for (Object[] c : COLUMNS) {
            pgColumns.add(0, c[0] + " " + c[2]);
            flinkColumns.add(c[0] + " " + c[1]);
            fields.add(DataTypes.FIELD((String) c[0], (DataType) c[3]));
        }
        pgColumns.add(1, "not_in_ddl text NOT NULL DEFAULT 'untouched'");
        pg.execute("CREATE TABLE " + table + " (" + String.join(", ", pgColumns) + ")");

        StreamExecutionEnvironment env = TwopcItSupport.environment(1, 200, 0, Duration.ofMillis(100));
        StreamTableEnvironment tEnv = StreamTableEnvironment.create(env);
        DataType rowType = DataTypes.ROW(fields.toArray(new DataTypes.Field[0])).notNull();
        tEnv.createTemporaryView("input", tEnv.fromDataStream(env.fromData(written, ExternalTypeInfo.of(rowType))));
        tEnv.executeSql("CREATE TABLE typed (" + String.join(", ", flinkColumns) + ", PRIMARY KEY (id) NOT ENFORCED) "
                + "WITH (" + pgOptions(pg, sinkId, table, "'password-env' = '" + PASSWORD_VARIABLE + "'") + mode + ")");
        runToEnd(tEnv.executeSql("INSERT INTO typed SELECT * FROM input"));
        assertThat(pg.queryStrings("SELECT DISTINCT not_in_ddl FROM " + table))
                .as("the column the DDL does not name keeps its default").containsExactly("untouched");
        return readBack(table);
    }

    // ------------------------------------------------------------------ the rows

    private static List<Row> rows() {
        List<Row> rows = new ArrayList<>();
        // All NULL.
        Row nulls = new Row(COLUMNS.length);
        nulls.setField(0, 0L);
        rows.add(nulls);
        // Edge values.
        rows.add(Row.of(1L, Byte.MIN_VALUE, Short.MIN_VALUE, Integer.MIN_VALUE, Long.MIN_VALUE,
                new BigDecimal("-99999999999999.999999"), new BigDecimal("-99999999999999999999999999999999999999"),
                Float.NaN, Double.NaN, false, "a\tb", "", "", new byte[4], new byte[0],
                LocalDate.of(0, 1, 1), LocalTime.MIDNIGHT, LocalDateTime.of(0, 1, 1, 0, 0),
                LocalDateTime.of(0, 1, 1, 0, 0, 0, 1_000_000), Instant.parse("0001-01-01T00:00:00Z"),
                new Integer[0], new String[0], new Double[0], new BigDecimal[0], new Boolean[0], new byte[0][],
                new LocalDate[0], new LocalDateTime[0]));
        rows.add(Row.of(2L, Byte.MAX_VALUE, Short.MAX_VALUE, Integer.MAX_VALUE, Long.MAX_VALUE,
                new BigDecimal("99999999999999.999999"), new BigDecimal("99999999999999999999999999999999999999"),
                Float.POSITIVE_INFINITY, Double.NEGATIVE_INFINITY, true, "\\N.", "NULL", "\\.",
                new byte[] {(byte) 0xff, 0, '\\', '\n'}, new byte[] {0, 1, 2, (byte) 0x80},
                LocalDate.of(9999, 12, 31), LocalTime.of(23, 59, 59, 999_000_000),
                LocalDateTime.of(9999, 12, 31, 23, 59, 59, 999_999_000),
                LocalDateTime.of(9999, 12, 31, 23, 59, 59, 999_000_000),
                Instant.parse("9999-12-31T23:59:59.999999Z"),
                new Integer[] {null, Integer.MIN_VALUE, 0, Integer.MAX_VALUE, null},
                TRICKY,
                new Double[] {Double.NaN, Double.POSITIVE_INFINITY, Double.NEGATIVE_INFINITY, -0.0, Double.MIN_VALUE,
                    Double.MAX_VALUE, null, 0.1},
                new BigDecimal[] {new BigDecimal("-99999999.99"), null, new BigDecimal("0.01")},
                new Boolean[] {true, null, false},
                new byte[][] {new byte[0], null, new byte[] {'"', '\\', ',', '{', (byte) 0xfe}},
                new LocalDate[] {LocalDate.of(0, 2, 29), null, LocalDate.of(1970, 1, 1)},
                new LocalDateTime[] {LocalDateTime.of(1969, 12, 31, 23, 59, 59, 999_999_000), null}));
        rows.add(Row.of(3L, (byte) 0, (short) 0, 0, 0L, new BigDecimal("0.000000"), BigDecimal.ZERO,
                -0.0f, -0.0, false, "x\\y", "NULL", String.join("|", TRICKY),
                new byte[] {1, 2, 3, 4}, new byte[] {'\\', 'x', '0'},
                LocalDate.of(1969, 12, 31), LocalTime.of(12, 34, 56, 789_000_000),
                LocalDateTime.of(1970, 1, 1, 0, 0, 0, 1_000), LocalDateTime.of(1969, 12, 31, 23, 59, 59, 999_000_000),
                Instant.parse("1969-12-31T23:59:59.999999Z"),
                new Integer[] {null}, new String[] {null, "NULL", null}, new Double[] {-0.0},
                new BigDecimal[] {null}, new Boolean[] {null}, new byte[][] {null},
                new LocalDate[] {null}, new LocalDateTime[] {null}));
        rows.add(Row.of(4L, (byte) 1, (short) 1, 1, 1L, new BigDecimal("0.000001"), BigDecimal.ONE,
                Float.MIN_VALUE, Double.MIN_VALUE, true, "日本語", "🎉🎉🎉", "\u00a0",
                new byte[] {0, 0, 0, 0}, new byte[300], LocalDate.of(2024, 2, 29), LocalTime.of(0, 0, 0, 1_000_000),
                LocalDateTime.of(2024, 2, 29, 12, 0), LocalDateTime.of(2024, 2, 29, 12, 0, 0, 123_000_000),
                Instant.EPOCH, new Integer[] {1}, new String[] {"one"}, new Double[] {Double.MAX_VALUE},
                new BigDecimal[] {new BigDecimal("99999999.99")}, new Boolean[] {false},
                new byte[][] {new byte[] {0}}, new LocalDate[] {LocalDate.of(9999, 12, 31)},
                new LocalDateTime[] {LocalDateTime.of(0, 1, 1, 0, 0)}));
        // Random rows.
        Random random = new Random(4711);
        for (long id = 10; id < 410; id++) {
            rows.add(randomRow(random, id));
        }
        return rows;
    }

    private static Row randomRow(Random r, long id) {
        Row row = new Row(COLUMNS.length);
        row.setField(0, id);
        row.setField(1, (byte) r.nextInt());
        row.setField(2, (short) r.nextInt());
        row.setField(3, r.nextInt());
        row.setField(4, r.nextLong());
        row.setField(5, new BigDecimal(new BigInteger(66, r).mod(BigInteger.TEN.pow(20)), 6)
                .multiply(r.nextBoolean() ? BigDecimal.ONE : BigDecimal.ONE.negate()));
        row.setField(6, new BigDecimal(new BigInteger(126, r).mod(BigInteger.TEN.pow(38))));
        row.setField(7, Float.intBitsToFloat(r.nextInt()));
        row.setField(8, Double.longBitsToDouble(r.nextLong()));
        row.setField(9, r.nextBoolean());
        row.setField(10, randomString(r, 3, true));
        row.setField(11, randomString(r, r.nextInt(21), false));
        row.setField(12, randomString(r, r.nextInt(200), false));
        byte[] four = new byte[4];
        r.nextBytes(four);
        row.setField(13, four);
        byte[] bytes = new byte[r.nextInt(64)];
        r.nextBytes(bytes);
        row.setField(14, bytes);
        row.setField(15, LocalDate.ofEpochDay(randomBetween(r, LocalDate.of(0, 1, 1).toEpochDay(),
                LocalDate.of(9999, 12, 31).toEpochDay())));
        row.setField(16, LocalTime.ofNanoOfDay(r.nextInt(86_400_000) * 1_000_000L));
        row.setField(17, randomTimestamp(r, 1_000));
        row.setField(18, randomTimestamp(r, 1_000_000));
        LocalDateTime ltz = randomTimestamp(r, 1_000);
        row.setField(19, ltz.getYear() < 1 ? ltz.withYear(1).toInstant(ZoneOffset.UTC) : ltz.toInstant(ZoneOffset.UTC));
        row.setField(20, r.nextInt(4) == 0 ? null : new Integer[] {r.nextInt(), null, r.nextInt()});
        row.setField(21, new String[] {randomString(r, r.nextInt(30), false), TRICKY[r.nextInt(TRICKY.length)], null});
        row.setField(22, new Double[] {Double.longBitsToDouble(r.nextLong()), null});
        row.setField(23, new BigDecimal[] {BigDecimal.valueOf(r.nextInt(), 2), null});
        row.setField(24, new Boolean[] {r.nextBoolean()});
        row.setField(25, new byte[][] {bytes, four});
        row.setField(26, new LocalDate[] {(LocalDate) row.getField(15), null});
        row.setField(27, new LocalDateTime[] {(LocalDateTime) row.getField(17)});
        return row;
    }

    private static long randomBetween(Random r, long lo, long hi) {
        return lo + Math.floorMod(r.nextLong(), hi - lo + 1);
    }

    /** A timestamp between years 0 and 9999, a multiple of {@code nanosUnit}. */
    private static LocalDateTime randomTimestamp(Random r, long nanosUnit) {
        long lo = LocalDateTime.of(0, 1, 1, 0, 0).toEpochSecond(ZoneOffset.UTC);
        long hi = LocalDateTime.of(9999, 12, 31, 23, 59, 59).toEpochSecond(ZoneOffset.UTC);
        long seconds = randomBetween(r, lo, hi);
        int nanos = (int) (r.nextInt(1_000_000_000) / nanosUnit * nanosUnit);
        return LocalDateTime.ofEpochSecond(seconds, nanos, ZoneOffset.UTC);
    }

    /** Up to {@code length} code points: ASCII, escapes' characters, accents, CJK and emoji; never NUL. */
    private static String randomString(Random r, int length, boolean exact) {
        String pool = "abcXYZ019 \t\n\r\\\"',{}.éü日本🎉";
        int[] points = pool.codePoints().toArray();
        StringBuilder s = new StringBuilder();
        for (int i = 0; i < length; i++) {
            s.appendCodePoint(exact ? "abcxyz".charAt(r.nextInt(6)) : points[r.nextInt(points.length)]);
        }
        return s.toString();
    }

    // ------------------------------------------------------------------ reading back

    /** Each column as PostgreSQL gives it back, in a form that compares exactly; rows by id. */
    private static List<Row> readBack(String table) throws Exception {
        List<String> select = new ArrayList<>();
        for (Object[] c : COLUMNS) {
            String name = (String) c[0];
            String type = (String) c[2];
            if (type.startsWith("date[")) {
                select.add(arrayOf(name, "x - DATE '1970-01-01'"));
            } else if (type.startsWith("timestamp(6)[")) {
                select.add(arrayOf(name, "(extract(epoch FROM x) * 1000000)::int8"));
            } else if (type.startsWith("bytea[")) {
                select.add(arrayOf(name, "encode(x, 'hex')"));
            } else if (type.equals("date")) {
                select.add(name + " - DATE '1970-01-01'");
            } else if (type.startsWith("time(")) {
                select.add("(extract(epoch FROM " + name + ") * 1000)::int8");
            } else if (type.startsWith("timestamp") && !type.endsWith("]")) {
                select.add("(extract(epoch FROM " + name + ") * 1000000)::int8");
            } else {
                select.add(name);
            }
        }
        List<Row> rows = new ArrayList<>();
        try (Connection c = pg.connect(); Statement s = c.createStatement();
                ResultSet r = s.executeQuery("SELECT " + String.join(", ", select) + " FROM " + table + " ORDER BY id")) {
            while (r.next()) {
                Row row = new Row(COLUMNS.length);
                for (int i = 0; i < COLUMNS.length; i++) {
                    row.setField(i, read(r, i + 1, (String) COLUMNS[i][2]));
                }
                rows.add(row);
            }
        }
        return rows;
    }

    private static String arrayOf(String column, String element) {
        return "CASE WHEN " + column + " IS NULL THEN NULL ELSE ARRAY(SELECT " + element + " FROM unnest(" + column
                + ") WITH ORDINALITY AS u(x, i) ORDER BY i) END";
    }

    private static Object read(ResultSet r, int i, String type) throws Exception {
        Object value;
        if (type.equals("real")) {
            value = r.getFloat(i);
        } else if (type.equals("double precision")) {
            value = r.getDouble(i);
        } else if (type.equals("smallint")) {
            value = r.getShort(i);
        } else if (type.equals("bytea")) {
            value = r.getBytes(i);
        } else if (type.startsWith("numeric") && !type.endsWith("]")) {
            value = r.getBigDecimal(i);
        } else if (type.endsWith("]")) {
            java.sql.Array a = r.getArray(i);
            value = a == null ? null : Arrays.asList((Object[]) a.getArray());
        } else {
            value = r.getObject(i);
        }
        return r.wasNull() ? null : value;
    }

    /** What a written value must read back as (see {@link #readBack}). */
    private static Object expected(int column, Object v) {
        if (v == null) {
            return null;
        }
        String type = (String) COLUMNS[column][2];
        if (v instanceof Byte) {
            return (short) (byte) v;
        }
        if (v instanceof LocalDate) {
            return (int) ((LocalDate) v).toEpochDay();
        }
        if (v instanceof LocalTime) {
            return ((LocalTime) v).toNanoOfDay() / 1_000_000;
        }
        if (v instanceof LocalDateTime) {
            return micros((LocalDateTime) v);
        }
        if (v instanceof Instant) {
            Instant t = (Instant) v;
            return Math.addExact(Math.multiplyExact(t.getEpochSecond(), 1_000_000L), t.getNano() / 1000);
        }
        if (v instanceof Object[] && type.startsWith("date[")) {
            List<Object> out = new ArrayList<>();
            for (Object e : (Object[]) v) {
                out.add(e == null ? null : (int) ((LocalDate) e).toEpochDay());
            }
            return out;
        }
        if (v instanceof Object[] && type.startsWith("timestamp")) {
            List<Object> out = new ArrayList<>();
            for (Object e : (Object[]) v) {
                out.add(e == null ? null : micros((LocalDateTime) e));
            }
            return out;
        }
        if (v instanceof byte[][]) {
            List<Object> out = new ArrayList<>();
            for (byte[] e : (byte[][]) v) {
                out.add(e == null ? null : hex(e));
            }
            return out;
        }
        if (v instanceof Object[]) {
            return Arrays.asList((Object[]) v);
        }
        return v;
    }

    private static long micros(LocalDateTime t) {
        return Math.addExact(Math.multiplyExact(t.toEpochSecond(ZoneOffset.UTC), 1_000_000L), t.getNano() / 1000);
    }

    private static String hex(byte[] bytes) {
        StringBuilder s = new StringBuilder();
        for (byte b : bytes) {
            s.append(String.format("%02x", b & 0xff));
        }
        return s.toString();
    }

    private static String show(Object v) {
        if (v instanceof byte[]) {
            return "0x" + hex((byte[]) v);
        }
        if (v instanceof Object[]) {
            return Arrays.deepToString((Object[]) v);
        }
        return String.valueOf(v);
    }
}
