//! Hostile bytes and planted links in every place the filesystem
//! destination reads back: nothing outside the output directory is ever
//! written, published, overwritten or deleted, and every refusal says what
//! it found.

mod common;

use std::fs;
use std::os::unix::fs::symlink;

use common::*;
use twopc_core::destination::{CommitStatus, Destination, StagedState};
use twopc_core::envelope::PayloadKind;
use twopc_core::error::DestinationErrorKind;
use twopc_core::handle::encode_payload;
use twopc_core::ids::LineageId;
use twopc_fs::{commit_record_name, CommitRecord, ControlFile, PreparedMarker};

fn forge(file: &ControlFile) -> Vec<u8> {
    encode_payload(PayloadKind::Manifest, file)
}

#[test]
fn a_link_planted_at_the_next_staging_directory_is_never_followed() {
    let t = TempDir::new("link-staging");
    let outside = TempDir::new("outside");
    let mut d = dest(&t.0);
    let staging = d.layout().staging_dir(&txn(1));
    symlink(&outside.0, &staging).unwrap();
    let err = write(&mut d, 1, &["secret"]).unwrap_err();
    assert!(
        err.message.contains(staging.to_str().unwrap()),
        "the error names the path: {err}"
    );
    assert!(
        fs::read_dir(&outside.0).unwrap().next().is_none(),
        "nothing was written through the link"
    );
}

#[test]
fn a_link_planted_at_the_data_file_is_never_followed() {
    let t = TempDir::new("link-data");
    let outside = TempDir::new("outside");
    let target = outside.0.join("victim");
    fs::write(&target, b"keep").unwrap();
    let mut d = dest(&t.0);
    // The staging directory of a transaction exists already (someone
    // created it and put a link inside): the sink refuses to use it.
    let staging = d.layout().staging_dir(&txn(1));
    fs::create_dir_all(&staging).unwrap();
    symlink(&target, staging.join("data")).unwrap();
    write(&mut d, 1, &["x"]).unwrap_err();
    assert_eq!(fs::read(&target).unwrap(), b"keep");
}

#[test]
fn a_linked_control_directory_is_refused_at_open() {
    let t = TempDir::new("link-control");
    let outside = TempDir::new("outside");
    symlink(&outside.0, t.0.join("_twopc")).unwrap();
    let err = twopc_fs::FsDestination::open(twopc_fs::FsOptions::new(&t.0), &sink())
        .err()
        .expect("refused");
    assert!(err.message.contains("_twopc"), "{err}");
    assert!(fs::read_dir(&outside.0).unwrap().next().is_none());
}

#[test]
fn an_existing_file_at_the_visible_name_is_never_overwritten() {
    for (order, options) in commit_orders(&TempDir::new("occupied").0) {
        let t = TempDir::new("occupied");
        let options = twopc_fs::FsOptions {
            output_dir: t.0.clone(),
            ..options
        };
        let mut d = twopc_fs::FsDestination::open(options, &sink()).unwrap();
        let h = stage(&mut d, 1, 1, &["ours"]);
        fs::write(part(&t.0, 1), b"theirs").unwrap();
        let err = d.commit(&h, 1).unwrap_err();
        assert!(
            err.message.contains("refusing to publish over")
                && err.message.contains(part(&t.0, 1).to_str().unwrap()),
            "{order}: {err}"
        );
        assert_eq!(fs::read(part(&t.0, 1)).unwrap(), b"theirs", "{order}");
        // Once the operator moves it away, the decided (claimed) commit
        // publishes. Durable-first refused after its record, visible-first
        // before it.
        fs::rename(part(&t.0, 1), t.0.join("moved")).unwrap();
        let expected = if order == "visible-first" {
            assert!(matches!(
                &d.staged().unwrap()[..],
                [s] if matches!(s.state, twopc_core::destination::StagedState::Committing(_))
            ));
            CommitStatus::Committed
        } else {
            CommitStatus::AlreadyCommitted
        };
        assert_eq!(d.commit(&h, 2).unwrap(), expected, "{order}");
        assert_eq!(fs::read(part(&t.0, 1)).unwrap(), b"ours\n", "{order}");
    }
}

