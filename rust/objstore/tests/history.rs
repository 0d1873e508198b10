//! The bounded commit history of the object store destination, against a
//! local S3 server (moto, from `eval "$(bash scripts/s3.sh start)"`).
//! Whatever was folded, every reader answers as before: rewind detection,
//! a repeated commit, a retraction, the lineage summary and the tallies; a
//! compaction failing at any of its requests loses nothing and counts
//! nothing twice, and the next one leaves nothing behind; compactions and
//! retractions racing leave every record exactly once; a damaged or forged
//! segment or index is an error naming it, never a silent gap.

#[macro_use]
mod common;

use std::sync::{Arc, Barrier};

use common::*;
use twopc_core::destination::{CommitStatus, Destination, HistoryPolicy, HistoryTally};
use twopc_core::error::DestinationErrorKind;
use twopc_core::ids::LineageId;
use twopc_objstore::control::{CommitRecord, ControlObject};
use twopc_objstore::history::{HistoryIndex, SegmentName};
use twopc_objstore::names::{COMMITTED, HISTORY};
use twopc_objstore::{FaultAction, ObjectStoreDestination, S3Options};

fn policy() -> HistoryPolicy {
    HistoryPolicy {
        keep_checkpoints: 2,
        min_segment: 3,
        max_segment: 4,
        every_commits: 1,
    }
}

fn recs(seq: u64) -> Vec<Vec<u8>> {
    records(1 + (seq % 3) as usize, 8, seq as u8)
}

/// Commits transactions `from..=to`, one per checkpoint (checkpoint =
/// sequence).
fn commit_range(d: &mut ObjectStoreDestination, from: u64, to: u64) {
    for seq in from..=to {
        let h = stage(d, seq, seq, &recs(seq));
        assert_eq!(d.commit(&h, 1_000 + seq).unwrap(), CommitStatus::Committed);
    }
}

/// The handle a repeated commit of `seq` comes with (as the checkpoint
/// kept it: with its upload's location).
fn staged_handles(
    d: &mut ObjectStoreDestination,
    from: u64,
    to: u64,
) -> Vec<(u64, twopc_core::TransactionHandle)> {
    (from..=to)
        .map(|seq| {
            let h = stage(d, seq, seq, &recs(seq));
            assert_eq!(d.commit(&h, 1_000 + seq).unwrap(), CommitStatus::Committed);
            (seq, h)
        })
        .collect()
}

fn committed_seqs(d: &mut ObjectStoreDestination, after: u64) -> Vec<u64> {
    let mut v: Vec<u64> = d
        .committed_after(LineageId(7), after)
        .unwrap()
        .iter()
        .map(|c| c.checkpoint)
        .collect();
    v.sort();
    v
}

fn sorted(mut t: Vec<HistoryTally>) -> Vec<HistoryTally> {
    t.sort_by(|a, b| (a.lineage, &a.run).cmp(&(b.lineage, &b.run)));
    t
}

/// Live segments (the index) and the objects under `history/`: equal when
/// nothing was left behind.
fn segments(d: &ObjectStoreDestination) -> (Vec<String>, Vec<String>) {
    let (live, objects) = d.history_segments().unwrap();
    let mut live: Vec<String> = live.iter().map(SegmentName::render).collect();
    live.sort();
    (live, objects)
}

fn total_records(from: u64, to: u64) -> u64 {
    (from..=to).map(|s| recs(s).len() as u64).sum()
}

