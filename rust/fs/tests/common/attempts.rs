//! A superseded attempt (a zombie) and the newer attempt that replaced it,
//! on one output directory: each side's writers and committers with
//! destinations of their own, as on separate TaskManagers (in one process
//! here, which `flock` tells apart all the same: its locks belong to open
//! files).

use std::path::Path;

use twopc_core::{
    Clock, CommitOutcome, CommitStep, CommitterSession, Housekeeping, Restore, RunId, SinkOptions,
    SubtaskContext, SystemClock, TransactionHandle, WriterSession, WriterState,
};
use twopc_fs::FsDestination;

use super::{batch, dest, sink};

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

/// A writer's context: subtask `i` of `parallelism` in attempt `attempt`
/// of run1.
pub fn writer_ctx(i: u32, parallelism: u32, attempt: u32) -> SubtaskContext {
    SubtaskContext::new(sink(), RunId::new("run1").unwrap(), i, parallelism)
        .unwrap()
        .with_attempt(attempt, 0xfeed)
}

/// A committer's context: as in Flink, its operator instance differs from
/// its writer's (the Sink V2 writer mixes its operator's id into the
/// sink's instance; the committer cannot), so the share check must not
/// compare instances.
pub fn committer_ctx(i: u32, parallelism: u32, attempt: u32) -> SubtaskContext {
    SubtaskContext::new(sink(), RunId::new("run1").unwrap(), i, parallelism)
        .unwrap()
        .with_attempt(attempt, 0xc0ffee)
}

/// Begins a transaction in `writer` and writes `records`; it stays open.
pub fn begun(
    writer: &mut WriterSession,
    d: &mut FsDestination,
    clock: &impl Clock,
    records: &[&str],
) -> TransactionHandle {
    let open = writer.begin(d, clock).unwrap();
    writer.write(d, &open.transaction, &batch(records)).unwrap();
    open
}

/// Begins a transaction in `writer`, writes `records` and prepares it for
/// `checkpoint`.
pub fn prepared_by(
    writer: &mut WriterSession,
    d: &mut FsDestination,
    clock: &impl Clock,
    records: &[&str],
    checkpoint: u64,
) -> TransactionHandle {
    let open = begun(writer, d, clock, records);
    writer
        .prepare(d, clock, &open.transaction, checkpoint)
        .unwrap()
}

/// Subtask 0 of attempt `attempt` at parallelism 1, restored from
/// `restore` (a fresh start without): a Sink V2 writer and committer.
pub struct OneSubtask {
    pub writer: WriterSession,
    pub writer_dest: FsDestination,
    pub committer: CommitterSession,
    pub committer_dest: FsDestination,
}

impl OneSubtask {
    pub fn open(
        dir: &Path,
        clock: &impl Clock,
        options: &SinkOptions,
        attempt: u32,
        restore: Option<&Restore>,
        nonce: u64,
    ) -> Self {
        let mut writer_dest = dest(dir);
        let (writer, _) = WriterSession::open(
            &mut writer_dest,
            clock,
            writer_ctx(0, 1, attempt),
            options,
            restore,
            Some(nonce),
        )
        .unwrap();
        OneSubtask {
            writer,
            writer_dest,
            committer: CommitterSession::new(
                committer_ctx(0, 1, attempt),
                options.clone(),
                restore.map(|r| r.checkpoint),
            ),
            committer_dest: dest(dir),
        }
    }

    pub fn prepares(
        &mut self,
        clock: &impl Clock,
        records: &[&str],
        checkpoint: u64,
    ) -> TransactionHandle {
        prepared_by(
            &mut self.writer,
            &mut self.writer_dest,
            clock,
            records,
            checkpoint,
        )
    }

    /// The writer closes (its TaskManager was lost); the committer, which
    /// is returned, still runs.
    pub fn writer_closes(self) -> (CommitterSession, FsDestination) {
        (self.committer, self.committer_dest)
    }
}

/// The attempt that replaced a zombie: attempt 2, restored from checkpoint
/// `restored` at `parallelism`. Subtask 0 gets the restored writer `state`
/// and commits the restored `committable`; then each writer prepares a
/// transaction (`c<index>`) for the next checkpoint.
pub struct NewerAttempt {
    /// Open, so that they hold their shares' locks.
    pub writers: Vec<(WriterSession, FsDestination)>,
    /// Each with a destination apart from its writer's (the Sink V2
    /// topology).
    pub committers: Vec<(CommitterSession, FsDestination)>,
    /// Each subtask's transaction prepared for the checkpoint after the
    /// restored one.
    pub prepared: Vec<TransactionHandle>,
}

impl NewerAttempt {
    pub fn start(
        dir: &Path,
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
            let mut d = dest(dir);
            let (w, _) = WriterSession::open(
                &mut d,
                clock,
                writer_ctx(i, parallelism, 2),
                options,
                Some(&restore),
                Some(30 + u64::from(i)),
            )
            .unwrap();
            writers.push((w, d));
            committers.push((
                CommitterSession::new(
                    committer_ctx(i, parallelism, 2),
                    options.clone(),
                    Some(restored),
                ),
                dest(dir),
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
            .map(|(i, (w, d))| prepared_by(w, d, clock, &[&format!("c{i}")], restored + 1))
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
        self.committers
            .iter_mut()
            .zip(&self.prepared)
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
}

/// A zombie's committer is told late that `checkpoint` completed: it
/// commits `committable` again (the newer attempt did already) and runs its
/// housekeeping, whose report is returned.
pub fn zombie_told_late(
    committer: &mut CommitterSession,
    d: &mut FsDestination,
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

/// The contents of the visible output files, sorted.
pub fn visible_contents(dir: &Path) -> Vec<String> {
    let mut seen: Vec<String> = super::visible_files(dir)
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap())
        .collect();
    seen.sort();
    seen
}
