//! Runs the targets: one input at a time on the calling thread, each
//! decode inside `catch_unwind`, watched by a watchdog thread for hangs.
//! The allocation limit is enforced by the global allocator of the test
//! binary (`tests/fuzz.rs`), which calls [`allocation_limit_exceeded`].
//!
//! What is being decoded is kept in atomics, so that the watchdog and the
//! allocator (which must not allocate) can name the target and seed.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use crate::mutate::{Framing, Mutated};
use crate::report::{dump, hex};
use crate::targets::{Stage, Target, TARGETS};

/// Largest single allocation, and largest total of live allocations, a
/// decoder may cause. Checkpoint state and control files are a few hundred
/// bytes; a decoder that asks for more than this trusted a length field.
pub const ALLOCATION_LIMIT: usize = 64 << 20;
pub const DEFAULT_INPUTS: u64 = 100_000;
pub const DEFAULT_HANG_MS: u64 = 1_000;
/// A long run must have reached each stage a target lists; shorter runs
/// (replays, quick checks) are too small to judge.
const COVERAGE_MIN_INPUTS: u64 = 10_000;
/// Share of envelope inputs that must get past the framing, in percent.
/// Below it the fix-ups are broken and the decoder proper goes untested.
const MIN_PAST_FRAMING_PERCENT: u64 = 40;
/// Failing inputs printed in full per target; the rest are counted.
const FAILURES_SHOWN: usize = 5;
/// A target stops after this many failures: the rest would only repeat.
const FAILURES_STOP: u64 = 100;

/// Index (plus one) into [`all_targets`] of the input being handled; 0
/// when none.
static CURRENT_TARGET: AtomicUsize = AtomicUsize::new(0);
static CURRENT_SEED: AtomicU64 = AtomicU64::new(0);
/// The input came from `--hex`, so it has no seed.
static CURRENT_FROM_HEX: AtomicBool = AtomicBool::new(false);
/// Counts decodes, so the watchdog can tell a long one from a new one.
static DECODES: AtomicU64 = AtomicU64::new(0);
/// Microseconds since [`EPOCH`] (plus one) at which the running decode
/// began; 0 while nothing is being decoded.
static BUSY_SINCE_US: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

fn now_us() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// The fuzz targets followed by the detectors' self-tests, so one index
/// names either.
fn all_targets() -> impl Iterator<Item = &'static dyn Target> {
    TARGETS
        .iter()
        .copied()
        .chain(crate::selftest::SELF_TESTS.iter().copied())
}

fn target_at(index: usize) -> Option<&'static dyn Target> {
    all_targets().nth(index)
}

pub fn find_target(name: &str) -> Option<(usize, &'static dyn Target)> {
    all_targets().enumerate().find(|(_, t)| t.name() == name)
}

/// Records which input is being handled (`seed` None: one given as hex).
pub fn set_current(index: usize, seed: Option<u64>) {
    CURRENT_SEED.store(seed.unwrap_or(0), Ordering::SeqCst);
    CURRENT_FROM_HEX.store(seed.is_none(), Ordering::SeqCst);
    CURRENT_TARGET.store(index + 1, Ordering::SeqCst);
}

/// Names the input being handled, without allocating (the allocator calls
/// this).
fn write_current(w: &mut dyn Write) {
    let index = CURRENT_TARGET.load(Ordering::SeqCst);
    let Some(target) = index.checked_sub(1).and_then(target_at) else {
        let _ = write!(w, "no input (harness code)");
        return;
    };
    let name = target.name();
    if CURRENT_FROM_HEX.load(Ordering::SeqCst) {
        let _ = write!(w, "target `{name}`, the input given with --hex");
    } else {
        let seed = CURRENT_SEED.load(Ordering::SeqCst);
        let _ = write!(
            w,
            "target `{name}` seed {seed}\nreplay: bash scripts/fuzz.sh --replay {name} {seed}"
        );
    }
}

