//! The lingering cleanup of a superseded attempt (a zombie) against a
//! newer attempt, on one output directory: each side with destinations of
//! its own, as two TaskManagers would have (in one process here, which
//! `flock` tells apart all the same: its locks belong to open files).

mod common;

use common::*;
use twopc_core::destination::{Destination, OwnerClaim, Ownership};
use twopc_core::{
    Clock, CommitOutcome, CommitStep, CommitterSession, Restore, RunId, SinkOptions,
    SubtaskContext, SystemClock, WriterSession,
};

fn claim(run: &str, subtask: u32, attempt: u32) -> OwnerClaim {
    OwnerClaim {
        sink: sink(),
        subtask,
        run: RunId::new(run).unwrap(),
        attempt,
        instance: 0xfeed,
    }
}

/// The SinkFunction shim's cleanup confirms the share its own writer holds
/// through the same destination: a second claim there must be confirmed on
/// the file that holds the lock, not refused by it. A destination that
/// does not hold a share never takes it from its holder, and takes a free
/// one.
#[test]
fn a_destination_confirms_a_share_it_holds_and_never_takes_one_held_elsewhere() {
    let t = TempDir::new("confirm");
    let mut a = dest(&t.0);
    assert_eq!(
        a.claim_ownership(&claim("runA", 0, 1)).unwrap(),
        Ownership::Acquired
    );
    assert_eq!(
        a.claim_ownership(&claim("runA", 0, 1)).unwrap(),
        Ownership::Acquired,
        "a claim of a share this destination holds is confirmed"
    );
    assert_eq!(
        a.confirm_ownership(&claim("runA", 0, 1)).unwrap(),
        Some(Ownership::Acquired)
    );
    let mut b = dest(&t.0);
    match b.confirm_ownership(&claim("runA", 0, 0)).unwrap() {
        Some(Ownership::HeldBy(info)) => assert_eq!(info.claim, Some(claim("runA", 0, 1))),
        other => panic!("{other:?}"),
    }
    // A free share is taken, and held from then on.
    assert_eq!(
        b.confirm_ownership(&claim("runA", 2, 0)).unwrap(),
        Some(Ownership::Acquired)
    );
    assert!(matches!(
        a.claim_ownership(&claim("runA", 2, 1)).unwrap(),
        Ownership::HeldBy(_)
    ));
}

fn ctx(subtask: u32, parallelism: u32, attempt: u32) -> SubtaskContext {
    SubtaskContext::new(sink(), RunId::new("run1").unwrap(), subtask, parallelism)
        .unwrap()
        .with_attempt(attempt, 0xfeed)
}

/// A committer's context: as in Flink, its operator instance differs from
/// its writer's (the Sink V2 writer mixes its operator's id into the
/// sink's instance; the committer cannot), so the share check must not
/// compare instances.
fn committer_ctx(subtask: u32, parallelism: u32, attempt: u32) -> SubtaskContext {
    SubtaskContext::new(sink(), RunId::new("run1").unwrap(), subtask, parallelism)
        .unwrap()
        .with_attempt(attempt, 0xc0ffee)
}

