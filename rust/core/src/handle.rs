//! The transaction handle: everything needed to commit or abort one
//! transaction after a restart, and therefore what goes into Flink's
//! checkpoint state. It is encoded as a bincode body inside the versioned
//! envelope of [`crate::envelope`].

use serde::{Deserialize, Serialize};

use crate::envelope::{self, PayloadKind};
use crate::ids::{CheckpointId, LineageId, RunId, SinkId, TransactionId};

/// One transaction of one subtask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransactionHandle {
    pub sink: SinkId,
    pub transaction: TransactionId,
    pub lineage: LineageId,
    /// The run (Flink job id) that began the transaction.
    pub run: RunId,
    /// Subtask index that began it, and the parallelism at that time.
    pub subtask: u32,
    pub parallelism: u32,
    /// Wall-clock milliseconds since the Unix epoch.
    pub begun_at_ms: u64,
    pub state: TransactionState,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransactionState {
    /// Receiving records; not part of any checkpoint yet.
    Open,
    /// Durable and invisible, waiting for its checkpoint to complete.
    Prepared(PreparedInfo),
    /// As `Prepared`, plus where the destination staged it, in the
    /// destination's own versioned encoding (e.g. an object store's bucket,
    /// key, multipart upload id and part ids: what a commit after a restart
    /// needs and cannot find by name). Destinations that find their staged
    /// data by transaction id leave it out and use `Prepared`. Appended
    /// last: bincode encodes the variant index, so handles written before
    /// this variant existed decode unchanged.
    PreparedAt {
        info: PreparedInfo,
        location: Vec<u8>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedInfo {
    /// The checkpoint whose completion commits this transaction.
    pub checkpoint: CheckpointId,
    pub records: u64,
    pub bytes: u64,
    pub prepared_at_ms: u64,
}

/// The fields of a handle as tools show them: serialised (e.g. to JSON by
/// the JNI bridge's `describeHandle`), with field names shared with the
/// golden vectors in `tests/vectors/*.json`. Open handles have no prepared
/// fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HandleDescription {
    pub sink: String,
    pub transaction: String,
    /// 16 hex digits.
    pub lineage: String,
    pub run: String,
    pub subtask: u32,
    pub parallelism: u32,
    pub begun_at_ms: u64,
    /// "open" or "prepared".
    pub state: &'static str,
    pub checkpoint: Option<CheckpointId>,
    pub records: Option<u64>,
    pub bytes: Option<u64>,
    pub prepared_at_ms: Option<u64>,
}

/// Why bytes could not be read as a handle.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    #[error("{len} bytes is too short for a twopc envelope (at least {needed} needed)")]
    Truncated { len: usize, needed: usize },
    #[error("not twopc data: magic bytes are {found:02x?}, expected \"TWPC\"")]
    BadMagic { found: [u8; 4] },
    #[error("format version {found} is newer than this twopc release reads (up to {supported}); upgrade twopc to restore this state")]
    UnsupportedVersion { found: u16, supported: u16 },
    #[error("payload kind {found} where kind {expected} was expected")]
    WrongKind { found: u8, expected: u8 },
    #[error("declared body length {declared} exceeds the limit")]
    TooLarge { declared: usize },
    #[error("declared body length {declared} but {actual} bytes present (truncated or padded)")]
    LengthMismatch { declared: usize, actual: usize },
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x}): the bytes were corrupted")]
    Checksum { stored: u32, computed: u32 },
    #[error("body does not decode: {0}")]
    Body(String),
    #[error("decoded handle is inconsistent: {0}")]
    Invalid(String),
}

fn bincode_config() -> impl bincode::config::Config {
    // The limit stops a forged length prefix from asking for a huge
    // allocation before the decoder notices the bytes are not there.
    bincode::config::standard().with_limit::<{ envelope::MAX_BODY_LEN }>()
}

/// Encodes any serde value as an envelope body of `kind`.
pub fn encode_payload<T: Serialize>(kind: PayloadKind, value: &T) -> Vec<u8> {
    let body = bincode::serde::encode_to_vec(value, bincode_config())
        .expect("encoding plain data structs into a Vec cannot fail");
    envelope::seal(kind, &body)
}

