//! The cost of a long commit history: open-and-recover time, the
//! fresh-start check and `twopc inspect` against 10^2 .. 10^5 committed
//! transactions, with the history folded into segments (the default) and,
//! for comparison, with one commit record per transaction forever.
//!
//! ```text
//! cargo run --release -p twopc-cli --example history-bench -- [--quick] [--json PATH] [--dir DIR]
//! ```
//!
//! Each size builds its history through the real protocol (one subtask,
//! one transaction per checkpoint, the committer's housekeeping after each
//! checkpoint as in a job), then measures, median of several runs:
//! - open-and-recover: `SubtaskSink::open` restored from the last
//!   checkpoint (ownership, rewind detection) plus the recovery commit of
//!   its handle (found already committed);
//! - fresh-start check: the destination's lineage summary, which every
//!   fresh start reads;
//! - inspect: the `twopc inspect --json` binary, default depth.
//!
//! The history is built on tmpfs (`/dev/shm`) when there is one: building
//! 10^5 transactions with real fsyncs would take most of an hour and
//! measures nothing of interest here.
//!
//! # PostgreSQL
//!
//! When `TWOPC_PG_URL` is set (`eval "$(scripts/postgres.sh start)"`; the
//! password in it is given to the sink and to `twopc` as PGPASSWORD, never
//! in a URL), the same is measured against the PostgreSQL destination,
//! transactional mode, at the same sizes: `pg-folded` (the default
//! history policy) and `pg-single` (compaction off). Each measurement has a
//! schema of its own (`twopc_bench_<mode>_<n>`) holding a small target
//! table (`body text, txn text`, with the transaction-id column) and the
//! control tables, dropped afterwards. Open-and-recover is
//! `PgDestination::connect` (start-up checks included) and the same
//! restore as above; the fresh-start check is `lineages()` on a connected
//! destination; inspect is `twopc inspect <url> --sink bench --json
//! --control-schema <schema>`. The control tables are VACUUM ANALYZEd once
//! after the build, as autovacuum would have done on a live server.
//!
//! Every commit through the real protocol costs a PREPARE TRANSACTION and
//! a COMMIT PREPARED, each flushed to the server's WAL (about 3 ms on the
//! machine this was written on: 10^5 transactions take 5 minutes per mode).
//! The protocol's time per transaction is measured on the smaller sizes; a
//! size whose two builds (folded and single) would take longer than 10
//! minutes at that rate (`TWOPC_BENCH_PG_BUILD_LIMIT_S`, default 600) is
//! built in bulk instead, and marked so (`built: "sql-bulk"` in the JSON,
//! `*` in the table): checkpoint 1 and the last checkpoint are committed
//! through the protocol (the start records the lineage and run; the last
//! one is what the restore names), and the commit records of the
//! checkpoints between them are inserted with SQL, with their rows in the
//! target table: the same rows the sink writes (one per transaction, the
//! run and lineage of the sink, transaction ids of another attempt of the
//! same run). For `pg-folded`, the real compaction then folds them (the
//! default policy, run until nothing is left to fold or merge), leaving
//! only the latest 16 checkpoints single; built through the protocol, the
//! committer folds every 128 commits, so up to a few hundred records stay
//! single between two compactions (more control rows, the same segments).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use twopc_core::destination::{Destination, HistoryPolicy};
use twopc_core::records::RecordBatchBuf;
use twopc_core::{
    Restore, RunId, SinkId, SinkOptions, SubtaskContext, SubtaskSink, SystemClock,
    TransactionHandle, WriterState,
};
use twopc_fs::{FsDestination, FsOptions};
use twopc_pg::{Endpoint, Password, PgDestination, PgOptions};

const SINK: &str = "bench";

fn ctx(run: &str) -> SubtaskContext {
    SubtaskContext::new(SinkId::new(SINK).unwrap(), RunId::new(run).unwrap(), 0, 1).unwrap()
}

fn dest(out: &Path) -> FsDestination {
    FsDestination::open(FsOptions::new(out), &SinkId::new(SINK).unwrap()).unwrap()
}

