//! The committer side of one subtask, as Flink's Sink V2 committer needs
//! it: it commits any prepared handle of this sink (its own writer's, or one
//! restored from the committer's state, whoever prepared it), and runs the
//! housekeeping that an explicit "checkpoint N completed" event triggers.
//! It needs no writer of its own.
//!
//! Housekeeping is not on the critical path. The lingering cleanup after a
//! restore (once every subtask finished its recovery, which a checkpoint
//! completing after the restore proves) and the retention scan run when a
//! checkpoint completes; when they fail, the failure is reported in the
//! [`Housekeeping`] result (for a log line and a metric) and tried again at
//! the next checkpoint. Only the outcome of a commit (a lost transaction, a
//! commit whose outcome stays unknown) is an error.

use std::collections::{BTreeMap, HashSet};

use crate::clock::Clock;
use crate::committer::{CommitOutcome, CommitStep, Committer};
use crate::config::{SinkOptions, SubtaskContext};
use crate::destination::{Compaction, Destination, OwnerClaim};
use crate::error::{SinkScope, TwopcError};
use crate::handle::TransactionHandle;
use crate::ids::{CheckpointId, TransactionId};
use crate::recovery::{self, Expiry, Keep};

/// What one round of housekeeping did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Housekeeping {
    /// Lingering transactions aborted.
    pub aborted: Vec<TransactionId>,
    /// Staged transactions removed by retention cleanup.
    pub expired: Vec<TransactionId>,
    /// What failed, to be logged and counted; tried again next time. A
    /// share that a cleanup left alone because another attempt or run
    /// holds it at the destination is one too.
    pub failures: Vec<String>,
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitterStats {
    pub committed: u64,
    pub already_committed: u64,
    pub empty: u64,
    pub lingering_aborted: u64,
    pub expired: u64,
    pub housekeeping_failures: u64,
    pub last_committed_checkpoint: Option<CheckpointId>,
    /// Commit records folded into history segments by this committer.
    pub history_folded: u64,
}

pub struct CommitterSession {
    ctx: SubtaskContext,
    options: SinkOptions,
    committer: Committer,
    /// The checkpoint the job restored, if it did.
    restored: Option<CheckpointId>,
    /// After a restore: lingering transactions are aborted once a checkpoint
    /// after the restored one completes.
    cleanup_due: bool,
    /// A checkpoint after the restored one (or any, after a fresh start)
    /// completed: every subtask finished its recovery.
    recovered: bool,
    /// The writers of this attempt: original subtask → attempt nonce.
    writers: BTreeMap<u32, u64>,
    /// Handles received or restored and not yet committed.
    protected: HashSet<TransactionId>,
    last_expiry_scan_ms: u64,
    /// Commits since the last compaction of the history; `None` until the
    /// first one, which runs at the first completed checkpoint (a job that
    /// restarts often still keeps its history bounded).
    commits_since_compaction: Option<u64>,
    stats: CommitterStats,
}

impl CommitterSession {
    /// A committer for `ctx`'s subtask; `restored` is the checkpoint the job
    /// restored, if any. Does no I/O.
    pub fn new(ctx: SubtaskContext, options: SinkOptions, restored: Option<CheckpointId>) -> Self {
        CommitterSession {
            committer: Committer::new(ctx.scope(), options.commit_retry),
            ctx,
            options,
            restored,
            cleanup_due: restored.is_some(),
            recovered: restored.is_none(),
            writers: BTreeMap::new(),
            protected: HashSet::new(),
            last_expiry_scan_ms: 0,
            commits_since_compaction: None,
            stats: CommitterStats::default(),
        }
    }

    pub fn scope(&self) -> SinkScope {
        self.ctx.scope()
    }

    pub fn stats(&self) -> CommitterStats {
        self.stats
    }

    /// True until the first checkpoint after a restore completed.
    pub fn cleanup_due(&self) -> bool {
        self.cleanup_due
    }

    /// Tells the committer which attempt a writer of this attempt runs, so
    /// that housekeeping never touches that writer's transactions.
    pub fn note_writer(&mut self, subtask: u32, attempt_nonce: u64) {
        self.writers.insert(subtask, attempt_nonce);
    }

