//! [`FsDestination`]: the [`Destination`] trait over a directory.
//!
//! ```text
//! <output>/
//!   part-<txn-id><suffix>                      committed output, visible
//!   _twopc/<sink>/
//!     owners/<subtask>                         lock file of the live writer
//!     staging/<txn-id>/data                    staged records
//!     staging/<txn-id>/prepared                prepare marker (handle, length)
//!     committing/<txn-id>/...                  claimed for commit: decided
//!     committed/<lineage>-<checkpoint>-<txn>   commit record
//!     expired/<txn-id>                         tombstone of retention cleanup
//!     lineages/<lineage>                       how a lineage began
//!     runs/<run>                               the lineage a run writes in
//!     lost/<txn-id>                            note of a transaction found LOST
//!     operations/<time>-<seq>-<nonce>          a change made by hand (twopc reconcile, decide)
//!     history/<lineage>.<first>.<last>...      commit records folded together (see `history`)
//!     history.lock                             held while the history is rewritten
//!     trash/<txn-id>.<nonce>/...               claimed for removal, or a finished claim
//!     tmp/                                     scratch for atomic writes
//! ```
//!
//! # One atomic step decides
//!
//! A commit and an abort of the same transaction can race: two subtasks
//! during lingering cleanup, two jobs, a retry racing its own lost first
//! attempt. Each side first *claims* the staging directory with one rename
//! that never replaces: commit moves it to `committing/`, abort and expiry
//! to `trash/`. Exactly one rename wins; the loser finds the directory gone
//! and learns the outcome from where it went. A claim for commit is the
//! decision to commit (made only for a completed checkpoint): whoever meets
//! it later finishes the commit, nobody aborts it.
//!
//! # Commit
//!
//! 1. A commit record exists: the commit was decided and recorded earlier.
//!    Finish a publication an interruption left, and answer
//!    `AlreadyCommitted`, but only if the output is there: a record whose
//!    output is gone is reported as missing, never as success.
//! 2. Otherwise claim (or find claimed) `committing/<txn>`, check its
//!    marker and data length against the handle, then, in the sink's
//!    [`CommitOrder`]:
//!    * durable-first (the default): make the claim durable, write the
//!      commit record durably (never replacing), publish the data under
//!      its visible name with a rename that never replaces, sync the
//!      output directory;
//!    * visible-first: give the staged data its visible name at once with
//!      a hard link (never replacing) that keeps the staged name, then make
//!      the claim durable, write the record, sync the output directory and
//!      remove the staged name. No flush of the device comes before the
//!      output is visible, and every state a power loss can leave is
//!      finished forwards: a claim, a record, or a link of the staged data
//!      to its visible name (kept without its claim, it lists as
//!      committing, and an abort or expiry refuses it). On a file system
//!      without hard links it commits durable-first.
//!
//!    Last, remove the claimed directory (moved to `trash/` in one step
//!    first, so that a concurrent commit of the same transaction never
//!    meets it half removed). Staged data that already has a name other
//!    than its visible one (an interrupted visible-first commit under other
//!    file names) is never published again: the commit stops, naming it.
//!    A file already at the visible name that is not this transaction's
//!    own output is an error naming it. Two commits of one transaction may run at once (a
//!    retry by id racing its first attempt): both answer committed, and
//!    each looks for the claim before the record, the order in which the
//!    other creates them (the record is written before the claim goes).
//! 3. Neither staged, claimed nor recorded: `Missing`, with the evidence
//!    (an expiry tombstone, a removal in the trash, or nothing at all).

use std::path::Path;
use std::sync::Arc;

use twopc_core::destination::{
    AbortStatus, CommitStatus, CommittedTransaction, Compaction, Destination, HistoryPolicy,
    HistoryTally, LineageRecord, LineageSummary, LostNote, OperationRecord, OwnerClaim, Ownership,
    StagedState, StagedTransaction,
};
use twopc_core::error::{ConfigError, DestinationError, DestinationErrorKind};
use twopc_core::handle::TransactionHandle;
use twopc_core::ids::{CheckpointId, LineageId, RunId, SinkId, TransactionId};
use twopc_core::records::RecordBatch;

use crate::control::{encode, CommitRecord, ControlFile, PreparedMarker};
use crate::dir::{Dir, EntryKind};
use crate::faults::{FaultHook, IoFaults, IoStep};
use crate::history::{self, History, SegmentName};
use crate::names::{self, part_name, CONTROL_DIR, DATA_FILE, PREPARED_FILE};
use crate::ownership;
use crate::scan::{io_err, Reader};
use crate::staged::{IoMode, StagedFile};

/// Largest lost note read back (they are a few hundred bytes).
pub(crate) const LOST_NOTE_LIMIT: u64 = 64 * 1024;

/// The operations log of `dir`, oldest first, and the names of entries that
/// are not readable records (damaged, or not ours), for `twopc inspect`.
pub(crate) fn read_operations(
    dir: &Dir,
) -> Result<(Vec<OperationRecord>, Vec<String>), DestinationError> {
    let mut names = dir
        .names_of(EntryKind::File)
        .map_err(io_err("listing", dir.path()))?;
    names.sort();
    let (mut records, mut damaged) = (Vec::new(), Vec::new());
    for name in names {
        let parsed = dir
            .read_file(&name, LOST_NOTE_LIMIT)
            .map_err(io_err("reading", &dir.child(&name)))?
            .and_then(|bytes| OperationRecord::parse(&String::from_utf8_lossy(&bytes)));
        match parsed {
            Some(r) => records.push(r),
            None => damaged.push(dir.child(&name).display().to_string()),
        }
    }
    Ok((records, damaged))
}

/// How records are laid out in output files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RecordFormat {
    /// Each record followed by `\n` (what Flink's text line readers expect).
    #[default]
    Lines,
    /// Records written back to back, as the serializer produced them.
    Raw,
}

/// When a commit shows its output to readers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CommitOrder {
    /// After the decision and the commit record are durable (two to four
    /// flushes of the device): output readers saw is never taken back,
    /// whatever fails, and an earlier checkpoint's restore always knows it.
    #[default]
    DurableFirst,
    /// At once, by a hard link of the staged data to its visible name, and
    /// made durable after (the staged name is kept until then). Readers see
    /// a commit's output a fraction of a millisecond into the commit
    /// instead of after the flushes. The price: a power loss (or kernel
    /// crash) of the host within those flushes can take back output that
    /// readers already saw. The restore from the latest checkpoint commits
    /// it again, under the same name with the same content; a restore from
    /// an *earlier* checkpoint or savepoint after such a power loss cannot
    /// know that readers saw it, and its replay writes those records again.
    /// A process crash (`kill -9`) takes nothing back: the links are in
    /// the kernel's cache. Falls back to `DurableFirst` where the file
    /// system has no hard links.
    VisibleFirst,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsOptions {
    pub output_dir: std::path::PathBuf,
    pub part_prefix: String,
    /// Appended to committed file names, e.g. `.txt`; may be empty.
    pub part_suffix: String,
    pub format: RecordFormat,
    pub io_mode: IoMode,
    pub commit_order: CommitOrder,
}

impl FsOptions {
    pub fn new(output_dir: impl Into<std::path::PathBuf>) -> Self {
        FsOptions {
            output_dir: output_dir.into(),
            part_prefix: "part".to_string(),
            part_suffix: String::new(),
            format: RecordFormat::Lines,
            io_mode: IoMode::Auto,
            commit_order: CommitOrder::DurableFirst,
        }
    }

    /// Checks the names that configuration puts into paths.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let dir = &self.output_dir;
        if dir.as_os_str().is_empty() {
            return Err(ConfigError::new(
                "the output directory is empty; set a path",
            ));
        }
        if !dir.is_absolute() {
            return Err(ConfigError::new(format!(
                "the output directory {} is relative; give an absolute path (task managers resolve \
                 relative paths against their own working directory, so output would scatter)",
                dir.display()
            )));
        }
        if dir.parent().is_none() {
            return Err(ConfigError::new(format!(
                "the output directory {} is the file system's root; give a dedicated directory",
                dir.display()
            )));
        }
        twopc_core::part_names::validate_part_affixes(&self.part_prefix, &self.part_suffix)
    }
}

/// The directories of one sink, open.
struct SinkDirs {
    staging: Dir,
    committing: Dir,
    committed: Dir,
    expired: Dir,
    trash: Dir,
    tmp: Dir,
    owners: Dir,
    lineages: Dir,
    runs: Dir,
    lost: Dir,
    operations: Dir,
    history: Dir,
    /// `_twopc/<sink>/` itself (for the history lock).
    sink_dir: Dir,
}

impl SinkDirs {
    fn open(output: &Dir, sink: &SinkId) -> std::io::Result<SinkDirs> {
        let sink_dir = output.ensure_dir(CONTROL_DIR)?.ensure_dir(sink.as_str())?;
        Ok(SinkDirs {
            staging: sink_dir.ensure_dir(names::STAGING)?,
            committing: sink_dir.ensure_dir(names::COMMITTING)?,
            committed: sink_dir.ensure_dir(names::COMMITTED)?,
            expired: sink_dir.ensure_dir(names::EXPIRED)?,
            trash: sink_dir.ensure_dir(names::TRASH)?,
            tmp: sink_dir.ensure_dir(names::TMP)?,
            owners: sink_dir.ensure_dir(names::OWNERS)?,
            lineages: sink_dir.ensure_dir(names::LINEAGES)?,
            runs: sink_dir.ensure_dir(names::RUNS)?,
            lost: sink_dir.ensure_dir(names::LOST)?,
            operations: sink_dir.ensure_dir(names::OPERATIONS)?,
            history: sink_dir.ensure_dir(names::HISTORY)?,
            sink_dir,
        })
    }
}

