//! Errors. Every message says what happened, to which sink, subtask,
//! checkpoint and transaction, and what the operator should do.

use std::fmt;
use std::io;

use crate::ids::{CheckpointId, LineageId, SinkId, TransactionId};

/// A configuration value that cannot work. The message names the setting
/// and what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid twopc configuration: {0}")]
pub struct ConfigError(String);

impl ConfigError {
    pub fn new(msg: impl Into<String>) -> Self {
        ConfigError(msg.into())
    }
    pub fn message(&self) -> &str {
        &self.0
    }
}

/// What kind of failure a destination reported; the protocol treats them
/// alike (the call failed, its effect is unknown) but operators need to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DestinationErrorKind {
    /// An I/O call failed.
    Io,
    /// The disk or quota is full.
    StorageFull,
    /// Data at the destination is unreadable or inconsistent.
    Corrupt,
    /// The destination cannot be reached (connection refused, closed).
    Unavailable,
    /// The destination refused the operation (constraints, a record).
    Rejected,
    /// The environment does not allow the operation and a restart will not
    /// change that: permission denied, a read-only file system, an
    /// unsupported platform or file system.
    NotPermitted,
}

/// A failed destination call. The effect of the call is unknown unless the
/// kind says otherwise: callers retry by transaction id, never assume.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct DestinationError {
    pub kind: DestinationErrorKind,
    /// Boxed, not a `String`: keeps every `Result<_, TwopcError>` small.
    pub message: Box<str>,
    /// Set when the destination can never accept one record of the call
    /// (a data error: replaying the same record fails the same way). The
    /// protocol turns it into [`TwopcError::RecordRejected`], which stops the
    /// job once instead of restarting it in a loop.
    pub record: Option<Box<RecordFault>>,
}

/// Which record a destination refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordFault {
    /// Where the record is: in the batch of the failing `write` call, or in
    /// the transaction (a fault found at `prepare`, e.g. when a COPY ends).
    pub position: RecordPosition,
    /// The column (or field) that was refused, when the destination knows.
    pub column: Option<String>,
    /// The destination's own words, e.g. PostgreSQL's message.
    pub reason: String,
    /// The first bytes of the record, escaped and with password-like values
    /// masked ([`crate::records::preview`]).
    pub preview: String,
}

/// The position of a refused record, 0-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordPosition {
    InBatch(u64),
    InTransaction(u64),
    /// The destination refused the transaction's data for certain but named
    /// no record: a check that runs after the rows went in (PostgreSQL's
    /// foreign keys and deferred constraints). Its reason names the values.
    Unknown,
}

impl DestinationError {
    pub fn new(kind: DestinationErrorKind, message: impl Into<String>) -> Self {
        DestinationError {
            kind,
            message: message.into().into_boxed_str(),
            record: None,
        }
    }

    /// A record the destination can never accept.
    pub fn record(fault: RecordFault) -> Self {
        DestinationError {
            kind: DestinationErrorKind::Rejected,
            message: format!("a record was refused: {}", fault.reason).into_boxed_str(),
            record: Some(Box::new(fault)),
        }
    }

    /// Wraps an I/O error with the operation and the path it concerned.
    pub fn io(op: &str, path: &std::path::Path, err: io::Error) -> Self {
        let kind = match err.raw_os_error() {
            _ if err.kind() == io::ErrorKind::StorageFull => DestinationErrorKind::StorageFull,
            Some(28 /* ENOSPC */) | Some(122 /* EDQUOT */) => DestinationErrorKind::StorageFull,
            Some(1 /* EPERM */) | Some(13 /* EACCES */) | Some(30 /* EROFS */) => {
                DestinationErrorKind::NotPermitted
            }
            _ => DestinationErrorKind::Io,
        };
        let hint = match kind {
            DestinationErrorKind::StorageFull => {
                " (the disk is full: free space or move the output directory, then restart the \
                 job from its last checkpoint; the transaction being written is abandoned and its \
                 records are replayed)"
            }
            DestinationErrorKind::NotPermitted => {
                " (the process may not do this here: fix the directory's permissions or mount, \
                 or choose another output directory; a restart alone would fail the same way)"
            }
            _ => "",
        };
        DestinationError::new(kind, format!("{op} {}: {err}{hint}", path.display()))
    }

