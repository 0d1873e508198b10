package io.twopc.flink.internal;

import static io.twopc.flink.internal.NativeTestSupport.RUN_ID;
import static io.twopc.flink.internal.NativeTestSupport.transactionOf;
import static io.twopc.flink.internal.NativeTestSupport.write;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.assertj.core.api.Assertions.catchThrowable;

import io.twopc.flink.TwopcConfigException;
import io.twopc.flink.TwopcException;
import io.twopc.flink.TwopcLostTransactionException;
import io.twopc.flink.TwopcRecordRejectedException;
import io.twopc.flink.testing.TestPostgres;

import java.util.Arrays;

import org.apache.flink.testutils.logging.TestLoggerResource;
import org.junit.After;
import org.junit.Before;
import org.junit.Test;
import org.slf4j.event.Level;

/**
 * {@link NativeBridge#openSink} on PostgreSQL against the test server ({@code
 * TWOPC_PG_URL}): the bridge's PostgreSQL path end to end. The destination's
 * own behaviour is covered by the Rust tests of {@code twopc-pg}; these check
 * that the settings cross JNI intact and that its outcomes come back as the
 * right Java values and exceptions.
 */
public class NativeBridgePostgresTest {
    private TestPostgres pg;
    private String table;
    private String sinkId;

    @Before
    public void createTable() throws Exception {
        pg = TestPostgres.fromEnvironment();
        table = TestPostgres.uniqueName("jni_orders");
        sinkId = TestPostgres.uniqueName("jni");
        pg.execute("CREATE TABLE " + table + " (id bigint PRIMARY KEY, body text)");
    }

    @After
    public void dropTable() throws Exception {
        if (pg != null) {
            pg.rollbackAllPrepared(sinkId);
            pg.execute("DROP TABLE IF EXISTS " + table);
        }
    }

    /**
     * A PostgreSQL sink's configuration with workable defaults (transactional, COPY text, the URL
     * without its password and the password passed on its own, as a task manager reads it); each
     * test changes what it is about.
     */
    private final class PgOpen {
        String url = pg.urlWithoutPassword();
        String host;
        int port;
        String database;
        String user;
        String password = pg.password;
        String[] columns = {"id", "body"};
        String mode = "TRANSACTIONAL";
        String[] keyColumns = {};
        String copyFormat = "TEXT";
        long restoredCheckpointId = -1;
        byte[][] knownHandles = {};

        PgOpen byHostAndPort() {
            url = null;
            host = pg.host;
            port = pg.port;
            database = pg.database;
            user = pg.user;
            return this;
        }

        String config() {
            Json destination = Json.object().put("type", "postgres");
            if (url != null) {
                destination.put("url", url);
            }
            if (host != null) {
                destination.put("host", host).put("port", port).put("database", database).put("user", user);
            }
            destination.put("passwordSource", "env:TWOPC_TEST_UNUSED")
                    .put("table", table)
                    .put("columns", Arrays.asList(columns))
                    .put("mode", mode)
                    .put("keyColumns", Arrays.asList(keyColumns))
                    .put("copyFormat", copyFormat)
                    .put("controlSchema", "public")
                    .put("connectTimeoutMs", 5_000L);
            return Json.object()
                    .put("version", 1)
                    .put("sink", Json.object()
                            .put("sinkId", sinkId)
                            .put("instance", "00000000000000bb")
                            .put("retentionMs", 3_600_000L)
                            .put("restartAllowanceMs", 60_000L)
                            .put("rewindPolicy", "FAIL")
                            .put("freshStartPolicy", "FAIL")
                            .put("commitMaxAttempts", 3)
                            .put("commitInitialBackoffMs", 10L)
                            .put("commitMaxBackoffMs", 100L)
                            .put("ownerWaitMs", 0L))
                    .put("destination", destination)
                    .end();
        }

        long open() {
            return NativeBridge.openSink(config(), RUN_ID, 0, 1, 0, 10_000L, password, restoredCheckpointId,
                    new byte[0][], knownHandles);
        }
    }

