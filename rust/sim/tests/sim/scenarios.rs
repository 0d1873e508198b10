//! Hand-written regression scenarios. Each reproduces, as a fixed script,
//! the sequence behind seeds that once failed (see `rust/sim/TRIAGE.md`),
//! so that it stays tested when the generator changes what a seed draws.
//! Events are keyed by run and attempt numbers and protocol events (see
//! [`Script`]); a scenario with a [`Mutant`] breaks the product on purpose
//! and must be reported, which shows the oracle was not weakened.

use twopc_core::memory::{Fault, Operation};
use twopc_core::{FreshStartPolicy, RewindPolicy};

use super::checkpoints::Redistribution;
use super::schedule::{
    CommitRetry, CrashPoint, Mutant, Pick, Schedule, Script, Takeover, Topology,
};

/// What the run of a scenario must give.
#[derive(Clone, Copy, Debug)]
pub enum Verdict {
    Pass,
    /// A violation whose message contains this text.
    Violation(&'static str),
}

pub struct Scenario {
    pub name: &'static str,
    /// The seeds (of the generator at commit cd76071) with this root cause.
    pub seeds: &'static [u64],
    pub schedule: Schedule,
    pub verdict: Verdict,
}

const RUN1: u32 = 1;
const RUN2: u32 = 2;

/// Run 1 (parallelism 2) prepares checkpoint 1 (records 0..10) on both
/// subtasks, completes it and crashes before any commit; the operator
/// restarts without state (run 2), which meets two prepared transactions
/// of a completed checkpoint and must refuse.
fn prepared_leftovers(more: Script) -> Schedule {
    let mut script = more;
    script
        .crashes
        .push((RUN1, 1, CrashPoint::AfterCompleteBeforeNotify));
    script.takeovers.push((RUN1, 1, Takeover::stateless(2)));
    Schedule::scripted(40, 2, 10, false, script)
}

/// Run 1 (parallelism 2) commits checkpoints 1 (offset 0), 2 and 3; the
/// operator stops it and restores checkpoint 1 under the FAIL rewind policy
/// at parallelism 3 (run 2), which must stop with REWIND.
fn committed_after_savepoint(more: Script) -> Schedule {
    let mut script = more;
    script.stops.push((
        RUN1,
        3,
        Takeover::restore(Pick::Oldest, RewindPolicy::Fail, 3),
    ));
    Schedule::scripted(40, 2, 10, true, script)
}

/// Sink V2 with a committer that defers unknown commits (`retryLater`).
const V2_RETRY_LATER: Topology = Topology::SinkV2 {
    retry: CommitRetry::RetryLater,
    committer_redistribution: Redistribution::Contiguous,
};

/// Sink V2 with our committer, which retries unknown commits in place.
const V2_IN_PLACE: Topology = Topology::SinkV2 {
    retry: CommitRetry::InPlace,
    committer_redistribution: Redistribution::Contiguous,
};

/// The `n`-th commit call of that attempt fails so.
fn commit_fails(run: u32, attempt: u32, n: u32, fault: Fault) -> (u32, u32, Operation, u32, Fault) {
    (run, attempt, Operation::Commit, n, fault)
}

/// Run 1 (parallelism 2) commits checkpoints 1 (offset 0) and 2; the
/// operator stops it and restarts without state from the visible prefix,
/// forgetting that run 1's output exists (fresh start FAIL, run 2): the
/// start must refuse with EXISTING_OUTPUT.
fn start_over_earlier_output(more: Script) -> Schedule {
    let mut script = more;
    script.stops.push((
        RUN1,
        2,
        Takeover::stateless_under(2, FreshStartPolicy::Fail),
    ));
    Schedule::scripted(40, 2, 10, true, script)
}

/// The first scan of run 2's attempt `attempt` fails so.
fn scan_fails(attempt: u32, fault: Fault) -> (u32, u32, Operation, u32, Fault) {
    (RUN2, attempt, Operation::Scan, 1, fault)
}

pub fn all() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "fresh-start listing fails; the operator takes over before it is repeated",
            seeds: &[65997, 1112645],
            schedule: prepared_leftovers(Script {
                faults: vec![scan_fails(1, Fault::FailBefore)],
                takeovers: vec![(
                    RUN2,
                    1,
                    Takeover::restore(Pick::Latest, RewindPolicy::Fail, 2),
                )],
                ..Script::default()
            }),
            verdict: Verdict::Pass,
        },
        Scenario {
            name: "fresh-start listing fails twice (response lost, then refused); the operator \
                   takes over",
            seeds: &[1287467],
            schedule: prepared_leftovers(Script {
                faults: vec![
                    scan_fails(1, Fault::FailAfter),
                    scan_fails(2, Fault::FailBefore),
                ],
                takeovers: vec![(
                    RUN2,
                    2,
                    Takeover::restore(Pick::Latest, RewindPolicy::Fail, 2),
                )],
                ..Script::default()
            }),
            verdict: Verdict::Pass,
        },
        Scenario {
            name: "fresh-start listing fails; the failover repeats the check, which refuses",
            seeds: &[],
            schedule: prepared_leftovers(Script {
                faults: vec![scan_fails(1, Fault::FailBefore)],
                ..Script::default()
            }),
            verdict: Verdict::Pass,
        },
        Scenario {
            name: "MUTANT: a fresh start that skips the check after a transient listing error",
            seeds: &[],
            schedule: prepared_leftovers(Script {
                faults: vec![scan_fails(1, Fault::FailBefore)],
                mutant: Some(Mutant::SkipCheckAfterTransientError),
                ..Script::default()
            }),
            verdict: Verdict::Violation("got past the start-up check"),
        },
        Scenario {
            name: "rewind commit-record read fails; the operator takes over before it is repeated",
            seeds: &[975606, 1254192, 1512710],
            schedule: committed_after_savepoint(Script {
                faults: vec![scan_fails(1, Fault::FailBefore)],
                takeovers: vec![(
                    RUN2,
                    1,
                    Takeover::restore(Pick::Latest, RewindPolicy::Fail, 2),
                )],
                ..Script::default()
            }),
            verdict: Verdict::Pass,
        },
        Scenario {
            name: "rewind commit-record read fails; the failover repeats the check: REWIND",
            seeds: &[],
            schedule: committed_after_savepoint(Script {
                faults: vec![scan_fails(1, Fault::FailAfter)],
                ..Script::default()
            }),
            verdict: Verdict::Pass,
        },
        Scenario {
            name: "MUTANT: a restore that skips the rewind check after a transient read error",
            seeds: &[],
            schedule: committed_after_savepoint(Script {
                faults: vec![scan_fails(1, Fault::FailBefore)],
                mutant: Some(Mutant::SkipCheckAfterTransientError),
                ..Script::default()
            }),
            verdict: Verdict::Violation("got past the start-up check"),
        },
        Scenario {
            name: "a prepared leftover times out while the job is down; the repeated check names \
                   the one left",
            seeds: &[987795],
            schedule: prepared_leftovers(Script {
                faults: vec![scan_fails(1, Fault::FailBefore)],
                expiries: vec![(RUN2, 1)],
                ..Script::default()
            }),
            verdict: Verdict::Pass,
        },
        Scenario {
            name: "MUTANT: a failed fresh-start check that removes a prepared transaction",
            seeds: &[],
            schedule: prepared_leftovers(Script {
                faults: vec![scan_fails(1, Fault::FailBefore)],
                mutant: Some(Mutant::AbortPreparedOnScanError),
                ..Script::default()
            }),
            verdict: Verdict::Violation("removed prepared transactions"),
        },
        Scenario {
            name: "the only prepared leftover times out while the job is down; the repeated \
                   check lets the start proceed",
            seeds: &[1515702],
            // Run 1 prepares checkpoint 1 and crashes before it completes;
            // the operator restarts without state.
            schedule: Schedule::scripted(
                30,
                1,
                10,
                false,
                Script {
                    crashes: vec![(RUN1, 1, CrashPoint::AfterPrepare)],
                    takeovers: vec![(RUN1, 1, Takeover::stateless(1))],
                    faults: vec![scan_fails(1, Fault::FailBefore)],
                    expiries: vec![(RUN2, 1)],
                    ..Script::default()
                },
            ),
            verdict: Verdict::Pass,
        },
        Scenario {
            name: "Sink V2, retryLater: after a rescale 3 -> 2 each committer holds a restored \
                   committable the other owns; their recovery commits are deferred; the first \
                   checkpoint after the restore completes and the owners clean up",
            seeds: &[],
            // Run 1 (3 writers) completes checkpoint 1 (records 0..12) and
            // crashes before any commit; the operator restores it at
            // parallelism 2. Committer states split contiguously: committer
            // 0 gets those of writers 0 and 1, committer 1 that of writer 2;
            // writer 1's transaction is owned by committer 1, writer 2's by
            // committer 0. Every recovery commit's first attempt fails
            // before its effect, so a committer that defers it still holds
            // it when the other one runs its lingering cleanup.
            schedule: Schedule::scripted(
                48,
                3,
                12,
                false,
                Script {
                    crashes: vec![(RUN1, 1, CrashPoint::AfterCompleteBeforeNotify)],
                    takeovers: vec![(
                        RUN1,
                        1,
                        Takeover::restore(Pick::Latest, RewindPolicy::Fail, 2),
                    )],
                    faults: (1..=3)
                        .map(|n| commit_fails(RUN2, 1, n, Fault::FailBefore))
                        .collect(),
                    ..Script::default()
                },
            )
            .in_topology(V2_RETRY_LATER),
            verdict: Verdict::Pass,
        },
        Scenario {
            name: "Sink V2, retryLater: a commit whose response was lost is deferred, the \
                   committer dies in its housekeeping, and the failover restores the deferred \
                   committable",
            seeds: &[],
            // Checkpoint 1 completes; the first commit call lands but its
            // answer is lost, so the committer defers it; it dies in the
            // housekeeping after that call. The failover restores
            // checkpoint 1: the deferred committable is committed again
            // (already committed), the other for the first time.
            schedule: Schedule::scripted(
                40,
                2,
                10,
                false,
                Script {
                    crashes: vec![(RUN1, 1, CrashPoint::DuringHousekeeping)],
                    faults: vec![commit_fails(RUN1, 1, 1, Fault::FailAfter)],
                    ..Script::default()
                },
            )
            .in_topology(V2_RETRY_LATER),
            verdict: Verdict::Pass,
        },
        Scenario {
            name: "fresh start over earlier output: the check's scan fails; the operator takes \
                   over before it is repeated",
            seeds: &[265991],
            schedule: start_over_earlier_output(Script {
                faults: vec![scan_fails(1, Fault::FailBefore)],
                takeovers: vec![(
                    RUN2,
                    1,
                    Takeover::restore(Pick::Latest, RewindPolicy::Fail, 2),
                )],
                ..Script::default()
            }),
            verdict: Verdict::Pass,
        },
        Scenario {
            name: "MUTANT: a fresh start over earlier output that skips the check after a \
                   transient scan error",
            seeds: &[],
            schedule: start_over_earlier_output(Script {
                faults: vec![scan_fails(1, Fault::FailBefore)],
                mutant: Some(Mutant::SkipCheckAfterTransientError),
                ..Script::default()
            }),
            verdict: Verdict::Violation("got past the start-up check"),
        },
        Scenario {
            name: "Sink V2: a restore that must stop with REWIND; a committer's recovery commit \
                   stays unresolved and stops the job first",
            seeds: &[311553, 414687, 649425, 745411],
            // Run 1 (parallelism 2) commits checkpoints 1 (records 0..10),
            // 2 and 3; the operator restores checkpoint 1 under FAIL at the
            // same parallelism: REWIND is due. The committers commit
            // checkpoint 1's committables again meanwhile, and the first
            // three commit calls fail before their effect: the committer
            // that makes them gives up (COMMIT_UNRESOLVED) before the
            // writers' check has refused.
            schedule: Schedule::scripted(
                40,
                2,
                10,
                false,
                Script {
                    stops: vec![(
                        RUN1,
                        3,
                        Takeover::restore(Pick::Oldest, RewindPolicy::Fail, 2),
                    )],
                    faults: (1..=3)
                        .map(|n| commit_fails(RUN2, 1, n, Fault::FailBefore))
                        .collect(),
                    ..Script::default()
                },
            )
            .in_topology(V2_IN_PLACE),
            verdict: Verdict::Pass,
        },
    ]
}
