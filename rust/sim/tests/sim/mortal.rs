//! A destination handle of a process that can die in the middle of a core
//! call. Crash points elsewhere fall between two core calls; a call such as
//! the committer's housekeeping makes a whole sequence of destination calls
//! (list, then abort one transaction after another), and a process may die
//! after any of them. Once armed, the handle lets `calls` more destination
//! calls through; every call after that fails without effect, as if the
//! process had gone, so the destination keeps exactly what the calls before
//! the death did. The job then ends the attempt as crashed, whatever the
//! core made of the failures.

use twopc_core::destination::{
    AbortStatus, CommitStatus, CommittedTransaction, Destination, LineageRecord, LineageSummary,
    OwnerClaim, Ownership, StagedTransaction,
};
use twopc_core::error::{DestinationError, DestinationErrorKind};
use twopc_core::records::RecordBatch;
use twopc_core::{CheckpointId, LineageId, RunId, TransactionHandle, TransactionId};

pub struct Mortal<D: Destination> {
    inner: D,
    /// Calls still let through, when armed.
    left: Option<u32>,
    died: bool,
}

impl<D: Destination> Mortal<D> {
    pub fn new(inner: D) -> Self {
        Mortal {
            inner,
            left: None,
            died: false,
        }
    }

    /// The process dies after `calls` more destination calls.
    pub fn arm(&mut self, calls: u32) {
        self.left = Some(calls);
    }

    /// True once a call met the dead process.
    pub fn died(&self) -> bool {
        self.died
    }

    fn call<T>(
        &mut self,
        effect: impl FnOnce(&mut D) -> Result<T, DestinationError>,
    ) -> Result<T, DestinationError> {
        match self.left {
            Some(0) => {
                self.died = true;
                Err(DestinationError::new(
                    DestinationErrorKind::Io,
                    "the process died (simulated crash)",
                ))
            }
            Some(n) => {
                self.left = Some(n - 1);
                effect(&mut self.inner)
            }
            None => effect(&mut self.inner),
        }
    }
}

impl<D: Destination> Destination for Mortal<D> {
    fn begin(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        self.call(|d| d.begin(handle))
    }

    fn write(
        &mut self,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<(), DestinationError> {
        self.call(|d| d.write(txn, batch))
    }

    fn prepare(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        self.call(|d| d.prepare(handle))
    }

    fn prepared_location(
        &mut self,
        txn: &TransactionId,
    ) -> Result<Option<Vec<u8>>, DestinationError> {
        self.call(|d| d.prepared_location(txn))
    }

    fn commit(
        &mut self,
        handle: &TransactionHandle,
        now_ms: u64,
    ) -> Result<CommitStatus, DestinationError> {
        self.call(|d| d.commit(handle, now_ms))
    }

    fn abort(&mut self, txn: &TransactionId) -> Result<AbortStatus, DestinationError> {
        self.call(|d| d.abort(txn))
    }

    fn staged(&mut self) -> Result<Vec<StagedTransaction>, DestinationError> {
        self.call(|d| d.staged())
    }

    fn committed_after(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommittedTransaction>, DestinationError> {
        self.call(|d| d.committed_after(lineage, checkpoint))
    }

    fn retract(&mut self, committed: &CommittedTransaction) -> Result<(), DestinationError> {
        self.call(|d| d.retract(committed))
    }

    fn expire(&mut self, txn: &TransactionId, now_ms: u64) -> Result<(), DestinationError> {
        self.call(|d| d.expire(txn, now_ms))
    }

    fn confirm_ownership(
        &mut self,
        claim: &OwnerClaim,
    ) -> Result<Option<Ownership>, DestinationError> {
        self.call(|d| d.confirm_ownership(claim))
    }

    fn claim_ownership(&mut self, claim: &OwnerClaim) -> Result<Ownership, DestinationError> {
        self.call(|d| d.claim_ownership(claim))
    }

    fn lineages(&mut self) -> Result<Vec<LineageSummary>, DestinationError> {
        self.call(|d| d.lineages())
    }

    fn record_lineage(&mut self, record: &LineageRecord) -> Result<(), DestinationError> {
        self.call(|d| d.record_lineage(record))
    }

    fn record_run_lineage(
        &mut self,
        run: &RunId,
        lineage: LineageId,
    ) -> Result<(), DestinationError> {
        self.call(|d| d.record_run_lineage(run, lineage))
    }

    fn run_lineage(&mut self, run: &RunId) -> Result<Option<LineageId>, DestinationError> {
        self.call(|d| d.run_lineage(run))
    }
    fn compact_history(
        &mut self,
        policy: &twopc_core::destination::HistoryPolicy,
    ) -> Result<twopc_core::destination::Compaction, DestinationError> {
        self.call(|d| d.compact_history(policy))
    }

    fn history_tallies(
        &mut self,
    ) -> Result<Vec<twopc_core::destination::HistoryTally>, DestinationError> {
        self.call(|d| d.history_tallies())
    }
}
