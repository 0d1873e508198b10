//! Unit tests of each protocol transition and outcome, driven through
//! `SubtaskSink` against the in-memory destination.

use std::cell::Cell;

use twopc_core::committer::{AbortOutcome, CommitOutcome, Committer};
use twopc_core::config::{
    FreshStartPolicy, RetryPolicy, RewindPolicy, SinkOptions, SubtaskContext,
};
use twopc_core::destination::Destination;
use twopc_core::error::TwopcError;
use twopc_core::fencing_scenarios::{
    assert_shares_left_to_attempt_2, prepared_by, zombie_told_late, AttemptParts,
};
use twopc_core::ids::{RunId, SinkId, TransactionId};
use twopc_core::interrupt;
use twopc_core::memory::{Fault, MemoryDestination, MemoryStore, Operation};
use twopc_core::records::{BatchParts, RecordBatchBuf};
use twopc_core::{
    Clock, CommitStep, CommitterSession, Restore, SubtaskSink, TransactionHandle, WriterSession,
};

/// A clock that only moves when told to, or when the protocol sleeps.
#[derive(Default)]
struct TestClock(Cell<u64>);
impl Clock for TestClock {
    fn now_ms(&self) -> u64 {
        self.0.get()
    }
    fn sleep_ms(&self, ms: u64) {
        self.0.set(self.0.get() + ms);
    }
}

fn sink_id() -> SinkId {
    SinkId::new("orders").unwrap()
}

fn ctx(run: &str, subtask: u32, parallelism: u32) -> SubtaskContext {
    SubtaskContext::new(sink_id(), RunId::new(run).unwrap(), subtask, parallelism).unwrap()
}

fn options() -> SinkOptions {
    SinkOptions {
        commit_retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff_ms: 10,
            max_backoff_ms: 100,
        },
        ..SinkOptions::default()
    }
}

type Sink<'a> = SubtaskSink<MemoryDestination, &'a TestClock>;

fn open<'a>(
    store: &MemoryStore,
    clock: &'a TestClock,
    ctx: SubtaskContext,
    options: SinkOptions,
    restore: Option<&Restore>,
    nonce: u64,
) -> Result<Sink<'a>, TwopcError> {
    SubtaskSink::open(
        store.destination(&sink_id()),
        clock,
        ctx,
        options,
        restore,
        Some(nonce),
    )
    .map(|(s, _)| s)
}

fn batch(records: &[&str]) -> RecordBatchBuf {
    RecordBatchBuf::from_records(records)
}

/// Begins, writes `records` and prepares for `checkpoint`.
fn prepared(sink: &mut Sink<'_>, records: &[&str], checkpoint: u64) -> TransactionHandle {
    let h = sink.begin().unwrap();
    sink.write(&h.transaction, &batch(records)).unwrap();
    sink.prepare(&h.transaction, checkpoint).unwrap()
}

fn visible(store: &MemoryStore) -> Vec<String> {
    let mut v: Vec<String> = store
        .visible_records()
        .into_iter()
        .map(|r| String::from_utf8(r).unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn prepared_output_is_invisible_until_commit() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut sink = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let h = prepared(&mut sink, &["a", "b"], 1);
    assert!(visible(&store).is_empty());
    assert_eq!(h.prepared().unwrap().records, 2);
    assert_eq!(sink.commit(&h).unwrap(), CommitOutcome::Committed);
    assert_eq!(visible(&store), vec!["a", "b"]);
    assert!(store.staged_ids().is_empty());
}

#[test]
fn repeated_commit_succeeds_as_already_committed() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut sink = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let h = prepared(&mut sink, &["a"], 1);
    sink.commit(&h).unwrap();
    assert_eq!(sink.commit(&h).unwrap(), CommitOutcome::AlreadyCommitted);
    assert_eq!(visible(&store), vec!["a"]);
}

#[test]
fn lost_commit_response_is_retried_by_id() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut sink = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let h = prepared(&mut sink, &["a"], 1);
    let mut first = true;
    store.set_faults(move |op, _| {
        if op == Operation::Commit && std::mem::take(&mut first) {
            Fault::FailAfter
        } else {
            Fault::None
        }
    });
    assert_eq!(sink.commit(&h).unwrap(), CommitOutcome::AlreadyCommitted);
    assert_eq!(visible(&store), vec!["a"]);
    assert!(clock.now_ms() >= 10, "the retry waited its backoff");
}

/// A sink with a transaction of checkpoint 5 prepared, on a store that
/// then fails every commit before its effect (an unknown outcome each time).
fn sink_whose_commits_keep_failing<'a>(
    store: &'a MemoryStore,
    clock: &'a TestClock,
) -> (Sink<'a>, TransactionHandle) {
    let mut sink = open(store, clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let h = prepared(&mut sink, &["a"], 5);
    store.set_faults(|op, _| {
        if op == Operation::Commit {
            Fault::FailBefore
        } else {
            Fault::None
        }
    });
    (sink, h)
}

#[test]
fn commit_still_unknown_after_retries_stops_the_job() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let (mut sink, h) = sink_whose_commits_keep_failing(&store, &clock);
    let err = sink.commit(&h).unwrap_err();
    assert!(matches!(err, TwopcError::CommitUnresolved(_)), "{err}");
    assert!(err.is_fatal());
    let msg = err.to_string();
    assert!(
        msg.contains(h.transaction.as_str()) && msg.contains("checkpoint 5"),
        "{msg}"
    );
    assert!(msg.contains("after 3 attempts"), "{msg}");
    // Nothing was lost: the staged data is still there for the next attempt.
    store.clear_faults();
    assert_eq!(sink.commit(&h).unwrap(), CommitOutcome::Committed);
}

/// A commit the destination refuses for certain (rights, a read-only file
/// system) has a known outcome: nothing was committed, and no retry gets
/// past it. It stops the job at once, fatally, naming the transaction and
/// what to do, without a retry and never as an unknown outcome; after the
/// fix the commit by id succeeds.
#[test]
fn a_commit_refused_for_certain_stops_at_once_and_is_not_unresolved() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut sink = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let h = prepared(&mut sink, &["a"], 5);
    let attempts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = attempts.clone();
    store.set_faults(move |op, _| {
        if op == Operation::Commit {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Fault::Refuse
        } else {
            Fault::None
        }
    });
    let started = clock.now_ms();
    let err = sink.commit(&h).unwrap_err();
    assert!(err.is_fatal(), "{err}");
    assert!(!matches!(err, TwopcError::CommitUnresolved(_)), "{err}");
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(clock.now_ms(), started, "no back-off");
    let msg = err.to_string();
    for needle in [
        h.transaction.as_str(),
        "refused a step of the commit",
        "latest checkpoint",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing: {msg}");
    }
    store.clear_faults();
    assert_eq!(sink.commit(&h).unwrap(), CommitOutcome::Committed);
}

