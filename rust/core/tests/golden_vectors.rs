//! Golden handle encodings in `tests/vectors/`: bytes written by this release
//! with the fields they must decode to. A future release must still read
//! them (checkpoints outlive releases), and the Java side checks the same
//! files through the JNI decoder.
//!
//! Regenerate (only when adding a vector, never to "fix" a failing one):
//! `TWOPC_WRITE_VECTORS=1 cargo test -p twopc-core --test golden_vectors`

use std::path::PathBuf;

use serde_json::Value;
use twopc_core::handle::{PreparedInfo, TransactionHandle, TransactionState};
use twopc_core::ids::{LineageId, RunId, SinkId, TransactionId};
use twopc_core::state::WriterState;

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors")
}

/// The handles the vectors hold.
fn cases() -> Vec<(&'static str, TransactionHandle)> {
    let orders = SinkId::new("orders").unwrap();
    let events = SinkId::new("events-v2_eu").unwrap();
    vec![
        (
            "handle-open-v1",
            TransactionHandle {
                transaction: TransactionId::compose(&orders, 0, 0x0123_4567_89ab_cdef, 0),
                sink: orders.clone(),
                lineage: LineageId(0x1122_3344_5566_7788),
                run: RunId::new("a1b2c3d4e5f60718293a4b5c6d7e8f90").unwrap(),
                subtask: 0,
                parallelism: 2,
                begun_at_ms: 1_790_000_000_000,
                state: TransactionState::Open,
            },
        ),
        (
            "handle-prepared-v1",
            TransactionHandle {
                transaction: TransactionId::compose(&orders, 1, 0xfedc_ba98_7654_3210, 41),
                sink: orders,
                lineage: LineageId(0x1122_3344_5566_7788),
                run: RunId::new("a1b2c3d4e5f60718293a4b5c6d7e8f90").unwrap(),
                subtask: 1,
                parallelism: 2,
                begun_at_ms: 1_790_000_001_000,
                state: TransactionState::Prepared(PreparedInfo {
                    checkpoint: 17,
                    records: 123_456,
                    bytes: 9_876_543,
                    prepared_at_ms: 1_790_000_002_500,
                }),
            },
        ),
        (
            "handle-prepared-large-v1",
            TransactionHandle {
                transaction: TransactionId::compose(&events, 127, u64::MAX, u64::MAX),
                sink: events,
                lineage: LineageId(u64::MAX),
                run: RunId::new("ffffffffffffffffffffffffffffffff").unwrap(),
                subtask: 127,
                parallelism: 128,
                begun_at_ms: u64::MAX - 1,
                state: TransactionState::Prepared(PreparedInfo {
                    checkpoint: u64::MAX,
                    records: u64::MAX,
                    bytes: u64::MAX,
                    prepared_at_ms: u64::MAX,
                }),
            },
        ),
    ]
}

/// The JSON form shared with the Java test (`NativeBridge.describeHandle`).
fn describe(h: &TransactionHandle) -> Value {
    serde_json::to_value(h.describe()).expect("a description serialises")
}

#[test]
fn golden_vectors_decode_to_their_fields_and_encode_identically() {
    let dir = vectors_dir();
    let write = std::env::var_os("TWOPC_WRITE_VECTORS").is_some();
    for (name, handle) in cases() {
        let bin = dir.join(format!("{name}.bin"));
        let js = dir.join(format!("{name}.json"));
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&bin, handle.encode()).unwrap();
            let text = serde_json::to_string_pretty(&describe(&handle)).unwrap();
            std::fs::write(&js, text + "\n").unwrap();
        }
        let bytes = std::fs::read(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let expected: Value =
            serde_json::from_slice(&std::fs::read(&js).unwrap()).expect("vector JSON parses");
        let decoded = TransactionHandle::decode(&bytes)
            .unwrap_or_else(|e| panic!("{name}: golden bytes no longer decode: {e}"));
        assert_eq!(
            describe(&decoded),
            expected,
            "{name}: decoded fields changed"
        );
        assert_eq!(decoded, handle, "{name}: decoded handle differs");
        assert_eq!(
            handle.encode(),
            bytes,
            "{name}: encoding changed; bump the format version"
        );
    }
}

#[test]
fn golden_vectors_reject_damage() {
    for (name, _) in cases() {
        let bytes = std::fs::read(vectors_dir().join(format!("{name}.bin"))).unwrap();
        let mut flipped = bytes.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x40;
        assert!(TransactionHandle::decode(&flipped).is_err(), "{name}");
        assert!(
            TransactionHandle::decode(&bytes[..bytes.len() - 1]).is_err(),
            "{name}"
        );
    }
}

/// A writer's checkpoint state (`writer-state-v1.bin`): the Sink V2 writer
/// state and the SinkFunction shim's own element both carry these bytes.
fn writer_state_case() -> WriterState {
    let open = cases().remove(0).1;
    WriterState {
        sink: open.sink.clone(),
        lineage: open.lineage,
        run: open.run.clone(),
        subtask: 0,
        open: vec![open],
    }
}

#[test]
fn golden_writer_state_decodes_and_encodes_identically() {
    let bin = vectors_dir().join("writer-state-v1.bin");
    let state = writer_state_case();
    if std::env::var_os("TWOPC_WRITE_VECTORS").is_some() {
        std::fs::write(&bin, state.encode()).unwrap();
    }
    let bytes = std::fs::read(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let decoded = WriterState::decode(&bytes)
        .unwrap_or_else(|e| panic!("writer-state-v1: golden bytes no longer decode: {e}"));
    assert_eq!(decoded, state, "writer-state-v1: decoded state differs");
    assert_eq!(
        state.encode(),
        bytes,
        "writer-state-v1: encoding changed; bump the format version"
    );
    let mut flipped = bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    assert!(WriterState::decode(&flipped).is_err());
}