/// The open transaction: its directory and data file.
struct OpenTxn {
    txn: TransactionId,
    dir: Dir,
    file: StagedFile,
}

/// The filesystem destination for one sink and one subtask.
pub struct FsDestination {
    options: FsOptions,
    sink: SinkId,
    output: Dir,
    dirs: SinkDirs,
    open: Option<OpenTxn>,
    /// The owner locks, held while this destination lives (a writer holds
    /// one; an operator's tool holds every subtask's), by subtask index.
    owner: Vec<(u32, std::fs::File)>,
    /// Pairs of history segments (small, wide) found not to be the
    /// leftovers of an interrupted merge (see `remove_redundant_segments`).
    segments_not_redundant: std::collections::HashSet<(String, String)>,
    /// When the last commit made its output visible (the commit latency
    /// metric).
    last_visible: Option<std::time::Instant>,
    /// Whether the fallback to durable-first (no hard links) was logged.
    warned_no_hard_links: bool,
}

impl FsDestination {
    /// Validates the options, creates the directories and removes what
    /// interrupted writes and removals left behind.
    pub fn open(options: FsOptions, sink: &SinkId) -> Result<Self, DestinationError> {
        Self::open_with_hook(options, sink, FaultHook::default())
    }

    /// As [`FsDestination::open`], with injected I/O faults (tests and the
    /// crash simulation).
    pub fn open_with_faults(
        options: FsOptions,
        sink: &SinkId,
        faults: Arc<dyn IoFaults>,
    ) -> Result<Self, DestinationError> {
        Self::open_with_hook(options, sink, FaultHook::new(faults))
    }

    fn open_with_hook(
        options: FsOptions,
        sink: &SinkId,
        hook: FaultHook,
    ) -> Result<Self, DestinationError> {
        options.validate().map_err(|e| {
            DestinationError::new(DestinationErrorKind::NotPermitted, e.to_string())
        })?;
        let out_path = options.output_dir.clone();
        // The directories this creates, outermost last: each one's entry
        // is made durable in its parent (see `Dir::ensure_dir`).
        let created: Vec<&Path> = out_path
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .collect();
        std::fs::create_dir_all(&out_path)
            .map_err(io_err("creating output directory", &out_path))?;
        for dir in created {
            if let Some(parent) = dir.parent() {
                let parent = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
                std::fs::File::open(parent)
                    .and_then(|f| f.sync_all())
                    .map_err(io_err("syncing directory", parent))?;
            }
        }
        let output = Dir::open_path(&out_path, hook)
            .map_err(io_err("opening output directory", &out_path))?;
        let dirs = SinkDirs::open(&output, sink).map_err(|e| {
            DestinationError::io(
                "creating the control directories under",
                &out_path.join(CONTROL_DIR).join(sink.as_str()),
                e,
            )
        })?;
        let dest = FsDestination {
            options,
            sink: sink.clone(),
            output,
            dirs,
            open: None,
            owner: Vec::new(),
            segments_not_redundant: Default::default(),
            last_visible: None,
            warned_no_hard_links: false,
        };
        dest.remove_leftovers()?;
        Ok(dest)
    }

    /// Visible file name of a transaction.
    pub fn part_name(&self, txn: &TransactionId) -> String {
        part_name(&self.options.part_prefix, txn, &self.options.part_suffix)
    }

    /// The output directory.
    pub fn output_dir(&self) -> &Path {
        self.output.path()
    }

    /// The paths of this sink's control data (for messages and tests).
    pub fn layout(&self) -> crate::inventory::Layout {
        crate::inventory::Layout::new(self.output.path(), &self.sink)
    }

