//! Injected destination failures. One plan decides, per destination call,
//! whether the call fails before its effect (no effect, error) or after it
//! (effect, then a lost response). The in-memory store consults it through
//! its own fault hook; the filesystem destination through
//! [`FaultyDestination`], which gives the same semantics to any destination.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use twopc_core::destination::{
    AbortStatus, CommitStatus, CommittedTransaction, Destination, LineageRecord, LineageSummary,
    OwnerClaim, Ownership, StagedTransaction,
};
use twopc_core::error::{DestinationError, DestinationErrorKind};
use twopc_core::memory::{Fault, Operation};
use twopc_core::records::RecordBatch;
use twopc_core::{CheckpointId, LineageId, SinkId, TransactionHandle, TransactionId};

use twopc_fs::{IoFaults, IoStep, IoTiming};
use twopc_objstore::{FaultAction, RequestFaults, RequestInfo, S3Call};

use super::rng::Rng;

pub struct FaultPlan {
    rng: Rng,
    /// Chance that any one call fails.
    rate: f64,
    /// Faults left; a schedule must end, so failures are finite.
    budget: u32,
    /// Commit calls left that fail in a row (before their effect), to drive
    /// the committer's retries to exhaustion.
    commit_burst: u32,
    enabled: bool,
    echo: bool,
    /// "Commit fail-after" → how many were injected.
    pub injected: BTreeMap<String, u64>,
    /// Scripted faults: (run, attempt, operation, n-th call, fault).
    script: Vec<(u32, u32, Operation, u32, Fault)>,
    /// The current (run, attempt) and its calls so far per operation.
    at: (u32, u32),
    calls: BTreeMap<Operation, u32>,
    /// How many times likelier than other I/O steps the steps only a commit
    /// takes (publishing, the commit record) fail: 1 unless the
    /// schedule wants the states a commit cut short leaves, which the few
    /// commit steps among many listings and writes would rarely reach.
    pub commit_io_weight: f64,
}

/// The plan is consulted from inside the store's lock, hence a mutex.
#[derive(Clone)]
pub struct SharedFaults(Arc<Mutex<FaultPlan>>);

impl SharedFaults {
    pub fn new(rng: Rng, rate: f64, budget: u32, echo: bool) -> Self {
        SharedFaults(Arc::new(Mutex::new(FaultPlan {
            rng,
            rate,
            budget,
            commit_burst: 0,
            enabled: true,
            echo,
            injected: BTreeMap::new(),
            script: Vec::new(),
            at: (0, 0),
            calls: BTreeMap::new(),
            commit_io_weight: 1.0,
        })))
    }

    /// A scripted scenario's faults (see `Script::faults`).
    pub fn scripted(rng: Rng, script: Vec<(u32, u32, Operation, u32, Fault)>, echo: bool) -> Self {
        let faults = Self::new(rng, 0.0, 0, echo);
        faults.lock().script = script;
        faults
    }

    pub fn lock(&self) -> MutexGuard<'_, FaultPlan> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn decide(&self, op: Operation, txn: &TransactionId) -> Fault {
        self.lock().decide(op, txn)
    }
}

impl FaultPlan {
    pub fn decide(&mut self, op: Operation, txn: &TransactionId) -> Fault {
        if !self.enabled {
            return Fault::None;
        }
        let n = self.calls.entry(op).or_default();
        *n += 1;
        let (run, attempt, n) = (self.at.0, self.at.1, *n);
        let scripted = self
            .script
            .iter()
            .find(|&&(r, a, o, k, _)| (r, a, o, k) == (run, attempt, op, n))
            .map(|&(.., f)| f);
        let fault = if let Some(f) = scripted {
            f
        } else if op == Operation::Commit && self.commit_burst > 0 {
            self.commit_burst -= 1;
            Fault::FailBefore
        } else if self.budget > 0 && self.rng.chance(self.rate) {
            self.budget -= 1;
            if self.rng.chance(0.5) {
                Fault::FailBefore
            } else {
                Fault::FailAfter
            }
        } else {
            Fault::None
        };
        if fault != Fault::None {
            let kind = if fault == Fault::FailBefore {
                "fails before its effect"
            } else {
                "takes effect, response lost"
            };
            *self.injected.entry(format!("{op:?} {kind}")).or_default() += 1;
            if self.echo {
                println!("      fault: {op:?} of {txn} {kind}");
            }
        }
        fault
    }

