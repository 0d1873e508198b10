//! Test support (feature `testing`): the two attempts that every
//! destination's fencing tests set up, a superseded one (a zombie: its task
//! still runs on a TaskManager cut off from the JobManager) and the one
//! that replaced it, and the steps and checks they share. Each writer and
//! committer gets a destination of its own, as on separate TaskManagers;
//! a destination's tests say through [`AttemptParts`] how to open one.

use crate::records::RecordBatchBuf;
use crate::{
    Clock, CommitOutcome, CommitStep, CommitterSession, Destination, Housekeeping, Restore,
    SinkOptions, SubtaskContext, SystemClock, TransactionHandle, WriterSession, WriterState,
};

/// What differs between destinations in the fencing scenarios.
pub trait AttemptParts {
    type Dest: Destination;
    /// A destination of its own for `ctx` (a TaskManager's).
    fn destination(&self, ctx: &SubtaskContext) -> Self::Dest;
    /// The writer's context of subtask `i` of `parallelism` in `attempt`.
    fn writer_ctx(&self, i: u32, parallelism: u32, attempt: u32) -> SubtaskContext;
    /// The committer's context. In Flink its operator instance differs
    /// from its writer's (the Sink V2 writer mixes its operator's id into
    /// the sink's instance; the committer cannot), so the share checks must
    /// not compare instances; by default the writer's.
    fn committer_ctx(&self, i: u32, parallelism: u32, attempt: u32) -> SubtaskContext {
        self.writer_ctx(i, parallelism, attempt)
    }
    /// A batch of `records` as the destination takes them.
    fn batch(records: &[&str]) -> RecordBatchBuf;
    /// The record the newer attempt's subtask `i` prepares.
    fn newer_record(&self, i: u32) -> String {
        format!("c{i}")
    }
}

/// A batch of `records`, strings or string slices, for `P`'s destination.
fn batch_of<P: AttemptParts, S: AsRef<str>>(records: &[S]) -> RecordBatchBuf {
    P::batch(&records.iter().map(AsRef::as_ref).collect::<Vec<&str>>())
}

/// Begins a transaction in `writer` and writes `batch`; it stays open.
pub fn begun<D: Destination>(
    writer: &mut WriterSession,
    d: &mut D,
    clock: &impl Clock,
    batch: &RecordBatchBuf,
) -> TransactionHandle {
    let open = writer.begin(d, clock).unwrap();
    writer.write(d, &open.transaction, batch).unwrap();
    open
}

/// Begins a transaction in `writer`, writes `batch` and prepares it for
/// `checkpoint`.
pub fn prepared_by<D: Destination>(
    writer: &mut WriterSession,
    d: &mut D,
    clock: &impl Clock,
    batch: &RecordBatchBuf,
    checkpoint: u64,
) -> TransactionHandle {
    let open = begun(writer, d, clock, batch);
    writer
        .prepare(d, clock, &open.transaction, checkpoint)
        .unwrap()
}

/// Subtask 0 of attempt `attempt` at parallelism 1, restored from
/// `restore` (a fresh start without): a Sink V2 writer and committer.
pub struct OneSubtask<D> {
    pub writer: WriterSession,
    pub writer_dest: D,
    pub committer: CommitterSession,
    pub committer_dest: D,
    batch: fn(&[&str]) -> RecordBatchBuf,
}

impl<D: Destination> OneSubtask<D> {
    pub fn open<P: AttemptParts<Dest = D>>(
        parts: &P,
        clock: &impl Clock,
        options: &SinkOptions,
        attempt: u32,
        restore: Option<&Restore>,
        nonce: u64,
    ) -> Self {
        let writer_ctx = parts.writer_ctx(0, 1, attempt);
        let mut writer_dest = parts.destination(&writer_ctx);
        let (writer, _) = WriterSession::open(
            &mut writer_dest,
            clock,
            writer_ctx,
            options,
            restore,
            Some(nonce),
        )
        .unwrap();
        let committer_ctx = parts.committer_ctx(0, 1, attempt);
        OneSubtask {
            writer,
            writer_dest,
            committer_dest: parts.destination(&committer_ctx),
            committer: CommitterSession::new(
                committer_ctx,
                options.clone(),
                restore.map(|r| r.checkpoint),
            ),
            batch: P::batch,
        }
    }

    /// Begins a transaction, writes `records` and prepares it for
    /// `checkpoint`.
    pub fn prepares<S: AsRef<str>>(
        &mut self,
        clock: &impl Clock,
        records: &[S],
        checkpoint: u64,
    ) -> TransactionHandle {
        let batch = (self.batch)(&records.iter().map(AsRef::as_ref).collect::<Vec<&str>>());
        prepared_by(
            &mut self.writer,
            &mut self.writer_dest,
            clock,
            &batch,
            checkpoint,
        )
    }

    /// Begins a transaction and writes `records`; it stays open.
    pub fn begins<S: AsRef<str>>(
        &mut self,
        clock: &impl Clock,
        records: &[S],
    ) -> TransactionHandle {
        let batch = (self.batch)(&records.iter().map(AsRef::as_ref).collect::<Vec<&str>>());
        begun(&mut self.writer, &mut self.writer_dest, clock, &batch)
    }

    /// The writer closes (its TaskManager was lost); the committer, which
    /// is returned, still runs.
    pub fn writer_closes(self) -> (CommitterSession, D) {
        (self.committer, self.committer_dest)
    }
}

