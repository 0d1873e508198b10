//! The object store destination against a local S3 server (moto, from
//! `eval "$(bash scripts/s3.sh start)"`). Each test has a bucket of its own.

#[macro_use]
mod common;

use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::Duration;

use common::*;
use twopc_core::config::SubtaskContext;
use twopc_core::destination::{
    AbortStatus, CommitStatus, Destination, LineageRecord, LostNote, OwnerClaim, Ownership,
    StagedState,
};
use twopc_core::error::DestinationErrorKind;
use twopc_core::ids::{LineageId, RunId};
use twopc_core::records::RecordBatchBuf;
use twopc_core::writer::Writer;
use twopc_objstore::faults::{RequestFaults, RequestInfo};
use twopc_objstore::names::{LINEAGES, PREPARED, RUNS};
use twopc_objstore::{FaultAction, ObjectStoreDestination, S3Call};

#[test]
fn prepared_is_invisible_until_the_commit_publishes_the_exact_bytes() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d = open(&o);
    let recs = records(50, 100, 1);
    let h = stage(&mut d, 1, 3, &recs);
    assert_eq!(object(&d, 1), None, "visible before its commit");
    assert_eq!(uploads(&d, 1).len(), 1);
    let staged = d.staged().unwrap();
    assert_eq!(staged.len(), 1);
    assert_eq!(staged[0].state, StagedState::Prepared(h.clone()));
    assert_eq!(d.commit(&h, 10).unwrap(), CommitStatus::Committed);
    assert_eq!(object(&d, 1), Some(lines(&recs)));
    assert!(uploads(&d, 1).is_empty());
    assert!(d.staged().unwrap().is_empty());
    // Repeated: already committed; an abort never undoes it.
    assert_eq!(d.commit(&h, 11).unwrap(), CommitStatus::AlreadyCommitted);
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::WasCommitted);
    let committed = d.committed_after(LineageId(7), 0).unwrap();
    assert_eq!(committed.len(), 1);
    assert_eq!((committed[0].checkpoint, committed[0].records), (3, 50));
    assert!(d.committed_after(LineageId(7), 3).unwrap().is_empty());
    // A fresh destination (a restart) commits from the handle alone.
    let mut again = ObjectStoreDestination::open(o, &sink()).unwrap();
    assert_eq!(
        again.commit(&h, 12).unwrap(),
        CommitStatus::AlreadyCommitted
    );
}

#[test]
fn the_core_writer_puts_the_upload_location_into_the_prepared_handle() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let ctx = SubtaskContext::new(sink(), RunId::new("job1").unwrap(), 0, 1).unwrap();
    let mut writer = Writer::new(ctx, LineageId(7), 0x1234);
    let open = writer.begin(&mut d, 1).unwrap();
    let buf = RecordBatchBuf::from_records(["a", "bb", "ccc"]);
    writer
        .write(&mut d, &open.transaction, buf.batch())
        .unwrap();
    let prepared = writer.prepare(&mut d, &open.transaction, 5, 2).unwrap();
    assert!(prepared.location().is_some(), "{prepared:?}");
    assert_eq!(prepared.prepared().unwrap().records, 3);
    // The handle survives the checkpoint's encoding.
    let restored = twopc_core::TransactionHandle::decode(&prepared.encode()).unwrap();
    assert_eq!(d.commit(&restored, 3).unwrap(), CommitStatus::Committed);
    let key = d.layout().part_key(&open.transaction);
    use object_store::ObjectStoreExt;
    let bytes = d
        .block_on(async {
            d.store()
                .get(&key.as_str().into())
                .await
                .unwrap()
                .bytes()
                .await
        })
        .unwrap();
    assert_eq!(&bytes[..], b"a\nbb\nccc\n");
}

#[test]
fn an_upload_aborted_behind_the_sinks_back_is_missing_with_evidence() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let h = stage(&mut d, 1, 3, &records(5, 10, 1));
    // Someone (a lifecycle rule, an operator) aborts the upload.
    let key = d.layout().part_key(&h.transaction);
    for id in uploads(&d, 1) {
        use object_store::multipart::MultipartStore;
        d.block_on(d.store().abort_multipart(&key.as_str().into(), &id))
            .unwrap();
    }
    match d.commit(&h, 10).unwrap() {
        CommitStatus::Missing { evidence } => {
            assert!(evidence.contains("ListMultipartUploads"), "{evidence}");
            assert!(evidence.contains("HEAD"), "{evidence}");
            assert!(evidence.contains("no commit record"), "{evidence}");
        }
        other => panic!("expected Missing, got {other:?}"),
    }
    assert_eq!(object(&d, 1), None);
}

#[test]
fn a_commit_record_lost_after_completion_is_repaired() {
    let endpoint = server!();
    let o = options(&endpoint);
    let (mut d, faults) = open_faulty(&o);
    let recs = records(5, 10, 2);
    let h = stage(&mut d, 1, 3, &recs);
    // The complete goes through; writing the record fails (a crash between).
    faults.arm(S3Call::PutObject, FaultAction::FailBefore("record".into()));
    assert!(d.commit(&h, 10).is_err());
    assert_eq!(object(&d, 1), Some(lines(&recs)));
    let record_key = d
        .layout()
        .commit_record_key(LineageId(7), 3, &h.transaction);
    assert_eq!(head(&d, &record_key), None);
    assert_eq!(d.commit(&h, 11).unwrap(), CommitStatus::Committed);
    assert!(head(&d, &record_key).is_some());
    // The same with the record removed after a clean commit.
    let h2 = stage(&mut d, 2, 4, &recs);
    assert_eq!(d.commit(&h2, 12).unwrap(), CommitStatus::Committed);
    let key2 = d
        .layout()
        .commit_record_key(LineageId(7), 4, &h2.transaction);
    delete_raw(&d, &key2);
    assert_eq!(d.commit(&h2, 13).unwrap(), CommitStatus::Committed);
    assert!(head(&d, &key2).is_some());
    assert_eq!(d.commit(&h2, 14).unwrap(), CommitStatus::AlreadyCommitted);
}

/// The upload is completed, writing its commit record fails, and a reader
/// that consumes objects by deleting them takes the object before the
/// commit is retried. The retry used to find neither the upload nor the
/// object nor a record and answered LOST, stopping the job; the
/// destination now remembers the completion and writes the record. Both
/// ways a completion is known: the complete's answer, and (answer lost) the
/// object found after it.
#[test]
fn a_completion_whose_record_failed_is_recorded_even_after_a_reader_took_the_object() {
    let endpoint = server!();
    let (mut d, faults) = open_faulty(&options(&endpoint));
    let recs = records(5, 10, 2);
    for (n, answer_lost) in [(1u64, false), (2, true)] {
        let h = stage(&mut d, n, 2 + n, &recs);
        if answer_lost {
            faults.arm(S3Call::CompleteUpload, FaultAction::FailAfter("cut".into()));
        }
        faults.arm(S3Call::PutObject, FaultAction::FailBefore("record".into()));
        assert!(d.commit(&h, 10).is_err(), "case {n}");
        assert_eq!(object(&d, n), Some(lines(&recs)), "case {n}: published");
        delete_raw(&d, &d.layout().part_key(&h.transaction));
        assert_eq!(
            d.commit(&h, 11).unwrap(),
            CommitStatus::Committed,
            "case {n}"
        );
        let record_key = d
            .layout()
            .commit_record_key(LineageId(7), 2 + n, &h.transaction);
        assert!(head(&d, &record_key).is_some(), "case {n}: recorded");
        assert_eq!(object(&d, n), None, "case {n}: nothing is shown again");
        assert_eq!(
            d.commit(&h, 12).unwrap(),
            CommitStatus::AlreadyCommitted,
            "case {n}"
        );
    }
    // The listing a rewind check reads records it too, before any retry:
    // otherwise it would miss a committed transaction.
    let h = stage(&mut d, 3, 5, &recs);
    faults.arm(S3Call::PutObject, FaultAction::FailBefore("record".into()));
    assert!(d.commit(&h, 10).is_err());
    delete_raw(&d, &d.layout().part_key(&h.transaction));
    let listed = d.committed_after(LineageId(7), 4).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].transaction, h.transaction);
    assert_eq!(d.commit(&h, 11).unwrap(), CommitStatus::AlreadyCommitted);
}

