//! Races between an older attempt that lives on (a "zombie": a TaskManager
//! cut off from the JobManager that keeps running) and the attempt that
//! replaced it, both on the same bucket and sink id, against a local S3
//! server (moto, from `eval "$(bash scripts/s3.sh start)"`):
//!
//! * the zombie's clean-up (abort, expire, retract, listing, compaction)
//!   is refused once the newer attempt took the ownership lease over;
//! * a zombie's commit record PUT that lands after a retraction does not
//!   bring the retracted transaction back as committed;
//! * a commit that loses to an expiry says "expired", however the two
//!   interleave.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use twopc_core::destination::{
    AbortStatus, CommitStatus, CommittedTransaction, Destination, HistoryPolicy, OwnerClaim,
    Ownership,
};
use twopc_core::error::DestinationErrorKind;
use twopc_core::ids::{LineageId, RunId};
use twopc_objstore::faults::{RequestFaults, RequestInfo};
use twopc_objstore::names::{COMMITTED, EXPIRED, OWNERS, RETRACTED};
use twopc_objstore::{FaultAction, ObjectStoreDestination, S3Call};

fn claim(attempt: u32) -> OwnerClaim {
    OwnerClaim {
        sink: sink(),
        subtask: 0,
        run: RunId::new("run-a").unwrap(),
        attempt,
        instance: 1,
    }
}

/// [`claim`] as a Sink V2 committer makes it: another operator instance.
fn committer_claim(attempt: u32) -> OwnerClaim {
    OwnerClaim {
        instance: 2,
        ..claim(attempt)
    }
}

/// Opens another destination on the bucket `open` created.
fn reopen(o: &twopc_objstore::S3Options) -> ObjectStoreDestination {
    ObjectStoreDestination::open(o.clone(), &sink()).unwrap()
}

fn assert_fenced(result: Result<impl std::fmt::Debug, twopc_core::error::DestinationError>) {
    let err = match result {
        Ok(v) => panic!("the zombie's clean-up was let through: {v:?}"),
        Err(e) => e,
    };
    assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
    let text = err.to_string();
    for part in [
        "taken over by attempt 1 of run run-a",
        "attempt 0 of run run-a",
        "older attempt",
        "Nothing was changed",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
}

/// A newer attempt took the lease over (a failover does so at once); the
/// older one, still running, tries every clean-up call on the newer one's
/// prepared transaction. Every call is refused with nothing changed, and
/// the newer attempt commits its transaction.
#[test]
fn a_zombie_attempt_cannot_clean_up_after_a_newer_one_took_the_lease() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut zombie = open(&o);
    assert_eq!(
        zombie.claim_ownership(&claim(0)).unwrap(),
        Ownership::Acquired
    );
    let mut newer = reopen(&o);
    assert_eq!(
        newer.claim_ownership(&claim(1)).unwrap(),
        Ownership::Acquired
    );
    let recs = records(3, 10, 1);
    let h = stage(&mut newer, 1, 3, &recs);
    let txn = h.transaction.clone();

    let err = zombie.abort(&txn).unwrap_err();
    assert!(err.to_string().contains(txn.as_str()), "{err}");
    assert_fenced(zombie.abort(&txn));
    assert_fenced(zombie.expire(&txn, 1_700_000_000_000));
    assert_fenced(zombie.staged());
    assert_fenced(zombie.committed_after(LineageId(7), 0));
    assert_fenced(zombie.compact_history(&HistoryPolicy::default()));
    assert_fenced(zombie.retract(&CommittedTransaction {
        transaction: txn.clone(),
        lineage: LineageId(7),
        checkpoint: 3,
        subtask: 0,
        run: RunId::new("job1").unwrap(),
        records: 3,
        committed_at_ms: 1,
    }));
    assert!(names_in(&zombie, EXPIRED).is_empty());
    assert_eq!(uploads(&newer, 1).len(), 1, "the upload is untouched");

    assert_eq!(newer.commit(&h, 10).unwrap(), CommitStatus::Committed);
    assert_eq!(object(&newer, 1), Some(lines(&recs)));
    // The newer attempt's own clean-up passes its fence.
    assert!(newer.staged().unwrap().is_empty());
    drop(zombie); // its release must not undo the newer lease
    let mut third = reopen(&o);
    assert!(matches!(
        third.claim_ownership(&OwnerClaim {
            run: RunId::new("run-b").unwrap(),
            ..claim(0)
        }),
        Ok(Ownership::HeldBy(_))
    ));
}