/// Attempt 1 (parallelism 1) is superseded by attempt 2, restored from
/// checkpoint 2 at parallelism 2. Attempt 1's writer has closed; its
/// committer still runs and is told late that checkpoint 2, the first
/// after its own restore, completed. Both of attempt 2's shares hold
/// prepared transactions of checkpoint 3, and attempt 1, by its own
/// parallelism, owns both indexes: its cleanup must leave them alone
/// (aborted, attempt 2's commits would find them LOST). Attempt 2's own
/// cleanup, through committers with destinations apart from their
/// writers' (the Sink V2 topology), removes what is really lingering.
#[test]
fn a_zombie_committers_cleanup_leaves_a_newer_attempts_shares_alone() {
    let t = TempDir::new("zombie");
    let clock = SystemClock;
    let options = SinkOptions::default();
    // Attempt 0 prepares checkpoint 1 and fails before committing it.
    let mut d0 = dest(&t.0);
    let (mut w0, _) =
        WriterSession::open(&mut d0, &clock, ctx(0, 1, 0), &options, None, Some(10)).unwrap();
    let open = w0.begin(&mut d0, &clock).unwrap();
    w0.write(&mut d0, &open.transaction, &batch(&["a"]))
        .unwrap();
    let h1 = w0.prepare(&mut d0, &clock, &open.transaction, 1).unwrap();
    let s1 = w0.state();
    drop((w0, d0));

    // Attempt 1, restored from checkpoint 1: the zombie to be.
    let restore1 = Restore {
        checkpoint: 1,
        states: vec![s1],
        known: Vec::new(),
    };
    let mut zw_dest = dest(&t.0);
    let (mut zw, _) = WriterSession::open(
        &mut zw_dest,
        &clock,
        ctx(0, 1, 1),
        &options,
        Some(&restore1),
        Some(20),
    )
    .unwrap();
    let mut zc = CommitterSession::new(committer_ctx(0, 1, 1), options.clone(), Some(1));
    let mut zc_dest = dest(&t.0);
    assert_eq!(
        zc.commit_attempt(&mut zc_dest, &clock, &h1, 1).unwrap(),
        CommitStep::Done(CommitOutcome::Committed)
    );
    let open = zw.begin(&mut zw_dest, &clock).unwrap();
    zw.write(&mut zw_dest, &open.transaction, &batch(&["b"]))
        .unwrap();
    let h2 = zw
        .prepare(&mut zw_dest, &clock, &open.transaction, 2)
        .unwrap();
    let s2 = zw.state();
    // Never in a checkpoint: lingering once attempt 1 is gone.
    let leftover = zw.begin(&mut zw_dest, &clock).unwrap();
    zw.write(&mut zw_dest, &leftover.transaction, &batch(&["never"]))
        .unwrap();
    drop((zw, zw_dest));

    // Attempt 2, restored from checkpoint 2 at parallelism 2.
    let mut writers = Vec::new();
    let mut committers = Vec::new();
    for i in 0..2u32 {
        let restore = Restore {
            checkpoint: 2,
            states: if i == 0 { vec![s2.clone()] } else { Vec::new() },
            known: Vec::new(),
        };
        let mut d = dest(&t.0);
        let (w, _) = WriterSession::open(
            &mut d,
            &clock,
            ctx(i, 2, 2),
            &options,
            Some(&restore),
            Some(30 + u64::from(i)),
        )
        .unwrap();
        writers.push((w, d));
        committers.push((
            CommitterSession::new(committer_ctx(i, 2, 2), options.clone(), Some(2)),
            dest(&t.0),
        ));
    }
    let (c0, c0_dest) = &mut committers[0];
    assert_eq!(
        c0.commit_attempt(c0_dest, &clock, &h2, 1).unwrap(),
        CommitStep::Done(CommitOutcome::Committed)
    );
    let mut newer = Vec::new();
    for (i, (w, d)) in writers.iter_mut().enumerate() {
        let open = w.begin(d, &clock).unwrap();
        w.write(d, &open.transaction, &batch(&[&format!("c{i}")]))
            .unwrap();
        newer.push(w.prepare(d, &clock, &open.transaction, 3).unwrap());
    }

    // The zombie's late notification of checkpoint 2.
    assert_eq!(
        zc.commit_attempt(&mut zc_dest, &clock, &h2, 1).unwrap(),
        CommitStep::Done(CommitOutcome::AlreadyCommitted)
    );
    let report = zc.checkpoint_completed(&mut zc_dest, &clock, 2).unwrap();
    assert!(report.aborted.is_empty(), "{report:?}");
    assert_eq!(report.failures.len(), 2, "{report:?}");
    assert!(
        report
            .failures
            .iter()
            .all(|f| f.contains("a later attempt (2)") && f.contains("superseded")),
        "{report:?}"
    );

    // Attempt 2 commits checkpoint 3 and cleans up after it.
    for (i, (c, d)) in committers.iter_mut().enumerate() {
        assert_eq!(
            c.commit_attempt(d, &clock, &newer[i], 1).unwrap(),
            CommitStep::Done(CommitOutcome::Committed),
            "attempt 2's transaction of subtask {i}"
        );
        let report = c.checkpoint_completed(d, &clock, 3).unwrap();
        assert!(report.failures.is_empty(), "{report:?}");
        assert!(!c.cleanup_due());
    }
    let mut d = dest(&t.0);
    assert!(
        !d.staged()
            .unwrap()
            .iter()
            .any(|s| s.transaction == leftover.transaction),
        "the zombie writer's leftover is aborted by attempt 2's cleanup"
    );
    let mut seen: Vec<String> = visible_files(&t.0)
        .iter()
        .map(|f| std::fs::read_to_string(t.0.join(f)).unwrap())
        .collect();
    seen.sort();
    assert_eq!(seen, vec!["a\n", "b\n", "c0\n", "c1\n"]);
}

/// The system clock, this many milliseconds on: what was staged now looks that
/// old to a retention scan.
struct Ahead(u64);

impl Clock for Ahead {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms() + self.0
    }
    fn sleep_ms(&self, ms: u64) {
        SystemClock.sleep_ms(ms)
    }
}

