//! What can go wrong in one schedule, and when. [`Schedule`] is the shape
//! drawn from the seed (sizes, which kinds of trouble, how much);
//! [`Chaos`] answers "does it happen here?" as the job runs, within budgets
//! so that every schedule ends. A [`Script`] replaces the draws by a fixed
//! list of events, for regression scenarios that must keep reproducing one
//! sequence whatever the generator draws from a seed.

use twopc_core::memory::{Fault, Operation};
use twopc_core::{CheckpointId, FreshStartPolicy, RetryPolicy, RewindPolicy, SinkOptions};

use super::checkpoints::Redistribution;
use super::faults::SharedFaults;
use super::rng::Rng;

/// Where in the protocol a process dies (no `close()`, nothing flushed to
/// Flink, the destination keeps whatever calls completed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CrashPoint {
    /// In `initializeState`, between recovery commits and aborts.
    DuringRecovery,
    /// While records are being staged.
    DuringWrites,
    /// Some subtasks pre-committed for a checkpoint, others not yet.
    DuringSnapshot,
    /// Every subtask pre-committed; the checkpoint never completed.
    AfterPrepare,
    /// The checkpoint completed; no notification was delivered.
    AfterCompleteBeforeNotify,
    /// Some subtasks committed their transactions, others not yet.
    DuringNotify,
    /// A commit landed at the destination; the subtask died before it
    /// recorded the acknowledgement.
    AfterCommitBeforeAck,
    /// The final checkpoint committed; `close()` never ran.
    DuringFinish,
    /// Sink V2: a writer prepared its transaction and emitted the
    /// committable (`prepareCommit`), then died before `snapshotState`.
    AfterPrepareCommit,
    /// Sink V2: a committer's commits of one checkpoint went through, then
    /// it died before or during the housekeeping that follows them, after
    /// any number of its destination calls (see `sim/mortal.rs`).
    DuringHousekeeping,
}

impl CrashPoint {
    pub const ALL: [CrashPoint; 10] = [
        CrashPoint::DuringRecovery,
        CrashPoint::DuringWrites,
        CrashPoint::DuringSnapshot,
        CrashPoint::AfterPrepare,
        CrashPoint::AfterCompleteBeforeNotify,
        CrashPoint::DuringNotify,
        CrashPoint::AfterCommitBeforeAck,
        CrashPoint::DuringFinish,
        CrashPoint::AfterPrepareCommit,
        CrashPoint::DuringHousekeeping,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CrashPoint::DuringRecovery => "during recovery (initializeState)",
            CrashPoint::DuringWrites => "during writes",
            CrashPoint::DuringSnapshot => "during snapshot (some prepared)",
            CrashPoint::AfterPrepare => "after prepare, checkpoint incomplete",
            CrashPoint::AfterCompleteBeforeNotify => "after checkpoint complete, before commit",
            CrashPoint::DuringNotify => "during commits (some committed)",
            CrashPoint::AfterCommitBeforeAck => "after commit, before its acknowledgement",
            CrashPoint::DuringFinish => "after final commit, before close",
            CrashPoint::AfterPrepareCommit => "v2: after prepareCommit, before snapshotState",
            CrashPoint::DuringHousekeeping => "v2: committer during housekeeping",
        }
    }

    /// Relative weight: writes happen many times per attempt, so a crash
    /// there is made rarer to leave room for the later points.
    fn weight(self) -> f64 {
        match self {
            CrashPoint::DuringWrites => 0.2,
            CrashPoint::DuringRecovery => 0.5,
            // Reached at every committer's every checkpoint.
            CrashPoint::DuringHousekeeping => 0.5,
            _ => 1.0,
        }
    }
}

/// Which of the sink's Flink front ends the simulated job drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// The SinkFunction shim: one `SubtaskSink` per subtask, writer and
    /// committer in one operator over one destination.
    SinkFunction,
    /// Sink V2: a writer operator and a committer operator, each subtask
    /// over a destination of its own; committables travel from writer `i`
    /// to committer `i` and live in the committer's state.
    SinkV2 {
        retry: CommitRetry,
        /// How Flink splits the committer's state on rescale (the writer's
        /// follows the schedule's `redistribution`); drawn apart so that
        /// committables land on other subtasks than the writer states.
        committer_redistribution: Redistribution,
    },
}

