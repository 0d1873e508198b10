//! Deterministic crash simulation of the twopc protocol.
//!
//! A simulated Flink job (replayable source, checkpoints, failovers,
//! savepoint restores, stateless restarts, rescaling between 1 and 4
//! subtasks) drives the real core against the in-memory destination with
//! injected faults and against the real filesystem destination in a
//! temporary directory, crashing at every step of the protocol. After every
//! schedule the invariants in `sim/invariants.rs` are checked.
//!
//! Environment:
//! * `TWOPC_SIM_SEED=<n>`: replay one schedule with a step-by-step trace
//!   (seeds from 1000000000 on run against the filesystem destination).
//! * `TWOPC_SIM_SCHEDULES=<n>`: in-memory schedules (default 10000).
//! * `TWOPC_SIM_FS_SCHEDULES=<n>`: filesystem schedules (default 500).
//!
//! Runs without the test harness so that its summary always prints; a
//! violation prints the trace of the first failing seed and panics.

mod sim;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use twopc_core::SinkId;

use sim::backend::{FsBackend, MemoryBackend};
use sim::clock::ManualClock;
use sim::coverage::{Coverage, Section};
use sim::faults::SharedFaults;
use sim::job::SimulatedJob;
use sim::rng::Rng;
use sim::schedule::{CrashPoint, Schedule};
use sim::trace::{install_core_logger, Trace};

const DEFAULT_MEMORY_SCHEDULES: u64 = 10_000;
const DEFAULT_FS_SCHEDULES: u64 = 500;
/// Seeds at or above this run against the filesystem destination, so that
/// one number names one schedule.
const FS_SEED_BASE: u64 = 1_000_000_000;
/// Filesystem schedules wait on fsync far more than they compute.
const FS_WORKERS: usize = 4;
/// Simulated start time of in-memory schedules (fixed: part of the seed).
const MEMORY_CLOCK_START_MS: u64 = 1_790_000_000_000;

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a non-negative integer")),
    )
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic".to_string())
}

/// Runs one schedule; `Err` is a violated invariant (or a panic).
fn run_schedule(seed: u64, trace_on: bool) -> (Result<(), String>, Coverage) {
    let fs = seed >= FS_SEED_BASE;
    let schedule = Schedule::generate(seed, fs);
    let trace = Trace::new(trace_on);
    // Live decisions use a stream apart from the one that drew the shape.
    let mut rng = Rng::new(seed ^ 0x0DD5_EED5_0DD5_EED5);
    let faults = SharedFaults::new(
        rng.fork(),
        schedule.fault_rate,
        schedule.fault_budget,
        trace_on,
    );
    let sink = SinkId::new("sim").expect("valid sink id");
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        if fs {
            // Real files carry real modification times, which retention
            // compares with the clock: start it at the real time.
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let backend = FsBackend::new(sink, faults.clone(), seed, schedule.buffered_io);
            let clock = ManualClock::new(now, None);
            SimulatedJob::new(schedule, backend, clock, faults, rng, trace).run()
        } else {
            let backend = MemoryBackend::new(sink, faults.clone());
            let clock = ManualClock::new(MEMORY_CLOCK_START_MS, Some(backend.store.clone()));
            SimulatedJob::new(schedule, backend, clock, faults, rng, trace).run()
        }
    }));
    match outcome {
        Ok(r) => r,
        Err(payload) => (
            Err(format!("panicked: {}", panic_text(payload.as_ref()))),
            Coverage::default(),
        ),
    }
}

/// Runs `seeds` on `workers` threads, collecting coverage and failures.
/// Schedules share nothing, so each stays deterministic; threads only help
/// the filesystem schedules, which mostly wait for fsync.
fn batch(
    seeds: std::ops::Range<u64>,
    workers: usize,
    failures: &mut Vec<(u64, String)>,
) -> (Coverage, f64) {
    let started = Instant::now();
    let next = AtomicU64::new(seeds.start);
    let results = Mutex::new((Coverage::default(), Vec::new()));
    std::thread::scope(|scope| {
        for _ in 0..workers.max(1) {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds.end {
                    break;
                }
                let (result, c) = run_schedule(seed, false);
                let mut guard = results.lock().unwrap_or_else(|p| p.into_inner());
                let (coverage, failed) = &mut *guard;
                coverage.merge(&c);
                coverage.bump(Section::Schedules, "run");
                match result {
                    Ok(()) => coverage.bump(Section::Schedules, "passed"),
                    Err(e) => {
                        coverage.bump(Section::Schedules, "failed");
                        eprintln!("simulation: seed {seed} FAILED: {e}");
                        failed.push((seed, e));
                    }
                }
            });
        }
    });
    let (coverage, mut failed) = results.into_inner().unwrap_or_else(|p| p.into_inner());
    failed.sort();
    failures.extend(failed);
    (coverage, started.elapsed().as_secs_f64())
}

