//! The transactional mode against a real server, driven through the core's
//! `SubtaskSink`: every commit outcome, recovery rules, rewind, expiry.

#[macro_use]
mod common;

use common::*;
use twopc_core::committer::{AbortOutcome, CommitOutcome};
use twopc_core::config::{FreshStartPolicy, RewindPolicy, SinkOptions};
use twopc_core::destination::{AbortStatus, Destination, StagedState};
use twopc_core::error::DestinationErrorKind;
use twopc_core::{Clock, SystemClock, TransactionHandle, TwopcError};
use twopc_pg::CopyFormat;

/// Run 1 commits checkpoints 1 to 3, five rows each, and ends.
fn three_committed_checkpoints(f: &Fixture) -> Vec<TransactionHandle> {
    let mut s = f.open("run1");
    (1..=3u64)
        .map(|cp| committed(&mut s, &rows(cp as i64 * 10..cp as i64 * 10 + 5, "r"), cp))
        .collect()
}

#[test]
fn prepared_rows_are_invisible_until_commit_and_a_repeat_is_already_committed() {
    let url = server!();
    let mut f = Fixture::new(&url, "commit");
    let mut s = f.open("run1");

    let h = prepared(&mut s, &rows(0..250, "a"), 1);
    assert_eq!(h.prepared().unwrap().records, 250);
    assert_eq!(f.count(), 0, "prepared rows must be invisible");
    assert_eq!(f.prepared_gids(), [h.transaction.to_string()]);
    assert_eq!(f.side_rows(), [h.transaction.to_string()]);
    assert!(f.commit_records().is_empty(), "record invisible too");

    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    assert_eq!(f.count(), 250);
    assert!(f.prepared_gids().is_empty());
    assert!(f.side_rows().is_empty(), "handle row removed at commit");
    assert_eq!(f.commit_records(), [(h.transaction.to_string(), 1)]);

    // A repeat (lost response, or recovery) is success, and changes nothing.
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::AlreadyCommitted);
    assert_eq!(f.count(), 250);

    // The next checkpoint's transaction on the same sessions.
    committed(&mut s, &rows(250..300, "b"), 2);
    assert_eq!(f.count(), 300);
}

#[test]
fn recovery_commits_restored_prepared_and_aborts_restored_open() {
    let url = server!();
    let mut f = Fixture::new(&url, "recover");

    // Run 1 prepares checkpoint 1 and dies before committing it, with
    // checkpoint 2's transaction open and written to.
    let mut s1 = f.open("run1");
    let h1 = prepared(&mut s1, &rows(0..10, "a"), 1);
    let open_h = written(&mut s1, &rows(10..20, "b"));
    drop(s1); // sessions close: the open transaction is rolled back, the prepared one stays

    assert_eq!(f.prepared_gids(), [h1.transaction.to_string()]);
    let restore = restore_from(1, &[&h1, &open_h]);
    let mut s2 = f.open_restored("run1", &restore);
    assert_eq!(s2.commit(&h1).unwrap(), CommitOutcome::Committed);
    assert_eq!(s2.abort(&open_h).unwrap(), AbortOutcome::NothingStaged);
    assert_eq!(f.visible().len(), 10);

    // A second restore of the same checkpoint re-commits: already committed.
    drop(s2);
    let mut s3 = f.open_restored("run1", &restore);
    assert_eq!(s3.commit(&h1).unwrap(), CommitOutcome::AlreadyCommitted);
    assert_eq!(f.count(), 10);
}

#[test]
fn closing_aborts_the_open_transaction_and_empty_checkpoints_cost_nothing() {
    let url = server!();
    let mut f = Fixture::new(&url, "close");
    let mut s = f.open("run1");

    let h = written(&mut s, &rows(0..5, "x"));
    assert_eq!(s.abort(&h).unwrap(), AbortOutcome::Aborted);
    assert_eq!(f.count(), 0);

    let empty = prepared(&mut s, NO_ROWS, 3);
    assert!(f.prepared_gids().is_empty(), "nothing prepared");
    assert_eq!(s.commit(&empty).unwrap(), CommitOutcome::Empty);

    // The writer session is reusable after the rollback.
    committed(&mut s, &rows(0..3, "y"), 4);
    assert_eq!(f.count(), 3);
}

#[test]
fn rolled_back_by_an_administrator_is_lost_with_evidence() {
    let url = server!();
    let mut f = Fixture::new(&url, "lost");
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..7, "a"), 5);
    f.admin
        .batch_execute(&format!("ROLLBACK PREPARED '{}'", h.transaction))
        .unwrap();

    let err = s.commit(&h).unwrap_err();
    assert!(matches!(err, TwopcError::Lost(_)), "{err}");
    assert!(err.is_fatal());
    let msg = err.to_string();
    for needle in [
        "is LOST",
        h.transaction.as_str(),
        "completed checkpoint 5",
        "7 records",
        "42704",
        "twopc_commit_records",
        "ROLLBACK PREPARED by an administrator",
        "handle row",
        "Recovery plan",
    ] {
        assert!(msg.contains(needle), "missing {needle:?} in: {msg}");
    }
    assert_eq!(f.count(), 0);
}

