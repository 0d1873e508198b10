//! The filesystem destination against a real directory: invisibility of
//! staged data, durable and repeatable commit, every interrupted state of a
//! commit, loss detection, retraction, expiry, ownership, lineages, and the
//! three I/O modes.

mod common;

use std::fs;

use common::*;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use twopc_core::destination::{
    AbortStatus, CommitStatus, Destination, LineageRecord, OwnerClaim, Ownership, StagedState,
};
use twopc_core::error::DestinationErrorKind;
use twopc_core::ids::{LineageId, RunId};
use twopc_fs::{CommitOrder, FsDestination, FsOptions, IoMode, IoStep, IoTiming, RecordFormat};

#[test]
fn staged_data_is_hidden_and_commit_publishes_one_file() {
    for mode in [IoMode::Auto, IoMode::Direct, IoMode::Buffered] {
        let t = TempDir::new("publish");
        let mut d = FsDestination::open(options(&t.0, mode), &sink()).unwrap();
        let h = stage(&mut d, 1, 3, &["a", "b"]);
        assert!(visible_files(&t.0).is_empty(), "{mode:?}");
        let staged = d.staged().unwrap();
        assert_eq!(staged.len(), 1);
        assert_eq!(staged[0].prepared(), Some(&h));

        assert!(d.last_visible_at().is_none(), "{mode:?}");
        let before = std::time::Instant::now();
        assert_eq!(d.commit(&h, 5).unwrap(), CommitStatus::Committed);
        // The commit says when its output became visible (the metric of
        // the commit's own latency), inside the call.
        let visible_at = d.last_visible_at().expect("a publishing commit tells");
        assert!(visible_at >= before && visible_at <= std::time::Instant::now());
        let files = visible_files(&t.0);
        assert_eq!(files, vec![format!("part-{}", h.transaction)]);
        assert_eq!(fs::read_to_string(t.0.join(&files[0])).unwrap(), "a\nb\n");
        assert!(d.staged().unwrap().is_empty());
        assert_eq!(d.commit(&h, 6).unwrap(), CommitStatus::AlreadyCommitted);
        assert_eq!(
            d.last_visible_at(),
            Some(visible_at),
            "nothing published again"
        );
        assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::NotFound);
        assert_eq!(fs::read_to_string(t.0.join(&files[0])).unwrap(), "a\nb\n");
    }
}

/// The durable steps of `d.commit(h)` as they happened: each rename and
/// write that must survive a power loss, and each directory sync.
fn durable_steps(
    d: &mut FsDestination,
    log: &StepLog,
    h: &twopc_core::handle::TransactionHandle,
    expected: CommitStatus,
) -> Vec<(IoStep, std::path::PathBuf)> {
    log.0.lock().unwrap().clear();
    assert_eq!(d.commit(h, 5).unwrap(), expected);
    log.0
        .lock()
        .unwrap()
        .iter()
        .filter(|(s, t, _)| {
            *t == IoTiming::Before
                && matches!(
                    s,
                    IoStep::DirSync | IoStep::Claim | IoStep::CommitRecord | IoStep::Publish
                )
        })
        .map(|(s, _, p)| (*s, p.clone()))
        .collect()
}

/// The control directories a first open creates are durable in their
/// parents before anything is written into them: a prepare syncs its own
/// files and the staging directory, never `staging/`'s parent. Found by
/// review.
#[test]
fn a_first_open_makes_each_directory_it_creates_durable_in_its_parent() {
    let t = TempDir::new("open-syncs");
    let log = Arc::new(StepLog::default());
    let d = FsDestination::open_with_faults(FsOptions::new(&t.0), &sink(), log.clone()).unwrap();
    let steps: Vec<(IoStep, std::path::PathBuf)> = log
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(s, t, _)| *t == IoTiming::Before && matches!(s, IoStep::Create | IoStep::DirSync))
        .map(|(s, _, p)| (*s, p.clone()))
        .collect();
    let created: Vec<&std::path::PathBuf> = steps
        .iter()
        .filter(|(s, _)| *s == IoStep::Create)
        .map(|(_, p)| p)
        .collect();
    assert!(created.contains(&&d.layout().staging), "{steps:?}");
    for (i, (step, path)) in steps.iter().enumerate() {
        if *step == IoStep::Create {
            assert_eq!(
                steps.get(i + 1),
                Some(&(IoStep::DirSync, path.parent().unwrap().to_path_buf())),
                "{path:?} is synced in its parent at once: {steps:?}"
            );
        }
    }
    drop(d);
    // A second open creates nothing and syncs nothing.
    log.0.lock().unwrap().clear();
    let _again =
        FsDestination::open_with_faults(FsOptions::new(&t.0), &sink(), log.clone()).unwrap();
    assert!(
        !log.0
            .lock()
            .unwrap()
            .iter()
            .any(|(s, _, _)| matches!(s, IoStep::DirSync)),
        "{:?}",
        log.0.lock().unwrap()
    );
}

