//! Test helper for `tests/kill.rs`, not a user tool: a process that emulates
//! a Flink job with a replayable source writing through the filesystem
//! destination, so that a test can SIGKILL it anywhere and restart it.
//!
//! The source emits records `0..records` (the decimal number as the record);
//! record `i` goes to subtask `i % parallelism`. Every `every` records a
//! checkpoint is taken the way Flink's `TwoPhaseCommitSinkFunction` does it:
//!
//! 1. `prepare` the open transaction of every subtask (preCommit) and begin
//!    the next one (begin is lazy at the filesystem destination);
//! 2. record the checkpoint durably: id, source offset and the encoded
//!    handles of every pending (prepared, uncommitted) and open transaction,
//!    written to a temporary file, fsynced and renamed over `checkpoint`
//!    (this emulates Flink's checkpoint storage; the rename is the moment
//!    the checkpoint completes);
//! 3. `commit` the pending transactions (notifyCheckpointComplete). With
//!    `--skip-notify-pct`, some notifications are "lost", as Flink allows:
//!    their transactions stay pending and are committed at the next one.
//!
//! On start it restores like Flink: every subtask opens its sink with
//! `Restore { states: Vec::new(), checkpoint, known: all handles }`, re-commits its pending
//! handles (must be `Committed` or `AlreadyCommitted`), aborts its restored
//! open one, and the source resumes at the recorded offset. At the end it
//! takes a final checkpoint and closes (aborts the empty open transaction).
//!
//! The current phase is written to `--phase-file` (16 bytes at offset 0, no
//! fsync: a SIGKILL keeps the page cache) so the test can tell where each
//! kill landed. Exit codes: 0 finished, 2 bad arguments, 3 the protocol
//! failed (the message says how).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use twopc_core::records::RecordBatchBuf;
use twopc_core::{
    CommitOutcome, Restore, RunId, SinkId, SinkOptions, SubtaskContext, SubtaskSink, SystemClock,
    TransactionHandle, TransactionState,
};
use twopc_fs::{FsDestination, FsOptions};

const SINK: &str = "crash";
/// A failover restart keeps Flink's job id, so every attempt is one run.
const RUN: &str = "crash-run";

struct Args {
    out: PathBuf,
    state: PathBuf,
    phase_file: Option<PathBuf>,
    records: u64,
    every: u64,
    parallelism: u32,
    seed: u64,
    max_delay_us: u64,
    skip_notify_pct: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        out: PathBuf::new(),
        state: PathBuf::new(),
        phase_file: None,
        records: 3000,
        every: 100,
        parallelism: 2,
        seed: 1,
        max_delay_us: 0,
        skip_notify_pct: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| -> Result<u64, String> {
            v.parse().map_err(|_| format!("{v:?} is not a number"))
        };
        match flag.as_str() {
            "--out" => a.out = value()?.into(),
            "--state" => a.state = value()?.into(),
            "--phase-file" => a.phase_file = Some(value()?.into()),
            "--records" => a.records = num(value()?)?,
            "--every" => a.every = num(value()?)?.max(1),
            "--parallelism" => a.parallelism = num(value()?)?.clamp(1, 64) as u32,
            "--seed" => a.seed = num(value()?)?,
            "--max-delay-us" => a.max_delay_us = num(value()?)?,
            "--skip-notify-pct" => a.skip_notify_pct = num(value()?)?.min(100),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.out.as_os_str().is_empty() || a.state.as_os_str().is_empty() {
        return Err("--out DIR and --state DIR are required".into());
    }
    Ok(a)
}

/// xorshift64*: deterministic per seed, good enough for delays.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

struct Phase(Option<File>);

impl Phase {
    fn set(&self, name: &str) {
        if let Some(f) = &self.0 {
            let mut buf = [b' '; 16];
            buf[..name.len().min(16)].copy_from_slice(&name.as_bytes()[..name.len().min(16)]);
            let _ = f.write_all_at(&buf, 0);
        }
    }
}

/// What the emulated checkpoint storage holds.
struct Checkpoint {
    id: u64,
    offset: u64,
    handles: Vec<TransactionHandle>,
}

const CHECKPOINT_HEADER: &str = "twopc-crash-worker checkpoint v1";

fn load_checkpoint(state: &Path) -> Result<Option<Checkpoint>, String> {
    let path = state.join("checkpoint");
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let bad = |why: &str| format!("{} is damaged: {why}", path.display());
    let mut lines = text.lines();
    if lines.next() != Some(CHECKPOINT_HEADER) {
        return Err(bad("wrong header"));
    }
    let mut cp = Checkpoint {
        id: 0,
        offset: 0,
        handles: Vec::new(),
    };
    let mut ended = false;
    for line in lines {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "id" => cp.id = value.parse().map_err(|_| bad("bad id"))?,
            "offset" => cp.offset = value.parse().map_err(|_| bad("bad offset"))?,
            "handle" => {
                let bytes = from_hex(value).ok_or_else(|| bad("bad hex"))?;
                let h = TransactionHandle::decode(&bytes).map_err(|e| bad(&e.to_string()))?;
                cp.handles.push(h);
            }
            "end" => ended = true,
            _ => return Err(bad("unknown line")),
        }
    }
    if !ended {
        return Err(bad(
            "no end line (a torn write: the rename should prevent this)",
        ));
    }
    Ok(Some(cp))
}

