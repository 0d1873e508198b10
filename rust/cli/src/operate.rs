//! `twopc reconcile` and `twopc decide`: the recovery plan carried out on a
//! directory or a PostgreSQL destination. The rules (what may be removed,
//! committed or aborted, and that no live run may own the sink meanwhile)
//! are the core's (`twopc_core::operator`); this module opens the
//! destination and prints what happened (`cli` parses the arguments).

use std::path::{Path, PathBuf};

use twopc_core::destination::{Destination, StagedState};
use twopc_core::operator::{self, Decided, Decision, OperatorError};
use twopc_core::{LineageId, RetryPolicy, SinkId, SystemClock, TransactionId, TwopcError};
use twopc_fs::{FsDestination, FsOptions, CONTROL_DIR};
use twopc_pg::{Endpoint, Password, PgDestination, PgOptions, SinkRecord};

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
    Dir(DirTarget),
    Postgres(PgTarget),
}

/// A directory destination, with the names its sink gives its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirTarget {
    pub dir: PathBuf,
    pub part_prefix: String,
    pub part_suffix: String,
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
    /// URL schemes are case-insensitive: `POSTGRES://...` is a URL too, and
    /// goes to the URL checks, which refuse it with the password masked,
    /// instead of being taken for a directory and printed as it is.
    pub fn is_postgres(s: &str) -> bool {
        let scheme = s
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        matches!(scheme.as_deref(), Some("postgres" | "postgresql"))
    }
}

pub struct ReconcileArgs {
    pub target: Target,
    pub sink: SinkId,
    pub lineage: LineageId,
    pub after: u64,
    pub apply: bool,
    /// PostgreSQL, a sink without a transaction-id column: the operator
    /// deleted the rows by hand; only the commit records are removed.
    pub rows_deleted_by_hand: bool,
}

pub struct DecideArgs {
    pub target: Target,
    pub sink: SinkId,
    pub decision: Decision,
    pub transaction: TransactionId,
    /// `--names-as-given`: commit under the file names given even when the
    /// sink has no commit record to check them against.
    pub names_as_given: bool,
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

/// Whether the file names given to a directory command were checked
/// against the sink's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameCheck {
    /// Checked against a commit record, or not a directory.
    Checked,
    /// No commit record of the sink names a file (it never published
    /// one), so nothing says how the sink names its files: the names given
    /// (`--part-prefix`, `--part-suffix`) are used as they are.
    NothingToCheckAgainst { prefix: String, suffix: String },
}

/// Opens the sink's destination without creating anything: a directory
/// must already hold the sink's control data.
pub fn open(
    target: &Target,
    sink: &SinkId,
    needs_table: bool,
) -> Result<Box<dyn Destination>, Failed> {
    open_checked(target, sink, needs_table).map(|(dest, _)| dest)
}

/// As [`open`], and says whether the file names could be checked.
pub fn open_checked(
    target: &Target,
    sink: &SinkId,
    needs_table: bool,
) -> Result<(Box<dyn Destination>, NameCheck), Failed> {
    match target {
        Target::Dir(target) => {
            let dir = absolute(&target.dir)?;
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
            let mut options = FsOptions::new(&dir);
            options.part_prefix = target.part_prefix.clone();
            options.part_suffix = target.part_suffix.clone();
            let dest = FsDestination::open(options, sink)
                .map_err(|e| failed(format!("cannot open {}: {e}", dir.display())))?;
            let check = if check_file_names(&dest, sink)? {
                NameCheck::Checked
            } else {
                NameCheck::NothingToCheckAgainst {
                    prefix: target.part_prefix.clone(),
                    suffix: target.part_suffix.clone(),
                }
            };
            Ok((Box::new(dest), check))
        }
        Target::Postgres(pg) => Ok((
            Box::new(open_pg(pg, sink, needs_table)?),
            NameCheck::Checked,
        )),
    }
}

