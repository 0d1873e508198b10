//! What an operator's tool may change at a sink's destination, and when:
//! the rules behind `twopc reconcile` and `twopc decide`.
//!
//! * **Only while no run writes.** The tool first holds the ownership of
//!   every subtask share of the sink that a run ever claimed there, and of
//!   subtask 0 (every run has one): a live run refuses the tool, and a run
//!   that starts while the tool works is refused at its claim (see
//!   `recovery`, which tells the tool's claim apart by [`OPERATOR_RUN`] and
//!   waits for it).
//! * **Reconcile** removes this sink's output committed after checkpoint N
//!   of one lineage: exactly what a restore of checkpoint N would write
//!   again, the same set rewind detection finds and `REPLACE_RANGE`
//!   retracts. Repeatable: what is gone is not listed again.
//! * **Decide** resolves one staged transaction by hand. A commit goes
//!   through the committer (the same operation as a recovery commit, so a
//!   repeat answers "already committed"). What may be decided follows the
//!   recovery rules: a transaction whose commit was decided is only ever
//!   committed; one never prepared, or whose handle cannot be read, is
//!   never committed; committed output is never aborted, nor is a prepared
//!   transaction whose checkpoint a transaction of the same run and
//!   checkpoint, committed or claimed for commit, shows completed (see
//!   `committed_sibling`).

use crate::clock::Clock;
use crate::committer::{CommitOutcome, Committer};
use crate::config::RetryPolicy;
use crate::destination::{
    AbortStatus, CommittedTransaction, Destination, LostNote, OperationRecord, OwnerClaim,
    Ownership, StagedState, StagedTransaction,
};
use crate::error::{DestinationError, DestinationErrorKind, SinkScope, TwopcError};
use crate::handle::TransactionHandle;
use crate::ids::{CheckpointId, LineageId, RunId, SinkId, TransactionId};

/// The run id an operator's tool claims ownership with. Runs that meet it
/// know that a tool, not another job, holds the sink.
pub const OPERATOR_RUN: &str = "twopc-cli";

/// Whether a claim is an operator tool's.
pub fn is_operator_claim(claim: &OwnerClaim) -> bool {
    claim.run.as_str() == OPERATOR_RUN
}

/// Why an operator's command did not (fully) run. Every message names the
/// sink, what was found and what to do.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error(
        "sink '{sink}' is owned by a live run at this destination: subtask {subtask} is held by \
         {holder}. `twopc {command}` changes nothing while a run of the sink may write: stop the \
         job (stop-with-savepoint or cancel) and run the command again"
    )]
    Owned {
        sink: SinkId,
        subtask: u32,
        holder: String,
        command: &'static str,
    },
    #[error("sink '{sink}': {action} failed: {source}. {consequence}")]
    Destination {
        sink: SinkId,
        action: String,
        consequence: &'static str,
        #[source]
        source: DestinationError,
    },
    #[error("sink '{sink}': {message}")]
    Refused { sink: SinkId, message: String },
    #[error(transparent)]
    Protocol(#[from] TwopcError),
}

fn dest_err(
    sink: &SinkId,
    action: impl Into<String>,
    consequence: &'static str,
) -> impl FnOnce(DestinationError) -> OperatorError {
    let (sink, action) = (sink.clone(), action.into());
    move |source| OperatorError::Destination {
        sink,
        action,
        consequence,
        source,
    }
}

/// How often a held share is asked for again while waiting.
const HOLD_POLL_MS: u64 = 100;

/// Takes ownership of every subtask share of `sink` that a run ever claimed
/// at `dest`, and of subtask 0; held until `dest` is dropped. A share held
/// by someone else is asked for again for up to `wait_ms` (a run that is
/// stopping releases it), then refused. Returns the subtasks held.
/// `command` names the tool's command for messages.
pub fn hold_sink<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    sink: &SinkId,
    instance: u64,
    wait_ms: u64,
    command: &'static str,
) -> Result<Vec<u32>, OperatorError> {
    let deadline = clock.now_ms().saturating_add(wait_ms);
    loop {
        match hold_once(dest, sink, instance, command) {
            Err(OperatorError::Owned { .. }) if clock.now_ms() < deadline => {
                clock.sleep_ms(HOLD_POLL_MS)
            }
            other => return other,
        }
    }
}