/// Decodes an envelope of `kind`, requiring the whole body to be consumed.
pub fn decode_payload<T: serde::de::DeserializeOwned>(
    kind: PayloadKind,
    bytes: &[u8],
) -> Result<T, HandleError> {
    let body = envelope::open(kind, bytes)?;
    let (value, used) = bincode::serde::decode_from_slice(body, bincode_config())
        .map_err(|e| HandleError::Body(e.to_string()))?;
    if used != body.len() {
        return Err(HandleError::Body(format!(
            "{} trailing bytes after the handle",
            body.len() - used
        )));
    }
    Ok(value)
}

impl TransactionHandle {
    pub fn encode(&self) -> Vec<u8> {
        encode_payload(PayloadKind::TransactionHandle, self)
    }

    /// Checks that a handle read back from a control record filed under
    /// `sink` and `txn` (a prepare marker, a commit record) is that
    /// transaction's: a record copied or forged into another place must not
    /// make the sink act on another transaction. The error says what it
    /// holds instead.
    pub fn check_filed_under(&self, sink: &SinkId, txn: &TransactionId) -> Result<(), String> {
        if &self.sink != sink {
            return Err(format!(
                "it belongs to sink '{}', not to sink '{sink}'",
                self.sink
            ));
        }
        if &self.transaction != txn {
            return Err(format!(
                "it describes transaction {}, but is filed under {txn}",
                self.transaction
            ));
        }
        Ok(())
    }

