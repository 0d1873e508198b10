//! The simulated Flink job, in the schedule's topology: it drives the real
//! [`SubtaskSink`] the way Flink 1.20's `TwoPhaseCommitSinkFunction` drives
//! its hooks (the SinkFunction shim), or the real `WriterSession` and
//! `CommitterSession` apart the way Flink drives `TwopcSink`'s writer and
//! committer (Sink V2, in `job/v2.rs`), through failovers, operator
//! restores and restarts without state, and checks the invariants at every
//! stop. Both topologies share the source, the checkpoint store, the
//! environment's trouble and the oracle.
//!
//! Vocabulary: a *run* is one submission (one Flink job id); an *attempt*
//! is one execution of it, ended by a finish, a failure or a crash. A
//! failover restarts the same run from its latest completed checkpoint; a
//! restore from a savepoint and a start without state are new runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use twopc_core::error::LostTransaction;
use twopc_core::records::RecordBatchBuf;
use twopc_core::sink::SubtaskSink;
use twopc_core::{
    AbortOutcome, CheckpointId, Clock, Destination, FreshStartPolicy, LineageId, Restore,
    RewindPolicy, RunId, SinkId, SinkOptions, SubtaskContext, TransactionHandle, TransactionId,
    TwopcError,
};

use super::backend::Backend;
use super::checkpoints::{CheckpointStore, CompletedCheckpoint, SubtaskState};
use super::clock::ManualClock;
use super::coverage::{Coverage, Section};
use super::faults::SharedFaults;
use super::invariants;
use super::rng::Rng;
use super::schedule::{
    Chaos, CrashPoint, Mutant, OperatorAction, Schedule, Topology, VISIBLE_FIRST_LABEL,
};
use super::source::Source;
use super::trace::Trace;

mod v2;

/// A run that keeps failing without finishing is a liveness bug: faults and
/// crashes are budgeted, so every run must get through eventually.
const MAX_ATTEMPTS_PER_RUN: u32 = 60;
const MAX_SUBMISSIONS: u32 = 12;

/// One subtask of the sink operator, holding what
/// `TwoPhaseCommitSinkFunction` holds.
struct SubtaskRuntime<D: Destination> {
    index: usize,
    sink: SubtaskSink<D, ManualClock>,
    /// `currentTransactionHolder`.
    current: TransactionHandle,
    /// `pendingCommitTransactions`: checkpoint id → pre-committed handle.
    /// Ids only grow within an attempt, so key order is insertion order.
    pending: BTreeMap<CheckpointId, TransactionHandle>,
    /// The current transaction's prepare failed and the checkpoint failure
    /// was tolerated: the core must refuse every further use of it.
    poisoned: bool,
}

impl<D: Destination> SubtaskRuntime<D> {
    /// `snapshotState`: pre-commit the current transaction, file it under
    /// the checkpoint, begin the next one, and write one `State`.
    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<SubtaskState, TwopcError> {
        let prepared = self.sink.prepare(&self.current.transaction, checkpoint)?;
        self.pending.insert(checkpoint, prepared.clone());
        // Until the next transaction is begun, Flink's current transaction
        // is still the one just pre-committed: if `begin` fails, `close()`
        // aborts it, which is safe because this checkpoint can no longer
        // complete.
        self.current = prepared;
        self.current = self.sink.begin()?;
        Ok(SubtaskState {
            pending: self.pending.iter().map(|(c, h)| (*c, h.clone())).collect(),
            current: self.current.clone(),
            // Taken after the snapshot's begin, as the shim takes it.
            writer: Some(self.sink.writer_state()),
        })
    }

    /// `close()`: abort the current transaction.
    fn close(&mut self) -> Result<AbortOutcome, TwopcError> {
        self.sink.abort(&self.current)
    }
}

/// The sink's operators in one attempt, in the schedule's topology.
enum Operators<D: Destination> {
    Sink(Vec<SubtaskRuntime<D>>),
    V2(v2::SinkV2<D>),
}

impl<D: Destination> Operators<D> {
    fn parallelism(&self) -> usize {
        match self {
            Operators::Sink(subtasks) => subtasks.len(),
            Operators::V2(v2) => v2.writers.len(),
        }
    }

    /// Stages a batch into subtask `i`'s open transaction: the
    /// transaction, whether it is poisoned, and what the core said.
    fn write(
        &mut self,
        i: usize,
        bytes: &RecordBatchBuf,
    ) -> (TransactionId, bool, Result<(), TwopcError>) {
        match self {
            Operators::Sink(subtasks) => {
                let rt = &mut subtasks[i];
                let r = rt.sink.write(&rt.current.transaction, bytes).map(|_| ());
                (rt.current.transaction.clone(), rt.poisoned, r)
            }
            Operators::V2(v2) => v2.writers[i].write(bytes),
        }
    }
}

/// What the scheduler knows about the outcome a submission must have.
enum Expectation {
    /// Nothing special: the run proceeds (or stops for other reasons).
    Proceed,
    /// A restore under the FAIL rewind policy while output committed after
    /// the restored checkpoint exists: must stop with REWIND naming it all.
    Rewind {
        committed_after: BTreeSet<(TransactionId, CheckpointId)>,
        visible_before: Vec<Vec<u8>>,
    },
    /// A start without state while prepared transactions exist (unless the
    /// policy aborts them), or commits of an earlier run were decided but
    /// did not finish (whatever the policy): must stop with
    /// PREPARED_ON_FRESH_START naming them all, changing none.
    Refusal {
        /// Every prepared transaction at submission (none may go).
        prepared: BTreeSet<(TransactionId, CheckpointId)>,
        /// False when the policy aborts prepared leftovers: the refusal
        /// (for decided commits) names none of them.
        names_prepared: bool,
        decided: BTreeSet<(TransactionId, CheckpointId)>,
    },
    /// A start without state, not allowed to append, while output of other
    /// lineages is committed: must stop naming every such lineage, changing
    /// nothing.
    ExistingOutput {
        lineages: BTreeSet<LineageId>,
        visible_before: Vec<Vec<u8>>,
    },
}

/// One submission of the job (one Flink job id).
struct Run {
    id: RunId,
    /// 1-based position among the submissions (scripted events use it).
    number: u32,
    parallelism: usize,
    options: SinkOptions,
    /// The run's checkpoint store: the restored savepoint, then its own
    /// completed checkpoints. A failover restores the latest.
    latest: Option<CompletedCheckpoint>,
    /// Where the source starts when there is nothing to restore.
    start_offset: usize,
    next_checkpoint: CheckpointId,
    attempts: u32,
    restored_from: Option<CompletedCheckpoint>,
    expect: Expectation,
    /// The first subtask that got past the start-up check (`open`
    /// returned), as "attempt a, subtask i": once set, the run proceeded.
    past_check: Option<String>,
}

enum AttemptEnd {
    Finished,
    Failed(TwopcError),
    /// The core refused to use a poisoned transaction again (the expected
    /// answer): the task fails and Flink restarts it.
    PoisonRefused(TwopcError),
    Crashed(CrashPoint),
    Operator(OperatorAction),
}

enum JobEnd {
    Finished,
    Fatal(TwopcError),
    Operator(OperatorAction),
}

/// What became of one notification of a completed checkpoint.
enum Delivery {
    Delivered,
    Lost,
    /// The attempt crashed before delivering it.
    Crashed,
}

/// Whether an attempt goes on after a checkpoint.
enum Step {
    Continue,
    End(AttemptEnd),
}

pub struct SimulatedJob<B: Backend> {
    schedule: Schedule,
    backend: B,
    source: Source,
    clock: ManualClock,
    chaos: Chaos,
    faults: SharedFaults,
    /// Retained checkpoints of the live branch, across runs.
    store: CheckpointStore,
    /// Records each transaction was given, to judge a LOST report.
    ledger: HashMap<TransactionId, Vec<usize>>,
    /// Transactions the destination timed out on its own.
    expired: BTreeSet<TransactionId>,
    /// Sink V2 under `retryLater`: transactions whose commit was deferred.
    deferred: BTreeSet<TransactionId>,
    trace: Trace,
    coverage: Coverage,
    sink: SinkId,
    submissions: u32,
    fatal_stops: u32,
}