/// A visible-first commit linked the output under the sink's file names
/// then, and was interrupted; the sink restarts with other names. The
/// commit must not publish the same data under a second name (the output
/// twice): it stops, naming the data and how to find its other name.
#[test]
fn staged_data_published_under_other_names_is_never_published_twice() {
    let t = TempDir::new("renamed");
    let mut d = twopc_fs::FsDestination::open(visible_first(&t.0), &sink()).unwrap();
    let h = stage(&mut d, 1, 3, &["x"]);
    let layout = d.layout();
    let claimed = layout.committing.join(h.transaction.as_str());
    // The state the interruption left: claimed, linked as `orders-...`.
    fs::rename(layout.staging_dir(&h.transaction), &claimed).unwrap();
    let earlier_name = t.0.join(format!("orders-{}", h.transaction));
    fs::hard_link(claimed.join("data"), &earlier_name).unwrap();
    drop(d);

    for (order, options) in commit_orders(&t.0) {
        let mut d = twopc_fs::FsDestination::open(options, &sink()).unwrap();
        let err = d.commit(&h, 5).unwrap_err();
        assert!(
            err.message.contains(earlier_name.to_str().unwrap())
                && err.message.contains("partPrefix"),
            "{order}: {err}"
        );
        assert!(
            !part(&t.0, 1).exists(),
            "{order}: not published a second time"
        );
        assert!(claimed.join("data").exists(), "{order}");
        assert_eq!(fs::read_to_string(&earlier_name).unwrap(), "x\n");
    }
    // With its earlier names the sink finishes the commit.
    let options = twopc_fs::FsOptions {
        part_prefix: "orders".into(),
        ..visible_first(&t.0)
    };
    let mut d = twopc_fs::FsDestination::open(options, &sink()).unwrap();
    assert_eq!(d.commit(&h, 6).unwrap(), CommitStatus::Committed);
    assert_eq!(fs::read_to_string(&earlier_name).unwrap(), "x\n");
    assert!(!part(&t.0, 1).exists());
    assert!(!claimed.exists());
}

#[test]
fn a_link_at_the_visible_name_is_not_replaced_nor_followed() {
    let t = TempDir::new("occupied-link");
    let outside = TempDir::new("outside");
    let victim = outside.0.join("victim");
    fs::write(&victim, b"keep").unwrap();
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 1, &["ours"]);
    symlink(&victim, part(&t.0, 1)).unwrap();
    d.commit(&h, 1).unwrap_err();
    assert_eq!(fs::read(&victim).unwrap(), b"keep");
    assert!(fs::symlink_metadata(part(&t.0, 1))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn a_forged_commit_record_never_makes_a_rewind_delete_outside_the_output() {
    let t = TempDir::new("forged-record");
    let outside = TempDir::new("outside");
    let victim = outside.0.join("victim");
    fs::write(&victim, b"keep").unwrap();
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 2, &["x"]);
    d.commit(&h, 1).unwrap();
    let name = commit_record_name(LineageId(7), 2, &h.transaction);
    let path = d.layout().committed.join(&name);
    for file in [
        victim.to_str().unwrap().to_string(),
        format!("../{}", victim.file_name().unwrap().to_str().unwrap()),
        format!("part-{}", txn(9)),
        format!("a/part-{}", h.transaction),
    ] {
        let forged = ControlFile::Committed(CommitRecord {
            handle: h.clone(),
            file: Some(file.clone()),
            data_len: 2,
            committed_at_ms: 1,
        });
        fs::write(&path, forge(&forged)).unwrap();
        let later = d.committed_after(LineageId(7), 1);
        let err = later.unwrap_err();
        assert_eq!(err.kind, DestinationErrorKind::Corrupt, "{file}: {err}");
        assert!(
            err.message.contains("does not name") || err.message.contains("output file name"),
            "{file}: {err}"
        );
        let view = twopc_fs::committed_view(&CommitRecord {
            handle: h.clone(),
            file: Some(file.clone()),
            data_len: 2,
            committed_at_ms: 1,
        });
        d.retract(&view).unwrap_err();
        assert_eq!(fs::read(&victim).unwrap(), b"keep", "{file}");
        assert!(part(&t.0, 1).exists(), "{file}: our own output stays too");
    }
}

