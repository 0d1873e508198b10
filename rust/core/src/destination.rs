//! The boundary between the protocol and the world. A destination does I/O
//! and reports facts; it never decides what to commit or abort. Every
//! decision lives in the writer, committer and recovery modules, so a test
//! can drive the real protocol against a destination that fails on purpose.

use crate::error::DestinationError;
use crate::handle::TransactionHandle;
use crate::ids::{CheckpointId, LineageId, TransactionId};
use crate::records::RecordBatch;

/// What a commit call found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitStatus {
    /// This call made the transaction visible.
    Committed,
    /// An earlier call already did (its response may have been lost).
    AlreadyCommitted,
    /// The destination has neither the staged transaction nor a record of
    /// committing it. `evidence` says what was looked at and found.
    Missing { evidence: String },
}

/// What an abort call found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbortStatus {
    /// Staged data was removed.
    Aborted,
    /// Nothing was staged under that id (never written, or already aborted).
    NotFound,
    /// The transaction is committed; nothing was removed.
    WasCommitted,
}

/// A transaction staged at the destination and not committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedTransaction {
    pub transaction: TransactionId,
    /// Subtask that began it (parsed from the id).
    pub subtask: u32,
    pub attempt_nonce: u64,
    /// Present once prepared: the handle recorded at prepare time.
    pub prepared: Option<TransactionHandle>,
    /// When it was last prepared or written, ms since the Unix epoch.
    pub last_activity_ms: u64,
}

/// A committed transaction as recorded by the destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedTransaction {
    pub transaction: TransactionId,
    pub lineage: LineageId,
    pub checkpoint: CheckpointId,
    pub subtask: u32,
    pub records: u64,
    pub committed_at_ms: u64,
}

/// One sink's view of a destination, used by one subtask.
///
/// Implementations must make `commit` and `abort` repeatable by transaction
/// id, and must record commits durably enough that a later `commit` of the
/// same id can answer `AlreadyCommitted` rather than `Missing`.
pub trait Destination {
    /// Starts a transaction. May be lazy (stage nothing until the first
    /// write).
    fn begin(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError>;

    /// Appends records to an open transaction: staged, invisible.
    fn write(
        &mut self,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<(), DestinationError>;

    /// Makes everything written durable and records `handle` (now in the
    /// prepared state) with it. After this returns, a crash loses nothing.
    fn prepare(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError>;

    /// Makes a prepared transaction visible, atomically, and records that it
    /// did. Repeatable. An `Err` means the outcome is unknown.
    fn commit(
        &mut self,
        handle: &TransactionHandle,
        now_ms: u64,
    ) -> Result<CommitStatus, DestinationError>;

    /// Removes staged data of a transaction, open or prepared. Repeatable.
    fn abort(&mut self, txn: &TransactionId) -> Result<AbortStatus, DestinationError>;

    /// Every staged transaction of this sink, from any subtask or run.
    fn staged(&mut self) -> Result<Vec<StagedTransaction>, DestinationError>;

    /// Committed transactions of `lineage` whose checkpoint is after
    /// `checkpoint`.
    fn committed_after(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommittedTransaction>, DestinationError>;

    /// Removes the visible output and the commit record of a committed
    /// transaction (rewind with the replace policy). Repeatable.
    fn retract(&mut self, committed: &CommittedTransaction) -> Result<(), DestinationError>;

    /// Removes a staged transaction that outlived the retention limit and
    /// leaves a durable note that it expired, so a later commit can say why
    /// it is missing. Repeatable.
    fn expire(&mut self, txn: &TransactionId, now_ms: u64) -> Result<(), DestinationError>;
}

/// A boxed destination is a destination, so a caller can choose the kind at
/// run time (the JNI bridge opens a directory or a database by
/// configuration).
impl<D: Destination + ?Sized> Destination for Box<D> {
    fn begin(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        (**self).begin(handle)
    }
    fn write(
        &mut self,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<(), DestinationError> {
        (**self).write(txn, batch)
    }
    fn prepare(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        (**self).prepare(handle)
    }
    fn commit(
        &mut self,
        handle: &TransactionHandle,
        now_ms: u64,
    ) -> Result<CommitStatus, DestinationError> {
        (**self).commit(handle, now_ms)
    }
    fn abort(&mut self, txn: &TransactionId) -> Result<AbortStatus, DestinationError> {
        (**self).abort(txn)
    }
    fn staged(&mut self) -> Result<Vec<StagedTransaction>, DestinationError> {
        (**self).staged()
    }
    fn committed_after(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommittedTransaction>, DestinationError> {
        (**self).committed_after(lineage, checkpoint)
    }
    fn retract(&mut self, committed: &CommittedTransaction) -> Result<(), DestinationError> {
        (**self).retract(committed)
    }
    fn expire(&mut self, txn: &TransactionId, now_ms: u64) -> Result<(), DestinationError> {
        (**self).expire(txn, now_ms)
    }
}
