//! `twopc reconcile` and `twopc decide` against a real PostgreSQL server
//! (TWOPC_PG_URL, from `scripts/postgres.sh start`; without it the tests
//! fail and say so, unless TWOPC_PG_OPTIONAL=1).

mod common;

use std::process::{Command, Output};

use common::{batch, stderr, stdout};
use postgres::{Client, NoTls};
use twopc_core::destination::HistoryPolicy;
use twopc_core::{
    CommitOutcome, Destination, FreshStartPolicy, RunId, SinkId, SinkOptions, SubtaskContext,
    SubtaskSink, SystemClock, TransactionHandle,
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
    /// The sink's transaction-id column.
    column: Option<String>,
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
            column: Some("txn".into()),
        }
    }

    fn options(&self) -> PgOptions {
        let mut o = PgOptions::new(
            Endpoint::Url(self.url.clone()),
            self.table.clone(),
            &["id", "body"],
        );
        o.password = Some(Password::new(self.password.clone()));
        o.transaction_id_column = self.column.clone();
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

    /// Runs `twopc <command> <url> --sink S --table T <args>` with the
    /// password in PGPASSWORD.
    fn twopc(&self, command: &str, args: &[&str]) -> Output {
        self.twopc_without_table(command, &[&["--table", &self.table], args].concat())
    }

    /// Runs `twopc <command> <url> --sink S <args>`: the table is the one
    /// the sink recorded, if it did.
    fn twopc_without_table(&self, command: &str, args: &[&str]) -> Output {
        self.run(&[&[command, &self.url, "--sink", &self.sink], args].concat())
    }

    /// Runs `twopc <args>` with the password in PGPASSWORD.
    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_twopc"))
            .args(args)
            .env_remove("RUST_LOG")
            .env("PGPASSWORD", &self.password)
            .output()
            .unwrap()
    }

    /// Runs a command line `twopc` printed (`twopc ...`, words without
    /// quotes) as it is.
    fn run_printed(&self, line: &str) -> Output {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[0], "twopc", "{line}");
        self.run(&words[1..])
    }

    /// Commit records of this sink, loose and folded.
    fn history(&mut self) -> (i64, i64) {
        let count = |admin: &mut Client, sql: &str, sink: &str| -> i64 {
            admin.query_one(sql, &[&sink]).unwrap().get(0)
        };
        (
            count(
                &mut self.admin,
                "SELECT count(*) FROM twopc_commit_records WHERE sink_id = $1",
                &self.sink,
            ),
            count(
                &mut self.admin,
                "SELECT coalesce(sum(transactions), 0)::int8 FROM twopc_commit_segments \
                 WHERE sink_id = $1",
                &self.sink,
            ),
        )
    }
}

