//! The boundary between the protocol and the world. A destination does I/O
//! and reports facts; it never decides what to commit or abort. Every
//! decision lives in the writer, committer and recovery modules, so a test
//! can drive the real protocol against a destination that fails on purpose.

use crate::error::DestinationError;
use serde::{Deserialize, Serialize};

use crate::handle::TransactionHandle;
use crate::ids::{CheckpointId, LineageId, RunId, SinkId, TransactionId};
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
    /// The destination has the transaction, or knows where its output is,
    /// but cannot commit this handle as it is configured now (the handle
    /// was written in another mode of the destination, say). Nothing was
    /// changed and nothing is lost; `reason` says why and what to do. The
    /// job stops with a configuration error, not a data-loss alarm (a
    /// `Missing` would note the transaction as lost).
    Refused { reason: String },
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

/// A transaction staged at the destination and not (fully) committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedTransaction {
    pub transaction: TransactionId,
    /// Subtask that began it (parsed from the id).
    pub subtask: u32,
    pub attempt_nonce: u64,
    pub state: StagedState,
    /// When it was last prepared or written, ms since the Unix epoch.
    pub last_activity_ms: u64,
}

/// What the destination knows about a staged transaction. Facts only: what
/// each one means for recovery is decided by the protocol (`recovery`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StagedState {
    /// Receiving records, or abandoned before its prepare: never part of a
    /// checkpoint.
    Open,
    /// Prepared (durable, invisible); the handle recorded at prepare.
    Prepared(TransactionHandle),
    /// Prepared, but the handle recorded with it is missing or unreadable
    /// (damaged or removed outside twopc): its run and checkpoint are
    /// unknown, so it may belong to a completed checkpoint.
    PreparedUnreadable { reason: String },
    /// A commit was decided (its checkpoint completed) but did not finish:
    /// the output may not be visible yet. Only a commit may finish it.
    Committing(TransactionHandle),
}

impl StagedTransaction {
    /// The handle recorded at prepare, for a prepared transaction.
    pub fn prepared(&self) -> Option<&TransactionHandle> {
        match &self.state {
            StagedState::Prepared(h) => Some(h),
            _ => None,
        }
    }

    /// True for every state but `Open`: the transaction may hold output of a
    /// completed checkpoint.
    pub fn is_prepared(&self) -> bool {
        !matches!(self.state, StagedState::Open)
    }
}

/// Who holds (or asks for) a subtask's share of a sink at a destination. A
/// live run owns its sink id there: a second live writer for the same sink
/// and subtask would abort the first one's transactions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerClaim {
    pub sink: SinkId,
    pub subtask: u32,
    /// The Flink job id.
    pub run: RunId,
    /// Flink's attempt number of this subtask: a failover of the same run
    /// counts up, so an older attempt still closing is told apart from a
    /// second writer.
    pub attempt: u32,
    /// Identifies one sink operator of the job (drawn when the sink was
    /// built): two sinks with the same sink id in one job differ here.
    pub instance: u64,
}

/// What a destination found when asked for ownership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// This claim holds it now, until the destination is dropped.
    Acquired,
    /// Someone else holds it.
    HeldBy(OwnerInfo),
}

/// The current holder of a subtask's share, as the destination recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerInfo {
    /// The holder's claim, when the destination could read it back.
    pub claim: Option<OwnerClaim>,
    /// Where and since when, in words (host, process, session, time).
    pub holder: String,
}

/// What a destination knows about one lineage of a sink: the runs connected
/// by restores that wrote output there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineageSummary {
    pub lineage: LineageId,
    /// Committed transactions of this lineage (their records).
    pub committed: u64,
    /// The latest checkpoint with committed output, and up to a few of its
    /// transactions.
    pub last_checkpoint: Option<CheckpointId>,
    pub last_transactions: Vec<TransactionId>,
    /// Runs (Flink job ids) seen in its commit records.
    pub runs: Vec<RunId>,
    /// How the lineage began, when recorded (older outputs have no record).
    pub record: Option<LineageRecord>,
}

