//! Compacted commit history: the encoding of a segment (the committed
//! transactions of one run in one lineage, folded together) and the
//! choice of what to fold. Destinations store segments their own way (a
//! file, a row); what is in one and how it is checked is decided here.

use serde::{Deserialize, Serialize};

use crate::destination::{CommittedTransaction, HistoryPolicy, HistoryTally};
use crate::envelope::PayloadKind;
use crate::handle::{decode_payload, encode_payload, HandleError, TransactionHandle};
use crate::ids::{CheckpointId, LineageId, RunId, TransactionId};

/// One committed transaction inside a segment: what rewind detection,
/// reconcile and inspect read of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SegmentEntry {
    transaction: TransactionId,
    checkpoint: CheckpointId,
    subtask: u32,
    records: u64,
    committed_at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SegmentBody {
    lineage: LineageId,
    run: RunId,
    entries: Vec<SegmentEntry>,
}

/// Encodes committed transactions of ONE lineage and run (the caller
/// groups them) into a segment, in the versioned envelope.
pub fn encode_segment(lineage: LineageId, run: &RunId, txns: &[CommittedTransaction]) -> Vec<u8> {
    let body = SegmentBody {
        lineage,
        run: run.clone(),
        entries: txns
            .iter()
            .map(|c| SegmentEntry {
                transaction: c.transaction.clone(),
                checkpoint: c.checkpoint,
                subtask: c.subtask,
                records: c.records,
                committed_at_ms: c.committed_at_ms,
            })
            .collect(),
    };
    encode_payload(PayloadKind::HistorySegment, &body)
}

/// Decodes a segment read back from a destination and checks it: every
/// entry a transaction id of `sink`, with the subtask its id names, and
/// (when given) the lineage and run the segment is filed under. Any
/// input, however damaged, gives an error, never a panic.
pub fn decode_segment(
    bytes: &[u8],
    sink: &crate::ids::SinkId,
    filed_as: Option<(LineageId, &RunId)>,
) -> Result<Vec<CommittedTransaction>, HandleError> {
    let body: SegmentBody = decode_payload(PayloadKind::HistorySegment, bytes)?;
    if let Some((lineage, run)) = filed_as {
        if body.lineage != lineage || &body.run != run {
            return Err(HandleError::Invalid(format!(
                "the segment holds lineage {} run {}, but is filed under lineage {lineage} run \
                 {run}",
                body.lineage, body.run
            )));
        }
    }
    RunId::new(body.run.as_str()).map_err(|e| HandleError::Invalid(e.to_string()))?;
    let mut out = Vec::with_capacity(body.entries.len());
    for e in body.entries {
        let parsed = TransactionId::parse(e.transaction.as_str()).ok_or_else(|| {
            HandleError::Invalid(format!(
                "{:?} in a history segment is not a transaction id",
                e.transaction.as_str()
            ))
        })?;
        if &parsed.sink != sink || parsed.subtask != e.subtask || e.checkpoint == 0 {
            return Err(HandleError::Invalid(format!(
                "history segment entry {} (subtask {}, checkpoint {}) is not a committed \
                 transaction of sink '{sink}'",
                e.transaction, e.subtask, e.checkpoint
            )));
        }
        out.push(CommittedTransaction {
            transaction: parsed.id,
            lineage: body.lineage,
            checkpoint: e.checkpoint,
            subtask: e.subtask,
            run: body.run.clone(),
            records: e.records,
            committed_at_ms: e.committed_at_ms,
        });
    }
    Ok(out)
}

