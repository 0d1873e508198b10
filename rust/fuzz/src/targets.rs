//! The decoders under test, one [`Codec`] each, and the table that lists
//! them.
//!
//! Adding a decoder is a generator of valid values (in `gen.rs`) and one
//! entry in [`TARGETS`]; the runner, the properties and the replay work for
//! it unchanged.

use twopc_core::envelope::{self, PayloadKind};
use twopc_core::handle::{encode_payload, HandleError, TransactionHandle};
use twopc_core::ids::{CheckpointId, LineageId, ParsedTransactionId, TransactionId};
use twopc_core::records::{BatchParts, RecordBatch, RecordBatchBuf};
use twopc_core::state::WriterState;
use twopc_fs::{commit_record_name, decode_control_file, parse_commit_record_name, ControlFile};

use crate::gen;
use crate::mutate::{mutate, Framing, Mutated};
use crate::rng::Rng;

/// How far an input got. Counted per target, so a generator that stops
/// reaching the decoder behind the framing shows (and fails the run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Refused by the framing: envelope header, length or checksum; bytes
    /// that are not UTF-8 where a name is expected.
    Framing,
    /// Past the framing, refused by the decoder proper (bincode, a parser).
    Decode,
    /// Decoded, refused by the validation after decoding.
    Validate,
    Accepted,
}

impl Stage {
    pub const ALL: [Stage; 4] = [
        Stage::Framing,
        Stage::Decode,
        Stage::Validate,
        Stage::Accepted,
    ];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Where an envelope decoder's error was raised.
pub fn stage_of(e: &HandleError) -> Stage {
    match e {
        HandleError::Body(_) => Stage::Decode,
        HandleError::Invalid(_) => Stage::Validate,
        _ => Stage::Framing,
    }
}

/// One fuzz target, type-erased for the table.
pub trait Target: Sync {
    fn name(&self) -> &'static str;
    /// The input of `seed`: deterministic, no decoding involved.
    fn generate(&self, seed: u64) -> Mutated;
    /// Decodes `bytes` and checks the properties; panics on a violation.
    /// `valid` says the bytes are an untouched valid encoding.
    fn check(&self, bytes: &[u8], valid: bool) -> Stage;
    /// Stages a long run must reach at least once each.
    fn must_reach(&self) -> &'static [Stage];
    fn framing(&self) -> Framing;
}

/// A decoder with its encoder and a generator of valid values.
///
/// Properties checked on every input:
/// * the decoder returns (a panic is caught and reported as a failure);
/// * an untouched valid encoding decodes, to a value that re-encodes to
///   the same bytes;
/// * whatever decodes re-encodes to bytes that decode to an equal value;
/// * with `canonical`, whatever decodes IS the encoding of its value (one
///   value, one spelling: names used as keys at a destination need this).
pub struct Codec<T: 'static> {
    pub name: &'static str,
    pub framing: Framing,
    pub valid: fn(&mut Rng) -> T,
    pub encode: fn(&T) -> Vec<u8>,
    pub decode: fn(&[u8]) -> Result<T, Stage>,
    pub canonical: bool,
    pub must_reach: &'static [Stage],
}

impl<T: PartialEq + std::fmt::Debug + 'static> Target for Codec<T> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn generate(&self, seed: u64) -> Mutated {
        let mut rng = Rng::for_input(self.name, seed);
        let value = (self.valid)(&mut rng);
        let encoded = (self.encode)(&value);
        let donor = |r: &mut Rng| (self.encode)(&(self.valid)(r));
        mutate(&mut rng, self.framing, encoded, &donor)
    }

    fn check(&self, bytes: &[u8], valid: bool) -> Stage {
        let value = match (self.decode)(bytes) {
            Ok(v) => v,
            Err(stage) => {
                assert!(
                    !valid,
                    "{}: a valid encoding was rejected ({stage:?})",
                    self.name
                );
                assert_ne!(stage, Stage::Accepted, "decoders report a rejecting stage");
                return stage;
            }
        };
        let again = (self.encode)(&value);
        if valid || self.canonical {
            assert!(
                again == bytes,
                "{}: accepted bytes are not the encoding of their value {value:?}; it encodes as {}",
                self.name,
                crate::report::hex(&again)
            );
        }
        match (self.decode)(&again) {
            Ok(v) => assert!(
                v == value,
                "{}: the re-encoding decodes to another value: {value:?} became {v:?}",
                self.name
            ),
            Err(stage) => panic!(
                "{}: the re-encoding of an accepted value {value:?} is rejected ({stage:?})",
                self.name
            ),
        }
        Stage::Accepted
    }

    fn must_reach(&self) -> &'static [Stage] {
        self.must_reach
    }

    fn framing(&self) -> Framing {
        self.framing
    }
}