impl LineageSummary {
    /// The summary a destination that reads its latest checkpoint's commits
    /// (transaction and run of each) reports: `runs` are those commits' runs.
    pub fn from_latest<'a>(
        lineage: LineageId,
        committed: u64,
        last_checkpoint: CheckpointId,
        latest: impl IntoIterator<Item = (&'a TransactionId, &'a RunId)>,
        record: Option<LineageRecord>,
    ) -> LineageSummary {
        let mut last_transactions = Vec::new();
        let mut runs: Vec<RunId> = Vec::new();
        for (transaction, run) in latest {
            last_transactions.push(transaction.clone());
            if !runs.contains(run) {
                runs.push(run.clone());
            }
        }
        LineageSummary {
            lineage,
            committed,
            last_checkpoint: Some(last_checkpoint),
            last_transactions,
            runs,
            record,
        }
    }
}

/// Written when a run starts without state: it begins a lineage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineageRecord {
    pub lineage: LineageId,
    pub run: RunId,
    pub started_at_ms: u64,
    /// True when it started next to output of other lineages because the
    /// fresh-start policy allowed appending a new run.
    pub appended: bool,
}

/// A committed transaction as recorded by the destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedTransaction {
    pub transaction: TransactionId,
    pub lineage: LineageId,
    pub checkpoint: CheckpointId,
    pub subtask: u32,
    /// The run (Flink job id) that prepared it.
    pub run: RunId,
    pub records: u64,
    pub committed_at_ms: u64,
}

/// The value of `key` in `key=value` lines (the text of lost notes and
/// operation records).
fn key_value_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// A durable note that a transaction of a completed checkpoint was found
/// LOST (neither staged nor committed when its commit came), written by
/// the committer before it stops the job, so that tools can show the
/// partly visible checkpoint afterwards (`twopc inspect`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostNote {
    pub transaction: TransactionId,
    pub lineage: LineageId,
    pub checkpoint: CheckpointId,
    pub subtask: u32,
    pub run: RunId,
    pub records: u64,
    pub found_at_ms: u64,
    pub evidence: String,
}

impl LostNote {
    /// Plain `key=value` lines, one note per file or row.
    pub fn render(&self) -> String {
        format!(
            "transaction={}\nlineage={}\ncheckpoint={}\nsubtask={}\nrun={}\nrecords={}\n\
             found_at_ms={}\nevidence={}\n",
            self.transaction,
            self.lineage,
            self.checkpoint,
            self.subtask,
            self.run,
            self.records,
            self.found_at_ms,
            self.evidence.replace(['\n', '\r'], " ")
        )
    }

    /// Reads [`LostNote::render`]'s text back; `None` when incomplete.
    pub fn parse(text: &str) -> Option<LostNote> {
        let field = |key: &str| key_value_field(text, key);
        Some(LostNote {
            transaction: TransactionId::parse(field("transaction")?)?.id,
            lineage: LineageId(u64::from_str_radix(field("lineage")?, 16).ok()?),
            checkpoint: field("checkpoint")?.parse().ok()?,
            subtask: field("subtask")?.parse().ok()?,
            run: RunId::new(field("run")?).ok()?,
            records: field("records")?.parse().ok()?,
            found_at_ms: field("found_at_ms")?.parse().ok()?,
            evidence: field("evidence").unwrap_or_default().to_string(),
        })
    }
}

/// A change an operator made by hand (`twopc reconcile --apply`, `twopc
/// decide`), kept by the destination next to the output it changed, so
/// that what was done by hand, when and from where stays known. Written
/// before the change (what is about to be done) and after it (the outcome).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationRecord {
    pub at_ms: u64,
    /// `reconcile` or `decide`.
    pub command: String,
    /// The transaction changed, when one is.
    pub transaction: Option<TransactionId>,
    /// What is done or was done, in words.
    pub what: String,
    /// Who did it: user and host, as the tool found them.
    pub by: String,
}

impl OperationRecord {
    /// The name a destination stores this record under, so that names sort
    /// oldest first: by time, then (within one millisecond) by the order
    /// this process wrote them, then by a random nonce that keeps two
    /// processes' records of one millisecond apart. Without the sequence,
    /// records a command writes within one millisecond (a reconcile's
    /// "removing" and "removed") would read back in random order.
    pub fn storage_name(&self) -> String {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        format!(
            "{:020}-{:010}-{:016x}",
            self.at_ms,
            SEQUENCE.fetch_add(1, Ordering::Relaxed),
            crate::ids::random_u64()
        )
    }

