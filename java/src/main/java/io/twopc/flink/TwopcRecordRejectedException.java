package io.twopc.flink;

/**
 * Fatal: the destination can never accept one record (a data error). A restart would replay the
 * same record and fail the same way, so the job stops once. The message names the sink, subtask,
 * transaction, the record's position in it, the column when known, the destination's reason and
 * the first bytes of the record (password-like values masked), and says to filter or fix such
 * records before the sink.
 */
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