/// Called by the test binary's allocator for an allocation of `size` bytes
/// (with `live` bytes then live) over [`ALLOCATION_LIMIT`]. Must not
/// allocate: the allocator cannot serve its own caller. Aborts, because an
/// allocator may not unwind.
pub fn allocation_limit_exceeded(size: usize, live: usize) -> ! {
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\nFUZZ FAILURE (allocation): {size} bytes requested with {live} bytes live, over the \
         limit of {ALLOCATION_LIMIT} bytes, while decoding "
    );
    write_current(&mut err);
    let _ = writeln!(err);
    let _ = err.flush();
    std::process::abort();
}

/// Starts the thread that aborts the process when one decode runs longer
/// than `limit`: a decoder in an infinite loop never returns to be timed,
/// so it has to be caught from outside.
pub fn start_watchdog(limit: Duration) {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        now_us();
        let limit_us = limit.as_micros() as u64;
        let tick = (limit / 4).clamp(Duration::from_millis(10), Duration::from_millis(100));
        std::thread::Builder::new()
            .name("fuzz-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(tick);
                let decode = DECODES.load(Ordering::SeqCst);
                let since = BUSY_SINCE_US.load(Ordering::SeqCst);
                if since == 0 || now_us().saturating_sub(since) <= limit_us {
                    continue;
                }
                if DECODES.load(Ordering::SeqCst) != decode {
                    continue; // it finished and another began meanwhile
                }
                report_hang(limit);
            })
            .expect("spawning the watchdog thread");
    });
}

fn report_hang(limit: Duration) -> ! {
    let mut msg = Vec::new();
    let _ = write!(
        msg,
        "\nFUZZ FAILURE (hang): one decode has run for more than {} ms: ",
        limit.as_millis()
    );
    write_current(&mut msg);
    let index = CURRENT_TARGET.load(Ordering::SeqCst);
    if !CURRENT_FROM_HEX.load(Ordering::SeqCst) {
        if let Some(target) = index.checked_sub(1).and_then(target_at) {
            // Generating is pure and cheap, so the input is made again here.
            let m = target.generate(CURRENT_SEED.load(Ordering::SeqCst));
            let _ = write!(
                msg,
                "\ninput ({} bytes): {}\n{}",
                m.bytes.len(),
                hex(&m.bytes),
                dump(&m.bytes)
            );
        }
    }
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(&msg);
    let _ = writeln!(err);
    let _ = err.flush();
    std::process::abort();
}

/// Panics inside a decode are caught and reported with the input, so the
/// default hook's message is kept for the report instead of printed.
pub fn install_panic_hook() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if BUSY_SINCE_US.load(Ordering::SeqCst) != 0 {
                *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(info.to_string());
            } else {
                default(info);
            }
        }));
    });
}

/// Decodes one input under the watchdog; `Err` is the panic message.
pub fn check_one(target: &dyn Target, bytes: &[u8], valid: bool) -> Result<Stage, String> {
    DECODES.fetch_add(1, Ordering::SeqCst);
    BUSY_SINCE_US.store(now_us(), Ordering::SeqCst);
    let result = catch_unwind(AssertUnwindSafe(|| target.check(bytes, valid)));
    BUSY_SINCE_US.store(0, Ordering::SeqCst);
    result.map_err(|payload| {
        LAST_PANIC
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic without a message".to_string())
    })
}

pub fn failure_text(target: &str, seed: Option<u64>, bytes: &[u8], message: &str) -> String {
    let origin = match seed {
        Some(seed) => format!("seed {seed}"),
        None => "input given with --hex".to_string(),
    };
    let replay = match seed {
        Some(seed) => format!("bash scripts/fuzz.sh --replay {target} {seed}"),
        None => format!("bash scripts/fuzz.sh --hex {target} {}", hex(bytes)),
    };
    format!(
        "FUZZ FAILURE (panic) in target `{target}`, {origin}:\n  {message}\ninput ({} bytes): {}\n{}replay: {replay}\n",
        bytes.len(),
        hex(bytes),
        dump(bytes),
    )
}

/// What one target's run found.
pub struct TargetReport {
    pub name: &'static str,
    pub inputs: u64,
    /// Inputs per [`Stage`], by `Stage::index`.
    pub stages: [u64; 4],
    /// Inputs that were untouched valid encodings.
    pub valid: u64,
    pub failures: u64,
    pub coverage_problems: Vec<String>,
    pub elapsed: Duration,
}