/// The retention scan is fenced like the lingering cleanup. Attempt 1, a
/// fresh start at parallelism 1 (no lingering cleanup due), is superseded
/// by attempt 2, restored from checkpoint 1 at parallelism 2. Attempt 1's
/// writer has closed; its committer still runs and is told late, when
/// attempt 2's prepared transactions are older than the retention, that
/// checkpoint 1 completed. It keeps only its own writer's transactions, so
/// its scan must leave both of attempt 2's shares alone (expired, attempt
/// 2's commits would find them LOST) and count each as a housekeeping
/// failure. Attempt 2's own scan, through a committer whose destination is
/// not its writer's (which holds the share's lock), expires what is stale
/// in its share.
#[test]
fn a_zombie_committers_retention_scan_leaves_a_newer_attempts_shares_alone() {
    let t = TempDir::new("zombie-retention");
    let clock = SystemClock;
    let an_hour_later = Ahead(3_600_000);
    let options = SinkOptions {
        retention_ms: 60_000,
        expiry_scan_interval_ms: 0,
        ..SinkOptions::default()
    };
    // Attempt 1 prepares checkpoint 1, which completes at the JobManager;
    // then its TaskManager is lost and its writer closes.
    let mut zw_dest = dest(&t.0);
    let (mut zw, _) =
        WriterSession::open(&mut zw_dest, &clock, ctx(0, 1, 1), &options, None, Some(20)).unwrap();
    let mut zc = CommitterSession::new(committer_ctx(0, 1, 1), options.clone(), None);
    let mut zc_dest = dest(&t.0);
    let open = zw.begin(&mut zw_dest, &clock).unwrap();
    zw.write(&mut zw_dest, &open.transaction, &batch(&["a"]))
        .unwrap();
    let h1 = zw
        .prepare(&mut zw_dest, &clock, &open.transaction, 1)
        .unwrap();
    let s1 = zw.state();
    drop((zw, zw_dest));

    // Attempt 2, restored from checkpoint 1 at parallelism 2.
    let mut writers = Vec::new();
    let mut committers = Vec::new();
    for i in 0..2u32 {
        let restore = Restore {
            checkpoint: 1,
            states: if i == 0 { vec![s1.clone()] } else { Vec::new() },
            known: Vec::new(),
        };
        let mut d = dest(&t.0);
        let (w, _) = WriterSession::open(
            &mut d,
            &clock,
            ctx(i, 2, 2),
            &options,
            Some(&restore),
            Some(30 + u64::from(i)),
        )
        .unwrap();
        writers.push((w, d));
        committers.push((
            CommitterSession::new(committer_ctx(i, 2, 2), options.clone(), Some(1)),
            dest(&t.0),
        ));
    }
    let (c0, c0_dest) = &mut committers[0];
    assert_eq!(
        c0.commit_attempt(c0_dest, &clock, &h1, 1).unwrap(),
        CommitStep::Done(CommitOutcome::Committed)
    );
    let mut newer = Vec::new();
    for (i, (w, d)) in writers.iter_mut().enumerate() {
        let open = w.begin(d, &clock).unwrap();
        w.write(d, &open.transaction, &batch(&[&format!("c{i}")]))
            .unwrap();
        newer.push(w.prepare(d, &clock, &open.transaction, 2).unwrap());
    }

    // The zombie's late notification of checkpoint 1, an hour on.
    assert_eq!(
        zc.commit_attempt(&mut zc_dest, &an_hour_later, &h1, 1)
            .unwrap(),
        CommitStep::Done(CommitOutcome::AlreadyCommitted)
    );
    let report = zc
        .checkpoint_completed(&mut zc_dest, &an_hour_later, 1)
        .unwrap();
    assert!(report.expired.is_empty(), "{report:?}");
    assert_eq!(report.failures.len(), 2, "{report:?}");
    for (i, f) in report.failures.iter().enumerate() {
        assert!(
            f.contains("the retention scan after checkpoint 1")
                && f.contains(&format!("subtask index {i}'s share"))
                && f.contains("a later attempt (2)")
                && f.contains("superseded"),
            "{f}"
        );
    }
    assert_eq!(zc.stats().housekeeping_failures, 2);

    // Attempt 2 commits checkpoint 2: nothing was lost.
    for (i, (c, d)) in committers.iter_mut().enumerate() {
        assert_eq!(
            c.commit_attempt(d, &clock, &newer[i], 1).unwrap(),
            CommitStep::Done(CommitOutcome::Committed),
            "attempt 2's transaction of subtask {i}"
        );
        let report = c.checkpoint_completed(d, &clock, 2).unwrap();
        assert!(report.failures.is_empty(), "{report:?}");
    }
    // A transaction an earlier writer staged in share 0 after attempt 2's
    // cleanup is past the retention an hour on, which attempt 2 does not keep.
    let stale = stage(&mut dest(&t.0), 1, 2, &["z"]);
    let (c0, c0_dest) = &mut committers[0];
    let report = c0.checkpoint_completed(c0_dest, &an_hour_later, 3).unwrap();
    assert_eq!(report.expired, vec![stale.transaction], "{report:?}");
    assert!(report.failures.is_empty(), "{report:?}");
    let mut seen: Vec<String> = visible_files(&t.0)
        .iter()
        .map(|f| std::fs::read_to_string(t.0.join(f)).unwrap())
        .collect();
    seen.sort();
    assert_eq!(seen, vec!["a\n", "c0\n", "c1\n"]);
}
