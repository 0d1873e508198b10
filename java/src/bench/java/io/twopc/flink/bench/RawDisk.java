package io.twopc.flink.bench;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import com.sun.nio.file.ExtendedOpenOption;

/** The physical limits that need no Flink. */
final class RawDisk {
    /** Records per block written at once: 1 MB. */
    private static final int BLOCK_RECORDS = 10_000;

    /**
     * Records per block written with O_DIRECT: 4096 lines of 100 bytes are 409,600 bytes, a
     * multiple of any block size up to 4 KiB, as direct I/O requires.
     */
    private static final int DIRECT_BLOCK_RECORDS = 4096;

    private RawDisk() {}

    /**
     * Sequential write of {@code records} lines of the benchmark's records to the benchmark's
     * directory, by {@link BenchJob#PARALLELISM} threads (one file each, as the sinks' subtasks
     * write), each file fsynced every {@code intervalMs} (the durability a checkpoint asks for) and
     * at the end. A 1 MB block of real records is generated once per thread and written
     * repeatedly, so the figure is the disk's and the kernel's, not the record generator's.
     */
    static void run(Path dir, long records, long intervalMs, boolean direct, Map<String, Object> result)
            throws Exception {
        Files.createDirectories(dir);
        int threads = BenchJob.PARALLELISM;
        List<Thread> workers = new ArrayList<>();
        List<Throwable> errors = new ArrayList<>();
        long startNs = System.nanoTime();
        for (int t = 0; t < threads; t++) {
            long share = records / threads + (t < records % threads ? 1 : 0);
            Path file = dir.resolve("raw-" + t);
            long firstId = 1 + t * (records / threads);
            Thread w = new Thread(() -> {
                try {
                    if (direct) {
                        writeFileDirect(file, firstId, share, intervalMs);
                    } else {
                        writeFile(file, firstId, share, intervalMs);
                    }
                } catch (Throwable e) {
                    synchronized (errors) {
                        errors.add(e);
                    }
                }
            }, "raw-disk-" + t);
            workers.add(w);
            w.start();
        }
        for (Thread w : workers) {
            w.join();
        }
        double seconds = (System.nanoTime() - startNs) / 1e9;
        long bytes = 0;
        for (int t = 0; t < threads; t++) {
            bytes += Files.size(dir.resolve("raw-" + t));
        }
        double rate = records / seconds;
        result.put("recordsPerSec", rate);
        result.put("endToEndRecordsPerSec", rate);
        result.put("mbPerSec", bytes / seconds / 1e6);
        result.put("jobSeconds", seconds);
        boolean ok = errors.isEmpty() && bytes == records * BenchRecords.LINE_BYTES;
        result.put("verification", ok ? "ok: " + bytes + " bytes written" : "failed: " + bytes + " bytes, " + errors);
        result.put("ok", ok);
    }

    private static void writeFile(Path file, long firstId, long count, long intervalMs) throws IOException {
        byte[] block = new byte[BLOCK_RECORDS * BenchRecords.LINE_BYTES];
        char[] scratch = new char[BenchRecords.RECORD_CHARS];
        for (int i = 0; i < BLOCK_RECORDS; i++) {
            BenchRecords.line(firstId + i, scratch, block, i * BenchRecords.LINE_BYTES);
        }
        long intervalNs = intervalMs * 1_000_000L;
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.WRITE,
                StandardOpenOption.TRUNCATE_EXISTING)) {
            ByteBuffer buf = ByteBuffer.wrap(block);
            long written = 0;
            long lastSync = System.nanoTime();
            while (written < count) {
                int n = (int) Math.min(BLOCK_RECORDS, count - written);
                buf.clear().limit(n * BenchRecords.LINE_BYTES);
                while (buf.hasRemaining()) {
                    ch.write(buf);
                }
                written += n;
                if (System.nanoTime() - lastSync >= intervalNs) {
                    ch.force(true);
                    lastSync = System.nanoTime();
                }
            }
            ch.force(true);
        }
    }

    /**
     * The same as {@link #writeFile}, with direct I/O (O_DIRECT): the bytes go from an aligned buffer
     * to the disk without passing through the page cache, so the figure is the disk's own. A tail
     * shorter than a block is written through the page cache at the end.
     */
    private static void writeFileDirect(Path file, long firstId, long count, long intervalMs) throws IOException {
        int blockBytes = DIRECT_BLOCK_RECORDS * BenchRecords.LINE_BYTES;
        ByteBuffer block = ByteBuffer.allocateDirect(blockBytes + 4096).alignedSlice(4096);
        byte[] lines = new byte[blockBytes];
        char[] scratch = new char[BenchRecords.RECORD_CHARS];
        for (int i = 0; i < DIRECT_BLOCK_RECORDS; i++) {
            BenchRecords.line(firstId + i, scratch, lines, i * BenchRecords.LINE_BYTES);
        }
        block.put(lines, 0, blockBytes);
        long intervalNs = intervalMs * 1_000_000L;
        long whole = count / DIRECT_BLOCK_RECORDS;
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.WRITE,
                StandardOpenOption.TRUNCATE_EXISTING, ExtendedOpenOption.DIRECT)) {
            long lastSync = System.nanoTime();
            for (long b = 0; b < whole; b++) {
                block.clear().limit(blockBytes);
                while (block.hasRemaining()) {
                    ch.write(block);
                }
                if (System.nanoTime() - lastSync >= intervalNs) {
                    ch.force(true);
                    lastSync = System.nanoTime();
                }
            }
            ch.force(true);
        }
        long tail = count - whole * DIRECT_BLOCK_RECORDS;
        if (tail > 0) {
            try (FileChannel ch = FileChannel.open(file, StandardOpenOption.WRITE, StandardOpenOption.APPEND)) {
                ByteBuffer buf = ByteBuffer.wrap(lines, 0, (int) tail * BenchRecords.LINE_BYTES);
                while (buf.hasRemaining()) {
                    ch.write(buf);
                }
                ch.force(true);
            }
        }
    }

    /**
     * Writes the rows for {@code psql \copy}: the benchmark's records (COPY text rows of {@code
     * (id, payload)}), split into {@code parts} files {@code copy-<i>.tsv}.
     */
    static void writeCopyFiles(Path dir, long records, int parts, Map<String, Object> result) throws IOException {
        Files.createDirectories(dir);
        char[] scratch = new char[BenchRecords.RECORD_CHARS];
        byte[] block = new byte[BLOCK_RECORDS * BenchRecords.LINE_BYTES];
        long next = 1;
        List<String> files = new ArrayList<>();
        for (int p = 0; p < parts; p++) {
            long share = records / parts + (p < records % parts ? 1 : 0);
            Path file = dir.resolve("copy-" + p + ".tsv");
            files.add(file.toString());
            try (OutputStream out = Files.newOutputStream(file)) {
                long done = 0;
                while (done < share) {
                    int n = (int) Math.min(BLOCK_RECORDS, share - done);
                    for (int i = 0; i < n; i++) {
                        BenchRecords.line(next++, scratch, block, i * BenchRecords.LINE_BYTES);
                    }
                    out.write(block, 0, n * BenchRecords.LINE_BYTES);
                    done += n;
                }
            }
        }
        result.put("files", files);
        result.put("verification", "ok: " + records + " rows in " + parts + " files");
        result.put("ok", true);
    }
}
