//! The compacted commit history of a sink: commit records folded into
//! history segments, one object each, and the index that says which
//! segments are live.
//!
//! ```text
//! _twopc/<sink>/
//!   committed/<lineage>-<checkpoint>-<txn>     single commit records (one object each)
//!   history/<lineage>.<first>.<last>.<transactions>.<records>.<nonce>.<run>
//!                                              a segment: records of one lineage and run
//!   history.index                              the live segments, replaced with If-Match
//! ```
//!
//! A segment is named as the filesystem destination names its segment
//! files, so that the name says what it holds (lineage, checkpoints,
//! transactions, records, run). Its content is the commit records
//! themselves (without the upload location, spent once the upload was
//! completed), each checked as a single record is (sink, transaction,
//! object key, byte count) and all of them checked against the name. A
//! segment object is written once with a conditional create, never
//! replaced, and removed whole.
//!
//! # Why an index, and not a lock
//!
//! The filesystem destination rewrites its segments under a `flock`:
//! retracting a folded transaction writes its segment again without it,
//! and two such rewrites at once would each keep the other's retracted
//! transaction (a retracted commit would come back); a compaction that
//! folds a record a retraction just removed would bring it back too. An
//! object store has no lock that a process's death releases: a lease
//! object serialises rewriters only as long as no holder pauses longer
//! than the lease between its check and its next request, which S3 cannot
//! fence.
//!
//! So the history has one point of decision instead: `history.index`, the
//! list of live segments, which every change of the history replaces with
//! a conditional PUT (`If-Match` the ETag it read: S3 applies it only if
//! nobody replaced the index meanwhile, atomically). A segment object
//! that the index does not list is not part of the history, whatever its
//! name says: readers read the index, then the segments it lists.
//!
//! * **Compaction** reads the index first, then lists and reads the single
//!   records, writes its new (and merged) segments, and replaces the
//!   index with one that lists them. Only after that replacement
//!   succeeded does it delete the single records it folded (and the
//!   segments it merged away). If the index changed meanwhile (another
//!   compaction, a retraction), its replacement fails: it removes what it
//!   wrote and answers `busy`, having deleted nothing.
//! * **Retraction** deletes the object and the single record, then
//!   replaces the index, always (even when no segment holds the
//!   transaction), with segments rewritten without it. The replacement
//!   after the deletions is what makes a compaction that read the single
//!   record before it was deleted fail: that compaction read the index
//!   before the record, the retraction replaced it after deleting the
//!   record, so the compaction's conditional replacement finds another
//!   ETag. A retraction that loses the race itself reads the index again
//!   and retries, so its replacement always lands on the latest index and
//!   removes the transaction from whatever segment holds it by then.
//! * **Readers** read the single record first, then the index and the
//!   segments it lists, and take each transaction once. A single record
//!   is deleted only after an index listing its segment was in place, so
//!   a record is never in neither place. A listed segment that is gone was
//!   replaced meanwhile (a merge or a retraction deletes what it replaced
//!   after its index is in place): the reader reads the index again. A
//!   listed segment missing under an unchanged index is damage, reported.
//! * **Leftovers**: segment objects that no index lists (a compaction that
//!   lost its race or failed before its replacement, deletions that
//!   failed after one) are removed by the next compaction whose
//!   replacement succeeds: every rewriter that listed them before that
//!   replacement read an older index, so its own replacement can no
//!   longer succeed.
//! * **A write whose answer was lost**: the client may resend a
//!   conditional PUT the server already applied, and the resend fails its
//!   condition. Every index carries a random writer nonce: a failed
//!   replacement reads the index back and counts as won when it holds its
//!   own nonce. A failure that is neither (the answer lost for good) is an
//!   error: nothing is deleted, and the next compaction tidies up.
//!
//! What this relies on: S3's conditional writes (If-None-Match and If-Match
//! on PutObject, since 2024) and its strong read-after-write consistency
//! for GET and LIST. It needs no clock and no timing assumption. The
//! index is created (empty) before the first segment is ever written, so
//! segments without an index mean the index was removed outside twopc: a
//! compaction then refuses to go on (nothing in the segments is deleted).
//!
//! The index holds a short entry per segment (about 100 bytes as the
//! decoder counts them, with Flink's 32-digit job ids); merging small
//! segments keeps their number proportional to the history divided by the
//! segment size (up to 2048 records): the index's 1 MiB lists some 10,000
//! segments, about 20 million commits. A compaction that would need more
//! says so (`StorageFull`) and folds nothing further.