    fn reader(&self) -> Reader<'_> {
        Reader {
            sink: &self.sink,
            output: self.output.path(),
        }
    }

    /// A commit record by name: the single record, or else the one folded
    /// into a history segment (in that order; see `history`).
    fn read_commit_record(&self, name: &str) -> Result<Option<CommitRecord>, DestinationError> {
        if let Some(r) = self
            .reader()
            .read_commit_record(&self.dirs.committed, name)?
        {
            return Ok(Some(r));
        }
        let Some((lineage, checkpoint, txn)) = names::parse_commit_record_name(name) else {
            return Ok(None);
        };
        self.history().find(lineage, checkpoint, &txn)
    }

    fn history(&self) -> History<'_> {
        History {
            dir: &self.dirs.history,
            tmp: Some(&self.dirs.tmp),
            reader: self.reader(),
        }
    }

    /// Single commit records of `lineage` after `checkpoint` and folded
    /// ones, each once.
    fn records_after(
        &self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommitRecord>, DestinationError> {
        let (loose, _) = self
            .reader()
            .scan_commit_records(Some(&self.dirs.committed), |l, c| {
                l == lineage && c > checkpoint
            })?;
        let mut by_txn: std::collections::BTreeMap<TransactionId, CommitRecord> = self
            .history()
            .after(lineage, checkpoint)?
            .into_iter()
            .map(|r| (r.handle.transaction.clone(), r))
            .collect();
        for r in loose {
            by_txn.insert(r.handle.transaction.clone(), r);
        }
        Ok(by_txn.into_values().collect())
    }

    fn open_txn_dir(&self, dir: &Dir, name: &str) -> Result<Option<Dir>, DestinationError> {
        self.reader().open_txn_dir(dir, name)
    }

    fn corrupt(&self, message: String) -> DestinationError {
        self.reader().corrupt(message)
    }

    /// Writes the tombstone of a retraction of `txn` (its time), durably.
    fn record_retraction(&self, txn: &TransactionId) -> Result<(), DestinationError> {
        let dir = self
            .dirs
            .sink_dir
            .ensure_dir(names::RETRACTED)
            .map_err(io_err(
                "creating",
                &self.dirs.sink_dir.child(names::RETRACTED),
            ))?;
        dir.write_atomically(
            &self.dirs.tmp,
            txn.as_str(),
            now_ms().to_string().as_bytes(),
            true,
            IoStep::Note,
        )
        .map_err(io_err(
            "writing retraction record",
            &dir.child(txn.as_str()),
        ))
    }

    /// When a retraction of `txn` began, if one did (see
    /// [`FsDestination::record_retraction`]).
    fn retracted_at(&self, txn: &TransactionId) -> Result<Option<u64>, DestinationError> {
        let dir = match self.dirs.sink_dir.open_dir(names::RETRACTED) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(DestinationError::io(
                    "opening",
                    &self.dirs.sink_dir.child(names::RETRACTED),
                    e,
                ))
            }
        };
        // The same form as an expiry's tombstone: a time in milliseconds.
        self.reader().expired_at(&dir, txn)
    }

    fn missing_evidence(&self, txn: &TransactionId) -> Result<String, DestinationError> {
        // The trash first, the tombstone second: an expiry writes its
        // tombstone before it empties the trash, so a removal that is over
        // by the first look has its tombstone in place for the second. (In
        // the other order an expiry could finish between the two looks, and
        // its transaction read as removed outside twopc; found by the race
        // test of commit against expiry.)
        let trash = &self.dirs.trash;
        let removed = trash
            .entries()
            .map_err(io_err("listing", trash.path()))?
            .into_iter()
            .filter_map(|e| e.name)
            .any(|n| names::parse_trash_name(&n).as_ref() == Some(txn));
        if let Some(at) = self.retracted_at(txn)? {
            return Ok(format!(
                "it was committed, then retracted at {} by a rewind (REPLACE_RANGE or `twopc \
                 reconcile`), which removed its output and its commit record (tombstone {})",
                twopc_core::timefmt::utc(at),
                self.dirs
                    .sink_dir
                    .child(names::RETRACTED)
                    .join(txn.as_str())
                    .display()
            ));
        }
        if let Some(at) = self.reader().expired_at(&self.dirs.expired, txn)? {
            return Ok(format!(
                "its staged data was removed by retention cleanup at {} (tombstone {})",
                twopc_core::timefmt::utc(at),
                self.dirs.expired.child(txn.as_str()).display()
            ));
        }
        if removed {
            return Ok(format!(
                "its staged data is being removed (its remains are in {}): claimed by an abort \
                 or by retention cleanup, or left by a commit that finished and whose record was \
                 then retracted; no commit record exists",
                trash.path().display()
            ));
        }
        Ok(format!(
            "neither its staged data ({}) nor a commit record exists; it was aborted, or removed \
             or rolled back outside twopc",
            self.dirs.staging.child(txn.as_str()).display()
        ))
    }

    /// Staged transactions, and names in the staging areas that are not
    /// this sink's transactions.
    pub fn scan_staged(&self) -> Result<(Vec<StagedTransaction>, Vec<String>), DestinationError> {
        self.reader()
            .scan_staged(Some(&self.dirs.staging), Some(&self.dirs.committing))
    }

    /// Every commit record of this sink, single or folded, each once.
    ///
    /// The single records are read first: a compaction writes its segment
    /// before it removes the records it folded, so a record missing from
    /// the first read is in the second. The other order could miss one
    /// folded between the two reads (found by review).
    pub fn all_commit_records(&self) -> Result<Vec<CommitRecord>, DestinationError> {
        let single = self.commit_records()?;
        let mut by_txn: std::collections::BTreeMap<TransactionId, CommitRecord> = self
            .history()
            .collect(|_| true)?
            .into_iter()
            .map(|r| (r.handle.transaction.clone(), r))
            .collect();
        for r in single {
            by_txn.insert(r.handle.transaction.clone(), r);
        }
        Ok(by_txn.into_values().collect())
    }

    /// The single (not yet folded) commit records of this sink.
    pub fn commit_records(&self) -> Result<Vec<CommitRecord>, DestinationError> {
        Ok(self
            .reader()
            .scan_commit_records(Some(&self.dirs.committed), |_, _| true)?
            .0)
    }

    /// Removes scratch files of interrupted atomic writes (old enough that
    /// no live writer still uses them) and the trash of interrupted
    /// removals (claimed, so nobody else wants them).
    fn remove_leftovers(&self) -> Result<(), DestinationError> {
        let now = now_ms();
        let tmp = &self.dirs.tmp;
        for name in tmp
            .names_of(EntryKind::File)
            .map_err(io_err("listing", tmp.path()))?
        {
            if !name.ends_with(".tmp") {
                continue;
            }
            let Ok(Some(st)) = tmp.stat(&name) else {
                continue; // removed meanwhile by another subtask
            };
            if now.saturating_sub(st.modified_ms) > STALE_SCRATCH_MS {
                tmp.unlink(&name)
                    .map_err(io_err("removing", &tmp.child(&name)))?;
            }
        }
        // An entry that cannot be removed (something foreign inside it, a
        // permission, a tree too deep) is reported and left: its removal
        // decides nothing, and failing the open for it would fail every
        // start of every subtask for good (found by review).
        let trash = &self.dirs.trash;
        for e in trash.entries().map_err(io_err("listing", trash.path()))? {
            if let Some(name) = e.name.filter(|n| names::parse_trash_name(n).is_some()) {
                if let Err(err) = trash.remove_tree(&name) {
                    log::warn!(
                        "{}: could not remove {} ({err}); it decides nothing and is left for an \
                         operator to remove",
                        self.sink,
                        trash.child(&name).display()
                    );
                }
            }
        }
        Ok(())
    }

    /// Checks the open transaction's records before any of them is written:
    /// in LINES format a record must not hold a line break, or readers
    /// would see two records (or a part of one).
    fn check_records(&self, batch: &RecordBatch<'_>) -> Result<(), DestinationError> {
        if self.options.format != RecordFormat::Lines {
            return Ok(());
        }
        match twopc_core::records::line_break_fault(batch) {
            None => Ok(()),
            Some(fault) => Err(DestinationError::record(fault)),
        }
    }

    /// The open transaction `txn`'s data file, created with its directory
    /// on the first write.
    fn open_txn(&mut self, txn: &TransactionId) -> Result<&mut OpenTxn, DestinationError> {
        if !matches!(&self.open, Some(o) if &o.txn == txn) {
            // One transaction is open at a time; a different one means the
            // previous one was prepared or aborted already.
            self.open = None;
            let staging = &self.dirs.staging;
            let path = staging.child(txn.as_str());
            // A new directory: anything already there is not ours to write to.
            staging
                .create_dir_new(txn.as_str())
                .map_err(io_err("creating staging directory", &path))?;
            let dir = staging
                .open_dir(txn.as_str())
                .map_err(io_err("opening staging directory", &path))?;
            let file = StagedFile::create(&dir, self.options.io_mode)
                .map_err(io_err("creating staged file in", &path))?;
            self.open = Some(OpenTxn {
                txn: txn.clone(),
                dir,
                file,
            });
        }
        Ok(self.open.as_mut().expect("set above"))
    }

    /// The commit of a claimed (decided) transaction, from its directory in
    /// `committing/`.
    fn finish_claimed(
        &mut self,
        handle: &TransactionHandle,
        claimed: &Dir,
        now_ms: u64,
    ) -> Result<Option<CommitStatus>, DestinationError> {
        let txn = &handle.transaction;
        let checkpoint = handle.checkpoint().unwrap_or_default();
        let Some(marker) = self.reader().read_marker(claimed, txn)? else {
            // A concurrent commit finished and removed it meanwhile: the
            // caller looks again.
            if self
                .open_txn_dir(&self.dirs.committing, txn.as_str())?
                .is_none()
            {
                return Ok(None);
            }
            // Durable before it is reported (and noted as lost).
            self.sync_claim()?;
            return Ok(Some(CommitStatus::Missing {
                evidence: format!(
                    "it was claimed for commit ({}), but its prepare marker is gone",
                    claimed.path().display()
                ),
            }));
        };
        if marker.handle.lineage != handle.lineage
            || marker.handle.checkpoint() != handle.checkpoint()
            || marker.handle.prepared().map(|p| (p.records, p.bytes))
                != handle.prepared().map(|p| (p.records, p.bytes))
        {
            return Err(self.corrupt(format!(
                "the prepare marker of {txn} describes lineage {}, checkpoint {:?}, but the \
                 checkpoint's handle says lineage {}, checkpoint {checkpoint}",
                marker.handle.lineage,
                marker.handle.checkpoint(),
                handle.lineage
            )));
        }
        let record_name = names::commit_record_name(handle.lineage, checkpoint, txn);
        let visible = self.part_name(txn);
        let data = claimed
            .stat(DATA_FILE)
            .map_err(io_err("reading size of", &claimed.child(DATA_FILE)))?;
        match data {
            Some(st) if st.kind == EntryKind::File && st.len == marker.data_len => {
                // A second name that is not the visible one: an interrupted
                // visible-first commit published it under other file names
                // (changed since), or a tool linked it. Publishing it again
                // would show the output twice. Read again before deciding:
                // a concurrent commit's publication (a link, then the
                // staged name goes) may be under way.
                let other = if st.links > 1 {
                    self.another_name(claimed, &visible)?
                } else {
                    None
                };
                if let Some(other) = other {
                    return Err(self.published_elsewhere(txn, claimed, &other, &visible));
                }
            }
            Some(st) if st.kind == EntryKind::File => {
                self.sync_claim()?;
                return Ok(Some(CommitStatus::Missing {
                    evidence: format!(
                        "its staged data file {} has {} bytes but {} were prepared; it was \
                         truncated or changed",
                        claimed.child(DATA_FILE).display(),
                        st.len,
                        marker.data_len
                    ),
                }));
            }
            Some(_) => {
                return Err(self.corrupt(format!(
                    "{} is not a regular file",
                    claimed.child(DATA_FILE).display()
                )))
            }
            None => {
                // Published already by a concurrent commit, or gone.
                if self.read_commit_record(&record_name)?.is_some() {
                    return Ok(None);
                }
                self.sync_claim()?;
                return Ok(Some(CommitStatus::Missing {
                    evidence: format!(
                        "its prepare marker exists but its data file {} is gone",
                        claimed.child(DATA_FILE).display()
                    ),
                }));
            }
        }
        // Visible first (when configured): a hard link gives the staged
        // data its visible name and keeps the staged one, so readers see
        // the output before any flush of the device. Every state a power
        // loss can leave from here on is finished forwards, never aborted:
        // the claim, the record and the link each name the decision (see
        // `published_from_staging` for a link that survived without its
        // claim). What a power loss can take back is in `CommitOrder`.
        let link = if self.options.commit_order == CommitOrder::VisibleFirst {
            self.link_output(claimed, &visible, marker.data_len)?
        } else {
            Link::NotTried
        };
        if link == Link::Made {
            self.last_visible = Some(std::time::Instant::now());
        }
        if link == Link::Unsupported && !self.warned_no_hard_links {
            self.warned_no_hard_links = true;
            log::warn!(
                "sink '{}': {} has no hard links; commits there are durable-first, not \
                 visible-first as configured",
                self.sink,
                self.output.path().display()
            );
        }
        let linked = matches!(link, Link::Made | Link::There);
        // The claim durable before the record that depends on it: a claim
        // that came back in `staging/` beside a durable record could be
        // aborted as lingering.
        self.sync_claim()?;
        // The record before the staged name goes (or, without hard links,
        // before the output becomes visible): a crash in between leaves a
        // decided commit that the next attempt finishes.
        let record = ControlFile::Committed(CommitRecord {
            handle: marker.handle.clone(),
            file: Some(visible.clone()),
            data_len: marker.data_len,
            committed_at_ms: now_ms,
        });
        match self.dirs.committed.write_atomically(
            &self.dirs.tmp,
            &record_name,
            &encode(&record),
            false,
            IoStep::CommitRecord,
        ) {
            Ok(()) => {}
            // A concurrent commit of the same transaction wrote it, maybe
            // a moment ago: durable before the publication depends on it.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                self.sync_dir(&self.dirs.committed)?;
            }
            Err(e) => {
                return Err(DestinationError::io(
                    "writing commit record",
                    &self.dirs.committed.child(&record_name),
                    e,
                ))
            }
        }
        if linked {
            // The link durable before the claim goes. The staged name goes
            // first: a commit of the transaction still holding the claim's
            // directory open (a retry racing this one) then finds nothing
            // to link, never a way to publish it again after a retraction.
            self.sync_dir(&self.output)?;
            claimed
                .unlink(DATA_FILE)
                .map_err(io_err("removing", &claimed.child(DATA_FILE)))?;
        } else if self.publish(claimed, &visible, marker.data_len)? {
            self.last_visible = Some(std::time::Instant::now());
        }
        remove_claimed(&self.dirs.committing, &self.dirs.trash, txn)?;
        Ok(Some(CommitStatus::Committed))
    }

    /// The refusal to publish staged data already visible as `other` (see
    /// `another_name`).
    fn published_elsewhere(
        &self,
        txn: &TransactionId,
        claimed: &Dir,
        other: &str,
        visible: &str,
    ) -> DestinationError {
        DestinationError::corrupt(format!(
            "the staged data of {txn}, {}, is already visible as {}, not under the name its \
             commit gives it now, {}: an interrupted visible-first commit published it under \
             other file names (was partPrefix or partSuffix changed?), or a reader renamed its \
             output. Nothing was published again (that would show its records twice). Restart \
             with the file names the sink used then; or rename {other} back to {visible} and \
             restart: the commit then finishes",
            claimed.child(DATA_FILE).display(),
            self.output.child(other).display(),
            self.output.child(visible).display(),
        ))
    }

    /// The name in the output directory, other than `visible`, that a
    /// claimed transaction's data (seen with more than one name) also has,
    /// if any (see `finish_claimed`). A concurrent commit's link is told
    /// apart by reading again: the kernel counts a new link a moment before
    /// its name can be looked up, and a commit removes the staged name once
    /// it published. A second name outside the output directory (a
    /// hard-link snapshot of the tree, say) publishes nothing and is no
    /// reason to stop.
    fn another_name(
        &self,
        claimed: &Dir,
        visible: &str,
    ) -> Result<Option<String>, DestinationError> {
        for _ in 0..20 {
            let data = claimed
                .stat(DATA_FILE)
                .map_err(io_err("reading", &claimed.child(DATA_FILE)))?;
            let output = self
                .output
                .stat(visible)
                .map_err(io_err("reading", &self.output.child(visible)))?;
            match (data, output) {
                (None, _) => return Ok(None),
                (Some(d), _) if d.links < 2 => return Ok(None),
                (Some(d), Some(o)) if d.inode == o.inode => return Ok(None),
                // Another file at the visible name (which the publication
                // refuses): whether the data is visible elsewhere is what
                // the listing below tells.
                (Some(_), Some(_)) => break,
                // Linked a moment ago, or under another name: look again.
                (Some(_), None) => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
        let Some(data) = claimed
            .stat(DATA_FILE)
            .map_err(io_err("reading", &claimed.child(DATA_FILE)))?
        else {
            return Ok(None);
        };
        Ok(self
            .output_names_of(data.inode)?
            .into_iter()
            .find(|n| n != visible))
    }

    /// The names in the output directory of the file `inode`. Lists the
    /// whole directory: only for the rare data with a second name.
    fn output_names_of(&self, inode: (u64, u64)) -> Result<Vec<String>, DestinationError> {
        let entries = self
            .output
            .entries()
            .map_err(io_err("listing", self.output.path()))?;
        Ok(entries
            .into_iter()
            .filter(|e| e.kind == EntryKind::File)
            .filter(|e| {
                self.output
                    .stat(&e.raw_name)
                    .ok()
                    .flatten()
                    .is_some_and(|st| st.inode == inode)
            })
            .map(|e| e.raw_name)
            .collect())
    }

    /// Links a claimed transaction's data to its visible name, keeping the
    /// staged name (see [`Link`]). Never replaces anything.
    fn link_output(
        &self,
        claimed: &Dir,
        visible: &str,
        data_len: u64,
    ) -> Result<Link, DestinationError> {
        let target = self.output.child(visible);
        match claimed.link_noreplace(DATA_FILE, &self.output, visible, IoStep::Publish) {
            Ok(true) => Ok(Link::Made),
            Ok(false) => Ok(Link::Unsupported),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if same_file(claimed, DATA_FILE, &self.output, visible)
                    .map_err(io_err("reading", &target))?
                {
                    // An earlier attempt linked it.
                    return Ok(Link::There);
                }
                if claimed
                    .stat(DATA_FILE)
                    .map_err(io_err("reading", &claimed.child(DATA_FILE)))?
                    .is_none()
                {
                    // A concurrent commit finished and removed the staged
                    // name between the link and the comparison.
                    self.published_meanwhile(visible, data_len)?;
                    return Ok(Link::There);
                }
                // The claim durable before the refusal says it is decided.
                self.sync_claim()?;
                Err(DestinationError::new(
                    DestinationErrorKind::Corrupt,
                    format!(
                        "refusing to publish over {}: a file that is not this transaction's \
                         output already has its name. Move that file away; the commit is \
                         decided (claimed), and the next attempt publishes it",
                        target.display()
                    ),
                ))
            }
            // A concurrent commit finished it: the staged name is gone.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.published_meanwhile(visible, data_len)?;
                Ok(Link::There)
            }
            Err(e) => Err(DestinationError::io("publishing", &target, e)),
        }
    }

    /// Whether a transaction still in `staging/` has its data linked to its
    /// visible name: a commit claimed and published it, and a power loss
    /// kept the link but not the claim (the claim is synced after the link).
    /// Such a transaction is committed forwards, never aborted or expired:
    /// readers may have seen its output. Cheap for every other transaction:
    /// its data has one name.
    fn published_from_staging(&self, txn: &TransactionId) -> Result<bool, DestinationError> {
        let Some(dir) = self.open_txn_dir(&self.dirs.staging, txn.as_str())? else {
            return Ok(false);
        };
        let Some(data) = dir
            .stat(DATA_FILE)
            .map_err(io_err("reading", &dir.child(DATA_FILE)))?
        else {
            return Ok(false);
        };
        if data.links < 2 {
            return Ok(false);
        }
        let visible = self.part_name(txn);
        let output = self
            .output
            .stat(&visible)
            .map_err(io_err("reading", &self.output.child(&visible)))?;
        // Under its visible name, or (file names changed since) another
        // name in the output directory.
        if output.is_none_or(|o| o.inode != data.inode)
            && self.output_names_of(data.inode)?.is_empty()
        {
            return Ok(false);
        }
        // Still in `staging/`: the directory opened above may have been
        // claimed by a commit since, which links at once (a live commit,
        // not a leftover).
        Ok(self
            .dirs
            .staging
            .stat(txn.as_str())
            .map_err(io_err("reading", &self.dirs.staging.child(txn.as_str())))?
            .is_some_and(|st| dir.inode().is_ok_and(|ino| st.inode == ino)))
    }

    /// Moves a claimed transaction's data to its visible name, never
    /// replacing anything there; true if this call made it visible (false:
    /// it was already, by a link or a concurrent commit).
    fn publish(
        &self,
        claimed: &Dir,
        visible: &str,
        data_len: u64,
    ) -> Result<bool, DestinationError> {
        let target = self.output.child(visible);
        let renamed =
            match claimed.rename_noreplace(DATA_FILE, &self.output, visible, IoStep::Publish) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let ours = same_file(claimed, DATA_FILE, &self.output, visible)
                        .map_err(io_err("reading", &target))?;
                    let staged_gone = !ours
                        && claimed
                            .stat(DATA_FILE)
                            .map_err(io_err("reading", &claimed.child(DATA_FILE)))?
                            .is_none();
                    if staged_gone {
                        // A concurrent commit linked it to its visible name and
                        // removed the staged name (the link-based publish)
                        // before the comparison: not a foreign file.
                        return self.published_meanwhile(visible, data_len).map(|()| false);
                    }
                    if !ours {
                        return Err(DestinationError::new(
                            DestinationErrorKind::Corrupt,
                            format!(
                            "refusing to publish over {}: a file that is not this transaction's \
                             output already has its name. Move that file away; the commit is \
                             decided and recorded, and the next attempt publishes it",
                            target.display()
                        ),
                        ));
                    }
                    // A link-based publish was interrupted after the link: the
                    // data is published, its old name goes.
                    claimed
                        .unlink(DATA_FILE)
                        .map_err(io_err("removing", &claimed.child(DATA_FILE)))?;
                    false
                }
                // A concurrent commit published it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return self.published_meanwhile(visible, data_len).map(|()| false)
                }
                Err(e) => return Err(DestinationError::io("publishing", &target, e)),
            };
        self.output
            .sync()
            .map_err(io_err("syncing directory", self.output.path()))?;
        Ok(renamed)
    }

    /// Makes a claim for commit durable: the directory it left and the one
    /// it entered. Syncing the target alone suffices where one journal
    /// transaction changes both parents (ext4, XFS), not everywhere (btrfs
    /// logs per inode; ext4 without a journal): there the entry could come
    /// back in `staging/` after a power loss beside a durable record, and a
    /// lingering cleanup would abort a decided transaction. Measured, the
    /// one flush this costs is within the noise of a commit (`bench/notes.md`).
    /// The directory it entered first: where one sync persists only its own
    /// directory, a power loss between the two then leaves the entry in
    /// `committing/` (or in both), never in neither, which lost its data to
    /// `lost+found` and read as LOST (found by review).
    fn sync_claim(&self) -> Result<(), DestinationError> {
        self.sync_dir(&self.dirs.committing)?;
        self.sync_dir(&self.dirs.staging)
    }

    fn sync_dir(&self, dir: &Dir) -> Result<(), DestinationError> {
        dir.sync().map_err(io_err("syncing directory", dir.path()))
    }

    /// A concurrent commit of the transaction published its data: it must
    /// be there under its visible name, whole.
    fn published_meanwhile(&self, visible: &str, data_len: u64) -> Result<(), DestinationError> {
        let target = self.output.child(visible);
        let present = self
            .output
            .stat(visible)
            .map_err(io_err("reading", &target))?;
        if !present.is_some_and(|s| s.kind == EntryKind::File && s.len == data_len) {
            return Err(DestinationError::io(
                "publishing",
                &target,
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ));
        }
        self.output
            .sync()
            .map_err(io_err("syncing directory", self.output.path()))
    }

    /// The answer to a commit whose record exists: finish what an
    /// interruption left, and report success only if the output is there.
    fn already_committed(
        &mut self,
        handle: &TransactionHandle,
        record: &CommitRecord,
    ) -> Result<CommitStatus, DestinationError> {
        let txn = &handle.transaction;
        if let Some(claimed) = self.open_txn_dir(&self.dirs.committing, txn.as_str())? {
            if let Some(file) = &record.file {
                if let Some(data) = claimed
                    .stat(DATA_FILE)
                    .map_err(io_err("reading", &claimed.child(DATA_FILE)))?
                {
                    // Checked before it is shown, as a first commit checks
                    // it against the marker: a truncated or changed file
                    // must not become visible and then be found wrong
                    // (found by review).
                    if data.kind != EntryKind::File || data.len != record.data_len {
                        self.sync_claim()?;
                        return Ok(CommitStatus::Missing {
                            evidence: format!(
                                "it was committed at {} with {} bytes, but its claimed data file \
                                 {} has {} and was not published: it was truncated or changed \
                                 before its publication",
                                twopc_core::timefmt::utc(record.committed_at_ms),
                                record.data_len,
                                claimed.child(DATA_FILE).display(),
                                data.len
                            ),
                        });
                    }
                    // Visible under another name already (a reader renamed
                    // it while a visible-first commit was finishing): never
                    // a second copy.
                    if data.links > 1 {
                        if let Some(other) = self.another_name(&claimed, file)? {
                            return Err(self.published_elsewhere(txn, &claimed, &other, file));
                        }
                    }
                    if self.publish(&claimed, file, record.data_len)? {
                        self.last_visible = Some(std::time::Instant::now());
                    }
                } else {
                    // Published by another commit, which may not have
                    // synced the output directory yet: durable before the
                    // claim, the last copy of the way back, goes (found by
                    // review). Only a publication takes the data out of a
                    // claim (a rename, or the staged name's removal after
                    // the link), so it was shown: a reader may have taken
                    // it since (found by a second review).
                    self.sync_dir(&self.output)?;
                }
            }
            remove_claimed(&self.dirs.committing, &self.dirs.trash, txn)?;
        }
        if let Some(file) = &record.file {
            let present = self
                .output
                .stat(file)
                .map_err(io_err("reading", &self.output.child(file)))?;
            if !present.is_some_and(|s| s.kind == EntryKind::File) {
                let at = twopc_core::timefmt::utc(record.committed_at_ms);
                let path = self.output.child(file);
                if let Some(retracted) = self.retracted_at(txn)? {
                    return Ok(CommitStatus::Missing {
                        evidence: format!(
                            "it was committed at {at}, then retracted at {} by a rewind \
                             (REPLACE_RANGE or `twopc reconcile`), which removed its output {} \
                             and was interrupted before its commit record went",
                            twopc_core::timefmt::utc(retracted),
                            path.display()
                        ),
                    });
                }
                // The output was published: a claim is removed only after
                // that, and a claim this call met was finished above (by a
                // publication, or found published). So the commit happened
                // and its output was visible: a reader that consumes output
                // by deleting or moving it (or an operator) took it since.
                // Committing again must succeed, as a repeated commit does;
                // a restore of the checkpoint that holds it re-commits it
                // (found by review: such a job stopped as LOST at every
                // failover).
                log::warn!(
                    "sink '{}': transaction {txn} was committed at {at}, and its output {} has been \
                     removed since (a reader that deletes or moves what it consumes, or an \
                     operator); the commit stands and is not repeated",
                    self.sink,
                    path.display()
                );
                return Ok(CommitStatus::AlreadyCommitted);
            }
            // Its length too, as a commit that meets a concurrent one's
            // publication checks it (found by review: a truncated or
            // replaced file answered "already committed").
            if let Some(st) = present.filter(|s| s.len != record.data_len) {
                return Ok(CommitStatus::Missing {
                    evidence: format!(
                        "it was committed at {} with {} bytes, but its output {} has {}: it \
                         was truncated or replaced after the commit",
                        twopc_core::timefmt::utc(record.committed_at_ms),
                        record.data_len,
                        self.output.child(file).display(),
                        st.len
                    ),
                });
            }
        }
        Ok(CommitStatus::AlreadyCommitted)
    }

    /// Claims a staged transaction for removal (abort or expiry) and
    /// removes it; true if this call claimed it. `before_removal` runs
    /// between the two (while the trash still shows the transaction as
    /// being removed): an expiry writes its tombstone there, so that a
    /// commit that finds the transaction gone always finds why.
    fn claim_for_removal(
        &mut self,
        txn: &TransactionId,
        before_removal: impl FnOnce(&Self) -> Result<(), DestinationError>,
    ) -> Result<bool, DestinationError> {
        if matches!(&self.open, Some(o) if &o.txn == txn) {
            self.open = None;
        }
        let trash_name = names::trash_name(txn);
        match self.dirs.staging.rename_noreplace(
            txn.as_str(),
            &self.dirs.trash,
            &trash_name,
            IoStep::Claim,
        ) {
            Ok(()) => {
                self.dirs
                    .staging
                    .sync()
                    .map_err(io_err("syncing directory", self.dirs.staging.path()))?;
                before_removal(self)?;
                self.dirs
                    .trash
                    .remove_tree(&trash_name)
                    .map_err(io_err("removing", &self.dirs.trash.child(&trash_name)))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(DestinationError::io(
                "claiming for removal",
                &self.dirs.staging.child(txn.as_str()),
                e,
            )),
        }
    }
}