/// A crash between completing the upload and writing its record leaves
/// visible output that only a repeat of that very commit used to find: a
/// restore of an older checkpoint missed it in its rewind check (and
/// replayed it), a fresh start in its check for earlier output, a restart
/// that had it as its open transaction could not abort it (found by
/// review). Whatever reads records or staged transactions first records
/// such a completion from its prepare marker.
///
/// Also with a stray upload on the key: a resent CreateMultipartUpload
/// leaves one beside the upload the marker names. Found by review: a
/// completion without its record was then passed over as "still staged",
/// so the rewind check of a restore missed its output; and the stray was
/// listed as an open transaction whose abort found the output and stopped
/// the start.
#[test]
fn a_completion_whose_record_was_never_written_is_recorded_by_the_next_reader() {
    type Read = fn(&mut ObjectStoreDestination) -> bool;
    let readers: [(&str, Read); 3] = [
        ("committed_after", |d| {
            d.committed_after(LineageId(7), 0).unwrap().len() == 1
        }),
        ("lineages", |d| d.lineages().unwrap()[0].committed == 1),
        ("staged", |d| d.staged().unwrap().is_empty()),
    ];
    for with_stray in [false, true] {
        for (name, read) in readers {
            let endpoint = server!();
            let o = options(&endpoint);
            let (mut d, faults) = open_faulty(&o);
            let recs = records(5, 10, 2);
            let h = stage(&mut d, 1, 3, &recs);
            let strays: Vec<String> = if with_stray {
                vec![stray_upload(&d, 1)]
            } else {
                Vec::new()
            };
            faults.arm(S3Call::PutObject, FaultAction::FailBefore("crash".into()));
            assert!(d.commit(&h, 10).is_err());
            drop(d);
            // The process restarts.
            let mut d = open(&o);
            let name = format!("{name}, stray: {with_stray}");
            assert_eq!(object(&d, 1), Some(lines(&recs)), "{name}");
            assert_eq!(uploads(&d, 1), strays, "{name}");
            assert!(read(&mut d), "{name}");
            let record_key = d
                .layout()
                .commit_record_key(LineageId(7), 3, &h.transaction);
            assert!(head(&d, &record_key).is_some(), "{name}: recorded");
            let committed = d.committed_after(LineageId(7), 0).unwrap();
            assert_eq!(committed.len(), 1, "{name}");
            assert_eq!(committed[0].transaction, h.transaction);
            assert_eq!(d.lineages().unwrap()[0].committed, 1, "{name}");
            assert!(
                d.staged().unwrap().is_empty(),
                "{name}: no open transaction"
            );
            assert!(uploads(&d, 1).is_empty(), "{name}: no stray left");
            assert_eq!(d.commit(&h, 12).unwrap(), CommitStatus::AlreadyCommitted);
            assert_eq!(object(&d, 1), Some(lines(&recs)), "{name}: once");
        }
    }
}

/// A damaged prepare marker of a completed upload whose record was never
/// written: only the marker could say whether the commit was recorded, so
/// every reader that checks for such completions stops and names it, instead
/// of passing over output that a rewind check must see (found by review:
/// `committed_after` answered nothing, and a restore of an older checkpoint
/// would have replayed the records). A damaged marker of an aborted
/// transaction (no upload, no output) hides nothing and stops nothing.
#[test]
fn a_damaged_marker_of_a_completion_without_its_record_stops_every_reader() {
    let endpoint = server!();
    // Also with a stray upload of the same key open beside the completion
    // (a resent CreateMultipartUpload leaves one): found by review, it hid
    // the completion again.
    for with_stray in [false, true] {
        let o = options(&endpoint);
        let (mut d, faults) = open_faulty(&o);
        let recs = records(5, 10, 2);
        let h = stage(&mut d, 1, 3, &recs);
        if with_stray {
            stray_upload(&d, 1);
        }
        faults.arm(S3Call::PutObject, FaultAction::FailBefore("crash".into()));
        assert!(d.commit(&h, 10).is_err());
        drop(d);
        let mut d = open(&o);
        let marker = d.layout().control(PREPARED, h.transaction.as_str());
        put_raw(&d, &marker, &[0xff; 40]);
        let errors = [
            d.committed_after(LineageId(7), 0).map(|_| ()).unwrap_err(),
            d.lineages().map(|_| ()).unwrap_err(),
            d.staged().map(|_| ()).unwrap_err(),
        ];
        for err in errors {
            assert_eq!(
                err.kind,
                DestinationErrorKind::Corrupt,
                "stray {with_stray}: {err}"
            );
            assert!(err.message.contains(&marker), "names the marker: {err}");
            assert!(err.message.contains(h.transaction.as_str()), "{err}");
            assert!(
                err.message.contains("latest checkpoint"),
                "says what to do: {err}"
            );
        }
        assert_eq!(object(&d, 1), Some(lines(&recs)), "the output is untouched");
        assert!(
            head(&d, &marker).is_some(),
            "the marker is kept for the operator"
        );
        // The way out the error names: the marker goes, the restore of the
        // latest checkpoint commits the transaction again, which finds its
        // output and records it.
        delete_raw(&d, &marker);
        assert_eq!(d.commit(&h, 12).unwrap(), CommitStatus::Committed);
        assert_eq!(object(&d, 1), Some(lines(&recs)), "once");
        assert_eq!(d.committed_after(LineageId(7), 0).unwrap().len(), 1);

        // An aborted transaction's damaged marker: no upload, no output.
        let aborted = stage(&mut d, 2, 4, &recs);
        assert_eq!(d.abort(&aborted.transaction).unwrap(), AbortStatus::Aborted);
        put_raw(
            &d,
            &d.layout().control(PREPARED, aborted.transaction.as_str()),
            &[0xff; 40],
        );
        assert_eq!(d.committed_after(LineageId(7), 0).unwrap().len(), 1);
        assert!(d.staged().unwrap().is_empty());
    }
}

#[test]
fn a_stray_upload_left_beside_committed_output_is_not_an_open_transaction() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let recs = records(5, 10, 2);
    let h = stage(&mut d, 1, 3, &recs);
    assert_eq!(d.commit(&h, 10).unwrap(), CommitStatus::Committed);
    // The commit's tidying could not abort it (its failure is only logged).
    stray_upload(&d, 1);
    assert!(d.staged().unwrap().is_empty());
    assert!(uploads(&d, 1).is_empty(), "the stray is aborted");
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::WasCommitted);
    assert_eq!(object(&d, 1), Some(lines(&recs)));
    // A stray on the key of a transaction that is not published is still
    // listed: it is an open transaction as far as anything can tell.
    stray_upload(&d, 2);
    let staged = d.staged().unwrap();
    assert_eq!(staged.len(), 1);
    assert_eq!(staged[0].transaction, txn(2));
    assert!(matches!(staged[0].state, StagedState::Open));
}

/// A reader that consumes objects by deleting them took a committed one,
/// and the checkpoint that holds the transaction is restored: the repeated
/// commit succeeds, as any repeated commit does, and shows nothing again.
/// Before, it answered LOST and the job stopped at every failover.
#[test]
fn a_committed_object_a_reader_removed_later_is_already_committed() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let h = stage(&mut d, 1, 3, &records(5, 10, 2));
    assert_eq!(d.commit(&h, 10).unwrap(), CommitStatus::Committed);
    delete_raw(&d, &d.layout().part_key(&h.transaction));
    assert_eq!(d.commit(&h, 11).unwrap(), CommitStatus::AlreadyCommitted);
    assert_eq!(object(&d, 1), None, "nothing is shown again");
}

