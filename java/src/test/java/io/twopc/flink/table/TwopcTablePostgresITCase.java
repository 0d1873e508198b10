package io.twopc.flink.table;

import io.twopc.flink.it.TwopcItSupport;
import io.twopc.flink.testing.TestPostgres;

import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.typeutils.RowTypeInfo;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.table.api.DataTypes;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.Schema;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.table.api.ValidationException;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.test.util.MiniClusterWithClientResource;
import org.apache.flink.types.Row;
import org.apache.flink.types.RowKind;

import org.junit.After;
import org.junit.Before;
import org.junit.BeforeClass;
import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TestName;

import java.io.IOException;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import static io.twopc.flink.it.TwopcItSupport.assertAllOnce;
import static io.twopc.flink.table.SqlTestSupport.*;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The SQL connector on PostgreSQL tables ({@code TWOPC_PG_URL}, see {@code scripts/postgres.sh}),
 * on a MiniCluster, on Flink 1.20 ({@code test}) and 2.x ({@code test2x}) from one jar:
 *
 * <ul>
 *   <li>transactional: {@code INSERT INTO} from {@code datagen} with a failure injected after rows
 *       became visible; the table then holds every row exactly once;
 *   <li>idempotent (upsert): an aggregation whose rows are updated and deleted (a {@code HAVING}
 *       that a group enters and leaves), with a failure mid-way, ends equal to the expected final
 *       state;
 *   <li>an updating query into a transactional table is refused while planned;
 *   <li>passwords: given as the masked {@code 'password'} option or as {@code 'password-env'};
 *       never in the task managers' logs or a failed job's error.
 * </ul>
 *
 * <p>The round trip of every type is {@link TwopcTablePostgresTypesITCase}'s.
 */
public class TwopcTablePostgresITCase {
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();
    /** Set by build.gradle from TWOPC_PG_URL, as an operator would set it on every task manager. */
    static final String PASSWORD_VARIABLE = "TWOPC_TEST_PG_PASSWORD";

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = TwopcItSupport.cluster(METRICS, 4);

    @Rule
    public final TestName name = new TestName();

    private static TestPostgres pg;
    private String table;
    private String sinkId;

    @BeforeClass
    public static void server() {
        pg = TestPostgres.fromEnvironment();
        assertThat(pg.password).as("the test server's URL carries a password").isNotNull();
        assertThat(System.getenv(PASSWORD_VARIABLE)).as(PASSWORD_VARIABLE + " (set by build.gradle)")
                .isEqualTo(pg.password);
    }

    @Before
    public void names() {
        table = TestPostgres.uniqueName("sql");
        sinkId = TestPostgres.uniqueName("sql").replace('_', '-');
    }

    @After
    public void cleanUp() throws Exception {
        pg.rollbackAllPrepared(sinkId);
        pg.execute("DROP TABLE IF EXISTS " + table);
    }

    private String test() {
        return getClass().getSimpleName() + "." + name.getMethodName();
    }

    /** The connector options of a table on the test server, with {@code password}'s own option. */
    static String pgOptions(TestPostgres pg, String sinkId, String table, String password) {
        return "'connector' = 'twopc', 'sink-id' = '" + sinkId + "', 'url' = '" + pg.urlWithoutPassword() + "', "
                + "'table-name' = '" + table + "', " + password
                + ", 'sink.commit.initial-backoff' = '10 ms', 'sink.commit.max-backoff' = '100 ms'";
    }

    private static void numbers(StreamTableEnvironment tEnv, long count, int rowsPerSecond) {
        tEnv.executeSql("CREATE TEMPORARY TABLE numbers (id BIGINT) WITH ("
                + "'connector' = 'datagen', 'rows-per-second' = '" + rowsPerSecond + "', "
                + "'fields.id.kind' = 'sequence', 'fields.id.start' = '1', 'fields.id.end' = '" + count + "')");
    }

    private long rows() {
        try {
            return pg.count(table);
        } catch (SQLException e) {
            return -1;
        }
    }

    /** The end of the test log (build/test-flink.log), to look at what a test added to it. */
    private static long logLength() throws IOException {
        Path log = Paths.get("build", "test-flink.log");
        return Files.exists(log) ? Files.size(log) : 0;
    }

    private static String logSince(long offset) throws IOException {
        byte[] all = Files.readAllBytes(Paths.get("build", "test-flink.log"));
        return new String(all, (int) Math.min(offset, all.length), (int) Math.max(0, all.length - offset),
                StandardCharsets.UTF_8);
    }

