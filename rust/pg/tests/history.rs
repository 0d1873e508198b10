//! Bounded commit history against a real server: compaction folds older
//! commit records into `twopc_commit_segments`, and every reader (a repeated
//! commit, rewind detection, retract, lineages, tallies) answers exactly as
//! before; racing compactions and a concurrent retract lose or duplicate
//! nothing; a damaged segment row is an error that names it.

#[macro_use]
mod common;

use std::sync::{Arc, Barrier};

use common::*;
use twopc_core::committer::CommitOutcome;
use twopc_core::config::{RewindPolicy, SinkOptions};
use twopc_core::destination::{
    tally, CommitStatus, CommittedTransaction, Compaction, Destination, HistoryPolicy,
    HistoryTally, LineageSummary,
};
use twopc_core::error::{DestinationError, DestinationErrorKind};
use twopc_core::history::decode_segment;
use twopc_core::ids::{LineageId, SinkId, TransactionId};
use twopc_core::{Clock, SystemClock, TransactionHandle, TwopcError};
use twopc_pg::PgDestination;

/// Small enough to fold a short history: the latest 2 checkpoints stay
/// single, at least 3 records are folded at once, at most 4 per segment.
const POLICY: HistoryPolicy = HistoryPolicy {
    keep_checkpoints: 2,
    min_segment: 3,
    max_segment: 4,
    every_commits: 1,
};

const SEGMENTS: &str = "public.twopc_commit_segments";

/// A fixture whose table carries the transaction-id column, so that
/// committed transactions can be retracted.
fn fixture(url: &str, prefix: &str) -> Fixture {
    let mut f = Fixture::with_columns(url, prefix, "id bigint NOT NULL, body text, txn text");
    f.opts.transaction_id_column = Some("txn".into());
    f
}

/// Checkpoint `cp`'s rows: 1 to 3 of them, so that record sums differ.
fn rows_of(cp: u64) -> Vec<String> {
    let start = cp as i64 * 100;
    rows(start..start + (cp as i64 % 3) + 1, "h")
}

/// Run 1 commits checkpoints 1 to 6 and ends; run 2, restored from
/// checkpoint 6, commits 7 to 12 (one lineage, two runs). Returns the
/// handles (index i is checkpoint i + 1) and run 2's sink, still open.
fn twelve_checkpoints(f: &Fixture) -> (Vec<TransactionHandle>, Sink) {
    let mut s1 = f.open("run1");
    let mut handles: Vec<TransactionHandle> = (1..=6)
        .map(|cp| committed(&mut s1, &rows_of(cp), cp))
        .collect();
    drop(s1);
    let mut s2 = f.open_restored("run2", &restore_from(6, &[&handles[5]]));
    for cp in 7..=12 {
        handles.push(committed(&mut s2, &rows_of(cp), cp));
    }
    (handles, s2)
}

fn loose_count(f: &mut Fixture) -> i64 {
    f.admin
        .query_one(
            "SELECT count(*) FROM public.twopc_commit_records WHERE sink_id = $1",
            &[&f.sink],
        )
        .unwrap()
        .get(0)
}