/// Flink cancels a task by interrupting its thread, and kills the
/// TaskManager when the task has not stopped within its cancellation
/// timeout: a commit that keeps failing is given up as soon as the caller
/// asks (`twopc_core::interrupt`), before its retries run out, and never as
/// an unresolved commit (that would stop the job). Nothing is lost: the
/// next attempt commits the transaction by id.
#[test]
fn a_commit_given_up_by_a_cancelled_task_is_not_unresolved_and_loses_nothing() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let (mut sink, h) = sink_whose_commits_keep_failing(&store, &clock);
    let started = clock.now_ms();
    let err = interrupt::with_check(|| true, || sink.commit(&h)).unwrap_err();
    assert!(!err.is_fatal(), "{err}");
    assert!(!matches!(err, TwopcError::CommitUnresolved(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("interrupted"), "{msg}");
    assert!(msg.contains(h.transaction.as_str()), "{msg}");
    assert!(msg.contains("commits it again by id"), "{msg}");
    assert_eq!(clock.now_ms(), started, "no back-off was waited out");
    assert!(visible(&store).is_empty());
    // A commit that does not wait is never given up, whatever the check says.
    store.clear_faults();
    assert_eq!(
        interrupt::with_check(|| true, || sink.commit(&h)).unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(visible(&store), vec!["a"]);
}

/// The back-off between commit attempts hears a caller who gives up within
/// a slice, not at its end.
#[test]
fn a_commit_back_off_is_cut_short_when_the_call_is_given_up() {
    thread_local! {
        static SLEPT: Cell<u64> = const { Cell::new(0) };
    }
    struct SleepCounter;
    impl Clock for SleepCounter {
        fn now_ms(&self) -> u64 {
            SLEPT.with(Cell::get)
        }
        fn sleep_ms(&self, ms: u64) {
            SLEPT.with(|s| s.set(s.get() + ms));
        }
    }
    let waited_out = interrupt::with_check(
        || SLEPT.with(Cell::get) >= 300,
        || Committer::back_off(&SleepCounter, 60_000),
    );
    assert!(!waited_out);
    let slept = SLEPT.with(Cell::get);
    assert!(
        (300..1_000).contains(&slept),
        "given up {slept} ms into a 60 s back-off"
    );
    SLEPT.with(|s| s.set(0));
    assert!(interrupt::with_check(
        || false,
        || Committer::back_off(&SleepCounter, 250)
    ));
    assert_eq!(SLEPT.with(Cell::get), 250, "waited out in full");
}

#[test]
fn transaction_lost_by_the_destination_is_fatal_and_named() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut sink = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let h = prepared(&mut sink, &["a", "b", "c"], 9);
    assert!(store.expire_externally(&h.transaction));
    let err = sink.commit(&h).unwrap_err();
    let TwopcError::Lost(lost) = &err else {
        panic!("expected LOST, got {err}")
    };
    assert_eq!(lost.checkpoint, 9);
    assert_eq!(lost.records, 3);
    let msg = err.to_string();
    assert!(msg.contains(h.transaction.as_str()), "{msg}");
    assert!(msg.contains("expired"), "{msg}");
    assert!(msg.contains("Recovery plan"), "{msg}");
    assert!(err.is_fatal());
}

#[test]
fn empty_transaction_commits_as_a_no_op() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut sink = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let h = prepared(&mut sink, &[], 1);
    assert_eq!(sink.commit(&h).unwrap(), CommitOutcome::Empty);
    assert!(store.staged_ids().is_empty());
    assert!(store.committed().is_empty());
}

#[test]
fn protocol_misuse_is_an_error_not_a_panic() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut sink = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let open_h = sink.begin().unwrap();
    assert!(matches!(sink.begin(), Err(TwopcError::Protocol { .. })));
    assert!(matches!(
        sink.commit(&open_h),
        Err(TwopcError::Protocol { .. })
    ));
    let p = sink.prepare(&open_h.transaction, 1).unwrap();
    assert!(matches!(
        sink.write(&p.transaction, &batch(&["x"])),
        Err(TwopcError::Protocol { .. })
    ));
    assert!(matches!(
        sink.prepare(&p.transaction, 2),
        Err(TwopcError::Protocol { .. })
    ));
    // A malformed batch is rejected whole.
    let h = sink.begin().unwrap();
    let (mut data, mut ends, _) = batch(&["ok"]).into_parts();
    data.push(b'x');
    ends.extend_from_slice(&200u32.to_le_bytes());
    let bad = BatchParts {
        data: &data,
        ends: &ends,
        terminator: None,
    };
    assert!(matches!(
        sink.write(&h.transaction, bad),
        Err(TwopcError::Batch { .. })
    ));
    assert_eq!(sink.open_stats().records, 0);
}

#[test]
fn abort_is_repeatable_and_never_removes_committed_output() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut sink = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let committed = prepared(&mut sink, &["kept"], 1);
    sink.commit(&committed).unwrap();
    let h = sink.begin().unwrap();
    sink.write(&h.transaction, &batch(&["dropped"])).unwrap();
    assert_eq!(sink.abort(&h).unwrap(), AbortOutcome::Aborted);
    assert_eq!(sink.abort(&h).unwrap(), AbortOutcome::NothingStaged);
    assert!(matches!(
        sink.abort(&committed),
        Err(TwopcError::Protocol { .. })
    ));
    assert_eq!(visible(&store), vec!["kept"]);
}

/// A writer aborts a prepared transaction only when it just prepared it
/// (the SinkFunction aborts it when beginning the next failed) or aborted
/// it already. Handle bytes naming another prepared one (of a checkpoint
/// that may have completed, its own or another subtask's) are refused and
/// change nothing: a later commit of it must still succeed. An open
/// transaction, never committed, may be aborted whoever's it was (after a
/// rescale, the SinkFunction's restore may hand one to another subtask).
#[test]
fn a_writer_refuses_to_abort_what_is_not_its_own_to_abort() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut s0 = open(&store, &clock, ctx("run1", 0, 2), options(), None, 1).unwrap();
    let mut s1 = open(&store, &clock, ctx("run1", 1, 2), options(), None, 1).unwrap();
    // Prepared, then the next transaction began: handed on to its checkpoint.
    let handed_on = prepared(&mut s0, &["a"], 1);
    let next = s0.begin().unwrap();
    let others = prepared(&mut s1, &["b"], 1);
    for h in [&handed_on, &others] {
        let err = s0.abort(h).unwrap_err();
        assert!(
            matches!(&err, TwopcError::Protocol { message, .. } if message.contains("refusing to abort")),
            "{err}"
        );
    }
    assert_eq!(s0.commit(&handed_on).unwrap(), CommitOutcome::Committed);
    assert_eq!(s1.commit(&others).unwrap(), CommitOutcome::Committed);
    assert_eq!(visible(&store), vec!["a", "b"]);
    // Another subtask's open transaction.
    let open_elsewhere = s1.begin().unwrap();
    s1.write(&open_elsewhere.transaction, &batch(&["x"]))
        .unwrap();
    assert_eq!(s0.abort(&open_elsewhere).unwrap(), AbortOutcome::Aborted);
    // Just prepared, the next not begun: may be aborted, and again.
    s0.write(&next.transaction, &batch(&["c"])).unwrap();
    let just = s0.prepare(&next.transaction, 2).unwrap();
    assert_eq!(s0.abort(&just).unwrap(), AbortOutcome::Aborted);
    assert_eq!(s0.abort(&just).unwrap(), AbortOutcome::NothingStaged);
    assert_eq!(visible(&store), vec!["a", "b"]);
}

#[test]
fn lingering_transactions_are_aborted_after_the_first_checkpoint_by_their_owner_only() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    // Run 1, parallelism 4: each subtask prepares one transaction.
    let mut handles = Vec::new();
    for i in 0..4 {
        let mut s = open(
            &store,
            &clock,
            ctx("run1", i, 4),
            options(),
            None,
            100 + i as u64,
        )
        .unwrap();
        handles.push(prepared(&mut s, &[&format!("r{i}")], 3));
    }
    // Checkpoint 3 knows subtasks 0 and 1 only (2 and 3 are lingering).
    // Rescaled to 2, each new subtask is handed a share of that state only:
    // new 0 restores old 1, new 1 restores old 0. Ownership of leftovers is
    // by original index: new 0 owns old 0 and 2, new 1 owns old 1 and 3.
    let share = |h: &TransactionHandle| Restore {
        states: Vec::new(),
        checkpoint: 3,
        known: vec![h.clone()],
    };
    let mut s0 = open(
        &store,
        &clock,
        ctx("run1", 0, 2),
        options(),
        Some(&share(&handles[1])),
        7,
    )
    .unwrap();
    let mut s1 = open(
        &store,
        &clock,
        ctx("run1", 1, 2),
        options(),
        Some(&share(&handles[0])),
        8,
    )
    .unwrap();
    assert_eq!(
        store.staged_ids().len(),
        4,
        "nothing is aborted before recovery is over"
    );
    // Recovery commits the restored ones, wherever they were redistributed.
    s0.commit(&handles[1]).unwrap();
    s1.commit(&handles[0]).unwrap();
    assert!(
        s0.recovery_cleanup_due(),
        "restored commits do not end recovery"
    );
    // The first checkpoint of the new attempt completes.
    let own0 = prepared(&mut s0, &["n0"], 4);
    s0.commit(&own0).unwrap();
    assert!(
        store.staged_ids().contains(&handles[2].transaction),
        "a commit alone does not end recovery: the checkpoint's completion does"
    );
    let report = s0.checkpoint_completed(4).unwrap();
    assert_eq!(report.aborted, vec![handles[2].transaction.clone()]);
    let left = store.staged_ids();
    assert!(
        !left.contains(&handles[2].transaction),
        "old subtask 2 aborted by new 0"
    );
    assert!(
        left.contains(&handles[3].transaction),
        "old subtask 3 is not subtask 0's"
    );
    let own1 = prepared(&mut s1, &["n1"], 4);
    s1.commit(&own1).unwrap();
    s1.checkpoint_completed(4).unwrap();
    assert!(store.staged_ids().is_empty());
    assert_eq!(visible(&store), vec!["n0", "n1", "r0", "r1"]);
}

