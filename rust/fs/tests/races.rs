//! A commit and an abort of the same transaction, racing: two threads with
//! a destination each, and two processes. One atomic step decides, so every
//! round ends either committed and visible (the abort saw it committed or
//! found nothing), or aborted with nothing visible and a later commit
//! answering Missing (LOST). Never both, never "already committed" with
//! nothing to see.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Barrier;

use common::*;
use twopc_core::destination::{AbortStatus, CommitStatus, Destination};
use twopc_fs::FsDestination;

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
    }
}

fn name_of_abort(s: &AbortStatus) -> &'static str {
    match s {
        AbortStatus::Aborted => "Aborted",
        AbortStatus::NotFound => "NotFound",
        AbortStatus::WasCommitted => "WasCommitted",
    }
}

#[test]
fn commit_and_abort_racing_in_two_threads_decide_once() {
    let t = TempDir::fast("race-threads");
    let mut writer = dest(&t.0);
    let mut committer = dest(&t.0);
    let mut aborter = dest(&t.0);
    let (mut commits, mut aborts) = (0, 0);
    for round in 0..ROUNDS {
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
    eprintln!("two threads, {ROUNDS} rounds: commit won {commits}, abort won {aborts}");
    assert!(writer.staged().unwrap().is_empty());
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn start(dir: &std::path::Path) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_twopc-fs-race-worker"))
            .arg(dir)
            .arg(sink().as_str())
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
    let t = TempDir::fast("race-processes");
    let mut writer: FsDestination = dest(&t.0);
    let mut committer = Worker::start(&t.0);
    let mut aborter = Worker::start(&t.0);
    let (mut commits, mut aborts) = (0, 0);
    for round in 0..ROUNDS {
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
    eprintln!("two processes, {ROUNDS} rounds: commit won {commits}, abort won {aborts}");
    assert!(writer.staged().unwrap().is_empty());
}