/// The names given must be the sink's: a commit by hand would publish its
/// file under a name the sink's readers do not look for, and a removal
/// would take the sink's records for altered ones (found by review). The
/// sink's own commit records say how it names its files: the latest one,
/// as the sink is configured now (an earlier configuration may have named
/// them otherwise). The single records first; when none names a file (all
/// folded into the history, or removed by a reconcile), the folded ones.
/// Returns false when no record names a file: nothing to check against.
fn check_file_names(dest: &FsDestination, sink: &SinkId) -> Result<bool, Failed> {
    let read_failed = |e| {
        failed(format!(
            "cannot read the commit records of sink '{sink}': {e}"
        ))
    };
    let latest_named = |records: Vec<twopc_fs::CommitRecord>| {
        records
            .into_iter()
            .filter(|r| r.file.is_some())
            .max_by_key(|r| r.committed_at_ms)
    };
    let latest = match latest_named(dest.commit_records().map_err(read_failed)?) {
        Some(r) => Some(r),
        None => latest_named(dest.all_commit_records().map_err(read_failed)?),
    };
    let latest = latest
        .as_ref()
        .and_then(|r| r.file.as_ref().map(|f| (r, f)));
    if let Some((r, file)) = latest {
        let ours = dest.part_name(&r.handle.transaction);
        if file != &ours {
            return Err(failed(format!(
                "sink '{sink}' named the output of {} {file}, but these options name it {ours}: \
                 pass the sink's --part-prefix and --part-suffix (its partPrefix and \
                 partSuffix)",
                r.handle.transaction
            )));
        }
    }
    Ok(latest.is_some())
}