impl<B: Backend> SimulatedJob<B> {
    pub fn new(
        schedule: Schedule,
        backend: B,
        clock: ManualClock,
        faults: SharedFaults,
        rng: Rng,
        trace: Trace,
    ) -> Self {
        SimulatedJob {
            source: Source::new(schedule.records),
            chaos: Chaos::new(&schedule, rng, faults.clone()),
            schedule,
            backend,
            clock,
            faults,
            store: CheckpointStore::default(),
            ledger: HashMap::new(),
            expired: BTreeSet::new(),
            deferred: BTreeSet::new(),
            trace,
            coverage: Coverage::default(),
            sink: SinkId::new("sim").expect("valid sink id"),
            submissions: 0,
            fatal_stops: 0,
        }
    }

    /// Runs the schedule to its end; `Err` describes a violated invariant.
    pub fn run(mut self) -> (Result<(), String>, Coverage) {
        trace!(
            self.trace,
            "schedule {} on {}: {}",
            self.schedule.seed,
            self.backend.name(),
            self.schedule.describe()
        );
        self.coverage
            .bump(Section::Schedules, self.schedule.topology.label());
        if self.schedule.visible_first {
            self.coverage.bump(Section::Schedules, VISIBLE_FIRST_LABEL);
        }
        let result = self.drive();
        let injected = self.faults.lock().injected.clone();
        for (what, n) in injected {
            // The I/O faults of visible-first schedules once more on their
            // own, so that the run can tell those states were reached in
            // that order too.
            if self.schedule.visible_first && what.starts_with("I/O ") {
                self.coverage
                    .add(Section::FaultInjected, format!("visible-first: {what}"), n);
            }
            self.coverage.add(Section::FaultInjected, what, n);
        }
        (result, self.coverage)
    }

    fn drive(&mut self) -> Result<(), String> {
        let mut run = self.submit_fresh(0, self.schedule.parallelism, FreshStartPolicy::Fail);
        loop {
            if self.submissions > MAX_SUBMISSIONS {
                return Err(format!(
                    "no progress: {} submissions without finishing",
                    self.submissions
                ));
            }
            match self.run_job(&mut run)? {
                JobEnd::Finished => {
                    self.expectation_met(&run, None)?;
                    return self.check_finished();
                }
                JobEnd::Fatal(err) => {
                    self.expectation_met(&run, Some(&err))?;
                    self.fatal_stops += 1;
                    self.coverage.bump(Section::FatalStop, stop_label(&err));
                    match self.recover_from(err, &run)? {
                        Some(next) => run = next,
                        None => return Ok(()),
                    }
                }
                JobEnd::Operator(action) => {
                    if !matches!(run.expect, Expectation::Proceed) && run.past_check.is_none() {
                        self.coverage.bump(
                            Section::OperatorAction,
                            "took over a run whose start-up check had failed transiently",
                        );
                    }
                    self.expectation_met(&run, None)?;
                    run = self.operator(action)?;
                }
            }
        }
    }

    // ----- submissions -------------------------------------------------

    fn new_run_id(&mut self) -> RunId {
        self.submissions += 1;
        RunId::new(format!("job{:02}", self.submissions)).expect("valid run id")
    }

    /// A submission without state, the source starting at `start_offset`.
    fn submit_fresh(
        &mut self,
        start_offset: usize,
        parallelism: usize,
        fresh_start: FreshStartPolicy,
    ) -> Run {
        let id = self.new_run_id();
        let lineage = LineageId::of_fresh_run(&id);
        let prepared = self.prepared_set();
        let earlier: BTreeSet<LineageId> = self
            .backend
            .committed()
            .into_iter()
            .map(|c| c.lineage)
            .filter(|l| *l != lineage)
            .collect();
        // Every decided commit is another run's: this run is new.
        let decided = self.decided_set();
        let expect =
            if (!fresh_start.aborts_prepared() && !prepared.is_empty()) || !decided.is_empty() {
                Expectation::Refusal {
                    prepared,
                    names_prepared: !fresh_start.aborts_prepared(),
                    decided,
                }
            } else if !fresh_start.appends() && !earlier.is_empty() {
                Expectation::ExistingOutput {
                    lineages: earlier,
                    visible_before: self.backend.visible(),
                }
            } else {
                // A new lineage begins; the old checkpoints no longer match it.
                self.store.clear();
                Expectation::Proceed
            };
        let run = Run {
            id,
            number: self.submissions,
            parallelism,
            options: self.schedule.options(RewindPolicy::Fail, fresh_start),
            latest: None,
            start_offset,
            next_checkpoint: 1,
            attempts: 0,
            restored_from: None,
            expect,
            past_check: None,
        };
        trace!(
            self.trace,
            "submit {} without state (source from offset {start_offset}, parallelism \
             {parallelism}, fresh start {fresh_start:?}){}",
            run.id,
            match run.expect {
                Expectation::Refusal { .. } =>
                    ": prepared or decided transactions exist, expecting a refusal",
                Expectation::ExistingOutput { .. } =>
                    ": earlier runs' output exists, expecting a refusal",
                _ => "",
            }
        );
        run
    }

    /// The policy for a start without state from the visible prefix, which
    /// the operator chose knowing that earlier runs' output stays: appending.
    fn appending(abort_prepared: bool) -> FreshStartPolicy {
        if abort_prepared {
            FreshStartPolicy::AppendAndAbortPrepared
        } else {
            FreshStartPolicy::Append
        }
    }

    /// A submission restoring `from` (a retained checkpoint or savepoint).
    fn submit_restore(
        &mut self,
        from: CompletedCheckpoint,
        rewind: RewindPolicy,
        parallelism: usize,
    ) -> Run {
        let lineage = from.lineage();
        let later: BTreeSet<(TransactionId, CheckpointId)> = self
            .backend
            .committed()
            .into_iter()
            .filter(|c| c.lineage == lineage && c.checkpoint > from.id)
            .map(|c| (c.transaction, c.checkpoint))
            // A decided commit counts as committed after the restore too.
            .chain(
                self.backend
                    .decided()
                    .into_iter()
                    .filter(|(_, c, l)| *l == lineage && *c > from.id)
                    .map(|(t, c, _)| (t, c)),
            )
            .collect();
        let expect = if rewind == RewindPolicy::Fail && !later.is_empty() {
            Expectation::Rewind {
                committed_after: later,
                visible_before: self.backend.visible(),
            }
        } else {
            // Checkpoints after `from` belong to an abandoned branch now.
            self.store.cut_after(from.id);
            Expectation::Proceed
        };
        if parallelism != from.states.len() {
            self.coverage
                .bump(Section::OperatorAction, "rescaled on restore");
        }
        let id = self.new_run_id();
        let run = Run {
            id,
            number: self.submissions,
            parallelism,
            options: self.schedule.options(rewind, FreshStartPolicy::Fail),
            latest: Some(from.clone()),
            start_offset: from.offset,
            // Flink numbers checkpoints after a restore from the restored
            // id on, so ids repeat across runs.
            next_checkpoint: from.id + 1,
            attempts: 0,
            restored_from: Some(from),
            expect,
            past_check: None,
        };
        trace!(
            self.trace,
            "submit {} restoring checkpoint {} (offset {}, parallelism {} -> {parallelism}, \
             rewind {rewind:?}){}",
            run.id,
            run.restored_checkpoint(),
            run.start_offset,
            run.restored_from.as_ref().map_or(0, |c| c.states.len()),
            if matches!(run.expect, Expectation::Rewind { .. }) {
                ": output was committed after it, expecting REWIND"
            } else {
                ""
            }
        );
        run
    }

