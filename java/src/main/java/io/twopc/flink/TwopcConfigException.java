package io.twopc.flink;

/** Fatal: the sink's configuration cannot work; the message says what to change. */
public class TwopcConfigException extends TwopcException {
    private static final long serialVersionUID = 1L;

    public TwopcConfigException(String message) {
        super(message);
    }

    @Override
    public boolean isFatal() {
        return true;
    }
}