/// This sink's segment rows as (first, last checkpoint, transactions,
/// records), in checkpoint order.
fn segment_rows(f: &mut Fixture) -> Vec<(i64, i64, i64, i64)> {
    f.admin
        .query(
            &format!(
                "SELECT first_checkpoint, last_checkpoint, transactions, row_count FROM \
                 {SEGMENTS} WHERE sink_id = $1 ORDER BY first_checkpoint, id"
            ),
            &[&f.sink],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// Every transaction id in this sink's segments, decoded (duplicates kept).
fn folded_ids(f: &mut Fixture) -> Vec<String> {
    let sink = SinkId::new(f.sink.as_str()).unwrap();
    let mut ids: Vec<String> = f
        .admin
        .query(
            &format!("SELECT segment FROM {SEGMENTS} WHERE sink_id = $1"),
            &[&f.sink],
        )
        .unwrap()
        .iter()
        .flat_map(|r| decode_segment(r.get::<_, &[u8]>(0), &sink, None).unwrap())
        .map(|c| c.transaction.to_string())
        .collect();
    ids.sort();
    ids
}

/// Rows of the target table written by `txn`.
fn rows_of_txn(f: &mut Fixture, txn: &TransactionId) -> i64 {
    f.admin
        .query_one(
            &format!("SELECT count(*) FROM {} WHERE txn = $1", f.table),
            &[&txn.as_str()],
        )
        .unwrap()
        .get(0)
}

/// What the readers of the commit history answer.
#[derive(Debug, PartialEq)]
struct Seen {
    after: Vec<(u64, Vec<CommittedTransaction>)>,
    lineages: Vec<LineageSummary>,
    tallies: Vec<HistoryTally>,
}

fn seen(dest: &mut PgDestination, lineage: LineageId) -> Seen {
    let seen = Seen {
        after: [0, 3, 4, 6, 9, 11, 12]
            .into_iter()
            .map(|cp| (cp, dest.committed_after(lineage, cp).unwrap()))
            .collect(),
        lineages: dest.lineages().unwrap(),
        tallies: dest.history_tallies().unwrap(),
    };
    // The tallies are the sums of every committed transaction, as the
    // trait's reading of every record would give them.
    let mut summed = Vec::new();
    for l in &seen.lineages {
        for c in dest.committed_after(l.lineage, 0).unwrap() {
            tally(&mut summed, &c);
        }
    }
    let key = |t: &HistoryTally| (t.lineage, t.run.clone());
    let mut tallies = seen.tallies.clone();
    tallies.sort_by_key(key);
    summed.sort_by_key(key);
    assert_eq!(tallies, summed);
    seen
}

fn corrupt(result: Result<impl std::fmt::Debug, DestinationError>, what: &str) -> String {
    match result {
        Err(e) if e.kind == DestinationErrorKind::Corrupt => e.message.to_string(),
        other => panic!("{what}: expected a Corrupt error, got {other:?}"),
    }
}

#[test]
fn compaction_moves_records_into_segments_and_every_reader_answers_as_before() {
    let url = server!();
    let mut f = fixture(&url, "hist_fold");
    let (handles, mut s2) = twelve_checkpoints(&f);
    let lineage = handles[0].lineage;
    let mut dest = f.destination("run2");

    let before = seen(&mut dest, lineage);
    assert_eq!(before.after[0].1.len(), 12);
    assert_eq!(before.lineages.len(), 1);
    assert_eq!(before.lineages[0].committed, 12);
    assert_eq!(before.lineages[0].last_checkpoint, Some(12));
    assert_eq!(
        before.lineages[0].last_transactions,
        [handles[11].transaction.clone()]
    );
    let runs: Vec<(String, u64, u64, u64, u64)> = before
        .tallies
        .iter()
        .map(|t| {
            let run = t.run.to_string();
            (
                run,
                t.transactions,
                t.records,
                t.first_checkpoint,
                t.last_checkpoint,
            )
        })
        .collect();
    let records = |cps: std::ops::RangeInclusive<u64>| cps.map(|c| c % 3 + 1).sum::<u64>();
    assert_eq!(
        runs,
        [
            ("run1".to_string(), 6, records(1..=6), 1, 6),
            ("run2".to_string(), 6, records(7..=12), 7, 12)
        ]
    );

    // Checkpoints 1 to 10 lie behind the watermark (12 - 2): run 1's six in
    // segments of 4 and 2, run 2's four in one.
    let done = dest.compact_history(&POLICY).unwrap();
    assert_eq!(
        done,
        Compaction {
            folded: 10,
            segments: 3,
            ..Compaction::default()
        }
    );
    assert_eq!(loose_count(&mut f), 2);
    assert_eq!(
        segment_rows(&mut f),
        [
            (1, 4, 4, records(1..=4) as i64),
            (5, 6, 2, records(5..=6) as i64),
            (7, 10, 4, records(7..=10) as i64)
        ]
    );
    let mut expected: Vec<String> = handles[..10]
        .iter()
        .map(|h| h.transaction.to_string())
        .collect();
    expected.sort();
    assert_eq!(folded_ids(&mut f), expected);
    assert_eq!(seen(&mut dest, lineage), before);
    // A fresh destination (nothing remembered about the table) too.
    assert_eq!(seen(&mut f.destination("run2"), lineage), before);

    // Nothing more lies behind the watermark.
    assert_eq!(
        dest.compact_history(&POLICY).unwrap(),
        Compaction::default()
    );

    // The running sink's committer compacts at its first completed
    // checkpoint: 11 to 13 now lie behind 15 - 2.
    let later: Vec<TransactionHandle> = (13..=15)
        .map(|cp| committed(&mut s2, &rows_of(cp), cp))
        .collect();
    drop(s2);
    let mut options = sink_options();
    options.history = POLICY;
    let restore = restore_from(15, &[&later[2]]);
    let mut s3 = open(&f.opts, f.ctx("run2"), options, Some(&restore)).unwrap();
    let before = seen(&mut dest, lineage);
    let report = s3.checkpoint_completed(15).unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(s3.committer_stats().history_folded, 3);
    assert_eq!(loose_count(&mut f), 2);
    assert_eq!(
        segment_rows(&mut f).last(),
        Some(&(11, 13, 3, records(11..=13) as i64))
    );
    assert_eq!(seen(&mut dest, lineage), before);

    // Folding everything (the latest checkpoint too) leaves only segments:
    // the latest checkpoint's transactions are read from its segment, and
    // the sink is still listed.
    let all = HistoryPolicy {
        keep_checkpoints: 0,
        min_segment: 1,
        ..POLICY
    };
    assert_eq!(dest.compact_history(&all).unwrap().folded, 2);
    assert_eq!(loose_count(&mut f), 0);
    assert_eq!(seen(&mut dest, lineage), before);
    assert_eq!(
        before.lineages[0].last_transactions,
        [later[2].transaction.clone()]
    );
    let sink = SinkId::new(f.sink.as_str()).unwrap();
    assert!(dest.sink_ids().unwrap().contains(&sink));
}

#[test]
fn a_repeated_commit_of_a_folded_transaction_is_already_committed_and_an_unknown_one_missing() {
    let url = server!();
    let mut f = fixture(&url, "hist_commit");
    let (handles, mut s2) = twelve_checkpoints(&f);
    let mut dest = f.destination("run2");
    assert_eq!(dest.compact_history(&POLICY).unwrap().folded, 10);
    let h3 = &handles[2];
    assert!(
        !f.commit_records()
            .iter()
            .any(|(t, _)| t == h3.transaction.as_str()),
        "checkpoint 3's record is folded, not loose"
    );
    assert!(f.prepared_gids().is_empty());

    // COMMIT PREPARED answers 42704 (nothing prepared): the segment says
    // it committed.
    let now = SystemClock.now_ms();
    assert_eq!(
        dest.commit(h3, now).unwrap(),
        CommitStatus::AlreadyCommitted
    );
    assert_eq!(
        s2.commit(&handles[6]).unwrap(),
        CommitOutcome::AlreadyCommitted,
        "through the core, run 2's own folded transaction"
    );

    // A transaction of a folded checkpoint that neither table holds.
    let mut ghost = h3.clone();
    ghost.transaction =
        TransactionId::compose(&SinkId::new(f.sink.as_str()).unwrap(), 0, 0x5eed, 999);
    match dest.commit(&ghost, now).unwrap() {
        CommitStatus::Missing { evidence } => {
            for needle in ["42704", "twopc_commit_records", "twopc_commit_segments"] {
                assert!(evidence.contains(needle), "{needle:?} missing: {evidence}");
            }
        }
        other => panic!("expected Missing, got {other:?}"),
    }
    let err = s2.commit(&ghost).unwrap_err();
    assert!(matches!(err, TwopcError::Lost(_)), "{err}");
    let written: u64 = (1..=12).map(|cp| cp % 3 + 1).sum();
    assert_eq!(f.count(), written as i64, "nothing changed: {err}");
}

#[test]
fn retracting_folded_transactions_rewrites_their_segment_and_removes_it_when_empty() {
    let url = server!();
    let mut f = fixture(&url, "hist_retract");
    let (handles, s2) = twelve_checkpoints(&f);
    drop(s2);
    let lineage = handles[0].lineage;
    let mut dest = f.destination("run2");
    dest.compact_history(&POLICY).unwrap();
    let all = dest.committed_after(lineage, 0).unwrap();
    let at = |cp: u64| all.iter().find(|c| c.checkpoint == cp).unwrap().clone();
    let tallies = dest.history_tallies().unwrap();

    // Checkpoint 5 of segment [5, 6]: its rows and its entry go.
    let c5 = at(5);
    assert_eq!(rows_of_txn(&mut f, &c5.transaction), c5.records as i64);
    dest.retract(&c5).unwrap();
    assert_eq!(rows_of_txn(&mut f, &c5.transaction), 0);
    assert_eq!(
        segment_rows(&mut f)[1],
        (6, 6, 1, at(6).records as i64),
        "rewritten without it"
    );
    let left = dest.committed_after(lineage, 0).unwrap();
    assert_eq!(left.len(), 11);
    assert!(!left.iter().any(|c| c.transaction == c5.transaction));
    let run1 = dest.history_tallies().unwrap();
    assert_eq!(run1[0].transactions, tallies[0].transactions - 1);
    assert_eq!(run1[0].records, tallies[0].records - c5.records);

    // Checkpoint 6, the last of it: the segment row goes. Again: nothing.
    let c6 = at(6);
    dest.retract(&c6).unwrap();
    dest.retract(&c6).unwrap();
    assert_eq!(rows_of_txn(&mut f, &c6.transaction), 0);
    assert_eq!(
        segment_rows(&mut f)
            .iter()
            .map(|s| (s.0, s.1))
            .collect::<Vec<_>>(),
        [(1, 4), (7, 10)]
    );

    // REPLACE_RANGE from checkpoint 8: 9 and 10 (folded) and 11 and 12
    // (loose) are retracted at start-up.
    let replace = SinkOptions {
        rewind: RewindPolicy::ReplaceRange,
        ..sink_options()
    };
    let restore = restore_from(8, &[&handles[7]]);
    let (_s, report) = f.open_reporting("run2", replace, Some(&restore));
    assert_eq!(report.retracted.len(), 4, "{report:?}");
    for h in &handles[8..] {
        assert_eq!(rows_of_txn(&mut f, &h.transaction), 0);
    }
    assert_eq!(
        segment_rows(&mut f)[1],
        (7, 8, 2, (at(7).records + at(8).records) as i64)
    );
    assert_eq!(loose_count(&mut f), 0);
    let left: Vec<u64> = dest
        .committed_after(lineage, 0)
        .unwrap()
        .iter()
        .map(|c| c.checkpoint)
        .collect();
    assert_eq!(left, [1, 2, 3, 4, 7, 8]);
    let total: u64 = [1, 2, 3, 4, 7, 8].into_iter().map(|c| at(c).records).sum();
    assert_eq!(f.count(), total as i64);
}

#[test]
fn racing_compactions_fold_every_record_exactly_once() {
    let url = server!();
    let mut f = fixture(&url, "hist_race");
    let (handles, s2) = twelve_checkpoints(&f);
    drop(s2);
    let lineage = handles[0].lineage;
    let before = f.destination("run2").committed_after(lineage, 0).unwrap();

    let barrier = Arc::new(Barrier::new(2));
    let racers: Vec<_> = (0..2)
        .map(|_| {
            let mut dest = f.destination("run2");
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                dest.compact_history(&POLICY).unwrap()
            })
        })
        .collect();
    let done: Vec<Compaction> = racers.into_iter().map(|t| t.join().unwrap()).collect();
    // One found the other compacting, or they ran one after the other: the
    // records were folded once either way.
    assert_eq!(done.iter().map(|d| d.folded).sum::<u64>(), 10, "{done:?}");
    assert_eq!(done.iter().map(|d| d.segments).sum::<u64>(), 3, "{done:?}");
    assert!(done.iter().filter(|d| d.busy).count() <= 1, "{done:?}");
    let folded = folded_ids(&mut f);
    let mut unique = folded.clone();
    unique.dedup();
    assert_eq!(folded, unique, "a record folded twice");
    assert_eq!(folded.len(), 10);
    assert_eq!(loose_count(&mut f), 2);
    assert_eq!(
        f.destination("run2").committed_after(lineage, 0).unwrap(),
        before
    );
}

