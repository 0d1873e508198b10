//! `twopc reconcile` and `twopc decide` on real output directories built
//! with the filesystem destination and the protocol.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use twopc_core::{CommitOutcome, Restore, SinkOptions, TransactionHandle, TwopcError, WriterState};

fn output(tag: &str) -> (TempDir, PathBuf, ShiftClock) {
    let dir = TempDir::new(tag);
    let out = dir.path().join("out");
    (dir, out, ShiftClock::default())
}

fn commit_one(s: &mut FsSink, records: &[&str], checkpoint: u64) -> TransactionHandle {
    let h = prepare_one(s, records, checkpoint);
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    h
}

fn prepare_one(s: &mut FsSink, records: &[&str], checkpoint: u64) -> TransactionHandle {
    let t = s.begin().unwrap();
    s.write(&t.transaction, &batch(records)).unwrap();
    s.prepare(&t.transaction, checkpoint).unwrap()
}

/// Every file under `dir` with its contents: a snapshot to compare. The
/// owner lock files are left out (every command holds them while it runs,
/// and writes its claim there), and so is the operations log (every change
/// by hand, and every decision asked for, adds to it; checked on its own).
/// [`snapshot`] without the runs' lineage notes of sink `orders` (a
/// restore writes its note before its checks).
fn snapshot_but_run_notes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = snapshot(dir);
    files.retain(|k, _| !k.starts_with("_twopc/orders/runs/"));
    files
}

fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.ends_with("owners") || p.ends_with("operations") {
                continue;
            }
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

fn part(out: &Path, h: &TransactionHandle) -> PathBuf {
    out.join(format!("part-{}", h.transaction))
}

/// Checkpoints 1, 2 and 3 of run-a committed by subtask 0; the sink is
/// closed again. Returns the handles, the writer state after checkpoint 1
/// and the lineage.
struct Three {
    _dir: TempDir,
    out: PathBuf,
    clock: ShiftClock,
    h: Vec<TransactionHandle>,
    state_at_1: WriterState,
    state_at_3: WriterState,
    lineage: String,
}

fn three(tag: &str) -> Three {
    let (dir, out, clock) = output(tag);
    let mut s = open_sink(
        &out,
        "orders",
        "run-a",
        0,
        1,
        SinkOptions::default(),
        &clock,
        None,
    );
    let h1 = commit_one(&mut s, &["a", "b"], 1);
    let state_at_1 = s.writer_state();
    let h2 = commit_one(&mut s, &["c"], 2);
    let h3 = commit_one(&mut s, &["d", "e", "f"], 3);
    let state_at_3 = s.writer_state();
    let lineage = s.lineage().to_string();
    drop(s);
    Three {
        _dir: dir,
        out,
        clock,
        h: vec![h1, h2, h3],
        state_at_1,
        state_at_3,
        lineage,
    }
}

/// Run run-a on after checkpoint 3, as Flink does: restored from it (a
/// start without state under the same job id would be refused, its output
/// being committed). A subtask beyond run-a's first parallelism has no
/// state of its own in it.
fn resume(t: &Three, subtask: u32, parallelism: u32) -> FsSink {
    let states = if subtask == 0 {
        vec![t.state_at_3.clone()]
    } else {
        Vec::new()
    };
    let restore = Restore {
        states,
        checkpoint: 3,
        known: Vec::new(),
    };
    open_sink(
        &t.out,
        "orders",
        "run-a",
        subtask,
        parallelism,
        SinkOptions::default(),
        &t.clock,
        Some(&restore),
    )
}

fn reconcile(t: &Three, after: &str, extra: &[&str]) -> std::process::Output {
    reconcile_at(&t.out, &t.lineage, after, extra)
}

fn reconcile_at(out: &Path, lineage: &str, after: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "reconcile",
        out.to_str().unwrap(),
        "--sink",
        "orders",
        "--lineage",
        lineage,
        "--after-checkpoint",
        after,
    ];
    args.extend_from_slice(extra);
    twopc(&args)
}

#[test]
fn reconcile_dry_run_lists_and_changes_nothing() {
    let t = three("rc-dry");
    let before = snapshot(&t.out);
    let o = reconcile(&t, "1", &[]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    assert!(text.contains("2 transaction(s), 4 records"), "{text}");
    assert!(
        text.contains(&format!("would remove {}", t.h[1].transaction)),
        "{text}"
    );
    assert!(
        text.contains(&format!("would remove {}", t.h[2].transaction)),
        "{text}"
    );
    assert!(!text.contains(t.h[0].transaction.as_str()), "{text}");
    assert!(text.contains("Dry run: nothing was changed"), "{text}");
    assert!(text.contains("--after-checkpoint 1 --apply"), "{text}");
    // Not a byte of output or control data changed.
    assert_eq!(snapshot(&t.out), before);
}

#[test]
fn reconcile_apply_removes_later_output_and_is_idempotent() {
    let t = three("rc-apply");
    let o = reconcile(&t, "1", &["--apply"]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{text}{}", stderr(&o));
    assert!(
        text.contains(&format!("removed {}", t.h[1].transaction)),
        "{text}"
    );
    assert!(
        text.contains(&format!("removed {}", t.h[2].transaction)),
        "{text}"
    );
    assert!(
        text.contains("Removed 2 transaction(s), 4 records"),
        "{text}"
    );
    // Each removal is logged on stderr too.
    assert!(
        stderr(&o).contains(&format!(
            "removing the output of transaction {}",
            t.h[2].transaction
        )),
        "{}",
        stderr(&o)
    );
    assert!(part(&t.out, &t.h[0]).exists());
    assert!(!part(&t.out, &t.h[1]).exists());
    assert!(!part(&t.out, &t.h[2]).exists());
    // The operations log has each removal (written before it) and the end.
    let log = operations(&t.out);
    assert_eq!(log.len(), 3, "{log:?}");
    assert_eq!(log[0]["command"], "reconcile");
    assert_eq!(log[0]["transaction"], t.h[1].transaction.as_str());
    assert!(log[1]["what"]
        .as_str()
        .unwrap()
        .contains("removing the output of transaction"));
    assert!(log[2]["what"]
        .as_str()
        .unwrap()
        .starts_with("removed the output of 2 transactions"));
    assert!(log[2]["by"].as_str().unwrap().contains('@'), "{log:?}");

    // Again: nothing left to remove, nothing changed.
    let before = snapshot(&t.out);
    let again = reconcile(&t, "1", &["--apply"]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(
        stdout(&again).contains("nothing to remove"),
        "{}",
        stdout(&again)
    );
    assert_eq!(snapshot(&t.out), before);

    // The core agrees: a restore of checkpoint 1 finds no later output
    // (with the default rewind policy it would otherwise stop).
    let restore = Restore {
        checkpoint: 1,
        states: vec![t.state_at_1.clone()],
        known: Vec::new(),
    };
    let s = open_sink(
        &t.out,
        "orders",
        "run-b",
        0,
        1,
        SinkOptions::default(),
        &t.clock,
        Some(&restore),
    );
    drop(s);
}

#[test]
fn without_reconcile_the_restore_stops_on_rewind() {
    // The counterpart of the test above: the output reconcile lists is
    // exactly what rewind detection stops on.
    let t = three("rc-rewind");
    let restore = Restore {
        checkpoint: 1,
        states: vec![t.state_at_1.clone()],
        known: Vec::new(),
    };
    let sink = twopc_core::SinkId::new("orders").unwrap();
    let dest = twopc_fs::FsDestination::open(twopc_fs::FsOptions::new(&t.out), &sink).unwrap();
    let ctx = twopc_core::SubtaskContext::new(sink, twopc_core::RunId::new("run-b").unwrap(), 0, 1)
        .unwrap();
    let err = twopc_core::SubtaskSink::open(
        dest,
        t.clock.clone(),
        ctx,
        SinkOptions::default(),
        Some(&restore),
        None,
    )
    .err()
    .expect("rewind must stop the restore");
    let TwopcError::Rewind(r) = &err else {
        panic!("expected a rewind, got {err}");
    };
    let mut named: Vec<String> = r
        .committed_after
        .iter()
        .map(|(t, _)| t.to_string())
        .collect();
    named.sort();
    let mut listed = vec![
        t.h[1].transaction.to_string(),
        t.h[2].transaction.to_string(),
    ];
    listed.sort();
    assert_eq!(named, listed);
    // The message names the exact command that reconciles.
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "twopc reconcile <destination> --sink orders --lineage {} --after-checkpoint 1",
            t.lineage
        )),
        "{msg}"
    );
}

