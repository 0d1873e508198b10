//! What a prepare and a commit of the filesystem destination wait for, step
//! by step: the destination's fault hook is used as a probe that records
//! the time of every I/O step (before and after), and each step's share is
//! the time since the previous one. With `--load`, two threads write 1 MiB
//! blocks with `O_DIRECT` into the same file system the whole time,
//! standing in for a job's own data writes, which every device flush of a
//! sync waits behind.
//!
//!     cargo run --release -p twopc-fs --example commit-steps -- \
//!         [--dir DIR] [--transactions N] [--records N] [--load] [--visible-first]
//!
//! A benchmark (it prints figures), not a test; `bench/notes.md` quotes it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use twopc_core::destination::Destination;
use twopc_core::handle::{PreparedInfo, TransactionHandle, TransactionState};
use twopc_core::ids::{LineageId, RunId, SinkId, TransactionId};
use twopc_core::records::RecordBatchBuf;
use twopc_fs::{FsDestination, FsOptions, IoFaults, IoStep, IoTiming};

/// The probe: every step's time, in order.
#[derive(Default)]
struct StepClock(Mutex<Vec<(IoStep, IoTiming, Instant)>>);

impl IoFaults for StepClock {
    fn inject(&self, step: IoStep, timing: IoTiming, _path: &Path) -> Option<std::io::Error> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((step, timing, Instant::now()));
        None
    }
}

struct Args {
    dir: PathBuf,
    transactions: u64,
    records: usize,
    load: bool,
    visible_first: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        dir: std::env::temp_dir().join("twopc-commit-steps"),
        transactions: 200,
        records: 1000,
        load: false,
        visible_first: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().unwrap_or_else(|| panic!("{name} needs a value"));
        match arg.as_str() {
            "--dir" => args.dir = PathBuf::from(value("--dir")),
            "--transactions" => {
                args.transactions = value("--transactions").parse().expect("a count")
            }
            "--records" => args.records = value("--records").parse().expect("a count"),
            "--load" => args.load = true,
            "--visible-first" => args.visible_first = true,
            other => panic!(
                "unknown argument {other}; usage: commit-steps [--dir DIR] [--transactions N] \
                 [--records N] [--load] [--visible-first]"
            ),
        }
    }
    // Percentiles of no samples mean nothing: say so instead of failing on an
    // empty list further down.
    assert!(
        args.transactions > 0 && args.records > 0,
        "--transactions and --records need at least 1"
    );
    args
}