    // ------------------------------------------------------------------ transactional

    @Test
    public void transactionalInsertFromDatagenWithAFailureIsExactlyOnce() throws Exception {
        long count = 30_000;
        pg.execute("CREATE TABLE " + table + " (id bigint NOT NULL, body text NOT NULL, "
                + "placed timestamp(3) NOT NULL)");
        long logStart = logLength();
        StreamTableEnvironment tEnv = streaming(2, 200);
        numbers(tEnv, count, 5_000);
        tEnv.executeSql("CREATE TABLE pg_rows (id BIGINT, body STRING, placed TIMESTAMP(3)) WITH ("
                + pgOptions(pg, sinkId, table, "'password' = '" + pg.password + "'") + ", 'sink.batch-size' = '500')");
        TableResult result = tEnv.executeSql("INSERT INTO pg_rows SELECT FAIL_ONCE('" + test() + "', id), "
                + "'row ' || CAST(id AS STRING), TIMESTAMP '2024-02-29 12:00:00.123' FROM numbers");

        // Fail once some rows are committed (visible), so the restart must neither lose nor repeat them.
        waitUntil("committed rows", () -> rows() > 0);
        arm(test());
        runToEnd(result);
        assertThat(fired(test())).as("the injected failure").hasSize(1);

        assertAllOnce("table " + table, pg.queryStrings("SELECT id FROM " + table), count);
        assertThat(pg.queryLongs("SELECT count(*) FROM " + table + " WHERE body <> 'row ' || id "
                + "OR placed <> TIMESTAMP '2024-02-29 12:00:00.123'")).containsExactly(0L);
        assertThat(pg.preparedTransactions(sinkId)).as("transactions left prepared").isEmpty();
        // The password given in the DDL shows in no log line of the job.
        assertThat(logSince(logStart)).as("the test log").contains(sinkId).doesNotContain(pg.password);
    }

    @Test
    public void anUpdatingQueryIntoATransactionalTableIsRefusedSayingWhatToChange() throws Exception {
        pg.execute("CREATE TABLE " + table + " (k bigint PRIMARY KEY, n bigint NOT NULL)");
        StreamTableEnvironment tEnv = streaming(2, 200);
        numbers(tEnv, 10, 10);
        tEnv.executeSql("CREATE TABLE counts (k BIGINT, n BIGINT) WITH ("
                + pgOptions(pg, sinkId, table, "'password-env' = '" + PASSWORD_VARIABLE + "'") + ")");
        assertThatThrownBy(() -> tEnv.executeSql("INSERT INTO counts SELECT id % 3, COUNT(*) FROM numbers "
                + "GROUP BY id % 3"))
                .isInstanceOf(ValidationException.class)
                .satisfies(e -> assertThat(e.getMessage()).contains(
                        "twopc table 'default_catalog.default_database.counts' cannot take the query's changes",
                        "UPDATE_AFTER", "'sink.mode' = 'transactional', which appends rows (inserts only)",
                        "PRIMARY KEY (column, ...) NOT ENFORCED", "set 'sink.mode' = 'idempotent'",
                        "or make the query insert-only"));
        assertThat(pg.count(table)).isZero();
    }

    // ------------------------------------------------------------------ idempotent (upsert)

    @Test
    public void anUpsertQueryWithUpdatesAndDeletesEndsInTheExpectedStateAfterAFailure() throws Exception {
        long count = 24_000;
        int groups = 50;
        pg.execute("CREATE TABLE " + table + " (k bigint PRIMARY KEY, n bigint NOT NULL, last_id bigint NOT NULL)");
        StreamTableEnvironment tEnv = streaming(2, 200);
        numbers(tEnv, count, 4_000);
        tEnv.executeSql("CREATE TABLE latest (k BIGINT NOT NULL, n BIGINT, last_id BIGINT, "
                + "PRIMARY KEY (k) NOT ENFORCED) WITH ("
                + pgOptions(pg, sinkId, table, "'password-env' = '" + PASSWORD_VARIABLE + "'")
                + ", 'sink.mode' = 'idempotent', 'sink.batch-size' = '200')");
        // Every group is updated with each row, and enters and leaves the result as its highest id
        // moves in and out of the HAVING condition: upserts and deletes by key.
        TableResult result = tEnv.executeSql("INSERT INTO latest SELECT k, COUNT(*), MAX(id) FROM ("
                + "SELECT FAIL_ONCE('" + test() + "', id) % " + groups + " AS k, id FROM numbers) "
                + "GROUP BY k HAVING MAX(id) % 7 <> 0");

        waitUntil("upserted rows", () -> rows() > 0);
        Thread.sleep(500);
        arm(test());
        runToEnd(result);
        assertThat(fired(test())).as("the injected failure").hasSize(1);

        // Expected: per group, its row count and highest id, present unless that id is a multiple of 7.
        Map<Long, String> expected = new TreeMap<>();
        for (long k = 0; k < groups; k++) {
            long last = count - ((count - k) % groups);
            if (last % 7 != 0) {
                expected.put(k, (count / groups) + "/" + last);
            }
        }
        assertThat(expected.size()).isBetween(1, groups - 1);
        Map<Long, String> actual = new TreeMap<>();
        try (Connection c = pg.connect(); Statement s = c.createStatement();
                ResultSet r = s.executeQuery("SELECT k, n, last_id FROM " + table)) {
            while (r.next()) {
                actual.put(r.getLong(1), r.getLong(2) + "/" + r.getLong(3));
            }
        }
        assertThat(actual).isEqualTo(expected);
    }