#[test]
fn expired_transaction_is_lost_and_says_it_expired() {
    let url = server!();
    let mut f = Fixture::new(&url, "expired");
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..3, "a"), 2);
    // The retention cleanup's call (the core calls it for staged
    // transactions older than the retention that no subtask protects).
    let now = SystemClock.now_ms();
    s.destination().expire(&h.transaction, now).unwrap();
    s.destination().expire(&h.transaction, now).unwrap(); // repeatable
    assert!(f.prepared_gids().is_empty());
    assert!(f.side_rows().is_empty());

    let msg = s.commit(&h).unwrap_err().to_string();
    assert!(msg.contains("is LOST") && msg.contains("EXPIRED"), "{msg}");
    assert!(msg.contains("twopc_expired"), "{msg}");
}

#[test]
fn backend_terminated_before_commit_prepared_is_retried_and_committed() {
    let url = server!();
    let mut f = Fixture::new(&url, "terminated");
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..20, "a"), 1);
    let pid = s.destination().control_backend_pid().unwrap();
    f.terminate(pid);

    // The first COMMIT PREPARED meets the dead session (unknown outcome);
    // the core retries by id, the retry reconnects and commits.
    capture_logs();
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    let retried = commit_log(&h);
    assert!(
        retried
            .iter()
            .any(|l| l.contains("attempt 1/") && l.contains("unknown outcome")),
        "the first attempt must have failed: {retried:?}"
    );
    let new_pid = s.destination().control_backend_pid().unwrap();
    assert_ne!(pid, new_pid, "the control session was reopened");
    assert_eq!(f.count(), 20);
    assert!(f.prepared_gids().is_empty());
}

#[test]
fn commit_that_landed_before_the_session_died_resolves_as_already_committed() {
    let url = server!();
    let mut f = Fixture::new(&url, "landed");
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..4, "a"), 1);
    // The commit lands (here: by another session), then the sink's session
    // dies before it hears about it: the retry must find the commit record.
    f.admin
        .batch_execute(&format!("COMMIT PREPARED '{}'", h.transaction))
        .unwrap();
    let pid = s.destination().control_backend_pid().unwrap();
    f.terminate(pid);

    capture_logs();
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::AlreadyCommitted);
    let retried = commit_log(&h);
    assert!(
        retried.iter().any(|l| l.contains("attempt 1/")),
        "the first attempt must have failed: {retried:?}"
    );
    assert_eq!(f.count(), 4);
    assert!(
        f.side_rows().is_empty(),
        "the resolving call finishes the cleanup"
    );
}

#[test]
fn writer_session_lost_mid_transaction_fails_the_checkpoint_and_recovers() {
    let url = server!();
    let mut f = Fixture::new(&url, "writerlost");
    let mut s = f.open("run1");
    let h = written(&mut s, &rows(0..5, "a"));
    let pid = s.destination().writer_backend_pid().unwrap();
    f.terminate(pid);
    // Either the next write or the prepare reports the loss; never a
    // prepare of a transaction that lost rows. Rows stream into one COPY, so
    // the write may still be accepted and the loss show only when the COPY
    // ends, at prepare, which then rolls the transaction back itself.
    if s.write(&h.transaction, &batch(&rows(5..10, "a"))).is_err() {
        assert_eq!(s.abort(&h).unwrap(), AbortOutcome::Aborted);
    } else {
        let err = s.prepare(&h.transaction, 1).unwrap_err().to_string();
        assert!(err.contains(h.transaction.as_str()), "{err}");
        assert_eq!(s.abort(&h).unwrap(), AbortOutcome::NothingStaged);
    }
    assert!(f.prepared_gids().is_empty());

    committed(&mut s, &rows(0..10, "b"), 2);
    assert_eq!(f.count(), 10);
}