/// What a Sink V2 committer does with a commit whose outcome is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitRetry {
    /// Backs off and retries by id in place (`TwopcCommitter`).
    InPlace,
    /// Flink's `retryLater()`: one attempt per call, and the committable
    /// stays pending, retried at the next checkpoint completion or at the
    /// end of input. Our committer never does this; the protocol must
    /// stay correct if a committer did.
    RetryLater,
}

impl Topology {
    pub fn is_v2(self) -> bool {
        matches!(self, Topology::SinkV2 { .. })
    }

    pub fn label(self) -> &'static str {
        match self {
            Topology::SinkFunction => "topology: SinkFunction (one operator)",
            Topology::SinkV2 {
                retry: CommitRetry::InPlace,
                ..
            } => "topology: Sink V2, commits retried in place",
            Topology::SinkV2 {
                retry: CommitRetry::RetryLater,
                ..
            } => "topology: Sink V2, commits deferred (retryLater)",
        }
    }
}

/// What an operator does to a running job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperatorAction {
    /// Stop, then restore from a retained checkpoint or savepoint (possibly
    /// an older one) as a new submission, maybe at another parallelism.
    RestoreSavepoint,
    /// Stop, then start again without any state.
    StatelessRestart,
}

/// Which retained checkpoint a scripted operator restores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    Oldest,
    Latest,
}

/// What a scripted operator does, with every choice the random operator
/// would draw made explicit.
#[derive(Clone, Copy, Debug)]
pub struct Takeover {
    pub action: OperatorAction,
    /// For `RestoreSavepoint`: which checkpoint, under which rewind policy.
    pub restore: Pick,
    pub rewind: RewindPolicy,
    pub parallelism: usize,
    /// For `StatelessRestart`: the fresh-start policy; `None` draws it as
    /// the random operator does (the scenarios written before this field
    /// keep the sequence they were written with).
    pub fresh_start: Option<FreshStartPolicy>,
}

impl Takeover {
    pub fn stateless(parallelism: usize) -> Self {
        Takeover {
            action: OperatorAction::StatelessRestart,
            restore: Pick::Latest,
            rewind: RewindPolicy::Fail,
            parallelism,
            fresh_start: None,
        }
    }

    /// A restart without state under the given fresh-start policy.
    pub fn stateless_under(parallelism: usize, policy: FreshStartPolicy) -> Self {
        Takeover {
            fresh_start: Some(policy),
            ..Self::stateless(parallelism)
        }
    }

    pub fn restore(restore: Pick, rewind: RewindPolicy, parallelism: usize) -> Self {
        Takeover {
            action: OperatorAction::RestoreSavepoint,
            restore,
            rewind,
            parallelism,
            fresh_start: None,
        }
    }
}

/// A deliberately broken product, to prove that the oracle still catches
/// what an invariant forbids (a scenario with a mutant must be reported).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// Once an attempt failed with a scan error, later attempts of the run
    /// open under `ABORT_PREPARED` and `REPLACE_RANGE`: a start-up check
    /// that a transient error lets the next attempt skip.
    SkipCheckAfterTransientError,
    /// A start-up check that, failing with a scan error, first removes a
    /// prepared transaction: the oracle must not take that for the
    /// destination's own timeout.
    AbortPreparedOnScanError,
}

/// A hand-written schedule. Events are keyed by run and attempt numbers
/// (1-based, in submission order) and by protocol events, never by random
/// draws, so the scenario stays the same sequence when the generator
/// changes. Nothing happens that the script does not name, except the
/// harmless draws (subtask order, chunk sizes, nonces).
#[derive(Clone, Debug, Default)]
pub struct Script {
    /// (run, attempt, point): crash the first time that attempt reaches it.
    pub crashes: Vec<(u32, u32, CrashPoint)>,
    /// (run, attempt, operation, n, fault): the n-th call of that operation
    /// to the destination during that attempt (1-based) fails so.
    pub faults: Vec<(u32, u32, Operation, u32, Fault)>,
    /// (run, checkpoint, takeover): the operator stops the running job once
    /// that checkpoint of the run completed.
    pub stops: Vec<(u32, CheckpointId, Takeover)>,
    /// (run, attempt, takeover): after that attempt failed or crashed, the
    /// operator takes over instead of letting the failover run.
    pub takeovers: Vec<(u32, u32, Takeover)>,
    /// (run, attempt): during the downtime after that attempt, the
    /// destination times out one prepared transaction (the first by id).
    pub expiries: Vec<(u32, u32)>,
    pub mutant: Option<Mutant>,
}