/// What a visible-first commit's link did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    /// Durable-first: no link was tried.
    NotTried,
    /// Linked by this call: visible from now.
    Made,
    /// Visible already: linked by an earlier attempt, or published by a
    /// concurrent commit.
    There,
    /// The file system has no hard links: the caller publishes by a rename
    /// after the record (durable-first).
    Unsupported,
}

/// Scratch files older than this were left by a writer that died during an
/// atomic write; younger ones may belong to another subtask writing now.
const STALE_SCRATCH_MS: u64 = 3600 * 1000;

impl FsDestination {
    /// The transactions among `loose` that a history segment holds too:
    /// only the segments whose name covers one of them are read (none,
    /// unless a compaction was interrupted).
    fn folded_among(
        &self,
        loose: &[CommitRecord],
    ) -> Result<std::collections::BTreeSet<TransactionId>, DestinationError> {
        let (segments, _) = self.history().list()?;
        self.folded_among_listed(loose, &segments)
    }

    /// As [`Self::folded_among`], with the segments listed by the caller
    /// (one listing for more than one use). A segment removed since then
    /// was merged or rewritten into one written before it went: a record
    /// it held is then counted as single if it still is.
    fn folded_among_listed(
        &self,
        loose: &[CommitRecord],
        segments: &[SegmentName],
    ) -> Result<std::collections::BTreeSet<TransactionId>, DestinationError> {
        let history = self.history();
        let covering: Vec<&SegmentName> = segments
            .iter()
            .filter(|s| {
                loose.iter().any(|r| {
                    let h = &r.handle;
                    let c = h.checkpoint().unwrap_or_default();
                    h.lineage == s.lineage && h.run == s.run && s.first <= c && c <= s.last
                })
            })
            .collect();
        let mut out = std::collections::BTreeSet::new();
        for seg in covering {
            for r in history.read(seg)?.unwrap_or_default() {
                out.insert(r.handle.transaction);
            }
        }
        Ok(out)
    }