/// The text of `out` after `start`, to the end of its line (or to `end`).
fn after<'a>(out: &'a str, start: &str, end: char) -> &'a str {
    let i = out
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} missing: {out}"));
    let rest = &out[i + start.len()..];
    &rest[..rest.find([end, '\n']).unwrap_or(rest.len())]
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
fn reconcile_postgres_reads_the_table_and_column_the_sink_recorded() {
    let Some(url) = server() else { return };
    let mut pg = Pg::new(&url, "rc");
    let mut s = pg.open("run1", FreshStartPolicy::Fail);
    let h1 = commit(&mut s, 0..5, 1);
    let h2 = commit(&mut s, 5..8, 2);
    let h3 = commit(&mut s, 8..10, 3);
    let lineage = s.lineage().to_string();

    // While the run lives, the command is refused.
    let rc = ["--lineage", &lineage, "--after-checkpoint", "1"];
    let o = pg.twopc_without_table("reconcile", &[&rc[..], &["--apply"]].concat());
    assert_eq!(o.status.code(), Some(3), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("owned by a live run"), "{}", stderr(&o));
    assert!(stderr(&o).contains("run1"), "{}", stderr(&o));
    assert_eq!(pg.count(), 10);
    drop(s);

    // Dry run without --table: the sink's record names the table and the
    // column; lists checkpoints 2 and 3, changes nothing.
    let o = pg.twopc_without_table("reconcile", &rc);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    for h in [&h2, &h3] {
        assert!(
            text.contains(&format!("would remove {}", h.transaction)),
            "{text}"
        );
    }
    assert!(!text.contains(h1.transaction.as_str()), "{text}");
    assert!(
        text.contains(&format!(
            "Their rows are in public.{}, told apart by column txn (as sink '{}' recorded at \
             its start on ",
            pg.table, pg.sink
        )),
        "{text}"
    );
    let apply = after(&text, "To remove them, while the job stays stopped: ", '\n');
    assert_eq!(
        apply,
        format!(
            "twopc reconcile {} --sink {} --lineage {lineage} --after-checkpoint 1 --apply",
            pg.url, pg.sink
        )
    );
    assert_eq!(pg.count(), 10);

    // The same table named explicitly, qualified or not, agrees.
    for table in [pg.table.clone(), format!("public.{}", pg.table)] {
        let o = pg.twopc_without_table("reconcile", &[&rc[..], &["--table", &table]].concat());
        assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
        let printed = after(
            &stdout(&o),
            "To remove them, while the job stays stopped: ",
            '\n',
        )
        .to_string();
        assert!(
            printed.contains(&format!(" --table {table} --apply")),
            "{printed}"
        );
    }

    // A table or column that contradicts the record is refused, naming
    // both and what to do.
    let other = format!("{}_other", pg.table);
    pg.admin
        .batch_execute(&format!(
            "CREATE TABLE {other} (id bigint NOT NULL, body text, txn text)"
        ))
        .unwrap();
    let o = pg.twopc_without_table(
        "reconcile",
        &[&rc[..], &["--table", &other, "--apply"]].concat(),
    );
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    for needle in [
        format!(
            "--table {other} (public.{other}) is not the table sink '{}'",
            pg.sink
        ),
        format!("it writes to public.{}", pg.table),
        "twopc_sinks".to_string(),
        "Leave --table out".to_string(),
    ] {
        assert!(err.contains(&needle), "{needle:?} missing: {err}");
    }
    let o = pg.twopc_without_table(
        "reconcile",
        &[&rc[..], &["--transaction-id-column", "body", "--apply"]].concat(),
    );
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("--transaction-id-column body is not the column")
            && err.contains("it fills txn")
            && err.contains("Leave --transaction-id-column out"),
        "{err}"
    );
    // Rows deleted by hand are for a sink without the column.
    let o = pg.twopc_without_table(
        "reconcile",
        &[&rc[..], &["--rows-deleted-by-hand", "--apply"]].concat(),
    );
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("fills txn"), "{}", stderr(&o));
    assert_eq!(pg.count(), 10);

    // `twopc inspect` shows what the sink recorded.
    let o = pg.twopc_without_table("inspect", &["--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let target = &v["sinks"][0]["target"];
    assert_eq!(target["table"], format!("public.{}", pg.table), "{v:#}");
    assert_eq!(target["transaction_id_column"], "txn", "{v:#}");
    let o = pg.twopc_without_table("inspect", &[]);
    assert!(
        stdout(&o).contains(&format!(
            "  Target table public.{}, transaction-id column txn (as the sink recorded it on ",
            pg.table
        )),
        "{}",
        stdout(&o)
    );

    // The printed command, as it is: rows and commit records of
    // checkpoints 2 and 3 go.
    let o = pg.run_printed(apply);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("Removed 2 transaction(s), 5 records"),
        "{}",
        stdout(&o)
    );
    assert_eq!(pg.count(), 5);
    assert_eq!(pg.history(), (1, 0));

    // Again: nothing to remove.
    let o = pg.run_printed(apply);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("nothing to remove"), "{}", stdout(&o));
    assert_eq!(pg.count(), 5);
}