/// Waits until backend `pid` waits for a lock; false if it never does.
fn waits_for_a_lock(f: &mut Fixture, pid: i32) -> bool {
    for _ in 0..500 {
        let waiting: i64 = f
            .admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                &[&pid],
            )
            .unwrap()
            .get(0);
        if waiting > 0 {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

#[test]
fn a_compaction_that_meets_another_is_busy_and_changes_nothing() {
    let url = server!();
    let mut f = fixture(&url, "hist_busy");
    let (handles, s2) = twelve_checkpoints(&f);
    drop(s2);
    // The first compaction is held inside its SQL transaction (its delete
    // waits for a row lock an admin session holds), with the sink's
    // compaction lock taken.
    let mut blocker = admin(&url);
    let mut hold = blocker.transaction().unwrap();
    hold.execute(
        "SELECT 1 FROM public.twopc_commit_records WHERE transaction_id = $1 FOR UPDATE",
        &[&handles[0].transaction.as_str()],
    )
    .unwrap();
    let mut first = f.destination("run2");
    let pid = first.control_backend_pid().unwrap();
    let held = std::thread::spawn(move || first.compact_history(&POLICY).unwrap());
    let waited = waits_for_a_lock(&mut f, pid);
    // Must answer at once: waiting for the first would wait for the admin
    // session, which lets go only after this answer (a bound, not a hang).
    let mut other = f.destination("run1");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(other.compact_history(&POLICY));
    });
    let second = rx.recv_timeout(std::time::Duration::from_secs(10));
    hold.rollback().unwrap();
    let second = second.expect("the second compaction waited for the first");
    let done = held.join().unwrap();
    assert!(waited, "the first compaction never waited");
    assert_eq!(
        second.unwrap(),
        Compaction {
            busy: true,
            ..Compaction::default()
        }
    );
    assert_eq!((done.folded, done.segments, done.busy), (10, 3, false));
    assert_eq!(folded_ids(&mut f).len(), 10);
    assert_eq!(loose_count(&mut f), 2);
}