/// Every decoder that reads checkpoint state or destination files.
pub static TARGETS: &[&dyn Target] = &[
    &Codec {
        name: "envelope",
        framing: Framing::Envelope,
        valid: gen::envelope,
        encode: |(kind, body)| envelope::seal(*kind, body),
        decode: decode_envelope,
        // The reserved byte is not checked (a later format may use it), so
        // one body has several accepted framings.
        canonical: false,
        must_reach: &[Stage::Framing, Stage::Accepted],
    },
    &Codec {
        name: "handle",
        framing: Framing::Envelope,
        valid: gen::handle,
        encode: TransactionHandle::encode,
        decode: |b| TransactionHandle::decode(b).map_err(|e| stage_of(&e)),
        // bincode reads integers in longer forms than it writes them.
        canonical: false,
        must_reach: &Stage::ALL,
    },
    &Codec {
        name: "prepare-marker",
        framing: Framing::Envelope,
        valid: gen::prepare_marker,
        encode: encode_control_file,
        decode: decode_control,
        canonical: false,
        must_reach: &Stage::ALL,
    },
    &Codec {
        name: "commit-record",
        framing: Framing::Envelope,
        valid: gen::commit_record,
        encode: encode_control_file,
        decode: decode_control,
        canonical: false,
        must_reach: &Stage::ALL,
    },
    &Codec {
        name: "history-segment",
        framing: Framing::Envelope,
        valid: gen::history_segment,
        encode: encode_control_file,
        decode: decode_control,
        canonical: false,
        must_reach: &Stage::ALL,
    },
    &Codec {
        name: "record-batch",
        framing: Framing::RecordEnds,
        valid: gen::record_batch,
        encode: encode_batch,
        decode: decode_batch,
        canonical: true,
        must_reach: &[Stage::Decode, Stage::Accepted],
    },
    &Codec {
        name: "transaction-id",
        framing: Framing::Text,
        valid: gen::parsed_transaction_id,
        encode: |p| p.id.as_str().as_bytes().to_vec(),
        decode: decode_transaction_id,
        canonical: true,
        must_reach: &[Stage::Framing, Stage::Decode, Stage::Accepted],
    },
    &Codec {
        name: "commit-record-name",
        framing: Framing::Text,
        valid: gen::commit_record_name,
        encode: |(l, c, t)| commit_record_name(*l, *c, t).into_bytes(),
        decode: decode_commit_record_name,
        canonical: true,
        must_reach: &[Stage::Framing, Stage::Decode, Stage::Accepted],
    },
    &Codec {
        name: "writer-state",
        framing: Framing::Envelope,
        valid: gen::writer_state,
        encode: WriterState::encode,
        decode: |b| WriterState::decode(b).map_err(|e| stage_of(&e)),
        // bincode reads integers in longer forms than it writes them.
        canonical: false,
        must_reach: &Stage::ALL,
    },
    &crate::config_target::ConfigTarget,
];

/// Opens an envelope of either kind. The body returned must be exactly the
/// bytes between header and trailer.
fn decode_envelope(b: &[u8]) -> Result<(PayloadKind, Vec<u8>), Stage> {
    for kind in [PayloadKind::TransactionHandle, PayloadKind::Manifest] {
        match envelope::open(kind, b) {
            Ok(body) => {
                assert_eq!(
                    body,
                    &b[envelope::HEADER_LEN..b.len() - envelope::TRAILER_LEN],
                    "open returned other bytes than the body"
                );
                return Ok((kind, body.to_vec()));
            }
            Err(HandleError::WrongKind { .. }) => continue,
            Err(_) => return Err(Stage::Framing),
        }
    }
    Err(Stage::Framing)
}

fn encode_control_file(c: &ControlFile) -> Vec<u8> {
    encode_payload(PayloadKind::Manifest, c)
}

/// The filesystem destination builds paths from a control file's handle
/// and file name, so whatever it accepts must satisfy what a restored
/// handle satisfies.
fn decode_control(b: &[u8]) -> Result<ControlFile, Stage> {
    let c = decode_control_file(b).map_err(|e| stage_of(&e))?;
    // The destination checks a control file against where it was found
    // before using it; found where its own contents say it belongs, it
    // must pass those checks or be refused as invalid.
    match &c {
        ControlFile::Prepared(m) => {
            accepted_handle(&m.handle);
            m.check(&m.handle.sink, &m.handle.transaction)
                .map_err(|_| Stage::Validate)?
        }
        ControlFile::Committed(r) => check_commit_record(r)?,
        // Each record of a history segment passes what a single record
        // passes.
        ControlFile::Segment(records) => {
            for r in records {
                check_commit_record(r)?;
            }
        }
        // A lineage record carries no handle; its fields are checked by
        // the decoder itself.
        ControlFile::Lineage(_) => {}
    }
    Ok(c)
}

/// The filesystem destination builds paths from a control file's handle
/// and file name, so whatever it accepts must satisfy what a restored
/// handle satisfies.
fn accepted_handle(handle: &TransactionHandle) {
    if let Err(e) = TransactionHandle::decode(&handle.encode()) {
        panic!("a control file was accepted with a handle that is refused on its own: {e}");
    }
}

