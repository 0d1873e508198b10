//! The Sink V2 topology of the simulated job, as Flink drives `TwopcSink`
//! (`TwopcWriter`, `TwopcCommitter`): a writer operator and a committer
//! operator of the same parallelism, each subtask over a destination of
//! its own.
//!
//! | Flink                                   | here                                  |
//! |-----------------------------------------|---------------------------------------|
//! | writer `restoreWriter` / `createWriter` | [`WriterSession::open`], then `begin` |
//! | barrier: `prepareCommit()`              | `prepare` for the last snapshotted checkpoint + 1, then `begin` |
//! | barrier: `snapshotState(cp)`            | [`WriterSession::state`]              |
//! | committer `initializeState`             | [`CommitterSession::new`]; the restored committables committed at once |
//! | committer `notifyCheckpointComplete(cp)`| every committable of checkpoints <= cp committed, one `commit` call per checkpoint, each followed by `checkpoint_completed` |
//! | `close()`                               | writer: abort the open transaction; committer: `finish` |
//!
//! Committables travel from writer `i` to committer `i` (forward) and live
//! in the committer's state under Flink's checkpoint id. On rescale, Flink
//! splits the writer states and the committer states apart, so a
//! committable may be restored to another committer subtask than its
//! writer's state, or than the one that owns its writer's index.
//!
//! The committer retries a commit whose outcome is unknown in place
//! ([`CommitRetry::InPlace`], what `TwopcCommitter` does), or, in some
//! schedules, the way Flink's `retryLater()` would have it
//! ([`CommitRetry::RetryLater`]): one attempt, and the committable stays
//! pending until the next checkpoint completion or the end of input.

use std::collections::BTreeMap;

use twopc_core::{
    CheckpointId, CommitStep, CommitterSession, Destination, Restore, SubtaskContext,
    TransactionHandle, TransactionId, TwopcError, WriterSession,
};

use super::super::backend::Backend;
use super::super::checkpoints::{CompletedCheckpoint, Redistribution, SubtaskState};
use super::super::coverage::Section;
use super::super::mortal::Mortal;
use super::super::schedule::{CommitRetry, CrashPoint, Topology};
use super::{poison_refusal, AttemptEnd, Delivery, Operators, Run, SimulatedJob, Step};

pub(super) struct SinkV2<D: Destination> {
    pub(super) writers: Vec<WriterTask<D>>,
    pub(super) committers: Vec<CommitterTask<D>>,
}

pub(super) struct WriterTask<D: Destination> {
    index: usize,
    dest: D,
    session: WriterSession,
    /// The open transaction.
    current: TransactionHandle,
    /// `lastCheckpointId`: the last checkpoint this writer snapshotted (the
    /// restored one at start); `prepareCommit` is not told the id and
    /// records this plus one.
    last_snapshot: CheckpointId,
    /// Its prepare failed and the checkpoint failure was tolerated.
    poisoned: bool,
}

impl<D: Destination> WriterTask<D> {
    pub(super) fn write(
        &mut self,
        bytes: &twopc_core::records::RecordBatchBuf,
    ) -> (TransactionId, bool, Result<(), TwopcError>) {
        let r = self
            .session
            .write(&mut self.dest, &self.current.transaction, bytes)
            .map(|_| ());
        (self.current.transaction.clone(), self.poisoned, r)
    }
}

/// One committable in Flink's committable collector.
struct Request {
    handle: TransactionHandle,
    /// Commit attempts made so far (deferred ones count: the retry bound
    /// holds across deferrals).
    attempts: u32,
}

pub(super) struct CommitterTask<D: Destination> {
    index: usize,
    /// Mortal: it may die in the middle of its housekeeping.
    dest: Mortal<D>,
    session: CommitterSession,
    /// Committables not yet committed, by Flink's checkpoint id.
    pending: BTreeMap<CheckpointId, Vec<Request>>,
}

