//! Random VALID values of every decoded type, built the way the crates
//! build them (constructors, `compose`), with fields drawn at the
//! boundaries of their encodings. Their encodings are what the mutators
//! start from, and each must decode back to itself.

use twopc_core::envelope::{PayloadKind, HEADER_LEN, TRAILER_LEN};
use twopc_core::handle::{PreparedInfo, TransactionHandle, TransactionState};
use twopc_core::ids::{CheckpointId, LineageId, ParsedTransactionId, RunId, SinkId, TransactionId};
use twopc_core::state::WriterState;
use twopc_fs::{CommitRecord, ControlFile, PreparedMarker};

use crate::rng::Rng;

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const TOKEN_REST: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";

/// A name as `twopc_core::ids::validate_token` accepts it: 1 to `max`
/// characters of `[A-Za-z0-9_-]`, starting with a letter or digit.
pub fn token(rng: &mut Rng, max: usize) -> String {
    let len = match rng.below(4) {
        0 => 1,
        1 => max,
        _ => rng.range(1, max as u64) as usize,
    };
    let mut s = String::with_capacity(len);
    s.push(*rng.pick(ALNUM) as char);
    for _ in 1..len {
        s.push(*rng.pick(TOKEN_REST) as char);
    }
    s
}

pub fn sink_id(rng: &mut Rng) -> SinkId {
    SinkId::new(token(rng, twopc_core::ids::MAX_SINK_ID_LEN)).expect("generated a valid token")
}

fn run_id(rng: &mut Rng) -> RunId {
    let id = if rng.percent(70) {
        // What Flink hands over: a job id, 32 hex digits.
        format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64())
    } else {
        token(rng, 64)
    };
    RunId::new(id).expect("generated a valid run id")
}

/// Parallelism and a subtask index below it.
fn subtask_of(rng: &mut Rng) -> (u32, u32) {
    let parallelism = match rng.below(6) {
        0 => 1,
        1 => 2,
        2 => 128,
        3 => 32_768,
        4 => u32::MAX,
        _ => rng.range(1, u32::MAX as u64) as u32,
    };
    let subtask = match rng.below(3) {
        0 => 0,
        1 => parallelism - 1,
        _ => rng.below(parallelism as u64) as u32,
    };
    (subtask, parallelism)
}

pub fn parsed_transaction_id(rng: &mut Rng) -> ParsedTransactionId {
    let sink = sink_id(rng);
    let (subtask, _) = subtask_of(rng);
    let attempt_nonce = rng.interesting_u64();
    let sequence = rng.interesting_u64();
    ParsedTransactionId {
        id: TransactionId::compose(&sink, subtask, attempt_nonce, sequence),
        sink,
        subtask,
        attempt_nonce,
        sequence,
    }
}

/// A handle in either state; `prepared_percent` is the share of prepared
/// ones.
pub fn handle_with(rng: &mut Rng, prepared_percent: u64) -> TransactionHandle {
    let sink = sink_id(rng);
    let (subtask, parallelism) = subtask_of(rng);
    let transaction =
        TransactionId::compose(&sink, subtask, rng.interesting_u64(), rng.interesting_u64());
    let state = if rng.percent(prepared_percent) {
        TransactionState::Prepared(PreparedInfo {
            checkpoint: rng.interesting_u64(),
            records: rng.interesting_u64(),
            bytes: rng.interesting_u64(),
            prepared_at_ms: rng.interesting_u64(),
        })
    } else {
        TransactionState::Open
    };
    TransactionHandle {
        sink,
        transaction,
        lineage: LineageId(rng.interesting_u64()),
        run: run_id(rng),
        subtask,
        parallelism,
        begun_at_ms: rng.interesting_u64(),
        state,
    }
}

pub fn handle(rng: &mut Rng) -> TransactionHandle {
    handle_with(rng, 50)
}

/// A prepare marker as `FsDestination::prepare` writes it: for a prepared
/// handle, with the data length its counts give (with or without a line
/// break per record).
pub fn prepare_marker(rng: &mut Rng) -> ControlFile {
    let mut handle = handle_with(rng, 100);
    let data_len = data_len_of(rng, &mut handle);
    ControlFile::Prepared(PreparedMarker { handle, data_len })
}

/// The data length a destination records for `handle`. A file holds at
/// most u64::MAX bytes, line breaks included, so the record count is
/// clamped to what fits (the destination refuses counts that do not).
fn data_len_of(rng: &mut Rng, handle: &mut TransactionHandle) -> u64 {
    let TransactionState::Prepared(p) = &mut handle.state else {
        unreachable!("generated prepared")
    };
    p.records = p.records.min(u64::MAX - p.bytes);
    if rng.percent(50) {
        p.bytes
    } else {
        p.bytes + p.records
    }
}