use serde::{Deserialize, Serialize};

use twopc_core::destination::{HistoryPolicy, HistoryTally};
use twopc_core::handle::{HandleError, PreparedInfo, TransactionHandle, TransactionState};
use twopc_core::ids::{LineageId, RunId, SinkId, TransactionId};

use crate::control::{encode, CommitRecord, ControlObject, MAX_CONTROL_OBJECT};
use crate::names::{commit_record_name, Layout};

/// At most this many records per segment, whatever the policy says (as in
/// the filesystem destination); fewer when the longest record this sink
/// could write would not let them fit a control object.
pub const MAX_SEGMENT_RECORDS: usize = 2048;

/// Bytes of a segment beyond its records (envelope, variant, length).
const SEGMENT_OVERHEAD: usize = 64;

/// What decoding one record may count against the envelope's limit beyond
/// its encoded bytes: the decoder counts every number at its full width
/// and every length as 8 bytes, however short their varints (about 20
/// numbers and lengths in a record).
const DECODE_SLACK: usize = 160;

pub use twopc_core::history::SegmentName;

/// A record's handle, for [`SegmentName::of`] and [`SegmentName::tally`].
impl AsRef<TransactionHandle> for CommitRecord {
    fn as_ref(&self) -> &TransactionHandle {
        &self.handle
    }
}

/// `_twopc/<sink>/history.index`: the live segments. Every version has a
/// generation one above the one it replaced and a random writer nonce, so
/// that no two versions have the same bytes (and ETag), and a writer
/// recognises its own version when the answer to its write was lost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryIndex {
    pub sink: SinkId,
    pub generation: u64,
    pub writer: u64,
    pub segments: Vec<SegmentName>,
}

impl HistoryIndex {
    /// The index a sink's history starts with.
    pub fn empty(sink: &SinkId) -> HistoryIndex {
        HistoryIndex {
            sink: sink.clone(),
            generation: 0,
            writer: twopc_core::ids::random_u64(),
            segments: Vec::new(),
        }
    }

    /// The next version, listing `segments`.
    pub(crate) fn next(&self, mut segments: Vec<SegmentName>) -> HistoryIndex {
        segments.sort_by_key(|a| (a.lineage, a.first, a.nonce));
        HistoryIndex {
            sink: self.sink.clone(),
            generation: self.generation + 1,
            writer: twopc_core::ids::random_u64(),
            segments,
        }
    }

    /// Is `other` this very version (read back after a write)?
    pub(crate) fn same_version(&self, other: &HistoryIndex) -> bool {
        self.generation == other.generation && self.writer == other.writer
    }

    /// Checks what serde cannot: ids valid, every entry a name that
    /// renders and parses back to itself, none twice.
    pub(crate) fn validate(&self) -> Result<(), HandleError> {
        SinkId::new(self.sink.as_str()).map_err(|e| HandleError::Invalid(e.to_string()))?;
        let mut seen = std::collections::BTreeSet::new();
        for s in &self.segments {
            if SegmentName::parse(&s.render()).as_ref() != Some(s) {
                return Err(HandleError::Invalid(format!(
                    "the history index lists {:?}, which is not a segment name",
                    s.render()
                )));
            }
            if !seen.insert(s.render()) {
                return Err(HandleError::Invalid(format!(
                    "the history index lists segment {} twice",
                    s.render()
                )));
            }
        }
        Ok(())
    }

    /// Sums per lineage and run, from the names alone.
    pub fn tallies(&self, into: &mut Vec<HistoryTally>) {
        for s in &self.segments {
            s.add_to(into);
        }
    }
}

