package io.twopc.flink.bench;

import java.io.IOException;
import java.util.Map;

/**
 * Notes when each output file or object of a run became visible to a reader (for the commit
 * latency): {@link OutputWatcher} for a directory, {@link ObjectWatcher} for a bucket.
 */
interface Watcher {
    void start();

    /** Stops watching, after a last look for the final commit's output. */
    void stop() throws InterruptedException, IOException;

    /** Name (relative to the output's root) to the wall-clock millisecond it was first seen. */
    Map<String, Long> events();
}
