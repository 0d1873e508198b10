package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/** Fatal: a prepared transaction of a completed checkpoint is gone from the destination: its output is lost. The message names the transaction and the recovery plan. */
@PublicEvolving
public class TwopcLostTransactionException extends TwopcException {
    private static final long serialVersionUID = 1L;

    public TwopcLostTransactionException(String message) {
        super(message);
    }

    @Override
    public boolean isFatal() {
        return true;
    }
}