    @Test
    public void preparedRowsAreInvisibleUntilCommitAndARepeatedCommitIsSuccess() throws Exception {
        long sink = new PgOpen().open();
        try {
            byte[] open = NativeBridge.begin(sink);
            assertThat(write(sink, open, "1\talpha", "2\tbeta \u00e9")).isEqualTo(2);
            assertThat(write(sink, open, "3\t\\N")).isEqualTo(3);
            assertThat(pg.count(table)).as("open rows are invisible").isZero();

            byte[] prepared = NativeBridge.prepare(sink, open, 7);
            assertThat(pg.preparedTransactions(sinkId)).containsExactly(transactionOf(open));
            assertThat(pg.count(table)).as("prepared rows are invisible").isZero();

            assertThat(NativeBridge.commit(sink, prepared)).isEqualTo(NativeBridge.COMMITTED);
            assertThat(pg.queryStrings("SELECT id || '=' || coalesce(body, 'NULL') FROM " + table + " ORDER BY id"))
                    .containsExactly("1=alpha", "2=beta \u00e9", "3=NULL");
            assertThat(pg.preparedTransactions(sinkId)).isEmpty();

            // Recovery after a lost notification commits again: success, no change.
            assertThat(NativeBridge.commit(sink, prepared)).isEqualTo(NativeBridge.ALREADY_COMMITTED);
            assertThat(pg.count(table)).isEqualTo(3);
            assertThat(NativeBridge.stats(sink)[4]).as("last committed checkpoint").isEqualTo(7);
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void aRestoreCommitsThePreparedTransactionOfItsCheckpoint() throws Exception {
        long sink = new PgOpen().open();
        byte[] prepared;
        try {
            byte[] open = NativeBridge.begin(sink);
            write(sink, open, "1\ta", "2\tb");
            prepared = NativeBridge.prepare(sink, open, 4);
        } finally {
            // The process dies after the checkpoint, before the commit.
            NativeBridge.close(sink);
        }
        assertThat(pg.count(table)).isZero();

        PgOpen restore = new PgOpen();
        restore.restoredCheckpointId = 4;
        restore.knownHandles = new byte[][] {prepared};
        long restored = restore.open();
        try {
            // Open left the checkpoint's transaction prepared (it is known,
            // not lingering); the sink's recoverAndCommit commits it.
            assertThat(pg.preparedTransactions(sinkId)).containsExactly(transactionOf(prepared));
            assertThat(NativeBridge.commit(restored, prepared)).isEqualTo(NativeBridge.COMMITTED);
            assertThat(pg.count(table)).isEqualTo(2);
            assertThat(NativeBridge.commit(restored, prepared)).isEqualTo(NativeBridge.ALREADY_COMMITTED);
        } finally {
            NativeBridge.close(restored);
        }
    }

    @Test
    public void aPreparedTransactionRolledBackByAnAdministratorIsLost() throws Exception {
        long sink = new PgOpen().open();
        byte[] prepared;
        String txn;
        try {
            byte[] open = NativeBridge.begin(sink);
            write(sink, open, "1\ta", "2\tb");
            prepared = NativeBridge.prepare(sink, open, 9);
            txn = transactionOf(prepared);
            pg.rollbackPrepared(txn);

            Throwable lost = catchThrowable(() -> NativeBridge.commit(sink, prepared));
            assertThat(lost)
                    .isExactlyInstanceOf(TwopcLostTransactionException.class)
                    .hasMessageContaining(txn)
                    .hasMessageContaining("checkpoint 9")
                    .hasMessageContaining("Recovery plan");
            assertThat(((TwopcException) lost).isFatal()).isTrue();
        } finally {
            NativeBridge.close(sink);
        }

        // A restart from that checkpoint must not carry on either: its
        // recoverAndCommit re-commits the checkpoint's transaction and finds
        // it lost.
        PgOpen restore = new PgOpen();
        restore.restoredCheckpointId = 9;
        restore.knownHandles = new byte[][] {prepared};
        long restored = restore.open();
        try {
            assertThatThrownBy(() -> NativeBridge.commit(restored, prepared))
                    .isExactlyInstanceOf(TwopcLostTransactionException.class)
                    .hasMessageContaining(txn);
        } finally {
            NativeBridge.close(restored);
        }
        assertThat(pg.count(table)).isZero();
    }

    @Test
    public void hostPortSettingsCsvRowsAndIdempotentUpserts() throws Exception {
        PgOpen settings = new PgOpen().byHostAndPort();
        settings.mode = "IDEMPOTENT";
        settings.keyColumns = new String[] {"id"};
        settings.copyFormat = "CSV";
        long sink = settings.open();
        try {
            byte[] open = NativeBridge.begin(sink);
            write(sink, open, "1,first", "2,\"with, comma\"", "1,\"last \"\"quoted\"\"\"");
            // Idempotent mode: visible batch by batch, the last value of each key.
            assertThat(pg.queryStrings("SELECT id || '=' || body FROM " + table + " ORDER BY id"))
                    .containsExactly("1=last \"quoted\"", "2=with, comma");
            byte[] prepared = NativeBridge.prepare(sink, open, 1);
            assertThat(NativeBridge.commit(sink, prepared)).isEqualTo(NativeBridge.COMMITTED);

            // A replay rewrites the same keys: nothing is added.
            byte[] replay = NativeBridge.begin(sink);
            write(sink, replay, "1,first", "2,\"with, comma\"", "1,\"last \"\"quoted\"\"\"");
            assertThat(pg.count(table)).isEqualTo(2);
            NativeBridge.commit(sink, NativeBridge.prepare(sink, replay, 2));
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void aWrongPasswordIsAConfigErrorThatNeverShowsThePassword() throws Throwable {
        String wrong = "not-the-password-7f3a";
        String wrongInUrl = "wrong-in-url-5c1d";
        NativeBridge.ensureLoaded();
        // Everything the native side logs meanwhile is captured too: the
        // password must not reach the TaskManager log either.
        try (TestLoggerResource.SingleTestResource log =
                TestLoggerResource.asSingleTestResource("twopc", Level.INFO)) {
            PgOpen separate = new PgOpen();
            separate.password = wrong;
            Throwable refused = catchThrowable(separate::open);
            assertThat(refused)
                    .isExactlyInstanceOf(TwopcConfigException.class)
                    .hasMessageContaining("password authentication failed")
                    .hasMessageContaining("fix the connection settings");
            assertThat(refused.getMessage()).doesNotContain(wrong).doesNotContain(pg.password);

            // A password inside the URL is refused before connecting (the Java builder refuses
            // it first; this is the native side's own check), and kept out of the message.
            PgOpen inUrl = new PgOpen();
            inUrl.url = "postgres://" + pg.user + ":" + wrongInUrl + "@" + pg.host + ":" + pg.port + "/" + pg.database;
            inUrl.password = null;
            Throwable refusedUrl = catchThrowable(inUrl::open);
            assertThat(refusedUrl).isExactlyInstanceOf(TwopcConfigException.class)
                    .hasMessageContaining("carries a password")
                    .hasMessageContaining("passwordFromEnvironment");
            assertThat(refusedUrl.getMessage()).doesNotContain(wrongInUrl);

            // And so is the right one, on a sink that works.
            NativeBridge.close(new PgOpen().open());
            assertThat(log.getMessages())
                    .allSatisfy(m -> assertThat(m).doesNotContain(wrong).doesNotContain(wrongInUrl)
                            .doesNotContain(pg.password));
        }
    }

    @Test
    public void aRecordPostgresCanNeverTakeIsAFatalRecordRejectedException() throws Exception {
        long sink = new PgOpen().open();
        try {
            // Found by the sink's own check, at write: nothing of the batch is sent.
            byte[] open = NativeBridge.begin(sink);
            Throwable atWrite = catchThrowable(() -> write(sink, open, "1\ta", "2\tb\n\\.\n3\tinjected"));
            assertThat(atWrite)
                    .isExactlyInstanceOf(TwopcRecordRejectedException.class)
                    .hasMessageContaining("refused record #1 of transaction " + transactionOf(open))
                    .hasMessageContaining("while writing, column body")
                    .hasMessageContaining("line feed")
                    .hasMessageContaining("Filter or fix such records before the sink");
            assertThat(((TwopcException) atWrite).isFatal()).isTrue();
            NativeBridge.abort(sink, open);

            // Found by the server when the COPY ends, at prepare, and mapped back to the record.
            byte[] next = NativeBridge.begin(sink);
            write(sink, next, "1\ta", "2\tb", "x3\tc");
            Throwable atPrepare = catchThrowable(() -> NativeBridge.prepare(sink, next, 3));
            assertThat(atPrepare)
                    .isExactlyInstanceOf(TwopcRecordRejectedException.class)
                    .hasMessageContaining("refused record #2 of transaction " + transactionOf(next))
                    .hasMessageContaining("while preparing it for checkpoint 3, column id")
                    .hasMessageContaining("22P02")
                    .hasMessageContaining("The record begins: x3\\tc");
            assertThat(atPrepare.getMessage()).doesNotContain(pg.password);
            NativeBridge.abort(sink, next);
        } finally {
            NativeBridge.close(sink);
        }
        assertThat(pg.count(table)).isZero();
        assertThat(pg.preparedTransactions(sinkId)).isEmpty();
    }

    @Test
    public void settingsThatCannotWorkNameWhatToChange() throws Exception {
        PgOpen missingColumn = new PgOpen();
        missingColumn.columns = new String[] {"id", "no_such_column"};
        assertThatThrownBy(missingColumn::open)
                .isExactlyInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("no_such_column");

        PgOpen keysInTransactional = new PgOpen();
        keysInTransactional.keyColumns = new String[] {"id"};
        assertThatThrownBy(keysInTransactional::open)
                .isExactlyInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("choose idempotent mode");

        PgOpen bothEndpoints = new PgOpen();
        bothEndpoints.host = pg.host;
        assertThatThrownBy(bothEndpoints::open)
                .isExactlyInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("both as a URL and as a host");

        PgOpen unknownMode = new PgOpen();
        unknownMode.mode = "eventual";
        assertThatThrownBy(unknownMode::open)
                .isExactlyInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("choose TRANSACTIONAL or IDEMPOTENT");
        assertThat(pg.preparedTransactions(sinkId)).as("nothing was started").isEmpty();
    }
}
