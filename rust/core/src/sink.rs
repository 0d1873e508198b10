//! One subtask's sink: the writer and the committer over one destination,
//! with start-up recovery and retention cleanup. This is the surface the
//! JNI bridge and the simulation drive, mirroring the calls of Flink's
//! `TwoPhaseCommitSinkFunction`:
//!
//! | Flink                         | here                          |
//! |-------------------------------|-------------------------------|
//! | `initializeState`             | [`SubtaskSink::open`]         |
//! | `beginTransaction`            | [`SubtaskSink::begin`]        |
//! | `invoke` (batched)            | [`SubtaskSink::write`]        |
//! | `preCommit` (at a checkpoint) | [`SubtaskSink::prepare`]      |
//! | `commit` / `recoverAndCommit` | [`SubtaskSink::commit`]       |
//! | `abort` / `recoverAndAbort`   | [`SubtaskSink::abort`]        |

use std::collections::HashSet;

use crate::clock::Clock;
use crate::committer::{AbortOutcome, CommitOutcome, Committer};
use crate::config::{RewindPolicy, SinkOptions, SubtaskContext};
use crate::destination::Destination;
use crate::error::{SinkScope, TwopcError};
use crate::handle::TransactionHandle;
use crate::ids::{random_u64, CheckpointId, LineageId, TransactionId};
use crate::records::RecordBatch;
use crate::recovery::{self, Restore, StartupReport};
use crate::writer::{OpenStats, Writer};

/// A test-only fault at a named protocol point (cargo feature
/// `failpoints`). Without the feature this expands to nothing.
///
/// Points: `twopc-write`, `twopc-prepare-before`, `twopc-prepare-after`
/// (prepared at the destination, failure reported), `twopc-commit-before`,
/// `twopc-commit-after` (committed at the destination, failure reported),
/// `twopc-abort-before`.
macro_rules! fault_point {
    ($name:literal, $self:ident, $txn:expr) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, |_| Err(injected_fault($name, &$self.ctx, $txn)));
    };
}

