//! The compacted commit history of a sink: `_twopc/<sink>/history/`, one
//! file (a segment) per group of commit records folded together, all of
//! one lineage and one run.
//!
//! A segment's name says what it holds, so that summaries (how much each
//! lineage and run committed, which checkpoints a segment covers) come from
//! one directory listing, without reading the records:
//!
//! ```text
//! <lineage>.<first checkpoint>.<last checkpoint>.<transactions>.<records>.<nonce>.<run>
//! ```
//!
//! Its content is the commit records themselves, each checked as a single
//! record is (sink, transaction, output file name, byte count), and
//! checked against the name. A segment is only ever written whole (never
//! replaced) and removed whole.
//!
//! # Why a record is never in neither place
//!
//! Compaction writes the segment durably first and only then removes the
//! single records it holds. Readers look at the single record first and
//! then at the segments: if the single record is already gone, the
//! segment was written before that, so the later listing sees it. A crash
//! in between leaves a record in both places, and readers take it once.
//!
//! # Why a lock
//!
//! Rewriting a segment without a retracted transaction (a rewind with the
//! replace policy, `twopc reconcile --apply`) replaces one file by another.
//! Two such rewrites of one segment at once would each keep the other's
//! retracted transaction, and a retracted commit would come back. So
//! compaction and retraction from a segment hold `history.lock`
//! (`flock`): compaction only tries (another subtask is doing it), a
//! retraction waits.

use std::collections::BTreeMap;
use std::fs::File;

use twopc_core::destination::HistoryPolicy;
use twopc_core::error::{DestinationError, DestinationErrorKind};
use twopc_core::handle::TransactionHandle;
use twopc_core::ids::{CheckpointId, LineageId, TransactionId};

use crate::control::{encode, CommitRecord, ControlFile};
use crate::dir::{Dir, EntryKind};
use crate::faults::IoStep;
use crate::names::{commit_record_name, HISTORY_LOCK};
use crate::scan::{io_err, Reader};

/// At most this many records per segment file, whatever the policy says:
/// a segment must stay under the 1 MiB a control file may have (a record
/// is about 250 bytes, 400 with the longest ids).
pub(crate) const MAX_SEGMENT_RECORDS: usize = 2048;

pub use twopc_core::history::SegmentName;

/// A record's handle, for [`SegmentName::of`] and [`SegmentName::tally`].
impl AsRef<TransactionHandle> for CommitRecord {
    fn as_ref(&self) -> &TransactionHandle {
        &self.handle
    }
}

/// One sink's history directory.
pub(crate) struct History<'a> {
    pub dir: &'a Dir,
    /// Scratch for atomic writes; `None` for a read-only view (tools).
    pub tmp: Option<&'a Dir>,
    pub reader: Reader<'a>,
}