#[test]
fn a_record_retracted_while_a_compaction_runs_is_not_folded() {
    let url = server!();
    let mut f = fixture(&url, "hist_retracting");
    let (handles, s2) = twelve_checkpoints(&f);
    drop(s2);
    let lineage = handles[0].lineage;
    let h3 = handles[2].transaction.clone();

    // A retract's delete of checkpoint 3's record, not yet committed: the
    // compaction reads the record, plans it, and its delete waits.
    let mut blocker = admin(&url);
    let mut retract = blocker.transaction().unwrap();
    retract
        .execute(
            "DELETE FROM public.twopc_commit_records WHERE transaction_id = $1",
            &[&h3.as_str()],
        )
        .unwrap();
    let mut dest = f.destination("run2");
    let pid = dest.control_backend_pid().unwrap();
    let compaction = std::thread::spawn(move || dest.compact_history(&POLICY).unwrap());
    let waited = waits_for_a_lock(&mut f, pid);
    retract.commit().unwrap();
    let done = compaction.join().unwrap();
    assert!(
        waited,
        "the compaction never waited for the retract's row lock"
    );

    assert_eq!(done.folded, 9, "{done:?}");
    let folded = folded_ids(&mut f);
    assert!(!folded.contains(&h3.to_string()), "{folded:?}");
    assert_eq!(segment_rows(&mut f)[0].0, 1);
    assert_eq!(segment_rows(&mut f)[0].2, 3, "checkpoints 1, 2 and 4");
    let left = f.destination("run2").committed_after(lineage, 0).unwrap();
    assert_eq!(left.len(), 11);
    assert!(!left.iter().any(|c| c.transaction == h3));
}

/// Deletes a sink's segment rows if the test fails while one is damaged:
/// other tests (and `twopc inspect` of every sink of the database) must
/// not meet it.
struct RemoveSegmentsOnPanic {
    url: String,
    sink: String,
}

impl Drop for RemoveSegmentsOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        if let Ok(mut c) = postgres::Client::connect(&self.url, postgres::NoTls) {
            let _ = c.execute(
                &format!("DELETE FROM {SEGMENTS} WHERE sink_id = $1"),
                &[&self.sink],
            );
        }
    }
}