/// Each step of a commit is durable before the next depends on it, since a
/// power loss keeps any subset of what was not synced: the claim (both
/// directories it changed, so that it cannot come back in `staging/`
/// beside a durable record where one sync does not cover both parents),
/// the commit record (its file within the record's step, then its
/// directory), the publication. Each sync is a flush of the device, which
/// waits behind the sink's own writes: this also pins their number.
#[test]
fn a_commit_makes_each_step_durable_before_the_next() {
    let t = TempDir::new("syncs");
    let log = Arc::new(StepLog::default());
    let mut d =
        FsDestination::open_with_faults(FsOptions::new(&t.0), &sink(), log.clone()).unwrap();
    let layout = d.layout();
    let h = stage(&mut d, 1, 3, &["a", "b"]);
    let steps = durable_steps(&mut d, &log, &h, CommitStatus::Committed);
    let record = layout.committed.join(twopc_fs::commit_record_name(
        LineageId(7),
        3,
        &h.transaction,
    ));
    let expected = [
        (
            IoStep::Claim,
            layout.committing.join(h.transaction.as_str()),
        ),
        (IoStep::DirSync, layout.committing.clone()),
        (IoStep::DirSync, layout.staging.clone()),
        (IoStep::CommitRecord, record.clone()),
        (IoStep::DirSync, layout.committed.clone()),
        (IoStep::Publish, part(&t.0, 1)),
        (IoStep::DirSync, t.0.clone()),
    ];
    assert_eq!(steps, expected);
    assert_eq!(fs::read_to_string(part(&t.0, 1)).unwrap(), "a\nb\n");

    // A repeated commit meets the record, which another commit may have
    // written a moment ago: durable before anything acts on it.
    let steps = durable_steps(&mut d, &log, &h, CommitStatus::AlreadyCommitted);
    assert_eq!(steps, [(IoStep::DirSync, layout.committed.clone())]);

    // A retraction writes its tombstone, then removes the output, then
    // whatever is left of a claim, then the record, each durable before the
    // next: a claim that came back without its record would be rolled
    // forward and found missing, and output gone without a tombstone would
    // read as removed by a reader after the commit.
    let committed = d.committed_after(LineageId(7), 0).unwrap();
    log.0.lock().unwrap().clear();
    d.retract(&committed[0]).unwrap();
    let synced = log.paths_of(IoStep::DirSync);
    let tombstone = synced
        .iter()
        .position(|p| p == &layout.sink_dir.join("retracted"))
        .expect("the tombstone's directory is synced");
    assert_eq!(
        synced[tombstone + 1..tombstone + 4],
        [
            t.0.clone(),
            layout.committing.clone(),
            layout.committed.clone()
        ]
    );
    assert!(!part(&t.0, 1).exists());
}

/// Visible first: the output is visible before any flush of the device
/// (the claim, then a hard link to its visible name); then the claim, the
/// record and the link are made durable, each before the next depends on
/// it, and the staged name goes before the claim does.
#[test]
fn a_visible_first_commit_shows_its_output_before_any_flush() {
    let t = TempDir::new("visible-first");
    let log = Arc::new(StepLog::default());
    let mut d = FsDestination::open_with_faults(visible_first(&t.0), &sink(), log.clone()).unwrap();
    let layout = d.layout();
    let h = stage(&mut d, 1, 3, &["a", "b"]);
    let steps = durable_steps(&mut d, &log, &h, CommitStatus::Committed);
    let record = layout.committed.join(twopc_fs::commit_record_name(
        LineageId(7),
        3,
        &h.transaction,
    ));
    let claimed = layout.committing.join(h.transaction.as_str());
    let expected = [
        (IoStep::Claim, claimed.clone()),
        (IoStep::Publish, part(&t.0, 1)),
        (IoStep::DirSync, layout.committing.clone()),
        (IoStep::DirSync, layout.staging.clone()),
        (IoStep::CommitRecord, record.clone()),
        (IoStep::DirSync, layout.committed.clone()),
        (IoStep::DirSync, t.0.clone()),
    ];
    assert_eq!(steps, expected);
    // The staged name went before the claim: the only name left is the
    // visible one.
    let removed = log.paths_of(IoStep::Remove);
    assert_eq!(removed.first(), Some(&claimed.join("data")), "{removed:?}");
    assert_eq!(fs::read_to_string(part(&t.0, 1)).unwrap(), "a\nb\n");
    assert_eq!(fs::metadata(part(&t.0, 1)).unwrap().nlink(), 1);
    assert!(!claimed.exists());
    assert!(d.staged().unwrap().is_empty());
    assert_eq!(d.commit(&h, 6).unwrap(), CommitStatus::AlreadyCommitted);
}

/// Fails the first directory sync of one directory, once.
struct FailSyncOf(std::path::PathBuf, std::sync::atomic::AtomicBool);

impl twopc_fs::IoFaults for FailSyncOf {
    fn inject(
        &self,
        step: IoStep,
        timing: IoTiming,
        path: &std::path::Path,
    ) -> Option<std::io::Error> {
        (step == IoStep::DirSync
            && timing == IoTiming::Before
            && path == self.0
            && !self.1.swap(true, std::sync::atomic::Ordering::SeqCst))
        .then(|| std::io::Error::from_raw_os_error(5))
    }
}

/// A visible-first commit that fails after its output became visible (a
/// sync of the claim, or of the output directory, fails): its retry
/// finishes it, the output once and whole, and nothing is aborted.
#[test]
fn a_visible_first_commit_failing_after_its_link_is_finished_by_its_retry() {
    for which in ["committing", "output"] {
        let t = TempDir::new("vf-sync-fails");
        let layout = twopc_fs::Layout::new(&t.0, &sink());
        let target = if which == "committing" {
            layout.committing.clone()
        } else {
            t.0.clone()
        };
        // Opened once without faults: the first open syncs the directories
        // it creates.
        drop(FsDestination::open(visible_first(&t.0), &sink()).unwrap());
        let faults = Arc::new(FailSyncOf(target, Default::default()));
        let mut d = FsDestination::open_with_faults(visible_first(&t.0), &sink(), faults).unwrap();
        let h = stage(&mut d, 1, 3, &["a", "b"]);
        let err = d.commit(&h, 5).unwrap_err();
        assert!(err.message.contains("syncing directory"), "{which}: {err}");
        // Visible already, and a decided commit: never aborted.
        assert_eq!(
            fs::read_to_string(part(&t.0, 1)).unwrap(),
            "a\nb\n",
            "{which}"
        );
        assert_eq!(
            d.abort(&h.transaction).unwrap(),
            AbortStatus::WasCommitted,
            "{which}"
        );
        let expected = if which == "committing" {
            CommitStatus::Committed
        } else {
            CommitStatus::AlreadyCommitted
        };
        let visible_at = d.last_visible_at().expect("the first attempt linked it");
        assert_eq!(d.commit(&h, 6).unwrap(), expected, "{which}");
        // The retry found it visible: the time it became visible stays the
        // first attempt's.
        assert_eq!(d.last_visible_at(), Some(visible_at), "{which}");
        assert_eq!(visible_files(&t.0), vec![format!("part-{}", h.transaction)]);
        assert_eq!(
            fs::read_to_string(part(&t.0, 1)).unwrap(),
            "a\nb\n",
            "{which}"
        );
        assert_eq!(fs::metadata(part(&t.0, 1)).unwrap().nlink(), 1, "{which}");
        assert!(d.staged().unwrap().is_empty(), "{which}");
    }
}

