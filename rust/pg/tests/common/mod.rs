//! Shared helpers of the tests against a real PostgreSQL server.
//!
//! The server comes from `scripts/postgres.sh start`, which prints the URL
//! to export as TWOPC_PG_URL. Without it the tests fail and say so, unless
//! TWOPC_PG_OPTIONAL=1 (developer convenience), when they print "skipped: no
//! server" and pass. CI sets the URL.
#![allow(dead_code)] // each test binary uses a different subset

pub mod attempts;

use std::str::FromStr;

use postgres::{Client, NoTls};
use twopc_core::committer::CommitOutcome;
use twopc_core::config::{RetryPolicy, SinkOptions, SubtaskContext};
use twopc_core::ids::{random_u64, RunId, SinkId};
use twopc_core::records::RecordBatchBuf;
use twopc_core::{Restore, StartupReport, SubtaskSink, SystemClock, TransactionHandle, TwopcError};
use twopc_pg::{Endpoint, Password, PgDestination, PgOptions};

pub type Sink = SubtaskSink<PgDestination, SystemClock>;

/// The URL in `var`, or None (after printing why) when the developer opted
/// out of server tests.
pub fn url_from(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(u) if !u.trim().is_empty() => Some(u),
        _ if std::env::var("TWOPC_PG_OPTIONAL").as_deref() == Ok("1") => {
            println!("skipped: no server ({var} is not set)");
            None
        }
        _ => panic!(
            "{var} is not set: these tests need a PostgreSQL server. Run \
             `eval \"$(scripts/postgres.sh start)\"` (and, for TWOPC_PG_URL_NO_2PC, \
             `eval \"$(TWOPC_PG_PORT=54330 TWOPC_PG_MAX_PREPARED=0 scripts/postgres.sh start)\"`; \
             for TWOPC_PG_STANDBY_URL, `eval \"$(TWOPC_PG_PORT=54331 TWOPC_PRIMARY_PORT=54329 \
             scripts/postgres.sh standby)\"`) \
             and run the tests again; set TWOPC_PG_OPTIONAL=1 to skip them instead"
        ),
    }
}

/// Returns the server URL or ends the test (see [`url_from`]). Test files
/// declare `#[macro_use] mod common;`.
macro_rules! server {
    () => {
        server!("TWOPC_PG_URL")
    };
    ($var:literal) => {
        match common::url_from($var) {
            Some(u) => u,
            None => return,
        }
    };
}

/// A name unique to this test run: tests run in parallel against one server
/// and must not see each other's tables, sinks or transactions.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{:08x}", random_u64() as u32)
}

pub fn admin(url: &str) -> Client {
    Client::connect(url, NoTls).expect("admin connection to the test server")
}

pub fn port_of(url: &str) -> u16 {
    postgres::Config::from_str(url)
        .ok()
        .and_then(|c| c.get_ports().first().copied())
        .unwrap_or(5432)
}

/// Transactional options for `table` with columns (id bigint, body text),
/// on the test server's URL without its password, which is given on its own
/// (a URL carrying one is refused).
pub fn options(url: &str, table: &str) -> PgOptions {
    let (url, password) = split_password(url);
    let mut o = PgOptions::new(Endpoint::Url(url), table, &["id", "body"]);
    o.password = password.map(Password::new);
    o
}

/// Transactional options for `table` and `columns` as user `role` (with
/// `password`) on the test server of `url`: a sink run by a user with
/// rights of its own.
#[allow(dead_code)]
pub fn options_as(
    url: &str,
    role: &str,
    password: &str,
    table: impl Into<String>,
    columns: &[&str],
) -> PgOptions {
    let cfg: postgres::Config = url.parse().unwrap();
    let host = match &cfg.get_hosts()[0] {
        postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".to_string(),
    };
    let mut o = PgOptions::new(
        Endpoint::Params {
            host,
            port: port_of(url),
            dbname: cfg.get_dbname().unwrap().to_string(),
            user: role.to_string(),
        },
        table,
        columns,
    );
    o.password = Some(Password::new(password));
    o
}

/// A URL without its password, and the password (decoded).
pub fn split_password(url: &str) -> (String, Option<String>) {
    let mut u = url::Url::parse(url).expect("the test server's URL is a URL");
    let password = u.password().map(|p| {
        percent_encoding::percent_decode_str(p)
            .decode_utf8_lossy()
            .into_owned()
    });
    u.set_password(None)
        .expect("a postgres:// URL with a host can lose its password");
    (u.to_string(), password)
}

