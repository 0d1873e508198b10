//! The destination's side of the compacted history (see `crate::history`
//! for the layout and why every change goes through the index): reading
//! folded records, compacting, and retracting from segments.

use std::collections::{BTreeMap, BTreeSet};

use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use twopc_core::destination::{CommittedTransaction, Compaction, HistoryPolicy, HistoryTally};
use twopc_core::error::{DestinationError, DestinationErrorKind};
use twopc_core::ids::{CheckpointId, LineageId, TransactionId};

use super::{path, ObjectStoreDestination};
use crate::control::{decode, encode, CommitRecord, ControlObject, MAX_CONTROL_OBJECT};
use crate::history::{
    check_segment, encode_segment, fits, folded_copy, split_to_fit, HistoryIndex, SegmentName,
};
use crate::names::{commit_record_name, parse_commit_record_name, COMMITTED, HISTORY};

/// Versions of the index a reader or a rewriter goes through before it
/// gives up (each round means that someone else changed the history).
const ROUNDS: usize = 8;

/// One version of the index, and what a conditional replacement of it
/// names.
pub(crate) struct IndexVersion {
    pub index: HistoryIndex,
    pub version: UpdateVersion,
}

/// How a conditional replacement of the index went.
enum Replaced {
    Won,
    /// Someone else replaced it first; the index now (if any).
    Lost(Option<HistoryIndex>),
}

/// Per lineage: transactions committed, the latest checkpoint, and the
/// records of that checkpoint.
pub(super) type LineageView = BTreeMap<LineageId, (u64, CheckpointId, Vec<CommitRecord>)>;

/// What the summaries count (see `counted_view`).
struct CountedView {
    singles: Vec<CommitRecord>,
    at: Option<IndexVersion>,
    both: BTreeSet<TransactionId>,
}

/// A single record's (lineage, checkpoint, transaction), from its name.
type RecordKey = (LineageId, CheckpointId, TransactionId);

fn key_of(r: &CommitRecord) -> RecordKey {
    let h = &r.handle;
    (
        h.lineage,
        h.checkpoint().unwrap_or_default(),
        h.transaction.clone(),
    )
}

impl ObjectStoreDestination {
    fn segment_key(&self, seg: &SegmentName) -> String {
        self.layout.control(HISTORY, &seg.render())
    }

