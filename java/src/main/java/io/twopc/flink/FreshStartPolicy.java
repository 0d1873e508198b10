package io.twopc.flink;

/**
 * What the sink does when a job starts without restored state and finds prepared, uncommitted
 * transactions of this sink left by another run. They may belong to a completed checkpoint of an
 * earlier run whose state was lost, so aborting them could silently drop output.
 */
public enum FreshStartPolicy {
    /** Stop the job with a {@link TwopcFreshStartException} naming them; an operator decides. */
    FAIL,
    /** Abort them: the operator has decided their output is not wanted. */
    ABORT_PREPARED
}