fn hold_once<D: Destination>(
    dest: &mut D,
    sink: &SinkId,
    instance: u64,
    command: &'static str,
) -> Result<Vec<u32>, OperatorError> {
    let mut subtasks = dest.owner_subtasks().map_err(dest_err(
        sink,
        "listing the sink's owners",
        "Nothing was changed.",
    ))?;
    subtasks.push(0);
    subtasks.sort_unstable();
    subtasks.dedup();
    let run = RunId::new(OPERATOR_RUN).expect("a valid run id");
    for &subtask in &subtasks {
        let claim = OwnerClaim {
            sink: sink.clone(),
            subtask,
            run: run.clone(),
            attempt: 0,
            instance,
        };
        match dest.claim_ownership(&claim).map_err(dest_err(
            sink,
            format!("claiming subtask {subtask}'s share"),
            "Nothing was changed.",
        ))? {
            Ownership::Acquired => {}
            Ownership::HeldBy(info) => {
                let holder = match &info.claim {
                    Some(c) if is_operator_claim(c) => format!(
                        "another twopc command ({}); wait for it to finish",
                        info.holder
                    ),
                    _ => info.holder,
                };
                return Err(OperatorError::Owned {
                    sink: sink.clone(),
                    subtask,
                    holder,
                    command,
                });
            }
        }
    }
    Ok(subtasks)
}

/// What `twopc reconcile` removes: this sink's output committed after
/// `after` in `lineage`, oldest first.
#[derive(Clone, Debug)]
pub struct ReconcilePlan {
    pub sink: SinkId,
    pub lineage: LineageId,
    pub after: CheckpointId,
    pub transactions: Vec<CommittedTransaction>,
    /// Lineages with committed output of this sink (to name them when
    /// `lineage` has none).
    pub lineages: Vec<LineageId>,
    /// Notes of transactions of `lineage` after `after` that the
    /// destination lost: cleared by the apply, since the restored run
    /// writes that range again.
    pub lost: Vec<LostNote>,
    /// Checkpoints of `lineage` at or before `after` with notes of lost
    /// transactions: a restore of `after` does not write them again.
    pub lost_not_after: Vec<CheckpointId>,
    /// False only when the destination can tell that `lineage` never ran
    /// here: no output, no notes, no record of its start or of a run of
    /// it. Most likely mistyped.
    pub lineage_known: bool,
}

impl ReconcilePlan {
    pub fn records(&self) -> u64 {
        self.transactions
            .iter()
            .map(|c| c.records)
            .fold(0, u64::saturating_add)
    }
}

/// Lists what a reconcile would remove; changes nothing.
pub fn reconcile_plan<D: Destination>(
    dest: &mut D,
    sink: &SinkId,
    lineage: LineageId,
    after: CheckpointId,
) -> Result<ReconcilePlan, OperatorError> {
    let lineages: Vec<LineageId> = dest
        .lineages()
        .map_err(dest_err(sink, "listing lineages", "Nothing was changed."))?
        .into_iter()
        .map(|l| l.lineage)
        .collect();
    // A commit decided in the range but not finished is output of it too
    // (its records become visible when anything finishes it, and nothing
    // may abort it): finished first by hand, it is then removed with the
    // rest. Left alone, a later start would finish it over the re-run's
    // output.
    let decided: Vec<(TransactionId, CheckpointId)> = dest
        .staged()
        .map_err(dest_err(
            sink,
            "listing staged transactions",
            "Nothing was changed.",
        ))?
        .into_iter()
        .filter_map(|s| match s.state {
            StagedState::Committing(h)
                if h.lineage == lineage && h.checkpoint().is_some_and(|c| c > after) =>
            {
                Some((s.transaction, h.checkpoint().unwrap_or_default()))
            }
            _ => None,
        })
        .collect();
    if let Some((first, _)) = decided.first() {
        let list: Vec<String> = decided
            .iter()
            .map(|(t, c)| format!("{t} (checkpoint {c})"))
            .collect();
        return Err(OperatorError::Refused {
            sink: sink.clone(),
            message: format!(
                "commits after checkpoint {after} of lineage {lineage} were decided but did not \
                 finish: {}. They cannot be aborted; finish each first with `twopc decide \
                 <destination> --sink {sink} --commit {first}` (and the same for the others), \
                 then run this command again, which then removes them with the rest. Nothing was \
                 changed",
                list.join(", ")
            ),
        });
    }
    let mut transactions = dest.committed_after(lineage, after).map_err(dest_err(
        sink,
        format!("reading commit records of lineage {lineage} after checkpoint {after}"),
        "Nothing was changed.",
    ))?;
    transactions
        .sort_by(|a, b| (a.checkpoint, &a.transaction).cmp(&(b.checkpoint, &b.transaction)));
    let (lost, not_after): (Vec<LostNote>, Vec<LostNote>) = dest
        .lost_notes()
        .map_err(dest_err(
            sink,
            "reading the notes of lost transactions",
            "Nothing was changed.",
        ))?
        .into_iter()
        .filter(|n| n.lineage == lineage)
        .partition(|n| n.checkpoint > after);
    let mut lost_not_after: Vec<CheckpointId> = not_after.iter().map(|n| n.checkpoint).collect();
    lost_not_after.sort_unstable();
    lost_not_after.dedup();
    let lineage_known = !transactions.is_empty()
        || lineages.contains(&lineage)
        || !lost.is_empty()
        || !lost_not_after.is_empty()
        || dest.lineage_recorded(lineage).map_err(dest_err(
            sink,
            "looking up the lineage",
            "Nothing was changed.",
        ))? != Some(false);
    Ok(ReconcilePlan {
        sink: sink.clone(),
        lineage,
        after,
        transactions,
        lineages,
        lost,
        lost_not_after,
        lineage_known,
    })
}

