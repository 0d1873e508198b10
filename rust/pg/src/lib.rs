//! twopc-pg: the PostgreSQL destination of the twopc sink.
//!
//! Two modes, chosen per table ([`PgMode`]):
//!
//! * **Transactional** (default): each subtask writes each checkpoint's
//!   records with `COPY` into one open transaction, prepares it with
//!   `PREPARE TRANSACTION` when the checkpoint is taken and commits it with
//!   `COMMIT PREPARED` when the checkpoint completes. Output appears at
//!   checkpoint boundaries, exactly once. Needs `max_prepared_transactions`
//!   of at least the sink's parallelism. See [`destination`] for how
//!   "already committed" is told from "lost", and how the prepared handle
//!   is kept for recovery.
//! * **Idempotent**: keyed upserts, visible batch by batch; a replay
//!   rewrites the same rows. See [`idempotent`] for the trade-off.
//!
//! [`PgDestination::connect`] checks the server and the table before the
//! first record (prepared transactions enabled, table and columns as
//! configured, rights), so misconfiguration stops the job at start-up with
//! a message that says what to change. Passwords never appear in messages,
//! logs or `Debug` output.
//!
//! The client is the synchronous `postgres` crate; no async runtime shows in
//! this API.
#![forbid(unsafe_code)]

mod column_types;
mod conninfo;
mod copy_stream;
pub mod destination;
mod error;
pub mod idempotent;
mod link;
pub mod options;
mod rows;
pub mod schema;
pub mod sql;

pub use conninfo::redact as redact_url;
pub use destination::{PgDestination, SinkRecord};
pub use options::{CopyFormat, Endpoint, Password, PgMode, PgOptions};
