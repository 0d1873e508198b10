//! Every I/O step of the filesystem destination failing, with the errors a
//! full disk (ENOSPC) and a failing device (EIO) give, before its effect or
//! after it (a lost response): a transaction whose write or prepare failed
//! is aborted and leaves nothing; a commit that failed is finished by its
//! retry; the published output is always exact and published once.

mod common;

use std::fs;

use common::*;
use twopc_core::destination::{AbortStatus, CommitStatus, Destination, LineageRecord};
use twopc_core::ids::{LineageId, RunId};
use twopc_fs::{CommitOrder, IoMode, IoStep, IoTiming};

const STEPS: [IoStep; 12] = [
    IoStep::Write,
    IoStep::DataSync,
    IoStep::Marker,
    IoStep::CommitRecord,
    IoStep::Note,
    IoStep::Claim,
    IoStep::Publish,
    IoStep::DirSync,
    IoStep::Remove,
    IoStep::List,
    IoStep::Read,
    IoStep::Create,
];

/// Retries `f` once if it failed (the fault fires once).
fn twice<T, E: std::fmt::Debug>(mut f: impl FnMut() -> Result<T, E>) -> T {
    match f() {
        Ok(v) => v,
        Err(_) => f().expect("the retry, without the fault, succeeds"),
    }
}

#[test]
fn every_step_failing_before_or_after_its_effect_loses_and_duplicates_nothing() {
    let records = ["alpha", "beta", "gamma"];
    for (mode, order) in [
        (IoMode::Buffered, CommitOrder::DurableFirst),
        (IoMode::Auto, CommitOrder::DurableFirst),
        (IoMode::Auto, CommitOrder::VisibleFirst),
    ] {
        for step in STEPS {
            for timing in [IoTiming::Before, IoTiming::After] {
                for errno in [28 /* ENOSPC */, 5 /* EIO */] {
                    let case = format!("{mode:?} {order:?} {step:?} {timing:?} errno {errno}");
                    let t = TempDir::new("faults");
                    let options = twopc_fs::FsOptions {
                        commit_order: order,
                        ..options(&t.0, mode)
                    };
                    let (mut d, faults) = faulty_with(options);
                    faults.arm(step, timing, errno);

                    // Transaction 1: written and prepared, or poisoned and
                    // aborted (the writer never prepares it again).
                    let prepared = write(&mut d, 1, &records).and_then(|()| {
                        let h = handle(1, Some(1), &records);
                        d.prepare(&h).map(|()| h)
                    });
                    let committed = match prepared {
                        Ok(h) => {
                            let status = twice(|| d.commit(&h, 10));
                            assert!(
                                matches!(
                                    status,
                                    CommitStatus::Committed | CommitStatus::AlreadyCommitted
                                ),
                                "{case}: {status:?}"
                            );
                            true
                        }
                        Err(e) => {
                            assert!(faults.fired(), "{case}: failed without the fault: {e}");
                            let status = twice(|| d.abort(&txn(1)));
                            assert!(
                                matches!(status, AbortStatus::Aborted | AbortStatus::NotFound),
                                "{case}: {status:?}"
                            );
                            false
                        }
                    };

                    // The rest of the destination's calls, so that every
                    // step meets its fault somewhere.
                    let h2 = stage_retrying(&mut d, 2, &["delta"]);
                    assert_eq!(
                        twice(|| d.abort(&h2.transaction)),
                        AbortStatus::Aborted,
                        "{case}"
                    );
                    let h3 = stage_retrying(&mut d, 3, &["eps"]);
                    twice(|| d.expire(&h3.transaction, 5));
                    twice(|| d.staged());
                    twice(|| d.lineages());
                    twice(|| {
                        d.record_lineage(&LineageRecord {
                            lineage: LineageId(7),
                            run: RunId::new("job1").unwrap(),
                            started_at_ms: 1,
                            appended: false,
                        })
                    });
                    assert!(faults.fired(), "{case}: the fault never fired");

                    // What readers see: transaction 1 exactly once, or not
                    // at all; nothing else; nothing left staged.
                    let visible = visible_files(&t.0);
                    if committed {
                        assert_eq!(visible, vec![format!("part-{}", txn(1))], "{case}");
                        assert_eq!(
                            fs::read_to_string(part(&t.0, 1)).unwrap(),
                            "alpha\nbeta\ngamma\n",
                            "{case}"
                        );
                    } else {
                        assert!(visible.is_empty(), "{case}: {visible:?}");
                    }
                    assert!(d.staged().unwrap().is_empty(), "{case}");
                    let layout = d.layout();
                    for area in [layout.staging, layout.committing] {
                        assert!(
                            fs::read_dir(&area).unwrap().next().is_none(),
                            "{case}: {} not empty",
                            area.display()
                        );
                    }
                }
            }
        }
    }
}

/// Writes and prepares `seq`, aborting and starting over (under a new
/// sequence number) when a fault poisons it, as the protocol would.
fn stage_retrying(
    d: &mut twopc_fs::FsDestination,
    seq: u64,
    records: &[&str],
) -> twopc_core::TransactionHandle {
    for attempt in 0..2 {
        let s = seq + attempt * 100;
        let h = handle(s, Some(1), records);
        if write(d, s, records).and_then(|()| d.prepare(&h)).is_ok() {
            return h;
        }
        twice(|| d.abort(&txn(s)));
    }
    panic!("staging failed twice");
}
