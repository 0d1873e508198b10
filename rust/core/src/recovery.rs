//! Start-up of a subtask: decide, from the restored checkpoint (or its
//! absence) and what the destination holds, what to abort, what to retract
//! and what must stop the job.
//!
//! Rules (the checkpoint is the record of truth):
//! * Restored prepared transactions are committed by the caller, one by one
//!   (`recoverAndCommit`); the restored open one is aborted
//!   (`recoverAndAbort`). This module handles everything the checkpoint does
//!   not name.
//! * Lingering: a staged transaction of this sink that no restored state
//!   knows is aborted, by the one subtask that owns its original index. A
//!   subtask sees only its share of the restored state, so it cannot tell at
//!   start-up whether a staged transaction is one another subtask is about to
//!   commit. It waits instead until the first checkpoint of its own attempt
//!   completes: by then every subtask has finished its recovery (a checkpoint
//!   completes only after all of them snapshot), so every restored
//!   transaction is committed or aborted, and whatever else it owns is
//!   lingering ([`abort_lingering`]). This keeps the sink free of union list
//!   state, which Flink refuses to checkpoint once some subtasks finished.
//!   In the Sink V2 topology the restored committables may sit in any
//!   committer subtask after a rescale, not the owner's; Flink commits them
//!   in the committer's `initializeState`, and the committer never defers
//!   such a recovery commit past it, even when it defers other commits
//!   (see `CommitterSession::commit_attempt`), so the same proof holds.
//! * Rewind: output of this lineage committed after the restored checkpoint
//!   would be written again by the replay; stop, or retract it under
//!   [`RewindPolicy::ReplaceRange`].
//! * Fresh start (no restored state for this sink): open transactions are
//!   aborted (no checkpoint can contain them); prepared ones of this run are
//!   aborted (a failed attempt before its first checkpoint completed, or
//!   Flink would have restored it); prepared ones of another run, or whose
//!   handle is unreadable, stop the job unless the fresh-start policy aborts
//!   prepared leftovers. Committed output of other lineages (earlier runs)
//!   stops the job too, unless the policy appends: a new run would write
//!   every record again next to it.
//! * A transaction whose commit was decided but did not finish
//!   ([`StagedState::Committing`]) is only ever committed (rolled forward),
//!   by whichever start or cleanup meets it, never aborted or expired.
//! * Ownership: before anything else, a subtask claims its share of the sink
//!   at the destination. Another live run, or another sink of this job with
//!   the same sink id, is refused; an earlier attempt of this run that is
//!   still shutting down is waited for, briefly. Those claims are taken
//!   at the start only; the lingering cleanup and the retention scan, which
//!   run later, confirm each share at the destination right before they act
//!   on it, so that a superseded attempt whose committer still runs leaves
//!   alone the shares a newer attempt holds ([`abort_lingering`],
//!   [`expire_stale`]).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::clock::Clock;
use crate::committer::Committer;
use crate::config::{RewindPolicy, SinkOptions, SubtaskContext};
use crate::destination::{
    AbortStatus, CommittedTransaction, Destination, LineageRecord, OwnerClaim, OwnerInfo,
    Ownership, StagedState, StagedTransaction,
};
use crate::error::{
    ConfigError, DestinationError, DestinationErrorKind, ExistingOutput, OwnershipConflict,
    PreparedOnFreshStart, ReusedJobId, RewindDetected, TwopcError,
};
use crate::handle::{HandleError, TransactionHandle};
use crate::ids::{CheckpointId, LineageId, SinkId, TransactionId};
use crate::state::WriterState;

/// What Flink restored to one writer subtask: the checkpoint id, and this
/// subtask's share of the restored state, which may be empty after the
/// parallelism grew (Flink splits list state among the new subtasks; some
/// get nothing). Such a subtask learns the lineage from the destination,
/// where the subtasks that did get a share record it for their run.
#[derive(Clone, Debug, Default)]
pub struct Restore {
    pub checkpoint: CheckpointId,
    /// Writer states of this share (one per subtask that wrote them).
    pub states: Vec<WriterState>,
    /// Transaction handles of this share that the caller restores itself
    /// (the SinkFunction shim's pending and open transactions, and the
    /// handle copies that older releases of the shim wrote instead of a
    /// writer state).
    pub known: Vec<TransactionHandle>,
}

impl Restore {
    /// Every handle this share names: the known ones and the writer
    /// states' open ones.
    pub fn handles(&self) -> impl Iterator<Item = &TransactionHandle> {
        self.known
            .iter()
            .chain(self.states.iter().flat_map(|s| s.open.iter()))
    }

    fn is_empty(&self) -> bool {
        self.states.is_empty() && self.known.is_empty()
    }
}

/// What start-up did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartupReport {
    pub lineage: LineageId,
    /// True when no restored state of this sink existed.
    pub fresh: bool,
    pub aborted: Vec<TransactionId>,
    pub retracted: Vec<CommittedTransaction>,
}

/// How often a subtask without a share of the restored state looks again
/// whether another subtask recorded the run's lineage.
const LINEAGE_POLL_MS: u64 = 100;