/// A step log on a file system without hard links.
#[derive(Default)]
struct NoHardLinks(StepLog);

impl twopc_fs::IoFaults for NoHardLinks {
    fn inject(
        &self,
        step: IoStep,
        timing: IoTiming,
        path: &std::path::Path,
    ) -> Option<std::io::Error> {
        self.0.inject(step, timing, path)
    }

    fn lacks_hard_links(&self) -> bool {
        true
    }
}

/// Without hard links the output cannot be visible before the commit is
/// durable and keep its staged name: a visible-first sink there commits
/// durable-first (the record, then a rename publishes it).
#[test]
fn without_hard_links_a_commit_publishes_by_a_rename_after_its_record() {
    let t = TempDir::new("no-links");
    let faults = Arc::new(NoHardLinks::default());
    let mut d =
        FsDestination::open_with_faults(visible_first(&t.0), &sink(), faults.clone()).unwrap();
    let h = stage(&mut d, 1, 3, &["a", "b"]);
    let steps = durable_steps(&mut d, &faults.0, &h, CommitStatus::Committed);
    let kinds: Vec<IoStep> = steps.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        kinds,
        [
            IoStep::Claim,
            IoStep::DirSync,
            IoStep::DirSync,
            IoStep::CommitRecord,
            IoStep::DirSync,
            IoStep::Publish,
            IoStep::DirSync
        ],
        "{steps:?}"
    );
    assert_eq!(steps[5].1, part(&t.0, 1));
    assert_eq!(fs::read_to_string(part(&t.0, 1)).unwrap(), "a\nb\n");
    assert_eq!(fs::metadata(part(&t.0, 1)).unwrap().nlink(), 1);
    assert!(d.staged().unwrap().is_empty());
    assert_eq!(d.commit(&h, 6).unwrap(), CommitStatus::AlreadyCommitted);
}

/// A commit that meets another commit's claim (a retry racing its first
/// attempt, which has renamed but not yet synced) makes the claim durable
/// before writing a record that depends on it.
#[test]
fn a_commit_that_meets_a_claim_makes_it_durable_before_its_record() {
    let t = TempDir::new("claimed");
    let log = Arc::new(StepLog::default());
    let mut d =
        FsDestination::open_with_faults(FsOptions::new(&t.0), &sink(), log.clone()).unwrap();
    let layout = d.layout();
    let h = stage(&mut d, 1, 3, &["a"]);
    fs::rename(
        layout.staging_dir(&h.transaction),
        layout.committing.join(h.transaction.as_str()),
    )
    .unwrap();
    let steps = durable_steps(&mut d, &log, &h, CommitStatus::Committed);
    let kinds: Vec<IoStep> = steps.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        kinds,
        [
            IoStep::DirSync,
            IoStep::DirSync,
            IoStep::CommitRecord,
            IoStep::DirSync,
            IoStep::Publish,
            IoStep::DirSync
        ],
        "{steps:?}"
    );
    assert_eq!(steps[0].1, layout.committing);
    assert_eq!(steps[1].1, layout.staging);
    assert_eq!(fs::read_to_string(part(&t.0, 1)).unwrap(), "a\n");
}

/// The states a crash can leave a commit in, rebuilt by hand from a
/// prepared transaction: claimed only; claimed and linked to its visible
/// name; the link kept but the claim lost (a power loss: the claim is
/// synced after the link); claimed, linked and recorded; recorded, with the
/// staged name gone, but not cleaned up.
#[test]
fn every_interrupted_commit_is_finished_by_the_next_commit_and_never_aborted() {
    // The leftovers of either order are finished by either (a sink's order
    // may change between two runs).
    for order in ["durable-first", "visible-first"] {
        for stop_after in ["claim", "link", "link-unclaimed", "record", "publish"] {
            interrupted_commit_is_finished(order, stop_after);
        }
    }
}

