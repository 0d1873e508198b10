//! Flink's side of the state: what one subtask writes into a checkpoint,
//! what a completed checkpoint holds, how its list state is split on
//! restore, and which checkpoints an operator can still restore from.

use twopc_core::{CheckpointId, LineageId, Restore, RunId, TransactionHandle, WriterState};

/// What one subtask put into a checkpoint. SinkFunction: one element of
/// the sink's operator list state "state", as
/// `TwoPhaseCommitSinkFunction.snapshotState` writes it. Sink V2: writer
/// `i`'s state and committer `i`'s, which Flink keeps apart and splits
/// apart on rescale (see [`CompletedCheckpoint::assign`]).
#[derive(Clone, Debug)]
pub struct SubtaskState {
    /// `pendingCommitTransactions` at snapshot time, in checkpoint order;
    /// Sink V2: the committer's committables not yet committed, under
    /// Flink's checkpoint id (the handle's own id is the writer's
    /// estimate, never above it).
    pub pending: Vec<(CheckpointId, TransactionHandle)>,
    /// The transaction begun right after the snapshot's pre-commit (Sink
    /// V2: after `prepareCommit`).
    pub current: TransactionHandle,
    /// The writer's state (its open transaction is `current`): Sink V2's
    /// writer state element; SinkFunction: what the shim writes into its
    /// own list state `writerState` beside Flink's.
    pub writer: Option<WriterState>,
}

/// A checkpoint every subtask acknowledged, as the checkpoint store keeps it.
#[derive(Clone, Debug)]
pub struct CompletedCheckpoint {
    pub id: CheckpointId,
    pub run: RunId,
    /// Source position: every record below it went into this or an earlier
    /// checkpoint's transactions.
    pub offset: usize,
    /// One state per subtask of the parallelism that took it.
    pub states: Vec<SubtaskState>,
}

/// How Flink splits restored list state when the parallelism changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redistribution {
    /// State `j` goes to subtask `j % parallelism`.
    RoundRobin,
    /// Contiguous ranges, the first `len % parallelism` subtasks one longer:
    /// what `RoundRobinOperatorStateRepartitioner` actually produces for a
    /// single list state.
    Contiguous,
}

impl CompletedCheckpoint {
    pub fn lineage(&self) -> LineageId {
        self.states[0].current.lineage
    }

    /// SinkFunction: what each subtask's `SubtaskSink::open` is given on
    /// restore, as `TwopcSinkFunction.initializeState` passes it: the
    /// writer states of its share of the list state `writerState`, and no
    /// handles. That list holds, per old subtask, the writer state and a
    /// copy of each pending handle (kept for an upgrade to Sink V2, skipped
    /// here), and Flink splits it apart from the base class's own state
    /// (the pending and current handles, see [`Self::assign`]): after a
    /// rescale a subtask may commit handles whose writer state went to
    /// another subtask, and may get no writer state at all.
    pub fn sink_function_restores(&self, parallelism: usize, how: Redistribution) -> Vec<Restore> {
        let elements: Vec<Vec<Option<WriterState>>> = self
            .states
            .iter()
            .map(|s| {
                let mut list = vec![Some(
                    s.writer
                        .clone()
                        .expect("a SinkFunction checkpoint holds writer states"),
                )];
                list.extend(s.pending.iter().map(|_| None));
                list
            })
            .collect();
        split(elements, parallelism, how)
            .into_iter()
            .map(|share| Restore {
                states: share.into_iter().flatten().collect(),
                checkpoint: self.id,
                known: Vec::new(),
            })
            .collect()
    }

    /// The states each subtask of `parallelism` restores. With an unchanged
    /// parallelism Flink hands every subtask its own state back; otherwise
    /// a subtask may get several states, or none.
    pub fn assign(&self, parallelism: usize, how: Redistribution) -> Vec<Vec<SubtaskState>> {
        split(
            self.states.iter().map(|s| vec![s.clone()]).collect(),
            parallelism,
            how,
        )
    }
}

/// How Flink splits one list state (`per_subtask[i]`: the elements old
/// subtask `i` wrote) over `parallelism` subtasks: unchanged when the
/// parallelism is, otherwise the elements of all old subtasks, in order,
/// redistributed.
fn split<T: Clone>(
    per_subtask: Vec<Vec<T>>,
    parallelism: usize,
    how: Redistribution,
) -> Vec<Vec<T>> {
    if per_subtask.len() == parallelism {
        return per_subtask;
    }
    let all: Vec<T> = per_subtask.into_iter().flatten().collect();
    let mut out: Vec<Vec<T>> = vec![Vec::new(); parallelism];
    match how {
        Redistribution::RoundRobin => {
            for (j, e) in all.into_iter().enumerate() {
                out[j % parallelism].push(e);
            }
        }
        Redistribution::Contiguous => {
            let n = all.len();
            let (base, extra) = (n / parallelism, n % parallelism);
            let mut next = all.into_iter();
            for (i, slot) in out.iter_mut().enumerate() {
                let take = base + usize::from(i < extra);
                slot.extend(next.by_ref().take(take));
            }
        }
    }
    out
}

/// Retained checkpoints and savepoints of the live branch of the job's
/// history, oldest first: what an operator can restore from. Ids increase
/// along the branch because a restore from checkpoint `k` numbers new
/// checkpoints from `k + 1` and cuts off the abandoned ones after `k`.
#[derive(Default)]
pub struct CheckpointStore {
    chain: Vec<CompletedCheckpoint>,
    /// Highest offset any completed checkpoint ever reached: nothing above
    /// it may ever be visible.
    high_water: usize,
}

impl CheckpointStore {
    pub fn add(&mut self, cp: CompletedCheckpoint) {
        self.high_water = self.high_water.max(cp.offset);
        self.chain.push(cp);
    }

    pub fn latest(&self) -> Option<&CompletedCheckpoint> {
        self.chain.last()
    }

    pub fn all(&self) -> &[CompletedCheckpoint] {
        &self.chain
    }

    /// The newest checkpoint older than `id`, to rewind to before a loss.
    pub fn latest_before(&self, id: CheckpointId) -> Option<&CompletedCheckpoint> {
        self.chain.iter().rev().find(|c| c.id < id)
    }

    /// A restore from `id` abandons every later checkpoint of the branch.
    pub fn cut_after(&mut self, id: CheckpointId) {
        self.chain.retain(|c| c.id <= id);
    }

    /// A start without state begins a new lineage; the old checkpoints no
    /// longer match what the destination will hold.
    pub fn clear(&mut self) {
        self.chain.clear();
    }

    pub fn high_water(&self) -> usize {
        self.high_water
    }
}
