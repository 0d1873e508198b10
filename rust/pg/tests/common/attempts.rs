//! A superseded attempt (a zombie) and the newer attempt that replaced it,
//! on one database: each side's writers and committers with destinations
//! (sessions) of their own, as on separate TaskManagers.

use twopc_core::fencing_scenarios::{self, AttemptParts};
use twopc_core::records::RecordBatchBuf;
use twopc_core::SubtaskContext;
use twopc_pg::PgDestination;

// Re-exported for the fencing tests; other tests share this module.
#[allow(unused_imports)]
pub use twopc_core::fencing_scenarios::{
    assert_shares_left_to_attempt_2, prepared_by, zombie_told_late, Ahead,
};

use super::{batch, ctx, rows, Fixture};

pub type OneSubtask = fencing_scenarios::OneSubtask<PgDestination>;
pub type NewerAttempt = fencing_scenarios::NewerAttempt<PgDestination>;

/// Subtask `i` of `parallelism` in attempt `attempt` of run1, for its
/// writer and its committer alike.
pub fn attempt_ctx(f: &Fixture, i: u32, parallelism: u32, attempt: u32) -> SubtaskContext {
    ctx(&f.sink, "run1", i, parallelism).with_attempt(attempt, 0xfeed)
}

/// A session of its own for `ctx`.
pub fn connect(f: &Fixture, ctx: &SubtaskContext) -> PgDestination {
    PgDestination::connect(f.opts.clone(), ctx).unwrap()
}

/// The attempts' parts on one database; records are COPY text rows (see
/// [`rows`]), and the newer attempt's subtask `i` prepares row `10 + i`.
impl AttemptParts for Fixture {
    type Dest = PgDestination;
    fn destination(&self, ctx: &SubtaskContext) -> PgDestination {
        connect(self, ctx)
    }
    fn writer_ctx(&self, i: u32, parallelism: u32, attempt: u32) -> SubtaskContext {
        attempt_ctx(self, i, parallelism, attempt)
    }
    fn batch(records: &[&str]) -> RecordBatchBuf {
        batch(records)
    }
    fn newer_record(&self, i: u32) -> String {
        let id = 10 + i64::from(i);
        rows(id..id + 1, "c").remove(0)
    }
}
