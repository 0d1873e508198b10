package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/**
 * Fatal: the destination can never accept a record (for PostgreSQL: not exactly one COPY row, not
 * UTF-8, a NUL byte, the wrong number of fields, or a value the server refuses: type syntax, range,
 * length, a constraint). A restart would replay the same record and fail the same way, so the job
 * stops once instead of restarting in a loop. The message names the sink, subtask, transaction,
 * the checkpoint (when found at prepare), the record's position in the transaction, the column,
 * the destination's own words and the record's first bytes (password-like values masked); filter
 * or fix such records before the sink.
 */
@PublicEvolving
public class TwopcRecordRejectedException extends TwopcException {
    private static final long serialVersionUID = 1L;

    public TwopcRecordRejectedException(String message) {
        super(message);
    }

    @Override
    public boolean isFatal() {
        return true;
    }
}
