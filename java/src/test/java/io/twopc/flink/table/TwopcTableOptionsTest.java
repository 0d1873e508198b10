package io.twopc.flink.table;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;

import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Bad DDL of the SQL connector is refused while the statement is planned, before any job runs,
 * with a {@code ValidationException} that names the table and the option, and says what to change
 * (and, for options that are unknown or of the other kind of table, which options exist). A
 * password given in the DDL never shows in an error or a plan.
 */
public class TwopcTableOptionsTest {
    private static final String SECRET = "hunter2-Secret-4711";

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    /** Plans {@code INSERT INTO t} into a table of {@code columns} with {@code options}; returns the error chain's messages. */
    private String refusal(String columns, String options) {
        return refusal(columns, options, true);
    }

    /**
     * {@code flinkMayShowIt}: Flink's own wrapper of the factory's error lists the table's options as
     * written, masking only keys it deems secret ('password', ...); a password put into another
     * option (a URL) shows there, though never in twopc's own message.
     */
    private String refusal(String columns, String options, boolean strict) {
        TableEnvironment tEnv = environment();
        tEnv.executeSql("CREATE TABLE t (" + columns + ") WITH ('connector' = 'twopc'" + options + ")");
        try {
            String plan = tEnv.explainSql("INSERT INTO t SELECT * FROM (SELECT " + nulls(columns) + ")");
            throw new AssertionError("planning should have failed, but gave:\n" + plan);
        } catch (RuntimeException e) {
            List<String> messages = new ArrayList<>();
            boolean validation = false;
            for (Throwable t = e; t != null; t = t.getCause()) {
                messages.add(t.getClass().getSimpleName() + ": " + t.getMessage());
                validation |= t instanceof org.apache.flink.table.api.ValidationException;
            }
            String all = String.join("\n", messages);
            assertThat(validation).as("a ValidationException in %s", all).isTrue();
            if (strict) {
                assertThat(all).as("the password never shows").doesNotContain(SECRET);
            } else {
                assertThat(messages.subList(1, messages.size())).as("twopc's messages never show the password")
                        .allSatisfy(m -> assertThat(m).doesNotContain(SECRET));
            }
            return all;
        }
    }

    /** {@code CAST(NULL AS <type>)} for each column of a DDL column list. */
    private static String nulls(String columns) {
        List<String> values = new ArrayList<>();
        int depth = 0;
        StringBuilder current = new StringBuilder();
        for (char c : (columns + ",").toCharArray()) {
            if (c == ',' && depth == 0) {
                String col = current.toString().trim();
                if (!col.toUpperCase().startsWith("PRIMARY KEY")) {
                    String type = col.substring(col.indexOf(' ') + 1).replace("NOT NULL", "").trim();
                    values.add("CAST(NULL AS " + type + ")");
                }
                current.setLength(0);
                continue;
            }
            depth += c == '(' || c == '<' ? 1 : c == ')' || c == '>' ? -1 : 0;
            current.append(c);
        }
        return String.join(", ", values);
    }

    private String dir() {
        return ", 'sink-id' = 'opts', 'path' = '" + tmp.getRoot() + "'";
    }

    private static final String PG = ", 'sink-id' = 'opts', 'url' = 'postgres://app@db.example:5432/shop', "
            + "'table-name' = 'public.orders'";

    @Test
    public void aTableWritesToADirectoryOrToPostgresql() {
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'url' = 'postgres://app@db/x'"))
                .contains("twopc table 'default_catalog.default_database.t'", "both 'path'", "and 'url'",
                        "keep 'path' with 'format', or 'url' with 'table-name'", "'sink.part-prefix'",
                        "'password-env'", "'sink.retention'");
        assertThat(refusal("a INT", ", 'sink-id' = 'opts'"))
                .contains("neither 'path' (a directory) nor 'url' (a PostgreSQL table) is set");
    }