fn store_checkpoint(state: &Path, cp: &Checkpoint) -> Result<(), String> {
    let mut text = format!("{CHECKPOINT_HEADER}\nid {}\noffset {}\n", cp.id, cp.offset);
    for h in &cp.handles {
        text.push_str("handle ");
        text.push_str(&to_hex(&h.encode()));
        text.push('\n');
    }
    text.push_str("end\n");
    let tmp = state.join("checkpoint.tmp");
    let target = state.join("checkpoint");
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let mut f = File::create(&tmp).map_err(|e| io("creating checkpoint.tmp", e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| io("writing checkpoint.tmp", e))?;
    f.sync_all().map_err(|e| io("syncing checkpoint.tmp", e))?;
    fs::rename(&tmp, &target).map_err(|e| io("renaming the checkpoint", e))?;
    File::open(state)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("syncing the state directory", e))
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

type Sink = SubtaskSink<FsDestination, SystemClock>;

struct Job {
    args: Args,
    rng: Rng,
    phase: Phase,
    sinks: Vec<Sink>,
    /// Per subtask: prepared, not yet committed.
    pending: Vec<Vec<TransactionHandle>>,
    /// Per subtask: the open transaction.
    open: Vec<TransactionHandle>,
    offset: u64,
    next_checkpoint: u64,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("twopc-crash-worker: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twopc-crash-worker: FAILED: {e}");
            ExitCode::from(3)
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    fs::create_dir_all(&args.state).map_err(|e| format!("creating state dir: {e}"))?;
    let phase = Phase(match &args.phase_file {
        Some(p) => Some(
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(p)
                .map_err(|e| format!("opening phase file: {e}"))?,
        ),
        None => None,
    });
    phase.set("restore");
    let restored = load_checkpoint(&args.state)?;
    let restore = restored.as_ref().map(|c| Restore {
        states: Vec::new(),
        checkpoint: c.id,
        known: c.handles.clone(),
    });
    let sink_id = SinkId::new(SINK).map_err(|e| e.to_string())?;
    let run = RunId::new(RUN).map_err(|e| e.to_string())?;

    let mut job = Job {
        rng: Rng::new(args.seed),
        phase,
        sinks: Vec::new(),
        pending: Vec::new(),
        open: Vec::new(),
        offset: restored.as_ref().map_or(0, |c| c.offset),
        next_checkpoint: restored.as_ref().map_or(1, |c| c.id + 1),
        args,
    };

    // initializeState of every subtask: open (recovery decisions), then
    // recoverAndCommit / recoverAndAbort of its own restored handles.
    for i in 0..job.args.parallelism {
        let ctx = SubtaskContext::new(sink_id.clone(), run.clone(), i, job.args.parallelism)
            .map_err(|e| e.to_string())?;
        let dest = FsDestination::open(FsOptions::new(&job.args.out), &sink_id)
            .map_err(|e| format!("opening the destination: {e}"))?;
        let (mut sink, _report) = SubtaskSink::open(
            dest,
            SystemClock,
            ctx,
            SinkOptions::default(),
            restore.as_ref(),
            None,
        )
        .map_err(|e| format!("subtask {i} failed to start: {e}"))?;
        for h in restore.iter().flat_map(|r| &r.known) {
            if h.subtask != i {
                continue;
            }
            match h.state {
                TransactionState::Prepared(_) | TransactionState::PreparedAt { .. } => {
                    job.phase.set("recover-commit");
                    let outcome = sink
                        .commit(h)
                        .map_err(|e| format!("re-committing restored {}: {e}", h.transaction))?;
                    log::info!("restored {} re-committed: {outcome:?}", h.transaction);
                }
                TransactionState::Open => {
                    job.phase.set("recover-abort");
                    sink.abort(h)
                        .map_err(|e| format!("aborting restored {}: {e}", h.transaction))?;
                }
            }
            job.delay(3);
        }
        let open = sink
            .begin()
            .map_err(|e| format!("subtask {i}: begin: {e}"))?;
        job.sinks.push(sink);
        job.pending.push(Vec::new());
        job.open.push(open);
    }

    job.phase.set("write");
    let total = job.args.records;
    while job.offset < total {
        let i = job.offset;
        let st = (i % u64::from(job.args.parallelism)) as usize;
        let mut batch = RecordBatchBuf::new();
        batch.push(i.to_string().as_bytes());
        let txn = job.open[st].transaction.clone();
        job.sinks[st]
            .write(&txn, &batch)
            .map_err(|e| format!("writing record {i}: {e}"))?;
        job.offset += 1;
        job.delay(1);
        if job.offset % job.args.every == 0 && job.offset < total {
            let lose_notification = job.rng.below(100) < job.args.skip_notify_pct;
            job.checkpoint(!lose_notification)?;
            job.phase.set("write");
        }
    }
    // The final checkpoint is always notified, then the job closes.
    job.checkpoint(true)?;
    job.phase.set("close");
    for st in 0..job.sinks.len() {
        let h = job.open[st].clone();
        job.sinks[st]
            .abort(&h)
            .map_err(|e| format!("closing subtask {st}: {e}"))?;
    }
    job.phase.set("done");
    Ok(())
}

impl Job {
    /// A random pause of up to `scale` times the configured maximum, so that
    /// kills land in every phase.
    fn delay(&mut self, scale: u64) {
        let us = self.rng.below(self.args.max_delay_us * scale + 1);
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
    }

    fn checkpoint(&mut self, notify: bool) -> Result<(), String> {
        let id = self.next_checkpoint;
        self.next_checkpoint += 1;

        // snapshotState: preCommit the open transaction, begin the next.
        self.phase.set("prepare");
        for st in 0..self.sinks.len() {
            let txn = self.open[st].transaction.clone();
            let h = self.sinks[st]
                .prepare(&txn, id)
                .map_err(|e| format!("preparing {txn} for checkpoint {id}: {e}"))?;
            self.pending[st].push(h);
            self.open[st] = self.sinks[st]
                .begin()
                .map_err(|e| format!("subtask {st}: begin: {e}"))?;
            self.delay(10);
        }

        // The checkpoint completes when its state is durable.
        self.phase.set("checkpoint");
        let handles = self
            .pending
            .iter()
            .flatten()
            .chain(self.open.iter())
            .cloned()
            .collect();
        store_checkpoint(
            &self.args.state,
            &Checkpoint {
                id,
                offset: self.offset,
                handles,
            },
        )?;
        self.delay(10);
        if !notify {
            log::info!("checkpoint {id}: notification lost; its transactions stay pending");
            return Ok(());
        }

        // notifyCheckpointComplete: commit everything pending.
        self.phase.set("commit");
        for st in 0..self.sinks.len() {
            for h in std::mem::take(&mut self.pending[st]) {
                let outcome = self.sinks[st]
                    .commit(&h)
                    .map_err(|e| format!("committing {} (checkpoint {id}): {e}", h.transaction))?;
                if outcome == CommitOutcome::AlreadyCommitted {
                    return Err(format!(
                        "{} was already committed at its first commit: something else \
                         committed it",
                        h.transaction
                    ));
                }
                self.delay(10);
            }
            // Then the sink's housekeeping (lingering aborts after a
            // restore, retention), whose failures are reported, not raised.
            let report = self.sinks[st]
                .checkpoint_completed(id)
                .map_err(|e| format!("subtask {st}: checkpoint {id} completed: {e}"))?;
            for f in report.failures {
                log::warn!("subtask {st}: {f}");
            }
        }
        Ok(())
    }
}
