//! `twopc reconcile` and `twopc decide` against a real PostgreSQL server
//! (TWOPC_PG_URL, from `scripts/postgres.sh start`; without it the tests
//! fail and say so, unless TWOPC_PG_OPTIONAL=1).

mod common;

use std::process::{Command, Output};

use common::{batch, stderr, stdout};
use postgres::{Client, NoTls};
use twopc_core::{
    CommitOutcome, FreshStartPolicy, RunId, SinkId, SinkOptions, SubtaskContext, SubtaskSink,
    SystemClock, TransactionHandle,
};
use twopc_pg::{Endpoint, Password, PgDestination, PgOptions};

type Sink = SubtaskSink<PgDestination, SystemClock>;

fn server() -> Option<String> {
    match std::env::var("TWOPC_PG_URL") {
        Ok(u) if !u.trim().is_empty() => Some(u),
        _ if std::env::var("TWOPC_PG_OPTIONAL").as_deref() == Ok("1") => {
            println!("skipped: no server (TWOPC_PG_URL is not set)");
            None
        }
        _ => panic!(
            "TWOPC_PG_URL is not set: these tests need a PostgreSQL server. Run `eval \
             \"$(scripts/postgres.sh start)\"` and run the tests again; set \
             TWOPC_PG_OPTIONAL=1 to skip them instead"
        ),
    }
}

/// `postgres://user:pw@host/db` split into the URL without the password
/// and the password.
fn split_password(url: &str) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (userinfo, host) = rest.split_once('@').unwrap();
    let (user, pw) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    (format!("{scheme}://{user}@{host}"), pw.to_string())
}

struct Pg {
    admin: Client,
    url: String,
    password: String,
    table: String,
    sink: String,
}

impl Pg {
    fn new(url: &str, tag: &str) -> Pg {
        let mut admin = Client::connect(url, NoTls).unwrap();
        let n = twopc_core::ids::random_u64() as u32;
        let table = format!("cli_{tag}_{n:08x}");
        admin
            .batch_execute(&format!(
                "CREATE TABLE {table} (id bigint NOT NULL, body text, txn text NOT NULL)"
            ))
            .unwrap();
        let (url, password) = split_password(url);
        Pg {
            admin,
            url,
            password,
            table,
            sink: format!("cli-{tag}-{n:08x}"),
        }
    }

    fn options(&self) -> PgOptions {
        let mut o = PgOptions::new(
            Endpoint::Url(self.url.clone()),
            self.table.clone(),
            &["id", "body"],
        );
        o.password = Some(Password::new(self.password.clone()));
        o.transaction_id_column = Some("txn".into());
        o
    }

    fn open(&self, run: &str, fresh_start: FreshStartPolicy) -> Sink {
        let ctx = SubtaskContext::new(
            SinkId::new(self.sink.clone()).unwrap(),
            RunId::new(run).unwrap(),
            0,
            1,
        )
        .unwrap();
        let dest = PgDestination::connect(self.options(), &ctx).unwrap();
        let opts = SinkOptions {
            fresh_start,
            ..SinkOptions::default()
        };
        SubtaskSink::open(dest, SystemClock, ctx, opts, None, None)
            .unwrap()
            .0
    }

    fn count(&mut self) -> i64 {
        self.admin
            .query_one(&format!("SELECT count(*) FROM {}", self.table), &[])
            .unwrap()
            .get(0)
    }