    /// Whether one I/O step of the filesystem destination fails, and how:
    /// before or after its effect, with ENOSPC or EIO. Shares the budget of
    /// the call-level faults.
    pub fn decide_io(&mut self, step: IoStep) -> Option<(IoTiming, i32)> {
        let rate = match step {
            IoStep::Publish | IoStep::CommitRecord => (self.rate * self.commit_io_weight).min(1.0),
            _ => self.rate,
        };
        if !self.enabled || self.budget == 0 || !self.rng.chance(rate) {
            return None;
        }
        self.budget -= 1;
        let timing = if self.rng.chance(0.5) {
            IoTiming::Before
        } else {
            IoTiming::After
        };
        let errno = if self.rng.chance(0.5) { 28 } else { 5 };
        *self
            .injected
            .entry(format!(
                "I/O {step:?} {timing:?} {}",
                if errno == 28 { "ENOSPC" } else { "EIO" }
            ))
            .or_default() += 1;
        if self.echo {
            println!("      fault: I/O {step:?} {timing:?} errno {errno}");
        }
        Some((timing, errno))
    }

    /// Whether one S3 request of the object store destination fails, and
    /// how: refused before it reaches the server, or acted on by the server
    /// with its answer lost. Shares the budget of the call-level faults.
    pub fn decide_request(&mut self, call: S3Call) -> FaultAction {
        if !self.enabled || self.budget == 0 || !self.rng.chance(self.rate) {
            return FaultAction::Proceed;
        }
        self.budget -= 1;
        let before = self.rng.chance(0.5);
        *self
            .injected
            .entry(format!(
                "S3 {} {}",
                request_label(call),
                if before {
                    "refused"
                } else {
                    "done, answer lost"
                }
            ))
            .or_default() += 1;
        if self.echo {
            println!(
                "      fault: S3 {call:?} {}",
                if before {
                    "refused before the server"
                } else {
                    "done by the server, answer lost"
                }
            );
        }
        if before {
            FaultAction::FailBefore("simulated refused connection".to_string())
        } else {
            FaultAction::FailAfter("simulated lost answer".to_string())
        }
    }

    /// Attempt `attempt` of the `run`-th submission begins: scripted faults
    /// count calls from here.
    pub fn at(&mut self, run: u32, attempt: u32) {
        self.at = (run, attempt);
        self.calls.clear();
    }

    /// The next `n` commit calls fail.
    pub fn arm_commit_burst(&mut self, n: u32) {
        self.commit_burst = n;
    }

    /// The operator fixed the destination: no more faults.
    pub fn disable(&mut self) {
        self.enabled = false;
        self.commit_burst = 0;
    }
}

fn injected(op: Operation, txn: &TransactionId, after: bool) -> DestinationError {
    DestinationError::new(
        DestinationErrorKind::Unavailable,
        format!(
            "injected fault: {op:?} of {txn} {}",
            if after {
                "took effect but its response was lost"
            } else {
                "failed"
            }
        ),
    )
}

/// Any destination, with the plan's faults around each call.
pub struct FaultyDestination<D> {
    inner: D,
    faults: SharedFaults,
    /// Stands in for "no transaction" when a scan is decided on.
    scan_id: TransactionId,
    /// Request faults inside the destination, silenced before it drops
    /// (see [`PlanRequests`]).
    requests: Option<Arc<PlanRequests>>,
}

impl<D: Destination> FaultyDestination<D> {
    pub fn new(inner: D, faults: SharedFaults, sink: &SinkId) -> Self {
        FaultyDestination {
            inner,
            faults,
            scan_id: TransactionId::compose(sink, 0, 0, 0),
            requests: None,
        }
    }

    /// As [`Self::new`], for a destination whose requests `requests` may
    /// fail while it is in use.
    pub fn with_requests(
        inner: D,
        faults: SharedFaults,
        sink: &SinkId,
        requests: Arc<PlanRequests>,
    ) -> Self {
        requests.set_active(true);
        FaultyDestination {
            inner,
            faults,
            scan_id: TransactionId::compose(sink, 0, 0, 0),
            requests: Some(requests),
        }
    }

