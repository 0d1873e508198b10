//! The committer: makes prepared transactions visible when their checkpoint
//! completes, and aborts what must not become visible.
//!
//! Outcomes of a commit:
//!
//! | destination says            | outcome                                  |
//! |-----------------------------|------------------------------------------|
//! | committed now               | `Committed`                              |
//! | committed earlier           | `AlreadyCommitted` (a repeat is success) |
//! | neither staged nor recorded | `TwopcError::Lost` (fatal)               |
//! | call failed                 | unknown: retry by id with backoff, then  |
//! |                             | `TwopcError::CommitUnresolved` (fatal)   |

use crate::clock::Clock;
use crate::config::RetryPolicy;
use crate::destination::{AbortStatus, CommitStatus, Destination};
use crate::error::{
    DestinationError, DestinationErrorKind, LostTransaction, SinkScope, TwopcError,
    UnresolvedCommit,
};
use crate::handle::TransactionHandle;
use crate::ids::TransactionId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed,
    AlreadyCommitted,
    /// The transaction held no records; there was nothing to publish.
    Empty,
}

/// What one commit attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitStep {
    Done(CommitOutcome),
    /// The outcome is unknown: try again, by id, after `wait_ms`.
    RetryAfter {
        wait_ms: u64,
        error: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortOutcome {
    Aborted,
    NothingStaged,
}

#[derive(Debug)]
pub struct Committer {
    scope: SinkScope,
    retry: RetryPolicy,
}

impl Committer {
    pub fn new(scope: SinkScope, retry: RetryPolicy) -> Self {
        Committer { scope, retry }
    }

    /// Commits a prepared transaction, retrying an unknown outcome by id
    /// with bounded back-off (the driver of [`Committer::commit_attempt`]).
    /// Used both when a checkpoint completes and when recovery re-commits a
    /// restored one: the two are the same operation because a commit must
    /// be repeatable.
    pub fn commit<D: Destination, C: Clock>(
        &self,
        dest: &mut D,
        clock: &C,
        handle: &TransactionHandle,
    ) -> Result<CommitOutcome, TwopcError> {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match self.commit_attempt(dest, clock.now_ms(), handle, attempt)? {
                CommitStep::Done(outcome) => return Ok(outcome),
                CommitStep::RetryAfter { wait_ms, error } => {
                    if !Self::back_off(clock, wait_ms) {
                        return Err(self.given_up(handle, &error));
                    }
                }
            }
        }
    }

    /// One attempt of a commit. It never waits: an unknown outcome comes
    /// back as [`CommitStep::RetryAfter`], and the caller waits and calls
    /// again with the next attempt number; once `attempt` reaches the retry
    /// policy's maximum the unknown outcome is `CommitUnresolved` (fatal).
    pub fn commit_attempt<D: Destination>(
        &self,
        dest: &mut D,
        now_ms: u64,
        handle: &TransactionHandle,
        attempt: u32,
    ) -> Result<CommitStep, TwopcError> {
        self.check_ours(handle)?;
        let Some(prepared) = handle.prepared() else {
            return Err(self.misuse(format!(
                "transaction {} was never prepared and cannot be committed",
                handle.transaction
            )));
        };
        if prepared.records == 0 {
            // Nothing was staged; release whatever a destination may hold
            // for the id. A failed release is reported, not swallowed: a
            // job that finishes right after would otherwise leave the empty
            // transaction staged for good (no later start scans for it as
            // lingering). The error fails the attempt and recovery repeats
            // this commit, which is idempotent (found by the simulation).
            dest.abort(&handle.transaction)
                .map_err(|source| TwopcError::Destination {
                    scope: self.scope.clone(),
                    action: "releasing empty",
                    transaction: handle.transaction.clone(),
                    consequence: "It holds no records, so nothing is lost; the job restarts and \
                         recovery releases it again.",
                    source,
                })?;
            return Ok(CommitStep::Done(CommitOutcome::Empty));
        }
        match dest.commit(handle, now_ms) {
            Ok(CommitStatus::Committed) => {
                log::debug!(
                    "{}: committed transaction {} (checkpoint {})",
                    self.scope,
                    handle.transaction,
                    prepared.checkpoint
                );
                Ok(CommitStep::Done(CommitOutcome::Committed))
            }
            Ok(CommitStatus::AlreadyCommitted) => {
                log::info!(
                    "{}: transaction {} (checkpoint {}) was already committed; nothing to do",
                    self.scope,
                    handle.transaction,
                    prepared.checkpoint
                );
                Ok(CommitStep::Done(CommitOutcome::AlreadyCommitted))
            }
            Ok(CommitStatus::Refused { reason }) => {
                let err = TwopcError::Config(crate::error::ConfigError::new(format!(
                    "{}: cannot commit transaction {} (checkpoint {}, {} records) as this sink \
                     is configured now: {reason}",
                    self.scope, handle.transaction, prepared.checkpoint, prepared.records
                )));
                log::error!("{err}");
                Err(err)
            }
            Ok(CommitStatus::Missing { evidence }) => {
                let note = crate::destination::LostNote {
                    transaction: handle.transaction.clone(),
                    lineage: handle.lineage,
                    checkpoint: prepared.checkpoint,
                    subtask: handle.subtask,
                    run: handle.run.clone(),
                    records: prepared.records,
                    found_at_ms: now_ms,
                    evidence: evidence.clone(),
                };
                if let Err(e) = dest.record_lost(&note) {
                    log::warn!(
                        "{}: could not keep a note that transaction {} is lost ({e}); \
                         `twopc inspect` will not show it",
                        self.scope,
                        handle.transaction
                    );
                }
                let err = TwopcError::Lost(Box::new(LostTransaction {
                    scope: self.scope.clone(),
                    transaction: handle.transaction.clone(),
                    checkpoint: prepared.checkpoint,
                    lineage: handle.lineage,
                    records: prepared.records,
                    evidence,
                }));
                log::error!("{err}");
                Err(err)
            }
            // Checked before the retry budget: a commit given up because
            // the task is being cancelled is not unresolved, and must not
            // stop the job.
            Err(e) if crate::interrupt::requested() => Err(self.given_up(handle, &e)),
            // Refused for certain (rights, a read-only file system, another
            // role's prepared transaction): the outcome is known, nothing
            // was committed, and no retry gets past it. Stopped at once,
            // fatally, saying so, instead of being retried and then
            // reported as an unknown outcome.
            Err(e) if e.kind == DestinationErrorKind::NotPermitted => {
                let err = TwopcError::Destination {
                    scope: self.scope.clone(),
                    action: "committing",
                    transaction: handle.transaction.clone(),
                    consequence: "The destination refused a step of the commit, and retries \
                         and restarts would be refused the same way. The transaction stays in the \
                         completed checkpoint's state (its output may be visible already, if the \
                         refusal came after its publication): fix what the error names, then \
                         restart the job from its latest checkpoint, whose recovery finishes the \
                         commit by id.",
                    source: e,
                };
                log::error!("{err}");
                Err(err)
            }
            Err(e) if attempt >= self.retry.max_attempts => {
                let err = TwopcError::CommitUnresolved(Box::new(UnresolvedCommit {
                    scope: self.scope.clone(),
                    transaction: handle.transaction.clone(),
                    checkpoint: prepared.checkpoint,
                    lineage: handle.lineage,
                    attempts: attempt,
                    last_error: e.to_string(),
                }));
                log::error!("{err}");
                Err(err)
            }
            Err(e) => {
                let wait_ms = self.retry.backoff_ms(attempt);
                log::warn!(
                    "{}: commit of transaction {} (checkpoint {}) attempt {attempt}/{} has an \
                     unknown outcome ({e}); retrying by id in {}",
                    self.scope,
                    handle.transaction,
                    prepared.checkpoint,
                    self.retry.max_attempts,
                    crate::timefmt::exact(wait_ms)
                );
                Ok(CommitStep::RetryAfter {
                    wait_ms,
                    error: e.to_string(),
                })
            }
        }
    }

    /// The error of a commit given up because the caller asked for it (see
    /// [`crate::interrupt`]): never fatal, so the restart's recovery
    /// commits the transaction again by id. `last_error` is the last
    /// attempt's error.
    pub fn given_up(
        &self,
        handle: &TransactionHandle,
        last_error: &dyn std::fmt::Display,
    ) -> TwopcError {
        TwopcError::Destination {
            scope: self.scope.clone(),
            action: "committing",
            transaction: handle.transaction.clone(),
            consequence: "The commit was given up because the task is being cancelled; its \
                          transaction stays in the completed checkpoint's state, and the recovery \
                          after the restart commits it again by id.",
            // Io whatever the cause was: a kind such as NotPermitted would
            // make the error fatal, and a cancelled task must not stop the
            // job.
            source: DestinationError::new(
                DestinationErrorKind::Io,
                format!(
                    "{} (last error: {last_error})",
                    crate::interrupt::INTERRUPTED
                ),
            ),
        }
    }

    /// Waits `wait_ms` before the next attempt of a commit, in slices, so
    /// that a caller who gives up the call (see [`crate::interrupt`]) is
    /// heard within a fraction of a second. False if it gave up.
    pub fn back_off<C: Clock + ?Sized>(clock: &C, wait_ms: u64) -> bool {
        const SLICE_MS: u64 = 100;
        let mut left = wait_ms;
        loop {
            if crate::interrupt::requested() {
                return false;
            }
            if left == 0 {
                return true;
            }
            let step = left.min(SLICE_MS);
            clock.sleep_ms(step);
            left -= step;
        }
    }

    /// Aborts a transaction that must never become visible: the open one of
    /// a restored checkpoint, a lingering one, or the current one at close.
    pub fn abort<D: Destination>(
        &self,
        dest: &mut D,
        txn: &TransactionId,
        why: &str,
    ) -> Result<AbortOutcome, TwopcError> {
        match dest.abort(txn) {
            Ok(AbortStatus::Aborted) => {
                log::info!("{}: aborted transaction {txn} ({why})", self.scope);
                Ok(AbortOutcome::Aborted)
            }
            Ok(AbortStatus::NotFound) => Ok(AbortOutcome::NothingStaged),
            Ok(AbortStatus::WasCommitted) => Err(self.misuse(format!(
                "refusing to abort transaction {txn} ({why}): the destination has it committed. \
                 Committed output is never removed by an abort; if this transaction should not \
                 have been committed, `twopc reconcile <destination> --sink {} --lineage \
                 <lineage> --after-checkpoint <N>` removes it",
                self.scope.sink
            ))),
            Err(source) => Err(TwopcError::Destination {
                scope: self.scope.clone(),
                action: "aborting",
                transaction: txn.clone(),
                consequence: "Its staged data stays invisible and will be aborted again on the \
                     next start.",
                source,
            }),
        }
    }

    fn check_ours(&self, handle: &TransactionHandle) -> Result<(), TwopcError> {
        if handle.sink != self.scope.sink {
            return Err(TwopcError::Config(crate::error::ConfigError::new(format!(
                "transaction {} belongs to sink '{}' but this is sink '{}': the sink id changed \
                 between the run that wrote the state and this one. Keep the sink id stable \
                 across restores",
                handle.transaction, handle.sink, self.scope.sink
            ))));
        }
        Ok(())
    }

    fn misuse(&self, message: String) -> TwopcError {
        TwopcError::Protocol {
            scope: self.scope.clone(),
            message,
        }
    }
}