    /// An operator's action on a running job, after it was stopped.
    fn operator(&mut self, action: OperatorAction) -> Result<Run, String> {
        let parallelism = self.chaos.parallelism();
        match action {
            OperatorAction::RestoreSavepoint => {
                let all = self.store.all();
                let from = all[self.chaos.pick_restore(all.len())].clone();
                let latest = self.store.latest().map(|c| c.id) == Some(from.id);
                let rewind = self.chaos.rewind_policy();
                self.coverage.bump(
                    Section::OperatorAction,
                    format!(
                        "restore {} checkpoint, rewind {rewind:?}",
                        if latest { "the latest" } else { "an older" }
                    ),
                );
                Ok(self.submit_restore(from, rewind, parallelism))
            }
            OperatorAction::StatelessRestart => {
                let offset = self
                    .visible_prefix()
                    .ok_or("a stateless restart was chosen without a clean prefix")?;
                // Half the time the operator forgets that output of the
                // earlier run exists: the start must refuse, and the operator
                // then says to append.
                let policy = self.chaos.fresh_start_policy();
                self.coverage.bump(
                    Section::OperatorAction,
                    format!("restart without state, fresh start {policy:?}"),
                );
                Ok(self.submit_fresh(offset, parallelism, policy))
            }
        }
    }

    /// What the operator does after a fatal stop, following the error's
    /// own instructions. The environment is fixed from here on.
    fn recover_from(&mut self, err: TwopcError, run: &Run) -> Result<Option<Run>, String> {
        self.chaos.calm();
        trace!(self.trace, "JOB STOPPED: {err}");
        let parallelism = self.chaos.parallelism();
        match err {
            TwopcError::Lost(lost) => {
                let given = self
                    .ledger
                    .get(&lost.transaction)
                    .cloned()
                    .unwrap_or_default();
                invariants::lost_is_genuine(&lost, &self.expired, &given, &self.backend.visible())?;
                match self.store.latest_before(lost.checkpoint).cloned() {
                    Some(cp) => {
                        self.coverage.bump(
                            Section::OperatorAction,
                            "after LOST: restore an earlier checkpoint, REPLACE_RANGE",
                        );
                        Ok(Some(self.submit_restore(
                            cp,
                            RewindPolicy::ReplaceRange,
                            parallelism,
                        )))
                    }
                    None => self.reconcile_by_hand(&lost, parallelism),
                }
            }
            TwopcError::Rewind(_) => {
                let savepoint = run
                    .restored_from
                    .clone()
                    .ok_or("REWIND from a run that restored nothing")?;
                if self.chaos.rng.chance(0.5) {
                    self.coverage.bump(
                        Section::OperatorAction,
                        "after REWIND: same savepoint with REPLACE_RANGE",
                    );
                    Ok(Some(self.submit_restore(
                        savepoint,
                        RewindPolicy::ReplaceRange,
                        parallelism,
                    )))
                } else {
                    let latest = self.store.latest().cloned().ok_or("no latest checkpoint")?;
                    self.coverage.bump(
                        Section::OperatorAction,
                        "after REWIND: restore the latest checkpoint instead",
                    );
                    Ok(Some(self.submit_restore(
                        latest,
                        RewindPolicy::Fail,
                        parallelism,
                    )))
                }
            }
            TwopcError::PreparedOnFreshStart(p)
                if self.store.latest().is_none() && !p.decided.is_empty() =>
            {
                // No checkpoint of the earlier run to restore: finish its
                // decided commits by hand, as the error says (`twopc decide
                // --commit`), then start again from the output as it is now.
                let mut dest = self.backend.destination();
                for (txn, _) in &p.decided {
                    twopc_core::operator::decide(
                        &mut dest,
                        &self.clock,
                        &self.sink,
                        txn,
                        twopc_core::operator::Decision::Commit,
                        twopc_core::RetryPolicy::default(),
                        "sim operator",
                    )
                    .map_err(|e| format!("finishing {txn} by hand failed: {e}"))?;
                }
                drop(dest);
                let offset = self
                    .visible_prefix()
                    .ok_or("output is not a clean prefix after finishing decided commits")?;
                self.coverage.bump(
                    Section::OperatorAction,
                    "after PREPARED_ON_FRESH_START (decided): finish them by hand, start again",
                );
                Ok(Some(self.submit_fresh(
                    offset,
                    parallelism,
                    Self::appending(run.options.fresh_start.aborts_prepared()),
                )))
            }
            TwopcError::PreparedOnFreshStart(_) => match self.store.latest().cloned() {
                Some(latest) => {
                    self.coverage.bump(
                        Section::OperatorAction,
                        "after PREPARED_ON_FRESH_START: restore the earlier run's checkpoint",
                    );
                    Ok(Some(self.submit_restore(
                        latest,
                        RewindPolicy::Fail,
                        parallelism,
                    )))
                }
                None => {
                    // No checkpoint ever completed, so the prepared output
                    // belongs to none: the operator decides it is not wanted.
                    let offset = self
                        .visible_prefix()
                        .ok_or("output is not a clean prefix before an ABORT_PREPARED start")?;
                    self.coverage.bump(
                        Section::OperatorAction,
                        "after PREPARED_ON_FRESH_START: start with ABORT_PREPARED",
                    );
                    Ok(Some(self.submit_fresh(
                        offset,
                        parallelism,
                        Self::appending(true),
                    )))
                }
            },
            TwopcError::ExistingOutputOnFreshStart(_) => {
                let offset = self
                    .visible_prefix()
                    .ok_or("output is not a clean prefix before an APPEND start")?;
                self.coverage.bump(
                    Section::OperatorAction,
                    "after EXISTING_OUTPUT: start again, appending",
                );
                let abort_prepared = run.options.fresh_start.aborts_prepared();
                Ok(Some(self.submit_fresh(
                    offset,
                    parallelism,
                    Self::appending(abort_prepared),
                )))
            }
            TwopcError::CommitUnresolved(_) => {
                let latest = self
                    .store
                    .latest()
                    .cloned()
                    .ok_or("COMMIT_UNRESOLVED without a completed checkpoint")?;
                self.coverage.bump(
                    Section::OperatorAction,
                    "after COMMIT_UNRESOLVED: restart from the latest checkpoint",
                );
                Ok(Some(self.submit_restore(
                    latest,
                    RewindPolicy::Fail,
                    parallelism,
                )))
            }
            other => Err(format!(
                "the job stopped with an error no schedule should cause: {other}"
            )),
        }
    }

    /// After a loss with no earlier checkpoint to rewind to, the operator
    /// follows the recovery plan by hand: remove the lineage's committed
    /// output (what `twopc inspect` lists), then start without state from
    /// where the remaining output ends, aborting the prepared leftovers.
    fn reconcile_by_hand(
        &mut self,
        lost: &LostTransaction,
        parallelism: usize,
    ) -> Result<Option<Run>, String> {
        let mut dest = self.backend.destination();
        // The lineage's decided commits are its output too: finished by
        // hand (`twopc decide --commit`), then removed with the rest, or a
        // later start would finish them over the re-run's output.
        for (txn, _, lineage) in self.backend.decided() {
            if lineage == lost.lineage {
                twopc_core::operator::decide(
                    &mut dest,
                    &self.clock,
                    &self.sink,
                    &txn,
                    twopc_core::operator::Decision::Commit,
                    twopc_core::RetryPolicy::default(),
                    "sim operator",
                )
                .map_err(|e| format!("finishing {txn} by hand failed: {e}"))?;
            }
        }
        for c in self.backend.committed() {
            if c.lineage == lost.lineage {
                dest.retract(&c)
                    .map_err(|e| format!("removing output by hand failed: {e}"))?;
            }
        }
        drop(dest);
        match self.visible_prefix() {
            Some(offset) => {
                trace!(self.trace, "operator removed the lineage's output by hand");
                self.coverage.bump(
                    Section::OperatorAction,
                    "after LOST: remove the output by hand, start with ABORT_PREPARED",
                );
                Ok(Some(self.submit_fresh(
                    offset,
                    parallelism,
                    Self::appending(true),
                )))
            }
            None => {
                self.coverage
                    .bump(Section::Outcome, "LOST reported, output not reconcilable");
                Ok(None)
            }
        }
    }