    /**
     * An upsert source whose deletes carry only the key (an upsert-kafka tombstone; here {@code
     * fromChangelogStream} in upsert mode) into a table with a NOT NULL column besides the key.
     * The table must ask for whole deleted rows: told that deletes may carry the key alone, Flink
     * 2.x hands them over without their values, and its NOT NULL check on the sink's input then
     * stops the job at the first delete ("Column 'amount' is NOT NULL, however, a null value is
     * being written into it"), though no value is null.
     */
    @Test
    public void deletesOfAnUpsertSourceThatCarryOnlyTheKeyDeleteTheRow() throws Exception {
        pg.execute("CREATE TABLE " + table + " (id bigint PRIMARY KEY, amount numeric(20,2) NOT NULL)");
        StreamExecutionEnvironment env = TwopcItSupport.environment(1, 100, 0, Duration.ofMillis(200));
        StreamTableEnvironment tEnv = StreamTableEnvironment.create(env, EnvironmentSettings.inStreamingMode());
        DataStream<Row> changes = env.fromData(
                new RowTypeInfo(new TypeInformation<?>[] {Types.LONG, Types.BIG_DEC}, new String[] {"id", "amount"}),
                Row.ofKind(RowKind.INSERT, 1L, new BigDecimal("1.50")),
                Row.ofKind(RowKind.INSERT, 2L, new BigDecimal("2.50")),
                Row.ofKind(RowKind.UPDATE_AFTER, 2L, new BigDecimal("3.50")),
                Row.ofKind(RowKind.DELETE, 1L, null));
        tEnv.createTemporaryView("changes", tEnv.fromChangelogStream(changes, Schema.newBuilder()
                .column("id", DataTypes.BIGINT().notNull())
                .column("amount", DataTypes.DECIMAL(20, 2).notNull())
                .primaryKey("id")
                .build(), ChangelogMode.upsert()));
        tEnv.executeSql("CREATE TABLE amounts (id BIGINT NOT NULL, amount DECIMAL(20, 2) NOT NULL, "
                + "PRIMARY KEY (id) NOT ENFORCED) WITH ("
                + pgOptions(pg, sinkId, table, "'password-env' = '" + PASSWORD_VARIABLE + "'")
                + ", 'sink.mode' = 'idempotent')");

        runToEnd(tEnv.executeSql("INSERT INTO amounts SELECT * FROM changes"));

        List<String> rows = new ArrayList<>();
        try (Connection c = pg.connect(); Statement s = c.createStatement();
                ResultSet r = s.executeQuery("SELECT id, amount FROM " + table + " ORDER BY id")) {
            while (r.next()) {
                rows.add(r.getLong(1) + "=" + r.getBigDecimal(2));
            }
        }
        assertThat(rows).containsExactly("2=3.50");
    }

    // ------------------------------------------------------------------ declared types