#[test]
fn a_complete_whose_answer_is_lost_resolves_on_retry_with_one_object() {
    let endpoint = server!();
    let (mut d, faults) = open_faulty(&options(&endpoint));
    let recs = records(20, 30, 3);
    let h = stage(&mut d, 1, 3, &recs);
    // The server completes the upload, the answer is lost, and the look
    // that would tell fails too: the outcome is unknown.
    faults.arm(S3Call::CompleteUpload, FaultAction::FailAfter("cut".into()));
    faults.arm(S3Call::HeadObject, FaultAction::FailBefore("cut".into()));
    let err = d.commit(&h, 10).unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Io, "{err}");
    // The retry (same ids) resolves it, even when the repeated complete
    // fails as S3 answers it (NoSuchUpload; moto would answer 200): the
    // object tells.
    faults.arm(
        S3Call::CompleteUpload,
        FaultAction::FailBefore("NoSuchUpload".into()),
    );
    let status = d.commit(&h, 11).unwrap();
    assert!(
        matches!(
            status,
            CommitStatus::Committed | CommitStatus::AlreadyCommitted
        ),
        "{status:?}"
    );
    assert_eq!(object(&d, 1), Some(lines(&recs)));
    assert!(uploads(&d, 1).is_empty());
    assert_eq!(d.commit(&h, 12).unwrap(), CommitStatus::AlreadyCommitted);
    // A complete that never reached the server: unknown, the upload stays,
    // and the retry commits.
    let h2 = stage(&mut d, 2, 4, &recs);
    faults.arm(
        S3Call::CompleteUpload,
        FaultAction::FailBefore("refused".into()),
    );
    let err = d.commit(&h2, 13).unwrap_err();
    assert!(err.message.contains("still open"), "{err}");
    assert_eq!(uploads(&d, 2).len(), 1);
    assert_eq!(d.commit(&h2, 14).unwrap(), CommitStatus::Committed);
}

#[test]
fn a_failed_part_poisons_the_transaction_and_nothing_becomes_visible() {
    let endpoint = server!();
    let mut o = options(&endpoint);
    o.allow_small_parts = true;
    o.part_size = 1024;
    let (mut d, faults) = open_faulty(&o);
    faults.arm(
        S3Call::PutPart { number: 2 },
        FaultAction::FailBefore("disk".into()),
    );
    let recs = records(30, 100, 4); // about 3 KiB: parts 1, 2 (fails), ...
    let err = write(&mut d, 1, &recs).unwrap_err();
    assert!(err.message.contains("part 2"), "{err}");
    let again = write(&mut d, 1, &records(1, 10, 5)).unwrap_err();
    assert!(again.message.contains("refusing to write"), "{again}");
    let p = handle(1, Some(3), &recs);
    let refused = d.prepare(&p).unwrap_err();
    assert!(refused.message.contains("refusing to prepare"), "{refused}");
    assert_eq!(d.prepared_location(&p.transaction).unwrap(), None);
    assert_eq!(d.abort(&p.transaction).unwrap(), AbortStatus::Aborted);
    assert_eq!(object(&d, 1), None);
    assert!(uploads(&d, 1).is_empty());
    assert!(d.staged().unwrap().is_empty());
}

#[test]
fn parts_of_the_real_minimum_size_publish_exactly() {
    let endpoint = server!();
    let mut o = options(&endpoint);
    o.part_size = twopc_objstore::options::MIN_PART_SIZE;
    let (mut d, faults) = open_faulty(&o);
    let recs = records(176, 64 * 1024 - 1, 6); // 11 MiB with line breaks
    let h = stage(&mut d, 1, 3, &recs);
    let parts = faults
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|c| matches!(c, S3Call::PutPart { .. }))
        .count();
    assert_eq!(parts, 3);
    assert_eq!(d.commit(&h, 10).unwrap(), CommitStatus::Committed);
    assert_eq!(object(&d, 1), Some(lines(&recs)));
}

#[test]
fn the_server_refuses_to_complete_parts_under_5_mib_and_nothing_is_published() {
    // moto enforces S3's minimum at CompleteMultipartUpload (EntityTooSmall),
    // which is why small parts are refused by `validate` unless asked for.
    let endpoint = server!();
    let mut o = options(&endpoint);
    o.allow_small_parts = true;
    o.part_size = 1024;
    let mut d = open(&o);
    let h = stage(&mut d, 1, 3, &records(30, 100, 7));
    let err = d.commit(&h, 10).unwrap_err();
    assert!(
        err.message.contains("EntityTooSmall") || err.message.contains("smaller"),
        "{err}"
    );
    assert_eq!(object(&d, 1), None);
    assert_eq!(uploads(&d, 1).len(), 1);
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::Aborted);
}

#[test]
fn a_lifecycle_rule_shorter_than_needed_is_refused_by_name() {
    let endpoint = server!();
    let o = options(&endpoint);
    let d = open(&o);
    d.block_on(d.api().put_lifecycle(
        "<LifecycleConfiguration><Rule><ID>abort-fast</ID><Filter><Prefix>out/</Prefix></Filter>\
         <Status>Enabled</Status><AbortIncompleteMultipartUpload><DaysAfterInitiation>1\
         </DaysAfterInitiation></AbortIncompleteMultipartUpload></Rule></LifecycleConfiguration>",
    ))
    .unwrap();
    let needed = twopc_objstore::needed_retention_ms(3_600_000, 3_600_000, 2 * 86_400_000);
    let err = match ObjectStoreDestination::open_checked(o.clone(), &sink(), needed) {
        Err(e) => e,
        Ok(_) => panic!("a 1-day rule was accepted for a need of more than 2 days"),
    };
    assert_eq!(err.kind, DestinationErrorKind::NotPermitted);
    for part in ["'abort-fast'", "1 day", "at least 3"] {
        assert!(err.message.contains(part), "{part} not in: {err}");
    }
    // Within one day: accepted. No configuration at all: accepted.
    assert!(ObjectStoreDestination::open_checked(o, &sink(), 12 * 3_600_000).is_ok());
    let fresh = options(&endpoint);
    drop(open(&fresh));
    assert!(ObjectStoreDestination::open_checked(fresh, &sink(), needed).is_ok());
}

/// A rule that expires objects over the sink's control area (a data
/// retention rule on the whole prefix) would delete its commit records and
/// history: refused by name; one over the output objects only is not.
#[test]
fn a_lifecycle_rule_expiring_the_control_area_is_refused_by_name() {
    let endpoint = server!();
    let o = options(&endpoint);
    let d = open(&o);
    let rule = |prefix: &str| {
        format!(
            "<LifecycleConfiguration><Rule><ID>keep-30-days</ID><Filter><Prefix>{prefix}</Prefix>\
             </Filter><Status>Enabled</Status><Expiration><Days>30</Days></Expiration></Rule>\
             </LifecycleConfiguration>"
        )
    };
    d.block_on(d.api().put_lifecycle(&rule("out/"))).unwrap();
    let err = match ObjectStoreDestination::open_checked(o.clone(), &sink(), 3_600_000) {
        Err(e) => e,
        Ok(_) => panic!("a rule expiring the control area was accepted"),
    };
    assert_eq!(err.kind, DestinationErrorKind::NotPermitted);
    for part in ["'keep-30-days'", "out/_twopc/orders/", "commit records"] {
        assert!(err.message.contains(part), "{part} not in: {err}");
    }
    d.block_on(d.api().put_lifecycle(&rule("out/part-")))
        .unwrap();
    assert!(ObjectStoreDestination::open_checked(o, &sink(), 3_600_000).is_ok());
}

