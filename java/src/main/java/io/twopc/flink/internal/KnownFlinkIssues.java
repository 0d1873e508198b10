package io.twopc.flink.internal;

import org.apache.flink.annotation.Internal;
import org.apache.flink.runtime.util.EnvironmentInformation;

import org.slf4j.Logger;

import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Flink releases whose Sink V2 committer can break the sink's rules, checked where the sink runs.
 *
 * <p>In Flink 1.20.0, 1.20.1 and 2.0.0, once a committer operator has seen the end of its input,
 * the notification of any completed checkpoint commits every committable it holds, including
 * those of the final checkpoint, which may not have completed yet (Flink's CommitterOperator
 * commits "up to the end of input" instead of up to the completed checkpoint; fixed in 1.20.2 and
 * 2.0.1, checked in their bytecode). If that final checkpoint then fails and the job restores an
 * earlier one, output after it is already visible: the sink's rewind check stops the restore
 * (policy FAIL) or replaces the range (REPLACE_RANGE), so nothing is written twice silently, but
 * the stop is an operator's work. The committer cannot tell from its commit requests which
 * checkpoint completed, so the sink warns instead.
 */
@Internal
public final class KnownFlinkIssues {
    private static final AtomicBoolean WARNED = new AtomicBoolean();
    private static final Pattern VERSION = Pattern.compile("(\\d{1,9})\\.(\\d{1,9})\\.(\\d{1,9})(?!\\d)");

    private KnownFlinkIssues() {}

    /**
     * Whether Flink {@code version} commits the final checkpoint's committables early. A version
     * that does not read as three numbers of at most nine digits (a vendor's build number) is
     * taken for unaffected: this only decides a warning, and must never fail the committer.
     */
    static boolean commitsAfterEndOfInputEarly(String version) {
        Matcher m = VERSION.matcher(version == null ? "" : version);
        if (!m.lookingAt()) {
            return false;
        }
        int major = Integer.parseInt(m.group(1));
        int minor = Integer.parseInt(m.group(2));
        int patch = Integer.parseInt(m.group(3));
        return (major == 1 && minor == 20 && patch <= 1) || (major == 2 && minor == 0 && patch == 0);
    }

    /** Logs, once per JVM, a warning when the running Flink is one of the affected releases. */
    public static void warnIfAffected(Logger log) {
        String version = EnvironmentInformation.getVersion();
        if (commitsAfterEndOfInputEarly(version) && WARNED.compareAndSet(false, true)) {
            log.warn("twopc: Flink {} commits a Sink V2 sink's last transactions after the end of input when "
                    + "an earlier checkpoint's completion is notified, before the final checkpoint completed. "
                    + "Should that checkpoint fail and the job restore an earlier one, the sink's rewind check "
                    + "stops the job (or, under REPLACE_RANGE, replaces the range) instead of the usual restart. "
                    + "Nothing is written twice, but upgrade to Flink 1.20.2 or 2.0.1 or later, where this is "
                    + "fixed", version);
        }
    }
}
