package io.twopc.flink.internal;

import static io.twopc.flink.internal.NativeTestSupport.batch;
import static io.twopc.flink.internal.NativeTestSupport.describe;
import static io.twopc.flink.internal.NativeTestSupport.open;
import static io.twopc.flink.internal.NativeTestSupport.read;
import static io.twopc.flink.internal.NativeTestSupport.transactionOf;
import static io.twopc.flink.internal.NativeTestSupport.visibleFiles;
import static io.twopc.flink.internal.NativeTestSupport.write;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.assertj.core.api.Assertions.catchThrowable;

import io.twopc.flink.ObjectStoreDestination;
import io.twopc.flink.TwopcConfigException;
import io.twopc.flink.TwopcException;
import io.twopc.flink.TwopcLostTransactionException;
import io.twopc.flink.TwopcSink;
import io.twopc.flink.TwopcStateException;

import java.io.File;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;

import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/** The JNI surface against the real library, on the filesystem destination. */
public class NativeBridgeTest {
    @Rule
    public TemporaryFolder tmp = new TemporaryFolder();

    @Test
    public void beginWritePrepareCommitPublishesTheRecords() throws Exception {
        File out = tmp.newFolder("out");
        long sink = open(out, "orders");
        try {
            byte[] open = NativeBridge.begin(sink);
            assertThat(describe(open).get("state").asText()).isEqualTo("open");
            assertThat(write(sink, open, "alpha", "beta", "")).isEqualTo(3);
            assertThat(write(sink, open, "gamma \u00e9")).isEqualTo(4);
            assertThat(NativeBridge.stats(sink)[5]).isEqualTo(4);
            assertThat(visibleFiles(out)).as("nothing visible before commit").isEmpty();

            byte[] prepared = NativeBridge.prepare(sink, open, 7);
            JsonNode p = describe(prepared);
            assertThat(p.get("state").asText()).isEqualTo("prepared");
            assertThat(p.get("checkpoint").asLong()).isEqualTo(7);
            assertThat(p.get("records").asLong()).isEqualTo(4);
            assertThat(p.get("transaction").asText()).isEqualTo(transactionOf(open));
            assertThat(visibleFiles(out)).as("nothing visible before commit").isEmpty();
            assertThat(NativeBridge.preparedAgeMs(prepared, System.currentTimeMillis() + 1_000))
                    .isGreaterThanOrEqualTo(1_000);
            assertThat(NativeBridge.preparedAgeMs(open, System.currentTimeMillis())).isEqualTo(-1);
            assertThat(NativeBridge.handleCheckpoint(prepared)).isEqualTo(7);
            assertThat(NativeBridge.handleCheckpoint(open)).isEqualTo(-1);
            assertThat(NativeBridge.handleTransaction(prepared)).isEqualTo(p.get("transaction").asText());
            assertThat(NativeBridge.handleTransaction(open)).isEqualTo(transactionOf(open));

            assertThat(NativeBridge.commit(sink, prepared)).isEqualTo(NativeBridge.COMMITTED);
            List<Path> files = visibleFiles(out);
            assertThat(files).hasSize(1);
            assertThat(files.get(0).getFileName().toString())
                    .isEqualTo("part-" + transactionOf(open) + ".txt");
            assertThat(read(files.get(0))).isEqualTo("alpha\nbeta\n\ngamma \u00e9\n");

            // A repeated commit (recovery after a lost notification) is success.
            assertThat(NativeBridge.commit(sink, prepared)).isEqualTo(NativeBridge.ALREADY_COMMITTED);
            assertThat(read(visibleFiles(out).get(0))).isEqualTo("alpha\nbeta\n\ngamma \u00e9\n");

            long[] stats = NativeBridge.stats(sink);
            assertThat(stats).hasSize(10);
            assertThat(stats[0]).as("records written").isEqualTo(4);
            assertThat(stats[NativeBridge.STAT_COMMITTED]).as("committed").isEqualTo(1);
            assertThat(stats[NativeBridge.STAT_ALREADY_COMMITTED]).as("already committed").isEqualTo(1);
            assertThat(stats[4]).as("last committed checkpoint").isEqualTo(7);
            assertThat(stats[5]).as("open records").isEqualTo(0);
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void emptyTransactionsAndAborts() throws Exception {
        File out = tmp.newFolder("out");
        long sink = open(out, "orders");
        try {
            byte[] empty = NativeBridge.prepare(sink, NativeBridge.begin(sink), 1);
            assertThat(NativeBridge.commit(sink, empty)).isEqualTo(NativeBridge.EMPTY);
            assertThat(NativeBridge.stats(sink)[4]).isEqualTo(1);

            byte[] open = NativeBridge.begin(sink);
            write(sink, open, "dropped");
            assertThat(NativeBridge.abort(sink, open)).isEqualTo(NativeBridge.ABORTED);
            assertThat(NativeBridge.abort(sink, open)).isEqualTo(NativeBridge.NOTHING_STAGED);
            assertThat(NativeBridge.stats(sink)[3]).as("aborted").isEqualTo(1);
            assertThat(visibleFiles(out)).isEmpty();
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void closedForgedAndNeverOpenedIdsAreIllegalState() throws Exception {
        long sink = open(tmp.newFolder("out"), "orders");
        byte[] open = NativeBridge.begin(sink);
        NativeBridge.close(sink);
        for (long id : new long[] {sink, 12345L, Long.MIN_VALUE, Long.MAX_VALUE, 0L, -1L}) {
            assertThatThrownBy(() -> NativeBridge.begin(id))
                    .isExactlyInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("twopc native sink #" + id + " is closed or was never opened");
            assertThatThrownBy(() -> write(id, open, "x")).isExactlyInstanceOf(IllegalStateException.class);
            assertThatThrownBy(() -> NativeBridge.stats(id)).isExactlyInstanceOf(IllegalStateException.class);
            assertThatThrownBy(() -> NativeBridge.commit(id, open)).isExactlyInstanceOf(IllegalStateException.class);
            assertThatThrownBy(() -> NativeBridge.close(id)).isExactlyInstanceOf(IllegalStateException.class);
        }
    }

    @Test
    public void aCloseFailingWhileAnotherFailureIsOnItsWayOutIsAddedToItNotThrownInItsPlace() throws Exception {
        long sink = open(tmp.newFolder("out"), "orders");
        NativeBridge.close(sink);
        // A fatal error of the writer's or committer's last call, then a close that fails too.
        RuntimeException fatal = new RuntimeException("the first cause");
        NativeBridge.closeAfter(sink, fatal);
        assertThat(fatal.getSuppressed()).hasSize(1);
        assertThat(fatal.getSuppressed()[0])
                .isExactlyInstanceOf(IllegalStateException.class)
                .hasMessageContaining("is closed or was never opened");
        // With nothing on its way out, the close's own failure is thrown.
        assertThatThrownBy(() -> NativeBridge.closeAfter(sink, null))
                .isExactlyInstanceOf(IllegalStateException.class);
        // A close that succeeds adds nothing.
        long other = open(tmp.newFolder("other"), "orders");
        RuntimeException cause = new RuntimeException("another cause");
        NativeBridge.closeAfter(other, cause);
        assertThat(cause.getSuppressed()).isEmpty();
        assertThatThrownBy(() -> NativeBridge.stats(other)).isExactlyInstanceOf(IllegalStateException.class);
    }

    @Test
    public void protocolMisuseIsIllegalState() throws Exception {
        long sink = open(tmp.newFolder("out"), "orders");
        try {
            byte[] open = NativeBridge.begin(sink);
            assertThatThrownBy(() -> NativeBridge.begin(sink))
                    .isExactlyInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("still open");
            assertThatThrownBy(() -> NativeBridge.commit(sink, open))
                    .isExactlyInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("never prepared");
            assertThatThrownBy(() -> NativeBridge.prepare(sink, open, -1))
                    .isExactlyInstanceOf(IllegalArgumentException.class);
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void badBatchesAreIllegalArgument() throws Exception {
        File out = tmp.newFolder("out");
        long sink = open(out, "orders");
        try {
            byte[] open = NativeBridge.begin(sink);
            RecordBatcher.Batch good = batch("abc", "de");
            ByteBuffer data = good.data;
            ByteBuffer ends = good.ends;
            int n = good.length;
            ByteBuffer pastTheEnd = ByteBuffer.allocateDirect(8).order(ByteOrder.LITTLE_ENDIAN);
            pastTheEnd.putInt(0, 4).putInt(4, 100);
            assertThatThrownBy(() -> NativeBridge.write(sink, open, data, n, pastTheEnd, 2, '\n'))
                    .isExactlyInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("malformed at record 1")
                    .hasMessageContaining("past the end");
            // Records not followed by the terminator the call names; bytes after the last record.
            assertThatThrownBy(() -> NativeBridge.write(sink, open, data, n, ends, 2, ';'))
                    .isExactlyInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("terminator");
            assertThatThrownBy(() -> NativeBridge.write(sink, open, data, n, ends, 1, '\n'))
                    .isExactlyInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("bytes after the last record");
            for (int bad : new int[] {-2, 256, Integer.MIN_VALUE}) {
                assertThatThrownBy(() -> NativeBridge.write(sink, open, data, n, ends, 2, bad))
                        .isExactlyInstanceOf(IllegalArgumentException.class)
                        .hasMessageContaining("record terminator " + bad);
            }
            ByteBuffer heap = ByteBuffer.allocate(16);
            assertThatThrownBy(() -> NativeBridge.write(sink, open, heap, 4, ends, 1, -1))
                    .isExactlyInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("batch must be a direct ByteBuffer");
            assertThatThrownBy(() -> NativeBridge.write(sink, open, data, n, heap, 2, '\n'))
                    .isExactlyInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("record ends must be a direct ByteBuffer");
            assertThatThrownBy(() -> NativeBridge.write(sink, open, data, data.capacity() + 1, ends, 2, '\n'))
                    .isExactlyInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("exceeds the buffer's capacity");
            int tooMany = ends.capacity() / 4 + 1;
            assertThatThrownBy(() -> NativeBridge.write(sink, open, data, n, ends, tooMany, '\n'))
                    .isExactlyInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("record ends length");
            assertThatThrownBy(() -> NativeBridge.write(sink, open, data, -1, ends, 2, '\n'))
                    .isExactlyInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("negative");
            assertThatThrownBy(() -> NativeBridge.write(sink, open, data, n, ends, -1, '\n'))
                    .isExactlyInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("negative");
            assertThatThrownBy(() -> NativeBridge.write(sink, open, null, 0, ends, 0, -1))
                    .isExactlyInstanceOf(IllegalArgumentException.class);
            assertThatThrownBy(() -> NativeBridge.write(sink, open, data, 0, null, 0, -1))
                    .isExactlyInstanceOf(IllegalArgumentException.class);
            assertThatThrownBy(() -> NativeBridge.write(sink, null, good))
                    .isExactlyInstanceOf(IllegalArgumentException.class);
            // Nothing of the refused batches was staged; empty batches are fine.
            assertThat(write(sink, open)).isEqualTo(0);
            assertThat(write(sink, open, "ok")).isEqualTo(1);
            assertThat(NativeBridge.commit(sink, NativeBridge.prepare(sink, open, 1)))
                    .isEqualTo(NativeBridge.COMMITTED);
            assertThat(read(visibleFiles(out).get(0))).isEqualTo("ok\n");
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void damagedHandlesAreStateErrorsNeverCrashes() throws Exception {
        long sink = open(tmp.newFolder("out"), "orders");
        try {
            byte[] open = NativeBridge.begin(sink);
            write(sink, open, "a");
            byte[] good = NativeBridge.prepare(sink, open, 3);
            byte[][] bad = {
                new byte[0],
                Arrays.copyOf(good, good.length - 1),
                Arrays.copyOf(good, 6),
                Arrays.copyOf(good, good.length + 3),
                flipped(good, good.length / 2),
                flipped(good, 0),
                flipped(good, good.length - 1),
                "not a handle at all".getBytes(),
                // Another program's data of the same size.
                new byte[good.length],
            };
            for (byte[] b : bad) {
                assertThatThrownBy(() -> NativeBridge.describeHandle(b))
                        .isExactlyInstanceOf(TwopcStateException.class);
                assertThatThrownBy(() -> NativeBridge.preparedAgeMs(b, 0))
                        .isExactlyInstanceOf(TwopcStateException.class);
                assertThatThrownBy(() -> NativeBridge.handleCheckpoint(b))
                        .isExactlyInstanceOf(TwopcStateException.class);
                assertThatThrownBy(() -> NativeBridge.handleTransaction(b))
                        .isExactlyInstanceOf(TwopcStateException.class);
                assertThatThrownBy(() -> NativeBridge.commit(sink, b))
                        .isExactlyInstanceOf(TwopcStateException.class)
                        .hasMessageContaining("twopc sink 'orders' subtask 0")
                        .hasMessageContaining("checkpoint state could not be read");
                assertThatThrownBy(() -> NativeBridge.abort(sink, b)).isExactlyInstanceOf(TwopcStateException.class);
            }
            // Every single-byte corruption and every truncation.
            for (int i = 0; i < good.length; i++) {
                byte[] b = flipped(good, i);
                assertThat(catchThrowable(() -> NativeBridge.describeHandle(b))).isInstanceOf(TwopcStateException.class);
                byte[] cut = Arrays.copyOf(good, i);
                assertThat(catchThrowable(() -> NativeBridge.describeHandle(cut))).isInstanceOf(TwopcStateException.class);
            }
            assertThat(describe(good).get("checkpoint").asLong()).isEqualTo(3);
            assertThat(NativeBridge.commit(sink, good)).isEqualTo(NativeBridge.COMMITTED);
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void aForeignSinksHandleIsRefused() throws Exception {
        File out = tmp.newFolder("out");
        long orders = open(out, "orders");
        long events = open(out, "events");
        try {
            byte[] open = NativeBridge.begin(orders);
            write(orders, open, "a");
            byte[] prepared = NativeBridge.prepare(orders, open, 1);
            // A changed sink id is a configuration mistake (fatal), not a retry.
            assertThatThrownBy(() -> NativeBridge.commit(events, prepared))
                    .isExactlyInstanceOf(TwopcConfigException.class)
                    .hasMessageContaining("belongs to sink 'orders'");
            assertThatThrownBy(() -> NativeBridge.abort(events, prepared))
                    .isExactlyInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("orders");
            assertThat(NativeBridge.commit(orders, prepared)).isEqualTo(NativeBridge.COMMITTED);
        } finally {
            NativeBridge.close(orders);
            NativeBridge.close(events);
        }
    }

    @Test
    public void restoredHandlesThatDoNotDecodeStopTheOpen() throws Exception {
        File out = tmp.newFolder("out");
        long sink = open(out, "orders");
        byte[] open = NativeBridge.begin(sink);
        write(sink, open, "a");
        byte[] prepared = NativeBridge.prepare(sink, open, 4);
        NativeBridge.close(sink);

        byte[][] known = {prepared, flipped(prepared, 9)};
        assertThatThrownBy(() -> open(out, "orders", 0, 1, 3_600_000L, 4, known))
                .isExactlyInstanceOf(TwopcStateException.class)
                .hasMessageContaining("restored transaction handle [1] of 2");
        assertThatThrownBy(() -> open(out, "orders", 0, 1, 3_600_000L, 4, new byte[][] {prepared, null}))
                .isExactlyInstanceOf(TwopcStateException.class)
                .hasMessageContaining("knownHandles[1] of 2 is null");

        // The good one alone restores; recovery commits it (recoverAndCommit).
        long restored = open(out, "orders", 0, 1, 3_600_000L, 4, new byte[][] {prepared});
        try {
            assertThat(NativeBridge.commit(restored, prepared)).isEqualTo(NativeBridge.COMMITTED);
            assertThat(read(visibleFiles(out).get(0))).isEqualTo("a\n");
        } finally {
            NativeBridge.close(restored);
        }
    }

    @Test
    public void aPreparedTransactionWhoseStagingVanishedIsLost() throws Exception {
        File out = tmp.newFolder("out");
        long sink = open(out, "orders");
        try {
            byte[] open = NativeBridge.begin(sink);
            write(sink, open, "r1", "r2");
            byte[] prepared = NativeBridge.prepare(sink, open, 12);
            String txn = transactionOf(prepared);
            Path staging = Paths.get(out.getAbsolutePath(), "_twopc", "orders", "staging", txn);
            assertThat(staging).isDirectory();
            deleteRecursively(staging);

            Throwable lost = catchThrowable(() -> NativeBridge.commit(sink, prepared));
            assertThat(lost)
                    .isExactlyInstanceOf(TwopcLostTransactionException.class)
                    .hasMessageContaining(txn)
                    .hasMessageContaining("Recovery plan");
            assertThat(((TwopcException) lost).isFatal()).isTrue();
            assertThat(visibleFiles(out)).isEmpty();
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void configurationMistakesAreConfigErrors() throws Exception {
        File out = tmp.newFolder("out");
        assertThatThrownBy(() -> open(out, "orders", 0, 1, 1_000L, -1, new byte[0][]))
                .isExactlyInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("retention")
                .hasMessageContaining("at least 80s");
        assertThatThrownBy(() -> open(out, "../etc", 0, 1, 3_600_000L, -1, new byte[0][]))
                .isExactlyInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("sink id");
        assertThatThrownBy(() -> open(out, "orders", 2, 2, 3_600_000L, -1, new byte[0][]))
                .isExactlyInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("outside parallelism");
        String good = NativeTestSupport.fsConfig(out, "orders", 3_600_000L);
        // validate() answers exactly as an open would, without touching the destination.
        NativeBridge.validate(good);
        String[][] mistakes = {
            {good.replace("\".txt\"", "\"txt\""), "suffix"},
            {good.replace("\"ioMode\"", "\"ioMod\""), "ioMod"},
            {good.replace("\"AUTO\"", "\"FAST\""), "I/O mode"},
            {good.replace("\"version\":1", "\"version\":2"), "different releases"},
            {good.replace(out.getAbsolutePath(), "relative/dir"), "absolute"},
            {"{}", "not a twopc configuration"},
        };
        for (String[] m : mistakes) {
            assertThatThrownBy(() -> NativeBridge.validate(m[0]))
                    .as(m[1])
                    .isExactlyInstanceOf(TwopcConfigException.class)
                    .hasMessageContaining(m[1]);
            assertThatThrownBy(() -> NativeBridge.openSink(m[0], NativeTestSupport.RUN_ID, 0, 1, 0, 10_000L, null,
                            -1L, new byte[0][], new byte[0][]))
                    .as(m[1])
                    .isExactlyInstanceOf(TwopcConfigException.class)
                    .hasMessageContaining(m[1]);
        }
        assertThat(visibleFiles(out)).isEmpty();
        assertThat(out.list()).as("a refused configuration touches nothing").isEmpty();
        assertThatThrownBy(() -> NativeBridge.validate(null)).isExactlyInstanceOf(IllegalArgumentException.class);
        assertThatThrownBy(() -> NativeBridge.openSink(good, NativeTestSupport.RUN_ID, 0, 1, 0, 10_000L, null, -1L,
                        new byte[0][], null))
                .isExactlyInstanceOf(IllegalArgumentException.class);
        assertThatThrownBy(() -> NativeBridge.openSink(good, NativeTestSupport.RUN_ID, 0, 1, 0, 10_000L, null, -1L,
                        new byte[0][], new byte[][] {new byte[] {1}}))
                .isExactlyInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("without a restored checkpoint id");
    }

    /**
     * A Java string with an unpaired surrogate has no UTF-8 form. It is refused by name, as a
     * configuration error (fatal: no restart changes it), never
     * handed on with U+FFFD in its place (another directory, table or password than the one set);
     * a paired one (an emoji) goes through unchanged.
     */
    @Test
    public void stringsWithAnUnpairedSurrogateAreRefusedNotReplaced() throws Exception {
        File out = tmp.newFolder("out");
        String good = NativeTestSupport.fsConfig(out, "orders", 3_600_000L);
        String lone = "sub\uD83Ddir";
        assertThatThrownBy(() -> NativeBridge.validate(good.replace(out.getAbsolutePath(),
                        out.getAbsolutePath() + "/" + lone)))
                .isExactlyInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("config holds an unpaired UTF-16 surrogate");
        assertThatThrownBy(() -> NativeBridge.openSink(good, NativeTestSupport.RUN_ID + lone, 0, 1, 0, 10_000L,
                        null, -1L, new byte[0][], new byte[0][]))
                .isExactlyInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("runId holds an unpaired UTF-16 surrogate");
        assertThatThrownBy(() -> NativeBridge.openSink(good, NativeTestSupport.RUN_ID, 0, 1, 0, 10_000L,
                        "pass" + lone, -1L, new byte[0][], new byte[0][]))
                .isExactlyInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("password holds an unpaired UTF-16 surrogate");
        assertThat(out.list()).as("a refused string touches nothing").isEmpty();

        // A paired surrogate is a character like any other: the directory is the one named.
        File emoji = new File(out, "sub\uD83D\uDE00dir");
        assertThat(emoji.mkdir()).isTrue();
        NativeBridge.validate(NativeTestSupport.fsConfig(emoji, "orders", 3_600_000L));
        long sink = NativeBridge.openSink(NativeTestSupport.fsConfig(emoji, "orders", 3_600_000L),
                NativeTestSupport.RUN_ID, 0, 1, 0, 10_000L, null, -1L, new byte[0][], new byte[0][]);
        try {
            assertThat(new File(emoji, "_twopc")).as("the sink's own directory, under the emoji-named one")
                    .isDirectory();
        } finally {
            NativeBridge.close(sink);
        }
    }

    /**
     * Flink cancels a task by interrupting its thread, and kills the TaskManager when the task has
     * not stopped within {@code task.cancellation.timeout}. A native call waiting on an object store
     * that went away (here an endpoint that takes connections and never answers, with the client's
     * timeouts far longer than the test) ends soon after its thread is interrupted, with an error
     * that says so, and leaves the interrupt flag set for Flink.
     */
    @Test
    public void aCallWaitingOnASilentObjectStoreEndsWhenItsThreadIsInterrupted() throws Exception {
        try (ServerSocket silent = new ServerSocket(0, 50, InetAddress.getLoopbackAddress())) {
            String config = TwopcSink.<String>builder()
                    .setSinkId("orders")
                    .setSerializationSchema(new SimpleStringSchema())
                    .forObjectStore(ObjectStoreDestination.s3("s3://silent-bucket/out")
                            .endpoint("http://127.0.0.1:" + silent.getLocalPort())
                            .pathStyleAccess(true)
                            .allowHttp(true))
                    .build()
                    .getOptions()
                    .toConfigJson();
            AtomicReference<Throwable> thrown = new AtomicReference<>();
            AtomicReference<Boolean> flagAfter = new AtomicReference<>();
            Thread caller = new Thread(() -> {
                try {
                    long writer = NativeBridge.openWriter(config, NativeTestSupport.RUN_ID, 0, 1, 0, 10_000L, null,
                            -1L, new byte[0][], new byte[0][]);
                    NativeBridge.close(writer);
                } catch (Throwable t) {
                    thrown.set(t);
                }
                flagAfter.set(Thread.currentThread().isInterrupted());
            }, "silent-object-store-caller");
            caller.start();
            Thread.sleep(1_000);
            assertThat(caller.isAlive()).as("the open waits on the silent endpoint (it ended with %s)", thrown.get()).isTrue();
            caller.interrupt();
            caller.join(10_000);
            assertThat(caller.isAlive()).as("still waiting 10 s after the interrupt").isFalse();
            assertThat(thrown.get()).isInstanceOf(TwopcException.class).hasMessageContaining("interrupted");
            assertThat(flagAfter.get()).as("the interrupt flag, left for Flink").isTrue();
        }
    }

    @Test
    public void aWriterPreparesAndACommitterCommits() throws Exception {
        File out = tmp.newFolder("out");
        String config = NativeTestSupport.fsConfig(out, "orders", 3_600_000L);
        long writer = NativeBridge.openWriter(config, NativeTestSupport.RUN_ID, 0, 1, 0, 10_000L, null, -1L,
                new byte[0][], new byte[0][]);
        long committer = NativeBridge.openCommitter(config, NativeTestSupport.RUN_ID, 0, 1, 0, null, -1L);
        try {
            byte[] open = NativeBridge.begin(writer);
            write(writer, open, "a", "b");
            byte[] state = NativeBridge.writerState(writer);
            assertThat(state).as("writer state names the open transaction").isNotEmpty();
            byte[] prepared = NativeBridge.prepare(writer, open, 1);
            // Roles are kept apart: a writer never commits, a committer never writes.
            assertThatThrownBy(() -> NativeBridge.commit(writer, prepared))
                    .isExactlyInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("writer");
            assertThatThrownBy(() -> NativeBridge.begin(committer))
                    .isExactlyInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("committer");
            assertThat(visibleFiles(out)).isEmpty();
            assertThat(NativeBridge.commit(committer, prepared)).isEqualTo(NativeBridge.COMMITTED);
            assertThat(NativeBridge.commit(committer, prepared)).isEqualTo(NativeBridge.ALREADY_COMMITTED);
            assertThat(read(visibleFiles(out).get(0))).isEqualTo("a\nb\n");
            long[] housekeeping = NativeBridge.checkpointCompleted(committer, 1);
            assertThat(housekeeping).containsExactly(0L, 0L, 0L);
            assertThat(NativeBridge.stats(committer)[NativeBridge.STAT_COMMITTED]).isEqualTo(1);
            assertThat(NativeBridge.stats(committer)[NativeBridge.STAT_ALREADY_COMMITTED]).isEqualTo(1);
            assertThat(NativeBridge.stats(writer)[NativeBridge.STAT_RECORDS_WRITTEN]).isEqualTo(2);
            assertThat(NativeBridge.finish(committer)).isEqualTo(0);
        } finally {
            NativeBridge.close(writer);
            NativeBridge.close(committer);
        }
    }

    @Test
    public void aRestoredWritersOpenTransactionIsAborted() throws Exception {
        File out = tmp.newFolder("out");
        String config = NativeTestSupport.fsConfig(out, "orders", 3_600_000L);
        long writer = NativeBridge.openWriter(config, NativeTestSupport.RUN_ID, 0, 1, 0, 10_000L, null, -1L,
                new byte[0][], new byte[0][]);
        byte[] state;
        byte[] open;
        try {
            byte[] first = NativeBridge.begin(writer);
            write(writer, first, "committed");
            byte[] prepared = NativeBridge.prepare(writer, first, 1);
            long committer = NativeBridge.openCommitter(config, NativeTestSupport.RUN_ID, 0, 1, 0, null, -1L);
            try {
                NativeBridge.commit(committer, prepared);
            } finally {
                NativeBridge.close(committer);
            }
            open = NativeBridge.begin(writer);
            write(writer, open, "after the checkpoint: never part of one");
            state = NativeBridge.writerState(writer);
        } finally {
            NativeBridge.close(writer);
        }
        String txn = transactionOf(open);
        Path staging = Paths.get(out.getAbsolutePath(), "_twopc", "orders", "staging", txn);
        assertThat(staging).exists();
        long restored = NativeBridge.openWriter(config, NativeTestSupport.RUN_ID, 0, 1, 1, 10_000L, null, 1L,
                new byte[][] {state}, new byte[0][]);
        try {
            assertThat(staging).as("the open transaction of the restored state is aborted at open").doesNotExist();
            assertThat(NativeBridge.stats(restored)[NativeBridge.STAT_ABORTED]).isEqualTo(1);
        } finally {
            NativeBridge.close(restored);
        }
        assertThat(visibleFiles(out)).hasSize(1);
        assertThat(read(visibleFiles(out).get(0))).isEqualTo("committed\n");
        // Damaged writer state stops the open before anything is touched.
        assertThatThrownBy(() -> NativeBridge.openWriter(config, NativeTestSupport.RUN_ID, 0, 1, 2, 10_000L, null, 1L,
                        new byte[][] {flipped(state, state.length / 2)}, new byte[0][]))
                .isExactlyInstanceOf(TwopcStateException.class)
                .hasMessageContaining("restored writer state [0] of 1");
    }

    @Test
    public void failPointsNeedTheFeature() {
        Throwable t = catchThrowable(() -> NativeBridge.configureFailPoints(""));
        if (t != null) {
            assertThat(t)
                    .isExactlyInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("built without fail points");
        }
    }

    static byte[] flipped(byte[] b, int index) {
        byte[] c = b.clone();
        c[index] ^= 0x40;
        return c;
    }

    static void deleteRecursively(Path dir) throws Exception {
        try (Stream<Path> walk = Files.walk(dir)) {
            walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        }
    }
}