pub(crate) fn start<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    committer: &Committer,
    ctx: &SubtaskContext,
    options: &SinkOptions,
    restore: Option<&Restore>,
) -> Result<StartupReport, TwopcError> {
    let scope = ctx.scope();
    let scan_err = |action: &'static str| {
        let scope = scope.clone();
        move |source| TwopcError::Scan {
            scope,
            action,
            source,
        }
    };
    // A subtask with a share of the restored state records the run's
    // lineage before anything that may wait (the ownership claim waits for
    // an earlier attempt): subtasks that got no share wait for that record,
    // and only for a while (found by review: recorded after the claim's
    // wait, it came too late for them, one started fresh in a lineage of
    // its own, and the run's note then refused every later start).
    let restored_lineage = match restore {
        Some(r) if !r.is_empty() => {
            let lineage = restored_lineage(ctx, r)?;
            dest.record_run_lineage(&ctx.run, lineage)
                .map_err(scan_err(
                    "recording the run's lineage (if the note names the lineage of a fresh start, \
                 a subtask of this run that got no share of the restored state gave up \
                 waiting for it and started fresh: stop the job, remove that note and restore \
                 again)",
                ))?;
            Some(lineage)
        }
        _ => None,
    };
    claim_ownership(dest, clock, ctx, options)?;

    // A restore that gave this subtask no share of the sink's state: the
    // parallelism grew (other subtasks have shares and record the run's
    // lineage), or the sink has no state in the checkpoint at all (a new
    // sink, or its uid or sink id changed): then it starts as a fresh start
    // would, and the fresh-start rules refuse output it could duplicate.
    let mut without_state = None;
    match (restore, restored_lineage) {
        (None, _) => {}
        (Some(r), Some(lineage)) => {
            return restored_start(dest, clock, committer, ctx, options, r, lineage)
        }
        (Some(r), None) => match wait_for_run_lineage(dest, clock, ctx, options, r.checkpoint)? {
            Some(lineage) => {
                return restored_start(dest, clock, committer, ctx, options, r, lineage)
            }
            // The run's lineage is noted only once the fresh-start checks
            // passed (below): noted before, a refused start would leave a
            // note that lets the next attempt's subtasks skip them.
            None => without_state = Some(r.checkpoint),
        },
    }
    // A fresh start.
    let lineage = LineageId::of_fresh_run(&ctx.run);
    let lineages = dest
        .lineages()
        .map_err(scan_err("reading committed lineages at a fresh start"))?;
    let (own, earlier): (Vec<_>, Vec<_>) = lineages.into_iter().partition(|l| l.lineage == lineage);
    // Output committed under this job id means one of its checkpoints
    // completed, and Flink restores that checkpoint on a restart: a start
    // without state that finds it is another execution with the same job
    // id. Its "own earlier attempt" is not its own, so neither the rules for
    // a failover (abort the run's prepared transactions) nor those for
    // earlier runs (its lineage is this one's) apply: stop, whatever the
    // policy.
    if let Some(output) = own.into_iter().find(|l| l.committed > 0) {
        return Err(TwopcError::JobIdReusedOnFreshStart(Box::new(ReusedJobId {
            scope,
            output,
            restored_without_state: without_state,
            restored_earlier: false,
        })));
    }
    // The job id's lineage was noted by an earlier start, as another
    // lineage than this fresh start's. After a restore that gave this
    // subtask no share, a subtask with one noted it after this one stopped
    // waiting: a restored start, late. Without a restore, an execution
    // under this job id restored a checkpoint or savepoint of that lineage;
    // every restart of it restores state too, so a start without state is
    // a new execution reusing the job id, and the prepared transactions of
    // this job id are not its own to abort (found by review: they were
    // aborted as a failover's, and only then did the note refuse the start).
    let noted = dest
        .run_lineage(&ctx.run)
        .map_err(scan_err("reading the run's lineage at a fresh start"))?
        .filter(|noted| *noted != lineage);
    if let Some(noted) = noted {
        if let (Some(r), Some(_)) = (restore, without_state) {
            return restored_start(dest, clock, committer, ctx, options, r, noted);
        }
        let output = earlier
            .iter()
            .find(|l| l.lineage == noted)
            .cloned()
            .unwrap_or_else(|| crate::destination::LineageSummary {
                lineage: noted,
                committed: 0,
                last_checkpoint: None,
                last_transactions: Vec::new(),
                runs: Vec::new(),
                record: None,
            });
        return Err(TwopcError::JobIdReusedOnFreshStart(Box::new(ReusedJobId {
            scope,
            output,
            restored_without_state: None,
            restored_earlier: true,
        })));
    }
    let staged = list_staged(dest, ctx, "listing staged transactions at a fresh start")?;
    refuse_prepared_leftovers(ctx, options, &staged, without_state)?;
    if !earlier.is_empty() && !options.fresh_start.appends() {
        return Err(TwopcError::ExistingOutputOnFreshStart(Box::new(
            ExistingOutput {
                scope,
                lineages: earlier,
                restored_without_state: without_state,
            },
        )));
    }
    let aborted = resolve_leftovers(dest, clock, committer, ctx, &staged)?;
    dest.record_lineage(&LineageRecord {
        lineage,
        run: ctx.run.clone(),
        started_at_ms: clock.now_ms(),
        appended: !earlier.is_empty(),
    })
    .map_err(scan_err("recording the new lineage"))?;
    dest.record_run_lineage(&ctx.run, lineage)
        .map_err(scan_err("recording the run's lineage"))?;
    Ok(StartupReport {
        lineage,
        fresh: true,
        aborted,
        retracted: Vec::new(),
    })
}

/// The lineage of a non-empty share of restored state, after checking that
/// it is this sink's and of one lineage.
fn restored_lineage(ctx: &SubtaskContext, restore: &Restore) -> Result<LineageId, TwopcError> {
    for h in restore.handles() {
        if h.sink != ctx.sink {
            return Err(wrong_sink(ctx, &h.sink, Some(&h.transaction)));
        }
    }
    if let Some(s) = restore.states.iter().find(|s| s.sink != ctx.sink) {
        return Err(wrong_sink(ctx, &s.sink, None));
    }
    let lineages: BTreeSet<LineageId> = restore
        .handles()
        .map(|h| h.lineage)
        .chain(restore.states.iter().map(|s| s.lineage))
        .collect();
    if lineages.len() > 1 {
        return Err(TwopcError::State {
            scope: ctx.scope(),
            source: HandleError::Invalid(format!(
                "restored transactions come from {} different lineages ({lineages:?}); state of \
                 unrelated runs was merged",
                lineages.len()
            )),
        });
    }
    Ok(*lineages.first().expect("a non-empty share names a lineage"))
}

