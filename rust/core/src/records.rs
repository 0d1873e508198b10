//! Record batches as they cross from the JVM: many records in one buffer, so
//! that one native call carries thousands of records.
//!
//! A batch comes in two parts, filled side by side by the JVM:
//!
//! ```text
//! data := (bytes terminator?)*        records back to back, in output form
//! ends := end (u32, little endian)*   one per record: where it ends in `data`,
//!                                     its terminator included
//! ```
//!
//! The records are laid out as a line-oriented destination writes them
//! (`terminator` is the line break of the LINES format, or none): such a
//! destination checks a batch with one vectorised count and appends it
//! with one copy, with no work per record. The separate `ends` tell every
//! record apart without looking at its bytes, for destinations that take
//! records one by one (rows of a table) and to name a refused record.

/// A malformed batch. Nothing of the batch has been written when this is
/// returned: the batch is validated before any record reaches a destination.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("record batch is malformed at record {record}: {reason} (batch of {records} records, {len} bytes); this is a bug in the caller, please report it")]
    Malformed {
        record: usize,
        records: usize,
        len: usize,
        reason: &'static str,
    },
}

/// The two parts of a batch as they arrive, not yet validated.
#[derive(Clone, Copy, Debug)]
pub struct BatchParts<'a> {
    /// The records in output form, back to back.
    pub data: &'a [u8],
    /// Each record's end offset in `data` (its terminator included), as
    /// little-endian `u32`s.
    pub ends: &'a [u8],
    /// The byte that follows every record in `data`, if any.
    pub terminator: Option<u8>,
}

/// A validated batch of records.
#[derive(Clone, Copy, Debug)]
pub struct RecordBatch<'a> {
    data: &'a [u8],
    ends: &'a [u8],
    terminator: Option<u8>,
    count: u64,
}

impl<'a> RecordBatch<'a> {
    /// Validates the whole batch up front: the ends rise, stay within the
    /// data and cover all of it, and each record is followed by the
    /// terminator.
    pub fn new(parts: BatchParts<'a>) -> Result<Self, BatchError> {
        let BatchParts {
            data,
            ends,
            terminator,
        } = parts;
        let records = ends.len() / 4;
        let malformed = |record: usize, reason: &'static str| BatchError::Malformed {
            record,
            records,
            len: data.len(),
            reason,
        };
        if ends.len() % 4 != 0 {
            return Err(malformed(records, "the record ends are cut short"));
        }
        let tlen = usize::from(terminator.is_some());
        let mut start = 0usize;
        for (i, end) in ends.chunks_exact(4).enumerate() {
            let end = u32::from_le_bytes([end[0], end[1], end[2], end[3]]) as usize;
            if end < start + tlen {
                return Err(malformed(i, "record ends before it starts"));
            }
            if end > data.len() {
                return Err(malformed(i, "record runs past the end of the batch"));
            }
            if let Some(t) = terminator {
                if data[end - 1] != t {
                    return Err(malformed(i, "record is not followed by the terminator"));
                }
            }
            start = end;
        }
        if start != data.len() {
            return Err(malformed(records, "bytes after the last record"));
        }
        Ok(RecordBatch {
            data,
            ends,
            terminator,
            count: records as u64,
        })
    }

    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Sum of the record lengths, without terminators.
    pub fn payload_bytes(&self) -> u64 {
        self.data.len() as u64 - self.count * u64::from(self.terminator.is_some())
    }

    /// The whole batch as a destination writes it that follows every
    /// record with `terminator` (or with nothing), if the batch is laid out
    /// that way: one copy instead of one per record.
    pub fn output_form(&self, terminator: Option<u8>) -> Option<&'a [u8]> {
        (self.terminator == terminator).then_some(self.data)
    }

    pub fn iter(&self) -> RecordIter<'a> {
        RecordIter {
            data: self.data,
            ends: self.ends.chunks_exact(4),
            start: 0,
            tlen: usize::from(self.terminator.is_some()),
        }
    }

    /// The record at `index`, if there is one.
    pub fn get(&self, index: u64) -> Option<&'a [u8]> {
        let i = usize::try_from(index).ok()?;
        let end_of = |i: usize| -> Option<usize> {
            let e = self.ends.get(i * 4..i * 4 + 4)?;
            Some(u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize)
        };
        let start = if i == 0 { 0 } else { end_of(i - 1)? };
        let end = end_of(i)? - usize::from(self.terminator.is_some());
        self.data.get(start..end)
    }

    /// The first record (its 0-based position and bytes) that contains
    /// `byte`, if any.
    ///
    /// When `byte` is the batch's terminator, one vectorised count over the
    /// whole batch answers for the usual case: as many as there are records
    /// means each is a terminator. Otherwise the hits of one vectorised
    /// search are mapped to records through the ends.
    pub fn first_record_containing(&self, byte: u8) -> Option<(u64, &'a [u8])> {
        let is_terminator = self.terminator == Some(byte);
        if is_terminator && memchr::memchr_iter(byte, self.data).count() as u64 == self.count {
            return None;
        }
        let mut ends = self
            .ends
            .chunks_exact(4)
            .map(|e| u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize);
        let mut index = 0u64;
        let mut end = ends.next()?; // end of record `index`, its terminator included
        for hit in memchr::memchr_iter(byte, self.data) {
            // Move to the record that holds `hit` (empty records end where
            // they start and are passed over).
            while hit >= end {
                end = ends.next()?;
                index += 1;
            }
            if is_terminator && hit == end - 1 {
                continue;
            }
            return self.get(index).map(|r| (index, r));
        }
        None
    }
}