    @Test
    public void optionsOfTheOtherKindOfTableAreRefused() {
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'table-name' = 'x', 'sink.mode' = 'idempotent'"))
                .contains("'table-name', 'sink.mode' apply to PostgreSQL tables ('url') only",
                        "this table writes to a directory ('path'); remove them");
        assertThat(refusal("a INT", PG + ", 'format' = 'csv'"))
                .contains("'format' applies to directory tables ('path') only");
    }

    @Test
    public void theFormatMustBeALinePerRecordFormatOnTheClasspath() {
        assertThat(refusal("a INT", dir())).contains("a directory table needs 'format'",
                "formats on the classpath: ", "csv, ", "json, ", "raw");
        assertThat(refusal("a INT", dir() + ", 'format' = 'parquet'"))
                .contains("'format' = 'parquet' is not a format on the classpath", "bulk formats such as parquet",
                        "formats on the classpath: ", "csv, ", "json, ", "raw");
        // Binary formats: their records may hold line feeds and carry no length.
        for (String binary : new String[] {"avro", "protobuf"}) {
            assertThat(refusal("a INT", dir() + ", 'format' = '" + binary + "'"))
                    .contains("'format' = '" + binary + "' writes binary records", "use a text format");
        }
        // The format's own options are the format's to check.
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'csv.no-such-option' = 'x'"))
                .contains("Unsupported options", "csv.no-such-option", "csv.field-delimiter");
    }

    @Test
    public void unknownAndMissingOptionsNameTheKnownOnes() {
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.retension' = '1 d'"))
                .contains("Unsupported options", "sink.retension", "Supported options", "sink.retention",
                        "sink-id", "sink.fresh-start-policy", "table-name");
        assertThat(refusal("a INT", ", 'path' = '/tmp/x', 'format' = 'csv'"))
                .contains("Missing required options", "sink-id");
    }

    @Test
    public void valuesMustParse() {
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.rewind-policy' = 'sometimes'"))
                .contains("'sink.rewind-policy' = 'sometimes' is not one of 'fail', 'replace-range'");
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.fresh-start-policy' = 'abort'"))
                .contains("'fail', 'abort-prepared', 'append', 'append-and-abort-prepared'");
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.io-mode' = 'fast'"))
                .contains("'sink.io-mode' = 'fast' is not one of 'auto', 'direct', 'buffered'");
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.commit-order' = 'fast'"))
                .contains("'sink.commit-order' = 'fast' is not one of 'durable-first', 'visible-first'");
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.retention' = 'forever'"))
                .contains("sink.retention");
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.batch-bytes' = '3 gb'"))
                .contains("'sink.batch-bytes' = '3 gb' is too large");
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.lineage-wait' = 'a while'"))
                .contains("sink.lineage-wait");
        TableEnvironment tEnv = environment();
        tEnv.executeSql("CREATE TABLE w (a INT) WITH ('connector' = 'twopc'" + dir() + ", 'format' = 'csv', "
                + "'sink.lineage-wait' = '15 s', 'sink.owner-wait' = '1 s', 'sink.commit-order' = 'visible-first')");
        assertThat(tEnv.explainSql("INSERT INTO w VALUES (1)")).contains("default_catalog.default_database.w");
    }

