package io.twopc.flink.internal;

import static io.twopc.flink.internal.NativeTestSupport.open;
import static io.twopc.flink.internal.NativeTestSupport.read;
import static io.twopc.flink.internal.NativeTestSupport.visibleFiles;
import static io.twopc.flink.internal.NativeTestSupport.write;
import static org.assertj.core.api.Assertions.assertThat;

import java.io.File;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.junit.After;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * Several Java threads in one native sink at once: calls are serialised by the
 * sink's lock, so results stay consistent and nothing crashes.
 */
public class NativeBridgeConcurrencyTest {
    private static final int ITERATIONS = 500;

    @Rule
    public TemporaryFolder tmp = new TemporaryFolder();

    private final ExecutorService pool = Executors.newFixedThreadPool(4);

    @After
    public void stop() throws Exception {
        pool.shutdownNow();
        assertThat(pool.awaitTermination(30, TimeUnit.SECONDS)).isTrue();
    }

    @Test
    public void twoThreadsWritingIntoOneTransactionLoseNothing() throws Exception {
        File out = tmp.newFolder("out");
        long sink = open(out, "orders");
        try {
            byte[] open = NativeBridge.begin(sink);
            CyclicBarrier start = new CyclicBarrier(3);
            List<Future<long[]>> writers = new ArrayList<>();
            for (int t = 0; t < 2; t++) {
                String tag = "t" + t;
                writers.add(pool.submit(() -> {
                    start.await();
                    long[] seen = new long[ITERATIONS];
                    for (int i = 0; i < ITERATIONS; i++) {
                        seen[i] = write(sink, open, tag + "-" + i + "-a", tag + "-" + i + "-b");
                    }
                    return seen;
                }));
            }
            // A third thread reads stats meanwhile.
            Future<Long> reader = pool.submit(() -> {
                start.await();
                long last = 0;
                for (int i = 0; i < ITERATIONS; i++) {
                    long now = NativeBridge.stats(sink)[5];
                    assertThat(now).isGreaterThanOrEqualTo(last);
                    last = now;
                }
                return last;
            });
            for (Future<long[]> w : writers) {
                long[] seen = w.get(60, TimeUnit.SECONDS);
                for (int i = 1; i < seen.length; i++) {
                    assertThat(seen[i]).as("each thread sees the count grow").isGreaterThan(seen[i - 1]);
                }
                assertThat(seen[0] % 2).isEqualTo(0);
            }
            assertThat(reader.get(60, TimeUnit.SECONDS)).isLessThanOrEqualTo(4L * ITERATIONS);
            assertThat(NativeBridge.stats(sink)[5]).isEqualTo(4L * ITERATIONS);

            byte[] prepared = NativeBridge.prepare(sink, open, 1);
            assertThat(NativeBridge.commit(sink, prepared)).isEqualTo(NativeBridge.COMMITTED);
            List<Path> files = visibleFiles(out);
            assertThat(files).hasSize(1);
            String[] lines = read(files.get(0)).split("\n");
            assertThat(lines).hasSize(4 * ITERATIONS);
            // Each batch stays contiguous: a batch is one locked call.
            for (int i = 0; i < lines.length; i += 2) {
                assertThat(lines[i]).endsWith("-a");
                assertThat(lines[i + 1]).isEqualTo(lines[i].substring(0, lines[i].length() - 1) + "b");
            }
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void twoThreadsRunningWholeTransactionsOnOneSinkStayConsistent() throws Exception {
        File out = tmp.newFolder("out");
        long sink = open(out, "orders");
        Object cycle = new Object();
        try {
            CyclicBarrier start = new CyclicBarrier(2);
            List<Future<Integer>> workers = new ArrayList<>();
            for (int t = 0; t < 2; t++) {
                String tag = "t" + t;
                workers.add(pool.submit(() -> {
                    start.await();
                    int committed = 0;
                    for (int i = 0; i < ITERATIONS / 5; i++) {
                        // A sink has one open transaction at a time, so the
                        // threads take turns for begin..prepare.
                        byte[] prepared;
                        synchronized (cycle) {
                            byte[] open = NativeBridge.begin(sink);
                            write(sink, open, tag + "-" + i);
                            prepared = NativeBridge.prepare(sink, open, i + 1);
                        }
                        // Commits run outside the turn, concurrently with the
                        // other thread's begin/write/prepare.
                        assertThat(NativeBridge.commit(sink, prepared)).isEqualTo(NativeBridge.COMMITTED);
                        committed++;
                    }
                    return committed;
                }));
            }
            int total = 0;
            for (Future<Integer> w : workers) {
                total += w.get(120, TimeUnit.SECONDS);
            }
            assertThat(total).isEqualTo(2 * (ITERATIONS / 5));
            assertThat(visibleFiles(out)).hasSize(total);
            assertThat(NativeBridge.stats(sink)[2]).isEqualTo(total);
        } finally {
            NativeBridge.close(sink);
        }
    }

    @Test
    public void closingWhileAnotherThreadUsesTheSinkIsSafe() throws Exception {
        for (int round = 0; round < 20; round++) {
            File out = tmp.newFolder("out" + round);
            long sink = open(out, "orders");
            byte[] open = NativeBridge.begin(sink);
            CyclicBarrier start = new CyclicBarrier(2);
            Callable<Throwable> user = () -> {
                start.await();
                try {
                    for (int i = 0; i < 10_000; i++) {
                        write(sink, open, "x");
                        NativeBridge.stats(sink);
                    }
                    return null;
                } catch (Throwable t) {
                    return t;
                }
            };
            Future<Throwable> f = pool.submit(user);
            start.await();
            Thread.sleep(round % 3);
            NativeBridge.close(sink);
            Throwable t = f.get(60, TimeUnit.SECONDS);
            if (t != null) {
                assertThat(t)
                        .isExactlyInstanceOf(IllegalStateException.class)
                        .hasMessageContaining("is closed or was never opened");
            }
        }
    }
}