/// The checks of a start from restored state in `lineage`.
fn restored_start<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    committer: &Committer,
    ctx: &SubtaskContext,
    options: &SinkOptions,
    restore: &Restore,
    lineage: LineageId,
) -> Result<StartupReport, TwopcError> {
    // One listing serves both checks. It is taken after this subtask's
    // claims (`claim_ownership`), so no earlier attempt of a share it owns
    // changes it afterwards; the rewind check only rolls decided commits
    // forward and retracts committed ones, which the abort below never looks
    // at. (A listing before the claims would miss a commit that an old
    // subtask decided while this one waited for its share.)
    let staged = list_staged(dest, ctx, "listing staged transactions after a restore")?;
    let retracted = check_rewind(
        dest, clock, committer, ctx, options, restore, lineage, &staged,
    )?;
    let aborted = abort_prepared_after(dest, ctx, &staged, lineage, restore.checkpoint)?;
    Ok(StartupReport {
        lineage,
        fresh: false,
        aborted,
        retracted,
    })
}

/// Aborts the transactions this subtask owns that were prepared in the
/// restored lineage for a checkpoint after the restored one. No restored
/// state holds them (a checkpoint's state holds handles prepared for it or
/// earlier: a writer prepares for at most the checkpoint it snapshots), so
/// nothing will ever commit them. They go now rather than with the other
/// lingering ones at the first completed checkpoint: until then they hold
/// their locks, and at a destination with locks (PostgreSQL, a unique key
/// that the replay writes again) the replay would wait for them, and no
/// checkpoint would ever complete (found by review).
fn abort_prepared_after<D: Destination>(
    dest: &mut D,
    ctx: &SubtaskContext,
    staged: &[StagedTransaction],
    lineage: LineageId,
    restored: CheckpointId,
) -> Result<Vec<TransactionId>, TwopcError> {
    let mut aborted = Vec::new();
    for s in staged.iter().filter(|s| ctx.owns(s.subtask)) {
        if matches!(&s.state, StagedState::Prepared(h)
            if h.lineage == lineage && h.checkpoint() > Some(restored))
        {
            abort_one(
                dest,
                ctx,
                s,
                "prepared for a checkpoint after the restored one: no restored state holds it",
            )?;
            aborted.push(s.transaction.clone());
        }
    }
    Ok(aborted)
}

fn wrong_sink(ctx: &SubtaskContext, found: &SinkId, txn: Option<&TransactionId>) -> TwopcError {
    TwopcError::Config(ConfigError::new(format!(
        "the restored state holds {} of sink '{found}', but this sink is '{}'. The sink id must \
         stay the same across restores; set it back to '{found}'",
        match txn {
            Some(t) => format!("transaction {t}"),
            None => "the writer state".to_string(),
        },
        ctx.sink
    )))
}

/// After a restore without a share of the sink's state, how long a subtask
/// waits for the run's lineage when the destination holds nothing of this
/// sink (a sink new in the job: nobody will record one).
const NEW_SINK_GRACE_MS: u64 = 10_000;

/// A subtask restored without a share of the sink's state waits for a
/// subtask that has one to record the run's lineage: they start together,
/// so this takes moments. `None` when none did within the wait: the sink
/// has no state in the checkpoint at all.
fn wait_for_run_lineage<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    ctx: &SubtaskContext,
    options: &SinkOptions,
    checkpoint: CheckpointId,
) -> Result<Option<LineageId>, TwopcError> {
    let scan = |action: &'static str| {
        let scope = ctx.scope();
        move |source| TwopcError::Scan {
            scope,
            action,
            source,
        }
    };
    let holds_nothing = dest
        .staged()
        .map_err(scan(
            "listing staged transactions after a restore without state",
        ))?
        .iter()
        .all(|s| !s.is_prepared())
        && dest
            .lineages()
            .map_err(scan(
                "reading committed lineages after a restore without state",
            ))?
            .is_empty();
    let wait = if holds_nothing {
        options.lineage_wait_ms.min(NEW_SINK_GRACE_MS)
    } else {
        options.lineage_wait_ms
    };
    let deadline = clock.now_ms().saturating_add(wait);
    loop {
        let found = dest
            .run_lineage(&ctx.run)
            .map_err(scan("reading the restored run's lineage"))?;
        if found.is_some() {
            return Ok(found);
        }
        if clock.now_ms() >= deadline {
            log::warn!(
                "{}: checkpoint {checkpoint} gave this subtask no state of the sink, and no \
                 subtask recorded run {}'s lineage within {}: the sink has no state in the \
                 checkpoint, and starts as a fresh start would",
                ctx.scope(),
                ctx.run,
                crate::timefmt::exact(wait)
            );
            return Ok(None);
        }
        clock.sleep_ms(LINEAGE_POLL_MS);
    }
}

/// What housekeeping must leave alone: transactions of the writers of this
/// attempt (original subtask → attempt nonce), and transactions a subtask
/// still needs (restored or received, not yet committed).
pub(crate) struct Keep<'a> {
    pub current: &'a BTreeMap<u32, u64>,
    pub protected: &'a HashSet<TransactionId>,
}

impl Keep<'_> {
    fn keeps(&self, s: &StagedTransaction) -> bool {
        self.current.get(&s.subtask) == Some(&s.attempt_nonce)
            || self.protected.contains(&s.transaction)
    }
}

/// The housekeeping cleanups that confirm a share before they act on it;
/// each says, in a warning or an error, what it left alone and when it
/// tries again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cleanup {
    /// The lingering cleanup after a restore ([`abort_lingering`]).
    Lingering,
    /// The retention scan ([`expire_stale`]).
    Retention,
}

