//! A commit and an abort of the same transaction, racing: two threads with
//! a destination each, and two processes. One atomic step decides, so every
//! round ends either committed and visible (the abort saw it committed or
//! found nothing), or aborted with nothing visible and a later commit
//! answering Missing (LOST). Never both, never "already committed" with
//! nothing to see. Two commits of one transaction racing both succeed and
//! publish it once. The thread races run again acting as a file system
//! without `RENAME_NOREPLACE` (NFS), whose fallback takes two steps.

mod common;

use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Barrier;

use common::*;
use twopc_core::destination::{AbortStatus, CommitStatus, Destination};
use twopc_fs::{FsDestination, FsOptions, IoFaults, IoStep, IoTiming};

const ROUNDS: u64 = 10_000;

/// Checks one round's outcome; returns whether the commit won.
fn judge(round: u64, commit: &str, abort: &str, visible: bool, later: &str) -> bool {
    match (commit, abort) {
        ("Committed", "NotFound" | "WasCommitted") => {
            assert!(visible, "round {round}: committed but not visible");
            assert_eq!(later, "AlreadyCommitted", "round {round}");
            true
        }
        ("Missing", "Aborted") => {
            assert!(!visible, "round {round}: aborted but visible");
            assert_eq!(
                later, "Missing",
                "round {round}: a later commit must be LOST"
            );
            false
        }
        other => panic!("round {round}: impossible outcome {other:?} (visible: {visible})"),
    }
}

fn name_of_commit(s: &CommitStatus) -> &'static str {
    match s {
        CommitStatus::Committed => "Committed",
        CommitStatus::AlreadyCommitted => "AlreadyCommitted",
        CommitStatus::Missing { .. } => "Missing",
        CommitStatus::Refused { .. } => "Refused",
    }
}

fn name_of_abort(s: &AbortStatus) -> &'static str {
    match s {
        AbortStatus::Aborted => "Aborted",
        AbortStatus::NotFound => "NotFound",
        AbortStatus::WasCommitted => "WasCommitted",
    }
}

/// Acts as a file system without `RENAME_NOREPLACE` (NFS): every claim
/// and publish takes the fallback.
struct NoRenameNoreplace;

impl IoFaults for NoRenameNoreplace {
    fn inject(&self, _: IoStep, _: IoTiming, _: &Path) -> Option<io::Error> {
        None
    }

    fn lacks_rename_noreplace(&self) -> bool {
        true
    }
}

/// A destination over `dir`, with `RENAME_NOREPLACE` or acting as without,
/// committing durable-first or visible-first.
fn racer(dir: &Path, fallback: bool, visible_first: bool) -> FsDestination {
    let options = if visible_first {
        common::visible_first(dir)
    } else {
        FsOptions::new(dir)
    };
    if fallback {
        FsDestination::open_with_faults(options, &sink(), std::sync::Arc::new(NoRenameNoreplace))
            .unwrap()
    } else {
        FsDestination::open(options, &sink()).unwrap()
    }
}

/// Each race with and without `RENAME_NOREPLACE`, in both commit orders.
const VARIANTS: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

/// The rounds of a thread race: fewer where the fallback makes each one
/// slower.
fn rounds(fallback: bool) -> u64 {
    if fallback {
        ROUNDS / 5
    } else {
        ROUNDS
    }
}

#[test]
fn commit_and_abort_racing_in_two_threads_decide_once() {
    for (fallback, visible_first) in VARIANTS {
        commit_and_abort_racing_in_two_threads(fallback, visible_first);
    }
}

