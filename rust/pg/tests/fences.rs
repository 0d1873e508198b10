//! The share checks of the lingering cleanup: a superseded attempt (a
//! zombie) against a newer attempt, on one database, each side with
//! destinations (sessions) of its own (set up by `common::attempts`).

#[macro_use]
mod common;

use common::attempts::*;
use common::*;
use twopc_core::{CommitOutcome, CommitStep, Restore, SystemClock, WriterSession};

/// Attempt 1 is superseded by attempt 2, restored from checkpoint 2 at
/// parallelism 2; attempt 1's writer has closed, its committer is told
/// late that checkpoint 2 completed, the first after its own restore.
/// Attempt 1 owns both indexes by its own parallelism of 1; its cleanup
/// must leave attempt 2's prepared transactions alone (aborted, attempt
/// 2's commits would find them LOST), while attempt 2's committers, whose
/// sessions are not their writers', still abort what attempt 1 left.
#[test]
fn a_zombie_committers_cleanup_leaves_a_newer_attempts_shares_alone() {
    let url = server!();
    let mut f = Fixture::new(&url, "zombie");
    let clock = SystemClock;
    let options = sink_options();

    // Attempt 0 prepares checkpoint 1 and fails before committing it.
    let c = attempt_ctx(&f, 0, 1, 0);
    let mut d0 = connect(&f, &c);
    let (mut w0, _) = WriterSession::open(&mut d0, &clock, c, &options, None, Some(10)).unwrap();
    let h1 = prepared_by(&mut w0, &mut d0, &clock, &rows(0..1, "a"), 1);
    let s1 = w0.state();
    drop((w0, d0));

    // Attempt 1, restored from checkpoint 1: the zombie to be.
    let restore1 = Restore {
        checkpoint: 1,
        states: vec![s1],
        known: Vec::new(),
    };
    let mut zombie = OneSubtask::open(&f, &clock, &options, 1, Some(&restore1), 20);
    assert_eq!(
        zombie
            .committer
            .commit_attempt(&mut zombie.committer_dest, &clock, &h1, 1)
            .unwrap(),
        CommitStep::Done(CommitOutcome::Committed)
    );
    let h2 = zombie.prepares(&clock, &rows(1..2, "b"), 2);
    let s2 = zombie.writer.state();
    // Prepared, and in no state or committable: lingering once attempt 1
    // is gone.
    let leftover = zombie.prepares(&clock, &rows(2..3, "x"), 2);
    let (mut zc, mut zc_dest) = zombie.writer_closes();

    // Attempt 2, restored from checkpoint 2 at parallelism 2.
    let mut newer = NewerAttempt::start(&f, &clock, &options, 2, &s2, &h2, 2);

    // The zombie's late notification of checkpoint 2.
    let report = zombie_told_late(&mut zc, &mut zc_dest, &clock, &h2, 2);
    assert!(report.aborted.is_empty(), "{report:?}");
    assert_shares_left_to_attempt_2(&report, 2);

    let reports = newer.commit_and_clean_up(&clock, 3);
    for (report, (c, _)) in reports.iter().zip(&newer.committers) {
        assert!(report.failures.is_empty(), "{report:?}");
        assert!(!c.cleanup_due());
    }
    // Subtask 0's committer confirms its share through another session
    // than its writer's, which holds the share's lock.
    assert_eq!(reports[0].aborted, vec![leftover.transaction.clone()]);
    assert_eq!(
        visible(&mut f.admin, &f.table),
        vec!["0|a-0", "10|c-10", "11|c-11", "1|b-1"]
    );
}

/// The SinkFunction shim's cleanup confirms its share through its
/// writer's own destination, while the writer has a transaction open in
/// the session that holds the share's advisory lock. Taking that
/// session-level lock again inside the transaction must not keep the
/// transaction from being prepared and committed afterwards, and the
/// lingering transaction goes.
#[test]
fn the_shims_cleanup_confirms_its_share_inside_the_writers_open_transaction() {
    let url = server!();
    let mut f = Fixture::new(&url, "shimfence");
    let mut s = f.open("run1");
    let lingering = prepared(&mut s, &rows(0..1, "x"), 1);
    let kept = prepared(&mut s, &rows(1..2, "a"), 2);
    drop(s);
    let mut s = f.open_restored("run1", &restore_from(2, &[&kept]));
    assert_eq!(s.commit(&kept).unwrap(), CommitOutcome::Committed);
    let h = prepared(&mut s, &rows(2..3, "b"), 3);
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    let open = written(&mut s, &rows(3..4, "c"));
    let report = s.checkpoint_completed(3).unwrap();
    assert_eq!(report.aborted, vec![lingering.transaction.clone()]);
    assert!(report.failures.is_empty(), "{report:?}");
    let last = s.prepare(&open.transaction, 4).unwrap();
    assert_eq!(s.commit(&last).unwrap(), CommitOutcome::Committed);
    assert_eq!(
        visible(&mut f.admin, &f.table),
        vec!["1|a-1", "2|b-2", "3|c-3"]
    );
}