    /// Checks that a run ended the way its submission predicted.
    fn expectation_met(&self, run: &Run, fatal: Option<&TwopcError>) -> Result<(), String> {
        let ended = match fatal {
            None => "did not stop".to_string(),
            Some(e) => format!("stopped with {}", e.kind()),
        };
        match (&run.expect, fatal) {
            // Every attempt of the run failed its start-up check with a
            // transient error (a failover, which repeats the check), and
            // the operator took the stopped job over before an attempt got
            // through: the job never proceeded past the check, which is
            // what the expected stop protects. `check_gate` has verified
            // after each attempt that none got past it and that nothing
            // was changed. (Found by seeds 65997 and 975606: the oracle
            // used to demand the stop from a run the operator ended; and
            // by seed 265991 for a start over earlier output, which the
            // exemption had left out.)
            (
                Expectation::Refusal { .. }
                | Expectation::Rewind { .. }
                | Expectation::ExistingOutput { .. },
                None,
            ) if run.past_check.is_none() => Ok(()),
            // Sink V2: the committers run no start-up check and commit the
            // restored committables while the writers' rewind check may
            // still be on its way to REWIND; a recovery commit that stops
            // the job first (LOST, or COMMIT_UNRESOLVED after its retries,
            // each judged on its own in `recover_from`) ends a run no
            // writer got past the check of, and `check_gate` verified that
            // nothing visible changed but the restored checkpoint's own
            // output. (Found by seeds 311553, 414687 and 649425.)
            (
                Expectation::Rewind { .. },
                Some(TwopcError::Lost(_) | TwopcError::CommitUnresolved(_)),
            ) if self.schedule.topology.is_v2() && run.past_check.is_none() => Ok(()),
            (
                Expectation::Rewind {
                    committed_after,
                    visible_before,
                },
                Some(TwopcError::Rewind(r)),
            ) => invariants::rewind_is_complete(
                r,
                committed_after,
                visible_before,
                &self.backend.visible(),
                &self.restored_committables(run),
            ),
            (
                Expectation::Rewind {
                    committed_after, ..
                },
                _,
            ) => Err(format!(
                "restoring checkpoint {} under the FAIL rewind policy must stop with REWIND \
                 ({} transactions were committed after it), but the job {ended}",
                run.restored_checkpoint(),
                committed_after.len()
            )),
            (
                Expectation::Refusal {
                    prepared,
                    names_prepared,
                    decided,
                },
                Some(TwopcError::PreparedOnFreshStart(p)),
            ) => invariants::refusal_is_complete(
                p,
                (prepared, decided),
                *names_prepared,
                (&self.prepared_set(), &self.decided_set()),
            ),
            (
                Expectation::Refusal {
                    prepared, decided, ..
                },
                _,
            ) => Err(format!(
                "a start without state while {} prepared and {} decided transactions exist must \
                 stop with PREPARED_ON_FRESH_START, but the job {ended}",
                prepared.len(),
                decided.len()
            )),
            (
                Expectation::ExistingOutput {
                    lineages,
                    visible_before,
                },
                Some(TwopcError::ExistingOutputOnFreshStart(e)),
            ) => invariants::existing_output_is_complete(
                e,
                lineages,
                visible_before,
                &self.backend.visible(),
            ),
            (Expectation::ExistingOutput { lineages, .. }, _) => Err(format!(
                "a start without state, not allowed to append, while {} earlier lineages hold \
                 committed output must stop with EXISTING_OUTPUT, but the job {ended}",
                lineages.len()
            )),
            (Expectation::Proceed, Some(e @ TwopcError::Rewind(_)))
            | (Expectation::Proceed, Some(e @ TwopcError::PreparedOnFreshStart(_)))
            | (Expectation::Proceed, Some(e @ TwopcError::ExistingOutputOnFreshStart(_))) => {
                Err(format!("unexpected stop: {e}"))
            }
            (Expectation::Proceed, _) => Ok(()),
        }
    }

    fn check_finished(&mut self) -> Result<(), String> {
        invariants::exactly_once(&self.backend.visible(), self.source.len())?;
        invariants::nothing_staged(&self.backend.staged())?;
        self.backend.audit()?;
        trace!(self.trace, "finished: output exactly once, nothing staged");
        self.coverage.bump(
            Section::Outcome,
            if self.fatal_stops == 0 {
                "finished, exactly once"
            } else {
                "finished exactly once after operator recovery"
            },
        );
        Ok(())
    }

    // ----- runs and attempts -------------------------------------------

    fn run_job(&mut self, run: &mut Run) -> Result<JobEnd, String> {
        loop {
            run.attempts += 1;
            if run.attempts > MAX_ATTEMPTS_PER_RUN {
                return Err(format!(
                    "no progress: run {} failed {MAX_ATTEMPTS_PER_RUN} attempts in a row",
                    run.id
                ));
            }
            self.chaos.at(run.number, run.attempts);
            self.refresh_expectation(run);
            let end = self.attempt(run)?;
            self.check_gate(run)?;
            invariants::at_most_once(&self.backend.visible(), self.store.high_water())?;
            match end {
                AttemptEnd::Finished => return Ok(JobEnd::Finished),
                AttemptEnd::Operator(action) => return Ok(JobEnd::Operator(action)),
                AttemptEnd::Failed(e) if e.is_fatal() => return Ok(JobEnd::Fatal(e)),
                AttemptEnd::Failed(e) => {
                    // The simulation calls the sink exactly as Flink would;
                    // a misuse error means the core rejects a legitimate
                    // sequence, which in production is a restart loop.
                    if let TwopcError::Protocol { .. } = e {
                        return Err(format!("the core rejected a call Flink makes: {e}"));
                    }
                    trace!(self.trace, "attempt failed, failover: {e}");
                    self.coverage.bump(Section::Failover, failover_label(&e));
                    if let TwopcError::Scan { .. } = e {
                        self.mutate_after_scan_error(run);
                    }
                }
                AttemptEnd::PoisonRefused(e) => {
                    trace!(self.trace, "poisoned transaction refused, failover: {e}");
                    self.coverage.bump(
                        Section::Failover,
                        "a failed prepare's transaction refused when used again",
                    );
                }
                AttemptEnd::Crashed(point) => {
                    trace!(self.trace, "CRASH {}", point.label());
                    self.coverage.bump(Section::CrashPoint, point.label());
                }
            }
            if let Some(l) = &run.latest {
                self.check_completed_output(l.offset)?;
            }
            // The restart takes a while; the destination keeps its clock.
            self.clock.advance(self.chaos.downtime_ms());
            if self.chaos.expire() {
                self.expire_one(run.latest.as_ref());
            }
            if self.chaos.scripted_expiry() {
                self.expire_prepared();
            }
            // Instead of waiting for the failover, an operator may step in
            // while the job is down (a restart without state after a crash
            // is the classic way to meet prepared transactions).
            if let Some(action) = self.chaos.operator_takes_over() {
                if self.action_possible(action) {
                    trace!(
                        self.trace,
                        "operator takes over the stopped job: {action:?}"
                    );
                    return Ok(JobEnd::Operator(action));
                }
            }
            if let Some(p) = self.chaos.rescale_on_failover() {
                if p != run.parallelism {
                    trace!(
                        self.trace,
                        "adaptive scheduler: parallelism {} -> {p}",
                        run.parallelism
                    );
                    self.coverage
                        .bump(Section::OperatorAction, "rescaled on failover");
                    run.parallelism = p;
                }
            }
        }
    }

    fn attempt(&mut self, run: &mut Run) -> Result<AttemptEnd, String> {
        let p = run.parallelism;
        let restored = run.latest.clone();
        trace!(
            self.trace,
            "{} attempt {} at parallelism {p}: {}",
            run.id,
            run.attempts,
            match &restored {
                Some(c) => format!(
                    "restore checkpoint {} of {} (offset {})",
                    c.id, c.run, c.offset
                ),
                None => format!("no state, source from offset {}", run.start_offset),
            }
        );
        let started = match self.schedule.topology {
            Topology::SinkFunction => self.start_sink_function(run, restored.as_ref()),
            Topology::SinkV2 {
                committer_redistribution,
                ..
            } => self.start_v2(run, restored.as_ref(), committer_redistribution),
        };
        let mut ops = match started {
            Ok(ops) => ops,
            Err(end) => return Ok(end),
        };
        let offset = restored.as_ref().map_or(run.start_offset, |c| c.offset);
        let end = self.process(run, &mut ops, offset)?;
        if let AttemptEnd::Failed(_) = end {
            self.close_after_failure(&mut ops);
        }
        Ok(end)
    }