/// The race itself: the zombie keeps running clean-up passes (list the
/// staged transactions, abort them all, as an attempt that believes they
/// linger) while the newer attempt takes the lease over, stages and
/// commits. Every commit of the newer attempt succeeds; the zombie is
/// refused at its first pass after the takeover.
#[test]
fn a_zombie_cleaning_up_in_a_loop_never_aborts_the_newer_attempts_transactions() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut zombie = open(&o);
    assert_eq!(
        zombie.claim_ownership(&claim(0)).unwrap(),
        Ownership::Acquired
    );
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let zombie_thread = std::thread::spawn(move || {
        let mut aborted = Vec::new();
        while !stop2.load(Ordering::SeqCst) {
            let staged = zombie.staged()?;
            for s in staged {
                if zombie.abort(&s.transaction)? == AbortStatus::Aborted {
                    aborted.push(s.transaction);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok::<_, twopc_core::error::DestinationError>(aborted)
    });
    std::thread::sleep(Duration::from_millis(100));
    let mut newer = reopen(&o);
    // The zombie's renewals may change the lease's ETag under the claim a
    // few times: a claim that kept losing is tried again.
    let mut claimed = None;
    for _ in 0..10 {
        match newer.claim_ownership(&claim(1)) {
            Ok(c) => {
                claimed = Some(c);
                break;
            }
            Err(e) => eprintln!("claim tried again: {e}"),
        }
    }
    assert_eq!(claimed, Some(Ownership::Acquired));
    // A pass of the zombie's that began before the takeover runs on the
    // fence of its start for up to a second (FENCE_REUSE_MS): the newer
    // attempt's records come after that, so that any abort of them needs
    // a fence taken after the takeover, whatever the machine's load.
    std::thread::sleep(Duration::from_millis(1_200));
    let handles: Vec<_> = (1..=4)
        .map(|seq| stage(&mut newer, seq, seq, &records(3, 10, seq as u8)))
        .collect();
    // Time for the zombie's passes to reach them.
    std::thread::sleep(Duration::from_millis(600));
    stop.store(true, Ordering::SeqCst);
    let zombie_end = zombie_thread.join().unwrap();
    for h in &handles {
        assert_eq!(
            newer.commit(h, 10).unwrap(),
            CommitStatus::Committed,
            "{} (the zombie ended with {zombie_end:?})",
            h.transaction
        );
    }
    match zombie_end {
        Err(e) => assert_eq!(e.kind, DestinationErrorKind::NotPermitted, "{e}"),
        Ok(aborted) => panic!("the zombie kept cleaning up; it aborted {aborted:?}"),
    }
}

/// The Sink V2 committer claims no lease (its writer does, through a
/// destination of its own). Told which attempt it works for, a committer
/// of the older attempt is refused once the newer attempt's writer holds
/// the share; the newer attempt's committer cleans up as before.
#[test]
fn a_zombie_committer_without_a_lease_is_refused_once_a_newer_writer_holds_the_share() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut old_writer = open(&o);
    assert_eq!(
        old_writer.claim_ownership(&claim(0)).unwrap(),
        Ownership::Acquired
    );
    let leftover = stage(&mut old_writer, 9, 2, &records(2, 10, 9));
    let mut old_committer = reopen(&o);
    // As in Flink, the committer's operator instance differs from its
    // writer's (the Sink V2 writer mixes its operator's id into it).
    old_committer.watch_ownership(committer_claim(0));
    // While its attempt holds the share, it cleans up.
    assert_eq!(old_committer.staged().unwrap().len(), 1);

    let mut new_writer = reopen(&o);
    assert_eq!(
        new_writer.claim_ownership(&claim(1)).unwrap(),
        Ownership::Acquired
    );
    let recs = records(3, 10, 1);
    let h = stage(&mut new_writer, 1, 3, &recs);
    let txn = h.transaction.clone();
    // Its next pass: the look of the pass above covers only the moment
    // after it (one check per pass, FENCE_REUSE_MS).
    std::thread::sleep(Duration::from_millis(1_100));
    for refused in [
        old_committer.abort(&txn).map(|_| ()),
        old_committer.expire(&txn, 1_700_000_000_000),
        old_committer.staged().map(|_| ()),
        old_committer
            .compact_history(&HistoryPolicy::default())
            .map(|_| ()),
    ] {
        let err = refused.expect_err("the old committer's clean-up was let through");
        assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
        let text = err.to_string();
        for part in [
            "held by attempt 1 of run run-a",
            "works for attempt 0 of run run-a",
            "Nothing was changed",
        ] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
    }
    assert_eq!(uploads(&new_writer, 1).len(), 1, "the upload is untouched");

    let mut new_committer = reopen(&o);
    new_committer.watch_ownership(committer_claim(1));
    assert_eq!(new_committer.staged().unwrap().len(), 2);
    assert_eq!(
        new_committer.abort(&leftover.transaction).unwrap(),
        AbortStatus::Aborted
    );
    assert_eq!(
        new_committer.commit(&h, 10).unwrap(),
        CommitStatus::Committed
    );
    assert_eq!(object(&new_writer, 1), Some(lines(&recs)));
}

/// Records `(call, path)` of every request.
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<(S3Call, String)>>);

