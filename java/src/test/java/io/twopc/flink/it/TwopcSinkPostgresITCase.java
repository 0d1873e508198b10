package io.twopc.flink.it;

import io.twopc.flink.CsvRowSchema;
import io.twopc.flink.PostgresDestination;
import io.twopc.flink.RewindPolicy;
import io.twopc.flink.TwopcLostTransactionException;
import io.twopc.flink.TwopcRewindException;
import io.twopc.flink.TwopcSink;
import io.twopc.flink.testing.TestPostgres;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.client.program.ClusterClient;
import org.apache.flink.core.execution.SavepointFormatType;
import org.apache.flink.runtime.execution.SuppressRestartsException;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;

import org.junit.After;
import org.junit.AfterClass;
import org.junit.Before;
import org.junit.BeforeClass;
import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;
import org.junit.rules.TestName;

import java.nio.file.Path;
import java.sql.SQLException;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static io.twopc.flink.it.TwopcItSupport.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * The failure scenarios of {@link TwopcSinkExactlyOnceITCase} and {@link TwopcSinkSavepointITCase},
 * against a PostgreSQL table ({@code TWOPC_PG_URL}, see {@code scripts/postgres.sh}). Every job
 * writes the numbers {@code 1..N} as rows {@code (id, body)} of a table without any key, so a
 * duplicate would show as a second row; afterwards the table must hold every number exactly once
 * and the server no prepared transaction of the sink.
 *
 * <p>Plus what only PostgreSQL has: idempotent mode (upserts; every key ends with its last
 * value), an administrator's {@code ROLLBACK PREPARED} of a transaction the job still needs, which
 * must stop the job with the LOST error instead of restarting forever, and a rewind repaired by
 * deleting rows through their transaction-id column.
 *
 * <p>The job shape, fault injection and checks are {@link TwopcItSupport}'s, shared with the
 * filesystem ITs.
 */
public class TwopcSinkPostgresITCase {
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();
    /** The tests run the cluster in this JVM, so a system property reaches the sink's subtasks. */
    private static final String PASSWORD_PROPERTY = "twopc.it.postgres.password";

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = cluster(METRICS, 4);

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    @Rule
    public final TestName name = new TestName();

    private static TestPostgres pg;
    private String table;
    private String sinkId;

    @BeforeClass
    public static void server() {
        pg = TestPostgres.fromEnvironment();
        System.setProperty(PASSWORD_PROPERTY, pg.password);
    }

    @AfterClass
    public static void forgetPassword() {
        System.clearProperty(PASSWORD_PROPERTY);
    }

    @Before
    public void createTable() throws Exception {
        clearFailPoints();
        // Tests share one server: their own table and sink id (and so transaction ids).
        table = TestPostgres.uniqueName("it_numbers");
        sinkId = TestPostgres.uniqueName("pg");
        pg.execute("CREATE TABLE " + table + " (id bigint NOT NULL, body text NOT NULL)");
    }

    @After
    public void dropTable() throws Exception {
        clearFailPoints();
        pg.rollbackAllPrepared(sinkId);
        pg.execute("DROP TABLE IF EXISTS " + table);
    }

    private String test() {
        return getClass().getSimpleName() + "." + name.getMethodName();
    }

    private static ClusterClient<?> client() {
        return CLUSTER.getClusterClient();
    }

    /** The test server without the password in the URL: it comes from a system property. */
    private PostgresDestination destination() {
        return PostgresDestination.url(pg.urlWithoutPassword())
                .passwordFromSystemProperty(PASSWORD_PROPERTY)
                .table(table)
                .columns("id", "body");
    }

    private TwopcSink<Long> transactionalSink() {
        return transactionalSink(destination(), RewindPolicy.FAIL);
    }

    private TwopcSink<Long> transactionalSink(PostgresDestination destination, RewindPolicy rewind) {
        return TwopcSink.<Long>forPostgres(destination)
                .setSinkId(sinkId)
                .setSerializationSchema(CsvRowSchema.of(TwopcSinkPostgresITCase::numberRow))
                .setRewindPolicy(rewind)
                // Small batches: several COPYs per transaction.
                .setBatchSize(500)
                .setCommitRetryBackoff(Duration.ofMillis(10), Duration.ofMillis(100))
                .build();
    }

