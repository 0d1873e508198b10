//! `twopc inspect`: reads an output directory of the filesystem destination
//! and says what is committed, what is staged, and what needs an operator.
//!
//! Nothing is changed on disk. The analysis is kept apart from rendering so
//! that the text and the JSON output report the same findings.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;
use twopc_core::destination::StagedState;
use twopc_core::ids::TransactionId;
use twopc_fs::{Layout, SinkInventory, CONTROL_DIR};

use twopc_core::timefmt::duration;

/// Progress lines go to stderr every this many items.
const PROGRESS_EVERY: u64 = 1000;

pub struct InspectOptions {
    pub output: PathBuf,
    pub retention_ms: u64,
    /// The run (Flink job id) to judge prepared transactions against; when
    /// absent, the run with the latest activity in each sink.
    pub run: Option<String>,
    pub part_prefix: String,
    /// Only for the commands the report prints: `twopc reconcile` and
    /// `twopc decide` refuse names other than the sink's.
    pub part_suffix: String,
    pub now_ms: u64,
    /// How many committed transactions to list per sink (the latest);
    /// `None` lists every one. Counts and findings always cover all.
    pub limit: Option<usize>,
    /// For a PostgreSQL destination: the sink and how to reach its tables.
    pub sink: Option<String>,
    pub postgres: Option<crate::operate::PgTarget>,
}

/// Checkpoints per lineage whose commit records a summary (no `--all`) of
/// a destination without a directory inventory reads.
const RECENT_CHECKPOINTS: u64 = 64;

/// Committed transactions listed per sink unless `--limit` or `--all`.
pub const DEFAULT_LIMIT: usize = 20;

/// Why the directory could not be inspected at all (exit code 2).
#[derive(Debug)]
pub struct InspectError(pub String);

impl std::fmt::Display for InspectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The whole result. Field names are part of the `--json` interface.
#[derive(Debug, Serialize)]
pub struct Report {
    pub output_dir: String,
    pub scanned_at_ms: u64,
    pub retention_ms: u64,
    pub needs_attention: bool,
    pub sinks: Vec<SinkReport>,
    /// Visible part files that no commit record of any sink references.
    pub unreferenced_files: Vec<VisibleFile>,
    /// Things that need an operator; exit code 1 when not empty.
    pub attention: Vec<Finding>,
    /// Worth knowing, harmless.
    pub notes: Vec<Finding>,
}

#[derive(Debug, Serialize)]
pub struct SinkReport {
    pub sink: String,
    /// The run prepared transactions are judged against (see `--run`).
    pub reference_run: Option<String>,
    /// Every committed transaction, counted.
    pub committed_total: usize,
    pub committed_records: u64,
    /// Committed output per lineage and run.
    pub lineages: Vec<LineageEntry>,
    /// The latest committed transactions (all with `--all`), by lineage
    /// and checkpoint.
    pub committed: Vec<CommittedEntry>,
    pub staged: Vec<StagedEntry>,
    pub expired: Vec<ExpiredEntry>,
    /// Verbatim from the core's inventory.
    pub problems: Vec<String>,
    /// Leftovers of interrupted atomic writes in the sink's tmp directory.
    pub scratch_files: Vec<String>,
    /// Changes made by hand (`twopc reconcile --apply`, `twopc decide`),
    /// counted; the latest of them listed (all with `--all`).
    pub operations_total: usize,
    pub operations: Vec<OperationEntry>,
    /// PostgreSQL: the target table and transaction-id column the sink
    /// recorded at its latest start (`twopc_sinks`); `null` when it has not
    /// recorded them, and for a directory.
    pub target: Option<TargetEntry>,
}

/// What a PostgreSQL sink recorded of its configuration at start-up.
#[derive(Debug, Serialize)]
pub struct TargetEntry {
    /// `schema.table`, as the sink resolved it.
    pub table: String,
    /// `null` when the sink fills no transaction-id column.
    pub transaction_id_column: Option<String>,
    /// When this configuration was first recorded.
    pub recorded_at_ms: u64,
}

/// Adds what a PostgreSQL sink recorded of its target table to its report
/// (the report of that one sink); a failure to read it is a note.
pub fn add_pg_target(report: &mut Report, dest: &mut twopc_pg::PgDestination) {
    let Some(sink) = report.sinks.first_mut() else {
        return;
    };
    match dest.sink_record() {
        Ok(r) => {
            sink.target = r.map(|r| TargetEntry {
                table: r.table(),
                transaction_id_column: r.transaction_id_column,
                recorded_at_ms: r.recorded_at_ms,
            })
        }
        Err(e) => report.notes.push(Finding::new(
            "target-unreadable",
            Some(&sink.sink),
            format!(
                "what sink '{}' recorded of its target table cannot be read: {e}",
                sink.sink
            ),
        )),
    }
}

/// One entry of a sink's operations log.
#[derive(Debug, Serialize)]
pub struct OperationEntry {
    pub at_ms: u64,
    pub command: String,
    pub transaction: Option<String>,
    pub what: String,
    pub by: String,
}

/// The latest `limit` entries of an operations log (all for `None`).
fn operation_entries(
    records: &[twopc_core::destination::OperationRecord],
    limit: Option<usize>,
) -> Vec<OperationEntry> {
    let skip = limit.map_or(0, |l| records.len().saturating_sub(l));
    records[skip..]
        .iter()
        .map(|r| OperationEntry {
            at_ms: r.at_ms,
            command: r.command.clone(),
            transaction: r.transaction.as_ref().map(|t| t.to_string()),
            what: r.what.clone(),
            by: r.by.clone(),
        })
        .collect()
}

#[derive(Debug, Serialize)]
pub struct LineageEntry {
    pub lineage: String,
    pub transactions: u64,
    pub records: u64,
    pub first_checkpoint: u64,
    pub last_checkpoint: u64,
    pub runs: Vec<RunEntry>,
}

#[derive(Debug, Serialize)]
pub struct RunEntry {
    pub run: String,
    pub transactions: u64,
    pub records: u64,
    pub first_checkpoint: u64,
    pub last_checkpoint: u64,
}