    /// Plain `key=value` lines, one record per file or row.
    pub fn render(&self) -> String {
        let line = |s: &str| s.replace(['\n', '\r'], " ");
        format!(
            "at_ms={}\ncommand={}\ntransaction={}\nwhat={}\nby={}\n",
            self.at_ms,
            line(&self.command),
            self.transaction
                .as_ref()
                .map(|t| t.to_string())
                .unwrap_or_default(),
            line(&self.what),
            line(&self.by)
        )
    }

    /// Reads [`OperationRecord::render`]'s text back; `None` when damaged.
    pub fn parse(text: &str) -> Option<OperationRecord> {
        let field = |key: &str| key_value_field(text, key);
        let transaction = match field("transaction")? {
            "" => None,
            t => Some(TransactionId::parse(t)?.id),
        };
        Some(OperationRecord {
            at_ms: field("at_ms")?.parse().ok()?,
            command: field("command")?.to_string(),
            transaction,
            what: field("what")?.to_string(),
            by: field("by").unwrap_or_default().to_string(),
        })
    }
}

/// How much of a sink's commit history stays as one record per
/// transaction. Commit records are kept forever (a restore of an old
/// savepoint must still find what was committed after it), so older ones
/// are folded into per-lineage segments: a few large files or rows
/// instead of one per transaction, holding the same facts, so rewind
/// detection, a repeated commit, `twopc reconcile` and `twopc inspect`
/// read them as before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryPolicy {
    /// The latest checkpoints of each lineage whose records stay single:
    /// the ones a repeated commit or a recent rewind looks up.
    pub keep_checkpoints: u64,
    /// Fold only when at least this many records lie behind the
    /// watermark, so that segments are few and large.
    pub min_segment: usize,
    /// At most this many records per segment (bounds what one read of a
    /// segment costs).
    pub max_segment: usize,
    /// A committer compacts after this many of its commits (and once after
    /// its start); 0 turns compaction off.
    pub every_commits: u64,
}

impl Default for HistoryPolicy {
    fn default() -> Self {
        HistoryPolicy {
            keep_checkpoints: 16,
            min_segment: 256,
            max_segment: 4096,
            every_commits: 128,
        }
    }
}

/// What one compaction did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compaction {
    /// Commit records folded into segments.
    pub folded: u64,
    /// Segments written.
    pub segments: u64,
    /// Small segments merged into larger ones (removed).
    pub merged: u64,
    /// True when another process or subtask was compacting: nothing done.
    pub busy: bool,
}

/// The committed output of one run in one lineage, summed: what tools
/// show without reading every record of a long history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryTally {
    pub lineage: LineageId,
    pub run: RunId,
    pub transactions: u64,
    pub records: u64,
    pub first_checkpoint: CheckpointId,
    pub last_checkpoint: CheckpointId,
}

impl HistoryTally {
    /// Adds `part` (one transaction, or a folded segment's sums) to the
    /// tally of its lineage and run in `tallies`, starting one if needed.
    pub fn add(tallies: &mut Vec<HistoryTally>, part: HistoryTally) {
        match tallies
            .iter_mut()
            .find(|t| t.lineage == part.lineage && t.run == part.run)
        {
            Some(t) => {
                t.transactions = t.transactions.saturating_add(part.transactions);
                t.records = t.records.saturating_add(part.records);
                t.first_checkpoint = t.first_checkpoint.min(part.first_checkpoint);
                t.last_checkpoint = t.last_checkpoint.max(part.last_checkpoint);
            }
            None => tallies.push(part),
        }
    }
}

