//! The control objects of the object store destination (prepared markers,
//! commit records, lineage records, ownership leases, history segments and
//! their index), the location of a
//! prepared upload that travels in the handle, their encoding, and the
//! checks each passes when read back before the sink acts on it.
//!
//! All of them are bincode bodies in the core's versioned envelope
//! (magic, format version, kind, length, CRC-32), payload kind "manifest",
//! as one enum whose variant index is part of the encoding: new variants go
//! at the end. Anything under `_twopc` and any handle from a checkpoint can
//! be damaged or forged; decoding never panics, and a decoded object is
//! used only after it proved to be what its key says.

use serde::{Deserialize, Serialize};

use twopc_core::destination::{CommittedTransaction, LineageRecord};
use twopc_core::envelope::PayloadKind;
use twopc_core::handle::{decode_payload, encode_payload, HandleError, TransactionHandle};
use twopc_core::ids::{RunId, SinkId, TransactionId};

use crate::history::HistoryIndex;
use crate::names::{commit_record_name, Layout};

/// Where a prepared transaction's records are: one multipart upload of its
/// final key, not completed. Everything a commit after a restart needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadLocation {
    pub bucket: String,
    pub key: String,
    pub upload_id: String,
    /// The parts' ids (ETags, quotes included), part 1 first.
    pub parts: Vec<String>,
    /// Exact bytes uploaded (the object's size once completed).
    pub bytes: u64,
}

/// Written at prepare (`_twopc/<sink>/prepared/<txn>`): the handle, with
/// its location, so that `staged()` reports a prepared upload with the
/// handle a commit needs. Its presence is what tells a prepared upload
/// from an open one (see the crate docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedMarker {
    pub handle: TransactionHandle,
}

/// Written at commit (`_twopc/<sink>/committed/<lineage>-<checkpoint>-<txn>`)
/// with a conditional create: the durable proof that the transaction's
/// upload was completed, and what the object looked like then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRecord {
    pub handle: TransactionHandle,
    pub key: String,
    pub size: u64,
    /// The object's ETag after completion (`"<hex>-<parts>"`).
    pub e_tag: String,
    pub committed_at_ms: u64,
}

/// The holder of a subtask's share of the sink (`_twopc/<sink>/owners/<n>`),
/// see `lease`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub sink: SinkId,
    pub subtask: u32,
    pub run: RunId,
    pub attempt: u32,
    pub instance: u64,
    /// Host and process, for messages.
    pub holder: String,
    pub acquired_at_ms: u64,
    /// The lease is free after this instant, unless renewed; a released
    /// lease has it in the past.
    pub expires_at_ms: u64,
}

/// Everything this destination stores in the envelope. New variants go at
/// the end: the variant index is part of the encoding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlObject {
    Location(UploadLocation),
    Prepared(PreparedMarker),
    Committed(CommitRecord),
    Lineage(LineageRecord),
    Lease(LeaseRecord),
    /// A history segment: commit records folded together (see `history`).
    Segment(Vec<CommitRecord>),
    /// The live history segments (see `history`).
    HistoryIndex(HistoryIndex),
}

/// Control objects are small (a location with 10,000 parts is about
/// 400 KiB); anything larger is not ours.
pub(crate) const MAX_CONTROL_OBJECT: usize = 1 << 20;

/// Encodes a control object (tests and tools forge and repair with it).
pub fn encode(object: &ControlObject) -> Vec<u8> {
    encode_payload(PayloadKind::Manifest, object)
}

/// Decodes a control object. Any input gives a typed error, never a panic;
/// handles inside are checked as the core checks a restored handle.
pub fn decode(bytes: &[u8]) -> Result<ControlObject, HandleError> {
    let object = decode_payload::<ControlObject>(PayloadKind::Manifest, bytes)?;
    match &object {
        ControlObject::Prepared(m) => m.handle.validate()?,
        ControlObject::Committed(c) => c.handle.validate()?,
        ControlObject::Location(_) | ControlObject::Lineage(_) => {}
        ControlObject::Lease(l) => {
            SinkId::new(l.sink.as_str()).map_err(|e| HandleError::Invalid(e.to_string()))?;
            RunId::new(l.run.as_str()).map_err(|e| HandleError::Invalid(e.to_string()))?;
        }
        ControlObject::Segment(records) => {
            for r in records {
                r.handle.validate()?;
            }
        }
        ControlObject::HistoryIndex(index) => index.validate()?,
    }
    Ok(object)
}