#[test]
fn lingering_uploads_are_listed_open_or_prepared_and_aborted() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    write(&mut d, 1, &records(3, 10, 8)).unwrap(); // never prepared
    let h2 = stage(&mut d, 2, 3, &records(3, 10, 8));
    let mut staged = d.staged().unwrap();
    staged.sort_by(|a, b| a.transaction.cmp(&b.transaction));
    assert_eq!(staged.len(), 2);
    assert_eq!(staged[0].state, StagedState::Open);
    assert_eq!(staged[1].state, StagedState::Prepared(h2.clone()));
    assert_eq!(staged[1].subtask, 0);
    assert_eq!(d.abort(&txn(1)).unwrap(), AbortStatus::Aborted);
    assert_eq!(d.abort(&txn(1)).unwrap(), AbortStatus::NotFound);
    assert_eq!(d.abort(&txn(2)).unwrap(), AbortStatus::Aborted);
    assert!(d.staged().unwrap().is_empty());
    assert!(uploads(&d, 2).is_empty());
    assert_eq!(
        head(&d, &d.layout().control(PREPARED, txn(2).as_str())),
        None
    );
    // A commit of the aborted one is missing.
    assert!(matches!(
        d.commit(&h2, 5).unwrap(),
        CommitStatus::Missing { .. }
    ));
}

#[test]
fn an_expired_transaction_is_missing_and_says_why() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let h = stage(&mut d, 1, 3, &records(3, 10, 9));
    d.expire(&h.transaction, 1_700_000_000_000).unwrap();
    d.expire(&h.transaction, 1_700_000_000_001).unwrap(); // repeatable
    match d.commit(&h, 10).unwrap() {
        CommitStatus::Missing { evidence } => {
            assert!(evidence.contains("Retention cleanup"), "{evidence}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn hostile_control_objects_are_clear_errors_never_panics() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let recs = records(3, 10, 10);
    let h = stage(&mut d, 1, 3, &recs);
    let garbage: [&[u8]; 3] = [
        b"",
        b"TWPC\x00\x01\x02\x00\x00\x00\x00\x05hello\x00\x00\x00\x00",
        &[0xff; 300],
    ];
    for bytes in garbage {
        // Commit record.
        let record_key = d
            .layout()
            .commit_record_key(LineageId(7), 3, &h.transaction);
        put_raw(&d, &record_key, bytes);
        let err = d.commit(&h, 10).unwrap_err();
        assert_eq!(err.kind, DestinationErrorKind::Corrupt, "{err}");
        assert!(d.committed_after(LineageId(7), 0).is_err());
        delete_raw(&d, &record_key);
        // Prepared marker: the upload is prepared, its handle unreadable.
        let marker = d.layout().control(PREPARED, h.transaction.as_str());
        put_raw(&d, &marker, bytes);
        let staged = d.staged().unwrap();
        assert!(
            matches!(&staged[0].state, StagedState::PreparedUnreadable { reason } if reason.contains("marker")),
            "{staged:?}"
        );
        // Lineage record and run record.
        let lineage_key = d.layout().control(LINEAGES, &LineageId(7).to_string());
        put_raw(&d, &lineage_key, bytes);
        put_raw(
            &d,
            &d.layout().commit_record_key(LineageId(7), 1, &txn(9)),
            bytes,
        );
        assert_eq!(
            d.lineages().unwrap_err().kind,
            DestinationErrorKind::Corrupt
        );
        delete_raw(&d, &d.layout().commit_record_key(LineageId(7), 1, &txn(9)));
        delete_raw(&d, &lineage_key);
        put_raw(&d, &d.layout().control(RUNS, "job1"), bytes);
        assert!(d.run_lineage(&RunId::new("job1").unwrap()).is_err());
        // Location bytes in the handle.
        let mut forged = h.clone();
        if let twopc_core::TransactionState::PreparedAt { location, .. } = &mut forged.state {
            *location = bytes.to_vec();
        }
        let err = d.commit(&forged, 10).unwrap_err();
        assert_eq!(err.kind, DestinationErrorKind::Corrupt, "{err}");
    }
    // A location naming another key is refused too (never completes it).
    let other = stage(&mut d, 2, 3, &recs);
    let mut forged = h.clone();
    forged.state = other.state.clone();
    let err = d.commit(&forged, 10).unwrap_err();
    assert!(err.message.contains("does not name transaction"), "{err}");
    assert_eq!(object(&d, 2), None);
}

#[test]
fn commit_and_abort_racing_from_two_destinations_agree() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d = open(&o);
    for seq in 1..=6 {
        let recs = records(4, 10, seq as u8);
        let h = stage(&mut d, seq, seq, &recs);
        let barrier = Arc::new(Barrier::new(2));
        let (o1, o2, b1, b2, h1) = (o.clone(), o.clone(), barrier.clone(), barrier, h.clone());
        let committer = std::thread::spawn(move || {
            let mut d = ObjectStoreDestination::open(o1, &sink()).unwrap();
            b1.wait();
            d.commit(&h1, 10)
        });
        let aborter = std::thread::spawn(move || {
            let mut d = ObjectStoreDestination::open(o2, &sink()).unwrap();
            b2.wait();
            d.abort(&txn(seq))
        });
        let commit = committer.join().unwrap();
        let abort = aborter.join().unwrap().unwrap();
        let visible = object(&d, seq);
        match (&commit, &abort) {
            (Ok(CommitStatus::Committed), AbortStatus::WasCommitted) => {
                assert_eq!(visible, Some(lines(&recs)));
                assert_eq!(d.commit(&h, 11).unwrap(), CommitStatus::AlreadyCommitted);
            }
            (Ok(CommitStatus::Missing { .. }), AbortStatus::Aborted) => {
                assert_eq!(visible, None);
                assert!(matches!(
                    d.commit(&h, 11).unwrap(),
                    CommitStatus::Missing { .. }
                ));
            }
            other => panic!(
                "inconsistent outcome {other:?}, object present: {}",
                visible.is_some()
            ),
        }
        assert!(uploads(&d, seq).is_empty());
    }
}

#[test]
fn ownership_is_a_lease_one_holder_at_a_time() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut a = open(&o);
    let claim = |run: &str, attempt| OwnerClaim {
        sink: sink(),
        subtask: 0,
        run: RunId::new(run).unwrap(),
        attempt,
        instance: 1,
    };
    assert_eq!(
        a.claim_ownership(&claim("run-a", 0)).unwrap(),
        Ownership::Acquired
    );
    let mut b = ObjectStoreDestination::open(o.clone(), &sink()).unwrap();
    match b.claim_ownership(&claim("run-b", 0)).unwrap() {
        Ownership::HeldBy(info) => {
            assert_eq!(info.claim.unwrap().run.as_str(), "run-a");
            assert!(info.holder.contains("pid"), "{}", info.holder);
        }
        other => panic!("{other:?}"),
    }
    // A later attempt of the same run takes over from its predecessor.
    let mut a2 = ObjectStoreDestination::open(o.clone(), &sink()).unwrap();
    assert_eq!(
        a2.claim_ownership(&claim("run-a", 1)).unwrap(),
        Ownership::Acquired
    );
    drop(a); // its release must not undo a2's lease
    assert!(matches!(
        b.claim_ownership(&claim("run-b", 0)).unwrap(),
        Ownership::HeldBy(_)
    ));
    drop(a2); // released
    assert_eq!(
        b.claim_ownership(&claim("run-b", 0)).unwrap(),
        Ownership::Acquired
    );
    assert_eq!(b.owner_subtasks().unwrap(), vec![0]);
}