#[test]
fn a_damaged_or_misfiled_segment_is_a_corrupt_error_that_names_it() {
    let url = server!();
    let mut f = fixture(&url, "hist_damaged");
    let _repair = RemoveSegmentsOnPanic {
        url: url.clone(),
        sink: f.sink.clone(),
    };
    let (handles, s2) = twelve_checkpoints(&f);
    drop(s2);
    let lineage = handles[0].lineage;
    let mut dest = f.destination("run2");
    dest.compact_history(&POLICY).unwrap();
    let c3 = dest
        .committed_after(lineage, 2)
        .unwrap()
        .into_iter()
        .find(|c| c.checkpoint == 3)
        .unwrap();
    let tallies = dest.history_tallies().unwrap();
    let now = SystemClock.now_ms();
    let update = |f: &mut Fixture, set: &str| {
        let sql =
            format!("UPDATE {SEGMENTS} SET {set} WHERE sink_id = $1 AND first_checkpoint = 1");
        assert_eq!(f.admin.execute(&sql, &[&f.sink]).unwrap(), 1, "{sql}");
    };
    let original: Vec<u8> = f
        .admin
        .query_one(
            &format!("SELECT segment FROM {SEGMENTS} WHERE sink_id = $1 AND first_checkpoint = 1"),
            &[&f.sink],
        )
        .unwrap()
        .get(0);
    let restore_bytes = |f: &mut Fixture| {
        let sql = format!(
            "UPDATE {SEGMENTS} SET segment = $2, lineage = $3, transactions = 4 \
             WHERE sink_id = $1 AND first_checkpoint = 1"
        );
        f.admin
            .execute(&sql, &[&f.sink, &original, &(lineage.0 as i64)])
            .unwrap();
    };

    // Damaged bytes.
    update(
        &mut f,
        "segment = overlay(segment placing '\\xdeadbeef'::bytea from 12)",
    );
    let msg = corrupt(dest.commit(&handles[1], now), "commit lookup");
    for needle in [
        "twopc_commit_segments",
        f.sink.as_str(),
        "checkpoints 1 to 4",
        &lineage.to_string(),
        "backup",
        "DELETE FROM",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing: {msg}");
    }
    let msg = corrupt(dest.committed_after(lineage, 0), "committed_after");
    assert!(msg.contains("twopc_commit_segments"), "{msg}");
    let msg = corrupt(dest.retract(&c3), "retract");
    assert!(
        msg.contains("twopc_commit_segments") && msg.contains("not retracted"),
        "{msg}"
    );
    assert_eq!(
        rows_of_txn(&mut f, &c3.transaction),
        c3.records as i64,
        "the rows stay with their record"
    );
    assert_eq!(
        dest.history_tallies().unwrap(),
        tallies,
        "sums need no bytes"
    );

    // Columns that contradict the bytes.
    restore_bytes(&mut f);
    assert_eq!(dest.committed_after(lineage, 0).unwrap().len(), 12);
    update(&mut f, "transactions = 5");
    let msg = corrupt(dest.committed_after(lineage, 0), "committed_after");
    assert!(
        msg.contains("contradict") && msg.contains("transactions says 5"),
        "{msg}"
    );

    // A lineage column that lies: found by the lookups of one transaction
    // (which read every lineage's segments of its checkpoint) and by the
    // readers of the lineage it claims.
    restore_bytes(&mut f);
    update(&mut f, "lineage = lineage # 1");
    let liar = LineageId(lineage.0 ^ 1);
    let msg = corrupt(dest.commit(&handles[1], now), "commit lookup");
    assert!(
        msg.contains("twopc_commit_segments") && msg.contains("filed under"),
        "{msg}"
    );
    let msg = corrupt(dest.committed_after(liar, 0), "committed_after");
    assert!(msg.contains("twopc_commit_segments"), "{msg}");
    let msg = corrupt(dest.retract(&c3), "retract");
    assert!(msg.contains("twopc_commit_segments"), "{msg}");
    assert_eq!(rows_of_txn(&mut f, &c3.transaction), c3.records as i64);
    corrupt(dest.lineages(), "lineages");
    let sums = dest.history_tallies().unwrap();
    assert_eq!(sums.iter().map(|t| t.transactions).sum::<u64>(), 12);
    assert!(sums.iter().any(|t| t.lineage == liar), "{sums:?}");

    // Repaired: everything answers again.
    restore_bytes(&mut f);
    assert_eq!(
        dest.commit(&handles[1], now).unwrap(),
        CommitStatus::AlreadyCommitted
    );
    dest.retract(&c3).unwrap();
    assert_eq!(rows_of_txn(&mut f, &c3.transaction), 0);
}