    /// The index as it is now, `None` when there is none (no history was
    /// ever folded).
    pub(super) async fn read_index(&self) -> Result<Option<IndexVersion>, DestinationError> {
        let key = self.layout.history_index();
        let got = match self.store.get(&path(&key)?).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.err("reading", &key, e)),
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        if got.meta.size > MAX_CONTROL_OBJECT as u64 {
            return Err(self.corrupt(format!(
                "the history index {key} has {} bytes, more than an index of twopc has; restore \
                 it from a backup or a bucket version",
                got.meta.size
            )));
        }
        let bytes = got
            .bytes()
            .await
            .map_err(|e| self.err("reading", &key, e))?;
        match decode(&bytes) {
            Ok(ControlObject::HistoryIndex(index)) if index.sink == self.layout.sink => {
                Ok(Some(IndexVersion { index, version }))
            }
            Ok(ControlObject::HistoryIndex(index)) => Err(self.corrupt(format!(
                "{key} is the history index of sink '{}', not of this sink: it was copied here. \
                 Restore this sink's index from a backup or a bucket version",
                index.sink
            ))),
            Ok(_) => Err(self.corrupt(format!(
                "{key} is not a history index; restore it from a backup or a bucket version"
            ))),
            Err(e) => Err(self.corrupt(format!(
                "the history index {key} does not decode ({e}); restore it from a backup or a \
                 bucket version (the segments it listed are the objects under {})",
                self.layout.area(HISTORY)
            ))),
        }
    }

    /// The index, created empty when there is none yet. Segments are only
    /// ever written once an index exists, so segments without one mean it
    /// was removed outside twopc: refused, nothing is touched.
    async fn index_or_create(&self) -> Result<IndexVersion, DestinationError> {
        if let Some(v) = self.read_index().await? {
            return Ok(v);
        }
        let segments: Vec<String> = self
            .names_in(HISTORY)
            .await?
            .into_iter()
            .filter(|n| SegmentName::parse(n).is_some())
            .collect();
        if let Some(first) = segments.first() {
            // A compaction that started meanwhile creates the index before
            // its first segment: look again before calling it damage.
            if let Some(v) = self.read_index().await? {
                return Ok(v);
            }
            return Err(self.corrupt(format!(
                "the history index {} is missing, but {} history segments exist under {} (the \
                 first: {first}): it was removed outside twopc, and without it the folded commit \
                 records are not read. Restore it from a backup or a bucket version",
                self.layout.history_index(),
                segments.len(),
                self.layout.area(HISTORY)
            )));
        }
        let key = self.layout.history_index();
        let index = HistoryIndex::empty(&self.layout.sink);
        let put = self
            .store
            .put_opts(
                &path(&key)?,
                PutPayload::from(encode(&ControlObject::HistoryIndex(index.clone()))),
                PutOptions::from(PutMode::Create),
            )
            .await;
        match put {
            Ok(result) => Ok(IndexVersion {
                index,
                version: UpdateVersion::from(result),
            }),
            // Another writer (or our own first try) created it.
            Err(object_store::Error::AlreadyExists { .. }) => {
                self.read_index().await?.ok_or_else(|| {
                    DestinationError::new(
                        DestinationErrorKind::Io,
                        format!("{key} was created and vanished at once; try again"),
                    )
                })
            }
            Err(e) => Err(self.err("creating", &key, e)),
        }
    }

    /// Replaces the index read as `from` by `next`, if nobody replaced it
    /// meanwhile. A failed condition is read back: the resend of a write
    /// the server applied fails its condition too, and then the index is
    /// `next` itself. Any other failure is an error: the outcome is
    /// unknown, and the caller deletes nothing.
    async fn replace_index(
        &self,
        from: &IndexVersion,
        next: &HistoryIndex,
    ) -> Result<Replaced, DestinationError> {
        let key = self.layout.history_index();
        let bytes = encode(&ControlObject::HistoryIndex(next.clone()));
        // Larger than a control object, or beyond what the decoder accepts.
        if bytes.len() > MAX_CONTROL_OBJECT || decode(&bytes).is_err() {
            return Err(DestinationError::new(
                DestinationErrorKind::StorageFull,
                format!(
                    "sink '{}': the history index {key} would list {} segments ({} bytes), more \
                     than an index holds; the commit history is not compacted further. Raise \
                     the history's max segment size, or start a new sink id",
                    self.layout.sink,
                    next.segments.len(),
                    bytes.len()
                ),
            ));
        }
        let put = self
            .store
            .put_opts(
                &path(&key)?,
                PutPayload::from(bytes),
                PutOptions::from(PutMode::Update(from.version.clone())),
            )
            .await;
        match put {
            Ok(_) => Ok(Replaced::Won),
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. }
                | object_store::Error::NotFound { .. },
            ) => match self.read_index().await? {
                Some(now) if now.index.same_version(next) => Ok(Replaced::Won),
                now => Ok(Replaced::Lost(now.map(|v| v.index))),
            },
            Err(e) => Err(self.err("replacing the history index", &key, e)),
        }
    }

    /// The records of `seg`, listed by the index read as `from`, checked
    /// one by one and against the name. `None` when the segment is gone
    /// because the index changed since (read it again); an error when it
    /// is gone under an unchanged index, or damaged.
    async fn read_segment(
        &self,
        seg: &SegmentName,
        from: &IndexVersion,
    ) -> Result<Option<Vec<CommitRecord>>, DestinationError> {
        let key = self.segment_key(seg);
        let Some(bytes) = self.get_small(&key, MAX_CONTROL_OBJECT).await? else {
            let now = self.read_index().await?;
            if now.is_some_and(|n| n.version.e_tag == from.version.e_tag) {
                return Err(self.corrupt(format!(
                    "the history index {} lists segment {key}, which is missing: it was removed \
                     outside twopc. Restore it from a backup or a bucket version",
                    self.layout.history_index()
                )));
            }
            return Ok(None);
        };
        let bad = |what: String| {
            self.corrupt(format!(
                "history segment {key}: {what}; restore it from a backup or a bucket version \
                 (the commit records it holds are what restores and rewinds read)"
            ))
        };
        let records = match decode(&bytes) {
            Ok(ControlObject::Segment(records)) => records,
            Ok(_) => return Err(bad("it is not a history segment".to_string())),
            Err(e) => return Err(bad(format!("it does not decode ({e})"))),
        };
        check_segment(&records, seg, &self.layout).map_err(bad)?;
        Ok(Some(records))
    }

    /// Writes a new segment (never replacing one).
    async fn write_segment(
        &self,
        seg: &SegmentName,
        records: &[CommitRecord],
    ) -> Result<(), DestinationError> {
        let key = self.segment_key(seg);
        let bytes = encode_segment(records);
        if bytes.len() > MAX_CONTROL_OBJECT || decode(&bytes).is_err() {
            // `fits` and `effective` keep segments within the bounds.
            return Err(DestinationError::new(
                DestinationErrorKind::StorageFull,
                format!(
                    "sink '{}': the history segment {key} of {} records would not read back                      ({} bytes); lower the history's max segment size",
                    self.layout.sink,
                    records.len(),
                    bytes.len()
                ),
            ));
        }
        if !self.put(&key, bytes.clone(), PutMode::Create).await? {
            // The name has a random nonce: only our own first try, whose
            // answer was lost, can have written it.
            match self.get_small(&key, MAX_CONTROL_OBJECT).await? {
                Some(there) if there[..] == bytes[..] => {}
                _ => {
                    return Err(self.corrupt(format!(
                        "{key} exists with other content than the segment written under its \
                         name; move it away"
                    )))
                }
            }
        }
        Ok(())
    }

    /// The folded records of the segments `pick` selects, all read from
    /// one version of the index, each transaction once.
    pub(super) async fn folded(
        &self,
        pick: impl Fn(&SegmentName) -> bool,
    ) -> Result<Vec<CommitRecord>, DestinationError> {
        'again: for _ in 0..ROUNDS {
            let Some(at) = self.read_index().await? else {
                return Ok(Vec::new());
            };
            let mut by_txn = BTreeMap::new();
            for seg in at.index.segments.iter().filter(|s| pick(s)) {
                let Some(records) = self.read_segment(seg, &at).await? else {
                    continue 'again;
                };
                for r in records {
                    by_txn.insert(r.handle.transaction.clone(), r);
                }
            }
            return Ok(by_txn.into_values().collect());
        }
        Err(self.kept_changing("read"))
    }

    fn kept_changing(&self, what: &str) -> DestinationError {
        DestinationError::new(
            DestinationErrorKind::Io,
            format!(
                "sink '{}': the history index {} kept changing while the history was {what} \
                 (other subtasks compacting or retracting); try again",
                self.layout.sink,
                self.layout.history_index()
            ),
        )
    }

    /// The folded commit record of `txn`, committed for `checkpoint` of
    /// `lineage`, if a segment holds it.
    pub(super) async fn find_folded(
        &self,
        lineage: LineageId,
        checkpoint: CheckpointId,
        txn: &TransactionId,
    ) -> Result<Option<CommitRecord>, DestinationError> {
        Ok(self
            .folded(|s| s.covers(lineage, checkpoint))
            .await?
            .into_iter()
            .find(|r| &r.handle.transaction == txn))
    }

    /// The single records among `names` that `pick` selects, read and
    /// checked; those deleted since the listing are left out.
    pub(super) async fn read_singles(
        &self,
        names: &[String],
        pick: impl Fn(LineageId, CheckpointId) -> bool,
    ) -> Result<Vec<CommitRecord>, DestinationError> {
        let mut out = Vec::new();
        for name in names {
            let Some((l, c, _)) = parse_commit_record_name(name) else {
                log::warn!(
                    "sink '{}': ignoring {}{name}: not a commit record name",
                    self.layout.sink,
                    self.layout.area(COMMITTED)
                );
                continue;
            };
            if pick(l, c) {
                if let Some(r) = self.read_single_record(name).await? {
                    out.push(r);
                }
            }
        }
        Ok(out)
    }

    /// Every commit record (single ones first, then folded ones) that
    /// `pick` selects, each transaction once.
    pub(super) async fn all_records(
        &self,
        pick: impl Fn(LineageId, CheckpointId) -> bool + Copy,
        pick_segment: impl Fn(&SegmentName) -> bool,
    ) -> Result<Vec<CommitRecord>, DestinationError> {
        let names = self.names_in(COMMITTED).await?;
        let singles = self.read_singles(&names, pick).await?;
        let mut by_txn: BTreeMap<TransactionId, CommitRecord> = self
            .folded(pick_segment)
            .await?
            .into_iter()
            .filter(|r| pick(key_of(r).0, key_of(r).1))
            .map(|r| (r.handle.transaction.clone(), r))
            .collect();
        for r in singles {
            by_txn.insert(r.handle.transaction.clone(), r);
        }
        Ok(by_txn.into_values().collect())
    }

    /// Commit records of `lineage` after `checkpoint`, single and folded.
    pub(super) async fn records_after(
        &self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommitRecord>, DestinationError> {
        self.all_records(
            move |l, c| l == lineage && c > checkpoint,
            move |s| s.lineage == lineage && s.last > checkpoint,
        )
        .await
    }

    /// Which of `loose` (single records) a live segment of `at` holds as
    /// well (a compaction stopped between its index and its deletions).
    /// Only segments whose name covers one of them are read: none, unless
    /// a compaction was interrupted or a rewind made checkpoints repeat.
    /// `None` when the index changed meanwhile.
    async fn folded_among(
        &self,
        loose: &[RecordKey],
        at: &IndexVersion,
    ) -> Result<Option<BTreeSet<TransactionId>>, DestinationError> {
        let mut out = BTreeSet::new();
        for seg in at
            .index
            .segments
            .iter()
            .filter(|s| loose.iter().any(|(l, c, _)| s.covers(*l, *c)))
        {
            let Some(records) = self.read_segment(seg, at).await? else {
                return Ok(None);
            };
            for r in records {
                if loose.iter().any(|k| k.2 == r.handle.transaction) {
                    out.insert(r.handle.transaction);
                }
            }
        }
        Ok(Some(out))
    }

    /// The single records, then the index read after them, with the
    /// singles a live segment holds too: what the tallies count, each
    /// transaction once. Singles first: one deleted after it was read was
    /// folded into a segment that the later index lists (and `both` has it
    /// then).
    async fn counted_view(&self) -> Result<CountedView, DestinationError> {
        for _ in 0..ROUNDS {
            let names = self.names_in(COMMITTED).await?;
            let singles = self.read_singles(&names, |_, _| true).await?;
            let Some(at) = self.read_index().await? else {
                return Ok(CountedView {
                    singles,
                    at: None,
                    both: BTreeSet::new(),
                });
            };
            let keys: Vec<RecordKey> = names
                .iter()
                .filter_map(|n| parse_commit_record_name(n))
                .collect();
            if let Some(both) = self.folded_among(&keys, &at).await? {
                return Ok(CountedView {
                    singles,
                    at: Some(at),
                    both,
                });
            }
        }
        Err(self.kept_changing("counted"))
    }

    /// Tallies per lineage and run: the segments' from their names, the
    /// single records' from the records.
    pub(super) async fn tallies(&self) -> Result<Vec<HistoryTally>, DestinationError> {
        let view = self.counted_view().await?;
        let mut out = Vec::new();
        if let Some(at) = &view.at {
            at.index.tallies(&mut out);
        }
        for r in &view.singles {
            if !view.both.contains(&r.handle.transaction) {
                twopc_core::destination::tally(&mut out, &r.view());
            }
        }
        Ok(out)
    }

    /// Per lineage: how many transactions were committed, the latest
    /// checkpoint (from the names of single records and segments), and the
    /// records of that checkpoint (single ones, then folded ones), all from
    /// one listing and one version of the index.
    pub(super) async fn lineage_view(&self) -> Result<LineageView, DestinationError> {
        'again: for _ in 0..ROUNDS {
            // Single records first: the names, and the records of each
            // lineage's latest single checkpoint; then the index.
            let names = self.names_in(COMMITTED).await?;
            let keys: Vec<RecordKey> = names
                .iter()
                .filter_map(|n| parse_commit_record_name(n))
                .collect();
            let mut single_last: BTreeMap<LineageId, CheckpointId> = BTreeMap::new();
            for (l, c, _) in &keys {
                let e = single_last.entry(*l).or_insert(*c);
                *e = (*e).max(*c);
            }
            let singles = self
                .read_singles(&names, |l, c| single_last.get(&l) == Some(&c))
                .await?;
            let at = self.read_index().await?;
            let both = match &at {
                Some(at) => match self.folded_among(&keys, at).await? {
                    Some(both) => both,
                    None => continue 'again,
                },
                None => BTreeSet::new(),
            };
            let mut by: BTreeMap<LineageId, (u64, CheckpointId)> = BTreeMap::new();
            for (l, c, txn) in &keys {
                let e = by.entry(*l).or_insert((0, *c));
                if !both.contains(txn) {
                    e.0 += 1;
                }
                e.1 = e.1.max(*c);
            }
            for s in at.iter().flat_map(|a| a.index.segments.iter()) {
                let e = by.entry(s.lineage).or_insert((0, s.last));
                e.0 = e.0.saturating_add(s.transactions);
                e.1 = e.1.max(s.last);
            }
            let mut out = BTreeMap::new();
            for (lineage, (count, last)) in by {
                let mut latest: BTreeMap<TransactionId, CommitRecord> = BTreeMap::new();
                if let Some(at) = &at {
                    for seg in at.index.segments.iter().filter(|s| s.covers(lineage, last)) {
                        let Some(records) = self.read_segment(seg, at).await? else {
                            continue 'again;
                        };
                        for r in records.into_iter().filter(|r| key_of(r).1 == last) {
                            latest.insert(r.handle.transaction.clone(), r);
                        }
                    }
                }
                for r in singles
                    .iter()
                    .filter(|r| key_of(r).0 == lineage && key_of(r).1 == last)
                {
                    latest.insert(r.handle.transaction.clone(), r.clone());
                }
                out.insert(lineage, (count, last, latest.into_values().collect()));
            }
            return Ok(out);
        }
        Err(self.kept_changing("summed"))
    }

    /// Removes a retracted transaction from the segments (the caller
    /// deleted its object and its single record first). Always replaces
    /// the index, even when no segment holds it: that is what makes a
    /// compaction that read its single record before the deletion fail
    /// (see `crate::history`).
    pub(super) async fn retract_folded(
        &self,
        c: &CommittedTransaction,
    ) -> Result<(), DestinationError> {
        'again: for _ in 0..ROUNDS {
            let at = self.index_or_create().await?;
            let mut replaced = Vec::new();
            let mut written: Vec<SegmentName> = Vec::new();
            for seg in at
                .index
                .segments
                .iter()
                .filter(|s| s.covers(c.lineage, c.checkpoint))
            {
                let Some(records) = self.read_segment(seg, &at).await? else {
                    self.remove_unlisted(&written, None).await?;
                    continue 'again;
                };
                if !records
                    .iter()
                    .any(|r| r.handle.transaction == c.transaction)
                {
                    continue;
                }
                let rest: Vec<CommitRecord> = records
                    .into_iter()
                    .filter(|r| r.handle.transaction != c.transaction)
                    .collect();
                if !rest.is_empty() {
                    let name = SegmentName::of(&rest);
                    self.write_segment(&name, &rest).await?;
                    written.push(name);
                }
                replaced.push(seg.clone());
            }
            let mut segments: Vec<SegmentName> = at
                .index
                .segments
                .iter()
                .filter(|s| !replaced.contains(s))
                .cloned()
                .collect();
            segments.extend(written.iter().cloned());
            let next = at.index.next(segments);
            match self.replace_index(&at, &next).await? {
                Replaced::Won => {
                    for seg in &replaced {
                        self.delete(&self.segment_key(seg)).await?;
                    }
                    return Ok(());
                }
                Replaced::Lost(now) => {
                    self.remove_unlisted(&written, now.as_ref()).await?;
                }
            }
        }
        Err(self.kept_changing("rewritten"))
    }

    /// Deletes the segments among `written` that `index` does not list (all
    /// of them without an index).
    async fn remove_unlisted(
        &self,
        written: &[SegmentName],
        index: Option<&HistoryIndex>,
    ) -> Result<(), DestinationError> {
        for seg in written {
            if !index.is_some_and(|i| i.segments.contains(seg)) {
                self.delete(&self.segment_key(seg)).await?;
            }
        }
        Ok(())
    }

    /// Folds single records behind the policy's watermark into new
    /// segments and merges small ones, in one replacement of the index;
    /// then deletes what it folded and replaced, and leftovers of earlier
    /// attempts (see `crate::history`).
    pub(super) async fn compact(
        &self,
        policy: &HistoryPolicy,
    ) -> Result<Compaction, DestinationError> {
        let busy = Compaction {
            busy: true,
            ..Compaction::default()
        };
        // The index first, then everything else: a change of the history
        // after this read makes the replacement below fail.
        let at = self.index_or_create().await?;
        let live: BTreeSet<String> = at.index.segments.iter().map(SegmentName::render).collect();
        let leftovers: Vec<String> = self
            .names_in(HISTORY)
            .await?
            .into_iter()
            .filter(|n| SegmentName::parse(n).is_some() && !live.contains(n))
            .collect();
        let names = self.names_in(COMMITTED).await?;
        let mut loose = if names.len() >= policy.min_segment.max(1) {
            self.read_singles(&names, |_, _| true).await?
        } else {
            Vec::new()
        };
        // Single records a live segment holds already (a compaction stopped
        // after its index) just go.
        let keys: Vec<RecordKey> = loose.iter().map(key_of).collect();
        let Some(both) = self.folded_among(&keys, &at).await? else {
            return Ok(busy);
        };
        for r in loose
            .iter()
            .filter(|r| both.contains(&r.handle.transaction))
        {
            let (l, c, t) = key_of(r);
            self.delete(
                &self
                    .layout
                    .control(COMMITTED, &commit_record_name(l, c, &t)),
            )
            .await?;
        }
        loose.retain(|r| !both.contains(&r.handle.transaction));

        let mut done = Compaction::default();
        // New segments from the single records behind the watermark.
        let views: Vec<CommittedTransaction> = loose.iter().map(CommitRecord::view).collect();
        let mut fresh: Vec<(SegmentName, Vec<CommitRecord>)> = Vec::new();
        let mut folded: Vec<usize> = Vec::new();
        for group in twopc_core::history::plan_compaction(&views, policy) {
            let records: Vec<CommitRecord> =
                group.iter().map(|&i| folded_copy(&loose[i])).collect();
            for piece in split_to_fit(records) {
                fresh.push((SegmentName::of(&piece), piece));
                done.segments += 1;
            }
            done.folded += group.len() as u64;
            folded.extend(group);
        }
        // Small segments merged, the new ones among them.
        let old = at.index.segments.len();
        let all: Vec<SegmentName> = at
            .index
            .segments
            .iter()
            .cloned()
            .chain(fresh.iter().map(|(n, _)| n.clone()))
            .collect();
        let infos: Vec<_> = all.iter().map(SegmentName::info).collect();
        let mut absorbed: BTreeSet<usize> = BTreeSet::new();
        let mut merged_out: Vec<(SegmentName, Vec<CommitRecord>)> = Vec::new();
        for group in twopc_core::history::plan_merge(&infos, policy) {
            let mut by_txn = BTreeMap::new();
            for &i in &group {
                let records = if i < old {
                    match self.read_segment(&all[i], &at).await? {
                        Some(r) => r,
                        // Replaced since the index was read: so would be
                        // the index, and the replacement would fail.
                        None => return Ok(busy),
                    }
                } else {
                    fresh[i - old].1.clone()
                };
                for r in records {
                    by_txn.insert(r.handle.transaction.clone(), r);
                }
            }
            let mut records: Vec<CommitRecord> = by_txn.into_values().collect();
            records.sort_by(|a, b| {
                (a.handle.checkpoint(), &a.handle.transaction)
                    .cmp(&(b.handle.checkpoint(), &b.handle.transaction))
            });
            if records.is_empty() || !fits(&records) {
                continue; // records longer than the bound assumed: left as they are
            }
            merged_out.push((SegmentName::of(&records), records));
            done.merged += group.len() as u64;
            absorbed.extend(group);
        }
        let to_write: Vec<&(SegmentName, Vec<CommitRecord>)> = fresh
            .iter()
            .enumerate()
            .filter(|(i, _)| !absorbed.contains(&(old + i)))
            .map(|(_, s)| s)
            .chain(merged_out.iter())
            .collect();
        let replaced: Vec<&SegmentName> = (0..old)
            .filter(|i| absorbed.contains(i))
            .map(|i| &all[i])
            .collect();
        if to_write.is_empty() && replaced.is_empty() && leftovers.is_empty() {
            return Ok(done);
        }
        let mut written = Vec::new();
        for (name, records) in &to_write {
            self.write_segment(name, records).await?;
            written.push(name.clone());
        }
        let mut segments: Vec<SegmentName> = (0..old)
            .filter(|i| !absorbed.contains(i))
            .map(|i| all[i].clone())
            .collect();
        segments.extend(written.iter().cloned());
        let next = at.index.next(segments);
        match self.replace_index(&at, &next).await {
            Ok(Replaced::Won) => {}
            Ok(Replaced::Lost(now)) => {
                self.remove_unlisted(&written, now.as_ref()).await?;
                return Ok(busy);
            }
            Err(e) => {
                // A refusal we know was not applied: what we wrote goes.
                if e.kind == DestinationErrorKind::StorageFull {
                    self.remove_unlisted(&written, None).await?;
                }
                return Err(e);
            }
        }
        // The new index is in place: what it replaced can go.
        for &i in &folded {
            let (l, c, t) = key_of(&loose[i]);
            self.delete(
                &self
                    .layout
                    .control(COMMITTED, &commit_record_name(l, c, &t)),
            )
            .await?;
        }
        for seg in replaced {
            self.delete(&self.segment_key(seg)).await?;
        }
        for name in &leftovers {
            self.delete(&self.layout.control(HISTORY, name)).await?;
        }
        Ok(done)
    }

    /// The live segments (from the index) and every object name under
    /// `history/` (tests and tools: leftovers are the difference).
    pub(super) async fn segments_and_objects(
        &self,
    ) -> Result<(Vec<SegmentName>, Vec<String>), DestinationError> {
        let live = self
            .read_index()
            .await?
            .map(|v| v.index.segments)
            .unwrap_or_default();
        Ok((live, self.names_in(HISTORY).await?))
    }
}