/// A commit record as a segment keeps it: the upload's location is spent
/// once the upload was completed (and can be 400 KiB), so it goes.
pub(crate) fn folded_copy(r: &CommitRecord) -> CommitRecord {
    let mut r = r.clone();
    if let TransactionState::PreparedAt { info, .. } = &r.handle.state {
        r.handle.state = TransactionState::Prepared(info.clone());
    }
    r
}

/// Checks the records of segment `seg` one by one, as a single record is
/// checked, and against the name; `Err` says what is wrong.
pub(crate) fn check_segment(
    records: &[CommitRecord],
    seg: &SegmentName,
    layout: &Layout,
) -> Result<(), String> {
    if records.is_empty() {
        return Err("it holds no record".to_string());
    }
    let mut seen = std::collections::BTreeSet::new();
    for r in records {
        let h = &r.handle;
        let checkpoint = h.checkpoint().unwrap_or_default();
        let name = commit_record_name(h.lineage, checkpoint, &h.transaction);
        r.check(layout, &name)?;
        if h.lineage != seg.lineage || h.run != seg.run || !seg.covers(h.lineage, checkpoint) {
            return Err(format!(
                "it holds {} (lineage {}, run {}, checkpoint {checkpoint}), which its name does \
                 not cover",
                h.transaction, h.lineage, h.run
            ));
        }
        if !seen.insert(&h.transaction) {
            return Err(format!("it holds {} twice", h.transaction));
        }
    }
    let tally = SegmentName::tally(records);
    if (tally.transactions, tally.records) != (seg.transactions, seg.records) {
        return Err(format!(
            "it holds {} transactions with {} records, its name says {} with {}",
            tally.transactions, tally.records, seg.transactions, seg.records
        ));
    }
    Ok(())
}

/// What one record costs inside a segment: its bytes, and what decoding
/// it counts against the envelope's limit (1 MiB), whichever is more.
fn record_len(r: &CommitRecord) -> usize {
    // The envelope (16) and the variant (1) of a single record.
    encode(&ControlObject::Committed(r.clone())).len() - 17 + DECODE_SLACK
}

/// The bytes of the segment that holds `records`.
pub(crate) fn encode_segment(records: &[CommitRecord]) -> Vec<u8> {
    encode(&ControlObject::Segment(records.to_vec()))
}

/// Cuts `records` (in order) into runs that each fit one segment object.
pub(crate) fn split_to_fit(records: Vec<CommitRecord>) -> Vec<Vec<CommitRecord>> {
    let budget = MAX_CONTROL_OBJECT - SEGMENT_OVERHEAD;
    let mut out: Vec<Vec<CommitRecord>> = Vec::new();
    let mut used = 0;
    for r in records {
        let len = record_len(&r);
        match out.last_mut() {
            Some(last) if used + len <= budget => last.push(r),
            _ => {
                out.push(vec![r]);
                used = 0;
            }
        }
        used += len;
    }
    out
}

/// Do `records` fit one segment object?
pub(crate) fn fits(records: &[CommitRecord]) -> bool {
    records.iter().map(record_len).sum::<usize>() <= MAX_CONTROL_OBJECT - SEGMENT_OVERHEAD
}

/// The longest record this sink can write: ids at their longest, the key
/// with this layout's prefix, every number at its largest.
fn longest_record(layout: &Layout) -> CommitRecord {
    let sink = layout.sink.clone();
    let txn = TransactionId::compose(&sink, u32::MAX - 1, u64::MAX, u64::MAX);
    CommitRecord {
        key: layout.part_key(&txn),
        handle: TransactionHandle {
            transaction: txn,
            sink,
            lineage: LineageId(u64::MAX),
            run: RunId::new("r".repeat(64)).expect("a valid run id"),
            subtask: u32::MAX - 1,
            parallelism: u32::MAX,
            begun_at_ms: u64::MAX,
            state: TransactionState::Prepared(PreparedInfo {
                checkpoint: u64::MAX,
                records: u64::MAX,
                bytes: u64::MAX,
                prepared_at_ms: u64::MAX,
            }),
        },
        size: u64::MAX,
        // Longer than any S3 ETag ("<32 hex>-<parts>", quoted).
        e_tag: "\"".to_string() + &"f".repeat(64) + "-10000\"",
        committed_at_ms: u64::MAX,
    }
}

