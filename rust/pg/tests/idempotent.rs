//! The idempotent mode against a real server: batches are visible at once,
//! a replay rewrites the same rows, every key holds its last value.

#[macro_use]
mod common;

use std::ops::Range;

use common::*;
use twopc_core::committer::CommitOutcome;
use twopc_core::destination::Destination;
use twopc_core::TwopcError;
use twopc_pg::{CopyFormat, PgMode};

/// Idempotent into a table of key `k` and its values `v` and `n`.
fn kv_fixture(url: &str, prefix: &str) -> Fixture {
    Fixture::keyed_by_k(
        url,
        prefix,
        "k bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL",
        &["k", "v", "n"],
    )
}

/// Records of writes `i` to key `i % 50`, so each key is written several
/// times; the value says which write it was.
fn kv_records(writes: Range<i32>) -> Vec<String> {
    writes.map(|i| format!("{}\tv{i}\t{i}", i % 50)).collect()
}

/// What the table holds when `last` were the last writes, one to each key.
fn kv_rows_after(last: Range<i32>) -> Vec<(i64, String, i32)> {
    last.map(|i| ((i % 50) as i64, format!("v{i}"), i))
        .collect()
}

fn kv(f: &mut Fixture) -> Vec<(i64, String, i32)> {
    f.admin
        .query(&format!("SELECT k, v, n FROM {} ORDER BY k", f.table), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[test]
fn a_replay_rewrites_the_same_rows_and_each_key_keeps_its_last_value() {
    let url = server!();
    let mut f = kv_fixture(&url, "kv");

    // Each key is written within one batch and across batches.
    let records = kv_records(0..300);
    let mut s = f.open("run1");
    let h = written(&mut s, &records[..120]);
    // Visible at once, before any checkpoint.
    assert_eq!(f.count(), 50);
    s.write(&h.transaction, &batch(&records[120..])).unwrap();
    let h = s.prepare(&h.transaction, 1).unwrap();
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    assert_eq!(kv(&mut f), kv_rows_after(250..300));
    assert!(s.destination().staged().unwrap().is_empty());

    // The job fails during checkpoint 2 after writing part of it, restarts
    // from checkpoint 1 and replays: the replayed records overwrite the
    // same keys with the same values; nothing is added.
    let more = kv_records(300..400);
    written(&mut s, &more[..30]);
    drop(s);
    let mut s = f.open_restored("run1", &restore_from(1, &[&h]));
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    let h3 = prepared_in_batches(&mut s, &more, 40, 2);
    s.commit(&h3).unwrap();
    let expected = kv_rows_after(350..400);
    assert_eq!(kv(&mut f), expected);

    // Replaying everything from the start changes nothing.
    drop(s);
    let mut s = f.open("run2");
    let h = s.begin().unwrap();
    for chunk in records.chunks(64).chain(more.chunks(64)) {
        s.write(&h.transaction, &batch(chunk)).unwrap();
    }
    assert_eq!(kv(&mut f), expected);
}

#[test]
fn csv_and_a_composite_key_where_every_column_is_key() {
    let url = server!();
    let mut f = Fixture::with_columns(&url, "pair", "a text, b int, PRIMARY KEY (a, b)");
    f.opts.columns = vec!["a".into(), "b".into()];
    f.opts.copy_format = CopyFormat::Csv;
    f.opts.mode = PgMode::Idempotent {
        key_columns: vec!["b".into(), "a".into()],
    };
    let mut s = f.open("run1");
    let records = ["\"x,1\",1", "\"x,1\",1", "y,2", "y,2", "y,3"];
    let h = written(&mut s, &records);
    s.write(&h.transaction, &batch(&records)).unwrap();
    let rows: Vec<String> = f
        .admin
        .query(
            &format!("SELECT a || '/' || b FROM {} ORDER BY a, b", f.table),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, vec!["x,1/1", "y/2", "y/3"]);
}

#[test]
fn a_session_lost_between_batches_is_reopened() {
    let url = server!();
    let mut f = kv_fixture(&url, "idem_lost");
    let mut s = f.open("run1");
    let h = written(&mut s, &["1\ta\t1"]);
    let pid = s.destination().writer_backend_pid().unwrap();
    f.terminate(pid);
    // The batch on the dead session fails. Its transaction can then only
    // be aborted (the job restarts and replays); the next transaction
    // reconnects and recreates the staging table.
    assert!(s.write(&h.transaction, &batch(&["2\tb\t2"])).is_err());
    assert!(
        s.write(&h.transaction, &batch(&["3\tc\t3"])).is_err(),
        "a transaction whose write failed takes no more records"
    );
    s.abort(&h).unwrap();
    let h = written(&mut s, &["2\tb\t2"]);
    s.write(&h.transaction, &batch(&["3\tc\t3"])).unwrap();
    assert_eq!(f.count(), 3);
}

#[test]
fn a_record_the_server_refuses_is_named_by_its_position_and_its_batch_rolled_back() {
    let url = server!();
    let mut f = Fixture::keyed_by_k(
        &url,
        "idem_rej",
        "k bigint PRIMARY KEY, v text NOT NULL CHECK (v <> 'forbidden'), n int UNIQUE",
        &["k", "v", "n"],
    );
    let mut s = f.open("run1");
    // Each case: a first batch that is upserted, then one that holds the
    // refused record at `at`. (records of the second batch, at, column,
    // what PostgreSQL says)
    type Case<'a> = (&'a [&'a str], u64, Option<&'a str>, &'a [&'a str]);
    let cases: &[Case] = &[
        // Refused by the COPY into the staging table, which names the line.
        (
            &["10\ta\t10", "11\tb\tnot-a-number", "12\tc\t12"],
            1,
            Some("n"),
            &["22P02", "invalid input syntax for type integer"],
        ),
        // Refused by the upsert, which names no row: found by bisection.
        (
            &["20\ta\t20", "21\tb\t21", "22\t\\N\t22", "23\td\t23"],
            2,
            Some("v"),
            &["23502", "not-null constraint"],
        ),
        (
            &["30\ta\t30", "31\tforbidden\t31", "32\tc\t32"],
            1,
            None,
            &["23514", "check constraint"],
        ),
        // A unique column other than the key: the second row of a pair.
        (
            &["40\ta\t40", "41\tb\t77", "42\tc\t42", "43\td\t77"],
            3,
            None,
            &["23505", "Key (n)=(77) already exists"],
        ),
        // A superseded row of a key is not the upsert's: the refused one is
        // the last row of its key, after it.
        (
            &["50\t\\N\t50", "50\tok\t50", "51\tb\t51", "52\t\\N\t52"],
            3,
            Some("v"),
            &["23502"],
        ),
    ];
    for (i, (second, at, column, needles)) in cases.iter().enumerate() {
        let before = f.count();
        let first = [format!("{}\tfirst\t{}", 1000 + i, 1000 + i)];
        let h = written(&mut s, &first);
        assert_eq!(
            f.count(),
            before + 1,
            "case {i}: the first batch is visible"
        );
        let (r, msg) = rejected(s.write(&h.transaction, &batch(second)));
        // Positions count from the start of the transaction.
        assert_eq!(r.position, Some(1 + at), "case {i}: {msg}");
        assert_eq!(r.column.as_deref(), *column, "case {i}: {msg}");
        assert_eq!(
            r.preview,
            twopc_core::records::preview(second[*at as usize].as_bytes()),
            "case {i}: {msg}"
        );
        for needle in needles.iter().chain(&[
            "while writing",
            "the batches written before this one are upserted and stay",
            "Filter or fix such records before the sink",
        ]) {
            assert!(
                msg.contains(needle),
                "case {i}: missing {needle:?} in {msg}"
            );
        }
        assert_eq!(
            f.count(),
            before + 1,
            "case {i}: the refused batch rolled back"
        );
        s.abort(&h).unwrap();
    }
    // The session and its staging table carry on.
    let h = written(&mut s, &["60\tlast\t60"]);
    s.prepare(&h.transaction, 1).unwrap();
    assert_eq!(f.count(), cases.len() as i64 + 1);
}

/// A DEFERRABLE foreign key fails only at the batch's COMMIT, where no
/// statement names a row, and the bisection used to find no record failing
/// on its own (the check waited for a commit it never made): the error
/// stayed retryable and the job restarted forever. Now the record is named
/// when the batch without it passes every check, and otherwise the batch is
/// refused without naming one. A key lets a row refer to one later in the
/// batch (the upsert is one statement; a deferred key waits for COMMIT), so
/// a record the bisection checked without the rows after it must not be
/// blamed for that (found by review), whether the key is deferred or not.
#[test]
fn foreign_key_violations_are_found_or_refused_without_a_position() {
    let url = server!();
    for deferred in [true, false] {
        let mut f = Fixture::keyed_by_k(
            &url,
            "idem_fk",
            "k bigint PRIMARY KEY, v text NOT NULL CHECK (v <> 'forbidden'), n bigint",
            &["k", "v", "n"],
        );
        let timing = if deferred {
            "DEFERRABLE INITIALLY DEFERRED"
        } else {
            ""
        };
        f.admin
            .batch_execute(&format!(
                "ALTER TABLE {t} ADD FOREIGN KEY (n) REFERENCES {t} (k) {timing}",
                t = f.table
            ))
            .unwrap();
        let mut s = f.open("run1");
        // (the second batch, the position named in it, what PostgreSQL says)
        type Case<'a> = (&'a [&'a str], Option<u64>, &'a [&'a str]);
        let cases: &[Case] = &[
            // A key no row has: named.
            (
                &["10\ta\t10", "11\tb\t4242", "12\tc\t10"],
                Some(1),
                &["23503", "Key (n)=(4242) is not present"],
            ),
            // A child before its parent is fine, then a CHECK violation:
            // named when the key waits for COMMIT; otherwise the bisection
            // suspects the child first, which the batch needs, and names
            // none (PostgreSQL's own words name the failing row).
            (
                &["20\tchild\t22", "21\tforbidden\t21", "22\tparent\t22"],
                if deferred { Some(1) } else { None },
                &["23514", "check constraint"],
            ),
            // A child before its parent, and a key no row has: nothing is
            // named rather than the wrong record.
            (
                &["30\tchild\t31", "31\tparent\t31", "32\tq\t4242"],
                None,
                &[
                    "23503",
                    "Key (n)=(4242) is not present",
                    "did not say which record",
                    "no single record could be named",
                ],
            ),
        ];
        for (i, (second, at, needles)) in cases.iter().enumerate() {
            let before = f.count();
            let first = [format!("{}\tfirst\t{}", 1000 + i, 1000 + i)];
            let h = written(&mut s, &first);
            let (r, msg) = rejected(s.write(&h.transaction, &batch(second)));
            let case = format!("deferred {deferred}, case {i}: {msg}");
            assert_eq!(r.position, at.map(|a| 1 + a), "{case}");
            if let Some(a) = at {
                assert_eq!(
                    r.preview,
                    twopc_core::records::preview(second[*a as usize].as_bytes()),
                    "{case}"
                );
            }
            for needle in needles.iter() {
                assert!(msg.contains(needle), "missing {needle:?}: {case}");
            }
            assert_eq!(
                f.count(),
                before + 1,
                "the refused batch rolled back: {case}"
            );
            s.abort(&h).unwrap();
        }
        let h = written(&mut s, &["40\tlast\t40", "41\tchild\t40"]);
        s.prepare(&h.transaction, 1).unwrap();
        assert_eq!(f.count(), cases.len() as i64 + 2);
    }
}

/// A unique column other than the key, against a batch that moves a value
/// from one key to another. Checked row by row (NOT DEFERRABLE), the
/// upsert must apply the batch in arrival order, as a record-at-a-time
/// writer would: in key order it failed where the search for the refused
/// record passed, so the error stayed retryable and the job restarted
/// forever. Checked at the end of each statement (DEFERRABLE INITIALLY
/// IMMEDIATE), a swap of two values passes as a whole but not in parts: the
/// search must not blame one of the swapped rows for another record's error
/// (found by review).
#[test]
fn a_unique_value_moved_between_keys_is_applied_in_arrival_order_and_never_misnamed() {
    let url = server!();
    for deferrable in [false, true] {
        let timing = if deferrable {
            "DEFERRABLE INITIALLY IMMEDIATE"
        } else {
            ""
        };
        let mut f = Fixture::keyed_by_k(
            &url,
            "idem_uq",
            &format!("k bigint PRIMARY KEY, v text NOT NULL, e text UNIQUE {timing}"),
            &["k", "v", "e"],
        );
        f.admin
            .batch_execute(&format!(
                "INSERT INTO {} VALUES (5, 'x', 'a'), (6, 'y', 'b')",
                f.table
            ))
            .unwrap();
        let mut s = f.open("run1");
        // Key 5 gives up 'a', then key 1 takes it.
        let h = written(&mut s, &["5\tx\tz", "1\tw\ta"]);
        let rows: Vec<(i64, String)> = f
            .admin
            .query(&format!("SELECT k, e FROM {} ORDER BY k", f.table), &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            rows,
            [(1, "a".into()), (5, "z".into()), (6, "b".into())],
            "deferrable {deferrable}"
        );
        s.abort(&h).unwrap();
        if !deferrable {
            // Checked row by row, a duplicate is the record the batch
            // failed at, also with another faulty record after it.
            let h = s.begin().unwrap();
            let (r, msg) = rejected(s.write(&h.transaction, &batch(&["8\tx\tb", "9\t\\N\tq"])));
            assert_eq!(r.position, Some(0), "{msg}");
            assert!(msg.contains("23505"), "{msg}");
            s.abort(&h).unwrap();
        }
        if deferrable {
            // 5 and 6 swap their values, then a NOT NULL violation: the
            // swap passes only whole, so its rows must not be named.
            let h = s.begin().unwrap();
            let (r, msg) =
                rejected(s.write(&h.transaction, &batch(&["5\tx\tb", "6\ty\tz", "7\t\\N\tq"])));
            assert_ne!(r.position, Some(0), "{msg}");
            assert_ne!(r.position, Some(1), "{msg}");
            assert!(msg.contains("23502"), "{msg}");
            s.abort(&h).unwrap();
        }
    }
}

#[test]
fn csv_batches_with_line_breaks_inside_quotes_name_the_right_record() {
    let url = server!();
    let mut f = kv_fixture(&url, "idem_csv");
    f.opts.copy_format = CopyFormat::Csv;
    let mut s = f.open("run1");
    let h = s.begin().unwrap();
    let records = [
        "1,\"a\nb\",1",
        "2,\"c\nd\ne\",2",
        "3,plain,3",
        "4,\"f\ng\",x4",
        "5,h,5",
    ];
    let (r, msg) = rejected(s.write(&h.transaction, &batch(&records)));
    assert_eq!(r.position, Some(3), "{msg}");
    assert_eq!(r.column.as_deref(), Some("n"), "{msg}");
    assert_eq!(f.count(), 0);
}

/// Batches of new keys go straight into the table; a batch that meets keys
/// already there (a replay) is upserted, and so is the rest of that
/// checkpoint's transaction; the next checkpoint's batches go straight in
/// again, and one that holds a key twice falls back to the upsert. Whichever
/// way each batch took, every key ends with its last value.
#[test]
fn new_keys_go_straight_in_and_keys_already_there_are_upserted() {
    let url = server!();
    let mut f = kv_fixture(&url, "kvcopy");
    let rows = |keys: Range<i32>, tag: &str, add: i32| -> Vec<String> {
        keys.map(|i| format!("{i}\t{tag}{i}\t{}", i + add))
            .collect()
    };
    let mut s = f.open("run1");
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&rows(0..50, "v", 0)))
        .unwrap();
    assert_eq!(f.count(), 50);
    // Keys 25..50 again with other values, and new keys 50..60.
    s.write(&h.transaction, &batch(&rows(25..60, "w", 1000)))
        .unwrap();
    s.write(&h.transaction, &batch(&rows(60..70, "x", 0)))
        .unwrap();
    let p = s.prepare(&h.transaction, 1).unwrap();
    assert_eq!(s.commit(&p).unwrap(), CommitOutcome::Committed);
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&rows(70..80, "y", 0)))
        .unwrap();
    s.write(
        &h.transaction,
        &batch(&["80\ta\t1", "81\tb\t2", "80\tc\t3"]),
    )
    .unwrap();
    let mut expected: Vec<(i64, String, i32)> = Vec::new();
    expected.extend((0..25).map(|i| (i as i64, format!("v{i}"), i)));
    expected.extend((25..60).map(|i| (i as i64, format!("w{i}"), i + 1000)));
    expected.extend((60..70).map(|i| (i as i64, format!("x{i}"), i)));
    expected.extend((70..80).map(|i| (i as i64, format!("y{i}"), i)));
    expected.push((80, "c".into(), 3));
    expected.push((81, "b".into(), 2));
    assert_eq!(kv(&mut f), expected);
    // A record the server refuses in a batch of new keys is still named by
    // its position, and nothing of its batch stays.
    let err = s
        .write(&h.transaction, &batch(&["90\ta\t1", "91\tb\tnot-a-number"]))
        .unwrap_err();
    assert!(err.to_string().contains("not-a-number"), "{err}");
    assert_eq!(kv(&mut f), expected);
}

