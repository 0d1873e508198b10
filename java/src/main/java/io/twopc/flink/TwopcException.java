package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/**
 * An error of the twopc sink. Messages come from the Rust core and name the
 * sink, subtask, checkpoint and transaction concerned and what to do.
 *
 * <p>A retryable error fails the task and Flink restarts the job from its last
 * completed checkpoint. A fatal one ({@link #isFatal()}) means a restart cannot
 * help (output was lost, a rewind was detected, state is corrupt): the sink
 * stops the job without a restart loop.
 */
@PublicEvolving
public class TwopcException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public TwopcException(String message) {
        super(message);
    }

    public TwopcException(String message, Throwable cause) {
        super(message, cause);
    }

    /** True when restarting the job would not resolve the error. */
    public boolean isFatal() {
        return false;
    }
}
