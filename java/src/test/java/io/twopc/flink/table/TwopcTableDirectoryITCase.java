package io.twopc.flink.table;

import io.twopc.flink.TwopcOutput;
import io.twopc.flink.it.TwopcItSupport;

import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.table.api.ValidationException;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;
import org.apache.flink.types.Row;

import org.junit.After;
import org.junit.Before;
import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;
import org.junit.rules.TestName;

import java.nio.file.Path;
import java.util.List;
import java.util.stream.Collectors;

import static io.twopc.flink.it.TwopcItSupport.assertAllOnce;
import static io.twopc.flink.it.TwopcItSupport.clearFailPoints;
import static io.twopc.flink.it.TwopcItSupport.committedFileCount;
import static io.twopc.flink.it.TwopcItSupport.configureFailPoints;
import static io.twopc.flink.it.TwopcItSupport.listNames;
import static io.twopc.flink.it.TwopcItSupport.stagingDir;
import static io.twopc.flink.table.SqlTestSupport.*;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The SQL connector on directories, on a MiniCluster (run on Flink 1.20 by {@code test} and on
 * 2.x by {@code test2x}, from one jar): {@code INSERT INTO} a {@code 'connector' = 'twopc'} table
 * from {@code datagen} with a failure injected mid-way, then the directory read back (by
 * twopc's reader and by Flink's own filesystem connector) must hold every row exactly once; the
 * format's options pass through; a query that updates is refused while it is planned.
 */
public class TwopcTableDirectoryITCase {
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = TwopcItSupport.cluster(METRICS, 4);

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    @Rule
    public final TestName name = new TestName();

    @Before
    @After
    public void resetFailPoints() {
        clearFailPoints();
    }

    private String test() {
        return getClass().getSimpleName() + "." + name.getMethodName();
    }

    /** A bounded datagen table of ids 1..count (checkpointed position: replayable) and a text column. */
    private static void numbers(StreamTableEnvironment tEnv, long count, int rowsPerSecond) {
        tEnv.executeSql("CREATE TEMPORARY TABLE numbers (id BIGINT, body STRING) WITH ("
                + "'connector' = 'datagen', 'rows-per-second' = '" + rowsPerSecond + "', "
                + "'fields.id.kind' = 'sequence', 'fields.id.start' = '1', 'fields.id.end' = '" + count + "', "
                + "'fields.body.length' = '12')");
    }

    @Test
    public void csvFromDatagenWithAFailureAfterACommitIsExactlyOnce() throws Exception {
        long count = 30_000;
        Path out = tmp.newFolder("csv").toPath();
        StreamTableEnvironment tEnv = streaming(2, 200);
        numbers(tEnv, count, 5_000);
        tEnv.executeSql("CREATE TABLE sink_csv (id BIGINT, body STRING, tag STRING) WITH ("
                + "'connector' = 'twopc', 'sink-id' = 'sql-csv', 'path' = '" + out + "', "
                + "'format' = 'csv', 'csv.field-delimiter' = ';', 'csv.quote-character' = '''', "
                + "'sink.part-suffix' = '.csv', 'sink.batch-size' = '300')");
        TableResult result = tEnv.executeSql("INSERT INTO sink_csv "
                + "SELECT FAIL_ONCE('" + test() + "', id), body, 'a;b' FROM numbers");

        // Fail once some output is committed, so the restart must neither lose nor repeat it.
        waitUntil("a committed file", () -> committedFileCount(out) > 0);
        arm(test());
        runToEnd(result);
        assertThat(fired(test())).as("the injected failure").hasSize(1);

        // The format's options passed through: ';' between fields, the value with ';' quoted with '.
        List<String> lines = TwopcOutput.readCommittedRecords(out);
        assertThat(lines.get(0)).matches("\\d+;'[0-9a-f]{12}';'a;b'");
        assertAllOnce("TwopcOutput", lines.stream().map(l -> l.substring(0, l.indexOf(';')))
                .collect(Collectors.toList()), count);
        assertThat(TwopcOutput.committedFiles(out, "part")).allSatisfy(
                f -> assertThat(f.getFileName().toString()).startsWith("part-sql-csv.").endsWith(".csv"));
        assertThat(listNames(stagingDir(out, "sql-csv"))).as("staged transactions left").isEmpty();

        // Flink's own filesystem connector reads the same rows (it skips _twopc/ like any '_' name).
        TableEnvironment reader = batch();
        reader.executeSql("CREATE TABLE back (id BIGINT, body STRING, tag STRING) WITH ("
                + "'connector' = 'filesystem', 'path' = '" + out + "', 'format' = 'csv', "
                + "'csv.field-delimiter' = ';', 'csv.quote-character' = '''')");
        List<Row> rows = collect(reader, "SELECT id, tag FROM back");
        assertAllOnce("Flink filesystem connector", rows.stream().map(r -> String.valueOf(r.getField(0)))
                .collect(Collectors.toList()), count);
        assertThat(rows).allSatisfy(r -> assertThat(r.getField(1)).isEqualTo("a;b"));
    }