/// Iterates over the records of a validated batch, terminators left out.
pub struct RecordIter<'a> {
    data: &'a [u8],
    ends: std::slice::ChunksExact<'a, u8>,
    start: usize,
    tlen: usize,
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let e = self.ends.next()?;
        let end = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize;
        // The batch was validated in `new`, so the slice is in bounds;
        // `get` keeps it panic-free regardless.
        let record = self.data.get(self.start..end.checked_sub(self.tlen)?)?;
        self.start = end;
        Some(record)
    }
}

/// An owned batch, built record by record: for tests, tools and the CLI
/// (the JVM side fills the same two parts in direct buffers).
#[derive(Clone, Debug, Default)]
pub struct RecordBatchBuf {
    data: Vec<u8>,
    ends: Vec<u8>,
    terminator: Option<u8>,
}

impl RecordBatchBuf {
    /// Records back to back, without terminators.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every record followed by `terminator` (the LINES format's `\n`).
    pub fn terminated_by(terminator: u8) -> Self {
        RecordBatchBuf {
            terminator: Some(terminator),
            ..Self::default()
        }
    }

    pub fn push(&mut self, record: &[u8]) -> &mut Self {
        self.data.extend_from_slice(record);
        if let Some(t) = self.terminator {
            self.data.push(t);
        }
        let end = u32::try_from(self.data.len()).expect("a batch stays below 4 GiB");
        self.ends.extend_from_slice(&end.to_le_bytes());
        self
    }

    pub fn from_records<R: AsRef<[u8]>>(records: impl IntoIterator<Item = R>) -> Self {
        let mut b = Self::new();
        for r in records {
            b.push(r.as_ref());
        }
        b
    }

    pub fn len(&self) -> usize {
        self.ends.len() / 4
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn parts(&self) -> BatchParts<'_> {
        BatchParts {
            data: &self.data,
            ends: &self.ends,
            terminator: self.terminator,
        }
    }

    /// The parts, for tests that corrupt them.
    pub fn into_parts(self) -> (Vec<u8>, Vec<u8>, Option<u8>) {
        (self.data, self.ends, self.terminator)
    }

    /// The validated batch (always valid: built record by record).
    pub fn batch(&self) -> RecordBatch<'_> {
        RecordBatch::new(self.parts()).expect("a batch built record by record is valid")
    }
}