#[test]
fn notes_lineages_and_runs_are_kept() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let record = LineageRecord {
        lineage: LineageId(7),
        run: RunId::new("job1").unwrap(),
        started_at_ms: 5,
        appended: false,
    };
    d.record_lineage(&record).unwrap();
    d.record_lineage(&record).unwrap();
    d.record_run_lineage(&RunId::new("job1").unwrap(), LineageId(7))
        .unwrap();
    d.record_run_lineage(&RunId::new("job1").unwrap(), LineageId(7))
        .unwrap();
    assert!(d
        .record_run_lineage(&RunId::new("job1").unwrap(), LineageId(8))
        .is_err());
    assert_eq!(
        d.run_lineage(&RunId::new("job1").unwrap()).unwrap(),
        Some(LineageId(7))
    );
    assert_eq!(d.run_lineage(&RunId::new("job2").unwrap()).unwrap(), None);
    let h = stage(&mut d, 1, 3, &records(2, 5, 1));
    d.commit(&h, 9).unwrap();
    let lineages = d.lineages().unwrap();
    assert_eq!(lineages.len(), 1);
    assert_eq!(lineages[0].record.as_ref(), Some(&record));
    assert_eq!(lineages[0].last_transactions, vec![h.transaction.clone()]);
    let note = LostNote {
        transaction: txn(5),
        lineage: LineageId(7),
        checkpoint: 4,
        subtask: 0,
        run: RunId::new("job1").unwrap(),
        records: 3,
        found_at_ms: 6,
        evidence: "gone".into(),
    };
    d.record_lost(&note).unwrap();
    assert_eq!(d.lost_notes().unwrap(), vec![note]);
    assert_eq!(d.clear_lost(LineageId(7), 4).unwrap(), 0);
    assert_eq!(d.clear_lost(LineageId(7), 3).unwrap(), 1);
    assert!(d.lost_notes().unwrap().is_empty());
    let tallies = d.history_tallies().unwrap();
    assert_eq!((tallies.len(), tallies[0].records), (1, 2));
    // Retract removes the object and the record.
    let c = d.committed_after(LineageId(7), 0).unwrap().remove(0);
    d.retract(&c).unwrap();
    d.retract(&c).unwrap();
    assert_eq!(object(&d, 1), None);
    assert!(d.committed_after(LineageId(7), 0).unwrap().is_empty());
}

#[test]
fn secrets_never_show_in_errors_or_debug() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d = open(&o);
    assert!(!format!("{o:?}").contains(SECRET));
    let h = stage(&mut d, 1, 3, &records(2, 5, 1));
    let mut forged = h.clone();
    forged.state = handle(1, Some(3), &records(3, 5, 1)).state;
    let shown = format!("{:?}", d.commit(&forged, 1));
    assert!(!shown.contains(SECRET), "{shown}");
}

#[test]
fn a_lease_write_whose_answer_was_lost_is_held_and_released_as_ours() {
    let endpoint = server!();
    let mut o = options(&endpoint);
    o.lease_ms = 10_000;
    let (mut a, faults) = open_faulty(&o);
    let claim = |run: &str| OwnerClaim {
        sink: sink(),
        subtask: 0,
        run: RunId::new(run).unwrap(),
        attempt: 0,
        instance: 1,
    };
    // The claim lands, its answer is lost: the lease is ours all the same.
    faults.arm(S3Call::PutObject, FaultAction::FailAfter("cut".into()));
    assert_eq!(
        a.claim_ownership(&claim("run-a")).unwrap(),
        Ownership::Acquired
    );
    let mut b = ObjectStoreDestination::open(o.clone(), &sink()).unwrap();
    assert!(matches!(
        b.claim_ownership(&claim("run-b")).unwrap(),
        Ownership::HeldBy(_)
    ));
    // A renewal (due after a third of the lease) that lands with its answer
    // lost fails that call; the next renewal meets its own ETag change and
    // is not taken for a takeover.
    std::thread::sleep(std::time::Duration::from_millis(3_500));
    faults.arm(S3Call::PutObject, FaultAction::FailAfter("cut".into()));
    let err = write(&mut a, 1, &records(1, 5, 1)).unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Io, "{err}");
    write(&mut a, 1, &records(1, 5, 1)).unwrap();
    // Released when dropped: the other job gets it at once.
    drop(a);
    assert_eq!(
        b.claim_ownership(&claim("run-b")).unwrap(),
        Ownership::Acquired
    );
}

/// Holds the first read of a prepare marker until `release`.
#[derive(Debug, Default)]
struct PauseAtMarker {
    reached: Mutex<bool>,
    woke: Condvar,
    released: Mutex<bool>,
    freed: Condvar,
}

impl RequestFaults for PauseAtMarker {
    fn decide(&self, r: &RequestInfo) -> FaultAction {
        let marker = r.call == S3Call::GetObject && r.path.contains(&format!("/{PREPARED}/"));
        let mut reached = self.reached.lock().unwrap();
        if marker && !*reached {
            *reached = true;
            self.woke.notify_all();
            drop(reached);
            let released = self.released.lock().unwrap();
            let _ = self
                .freed
                .wait_timeout_while(released, Duration::from_secs(20), |r| !*r)
                .unwrap();
        }
        FaultAction::Proceed
    }
}

/// A commit with a handle from before handles carried the upload's
/// location finds the upload through its prepare marker. Another commit
/// of the same transaction may finish (record written, marker removed)
/// between its look for the record and its read of the marker: it must
/// then answer already committed, not refuse the published object as one
/// it cannot check, nor call it LOST. Forced with a hook that holds the
/// first commit at the marker until the second is done.
#[test]
fn a_commit_that_finds_the_marker_gone_looks_for_the_record_again() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d = open(&o);
    let recs = records(4, 10, 1);
    let mut h = stage(&mut d, 1, 1, &recs);
    let info = h.prepared().unwrap().clone();
    h.state = twopc_core::TransactionState::Prepared(info);
    let pause = Arc::new(PauseAtMarker::default());
    let (o1, p1, h1) = (o.clone(), pause.clone(), h.clone());
    let first = std::thread::spawn(move || {
        let mut d = ObjectStoreDestination::open_with_faults(o1, &sink(), p1).unwrap();
        d.commit(&h1, 10)
    });
    {
        let mut reached = pause.reached.lock().unwrap();
        while !*reached {
            reached = pause.woke.wait(reached).unwrap();
        }
    }
    assert_eq!(d.commit(&h, 10).unwrap(), CommitStatus::Committed);
    *pause.released.lock().unwrap() = true;
    pause.freed.notify_all();
    assert_eq!(
        first.join().unwrap().unwrap(),
        CommitStatus::AlreadyCommitted
    );
    assert_eq!(object(&d, 1), Some(lines(&recs)));
}

/// Two commits of one transaction racing (a retry by id while an earlier
/// attempt still runs): both answer committed and the object is there
/// once, with the checkpoint's handle and with one from before handles
/// carried the upload's location (which looks the upload up through its
/// prepare marker, gone once the other commit finished).
#[test]
fn two_commits_of_one_transaction_racing_both_succeed() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d = open(&o);
    for seq in 1..=8 {
        let recs = records(4, 10, seq as u8);
        let mut h = stage(&mut d, seq, seq, &recs);
        if seq % 2 == 0 {
            let info = h.prepared().unwrap().clone();
            h.state = twopc_core::TransactionState::Prepared(info);
        }
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let (o, b, h) = (o.clone(), barrier.clone(), h.clone());
                std::thread::spawn(move || {
                    let mut d = ObjectStoreDestination::open(o, &sink()).unwrap();
                    b.wait();
                    d.commit(&h, 10)
                })
            })
            .collect();
        for r in racers {
            match r.join().unwrap() {
                Ok(CommitStatus::Committed) | Ok(CommitStatus::AlreadyCommitted) => {}
                other => panic!("round {seq}: a commit answered {other:?}"),
            }
        }
        assert_eq!(object(&d, seq), Some(lines(&recs)), "round {seq}");
        assert!(uploads(&d, seq).is_empty());
    }
}

/// Fails this destination's first CompleteMultipartUpload before it goes
/// out (as a request that timed out), then runs `between` once just
/// before the ListMultipartUploads that follows (the look at the uploads;
/// the object is looked at too, before or after it).
struct CompletionMeanwhile<F: Fn() + Send + Sync> {
    between: F,
    completes: Mutex<u32>,
    ran: Mutex<bool>,
}

impl<F: Fn() + Send + Sync> std::fmt::Debug for CompletionMeanwhile<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompletionMeanwhile")
    }
}

