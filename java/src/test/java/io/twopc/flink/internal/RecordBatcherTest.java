package io.twopc.flink.internal;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import org.junit.Test;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/** The batch layout the native side validates: records in output form, and their ends apart. */
public class RecordBatcherTest {

    /** A handed-over batch read back: its records (terminators checked and left out) and payload. */
    private static List<String> records(RecordBatcher.Batch b) {
        List<String> out = new ArrayList<>();
        int start = 0;
        for (int i = 0; i < b.records; i++) {
            int end = b.ends.duplicate().order(ByteOrder.LITTLE_ENDIAN).getInt(4 * i);
            int recordEnd = b.terminator == RecordBatcher.NO_TERMINATOR ? end : end - 1;
            if (recordEnd < end) {
                assertThat(b.data.get(recordEnd)).isEqualTo((byte) b.terminator);
            }
            byte[] bytes = new byte[recordEnd - start];
            for (int k = 0; k < bytes.length; k++) {
                bytes[k] = b.data.get(start + k);
            }
            out.add(new String(bytes, StandardCharsets.UTF_8));
            start = end;
        }
        assertThat(start).as("the last end is the batch's length").isEqualTo(b.length);
        return out;
    }

    private static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    @Test
    public void recordsGoInOutputFormWithTheirEndsApart() {
        List<List<String>> handed = new ArrayList<>();
        List<Long> payload = new ArrayList<>();
        RecordBatcher batcher = new RecordBatcher(64, 3, '\n', b -> {
            handed.add(records(b));
            payload.add(b.payloadBytes());
        });
        for (String r : new String[] {"a", "", "bcd", "e"}) {
            batcher.add(utf8(r));
        }
        // Full at three records.
        assertThat(handed).containsExactly(List.of("a", "", "bcd"));
        assertThat(payload).containsExactly(4L);
        assertThat(batcher.pendingRecords()).isEqualTo(1);
        batcher.flush();
        batcher.flush(); // nothing more to hand over
        assertThat(handed).containsExactly(List.of("a", "", "bcd"), List.of("e"));
    }

    @Test
    public void withoutATerminatorRecordsAreBackToBack() {
        List<RecordBatcher.Batch> handed = new ArrayList<>();
        List<List<String>> read = new ArrayList<>();
        RecordBatcher batcher = new RecordBatcher(64, 100, RecordBatcher.NO_TERMINATOR, b -> {
            handed.add(b);
            read.add(records(b));
        });
        batcher.add(utf8("ab"));
        batcher.add(utf8(""));
        batcher.add(utf8("c\nd"));
        batcher.flush();
        assertThat(read).containsExactly(List.of("ab", "", "c\nd"));
        assertThat(handed.get(0).length).isEqualTo(5);
        assertThat(handed.get(0).payloadBytes()).isEqualTo(5L);
    }

    @Test
    public void aFullBufferIsHandedOverAndABigRecordCrossesAlone() {
        List<List<String>> read = new ArrayList<>();
        RecordBatcher batcher = new RecordBatcher(8, 100, '\n', b -> read.add(records(b)));
        batcher.add(utf8("abc")); // 4 bytes
        batcher.add(utf8("def")); // 8 bytes: the buffer is full
        assertThat(read).containsExactly(List.of("abc", "def"));
        batcher.add(utf8("gh"));
        // Does not fit beside "gh": "gh" goes first, then the big one alone.
        batcher.add(utf8("0123456789"));
        assertThat(read).containsExactly(List.of("abc", "def"), List.of("gh"), List.of("0123456789"));
        assertThat(batcher.pendingRecords()).isZero();
        // A record of exactly the buffer's size (with its terminator) fits.
        batcher.add(utf8("0123456"));
        assertThat(read).hasSize(4);
        assertThat(read.get(3)).containsExactly("0123456");
    }

    @Test
    public void aDiscardedBatchIsNeverHandedOver() {
        List<List<String>> read = new ArrayList<>();
        RecordBatcher batcher = new RecordBatcher(64, 100, '\n', b -> read.add(records(b)));
        batcher.add(utf8("dropped"));
        batcher.discard();
        batcher.add(utf8("kept"));
        batcher.flush();
        assertThat(read).containsExactly(List.of("kept"));
    }

    @Test
    public void aFailedWriteIsNotHandedOverAgain() {
        List<List<String>> read = new ArrayList<>();
        boolean[] fail = {true};
        RecordBatcher batcher = new RecordBatcher(64, 100, '\n', b -> {
            if (fail[0]) {
                throw new IllegalStateException("refused");
            }
            read.add(records(b));
        });
        batcher.add(utf8("x"));
        assertThatThrownBy(batcher::flush).hasMessage("refused");
        fail[0] = false;
        batcher.add(utf8("y"));
        batcher.flush();
        assertThat(read).containsExactly(List.of("y"));
    }

    @Test
    public void tinyRecordsAreSentBeforeTheirEndsOutgrowTheBatchBytes() {
        List<Integer> sizes = new ArrayList<>();
        // 1 MiB of batch bytes and a batch size of ten million: at most 131072 ends.
        RecordBatcher batcher = new RecordBatcher(1 << 20, 10_000_000, '\n', b -> sizes.add(b.records));
        for (int i = 0; i < 131072 + 5; i++) {
            batcher.add(new byte[] {'x'});
        }
        batcher.flush();
        assertThat(sizes).containsExactly(131072, 5);
    }