    /// SinkFunction: every subtask's `initializeState`, in any order.
    fn start_sink_function(
        &mut self,
        run: &mut Run,
        restored: Option<&CompletedCheckpoint>,
    ) -> Result<Operators<B::Dest>, AttemptEnd> {
        let p = run.parallelism;
        let assignment = match restored {
            Some(cp) => cp.assign(p, self.schedule.redistribution),
            None => vec![Vec::new(); p],
        };
        // What each subtask's `SubtaskSink::open` is given: the writer
        // states of its own share of the shim's list state, split apart
        // from the handles it recovers (as the Java shim passes them),
        // never the union.
        let restores: Vec<Option<Restore>> = match restored {
            Some(cp) => cp
                .sink_function_restores(p, self.schedule.redistribution)
                .into_iter()
                .map(Some)
                .collect(),
            None => vec![None; p],
        };
        // Subtasks initialize concurrently in Flink; any order may happen,
        // except that one handed no writer state waits (moments, in Flink)
        // for one that has some to record the run's lineage, so it opens
        // after those here (as Sink V2's writers do).
        let mut order = self.chaos.rng.order(p);
        order.sort_by_key(|&i| restores[i].as_ref().is_some_and(|r| r.states.is_empty()));
        let mut slots: Vec<Option<SubtaskRuntime<B::Dest>>> = (0..p).map(|_| None).collect();
        for i in order {
            match self.initialize(run, i, restores[i].as_ref(), &assignment[i]) {
                Ok(Some(rt)) => slots[i] = Some(rt),
                Ok(None) => return Err(AttemptEnd::Crashed(CrashPoint::DuringRecovery)),
                Err(e) => {
                    let mut live = Operators::Sink(slots.into_iter().flatten().collect());
                    self.close_after_failure(&mut live);
                    return Err(AttemptEnd::Failed(e));
                }
            }
        }
        Ok(Operators::Sink(
            slots
                .into_iter()
                .map(|s| s.expect("every subtask was initialized"))
                .collect(),
        ))
    }

    /// `initializeState`: open the sink (recovery decisions: rewind check,
    /// lingering aborts, retention), then `recoverAndCommit` every restored
    /// pending transaction and `recoverAndAbort` the restored open one, for
    /// each state this subtask got, then begin. `Ok(None)`: crashed.
    fn initialize(
        &mut self,
        run: &mut Run,
        index: usize,
        restore: Option<&Restore>,
        states: &[SubtaskState],
    ) -> Result<Option<SubtaskRuntime<B::Dest>>, TwopcError> {
        let ctx = SubtaskContext::new(
            self.sink.clone(),
            run.id.clone(),
            index as u32,
            run.parallelism as u32,
        )?
        .with_attempt(run.attempts, 0x5151);
        let nonce = self.chaos.rng.next_u64();
        let (mut sink, report) = SubtaskSink::open(
            self.backend.destination(),
            self.clock.clone(),
            ctx,
            run.options.clone(),
            restore,
            Some(nonce),
        )?;
        if run.past_check.is_none() {
            run.past_check = Some(format!("attempt {}, subtask {index}", run.attempts));
        }
        trace!(
            self.trace,
            "s{index} opened ({}), {} states; aborted {:?}; retracted {:?}",
            if report.fresh { "fresh" } else { "restored" },
            states.len(),
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
        for state in states {
            for (checkpoint, handle) in &state.pending {
                if self.chaos.crash(CrashPoint::DuringRecovery) {
                    return Ok(None);
                }
                let outcome = sink.commit(handle)?;
                trace!(
                    self.trace,
                    "s{index} recoverAndCommit {} (checkpoint {checkpoint}): {outcome:?}",
                    handle.transaction
                );
                self.coverage
                    .bump(Section::Protocol, format!("recoverAndCommit: {outcome:?}"));
            }
            if self.chaos.crash(CrashPoint::DuringRecovery) {
                return Ok(None);
            }
            let outcome = sink.abort(&state.current)?;
            trace!(
                self.trace,
                "s{index} recoverAndAbort {}: {outcome:?}",
                state.current.transaction
            );
            self.coverage
                .bump(Section::Protocol, format!("recoverAndAbort: {outcome:?}"));
        }
        let current = sink.begin()?;
        Ok(Some(SubtaskRuntime {
            index,
            sink,
            current,
            pending: BTreeMap::new(),
            poisoned: false,
        }))
    }

    /// Reads the source from `offset`, staging records, checkpointing every
    /// interval, until the input ends or something stops the attempt.
    fn process(
        &mut self,
        run: &mut Run,
        ops: &mut Operators<B::Dest>,
        mut offset: usize,
    ) -> Result<AttemptEnd, String> {
        if offset == 0 && self.schedule.early_checkpoint {
            // A checkpoint before the first record: a position any later
            // loss can be rewound to.
            if let Step::End(end) = self.checkpoint_any(run, ops, offset, false) {
                return Ok(end);
            }
        }
        let mut since_checkpoint = 0;
        loop {
            if offset >= self.source.len() {
                return match ops {
                    Operators::Sink(subtasks) => self.finish(run, subtasks, offset),
                    Operators::V2(v2) => self.finish_v2(run, v2, offset),
                };
            }
            let own_latest = run
                .latest
                .as_ref()
                .filter(|c| c.run == run.id)
                .map(|c| c.id);
            if let Some(action) = self.chaos.operator_stops(own_latest) {
                if self.action_possible(action) {
                    trace!(self.trace, "operator stops the job: {action:?}");
                    self.stop(ops);
                    return Ok(AttemptEnd::Operator(action));
                }
            }
            if self.chaos.expire() {
                self.expire_one(run.latest.as_ref());
            }
            if self.chaos.intrude() {
                self.intruder(run)?;
            }
            let chunk = self.chaos.rng.between(1, self.schedule.max_chunk);
            let to = (offset + chunk).min(self.source.len());
            let batches = self.source.read(offset, to, ops.parallelism());
            for b in self.chaos.rng.order(batches.len()) {
                let batch = &batches[b];
                if self.chaos.crash(CrashPoint::DuringWrites) {
                    return Ok(AttemptEnd::Crashed(CrashPoint::DuringWrites));
                }
                let (txn, poisoned, written) = ops.write(batch.subtask, &batch.bytes);
                match written {
                    Err(e) if poisoned => return Ok(poison_refusal(e)),
                    Err(e) => return Ok(AttemptEnd::Failed(e)),
                    Ok(()) if poisoned => {
                        return Err(format!(
                            "s{}: a write to {txn} was accepted after its prepare failed",
                            batch.subtask
                        ))
                    }
                    Ok(()) => {}
                }
                self.ledger.entry(txn).or_default().extend(&batch.records);
            }
            trace!(self.trace, "records {offset}..{to} staged");
            since_checkpoint += to - offset;
            offset = to;
            self.clock.advance(self.chaos.chunk_ms());
            // The shim runs the retention scan as records flow; a Sink V2
            // committer only in its housekeeping.
            if let (true, Operators::Sink(subtasks)) = (self.schedule.short_retention, &mut *ops) {
                for rt in subtasks.iter_mut() {
                    match rt.sink.expire_if_due() {
                        Ok(scan) => {
                            for t in &scan.expired {
                                trace!(self.trace, "s{} retention expired {t}", rt.index);
                            }
                            self.coverage.add(
                                Section::Expiry,
                                "retention cleanup removed a stale transaction",
                                scan.expired.len() as u64,
                            );
                        }
                        Err(e) => return Ok(AttemptEnd::Failed(e)),
                    }
                }
            }
            if since_checkpoint >= self.schedule.checkpoint_interval {
                since_checkpoint = 0;
                if let Step::End(end) = self.checkpoint_any(run, ops, offset, false) {
                    return Ok(end);
                }
            }
        }
    }

    fn checkpoint_any(
        &mut self,
        run: &mut Run,
        ops: &mut Operators<B::Dest>,
        offset: usize,
        is_final: bool,
    ) -> Step {
        match ops {
            Operators::Sink(subtasks) => self.checkpoint(run, subtasks, offset, is_final),
            Operators::V2(v2) => self.checkpoint_v2(run, v2, offset, is_final),
        }
    }

    /// One checkpoint: barriers reach every subtask (`snapshotState`), the
    /// coordinator completes it once all acknowledged, then notifies
    /// (`notifyCheckpointComplete`), with crashes possible in between.
    fn checkpoint(
        &mut self,
        run: &mut Run,
        subtasks: &mut [SubtaskRuntime<B::Dest>],
        offset: usize,
        is_final: bool,
    ) -> Step {
        let id = run.next_checkpoint;
        run.next_checkpoint += 1;
        let p = subtasks.len();
        let (declined, participants) = self.snapshot_participants(p, is_final);
        let mut states: Vec<Option<SubtaskState>> = vec![None; p];
        for (n, &i) in participants.iter().enumerate() {
            if n > 0 && self.chaos.crash(CrashPoint::DuringSnapshot) {
                return Step::End(AttemptEnd::Crashed(CrashPoint::DuringSnapshot));
            }
            if subtasks[i].poisoned {
                // Flink's TwoPhaseCommitSinkFunction pre-commits the same
                // transaction again: the core must refuse it.
                return match subtasks[i].snapshot(id) {
                    Err(e) => Step::End(poison_refusal(e)),
                    Ok(_) => Step::End(AttemptEnd::Failed(TwopcError::Protocol {
                        scope: subtasks[i].sink.scope(),
                        message: "SIMULATION VIOLATION: a poisoned transaction was prepared again"
                            .to_string(),
                    })),
                };
            }
            match subtasks[i].snapshot(id) {
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
                    // A tolerated checkpoint failure: the job keeps running
                    // with this transaction open, now poisoned.
                    trace!(
                        self.trace,
                        "s{i} snapshot {id} failed, tolerated: {e}; {} is poisoned",
                        subtasks[i].current.transaction
                    );
                    self.coverage
                        .bump(Section::Protocol, "failed prepare tolerated (poisoned)");
                    subtasks[i].poisoned = true;
                    return Step::Continue;
                }
                Ok(state) => {
                    trace!(
                        self.trace,
                        "s{i} snapshot {id}: prepared {}, began {}",
                        state
                            .pending
                            .last()
                            .map_or("?", |(_, h)| h.transaction.as_str()),
                        state.current.transaction
                    );
                    states[i] = Some(state);
                }
                Err(e) => return Step::End(AttemptEnd::Failed(e)),
            }
        }
        if let Some(step) = self.complete_checkpoint(run, id, offset, states, declined) {
            return step;
        }
        let mut notified = 0;
        for i in self.chaos.rng.order(p) {
            match self.deliver_notification(id, is_final, notified, &format!("s{i}")) {
                Delivery::Crashed => {
                    return Step::End(AttemptEnd::Crashed(CrashPoint::DuringNotify))
                }
                Delivery::Lost => continue,
                Delivery::Delivered => notified += 1,
            }
            if let Some(end) = self.notify(&mut subtasks[i], id) {
                return Step::End(end);
            }
        }
        Step::Continue
    }