/// The columns of the tables [`options`] writes to.
pub const ID_BODY: &str = "id bigint NOT NULL, body text";

pub fn ctx(sink: &str, run: &str, subtask: u32, parallelism: u32) -> SubtaskContext {
    SubtaskContext::new(
        SinkId::new(sink).unwrap(),
        RunId::new(run).unwrap(),
        subtask,
        parallelism,
    )
    .unwrap()
}

pub fn sink_options() -> SinkOptions {
    SinkOptions {
        commit_retry: RetryPolicy {
            max_attempts: 4,
            initial_backoff_ms: 20,
            max_backoff_ms: 200,
        },
        ..SinkOptions::default()
    }
}

pub fn open(
    opts: &PgOptions,
    ctx: SubtaskContext,
    sink_options: SinkOptions,
    restore: Option<&Restore>,
) -> Result<Sink, TwopcError> {
    open_reporting(opts, ctx, sink_options, restore).map(|(s, _)| s)
}

/// [`open`], also returning what start-up did.
pub fn open_reporting(
    opts: &PgOptions,
    ctx: SubtaskContext,
    sink_options: SinkOptions,
    restore: Option<&Restore>,
) -> Result<(Sink, StartupReport), TwopcError> {
    let dest = PgDestination::connect(opts.clone(), &ctx)?;
    SubtaskSink::open(dest, SystemClock, ctx, sink_options, restore, None)
}

/// The state restored from `checkpoint`, which knew the transactions `known`.
pub fn restore_from(checkpoint: u64, known: &[&TransactionHandle]) -> Restore {
    Restore {
        states: Vec::new(),
        checkpoint,
        known: known.iter().map(|&h| h.clone()).collect(),
    }
}

/// COPY text rows `<id>\t<body>` for ids in `ids`, bodies tagged with `tag`.
pub fn rows(ids: std::ops::Range<i64>, tag: &str) -> Vec<String> {
    ids.map(|i| format!("{i}\t{tag}-{i}")).collect()
}

/// A batch with a line break after each record, as the JVM sends it for
/// the default record format (the destination takes records without it).
pub fn batch<S: AsRef<str>>(records: &[S]) -> RecordBatchBuf {
    let mut b = RecordBatchBuf::terminated_by(b'\n');
    for r in records {
        b.push(r.as_ref().as_bytes());
    }
    b
}

/// A batch of records given as bytes (for records that are not UTF-8).
/// Records back to back, without terminators.
pub fn batch_bytes(records: &[&[u8]]) -> RecordBatchBuf {
    RecordBatchBuf::from_records(records)
}

/// The `RecordRejected` error of `result`, with its message; panics with
/// what came instead.
pub fn rejected<T: std::fmt::Debug>(
    result: Result<T, TwopcError>,
) -> (twopc_core::error::RejectedRecord, String) {
    match result {
        Err(e @ TwopcError::RecordRejected(_)) => {
            let message = e.to_string();
            assert!(e.is_fatal(), "a refused record stops the job: {message}");
            match e {
                TwopcError::RecordRejected(r) => (*r, message),
                _ => unreachable!(),
            }
        }
        other => panic!("expected a refused record, got {other:?}"),
    }
}

/// For a transaction without records.
pub const NO_ROWS: &[&str] = &[];

/// Begins and writes `records` as one batch; the transaction stays open.
pub fn written<S: AsRef<str>>(sink: &mut Sink, records: &[S]) -> TransactionHandle {
    let h = sink.begin().unwrap();
    sink.write(&h.transaction, &batch(records)).unwrap();
    h
}

/// Begins, writes `records` in batches of at most 100, prepares.
pub fn prepared<S: AsRef<str>>(
    sink: &mut Sink,
    records: &[S],
    checkpoint: u64,
) -> TransactionHandle {
    prepared_in_batches(sink, records, 100, checkpoint)
}

/// Begins, writes `records` in batches of at most `batch_len`, prepares.
pub fn prepared_in_batches<S: AsRef<str>>(
    sink: &mut Sink,
    records: &[S],
    batch_len: usize,
    checkpoint: u64,
) -> TransactionHandle {
    let h = sink.begin().unwrap();
    for chunk in records.chunks(batch_len) {
        sink.write(&h.transaction, &batch(chunk)).unwrap();
    }
    sink.prepare(&h.transaction, checkpoint).unwrap()
}

/// [`prepared`], then committed by a first, successful commit.
pub fn committed<S: AsRef<str>>(
    sink: &mut Sink,
    records: &[S],
    checkpoint: u64,
) -> TransactionHandle {
    let h = prepared(sink, records, checkpoint);
    assert_eq!(sink.commit(&h).unwrap(), CommitOutcome::Committed);
    h
}

