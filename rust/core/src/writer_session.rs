//! The writer side of one subtask, as Flink's Sink V2 writer needs it: it
//! starts (ownership, start-up checks, the restored open transactions
//! aborted), begins, writes and prepares transactions, and hands each
//! prepared handle on. It never commits.
//!
//! At start it claims this subtask's share of the sink at the destination,
//! then runs the start-up rules of [`crate::recovery`]: a restore continues
//! the restored lineage (and checks for a rewind), a start without state
//! checks for prepared leftovers and earlier output.

use std::collections::HashSet;

use crate::clock::Clock;
use crate::committer::{AbortOutcome, Committer};
use crate::config::{RewindPolicy, SinkOptions, SubtaskContext};
use crate::destination::Destination;
use crate::error::{SinkScope, TwopcError};
use crate::handle::TransactionHandle;
use crate::ids::{random_u64, CheckpointId, LineageId, TransactionId};
use crate::records::{BatchParts, RecordBatch};
use crate::recovery::{self, Restore, StartupReport};
use crate::state::WriterState;
use crate::writer::{OpenStats, Writer};

/// A test-only fault at a named protocol point (cargo feature
/// `failpoints`). Without the feature this expands to nothing.
///
/// Points: `twopc-begin` (in `Writer::begin`, before the destination's),
/// `twopc-write`, `twopc-prepare-before`, `twopc-prepare-after`
/// (prepared at the destination, failure reported), `twopc-abort-before`;
/// `twopc-prepare-destination` (in `Writer::prepare`: the destination's
/// prepare fails, which poisons the transaction);
/// and in the committers, `twopc-commit-before`, `twopc-commit-after`.
macro_rules! fault_point {
    ($name:literal, $scope:expr, $txn:expr) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, |_| Err(crate::writer_session::injected_fault(
            $name, $scope, $txn
        )));
    };
}
pub(crate) use fault_point;

