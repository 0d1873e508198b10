//! twopc-core: the two-phase commit protocol of the twopc Flink sink.
//!
//! The protocol is a set of deterministic state machines ([`writer`],
//! [`committer`], [`recovery`]) over a [`destination::Destination`] trait
//! that does the I/O. Nothing here knows about the JVM; the JNI bridge and
//! the simulation drive [`sink::SubtaskSink`] the same way.
#![forbid(unsafe_code)]

pub mod clock;
pub mod committer;
pub mod committer_session;
pub mod config;
pub mod destination;
pub mod envelope;
pub mod error;
#[cfg(feature = "testing")]
pub mod fencing_scenarios;
pub mod handle;
pub mod history;
pub mod ids;
pub mod interrupt;
#[cfg(feature = "testing")]
pub mod memory;
pub mod operator;
pub mod part_names;
pub mod records;
pub mod recovery;
pub mod sink;
pub mod state;
pub mod timefmt;
pub mod writer;
pub mod writer_session;

pub use clock::{Clock, SystemClock};
pub use committer::{AbortOutcome, CommitOutcome, CommitStep};
pub use committer_session::{CommitterSession, Housekeeping};
pub use config::{FreshStartPolicy, RetryPolicy, RewindPolicy, SinkOptions, SubtaskContext};
pub use destination::Destination;
pub use error::{ConfigError, TwopcError};
pub use handle::{TransactionHandle, TransactionState};
pub use ids::{CheckpointId, LineageId, RunId, SinkId, TransactionId};
pub use recovery::{Restore, StartupReport};
pub use sink::SubtaskSink;
pub use state::WriterState;
pub use writer_session::WriterSession;
