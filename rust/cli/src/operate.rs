//! `twopc reconcile` and `twopc decide`: the recovery plan carried out on a
//! directory or a PostgreSQL destination. The rules (what may be removed,
//! committed or aborted, and that no live run may own the sink meanwhile)
//! are the core's (`twopc_core::operator`); this module opens the
//! destination and prints what happened (`cli` parses the arguments).

use std::path::{Path, PathBuf};

use twopc_core::destination::Destination;
use twopc_core::operator::{self, Decided, Decision, OperatorError};
use twopc_core::{LineageId, RetryPolicy, SinkId, SystemClock, TransactionId, TwopcError};
use twopc_fs::{FsDestination, FsOptions, CONTROL_DIR};
use twopc_pg::{Endpoint, Password, PgDestination, PgOptions};

/// The environment variable the PostgreSQL password is read from unless
/// `--password-env` names another (libpq's own).
pub const DEFAULT_PASSWORD_ENV: &str = "PGPASSWORD";

pub const EXIT_OK: u8 = 0;
pub const EXIT_ATTENTION: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
/// Refused: a live run owns the sink, or the decision is not allowed.
pub const EXIT_REFUSED: u8 = 3;

/// Where the output is, and how to open it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Dir(PathBuf),
    Postgres(PgTarget),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTarget {
    pub url: String,
    pub table: Option<String>,
    pub transaction_id_column: Option<String>,
    pub control_schema: String,
    pub password_env: String,
}

impl Target {
    pub fn is_postgres(s: &str) -> bool {
        s.starts_with("postgres://") || s.starts_with("postgresql://")
    }
}

pub struct ReconcileArgs {
    pub target: Target,
    pub sink: SinkId,
    pub lineage: LineageId,
    pub after: u64,
    pub apply: bool,
}

pub struct DecideArgs {
    pub target: Target,
    pub sink: SinkId,
    pub decision: Decision,
    pub transaction: TransactionId,
}

pub fn parse_sink(v: &str) -> Result<SinkId, String> {
    SinkId::new(v).map_err(|e| format!("--sink: {e}"))
}

/// A lineage as twopc prints it: 16 hexadecimal digits.
pub fn parse_lineage(v: &str) -> Result<LineageId, String> {
    let t = v.trim();
    if t.is_empty() || t.len() > 16 || !t.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "--lineage takes a lineage as twopc prints it (up to 16 hexadecimal digits, e.g. \
             9c1e0f3a5b7d2e41), not {v:?}"
        ));
    }
    Ok(LineageId(u64::from_str_radix(t, 16).expect("checked")))
}

/// Why a command failed, with its exit code.
pub struct Failed {
    pub code: u8,
    pub message: String,
}

impl From<OperatorError> for Failed {
    fn from(e: OperatorError) -> Self {
        let code = match &e {
            OperatorError::Owned { .. } | OperatorError::Refused { .. } => EXIT_REFUSED,
            _ => EXIT_USAGE,
        };
        Failed {
            code,
            message: e.to_string(),
        }
    }
}

fn failed(message: impl Into<String>) -> Failed {
    Failed {
        code: EXIT_USAGE,
        message: message.into(),
    }
}

/// Opens the sink's destination without creating anything: a directory
/// must already hold the sink's control data.
pub fn open(
    target: &Target,
    sink: &SinkId,
    needs_table: bool,
) -> Result<Box<dyn Destination>, Failed> {
    match target {
        Target::Dir(dir) => {
            let dir = absolute(dir)?;
            let control = dir.join(CONTROL_DIR).join(sink.as_str());
            if !control.is_dir() {
                let sinks = std::fs::read_dir(dir.join(CONTROL_DIR))
                    .map(|d| {
                        let mut v: Vec<String> = d
                            .filter_map(|e| e.ok())
                            .filter(|e| e.path().is_dir())
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect();
                        v.sort();
                        v
                    })
                    .unwrap_or_default();
                return Err(failed(if sinks.is_empty() {
                    format!(
                        "{} holds no twopc sink ({} is missing): pass the output directory the \
                         sink writes to",
                        dir.display(),
                        control.display()
                    )
                } else {
                    format!(
                        "{} holds no sink '{sink}'; its sinks are: {}. Pass one of them with \
                         --sink",
                        dir.display(),
                        sinks.join(", ")
                    )
                }));
            }
            let dest = FsDestination::open(FsOptions::new(&dir), sink)
                .map_err(|e| failed(format!("cannot open {}: {e}", dir.display())))?;
            Ok(Box::new(dest))
        }
        Target::Postgres(pg) => Ok(Box::new(open_pg(pg, sink, needs_table)?)),
    }
}

