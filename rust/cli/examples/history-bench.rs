//! The cost of a long commit history: open-and-recover time, the
//! fresh-start check and `twopc inspect` against 10^2 .. 10^5 committed
//! transactions, with the history folded into segments (the default) and,
//! for comparison, with one commit record per transaction forever.
//!
//! ```text
//! cargo run --release -p twopc-cli --example history-bench -- [--quick] [--json PATH] [--dir DIR]
//! ```
//!
//! Each size builds its history through the real protocol (one subtask,
//! one transaction per checkpoint, the committer's housekeeping after each
//! checkpoint as in a job), then measures, median of several runs:
//! - open-and-recover: `SubtaskSink::open` restored from the last
//!   checkpoint (ownership, rewind detection) plus the recovery commit of
//!   its handle (found already committed);
//! - fresh-start check: the destination's lineage summary, which every
//!   fresh start reads;
//! - inspect: the `twopc inspect --json` binary, default depth.
//!
//! The history is built on tmpfs (`/dev/shm`) when there is one: building
//! 10^5 transactions with real fsyncs would take most of an hour and
//! measures nothing of interest here.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use twopc_core::destination::{Destination, HistoryPolicy};
use twopc_core::records::push_record;
use twopc_core::{
    Restore, RunId, SinkId, SinkOptions, SubtaskContext, SubtaskSink, SystemClock,
    TransactionHandle, WriterState,
};
use twopc_fs::{FsDestination, FsOptions};

const SINK: &str = "bench";

fn ctx(run: &str) -> SubtaskContext {
    SubtaskContext::new(SinkId::new(SINK).unwrap(), RunId::new(run).unwrap(), 0, 1).unwrap()
}

fn dest(out: &Path) -> FsDestination {
    FsDestination::open(FsOptions::new(out), &SinkId::new(SINK).unwrap()).unwrap()
}