/// Which destination a schedule runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Memory,
    /// The filesystem destination in a temporary directory.
    Fs,
    /// The object store destination on the local S3 server.
    Obj,
}

impl Target {
    pub fn label(self) -> &'static str {
        match self {
            Target::Memory => "memory",
            Target::Fs => "fs",
            Target::Obj => "obj",
        }
    }

    /// A real destination: smaller schedules (every prepare and commit is
    /// real I/O), and history compaction in half of them.
    pub fn real(self) -> bool {
        self != Target::Memory
    }
}

/// The coverage row of the filesystem schedules that commit visible-first.
pub const VISIBLE_FIRST_LABEL: &str = "visible-first commits (filesystem)";

/// The shape of one schedule, drawn from its seed.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub seed: u64,
    pub records: usize,
    pub parallelism: usize,
    pub max_parallelism: usize,
    /// Records between regular checkpoints.
    pub checkpoint_interval: usize,
    pub max_chunk: usize,
    pub redistribution: Redistribution,
    crash_rate: f64,
    crash_budget: u32,
    pub fault_rate: f64,
    pub fault_budget: u32,
    expiry_rate: f64,
    expiry_budget: u32,
    lost_notification_rate: f64,
    decline_rate: f64,
    savepoint_rate: f64,
    savepoint_budget: u32,
    stateless_rate: f64,
    stateless_budget: u32,
    burst_rate: f64,
    rescale_on_failover_rate: f64,
    /// Commit attempts before the committer gives up (CommitUnresolved).
    commit_attempts: u32,
    /// Take a checkpoint before the first record (a position any later
    /// loss can be rewound to).
    pub early_checkpoint: bool,
    /// Retention shorter than a restart's downtime (memory only): cleanup
    /// must still never remove what a checkpoint needs.
    pub short_retention: bool,
    /// Checkpoint failures are tolerated (Flink's
    /// `setTolerableCheckpointFailureNumber` > 0): a failed prepare does not
    /// fail the attempt, and Flink prepares the same transaction again at
    /// the next checkpoint, which the core must refuse (it is poisoned).
    pub tolerates_failed_checkpoints: bool,
    /// Intruders: a second job (or a second sink of this job) with the same
    /// sink id trying to open while this one runs.
    intruder_rate: f64,
    intruder_budget: u32,
    /// Filesystem only: I/O of the staged data through direct I/O where
    /// possible, or through the page cache.
    pub buffered_io: bool,
    /// Real destinations only: fold commit records into history segments
    /// at every chance (keep one checkpoint single, segments of one or
    /// two), so that rewinds, repeated commits and recovery meet folded
    /// records.
    pub compact_history: bool,
    /// Filesystem only: commits show the output by a hard link before the
    /// commit is synced (`CommitOrder::VisibleFirst`), so that every state
    /// a crash or an I/O fault leaves in that order is finished by the
    /// recovery the protocol runs.
    pub visible_first: bool,
    /// Set for a scripted scenario: every rate above is zero and the
    /// script decides instead.
    pub script: Option<Script>,
    pub topology: Topology,
}

