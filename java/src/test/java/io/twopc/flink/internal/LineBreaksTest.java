package io.twopc.flink.internal;

import static org.assertj.core.api.Assertions.assertThat;

import java.util.Arrays;
import java.util.Random;
import org.junit.Test;

public class LineBreaksTest {
    private static boolean slow(byte[] bytes) {
        for (byte b : bytes) {
            if (b == '\n') {
                return true;
            }
        }
        return false;
    }

    @Test
    public void aNewlineIsFoundAtEveryPositionOfEveryLength() {
        for (int len = 0; len <= 40; len++) {
            byte[] clean = new byte[len];
            Arrays.fill(clean, (byte) 'a');
            assertThat(LineBreaks.containsNewline(clean)).as("no newline in %d bytes", len).isFalse();
            for (int at = 0; at < len; at++) {
                byte[] b = clean.clone();
                b[at] = '\n';
                assertThat(LineBreaks.containsNewline(b)).as("newline at %d of %d", at, len).isTrue();
            }
        }
    }

    @Test
    public void bytesNextToANewlineInValueAreNotMistakenForOne() {
        // 0x0B and 0x09 differ from '\n' (0x0A) in one bit; 0x8A in the top bit; a borrow from a
        // zero byte must not make its neighbour look like a match.
        byte[][] cases = {
            {0x0B, 0x0B, 0x0B, 0x0B, 0x0B, 0x0B, 0x0B, 0x0B},
            {0x09, 0x09, 0x09, 0x09, 0x09, 0x09, 0x09, 0x09},
            {(byte) 0x8A, (byte) 0x8A, (byte) 0x8A, (byte) 0x8A, (byte) 0x8A, (byte) 0x8A, (byte) 0x8A, (byte) 0x8A},
            {0x0A - 1, 0x0A + 1, 0, 0, (byte) 0xFF, (byte) 0x80, 0x7F, 0x0B},
        };
        for (byte[] c : cases) {
            assertThat(LineBreaks.containsNewline(c)).as(Arrays.toString(c)).isEqualTo(slow(c));
        }
    }

    @Test
    public void agreesWithAByteLoopOnRandomBytes() {
        Random random = new Random(42);
        for (int n = 0; n < 20_000; n++) {
            byte[] b = new byte[random.nextInt(64)];
            random.nextBytes(b);
            assertThat(LineBreaks.containsNewline(b)).as(Arrays.toString(b)).isEqualTo(slow(b));
        }
    }
}