#[test]
fn rewind_is_detected_or_replaced_as_configured() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut s = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let c1 = prepared(&mut s, &["one"], 1);
    s.commit(&c1).unwrap();
    let c2 = prepared(&mut s, &["two"], 2);
    s.commit(&c2).unwrap();
    let open_at_1 = s.begin().unwrap();
    drop(s); // the job is stopped
             // A savepoint taken at checkpoint 1 knows c1 (pending) and an open txn.
    let savepoint = Restore {
        states: Vec::new(),
        checkpoint: 1,
        known: vec![c1.clone(), open_at_1],
    };
    let err = open(
        &store,
        &clock,
        ctx("run2", 0, 1),
        options(),
        Some(&savepoint),
        2,
    )
    .err()
    .unwrap();
    let TwopcError::Rewind(r) = &err else {
        panic!("expected rewind, got {err}")
    };
    assert_eq!(r.committed_after, vec![(c2.transaction.clone(), 2)]);
    assert!(err.is_fatal());
    assert_eq!(
        visible(&store),
        vec!["one", "two"],
        "detection changes nothing"
    );

    let replace = SinkOptions {
        rewind: RewindPolicy::ReplaceRange,
        ..options()
    };
    let mut s2 = open(
        &store,
        &clock,
        ctx("run2", 0, 1),
        replace,
        Some(&savepoint),
        3,
    )
    .unwrap();
    assert_eq!(
        visible(&store),
        vec!["one"],
        "output after checkpoint 1 retracted"
    );
    assert_eq!(s2.commit(&c1).unwrap(), CommitOutcome::AlreadyCommitted);
    let again = prepared(&mut s2, &["two"], 2);
    s2.commit(&again).unwrap();
    assert_eq!(visible(&store), vec!["one", "two"]);
}

#[test]
fn checkpoint_ids_of_another_lineage_do_not_count_as_rewind() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    // An earlier, unrelated run committed checkpoint 50.
    let mut old = open(&store, &clock, ctx("old", 0, 1), options(), None, 1).unwrap();
    let h = prepared(&mut old, &["old"], 50);
    old.commit(&h).unwrap();
    drop(old);
    // A new run (new lineage, appending next to the old output) restores
    // from its own checkpoint 2.
    let append = SinkOptions {
        fresh_start: FreshStartPolicy::Append,
        ..options()
    };
    let mut fresh = open(&store, &clock, ctx("new", 0, 1), append, None, 2).unwrap();
    let mine = prepared(&mut fresh, &["new"], 2);
    drop(fresh);
    let restore = Restore {
        states: Vec::new(),
        checkpoint: 2,
        known: vec![mine.clone()],
    };
    let mut restored = open(
        &store,
        &clock,
        ctx("new", 0, 1),
        options(),
        Some(&restore),
        3,
    )
    .unwrap();
    restored.commit(&mine).unwrap();
    assert_eq!(visible(&store), vec!["new", "old"]);
}

#[test]
fn fresh_start_never_aborts_prepared_transactions_of_another_run_silently() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut old = open(&store, &clock, ctx("run1", 0, 2), options(), None, 1).unwrap();
    let p = prepared(&mut old, &["a"], 4);
    let o = old.begin().unwrap();
    old.write(&o.transaction, &batch(&["b"])).unwrap();

    let err = open(&store, &clock, ctx("run2", 1, 2), options(), None, 2)
        .err()
        .unwrap();
    let TwopcError::PreparedOnFreshStart(f) = &err else {
        panic!("expected fresh-start error, got {err}")
    };
    assert_eq!(f.prepared, vec![(p.transaction.clone(), 4)]);
    assert!(err.to_string().contains("ABORT_PREPARED"));
    assert_eq!(store.staged_ids().len(), 2, "nothing removed");
    drop(old);

    let abort = SinkOptions {
        fresh_start: FreshStartPolicy::AbortPrepared,
        ..options()
    };
    open(&store, &clock, ctx("run2", 0, 2), abort, None, 3).unwrap();
    assert!(store.staged_ids().is_empty());
}

#[test]
fn fresh_start_of_the_same_run_aborts_its_own_earlier_attempt() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut first = open(&store, &clock, ctx("job", 0, 1), options(), None, 1).unwrap();
    prepared(&mut first, &["a"], 1);
    drop(first);
    // Failover before checkpoint 1 completed: Flink restarts without state.
    open(&store, &clock, ctx("job", 0, 1), options(), None, 2).unwrap();
    assert!(store.staged_ids().is_empty());
}

/// A new execution under the job id of an earlier one (application mode
/// with high availability derives it from the cluster id): neither a
/// failover (whose prepared transactions it may abort) nor a new run (whose
/// lineage differs). Found by review: it aborted the earlier execution's
/// transaction of a completed checkpoint and replayed next to its output.
#[test]
fn a_fresh_start_under_a_job_id_that_committed_output_stops_whatever_the_policy() {
    for policy in [
        FreshStartPolicy::Fail,
        FreshStartPolicy::Append,
        FreshStartPolicy::AbortPrepared,
        FreshStartPolicy::AppendAndAbortPrepared,
    ] {
        let (store, clock) = (MemoryStore::new(), TestClock::default());
        let mut first = open(&store, &clock, ctx("job", 0, 1), options(), None, 1).unwrap();
        let c = prepared(&mut first, &["a"], 1);
        first.commit(&c).unwrap();
        // Checkpoint 2 completes; the process dies before its commit.
        let pending = prepared(&mut first, &["b"], 2);
        drop(first);

        let opts = SinkOptions {
            fresh_start: policy,
            ..options()
        };
        let err = open(&store, &clock, ctx("job", 0, 1), opts.clone(), None, 2)
            .err()
            .unwrap_or_else(|| panic!("{policy:?}: the start went ahead"));
        let TwopcError::JobIdReusedOnFreshStart(r) = &err else {
            panic!("{policy:?}: {err}")
        };
        assert_eq!(r.output.committed, 1);
        assert_eq!(r.output.last_checkpoint, Some(1));
        assert!(err.is_fatal());
        assert_eq!(err.kind(), twopc_core::error::ErrorKind::FreshStart);
        let text = err.to_string();
        for needle in [
            "job id",
            "high-availability.cluster-id",
            "restore",
            "Nothing was changed",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text}");
        }
        assert_eq!(
            store.staged_ids(),
            vec![pending.transaction.clone()],
            "{policy:?}: the pending transaction is kept"
        );
        assert_eq!(visible(&store), vec!["a"]);

        // Restored from checkpoint 2, the earlier execution's state commits it.
        let mut restored = open(
            &store,
            &clock,
            ctx("job", 0, 1),
            opts,
            Some(&Restore {
                states: Vec::new(),
                checkpoint: 2,
                known: vec![pending.clone()],
            }),
            3,
        )
        .unwrap();
        assert_eq!(restored.commit(&pending).unwrap(), CommitOutcome::Committed);
        assert_eq!(visible(&store), vec!["a", "b"]);
    }
}