impl UploadLocation {
    /// The bytes that go into the handle.
    pub fn encode(&self) -> Vec<u8> {
        encode(&ControlObject::Location(self.clone()))
    }

    /// Reads the location out of a handle's bytes and checks it against the
    /// handle and this sink's layout: the bucket, a key this sink could
    /// have given the transaction, part ids that are plain ETags, and a
    /// byte count its records give.
    pub fn decode_for(
        bytes: &[u8],
        handle: &TransactionHandle,
        layout: &Layout,
    ) -> Result<UploadLocation, String> {
        let txn = &handle.transaction;
        let location = match decode(bytes) {
            Ok(ControlObject::Location(l)) => l,
            Ok(_) => {
                return Err(format!(
                    "the location in the handle of {txn} is not a location"
                ))
            }
            Err(e) => return Err(format!("the location in the handle of {txn}: {e}")),
        };
        location.check(handle, layout)?;
        Ok(location)
    }

    fn check(&self, handle: &TransactionHandle, layout: &Layout) -> Result<(), String> {
        let txn = &handle.transaction;
        if self.bucket != layout.bucket {
            return Err(format!(
                "the handle of {txn} locates its upload in bucket {:?}, but this sink writes to \
                 bucket {:?}",
                self.bucket, layout.bucket
            ));
        }
        layout
            .check_part_key(&self.key, txn)
            .map_err(|e| format!("the handle of {txn}: {e}"))?;
        if self.upload_id.is_empty()
            || self.upload_id.len() > 1024
            || self.upload_id.chars().any(|c| c.is_control())
        {
            return Err(format!("the handle of {txn} holds no usable upload id"));
        }
        if self.parts.is_empty() || self.parts.len() > crate::options::MAX_PARTS {
            return Err(format!(
                "the handle of {txn} lists {} parts (1 to {} expected)",
                self.parts.len(),
                crate::options::MAX_PARTS
            ));
        }
        if let Some(bad) = self.parts.iter().find(|p| {
            p.is_empty() || p.len() > 200 || p.chars().any(|c| c.is_control() || c == '<')
        }) {
            return Err(format!(
                "the handle of {txn} holds a malformed part id {bad:?}"
            ));
        }
        if !lengths_for(handle).is_some_and(|l| l.contains(&self.bytes)) {
            return Err(format!(
                "the handle of {txn} locates {} bytes, which its {} records of {} bytes do not \
                 give",
                self.bytes,
                handle.prepared().map_or(0, |p| p.records),
                handle.prepared().map_or(0, |p| p.bytes)
            ));
        }
        Ok(())
    }
}

/// The sizes an object holding a handle's records has: with a line break
/// after each record (LINES) or without (RAW).
fn lengths_for(handle: &TransactionHandle) -> Option<[u64; 2]> {
    let p = handle.prepared()?;
    Some([p.bytes, p.bytes.checked_add(p.records)?])
}

impl PreparedMarker {
    /// Checks a marker read from `prepared/<txn>` and returns its location.
    pub fn check(&self, layout: &Layout, txn: &TransactionId) -> Result<UploadLocation, String> {
        self.handle.check_filed_under(&layout.sink, txn)?;
        let Some(bytes) = self.handle.location() else {
            return Err(format!(
                "the prepared marker of {txn} holds a handle without its upload's location"
            ));
        };
        UploadLocation::decode_for(bytes, &self.handle, layout)
    }
}