/// The server may end the writer session just after it reported the COPY
/// complete, with the client reading both at once: the transaction went
/// with the session. The prepare must fail (the records are replayed from
/// the checkpoint), not run the commit record and PREPARE TRANSACTION in a
/// new session. There they would run in autocommit: the record committed,
/// PREPARE only a warning, and the later COMMIT PREPARED resolved as
/// already committed by that record, for rows that are gone.
#[test]
fn writer_session_lost_right_after_the_copy_fails_the_prepare() {
    let url = server!();
    let mut f = Fixture::new(&url, "lostcopy");
    let mut s = f.open("run1");
    let h = written(&mut s, &rows(0..5, "a"));
    s.destination().lose_writer_session_after_next_copy();
    let err = s.prepare(&h.transaction, 1).unwrap_err().to_string();
    assert!(
        err.contains(h.transaction.as_str()) && err.contains("lost"),
        "{err}"
    );
    assert!(f.prepared_gids().is_empty());
    assert!(commit_records(&mut f.admin, &f.sink).is_empty());
    assert_eq!(f.count(), 0);
    assert_eq!(s.abort(&h).unwrap(), AbortOutcome::NothingStaged);

    committed(&mut s, &rows(0..5, "b"), 2);
    assert_eq!(f.count(), 5);
    assert_eq!(commit_records(&mut f.admin, &f.sink).len(), 1);
}

#[test]
fn lingering_prepared_transactions_are_aborted_after_a_parallelism_change() {
    let url = server!();
    let mut f = Fixture::new(&url, "linger");

    // Run 1 at parallelism 2: checkpoint 1 commits, checkpoint 2 is
    // prepared on both subtasks but never completes.
    let mut a = f.open_subtask("run1", 0, 2, None);
    let mut b = f.open_subtask("run1", 1, 2, None);
    let a1 = prepared(&mut a, &rows(0..10, "a1"), 1);
    let b1 = prepared(&mut b, &rows(100..110, "b1"), 1);
    a.commit(&a1).unwrap();
    b.commit(&b1).unwrap();
    let a2 = prepared(&mut a, &rows(10..20, "a2"), 2);
    let b2 = prepared(&mut b, &rows(110..120, "b2"), 2);
    drop((a, b));
    assert_eq!(f.prepared_gids().len(), 2);

    // Restore checkpoint 1 at parallelism 1: subtask 0 now owns leftovers
    // of old subtasks 0 and 1. Prepared for checkpoint 2, after the
    // restored one, they are in no restored state: it aborts them at the
    // start (their row locks would block a replay of the same keys).
    let (mut s, start) =
        f.open_reporting("run1", sink_options(), Some(&restore_from(1, &[&a1, &b1])));
    let mut aborted = start.aborted.clone();
    aborted.sort();
    let mut expected = vec![a2.transaction.clone(), b2.transaction.clone()];
    expected.sort();
    assert_eq!(aborted, expected, "{start:?}");
    assert!(f.prepared_gids().is_empty(), "a2 and b2 aborted");
    assert_eq!(s.commit(&a1).unwrap(), CommitOutcome::AlreadyCommitted);
    assert_eq!(s.commit(&b1).unwrap(), CommitOutcome::AlreadyCommitted);
    let first = committed(&mut s, &rows(20..22, "s"), 2);
    let report = s.checkpoint_completed(2).unwrap();
    assert!(report.aborted.is_empty(), "{report:?}");
    assert!(f.side_rows().is_empty());
    assert_eq!(f.count(), 22, "checkpoint 1's rows and the new ones only");
    let _ = (a2, b2);
    drop(s);

    // And back up to parallelism 3 from checkpoint 2: a leftover of old
    // subtask 0 belongs to new subtask 0 only; subtasks 1 and 2 leave it
    // alone. (Their own first checkpoints are empty, so they commit nothing
    // that would make the next restore of checkpoint 2 a rewind.)
    let r2 = restore_from(2, &[&first]);
    let mut z = f.open_restored("run1", &r2);
    let z2 = prepared(&mut z, &rows(30..35, "z"), 3);
    drop(z);
    for i in [1, 2] {
        let mut t = f.open_subtask("run1", i, 3, Some(&r2));
        let own = prepared(&mut t, NO_ROWS, 3);
        t.commit(&own).unwrap();
        t.checkpoint_completed(3).unwrap();
        assert_eq!(f.prepared_gids(), [z2.transaction.to_string()]);
        drop(t);
    }
    let mut t0 = f.open_subtask("run1", 0, 3, Some(&r2));
    let own = prepared(&mut t0, NO_ROWS, 3);
    t0.commit(&own).unwrap();
    t0.checkpoint_completed(3).unwrap();
    assert!(f.prepared_gids().is_empty());
}