/// The same when the earlier execution under the job id restored another
/// run's checkpoint: its output is in that lineage, not the job id's own,
/// and only the note of the job id's lineage tells. Found by review: under
/// a policy that appends, the start aborted the earlier execution's
/// prepared transaction of a completed checkpoint as its own failover's,
/// and only then did the note refuse it.
#[test]
fn a_fresh_start_under_a_job_id_that_restored_another_lineage_stops_whatever_the_policy() {
    for policy in [
        FreshStartPolicy::Fail,
        FreshStartPolicy::Append,
        FreshStartPolicy::AbortPrepared,
        FreshStartPolicy::AppendAndAbortPrepared,
    ] {
        let (store, clock) = (MemoryStore::new(), TestClock::default());
        let mut old = open(&store, &clock, ctx("old", 0, 1), options(), None, 1).unwrap();
        let c = prepared(&mut old, &["a"], 1);
        old.commit(&c).unwrap();
        let carried = prepared(&mut old, &["b"], 2);
        drop(old);
        // Execution 1 of job id "job" restores the savepoint of checkpoint 2.
        let mut first = open(
            &store,
            &clock,
            ctx("job", 0, 1),
            options(),
            Some(&Restore {
                states: Vec::new(),
                checkpoint: 2,
                known: vec![carried.clone()],
            }),
            2,
        )
        .unwrap();
        first.commit(&carried).unwrap();
        // Its checkpoint 3 completes; the process dies before its commit.
        let pending = prepared(&mut first, &["c"], 3);
        drop(first);

        let opts = SinkOptions {
            fresh_start: policy,
            ..options()
        };
        let err = open(&store, &clock, ctx("job", 0, 1), opts.clone(), None, 3)
            .err()
            .unwrap_or_else(|| panic!("{policy:?}: the start went ahead"));
        let TwopcError::JobIdReusedOnFreshStart(r) = &err else {
            panic!("{policy:?}: {err}")
        };
        assert!(r.restored_earlier);
        assert_eq!(r.output.lineage, c.lineage);
        assert!(err.is_fatal());
        let text = err.to_string();
        for needle in [
            "restored a checkpoint or savepoint of lineage",
            &c.lineage.to_string(),
            "Nothing was changed",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text}");
        }
        assert_eq!(
            store.staged_ids(),
            vec![pending.transaction.clone()],
            "{policy:?}: the pending transaction is kept"
        );
        assert_eq!(visible(&store), vec!["a", "b"]);

        // Restored from checkpoint 3, the earlier execution's state commits it.
        let mut restored = open(
            &store,
            &clock,
            ctx("job", 0, 1),
            opts,
            Some(&Restore {
                states: Vec::new(),
                checkpoint: 3,
                known: vec![pending.clone()],
            }),
            4,
        )
        .unwrap();
        assert_eq!(restored.commit(&pending).unwrap(), CommitOutcome::Committed);
        assert_eq!(visible(&store), vec!["a", "b", "c"]);
    }
}

#[test]
fn retention_cleanup_expires_leftovers_but_not_what_the_subtask_needs() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let opts = SinkOptions {
        retention_ms: 1_000,
        expiry_scan_interval_ms: 0,
        ..options()
    };
    let mut s = open(&store, &clock, ctx("run1", 0, 1), opts, None, 1).unwrap();
    let pending = prepared(&mut s, &["y"], 1);
    // A zombie writer of an earlier attempt stages a transaction after this
    // subtask started, so start-up cleanup never saw it.
    let zombie = TransactionHandle {
        transaction: TransactionId::compose(&sink_id(), 0, 0xdead, 0),
        ..pending.clone()
    };
    let mut d = store.destination(&sink_id());
    d.begin(&zombie).unwrap();
    d.write(&zombie.transaction, batch(&["z"]).batch()).unwrap();
    d.prepare(&zombie).unwrap();

    clock.0.set(10_000);
    let expired = s.expire_if_due().unwrap().expired;
    assert_eq!(
        expired,
        vec![zombie.transaction.clone()],
        "only the unprotected leftover"
    );
    assert_eq!(s.commit(&pending).unwrap(), CommitOutcome::Committed);
    let err = s.commit(&zombie).unwrap_err();
    assert!(matches!(err, TwopcError::Lost(_)), "{err}");
    assert!(err.to_string().contains("expired"), "{err}");
}

#[test]
fn restoring_state_of_another_sink_is_a_config_error() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let other = SinkId::new("payments").unwrap();
    let mut s = SubtaskSink::open(
        store.destination(&other),
        &clock,
        SubtaskContext::new(other, RunId::new("r").unwrap(), 0, 1).unwrap(),
        options(),
        None,
        Some(1),
    )
    .unwrap()
    .0;
    let h = s.begin().unwrap();
    let restore = Restore {
        states: Vec::new(),
        checkpoint: 1,
        known: vec![h],
    };
    let err = open(&store, &clock, ctx("r", 0, 1), options(), Some(&restore), 2)
        .err()
        .unwrap();
    assert!(matches!(err, TwopcError::Config(_)), "{err}");
    assert!(err.to_string().contains("payments"));
}

#[test]
fn write_failures_are_retryable_and_lose_nothing_committed() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut s = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let c = prepared(&mut s, &["a"], 1);
    s.commit(&c).unwrap();
    let h = s.begin().unwrap();
    store.set_faults(|op, _| {
        if op == Operation::Write {
            Fault::FailBefore
        } else {
            Fault::None
        }
    });
    let err = s.write(&h.transaction, &batch(&["b"])).unwrap_err();
    assert!(!err.is_fatal());
    assert!(err.to_string().contains(h.transaction.as_str()));
    assert_eq!(visible(&store), vec!["a"]);
}

#[test]
fn a_transaction_whose_write_or_prepare_failed_can_only_be_aborted() {
    // A write whose effect is unknown (it failed after part of it landed).
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut s = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&["a"])).unwrap();
    store.set_faults(|op, _| {
        if op == Operation::Write {
            Fault::FailAfter
        } else {
            Fault::None
        }
    });
    s.write(&h.transaction, &batch(&["b"])).unwrap_err();
    store.clear_faults();
    for err in [
        s.write(&h.transaction, &batch(&["c"])).unwrap_err(),
        s.prepare(&h.transaction, 1).unwrap_err(),
    ] {
        assert!(
            matches!(&err, TwopcError::Protocol { message, .. } if message.contains("poisoned")),
            "{err}"
        );
        assert!(!err.is_fatal(), "a restart replays the records: {err}");
    }
    assert_eq!(s.abort(&h).unwrap(), AbortOutcome::Aborted);
    assert!(store.staged_ids().is_empty() && visible(&store).is_empty());

    // A prepare that failed: Flink prepares the same transaction again at
    // the next checkpoint when checkpoint failures are tolerated.
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&["x"])).unwrap();
    store.set_faults(|op, _| {
        if op == Operation::Prepare {
            Fault::FailBefore
        } else {
            Fault::None
        }
    });
    s.prepare(&h.transaction, 2).unwrap_err();
    store.clear_faults();
    let err = s.prepare(&h.transaction, 3).unwrap_err();
    assert!(err.to_string().contains("poisoned"), "{err}");
    assert!(store.prepared_ids().is_empty(), "never prepared");
    assert_eq!(s.abort(&h).unwrap(), AbortOutcome::Aborted);
}

/// A destination that refuses the third record of each batch.
struct RefusesThird(twopc_core::memory::MemoryDestination);

