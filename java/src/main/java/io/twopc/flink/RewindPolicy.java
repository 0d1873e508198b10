package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/**
 * What the sink does when a job is restored from a checkpoint or savepoint that is older than
 * output this sink has already committed (for example an old savepoint restored after the job
 * ran on past it). Replaying from there would write that output a second time.
 */
@PublicEvolving
public enum RewindPolicy {
    /**
     * Stop the job with a {@link TwopcRewindException} that names the output committed after the
     * restored checkpoint; an operator decides. The safe default.
     */
    FAIL,
    /**
     * Remove this sink's output committed after the restored checkpoint, then run: the replay
     * writes that range again, so the destination ends up with every record exactly once.
     * Readers may briefly see the range missing while it is rewritten.
     */
    REPLACE_RANGE
}