    pub fn corrupt(message: impl Into<String>) -> Self {
        DestinationError::new(DestinationErrorKind::Corrupt, message)
    }
}

/// Which sink and subtask an error concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkScope {
    pub sink: SinkId,
    pub subtask: u32,
}

impl fmt::Display for SinkScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "twopc sink '{}' subtask {}", self.sink, self.subtask)
    }
}

/// The steps that bring destination and input back together after output of
/// a completed checkpoint was lost or cannot be resolved. Shared by every
/// error that stops the job, so operators read one plan; it names the
/// commands for this sink and lineage.
pub fn recovery_plan(sink: &SinkId, lineage: LineageId) -> String {
    format!(
        "Recovery plan: (1) keep the job stopped; (2) pick an earlier checkpoint or savepoint \
         N whose input position precedes the affected output; (3) reconcile the destination \
         for that range first: `twopc reconcile <destination> --sink {sink} --lineage {lineage} \
         --after-checkpoint N` lists this sink's output committed after checkpoint N (the \
         output directory, or the postgres:// URL with --table and \
         --transaction-id-column), and the same command with --apply removes it; or restore \
         with the rewind policy REPLACE_RANGE, which removes it for you; (4) restart the job \
         from checkpoint N."
    )
}

/// A prepared transaction of a completed checkpoint that the destination no
/// longer has and never committed: its output is lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostTransaction {
    pub scope: SinkScope,
    pub transaction: TransactionId,
    pub checkpoint: CheckpointId,
    pub lineage: LineageId,
    pub records: u64,
    pub evidence: String,
}

/// A commit whose outcome stayed unknown after every retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnresolvedCommit {
    pub scope: SinkScope,
    pub transaction: TransactionId,
    pub checkpoint: CheckpointId,
    pub lineage: LineageId,
    pub attempts: u32,
    pub last_error: String,
}

/// The restored checkpoint is older than output this sink already committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RewindDetected {
    pub scope: SinkScope,
    pub restored_checkpoint: CheckpointId,
    pub lineage: LineageId,
    /// (transaction, checkpoint) pairs committed after the restored checkpoint.
    pub committed_after: Vec<(TransactionId, CheckpointId)>,
}

/// A record that the destination can never accept. A restart would replay
/// the same record and fail the same way, so the job stops once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedRecord {
    pub scope: SinkScope,
    pub transaction: TransactionId,
    /// The checkpoint being prepared when the fault was found at prepare;
    /// `None` when it was found at write (no checkpoint yet).
    pub checkpoint: Option<CheckpointId>,
    /// 0-based position of the record in its transaction; `None` when the
    /// destination named none ([`RecordPosition::Unknown`]).
    pub position: Option<u64>,
    pub column: Option<String>,
    pub reason: String,
    pub preview: String,
}

/// A job started without state found committed output of this sink from
/// other lineages (earlier runs): appending would write every record again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingOutput {
    pub scope: SinkScope,
    /// The lineages found, each with its runs, its last checkpoint and some
    /// of its transactions.
    pub lineages: Vec<crate::destination::LineageSummary>,
    /// Set when the job restored this checkpoint but the sink had no state
    /// in it (see [`WITHOUT_STATE_HINT`]).
    pub restored_without_state: Option<CheckpointId>,
}

/// Said when a restore gave the sink no state at all, so it started as a
/// fresh start would.
const WITHOUT_STATE_HINT: &str = "(The job restored checkpoint {cp}, but the sink has no \
state in it: if its operator uid or its sink id changed since that checkpoint was taken, or \
--allowNonRestoredState dropped its state, restore again with the previous uid and sink id; \
that restore commits the prepared transactions and continues the output.)";

fn without_state_hint(checkpoint: Option<CheckpointId>) -> String {
    match checkpoint {
        Some(cp) => format!(" {}", WITHOUT_STATE_HINT.replace("{cp}", &cp.to_string())),
        None => String::new(),
    }
}