/// The one record of every transaction.
const RECORD: &[u8] = b"a record of the benchmark";

/// Commits one transaction of one record at checkpoint `cp`, with the
/// committer's housekeeping after it, as in a job.
fn commit_one<D: Destination>(
    sink: &mut SubtaskSink<D, SystemClock>,
    cp: u64,
) -> (TransactionHandle, WriterState) {
    let batch = RecordBatchBuf::from_records([RECORD]);
    let t = sink.begin().unwrap();
    sink.write(&t.transaction, &batch).unwrap();
    let h = sink.prepare(&t.transaction, cp).unwrap();
    let state = sink.writer_state();
    sink.commit(&h).unwrap();
    let hk = sink.checkpoint_completed(cp).unwrap();
    assert!(hk.failures.is_empty(), "{:?}", hk.failures);
    (h, state)
}

fn restore_of(n: u64, (handle, state): (TransactionHandle, WriterState)) -> Restore {
    Restore {
        checkpoint: n,
        states: vec![state],
        known: vec![handle],
    }
}

/// Commits `n` transactions, one per checkpoint; returns the last
/// checkpoint's restore (writer state and the last handle).
fn build<D: Destination>(dest: D, n: u64, options: &SinkOptions) -> Restore {
    let (mut sink, _) = SubtaskSink::open(
        dest,
        SystemClock,
        ctx("build-run"),
        options.clone(),
        None,
        None,
    )
    .unwrap();
    let mut last = None;
    for cp in 1..=n {
        last = Some(commit_one(&mut sink, cp));
    }
    restore_of(n, last.unwrap())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn time_ms(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1000.0
}

struct Row {
    mode: &'static str,
    transactions: u64,
    /// Files of the sink's control directory; for PostgreSQL, the sink's
    /// rows of the commit records and history segments tables.
    control_files: usize,
    open_recover_ms: f64,
    fresh_check_ms: f64,
    inspect_ms: f64,
    /// How the history was built: "protocol" or "sql-bulk".
    built: &'static str,
    build_s: f64,
}

fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    for sub in ["committed", "history"] {
        n += std::fs::read_dir(dir.join("_twopc").join(SINK).join(sub))
            .map(|d| d.count())
            .unwrap_or(0);
    }
    n
}

fn twopc_binary() -> PathBuf {
    // target/<profile>/examples/history-bench -> target/<profile>/twopc
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("twopc");
    assert!(
        bin.exists(),
        "{} is missing: build it first with `cargo build --release -p twopc-cli`",
        bin.display()
    );
    bin
}

fn measure(base: &Path, mode: &'static str, n: u64, options: &SinkOptions, reps: usize) -> Row {
    let out = base.join(format!("{mode}-{n}"));
    let _ = std::fs::remove_dir_all(&out);
    let started = Instant::now();
    let restore = build(dest(&out), n, options);
    let build_s = started.elapsed().as_secs_f64();
    let mut open_recover = Vec::new();
    let mut fresh = Vec::new();
    let mut inspect = Vec::new();
    let twopc = twopc_binary();
    for _ in 0..reps {
        open_recover.push(time_ms(|| {
            let (mut sink, report) = SubtaskSink::open(
                dest(&out),
                SystemClock,
                ctx("build-run"),
                options.clone(),
                Some(&restore),
                None,
            )
            .unwrap();
            assert!(!report.fresh);
            for h in &restore.known {
                sink.commit(h).unwrap();
            }
        }));
        fresh.push(time_ms(|| {
            let lineages = dest(&out).lineages().unwrap();
            assert_eq!(lineages[0].committed, n);
        }));
        inspect.push(time_ms(|| {
            let o = Command::new(&twopc)
                .args(["inspect", out.to_str().unwrap(), "--json"])
                .output()
                .unwrap();
            assert!(o.status.code() == Some(0), "{o:?}");
            let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(
                report["sinks"][0]["committed_total"], n,
                "inspect counted otherwise"
            );
        }));
    }
    let row = Row {
        mode,
        transactions: n,
        control_files: count_files(&out),
        open_recover_ms: median(open_recover),
        fresh_check_ms: median(fresh),
        inspect_ms: median(inspect),
        built: "protocol",
        build_s,
    };
    let _ = std::fs::remove_dir_all(&out);
    row
}

