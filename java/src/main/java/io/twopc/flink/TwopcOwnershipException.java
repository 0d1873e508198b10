package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/**
 * Fatal: another live run, or another sink of this job, owns this sink id on the destination. Two
 * writers with one sink id would abort each other's transactions. The message names both runs and
 * the fix: another sink id, or another destination. (An earlier attempt of the same run that is
 * still shutting down is reported as a retryable {@link TwopcException} instead.)
 */
@PublicEvolving
public class TwopcOwnershipException extends TwopcException {
    private static final long serialVersionUID = 1L;

    public TwopcOwnershipException(String message) {
        super(message);
    }

    @Override
    public boolean isFatal() {
        return true;
    }
}
