//! A superseded attempt (a zombie) and the newer attempt that replaced it,
//! on one output directory: each side's writers and committers with
//! destinations of their own, as on separate TaskManagers (in one process
//! here, which `flock` tells apart all the same: its locks belong to open
//! files).

use std::path::Path;

use twopc_core::fencing_scenarios::{self, AttemptParts};
use twopc_core::records::RecordBatchBuf;
use twopc_core::{RunId, SubtaskContext};
use twopc_fs::FsDestination;

// Re-exported for the fencing tests; other tests share this module.
#[allow(unused_imports)]
pub use twopc_core::fencing_scenarios::{
    assert_shares_left_to_attempt_2, prepared_by, zombie_told_late, Ahead,
};

use super::{batch, dest, sink};

pub type OneSubtask = fencing_scenarios::OneSubtask<FsDestination>;
pub type NewerAttempt = fencing_scenarios::NewerAttempt<FsDestination>;

/// The attempts' parts on one output directory.
pub struct OutputDir<'a>(pub &'a Path);

impl AttemptParts for OutputDir<'_> {
    type Dest = FsDestination;
    fn destination(&self, _ctx: &SubtaskContext) -> FsDestination {
        dest(self.0)
    }
    fn writer_ctx(&self, i: u32, parallelism: u32, attempt: u32) -> SubtaskContext {
        writer_ctx(i, parallelism, attempt)
    }
    fn committer_ctx(&self, i: u32, parallelism: u32, attempt: u32) -> SubtaskContext {
        committer_ctx(i, parallelism, attempt)
    }
    fn batch(records: &[&str]) -> RecordBatchBuf {
        batch(records)
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

/// The contents of the visible output files, sorted.
pub fn visible_contents(dir: &Path) -> Vec<String> {
    let mut seen: Vec<String> = super::visible_files(dir)
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap())
        .collect();
    seen.sort();
    seen
}