impl Schedule {
    /// A real destination keeps schedules smaller: every prepare and commit
    /// there syncs real files or sends real requests. (Memory and
    /// filesystem seeds draw exactly what they drew before the object
    /// store was added.)
    pub fn generate(seed: u64, target: Target) -> Schedule {
        let fs = target.real();
        let mut r = Rng::new(seed);
        let records = if fs {
            r.between(20, 60)
        } else {
            r.between(20, 200)
        };
        let max_parallelism = match target {
            Target::Memory => 4,
            Target::Fs => 3,
            Target::Obj => 2,
        };
        let checkpoints = r.between(
            1,
            match target {
                Target::Memory => 8,
                Target::Fs => 4,
                Target::Obj => 3,
            },
        );
        let checkpoint_interval = records.div_ceil(checkpoints).max(1);
        let mut s = Schedule {
            seed,
            records,
            parallelism: r.between(1, max_parallelism),
            max_parallelism,
            checkpoint_interval,
            max_chunk: (checkpoint_interval / 2).clamp(1, 25),
            redistribution: if r.chance(0.5) {
                Redistribution::RoundRobin
            } else {
                Redistribution::Contiguous
            },
            crash_rate: 0.0,
            crash_budget: 0,
            fault_rate: 0.0,
            fault_budget: 0,
            expiry_rate: 0.0,
            expiry_budget: 0,
            lost_notification_rate: 0.0,
            decline_rate: 0.0,
            savepoint_rate: 0.0,
            savepoint_budget: 0,
            stateless_rate: 0.0,
            stateless_budget: 0,
            burst_rate: 0.0,
            rescale_on_failover_rate: 0.0,
            commit_attempts: r.range(1, 5) as u32,
            short_retention: false,
            early_checkpoint: false,
            tolerates_failed_checkpoints: false,
            intruder_rate: 0.0,
            intruder_budget: 0,
            buffered_io: false,
            compact_history: false,
            visible_first: false,
            script: None,
            topology: Topology::SinkFunction,
        };
        // Each kind of trouble is present in some schedules only, so that
        // both quiet runs and pile-ups of several kinds occur.
        if r.chance(0.75) {
            s.crash_rate = r.rate(0.05, 0.3);
            // The object store's server answers a few hundred requests a
            // second, and every crash is a whole recovery: at most two.
            s.crash_budget = r.range(1, if target == Target::Obj { 3 } else { 4 }) as u32;
        }
        if r.chance(0.5) {
            s.fault_rate = r.rate(0.005, 0.06);
            // The same for faults: each is a failover more often than not.
            s.fault_budget = r.range(1, if target == Target::Obj { 4 } else { 6 }) as u32;
        }
        if r.chance(0.2) {
            s.expiry_rate = r.rate(0.1, 0.5);
            s.expiry_budget = r.range(1, 2) as u32;
        }
        if r.chance(0.3) {
            s.lost_notification_rate = r.rate(0.1, 0.5);
        }
        if r.chance(0.25) {
            s.decline_rate = r.rate(0.1, 0.4);
        }
        if r.chance(0.25) {
            s.savepoint_rate = r.rate(0.02, 0.1);
            s.savepoint_budget = r.range(1, 2) as u32;
        }
        if r.chance(0.15) {
            s.stateless_rate = r.rate(0.02, 0.1);
            s.stateless_budget = 1;
        }
        if r.chance(0.1) {
            s.burst_rate = r.rate(0.1, 0.5);
        }
        if r.chance(0.15) {
            s.rescale_on_failover_rate = 0.5;
        }
        s.short_retention = !fs && r.chance(0.2);
        s.early_checkpoint = r.chance(0.5);
        // Drawn last, so the shapes above stay what they were for a seed.
        s.tolerates_failed_checkpoints = r.chance(0.3);
        if r.chance(0.1) {
            s.intruder_rate = r.rate(0.05, 0.2);
            s.intruder_budget = r.range(1, 2) as u32;
        }
        s.buffered_io = target == Target::Fs && r.chance(0.5);
        // Drawn after everything else, so that a seed's shape is the same
        // in both topologies but for the topology itself.
        if r.chance(0.5) {
            s.topology = Topology::SinkV2 {
                retry: if r.chance(0.5) {
                    CommitRetry::InPlace
                } else {
                    CommitRetry::RetryLater
                },
                committer_redistribution: if r.chance(0.5) {
                    Redistribution::RoundRobin
                } else {
                    Redistribution::Contiguous
                },
            };
        }
        // Drawn last of all, so that every shape above stays the same.
        s.compact_history = fs && r.chance(0.5);
        // After it, for the same reason.
        s.visible_first = fs && r.chance(0.5);
        s
    }

