//! An in-memory destination with injectable faults, for tests and the
//! simulation. It models a transactional store faithfully (staged data is
//! invisible, commits are recorded, expiry leaves a tombstone) and lets a
//! test decide, per call, whether the call fails before or after its effect.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::destination::{
    AbortStatus, CommitStatus, CommittedTransaction, Destination, LineageRecord, LineageSummary,
    OperationRecord, OwnerClaim, OwnerInfo, Ownership, StagedState, StagedTransaction,
};
use crate::error::{DestinationError, DestinationErrorKind};
use crate::handle::TransactionHandle;
use crate::ids::{CheckpointId, LineageId, RunId, SinkId, TransactionId};
use crate::records::RecordBatch;

/// Which destination call a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    Begin,
    Write,
    Prepare,
    Commit,
    Abort,
    Scan,
    Retract,
    Claim,
}

/// What happens to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fault {
    #[default]
    None,
    /// The call fails and has no effect.
    FailBefore,
    /// The call takes effect, then reports failure (a lost response).
    FailAfter,
    /// The call is refused for certain (`NotPermitted`: rights, a
    /// read-only file system) and has no effect.
    Refuse,
}

type FaultFn = Box<dyn FnMut(Operation, &TransactionId) -> Fault + Send>;

#[derive(Clone, Debug, Default)]
struct Staged {
    records: Vec<Vec<u8>>,
    prepared: Option<TransactionHandle>,
    last_activity_ms: u64,
}

#[derive(Clone, Debug)]
struct Committed {
    meta: CommittedTransaction,
    run: RunId,
    records: Vec<Vec<u8>>,
}

#[derive(Default)]
struct Store {
    staged: BTreeMap<TransactionId, Staged>,
    committed: BTreeMap<TransactionId, Committed>,
    expired: BTreeSet<TransactionId>,
    fault: Option<FaultFn>,
    now_ms: u64,
    /// (sink, subtask) -> the destination view holding it, and its claim.
    owners: BTreeMap<(SinkId, u32), (u64, OwnerClaim)>,
    lineages: BTreeMap<(SinkId, LineageId), LineageRecord>,
    runs: BTreeMap<(SinkId, RunId), LineageId>,
    operations: Vec<(SinkId, OperationRecord)>,
}

/// Tells destination views apart, for ownership.
static NEXT_VIEW: AtomicU64 = AtomicU64::new(1);

