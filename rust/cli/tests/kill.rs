//! Real-process crash test: `twopc-crash-worker` (examples/) writes records
//! 0..N through the filesystem destination like a Flink job with a
//! replayable source; this test SIGKILLs it at random moments, restarts it
//! (it restores from its last recorded checkpoint exactly like Flink), and
//! finally lets it finish. The committed output must hold every record
//! exactly once, with nothing left staged.
//!
//! Knobs (environment): TWOPC_KILLS (default 100), TWOPC_KILL_SEED,
//! TWOPC_KILL_RECORDS (default 3000).

mod common;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{stdout, twopc, TempDir};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The worker, an example of this package: `cargo test` builds examples
/// next to the test binaries (`target/<profile>/examples/`).
fn crash_worker() -> PathBuf {
    let test = std::env::current_exe().expect("the test's own path");
    let profile = test
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps");
    let worker = profile.join("examples").join("twopc-crash-worker");
    assert!(
        worker.exists(),
        "{} is missing: run this test with `cargo test -p twopc-cli` (it builds the examples)",
        worker.display()
    );
    worker
}

/// splitmix64, for the parent's schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

struct Episode {
    root: PathBuf,
    out: PathBuf,
    state: PathBuf,
    phase: PathBuf,
    log: PathBuf,
    records: u64,
}

impl Episode {
    fn new(root: &Path, n: u32, records: u64) -> Self {
        let root = root.join(format!("episode-{n}"));
        fs::create_dir_all(&root).unwrap();
        Episode {
            out: root.join("out"),
            state: root.join("state"),
            phase: root.join("phase"),
            log: root.join("worker.log"),
            root,
            records,
        }
    }

    fn spawn(&self, seed: u64) -> Child {
        // A missing phase file after a kill means "killed before it started".
        let _ = fs::remove_file(&self.phase);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        Command::new(crash_worker())
            .arg("--out")
            .arg(&self.out)
            .arg("--state")
            .arg(&self.state)
            .arg("--phase-file")
            .arg(&self.phase)
            .args(["--records", &self.records.to_string()])
            .args(["--every", "30", "--parallelism", "2"])
            .args(["--max-delay-us", "800", "--skip-notify-pct", "20"])
            .args(["--seed", &seed.to_string()])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("starting twopc-crash-worker")
    }

    fn phase(&self) -> String {
        fs::read_to_string(&self.phase)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "not-started".to_string())
    }

    fn worker_log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

#[derive(Default)]
struct Stats {
    kills: u64,
    spawns: u64,
    by_phase: BTreeMap<String, u64>,
    /// What the kills left behind at the destination.
    left_prepared: u64,
    left_open: u64,
    left_commit_unfinished: u64,
}

impl Stats {
    fn observe_leftovers(&mut self, out: &Path) {
        let Ok(inv) = twopc_fs::inventory(out) else {
            return;
        };
        for sink in inv {
            let decided: std::collections::HashSet<_> = sink
                .committed
                .iter()
                .map(|c| &c.handle.transaction)
                .collect();
            for s in &sink.staged {
                if decided.contains(&s.transaction) {
                    self.left_commit_unfinished += 1;
                } else if s.is_prepared() {
                    self.left_prepared += 1;
                } else {
                    self.left_open += 1;
                }
            }
        }
    }
}

/// Runs the worker until it exits; panics if it fails or hangs.
fn finish(ep: &Episode, seed: u64, stats: &mut Stats) {
    let mut child = ep.spawn(seed);
    stats.spawns += 1;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                status.success(),
                "worker failed ({status}):\n{}",
                ep.worker_log()
            );
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("worker did not finish in 120 s:\n{}", ep.worker_log());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills the worker up to `budget` times; returns whether it finished on
/// its own meanwhile.
fn kill_loop(ep: &Episode, rng: &mut Rng, budget: u64, stats: &mut Stats) -> bool {
    for _ in 0..budget {
        let mut child = ep.spawn(rng.next());
        stats.spawns += 1;
        // Mostly short lives (kills during start-up and writing), some long
        // enough to get through several checkpoints.
        let ms = if rng.next() % 4 == 0 {
            rng.range(30, 120)
        } else {
            rng.range(2, 30)
        };
        std::thread::sleep(Duration::from_millis(ms));
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                status.success(),
                "worker failed ({status}):\n{}",
                ep.worker_log()
            );
            return true;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        stats.kills += 1;
        *stats.by_phase.entry(ep.phase()).or_default() += 1;
        stats.observe_leftovers(&ep.out);
    }
    false
}