    /// A scripted scenario: no random trouble at all, only the script's.
    pub fn scripted(
        records: usize,
        parallelism: usize,
        checkpoint_interval: usize,
        early_checkpoint: bool,
        script: Script,
    ) -> Schedule {
        Schedule {
            seed: 0,
            records,
            parallelism,
            max_parallelism: 4,
            checkpoint_interval,
            max_chunk: (checkpoint_interval / 2).clamp(1, 25),
            redistribution: Redistribution::Contiguous,
            crash_rate: 0.0,
            crash_budget: 0,
            fault_rate: 0.0,
            fault_budget: 0,
            expiry_rate: 0.0,
            expiry_budget: 0,
            lost_notification_rate: 0.0,
            decline_rate: 0.0,
            savepoint_rate: 0.0,
            savepoint_budget: 0,
            stateless_rate: 0.0,
            stateless_budget: 0,
            burst_rate: 0.0,
            rescale_on_failover_rate: 0.0,
            commit_attempts: 3,
            early_checkpoint,
            short_retention: false,
            tolerates_failed_checkpoints: false,
            intruder_rate: 0.0,
            intruder_budget: 0,
            buffered_io: false,
            compact_history: false,
            visible_first: false,
            script: Some(script),
            topology: Topology::SinkFunction,
        }
    }

    /// The same schedule in another topology.
    pub fn in_topology(mut self, topology: Topology) -> Schedule {
        self.topology = topology;
        self
    }

    pub fn options(&self, rewind: RewindPolicy, fresh_start: FreshStartPolicy) -> SinkOptions {
        let mut o = SinkOptions {
            rewind,
            fresh_start,
            commit_retry: RetryPolicy {
                max_attempts: self.commit_attempts,
                initial_backoff_ms: 10,
                max_backoff_ms: 200,
            },
            ..SinkOptions::default()
        };
        if self.compact_history {
            o.history = twopc_core::destination::HistoryPolicy {
                keep_checkpoints: 1,
                min_segment: 1,
                max_segment: 2,
                every_commits: 1,
            };
        }
        if self.short_retention {
            o.retention_ms = 2_000;
            o.expiry_scan_interval_ms = 200;
        }
        o
    }

    pub fn describe(&self) -> String {
        if let Some(script) = &self.script {
            return format!(
                "scripted: {:?}, {} records, parallelism {}, checkpoint every {} records, early \
                 checkpoint {}, {script:?}",
                self.topology,
                self.records,
                self.parallelism,
                self.checkpoint_interval,
                self.early_checkpoint
            );
        }
        format!(
            "{:?}, {} records, parallelism {} (max {}), checkpoint every {} records, chunks <= {}, \
             {:?} redistribution, crashes {}x@{:.2}, faults {}x@{:.3}, expiries {}x@{:.2}, \
             lost notifications @{:.2}, declines @{:.2}, savepoint restores {}x@{:.2}, \
             stateless restarts {}x@{:.2}, commit bursts @{:.2}, commit attempts {}, \
             rescale on failover @{:.2}, short retention {}, early checkpoint {}, tolerates \
             failed checkpoints {}, intruders {}x@{:.2}, buffered I/O {}",
            self.topology,
            self.records,
            self.parallelism,
            self.max_parallelism,
            self.checkpoint_interval,
            self.max_chunk,
            self.redistribution,
            self.crash_budget,
            self.crash_rate,
            self.fault_budget,
            self.fault_rate,
            self.expiry_budget,
            self.expiry_rate,
            self.lost_notification_rate,
            self.decline_rate,
            self.savepoint_budget,
            self.savepoint_rate,
            self.stateless_budget,
            self.stateless_rate,
            self.burst_rate,
            self.commit_attempts,
            self.rescale_on_failover_rate,
            self.short_retention,
            self.early_checkpoint,
            self.tolerates_failed_checkpoints,
            self.intruder_budget,
            self.intruder_rate,
            self.buffered_io,
        ) + if self.compact_history {
            ", history compacted at every chance"
        } else {
            ""
        } + if self.visible_first {
            ", visible-first commits"
        } else {
            ""
        }
    }
}

