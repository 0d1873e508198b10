//! One subtask's sink as Flink's `TwoPhaseCommitSinkFunction` drives it: a
//! writer and a committer in one operator, over one destination. This is
//! the surface the SinkFunction shim (over JNI) and the simulation drive:
//!
//! | Flink                         | here                               |
//! |-------------------------------|------------------------------------|
//! | `initializeState`             | [`SubtaskSink::open`]              |
//! | `beginTransaction`            | [`SubtaskSink::begin`]             |
//! | `invoke` (batched)            | [`SubtaskSink::write`]             |
//! | `preCommit` (at a checkpoint) | [`SubtaskSink::prepare`]           |
//! | `commit` / `recoverAndCommit` | [`SubtaskSink::commit`]            |
//! | `abort` / `recoverAndAbort`   | [`SubtaskSink::abort`]             |
//! | `notifyCheckpointComplete`    | [`SubtaskSink::checkpoint_completed`] (after the commits) |
//!
//! The Sink V2 front end drives [`WriterSession`] and [`CommitterSession`]
//! apart instead, each over a destination of its own.

use crate::clock::Clock;
use crate::committer::{AbortOutcome, CommitOutcome};
use crate::committer_session::{CommitterSession, CommitterStats, Housekeeping};
use crate::config::{SinkOptions, SubtaskContext};
use crate::destination::Destination;
use crate::error::{SinkScope, TwopcError};
use crate::handle::TransactionHandle;
use crate::ids::{CheckpointId, LineageId, TransactionId};
use crate::records::BatchParts;
use crate::recovery::{Restore, StartupReport};
use crate::state::WriterState;
use crate::writer::OpenStats;
use crate::writer_session::{fault_point, WriterSession, WriterStats};

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SinkStats {
    pub records_written: u64,
    pub bytes_written: u64,
    pub committed: u64,
    pub aborted: u64,
    pub last_committed_checkpoint: Option<CheckpointId>,
}

impl SinkStats {
    fn of(w: WriterStats, c: CommitterStats) -> Self {
        SinkStats {
            records_written: w.records_written,
            bytes_written: w.bytes_written,
            committed: c.committed,
            aborted: w.aborted + c.lingering_aborted,
            last_committed_checkpoint: c.last_committed_checkpoint,
        }
    }
}

pub struct SubtaskSink<D: Destination, C: Clock> {
    dest: D,
    clock: C,
    writer: WriterSession,
    committer: CommitterSession,
}

impl<D: Destination, C: Clock> SubtaskSink<D, C> {
    /// Starts a subtask (see [`WriterSession::open`]). `restore` is the
    /// checkpoint the job restored and this subtask's share of the sink's
    /// state; its `known` handles are the shim's pending and open
    /// transactions, which the caller commits and aborts.
    pub fn open(
        mut dest: D,
        clock: C,
        ctx: SubtaskContext,
        options: SinkOptions,
        restore: Option<&Restore>,
        attempt_nonce: Option<u64>,
    ) -> Result<(Self, StartupReport), TwopcError> {
        let (writer, report) = WriterSession::open(
            &mut dest,
            &clock,
            ctx.clone(),
            &options,
            restore,
            attempt_nonce,
        )?;
        let restored = restore.filter(|_| !report.fresh).map(|r| r.checkpoint);
        let mut committer = CommitterSession::new(ctx.clone(), options, restored);
        committer.note_writer(ctx.subtask, writer.attempt_nonce());
        if let Some(r) = restore {
            for h in &r.known {
                committer.protect(h);
            }
        }
        Ok((
            SubtaskSink {
                dest,
                clock,
                writer,
                committer,
            },
            report,
        ))
    }

    pub fn scope(&self) -> SinkScope {
        self.writer.scope()
    }

    pub fn lineage(&self) -> LineageId {
        self.writer.lineage()
    }

    pub fn stats(&self) -> SinkStats {
        SinkStats::of(self.writer.stats(), self.committer.stats())
    }

    pub fn open_stats(&self) -> OpenStats {
        self.writer.open_stats()
    }

    /// The committer half's counters (repeated commits, housekeeping).
    pub fn committer_stats(&self) -> CommitterStats {
        self.committer.stats()
    }

    pub fn destination(&mut self) -> &mut D {
        &mut self.dest
    }

    /// The writer's state for a checkpoint (one element per subtask).
    pub fn writer_state(&self) -> WriterState {
        self.writer.state()
    }

    pub fn begin(&mut self) -> Result<TransactionHandle, TwopcError> {
        self.writer.begin(&mut self.dest, &self.clock)
    }

    /// Stages a batch of records (see [`crate::records`]) into the open
    /// transaction.
    pub fn write<'b>(
        &mut self,
        txn: &TransactionId,
        batch: impl Into<BatchParts<'b>>,
    ) -> Result<OpenStats, TwopcError> {
        self.writer.write(&mut self.dest, txn, batch)
    }

    pub fn prepare(
        &mut self,
        txn: &TransactionId,
        checkpoint: CheckpointId,
    ) -> Result<TransactionHandle, TwopcError> {
        self.writer
            .prepare(&mut self.dest, &self.clock, txn, checkpoint)
    }

    /// Commits a prepared transaction (checkpoint complete, or recovery).
    pub fn commit(&mut self, handle: &TransactionHandle) -> Result<CommitOutcome, TwopcError> {
        fault_point!("twopc-commit-before", self.scope(), &handle.transaction);
        let outcome = self.committer.commit(&mut self.dest, &self.clock, handle)?;
        fault_point!("twopc-commit-after", self.scope(), &handle.transaction);
        Ok(outcome)
    }

    /// Checkpoint `checkpoint` completed (after its commits): housekeeping,
    /// whose failures are reported, not raised (see [`CommitterSession`]).
    pub fn checkpoint_completed(
        &mut self,
        checkpoint: CheckpointId,
    ) -> Result<Housekeeping, TwopcError> {
        self.committer
            .checkpoint_completed(&mut self.dest, &self.clock, checkpoint)
    }

    /// The subtask ends after its final checkpoint (see
    /// [`CommitterSession::finish`]).
    pub fn finish(&mut self) -> Result<Vec<TransactionId>, TwopcError> {
        self.committer.finish(&mut self.dest, &self.clock)
    }

    /// True until the first checkpoint after a restore completed.
    pub fn recovery_cleanup_due(&self) -> bool {
        self.committer.cleanup_due()
    }

    /// Aborts a transaction: the current one at close, or the open one of a
    /// restored checkpoint.
    pub fn abort(&mut self, handle: &TransactionHandle) -> Result<AbortOutcome, TwopcError> {
        let outcome = self.writer.abort(&mut self.dest, handle)?;
        self.committer.release(&handle.transaction);
        Ok(outcome)
    }

    /// Runs the retention cleanup if the scan interval has passed (see
    /// [`CommitterSession::expire_if_due`]).
    pub fn expire_if_due(&mut self) -> Result<Housekeeping, TwopcError> {
        self.committer.expire_if_due(&mut self.dest, &self.clock)
    }
}
