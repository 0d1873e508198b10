//! Idempotent mode with an operation field against a real server: records
//! upsert (`U`) or delete by key (`D`), the last operation of each key in a
//! batch decides, and a replay of a changelog leaves the table as the
//! changelog says (what the SQL connector's upsert tables rely on).

#[macro_use]
mod common;

use std::collections::BTreeMap;

use common::*;
use twopc_core::committer::CommitOutcome;
use twopc_core::destination::Destination;
use twopc_core::TwopcError;
use twopc_pg::{CopyFormat, PgDestination, PgMode};

/// Idempotent with deletes into a table of key `k` and values `v`, `n`.
fn fixture(url: &str, prefix: &str) -> Fixture {
    let mut f = Fixture::keyed_by_k(
        url,
        prefix,
        "k bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL",
        &["k", "v", "n"],
    );
    f.opts.operation_field = true;
    f
}

fn table(f: &mut Fixture) -> BTreeMap<i64, (String, i32)> {
    f.admin
        .query(&format!("SELECT k, v, n FROM {}", f.table), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect()
}

/// A changelog over 40 keys: mostly upserts, every fifth operation a delete
/// (whose other fields are NULL, as a key-only delete carries them), with
/// keys deleted and written again.
fn changelog(ops: std::ops::Range<i32>) -> Vec<String> {
    ops.map(|i| {
        let k = (i * 7) % 40;
        if i % 5 == 3 {
            format!("{k}\t\\N\t\\N\tD")
        } else {
            format!("{k}\tv{i}\t{i}\tU")
        }
    })
    .collect()
}

/// What the table holds after `records` applied one by one.
fn model(records: &[String]) -> BTreeMap<i64, (String, i32)> {
    let mut m = BTreeMap::new();
    for r in records {
        let f: Vec<&str> = r.split('\t').collect();
        let k: i64 = f[0].parse().unwrap();
        if f[3] == "D" {
            m.remove(&k);
        } else {
            m.insert(k, (f[1].to_string(), f[2].parse().unwrap()));
        }
    }
    m
}

#[test]
fn upserts_and_deletes_leave_the_table_as_the_changelog_says_across_batches_and_replays() {
    let url = server!();
    let mut f = fixture(&url, "del");
    let log = changelog(0..400);

    // Batches of several sizes: a key is upserted and deleted within one
    // batch and across batches.
    let mut s = f.open("run1");
    let h = prepared_in_batches(&mut s, &log[..150], 37, 1);
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    assert_eq!(table(&mut f), model(&log[..150]));

    // A failure during checkpoint 2: part of it was written (and is
    // visible), then the job restarts from checkpoint 1 and replays from
    // record 150 on.
    written(&mut s, &log[150..260]);
    drop(s);
    let mut s = f.open_restored("run1", &restore_from(1, &[&h]));
    let h2 = prepared_in_batches(&mut s, &log[150..], 64, 2);
    s.commit(&h2).unwrap();
    assert_eq!(table(&mut f), model(&log));
    assert!(s.destination().staged().unwrap().is_empty());

    // Replaying the whole changelog again, one record per batch, changes
    // nothing.
    drop(s);
    let mut s = f.open("run2");
    let h = prepared_in_batches(&mut s, &log, 1, 1);
    s.commit(&h).unwrap();
    assert_eq!(table(&mut f), model(&log));
    assert!(!model(&log).is_empty() && model(&log).len() < 40);
}

#[test]
fn a_delete_of_an_absent_key_does_nothing_and_the_last_operation_of_a_key_wins() {
    let url = server!();
    let mut f = fixture(&url, "del_last");
    f.opts.copy_format = CopyFormat::Csv;
    let mut s = f.open("run1");
    let h = written(
        &mut s,
        &[
            "1,a,1,U", "2,b,2,U", "1,,,D", // 1: upserted then deleted
            "3,,,D", // never there
            "2,,,D", "2,c,3,U", // 2: deleted then upserted
        ],
    );
    s.prepare(&h.transaction, 1).unwrap();
    let expected: BTreeMap<i64, (String, i32)> = [(2, ("c".to_string(), 3))].into();
    assert_eq!(table(&mut f), expected);
}

#[test]
fn records_without_a_valid_operation_are_refused_by_position() {
    let url = server!();
    let mut f = fixture(&url, "del_bad");
    let mut s = f.open("run1");
    let h = s.begin().unwrap();

    // One field short: found before anything is sent.
    let (r, msg) = rejected(s.write(&h.transaction, &batch(&["1\ta\t1\tU", "2\tb\t2"])));
    assert_eq!(r.position, Some(1), "{msg}");
    assert!(msg.contains("3 fields but 4 columns"), "{msg}");
    assert_eq!(f.count(), 0);
    s.abort(&h).unwrap();

    // An operation other than U or D: refused by the staging table's
    // check, named by its line.
    let h = s.begin().unwrap();
    let (r, msg) = rejected(s.write(
        &h.transaction,
        &batch(&["1\ta\t1\tU", "2\tb\t2\tU", "3\tc\t3\tX"]),
    ));
    assert_eq!(r.position, Some(2), "{msg}");
    assert!(msg.contains("23514"), "{msg}");
    assert_eq!(f.count(), 0, "the refused batch rolled back");
    s.abort(&h).unwrap();
}

#[test]
fn a_delete_the_server_refuses_is_found_by_bisection() {
    let url = server!();
    let mut f = fixture(&url, "del_fk");
    let child = unique("t_child");
    f.admin
        .batch_execute(&format!(
            "INSERT INTO {t} VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3); \
             CREATE TABLE {child} (parent bigint REFERENCES {t} (k)); \
             INSERT INTO {child} VALUES (2)",
            t = f.table
        ))
        .unwrap();
    let mut s = f.open("run1");
    let h = s.begin().unwrap();
    // Deleting key 2 violates the child's foreign key.
    let records = [
        "4\td\t4\tU",
        "1\t\\N\t\\N\tD",
        "2\t\\N\t\\N\tD",
        "5\te\t5\tU",
    ];
    let (r, msg) = rejected(s.write(&h.transaction, &batch(&records)));
    assert_eq!(r.position, Some(2), "{msg}");
    assert!(msg.contains("23503"), "{msg}");
    assert_eq!(f.count(), 3, "the refused batch rolled back: {msg}");
    let _ = f.admin.batch_execute(&format!("DROP TABLE {child}"));
}

/// With the operation field, the upsert deletes the batch's `D` keys before
/// any upsert, the search for a refused record part by part: a duplicate
/// the search meets in a part, of a key the batch deletes later, is not the
/// batch's fault and must not be named at once (found by review).
#[test]
fn with_deletes_a_duplicate_met_in_a_part_is_not_named_at_once() {
    let url = server!();
    let mut f = Fixture::keyed_by_k(
        &url,
        "del_uq",
        "k bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL UNIQUE",
        &["k", "v", "n"],
    );
    f.opts.operation_field = true;
    f.admin
        .batch_execute(&format!("INSERT INTO {} VALUES (2, 'b', 7)", f.table))
        .unwrap();
    let mut s = f.open("run1");
    let h = s.begin().unwrap();
    // Key 1 takes n = 7 from key 2, which the batch deletes after it; then
    // a NOT NULL violation, the batch's real fault.
    let (r, msg) = rejected(s.write(
        &h.transaction,
        &batch(&["1\ta\t7\tU", "2\t\\N\t\\N\tD", "3\t\\N\t3\tU"]),
    ));
    assert_ne!(r.position, Some(0), "{msg}");
    assert!(msg.contains("23502"), "{msg}");
    assert_eq!(f.count(), 1, "the refused batch rolled back");
}

#[test]
fn deletes_need_the_delete_privilege_and_only_idempotent_mode_takes_them() {
    let url = server!();
    let mut f = fixture(&url, "del_rights");
    let table = f.table.clone();
    let role = unique("upserter");
    let pw = "upserter-pw-9c2f";
    f.admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{pw}'; \
             GRANT SELECT, INSERT, UPDATE ON {table} TO {role}; \
             GRANT CREATE ON SCHEMA public TO {role}"
        ))
        .unwrap();
    let mut opts = options_as(&url, &role, pw, format!("public.{table}"), &["k", "v", "n"]);
    opts.mode = f.opts.mode.clone();
    opts.operation_field = true;
    let result = PgDestination::connect(opts.clone(), &f.ctx("run1"));
    let _ = f.admin.batch_execute(&format!(
        "REVOKE ALL ON {table} FROM {role}; REVOKE CREATE ON SCHEMA public FROM {role}; \
         DROP OWNED BY {role}; DROP ROLE {role}"
    ));
    let msg = match result {
        Err(TwopcError::Config(e)) => e.to_string(),
        other => panic!("expected a configuration error, got {other:?}"),
    };
    assert!(msg.contains("lacks the DELETE privilege"), "{msg}");
    assert!(msg.contains("GRANT DELETE ON"), "{msg}");
    assert!(!msg.contains(pw), "{msg}");

    let mut transactional = f.opts.clone();
    transactional.mode = PgMode::Transactional;
    let e = transactional.validate().unwrap_err().to_string();
    assert!(e.contains("applies to idempotent mode only"), "{e}");
}