    private static Object[] numberRow(Long n) {
        return new Object[] {n, "row " + n};
    }

    /** numbers -> throttle -> attempt tracker -> [failure injector] -> PostgreSQL. */
    private StreamExecutionEnvironment numbersJob(int parallelism, long count, int recordsPerMs,
            MapFunction<Long, Long> injector, int restartAttempts) {
        StreamExecutionEnvironment env = environment(parallelism, 100, restartAttempts, Duration.ofMillis(100));
        numberedStream(env, count, recordsPerMs, test(), injector)
                .sinkTo(transactionalSink()).uid("twopc-sink").name("twopc-sink");
        return env;
    }

    private JobID run(StreamExecutionEnvironment env) throws Exception {
        JobID jobId = submit(client(), env, null);
        awaitSuccess(client(), jobId);
        return jobId;
    }

    /** Rows in the table (committed output), or -1 when the query failed (polled again). */
    private long rowCount() {
        try {
            return pg.count(table);
        } catch (SQLException e) {
            return -1;
        }
    }

    /** The table holds each of {@code 1..count} exactly once, with its body, and nothing is left prepared. */
    private void assertTableExactlyOnce(long count) throws Exception {
        assertAllOnce("table " + table, pg.queryStrings("SELECT id FROM " + table), count);
        assertThat(pg.queryLongs("SELECT count(*) FROM " + table + " WHERE body <> 'row ' || id"))
                .as("rows whose body does not match their id").containsExactly(0L);
        assertThat(pg.preparedTransactions(sinkId)).as("transactions left prepared").isEmpty();
    }

    // ------------------------------------------------------------------ transactional mode

    @Test
    public void everyRowIsCommittedOnceWithoutFailures() throws Exception {
        long count = 30_000;
        JobID jobId = run(numbersJob(2, count, 20, null, 0));

        assertTableExactlyOnce(count);
        assertThat(maxAttempt(test())).as("restarts").isZero();
        assertThat(sumMetric(METRICS, jobId, "twopc.recordsWritten")).isEqualTo(count);
        assertThat(sumMetric(METRICS, jobId, "twopc.transactionsCommitted")).isGreaterThanOrEqualTo(4);
    }

    @Test
    public void rowsOfAnAttemptThatFailedBeforeAnyCheckpointCompletedNeverBecomeVisible() throws Exception {
        long count = 20_000;
        StreamExecutionEnvironment env = numbersJob(2, count, 10, new FailOnce(test(), 200, false, 1), 3);
        // No checkpoint can complete before the failure (see the filesystem IT; at the latest it
        // comes at the first barrier): the restart has no state, and the fresh start must roll
        // back what attempt 0 wrote, prepared or not.
        env.getCheckpointConfig().setMinPauseBetweenCheckpoints(300);

        run(env);

        assertThat(injected(test())).hasSize(1).allMatch(s -> s.contains("before any checkpoint completed"));
        assertTableExactlyOnce(count);
    }

    @Test
    public void aFailureAfterACompletedCheckpointReplaysOnlyWhatItDidNotCover() throws Exception {
        long count = 30_000;
        run(numbersJob(2, count, 10, new FailOnce(test(), 5_000, true, 1), 3));

        assertThat(injected(test())).hasSize(1).allMatch(s -> s.contains("after a completed checkpoint"));
        assertTableExactlyOnce(count);
    }

    @Test
    public void transactionPreparedForACheckpointThatNeverCompletesIsRolledBack() throws Exception {
        long count = 30_000;
        StreamExecutionEnvironment env = numbersJob(2, count, 20, null, 3);
        // The fifth PREPARE TRANSACTION lands but reports failure: its checkpoint fails and the
        // prepared transaction must be rolled back on restart, never committed.
        configureFailPoints("twopc-prepare-after=4*off->1*return");

        run(env);

        assertThat(maxAttempt(test())).as("restarts").isGreaterThanOrEqualTo(1);
        assertTableExactlyOnce(count);
    }