#[test]
fn reconcile_and_decide_refuse_while_a_live_run_owns_the_sink() {
    let t = three("rc-owned");
    // A live run: holds subtask 0's share.
    let live = open_sink(
        &t.out,
        "orders",
        "run-live",
        0,
        1,
        SinkOptions {
            fresh_start: twopc_core::FreshStartPolicy::Append,
            ..SinkOptions::default()
        },
        &t.clock,
        None,
    );
    let before = snapshot(&t.out);
    for o in [
        reconcile(&t, "1", &["--apply"]),
        twopc(&[
            "decide",
            t.out.to_str().unwrap(),
            "--sink",
            "orders",
            "--abort",
            t.h[2].transaction.as_str(),
        ]),
    ] {
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(3), "{err}{}", stdout(&o));
        assert!(err.contains("owned by a live run"), "{err}");
        assert!(err.contains("run-live"), "{err}");
        assert!(err.contains("stop the job"), "{err}");
    }
    assert_eq!(snapshot(&t.out), before);
    drop(live);
    // Once the run is gone the command runs.
    assert_eq!(reconcile(&t, "1", &["--apply"]).status.code(), Some(0));
}

/// Run-a prepared checkpoint 4 and died; a fresh start of run-b refuses
/// the leftover. Returns the leftover's handle.
fn leftover(tag: &str) -> (Three, TransactionHandle) {
    let t = three(tag);
    let mut s = resume(&t, 0, 1);
    let p = prepare_one(&mut s, &["x", "y"], 4);
    drop(s);
    let sink = twopc_core::SinkId::new("orders").unwrap();
    let dest = twopc_fs::FsDestination::open(twopc_fs::FsOptions::new(&t.out), &sink).unwrap();
    let ctx = twopc_core::SubtaskContext::new(sink, twopc_core::RunId::new("run-b").unwrap(), 0, 1)
        .unwrap();
    let err = twopc_core::SubtaskSink::open(
        dest,
        t.clock.clone(),
        ctx,
        SinkOptions {
            fresh_start: twopc_core::FreshStartPolicy::Append,
            ..SinkOptions::default()
        },
        None,
        None,
    )
    .err()
    .expect("the leftover must stop a fresh start");
    let msg = err.to_string();
    assert!(matches!(err, TwopcError::PreparedOnFreshStart(_)), "{msg}");
    assert!(
        msg.contains(&format!(
            "twopc decide <destination> --sink orders --commit {}",
            p.transaction
        )),
        "{msg}"
    );
    (t, p)
}

fn decide(t: &Three, how: &str, txn: &str) -> std::process::Output {
    decide_at(&t.out, how, txn)
}

/// `twopc decide <out> --sink orders <how> <txn>`.
fn decide_at(out: &Path, how: &str, txn: &str) -> std::process::Output {
    twopc(&[
        "decide",
        out.to_str().unwrap(),
        "--sink",
        "orders",
        how,
        txn,
    ])
}

#[test]
fn decide_commit_of_a_prepared_leftover() {
    let (t, p) = leftover("dc-commit");
    let o = decide(&t, "--commit", p.transaction.as_str());
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("committed transaction"),
        "{}",
        stdout(&o)
    );
    assert_eq!(fs::read_to_string(part(&t.out, &p)).unwrap(), "x\ny\n");
    // The request went into the operations log first, then the outcome.
    let log = operations(&t.out);
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0]["what"], "commit requested");
    assert_eq!(log[1]["what"], "commit: committed, output visible");
    assert_eq!(log[1]["transaction"], p.transaction.as_str());
    // A damaged entry is reported, not taken for a record.
    let dir = t.out.join("_twopc/orders/operations");
    fs::write(dir.join("00000000000000000001-damaged"), b"\xff\x00garbage").unwrap();
    let (_, v) = inspect_json(&t.out);
    assert!(
        v["sinks"][0]["problems"]
            .to_string()
            .contains("is not a readable record of the operations log"),
        "{v}"
    );
    fs::remove_file(dir.join("00000000000000000001-damaged")).unwrap();
    // Again: already committed, nothing changed.
    let before = snapshot(&t.out);
    let again = decide(&t, "--commit", p.transaction.as_str());
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(
        stdout(&again).contains("already committed"),
        "{}",
        stdout(&again)
    );
    assert_eq!(snapshot(&t.out), before);
    // An abort never removes committed output; it names reconcile.
    let abort = decide(&t, "--abort", p.transaction.as_str());
    assert_eq!(abort.status.code(), Some(3));
    assert!(
        stderr(&abort).contains(&format!(
            "twopc reconcile <destination> --sink orders --lineage {} --after-checkpoint 3",
            t.lineage
        )),
        "{}",
        stderr(&abort)
    );
    assert_eq!(snapshot(&t.out), before);
}

#[test]
fn decide_abort_of_a_prepared_leftover_lets_a_fresh_start_run() {
    let (t, p) = leftover("dc-abort");
    let o = decide(&t, "--abort", p.transaction.as_str());
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("aborted transaction"), "{}", stdout(&o));
    assert!(!part(&t.out, &p).exists());
    assert!(!t
        .out
        .join("_twopc/orders/staging")
        .join(p.transaction.as_str())
        .exists());
    let again = decide(&t, "--abort", p.transaction.as_str());
    assert_eq!(again.status.code(), Some(0));
    assert!(
        stdout(&again).contains("nothing changed"),
        "{}",
        stdout(&again)
    );
    // Committing it now is refused: it is gone, not committed.
    let commit = decide(&t, "--commit", p.transaction.as_str());
    assert_eq!(commit.status.code(), Some(3));
    assert!(
        stderr(&commit).contains("neither staged nor committed"),
        "{}",
        stderr(&commit)
    );
    // The fresh start that refused it now runs (appending on purpose).
    drop(open_sink(
        &t.out,
        "orders",
        "run-b",
        0,
        1,
        SinkOptions {
            fresh_start: twopc_core::FreshStartPolicy::Append,
            ..SinkOptions::default()
        },
        &t.clock,
        None,
    ));
}

#[test]
fn decide_refuses_to_commit_an_open_transaction_or_another_sinks() {
    let t = three("dc-open");
    let mut s = resume(&t, 0, 1);
    let open = s.begin().unwrap();
    s.write(&open.transaction, &batch(&["z"])).unwrap();
    drop(s);
    let o = decide(&t, "--commit", open.transaction.as_str());
    assert_eq!(o.status.code(), Some(3));
    let err = stderr(&o);
    assert!(err.contains("never prepared"), "{err}");
    assert!(
        err.contains(&format!(
            "twopc decide <destination> --sink orders --abort {}",
            open.transaction
        )),
        "{err}"
    );
    let other = open.transaction.as_str().replacen("orders", "other", 1);
    let o = decide(&t, "--commit", &other);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("pass --sink other"), "{}", stderr(&o));
}

