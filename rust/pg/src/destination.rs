//! [`PgDestination`]: the [`Destination`] trait over PostgreSQL.
//!
//! # Transactional mode
//!
//! One PostgreSQL transaction per subtask and checkpoint, on a dedicated
//! *writer* session:
//!
//! | core call | SQL |
//! |---|---|
//! | `begin` | nothing (lazy: `BEGIN` comes with the first write) |
//! | `write` | every record of the batch checked first (see [`crate::rows`]); then `BEGIN` and `COPY <table> (<columns>) FROM STDIN` with the first batch; every batch streamed into that one COPY (see [`crate::copy_stream`]) |
//! | `prepare` | end of the COPY (rows loaded checked against records written); side row (control session, autocommit); commit record + row lock (writer); `PREPARE TRANSACTION '<id>'` (writer) |
//! | `commit` | `COMMIT PREPARED '<id>'` (control session) |
//! | `abort` | `ROLLBACK` of the open one, `ROLLBACK PREPARED '<id>'` of a prepared one |
//!
//! ## A record PostgreSQL can never take
//!
//! Replaying such a record fails the same way, so it is reported as a
//! [`RecordFault`] (the core makes it `TwopcError::RecordRejected`, which
//! stops the job once instead of restarting it in a loop). What can be
//! checked cheaply is checked for every record before its batch is sent:
//! exactly one row of the COPY format, UTF-8, no NUL, one field per column
//! ([`crate::rows`]); the fault names the record in the batch. What only
//! the server can judge (type syntax, range, length, constraints) shows when
//! the COPY ends, at prepare: a data error (SQLSTATE class 22 or 23, and a
//! few more, see [`error::is_data_error`]) whose context names a line of the
//! COPY is mapped back to the record at that position of the transaction
//! ([`LineMap`]), shown from the latest batches kept ([`SentRows`]) or else
//! as PostgreSQL quotes it. Anything else stays an ordinary, retryable
//! failure.
//!
//! `COMMIT PREPARED` cannot run inside a transaction block and must not
//! share a session with the open transaction, so commits, aborts and scans
//! use a second, autocommit *control* session.
//!
//! ## Telling "already committed" from "lost"
//!
//! `COMMIT PREPARED` of a gid PostgreSQL does not hold fails with SQLSTATE
//! 42704 whether the transaction committed earlier or was rolled back: the
//! error alone cannot tell a repeat from a loss. So each transaction
//! inserts its own row into `twopc_commit_records` before it is prepared.
//! That row becomes visible exactly when, and only if, the transaction
//! commits. A commit that meets 42704 looks it up: present means
//! `AlreadyCommitted`; absent means `Missing`, with evidence naming what was
//! looked at (and a tombstone in `twopc_expired` when twopc's own retention
//! cleanup rolled it back). The same table answers `committed_after`
//! (rewind detection).
//!
//! Older records are folded into `twopc_commit_segments` (one row per
//! lineage, run and a few thousand transactions) so that the history read at
//! every start stays small; every lookup above reads the segments too. See
//! the [`history`] module.
//!
//! ## What the sink records for operators: `twopc_sinks`
//!
//! A transactional sink records at start-up its target table as the
//! server resolved it, its transaction-id column and control schema, so
//! that `twopc reconcile` needs no `--table`; see the `sinks` module.
//!
//! ## The prepared handle: `twopc_prepared`
//!
//! Recovery rules need, for each prepared transaction, the run and
//! checkpoint it was prepared for (`StagedTransaction::prepared`).
//! `pg_prepared_xacts` only has the gid and a time, and rows written inside
//! a prepared transaction are invisible until it commits, so the encoded
//! handle is written *outside* it, by the control session in autocommit,
//! just before `PREPARE TRANSACTION`, and deleted at commit or abort.
//!
//! Cleanup of side rows whose transaction is no longer prepared (committed,
//! aborted, or a `PREPARE` that failed) runs with every scan. It must never
//! delete the row of a transaction that is about to be prepared: between
//! the side row's insert and `PREPARE TRANSACTION` the gid is not yet in
//! `pg_prepared_xacts`. So the writer's transaction locks its side row
//! (`FOR KEY SHARE`, in the same statement that inserts the commit record)
//! and the cleanup skips locked rows (`FOR UPDATE SKIP LOCKED`). A prepared
//! transaction keeps its row locks, across restarts too, until it is
//! committed or rolled back. In the short window between the side row's
//! insert and that lock, a concurrent cleanup can still delete the row;
//! the locking insert then finds no row, and the prepare fails loudly
//! (checkpoint fails, records are replayed) instead of preparing without a
//! handle.
//!
//! A prepared transaction of this sink *without* a readable side row
//! (deleted or damaged by hand) is reported as
//! [`StagedState::PreparedUnreadable`]: its run and checkpoint are unknown,
//! so it may hold output of a completed checkpoint. The core stops a fresh
//! start on it (unless the policy aborts prepared leftovers), and a restore
//! commits it if its checkpoint names it and otherwise aborts it as
//! lingering, exactly as for any prepared transaction.
//!
//! ## Ownership
//!
//! The writer session holds a session-level advisory lock per sink and
//! subtask (`pg_try_advisory_lock`), released by the server when the
//! session ends, however the process died. The lock is per sink id and
//! database, not per control schema: prepared transactions are found by
//! the sink id in their names across the database. The holder's claim (run,
//! attempt, operator instance, backend pid) is written to `twopc_owners`
//! so that a refused second owner can be told who holds it. A writer whose
//! session was reconnected takes the lock again before its next statement,
//! and fails if someone else took it meanwhile.
//!
//! ## A commit with an unknown outcome
//!
//! If the control session breaks during `COMMIT PREPARED` (backend
//! terminated, server restart, network), the outcome is unknown: `commit`
//! returns `Err` and drops the session. The core retries by id; the retry
//! connects again and runs `COMMIT PREPARED` again, which resolves it: still
//! prepared → committed now; 42704 and a commit record → `AlreadyCommitted`;
//! 42704 and no record → `Missing`. A still-running earlier attempt answers
//! "busy" (55000), which is again `Err` and retried.

mod history;
mod lock_wait;
mod mode_switch;
mod sinks;

pub use sinks::SinkRecord;

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;

use postgres::Client;
use twopc_core::config::SubtaskContext;
use twopc_core::destination::{
    AbortStatus, CommitStatus, CommittedTransaction, Compaction, Destination, HistoryPolicy,
    HistoryTally, LineageRecord, LineageSummary, LostNote, OperationRecord, OwnerClaim, OwnerInfo,
    Ownership, StagedState, StagedTransaction,
};
use twopc_core::error::{
    ConfigError, DestinationError, DestinationErrorKind, RecordFault, RecordPosition, TwopcError,
};
use twopc_core::handle::TransactionHandle;
use twopc_core::ids::{CheckpointId, LineageId, RunId, SinkId, TransactionId};
use twopc_core::records::{preview, RecordBatch};

use crate::copy_stream::CopyEnd;
use crate::error::{
    self, Quoted, RefusedRow, ServerError, INSUFFICIENT_PRIVILEGE, UNDEFINED_OBJECT,
};
use crate::idempotent::{quoted_list, IdempotentSql, STAGE_TABLE};
use crate::link::{CallError, Failure, Link};
use crate::options::{CopyFormat, PgMode, PgOptions, Secrets};
use crate::rows::{self, LineMap};
use crate::schema::{self, ControlTables, StartupError};
use crate::sql::{gid_literal, quote_ident, quote_literal, TableName};

/// Run at the start of every writer session. The transactional mode's
/// COPY is one statement, in one transaction, that lasts a whole checkpoint
/// interval and idles between batches, so none of the server's limits on
/// those may cut it: a role's or database's `statement_timeout`,
/// `idle_in_transaction_session_timeout` or (PostgreSQL 17 and newer)
/// `transaction_timeout` shorter than the interval would fail every
/// checkpoint. `transaction_timeout` is set through `set_config` in a
/// `SELECT` that older servers skip: they refuse the name.
///
/// `lock_timeout` is the opposite: without one, a write blocked by a lock
/// waits forever, and the lock that never goes away by itself is a
/// prepared transaction left by a job that no longer runs (it keeps its row
/// locks across restarts). With a bound the write fails, naming the
/// prepared transactions that hold locks on the table (see the `lock_wait`
/// module). One minute: far longer than the writer waits for anything that
/// is going to end (a previous checkpoint's commit, a concurrent writer of
/// the same key), shorter than Flink's default checkpoint timeout. A
/// `lock_timeout` set for the sink's user or database (or in the
/// connection's options) is kept: it is an operator's choice.
///
/// The isolation level is READ COMMITTED whatever the role's or database's
/// default: at prepare the transaction locks its handle row, which the
/// control session committed after the transaction's first statement, and
/// a REPEATABLE READ or SERIALIZABLE snapshot would not see it, so every
/// prepare failed as if the row had been removed (found by review).
///
/// And `idle_session_timeout` is lifted, as in every session of the sink
/// ([`SESSION_SETUP`]).
const WRITER_SETUP: &str = concat!(
    "SET idle_in_transaction_session_timeout = 0; \
     SET statement_timeout = 0; \
     SET default_transaction_isolation = 'read committed'; \
     SELECT set_config('transaction_timeout', '0', false) \
       WHERE current_setting('server_version_num')::int >= 170000; \
     SELECT set_config('lock_timeout', '1min', false) \
       WHERE current_setting('lock_timeout') = '0'; ",
    no_idle_session_timeout!()
);

/// Lifts `idle_session_timeout` (PostgreSQL 14 and later; older servers
/// have no such setting, and the condition skips it). A `SELECT`, not a
/// `DO` block: a database may not let the sink's user run PL/pgSQL. A
/// macro so that [`WRITER_SETUP`] can include it with `concat!`.
macro_rules! no_idle_session_timeout {
    () => {
        "SELECT set_config('idle_session_timeout', '0', false) \
         WHERE current_setting('server_version_num')::int >= 140000"
    };
}
use no_idle_session_timeout;

/// Run at the start of every session of the sink that is not a writer
/// session (the control session; the operator tool's). Each idles between
/// uses for as long as a checkpoint interval (the control session records
/// the prepared handle once per checkpoint) or an operator's pause, so a
/// role's or database's `idle_session_timeout` shorter than that would end
/// it; the client notices only at its next statement, which then fails, and
/// every prepare failed the same way after every restart (found by
/// review). The operator's claim lives in its writer session too.
const SESSION_SETUP: &str = no_idle_session_timeout!();

/// How long an abort waits for the lock on a transaction's handle row
/// (see `abort_not_prepared`).
const HANDLE_ROW_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '5s'";

/// What the open transaction's COPY is called in errors.
const COPY_OP: &str = "COPY into the open transaction";

struct OpenTxn {
    id: TransactionId,
    /// Writer session generation the transaction began in.
    generation: u64,
    rows: u64,
    /// Set when a statement failed inside it: PostgreSQL has aborted it.
    failed: Option<String>,
    /// The latest batches sent into its COPY.
    sent: SentRows,
    /// Which record each line of its COPY belongs to.
    lines: LineMap,
}

/// How many bytes of the latest batches an open transaction keeps (see
/// [`SentRows`]): a few batches of the Java side's default size (1 MiB).
const SENT_KEPT_BYTES: usize = 4 << 20;

/// The latest batches streamed into the open transaction's COPY, shared
/// with the feeder thread rather than copied. The server reports a row it
/// refuses only when the COPY ends, by its line; these let the error show
/// the record's first bytes when the row is among them. Older batches are
/// let go beyond [`SENT_KEPT_BYTES`] (the newest is always kept): holding a
/// whole transaction would cost as much memory as its data.
#[derive(Default)]
struct SentRows {
    /// (index of the batch's first record in the transaction, its rows).
    batches: VecDeque<(u64, Arc<Vec<u8>>)>,
    bytes: usize,
}

impl SentRows {
    fn push(&mut self, first: u64, rows: Arc<Vec<u8>>) {
        self.bytes += rows.len();
        self.batches.push_back((first, rows));
        while self.bytes > SENT_KEPT_BYTES && self.batches.len() > 1 {
            if let Some((_, old)) = self.batches.pop_front() {
                self.bytes -= old.len();
            }
        }
    }

    /// Row `index` of the transaction (0-based, without its line break),
    /// if still kept.
    fn row(&self, index: u64, format: CopyFormat) -> Option<&[u8]> {
        let (first, rows) = self.batches.iter().rev().find(|(f, _)| *f <= index)?;
        nth_row(rows, index - first, format)
    }
}

/// Row `n` (0-based) of COPY data made of whole rows, each ending in a line
/// break (in CSV, one outside quotes), without the line break.
fn nth_row(rows: &[u8], n: u64, format: CopyFormat) -> Option<&[u8]> {
    let (mut start, mut row, mut quoted) = (0, 0, false);
    for (i, &b) in rows.iter().enumerate() {
        match b {
            b'"' if format == CopyFormat::Csv => quoted = !quoted,
            b'\n' if !quoted => {
                if row == n {
                    return Some(&rows[start..i]);
                }
                row += 1;
                start = i + 1;
            }
            _ => {}
        }
    }
    None
}

struct TxnSql {
    copy_target: String,
    insert_side: String,
    record_in_txn: String,
    after_commit: String,
    delete_side: String,
    find_record: String,
    find_tombstone: String,
    find_side: String,
    staged: String,
    clean_side: String,
    committed_after: String,
    insert_tombstone: String,
    delete_tombstone: String,
    delete_record: String,
    retract_rows: Option<String>,
}

enum ModeSql {
    Transactional(Box<TxnSql>),
    /// With the transactional mode's statements, for what a transactional
    /// run of the same sink left prepared (see the `mode_switch` module).
    Idempotent(IdempotentSql, Box<TxnSql>),
}

/// The PostgreSQL destination of one subtask: two sessions (writer and
/// control), opened by [`PgDestination::connect`] and reopened lazily.
pub struct PgDestination {
    options: PgOptions,
    sink: SinkId,
    table: TableName,
    control_tables: ControlTables,
    secrets: Secrets,
    sql: ModeSql,
    control: Link,
    writer: Link,
    open: Option<OpenTxn>,
    /// Writer session generation in which the staging table exists.
    stage_generation: Option<u64>,
    /// Idempotent mode: a batch of this checkpoint's transaction met a key
    /// already in the table, so the rest are upserted without trying the
    /// COPY straight into the target first (see [`crate::idempotent`]).
    upsert_until_prepare: bool,
    /// The ownership this destination holds (see the module docs).
    owner: Option<OwnedShare>,
    /// Shares of an earlier, larger parallelism this subtask looks after,
    /// claimed after its own and held in the same session.
    leftover_shares: Vec<OwnedShare>,
    /// The history segments' table is known to exist (see
    /// [`history`]).
    segments_known: bool,
    /// Retracts remove commit records only (see
    /// [`PgDestination::retract_records_only`]).
    records_only: bool,
    /// Test hook (see [`PgDestination::lose_writer_session_after_next_copy`]).
    lose_writer_after_copy: bool,
    /// Test hook (see [`PgDestination::after_next_refusal`]).
    after_next_refusal: Option<Box<dyn FnOnce() + Send>>,
    /// A trigger skipped rows of a COPY, and the warning was given.
    warned_rows_skipped: bool,
    /// Opened for an operator's tool (`connect_operator`): listings leave
    /// the stale handle rows alone. Removing them is the job's own
    /// housekeeping, and a removal beside a live job's prepare can make
    /// that prepare fail (see the module docs): `twopc inspect` and dry
    /// runs must change nothing.
    operator: bool,
}