#[test]
fn folded_records_answer_every_reader_as_before() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let handles = staged_handles(&mut d, 1, 20);
    let before_after = committed_seqs(&mut d, 0);
    let before_lineages = d.lineages().unwrap();
    let before_tallies = sorted(d.history_tallies().unwrap());
    assert_eq!(names_in(&d, COMMITTED).len(), 20);

    let done = d.compact_history(&policy()).unwrap();
    // Checkpoints 1..=18 are behind the watermark (20 - 2), in segments of
    // at most 4.
    assert_eq!((done.folded, done.segments, done.busy), (18, 5, false));
    assert_eq!(names_in(&d, COMMITTED).len(), 2);
    let (live, objects) = segments(&d);
    assert_eq!(live.len(), 5);
    assert_eq!(live, objects);

    assert_eq!(committed_seqs(&mut d, 0), before_after);
    assert_eq!(committed_seqs(&mut d, 9), (10..=20).collect::<Vec<_>>());
    assert_eq!(d.lineages().unwrap(), before_lineages);
    assert_eq!(sorted(d.history_tallies().unwrap()), before_tallies);
    assert_eq!(before_tallies[0].transactions, 20);
    assert_eq!(before_tallies[0].records, total_records(1, 20));
    assert_eq!(d.all_commit_records().unwrap().len(), 20);

    // A repeated commit of a folded transaction is "already committed",
    // from a fresh destination too; one the destination never had, in
    // the folded range, is missing.
    let (_, five) = &handles[4];
    assert_eq!(
        d.commit(five, 9_999).unwrap(),
        CommitStatus::AlreadyCommitted
    );
    let mut fresh = ObjectStoreDestination::open(d_options(&d), &sink()).unwrap();
    assert_eq!(
        fresh.commit(five, 9_999).unwrap(),
        CommitStatus::AlreadyCommitted
    );
    match d.commit(&handle(500, Some(5), &recs(5)), 9_999).unwrap() {
        CommitStatus::Missing { evidence } => {
            assert!(evidence.contains("history"), "{evidence}")
        }
        other => panic!("{other:?}"),
    }
    // Its object removed since by a reader: still "already committed"
    // (the commit happened and was visible).
    let (_, six) = &handles[5];
    delete_raw(&d, &d.layout().part_key(&six.transaction));
    assert_eq!(
        d.commit(six, 9_999).unwrap(),
        CommitStatus::AlreadyCommitted
    );

    // Compacting again folds nothing more (too few behind the watermark).
    let again = d.compact_history(&policy()).unwrap();
    assert_eq!((again.folded, again.busy), (0, false));
    assert_eq!(segments(&d).0, live);
}

/// The options `d` was opened with (same bucket).
fn d_options(d: &ObjectStoreDestination) -> S3Options {
    let mut o = options(&std::env::var("TWOPC_S3_ENDPOINT").unwrap());
    o.url = format!("s3://{}/{}", d.layout().bucket, d.layout().prefix);
    o
}

#[test]
fn a_retracted_folded_transaction_is_gone_from_output_and_history() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    commit_range(&mut d, 1, 10);
    d.compact_history(&policy()).unwrap();
    assert_eq!(names_in(&d, COMMITTED).len(), 2);
    let later = d.committed_after(LineageId(7), 4).unwrap();
    let five = later.iter().find(|c| c.checkpoint == 5).unwrap().clone();
    assert_eq!(object(&d, 5), Some(lines(&recs(5))));
    d.retract(&five).unwrap();
    assert_eq!(object(&d, 5), None);
    assert!(!committed_seqs(&mut d, 0).contains(&5));
    assert_eq!(committed_seqs(&mut d, 0).len(), 9);
    // Repeatable; a fresh destination agrees.
    d.retract(&five).unwrap();
    let mut fresh = ObjectStoreDestination::open(d_options(&d), &sink()).unwrap();
    assert!(!committed_seqs(&mut fresh, 0).contains(&5));
    let (live, objects) = segments(&d);
    assert_eq!(live, objects, "the rewritten segment replaced the old one");
    // Every transaction of one segment retracted: the segment goes.
    let before = live.len();
    for c in d.committed_after(LineageId(7), 0).unwrap() {
        if c.checkpoint <= 4 {
            d.retract(&c).unwrap();
        }
    }
    let (live, objects) = segments(&d);
    assert_eq!(live.len(), before - 1);
    assert_eq!(live, objects);
    assert_eq!(committed_seqs(&mut d, 0), vec![6, 7, 8, 9, 10]);
    for seq in 1..=10 {
        assert_eq!(object(&d, seq).is_some(), seq > 5, "{seq}");
    }
    let tallies = d.history_tallies().unwrap();
    assert_eq!(tallies[0].transactions, 5, "tallies follow the retractions");
    assert_eq!(tallies[0].records, total_records(6, 10));
    assert_eq!(d.lineages().unwrap()[0].committed, 5);
}