/// A commit record as `FsDestination::commit` writes it: the visible file
/// is `<prefix>-<transaction id><suffix>`, or none for a transaction
/// without records.
pub fn commit_record(rng: &mut Rng) -> ControlFile {
    let mut handle = handle_with(rng, 100);
    let empty = rng.percent(10);
    if let TransactionState::Prepared(p) = &mut handle.state {
        if empty {
            p.records = 0;
            p.bytes = 0;
        }
    }
    let file = if empty {
        None
    } else {
        let suffix = if rng.percent(50) {
            String::new()
        } else {
            format!(".{}", token(rng, 16))
        };
        Some(format!(
            "{}-{}{}",
            token(rng, 32),
            handle.transaction,
            suffix
        ))
    };
    let data_len = data_len_of(rng, &mut handle);
    ControlFile::Committed(CommitRecord {
        handle,
        file,
        data_len,
        committed_at_ms: rng.interesting_u64(),
    })
}

/// A history segment of the filesystem destination: one to four commit
/// records (each valid on its own).
pub fn history_segment(rng: &mut Rng) -> ControlFile {
    let n = 1 + rng.below(4) as usize;
    let records = (0..n)
        .map(|_| match commit_record(rng) {
            ControlFile::Committed(r) => r,
            _ => unreachable!("commit_record makes commit records"),
        })
        .collect();
    ControlFile::Segment(records)
}

/// The parts of a commit record's file name.
pub fn commit_record_name(rng: &mut Rng) -> (LineageId, CheckpointId, TransactionId) {
    (
        LineageId(rng.interesting_u64()),
        rng.interesting_u64(),
        parsed_transaction_id(rng).id,
    )
}

/// An envelope's kind and body: often the body of a real handle or control
/// file, otherwise arbitrary bytes (the envelope does not look inside).
pub fn envelope(rng: &mut Rng) -> (PayloadKind, Vec<u8>) {
    let sealed = match rng.below(4) {
        0 => handle(rng).encode(),
        1 => twopc_core::handle::encode_payload(PayloadKind::Manifest, &commit_record(rng)),
        _ => {
            let kind = if rng.percent(50) {
                PayloadKind::TransactionHandle
            } else {
                PayloadKind::Manifest
            };
            let len = rng.length(512);
            return (kind, rng.bytes(len));
        }
    };
    let kind = if sealed[6] == PayloadKind::TransactionHandle as u8 {
        PayloadKind::TransactionHandle
    } else {
        PayloadKind::Manifest
    };
    (
        kind,
        sealed[HEADER_LEN..sealed.len() - TRAILER_LEN].to_vec(),
    )
}

/// The records of a batch: empty ones, text, binary, a few large.
/// A record batch: its terminator (none, the LINES format's line break,
/// or any byte) and its records.
pub fn record_batch(rng: &mut Rng) -> (Option<u8>, Vec<Vec<u8>>) {
    let terminator = match rng.below(3) {
        0 => None,
        1 => Some(b'\n'),
        _ => Some(rng.bytes(1)[0]),
    };
    (terminator, records(rng))
}

pub fn records(rng: &mut Rng) -> Vec<Vec<u8>> {
    let count = rng.length(48);
    (0..count)
        .map(|_| {
            let len = if rng.percent(1) {
                rng.range(1024, 4096) as usize
            } else {
                rng.length(64)
            };
            let mut record = rng.bytes(len);
            if rng.percent(50) {
                // Printable text, as most serializers produce.
                for b in &mut record {
                    *b = b' ' + *b % 95;
                }
            }
            record
        })
        .collect()
}

/// Writer state as a writer snapshots it: open transactions of its own
/// sink and lineage.
pub fn writer_state(rng: &mut Rng) -> WriterState {
    let sink = sink_id(rng);
    let lineage = LineageId(rng.interesting_u64());
    let open = (0..rng.below(4))
        .map(|_| {
            let mut h = handle_with(rng, 0);
            h.sink = sink.clone();
            h.transaction = TransactionId::compose(
                &sink,
                h.subtask,
                rng.interesting_u64(),
                rng.interesting_u64(),
            );
            h.lineage = lineage;
            h
        })
        .collect();
    WriterState {
        sink,
        lineage,
        run: run_id(rng),
        subtask: rng.below(u64::from(u32::MAX)) as u32,
        open,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_values_are_valid() {
        for seed in 0..2000 {
            let mut rng = Rng::new(seed);
            let h = handle(&mut rng);
            assert_eq!(TransactionHandle::decode(&h.encode()).unwrap(), h);
            let p = parsed_transaction_id(&mut rng);
            assert_eq!(TransactionId::parse(p.id.as_str()).unwrap(), p);
            let t = token(&mut rng, 64);
            assert!(twopc_core::ids::validate_token("t", &t, 64).is_ok(), "{t}");
        }
    }
}