/// What a compaction folds, chosen from the single records of a sink:
/// per lineage, the records at least `keep_checkpoints` checkpoints behind
/// that lineage's latest one, and only if there are at least
/// `min_segment` of them; grouped by run and cut at `max_segment`, each
/// group sorted by checkpoint and transaction. Returns groups of indices
/// into `loose`.
pub fn plan_compaction(loose: &[CommittedTransaction], policy: &HistoryPolicy) -> Vec<Vec<usize>> {
    use std::collections::BTreeMap;
    let mut latest: BTreeMap<LineageId, CheckpointId> = BTreeMap::new();
    for c in loose {
        let l = latest.entry(c.lineage).or_default();
        *l = (*l).max(c.checkpoint);
    }
    let mut behind: BTreeMap<LineageId, Vec<usize>> = BTreeMap::new();
    for (i, c) in loose.iter().enumerate() {
        let watermark = latest[&c.lineage].saturating_sub(policy.keep_checkpoints);
        if c.checkpoint <= watermark {
            behind.entry(c.lineage).or_default().push(i);
        }
    }
    let mut groups = Vec::new();
    for (_, idx) in behind {
        if idx.len() < policy.min_segment.max(1) {
            continue;
        }
        let mut by_run: BTreeMap<&RunId, Vec<usize>> = BTreeMap::new();
        for i in idx {
            by_run.entry(&loose[i].run).or_default().push(i);
        }
        for (_, mut idx) in by_run {
            idx.sort_by(|&a, &b| {
                (loose[a].checkpoint, &loose[a].transaction)
                    .cmp(&(loose[b].checkpoint, &loose[b].transaction))
            });
            for chunk in idx.chunks(policy.max_segment.max(1)) {
                groups.push(chunk.to_vec());
            }
        }
    }
    groups
}

/// What a segment's name says about it. The filesystem destination names
/// its segment files so, and the object-store destination its segment
/// objects: the name says what it holds (lineage, checkpoints,
/// transactions, records, run), so that summaries (how much each lineage
/// and run committed, which checkpoints a segment covers) come from a
/// listing, without reading the records.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SegmentName {
    pub lineage: LineageId,
    pub first: CheckpointId,
    pub last: CheckpointId,
    pub transactions: u64,
    pub records: u64,
    pub nonce: u64,
    pub run: RunId,
}

impl SegmentName {
    /// `<lineage>.<first>.<last>.<transactions>.<records>.<nonce>.<run>`.
    pub fn render(&self) -> String {
        format!(
            "{}.{}.{}.{}.{}.{:016x}.{}",
            self.lineage,
            self.first,
            self.last,
            self.transactions,
            self.records,
            self.nonce,
            self.run
        )
    }

    /// `None` for anything that is not exactly such a name.
    pub fn parse(name: &str) -> Option<SegmentName> {
        let mut it = name.splitn(7, '.');
        let lineage = it.next()?;
        if lineage.len() != 16 || !lineage.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let parsed = SegmentName {
            lineage: LineageId(u64::from_str_radix(lineage, 16).ok()?),
            first: it.next()?.parse().ok()?,
            last: it.next()?.parse().ok()?,
            transactions: it.next()?.parse().ok()?,
            records: it.next()?.parse().ok()?,
            nonce: u64::from_str_radix(it.next()?, 16).ok()?,
            run: RunId::new(it.next()?).ok()?,
        };
        (parsed.first <= parsed.last && parsed.transactions > 0 && parsed.render() == name)
            .then_some(parsed)
    }

    /// Could this segment hold a record of `checkpoint` in `lineage`?
    pub fn covers(&self, lineage: LineageId, checkpoint: CheckpointId) -> bool {
        self.lineage == lineage && self.first <= checkpoint && checkpoint <= self.last
    }

    /// The name of a new segment holding `records` (one lineage and run,
    /// at least one record), with a random nonce.
    pub fn of<R: AsRef<TransactionHandle>>(records: &[R]) -> SegmentName {
        let mut name = Self::tally(records);
        name.nonce = crate::ids::random_u64();
        name
    }