#[test]
fn fresh_start_stops_on_prepared_of_another_run_unless_told_to_abort() {
    let url = server!();
    let mut f = Fixture::new(&url, "fresh");
    let mut old = f.open("runA");
    let h = prepared(&mut old, &rows(0..3, "a"), 7);
    drop(old);

    // Another run without state: the transaction may hold a completed
    // checkpoint's output, so the job stops and names it (the checkpoint
    // comes from the handle row).
    let err = f.open_refused("runB", sink_options(), None);
    assert!(matches!(err, TwopcError::PreparedOnFreshStart(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("{} (checkpoint 7)", h.transaction)),
        "{msg}"
    );
    assert_eq!(f.prepared_gids().len(), 1, "nothing aborted");

    // The operator decides the output is not wanted.
    let abort_prepared = SinkOptions {
        fresh_start: FreshStartPolicy::AbortPrepared,
        ..sink_options()
    };
    let (_, report) = f.open_reporting("runB", abort_prepared, None);
    assert_eq!(report.aborted, vec![h.transaction.clone()]);
    assert!(f.prepared_gids().is_empty());
    assert_eq!(f.count(), 0);
}

#[test]
fn fresh_start_of_the_same_run_aborts_its_own_prepared_transactions() {
    let url = server!();
    let mut f = Fixture::new(&url, "samerun");
    let mut first = f.open("runA");
    prepared(&mut first, &rows(0..3, "a"), 1);
    drop(first);
    // A failed attempt before its first checkpoint completed: Flink restarts
    // the same run without state; its prepared transaction is aborted.
    f.open("runA");
    assert!(f.prepared_gids().is_empty());
    assert_eq!(f.count(), 0);
}

#[test]
fn prepared_transaction_without_its_handle_row_is_never_aborted_silently() {
    let url = server!();
    let mut f = Fixture::new(&url, "nohandle");
    let mut first = f.open("runA");
    let h = prepared(&mut first, &rows(0..3, "a"), 4);
    drop(first);
    // A plain DELETE of the handle row waits: the prepared transaction
    // holds a KEY SHARE lock on it (that is what protects it from the
    // cleanup), so an administrator's delete times out here.
    let res = f.admin.batch_execute(&format!(
        "SET lock_timeout = '200ms'; \
         DELETE FROM public.twopc_prepared WHERE transaction_id = '{}'",
        h.transaction
    ));
    assert!(
        res.is_err(),
        "the prepared transaction's lock protects its handle row"
    );
    f.admin.batch_execute("RESET lock_timeout").unwrap();
    // Damage it instead (updating a non-key column is allowed under a KEY
    // SHARE lock): the handle becomes unreadable.
    f.admin
        .execute(
            "UPDATE public.twopc_prepared SET handle = '\\x00'::bytea WHERE transaction_id = $1",
            &[&h.transaction.as_str()],
        )
        .unwrap();

    // Even the same run's fresh start, which would abort its own prepared
    // transactions, stops: the run is unknown.
    let err = f.open_refused("runA", sink_options(), None);
    assert!(matches!(err, TwopcError::PreparedOnFreshStart(_)), "{err}");
    assert!(err.to_string().contains(h.transaction.as_str()));
    assert_eq!(f.prepared_gids().len(), 1);

    let staged = f.destination("runA").staged().unwrap();
    assert_eq!(staged.len(), 1);
    assert!(
        matches!(&staged[0].state, StagedState::PreparedUnreadable { reason }
            if reason.contains(h.transaction.as_str())),
        "{:?}",
        staged[0].state
    );

    // A restore that names it still commits it: commit needs only the id.
    let mut s = f.open_restored("runA", &restore_from(4, &[&h]));
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    assert_eq!(f.count(), 3);
}

#[test]
fn stale_handle_rows_are_cleaned_but_prepared_ones_kept() {
    let url = server!();
    let mut f = Fixture::new(&url, "stale");
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..3, "a"), 1);
    f.insert_stale_handle_row();
    let staged = s.destination().staged().unwrap();
    assert_eq!(staged.len(), 1);
    assert_eq!(staged[0].prepared(), Some(&h), "handle read back whole");
    assert_eq!(f.side_rows(), [h.transaction.to_string()]);
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
}

/// An operator's tool (`twopc inspect`, a dry run) lists the prepared
/// transactions without removing stale handle rows: it must change nothing,
/// and a removal beside a live job's prepare can make that prepare fail.
#[test]
fn an_operators_listing_leaves_stale_handle_rows_alone() {
    let url = server!();
    let mut f = Fixture::new(&url, "opstale");
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..3, "a"), 1);
    let ghost = f.insert_stale_handle_row();
    let mut operator = twopc_pg::PgDestination::connect_operator(
        f.opts.clone(),
        &twopc_core::SinkId::new(f.sink.as_str()).unwrap(),
    )
    .unwrap();
    let staged = operator.staged().unwrap();
    assert_eq!(staged.len(), 1);
    assert_eq!(staged[0].prepared(), Some(&h));
    let mut left = f.side_rows();
    left.sort();
    let mut expected = vec![h.transaction.to_string(), ghost];
    expected.sort();
    assert_eq!(left, expected, "the operator's listing removed nothing");
    // The job's own listing still cleans it up.
    s.destination().staged().unwrap();
    assert_eq!(f.side_rows(), [h.transaction.to_string()]);
}