/// The live decisions of a schedule. Every "does it happen here?" goes
/// through this, so budgets hold and the sequence is fixed by the seed.
pub struct Chaos {
    pub rng: Rng,
    schedule: Schedule,
    faults: SharedFaults,
    crashes_left: u32,
    expiries_left: u32,
    savepoints_left: u32,
    stateless_left: u32,
    /// Set once an operator takes over after a fatal stop: the environment
    /// is fixed, so the job must now run to the end.
    calm: bool,
    intruders_left: u32,
    /// The scripted mode's events, and where the job is: (run, attempt).
    script: Option<Script>,
    at: (u32, u32),
    /// The scripted operator's current action, whose choices
    /// [`Chaos::parallelism`], [`Chaos::pick_restore`] and
    /// [`Chaos::rewind_policy`] answer.
    takeover: Option<Takeover>,
}

impl Chaos {
    pub fn new(schedule: &Schedule, rng: Rng, faults: SharedFaults) -> Self {
        Chaos {
            rng,
            faults,
            crashes_left: schedule.crash_budget,
            expiries_left: schedule.expiry_budget,
            savepoints_left: schedule.savepoint_budget,
            stateless_left: schedule.stateless_budget,
            intruders_left: schedule.intruder_budget,
            calm: false,
            script: schedule.script.clone(),
            at: (0, 0),
            takeover: None,
            schedule: schedule.clone(),
        }
    }

    pub fn calm(&mut self) {
        self.calm = true;
        self.takeover = None;
        self.faults.lock().disable();
    }

    /// The job tells where it is: attempt `attempt` of the `run`-th
    /// submission begins. Scripted events are keyed by it.
    pub fn at(&mut self, run: u32, attempt: u32) {
        self.at = (run, attempt);
        self.faults.lock().at(run, attempt);
    }

    pub fn mutant(&self) -> Option<Mutant> {
        self.script.as_ref().and_then(|s| s.mutant)
    }

    pub fn crash(&mut self, point: CrashPoint) -> bool {
        if let Some(script) = &mut self.script {
            let (run, attempt) = self.at;
            let hit = script
                .crashes
                .iter()
                .position(|&(r, a, p)| (r, a, p) == (run, attempt, point));
            return hit.map(|i| script.crashes.remove(i)).is_some();
        }
        if self.calm || self.crashes_left == 0 {
            return false;
        }
        let hit = self.rng.chance(self.schedule.crash_rate * point.weight());
        if hit {
            self.crashes_left -= 1;
        }
        hit
    }

    /// Whether a committer dies at its housekeeping, and if so after how
    /// many of its destination calls (0: before the first).
    pub fn housekeeping_crash(&mut self) -> Option<u32> {
        if !self.crash(CrashPoint::DuringHousekeeping) {
            return None;
        }
        Some(self.rng.range(0, 4) as u32)
    }

    /// A staged transaction times out at the destination now.
    pub fn expire(&mut self) -> bool {
        if self.calm || self.expiries_left == 0 || !self.rng.chance(self.schedule.expiry_rate) {
            return false;
        }
        self.expiries_left -= 1;
        true
    }

    /// A second writer with this sink id tries to open now.
    pub fn intrude(&mut self) -> bool {
        if self.calm || self.intruders_left == 0 || !self.rng.chance(self.schedule.intruder_rate) {
            return false;
        }
        self.intruders_left -= 1;
        true
    }

    /// Flink does not promise to deliver `notifyCheckpointComplete`.
    pub fn lose_notification(&mut self) -> bool {
        self.rng.chance(self.schedule.lost_notification_rate)
    }

    /// Some subtasks never acknowledge: the checkpoint is aborted, the job
    /// keeps running (a tolerable checkpoint failure).
    pub fn decline_checkpoint(&mut self) -> bool {
        self.rng.chance(self.schedule.decline_rate)
    }

    /// The next commits fail in a row, `n` of them.
    pub fn commit_burst(&mut self) -> Option<u32> {
        if self.calm || !self.rng.chance(self.schedule.burst_rate) {
            return None;
        }
        let n = self.rng.range(1, 6) as u32;
        self.faults.lock().arm_commit_burst(n);
        Some(n)
    }