impl<B: Backend> SimulatedJob<B> {
    fn retry(&self) -> CommitRetry {
        match self.schedule.topology {
            Topology::SinkV2 { retry, .. } => retry,
            Topology::SinkFunction => CommitRetry::InPlace,
        }
    }

    /// Both operators' subtasks initialize concurrently, in any order; a
    /// writer handed no state waits (moments, in Flink) for one that has
    /// state to record the run's lineage, so it opens after those here.
    pub(super) fn start_v2(
        &mut self,
        run: &mut Run,
        restored: Option<&CompletedCheckpoint>,
        committer_redistribution: Redistribution,
    ) -> Result<Operators<B::Dest>, AttemptEnd> {
        let p = run.parallelism;
        let (writer_shares, committer_shares) = match restored {
            Some(cp) => (
                cp.assign(p, self.schedule.redistribution),
                cp.assign(p, committer_redistribution),
            ),
            None => (vec![Vec::new(); p], vec![Vec::new(); p]),
        };
        let mut steps: Vec<(bool, usize)> = self
            .chaos
            .rng
            .order(2 * p)
            .into_iter()
            .map(|k| (k < p, k % p))
            .collect();
        if restored.is_some() {
            steps.sort_by_key(|&(writer, i)| writer && writer_shares[i].is_empty());
        }
        let mut writers: Vec<Option<WriterTask<B::Dest>>> = (0..p).map(|_| None).collect();
        let mut committers: Vec<Option<CommitterTask<B::Dest>>> = (0..p).map(|_| None).collect();
        for (is_writer, i) in steps {
            let opened = if is_writer {
                self.open_writer(run, i, restored, &writer_shares[i])
                    .map(|w| writers[i] = Some(w))
            } else {
                self.open_committer(run, i, restored, &committer_shares[i])
                    .map(|c| committers[i] = Some(c))
            };
            if let Err(end) = opened {
                if let AttemptEnd::Failed(_) = end {
                    let mut live = SinkV2 {
                        writers: writers.into_iter().flatten().collect(),
                        committers: committers.into_iter().flatten().collect(),
                    };
                    self.close_v2(&mut live, 0.7);
                }
                return Err(end);
            }
        }
        Ok(Operators::V2(SinkV2 {
            writers: writers.into_iter().flatten().collect(),
            committers: committers.into_iter().flatten().collect(),
        }))
    }

    /// `restoreWriter`: ownership and start-up checks; the open
    /// transactions of the writer states handed to it are aborted; then the
    /// first transaction begins.
    fn open_writer(
        &mut self,
        run: &mut Run,
        index: usize,
        restored: Option<&CompletedCheckpoint>,
        share: &[SubtaskState],
    ) -> Result<WriterTask<B::Dest>, AttemptEnd> {
        let ctx = SubtaskContext::new(
            self.sink.clone(),
            run.id.clone(),
            index as u32,
            run.parallelism as u32,
        )
        .map_err(|e| AttemptEnd::Failed(e.into()))?
        .with_attempt(run.attempts, 0x5151);
        let restore = restored.map(|cp| Restore {
            checkpoint: cp.id,
            states: share
                .iter()
                .map(|s| {
                    s.writer
                        .clone()
                        .expect("a Sink V2 checkpoint holds writer states")
                })
                .collect(),
            known: Vec::new(),
        });
        let mut dest = self.backend.destination();
        let nonce = self.chaos.rng.next_u64();
        let (mut session, report) = WriterSession::open(
            &mut dest,
            &self.clock,
            ctx,
            &run.options,
            restore.as_ref(),
            Some(nonce),
        )
        .map_err(AttemptEnd::Failed)?;
        if run.past_check.is_none() {
            run.past_check = Some(format!("attempt {}, writer {index}", run.attempts));
        }
        trace!(
            self.trace,
            "w{index} opened ({}), {} writer states; aborted {:?}; retracted {:?}",
            if report.fresh { "fresh" } else { "restored" },
            share.len(),
            report.aborted,
            report
                .retracted
                .iter()
                .map(|c| c.transaction.as_str())
                .collect::<Vec<_>>()
        );
        self.coverage.add(
            Section::Protocol,
            "open: leftover transactions aborted",
            report.aborted.len() as u64,
        );
        self.coverage.add(
            Section::Protocol,
            "open: committed output retracted (REPLACE_RANGE)",
            report.retracted.len() as u64,
        );
        if restored.is_some() {
            self.coverage.bump(
                Section::Protocol,
                if share.is_empty() {
                    "v2 writer: restored without a writer state (lineage from the destination)"
                } else {
                    "v2 writer: restored, its states' open transactions aborted"
                },
            );
            if self.chaos.crash(CrashPoint::DuringRecovery) {
                return Err(AttemptEnd::Crashed(CrashPoint::DuringRecovery));
            }
        }
        let current = session
            .begin(&mut dest, &self.clock)
            .map_err(AttemptEnd::Failed)?;
        Ok(WriterTask {
            index,
            dest,
            session,
            current,
            last_snapshot: restored.map_or(0, |c| c.id),
            poisoned: false,
        })
    }