/// Sums committed transactions per lineage and run (into `tallies`).
pub fn tally(tallies: &mut Vec<HistoryTally>, c: &CommittedTransaction) {
    HistoryTally::add(
        tallies,
        HistoryTally {
            lineage: c.lineage,
            run: c.run.clone(),
            transactions: 1,
            records: c.records,
            first_checkpoint: c.checkpoint,
            last_checkpoint: c.checkpoint,
        },
    );
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

    /// Where the transaction `txn`, just prepared by this destination, is
    /// staged, in the destination's own versioned and checked encoding,
    /// when its id alone does not find it again (an object store's upload
    /// id and part ids). Called by the writer right after a successful
    /// `prepare`; the bytes go into the handle
    /// ([`crate::handle::TransactionState::PreparedAt`]) and come back in
    /// `commit`. Destinations that find staged data by id keep the default.
    fn prepared_location(
        &mut self,
        _txn: &TransactionId,
    ) -> Result<Option<Vec<u8>>, DestinationError> {
        Ok(None)
    }

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
    /// it is missing. Repeatable. Never removes a transaction whose commit
    /// was decided.
    fn expire(&mut self, txn: &TransactionId, now_ms: u64) -> Result<(), DestinationError>;

    /// Asks for ownership of `claim.subtask`'s share of the sink, held until
    /// this destination is dropped (a lock that the process's death
    /// releases: a file lock, a database session's advisory lock). A share
    /// this destination holds already answers `Acquired` again while it is
    /// still held (the lingering cleanup confirms through the writer's own
    /// destination in the SinkFunction shim, see
    /// [`Destination::confirm_ownership`]).
    fn claim_ownership(&mut self, claim: &OwnerClaim) -> Result<Ownership, DestinationError>;

    /// Who holds `claim.subtask`'s share now, asked right before a cleanup
    /// aborts or finishes transactions of that share. A subtask's claims are
    /// taken at its start; an attempt that was superseded since (a zombie
    /// whose task still runs) must not act on a share a newer attempt holds.
    ///
    /// `Acquired`: this destination holds the share (it held it already, or
    /// nobody did and it holds it from now on, until dropped, as after
    /// [`Destination::claim_ownership`]). `HeldBy`: someone else holds it,
    /// possibly another destination instance of this same attempt (the
    /// Sink V2 writer's, next to its committer's): the caller compares the
    /// claim. Unlike a claim at start, this never takes a share over from
    /// any holder, not even from an earlier attempt of the same run: a
    /// cleanup must never displace a live writer.
    ///
    /// `None` (the default): this destination cannot tell without taking
    /// the share over, and the cleanup acts unfenced as it did before (the
    /// object store's lease claim replaces a lease of the same attempt,
    /// which would stop that attempt's own writer).
    fn confirm_ownership(
        &mut self,
        _claim: &OwnerClaim,
    ) -> Result<Option<Ownership>, DestinationError> {
        Ok(None)
    }

    /// Keeps `note` durably (repeatable). Destinations that cannot keep it
    /// answer `Ok` and tools see nothing; the job stops all the same.
    fn record_lost(&mut self, _note: &LostNote) -> Result<(), DestinationError> {
        Ok(())
    }

    /// Every lost note of this sink (for tools).
    fn lost_notes(&mut self) -> Result<Vec<LostNote>, DestinationError> {
        Ok(Vec::new())
    }

    /// Removes the lost notes of `lineage` after `checkpoint` (their range
    /// was reconciled and is written again by the restored run). Returns
    /// how many went.
    fn clear_lost(
        &mut self,
        _lineage: LineageId,
        _checkpoint: CheckpointId,
    ) -> Result<u64, DestinationError> {
        Ok(0)
    }

    /// Keeps `record` durably, in order of calls. A destination that
    /// keeps no such log answers `Ok`; the directory and PostgreSQL ones
    /// keep it.
    fn record_operation(&mut self, _record: &OperationRecord) -> Result<(), DestinationError> {
        Ok(())
    }

    /// Every operation record of this sink, oldest first (for tools).
    fn operations(&mut self) -> Result<Vec<OperationRecord>, DestinationError> {
        Ok(Vec::new())
    }

    /// Folds commit records behind `policy`'s watermark into segments
    /// (repeatable; safe next to running commits, rewinds and other
    /// compactions). A destination that keeps no history answers `Ok`.
    fn compact_history(&mut self, _policy: &HistoryPolicy) -> Result<Compaction, DestinationError> {
        Ok(Compaction::default())
    }

    /// The whole committed history summed per lineage and run. The
    /// default reads every record; a destination that compacts answers
    /// from its segments' summaries, in time that does not grow with the
    /// history.
    fn history_tallies(&mut self) -> Result<Vec<HistoryTally>, DestinationError> {
        let mut out = Vec::new();
        for l in self.lineages()? {
            for c in self.committed_after(l.lineage, 0)? {
                tally(&mut out, &c);
            }
        }
        Ok(out)
    }

    /// Every subtask index of this sink that some run ever claimed here
    /// (held now or not), for an operator's tool that must hold the whole
    /// sink (see [`crate::operator`]). A destination that records no owners
    /// answers an empty list.
    fn owner_subtasks(&mut self) -> Result<Vec<u32>, DestinationError> {
        Ok(Vec::new())
    }

    /// Every lineage with committed output of this sink.
    fn lineages(&mut self) -> Result<Vec<LineageSummary>, DestinationError>;

    /// Records the start of a lineage (repeatable).
    fn record_lineage(&mut self, record: &LineageRecord) -> Result<(), DestinationError>;

    /// Records that `run` (a Flink job id) writes in `lineage`, for its
    /// subtasks that receive no writer state after a change of parallelism
    /// (repeatable; within one run the lineage never changes).
    fn record_run_lineage(
        &mut self,
        run: &RunId,
        lineage: LineageId,
    ) -> Result<(), DestinationError>;

    /// The lineage recorded for `run`, if any.
    fn run_lineage(&mut self, run: &RunId) -> Result<Option<LineageId>, DestinationError>;

    /// Whether `lineage` ever ran here (its start, or a run of it, was
    /// recorded), output or not: for an operator's tool to tell a lineage
    /// whose output is all removed from a mistyped one. `None` where the
    /// destination cannot tell.
    fn lineage_recorded(&mut self, _lineage: LineageId) -> Result<Option<bool>, DestinationError> {
        Ok(None)
    }

    /// When the last commit this destination made showed its output to
    /// readers, where it can tell (a commit may go on after that, making
    /// things durable and cleaning up): the commit latency metric's "until
    /// visible" part. `None` where the destination does not say.
    fn last_visible_at(&self) -> Option<std::time::Instant> {
        None
    }
}