fn commit_and_abort_racing_in_two_threads(fallback: bool, visible_first: bool) {
    let t = TempDir::fast("race-threads");
    let mut writer = dest(&t.0);
    let mut committer = racer(&t.0, fallback, visible_first);
    let mut aborter = racer(&t.0, fallback, visible_first);
    let (mut commits, mut aborts) = (0, 0);
    for round in 0..rounds(fallback) {
        let h = stage(&mut writer, round, 1, &["r"]);
        let barrier = Barrier::new(2);
        let (c, a) = std::thread::scope(|s| {
            let c = s.spawn(|| {
                barrier.wait();
                committer.commit(&h, 1)
            });
            let a = s.spawn(|| {
                barrier.wait();
                aborter.abort(&h.transaction)
            });
            (c.join().unwrap(), a.join().unwrap())
        });
        let c = name_of_commit(&c.unwrap_or_else(|e| panic!("round {round}: commit: {e}")));
        let a = name_of_abort(&a.unwrap_or_else(|e| panic!("round {round}: abort: {e}")));
        let visible = part(&t.0, round).exists();
        let later = name_of_commit(&committer.commit(&h, 2).unwrap());
        if judge(round, c, a, visible, later) {
            commits += 1;
            std::fs::remove_file(part(&t.0, round)).unwrap();
        } else {
            aborts += 1;
        }
    }
    eprintln!(
        "two threads (fallback: {fallback}, visible first: {visible_first}), {} rounds: commit \
         won {commits}, abort won {aborts}",
        rounds(fallback)
    );
    assert!(writer.staged().unwrap().is_empty());
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    /// A worker process committing visible-first or durable-first.
    fn start(dir: &std::path::Path, visible_first: bool) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_twopc-fs-race-worker"))
            .arg(dir)
            .arg(sink().as_str())
            .arg(if visible_first {
                "visible-first"
            } else {
                "durable-first"
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the race worker");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Worker {
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn answer(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn commit_and_abort_racing_in_two_processes_decide_once() {
    // Durable-first on both sides, then a visible-first commit against a
    // durable-first abort (two versions of a sink, or a changed one).
    for committer_visible_first in [false, true] {
        commit_and_abort_racing_in_two_processes(committer_visible_first);
    }
}

fn commit_and_abort_racing_in_two_processes(committer_visible_first: bool) {
    let t = TempDir::fast("race-processes");
    let mut writer: FsDestination = dest(&t.0);
    let mut committer = Worker::start(&t.0, committer_visible_first);
    let mut aborter = Worker::start(&t.0, false);
    let (mut commits, mut aborts) = (0, 0);
    for round in 0..ROUNDS / 2 {
        let h = stage(&mut writer, round, 1, &["r"]);
        let hex: String = h.encode().iter().map(|b| format!("{b:02x}")).collect();
        // Both commands go out before either answer is read.
        committer.send(&format!("commit {hex}"));
        aborter.send(&format!("abort {}", h.transaction));
        let (c, a) = (committer.answer(), aborter.answer());
        assert!(
            !c.starts_with("error") && !a.starts_with("error"),
            "round {round}: {c} / {a}"
        );
        let visible = part(&t.0, round).exists();
        committer.send(&format!("commit {hex}"));
        let later = committer.answer();
        if judge(round, &c, &a, visible, &later) {
            commits += 1;
            std::fs::remove_file(part(&t.0, round)).unwrap();
        } else {
            aborts += 1;
        }
    }
    eprintln!(
        "two processes (visible-first commit: {committer_visible_first}), {} rounds: commit won \
         {commits}, abort won {aborts}",
        ROUNDS / 2
    );
    assert!(writer.staged().unwrap().is_empty());
}

/// Two commits of one transaction racing (a committer retrying by id while
/// an earlier attempt of it is still running, or two subtasks committing
/// what a restored state hands both): each answers committed, never
/// Missing (LOST) or an error, and the output is published once, whole,
/// with nothing of the transaction left behind.
fn judge_two_commits(round: u64, dir: &std::path::Path, a: &str, b: &str) {
    for (who, answer) in [("first", a), ("second", b)] {
        assert!(
            answer == "Committed" || answer == "AlreadyCommitted",
            "round {round}: the {who} commit answered {answer}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(part(dir, round)).unwrap(),
        "r\n",
        "round {round}"
    );
    std::fs::remove_file(part(dir, round)).unwrap();
}

#[test]
fn two_commits_of_one_transaction_racing_in_two_threads_both_succeed() {
    for (fallback, visible_first) in VARIANTS {
        two_commits_racing_in_two_threads(fallback, visible_first);
    }
}

fn two_commits_racing_in_two_threads(fallback: bool, visible_first: bool) {
    let t = TempDir::fast("race-commits-threads");
    let mut writer = dest(&t.0);
    let mut first = racer(&t.0, fallback, visible_first);
    let mut second = racer(&t.0, fallback, visible_first);
    for round in 0..rounds(fallback) {
        let h = stage(&mut writer, round, 1, &["r"]);
        let barrier = Barrier::new(2);
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| {
                barrier.wait();
                first.commit(&h, 1)
            });
            let b = s.spawn(|| {
                barrier.wait();
                second.commit(&h, 1)
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        let answer = |r: Result<CommitStatus, _>| match r {
            Ok(s) => name_of_commit(&s).to_string(),
            Err(e) => format!("error: {e}"),
        };
        judge_two_commits(round, &t.0, &answer(a), &answer(b));
    }
    assert!(writer.staged().unwrap().is_empty());
}

#[test]
fn two_commits_of_one_transaction_racing_in_two_processes_both_succeed() {
    // Both durable-first, then one of each order.
    for first_visible_first in [false, true] {
        two_commits_racing_in_two_processes(first_visible_first);
    }
}

fn two_commits_racing_in_two_processes(first_visible_first: bool) {
    let t = TempDir::fast("race-commits-processes");
    let mut writer: FsDestination = dest(&t.0);
    let mut first = Worker::start(&t.0, first_visible_first);
    let mut second = Worker::start(&t.0, false);
    for round in 0..ROUNDS / 2 {
        let h = stage(&mut writer, round, 1, &["r"]);
        let hex: String = h.encode().iter().map(|b| format!("{b:02x}")).collect();
        first.send(&format!("commit {hex}"));
        second.send(&format!("commit {hex}"));
        let (a, b) = (first.answer(), second.answer());
        judge_two_commits(round, &t.0, &a, &b);
    }
    assert!(writer.staged().unwrap().is_empty());
}

/// A commit racing retention cleanup's expiry of the same transaction:
/// one wins; a commit that finds the transaction gone names the expiry as
/// the reason (the tombstone is written while the trash still shows the
/// removal), never "removed outside twopc", which sends an operator
/// looking for someone else.
#[test]
fn a_commit_racing_an_expiry_names_the_expiry_when_it_loses() {
    let t = TempDir::fast("race-expiry");
    let mut writer = dest(&t.0);
    let mut expirer = dest(&t.0);
    let (mut commits, mut expiries) = (0, 0);
    for round in 0..ROUNDS / 5 {
        // Both commit orders, alternating (an expiry must not take a
        // visible-first commit's link for a leftover).
        let mut committer = racer(&t.0, false, round % 2 == 1);
        let h = stage(&mut writer, round, 1, &["r"]);
        let barrier = Barrier::new(2);
        let (c, e) = std::thread::scope(|s| {
            let c = s.spawn(|| {
                barrier.wait();
                committer.commit(&h, 1)
            });
            let e = s.spawn(|| {
                barrier.wait();
                expirer.expire(&h.transaction, 5)
            });
            (c.join().unwrap(), e.join().unwrap())
        });
        e.unwrap_or_else(|e| panic!("round {round}: expiry: {e}"));
        match c.unwrap_or_else(|e| panic!("round {round}: commit: {e}")) {
            CommitStatus::Committed | CommitStatus::AlreadyCommitted => {
                commits += 1;
                assert!(part(&t.0, round).exists(), "round {round}");
                std::fs::remove_file(part(&t.0, round)).unwrap();
            }
            CommitStatus::Missing { evidence } => {
                expiries += 1;
                assert!(
                    evidence.contains("retention cleanup"),
                    "round {round}: {evidence}"
                );
                assert!(!part(&t.0, round).exists(), "round {round}");
            }
            CommitStatus::Refused { reason } => {
                panic!("round {round}: the directory refuses no commit: {reason}")
            }
        }
    }
    eprintln!("commit won {commits}, expiry won {expiries}");
    assert!(writer.staged().unwrap().is_empty());
}
