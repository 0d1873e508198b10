package io.twopc.flink.internal;

import static io.twopc.flink.internal.NativeTestSupport.open;
import static io.twopc.flink.internal.NativeTestSupport.read;
import static io.twopc.flink.internal.NativeTestSupport.visibleFiles;
import static io.twopc.flink.internal.NativeTestSupport.write;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.assertj.core.api.Assertions.catchThrowable;

import io.twopc.flink.TwopcException;

import java.io.File;

import org.apache.flink.testutils.logging.TestLoggerResource;
import org.junit.After;
import org.junit.Assume;
import org.junit.Before;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;
import org.slf4j.event.Level;

/**
 * Fault injection through the core's fail points; runs only against a
 * library built with {@code TWOPC_CARGO_FEATURES=failpoints}, and is skipped
 * otherwise (NativeBridgeTest checks the refusal then).
 */
public class FailPointsTest {
    @Rule
    public TemporaryFolder tmp = new TemporaryFolder();

    private boolean available;

    @Before
    public void requireFailPoints() {
        Throwable t = catchThrowable(() -> NativeBridge.configureFailPoints("off"));
        available = t == null;
        Assume.assumeTrue("library built without fail points", available);
    }

    @After
    public void clear() {
        if (available) {
            NativeBridge.configureFailPoints("");
        }
    }

    @Test
    public void aPanicBecomesATwopcExceptionAndPoisonsOnlyThatSink() throws Throwable {
        File out = tmp.newFolder("out");
        long sink = open(out, "orders");
        long other = open(tmp.newFolder("other"), "other");
        try (TestLoggerResource.SingleTestResource log =
                TestLoggerResource.asSingleTestResource("twopc.panic", Level.ERROR)) {
            byte[] open = NativeBridge.begin(sink);
            NativeBridge.configureFailPoints("twopc-write=1*panic(injected boom)");
            Throwable t = catchThrowable(() -> write(sink, open, "x"));
            assertThat(t)
                    .isExactlyInstanceOf(TwopcException.class)
                    .hasMessageContaining("internal error (Rust panic): injected boom")
                    .hasMessageContaining(".rs:");
            // The panic hook logged it (instead of printing to stderr).
            assertThat(log.getMessages()).anySatisfy(m -> assertThat(m).contains("injected boom"));

            assertThatThrownBy(() -> NativeBridge.stats(sink))
                    .isExactlyInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("unusable");
            // Other sinks are unaffected, and a poisoned one can still be closed.
            assertThat(NativeBridge.stats(other)).hasSize(10);
        } finally {
            NativeBridge.close(sink);
            NativeBridge.close(other);
        }
    }

    @Test
    public void aFailedCommitIsRetryableAndTheRetrySucceeds() throws Exception {
        File out = tmp.newFolder("out");
        long sink = open(out, "orders");
        try {
            byte[] open = NativeBridge.begin(sink);
            write(sink, open, "a", "b");
            byte[] prepared = NativeBridge.prepare(sink, open, 5);
            NativeBridge.configureFailPoints("twopc-commit-after=1*return");
            Throwable t = catchThrowable(() -> NativeBridge.commit(sink, prepared));
            assertThat(t).isExactlyInstanceOf(TwopcException.class).hasMessageContaining("twopc-commit-after");
            assertThat(((TwopcException) t).isFatal()).isFalse();
            NativeBridge.configureFailPoints("twopc-commit-after=off");
            // The first commit landed before the fault: the retry finds it.
            assertThat(NativeBridge.commit(sink, prepared)).isEqualTo(NativeBridge.ALREADY_COMMITTED);
            assertThat(read(visibleFiles(out).get(0))).isEqualTo("a\nb\n");
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void aFailedPrepareLeavesATransactionThatCanOnlyBeAborted() throws Exception {
        File out = tmp.newFolder("out");
        long sink = open(out, "orders");
        try {
            byte[] open = NativeBridge.begin(sink);
            write(sink, open, "a", "b");
            NativeBridge.configureFailPoints("twopc-prepare-destination=1*return");
            Throwable t = catchThrowable(() -> NativeBridge.prepare(sink, open, 5));
            assertThat(t).isExactlyInstanceOf(TwopcException.class)
                    .hasMessageContaining("twopc-prepare-destination")
                    .hasMessageContaining("can only be aborted");
            NativeBridge.configureFailPoints("twopc-prepare-destination=off");
            // Flink may call preCommit again for the same transaction when checkpoint failures are
            // tolerated; a retried prepare must never publish what the failed one left behind.
            assertThatThrownBy(() -> NativeBridge.prepare(sink, open, 6))
                    .isExactlyInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("poisoned");
            assertThatThrownBy(() -> write(sink, open, "c"))
                    .isExactlyInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("poisoned");
            assertThat(NativeBridge.abort(sink, open)).isEqualTo(NativeBridge.ABORTED);
            // The sink goes on with a new transaction.
            byte[] next = NativeBridge.begin(sink);
            write(sink, next, "a", "b");
            assertThat(NativeBridge.commit(sink, NativeBridge.prepare(sink, next, 7))).isEqualTo(NativeBridge.COMMITTED);
            assertThat(visibleFiles(out)).hasSize(1);
            assertThat(read(visibleFiles(out).get(0))).isEqualTo("a\nb\n");
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void badSpecsAreIllegalArguments() {
        assertThatThrownBy(() -> NativeBridge.configureFailPoints("twopc-write"))
                .isExactlyInstanceOf(IllegalArgumentException.class);
        assertThatThrownBy(() -> NativeBridge.configureFailPoints("twopc-write=bogus(((("))
                .isExactlyInstanceOf(IllegalArgumentException.class);
    }
}