#[test]
fn reconcile_postgres_asks_for_the_table_when_the_sink_recorded_none() {
    let Some(url) = server() else { return };
    let mut pg = Pg::new(&url, "norec");
    let mut s = pg.open("run1", FreshStartPolicy::Fail);
    commit(&mut s, 0..5, 1);
    commit(&mut s, 5..8, 2);
    let lineage = s.lineage().to_string();
    drop(s);
    // As where the sink could not record (a user who may not create
    // twopc_sinks, or a sink of an earlier release).
    pg.admin
        .execute("DELETE FROM twopc_sinks WHERE sink_id = $1", &[&pg.sink])
        .unwrap();
    let rc = ["--lineage", &lineage, "--after-checkpoint", "1"];

    let o = pg.twopc_without_table("reconcile", &rc);
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(
        stderr(&o),
        "twopc reconcile: missing --table: give the table the sink writes to (schema.table), so \
         that its rows can be removed\n"
    );
    let o = pg.twopc_without_table("inspect", &["--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["sinks"][0]["target"].is_null(), "{v:#}");

    // With --table, the dry run asks for the column.
    let o = pg.twopc("reconcile", &rc);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    assert!(
        text.contains("If the sink has one, run again with --transaction-id-column <column>"),
        "{text}"
    );
    assert!(
        !text.contains("To remove them, while the job stays stopped"),
        "{text}"
    );
    // --apply without the column: refused, says what to do.
    let o = pg.twopc("reconcile", &[&rc[..], &["--apply"]].concat());
    assert_eq!(o.status.code(), Some(3));
    let err = stderr(&o);
    assert!(err.contains("--transaction-id-column"), "{err}");
    assert!(err.contains("--rows-deleted-by-hand --apply"), "{err}");
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
    assert_eq!(pg.count(), 8);
    // A column the table has but the sink does not fill with transaction
    // ids: nothing matches, and removing the records alone would hide
    // output the replay writes again (found by review). Refused, nothing
    // changed.
    let o = pg.twopc(
        "reconcile",
        &[&rc[..], &["--apply", "--transaction-id-column", "body"]].concat(),
    );
    assert_ne!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("is not the one the sink fills") && err.contains("Nothing was changed"),
        "{err}"
    );
    assert_eq!(pg.count(), 8);
    assert_eq!(pg.history(), (2, 0), "both commit records stay");
    // With both: removed.
    let o = pg.twopc(
        "reconcile",
        &[&rc[..], &["--apply", "--transaction-id-column", "txn"]].concat(),
    );
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(pg.count(), 5);
    assert_eq!(pg.history(), (1, 0));
}

#[test]
fn reconcile_postgres_without_a_transaction_id_column_removes_folded_records_once_rows_are_deleted_by_hand(
) {
    let Some(url) = server() else { return };
    let mut pg = Pg::new(&url, "notxn");
    pg.admin
        .batch_execute(&format!(
            "ALTER TABLE {t} DROP COLUMN txn; CREATE TABLE {t}_other (id bigint)",
            t = pg.table
        ))
        .unwrap();
    pg.column = None;
    let mut s = pg.open("run1", FreshStartPolicy::Fail);
    commit(&mut s, 0..5, 1);
    commit(&mut s, 5..8, 2);
    commit(&mut s, 8..10, 3);
    commit(&mut s, 10..11, 4);
    let lineage = s.lineage();
    // Everything folded: checkpoints 2 to 4 live in a history segment, out
    // of reach of a DELETE FROM twopc_commit_records.
    let all = HistoryPolicy {
        keep_checkpoints: 0,
        min_segment: 1,
        ..HistoryPolicy::default()
    };
    assert_eq!(s.destination().compact_history(&all).unwrap().folded, 4);
    drop(s);
    assert_eq!(pg.history(), (0, 4));
    let lineage_text = lineage.to_string();
    let rc = ["--lineage", &lineage_text, "--after-checkpoint", "1"];

    // The dry run says the rows cannot be told apart, and gives the
    // commands that remove them.
    let o = pg.twopc_without_table("reconcile", &rc);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    assert!(
        text.contains(&format!(
            "Their rows are in public.{}, which has no transaction-id column",
            pg.table
        )),
        "{text}"
    );
    for needle in [
        format!("sink '{}' fills none", pg.sink),
        "twopc_commit_segments".to_string(),
        "a DELETE FROM twopc_commit_records by hand misses the folded ones".to_string(),
    ] {
        assert!(text.contains(&needle), "{needle:?} missing: {text}");
    }
    assert!(
        !text.contains("To remove them, while the job stays stopped: twopc"),
        "{text}"
    );
    let by_hand = after(&text, "then run `", '`').to_string();
    assert_eq!(
        by_hand,
        format!(
            "twopc reconcile {} --sink {} --lineage {lineage} --after-checkpoint 1 \
             --rows-deleted-by-hand --apply",
            pg.url, pg.sink
        )
    );
    // --apply alone: refused. A column the sink does not fill: refused.
    let o = pg.twopc_without_table("reconcile", &[&rc[..], &["--apply"]].concat());
    assert_eq!(o.status.code(), Some(3), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("fills none"), "{}", stderr(&o));
    let o = pg.twopc_without_table(
        "reconcile",
        &[&rc[..], &["--transaction-id-column", "body", "--apply"]].concat(),
    );
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("it fills no transaction-id column"),
        "{}",
        stderr(&o)
    );
    assert_eq!(pg.count(), 11);
    assert_eq!(pg.history(), (0, 4));

    // The operator deletes the rows by hand, then runs the command given.
    pg.admin
        .execute(&format!("DELETE FROM {} WHERE id >= 5", pg.table), &[])
        .unwrap();
    // Its dry run prints the same command.
    let o = pg.twopc_without_table(
        "reconcile",
        &[&rc[..], &["--rows-deleted-by-hand"]].concat(),
    );
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    assert!(
        text.contains("only their commit records would be removed"),
        "{text}"
    );
    assert_eq!(
        after(&text, "To remove them, while the job stays stopped: ", '\n'),
        by_hand
    );
    let o = pg.run_printed(&by_hand);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(
            "Removed the commit records of 3 transaction(s) (6 records, their rows deleted by \
             hand)"
        ),
        "{}",
        stdout(&o)
    );
    assert_eq!(pg.count(), 5, "no row removed by twopc");
    assert_eq!(pg.history(), (0, 1), "checkpoint 1 left, in its segment");
    // Nothing left after checkpoint 1: a restore of it finds no rewind.
    let o = pg.twopc_without_table("reconcile", &rc);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("nothing to remove"), "{}", stdout(&o));
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