fn interrupted_commit_is_finished(order: &str, stop_after: &str) {
    let case = format!("{order}, stopped after {stop_after}");
    let t = TempDir::new("interrupted");
    let (_, options) = commit_orders(&t.0)
        .into_iter()
        .find(|(o, _)| *o == order)
        .unwrap();
    let mut d = FsDestination::open(options, &sink()).unwrap();
    let h = stage(&mut d, 1, 3, &["x"]);
    let layout = d.layout();
    let saved = t.0.join("saved");
    copy_dir(&layout.staging_dir(&h.transaction), &saved);
    assert_eq!(d.commit(&h, 5).unwrap(), CommitStatus::Committed);
    let claimed = layout.committing.join(h.transaction.as_str());
    let record = layout.committed.join(twopc_fs::commit_record_name(
        LineageId(7),
        3,
        &h.transaction,
    ));
    let visible = part(&t.0, 1);
    // Put the state back.
    let unclaimed = stop_after == "link-unclaimed";
    let txn_dir = if unclaimed {
        layout.staging_dir(&h.transaction)
    } else {
        claimed.clone()
    };
    copy_dir(&saved, &txn_dir);
    let relink = || {
        fs::remove_file(&visible).unwrap();
        fs::hard_link(txn_dir.join("data"), &visible).unwrap();
    };
    match stop_after {
        "claim" => {
            fs::remove_file(&record).unwrap();
            fs::remove_file(&visible).unwrap();
        }
        "link" | "link-unclaimed" => {
            fs::remove_file(&record).unwrap();
            relink();
        }
        "record" => relink(),
        _ => fs::remove_file(claimed.join("data")).unwrap(),
    }

    // It is reported as a decided commit, and nothing aborts it.
    let staged = d.staged().unwrap();
    assert!(
        matches!(&staged[..], [s] if matches!(s.state, StagedState::Committing(_))),
        "{case}: {staged:?}"
    );
    assert_eq!(
        d.abort(&h.transaction).unwrap(),
        AbortStatus::WasCommitted,
        "{case}"
    );
    if unclaimed {
        // Its output is visible: an expiry refuses, naming it.
        let e = d.expire(&h.transaction, 99).unwrap_err();
        assert!(e.message.contains("is published"), "{case}: {e}");
    } else {
        d.expire(&h.transaction, 99).unwrap();
    }
    assert!(txn_dir.exists(), "{case}: expiry never removes it");
    if stop_after != "claim" {
        assert_eq!(fs::read_to_string(&visible).unwrap(), "x\n", "{case}");
    }

    let expected = if matches!(stop_after, "claim" | "link" | "link-unclaimed") {
        CommitStatus::Committed
    } else {
        CommitStatus::AlreadyCommitted
    };
    assert_eq!(d.commit(&h, 6).unwrap(), expected, "{case}");
    assert_eq!(fs::read_to_string(&visible).unwrap(), "x\n", "{case}");
    assert_eq!(fs::metadata(&visible).unwrap().nlink(), 1, "{case}");
    assert!(record.exists(), "{case}");
    assert!(!txn_dir.exists(), "{case}");
    assert!(d.staged().unwrap().is_empty(), "{case}");
}

/// A commit interrupted after its record, whose claimed data was then
/// truncated: the retry reports it missing and does not publish it. Before,
/// the short file was made visible and only then found wrong.
#[test]
fn claimed_data_changed_after_the_record_is_never_published() {
    let t = TempDir::new("claimed-short");
    let (mut d, faults) = faulty_with(FsOptions::new(&t.0));
    let h = stage(&mut d, 1, 3, &["x", "y"]);
    faults.arm(IoStep::Publish, IoTiming::Before, 5);
    d.commit(&h, 5).unwrap_err();
    assert!(faults.fired());
    let claimed = d
        .layout()
        .committing
        .join(h.transaction.as_str())
        .join("data");
    fs::write(&claimed, "x\n").unwrap();
    match d.commit(&h, 6).unwrap() {
        CommitStatus::Missing { evidence } => {
            assert!(evidence.contains("was not published"), "{evidence}");
            assert!(evidence.contains("with 4 bytes"), "{evidence}");
        }
        other => panic!("{other:?}"),
    }
    assert!(visible_files(&t.0).is_empty(), "{:?}", visible_files(&t.0));
}

/// Fails the first step the predicate picks, with `errno`.
struct FailFirst<F> {
    errno: i32,
    picks: F,
    fired: std::sync::atomic::AtomicBool,
}

impl<F: Fn(IoStep, IoTiming, &std::path::Path) -> bool> FailFirst<F> {
    fn new(errno: i32, picks: F) -> Arc<Self> {
        Arc::new(FailFirst {
            errno,
            picks,
            fired: Default::default(),
        })
    }
}

impl<F> twopc_fs::IoFaults for FailFirst<F>
where
    F: Fn(IoStep, IoTiming, &std::path::Path) -> bool + Send + Sync,
{
    fn inject(
        &self,
        step: IoStep,
        timing: IoTiming,
        path: &std::path::Path,
    ) -> Option<std::io::Error> {
        ((self.picks)(step, timing, path)
            && !self.fired.swap(true, std::sync::atomic::Ordering::SeqCst))
        .then(|| std::io::Error::from_raw_os_error(self.errno))
    }
}

/// An error of the moment while a transaction's directory is opened (too
/// many open files, a failing device, a stale NFS handle) is reported as
/// the I/O error it is, which a restart may get past, not as damaged
/// control data (which stops the job for good); the next look succeeds.
#[test]
fn a_passing_error_opening_a_transaction_directory_is_not_corruption() {
    for errno in [
        24,  /* EMFILE */
        5,   /* EIO */
        116, /* ESTALE */
    ] {
        let t = TempDir::new("open-emfile");
        let h = stage(&mut dest(&t.0), 1, 3, &["x"]);
        // The first opening of the transaction's directory in staging/.
        let name = h.transaction.as_str().to_string();
        let faults = FailFirst::new(errno, move |step, timing, path: &std::path::Path| {
            step == IoStep::Read
                && timing == IoTiming::Before
                && path.file_name().is_some_and(|n| n == name.as_str())
                && path.parent().is_some_and(|p| p.ends_with("staging"))
        });
        let mut d =
            FsDestination::open_with_faults(FsOptions::new(&t.0), &sink(), faults.clone()).unwrap();
        let e = d.staged().unwrap_err();
        assert_eq!(e.kind, DestinationErrorKind::Io, "errno {errno}: {e}");
        assert!(!e.message.contains("not a directory of twopc"), "{e}");
        let staged = d.staged().unwrap();
        assert_eq!(staged.len(), 1, "errno {errno}: {staged:?}");
        assert_eq!(d.commit(&h, 5).unwrap(), CommitStatus::Committed);
    }
}