/// A key column with a collation of its own, here a case-insensitive one
/// (non-deterministic: 'a' and 'A' are one key for the table's index): the
/// staging table keeps it, so the last operation of each key is picked
/// under the index's collation. Before, the staging column took the
/// default collation, 'a' and 'A' were two keys there, and the upsert met
/// the same row twice ("ON CONFLICT DO UPDATE command cannot affect row a
/// second time"), a failure every replay repeated.
#[test]
fn keys_with_a_collation_of_their_own_are_upserted_and_deleted() {
    let url = server!();
    let mut admin = admin(&url);
    let collation = unique("ci");
    admin
        .batch_execute(&format!(
            "CREATE COLLATION {collation} (provider = icu, locale = 'und-u-ks-level2', \
             deterministic = false)"
        ))
        .expect("this test needs a PostgreSQL server built with ICU (Debian's and most are)");
    let mut f = Fixture::with_columns(
        &url,
        "del_coll",
        &format!("k text COLLATE {collation} PRIMARY KEY, v text[] COLLATE \"C\", n int NOT NULL"),
    );
    f.opts.columns = vec!["k".into(), "v".into(), "n".into()];
    f.opts.mode = PgMode::Idempotent {
        key_columns: vec!["k".into()],
    };
    f.opts.operation_field = true;
    let mut s = f.open("run1");
    let h = prepared(
        &mut s,
        &[
            "a\t{x}\t1\tU",
            "b\t{y}\t2\tU",
            "A\t{z}\t3\tU",
            "c\t{w}\t4\tU",
        ],
        1,
    );
    s.commit(&h).unwrap();
    let h = prepared(
        &mut s,
        &["B\t\\N\t\\N\tD", "C\t{v}\t5\tU", "a\t{u}\t6\tU"],
        2,
    );
    s.commit(&h).unwrap();
    drop(s);
    let rows: Vec<(String, i32)> = f
        .admin
        .query(
            &format!("SELECT lower(k), n FROM {} ORDER BY 1", f.table),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, vec![("a".to_string(), 6), ("c".to_string(), 5)]);

    // A unique index that compares the key under another collation than
    // the column's: the batch's keys would be matched otherwise than the
    // index does, so the start is refused, naming the index.
    let mut g = Fixture::with_columns(
        &url,
        "del_coll_idx",
        &format!("k text COLLATE {collation} NOT NULL, v text[], n int"),
    );
    // A mixed-case name, which the server quotes: the message names it
    // as it is written in SQL, quoted once.
    g.admin
        .batch_execute(&format!(
            "CREATE UNIQUE INDEX \"{t}_K_c\" ON {t} (k COLLATE \"C\")",
            t = g.table
        ))
        .unwrap();
    g.opts.columns = vec!["k".into(), "v".into(), "n".into()];
    g.opts.mode = PgMode::Idempotent {
        key_columns: vec!["k".into()],
    };
    g.opts.operation_field = true;
    let err = match PgDestination::connect(g.opts.clone(), &g.ctx("run1")) {
        Ok(_) => panic!("an index with another collation than its column was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("under another collation"), "{err}");
    assert!(
        err.contains(&format!("index \"{}_K_c\" of", g.table)),
        "{err}"
    );

    // Deterministic collations agree on which keys are equal, whatever
    // their order: a "C" index on a default-collation key is accepted.
    let mut d = Fixture::with_columns(&url, "del_coll_det", "k text NOT NULL, v text[], n int");
    d.admin
        .batch_execute(&format!(
            "CREATE UNIQUE INDEX {t}_k_c ON {t} (k COLLATE \"C\")",
            t = d.table
        ))
        .unwrap();
    d.opts.columns = vec!["k".into(), "v".into(), "n".into()];
    d.opts.mode = PgMode::Idempotent {
        key_columns: vec!["k".into()],
    };
    d.opts.operation_field = true;
    let mut s = d.open("run1");
    let h = prepared(&mut s, &["a\t{x}\t1\tU", "A\t{y}\t2\tU"], 1);
    s.commit(&h).unwrap();
    drop(s);
    assert_eq!(count(&mut d.admin, &d.table), 2);
    for sql in [
        format!("DROP TABLE {}", d.table),
        format!("DROP TABLE {}", f.table),
        format!("DROP TABLE {}", g.table),
        format!("DROP COLLATION {collation}"),
    ] {
        f.admin.batch_execute(&sql).unwrap();
    }
}
