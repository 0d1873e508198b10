//! Record batches as they cross from the JVM: many records in one buffer, so
//! that one native call carries thousands of records.
//!
//! ```text
//! batch  := record*
//! record := length (u32, little endian) bytes[length]
//! ```

/// A malformed batch. Nothing of the batch has been written when this is
/// returned: the batch is validated before any record reaches a destination.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("record batch is malformed at byte {offset}: {reason} (batch of {len} bytes); this is a bug in the caller, please report it")]
    Malformed {
        offset: usize,
        len: usize,
        reason: &'static str,
    },
}

/// A validated batch of length-prefixed records.
#[derive(Clone, Copy, Debug)]
pub struct RecordBatch<'a> {
    bytes: &'a [u8],
    count: u64,
    payload_bytes: u64,
}

impl<'a> RecordBatch<'a> {
    /// Validates the framing of the whole buffer up front.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BatchError> {
        let mut offset = 0usize;
        let mut count = 0u64;
        let mut payload_bytes = 0u64;
        while offset < bytes.len() {
            let Some(prefix) = bytes.get(offset..offset + 4) else {
                return Err(BatchError::Malformed {
                    offset,
                    len: bytes.len(),
                    reason: "length prefix cut short",
                });
            };
            let n = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
            let end = offset
                .checked_add(4)
                .and_then(|o| o.checked_add(n))
                .filter(|&e| e <= bytes.len())
                .ok_or(BatchError::Malformed {
                    offset,
                    len: bytes.len(),
                    reason: "record runs past the end of the batch",
                })?;
            count += 1;
            payload_bytes += n as u64;
            offset = end;
        }
        Ok(RecordBatch {
            bytes,
            count,
            payload_bytes,
        })
    }

    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Sum of the record lengths, without prefixes.
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }

    pub fn iter(&self) -> RecordIter<'a> {
        RecordIter { rest: self.bytes }
    }
}

/// Iterates over the records of a validated batch.
pub struct RecordIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        // The batch was validated in `parse`, so these slices are in bounds;
        // `get` keeps it panic-free regardless.
        let prefix = self.rest.get(..4)?;
        let n = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        let record = self.rest.get(4..4 + n)?;
        self.rest = &self.rest[4 + n..];
        Some(record)
    }
}

/// Appends one record to a batch buffer (used by tests and the CLI; the JVM
/// side writes the same framing into a direct buffer).
pub fn push_record(buf: &mut Vec<u8>, record: &[u8]) {
    buf.extend_from_slice(&(record.len() as u32).to_le_bytes());
    buf.extend_from_slice(record);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_iterates() {
        let mut buf = Vec::new();
        push_record(&mut buf, b"a");
        push_record(&mut buf, b"");
        push_record(&mut buf, b"hello");
        let batch = RecordBatch::parse(&buf).unwrap();
        assert_eq!(batch.len(), 3);
        assert_eq!(batch.payload_bytes(), 6);
        let v: Vec<&[u8]> = batch.iter().collect();
        assert_eq!(v, vec![&b"a"[..], &b""[..], &b"hello"[..]]);
    }

    #[test]
    fn empty_batch_is_valid() {
        assert!(RecordBatch::parse(&[]).unwrap().is_empty());
    }

    #[test]
    fn malformed_batches_are_rejected() {
        let mut buf = Vec::new();
        push_record(&mut buf, b"hello");
        for cut in 1..buf.len() {
            assert!(RecordBatch::parse(&buf[..cut]).is_err(), "cut {cut}");
        }
        let huge = [0xff, 0xff, 0xff, 0xff, 1];
        assert!(RecordBatch::parse(&huge).is_err());
    }
}
