package io.twopc.flink.bench;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;

/** Figures read from /proc. */
final class Proc {
    private Proc() {}

    /** A field of /proc/self/status in kB (VmRSS, VmHWM, ...), or -1. */
    static long statusKb(String field) {
        try {
            for (String line : Files.readAllLines(Paths.get("/proc/self/status"), StandardCharsets.US_ASCII)) {
                if (line.startsWith(field + ":")) {
                    String v = line.substring(field.length() + 1).trim();
                    return Long.parseLong(v.split("\\s+")[0]);
                }
            }
        } catch (IOException | RuntimeException e) {
            return -1;
        }
        return -1;
    }

    /** The 1, 5 and 15 minute load averages. */
    static List<Double> loadAverage() {
        List<Double> out = new ArrayList<>();
        try {
            String[] f = new String(Files.readAllBytes(Paths.get("/proc/loadavg")), StandardCharsets.US_ASCII)
                    .trim().split("\\s+");
            for (int i = 0; i < 3; i++) {
                out.add(Double.parseDouble(f[i]));
            }
        } catch (IOException | RuntimeException e) {
            // not Linux: no figures
        }
        return out;
    }
}
