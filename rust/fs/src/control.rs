//! The control files of the filesystem destination (prepare markers,
//! commit records, lineage records), their encoding, and the checks every
//! one of them passes when read back before the sink acts on it.
//!
//! Everything under `_twopc` can be edited, damaged or forged by someone
//! else. A control file is used to publish, rename or delete only after it
//! proved to be what its name says: the right sink, the transaction its
//! name or directory names, a handle that passes the core's checks, and an
//! output file name this destination could have given.

use serde::{Deserialize, Serialize};

use twopc_core::destination::{CommittedTransaction, LineageRecord};
use twopc_core::envelope::PayloadKind;
use twopc_core::handle::{decode_payload, encode_payload, HandleError, TransactionHandle};
use twopc_core::ids::{LineageId, SinkId, TransactionId};

use crate::names::{check_part_name, commit_record_name};

/// Written at prepare, inside the transaction's staging directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedMarker {
    pub handle: TransactionHandle,
    /// Exact length of the data file; checked before publication.
    pub data_len: u64,
}

/// Written at commit: the durable proof that a transaction was committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRecord {
    pub handle: TransactionHandle,
    /// Visible file name, relative to the output directory (None when the
    /// transaction held no data).
    pub file: Option<String>,
    pub data_len: u64,
    pub committed_at_ms: u64,
}

/// A control file of the filesystem destination, as stored (inside the
/// versioned envelope, payload kind "manifest"). New variants go at the
/// end: the variant index is part of the encoding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlFile {
    Prepared(PreparedMarker),
    Committed(CommitRecord),
    Lineage(LineageRecord),
    /// Commit records of one lineage and run folded together (see
    /// `history`); each one is checked as a single record is.
    Segment(Vec<CommitRecord>),
}

/// Control files are small; anything larger is not ours.
pub(crate) const MAX_CONTROL_FILE: u64 = 1 << 20;

/// Decodes the bytes of a control file read back from a destination. Any
/// input, however damaged, gives a typed error, never a panic. Handles
/// inside are checked as the core checks a restored handle.
pub fn decode_control_file(bytes: &[u8]) -> Result<ControlFile, HandleError> {
    let file = decode_payload::<ControlFile>(PayloadKind::Manifest, bytes)?;
    match &file {
        ControlFile::Prepared(m) => m.handle.validate()?,
        ControlFile::Committed(c) => c.handle.validate()?,
        ControlFile::Lineage(_) => {}
        ControlFile::Segment(records) => {
            for r in records {
                r.handle.validate()?;
            }
        }
    }
    Ok(file)
}

pub(crate) fn encode(file: &ControlFile) -> Vec<u8> {
    encode_payload(PayloadKind::Manifest, file)
}

/// The length a data file holding `records` records of `bytes` bytes has:
/// with a line break after each record (LINES) or without (RAW). The marker
/// does not say which format wrote it, so both are accepted.
fn lengths_for(handle: &TransactionHandle) -> Option<[u64; 2]> {
    let p = handle.prepared()?;
    Some([p.bytes, p.bytes.checked_add(p.records)?])
}

impl PreparedMarker {
    /// Checks a marker read from the staging directory of `txn`.
    pub fn check(&self, sink: &SinkId, txn: &TransactionId) -> Result<(), String> {
        self.handle.check_filed_under(sink, txn)?;
        let Some(lengths) = lengths_for(&self.handle) else {
            return Err(format!(
                "the prepare marker of {txn} holds a handle that is not prepared"
            ));
        };
        if !lengths.contains(&self.data_len) {
            return Err(format!(
                "the prepare marker of {txn} records {} data bytes, but its handle counts {} \
                 records of {} bytes",
                self.data_len,
                self.handle.prepared().map_or(0, |p| p.records),
                self.handle.prepared().map_or(0, |p| p.bytes),
            ));
        }
        Ok(())
    }
}

impl CommitRecord {
    /// Checks a record read from the file `name` in the commit records.
    pub fn check(&self, sink: &SinkId, name: &str) -> Result<(), String> {
        let h = &self.handle;
        h.check_filed_under(sink, &h.transaction)?;
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
        match &self.file {
            Some(file) => check_part_name(file, &h.transaction)
                .map_err(|e| format!("commit record {name}: {e}"))?,
            None if h.prepared().is_some_and(|p| p.records > 0) => {
                return Err(format!(
                    "commit record {name} names no output file for a transaction with records"
                ))
            }
            None => {}
        }
        if lengths_for(h).is_some_and(|l| !l.contains(&self.data_len)) {
            return Err(format!(
                "commit record {name} records {} bytes, which its handle's counts do not give",
                self.data_len
            ));
        }
        Ok(())
    }

    /// The protocol's view of the record.
    pub fn view(&self) -> CommittedTransaction {
        committed_view(self)
    }
}

/// The protocol's view of a commit record.
pub fn committed_view(r: &CommitRecord) -> CommittedTransaction {
    CommittedTransaction {
        transaction: r.handle.transaction.clone(),
        lineage: r.handle.lineage,
        checkpoint: r.handle.checkpoint().unwrap_or_default(),
        subtask: r.handle.subtask,
        run: r.handle.run.clone(),
        records: r.handle.prepared().map(|p| p.records).unwrap_or(0),
        committed_at_ms: r.committed_at_ms,
    }
}

/// Checks a lineage record read from the file named after `lineage`.
pub(crate) fn check_lineage(record: &LineageRecord, lineage: LineageId) -> Result<(), String> {
    if record.lineage != lineage {
        return Err(format!(
            "lineage record {lineage} describes lineage {}",
            record.lineage
        ));
    }
    Ok(())
}
