package io.twopc.flink.internal;

import io.twopc.flink.TwopcException;
import io.twopc.flink.TwopcRecordRejectedException;

import org.apache.flink.annotation.Internal;
import org.apache.flink.runtime.execution.SuppressRestartsException;

import org.slf4j.Logger;

/**
 * Which failures stop a job for good. Errors the core calls fatal (a lost transaction, a rewind,
 * unreadable state, impossible configuration, a record that can never be written, another owner)
 * are wrapped in Flink's {@link SuppressRestartsException}, which Flink honours anywhere in the
 * cause chain: no restart loop hides them, and the core's message (which names the transaction and
 * the way out) is on the cause. Retryable ones are rethrown as they are, and Flink restarts from
 * the last completed checkpoint.
 */
@Internal
public final class Escalation {
    private Escalation() {}

    public static RuntimeException escalate(Logger log, String scope, TwopcException error, String activity) {
        if (error.isFatal()) {
            log.error("{}: {} failed with an error a restart cannot fix; stopping the job without "
                    + "restarting: {}", scope, activity, error.getMessage());
            return new SuppressRestartsException(error);
        }
        log.warn("{}: {} failed; Flink restarts from the last completed checkpoint: {}", scope, activity,
                error.getMessage());
        return error;
    }

    /**
     * State a serializer cannot read (written by a newer release, or damaged): an {@link
     * java.io.IOException}, as the serializer's contract says, whose cause is a {@link
     * SuppressRestartsException} around a {@link io.twopc.flink.TwopcStateException}. Every restart
     * would restore the same bytes, so the job stops once with the message instead of looping.
     */
    public static java.io.IOException unreadableState(String message) {
        return new java.io.IOException(message,
                new SuppressRestartsException(new io.twopc.flink.TwopcStateException(message)));
    }

    /**
     * A record the sink's own serialization schema refused ({@link io.twopc.flink.CsvRowSchema},
     * the SQL connector's rows), said as the subtask's: the schema does not know which subtask it
     * serves. Any other error is returned as it is.
     */
    public static TwopcException refusedBySchema(String scope, TwopcException error) {
        if (!(error instanceof TwopcRecordRejectedException)) {
            return error;
        }
        TwopcRecordRejectedException rejected = new TwopcRecordRejectedException(scope
                + ": the serialization schema refused a record, and would refuse it on every replay: "
                + error.getMessage() + ". Nothing of the open transaction became visible. Filter or fix such "
                + "records before the sink, then restart the job from its latest checkpoint");
        rejected.initCause(error);
        return rejected;
    }

    /** A refusal of the sink's own Java side, said as the subtask's. */
    public static TwopcRecordRejectedException rejected(String scope, TwopcRecordRejectedException error) {
        TwopcRecordRejectedException rejected = new TwopcRecordRejectedException(scope + ": " + error.getMessage());
        rejected.initCause(error);
        return rejected;
    }

    /**
     * The warning for a retryable failure of the last housekeeping after the end of input, which
     * both front ends report without failing the task (after the final checkpoint nothing would try
     * again). It says what is left and who meets it: the housekeeping aborts lingering transactions
     * and finishes commits an earlier attempt decided, so neither "the output is complete" nor
     * "nothing was left" would be true in general.
     *
     * @param cancelled whether the task's thread was interrupted (the native call gave up because
     *     Flink is cancelling the task, and left the flag set)
     */
    public static String unfinishedHousekeeping(String scope, boolean cancelled, String cause) {
        return scope + ": the last housekeeping after the end of input "
                + (cancelled ? "was cut short because the task is being cancelled" : "failed")
                + ". Every transaction this subtask committed is complete, and the task ends normally. What "
                + "the housekeeping had not done yet is left as it was: a lingering transaction stays staged "
                + "and invisible (the retention cleanup removes it, and a later job with this sink id meets it "
                + "at its start, where its fresh-start policy decides); a commit an earlier attempt decided and "
                + "that it was finishing stays decided, its output possibly not visible yet: a later job with "
                + "this sink id stops at its start and names it, and restoring that run's last checkpoint or "
                + "`twopc decide <destination> --sink <id> --commit <transaction>` finishes it. `twopc inspect "
                + "<destination>` lists both. Cause: " + cause;
    }
}
