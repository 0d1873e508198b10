//! Read-only views of an output directory, for tools (`twopc inspect`) and
//! tests: nothing here creates, changes or removes anything, so it works on
//! a read-only mount and next to a running job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use twopc_core::destination::{
    LineageRecord, LostNote, OperationRecord, StagedState, StagedTransaction,
};
use twopc_core::error::DestinationError;
use twopc_core::ids::{SinkId, TransactionId};

use crate::control::CommitRecord;
use crate::dir::{Dir, EntryKind};
use crate::faults::FaultHook;
use crate::history::{History, SegmentName};
use crate::names::{self, CONTROL_DIR};
use crate::scan::{io_err, Reader};

/// Paths of one sink inside an output directory (for messages and tests).
#[derive(Clone, Debug)]
pub struct Layout {
    pub output: PathBuf,
    pub sink: SinkId,
    pub sink_dir: PathBuf,
    pub staging: PathBuf,
    pub committing: PathBuf,
    pub committed: PathBuf,
    pub expired: PathBuf,
    pub owners: PathBuf,
    pub lineages: PathBuf,
    pub trash: PathBuf,
    pub tmp: PathBuf,
}

impl Layout {
    pub fn new(output: &Path, sink: &SinkId) -> Self {
        let sink_dir = output.join(CONTROL_DIR).join(sink.as_str());
        Layout {
            output: output.to_path_buf(),
            sink: sink.clone(),
            staging: sink_dir.join(names::STAGING),
            committing: sink_dir.join(names::COMMITTING),
            committed: sink_dir.join(names::COMMITTED),
            expired: sink_dir.join(names::EXPIRED),
            owners: sink_dir.join(names::OWNERS),
            lineages: sink_dir.join(names::LINEAGES),
            trash: sink_dir.join(names::TRASH),
            tmp: sink_dir.join(names::TMP),
            sink_dir,
        }
    }

    pub fn staging_dir(&self, txn: &TransactionId) -> PathBuf {
        self.staging.join(txn.as_str())
    }

    /// Sinks that have a control directory under `output`.
    pub fn sinks_in(output: &Path) -> Result<Vec<SinkId>, DestinationError> {
        let root = match Dir::open_path(output, FaultHook::default()) {
            Ok(d) => d,
            Err(e) => return Err(DestinationError::io("opening", output, e)),
        };
        let control = match root.open_dir(CONTROL_DIR) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(DestinationError::io("opening", &root.child(CONTROL_DIR), e)),
        };
        // Only directories are sinks; a stray file or link is not ours.
        Ok(control
            .names_of(EntryKind::Dir)
            .map_err(io_err("listing", control.path()))?
            .into_iter()
            .filter_map(|n| SinkId::new(n).ok())
            .collect())
    }

    /// The sink's control directories that exist, read-only.
    fn open(&self) -> Result<SinkDirsView, DestinationError> {
        let root = Dir::open_path(&self.output, FaultHook::default())
            .map_err(io_err("opening", &self.output))?;
        let sink_dir = open_optional(&root, CONTROL_DIR)?
            .map(|c| open_optional(&c, self.sink.as_str()))
            .transpose()?
            .flatten();
        let sub = |name: &str| -> Result<Option<Dir>, DestinationError> {
            match &sink_dir {
                Some(d) => open_optional(d, name),
                None => Ok(None),
            }
        };
        Ok(SinkDirsView {
            staging: sub(names::STAGING)?,
            committing: sub(names::COMMITTING)?,
            committed: sub(names::COMMITTED)?,
            expired: sub(names::EXPIRED)?,
            lineages: sub(names::LINEAGES)?,
            lost: sub(names::LOST)?,
            operations: sub(names::OPERATIONS)?,
            history: sub(names::HISTORY)?,
            root,
        })
    }

    /// Every commit record of this sink, single or folded, checked, each
    /// once.
    pub fn read_commit_records(&self) -> Result<Vec<CommitRecord>, DestinationError> {
        let v = self.open()?;
        let reader = Reader {
            sink: &self.sink,
            output: &self.output,
        };
        let loose = reader
            .scan_commit_records(v.committed.as_ref(), |_, _| true)?
            .0;
        let folded = match &v.history {
            Some(dir) => History {
                dir,
                tmp: None,
                reader,
            }
            .collect(|_| true)?,
            None => Vec::new(),
        };
        Ok(merge(loose, folded))
    }

    /// Staged and claimed transactions, and names there that are not this
    /// sink's transactions.
    pub fn read_staged(&self) -> Result<(Vec<StagedTransaction>, Vec<String>), DestinationError> {
        let v = self.open()?;
        let reader = Reader {
            sink: &self.sink,
            output: &self.output,
        };
        reader.scan_staged(v.staging.as_ref(), v.committing.as_ref())
    }
}