    @Test
    public void completedCheckpointWhoseCommitFailedIsCommittedByRecovery() throws Exception {
        long count = 30_000;
        StreamExecutionEnvironment env = numbersJob(2, count, 20, null, 3);
        // The third COMMIT PREPARED fails before it is sent: the restart from that completed
        // checkpoint must commit the still prepared transaction.
        configureFailPoints("twopc-commit-before=2*off->1*return");

        JobID jobId = run(env);

        assertThat(sumMetric(METRICS, jobId, "twopc.recoveredCommits"))
                .as("transactions committed by recovery").isGreaterThanOrEqualTo(1);
        assertTableExactlyOnce(count);
    }

    @Test
    public void commitWhoseResponseWasLostIsRecognisedAsAlreadyCommitted() throws Exception {
        long count = 30_000;
        StreamExecutionEnvironment env = numbersJob(2, count, 20, null, 3);
        // The third COMMIT PREPARED succeeds but reports failure: the re-commit by id finds no
        // prepared transaction (42704) and the commit record, so it is ALREADY_COMMITTED.
        configureFailPoints("twopc-commit-after=2*off->1*return");

        JobID jobId = run(env);

        assertThat(sumMetric(METRICS, jobId, "twopc.commitsFoundAlreadyCommitted"))
                .as("re-commits answered ALREADY_COMMITTED").isGreaterThanOrEqualTo(1);
        assertTableExactlyOnce(count);
    }

    @Test
    public void stopWithSavepointThenRestoreAtLowerAndHigherParallelism() throws Exception {
        Path savepoints = tmp.newFolder("savepoints").toPath();
        long count = 80_000;

        JobID first = submit(client(), numbersJob(4, count, 5, null, 100), null);
        waitUntil("10000 rows are committed", Duration.ofMinutes(1), () -> rowCount() >= 10_000);
        String savepoint1 = stopWithSavepoint(first, savepoints);
        long afterFirst = assertConsistentPrefix();
        assertThat(afterFirst).as("the first run stopped before the end").isLessThan(count);

        JobID second = submit(client(), numbersJob(2, count, 5, null, 100), savepoint1);
        waitUntil("10000 more rows are committed", Duration.ofMinutes(1), () -> rowCount() >= afterFirst + 10_000);
        String savepoint2 = stopWithSavepoint(second, savepoints);
        long afterSecond = assertConsistentPrefix();
        assertThat(afterSecond).as("the second run stopped before the end").isLessThan(count);

        awaitSuccess(client(), submit(client(), numbersJob(3, count, 5, null, 100), savepoint2));

        assertTableExactlyOnce(count);
    }

    private String stopWithSavepoint(JobID jobId, Path savepoints) throws Exception {
        String savepoint = client()
                .stopWithSavepoint(jobId, false, savepoints.toUri().toString(), SavepointFormatType.CANONICAL)
                .get(2, TimeUnit.MINUTES);
        awaitSuccess(client(), jobId);
        return savepoint;
    }

    /** The rows so far: none twice, and nothing left prepared by the stopped job. */
    private long assertConsistentPrefix() throws Exception {
        List<String> ids = pg.queryStrings("SELECT id FROM " + table);
        assertThat(ids).as("rows committed so far").doesNotHaveDuplicates();
        assertThat(pg.preparedTransactions(sinkId)).as("prepared transactions of a stopped job").isEmpty();
        return ids.size();
    }

