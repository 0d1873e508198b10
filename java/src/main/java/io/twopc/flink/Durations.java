package io.twopc.flink;

import org.apache.flink.annotation.Internal;

/** Durations in messages as people write them: {@code 7d}, {@code 10s}, {@code 250ms}. */
@Internal
public final class Durations {
    private Durations() {}

    /** {@code ms} in the largest unit that divides it (d, h, min, s), else ms. */
    public static String format(long ms) {
        if (ms <= 0 || ms == Long.MAX_VALUE) {
            return ms + "ms";
        }
        long[] units = {86_400_000L, 3_600_000L, 60_000L, 1_000L};
        String[] names = {"d", "h", "min", "s"};
        for (int i = 0; i < units.length; i++) {
            if (ms % units[i] == 0) {
                return (ms / units[i]) + names[i];
            }
        }
        return ms + "ms";
    }
}