/// Removes the output and commit record of every transaction of `plan`,
/// calling `done` after each. Stops at the first failure; what was removed
/// stays removed and a repeat lists only the rest.
pub fn reconcile_apply<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    by: &str,
    plan: &ReconcilePlan,
    mut done: impl FnMut(&CommittedTransaction),
) -> Result<(), OperatorError> {
    for c in &plan.transactions {
        // Logged before the removal: a removal is never missing from the log.
        log_operation(
            dest,
            &plan.sink,
            OperationRecord {
                at_ms: clock.now_ms(),
                command: "reconcile".to_string(),
                transaction: Some(c.transaction.clone()),
                what: format!(
                    "removing the output of transaction {} (checkpoint {}, {} records) committed \
                     after checkpoint {} of lineage {}",
                    c.transaction, c.checkpoint, c.records, plan.after, plan.lineage
                ),
                by: by.to_string(),
            },
            "The transactions listed before it are removed, this one is not; run the same \
             command again once the log can be written.",
        )?;
        log::warn!(
            "twopc sink '{}': reconcile after checkpoint {} of lineage {}: removing the output of \
             transaction {} (checkpoint {}, {} records)",
            plan.sink,
            plan.after,
            plan.lineage,
            c.transaction,
            c.checkpoint,
            c.records
        );
        dest.retract(c).map_err(dest_err(
            &plan.sink,
            format!(
                "removing the output of transaction {} (checkpoint {})",
                c.transaction, c.checkpoint
            ),
            "The transactions listed before it are removed; run the same command again to \
             remove the rest.",
        ))?;
        done(c);
    }
    dest.clear_lost(plan.lineage, plan.after).map_err(dest_err(
        &plan.sink,
        format!(
            "removing the notes of lost transactions of lineage {} after checkpoint {}",
            plan.lineage, plan.after
        ),
        "The output is removed; run the same command again to clear the notes.",
    ))?;
    // The removals stand whether or not the closing entry reaches the log
    // (each was logged before it was made).
    if let Err(e) = log_operation(
        dest,
        &plan.sink,
        OperationRecord {
            at_ms: clock.now_ms(),
            command: "reconcile".to_string(),
            transaction: None,
            what: format!(
                "removed the output of {} transactions committed after checkpoint {} of lineage \
                 {}",
                plan.transactions.len(),
                plan.after,
                plan.lineage
            ),
            by: by.to_string(),
        },
        "The output is removed; only the log's closing entry is missing.",
    ) {
        log::warn!("{e}");
    }
    Ok(())
}

/// Writes `record` to the destination's operations log.
fn log_operation<D: Destination>(
    dest: &mut D,
    sink: &SinkId,
    record: OperationRecord,
    consequence: &'static str,
) -> Result<(), OperatorError> {
    dest.record_operation(&record).map_err(dest_err(
        sink,
        format!("writing the operations log ({})", record.what),
        consequence,
    ))
}

/// An operator's decision on a staged transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Commit,
    Abort,
}