    /// The committer's `initializeState`: its share of the restored
    /// committables, committed at once (Flink re-commits recovered
    /// committables in `initializeState`).
    fn open_committer(
        &mut self,
        run: &mut Run,
        index: usize,
        restored: Option<&CompletedCheckpoint>,
        share: &[SubtaskState],
    ) -> Result<CommitterTask<B::Dest>, AttemptEnd> {
        let p = run.parallelism;
        let ctx = SubtaskContext::new(self.sink.clone(), run.id.clone(), index as u32, p as u32)
            .map_err(|e| AttemptEnd::Failed(e.into()))?
            .with_attempt(run.attempts, 0x5151);
        let mut c = CommitterTask {
            index,
            dest: Mortal::new(self.backend.destination()),
            session: CommitterSession::new(ctx, run.options.clone(), restored.map(|cp| cp.id)),
            pending: BTreeMap::new(),
        };
        for (checkpoint, handle) in share.iter().flat_map(|s| s.pending.iter()) {
            if handle.subtask as usize % p != index {
                // The committer that owns this index may run its lingering
                // cleanup while this one still holds the committable.
                self.coverage.bump(
                    Section::Protocol,
                    "v2 recovery: committable restored to a committer that does not own its \
                     writer's subtask",
                );
            }
            if self.deferred.contains(&handle.transaction) {
                self.coverage.bump(
                    Section::Protocol,
                    "v2 retryLater: a deferred commit restored after a failover",
                );
            }
            c.pending.entry(*checkpoint).or_default().push(Request {
                handle: handle.clone(),
                attempts: 0,
            });
        }
        trace!(
            self.trace,
            "c{index} initialized with {} restored committables",
            c.pending.values().map(Vec::len).sum::<usize>()
        );
        if let Some(cp) = restored {
            if let Some(end) = self.commit_due(&mut c, cp.id, "v2 recovery: restored committable") {
                return Err(end);
            }
        }
        Ok(c)
    }