    @Test
    public void restoreFromASavepointOlderThanCommittedRowsStopsAndReplaceRangeRepairsIt() throws Exception {
        Path savepoints = tmp.newFolder("savepoints").toPath();
        long count = 40_000;
        // REPLACE_RANGE finds a transaction's rows by the transaction id the sink writes with them.
        pg.execute("ALTER TABLE " + table + " ADD COLUMN txn text");
        PostgresDestination withTransactionIds = destination().transactionIdColumn("txn");

        // Run to the end, with a savepoint taken early on: every row committed after it is one a
        // restore from it would write again.
        // Slow enough (about 10 s of input) that the savepoint is taken while the job still runs.
        JobID original = submit(client(), rewindableJob(count, 2, withTransactionIds, RewindPolicy.FAIL), null);
        waitUntil("5000 rows are committed", Duration.ofMinutes(1), () -> rowCount() >= 5_000);
        String oldSavepoint = client()
                .triggerSavepoint(original, savepoints.toUri().toString(), SavepointFormatType.CANONICAL)
                .get(2, TimeUnit.MINUTES);
        awaitSuccess(client(), original);
        assertTableExactlyOnce(count);

        // Default policy: the rewind is detected at start-up and the job stops for good, with the
        // table untouched.
        JobID rewound = submit(client(), rewindableJob(count, 10, withTransactionIds, RewindPolicy.FAIL), oldSavepoint);
        Throwable failure = failureOf(awaitResult(client(), rewound));
        Throwable rewind = findCause(failure, TwopcRewindException.class);
        assertThat(rewind).as("TwopcRewindException in the cause chain of %s", failure).isNotNull();
        assertThat(rewind.getMessage()).contains("REPLACE_RANGE");
        assertThat(sumMetric(METRICS, rewound, "numRestarts")).as("restarts of the rewound job").isZero();
        assertTableExactlyOnce(count);

        // REPLACE_RANGE: the rows committed after the savepoint are deleted and written again.
        JobID replaced = submit(client(),
                rewindableJob(count, 10, withTransactionIds, RewindPolicy.REPLACE_RANGE), oldSavepoint);
        awaitSuccess(client(), replaced);
        assertTableExactlyOnce(count);
        assertThat(pg.queryLongs("SELECT count(*) FROM " + table + " WHERE txn IS NULL"))
                .as("rows without their transaction id").containsExactly(0L);
    }

    /** The numbered job without fault injection, writing transaction ids, with a rewind policy. */
    private StreamExecutionEnvironment rewindableJob(long count, int recordsPerMs, PostgresDestination destination,
            RewindPolicy rewind) {
        StreamExecutionEnvironment env = environment(2, 100, 100, Duration.ofMillis(100));
        numberedStream(env, count, recordsPerMs, test(), null)
                .sinkTo(transactionalSink(destination, rewind)).uid("twopc-sink").name("twopc-sink");
        return env;
    }

    @Test
    public void randomFaultsAtEveryProtocolPointAcrossManyRestarts() throws Exception {
        long count = 60_000;
        StreamExecutionEnvironment env = environment(2, 50, 100, Duration.ofMillis(50));
        numberedStream(env, count, 10, test(), null)
                .sinkTo(transactionalSink()).uid("twopc-sink").name("twopc-sink");
        configureFailPoints(RANDOM_FAULTS);

        JobID jobId = submit(client(), env, null);
        try {
            awaitSuccess(client(), jobId);
        } finally {
            clearFailPoints();
        }

        assertThat(maxAttempt(test())).as("restarts caused by injected faults").isGreaterThanOrEqualTo(3);
        assertTableExactlyOnce(count);
    }

    // ------------------------------------------------------------------ lost transaction

    @Test
    public void aPreparedTransactionRolledBackByAnAdministratorStopsTheJobWithLost() throws Exception {
        long count = 20_000;
        // Plenty of restarts allowed: the job must stop because the error suppresses restarts,
        // not because the restart strategy ran out.
        int restartAttempts = 1000;
        StreamExecutionEnvironment env = numbersJob(2, count, 10, null, restartAttempts);
        // Every COMMIT PREPARED fails: the first completed checkpoint's transactions stay
        // prepared while the job restarts from that checkpoint again and again.
        configureFailPoints("twopc-commit-before=return");

        JobID jobId = submit(client(), env, null);
        waitUntil("a completed checkpoint's commit failed and recovery is retrying it", Duration.ofMinutes(1),
                () -> sumMetric(METRICS, jobId, "numRestarts") >= 2 && !preparedTransactions().isEmpty());

        // The administrator rolls them back (say, to release their locks).
        List<String> rolledBack = preparedTransactions();
        for (String gid : rolledBack) {
            pg.rollbackPrepared(gid);
        }
        long restartsAtRollback = sumMetric(METRICS, jobId, "numRestarts");
        clearFailPoints();

        JobResult result = awaitResult(client(), jobId);
        Throwable failure = failureOf(result);
        assertThat(findCause(failure, SuppressRestartsException.class))
                .as("SuppressRestartsException in the cause chain of %s", failure).isNotNull();
        Throwable lost = findCause(failure, TwopcLostTransactionException.class);
        assertThat(lost).as("TwopcLostTransactionException in the cause chain of %s", failure).isNotNull();
        assertThat(lost.getMessage()).contains("LOST", "twopc sink '" + sinkId + "'", "Recovery plan");
        assertThat(rolledBack).anySatisfy(gid -> assertThat(lost.getMessage()).contains(gid));
        // One restart may have been under way when the transactions were rolled back; after
        // that, the first recovery that meets the loss stops the job.
        assertThat(sumMetric(METRICS, jobId, "numRestarts"))
                .as("restarts after the rollback: the job stopped at the loss, no restart loop")
                .isLessThanOrEqualTo(restartsAtRollback + 2);
        assertThat(rowCount()).as("rows: the lost output was not papered over").isLessThan(count);
    }