/// What a decision came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decided {
    /// Made visible now.
    Committed,
    /// It held no records; nothing was published, its id was released.
    CommittedEmpty,
    /// Already committed (by an earlier decision or run): nothing changed.
    AlreadyCommitted,
    /// Its staged data was removed.
    Aborted,
    /// Nothing is staged under that id and it is not committed (aborted or
    /// expired earlier): nothing changed.
    NothingStaged,
}

impl Decided {
    /// In words, for the operations log.
    pub fn describe(self) -> &'static str {
        match self {
            Decided::Committed => "committed, output visible",
            Decided::CommittedEmpty => "committed, it held no records",
            Decided::AlreadyCommitted => "already committed, nothing changed",
            Decided::Aborted => "aborted, staged data removed",
            Decided::NothingStaged => "nothing staged under that id, nothing changed",
        }
    }
}

/// Commits or aborts one staged transaction of `sink` by hand (see the
/// module docs for what is refused). The destination's operations log gets
/// the request before anything is done, and the outcome after, as `by`.
#[allow(clippy::too_many_arguments)]
pub fn decide<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    sink: &SinkId,
    txn: &TransactionId,
    decision: Decision,
    retry: RetryPolicy,
    by: &str,
) -> Result<Decided, OperatorError> {
    let record = |what: String| OperationRecord {
        at_ms: clock.now_ms(),
        command: "decide".to_string(),
        transaction: Some(txn.clone()),
        what,
        by: by.to_string(),
    };
    let verb = match decision {
        Decision::Commit => "commit",
        Decision::Abort => "abort",
    };
    log_operation(
        dest,
        sink,
        record(format!("{verb} requested")),
        "Nothing was changed.",
    )?;
    let result = decide_now(dest, clock, sink, txn, decision, retry);
    let outcome = match &result {
        Ok(decided) => format!("{verb}: {}", decided.describe()),
        Err(e) => format!("{verb} not done: {e}"),
    };
    // The decision stands whether or not its outcome reaches the log: say so
    // rather than hide what was done behind the log's failure.
    if let Err(e) = log_operation(
        dest,
        sink,
        record(outcome),
        "The decision was carried out as reported; only the log's entry of its outcome is missing.",
    ) {
        log::warn!("{e}");
    }
    result
}