impl CommitRecord {
    /// Checks a record read from `committed/<name>`.
    pub fn check(&self, layout: &Layout, name: &str) -> Result<(), String> {
        let h = &self.handle;
        h.check_filed_under(&layout.sink, &h.transaction)?;
        let Some(checkpoint) = h.checkpoint() else {
            return Err(format!(
                "commit record {name} holds a handle that is not prepared"
            ));
        };
        let expected = commit_record_name(h.lineage, checkpoint, &h.transaction);
        if name != expected {
            return Err(format!(
                "commit record {name} holds the record of {} (lineage {}, checkpoint \
                 {checkpoint}), whose record is named {expected}",
                h.transaction, h.lineage
            ));
        }
        layout
            .check_part_key(&self.key, &h.transaction)
            .map_err(|e| format!("commit record {name}: {e}"))?;
        if !lengths_for(h).is_some_and(|l| l.contains(&self.size)) {
            return Err(format!(
                "commit record {name} records {} bytes, which its handle's counts do not give",
                self.size
            ));
        }
        Ok(())
    }

    /// The protocol's view of the record.
    pub fn view(&self) -> CommittedTransaction {
        let h = &self.handle;
        CommittedTransaction {
            transaction: h.transaction.clone(),
            lineage: h.lineage,
            checkpoint: h.checkpoint().unwrap_or_default(),
            subtask: h.subtask,
            run: h.run.clone(),
            records: h.prepared().map_or(0, |p| p.records),
            committed_at_ms: self.committed_at_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use twopc_core::handle::{PreparedInfo, TransactionState};
    use twopc_core::ids::LineageId;

    pub(crate) fn located_handle(layout: &Layout) -> (TransactionHandle, UploadLocation) {
        let txn = TransactionId::compose(&layout.sink, 0, 0xabc, 1);
        let location = UploadLocation {
            bucket: layout.bucket.clone(),
            key: layout.part_key(&txn),
            upload_id: "upload-1".into(),
            parts: vec!["\"0123\"".into()],
            bytes: 12,
        };
        let handle = TransactionHandle {
            sink: layout.sink.clone(),
            transaction: txn,
            lineage: LineageId(9),
            run: RunId::new("run-a").unwrap(),
            subtask: 0,
            parallelism: 1,
            begun_at_ms: 1,
            state: TransactionState::PreparedAt {
                info: PreparedInfo {
                    checkpoint: 3,
                    records: 2,
                    bytes: 10,
                    prepared_at_ms: 2,
                },
                location: location.encode(),
            },
        };
        (handle, location)
    }

    fn layout() -> Layout {
        Layout {
            bucket: "bkt".into(),
            prefix: "out".into(),
            sink: SinkId::new("s").unwrap(),
            part_prefix: "part".into(),
            part_suffix: String::new(),
        }
    }

    #[test]
    fn a_location_reads_back_and_a_forged_one_is_refused() {
        let l = layout();
        let (handle, location) = located_handle(&l);
        let bytes = handle.location().unwrap();
        assert_eq!(
            UploadLocation::decode_for(bytes, &handle, &l).unwrap(),
            location
        );
        for forged in [
            UploadLocation {
                bucket: "other".into(),
                ..location.clone()
            },
            UploadLocation {
                key: "out/evil".into(),
                ..location.clone()
            },
            UploadLocation {
                parts: vec![],
                ..location.clone()
            },
            UploadLocation {
                bytes: 11,
                ..location.clone()
            },
            UploadLocation {
                upload_id: String::new(),
                ..location.clone()
            },
        ] {
            assert!(UploadLocation::decode_for(&forged.encode(), &handle, &l).is_err());
        }
        // Every cut and flipped byte is a clear error, never a panic.
        for cut in 0..bytes.len() {
            assert!(UploadLocation::decode_for(&bytes[..cut], &handle, &l).is_err());
        }
        for i in 0..bytes.len() {
            let mut b = bytes.to_vec();
            b[i] ^= 0x5a;
            assert!(
                UploadLocation::decode_for(&b, &handle, &l).is_err(),
                "byte {i}"
            );
        }
    }
}