/// The attempt that replaced a zombie: attempt 2, restored from checkpoint
/// `restored` at `parallelism`. Subtask 0 gets the restored writer `state`
/// and commits the restored `committable`; then each writer `i` prepares
/// [`AttemptParts::newer_record`] for the next checkpoint.
pub struct NewerAttempt<D> {
    /// Open, so that they hold their shares.
    pub writers: Vec<(WriterSession, D)>,
    /// Each with a destination apart from its writer's (the Sink V2
    /// topology).
    pub committers: Vec<(CommitterSession, D)>,
    /// Each subtask's transaction prepared for the checkpoint after the
    /// restored one.
    pub prepared: Vec<TransactionHandle>,
}

impl<D: Destination> NewerAttempt<D> {
    pub fn start<P: AttemptParts<Dest = D>>(
        parts: &P,
        clock: &impl Clock,
        options: &SinkOptions,
        restored: u64,
        state: &WriterState,
        committable: &TransactionHandle,
        parallelism: u32,
    ) -> Self {
        let mut writers = Vec::new();
        let mut committers = Vec::new();
        for i in 0..parallelism {
            let restore = Restore {
                checkpoint: restored,
                states: if i == 0 {
                    vec![state.clone()]
                } else {
                    Vec::new()
                },
                known: Vec::new(),
            };
            let writer_ctx = parts.writer_ctx(i, parallelism, 2);
            let mut d = parts.destination(&writer_ctx);
            let (w, _) = WriterSession::open(
                &mut d,
                clock,
                writer_ctx,
                options,
                Some(&restore),
                Some(30 + u64::from(i)),
            )
            .unwrap();
            writers.push((w, d));
            let committer_ctx = parts.committer_ctx(i, parallelism, 2);
            let committer_dest = parts.destination(&committer_ctx);
            committers.push((
                CommitterSession::new(committer_ctx, options.clone(), Some(restored)),
                committer_dest,
            ));
        }
        let (c0, c0_dest) = &mut committers[0];
        assert_eq!(
            c0.commit_attempt(c0_dest, clock, committable, 1).unwrap(),
            CommitStep::Done(CommitOutcome::Committed)
        );
        let prepared = writers
            .iter_mut()
            .enumerate()
            .map(|(i, (w, d))| {
                let batch = batch_of::<P, _>(&[parts.newer_record(i as u32)]);
                prepared_by(w, d, clock, &batch, restored + 1)
            })
            .collect();
        NewerAttempt {
            writers,
            committers,
            prepared,
        }
    }

    /// Each committer commits its subtask's prepared transaction (none may
    /// be lost) and runs the housekeeping of `checkpoint`; the reports are
    /// returned in subtask order.
    pub fn commit_and_clean_up(
        &mut self,
        clock: &impl Clock,
        checkpoint: u64,
    ) -> Vec<Housekeeping> {
        commit_and_clean_up(&mut self.committers, &self.prepared, clock, checkpoint)
    }
}

/// The system clock, this many milliseconds on: what was staged now looks
/// that old to a retention scan.
pub struct Ahead(pub u64);

impl Clock for Ahead {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms() + self.0
    }
    fn sleep_ms(&self, ms: u64) {
        SystemClock.sleep_ms(ms)
    }
}

/// Each of the newer attempt's committers commits its subtask's prepared
/// transaction (none may be lost) and runs the housekeeping of
/// `checkpoint`; the reports are returned in subtask order.
pub fn commit_and_clean_up<D: Destination>(
    committers: &mut [(CommitterSession, D)],
    prepared: &[TransactionHandle],
    clock: &impl Clock,
    checkpoint: u64,
) -> Vec<Housekeeping> {
    assert_eq!(
        committers.len(),
        prepared.len(),
        "one transaction per committer"
    );
    committers
        .iter_mut()
        .zip(prepared)
        .map(|((c, d), h)| {
            assert_eq!(
                c.commit_attempt(d, clock, h, 1).unwrap(),
                CommitStep::Done(CommitOutcome::Committed),
                "attempt 2's transaction of subtask {}",
                h.subtask
            );
            c.checkpoint_completed(d, clock, checkpoint).unwrap()
        })
        .collect()
}

/// A zombie's committer is told late that `checkpoint` completed: it
/// commits `committable` again (the newer attempt did already) and runs its
/// housekeeping, whose report is returned.
pub fn zombie_told_late<D: Destination>(
    committer: &mut CommitterSession,
    d: &mut D,
    clock: &impl Clock,
    committable: &TransactionHandle,
    checkpoint: u64,
) -> Housekeeping {
    assert_eq!(
        committer.commit_attempt(d, clock, committable, 1).unwrap(),
        CommitStep::Done(CommitOutcome::AlreadyCommitted)
    );
    committer
        .checkpoint_completed(d, clock, checkpoint)
        .unwrap()
}

/// Checks that `report` has one failure for each of the shares `0..shares`
/// (the zombie, at parallelism 1, owns them all), each saying that attempt
/// 2 holds it and that the zombie was superseded.
pub fn assert_shares_left_to_attempt_2(report: &Housekeeping, shares: u32) {
    assert_eq!(report.failures.len(), shares as usize, "{report:?}");
    for (i, f) in report.failures.iter().enumerate() {
        assert!(
            f.contains(&format!("subtask index {i}'s share"))
                && f.contains("a later attempt (2)")
                && f.contains("superseded"),
            "{f}"
        );
    }
}