/// The most records per segment for this layout: the policy's, at most
/// [`MAX_SEGMENT_RECORDS`], and as many of the longest records as fit a
/// control object, so that merging never makes a segment too large.
pub(crate) fn effective(policy: &HistoryPolicy, layout: &Layout) -> HistoryPolicy {
    let fit = (MAX_CONTROL_OBJECT - SEGMENT_OVERHEAD) / record_len(&longest_record(layout));
    HistoryPolicy {
        max_segment: policy
            .max_segment
            .clamp(1, MAX_SEGMENT_RECORDS.min(fit).max(1)),
        ..*policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::decode;

    fn layout(prefix: &str) -> Layout {
        Layout {
            bucket: "bkt".into(),
            prefix: prefix.into(),
            sink: SinkId::new("s".repeat(64)).unwrap(),
            part_prefix: "p".repeat(32),
            part_suffix: format!(".{}", "x".repeat(16)),
        }
    }

    #[test]
    fn a_full_segment_of_the_longest_records_fits_a_control_object() {
        for prefix in [String::new(), "a/b".to_string(), "p".repeat(900)] {
            let l = layout(&prefix);
            let policy = effective(
                &HistoryPolicy {
                    max_segment: usize::MAX,
                    ..HistoryPolicy::default()
                },
                &l,
            );
            let n = policy.max_segment;
            assert!((1..=MAX_SEGMENT_RECORDS).contains(&n));
            let records = vec![longest_record(&l); n];
            assert!(fits(&records));
            let bytes = encode_segment(&records);
            assert!(bytes.len() <= MAX_CONTROL_OBJECT, "{} bytes", bytes.len());
            let back = decode(&bytes);
            assert!(
                matches!(&back, Ok(ControlObject::Segment(r)) if r.len() == n),
                "{:?}",
                back.err()
            );
            // One more would not fit when the longest records bound it.
            if n < MAX_SEGMENT_RECORDS {
                assert!(!fits(&vec![longest_record(&l); n + 1]));
            }
            // Cut into pieces that fit, in order.
            let pieces = split_to_fit(vec![longest_record(&l); 3 * n + 1]);
            assert!(pieces.iter().all(|p| fits(p)));
            assert_eq!(pieces.iter().map(Vec::len).sum::<usize>(), 3 * n + 1);
        }
        // Ordinary ids and a short prefix stay near the filesystem
        // destination's bound.
        let ordinary = Layout {
            sink: SinkId::new("orders").unwrap(),
            part_prefix: "part".into(),
            part_suffix: String::new(),
            ..layout("out")
        };
        let n = effective(&HistoryPolicy::default(), &ordinary).max_segment;
        assert!((1800..=MAX_SEGMENT_RECORDS).contains(&n), "{n}");
    }

    #[test]
    fn an_index_reads_back_and_a_forged_one_is_refused() {
        let sink = SinkId::new("s").unwrap();
        let seg = SegmentName {
            lineage: LineageId(1),
            first: 1,
            last: 2,
            transactions: 2,
            records: 5,
            nonce: 9,
            run: RunId::new("run").unwrap(),
        };
        let index = HistoryIndex::empty(&sink).next(vec![seg.clone()]);
        let bytes = encode(&ControlObject::HistoryIndex(index.clone()));
        assert_eq!(
            decode(&bytes).unwrap(),
            ControlObject::HistoryIndex(index.clone())
        );
        let next = index.next(vec![seg.clone()]);
        assert_eq!(next.generation, 2);
        assert!(!next.same_version(&index) && next.same_version(&next.clone()));
        for forged in [
            HistoryIndex {
                segments: vec![seg.clone(), seg.clone()],
                ..index.clone()
            },
            HistoryIndex {
                segments: vec![SegmentName {
                    transactions: 0,
                    ..seg.clone()
                }],
                ..index.clone()
            },
            HistoryIndex {
                segments: vec![SegmentName {
                    first: 3,
                    ..seg.clone()
                }],
                ..index.clone()
            },
        ] {
            assert!(decode(&encode(&ControlObject::HistoryIndex(forged))).is_err());
        }
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err());
        }
    }
}
