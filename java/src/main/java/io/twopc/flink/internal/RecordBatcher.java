package io.twopc.flink.internal;

import io.twopc.flink.TwopcConfigException;
import io.twopc.flink.TwopcRecordRejectedException;

import org.apache.flink.annotation.Internal;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.IntBuffer;
import java.util.function.IntFunction;

/**
 * Collects serialized records into direct buffers and hands them to the native side whole: one
 * JNI call per batch, never one per record.
 *
 * <p>The records go in as the output holds them: back to back, each followed by the terminator
 * (the line break of the LINES format) if there is one, so that a line-oriented destination checks
 * a batch with one vectorised count and appends it with one copy. Beside them, each record's end
 * offset (terminator included) as a little-endian int tells the records apart without looking at
 * their bytes. {@code twopc_core::records} describes the same layout.
 */
@Internal
public final class RecordBatcher {
    /** No terminator: records back to back exactly as serialized. */
    public static final int NO_TERMINATOR = -1;

    /** A full batch, handed over once; its buffers are read from position 0. */
    public static final class Batch {
        public final ByteBuffer data;
        public final int length;
        public final ByteBuffer ends;
        public final int records;
        /** The byte after each record, or {@link #NO_TERMINATOR}. */
        public final int terminator;

        Batch(ByteBuffer data, int length, ByteBuffer ends, int records, int terminator) {
            this.data = data;
            this.length = length;
            this.ends = ends;
            this.records = records;
            this.terminator = terminator;
        }

        /** The records' own bytes, terminators left out. */
        public long payloadBytes() {
            return terminator == NO_TERMINATOR ? length : (long) length - records;
        }
    }

    /** Receives a full batch. */
    public interface Sink {
        void write(Batch batch);
    }

    private final ByteBuffer data;
    private final ByteBuffer ends;
    /** The ends as records are added (a plain array store each), copied into {@link #ends} at once. */
    private final int[] endsArray;
    private final IntBuffer endsView;
    private final int maxRecords;
    private final int terminator;
    private final int terminatorBytes;
    private final Sink sink;
    /** Allocates the direct buffer of a record larger than the batch (a test replaces it). */
    private final IntFunction<ByteBuffer> oversized;
    /**
     * The buffer of the last record larger than the batch, kept for the next one: one buffer
     * grown as needed instead of one per record, because a dropped direct buffer is freed only
     * when a GC finds it, and a stream with many large records would otherwise fill direct memory
     * with dead buffers until the JVM refused a record that fits. Kept only up to {@link
     * #KEPT_FACTOR} times the batch's bytes (a rare huge record must not hold its memory for the
     * writer's life); released by {@link #discard}.
     */
    private ByteBuffer single;
    static final int KEPT_FACTOR = 4;
    /** The end offset of that record. */
    private final ByteBuffer singleEnd = ByteBuffer.allocateDirect(4).order(ByteOrder.LITTLE_ENDIAN);
    private int records;

    /**
     * @param terminator the byte written after every record ({@code '\n'} for LINES output), or
     *     {@link #NO_TERMINATOR}
     */
    public RecordBatcher(int batchBytes, int batchRecords, int terminator, Sink sink) {
        this(batchBytes, batchRecords, terminator, sink, ByteBuffer::allocateDirect, ByteBuffer::allocateDirect);
    }

    RecordBatcher(int batchBytes, int batchRecords, int terminator, Sink sink, IntFunction<ByteBuffer> oversized) {
        this(batchBytes, batchRecords, terminator, sink, oversized, ByteBuffer::allocateDirect);
    }

    /** {@code direct}: allocates the batch's own buffers (direct memory); a test's may refuse. */
    RecordBatcher(int batchBytes, int batchRecords, int terminator, Sink sink, IntFunction<ByteBuffer> oversized,
            IntFunction<ByteBuffer> direct) {
        this.oversized = oversized;
        if (terminator < NO_TERMINATOR || terminator > 0xff) {
            throw new IllegalArgumentException("terminator " + terminator + " is neither -1 nor a byte value");
        }
        this.terminator = terminator;
        this.terminatorBytes = terminator == NO_TERMINATOR ? 0 : 1;
        // The ends take 4 bytes per record slot (and as much on the heap): bounded by half the
        // batch's bytes, so that a large batch size with the default batch bytes does not
        // reserve far more memory than the records. A batch of tiny records is sent earlier.
        this.maxRecords = Math.min(batchRecords, Math.max(16, batchBytes / 8));
        try {
            this.data = direct.apply(batchBytes);
            this.ends = direct.apply(4 * maxRecords).order(ByteOrder.LITTLE_ENDIAN);
        } catch (OutOfMemoryError e) {
            throw refusedBatchBuffers(e, batchBytes, 4 * maxRecords);
        }
        this.endsArray = new int[maxRecords];
        this.endsView = ends.asIntBuffer();
        this.sink = sink;
    }

