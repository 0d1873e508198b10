package io.twopc.flink;

/** Fatal: the restored checkpoint is older than output this sink already committed. */
public class TwopcRewindException extends TwopcException {
    private static final long serialVersionUID = 1L;

    public TwopcRewindException(String message) {
        super(message);
    }

    @Override
    public boolean isFatal() {
        return true;
    }
}
