package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/** Fatal: the restored checkpoint is older than output this sink already committed. */
@PublicEvolving
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