/// Every record exactly once in the visible output, nothing staged.
fn verify(ep: &Episode) {
    let mut seen = vec![0u32; ep.records as usize];
    let mut files = 0;
    for e in fs::read_dir(&ep.out).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if !name.starts_with("part-") {
            continue;
        }
        files += 1;
        let text = fs::read_to_string(e.path()).unwrap();
        for line in text.lines() {
            let i: usize = line
                .parse()
                .unwrap_or_else(|_| panic!("{name}: bad line {line:?}"));
            assert!(i < seen.len(), "{name}: record {i} out of range");
            seen[i] += 1;
        }
    }
    let missing: Vec<usize> = (0..seen.len()).filter(|&i| seen[i] == 0).collect();
    let dup: Vec<usize> = (0..seen.len()).filter(|&i| seen[i] > 1).collect();
    assert!(
        missing.is_empty() && dup.is_empty(),
        "{} records missing (first {:?}), {} duplicated (first {:?}) in {files} files; \
         evidence kept in {}",
        missing.len(),
        &missing[..missing.len().min(10)],
        dup.len(),
        &dup[..dup.len().min(10)],
        ep.root.display()
    );

    let staging = ep.out.join("_twopc/crash/staging");
    let left: Vec<_> = fs::read_dir(&staging)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "staging data left behind: {left:?}");

    // The CLI agrees: nothing needs attention.
    let o = twopc(&["inspect", ep.out.to_str().unwrap()]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    let summary = text.lines().find(|l| l.starts_with("Sink 'crash'"));
    println!(
        "episode {}: {files} part files; {}",
        ep.root.display(),
        summary.unwrap_or("")
    );
}

#[test]
fn sigkill_anywhere_keeps_exactly_once() {
    let started = Instant::now();
    let target = env_u64("TWOPC_KILLS", 100);
    let seed = env_u64("TWOPC_KILL_SEED", 0x7770_c0de);
    let records = env_u64("TWOPC_KILL_RECORDS", 3000);
    let dir = TempDir::new("kill");
    let mut rng = Rng(seed);
    let mut stats = Stats::default();
    let mut episodes = 0;
    // Normally one episode; if a fast machine lets the worker finish before
    // enough kills, another job starts in a fresh directory.
    while stats.kills < target {
        let ep = Episode::new(dir.path(), episodes, records);
        episodes += 1;
        if !kill_loop(&ep, &mut rng, target - stats.kills, &mut stats) {
            finish(&ep, rng.next(), &mut stats);
        }
        verify(&ep);
    }
    let tmp_left: usize = (0..episodes)
        .map(|n| {
            fs::read_dir(dir.path().join(format!("episode-{n}/out/_twopc/crash/tmp")))
                .map(|d| d.count())
                .unwrap_or(0)
        })
        .sum();
    println!(
        "kill test: seed {seed:#x}, {records} records, {} kills over {} worker starts in {} \
         episode(s), {:.1} s",
        stats.kills,
        stats.spawns,
        episodes,
        started.elapsed().as_secs_f64()
    );
    println!("kills by phase: {:?}", stats.by_phase);
    println!(
        "left behind at kills: {} unfinished commits, {} prepared, {} open staged transactions; \
         {tmp_left} scratch files remain in tmp/",
        stats.left_commit_unfinished, stats.left_prepared, stats.left_open
    );
    assert!(stats.kills >= target);
}