    /// Removes the small segments whose every record a segment of a wider
    /// range holds: the sources of a merge interrupted after its merged
    /// segment was written. Readers take each record once either way, but
    /// the counts from the names would count them twice, and a later merge
    /// of the small ones would copy them again. The caller holds the
    /// history lock.
    ///
    /// Cheap when there is nothing to do: one listing and one sweep per
    /// lineage and run over the names sorted by checkpoint range, where
    /// ranges that do not lie within another's are ruled out by the widest
    /// range seen so far. Only a small segment within another's range is
    /// read, with the wider one, and a pair found not redundant is not
    /// read again by this destination (segments never change). (A rewrite
    /// by a retraction cut the same way leaves its smaller result within
    /// the old segment; removing the result leaves what readers saw, and
    /// the retraction, repeated at recovery, rewrites it again.)
    ///
    /// A segment of any size goes when another has the same name but for
    /// its nonce and the same records: a retraction repeated after one
    /// interrupted before it removed the old segment writes the same
    /// rewrite again (found by review: the twin was counted twice forever).
    fn remove_redundant_segments(
        &mut self,
        policy: &HistoryPolicy,
    ) -> Result<u64, DestinationError> {
        let mut checked = std::mem::take(&mut self.segments_not_redundant);
        let result = self.remove_redundant_segments_with(policy, &mut checked);
        if checked.len() > 10_000 {
            checked.clear();
        }
        self.segments_not_redundant = checked;
        result
    }