impl TargetReport {
    pub fn past_framing(&self) -> u64 {
        self.inputs - self.stages[Stage::Framing.index()]
    }

    pub fn ok(&self) -> bool {
        self.failures == 0 && self.coverage_problems.is_empty()
    }
}

/// Runs `inputs` inputs of `target` (index `index` in the table), seeds
/// `first_seed`, `first_seed + 1`, ...
pub fn run_target(index: usize, target: &dyn Target, first_seed: u64, inputs: u64) -> TargetReport {
    let started = Instant::now();
    let mut report = TargetReport {
        name: target.name(),
        inputs: 0,
        stages: [0; 4],
        valid: 0,
        failures: 0,
        coverage_problems: Vec::new(),
        elapsed: Duration::ZERO,
    };
    for i in 0..inputs {
        let seed = first_seed.wrapping_add(i);
        set_current(index, Some(seed));
        let Mutated { bytes, valid } = target.generate(seed);
        report.inputs += 1;
        report.valid += valid as u64;
        if inputs >= 1_000_000 && (i + 1) % (inputs / 10) == 0 {
            eprintln!(
                "{}: {} of {inputs} inputs, {:.0} s",
                target.name(),
                i + 1,
                started.elapsed().as_secs_f64()
            );
        }
        match check_one(target, &bytes, valid) {
            Ok(stage) => report.stages[stage.index()] += 1,
            Err(message) => {
                report.failures += 1;
                if report.failures <= FAILURES_SHOWN as u64 {
                    eprintln!(
                        "{}",
                        failure_text(target.name(), Some(seed), &bytes, &message)
                    );
                }
                if report.failures >= FAILURES_STOP {
                    eprintln!(
                        "target `{}`: stopped after {FAILURES_STOP} failures",
                        target.name()
                    );
                    break;
                }
            }
        }
    }
    CURRENT_TARGET.store(0, Ordering::SeqCst);
    report.elapsed = started.elapsed();
    if report.inputs >= COVERAGE_MIN_INPUTS {
        for &stage in target.must_reach() {
            if report.stages[stage.index()] == 0 {
                report.coverage_problems.push(format!(
                    "no input ended at stage {stage:?}: the generator no longer reaches it"
                ));
            }
        }
        if target.framing() == Framing::Envelope
            && report.past_framing() * 100 < report.inputs * MIN_PAST_FRAMING_PERCENT
        {
            report.coverage_problems.push(format!(
                "only {} of {} inputs got past the framing (at least {MIN_PAST_FRAMING_PERCENT}% expected)",
                report.past_framing(),
                report.inputs
            ));
        }
    }
    report
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

pub fn summary_table(reports: &[TargetReport]) -> String {
    let mut s = format!(
        "{:<20} {:>10} {:>18} {:>10} {:>10} {:>10} {:>8} {:>9} {:>10}  {}\n",
        "target",
        "inputs",
        "past framing",
        "decode-err",
        "invalid",
        "accepted",
        "valid",
        "time",
        "inputs/s",
        "result"
    );
    for r in reports {
        let secs = r.elapsed.as_secs_f64();
        let result = if r.failures > 0 {
            format!("{} FAILURES", r.failures)
        } else if !r.coverage_problems.is_empty() {
            format!("COVERAGE: {}", r.coverage_problems.join("; "))
        } else {
            "ok".to_string()
        };
        s.push_str(&format!(
            "{:<20} {:>10} {:>10} {:>6.1}% {:>10} {:>10} {:>10} {:>8} {:>8.1}s {:>10.0}  {}\n",
            r.name,
            r.inputs,
            r.past_framing(),
            percent(r.past_framing(), r.inputs),
            r.stages[Stage::Decode.index()],
            r.stages[Stage::Validate.index()],
            r.stages[Stage::Accepted.index()],
            r.valid,
            secs,
            if secs > 0.0 {
                r.inputs as f64 / secs
            } else {
                0.0
            },
            result
        ));
    }
    s
}