    /// A handle this committer will commit (received or restored): never
    /// aborted or expired by housekeeping meanwhile. A handle prepared
    /// after the restore also names the current attempt of its writer.
    pub fn protect(&mut self, handle: &TransactionHandle) {
        self.protected.insert(handle.transaction.clone());
        if handle.checkpoint() > self.restored {
            self.note_writer(handle.subtask, handle.attempt_nonce());
        }
    }

    /// Forgets a handle (its writer aborted it).
    pub fn release(&mut self, txn: &TransactionId) {
        self.protected.remove(txn);
    }

    /// Commits a prepared handle of this sink, retrying an unknown outcome
    /// with back-off within the retry policy (see [`Committer::commit`]).
    pub fn commit<D: Destination, C: Clock>(
        &mut self,
        dest: &mut D,
        clock: &C,
        handle: &TransactionHandle,
    ) -> Result<CommitOutcome, TwopcError> {
        let mut attempt = 1;
        loop {
            match self.commit_attempt(dest, clock, handle, attempt)? {
                CommitStep::Done(outcome) => return Ok(outcome),
                CommitStep::RetryAfter { wait_ms, error } => {
                    if !Committer::back_off(clock, wait_ms) {
                        return Err(self.committer.given_up(handle, &error));
                    }
                    attempt += 1;
                }
            }
        }
    }

    /// One attempt of a commit (see [`Committer::commit_attempt`]), for a
    /// committer that retries an unknown outcome its own way, as Flink's
    /// `retryLater()` does: it calls again later with the next attempt
    /// number, by id, within the retry policy, and never drops the handle.
    ///
    /// A recovery commit (a handle of the restored checkpoint) is never
    /// deferred, though: it is retried here, in place, until it is done or
    /// unresolved. The lingering cleanup of the committer that owns the
    /// handle's subtask runs once a checkpoint after the restore completes,
    /// and takes that as proof that every restored handle was committed:
    /// Flink commits the restored committables in the committer's
    /// `initializeState`, before any checkpoint of the attempt can
    /// complete, and a recovery commit that does not finish there fails the
    /// task. After a rescale the handle may sit in another committer than
    /// its owner; deferred past that checkpoint, the owner would abort it
    /// as lingering and its commit would find it gone: the output of a
    /// completed checkpoint lost (found by the crash simulation's Sink V2
    /// topology with deferred commits).
    pub fn commit_attempt<D: Destination, C: Clock>(
        &mut self,
        dest: &mut D,
        clock: &C,
        handle: &TransactionHandle,
        attempt: u32,
    ) -> Result<CommitStep, TwopcError> {
        self.protect(handle);
        let mut attempt = attempt;
        let outcome = loop {
            match self
                .committer
                .commit_attempt(dest, clock.now_ms(), handle, attempt)?
            {
                CommitStep::Done(outcome) => break outcome,
                CommitStep::RetryAfter { wait_ms, error } if self.is_recovery(handle) => {
                    if !Committer::back_off(clock, wait_ms) {
                        return Err(self.committer.given_up(handle, &error));
                    }
                    attempt += 1;
                }
                retry => return Ok(retry),
            }
        };
        self.protected.remove(&handle.transaction);
        if let Some(n) = &mut self.commits_since_compaction {
            *n += 1;
        }
        match outcome {
            CommitOutcome::Committed => self.stats.committed += 1,
            CommitOutcome::AlreadyCommitted => self.stats.already_committed += 1,
            CommitOutcome::Empty => self.stats.empty += 1,
        }
        self.stats.last_committed_checkpoint = self
            .stats
            .last_committed_checkpoint
            .max(handle.checkpoint());
        Ok(CommitStep::Done(outcome))
    }

    /// A handle of the restored checkpoint: prepared before the restore
    /// (a handle prepared after it records a later checkpoint, since its
    /// writer numbers from the restored one on).
    fn is_recovery(&self, handle: &TransactionHandle) -> bool {
        matches!(
            (handle.checkpoint(), self.restored),
            (Some(c), Some(r)) if c <= r
        )
    }