impl Destination for RefusesThird {
    fn begin(&mut self, h: &TransactionHandle) -> Result<(), twopc_core::error::DestinationError> {
        self.0.begin(h)
    }
    fn write(
        &mut self,
        txn: &TransactionId,
        batch: twopc_core::records::RecordBatch<'_>,
    ) -> Result<(), twopc_core::error::DestinationError> {
        if let Some(record) = batch.iter().nth(2) {
            return Err(twopc_core::error::DestinationError::record(
                twopc_core::error::RecordFault {
                    position: twopc_core::error::RecordPosition::InBatch(2),
                    column: Some("amount".into()),
                    reason: "value out of range".into(),
                    preview: twopc_core::records::preview(record),
                },
            ));
        }
        self.0.write(txn, batch)
    }
    fn prepare(
        &mut self,
        h: &TransactionHandle,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.0.prepare(h)
    }
    fn commit(
        &mut self,
        h: &TransactionHandle,
        now: u64,
    ) -> Result<twopc_core::destination::CommitStatus, twopc_core::error::DestinationError> {
        self.0.commit(h, now)
    }
    fn abort(
        &mut self,
        t: &TransactionId,
    ) -> Result<twopc_core::destination::AbortStatus, twopc_core::error::DestinationError> {
        self.0.abort(t)
    }
    fn staged(
        &mut self,
    ) -> Result<Vec<twopc_core::destination::StagedTransaction>, twopc_core::error::DestinationError>
    {
        self.0.staged()
    }
    fn committed_after(
        &mut self,
        l: twopc_core::LineageId,
        c: u64,
    ) -> Result<
        Vec<twopc_core::destination::CommittedTransaction>,
        twopc_core::error::DestinationError,
    > {
        self.0.committed_after(l, c)
    }
    fn retract(
        &mut self,
        c: &twopc_core::destination::CommittedTransaction,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.0.retract(c)
    }
    fn expire(
        &mut self,
        t: &TransactionId,
        now: u64,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.0.expire(t, now)
    }
    fn claim_ownership(
        &mut self,
        c: &twopc_core::destination::OwnerClaim,
    ) -> Result<twopc_core::destination::Ownership, twopc_core::error::DestinationError> {
        self.0.claim_ownership(c)
    }
    fn lineages(
        &mut self,
    ) -> Result<Vec<twopc_core::destination::LineageSummary>, twopc_core::error::DestinationError>
    {
        self.0.lineages()
    }
    fn record_lineage(
        &mut self,
        r: &twopc_core::destination::LineageRecord,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.0.record_lineage(r)
    }
    fn record_run_lineage(
        &mut self,
        run: &RunId,
        l: twopc_core::LineageId,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.0.record_run_lineage(run, l)
    }
    fn run_lineage(
        &mut self,
        run: &RunId,
    ) -> Result<Option<twopc_core::LineageId>, twopc_core::error::DestinationError> {
        self.0.run_lineage(run)
    }
}

#[test]
fn a_record_the_destination_can_never_accept_stops_the_job_naming_it() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let dest = RefusesThird(store.destination(&sink_id()));
    let (mut s, _) =
        SubtaskSink::open(dest, &clock, ctx("run1", 0, 1), options(), None, Some(1)).unwrap();
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&["1", "2"])).unwrap();
    let err = s
        .write(&h.transaction, &batch(&["3", "4", "password=hunter2 5"]))
        .unwrap_err();
    let TwopcError::RecordRejected(r) = &err else {
        panic!("{err}")
    };
    assert_eq!(
        r.position,
        Some(4),
        "two earlier records, then index 2 of the batch"
    );
    assert_eq!(r.transaction, h.transaction);
    assert_eq!(r.column.as_deref(), Some("amount"));
    assert!(err.is_fatal());
    let text = err.to_string();
    for needle in [
        "record #4",
        h.transaction.as_str(),
        "column amount",
        "value out of range",
        "Filter or fix such records",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from {text}");
    }
    assert!(!text.contains("hunter2"), "{text}");
}

#[test]
fn a_second_live_owner_is_refused_naming_both_runs() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let live = ctx("runA", 0, 2).with_attempt(0, 7);
    let first = open(&store, &clock, live, options(), None, 1).unwrap();
    let quick = SinkOptions {
        owner_wait_ms: 1_000,
        ..options()
    };
    // Another job with the same sink id: refused after waiting, fatal.
    let before = clock.now_ms();
    let err = open(
        &store,
        &clock,
        ctx("runB", 0, 2).with_attempt(0, 9),
        quick.clone(),
        None,
        2,
    )
    .err()
    .unwrap();
    assert!(clock.now_ms() >= before + 1_000, "it waited for the holder");
    let TwopcError::OwnedElsewhere(c) = &err else {
        panic!("{err}")
    };
    assert!(c.fatal && err.is_fatal());
    let text = err.to_string();
    assert!(
        text.contains("runA") && text.contains("runB") && text.contains("another sink id"),
        "{text}"
    );
    // A second sink of the same job: fatal at once.
    let err = open(
        &store,
        &clock,
        ctx("runA", 0, 2).with_attempt(0, 8),
        quick.clone(),
        None,
        3,
    )
    .err()
    .unwrap();
    assert!(
        err.is_fatal() && err.to_string().contains("Two sinks of this job"),
        "{err}"
    );
    // A later attempt of the same subtask while the earlier still runs:
    // retryable.
    let err = open(
        &store,
        &clock,
        ctx("runA", 0, 2).with_attempt(1, 7),
        quick.clone(),
        None,
        4,
    )
    .err()
    .unwrap();
    assert!(!err.is_fatal(), "{err}");
    // Nothing was touched, and once the holder is gone the share is free.
    drop(first);
    open(
        &store,
        &clock,
        ctx("runA", 0, 2).with_attempt(1, 7),
        quick,
        None,
        5,
    )
    .unwrap();
}

#[test]
fn a_fresh_start_onto_committed_output_of_earlier_runs_stops_unless_appending() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut old = open(&store, &clock, ctx("first", 0, 1), options(), None, 1).unwrap();
    let c = prepared(&mut old, &["a", "b"], 6);
    old.commit(&c).unwrap();
    drop(old);
    let err = open(&store, &clock, ctx("second", 0, 1), options(), None, 2)
        .err()
        .unwrap();
    let TwopcError::ExistingOutputOnFreshStart(e) = &err else {
        panic!("{err}")
    };
    assert_eq!(e.lineages.len(), 1);
    assert_eq!(e.lineages[0].last_checkpoint, Some(6));
    assert_eq!(e.lineages[0].last_transactions, vec![c.transaction.clone()]);
    assert!(err.is_fatal());
    let text = err.to_string();
    for needle in [
        "first",
        "checkpoint 6",
        c.transaction.as_str(),
        "APPEND",
        "restore",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from {text}");
    }
    assert_eq!(visible(&store), vec!["a", "b"]);

    let append = SinkOptions {
        fresh_start: FreshStartPolicy::Append,
        ..options()
    };
    let mut new = open(&store, &clock, ctx("second", 0, 1), append, None, 3).unwrap();
    let mut d = store.destination(&sink_id());
    let lineages = d.lineages().unwrap();
    assert_eq!(
        lineages.len(),
        1,
        "only the first run has committed output yet"
    );
    let h = prepared(&mut new, &["c"], 1);
    new.commit(&h).unwrap();
    let lineages = d.lineages().unwrap();
    let appended = lineages
        .iter()
        .find(|l| l.lineage == new.lineage())
        .and_then(|l| l.record.clone())
        .expect("the new lineage is recorded");
    assert!(appended.appended);
}

/// Issue 16 (seeds 65997, 1112645, 1287467): the fresh-start listing meets
/// a transient error. The product must fail the attempt without changing
/// anything, so that Flink's restart repeats the check; the repeated check
/// refuses and names the prepared transactions of every subtask, whichever
/// subtask runs it.
#[test]
fn fresh_start_check_cut_short_by_a_scan_error_changes_nothing_and_runs_again() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut s0 = open(&store, &clock, ctx("run1", 0, 2), options(), None, 1).unwrap();
    let mut s1 = open(&store, &clock, ctx("run1", 1, 2), options(), None, 2).unwrap();
    let mut want = vec![
        (prepared(&mut s0, &["a"], 3).transaction, 3),
        (prepared(&mut s1, &["b"], 3).transaction, 3),
    ];
    want.sort();
    let staged = store.staged_ids();
    drop((s0, s1)); // run1 stopped

    for fault in [Fault::FailBefore, Fault::FailAfter] {
        store.set_faults(move |op, _| {
            if op == Operation::Scan {
                fault
            } else {
                Fault::None
            }
        });
        let err = open(&store, &clock, ctx("run2", 1, 2), options(), None, 3)
            .err()
            .unwrap();
        assert!(matches!(err, TwopcError::Scan { .. }), "{err}");
        assert!(!err.is_fatal(), "a restart must repeat the check");
        assert_eq!(store.staged_ids(), staged, "{fault:?}: nothing removed");
    }
    store.clear_faults();

    for subtask in 0..2 {
        let err = open(&store, &clock, ctx("run2", subtask, 2), options(), None, 4)
            .err()
            .unwrap();
        let TwopcError::PreparedOnFreshStart(f) = &err else {
            panic!("expected fresh-start error, got {err}")
        };
        let mut named = f.prepared.clone();
        named.sort();
        assert_eq!(named, want, "subtask {subtask} names both subtasks' shares");
    }
    assert_eq!(store.staged_ids(), staged);
}

