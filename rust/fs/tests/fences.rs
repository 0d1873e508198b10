//! The share checks of the lingering cleanup and the retention scan: a
//! superseded attempt (a zombie) against a newer attempt, on one output
//! directory, each side with destinations of its own (set up by
//! `common::attempts`).

mod common;

use common::attempts::*;
use common::*;
use twopc_core::destination::{Destination, OwnerClaim, Ownership};
use twopc_core::{
    CommitOutcome, CommitStep, Restore, RunId, SinkOptions, SystemClock, WriterSession,
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
    let (mut w0, _) = WriterSession::open(
        &mut d0,
        &clock,
        writer_ctx(0, 1, 0),
        &options,
        None,
        Some(10),
    )
    .unwrap();
    let h1 = prepared_by(&mut w0, &mut d0, &clock, &batch(&["a"]), 1);
    let s1 = w0.state();
    drop((w0, d0));

    // Attempt 1, restored from checkpoint 1: the zombie to be.
    let restore1 = Restore {
        checkpoint: 1,
        states: vec![s1],
        known: Vec::new(),
    };
    let mut zombie = OneSubtask::open(&OutputDir(&t.0), &clock, &options, 1, Some(&restore1), 20);
    assert_eq!(
        zombie
            .committer
            .commit_attempt(&mut zombie.committer_dest, &clock, &h1, 1)
            .unwrap(),
        CommitStep::Done(CommitOutcome::Committed)
    );
    let h2 = zombie.prepares(&clock, &["b"], 2);
    let s2 = zombie.writer.state();
    // Never in a checkpoint: lingering once attempt 1 is gone.
    let leftover = zombie.begins(&clock, &["never"]);
    let (mut zc, mut zc_dest) = zombie.writer_closes();

    // Attempt 2, restored from checkpoint 2 at parallelism 2.
    let mut newer = NewerAttempt::start(&OutputDir(&t.0), &clock, &options, 2, &s2, &h2, 2);

    // The zombie's late notification of checkpoint 2.
    let report = zombie_told_late(&mut zc, &mut zc_dest, &clock, &h2, 2);
    assert!(report.aborted.is_empty(), "{report:?}");
    assert_shares_left_to_attempt_2(&report, 2);

    // Attempt 2 commits checkpoint 3 and cleans up after it.
    for report in newer.commit_and_clean_up(&clock, 3) {
        assert!(report.failures.is_empty(), "{report:?}");
    }
    for (c, _) in &newer.committers {
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
    assert_eq!(visible_contents(&t.0), vec!["a\n", "b\n", "c0\n", "c1\n"]);
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
    let mut zombie = OneSubtask::open(&OutputDir(&t.0), &clock, &options, 1, None, 20);
    let h1 = zombie.prepares(&clock, &["a"], 1);
    let s1 = zombie.writer.state();
    let (mut zc, mut zc_dest) = zombie.writer_closes();

    // Attempt 2, restored from checkpoint 1 at parallelism 2.
    let mut newer = NewerAttempt::start(&OutputDir(&t.0), &clock, &options, 1, &s1, &h1, 2);

    // The zombie's late notification of checkpoint 1, an hour on.
    let report = zombie_told_late(&mut zc, &mut zc_dest, &an_hour_later, &h1, 1);
    assert!(report.expired.is_empty(), "{report:?}");
    assert_shares_left_to_attempt_2(&report, 2);
    for f in &report.failures {
        assert!(f.contains("the retention scan after checkpoint 1"), "{f}");
    }
    assert_eq!(zc.stats().housekeeping_failures, 2);

    // Attempt 2 commits checkpoint 2: nothing was lost.
    for report in newer.commit_and_clean_up(&clock, 2) {
        assert!(report.failures.is_empty(), "{report:?}");
    }
    // A transaction an earlier writer staged in share 0 after attempt 2's
    // cleanup is past the retention an hour on, which attempt 2 does not keep.
    let stale = stage(&mut dest(&t.0), 1, 2, &["z"]);
    let (c0, c0_dest) = &mut newer.committers[0];
    let report = c0.checkpoint_completed(c0_dest, &an_hour_later, 3).unwrap();
    assert_eq!(report.expired, vec![stale.transaction], "{report:?}");
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(visible_contents(&t.0), vec!["a\n", "c0\n", "c1\n"]);
}