    /// One Sink V2 checkpoint: at the barrier each writer prepares
    /// (`prepareCommit`), hands the committable to its committer, and
    /// snapshots; each committer snapshots every committable it holds; once
    /// all acknowledged the checkpoint completes and each committer is
    /// notified.
    pub(super) fn checkpoint_v2(
        &mut self,
        run: &mut Run,
        v2: &mut SinkV2<B::Dest>,
        offset: usize,
        is_final: bool,
    ) -> Step {
        let id = run.next_checkpoint;
        run.next_checkpoint += 1;
        let p = v2.writers.len();
        let (declined, participants) = self.snapshot_participants(p, is_final);
        let mut states: Vec<Option<SubtaskState>> = vec![None; p];
        for (n, &i) in participants.iter().enumerate() {
            if n > 0 && self.chaos.crash(CrashPoint::DuringSnapshot) {
                return Step::End(AttemptEnd::Crashed(CrashPoint::DuringSnapshot));
            }
            let w = &mut v2.writers[i];
            let estimate = w.last_snapshot + 1;
            let prepared =
                w.session
                    .prepare(&mut w.dest, &self.clock, &w.current.transaction, estimate);
            if w.poisoned {
                // The core must refuse to prepare a poisoned transaction.
                return match prepared {
                    Err(e) => Step::End(poison_refusal(e)),
                    Ok(_) => Step::End(AttemptEnd::Failed(TwopcError::Protocol {
                        scope: w.session.scope(),
                        message: "SIMULATION VIOLATION: a poisoned transaction was prepared again"
                            .to_string(),
                    })),
                };
            }
            let handle = match prepared {
                Ok(h) => h,
                Err(e)
                    if self.schedule.tolerates_failed_checkpoints
                        && !is_final
                        && !e.is_fatal()
                        && matches!(
                            e,
                            TwopcError::Destination {
                                action: "preparing",
                                ..
                            }
                        ) =>
                {
                    trace!(
                        self.trace,
                        "w{i} prepareCommit for {id} failed, tolerated: {e}; {} is poisoned",
                        w.current.transaction
                    );
                    self.coverage
                        .bump(Section::Protocol, "failed prepare tolerated (poisoned)");
                    w.poisoned = true;
                    return Step::Continue;
                }
                Err(e) => return Step::End(AttemptEnd::Failed(e)),
            };
            // `prepareCommit` begins the next transaction before it returns
            // the committable: if that fails, the committable is never
            // emitted and the prepared transaction lingers.
            match w.session.begin(&mut w.dest, &self.clock) {
                Ok(next) => w.current = next,
                Err(e) => return Step::End(AttemptEnd::Failed(e)),
            }
            trace!(
                self.trace,
                "w{i} prepareCommit for checkpoint {id}: prepared {} (as checkpoint {estimate}), \
                 began {}",
                handle.transaction,
                w.current.transaction
            );
            if estimate < id {
                self.coverage.bump(
                    Section::Protocol,
                    "v2 writer: prepared with a checkpoint estimate below Flink's id",
                );
            }
            // Forward: the committable reaches committer `i` before the
            // barrier does.
            v2.committers[i]
                .pending
                .entry(id)
                .or_default()
                .push(Request {
                    handle,
                    attempts: 0,
                });
            if self.chaos.crash(CrashPoint::AfterPrepareCommit) {
                return Step::End(AttemptEnd::Crashed(CrashPoint::AfterPrepareCommit));
            }
            let w = &mut v2.writers[i];
            w.last_snapshot = id;
            let writer = w.session.state();
            let pending = v2.committers[i]
                .pending
                .iter()
                .flat_map(|(c, reqs)| reqs.iter().map(|r| (*c, r.handle.clone())))
                .collect();
            states[i] = Some(SubtaskState {
                pending,
                current: w.current.clone(),
                writer: Some(writer),
            });
        }
        if let Some(step) = self.complete_checkpoint(run, id, offset, states, declined) {
            return step;
        }
        let mut notified = 0;
        for j in self.chaos.rng.order(p) {
            match self.deliver_notification(id, is_final, notified, &format!("c{j}")) {
                Delivery::Crashed => {
                    return Step::End(AttemptEnd::Crashed(CrashPoint::DuringNotify))
                }
                Delivery::Lost => continue,
                Delivery::Delivered => notified += 1,
            }
            if let Some(end) =
                self.commit_due(&mut v2.committers[j], id, "v2 commit on notification")
            {
                return Step::End(end);
            }
        }
        Step::Continue
    }