fn decide_now<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    sink: &SinkId,
    txn: &TransactionId,
    decision: Decision,
    retry: RetryPolicy,
) -> Result<Decided, OperatorError> {
    let refuse = |message: String| OperatorError::Refused {
        sink: sink.clone(),
        message,
    };
    let Some(parsed) = TransactionId::parse(txn.as_str()) else {
        return Err(refuse(format!(
            "{txn} is not a twopc transaction id (they read <sink>.<subtask>.<nonce>.<sequence>)"
        )));
    };
    if &parsed.sink != sink {
        return Err(refuse(format!(
            "transaction {txn} belongs to sink '{}', not to sink '{sink}'; pass --sink {}",
            parsed.sink, parsed.sink
        )));
    }
    let committer = Committer::new(
        SinkScope {
            sink: sink.clone(),
            subtask: parsed.subtask,
        },
        retry,
    );
    let staged = dest.staged().map_err(dest_err(
        sink,
        "listing staged transactions",
        "Nothing was changed.",
    ))?;
    let (mut found, others): (Vec<_>, Vec<_>) =
        staged.into_iter().partition(|s| &s.transaction == txn);
    let found = found.pop();
    let commit = |dest: &mut D, h| -> Result<Decided, OperatorError> {
        log::warn!("twopc sink '{sink}': committing transaction {txn} by hand");
        let outcome = committer.commit(dest, clock, h).map_err(|e| match e {
            // The job's message would tell the operator to restart the
            // job from a checkpoint; by hand, the same command is the way.
            TwopcError::CommitUnresolved(u) => OperatorError::Destination {
                sink: sink.clone(),
                action: format!(
                    "committing transaction {txn} (checkpoint {}) by hand ({} attempts, each \
                     with an unknown outcome)",
                    u.checkpoint, u.attempts
                ),
                consequence: "Nothing is lost: the transaction stays staged, and a commit is \
                              repeatable by its id. Run the same `twopc decide ... --commit` \
                              again once the destination answers.",
                source: DestinationError::new(DestinationErrorKind::Io, u.last_error),
            },
            // Refused for certain (rights, or this tool's claim on the sink
            // ended): the committer stopped at once instead of retrying it
            // as an unknown outcome. Its own words are a job's (restart
            // from a checkpoint); by hand, the same command is the way.
            TwopcError::Destination { source, .. }
                if source.kind == DestinationErrorKind::NotPermitted =>
            {
                OperatorError::Destination {
                    sink: sink.clone(),
                    action: format!("committing transaction {txn} by hand"),
                    consequence: "The destination refused it, and a retry now would be refused \
                                  the same way. A commit is repeatable by its id: fix what the \
                                  error names, then run the same `twopc decide ... --commit` \
                                  again.",
                    source,
                }
            }
            other => OperatorError::Protocol(other),
        })?;
        Ok(match outcome {
            CommitOutcome::Committed => Decided::Committed,
            CommitOutcome::AlreadyCommitted => Decided::AlreadyCommitted,
            CommitOutcome::Empty => Decided::CommittedEmpty,
        })
    };
    let abort = |dest: &mut D| -> Result<Decided, OperatorError> {
        log::warn!("twopc sink '{sink}': aborting transaction {txn} by hand");
        match dest.abort(txn).map_err(dest_err(
            sink,
            format!("aborting transaction {txn}"),
            "Its data stays staged and invisible; run the same command again.",
        ))? {
            AbortStatus::Aborted => Ok(Decided::Aborted),
            AbortStatus::NotFound => Ok(Decided::NothingStaged),
            AbortStatus::WasCommitted => Err(refuse(format!(
                "transaction {txn} is committed (or its commit was decided); an abort never \
                 removes committed output"
            ))),
        }
    };
    let Some(s) = found else {
        return match (decision, find_committed(dest, sink, txn)?) {
            (Decision::Commit, Some(_)) => Ok(Decided::AlreadyCommitted),
            (Decision::Commit, None) => Err(refuse(format!(
                "transaction {txn} is neither staged nor committed: it was aborted or expired, or \
                 never prepared here, so there is nothing to commit. If its checkpoint completed, \
                 its records are lost: follow the recovery plan of the job's error (`twopc \
                 reconcile`)"
            ))),
            (Decision::Abort, Some(c)) => Err(refuse(format!(
                "transaction {txn} is committed (checkpoint {}, lineage {}); an abort never \
                 removes committed output. To remove it with everything committed after \
                 checkpoint {}, run `twopc reconcile <destination> --sink {sink} --lineage {} \
                 --after-checkpoint {}`",
                c.checkpoint,
                c.lineage,
                c.checkpoint.saturating_sub(1),
                c.lineage,
                c.checkpoint.saturating_sub(1)
            ))),
            (Decision::Abort, None) => Ok(Decided::NothingStaged),
        };
    };
    match (&s.state, decision) {
        (StagedState::Prepared(h), Decision::Commit)
        | (StagedState::Committing(h), Decision::Commit) => commit(dest, h),
        (StagedState::Committing(h), Decision::Abort) => Err(refuse(format!(
            "transaction {txn} (checkpoint {}) was claimed for commit: its checkpoint completed \
             and the commit was interrupted, so its records exist nowhere else. Only a commit \
             may finish it: run `twopc decide <destination> --sink {sink} --commit {txn}`",
            h.checkpoint().unwrap_or_default()
        ))),
        (StagedState::Open, Decision::Commit) => Err(refuse(format!(
            "transaction {txn} is open: it was never prepared, so no checkpoint holds it and it \
             must not become visible. Abort it: `twopc decide <destination> --sink {sink} --abort \
             {txn}`"
        ))),
        (StagedState::PreparedUnreadable { reason }, Decision::Commit) => Err(refuse(format!(
            "transaction {txn} is prepared but its handle cannot be read ({reason}), so its \
             checkpoint and lineage are unknown and it cannot be committed safely. Restore the \
             run that prepared it (its recovery commits it), or, if its output is not wanted, \
             abort it: `twopc decide <destination> --sink {sink} --abort {txn}`"
        ))),
        (StagedState::Prepared(h), Decision::Abort) => {
            let c = h.checkpoint().unwrap_or_default();
            let records = h.prepared().map_or(0, |p| p.records);
            // A sibling claimed for commit proves the checkpoint completed
            // as well as a committed one: once anything finishes its
            // commit, the checkpoint is partly visible.
            let sibling = match claimed_sibling(&others, h) {
                Some(claimed) => Some((claimed.clone(), true)),
                None => committed_sibling(dest, sink, h)?.map(|c| (c.transaction, false)),
            };
            if let Some((sibling, claimed)) = sibling {
                let lineage = h.lineage;
                let before = c.saturating_sub(1);
                let (how, finish_sibling) = if claimed {
                    (
                        "claimed for commit (not yet finished)",
                        format!("commit {sibling} (`--commit {sibling}`), then "),
                    )
                } else {
                    ("committed", String::new())
                };
                return Err(refuse(format!(
                    "transaction {txn} was prepared for checkpoint {c} of run {}, and transaction \
                     {sibling} of that same checkpoint and run is {how}: checkpoint {c} \
                     completed, so its output is (or becomes) partly visible and this \
                     transaction's {records} records exist nowhere else. An abort would lose \
                     them; commit it: `twopc decide <destination> --sink {sink} --commit {txn}`. \
                     (One exception: a Sink V2 job that failed over numbers its next checkpoint \
                     after the restored one again, so if this transaction is a leftover of the \
                     failed attempt, restart the job from its latest checkpoint instead: its \
                     recovery aborts such leftovers and commits what that checkpoint holds.) \
                     If that output is not wanted (the job will be restored from checkpoint \
                     {before} or earlier), {finish_sibling}remove what lineage {lineage} \
                     committed after checkpoint {before} with `twopc reconcile <destination> \
                     --sink {sink} --lineage {lineage} --after-checkpoint {before}` (add --apply \
                     after reading its plan); this abort is accepted after that",
                    h.run,
                )));
            }
            abort(dest)
        }
        (StagedState::Open, Decision::Abort)
        | (StagedState::PreparedUnreadable { .. }, Decision::Abort) => abort(dest),
    }
}