/// A reader that consumes output by deleting (or moving) it took a
/// committed file, and the checkpoint that holds the transaction is
/// restored (a failover): its commit is repeated and must succeed, as any
/// repeated commit does. Before, it answered LOST and the job stopped at
/// every failover.
#[test]
fn output_a_reader_removed_after_the_commit_does_not_make_a_repeated_commit_lost() {
    for order in [CommitOrder::DurableFirst, CommitOrder::VisibleFirst] {
        let t = TempDir::new("gone");
        let mut d = FsDestination::open(
            FsOptions {
                commit_order: order,
                ..FsOptions::new(&t.0)
            },
            &sink(),
        )
        .unwrap();
        let h = stage(&mut d, 1, 3, &["x"]);
        d.commit(&h, 5).unwrap();
        fs::remove_file(part(&t.0, 1)).unwrap();
        assert_eq!(
            d.commit(&h, 6).unwrap(),
            CommitStatus::AlreadyCommitted,
            "{order:?}"
        );
        assert!(visible_files(&t.0).is_empty(), "nothing is shown again");
    }
}

/// A retraction (a rewind under REPLACE_RANGE, `twopc reconcile`) removed
/// the output and was interrupted before the commit record went: a commit
/// of the transaction then is missing, saying it was retracted, never
/// "already committed" (the records are gone from the output and a replay
/// writes them again). After the retraction is repeated, the same.
#[test]
fn an_interrupted_retraction_is_told_apart_from_a_reader_removing_output() {
    let t = TempDir::new("retract-cut");
    // The first removal of a file in committed/ (a commit record).
    let faults = FailFirst::new(5, |step, timing, path: &std::path::Path| {
        step == IoStep::Remove
            && timing == IoTiming::Before
            && path.parent().is_some_and(|p| p.ends_with("committed"))
    });
    let mut d =
        FsDestination::open_with_faults(FsOptions::new(&t.0), &sink(), faults.clone()).unwrap();
    let h = stage(&mut d, 1, 3, &["x"]);
    d.commit(&h, 5).unwrap();
    let later = d.committed_after(LineageId(7), 2).unwrap();
    assert_eq!(later.len(), 1);
    d.retract(&later[0]).unwrap_err();
    assert!(!part(&t.0, 1).exists(), "the output went first");
    for round in ["interrupted", "finished"] {
        match d.commit(&h, 6).unwrap() {
            CommitStatus::Missing { evidence } => {
                assert!(evidence.contains("retracted at"), "{round}: {evidence}")
            }
            other => panic!("{round}: {other:?}"),
        }
        d.retract(&later[0]).unwrap();
    }
    assert!(visible_files(&t.0).is_empty());
}

/// A commit interrupted right after its publication (before its claim
/// went), whose output a reader then consumed by deleting it: the restore's
/// repeated commit answers "already committed", not LOST (found by a
/// second review).
#[test]
fn output_consumed_after_an_interrupted_publication_is_already_committed() {
    let t = TempDir::new("published-consumed");
    let (mut d, faults) = faulty_with(FsOptions::new(&t.0));
    let h = stage(&mut d, 1, 3, &["x"]);
    faults.arm(IoStep::Publish, IoTiming::After, 5);
    d.commit(&h, 5).unwrap_err();
    assert!(faults.fired());
    assert!(d.layout().committing.join(h.transaction.as_str()).exists());
    fs::remove_file(part(&t.0, 1)).unwrap();
    assert_eq!(d.commit(&h, 6).unwrap(), CommitStatus::AlreadyCommitted);
    assert!(visible_files(&t.0).is_empty(), "nothing is shown again");
}

