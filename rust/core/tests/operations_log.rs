//! The operations log of `twopc decide` and `twopc reconcile --apply`: each
//! change made by hand is written to the destination's log before it is
//! made, and a log that cannot be written stops the command before the
//! change.

use std::cell::Cell;

use twopc_core::config::{RetryPolicy, SinkOptions, SubtaskContext};
use twopc_core::destination::{
    AbortStatus, CommitStatus, CommittedTransaction, Destination, LineageRecord, LineageSummary,
    OperationRecord, OwnerClaim, Ownership, StagedTransaction,
};
use twopc_core::error::{DestinationError, DestinationErrorKind};
use twopc_core::ids::{CheckpointId, LineageId, RunId, SinkId, TransactionId};
use twopc_core::memory::{MemoryDestination, MemoryStore};
use twopc_core::operator::{self, Decided, Decision, OperatorError};
use twopc_core::records::{RecordBatch, RecordBatchBuf};
use twopc_core::{Clock, SubtaskSink, TransactionHandle};

#[derive(Default)]
struct TestClock(Cell<u64>);
impl Clock for TestClock {
    fn now_ms(&self) -> u64 {
        self.0.set(self.0.get() + 1);
        self.0.get()
    }
    fn sleep_ms(&self, ms: u64) {
        self.0.set(self.0.get() + ms);
    }
}

fn sink_id() -> SinkId {
    SinkId::new("orders").unwrap()
}

/// A run that prepared `records` for checkpoint 1 and died: a leftover.
fn leftover(store: &MemoryStore, clock: &TestClock, records: &[&str]) -> TransactionHandle {
    let ctx = SubtaskContext::new(sink_id(), RunId::new("run1").unwrap(), 0, 1).unwrap();
    let (mut sink, _) = SubtaskSink::open(
        store.destination(&sink_id()),
        clock,
        ctx,
        SinkOptions::default(),
        None,
        Some(7),
    )
    .unwrap();
    let h = sink.begin().unwrap();
    let batch = RecordBatchBuf::from_records(records);
    sink.write(&h.transaction, &batch).unwrap();
    sink.prepare(&h.transaction, 1).unwrap()
}

/// `twopc decide` of `txn` as operator "ops@host".
fn decide<D: Destination>(
    dest: &mut D,
    clock: &TestClock,
    txn: &TransactionId,
    decision: Decision,
) -> Result<Decided, OperatorError> {
    operator::decide(
        dest,
        clock,
        &sink_id(),
        txn,
        decision,
        RetryPolicy::default(),
        "ops@host",
    )
}

#[test]
fn a_decision_is_logged_before_and_after_it_is_carried_out() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let h = leftover(&store, &clock, &["a", "b"]);
    let mut dest = store.destination(&sink_id());
    let decided = decide(&mut dest, &clock, &h.transaction, Decision::Commit).unwrap();
    assert_eq!(decided, Decided::Committed);
    let log = dest.operations().unwrap();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0].what, "commit requested");
    assert_eq!(log[1].what, "commit: committed, output visible");
    assert!(log
        .iter()
        .all(|r| r.transaction.as_ref() == Some(&h.transaction)
            && r.by == "ops@host"
            && r.command == "decide"));
    assert!(log[0].at_ms < log[1].at_ms);
    assert_eq!(store.visible_records().len(), 2);
}

/// The memory destination, with an operations log that takes `.1` more
/// entries and then cannot be written.
struct LogFails(MemoryDestination, usize);