/// A committed transaction of the checkpoint that `handle` was prepared
/// for, by the same run in the same lineage: proof that the checkpoint
/// completed, so `handle` is in its state and must be committed.
///
/// Only the same number counts. A later one would prove it only within
/// one attempt of the job: after a failover to an earlier checkpoint the
/// job keeps its id (the run) and commits later checkpoints that do not
/// hold what the failed attempt prepared, and the commit records do not
/// tell attempts apart (found by review). So a Sink V2 writer's
/// transaction numbered below its siblings (after a checkpoint that
/// failed before reaching it) is not caught here; restoring the job's
/// latest checkpoint is the safe way to resolve it.
///
/// Only the same run proves it: a restore into a new job keeps the lineage
/// and, after a rewind, may number a checkpoint as an earlier run did.
fn committed_sibling<D: Destination>(
    dest: &mut D,
    sink: &SinkId,
    handle: &TransactionHandle,
) -> Result<Option<CommittedTransaction>, OperatorError> {
    let Some(checkpoint) = handle.checkpoint() else {
        return Ok(None);
    };
    let committed = dest
        .committed_after(handle.lineage, checkpoint.saturating_sub(1))
        .map_err(dest_err(
            sink,
            format!("reading commit records of lineage {}", handle.lineage),
            "Nothing was changed.",
        ))?;
    Ok(committed
        .into_iter()
        .find(|c| c.checkpoint == checkpoint && c.run == handle.run))
}

/// A staged transaction among `others` claimed for commit for the same
/// checkpoint as `handle`, by the same run in the same lineage: a claim is
/// made only once its checkpoint completed (see [`committed_sibling`] for
/// why only the same number and run count).
fn claimed_sibling<'a>(
    others: &'a [StagedTransaction],
    handle: &TransactionHandle,
) -> Option<&'a TransactionId> {
    let checkpoint = handle.checkpoint()?;
    others.iter().find_map(|s| match &s.state {
        StagedState::Committing(h2)
            if h2.lineage == handle.lineage
                && h2.run == handle.run
                && h2.checkpoint() == Some(checkpoint) =>
        {
            Some(&s.transaction)
        }
        _ => None,
    })
}

/// The commit record of `txn`, if the destination has one.
fn find_committed<D: Destination>(
    dest: &mut D,
    sink: &SinkId,
    txn: &TransactionId,
) -> Result<Option<CommittedTransaction>, OperatorError> {
    let lineages =
        dest.lineages()
            .map_err(dest_err(sink, "listing lineages", "Nothing was changed."))?;
    for l in lineages {
        // Flink numbers checkpoints from 1.
        let committed = dest.committed_after(l.lineage, 0).map_err(dest_err(
            sink,
            format!("reading commit records of lineage {}", l.lineage),
            "Nothing was changed.",
        ))?;
        if let Some(c) = committed.into_iter().find(|c| &c.transaction == txn) {
            return Ok(Some(c));
        }
    }
    Ok(None)
}