pub fn open_pg(pg: &PgTarget, sink: &SinkId, needs_table: bool) -> Result<PgDestination, Failed> {
    let table =
        match (&pg.table, needs_table) {
            (Some(t), _) => t.clone(),
            (None, true) => return Err(failed(
                "missing --table: give the table the sink writes to (schema.table), so that its \
                 rows can be removed",
            )),
            // Only the control tables are used; any table name that exists.
            (None, false) => format!("{}.twopc_commit_records", pg.control_schema),
        };
    let mut options = PgOptions::new(Endpoint::Url(pg.url.clone()), table, &[]);
    options.control_schema = pg.control_schema.clone();
    options.transaction_id_column = pg.transaction_id_column.clone();
    match std::env::var(&pg.password_env) {
        Ok(p) if !p.is_empty() => options.password = Some(Password::new(p)),
        Ok(_) | Err(std::env::VarError::NotPresent) => {}
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(failed(format!(
                "the password in ${} is not valid UTF-8",
                pg.password_env
            )))
        }
    }
    PgDestination::connect_operator(options, sink).map_err(|e| match e {
        TwopcError::Config(c) => failed(c.message().to_string()),
        other => failed(other.to_string()),
    })
}

fn absolute(dir: &Path) -> Result<PathBuf, Failed> {
    std::fs::canonicalize(dir).map_err(|e| {
        failed(format!(
            "cannot open the output directory {}: {e}; pass the directory the sink writes to",
            dir.display()
        ))
    })
}

/// How long a command waits for a share of the sink that someone else
/// holds (a run that is stopping) before it refuses.
const HOLD_WAIT_MS: u64 = 2_000;

/// The instance id of this command's ownership claims.
fn instance() -> u64 {
    twopc_core::ids::random_u64()
}

/// Runs `twopc reconcile`; returns the exit code and the report.
pub fn reconcile(a: &ReconcileArgs) -> Result<(u8, String), Failed> {
    if let (Target::Postgres(pg), true) = (&a.target, a.apply) {
        if pg.transaction_id_column.is_none() {
            return Err(Failed {
                code: EXIT_REFUSED,
                message: no_txn_column(a, pg),
            });
        }
    }
    let mut dest = open(&a.target, &a.sink, true)?;
    operator::hold_sink(
        &mut dest,
        &SystemClock,
        &a.sink,
        instance(),
        HOLD_WAIT_MS,
        "reconcile",
    )?;
    let plan = operator::reconcile_plan(&mut dest, &a.sink, a.lineage, a.after)?;
    let mut out = String::new();
    if plan.transactions.is_empty() && a.apply {
        // Nothing left to remove; notes of lost transactions in the range
        // may remain from an interrupted earlier apply.
        operator::reconcile_apply(&mut dest, &SystemClock, &operator_identity(), &plan, |_| {})?;
    }
    if plan.transactions.is_empty() {
        out.push_str(&format!(
            "sink '{}': nothing committed after checkpoint {} of lineage {}; nothing to remove.\n",
            a.sink, a.after, a.lineage
        ));
        if !plan.lineages.contains(&a.lineage) {
            let known: Vec<String> = plan.lineages.iter().map(|l| l.to_string()).collect();
            out.push_str(&format!(
                "Lineage {} has no committed output of this sink{}.\n",
                a.lineage,
                if known.is_empty() {
                    String::new()
                } else {
                    format!("; lineages with output: {}", known.join(", "))
                }
            ));
        }
        return Ok((EXIT_OK, out));
    }
    let (n, records) = (plan.transactions.len(), plan.records());
    if !a.apply {
        out.push_str(&format!(
            "sink '{}': {n} transaction(s), {records} records, committed after checkpoint {} of \
             lineage {}. Dry run: nothing was changed.\n",
            a.sink, a.after, a.lineage
        ));
        for c in &plan.transactions {
            out.push_str(&format!(
                "  would remove {} (checkpoint {}, subtask {}, {} records)\n",
                c.transaction, c.checkpoint, c.subtask, c.records
            ));
        }
        out.push_str(&format!(
            "To remove them, while the job stays stopped: {} --apply\n",
            command_line(a)
        ));
        if let Target::Postgres(pg) = &a.target {
            if pg.transaction_id_column.is_none() {
                out.push_str(&no_txn_column(a, pg));
                out.push('\n');
            }
        }
        return Ok((EXIT_ATTENTION, out));
    }
    let mut removed = Vec::new();
    let result =
        operator::reconcile_apply(&mut dest, &SystemClock, &operator_identity(), &plan, |c| {
            removed.push(format!(
                "  removed {} (checkpoint {}, subtask {}, {} records)\n",
                c.transaction, c.checkpoint, c.subtask, c.records
            ))
        });
    out.push_str(&format!(
        "sink '{}': removing output committed after checkpoint {} of lineage {}:\n",
        a.sink, a.after, a.lineage
    ));
    for r in &removed {
        out.push_str(r);
    }
    match result {
        Ok(()) => {
            out.push_str(&format!(
                "Removed {n} transaction(s), {records} records. Restart the job from checkpoint \
                 {} (or a savepoint of it) of lineage {}.\n",
                a.after, a.lineage
            ));
            Ok((EXIT_OK, out))
        }
        Err(e) => {
            print!("{out}");
            Err(e.into())
        }
    }
}