#[test]
fn operator_commands_reject_bad_arguments() {
    let t = three("rc-args");
    let dir = t.out.to_str().unwrap();
    for (args, needle) in [
        (
            vec![
                "reconcile",
                dir,
                "--lineage",
                "1",
                "--after-checkpoint",
                "1",
            ],
            "required arguments were not provided:\n  --sink <S>",
        ),
        (
            vec![
                "reconcile",
                dir,
                "--sink",
                "orders",
                "--after-checkpoint",
                "1",
            ],
            "required arguments were not provided:\n  --lineage <L>",
        ),
        (
            vec![
                "reconcile",
                dir,
                "--sink",
                "orders",
                "--lineage",
                "xyz",
                "--after-checkpoint",
                "1",
            ],
            "hexadecimal",
        ),
        (
            vec![
                "reconcile",
                dir,
                "--sink",
                "orders",
                "--lineage",
                "1",
                "--table",
                "t",
                "--after-checkpoint",
                "1",
            ],
            "--table is for a PostgreSQL destination",
        ),
        (
            vec!["decide", dir, "--sink", "orders"],
            "required arguments were not provided:\n  <--commit <TXN>|--abort <TXN>>",
        ),
        (
            vec!["decide", dir, "--sink", "orders", "--commit", "nope"],
            "not a twopc transaction id",
        ),
        (
            vec![
                "decide",
                dir,
                "--sink",
                "orders",
                "--commit",
                "a.0.0000000000000001.1",
                "--abort",
                "a.0.0000000000000001.1",
            ],
            "'--commit <TXN>' cannot be used with '--abort <TXN>'",
        ),
    ] {
        let o = twopc(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    // A sink the directory does not hold is named, and nothing is created.
    let o = twopc(&[
        "decide",
        dir,
        "--sink",
        "nosuch",
        "--abort",
        "nosuch.0.0000000000000001.1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("its sinks are: orders"),
        "{}",
        stderr(&o)
    );
    assert!(!t.out.join("_twopc/nosuch").exists());
    for help in [&["help", "reconcile"][..], &["decide", "--help"][..]] {
        let o = twopc(help);
        assert_eq!(o.status.code(), Some(0));
        assert!(
            stdout(&o).contains("--transaction-id-column"),
            "{}",
            stdout(&o)
        );
    }
}

#[test]
fn a_run_starting_while_a_command_holds_the_sink_waits_and_is_told_why() {
    let t = three("rc-held");
    let sink = twopc_core::SinkId::new("orders").unwrap();
    let mut tool = twopc_fs::FsDestination::open(twopc_fs::FsOptions::new(&t.out), &sink).unwrap();
    let held = twopc_core::operator::hold_sink(
        &mut tool,
        &twopc_core::SystemClock,
        &sink,
        7,
        0,
        "reconcile",
    )
    .unwrap();
    assert_eq!(held, vec![0]);
    let dest = twopc_fs::FsDestination::open(twopc_fs::FsOptions::new(&t.out), &sink).unwrap();
    let ctx = twopc_core::SubtaskContext::new(sink, twopc_core::RunId::new("run-b").unwrap(), 0, 1)
        .unwrap();
    let err = twopc_core::SubtaskSink::open(
        dest,
        t.clock.clone(),
        ctx,
        SinkOptions {
            owner_wait_ms: 300,
            ..SinkOptions::default()
        },
        None,
        None,
    )
    .err()
    .expect("the command holds the sink");
    let TwopcError::OwnedElsewhere(c) = &err else {
        panic!("expected an ownership conflict, got {err}");
    };
    // Not fatal: Flink restarts the subtask, which finds the share free
    // once the command has finished.
    assert!(!c.fatal);
    assert!(
        err.to_string()
            .contains("`twopc reconcile` or `twopc decide`"),
        "{err}"
    );
    drop(tool);
}

fn inspect_json(out: &Path) -> (i32, serde_json::Value) {
    let o = twopc(&["inspect", out.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(&o), stderr(&o)));
    (o.status.code().unwrap(), v)
}

/// The sink's operations log, as `twopc inspect --all` lists it.
fn operations(out: &Path) -> Vec<serde_json::Value> {
    let o = twopc(&["inspect", out.to_str().unwrap(), "--json", "--all"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(&o), stderr(&o)));
    let sink = &v["sinks"][0];
    let entries = sink["operations"].as_array().unwrap().clone();
    assert_eq!(sink["operations_total"], entries.len());
    entries
}

/// The command printed in `text` from the `twopc` in `start` to `end`.
fn printed(text: &str, start: &str, end: char) -> String {
    let i = text
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} missing from: {text}"));
    let from = i + start.find("twopc ").expect("the start names twopc");
    let rest = &text[from..];
    rest[..rest.find(end).unwrap_or(rest.len())].to_string()
}

/// Runs a printed command line (`twopc ...`, words without quotes).
fn run_printed(line: &str) -> std::process::Output {
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[0], "twopc", "{line}");
    twopc(&words[1..])
}

fn findings(v: &serde_json::Value, kind: &str) -> Vec<String> {
    v["attention"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .map(|f| f["message"].as_str().unwrap().to_string())
        .collect()
}

/// Two subtasks commit checkpoint 1; for checkpoint 2 subtask 0 commits
/// and subtask 1's prepared transaction disappears before its commit: a
/// LOST stop. Inspect must not say that nothing needs attention.
#[test]
fn inspect_flags_a_partly_visible_checkpoint_and_a_gap_after_a_lost_stop() {
    let (_dir, out, clock) = output("lost");
    let opts = SinkOptions::default();
    let mut s0 = open_sink(&out, "orders", "run-a", 0, 2, opts.clone(), &clock, None);
    let mut s1 = open_sink(&out, "orders", "run-a", 1, 2, opts.clone(), &clock, None);
    commit_one(&mut s0, &["a"], 1);
    commit_one(&mut s1, &["b"], 1);
    let ok = prepare_one(&mut s0, &["c", "d"], 2);
    let gone = prepare_one(&mut s1, &["e", "f", "g"], 2);
    assert_eq!(s0.commit(&ok).unwrap(), CommitOutcome::Committed);
    fs::remove_dir_all(
        out.join("_twopc/orders/staging")
            .join(gone.transaction.as_str()),
    )
    .unwrap();
    let err = s1.commit(&gone).unwrap_err();
    assert!(matches!(err, TwopcError::Lost(_)), "{err}");
    let lineage = s0.lineage().to_string();
    drop((s0, s1));

    let (code, v) = inspect_json(&out);
    assert_eq!(code, 1, "{v:#}");
    let partly = findings(&v, "partly-visible-checkpoint");
    assert_eq!(partly.len(), 1, "{v:#}");
    assert!(partly[0].contains("checkpoint 2"), "{}", partly[0]);
    assert!(
        partly[0].contains(gone.transaction.as_str()),
        "{}",
        partly[0]
    );
    assert!(partly[0].contains("3 records LOST"), "{}", partly[0]);
    assert!(
        partly[0].contains(&format!(
            "twopc reconcile {} --sink orders --lineage {lineage} --after-checkpoint N",
            out.display()
        )),
        "{}",
        partly[0]
    );
    assert!(findings(&v, "checkpoint-gap").is_empty(), "{v:#}");

    // The job is restarted from its latest checkpoint and goes on: the
    // hole is now a gap in the lineage.
    let restore = Restore {
        checkpoint: 2,
        states: Vec::new(),
        known: vec![ok.clone()],
    };
    let mut s0 = open_sink(
        &out,
        "orders",
        "run-a",
        0,
        1,
        opts.clone(),
        &clock,
        Some(&restore),
    );
    commit_one(&mut s0, &["h"], 3);
    drop(s0);
    let (code, v) = inspect_json(&out);
    assert_eq!(code, 1);
    let gap = findings(&v, "checkpoint-gap");
    assert_eq!(gap.len(), 1, "{v:#}");
    assert!(gap[0].contains("checkpoint 2"), "{}", gap[0]);
    assert!(gap[0].contains("(3 to 3)"), "{}", gap[0]);

    // After checkpoint 2, the lost one itself: its records would stay
    // missing, and the dry run says so beside what it would remove.
    let o = reconcile_at(&out, &lineage, "2", &[]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    assert!(
        text.contains("would remove") && text.contains("found LOST, at or before checkpoint 2"),
        "{text}"
    );

    // Reconciling after checkpoint 1 removes checkpoints 2 and 3 and the
    // note: nothing needs attention any more.
    let o = reconcile_at(&out, &lineage, "1", &["--apply"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("Removed 2 transaction(s), 3 records"),
        "{}",
        stdout(&o)
    );
    let (code, v) = inspect_json(&out);
    assert_eq!(code, 0, "{v:#}");
}

/// With nothing committed in the range, reconcile still says what is
/// left to do: notes of lost transactions to clear (exit 1 until applied),
/// or a lineage this sink never wrote, most likely mistyped (exit 1, never
/// "nothing to remove" with exit 0).
#[test]
fn reconcile_with_nothing_to_remove_names_lost_notes_and_unknown_lineages() {
    let (_dir, out, clock) = output("lost-only");
    let opts = SinkOptions::default();
    let mut s0 = open_sink(&out, "orders", "run-a", 0, 2, opts.clone(), &clock, None);
    let mut s1 = open_sink(&out, "orders", "run-a", 1, 2, opts.clone(), &clock, None);
    commit_one(&mut s0, &["a"], 1);
    commit_one(&mut s1, &["b"], 1);
    let gone = prepare_one(&mut s1, &["e", "f", "g"], 2);
    fs::remove_dir_all(
        out.join("_twopc/orders/staging")
            .join(gone.transaction.as_str()),
    )
    .unwrap();
    assert!(matches!(s1.commit(&gone), Err(TwopcError::Lost(_))));
    let lineage = s0.lineage().to_string();
    drop((s0, s1));

    // Notes of a lost checkpoint at or before the one given stay: a restore
    // of it would not write their records again. Told, exit 1.
    let o = reconcile_at(&out, &lineage, "2", &["--apply"]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    assert!(
        text.contains(&format!(
            "checkpoint(s) 2 of lineage {lineage} were found LOST, at or before checkpoint 2"
        )) && text.contains("Restore from a checkpoint before 2"),
        "{text}"
    );

    let o = reconcile_at(&out, &lineage, "1", &[]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    assert!(text.contains("nothing to remove"), "{text}");
    assert!(
        text.contains("Notes of 1 lost transaction(s) of that range remain"),
        "{text}"
    );
    let apply = printed(&text, "stopped: twopc reconcile ", '\n');
    let o = run_printed(&apply);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{text}{}", stderr(&o));
    assert!(
        text.contains("Cleared the notes of 1 lost transaction(s)"),
        "{text}"
    );
    let o = reconcile_at(&out, &lineage, "1", &[]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(!stdout(&o).contains("Notes of"), "{}", stdout(&o));

    // A lineage that never ran here: told, with the ones that have output,
    // and nothing is changed, not even with --apply.
    let typo = if lineage == "0123456789abcdef" {
        "fedcba9876543210"
    } else {
        "0123456789abcdef"
    };
    let logged = operations(&out).len();
    for extra in [&[][..], &["--apply"][..]] {
        let o = reconcile_at(&out, typo, "1", extra);
        let text = stdout(&o);
        assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
        assert!(
            text.contains(&format!(
                "Lineage {typo} never ran in this sink here; lineages with output: {lineage}. \
                 Check the lineage"
            )),
            "{text}"
        );
    }
    assert_eq!(operations(&out).len(), logged, "nothing was logged");

    // A lineage whose output was all removed is known all the same: a
    // repeat of a full removal is "nothing to remove", exit 0.
    for _ in 0..2 {
        let o = reconcile_at(&out, &lineage, "0", &["--apply"]);
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    }
    let logged = operations(&out).len();
    let o = reconcile_at(&out, &lineage, "0", &["--apply"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(operations(&out).len(), logged, "a repeat changes nothing");
    assert!(stdout(&reconcile_at(&out, &lineage, "0", &[]))
        .contains("has no committed output of this sink (any more)"));
    let parts = fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("part-"))
        .count();
    assert_eq!(parts, 0, "the full removal removed checkpoint 1's output");
}

/// Subtask 0 of run-a committed checkpoint 2 (`ok`), subtask 1 prepared it
/// (`pending`) and the job stopped before its commit: the checkpoint
/// completed and is partly visible.
fn partly_visible_checkpoint(
    tag: &str,
) -> (TempDir, PathBuf, TransactionHandle, TransactionHandle) {
    let (dir, out, clock) = output(tag);
    let opts = SinkOptions::default();
    let mut s0 = open_sink(&out, "orders", "run-a", 0, 2, opts.clone(), &clock, None);
    let mut s1 = open_sink(&out, "orders", "run-a", 1, 2, opts, &clock, None);
    let ok = prepare_one(&mut s0, &["a"], 2);
    let pending = prepare_one(&mut s1, &["b", "c"], 2);
    assert_eq!(s0.commit(&ok).unwrap(), CommitOutcome::Committed);
    drop((s0, s1));
    (dir, out, ok, pending)
}

/// `twopc decide --commit` of `pending` succeeds, and inspect then finds
/// nothing needing attention.
fn commit_by_hand_completes_the_checkpoint(out: &Path, pending: &TransactionHandle) {
    let o = decide_at(out, "--commit", pending.transaction.as_str());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let (code, v) = inspect_json(out);
    assert_eq!(code, 0, "{v:#}");
}

/// Subtask 0 committed checkpoint 2, subtask 1 prepared it and the job
/// stopped before its commit: the checkpoint completed, so the advice is to
/// commit, never to abort.
#[test]
fn inspect_advises_committing_a_prepared_transaction_of_a_completed_checkpoint() {
    let (_dir, out, _ok, pending) = partly_visible_checkpoint("partial");
    let (code, v) = inspect_json(&out);
    assert_eq!(code, 1);
    let partly = findings(&v, "partly-visible-checkpoint");
    assert_eq!(partly.len(), 1, "{v:#}");
    let cmd = format!(
        "twopc decide {} --sink orders --commit {}",
        out.display(),
        pending.transaction
    );
    assert!(partly[0].contains(&cmd), "{}", partly[0]);
    assert!(partly[0].contains("never aborted"), "{}", partly[0]);
    // Following the advice resolves it.
    commit_by_hand_completes_the_checkpoint(&out, &pending);
}

/// The same partly visible checkpoint: `decide --abort` of the transaction
/// that is still prepared would lose records that exist nowhere else, so
/// it is refused, naming the committed sibling and the commit to run. A
/// transaction of the same checkpoint number prepared by another run is no
/// proof (a restore into a new job keeps the lineage): only the same run's is.
#[test]
fn decide_refuses_to_abort_a_prepared_transaction_of_a_completed_checkpoint() {
    let (_dir, out, ok, pending) = partly_visible_checkpoint("partial-abort");
    let abort = |txn: &str| decide_at(&out, "--abort", txn);
    let o = abort(pending.transaction.as_str());
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(ok.transaction.as_str()), "{err}");
    assert!(err.contains("checkpoint 2 completed"), "{err}");
    assert!(
        err.contains(&format!("--commit {}", pending.transaction)),
        "{err}"
    );
    // The way out when the checkpoint's output is not wanted is named.
    assert!(
        err.contains(&format!(
            "twopc reconcile <destination> --sink orders --lineage {} --after-checkpoint 1",
            pending.lineage
        )),
        "{err}"
    );
    let (_, v) = inspect_json(&out);
    assert_eq!(
        findings(&v, "partly-visible-checkpoint").len(),
        1,
        "still staged: {v:#}"
    );
    commit_by_hand_completes_the_checkpoint(&out, &pending);
}

/// The way out the refusal names when the checkpoint's output is not
/// wanted: reconcile removes what the lineage committed after checkpoint
/// 1, and the abort is accepted then, leaving nothing of checkpoint 2.
#[test]
fn after_reconcile_removed_a_completed_checkpoint_its_prepared_transaction_may_be_aborted() {
    let (_dir, out, ok, pending) = partly_visible_checkpoint("partial-unwanted");
    let lineage = pending.lineage.to_string();
    let o = reconcile_at(&out, &lineage, "1", &["--apply"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let o = decide_at(&out, "--abort", pending.transaction.as_str());
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        !part(&out, &ok).exists(),
        "the committed sibling's output was removed"
    );
    assert!(!part(&out, &pending).exists());
    let (code, v) = inspect_json(&out);
    assert_eq!(code, 0, "{v:#}");
}

/// A sibling claimed for commit (the process died between the claim and
/// the publication) proves the checkpoint completed as a committed one
/// does: aborting the other transaction of that checkpoint is refused,
/// naming the claimed one, and nothing changes.
#[test]
fn decide_refuses_to_abort_a_transaction_whose_sibling_was_claimed_for_commit() {
    let (_dir, out, clock) = output("claimed-sibling");
    let opts = SinkOptions::default();
    let mut s0 = open_sink(&out, "orders", "run-a", 0, 2, opts.clone(), &clock, None);
    let mut s1 = open_sink(&out, "orders", "run-a", 1, 2, opts, &clock, None);
    let claimed = prepare_one(&mut s0, &["a"], 2);
    let pending = prepare_one(&mut s1, &["b", "c"], 2);
    drop((s0, s1));
    let layout = twopc_fs::Layout::new(&out, &twopc_core::SinkId::new("orders").unwrap());
    fs::rename(
        layout.staging_dir(&claimed.transaction),
        layout.committing.join(claimed.transaction.as_str()),
    )
    .unwrap();
    let before = snapshot(&out);
    let o = decide_at(&out, "--abort", pending.transaction.as_str());
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(claimed.transaction.as_str()), "{err}");
    assert!(err.contains("claimed for commit"), "{err}");
    assert!(
        err.contains(&format!("--commit {}", claimed.transaction)),
        "{err}"
    );
    assert_eq!(snapshot(&out), before, "nothing changed");
}

/// Only the same run proves a checkpoint completed: after a restore into
/// a new run (same lineage), that run's checkpoint 4 says nothing about
/// the checkpoint 4 the earlier run prepared and never completed, so its
/// abort is accepted.
#[test]
fn another_runs_commit_of_the_same_checkpoint_number_does_not_block_an_abort() {
    let (t, p) = leftover("other-run-sibling");
    // Run-b, restored from run-a's checkpoint 3 at parallelism 2: its
    // subtask 1 takes the state (the lineage comes with it) but owns only
    // its own share, so its recovery leaves subtask 0's leftover prepared;
    // it commits its checkpoint 4.
    let restore = Restore {
        states: vec![t.state_at_3.clone()],
        checkpoint: 3,
        known: Vec::new(),
    };
    let mut b = open_sink(
        &t.out,
        "orders",
        "run-b",
        1,
        2,
        SinkOptions::default(),
        &t.clock,
        Some(&restore),
    );
    let other = commit_one(&mut b, &["z"], 4);
    drop(b);
    assert_eq!(other.lineage.to_string(), t.lineage, "the same lineage");
    assert!(
        snapshot(&t.out)
            .keys()
            .any(|k| k.to_string_lossy().contains(p.transaction.as_str())),
        "run-a's leftover is still staged"
    );
    let o = decide(&t, "--abort", p.transaction.as_str());
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

#[test]
fn inspect_summarises_large_histories_with_limit_and_all() {
    let (_dir, out, clock) = output("limit");
    let mut s = open_sink(
        &out,
        "orders",
        "run-a",
        0,
        1,
        SinkOptions::default(),
        &clock,
        None,
    );
    let mut last = None;
    for cp in 1..=30u64 {
        last = Some(commit_one(&mut s, &["r"], cp));
    }
    let lineage = s.lineage().to_string();
    drop(s);
    let last = last.unwrap();

    let (code, v) = inspect_json(&out);
    assert_eq!(code, 0, "{v:#}");
    let sink = &v["sinks"][0];
    assert_eq!(sink["committed_total"], 30);
    assert_eq!(sink["committed_records"], 30);
    let listed = sink["committed"].as_array().unwrap();
    assert_eq!(listed.len(), 20);
    // The latest ones are kept.
    assert_eq!(
        listed.last().unwrap()["transaction"],
        last.transaction.as_str()
    );
    assert_eq!(listed[0]["checkpoint"], 11);
    let l = &sink["lineages"][0];
    assert_eq!(l["lineage"], lineage.as_str());
    assert_eq!(l["transactions"], 30);
    assert_eq!(l["runs"][0]["run"], "run-a");
    assert_eq!(l["runs"][0]["first_checkpoint"], 1);
    assert_eq!(l["runs"][0]["last_checkpoint"], 30);

    let o = twopc(&["inspect", out.to_str().unwrap(), "--limit", "5"]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains("the latest 5 of 30"), "{text}");
    assert!(text.contains("1 to 30"), "{text}");
    assert_eq!(text.matches("part-orders.").count(), 5, "{text}");

    let o = twopc(&["inspect", out.to_str().unwrap(), "--all"]);
    let text = stdout(&o);
    assert!(!text.contains("the latest"), "{text}");
    assert_eq!(text.matches("part-orders.").count(), 30, "{text}");

    let o = twopc(&["inspect", out.to_str().unwrap(), "--limit", "x"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("invalid value 'x' for '--limit <N>'"),
        "{}",
        stderr(&o)
    );
}

/// A commit claimed and interrupted is only ever committed; a prepared
/// transaction whose marker is damaged is never committed.
#[test]
fn decide_follows_the_recovery_rules_for_claimed_and_unreadable_transactions() {
    let t = three("dc-rules");
    let mut s = resume(&t, 0, 1);
    let claimed = prepare_one(&mut s, &["p", "q"], 4);
    let damaged = prepare_one(&mut s, &["r"], 5);
    drop(s);
    let sink_dir = t.out.join("_twopc/orders");
    // A crash right after the claim for commit.
    fs::rename(
        sink_dir.join("staging").join(claimed.transaction.as_str()),
        sink_dir
            .join("committing")
            .join(claimed.transaction.as_str()),
    )
    .unwrap();
    // A prepare marker damaged outside twopc.
    fs::write(
        sink_dir
            .join("staging")
            .join(damaged.transaction.as_str())
            .join("prepared"),
        b"not a marker",
    )
    .unwrap();

    let o = decide(&t, "--abort", claimed.transaction.as_str());
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("Only a commit may finish it"),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains(&format!(
            "twopc decide <destination> --sink orders --commit {}",
            claimed.transaction
        )),
        "{}",
        stderr(&o)
    );
    let o = decide(&t, "--commit", claimed.transaction.as_str());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        fs::read_to_string(part(&t.out, &claimed)).unwrap(),
        "p\nq\n"
    );

    let o = decide(&t, "--commit", damaged.transaction.as_str());
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot be committed safely"),
        "{}",
        stderr(&o)
    );
    assert!(!part(&t.out, &damaged).exists());
    let o = decide(&t, "--abort", damaged.transaction.as_str());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!sink_dir
        .join("staging")
        .join(damaged.transaction.as_str())
        .exists());
}

/// A fresh start of run-b in `t` under `policy`: its error, if it stopped.
fn fresh_start_of_run_b(t: &Three, policy: twopc_core::FreshStartPolicy) -> Option<TwopcError> {
    let sink = twopc_core::SinkId::new("orders").unwrap();
    let dest = twopc_fs::FsDestination::open(twopc_fs::FsOptions::new(&t.out), &sink).unwrap();
    let ctx = twopc_core::SubtaskContext::new(sink, twopc_core::RunId::new("run-b").unwrap(), 0, 1)
        .unwrap();
    twopc_core::SubtaskSink::open(
        dest,
        t.clock.clone(),
        ctx,
        SinkOptions {
            fresh_start: policy,
            ..SinkOptions::default()
        },
        None,
        None,
    )
    .err()
}

/// Run-a's commit of checkpoint 4 was decided (claimed) and interrupted
/// before its output became visible; then the job was started again
/// without state, from the end of the output as it looked. A fresh start
/// must stop whatever its policy, naming the commit and changing nothing:
/// finishing it there would add output that the chosen start position
/// replays again (found by the crash simulation, seed 1000009262). Once
/// `twopc decide --commit` finished it, a start that appends runs.
#[test]
fn a_decided_commit_of_an_earlier_run_stops_every_fresh_start_until_finished() {
    use twopc_core::FreshStartPolicy::*;
    let (t, p) = leftover("dc-decided");
    let layout = twopc_fs::Layout::new(&t.out, &twopc_core::SinkId::new("orders").unwrap());
    fs::rename(
        layout.staging_dir(&p.transaction),
        layout.committing.join(p.transaction.as_str()),
    )
    .unwrap();
    let before = snapshot(&t.out);
    for policy in [Fail, AbortPrepared, Append, AppendAndAbortPrepared] {
        let err = fresh_start_of_run_b(&t, policy).expect("the decided commit stops the start");
        let TwopcError::PreparedOnFreshStart(f) = &err else {
            panic!("{policy:?}: expected a fresh-start stop, got {err}")
        };
        assert_eq!(f.decided, vec![(p.transaction.clone(), 4)], "{policy:?}");
        assert!(f.prepared.is_empty(), "{policy:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("twopc decide <destination> --sink orders --commit <transaction>"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("{} (checkpoint 4)", p.transaction)),
            "{msg}"
        );
        assert!(msg.contains("no older than checkpoint 4"), "{msg}");
        assert!(
            msg.contains("never aborted, whatever the fresh-start policy"),
            "{msg}"
        );
        assert_eq!(snapshot(&t.out), before, "{policy:?}: nothing changed");
    }
    let o = decide(&t, "--commit", p.transaction.as_str());
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fs::read_to_string(part(&t.out, &p)).unwrap(), "x\ny\n");
    assert!(fresh_start_of_run_b(&t, Append).is_none());
}

/// Run-a committed checkpoints 1 to 3, and its commit of checkpoint 4 was
/// decided (claimed) but interrupted before its record. A restore of
/// checkpoint 1 must count it as committed after the restore, like the
/// recorded ones: FAIL stops naming it, REPLACE_RANGE finishes and retracts
/// it with the others. (Found by review: the rewind check read commit
/// records only; the lingering cleanup then finished the commit while the
/// re-run wrote its records again.)
#[test]
fn a_restore_older_than_a_decided_commit_counts_it_as_committed_after() {
    let (t, p) = leftover("rw-decided");
    let sink = twopc_core::SinkId::new("orders").unwrap();
    let layout = twopc_fs::Layout::new(&t.out, &sink);
    fs::rename(
        layout.staging_dir(&p.transaction),
        layout.committing.join(p.transaction.as_str()),
    )
    .unwrap();
    let restore = Restore {
        checkpoint: 1,
        states: vec![t.state_at_1.clone()],
        known: Vec::new(),
    };
    let restore_with = |rewind| {
        let options = SinkOptions {
            rewind,
            ..SinkOptions::default()
        };
        try_open_sink(
            &t.out,
            "orders",
            "run-b",
            0,
            1,
            options,
            &t.clock,
            Some(&restore),
        )
    };
    let before = snapshot_but_run_notes(&t.out);
    let err = restore_with(twopc_core::RewindPolicy::Fail)
        .err()
        .expect("the rewind must stop");
    let TwopcError::Rewind(r) = &err else {
        panic!("expected a rewind, got {err}");
    };
    let named: Vec<&twopc_core::TransactionId> = r.committed_after.iter().map(|(t, _)| t).collect();
    assert_eq!(
        named,
        [&t.h[1].transaction, &t.h[2].transaction, &p.transaction],
        "{err}"
    );
    // Nothing changed but the run's lineage note (written before the check).
    assert!(
        snapshot_but_run_notes(&t.out) == before,
        "FAIL changes nothing"
    );

    let s = restore_with(twopc_core::RewindPolicy::ReplaceRange).expect("replaced");
    drop(s);
    assert!(part(&t.out, &t.h[0]).exists());
    for h in [&t.h[1], &t.h[2], &p] {
        assert!(!part(&t.out, h).exists(), "{} retracted", h.transaction);
    }
    assert_eq!(fs::read_dir(&layout.committing).unwrap().count(), 0);
}

/// REPLACE_RANGE after a rescale: a decided commit that subtask 0 owns (and
/// finishes at its start) is known to subtask 1's restored state, so subtask
/// 1 retracts it too. Subtask 1 must not retract it while its owner may
/// still be publishing it (the output would stay visible without a record,
/// and the re-run would write it again): it waits for the claim to go, and
/// gives up, changing nothing, when nobody finishes it. Then both subtasks
/// start at once, as Flink starts them: the waiting one goes on as soon as
/// the owner has finished and retracted the commit.
#[test]
fn a_decided_commit_owned_elsewhere_is_retracted_only_after_its_owner_finished_it() {
    let (t, p) = leftover("rw-decided-elsewhere");
    let sink = twopc_core::SinkId::new("orders").unwrap();
    let layout = twopc_fs::Layout::new(&t.out, &sink);
    fs::rename(
        layout.staging_dir(&p.transaction),
        layout.committing.join(p.transaction.as_str()),
    )
    .unwrap();
    let open_at = |subtask: u32, restore: &Restore, wait_ms: u64| {
        let options = SinkOptions {
            rewind: twopc_core::RewindPolicy::ReplaceRange,
            owner_wait_ms: wait_ms,
            ..SinkOptions::default()
        };
        try_open_sink(
            &t.out,
            "orders",
            "run-b",
            subtask,
            2,
            options,
            &t.clock,
            Some(restore),
        )
    };
    // Subtask 1 holds the handle (Flink hands list state out in ranges);
    // subtask 0 owns the share it was written by.
    let knows_it = Restore {
        checkpoint: 1,
        states: Vec::new(),
        known: vec![p.clone()],
    };
    let owns_it = Restore {
        checkpoint: 1,
        states: vec![t.state_at_1.clone()],
        known: Vec::new(),
    };
    let before = snapshot_but_run_notes(&t.out);
    let err = open_at(1, &knows_it, 300)
        .err()
        .expect("subtask 1 must not retract a commit its owner has not finished");
    let msg = err.to_string();
    assert!(msg.contains(p.transaction.as_str()), "{msg}");
    assert!(
        msg.contains("still being finished by the subtask that owns it"),
        "{msg}"
    );
    assert!(
        snapshot_but_run_notes(&t.out) == before,
        "a subtask that waited in vain changes nothing"
    );

    let waiting = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| open_at(1, &knows_it, 20_000).map(drop));
        std::thread::sleep(std::time::Duration::from_millis(300));
        open_at(0, &owns_it, 20_000)
            .map(drop)
            .expect("the owner finishes and retracts");
        waiting.join().unwrap()
    });
    waiting.expect("subtask 1 goes on once the owner finished the commit");
    assert!(part(&t.out, &t.h[0]).exists());
    for h in [&t.h[1], &t.h[2], &p] {
        assert!(!part(&t.out, h).exists(), "{} retracted", h.transaction);
    }
    assert_eq!(fs::read_dir(&layout.committing).unwrap().count(), 0);
}

/// A subtask restored with a share of the state notes the run's lineage
/// before it waits for the ownership of its share (an earlier attempt still
/// shutting down holds it): subtasks that got no share of the state wait
/// for that note only for a while, and one that gave up would start fresh
/// in a lineage of its own, which the run's note then refused at every
/// later start (found by review).
#[test]
fn a_restored_subtask_notes_the_runs_lineage_before_it_waits_for_its_share() {
    let t = three("run-lineage-first");
    let sink = twopc_core::SinkId::new("orders").unwrap();
    let run = twopc_core::RunId::new("run-b").unwrap();
    let ctx = |attempt| {
        twopc_core::SubtaskContext::new(sink.clone(), run.clone(), 0, 1)
            .unwrap()
            .with_attempt(attempt, 7)
    };
    let open_dest =
        || twopc_fs::FsDestination::open(twopc_fs::FsOptions::new(&t.out), &sink).unwrap();
    // Attempt 0 of the run still holds the share.
    let mut holder = open_dest();
    assert_eq!(
        twopc_core::destination::Destination::claim_ownership(&mut holder, &ctx(0).owner_claim())
            .unwrap(),
        twopc_core::destination::Ownership::Acquired
    );
    let restore = Restore {
        checkpoint: 3,
        states: vec![t.state_at_1.clone()],
        known: Vec::new(),
    };
    std::thread::scope(|scope| {
        let starting = scope.spawn(|| {
            twopc_core::SubtaskSink::open(
                open_dest(),
                t.clock.clone(),
                ctx(1),
                SinkOptions {
                    owner_wait_ms: 20_000,
                    ..SinkOptions::default()
                },
                Some(&restore),
                None,
            )
            .map(drop)
        });
        let mut noted = None;
        for _ in 0..100 {
            noted =
                twopc_core::destination::Destination::run_lineage(&mut open_dest(), &run).unwrap();
            if noted.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(
            noted,
            Some(t.state_at_1.lineage),
            "the run's lineage is noted while the share is still held"
        );
        assert!(!starting.is_finished(), "the start waits for the share");
        drop(holder);
        starting
            .join()
            .unwrap()
            .expect("the start goes on once the share is free");
    });
}

/// A restore with fewer subtasks: subtask 1 of 2 looks after the share of
/// old subtask 3 of 4. While old subtask 3 still runs (shutting down, it
/// holds its share and could still commit there), the new subtask does not
/// start next to it: it claims that share too, waits, and stops naming the
/// holder; once the old subtask has ended, it starts (found by review: only
/// its own index was claimed).
#[test]
fn a_subtask_claims_the_shares_it_looks_after_for_an_earlier_larger_parallelism() {
    let t = three("leftover-shares");
    let mut old3 = resume(&t, 3, 4);
    let pending = prepare_one(&mut old3, &["z"], 4);
    let restore = Restore {
        checkpoint: 3,
        states: vec![t.state_at_1.clone()],
        known: Vec::new(),
    };
    let start = || {
        let sink = twopc_core::SinkId::new("orders").unwrap();
        twopc_core::SubtaskSink::open(
            twopc_fs::FsDestination::open(twopc_fs::FsOptions::new(&t.out), &sink).unwrap(),
            t.clock.clone(),
            twopc_core::SubtaskContext::new(sink, twopc_core::RunId::new("run-b").unwrap(), 1, 2)
                .unwrap(),
            SinkOptions {
                owner_wait_ms: 300,
                ..SinkOptions::default()
            },
            Some(&restore),
            None,
        )
        .map(drop)
    };
    let err = start().expect_err("old subtask 3 still holds its share");
    let TwopcError::OwnedElsewhere(conflict) = &err else {
        panic!("expected an ownership conflict, got {err}");
    };
    assert_eq!(conflict.ours.subtask, 3, "{err}");
    assert!(err.to_string().contains("run-a"), "{err}");
    drop(old3);
    start().expect("the share is free once old subtask 3 has ended");
    assert!(
        !part(&t.out, &pending).exists(),
        "its transaction was never committed"
    );
}

/// A commit decided after the reconciled checkpoint but not finished is
/// output of the range too: `twopc reconcile` refuses, naming it and the
/// command that finishes it, and changes nothing; once finished, it is
/// removed with the rest. (Left alone, a later start would have finished
/// it over the re-run's output.)
#[test]
fn reconcile_refuses_over_a_decided_commit_until_it_is_finished() {
    let (t, p) = leftover("rc-decided");
    let layout = twopc_fs::Layout::new(&t.out, &twopc_core::SinkId::new("orders").unwrap());
    fs::rename(
        layout.staging_dir(&p.transaction),
        layout.committing.join(p.transaction.as_str()),
    )
    .unwrap();
    let before = snapshot(&t.out);
    for extra in [&[][..], &["--apply"][..]] {
        let o = reconcile(&t, "3", extra);
        assert_eq!(o.status.code(), Some(3), "{}{}", stdout(&o), stderr(&o));
        assert!(
            stderr(&o).contains(&format!("{} (checkpoint 4)", p.transaction)),
            "{}",
            stderr(&o)
        );
        assert!(
            stderr(&o).contains(&format!(
                "twopc decide <destination> --sink orders --commit {}",
                p.transaction
            )),
            "{}",
            stderr(&o)
        );
        assert_eq!(snapshot(&t.out), before, "nothing changed");
    }
    let o = decide(&t, "--commit", p.transaction.as_str());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(part(&t.out, &p).exists());
    let o = reconcile(&t, "3", &["--apply"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(!part(&t.out, &p).exists());
    assert!(part(&t.out, &t.h[2]).exists());
}

/// A sink that names its files its own way (partPrefix, partSuffix): the
/// commands must be given its names. Found by review: `decide --commit`
/// published under the default name, which the sink's readers never look
/// for, and `reconcile` took every record for an altered one.
#[test]
fn decide_and_reconcile_use_the_sinks_own_file_names_and_refuse_others() {
    let (_dir, out, clock) = output("op-names");
    let sink = twopc_core::SinkId::new("orders").unwrap();
    let mut options = twopc_fs::FsOptions::new(&out);
    options.part_prefix = "orders".into();
    options.part_suffix = ".csv".into();
    let dest = twopc_fs::FsDestination::open(options, &sink).unwrap();
    let ctx = twopc_core::SubtaskContext::new(
        sink.clone(),
        twopc_core::RunId::new("run-n").unwrap(),
        0,
        1,
    )
    .unwrap();
    let (mut s, _) =
        twopc_core::SubtaskSink::open(dest, clock.clone(), ctx, SinkOptions::default(), None, None)
            .unwrap();
    let first = commit_one(&mut s, &["a"], 1);
    let p = prepare_one(&mut s, &["b", "c"], 2);
    let lineage = s.lineage().to_string();
    // Every commit record folded into the history: the names are checked
    // against the folded records too (before, no single record meant no
    // check, and the commit below was published as part-<txn>).
    let all = twopc_core::destination::HistoryPolicy {
        keep_checkpoints: 0,
        min_segment: 1,
        ..Default::default()
    };
    assert_eq!(
        twopc_core::Destination::compact_history(s.destination(), &all)
            .unwrap()
            .folded,
        1
    );
    assert!(s.destination().commit_records().unwrap().is_empty());
    drop(s);
    let named = |h: &TransactionHandle| out.join(format!("orders-{}.csv", h.transaction));
    assert!(named(&first).exists());

    let decide_with = |extra: &[&str]| {
        let mut args = vec![
            "decide",
            out.to_str().unwrap(),
            "--sink",
            "orders",
            "--commit",
            p.transaction.as_str(),
        ];
        args.extend_from_slice(extra);
        twopc(&args)
    };
    let o = decide_with(&[]);
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    for part in [
        "--part-prefix",
        "--part-suffix",
        &format!("orders-{}.csv", first.transaction),
    ] {
        assert!(err.contains(part), "{part:?} missing from: {err}");
    }
    assert!(
        !part(&out, &p).exists(),
        "nothing published under the default name"
    );
    // The commands inspect prints carry the names it was given, and run
    // as printed (before, they named the directory alone and were refused).
    let names = ["--part-prefix", "orders", "--part-suffix", ".csv"];
    let mut args = vec!["inspect", out.to_str().unwrap(), "--json", "--run", "run-x"];
    args.extend_from_slice(&names);
    let o = twopc(&args);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(&o), stderr(&o)));
    let advice = findings(&v, "prepared-other-run");
    assert_eq!(advice.len(), 1, "{v:#}");
    let commit = printed(&advice[0], "`twopc decide ", '`');
    assert!(
        commit.contains("--part-prefix orders --part-suffix .csv"),
        "{commit}"
    );
    let o = run_printed(&commit);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(fs::read_to_string(named(&p)).unwrap(), "b\nc\n");

    let o = reconcile_at(&out, &lineage, "0", &[]);
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let o = reconcile_at(&out, &lineage, "0", &names);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let apply = printed(&stdout(&o), "stopped: twopc reconcile ", '\n');
    assert!(
        apply.contains("--part-prefix orders --part-suffix .csv") && apply.ends_with(" --apply"),
        "{apply}"
    );
    let o = run_printed(&apply);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(!named(&first).exists() && !named(&p).exists());

    // The names are a directory's; a PostgreSQL sink has none.
    let o = twopc(&[
        "decide",
        "postgres://u@localhost:1/db",
        "--sink",
        "orders",
        "--abort",
        p.transaction.as_str(),
        "--part-suffix",
        ".csv",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--part-suffix is for a directory"),
        "{}",
        stderr(&o)
    );
}

/// A connection URL with its scheme in capitals is a URL all the same: its
/// password is never printed (it used to be taken for a directory, and
/// shown whole in "output directory ... does not exist").
#[test]
fn a_url_in_capitals_never_shows_its_password() {
    for args in [
        vec!["inspect", "POSTGRES://app:s3cr3t-pw@db.example/shop"],
        vec![
            "reconcile",
            "PostgreSQL://app:s3cr3t-pw@db.example/shop",
            "--sink",
            "orders",
            "--lineage",
            "1",
            "--after-checkpoint",
            "1",
        ],
    ] {
        let o = twopc(&args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!text.contains("s3cr3t-pw"), "{args:?}: {text}");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {text}");
    }
}

/// Sink `orders` in `out`, started fresh as subtask 0 of 1 of `run`.
fn fresh_orders_sink(out: &Path, clock: &ShiftClock, run: &str) -> FsSink {
    let sink = twopc_core::SinkId::new("orders").unwrap();
    let dest = twopc_fs::FsDestination::open(twopc_fs::FsOptions::new(out), &sink).unwrap();
    let ctx =
        twopc_core::SubtaskContext::new(sink, twopc_core::RunId::new(run).unwrap(), 0, 1).unwrap();
    twopc_core::SubtaskSink::open(dest, clock.clone(), ctx, SinkOptions::default(), None, None)
        .unwrap()
        .0
}

/// A sink that never published a file has no commit record to say how it
/// names its files, so `decide --commit` cannot check the names given. It
/// refuses, changing nothing, until the operator confirms them with
/// `--names-as-given` (before, it published under whatever names it was
/// given, and a mismatch with the job's partPrefix was found only by a
/// reader that never saw the file); from then on the new record is checked
/// against as usual.
#[test]
fn decide_commit_on_a_sink_that_never_published_asks_to_confirm_the_names() {
    let (_dir, out, clock) = output("op-first-name");
    let mut s = fresh_orders_sink(&out, &clock, "run-f");
    let p = prepare_one(&mut s, &["a", "b"], 1);
    drop(s);
    let decide_with = |extra: &[&str]| {
        let mut args = vec![
            "decide",
            out.to_str().unwrap(),
            "--sink",
            "orders",
            "--commit",
            p.transaction.as_str(),
        ];
        args.extend_from_slice(extra);
        twopc(&args)
    };
    let file = format!("orders-{}.csv", p.transaction);
    let names = ["--part-prefix", "orders", "--part-suffix", ".csv"];
    let before = snapshot(&out);
    let refused = decide_with(&names);
    assert_eq!(refused.status.code(), Some(2), "{}", stdout(&refused));
    let err = stderr(&refused);
    assert!(
        err.contains(&file)
            && err.contains("--names-as-given")
            && err.contains("Nothing was changed"),
        "{err}"
    );
    assert_eq!(snapshot(&out), before, "nothing changed");
    assert!(operations(&out).is_empty(), "nothing was requested");

    let confirmed = [&names[..], &["--names-as-given"]].concat();
    let o = decide_with(&confirmed);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(&format!("visible now as {file}")),
        "{}",
        stdout(&o)
    );
    assert_eq!(fs::read_to_string(out.join(&file)).unwrap(), "a\nb\n");
    // The same names again: checked against the record just written.
    let again = decide_with(&names);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(
        stdout(&again).contains("already committed"),
        "{}",
        stdout(&again)
    );
    // Other names are refused now, naming the sink's.
    let other = decide_with(&[]);
    assert_eq!(other.status.code(), Some(2), "{}", stdout(&other));
    assert!(stderr(&other).contains(&file), "{}", stderr(&other));
}

/// On a sink whose names were checked, the commit says nothing of names.
#[test]
fn decide_commit_on_a_sink_with_records_says_nothing_of_names() {
    let (t, p) = leftover("dc-checked-names");
    let o = decide(&t, "--commit", p.transaction.as_str());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        !stdout(&o).contains("could not be checked"),
        "{}",
        stdout(&o)
    );
}

/// A transaction that would publish no file needs no names confirmed: an
/// empty one is not staged at all here, and the commit answers as for any
/// transaction not staged, not with the names' refusal.
#[test]
fn decide_commit_of_an_empty_transaction_needs_no_names_confirmed() {
    let (_dir, out, clock) = output("op-first-empty");
    let mut s = fresh_orders_sink(&out, &clock, "run-e");
    let p = prepare_one(&mut s, &[], 1);
    drop(s);
    let o = twopc(&[
        "decide",
        out.to_str().unwrap(),
        "--sink",
        "orders",
        "--commit",
        p.transaction.as_str(),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("neither staged nor committed")
            && !stderr(&o).contains("--names-as-given"),
        "{}",
        stderr(&o)
    );
}
