//! Options of a sink and their validation. Everything is checked when the
//! sink is built, with messages that say what to change.

use crate::destination::HistoryPolicy;
use crate::error::ConfigError;
use crate::ids::{RunId, SinkId};
use crate::timefmt::exact;

/// Which subtask this is, of which sink, in which run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubtaskContext {
    pub sink: SinkId,
    pub run: RunId,
    pub subtask: u32,
    pub parallelism: u32,
    /// Flink's attempt number of this subtask (0 for the first execution;
    /// a failover counts up). Tells an earlier attempt that still holds the
    /// destination from a second live writer.
    pub attempt: u32,
    /// Identifies the sink operator: drawn when the sink was built, the
    /// same in every subtask and attempt of it. Two sinks of one job with
    /// the same sink id differ here.
    pub instance: u64,
}

impl SubtaskContext {
    pub fn new(
        sink: SinkId,
        run: RunId,
        subtask: u32,
        parallelism: u32,
    ) -> Result<Self, ConfigError> {
        if parallelism == 0 || subtask >= parallelism {
            return Err(ConfigError::new(format!(
                "subtask index {subtask} is outside parallelism {parallelism}"
            )));
        }
        Ok(SubtaskContext {
            sink,
            run,
            subtask,
            parallelism,
            attempt: 0,
            instance: 0,
        })
    }

    /// The same context with Flink's attempt number and the sink operator's
    /// instance id (see the fields).
    pub fn with_attempt(mut self, attempt: u32, instance: u64) -> Self {
        self.attempt = attempt;
        self.instance = instance;
        self
    }

    /// This subtask's claim of ownership at the destination.
    pub fn owner_claim(&self) -> crate::destination::OwnerClaim {
        crate::destination::OwnerClaim {
            sink: self.sink.clone(),
            subtask: self.subtask,
            run: self.run.clone(),
            attempt: self.attempt,
            instance: self.instance,
        }
    }

    pub fn scope(&self) -> crate::error::SinkScope {
        crate::error::SinkScope {
            sink: self.sink.clone(),
            subtask: self.subtask,
        }
    }

    /// Which subtask of the current parallelism looks after leftovers of a
    /// subtask index from any earlier parallelism. Current writers use
    /// indexes below the parallelism, which map to themselves, so no two
    /// subtasks ever act on the same transaction.
    pub fn owns(&self, original_subtask: u32) -> bool {
        original_subtask % self.parallelism == self.subtask
    }
}

/// What to do when the restored checkpoint is older than output already
/// committed (a restore from an old savepoint or retained checkpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RewindPolicy {
    /// Stop with an error naming the output that would be duplicated.
    #[default]
    Fail,
    /// Remove this sink's output committed after the restored checkpoint,
    /// then proceed: the re-run replaces that range.
    ReplaceRange,
}

/// What to do when a job starts without state and finds, at the
/// destination, prepared transactions of this sink left by another run, or
/// output committed by earlier runs (other lineages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FreshStartPolicy {
    /// Stop with an error naming them; an operator decides.
    #[default]
    Fail,
    /// Abort prepared leftovers (the operator has decided their output is
    /// not wanted); still stop on committed output of earlier runs.
    AbortPrepared,
    /// Start a new run next to committed output of earlier runs (the
    /// operator wants both); still stop on prepared leftovers.
    Append,
    /// Both of the above.
    AppendAndAbortPrepared,
}

impl FreshStartPolicy {
    pub fn aborts_prepared(self) -> bool {
        matches!(
            self,
            FreshStartPolicy::AbortPrepared | FreshStartPolicy::AppendAndAbortPrepared
        )
    }

    pub fn appends(self) -> bool {
        matches!(
            self,
            FreshStartPolicy::Append | FreshStartPolicy::AppendAndAbortPrepared
        )
    }
}

/// Bounded retries of a commit whose outcome is unknown.
///
/// The default rides out a destination's failover or a network outage of
/// about a minute (20 attempts, 100 ms doubling to 5 s: 71 s of back-off,
/// plus each attempt's own time) before the job stops as unresolved: with
/// 5 attempts the budget was 1.5 s, and a database's routine failover
/// stopped the job for good (found by review).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 20,
            initial_backoff_ms: 100,
            max_backoff_ms: 5_000,
        }
    }
}

