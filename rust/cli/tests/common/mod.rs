//! Shared helpers of the cli integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use twopc_core::records::RecordBatchBuf;
use twopc_core::{
    Clock, Restore, RunId, SinkId, SinkOptions, SubtaskContext, SubtaskSink, SystemClock,
};
use twopc_fs::{FsDestination, FsOptions};

/// A fresh directory under the system temp dir, removed on drop unless the
/// test panicked (so a failure leaves the evidence behind).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let p = std::env::temp_dir().join(format!(
            "twopc-cli-{tag}-{}-{nanos}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("keeping {} for inspection", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The real clock shifted by an adjustable amount, shared by sinks.
#[derive(Clone, Default)]
pub struct ShiftClock(Arc<AtomicU64>);

impl ShiftClock {
    pub fn shift_ms(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ShiftClock {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms() + self.0.load(Ordering::SeqCst)
    }
    fn sleep_ms(&self, ms: u64) {
        SystemClock.sleep_ms(ms)
    }
}

pub type FsSink = SubtaskSink<FsDestination, ShiftClock>;

#[allow(clippy::too_many_arguments)]
pub fn open_sink(
    out: &Path,
    sink: &str,
    run: &str,
    subtask: u32,
    parallelism: u32,
    options: SinkOptions,
    clock: &ShiftClock,
    restore: Option<&Restore>,
) -> FsSink {
    try_open_sink(
        out,
        sink,
        run,
        subtask,
        parallelism,
        options,
        clock,
        restore,
    )
    .unwrap()
    .0
}

/// [`open_sink`], for a test that expects the start to fail.
#[allow(clippy::too_many_arguments, dead_code)]
pub fn try_open_sink(
    out: &Path,
    sink: &str,
    run: &str,
    subtask: u32,
    parallelism: u32,
    options: SinkOptions,
    clock: &ShiftClock,
    restore: Option<&Restore>,
) -> Result<(FsSink, twopc_core::StartupReport), twopc_core::TwopcError> {
    let sink = SinkId::new(sink).unwrap();
    let dest = FsDestination::open(FsOptions::new(out), &sink).unwrap();
    let ctx = SubtaskContext::new(sink, RunId::new(run).unwrap(), subtask, parallelism).unwrap();
    SubtaskSink::open(dest, clock.clone(), ctx, options, restore, None)
}

/// Subtask 0 of 1 of `sink` in `run`, committing visible-first.
#[allow(dead_code)]
pub fn open_visible_first_sink(
    out: &Path,
    sink: &str,
    run: &str,
    options: SinkOptions,
    clock: &ShiftClock,
) -> FsSink {
    let sink = SinkId::new(sink).unwrap();
    let fs_options = FsOptions {
        commit_order: twopc_fs::CommitOrder::VisibleFirst,
        ..FsOptions::new(out)
    };
    let dest = FsDestination::open(fs_options, &sink).unwrap();
    let ctx = SubtaskContext::new(sink, RunId::new(run).unwrap(), 0, 1).unwrap();
    SubtaskSink::open(dest, clock.clone(), ctx, options, None, None)
        .unwrap()
        .0
}

pub fn batch(records: &[&str]) -> RecordBatchBuf {
    RecordBatchBuf::from_records(records)
}

/// Runs the `twopc` binary.
pub fn twopc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_twopc"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running twopc")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
