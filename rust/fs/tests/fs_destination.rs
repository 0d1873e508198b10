//! The filesystem destination against a real directory: invisibility of
//! staged data, durable and repeatable commit, loss detection, retraction,
//! expiry, damaged files and a full disk.

use std::fs;
use std::path::{Path, PathBuf};

use twopc_core::destination::{AbortStatus, CommitStatus, Destination};
use twopc_core::envelope::PayloadKind;
use twopc_core::error::DestinationErrorKind;
use twopc_core::handle::{
    encode_payload, HandleError, PreparedInfo, TransactionHandle, TransactionState,
};
use twopc_core::ids::{random_u64, LineageId, RunId, SinkId, TransactionId};
use twopc_core::records::{push_record, RecordBatch};
use twopc_fs::{
    decode_control_file, CommitRecord, ControlFile, FsDestination, FsOptions, PreparedMarker,
    RecordFormat,
};

struct TempDir(PathBuf);
impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("twopc-fs-{name}-{:016x}", random_u64()));
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn sink() -> SinkId {
    SinkId::new("clicks").unwrap()
}

fn dest(dir: &Path) -> FsDestination {
    FsDestination::open(FsOptions::new(dir), &sink()).unwrap()
}

fn handle(seq: u64, checkpoint: Option<u64>, records: u64) -> TransactionHandle {
    TransactionHandle {
        transaction: TransactionId::compose(&sink(), 0, 0xabcdef, seq),
        sink: sink(),
        lineage: LineageId(7),
        run: RunId::new("job1").unwrap(),
        subtask: 0,
        parallelism: 1,
        begun_at_ms: 0,
        state: match checkpoint {
            Some(c) => TransactionState::Prepared(PreparedInfo {
                checkpoint: c,
                records,
                bytes: 0,
                prepared_at_ms: 0,
            }),
            None => TransactionState::Open,
        },
    }
}

fn stage(d: &mut FsDestination, seq: u64, checkpoint: u64, records: &[&str]) -> TransactionHandle {
    let open = handle(seq, None, 0);
    d.begin(&open).unwrap();
    let mut buf = Vec::new();
    for r in records {
        push_record(&mut buf, r.as_bytes());
    }
    d.write(&open.transaction, RecordBatch::parse(&buf).unwrap())
        .unwrap();
    let p = handle(seq, Some(checkpoint), records.len() as u64);
    d.prepare(&p).unwrap();
    p
}

/// Names a reader of the output directory would see (hidden ones skipped).
fn visible_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('_') && !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

#[test]
fn staged_data_is_hidden_and_commit_publishes_one_file() {
    let t = TempDir::new("publish");
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 3, &["a", "b"]);
    assert!(visible_files(&t.0).is_empty());
    let staged = d.staged().unwrap();
    assert_eq!(staged.len(), 1);
    assert_eq!(staged[0].prepared.as_ref().unwrap(), &h);

    assert_eq!(d.commit(&h, 5).unwrap(), CommitStatus::Committed);
    let files = visible_files(&t.0);
    assert_eq!(files, vec![format!("part-{}", h.transaction)]);
    assert_eq!(fs::read_to_string(t.0.join(&files[0])).unwrap(), "a\nb\n");
    assert!(d.staged().unwrap().is_empty());
    assert_eq!(d.commit(&h, 6).unwrap(), CommitStatus::AlreadyCommitted);
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::NotFound);
    assert_eq!(fs::read_to_string(t.0.join(&files[0])).unwrap(), "a\nb\n");
}

#[test]
fn a_commit_interrupted_after_its_record_is_finished_by_the_retry() {
    let t = TempDir::new("interrupted");
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 3, &["x"]);
    let staging = d.layout().staging_dir(&h.transaction);
    let saved = t.0.join("saved-staging");
    copy_dir(&staging, &saved);
    d.commit(&h, 5).unwrap();
    // Put the state back to "record written, data not yet renamed".
    let visible = t.0.join(format!("part-{}", h.transaction));
    fs::remove_file(&visible).unwrap();
    copy_dir(&saved, &staging);
    fs::remove_dir_all(&saved).unwrap();

    assert_eq!(d.commit(&h, 6).unwrap(), CommitStatus::AlreadyCommitted);
    assert_eq!(fs::read_to_string(&visible).unwrap(), "x\n");
    assert!(!staging.exists());
    // And an abort of that state would never have undone the decided commit.
}

#[test]
fn abort_refuses_to_undo_a_decided_commit() {
    let t = TempDir::new("abort-decided");
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 3, &["x"]);
    let staging = d.layout().staging_dir(&h.transaction);
    let saved = t.0.join("saved-staging");
    copy_dir(&staging, &saved);
    d.commit(&h, 5).unwrap();
    fs::remove_file(t.0.join(format!("part-{}", h.transaction))).unwrap();
    copy_dir(&saved, &staging);
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::WasCommitted);
    assert!(staging.exists());
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
                evidence.contains("retention") && evidence.contains("1234"),
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