    @Test
    public void aTerminatorMustBeAByte() {
        assertThatThrownBy(() -> new RecordBatcher(64, 10, 256, b -> { }))
                .isInstanceOf(IllegalArgumentException.class);
        assertThatThrownBy(() -> new RecordBatcher(64, 10, -2, b -> { }))
                .isInstanceOf(IllegalArgumentException.class);
    }

    /**
     * Records larger than the batch share one buffer, grown when a larger one comes: a buffer per
     * record would leave dead direct buffers until a GC, and a stream of large records would then
     * meet the JVM's refusal although each record fits. Each record still crosses whole and alone;
     * a record beyond four batches' bytes is not kept.
     */
    @Test
    public void recordsLargerThanTheBatchReuseOneBufferGrownAsNeeded() {
        List<List<String>> handed = new ArrayList<>();
        List<Integer> allocated = new ArrayList<>();
        RecordBatcher batcher = new RecordBatcher(16, 100, '\n', b -> handed.add(records(b)), size -> {
            allocated.add(size);
            return ByteBuffer.allocateDirect(size);
        });
        String a = "a".repeat(40);
        String b = "b".repeat(30);
        String c = "c".repeat(60);
        batcher.add(utf8(a));
        batcher.add(utf8(b));
        batcher.add(utf8("x"));
        batcher.add(utf8(c));
        batcher.add(utf8(b));
        batcher.flush();
        assertThat(handed).containsExactly(List.of(a), List.of(b), List.of("x"), List.of(c), List.of(b));
        assertThat(allocated).containsExactly(41, 61);
        // Dropped with the writer: the next one allocates again.
        batcher.discard();
        batcher.add(utf8(b));
        assertThat(allocated).containsExactly(41, 61, 31);
        // A record beyond four batches' bytes has a buffer of its own each time, never kept.
        String huge = "h".repeat(80);
        batcher.add(utf8(huge));
        batcher.add(utf8(huge));
        batcher.add(utf8(b));
        assertThat(allocated).containsExactly(41, 61, 31, 81, 81);
        assertThat(handed.subList(handed.size() - 3, handed.size()))
                .containsExactly(List.of(huge), List.of(huge), List.of(b));
    }

    /**
     * A record larger than the batch crosses in direct memory of its own. When the JVM refuses it,
     * the record is refused with a clear error (the job stops once: Flink sizes direct memory for
     * the TaskManager's life, so a restart would meet the same refusal), not an anonymous
     * OutOfMemoryError, and the batch collected before it was handed over whole. A heap shortage
     * is not the batcher's to judge.
     */
    @Test
    public void aRecordWhoseOwnDirectBufferTheJvmRefusesIsRefusedClearly() {
        List<List<String>> handed = new ArrayList<>();
        RecordBatcher batcher = new RecordBatcher(16, 100, '\n', b -> handed.add(records(b)), size -> {
            throw new OutOfMemoryError("Cannot reserve " + size + " bytes of direct buffer memory (allocated: 0, "
                    + "limit: 1)");
        });
        batcher.add(utf8("small"));
        assertThatThrownBy(() -> batcher.add(new byte[100]))
                .isInstanceOf(io.twopc.flink.TwopcRecordRejectedException.class)
                .hasMessageContaining("a record of 100 bytes")
                .hasMessageContaining("taskmanager.memory.task.off-heap.size")
                .hasCauseInstanceOf(OutOfMemoryError.class);
        assertThat(handed).containsExactly(List.of("small"));

        RecordBatcher heapShort = new RecordBatcher(16, 100, '\n', b -> { }, size -> {
            throw new OutOfMemoryError("Java heap space");
        });
        assertThatThrownBy(() -> heapShort.add(new byte[100])).isInstanceOf(OutOfMemoryError.class);

        // The batch's own buffers: a batch size the TaskManager's direct memory cannot hold is a
        // configuration error naming the setting, stopping the job once; not an anonymous
        // OutOfMemoryError met again at every restart.
        assertThatThrownBy(() -> new RecordBatcher(1 << 20, 100, '\n', b -> { }, ByteBuffer::allocateDirect,
                size -> {
                    throw new OutOfMemoryError("Cannot reserve " + size + " bytes of direct buffer memory");
                }))
                .isInstanceOf(io.twopc.flink.TwopcConfigException.class)
                .hasMessageContaining("1048576 bytes for records")
                .hasMessageContaining("setBatchBytes")
                .hasMessageContaining("taskmanager.memory.task.off-heap.size")
                .hasCauseInstanceOf(OutOfMemoryError.class);
        assertThatThrownBy(() -> new RecordBatcher(1 << 20, 100, '\n', b -> { }, ByteBuffer::allocateDirect,
                size -> {
                    throw new OutOfMemoryError("Java heap space");
                }))
                .isInstanceOf(OutOfMemoryError.class);

        assertThat(RecordBatcher.parseSize("128m")).isEqualTo(128L << 20);
        assertThat(RecordBatcher.parseSize("2G")).isEqualTo(2L << 30);
        assertThat(RecordBatcher.parseSize("4096")).isEqualTo(4096);
        assertThat(RecordBatcher.parseSize("x")).isEqualTo(-1);
    }
}
