package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/** Fatal: a commit kept an unknown outcome after every retry. */
@PublicEvolving
public class TwopcUnresolvedCommitException extends TwopcException {
    private static final long serialVersionUID = 1L;

    public TwopcUnresolvedCommitException(String message) {
        super(message);
    }

    @Override
    public boolean isFatal() {
        return true;
    }
}