    @Test
    public void settingsThatCannotWorkAreRefusedWithTheOptionsName() {
        assertThat(refusal("a INT", ", 'sink-id' = '../x', 'path' = '/tmp/x', 'format' = 'csv'"))
                .contains("the options cannot work", "'sink-id'");
        assertThat(refusal("a INT", ", 'sink-id' = 'x', 'path' = 'relative/dir', 'format' = 'csv'"))
                .contains("the options cannot work", "relative/dir");
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.retention' = '1 s', "
                + "'sink.checkpoint-interval' = '10 s'"))
                .contains("the options cannot work", "'sink.retention'");
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.batch-size' = '0'"))
                .contains("the options cannot work", "'sink.batch-size'");
        assertThat(refusal("a INT", dir() + ", 'format' = 'csv', 'sink.part-prefix' = 'a/b'"))
                .contains("the options cannot work", "'sink.part-prefix' \"a/b\"");
    }

    /** The builder's refusals of object-store settings, in the words of the table's options. */
    @Test
    public void objectStoreSettingsThatCannotWorkAreRefusedWithTheOptionsName() {
        String store = ", 'sink-id' = 'opts', 'path' = 's3://bucket/prefix', 'format' = 'csv'";
        assertThat(refusal("a INT", store + ", 'sink.io-mode' = 'direct'"))
                .contains("the options cannot work", "remove 'sink.io-mode'")
                .doesNotContain("setIoMode");
        assertThat(refusal("a INT", store + ", 'sink.commit-order' = 'visible-first'"))
                .contains("the options cannot work", "remove 'sink.commit-order'")
                .doesNotContain("setCommitOrder");
        assertThat(refusal("a INT", store + ", 's3.part-size' = '1 mb'"))
                .contains("the options cannot work", "'s3.part-size' = '8mb' is the default")
                .doesNotContain("partSize(");
        assertThat(refusal("a INT", store + ", 's3.endpoint' = 'http://127.0.0.1:9000'"))
                .contains("the options cannot work", "'s3.allow-http' = 'true'")
                .doesNotContain("allowHttp(");
    }

    @Test
    public void postgresqlModesAndKeys() {
        assertThat(refusal("id BIGINT", PG + ", 'sink.mode' = 'upsert'"))
                .contains("'sink.mode' = 'upsert' is not one of 'transactional', 'idempotent'");
        assertThat(refusal("id BIGINT", PG + ", 'sink.mode' = 'idempotent'"))
                .contains("'sink.mode' = 'idempotent' upserts and deletes by the table's primary key",
                        "PRIMARY KEY (column, ...) NOT ENFORCED");
        assertThat(refusal("id BIGINT NOT NULL, v STRING, PRIMARY KEY (id) NOT ENFORCED",
                PG + ", 'sink.mode' = 'idempotent', 'sink.transaction-id-column' = 'txn'"))
                .contains("'sink.transaction-id-column' applies to 'sink.mode' = 'transactional' only");
        assertThat(refusal("id BIGINT", PG + ", 'sink.rewind-policy' = 'replace-range'"))
                .contains("needs 'sink.transaction-id-column'");
    }

    @Test
    public void postgresqlColumnTypesWithoutAnExactCounterpartAreRefused() {
        assertThat(refusal("id BIGINT, m MAP<STRING, INT>", PG))
                .contains("column 'm' has type MAP<STRING, INT>", "no PostgreSQL counterpart", "STRING");
        assertThat(refusal("id BIGINT, t TIMESTAMP(9)", PG))
                .contains("column 't' has type TIMESTAMP(9)", "PostgreSQL keeps microseconds", "TIMESTAMP(6)");
        assertThat(refusal("id BIGINT, t ARRAY<TIMESTAMP_LTZ(7)>", PG))
                .contains("column 't'", "and its elements, TIMESTAMP_LTZ(7), but", "TIMESTAMP_LTZ(6)");
        assertThat(refusal("id BIGINT, a ARRAY<ARRAY<INT>>", PG)).contains("its elements, ARRAY<INT>, are arrays");
    }

    @Test
    public void passwordsAreGivenOneWayAndNeverShown() {
        // In the URL: refused, and not shown.
        assertThat(refusal("id BIGINT", ", 'sink-id' = 'opts', 'table-name' = 'orders', "
                + "'url' = 'postgres://app:" + SECRET + "@db:5432/shop'", false))
                .contains("'url' postgres://app:***@db:5432/shop carries a password", "'password-env'");
        assertThat(refusal("id BIGINT", PG + ", 'password' = '" + SECRET + "', 'password-env' = 'PGPW'"))
                .contains("both 'password' and 'password-env' are set");
        // Flink lists the table's options in its error, with the password masked.
        assertThat(refusal("id BIGINT", PG + ", 'password' = '" + SECRET + "', 'sink.mode' = 'x'"))
                .contains("is not one of 'transactional', 'idempotent'");
        assertThat(refusal("id BIGINT", PG + ", 'username' = 'other'")).contains("'url' names a user and "
                + "'username' is set too");
        // The key=value form too: 'username' would otherwise silently replace the user in 'url'.
        assertThat(refusal("id BIGINT", ", 'sink-id' = 'opts', 'table-name' = 'orders', "
                + "'url' = 'host=db dbname=shop user=app', 'username' = 'other'"))
                .contains("'url' names a user and 'username' is set too");
    }

    /** A streaming table environment with checkpoints (the sink refuses to plan without them). */
    private static TableEnvironment environment() {
        Configuration conf = new Configuration();
        conf.setString("execution.checkpointing.interval", "1 s");
        return TableEnvironment.create(EnvironmentSettings.newInstance().inStreamingMode().withConfiguration(conf)
                .build());
    }

    @Test
    public void withoutCheckpointsTheQueryIsRefusedSayingHowToEnableThem() {
        TableEnvironment tEnv = TableEnvironment.create(EnvironmentSettings.inStreamingMode());
        tEnv.executeSql("CREATE TABLE d (a INT) WITH ('connector' = 'twopc'" + dir() + ", 'format' = 'json')");
        assertThatThrownBy(() -> tEnv.explainSql("INSERT INTO d VALUES (1)"))
                .hasMessageContaining("checkpointing is disabled")
                .hasMessageContaining("execution.checkpointing.interval");
    }

    /**
     * SQL's batch mode ({@code SET 'execution.runtime-mode' = 'batch'}) takes no checkpoints, and
     * Flink would commit each subtask's output at the end of its input: refused when planned, even
     * with a checkpoint interval set (Flink turns checkpoints off for BATCH behind the setting).
     */
    @Test
    public void batchModeIsRefusedSayingToRunInStreamingMode() {
        Configuration conf = new Configuration();
        conf.setString("execution.checkpointing.interval", "1 s");
        TableEnvironment tEnv = TableEnvironment.create(EnvironmentSettings.newInstance().inBatchMode()
                .withConfiguration(conf).build());
        tEnv.executeSql("CREATE TABLE d (a INT) WITH ('connector' = 'twopc'" + dir() + ", 'format' = 'json')");
        assertThatThrownBy(() -> tEnv.explainSql("INSERT INTO d VALUES (1)"))
                .hasMessageContaining("BATCH execution mode")
                .hasMessageContaining("execution.runtime-mode: STREAMING");
    }

    @Test
    public void aValidTableIsPlannedAndItsPlanHoldsNoPassword() {
        TableEnvironment tEnv = environment();
        tEnv.executeSql("CREATE TABLE t (id BIGINT NOT NULL, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH "
                + "('connector' = 'twopc', 'sink-id' = 'opts', 'url' = 'jdbc:postgresql://db.example:5432/shop', "
                + "'username' = 'app', 'password' = '" + SECRET + "', 'table-name' = 'orders', "
                + "'sink.mode' = 'idempotent')");
        String plan = tEnv.explainSql("INSERT INTO t VALUES (1, 'a')");
        assertThat(plan).contains("default_catalog.default_database.t").doesNotContain(SECRET);
        tEnv.executeSql("CREATE TABLE d (a INT) WITH ('connector' = 'twopc'" + dir() + ", 'format' = 'json')");
        assertThat(tEnv.explainSql("INSERT INTO d VALUES (1)")).contains("default_catalog.default_database.d");
    }

    @Test
    public void usernameAndJdbcUrlsBecomeTheConnectionString() {
        // A user in a quoted value is no user key.
        assertThat(TwopcDynamicTableSinkFactory.connectionString("t", "host=h options='-c user=x'", "u"))
                .isEqualTo("host=h options='-c user=x' user='u'");
        assertThat(TwopcDynamicTableSinkFactory.connectionString("t", "jdbc:postgresql://h:5432/db", "a b"))
                .isEqualTo("postgresql://a%20b@h:5432/db");
        assertThat(TwopcDynamicTableSinkFactory.connectionString("t", "postgres://h/db", null))
                .isEqualTo("postgres://h/db");
        assertThat(TwopcDynamicTableSinkFactory.connectionString("t", "host=h dbname=d", "o'k"))
                .isEqualTo("host=h dbname=d user='o\\'k'");
    }
}