/// Another live run (or another sink of this job) owns this sink id and
/// subtask at the destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnershipConflict {
    pub scope: SinkScope,
    pub ours: crate::destination::OwnerClaim,
    pub holder: crate::destination::OwnerInfo,
    /// What the holder is, in words, and what to do.
    pub diagnosis: String,
    /// False when the holder is an earlier attempt of this same run that is
    /// still shutting down: a restart will find the share free.
    pub fatal: bool,
}

/// A job started without state under a Flink job id that already committed
/// output of this sink: a new execution reusing the job id, not a restart of
/// the earlier one (which restores its latest completed checkpoint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReusedJobId {
    pub scope: SinkScope,
    /// The job id's own lineage, with the output committed in it.
    pub output: crate::destination::LineageSummary,
    /// See [`ExistingOutput::restored_without_state`].
    pub restored_without_state: Option<CheckpointId>,
    /// True when the job id is known from an earlier execution that
    /// restored a checkpoint or savepoint of `output`'s lineage (noted as
    /// the job id's lineage), rather than from output committed under the
    /// job id's own lineage.
    pub restored_earlier: bool,
}

/// A job started without state found prepared transactions of this sink,
/// or commits of an earlier run that were decided but did not finish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedOnFreshStart {
    pub scope: SinkScope,
    /// (transaction, checkpoint it was prepared for). Empty when the
    /// fresh-start policy aborts prepared leftovers.
    pub prepared: Vec<(TransactionId, CheckpointId)>,
    /// Commits of another run that were decided (their checkpoints
    /// completed) but did not finish, whatever the policy: they can only be
    /// finished, and finishing them extends the visible output that the
    /// new job's start position was chosen against.
    pub decided: Vec<(TransactionId, CheckpointId)>,
    /// See [`ExistingOutput::restored_without_state`].
    pub restored_without_state: Option<CheckpointId>,
}

#[derive(Debug, thiserror::Error)]
pub enum TwopcError {
    #[error(transparent)]
    Config(#[from] ConfigError),

    #[error("{scope}: checkpoint state could not be read: {source}. The state was written by another program, truncated or corrupted; nothing was changed at the destination. Restore from another checkpoint or savepoint.")]
    State {
        scope: SinkScope,
        #[source]
        source: crate::handle::HandleError,
    },

    #[error("{scope}: {source}")]
    Batch {
        scope: SinkScope,
        #[source]
        source: crate::records::BatchError,
    },

    #[error("{scope}: {action} transaction {transaction} failed: {source}. {consequence}")]
    Destination {
        scope: SinkScope,
        action: &'static str,
        transaction: TransactionId,
        consequence: &'static str,
        #[source]
        source: DestinationError,
    },

    #[error("{scope}: {action} failed: {source}")]
    Scan {
        scope: SinkScope,
        action: &'static str,
        #[source]
        source: DestinationError,
    },

    #[error("{}", lost_message(.0))]
    Lost(Box<LostTransaction>),

    #[error("{}", unresolved_message(.0))]
    CommitUnresolved(Box<UnresolvedCommit>),

    #[error("{}", rewind_message(.0))]
    Rewind(Box<RewindDetected>),

    #[error("{}", fresh_start_message(.0))]
    PreparedOnFreshStart(Box<PreparedOnFreshStart>),

    #[error("{}", rejected_record_message(.0))]
    RecordRejected(Box<RejectedRecord>),

    #[error("{}", existing_output_message(.0))]
    ExistingOutputOnFreshStart(Box<ExistingOutput>),

    #[error("{}", reused_job_id_message(.0))]
    JobIdReusedOnFreshStart(Box<ReusedJobId>),

    #[error("{}", ownership_message(.0))]
    OwnedElsewhere(Box<OwnershipConflict>),

    #[error("{scope}: protocol misuse: {message}")]
    Protocol { scope: SinkScope, message: String },
}

/// The kinds of [`TwopcError`], for callers that act on the kind: the JNI
/// bridge picks the Java exception class with an exhaustive match on it, and
/// the CLI prints [`ErrorKind::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Settings that cannot work, or an environment that refuses the sink
    /// (permissions, a read-only file system): fatal.
    Config,
    /// Unreadable checkpoint state, or inconsistent control data at the
    /// destination: fatal.
    State,
    /// A malformed record batch from the caller (a bug).
    Batch,
    /// A destination call failed; a restart retries it.
    Destination,
    Lost,
    Unresolved,
    Rewind,
    /// A start without state refused: prepared leftovers, or committed
    /// output of earlier runs.
    FreshStart,
    /// A record the destination can never accept: fatal.
    Record,
    /// Another run or sink owns this sink id at the destination (fatal), or
    /// an earlier attempt still does (retryable).
    Ownership,
    /// A call the protocol does not allow in the current state.
    Protocol,
}