impl Cleanup {
    /// What was not done to the transactions of a skipped share.
    fn left_alone(self) -> &'static str {
        match self {
            Cleanup::Lingering => "untouched",
            Cleanup::Retention => "unexpired though past the retention",
        }
    }

    /// When this cleanup looks at a skipped share again.
    fn next_try(self) -> &'static str {
        match self {
            Cleanup::Lingering => "the cleanup is tried again at the next checkpoint",
            Cleanup::Retention => {
                "the retention scan tries again at the first checkpoint completed after the \
                 next expiry scan interval"
            }
        }
    }

    /// The action named in an error of the share check.
    fn confirming(self) -> &'static str {
        match self {
            Cleanup::Lingering => {
                "confirming this attempt's hold on a share before aborting its lingering \
                 transactions (nothing of that share was aborted)"
            }
            Cleanup::Retention => {
                "confirming this attempt's hold on a share before expiring its transactions \
                 past the retention (nothing of that share was expired)"
            }
        }
    }
}

/// What the lingering cleanup did.
#[derive(Debug, Default)]
pub(crate) struct Lingering {
    pub aborted: Vec<TransactionId>,
    /// Shares whose transactions were left alone because another attempt or
    /// run holds them at the destination.
    pub skipped: Vec<SkippedShare>,
}

/// What the retention scan did.
#[derive(Debug, Default)]
pub(crate) struct Expiry {
    pub expired: Vec<TransactionId>,
    /// Shares whose transactions past the retention were left alone because
    /// another attempt or run holds them at the destination.
    pub skipped: Vec<SkippedShare>,
}

/// A share a cleanup did not touch, and why.
#[derive(Debug)]
pub(crate) struct SkippedShare {
    pub cleanup: Cleanup,
    pub share: u32,
    pub holder: OwnerInfo,
    /// Its staged transactions that would have been aborted, finished or
    /// expired.
    pub transactions: Vec<TransactionId>,
}

impl SkippedShare {
    /// What happened and what to do, for a log line or an error.
    pub fn describe(&self, ctx: &SubtaskContext) -> String {
        let first = self
            .transactions
            .first()
            .map(|t| t.as_str())
            .unwrap_or_default();
        let next_try = self.cleanup.next_try();
        let who = match &self.holder.claim {
            Some(c) if c.run == ctx.run && c.attempt > ctx.attempt => {
                format!(
                    "a later attempt ({}) of this subtask holds it: this attempt (attempt {}) \
                     was superseded and leaves the share to it; nothing to do",
                    c.attempt, ctx.attempt
                )
            }
            Some(c) if crate::operator::is_operator_claim(c) => {
                format!("an operator's twopc command holds the sink; {next_try}")
            }
            _ => format!(
                "{next_try}; if this attempt was superseded, nothing to do, otherwise stop the \
                 holder named here (a second job with this sink id, or an execution left behind \
                 by a JobManager failover)"
            ),
        };
        format!(
            "left {} staged transaction(s) of subtask index {}'s share {} (first: {first}) \
             because this attempt does not hold that share at the destination now ({}): {who}",
            self.transactions.len(),
            self.share,
            self.cleanup.left_alone(),
            self.holder.holder
        )
    }
}

/// Aborts the staged transactions this subtask owns that housekeeping must
/// not keep. Called once the first checkpoint of this attempt completed,
/// when every restored transaction has been resolved by whichever subtask
/// restored it (see the module documentation).
///
/// `owns` is decided by this attempt's parallelism, and its claims were
/// taken at its start; neither says that this attempt is still the one
/// writing there. An attempt that was superseded while its committer still
/// runs (a zombie on a TaskManager cut off from the JobManager, told late
/// that a checkpoint completed), or an earlier run's subtask after a
/// scale-up, would abort the prepared transactions of the attempt that now
/// writes the share, which then finds them LOST at commit. So each share
/// is confirmed at the destination first ([`confirm_share`]), and one held
/// by another attempt or run is left alone.
pub(crate) fn abort_lingering<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    committer: &Committer,
    ctx: &SubtaskContext,
    keep: &Keep<'_>,
) -> Result<Lingering, TwopcError> {
    let staged = list_staged(dest, ctx, "listing staged transactions for lingering ones")?;
    let lingering = staged
        .into_iter()
        .filter(|s| ctx.owns(s.subtask) && !keep.keeps(s));
    let mut aborted = Vec::new();
    let skipped = in_held_shares(dest, ctx, Cleanup::Lingering, lingering, |dest, s| {
        // A decided commit is fenced too: finished by a superseded attempt
        // after the newer one's rewind check, its records would be written
        // again by the replay.
        if let StagedState::Committing(handle) = &s.state {
            return roll_forward(dest, clock, committer, ctx, handle);
        }
        abort_one(dest, ctx, &s, "lingering: no restored checkpoint knows it")?;
        aborted.push(s.transaction);
        Ok(())
    })?;
    Ok(Lingering { aborted, skipped })
}

/// Runs `act` on each of `candidates`, one share at a time, right after
/// [`confirm_share`] found that this attempt holds that share (each share
/// is asked once). The transactions of a share held by another attempt or
/// run are left alone, with a warning naming the share and its holder, and
/// returned as skipped for the caller to report.
fn in_held_shares<D: Destination>(
    dest: &mut D,
    ctx: &SubtaskContext,
    cleanup: Cleanup,
    candidates: impl IntoIterator<Item = StagedTransaction>,
    mut act: impl FnMut(&mut D, StagedTransaction) -> Result<(), TwopcError>,
) -> Result<Vec<SkippedShare>, TwopcError> {
    let mut by_share: BTreeMap<u32, Vec<StagedTransaction>> = BTreeMap::new();
    for s in candidates {
        by_share.entry(s.subtask).or_default().push(s);
    }
    let mut skipped = Vec::new();
    for (share, transactions) in by_share {
        if let Some(holder) = confirm_share(dest, ctx, share, cleanup)? {
            let skip = SkippedShare {
                cleanup,
                share,
                holder,
                transactions: transactions.into_iter().map(|s| s.transaction).collect(),
            };
            log::warn!("{}: {}", ctx.scope(), skip.describe(ctx));
            skipped.push(skip);
            continue;
        }
        for s in transactions {
            act(dest, s)?;
        }
    }
    Ok(skipped)
}

