//! Shared set-up of the filesystem destination's tests.
#![allow(dead_code)] // each test file uses its own part

pub mod attempts;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use twopc_core::destination::Destination;
use twopc_core::handle::{PreparedInfo, TransactionHandle, TransactionState};
use twopc_core::ids::{random_u64, LineageId, RunId, SinkId, TransactionId};
use twopc_core::records::RecordBatchBuf;
use twopc_fs::{FsDestination, FsOptions, IoFaults, IoMode, IoStep, IoTiming};

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        Self::under(&std::env::temp_dir(), name)
    }

    /// A directory on tmpfs where there is one (fsync costs nothing there),
    /// for tests that run thousands of rounds.
    pub fn fast(name: &str) -> Self {
        let shm = Path::new("/dev/shm");
        Self::under(if shm.is_dir() { shm } else { Path::new("/tmp") }, name)
    }

    fn under(base: &Path, name: &str) -> Self {
        let p = base.join(format!("twopc-fs-{name}-{:016x}", random_u64()));
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub fn sink() -> SinkId {
    SinkId::new("clicks").unwrap()
}

pub fn options(dir: &Path, mode: IoMode) -> FsOptions {
    FsOptions {
        io_mode: mode,
        ..FsOptions::new(dir)
    }
}

pub fn dest(dir: &Path) -> FsDestination {
    FsDestination::open(FsOptions::new(dir), &sink()).unwrap()
}

/// Options of a sink whose commits show their output first.
pub fn visible_first(dir: &Path) -> FsOptions {
    FsOptions {
        commit_order: twopc_fs::CommitOrder::VisibleFirst,
        ..FsOptions::new(dir)
    }
}

/// Both commit orders, with a name for assertion messages.
pub fn commit_orders(dir: &Path) -> [(&'static str, FsOptions); 2] {
    [
        ("durable-first", FsOptions::new(dir)),
        ("visible-first", visible_first(dir)),
    ]
}

pub fn txn(seq: u64) -> TransactionId {
    TransactionId::compose(&sink(), 0, 0xabcdef, seq)
}

/// A handle of `seq`: open, or prepared for `checkpoint` with the counts of
/// `records`.
pub fn handle(seq: u64, checkpoint: Option<u64>, records: &[&str]) -> TransactionHandle {
    TransactionHandle {
        transaction: txn(seq),
        sink: sink(),
        lineage: LineageId(7),
        run: RunId::new("job1").unwrap(),
        subtask: 0,
        parallelism: 1,
        begun_at_ms: 0,
        state: match checkpoint {
            Some(c) => TransactionState::Prepared(PreparedInfo {
                checkpoint: c,
                records: records.len() as u64,
                bytes: records.iter().map(|r| r.len() as u64).sum(),
                prepared_at_ms: 0,
            }),
            None => TransactionState::Open,
        },
    }
}

/// A batch in LINES output form, as the JVM sends it for LINES output.
pub fn batch(records: &[&str]) -> RecordBatchBuf {
    let mut buf = RecordBatchBuf::terminated_by(b'\n');
    for r in records {
        buf.push(r.as_bytes());
    }
    buf
}

/// Writes `records` into transaction `seq`.
pub fn write(
    d: &mut impl Destination,
    seq: u64,
    records: &[&str],
) -> Result<(), twopc_core::error::DestinationError> {
    let open = handle(seq, None, &[]);
    d.begin(&open)?;
    let buf = batch(records);
    d.write(&open.transaction, buf.batch())
}

/// Writes and prepares transaction `seq` for `checkpoint`.
pub fn stage(
    d: &mut impl Destination,
    seq: u64,
    checkpoint: u64,
    records: &[&str],
) -> TransactionHandle {
    write(d, seq, records).unwrap();
    let p = handle(seq, Some(checkpoint), records);
    d.prepare(&p).unwrap();
    p
}

/// Names a reader of the output directory would see (hidden ones skipped).
pub fn visible_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('_') && !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

pub fn part(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("part-{}", txn(seq)))
}

/// Fails one chosen I/O step, once.
#[derive(Default)]
pub struct OneFault {
    pub plan: Mutex<Option<(IoStep, IoTiming, i32)>>,
    pub fired: Mutex<Vec<(IoStep, IoTiming, PathBuf)>>,
}

impl OneFault {
    pub fn arm(&self, step: IoStep, timing: IoTiming, errno: i32) {
        *self.plan.lock().unwrap() = Some((step, timing, errno));
    }

    pub fn fired(&self) -> bool {
        !self.fired.lock().unwrap().is_empty()
    }
}

impl IoFaults for OneFault {
    fn inject(&self, step: IoStep, timing: IoTiming, path: &Path) -> Option<io::Error> {
        let mut plan = self.plan.lock().unwrap();
        match *plan {
            Some((s, t, errno)) if s == step && t == timing => {
                *plan = None;
                self.fired
                    .lock()
                    .unwrap()
                    .push((step, timing, path.to_path_buf()));
                Some(io::Error::from_raw_os_error(errno))
            }
            _ => None,
        }
    }
}

pub fn faulty(dir: &Path, mode: IoMode) -> (FsDestination, Arc<OneFault>) {
    faulty_with(options(dir, mode))
}

pub fn faulty_with(options: FsOptions) -> (FsDestination, Arc<OneFault>) {
    let faults = Arc::new(OneFault::default());
    let d = FsDestination::open_with_faults(options, &sink(), faults.clone()).unwrap();
    (d, faults)
}

/// Records every I/O step a destination takes, failing none.
#[derive(Default)]
pub struct StepLog(pub Mutex<Vec<(IoStep, IoTiming, PathBuf)>>);

impl StepLog {
    /// The paths of every `step` taken so far, in order (each once: its
    /// `Before` event).
    #[allow(dead_code)]
    pub fn paths_of(&self, step: IoStep) -> Vec<PathBuf> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(s, t, _)| *s == step && *t == IoTiming::Before)
            .map(|(_, _, p)| p.clone())
            .collect()
    }
}

impl IoFaults for StepLog {
    fn inject(&self, step: IoStep, timing: IoTiming, path: &Path) -> Option<io::Error> {
        self.0
            .lock()
            .unwrap()
            .push((step, timing, path.to_path_buf()));
        None
    }
}

/// Copies the files of a directory (a transaction's) to another.
#[allow(dead_code)]
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}