#[cfg(feature = "failpoints")]
pub(crate) fn injected_fault(
    point: &'static str,
    scope: SinkScope,
    txn: &TransactionId,
) -> TwopcError {
    TwopcError::Destination {
        scope,
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
pub struct WriterStats {
    pub records_written: u64,
    pub bytes_written: u64,
    pub prepared: u64,
    pub aborted: u64,
}

pub struct WriterSession {
    ctx: SubtaskContext,
    writer: Writer,
    /// Under `RewindPolicy::ReplaceRange` after a restore: the restored
    /// lineage and checkpoint, so that a restored open transaction found
    /// committed by a later checkpoint is retracted rather than refused.
    replace_after: Option<(LineageId, CheckpointId)>,
    /// The open transactions of the restored state: this writer may be
    /// asked to abort them. (A restored prepared one belongs to a completed
    /// checkpoint: it is committed, never aborted.)
    restored: HashSet<TransactionId>,
    /// The transaction this writer prepared last, until it begins the next
    /// one: the SinkFunction aborts it when beginning the next failed (see
    /// [`WriterSession::abort`]).
    just_prepared: Option<TransactionId>,
    /// Transactions this writer aborted: an abort is repeatable. (Few: a
    /// writer aborts at close, at a restore and after a failed prepare.)
    aborted: HashSet<TransactionId>,
    stats: WriterStats,
}

impl WriterSession {
    /// Starts a writer: ownership and start-up rules, then the open
    /// transactions of the restored writer states are aborted (their records
    /// come after the checkpoint and are replayed). `attempt_nonce` is
    /// normally `None` (drawn at random); the simulation passes one.
    pub fn open<D: Destination, C: Clock>(
        dest: &mut D,
        clock: &C,
        ctx: SubtaskContext,
        options: &SinkOptions,
        restore: Option<&Restore>,
        attempt_nonce: Option<u64>,
    ) -> Result<(Self, StartupReport), TwopcError> {
        let nonce = attempt_nonce.unwrap_or_else(random_u64);
        let committer = Committer::new(ctx.scope(), options.commit_retry);
        let report = recovery::start(dest, clock, &committer, &ctx, options, restore)?;
        let mut session = WriterSession {
            writer: Writer::new(ctx.clone(), report.lineage, nonce),
            replace_after: match (restore, options.rewind) {
                (Some(r), RewindPolicy::ReplaceRange) if !report.fresh => {
                    Some((report.lineage, r.checkpoint))
                }
                _ => None,
            },
            restored: restore
                .map(|r| {
                    r.handles()
                        .filter(|h| h.prepared().is_none())
                        .map(|h| h.transaction.clone())
                        .collect()
                })
                .unwrap_or_default(),
            just_prepared: None,
            aborted: HashSet::new(),
            ctx,
            stats: WriterStats::default(),
        };
        log::info!(
            "{}: writer started ({}, lineage {}, attempt {:016x}); aborted {} leftover \
             transactions, retracted {}",
            session.ctx.scope(),
            if report.fresh { "fresh" } else { "restored" },
            report.lineage,
            nonce,
            report.aborted.len(),
            report.retracted.len()
        );
        if let Some(restore) = restore.filter(|_| !report.fresh) {
            for open in restore.states.iter().flat_map(|s| s.open.iter()) {
                session.abort(dest, open)?;
            }
        }
        Ok((session, report))
    }

    pub fn scope(&self) -> SinkScope {
        self.ctx.scope()
    }

    pub fn lineage(&self) -> LineageId {
        self.writer.lineage()
    }

    pub fn attempt_nonce(&self) -> u64 {
        self.writer.attempt_nonce()
    }

    pub fn stats(&self) -> WriterStats {
        self.stats
    }

    pub fn open_stats(&self) -> OpenStats {
        self.writer.open_stats()
    }

    /// The id of the open transaction, if any.
    pub fn current(&self) -> Option<&TransactionId> {
        self.writer.current()
    }

    /// This writer's state for a checkpoint: the lineage, and the open
    /// transaction (aborted if the checkpoint is restored).
    pub fn state(&self) -> WriterState {
        WriterState {
            sink: self.ctx.sink.clone(),
            lineage: self.writer.lineage(),
            run: self.ctx.run.clone(),
            subtask: self.ctx.subtask,
            open: self.writer.open_handle().into_iter().collect(),
        }
    }

    pub fn begin<D: Destination, C: Clock>(
        &mut self,
        dest: &mut D,
        clock: &C,
    ) -> Result<TransactionHandle, TwopcError> {
        let handle = self.writer.begin(dest, clock.now_ms())?;
        // Handed on: the checkpoint it was prepared for may complete now.
        self.just_prepared = None;
        Ok(handle)
    }

    /// Stages a batch of records (see [`crate::records`]) into the open
    /// transaction.
    pub fn write<'b, D: Destination>(
        &mut self,
        dest: &mut D,
        txn: &TransactionId,
        batch: impl Into<BatchParts<'b>>,
    ) -> Result<OpenStats, TwopcError> {
        let batch = RecordBatch::new(batch.into()).map_err(|source| TwopcError::Batch {
            scope: self.ctx.scope(),
            source,
        })?;
        fault_point!("twopc-write", self.ctx.scope(), txn);
        let stats = self.writer.write(dest, txn, batch)?;
        self.stats.records_written += batch.len();
        self.stats.bytes_written += batch.payload_bytes();
        Ok(stats)
    }

    /// Prepares the open transaction for `checkpoint` (durable, invisible)
    /// and returns its handle, for the committer.
    pub fn prepare<D: Destination, C: Clock>(
        &mut self,
        dest: &mut D,
        clock: &C,
        txn: &TransactionId,
        checkpoint: CheckpointId,
    ) -> Result<TransactionHandle, TwopcError> {
        fault_point!("twopc-prepare-before", self.ctx.scope(), txn);
        let handle = self.writer.prepare(dest, txn, checkpoint, clock.now_ms())?;
        // Before the fault point: a prepare whose success is lost on the way
        // is aborted by the caller like one that failed.
        self.just_prepared = Some(txn.clone());
        fault_point!("twopc-prepare-after", self.ctx.scope(), txn);
        self.stats.prepared += 1;
        Ok(handle)
    }

    /// Aborts a transaction: the open one at close, or an open one of a
    /// restored checkpoint. (Flink's SinkFunction can also hand over a
    /// just-prepared one when beginning the next transaction failed; that
    /// checkpoint then fails, so aborting it is right.) Committed output is
    /// never removed by an abort.
    pub fn abort<D: Destination>(
        &mut self,
        dest: &mut D,
        handle: &TransactionHandle,
    ) -> Result<AbortOutcome, TwopcError> {
        if handle.sink != self.ctx.sink {
            return Err(TwopcError::Protocol {
                scope: self.ctx.scope(),
                message: format!(
                    "transaction {} belongs to sink '{}', not to this sink",
                    handle.transaction, handle.sink
                ),
            });
        }
        // A prepared transaction is aborted only when this writer just
        // prepared it (the next could not begin, so its checkpoint fails) or
        // aborted it before. Handle bytes naming another prepared one (a
        // checkpoint's, which may have completed: stale or mixed up) are
        // refused, or a later commit of it would find it gone and stop the
        // job as LOST (found by review). An open transaction is never
        // committed, so aborting one is always safe, whichever subtask's it
        // was: after a rescale, Flink hands the SinkFunction's own state to
        // subtasks independently of the writer states, so its restore may
        // name an open transaction this writer's restored state does not
        // (found by a second review).
        let txn = &handle.transaction;
        let why = if self.writer.current() == Some(txn) {
            "closing: the open transaction is not part of any checkpoint"
        } else if self.just_prepared.as_ref() == Some(txn) {
            "the next transaction could not begin, so the checkpoint it was prepared for fails"
        } else if self.aborted.contains(txn) {
            "aborted before: an abort is repeatable"
        } else if self.restored.contains(txn) || handle.prepared().is_none() {
            "restored open transaction: not part of the completed checkpoint"
        } else {
            return Err(TwopcError::Protocol {
                scope: self.ctx.scope(),
                message: format!(
                    "refusing to abort transaction {txn}: it was prepared for checkpoint {}, \
                     and it is not the transaction this writer just prepared. A prepared \
                     transaction of a checkpoint is committed when the checkpoint completes, \
                     never aborted; nothing was changed",
                    handle.checkpoint().unwrap_or_default()
                ),
            });
        };
        fault_point!("twopc-abort-before", self.ctx.scope(), &handle.transaction);
        if let Some(outcome) = self.retract_if_rewound(dest, handle)? {
            return Ok(outcome);
        }
        let committer = Committer::new(self.ctx.scope(), Default::default());
        let outcome = committer.abort(dest, &handle.transaction, why)?;
        self.writer.forget(&handle.transaction);
        self.restored.remove(&handle.transaction);
        if self.just_prepared.as_ref() == Some(&handle.transaction) {
            self.just_prepared = None;
        }
        self.aborted.insert(handle.transaction.clone());
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
    fn retract_if_rewound<D: Destination>(
        &mut self,
        dest: &mut D,
        handle: &TransactionHandle,
    ) -> Result<Option<AbortOutcome>, TwopcError> {
        let Some((lineage, checkpoint)) = self.replace_after else {
            return Ok(None);
        };
        if self.writer.current() == Some(&handle.transaction) {
            return Ok(None);
        }
        let scope = self.ctx.scope();
        let later = dest
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
        dest.retract(committed)
            .map_err(|source| TwopcError::Destination {
                scope,
                action: "retracting (rewind)",
                transaction: handle.transaction.clone(),
                consequence: "Nothing new was written; the next start retries the retraction.",
                source,
            })?;
        self.restored.remove(&handle.transaction);
        self.aborted.insert(handle.transaction.clone());
        Ok(Some(AbortOutcome::Aborted))
    }
}