    fn remove_redundant_segments_with(
        &self,
        policy: &HistoryPolicy,
        checked: &mut std::collections::HashSet<(String, String)>,
    ) -> Result<u64, DestinationError> {
        let history = self.history();
        let (mut segments, _) = history.list()?;
        let small = (policy.max_segment.max(1) / 2) as u64;
        segments.sort_by(|a, b| {
            (a.lineage, &a.run, a.first, std::cmp::Reverse(a.last)).cmp(&(
                b.lineage,
                &b.run,
                b.first,
                std::cmp::Reverse(b.last),
            ))
        });
        let mut removed = 0;
        let mut gone = vec![false; segments.len()];
        let mut group_start = 0;
        let mut reach: Option<CheckpointId> = None;
        for i in 0..segments.len() {
            let s = &segments[i];
            if i > 0 && (segments[i - 1].lineage, &segments[i - 1].run) != (s.lineage, &s.run) {
                group_start = i;
                reach = None;
            }
            let within_some = reach.is_some_and(|r| r >= s.last);
            reach = Some(reach.map_or(s.last, |r| r.max(s.last)));
            let twin = |m: &twopc_core::history::SegmentName| {
                (m.first, m.last, m.transactions, m.records)
                    == (s.first, s.last, s.transactions, s.records)
            };
            // Twins sort next to each other (same first checkpoint).
            let large = s.transactions >= small;
            if !within_some
                || (large
                    && !segments[group_start..i]
                        .iter()
                        .rev()
                        .take_while(|m| m.first == s.first)
                        .any(twin))
            {
                continue;
            }
            // Earlier in the order: first <= s.first; those reaching s.last
            // cover s's range.
            for j in (group_start..i).rev() {
                let m = &segments[j];
                if gone[j]
                    || m.last < s.last
                    || m.transactions < s.transactions
                    || (large && !twin(m))
                {
                    continue;
                }
                let pair = (s.render(), m.render());
                if checked.contains(&pair) {
                    continue;
                }
                let (small_records, wide_records) = match (history.read(s), history.read(m)) {
                    (Ok(Some(a)), Ok(Some(b))) => (a, b),
                    // Gone meanwhile is impossible under the lock but
                    // harmless; a damaged one is reported by the readers
                    // that need it, and must not stop every compaction.
                    (Err(e), _) | (_, Err(e)) => {
                        log::warn!("not checking history segments for overlap: {e}");
                        checked.insert(pair);
                        continue;
                    }
                    _ => continue,
                };
                let held: std::collections::BTreeSet<&TransactionId> =
                    wide_records.iter().map(|r| &r.handle.transaction).collect();
                if !small_records
                    .iter()
                    .all(|r| held.contains(&r.handle.transaction))
                {
                    checked.insert(pair);
                    continue;
                }
                log::info!(
                    "removing history segment {}: segment {} holds all its records (a merge \
                     was interrupted)",
                    pair.0,
                    pair.1
                );
                self.dirs
                    .history
                    .unlink(&pair.0)
                    .map_err(io_err("removing", &self.dirs.history.child(&pair.0)))?;
                gone[i] = true;
                removed += 1;
                break;
            }
        }
        if removed > 0 {
            self.dirs
                .history
                .sync()
                .map_err(io_err("syncing directory", self.dirs.history.path()))?;
        }
        Ok(removed)
    }

    /// Merges small segments (see `plan_merge`); the caller holds the
    /// history lock. The merged segment is written before the small ones
    /// go, as in a compaction. Returns how many went.
    fn merge_segments(&self, policy: &HistoryPolicy) -> Result<u64, DestinationError> {
        let history = self.history();
        let (segments, _) = history.list()?;
        let infos: Vec<twopc_core::history::SegmentInfo> = segments
            .iter()
            .map(|s| twopc_core::history::SegmentInfo {
                lineage: s.lineage,
                run: s.run.clone(),
                first: s.first,
                transactions: s.transactions,
            })
            .collect();
        let mut merged = 0;
        for group in twopc_core::history::plan_merge(&infos, policy) {
            let mut by_txn = std::collections::BTreeMap::new();
            for &i in &group {
                for r in history.read(&segments[i])?.unwrap_or_default() {
                    by_txn.insert(r.handle.transaction.clone(), r);
                }
            }
            let mut records: Vec<CommitRecord> = by_txn.into_values().collect();
            records.sort_by_key(|r| r.handle.checkpoint());
            if !records.is_empty() {
                history.write(&records)?;
            }
            for &i in &group {
                let name = segments[i].render();
                self.dirs
                    .history
                    .unlink(&name)
                    .map_err(io_err("removing", &self.dirs.history.child(&name)))?;
            }
            self.dirs
                .history
                .sync()
                .map_err(io_err("syncing directory", self.dirs.history.path()))?;
            merged += group.len() as u64;
        }
        Ok(merged)
    }

    /// Removes a retracted transaction from the history segments, under the
    /// history lock (see `history`).
    ///
    /// Always under the lock, even when no segment covers the checkpoint
    /// yet: a compaction that read the single record before the caller
    /// removed it may be about to write the segment that holds it. Waiting
    /// for the lock waits for that compaction; one that starts later no
    /// longer finds the single record. (Looking for a covering segment
    /// before the lock, as this once did, let such a segment be written
    /// just after the look and the retracted commit come back.)
    fn retract_folded(&self, committed: &CommittedTransaction) -> Result<(), DestinationError> {
        let history = self.history();
        let _lock = history::lock(&self.dirs.sink_dir, true).map_err(io_err(
            "locking",
            &self.dirs.sink_dir.child(names::HISTORY_LOCK),
        ))?;
        history.remove(
            committed.lineage,
            committed.checkpoint,
            &committed.transaction,
        )?;
        Ok(())
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Removes what is left of a finished commit's claim: moved to the trash
/// in one step first, so that a concurrent commit of the same transaction
/// never sees the claim half removed (its marker gone, which would read as
/// a transaction whose prepare marker was lost).
fn remove_claimed(
    committing: &Dir,
    trash: &Dir,
    txn: &TransactionId,
) -> Result<(), DestinationError> {
    let trash_name = names::trash_name(txn);
    match committing.rename_noreplace(txn.as_str(), trash, &trash_name, IoStep::Remove) {
        Ok(()) => {}
        // Removed meanwhile by a concurrent commit of it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(DestinationError::io(
                "removing",
                &committing.child(txn.as_str()),
                e,
            ))
        }
    }
    trash
        .remove_tree(&trash_name)
        .map_err(io_err("removing", &trash.child(&trash_name)))?;
    Ok(())
}

/// True when `a/an` and `b/bn` are the same file (one inode).
fn same_file(a: &Dir, an: &str, b: &Dir, bn: &str) -> std::io::Result<bool> {
    Ok(match (a.stat(an)?, b.stat(bn)?) {
        (Some(x), Some(y)) => x.inode == y.inode,
        _ => false,
    })
}

impl Destination for FsDestination {
    fn begin(&mut self, _handle: &TransactionHandle) -> Result<(), DestinationError> {
        // Lazy: the staging directory appears with the first record, so an
        // empty checkpoint costs no file system operations.
        Ok(())
    }