#[derive(Debug, Serialize)]
pub struct CommittedEntry {
    pub transaction: String,
    pub lineage: String,
    pub checkpoint: u64,
    pub subtask: u32,
    pub run: String,
    pub file: Option<String>,
    pub file_present: bool,
    pub records: u64,
    pub bytes: u64,
    pub committed_at_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct StagedEntry {
    pub transaction: String,
    pub subtask: u32,
    /// "prepared" or "open".
    pub state: &'static str,
    pub checkpoint: Option<u64>,
    pub run: Option<String>,
    pub lineage: Option<String>,
    pub records: Option<u64>,
    pub last_activity_ms: u64,
    pub age_ms: u64,
    pub within_retention: bool,
    /// A commit record exists: a commit was decided and not finished.
    pub commit_decided: bool,
}

#[derive(Debug, Serialize)]
pub struct ExpiredEntry {
    pub transaction: String,
    pub expired_at_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct VisibleFile {
    pub file: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// Stable, machine-readable: `problem`, `commit-unfinished`,
    /// `prepared-past-retention`, `prepared-other-run`, `prepared`,
    /// `partly-visible-checkpoint`, `lost`, `checkpoint-gap`, `history-summarised`,
    /// `prepared-unreadable`, `open-past-retention`, `output-changed`, `unreferenced-file`,
    /// `scratch-files`, `unknown-entry`, `target-unreadable`.
    pub kind: &'static str,
    pub sink: Option<String>,
    pub transaction: Option<String>,
    pub file: Option<String>,
    pub message: String,
}

impl Finding {
    fn new(kind: &'static str, sink: Option<&str>, message: String) -> Self {
        Finding {
            kind,
            sink: sink.map(str::to_string),
            transaction: None,
            file: None,
            message,
        }
    }
    fn txn(mut self, t: &str) -> Self {
        self.transaction = Some(t.to_string());
        self
    }
    fn file(mut self, f: &str) -> Self {
        self.file = Some(f.to_string());
        self
    }
}

/// Counts items of a long scan and reports every [`PROGRESS_EVERY`].
struct Progress {
    what: String,
    count: u64,
}

impl Progress {
    fn new(what: impl Into<String>) -> Self {
        Progress {
            what: what.into(),
            count: 0,
        }
    }
    fn tick(&mut self) {
        self.count += 1;
        if self.count % PROGRESS_EVERY == 0 {
            eprintln!("twopc inspect: {}: {} so far", self.what, self.count);
        }
    }
}

pub fn inspect(opts: &InspectOptions) -> Result<Report, InspectError> {
    let out = &opts.output;
    match fs::metadata(out) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(InspectError(format!(
                "{} is not a directory; pass the output directory the sink writes to",
                out.display()
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(InspectError(format!(
                "output directory {} does not exist; pass the directory the sink writes to",
                out.display()
            )))
        }
        Err(e) => {
            return Err(InspectError(format!(
                "cannot read {}: {e}; check the path and its permissions",
                out.display()
            )))
        }
    }
    let control = out.join(CONTROL_DIR);
    if !control.is_dir() {
        return Err(InspectError(format!(
            "{} has no {CONTROL_DIR} directory, so no twopc sink has used it: pass the output \
             directory configured for the sink (the one that holds {CONTROL_DIR}/)",
            out.display()
        )));
    }

    let mut notes = Vec::new();
    let control_entries = list_dir(&control)?;
    for (name, is_dir) in &control_entries {
        let valid = twopc_core::ids::SinkId::new(name.as_str()).is_ok();
        if !valid || !is_dir {
            notes.push(
                Finding::new(
                    "unknown-entry",
                    None,
                    format!(
                        "{} is not a sink directory (sink ids are directories named with \
                         letters, digits, '_' and '-'); twopc ignores it",
                        control.join(name).display()
                    ),
                )
                .file(&control.join(name).display().to_string()),
            );
        }
    }
    for (name, is_dir) in &control_entries {
        let committed = control.join(name).join("committed");
        if *is_dir {
            if let Ok(n) = fs::read_dir(&committed).map(|d| d.count()) {
                if n as u64 >= PROGRESS_EVERY {
                    eprintln!("twopc inspect: reading {n} commit records of sink '{name}'...");
                }
            }
        }
    }

    // By default the committed history is read to a bounded depth: the
    // single records and the history segments' names (see twopc_fs's
    // `history`); `--all` reads and checks every record.
    let depth = if opts.limit.is_none() {
        twopc_fs::Depth::Full
    } else {
        twopc_fs::Depth::Summary
    };
    // The visible files are listed before the records are read: a commit
    // writes its record before it publishes its file (a visible-first one
    // before it removes its claim, which is read before the records), so a
    // file published while inspect runs is referenced by the records or the
    // claims read below. (Listed after, such a file would be reported as no
    // record's, to be removed.)
    // Not listed when the check will not be made: a summary of a history
    // with segments (their records are not read).
    let visible_before = if depth == twopc_fs::Depth::Full || !any_history_segments(out) {
        Some(visible_part_files(opts)?)
    } else {
        None
    };
    let inventories = twopc_fs::inventory_with(out, depth).map_err(|e| {
        let stray: Vec<String> = control_entries
            .iter()
            .filter(|(n, d)| !d && twopc_core::ids::SinkId::new(n.as_str()).is_ok())
            .map(|(n, _)| control.join(n).display().to_string())
            .collect();
        if stray.is_empty() {
            InspectError(format!(
                "cannot read the twopc state in {}: {e}",
                control.display()
            ))
        } else {
            InspectError(format!(
                "cannot read the twopc state in {}: {e}. {} is named like a sink but is not a \
                 directory; move it out of {CONTROL_DIR} and run inspect again",
                control.display(),
                stray.join(", ")
            ))
        }
    })?;

    let mut attention = Vec::new();
    let mut referenced = BTreeSet::new();
    // Transactions being committed (claimed, or linked by a visible-first
    // commit): their output may be visible before their record exists.
    let mut in_commit = BTreeSet::new();
    let mut sinks = Vec::new();
    for inv in &inventories {
        let (report, mut att, mut nts) = analyse_sink(opts, inv)?;
        for c in &inv.committed {
            if let Some(f) = &c.file {
                referenced.insert(f.clone());
            }
        }
        for st in &inv.staged {
            if matches!(st.state, StagedState::Committing(_)) {
                in_commit.insert(st.transaction.to_string());
            }
        }
        attention.append(&mut att);
        notes.append(&mut nts);
        sinks.push(report);
    }

    // Which visible files no record references can only be told with
    // every record at hand.
    let folded_unread = inventories
        .iter()
        .any(|inv| !inv.full && !inv.segments.is_empty());
    let unreferenced = if folded_unread {
        notes.push(Finding::new(
            "history-summarised",
            None,
            "older commit records are folded into history segments and were counted from              their names, not read: their output files were not checked, nor was the output              directory searched for files no record references. `twopc inspect --all` reads              and checks all of it"
                .to_string(),
        ));
        Vec::new()
    } else {
        let visible = match visible_before {
            Some(v) => v,
            None => visible_part_files(opts)?,
        };
        unreferenced_among(opts, visible, &referenced, &in_commit)
    };
    for u in &unreferenced {
        let mut message = format!(
            "{} ({} bytes) is visible output that no commit record references: it was written \
             outside twopc, or its commit record was removed. Readers take it as output; remove \
             it or move it out of {} if it is not wanted",
            u.file,
            u.bytes,
            out.display()
        );
        if let Some(t) = txn_in_part_name(&u.file, &opts.part_prefix) {
            message.push_str(&format!(
                ". Its name is that of transaction {t} of sink '{}'",
                t.split('.').next().unwrap_or_default()
            ));
        }
        attention.push(Finding::new("unreferenced-file", None, message).file(&u.file));
    }

    Ok(Report {
        output_dir: out.display().to_string(),
        scanned_at_ms: opts.now_ms,
        retention_ms: opts.retention_ms,
        needs_attention: !attention.is_empty(),
        sinks,
        unreferenced_files: unreferenced,
        attention,
        notes,
    })
}

type SinkAnalysis = (SinkReport, Vec<Finding>, Vec<Finding>);

/// The output directory as the commands of the advice name it: one shell
/// word, with the sink's file names when not the defaults (the commands
/// refuse other names than the sink's).
fn dir_command_target(opts: &InspectOptions) -> String {
    use crate::operate::shell_word;
    let mut s = shell_word(&opts.output.display().to_string());
    if opts.part_prefix != "part" {
        s.push_str(&format!(" --part-prefix {}", shell_word(&opts.part_prefix)));
    }
    if !opts.part_suffix.is_empty() {
        s.push_str(&format!(" --part-suffix {}", shell_word(&opts.part_suffix)));
    }
    s
}

fn analyse_sink(opts: &InspectOptions, inv: &SinkInventory) -> Result<SinkAnalysis, InspectError> {
    let out = &opts.output;
    let command_target = dir_command_target(opts);
    let sink = inv.sink.as_str();
    let layout = Layout::new(out, &inv.sink);
    let mut attention = Vec::new();
    let mut notes = Vec::new();

    // Committed transactions, with a size check of every visible file.
    let mut progress = Progress::new(format!("checked committed files of sink '{sink}'"));
    let mut committed = Vec::with_capacity(inv.committed.len());
    for c in &inv.committed {
        progress.tick();
        let h = &c.handle;
        let present = match &c.file {
            Some(f) => match fs::metadata(out.join(f)) {
                Ok(m) => {
                    if m.len() != c.data_len {
                        attention.push(
                            Finding::new(
                                "output-changed",
                                Some(sink),
                                format!(
                                    "{f} of committed transaction {} has {} bytes but {} were \
                                     committed: it was modified or truncated after the commit. \
                                     Readers see the changed file; restore it from a backup or \
                                     re-run the range",
                                    h.transaction,
                                    m.len(),
                                    c.data_len
                                ),
                            )
                            .txn(h.transaction.as_str())
                            .file(f),
                        );
                    }
                    true
                }
                Err(_) => false,
            },
            None => false,
        };
        committed.push(CommittedEntry {
            transaction: h.transaction.to_string(),
            lineage: h.lineage.to_string(),
            checkpoint: h.checkpoint().unwrap_or_default(),
            subtask: h.subtask,
            run: h.run.to_string(),
            file: c.file.clone(),
            file_present: present,
            records: h.prepared().map(|p| p.records).unwrap_or(0),
            bytes: c.data_len,
            committed_at_ms: c.committed_at_ms,
        });
    }
    let mut committed_total = committed.len();
    let mut committed_records: u64 = committed
        .iter()
        .map(|c| c.records)
        .fold(0, u64::saturating_add);
    let mut lineages = summarise(&committed);
    if !inv.full {
        // The folded history, from the segments' names.
        for seg in &inv.segments {
            committed_total = committed_total
                .saturating_add(usize::try_from(seg.transactions).unwrap_or(usize::MAX));
            committed_records = committed_records.saturating_add(seg.records);
            add_folded(&mut lineages, seg);
        }
    }
    if let Some(limit) = opts.limit {
        if committed.len() > limit {
            committed.sort_by(|a, b| {
                (b.committed_at_ms, &b.transaction).cmp(&(a.committed_at_ms, &a.transaction))
            });
            committed.truncate(limit);
        }
    }
    committed.sort_by(|a, b| {
        (&a.lineage, a.checkpoint, a.subtask, &a.transaction).cmp(&(
            &b.lineage,
            b.checkpoint,
            b.subtask,
            &b.transaction,
        ))
    });
    let decided: BTreeMap<&str, &twopc_fs::CommitRecord> = inv
        .committed
        .iter()
        .map(|c| (c.handle.transaction.as_str(), c))
        .collect();

    // Checkpoints with committed output, per lineage: (transactions,
    // records). A commit of any transaction of a checkpoint proves that
    // the checkpoint completed.
    let mut checkpoints: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
    for c in inv.committed.iter().chain(&inv.folded_context) {
        let Some(cp) = c.handle.checkpoint() else {
            continue;
        };
        let e = checkpoints.entry((c.handle.lineage.0, cp)).or_default();
        e.0 += 1;
        e.1 += c.handle.prepared().map_or(0, |p| p.records);
    }
    // The run prepared transactions are judged against.
    let reference_run = opts.run.clone().or_else(|| {
        inv.committed
            .iter()
            .map(|c| &c.handle)
            .chain(inv.staged.iter().filter_map(|s| s.prepared()))
            .max_by_key(|h| h.begun_at_ms)
            .map(|h| h.run.to_string())
    });

    // Staged transactions.
    let mut unfinished = BTreeSet::new();
    let mut staged = Vec::with_capacity(inv.staged.len());
    for s in &inv.staged {
        let txn = s.transaction.as_str();
        let age_ms = opts.now_ms.saturating_sub(s.last_activity_ms);
        // Same rule as the core's expiry scan: expired once
        // last activity + retention <= now.
        let within = s.last_activity_ms.saturating_add(opts.retention_ms) > opts.now_ms;
        let record = decided.get(txn);
        let claimed = match &s.state {
            StagedState::Committing(h) => Some(h),
            _ => None,
        };
        let h = s.prepared().or(claimed);
        let entry = StagedEntry {
            transaction: txn.to_string(),
            subtask: s.subtask,
            state: match &s.state {
                StagedState::Open => "open",
                StagedState::Prepared(_) => "prepared",
                StagedState::PreparedUnreadable { .. } => "prepared-unreadable",
                StagedState::Committing(_) => "committing",
            },
            checkpoint: h.and_then(|h| h.checkpoint()),
            run: h.map(|h| h.run.to_string()),
            lineage: h.map(|h| h.lineage.to_string()),
            records: h.and_then(|h| h.prepared()).map(|p| p.records),
            last_activity_ms: s.last_activity_ms,
            age_ms,
            within_retention: within,
            commit_decided: record.is_some() || claimed.is_some(),
        };
        let retention_text = format!(
            "last activity {} ago, past the retention of {}",
            duration(age_ms),
            duration(opts.retention_ms)
        );
        let staging_dir = match &s.state {
            // A visible-first commit's link whose claim a power loss took
            // back is still in `staging/`.
            StagedState::Committing(_)
                if layout.committing.join(s.transaction.as_str()).exists() =>
            {
                layout.committing.join(s.transaction.as_str())
            }
            _ => layout.staging_dir(&s.transaction),
        };
        let finding = if let (Some(h), None) = (claimed, record) {
            unfinished.insert(txn.to_string());
            Some(Finding::new(
                "commit-unfinished",
                Some(sink),
                format!(
                    "transaction {txn} (checkpoint {}) was claimed for commit, but the commit \
                     was interrupted before it was recorded (a visible-first commit may have \
                     published its output already). Restart the job from its latest checkpoint; \
                     recovery finishes the commit. Do not remove it or its output",
                    h.checkpoint().unwrap_or_default(),
                ),
            ))
        } else if let StagedState::PreparedUnreadable { reason } = &s.state {
            Some(Finding::new(
                "prepared-unreadable",
                Some(sink),
                format!(
                    "transaction {txn} is prepared but its prepare marker cannot be used: \
                     {reason}. Its run and checkpoint are unknown, so a job started without \
                     state stops on it. Restore the run that prepared it, or remove it by hand \
                     if its output is not wanted"
                ),
            ))
        } else if let Some(rec) = record {
            unfinished.insert(txn.to_string());
            Some(Finding::new(
                "commit-unfinished",
                Some(sink),
                format!(
                    "transaction {txn} (checkpoint {}) has a commit record but its data is not \
                     published yet: a commit was interrupted before publishing {}. Restart the \
                     job from its latest checkpoint; recovery re-commits it and finishes the \
                     publication. Do not remove {}",
                    rec.handle.checkpoint().unwrap_or_default(),
                    rec.file.as_deref().unwrap_or("its file"),
                    staging_dir.display()
                ),
            ))
        } else if let Some(h) = h {
            Some(prepared_finding(
                &PreparedContext {
                    sink,
                    destination: command_target.clone(),
                    retention_ms: opts.retention_ms,
                    reference_run: reference_run.as_deref(),
                    run_given: opts.run.is_some(),
                    checkpoints: &checkpoints,
                },
                txn,
                h,
                age_ms,
                within,
            ))
        } else if !within {
            Some(Finding::new(
                "open-past-retention",
                Some(sink),
                format!(
                    "transaction {txn} is open (never prepared, so in no checkpoint); \
                     {retention_text}. It is abandoned and will never be committed: the expiry \
                     scan of a running subtask removes it, or delete {} while no job of this \
                     sink runs",
                    staging_dir.display()
                ),
            ))
        } else {
            None
        };
        if let Some(f) = finding {
            attention.push(f.txn(txn));
        }
        staged.push(entry);
    }
    staged.sort_by(|a, b| a.transaction.cmp(&b.transaction));

    // Output of several lineages: a job started without state next to an
    // earlier run's output. Wanted only when that run chose to append (its
    // lineage record says so); otherwise every record may be there twice.
    let mut by_lineage: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for c in &inv.committed {
        let entry = by_lineage.entry(c.handle.lineage.to_string()).or_default();
        entry.0 += 1;
        entry.1 += c.handle.prepared().map_or(0, |p| p.records);
    }
    if by_lineage.len() > 1 {
        let appended: std::collections::BTreeSet<String> = inv
            .lineages
            .iter()
            .filter(|l| l.appended)
            .map(|l| l.lineage.to_string())
            .collect();
        let unasked: Vec<&String> = by_lineage
            .keys()
            .filter(|l| !appended.contains(*l))
            .collect();
        // The first lineage needs no permission; every later one does.
        if unasked.len() > 1 {
            let runs: Vec<String> = by_lineage
                .iter()
                .map(|(l, (txns, records))| {
                    let run = inv
                        .lineages
                        .iter()
                        .find(|r| r.lineage.to_string() == *l)
                        .map_or_else(|| "run unknown".to_string(), |r| format!("run {}", r.run));
                    format!("lineage {l} ({run}; {txns} transactions, {records} records)")
                })
                .collect();
            attention.push(Finding::new(
                "several-lineages",
                Some(sink),
                format!(
                    "sink '{sink}' holds committed output of {} lineages: {}. A job started \
                     without state wrote next to an earlier run's output, without the fresh-start \
                     policy APPEND: the same records may be there more than once. Keep one \
                     lineage's output (remove the other's files, listed above by transaction), \
                     or, if both runs are wanted, note that they were appended on purpose",
                    by_lineage.len(),
                    runs.join("; ")
                ),
            ));
        } else {
            notes.push(Finding::new(
                "several-lineages",
                Some(sink),
                format!(
                    "sink '{sink}' holds output of {} lineages, appended on purpose (fresh-start \
                     policy APPEND)",
                    by_lineage.len()
                ),
            ));
        }
    }

    attention.extend(lost_findings(
        sink,
        &command_target,
        &inv.lost,
        &checkpoints,
    ));

    // Problems found by the core. An interrupted commit shows up there as a
    // record whose file is missing; it is reported above with its cause.
    let mut problems = Vec::new();
    for p in &inv.problems {
        let explained = unfinished.iter().any(|t| {
            decided
                .get(t.as_str())
                .and_then(|c| c.file.as_ref())
                .is_some_and(|f| {
                    *p == format!("committed transaction {t} lists {f}, which no longer exists")
                })
        });
        if !explained {
            attention.push(Finding::new("problem", Some(sink), p.clone()));
        }
        problems.push(p.clone());
    }

    let expired = inv
        .expired
        .iter()
        .map(|(t, at)| ExpiredEntry {
            transaction: t.clone(),
            expired_at_ms: *at,
        })
        .collect();

    let scratch_files: Vec<String> = list_dir(&layout.tmp)?.into_iter().map(|(n, _)| n).collect();
    if !scratch_files.is_empty() {
        notes.push(
            Finding::new(
                "scratch-files",
                Some(sink),
                format!(
                    "{} leftover scratch file(s) in {} from interrupted atomic writes; harmless, \
                     and safe to delete while no job of this sink runs",
                    scratch_files.len(),
                    layout.tmp.display()
                ),
            )
            .file(&layout.tmp.display().to_string()),
        );
    }

    Ok((
        SinkReport {
            sink: sink.to_string(),
            reference_run,
            committed_total,
            committed_records,
            lineages,
            committed,
            staged,
            expired,
            problems,
            scratch_files,
            operations_total: inv.operations.len(),
            operations: operation_entries(&inv.operations, opts.limit),
            target: None,
        },
        attention,
        notes,
    ))
}

/// Findings about transactions the committer found LOST: their checkpoint
/// completed, so what else of it is committed is only part of it, and
/// output of later checkpoints of the lineage means the job went on past
/// the hole.
fn lost_findings(
    sink: &str,
    dir: &str,
    lost: &[twopc_core::destination::LostNote],
    checkpoints: &BTreeMap<(u64, u64), (u64, u64)>,
) -> Vec<Finding> {
    let mut attention = Vec::new();
    // Transactions the committer found LOST: their checkpoint completed, so
    // what else of it is committed is only part of it, and output of later
    // checkpoints of the lineage means the job went on past the hole.
    let mut lost_at: BTreeMap<(u64, u64), Vec<&twopc_core::destination::LostNote>> =
        BTreeMap::new();
    for n in lost {
        lost_at
            .entry((n.lineage.0, n.checkpoint))
            .or_default()
            .push(n);
    }
    for ((lineage, cp), notes) in &lost_at {
        let lineage_id = twopc_core::LineageId(*lineage);
        let lost_records: u64 = notes.iter().map(|n| n.records).fold(0, u64::saturating_add);
        let names: Vec<String> = notes
            .iter()
            .map(|n| {
                format!(
                    "{} (subtask {}, run {}, {} records, found at {}: {})",
                    n.transaction,
                    n.subtask,
                    n.run,
                    n.records,
                    twopc_core::timefmt::utc(n.found_at_ms),
                    n.evidence
                )
            })
            .collect();
        let reconcile = format!(
            "twopc reconcile {dir} --sink {sink} --lineage {lineage_id} --after-checkpoint N"
        );
        let (txns, records) = checkpoints.get(&(*lineage, *cp)).copied().unwrap_or((0, 0));
        let (kind, what) = if txns > 0 {
            (
                "partly-visible-checkpoint",
                format!(
                    "checkpoint {cp} of lineage {lineage_id} is partly visible: {txns} \
                     transaction(s) with {records} records are committed, but {} with \
                     {lost_records} records LOST: {}. Readers see only part of the checkpoint",
                    if notes.len() == 1 { "one" } else { "others" },
                    names.join("; ")
                ),
            )
        } else {
            (
                "lost",
                format!(
                    "checkpoint {cp} of lineage {lineage_id} completed, but its transaction(s) \
                     with {lost_records} records were LOST: {}",
                    names.join("; ")
                ),
            )
        };
        attention.push(
            Finding::new(
                kind,
                Some(sink),
                format!(
                    "{what}. Keep the job stopped, pick a checkpoint or savepoint N before {cp} \
                     whose input position precedes the lost records, run `{reconcile}` (a dry \
                     run; add --apply to remove what it lists), and restore the job from N"
                ),
            )
            .txn(notes[0].transaction.as_str()),
        );
        let later: Vec<u64> = checkpoints
            .range((*lineage, cp + 1)..=(*lineage, u64::MAX))
            .map(|((_, c), _)| *c)
            .collect();
        if let (Some(first), Some(last)) = (later.first(), later.last()) {
            attention.push(Finding::new(
                "checkpoint-gap",
                Some(sink),
                format!(
                    "lineage {lineage_id} has a gap: the {lost_records} records of checkpoint \
                     {cp} are lost, yet output of {} later checkpoint(s) ({first} to {last}) \
                     was committed after it, so the job went on past the hole. The same \
                     `{reconcile}` (N before {cp}) removes those too, and the restored job \
                     writes the whole range again",
                    later.len()
                ),
            ));
        }
    }
    attention
}

/// What the advice on a prepared transaction depends on.
pub(crate) struct PreparedContext<'a> {
    pub sink: &'a str,
    /// The destination as the user passes it to `twopc`.
    pub destination: String,
    pub retention_ms: u64,
    pub reference_run: Option<&'a str>,
    pub run_given: bool,
    /// Committed (transactions, records) per (lineage, checkpoint).
    pub checkpoints: &'a BTreeMap<(u64, u64), (u64, u64)>,
}

/// The finding for a transaction prepared with handle `h` and not
/// committed: past retention, of another run, of a completed (partly
/// visible) checkpoint, or plainly prepared.
pub(crate) fn prepared_finding(
    ctx: &PreparedContext<'_>,
    txn: &str,
    h: &twopc_core::TransactionHandle,
    age_ms: u64,
    within: bool,
) -> Finding {
    let sink = ctx.sink;
    let retention_text = format!(
        "last activity {} ago, past the retention of {}",
        duration(age_ms),
        duration(ctx.retention_ms)
    );
    let c = h.checkpoint().unwrap_or_default();
    let records = h.prepared().map(|p| p.records).unwrap_or(0);
    let other_run = ctx.reference_run.filter(|r| *r != h.run.as_str());
    if !within {
        Finding::new(
            "prepared-past-retention",
            Some(ctx.sink),
            format!(
                "transaction {txn} was prepared for checkpoint {c} ({records} records, \
                 run {}) and is not committed; {retention_text}. The next expiry scan of \
                 a running subtask removes it, and if checkpoint {c} completed its \
                 records are then LOST. Restart the job from its latest checkpoint now \
                 so recovery commits it, or raise the retention",
                h.run
            ),
        )
    } else if let Some(reference) = other_run {
        // Committed transactions of the same checkpoint number in the
        // lineage may be this run's (then the checkpoint completed and an
        // abort would lose records; `twopc decide` refuses it) or a later
        // run's after a rewind: say so instead of offering the abort plainly.
        let abort_advice = match ctx.checkpoints.get(&(h.lineage.0, c)) {
            Some((txns, _)) => format!(
                "`--abort {txn}` only if it did not: {txns} transaction(s) of checkpoint {c} \
                 of this lineage are committed, and if any is run {}'s the checkpoint \
                 completed (`twopc decide` then refuses the abort; if its output is not \
                 wanted, remove it first with `twopc reconcile {} --sink {sink} --lineage {} \
                 --after-checkpoint {}`)",
                h.run,
                ctx.destination,
                h.lineage,
                c.saturating_sub(1)
            ),
            None => format!(
                "`--abort {txn}` if it did not or its output is not wanted (or start with the \
                 fresh-start policy ABORT_PREPARED, which aborts every such leftover)"
            ),
        };
        Finding::new(
            "prepared-other-run",
            Some(ctx.sink),
            format!(
                "transaction {txn} was prepared for checkpoint {c} ({records} records) by \
                 run {}, not by run {reference}{}: no running job will commit it, and a \
                 job started without state stops on it. Restore run {}'s latest \
                 checkpoint or savepoint so recovery commits it; or, while no job of \
                 this sink runs, decide it by hand: `twopc decide {} --sink {sink} \
                 --commit {txn}` if checkpoint {c} of run {} completed, {abort_advice}",
                h.run,
                if ctx.run_given {
                    " (given with --run)"
                } else {
                    " (the latest run of this sink)"
                },
                h.run,
                ctx.destination,
                h.run
            ),
        )
    } else if let Some((txns, _)) = ctx.checkpoints.get(&(h.lineage.0, c)).copied() {
        Finding::new(
            "partly-visible-checkpoint",
            Some(ctx.sink),
            format!(
                "transaction {txn} was prepared for checkpoint {c} ({records} records, \
                 {} ago) and is not committed, yet {txns} other transaction(s) of \
                 checkpoint {c} are: the checkpoint completed, so it is partly visible \
                 and this transaction must be committed too, never aborted. While the \
                 job runs its committer finishes it. If the job is stopped, restart it \
                 from its latest checkpoint (recovery commits it), or commit it by hand: \
                 `twopc decide {} --sink {sink} --commit {txn}`",
                duration(age_ms),
                ctx.destination
            ),
        )
    } else {
        Finding::new(
            "prepared",
            Some(ctx.sink),
            format!(
                "transaction {txn} was prepared for checkpoint {c} ({records} records, \
                 {} ago) and is not committed. While the job runs this lasts until \
                 checkpoint {c} completes. If the job is stopped, restart it from its \
                 latest checkpoint: recovery commits it if checkpoint {c} completed and \
                 aborts it otherwise. Do not delete it by hand: if checkpoint {c} \
                 completed, these records exist nowhere else",
                duration(age_ms)
            ),
        )
    }
}

/// Adds a history segment's tally (from its name) to the counts per
/// lineage and run.
fn add_folded(lineages: &mut Vec<LineageEntry>, seg: &twopc_fs::SegmentName) {
    let lineage = seg.lineage.to_string();
    let at = match lineages.iter().position(|l| l.lineage == lineage) {
        Some(i) => i,
        None => {
            lineages.push(LineageEntry {
                lineage,
                transactions: 0,
                records: 0,
                first_checkpoint: seg.first,
                last_checkpoint: seg.last,
                runs: Vec::new(),
            });
            lineages.sort_by(|a, b| a.lineage.cmp(&b.lineage));
            lineages
                .iter()
                .position(|l| l.lineage == seg.lineage.to_string())
                .expect("just added")
        }
    };
    let l = &mut lineages[at];
    l.transactions = l.transactions.saturating_add(seg.transactions);
    l.records = l.records.saturating_add(seg.records);
    l.first_checkpoint = l.first_checkpoint.min(seg.first);
    l.last_checkpoint = l.last_checkpoint.max(seg.last);
    let run = seg.run.to_string();
    match l.runs.iter_mut().find(|r| r.run == run) {
        Some(r) => {
            r.transactions = r.transactions.saturating_add(seg.transactions);
            r.records = r.records.saturating_add(seg.records);
            r.first_checkpoint = r.first_checkpoint.min(seg.first);
            r.last_checkpoint = r.last_checkpoint.max(seg.last);
        }
        None => {
            l.runs.push(RunEntry {
                run,
                transactions: seg.transactions,
                records: seg.records,
                first_checkpoint: seg.first,
                last_checkpoint: seg.last,
            });
            l.runs
                .sort_by_key(|r| (r.first_checkpoint, r.last_checkpoint));
        }
    }
}

/// Counts per lineage and run, from a destination's tallies.
fn summarise_tallies(tallies: &[twopc_core::destination::HistoryTally]) -> Vec<LineageEntry> {
    let mut by: BTreeMap<String, Vec<RunEntry>> = BTreeMap::new();
    for t in tallies {
        by.entry(t.lineage.to_string()).or_default().push(RunEntry {
            run: t.run.to_string(),
            transactions: t.transactions,
            records: t.records,
            first_checkpoint: t.first_checkpoint,
            last_checkpoint: t.last_checkpoint,
        });
    }
    by.into_iter()
        .map(|(lineage, mut runs)| {
            runs.sort_by_key(|r| (r.first_checkpoint, r.last_checkpoint));
            LineageEntry {
                lineage,
                transactions: runs
                    .iter()
                    .map(|r| r.transactions)
                    .fold(0, u64::saturating_add),
                records: runs.iter().map(|r| r.records).fold(0, u64::saturating_add),
                first_checkpoint: runs.iter().map(|r| r.first_checkpoint).min().unwrap_or(0),
                last_checkpoint: runs.iter().map(|r| r.last_checkpoint).max().unwrap_or(0),
                runs,
            }
        })
        .collect()
}

/// Counts per lineage and run.
fn summarise(committed: &[CommittedEntry]) -> Vec<LineageEntry> {
    let mut by: BTreeMap<&str, BTreeMap<&str, RunEntry>> = BTreeMap::new();
    for c in committed {
        let e = by
            .entry(c.lineage.as_str())
            .or_default()
            .entry(c.run.as_str())
            .or_insert(RunEntry {
                run: c.run.clone(),
                transactions: 0,
                records: 0,
                first_checkpoint: c.checkpoint,
                last_checkpoint: c.checkpoint,
            });
        e.transactions += 1;
        e.records = e.records.saturating_add(c.records);
        e.first_checkpoint = e.first_checkpoint.min(c.checkpoint);
        e.last_checkpoint = e.last_checkpoint.max(c.checkpoint);
    }
    by.into_iter()
        .map(|(lineage, runs)| {
            let mut runs: Vec<RunEntry> = runs.into_values().collect();
            runs.sort_by_key(|r| (r.first_checkpoint, r.last_checkpoint));
            LineageEntry {
                lineage: lineage.to_string(),
                transactions: runs
                    .iter()
                    .map(|r| r.transactions)
                    .fold(0, u64::saturating_add),
                records: runs.iter().map(|r| r.records).fold(0, u64::saturating_add),
                first_checkpoint: runs.iter().map(|r| r.first_checkpoint).min().unwrap_or(0),
                last_checkpoint: runs.iter().map(|r| r.last_checkpoint).max().unwrap_or(0),
                runs,
            }
        })
        .collect()
}

/// True when some sink's history directory holds anything (then a summary
/// does not read every record). A cheap look, one listing per sink.
fn any_history_segments(out: &Path) -> bool {
    let control = out.join(CONTROL_DIR);
    let Ok(sinks) = fs::read_dir(&control) else {
        return false;
    };
    sinks
        .flatten()
        .any(|sink| fs::read_dir(sink.path().join("history")).is_ok_and(|mut h| h.next().is_some()))
}

/// The files among `visible` that no commit record names and that are
/// still there (a retraction removes the file before its record).
fn unreferenced_among(
    opts: &InspectOptions,
    visible: Vec<VisibleFile>,
    referenced: &BTreeSet<String>,
    in_commit: &BTreeSet<String>,
) -> Vec<VisibleFile> {
    use std::os::unix::fs::MetadataExt;
    visible
        .into_iter()
        .filter(|v| !referenced.contains(&v.file))
        .filter_map(|v| match fs::symlink_metadata(opts.output.join(&v.file)) {
            // The output of a transaction being committed (a visible-first
            // commit shows it before its record), unless the claim's data is
            // another file: then this one is what blocks the commit, and is
            // reported. A commit that finished meanwhile left no data.
            Ok(m)
                if txn_in_part_name(&v.file, &opts.part_prefix)
                    .filter(|t| in_commit.contains(t))
                    .is_some_and(|t| {
                        staged_data_inode(&opts.output, &t).is_none_or(|i| i == (m.dev(), m.ino()))
                    }) =>
            {
                None
            }
            Ok(m) if m.is_file() => Some(VisibleFile {
                bytes: m.len(),
                ..v
            }),
            _ => None,
        })
        .collect()
}

/// The (device, inode) of a transaction's staged or claimed data file, if
/// it still has one.
fn staged_data_inode(out: &Path, txn: &str) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let sink = txn.split('.').next()?;
    ["committing", "staging"].iter().find_map(|area| {
        fs::symlink_metadata(
            out.join(CONTROL_DIR)
                .join(sink)
                .join(area)
                .join(txn)
                .join("data"),
        )
        .ok()
        .map(|m| (m.dev(), m.ino()))
    })
}

/// Visible `<prefix>-*` files in the output directory.
fn visible_part_files(opts: &InspectOptions) -> Result<Vec<VisibleFile>, InspectError> {
    let prefix = format!("{}-", opts.part_prefix);
    let mut progress = Progress::new(format!("scanned entries of {}", opts.output.display()));
    let entries = fs::read_dir(&opts.output).map_err(|e| {
        InspectError(format!(
            "cannot list {}: {e}; check its permissions",
            opts.output.display()
        ))
    })?;
    let mut out = Vec::new();
    for entry in entries {
        progress.tick();
        let entry = entry
            .map_err(|e| InspectError(format!("cannot list {}: {e}", opts.output.display())))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !name.starts_with(&prefix) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        out.push(VisibleFile {
            file: name,
            bytes: meta.len(),
        });
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(out)
}

/// The transaction id in a part file name `<prefix>-<txn>[<suffix>]`, if it
/// has one.
fn txn_in_part_name(name: &str, prefix: &str) -> Option<String> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    if let Some(p) = TransactionId::parse(rest) {
        return Some(p.id.to_string());
    }
    let (stem, _suffix) = rest.rsplit_once('.')?;
    TransactionId::parse(stem).map(|p| p.id.to_string())
}

/// Names in a directory with whether each is a directory; missing is empty.
fn list_dir(dir: &Path) -> Result<Vec<(String, bool)>, InspectError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(InspectError(format!(
                "cannot list {}: {e}; check its permissions",
                dir.display()
            )))
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|e| InspectError(format!("cannot list {}: {e}", dir.display())))?;
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        names.push((entry.file_name().to_string_lossy().into_owned(), is_dir));
    }
    names.sort();
    Ok(names)
}