    /**
     * Adds one record; hands the batch over when full. A record larger than the batch whose own
     * direct buffer the JVM refuses: see {@link #refusedDirectMemory}.
     */
    public void add(byte[] record) {
        int needed = record.length + terminatorBytes;
        if (data.remaining() < needed) {
            flush();
            if (data.capacity() < needed) {
                // A record larger than the batch buffer crosses alone in a buffer of its own. The
                // native side copies a batch during the call and keeps no reference to it, so the
                // buffer is reused as the batch buffer is.
                boolean keep = (long) needed <= (long) KEPT_FACTOR * data.capacity();
                ByteBuffer buffer = single;
                if (buffer == null || buffer.capacity() < needed) {
                    if (keep) {
                        // The old one is dropped first, so that the JVM may free it if it must.
                        single = null;
                    }
                    try {
                        buffer = oversized.apply(needed);
                    } catch (OutOfMemoryError e) {
                        throw refusedDirectMemory(e, record.length, needed);
                    }
                    if (keep) {
                        single = buffer;
                    }
                }
                buffer.clear();
                buffer.put(record);
                if (terminatorBytes != 0) {
                    buffer.put((byte) terminator);
                }
                singleEnd.putInt(0, needed);
                sink.write(new Batch(buffer, needed, singleEnd, 1, terminator));
                return;
            }
        }
        data.put(record);
        if (terminatorBytes != 0) {
            data.put((byte) terminator);
        }
        endsArray[records++] = data.position();
        if (records >= maxRecords || !data.hasRemaining()) {
            flush();
        }
    }

    /**
     * What a refused direct buffer for an oversized record means. A heap shortage is not this
     * class's to judge: rethrown. A refused direct buffer is a {@link TwopcRecordRejectedException}
     * (the job stops once, naming the record's size and the setting): Flink sizes direct memory
     * once for the TaskManager's life and its network buffers keep most of it, so a record that
     * does not fit now would not fit after a restart either, and a retryable error would restart
     * the job on it forever. The JDK has already collected unreachable buffers before refusing.
     */
    private RuntimeException refusedDirectMemory(OutOfMemoryError e, int recordBytes, int needed) {
        String message = String.valueOf(e.getMessage());
        if (!message.toLowerCase(java.util.Locale.ROOT).contains("direct buffer memory")) {
            throw e;
        }
        long max = maxDirectMemory();
        TwopcRecordRejectedException rejected = new TwopcRecordRejectedException("a record of " + recordBytes
                + " bytes is larger than the batch buffer (" + data.capacity() + " bytes) and crosses in direct "
                + "memory of its own, which the JVM refused (" + message + (max > 0 ? "; at most " + max
                + " bytes of direct memory in all" : "") + "). Filter or split such records before the sink, or "
                + "give the task managers more off-heap memory (taskmanager.memory.task.off-heap.size), then "
                + "restart the job from its latest checkpoint");
        rejected.initCause(e);
        return rejected;
    }

    /**
     * What a refused direct buffer for the batch itself means: the configured batch size does not
     * fit this TaskManager's direct memory, now or after any restart (Flink sizes it once for the
     * TaskManager's life). A configuration error, which stops the job once naming the setting,
     * instead of an anonymous OutOfMemoryError that every restart meets again (found by review).
     * A heap shortage is rethrown.
     */
    private static RuntimeException refusedBatchBuffers(OutOfMemoryError e, int batchBytes, int endsBytes) {
        String message = String.valueOf(e.getMessage());
        if (!message.toLowerCase(java.util.Locale.ROOT).contains("direct buffer memory")) {
            throw e;
        }
        long max = maxDirectMemory();
        TwopcConfigException refused = new TwopcConfigException("the sink's batch buffers (" + batchBytes
                + " bytes for records and " + endsBytes + " for their ends, per subtask) do not fit in the JVM's "
                + "direct memory (" + message + (max > 0 ? "; at most " + max + " bytes of direct memory in all" : "")
                + "). Lower the batch size (setBatchBytes, or 'sink.batch-bytes' in SQL), or give the task managers "
                + "more off-heap memory (taskmanager.memory.task.off-heap.size), then restart the job from its "
                + "latest checkpoint");
        refused.initCause(e);
        return refused;
    }

    /**
     * The JVM's {@code -XX:MaxDirectMemorySize} in bytes (the last one given wins, as in the JVM),
     * or -1 when the command line sets none. For messages only.
     */
    static long maxDirectMemory() {
        long max = -1;
        for (String arg : java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()) {
            if (arg.startsWith("-XX:MaxDirectMemorySize=")) {
                max = parseSize(arg.substring("-XX:MaxDirectMemorySize=".length()));
            }
        }
        return max;
    }

    /** A JVM size ({@code 128m}, {@code 1g}, {@code 4096}); -1 when it cannot be read. */
    static long parseSize(String text) {
        String t = text.trim().toLowerCase(java.util.Locale.ROOT);
        long unit = 1;
        if (t.endsWith("k")) {
            unit = 1L << 10;
        } else if (t.endsWith("m")) {
            unit = 1L << 20;
        } else if (t.endsWith("g")) {
            unit = 1L << 30;
        } else if (t.endsWith("t")) {
            unit = 1L << 40;
        }
        if (unit != 1) {
            t = t.substring(0, t.length() - 1);
        }
        try {
            return Math.multiplyExact(Long.parseLong(t), unit);
        } catch (ArithmeticException | NumberFormatException e) {
            return -1;
        }
    }

    /** Hands over what is collected, if anything. */
    public void flush() {
        if (records == 0) {
            return;
        }
        endsView.clear();
        endsView.put(endsArray, 0, records);
        Batch batch = new Batch(data, data.position(), ends, records, terminator);
        // Emptied before the call: a failed write must not be handed over again (its
        // transaction is poisoned and can only be aborted).
        data.clear();
        records = 0;
        sink.write(batch);
    }

    /**
     * Drops what is collected (the transaction is being aborted, or the writer closes), and the
     * buffer kept for records larger than the batch.
     */
    public void discard() {
        data.clear();
        records = 0;
        single = null;
    }

    public int pendingRecords() {
        return records;
    }
}