/// Confirms at the destination that this attempt holds the share of
/// subtask index `share` (taking it if nobody does). `None`: it does, or
/// the destination cannot tell (then as before this check existed);
/// otherwise the holder. A holder with this attempt's claim is this
/// attempt's own writer in another destination instance (the Sink V2
/// committer has a destination of its own, and the writer's lock refuses
/// it even in the same process); see [`this_attempt`].
fn confirm_share<D: Destination>(
    dest: &mut D,
    ctx: &SubtaskContext,
    share: u32,
    cleanup: Cleanup,
) -> Result<Option<OwnerInfo>, TwopcError> {
    let ours = OwnerClaim {
        subtask: share,
        ..ctx.owner_claim()
    };
    let found = dest
        .confirm_ownership(&ours)
        .map_err(|source| TwopcError::Scan {
            scope: ctx.scope(),
            action: cleanup.confirming(),
            source,
        })?;
    Ok(match found {
        None | Some(Ownership::Acquired) => None,
        Some(Ownership::HeldBy(holder))
            if holder
                .claim
                .as_ref()
                .is_some_and(|c| this_attempt(c, &ours)) =>
        {
            None
        }
        Some(Ownership::HeldBy(holder)) => Some(holder),
    })
}

/// Whether `holder` is a claim of the attempt `ours` of this subtask's
/// share: the same sink, share, run and attempt. The operator instance is
/// not compared: the Sink V2 writer's is mixed with its operator's id,
/// which its committer does not know (found by the integration tests: every
/// committer skipped its own writer's share). Two sink operators of one job
/// with one sink id are refused by their writers at the start.
fn this_attempt(holder: &OwnerClaim, ours: &OwnerClaim) -> bool {
    holder.sink == ours.sink
        && holder.subtask == ours.subtask
        && holder.run == ours.run
        && holder.attempt == ours.attempt
}

/// Finishes a commit that was decided (its checkpoint completed) but was
/// interrupted: committing is the only way forward for it.
fn roll_forward<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    committer: &Committer,
    ctx: &SubtaskContext,
    handle: &TransactionHandle,
) -> Result<(), TwopcError> {
    log::info!(
        "{}: finishing the interrupted commit of transaction {} (checkpoint {})",
        ctx.scope(),
        handle.transaction,
        handle.checkpoint().unwrap_or_default()
    );
    committer.commit(dest, clock, handle).map(|_| ())
}

/// How often a start looks again whether an earlier attempt released the
/// destination.
const OWNER_POLL_MS: u64 = 200;

/// Claims this subtask's share of the sink at the destination (see the
/// module docs), waiting up to `owner_wait_ms` for a holder that may be
/// shutting down; then the shares it looks after for a larger parallelism
/// of an earlier run.
fn claim_ownership<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    ctx: &SubtaskContext,
    options: &SinkOptions,
) -> Result<(), TwopcError> {
    claim_share(dest, clock, ctx, options, ctx.subtask)?;
    claim_leftover_shares(dest, clock, ctx, options)
}

/// Claims, and holds as its own, the shares of subtask indexes at or above
/// this run's parallelism that this subtask looks after (`owns`: left by a
/// run with more subtasks) and that still hold staged transactions. A
/// subtask of that run that is still shutting down holds its share while
/// it runs, and could otherwise finish a commit there after this run's
/// rewind check passed (the replay writing its records again) or abort
/// what this run restored (found by review).
fn claim_leftover_shares<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    ctx: &SubtaskContext,
    options: &SinkOptions,
) -> Result<(), TwopcError> {
    let shares: BTreeSet<u32> = list_staged(
        dest,
        ctx,
        "listing staged transactions for the shares of an earlier parallelism",
    )?
    .iter()
    .map(|s| s.subtask)
    .filter(|&k| k >= ctx.parallelism && ctx.owns(k))
    .collect();
    for k in shares {
        claim_share(dest, clock, ctx, options, k)?;
    }
    Ok(())
}

/// Claims the share of subtask index `subtask` for this subtask.
fn claim_share<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    ctx: &SubtaskContext,
    options: &SinkOptions,
    subtask: u32,
) -> Result<(), TwopcError> {
    let claim = OwnerClaim {
        subtask,
        ..ctx.owner_claim()
    };
    let deadline = clock.now_ms().saturating_add(options.owner_wait_ms);
    loop {
        let holder = match dest.claim_ownership(&claim) {
            Ok(Ownership::Acquired) => return Ok(()),
            Ok(Ownership::HeldBy(holder)) => holder,
            Err(source) => {
                return Err(TwopcError::Scan {
                    scope: ctx.scope(),
                    action: "claiming this subtask's share of the destination",
                    source,
                })
            }
        };
        let (diagnosis, fatal, worth_waiting) = diagnose_holder(ctx, &holder);
        if !worth_waiting || clock.now_ms() >= deadline {
            return Err(TwopcError::OwnedElsewhere(Box::new(OwnershipConflict {
                scope: ctx.scope(),
                ours: claim,
                holder,
                diagnosis,
                fatal,
            })));
        }
        log::info!(
            "{}: waiting for the destination's share of subtask {subtask} to be released by {}",
            ctx.scope(),
            holder.holder
        );
        clock.sleep_ms(OWNER_POLL_MS);
    }
}