/// An operator's tool holds the sink by its writer session's locks. When
/// that session ends (an administrator, a proxy, a server restart), the
/// hold is gone and a job may start: the tool stops before its next change
/// instead of going on.
#[test]
fn an_operator_whose_claim_session_ended_changes_nothing_more() {
    let url = server!();
    let mut f = Fixture::new(&url, "ophold");
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..3, "a"), 1);
    drop(s);
    let sink = twopc_core::SinkId::new(f.sink.as_str()).unwrap();
    let mut op = twopc_pg::PgDestination::connect_operator(f.opts.clone(), &sink).unwrap();
    twopc_core::operator::hold_sink(&mut op, &SystemClock, &sink, 7, 5_000, "test").unwrap();
    let app = format!("twopc {} cli-owner", f.sink);
    let ended: i64 = f
        .admin
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1) t",
            &[&app],
        )
        .unwrap()
        .get(0);
    assert_eq!(ended, 1);
    let err = op.abort(&h.transaction).unwrap_err();
    assert!(err.to_string().contains("claim on sink"), "{err}");
    assert!(err.to_string().contains("run the command again"), "{err}");
    assert_eq!(f.prepared_gids().len(), 1, "still prepared");
    // A commit by hand stops at the first refusal, saying why, instead of
    // retrying it as an unknown outcome.
    let err = twopc_core::operator::decide(
        &mut op,
        &SystemClock,
        &sink,
        &h.transaction,
        twopc_core::operator::Decision::Commit,
        twopc_core::RetryPolicy {
            max_attempts: 5,
            ..twopc_core::RetryPolicy::default()
        },
        "test",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("claim on sink"), "{err}");
    assert!(err.contains("run the same `twopc decide"), "{err}");
    assert!(!err.contains("unknown outcome"), "{err}");
    assert_eq!(f.prepared_gids().len(), 1, "still prepared");
    assert_eq!(f.visible().len(), 0, "nothing committed");
}

#[test]
fn abort_is_repeatable_and_refuses_committed_output() {
    let url = server!();
    let mut f = Fixture::new(&url, "abort");
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..3, "a"), 1);
    let d = s.destination();
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::Aborted);
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::NotFound);
    let h2 = committed(&mut s, &rows(0..3, "b"), 2);
    assert_eq!(
        s.destination().abort(&h2.transaction).unwrap(),
        AbortStatus::WasCommitted
    );
    assert_eq!(f.visible().len(), 3);
}

#[test]
fn rewind_is_detected_from_commit_records() {
    let url = server!();
    let mut f = Fixture::new(&url, "rewind");
    let handles = three_committed_checkpoints(&f);
    let restore = restore_from(1, &[&handles[0]]);
    let err = f.open_refused("run1", sink_options(), Some(&restore));
    assert!(matches!(err, TwopcError::Rewind(_)), "{err}");
    let msg = err.to_string();
    for h in &handles[1..] {
        assert!(msg.contains(h.transaction.as_str()), "{msg}");
    }
    assert!(!msg.contains(handles[0].transaction.as_str()), "{msg}");

    // REPLACE_RANGE without a transaction-id column cannot tell the rows
    // apart: it stops and says how to reconcile by hand.
    let replace = SinkOptions {
        rewind: RewindPolicy::ReplaceRange,
        ..sink_options()
    };
    let msg = f.open_refused("run1", replace, Some(&restore)).to_string();
    assert!(
        msg.contains("cannot retract") && msg.contains("DELETE FROM"),
        "{msg}"
    );
    assert_eq!(f.count(), 15, "nothing removed");
}

#[test]
fn replace_range_retracts_rows_through_the_transaction_id_column() {
    let url = server!();
    let columns = format!("{ID_BODY}, txn text NOT NULL");
    let mut f = Fixture::with_columns(&url, "retract", &columns);
    f.opts.transaction_id_column = Some("txn".into());
    let handles = three_committed_checkpoints(&f);
    let tagged: i64 = f
        .admin
        .query_one(
            &format!("SELECT count(*) FROM {} WHERE txn = $1", f.table),
            &[&handles[1].transaction.as_str()],
        )
        .unwrap()
        .get(0);
    assert_eq!(tagged, 5, "each row carries its transaction id");

    let replace = SinkOptions {
        rewind: RewindPolicy::ReplaceRange,
        ..sink_options()
    };
    let restore = restore_from(1, &[&handles[0]]);
    let (mut s, report) = f.open_reporting("run1", replace, Some(&restore));
    assert_eq!(report.retracted.len(), 2);
    assert_eq!(f.count(), 5, "only checkpoint 1's rows remain");
    assert_eq!(
        f.commit_records(),
        [(handles[0].transaction.to_string(), 1)]
    );
    // The re-run writes the range again.
    assert_eq!(
        s.commit(&handles[0]).unwrap(),
        CommitOutcome::AlreadyCommitted
    );
    committed(&mut s, &rows(20..25, "again"), 2);
    assert_eq!(f.count(), 10);
}

