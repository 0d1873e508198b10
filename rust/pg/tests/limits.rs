//! The server's time limits against the writer session: none cuts the
//! transactional mode's checkpoint-long COPY, and a write blocked by a lock
//! fails after `lock_timeout`, naming the prepared transactions that hold
//! locks on the table, instead of waiting forever.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use twopc_core::committer::CommitOutcome;
use twopc_pg::{PgMode, PgOptions};

/// `opts` connecting with `settings` as the connection's session defaults
/// (`options=-c name=value ...`), as a role's or database's settings
/// would be (ALTER ROLE ... SET): the same defaults, without changing the
/// test user that every test shares.
fn with_session_defaults(f: &Fixture, settings: &[&str]) -> PgOptions {
    let defaults: Vec<String> = settings
        .iter()
        .map(|s| format!("-c%20{}", s.replace('=', "%3D")))
        .collect();
    let separator = if f.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}options={}", f.url, defaults.join("%20"));
    let mut opts = options(&url, &f.table);
    opts.columns = f.opts.columns.clone();
    opts.mode = f.opts.mode.clone();
    opts
}

fn server_version(f: &mut Fixture) -> i32 {
    f.admin
        .query_one("SELECT current_setting('server_version_num')::int4", &[])
        .unwrap()
        .get(0)
}

#[test]
fn the_writer_session_lifts_the_time_limits_and_bounds_lock_waits() {
    let url = server!();
    let mut f = Fixture::new(&url, "limits_settings");
    let version = server_version(&mut f);
    let mut s = f.open("run1");
    let dest = s.destination();
    for (name, value) in [
        ("statement_timeout", "0"),
        ("idle_in_transaction_session_timeout", "0"),
        ("lock_timeout", "1min"),
    ] {
        assert_eq!(dest.writer_setting(name).unwrap(), value, "{name}");
    }
    if version >= 170000 {
        assert_eq!(dest.writer_setting("transaction_timeout").unwrap(), "0");
    }
    drop(s);

    // A lock_timeout set for the user (here: the connection) is kept; the
    // limits that would cut the COPY are not.
    let mut defaults = vec![
        "lock_timeout=250",
        "statement_timeout=250",
        "idle_in_transaction_session_timeout=250",
    ];
    if version >= 170000 {
        defaults.push("transaction_timeout=250");
    }
    f.opts = with_session_defaults(&f, &defaults);
    let mut s = f.open("run2");
    let dest = s.destination();
    assert_eq!(dest.writer_setting("lock_timeout").unwrap(), "250ms");
    assert_eq!(dest.writer_setting("statement_timeout").unwrap(), "0");
}

#[test]
fn a_statement_timeout_shorter_than_the_checkpoint_interval_does_not_cut_the_copy() {
    let url = server!();
    let mut f = Fixture::new(&url, "limits_stmt");
    let version = server_version(&mut f);
    // The user's defaults cap a statement (and, on 17, a transaction) at
    // 300 ms; the checkpoint's COPY lasts longer. Before the fix the server
    // cancelled it and every checkpoint failed.
    let mut defaults = vec!["statement_timeout=300"];
    if version >= 170000 {
        defaults.push("transaction_timeout=300");
    }
    f.opts = with_session_defaults(&f, &defaults);
    let mut s = f.open("run1");
    let h = written(&mut s, &rows(0..5, "a"));
    std::thread::sleep(Duration::from_millis(700));
    s.write(&h.transaction, &batch(&rows(5..10, "a"))).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let h = s.prepare(&h.transaction, 1).unwrap();
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    assert_eq!(f.count(), 10);
}