/// What a refused finish of a prepared transaction means (see
/// [`PgDestination::refusal`]).
enum Refusal {
    /// It stays prepared: the error to report.
    Stays(DestinationError),
    /// Its owner finished it meanwhile: resolve it as not prepared.
    Gone,
}

/// The advisory lock held for one sink and subtask, and the writer session
/// generation that holds it.
struct OwnedShare {
    key: i64,
    generation: u64,
    subtask: u32,
    /// The claim it was taken with, for its owner row.
    claim: OwnerClaim,
}

/// The advisory lock key of a sink's share: a stable 64-bit hash (FNV-1a)
/// of a fixed tag, the sink id and the subtask, so two sinks never share a
/// key. Not the control schema: a sink's transactions are PostgreSQL's
/// prepared transactions, which belong to the database and are found by the
/// sink id in their name, whatever schema the handles are kept in. Two jobs
/// with one sink id in two control schemas would each take the other's for
/// leftovers and roll them back, so the second is refused like any second
/// owner.
fn owner_lock_key(sink: &SinkId, subtask: u32) -> i64 {
    lock_key(&format!("twopc-owner\0{sink}\0{subtask}"))
}

/// The backend that holds the session-level advisory lock `key` in this
/// database (a bigint key shows in pg_locks as classid = its high half,
/// objid = its low half).
fn lock_holder(c: &mut postgres::Client, key: i64) -> Result<Option<i32>, postgres::Error> {
    Ok(c.query_opt(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
           AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = $1 \
           AND database = (SELECT oid FROM pg_database \
                           WHERE datname = current_database()) \
         LIMIT 1",
        &[&key],
    )?
    .and_then(|r| r.get(0)))
}

/// An advisory lock key: the FNV-1a hash of `text`, which starts with a tag
/// naming what it locks so that keys of different uses never meet.
fn lock_key(text: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h as i64
}

impl std::fmt::Debug for PgDestination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDestination")
            .field("sink", &self.sink)
            .field("options", &self.options)
            .field("control_backend", &self.control.pid())
            .field("writer_backend", &self.writer.pid())
            .field("open", &self.open.as_ref().map(|o| o.id.as_str()))
            .finish()
    }
}