struct SinkDirsView {
    #[allow(dead_code)] // kept open: the others are opened through it
    root: Dir,
    staging: Option<Dir>,
    committing: Option<Dir>,
    committed: Option<Dir>,
    expired: Option<Dir>,
    lineages: Option<Dir>,
    lost: Option<Dir>,
    operations: Option<Dir>,
    history: Option<Dir>,
}

fn open_optional(parent: &Dir, name: &str) -> Result<Option<Dir>, DestinationError> {
    match parent.open_dir(name) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DestinationError::io(
            "opening (it must be a directory of twopc's, not a link)",
            &parent.child(name),
            e,
        )),
    }
}

/// Single records and folded ones, each transaction once.
fn merge(loose: Vec<CommitRecord>, folded: Vec<CommitRecord>) -> Vec<CommitRecord> {
    let mut by_txn: BTreeMap<TransactionId, CommitRecord> = folded
        .into_iter()
        .map(|r| (r.handle.transaction.clone(), r))
        .collect();
    for r in loose {
        by_txn.insert(r.handle.transaction.clone(), r);
    }
    by_txn.into_values().collect()
}

/// How much of the committed history an inventory reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// The single (recent) commit records, and the history segments by
    /// name only: time that does not grow with the history.
    Summary,
    /// Every commit record, folded ones too, each segment checked.
    Full,
}

/// Everything `twopc inspect` reports about one sink.
#[derive(Clone, Debug)]
pub struct SinkInventory {
    pub sink: SinkId,
    /// Commit records: with [`Depth::Full`] all of them, with
    /// [`Depth::Summary`] only those not folded into a history segment.
    pub committed: Vec<CommitRecord>,
    /// The history segments, by name (what each holds, summed).
    pub segments: Vec<SegmentName>,
    /// True when `committed` holds the folded records too, all of them.
    pub full: bool,
    /// With [`Depth::Summary`]: the folded records of checkpoints a lost
    /// note names (not in `committed`, so that nothing counts twice).
    pub folded_context: Vec<CommitRecord>,
    pub staged: Vec<StagedTransaction>,
    /// Expired transaction ids and when.
    pub expired: BTreeMap<String, u64>,
    /// How each lineage began, where recorded.
    pub lineages: Vec<LineageRecord>,
    /// Transactions the committer found LOST (see `LostNote`).
    pub lost: Vec<LostNote>,
    /// Changes made by hand (`twopc reconcile --apply`, `twopc decide`),
    /// oldest first.
    pub operations: Vec<OperationRecord>,
    /// Problems found: names that are not ours, records that fail their
    /// checks, unreadable files.
    pub problems: Vec<String>,
}

/// Reads the whole state of every sink in an output directory, every
/// commit record included.
pub fn inventory(output: &Path) -> Result<Vec<SinkInventory>, DestinationError> {
    inventory_with(output, Depth::Full)
}