#[test]
fn a_commit_record_whose_output_was_truncated_or_replaced_is_never_already_committed() {
    for (name, content) in [("truncated", ""), ("replaced", "a longer file\n")] {
        let t = TempDir::new(name);
        let mut d = dest(&t.0);
        let h = stage(&mut d, 1, 3, &["x", "y"]);
        d.commit(&h, 5).unwrap();
        fs::write(part(&t.0, 1), content).unwrap();
        match d.commit(&h, 6).unwrap() {
            CommitStatus::Missing { evidence } => {
                assert!(
                    evidence.contains("truncated or replaced"),
                    "{name}: {evidence}"
                );
                assert!(evidence.contains("with 4 bytes"), "{name}: {evidence}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn missing_staged_data_is_reported_with_its_cause() {
    let t = TempDir::new("missing");
    let mut d = dest(&t.0);
    let removed = stage(&mut d, 1, 3, &["x"]);
    fs::remove_dir_all(d.layout().staging_dir(&removed.transaction)).unwrap();
    match d.commit(&removed, 5).unwrap() {
        CommitStatus::Missing { evidence } => {
            assert!(evidence.contains("outside twopc"), "{evidence}")
        }
        other => panic!("{other:?}"),
    }

    let expired = stage(&mut d, 2, 4, &["y"]);
    d.expire(&expired.transaction, 1234).unwrap();
    match d.commit(&expired, 5).unwrap() {
        CommitStatus::Missing { evidence } => {
            assert!(
                evidence.contains("retention") && evidence.contains("1970-01-01 00:00:01 UTC"),
                "{evidence}"
            )
        }
        other => panic!("{other:?}"),
    }

    let truncated = stage(&mut d, 3, 5, &["hello world"]);
    let data = d.layout().staging_dir(&truncated.transaction).join("data");
    fs::write(&data, "hello").unwrap();
    match d.commit(&truncated, 5).unwrap() {
        CommitStatus::Missing { evidence } => assert!(evidence.contains("truncated"), "{evidence}"),
        other => panic!("{other:?}"),
    }
    assert!(
        visible_files(&t.0).is_empty(),
        "nothing damaged was published"
    );
}

/// Something foreign inside a trash entry (a file whose name is not
/// UTF-8, which the removal refuses to touch) used to fail every open of
/// the sink, for good: the removal of trash decides nothing, so it is now
/// reported and left.
#[test]
fn a_trash_entry_that_cannot_be_removed_does_not_block_the_open() {
    use std::os::unix::ffi::OsStrExt;
    let t = TempDir::new("hostile-trash");
    let d = dest(&t.0);
    let entry = d
        .layout()
        .trash
        .join(format!("{}.00000000000000ab", txn(9)));
    drop(d);
    fs::create_dir_all(&entry).unwrap();
    fs::write(entry.join(std::ffi::OsStr::from_bytes(b"bad\xff")), b"x").unwrap();
    let mut d = dest(&t.0);
    assert!(entry.exists(), "left for an operator");
    // The sink works as ever.
    let h = stage(&mut d, 1, 3, &["x"]);
    assert_eq!(d.commit(&h, 4).unwrap(), CommitStatus::Committed);
}

#[test]
fn abort_is_repeatable() {
    let t = TempDir::new("abort");
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 3, &["x"]);
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::Aborted);
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::NotFound);
    assert!(d.staged().unwrap().is_empty());
    assert!(
        fs::read_dir(d.layout().trash).unwrap().next().is_none(),
        "an abort leaves nothing in the trash"
    );
    // An open transaction that was written to is aborted as well.
    write(&mut d, 2, &["z"]).unwrap();
    assert_eq!(d.staged().unwrap()[0].state, StagedState::Open);
    assert_eq!(d.abort(&txn(2)).unwrap(), AbortStatus::Aborted);
}

#[test]
fn prepare_refuses_a_handle_that_does_not_count_what_was_staged() {
    let t = TempDir::new("counts");
    let mut d = dest(&t.0);
    write(&mut d, 1, &["a", "b"]).unwrap();
    // The handle counts one more record than reached the file.
    let wrong = handle(1, Some(1), &["a", "b", "c"]);
    let err = d.prepare(&wrong).unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Corrupt, "{err}");
    assert!(err.message.contains("it is not prepared"), "{err}");
    assert_eq!(d.staged().unwrap()[0].state, StagedState::Open);
    // A second prepare of the same transaction finds nothing open: the
    // staged data of a failed prepare is never prepared later.
    let err = d.prepare(&handle(1, Some(2), &["a", "b"])).unwrap_err();
    assert!(err.message.contains("not open in this writer"), "{err}");
    assert_eq!(d.abort(&txn(1)).unwrap(), AbortStatus::Aborted);
}

#[test]
fn a_record_with_a_line_break_is_refused_in_lines_format_with_its_position() {
    let t = TempDir::new("lines");
    let mut d = dest(&t.0);
    let open = handle(1, None, &[]);
    d.begin(&open).unwrap();
    let buf = batch(&["ok", "fine", "two\nlines", "never written"]);
    let err = d.write(&open.transaction, buf.batch()).unwrap_err();
    let fault = err.record.as_ref().expect("a record fault");
    assert_eq!(
        fault.position,
        twopc_core::error::RecordPosition::InBatch(2)
    );
    assert!(fault.reason.contains("line break"), "{}", fault.reason);
    // RAW is offered only with what it does: Flink's formats end a row
    // with no separator, so following the advice blindly glued rows
    // together (found by review).
    assert!(
        fault.reason.contains("no separator at all"),
        "{}",
        fault.reason
    );
    assert_eq!(fault.preview, "two\\nlines");
    assert!(
        d.staged().unwrap().is_empty(),
        "nothing of the batch was staged"
    );
    // RAW format takes any bytes.
    let raw = FsOptions {
        format: RecordFormat::Raw,
        ..FsOptions::new(&t.0)
    };
    let mut d = FsDestination::open(raw, &sink()).unwrap();
    d.write(&open.transaction, buf.batch()).unwrap();
}

#[test]
fn committed_after_and_retract_work_per_lineage() {
    let t = TempDir::new("retract");
    let mut d = dest(&t.0);
    let h1 = stage(&mut d, 1, 1, &["one"]);
    let h2 = stage(&mut d, 2, 2, &["two"]);
    d.commit(&h1, 1).unwrap();
    d.commit(&h2, 2).unwrap();
    let later = d.committed_after(LineageId(7), 1).unwrap();
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].transaction, h2.transaction);
    assert!(d.committed_after(LineageId(8), 0).unwrap().is_empty());
    d.retract(&later[0]).unwrap();
    d.retract(&later[0]).unwrap();
    assert_eq!(
        visible_files(&t.0),
        vec![format!("part-{}", h1.transaction)]
    );
    assert!(d.committed_after(LineageId(7), 1).unwrap().is_empty());
}

#[test]
fn lineages_are_summarised_and_recorded() {
    let t = TempDir::new("lineages");
    let mut d = dest(&t.0);
    assert!(d.lineages().unwrap().is_empty());
    let h1 = stage(&mut d, 1, 4, &["one"]);
    let h2 = stage(&mut d, 2, 5, &["two"]);
    d.commit(&h1, 1).unwrap();
    d.commit(&h2, 2).unwrap();
    let record = LineageRecord {
        lineage: LineageId(7),
        run: RunId::new("job1").unwrap(),
        started_at_ms: 42,
        appended: true,
    };
    d.record_lineage(&record).unwrap();
    // Repeatable; the first record stays.
    d.record_lineage(&LineageRecord {
        appended: false,
        ..record.clone()
    })
    .unwrap();
    let l = d.lineages().unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].lineage, LineageId(7));
    assert_eq!(l[0].committed, 2);
    assert_eq!(l[0].last_checkpoint, Some(5));
    assert_eq!(l[0].last_transactions, vec![h2.transaction.clone()]);
    assert_eq!(l[0].runs, vec![RunId::new("job1").unwrap()]);
    assert_eq!(l[0].record.as_ref(), Some(&record));
}

