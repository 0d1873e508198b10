package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/**
 * What the sink does when a job starts without restored state and finds, at the destination,
 * either prepared transactions of this sink left by another run (they may belong to a completed
 * checkpoint of an earlier run whose state was lost), or output this sink committed in earlier runs
 * (a new run would write every record again next to it).
 *
 * <p>Commits of another run that were decided (their checkpoint completed) but did not finish stop
 * every fresh start, whatever the policy: they can only be finished, and finishing them would add
 * output behind the start position the job was given. Restore the earlier run's checkpoint, or
 * finish them with {@code twopc decide --commit}, then start again.
 */
@PublicEvolving
public enum FreshStartPolicy {
    /** Stop the job with a {@link TwopcFreshStartException} naming them; an operator decides. */
    FAIL,
    /** Abort prepared leftovers (their output is not wanted); still stop on earlier output. */
    ABORT_PREPARED,
    /** Start a new run next to earlier runs' output (both are wanted); still stop on prepared leftovers. */
    APPEND,
    /** Both {@link #ABORT_PREPARED} and {@link #APPEND}. */
    APPEND_AND_ABORT_PREPARED
}