fn no_txn_column(a: &ReconcileArgs, pg: &PgTarget) -> String {
    format!(
        "PostgreSQL rows can only be removed by transaction when the sink fills a transaction-id \
         column (transactionIdColumn), and none was given (--transaction-id-column). If the sink \
         has one, run again with --transaction-id-column <column>. If it has none, the rows of \
         these transactions cannot be told apart from other rows of {}: delete them by hand \
         (by a business key or time range), then remove their commit records with DELETE FROM \
         {}.twopc_commit_records WHERE sink_id = '{}' AND lineage = {} AND checkpoint > {}; and \
         configure a transaction-id column for the future",
        pg.table.as_deref().unwrap_or("the table"),
        pg.control_schema,
        a.sink,
        a.lineage.0 as i64,
        a.after
    )
}

fn command_line(a: &ReconcileArgs) -> String {
    let mut s = format!("twopc reconcile {}", describe_target(&a.target));
    s.push_str(&format!(
        " --sink {} --lineage {} --after-checkpoint {}",
        a.sink, a.lineage, a.after
    ));
    if let Target::Postgres(pg) = &a.target {
        s.push_str(&pg_flags(pg));
    }
    s
}

fn pg_flags(pg: &PgTarget) -> String {
    let mut s = String::new();
    if let Some(t) = &pg.table {
        s.push_str(&format!(" --table {t}"));
    }
    if let Some(c) = &pg.transaction_id_column {
        s.push_str(&format!(" --transaction-id-column {c}"));
    }
    if pg.control_schema != "public" {
        s.push_str(&format!(" --control-schema {}", pg.control_schema));
    }
    if pg.password_env != DEFAULT_PASSWORD_ENV {
        s.push_str(&format!(" --password-env {}", pg.password_env));
    }
    s
}

fn describe_target(t: &Target) -> String {
    match t {
        Target::Dir(d) => d.display().to_string(),
        Target::Postgres(pg) => twopc_pg::redact_url(&pg.url),
    }
}

/// Who runs the command, for the destination's operations log: the user
/// and host as the environment names them, and this tool's version.
fn operator_identity() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown user".to_string());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown host".to_string());
    format!("{user}@{host} (twopc {})", env!("CARGO_PKG_VERSION"))
}

/// Runs `twopc decide`.
pub fn decide(a: &DecideArgs) -> Result<(u8, String), Failed> {
    let mut dest = open(&a.target, &a.sink, false)?;
    operator::hold_sink(
        &mut dest,
        &SystemClock,
        &a.sink,
        instance(),
        HOLD_WAIT_MS,
        "decide",
    )?;
    let decided = operator::decide(
        &mut dest,
        &SystemClock,
        &a.sink,
        &a.transaction,
        a.decision,
        RetryPolicy::default(),
        &operator_identity(),
    )?;
    let txn = &a.transaction;
    let what = match decided {
        Decided::Committed => format!("committed transaction {txn}: its output is visible now"),
        Decided::CommittedEmpty => {
            format!("transaction {txn} held no records: nothing to publish, its id was released")
        }
        Decided::AlreadyCommitted => {
            format!("transaction {txn} was already committed; nothing changed")
        }
        Decided::Aborted => format!("aborted transaction {txn}: its staged data was removed"),
        Decided::NothingStaged => format!(
            "nothing is staged under transaction {txn} and it is not committed (aborted or \
             expired earlier); nothing changed"
        ),
    };
    Ok((EXIT_OK, format!("sink '{}': {what}.\n", a.sink)))
}