/// The PostgreSQL server of `TWOPC_PG_URL`, and an admin session on it.
struct Pg {
    /// The URL without its password.
    url: String,
    password: Option<String>,
    admin: postgres::Client,
}

impl Pg {
    fn from_env() -> Option<Pg> {
        let full = std::env::var("TWOPC_PG_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())?;
        let admin = postgres::Client::connect(&full, postgres::NoTls)
            .unwrap_or_else(|e| panic!("cannot connect to TWOPC_PG_URL: {e}"));
        let (url, password) = split_password(&full);
        Some(Pg {
            url,
            password,
            admin,
        })
    }

    fn options(&self, schema: &str) -> PgOptions {
        let mut o = PgOptions::new(
            Endpoint::Url(self.url.clone()),
            format!("{schema}.bench"),
            &["body"],
        );
        o.password = self.password.clone().map(Password::new);
        o.control_schema = schema.to_string();
        o.transaction_id_column = Some("txn".to_string());
        o
    }

    fn dest(&self, schema: &str) -> PgDestination {
        PgDestination::connect(self.options(schema), &ctx("build-run")).unwrap()
    }

    /// The sink's rows of the commit history.
    fn control_rows(&mut self, schema: &str) -> usize {
        let n: i64 = self
            .admin
            .query_one(
                &format!(
                    "SELECT (SELECT count(*) FROM {schema}.twopc_commit_records \
                             WHERE sink_id = $1) \
                          + (SELECT count(*) FROM {schema}.twopc_commit_segments \
                             WHERE sink_id = $1)"
                ),
                &[&SINK],
            )
            .unwrap()
            .get(0);
        n as usize
    }
}

/// `postgres://user:password@host...` as the URL without the password, and
/// the password.
fn split_password(url: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_string(), None);
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, pw)) => (format!("{scheme}://{user}@{host}"), Some(pw.to_string())),
            None => (url.to_string(), None),
        },
        None => (url.to_string(), None),
    }
}

/// The nonce of the transactions a bulk build inserts: another attempt of
/// the build run than the one committing through the protocol.
const BULK_NONCE: u64 = 0x0b0b_0b0b_0b0b_0b0b;

/// Builds `n` transactions in bulk (see the module docs): checkpoints 1
/// and `n` through the protocol, the ones between as the rows the sink
/// writes, inserted with SQL; then, when the policy compacts, the real
/// compaction until nothing is left to fold or merge.
fn pg_build_bulk(pg: &mut Pg, schema: &str, n: u64, options: &SinkOptions) -> Restore {
    let (mut sink, _) = SubtaskSink::open(
        pg.dest(schema),
        SystemClock,
        ctx("build-run"),
        options.clone(),
        None,
        None,
    )
    .unwrap();
    commit_one(&mut sink, 1);
    let lineage = sink.lineage().0 as i64;
    let prefix = format!("{SINK}.0.{BULK_NONCE:016x}.");
    let last = n as i64 - 1;
    let record = std::str::from_utf8(RECORD).unwrap();
    pg.admin
        .execute(
            &format!(
                "INSERT INTO {schema}.bench (body, txn) \
                 SELECT $1::text, $2::text || g FROM generate_series(2::int8, $3::int8) g"
            ),
            &[&record, &prefix, &last],
        )
        .unwrap();
    pg.admin
        .execute(
            &format!(
                "INSERT INTO {schema}.twopc_commit_records (transaction_id, sink_id, subtask, \
                   lineage, checkpoint, run_id, row_count, prepared_at, committed_at) \
                 SELECT $1::text || g, $2::text, 0, $3::int8, g, 'build-run', 1, now(), now() \
                 FROM generate_series(2::int8, $4::int8) g"
            ),
            &[&prefix, &SINK, &lineage, &last],
        )
        .unwrap();
    let restore = restore_of(n, commit_one(&mut sink, n));
    if options.history.every_commits > 0 {
        loop {
            let done = sink
                .destination()
                .compact_history(&options.history)
                .unwrap();
            if done.folded == 0 && done.merged == 0 && !done.busy {
                break;
            }
        }
    }
    restore
}