    /// Decodes and validates a handle. Any input, however damaged, yields a
    /// typed error rather than a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, HandleError> {
        let handle: TransactionHandle = decode_payload(PayloadKind::TransactionHandle, bytes)?;
        handle.validate()?;
        Ok(handle)
    }

    /// Serde bypasses constructors, so the invariants the constructors
    /// enforce are checked again here: a forged handle must not smuggle a
    /// path or a quote into a file name or SQL literal. Decoders of
    /// anything that embeds a handle (a destination's control files) call
    /// it too.
    pub fn validate(&self) -> Result<(), HandleError> {
        SinkId::new(self.sink.as_str()).map_err(|e| HandleError::Invalid(e.to_string()))?;
        RunId::new(self.run.as_str()).map_err(|e| HandleError::Invalid(e.to_string()))?;
        let parsed = TransactionId::parse(self.transaction.as_str()).ok_or_else(|| {
            HandleError::Invalid(format!(
                "transaction id {:?} is not of the form <sink>.<subtask>.<nonce>.<sequence>",
                self.transaction.as_str()
            ))
        })?;
        if parsed.sink != self.sink || parsed.subtask != self.subtask {
            return Err(HandleError::Invalid(format!(
                "transaction id {} does not match sink '{}' subtask {}",
                self.transaction, self.sink, self.subtask
            )));
        }
        if self.parallelism == 0 || self.subtask >= self.parallelism {
            return Err(HandleError::Invalid(format!(
                "subtask {} is outside parallelism {}",
                self.subtask, self.parallelism
            )));
        }
        Ok(())
    }

    /// The prepared facts, whether the destination recorded a location or
    /// not.
    pub fn prepared(&self) -> Option<&PreparedInfo> {
        match &self.state {
            TransactionState::Prepared(p) => Some(p),
            TransactionState::PreparedAt { info, .. } => Some(info),
            TransactionState::Open => None,
        }
    }

    /// Where the destination staged the prepared transaction, when it said
    /// (see [`TransactionState::PreparedAt`]); its bytes are the
    /// destination's to decode and check.
    pub fn location(&self) -> Option<&[u8]> {
        match &self.state {
            TransactionState::PreparedAt { location, .. } => Some(location),
            _ => None,
        }
    }

    pub fn describe(&self) -> HandleDescription {
        let p = self.prepared();
        HandleDescription {
            sink: self.sink.to_string(),
            transaction: self.transaction.to_string(),
            lineage: self.lineage.to_string(),
            run: self.run.to_string(),
            subtask: self.subtask,
            parallelism: self.parallelism,
            begun_at_ms: self.begun_at_ms,
            state: if p.is_some() { "prepared" } else { "open" },
            checkpoint: p.map(|p| p.checkpoint),
            records: p.map(|p| p.records),
            bytes: p.map(|p| p.bytes),
            prepared_at_ms: p.map(|p| p.prepared_at_ms),
        }
    }

    pub fn checkpoint(&self) -> Option<CheckpointId> {
        self.prepared().map(|p| p.checkpoint)
    }

    /// The attempt nonce embedded in the id.
    pub fn attempt_nonce(&self) -> u64 {
        TransactionId::parse(self.transaction.as_str())
            .map(|p| p.attempt_nonce)
            .unwrap_or_default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn sample(prepared: bool) -> TransactionHandle {
        let sink = SinkId::new("orders").unwrap();
        TransactionHandle {
            transaction: TransactionId::compose(&sink, 1, 0x0123_4567_89ab_cdef, 42),
            sink,
            lineage: LineageId(0xfeed_beef_0000_0001),
            run: RunId::new("a1b2c3d4e5f60718293a4b5c6d7e8f90").unwrap(),
            subtask: 1,
            parallelism: 4,
            begun_at_ms: 1_790_000_000_000,
            state: if prepared {
                TransactionState::Prepared(PreparedInfo {
                    checkpoint: 7,
                    records: 1000,
                    bytes: 12_345,
                    prepared_at_ms: 1_790_000_001_000,
                })
            } else {
                TransactionState::Open
            },
        }
    }

    #[test]
    fn a_handle_filed_under_another_sink_or_transaction_is_refused() {
        let h = sample(true);
        assert!(h.check_filed_under(&h.sink, &h.transaction).is_ok());
        let other_sink = SinkId::new("payments").unwrap();
        let err = h
            .check_filed_under(&other_sink, &h.transaction)
            .unwrap_err();
        assert!(
            err.contains("sink 'orders', not to sink 'payments'"),
            "{err}"
        );
        let other_txn = TransactionId::compose(&h.sink, 1, 0x0123_4567_89ab_cdef, 43);
        let err = h.check_filed_under(&h.sink, &other_txn).unwrap_err();
        assert!(
            err.contains(&format!(
                "describes transaction {}, but is filed under {other_txn}",
                h.transaction
            )),
            "{err}"
        );
    }

    #[test]
    fn round_trip() {
        for p in [false, true] {
            let h = sample(p);
            assert_eq!(TransactionHandle::decode(&h.encode()).unwrap(), h);
        }
    }

    #[test]
    fn a_located_handle_round_trips_and_reads_as_prepared() {
        let plain = sample(true);
        let info = plain.prepared().unwrap().clone();
        let located = TransactionHandle {
            state: TransactionState::PreparedAt {
                info: info.clone(),
                location: b"somewhere".to_vec(),
            },
            ..plain.clone()
        };
        let back = TransactionHandle::decode(&located.encode()).unwrap();
        assert_eq!(back, located);
        assert_eq!(back.prepared(), Some(&info));
        assert_eq!(back.checkpoint(), Some(7));
        assert_eq!(back.location(), Some(&b"somewhere"[..]));
        assert_eq!(back.describe(), plain.describe());
        // The variants written before it keep their encoding.
        assert_eq!(plain.location(), None);
        assert_ne!(plain.encode(), located.encode());
    }

    #[test]
    fn forged_fields_are_rejected() {
        let mut h = sample(true);
        h.sink = SinkId::unchecked("../../etc");
        assert!(matches!(
            TransactionHandle::decode(&h.encode()),
            Err(HandleError::Invalid(_))
        ));
        let mut h = sample(true);
        h.transaction = TransactionId::unchecked("orders.1.x'; DROP TABLE t; --.1");
        assert!(matches!(
            TransactionHandle::decode(&h.encode()),
            Err(HandleError::Invalid(_))
        ));
        let mut h = sample(true);
        h.subtask = 9;
        assert!(TransactionHandle::decode(&h.encode()).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        let good = sample(true).encode();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut b = good.clone();
            let i = (seed as usize) % b.len();
            b[i] = (seed >> 32) as u8;
            let cut = ((seed >> 16) as usize) % (b.len() + 1);
            let _ = TransactionHandle::decode(&b[..cut]);
            // A body that passes the checksum but is nonsense must fail cleanly too.
            let body: Vec<u8> = (0..(seed % 64)).map(|k| (seed >> (k % 56)) as u8).collect();
            let _ =
                TransactionHandle::decode(&envelope::seal(PayloadKind::TransactionHandle, &body));
        }
    }
}