#[test]
fn a_missing_segments_table_that_cannot_be_created_fails_compaction_with_its_create_statement() {
    let url = server!();
    let mut f = fixture(&url, "hist_nocreate");
    let schema = unique("ctl");
    let role = unique("nocreate");
    let pw = "nocreate-pw-41b7";
    f.opts.control_schema = schema.clone();
    f.admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .unwrap();
    // The sink's own user creates the control tables; the segments' table
    // is then dropped, as in a database set up before it existed, and a
    // user who may not create tables runs the sink.
    drop(f.destination("run1"));
    let table = &f.table;
    f.admin
        .batch_execute(&format!(
            "DROP TABLE {schema}.twopc_commit_segments; \
             CREATE ROLE {role} LOGIN PASSWORD '{pw}'; \
             GRANT USAGE ON SCHEMA {schema} TO {role}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}; \
             GRANT SELECT, INSERT, DELETE ON {table} TO {role}"
        ))
        .unwrap();
    let cleanup = |f: &mut Fixture| {
        // One by one: a failure must not keep the others from running.
        for sql in [
            format!("DROP SCHEMA {schema} CASCADE"),
            format!("REVOKE ALL ON {} FROM {role}", f.table),
            format!("DROP ROLE {role}"),
        ] {
            if let Err(e) = f.admin.batch_execute(&sql) {
                eprintln!("cleanup: {sql}: {e}");
            }
        }
    };
    let mut opts = options_as(&url, &role, pw, format!("public.{table}"), &["id", "body"]);
    opts.control_schema = schema.clone();
    opts.transaction_id_column = Some("txn".into());
    let result = || {
        let mut s = open(&opts, f.ctx("run1"), sink_options(), None).unwrap();
        // Checkpoints 1 to 3 lie behind 5 - 2: enough to fold.
        for cp in 1..=5 {
            committed(&mut s, &rows_of(cp), cp);
        }
        let dest = s.destination();
        // Without the table, the readers read the single records only.
        let lineage = dest.lineages().unwrap()[0].lineage;
        assert_eq!(dest.committed_after(lineage, 0).unwrap().len(), 5);
        assert_eq!(dest.history_tallies().unwrap()[0].transactions, 5);
        let err = dest.compact_history(&POLICY).unwrap_err();
        assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
        let msg = err.message.to_string();
        let create = msg.split('`').nth(1).unwrap_or_default().to_string();
        assert!(
            create.starts_with(&format!(
                "CREATE TABLE IF NOT EXISTS \"{schema}\".\"twopc_commit_segments\" ("
            )),
            "{msg}"
        );
        assert!(create.contains("CREATE INDEX"), "{msg}");
        // The statement given works as it is, and the rights it asks for
        // are enough (the identity column needs no right on a sequence).
        f.admin.batch_execute(&create).unwrap();
        f.admin
            .batch_execute(&format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.twopc_commit_segments TO {role}"
            ))
            .unwrap();
        let done = dest.compact_history(&POLICY).unwrap();
        assert_eq!((done.folded, done.segments), (3, 1), "{done:?}");
        assert_eq!(dest.committed_after(lineage, 0).unwrap().len(), 5);
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(result));
    cleanup(&mut f);
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn a_missing_segments_table_is_created_at_start_up_when_the_user_may() {
    let url = server!();
    let mut f = fixture(&url, "hist_later");
    let schema = unique("ctl");
    f.opts.control_schema = schema.clone();
    f.admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .unwrap();
    let exists = |f: &mut Fixture| -> bool {
        f.admin
            .query_one(
                "SELECT to_regclass($1::text) IS NOT NULL",
                &[&format!("{schema}.twopc_commit_segments")],
            )
            .unwrap()
            .get(0)
    };
    // Control tables of a release before segments: the next start adds
    // the table, with its indexes.
    drop(f.destination("run1"));
    assert!(exists(&mut f));
    f.admin
        .batch_execute(&format!("DROP TABLE {schema}.twopc_commit_segments"))
        .unwrap();
    assert!(!exists(&mut f));
    drop(f.destination("run1"));
    let indexes: i64 = f
        .admin
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 \
             AND tablename = 'twopc_commit_segments'",
            &[&schema],
        )
        .unwrap()
        .get(0);
    let _ = f
        .admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
    assert_eq!(indexes, 3, "the key and both lookups");
}

/// As small as compactions get: every commit folded at once into a segment
/// of its own, at most 8 per segment.
const EVERY_COMMIT: HistoryPolicy = HistoryPolicy {
    keep_checkpoints: 0,
    min_segment: 1,
    max_segment: 8,
    every_commits: 1,
};