    /// Which subtasks snapshot checkpoint `is_final`'s barrier, in their
    /// order; a declined checkpoint is acknowledged by some of them only.
    fn snapshot_participants(&mut self, p: usize, is_final: bool) -> (bool, Vec<usize>) {
        let declined = !is_final && self.chaos.decline_checkpoint();
        let mut participants = self.chaos.rng.order(p);
        if declined {
            let acknowledged = self.chaos.rng.between(0, p - 1);
            participants.truncate(acknowledged);
        }
        (declined, participants)
    }

    /// Every participant snapshotted: the checkpoint completes (or, when
    /// declined, the job keeps running without it). `Some` ends the step: a
    /// crash, or the decline.
    fn complete_checkpoint(
        &mut self,
        run: &mut Run,
        id: CheckpointId,
        offset: usize,
        states: Vec<Option<SubtaskState>>,
        declined: bool,
    ) -> Option<Step> {
        if declined {
            trace!(
                self.trace,
                "checkpoint {id} declined; the job keeps running"
            );
            self.coverage
                .bump(Section::Protocol, "checkpoint declined, job kept running");
            return Some(Step::Continue);
        }
        if self.chaos.crash(CrashPoint::AfterPrepare) {
            return Some(Step::End(AttemptEnd::Crashed(CrashPoint::AfterPrepare)));
        }
        let completed = CompletedCheckpoint {
            id,
            run: run.id.clone(),
            offset,
            states: states
                .into_iter()
                .map(|s| s.expect("every subtask snapshotted"))
                .collect(),
        };
        trace!(self.trace, "checkpoint {id} completed at offset {offset}");
        run.latest = Some(completed.clone());
        self.store.add(completed.clone());
        if self.chaos.expire() {
            self.expire_one(Some(&completed));
        }
        if self.chaos.crash(CrashPoint::AfterCompleteBeforeNotify) {
            return Some(Step::End(AttemptEnd::Crashed(
                CrashPoint::AfterCompleteBeforeNotify,
            )));
        }
        if let Some(n) = self.chaos.commit_burst() {
            trace!(self.trace, "the next {n} commit calls will fail");
        }
        None
    }

    /// Whether checkpoint `id`'s notification reaches `to` (`notified`
    /// were delivered before it).
    fn deliver_notification(
        &mut self,
        id: CheckpointId,
        is_final: bool,
        notified: usize,
        to: &str,
    ) -> Delivery {
        // The final checkpoint's notification is awaited (FLIP-147).
        if !is_final && self.chaos.lose_notification() {
            trace!(self.trace, "notification of checkpoint {id} to {to} lost");
            self.coverage
                .bump(Section::Protocol, "notifyCheckpointComplete not delivered");
            return Delivery::Lost;
        }
        if notified > 0 && self.chaos.crash(CrashPoint::DuringNotify) {
            return Delivery::Crashed;
        }
        Delivery::Delivered
    }

    /// `notifyCheckpointComplete`: commit every pending transaction up to
    /// `checkpoint`, oldest first. A failed commit is dropped from the map
    /// anyway and the first error is rethrown after the loop, so recovery
    /// has to redo it from the checkpoint.
    fn notify(
        &mut self,
        rt: &mut SubtaskRuntime<B::Dest>,
        checkpoint: CheckpointId,
    ) -> Option<AttemptEnd> {
        let due: Vec<CheckpointId> = rt.pending.range(..=checkpoint).map(|(c, _)| *c).collect();
        let mut first_error = None;
        for c in due {
            let handle = rt.pending[&c].clone();
            match rt.sink.commit(&handle) {
                Ok(outcome) => {
                    trace!(
                        self.trace,
                        "s{} commit {} (checkpoint {c}): {outcome:?}",
                        rt.index,
                        handle.transaction
                    );
                    self.coverage.bump(
                        Section::Protocol,
                        format!("commit on notification: {outcome:?}"),
                    );
                    if self.chaos.crash(CrashPoint::AfterCommitBeforeAck) {
                        return Some(AttemptEnd::Crashed(CrashPoint::AfterCommitBeforeAck));
                    }
                }
                Err(e) => {
                    trace!(
                        self.trace,
                        "s{} commit {} failed: {e}",
                        rt.index,
                        handle.transaction
                    );
                    if first_error.is_none() {
                        first_error = Some(e);
                    }
                }
            }
            rt.pending.remove(&c);
        }
        if let Some(e) = first_error {
            return Some(AttemptEnd::Failed(e));
        }
        // After the commits, the shim reports the completed checkpoint:
        // housekeeping, whose failures are reported and retried later.
        match rt.sink.checkpoint_completed(checkpoint) {
            Ok(report) => {
                for t in &report.aborted {
                    trace!(self.trace, "s{} aborted lingering {t}", rt.index);
                }
                for f in &report.failures {
                    trace!(self.trace, "s{} housekeeping failed: {f}", rt.index);
                    self.coverage
                        .bump(Section::Protocol, "housekeeping failed, retried later");
                }
                None
            }
            Err(e) => Some(AttemptEnd::Failed(e)),
        }
    }