impl PgDestination {
    /// A destination over its parts, with no transaction open and nothing
    /// learnt about the tables yet: the one place that names every field's
    /// starting value, for each way of opening one.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        sink: SinkId,
        table: TableName,
        control_tables: ControlTables,
        secrets: Secrets,
        sql: ModeSql,
        control: Link,
        writer: Link,
        options: PgOptions,
    ) -> Self {
        PgDestination {
            sink,
            table,
            control_tables,
            secrets,
            sql,
            control,
            writer,
            open: None,
            stage_generation: None,
            upsert_until_prepare: false,
            owner: None,
            leftover_shares: Vec::new(),
            segments_known: false,
            records_only: false,
            lose_writer_after_copy: false,
            after_next_refusal: None,
            warned_rows_skipped: false,
            operator: false,
            options,
        }
    }

    /// Validates the options, connects, checks the server and the target
    /// table (see [`crate::schema`]) and creates the control tables when
    /// absent. Settings that cannot work are `TwopcError::Config` (fatal: a
    /// restart would not help); an unreachable server is
    /// `TwopcError::Scan` (retryable).
    pub fn connect(options: PgOptions, ctx: &SubtaskContext) -> Result<Self, TwopcError> {
        options.validate()?;
        let secrets = Secrets::of(&options);
        let config = options.connection_config()?;
        let table = options.table_name()?;
        let control_tables = ControlTables::new(&options.control_schema);
        let app = |role: &str| format!("twopc {} {} {role}", ctx.sink, ctx.subtask);
        let mut control = Link::new(
            "control",
            config.clone(),
            &app("control"),
            secrets.clone(),
            SESSION_SETUP,
        );
        let writer = Link::new(
            "writer",
            config,
            &app("writer"),
            secrets.clone(),
            WRITER_SETUP,
        )
        .writing();

        let scope = ctx.scope();
        let startup = |e: StartupError| match e {
            StartupError::Config(c) => TwopcError::Config(c),
            StartupError::Pg(source) if source.kind == DestinationErrorKind::Rejected => {
                TwopcError::Config(ConfigError::new(format!(
                    "PostgreSQL refused the sink's start-up ({}); fix the connection settings \
                     or the server",
                    source.message
                )))
            }
            StartupError::Pg(source) => TwopcError::Scan {
                scope: scope.clone(),
                action: "connecting to PostgreSQL and checking the target table",
                source,
            },
        };
        let client = control
            .client()
            .map_err(|f| startup(StartupError::Pg(f.error)))?;
        let info =
            schema::check(client, &options, ctx, &control_tables, &secrets).map_err(startup)?;

        let copy_options = match options.copy_format {
            CopyFormat::Text => "",
            CopyFormat::Csv => " WITH (FORMAT csv)",
        };
        let sql = match &options.mode {
            PgMode::Transactional => ModeSql::Transactional(Box::new(TxnSql::new(
                &table,
                &options,
                &control_tables,
                copy_options,
            ))),
            PgMode::Idempotent { key_columns } => ModeSql::Idempotent(
                IdempotentSql::new(
                    &table,
                    &options.columns,
                    &info.column_types,
                    key_columns,
                    copy_options,
                    options.operation_field,
                    info.traits,
                ),
                Box::new(TxnSql::new(&table, &options, &control_tables, "")),
            ),
        };
        let mut dest = PgDestination::assemble(
            ctx.sink.clone(),
            table,
            control_tables,
            secrets,
            sql,
            control,
            writer,
            options,
        );
        if dest.txn_sql().is_some() {
            // For `twopc reconcile` (see the `sinks` module).
            dest.record_sink(&info.schema, &info.name);
        }
        Ok(dest)
    }

    /// Connects for an operator's tool (`twopc reconcile`, `twopc decide`,
    /// `twopc inspect`) to sink `sink`'s control tables, in transactional
    /// mode. `options.columns` may be empty: the tool writes no records. The
    /// target table is checked to exist, and so is the transaction-id
    /// column when one is given; the control tables must exist (the tool
    /// never creates them).
    pub fn connect_operator(options: PgOptions, sink: &SinkId) -> Result<Self, TwopcError> {
        let secrets = Secrets::of(&options);
        let config = options.connection_config()?;
        let table = options.table_name()?;
        if options.mode != PgMode::Transactional {
            return Err(TwopcError::Config(ConfigError::new(
                "the idempotent mode keeps no commit records or prepared transactions: there is \
                 nothing to reconcile or decide",
            )));
        }
        let control_tables = ControlTables::new(&options.control_schema);
        let app = |role: &str| format!("twopc {sink} {role}");
        let mut control = Link::new(
            "control",
            config.clone(),
            &app("cli"),
            secrets.clone(),
            SESSION_SETUP,
        );
        let writer = Link::new(
            "writer",
            config,
            &app("cli-owner"),
            secrets.clone(),
            SESSION_SETUP,
        );
        let fail = |action: &'static str| {
            let sink = sink.clone();
            move |f: Failure| TwopcError::Scan {
                scope: twopc_core::error::SinkScope {
                    sink: sink.clone(),
                    subtask: 0,
                },
                action,
                source: f.error,
            }
        };
        let client = control.client().map_err(fail("connecting to PostgreSQL"))?;
        let pg = |op: &'static str| {
            let secrets = secrets.clone();
            move |e: postgres::Error| TwopcError::Scan {
                scope: twopc_core::error::SinkScope {
                    sink: sink.clone(),
                    subtask: 0,
                },
                action: op,
                source: error::pg(&secrets, op, &e),
            }
        };
        let found: Option<String> = client
            .query_one(
                "SELECT to_regclass($1::text)::text",
                &[&control_tables.commit_records],
            )
            .map_err(pg("looking up the control tables"))?
            .get(0);
        if found.is_none() {
            return Err(TwopcError::Config(ConfigError::new(format!(
                "{} does not exist: no transactional twopc sink has used this database with the \
                 control schema {:?}. Pass the control schema the sink is configured with \
                 (--control-schema)",
                control_tables.commit_records, options.control_schema
            ))));
        }
        let oid: Option<u32> = client
            .query_one("SELECT to_regclass($1::text)::oid", &[&table.quoted()])
            .map_err(pg("looking up the target table"))?
            .get(0);
        let Some(oid) = oid else {
            return Err(TwopcError::Config(ConfigError::new(format!(
                "target table {table} does not exist; pass the table the sink writes to (names \
                 are case-sensitive)"
            ))));
        };
        if let Some(col) = &options.transaction_id_column {
            let exists = client
                .query_opt(
                    "SELECT 1 FROM pg_attribute WHERE attrelid = $1 AND attname = $2 \
                     AND attnum > 0 AND NOT attisdropped",
                    &[&oid, col],
                )
                .map_err(pg("looking up the transaction-id column"))?
                .is_some();
            if !exists {
                return Err(TwopcError::Config(ConfigError::new(format!(
                    "{table} has no column {}: pass the transaction-id column the sink is \
                     configured with (transactionIdColumn), or leave the option out",
                    quote_ident(col)
                ))));
            }
        }
        let sql =
            ModeSql::Transactional(Box::new(TxnSql::new(&table, &options, &control_tables, "")));
        let mut dest = PgDestination::assemble(
            sink.clone(),
            table,
            control_tables,
            secrets,
            sql,
            control,
            writer,
            options,
        );
        dest.operator = true;
        Ok(dest)
    }

    /// For tests: the next prepare drops the writer session right after its
    /// COPY ended well, as when the server ends the session just after it
    /// reported the COPY complete and the client reads both at once. The
    /// prepare must then fail, not finish in a new session.
    #[doc(hidden)]
    pub fn lose_writer_session_after_next_copy(&mut self) {
        self.lose_writer_after_copy = true;
    }

    /// For tests: `hook` runs after the next refusal of a finish of a
    /// prepared transaction by another role (42501), before the refusal is
    /// looked into, as when its owner finishes it at that moment.
    #[doc(hidden)]
    pub fn after_next_refusal(&mut self, hook: impl FnOnce() + Send + 'static) {
        self.after_next_refusal = Some(Box::new(hook));
    }

    /// For tests: the value of setting `name` in the writer session
    /// (connecting it if needed), as `current_setting` shows it.
    #[doc(hidden)]
    pub fn writer_setting(&mut self, name: &str) -> Result<String, DestinationError> {
        Ok(self.writer.run("reading a setting", |c| {
            Ok(c.query_one("SELECT current_setting($1)", &[&name])?.get(0))
        })?)
    }

    /// For `twopc reconcile --rows-deleted-by-hand` of a sink that fills no
    /// transaction-id column: from now on a retract removes a transaction's
    /// commit record only (loose, or its entry in a history segment), and
    /// no row of the target table; the operator deleted those by hand.
    pub fn retract_records_only(&mut self) {
        self.records_only = true;
    }

    fn lost_table_exists(&mut self) -> Result<bool, DestinationError> {
        let name = self.control_tables.lost.clone();
        self.table_exists(&name)
    }

    /// Every transactional sink with output in the control tables (a
    /// commit record or a prepared handle), for `twopc inspect` of a whole
    /// database. Idempotent-mode sinks keep neither, and are not listed.
    pub fn sink_ids(&mut self) -> Result<Vec<SinkId>, DestinationError> {
        // A sink whose every record is folded has only segments left.
        let segments = if self.segments_exist()? {
            format!(
                " UNION SELECT sink_id FROM {}",
                self.control_tables.segments
            )
        } else {
            String::new()
        };
        let t = &self.control_tables;
        let sql = format!(
            "SELECT sink_id FROM {} UNION SELECT sink_id FROM {}{segments} ORDER BY 1",
            t.commit_records, t.prepared
        );
        let rows = self
            .control
            .run("listing the sinks of the control tables", |c| {
                Ok(c.query(&sql, &[])?)
            })?;
        // A row that is no sink id of ours was not written by twopc: left out.
        Ok(rows
            .iter()
            .filter_map(|r| SinkId::new(r.get::<_, String>(0)).ok())
            .collect())
    }

    fn table_exists(&mut self, name: &str) -> Result<bool, DestinationError> {
        Ok(self.control.run("looking up a control table", |c| {
            Ok(
                c.query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&name])?
                    .get(0),
            )
        })?)
    }

    /// The target table, quoted.
    pub fn table(&self) -> String {
        self.table.to_string()
    }

    /// Before the writer session's first statement in a (re)connected
    /// session: takes the ownership lock again, or fails if another run
    /// took it while the session was gone.
    fn ensure_owner(&mut self) -> Result<(), DestinationError> {
        let (generation, connected) = (self.writer.generation(), self.writer.is_connected());
        // Every share held, each by its own generation: a share claimed
        // later (a cleanup's check claims a free one) may have been taken
        // in a newer session than the others, and checking only the own
        // share's left the others unlocked after such a reconnect (found by
        // review).
        let stale: Vec<(i64, u32, bool)> = self
            .owner
            .iter()
            .map(|s| (s, true))
            .chain(self.leftover_shares.iter().map(|s| (s, false)))
            .filter(|(s, _)| !(connected && s.generation == generation))
            .map(|(s, own)| (s.key, s.subtask, own))
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        for (key, subtask, own) in stale {
            let got: bool = self.try_lock_share("taking back an ownership lock", key)?;
            if !got {
                let whose = if own {
                    format!("this subtask's ownership lock (subtask {subtask})")
                } else {
                    format!(
                        "the ownership lock of subtask {subtask}'s share, which this subtask \
                         looks after"
                    )
                };
                return Err(self.err(
                    DestinationErrorKind::Unavailable,
                    format!(
                        "the writer session of sink '{}' was reconnected, and meanwhile \
                         another session took {whose} (see {}); the job restarts and its \
                         start-up names the owner",
                        self.sink, self.control_tables.owners
                    ),
                ));
            }
        }
        let generation = self.writer.generation();
        for share in self.owner.iter_mut().chain(self.leftover_shares.iter_mut()) {
            share.generation = generation;
        }
        self.record_owner_session()?;
        Ok(())
    }

    /// After the writer session was reconnected and took its locks back:
    /// the owner rows of the shares it holds name its new backend (and its
    /// claim again, in case another session held a share meanwhile). A row
    /// is taken for the holder's only when it names the backend holding
    /// the lock (see `read_owner`), so a row left naming the lost session
    /// would hide this attempt from its own committer (found by re-review).
    fn record_owner_session(&mut self) -> Result<(), DestinationError> {
        let claims: Vec<OwnerClaim> = self
            .owner
            .iter()
            .chain(self.leftover_shares.iter())
            .map(|s| s.claim.clone())
            .collect();
        for claim in &claims {
            self.write_owner_row(claim)?;
        }
        Ok(())
    }

    /// Records `claim` as the holder of its share, through the writer
    /// session's backend (which holds the share's lock).
    fn write_owner_row(&mut self, claim: &OwnerClaim) -> Result<(), DestinationError> {
        let pid = self.writer.pid().unwrap_or(0);
        let sql = format!(
            "INSERT INTO {} (sink_id, subtask, run_id, attempt, instance, backend_pid, since) \
             VALUES ($1, $2, $3, $4, $5, $6, now()) \
             ON CONFLICT (sink_id, subtask) DO UPDATE SET run_id = excluded.run_id, \
               attempt = excluded.attempt, instance = excluded.instance, \
               backend_pid = excluded.backend_pid, since = excluded.since",
            self.control_tables.owners
        );
        let (sink, sub, run) = (
            self.sink.as_str().to_string(),
            claim.subtask as i32,
            claim.run.as_str().to_string(),
        );
        let (attempt, instance) = (claim.attempt as i32, format!("{:016x}", claim.instance));
        self.control.run("recording the owner", |c| {
            Ok(c.execute(&sql, &[&sink, &sub, &run, &attempt, &instance, &pid])?)
        })?;
        Ok(())
    }

    /// Takes the session-level advisory lock `key` of a share in the writer
    /// session, without waiting: false when another session holds it.
    fn try_lock_share(&mut self, action: &str, key: i64) -> Result<bool, Failure> {
        self.writer.run(action, |c| {
            Ok(c.query_one("SELECT pg_try_advisory_lock($1)", &[&key])?
                .get(0))
        })
    }

    /// Who holds the ownership lock of `subtask`, as recorded; `None` when
    /// nobody holds it now (released since the caller looked).
    fn read_owner(&mut self, subtask: u32) -> Result<Option<OwnerInfo>, DestinationError> {
        let own = self.control_tables.owners.clone();
        // The lock is per sink id and database, the owners' table per
        // control schema: the holder may record itself in another schema's
        // table. Its backend is found in pg_locks (a bigint key shows as
        // classid = its high half, objid = its low half), and its row by
        // that backend in this schema's table or in any other twopc_owners
        // this user may read. Only the row of the backend that holds the
        // lock counts: a row an earlier holder left (until a new holder,
        // locked already, writes its own; or for good when the new one
        // records itself in another schema) names someone who holds
        // nothing, maybe the caller's own attempt, whose cleanup would then
        // go ahead on a share another session holds (found by review).
        let key = owner_lock_key(&self.sink, subtask);
        let schema = self.control_tables.schema.clone();
        let (pid, others) = self.control.run("looking up the lock's holder", |c| {
            let pid = lock_holder(c, key)?;
            let others: Vec<String> = c
                .query(
                    "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c \
                     JOIN pg_namespace n ON n.oid = c.relnamespace \
                     WHERE c.relname = 'twopc_owners' AND c.relkind IN ('r', 'p') \
                       AND n.nspname <> $1 AND has_table_privilege(c.oid, 'SELECT') \
                     ORDER BY 1",
                    &[&schema],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            Ok((pid, others))
        })?;
        // Nobody holds it now: any row is an earlier holder's.
        let Some(pid) = pid else {
            return Ok(None);
        };
        if let Some(row) = self.owner_row(&own, subtask, Some(pid))? {
            return Ok(Some(self.owner_info(&row, subtask, &own, "")));
        }
        for table in others {
            if let Some(row) = self.owner_row(&table, subtask, Some(pid))? {
                let note = format!(
                    ", with another control schema than this sink's {} (one sink id \
                     owns its prepared transactions across the database, whatever the \
                     control schema, so it is held per sink id and database)",
                    quote_ident(&schema)
                );
                return Ok(Some(self.owner_info(&row, subtask, &table, &note)));
            }
        }
        Ok(Some(OwnerInfo {
            claim: None,
            holder: format!(
                "another session (PostgreSQL backend {pid}, see pg_stat_activity) holds the \
                 advisory lock of sink '{}' subtask {subtask} in this \
                 database, and {own} has no row for it: a job with the same sink id and \
                 another control schema holds it (the lock is per sink id and database, \
                 whatever the control schema, because a sink's prepared transactions are \
                 found by its sink id across the database), or a tool that took the lock by hand",
                self.sink,
            ),
        }))
    }

    /// Who holds `claim.subtask`'s share, without a statement in the writer
    /// session: a transaction may be open there, with a COPY streaming into
    /// it between batches, and a statement in between would break it (found
    /// by the SinkFunction shim's test). The control session looks up the
    /// backend that holds the share's advisory lock instead: this
    /// destination's writer session (`Acquired`), another session (its
    /// owner row), or none, when the share is claimed in the writer session
    /// if no transaction is open there; with one open, it cannot be taken
    /// now, nobody holds it, and the cleanup acts as before (`None`).
    fn confirm_share(&mut self, claim: &OwnerClaim) -> Result<Option<Ownership>, DestinationError> {
        let key = owner_lock_key(&self.sink, claim.subtask);
        let holder = self
            .control
            .run("looking up the holder of a share's lock", |c| {
                Ok(lock_holder(c, key)?)
            })?;
        match holder {
            Some(pid) if Some(pid) == self.writer.pid() => Ok(Some(Ownership::Acquired)),
            Some(_) => match self.read_owner(claim.subtask)? {
                Some(holder) => Ok(Some(Ownership::HeldBy(holder))),
                // Released since: as if nobody had held it.
                None if self.open.is_none() => self.claim_ownership(claim).map(Some),
                None => Ok(None),
            },
            None if self.open.is_none() => self.claim_ownership(claim).map(Some),
            None => Ok(None),
        }
    }

    /// This sink's owner row of `subtask` in `table` (quoted), held by
    /// backend `pid` if given.
    fn owner_row(
        &mut self,
        table: &str,
        subtask: u32,
        pid: Option<i32>,
    ) -> Result<Option<postgres::Row>, DestinationError> {
        let sql = format!(
            "SELECT run_id, attempt, instance, backend_pid, \
                    (extract(epoch FROM since) * 1000)::int8 \
             FROM {table} WHERE sink_id = $1 AND subtask = $2 \
               AND ($3::int4 IS NULL OR backend_pid = $3)"
        );
        let sink = self.sink.as_str().to_string();
        let sub = subtask as i32;
        Ok(self.control.run("reading the owner of this subtask", |c| {
            Ok(c.query_opt(&sql, &[&sink, &sub, &pid])?)
        })?)
    }

    /// The holder an owner row of `table` records; `note` ends its words.
    fn owner_info(&self, row: &postgres::Row, subtask: u32, table: &str, note: &str) -> OwnerInfo {
        let run: String = row.get(0);
        let attempt: i32 = row.get(1);
        let instance: String = row.get(2);
        let pid: i32 = row.get(3);
        let since: i64 = row.get(4);
        let claim = RunId::new(run.clone()).ok().map(|run| OwnerClaim {
            sink: self.sink.clone(),
            subtask,
            run,
            attempt: attempt.max(0) as u32,
            instance: u64::from_str_radix(&instance, 16).unwrap_or(0),
        });
        OwnerInfo {
            claim,
            holder: format!(
                "run {run} (attempt {attempt}) holds it through PostgreSQL backend {pid}, since \
                 {} (see pg_stat_activity and {table}){note}",
                twopc_core::clock::format_utc(u64::try_from(since).unwrap_or(0)),
            ),
        }
    }

    pub fn options(&self) -> &PgOptions {
        &self.options
    }

    /// Backend process id of the control session, if connected (for
    /// operators matching `pg_stat_activity`, and for tests that terminate
    /// it on purpose).
    pub fn control_backend_pid(&self) -> Option<i32> {
        self.control.pid()
    }

    /// Backend process id of the writer session, if connected.
    pub fn writer_backend_pid(&self) -> Option<i32> {
        self.writer.pid()
    }

    /// Quoted names of the control tables: commit records, prepared
    /// handles, tombstones, owners, lineages, runs.
    pub fn control_table_names(&self) -> [&str; 6] {
        self.control_tables.all().map(String::as_str)
    }

    /// An operator's tool holds the sink by its writer session's locks. If
    /// that session ended (an idle-session timeout, a server restart, an
    /// administrator or a proxy ended it), the locks went with it and a job
    /// may have started since: the tool stops before its next change
    /// instead of taking them back, since its plan was made while it held
    /// them (found by review). A no-op for a job's destination, whose
    /// `ensure_owner` takes its locks back.
    fn ensure_operator_hold(&mut self) -> Result<(), DestinationError> {
        if !self.operator {
            return Ok(());
        }
        let generations: Vec<u64> = self
            .owner
            .iter()
            .chain(&self.leftover_shares)
            .map(|s| s.generation)
            .collect();
        let Some(&first) = generations.first() else {
            return Ok(());
        };
        // Every share claimed in one session, and that session still
        // answering (an ended one shows only when used): its locks hold.
        let held = generations.iter().all(|&g| g == first)
            && self
                .writer
                .run_in_session("checking the claim's session", first, |c| {
                    Ok(c.simple_query("SELECT 1")?)
                })
                .is_ok();
        if !held {
            // NotPermitted: no retry within this command gets the claim
            // back, so a commit must not retry it as an unknown outcome.
            return Err(self.err(
                DestinationErrorKind::NotPermitted,
                format!(
                    "the session holding this tool's claim on sink '{}' ended, and the claim \
                     with it (an idle-session timeout, a server restart, an administrator or a \
                     proxy ended it); a job may have started since. Nothing more was changed: \
                     run the command again, which claims the sink anew and works from what is \
                     there then",
                    self.sink
                ),
            ));
        }
        Ok(())
    }

    fn err(&self, kind: DestinationErrorKind, msg: impl AsRef<str>) -> DestinationError {
        error::other(&self.secrets, kind, msg)
    }

    /// What a refused `ROLLBACK PREPARED` or `COMMIT PREPARED` means. Only
    /// 42501 (another role prepared it) is looked into: the transaction
    /// stays prepared, and the error names the role that may finish it
    /// (`NotPermitted`, fatal: no restart waits that out);
    /// or it is no longer prepared, because its owner finished it between
    /// the refusal and the look-up, and the caller resolves it as one
    /// PostgreSQL does not hold (a commit record or none), not as refused.
    fn refusal(&mut self, f: Failure, txn: &TransactionId, verb: &str) -> Refusal {
        if !f.is(INSUFFICIENT_PRIVILEGE) {
            return Refusal::Stays(f.error);
        }
        if let Some(hook) = self.after_next_refusal.take() {
            hook();
        }
        let looked_up = self
            .control
            .run("looking up who prepared the transaction", |c| {
                Ok(c.query_opt(
                    "SELECT owner::text FROM pg_prepared_xacts WHERE gid = $1",
                    &[&txn.as_str()],
                )?)
            });
        let who = match looked_up {
            Ok(None) => {
                log::info!(
                    "twopc sink '{}': {verb} of {txn} was refused ({}), and the transaction is \
                     no longer prepared: its owner finished it meanwhile",
                    self.sink,
                    f.error.message
                );
                return Refusal::Gone;
            }
            // NULL when the role that prepared it was dropped since.
            Ok(Some(row)) => match row.get::<_, Option<String>>(0) {
                Some(owner) => format!(
                    "it was prepared by role {owner:?}, and PostgreSQL lets only that role or a \
                     superuser finish it ({}). It stays prepared and holds its row locks. Connect \
                     this sink (or `twopc decide`) as {owner:?} or as a superuser, then restart \
                     the job",
                    f.error.message
                ),
                None => format!(
                    "the role that prepared it was dropped since, so only a superuser can finish \
                     it ({}). It stays prepared and holds its row locks. Connect this sink (or \
                     `twopc decide`) as a superuser, then restart the job",
                    f.error.message
                ),
            },
            Err(_) => format!(
                "this connection's role may not finish it: only the role that prepared it or a \
                 superuser may ({}; `SELECT owner FROM pg_prepared_xacts` names the role). It \
                 stays prepared and holds its row locks. Connect this sink (or `twopc decide`) as \
                 that role or as a superuser, then restart the job",
                f.error.message
            ),
        };
        Refusal::Stays(self.err(
            DestinationErrorKind::NotPermitted,
            format!("{verb} of prepared transaction {txn} was refused: {who}"),
        ))
    }

    fn txn_sql(&self) -> Option<&TxnSql> {
        match &self.sql {
            ModeSql::Transactional(s) => Some(s),
            ModeSql::Idempotent(..) => None,
        }
    }

    /// The statements on prepared transactions, in either mode (the
    /// idempotent mode finishes those a transactional run left).
    fn prepared_sql(&self) -> &TxnSql {
        match &self.sql {
            ModeSql::Transactional(s) | ModeSql::Idempotent(_, s) => s,
        }
    }

    /// The record's trailing field for the transaction-id column, if
    /// configured. Transaction ids are `[A-Za-z0-9_.-]`, which needs no
    /// escaping or quoting in either COPY format.
    fn row_suffix(&self, txn: &TransactionId) -> Option<Vec<u8>> {
        self.options.transaction_id_column.as_ref().map(|_| {
            let mut s = vec![self.options.copy_format.delimiter()];
            s.extend_from_slice(txn.as_str().as_bytes());
            s
        })
    }

    fn rows_mismatch(&self, loaded: u64, records: u64) -> DestinationError {
        self.err(
            DestinationErrorKind::Rejected,
            format!(
                "COPY loaded {loaded} rows into {} from {records} records: a record must be \
                 exactly one row in {} format (an unescaped line break splits one into two). \
                 Fix the schema that formats the records",
                self.table,
                match self.options.copy_format {
                    CopyFormat::Text => "PostgreSQL's COPY text",
                    CopyFormat::Csv => "CSV",
                }
            ),
        )
    }

    // ---- transactional mode -------------------------------------------

    /// Rolls back the open transaction, if any; dropping the session when
    /// the rollback itself fails (the server then rolls it back).
    fn rollback_open(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        if self.writer.is_copying() {
            // Cancelling the COPY aborts the transaction on the server; the
            // ROLLBACK below ends it. Its error, if any, is what ended the
            // transaction, already reported or moot.
            if let Err(f) = self.writer.end_copy("cancelling the COPY", false) {
                log::debug!("cancelling the COPY of {}: {}", open.id, f.error);
            }
        }
        if open.generation == self.writer.generation() && self.writer.is_connected() {
            if let Err(f) = self
                .writer
                .run("rolling back", |c| Ok(c.batch_execute("ROLLBACK")?))
            {
                log::warn!(
                    "rolling back transaction {} failed ({}); closing the writer session so the \
                     server rolls it back",
                    open.id,
                    f.error
                );
                self.writer.disconnect();
            }
        }
    }

    fn write_transactional(
        &mut self,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<(), DestinationError> {
        if let Some(open) = &self.open {
            if &open.id != txn {
                // The core never writes to a second transaction before the
                // first is prepared or aborted; if it did, rows of two
                // transactions must not mix.
                log::warn!(
                    "transaction {} was left open when {txn} began writing; rolling it back",
                    open.id
                );
                self.rollback_open();
            }
        }
        if let Some(open) = &self.open {
            if let Some(why) = &open.failed {
                return Err(self.err(
                    DestinationErrorKind::Io,
                    format!("transaction {txn} cannot take more rows: {why}"),
                ));
            }
            if open.generation != self.writer.generation() || !self.writer.is_connected() {
                return Err(self.lost_open(txn));
            }
        } else {
            self.ensure_owner()?;
            let begin = |c: &mut postgres::Client| Ok(c.batch_execute("BEGIN")?);
            let generation = match &self.owner {
                // In the session that holds the ownership lock, which
                // `ensure_owner` just made sure of, never in a new one.
                Some(share) => {
                    let generation = share.generation;
                    self.writer
                        .run_in_session("beginning a transaction", generation, begin)?;
                    generation
                }
                None => {
                    self.writer.run("beginning a transaction", begin)?;
                    self.writer.generation()
                }
            };
            self.open = Some(OpenTxn {
                id: txn.clone(),
                generation,
                rows: 0,
                failed: None,
                sent: SentRows::default(),
                lines: LineMap::default(),
            });
            let copy_sql = self.txn_sql().expect("transactional").copy_target.clone();
            // The COPY in the session of the BEGIN.
            let started = self.writer.start_copy(COPY_OP, generation, copy_sql);
            if let Err(f) = started {
                let open = self.open.as_mut().expect("set above");
                open.failed = Some(format!("its COPY could not start ({})", f.error));
                return Err(f.error);
            }
        }
        let format = self.options.copy_format;
        let open = self.open.as_mut().expect("set above");
        for (i, record) in batch.iter().enumerate() {
            open.lines.push(open.rows + i as u64, record, format);
        }
        let rows = Arc::new(copy_rows(batch, self.row_suffix(txn).as_deref()));
        let mut result = self.writer.send_copy(COPY_OP, Arc::clone(&rows));
        if let Err(f) = &mut result {
            self.name_lock_holders(f);
        }
        // The server refuses a row only when the COPY ends, normally at
        // prepare; should it end early, the row it names is mapped back
        // here as well.
        let fault = result.as_ref().err().and_then(|f| self.txn_row_fault(f));
        let open = self.open.as_mut().expect("set above");
        match result {
            Ok(()) => {
                open.sent.push(open.rows, rows);
                open.rows += batch.len();
                Ok(())
            }
            Err(f) => {
                open.failed = Some(if f.lost {
                    "its session was lost, and PostgreSQL rolled it back".to_string()
                } else {
                    format!("a statement in it failed ({})", f.error)
                });
                Err(fault.map_or(f.error, DestinationError::record))
            }
        }
    }

    /// The fields of each record as the idempotent staging table names
    /// them: the columns, then the operation field when configured.
    fn stage_columns(&self) -> Vec<String> {
        let mut columns = self.options.columns.clone();
        if self.options.operation_field {
            columns.push(crate::idempotent::STAGE_OP.to_string());
        }
        columns
    }

    /// The columns of the transactional COPY, in order.
    fn copy_columns(&self) -> Vec<String> {
        let mut columns = self.options.columns.clone();
        columns.extend(self.options.transaction_id_column.iter().cloned());
        columns
    }

    /// The fault of the record behind `f`, when `f` is a row of the open
    /// transaction's COPY that the server refused for its data. One COPY
    /// carries the whole transaction, one record per line, so line N is the
    /// record at position N-1 of the transaction.
    fn txn_row_fault(&self, f: &Failure) -> Option<RecordFault> {
        let server = f.server.as_deref()?;
        let row = error::refused_row(server, &self.table.name, &self.copy_columns())?;
        let open = self.open.as_ref()?;
        let index = open.lines.record_of(row.line)?;
        let suffix = self.row_suffix(&open.id).unwrap_or_default();
        let record = open
            .sent
            .row(index, self.options.copy_format)
            .map(|r| r.strip_suffix(suffix.as_slice()).unwrap_or(r));
        Some(server_fault(
            server,
            row,
            RecordPosition::InTransaction(index),
            record,
            &suffix,
            "",
        ))
    }

    /// Checks every record of `batch` (see [`crate::rows`]) before any of it
    /// reaches the server: the first one that is not exactly one row
    /// PostgreSQL can take fails the write, named by its position.
    fn check_batch(&self, batch: RecordBatch<'_>) -> Result<(), DestinationError> {
        let format = self.options.copy_format;
        let fields = self.options.record_fields();
        for (i, record) in batch.iter().enumerate() {
            if let Err(fault) = rows::check(format, fields, record) {
                return Err(DestinationError::record(RecordFault {
                    position: RecordPosition::InBatch(i as u64),
                    column: fault
                        .field
                        .and_then(|f| self.stage_columns().get(f).cloned()),
                    reason: format!(
                        "as a COPY {} row, {} (found before the batch was sent to PostgreSQL: \
                         none of it was)",
                        match format {
                            CopyFormat::Text => "text",
                            CopyFormat::Csv => "CSV",
                        },
                        fault.problem
                    ),
                    preview: preview(record),
                }));
            }
        }
        Ok(())
    }

    fn lost_open(&self, txn: &TransactionId) -> DestinationError {
        self.err(
            DestinationErrorKind::Unavailable,
            format!(
                "the writer session holding open transaction {txn} was lost, and PostgreSQL \
                 rolled the transaction back; its records are replayed from the last checkpoint"
            ),
        )
    }

    fn prepare_transactional(
        &mut self,
        handle: &TransactionHandle,
    ) -> Result<(), DestinationError> {
        let txn = &handle.transaction;
        let info = handle.prepared().ok_or_else(|| {
            self.err(
                DestinationErrorKind::Corrupt,
                format!("prepare of {txn} without prepared state"),
            )
        })?;
        let unusable = match &self.open {
            None if info.records == 0 => return Ok(()), // nothing staged: nothing to prepare
            None => Some(self.err(
                DestinationErrorKind::Unavailable,
                format!(
                    "transaction {txn} holds {} records but no PostgreSQL transaction is open \
                     for it: its session was lost and the server rolled it back",
                    info.records
                ),
            )),
            Some(o) if &o.id != txn => Some(self.err(
                DestinationErrorKind::Corrupt,
                format!("prepare of {txn}, but the open transaction is {}", o.id),
            )),
            Some(o) if o.failed.is_some() => Some(self.err(
                DestinationErrorKind::Io,
                format!(
                    "transaction {txn} cannot be prepared: {}",
                    o.failed.as_deref().unwrap_or_default()
                ),
            )),
            Some(o) if o.generation != self.writer.generation() || !self.writer.is_connected() => {
                Some(self.lost_open(txn))
            }
            Some(_) => None,
        };
        if let Some(e) = unusable {
            self.rollback_open();
            return Err(e);
        }
        let (rows, generation) = self
            .open
            .as_ref()
            .map(|o| (o.rows, o.generation))
            .unwrap_or_default();
        // The COPY ends here; the server reports a rejected row only now.
        let loaded = match self.writer.end_copy(COPY_OP, true) {
            Ok(CopyEnd::Finished(loaded)) => loaded,
            Ok(CopyEnd::Abandoned) => {
                self.rollback_open();
                return Err(self.err(
                    DestinationErrorKind::Io,
                    format!(
                        "the COPY of {txn} ended before it was finished (a bug; please report it)"
                    ),
                ));
            }
            Err(f) => {
                let fault = self.txn_row_fault(&f).or_else(|| {
                    unnamed_fault(
                        &f,
                        "when the COPY ended, by a check made once the rows were in (a \
                             foreign key, a unique constraint declared DEFERRABLE, an AFTER \
                             trigger)",
                    )
                });
                self.rollback_open();
                if let Some(fault) = fault {
                    return Err(DestinationError::record(fault));
                }
                let holders = self.lock_holders(&f);
                return Err(self.err(
                    f.error.kind,
                    format!(
                        "transaction {txn} cannot be prepared: {}; it was rolled back and its \
                         records are replayed from the last checkpoint{holders}",
                        f.error.message
                    ),
                ));
            }
        };
        if std::mem::take(&mut self.lose_writer_after_copy) {
            self.writer.disconnect();
        }
        if loaded > rows {
            self.rollback_open();
            return Err(self.rows_mismatch(loaded, rows));
        }
        if loaded < rows && !self.warned_rows_skipped {
            // Every record was checked to be exactly one row before it was
            // sent (`check_batch`), so only a BEFORE INSERT row trigger
            // returning NULL loads fewer: it skipped the others, or put
            // them elsewhere itself (trigger-based partitioning), inside
            // this transaction. That is the table's rule, the same at every
            // replay: failing the prepare would restart the job forever
            // (found by review).
            self.warned_rows_skipped = true;
            log::warn!(
                "{}: COPY loaded {loaded} rows into {} from {rows} records of {txn}: a BEFORE \
                 INSERT row trigger of the table skipped the others or put them elsewhere, \
                 inside the same transaction (said once per subtask)",
                self.sink,
                self.table
            );
        }
        if rows != info.records {
            self.rollback_open();
            return Err(self.err(
                DestinationErrorKind::Corrupt,
                format!(
                    "transaction {txn} holds {rows} rows but the sink wrote {} records to it",
                    info.records
                ),
            ));
        }
        let gid = gid_literal(txn).map_err(|m| self.err(DestinationErrorKind::Corrupt, m))?;
        let checkpoint = to_i64(info.checkpoint, "checkpoint id")?;
        let lineage = handle.lineage.0 as i64; // bit pattern kept; compared for equality only
        let subtask = i32::try_from(handle.subtask)
            .map_err(|_| self.err(DestinationErrorKind::Corrupt, "subtask index too large"))?;
        let row_count = to_i64(rows, "row count")?;
        let sink = self.sink.as_str().to_string();
        let encoded = handle.encode();
        let sql = self.txn_sql().expect("transactional");
        let (insert_side, record_in_txn, delete_side) = (
            sql.insert_side.clone(),
            sql.record_in_txn.clone(),
            sql.delete_side.clone(),
        );

        // The session ended with the COPY (the server closed it right after
        // reporting the COPY complete): the transaction went with it.
        if !self.writer.holds_session(generation) {
            self.rollback_open();
            return Err(self.lost_open(txn));
        }

        // 1. The handle, outside the transaction, so recovery can read it
        //    while the transaction is prepared.
        if let Err(f) = self.control.run("recording the prepared handle", |c| {
            Ok(c.execute(&insert_side, &[&txn.as_str(), &sink, &encoded])?)
        }) {
            self.rollback_open();
            return Err(f.error);
        }

        // 2. The commit record, in the transaction, locking the side row;
        // 3. PREPARE TRANSACTION. Both in the session that holds the
        //    transaction, or nowhere.
        let run = handle.run.as_str().to_string();
        // Set once our own statements went through: an error of PREPARE
        // TRANSACTION itself comes from the deferred checks of the rows.
        let mut preparing = false;
        let result = self
            .writer
            .run_in_session("preparing the transaction", generation, |c| {
                let n = c.execute(
                    &record_in_txn,
                    &[
                        &txn.as_str(),
                        &sink,
                        &subtask,
                        &lineage,
                        &checkpoint,
                        &run,
                        &row_count,
                    ],
                )?;
                if n != 1 {
                    c.batch_execute("ROLLBACK")?;
                    return Ok(false);
                }
                preparing = true;
                c.batch_execute(&format!("PREPARE TRANSACTION {gid}"))?;
                Ok(true)
            });
        self.open = None;
        match result {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.delete_side_best_effort(&delete_side, txn);
                Err(self.err(
                    DestinationErrorKind::Io,
                    format!(
                        "the handle row of {txn} in {} vanished before the transaction could \
                         lock it (removed by a concurrent cleanup or by hand); the transaction \
                         was rolled back and its records are replayed",
                        self.control_tables.prepared
                    ),
                ))
            }
            Err(f) if f.lost => {
                // PREPARE may have happened. Keep the handle row: if it did,
                // recovery needs it; if not, cleanup removes the row.
                Err(self.err(
                    f.error.kind,
                    format!(
                        "{}; whether {txn} got prepared is unknown: if it did, it is committed \
                         or aborted by id like any prepared transaction",
                        f.error.message
                    ),
                ))
            }
            Err(f) => {
                // PostgreSQL rejected it; the transaction is rolled back (a
                // failed PREPARE TRANSACTION ends as a ROLLBACK, and an
                // earlier error aborted the block, which this resets).
                let _ = self
                    .writer
                    .run("rolling back", |c| Ok(c.batch_execute("ROLLBACK")?));
                self.delete_side_best_effort(&delete_side, txn);
                let checked = "at PREPARE TRANSACTION, by a check deferred to the end of the \
                               transaction (a DEFERRABLE constraint, a constraint trigger)";
                match unnamed_fault(&f, checked).filter(|_| preparing) {
                    Some(fault) => Err(DestinationError::record(fault)),
                    None => Err(f.error),
                }
            }
        }
    }

    fn delete_side_best_effort(&mut self, delete_side: &str, txn: &TransactionId) {
        if let Err(f) = self.control.run("removing a handle row", |c| {
            Ok(c.execute(delete_side, &[&txn.as_str()])?)
        }) {
            log::warn!(
                "could not remove the handle row of {txn} ({}); the next scan removes it",
                f.error
            );
        }
    }

    fn commit_transactional(
        &mut self,
        handle: &TransactionHandle,
    ) -> Result<CommitStatus, DestinationError> {
        let txn = &handle.transaction;
        if mode_switch::written_idempotent(handle) {
            // Its rows are in the table already: a configuration to fix,
            // not a loss to report.
            return Ok(CommitStatus::Refused {
                reason: self.idempotent_handle_evidence(),
            });
        }
        let gid = gid_literal(txn).map_err(|m| self.err(DestinationErrorKind::Corrupt, m))?;
        let after_commit = self.prepared_sql().after_commit.clone();
        match self.control.run("COMMIT PREPARED", |c| {
            Ok(c.batch_execute(&format!("COMMIT PREPARED {gid}"))?)
        }) {
            Ok(()) => {
                if let Err(f) = self.control.run("cleaning up after the commit", |c| {
                    Ok(c.execute(&after_commit, &[&txn.as_str()])?)
                }) {
                    log::warn!(
                        "committed {txn}, but removing its handle row failed ({}); the next \
                         scan removes it",
                        f.error
                    );
                }
                Ok(CommitStatus::Committed)
            }
            Err(f) if f.is(UNDEFINED_OBJECT) => self.resolve_not_prepared(handle, &gid),
            Err(f) if f.is(INSUFFICIENT_PRIVILEGE) => {
                match self.refusal(f, txn, "COMMIT PREPARED") {
                    Refusal::Gone => self.resolve_not_prepared(handle, &gid),
                    Refusal::Stays(e) => Err(e),
                }
            }
            Err(f) => Err(self.err(
                f.error.kind,
                format!(
                    "{}; the outcome of the commit is unknown until it is retried by id",
                    f.error.message
                ),
            )),
        }
    }

    /// `COMMIT PREPARED` said 42704: committed earlier, or lost.
    fn resolve_not_prepared(
        &mut self,
        handle: &TransactionHandle,
        gid: &str,
    ) -> Result<CommitStatus, DestinationError> {
        let txn = handle.transaction.as_str();
        let sql = self.prepared_sql();
        let (find_record, find_tombstone, find_side, after_commit) = (
            sql.find_record.clone(),
            sql.find_tombstone.clone(),
            sql.find_side.clone(),
            sql.after_commit.clone(),
        );
        let (record, tombstone, side) = self.control.run("looking up the commit record", |c| {
            let record = c.query_opt(&find_record, &[&txn])?;
            let tombstone = c.query_opt(&find_tombstone, &[&txn])?;
            let side = c.query_opt(&find_side, &[&txn])?;
            Ok((
                record.is_some(),
                tombstone.map(|r| r.get::<_, String>(0)),
                side.is_some(),
            ))
        })?;
        // Not loose: it may be folded into a history segment by now (looked
        // up after the loose record, see the history module).
        let checkpoint = handle.prepared().map(|p| p.checkpoint);
        let folded = match (record, checkpoint) {
            (false, Some(cp)) => self.folded(&handle.transaction, cp)?,
            _ => None,
        };
        if record || folded.is_some() {
            // An earlier commit landed (its response was lost). Finish its
            // cleanup.
            let _ = self.control.run("cleaning up after the commit", |c| {
                Ok(c.execute(&after_commit, &[&txn])?)
            });
            return Ok(CommitStatus::AlreadyCommitted);
        }
        if tombstone.is_none() && !side && self.unmarked_idempotent(handle)? {
            return Ok(CommitStatus::Committed);
        }
        let records = &format!(
            "{} (nor any segment of {} covering checkpoint {})",
            self.control_tables.commit_records,
            self.control_tables.segments,
            checkpoint.map_or("?".to_string(), |c| c.to_string())
        );
        let evidence = match tombstone {
            Some(at) => format!(
                "it EXPIRED: twopc's retention cleanup rolled it back (ROLLBACK PREPARED) at {at} \
                 because it was older than the retention limit (tombstone row in {}); COMMIT \
                 PREPARED {gid} answered SQLSTATE 42704 and {records} has no commit record for it",
                self.control_tables.expired
            ),
            None => format!(
                "PostgreSQL holds no prepared transaction {gid} (COMMIT PREPARED answered \
                 SQLSTATE 42704, checked against pg_prepared_xacts) and {records} has no commit \
                 record for it, so it never committed: it was rolled back outside twopc \
                 (ROLLBACK PREPARED by an administrator or another tool) or the server lost it \
                 (data directory restored or replaced){}",
                if side {
                    format!(
                        "; its handle row in {} shows it had been prepared",
                        self.control_tables.prepared
                    )
                } else if self.txn_sql().is_some() {
                    mode_switch::UNMARKED_NOTE.to_string()
                } else {
                    // Idempotent mode gets here only through such a note.
                    format!(
                        "; {} notes that it was found LOST before",
                        self.control_tables.lost
                    )
                }
            ),
        };
        Ok(CommitStatus::Missing { evidence })
    }

    fn abort_transactional(
        &mut self,
        txn: &TransactionId,
    ) -> Result<AbortStatus, DestinationError> {
        let was_open = self.open.as_ref().is_some_and(|o| &o.id == txn);
        if was_open {
            self.rollback_open();
        }
        // Also for the open one: if an earlier PREPARE's response was lost,
        // it may be prepared.
        let gid = gid_literal(txn).map_err(|m| self.err(DestinationErrorKind::Corrupt, m))?;
        let sql = self.prepared_sql();
        let (delete_side, find_record) = (sql.delete_side.clone(), sql.find_record.clone());
        match self.control.run("ROLLBACK PREPARED", |c| {
            Ok(c.batch_execute(&format!("ROLLBACK PREPARED {gid}"))?)
        }) {
            Ok(()) => {
                self.delete_side_best_effort(&delete_side, txn);
                Ok(AbortStatus::Aborted)
            }
            Err(f) if f.is(UNDEFINED_OBJECT) => {
                self.abort_not_prepared(txn, was_open, &find_record, &delete_side)
            }
            Err(f) => match self.refusal(f, txn, "ROLLBACK PREPARED") {
                Refusal::Gone => self.abort_not_prepared(txn, was_open, &find_record, &delete_side),
                Refusal::Stays(e) => Err(e),
            },
        }
    }

    /// The answer to an abort of a transaction PostgreSQL does not hold
    /// (42704, or finished by its owner meanwhile). Loose records only: the
    /// id names no checkpoint to find a history segment by. A folded
    /// transaction answers NotFound rather than WasCommitted; nothing is
    /// removed either way (see the history module).
    fn abort_not_prepared(
        &mut self,
        txn: &TransactionId,
        was_open: bool,
        find_record: &str,
        delete_side: &str,
    ) -> Result<AbortStatus, DestinationError> {
        let run = self.control.run("looking up the commit record", |c| {
            let mut t = c.transaction()?;
            // The handle row may be locked by a PREPARE still under way on
            // the server (its session was cut off, and 42704 came because
            // it was not prepared yet): the DELETE would wait until that
            // transaction is decided, which nothing does while this task
            // waits (found by review). Bounded, the abort fails, and the
            // next start aborts the transaction once it is prepared.
            t.batch_execute(HANDLE_ROW_LOCK_TIMEOUT)?;
            let committed = t.query_opt(find_record, &[&txn.as_str()])?.is_some();
            let removed = t.execute(delete_side, &[&txn.as_str()])?;
            t.commit()?;
            Ok((committed, removed))
        });
        let (committed, _) = match run {
            Ok(done) => done,
            Err(f) if lock_wait::timed_out(&f) => {
                return Err(self.err(
                    DestinationErrorKind::Io,
                    format!(
                        "the handle row of {txn} stayed locked by another transaction (most \
                         likely its own PREPARE, still under way on the server after its \
                         session was cut off): not aborted now; it stays invisible, and the \
                         next start aborts it once PostgreSQL lists it as prepared ({})",
                        f.error
                    ),
                ))
            }
            Err(f) => return Err(f.into()),
        };
        Ok(if committed {
            AbortStatus::WasCommitted
        } else if was_open {
            AbortStatus::Aborted
        } else {
            AbortStatus::NotFound
        })
    }

    /// The sink's prepared transactions, with their handles; with
    /// `clean_stale`, also removes the handle rows of transactions no
    /// longer prepared (see the module docs).
    fn staged_prepared(
        &mut self,
        clean_stale: bool,
    ) -> Result<Vec<StagedTransaction>, DestinationError> {
        let sql = self.prepared_sql();
        let (staged, clean) = (sql.staged.clone(), sql.clean_side.clone());
        let prefix = format!("{}.", self.sink);
        let sink = self.sink.as_str().to_string();
        let rows = self.control.run("listing prepared transactions", |c| {
            Ok(c.query(&staged, &[&prefix])?)
        })?;
        let cleaned = match clean_stale {
            true => self.control.run("removing stale handle rows", |c| {
                Ok(c.execute(&clean, &[&sink])?)
            }),
            false => Ok(0),
        };
        match cleaned {
            Ok(n) if n > 0 => {
                log::debug!("removed {n} handle rows of transactions no longer prepared")
            }
            Ok(_) => {}
            Err(f) => log::warn!(
                "removing stale handle rows failed ({}); retried at the next scan",
                f.error
            ),
        }
        let mut out = Vec::new();
        for row in rows {
            let gid: String = row.get(0);
            let prepared_ms: i64 = row.get(1);
            let handle: Option<Vec<u8>> = row.get(2);
            // The owner is NULL when the role that prepared it was dropped.
            let owner: Option<String> = row.get(3);
            let ours = row.get::<_, Option<bool>>(4).unwrap_or(false);
            let Some(parsed) = TransactionId::parse(&gid).filter(|p| p.sink == self.sink) else {
                log::warn!(
                    "ignoring prepared transaction {gid:?}: its name starts like sink '{}' but \
                     is not one of its transaction ids",
                    self.sink
                );
                continue;
            };
            if !ours {
                // Listed all the same: a transaction of this sink that
                // another role prepared (the job's credentials changed,
                // or an operator's tool connects as someone else) must
                // not look absent to a fresh start's check, to recovery
                // or to `twopc decide`. PostgreSQL lets only that role or
                // a superuser finish it, and says so if this one tries.
                match &owner {
                    Some(owner) => log::warn!(
                        "prepared transaction {gid} of sink '{}' was prepared by role {owner:?}, \
                         not by this connection's role: only {owner:?} or a superuser can commit \
                         or abort it. Connect as {owner:?} (or a superuser) to resolve it",
                        self.sink
                    ),
                    None => log::warn!(
                        "prepared transaction {gid} of sink '{}' was prepared by a role since \
                         dropped: only a superuser can commit or abort it. Connect as a superuser \
                         to resolve it",
                        self.sink
                    ),
                }
            }
            let last_activity_ms = prepared_ms.max(0) as u64;
            let decoded = handle.as_deref().map(TransactionHandle::decode);
            let state = match decoded {
                Some(Ok(h)) if h.transaction == parsed.id && h.prepared().is_some() => {
                    StagedState::Prepared(h)
                }
                other => {
                    let why = match other {
                        None => "has no handle row".to_string(),
                        Some(Err(e)) => format!("has an unreadable handle row ({e})"),
                        Some(Ok(h)) => format!("has a handle row for {}", h.transaction),
                    };
                    let reason = format!(
                        "prepared transaction {gid} of sink '{}' {why} in {}, so its run and \
                         checkpoint are unknown. If its output is wanted, COMMIT PREPARED \
                         '{gid}'; if not, ROLLBACK PREPARED '{gid}'",
                        self.sink, self.control_tables.prepared
                    );
                    log::warn!("{reason}");
                    StagedState::PreparedUnreadable { reason }
                }
            };
            out.push(StagedTransaction {
                transaction: parsed.id,
                subtask: parsed.subtask,
                attempt_nonce: parsed.attempt_nonce,
                state,
                last_activity_ms,
            });
        }
        Ok(out)
    }

    fn committed_after_transactional(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommittedTransaction>, DestinationError> {
        let sql = self
            .txn_sql()
            .expect("transactional")
            .committed_after
            .clone();
        let sink = self.sink.as_str().to_string();
        let after = to_i64(checkpoint, "checkpoint id")?;
        let rows = self.control.run("reading commit records", |c| {
            Ok(c.query(&sql, &[&sink, &(lineage.0 as i64), &after])?)
        })?;
        let mut out = Vec::new();
        for row in &rows {
            let record = history::record_of(row, &self.control_tables.commit_records)
                .map_err(|m| self.err(DestinationErrorKind::Corrupt, m))?;
            out.push(record);
        }
        self.add_folded_after(lineage, checkpoint, &mut out)?;
        out.sort_by(|a, b| (a.checkpoint, &a.transaction).cmp(&(b.checkpoint, &b.transaction)));
        Ok(out)
    }

    fn retract_transactional(
        &mut self,
        committed: &CommittedTransaction,
    ) -> Result<(), DestinationError> {
        let sql = self.txn_sql().expect("transactional");
        let (delete_record, find_record) = (sql.delete_record.clone(), sql.find_record.clone());
        let txn = committed.transaction.as_str();
        let retract_rows = match (sql.retract_rows.clone(), self.records_only) {
            (_, true) => None,
            (Some(r), false) => Some(r),
            (None, false) => {
                return Err(self.cannot_retract(committed, &find_record)?);
            }
        };
        let (removed, record) =
            self.retract_record(committed, retract_rows.as_deref(), &delete_record)?;
        let record = match record {
            history::RecordRemoved::Loose => "its commit record".to_string(),
            history::RecordRemoved::Folded { id, emptied } => format!(
                "its commit record from the history segment with id {id} in {}{}",
                self.control_tables.segments,
                if emptied {
                    ", which it was the last of (the segment row went too)"
                } else {
                    ""
                }
            ),
            history::RecordRemoved::Nothing => "no commit record (gone already)".to_string(),
        };
        log::info!(
            "retracted transaction {txn}: removed {removed} rows from {}{} and {record}",
            self.table,
            if retract_rows.is_none() {
                " (its rows were deleted by hand)"
            } else {
                ""
            }
        );
        Ok(())
    }

    /// Why a transaction cannot be retracted without a transaction-id
    /// column, and how to do it by hand (see `retract_transactional`).
    fn cannot_retract(
        &mut self,
        committed: &CommittedTransaction,
        find_record: &str,
    ) -> Result<DestinationError, DestinationError> {
        let txn = committed.transaction.as_str();
        // Where its commit record is decides what "remove it" means.
        let loose = self.control.run("looking up the commit record", |c| {
            Ok(c.query_opt(find_record, &[&txn])?.is_some())
        })?;
        let folded = if loose {
            None
        } else {
            self.folded(&committed.transaction, committed.checkpoint)?
        };
        let record = match folded {
            None => format!(
                "remove its commit record with DELETE FROM {} WHERE transaction_id = {}; and \
                 start again",
                self.control_tables.commit_records,
                quote_literal(txn)
            ),
            Some(f) => format!(
                "remove its commit record: it is folded into the history segment with id {} \
                 in {} (lineage {}, checkpoints {} to {}), which only twopc rewrites, so add \
                 a text column to {} (ALTER TABLE {} ADD COLUMN twopc_txn text), set \
                 transaction_id_column to it and start again: REPLACE_RANGE then removes the \
                 record (this transaction's rows are gone already)",
                f.segment_id,
                self.control_tables.segments,
                f.lineage,
                f.first,
                f.last,
                self.table,
                self.table
            ),
        };
        Ok(self.err(
            DestinationErrorKind::Rejected,
            format!(
                "cannot retract transaction {txn} (checkpoint {}, {} rows in {}): the table \
                 has no transaction-id column configured, so its rows cannot be told apart \
                 from other rows. Reconcile by hand: delete the rows this transaction wrote \
                 from {} (e.g. by a business key or time range), then {record}. Or set \
                 transaction_id_column to a text column the sink fills, so that \
                 REPLACE_RANGE can do this itself",
                committed.checkpoint, committed.records, self.table, self.table,
            ),
        ))
    }

    fn expire_transactional(
        &mut self,
        txn: &TransactionId,
        now_ms: u64,
    ) -> Result<(), DestinationError> {
        if self.open.as_ref().is_some_and(|o| &o.id == txn) {
            self.rollback_open();
        }
        let gid = gid_literal(txn).map_err(|m| self.err(DestinationErrorKind::Corrupt, m))?;
        let sql = self.prepared_sql();
        let (tomb, untomb, delete_side) = (
            sql.insert_tombstone.clone(),
            sql.delete_tombstone.clone(),
            sql.delete_side.clone(),
        );
        let sink = self.sink.as_str().to_string();
        let now = to_i64(now_ms, "time")?;
        // Tombstone first: if the rollback then happens and anything after
        // it fails, a later commit still says "expired", not "rolled back
        // outside twopc".
        // Whether this call wrote the record (an earlier expiry may have).
        let recorded = self.control.run("recording the expiry", |c| {
            Ok(c.execute(&tomb, &[&txn.as_str(), &sink, &now])? == 1)
        })?;
        match self.control.run("ROLLBACK PREPARED (expiry)", |c| {
            Ok(c.batch_execute(&format!("ROLLBACK PREPARED {gid}"))?)
        }) {
            Ok(()) => {}
            Err(f) if f.is(UNDEFINED_OBJECT) => {}
            Err(f) if f.is(INSUFFICIENT_PRIVILEGE) => {
                // Refused for certain (another role prepared it): it stays
                // prepared, so the record this call wrote goes, or a
                // rollback by its owner would later read as this sink's
                // expiry. One written by another expiry is left to it.
                let removed = if recorded {
                    self.control
                        .run("removing the refused expiry's record", |c| {
                            Ok(c.execute(&untomb, &[&txn.as_str()])?)
                        })
                } else {
                    Ok(0)
                };
                if let Err(e) = removed {
                    log::warn!(
                        "twopc sink '{sink}': the expiry of {txn} was refused and its record in \
                         the expiry table could not be removed ({}); should its owner roll it \
                         back, a commit of it will say it expired",
                        e.error
                    );
                }
                match self.refusal(f, txn, "ROLLBACK PREPARED (expiry)") {
                    // Its owner finished it: nothing is left to expire.
                    Refusal::Gone => {}
                    Refusal::Stays(e) => return Err(e),
                }
            }
            Err(f) => return Err(f.error),
        }
        self.delete_side_best_effort(&delete_side, txn);
        Ok(())
    }

    // ---- idempotent mode ----------------------------------------------

    fn write_idempotent(&mut self, batch: RecordBatch<'_>) -> Result<(), DestinationError> {
        if !self.upsert_until_prepare && self.copy_into_target(batch)? {
            return Ok(());
        }
        self.upsert_batch(batch)
    }

    /// The fast path of idempotent mode: the batch copied straight into
    /// the target in a transaction of its own. `Ok(false)` when the server
    /// refused it (a key already there, or anything the upsert path then
    /// meets again and names); nothing of the batch stays then.
    fn copy_into_target(&mut self, batch: RecordBatch<'_>) -> Result<bool, DestinationError> {
        let ModeSql::Idempotent(sql, _) = &self.sql else {
            unreachable!("idempotent mode")
        };
        let Some(copy) = sql.copy_target.clone() else {
            return Ok(false);
        };
        let records = batch.len();
        self.ensure_owner()?;
        let result = self.writer.run("copying a batch", |c| {
            c.batch_execute("BEGIN")?;
            let loaded = copy_batch(c, &copy, batch)?;
            if loaded != records {
                c.batch_execute("ROLLBACK")?;
                return Ok(Some(loaded));
            }
            c.batch_execute("COMMIT")?;
            Ok(None)
        });
        match result {
            Ok(None) => Ok(true),
            Ok(Some(loaded)) => {
                // Rolled back. The table took another number of rows than
                // it was given (a trigger that drops or adds rows): the
                // upsert is what such a table gets, now and from now on.
                log::warn!(
                    "{}: COPY straight into {} loaded {loaded} rows from {records} records (a \
                     trigger?); this sink upserts every batch from now on",
                    self.sink,
                    self.table
                );
                if let ModeSql::Idempotent(sql, _) = &mut self.sql {
                    sql.copy_target = None;
                }
                Ok(false)
            }
            // The outcome of a COMMIT whose answer was lost is unknown: the
            // job fails and replays the batch, which the upsert then
            // rewrites, as for any lost batch of this mode.
            Err(f) if f.lost => Err(f.error),
            // The upsert would wait for the same lock again.
            Err(mut f) if lock_wait::timed_out(&f) => {
                let _ = self
                    .writer
                    .run("rolling back", |c| Ok(c.batch_execute("ROLLBACK")?));
                self.name_lock_holders(&mut f);
                Err(f.error)
            }
            Err(f) => {
                log::debug!(
                    "{}: a batch of {records} records could not be copied straight into {} \
                     ({}); upserting it and the rest of this checkpoint's batches",
                    self.sink,
                    self.table,
                    f.error
                );
                let _ = self
                    .writer
                    .run("rolling back", |c| Ok(c.batch_execute("ROLLBACK")?));
                self.upsert_until_prepare = true;
                Ok(false)
            }
        }
    }

    /// The batch upserted through the staging table (see
    /// [`crate::idempotent`]).
    fn upsert_batch(&mut self, batch: RecordBatch<'_>) -> Result<(), DestinationError> {
        let ModeSql::Idempotent(sql, _) = &self.sql else {
            unreachable!("idempotent mode")
        };
        let stage_ready =
            self.stage_generation == Some(self.writer.generation()) && self.writer.is_connected();
        let (create, copy, delete, upsert) = (
            sql.create_stage.clone(),
            sql.copy_stage.clone(),
            sql.delete.clone(),
            sql.upsert.clone(),
        );
        let records = batch.len();
        self.ensure_owner()?;
        // Which statement failed: a data error of the upsert names no row,
        // so it is looked for separately.
        let mut upserting = false;
        // One short transaction per batch: the batch becomes visible whole
        // or not at all.
        let result = self.writer.run("upserting a batch", |c| {
            c.batch_execute("BEGIN")?;
            if !stage_ready {
                c.batch_execute(&create)?;
            }
            let loaded = copy_batch(c, &copy, batch)?;
            if loaded != records {
                c.batch_execute("ROLLBACK")?;
                return Ok(Some(loaded));
            }
            upserting = true;
            if let Some(delete) = &delete {
                c.execute(delete, &[])?;
            }
            c.execute(&upsert, &[])?;
            c.batch_execute("COMMIT")?;
            Ok(None)
        });
        match result {
            Ok(None) => {
                self.stage_generation = Some(self.writer.generation());
                Ok(())
            }
            Ok(Some(loaded)) => Err(self.rows_mismatch(loaded, records)),
            Err(mut f) => {
                if !f.lost {
                    let _ = self
                        .writer
                        .run("rolling back", |c| Ok(c.batch_execute("ROLLBACK")?));
                }
                match self.idempotent_row_fault(&f, batch, upserting) {
                    Some(fault) => Err(DestinationError::record(fault)),
                    None => {
                        self.name_lock_holders(&mut f);
                        Err(f.error)
                    }
                }
            }
        }
    }

    /// The fault of the record behind a failed batch upsert, when the server
    /// refused a row for its data: named by the staging COPY's line, or
    /// looked for when the upsert refused it (see [`crate::idempotent`]).
    fn idempotent_row_fault(
        &mut self,
        f: &Failure,
        batch: RecordBatch<'_>,
        upserting: bool,
    ) -> Option<RecordFault> {
        // Earlier batches of the transaction committed on their own.
        const NOTE: &str = ". Idempotent mode: the batches written before this one are upserted \
                            and stay; this batch was rolled back";
        let server = f.server.as_deref()?;
        if !upserting {
            let row = error::refused_row(server, STAGE_TABLE, &self.stage_columns())?;
            // One COPY per batch.
            let mut lines = LineMap::default();
            for (i, record) in batch.iter().enumerate() {
                lines.push(i as u64, record, self.options.copy_format);
            }
            let index = lines.record_of(row.line)?;
            let record = batch.iter().nth(index as usize);
            return Some(server_fault(
                server,
                row,
                RecordPosition::InBatch(index),
                record,
                &[],
                NOTE,
            ));
        }
        if !error::is_data_error(&server.sqlstate) {
            return None;
        }
        match self.locate_upsert_fault(batch) {
            Ok(Some(Located::Unnamed)) => Some(unnamed_record(
                server,
                "by a check over several rows of the batch (a foreign key, a unique key or \
                 DEFERRABLE constraint checked at the end of a statement or transaction, a \
                 trigger) for which no single record could be named",
                NOTE,
            )),
            Ok(Some(Located::At(index, found))) => Some(RecordFault {
                position: RecordPosition::InBatch(index),
                column: found.column.clone(),
                reason: format!("PostgreSQL: {}{NOTE}", found.text),
                preview: batch
                    .iter()
                    .nth(index as usize)
                    .map(preview)
                    .unwrap_or_default(),
            }),
            Ok(None) => {
                // No single record fails on its own (a concurrent writer may
                // have changed what the batch conflicted with): a retry can
                // pass, so the error stays retryable.
                log::warn!(
                    "the upsert of a batch into {} failed ({}), but no record of it fails on its \
                     own; treating the error as one a restart may resolve",
                    self.table,
                    server.text
                );
                None
            }
            Err(e) => {
                log::warn!(
                    "could not find which record of a batch {} refused: {}",
                    self.table,
                    e.error
                );
                None
            }
        }
    }

    /// Stages `batch` again in transactions that are rolled back, and finds
    /// the record the upsert refuses for its data: its position in the
    /// batch and the server's error (see [`locate_in_batch`]).
    fn locate_upsert_fault(&mut self, batch: RecordBatch<'_>) -> Result<Option<Located>, Failure> {
        let ModeSql::Idempotent(sql, _) = &self.sql else {
            unreachable!("idempotent mode")
        };
        let statements = LocateSql {
            table: self.table.quoted(),
            create: sql.create_stage.clone(),
            copy: sql.copy_stage.clone(),
            last_rows: sql.last_rows.clone(),
            delete_some: sql.delete_some.clone(),
            upsert_some: sql.upsert_some.clone(),
        };
        let secrets = self.secrets.clone();
        let result = self
            .writer
            .run("finding the record the upsert refused", |c| {
                locate_in_batch(c, &statements, batch, &secrets)
            });
        if let Err(f) = &result {
            if !f.lost {
                let _ = self
                    .writer
                    .run("rolling back", |c| Ok(c.batch_execute("ROLLBACK")?));
            }
        }
        result
    }
}

/// What the search for the record a batch upsert refused found.
enum Located {
    /// The record at this position of the batch, and the server's error.
    At(u64, ServerError),
    /// The batch fails a check over several of its rows (a foreign key, a
    /// deferred check), and no single record can be named for it: the
    /// batch's own error says what failed.
    Unnamed,
}

/// The statements of idempotent mode a search for a refused record runs.
struct LocateSql {
    /// The target table, quoted, as `regclass` reads it.
    table: String,
    create: String,
    copy: String,
    last_rows: String,
    delete_some: Option<String>,
    upsert_some: String,
}

impl LocateSql {
    /// `BEGIN`, the batch staged again (the failed transaction took the
    /// staging table it created with it), and its rows to apply: (arrival
    /// order, position in the batch), sorted by arrival.
    fn stage(&self, c: &mut Client, batch: RecordBatch<'_>) -> Result<Vec<(i64, i64)>, CallError> {
        c.batch_execute("BEGIN")?;
        c.batch_execute(&self.create)?;
        copy_batch(c, &self.copy, batch)?;
        let mut rows: Vec<(i64, i64)> = c
            .query(&self.last_rows, &[])?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        rows.sort_unstable();
        Ok(rows)
    }

    /// Applies the rows of arrival order `part`, as the upsert would.
    fn apply(&self, c: &mut Client, part: &[i64]) -> Result<(), postgres::Error> {
        if let Some(delete) = &self.delete_some {
            c.execute(delete, &[&part])?;
        }
        c.execute(&self.upsert_some, &[&part])?;
        Ok(())
    }
}

/// The record of `batch` the upsert refuses, each pass in a transaction
/// rolled back at its end:
/// 1. With the table's checks as declared, [`bisect_upsert`] finds a record
///    refused by a statement. A check of the row alone (see
///    [`about_its_own_row`]) names it, and so does a unique or exclusion
///    constraint checked row by row ([`checked_row_by_row`]). Any other
///    does not by itself: the upsert applies the batch as one statement, so
///    a row may refer to one later in the batch (a foreign key), or swap a
///    unique value with one (a key checked at the end of the statement),
///    which a part without that row fails (found by review); such a
///    candidate must pass the check of 3, after the whole batch was seen to
///    fail still.
/// 2. When every part passed, the checks the table defers to COMMIT (a
///    `DEFERRABLE` foreign key, a constraint trigger) failed the batch:
///    `SET CONSTRAINTS ALL IMMEDIATE` confirms it. Bisecting again with
///    every check immediate gives a candidate, with the same caveat.
/// 3. A candidate is the record only if the batch without it passes every
///    check; otherwise no single record is named ([`Located::Unnamed`]).
///
/// Whenever the whole batch passes now (pass 1's confirmation, or again
/// when pass 2 finds nothing), a concurrent writer changed what it met:
/// `None`, the error stays retryable and a restart may pass. Without 2 and
/// 3 no part ever failed a deferred check, the error stayed retryable and
/// the job restarted forever (found by review).
fn locate_in_batch(
    c: &mut Client,
    sql: &LocateSql,
    batch: RecordBatch<'_>,
    secrets: &Secrets,
) -> Result<Option<Located>, CallError> {
    let rows = sql.stage(c, batch)?;
    let found = bisect_upsert(c, sql, &rows, secrets)?;
    c.batch_execute("ROLLBACK")?;
    let (index, e) = match found {
        Some((index, e)) if about_its_own_row(&e) || checked_row_by_row(c, sql, &e) => {
            return Ok(Some(Located::At(index, e)))
        }
        Some(candidate) => {
            if passes_without(c, sql, batch, None, secrets)?.is_ok() {
                return Ok(None);
            }
            candidate
        }
        None => {
            if passes_without(c, sql, batch, None, secrets)?.is_ok() {
                return Ok(None);
            }
            let rows = sql.stage(c, batch)?;
            c.batch_execute("SET CONSTRAINTS ALL IMMEDIATE")?;
            let candidate = bisect_upsert(c, sql, &rows, secrets)?;
            c.batch_execute("ROLLBACK")?;
            match candidate {
                Some(candidate) => candidate,
                None => {
                    // Every part passes with every check immediate: the
                    // batch may pass as a whole now too.
                    return Ok(passes_without(c, sql, batch, None, secrets)?
                        .err()
                        .map(|_| Located::Unnamed));
                }
            }
        }
    };
    Ok(Some(
        match passes_without(c, sql, batch, Some(index), secrets)? {
            Ok(()) => Located::At(index, e),
            Err(_) => Located::Unnamed,
        },
    ))
}

/// Whether an error the bisection met judges its row alone, whatever
/// else the batch holds: a value the type refuses (class 22), a NOT NULL
/// or CHECK constraint of the table (23502, 23514, raised by no trigger:
/// no context). Anything else may depend on other rows of the batch (a
/// foreign key, a unique key or exclusion constraint checked at the end of
/// a statement, a trigger), and a part of the batch can fail it where the
/// whole passes (found by review).
fn about_its_own_row(e: &ServerError) -> bool {
    e.context.is_none()
        && (e.sqlstate.starts_with("22") || matches!(e.sqlstate.as_str(), "23502" | "23514"))
}

/// Whether a unique or exclusion violation the bisection met comes from a
/// constraint PostgreSQL checks row by row: one of the target table itself
/// (a partition's, a rule's table's or an index's without a constraint are
/// not judged) that is not DEFERRABLE. The search then applies the rows as
/// the upsert does, in arrival order, so the row it stopped at is the one
/// the batch failed at, as the second of a pair. Not with an operation
/// field: the upsert deletes the batch's `D` keys before any upsert, the
/// search part by part, so a part can fail what the whole passes. A
/// DEFERRABLE constraint is checked at the end of a statement, where a part
/// of the batch can fail what the whole passes too. Anything not judged
/// here, or a lookup that fails, leaves the candidate to the check that the
/// batch without it passes (found by review).
fn checked_row_by_row(c: &mut Client, sql: &LocateSql, e: &ServerError) -> bool {
    let (true, None, Some(constraint), None) = (
        matches!(e.sqlstate.as_str(), "23505" | "23P01"),
        &e.context,
        &e.constraint,
        &sql.delete_some,
    ) else {
        return false;
    };
    let not_deferrable = c.query_opt(
        "SELECT NOT condeferrable FROM pg_catalog.pg_constraint \
         WHERE conrelid = $1::text::regclass AND conname::text = $2::text",
        &[&sql.table, constraint],
    );
    match not_deferrable {
        Ok(Some(row)) => row.get(0),
        Ok(None) => false,
        Err(err) => {
            log::debug!("could not look up constraint {constraint}: {err}");
            false
        }
    }
}

/// Whether the rows of `batch` other than the one at position `skip`
/// pass every check when applied as one statement, as the upsert applies
/// them, with every deferred check run at once: `Err` with the server's
/// data error when they do not. In a transaction rolled back at its end.
fn passes_without(
    c: &mut Client,
    sql: &LocateSql,
    batch: RecordBatch<'_>,
    skip: Option<u64>,
    secrets: &Secrets,
) -> Result<Result<(), ServerError>, CallError> {
    let rows = sql.stage(c, batch)?;
    let others: Vec<i64> = rows
        .iter()
        .filter(|r| skip.is_none() || u64::try_from(r.1).ok() != skip)
        .map(|r| r.0)
        .collect();
    let checked = sql
        .apply(c, &others)
        .and_then(|()| c.batch_execute("SET CONSTRAINTS ALL IMMEDIATE"));
    let outcome = match checked {
        Ok(()) => Ok(()),
        Err(e) => {
            match error::server_error(secrets, &e).filter(|s| error::is_data_error(&s.sqlstate)) {
                Some(s) => Err(s),
                None => return Err(e.into()),
            }
        }
    };
    c.batch_execute("ROLLBACK")?;
    Ok(outcome)
}

/// The first of `rows` ((arrival order, position in the batch), sorted by
/// arrival) that `delete_some` (when records carry an operation field) or
/// `upsert_some` refuses for its data once every row before it is in.
/// Bisects under a savepoint: a part that passes stays in, a part that
/// fails is rolled back and halved, so it takes about 2·log2(n) statements.
fn bisect_upsert(
    c: &mut Client,
    sql: &LocateSql,
    rows: &[(i64, i64)],
    secrets: &Secrets,
) -> Result<Option<(u64, ServerError)>, CallError> {
    let (mut lo, mut hi) = (0, rows.len());
    while lo < hi {
        let mid = if hi - lo == 1 { hi } else { lo + (hi - lo) / 2 };
        let part: Vec<i64> = rows[lo..mid].iter().map(|r| r.0).collect();
        c.batch_execute("SAVEPOINT twopc_probe")?;
        match sql.apply(c, &part) {
            Ok(_) => {
                c.batch_execute("RELEASE SAVEPOINT twopc_probe")?;
                lo = mid;
            }
            Err(e) => {
                let refused =
                    error::server_error(secrets, &e).filter(|s| error::is_data_error(&s.sqlstate));
                let Some(refused) = refused else {
                    return Err(e.into());
                };
                if mid - lo == 1 {
                    return Ok(Some((u64::try_from(rows[lo].1).unwrap_or(0), refused)));
                }
                c.batch_execute(
                    "ROLLBACK TO SAVEPOINT twopc_probe; RELEASE SAVEPOINT twopc_probe",
                )?;
                hi = mid;
            }
        }
    }
    Ok(None)
}

/// The records of a batch as COPY rows: each followed by `suffix` (if any)
/// and a line break.
fn copy_rows(batch: RecordBatch<'_>, suffix: Option<&[u8]>) -> Vec<u8> {
    let per_row = 1 + suffix.map_or(0, <[u8]>::len);
    let size = batch.payload_bytes() as usize + batch.len() as usize * per_row;
    let mut rows = Vec::with_capacity(size);
    for record in batch.iter() {
        rows.extend_from_slice(record);
        if let Some(s) = suffix {
            rows.extend_from_slice(s);
        }
        rows.push(b'\n');
    }
    rows
}

/// Loads a batch with one COPY of its own; returns the rows the server
/// loaded.
fn copy_batch(client: &mut Client, sql: &str, batch: RecordBatch<'_>) -> Result<u64, CallError> {
    let mut w = client.copy_in(sql)?;
    w.write_all(&copy_rows(batch, None))?;
    Ok(w.finish()?)
}

/// The fault of a data error that names no row of the COPY: raised by a
/// check PostgreSQL makes once the rows are in (a foreign key's at the end
/// of the COPY, a `DEFERRABLE` constraint's or a constraint trigger's at
/// PREPARE TRANSACTION). The same rows meet the same check at every
/// replay, so left retryable it restarted the job forever (found by
/// review). The server's detail may name the values (`Key (parent)=(5) is
/// not present in table ...`); which record held them is not known.
fn unnamed_fault(f: &Failure, checked: &str) -> Option<RecordFault> {
    let server = f.server.as_deref()?;
    if f.lost || !error::is_data_error(&server.sqlstate) {
        return None;
    }
    Some(unnamed_record(server, checked, ""))
}

/// A [`RecordPosition::Unknown`] fault of `server`'s error, raised as
/// `checked` says; `note` is added to the reason.
fn unnamed_record(server: &ServerError, checked: &str, note: &str) -> RecordFault {
    let context = match &server.context {
        Some(c) => format!(" (context: {})", c.replace('\n', "; ")),
        None => String::new(),
    };
    RecordFault {
        position: RecordPosition::Unknown,
        column: server.column.clone(),
        reason: format!(
            "PostgreSQL: {}{context}, raised {checked}; PostgreSQL names no row for such a \
             check. When the rows the records refer to are written elsewhere and arrive later, \
             restart from the latest checkpoint once they are there{note}",
            server.text
        ),
        preview: String::new(),
    }
}

/// The fault of the record behind a row the server refused. `record` is the
/// record when it is still at hand; otherwise the preview is what
/// PostgreSQL's context quotes, said as such (`suffix`, the transaction-id
/// field the sink appends to each row, is cut from a quoted line). `note`
/// is added to the reason.
fn server_fault(
    server: &ServerError,
    row: RefusedRow,
    position: RecordPosition,
    record: Option<&[u8]>,
    suffix: &[u8],
    note: &str,
) -> RecordFault {
    let shown = match (record, &row.quoted) {
        (Some(r), _) => preview(r),
        (None, Quoted::Value(v)) => format!(
            "{} (the value of column {} as PostgreSQL quotes it; the record itself is no longer \
             held)",
            preview(v.as_bytes()),
            row.column.as_deref().unwrap_or("?")
        ),
        (None, Quoted::Line(l)) => {
            let l = l.as_bytes();
            format!(
                "{} (as PostgreSQL quotes the row; the record itself is no longer held)",
                preview(l.strip_suffix(suffix).unwrap_or(l))
            )
        }
        (None, Quoted::Nothing) => "(not shown: the record is no longer held, and PostgreSQL \
                                    quoted none of it)"
            .to_string(),
    };
    RecordFault {
        position,
        column: row.column,
        reason: format!("PostgreSQL: {}{note}", server.text),
        preview: shown,
    }
}

fn to_i64(v: u64, what: &str) -> Result<i64, DestinationError> {
    i64::try_from(v).map_err(|_| {
        DestinationError::new(
            DestinationErrorKind::Corrupt,
            format!("{what} {v} does not fit PostgreSQL's bigint"),
        )
    })
}

impl TxnSql {
    fn new(
        table: &TableName,
        options: &PgOptions,
        ctl: &ControlTables,
        copy_options: &str,
    ) -> Self {
        let mut cols = options.columns.clone();
        if let Some(c) = &options.transaction_id_column {
            cols.push(c.clone());
        }
        let (cr, p, e) = (&ctl.commit_records, &ctl.prepared, &ctl.expired);
        TxnSql {
            copy_target: format!(
                "COPY {table} ({}) FROM STDIN{copy_options}",
                quoted_list(&cols)
            ),
            insert_side: format!(
                "INSERT INTO {p} (transaction_id, sink_id, handle, prepared_at) \
                 VALUES ($1, $2, $3, now()) \
                 ON CONFLICT (transaction_id) DO UPDATE \
                 SET handle = EXCLUDED.handle, prepared_at = EXCLUDED.prepared_at"
            ),
            // Inserts nothing when the side row is gone, which prepare
            // reports; see the module docs for why the row is locked.
            record_in_txn: format!(
                "WITH side AS (SELECT transaction_id FROM {p} WHERE transaction_id = $1::text \
                               FOR KEY SHARE) \
                 INSERT INTO {cr} (transaction_id, sink_id, subtask, lineage, checkpoint, \
                                   run_id, row_count, prepared_at) \
                 SELECT transaction_id, $2::text, $3::int4, $4::int8, $5::int8, $6::text, \
                        $7::int8, now() FROM side"
            ),
            after_commit: format!(
                "WITH gone AS (DELETE FROM {p} WHERE transaction_id = $1::text) \
                 UPDATE {cr} SET committed_at = now() \
                 WHERE transaction_id = $1::text AND committed_at IS NULL"
            ),
            delete_side: format!("DELETE FROM {p} WHERE transaction_id = $1"),
            find_record: format!("SELECT 1 FROM {cr} WHERE transaction_id = $1"),
            find_tombstone: format!("SELECT expired_at::text FROM {e} WHERE transaction_id = $1"),
            find_side: format!("SELECT 1 FROM {p} WHERE transaction_id = $1"),
            staged: format!(
                "SELECT x.gid, (extract(epoch FROM x.prepared) * 1000)::int8, s.handle, \
                        x.owner::text, x.owner = current_user \
                 FROM pg_prepared_xacts x LEFT JOIN {p} s ON s.transaction_id = x.gid \
                 WHERE left(x.gid, length($1::text)) = $1::text \
                   AND x.database = current_database() \
                 ORDER BY x.gid"
            ),
            clean_side: format!(
                "DELETE FROM {p} WHERE transaction_id IN ( \
                   SELECT s.transaction_id FROM {p} s \
                   WHERE s.sink_id = $1 \
                     AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts x \
                                     WHERE x.gid = s.transaction_id) \
                   FOR UPDATE SKIP LOCKED)"
            ),
            committed_after: format!(
                "SELECT {} FROM {cr} WHERE sink_id = $1 AND lineage = $2 AND checkpoint > $3",
                history::RECORD_COLUMNS
            ),
            insert_tombstone: format!(
                "INSERT INTO {e} (transaction_id, sink_id, expired_at) \
                 VALUES ($1, $2, to_timestamp($3::int8 / 1000.0)) \
                 ON CONFLICT (transaction_id) DO NOTHING"
            ),
            delete_tombstone: format!("DELETE FROM {e} WHERE transaction_id = $1"),
            delete_record: format!("DELETE FROM {cr} WHERE transaction_id = $1"),
            retract_rows: options
                .transaction_id_column
                .as_ref()
                .map(|c| format!("DELETE FROM {table} WHERE {} = $1", quote_ident(c))),
        }
    }
}

impl Destination for PgDestination {
    fn begin(&mut self, _handle: &TransactionHandle) -> Result<(), DestinationError> {
        // Lazy: a checkpoint interval without records costs no round trip.
        Ok(())
    }

    fn write(
        &mut self,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<(), DestinationError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.check_batch(batch)?;
        match self.sql {
            ModeSql::Transactional(_) => self.write_transactional(txn, batch),
            ModeSql::Idempotent(..) => self.write_idempotent(batch),
        }
    }

    fn prepare(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        match self.sql {
            ModeSql::Transactional(_) => self.prepare_transactional(handle),
            // Every write already committed: nothing is buffered. The next
            // checkpoint's batches try the COPY into the target again.
            ModeSql::Idempotent(..) => {
                self.upsert_until_prepare = false;
                Ok(())
            }
        }
    }

    fn prepared_location(
        &mut self,
        _txn: &TransactionId,
    ) -> Result<Option<Vec<u8>>, DestinationError> {
        // The handle says which mode wrote it (see the `mode_switch`
        // module); a transactional one is found by its id.
        Ok(match self.sql {
            ModeSql::Transactional(_) => None,
            ModeSql::Idempotent(..) => Some(mode_switch::IDEMPOTENT_HANDLE.to_vec()),
        })
    }

    fn commit(
        &mut self,
        handle: &TransactionHandle,
        _now_ms: u64,
    ) -> Result<CommitStatus, DestinationError> {
        self.ensure_operator_hold()?;
        match self.sql {
            ModeSql::Transactional(_) => self.commit_transactional(handle),
            ModeSql::Idempotent(..) => self.commit_idempotent(handle),
        }
    }

    fn abort(&mut self, txn: &TransactionId) -> Result<AbortStatus, DestinationError> {
        // In idempotent mode nothing of its own is staged (upserted rows
        // stay and a replay rewrites them), but a prepared transaction a
        // transactional run left is rolled back like the transactional
        // mode does; anything else answers NotFound.
        self.ensure_operator_hold()?;
        self.abort_transactional(txn)
    }

    fn staged(&mut self) -> Result<Vec<StagedTransaction>, DestinationError> {
        match self.sql {
            ModeSql::Transactional(_) => self.staged_prepared(!self.operator),
            // Only what a transactional run left. Stale handle rows are
            // kept: a commit of a handle whose transaction is gone reads
            // them as proof that it had been prepared (see `mode_switch`).
            ModeSql::Idempotent(..) => self.staged_prepared(false),
        }
    }

    fn committed_after(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommittedTransaction>, DestinationError> {
        match self.sql {
            ModeSql::Transactional(_) => self.committed_after_transactional(lineage, checkpoint),
            ModeSql::Idempotent(..) => Ok(Vec::new()),
        }
    }

    fn retract(&mut self, committed: &CommittedTransaction) -> Result<(), DestinationError> {
        self.ensure_operator_hold()?;
        match self.sql {
            ModeSql::Transactional(_) => self.retract_transactional(committed),
            ModeSql::Idempotent(..) => Ok(()),
        }
    }

    fn expire(&mut self, txn: &TransactionId, now_ms: u64) -> Result<(), DestinationError> {
        // In idempotent mode, the staged transactions are prepared ones a
        // transactional run left: they expire the same way.
        self.expire_transactional(txn, now_ms)
    }

    fn claim_ownership(&mut self, claim: &OwnerClaim) -> Result<Ownership, DestinationError> {
        let key = owner_lock_key(&self.sink, claim.subtask);
        // A holder that lets go between the try and the look at who holds
        // it: try again (a few times: the lock may change hands quickly).
        let mut tries = 0;
        while !self.try_lock_share("claiming ownership", key)? {
            tries += 1;
            match self.read_owner(claim.subtask)? {
                Some(holder) => return Ok(Ownership::HeldBy(holder)),
                None if tries < 3 => continue,
                None => {
                    return Ok(Ownership::HeldBy(OwnerInfo {
                        claim: None,
                        holder: format!(
                            "sessions that take and release the advisory lock of sink '{}' \
                             subtask {} over and over (a tool, or jobs with the same sink id)",
                            self.sink, claim.subtask
                        ),
                    }))
                }
            }
        }
        self.write_owner_row(claim)?;
        let share = OwnedShare {
            key,
            generation: self.writer.generation(),
            subtask: claim.subtask,
            claim: claim.clone(),
        };
        match &self.owner {
            // The subtask's own share is claimed first; others after it are
            // shares of an earlier parallelism it looks after.
            Some(own) if own.subtask != claim.subtask => {
                self.leftover_shares.retain(|s| s.subtask != claim.subtask);
                self.leftover_shares.push(share);
            }
            _ => self.owner = Some(share),
        }
        Ok(Ownership::Acquired)
    }

    /// See `PgDestination::confirm_share`.
    fn confirm_ownership(
        &mut self,
        claim: &OwnerClaim,
    ) -> Result<Option<Ownership>, DestinationError> {
        self.confirm_share(claim)
    }

    fn record_lost(&mut self, note: &LostNote) -> Result<(), DestinationError> {
        if !self.lost_table_exists()? {
            return Err(self.err(
                DestinationErrorKind::NotPermitted,
                format!(
                    "{} does not exist (the control tables predate it); create it as in the \
                     sink's DDL so that `twopc inspect` can show lost transactions",
                    self.control_tables.lost
                ),
            ));
        }
        let sql = format!(
            "INSERT INTO {} (transaction_id, sink_id, lineage, checkpoint, note) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (transaction_id) DO NOTHING",
            self.control_tables.lost
        );
        let (txn, sink) = (
            note.transaction.as_str().to_string(),
            self.sink.as_str().to_string(),
        );
        let (lineage, checkpoint) = (
            note.lineage.0 as i64,
            to_i64(note.checkpoint, "checkpoint id")?,
        );
        let text = note.render();
        self.control.run("recording a lost transaction", |c| {
            Ok(c.execute(&sql, &[&txn, &sink, &lineage, &checkpoint, &text])?)
        })?;
        Ok(())
    }

    fn lost_notes(&mut self) -> Result<Vec<LostNote>, DestinationError> {
        if !self.lost_table_exists()? {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT note FROM {} WHERE sink_id = $1 ORDER BY lineage, checkpoint, transaction_id",
            self.control_tables.lost
        );
        let sink = self.sink.as_str().to_string();
        let rows =
            self.control.run(
                "reading lost transactions",
                |c| Ok(c.query(&sql, &[&sink])?),
            )?;
        Ok(rows
            .iter()
            .filter_map(|r| LostNote::parse(&r.get::<_, String>(0)))
            .collect())
    }

    fn record_operation(&mut self, record: &OperationRecord) -> Result<(), DestinationError> {
        if !self.table_exists(&self.control_tables.operations.clone())? {
            // Created by the first change made by hand, when the user may.
            let ddl = self.control_tables.operations_ddl();
            let created = self.control.run("creating the operations log table", |c| {
                if let Err(e) = c.batch_execute(&ddl) {
                    let _ = c.batch_execute("ROLLBACK");
                    return Err(e.into());
                }
                Ok(())
            });
            if let Err(f) = created {
                return Err(self.err(
                    DestinationErrorKind::NotPermitted,
                    format!(
                        "{} does not exist and could not be created ({}); have it created (`{}`, \
                         with INSERT and SELECT for this user), or run the command as a user \
                         who may create it, then repeat the command",
                        self.control_tables.operations,
                        f.error,
                        self.control_tables
                            .operations_create()
                            .split_whitespace()
                            .collect::<Vec<_>>()
                            .join(" ")
                    ),
                ));
            }
        }
        let sql = format!(
            "INSERT INTO {} (sink_id, at_ms, record) VALUES ($1, $2, $3)",
            self.control_tables.operations
        );
        let sink = self.sink.as_str().to_string();
        let at = to_i64(record.at_ms, "time of the operation")?;
        let text = record.render();
        self.control.run("writing the operations log", |c| {
            Ok(c.execute(&sql, &[&sink, &at, &text])?)
        })?;
        Ok(())
    }

    fn operations(&mut self) -> Result<Vec<OperationRecord>, DestinationError> {
        if !self.table_exists(&self.control_tables.operations.clone())? {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT record FROM {} WHERE sink_id = $1 ORDER BY at_ms, id",
            self.control_tables.operations
        );
        let sink = self.sink.as_str().to_string();
        let rows = self.control.run("reading the operations log", |c| {
            Ok(c.query(&sql, &[&sink])?)
        })?;
        // A row that does not read as a record is shown as such, not dropped.
        Ok(rows
            .iter()
            .map(|r| {
                let text: String = r.get(0);
                OperationRecord::parse(&text).unwrap_or_else(|| OperationRecord {
                    at_ms: 0,
                    command: "unreadable".to_string(),
                    transaction: None,
                    what: format!(
                        "a row of {} that is not a record of twopc: {:?}",
                        self.control_tables.operations,
                        text.chars().take(80).collect::<String>()
                    ),
                    by: String::new(),
                })
            })
            .collect())
    }

    fn compact_history(&mut self, policy: &HistoryPolicy) -> Result<Compaction, DestinationError> {
        match self.sql {
            ModeSql::Transactional(_) => self.compact_transactional(policy),
            // Keeps no commit records: nothing to fold.
            ModeSql::Idempotent(..) => Ok(Compaction::default()),
        }
    }

    fn history_tallies(&mut self) -> Result<Vec<HistoryTally>, DestinationError> {
        match self.sql {
            ModeSql::Transactional(_) => self.tallies_transactional(),
            ModeSql::Idempotent(..) => Ok(Vec::new()),
        }
    }

    fn clear_lost(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<u64, DestinationError> {
        self.ensure_operator_hold()?;
        if !self.lost_table_exists()? {
            return Ok(0);
        }
        let sql = format!(
            "DELETE FROM {} WHERE sink_id = $1 AND lineage = $2 AND checkpoint > $3",
            self.control_tables.lost
        );
        let sink = self.sink.as_str().to_string();
        let (l, c) = (lineage.0 as i64, to_i64(checkpoint, "checkpoint id")?);
        self.control
            .run("removing notes of lost transactions", |cl| {
                Ok(cl.execute(&sql, &[&sink, &l, &c])?)
            })
            .map_err(DestinationError::from)
    }

    fn owner_subtasks(&mut self) -> Result<Vec<u32>, DestinationError> {
        let sql = format!(
            "SELECT subtask FROM {} WHERE sink_id = $1 ORDER BY subtask",
            self.control_tables.owners
        );
        let sink = self.sink.as_str().to_string();
        let rows =
            self.control.run(
                "listing the sink's owners",
                |c| Ok(c.query(&sql, &[&sink])?),
            )?;
        Ok(rows
            .iter()
            .map(|r| r.get::<_, i32>(0))
            .filter_map(|s| u32::try_from(s).ok())
            .collect())
    }

    fn lineages(&mut self) -> Result<Vec<LineageSummary>, DestinationError> {
        if self.txn_sql().is_none() {
            // Idempotent mode keeps no commit records: a replay rewrites
            // the same keys, so there is nothing a new run could duplicate.
            return Ok(Vec::new());
        }
        let record_sql = format!(
            "SELECT run_id, (extract(epoch FROM started_at) * 1000)::int8, appended \
             FROM {} WHERE sink_id = $1 AND lineage = $2",
            self.control_tables.lineages
        );
        let sink = self.sink.as_str().to_string();
        let mut out = Vec::new();
        for (lineage, count, last) in self.lineage_counts()? {
            let latest = self.transactions_at(LineageId(lineage as u64), last)?;
            let record = self.control.run("reading committed lineages", |c| {
                Ok(c.query_opt(&record_sql, &[&sink, &lineage])?)
            })?;
            let lineage = LineageId(lineage as u64);
            let record = record.and_then(|r| {
                Some(LineageRecord {
                    lineage,
                    run: RunId::new(r.get::<_, String>(0)).ok()?,
                    started_at_ms: r.get::<_, i64>(1).max(0) as u64,
                    appended: r.get(2),
                })
            });
            out.push(LineageSummary::from_latest(
                lineage,
                count.max(0) as u64,
                last.max(0) as u64,
                latest.iter().map(|c| (&c.transaction, &c.run)),
                record,
            ));
        }
        Ok(out)
    }

    fn record_lineage(&mut self, record: &LineageRecord) -> Result<(), DestinationError> {
        if self.txn_sql().is_none() {
            return Ok(());
        }
        let sql = format!(
            "INSERT INTO {} (sink_id, lineage, run_id, started_at, appended) \
             VALUES ($1, $2, $3, to_timestamp($4::float8 / 1000), $5) \
             ON CONFLICT (sink_id, lineage) DO NOTHING",
            self.control_tables.lineages
        );
        let (sink, lineage, run) = (
            self.sink.as_str().to_string(),
            record.lineage.0 as i64,
            record.run.as_str().to_string(),
        );
        let (at, appended) = (record.started_at_ms as f64, record.appended);
        self.control.run("recording the new lineage", |c| {
            Ok(c.execute(&sql, &[&sink, &lineage, &run, &at, &appended])?)
        })?;
        Ok(())
    }

    fn record_run_lineage(
        &mut self,
        run: &RunId,
        lineage: LineageId,
    ) -> Result<(), DestinationError> {
        let sql = format!(
            "INSERT INTO {} (sink_id, run_id, lineage) VALUES ($1, $2, $3) \
             ON CONFLICT (sink_id, run_id) DO NOTHING",
            self.control_tables.runs
        );
        let (sink, r, l) = (
            self.sink.as_str().to_string(),
            run.as_str().to_string(),
            lineage.0 as i64,
        );
        self.control.run("recording the run's lineage", |c| {
            Ok(c.execute(&sql, &[&sink, &r, &l])?)
        })?;
        match self.run_lineage(run)? {
            Some(found) if found == lineage => Ok(()),
            found => Err(self.err(
                DestinationErrorKind::Corrupt,
                format!(
                    "{} records lineage {found:?} for run {run}, but this run writes in lineage \
                     {lineage}",
                    self.control_tables.runs
                ),
            )),
        }
    }

    fn lineage_recorded(&mut self, lineage: LineageId) -> Result<Option<bool>, DestinationError> {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE sink_id = $1 AND lineage = $2) \
                 OR EXISTS (SELECT 1 FROM {} WHERE sink_id = $1 AND lineage = $2)",
            self.control_tables.lineages, self.control_tables.runs
        );
        let (sink, l) = (self.sink.as_str().to_string(), lineage.0 as i64);
        let row = self.control.run("looking up a lineage", |c| {
            Ok(c.query_one(&sql, &[&sink, &l])?)
        })?;
        Ok(Some(row.get::<_, bool>(0)))
    }

    fn run_lineage(&mut self, run: &RunId) -> Result<Option<LineageId>, DestinationError> {
        let sql = format!(
            "SELECT lineage FROM {} WHERE sink_id = $1 AND run_id = $2",
            self.control_tables.runs
        );
        let (sink, r) = (self.sink.as_str().to_string(), run.as_str().to_string());
        let row = self.control.run("reading the run's lineage", |c| {
            Ok(c.query_opt(&sql, &[&sink, &r])?)
        })?;
        Ok(row.map(|row| LineageId(row.get::<_, i64>(0) as u64)))
    }
}