#[test]
fn a_commit_record_filed_under_another_name_is_refused() {
    let t = TempDir::new("misfiled");
    let mut d = dest(&t.0);
    let h1 = stage(&mut d, 1, 2, &["x"]);
    let h2 = stage(&mut d, 2, 3, &["y"]);
    d.commit(&h1, 1).unwrap();
    d.commit(&h2, 1).unwrap();
    let committed = d.layout().committed;
    // Record 2's bytes under record 1's name.
    fs::copy(
        committed.join(commit_record_name(LineageId(7), 3, &h2.transaction)),
        committed.join(commit_record_name(LineageId(7), 2, &h1.transaction)),
    )
    .unwrap();
    let err = d.committed_after(LineageId(7), 0).unwrap_err();
    assert!(err.message.contains("whose record is named"), "{err}");
}

#[test]
fn a_forged_prepare_marker_is_reported_and_never_published() {
    let t = TempDir::new("forged-marker");
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 2, &["x"]);
    let marker = d.layout().staging_dir(&h.transaction).join("prepared");
    // A marker of another sink, and one whose length does not match its
    // handle's counts.
    let mut other = h.clone();
    other.sink = twopc_core::ids::SinkId::new("other").unwrap();
    for forged in [
        ControlFile::Prepared(PreparedMarker {
            handle: other,
            data_len: 2,
        }),
        ControlFile::Prepared(PreparedMarker {
            handle: h.clone(),
            data_len: 99,
        }),
        ControlFile::Committed(CommitRecord {
            handle: h.clone(),
            file: None,
            data_len: 2,
            committed_at_ms: 0,
        }),
    ] {
        fs::write(&marker, forge(&forged)).unwrap();
        let staged = d.staged().unwrap();
        assert!(
            matches!(&staged[0].state, StagedState::PreparedUnreadable { .. }),
            "{:?}",
            staged[0].state
        );
        let err = d.commit(&h, 1).unwrap_err();
        assert_eq!(err.kind, DestinationErrorKind::Corrupt, "{err}");
        assert!(visible_files(&t.0).is_empty());
        // The claim moved it to committing/; put it back for the next case.
        let claimed = d.layout().committing.join(h.transaction.as_str());
        if claimed.exists() {
            fs::rename(&claimed, d.layout().staging_dir(&h.transaction)).unwrap();
        }
    }
}