#[test]
fn csv_rows_with_quotes_commas_newlines_and_nulls() {
    let url = server!();
    let mut f = Fixture::new(&url, "csv");
    f.opts.copy_format = CopyFormat::Csv;
    let mut s = f.open("run1");
    let records = [
        "1,plain",
        "2,\"with, comma\"",
        "3,\"two\nlines\"",
        "4,\"a \"\"quote\"\"\"",
        "5,",
    ];
    committed(&mut s, &records, 1);
    assert_eq!(
        f.visible(),
        vec![
            "1|plain",
            "2|with, comma",
            "3|two\nlines",
            "4|a \"quote\"",
            "5|<null>"
        ]
    );
}

#[test]
fn a_rejected_value_in_a_middle_batch_fails_the_prepare_and_the_next_transaction_loads() {
    let url = server!();
    let mut f = Fixture::new(&url, "midbatch");
    let mut s = f.open("run1");
    // Many batches stream into one COPY; the third carries a value the
    // bigint column rejects.
    let h = s.begin().unwrap();
    for i in 0..6i64 {
        let mut records = rows(i * 1000..(i + 1) * 1000, "x");
        if i == 2 {
            records[500] = "not-a-number\tbad".to_string();
        }
        // The server reports a rejected row only when the COPY ends, so a
        // write may or may not see it; the prepare always does.
        if s.write(&h.transaction, &batch(&records)).is_err() {
            break;
        }
    }
    // A record the server can never take: fatal, named by its position in
    // the transaction (the COPY's line) with PostgreSQL's words.
    let (r, err) = rejected(s.prepare(&h.transaction, 1));
    assert_eq!(r.position, Some(2500), "{err}");
    assert_eq!(r.column.as_deref(), Some("id"), "{err}");
    assert_eq!(r.preview, "not-a-number\\tbad", "{err}");
    assert!(
        err.contains("not-a-number"),
        "names the rejected value: {err}"
    );
    assert!(
        err.contains(h.transaction.as_str()),
        "names the transaction: {err}"
    );
    s.abort(&h).unwrap();
    assert!(f.prepared_gids().is_empty());
    assert_eq!(f.count(), 0, "nothing of it visible");

    // The same session carries the next transaction, again over many batches.
    committed(&mut s, &rows(0..5000, "y"), 2);
    assert_eq!(f.count(), 5000);
}

#[test]
fn a_second_live_owner_is_refused_and_a_reconnected_writer_takes_its_lock_back() {
    let url = server!();
    let mut f = Fixture::new(&url, "owner");
    let mut s = f.open("run1");
    let quick = SinkOptions {
        owner_wait_ms: 300,
        ..sink_options()
    };
    let err = f.open_refused("run2", quick.clone(), None);
    let TwopcError::OwnedElsewhere(c) = &err else {
        panic!("{err}")
    };
    assert!(c.fatal);
    let text = err.to_string();
    assert!(text.contains("run1") && text.contains("run2"), "{text}");
    assert!(text.contains("twopc_owners"), "names where to look: {text}");

    // The writer's session dies: the lock goes with it, and the next
    // transaction takes it back before writing.
    let h = written(&mut s, &rows(0..2, "a"));
    let pid = s.destination().writer_backend_pid().unwrap();
    f.terminate(pid);
    let _ = s.write(&h.transaction, &batch(&rows(2..3, "a")));
    s.abort(&h).unwrap();
    let h = committed(&mut s, &rows(3..5, "b"), 1);
    assert_eq!(f.count(), 2);
    let err = f.open_refused("run2", quick.clone(), None);
    assert!(matches!(err, TwopcError::OwnedElsewhere(_)), "{err}");

    // Once run 1 is gone, its share is free.
    drop(s);
    let append = SinkOptions {
        fresh_start: FreshStartPolicy::Append,
        ..quick
    };
    let _s2 = f.open_reporting("run2", append, None);
    let _ = h;
}