impl History<'_> {
    /// Every segment, by name; other entries are returned apart (for tools
    /// to report; the sink ignores them).
    pub fn list(&self) -> Result<(Vec<SegmentName>, Vec<String>), DestinationError> {
        let mut segments = Vec::new();
        let mut foreign = Vec::new();
        for e in self
            .dir
            .entries()
            .map_err(io_err("listing", self.dir.path()))?
        {
            match e.name.as_deref().and_then(SegmentName::parse) {
                Some(s) if e.kind == EntryKind::File => segments.push(s),
                Some(s) => {
                    // Named like a segment but a link or a directory:
                    // skipping it could hide commits.
                    return Err(self.reader.corrupt(format!(
                        "{} is named like a history segment but is not a regular file",
                        self.dir.child(&s.render()).display()
                    )));
                }
                None => foreign.push(self.dir.child(&e.raw_name).display().to_string()),
            }
        }
        segments.sort_by_key(|s| (s.lineage, s.first, s.nonce));
        Ok((segments, foreign))
    }

    /// The records of a segment, each checked, and all of them checked
    /// against its name; `None` if it was removed meanwhile (rewritten by a
    /// retraction: list again).
    pub fn read(&self, seg: &SegmentName) -> Result<Option<Vec<CommitRecord>>, DestinationError> {
        let name = seg.render();
        let path = self.dir.child(&name);
        let records = match self.reader.read_control(self.dir, &name)? {
            None => return Ok(None),
            Some(ControlFile::Segment(r)) => r,
            Some(_) => {
                return Err(self
                    .reader
                    .corrupt(format!("{} is not a history segment", path.display())))
            }
        };
        let bad = |what: String| {
            self.reader.corrupt(format!(
                "history segment {}: {what}; restore it from a backup, or move it away and \
                 check the output with `twopc inspect --all`",
                path.display()
            ))
        };
        if records.is_empty() {
            return Err(bad("it holds no record".to_string()));
        }
        for r in &records {
            let h = &r.handle;
            let checkpoint = h.checkpoint().unwrap_or_default();
            let record_name = commit_record_name(h.lineage, checkpoint, &h.transaction);
            r.check(self.reader.sink, &record_name).map_err(bad)?;
            if h.lineage != seg.lineage || h.run != seg.run || !seg.covers(h.lineage, checkpoint) {
                return Err(bad(format!(
                    "it holds {} (lineage {}, run {}, checkpoint {checkpoint}), which its name \
                     does not cover",
                    h.transaction, h.lineage, h.run
                )));
            }
        }
        let tally = SegmentName::tally(&records);
        if (tally.transactions, tally.records) != (seg.transactions, seg.records) {
            return Err(bad(format!(
                "it holds {} transactions with {} records, its name says {} with {}",
                tally.transactions, tally.records, seg.transactions, seg.records
            )));
        }
        Ok(Some(records))
    }

    /// The commit record of `txn` (committed for `checkpoint` of
    /// `lineage`), if a segment holds it.
    pub fn find(
        &self,
        lineage: LineageId,
        checkpoint: CheckpointId,
        txn: &TransactionId,
    ) -> Result<Option<CommitRecord>, DestinationError> {
        for _ in 0..4 {
            let (segments, _) = self.list()?;
            let mut vanished = false;
            for seg in segments.iter().filter(|s| s.covers(lineage, checkpoint)) {
                match self.read(seg)? {
                    Some(records) => {
                        if let Some(r) = records.into_iter().find(|r| &r.handle.transaction == txn)
                        {
                            return Ok(Some(r));
                        }
                    }
                    None => vanished = true,
                }
            }
            if !vanished {
                return Ok(None);
            }
            // A retraction rewrote a segment meanwhile: its replacement was
            // written before the old one went, so a new listing has it.
        }
        Err(kept_changing(format!(
            "the history segments in {} kept changing while {txn} was looked up",
            self.dir.path().display()
        )))
    }

    /// Every folded record of `lineage` committed after `checkpoint`, each
    /// once.
    pub fn after(
        &self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommitRecord>, DestinationError> {
        self.collect(|s| s.lineage == lineage && s.last > checkpoint)
            .map(|records| {
                records
                    .into_iter()
                    .filter(|r| r.handle.checkpoint().is_some_and(|c| c > checkpoint))
                    .collect()
            })
    }

    /// Every folded record of the segments `pick` selects, each once.
    pub fn collect(
        &self,
        pick: impl Fn(&SegmentName) -> bool,
    ) -> Result<Vec<CommitRecord>, DestinationError> {
        'again: for _ in 0..4 {
            let (segments, _) = self.list()?;
            let mut by_txn = BTreeMap::new();
            for seg in segments.iter().filter(|s| pick(s)) {
                let Some(records) = self.read(seg)? else {
                    continue 'again;
                };
                for r in records {
                    by_txn.insert(r.handle.transaction.clone(), r);
                }
            }
            return Ok(by_txn.into_values().collect());
        }
        Err(kept_changing(format!(
            "the history segments in {} kept changing while they were read",
            self.dir.path().display()
        )))
    }

    /// Writes `records` (one lineage and run) as a new segment.
    pub fn write(&self, records: &[CommitRecord]) -> Result<SegmentName, DestinationError> {
        let seg = SegmentName::of(records);
        let name = seg.render();
        let tmp = self.tmp.ok_or_else(|| {
            self.reader
                .corrupt("a read-only view of the history cannot write".to_string())
        })?;
        self.dir
            .write_atomically(
                tmp,
                &name,
                &encode(&ControlFile::Segment(records.to_vec())),
                false,
                IoStep::CommitRecord,
            )
            .map_err(io_err("writing history segment", &self.dir.child(&name)))?;
        Ok(seg)
    }

    /// Removes `txn` from every segment that holds it (the caller holds the
    /// lock): each such segment is written again without it (or removed
    /// when it was its last record), then the old one goes. Returns how
    /// many segments changed.
    pub fn remove(
        &self,
        lineage: LineageId,
        checkpoint: CheckpointId,
        txn: &TransactionId,
    ) -> Result<u64, DestinationError> {
        let (segments, _) = self.list()?;
        let mut changed = 0;
        for seg in segments.iter().filter(|s| s.covers(lineage, checkpoint)) {
            let Some(records) = self.read(seg)? else {
                continue;
            };
            if !records.iter().any(|r| &r.handle.transaction == txn) {
                continue;
            }
            let rest: Vec<CommitRecord> = records
                .into_iter()
                .filter(|r| &r.handle.transaction != txn)
                .collect();
            if !rest.is_empty() {
                self.write(&rest)?;
            }
            let name = seg.render();
            self.dir
                .unlink(&name)
                .map_err(io_err("removing", &self.dir.child(&name)))?;
            self.dir
                .sync()
                .map_err(io_err("syncing directory", self.dir.path()))?;
            changed += 1;
        }
        Ok(changed)
    }
}

