package io.twopc.flink.bench;

import org.apache.flink.api.common.functions.RichMapFunction;

import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * The benchmark's records: numbered lines of exactly {@link #LINE_BYTES} bytes including the
 * newline the sinks append. {@code <20-digit id>\t<78 characters of payload>}: the same bytes are
 * a text line for the file sinks and a COPY text row {@code (id bigint, payload text)} for
 * PostgreSQL.
 */
public final class BenchRecords {
    /** Characters of a record without its newline. */
    public static final int RECORD_CHARS = 99;
    /** Bytes of a record as written by a line-oriented sink (record + {@code \n}). */
    public static final int LINE_BYTES = RECORD_CHARS + 1;
    static final int ID_DIGITS = 20;
    private static final char[] TEMPLATE = template();
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    /**
     * Per-subtask count of records handed to the sink, read by the sampler thread of the same JVM
     * (the MiniCluster runs in it). Slots are 16 longs apart so that subtasks do not share a cache
     * line.
     */
    static final AtomicLongArray PROGRESS = new AtomicLongArray(16 * 64);

    private BenchRecords() {}

    private static char[] template() {
        char[] t = new char[RECORD_CHARS];
        String filler = "twopc-benchmark-record-payload-abcdefghijklmnopqrstuvwxyz-0123456789-ABCDEFGHIJ";
        for (int i = 0; i < RECORD_CHARS; i++) {
            t[i] = i < ID_DIGITS ? '0' : i == ID_DIGITS ? '\t' : filler.charAt((i - ID_DIGITS - 1) % filler.length());
        }
        return t;
    }

    /** Fills {@code out[0..RECORD_CHARS)} with record {@code id}. */
    static void fill(long id, char[] out) {
        System.arraycopy(TEMPLATE, 0, out, 0, RECORD_CHARS);
        long v = id;
        for (int i = ID_DIGITS - 1; i >= 0 && v > 0; i--) {
            out[i] = (char) ('0' + (v % 10));
            v /= 10;
        }
        // 16 hex digits of a hash of the id, so that payloads differ between records.
        long h = id * 0x9E3779B97F4A7C15L;
        for (int i = 0; i < 16; i++) {
            out[ID_DIGITS + 1 + i] = HEX[(int) (h >>> (60 - 4 * i)) & 0xf];
        }
    }

    /** Record {@code id} as a String (without newline). */
    public static String record(long id) {
        char[] c = new char[RECORD_CHARS];
        fill(id, c);
        return new String(c);
    }

    /** Writes record {@code id} and its newline as bytes into {@code out} at {@code offset}. */
    static void line(long id, char[] scratch, byte[] out, int offset) {
        fill(id, scratch);
        for (int i = 0; i < RECORD_CHARS; i++) {
            out[offset + i] = (byte) scratch[i];
        }
        out[offset + RECORD_CHARS] = '\n';
    }

    static long totalProgress() {
        long sum = 0;
        for (int i = 0; i < 64; i++) {
            sum += PROGRESS.get(16 * i);
        }
        return sum;
    }

    static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    /**
     * Turns the generated sequence number into a record and counts it for its subtask: chained
     * directly in front of the sink, so the count is what the sink has accepted (plus one).
     */
    static final class Numbered extends RichMapFunction<Long, String> {
        private static final long serialVersionUID = 1L;
        private transient char[] scratch;
        private transient int slot;
        private transient long count;

        @Override
        public void open(org.apache.flink.api.common.functions.OpenContext openContext) {
            scratch = new char[RECORD_CHARS];
            slot = 16 * (getRuntimeContext().getTaskInfo().getIndexOfThisSubtask() % 64);
            count = 0;
        }

        @Override
        public String map(Long value) {
            fill(value, scratch);
            // Ordered store, no fence: the sampler only needs an eventually fresh value.
            PROGRESS.lazySet(slot, ++count);
            return new String(scratch);
        }
    }
}