impl ErrorKind {
    /// A short stable name, e.g. for JSON output.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Config => "config",
            ErrorKind::State => "state",
            ErrorKind::Batch => "batch",
            ErrorKind::Destination => "destination",
            ErrorKind::Lost => "lost",
            ErrorKind::Unresolved => "unresolved",
            ErrorKind::Rewind => "rewind",
            ErrorKind::FreshStart => "fresh-start",
            ErrorKind::Record => "record",
            ErrorKind::Ownership => "ownership",
            ErrorKind::Protocol => "protocol",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl TwopcError {
    /// True when restarting the job would not help and could make things
    /// worse: the job must stop and an operator must decide.
    pub fn is_fatal(&self) -> bool {
        match self {
            TwopcError::Lost(_)
            | TwopcError::CommitUnresolved(_)
            | TwopcError::Rewind(_)
            | TwopcError::PreparedOnFreshStart(_)
            | TwopcError::ExistingOutputOnFreshStart(_)
            | TwopcError::JobIdReusedOnFreshStart(_)
            | TwopcError::State { .. }
            | TwopcError::Config(_)
            | TwopcError::RecordRejected(_) => true,
            TwopcError::OwnedElsewhere(c) => c.fatal,
            // A transaction's own failure is cured by a restart, which
            // replays its records; damaged control data met by a scan is
            // not, and neither is an environment that refuses the sink.
            TwopcError::Destination { source, .. } => {
                source.kind == DestinationErrorKind::NotPermitted
            }
            TwopcError::Scan { source, .. } => matches!(
                source.kind,
                DestinationErrorKind::NotPermitted | DestinationErrorKind::Corrupt
            ),
            TwopcError::Batch { .. } | TwopcError::Protocol { .. } => false,
        }
    }

    /// The kind of error (exhaustive, for callers that act on it).
    pub fn kind(&self) -> ErrorKind {
        match self {
            TwopcError::Config(_) => ErrorKind::Config,
            TwopcError::State { .. } => ErrorKind::State,
            TwopcError::Batch { .. } => ErrorKind::Batch,
            TwopcError::Destination { source, .. } | TwopcError::Scan { source, .. }
                if source.kind == DestinationErrorKind::NotPermitted =>
            {
                ErrorKind::Config
            }
            TwopcError::Scan { source, .. } if source.kind == DestinationErrorKind::Corrupt => {
                ErrorKind::State
            }
            TwopcError::Destination { .. } | TwopcError::Scan { .. } => ErrorKind::Destination,
            TwopcError::Lost(_) => ErrorKind::Lost,
            TwopcError::CommitUnresolved(_) => ErrorKind::Unresolved,
            TwopcError::Rewind(_) => ErrorKind::Rewind,
            TwopcError::PreparedOnFreshStart(_)
            | TwopcError::ExistingOutputOnFreshStart(_)
            | TwopcError::JobIdReusedOnFreshStart(_) => ErrorKind::FreshStart,
            TwopcError::RecordRejected(_) => ErrorKind::Record,
            TwopcError::OwnedElsewhere(_) => ErrorKind::Ownership,
            TwopcError::Protocol { .. } => ErrorKind::Protocol,
        }
    }
}

fn lost_message(l: &LostTransaction) -> String {
    format!(
        "{}: transaction {} of completed checkpoint {} (lineage {}, {} records) is LOST: {}. \
         The checkpoint already advanced the input past these records, so restarting from it \
         would skip them; the job is stopped instead of continuing with a gap. {}",
        l.scope,
        l.transaction,
        l.checkpoint,
        l.lineage,
        l.records,
        l.evidence,
        recovery_plan(&l.scope.sink, l.lineage)
    )
}

fn unresolved_message(u: &UnresolvedCommit) -> String {
    format!(
        "{}: commit of transaction {} (checkpoint {}) has an unknown outcome after {} attempts; \
         last error: {}. It may or may not have landed, so the job is stopped rather than \
         guessing. Make the destination reachable and restart from the latest checkpoint: \
         recovery re-commits {} by its id. If the destination lost it, {}",
        u.scope,
        u.transaction,
        u.checkpoint,
        u.attempts,
        u.last_error,
        u.transaction,
        recovery_plan(&u.scope.sink, u.lineage)
    )
}

fn rewind_message(r: &RewindDetected) -> String {
    let list = describe_pairs(&r.committed_after);
    format!(
        "{}: restored checkpoint {} (lineage {}) is older than output this sink already \
         committed: {}. Replaying from it would write that output a second time. Either restore \
         the latest checkpoint instead; or remove that output first, while the job is stopped: \
         `twopc reconcile <destination> --sink {} --lineage {} --after-checkpoint {}` lists it \
         and the same command with --apply removes it; or set the rewind policy to \
         REPLACE_RANGE so the sink removes output committed after checkpoint {} and the re-run \
         replaces it.",
        r.scope,
        r.restored_checkpoint,
        r.lineage,
        list,
        r.scope.sink,
        r.lineage,
        r.restored_checkpoint,
        r.restored_checkpoint
    )
}

fn fresh_start_message(p: &PreparedOnFreshStart) -> String {
    if p.decided.is_empty() {
        return prepared_on_fresh_start_message(p);
    }
    let newest = p.decided.iter().map(|(_, c)| *c).max().unwrap_or_default();
    let mut message = format!(
        "{}: the job started without restored state, but commits of an earlier run of this sink \
         were decided (their checkpoints completed) and did not finish: {}. Their records may \
         not be visible yet and exist nowhere else, so they are never aborted, whatever the \
         fresh-start policy; once finished they are part of the output, and a job that replays \
         its input from the end of the output as it looked before would write them twice. \
         Finish them first: restore a checkpoint or savepoint of that run no older than \
         checkpoint {newest} (its recovery finishes them and the job continues after them; an \
         older one is refused as a rewind); or, while the job is stopped, run `twopc decide \
         <destination> --sink {} --commit <transaction>` for each of them, then choose this \
         job's start position against the output as it is then, and start it again.",
        p.scope,
        describe_pairs(&p.decided),
        p.scope.sink,
    );
    if !p.prepared.is_empty() {
        message.push_str(&format!(
            " Besides, prepared, uncommitted transactions of this sink are staged: {}; `twopc \
             inspect <destination>` shows them, and the same restore commits those of completed \
             checkpoints.",
            describe_pairs(&p.prepared)
        ));
    }
    message.push_str(&without_state_hint(p.restored_without_state));
    message
}

fn prepared_on_fresh_start_message(p: &PreparedOnFreshStart) -> String {
    let list = describe_pairs(&p.prepared);
    format!(
        "{}: the job started without restored state but the destination holds prepared, \
         uncommitted transactions of this sink: {}. They may belong to a completed checkpoint of \
         an earlier run whose state was lost, so they are not aborted silently. Choose one: \
         restore the earlier run's latest checkpoint or savepoint (its recovery commits them); \
         or decide each by hand while the job is stopped (`twopc inspect <destination>` shows \
         them): `twopc decide <destination> --sink {} --commit {}` if its checkpoint completed, \
         `--abort` instead if not, then choose this job's start position against the output as \
         it is then; or, if their output is not wanted, set the fresh-start policy to \
         ABORT_PREPARED and start again.{}",
        p.scope,
        list,
        p.scope.sink,
        p.prepared
            .first()
            .map_or("<transaction>", |(t, _)| t.as_str()),
        without_state_hint(p.restored_without_state)
    )
}

fn rejected_record_message(r: &RejectedRecord) -> String {
    let when = match r.checkpoint {
        Some(c) => format!("while preparing it for checkpoint {c}"),
        None => "while writing".to_string(),
    };
    let column = match &r.column {
        Some(c) => format!(", column {c}"),
        None => String::new(),
    };
    let (which, begins, replay) = match r.position {
        Some(p) => (
            format!("record #{p}"),
            format!("The record begins: {}.", r.preview),
            "A restart would replay the same record and fail again",
        ),
        None => (
            "a record".to_string(),
            "The destination did not say which record it was: its words above name the check, \
             and may name the values."
                .to_string(),
            "A restart would replay the same records and meet the same check",
        ),
    };
    format!(
        "{}: the destination refused {which} of transaction {} ({when}{column}): {}. {begins} \
         {replay}, so the job is stopped instead of restarting in a loop; nothing of this \
         transaction becomes visible. Filter or fix such records before the sink, then restart \
         from the latest checkpoint.",
        r.scope, r.transaction, r.reason
    )
}

fn reused_job_id_message(r: &ReusedJobId) -> String {
    let l = &r.output;
    let last = match l.last_checkpoint {
        Some(c) => format!(", the last for checkpoint {c}"),
        None => String::new(),
    };
    let (what, why) = if r.restored_earlier {
        (
            format!(
                "an earlier execution with the same Flink job id restored a checkpoint or \
                 savepoint of lineage {} ({} committed transactions{last})",
                l.lineage, l.committed
            ),
            "An execution that restored state restarts with state, never without",
        )
    } else {
        (
            format!(
                "this sink already committed output under the same Flink job id: lineage {} \
                 ({} committed transactions{last})",
                l.lineage, l.committed
            ),
            "A job restarts without state only before its first checkpoint completes, and \
             nothing is committed before that",
        )
    };
    format!(
        "{}: the job started without restored state, but {what}. {why}, so this is a new \
         execution that reuses the job id (application \
         mode with high availability derives it from `high-availability.cluster-id`, and \
         `$internal.pipeline.job-id` fixes it). Starting would replay records next to that \
         output, and would take the earlier execution's prepared transactions for this one's \
         own and abort them, even those of its completed checkpoints. Nothing was changed. \
         Choose one: restore the earlier execution's latest checkpoint or savepoint, so the \
         output continues where it stopped; or start with a job id of its own (another \
         `high-availability.cluster-id`, or no fixed job id), and the fresh-start policy \
         then treats that output as any earlier run's.{}",
        r.scope,
        without_state_hint(r.restored_without_state)
    )
}

fn existing_output_message(e: &ExistingOutput) -> String {
    let lineages = e
        .lineages
        .iter()
        .map(|l| {
            let runs = l
                .runs
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let last = match l.last_checkpoint {
                Some(c) => format!(
                    "last checkpoint {c} ({})",
                    l.last_transactions
                        .iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => "no checkpoint".to_string(),
            };
            format!(
                "lineage {} (runs {}; {} committed transactions; {last})",
                l.lineage,
                if runs.is_empty() { "unknown" } else { &runs },
                l.committed
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "{}: the job started without restored state, but the destination already holds output \
         this sink committed in earlier runs: {lineages}. Starting a new run here would write \
         every record again next to that output. Choose one: restore the earlier run's latest \
         checkpoint or savepoint (its run and last checkpoint are named above), so the job \
         continues where it stopped; or remove that output first (`twopc inspect <destination>` \
         lists it, and `twopc reconcile <destination> --sink {} --lineage <lineage> \
         --after-checkpoint 0 --apply` removes one lineage's output); or, if a new run should add its output next to the old one, set the \
         fresh-start policy to APPEND (or APPEND_AND_ABORT_PREPARED) and start again.{}",
        e.scope,
        e.scope.sink,
        without_state_hint(e.restored_without_state)
    )
}

fn ownership_message(c: &OwnershipConflict) -> String {
    format!(
        "{}: this run ({}, attempt {}) cannot own the sink's share for subtask {} at the \
         destination: {}. {}",
        c.scope, c.ours.run, c.ours.attempt, c.ours.subtask, c.holder.holder, c.diagnosis
    )
}

fn describe_pairs(pairs: &[(TransactionId, CheckpointId)]) -> String {
    const SHOWN: usize = 10;
    let mut s = pairs
        .iter()
        .take(SHOWN)
        .map(|(t, c)| format!("{t} (checkpoint {c})"))
        .collect::<Vec<_>>()
        .join(", ");
    if pairs.len() > SHOWN {
        s.push_str(&format!(" and {} more", pairs.len() - SHOWN));
    }
    s
}