    /// Commits every committable of checkpoints up to `up_to`, oldest
    /// checkpoint first, one `Committer.commit` call per checkpoint as
    /// Flink makes them; after each call the committer reports the highest
    /// checkpoint among its handles (`TwopcCommitter`): housekeeping.
    fn commit_due(
        &mut self,
        c: &mut CommitterTask<B::Dest>,
        up_to: CheckpointId,
        what: &str,
    ) -> Option<AttemptEnd> {
        let retry = self.retry();
        let due: Vec<CheckpointId> = c.pending.range(..=up_to).map(|(k, _)| *k).collect();
        for checkpoint in due {
            let requests = c.pending.remove(&checkpoint).unwrap_or_default();
            let mut completed = None;
            let mut left = Vec::new();
            for mut req in requests {
                completed = completed.max(req.handle.checkpoint());
                if req.attempts > 0 {
                    self.coverage.bump(
                        Section::Protocol,
                        if up_to == CheckpointId::MAX {
                            "v2 retryLater: a deferred commit retried at the end of input"
                        } else {
                            "v2 retryLater: a deferred commit retried at a later notification"
                        },
                    );
                }
                let step = match retry {
                    CommitRetry::InPlace => c
                        .session
                        .commit(&mut c.dest, &self.clock, &req.handle)
                        .map(CommitStep::Done),
                    CommitRetry::RetryLater => {
                        req.attempts += 1;
                        c.session.commit_attempt(
                            &mut c.dest,
                            &self.clock,
                            &req.handle,
                            req.attempts,
                        )
                    }
                };
                match step {
                    Ok(CommitStep::Done(outcome)) => {
                        trace!(
                            self.trace,
                            "c{} commit {} (checkpoint {checkpoint}, as {}): {outcome:?}",
                            c.index,
                            req.handle.transaction,
                            req.handle.checkpoint().unwrap_or_default()
                        );
                        self.coverage
                            .bump(Section::Protocol, format!("{what}: {outcome:?}"));
                        if self.chaos.crash(CrashPoint::AfterCommitBeforeAck) {
                            return Some(AttemptEnd::Crashed(CrashPoint::AfterCommitBeforeAck));
                        }
                    }
                    Ok(CommitStep::RetryAfter { error, .. }) => {
                        // `retryLater()`: left pending, retried by id later.
                        trace!(
                            self.trace,
                            "c{} commit {} attempt {} unknown ({error}): retried later",
                            c.index,
                            req.handle.transaction,
                            req.attempts
                        );
                        self.coverage.bump(
                            Section::Protocol,
                            "v2 retryLater: commit deferred (outcome unknown)",
                        );
                        self.deferred.insert(req.handle.transaction.clone());
                        left.push(req);
                    }
                    Err(e) => {
                        trace!(
                            self.trace,
                            "c{} commit {} failed: {e}",
                            c.index,
                            req.handle.transaction
                        );
                        return Some(AttemptEnd::Failed(e));
                    }
                }
            }
            if !left.is_empty() {
                c.pending.insert(checkpoint, left);
            }
            if let Some(done) = completed {
                if let Some(end) = self.housekeeping(c, done) {
                    return Some(end);
                }
            }
        }
        None
    }

    /// `checkpoint_completed` after one commit call; the process may die
    /// before or during it.
    fn housekeeping(
        &mut self,
        c: &mut CommitterTask<B::Dest>,
        checkpoint: CheckpointId,
    ) -> Option<AttemptEnd> {
        let dies = self.chaos.housekeeping_crash();
        if let Some(calls) = dies {
            c.dest.arm(calls);
        }
        let result = c
            .session
            .checkpoint_completed(&mut c.dest, &self.clock, checkpoint);
        if let Some(calls) = dies {
            trace!(
                self.trace,
                "c{} dies in its housekeeping for checkpoint {checkpoint} after {calls} \
                 destination calls ({}): {result:?}",
                c.index,
                if c.dest.died() {
                    "cut short"
                } else {
                    "it had finished"
                }
            );
            return Some(AttemptEnd::Crashed(CrashPoint::DuringHousekeeping));
        }
        match result {
            Ok(report) => {
                for t in &report.aborted {
                    trace!(self.trace, "c{} aborted lingering {t}", c.index);
                }
                self.coverage.add(
                    Section::Protocol,
                    "v2 housekeeping: lingering transactions aborted",
                    report.aborted.len() as u64,
                );
                for f in &report.failures {
                    trace!(self.trace, "c{} housekeeping failed: {f}", c.index);
                    self.coverage
                        .bump(Section::Protocol, "housekeeping failed, retried later");
                }
                None
            }
            Err(e) => Some(AttemptEnd::Failed(e)),
        }
    }