/// Issue 16 (seeds 975606, 1254192, 1512710): the commit-record read of the
/// rewind check meets a transient error. The attempt fails without
/// touching the output, and the restarted attempt repeats the check.
#[test]
fn rewind_check_cut_short_by_a_read_error_changes_nothing_and_runs_again() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut s = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let c1 = prepared(&mut s, &["one"], 1);
    s.commit(&c1).unwrap();
    let c2 = prepared(&mut s, &["two"], 2);
    s.commit(&c2).unwrap();
    let savepoint = Restore {
        states: Vec::new(),
        checkpoint: 1,
        known: vec![c1, s.begin().unwrap()],
    };
    drop(s); // the job is stopped
    for fault in [Fault::FailBefore, Fault::FailAfter] {
        store.set_faults(move |op, _| {
            if op == Operation::Scan {
                fault
            } else {
                Fault::None
            }
        });
        let err = open(
            &store,
            &clock,
            ctx("run2", 0, 1),
            options(),
            Some(&savepoint),
            2,
        )
        .err()
        .unwrap();
        assert!(matches!(err, TwopcError::Scan { .. }), "{err}");
        assert!(!err.is_fatal(), "a restart must repeat the check");
        assert_eq!(visible(&store), vec!["one", "two"], "{fault:?}");
    }
    store.clear_faults();
    let err = open(
        &store,
        &clock,
        ctx("run2", 0, 1),
        options(),
        Some(&savepoint),
        3,
    )
    .err()
    .unwrap();
    let TwopcError::Rewind(r) = &err else {
        panic!("expected rewind, got {err}")
    };
    assert_eq!(r.committed_after, vec![(c2.transaction, 2)]);
}

/// Issue 16 (seeds 987795, 1515702): a prepared leftover that the
/// destination timed out between two attempts is no longer there to name;
/// the check names what is left, and lets the start proceed when nothing is.
#[test]
fn fresh_start_check_names_what_the_destination_still_holds() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut s0 = open(&store, &clock, ctx("run1", 0, 2), options(), None, 1).unwrap();
    let mut s1 = open(&store, &clock, ctx("run1", 1, 2), options(), None, 2).unwrap();
    let p0 = prepared(&mut s0, &["a"], 1);
    let p1 = prepared(&mut s1, &["b"], 1);
    drop((s0, s1)); // run1 stopped
    assert!(store.expire_externally(&p0.transaction));
    let err = open(&store, &clock, ctx("run2", 0, 2), options(), None, 3)
        .err()
        .unwrap();
    let TwopcError::PreparedOnFreshStart(f) = &err else {
        panic!("expected fresh-start error, got {err}")
    };
    assert_eq!(f.prepared, vec![(p1.transaction.clone(), 1)]);
    assert!(store.expire_externally(&p1.transaction));
    open(&store, &clock, ctx("run2", 0, 2), options(), None, 4).unwrap();
}

/// Sink V2 after a rescale 3 -> 2: committer states split apart from the
/// writers', so committer 0 holds the restored committable of old writer 1,
/// which committer 1 owns. A committer that defers an unknown commit (as
/// Flink's `retryLater()` would) must not defer that recovery commit: the
/// owner's lingering cleanup runs once the first checkpoint after the
/// restore completes, and would abort the transaction while it waits.
#[test]
fn a_recovery_commit_is_never_deferred_past_the_owners_lingering_cleanup() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    // Run 1, three writers: each prepares one transaction for checkpoint 1,
    // then snapshots; checkpoint 1 completes, nothing is committed yet.
    let mut handles = Vec::new();
    let mut states = Vec::new();
    for i in 0..3u32 {
        let mut dest = store.destination(&sink_id());
        let (mut w, _) = WriterSession::open(
            &mut dest,
            &clock,
            ctx("run1", i, 3),
            &options(),
            None,
            Some(100 + u64::from(i)),
        )
        .unwrap();
        let open = w.begin(&mut dest, &clock).unwrap();
        w.write(&mut dest, &open.transaction, &batch(&[&format!("r{i}")]))
            .unwrap();
        handles.push(w.prepare(&mut dest, &clock, &open.transaction, 1).unwrap());
        w.begin(&mut dest, &clock).unwrap();
        states.push(w.state());
    }
    // The failover restores checkpoint 1 at parallelism 2: writer states
    // and committer states are split apart.
    let restore = |share: &[usize]| Restore {
        checkpoint: 1,
        states: share.iter().map(|&i| states[i].clone()).collect(),
        known: Vec::new(),
    };
    let mut writers = Vec::new();
    for (i, share) in [vec![0, 1], vec![2]].iter().enumerate() {
        let mut dest = store.destination(&sink_id());
        let (w, _) = WriterSession::open(
            &mut dest,
            &clock,
            ctx("run1", i as u32, 2).with_attempt(1, 0),
            &options(),
            Some(&restore(share)),
            Some(7 + i as u64),
        )
        .unwrap();
        writers.push((w, dest));
    }
    let committer =
        |i: u32| CommitterSession::new(ctx("run1", i, 2).with_attempt(1, 0), options(), Some(1));
    let (mut c0, mut c1) = (committer(0), committer(1));
    let (mut d0, mut d1) = (store.destination(&sink_id()), store.destination(&sink_id()));
    // Committer 0's recovery commit of old writer 1's transaction meets an
    // unknown outcome once; a deferring committer would put it off.
    let failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let target = handles[1].transaction.clone();
    let once = failed.clone();
    store.set_faults(move |op, txn| {
        if op == Operation::Commit
            && *txn == target
            && !once.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            Fault::FailBefore
        } else {
            Fault::None
        }
    });
    assert_eq!(
        c0.commit_attempt(&mut d0, &clock, &handles[0], 1).unwrap(),
        CommitStep::Done(CommitOutcome::Committed)
    );
    assert_eq!(
        c0.commit_attempt(&mut d0, &clock, &handles[1], 1).unwrap(),
        CommitStep::Done(CommitOutcome::Committed),
        "a recovery commit is retried in place, never handed back to be deferred"
    );
    assert!(failed.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(
        c1.commit_attempt(&mut d1, &clock, &handles[2], 1).unwrap(),
        CommitStep::Done(CommitOutcome::Committed)
    );
    // A commit of the new attempt may still be deferred: its outcome
    // comes back unknown, and the caller retries it later by id.
    let (w1, wd1) = &mut writers[1];
    let open = w1.begin(wd1, &clock).unwrap();
    w1.write(wd1, &open.transaction, &batch(&["n1"])).unwrap();
    let own1 = w1.prepare(wd1, &clock, &open.transaction, 2).unwrap();
    store.set_faults(|op, _| {
        if op == Operation::Commit {
            Fault::FailBefore
        } else {
            Fault::None
        }
    });
    assert!(matches!(
        c1.commit_attempt(&mut d1, &clock, &own1, 1).unwrap(),
        CommitStep::RetryAfter { .. }
    ));
    store.clear_faults();
    assert_eq!(
        c1.commit_attempt(&mut d1, &clock, &own1, 2).unwrap(),
        CommitStep::Done(CommitOutcome::Committed)
    );
    // Checkpoint 2 completes: committer 1 owns old writer 1's index and
    // cleans up; the restored transaction is committed, not lingering.
    let report = c1.checkpoint_completed(&mut d1, &clock, 2).unwrap();
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(visible(&store), vec!["n1", "r0", "r1", "r2"]);
}