    /// End of input (FLIP-147): a final checkpoint whose notification the
    /// tasks wait for, then `close()` aborts each open transaction.
    fn finish(
        &mut self,
        run: &mut Run,
        subtasks: &mut [SubtaskRuntime<B::Dest>],
        offset: usize,
    ) -> Result<AttemptEnd, String> {
        trace!(self.trace, "end of input: final checkpoint");
        if let Step::End(end) = self.checkpoint(run, subtasks, offset, true) {
            return Ok(end);
        }
        if self.chaos.crash(CrashPoint::DuringFinish) {
            return Ok(AttemptEnd::Crashed(CrashPoint::DuringFinish));
        }
        for i in self.chaos.rng.order(subtasks.len()) {
            // Housekeeping still due (it failed at the final checkpoint) is
            // tried once more; its failure now fails the task.
            match subtasks[i].sink.finish() {
                Ok(aborted) => {
                    for t in aborted {
                        trace!(self.trace, "s{i} aborted lingering {t} at the end");
                    }
                }
                Err(e) => return Ok(AttemptEnd::Failed(e)),
            }
            if let Err(e) = subtasks[i].close() {
                return Ok(AttemptEnd::Failed(e));
            }
        }
        trace!(self.trace, "all subtasks closed");
        Ok(AttemptEnd::Finished)
    }

    /// A failed task's `close()` runs if its process is still there; its
    /// errors are only logged.
    fn close_after_failure(&mut self, ops: &mut Operators<B::Dest>) {
        match ops {
            Operators::Sink(subtasks) => {
                for rt in subtasks.iter_mut() {
                    if self.chaos.rng.chance(0.7) {
                        let r = rt.close();
                        trace!(self.trace, "s{} closed after failure: {r:?}", rt.index);
                    }
                }
            }
            Operators::V2(v2) => self.close_v2(v2, 0.7),
        }
    }

    /// An operator stops the job: a cancellation closes the tasks, a kill
    /// does not.
    fn stop(&mut self, ops: &mut Operators<B::Dest>) {
        if self.chaos.closes_on_stop() {
            match ops {
                Operators::Sink(subtasks) => {
                    for rt in subtasks.iter_mut() {
                        let _ = rt.close();
                    }
                }
                Operators::V2(v2) => self.close_v2(v2, 1.0),
            }
            trace!(self.trace, "tasks cancelled and closed");
        }
    }

    /// The destination times out one staged transaction on its own:
    /// preferably one a completed checkpoint still needs (pending, not yet
    /// committed: this must end in LOST, never in a silent gap), otherwise
    /// any staged one.
    fn expire_one(&mut self, cp: Option<&CompletedCheckpoint>) {
        let prepared: BTreeSet<TransactionId> = self
            .backend
            .prepared()
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        let needed: Vec<TransactionId> = cp
            .map(|cp| {
                cp.states
                    .iter()
                    .flat_map(|s| s.pending.iter())
                    .filter(|(_, h)| {
                        h.prepared().is_some_and(|p| p.records > 0)
                            && prepared.contains(&h.transaction)
                    })
                    .map(|(_, h)| h.transaction.clone())
                    .collect()
            })
            .unwrap_or_default();
        let (txn, what) = if !needed.is_empty() && self.chaos.rng.chance(0.8) {
            (
                self.chaos.rng.pick(&needed).clone(),
                "pending transaction of a completed checkpoint",
            )
        } else {
            let staged: Vec<TransactionId> = self
                .backend
                .staged()
                .iter()
                .filter_map(|n| TransactionId::parse(n).map(|p| p.id))
                .collect();
            if staged.is_empty() {
                return;
            }
            (
                self.chaos.rng.pick(&staged).clone(),
                "any staged transaction",
            )
        };
        if self.backend.expire_externally(&txn, self.clock.now_ms()) {
            trace!(self.trace, "destination timed out {txn} ({what})");
            self.coverage
                .bump(Section::Expiry, format!("destination timeout: {what}"));
            self.expired.insert(txn);
        }
    }

    /// A second writer with this sink id opens while the job runs: another
    /// job, or another sink of this job. It must be refused before it does
    /// anything, whatever its policies (here the most destructive ones).
    fn intruder(&mut self, run: &Run) -> Result<(), String> {
        let same_job = self.chaos.rng.chance(0.5);
        let run_id = if same_job {
            run.id.clone()
        } else {
            RunId::new(format!("intruder{:02}", self.submissions)).expect("valid run id")
        };
        let subtask = (self.chaos.rng.next_u64() % run.parallelism as u64) as u32;
        let ctx = SubtaskContext::new(self.sink.clone(), run_id, subtask, run.parallelism as u32)
            .expect("valid context")
            .with_attempt(0, 0x1D1D);
        let mut options = self.schedule.options(
            RewindPolicy::ReplaceRange,
            FreshStartPolicy::AppendAndAbortPrepared,
        );
        options.owner_wait_ms = 0;
        let (visible, prepared) = (self.backend.visible(), self.prepared_set());
        let opened = SubtaskSink::open(
            self.backend.destination(),
            self.clock.clone(),
            ctx,
            options,
            None,
            Some(self.chaos.rng.next_u64()),
        );
        let what = if same_job {
            "a second sink of this job"
        } else {
            "a second job"
        };
        match opened {
            Err(TwopcError::OwnedElsewhere(c)) if c.fatal => {
                trace!(
                    self.trace,
                    "{what} with the same sink id was refused: {}",
                    c.diagnosis
                );
            }
            // Faults may hit the intruder's own claim: it is then refused too.
            Err(e) if !e.is_fatal() => {
                trace!(self.trace, "{what} failed to open: {e}");
            }
            Err(e) => return Err(format!("{what} was refused with the wrong error: {e}")),
            Ok(_) => return Err(format!("{what} with the same sink id was admitted")),
        }
        if self.backend.visible().len() != visible.len() || self.prepared_set() != prepared {
            return Err(format!(
                "{what} changed the destination before it was refused"
            ));
        }
        self.coverage
            .bump(Section::OperatorAction, format!("intruder refused: {what}"));
        Ok(())
    }

    /// A scripted scenario's deliberately broken product (see [`Mutant`]).
    fn mutate_after_scan_error(&mut self, run: &mut Run) {
        match self.chaos.mutant() {
            None => {}
            Some(Mutant::SkipCheckAfterTransientError) => {
                trace!(self.trace, "MUTANT: later attempts skip the start-up check");
                // Every start-up rule off: prepared leftovers aborted, earlier
                // lineages appended to, a rewind replaced.
                run.options.fresh_start = FreshStartPolicy::AppendAndAbortPrepared;
                run.options.rewind = RewindPolicy::ReplaceRange;
            }
            Some(Mutant::AbortPreparedOnScanError) => {
                if let Some((txn, _)) = self.backend.prepared().into_iter().min() {
                    trace!(self.trace, "MUTANT: the failed check aborted {txn}");
                    let _ = self.backend.destination().abort(&txn);
                }
            }
        }
    }

    /// A scripted timeout: the destination drops the first prepared
    /// transaction (by id) on its own.
    fn expire_prepared(&mut self) {
        let Some((txn, _)) = self.backend.prepared().into_iter().min() else {
            return;
        };
        if self.backend.expire_externally(&txn, self.clock.now_ms()) {
            trace!(self.trace, "destination timed out {txn} (prepared)");
            self.coverage.bump(
                Section::Expiry,
                "destination timeout: a prepared transaction",
            );
            self.expired.insert(txn);
        }
    }