    /// Checkpoint `checkpoint` completed: housekeeping. Only a commit it had
    /// to finish (a decided commit found interrupted) can fail it.
    pub fn checkpoint_completed<D: Destination, C: Clock>(
        &mut self,
        dest: &mut D,
        clock: &C,
        checkpoint: CheckpointId,
    ) -> Result<Housekeeping, TwopcError> {
        let mut report = Housekeeping::default();
        if Some(checkpoint) > self.restored {
            self.recovered = true;
        }
        // A checkpoint after the restore completed: every subtask finished
        // its recovery, so whatever this subtask owns and nobody keeps is
        // lingering. (Until this committer knows its own writer's attempt,
        // it could not tell that writer's transactions apart: wait.)
        if self.cleanup_due
            && Some(checkpoint) > self.restored
            && self.writers.contains_key(&self.ctx.subtask)
        {
            let keep = Keep {
                current: &self.writers,
                protected: &self.protected,
            };
            match recovery::abort_lingering(dest, clock, &self.committer, &self.ctx, &keep) {
                Ok(done) => {
                    // A share held by another attempt stays due: once its
                    // holder is gone (a superseded attempt of an earlier
                    // run still closing), the next checkpoint cleans it.
                    // Reported, never raised: it says nothing about this
                    // attempt's own commits, and failing a healthy job
                    // for another's hold is what the check is there to
                    // prevent.
                    self.cleanup_due = !done.skipped.is_empty();
                    if !done.aborted.is_empty() {
                        log::info!(
                            "{}: aborted {} lingering transactions after checkpoint \
                             {checkpoint}, the first since the restore",
                            self.ctx.scope(),
                            done.aborted.len()
                        );
                    }
                    for skipped in &done.skipped {
                        report.failures.push(format!(
                            "the lingering cleanup after checkpoint {checkpoint} {}",
                            skipped.describe(&self.ctx)
                        ));
                    }
                    self.stats.lingering_aborted += done.aborted.len() as u64;
                    report.aborted = done.aborted;
                }
                // Fatal: a decided commit it met that is lost, unresolved
                // or refused for good, or one that can be neither finished
                // nor aborted. The next checkpoint would meet it again;
                // the job stops, naming it (found by review: only the first
                // two stopped it, the rest were warnings at every checkpoint).
                Err(e) if e.is_fatal() => return Err(e),
                Err(e) => report.failures.push(format!(
                    "aborting lingering transactions after checkpoint {checkpoint} failed (tried \
                     again at the next checkpoint): {e}"
                )),
            }
        }
        // The retention scan waits for the lingering cleanup. While that
        // stays due (a share held by another attempt that has not let go),
        // it runs again at every checkpoint and removes everything in this
        // subtask's held shares that nobody keeps, of any age: a superset of
        // what the scan would expire, so nothing stale outlives the wait.
        if !self.cleanup_due {
            match self.expire_stale_if_due(dest, clock) {
                Ok(expiry) => {
                    // Reported like a share the lingering cleanup skipped;
                    // the share is looked at again at the next scan.
                    report.failures.extend(self.skipped_by_retention(
                        &format!("the retention scan after checkpoint {checkpoint}"),
                        &expiry,
                    ));
                    report.expired = expiry.expired;
                }
                Err(e) => report.failures.push(format!(
                    "the retention scan after checkpoint {checkpoint} failed (tried again at the \
                     first checkpoint completed after the next expiry scan interval): {e}"
                )),
            }
        }
        if let Err(e) = self.compact_if_due(dest) {
            report.failures.push(format!(
                "compacting the commit history after checkpoint {checkpoint} failed (tried again \
                 after the next commits): {e}"
            ));
        }
        self.stats.housekeeping_failures += report.failures.len() as u64;
        for f in &report.failures {
            log::warn!("{}: {f}", self.ctx.scope());
        }
        Ok(report)
    }