impl<F: Fn() + Send + Sync> RequestFaults for CompletionMeanwhile<F> {
    fn decide(&self, r: &RequestInfo) -> FaultAction {
        if r.call == S3Call::CompleteUpload {
            let mut n = self.completes.lock().unwrap();
            *n += 1;
            if *n == 1 {
                return FaultAction::FailBefore("timed out".into());
            }
        }
        if r.call == S3Call::ListUploads && *self.completes.lock().unwrap() > 0 {
            let mut ran = self.ran.lock().unwrap();
            if !*ran {
                *ran = true;
                drop(ran);
                (self.between)();
            }
        }
        FaultAction::Proceed
    }
}

/// A commit whose CompleteMultipartUpload failed learns the outcome from
/// the upload and the object. Another commit of the transaction (a retry
/// racing it, or its own request landing late) may complete the upload
/// between its first look and its second: it must still answer committed,
/// never missing (found by review: the object was looked at before the
/// uploads, and a completion in between hid from both).
#[test]
fn a_completion_between_the_looks_of_a_failed_commit_is_not_missing() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d0 = open(&o);
    let recs = records(5, 10, 2);
    let h = stage(&mut d0, 1, 3, &recs);
    let other = Arc::new(Mutex::new(None));
    let (o2, h2, other2) = (o.clone(), h.clone(), other.clone());
    let hook = Arc::new(CompletionMeanwhile {
        between: move || {
            let (o3, h3) = (o2.clone(), h2.clone());
            let r = std::thread::spawn(move || {
                ObjectStoreDestination::open(o3, &sink())
                    .unwrap()
                    .commit(&h3, 11)
            })
            .join()
            .unwrap();
            *other2.lock().unwrap() = Some(r);
        },
        completes: Mutex::new(0),
        ran: Mutex::new(false),
    });
    let mut d = ObjectStoreDestination::open_with_faults(o.clone(), &sink(), hook).unwrap();
    let mine = d.commit(&h, 10);
    assert!(
        matches!(
            *other.lock().unwrap(),
            Some(Ok(CommitStatus::Committed | CommitStatus::AlreadyCommitted))
        ),
        "the racing commit ran between the looks: {:?}",
        other.lock().unwrap()
    );
    assert!(
        matches!(
            mine,
            Ok(CommitStatus::Committed | CommitStatus::AlreadyCommitted)
        ),
        "{mine:?}"
    );
    assert_eq!(object(&d0, 1), Some(lines(&recs)));
}

/// `part-t-orders.0.…` is this sink's key for a transaction of sink
/// `orders` only with the part prefix `part-t`; with the default prefix it
/// is an object of sink `t-orders`. A forged commit record naming it must
/// not make a retraction delete it (found by review).
#[test]
fn a_forged_record_cannot_make_a_retraction_delete_another_sinks_object() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let recs = records(2, 10, 1);
    let h = stage(&mut d, 1, 3, &recs);
    let ours = d.layout().part_key(&h.transaction);
    let name = ours.rsplit('/').next().unwrap();
    let victim = format!(
        "{}part-t-{}",
        &ours[..ours.len() - name.len()],
        name.strip_prefix("part-").unwrap()
    );
    put_raw(&d, &victim, b"another sink's output\n");
    let forged =
        twopc_objstore::control::ControlObject::Committed(twopc_objstore::control::CommitRecord {
            handle: h.clone(),
            key: victim.clone(),
            size: 22,
            e_tag: String::new(),
            committed_at_ms: 1,
        });
    let record_key = d
        .layout()
        .commit_record_key(LineageId(7), 3, &h.transaction);
    put_raw(&d, &record_key, &twopc_objstore::control::encode(&forged));
    let later = d.committed_after(LineageId(7), 2).unwrap();
    assert_eq!(later.len(), 1, "{later:?}");
    let err = d.retract(&later[0]).unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("Nothing was deleted"), "{err}");
    assert!(
        head(&d, &victim).is_some(),
        "the other sink's object is untouched"
    );
}