#[test]
fn a_fresh_start_onto_committed_rows_of_an_earlier_run_stops_unless_appending() {
    let url = server!();
    let mut f = Fixture::new(&url, "fresh");
    let mut s = f.open("run1");
    let h = committed(&mut s, &rows(0..3, "a"), 5);
    drop(s);
    let err = f.open_refused("run2", sink_options(), None);
    let TwopcError::ExistingOutputOnFreshStart(e) = &err else {
        panic!("{err}")
    };
    assert_eq!(e.lineages[0].last_checkpoint, Some(5));
    assert_eq!(e.lineages[0].last_transactions, vec![h.transaction.clone()]);
    assert_eq!(e.lineages[0].runs[0].as_str(), "run1");
    assert!(e.lineages[0].record.as_ref().is_some_and(|r| !r.appended));
    assert_eq!(f.count(), 3);

    let append = SinkOptions {
        fresh_start: FreshStartPolicy::Append,
        ..sink_options()
    };
    let (mut s2, _) = f.open_reporting("run2", append, None);
    committed(&mut s2, &rows(3..4, "b"), 1);
    let lineages = s2.destination().lineages().unwrap();
    assert_eq!(lineages.len(), 2);
    assert!(lineages.iter().any(|l| l
        .record
        .as_ref()
        .is_some_and(|r| r.appended && r.run.as_str() == "run2")));
    assert_eq!(f.count(), 4);
}

#[test]
fn one_sink_id_in_two_control_schemas_of_one_database_is_refused_to_the_second_job() {
    let url = server!();
    let mut f = Fixture::new(&url, "owner_schemas");
    let schema = unique("ctl");
    f.admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .unwrap();
    struct DropSchema(String, String);
    impl Drop for DropSchema {
        fn drop(&mut self) {
            let _ = admin(&self.0).batch_execute(&format!("DROP SCHEMA {} CASCADE", self.1));
        }
    }
    let _drop = DropSchema(url.clone(), schema.clone());

    // Job A prepares checkpoint 1 (public control tables).
    let mut a = f.open("runA");
    let h = prepared(&mut a, &rows(0..3, "a"), 1);

    // Job B: same sink id and database, its own control schema, started
    // with the policy that aborts prepared leftovers (of its own sink, as
    // its operator sees it). Before the fix it took a lock of its own,
    // found A's prepared transaction under the sink id and rolled it back:
    // A's commit then stopped A with LOST.
    let mut other = f.opts.clone();
    other.control_schema = schema.clone();
    let quick = SinkOptions {
        owner_wait_ms: 300,
        fresh_start: FreshStartPolicy::AbortPrepared,
        ..sink_options()
    };
    let err = match open(&other, f.ctx("runB"), quick, None) {
        Ok(_) => panic!("job B opened next to job A"),
        Err(e) => e,
    };
    let TwopcError::OwnedElsewhere(c) = &err else {
        panic!("{err}")
    };
    assert!(c.fatal, "{err}");
    let text = err.to_string();
    for needle in [
        "runA",
        "runB",
        "control schema",
        "public.twopc_owners",
        "Another run (runA)",
    ] {
        assert!(text.contains(needle), "{needle:?} missing: {text}");
    }
    assert_eq!(f.prepared_gids(), [h.transaction.to_string()]);
    assert_eq!(a.commit(&h).unwrap(), CommitOutcome::Committed);
    assert_eq!(f.count(), 3);
}

/// After a restart with fewer subtasks, subtask 1 of 2 looks after the
/// share of old subtask 3 of 4. While a session of old subtask 3 still
/// holds that share (its task shutting down), the new subtask does not
/// start next to it: it claims that share too and names the holder; once
/// the old session has ended, it starts.
#[test]
fn a_subtask_claims_the_shares_it_looks_after_for_an_earlier_larger_parallelism() {
    let url = server!();
    let mut f = Fixture::new(&url, "leftover_shares");
    let mut old3 = f.open_subtask("runA", 3, 4, None);
    let leftover = prepared(&mut old3, &rows(0..2, "z"), 1);
    let start = || {
        open(
            &f.opts,
            ctx(&f.sink, "runB", 1, 2),
            SinkOptions {
                owner_wait_ms: 300,
                fresh_start: FreshStartPolicy::AbortPrepared,
                ..sink_options()
            },
            None,
        )
    };
    let err = match start() {
        Ok(_) => panic!("started next to old subtask 3"),
        Err(e) => e,
    };
    let TwopcError::OwnedElsewhere(c) = &err else {
        panic!("{err}")
    };
    assert_eq!(c.ours.subtask, 3, "{err}");
    assert!(err.to_string().contains("runA"), "{err}");
    drop(old3);
    let _new1 = start().expect("the share is free once the old session has ended");
    assert!(
        !f.prepared_gids()
            .iter()
            .any(|g| g == leftover.transaction.as_str()),
        "the leftover was aborted by the subtask that looks after it"
    );
}