/// Commits `n` transactions, one per checkpoint; returns the last
/// checkpoint's restore (writer state and the last handle).
fn build(out: &Path, n: u64, options: &SinkOptions) -> Restore {
    let (mut sink, _) = SubtaskSink::open(
        dest(out),
        SystemClock,
        ctx("build-run"),
        options.clone(),
        None,
        None,
    )
    .unwrap();
    let mut batch = Vec::new();
    push_record(&mut batch, b"a record of the benchmark");
    let mut last: Option<(TransactionHandle, WriterState)> = None;
    for cp in 1..=n {
        let t = sink.begin().unwrap();
        sink.write(&t.transaction, &batch).unwrap();
        let h = sink.prepare(&t.transaction, cp).unwrap();
        let state = sink.writer_state();
        sink.commit(&h).unwrap();
        let hk = sink.checkpoint_completed(cp).unwrap();
        assert!(hk.failures.is_empty(), "{:?}", hk.failures);
        last = Some((h, state));
    }
    let (handle, state) = last.unwrap();
    Restore {
        checkpoint: n,
        states: vec![state],
        known: vec![handle],
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn time_ms(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1000.0
}

struct Row {
    mode: &'static str,
    transactions: u64,
    control_files: usize,
    open_recover_ms: f64,
    fresh_check_ms: f64,
    inspect_ms: f64,
}

fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    for sub in ["committed", "history"] {
        n += std::fs::read_dir(dir.join("_twopc").join(SINK).join(sub))
            .map(|d| d.count())
            .unwrap_or(0);
    }
    n
}

fn twopc_binary() -> PathBuf {
    // target/<profile>/examples/history-bench -> target/<profile>/twopc
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("twopc");
    assert!(
        bin.exists(),
        "{} is missing: build it first with `cargo build --release -p twopc-cli`",
        bin.display()
    );
    bin
}

fn measure(base: &Path, mode: &'static str, n: u64, options: &SinkOptions, reps: usize) -> Row {
    let out = base.join(format!("{mode}-{n}"));
    let _ = std::fs::remove_dir_all(&out);
    let restore = build(&out, n, options);
    let mut open_recover = Vec::new();
    let mut fresh = Vec::new();
    let mut inspect = Vec::new();
    let twopc = twopc_binary();
    for _ in 0..reps {
        open_recover.push(time_ms(|| {
            let (mut sink, report) = SubtaskSink::open(
                dest(&out),
                SystemClock,
                ctx("build-run"),
                options.clone(),
                Some(&restore),
                None,
            )
            .unwrap();
            assert!(!report.fresh);
            for h in &restore.known {
                sink.commit(h).unwrap();
            }
        }));
        fresh.push(time_ms(|| {
            let lineages = dest(&out).lineages().unwrap();
            assert_eq!(lineages[0].committed, n);
        }));
        inspect.push(time_ms(|| {
            let o = Command::new(&twopc)
                .args(["inspect", out.to_str().unwrap(), "--json"])
                .output()
                .unwrap();
            assert!(o.status.code() == Some(0), "{o:?}");
            let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(
                report["sinks"][0]["committed_total"], n,
                "inspect counted otherwise"
            );
        }));
    }
    let row = Row {
        mode,
        transactions: n,
        control_files: count_files(&out),
        open_recover_ms: median(open_recover),
        fresh_check_ms: median(fresh),
        inspect_ms: median(inspect),
    };
    let _ = std::fs::remove_dir_all(&out);
    row
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let base = value("--dir").map(PathBuf::from).unwrap_or_else(|| {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() { shm } else { Path::new("/tmp") }.join("twopc-history-bench")
    });
    std::fs::create_dir_all(&base).unwrap();
    let sizes: &[u64] = if quick {
        &[100, 1_000, 10_000]
    } else {
        &[100, 1_000, 10_000, 100_000]
    };
    let reps = 5;
    let folded = SinkOptions::default();
    let single = SinkOptions {
        history: HistoryPolicy {
            every_commits: 0,
            ..HistoryPolicy::default()
        },
        ..SinkOptions::default()
    };
    let mut rows = Vec::new();
    for &n in sizes {
        for (mode, options) in [("folded", &folded), ("single", &single)] {
            let row = measure(&base, mode, n, options, reps);
            eprintln!(
                "history-bench: {mode:>6} {n:>7} transactions: {:>6} control files, \
                 open+recover {:>8.2} ms, fresh-start check {:>8.2} ms, inspect {:>8.2} ms",
                row.control_files, row.open_recover_ms, row.fresh_check_ms, row.inspect_ms
            );
            rows.push(row);
        }
    }
    println!("\n| history | transactions | control files | open + recover (ms) | fresh-start check (ms) | inspect (ms) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            r.mode,
            r.transactions,
            r.control_files,
            r.open_recover_ms,
            r.fresh_check_ms,
            r.inspect_ms
        );
    }
    let first = |mode: &str| rows.iter().find(|r| r.mode == mode).unwrap();
    let last = |mode: &str| rows.iter().rev().find(|r| r.mode == mode).unwrap();
    for mode in ["folded", "single"] {
        let (a, b) = (first(mode), last(mode));
        println!(
            "{mode}: from {} to {} transactions, open+recover x{:.1}, fresh-start check x{:.1}, \
             inspect x{:.1}",
            a.transactions,
            b.transactions,
            b.open_recover_ms / a.open_recover_ms,
            b.fresh_check_ms / a.fresh_check_ms,
            b.inspect_ms / a.inspect_ms
        );
    }
    if let Some(path) = value("--json") {
        let json: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "history": r.mode,
                    "transactions": r.transactions,
                    "control_files": r.control_files,
                    "open_recover_ms": r.open_recover_ms,
                    "fresh_start_check_ms": r.fresh_check_ms,
                    "inspect_ms": r.inspect_ms,
                })
            })
            .collect();
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
        eprintln!("history-bench: figures written to {path}");
    }
    let _ = std::fs::remove_dir_all(&base);
}