fn measure_pg(
    pg: &mut Pg,
    mode: &'static str,
    n: u64,
    options: &SinkOptions,
    reps: usize,
    bulk: bool,
) -> Row {
    let schema = format!("twopc_bench_{}_{n}", mode.replace('-', "_"));
    pg.admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; \
             CREATE TABLE {schema}.bench (body text, txn text)"
        ))
        .unwrap();
    let started = Instant::now();
    let restore = if bulk {
        pg_build_bulk(pg, &schema, n, options)
    } else {
        build(pg.dest(&schema), n, options)
    };
    let build_s = started.elapsed().as_secs_f64();
    pg.admin
        .batch_execute(&format!(
            "VACUUM ANALYZE {schema}.twopc_commit_records, {schema}.twopc_commit_segments, \
             {schema}.bench"
        ))
        .unwrap();
    let twopc = twopc_binary();
    let (mut open_recover, mut fresh, mut inspect) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        open_recover.push(time_ms(|| {
            let (mut sink, report) = SubtaskSink::open(
                pg.dest(&schema),
                SystemClock,
                ctx("build-run"),
                options.clone(),
                Some(&restore),
                None,
            )
            .unwrap();
            assert!(!report.fresh);
            for h in &restore.known {
                sink.commit(h).unwrap();
            }
        }));
        let mut d = pg.dest(&schema);
        fresh.push(time_ms(|| {
            let lineages = d.lineages().unwrap();
            assert_eq!(lineages[0].committed, n);
        }));
        drop(d);
        inspect.push(time_ms(|| {
            let o = Command::new(&twopc)
                .args(["inspect", &pg.url, "--sink", SINK, "--json"])
                .args(["--control-schema", &schema])
                .env("PGPASSWORD", pg.password.as_deref().unwrap_or(""))
                .env_remove("RUST_LOG")
                .output()
                .unwrap();
            assert!(o.status.code() == Some(0), "{o:?}");
            let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(
                report["sinks"][0]["committed_total"], n,
                "inspect counted otherwise"
            );
        }));
    }
    let row = Row {
        mode,
        transactions: n,
        control_files: pg.control_rows(&schema),
        open_recover_ms: median(open_recover),
        fresh_check_ms: median(fresh),
        inspect_ms: median(inspect),
        built: if bulk { "sql-bulk" } else { "protocol" },
        build_s,
    };
    pg.admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .unwrap();
    row
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let base = value("--dir").map(PathBuf::from).unwrap_or_else(|| {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() { shm } else { Path::new("/tmp") }.join("twopc-history-bench")
    });
    std::fs::create_dir_all(&base).unwrap();
    let sizes: &[u64] = if quick {
        &[100, 1_000, 10_000]
    } else {
        &[100, 1_000, 10_000, 100_000]
    };
    let reps = 5;
    let folded = SinkOptions::default();
    let single = SinkOptions {
        history: HistoryPolicy {
            every_commits: 0,
            ..HistoryPolicy::default()
        },
        ..SinkOptions::default()
    };
    let mut pg = Pg::from_env();
    if pg.is_none() {
        eprintln!("history-bench: TWOPC_PG_URL is not set: the PostgreSQL rows are left out");
    }
    let build_limit_s: f64 = std::env::var("TWOPC_BENCH_PG_BUILD_LIMIT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600.0);
    // The protocol's build time per transaction: the slower of the two
    // modes at the largest size built through it so far.
    let mut protocol_rate: Option<(u64, f64)> = None;
    let report = |row: &Row| {
        eprintln!(
            "history-bench: {:>9} {:>7} transactions: {:>6} control files/rows, open+recover \
             {:>8.2} ms, fresh-start check {:>8.2} ms, inspect {:>8.2} ms (built {} in {:.1} s)",
            row.mode,
            row.transactions,
            row.control_files,
            row.open_recover_ms,
            row.fresh_check_ms,
            row.inspect_ms,
            if row.built == "protocol" {
                "through the protocol"
            } else {
                "with SQL in bulk"
            },
            row.build_s
        );
    };
    let mut rows = Vec::new();
    for &n in sizes {
        for (mode, options) in [("folded", &folded), ("single", &single)] {
            let row = measure(&base, mode, n, options, reps);
            report(&row);
            rows.push(row);
        }
        let Some(pg) = pg.as_mut() else { continue };
        // Both modes are built the same way at one size; in bulk when the
        // two builds through the protocol would take longer than the limit.
        let estimate_s = protocol_rate.map(|(_, per)| 2.0 * per * n as f64);
        let bulk = estimate_s.is_some_and(|e| e > build_limit_s);
        if let (true, Some(e)) = (bulk, estimate_s) {
            eprintln!(
                "history-bench: building {n} transactions twice through the protocol would take \
                 about {e:.0} s ({:.2} ms per transaction), over {build_limit_s:.0} s: building \
                 them with SQL in bulk",
                e / 2.0 / n as f64 * 1000.0
            );
        }
        for (mode, options) in [("pg-folded", &folded), ("pg-single", &single)] {
            let row = measure_pg(pg, mode, n, options, reps, bulk);
            report(&row);
            if !bulk {
                let per = row.build_s / n as f64;
                protocol_rate = match protocol_rate {
                    Some((m, p)) if m == n => Some((n, p.max(per))),
                    _ => Some((n, per)),
                };
            }
            rows.push(row);
        }
    }
    println!("\n| history | transactions | control files | open + recover (ms) | fresh-start check (ms) | inspect (ms) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {}{} | {} | {:.2} | {:.2} | {:.2} |",
            r.mode,
            r.transactions,
            if r.built == "protocol" { "" } else { "*" },
            r.control_files,
            r.open_recover_ms,
            r.fresh_check_ms,
            r.inspect_ms
        );
    }
    if rows.iter().any(|r| r.mode.starts_with("pg-")) {
        println!(
            "\npg-*: PostgreSQL, transactional; control files are the sink's rows of \
             twopc_commit_records and twopc_commit_segments."
        );
    }
    if rows.iter().any(|r| r.built != "protocol") {
        println!(
            "* built in bulk: checkpoints 1 and N through the protocol, the commit records \
             between them (and their rows) inserted with SQL, then folded by the real \
             compaction (pg-folded); building them through the protocol would have taken \
             longer than {build_limit_s:.0} s."
        );
    }
    let first = |mode: &str| rows.iter().find(|r| r.mode == mode);
    let last = |mode: &str| rows.iter().rev().find(|r| r.mode == mode);
    for mode in ["folded", "single", "pg-folded", "pg-single"] {
        let (Some(a), Some(b)) = (first(mode), last(mode)) else {
            continue;
        };
        println!(
            "{mode}: from {} to {} transactions, open+recover x{:.1}, fresh-start check x{:.1}, \
             inspect x{:.1}",
            a.transactions,
            b.transactions,
            b.open_recover_ms / a.open_recover_ms,
            b.fresh_check_ms / a.fresh_check_ms,
            b.inspect_ms / a.inspect_ms
        );
    }
    if let Some(path) = value("--json") {
        let json: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "history": r.mode,
                    "transactions": r.transactions,
                    "control_files": r.control_files,
                    "open_recover_ms": r.open_recover_ms,
                    "fresh_start_check_ms": r.fresh_check_ms,
                    "inspect_ms": r.inspect_ms,
                    "built": r.built,
                    "build_s": r.build_s,
                })
            })
            .collect();
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
        eprintln!("history-bench: figures written to {path}");
    }
    let _ = std::fs::remove_dir_all(&base);
}