/// A boxed destination is a destination, so a caller can choose the kind at
/// run time (the JNI bridge opens a directory or a database by
/// configuration).
impl<D: Destination + ?Sized> Destination for Box<D> {
    fn last_visible_at(&self) -> Option<std::time::Instant> {
        (**self).last_visible_at()
    }
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
    fn prepared_location(
        &mut self,
        txn: &TransactionId,
    ) -> Result<Option<Vec<u8>>, DestinationError> {
        (**self).prepared_location(txn)
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
    fn claim_ownership(&mut self, claim: &OwnerClaim) -> Result<Ownership, DestinationError> {
        (**self).claim_ownership(claim)
    }
    fn confirm_ownership(
        &mut self,
        claim: &OwnerClaim,
    ) -> Result<Option<Ownership>, DestinationError> {
        (**self).confirm_ownership(claim)
    }
    fn owner_subtasks(&mut self) -> Result<Vec<u32>, DestinationError> {
        (**self).owner_subtasks()
    }
    fn record_lost(&mut self, note: &LostNote) -> Result<(), DestinationError> {
        (**self).record_lost(note)
    }
    fn lost_notes(&mut self) -> Result<Vec<LostNote>, DestinationError> {
        (**self).lost_notes()
    }
    fn clear_lost(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<u64, DestinationError> {
        (**self).clear_lost(lineage, checkpoint)
    }
    fn record_operation(&mut self, record: &OperationRecord) -> Result<(), DestinationError> {
        (**self).record_operation(record)
    }
    fn operations(&mut self) -> Result<Vec<OperationRecord>, DestinationError> {
        (**self).operations()
    }
    fn compact_history(&mut self, policy: &HistoryPolicy) -> Result<Compaction, DestinationError> {
        (**self).compact_history(policy)
    }
    fn history_tallies(&mut self) -> Result<Vec<HistoryTally>, DestinationError> {
        (**self).history_tallies()
    }
    fn lineages(&mut self) -> Result<Vec<LineageSummary>, DestinationError> {
        (**self).lineages()
    }
    fn record_lineage(&mut self, record: &LineageRecord) -> Result<(), DestinationError> {
        (**self).record_lineage(record)
    }
    fn record_run_lineage(
        &mut self,
        run: &RunId,
        lineage: LineageId,
    ) -> Result<(), DestinationError> {
        (**self).record_run_lineage(run, lineage)
    }
    fn run_lineage(&mut self, run: &RunId) -> Result<Option<LineageId>, DestinationError> {
        (**self).run_lineage(run)
    }
    fn lineage_recorded(&mut self, lineage: LineageId) -> Result<Option<bool>, DestinationError> {
        (**self).lineage_recorded(lineage)
    }
}

#[cfg(test)]
mod lost_note_tests {
    use super::*;

    #[test]
    fn operation_records_of_one_millisecond_sort_in_the_order_they_were_written() {
        let record = |what: &str| OperationRecord {
            at_ms: 1_700_000_000_000,
            command: "reconcile".to_string(),
            transaction: None,
            what: what.to_string(),
            by: "ops@host".to_string(),
        };
        let names: Vec<String> = (0..200)
            .map(|i| record(&format!("step {i}")).storage_name())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, names, "names must sort in write order");
        // A later millisecond sorts after, whatever the sequence says.
        let later = OperationRecord {
            at_ms: 1_700_000_000_001,
            ..record("later")
        };
        assert!(later.storage_name() > names[199]);
    }

    #[test]
    fn an_operation_record_reads_back_and_keeps_to_one_line_per_field() {
        let record = OperationRecord {
            at_ms: 1_700_000_000_000,
            command: "decide".to_string(),
            transaction: TransactionId::parse("orders.1.00000000000000ab.7").map(|p| p.id),
            what: "commit by hand:\nrequested".to_string(),
            by: "ops@host".to_string(),
        };
        let text = record.render();
        assert_eq!(text.lines().count(), 5, "{text}");
        let back = OperationRecord::parse(&text).unwrap();
        assert_eq!(back.what, "commit by hand: requested");
        assert_eq!(back.transaction, record.transaction);
        let none = OperationRecord {
            transaction: None,
            what: "commit by hand: requested".to_string(),
            ..record
        };
        assert_eq!(OperationRecord::parse(&none.render()).unwrap(), none);
        assert_eq!(OperationRecord::parse("at_ms=x\ncommand=a\n"), None);
        assert_eq!(OperationRecord::parse("garbage"), None);
    }

    #[test]
    fn a_lost_note_reads_back_and_keeps_to_one_line_per_field() {
        let note = LostNote {
            transaction: TransactionId::parse("orders.1.00000000000000ab.7")
                .unwrap()
                .id,
            lineage: LineageId(0x0123_4567_89ab_cdef),
            checkpoint: 42,
            subtask: 1,
            run: RunId::new("run-a").unwrap(),
            records: 678,
            found_at_ms: 1_700_000_000_000,
            evidence: "removed by hand\nsecond line".to_string(),
        };
        let text = note.render();
        assert_eq!(text.lines().count(), 8, "{text}");
        let back = LostNote::parse(&text).unwrap();
        assert_eq!(back.evidence, "removed by hand second line");
        assert_eq!(
            LostNote {
                evidence: note.evidence.replace('\n', " "),
                ..note
            },
            back
        );
        assert_eq!(
            LostNote::parse("transaction=orders.1.00000000000000ab.7\n"),
            None
        );
    }
}

#[cfg(test)]
mod tally_tests {
    use super::*;

