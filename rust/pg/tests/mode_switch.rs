//! A checkpoint of one mode restored in the other: the idempotent mode
//! finishes what the transactional mode left prepared (commits those its
//! checkpoint names, aborts the lingering ones, stops a fresh start on
//! them) instead of leaving them prepared forever; the transactional mode
//! refuses a transaction the idempotent mode wrote with evidence that says
//! so.

#[macro_use]
mod common;

use common::*;
use twopc_core::committer::CommitOutcome;
use twopc_core::config::{FreshStartPolicy, SinkOptions};
use twopc_core::destination::{Destination, StagedState};
use twopc_core::handle::TransactionState;
use twopc_core::{TransactionHandle, TwopcError};
use twopc_pg::PgMode;

/// A table of key `k` and value `v`, written in transactional mode until
/// the test switches it.
fn kv_fixture(url: &str, prefix: &str) -> Fixture {
    let mut f = Fixture::with_columns(url, prefix, "k bigint PRIMARY KEY, v text NOT NULL");
    f.opts.columns = vec!["k".into(), "v".into()];
    f
}

fn to_idempotent(f: &mut Fixture) {
    f.opts.mode = PgMode::Idempotent {
        key_columns: vec!["k".into()],
    };
}

fn kv(keys: std::ops::Range<i64>, tag: &str) -> Vec<String> {
    keys.map(|k| format!("{k}\t{tag}")).collect()
}