    /// What a name for `records` says (one lineage and run, at least one
    /// record), nonce 0: to check a segment's records against its name.
    pub fn tally<R: AsRef<TransactionHandle>>(records: &[R]) -> SegmentName {
        let first = records[0].as_ref();
        let checkpoints = records.iter().filter_map(|r| r.as_ref().checkpoint());
        SegmentName {
            lineage: first.lineage,
            first: checkpoints.clone().min().unwrap_or_default(),
            last: checkpoints.max().unwrap_or_default(),
            transactions: records.len() as u64,
            records: records
                .iter()
                .map(|r| r.as_ref().prepared().map_or(0, |p| p.records))
                .fold(0, u64::saturating_add),
            nonce: 0,
            run: first.run.clone(),
        }
    }

    /// Adds what this segment holds, from its name alone, to the sums per
    /// lineage and run in `tallies`.
    pub fn add_to(&self, tallies: &mut Vec<HistoryTally>) {
        HistoryTally::add(
            tallies,
            HistoryTally {
                lineage: self.lineage,
                run: self.run.clone(),
                transactions: self.transactions,
                records: self.records,
                first_checkpoint: self.first,
                last_checkpoint: self.last,
            },
        );
    }

    /// This segment as [`plan_merge`] sees it.
    pub fn info(&self) -> SegmentInfo {
        SegmentInfo {
            lineage: self.lineage,
            run: self.run.clone(),
            first: self.first,
            transactions: self.transactions,
        }
    }
}

/// A segment as a destination lists it, for [`plan_merge`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    pub lineage: LineageId,
    pub run: RunId,
    pub first: CheckpointId,
    pub transactions: u64,
}