#[test]
fn abort_is_repeatable() {
    let t = TempDir::new("abort");
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 3, &["x"]);
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::Aborted);
    assert_eq!(d.abort(&h.transaction).unwrap(), AbortStatus::NotFound);
    assert!(d.staged().unwrap().is_empty());
    // An open transaction that was written to is aborted as well.
    let open = handle(2, None, 0);
    d.begin(&open).unwrap();
    let mut buf = Vec::new();
    push_record(&mut buf, b"z");
    d.write(&open.transaction, RecordBatch::parse(&buf).unwrap())
        .unwrap();
    assert_eq!(d.staged().unwrap()[0].prepared, None);
    assert_eq!(d.abort(&open.transaction).unwrap(), AbortStatus::Aborted);
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
fn damaged_control_files_give_clear_errors() {
    let t = TempDir::new("damaged");
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 1, &["x"]);
    let marker = d.layout().staging_dir(&h.transaction).join("prepared");
    fs::write(&marker, b"garbage").unwrap();
    let err = d.staged().unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Corrupt);
    assert!(
        err.message.contains("prepared") && err.message.contains("twopc inspect"),
        "{err}"
    );
    // Foreign names in the staging area are ignored, not parsed as ours,
    // even a file that is named like a transaction.
    fs::write(
        d.layout()
            .staging
            .join(format!("{}", TransactionId::compose(&sink(), 0, 1, 1))),
        b"x",
    )
    .unwrap();
    fs::write(t.0.join("_twopc").join("stray-file"), b"x").unwrap();
    assert_eq!(
        twopc_fs::Layout::sinks_in(&t.0).unwrap(),
        vec![sink()],
        "a file under _twopc is not a sink"
    );
    fs::write(d.layout().staging.join("notes.txt"), b"hi").unwrap();
    fs::write(&marker, b"garbage").unwrap();
    fs::remove_dir_all(d.layout().staging_dir(&h.transaction)).unwrap();
    assert!(d.staged().unwrap().is_empty());
}

/// Found by the fuzz harness (`rust/fuzz`): control files were decoded
/// without the checks a restored handle gets, and a commit record's file
/// was joined to the output directory as it stood, so a forged record made
/// `retract` remove a file outside it.
#[test]
fn forged_control_files_are_refused_and_retract_stays_in_the_output_directory() {
    let t = TempDir::new("forged");
    let out = t.0.join("out");
    fs::create_dir_all(&out).unwrap();
    let victim = t.0.join("victim");
    fs::write(&victim, b"not twopc's").unwrap();
    let mut d = dest(&out);
    let h = stage(&mut d, 1, 1, &["x"]);
    d.commit(&h, 1).unwrap();
    let committed = d.committed_after(LineageId(7), 0).unwrap();
    assert_eq!(committed.len(), 1);
    let record = |file: &str, handle: TransactionHandle| {
        encode_payload(
            PayloadKind::Manifest,
            &ControlFile::Committed(CommitRecord {
                handle,
                file: Some(file.to_string()),
                data_len: 1,
                committed_at_ms: 0,
            }),
        )
    };
    fs::write(
        d.layout().commit_record_path(&h, 1),
        record("../victim", h.clone()),
    )
    .unwrap();
    let err = d.retract(&committed[0]).unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Corrupt, "{err}");
    assert!(victim.exists(), "retract removed a file outside the output");

    let invalid = |bytes: &[u8]| matches!(decode_control_file(bytes), Err(HandleError::Invalid(_)));
    for file in [
        "/etc/passwd",
        "../x",
        "a/b",
        ".hidden",
        "_twopc",
        "",
        "a\\b",
    ] {
        assert!(invalid(&record(file, h.clone())), "file {file:?} accepted");
    }
    assert!(
        decode_control_file(&record(&format!("part-{}.txt", h.transaction), h.clone())).is_ok()
    );
    let mut outside = h.clone();
    outside.subtask = 3;
    outside.transaction = TransactionId::compose(&sink(), 3, 0xabcdef, 1);
    let mut foreign = h.clone();
    foreign.transaction = TransactionId::compose(&SinkId::new("other").unwrap(), 0, 1, 1);
    for bad in [outside, foreign] {
        let marker = ControlFile::Prepared(PreparedMarker {
            handle: bad.clone(),
            data_len: 1,
        });
        assert!(invalid(&encode_payload(PayloadKind::Manifest, &marker)));
        assert!(invalid(&record("part-x", bad)));
    }
}