/// A transaction prepared for a checkpoint after the restored one is in no
/// restored state, so nothing will ever commit it. Its owner aborts it at
/// the start, not at the first completed checkpoint: until then it would
/// hold its locks, and a replay that waits for them (PostgreSQL, a unique
/// key written again) would keep every checkpoint from completing. One
/// prepared for the restored checkpoint is left to the recovery commit.
#[test]
fn a_transaction_prepared_after_the_restored_checkpoint_is_aborted_at_the_start() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let mut s = open(&store, &clock, ctx("run1", 0, 1), options(), None, 1).unwrap();
    let h1 = prepared(&mut s, &["a"], 1);
    let state = s.writer_state();
    let h2 = prepared(&mut s, &["b"], 2);
    drop(s);
    let restore = Restore {
        checkpoint: 1,
        states: vec![state],
        known: vec![h1.clone()],
    };
    let (mut s, report) = SubtaskSink::open(
        store.destination(&sink_id()),
        &clock,
        ctx("run1", 0, 1).with_attempt(1, 0),
        options(),
        Some(&restore),
        Some(2),
    )
    .unwrap();
    assert_eq!(report.aborted, vec![h2.transaction.clone()]);
    let staged = store.staged_ids();
    assert!(!staged.contains(&h2.transaction), "{staged:?}");
    assert!(staged.contains(&h1.transaction), "{staged:?}");
    s.commit(&h1).unwrap();
    assert_eq!(visible(&store), vec!["a"]);
}

/// Subtask `i` of `parallelism` in attempt `attempt` of run1, for the
/// scenarios of a superseded attempt (a zombie) and the newer attempt that
/// replaced it.
fn attempt_ctx(attempt: u32, i: u32, parallelism: u32) -> SubtaskContext {
    ctx("run1", i, parallelism).with_attempt(attempt, 0)
}

/// The attempts' parts on one in-memory store: each writer and committer
/// a view of its own (a view's ownership dies with it, as a lock with its
/// process).
struct Views<'a>(&'a MemoryStore);

impl AttemptParts for Views<'_> {
    type Dest = MemoryDestination;
    fn destination(&self, ctx: &SubtaskContext) -> MemoryDestination {
        self.0.destination(&ctx.sink)
    }
    fn writer_ctx(&self, i: u32, parallelism: u32, attempt: u32) -> SubtaskContext {
        attempt_ctx(attempt, i, parallelism)
    }
    fn batch(records: &[&str]) -> RecordBatchBuf {
        batch(records)
    }
}

type OneSubtask = twopc_core::fencing_scenarios::OneSubtask<MemoryDestination>;
type NewerAttempt = twopc_core::fencing_scenarios::NewerAttempt<MemoryDestination>;

/// Checks that none of the transactions the newer attempt prepared is gone.
fn assert_prepared_still_staged(newer: &NewerAttempt, store: &MemoryStore) {
    let staged = store.staged_ids();
    for h in &newer.prepared {
        assert!(staged.contains(&h.transaction), "{h:?} gone: {staged:?}");
    }
}

/// A superseded attempt's Sink V2 committer (a zombie: its task still runs,
/// on a TaskManager cut off from the JobManager, and its writer has closed)
/// is told late that checkpoint 2 completed, the first after its restore,
/// while a newer attempt, restored from checkpoint 2 at
/// `new_parallelism`, already writes and has prepared transactions for
/// checkpoint 3. The zombie's lingering cleanup must leave them alone:
/// aborted, the newer attempt's commit would find them LOST and fail a
/// healthy job. The newer attempt's own cleanup, through committers with
/// destinations of their own, still removes what is really lingering.
fn a_zombie_committer_leaves_a_newer_attempts_shares_alone(new_parallelism: u32) {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    // Attempt 0: checkpoint 1 with one transaction; the attempt fails
    // before committing it.
    let mut d0 = store.destination(&sink_id());
    let (mut w0, _) = WriterSession::open(
        &mut d0,
        &clock,
        attempt_ctx(0, 0, 1),
        &options(),
        None,
        Some(10),
    )
    .unwrap();
    let h1 = prepared_by(&mut w0, &mut d0, &clock, &batch(&["a"]), 1);
    w0.begin(&mut d0, &clock).unwrap();
    let s1 = w0.state();
    drop((w0, d0));

    // Attempt 1, restored from checkpoint 1: the zombie to be.
    let restore1 = Restore {
        checkpoint: 1,
        states: vec![s1],
        known: Vec::new(),
    };
    let mut zombie = OneSubtask::open(&Views(&store), &clock, &options(), 1, Some(&restore1), 20);
    assert_eq!(
        zombie
            .committer
            .commit_attempt(&mut zombie.committer_dest, &clock, &h1, 1)
            .unwrap(),
        CommitStep::Done(CommitOutcome::Committed)
    );
    let h2 = zombie.prepares(&clock, &["b"], 2);
    let s2 = zombie.writer.state();
    // Checkpoint 2 completes at the JobManager, which then loses the
    // zombie's TaskManager and restores checkpoint 2 elsewhere. The zombie
    // writer's last transaction (never in a checkpoint) stays behind, and
    // the writer closes; its committer still runs.
    let leftover = zombie.begins(&clock, &["never"]);
    let (mut zc, mut zc_dest) = zombie.writer_closes();

    // Attempt 2, restored from checkpoint 2.
    let mut newer = NewerAttempt::start(
        &Views(&store),
        &clock,
        &options(),
        2,
        &s2,
        &h2,
        new_parallelism,
    );

    // The zombie's late notification of checkpoint 2.
    let report = zombie_told_late(&mut zc, &mut zc_dest, &clock, &h2, 2);
    assert!(report.aborted.is_empty(), "{report:?}");
    assert_prepared_still_staged(&newer, &store);
    assert_shares_left_to_attempt_2(&report, new_parallelism);
    assert!(zc.cleanup_due(), "a skipped share stays due");

    // The newer attempt commits checkpoint 3 and cleans up after it: the
    // zombie writer's leftover goes, through committers whose destinations
    // are not their writers'.
    for report in newer.commit_and_clean_up(&clock, 3) {
        assert!(report.failures.is_empty(), "{report:?}");
    }
    for (c, _) in &newer.committers {
        assert!(!c.cleanup_due());
    }
    assert!(!store.staged_ids().contains(&leftover.transaction));
    let mut expected = vec!["a".to_string(), "b".to_string()];
    expected.extend((0..new_parallelism).map(|i| format!("c{i}")));
    assert_eq!(visible(&store), expected);
}

#[test]
fn a_zombie_committers_cleanup_leaves_the_newer_attempts_share_alone() {
    a_zombie_committer_leaves_a_newer_attempts_shares_alone(1);
}

/// After a scale-up, the zombie (parallelism 1) owns every index by its
/// own count, among them index 1, which a subtask of the newer attempt
/// now writes.
#[test]
fn a_zombie_committers_cleanup_leaves_alone_an_index_a_scale_up_gave_to_a_new_subtask() {
    a_zombie_committer_leaves_a_newer_attempts_shares_alone(2);
}