#[test]
fn ownership_is_exclusive_per_subtask_and_released_on_drop() {
    let t = TempDir::new("owner");
    let claim = |run: &str, subtask, attempt| OwnerClaim {
        sink: sink(),
        subtask,
        run: RunId::new(run).unwrap(),
        attempt,
        instance: 0xfeed,
    };
    let mut a = dest(&t.0);
    assert_eq!(
        a.claim_ownership(&claim("runA", 0, 3)).unwrap(),
        Ownership::Acquired
    );
    let mut b = dest(&t.0);
    match b.claim_ownership(&claim("runB", 0, 0)).unwrap() {
        Ownership::HeldBy(info) => {
            assert_eq!(info.claim, Some(claim("runA", 0, 3)));
            assert!(
                info.holder.contains("runA")
                    && info.holder.contains(&std::process::id().to_string()),
                "{}",
                info.holder
            );
        }
        other => panic!("{other:?}"),
    }
    // Another subtask's share is free.
    assert_eq!(
        b.claim_ownership(&claim("runB", 1, 0)).unwrap(),
        Ownership::Acquired
    );
    drop(a);
    assert_eq!(
        b.claim_ownership(&claim("runB", 0, 0)).unwrap(),
        Ownership::Acquired
    );
}

#[test]
fn a_transaction_of_many_mib_is_published_byte_for_byte_in_every_mode_also_after_a_restart() {
    // Records of odd sizes, so that records straddle the direct-I/O chunk
    // boundaries, and numbered, so that a misplaced chunk shows.
    let records: Vec<String> = (0..60_000)
        .map(|i| format!("{i:08}-{}", "y".repeat(i % 173)))
        .collect();
    let expected: String = records.iter().map(|r| format!("{r}\n")).collect();
    assert!(expected.len() > 5 * 1024 * 1024, "large enough");
    let refs: Vec<&str> = records.iter().map(String::as_str).collect();
    for mode in [IoMode::Auto, IoMode::Direct, IoMode::Buffered] {
        let t = TempDir::new("large");
        let mut d = FsDestination::open(options(&t.0, mode), &sink()).unwrap();
        let open = handle(1, None, &[]);
        d.begin(&open).unwrap();
        for chunk in refs.chunks(4096) {
            d.write(&open.transaction, batch(chunk).batch()).unwrap();
        }
        let h = handle(1, Some(1), &refs);
        d.prepare(&h).unwrap();
        // The process "dies" after the prepare; a new one commits.
        drop(d);
        let mut d = FsDestination::open(options(&t.0, mode), &sink()).unwrap();
        assert_eq!(d.commit(&h, 2).unwrap(), CommitStatus::Committed);
        let published = fs::read_to_string(part(&t.0, 1)).unwrap();
        assert_eq!(published.len(), expected.len(), "{mode:?}");
        assert!(published == expected, "{mode:?}: published content differs");
    }
}

#[test]
fn configuration_names_are_validated() {
    let t = TempDir::new("names");
    for (prefix, suffix) in [
        ("../x", ""),
        ("a/b", ""),
        ("part", "txt"),
        ("part", "./x"),
        ("", ""),
    ] {
        let opts = FsOptions {
            part_prefix: prefix.into(),
            part_suffix: suffix.into(),
            ..FsOptions::new(&t.0)
        };
        let err = FsDestination::open(opts, &sink()).err().expect("refused");
        assert_eq!(
            err.kind,
            DestinationErrorKind::NotPermitted,
            "{prefix:?} {suffix:?}"
        );
    }
    let opts = FsOptions {
        part_suffix: ".txt".into(),
        format: RecordFormat::Raw,
        ..FsOptions::new(&t.0)
    };
    let mut d = FsDestination::open(opts, &sink()).unwrap();
    write(&mut d, 1, &["ab", "cd"]).unwrap();
    let h = handle(1, Some(1), &["ab", "cd"]);
    d.prepare(&h).unwrap();
    d.commit(&h, 1).unwrap();
    let name = format!("part-{}.txt", h.transaction);
    assert_eq!(fs::read_to_string(t.0.join(name)).unwrap(), "abcd");
}