    /// While the job runs (`latest`: the run's latest completed checkpoint).
    pub fn operator_stops(&mut self, latest: Option<CheckpointId>) -> Option<OperatorAction> {
        if let Some(script) = &mut self.script {
            let run = self.at.0;
            let i = script
                .stops
                .iter()
                .position(|&(r, c, _)| r == run && latest.is_some_and(|l| l >= c))?;
            let (_, _, t) = script.stops.remove(i);
            self.takeover = Some(t);
            return Some(t.action);
        }
        self.operator_action()
    }

    /// While the job is down after a failed or crashed attempt.
    pub fn operator_takes_over(&mut self) -> Option<OperatorAction> {
        if let Some(script) = &mut self.script {
            let at = self.at;
            let i = script
                .takeovers
                .iter()
                .position(|&(r, a, _)| (r, a) == at)?;
            let (_, _, t) = script.takeovers.remove(i);
            self.takeover = Some(t);
            return Some(t.action);
        }
        self.operator_action()
    }

    /// A scripted timeout of a prepared transaction, after the attempt.
    pub fn scripted_expiry(&mut self) -> bool {
        let at = self.at;
        let Some(script) = &mut self.script else {
            return false;
        };
        let hit = script.expiries.iter().position(|&e| e == at);
        hit.map(|i| script.expiries.remove(i)).is_some()
    }

    /// Which of `n` retained checkpoints the operator restores.
    pub fn pick_restore(&mut self, n: usize) -> usize {
        match self.takeover {
            Some(t) if self.script.is_some() => match t.restore {
                Pick::Oldest => 0,
                Pick::Latest => n - 1,
            },
            // The same draw as `rng.pick`, so that seeds replay unchanged.
            _ => self.rng.between(0, n - 1),
        }
    }

    /// The policy of a restart without state: half the time the operator
    /// forgets that output of the earlier run exists.
    pub fn fresh_start_policy(&mut self) -> FreshStartPolicy {
        match self.takeover {
            Some(Takeover {
                fresh_start: Some(policy),
                ..
            }) if self.script.is_some() => policy,
            _ if self.rng.chance(0.5) => FreshStartPolicy::Fail,
            _ => FreshStartPolicy::Append,
        }
    }

    pub fn rewind_policy(&mut self) -> RewindPolicy {
        match self.takeover {
            Some(t) if self.script.is_some() => t.rewind,
            _ if self.rng.chance(0.5) => RewindPolicy::ReplaceRange,
            _ => RewindPolicy::Fail,
        }
    }

    fn operator_action(&mut self) -> Option<OperatorAction> {
        if self.calm {
            return None;
        }
        if self.savepoints_left > 0 && self.rng.chance(self.schedule.savepoint_rate) {
            self.savepoints_left -= 1;
            return Some(OperatorAction::RestoreSavepoint);
        }
        if self.stateless_left > 0 && self.rng.chance(self.schedule.stateless_rate) {
            self.stateless_left -= 1;
            return Some(OperatorAction::StatelessRestart);
        }
        None
    }

    /// The adaptive scheduler may restart a job at another parallelism
    /// (same job id).
    pub fn rescale_on_failover(&mut self) -> Option<usize> {
        if self.calm || !self.rng.chance(self.schedule.rescale_on_failover_rate) {
            return None;
        }
        Some(self.parallelism())
    }

    pub fn parallelism(&mut self) -> usize {
        if self.script.is_some() {
            return self
                .takeover
                .map_or(self.schedule.parallelism, |t| t.parallelism);
        }
        self.rng.between(1, self.schedule.max_parallelism)
    }

    /// How long a restart takes, during which destinations keep timing.
    pub fn downtime_ms(&mut self) -> u64 {
        self.rng.range(100, 5_000)
    }

    /// Processing time of one chunk.
    pub fn chunk_ms(&mut self) -> u64 {
        self.rng.range(10, 300)
    }

    /// A stopped job sometimes gets its `close()` calls (cancellation),
    /// sometimes not (the process is gone).
    pub fn closes_on_stop(&mut self) -> bool {
        self.rng.chance(0.6)
    }
}