/// Coverage the default run must reach; losing it would make the
/// simulation pass without testing what it claims to.
fn required_coverage(memory: &Coverage, fs: &Coverage) -> Vec<String> {
    let mut missing = Vec::new();
    for point in CrashPoint::ALL {
        for (name, c) in [("memory", memory), ("fs", fs)] {
            if c.get(Section::CrashPoint, point.label()) == 0 {
                missing.push(format!("{name}: crash point '{}'", point.label()));
            }
        }
    }
    for stop in [
        "LOST (staged output of a completed checkpoint expired)",
        "REWIND (restore older than committed output)",
        "PREPARED_ON_FRESH_START (stateless restart)",
        "COMMIT_UNRESOLVED (retries exhausted)",
    ] {
        if memory.get(Section::FatalStop, stop) == 0 {
            missing.push(format!("memory: fatal stop '{stop}'"));
        }
    }
    missing
}

fn main() {
    // `cargo test -- --list` and similar discovery calls must not run it all.
    if std::env::args().any(|a| a == "--list") {
        println!("simulation: test");
        return;
    }
    install_core_logger();

    if let Some(seed) = env_u64("TWOPC_SIM_SEED") {
        let backend = if seed >= FS_SEED_BASE { "fs" } else { "memory" };
        println!("simulation: replaying seed {seed} against the {backend} destination");
        let (result, coverage) = run_schedule(seed, true);
        println!("{}", Coverage::table(&[(backend, &coverage)]));
        match result {
            Ok(()) => println!("simulation: 1 passed, 0 failed"),
            Err(e) => {
                println!("simulation: 0 passed, 1 failed");
                panic!("simulation: seed {seed} violated an invariant: {e}");
            }
        }
        return;
    }

    let memory_n = env_u64("TWOPC_SIM_SCHEDULES").unwrap_or(DEFAULT_MEMORY_SCHEDULES);
    let fs_n = env_u64("TWOPC_SIM_FS_SCHEDULES").unwrap_or(DEFAULT_FS_SCHEDULES);
    let mut failures = Vec::new();
    let (memory, memory_secs) = batch(0..memory_n, 1, &mut failures);
    let (fs, fs_secs) = batch(FS_SEED_BASE..FS_SEED_BASE + fs_n, FS_WORKERS, &mut failures);

    println!("\ntwopc crash simulation: coverage (counts over all schedules)\n");
    println!("{}", Coverage::table(&[("memory", &memory), ("fs", &fs)]));
    println!(
        "simulation: {memory_n} in-memory schedules in {memory_secs:.1}s (seeds 0..{memory_n}), \
         {fs_n} filesystem schedules in {fs_secs:.1}s (seeds {FS_SEED_BASE}..{})",
        FS_SEED_BASE + fs_n
    );
    // Checked only at full size: a small replay run need not reach it all.
    let gaps = if memory_n >= DEFAULT_MEMORY_SCHEDULES && fs_n >= DEFAULT_FS_SCHEDULES {
        required_coverage(&memory, &fs)
    } else {
        Vec::new()
    };
    for gap in &gaps {
        println!("simulation: coverage gap: {gap} never happened");
    }
    if let Some((seed, _)) = failures.first() {
        println!("\n--- trace of seed {seed} (replay: TWOPC_SIM_SEED={seed}) ---");
        let _ = run_schedule(*seed, true);
    }
    let failed = failures.len() as u64;
    println!(
        "simulation: {} passed, {failed} failed",
        memory_n + fs_n - failed
    );
    if let Some((seed, e)) = failures.first() {
        panic!(
            "simulation: {failed} schedules violated invariants; first: seed {seed}: {e} \
             (replay with TWOPC_SIM_SEED={seed})"
        );
    }
    assert!(gaps.is_empty(), "simulation: coverage gaps: {gaps:?}");
}