impl<'a> From<&'a RecordBatchBuf> for BatchParts<'a> {
    fn from(b: &'a RecordBatchBuf) -> Self {
        b.parts()
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
             schema (a CSV value in quotes may hold one: replace it in the query). The record \
             format RAW ('sink.record-format' = 'raw' in SQL) writes records back to back with \
             no separator at all: choose it only when each record ends in a delimiter of its \
             own, which Flink's csv, json and raw formats do not write",
            record.len()
        ),
        preview: preview(record),
    })
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

    /// Both layouts: records back to back, and in LINES output form.
    fn both_layouts() -> [RecordBatchBuf; 2] {
        [RecordBatchBuf::new(), RecordBatchBuf::terminated_by(b'\n')]
    }

    #[test]
    fn a_terminator_is_not_in_a_record() {
        for mut buf in both_layouts() {
            buf.push(b"0123456789").push(&[b'x'; 266]).push(b"");
            assert_eq!(buf.batch().first_record_containing(b'\n'), None);
            buf.push(b"two\nlines").push(b"more\n");
            assert_eq!(
                buf.batch().first_record_containing(b'\n'),
                Some((3, &b"two\nlines"[..]))
            );
        }
    }

    #[test]
    fn the_vectorised_search_agrees_with_the_record_by_record_one() {
        // A small deterministic generator: records of every length, empty
        // ones among them, the byte placed anywhere, in both layouts.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..4000 {
            let mut buf = both_layouts()[round % 2].clone();
            for _ in 0..(next() % 12) {
                let len = match next() % 4 {
                    0 => 0,
                    1 => (next() % 300) as usize,
                    2 => 1,
                    _ => (next() % 20) as usize,
                };
                let mut record: Vec<u8> = (0..len).map(|_| b'a' + (next() % 26) as u8).collect();
                if len > 0 && next() % 6 == 0 {
                    let at = (next() as usize) % len;
                    record[at] = b'\n';
                }
                buf.push(&record);
            }
            let batch = buf.batch();
            for byte in [b'\n', b'a'] {
                assert_eq!(
                    batch.first_record_containing(byte),
                    first_containing_naive(&batch, byte)
                );
            }
        }
    }

    #[test]
    fn builds_validates_and_iterates() {
        for mut buf in both_layouts() {
            buf.push(b"a").push(b"").push(b"hello");
            let batch = buf.batch();
            assert_eq!(batch.len(), 3);
            assert_eq!(batch.payload_bytes(), 6);
            let v: Vec<&[u8]> = batch.iter().collect();
            assert_eq!(v, vec![&b"a"[..], &b""[..], &b"hello"[..]]);
            assert_eq!(batch.get(2), Some(&b"hello"[..]));
            assert_eq!(batch.get(1), Some(&b""[..]));
            assert_eq!(batch.get(3), None);
        }
        let mut lines = RecordBatchBuf::terminated_by(b'\n');
        lines.push(b"a").push(b"bc");
        assert_eq!(
            lines.batch().output_form(Some(b'\n')),
            Some(&b"a\nbc\n"[..])
        );
        assert_eq!(lines.batch().output_form(None), None);
        let raw = RecordBatchBuf::from_records(["a", "bc"]);
        assert_eq!(raw.batch().output_form(Some(b'\n')), None);
        assert_eq!(raw.batch().output_form(None), Some(&b"abc"[..]));
    }

    #[test]
    fn empty_batch_is_valid() {
        for buf in both_layouts() {
            assert!(buf.batch().is_empty());
        }
    }

    fn ends(values: &[u32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn malformed_batches_are_rejected() {
        let check = |data: &[u8], ends: &[u8], terminator: Option<u8>, reason: &str| {
            let err = RecordBatch::new(BatchParts {
                data,
                ends,
                terminator,
            })
            .unwrap_err();
            assert!(err.to_string().contains(reason), "{err}");
        };
        check(b"hello", &ends(&[3, 2]), None, "ends before it starts");
        check(b"hello", &ends(&[6]), None, "past the end");
        check(b"hello", &ends(&[u32::MAX]), None, "past the end");
        check(b"hello", &ends(&[4]), None, "bytes after the last record");
        check(b"hello", &[], None, "bytes after the last record");
        check(b"hello", &ends(&[5])[..3], None, "cut short");
        check(
            b"hello",
            &ends(&[5]),
            Some(b'\n'),
            "not followed by the terminator",
        );
        check(
            b"a\n\n",
            &ends(&[2, 2, 3]),
            Some(b'\n'),
            "ends before it starts",
        );
        check(b"", &ends(&[0]), Some(b'\n'), "ends before it starts");
        // And every cut of a good batch's parts.
        let mut buf = RecordBatchBuf::terminated_by(b'\n');
        buf.push(b"hello").push(b"").push(b"x");
        let (data, e, t) = buf.into_parts();
        for cut in 0..data.len() {
            let parts = BatchParts {
                data: &data[..cut],
                ends: &e,
                terminator: t,
            };
            assert!(RecordBatch::new(parts).is_err(), "cut {cut}");
        }
        for cut in 0..e.len() {
            let parts = BatchParts {
                data: &data,
                ends: &e[..cut],
                terminator: t,
            };
            assert!(RecordBatch::new(parts).is_err(), "cut {cut}");
        }
    }
}