    @Test
    public void jsonWithFaultsInsideTheSinkIsExactlyOnce() throws Exception {
        long count = 20_000;
        Path out = tmp.newFolder("json").toPath();
        StreamTableEnvironment tEnv = streaming(2, 150);
        numbers(tEnv, count, 5_000);
        tEnv.executeSql("CREATE TABLE sink_json (id BIGINT, body STRING, half DECIMAL(10, 1)) WITH ("
                + "'connector' = 'twopc', 'sink-id' = 'sql-json', 'path' = 'file://" + out + "', "
                + "'format' = 'json', 'json.encode.decimal-as-plain-number' = 'true', "
                + "'sink.commit.initial-backoff' = '10 ms', 'sink.commit.max-backoff' = '100 ms')");
        // Faults at the protocol's points, inside the sink (the core's fail points): each fails a
        // task or a commit attempt, and the job recovers.
        configureFailPoints("twopc-prepare-after=3*off->1*return;twopc-commit-before=5*off->1*return");
        runToEnd(tEnv.executeSql("INSERT INTO sink_json SELECT id, body, CAST(id AS DECIMAL(10, 1)) / 2 "
                + "FROM numbers"));

        TableEnvironment reader = batch();
        reader.executeSql("CREATE TABLE back (id BIGINT, body STRING, half DECIMAL(10, 1)) WITH ("
                + "'connector' = 'filesystem', 'path' = '" + out + "', 'format' = 'json')");
        List<Row> rows = collect(reader, "SELECT id, half FROM back");
        assertAllOnce("Flink filesystem connector (json)", rows.stream().map(r -> String.valueOf(r.getField(0)))
                .collect(Collectors.toList()), count);
        for (Row r : rows) {
            assertThat(((java.math.BigDecimal) r.getField(1)).multiply(java.math.BigDecimal.valueOf(2))
                    .longValueExact()).isEqualTo((Long) r.getField(0));
        }
        assertThat(TwopcOutput.readCommittedRecords(out).get(0)).startsWith("{\"id\":");
    }

    @Test
    public void rawFormatAndSinkParallelism() throws Exception {
        Path out = tmp.newFolder("raw").toPath();
        StreamTableEnvironment tEnv = streaming(2, 100);
        tEnv.executeSql("CREATE TABLE sink_raw (line STRING) WITH ("
                + "'connector' = 'twopc', 'sink-id' = 'sql-raw', 'path' = '" + out + "', 'format' = 'raw', "
                + "'sink.parallelism' = '1', 'sink.part-prefix' = 'lines')");
        runToEnd(tEnv.executeSql("INSERT INTO sink_raw VALUES ('one'), ('two, with a comma'), ('three')"));
        assertThat(TwopcOutput.readCommittedRecords(out, "lines"))
                .containsExactlyInAnyOrder("one", "two, with a comma", "three");
        // One subtask wrote everything.
        assertThat(TwopcOutput.committedFiles(out, "lines")).allSatisfy(
                f -> assertThat(f.getFileName().toString()).startsWith("lines-sql-raw.0."));
    }

    @Test
    public void anUpdatingQueryIsRefusedAtPlanningSayingWhatToChange() throws Exception {
        Path out = tmp.newFolder("updates").toPath();
        StreamTableEnvironment tEnv = streaming(2, 100);
        numbers(tEnv, 10, 10);
        tEnv.executeSql("CREATE TABLE counts (k BIGINT, n BIGINT) WITH ('connector' = 'twopc', "
                + "'sink-id' = 'sql-counts', 'path' = '" + out + "', 'format' = 'csv')");
        assertThatThrownBy(() -> tEnv.executeSql("INSERT INTO counts SELECT id % 3, COUNT(*) FROM numbers "
                + "GROUP BY id % 3"))
                .isInstanceOf(ValidationException.class)
                .satisfies(e -> assertThat(e.getMessage()).contains(
                        "twopc table 'default_catalog.default_database.counts'",
                        "the query produces the changes", "UPDATE_AFTER",
                        "format 'csv', which encodes inserts only", "Write an insert-only query",
                        "'sink.mode' = 'idempotent'"));
        assertThat(listNames(out)).isEmpty();
    }
}
