package io.twopc.flink.internal;

import io.twopc.flink.TwopcRecordRejectedException;

import org.apache.flink.annotation.Internal;

import java.util.Locale;

/** The check the sink's own row encoders make before a Java string becomes UTF-8. */
@Internal
public final class Surrogates {
    private Surrogates() {}

    /**
     * Checks that the surrogate at {@code i} of {@code text} is the first half of a pair and
     * returns the index of the pair's second half. An unpaired surrogate is refused: UTF-8 has no
     * encoding for it, and {@link String#getBytes} would write a {@code ?} in its place without
     * any error.
     */
    public static int checkPair(String text, int i, String what) {
        if (Character.isHighSurrogate(text.charAt(i)) && i + 1 < text.length()
                && Character.isLowSurrogate(text.charAt(i + 1))) {
            return i + 1;
        }
        throw new TwopcRecordRejectedException(what + " holds an unpaired UTF-16 surrogate (U+"
                + Integer.toHexString(text.charAt(i)).toUpperCase(Locale.ROOT) + " at character " + i
                + "), which UTF-8 cannot encode: written, it would become a '?' without any error. Repair or "
                + "drop the value before the sink");
    }
}
