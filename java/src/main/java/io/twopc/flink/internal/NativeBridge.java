package io.twopc.flink.internal;

import io.twopc.flink.TwopcConfigException;
import io.twopc.flink.TwopcException;

import org.apache.flink.annotation.Internal;

import java.nio.ByteBuffer;

/**
 * The JNI surface of the Rust core (crate {@code twopc-jni}). Only this class declares native
 * methods; {@link NativeLoader} loads the library for the class loader that loaded this class.
 *
 * <p>A subtask opens a native <em>writer</em> ({@link #openWriter}), <em>committer</em> ({@link
 * #openCommitter}) or both in one ({@link #openSink}, for the SinkFunction shim), from one
 * configuration: a versioned JSON document written by {@link SinkConfig}. They are reached through
 * opaque ids, never pointers: the Rust side keeps a registry and validates the id on every call,
 * so a closed, stale or forged id gets an {@link IllegalStateException}. Calls on one id are
 * serialised on the Rust side.
 *
 * <p>Transaction handles and writer states cross as the core's encoded bytes (the versioned
 * envelope). Records cross in batches, two direct buffers filled by {@link RecordBatcher}: the
 * records in output form (back to back, each followed by the record terminator if any) and their
 * end offsets as little-endian ints.
 *
 * <p>Errors become exceptions of {@code io.twopc.flink}, chosen from the core's error kind:
 * {@code TwopcLostTransactionException}, {@code TwopcUnresolvedCommitException}, {@code
 * TwopcRewindException}, {@code TwopcFreshStartException}, {@code TwopcStateException}, {@code
 * TwopcConfigException}, {@code TwopcRecordRejectedException}, {@code TwopcOwnershipException}
 * (all fatal) and {@code TwopcException} (retryable: the job restarts); protocol misuse and unknown
 * ids give {@link IllegalStateException}, a malformed batch {@link IllegalArgumentException}. A
 * Rust panic becomes a {@code TwopcException}.
 */
@Internal
public final class NativeBridge {
    /** Outcomes of {@link #commit}. */
    public static final int COMMITTED = 0;
    public static final int ALREADY_COMMITTED = 1;
    public static final int EMPTY = 2;
    /** Outcomes of {@link #abort}. */
    public static final int ABORTED = 0;
    public static final int NOTHING_STAGED = 1;

    /** Indexes into {@link #stats}. */
    public static final int STAT_RECORDS_WRITTEN = 0;
    public static final int STAT_BYTES_WRITTEN = 1;
    public static final int STAT_COMMITTED = 2;
    public static final int STAT_ABORTED = 3;
    public static final int STAT_LAST_COMMITTED_CHECKPOINT = 4;
    public static final int STAT_OPEN_RECORDS = 5;
    public static final int STAT_ALREADY_COMMITTED = 6;
    public static final int STAT_LINGERING_ABORTED = 7;
    public static final int STAT_EXPIRED = 8;
    public static final int STAT_HOUSEKEEPING_FAILURES = 9;

    /** Why the library is not loaded in this class loader, or null once it is. */
    private static volatile UnsatisfiedLinkError loadFailure;

    static {
        try {
            NativeLoader.load(NativeBridge.class);
        } catch (UnsatisfiedLinkError e) {
            // Kept instead of failing the class: every later use reports the same, original
            // message (a failed static initializer would leave only "Could not initialize class").
            loadFailure = e;
        }
    }

    private NativeBridge() {}

    /**
     * Ensures the library is loaded; every entry point that opens something calls it first. A
     * platform without a library, or a library this system cannot load, is a {@link
     * TwopcConfigException} (a restart cannot help); a failed extraction (a full temporary
     * directory) a retryable {@link TwopcException}. Both carry the loader's original message.
     */
    public static void ensureLoaded() {
        UnsatisfiedLinkError failure = loadFailure;
        if (failure == null) {
            return;
        }
        if (!NativeLoader.isPermanent(failure)) {
            // A failed extraction is tried again at every use, so that the restart the error
            // asks for can succeed: the class loader (and this class) may outlive the job's
            // attempt, e.g. with the jar in Flink's lib/ (found by review: the first failure was
            // kept for good, and every restart failed the same way). System.load never ran for
            // it, so trying again is safe.
            synchronized (NativeBridge.class) {
                failure = loadFailure;
                if (failure != null && !NativeLoader.isPermanent(failure)) {
                    try {
                        NativeLoader.load(NativeBridge.class);
                        loadFailure = null;
                        return;
                    } catch (UnsatisfiedLinkError e) {
                        loadFailure = e;
                        failure = e;
                    }
                } else if (failure == null) {
                    return;
                }
            }
        }
        String message = failure.getMessage();
        TwopcException e = NativeLoader.isPermanent(failure)
                ? new TwopcConfigException(message)
                : new TwopcException(message);
        e.initCause(failure);
        throw e;
    }