/// The retention scan is fenced like the lingering cleanup. A superseded
/// attempt's Sink V2 committer (a zombie: its writer has closed, its task
/// still runs) keeps only its own writer's transactions and the handles it
/// was given; told late that checkpoint 1 completed, when the prepared
/// transactions of the newer attempt, restored from checkpoint 1 at
/// `new_parallelism`, are older than the retention, its scan must leave
/// them alone: expired, the newer attempt's commit would find them LOST.
/// It reports each share it left as a housekeeping failure. The newer
/// attempt's own scan, through committers whose destinations are not their
/// writers', still expires what is stale in its shares.
fn a_zombie_committers_retention_scan_leaves_a_newer_attempts_shares_alone(new_parallelism: u32) {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let options = SinkOptions {
        retention_ms: 1_000,
        expiry_scan_interval_ms: 0,
        ..options()
    };
    // Attempt 1, a fresh start, so no lingering cleanup is due and its
    // committer runs the retention scan at every completed checkpoint.
    // Checkpoint 1 completes at the JobManager, which then loses the
    // zombie's TaskManager and restores checkpoint 1 elsewhere; the zombie
    // writer closes, its committer still runs.
    let mut zombie = OneSubtask::open(&Views(&store), &clock, &options, 1, None, 20);
    let h1 = zombie.prepares(&clock, &["a"], 1);
    let s1 = zombie.writer.state();
    let (mut zc, mut zc_dest) = zombie.writer_closes();

    // Attempt 2, restored from checkpoint 1.
    let mut newer = NewerAttempt::start(
        &Views(&store),
        &clock,
        &options,
        1,
        &s1,
        &h1,
        new_parallelism,
    );

    // The newer attempt's transactions outlive the retention before the
    // zombie hears that checkpoint 1 completed.
    clock.0.set(10_000);
    let report = zombie_told_late(&mut zc, &mut zc_dest, &clock, &h1, 1);
    assert!(report.expired.is_empty(), "{report:?}");
    assert_prepared_still_staged(&newer, &store);
    // One failure per share left alone, counted like the lingering
    // cleanup's: each names the share and its holder, and says what
    // happens next.
    assert_shares_left_to_attempt_2(&report, new_parallelism);
    for (f, h) in report.failures.iter().zip(&newer.prepared) {
        assert!(
            f.contains("the retention scan after checkpoint 1")
                && f.contains(h.transaction.as_str()),
            "{f}"
        );
    }
    assert_eq!(zc.stats().housekeeping_failures, u64::from(new_parallelism));
    assert_eq!(zc.stats().expired, 0);

    // The newer attempt commits checkpoint 2: nothing was lost.
    for report in newer.commit_and_clean_up(&clock, 2) {
        assert!(report.failures.is_empty(), "{report:?}");
    }
    // In its own share, the newer attempt's scan expires what it does not
    // keep: a transaction an earlier attempt's writer staged there after
    // the cleanup, past the retention by checkpoint 3.
    let stale = TransactionHandle {
        transaction: TransactionId::compose(&sink_id(), 0, 0xdead, 0),
        ..newer.prepared[0].clone()
    };
    let mut d = store.destination(&sink_id());
    d.begin(&stale).unwrap();
    d.write(&stale.transaction, batch(&["z"]).batch()).unwrap();
    d.prepare(&stale).unwrap();
    clock.0.set(20_000);
    let (c0, c0_dest) = &mut newer.committers[0];
    let report = c0.checkpoint_completed(c0_dest, &clock, 3).unwrap();
    assert_eq!(
        report.expired,
        vec![stale.transaction.clone()],
        "{report:?}"
    );
    assert!(report.failures.is_empty(), "{report:?}");
    let mut expected = vec!["a".to_string()];
    expected.extend((0..new_parallelism).map(|i| format!("c{i}")));
    assert_eq!(visible(&store), expected);
}

#[test]
fn a_zombie_committers_retention_scan_leaves_the_newer_attempts_share_alone() {
    a_zombie_committers_retention_scan_leaves_a_newer_attempts_shares_alone(1);
}

/// After a scale-up, the zombie (parallelism 1) owns index 1 by its own
/// count, which a subtask of the newer attempt now writes.
#[test]
fn a_zombie_committers_retention_scan_leaves_alone_an_index_a_scale_up_gave_to_a_new_subtask() {
    a_zombie_committers_retention_scan_leaves_a_newer_attempts_shares_alone(2);
}

/// A destination that lists one extra transaction as prepared with an
/// unreadable handle until an abort of it, which answers `WasCommitted` and
/// lists it no more: PostgreSQL when someone commits it by hand between the
/// listing and the abort (the object store likewise, its object existing).
struct CommittedMeanwhile {
    inner: MemoryDestination,
    listed: Option<TransactionId>,
}

impl Destination for CommittedMeanwhile {
    fn begin(&mut self, h: &TransactionHandle) -> Result<(), twopc_core::error::DestinationError> {
        self.inner.begin(h)
    }
    fn write(
        &mut self,
        txn: &TransactionId,
        batch: twopc_core::records::RecordBatch<'_>,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.inner.write(txn, batch)
    }
    fn prepare(
        &mut self,
        h: &TransactionHandle,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.inner.prepare(h)
    }
    fn commit(
        &mut self,
        h: &TransactionHandle,
        now: u64,
    ) -> Result<twopc_core::destination::CommitStatus, twopc_core::error::DestinationError> {
        self.inner.commit(h, now)
    }
    fn abort(
        &mut self,
        t: &TransactionId,
    ) -> Result<twopc_core::destination::AbortStatus, twopc_core::error::DestinationError> {
        if self.listed.as_ref() == Some(t) {
            self.listed = None;
            return Ok(twopc_core::destination::AbortStatus::WasCommitted);
        }
        self.inner.abort(t)
    }
    fn staged(
        &mut self,
    ) -> Result<Vec<twopc_core::destination::StagedTransaction>, twopc_core::error::DestinationError>
    {
        let mut staged = self.inner.staged()?;
        if let Some(t) = &self.listed {
            let parsed = TransactionId::parse(t.as_str()).unwrap();
            staged.push(twopc_core::destination::StagedTransaction {
                transaction: t.clone(),
                subtask: parsed.subtask,
                attempt_nonce: parsed.attempt_nonce,
                state: twopc_core::destination::StagedState::PreparedUnreadable {
                    reason: "its handle row is missing".into(),
                },
                last_activity_ms: 0,
            });
        }
        Ok(staged)
    }
    fn committed_after(
        &mut self,
        l: twopc_core::LineageId,
        c: u64,
    ) -> Result<
        Vec<twopc_core::destination::CommittedTransaction>,
        twopc_core::error::DestinationError,
    > {
        self.inner.committed_after(l, c)
    }
    fn retract(
        &mut self,
        c: &twopc_core::destination::CommittedTransaction,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.inner.retract(c)
    }
    fn expire(
        &mut self,
        t: &TransactionId,
        now: u64,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.inner.expire(t, now)
    }
    fn claim_ownership(
        &mut self,
        c: &twopc_core::destination::OwnerClaim,
    ) -> Result<twopc_core::destination::Ownership, twopc_core::error::DestinationError> {
        self.inner.claim_ownership(c)
    }
    fn lineages(
        &mut self,
    ) -> Result<Vec<twopc_core::destination::LineageSummary>, twopc_core::error::DestinationError>
    {
        self.inner.lineages()
    }
    fn record_lineage(
        &mut self,
        r: &twopc_core::destination::LineageRecord,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.inner.record_lineage(r)
    }
    fn record_run_lineage(
        &mut self,
        run: &RunId,
        l: twopc_core::LineageId,
    ) -> Result<(), twopc_core::error::DestinationError> {
        self.inner.record_run_lineage(run, l)
    }
    fn run_lineage(
        &mut self,
        run: &RunId,
    ) -> Result<Option<twopc_core::LineageId>, twopc_core::error::DestinationError> {
        self.inner.run_lineage(run)
    }
}

/// A transaction listed as prepared with an unreadable handle, whose abort
/// answers "committed": a stop only while it stays listed so (a claim the
/// directory destination can neither finish nor abort; tested in the fs
/// crate). Gone from the listing (finished by hand meanwhile), it is the
/// retryable error it was: the next start meets nothing (found by
/// re-review: the job stopped, with advice that did not apply).
#[test]
fn an_unreadable_leftover_committed_meanwhile_is_retryable_not_a_stop() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let ghost = TransactionId::compose(&sink_id(), 0, 0x77, 1);
    let dest = CommittedMeanwhile {
        inner: store.destination(&sink_id()),
        listed: Some(ghost.clone()),
    };
    let opts = SinkOptions {
        fresh_start: FreshStartPolicy::AbortPrepared,
        ..options()
    };
    let err = SubtaskSink::open(dest, &clock, ctx("job", 0, 1), opts.clone(), None, Some(1))
        .err()
        .expect("an abort answered committed is no success");
    assert!(!err.is_fatal(), "{err}");
    assert!(err.to_string().contains(ghost.as_str()), "{err}");
    // The next start meets nothing.
    open(&store, &clock, ctx("job", 0, 1), opts, None, 2).unwrap();
}
