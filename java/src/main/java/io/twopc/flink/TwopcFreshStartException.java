package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/**
 * Fatal: a job started without state found prepared transactions of this sink left by another run,
 * commits of another run that were decided but did not finish, or (unless appending) output of
 * earlier runs.
 */
@PublicEvolving
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