/// Found by the fuzz harness: the number parsers took `+`, upper-case hex
/// and leading zeros, so one record had many names, and `retract`, which
/// looks a record up by the name twopc writes, missed the others.
#[test]
fn commit_record_names_have_one_spelling() {
    let txn = TransactionId::compose(&sink(), 0, 0xabcdef, 1);
    let name = twopc_fs::Layout::commit_record_name(LineageId(0xabc), 12, &txn);
    assert_eq!(name, format!("0000000000000abc-12-{txn}"));
    assert_eq!(
        twopc_fs::Layout::parse_commit_record_name(&name),
        Some((LineageId(0xabc), 12, txn.clone()))
    );
    for other in [
        format!("0000000000000ABC-12-{txn}"),
        format!("+000000000000abc-12-{txn}"),
        format!("0000000000000abc-012-{txn}"),
        format!("0000000000000abc-+12-{txn}"),
    ] {
        assert_eq!(
            twopc_fs::Layout::parse_commit_record_name(&other),
            None,
            "{other}"
        );
    }
}

#[test]
fn a_full_disk_is_reported_as_such_and_loses_nothing_committed() {
    if !Path::new("/dev/full").exists() {
        eprintln!("skipping: this system has no /dev/full to simulate a full disk");
        return;
    }
    let t = TempDir::new("full");
    let mut d = dest(&t.0);
    let kept = stage(&mut d, 1, 1, &["kept"]);
    d.commit(&kept, 1).unwrap();
    let open = handle(2, None, 0);
    let staging = d.layout().staging_dir(&open.transaction);
    fs::create_dir_all(&staging).unwrap();
    std::os::unix::fs::symlink("/dev/full", staging.join("data")).unwrap();
    d.begin(&open).unwrap();
    // Several MiB: the write goes through whole chunks (direct I/O, on the
    // I/O thread) as well as the tail written at prepare.
    let mut buf = Vec::new();
    for _ in 0..6 {
        push_record(&mut buf, &vec![b'x'; 512 * 1024]);
    }
    let write = d.write(&open.transaction, RecordBatch::parse(&buf).unwrap());
    let err = match write {
        Err(e) => e,
        Ok(()) => d.prepare(&handle(2, Some(2), 6)).unwrap_err(),
    };
    assert_eq!(err.kind, DestinationErrorKind::StorageFull, "{err}");
    assert!(err.message.contains("disk is full"), "{err}");
    assert_eq!(
        fs::read_to_string(t.0.join(format!("part-{}", kept.transaction))).unwrap(),
        "kept\n"
    );
}

#[test]
fn a_transaction_of_many_mib_is_published_byte_for_byte_also_after_a_restart() {
    let t = TempDir::new("large");
    // Records of odd sizes, so that records straddle the direct-I/O chunk
    // boundaries, and numbered, so that a misplaced chunk shows.
    let records: Vec<String> = (0..60_000)
        .map(|i| format!("{i:08}-{}", "y".repeat(i % 173)))
        .collect();
    let expected: String = records.iter().map(|r| format!("{r}\n")).collect();
    assert!(expected.len() > 5 * 1024 * 1024, "large enough");

    let mut d = dest(&t.0);
    let open = handle(1, None, 0);
    d.begin(&open).unwrap();
    for chunk in records.chunks(4096) {
        let mut buf = Vec::new();
        for r in chunk {
            push_record(&mut buf, r.as_bytes());
        }
        d.write(&open.transaction, RecordBatch::parse(&buf).unwrap())
            .unwrap();
    }
    let h = handle(1, Some(1), records.len() as u64);
    d.prepare(&h).unwrap();
    // The process "dies" after the prepare; a new one commits.
    drop(d);
    let mut d = dest(&t.0);
    assert_eq!(d.commit(&h, 2).unwrap(), CommitStatus::Committed);
    let published = fs::read_to_string(t.0.join(format!("part-{}", h.transaction))).unwrap();
    assert_eq!(published.len(), expected.len());
    assert!(published == expected, "published content differs");
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
        assert!(
            FsDestination::open(opts, &sink()).is_err(),
            "{prefix:?} {suffix:?}"
        );
    }
    let opts = FsOptions {
        part_suffix: ".txt".into(),
        format: RecordFormat::Raw,
        ..FsOptions::new(&t.0)
    };
    let mut d = FsDestination::open(opts, &sink()).unwrap();
    let h = stage(&mut d, 1, 1, &["ab", "cd"]);
    d.commit(&h, 1).unwrap();
    let name = format!("part-{}.txt", h.transaction);
    assert_eq!(fs::read_to_string(t.0.join(name)).unwrap(), "abcd");
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}
