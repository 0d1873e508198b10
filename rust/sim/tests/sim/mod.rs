//! A deterministic crash simulation of a Flink job driving the real twopc
//! core. `simulation.rs` is the entry point; each module holds one concept.

/// Writes a trace line, formatting it only when tracing is on. Defined
/// before the modules so that all of them can use it.
macro_rules! trace {
    ($trace:expr, $($arg:tt)*) => {
        if $trace.on() {
            $trace.line(format!($($arg)*));
        }
    };
}

pub mod backend;
pub mod checkpoints;
pub mod clock;
pub mod coverage;
pub mod faults;
pub mod invariants;
pub mod job;
pub mod mortal;
pub mod rng;
pub mod scenarios;
pub mod schedule;
pub mod source;
pub mod trace;
