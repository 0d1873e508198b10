//! The command line of the fuzz test binary (`cargo test -p twopc-fuzz
//! --test fuzz -- <options>`; `scripts/fuzz.sh` passes its options here).

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use crate::report::{dump, hex, parse_hex};
use crate::runner::{
    self, check_one, failure_text, find_target, run_target, summary_table, DEFAULT_HANG_MS,
    DEFAULT_INPUTS,
};
use crate::targets::TARGETS;

const USAGE: &str = "\
options (environment in brackets):
  --inputs N          inputs per target [TWOPC_FUZZ_INPUTS], default 100000; 1e7 is accepted
  --seed S            first seed [TWOPC_FUZZ_SEED], default 0; `random` draws one
  --seeds A..B        seeds A to B-1 (sets --seed and --inputs), to split a long run
  --hang-ms N         one decode running longer fails the run [TWOPC_FUZZ_HANG_MS], default 1000
  --replay TARGET S   decode input S of TARGET and report it
  --hex TARGET HEX    decode the given bytes as TARGET
  --list              list the targets
  --no-self-test      skip the check that the panic, hang and allocation detectors fire
  NAME...             run only targets whose name contains NAME; --skip NAME leaves some out";

enum Mode {
    Run,
    Replay(String, u64),
    Hex(String, Vec<u8>),
    List,
    SelfTestChild(String),
}

struct Options {
    mode: Mode,
    inputs: u64,
    seed: u64,
    hang: Duration,
    filters: Vec<String>,
    skips: Vec<String>,
    self_test: bool,
}

/// `100000`, `100_000`, `1e7`, `2.5e6`.
fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    match t.split_once(['e', 'E']) {
        Some((m, e)) => {
            let m: f64 = m.parse().map_err(|_| format!("{s:?} is not a number"))?;
            let e: i32 = e.parse().map_err(|_| format!("{s:?} is not a number"))?;
            let v = m * 10f64.powi(e);
            if v.is_finite() && v >= 0.0 && v <= u64::MAX as f64 && v.fract() == 0.0 {
                Ok(v as u64)
            } else {
                Err(format!("{s:?} is not a whole non-negative number"))
            }
        }
        None => Err(format!("{s:?} is not a non-negative integer")),
    }
}

fn parse_seed(s: &str) -> Result<u64, String> {
    if s == "random" {
        let seed = twopc_core::ids::random_u64() >> 16;
        eprintln!("random seed: {seed}");
        return Ok(seed);
    }
    parse_count(s)
}

fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn parse_args(args: Vec<String>) -> Result<Options, String> {
    let mut o = Options {
        mode: Mode::Run,
        inputs: match env_value("TWOPC_FUZZ_INPUTS") {
            Some(v) => parse_count(&v).map_err(|e| format!("TWOPC_FUZZ_INPUTS: {e}"))?,
            None => DEFAULT_INPUTS,
        },
        seed: match env_value("TWOPC_FUZZ_SEED") {
            Some(v) => parse_seed(&v).map_err(|e| format!("TWOPC_FUZZ_SEED: {e}"))?,
            None => 0,
        },
        hang: Duration::from_millis(match env_value("TWOPC_FUZZ_HANG_MS") {
            Some(v) => parse_count(&v).map_err(|e| format!("TWOPC_FUZZ_HANG_MS: {e}"))?,
            None => DEFAULT_HANG_MS,
        }),
        filters: Vec::new(),
        skips: Vec::new(),
        self_test: true,
    };
    let mut it = args.into_iter();
    let next = |it: &mut std::vec::IntoIter<String>, what: &str| {
        it.next().ok_or_else(|| format!("{what} needs a value"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--inputs" => o.inputs = parse_count(&next(&mut it, "--inputs")?)?,
            "--seed" => o.seed = parse_seed(&next(&mut it, "--seed")?)?,
            "--seeds" => {
                let v = next(&mut it, "--seeds")?;
                let (a, b) = v
                    .split_once("..")
                    .ok_or_else(|| format!("--seeds {v:?}: expected A..B"))?;
                let (a, b) = (parse_count(a)?, parse_count(b)?);
                if b < a {
                    return Err(format!("--seeds {v:?}: the range is backwards"));
                }
                o.seed = a;
                o.inputs = b - a;
            }
            "--hang-ms" => {
                o.hang = Duration::from_millis(parse_count(&next(&mut it, "--hang-ms")?)?)
            }
            "--replay" => {
                let target = next(&mut it, "--replay")?;
                let seed = parse_count(&next(&mut it, "--replay TARGET")?)?;
                o.mode = Mode::Replay(target, seed);
            }
            "--hex" => {
                let target = next(&mut it, "--hex")?;
                let bytes = parse_hex(&next(&mut it, "--hex TARGET")?)?;
                o.mode = Mode::Hex(target, bytes);
            }
            "--self-test-child" => {
                o.mode = Mode::SelfTestChild(next(&mut it, "--self-test-child")?)
            }
            "--list" => o.mode = Mode::List,
            "--no-self-test" => o.self_test = false,
            "--skip" => o.skips.push(next(&mut it, "--skip")?),
            "-h" | "--help" => return Err(String::new()),
            // What `cargo test -- <flags>` may pass on to every test binary.
            "--test-threads" | "--color" | "--format" => {
                next(&mut it, &arg)?;
            }
            s if s.starts_with('-') => eprintln!("ignoring option {s}"),
            filter => o.filters.push(filter.to_string()),
        }
    }
    Ok(o)
}

fn selected(o: &Options) -> Vec<(usize, &'static dyn crate::targets::Target)> {
    TARGETS
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, t)| {
            o.filters.is_empty() || o.filters.iter().any(|f| t.name().contains(f.as_str()))
        })
        .filter(|(_, t)| !o.skips.iter().any(|s| t.name().contains(s.as_str())))
        .collect()
}

/// Entry point of the test binary. `allocation_limited` tells whether its
/// global allocator enforces [`runner::ALLOCATION_LIMIT`].
pub fn main(allocation_limited: bool) -> ExitCode {
    let o = match parse_args(std::env::args().skip(1).collect()) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match &o.mode {
        Mode::List => {
            for t in TARGETS {
                println!("{}", t.name());
            }
            ExitCode::SUCCESS
        }
        Mode::Replay(name, seed) => replay(name, Some(*seed), None, o.hang),
        Mode::Hex(name, bytes) => replay(name, None, Some(bytes.clone()), o.hang),
        Mode::SelfTestChild(name) => self_test_child(name, o.hang),
        Mode::Run => run(&o, allocation_limited),
    }
}