    /** True when the library is loaded in this class loader. */
    public static boolean isLoaded() {
        return loadFailure == null;
    }

    /** Checks a configuration exactly as the open calls will; throws what they would. */
    public static void validate(String config) {
        ensureLoaded();
        validateConfig(config);
    }

    private static native void validateConfig(String config);

    /**
     * Opens the SinkFunction shim's writer and committer in one: claims the subtask's share of the
     * destination, runs the start-up rules (rewind check, fresh-start rules; lingering
     * transactions are aborted after the first checkpoint of this attempt completes, see {@link
     * #checkpointCompleted}) and the retention check. {@code restoredCheckpointId < 0} means no
     * restored state; {@code writerStates} and {@code knownHandles} are this subtask's share of the
     * restored state. {@code password} (may be null) is the one this task manager read from the
     * source the configuration names; it never appears in a message or log line. Returns the id.
     */
    public static long openSink(
            String config,
            String runId,
            int subtask,
            int parallelism,
            int attempt,
            long checkpointIntervalMs,
            String password,
            long restoredCheckpointId,
            byte[][] writerStates,
            byte[][] knownHandles) {
        ensureLoaded();
        return openSink0(config, runId, subtask, parallelism, attempt, checkpointIntervalMs, password,
                restoredCheckpointId, writerStates, knownHandles);
    }

    /** Opens a Sink V2 writer; arguments as {@link #openSink}. Aborts the restored states' open transactions. */
    public static long openWriter(
            String config,
            String runId,
            int subtask,
            int parallelism,
            int attempt,
            long checkpointIntervalMs,
            String password,
            long restoredCheckpointId,
            byte[][] writerStates,
            byte[][] knownHandles) {
        ensureLoaded();
        return openWriter0(config, runId, subtask, parallelism, attempt, checkpointIntervalMs, password,
                restoredCheckpointId, writerStates, knownHandles);
    }

    /**
     * Opens a Sink V2 committer (no I/O until it commits): it commits any prepared handle of the
     * sink, and runs housekeeping when told a checkpoint completed.
     */
    public static long openCommitter(
            String config, String runId, int subtask, int parallelism, int attempt, String password,
            long restoredCheckpointId) {
        ensureLoaded();
        return openCommitter0(config, runId, subtask, parallelism, attempt, 0, password, restoredCheckpointId,
                new byte[0][], new byte[0][]);
    }

    private static native long openSink0(String config, String runId, int subtask, int parallelism, int attempt,
            long checkpointIntervalMs, String password, long restoredCheckpointId, byte[][] writerStates,
            byte[][] knownHandles);

    private static native long openWriter0(String config, String runId, int subtask, int parallelism, int attempt,
            long checkpointIntervalMs, String password, long restoredCheckpointId, byte[][] writerStates,
            byte[][] knownHandles);

    private static native long openCommitter0(String config, String runId, int subtask, int parallelism,
            int attempt, long checkpointIntervalMs, String password, long restoredCheckpointId,
            byte[][] writerStates, byte[][] knownHandles);

    /** Begins a transaction (writer or sink); returns its open handle. */
    public static native byte[] begin(long id);

    /**
     * Stages a batch into the open transaction; returns the records staged in it so far. The batch
     * is {@code records} records in the first {@code length} bytes of {@code data}, back to back,
     * each followed by {@code terminator} unless it is -1; {@code ends} holds each record's end
     * offset in {@code data} (terminator included) as little-endian ints ({@link RecordBatcher}
     * fills both).
     *
     * <p>The buffers are read in place, not copied: they must not be changed or freed by another
     * thread until the call returns. Heap buffers, negative or too large lengths, a terminator that
     * is not -1 or a byte, and a malformed batch (ends that fall or run past the data, a record not
     * followed by its terminator, bytes after the last record) give
     * {@link IllegalArgumentException}; nothing of the batch is staged then.
     */
    public static native long write(long id, byte[] openHandle, ByteBuffer data, int length, ByteBuffer ends,
            int records, int terminator);

    /** {@link #write(long, byte[], ByteBuffer, int, ByteBuffer, int, int)} of a filled batch. */
    public static long write(long id, byte[] openHandle, RecordBatcher.Batch batch) {
        return write(id, openHandle, batch.data, batch.length, batch.ends, batch.records, batch.terminator);
    }

    /** Prepares the open transaction for a checkpoint; returns the prepared handle. */
    public static native byte[] prepare(long id, byte[] openHandle, long checkpointId);

    /** Aborts a transaction: {@link #ABORTED} or {@link #NOTHING_STAGED}. */
    public static native int abort(long id, byte[] handle);

    /** The writer's state for a checkpoint (lineage and open transaction): one element per subtask. */
    public static native byte[] writerState(long id);