/// A role's or database's `idle_session_timeout` (PostgreSQL 14 and later)
/// shorter than the checkpoint interval: the control session idles between
/// prepares (it records each prepared handle), and the writer session
/// between a prepare and the next record. Before the fix the server ended
/// them, and the next prepare (or begin) failed as a lost connection, after
/// every restart again.
#[test]
fn an_idle_session_timeout_shorter_than_the_checkpoint_interval_ends_no_session() {
    let url = server!();
    let mut f = Fixture::new(&url, "limits_idle");
    if server_version(&mut f) < 140000 {
        eprintln!("skipped: idle_session_timeout needs PostgreSQL 14 or later");
        return;
    }
    f.opts = with_session_defaults(&f, &["idle_session_timeout=300"]);
    let mut s = f.open("run1");
    assert_eq!(
        s.destination()
            .writer_setting("idle_session_timeout")
            .unwrap(),
        "0"
    );
    for (checkpoint, ids) in [(1, 0..5), (2, 5..10), (3, 10..15)] {
        let h = prepared(&mut s, &rows(ids, "a"), checkpoint);
        assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
        // Longer than the sessions' limit, as a checkpoint interval is.
        std::thread::sleep(Duration::from_millis(800));
    }
    assert_eq!(f.count(), 15);
}

/// Rolls back a prepared transaction made by hand, however the test ends.
struct RollBack {
    url: String,
    gid: String,
}

impl Drop for RollBack {
    fn drop(&mut self) {
        let _ = admin(&self.url).batch_execute(&format!("ROLLBACK PREPARED '{}'", self.gid));
    }
}

/// A transaction prepared by hand, of no running job, that inserted key
/// `id` into the fixture's table: it holds the key's lock until decided.
fn lingering_prepared(f: &mut Fixture, columns: &str, values: &str) -> RollBack {
    let gid = unique("lingering");
    let mut c = admin(&f.url);
    c.batch_execute(&format!(
        "BEGIN; INSERT INTO {} ({columns}) VALUES ({values}); PREPARE TRANSACTION '{gid}'",
        f.table
    ))
    .unwrap();
    RollBack {
        url: f.url.clone(),
        gid,
    }
}

#[test]
fn a_copy_blocked_by_a_lingering_prepared_transaction_fails_naming_it() {
    let url = server!();
    let mut f = Fixture::with_columns(&url, "limits_lock", "id bigint PRIMARY KEY, body text");
    let lingering = lingering_prepared(&mut f, "id, body", "3, 'x'");
    // A short lock_timeout of the user's keeps the test short; the sink's
    // own bound is a minute.
    f.opts = with_session_defaults(&f, &["lock_timeout=300"]);
    let mut s = f.open("run1");
    let h = written(&mut s, &rows(0..5, "a"));
    let err = s.prepare(&h.transaction, 1).unwrap_err();
    let msg = err.to_string();
    assert!(!err.is_fatal(), "{msg}");
    for needle in [
        "55P03",
        &format!("'{}'", lingering.gid),
        "prepared transactions holding locks on it",
        "COMMIT PREPARED",
        "twopc decide",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing: {msg}");
    }
    s.abort(&h).unwrap();

    // Once decided, the same records load.
    drop(lingering);
    let h = written(&mut s, &rows(0..5, "b"));
    let h = s.prepare(&h.transaction, 2).unwrap();
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    assert_eq!(f.count(), 5);
}

#[test]
fn an_upsert_blocked_by_a_lingering_prepared_transaction_fails_naming_it() {
    let url = server!();
    let mut f = Fixture::with_columns(&url, "limits_upsert", "k bigint PRIMARY KEY, v text");
    f.opts.columns = vec!["k".into(), "v".into()];
    f.opts.mode = PgMode::Idempotent {
        key_columns: vec!["k".into()],
    };
    let lingering = lingering_prepared(&mut f, "k, v", "2, 'x'");
    f.opts = with_session_defaults(&f, &["lock_timeout=300"]);
    let mut s = f.open("run1");
    let h = s.begin().unwrap();
    let err = s
        .write(&h.transaction, &batch(&["1\ta", "2\tb"]))
        .unwrap_err();
    let msg = err.to_string();
    for needle in [
        "55P03",
        &format!("'{}'", lingering.gid),
        "prepared transactions holding locks on it",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing: {msg}");
    }
    s.abort(&h).unwrap();
    assert_eq!(f.count(), 0, "the batch was rolled back");
}