fn check_commit_record(r: &twopc_fs::CommitRecord) -> Result<(), Stage> {
    let handle = &r.handle;
    accepted_handle(handle);
    let Some(checkpoint) = handle.checkpoint() else {
        return Err(Stage::Validate);
    };
    let name = commit_record_name(handle.lineage, checkpoint, &handle.transaction);
    r.check(&handle.sink, &name).map_err(|_| Stage::Validate)?;
    if let Some(file) = &r.file {
        assert!(
            !file.is_empty()
                && !file.starts_with(['.', '_'])
                && !file.contains(['/', '\\', '\0']),
            "a commit record passed its checks with file name {file:?} outside the output directory's visible names"
        );
    }
    Ok(())
}

/// The two parts of a batch in one byte string: `count (u32 LE)`, `count`
/// record ends, a terminator flag (0, or 1 and the byte), the data.
fn encode_batch((terminator, records): &(Option<u8>, Vec<Vec<u8>>)) -> Vec<u8> {
    let mut buf = match terminator {
        Some(t) => RecordBatchBuf::terminated_by(*t),
        None => RecordBatchBuf::new(),
    };
    for r in records {
        buf.push(r);
    }
    let (data, ends, terminator) = buf.into_parts();
    let mut out = (records.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&ends);
    match terminator {
        Some(t) => out.extend_from_slice(&[1, t]),
        None => out.push(0),
    }
    out.extend_from_slice(&data);
    out
}

/// Validates and iterates, checking that the iteration agrees with what
/// validation counted and with the records looked up one by one.
fn decode_batch(b: &[u8]) -> Result<(Option<u8>, Vec<Vec<u8>>), Stage> {
    let count = b.get(..4).ok_or(Stage::Framing)?;
    let count = u32::from_le_bytes([count[0], count[1], count[2], count[3]]) as usize;
    let ends_end = count
        .checked_mul(4)
        .and_then(|n| n.checked_add(4))
        .filter(|&n| n <= b.len())
        .ok_or(Stage::Framing)?;
    let ends = &b[4..ends_end];
    let (terminator, data) = match b.get(ends_end..) {
        Some([0, data @ ..]) => (None, data),
        Some([1, t, data @ ..]) => (Some(*t), data),
        _ => return Err(Stage::Framing),
    };
    let batch = RecordBatch::new(BatchParts {
        data,
        ends,
        terminator,
    })
    .map_err(|_| Stage::Decode)?;
    let records: Vec<Vec<u8>> = batch.iter().map(<[u8]>::to_vec).collect();
    for (i, r) in records.iter().enumerate() {
        assert_eq!(
            batch.get(i as u64),
            Some(&r[..]),
            "record {i} looked up differs"
        );
    }
    assert_eq!(
        batch.get(records.len() as u64),
        None,
        "a record past the end"
    );
    for byte in [b'\n', b'a'] {
        let naive = records
            .iter()
            .position(|r| r.contains(&byte))
            .map(|i| (i as u64, &records[i][..]));
        assert_eq!(
            batch.first_record_containing(byte),
            naive,
            "search for {byte:#x} differs"
        );
    }
    assert_eq!(records.len() as u64, batch.len(), "iteration count differs");
    assert_eq!(
        records.iter().map(|r| r.len() as u64).sum::<u64>(),
        batch.payload_bytes(),
        "payload bytes differ"
    );
    assert_eq!(batch.is_empty(), records.is_empty());
    Ok((terminator, records))
}

/// Names reach the parsers as Rust strings (file names that are not UTF-8
/// are skipped when listing), so bytes that are not UTF-8 stop there.
fn utf8(b: &[u8]) -> Result<&str, Stage> {
    std::str::from_utf8(b).map_err(|_| Stage::Framing)
}

fn decode_transaction_id(b: &[u8]) -> Result<ParsedTransactionId, Stage> {
    let s = utf8(b)?;
    let p = TransactionId::parse(s).ok_or(Stage::Decode)?;
    assert_eq!(
        p.id,
        TransactionId::compose(&p.sink, p.subtask, p.attempt_nonce, p.sequence),
        "the parts do not compose to the id"
    );
    Ok(p)
}

fn decode_commit_record_name(b: &[u8]) -> Result<(LineageId, CheckpointId, TransactionId), Stage> {
    let s = utf8(b)?;
    parse_commit_record_name(s).ok_or(Stage::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = TARGETS.iter().map(|t| t.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TARGETS.len());
    }

    #[test]
    fn unmutated_inputs_are_accepted() {
        for t in TARGETS {
            let mut seen = 0;
            for seed in 0..500 {
                let m = t.generate(seed);
                if m.valid {
                    seen += 1;
                    assert_eq!(t.check(&m.bytes, true), Stage::Accepted, "{}", t.name());
                }
            }
            assert!(seen > 0, "{}: no valid input in 500 seeds", t.name());
        }
    }

    #[test]
    fn a_valid_encoding_that_is_rejected_is_a_failure() {
        let handle = TARGETS.iter().find(|t| t.name() == "handle").unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            handle.check(b"not a handle", true)
        }));
        assert!(r.is_err());
    }
}
