package io.twopc.flink;

/** Fatal: a job started without state found prepared transactions of this sink left by another run. */
public class TwopcFreshStartException extends TwopcException {
    private static final long serialVersionUID = 1L;

    public TwopcFreshStartException(String message) {
        super(message);
    }

    @Override
    public boolean isFatal() {
        return true;
    }
}