#[test]
fn damaged_and_foreign_entries_give_clear_errors_or_are_ignored() {
    let t = TempDir::new("damaged");
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 1, &["x"]);
    let marker = d.layout().staging_dir(&h.transaction).join("prepared");
    fs::write(&marker, b"garbage").unwrap();
    let staged = d.staged().unwrap();
    match &staged[0].state {
        StagedState::PreparedUnreadable { reason } => {
            assert!(
                reason.contains("prepared") && reason.contains("twopc inspect"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    // A link where a marker belongs is not followed.
    fs::remove_file(&marker).unwrap();
    symlink("/etc/hostname", &marker).unwrap();
    assert!(matches!(
        d.staged().unwrap()[0].state,
        StagedState::PreparedUnreadable { .. }
    ));
    // Foreign names in the staging area are ignored, not parsed as ours,
    // even a file that is named like a transaction.
    fs::write(d.layout().staging_dir(&txn(5)), b"x").unwrap();
    fs::write(d.layout().staging.join("notes.txt"), b"hi").unwrap();
    symlink("/tmp", d.layout().staging_dir(&txn(6))).unwrap();
    fs::write(t.0.join("_twopc").join("stray-file"), b"x").unwrap();
    assert_eq!(
        twopc_fs::Layout::sinks_in(&t.0).unwrap(),
        vec![sink()],
        "a file under _twopc is not a sink"
    );
    let (staged, foreign) = d.scan_staged().unwrap();
    assert_eq!(staged.len(), 1);
    assert_eq!(foreign.len(), 3, "{foreign:?}");
    // A commit record that is a link, or garbage, is an error naming it.
    let committed = d.layout().committed;
    let name = commit_record_name(LineageId(7), 9, &txn(7));
    symlink("/etc/hostname", committed.join(&name)).unwrap();
    let err = d.committed_after(LineageId(7), 0).unwrap_err();
    assert!(err.message.contains(&name), "{err}");
    fs::remove_file(committed.join(&name)).unwrap();
    fs::write(committed.join(&name), b"garbage").unwrap();
    let err = d.committed_after(LineageId(7), 0).unwrap_err();
    assert!(err.message.contains("unreadable"), "{err}");
}

#[test]
fn control_file_decoders_reject_every_truncation_and_bit_flip() {
    let t = TempDir::new("decoders");
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 1, &["x"]);
    let good = forge(&ControlFile::Prepared(PreparedMarker {
        handle: h,
        data_len: 2,
    }));
    assert!(twopc_fs::decode_control_file(&good).is_ok());
    for cut in 0..good.len() {
        assert!(
            twopc_fs::decode_control_file(&good[..cut]).is_err(),
            "cut {cut}"
        );
    }
    for i in 0..good.len() {
        for bit in 0..8 {
            let mut bad = good.clone();
            bad[i] ^= 1 << bit;
            // Every flip is caught (the checksum covers every byte).
            assert!(
                twopc_fs::decode_control_file(&bad).is_err(),
                "byte {i} bit {bit}"
            );
        }
    }
}

/// A claim whose prepare marker was damaged lists as prepared and
/// unreadable: a fresh start whose policy aborts prepared leftovers must
/// not report it aborted (an abort never touches a claimed commit), but
/// stop and name it, and the claim stays for `twopc decide`.
#[test]
fn a_claimed_commit_with_a_damaged_marker_is_never_reported_aborted() {
    let t = TempDir::new("damaged-claim");
    let mut d = dest(&t.0);
    let h = stage(&mut d, 1, 5, &["x"]);
    let claimed = d.layout().committing.join(h.transaction.as_str());
    fs::rename(d.layout().staging_dir(&h.transaction), &claimed).unwrap();
    fs::write(claimed.join("prepared"), b"garbage").unwrap();
    drop(d);
    let ctx =
        twopc_core::SubtaskContext::new(sink(), twopc_core::RunId::new("job-2").unwrap(), 0, 1)
            .unwrap();
    let options = twopc_core::SinkOptions {
        fresh_start: twopc_core::FreshStartPolicy::AbortPrepared,
        owner_wait_ms: 0,
        ..Default::default()
    };
    let err = twopc_core::SubtaskSink::open(
        dest(&t.0),
        twopc_core::SystemClock,
        ctx,
        options,
        None,
        None,
    )
    .err()
    .expect("a fresh start must not take a claimed commit for an aborted leftover");
    let msg = err.to_string();
    assert!(msg.contains(h.transaction.as_str()), "{msg}");
    assert!(msg.contains("committed or being committed"), "{msg}");
    assert!(msg.contains("twopc decide --commit"), "{msg}");
    // The next start would meet it the same way: a stop, not a restart
    // (before, it was retryable, and the job restarted forever).
    assert!(err.is_fatal(), "{msg}");
    assert!(claimed.join("data").exists(), "the claim is left as it was");
    assert!(visible_files(&t.0).is_empty());
}

/// The same claim met by the lingering cleanup after a restore: the first
/// completed checkpoint's housekeeping stops the job, naming it, instead
/// of a warning at every checkpoint while the decided commit stays
/// unfinished (found by review).
#[test]
fn a_claimed_commit_with_a_damaged_marker_met_by_the_lingering_cleanup_stops_the_job() {
    let t = TempDir::new("damaged-claim-lingering");
    let mut d = dest(&t.0);
    let known = stage(&mut d, 1, 3, &["x"]);
    let h = stage(&mut d, 2, 3, &["y"]);
    let claimed = d.layout().committing.join(h.transaction.as_str());
    fs::rename(d.layout().staging_dir(&h.transaction), &claimed).unwrap();
    fs::write(claimed.join("prepared"), b"garbage").unwrap();
    drop(d);
    let ctx = twopc_core::SubtaskContext::new(sink(), known.run.clone(), 0, 1).unwrap();
    let options = twopc_core::SinkOptions {
        owner_wait_ms: 0,
        ..Default::default()
    };
    let restore = twopc_core::recovery::Restore {
        states: Vec::new(),
        checkpoint: 3,
        known: vec![known.clone()],
    };
    let (mut s, _) = twopc_core::SubtaskSink::open(
        dest(&t.0),
        twopc_core::SystemClock,
        ctx,
        options,
        Some(&restore),
        None,
    )
    .unwrap();
    s.commit(&known).unwrap();
    let err = s
        .checkpoint_completed(4)
        .expect_err("the housekeeping must stop on a decided commit it cannot resolve");
    let msg = err.to_string();
    assert!(err.is_fatal(), "{msg}");
    assert!(msg.contains(h.transaction.as_str()), "{msg}");
    assert!(msg.contains("twopc decide --commit"), "{msg}");
    assert!(claimed.join("data").exists(), "the claim is left as it was");
}

/// `part-t-clicks.0.…` is this sink's name for a transaction of sink
/// `clicks` only with the part prefix `part-t`; with the default prefix it
/// is the output of sink `t-clicks`. A forged commit record of sink
/// `clicks` naming it must not make a retraction delete the other sink's
/// committed output.
#[test]
fn a_forged_record_cannot_make_a_retraction_delete_another_sinks_output() {
    let t = TempDir::new("other-sinks-output");
    let other = twopc_core::ids::SinkId::new("t-clicks").unwrap();
    let mut od = twopc_fs::FsDestination::open(twopc_fs::FsOptions::new(&t.0), &other).unwrap();
    let other_txn = twopc_core::ids::TransactionId::compose(&other, 0, 0xabcdef, 1);
    let oh = twopc_core::handle::TransactionHandle {
        transaction: other_txn.clone(),
        sink: other.clone(),
        ..handle(1, Some(5), &["x"])
    };
    od.begin(&oh).unwrap();
    od.write(&other_txn, batch(&["x"]).batch()).unwrap();
    od.prepare(&oh).unwrap();
    assert_eq!(od.commit(&oh, 1).unwrap(), CommitStatus::Committed);
    let victim = t.0.join(format!("part-{other_txn}"));
    assert!(victim.exists());

    let mut d = dest(&t.0);
    let h = handle(1, Some(5), &["x"]);
    let forged = CommitRecord {
        handle: h.clone(),
        file: Some(format!("part-{other_txn}")),
        data_len: 2,
        committed_at_ms: 1,
    };
    let name = commit_record_name(LineageId(7), 5, &h.transaction);
    fs::write(
        d.layout().committed.join(&name),
        forge(&ControlFile::Committed(forged)),
    )
    .unwrap();
    let later = d.committed_after(LineageId(7), 4).unwrap();
    assert_eq!(later.len(), 1);
    let err = d.retract(&later[0]).unwrap_err();
    assert_eq!(err.kind, DestinationErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("Nothing was removed"), "{err}");
    assert!(victim.exists(), "the other sink's output is untouched");
}

/// A second name of staged data outside the output directory (a hard-link
/// snapshot of the tree, a backup) publishes nothing: commits in either
/// order go on, and publish once.
#[test]
fn a_hard_link_to_staged_data_outside_the_output_directory_blocks_nothing() {
    for (order, _) in commit_orders(&TempDir::new("snapshot").0) {
        let t = TempDir::new("snapshot");
        let options = commit_orders(&t.0)
            .into_iter()
            .find(|(o, _)| *o == order)
            .unwrap()
            .1;
        let mut d = twopc_fs::FsDestination::open(options, &sink()).unwrap();
        let h = stage(&mut d, 1, 3, &["x"]);
        let snapshot = TempDir::new("snapshot-copy");
        let copy = snapshot.0.join("data");
        fs::hard_link(d.layout().staging_dir(&h.transaction).join("data"), &copy).unwrap();
        assert_eq!(d.commit(&h, 5).unwrap(), CommitStatus::Committed, "{order}");
        assert_eq!(fs::read_to_string(part(&t.0, 1)).unwrap(), "x\n", "{order}");
        assert_eq!(fs::read_to_string(&copy).unwrap(), "x\n", "{order}");
    }
}

/// A visible-first link kept by a power loss without its claim, under file
/// names changed since: found by its inode, so the transaction lists as a
/// decided commit and an abort refuses it (it would leave the output
/// visible with no record); its commit stops, naming the other name.
#[test]
fn a_leftover_link_under_other_file_names_is_never_aborted() {
    let t = TempDir::new("leftover-renamed");
    let mut d = twopc_fs::FsDestination::open(visible_first(&t.0), &sink()).unwrap();
    let h = stage(&mut d, 1, 3, &["x"]);
    let earlier_name = t.0.join(format!("orders-{}", h.transaction));
    let staged = d.layout().staging_dir(&h.transaction);
    fs::hard_link(staged.join("data"), &earlier_name).unwrap();
    drop(d);
    for (order, options) in commit_orders(&t.0) {
        let mut d = twopc_fs::FsDestination::open(options, &sink()).unwrap();
        assert!(
            matches!(
                &d.staged().unwrap()[..],
                [s] if matches!(s.state, twopc_core::destination::StagedState::Committing(_))
            ),
            "{order}"
        );
        assert_eq!(
            d.abort(&h.transaction).unwrap(),
            twopc_core::destination::AbortStatus::WasCommitted,
            "{order}"
        );
        assert!(staged.join("data").exists(), "{order}");
        let err = d.commit(&h, 5).unwrap_err();
        assert!(
            err.message.contains(earlier_name.to_str().unwrap()),
            "{order}: {err}"
        );
        assert!(!part(&t.0, 1).exists(), "{order}");
        // The claim the refused commit made stays: a decided commit.
        let claimed =
            t.0.join(format!("_twopc/clicks/committing/{}", h.transaction));
        if claimed.exists() {
            fs::rename(&claimed, &staged).unwrap();
        }
    }
}

/// A visible-first commit recorded but interrupted before its staged name
/// went; a reader renamed the output meanwhile. The retry must not publish
/// the staged data a second time under the visible name: it stops, naming
/// the other name, and finishes once the file is renamed back.
#[test]
fn a_recorded_commit_whose_output_a_reader_renamed_is_never_published_twice() {
    let t = TempDir::new("renamed-after-record");
    let mut d = twopc_fs::FsDestination::open(visible_first(&t.0), &sink()).unwrap();
    let h = stage(&mut d, 1, 3, &["x"]);
    let layout = d.layout();
    let saved = t.0.join("saved");
    copy_dir(&layout.staging_dir(&h.transaction), &saved);
    assert_eq!(d.commit(&h, 5).unwrap(), CommitStatus::Committed);
    // Back to: recorded, the claim still holding the staged name, linked.
    let claimed = layout.committing.join(h.transaction.as_str());
    copy_dir(&saved, &claimed);
    fs::remove_file(part(&t.0, 1)).unwrap();
    fs::hard_link(claimed.join("data"), part(&t.0, 1)).unwrap();
    let renamed = t.0.join(format!("part-{}.done", h.transaction));
    fs::rename(part(&t.0, 1), &renamed).unwrap();

    let err = d.commit(&h, 6).unwrap_err();
    assert!(err.message.contains(renamed.to_str().unwrap()), "{err}");
    assert!(!part(&t.0, 1).exists(), "never a second copy");
    fs::rename(&renamed, part(&t.0, 1)).unwrap();
    assert_eq!(d.commit(&h, 7).unwrap(), CommitStatus::AlreadyCommitted);
    assert_eq!(fs::read_to_string(part(&t.0, 1)).unwrap(), "x\n");
    assert!(!claimed.exists());
}