/// A BEFORE INSERT row trigger that skips rows (returns NULL; trigger-based
/// partitioning does so after putting them elsewhere): the COPY loads fewer
/// rows than records, which is the table's rule and the same at every
/// replay. The prepare succeeds and the commit shows what the trigger let
/// in. Before, every prepare failed and the job restarted forever.
#[test]
fn a_trigger_that_skips_rows_does_not_fail_the_prepare() {
    let url = server!();
    let mut f = Fixture::new(&url, "trig");
    let func = unique("skip_even");
    f.admin
        .batch_execute(&format!(
            "CREATE FUNCTION {func}() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF NEW.id % 2 = 0 THEN RETURN NULL; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER skip_even BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {func}()",
            f.table
        ))
        .unwrap();
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..10, "t"), 1);
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    let ids: Vec<i64> = f
        .admin
        .query(&format!("SELECT id FROM {} ORDER BY id", f.table), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, vec![1, 3, 5, 7, 9]);
    drop(s);
    drop(f);
    let _ = admin(&url).batch_execute(&format!("DROP FUNCTION IF EXISTS {func}() CASCADE"));
}

/// A rewind that replaces the range cannot remove a transaction whose rows
/// the transaction-id column does not find: the column was added (or
/// renamed) after the commit, so its rows hold no id, or a row trigger
/// skipped them all. Removing the commit record alone would let the replay
/// write every one of those rows again (found by review, after a change of
/// this session had let the job go ahead when no row was found). The start
/// stops, changing nothing, and names both causes and the way out.
#[test]
fn replace_range_stops_when_the_column_finds_none_of_a_commits_rows() {
    let url = server!();
    let replace = SinkOptions {
        rewind: RewindPolicy::ReplaceRange,
        ..sink_options()
    };
    // The column added after three checkpoints were committed without it.
    let mut f = Fixture::with_columns(&url, "retract_added", ID_BODY);
    let handles = three_committed_checkpoints(&f);
    f.admin
        .batch_execute(&format!("ALTER TABLE {} ADD COLUMN txn text", f.table))
        .unwrap();
    f.opts.transaction_id_column = Some("txn".into());
    let restore = restore_from(1, &[&handles[0]]);
    let err = f.open_refused("run1", replace.clone(), Some(&restore));
    let msg = err.to_string();
    assert!(err.is_fatal(), "{msg}");
    for needle in [
        "added or renamed",
        "row trigger",
        "--rows-deleted-by-hand",
        "Nothing was changed",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing from {msg}");
    }
    assert_eq!(f.count(), 15, "no row removed");
    assert_eq!(f.commit_records().len(), 3, "no record removed");

    // A row trigger that skipped every row of checkpoints 2 and 3.
    let columns = format!("{ID_BODY}, txn text NOT NULL");
    let mut f = Fixture::with_columns(&url, "retract_trig", &columns);
    f.opts.transaction_id_column = Some("txn".into());
    let func = unique("skip_big");
    f.admin
        .batch_execute(&format!(
            "CREATE FUNCTION {func}() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF NEW.id >= 20 THEN RETURN NULL; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER skip_big BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {func}()",
            f.table
        ))
        .unwrap();
    let handles = three_committed_checkpoints(&f);
    assert_eq!(f.count(), 5);
    let restore = restore_from(1, &[&handles[0]]);
    let err = f.open_refused("run1", replace, Some(&restore));
    assert!(err.is_fatal(), "{err}");
    assert!(err.to_string().contains("row trigger"), "{err}");
    assert_eq!(f.commit_records().len(), 3, "no record removed");
    drop(f);
    let _ = admin(&url).batch_execute(&format!("DROP FUNCTION IF EXISTS {func}() CASCADE"));
}

/// An abort of a transaction PostgreSQL does not list as prepared, whose
/// handle row another transaction holds locked (as its own PREPARE does
/// while still under way on the server after its session was cut off):
/// the abort fails after a bounded wait, saying why, instead of waiting
/// until that transaction is decided, which nothing does while the task
/// waits (found by review). Nothing is removed.
#[test]
fn an_abort_does_not_wait_forever_for_a_locked_handle_row() {
    let url = server!();
    let mut f = Fixture::new(&url, "abortlock");
    let ghost = f.insert_stale_handle_row();
    let mut holder = admin(&url);
    let mut t = holder.transaction().unwrap();
    t.execute(
        "SELECT 1 FROM public.twopc_prepared WHERE transaction_id = $1 FOR KEY SHARE",
        &[&ghost],
    )
    .unwrap();
    let mut d = f.destination("run1");
    let txn = twopc_core::TransactionId::parse(&ghost).unwrap().id;
    let started = std::time::Instant::now();
    let err = d.abort(&txn).unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(err.kind, DestinationErrorKind::Io, "{err}");
    assert!(
        err.message.contains(&ghost) && err.message.contains("stayed locked"),
        "{err}"
    );
    t.rollback().unwrap();
    assert_eq!(
        f.side_rows(),
        std::slice::from_ref(&ghost),
        "nothing was removed"
    );
    // Unlocked, the same abort removes the row.
    assert_eq!(d.abort(&txn).unwrap(), AbortStatus::NotFound);
    assert!(f.side_rows().is_empty());
}