    fn write(
        &mut self,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<(), DestinationError> {
        self.check_records(&batch)?;
        let lines = self.options.format == RecordFormat::Lines;
        let o = self.open_txn(txn)?;
        o.file
            .write_batch(&batch, lines)
            .map_err(io_err("writing", o.file.path()))
    }

    fn prepare(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        let txn = &handle.transaction;
        let counted = handle
            .prepared()
            .map(|p| (p.records, p.bytes))
            .unwrap_or((0, 0));
        let Some(mut open) = self.open.take().filter(|o| &o.txn == txn) else {
            if counted.0 > 0 {
                return Err(DestinationError::corrupt(format!(
                    "the staged data of {txn} ({} records) is not open in this writer at \
                     prepare ({})",
                    counted.0,
                    self.dirs.staging.child(txn.as_str()).display()
                )));
            }
            return Ok(()); // empty: nothing staged, nothing to prepare
        };
        let data_len = open
            .file
            .seal()
            .map_err(io_err("writing and syncing", open.file.path()))?;
        // The durable length must be exactly what the handle counts, or a
        // commit would publish a file that lacks (or adds) records.
        let expected = match self.options.format {
            RecordFormat::Lines => counted.1 + counted.0,
            RecordFormat::Raw => counted.1,
        };
        if data_len != expected {
            return Err(DestinationError::corrupt(format!(
                "{} holds {data_len} bytes on the disk, but the {} records of {txn} counted in \
                 its handle make {expected}; it is not prepared",
                open.file.path().display(),
                counted.0
            )));
        }
        let marker = ControlFile::Prepared(PreparedMarker {
            handle: handle.clone(),
            data_len,
        });
        // Syncs the marker and the transaction directory...
        open.dir
            .write_atomically(
                &self.dirs.tmp,
                PREPARED_FILE,
                &encode(&marker),
                false,
                IoStep::Marker,
            )
            .map_err(io_err(
                "writing prepare marker",
                &open.dir.child(PREPARED_FILE),
            ))?;
        // ...and this makes the transaction directory's own entry durable.
        self.dirs
            .staging
            .sync()
            .map_err(io_err("syncing directory", self.dirs.staging.path()))?;
        // The marker went into the directory this writer opened, wherever it
        // is now: another process's abort or expiry may have claimed it
        // meanwhile (a superseded attempt, `twopc decide`). Prepared there,
        // the checkpoint would complete and its commit find it gone, a LOST
        // stop for what is a failed prepare (found by review).
        let still_staged = match self.open_txn_dir(&self.dirs.staging, txn.as_str())? {
            Some(staged) => same_file(&open.dir, PREPARED_FILE, &staged, PREPARED_FILE)
                .map_err(io_err("reading", &staged.child(PREPARED_FILE)))?,
            None => false,
        };
        if !still_staged {
            return Err(DestinationError::io(
                "preparing",
                &self.dirs.staging.child(txn.as_str()),
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "transaction {txn} left the staging area while it was prepared: \
                         another process claimed it (an abort or expiry). It is not prepared; \
                         the checkpoint fails and the job goes on from the previous one"
                    ),
                ),
            ));
        }
        Ok(())
    }

    fn commit(
        &mut self,
        handle: &TransactionHandle,
        now_ms: u64,
    ) -> Result<CommitStatus, DestinationError> {
        let txn = &handle.transaction;
        let checkpoint = handle.checkpoint().ok_or_else(|| {
            DestinationError::corrupt(format!("commit of {txn} without a prepared state"))
        })?;
        let record_name = names::commit_record_name(handle.lineage, checkpoint, txn);
        // A concurrent commit of the same transaction can move things
        // between the looks below; each round sees a later state.
        for _ in 0..4 {
            if let Some(record) = self.read_commit_record(&record_name)? {
                // Maybe another commit's record, written a moment ago:
                // durable before this one acts on it.
                self.sync_dir(&self.dirs.committed)?;
                return self.already_committed(handle, &record);
            }
            // The claim, ours or another commit's (a retry racing its first
            // attempt, or one interrupted), is the decision; it is made
            // durable after the output is visible and before the record
            // that depends on it (`finish_claimed`).
            let claimed = match self.open_txn_dir(&self.dirs.committing, txn.as_str())? {
                Some(d) => d,
                None => match self.dirs.staging.rename_noreplace(
                    txn.as_str(),
                    &self.dirs.committing,
                    txn.as_str(),
                    IoStep::Claim,
                ) {
                    Ok(()) => match self.open_txn_dir(&self.dirs.committing, txn.as_str())? {
                        Some(d) => d,
                        None => continue,
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        // Not staged: claimed or committed meanwhile (look
                        // again), or gone. The claim first, then the record:
                        // a commit writes its record before it removes its
                        // claim, so whatever the claim's owner does between
                        // the two looks, one of them sees it.
                        if self
                            .open_txn_dir(&self.dirs.committing, txn.as_str())?
                            .is_some()
                            || self.read_commit_record(&record_name)?.is_some()
                        {
                            continue;
                        }
                        // Gone, maybe by an abort that has not synced its
                        // claim yet: durable before it is reported (and
                        // noted as lost), or a power loss could bring the
                        // transaction back beside a note saying it was lost.
                        self.sync_dir(&self.dirs.staging)?;
                        return Ok(CommitStatus::Missing {
                            evidence: self.missing_evidence(txn)?,
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => {
                        return Err(DestinationError::io(
                            "claiming for commit",
                            &self.dirs.staging.child(txn.as_str()),
                            e,
                        ))
                    }
                },
            };
            match self.finish_claimed(handle, &claimed, now_ms)? {
                Some(status) => return Ok(status),
                None => continue,
            }
        }
        Err(DestinationError::new(
            DestinationErrorKind::Io,
            format!(
                "the commit of {txn} kept racing another commit of it; its outcome is not known \
                 yet and it is retried by id"
            ),
        ))
    }

    fn abort(&mut self, txn: &TransactionId) -> Result<AbortStatus, DestinationError> {
        if self.published_from_staging(txn)? {
            return Ok(AbortStatus::WasCommitted);
        }
        if self.claim_for_removal(txn, |_| Ok(()))? {
            return Ok(AbortStatus::Aborted);
        }
        // Claimed for commit: decided, never undone by an abort. Once a
        // commit has finished nothing is staged or claimed any more and an
        // abort finds nothing; the visible output is never touched here.
        if self
            .open_txn_dir(&self.dirs.committing, txn.as_str())?
            .is_some()
        {
            return Ok(AbortStatus::WasCommitted);
        }
        Ok(AbortStatus::NotFound)
    }

    fn last_visible_at(&self) -> Option<std::time::Instant> {
        self.last_visible
    }

    fn staged(&mut self) -> Result<Vec<StagedTransaction>, DestinationError> {
        let (mut staged, foreign) = self.scan_staged()?;
        for s in &mut staged {
            if let StagedState::Prepared(h) = &s.state {
                if self.published_from_staging(&s.transaction)? {
                    s.state = StagedState::Committing(h.clone());
                }
            }
        }
        for name in foreign {
            log::warn!(
                "ignoring {name} in the staging area: not a transaction of sink '{}'",
                self.sink
            );
        }
        Ok(staged)
    }

    fn committed_after(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommittedTransaction>, DestinationError> {
        Ok(self
            .records_after(lineage, checkpoint)?
            .iter()
            .map(CommitRecord::view)
            .collect())
    }

    fn retract(&mut self, committed: &CommittedTransaction) -> Result<(), DestinationError> {
        let name = names::commit_record_name(
            committed.lineage,
            committed.checkpoint,
            &committed.transaction,
        );
        let Some(record) = self.read_commit_record(&name)? else {
            // Already retracted (a folded copy may still be on its way
            // out: see `retract_folded`).
            return self.retract_folded(committed);
        };
        // `read_commit_record` checked the file name: a single component
        // that names this transaction. Removed only when it is the name this
        // sink gives it: another sink's output can look the same with a
        // longer prefix (`part-t-s.1…` is `part-t` + ours or `part` + sink
        // `t-s`'s), and a forged record must not remove it (found by review).
        if let Some(file) = &record.file {
            let ours = self.part_name(&committed.transaction);
            if file != &ours {
                return Err(self.corrupt(format!(
                    "commit record {name} names the output file {file}, but this sink names \
                     the output of {} {ours}: the record was altered, or the part prefix or \
                     suffix changed since the commit. Nothing was removed; if {file} is this \
                     transaction's output, remove it and the record by hand",
                    committed.transaction
                )));
            }
            // Durable before the output goes: a retraction interrupted
            // between the two removals reads as retracted, not as output a
            // reader removed after the commit (see `already_committed`).
            self.record_retraction(&committed.transaction)?;
            if self
                .output
                .unlink(file)
                .map_err(io_err("removing", &self.output.child(file)))?
            {
                self.output
                    .sync()
                    .map_err(io_err("syncing directory", self.output.path()))?;
            }
        }
        // Leftovers of an interrupted commit go too, durably before the
        // record does: a claim that came back without its record after a
        // power loss would be rolled forward and found missing.
        remove_claimed(
            &self.dirs.committing,
            &self.dirs.trash,
            &committed.transaction,
        )?;
        self.sync_dir(&self.dirs.committing)?;
        // Two subtasks may retract the same commit at once (each retracts
        // what the restored state knows); whoever removes the record second
        // finds it gone, which is the state both wanted.
        let dir = &self.dirs.committed;
        dir.unlink(&name)
            .map_err(io_err("removing", &dir.child(&name)))?;
        dir.sync()
            .map_err(io_err("syncing directory", dir.path()))?;
        // Folded too (a compaction interrupted before it removed the single
        // record, or one that read it before the unlink above and writes
        // its segment now: the lock waits for it).
        self.retract_folded(committed)
    }

    fn expire(&mut self, txn: &TransactionId, now_ms: u64) -> Result<(), DestinationError> {
        if self.published_from_staging(txn)? {
            return Err(DestinationError::new(
                DestinationErrorKind::Corrupt,
                format!(
                    "{txn} was not expired: its output {} is published (a commit was \
                     interrupted), so it is committed by the next start, never removed",
                    self.output.child(&self.part_name(txn)).display()
                ),
            ));
        }
        let tombstone = |d: &Self| {
            let dir = &d.dirs.expired;
            match dir.write_atomically(
                &d.dirs.tmp,
                txn.as_str(),
                now_ms.to_string().as_bytes(),
                false,
                IoStep::Note,
            ) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(DestinationError::io(
                    "writing tombstone",
                    &dir.child(txn.as_str()),
                    e,
                )),
            }
        };
        // Not claimed: committed, aborted or expired meanwhile.
        self.claim_for_removal(txn, tombstone).map(|_| ())
    }

    /// Re-entrant: a share this destination holds already is confirmed on
    /// the file that holds it. A second open file's lock would be refused
    /// by this destination's own (`flock` locks belong to open files), and
    /// read back as held by this same claim.
    fn claim_ownership(&mut self, claim: &OwnerClaim) -> Result<Ownership, DestinationError> {
        let owners = &self.dirs.owners;
        let result = match self.owner.iter_mut().find(|(k, _)| *k == claim.subtask) {
            Some((_, held)) => ownership::confirm(owners, held, claim).map(|o| (o, None)),
            None => ownership::claim(owners, claim),
        };
        let (ownership, file) = result.map_err(|e| {
            let kind = if ownership::LocksUnsupported::is(&e) {
                DestinationErrorKind::NotPermitted
            } else {
                DestinationErrorKind::Io
            };
            let mut err = DestinationError::io(
                "claiming ownership at",
                &self.dirs.owners.child(&claim.subtask.to_string()),
                e,
            );
            if kind == DestinationErrorKind::NotPermitted {
                err.kind = kind;
            }
            err
        })?;
        self.owner.extend(file.map(|f| (claim.subtask, f)));
        Ok(ownership)
    }

    /// A lock is never taken over, so a claim is the confirmation.
    fn confirm_ownership(
        &mut self,
        claim: &OwnerClaim,
    ) -> Result<Option<Ownership>, DestinationError> {
        self.claim_ownership(claim).map(Some)
    }

    fn record_lost(&mut self, note: &LostNote) -> Result<(), DestinationError> {
        let dir = &self.dirs.lost;
        let name = note.transaction.as_str();
        match dir.write_atomically(
            &self.dirs.tmp,
            name,
            note.render().as_bytes(),
            false,
            IoStep::Note,
        ) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(DestinationError::io(
                "writing the note of a lost transaction",
                &dir.child(name),
                e,
            )),
        }
    }

    fn lost_notes(&mut self) -> Result<Vec<LostNote>, DestinationError> {
        let dir = &self.dirs.lost;
        let mut out = Vec::new();
        for name in dir
            .names_of(EntryKind::File)
            .map_err(io_err("listing", dir.path()))?
        {
            if let Some(bytes) = dir
                .read_file(&name, LOST_NOTE_LIMIT)
                .map_err(io_err("reading", &dir.child(&name)))?
            {
                out.extend(LostNote::parse(&String::from_utf8_lossy(&bytes)));
            }
        }
        Ok(out)
    }

    fn record_operation(&mut self, record: &OperationRecord) -> Result<(), DestinationError> {
        let dir = &self.dirs.operations;
        let name = record.storage_name();
        dir.write_atomically(
            &self.dirs.tmp,
            &name,
            record.render().as_bytes(),
            false,
            IoStep::Note,
        )
        .map_err(|e| DestinationError::io("writing the operations log", &dir.child(&name), e))
    }

    fn operations(&mut self) -> Result<Vec<OperationRecord>, DestinationError> {
        let (records, _) = read_operations(&self.dirs.operations)?;
        Ok(records)
    }

    fn clear_lost(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<u64, DestinationError> {
        let dir = &self.dirs.lost;
        let mut removed = 0;
        for name in dir
            .names_of(EntryKind::File)
            .map_err(io_err("listing", dir.path()))?
        {
            let Some(bytes) = dir
                .read_file(&name, LOST_NOTE_LIMIT)
                .map_err(io_err("reading", &dir.child(&name)))?
            else {
                continue;
            };
            let Some(note) = LostNote::parse(&String::from_utf8_lossy(&bytes)) else {
                continue;
            };
            if note.lineage == lineage && note.checkpoint > checkpoint {
                dir.unlink(&name)
                    .map_err(io_err("removing", &dir.child(&name)))?;
                removed += 1;
            }
        }
        if removed > 0 {
            dir.sync()
                .map_err(io_err("syncing directory", dir.path()))?;
        }
        Ok(removed)
    }

    fn owner_subtasks(&mut self) -> Result<Vec<u32>, DestinationError> {
        let dir = &self.dirs.owners;
        Ok(dir
            .names_of(EntryKind::File)
            .map_err(io_err("listing", dir.path()))?
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect())
    }

    fn lineages(&mut self) -> Result<Vec<LineageSummary>, DestinationError> {
        // Counts from the single records' names and the segments' names;
        // records are read only for each lineage's latest checkpoint.
        let dir = &self.dirs.committed;
        let mut by: std::collections::BTreeMap<LineageId, (u64, CheckpointId)> =
            std::collections::BTreeMap::new();
        for name in dir
            .names_of(EntryKind::File)
            .map_err(io_err("listing", dir.path()))?
        {
            if let Some((l, c, _)) = names::parse_commit_record_name(&name) {
                let e = by.entry(l).or_insert((0, c));
                e.0 += 1;
                e.1 = e.1.max(c);
            }
        }
        let (segments, _) = self.history().list()?;
        for s in &segments {
            let e = by.entry(s.lineage).or_insert((0, s.last));
            e.0 = e.0.saturating_add(s.transactions);
            e.1 = e.1.max(s.last);
        }
        let records = self.reader().lineage_records(Some(&self.dirs.lineages))?;
        let mut out = Vec::new();
        for (lineage, (count, last)) in by {
            // The latest checkpoint's records name its transactions and runs.
            let latest = self.records_after(lineage, last.saturating_sub(1))?;
            out.push(LineageSummary::from_latest(
                lineage,
                count,
                last,
                latest
                    .iter()
                    .map(|r| (&r.handle.transaction, &r.handle.run)),
                records.iter().find(|r| r.lineage == lineage).cloned(),
            ));
        }
        Ok(out)
    }

    fn compact_history(&mut self, policy: &HistoryPolicy) -> Result<Compaction, DestinationError> {
        let policy = history::effective(policy);
        let Some(_lock) = history::lock(&self.dirs.sink_dir, false).map_err(io_err(
            "locking",
            &self.dirs.sink_dir.child(names::HISTORY_LOCK),
        ))?
        else {
            return Ok(Compaction {
                busy: true,
                ..Compaction::default()
            });
        };
        let redundant = self.remove_redundant_segments(&policy)?;
        // Cheap check first: enough single records to fold at all?
        let dir = &self.dirs.committed;
        let loose_names = dir
            .names_of(EntryKind::File)
            .map_err(io_err("listing", dir.path()))?;
        if loose_names.len() < policy.min_segment.max(1) {
            return Ok(Compaction {
                merged: redundant,
                ..Compaction::default()
            });
        }
        let mut loose = self.commit_records()?;
        // Single records a segment holds already (a compaction stopped
        // between writing its segment and removing them) just go.
        let folded = self.folded_among(&loose)?;
        if !folded.is_empty() {
            // The segment that holds them may be one an interrupted
            // compaction renamed into place without syncing: durable
            // before its records' only other copies go (found by review).
            self.sync_dir(&self.dirs.history)?;
            for r in loose
                .iter()
                .filter(|r| folded.contains(&r.handle.transaction))
            {
                let h = &r.handle;
                let name = names::commit_record_name(
                    h.lineage,
                    h.checkpoint().unwrap_or_default(),
                    &h.transaction,
                );
                dir.unlink(&name)
                    .map_err(io_err("removing", &dir.child(&name)))?;
            }
            dir.sync()
                .map_err(io_err("syncing directory", dir.path()))?;
            loose.retain(|r| !folded.contains(&r.handle.transaction));
        }
        let views: Vec<CommittedTransaction> = loose.iter().map(CommitRecord::view).collect();
        let mut done = Compaction::default();
        for group in twopc_core::history::plan_compaction(&views, &policy) {
            let records: Vec<CommitRecord> = group.iter().map(|&i| loose[i].clone()).collect();
            self.history().write(&records)?;
            for r in &records {
                let h = &r.handle;
                let name = names::commit_record_name(
                    h.lineage,
                    h.checkpoint().unwrap_or_default(),
                    &h.transaction,
                );
                dir.unlink(&name)
                    .map_err(io_err("removing", &dir.child(&name)))?;
            }
            dir.sync()
                .map_err(io_err("syncing directory", dir.path()))?;
            done.folded += records.len() as u64;
            done.segments += 1;
        }
        done.merged = redundant + self.merge_segments(&policy)?;
        Ok(done)
    }

    fn history_tallies(&mut self) -> Result<Vec<HistoryTally>, DestinationError> {
        // The single records first, then one listing of the segments for
        // both the sums and the records held twice: a compaction between
        // the two reads then leaves records in both places (taken once
        // below), never in neither (counted nowhere).
        let loose = self.commit_records()?;
        let (segments, _) = self.history().list()?;
        let mut out = Vec::new();
        for s in &segments {
            s.add_to(&mut out);
        }
        // A record both single and folded (an interrupted compaction) is
        // counted once.
        let folded = self.folded_among_listed(&loose, &segments)?;
        for r in loose {
            if !folded.contains(&r.handle.transaction) {
                twopc_core::destination::tally(&mut out, &r.view());
            }
        }
        Ok(out)
    }

    fn record_lineage(&mut self, record: &LineageRecord) -> Result<(), DestinationError> {
        let dir = &self.dirs.lineages;
        let name = names::lineage_record_name(record.lineage);
        match dir.write_atomically(
            &self.dirs.tmp,
            &name,
            &encode(&ControlFile::Lineage(record.clone())),
            false,
            IoStep::Note,
        ) {
            Ok(()) => Ok(()),
            // Every subtask records it; the first one's record stays.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(DestinationError::io(
                "writing lineage record",
                &dir.child(&name),
                e,
            )),
        }
    }

    fn record_run_lineage(
        &mut self,
        run: &RunId,
        lineage: LineageId,
    ) -> Result<(), DestinationError> {
        let dir = &self.dirs.runs;
        match dir.write_atomically(
            &self.dirs.tmp,
            run.as_str(),
            lineage.to_string().as_bytes(),
            false,
            IoStep::Note,
        ) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match self.run_lineage(run)? {
                    Some(l) if l == lineage => Ok(()),
                    other => Err(self.corrupt(format!(
                        "{} records lineage {other:?} for run {run}, but this run writes in \
                         lineage {lineage}",
                        self.dirs.runs.child(run.as_str()).display()
                    ))),
                }
            }
            Err(e) => Err(DestinationError::io(
                "recording the run's lineage",
                &dir.child(run.as_str()),
                e,
            )),
        }
    }

    /// Its lineage record, or a run's note naming it (outputs from before
    /// lineage records existed have only those). A run's note that cannot
    /// be read is skipped: this only tells a mistyped lineage apart.
    fn lineage_recorded(&mut self, lineage: LineageId) -> Result<Option<bool>, DestinationError> {
        let name = names::lineage_record_name(lineage);
        let lineages = &self.dirs.lineages;
        if lineages
            .stat(&name)
            .map_err(|e| DestinationError::io("looking up", &lineages.child(&name), e))?
            .is_some()
        {
            return Ok(Some(true));
        }
        let runs = &self.dirs.runs;
        let listed = runs
            .names_of(EntryKind::File)
            .map_err(|e| DestinationError::io("listing", runs.path(), e))?;
        Ok(Some(listed.iter().any(|run| {
            runs.read_file(run, 64).ok().flatten().is_some_and(|bytes| {
                names::parse_lineage_record_name(String::from_utf8_lossy(&bytes).trim())
                    == Some(lineage)
            })
        })))
    }

    fn run_lineage(&mut self, run: &RunId) -> Result<Option<LineageId>, DestinationError> {
        let dir = &self.dirs.runs;
        let path = dir.child(run.as_str());
        let Some(bytes) = dir
            .read_file(run.as_str(), 64)
            .map_err(|e| DestinationError::io("reading", &path, e))?
        else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&bytes);
        names::parse_lineage_record_name(text.trim())
            .map(Some)
            .ok_or_else(|| self.corrupt(format!("{} does not hold a lineage", path.display())))
    }
}