#[test]
fn direct_mode_is_an_error_only_where_the_file_system_refuses_direct_io() {
    // Whatever this machine's file system does, the outcome is asserted:
    // where O_DIRECT works DIRECT mode writes, where it does not the first
    // write fails with a message naming the mode and the directory.
    for base in [std::env::temp_dir(), std::path::PathBuf::from("/dev/shm")] {
        if !base.is_dir() {
            continue;
        }
        let dir = base.join(format!("twopc-direct-probe-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let granted = {
            use std::os::unix::fs::OpenOptionsExt;
            fs::write(dir.join("probe"), b"").unwrap();
            fs::OpenOptions::new()
                .write(true)
                .custom_flags(0o40000 /* O_DIRECT on x86-64 */)
                .open(dir.join("probe"))
                .is_ok()
        };
        let mut d = FsDestination::open(options(&dir, IoMode::Direct), &sink()).unwrap();
        match (write(&mut d, 1, &["x"]), granted) {
            (Ok(()), true) => {}
            (Err(e), false) => assert!(e.message.contains("DIRECT"), "{e}"),
            (result, granted) => panic!("O_DIRECT granted: {granted}, write: {result:?}"),
        }
        let _ = fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_decided_commit_is_never_aborted_and_stops_a_fresh_start_of_another_run() {
    use twopc_core::config::{FreshStartPolicy, SinkOptions, SubtaskContext};
    use twopc_fs::{IoStep, IoTiming};
    let t = TempDir::new("roll-forward");
    let (mut d, faults) = faulty(&t.0, IoMode::Auto);
    let h = stage(&mut d, 1, 3, &["decided"]);
    // The claim lands, then the process dies before the commit record.
    faults.arm(IoStep::Claim, IoTiming::After, 5);
    d.commit(&h, 1).unwrap_err();
    drop(d);
    assert!(visible_files(&t.0).is_empty());
    // A later run starts without state and is told to abort prepared
    // leftovers: a decided commit is not a leftover; it is neither aborted
    // nor finished behind the start position the run was given, and the
    // start stops naming it.
    let options = SinkOptions {
        fresh_start: FreshStartPolicy::AppendAndAbortPrepared,
        ..SinkOptions::default()
    };
    let ctx = SubtaskContext::new(sink(), RunId::new("later").unwrap(), 0, 1).unwrap();
    let err = twopc_core::SubtaskSink::open(
        dest(&t.0),
        twopc_core::SystemClock,
        ctx,
        options,
        None,
        None,
    )
    .err()
    .expect("the decided commit stops the start");
    let twopc_core::TwopcError::PreparedOnFreshStart(f) = &err else {
        panic!("expected a fresh-start stop, got {err}")
    };
    assert_eq!(f.decided, vec![(h.transaction.clone(), 3)]);
    assert!(visible_files(&t.0).is_empty());
    // Whoever finishes it (a restore of its run, `twopc decide --commit`)
    // publishes it whole.
    assert_eq!(dest(&t.0).commit(&h, 2).unwrap(), CommitStatus::Committed);
    assert_eq!(fs::read_to_string(part(&t.0, 1)).unwrap(), "decided\n");
}

/// A commit that meets a claim whose data another commit already published
/// (and may not have synced yet) makes the publication durable before it
/// removes the claim, the last way back to the output after a power loss.
#[test]
fn a_commit_that_meets_a_published_claim_makes_the_output_durable_first() {
    let t = TempDir::new("published-claim");
    let log = Arc::new(StepLog::default());
    let mut d =
        FsDestination::open_with_faults(FsOptions::new(&t.0), &sink(), log.clone()).unwrap();
    let layout = d.layout();
    let h = stage(&mut d, 1, 3, &["a"]);
    let saved = t.0.join("saved");
    copy_dir(&layout.staging_dir(&h.transaction), &saved);
    assert_eq!(d.commit(&h, 5).unwrap(), CommitStatus::Committed);
    // The other commit's state: recorded, published, its claim still there.
    let claimed = layout.committing.join(h.transaction.as_str());
    copy_dir(&saved, &claimed);
    fs::remove_file(claimed.join("data")).unwrap();
    let steps = durable_steps(&mut d, &log, &h, CommitStatus::AlreadyCommitted);
    assert_eq!(
        steps,
        [
            (IoStep::DirSync, layout.committed.clone()),
            (IoStep::DirSync, t.0.clone())
        ]
    );
    assert!(!claimed.exists());
    assert_eq!(fs::read_to_string(part(&t.0, 1)).unwrap(), "a\n");
}

/// A commit that finds its transaction gone (aborted, maybe by a process
/// that has not synced its claim yet) makes that durable before it reports
/// the transaction missing, and the committer notes it as lost.
#[test]
fn a_commit_that_finds_its_transaction_gone_makes_that_durable_first() {
    let t = TempDir::new("gone");
    let log = Arc::new(StepLog::default());
    let mut d =
        FsDestination::open_with_faults(FsOptions::new(&t.0), &sink(), log.clone()).unwrap();
    let layout = d.layout();
    let h = stage(&mut d, 1, 3, &["a"]);
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::Aborted);
    log.0.lock().unwrap().clear();
    assert!(matches!(
        d.commit(&h, 5).unwrap(),
        CommitStatus::Missing { .. }
    ));
    let synced: Vec<std::path::PathBuf> = log
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(s, t, _)| *s == IoStep::DirSync && *t == IoTiming::Before)
        .map(|(_, _, p)| p.clone())
        .collect();
    assert_eq!(synced, std::slice::from_ref(&layout.staging));
}

/// Moves the transaction directory away (as another process's abort claims
/// it) just before the prepare marker is written.
#[derive(Debug)]
struct ClaimedDuringPrepare {
    from: std::path::PathBuf,
    to: std::path::PathBuf,
    done: std::sync::Mutex<bool>,
}

impl twopc_fs::IoFaults for ClaimedDuringPrepare {
    fn inject(
        &self,
        step: IoStep,
        timing: IoTiming,
        _path: &std::path::Path,
    ) -> Option<std::io::Error> {
        let mut done = self.done.lock().unwrap();
        if (step, timing) == (IoStep::Marker, IoTiming::Before) && !*done {
            *done = true;
            fs::rename(&self.from, &self.to).unwrap();
        }
        None
    }
}

/// A transaction claimed by another process (an abort or expiry) while it
/// is prepared is not prepared: the prepare fails, so its checkpoint fails,
/// instead of completing and meeting a LOST commit. Found by review.
#[test]
fn a_prepare_whose_transaction_is_claimed_meanwhile_fails() {
    let t = TempDir::new("claimed-prepare");
    let layout = dest(&t.0).layout();
    let hook = Arc::new(ClaimedDuringPrepare {
        from: layout.staging_dir(&txn(1)),
        to: layout.trash.join("claimed-by-another"),
        done: Default::default(),
    });
    let mut d =
        FsDestination::open_with_faults(FsOptions::new(&t.0), &sink(), hook.clone()).unwrap();
    write(&mut d, 1, &["a", "b"]).unwrap();
    let err = d.prepare(&handle(1, Some(3), &["a", "b"])).unwrap_err();
    assert!(*hook.done.lock().unwrap(), "the claim happened");
    assert_eq!(err.kind, DestinationErrorKind::Io, "{err}");
    assert!(err.message.contains("left the staging area"), "{err}");

    // Untouched, the same prepare succeeds.
    let mut d = dest(&t.0);
    stage(&mut d, 2, 3, &["c"]);
    assert_eq!(d.staged().unwrap().len(), 1);
}