    /// Before each attempt: the destination may have timed out a prepared
    /// leftover on its own while the job was down (after an attempt whose
    /// start-up check failed with a transient error), and the check that
    /// runs next can only name what is still there (seeds 987795 and
    /// 1515702: the oracle compared with what existed at submission).
    /// Only the environment's own timeouts (`self.expired`) are taken off;
    /// a prepared transaction that vanished any other way was removed by
    /// the product, which `check_gate` reports. Commit records, which the
    /// rewind check reads, are never removed by the environment.
    fn refresh_expectation(&mut self, run: &mut Run) {
        let Expectation::Refusal {
            prepared,
            names_prepared,
            decided,
        } = &mut run.expect
        else {
            return;
        };
        let before = prepared.len();
        prepared.retain(|(t, _)| !self.expired.contains(t));
        if prepared.len() == before {
            return;
        }
        self.coverage.bump(
            Section::Expiry,
            "prepared leftover timed out before a repeated fresh-start check",
        );
        if (prepared.is_empty() || !*names_prepared) && decided.is_empty() {
            trace!(
                self.trace,
                "no prepared transaction is left: {} must now proceed",
                run.id
            );
            run.expect = Expectation::Proceed;
            // As in `submit_fresh`: a new lineage begins.
            self.store.clear();
        } else {
            trace!(
                self.trace,
                "{} prepared transactions are left: {} must still refuse",
                prepared.len(),
                run.id
            );
        }
    }

    /// After each attempt: while the stop a submission must end in has not
    /// come, no subtask may have got past the start-up check, whatever
    /// ended the attempt (a check that failed with a transient error must
    /// fail the attempt, and the failover repeats it), and an interrupted
    /// check must have changed nothing at the destination.
    fn check_gate(&self, run: &Run) -> Result<(), String> {
        match &run.expect {
            Expectation::Proceed => Ok(()),
            Expectation::Refusal {
                prepared, decided, ..
            } => {
                if let Some(who) = &run.past_check {
                    return Err(format!(
                        "a start without state while {} prepared transactions exist must stop \
                         with PREPARED_ON_FRESH_START, but {who} of {} got past the start-up \
                         check",
                        prepared.len(),
                        run.id
                    ));
                }
                let now = self.prepared_set();
                let gone: Vec<_> = prepared.difference(&now).collect();
                let decided_now = self.decided_set();
                let finished: Vec<_> = decided.difference(&decided_now).collect();
                if !gone.is_empty() {
                    Err(format!(
                        "a start without state that must refuse removed prepared transactions: \
                         {gone:?}"
                    ))
                } else if !finished.is_empty() {
                    Err(format!(
                        "a start without state that must refuse finished decided commits, \
                         extending the output its start position was chosen against: \
                         {finished:?}"
                    ))
                } else {
                    Ok(())
                }
            }
            Expectation::Rewind {
                committed_after,
                visible_before,
            } => {
                if let Some(who) = &run.past_check {
                    return Err(format!(
                        "restoring checkpoint {} under the FAIL rewind policy must stop with \
                         REWIND ({} transactions were committed after it), but {who} of {} got \
                         past the start-up check",
                        run.restored_checkpoint(),
                        committed_after.len(),
                        run.id
                    ));
                }
                invariants::rewind_left_visible_alone(
                    visible_before,
                    &self.backend.visible(),
                    &self.restored_committables(run),
                )
                .map_err(|e| {
                    format!(
                        "restoring checkpoint {} must stop with REWIND: {e}",
                        run.restored_checkpoint()
                    )
                })
            }
            Expectation::ExistingOutput {
                lineages,
                visible_before,
            } => {
                if let Some(who) = &run.past_check {
                    return Err(format!(
                        "a start without state over committed output of {} earlier lineages must \
                         stop with EXISTING_OUTPUT, but {who} of {} got past the start-up check",
                        lineages.len(),
                        run.id
                    ));
                }
                let (mut a, mut b) = (visible_before.clone(), self.backend.visible());
                a.sort();
                b.sort();
                if a == b {
                    Ok(())
                } else {
                    Err(format!(
                        "{} must stop with EXISTING_OUTPUT, but an attempt changed the visible \
                         output",
                        run.id
                    ))
                }
            }
        }
    }

    /// Sink V2: the records of the restored checkpoint's committables,
    /// which its committers commit while the writers' start-up check may
    /// still refuse (see [`invariants::rewind_left_visible_alone`]). The
    /// SinkFunction shim commits nothing before its check: none.
    fn restored_committables(&self, run: &Run) -> BTreeSet<usize> {
        let Some(from) = run
            .restored_from
            .as_ref()
            .filter(|_| self.schedule.topology.is_v2())
        else {
            return BTreeSet::new();
        };
        from.states
            .iter()
            .flat_map(|s| s.pending.iter())
            .filter_map(|(_, h)| self.ledger.get(&h.transaction))
            .flatten()
            .copied()
            .collect()
    }

    fn action_possible(&self, action: OperatorAction) -> bool {
        match action {
            OperatorAction::RestoreSavepoint => !self.store.all().is_empty(),
            // Restarting without state only makes sense from a position
            // the output matches.
            OperatorAction::StatelessRestart => self.visible_prefix().is_some(),
        }
    }

    /// Output of completed checkpoints is never thrown away: every record
    /// below the latest completed checkpoint's offset is visible, or still
    /// staged in a prepared transaction or in one whose commit was decided
    /// but interrupted (rolled forward by whoever meets it next), or in one
    /// the destination timed out (which has to surface as LOST when its
    /// commit is attempted). (A decided commit left over an attempt's end
    /// once counted as vanished: seeds 1000000066 and 1000000364, where a
    /// Sink V2 committer deferred a commit that failed while publishing.)
    fn check_completed_output(&self, offset: usize) -> Result<(), String> {
        let mut pending: Vec<usize> = Vec::new();
        let prepared = self.backend.prepared();
        let decided = self.backend.decided();
        let holders = prepared
            .iter()
            .map(|(t, _)| t)
            .chain(decided.iter().map(|(t, _, _)| t))
            .chain(self.expired.iter());
        for t in holders {
            if let Some(records) = self.ledger.get(t) {
                pending.extend(records);
            }
        }
        invariants::completed_output_accounted_for(&self.backend.visible(), &pending, offset)
    }

    fn prepared_set(&self) -> BTreeSet<(TransactionId, CheckpointId)> {
        self.backend.prepared().into_iter().collect()
    }

    fn decided_set(&self) -> BTreeSet<(TransactionId, CheckpointId)> {
        self.backend
            .decided()
            .into_iter()
            .map(|(t, c, _)| (t, c))
            .collect()
    }

    /// `Some(n)` when the visible output is exactly records `0..n`: the
    /// position an operator would restart a stateless job from.
    fn visible_prefix(&self) -> Option<usize> {
        let mut indices: Vec<usize> = self
            .backend
            .visible()
            .iter()
            .map(|v| Source::parse(v))
            .collect::<Option<_>>()?;
        indices.sort_unstable();
        indices
            .iter()
            .enumerate()
            .all(|(i, v)| i == *v)
            .then_some(indices.len())
    }
}

impl Run {
    /// The checkpoint id this run restored, for messages.
    fn restored_checkpoint(&self) -> CheckpointId {
        self.restored_from.as_ref().map_or(0, |c| c.id)
    }
}

/// The end of an attempt when a poisoned transaction was used again: the
/// core's refusal is expected, anything else is a violation (reported as a
/// protocol error the run loop rejects).
fn poison_refusal(e: TwopcError) -> AttemptEnd {
    match &e {
        TwopcError::Protocol { message, .. } if message.contains("poisoned") => {
            AttemptEnd::PoisonRefused(e)
        }
        _ => AttemptEnd::Failed(e),
    }
}

fn stop_label(e: &TwopcError) -> &'static str {
    match e {
        TwopcError::Lost(_) => "LOST (staged output of a completed checkpoint expired)",
        TwopcError::Rewind(_) => "REWIND (restore older than committed output)",
        TwopcError::PreparedOnFreshStart(_) => "PREPARED_ON_FRESH_START (stateless restart)",
        TwopcError::ExistingOutputOnFreshStart(_) => {
            "EXISTING_OUTPUT (stateless restart onto earlier output)"
        }
        TwopcError::CommitUnresolved(_) => "COMMIT_UNRESOLVED (retries exhausted)",
        other => other.kind().name(),
    }
}

fn failover_label(e: &TwopcError) -> String {
    match e {
        TwopcError::Destination { action, .. } => format!("destination error while {action}"),
        TwopcError::Scan { .. } => "destination error while scanning".to_string(),
        other => other.kind().to_string(),
    }
}