/// Tables where a COPY straight in would not leave what the upsert leaves
/// get the upsert for every batch: a trigger that drops rows (found when
/// the COPY loads fewer rows than records), a key column that may be NULL
/// (the upsert keeps one row per NULL key and batch).
#[test]
fn tables_the_copy_would_treat_otherwise_get_the_upsert() {
    let url = server!();

    // A trigger that drops rows with a negative n.
    let mut f = kv_fixture(&url, "kvtrig");
    f.admin
        .batch_execute(&format!(
            "CREATE FUNCTION {t}_drop() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF NEW.n < 0 THEN RETURN NULL; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER {t}_drop BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_drop()",
            t = f.table
        ))
        .unwrap();
    let mut s = f.open("run1");
    let h = s.begin().unwrap();
    for chunk in [
        ["1\ta\t1", "2\tb\t-2", "3\tc\t3"],
        ["4\td\t-4", "5\te\t5", "6\tf\t6"],
    ] {
        s.write(&h.transaction, &batch(&chunk)).unwrap();
    }
    let kept: Vec<i64> = kv(&mut f).iter().map(|r| r.0).collect();
    assert_eq!(kept, vec![1, 3, 5, 6]);

    // A key that may be NULL, under an index that counts NULLs as
    // distinct: a NULL-key record would be inserted again by every replay
    // (ON CONFLICT never matches it), so the sink refuses to start (found
    // by review: it folded a batch's NULL-key rows into one, and its
    // replays added more).
    let f = Fixture::keyed_by_k(
        &url,
        "kvnull",
        "k bigint UNIQUE, v text NOT NULL",
        &["k", "v"],
    );
    let err = f.open_refused("run1", sink_options(), None);
    assert!(matches!(err, TwopcError::Config(_)), "{err}");
    for part in ["may be NULL", "SET NOT NULL", "NULLS NOT DISTINCT", "\"k\""] {
        assert!(
            err.to_string().contains(part),
            "{part:?} missing from: {err}"
        );
    }

    // NULLS NOT DISTINCT (PostgreSQL 15+): NULL is a key like any other.
    let mut f = Fixture::keyed_by_k(
        &url,
        "kvnnd",
        "k bigint UNIQUE NULLS NOT DISTINCT, v text NOT NULL",
        &["k", "v"],
    );
    let rows = |f: &mut Fixture| -> Vec<String> {
        f.admin
            .query(
                &format!(
                    "SELECT coalesce(k::text, 'null') || '=' || v FROM {} ORDER BY k",
                    f.table
                ),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    let mut s = f.open("run1");
    for _replay in 0..2 {
        let h = s.begin().unwrap();
        s.write(&h.transaction, &batch(&["\\N\ta", "1\tb", "\\N\tc"]))
            .unwrap();
        s.prepare(&h.transaction, 1).unwrap();
        assert_eq!(rows(&mut f), vec!["1=b", "null=c"]);
    }
    drop(s);
    // With the operation field, a delete of the NULL key would match no
    // row (`=`): refused at start-up, naming the column.
    f.opts.operation_field = true;
    let err = f.open_refused("run2", sink_options(), None);
    assert!(matches!(err, TwopcError::Config(_)), "{err}");
    for part in ["operation field", "may be NULL", "\"k\"", "SET NOT NULL"] {
        assert!(
            err.to_string().contains(part),
            "{part:?} missing from: {err}"
        );
    }
}

/// An identity column GENERATED ALWAYS as the key is written with the
/// records' values, as the transactional mode's COPY writes it: straight
/// in for new keys, and by the upsert for repeated ones (which a plain
/// INSERT could not). One outside the key is refused at start-up, naming
/// it: a repeated key would update it, which the server allows only to
/// DEFAULT, so every batch with a repeat would fail and the job restart
/// forever.
#[test]
fn identity_columns_generated_always() {
    let url = server!();
    let mut f = Fixture::keyed_by_k(
        &url,
        "kvident",
        "k bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text NOT NULL",
        &["k", "v"],
    );
    let mut s = f.open("run1");
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&["10\ta", "20\tb"]))
        .unwrap();
    // A replay with another value, and a key twice in one batch.
    s.write(&h.transaction, &batch(&["10\tA", "30\tc", "30\tC"]))
        .unwrap();
    let rows: Vec<String> = f
        .admin
        .query(
            &format!("SELECT k::text || '=' || v FROM {} ORDER BY k", f.table),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, vec!["10=A", "20=b", "30=C"]);

    let mut f = Fixture::keyed_by_k(
        &url,
        "kvidentv",
        "k bigint PRIMARY KEY, n bigint GENERATED ALWAYS AS IDENTITY, v text",
        &["k", "n", "v"],
    );
    let err = f.open_refused("run1", sink_options(), None);
    let msg = err.to_string();
    assert!(matches!(err, TwopcError::Config(_)), "{err}");
    assert!(
        msg.contains("column \"n\"") && msg.contains("GENERATED BY DEFAULT"),
        "{msg}"
    );
    // Without it in the columns, the server numbers the rows.
    f.opts.columns = vec!["k".into(), "v".into()];
    let mut s = f.open("run1");
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&["1\ta", "1\tb"])).unwrap();
    assert_eq!(f.count(), 1);
}