pub fn open_pg(pg: &PgTarget, sink: &SinkId, needs_table: bool) -> Result<PgDestination, Failed> {
    let table = match (&pg.table, needs_table) {
        (Some(t), _) => t.clone(),
        (None, true) => return Err(failed(MISSING_TABLE)),
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

/// What a PostgreSQL sink recorded of its configuration at start-up
/// (`twopc_sinks`), reconciled with the flags given: the table and
/// transaction-id column to use, and where they came from.
pub struct PgResolved {
    /// The flags given, completed by the record.
    pub target: PgTarget,
    pub record: Option<SinkRecord>,
}

/// Reads what sink `sink` recorded at its latest start and completes `pg`
/// with it: a table or column not given is taken from the record, one
/// given must agree with it (else the error says both and what to do).
/// Without a record, `pg` is used as given.
pub fn resolve_pg(pg: &PgTarget, sink: &SinkId) -> Result<PgResolved, Failed> {
    // The column is compared with the record before it is looked for in
    // the table, so that a contradiction is named as such.
    let probe_target = PgTarget {
        transaction_id_column: None,
        ..pg.clone()
    };
    let mut probe = open_pg(&probe_target, sink, false)?;
    let record = probe.sink_record().map_err(|e| {
        failed(format!(
            "reading what sink '{sink}' recorded of its target table failed: {e}"
        ))
    })?;
    let Some(rec) = record else {
        return Ok(PgResolved {
            target: pg.clone(),
            record: None,
        });
    };
    let recorded = |rec: &SinkRecord| {
        format!(
            "recorded in {}.twopc_sinks at its start on {}",
            pg.control_schema,
            twopc_core::clock::format_utc(rec.recorded_at_ms)
        )
    };
    let mut target = pg.clone();
    match &pg.table {
        Some(given) => {
            let (schema, name) = probe
                .resolved_table()
                .map_err(|e| failed(format!("looking up --table {given} failed: {e}")))?;
            if (schema.as_str(), name.as_str())
                != (rec.table_schema.as_str(), rec.table_name.as_str())
            {
                return Err(failed(format!(
                    "--table {given} ({schema}.{name}) is not the table sink '{sink}' writes to: \
                     it writes to {} ({}). Leave --table out to use the recorded table (or pass \
                     --table {}); if the sink now writes to {given}, start it once with that \
                     configuration, so that it records it, and run the command again",
                    rec.table(),
                    recorded(&rec),
                    rec.table()
                )));
            }
        }
        None => target.table = Some(rec.table()),
    }
    match (&pg.transaction_id_column, &rec.transaction_id_column) {
        (Some(given), Some(column)) if given != column => {
            return Err(failed(format!(
                "--transaction-id-column {given} is not the column sink '{sink}' fills: it \
                 fills {column} ({}). Leave --transaction-id-column out to use the recorded \
                 column (or pass --transaction-id-column {column}); if the sink now fills \
                 {given}, start it once with that configuration, so that it records it, and \
                 run the command again",
                recorded(&rec)
            )))
        }
        (Some(given), None) => {
            return Err(failed(format!(
                "--transaction-id-column {given} is not a column sink '{sink}' fills: it fills \
                 no transaction-id column ({}), so no row of its transactions could be told by \
                 {given}. Leave --transaction-id-column out (a dry run says how to remove such \
                 rows); if the sink now fills {given}, start it once with that configuration, \
                 so that it records it, and run the command again",
                recorded(&rec)
            )))
        }
        (None, column) => target.transaction_id_column = column.clone(),
        (Some(_), Some(_)) => {}
    }
    Ok(PgResolved {
        target,
        record: Some(rec),
    })
}

/// The message of a missing `--table` when the sink recorded none.
const MISSING_TABLE: &str = "missing --table: give the table the sink writes to (schema.table), \
                             so that its rows can be removed";

/// Runs `twopc reconcile`; returns the exit code and the report.
pub fn reconcile(a: &ReconcileArgs) -> Result<(u8, String), Failed> {
    let (mut dest, resolved): (Box<dyn Destination>, Option<PgResolved>) = match &a.target {
        Target::Dir(_) => (open(&a.target, &a.sink, true)?, None),
        Target::Postgres(pg) => {
            let resolved = resolve_pg(pg, &a.sink)?;
            let eff = &resolved.target;
            if eff.table.is_none() {
                return Err(failed(MISSING_TABLE));
            }
            if let (Some(column), true) = (&eff.transaction_id_column, a.rows_deleted_by_hand) {
                return Err(failed(format!(
                    "--rows-deleted-by-hand is for a sink that fills no transaction-id \
                     column, and sink '{}' fills {column}{}: leave the option out, and \
                     `--apply` removes the rows by that column itself (rows deleted by hand \
                     already are simply not found)",
                    a.sink,
                    if resolved.record.is_some() {
                        " (as it recorded at its start)"
                    } else {
                        ""
                    }
                )));
            }
            let mut d = open_pg(eff, &a.sink, true)?;
            if a.rows_deleted_by_hand {
                d.retract_records_only();
            }
            (Box::new(d), Some(resolved))
        }
    };
    operator::hold_sink(
        &mut dest,
        &SystemClock,
        &a.sink,
        instance(),
        HOLD_WAIT_MS,
        "reconcile",
    )?;
    let plan = operator::reconcile_plan(&mut dest, &a.sink, a.lineage, a.after)?;
    if plan.transactions.is_empty() {
        return nothing_to_remove(a, &mut dest, &plan);
    }
    // Checked once there are rows to remove: notes of lost transactions
    // alone are cleared without a column (found by review).
    if let Some(r) = &resolved {
        if a.apply && r.target.transaction_id_column.is_none() && !a.rows_deleted_by_hand {
            return Err(Failed {
                code: EXIT_REFUSED,
                message: no_txn_column(a, r),
            });
        }
    }
    let mut out = String::new();
    let (n, records) = (plan.transactions.len(), plan.records());
    if !a.apply {
        out.push_str(&format!(
            "sink '{}': {n} transaction(s), {records} records, committed after checkpoint {} of \
             lineage {}. Dry run: nothing was changed.\n",
            a.sink, a.after, a.lineage
        ));
        if let Some(r) = &resolved {
            out.push_str(&rows_line(a, r));
        }
        for c in &plan.transactions {
            out.push_str(&format!(
                "  would remove {} (checkpoint {}, subtask {}, {} records)\n",
                c.transaction, c.checkpoint, c.subtask, c.records
            ));
        }
        match &resolved {
            Some(r) if r.target.transaction_id_column.is_none() && !a.rows_deleted_by_hand => {
                out.push_str(&no_txn_column(a, r));
                out.push('\n');
            }
            _ => out.push_str(&format!(
                "To remove them, while the job stays stopped: {} --apply\n",
                command_line(a)
            )),
        }
        if let Some(w) = lost_before_warning(a, &plan) {
            out.push_str(&w);
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
    let what = if a.rows_deleted_by_hand {
        "the commit records of the output (its rows deleted by hand)"
    } else {
        "output"
    };
    out.push_str(&format!(
        "sink '{}': removing {what} committed after checkpoint {} of lineage {}:\n",
        a.sink, a.after, a.lineage
    ));
    for r in &removed {
        out.push_str(r);
    }
    match result {
        Ok(()) => {
            let removed = if a.rows_deleted_by_hand {
                format!(
                    "Removed the commit records of {n} transaction(s) ({records} records, their \
                     rows deleted by hand)"
                )
            } else {
                format!("Removed {n} transaction(s), {records} records")
            };
            if let Some(w) = lost_before_warning(a, &plan) {
                out.push_str(&format!("{removed}. {w}"));
                return Ok((EXIT_ATTENTION, out));
            }
            out.push_str(&format!(
                "{removed}. Restart the job from checkpoint {} (or a savepoint of it) of lineage \
                 {}.\n",
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

/// `reconcile` when nothing is committed in the range: what is left to do
/// all the same (notes of lost transactions), or why the lineage given is
/// most likely not the one meant.
fn nothing_to_remove(
    a: &ReconcileArgs,
    dest: &mut Box<dyn Destination>,
    plan: &operator::ReconcilePlan,
) -> Result<(u8, String), Failed> {
    let mut out = format!(
        "sink '{}': nothing committed after checkpoint {} of lineage {}; nothing to remove.\n",
        a.sink, a.after, a.lineage
    );
    let known: Vec<String> = plan.lineages.iter().map(|l| l.to_string()).collect();
    let with_output = if known.is_empty() {
        String::new()
    } else {
        format!("; lineages with output: {}", known.join(", "))
    };
    // A lineage that never ran here is most likely mistyped: "nothing to
    // remove" must not pass for a check of the lineage meant, whose output
    // would then stop the restored job again. Decided before any change.
    if !plan.lineage_known {
        out.push_str(&format!(
            "Lineage {} never ran in this sink here{with_output}. Check the lineage: the job's \
             error and `twopc inspect` name it. Nothing was changed.\n",
            a.lineage
        ));
        return Ok((EXIT_ATTENTION, out));
    }
    if !plan.lineages.contains(&a.lineage) {
        out.push_str(&format!(
            "Lineage {} has no committed output of this sink (any more){with_output}.\n",
            a.lineage
        ));
    }
    let mut code = EXIT_OK;
    let n = plan.lost.len();
    let warning = lost_before_warning(a, plan);
    if a.apply && n > 0 {
        // Notes of lost transactions in the range may remain, e.g. from an
        // interrupted earlier apply. With none, nothing is changed (not
        // even the operations log): a repeat changes nothing.
        operator::reconcile_apply(dest, &SystemClock, &operator_identity(), plan, |_| {})?;
        out.push_str(&format!(
            "Cleared the notes of {n} lost transaction(s) of that range: the restored run writes \
             it again.{}\n",
            if warning.is_some() {
                String::new()
            } else {
                format!(
                    " Restart the job from checkpoint {} (or a savepoint of it) of lineage {}.",
                    a.after, a.lineage
                )
            }
        ));
    } else if n > 0 {
        out.push_str(&format!(
            "Notes of {n} lost transaction(s) of that range remain; to clear them, while the job \
             stays stopped: {} --apply\n",
            command_line(a)
        ));
        code = EXIT_ATTENTION;
    }
    if let Some(w) = warning {
        out.push_str(&w);
        code = EXIT_ATTENTION;
    }
    Ok((code, out))
}

/// Transactions of the lineage found LOST at or before the checkpoint
/// given: a restore of it does not write their records again, so the
/// operator is told how to get them back, whatever else is done (found by
/// review). Not a refusal: if no earlier checkpoint is left, restoring
/// this one with those records missing may be the only way on.
fn lost_before_warning(a: &ReconcileArgs, plan: &operator::ReconcilePlan) -> Option<String> {
    let first = plan.lost_not_after.first()?;
    let list: Vec<String> = plan.lost_not_after.iter().map(|c| c.to_string()).collect();
    Some(format!(
        "Transactions of checkpoint(s) {} of lineage {} were found LOST, at or before checkpoint \
         {}: a restore of checkpoint {} does not write their records again. Restore from a \
         checkpoint before {first} instead, and reconcile after that one (--after-checkpoint \
         with its number); a restore of checkpoint {} leaves those records missing.\n",
        list.join(", "),
        a.lineage,
        a.after,
        a.after,
        a.after
    ))
}

/// Where a dry run's rows are, and by which column they are told apart.
fn rows_line(a: &ReconcileArgs, r: &PgResolved) -> String {
    let table = r.target.table.as_deref().unwrap_or("?");
    let source = match &r.record {
        Some(rec) => format!(
            " (as sink '{}' recorded at its start on {})",
            a.sink,
            twopc_core::clock::format_utc(rec.recorded_at_ms)
        ),
        None => String::new(),
    };
    match (&r.target.transaction_id_column, a.rows_deleted_by_hand) {
        (_, true) => format!(
            "Their rows in {table} were deleted by hand (--rows-deleted-by-hand): only their \
             commit records would be removed.\n"
        ),
        (Some(c), false) => {
            format!("Their rows are in {table}, told apart by column {c}{source}.\n")
        }
        (None, false) => {
            format!("Their rows are in {table}, which has no transaction-id column{source}.\n")
        }
    }
}

/// Why PostgreSQL rows cannot be removed without a transaction-id column,
/// and the commands that remove them by hand.
fn no_txn_column(a: &ReconcileArgs, r: &PgResolved) -> String {
    let table = r.target.table.as_deref().unwrap_or("the table");
    let schema = &r.target.control_schema;
    let by_hand = format!(
        "delete the rows of these transactions from {table} by hand (e.g. by a business key or \
         time range), then run `{} --rows-deleted-by-hand --apply`: it removes their commit \
         records, whether still single in {schema}.twopc_commit_records or folded into \
         {schema}.twopc_commit_segments (which only twopc rewrites: a DELETE FROM \
         twopc_commit_records by hand misses the folded ones, and a restore of checkpoint {} \
         would still stop on them). Configure a transaction-id column (transactionIdColumn) for \
         the future",
        command_line(a),
        a.after
    );
    match &r.record {
        Some(rec) => format!(
            "PostgreSQL rows can only be removed by transaction when the sink fills a \
             transaction-id column (transactionIdColumn), and sink '{}' fills none (recorded in \
             {schema}.twopc_sinks at its start on {}), so the rows of these transactions cannot \
             be told apart from other rows of {table}. To remove them, while the job stays \
             stopped: {by_hand}",
            a.sink,
            twopc_core::clock::format_utc(rec.recorded_at_ms)
        ),
        None => format!(
            "PostgreSQL rows can only be removed by transaction when the sink fills a \
             transaction-id column (transactionIdColumn), and none was given \
             (--transaction-id-column) nor recorded by the sink (it records its configuration \
             in {schema}.twopc_sinks at start-up, when it may). If the sink has one, run again \
             with --transaction-id-column <column>. If it has none, the rows of these \
             transactions cannot be told apart from other rows of {table}: {by_hand}"
        ),
    }
}

/// The command as given (a table or column the sink recorded is read
/// again from its record), without `--apply`; a shell runs it as it is.
fn command_line(a: &ReconcileArgs) -> String {
    let mut s = format!(
        "twopc reconcile {}",
        shell_word(&describe_target(&a.target))
    );
    s.push_str(&format!(
        " --sink {} --lineage {} --after-checkpoint {}",
        shell_word(a.sink.as_str()),
        a.lineage,
        a.after
    ));
    if let Target::Dir(d) = &a.target {
        // Without the sink's own names the command would be refused
        // (`check_file_names`).
        if d.part_prefix != "part" {
            s.push_str(&format!(" --part-prefix {}", shell_word(&d.part_prefix)));
        }
        if !d.part_suffix.is_empty() {
            s.push_str(&format!(" --part-suffix {}", shell_word(&d.part_suffix)));
        }
    }
    if let Target::Postgres(pg) = &a.target {
        if let Some(t) = &pg.table {
            s.push_str(&format!(" --table {}", shell_word(t)));
        }
        if let Some(c) = &pg.transaction_id_column {
            s.push_str(&format!(" --transaction-id-column {}", shell_word(c)));
        }
        s.push_str(&pg_connection_flags(pg));
        if a.rows_deleted_by_hand {
            s.push_str(" --rows-deleted-by-hand");
        }
    }
    s
}

/// The flags that reach a PostgreSQL destination's control tables, when
/// not their defaults: for commands printed to be run as they are.
pub fn pg_connection_flags(pg: &PgTarget) -> String {
    let mut s = String::new();
    if pg.control_schema != "public" {
        s.push_str(&format!(
            " --control-schema {}",
            shell_word(&pg.control_schema)
        ));
    }
    if pg.password_env != DEFAULT_PASSWORD_ENV {
        s.push_str(&format!(" --password-env {}", shell_word(&pg.password_env)));
    }
    s
}

/// `w` as one word of a POSIX shell command line: as it is when it holds
/// no character a shell would read otherwise, else single-quoted.
pub fn shell_word(w: &str) -> String {
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:@%+=,".contains(c));
    if plain {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

fn describe_target(t: &Target) -> String {
    match t {
        Target::Dir(d) => d.dir.display().to_string(),
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
    let (mut dest, names) = open_checked(&a.target, &a.sink, false)?;
    // The sink never published a file, so nothing says how it names them:
    // a commit under other names than the job's would publish a file its
    // readers never look for, and its commit record would keep that name
    // (renaming the file afterwards makes the record look altered to a
    // later retraction). So the names are confirmed first, not regretted
    // after (found by review).
    if let (Decision::Commit, NameCheck::NothingToCheckAgainst { prefix, suffix }) =
        (a.decision, &names)
    {
        // Only a commit that would publish a file needs its name confirmed:
        // not one of a transaction that is not staged (nothing to publish)
        // or was prepared with no records. A claimed one, or one whose
        // handle cannot be read, is confirmed first.
        let publishes = dest
            .staged()
            .map_err(|e| failed(format!("cannot list the staged transactions: {e}")))?
            .iter()
            .find(|s| s.transaction == a.transaction)
            .is_some_and(|s| match &s.state {
                StagedState::Prepared(h) | StagedState::Committing(h) => {
                    h.prepared().is_none_or(|p| p.records > 0)
                }
                _ => true,
            });
        if !a.names_as_given && publishes {
            return Err(failed(format!(
                "sink '{}' has published no file yet, so the file names given cannot be checked \
                 against the job's: this commit would publish {} (--part-prefix {} \
                 --part-suffix {}). Nothing was changed. If those are the job's partPrefix \
                 and partSuffix, run the command again with --names-as-given; otherwise pass \
                 the job's",
                a.sink,
                twopc_core::part_names::part_name(prefix, &a.transaction, suffix),
                shell_word(prefix),
                shell_word(suffix)
            )));
        }
    }
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
        // An operator at a terminal hears about an unreachable destination
        // within seconds, not after the minute a job's committer waits out.
        RetryPolicy {
            max_attempts: 5,
            ..RetryPolicy::default()
        },
        &operator_identity(),
    )?;
    let txn = &a.transaction;
    let what = match decided {
        Decided::Committed => match names {
            NameCheck::Checked => format!("committed transaction {txn}: its output is visible now"),
            NameCheck::NothingToCheckAgainst { prefix, suffix } => format!(
                "committed transaction {txn}: its output is visible now as {} (the names \
                 given, as confirmed with --names-as-given)",
                twopc_core::part_names::part_name(&prefix, txn, &suffix)
            ),
        },
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

#[cfg(test)]
mod tests {
    use super::shell_word;

    #[test]
    fn words_a_shell_would_read_otherwise_are_quoted() {
        for plain in [
            "postgres://app@db:5432/shop",
            "public.orders",
            "a-b_c.d",
            "/tmp/out",
        ] {
            assert_eq!(shell_word(plain), plain);
        }
        assert_eq!(shell_word("my schema"), "'my schema'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        assert_eq!(shell_word("a*"), "'a*'");
        assert_eq!(shell_word("$HOME"), "'$HOME'");
        assert_eq!(shell_word(""), "''");
    }
}
