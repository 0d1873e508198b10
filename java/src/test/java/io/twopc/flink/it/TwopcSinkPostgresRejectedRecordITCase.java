package io.twopc.flink.it;

import io.twopc.flink.CsvRowSchema;
import io.twopc.flink.PostgresCopyFormat;
import io.twopc.flink.PostgresDestination;
import io.twopc.flink.TwopcRecordRejectedException;
import io.twopc.flink.TwopcSink;
import io.twopc.flink.testing.TestPostgres;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.runtime.execution.SuppressRestartsException;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;
import org.apache.flink.util.SerializedThrowable;

import org.junit.After;
import org.junit.AfterClass;
import org.junit.Before;
import org.junit.BeforeClass;
import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TestName;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

import static io.twopc.flink.it.TwopcItSupport.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * A record PostgreSQL can never accept stops the job once (issue 17): each kind of such record
 * goes through a real job on a MiniCluster whose restart strategy would allow several restarts;
 * the job must reach FAILED in its first attempt, with {@link TwopcRecordRejectedException} as
 * the root cause under Flink's {@link SuppressRestartsException}, and a message that names the
 * record's position in the transaction, the column, PostgreSQL's words (or the check that refused
 * it) and the record's first bytes, and never the password.
 *
 * <p>Every job writes the numbers 1..50 as rows {@code (id, body)} in one subtask, with the 7th
 * record replaced by a hostile one. The first checkpoint cannot come before the first second, so
 * all 50 records belong to the first transaction and the hostile one is at position 6. Records
 * cross in batches of 10: a record the sink checks itself is refused when its batch is written;
 * one only the server can judge when the transaction is prepared.
 */
public class TwopcSinkPostgresRejectedRecordITCase {
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();
    /** The cluster runs in this JVM, so a system property reaches the sink's subtasks. */
    private static final String PASSWORD_PROPERTY = "twopc.it.rejected.password";
    private static final long RECORDS = 50;
    private static final long HOSTILE = 7;
    private static final int RESTARTS_ALLOWED = 5;

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = cluster(METRICS, 2);

    @Rule
    public final TestName name = new TestName();

