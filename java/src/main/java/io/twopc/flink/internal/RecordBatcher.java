package io.twopc.flink.internal;

import org.apache.flink.annotation.Internal;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * Collects serialized records into one direct buffer, {@code [u32 LE length][bytes]} each, and
 * hands the buffer to the native side whole: one JNI call per batch, never one per record.
 */
@Internal
public final class RecordBatcher {
    private static final int LENGTH_PREFIX_BYTES = 4;

    /** Receives a full batch: {@code length} bytes from position 0, {@code records} records. */
    public interface Sink {
        void write(ByteBuffer batch, int length, int records);
    }

    private final ByteBuffer buffer;
    private final int maxRecords;
    private final Sink sink;
    private int records;

    public RecordBatcher(int batchBytes, int batchRecords, Sink sink) {
        this.buffer = ByteBuffer.allocateDirect(batchBytes).order(ByteOrder.LITTLE_ENDIAN);
        this.maxRecords = batchRecords;
        this.sink = sink;
    }

    /** Adds one record; hands the batch over when full. */
    public void add(byte[] record) {
        int needed = LENGTH_PREFIX_BYTES + record.length;
        if (buffer.remaining() < needed) {
            flush();
            if (buffer.capacity() < needed) {
                // A record larger than the batch buffer crosses alone in a buffer of its own.
                ByteBuffer single = ByteBuffer.allocateDirect(needed).order(ByteOrder.LITTLE_ENDIAN);
                single.putInt(record.length).put(record);
                sink.write(single, single.position(), 1);
                return;
            }
        }
        buffer.putInt(record.length);
        buffer.put(record);
        records++;
        if (records >= maxRecords || !buffer.hasRemaining()) {
            flush();
        }
    }

    /** Hands over what is collected, if anything. */
    public void flush() {
        if (records == 0) {
            return;
        }
        int length = buffer.position();
        int n = records;
        // Emptied before the call: a failed write must not be handed over again (its
        // transaction is poisoned and can only be aborted).
        buffer.clear();
        records = 0;
        sink.write(buffer, length, n);
    }

    /** Drops what is collected (the transaction is being aborted). */
    public void discard() {
        buffer.clear();
        records = 0;
    }

    public int pendingRecords() {
        return records;
    }
}