/// What a holder is, whether that is fatal, and whether waiting may help.
fn diagnose_holder(ctx: &SubtaskContext, holder: &OwnerInfo) -> (String, bool, bool) {
    let sink = &ctx.sink;
    match &holder.claim {
        Some(c) if crate::operator::is_operator_claim(c) => (
            format!(
                "An operator's twopc command (`twopc reconcile` or `twopc decide`) holds sink \
                 '{sink}' while it changes the destination. Let it finish; Flink restarts this \
                 subtask and it finds the share free"
            ),
            false,
            true,
        ),
        Some(c) if c.run == ctx.run && c.instance != ctx.instance => (
            format!(
                "Two sinks of this job use the sink id '{sink}' on the same destination, and \
                 each would abort the other's transactions. Give each sink its own sink id, or \
                 write them to different destinations"
            ),
            true,
            false,
        ),
        Some(c) if c.run == ctx.run => (
            format!(
                "It is another execution of this same subtask (attempt {}; this is attempt {}): \
                 an earlier attempt that is still shutting down, or one left behind by a \
                 JobManager failover. Flink restarts this subtask, and once that execution has \
                 ended it finds the share free",
                c.attempt, ctx.attempt
            ),
            false,
            true,
        ),
        Some(c) => (
            format!(
                "Another run ({}) is writing to this destination with the sink id '{sink}'. \
                 Two live runs must not share a sink id on one destination: each would abort \
                 the other's transactions. Give this job another sink id, or another \
                 destination; or stop run {} first (its hold is released when its process \
                 ends)",
                c.run, c.run
            ),
            true,
            true,
        ),
        None => (
            format!(
                "Another process holds it and its owner record cannot be read. If no other job \
                 writes to this destination with the sink id '{sink}', the hold is released \
                 when that process ends"
            ),
            true,
            true,
        ),
    }
}

/// Commits decided after the restored checkpoint count as committed after
/// it: their output is (or, once finished, will be) there, and the re-run
/// writes the same records (found by review: the check read commit records
/// only, and a claimed commit without its record yet slipped through; the
/// lingering cleanup finished it while the job replayed its records).
#[allow(clippy::too_many_arguments)]
fn check_rewind<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    committer: &Committer,
    ctx: &SubtaskContext,
    options: &SinkOptions,
    restore: &Restore,
    lineage: LineageId,
    staged: &[StagedTransaction],
) -> Result<Vec<CommittedTransaction>, TwopcError> {
    let scope = ctx.scope();
    let read_later = |dest: &mut D| {
        dest.committed_after(lineage, restore.checkpoint)
            .map_err(|source| TwopcError::Scan {
                scope: scope.clone(),
                action: "reading commit records for rewind detection",
                source,
            })
    };
    // Claims first, then records: a commit claims, records, publishes and
    // only then drops its claim, so one that finishes between the two reads
    // is seen by one of them (found by review: in the other order it could
    // slip between both).
    let decided = decided_after(staged, lineage, restore.checkpoint);
    let mut later = read_later(dest)?;
    if later.is_empty() && decided.is_empty() {
        return Ok(later);
    }
    later.sort_by(|a, b| (a.checkpoint, &a.transaction).cmp(&(b.checkpoint, &b.transaction)));
    match options.rewind {
        RewindPolicy::Fail => {
            let mut committed_after: Vec<(TransactionId, CheckpointId)> = later
                .iter()
                .map(|c| (c.transaction.clone(), c.checkpoint))
                .collect();
            for h in &decided {
                if !committed_after.iter().any(|(t, _)| t == &h.transaction) {
                    committed_after
                        .push((h.transaction.clone(), h.checkpoint().unwrap_or_default()));
                }
            }
            committed_after.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
            Err(TwopcError::Rewind(Box::new(RewindDetected {
                scope,
                restored_checkpoint: restore.checkpoint,
                lineage,
                committed_after,
            })))
        }
        RewindPolicy::ReplaceRange => {
            let known: HashSet<&TransactionId> =
                restore.handles().map(|h| &h.transaction).collect();
            // A decided commit is finished first (by its owner, as the
            // lingering cleanup would), then retracted with the rest.
            let mut finished = false;
            for h in decided.iter().filter(|h| ctx.owns(h.subtask)) {
                roll_forward(dest, clock, committer, ctx, h)?;
                finished = true;
            }
            // One that another subtask owns but this one is to retract (its
            // restored state knows it, see below) is retracted only once its
            // owner has finished it: a retraction next to a commit still
            // publishing would leave the output visible without a record,
            // and the re-run would write it again (found by review).
            let owned_elsewhere: Vec<&TransactionId> = decided
                .iter()
                .filter(|h| !ctx.owns(h.subtask) && known.contains(&h.transaction))
                .map(|h| &h.transaction)
                .collect();
            if !owned_elsewhere.is_empty() {
                await_finished_elsewhere(dest, clock, ctx, options, &owned_elsewhere)?;
                finished = true;
            }
            if finished {
                later = read_later(dest)?;
                later.sort_by(|a, b| {
                    (a.checkpoint, &a.transaction).cmp(&(b.checkpoint, &b.transaction))
                });
            }
            // Besides what this subtask owns, retract every committed
            // transaction the restored state knows (a restored open one,
            // committed by a later checkpoint). Flink splits list state in
            // contiguous ranges, not by `owns`, so any subtask may be handed
            // that state; its `recoverAndAbort` runs right after this open
            // and must not find the transaction still committed, whatever
            // order the subtasks start in (found by the simulation: the
            // abort was refused as misuse and the job restarted in a loop).
            // Retraction is repeatable, so two subtasks doing it is fine.
            let mine: Vec<CommittedTransaction> = later
                .into_iter()
                .filter(|c| ctx.owns(c.subtask) || known.contains(&c.transaction))
                .collect();
            for c in &mine {
                log::warn!(
                    "{scope}: rewind to checkpoint {}: retracting output of transaction {} \
                     (checkpoint {}, {} records) so the re-run replaces it",
                    restore.checkpoint,
                    c.transaction,
                    c.checkpoint,
                    c.records
                );
                dest.retract(c).map_err(|source| TwopcError::Destination {
                    scope: scope.clone(),
                    action: "retracting (rewind)",
                    transaction: c.transaction.clone(),
                    consequence: "Nothing new was written; the next start retries the retraction.",
                    source,
                })?;
            }
            Ok(mine)
        }
    }
}