/// `twopc inspect` of a destination reached through the `Destination`
/// trait alone (PostgreSQL): committed transactions, prepared ones and the
/// same advice, from the facts every destination reports.
pub fn inspect_destination(
    dest: &mut dyn twopc_core::Destination,
    sink: &twopc_core::SinkId,
    destination: &str,
    opts: &InspectOptions,
) -> Result<Report, InspectError> {
    let fail = |what: &str| {
        let what = what.to_string();
        move |e: twopc_core::error::DestinationError| {
            InspectError(format!("sink '{sink}': {what} failed: {e}"))
        }
    };
    // The commands of the advice reach the control tables this inspection
    // read (its control schema and password variable).
    let command_target = match &opts.postgres {
        Some(pg) => format!(
            "{}{}",
            crate::operate::shell_word(destination),
            crate::operate::pg_connection_flags(pg)
        ),
        None => destination.to_string(),
    };
    let lineages = dest.lineages().map_err(fail("listing lineages"))?;
    let lost = dest
        .lost_notes()
        .map_err(fail("reading notes of lost transactions"))?;
    // By default only the latest checkpoints' records are read (and those
    // of checkpoints a lost note names); the counts come from the
    // destination's tallies, in time that does not grow with the history.
    // `--all` reads every record.
    let mut committed = Vec::new();
    for l in &lineages {
        // Flink numbers checkpoints from 1.
        let from = match opts.limit {
            None => 0,
            Some(_) => {
                let recent = l
                    .last_checkpoint
                    .unwrap_or_default()
                    .saturating_sub(RECENT_CHECKPOINTS);
                lost.iter()
                    .filter(|n| n.lineage == l.lineage)
                    .map(|n| n.checkpoint.saturating_sub(1))
                    .fold(recent, u64::min)
            }
        };
        for c in dest
            .committed_after(l.lineage, from)
            .map_err(fail("reading commit records"))?
        {
            committed.push(CommittedEntry {
                transaction: c.transaction.to_string(),
                lineage: c.lineage.to_string(),
                checkpoint: c.checkpoint,
                subtask: c.subtask,
                run: c.run.to_string(),
                file: None,
                file_present: false,
                records: c.records,
                bytes: 0,
                committed_at_ms: c.committed_at_ms,
            });
        }
    }
    let staged_all = dest
        .staged()
        .map_err(fail("listing prepared transactions"))?;
    // The log is for people, not for the findings: a user who may not read
    // it still gets the rest of the report.
    let (operations, operations_note) = match dest.operations() {
        Ok(o) => (o, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let name = sink.as_str();
    let mut attention = Vec::new();
    let mut notes = Vec::new();
    let mut checkpoints: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
    for c in &committed {
        let lineage = u64::from_str_radix(&c.lineage, 16).unwrap_or_default();
        let e = checkpoints.entry((lineage, c.checkpoint)).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(c.records);
    }
    let reference_run = opts.run.clone().or_else(|| {
        staged_all
            .iter()
            .filter_map(|s| s.prepared())
            .max_by_key(|h| h.begun_at_ms)
            .map(|h| h.run.to_string())
            .or_else(|| {
                committed
                    .iter()
                    .max_by_key(|c| c.committed_at_ms)
                    .map(|c| c.run.clone())
            })
    });
    attention.extend(lost_findings(name, &command_target, &lost, &checkpoints));
    let mut staged = Vec::new();
    for s in &staged_all {
        let txn = s.transaction.as_str();
        let age_ms = opts.now_ms.saturating_sub(s.last_activity_ms);
        let within = s.last_activity_ms.saturating_add(opts.retention_ms) > opts.now_ms;
        let h = match &s.state {
            StagedState::Prepared(h) | StagedState::Committing(h) => Some(h),
            _ => None,
        };
        staged.push(StagedEntry {
            transaction: txn.to_string(),
            subtask: s.subtask,
            state: match &s.state {
                StagedState::Open => "open",
                StagedState::Prepared(_) => "prepared",
                StagedState::PreparedUnreadable { .. } => "prepared-unreadable",
                StagedState::Committing(_) => "committing",
            },
            checkpoint: h.and_then(|h| h.checkpoint()),
            run: h.map(|h| h.run.to_string()),
            lineage: h.map(|h| h.lineage.to_string()),
            records: h.and_then(|h| h.prepared()).map(|p| p.records),
            last_activity_ms: s.last_activity_ms,
            age_ms,
            within_retention: within,
            commit_decided: matches!(s.state, StagedState::Committing(_)),
        });
        let finding = match &s.state {
            StagedState::Prepared(h) => prepared_finding(
                &PreparedContext {
                    sink: name,
                    destination: command_target.clone(),
                    retention_ms: opts.retention_ms,
                    reference_run: reference_run.as_deref(),
                    run_given: opts.run.is_some(),
                    checkpoints: &checkpoints,
                },
                txn,
                h,
                age_ms,
                within,
            ),
            StagedState::PreparedUnreadable { reason } => Finding::new(
                "prepared-unreadable",
                Some(name),
                format!(
                    "transaction {txn} is prepared but its handle cannot be used: {reason}. Its \
                     run and checkpoint are unknown, so a job started without state stops on \
                     it. Restore the run that prepared it, or, if its output is not wanted, \
                     `twopc decide {command_target} --sink {name} --abort {txn}`"
                ),
            ),
            StagedState::Committing(h) => Finding::new(
                "commit-unfinished",
                Some(name),
                format!(
                    "transaction {txn} (checkpoint {}) was claimed for commit and the commit did \
                     not finish. Restart the job from its latest checkpoint, or `twopc decide \
                     {command_target} --sink {name} --commit {txn}`",
                    h.checkpoint().unwrap_or_default()
                ),
            ),
            StagedState::Open => continue,
        };
        attention.push(finding.txn(txn));
    }
    let unasked: Vec<String> = lineages
        .iter()
        .filter(|l| !l.record.as_ref().is_some_and(|r| r.appended))
        .map(|l| l.lineage.to_string())
        .collect();
    if lineages.len() > 1 && unasked.len() > 1 {
        attention.push(Finding::new(
            "several-lineages",
            Some(name),
            format!(
                "sink '{name}' holds committed output of {} lineages ({}), not appended on \
                 purpose (fresh-start policy APPEND): the same records may be there more than \
                 once. Keep one lineage's output: `twopc reconcile {command_target} --sink {name} \
                 --lineage <lineage> --after-checkpoint 0` lists another's, --apply removes it",
                lineages.len(),
                unasked.join(", ")
            ),
        ));
    } else if lineages.len() > 1 {
        notes.push(Finding::new(
            "several-lineages",
            Some(name),
            format!(
                "sink '{name}' holds output of {} lineages, appended on purpose (fresh-start \
                 policy APPEND)",
                lineages.len()
            ),
        ));
    }
    if let Some(why) = operations_note {
        notes.push(Finding::new(
            "operations-log-unreadable",
            Some(name),
            format!("the operations log of sink '{name}' cannot be read: {why}"),
        ));
    }

    let (committed_total, committed_records, summary) = if opts.limit.is_none() {
        (
            committed.len(),
            committed
                .iter()
                .map(|c| c.records)
                .fold(0, u64::saturating_add),
            summarise(&committed),
        )
    } else {
        let tallies = dest
            .history_tallies()
            .map_err(fail("summing the committed history"))?;
        (
            tallies
                .iter()
                .map(|t| usize::try_from(t.transactions).unwrap_or(usize::MAX))
                .fold(0, usize::saturating_add),
            tallies
                .iter()
                .map(|t| t.records)
                .fold(0, u64::saturating_add),
            summarise_tallies(&tallies),
        )
    };
    if let Some(limit) = opts.limit {
        if committed.len() > limit {
            committed.sort_by(|a, b| {
                (b.committed_at_ms, &b.transaction).cmp(&(a.committed_at_ms, &a.transaction))
            });
            committed.truncate(limit);
        }
    }
    committed.sort_by(|a, b| {
        (&a.lineage, a.checkpoint, a.subtask, &a.transaction).cmp(&(
            &b.lineage,
            b.checkpoint,
            b.subtask,
            &b.transaction,
        ))
    });
    staged.sort_by(|a, b| a.transaction.cmp(&b.transaction));
    Ok(Report {
        output_dir: destination.to_string(),
        scanned_at_ms: opts.now_ms,
        retention_ms: opts.retention_ms,
        needs_attention: !attention.is_empty(),
        sinks: vec![SinkReport {
            sink: name.to_string(),
            reference_run,
            committed_total,
            committed_records,
            lineages: summary,
            committed,
            staged,
            expired: Vec::new(),
            problems: Vec::new(),
            scratch_files: Vec::new(),
            operations_total: operations.len(),
            operations: operation_entries(&operations, opts.limit),
            target: None,
        }],
        unreferenced_files: Vec::new(),
        attention,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_map_to_transactions() {
        assert_eq!(
            txn_in_part_name("part-orders.0.0123456789abcdef.7", "part").as_deref(),
            Some("orders.0.0123456789abcdef.7")
        );
        assert_eq!(
            txn_in_part_name("part-orders.0.0123456789abcdef.7.txt", "part").as_deref(),
            Some("orders.0.0123456789abcdef.7")
        );
        assert_eq!(txn_in_part_name("part-stray.txt", "part"), None);
        assert_eq!(txn_in_part_name("other-x", "part"), None);
    }
}