impl RequestFaults for Recorder {
    fn decide(&self, r: &RequestInfo) -> FaultAction {
        // Never panics: it also runs in the drop of a destination while a
        // failed assertion unwinds.
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((r.call, r.path.clone()));
        FaultAction::Proceed
    }
}

/// A clean-up pass of the holder (the listing and the aborts after it)
/// renews its lease once, not once per transaction.
#[test]
fn a_clean_up_pass_renews_the_lease_once() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut writer = open(&o);
    for seq in 1..=3 {
        stage(&mut writer, seq, seq, &records(2, 10, seq as u8));
    }
    let recorder = Arc::new(Recorder::default());
    let mut d =
        ObjectStoreDestination::open_with_faults(o.clone(), &sink(), recorder.clone()).unwrap();
    assert_eq!(d.claim_ownership(&claim(0)).unwrap(), Ownership::Acquired);
    recorder.0.lock().unwrap().clear();
    let started = std::time::Instant::now();
    let staged = d.staged().unwrap();
    assert_eq!(staged.len(), 3);
    for s in &staged {
        assert_eq!(d.abort(&s.transaction).unwrap(), AbortStatus::Aborted);
    }
    let owners = format!("/{OWNERS}/");
    let seen: Vec<(S3Call, String)> = std::mem::take(&mut *recorder.0.lock().unwrap());
    let renewals = seen
        .iter()
        .filter(|(c, p)| *c == S3Call::PutObject && p.contains(&owners))
        .count();
    // One renewal covers the next second of the pass (FENCE_REUSE_MS): on
    // a loaded machine a pass that takes longer renews once more a second.
    let seconds = started.elapsed().as_millis() as usize / 1_000;
    assert!(
        renewals >= 1 && renewals <= 1 + seconds,
        "{renewals} renewals in {seconds} s: {seen:?}"
    );
}

/// Picks the request a [`Gate`] holds (it may keep state of its own).
type Picker = Box<dyn FnMut(&RequestInfo) -> bool + Send>;

/// Holds this destination's first request that `when` picks until
/// released, and tells the test that it arrived: one actor's request held
/// in flight while the other acts.
struct Gate {
    when: Mutex<Picker>,
    used: AtomicBool,
    arrived: (Mutex<bool>, Condvar),
    released: (Mutex<bool>, Condvar),
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gate")
    }
}

impl Gate {
    fn new(when: impl FnMut(&RequestInfo) -> bool + Send + 'static) -> Arc<Gate> {
        Arc::new(Gate {
            when: Mutex::new(Box::new(when)),
            used: AtomicBool::new(false),
            arrived: (Mutex::new(false), Condvar::new()),
            released: (Mutex::new(false), Condvar::new()),
        })
    }

    fn wait_arrived(&self) {
        let (m, c) = &self.arrived;
        let guard = m.lock().unwrap();
        let (guard, timeout) = c
            .wait_timeout_while(guard, Duration::from_secs(60), |a| !*a)
            .unwrap();
        assert!(
            *guard && !timeout.timed_out(),
            "the held request never came"
        );
    }

    fn release(&self) {
        let (m, c) = &self.released;
        *m.lock().unwrap() = true;
        c.notify_all();
    }
}

impl RequestFaults for Gate {
    fn decide(&self, r: &RequestInfo) -> FaultAction {
        if self.used.load(Ordering::SeqCst) || !(self.when.lock().unwrap())(r) {
            return FaultAction::Proceed;
        }
        self.used.store(true, Ordering::SeqCst);
        {
            let (m, c) = &self.arrived;
            *m.lock().unwrap() = true;
            c.notify_all();
        }
        let (m, c) = &self.released;
        let guard = m.lock().unwrap();
        drop(
            c.wait_timeout_while(guard, Duration::from_secs(60), |r| !*r)
                .unwrap(),
        );
        FaultAction::Proceed
    }
}