/// The shared store; clone it to give several subtasks the same data.
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Store>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        // A panicking test thread must not hide the store from the checks
        // that follow; the data itself is always left consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A destination view for one sink.
    pub fn destination(&self, sink: &SinkId) -> MemoryDestination {
        MemoryDestination {
            store: self.clone(),
            sink: sink.clone(),
            view: NEXT_VIEW.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Installs the fault decision function (replacing any previous one).
    pub fn set_faults(&self, f: impl FnMut(Operation, &TransactionId) -> Fault + Send + 'static) {
        self.lock().fault = Some(Box::new(f));
    }

    pub fn clear_faults(&self) {
        self.lock().fault = None;
    }

    /// The time used for activity stamps.
    pub fn set_now(&self, now_ms: u64) {
        self.lock().now_ms = now_ms;
    }

    /// Everything readers can see: records of committed transactions.
    pub fn visible_records(&self) -> Vec<Vec<u8>> {
        self.lock()
            .committed
            .values()
            .flat_map(|c| c.records.iter().cloned())
            .collect()
    }

    pub fn committed(&self) -> Vec<CommittedTransaction> {
        self.lock()
            .committed
            .values()
            .map(|c| c.meta.clone())
            .collect()
    }

    pub fn staged_ids(&self) -> Vec<TransactionId> {
        self.lock().staged.keys().cloned().collect()
    }

    /// Prepared staged transactions (id and checkpoint).
    pub fn prepared_ids(&self) -> Vec<(TransactionId, CheckpointId)> {
        self.lock()
            .staged
            .iter()
            .filter_map(|(id, s)| {
                s.prepared
                    .as_ref()
                    .and_then(|h| h.checkpoint())
                    .map(|c| (id.clone(), c))
            })
            .collect()
    }

    /// The destination loses a staged transaction on its own (its
    /// transaction timeout), as a broker or database would.
    pub fn expire_externally(&self, txn: &TransactionId) -> bool {
        let mut s = self.lock();
        let existed = s.staged.remove(txn).is_some();
        if existed {
            s.expired.insert(txn.clone());
        }
        existed
    }
}

/// One sink's view of a [`MemoryStore`]. Ownership claimed through a view
/// is released when the view is dropped, as a lock dies with its process.
pub struct MemoryDestination {
    store: MemoryStore,
    sink: SinkId,
    view: u64,
}

impl Drop for MemoryDestination {
    fn drop(&mut self) {
        let view = self.view;
        self.store.lock().owners.retain(|_, (v, _)| *v != view);
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

impl MemoryDestination {
    /// Runs `effect` under the fault decided for (op, txn).
    fn with_fault<T>(
        &mut self,
        op: Operation,
        txn: &TransactionId,
        effect: impl FnOnce(&mut Store) -> Result<T, DestinationError>,
    ) -> Result<T, DestinationError> {
        let mut s = self.store.lock();
        let fault = match s.fault.as_mut() {
            Some(f) => f(op, txn),
            None => Fault::None,
        };
        match fault {
            Fault::None => effect(&mut s),
            Fault::FailBefore => Err(injected(op, txn, false)),
            Fault::FailAfter => {
                effect(&mut s)?;
                Err(injected(op, txn, true))
            }
            Fault::Refuse => Err(DestinationError::new(
                DestinationErrorKind::NotPermitted,
                format!("injected refusal: {op:?} of {txn} is not permitted"),
            )),
        }
    }

    fn owns(&self, txn: &TransactionId) -> bool {
        TransactionId::parse(txn.as_str()).is_some_and(|p| p.sink == self.sink)
    }
}

impl Destination for MemoryDestination {
    fn begin(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        self.with_fault(Operation::Begin, &handle.transaction, |s| {
            let now = s.now_ms;
            s.staged
                .entry(handle.transaction.clone())
                .or_insert(Staged {
                    last_activity_ms: now,
                    ..Staged::default()
                });
            Ok(())
        })
    }

    fn write(
        &mut self,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<(), DestinationError> {
        self.with_fault(Operation::Write, txn, |s| {
            let now = s.now_ms;
            let staged = s.staged.get_mut(txn).ok_or_else(|| {
                DestinationError::new(
                    DestinationErrorKind::Unavailable,
                    format!("the destination no longer has transaction {txn} (it timed out)"),
                )
            })?;
            staged.records.extend(batch.iter().map(<[u8]>::to_vec));
            staged.last_activity_ms = now;
            Ok(())
        })
    }

    fn prepare(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        self.with_fault(Operation::Prepare, &handle.transaction, |s| {
            let now = s.now_ms;
            let staged = s.staged.get_mut(&handle.transaction).ok_or_else(|| {
                DestinationError::new(
                    DestinationErrorKind::Unavailable,
                    format!(
                        "the destination no longer has transaction {} (it timed out)",
                        handle.transaction
                    ),
                )
            })?;
            // What the handle counts must be what is staged: a transaction
            // that lost records on the way must never be prepared.
            let counted = handle.prepared().map_or(0, |p| p.records);
            if staged.records.len() as u64 != counted {
                return Err(DestinationError::corrupt(format!(
                    "transaction {} holds {} staged records but its handle counts {counted}",
                    handle.transaction,
                    staged.records.len()
                )));
            }
            staged.prepared = Some(handle.clone());
            staged.last_activity_ms = now;
            Ok(())
        })
    }

    fn commit(
        &mut self,
        handle: &TransactionHandle,
        now_ms: u64,
    ) -> Result<CommitStatus, DestinationError> {
        let txn = handle.transaction.clone();
        self.with_fault(Operation::Commit, &txn, |s| {
            if s.committed.contains_key(&txn) {
                return Ok(CommitStatus::AlreadyCommitted);
            }
            let Some(prepared) = s.staged.get(&txn).map(|st| st.prepared.clone()) else {
                let evidence = if s.expired.contains(&txn) {
                    "the destination expired its staged data (transaction timeout)".to_string()
                } else {
                    "the destination has neither its staged data nor a commit record".to_string()
                };
                return Ok(CommitStatus::Missing { evidence });
            };
            let Some(prepared) = prepared.as_ref().and_then(|h| h.prepared()).cloned() else {
                return Ok(CommitStatus::Missing {
                    evidence: "its staged data was never prepared".to_string(),
                });
            };
            let staged = s.staged.remove(&txn).unwrap_or_default();
            let meta = CommittedTransaction {
                transaction: txn.clone(),
                lineage: handle.lineage,
                checkpoint: prepared.checkpoint,
                subtask: handle.subtask,
                run: handle.run.clone(),
                records: staged.records.len() as u64,
                committed_at_ms: now_ms,
            };
            s.committed.insert(
                txn.clone(),
                Committed {
                    meta,
                    run: handle.run.clone(),
                    records: staged.records,
                },
            );
            Ok(CommitStatus::Committed)
        })
    }

    fn abort(&mut self, txn: &TransactionId) -> Result<AbortStatus, DestinationError> {
        self.with_fault(Operation::Abort, txn, |s| {
            if s.staged.remove(txn).is_some() {
                Ok(AbortStatus::Aborted)
            } else if s.committed.contains_key(txn) {
                Ok(AbortStatus::WasCommitted)
            } else {
                Ok(AbortStatus::NotFound)
            }
        })
    }

    fn staged(&mut self) -> Result<Vec<StagedTransaction>, DestinationError> {
        let scan = TransactionId::compose(&self.sink, 0, 0, 0);
        let sink = self.sink.clone();
        self.with_fault(Operation::Scan, &scan, |s| {
            Ok(s.staged
                .iter()
                .filter_map(|(id, st)| {
                    let p = TransactionId::parse(id.as_str())?;
                    (p.sink == sink).then(|| StagedTransaction {
                        transaction: id.clone(),
                        subtask: p.subtask,
                        attempt_nonce: p.attempt_nonce,
                        state: match &st.prepared {
                            Some(h) => StagedState::Prepared(h.clone()),
                            None => StagedState::Open,
                        },
                        last_activity_ms: st.last_activity_ms,
                    })
                })
                .collect())
        })
    }

    fn committed_after(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommittedTransaction>, DestinationError> {
        let scan = TransactionId::compose(&self.sink, 0, 0, 0);
        let owned: Vec<CommittedTransaction> = {
            let s = self.store.lock();
            s.committed
                .values()
                .filter(|c| self.owns(&c.meta.transaction))
                .filter(|c| c.meta.lineage == lineage && c.meta.checkpoint > checkpoint)
                .map(|c| c.meta.clone())
                .collect()
        };
        self.with_fault(Operation::Scan, &scan, |_| Ok(owned))
    }

    fn retract(&mut self, committed: &CommittedTransaction) -> Result<(), DestinationError> {
        self.with_fault(Operation::Retract, &committed.transaction, |s| {
            s.committed.remove(&committed.transaction);
            Ok(())
        })
    }

    fn expire(&mut self, txn: &TransactionId, _now_ms: u64) -> Result<(), DestinationError> {
        let mut s = self.store.lock();
        if s.staged.remove(txn).is_some() {
            s.expired.insert(txn.clone());
        }
        Ok(())
    }

    fn claim_ownership(&mut self, claim: &OwnerClaim) -> Result<Ownership, DestinationError> {
        let view = self.view;
        let key = (self.sink.clone(), claim.subtask);
        let scan = TransactionId::compose(&self.sink, claim.subtask, 0, 0);
        self.with_fault(Operation::Claim, &scan, |s| match s.owners.get(&key) {
            Some((holder, held)) if *holder != view => Ok(Ownership::HeldBy(OwnerInfo {
                claim: Some(held.clone()),
                holder: format!(
                    "run {} attempt {} (memory view {holder})",
                    held.run, held.attempt
                ),
            })),
            _ => {
                s.owners.insert(key, (view, claim.clone()));
                Ok(Ownership::Acquired)
            }
        })
    }

    /// A view's claims are re-entrant and never take over another view's
    /// share, so a claim is the confirmation.
    fn confirm_ownership(
        &mut self,
        claim: &OwnerClaim,
    ) -> Result<Option<Ownership>, DestinationError> {
        self.claim_ownership(claim).map(Some)
    }

    fn owner_subtasks(&mut self) -> Result<Vec<u32>, DestinationError> {
        let s = self.store.lock();
        Ok(s.owners
            .keys()
            .filter(|(sink, _)| *sink == self.sink)
            .map(|(_, subtask)| *subtask)
            .collect())
    }

    fn record_operation(&mut self, record: &OperationRecord) -> Result<(), DestinationError> {
        let sink = self.sink.clone();
        self.store.lock().operations.push((sink, record.clone()));
        Ok(())
    }

    fn operations(&mut self) -> Result<Vec<OperationRecord>, DestinationError> {
        Ok(self
            .store
            .lock()
            .operations
            .iter()
            .filter(|(sink, _)| *sink == self.sink)
            .map(|(_, r)| r.clone())
            .collect())
    }

    fn lineages(&mut self) -> Result<Vec<LineageSummary>, DestinationError> {
        let scan = TransactionId::compose(&self.sink, 0, 0, 0);
        let sink = self.sink.clone();
        self.with_fault(Operation::Scan, &scan, |s| {
            let mut by: BTreeMap<LineageId, LineageSummary> = BTreeMap::new();
            for c in s.committed.values() {
                let Some(p) = TransactionId::parse(c.meta.transaction.as_str()) else {
                    continue;
                };
                if p.sink != sink {
                    continue;
                }
                let l = by.entry(c.meta.lineage).or_insert_with(|| LineageSummary {
                    lineage: c.meta.lineage,
                    committed: 0,
                    last_checkpoint: None,
                    last_transactions: Vec::new(),
                    runs: Vec::new(),
                    record: s.lineages.get(&(sink.clone(), c.meta.lineage)).cloned(),
                });
                l.committed += 1;
                if !l.runs.contains(&c.run) {
                    l.runs.push(c.run.clone());
                }
                if l.last_checkpoint < Some(c.meta.checkpoint) {
                    l.last_checkpoint = Some(c.meta.checkpoint);
                    l.last_transactions.clear();
                }
                if l.last_checkpoint == Some(c.meta.checkpoint) {
                    l.last_transactions.push(c.meta.transaction.clone());
                }
            }
            Ok(by.into_values().collect())
        })
    }

    fn record_lineage(&mut self, record: &LineageRecord) -> Result<(), DestinationError> {
        let scan = TransactionId::compose(&self.sink, 0, 0, 0);
        let key = (self.sink.clone(), record.lineage);
        self.with_fault(Operation::Scan, &scan, |s| {
            s.lineages.entry(key).or_insert_with(|| record.clone());
            Ok(())
        })
    }

    fn record_run_lineage(
        &mut self,
        run: &RunId,
        lineage: LineageId,
    ) -> Result<(), DestinationError> {
        let scan = TransactionId::compose(&self.sink, 0, 0, 0);
        let key = (self.sink.clone(), run.clone());
        self.with_fault(Operation::Scan, &scan, |s| match s.runs.get(&key) {
            Some(l) if *l != lineage => Err(DestinationError::corrupt(format!(
                "run {run} is recorded with lineage {l}, not {lineage}"
            ))),
            _ => {
                s.runs.insert(key, lineage);
                Ok(())
            }
        })
    }

    fn run_lineage(&mut self, run: &RunId) -> Result<Option<LineageId>, DestinationError> {
        let scan = TransactionId::compose(&self.sink, 0, 0, 0);
        let key = (self.sink.clone(), run.clone());
        self.with_fault(Operation::Scan, &scan, |s| Ok(s.runs.get(&key).copied()))
    }
}
