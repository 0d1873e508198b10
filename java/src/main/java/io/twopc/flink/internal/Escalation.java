package io.twopc.flink.internal;

import io.twopc.flink.TwopcException;

import org.apache.flink.annotation.Internal;
import org.apache.flink.runtime.execution.SuppressRestartsException;

import org.slf4j.Logger;

/**
 * Which failures stop a job for good. Errors the core calls fatal (a lost transaction, a rewind,
 * unreadable state, impossible configuration, a record that can never be written, another owner)
 * are wrapped in Flink's {@link SuppressRestartsException}, which Flink honours anywhere in the
 * cause chain: no restart loop hides them, and the core's message (which names the transaction and
 * the way out) is on the cause. Retryable ones are rethrown as they are, and Flink restarts from
 * the last completed checkpoint.
 */
@Internal
public final class Escalation {
    private Escalation() {}

    public static RuntimeException escalate(Logger log, String scope, TwopcException error, String activity) {
        if (error.isFatal()) {
            log.error("{}: {} failed with an error a restart cannot fix; stopping the job without "
                    + "restarting: {}", scope, activity, error.getMessage());
            return new SuppressRestartsException(error);
        }
        log.warn("{}: {} failed; Flink restarts from the last completed checkpoint: {}", scope, activity,
                error.getMessage());
        return error;
    }
}