    private static TestPostgres pg;
    private String table;
    private String sinkId;
    /** The failure of the last job {@code runWith} ran. */
    private Throwable lastFailure;

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
        table = TestPostgres.uniqueName("it_rejected");
        sinkId = TestPostgres.uniqueName("rej");
        pg.execute("CREATE TABLE " + table + " (id bigint PRIMARY KEY, body text NOT NULL)");
    }

    @After
    public void dropTable() throws Exception {
        pg.rollbackAllPrepared(sinkId);
        pg.execute("DROP TABLE IF EXISTS " + table);
    }

    private String test() {
        return getClass().getSimpleName() + "." + name.getMethodName();
    }

    // ------------------------------------------------------------------ refused at write

    @Test
    public void aTextRecordWithALineBreakAndTheEndMarkerStopsTheJobAtWrite() throws Exception {
        Throwable rejected = runWith(PostgresCopyFormat.TEXT, false, "7\tx\n\\.\n8\tinjected".getBytes(UTF8));
        assertMessage(rejected, false, ", column body", "as a COPY text row, it holds a line feed",
                "7\\tx\\n\\\\.\\n8\\tinjected");
    }

    @Test
    public void aCsvRecordThatIsTheEndMarkerStopsTheJobAtWrite() throws Exception {
        Throwable rejected = runWith(PostgresCopyFormat.CSV, false, "\\.".getBytes(UTF8));
        assertMessage(rejected, false, ", column id", "PostgreSQL's end-of-data marker", "The record begins: \\\\.");
    }

    @Test
    public void aRecordWithANulByteStopsTheJobAtWrite() throws Exception {
        Throwable rejected = runWith(PostgresCopyFormat.CSV, false, "7,a\0b".getBytes(UTF8));
        assertMessage(rejected, false, ", column body", "NUL byte", "7,a\\0b");
    }

    @Test
    public void aRecordThatIsNotUtf8StopsTheJobAtWrite() throws Exception {
        byte[] latin1 = "7,caf\u00e9".getBytes(StandardCharsets.ISO_8859_1);
        Throwable rejected = runWith(PostgresCopyFormat.CSV, false, latin1);
        assertMessage(rejected, false, ", column body", "not valid UTF-8", "7,caf\\xe9");
    }

    @Test
    public void aRecordWithTheWrongNumberOfFieldsStopsTheJobAtWrite() throws Exception {
        Throwable rejected = runWith(PostgresCopyFormat.CSV, false, "7,x,\"y\"".getBytes(UTF8));
        assertMessage(rejected, false, null, "it has 3 fields but only 2 columns are configured", "7,x,\"y\"");
    }

    /**
     * The sink's own {@link CsvRowSchema} refuses a value no replay could write (here an unpaired
     * surrogate, which {@code String.getBytes} would turn into a '?'): the job stops once, naming
     * the subtask and the value's field, instead of restarting on the same record forever.
     */
    @Test
    public void aRecordTheSinksOwnSchemaRefusesStopsTheJobOnce() throws Exception {
        CsvRowSchema<Long> schema = CsvRowSchema.of((Long n) -> new Object[] {n, n == HOSTILE ? "a\uD800b" : "row " + n});
        Throwable rejected = runWith(PostgresCopyFormat.CSV, false, schema);
        assertThat(rejected.getMessage()).contains("field 1", "unpaired UTF-16 surrogate");
        List<String> messages = new ArrayList<>();
        for (Throwable t = lastFailure; t != null && !messages.contains(String.valueOf(t.getMessage())); t = t.getCause()) {
            messages.add(String.valueOf(t.getMessage()));
        }
        assertThat(messages).anySatisfy(m -> assertThat(m).contains(
                "twopc sink '" + sinkId + "' writer 0/1", "the serialization schema refused a record",
                "Filter or fix such records before the sink"));
    }

    // ------------------------------------------------------------------ refused by the server

    @Test
    public void aValueOutOfRangeStopsTheJobAtPrepareNamedByItsPosition() throws Exception {
        Throwable rejected = runWith(PostgresCopyFormat.CSV, false, "99999999999999999999,big".getBytes(UTF8));
        assertMessage(rejected, true, ", column id", "PostgreSQL: ERROR 22003",
                "value \"99999999999999999999\" is out of range for type bigint", "99999999999999999999,big");
    }

    @Test
    public void aConstraintViolationInIdempotentModeStopsTheJobNamedByItsPosition() throws Exception {
        // An unquoted empty CSV field is NULL: the upsert refuses it, and the sink finds the record.
        Throwable rejected = runWith(PostgresCopyFormat.CSV, true, "7,".getBytes(UTF8));
        assertMessage(rejected, false, ", column body", "PostgreSQL: ERROR 23502", "not-null constraint",
                "The record begins: 7,");
        assertThat(rejected.getMessage()).contains("the batches written before this one are upserted and stay");
    }

    // ------------------------------------------------------------------ the job and the checks

    private static final java.nio.charset.Charset UTF8 = StandardCharsets.UTF_8;

    /**
     * Runs the job with {@code hostile} as the 7th record and returns the {@link
     * TwopcRecordRejectedException} it failed with, after checking that it failed once, without a
     * restart, and that nothing of the refused transaction is visible.
     */
    private Throwable runWith(PostgresCopyFormat format, boolean idempotent, byte[] hostile) throws Exception {
        return runWith(format, idempotent, new Rows(format, hostile));
    }

    private Throwable runWith(PostgresCopyFormat format, boolean idempotent, SerializationSchema<Long> rows)
            throws Exception {
        StreamExecutionEnvironment env = environment(1, 2_000, RESTARTS_ALLOWED, Duration.ofMillis(100));
        // No checkpoint in the first second: all records go into the first transaction.
        env.getCheckpointConfig().setMinPauseBetweenCheckpoints(1_000);
        PostgresDestination destination = PostgresDestination.url(pg.urlWithoutPassword())
                .passwordFromSystemProperty(PASSWORD_PROPERTY)
                .table(table)
                .columns("id", "body")
                .copyFormat(format);
        if (idempotent) {
            destination = destination.idempotent("id");
        }
        env.fromSequence(1, RECORDS).uid("numbers").name("numbers")
                .map(new AttemptTracker(test())).uid("attempts").name("attempts")
                .sinkTo(TwopcSink.<Long>forPostgres(destination)
                        .setSinkId(sinkId)
                        .setSerializationSchema(rows)
                        .setBatchSize(10)
                        .build())
                .uid("twopc-sink").name("twopc-sink");

        JobID jobId = submit(CLUSTER.getClusterClient(), env, null);
        JobResult result = awaitResult(CLUSTER.getClusterClient(), jobId);

        assertThat(result.isSuccess()).as("the job succeeded").isFalse();
        Throwable failure = failureOf(result);
        lastFailure = failure;
        assertThat(findCause(failure, SuppressRestartsException.class))
                .as("SuppressRestartsException in the cause chain of %s", failure).isNotNull();
        Throwable root = rootCause(failure);
        assertThat(className(root)).as("the root cause of %s", failure)
                .isEqualTo(TwopcRecordRejectedException.class.getName());
        assertThat(sumMetric(METRICS, jobId, "numRestarts")).as("restarts (%d allowed)", RESTARTS_ALLOWED).isZero();
        assertThat(maxAttempt(test())).as("highest attempt number seen").isZero();
        if (!idempotent) {
            assertThat(pg.count(table)).as("rows of the refused transaction").isZero();
        }
        assertThat(pg.preparedTransactions(sinkId)).as("transactions left prepared").isEmpty();
        return root;
    }

    /**
     * The message names the sink, the record's position and transaction, when it was found, the
     * column (or none), the reason and the preview, says what to do, and holds no password.
     */
    private void assertMessage(Throwable rejected, boolean atPrepare, String column, String... reasonAndPreview) {
        String message = rejected.getMessage();
        assertThat(message).contains(
                "twopc sink '" + sinkId + "' subtask 0",
                "refused record #" + (HOSTILE - 1) + " of transaction " + sinkId + ".0.",
                atPrepare ? "while preparing it for checkpoint " : "while writing",
                "Filter or fix such records before the sink");
        assertThat(message).contains(reasonAndPreview);
        if (column != null) {
            assertThat(message).contains(column + ")");
        } else {
            assertThat(message).doesNotContain(", column ");
        }
        assertThat(message).as("the password").doesNotContain(pg.password);
    }

    private static Throwable rootCause(Throwable t) {
        while (t.getCause() != null && t.getCause() != t) {
            t = t.getCause();
        }
        return t;
    }

    private static String className(Throwable t) {
        return t instanceof SerializedThrowable ? ((SerializedThrowable) t).getOriginalErrorClassName()
                : t.getClass().getName();
    }

    /** Number n as the row {@code (n, 'row n')}, except the hostile record in place of number 7. */
    private static final class Rows implements SerializationSchema<Long> {
        private static final long serialVersionUID = 1L;
        private final boolean text;
        private final byte[] hostile;

        Rows(PostgresCopyFormat format, byte[] hostile) {
            this.text = format == PostgresCopyFormat.TEXT;
            this.hostile = hostile;
        }

        @Override
        public byte[] serialize(Long n) {
            if (n == HOSTILE) {
                return hostile;
            }
            return (n + (text ? "\t" : ",") + "row " + n).getBytes(StandardCharsets.UTF_8);
        }
    }
}