/// A bucket that went away mid-call (an endpoint that takes connections and
/// never answers) holds a call for the client's whole timeout; a caller who
/// gives the call up (Flink cancelling the task: `twopc_core::interrupt`)
/// gets an error within a fraction of a second instead. Needs no S3 server.
#[test]
fn a_call_waiting_on_a_silent_endpoint_is_given_up_when_the_caller_asks() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for connection in listener.incoming() {
            held.push(connection);
        }
    });
    let mut o = options(&format!("http://{addr}"));
    o.request_timeout_ms = 60_000;
    o.retry_timeout_ms = 120_000;
    let mut d = ObjectStoreDestination::open(o, &sink()).unwrap();
    // The check is a plain function: the start it measures from is kept
    // in a thread-local.
    thread_local! {
        static STARTED: std::cell::Cell<Option<std::time::Instant>> =
            const { std::cell::Cell::new(None) };
    }
    fn after_300_ms() -> bool {
        STARTED.with(|s| {
            s.get()
                .is_some_and(|t| t.elapsed() >= Duration::from_millis(300))
        })
    }
    let started = std::time::Instant::now();
    STARTED.with(|s| s.set(Some(started)));
    let err = twopc_core::interrupt::with_check(after_300_ms, || d.staged()).unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind, DestinationErrorKind::Io, "{err}");
    assert!(err.message.contains("interrupted"), "{err}");
    assert!(
        waited < Duration::from_secs(5),
        "given up after {waited:?}, not at the client's timeout"
    );
    // A write (its upload starts with CreateMultipartUpload) likewise.
    let started = std::time::Instant::now();
    STARTED.with(|s| s.set(Some(started)));
    let err =
        twopc_core::interrupt::with_check(after_300_ms, || write(&mut d, 1, &records(3, 10, 1)))
            .unwrap_err();
    assert!(err.message.contains("interrupted"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A transaction prepared before the sink's part suffix changed (a restore
/// with new options) is still this sink's: the fresh start's check, the
/// lingering cleanup and the retention must see it under the name its
/// marker holds, and its commit still publishes it under that name (found
/// by review: listing, abort and expiry looked only under today's names,
/// so a completed checkpoint's leftover could be skipped silently).
#[test]
fn transactions_prepared_under_earlier_part_names_are_listed_aborted_and_expired() {
    let endpoint = server!();
    let mut before = options(&endpoint);
    before.part_suffix = ".txt".into();
    let mut d = open(&before);
    let recs = records(4, 10, 3);
    let kept = stage(&mut d, 1, 3, &recs);
    let aborted = stage(&mut d, 2, 3, &recs);
    let expired = stage(&mut d, 3, 3, &recs);
    let old_key = |seq: u64| d.layout().part_key(&txn(seq));
    let old_keys = [old_key(1), old_key(2), old_key(3)];
    drop(d);

    let mut after = before.clone();
    after.part_suffix = String::new();
    let mut d = ObjectStoreDestination::open(after, &sink()).unwrap();
    assert_ne!(d.layout().part_key(&txn(1)), old_keys[0]);
    let mut staged: Vec<_> = d
        .staged()
        .unwrap()
        .into_iter()
        .map(|t| (t.transaction, matches!(t.state, StagedState::Prepared(_))))
        .collect();
    staged.sort();
    assert_eq!(
        staged,
        vec![(txn(1), true), (txn(2), true), (txn(3), true)],
        "listed as prepared under their earlier names"
    );

    assert_eq!(d.abort(&aborted.transaction).unwrap(), AbortStatus::Aborted);
    d.expire(&expired.transaction, 1_700_000_000_000).unwrap();
    let listed = |d: &ObjectStoreDestination, key: &str| {
        d.block_on(d.api().list_multipart_uploads(key))
            .unwrap()
            .len()
    };
    assert_eq!(listed(&d, &old_keys[1]), 0, "the aborted upload is gone");
    assert_eq!(listed(&d, &old_keys[2]), 0, "the expired upload is gone");
    assert_eq!(listed(&d, &old_keys[0]), 1, "the other one is untouched");
    let left: Vec<_> = d
        .staged()
        .unwrap()
        .into_iter()
        .map(|t| t.transaction)
        .collect();
    assert_eq!(left, vec![txn(1)]);

    // Its commit publishes it under the name it was staged with.
    assert_eq!(d.commit(&kept, 10).unwrap(), CommitStatus::Committed);
    assert!(head(&d, &old_keys[0]).is_some());
    assert!(d.staged().unwrap().is_empty());

    // Listed, then committed by another destination (its marker goes), then
    // aborted by the lister: the abort finds it committed, never "not
    // found" (found by review: that would count as aborted).
    let mut earlier = ObjectStoreDestination::open(before.clone(), &sink()).unwrap();
    let raced = stage(&mut earlier, 4, 5, &recs);
    assert_eq!(d.staged().unwrap().len(), 1);
    assert_eq!(earlier.commit(&raced, 11).unwrap(), CommitStatus::Committed);
    // Another listing in between (a start's checks list more than once).
    assert!(d.staged().unwrap().is_empty());
    assert_eq!(
        d.abort(&raced.transaction).unwrap(),
        AbortStatus::WasCommitted
    );
    assert_eq!(object(&earlier, 4), Some(lines(&recs)), "untouched");
}

/// Two sinks in one prefix whose part names read as each other's: sink
/// `orders` under the part prefix `part-t` names its objects
/// `part-t-orders.…`, which is also how sink `t-orders` under `part` names
/// its own. A prepared upload of `orders` has no marker of `t-orders`, so
/// `t-orders` listed it as an open transaction of its own, and its
/// lingering cleanup aborted it: a completed checkpoint's output of
/// `orders` was lost (found by review). Now an upload without a marker of
/// the sink, whose name another sink that has run in the prefix could have
/// given it, is left to that sink.
#[test]
fn a_prepared_upload_of_a_sink_whose_names_read_as_anothers_is_left_alone() {
    let endpoint = server!();
    let mut victim_opts = options(&endpoint);
    victim_opts.part_prefix = "part-t".into();
    let mut victim = open(&victim_opts);
    let recs = records(3, 10, 5);
    let h = stage(&mut victim, 1, 3, &recs);

    let mut other_opts = victim_opts.clone();
    other_opts.part_prefix = "part".into();
    let other_sink = twopc_core::SinkId::new("t-orders").unwrap();
    let mut other = ObjectStoreDestination::open(other_opts, &other_sink).unwrap();
    let misread = twopc_core::ids::TransactionId::compose(&other_sink, 0, 0xabcd, 1);
    assert_eq!(
        other.layout().part_key(&misread),
        victim.layout().part_key(&txn(1)),
        "the two sinks name this object alike"
    );
    let staged = other.staged().unwrap();
    assert!(
        staged.iter().all(|t| t.transaction != misread),
        "another sink's prepared upload listed as this sink's: {staged:?}"
    );
    // What a lingering cleanup would have done had it been listed: the
    // victim's upload must survive until its commit.
    assert_eq!(victim.commit(&h, 10).unwrap(), CommitStatus::Committed);
    assert_eq!(object(&victim, 1), Some(lines(&recs)));

    // Names that only could collide do not hide a sink's own uploads:
    // `part-eu-orders.…` reads as sink `orders`'s under `part-eu` too, but
    // `orders` prepared no such transaction, so `eu-orders` still lists its
    // own open upload (and its lingering cleanup may abort it).
    let mut eu_opts = victim_opts.clone();
    eu_opts.part_prefix = "part".into();
    let eu_sink = twopc_core::SinkId::new("eu-orders").unwrap();
    let mut eu = ObjectStoreDestination::open(eu_opts.clone(), &eu_sink).unwrap();
    let own = twopc_core::ids::TransactionId::compose(&eu_sink, 0, 0xabcd, 1);
    let mut buf = RecordBatchBuf::terminated_by(b'\n');
    buf.push(b"x");
    eu.write(&own, buf.batch()).unwrap();
    // The attempt dies; the next one lists what it left.
    drop(eu);
    let mut eu = ObjectStoreDestination::open(eu_opts, &eu_sink).unwrap();
    let staged = eu.staged().unwrap();
    assert!(
        staged
            .iter()
            .any(|t| t.transaction == own && t.state == StagedState::Open),
        "its own open upload is listed: {staged:?}"
    );
    assert_eq!(eu.abort(&own).unwrap(), AbortStatus::Aborted);
}

/// On such a server the sink would see none of its staged transactions:
/// a fresh start's check, the lingering cleanup and the retention would
/// pass a completed checkpoint's prepared transaction over in silence. The
/// first listing that meets one says so and stops, changing nothing.
#[test]
fn a_server_that_lists_uploads_by_exact_key_only_is_refused_not_trusted() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d = open(&o);
    let recs = records(3, 10, 6);
    let h = stage(&mut d, 1, 3, &recs);
    // A server that lists multipart uploads only for an exact key, as MinIO
    // does (minio/minio#20989): a listing by a prefix that is not a whole
    // key answers no upload.
    let by_exact_key_only = AnswerTo::every(
        |r| {
            let prefix = r
                .query
                .split('&')
                .find_map(|kv| kv.strip_prefix("prefix="))
                .unwrap_or("");
            r.call == S3Call::ListUploads && prefix.ends_with('.')
        },
        FaultAction::Answer(
            "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>\
             </ListMultipartUploadsResult>"
                .to_string(),
        ),
    );
    let mut quirky = open_answering(&o, by_exact_key_only);
    let err = quirky.staged().unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
    for part in [
        h.transaction.as_str(),
        "by exact key only",
        "Nothing was changed",
    ] {
        assert!(err.message.contains(part), "{part} not in: {err}");
    }
    // Untouched: the compliant server's sink commits it.
    assert_eq!(d.commit(&h, 10).unwrap(), CommitStatus::Committed);
    assert_eq!(object(&d, 1), Some(lines(&recs)));
}

/// Subtasks of a restore record the run's lineage at once: a create that
/// meets another's create still under way (409), and finds nothing to read
/// yet, is retried, not taken for damaged control data (which stopped the
/// job for good).
#[test]
fn a_run_lineage_record_being_written_by_another_subtask_is_retried_not_corrupt() {
    let endpoint = server!();
    let o = options(&endpoint);
    let run = RunId::new("job-lineage-race").unwrap();
    // 409 ConditionalRequestConflict (what S3 says to a conditional create
    // while another is under way) to the creation of a run's record.
    let mut racing = open_answering(
        &o,
        AnswerTo::every(
            |r| r.call == S3Call::PutObject && r.path.contains(&format!("/{RUNS}/")),
            AnswerTo::error(409, "ConditionalRequestConflict"),
        ),
    );
    let err = racing.record_run_lineage(&run, LineageId(11)).unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Io, "{err}");
    assert!(err.message.contains("being written"), "{err}");
    drop(racing);
    let mut d = open(&o);
    d.record_run_lineage(&run, LineageId(11)).unwrap();
    assert_eq!(d.run_lineage(&run).unwrap(), Some(LineageId(11)));
}

/// A 409 to the overwrite of a prepared marker wrote nothing: the prepare
/// fails and the transaction is never listed as prepared (a 409 was read as
/// "already there", and the prepare counted a marker that did not exist).
#[test]
fn a_conflict_answered_to_a_markers_put_fails_the_prepare() {
    let endpoint = server!();
    let o = options(&endpoint);
    drop(open(&o)); // makes the bucket
                    // 409 OperationAborted to the PUT of every prepared marker.
    let mut d = open_answering(
        &o,
        AnswerTo::every(
            |r| r.call == S3Call::PutObject && r.path.contains(&format!("/{PREPARED}/")),
            AnswerTo::error(409, "OperationAborted"),
        ),
    );
    let recs = records(2, 10, 7);
    write(&mut d, 1, &recs).unwrap();
    let h = handle(1, Some(1), &recs);
    let err = d.prepare(&h).unwrap_err();
    assert!(err.message.contains("writing"), "{err}");
    drop(d);
    let mut d = open(&o);
    let staged = d.staged().unwrap();
    assert!(
        staged
            .iter()
            .all(|s| s.transaction != h.transaction || s.prepared().is_none()),
        "{staged:?}"
    );
}