/// The zombie's commit completed the upload and its commit record PUT is
/// still in flight; meanwhile the newer attempt restored an earlier
/// checkpoint, found the completion (recording it), and retracted it
/// under REPLACE_RANGE. The late PUT then lands: the transaction must not
/// come back as committed. The commit answers Missing with the
/// retraction as evidence, and neither its record nor its object is left.
#[test]
fn a_late_commit_record_after_a_retraction_does_not_bring_the_transaction_back() {
    let endpoint = server!();
    let o = options(&endpoint);
    let committed_area = format!("/{COMMITTED}/");
    let gate = Gate::new(move |r| r.call == S3Call::PutObject && r.path.contains(&committed_area));
    let mut zombie =
        ObjectStoreDestination::open_with_faults(o.clone(), &sink(), gate.clone()).unwrap();
    zombie.block_on(zombie.api().create_bucket()).unwrap();
    let recs = records(3, 10, 4);
    let h = stage(&mut zombie, 1, 5, &recs);
    let h2 = h.clone();
    let zombie_commit = std::thread::spawn(move || {
        let answer = zombie.commit(&h2, 10);
        (answer, zombie)
    });
    gate.wait_arrived(); // completed; the record PUT is held

    let mut newer = reopen(&o);
    assert!(newer.staged().unwrap().is_empty());
    let after = newer.committed_after(LineageId(7), 4).unwrap();
    assert_eq!(after.len(), 1, "the completion was recorded: {after:?}");
    newer.retract(&after[0]).unwrap();
    assert_eq!(object(&newer, 1), None);
    assert_eq!(names_in(&newer, RETRACTED), vec![h.transaction.to_string()]);

    gate.release();
    let (answer, mut zombie) = zombie_commit.join().unwrap();
    match answer {
        Ok(CommitStatus::Missing { evidence }) => {
            assert!(evidence.contains("retracted"), "{evidence}")
        }
        other => panic!("the late commit answered {other:?}"),
    }
    assert_eq!(object(&newer, 1), None);
    assert!(names_in(&newer, COMMITTED).is_empty());
    assert!(newer.committed_after(LineageId(7), 4).unwrap().is_empty());
    // Repeated, the commit says the same.
    match zombie.commit(&h, 11).unwrap() {
        CommitStatus::Missing { evidence } => {
            assert!(evidence.contains("retracted"), "{evidence}")
        }
        other => panic!("{other:?}"),
    }
}