fn run(o: &Options, allocation_limited: bool) -> ExitCode {
    let targets = selected(o);
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!(
        "twopc fuzz ({build} build): {} target(s), {} inputs each (seeds {}..{}), hang limit {} ms, allocation limit {}",
        targets.len(),
        o.inputs,
        o.seed,
        o.seed.wrapping_add(o.inputs),
        o.hang.as_millis(),
        if allocation_limited { "64 MiB" } else { "OFF" }
    );
    let mut ok = true;
    if o.self_test && !targets.is_empty() {
        match self_test(allocation_limited) {
            Ok(()) => println!("detectors: panic, hang and allocation failures are caught"),
            Err(e) => {
                eprintln!("detector self-test FAILED: {e}");
                ok = false;
            }
        }
    }
    runner::install_panic_hook();
    runner::start_watchdog(o.hang);
    let started = Instant::now();
    let mut reports = Vec::new();
    for (index, target) in targets {
        let report = run_target(index, target, o.seed, o.inputs);
        eprintln!(
            "{}: {} inputs in {:.1} s",
            report.name,
            report.inputs,
            report.elapsed.as_secs_f64()
        );
        ok &= report.ok();
        reports.push(report);
    }
    print!("{}", summary_table(&reports));
    let total: u64 = reports.iter().map(|r| r.inputs).sum();
    let failures: u64 = reports.iter().map(|r| r.failures).sum();
    println!(
        "{total} inputs in {:.1} s, {failures} failures: {}",
        started.elapsed().as_secs_f64(),
        if ok { "ok" } else { "FAILED" }
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn replay(
    name: &str,
    seed: Option<u64>,
    hex_input: Option<Vec<u8>>,
    hang: std::time::Duration,
) -> ExitCode {
    let Some((index, target)) = find_target(name) else {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.name()).collect();
        eprintln!("no target {name:?}; targets: {}", names.join(", "));
        return ExitCode::from(2);
    };
    let (bytes, valid) = match hex_input {
        Some(b) => (b, false),
        None => {
            let m = target.generate(seed.unwrap_or(0));
            (m.bytes, m.valid)
        }
    };
    println!(
        "target `{name}`{}: {} bytes{}\n{}\n{}",
        seed.map(|s| format!(" seed {s}")).unwrap_or_default(),
        bytes.len(),
        if valid {
            " (an untouched valid encoding)"
        } else {
            ""
        },
        hex(&bytes),
        dump(&bytes)
    );
    // The default panic hook stays: it prints the location, and a
    // backtrace with RUST_BACKTRACE=1.
    runner::start_watchdog(hang);
    runner::set_current(index, seed);
    match check_one(target, &bytes, valid) {
        Ok(stage) => {
            println!("decoded without failure; stage reached: {stage:?}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("{}", failure_text(name, seed, &bytes, &message));
            ExitCode::FAILURE
        }
    }
}

/// Runs one misbehaving target's first input, reported as a real one would be.
fn self_test_child(name: &str, hang: Duration) -> ExitCode {
    let Some((index, target)) = find_target(name) else {
        eprintln!("no self-test {name:?}");
        return ExitCode::from(2);
    };
    runner::install_panic_hook();
    runner::start_watchdog(hang);
    let report = run_target(index, target, 0, 1);
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Each detector, shown to fire on a decoder that misbehaves that way: the
/// child must fail, and say what and where.
fn self_test(allocation_limited: bool) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the test binary: {e}"))?;
    let mut cases = vec![
        (
            "selftest-panic",
            "FUZZ FAILURE (panic) in target `selftest-panic`, seed 0",
        ),
        ("selftest-hang", "FUZZ FAILURE (hang)"),
    ];
    if allocation_limited {
        cases.push(("selftest-allocate", "FUZZ FAILURE (allocation)"));
    }
    for (name, expected) in cases {
        let out = Command::new(&exe)
            .args(["--self-test-child", name, "--hang-ms", "200"])
            .env_remove("TWOPC_FUZZ_HANG_MS")
            .output()
            .map_err(|e| format!("running {}: {e}", exe.display()))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return Err(format!("{name}: the misbehaving decoder passed"));
        }
        if !stderr.contains(expected) || !stderr.contains(name) {
            return Err(format!(
                "{name}: failed ({}) without the expected report {expected:?}:\n{stderr}",
                out.status
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn counts_accept_exponents_and_separators() {
        assert_eq!(parse_count("1e7").unwrap(), 10_000_000);
        assert_eq!(parse_count("2.5e6").unwrap(), 2_500_000);
        assert_eq!(parse_count("100_000").unwrap(), 100_000);
        assert!(parse_count("1.5").is_err());
        assert!(parse_count("-3").is_err());
        assert!(parse_count("1e-1").is_err());
    }

    #[test]
    fn seed_ranges_and_modes() {
        let o = parse_args(args("--seeds 5000..7000 handle --skip batch")).unwrap();
        assert_eq!((o.seed, o.inputs), (5000, 2000));
        assert_eq!(o.filters, vec!["handle"]);
        assert_eq!(o.skips, vec!["batch"]);
        let o = parse_args(args("--replay handle 42")).unwrap();
        assert!(matches!(o.mode, Mode::Replay(ref t, 42) if t == "handle"));
        let o = parse_args(args("--hex envelope 5457 --nocapture")).unwrap();
        assert!(matches!(o.mode, Mode::Hex(_, ref b) if b == &[0x54, 0x57]));
        assert!(parse_args(args("--seeds 9..3")).is_err());
        assert!(parse_args(args("--inputs")).is_err());
    }
}