#[test]
fn many_small_compactions_merge_into_few_segments_and_every_reader_answers_as_before() {
    let url = server!();
    let mut f = fixture(&url, "hist_merge");
    let mut s = f.open("run1");
    let mut dest = f.destination("run1");
    let n: u64 = 40;
    let mut handles = Vec::new();
    let mut merged = 0;
    for cp in 1..=n {
        let h = committed(&mut s, &rows_of(cp), cp);
        let before = seen(&mut dest, h.lineage);
        let done = dest.compact_history(&EVERY_COMMIT).unwrap();
        assert_eq!(
            (done.folded, done.segments, done.busy),
            (1, 1, false),
            "{cp}"
        );
        merged += done.merged;
        assert_eq!(seen(&mut dest, h.lineage), before, "checkpoint {cp}");
        // The bound holds all along, not only at the end.
        let rows = segment_rows(&mut f).len() as u64;
        assert!(rows <= cp / 4 + 2, "{rows} segments after {cp} compactions");
        handles.push(h);
    }
    let rows = segment_rows(&mut f);
    // One row per compaction without merging; segments under half of 8
    // merge, so about one row per 4 transactions.
    assert!(
        (n / 8..=n / 4 + 1).contains(&(rows.len() as u64)),
        "{} segments for {n} transactions: {rows:?}",
        rows.len()
    );
    assert!(merged >= n - rows.len() as u64, "merged {merged}");
    assert!(rows.iter().all(|r| r.2 <= 8), "{rows:?}");
    assert_eq!(rows.iter().map(|r| r.2).sum::<i64>(), n as i64);
    // In checkpoint order, without overlaps: each merge took neighbours.
    assert!(rows.windows(2).all(|w| w[0].1 < w[1].0), "{rows:?}");
    assert_eq!(loose_count(&mut f), 0);
    // Every transaction is in exactly one segment.
    let mut expected: Vec<String> = handles.iter().map(|h| h.transaction.to_string()).collect();
    expected.sort();
    assert_eq!(folded_ids(&mut f), expected);
    // A fresh destination reads the same, and a repeated commit of a
    // transaction in a merged segment is found committed.
    let lineage = handles[0].lineage;
    assert_eq!(
        seen(&mut f.destination("run1"), lineage),
        seen(&mut dest, lineage)
    );
    let now = SystemClock.now_ms();
    assert_eq!(
        dest.commit(&handles[1], now).unwrap(),
        CommitStatus::AlreadyCommitted
    );
    // Nothing left to fold or merge.
    assert_eq!(
        dest.compact_history(&EVERY_COMMIT).unwrap(),
        Compaction::default()
    );
}