    /// End of input: the final checkpoint, whose notification the tasks
    /// wait for; commits still deferred are retried until they resolve
    /// (Flink retries them before the committer finishes); then each
    /// subtask closes: the committer's `finish`, the writer's abort of its
    /// open transaction.
    pub(super) fn finish_v2(
        &mut self,
        run: &mut Run,
        v2: &mut SinkV2<B::Dest>,
        offset: usize,
    ) -> Result<AttemptEnd, String> {
        trace!(self.trace, "end of input: final checkpoint");
        if let Step::End(end) = self.checkpoint_v2(run, v2, offset, true) {
            return Ok(end);
        }
        for j in self.chaos.rng.order(v2.committers.len()) {
            // Every pass spends one attempt of each pending commit, so the
            // retry bound ends this loop.
            while !v2.committers[j].pending.is_empty() {
                self.clock.advance(1_000);
                if let Some(end) = self.commit_due(
                    &mut v2.committers[j],
                    CheckpointId::MAX,
                    "v2 commit at the end of input",
                ) {
                    return Ok(end);
                }
            }
        }
        if self.chaos.crash(CrashPoint::DuringFinish) {
            return Ok(AttemptEnd::Crashed(CrashPoint::DuringFinish));
        }
        for i in self.chaos.rng.order(v2.writers.len()) {
            // Flink closes the chained operators of a task in either order
            // as far as the destination can tell.
            let committer_first = self.chaos.rng.chance(0.5);
            for committer in [committer_first, !committer_first] {
                if committer {
                    let c = &mut v2.committers[i];
                    match c.session.finish(&mut c.dest, &self.clock) {
                        Ok(aborted) => {
                            for t in aborted {
                                trace!(self.trace, "c{i} aborted lingering {t} at the end");
                            }
                        }
                        Err(e) => return Ok(AttemptEnd::Failed(e)),
                    }
                } else {
                    let w = &mut v2.writers[i];
                    if let Err(e) = w.session.abort(&mut w.dest, &w.current) {
                        return Ok(AttemptEnd::Failed(e));
                    }
                }
            }
        }
        trace!(self.trace, "all writers and committers closed");
        Ok(AttemptEnd::Finished)
    }

    /// `close()` of each task still there (each with chance `chance`):
    /// the writer aborts its open transaction, the committer runs `finish`
    /// (`TwopcCommitter.close` does, after a failure too); errors are only
    /// logged.
    pub(super) fn close_v2(&mut self, v2: &mut SinkV2<B::Dest>, chance: f64) {
        for w in v2.writers.iter_mut() {
            if self.chaos.rng.chance(chance) {
                let r = w.session.abort(&mut w.dest, &w.current);
                trace!(self.trace, "w{} closed: {r:?}", w.index);
            }
        }
        for c in v2.committers.iter_mut() {
            if self.chaos.rng.chance(chance) {
                let r = c.session.finish(&mut c.dest, &self.clock);
                trace!(self.trace, "c{} closed: {r:?}", c.index);
                if let Ok(aborted) = r {
                    self.coverage.add(
                        Section::Protocol,
                        "v2 committer close after failure: lingering aborted",
                        aborted.len() as u64,
                    );
                }
            }
        }
    }
}
