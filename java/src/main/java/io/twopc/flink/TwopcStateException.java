package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/** Fatal: checkpoint state (a transaction handle) could not be read: truncated, corrupted, foreign or from a newer release. */
@PublicEvolving
public class TwopcStateException extends TwopcException {
    private static final long serialVersionUID = 1L;

    public TwopcStateException(String message) {
        super(message);
    }

    @Override
    public boolean isFatal() {
        return true;
    }
}
