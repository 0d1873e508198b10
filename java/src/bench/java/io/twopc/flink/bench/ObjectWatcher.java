package io.twopc.flink.bench;

import java.io.IOException;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Notes when each visible object appears in a bucket, by listing it (ListObjectsV2) every {@link
 * #POLL_MS} ms: an object store has no change notification a reader could wait on, so a reader
 * polls, and so does this. An object counts as seen when the listing that first shows it has been
 * answered, so a figure is late by up to one poll interval plus one listing; the listings load the
 * server alike for both sinks. Only keys under {@code <prefix>/part-} are listed: both sinks name
 * their visible objects so, and their control and temporary objects (names starting with
 * {@code _}, twopc's commit records among them) are not what a reader waits for.
 */
final class ObjectWatcher implements Watcher {
    static final long POLL_MS = 50;

    private final BenchS3 s3;
    private final String bucket;
    private final String prefix;
    private final Map<String, Long> firstSeen = new LinkedHashMap<>();
    private final Thread thread;
    private volatile boolean running = true;
    private int listings;
    private IOException lastError;

    ObjectWatcher(BenchS3 s3, String bucket, String prefix) {
        this.s3 = s3;
        this.bucket = bucket;
        this.prefix = prefix;
        thread = new Thread(this::loop, "bench-object-watcher");
        thread.setDaemon(true);
    }

    @Override
    public void start() {
        thread.start();
    }

    @Override
    public void stop() throws InterruptedException, IOException {
        running = false;
        thread.join();
        poll(); // the final commit's objects
        if (lastError != null) {
            System.err.println("object watcher: a listing failed (" + lastError.getMessage()
                    + "); some objects may be timed late");
        }
    }

    @Override
    public synchronized Map<String, Long> events() {
        return new LinkedHashMap<>(firstSeen);
    }

    synchronized int listings() {
        return listings;
    }

    private void loop() {
        while (running) {
            try {
                poll();
            } catch (IOException e) {
                lastError = e;
            }
            try {
                Thread.sleep(POLL_MS);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    private void poll() throws IOException {
        String root = prefix + "/";
        java.util.List<BenchS3.ObjectInfo> objects = s3.list(bucket, root + "part-");
        long now = System.currentTimeMillis();
        synchronized (this) {
            listings++;
            for (BenchS3.ObjectInfo o : objects) {
                firstSeen.putIfAbsent(o.key.substring(root.length()), now);
            }
        }
    }
}