/// Reads the state of every sink in an output directory, the committed
/// history to `depth`.
pub fn inventory_with(output: &Path, depth: Depth) -> Result<Vec<SinkInventory>, DestinationError> {
    let mut out = Vec::new();
    for sink in Layout::sinks_in(output)? {
        let layout = Layout::new(output, &sink);
        let v = layout.open()?;
        let reader = Reader {
            sink: &sink,
            output,
        };
        let mut problems = Vec::new();
        // Staged and claimed transactions before the commit records, the
        // order a commit creates them in reverse (it writes its record
        // before it removes its claim): a commit that runs meanwhile is
        // seen in one or the other, never in neither. A visible-first
        // commit shows its output before its record, so a file listed
        // before this inventory is found through one of the two.
        let staged = match reader.scan_staged(v.staging.as_ref(), v.committing.as_ref()) {
            Ok((mut s, foreign)) => {
                problems.extend(
                    foreign
                        .into_iter()
                        .map(|f| format!("{f} is not a transaction of this sink")),
                );
                if let Some(staging) = v.staging.as_ref() {
                    mark_published(&reader, &v.root, staging, &mut s);
                }
                s
            }
            Err(e) => {
                problems.push(e.to_string());
                Vec::new()
            }
        };
        let committed = match reader.scan_commit_records(v.committed.as_ref(), |_, _| true) {
            Ok((c, foreign)) => {
                problems.extend(
                    foreign
                        .into_iter()
                        .map(|f| format!("{f} is not a commit record of this sink")),
                );
                c
            }
            Err(e) => {
                problems.push(e.to_string());
                Vec::new()
            }
        };
        let mut lost = Vec::new();
        if let Some(dir) = &v.lost {
            match dir.names_of(EntryKind::File) {
                Ok(names) => {
                    for name in names {
                        match dir.read_file(&name, crate::destination::LOST_NOTE_LIMIT) {
                            Ok(Some(bytes)) => {
                                match LostNote::parse(&String::from_utf8_lossy(&bytes)) {
                                    Some(n) => lost.push(n),
                                    None => problems.push(format!(
                                        "{} is not a readable note of a lost transaction",
                                        dir.child(&name).display()
                                    )),
                                }
                            }
                            Ok(None) => {}
                            Err(e) => problems
                                .push(format!("cannot read {}: {e}", dir.child(&name).display())),
                        }
                    }
                }
                Err(e) => problems.push(format!("cannot list {}: {e}", dir.path().display())),
            }
        }
        let mut segments = Vec::new();
        let mut folded_context = Vec::new();
        // Every folded record read (with Depth::Full): only then can a
        // visible file be told to be no record's.
        let mut whole = true;
        let mut committed = committed;
        if let Some(dir) = &v.history {
            let history = History {
                dir,
                tmp: None,
                reader: Reader {
                    sink: &sink,
                    output,
                },
            };
            match history.list() {
                Ok((names, foreign)) => {
                    segments = names;
                    problems.extend(
                        foreign
                            .into_iter()
                            .map(|f| format!("{f} is not a history segment of this sink")),
                    );
                }
                Err(e) => problems.push(e.to_string()),
            }
            let folded = match depth {
                Depth::Full => {
                    // Segments merged or rewritten since the listing went
                    // after the one holding their records was written: a
                    // new listing has it. What was read stays (a record
                    // read twice is taken once), so each round reads only
                    // the segments not read yet.
                    let mut all = Vec::new();
                    let mut read = std::collections::BTreeSet::new();
                    let mut settled = false;
                    'again: for _ in 0..8 {
                        for seg in &segments {
                            let name = seg.render();
                            if read.contains(&name) {
                                continue;
                            }
                            match history.read(seg) {
                                Ok(Some(records)) => all.extend(records),
                                Ok(None) => match history.list() {
                                    Ok((names, _)) => {
                                        segments = names;
                                        continue 'again;
                                    }
                                    Err(e) => {
                                        problems.push(e.to_string());
                                        whole = false;
                                        settled = true;
                                        break 'again;
                                    }
                                },
                                Err(e) => {
                                    problems.push(e.to_string());
                                    whole = false;
                                }
                            }
                            read.insert(name);
                        }
                        settled = true;
                        break;
                    }
                    if !settled {
                        whole = false;
                        problems.push(format!(
                            "the history segments in {} kept changing while they were read (a \
                             compaction or a retraction running): inspect again",
                            dir.path().display()
                        ));
                    }
                    all
                }
                // The folded checkpoints a lost note names are read: the
                // report shows what else of such a checkpoint is visible.
                Depth::Summary => {
                    let some = &mut folded_context;
                    for seg in segments.iter().filter(|s| {
                        lost.iter().any(|n| {
                            n.lineage == s.lineage
                                && s.first <= n.checkpoint
                                && n.checkpoint <= s.last
                        })
                    }) {
                        match history.read(seg) {
                            Ok(records) => some.extend(records.unwrap_or_default()),
                            Err(e) => problems.push(e.to_string()),
                        }
                    }
                    Vec::new()
                }
            };
            committed = merge(committed, folded);
        }
        for c in &committed {
            if let Some(f) = &c.file {
                let present = v.root.stat(f).ok().flatten();
                if !present.is_some_and(|s| s.kind == EntryKind::File) {
                    problems.push(format!(
                        "committed transaction {} lists {f}, which no longer exists",
                        c.handle.transaction
                    ));
                }
            }
        }
        let expired = match reader.tombstones(v.expired.as_ref()) {
            Ok(t) => t.into_iter().collect(),
            Err(e) => {
                problems.push(e.to_string());
                BTreeMap::new()
            }
        };
        let lineages = match reader.lineage_records(v.lineages.as_ref()) {
            Ok(l) => l,
            Err(e) => {
                problems.push(e.to_string());
                Vec::new()
            }
        };
        let mut operations = Vec::new();
        if let Some(dir) = &v.operations {
            match crate::destination::read_operations(dir) {
                Ok((records, damaged)) => {
                    operations = records;
                    problems.extend(
                        damaged
                            .into_iter()
                            .map(|d| format!("{d} is not a readable record of the operations log")),
                    );
                }
                Err(e) => problems.push(e.to_string()),
            }
        }
        lost.sort_by(|a, b| {
            (a.lineage, a.checkpoint, &a.transaction).cmp(&(
                b.lineage,
                b.checkpoint,
                &b.transaction,
            ))
        });
        out.push(SinkInventory {
            sink,
            committed,
            segments,
            full: depth == Depth::Full && whole,
            folded_context,
            staged,
            expired,
            lineages,
            lost,
            operations,
            problems,
        });
    }
    Ok(out)
}

