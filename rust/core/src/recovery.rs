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
//!   still shutting down is waited for, briefly.

use std::collections::{BTreeSet, HashSet};

use crate::clock::Clock;
use crate::committer::Committer;
use crate::config::{RewindPolicy, SinkOptions, SubtaskContext};
use crate::destination::{
    CommittedTransaction, Destination, LineageRecord, OwnerInfo, Ownership, StagedState,
    StagedTransaction,
};
use crate::error::{
    ConfigError, ExistingOutput, OwnershipConflict, PreparedOnFreshStart, RewindDetected,
    TwopcError,
};
use crate::handle::{HandleError, TransactionHandle};
use crate::ids::{CheckpointId, LineageId, TransactionId};

/// What Flink restored to one subtask: the checkpoint id and the transaction
/// handles of its share of the restored state. Any share will do (the
/// handles give the lineage; lingering transactions are found later, see
/// the module documentation), but it must not be empty after a restore, or
/// the start counts as fresh: the Java shim snapshots enough copies of each
/// open handle that every subtask of any later parallelism receives one.
#[derive(Clone, Debug, Default)]
pub struct Restore {
    pub checkpoint: CheckpointId,
    pub known: Vec<TransactionHandle>,
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

pub(crate) fn start<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    committer: &Committer,
    ctx: &SubtaskContext,
    options: &SinkOptions,
    restore: Option<&Restore>,
) -> Result<StartupReport, TwopcError> {
    let scope = ctx.scope();
    claim_ownership(dest, clock, ctx, options)?;
    let restored = match restore {
        Some(r) if !r.known.is_empty() => Some(r),
        _ => None,
    };
    let scan_err = |action: &'static str| {
        let scope = scope.clone();
        move |source| TwopcError::Scan {
            scope,
            action,
            source,
        }
    };

    let Some(restore) = restored else {
        let lineage = LineageId::of_fresh_run(&ctx.run);
        let staged = dest
            .staged()
            .map_err(scan_err("listing staged transactions at a fresh start"))?;
        refuse_prepared_leftovers(ctx, options, &staged)?;
        let lineages = dest
            .lineages()
            .map_err(scan_err("reading committed lineages at a fresh start"))?;
        let earlier: Vec<_> = lineages
            .into_iter()
            .filter(|l| l.lineage != lineage)
            .collect();
        if !earlier.is_empty() && !options.fresh_start.appends() {
            return Err(TwopcError::ExistingOutputOnFreshStart(Box::new(
                ExistingOutput {
                    scope,
                    lineages: earlier,
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
        return Ok(StartupReport {
            lineage,
            fresh: true,
            aborted,
            retracted: Vec::new(),
        });
    };

    for h in &restore.known {
        if h.sink != ctx.sink {
            return Err(TwopcError::Config(ConfigError::new(format!(
                "the restored state holds transaction {} of sink '{}', but this sink is '{}'. \
                 The sink id must stay the same across restores; set it back to '{}'",
                h.transaction, h.sink, ctx.sink, h.sink
            ))));
        }
    }
    let lineages: BTreeSet<LineageId> = restore.known.iter().map(|h| h.lineage).collect();
    if lineages.len() > 1 {
        return Err(TwopcError::State {
            scope,
            source: HandleError::Invalid(format!(
                "restored transactions come from {} different lineages ({lineages:?}); state of \
                 unrelated runs was merged",
                lineages.len()
            )),
        });
    }
    let lineage = restore.known[0].lineage;

    let retracted = check_rewind(dest, ctx, options, restore, lineage)?;
    Ok(StartupReport {
        lineage,
        fresh: false,
        aborted: Vec::new(),
        retracted,
    })
}

/// Aborts the staged transactions this subtask owns that are not of its own
/// attempt and not `protected`. Called once the first checkpoint of this
/// attempt completed, when every restored transaction has been resolved by
/// whichever subtask restored it (see the module documentation).
pub(crate) fn abort_lingering<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    committer: &Committer,
    ctx: &SubtaskContext,
    attempt_nonce: u64,
    protected: &HashSet<TransactionId>,
) -> Result<Vec<TransactionId>, TwopcError> {
    let staged = dest.staged().map_err(|source| TwopcError::Scan {
        scope: ctx.scope(),
        action: "listing staged transactions for lingering ones",
        source,
    })?;
    let mut aborted = Vec::new();
    for s in staged {
        if !ctx.owns(s.subtask)
            || s.attempt_nonce == attempt_nonce
            || protected.contains(&s.transaction)
        {
            continue;
        }
        if let StagedState::Committing(handle) = &s.state {
            roll_forward(dest, clock, committer, ctx, handle)?;
            continue;
        }
        abort_one(dest, ctx, &s, "lingering: no restored checkpoint knows it")?;
        aborted.push(s.transaction);
    }
    Ok(aborted)
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
/// shutting down.
fn claim_ownership<D: Destination, C: Clock>(
    dest: &mut D,
    clock: &C,
    ctx: &SubtaskContext,
    options: &SinkOptions,
) -> Result<(), TwopcError> {
    let claim = ctx.owner_claim();
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
            "{}: waiting for the destination's share of subtask {} to be released by {}",
            ctx.scope(),
            ctx.subtask,
            holder.holder
        );
        clock.sleep_ms(OWNER_POLL_MS);
    }
}

/// What a holder is, whether that is fatal, and whether waiting may help.
fn diagnose_holder(ctx: &SubtaskContext, holder: &OwnerInfo) -> (String, bool, bool) {
    let sink = &ctx.sink;
    match &holder.claim {
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

fn check_rewind<D: Destination>(
    dest: &mut D,
    ctx: &SubtaskContext,
    options: &SinkOptions,
    restore: &Restore,
    lineage: LineageId,
) -> Result<Vec<CommittedTransaction>, TwopcError> {
    let scope = ctx.scope();
    let mut later = dest
        .committed_after(lineage, restore.checkpoint)
        .map_err(|source| TwopcError::Scan {
            scope: scope.clone(),
            action: "reading commit records for rewind detection",
            source,
        })?;
    if later.is_empty() {
        return Ok(later);
    }
    later.sort_by(|a, b| (a.checkpoint, &a.transaction).cmp(&(b.checkpoint, &b.transaction)));
    match options.rewind {
        RewindPolicy::Fail => Err(TwopcError::Rewind(Box::new(RewindDetected {
            scope,
            restored_checkpoint: restore.checkpoint,
            lineage,
            committed_after: later
                .iter()
                .map(|c| (c.transaction.clone(), c.checkpoint))
                .collect(),
        }))),
        RewindPolicy::ReplaceRange => {
            // Besides what this subtask owns, retract every committed
            // transaction the restored state knows (a restored open one,
            // committed by a later checkpoint). Flink splits list state in
            // contiguous ranges, not by `owns`, so any subtask may be handed
            // that state; its `recoverAndAbort` runs right after this open
            // and must not find the transaction still committed, whatever
            // order the subtasks start in (found by the simulation: the
            // abort was refused as misuse and the job restarted in a loop).
            // Retraction is repeatable, so two subtasks doing it is fine.
            let known: HashSet<&TransactionId> =
                restore.known.iter().map(|h| &h.transaction).collect();
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

/// At a fresh start: prepared transactions of another run (or whose handle
/// cannot be read) may belong to a completed checkpoint of an earlier run
/// whose state was lost. Stop and name them all, unless the policy says to
/// abort them. The list is the sink's, every subtask's, since each subtask
/// lists the whole staging area.
fn refuse_prepared_leftovers(
    ctx: &SubtaskContext,
    options: &SinkOptions,
    staged: &[StagedTransaction],
) -> Result<(), TwopcError> {
    if options.fresh_start.aborts_prepared() {
        return Ok(());
    }
    let foreign: Vec<(TransactionId, CheckpointId)> = staged
        .iter()
        .filter_map(|s| match &s.state {
            StagedState::Prepared(h) if h.run != ctx.run => {
                Some((s.transaction.clone(), h.checkpoint().unwrap_or_default()))
            }
            StagedState::PreparedUnreadable { .. } => Some((s.transaction.clone(), 0)),
            _ => None,
        })
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    Err(TwopcError::PreparedOnFreshStart(Box::new(
        PreparedOnFreshStart {
            scope: ctx.scope(),
            prepared: foreign,
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
    dest.abort(&s.transaction)
        .map(|_| ())
        .map_err(|source| TwopcError::Destination {
            scope: ctx.scope(),
            action: "aborting",
            transaction: s.transaction.clone(),
            consequence: "Its data stays invisible; the next start retries the abort.",
            source,
        })
}

/// Expires staged transactions this subtask owns that outlived the
/// retention limit, except those it still needs (`protected`).
pub(crate) fn expire_stale<D: Destination>(
    dest: &mut D,
    ctx: &SubtaskContext,
    retention_ms: u64,
    now_ms: u64,
    protected: &HashSet<TransactionId>,
) -> Result<Vec<TransactionId>, TwopcError> {
    let staged = dest.staged().map_err(|source| TwopcError::Scan {
        scope: ctx.scope(),
        action: "listing staged transactions for expiry",
        source,
    })?;
    let mut expired = Vec::new();
    for s in staged {
        if !ctx.owns(s.subtask)
            || protected.contains(&s.transaction)
            || matches!(s.state, StagedState::Committing(_))
            || s.last_activity_ms.saturating_add(retention_ms) > now_ms
        {
            continue;
        }
        log::warn!(
            "{}: staged transaction {} ({}) is older than the retention of {retention_ms} ms; \
             removing it",
            ctx.scope(),
            s.transaction,
            match &s.state {
                StagedState::Prepared(h) => format!(
                    "prepared for checkpoint {}",
                    h.checkpoint().unwrap_or_default()
                ),
                StagedState::PreparedUnreadable { .. } => "prepared, handle unreadable".to_string(),
                StagedState::Open | StagedState::Committing(_) => "open".to_string(),
            }
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
    }
    Ok(expired)
}