/// Every staged transaction of the sink; `action` says what for, in an
/// error.
fn list_staged<D: Destination>(
    dest: &mut D,
    ctx: &SubtaskContext,
    action: &'static str,
) -> Result<Vec<StagedTransaction>, TwopcError> {
    dest.staged().map_err(|source| TwopcError::Scan {
        scope: ctx.scope(),
        action,
        source,
    })
}

/// The commits of `lineage` decided for a checkpoint after `after` and not
/// finished yet (claimed, at the destination) among `staged`.
fn decided_after(
    staged: &[StagedTransaction],
    lineage: LineageId,
    after: CheckpointId,
) -> Vec<TransactionHandle> {
    staged
        .iter()
        .filter_map(|s| match &s.state {
            StagedState::Committing(h) if h.lineage == lineage && h.checkpoint() > Some(after) => {
                Some(h.clone())
            }
            _ => None,
        })
        .collect()
}

/// Waits until the decided commits `transactions`, which other subtasks
/// own and finish at their own start, are finished (no longer claimed), for
/// as long as a start waits for an owner (`owner_wait_ms`).
fn await_finished_elsewhere<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    ctx: &SubtaskContext,
    options: &SinkOptions,
    transactions: &[&TransactionId],
) -> Result<(), TwopcError> {
    let deadline = clock.now_ms().saturating_add(options.owner_wait_ms);
    loop {
        let claimed: Vec<TransactionId> = list_staged(
            dest,
            ctx,
            "listing staged transactions for rewind detection",
        )?
        .into_iter()
        .filter(|s| {
            matches!(s.state, StagedState::Committing(_)) && transactions.contains(&&s.transaction)
        })
        .map(|s| s.transaction)
        .collect();
        let Some(first) = claimed.first() else {
            return Ok(());
        };
        if clock.now_ms() >= deadline {
            return Err(TwopcError::Destination {
                scope: ctx.scope(),
                action: "retracting (rewind)",
                transaction: first.clone(),
                consequence: "Nothing was retracted; the next start waits again.",
                source: DestinationError::new(
                    DestinationErrorKind::Io,
                    format!(
                        "its commit was decided for a checkpoint after the restored one and \
                         is still being finished by the subtask that owns it ({} decided \
                         commit(s) waited for: {}); it is retracted once finished",
                        claimed.len(),
                        claimed
                            .iter()
                            .map(|t| t.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
            });
        }
        log::info!(
            "{}: waiting for the decided commit of {first} to be finished by its owner \
             before retracting it",
            ctx.scope()
        );
        clock.sleep_ms(OWNER_POLL_MS);
    }
}

/// At a fresh start: prepared transactions of another run (or whose handle
/// cannot be read) may belong to a completed checkpoint of an earlier run
/// whose state was lost. Stop and name them all, unless the policy says to
/// abort them. The list is the sink's, every subtask's, since each subtask
/// lists the whole staging area.
///
/// Commits of another run that were decided but did not finish stop the
/// start whatever the policy: they can only be finished, and finishing
/// them here would extend the output behind the back of the operator who
/// chose this job's start position from it (found by the crash
/// simulation: a stateless restart from the visible output's end wrote the
/// records of such a commit twice).
fn refuse_prepared_leftovers(
    ctx: &SubtaskContext,
    options: &SinkOptions,
    staged: &[StagedTransaction],
    restored_without_state: Option<CheckpointId>,
) -> Result<(), TwopcError> {
    let aborts_prepared = options.fresh_start.aborts_prepared();
    let mut prepared = Vec::new();
    let mut decided = Vec::new();
    for s in staged {
        let checkpoint = |h: &TransactionHandle| h.checkpoint().unwrap_or_default();
        match &s.state {
            StagedState::Prepared(h) if h.run != ctx.run && !aborts_prepared => {
                prepared.push((s.transaction.clone(), checkpoint(h)));
            }
            StagedState::PreparedUnreadable { .. } if !aborts_prepared => {
                prepared.push((s.transaction.clone(), 0));
            }
            // Of this run too: a run meets its own decided commit at a fresh
            // start only when its job id was reused without its
            // checkpoints (application mode with a fixed job id), and the
            // replay would write those records twice as well.
            StagedState::Committing(h) => {
                decided.push((s.transaction.clone(), checkpoint(h)));
            }
            _ => {}
        }
    }
    if prepared.is_empty() && decided.is_empty() {
        return Ok(());
    }
    Err(TwopcError::PreparedOnFreshStart(Box::new(
        PreparedOnFreshStart {
            scope: ctx.scope(),
            prepared,
            decided,
            restored_without_state,
        },
    )))
}

/// At a fresh start, after the refusals: aborts the leftovers this subtask
/// owns, and finishes the commits that were decided.
fn resolve_leftovers<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    committer: &Committer,
    ctx: &SubtaskContext,
    staged: &[StagedTransaction],
) -> Result<Vec<TransactionId>, TwopcError> {
    let mut aborted = Vec::new();
    for s in staged.iter().filter(|s| ctx.owns(s.subtask)) {
        let why = match &s.state {
            StagedState::Committing(handle) => {
                roll_forward(dest, clock, committer, ctx, handle)?;
                continue;
            }
            StagedState::Open => {
                "fresh start: open transaction of an earlier attempt, never in a checkpoint"
            }
            StagedState::Prepared(h) if h.run == ctx.run => {
                "fresh start: prepared by an earlier attempt of this run before any checkpoint completed"
            }
            StagedState::Prepared(_) | StagedState::PreparedUnreadable { .. } => {
                "fresh start: prepared by another run; aborted as configured (the fresh-start \
                 policy aborts prepared leftovers)"
            }
        };
        if matches!(&s.state, StagedState::Prepared(h) if h.run != ctx.run)
            || matches!(s.state, StagedState::PreparedUnreadable { .. })
        {
            log::warn!("{}: aborting {} ({why})", ctx.scope(), s.transaction);
        }
        abort_one(dest, ctx, s, why)?;
        aborted.push(s.transaction.clone());
    }
    Ok(aborted)
}

fn abort_one<D: Destination>(
    dest: &mut D,
    ctx: &SubtaskContext,
    s: &StagedTransaction,
    why: &str,
) -> Result<(), TwopcError> {
    log::info!(
        "{}: aborting transaction {} ({why})",
        ctx.scope(),
        s.transaction
    );
    let status = dest
        .abort(&s.transaction)
        .map_err(|source| TwopcError::Destination {
            scope: ctx.scope(),
            action: "aborting",
            transaction: s.transaction.clone(),
            consequence: "Its data stays invisible; the next start retries the abort.",
            source,
        })?;
    match status {
        AbortStatus::Aborted | AbortStatus::NotFound => Ok(()),
        // Listed as staged, found committed: a commit claimed it (a claim
        // whose marker cannot be read lists as prepared) or finished it
        // since. Never reported as aborted (found by review).
        // A claim whose handle cannot be read: a decided commit that this
        // start can neither finish (no handle) nor abort, and the next start
        // meets it the same way. A retryable error would restart the job
        // forever (or leave the lingering cleanup failing at every
        // checkpoint): stop, naming it (found by review).
        // Only while it is still listed so: a destination where the answer
        // means "committed and done" (PostgreSQL: someone finished it by
        // hand meanwhile; the object store: its object exists) lists it no
        // more, and the next start meets nothing (found by re-review).
        AbortStatus::WasCommitted
            if matches!(s.state, StagedState::PreparedUnreadable { .. })
                && still_listed_unreadable(dest, ctx, &s.transaction)? =>
        {
            Err(TwopcError::Scan {
                scope: ctx.scope(),
                action: "resolving a staged transaction",
                source: DestinationError::new(
                    DestinationErrorKind::Corrupt,
                    format!(
                        "transaction {} was listed as staged ({why}) but is committed or being \
                         committed: a commit claimed it, and its prepare marker cannot be read, \
                         so it can be neither finished nor aborted here. Nothing was aborted. \
                         Inspect it with `twopc inspect`, then finish it with `twopc decide \
                         --commit` or restore a checkpoint that holds it",
                        s.transaction
                    ),
                ),
            })
        }
        // Listed as prepared, committed since (a commit of a superseded
        // attempt that finished after the scan): the next start finds it
        // committed and handles it as such (a rewind retracts it).
        AbortStatus::WasCommitted => Err(TwopcError::Destination {
            scope: ctx.scope(),
            action: "aborting",
            transaction: s.transaction.clone(),
            consequence: "Nothing was aborted. Inspect it with `twopc inspect`: if its handle is \
                          damaged, finish it with `twopc decide --commit` or restore a \
                          checkpoint that holds it.",
            source: DestinationError::new(
                DestinationErrorKind::Corrupt,
                format!("it was listed as staged ({why}) but is committed or being committed"),
            ),
        }),
    }
}

/// Whether `txn` is still listed as prepared with an unreadable handle.
fn still_listed_unreadable<D: Destination>(
    dest: &mut D,
    ctx: &SubtaskContext,
    txn: &TransactionId,
) -> Result<bool, TwopcError> {
    Ok(list_staged(dest, ctx, "listing staged transactions again")?
        .iter()
        .any(|s| {
            &s.transaction == txn && matches!(s.state, StagedState::PreparedUnreadable { .. })
        }))
}

/// Expires staged transactions this subtask owns that outlived the
/// retention limit, except those housekeeping must keep.
///
/// Fenced like the lingering cleanup ([`abort_lingering`]), and for the same
/// reason: a superseded attempt whose committer still runs, or an earlier
/// run's subtask after a scale-up, keeps other transactions than the attempt
/// that now writes the share (its [`Keep`] names its own writers and
/// handles), and would expire ones that attempt still needs, which its
/// commit then finds LOST. So each share with a transaction past the
/// retention is confirmed at the destination first, and one held by another
/// attempt or run is left alone. Shares with nothing to expire are not
/// asked: a scan that finds nothing costs no more than before.
pub(crate) fn expire_stale<D: Destination>(
    dest: &mut D,
    ctx: &SubtaskContext,
    retention_ms: u64,
    now_ms: u64,
    keep: &Keep<'_>,
) -> Result<Expiry, TwopcError> {
    let staged = list_staged(dest, ctx, "listing staged transactions for expiry")?;
    let stale = staged.into_iter().filter(|s| {
        ctx.owns(s.subtask)
            && !keep.keeps(s)
            && !matches!(s.state, StagedState::Committing(_))
            && s.last_activity_ms.saturating_add(retention_ms) <= now_ms
    });
    let mut expired = Vec::new();
    let skipped = in_held_shares(dest, ctx, Cleanup::Retention, stale, |dest, s| {
        log::warn!(
            "{}: staged transaction {} ({}) is older than the retention of {}; removing it",
            ctx.scope(),
            s.transaction,
            match &s.state {
                StagedState::Prepared(h) => format!(
                    "prepared for checkpoint {}",
                    h.checkpoint().unwrap_or_default()
                ),
                StagedState::PreparedUnreadable { .. } => "prepared, handle unreadable".to_string(),
                StagedState::Open | StagedState::Committing(_) => "open".to_string(),
            },
            crate::timefmt::exact(retention_ms)
        );
        dest.expire(&s.transaction, now_ms)
            .map_err(|source| TwopcError::Destination {
                scope: ctx.scope(),
                action: "expiring",
                transaction: s.transaction.clone(),
                consequence: "It stays staged; the next scan retries.",
                source,
            })?;
        expired.push(s.transaction);
        Ok(())
    })?;
    Ok(Expiry { expired, skipped })
}