    fn part(run: &str, transactions: u64, first: u64, last: u64) -> HistoryTally {
        HistoryTally {
            lineage: LineageId(3),
            run: RunId::new(run).unwrap(),
            transactions,
            records: transactions.saturating_mul(10),
            first_checkpoint: first,
            last_checkpoint: last,
        }
    }

    #[test]
    fn parts_of_one_run_sum_and_other_runs_keep_their_own_tally() {
        let mut tallies = Vec::new();
        HistoryTally::add(&mut tallies, part("a", 5, 10, 14));
        HistoryTally::add(&mut tallies, part("b", 1, 3, 3));
        HistoryTally::add(&mut tallies, part("a", 2, 2, 3));
        HistoryTally::add(&mut tallies, part("a", 1, 20, 20));
        assert_eq!(tallies, vec![part("a", 8, 2, 20), part("b", 1, 3, 3)]);
    }

    #[test]
    fn counts_from_hostile_segment_names_saturate_instead_of_overflowing() {
        // Segment names are read back from the destination: two claiming
        // u64::MAX transactions must not panic (debug) or wrap (release).
        let mut tallies = Vec::new();
        HistoryTally::add(&mut tallies, part("a", u64::MAX, 1, 1));
        HistoryTally::add(&mut tallies, part("a", u64::MAX, 2, 2));
        assert_eq!(tallies[0].transactions, u64::MAX);
        assert_eq!(tallies[0].records, u64::MAX);
    }
}
