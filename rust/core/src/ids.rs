//! Identifiers: what names a sink, a run, a lineage and a transaction.
//!
//! Transaction ids follow one scheme everywhere (file names, PostgreSQL gids,
//! log lines):
//!
//! ```text
//! <sink-id>.<subtask>.<attempt-nonce as 16 hex digits>.<sequence>
//! ```
//!
//! * `sink-id` is chosen by the user and must stay the same across restarts
//!   and savepoint restores of the job; it scopes everything this sink owns
//!   at the destination.
//! * `subtask` is the index of the writing subtask at the time the
//!   transaction began. After a change of parallelism it still tells which
//!   subtask owned the transaction, so lingering ones can be split among the
//!   new subtasks without overlap.
//! * `attempt-nonce` is drawn at random each time a writer starts. Checkpoint
//!   ids repeat across runs (a restore from a savepoint numbers new
//!   checkpoints from the savepoint's id again), and attempt numbers restart
//!   with every submission, so neither can make an id unique; a fresh 64-bit
//!   nonce per writer start does.
//! * `sequence` counts the transactions one writer has begun.
//!
//! The id is written into the transaction handle, and the handle into the
//! checkpoint, so every retry of a commit uses the same id.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Longest sink id accepted. Keeps transaction ids well under PostgreSQL's
/// 200-byte limit for prepared-transaction identifiers.
pub const MAX_SINK_ID_LEN: usize = 64;

/// A Flink checkpoint id. Unique within one run only, never across runs.
pub type CheckpointId = u64;

/// The user's stable name for this sink.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SinkId(String);

impl SinkId {
    /// Validates a sink id: 1 to 64 characters of `[A-Za-z0-9_-]`. The id
    /// becomes part of file names and SQL literals, so nothing else is let in.
    pub fn new(id: impl Into<String>) -> Result<Self, ConfigError> {
        let id = id.into();
        validate_token("sink id", &id, MAX_SINK_ID_LEN)?;
        Ok(SinkId(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Bypasses validation, to forge bad state in tests.
    #[cfg(test)]
    pub(crate) fn unchecked(s: &str) -> Self {
        SinkId(s.to_string())
    }
}

impl fmt::Display for SinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Identifies one run of the job (Flink's job id). A failover restart keeps
/// it; a new submission, even one restored from a savepoint, gets a new one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunId(String);

impl RunId {
    pub fn new(id: impl Into<String>) -> Result<Self, ConfigError> {
        let id = id.into();
        validate_token("run id", &id, 64)?;
        Ok(RunId(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Identifies a chain of runs connected by restores. A job started without
/// state begins a new lineage; a restore keeps the lineage of the restored
/// state. Rewind detection compares checkpoint ids only within one lineage,
/// because ids are not comparable across unrelated runs.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct LineageId(pub u64);

impl LineageId {
    /// The lineage a run begins when it starts without state. Every subtask
    /// of the run must arrive at the same value without talking to the
    /// others, so it is derived from the run id (FNV-1a), not drawn at random;
    /// a failover restart keeps the job id and therefore the lineage.
    pub fn of_fresh_run(run: &RunId) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in run.as_str().bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        LineageId(h)
    }

    /// A lineage as it is written in names and records: exactly its
    /// `Display`, 16 lower-case hexadecimal digits. `None` otherwise.
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let l = LineageId(u64::from_str_radix(text, 16).ok()?);
        (l.to_string() == text).then_some(l)
    }
}

impl fmt::Display for LineageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The identifier of one transaction; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TransactionId(String);

impl TransactionId {
    pub fn compose(sink: &SinkId, subtask: u32, attempt_nonce: u64, sequence: u64) -> Self {
        TransactionId(format!("{sink}.{subtask}.{attempt_nonce:016x}.{sequence}"))
    }

    /// Parses an id found at a destination (a directory name, a gid). Returns
    /// `None` for anything this scheme did not produce.
    pub fn parse(s: &str) -> Option<ParsedTransactionId> {
        let mut parts = s.rsplitn(4, '.');
        let sequence = parts.next()?.parse::<u64>().ok()?;
        let nonce_hex = parts.next()?;
        if nonce_hex.len() != 16 {
            return None;
        }
        let attempt_nonce = u64::from_str_radix(nonce_hex, 16).ok()?;
        let subtask = parts.next()?.parse::<u32>().ok()?;
        let sink = SinkId::new(parts.next()?).ok()?;
        let id = TransactionId::compose(&sink, subtask, attempt_nonce, sequence);
        // Reject non-canonical spellings ("+1", leading zeros) so one
        // transaction has exactly one id.
        if id.0 != s {
            return None;
        }
        Some(ParsedTransactionId {
            id,
            sink,
            subtask,
            attempt_nonce,
            sequence,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Bypasses validation, to forge bad state in tests.
    #[cfg(test)]
    pub(crate) fn unchecked(s: &str) -> Self {
        TransactionId(s.to_string())
    }
}

impl fmt::Display for TransactionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The parts of a transaction id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedTransactionId {
    pub id: TransactionId,
    pub sink: SinkId,
    pub subtask: u32,
    pub attempt_nonce: u64,
    pub sequence: u64,
}

/// Checks a configuration-derived name that ends up in paths or SQL: ASCII
/// letters, digits, `_` and `-` only, not empty, bounded length. This rules
/// out separators, `..`, hidden-file prefixes and quoting tricks at once.
pub fn validate_token(what: &'static str, value: &str, max_len: usize) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() > max_len {
        return Err(ConfigError::new(format!(
            "{what} {value:?} must be 1 to {max_len} characters long"
        )));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(ConfigError::new(format!(
            "{what} {value:?} contains {bad:?}; use only letters, digits, '_' and '-'"
        )));
    }
    if value.starts_with('-') || value.starts_with('_') {
        return Err(ConfigError::new(format!(
            "{what} {value:?} must start with a letter or digit"
        )));
    }
    Ok(())
}

/// A random 64-bit value for attempt nonces and lineage ids, drawn from the
/// standard library's per-process random hash keys mixed with the clock and
/// the process id. It needs to be unique, not secret.
pub fn random_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_id_round_trips() {
        let sink = SinkId::new("orders-sink_1").unwrap();
        let id = TransactionId::compose(&sink, 3, 0xabc, 17);
        assert_eq!(id.as_str(), "orders-sink_1.3.0000000000000abc.17");
        let parsed = TransactionId::parse(id.as_str()).unwrap();
        assert_eq!(parsed.sink, sink);
        assert_eq!(parsed.subtask, 3);
        assert_eq!(parsed.attempt_nonce, 0xabc);
        assert_eq!(parsed.sequence, 17);
    }

    #[test]
    fn foreign_names_do_not_parse() {
        for s in [
            "",
            "x",
            "sink.1.abc.2",
            "sink.01.0000000000000abc.2",
            "sink.1.0000000000000abc.+2",
            "../x.1.0000000000000abc.2",
            "a.b.1.0000000000000abc.2",
        ] {
            assert!(TransactionId::parse(s).is_none(), "{s:?} parsed");
        }
    }

    #[test]
    fn tokens_reject_traversal_and_separators() {
        for bad in [
            "", "..", "a/b", "a\\b", ".hidden", "_x", "-x", "a b", "é", "a'b",
        ] {
            assert!(SinkId::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(SinkId::new("a".repeat(65)).is_err());
        assert!(SinkId::new("a".repeat(64)).is_ok());
    }

    #[test]
    fn random_values_differ() {
        let a = random_u64();
        let b = random_u64();
        assert_ne!(a, b);
    }
}