impl Destination for LogFails {
    fn begin(&mut self, h: &TransactionHandle) -> Result<(), DestinationError> {
        self.0.begin(h)
    }
    fn write(&mut self, t: &TransactionId, b: RecordBatch<'_>) -> Result<(), DestinationError> {
        self.0.write(t, b)
    }
    fn prepare(&mut self, h: &TransactionHandle) -> Result<(), DestinationError> {
        self.0.prepare(h)
    }
    fn commit(
        &mut self,
        h: &TransactionHandle,
        now: u64,
    ) -> Result<CommitStatus, DestinationError> {
        self.0.commit(h, now)
    }
    fn abort(&mut self, t: &TransactionId) -> Result<AbortStatus, DestinationError> {
        self.0.abort(t)
    }
    fn staged(&mut self) -> Result<Vec<StagedTransaction>, DestinationError> {
        self.0.staged()
    }
    fn committed_after(
        &mut self,
        l: LineageId,
        c: CheckpointId,
    ) -> Result<Vec<CommittedTransaction>, DestinationError> {
        self.0.committed_after(l, c)
    }
    fn retract(&mut self, c: &CommittedTransaction) -> Result<(), DestinationError> {
        self.0.retract(c)
    }
    fn expire(&mut self, t: &TransactionId, now: u64) -> Result<(), DestinationError> {
        self.0.expire(t, now)
    }
    fn claim_ownership(&mut self, c: &OwnerClaim) -> Result<Ownership, DestinationError> {
        self.0.claim_ownership(c)
    }
    fn lineages(&mut self) -> Result<Vec<LineageSummary>, DestinationError> {
        self.0.lineages()
    }
    fn record_lineage(&mut self, r: &LineageRecord) -> Result<(), DestinationError> {
        self.0.record_lineage(r)
    }
    fn record_run_lineage(&mut self, run: &RunId, l: LineageId) -> Result<(), DestinationError> {
        self.0.record_run_lineage(run, l)
    }
    fn run_lineage(&mut self, run: &RunId) -> Result<Option<LineageId>, DestinationError> {
        self.0.run_lineage(run)
    }
    fn operations(&mut self) -> Result<Vec<OperationRecord>, DestinationError> {
        self.0.operations()
    }
    fn record_operation(&mut self, r: &OperationRecord) -> Result<(), DestinationError> {
        if self.1 > 0 {
            self.1 -= 1;
            return self.0.record_operation(r);
        }
        Err(DestinationError::new(
            DestinationErrorKind::Unavailable,
            "the disk is full",
        ))
    }
}

#[test]
fn a_log_that_cannot_be_written_stops_the_command_before_the_change() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let h = leftover(&store, &clock, &["a"]);
    let mut dest = LogFails(store.destination(&sink_id()), 0);
    for decision in [Decision::Commit, Decision::Abort] {
        let err = decide(&mut dest, &clock, &h.transaction, decision).unwrap_err();
        assert!(matches!(err, OperatorError::Destination { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("writing the operations log")
                && message.contains("Nothing was changed"),
            "{message}"
        );
    }
    // Still prepared, still invisible.
    assert!(store.visible_records().is_empty());
    let staged = dest.staged().unwrap();
    assert!(staged
        .iter()
        .any(|s| s.transaction == h.transaction && s.is_prepared()));
}

#[test]
fn a_decision_carried_out_is_reported_even_when_its_outcome_cannot_be_logged() {
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let h = leftover(&store, &clock, &["a", "b", "c"]);
    // The request is logged; the outcome's entry fails.
    let mut dest = LogFails(store.destination(&sink_id()), 1);
    let decided = decide(&mut dest, &clock, &h.transaction, Decision::Commit).unwrap();
    assert_eq!(decided, Decided::Committed);
    assert_eq!(store.visible_records().len(), 3);
    let log = dest.operations().unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].what, "commit requested");
}

/// A hand commit whose outcome stays unknown tells the operator to run the
/// same command again (a commit is repeatable by id), not the job's advice
/// to restart from a checkpoint; nothing is lost, and the repeat commits.
#[test]
fn a_hand_commit_with_an_unknown_outcome_says_to_run_it_again() {
    use twopc_core::memory::{Fault, Operation};
    let (store, clock) = (MemoryStore::new(), TestClock::default());
    let h = leftover(&store, &clock, &["a", "b"]);
    let mut dest = store.destination(&sink_id());
    store.set_faults(|op, _| {
        if op == Operation::Commit {
            Fault::FailBefore
        } else {
            Fault::None
        }
    });
    let err = decide(&mut dest, &clock, &h.transaction, Decision::Commit).unwrap_err();
    assert!(matches!(err, OperatorError::Destination { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains(h.transaction.as_str()), "{message}");
    assert!(message.contains("Nothing is lost"), "{message}");
    assert!(message.contains("twopc decide ... --commit"), "{message}");
    assert!(
        !message.contains("restart from the latest checkpoint"),
        "{message}"
    );
    assert!(dest.lost_notes().unwrap().is_empty());
    assert!(store.visible_records().is_empty());
    store.clear_faults();
    let decided = decide(&mut dest, &clock, &h.transaction, Decision::Commit).unwrap();
    assert_eq!(decided, Decided::Committed);
    assert_eq!(store.visible_records().len(), 2);
}