/// Two subtasks of run1: subtask 0 commits checkpoint 1 (rows 0..3), and
/// checkpoint 2 (rows 3..5) too if `s0_commits_2`; subtask 1's transaction
/// of checkpoint 2 (rows 5..9) is rolled back by an administrator before
/// its commit, which stops as LOST. Returns the lineage and that handle.
fn lose_checkpoint_2(pg: &mut Pg, s0_commits_2: bool) -> (String, TransactionHandle) {
    let mut s0 = open_subtask(pg, "run1", 0, 2);
    let mut s1 = open_subtask(pg, "run1", 1, 2);
    commit(&mut s0, 0..3, 1);
    let ok = s0_commits_2.then(|| prepare(&mut s0, 3..5, 2));
    let gone = prepare(&mut s1, 5..9, 2);
    if let Some(ok) = ok {
        assert_eq!(s0.commit(&ok).unwrap(), CommitOutcome::Committed);
    }
    pg.admin
        .batch_execute(&format!("ROLLBACK PREPARED '{}'", gone.transaction))
        .unwrap();
    let err = s1.commit(&gone).unwrap_err();
    assert!(matches!(err, twopc_core::TwopcError::Lost(_)), "{err}");
    let lineage = s0.lineage().to_string();
    (lineage, gone)
}

/// A sink without a transaction-id column: notes of lost transactions in
/// the range, with no rows to remove, are cleared by the `--apply` the dry
/// run prints, run as printed (it was refused for want of the column).
#[test]
fn reconcile_postgres_clears_lost_notes_of_a_sink_without_a_transaction_id_column() {
    let Some(url) = server() else { return };
    let mut pg = Pg::new(&url, "lostnc");
    pg.admin
        .batch_execute(&format!("ALTER TABLE {} DROP COLUMN txn", pg.table))
        .unwrap();
    pg.column = None;
    let (lineage, _) = lose_checkpoint_2(&mut pg, false);

    let o = pg.twopc_without_table(
        "reconcile",
        &["--lineage", &lineage, "--after-checkpoint", "1"],
    );
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}{}", stderr(&o));
    assert!(
        text.contains("Notes of 1 lost transaction(s) of that range remain"),
        "{text}"
    );
    let o = pg.run_printed(after(&text, "stays stopped: ", '\n'));
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{text}{}", stderr(&o));
    assert!(
        text.contains("Cleared the notes of 1 lost transaction(s)"),
        "{text}"
    );
    assert_eq!(pg.count(), 3);
    let o = pg.twopc_without_table(
        "reconcile",
        &["--lineage", &lineage, "--after-checkpoint", "1"],
    );
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    // A lineage that never ran in this sink: most likely mistyped.
    let typo = format!("{:016x}", !u64::from_str_radix(&lineage, 16).unwrap());
    let o = pg.twopc_without_table(
        "reconcile",
        &["--lineage", &typo, "--after-checkpoint", "1", "--apply"],
    );
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(&format!("Lineage {typo} never ran in this sink here")),
        "{}",
        stdout(&o)
    );
}

/// Checkpoint 2's transaction of subtask 1 is rolled back by an
/// administrator before its commit: a LOST stop. The committer's note makes
/// inspect flag the partly visible checkpoint; reconcile clears it.
#[test]
fn inspect_postgres_flags_a_partly_visible_checkpoint_after_a_lost_stop() {
    let Some(url) = server() else { return };
    let mut pg = Pg::new(&url, "lost");
    let (lineage, gone) = lose_checkpoint_2(&mut pg, true);

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
    // All of the lineage's output removed, twice: the lineage is still
    // known (its start is recorded), so a repeat is no typo.
    for _ in 0..2 {
        let o = pg.twopc(
            "reconcile",
            &["--lineage", &lineage, "--after-checkpoint", "0", "--apply"],
        );
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    }
    assert_eq!(pg.count(), 0);
}
