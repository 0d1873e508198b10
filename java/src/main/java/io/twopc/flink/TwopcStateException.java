package io.twopc.flink;

/** Fatal: checkpoint state (a transaction handle) could not be read: truncated, corrupted, foreign or from a newer release. */
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