    /**
     * A DDL type PostgreSQL would change silently (DECIMAL(10, 4) into numeric(10,2) rounds 1.2345 to
     * 1.23) stops the job at its start, naming the column and both types, before any row is written.
     */
    @Test
    public void aColumnPostgresWouldRoundStopsTheJobAtItsStartNamingIt() throws Exception {
        pg.execute("CREATE TABLE " + table + " (id bigint NOT NULL, amount numeric(10,2))");
        StreamTableEnvironment tEnv = streaming(1, 200);
        numbers(tEnv, 100, 100);
        tEnv.executeSql("CREATE TABLE pg_rows (id BIGINT, amount DECIMAL(10, 4)) WITH ("
                + pgOptions(pg, sinkId, table, "'password-env' = '" + PASSWORD_VARIABLE + "'") + ")");
        Throwable failure = runToFailure(tEnv.executeSql(
                "INSERT INTO pg_rows SELECT id, CAST(1.2345 AS DECIMAL(10, 4)) FROM numbers"));
        List<String> messages = messagesOf(failure);
        String all = String.join("\n", messages);
        assertThat(all).contains("column \"amount\"", "numeric(10,2)", "DECIMAL(10, 4)",
                "round its 4 fraction digits to 2");
        assertThat(TwopcItSupport.findCause(failure, org.apache.flink.runtime.execution.SuppressRestartsException.class))
                .as("a configuration that cannot work stops the job without a restart loop: %s", all).isNotNull();
        assertThat(pg.count(table)).isZero();
        assertThat(all).as("the way out is named").contains("'sink.check-column-types' = 'false'");

        // With the check turned off, PostgreSQL converts the values, as before the check existed.
        StreamTableEnvironment unchecked = streaming(1, 200);
        numbers(unchecked, 100, 100);
        unchecked.executeSql("CREATE TABLE pg_rows (id BIGINT, amount DECIMAL(10, 4)) WITH ("
                + pgOptions(pg, sinkId, table, "'password-env' = '" + PASSWORD_VARIABLE + "'")
                + ", 'sink.check-column-types' = 'false')");
        runToEnd(unchecked.executeSql("INSERT INTO pg_rows SELECT id, CAST(1.2345 AS DECIMAL(10, 4)) FROM numbers"));
        assertThat(pg.queryStrings("SELECT DISTINCT amount::text FROM " + table)).containsExactly("1.23");
        assertThat(pg.count(table)).isEqualTo(100);
    }

    // ------------------------------------------------------------------ passwords

    @Test
    public void aWrongPasswordStopsTheJobWithoutShowingIt() throws Exception {
        String wrong = "wrong-pw-" + Long.toHexString(System.nanoTime());
        pg.execute("CREATE TABLE " + table + " (id bigint NOT NULL)");
        long logStart = logLength();
        StreamTableEnvironment tEnv = streaming(1, 200);
        numbers(tEnv, 100, 100);
        tEnv.executeSql("CREATE TABLE pg_rows (id BIGINT) WITH ("
                + pgOptions(pg, sinkId, table, "'password' = '" + wrong + "'") + ")");
        Throwable failure = runToFailure(tEnv.executeSql("INSERT INTO pg_rows SELECT id FROM numbers"));
        List<String> messages = messagesOf(failure);
        String all = String.join("\n", messages);
        assertThat(all).contains("password authentication failed").doesNotContain(wrong);
        assertThat(TwopcItSupport.findCause(failure, org.apache.flink.runtime.execution.SuppressRestartsException.class))
                .as("a refused login stops the job without a restart loop: %s", all).isNotNull();
        assertThat(logSince(logStart)).doesNotContain(wrong);
        assertThat(pg.count(table)).isZero();
    }

    @Test
    public void aPasswordVariableMissingOnTheTaskManagersStopsTheJobNamingIt() throws Exception {
        pg.execute("CREATE TABLE " + table + " (id bigint NOT NULL)");
        StreamTableEnvironment tEnv = streaming(1, 200);
        numbers(tEnv, 100, 100);
        tEnv.executeSql("CREATE TABLE pg_rows (id BIGINT) WITH ("
                + pgOptions(pg, sinkId, table, "'password-env' = 'TWOPC_NO_SUCH_VARIABLE'") + ")");
        Throwable failure = runToFailure(tEnv.executeSql("INSERT INTO pg_rows SELECT id FROM numbers"));
        List<String> messages = messagesOf(failure);
        assertThat(String.join("\n", messages))
                .contains("environment variable TWOPC_NO_SUCH_VARIABLE, which is not set on this task manager");
    }

    /** The messages of {@code failure} and of every cause under it, outermost first. */
    private static List<String> messagesOf(Throwable failure) {
        List<String> messages = new ArrayList<>();
        for (Throwable t = failure; t != null; t = t.getCause()) {
            messages.add(String.valueOf(t.getMessage()));
        }
        return messages;
    }
}