impl RetryPolicy {
    /// The wait before retry `attempt` (1-based): the initial back-off,
    /// doubled per attempt, at most the maximum. Saturating: a large
    /// configured initial back-off must never wrap round to a short wait
    /// (found by review).
    pub fn backoff_ms(&self, attempt: u32) -> u64 {
        let shift = attempt.saturating_sub(1).min(20);
        self.initial_backoff_ms
            .saturating_mul(1u64 << shift)
            .min(self.max_backoff_ms)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkOptions {
    /// How long staged transactions are kept before cleanup removes them:
    /// the destination's transaction timeout.
    pub retention_ms: u64,
    pub rewind: RewindPolicy,
    pub fresh_start: FreshStartPolicy,
    pub commit_retry: RetryPolicy,
    /// How often, at most, a subtask scans for expired staged transactions.
    pub expiry_scan_interval_ms: u64,
    /// How long a start waits for an earlier attempt of the same run to
    /// release this subtask's share of the destination (it is still shutting
    /// down) before it gives up and lets Flink restart it.
    pub owner_wait_ms: u64,
    /// How long a subtask restored without a share of the sink's state
    /// (after the parallelism grew) waits for another subtask to record the
    /// run's lineage at the destination.
    pub lineage_wait_ms: u64,
    /// How the commit history is kept bounded (see [`HistoryPolicy`]).
    pub history: HistoryPolicy,
}

impl Default for SinkOptions {
    fn default() -> Self {
        SinkOptions {
            retention_ms: 7 * 24 * 3600 * 1000,
            rewind: RewindPolicy::Fail,
            fresh_start: FreshStartPolicy::Fail,
            commit_retry: RetryPolicy::default(),
            expiry_scan_interval_ms: 60_000,
            owner_wait_ms: 10_000,
            lineage_wait_ms: 120_000,
            history: HistoryPolicy::default(),
        }
    }
}

/// Checks that staged transactions outlive a normal restart. A prepared
/// transaction waits up to one checkpoint interval for its checkpoint to
/// complete, then, if the job fails just then, for the restart before
/// recovery commits it. If retention were shorter, cleanup would remove the
/// transaction first and a routine restart would end in data loss.
pub fn validate_retention(
    retention_ms: u64,
    checkpoint_interval_ms: u64,
    restart_allowance_ms: u64,
) -> Result<(), ConfigError> {
    if checkpoint_interval_ms == 0 {
        return Err(ConfigError::new(
            "checkpointing is disabled (interval 0): twopc commits only when a checkpoint completes, \
             so nothing would ever be committed. Enable checkpointing with \
             env.enableCheckpointing(interval)",
        ));
    }
    let needed = checkpoint_interval_ms
        .saturating_mul(2)
        .saturating_add(restart_allowance_ms);
    if retention_ms < needed {
        return Err(ConfigError::new(format!(
            "staged-transaction retention of {} is shorter than two checkpoint intervals ({} \
             each) plus the restart allowance of {} = {}: a normal restart would find its \
             prepared transactions expired and stop with data loss. Raise the retention to at \
             least {}, or checkpoint more often",
            exact(retention_ms),
            exact(checkpoint_interval_ms),
            exact(restart_allowance_ms),
            exact(needed),
            exact(needed)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_shorter_than_a_restart_is_rejected() {
        let err = validate_retention(10_000, 10_000, 60_000).unwrap_err();
        assert!(err.message().contains("at least 80s"), "{err}");
        validate_retention(80_000, 10_000, 60_000).unwrap();
        assert!(validate_retention(1_000_000, 0, 0).is_err());
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_backoff_ms: 100,
            max_backoff_ms: 1_000,
        };
        assert_eq!(p.backoff_ms(1), 100);
        assert_eq!(p.backoff_ms(2), 200);
        assert_eq!(p.backoff_ms(4), 800);
        assert_eq!(p.backoff_ms(5), 1_000);
        assert_eq!(p.backoff_ms(99), 1_000);
        // A large initial back-off saturates instead of wrapping round.
        let huge = RetryPolicy {
            max_attempts: 30,
            initial_backoff_ms: u64::MAX / 4,
            max_backoff_ms: u64::MAX,
        };
        for attempt in 1..30 {
            assert!(huge.backoff_ms(attempt) >= u64::MAX / 4, "{attempt}");
        }
    }

    #[test]
    fn ownership_partitions_old_subtasks() {
        let ctx = |i| {
            SubtaskContext::new(SinkId::new("s").unwrap(), RunId::new("r").unwrap(), i, 2).unwrap()
        };
        for old in 0..8u32 {
            let owners = (0..2).filter(|&i| ctx(i).owns(old)).count();
            assert_eq!(owners, 1);
        }
        assert!(
            SubtaskContext::new(SinkId::new("s").unwrap(), RunId::new("r").unwrap(), 2, 2).is_err()
        );
    }
}
