package io.twopc.flink.bench;

import java.io.IOException;
import java.nio.file.FileSystems;
import java.nio.file.Path;
import java.nio.file.StandardWatchEventKinds;
import java.nio.file.WatchEvent;
import java.nio.file.WatchKey;
import java.nio.file.WatchService;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * Notes when each visible file appears in an output directory (inotify, through Java's watch
 * service): names starting with {@code .} or {@code _} are hidden (in-progress and staging files)
 * and ignored. A rename into the directory counts as the file appearing.
 */
final class OutputWatcher implements Watcher {
    private final WatchService service;
    private final Map<String, Long> firstSeen = new LinkedHashMap<>();
    private final Thread thread;
    private volatile boolean running = true;
    private int overflows;

    OutputWatcher(Path dir) throws IOException {
        service = FileSystems.getDefault().newWatchService();
        dir.register(service, StandardWatchEventKinds.ENTRY_CREATE);
        thread = new Thread(this::loop, "bench-output-watcher");
        thread.setDaemon(true);
    }

    @Override
    public void start() {
        thread.start();
    }

    @Override
    public void stop() throws InterruptedException, IOException {
        Thread.sleep(200); // events of the last commit
        running = false;
        thread.join();
        service.close();
        if (overflows > 0) {
            System.err.println("output watcher: " + overflows + " overflow events; some files were not timed");
        }
    }

    @Override
    public synchronized Map<String, Long> events() {
        return new LinkedHashMap<>(firstSeen);
    }

    private void loop() {
        while (running) {
            WatchKey key;
            try {
                key = service.poll(50, TimeUnit.MILLISECONDS);
            } catch (InterruptedException | java.nio.file.ClosedWatchServiceException e) {
                return;
            }
            if (key == null) {
                continue;
            }
            long now = System.currentTimeMillis();
            for (WatchEvent<?> event : key.pollEvents()) {
                if (event.kind() == StandardWatchEventKinds.OVERFLOW) {
                    overflows++;
                    continue;
                }
                String name = event.context().toString();
                if (name.startsWith(".") || name.startsWith("_")) {
                    continue;
                }
                synchronized (this) {
                    firstSeen.putIfAbsent(name, now);
                }
            }
            key.reset();
        }
    }
}