#[test]
fn a_damaged_segment_in_a_merge_group_fails_the_compaction_and_changes_nothing() {
    let url = server!();
    let mut f = fixture(&url, "hist_merge_damaged");
    let _repair = RemoveSegmentsOnPanic {
        url: url.clone(),
        sink: f.sink.clone(),
    };
    let mut s = f.open("run1");
    let mut dest = f.destination("run1");
    let h1 = committed(&mut s, &rows_of(1), 1);
    assert_eq!(dest.compact_history(&EVERY_COMMIT).unwrap().folded, 1);
    let h2 = committed(&mut s, &rows_of(2), 2);
    // The next compaction folds checkpoint 2 and would merge its segment
    // with checkpoint 1's, whose bytes are damaged now.
    let (id, original): (i64, Vec<u8>) = {
        let r = f
            .admin
            .query_one(
                &format!("SELECT id, segment FROM {SEGMENTS} WHERE sink_id = $1"),
                &[&f.sink],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    f.admin
        .execute(
            &format!(
                "UPDATE {SEGMENTS} SET segment = overlay(segment placing '\\xdeadbeef'::bytea \
                 from 12) WHERE id = $1"
            ),
            &[&id],
        )
        .unwrap();
    let snapshot = |f: &mut Fixture| -> Vec<(i64, Vec<u8>, i64, i64)> {
        f.admin
            .query(
                &format!(
                    "SELECT id, segment, first_checkpoint, transactions FROM {SEGMENTS} \
                     WHERE sink_id = $1 ORDER BY id"
                ),
                &[&f.sink],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    };
    let damaged = snapshot(&mut f);
    let records = f.commit_records();

    let msg = corrupt(dest.compact_history(&EVERY_COMMIT), "compaction");
    for needle in [
        "twopc_commit_segments",
        &format!("with id {id}"),
        f.sink.as_str(),
        "merging small segments changed nothing",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing: {msg}");
    }
    assert_eq!(snapshot(&mut f), damaged, "no segment row changed");
    assert_eq!(f.commit_records(), records, "checkpoint 2 is still loose");
    assert_eq!(
        f.commit_records(),
        [(h2.transaction.to_string(), 2)],
        "nothing folded"
    );

    // Repaired: the same compaction folds and merges.
    f.admin
        .execute(
            &format!("UPDATE {SEGMENTS} SET segment = $2 WHERE id = $1"),
            &[&id, &original],
        )
        .unwrap();
    let done = dest.compact_history(&EVERY_COMMIT).unwrap();
    assert_eq!(
        done,
        Compaction {
            folded: 1,
            segments: 1,
            merged: 2,
            busy: false
        }
    );
    assert_eq!(
        segment_rows(&mut f),
        [(1, 2, 2, (rows_of(1).len() + rows_of(2).len()) as i64)]
    );
    let after: Vec<TransactionId> = dest
        .committed_after(h1.lineage, 0)
        .unwrap()
        .into_iter()
        .map(|c| c.transaction)
        .collect();
    assert_eq!(after, [h1.transaction.clone(), h2.transaction.clone()]);
}

#[test]
fn a_retract_waits_for_a_compaction_that_merges_its_segment() {
    let url = server!();
    let mut f = fixture(&url, "hist_merge_retract");
    let mut s = f.open("run1");
    let mut dest = f.destination("run1");
    // Segments too small to merge under this policy: [1] and [2].
    let no_merge = HistoryPolicy {
        max_segment: 2,
        ..EVERY_COMMIT
    };
    let h1 = committed(&mut s, &rows_of(1), 1);
    dest.compact_history(&no_merge).unwrap();
    let h2 = committed(&mut s, &rows_of(2), 2);
    dest.compact_history(&no_merge).unwrap();
    drop(s);
    assert_eq!(segment_rows(&mut f).len(), 2);
    let c1 = dest
        .committed_after(h1.lineage, 0)
        .unwrap()
        .into_iter()
        .find(|c| c.transaction == h1.transaction)
        .unwrap();

    // A compaction that merges them is held inside its SQL transaction,
    // having locked [1], waiting for [2] (an admin session holds it).
    let mut blocker = admin(&url);
    let mut hold = blocker.transaction().unwrap();
    hold.execute(
        &format!("SELECT 1 FROM {SEGMENTS} WHERE sink_id = $1 AND first_checkpoint = 2 FOR UPDATE"),
        &[&f.sink],
    )
    .unwrap();
    let mut merging = f.destination("run1");
    let merging_pid = merging.control_backend_pid().unwrap();
    let compaction = std::thread::spawn(move || merging.compact_history(&EVERY_COMMIT).unwrap());
    let compaction_waited = waits_for_a_lock(&mut f, merging_pid);
    // Meanwhile checkpoint 1 is retracted: it waits for the compaction.
    let retract_pid = dest.control_backend_pid().unwrap();
    let retract = std::thread::spawn(move || {
        let result = dest.retract(&c1);
        (dest, result)
    });
    let retract_waited = waits_for_a_lock(&mut f, retract_pid);
    hold.rollback().unwrap();
    let done = compaction.join().unwrap();
    let (mut dest, result) = retract.join().unwrap();
    assert!(compaction_waited && retract_waited);
    assert_eq!(done.merged, 2, "{done:?}");
    result.unwrap();

    // The retract found checkpoint 1 in the merged segment and took it out.
    assert_eq!(rows_of_txn(&mut f, &h1.transaction), 0);
    assert_eq!(folded_ids(&mut f), [h2.transaction.to_string()]);
    assert_eq!(segment_rows(&mut f), [(2, 2, 1, rows_of(2).len() as i64)]);
    let left: Vec<TransactionId> = dest
        .committed_after(h1.lineage, 0)
        .unwrap()
        .into_iter()
        .map(|c| c.transaction)
        .collect();
    assert_eq!(left, std::slice::from_ref(&h2.transaction));
}

#[test]
fn a_loose_commit_record_edited_by_hand_is_a_corrupt_error_that_names_it() {
    let url = server!();
    let mut f = fixture(&url, "hist_loose");
    // A damaged row left behind would fail every database-wide reader
    // (`twopc inspect` of all sinks in other tests).
    struct RemoveRecordsOnPanic(String, String);
    impl Drop for RemoveRecordsOnPanic {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = admin(&self.0).execute(
                    "DELETE FROM public.twopc_commit_records WHERE sink_id = $1",
                    &[&self.1],
                );
            }
        }
    }
    let _repair = RemoveRecordsOnPanic(url.clone(), f.sink.clone());
    let mut s = f.open("run1");
    let h = committed(&mut s, &rows_of(1), 1);
    drop(s);
    let lineage = h.lineage;
    let mut dest = f.destination("run1");
    let txn = h.transaction.to_string();
    let edit = |f: &mut Fixture, set: &str| {
        let sql = format!("UPDATE public.twopc_commit_records SET {set} WHERE sink_id = $1");
        assert_eq!(f.admin.execute(&sql, &[&f.sink]).unwrap(), 1, "{sql}");
    };
    let original = "subtask = 0, checkpoint = 1, row_count = 2";

    // Each edit below was taken as it is before the fix: a subtask other
    // than the id's, a negative count read as about 2^64 records, a
    // negative checkpoint as about 2^64 (so every later rewind check and
    // compaction saw the transaction after every checkpoint), a record
    // filed under this sink for another sink's transaction.
    edit(&mut f, "subtask = 3");
    let msg = corrupt(dest.committed_after(lineage, 0), "subtask");
    for needle in [
        "twopc_commit_records",
        txn.as_str(),
        "subtask is 3 but its transaction id names subtask 0",
        "edited by hand",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing: {msg}");
    }
    edit(&mut f, original);
    assert_eq!(dest.committed_after(lineage, 0).unwrap().len(), 1);

    edit(&mut f, "row_count = -5");
    let msg = corrupt(dest.committed_after(lineage, 0), "row_count");
    assert!(msg.contains("row_count is negative (-5)"), "{msg}");
    edit(&mut f, original);

    // Only a read of every record meets a negative checkpoint: the
    // compaction's.
    edit(&mut f, "checkpoint = -1");
    let msg = corrupt(dest.compact_history(&POLICY), "checkpoint");
    assert!(msg.contains("checkpoint is negative (-1)"), "{msg}");
    edit(&mut f, original);

    let other = txn.replacen(f.sink.as_str(), "someone_else", 1);
    edit(&mut f, &format!("transaction_id = '{other}'"));
    let msg = corrupt(dest.committed_after(lineage, 0), "sink");
    assert!(
        msg.contains(&format!(
            "sink_id is {:?} but its transaction id names sink 'someone_else'",
            f.sink
        )),
        "{msg}"
    );
    edit(&mut f, &format!("transaction_id = '{txn}'"));

    // Repaired: read as before.
    let c = dest.committed_after(lineage, 0).unwrap();
    assert_eq!((c[0].checkpoint, c[0].records, c[0].subtask), (1, 2, 0));
}