/// Visible rows of `table` as "id|body", sorted.
pub fn visible(admin: &mut Client, table: &str) -> Vec<String> {
    let mut v: Vec<String> = admin
        .query(
            &format!("SELECT id::text || '|' || coalesce(body, '<null>') FROM {table}"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    v.sort();
    v
}

pub fn count(admin: &mut Client, table: &str) -> i64 {
    admin
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .unwrap()
        .get(0)
}

/// Gids of this sink's prepared transactions.
pub fn prepared_gids(admin: &mut Client, sink: &str) -> Vec<String> {
    admin
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE left(gid, length($1::text)) = $1::text \
             ORDER BY gid",
            &[&format!("{sink}.")],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Transaction ids of this sink's handle rows.
pub fn side_rows(admin: &mut Client, sink: &str) -> Vec<String> {
    admin
        .query(
            "SELECT transaction_id FROM public.twopc_prepared WHERE sink_id = $1 \
             ORDER BY transaction_id",
            &[&sink],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Commit records of this sink as (transaction id, checkpoint).
pub fn commit_records(admin: &mut Client, sink: &str) -> Vec<(String, i64)> {
    admin
        .query(
            "SELECT transaction_id, checkpoint FROM public.twopc_commit_records \
             WHERE sink_id = $1 ORDER BY checkpoint, transaction_id",
            &[&sink],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Ends the backend `pid` and waits until it is gone, so a test does not
/// depend on how fast the server acts on the signal.
pub fn terminate(admin: &mut Client, pid: i32) {
    let ok: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(ok, "could not terminate backend {pid}");
    for _ in 0..200 {
        let alive: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .unwrap()
            .get(0);
        if alive == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("backend {pid} did not exit");
}

/// Rolls back whatever this sink left prepared, so a failing test does not
/// use up the server's prepared-transaction slots for the others.
pub fn rollback_all(admin: &mut Client, sink: &str) {
    for gid in prepared_gids(admin, sink) {
        let _ = admin.batch_execute(&format!("ROLLBACK PREPARED '{gid}'"));
    }
}

/// Rolls back this sink's leftovers when dropped, even if the test panics.
pub struct Leftovers {
    pub url: String,
    pub sink: String,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.url, NoTls) {
            rollback_all(&mut c, &self.sink);
        }
    }
}

/// One test's table and sink, the admin session to look at them with, and
/// the guard that rolls back the sink's leftovers however the test ends.
/// Sinks are subtask 0 of 1 unless a test says otherwise.
pub struct Fixture {
    pub url: String,
    pub admin: Client,
    /// `t_<prefix>_<random>`.
    pub table: String,
    /// `<prefix>_<random>`.
    pub sink: String,
    /// What the sinks open with: [`options`] for the table until the test
    /// changes them.
    pub opts: PgOptions,
    _leftovers: Leftovers,
}

impl Fixture {
    /// Inserts a handle row of a transaction that never got prepared (its
    /// PREPARE failed, and its cleanup too), as a stale row looks; returns
    /// its transaction id.
    pub fn insert_stale_handle_row(&mut self) -> String {
        let ghost = format!("{}.0.00000000000000ff.9", self.sink);
        self.admin
            .execute(
                "INSERT INTO public.twopc_prepared VALUES ($1, $2, '\\x00', now())",
                &[&ghost, &self.sink],
            )
            .unwrap();
        ghost
    }

    /// With a table of [`ID_BODY`].
    pub fn new(url: &str, prefix: &str) -> Self {
        Self::with_columns(url, prefix, ID_BODY)
    }

    /// With a table of `columns`, as between the parentheses of CREATE TABLE.
    pub fn with_columns(url: &str, prefix: &str, columns: &str) -> Self {
        let mut admin = admin(url);
        let table = unique(&format!("t_{prefix}"));
        admin
            .batch_execute(&format!("CREATE TABLE {table} ({columns})"))
            .unwrap();
        let sink = unique(prefix);
        Fixture {
            url: url.to_string(),
            admin,
            opts: options(url, &table),
            table,
            _leftovers: Leftovers {
                url: url.to_string(),
                sink: sink.clone(),
            },
            sink,
        }
    }

    /// Idempotent mode, keyed by column `k`, into a table of `ddl` with the
    /// records' `columns`.
    pub fn keyed_by_k(url: &str, prefix: &str, ddl: &str, columns: &[&str]) -> Self {
        let mut f = Fixture::with_columns(url, prefix, ddl);
        f.opts.columns = columns.iter().map(|c| c.to_string()).collect();
        f.opts.mode = twopc_pg::PgMode::Idempotent {
            key_columns: vec!["k".into()],
        };
        f
    }

    pub fn ctx(&self, run: &str) -> SubtaskContext {
        ctx(&self.sink, run, 0, 1)
    }

    /// A fresh start of `run`.
    pub fn open(&self, run: &str) -> Sink {
        self.open_subtask(run, 0, 1, None)
    }

    pub fn open_restored(&self, run: &str, restore: &Restore) -> Sink {
        self.open_subtask(run, 0, 1, Some(restore))
    }

    pub fn open_subtask(
        &self,
        run: &str,
        subtask: u32,
        parallelism: u32,
        restore: Option<&Restore>,
    ) -> Sink {
        let ctx = ctx(&self.sink, run, subtask, parallelism);
        open(&self.opts, ctx, sink_options(), restore).unwrap()
    }

    pub fn open_reporting(
        &self,
        run: &str,
        sink_options: SinkOptions,
        restore: Option<&Restore>,
    ) -> (Sink, StartupReport) {
        open_reporting(&self.opts, self.ctx(run), sink_options, restore).unwrap()
    }

    /// The error that keeps the sink from opening.
    pub fn open_refused(
        &self,
        run: &str,
        sink_options: SinkOptions,
        restore: Option<&Restore>,
    ) -> TwopcError {
        match open(&self.opts, self.ctx(run), sink_options, restore) {
            Ok(_) => panic!("the sink opened for {run}, but must not"),
            Err(e) => e,
        }
    }

    /// A connected destination that has done no start-up.
    pub fn destination(&self, run: &str) -> PgDestination {
        PgDestination::connect(self.opts.clone(), &self.ctx(run)).unwrap()
    }

    /// A new admin session, after the server cut the old one.
    pub fn reconnect(&mut self) {
        self.admin = admin(&self.url);
    }

    pub fn count(&mut self) -> i64 {
        count(&mut self.admin, &self.table)
    }

    pub fn visible(&mut self) -> Vec<String> {
        visible(&mut self.admin, &self.table)
    }

    pub fn prepared_gids(&mut self) -> Vec<String> {
        prepared_gids(&mut self.admin, &self.sink)
    }

    pub fn side_rows(&mut self) -> Vec<String> {
        side_rows(&mut self.admin, &self.sink)
    }

    pub fn commit_records(&mut self) -> Vec<(String, i64)> {
        commit_records(&mut self.admin, &self.sink)
    }

    pub fn terminate(&mut self, pid: i32) {
        terminate(&mut self.admin, pid)
    }
}

/// Log lines of this test process, so a test can check that a path was
/// really taken (e.g. that a commit was retried). Shared by the tests of one
/// binary, which run in parallel: filter by something unique to the test.
static LOG: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        let line = format!("{} {}", record.level(), record.args());
        if std::env::var_os("TWOPC_PG_TEST_LOG").is_some() {
            eprintln!("{line}");
        }
        LOG.lock().unwrap_or_else(|p| p.into_inner()).push(line);
    }
    fn flush(&self) {}
}

/// Installs the capturing logger (once per process).
pub fn capture_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = log::set_logger(&Capture);
        log::set_max_level(log::LevelFilter::Debug);
    });
}

/// Captured lines that contain `needle`.
pub fn logged(needle: &str) -> Vec<String> {
    LOG.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

/// Captured lines about committing `h`: where the core logs each failed
/// attempt (after [`capture_logs`]).
pub fn commit_log(h: &TransactionHandle) -> Vec<String> {
    logged(&format!("commit of transaction {}", h.transaction))
}

/// Runs `sql` (role creations, GRANTs, REVOKEs) in one transaction under
/// an advisory lock that every test's grants in the public schema take:
/// two transactions granting on the same table at once (the control tables
/// are shared by the tests running in parallel) fail with "tuple
/// concurrently updated". Rolled back on error, so `admin` stays usable.
pub fn grants_serialized(admin: &mut Client, sql: &str) -> Result<(), postgres::Error> {
    let r = admin.batch_execute(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock(70319050); {sql}; COMMIT"
    ));
    if r.is_err() {
        let _ = admin.batch_execute("ROLLBACK");
    }
    r
}

/// [`grants_serialized`], which must succeed.
pub fn grant_serialized(admin: &mut Client, sql: &str) {
    grants_serialized(admin, sql).unwrap()
}