#[cfg(feature = "failpoints")]
fn injected_fault(point: &'static str, ctx: &SubtaskContext, txn: &TransactionId) -> TwopcError {
    TwopcError::Destination {
        scope: ctx.scope(),
        action: "injected fault at",
        transaction: txn.clone(),
        consequence: point,
        source: crate::error::DestinationError::new(
            crate::error::DestinationErrorKind::Io,
            format!("fail point {point} triggered"),
        ),
    }
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SinkStats {
    pub records_written: u64,
    pub bytes_written: u64,
    pub committed: u64,
    pub aborted: u64,
    pub last_committed_checkpoint: Option<CheckpointId>,
}

pub struct SubtaskSink<D: Destination, C: Clock> {
    dest: D,
    clock: C,
    ctx: SubtaskContext,
    options: SinkOptions,
    writer: Writer,
    committer: Committer,
    /// Transactions this subtask may still need: never expired by cleanup.
    protected: HashSet<TransactionId>,
    /// After a restore: lingering transactions are aborted, and retention
    /// cleanup starts, once the first checkpoint of this attempt completes
    /// (see `recovery`).
    recovery_cleanup_due: bool,
    /// After a restore under `RewindPolicy::ReplaceRange`: the restored
    /// lineage and checkpoint, so that a restored open transaction found
    /// committed by a later checkpoint is retracted rather than refused.
    replace_after: Option<(LineageId, CheckpointId)>,
    last_expiry_scan_ms: u64,
    stats: SinkStats,
}

impl<D: Destination, C: Clock> SubtaskSink<D, C> {
    /// Starts a subtask: recovery decisions first, then an expiry scan.
    /// `attempt_nonce` is normally `None` (drawn at random); the simulation
    /// passes one to stay deterministic.
    pub fn open(
        mut dest: D,
        clock: C,
        ctx: SubtaskContext,
        options: SinkOptions,
        restore: Option<&Restore>,
        attempt_nonce: Option<u64>,
    ) -> Result<(Self, StartupReport), TwopcError> {
        let nonce = attempt_nonce.unwrap_or_else(random_u64);
        let committer = Committer::new(ctx.scope(), options.commit_retry);
        let report = recovery::start(&mut dest, &clock, &committer, &ctx, &options, restore)?;
        let rewind = options.rewind;
        let protected = restore
            .map(|r| r.known.iter().map(|h| h.transaction.clone()).collect())
            .unwrap_or_default();
        let mut sink = SubtaskSink {
            writer: Writer::new(ctx.clone(), report.lineage, nonce),
            committer,
            dest,
            clock,
            ctx,
            options,
            protected,
            recovery_cleanup_due: !report.fresh,
            replace_after: match (restore, rewind) {
                (Some(r), RewindPolicy::ReplaceRange) if !report.fresh => {
                    Some((report.lineage, r.checkpoint))
                }
                _ => None,
            },
            last_expiry_scan_ms: 0,
            stats: SinkStats::default(),
        };
        log::info!(
            "{}: started ({}, lineage {}, attempt {:016x}); aborted {} leftover transactions, \
             retracted {}",
            sink.ctx.scope(),
            if report.fresh { "fresh" } else { "restored" },
            report.lineage,
            nonce,
            report.aborted.len(),
            report.retracted.len()
        );
        if report.fresh {
            sink.expire_if_due()?;
        }
        Ok((sink, report))
    }

    pub fn scope(&self) -> SinkScope {
        self.ctx.scope()
    }

    pub fn lineage(&self) -> LineageId {
        self.writer.lineage()
    }

    pub fn stats(&self) -> SinkStats {
        self.stats
    }

    pub fn open_stats(&self) -> OpenStats {
        self.writer.open_stats()
    }

    pub fn destination(&mut self) -> &mut D {
        &mut self.dest
    }

    pub fn begin(&mut self) -> Result<TransactionHandle, TwopcError> {
        let handle = self.writer.begin(&mut self.dest, self.clock.now_ms())?;
        self.protected.insert(handle.transaction.clone());
        Ok(handle)
    }

    /// Stages a batch of length-prefixed records into the open transaction.
    pub fn write(&mut self, txn: &TransactionId, batch: &[u8]) -> Result<OpenStats, TwopcError> {
        let batch = RecordBatch::parse(batch).map_err(|source| TwopcError::Batch {
            scope: self.ctx.scope(),
            source,
        })?;
        fault_point!("twopc-write", self, txn);
        let stats = self.writer.write(&mut self.dest, txn, batch)?;
        self.stats.records_written += batch.len();
        self.stats.bytes_written += batch.payload_bytes();
        Ok(stats)
    }

    pub fn prepare(
        &mut self,
        txn: &TransactionId,
        checkpoint: CheckpointId,
    ) -> Result<TransactionHandle, TwopcError> {
        fault_point!("twopc-prepare-before", self, txn);
        let handle = self
            .writer
            .prepare(&mut self.dest, txn, checkpoint, self.clock.now_ms())?;
        fault_point!("twopc-prepare-after", self, txn);
        if !self.recovery_cleanup_due {
            self.expire_if_due()?;
        }
        Ok(handle)
    }

    /// Commits a prepared transaction (checkpoint complete, or recovery).
    pub fn commit(&mut self, handle: &TransactionHandle) -> Result<CommitOutcome, TwopcError> {
        fault_point!("twopc-commit-before", self, &handle.transaction);
        let outcome = self.committer.commit(&mut self.dest, &self.clock, handle)?;
        fault_point!("twopc-commit-after", self, &handle.transaction);
        self.protected.remove(&handle.transaction);
        if outcome != CommitOutcome::Empty {
            self.stats.committed += 1;
        }
        self.stats.last_committed_checkpoint = self
            .stats
            .last_committed_checkpoint
            .max(handle.checkpoint());
        // A commit of this attempt's own transaction means a checkpoint taken
        // after the restore completed: every subtask has finished recovery.
        if self.recovery_cleanup_due && handle.attempt_nonce() == self.writer.attempt_nonce() {
            let aborted = recovery::abort_lingering(
                &mut self.dest,
                &self.clock,
                &self.committer,
                &self.ctx,
                self.writer.attempt_nonce(),
                &self.protected,
            )?;
            self.recovery_cleanup_due = false;
            if !aborted.is_empty() {
                log::info!(
                    "{}: aborted {} lingering transactions after the first checkpoint since the \
                     restore",
                    self.ctx.scope(),
                    aborted.len()
                );
            }
            self.expire_if_due()?;
        }
        Ok(outcome)
    }

    /// True until the first checkpoint of this attempt completed after a
    /// restore (lingering transactions are aborted then).
    pub fn recovery_cleanup_due(&self) -> bool {
        self.recovery_cleanup_due
    }

    /// Aborts a transaction: the current one at close, or the open one of a
    /// restored checkpoint. (Flink can also hand over a just-prepared one when
    /// beginning the next transaction failed; that checkpoint then fails, so
    /// aborting it is right.) A destination never removes committed output
    /// on abort.
    pub fn abort(&mut self, handle: &TransactionHandle) -> Result<AbortOutcome, TwopcError> {
        if handle.sink != self.ctx.sink {
            return Err(TwopcError::Protocol {
                scope: self.ctx.scope(),
                message: format!(
                    "transaction {} belongs to sink '{}', not to this sink",
                    handle.transaction, handle.sink
                ),
            });
        }
        let why = if self.writer.current() == Some(&handle.transaction) {
            "closing: the open transaction is not part of any checkpoint"
        } else {
            "restored open transaction: not part of the completed checkpoint"
        };
        fault_point!("twopc-abort-before", self, &handle.transaction);
        if let Some(outcome) = self.retract_if_rewound(handle)? {
            return Ok(outcome);
        }
        let outcome = self
            .committer
            .abort(&mut self.dest, &handle.transaction, why)?;
        self.writer.forget(&handle.transaction);
        self.protected.remove(&handle.transaction);
        if outcome == AbortOutcome::Aborted {
            self.stats.aborted += 1;
        }
        Ok(outcome)
    }

    /// Under `ReplaceRange`, the open transaction of the restored checkpoint
    /// may have been prepared and committed by a later checkpoint of the run
    /// that is being rewound. Whichever subtask restored it retracts that
    /// commit (repeatable: its owner may do the same at start-up), which is
    /// what aborting it means here.
    fn retract_if_rewound(
        &mut self,
        handle: &TransactionHandle,
    ) -> Result<Option<AbortOutcome>, TwopcError> {
        let Some((lineage, checkpoint)) = self.replace_after else {
            return Ok(None);
        };
        if self.writer.current() == Some(&handle.transaction) {
            return Ok(None);
        }
        let scope = self.ctx.scope();
        let later = self
            .dest
            .committed_after(lineage, checkpoint)
            .map_err(|source| TwopcError::Scan {
                scope: scope.clone(),
                action: "reading commit records for rewind replacement",
                source,
            })?;
        let Some(committed) = later.iter().find(|c| c.transaction == handle.transaction) else {
            return Ok(None);
        };
        log::warn!(
            "{scope}: rewind to checkpoint {checkpoint}: retracting output of restored open \
             transaction {} (committed by checkpoint {})",
            committed.transaction,
            committed.checkpoint
        );
        self.dest
            .retract(committed)
            .map_err(|source| TwopcError::Destination {
                scope,
                action: "retracting (rewind)",
                transaction: handle.transaction.clone(),
                consequence: "Nothing new was written; the next start retries the retraction.",
                source,
            })?;
        self.protected.remove(&handle.transaction);
        Ok(Some(AbortOutcome::Aborted))
    }

    /// Runs the retention cleanup if the scan interval has passed.
    pub fn expire_if_due(&mut self) -> Result<Vec<TransactionId>, TwopcError> {
        let now = self.clock.now_ms();
        if self.last_expiry_scan_ms != 0
            && now.saturating_sub(self.last_expiry_scan_ms) < self.options.expiry_scan_interval_ms
        {
            return Ok(Vec::new());
        }
        self.last_expiry_scan_ms = now.max(1);
        recovery::expire_stale(
            &mut self.dest,
            &self.ctx,
            self.options.retention_ms,
            now,
            &self.protected,
        )
    }
}