/// Credentials that may not list multipart uploads are a configuration
/// error (`NotPermitted`: the job stops saying what to grant), not an I/O
/// error a restart would meet again and again.
#[test]
fn a_refused_listing_of_uploads_says_what_to_grant_and_is_not_retried() {
    let endpoint = server!();
    let o = options(&endpoint);
    drop(open(&o)); // makes the bucket
                    // 403 AccessDenied to every listing of multipart uploads.
    let mut d = open_answering(
        &o,
        AnswerTo::every(
            |r| r.call == S3Call::ListUploads,
            AnswerTo::error(403, "AccessDenied"),
        ),
    );
    let err = d.staged().unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
    assert!(
        err.message.contains("s3:ListBucketMultipartUploads"),
        "{err}"
    );
}

/// A server that honours If-None-Match or If-Match on PUT no longer (as
/// older S3-compatible releases and some gateways): the `n`-th PUT of a
/// start-up probe object is answered 200 without being sent.
#[derive(Debug)]
struct IgnoresConditionOfProbePut {
    n: usize,
    seen: Mutex<usize>,
}

impl RequestFaults for IgnoresConditionOfProbePut {
    fn decide(&self, request: &RequestInfo) -> FaultAction {
        if request.call != S3Call::PutObject || !request.path.contains("/probes/") {
            return FaultAction::Proceed;
        }
        let mut seen = self.seen.lock().unwrap();
        *seen += 1;
        if *seen == self.n {
            FaultAction::Answer(String::new())
        } else {
            FaultAction::Proceed
        }
    }
}

/// Leases, commit records and the history index rely on conditional
/// writes. The start-up check passes on a server that honours them and
/// leaves nothing behind; one that ignores If-None-Match (a second create
/// succeeds) or If-Match (an update naming another ETag succeeds) is
/// refused by name, before anything else is written.
#[test]
fn a_server_that_ignores_conditional_writes_is_refused_at_start() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d = open(&o);
    d.check_conditional_writes().unwrap();
    assert!(names_in(&d, "probes").is_empty(), "the probe is removed");
    for (n, header) in [(2, "If-None-Match"), (3, "If-Match")] {
        let hook = Arc::new(IgnoresConditionOfProbePut {
            n,
            seen: Mutex::new(0),
        });
        let mut quirky =
            ObjectStoreDestination::open_with_faults(o.clone(), &sink(), hook).unwrap();
        let err = quirky.check_conditional_writes().unwrap_err();
        assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
        assert!(err.message.contains(header), "{header}: {err}");
    }
}

/// A key the store's client cannot read as a path (here an empty segment,
/// put by another tool) in a control area: every listing of that area
/// failed as I/O, at every start again, naming nothing. Now it is damaged
/// control data, named, and the job stops saying what to move.
#[test]
fn a_key_that_is_no_valid_path_in_a_control_area_is_named_not_retried() {
    let endpoint = server!();
    let o = options(&endpoint);
    let mut d = open(&o);
    stage(&mut d, 1, 1, &records(2, 10, b'a'));
    // An unsigned PUT straight to the server (the client refuses to make
    // such a key): moto takes it as S3 would.
    let bucket = d.layout().bucket.clone();
    let key = format!("{}stray//x", d.layout().area("prepared"));
    let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(authority).unwrap();
    use std::io::{Read, Write};
    write!(
        stream,
        "PUT /{bucket}/{key} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let err = d.staged().unwrap_err();
    assert_eq!(
        err.kind,
        twopc_core::error::DestinationErrorKind::Corrupt,
        "{err}"
    );
    assert!(err.message.contains("not a valid object path"), "{err}");
    assert!(err.message.contains(&d.layout().area("prepared")), "{err}");
}

/// A committed transaction whose prepare marker was left behind (its
/// commit's tidying failed): the next listing removes it. Before, nothing
/// ever did, and every listing read it and its commit record again.
#[test]
fn a_leftover_marker_of_a_committed_transaction_is_removed_by_the_next_listing() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let h = stage(&mut d, 1, 1, &records(2, 10, b'a'));
    let marker = d.layout().control("prepared", h.transaction.as_str());
    let bytes = get_raw(&d, &marker).expect("the prepare marker");
    assert_eq!(d.commit(&h, 5).unwrap(), CommitStatus::Committed);
    assert_eq!(get_raw(&d, &marker), None, "the commit tidied it");
    put_raw(&d, &marker, &bytes);

    assert!(d.staged().unwrap().is_empty());
    assert_eq!(get_raw(&d, &marker), None, "the listing removed it");
    assert_eq!(d.commit(&h, 6).unwrap(), CommitStatus::AlreadyCommitted);
}

/// A throttled listing of multipart uploads is retried as the client's own
/// requests are (before, one 503 failed the listing, and with it the start
/// or a commit attempt); with no retries configured it fails as before.
#[test]
fn a_throttled_listing_of_uploads_is_retried() {
    let endpoint = server!();
    let mut o = options(&endpoint);
    let mut d = open(&o);
    let h = stage(&mut d, 1, 1, &records(2, 10, b'a'));
    drop(d);
    // The first listings throttled (503 SlowDown), as S3 does when every
    // subtask of a restore lists at once.
    let throttled = |n| {
        AnswerTo::first(
            n,
            |r| r.call == S3Call::ListUploads,
            AnswerTo::error(503, "SlowDown"),
        )
    };
    o.max_retries = 3;
    let faults = throttled(2);
    let mut d = open_answering(&o, faults.clone());
    let staged = d.staged().unwrap();
    assert_eq!(staged.len(), 1);
    assert_eq!(staged[0].transaction, h.transaction);
    assert!(faults.seen() >= 3, "listed again after the throttling");

    o.max_retries = 0;
    let mut d = open_answering(&o, throttled(1));
    let err = d.staged().unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Io, "{err}");
    assert!(err.message.contains("SlowDown"), "{err}");
}

/// Read as S3's, such a rule looked disabled and passed unchecked, though
/// it may abort prepared uploads after a day: refused, saying why.
#[test]
fn lifecycle_rules_in_another_form_than_s3s_are_refused_not_passed() {
    let endpoint = server!();
    let o = options(&endpoint);
    drop(open(&o));
    // Lifecycle rules in another service's form: GCS's XML API answers its
    // own (`Action`/`Condition`, no `Status`).
    let mut d = open_answering(
        &o,
        AnswerTo::every(
            |r| r.query.starts_with("lifecycle"),
            FaultAction::Answer(
                "<LifecycleConfiguration><Rule><Action><AbortIncompleteMultipartUpload/>\
                 </Action><Condition><Age>1</Age></Condition></Rule></LifecycleConfiguration>"
                    .to_string(),
            ),
        ),
    );
    let err = d.check_lifecycle(2 * 86_400_000).unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
    assert!(err.message.contains("without a Status"), "{err}");
    assert!(err.message.contains("Nothing was changed"), "{err}");
}

/// Refused by name, as a server that ignores the header is; before, it was
/// an I/O error, and every subtask restarted forever.
#[test]
fn a_server_that_does_not_implement_conditional_writes_is_refused_by_name() {
    let endpoint = server!();
    let o = options(&endpoint);
    drop(open(&o));
    // The probe's conditional create answered 501 NotImplemented (S3's
    // answer to a header it does not support).
    let mut d = open_answering(
        &o,
        AnswerTo::every(
            |r| r.call == S3Call::PutObject && r.path.contains("/probes/"),
            AnswerTo::error(501, "NotImplemented"),
        ),
    );
    let err = d.check_conditional_writes().unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
    assert!(
        err.message
            .contains("does not implement a create with If-None-Match"),
        "{err}"
    );
}