fn keys(f: &mut Fixture) -> Vec<i64> {
    f.admin
        .query(&format!("SELECT k FROM {} ORDER BY k", f.table), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn a_transactional_checkpoint_restored_in_idempotent_mode_is_committed_and_its_leftovers_aborted() {
    let url = server!();
    let mut f = kv_fixture(&url, "switch_to_idem");

    // Transactional: checkpoint 1 prepared (it completes, but the job dies
    // before committing it), checkpoint 2 prepared and never completed.
    let mut s = f.open("run1");
    let h1 = prepared(&mut s, &kv(1..4, "a"), 1);
    let h2 = prepared(&mut s, &kv(4..6, "b"), 2);
    drop(s);

    // Restored from checkpoint 1 in idempotent mode. Before the fix the
    // commit answered Committed without committing, staged() was empty and
    // both stayed prepared forever (rows never visible, keys locked). The
    // one prepared for checkpoint 2, after the restored one, is in no
    // restored state: the start aborts it, which the idempotent mode's
    // listing and abort make possible.
    to_idempotent(&mut f);
    let (mut s, start) = f.open_reporting("run1", sink_options(), Some(&restore_from(1, &[&h1])));
    assert_eq!(start.aborted, vec![h2.transaction.clone()], "{start:?}");
    let staged = s.destination().staged().unwrap();
    let listed: Vec<_> = staged
        .iter()
        .map(|t| match &t.state {
            StagedState::Prepared(h) => h.transaction.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(listed, std::slice::from_ref(&h1.transaction));
    assert_eq!(s.commit(&h1).unwrap(), CommitOutcome::Committed);
    assert_eq!(keys(&mut f), [1, 2, 3]);
    assert!(f.prepared_gids().is_empty());
    assert_eq!(s.commit(&h1).unwrap(), CommitOutcome::AlreadyCommitted);

    // The idempotent run's own checkpoint; nothing lingers.
    let own = prepared(&mut s, &kv(10..12, "c"), 2);
    assert_eq!(s.commit(&own).unwrap(), CommitOutcome::Committed);
    let report = s.checkpoint_completed(2).unwrap();
    assert!(report.aborted.is_empty(), "{report:?}");
    assert!(f.prepared_gids().is_empty());
    assert!(f.side_rows().is_empty());
    assert_eq!(keys(&mut f), [1, 2, 3, 10, 11]);
    // Its keys are free again.
    written(&mut s, &kv(4..6, "d"));
    assert_eq!(keys(&mut f), [1, 2, 3, 4, 5, 10, 11]);
}

#[test]
fn an_idempotent_fresh_start_stops_on_prepared_leftovers_of_the_transactional_mode() {
    let url = server!();
    let mut f = kv_fixture(&url, "switch_fresh");
    let mut s = f.open("runA");
    let h = prepared(&mut s, &kv(1..3, "a"), 7);
    drop(s);

    to_idempotent(&mut f);
    let err = f.open_refused("runB", sink_options(), None);
    assert!(matches!(err, TwopcError::PreparedOnFreshStart(_)), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("{} (checkpoint 7)", h.transaction)),
        "{err}"
    );
    assert_eq!(f.prepared_gids().len(), 1, "nothing aborted");

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
fn a_transactional_transaction_lost_before_an_idempotent_restore_stops_the_job() {
    let url = server!();
    let mut f = kv_fixture(&url, "switch_lost");
    let mut s = f.open("run1");
    let h = prepared(&mut s, &kv(1..4, "a"), 1);
    drop(s);
    f.admin
        .batch_execute(&format!("ROLLBACK PREPARED '{}'", h.transaction))
        .unwrap();

    // Its handle row shows it had been prepared.
    to_idempotent(&mut f);
    let mut s = f.open_restored("run1", &restore_from(1, &[&h]));
    let err = s.commit(&h).unwrap_err();
    assert!(matches!(err, TwopcError::Lost(_)), "{err}");
    assert!(err.to_string().contains("handle row"), "{err}");
    drop(s);

    // Once the handle row is gone, the note of the loss still shows it.
    f.admin
        .execute(
            "DELETE FROM public.twopc_prepared WHERE transaction_id = $1",
            &[&h.transaction.as_str()],
        )
        .unwrap();
    let mut s = f.open_restored("run1", &restore_from(1, &[&h]));
    let err = s.commit(&h).unwrap_err();
    assert!(matches!(err, TwopcError::Lost(_)), "{err}");
    assert!(err.to_string().contains("twopc_lost"), "{err}");
    assert_eq!(f.count(), 0);
}

/// `h` as the idempotent mode wrote it before its handles said their mode.
fn unmarked(h: &TransactionHandle) -> TransactionHandle {
    let info = h.prepared().unwrap().clone();
    TransactionHandle {
        state: TransactionState::Prepared(info),
        ..h.clone()
    }
}

#[test]
fn an_idempotent_checkpoint_restored_in_transactional_mode_is_refused_saying_why() {
    let url = server!();
    let mut f = kv_fixture(&url, "switch_to_txn");
    to_idempotent(&mut f);
    let mut s = f.open("run1");
    let h = prepared(&mut s, &kv(1..4, "a"), 1);
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    assert_eq!(f.count(), 3, "upserted as written");
    drop(s);

    // Restored in idempotent mode, a handle of a release that did not mark
    // them is still its own: committed, as ever.
    let old = unmarked(&h);
    let mut s = f.open_restored("run1", &restore_from(1, &[&old]));
    assert_eq!(s.commit(&old).unwrap(), CommitOutcome::Committed);
    drop(s);

    // In transactional mode: stopped with a configuration error that says
    // what happened, neither blaming a rollback outside twopc nor noting
    // the transaction as lost (its rows are there).
    f.opts.mode = PgMode::Transactional;
    let mut s = f.open_restored("run1", &restore_from(1, &[&h]));
    let err = s.commit(&h).unwrap_err();
    assert!(matches!(err, TwopcError::Config(_)), "{err}");
    assert!(
        !err.to_string().contains("LOST"),
        "not a data-loss alarm: {err}"
    );
    let msg = err.to_string();
    for needle in [
        h.transaction.as_str(),
        "written in idempotent mode",
        "Nothing of it is lost",
        "Restore this checkpoint with the idempotent mode",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing: {msg}");
    }
    assert!(!msg.contains("rolled back outside twopc"), "{msg}");
    assert_eq!(f.count(), 3, "its rows stay");
    let lost_notes: i64 = f
        .admin
        .query_one(
            "SELECT count(*) FROM public.twopc_lost WHERE transaction_id = $1",
            &[&h.transaction.as_str()],
        )
        .map(|r| r.get(0))
        .unwrap_or(0);
    assert_eq!(lost_notes, 0, "`twopc inspect` must not list it as lost");
    drop(s);

    // An unmarked handle cannot be told from a lost transactional one; the
    // evidence names the possibility.
    let mut s = f.open_restored("run1", &restore_from(1, &[&old]));
    let err = s.commit(&old).unwrap_err();
    assert!(
        err.to_string()
            .contains("restore the checkpoint in idempotent mode"),
        "{err}"
    );
}
