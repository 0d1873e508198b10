//! The lingering cleanup of a superseded attempt (a zombie) against a
//! newer attempt, on one database: each side with destinations (sessions)
//! of its own, as two TaskManagers would have.

#[macro_use]
mod common;

use common::*;
use twopc_core::{
    CommitOutcome, CommitStep, CommitterSession, Restore, SubtaskContext, SystemClock,
    WriterSession,
};
use twopc_pg::PgDestination;

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
    let at = |i: u32, p: u32, attempt: u32| -> SubtaskContext {
        ctx(&f.sink, "run1", i, p).with_attempt(attempt, 0xfeed)
    };
    let connect = |c: &SubtaskContext| PgDestination::connect(f.opts.clone(), c).unwrap();

    let c = at(0, 1, 0);
    let mut d0 = connect(&c);
    let (mut w0, _) = WriterSession::open(&mut d0, &clock, c, &options, None, Some(10)).unwrap();
    let open = w0.begin(&mut d0, &clock).unwrap();
    w0.write(&mut d0, &open.transaction, &batch(&rows(0..1, "a")))
        .unwrap();
    let h1 = w0.prepare(&mut d0, &clock, &open.transaction, 1).unwrap();
    let s1 = w0.state();
    drop((w0, d0));

    let restore1 = Restore {
        checkpoint: 1,
        states: vec![s1],
        known: Vec::new(),
    };
    let c = at(0, 1, 1);
    let mut zw_dest = connect(&c);
    let (mut zw, _) = WriterSession::open(
        &mut zw_dest,
        &clock,
        c.clone(),
        &options,
        Some(&restore1),
        Some(20),
    )
    .unwrap();
    let mut zc = CommitterSession::new(c.clone(), options.clone(), Some(1));
    let mut zc_dest = connect(&c);
    assert_eq!(
        zc.commit_attempt(&mut zc_dest, &clock, &h1, 1).unwrap(),
        CommitStep::Done(CommitOutcome::Committed)
    );
    let open = zw.begin(&mut zw_dest, &clock).unwrap();
    zw.write(&mut zw_dest, &open.transaction, &batch(&rows(1..2, "b")))
        .unwrap();
    let h2 = zw
        .prepare(&mut zw_dest, &clock, &open.transaction, 2)
        .unwrap();
    let s2 = zw.state();
    // Prepared, and in no state or committable: lingering once attempt 1
    // is gone.
    let open = zw.begin(&mut zw_dest, &clock).unwrap();
    zw.write(&mut zw_dest, &open.transaction, &batch(&rows(2..3, "x")))
        .unwrap();
    let leftover = zw
        .prepare(&mut zw_dest, &clock, &open.transaction, 2)
        .unwrap();
    drop((zw, zw_dest));

    let mut writers = Vec::new();
    let mut committers = Vec::new();
    for i in 0..2u32 {
        let restore = Restore {
            checkpoint: 2,
            states: if i == 0 { vec![s2.clone()] } else { Vec::new() },
            known: Vec::new(),
        };
        let c = at(i, 2, 2);
        let mut d = connect(&c);
        let (w, _) = WriterSession::open(
            &mut d,
            &clock,
            c.clone(),
            &options,
            Some(&restore),
            Some(30 + u64::from(i)),
        )
        .unwrap();
        writers.push((w, d));
        committers.push((
            CommitterSession::new(c.clone(), options.clone(), Some(2)),
            connect(&c),
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
        let id = 10 + i as i64;
        w.write(d, &open.transaction, &batch(&rows(id..id + 1, "c")))
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

    for (i, (c, d)) in committers.iter_mut().enumerate() {
        assert_eq!(
            c.commit_attempt(d, &clock, &newer[i], 1).unwrap(),
            CommitStep::Done(CommitOutcome::Committed),
            "attempt 2's transaction of subtask {i}"
        );
        let report = c.checkpoint_completed(d, &clock, 3).unwrap();
        assert!(report.failures.is_empty(), "{report:?}");
        assert!(!c.cleanup_due());
        // Subtask 0's committer confirms its share through another session
        // than its writer's, which holds the share's lock.
        if i == 0 {
            assert_eq!(report.aborted, vec![leftover.transaction.clone()]);
        }
    }
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
