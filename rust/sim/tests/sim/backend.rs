//! The two destinations a schedule runs against, behind one interface: how
//! to give a subtask its own destination handle, and how to read back what
//! readers see and what is still staged.

use std::path::PathBuf;
use std::sync::Arc;

use twopc_core::destination::{CommittedTransaction, StagedState};
use twopc_core::memory::{MemoryDestination, MemoryStore};
use twopc_core::{CheckpointId, Destination, SinkId, TransactionId};
use twopc_fs::{committed_view, FsDestination, FsOptions, IoMode, Layout};

use super::faults::{FaultyDestination, PlanIo, SharedFaults};

pub trait Backend {
    type Dest: Destination;

    fn name(&self) -> &'static str;

    /// A new destination handle, as a (re)started subtask would open one.
    fn destination(&self) -> Self::Dest;

    /// Every record readers can see, one entry per visible copy.
    fn visible(&self) -> Vec<Vec<u8>>;

    /// Names of staged (uncommitted) transactions, however they got there.
    fn staged(&self) -> Vec<String>;

    /// Staged transactions that were prepared, with their checkpoint.
    fn prepared(&self) -> Vec<(TransactionId, CheckpointId)>;

    /// Staged transactions whose commit was decided but did not finish
    /// (the filesystem destination's `Committing`: interrupted while it
    /// published): they hold their records until a commit or a roll-forward
    /// finishes them.
    fn decided(&self) -> Vec<TransactionId>;

    /// The destination's commit records.
    fn committed(&self) -> Vec<CommittedTransaction>;

    /// The destination times out a staged transaction on its own (a
    /// broker's or database's transaction timeout). False if it was not
    /// staged.
    fn expire_externally(&self, txn: &TransactionId, now_ms: u64) -> bool;
}

pub struct MemoryBackend {
    pub store: MemoryStore,
    sink: SinkId,
}

impl MemoryBackend {
    pub fn new(sink: SinkId, faults: SharedFaults) -> Self {
        let store = MemoryStore::new();
        store.set_faults(move |op, txn| faults.decide(op, txn));
        MemoryBackend { store, sink }
    }
}

impl Backend for MemoryBackend {
    type Dest = MemoryDestination;

    fn name(&self) -> &'static str {
        "memory"
    }

    fn destination(&self) -> MemoryDestination {
        self.store.destination(&self.sink)
    }

    fn visible(&self) -> Vec<Vec<u8>> {
        self.store.visible_records()
    }

    fn staged(&self) -> Vec<String> {
        self.store
            .staged_ids()
            .into_iter()
            .map(|t| t.as_str().to_string())
            .collect()
    }

    fn prepared(&self) -> Vec<(TransactionId, CheckpointId)> {
        self.store.prepared_ids()
    }

    /// A commit in memory is one step: never half done.
    fn decided(&self) -> Vec<TransactionId> {
        Vec::new()
    }

    fn committed(&self) -> Vec<CommittedTransaction> {
        self.store.committed()
    }

    fn expire_externally(&self, txn: &TransactionId, _now_ms: u64) -> bool {
        self.store.expire_externally(txn)
    }
}

/// The real filesystem destination in a private temporary directory,
/// removed when the schedule ends.
pub struct FsBackend {
    dir: PathBuf,
    sink: SinkId,
    faults: SharedFaults,
    io_mode: IoMode,
}

impl FsBackend {
    pub fn new(sink: SinkId, faults: SharedFaults, seed: u64, buffered: bool) -> Self {
        let dir = std::env::temp_dir().join(format!("twopc-sim-{}-{seed}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the simulation's temporary directory");
        FsBackend {
            dir,
            sink,
            faults,
            io_mode: if buffered {
                IoMode::Buffered
            } else {
                IoMode::Auto
            },
        }
    }

    fn layout(&self) -> Layout {
        Layout::new(&self.dir, &self.sink)
    }

    fn options(&self) -> FsOptions {
        FsOptions {
            io_mode: self.io_mode,
            ..FsOptions::new(&self.dir)
        }
    }
}

/// Filesystem schedules that ended with commit records folded into history
/// segments: the run checks that compaction met the protocol's trouble.
pub static FS_RUNS_WITH_HISTORY: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

impl Drop for FsBackend {
    fn drop(&mut self) {
        let history = self
            .dir
            .join("_twopc")
            .join(self.sink.as_str())
            .join("history");
        if std::fs::read_dir(history).is_ok_and(|mut d| d.next().is_some()) {
            FS_RUNS_WITH_HISTORY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Backend for FsBackend {
    type Dest = FaultyDestination<FsDestination>;

    fn name(&self) -> &'static str {
        "fs"
    }

    /// A destination whose calls may fail as a whole (before or after
    /// their effect) and whose I/O steps may fail one by one (ENOSPC, EIO).
    fn destination(&self) -> Self::Dest {
        let io = Arc::new(PlanIo::new(self.faults.clone()));
        let fs = FsDestination::open_with_faults(self.options(), &self.sink, io.clone())
            .expect("opening the filesystem destination");
        io.activate();
        FaultyDestination::new(fs, self.faults.clone(), &self.sink)
    }

    /// What a file reader sees: every file directly in the output directory
    /// except hidden ones (`.`/`_`, which Flink's and Hadoop's readers skip),
    /// one record per line.
    fn visible(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return out;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('_') || name.starts_with('.') || !entry.path().is_file() {
                continue;
            }
            let bytes = std::fs::read(entry.path()).expect("reading a visible file");
            out.extend(
                bytes
                    .split(|b| *b == b'\n')
                    .filter(|line| !line.is_empty())
                    .map(<[u8]>::to_vec),
            );
        }
        out
    }

    /// Raw directory names under `_twopc/<sink>/staging`, so that anything
    /// left there counts, parseable or not.
    fn staged(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.layout().staging) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn prepared(&self) -> Vec<(TransactionId, CheckpointId)> {
        let (staged, _) = self
            .layout()
            .read_staged()
            .expect("reading the staging area");
        staged
            .into_iter()
            .filter_map(|s| {
                let cp = s.prepared().and_then(|h| h.checkpoint())?;
                Some((s.transaction, cp))
            })
            .collect()
    }

    fn decided(&self) -> Vec<TransactionId> {
        let (staged, _) = self
            .layout()
            .read_staged()
            .expect("reading the staging area");
        staged
            .into_iter()
            .filter(|s| matches!(s.state, StagedState::Committing(_)))
            .map(|s| s.transaction)
            .collect()
    }

    fn committed(&self) -> Vec<CommittedTransaction> {
        self.layout()
            .read_commit_records()
            .expect("reading commit records")
            .iter()
            .map(committed_view)
            .collect()
    }

    /// Emulates the destination's own timeout the way retention cleanup
    /// does it: tombstone, then the staging directory goes.
    fn expire_externally(&self, txn: &TransactionId, now_ms: u64) -> bool {
        if !self.layout().staging_dir(txn).is_dir() {
            return false;
        }
        let mut fs = FsDestination::open(self.options(), &self.sink)
            .expect("opening the filesystem destination");
        fs.expire(txn, now_ms)
            .expect("expiring a staged transaction");
        true
    }
}