/// Writes 1 MiB blocks with O_DIRECT into `path` until `stop`, starting the
/// file again every 256 MiB.
fn direct_writer(path: PathBuf, stop: Arc<AtomicBool>) {
    use std::os::unix::fs::OpenOptionsExt;
    const BLOCK: usize = 1 << 20;
    // An aligned block inside a larger buffer, found without unsafe code.
    let buf = vec![b'x'; BLOCK + 4096];
    let skip = (4096 - buf.as_ptr() as usize % 4096) % 4096;
    let block = &buf[skip..skip + BLOCK];
    while !stop.load(Ordering::Relaxed) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(&path)
            .expect("a file for the direct writes (is the file system one that takes O_DIRECT?)");
        for _ in 0..256 {
            file.write_all(block).expect("a direct write");
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}

fn handle(sink: &SinkId, seq: u64, prepared: Option<(u64, u64)>) -> TransactionHandle {
    TransactionHandle {
        transaction: TransactionId::compose(sink, 0, 0x5e95, seq),
        sink: sink.clone(),
        lineage: LineageId(1),
        run: RunId::new("commit-steps").expect("a valid run id"),
        subtask: 0,
        parallelism: 1,
        begun_at_ms: 0,
        state: match prepared {
            Some((records, bytes)) => TransactionState::Prepared(PreparedInfo {
                checkpoint: seq,
                records,
                bytes,
                prepared_at_ms: 0,
            }),
            None => TransactionState::Open,
        },
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn summary(name: &str, values: &mut [f64]) {
    values.sort_by(f64::total_cmp);
    println!(
        "{name:<36} p50 {:>7.3}  p90 {:>7.3}  p99 {:>7.3}  max {:>7.3} ms",
        percentile(values, 0.5),
        percentile(values, 0.9),
        percentile(values, 0.99),
        values[values.len() - 1]
    );
}

/// Adds each step's share of one call (the time since the step before it)
/// to `steps`, keyed by its position in the call.
fn add_steps(
    steps: &mut BTreeMap<String, Vec<f64>>,
    call: &str,
    start: Instant,
    events: &[(IoStep, IoTiming, Instant)],
) {
    let mut last = start;
    for (i, (step, timing, at)) in events.iter().enumerate() {
        steps
            .entry(format!("{call} {i:02} {step:?}/{timing:?}"))
            .or_default()
            .push((*at - last).as_secs_f64() * 1e3);
        last = *at;
    }
}

fn main() {
    let args = parse_args();
    let out = args.dir.join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&out).expect("the output directory");
    let sink = SinkId::new("steps").expect("a valid sink id");
    let clock = Arc::new(StepClock::default());
    let options = FsOptions {
        commit_order: if args.visible_first {
            twopc_fs::CommitOrder::VisibleFirst
        } else {
            twopc_fs::CommitOrder::DurableFirst
        },
        ..FsOptions::new(&out)
    };
    let mut dest = FsDestination::open_with_faults(options, &sink, clock.clone())
        .expect("the destination opens");

    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = if args.load {
        (0..2)
            .map(|i| {
                let path = args.dir.join(format!("load-{}-{i}", std::process::id()));
                let stop = stop.clone();
                std::thread::spawn(move || direct_writer(path, stop))
            })
            .collect()
    } else {
        Vec::new()
    };

    let mut batch = RecordBatchBuf::terminated_by(b'\n');
    for i in 0..args.records {
        batch.push(format!("{i:020}\t{:078}", 0).as_bytes());
    }
    let bytes = args.records as u64 * 99;
    let (mut prepares, mut commits, mut visible) = (Vec::new(), Vec::new(), Vec::new());
    let mut steps = BTreeMap::new();
    for seq in 1..=args.transactions {
        let open = handle(&sink, seq, None);
        dest.begin(&open).expect("begin");
        dest.write(&open.transaction, batch.batch()).expect("write");
        let prepared = handle(&sink, seq, Some((args.records as u64, bytes)));

        clock.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let start = Instant::now();
        dest.prepare(&prepared).expect("prepare");
        prepares.push(start.elapsed().as_secs_f64() * 1e3);
        let events = std::mem::take(&mut *clock.0.lock().unwrap_or_else(|e| e.into_inner()));
        add_steps(&mut steps, "prepare", start, &events);

        let start = Instant::now();
        dest.commit(&prepared, 1).expect("commit");
        commits.push(start.elapsed().as_secs_f64() * 1e3);
        let events = std::mem::take(&mut *clock.0.lock().unwrap_or_else(|e| e.into_inner()));
        // The output is visible once the publication (a rename, or with
        // --visible-first a link) has been made; what follows only makes
        // the commit durable and tidy.
        let published = events
            .iter()
            .find(|(step, timing, _)| *step == IoStep::Publish && *timing == IoTiming::After)
            .map(|(_, _, at)| *at)
            .expect("a commit publishes its output");
        visible.push((published - start).as_secs_f64() * 1e3);
        add_steps(&mut steps, "commit", start, &events);
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.join();
    }
    drop(dest);
    let _ = std::fs::remove_dir_all(&out);

    println!(
        "{} transactions of {} records (99 bytes and a line break each) in {}{}",
        args.transactions,
        args.records,
        args.dir.display(),
        if args.load {
            ", two direct writers of 1 MiB blocks running"
        } else {
            ", no other load"
        }
    );
    summary("prepare", &mut prepares);
    summary("commit", &mut commits);
    summary("commit, until the output is visible", &mut visible);
    println!("each step's share (the time since the step before it):");
    for (name, mut values) in steps {
        summary(&format!("  {name}"), &mut values);
    }
}