    fn call<T>(
        &mut self,
        op: Operation,
        txn: &TransactionId,
        effect: impl FnOnce(&mut D) -> Result<T, DestinationError>,
    ) -> Result<T, DestinationError> {
        match self.faults.decide(op, txn) {
            Fault::None => effect(&mut self.inner),
            Fault::FailBefore => Err(injected(op, txn, false)),
            Fault::FailAfter => {
                effect(&mut self.inner)?;
                Err(injected(op, txn, true))
            }
            // The schedules draw lost calls and lost responses only.
            Fault::Refuse => unreachable!("the simulation never refuses a call"),
        }
    }
}

impl<D> Drop for FaultyDestination<D> {
    fn drop(&mut self) {
        if let Some(r) = &self.requests {
            r.set_active(false);
        }
    }
}

impl<D: Destination> Destination for FaultyDestination<D> {
    fn begin(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        self.call(Operation::Begin, &handle.transaction, |d| d.begin(handle))
    }

    fn write(
        &mut self,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<(), DestinationError> {
        self.call(Operation::Write, txn, |d| d.write(txn, batch))
    }

    fn prepare(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        self.call(Operation::Prepare, &handle.transaction, |d| {
            d.prepare(handle)
        })
    }

    /// Part of the prepare (the writer asks right after it): not a call of
    /// its own in the schedule.
    fn prepared_location(
        &mut self,
        txn: &TransactionId,
    ) -> Result<Option<Vec<u8>>, DestinationError> {
        self.inner.prepared_location(txn)
    }

    fn commit(
        &mut self,
        handle: &TransactionHandle,
        now_ms: u64,
    ) -> Result<CommitStatus, DestinationError> {
        self.call(Operation::Commit, &handle.transaction, |d| {
            d.commit(handle, now_ms)
        })
    }

    fn abort(&mut self, txn: &TransactionId) -> Result<AbortStatus, DestinationError> {
        self.call(Operation::Abort, txn, |d| d.abort(txn))
    }

    fn staged(&mut self) -> Result<Vec<StagedTransaction>, DestinationError> {
        let id = self.scan_id.clone();
        self.call(Operation::Scan, &id, |d| d.staged())
    }

    fn committed_after(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommittedTransaction>, DestinationError> {
        let id = self.scan_id.clone();
        self.call(Operation::Scan, &id, |d| {
            d.committed_after(lineage, checkpoint)
        })
    }

    fn retract(&mut self, committed: &CommittedTransaction) -> Result<(), DestinationError> {
        self.call(Operation::Retract, &committed.transaction, |d| {
            d.retract(committed)
        })
    }

    /// Retention cleanup is the sink's own housekeeping, not a call whose
    /// failure the schedule explores (the memory store does not fault it
    /// either).
    fn expire(&mut self, txn: &TransactionId, now_ms: u64) -> Result<(), DestinationError> {
        self.inner.expire(txn, now_ms)
    }

    fn confirm_ownership(
        &mut self,
        claim: &OwnerClaim,
    ) -> Result<Option<Ownership>, DestinationError> {
        let id = self.scan_id.clone();
        self.call(Operation::Claim, &id, |d| d.confirm_ownership(claim))
    }

    fn claim_ownership(&mut self, claim: &OwnerClaim) -> Result<Ownership, DestinationError> {
        let id = self.scan_id.clone();
        self.call(Operation::Claim, &id, |d| d.claim_ownership(claim))
    }

    fn lineages(&mut self) -> Result<Vec<LineageSummary>, DestinationError> {
        let id = self.scan_id.clone();
        self.call(Operation::Scan, &id, |d| d.lineages())
    }

    fn record_lineage(&mut self, record: &LineageRecord) -> Result<(), DestinationError> {
        let id = self.scan_id.clone();
        self.call(Operation::Scan, &id, |d| d.record_lineage(record))
    }

    fn record_run_lineage(
        &mut self,
        run: &twopc_core::RunId,
        lineage: LineageId,
    ) -> Result<(), DestinationError> {
        let id = self.scan_id.clone();
        self.call(Operation::Scan, &id, |d| d.record_run_lineage(run, lineage))
    }

    fn run_lineage(
        &mut self,
        run: &twopc_core::RunId,
    ) -> Result<Option<LineageId>, DestinationError> {
        let id = self.scan_id.clone();
        self.call(Operation::Scan, &id, |d| d.run_lineage(run))
    }
    fn compact_history(
        &mut self,
        policy: &twopc_core::destination::HistoryPolicy,
    ) -> Result<twopc_core::destination::Compaction, DestinationError> {
        let id = self.scan_id.clone();
        self.call(Operation::Scan, &id, |d| d.compact_history(policy))
    }

    fn history_tallies(
        &mut self,
    ) -> Result<Vec<twopc_core::destination::HistoryTally>, DestinationError> {
        let id = self.scan_id.clone();
        self.call(Operation::Scan, &id, |d| d.history_tallies())
    }
}

/// The plan's I/O faults for the filesystem destination, switched on once a
/// destination is open (the simulation opens destinations itself).
pub struct PlanIo {
    faults: SharedFaults,
    active: std::sync::atomic::AtomicBool,
    /// A decision for `step` made at its "before" check and due "after".
    due_after: Mutex<Option<(IoStep, i32)>>,
}

impl PlanIo {
    pub fn new(faults: SharedFaults) -> Self {
        PlanIo {
            faults,
            active: std::sync::atomic::AtomicBool::new(false),
            due_after: Mutex::new(None),
        }
    }

    pub fn activate(&self) {
        self.active.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl IoFaults for PlanIo {
    fn inject(
        &self,
        step: IoStep,
        timing: IoTiming,
        _path: &std::path::Path,
    ) -> Option<std::io::Error> {
        if !self.active.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        let mut due = self.due_after.lock().unwrap_or_else(|p| p.into_inner());
        match timing {
            IoTiming::Before => match self.faults.lock().decide_io(step)? {
                (IoTiming::Before, errno) => Some(std::io::Error::from_raw_os_error(errno)),
                (IoTiming::After, errno) => {
                    *due = Some((step, errno));
                    None
                }
            },
            IoTiming::After => match due.take() {
                Some((s, errno)) if s == step => Some(std::io::Error::from_raw_os_error(errno)),
                other => {
                    *due = other;
                    None
                }
            },
        }
    }
}

/// The coverage label of an S3 call (part numbers folded together).
fn request_label(call: S3Call) -> &'static str {
    match call {
        S3Call::CreateUpload => "CreateMultipartUpload",
        S3Call::PutPart { .. } => "UploadPart",
        S3Call::CompleteUpload => "CompleteMultipartUpload",
        S3Call::AbortUpload => "AbortMultipartUpload",
        S3Call::ListUploads => "ListMultipartUploads",
        S3Call::PutObject => "PutObject",
        S3Call::GetObject => "GetObject",
        S3Call::HeadObject => "HeadObject",
        S3Call::DeleteObject => "DeleteObject",
        S3Call::List => "ListObjectsV2",
        S3Call::Other => "other request",
    }
}

/// The plan's request faults for the object store destination (its
/// request hook), switched on once a destination is open and off before
/// it is dropped: a dropped handle stands for a process that died, whose
/// leases lapse during the restart's downtime (the simulation does not
/// wait out a lease in real time), so its release must not fail.
pub struct PlanRequests {
    faults: SharedFaults,
    active: std::sync::atomic::AtomicBool,
    /// Counts every request that passes (active or not), so that a reader
    /// can tell whether anything could have changed since it looked.
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for PlanRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlanRequests")
    }
}

impl PlanRequests {
    pub fn new(faults: SharedFaults, sent: Arc<std::sync::atomic::AtomicU64>) -> Self {
        PlanRequests {
            faults,
            active: std::sync::atomic::AtomicBool::new(false),
            sent,
        }
    }

    pub fn set_active(&self, on: bool) {
        self.active.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

impl RequestFaults for PlanRequests {
    fn decide(&self, request: &RequestInfo) -> FaultAction {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if !self.active.load(std::sync::atomic::Ordering::SeqCst) {
            return FaultAction::Proceed;
        }
        self.faults.lock().decide_request(request.call)
    }
}