/// Which small segments to merge, so that the number of segments grows
/// with the history divided by `max_segment`, not by what one compaction
/// folds: per lineage and run, segments under half of `max_segment`, in
/// checkpoint order, grouped while the sum stays within `max_segment`;
/// only groups of two or more. Returns groups of indices into `segments`.
pub fn plan_merge(segments: &[SegmentInfo], policy: &HistoryPolicy) -> Vec<Vec<usize>> {
    use std::collections::BTreeMap;
    let max = policy.max_segment.max(1) as u64;
    let mut small: BTreeMap<(LineageId, &RunId), Vec<usize>> = BTreeMap::new();
    for (i, s) in segments.iter().enumerate() {
        if s.transactions < max / 2 {
            small.entry((s.lineage, &s.run)).or_default().push(i);
        }
    }
    let mut groups = Vec::new();
    for (_, mut idx) in small {
        idx.sort_by_key(|&i| segments[i].first);
        let mut group: Vec<usize> = Vec::new();
        let mut sum = 0;
        for i in idx {
            let n = segments[i].transactions;
            if sum + n > max && !group.is_empty() {
                if group.len() > 1 {
                    groups.push(std::mem::take(&mut group));
                } else {
                    group.clear();
                }
                sum = 0;
            }
            group.push(i);
            sum += n;
        }
        if group.len() > 1 {
            groups.push(group);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SinkId;

    fn committed(sink: &SinkId, run: &str, checkpoint: u64, subtask: u32) -> CommittedTransaction {
        CommittedTransaction {
            transaction: TransactionId::compose(sink, subtask, 7, checkpoint),
            lineage: LineageId(5),
            checkpoint,
            subtask,
            run: RunId::new(run).unwrap(),
            records: checkpoint * 10,
            committed_at_ms: 1_000 + checkpoint,
        }
    }

    #[test]
    fn a_segment_reads_back_and_refuses_what_it_is_not() {
        let sink = SinkId::new("orders").unwrap();
        let run = RunId::new("run-a").unwrap();
        let txns: Vec<_> = (1..=5).map(|c| committed(&sink, "run-a", c, 1)).collect();
        let bytes = encode_segment(LineageId(5), &run, &txns);
        assert_eq!(
            decode_segment(&bytes, &sink, Some((LineageId(5), &run))).unwrap(),
            txns
        );
        // Filed under another lineage or run, or read as another sink's.
        assert!(decode_segment(&bytes, &sink, Some((LineageId(6), &run))).is_err());
        let other_run = RunId::new("run-b").unwrap();
        assert!(decode_segment(&bytes, &sink, Some((LineageId(5), &other_run))).is_err());
        assert!(decode_segment(&bytes, &SinkId::new("other").unwrap(), None).is_err());
        // Every cut and every flipped byte is an error, never a panic.
        for cut in 0..bytes.len() {
            assert!(decode_segment(&bytes[..cut], &sink, None).is_err());
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x41;
            assert!(decode_segment(&b, &sink, None).is_err(), "byte {i}");
        }
    }

    #[test]
    fn small_segments_merge_per_lineage_and_run_within_the_bound() {
        let seg = |lineage, run: &str, first, transactions| SegmentInfo {
            lineage: LineageId(lineage),
            run: RunId::new(run).unwrap(),
            first,
            transactions,
        };
        let policy = HistoryPolicy {
            max_segment: 10,
            ..HistoryPolicy::default()
        };
        let segments = vec![
            seg(1, "a", 30, 3),
            seg(1, "a", 10, 4),
            seg(1, "a", 20, 4),
            seg(1, "a", 40, 9), // not small: stays
            seg(1, "b", 50, 2), // alone in its run: stays
            seg(2, "a", 60, 1),
            seg(2, "a", 70, 1),
        ];
        let groups = plan_merge(&segments, &policy);
        assert_eq!(groups, vec![vec![1, 2], vec![5, 6]]);
        for g in &groups {
            assert!(g.iter().map(|&i| segments[i].transactions).sum::<u64>() <= 10);
        }
        assert!(plan_merge(&segments[3..5], &policy).is_empty());
    }

    #[test]
    fn compaction_folds_only_behind_the_watermark_and_only_enough() {
        let sink = SinkId::new("orders").unwrap();
        let mut loose = Vec::new();
        for c in 1..=30 {
            loose.push(committed(
                &sink,
                if c <= 10 { "run-a" } else { "run-b" },
                c,
                0,
            ));
            loose.push(committed(
                &sink,
                if c <= 10 { "run-a" } else { "run-b" },
                c,
                1,
            ));
        }
        let policy = HistoryPolicy {
            keep_checkpoints: 10,
            min_segment: 8,
            max_segment: 12,
            every_commits: 1,
        };
        let groups = plan_compaction(&loose, &policy);
        let folded: Vec<&CommittedTransaction> =
            groups.iter().flatten().map(|&i| &loose[i]).collect();
        // Checkpoints 1..=20 are behind the watermark (30 - 10): 40 records.
        assert_eq!(folded.len(), 40);
        assert!(folded.iter().all(|c| c.checkpoint <= 20));
        for g in &groups {
            assert!(g.len() <= 12);
            assert!(g.iter().all(|&i| loose[i].run == loose[g[0]].run));
            assert!(g
                .windows(2)
                .all(|w| loose[w[0]].checkpoint <= loose[w[1]].checkpoint));
        }
        // Too few behind the watermark: nothing.
        let few = HistoryPolicy {
            min_segment: 41,
            ..policy
        };
        assert!(plan_compaction(&loose, &few).is_empty());
    }

    #[test]
    fn segment_names_round_trip_and_reject_variants() {
        let s = SegmentName {
            lineage: LineageId(0xab),
            first: 3,
            last: 90,
            transactions: 12,
            records: 3456,
            nonce: 0x1234,
            run: RunId::new("a1b2-run_x").unwrap(),
        };
        let name = s.render();
        assert_eq!(SegmentName::parse(&name), Some(s.clone()));
        for bad in [
            name.replace(".3.", ".03."),
            name.replace(".90.", ".2."),
            name.replace(".12.", ".0."),
            name.replace("0000000000001234", "1234"),
            format!("{name}.x"),
            name.replace("a1b2-run_x", "a1b2/run"),
            name.replace("a1b2-run_x", ""),
            "00000000000000ab".to_string(),
            "x".to_string(),
        ] {
            assert_eq!(SegmentName::parse(&bad), None, "{bad:?}");
        }
    }
}