    /**
     * Commits a prepared handle (committer or sink), retrying an unknown outcome with back-off
     * within the configured bound: {@link #COMMITTED}, {@link #ALREADY_COMMITTED} or {@link
     * #EMPTY}.
     */
    public static native int commit(long id, byte[] preparedHandle);

    /**
     * Nanoseconds from the start of the committer's last {@link #commit} call until its output was
     * visible to readers (the call goes on after that, making the commit durable); -1 where the
     * destination does not tell or that call published nothing.
     */
    public static native long lastCommitVisibleNanos(long id);

    /**
     * Checkpoint {@code checkpointId} completed (call after its commits): housekeeping. Returns
     * {lingering transactions aborted, expired, failures}; failures are logged and tried again at
     * the next checkpoint, never thrown. Only a commit it had to finish can throw.
     */
    public static native long[] checkpointCompleted(long id, long checkpointId);

    /**
     * The subtask's input ended and the commit of its final checkpoint is done: housekeeping still
     * due is tried once more, and its failure thrown. Nothing tries again (after the final
     * checkpoint Flink redeploys a failed subtask as finished), so callers report a retryable
     * failure instead of failing the task. Call it only then: at the close of a failed or
     * cancelled attempt a newer attempt may already own the subtask's share, and this would abort
     * its transactions as lingering. Returns the lingering transactions aborted.
     */
    public static native long finish(long id);

    /** Counters, indexed by the {@code STAT_*} constants (zero for those the role lacks). */
    public static native long[] stats(long id);

    /** Releases a writer, committer or sink. Unknown or already closed ids throw IllegalStateException. */
    public static native void close(long id);

    /**
     * {@link #close} while {@code failure} (if not null) is on its way out: a failure of the close
     * is added to it as suppressed, never thrown in its place. Thrown from a {@code finally}, it
     * would replace the first cause, and a fatal error (which stops the job) would become one that
     * restarts it.
     */
    public static void closeAfter(long id, Throwable failure) {
        if (failure == null) {
            close(id);
            return;
        }
        try {
            close(id);
        } catch (RuntimeException e) {
            failure.addSuppressed(e);
        }
    }

    /** Name of the class loader release hook that {@link #releaseHookFor} makes. */
    public static final String RELEASE_HOOK_NAME = "twopc-native-library";

    /**
     * The release hook for the job class loader {@code userCodeClassLoader}: Flink runs it when
     * the last task of the job on this TaskManager is gone. It closes what the job's tasks left
     * open and stops the library's background thread, so that the JVM can unload this copy of
     * the library (a few MB each) once the class loader is collected, with no code of it still
     * running. It does so only when this copy belongs to that class loader (the twopc jar is
     * inside the job's jar): a copy loaded by a parent class loader (the jar in Flink's {@code
     * lib/}) serves every job of the process and is left alone.
     */
    public static Runnable releaseHookFor(ClassLoader userCodeClassLoader) {
        ClassLoader library = NativeBridge.class.getClassLoader();
        ClassLoader system = ClassLoader.getSystemClassLoader();
        boolean owned = library != system && !isAncestorOf(library, system)
                && !isAncestorOf(library, userCodeClassLoader);
        return () -> {
            if (owned && isLoaded()) {
                release();
            }
        };
    }

    /**
     * Closes every writer, committer and sink still open in this copy of the library and stops
     * its background thread; returns how many were open. Only for the release of the class
     * loader (see {@link #releaseHookFor}): anything still running in it loses its sink.
     */
    public static int release() {
        return release0();
    }

    private static native int release0();

    /** True when {@code candidate} is {@code loader}'s parent, or the parent's parent, and so on. */
    static boolean isAncestorOf(ClassLoader candidate, ClassLoader loader) {
        for (ClassLoader l = loader == null ? null : loader.getParent(); l != null; l = l.getParent()) {
            if (l == candidate) {
                return true;
            }
        }
        // The bootstrap loader (null) is everyone's ancestor.
        return candidate == null;
    }

    /** Decodes a handle into a JSON object of its fields (for tests and tools). */
    public static native String describeHandle(byte[] handle);

    /** Milliseconds since the handle was prepared, or -1 if it is open (for timeout warnings). */
    public static native long preparedAgeMs(byte[] handle, long nowMs);

    /** The checkpoint a prepared handle was prepared for, or -1 if it is open. */
    public static native long handleCheckpoint(byte[] handle);

    /** The id of the handle's transaction (for log lines and metrics). */
    public static native String handleTransaction(byte[] handle);

    /**
     * Configures test-only fail points ({@code name=actions;name=actions}, the fail crate's
     * syntax). Throws IllegalStateException when the library was built without the {@code
     * failpoints} feature.
     */
    public static native void configureFailPoints(String spec);
}