    /// The sink's operations log, as `twopc` wrote it (rendered records).
    fn operations(&mut self) -> Vec<String> {
        self.admin
            .query(
                "SELECT record FROM public.twopc_operations WHERE sink_id = $1 ORDER BY at_ms, id",
                &[&self.sink],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    fn prepared_xacts(&mut self) -> Vec<String> {
        self.admin
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE $1 ORDER BY gid",
                &[&format!("{}.%", self.sink)],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Runs `twopc <command> <url> --sink S <args>` with the password in
    /// PGPASSWORD.
    fn twopc(&self, command: &str, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_twopc"))
            .arg(command)
            .arg(&self.url)
            .args(["--sink", &self.sink, "--table", &self.table])
            .args(args)
            .env_remove("RUST_LOG")
            .env("PGPASSWORD", &self.password)
            .output()
            .unwrap()
    }
}

fn rows(ids: std::ops::Range<i64>) -> Vec<String> {
    ids.map(|i| format!("{i}\tr{i}")).collect()
}

fn prepare(s: &mut Sink, ids: std::ops::Range<i64>, checkpoint: u64) -> TransactionHandle {
    let t = s.begin().unwrap();
    s.write(
        &t.transaction,
        &batch(&rows(ids).iter().map(String::as_str).collect::<Vec<_>>()),
    )
    .unwrap();
    s.prepare(&t.transaction, checkpoint).unwrap()
}

fn commit(s: &mut Sink, ids: std::ops::Range<i64>, checkpoint: u64) -> TransactionHandle {
    let h = prepare(s, ids, checkpoint);
    assert_eq!(s.commit(&h).unwrap(), CommitOutcome::Committed);
    h
}

#[test]
fn reconcile_postgres_dry_run_apply_and_repeat() {
    let Some(url) = server() else { return };
    let mut pg = Pg::new(&url, "rc");
    let mut s = pg.open("run1", FreshStartPolicy::Fail);
    let h1 = commit(&mut s, 0..5, 1);
    let h2 = commit(&mut s, 5..8, 2);
    let h3 = commit(&mut s, 8..10, 3);
    let lineage = s.lineage().to_string();

    // While the run lives, both commands are refused.
    let rc = ["--lineage", &lineage, "--after-checkpoint", "1"];
    let o = pg.twopc(
        "reconcile",
        &[&rc[..], &["--apply", "--transaction-id-column", "txn"]].concat(),
    );
    assert_eq!(o.status.code(), Some(3), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("owned by a live run"), "{}", stderr(&o));
    assert!(stderr(&o).contains("run1"), "{}", stderr(&o));
    assert_eq!(pg.count(), 10);
    drop(s);

    // Dry run: lists checkpoints 2 and 3, changes nothing.
    let o = pg.twopc("reconcile", &rc);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    assert!(
        text.contains(&format!("would remove {}", h2.transaction)),
        "{text}"
    );
    assert!(
        text.contains(&format!("would remove {}", h3.transaction)),
        "{text}"
    );
    assert!(!text.contains(h1.transaction.as_str()), "{text}");
    assert!(text.contains("--transaction-id-column"), "{text}");
    assert_eq!(pg.count(), 10);

    // --apply without the transaction-id column: refused, says what to do.
    let o = pg.twopc("reconcile", &[&rc[..], &["--apply"]].concat());
    assert_eq!(o.status.code(), Some(3));
    let err = stderr(&o);
    assert!(err.contains("--transaction-id-column"), "{err}");
    assert!(err.contains("delete them by hand"), "{err}");
    assert_eq!(pg.count(), 10);

    // A column the table lacks is named.
    let o = pg.twopc(
        "reconcile",
        &[&rc[..], &["--apply", "--transaction-id-column", "nope"]].concat(),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("has no column \"nope\""),
        "{}",
        stderr(&o)
    );
    assert_eq!(pg.count(), 10);

    // --apply: rows and commit records of checkpoints 2 and 3 go.
    let apply = [&rc[..], &["--apply", "--transaction-id-column", "txn"]].concat();
    let o = pg.twopc("reconcile", &apply);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("Removed 2 transaction(s), 5 records"),
        "{}",
        stdout(&o)
    );
    assert_eq!(pg.count(), 5);
    let left: i64 = pg
        .admin
        .query_one(
            "SELECT count(*) FROM twopc_commit_records WHERE sink_id = $1",
            &[&pg.sink],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 1);

    // Again: nothing to remove.
    let o = pg.twopc("reconcile", &apply);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("nothing to remove"), "{}", stdout(&o));
    assert_eq!(pg.count(), 5);
}

#[test]
fn decide_postgres_commit_and_abort_of_prepared_leftovers() {
    let Some(url) = server() else { return };
    let mut pg = Pg::new(&url, "dc");
    let mut s = pg.open("run1", FreshStartPolicy::Fail);
    commit(&mut s, 0..2, 1);
    let keep = prepare(&mut s, 2..5, 2);
    drop(s);
    // Run1 died with checkpoint 2 prepared: a leftover.
    assert_eq!(pg.prepared_xacts(), vec![keep.transaction.to_string()]);

    let o = pg.twopc("decide", &["--commit", keep.transaction.as_str()]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("committed transaction"),
        "{}",
        stdout(&o)
    );
    assert_eq!(pg.count(), 5);
    assert!(pg.prepared_xacts().is_empty());
    let o = pg.twopc("decide", &["--commit", keep.transaction.as_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("already committed"), "{}", stdout(&o));
    assert_eq!(pg.count(), 5);

    // Another leftover, aborted by hand; twice.
    let mut s = pg.open("run2", FreshStartPolicy::Append);
    let drop_it = prepare(&mut s, 10..13, 1);
    drop(s);
    assert_eq!(pg.prepared_xacts(), vec![drop_it.transaction.to_string()]);
    let o = pg.twopc("decide", &["--abort", drop_it.transaction.as_str()]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("aborted transaction"), "{}", stdout(&o));
    assert!(pg.prepared_xacts().is_empty());
    assert_eq!(pg.count(), 5);
    let o = pg.twopc("decide", &["--abort", drop_it.transaction.as_str()]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("nothing changed"), "{}", stdout(&o));

    // Every decision is in the operations log: the request, then the outcome.
    let log = pg.operations();
    assert_eq!(log.len(), 8, "{log:#?}");
    assert!(log[0].contains("what=commit requested"), "{}", log[0]);
    assert!(
        log[1].contains("what=commit: committed, output visible")
            && log[1].contains(&format!("transaction={}", keep.transaction)),
        "{}",
        log[1]
    );
    assert!(
        log[5].contains("what=abort: aborted, staged data removed"),
        "{}",
        log[5]
    );
    let o = pg.twopc("inspect", &["--json", "--all"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["sinks"][0]["operations_total"], 8, "{v}");
}

fn open_subtask(pg: &Pg, run: &str, subtask: u32, parallelism: u32) -> Sink {
    let ctx = SubtaskContext::new(
        SinkId::new(pg.sink.clone()).unwrap(),
        RunId::new(run).unwrap(),
        subtask,
        parallelism,
    )
    .unwrap();
    let dest = PgDestination::connect(pg.options(), &ctx).unwrap();
    SubtaskSink::open(dest, SystemClock, ctx, SinkOptions::default(), None, None)
        .unwrap()
        .0
}

#[test]
fn inspect_postgres_flags_a_partly_visible_checkpoint_and_decide_resolves_it() {
    let Some(url) = server() else { return };
    let pg = Pg::new(&url, "in");
    let mut s0 = open_subtask(&pg, "run1", 0, 2);
    let mut s1 = open_subtask(&pg, "run1", 1, 2);
    commit(&mut s0, 0..3, 1);
    commit(&mut s1, 3..5, 1);
    let ok = prepare(&mut s0, 5..7, 2);
    let pending = prepare(&mut s1, 7..10, 2);
    assert_eq!(s0.commit(&ok).unwrap(), CommitOutcome::Committed);
    drop((s0, s1));

    let o = pg.twopc("inspect", &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sink = &v["sinks"][0];
    assert_eq!(sink["committed_total"], 3);
    assert_eq!(sink["committed_records"], 7);
    assert_eq!(sink["lineages"][0]["runs"][0]["run"], "run1");
    let partly: Vec<&str> = v["attention"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "partly-visible-checkpoint")
        .map(|f| f["message"].as_str().unwrap())
        .collect();
    assert_eq!(partly.len(), 1, "{v:#}");
    let cmd = format!(
        "twopc decide {} --sink {} --commit {}",
        pg.url, pg.sink, pending.transaction
    );
    assert!(partly[0].contains(&cmd), "{}", partly[0]);
    // The password never shows.
    assert!(!stdout(&o).contains(&pg.password), "{}", stdout(&o));

    let o = pg.twopc("decide", &["--commit", pending.transaction.as_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = pg.twopc("inspect", &[]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("Nothing needs attention"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("4 committed (10 records)"),
        "{}",
        stdout(&o)
    );

    // Without --sink: every sink of the database, this one and another.
    let other = Pg::new(&url, "in2");
    let mut s = other.open("run1", FreshStartPolicy::Fail);
    commit(&mut s, 0..2, 1);
    drop(s);
    let o = Command::new(env!("CARGO_BIN_EXE_twopc"))
        .args(["inspect", &pg.url, "--json"])
        .env_remove("RUST_LOG")
        .env("PGPASSWORD", &pg.password)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(&o), stderr(&o)));
    let sinks: Vec<&serde_json::Value> = v["sinks"].as_array().unwrap().iter().collect();
    for (name, records) in [(&pg.sink, 10), (&other.sink, 2)] {
        let found = sinks
            .iter()
            .find(|s| s["sink"] == name.as_str())
            .unwrap_or_else(|| panic!("sink {name} missing from {v:#}"));
        assert_eq!(found["committed_records"], records, "{found:#}");
    }
}

/// Checkpoint 2's transaction of subtask 1 is rolled back by an
/// administrator before its commit: a LOST stop. The committer's note makes
/// inspect flag the partly visible checkpoint; reconcile clears it.
#[test]
fn inspect_postgres_flags_a_partly_visible_checkpoint_after_a_lost_stop() {
    let Some(url) = server() else { return };
    let mut pg = Pg::new(&url, "lost");
    let mut s0 = open_subtask(&pg, "run1", 0, 2);
    let mut s1 = open_subtask(&pg, "run1", 1, 2);
    commit(&mut s0, 0..3, 1);
    let ok = prepare(&mut s0, 3..5, 2);
    let gone = prepare(&mut s1, 5..9, 2);
    assert_eq!(s0.commit(&ok).unwrap(), CommitOutcome::Committed);
    pg.admin
        .batch_execute(&format!("ROLLBACK PREPARED '{}'", gone.transaction))
        .unwrap();
    let err = s1.commit(&gone).unwrap_err();
    assert!(matches!(err, twopc_core::TwopcError::Lost(_)), "{err}");
    let lineage = s0.lineage().to_string();
    drop((s0, s1));

    let o = pg.twopc("inspect", &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let partly: Vec<&str> = v["attention"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "partly-visible-checkpoint")
        .map(|f| f["message"].as_str().unwrap())
        .collect();
    assert_eq!(partly.len(), 1, "{v:#}");
    assert!(partly[0].contains("4 records LOST"), "{}", partly[0]);
    assert!(
        partly[0].contains(gone.transaction.as_str()),
        "{}",
        partly[0]
    );
    assert!(
        partly[0].contains(&format!("--lineage {lineage} --after-checkpoint N")),
        "{}",
        partly[0]
    );

    let o = pg.twopc(
        "reconcile",
        &[
            "--lineage",
            &lineage,
            "--after-checkpoint",
            "1",
            "--transaction-id-column",
            "txn",
            "--apply",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(pg.count(), 3);
    let o = pg.twopc("inspect", &[]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}