#[test]
fn a_compaction_failing_at_any_request_loses_nothing_and_counts_nothing_twice() {
    let endpoint = server!();
    // One record per segment behind a watermark of 1: the compaction under
    // test folds checkpoint 2 and merges it with the segment of checkpoint
    // 1, so it reads, writes, replaces the index and deletes.
    let policy = HistoryPolicy {
        keep_checkpoints: 1,
        min_segment: 1,
        max_segment: 4,
        every_commits: 1,
    };
    let mut steps = 0;
    for action in [
        FaultAction::FailBefore("refused".into()),
        FaultAction::FailAfter("answer lost".into()),
    ] {
        for n in 1.. {
            let (mut d, faults) = open_stepped(&options(&endpoint));
            let handles = staged_handles(&mut d, 1, 2);
            assert_eq!(d.compact_history(&policy).unwrap().folded, 1);
            let mut handles = [handles, staged_handles(&mut d, 3, 3)].concat();
            faults.arm(n, action.clone());
            let first = d.compact_history(&policy);
            let Some(call) = faults.fired() else {
                assert_eq!(first.unwrap().merged, 2, "the clean run merges");
                break;
            };
            steps += 1;
            let what = format!("request {n} ({call:?}) {action:?}");
            assert!(first.is_err(), "{what}: the failure is reported: {first:?}");
            // Whatever the failure left, every record is there once.
            assert_eq!(committed_seqs(&mut d, 0), vec![1, 2, 3], "{what}");
            let tallies = d.history_tallies().unwrap();
            assert_eq!(
                (tallies[0].transactions, tallies[0].records),
                (3, total_records(1, 3)),
                "{what}"
            );
            assert_eq!(d.lineages().unwrap()[0].committed, 3, "{what}");
            // The next compaction finishes the job and leaves nothing behind.
            let next = d.compact_history(&policy).unwrap();
            assert!(!next.busy, "{what}");
            let (live, objects) = segments(&d);
            assert_eq!(live, objects, "{what}: leftovers removed");
            assert_eq!(names_in(&d, COMMITTED).len(), 1, "{what}");
            assert_eq!(committed_seqs(&mut d, 0), vec![1, 2, 3], "{what}");
            let tallies = d.history_tallies().unwrap();
            assert_eq!(tallies[0].transactions, 3, "{what}");
            assert_eq!(d.lineages().unwrap()[0].committed, 3, "{what}");
            for (_, h) in handles.drain(..) {
                assert_eq!(
                    d.commit(&h, 9_999).unwrap(),
                    CommitStatus::AlreadyCommitted,
                    "{what}: {}",
                    h.transaction
                );
            }
        }
    }
    assert!(steps >= 16, "only {steps} requests were failed");
}

#[test]
fn compactions_and_retractions_racing_keep_every_record_once() {
    let endpoint = server!();
    let (mut won, mut lost) = (0, 0);
    // At least 8 rounds, and more (up to 40) until both outcomes of the
    // race have been seen: a server that happens to serialise the threads
    // for a while is not a failure.
    for round in 0..40 {
        if round >= 8 && won > 0 && lost > 0 {
            break;
        }
        // Odd rounds: a retraction runs beside the two compactions.
        let retracting = round % 2 == 1;
        let o = options(&endpoint);
        let mut d = open(&o);
        commit_range(&mut d, 1, 12);
        // Half folded already, so the retractions hit segments too.
        d.compact_history(&HistoryPolicy {
            keep_checkpoints: 6,
            ..policy()
        })
        .unwrap();
        let victims: Vec<_> = d
            .committed_after(LineageId(7), 0)
            .unwrap()
            .into_iter()
            .filter(|c| c.checkpoint % 3 == 0)
            .collect();
        let barrier = Arc::new(Barrier::new(3));
        let mut threads = Vec::new();
        for _ in 0..2 {
            let (b, o) = (barrier.clone(), o.clone());
            threads.push(std::thread::spawn(move || {
                let mut d = ObjectStoreDestination::open(o, &sink()).unwrap();
                b.wait();
                d.compact_history(&policy()).unwrap()
            }));
        }
        let (b, o2, v) = (barrier.clone(), o.clone(), victims.clone());
        let retractor = std::thread::spawn(move || {
            let mut d = ObjectStoreDestination::open(o2, &sink()).unwrap();
            b.wait();
            if retracting {
                for v in &v {
                    d.retract(v).unwrap();
                }
            }
        });
        let done: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        retractor.join().unwrap();
        // Busy: the other compaction or a retraction changed the index
        // first; then nothing was done.
        for c in &done {
            assert!(
                !c.busy || (c.folded, c.segments, c.merged) == (0, 0, 0),
                "round {round}: {c:?}"
            );
            if c.busy {
                lost += 1;
            } else if c.folded > 0 {
                won += 1;
            }
        }
        if !retracting {
            // Without retractions, one of them folded (both, one after
            // the other, or one while the other found the index changed).
            assert!(done.iter().any(|c| c.folded > 0), "round {round}: {done:?}");
            for v in &victims {
                d.retract(v).unwrap();
            }
        }
        let expected: Vec<u64> = (1..=12).filter(|c| c % 3 != 0).collect();
        assert_eq!(
            committed_seqs(&mut d, 0),
            expected,
            "round {round}: {done:?}"
        );
        for c in 1..=12u64 {
            assert_eq!(object(&d, c).is_some(), c % 3 != 0, "round {round}, {c}");
        }
        d.compact_history(&policy()).unwrap();
        let tallies = d.history_tallies().unwrap();
        assert_eq!(tallies[0].transactions, 8, "round {round}");
        assert_eq!(d.lineages().unwrap()[0].committed, 8, "round {round}");
        let (live, objects) = segments(&d);
        assert_eq!(live, objects, "round {round}");
        assert_eq!(committed_seqs(&mut d, 0), expected, "round {round}");
    }
    // Both outcomes of a race happened.
    assert!(won > 0 && lost > 0, "won {won}, lost {lost}");
}

