//! The idempotent mode against a real server: batches are visible at once,
//! a replay rewrites the same rows, every key holds its last value.

#[macro_use]
mod common;

use common::*;
use twopc_core::committer::CommitOutcome;
use twopc_core::destination::Destination;
use twopc_core::Restore;
use twopc_pg::{CopyFormat, PgMode, PgOptions};

fn kv_options(url: &str, table: &str) -> PgOptions {
    let mut opts = PgOptions::new(
        twopc_pg::Endpoint::Url(url.to_string()),
        table,
        &["k", "v", "n"],
    );
    opts.mode = PgMode::Idempotent {
        key_columns: vec!["k".into()],
    };
    opts
}

fn kv(admin: &mut postgres::Client, table: &str) -> Vec<(i64, String, i32)> {
    admin
        .query(&format!("SELECT k, v, n FROM {table} ORDER BY k"), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[test]
fn a_replay_rewrites_the_same_rows_and_each_key_keeps_its_last_value() {
    let url = server!();
    let mut admin = admin(&url);
    let table = unique("t_kv");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (k bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL)"
        ))
        .unwrap();
    let sink = unique("idem");
    let opts = kv_options(&url, &table);

    // Records: key = i % 50, so each key is written several times, within
    // one batch and across batches; the value says which write it was.
    let records: Vec<String> = (0..300).map(|i| format!("{}\tv{i}\t{i}", i % 50)).collect();
    let expected: Vec<(i64, String, i32)> = (250..300)
        .map(|i| ((i % 50) as i64, format!("v{i}"), i))
        .collect();

    let mut s = open(&opts, ctx(&sink, "run1", 0, 1), sink_options(), None).unwrap();
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&records[..120])).unwrap();
    // Visible at once, before any checkpoint.
    assert_eq!(count(&mut admin, &table), 50);
    s.write(&h.transaction, &batch(&records[120..])).unwrap();
    let h = s.prepare(&h.transaction, 1).unwrap();
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    assert_eq!(kv(&mut admin, &table), expected);
    assert!(s.destination().staged().unwrap().is_empty());

    // The job fails during checkpoint 2 after writing part of it, restarts
    // from checkpoint 1 and replays: the replayed records overwrite the
    // same keys with the same values; nothing is added.
    let more: Vec<String> = (300..400)
        .map(|i| format!("{}\tv{i}\t{i}", i % 50))
        .collect();
    let h2 = s.begin().unwrap();
    s.write(&h2.transaction, &batch(&more[..30])).unwrap();
    drop(s);
    let restore = Restore {
        checkpoint: 1,
        known: vec![h.clone()],
    };
    let mut s = open(
        &opts,
        ctx(&sink, "run1", 0, 1),
        sink_options(),
        Some(&restore),
    )
    .unwrap();
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    let h3 = s.begin().unwrap();
    for chunk in more.chunks(40) {
        s.write(&h3.transaction, &batch(chunk)).unwrap();
    }
    let h3 = s.prepare(&h3.transaction, 2).unwrap();
    s.commit(&h3).unwrap();
    let expected: Vec<(i64, String, i32)> = (350..400)
        .map(|i| ((i % 50) as i64, format!("v{i}"), i))
        .collect();
    assert_eq!(kv(&mut admin, &table), expected);

    // Replaying everything from the start changes nothing.
    let mut s = open(&opts, ctx(&sink, "run2", 0, 1), sink_options(), None).unwrap();
    let h = s.begin().unwrap();
    for chunk in records.chunks(64).chain(more.chunks(64)) {
        s.write(&h.transaction, &batch(chunk)).unwrap();
    }
    assert_eq!(kv(&mut admin, &table), expected);
}

#[test]
fn csv_and_a_composite_key_where_every_column_is_key() {
    let url = server!();
    let mut admin = admin(&url);
    let table = unique("t_pair");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (a text, b int, PRIMARY KEY (a, b))"
        ))
        .unwrap();
    let mut opts = PgOptions::new(twopc_pg::Endpoint::Url(url.clone()), &table, &["a", "b"]);
    opts.copy_format = CopyFormat::Csv;
    opts.mode = PgMode::Idempotent {
        key_columns: vec!["b".into(), "a".into()],
    };
    let mut s = open(
        &opts,
        ctx(&unique("pair"), "run1", 0, 1),
        sink_options(),
        None,
    )
    .unwrap();
    let h = s.begin().unwrap();
    let records = ["\"x,1\",1", "\"x,1\",1", "y,2", "y,2", "y,3"];
    s.write(&h.transaction, &batch(&records)).unwrap();
    s.write(&h.transaction, &batch(&records)).unwrap();
    let rows: Vec<String> = admin
        .query(
            &format!("SELECT a || '/' || b FROM {table} ORDER BY a, b"),
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
    let mut admin = admin(&url);
    let table = unique("t_idem_lost");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (k bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL)"
        ))
        .unwrap();
    let opts = kv_options(&url, &table);
    let mut s = open(
        &opts,
        ctx(&unique("idl"), "run1", 0, 1),
        sink_options(),
        None,
    )
    .unwrap();
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&["1\ta\t1"])).unwrap();
    let pid = s.destination().writer_backend_pid().unwrap();
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    // The batch on the dead session fails (the job would restart and
    // replay); the next one reconnects and recreates the staging table.
    let first = s.write(&h.transaction, &batch(&["2\tb\t2"]));
    if first.is_err() {
        s.write(&h.transaction, &batch(&["2\tb\t2"])).unwrap();
    }
    assert_eq!(count(&mut admin, &table), 2);
}
