package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/** Fatal: the sink's configuration cannot work; the message says what to change. */
@PublicEvolving
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