/// Takes the history lock of a sink (`_twopc/<sink>/history.lock`):
/// `Ok(None)` when `wait` is false and someone else holds it.
pub(crate) fn lock(sink_dir: &Dir, wait: bool) -> std::io::Result<Option<File>> {
    use rustix::fs::{flock, FlockOperation};
    let file = sink_dir.open_or_create(HISTORY_LOCK)?;
    let op = if wait {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    match flock(&file, op) {
        Ok(()) => Ok(Some(file)),
        Err(rustix::io::Errno::WOULDBLOCK) if !wait => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The effective policy of this destination (segments bounded in size).
pub(crate) fn effective(policy: &HistoryPolicy) -> HistoryPolicy {
    HistoryPolicy {
        max_segment: policy.max_segment.clamp(1, MAX_SEGMENT_RECORDS),
        ..*policy
    }
}

/// Segments that vanished under every re-read: other subtasks rewriting
/// them (retractions of a rewind, compactions) faster than this one reads,
/// not damage (a segment removed from outside is simply not listed again).
/// Retryable: a restart reads a settled history (found by review: it was
/// a fatal "corrupt" error that stopped the job).
fn kept_changing(what: String) -> DestinationError {
    DestinationError::new(
        DestinationErrorKind::Io,
        format!("{what}; other subtasks were rewriting them, so this is retried"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use twopc_core::handle::{PreparedInfo, TransactionState};
    use twopc_core::ids::{RunId, SinkId};

    #[test]
    fn a_full_segment_with_the_longest_ids_fits_a_control_file() {
        let sink = SinkId::new("s".repeat(64)).unwrap();
        let run = RunId::new("r".repeat(64)).unwrap();
        let records: Vec<CommitRecord> = (0..MAX_SEGMENT_RECORDS as u64)
            .map(|i| {
                let txn = TransactionId::compose(&sink, u32::MAX - 1, u64::MAX, u64::MAX - i);
                CommitRecord {
                    file: Some(format!("{}-{txn}.{}", "p".repeat(32), "x".repeat(16))),
                    handle: TransactionHandle {
                        transaction: txn,
                        sink: sink.clone(),
                        lineage: LineageId(u64::MAX),
                        run: run.clone(),
                        subtask: u32::MAX - 1,
                        parallelism: u32::MAX,
                        begun_at_ms: u64::MAX,
                        state: TransactionState::Prepared(PreparedInfo {
                            checkpoint: u64::MAX - i,
                            records: u64::MAX,
                            bytes: u64::MAX,
                            prepared_at_ms: u64::MAX,
                        }),
                    },
                    data_len: u64::MAX,
                    committed_at_ms: u64::MAX,
                }
            })
            .collect();
        let bytes = encode(&ControlFile::Segment(records));
        assert!(
            (bytes.len() as u64) < crate::control::MAX_CONTROL_FILE,
            "{} bytes",
            bytes.len()
        );
    }
}