    /// The subtask's input ended and its final checkpoint's commit is done:
    /// housekeeping still due (a lingering cleanup that failed and had no
    /// later checkpoint to be tried again at) gets one more try. Its
    /// failure is returned, and the front ends report it without failing
    /// the task: after the final checkpoint Flink redeploys a failed
    /// subtask as finished, so nothing would try again, and what is left
    /// staged stays invisible (the next run's cleanup, or the retention,
    /// removes it). Only the front ends know whether the input ended; at a
    /// failure or cancellation they must not call this, since a newer
    /// attempt may already write under this subtask's share.
    pub fn finish<D: Destination, C: Clock>(
        &mut self,
        dest: &mut D,
        clock: &C,
    ) -> Result<Vec<TransactionId>, TwopcError> {
        // Only once every subtask finished its recovery: before that, what
        // looks lingering may be a restored transaction another subtask is
        // about to commit.
        if !self.cleanup_due || !self.recovered || !self.writers.contains_key(&self.ctx.subtask) {
            return Ok(Vec::new());
        }
        let keep = Keep {
            current: &self.writers,
            protected: &self.protected,
        };
        let done = recovery::abort_lingering(dest, clock, &self.committer, &self.ctx, &keep)?;
        self.stats.lingering_aborted += done.aborted.len() as u64;
        if let Some(skipped) = done.skipped.first() {
            // Nothing tries again after the final checkpoint: the share's
            // holder (or the next run's cleanup, or the retention) removes
            // what is left, and the front ends report this without failing
            // the task.
            return Err(TwopcError::OwnedElsewhere(Box::new(
                crate::error::OwnershipConflict {
                    scope: self.ctx.scope(),
                    ours: OwnerClaim {
                        subtask: skipped.share,
                        ..self.ctx.owner_claim()
                    },
                    holder: skipped.holder.clone(),
                    diagnosis: format!(
                        "At the end of input the lingering cleanup aborted {} transaction(s) and \
                         {}{}",
                        done.aborted.len(),
                        skipped.describe(&self.ctx),
                        match done.skipped.len() {
                            1 => String::new(),
                            n => format!(" ({} more share(s) left the same way)", n - 1),
                        }
                    ),
                    fatal: false,
                },
            )));
        }
        self.cleanup_due = false;
        Ok(done.aborted)
    }

    /// Folds older commit records into segments, at the first completed
    /// checkpoint and then every `history.every_commits` commits. A busy
    /// compaction (another subtask's) counts as done.
    pub fn compact_if_due<D: Destination>(
        &mut self,
        dest: &mut D,
    ) -> Result<Compaction, crate::error::DestinationError> {
        let policy = self.options.history;
        let due = match self.commits_since_compaction {
            _ if policy.every_commits == 0 => false,
            None => true,
            Some(n) => n >= policy.every_commits,
        };
        if !due {
            return Ok(Compaction::default());
        }
        self.commits_since_compaction = Some(0);
        let done = dest.compact_history(&policy)?;
        self.stats.history_folded += done.folded;
        if done.folded > 0 {
            log::info!(
                "{}: folded {} commit records into {} history segment(s)",
                self.ctx.scope(),
                done.folded,
                done.segments
            );
        }
        Ok(done)
    }

    /// Runs the retention cleanup if the scan interval has passed. A share
    /// it left alone because another attempt or run holds it (see
    /// [`recovery::expire_stale`]) is reported in `failures` and counted as
    /// a housekeeping failure, as [`Self::checkpoint_completed`] does.
    pub fn expire_if_due<D: Destination, C: Clock>(
        &mut self,
        dest: &mut D,
        clock: &C,
    ) -> Result<Housekeeping, TwopcError> {
        let expiry = self.expire_stale_if_due(dest, clock)?;
        let failures = self.skipped_by_retention("the retention scan", &expiry);
        self.stats.housekeeping_failures += failures.len() as u64;
        Ok(Housekeeping {
            expired: expiry.expired,
            failures,
            ..Housekeeping::default()
        })
    }

    /// The retention scan, if its interval has passed (else it does
    /// nothing).
    fn expire_stale_if_due<D: Destination, C: Clock>(
        &mut self,
        dest: &mut D,
        clock: &C,
    ) -> Result<Expiry, TwopcError> {
        let now = clock.now_ms();
        if self.last_expiry_scan_ms != 0
            && now.saturating_sub(self.last_expiry_scan_ms) < self.options.expiry_scan_interval_ms
        {
            return Ok(Expiry::default());
        }
        self.last_expiry_scan_ms = now.max(1);
        let keep = Keep {
            current: &self.writers,
            protected: &self.protected,
        };
        let expiry =
            recovery::expire_stale(dest, &self.ctx, self.options.retention_ms, now, &keep)?;
        self.stats.expired += expiry.expired.len() as u64;
        Ok(expiry)
    }

    /// One housekeeping failure for each share the retention scan left
    /// alone; `scan` names the scan in the message.
    fn skipped_by_retention(&self, scan: &str, expiry: &Expiry) -> Vec<String> {
        expiry
            .skipped
            .iter()
            .map(|skipped| format!("{scan} {}", skipped.describe(&self.ctx)))
            .collect()
    }
}