/// A retraction that wrote its tombstone and stopped before removing the
/// object and the record: a repeated commit of the transaction does not
/// answer "already committed"; it finishes the removal and answers
/// Missing.
#[test]
fn a_repeated_commit_after_an_interrupted_retraction_is_not_committed() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let recs = records(2, 10, 5);
    let h = stage(&mut d, 1, 5, &recs);
    assert_eq!(d.commit(&h, 10).unwrap(), CommitStatus::Committed);
    let tombstone = d.layout().control(RETRACTED, h.transaction.as_str());
    put_raw(&d, &tombstone, b"1700000000000");
    match d.commit(&h, 11).unwrap() {
        CommitStatus::Missing { evidence } => {
            assert!(evidence.contains("retracted at 2023-"), "{evidence}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(object(&d, 1), None);
    assert!(names_in(&d, COMMITTED).is_empty());
}

/// A commit that loses to an expiry between the expiry's abort of the
/// upload and the rest of it: the commit's evidence says the retention
/// cleanup removed it, not "removed outside twopc".
#[test]
fn a_commit_losing_to_an_expiry_in_flight_says_expired() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d = open(&o);
    let recs = records(3, 10, 6);
    let h = stage(&mut d, 1, 3, &recs);
    // Held at the look at the object that follows the abort of the
    // upload: the upload is gone, the expiry not finished.
    let mut aborted = false;
    let gate = Gate::new(move |r| {
        aborted |= r.call == S3Call::AbortUpload;
        aborted && r.call == S3Call::HeadObject
    });
    let mut expirer =
        ObjectStoreDestination::open_with_faults(o.clone(), &sink(), gate.clone()).unwrap();
    let txn = h.transaction.clone();
    let expiry = std::thread::spawn(move || expirer.expire(&txn, 1_700_000_000_000));
    gate.wait_arrived();
    assert!(uploads(&d, 1).is_empty(), "the upload was aborted");
    let answer = d.commit(&h, 10);
    gate.release();
    expiry.join().unwrap().unwrap();
    match answer {
        Ok(CommitStatus::Missing { evidence }) => {
            assert!(
                evidence.contains("Retention cleanup removed it"),
                "{evidence}"
            );
            assert!(!evidence.contains("outside twopc"), "{evidence}");
        }
        other => panic!("{other:?}"),
    }
}

/// An expiry that stopped between its tombstone and the abort (a crash)
/// leaves a tombstone beside a live upload: a commit of it still
/// succeeds. An expiry that finds the transaction committed removes its
/// own tombstone.
#[test]
fn an_expiry_tombstone_never_fails_a_commit_and_a_lost_expiry_takes_it_back() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let recs = records(2, 10, 7);
    let h = stage(&mut d, 1, 3, &recs);
    let tombstone = d.layout().control(EXPIRED, h.transaction.as_str());
    put_raw(&d, &tombstone, b"1700000000000");
    assert_eq!(d.commit(&h, 10).unwrap(), CommitStatus::Committed);
    assert_eq!(object(&d, 1), Some(lines(&recs)));

    let recs2 = records(2, 10, 8);
    let h2 = stage(&mut d, 2, 4, &recs2);
    assert_eq!(d.commit(&h2, 10).unwrap(), CommitStatus::Committed);
    d.expire(&h2.transaction, 1_700_000_000_000).unwrap();
    assert_eq!(object(&d, 2), Some(lines(&recs2)));
    assert_eq!(names_in(&d, EXPIRED), vec![h.transaction.to_string()]);
}

/// A lease object larger than any lease (hostile or misplaced) is refused
/// unread, with what to do, instead of being buffered whole.
#[test]
fn an_oversized_lease_object_is_refused_unread() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d = open(&o);
    let key = d.layout().control(OWNERS, "0");
    put_raw(&d, &key, &vec![b'x'; (1 << 20) + 1]);
    let err = d.claim_ownership(&claim(0)).unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Corrupt, "{err}");
    let text = err.to_string();
    for part in ["more than any lease", "Delete it", &key] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
}

/// Once armed: every PUT of a lease is answered 412 (as a resend whose
/// first try landed is), and every read of one 503, without sending them.
#[derive(Debug, Default)]
struct LeaseUnreadable {
    armed: AtomicBool,
}

impl RequestFaults for LeaseUnreadable {
    fn decide(&self, r: &RequestInfo) -> FaultAction {
        if !self.armed.load(Ordering::SeqCst) || !r.path.contains(&format!("/{OWNERS}/")) {
            return FaultAction::Proceed;
        }
        match r.call {
            S3Call::PutObject => FaultAction::AnswerStatus(
                412,
                "<Error><Code>PreconditionFailed</Code></Error>".to_string(),
            ),
            S3Call::GetObject => {
                FaultAction::AnswerStatus(503, "<Error><Code>SlowDown</Code></Error>".to_string())
            }
            _ => FaultAction::Proceed,
        }
    }
}

/// A renewal refused by its condition reads the lease back; when that read
/// fails (the store overloaded), nothing is known of a takeover: the call
/// fails as I/O (a retry may get past it), never as "fenced out", which
/// stopped the job blaming a takeover that did not happen.
#[test]
fn a_lease_that_cannot_be_read_back_is_not_taken_for_a_takeover() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut writer = open(&o);
    stage(&mut writer, 1, 1, &records(2, 10, 1));
    drop(writer);
    let faults = Arc::new(LeaseUnreadable::default());
    let mut d =
        ObjectStoreDestination::open_with_faults(o.clone(), &sink(), faults.clone()).unwrap();
    assert_eq!(d.claim_ownership(&claim(0)).unwrap(), Ownership::Acquired);
    // Past the time a renewal is reused for.
    std::thread::sleep(Duration::from_millis(1_100));
    faults.armed.store(true, Ordering::SeqCst);
    let err = d.staged().unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Io, "{err}");
    assert!(!err.message.contains("took it over"), "{err}");
    // The store answers again: the lease is still this writer's.
    faults.armed.store(false, Ordering::SeqCst);
    assert_eq!(d.staged().unwrap().len(), 1);
}