    private List<String> preparedTransactions() {
        try {
            return pg.preparedTransactions(sinkId);
        } catch (SQLException e) {
            return java.util.Collections.emptyList();
        }
    }

    // ------------------------------------------------------------------ idempotent mode

    @Test
    public void idempotentModeLeavesEveryKeyWithItsLastValueAcrossFailures() throws Exception {
        String keyed = TestPostgres.uniqueName("it_latest");
        long count = 40_000;
        int keys = 1_000;
        pg.execute("CREATE TABLE " + keyed + " (key bigint PRIMARY KEY, value bigint NOT NULL)");
        try {
            StreamExecutionEnvironment env = environment(2, 100, 100, Duration.ofMillis(100));
            // One source subtask and keyBy: each key's values reach its sink subtask in input
            // order, so "last value" is well defined (n for the largest n of that key).
            env.fromSequence(1, count).setParallelism(1).uid("numbers").name("numbers")
                    .map(new Throttle(10)).setParallelism(1).uid("throttle").name("throttle")
                    .map(new AttemptTracker(test())).setParallelism(1).uid("attempts").name("attempts")
                    .map(new FailOnce(test(), 10_000, true, 2)).setParallelism(1).uid("injector").name("injector")
                    .keyBy(new KeyOf(keys))
                    .sinkTo(TwopcSink.<Long>forPostgres(PostgresDestination.url(pg.urlWithoutPassword())
                                    .passwordFromSystemProperty(PASSWORD_PROPERTY)
                                    .table(keyed)
                                    .columns("key", "value")
                                    .idempotent("key"))
                            .setSinkId(sinkId)
                            .setSerializationSchema(CsvRowSchema.of((Long n) -> new Object[] {n % keys, n}))
                            .setBatchSize(300)
                            .build())
                    .uid("twopc-sink").name("twopc-sink");
            // A fault inside the protocol as well: the fourth commit reports failure after it
            // happened. Either way the job restarts and replays; a replay only rewrites keys.
            configureFailPoints("twopc-commit-after=3*off->1*return");

            JobID jobId = submit(client(), env, null);
            try {
                awaitSuccess(client(), jobId);
            } finally {
                clearFailPoints();
            }

            assertThat(injected(test())).as("injected failures after a completed checkpoint").isNotEmpty();
            assertThat(maxAttempt(test())).as("restarts").isGreaterThanOrEqualTo(2);
            assertThat(pg.count(keyed)).as("one row per key").isEqualTo(keys);
            // The last value of key k is the largest n <= count with n % keys == k.
            assertThat(pg.queryLongs("SELECT count(*) FROM " + keyed + " WHERE value <> "
                            + "(" + count + " - ((" + count + " - key) % " + keys + "))"))
                    .as("keys whose value is not their last one").containsExactly(0L);
            assertThat(pg.preparedTransactions(sinkId)).as("idempotent mode prepares nothing").isEmpty();
        } finally {
            pg.execute("DROP TABLE IF EXISTS " + keyed);
        }
    }

    /** Records to keys {@code n % keys}. */
    private static final class KeyOf implements KeySelector<Long, Long> {
        private static final long serialVersionUID = 1L;
        private final int keys;

        KeyOf(int keys) {
            this.keys = keys;
        }

        @Override
        public Long getKey(Long n) {
            return n % keys;
        }
    }
}