/// Lists as committing, as the destination does, a transaction in
/// `staging/` whose data a visible-first commit already linked to a
/// visible name and whose claim a power loss took back. Found by inode,
/// whatever file names the sink uses; the output directory is listed only
/// when some staged data has a second name.
fn mark_published(
    reader: &Reader<'_>,
    root: &Dir,
    staging: &Dir,
    staged: &mut [StagedTransaction],
) {
    let mut visible_inodes: Option<std::collections::HashSet<(u64, u64)>> = None;
    for s in staged.iter_mut() {
        let StagedState::Prepared(handle) = &s.state else {
            continue;
        };
        let Ok(Some(dir)) = reader.open_txn_dir(staging, s.transaction.as_str()) else {
            continue;
        };
        let Some(data) = dir.stat(names::DATA_FILE).ok().flatten() else {
            continue;
        };
        if data.links < 2 {
            continue;
        }
        let inodes = visible_inodes.get_or_insert_with(|| {
            root.entries()
                .unwrap_or_default()
                .into_iter()
                .filter(|e| e.kind == EntryKind::File)
                .filter_map(|e| root.stat(&e.raw_name).ok().flatten())
                .filter(|st| st.links > 1)
                .map(|st| st.inode)
                .collect()
        });
        if inodes.contains(&data.inode) {
            s.state = StagedState::Committing(handle.clone());
        }
    }
}