#[test]
fn a_damaged_or_forged_segment_or_index_is_an_error_naming_it() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let handles = staged_handles(&mut d, 1, 10);
    d.compact_history(&policy()).unwrap();
    let (live, _) = segments(&d);
    let first = d.layout().control(HISTORY, &live[0]);
    let second = d.layout().control(HISTORY, &live[1]);
    let good = get_raw(&d, &first).unwrap();
    let two = handles[1].1.clone();
    let expect_corrupt = |d: &mut ObjectStoreDestination, what: &str, names: &str| {
        let e = d.committed_after(LineageId(7), 0).unwrap_err();
        assert_eq!(e.kind, DestinationErrorKind::Corrupt, "{what}: {e}");
        assert!(e.message.contains(names), "{what}: {e}");
        let e = d.commit(&two, 9_999).expect_err(what);
        assert_eq!(e.kind, DestinationErrorKind::Corrupt, "{what}: {e}");
        assert!(e.message.contains(names), "{what}: {e}");
    };
    // Every flipped byte and every cut.
    for i in (0..good.len()).step_by(9) {
        let mut b = good.clone();
        b[i] ^= 0x5a;
        put_raw(&d, &first, &b);
        expect_corrupt(&mut d, &format!("byte {i} flipped"), &first);
    }
    for cut in [0, 1, 11, good.len() / 2, good.len() - 1] {
        put_raw(&d, &first, &good[..cut]);
        expect_corrupt(&mut d, &format!("cut at {cut}"), &first);
    }
    // Another segment's content under this name.
    put_raw(&d, &first, &get_raw(&d, &second).unwrap());
    expect_corrupt(&mut d, "another segment's content", &first);
    // Well-formed records that are not what the name says, or not this
    // sink's: a record pointing at another transaction's object, one of
    // another lineage, and one taken twice.
    let ControlObject::Segment(records) = twopc_objstore::control::decode(&good).unwrap() else {
        panic!("not a segment")
    };
    let forge = |f: &dyn Fn(&mut Vec<CommitRecord>)| {
        let mut r = records.clone();
        f(&mut r);
        twopc_objstore::control::encode(&ControlObject::Segment(r))
    };
    let other_key = d.layout().part_key(&txn(9));
    for (what, bytes) in [
        (
            "a record pointing elsewhere",
            forge(&|r| r[0].key = other_key.clone()),
        ),
        (
            "another lineage",
            forge(&|r| r[1].handle.lineage = LineageId(8)),
        ),
        ("a record twice", forge(&|r| r[1] = r[0].clone())),
        (
            "a record missing",
            forge(&|r| {
                r.pop();
            }),
        ),
    ] {
        put_raw(&d, &first, &bytes);
        expect_corrupt(&mut d, what, &first);
    }
    put_raw(&d, &first, &good);
    assert_eq!(committed_seqs(&mut d, 0), (1..=10).collect::<Vec<_>>());
    // A listed segment removed by hand: named, not a silent gap.
    delete_raw(&d, &first);
    expect_corrupt(&mut d, "a missing segment", &first);
    put_raw(&d, &first, &good);
    // The index: damaged, another sink's, or listing a name that lies.
    let index_key = d.layout().history_index();
    let index = get_raw(&d, &index_key).unwrap();
    let mut flipped = index.clone();
    flipped[20] ^= 0x01;
    put_raw(&d, &index_key, &flipped);
    expect_corrupt(&mut d, "a damaged index", &index_key);
    let ControlObject::HistoryIndex(parsed) = twopc_objstore::control::decode(&index).unwrap()
    else {
        panic!("not an index")
    };
    let foreign = HistoryIndex {
        sink: twopc_core::SinkId::new("other").unwrap(),
        ..parsed.clone()
    };
    put_raw(
        &d,
        &index_key,
        &twopc_objstore::control::encode(&ControlObject::HistoryIndex(foreign)),
    );
    expect_corrupt(&mut d, "another sink's index", &index_key);
    let mut lying = parsed.clone();
    let seg = lying
        .segments
        .iter_mut()
        .find(|s| s.render() == live[0])
        .unwrap();
    seg.records += 1;
    let lying_name = d.layout().control(HISTORY, &seg.render());
    put_raw(&d, &lying_name, &good);
    put_raw(
        &d,
        &index_key,
        &twopc_objstore::control::encode(&ControlObject::HistoryIndex(lying)),
    );
    expect_corrupt(&mut d, "a name that lies", &lying_name);
    delete_raw(&d, &lying_name);
    put_raw(&d, &index_key, &index);
    assert_eq!(committed_seqs(&mut d, 0), (1..=10).collect::<Vec<_>>());
    // The index removed by hand while segments exist: compaction refuses
    // and deletes nothing.
    delete_raw(&d, &index_key);
    let e = d.compact_history(&policy()).unwrap_err();
    assert_eq!(e.kind, DestinationErrorKind::Corrupt, "{e}");
    assert!(e.message.contains(&index_key), "{e}");
    assert_eq!(d.history_segments().unwrap().1.len(), live.len());
    put_raw(&d, &index_key, &index);
    // Strays under history/: one not named like a segment is ignored and
    // kept; one named like a segment but listed nowhere is not part of the
    // history (a leftover) and goes at the next compaction.
    let stray = d.layout().control(HISTORY, "notes.txt");
    put_raw(&d, &stray, b"hello");
    let mut unlisted: SegmentName = SegmentName::parse(&live[0]).unwrap();
    unlisted.nonce ^= 1;
    let unlisted_key = d.layout().control(HISTORY, &unlisted.render());
    put_raw(&d, &unlisted_key, &good);
    assert_eq!(committed_seqs(&mut d, 0), (1..=10).collect::<Vec<_>>());
    assert_eq!(d.history_tallies().unwrap()[0].transactions, 10);
    commit_range(&mut d, 11, 11);
    d.compact_history(&policy()).unwrap();
    assert!(get_raw(&d, &stray).is_some());
    assert!(get_raw(&d, &unlisted_key).is_none());
    assert_eq!(committed_seqs(&mut d, 0), (1..=11).collect::<Vec<_>>());
}

#[test]
fn small_segments_merge_so_their_number_follows_the_history_size() {
    let endpoint = server!();
    let mut d = open(&options(&endpoint));
    let policy = HistoryPolicy {
        keep_checkpoints: 0,
        min_segment: 1,
        max_segment: 8,
        every_commits: 1,
    };
    let mut merged = 0;
    for seq in 1..=40 {
        commit_range(&mut d, seq, seq);
        merged += d.compact_history(&policy).unwrap().merged;
    }
    assert!(merged > 0);
    let (live, objects) = segments(&d);
    assert_eq!(live, objects);
    // 40 transactions in segments of at most 8: at least 5 segments, and
    // far fewer than one per compaction.
    assert!((5..=10).contains(&live.len()), "{} segments", live.len());
    assert!(names_in(&d, COMMITTED).is_empty());
    assert_eq!(committed_seqs(&mut d, 0), (1..=40).collect::<Vec<_>>());
    assert_eq!(d.history_tallies().unwrap()[0].transactions, 40);
    assert_eq!(d.lineages().unwrap()[0].committed, 40);
    assert_eq!(d.all_commit_records().unwrap().len(), 40);
}
