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

    /// The first record (its 0-based position and bytes) that contains
    /// `byte`, if any.
    ///
    /// One vectorised search over the whole buffer instead of one per
    /// record: the frames are walked only up to each hit, to tell a hit in
    /// a record from one in a length prefix (a record of 10 bytes has
    /// 0x0A in its prefix). A batch without the byte costs one pass.
    pub fn first_record_containing(&self, byte: u8) -> Option<(u64, &'a [u8])> {
        let mut index = 0u64;
        let mut frame = 0usize; // start of the frame holding the last hit
        let mut rest = self.iter();
        let mut current: Option<&'a [u8]> = rest.next();
        for hit in memchr::memchr_iter(byte, self.bytes) {
            // Move to the frame that holds `hit`.
            loop {
                let record = current?;
                let end = frame + 4 + record.len();
                if hit < end {
                    break;
                }
                frame = end;
                index += 1;
                current = rest.next();
            }
            if hit >= frame + 4 {
                return current.map(|record| (index, record));
            }
        }
        None
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

/// In the LINES record format (one record per line) a record must not
/// hold a line break, or readers would see two records (or a part of one):
/// the fault naming the batch's first record that does, if any. Shared by
/// every destination that writes lines.
pub fn line_break_fault(batch: &RecordBatch<'_>) -> Option<crate::error::RecordFault> {
    let (index, record) = batch.first_record_containing(b'\n')?;
    Some(crate::error::RecordFault {
        position: crate::error::RecordPosition::InBatch(index),
        column: None,
        reason: format!(
            "the record of {} bytes contains a line break, but the record format is LINES (one \
             record per line): readers would split it. Remove line breaks in the serialization \
             schema, or use the record format RAW",
            record.len()
        ),
        preview: preview(record),
    })
}

/// Appends one record to a batch buffer (used by tests and the CLI; the JVM
/// side writes the same framing into a direct buffer).
pub fn push_record(buf: &mut Vec<u8>, record: &[u8]) {
    buf.extend_from_slice(&(record.len() as u32).to_le_bytes());
    buf.extend_from_slice(record);
}

/// How many bytes of a refused record an error message shows.
pub const PREVIEW_BYTES: usize = 64;

/// Keys whose values a preview never shows (compared case-insensitively):
/// a refused record may be a log line or a configuration row, and error
/// messages end up in logs, the web UI and tickets.
const SECRET_KEYS: [&str; 8] = [
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "apikey",
    "api_key",
    "credential",
];

/// The first bytes of a record for an error message: printable ASCII as it
/// is, everything else escaped (`\n`, `\t`, `\0`, `\xNN`), and the values of
/// password-like keys (`password=...`, `"token": "..."`) and of URL user
/// information (`scheme://user:secret@host`) replaced by `***`.
pub fn preview(record: &[u8]) -> String {
    let shown = &record[..record.len().min(PREVIEW_BYTES)];
    let masked = mask_secrets(shown);
    let mut out = String::with_capacity(masked.len() + 8);
    for &b in &masked {
        match b {
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0 => out.push_str("\\0"),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    if record.len() > PREVIEW_BYTES {
        out.push_str(&format!("... ({} bytes in all)", record.len()));
    }
    out
}

/// Replaces secret values in `bytes` with `***`. A value runs from the
/// separator after a secret key (`=`, `:`, optionally quoted) to the next
/// delimiter; URL user information runs from `://` to `@`.
fn mask_secrets(bytes: &[u8]) -> Vec<u8> {
    let lower: Vec<u8> = bytes.iter().map(u8::to_ascii_lowercase).collect();
    let mut hide = vec![false; bytes.len()];
    for key in SECRET_KEYS {
        let key = key.as_bytes();
        let mut from = 0;
        while let Some(at) = find(&lower[from..], key).map(|i| i + from) {
            let mut i = at + key.len();
            // Skip the rest of the key (`password_hash`, `"token"`), then
            // the separator.
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            while i < bytes.len() && matches!(bytes[i], b'"' | b'\'' | b' ') {
                i += 1;
            }
            if i < bytes.len() && matches!(bytes[i], b'=' | b':') {
                i += 1;
                while i < bytes.len() && bytes[i] == b' ' {
                    i += 1;
                }
                // A quoted value ends at its closing quote, a bare one at the
                // next delimiter.
                let quote = bytes.get(i).copied().filter(|&q| q == b'"' || q == b'\'');
                if quote.is_some() {
                    i += 1;
                }
                while i < bytes.len() && !quote.map_or(is_value_end(bytes[i]), |q| bytes[i] == q) {
                    hide[i] = true;
                    i += 1;
                }
            }
            from = at + key.len();
        }
    }
    // scheme://user:secret@host
    let mut from = 0;
    while let Some(at) = find(&bytes[from..], b"://").map(|i| i + from) {
        let start = at + 3;
        let end = bytes[start..]
            .iter()
            .position(|&b| b == b'@' || b == b'/' || is_value_end(b))
            .map(|i| i + start);
        if let Some(end) = end.filter(|&e| bytes[e] == b'@') {
            if let Some(colon) = bytes[start..end].iter().position(|&b| b == b':') {
                for h in &mut hide[start + colon + 1..end] {
                    *h = true;
                }
            }
        }
        from = start;
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if hide[i] {
            out.extend_from_slice(b"***");
            while i < bytes.len() && hide[i] {
                i += 1;
            }
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

fn is_value_end(b: u8) -> bool {
    matches!(
        b,
        b'"' | b'\'' | b',' | b';' | b'&' | b' ' | b'\t' | b'\n' | b'\r' | b'}' | b']' | 0
    )
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_escape_and_mask() {
        assert_eq!(preview(b"a,b\tc\n\0\xff"), "a,b\\tc\\n\\0\\xff");
        assert_eq!(
            preview(b"user=x password=hunter2 z"),
            "user=x password=*** z"
        );
        assert_eq!(
            preview(b"{\"Token\": \"abc\", \"n\": 1}"),
            "{\"Token\": \"***\", \"n\": 1}"
        );
        assert_eq!(
            preview(b"postgres://app:s3cret@db/x"),
            "postgres://app:***@db/x"
        );
        assert_eq!(
            preview(b"pwd:x;db_password='q w'"),
            "pwd:***;db_password='***'"
        );
        let long = vec![b'a'; 100];
        assert!(preview(&long).ends_with("... (100 bytes in all)"));
        assert!(!preview(b"api_key=ZZZZ").contains("ZZZZ"));
    }

    /// The record-by-record answer the vectorised search must agree with.
    fn first_containing_naive<'a>(batch: &RecordBatch<'a>, byte: u8) -> Option<(u64, &'a [u8])> {
        batch
            .iter()
            .enumerate()
            .find(|(_, r)| r.contains(&byte))
            .map(|(i, r)| (i as u64, r))
    }

    #[test]
    fn a_byte_in_a_length_prefix_is_not_in_a_record() {
        let mut buf = Vec::new();
        push_record(&mut buf, b"0123456789"); // prefix 0x0A 0 0 0
        push_record(&mut buf, &[b'x'; 266]); // prefix 0x0A 0x01 0 0
        push_record(&mut buf, b"");
        let batch = RecordBatch::parse(&buf).unwrap();
        assert_eq!(batch.first_record_containing(b'\n'), None);
        push_record(&mut buf, b"two\nlines");
        push_record(&mut buf, b"more\n");
        let batch = RecordBatch::parse(&buf).unwrap();
        assert_eq!(
            batch.first_record_containing(b'\n'),
            Some((3, &b"two\nlines"[..]))
        );
    }

    #[test]
    fn the_vectorised_search_agrees_with_the_record_by_record_one() {
        // A small deterministic generator: records of every length around
        // the prefix values that hold the byte, the byte placed anywhere.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..2000 {
            let mut buf = Vec::new();
            for _ in 0..(next() % 12) {
                let len = match next() % 4 {
                    0 => 10,
                    1 => (next() % 300) as usize,
                    2 => 266,
                    _ => (next() % 20) as usize,
                };
                let mut record: Vec<u8> = (0..len).map(|_| b'a' + (next() % 26) as u8).collect();
                if len > 0 && next() % 6 == 0 {
                    let at = (next() as usize) % len;
                    record[at] = b'\n';
                }
                push_record(&mut buf, &record);
            }
            let batch = RecordBatch::parse(&buf).unwrap();
            assert_eq!(
                batch.first_record_containing(b'\n'),
                first_containing_naive(&batch, b'\n')
            );
        }
    }

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
