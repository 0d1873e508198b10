//! Is a record exactly one COPY row that PostgreSQL can take? Checked for
//! every record of a batch before any of it reaches the server.
//!
//! Why here and not by the server: a record that is not exactly one row
//! does not always fail. In the text format a record holding a line break
//! and then `\.` ends the COPY early; the server keeps what it read, and
//! when the record count happens to match the row count nothing notices
//! that records were dropped. A record ending in a lone backslash, or a CSV
//! record with an unclosed quote, swallows the line break after it and
//! merges with the next record. So the framing is ours to guarantee.
//!
//! The rest (invalid UTF-8, NUL bytes, the number of fields) the server
//! would refuse anyway, but only when the COPY ends, at prepare, for a row
//! somewhere in the transaction. Found here, the error names the record in
//! the batch that carried it. All of it is one pass over the bytes.
//!
//! What the checks follow is PostgreSQL's own reading of COPY data
//! (`copyfromparse.c`), with the client encoding UTF-8 (which the client
//! library always sets):
//!
//! * **text**: a row ends at LF or CR. A backslash escapes the next byte;
//!   `\.` is the end-of-data marker (PostgreSQL 12 to 17 end the COPY at
//!   `\.` followed by a line break anywhere in a line, and refuse it
//!   anywhere else). Fields are separated by unescaped tabs. Escapes are
//!   decoded before the encoding check, so `\000` (NUL) and `\xff` (not
//!   UTF-8) are refused as the server refuses them.
//! * **CSV**: a row ends at LF or CR outside double quotes. Every `"`
//!   toggles the quoted state (a doubled quote inside quotes is an escaped
//!   quote, which toggling twice leaves as it was). `\.` alone is the
//!   end-of-data marker. Fields are separated by commas outside quotes.

use std::fmt;

use crate::options::CopyFormat;

/// Why a record is not one row PostgreSQL can take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RowFault {
    /// The 0-based field the fault is in, when it is in one.
    pub field: Option<usize>,
    pub problem: Problem,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Problem {
    /// A raw LF or CR that ends the row (text: anywhere; CSV: outside
    /// quotes).
    LineBreak { offset: usize, byte: u8 },
    /// A text record that ends in a backslash escaping nothing: it would
    /// escape the line break that ends the row.
    TrailingBackslash,
    /// `\.`, PostgreSQL's end-of-data marker (text: unescaped anywhere;
    /// CSV: the whole record).
    EndMarker { offset: usize },
    /// A CSV quote opened and never closed.
    UnclosedQuote { offset: usize },
    /// A NUL byte, raw or (text) from an escape.
    Nul { offset: usize, escaped: bool },
    /// Bytes that are not UTF-8, raw or (text) from escapes.
    NotUtf8 { offset: usize, escaped: bool },
    /// Fewer or more fields than configured columns.
    FieldCount { found: usize, expected: usize },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::LineBreak { offset, byte } => write!(
                f,
                "it holds a {} (byte 0x{byte:02x} at offset {offset}) where a line break ends the \
                 row, so COPY would read what follows as another row (and a following \\. as the \
                 end of the data). A record must be exactly one row: escape line breaks (\\n, \\r) \
                 in the text format, or quote the field in CSV",
                if *byte == b'\n' {
                    "line feed"
                } else {
                    "carriage return"
                }
            ),
            Problem::TrailingBackslash => f.write_str(
                "it ends in a lone backslash, which would escape the line break that ends the row \
                 and join the next record to it. Write a backslash as \\\\ in the text format",
            ),
            Problem::EndMarker { offset } => write!(
                f,
                "it holds \\. (at offset {offset}), PostgreSQL's end-of-data marker: COPY would \
                 end there and silently drop what follows, or refuse the row. Write a backslash as \
                 \\\\ in the text format, or quote the field (\"\\.\") in CSV"
            ),
            Problem::UnclosedQuote { offset } => write!(
                f,
                "its quoted field opened at offset {offset} is never closed, so COPY would read the \
                 following records into it. Close the quote and double every quote inside it"
            ),
            Problem::Nul { offset, escaped } => write!(
                f,
                "it holds a NUL byte ({} at offset {offset}), which PostgreSQL cannot store in text \
                 (invalid byte sequence for encoding \"UTF8\": 0x00). Remove NUL bytes, or write \
                 binary values as bytea hex",
                if *escaped { "from an escape" } else { "raw" }
            ),
            Problem::NotUtf8 { offset, escaped } => write!(
                f,
                "it is not valid UTF-8 ({} at offset {offset}); the connection's client encoding \
                 is UTF-8, so PostgreSQL refuses it. Encode text as UTF-8, or write binary values \
                 as bytea hex",
                if *escaped {
                    "bytes from escapes"
                } else {
                    "a byte sequence"
                }
            ),
            Problem::FieldCount { found, expected } if found < expected => write!(
                f,
                "it has {found} field{} but {expected} columns are configured, so data for the \
                 remaining columns is missing. Each record must carry one field per configured \
                 column, in order",
                if *found == 1 { "" } else { "s" }
            ),
            Problem::FieldCount { found, expected } => write!(
                f,
                "it has {found} fields but only {expected} column{} configured, so PostgreSQL \
                 would refuse the extra data after the last column. Each record must carry one \
                 field per configured column, in order (a delimiter inside a value must be \
                 escaped in the text format, or the value quoted in CSV)",
                if *expected == 1 { " is" } else { "s are" },
            ),
        }
    }
}

/// Checks that `record` is exactly one row of `format` with `fields`
/// fields that PostgreSQL can store.
pub(crate) fn check(format: CopyFormat, fields: usize, record: &[u8]) -> Result<(), RowFault> {
    let scan = match format {
        CopyFormat::Text => scan_text(record)?,
        CopyFormat::Csv => scan_csv(record)?,
    };
    if scan.non_ascii {
        if let Err(e) = std::str::from_utf8(record) {
            let offset = e.valid_up_to();
            return Err(RowFault {
                field: Some(field_at(format, record, offset)),
                problem: Problem::NotUtf8 {
                    offset,
                    escaped: false,
                },
            });
        }
    }
    if scan.fields != fields {
        return Err(RowFault {
            // The first column without data; none when there is too much.
            field: (scan.fields < fields).then_some(scan.fields),
            problem: Problem::FieldCount {
                found: scan.fields,
                expected: fields,
            },
        });
    }
    Ok(())
}

struct Scan {
    fields: usize,
    non_ascii: bool,
}

fn fault(field: usize, problem: Problem) -> RowFault {
    RowFault {
        field: Some(field),
        problem,
    }
}

fn scan_text(record: &[u8]) -> Result<Scan, RowFault> {
    let mut field = 0;
    let mut field_start = 0;
    // Whether the current field holds an escape that can yield a byte
    // outside ASCII or a NUL: then its decoded value is checked too.
    let mut decode = false;
    let mut non_ascii = false;
    let mut i = 0;
    while i < record.len() {
        match record[i] {
            b'\n' | b'\r' => {
                return Err(fault(
                    field,
                    Problem::LineBreak {
                        offset: i,
                        byte: record[i],
                    },
                ))
            }
            0 => {
                return Err(fault(
                    field,
                    Problem::Nul {
                        offset: i,
                        escaped: false,
                    },
                ))
            }
            b'\t' => {
                if decode {
                    check_escapes(&record[field_start..i], field_start, field)?;
                }
                field += 1;
                field_start = i + 1;
                decode = false;
            }
            b'\\' => {
                let Some(&next) = record.get(i + 1) else {
                    return Err(fault(field, Problem::TrailingBackslash));
                };
                match next {
                    b'.' => return Err(fault(field, Problem::EndMarker { offset: i })),
                    // Escaped or not, a raw line break ends the line the
                    // server reads (a backslash before it is an obsolete
                    // way to write a data line break that it may refuse).
                    b'\n' | b'\r' => {
                        return Err(fault(
                            field,
                            Problem::LineBreak {
                                offset: i + 1,
                                byte: next,
                            },
                        ))
                    }
                    0 => {
                        return Err(fault(
                            field,
                            Problem::Nul {
                                offset: i + 1,
                                escaped: false,
                            },
                        ))
                    }
                    b'0'..=b'7' | b'x' => decode = true,
                    b if b >= 0x80 => non_ascii = true,
                    _ => {}
                }
                // The escaped byte is data, even a tab.
                i += 2;
                continue;
            }
            b if b >= 0x80 => non_ascii = true,
            _ => {}
        }
        i += 1;
    }
    if decode {
        check_escapes(&record[field_start..], field_start, field)?;
    }
    Ok(Scan {
        fields: field + 1,
        non_ascii,
    })
}

/// Decodes the escapes of one text field (`raw`, starting at `start` in
/// the record) and checks that the value is UTF-8 without NUL, as the server
/// does after decoding.
fn check_escapes(raw: &[u8], start: usize, field: usize) -> Result<(), RowFault> {
    let mut value = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b != b'\\' || i + 1 == raw.len() {
            value.push(b);
            i += 1;
            continue;
        }
        let escape_at = start + i;
        let c = raw[i + 1];
        i += 2;
        let byte = match c {
            b'0'..=b'7' => {
                // Up to three octal digits; the value is taken modulo 256.
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    match raw.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                (v & 0xff) as u8
            }
            b'x' => match raw.get(i).and_then(|&d| hex(d)) {
                Some(high) => {
                    i += 1;
                    match raw.get(i).and_then(|&d| hex(d)) {
                        Some(low) => {
                            i += 1;
                            high * 16 + low
                        }
                        None => high,
                    }
                }
                // `\x` without a hex digit is the letter x.
                None => b'x',
            },
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'v' => 0x0b,
            other => other,
        };
        if byte == 0 {
            return Err(fault(
                field,
                Problem::Nul {
                    offset: escape_at,
                    escaped: true,
                },
            ));
        }
        value.push(byte);
    }
    if std::str::from_utf8(&value).is_err() {
        // Offsets in the decoded value do not map back byte for byte; the
        // field's start is where to look.
        return Err(fault(
            field,
            Problem::NotUtf8 {
                offset: start,
                escaped: true,
            },
        ));
    }
    Ok(())
}

fn hex(d: u8) -> Option<u8> {
    (d as char).to_digit(16).map(|v| v as u8)
}

fn scan_csv(record: &[u8]) -> Result<Scan, RowFault> {
    if record == b"\\." {
        return Err(fault(0, Problem::EndMarker { offset: 0 }));
    }
    let mut field = 0;
    // Where the open quote began; a doubled quote reopens the same one.
    let mut quoted_at: Option<usize> = None;
    let mut closed: Option<(usize, usize)> = None;
    let mut non_ascii = false;
    for (i, &b) in record.iter().enumerate() {
        match b {
            b'"' => match quoted_at.take() {
                Some(opened) => closed = Some((i, opened)),
                None => {
                    quoted_at = Some(match closed {
                        Some((at, opened)) if at + 1 == i => opened,
                        _ => i,
                    })
                }
            },
            b',' if quoted_at.is_none() => field += 1,
            b'\n' | b'\r' if quoted_at.is_none() => {
                return Err(fault(field, Problem::LineBreak { offset: i, byte: b }))
            }
            0 => {
                return Err(fault(
                    field,
                    Problem::Nul {
                        offset: i,
                        escaped: false,
                    },
                ))
            }
            b if b >= 0x80 => non_ascii = true,
            _ => {}
        }
    }
    if let Some(offset) = quoted_at {
        return Err(fault(field, Problem::UnclosedQuote { offset }));
    }
    Ok(Scan {
        fields: field + 1,
        non_ascii,
    })
}

/// The 0-based field that byte `offset` of a record (already found free of
/// framing faults) is in.
fn field_at(format: CopyFormat, record: &[u8], offset: usize) -> usize {
    let mut field = 0;
    let mut quoted = false;
    let mut i = 0;
    while i < offset.min(record.len()) {
        match (format, record[i]) {
            (CopyFormat::Text, b'\\') => i += 1,
            (CopyFormat::Text, b'\t') => field += 1,
            (CopyFormat::Csv, b'"') => quoted = !quoted,
            (CopyFormat::Csv, b',') if !quoted => field += 1,
            _ => {}
        }
        i += 1;
    }
    field
}

/// Which record a line number of a COPY error means.
///
/// PostgreSQL numbers the lines of a COPY by counting every row, plus, in
/// CSV, the line breaks inside quoted fields, but not all of them: its
/// line reader counts a quoted character equal to the line end in use, and
/// that is known only from the first row's end on (`copyfromparse.c`: "if
/// (in_quote && c == (eol_type == EOL_NL ? '\n' : '\r')) cur_lineno++").
/// Every row the sink sends ends in LF, so the first row's quoted CRs count,
/// and after it the quoted LFs. An error names the line the counter is on:
/// the last line of the refused row. The text format has no raw line breaks
/// in a row (checked), so there line N is simply record N-1.
///
/// Only CSV records that span several lines cost memory: from the first of
/// them on, one byte per record.
#[derive(Debug, Default)]
pub(crate) struct LineMap {
    /// The first record that adds lines, if any.
    first: Option<u64>,
    /// From `first` on, the lines each record adds (255: see `many`).
    added: Vec<u8>,
    /// (record, lines it adds) for those that add 255 or more.
    many: Vec<(u64, u64)>,
}

impl LineMap {
    /// Notes record `index` of the COPY (0-based; records come in order).
    pub fn push(&mut self, index: u64, record: &[u8], format: CopyFormat) {
        let added = match format {
            CopyFormat::Text => 0,
            CopyFormat::Csv => {
                // A checked CSV record has line breaks only inside quotes.
                let counted = if index == 0 { b'\r' } else { b'\n' };
                record.iter().filter(|&&b| b == counted).count() as u64
            }
        };
        if self.first.is_none() {
            if added == 0 {
                return;
            }
            self.first = Some(index);
        }
        if added >= u64::from(u8::MAX) {
            self.many.push((index, added));
        }
        self.added.push(u8::try_from(added).unwrap_or(u8::MAX));
    }

    /// The 0-based record whose lines include the 1-based `line`.
    pub fn record_of(&self, line: u64) -> Option<u64> {
        let Some(first) = self.first else {
            return line.checked_sub(1);
        };
        if line <= first {
            return line.checked_sub(1);
        }
        // Records before `first` take one line each.
        let mut last_line = first;
        for (i, &added) in self.added.iter().enumerate() {
            let index = first + i as u64;
            let added = if added == u8::MAX {
                self.many.iter().find(|(r, _)| *r == index)?.1
            } else {
                u64::from(added)
            };
            last_line += 1 + added;
            if line <= last_line {
                return Some(index);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(record: &[u8], fields: usize) -> Result<(), RowFault> {
        check(CopyFormat::Text, fields, record)
    }

    fn csv(record: &[u8], fields: usize) -> Result<(), RowFault> {
        check(CopyFormat::Csv, fields, record)
    }

    fn problem(r: Result<(), RowFault>) -> (Option<usize>, Problem) {
        let f = r.expect_err("the record must be refused");
        (f.field, f.problem)
    }

    #[test]
    fn text_rows_that_are_fine_pass() {
        for ok in [
            &b"1\tplain"[..],
            b"2\t\\N",
            b"3\ttab\\there\\nand a line break",
            b"4\tescaped tab\\\tinside",
            b"5\tback\\\\slash\\\\",
            b"6\t\\x41\\101\\xc3\\xa9 (A, A, e acute)",
            b"7\tcaf\xc3\xa9",
            b"8\t",
        ] {
            text(ok, 2).unwrap_or_else(|e| panic!("{:?}: {e:?}", String::from_utf8_lossy(ok)));
        }
        // One column: a record without tabs.
        text(b"just one", 1).unwrap();
        text(b"", 1).unwrap();
    }

    #[test]
    fn text_framing_faults_are_found() {
        assert_eq!(
            problem(text(b"1\ta\n2\tb", 2)),
            (
                Some(1),
                Problem::LineBreak {
                    offset: 3,
                    byte: b'\n'
                }
            )
        );
        assert_eq!(
            problem(text(b"1\ta\rb", 2)),
            (
                Some(1),
                Problem::LineBreak {
                    offset: 3,
                    byte: b'\r'
                }
            )
        );
        // The injection of issue 9: a line break, then the end marker.
        assert!(matches!(
            problem(text(b"1\ta\n\\.\n3\tc", 2)).1,
            Problem::LineBreak { offset: 3, .. }
        ));
        // `\.` alone, and where PostgreSQL 12-17 would end the COPY.
        assert_eq!(
            problem(text(b"\\.", 1)),
            (Some(0), Problem::EndMarker { offset: 0 })
        );
        assert_eq!(
            problem(text(b"1\tbad\\.", 2)),
            (Some(1), Problem::EndMarker { offset: 5 })
        );
        assert_eq!(
            problem(text(b"1\tbad\\.more", 2)),
            (Some(1), Problem::EndMarker { offset: 5 })
        );
        // An escaped backslash before the dot is data.
        text(b"1\tfine\\\\.", 2).unwrap();
        // A lone trailing backslash escapes the row's line break.
        assert_eq!(
            problem(text(b"1\tends in\\", 2)),
            (Some(1), Problem::TrailingBackslash)
        );
        // A backslash before a raw line break is still a line break.
        assert!(matches!(
            problem(text(b"1\ta\\\nb", 2)).1,
            Problem::LineBreak { offset: 4, .. }
        ));
    }

    #[test]
    fn text_nul_and_encoding_faults_are_found_raw_and_escaped() {
        assert_eq!(
            problem(text(b"1\ta\0b", 2)),
            (
                Some(1),
                Problem::Nul {
                    offset: 3,
                    escaped: false
                }
            )
        );
        for escaped_nul in [
            &b"1\ta\\0"[..],
            b"1\ta\\000b",
            b"1\t\\x0",
            b"1\t\\x00",
            b"1\t\\400",
        ] {
            assert!(
                matches!(
                    problem(text(escaped_nul, 2)),
                    (Some(1), Problem::Nul { escaped: true, .. })
                ),
                "{:?}",
                String::from_utf8_lossy(escaped_nul)
            );
        }
        assert_eq!(
            problem(text(b"1\tok\t\xff", 3)),
            (
                Some(2),
                Problem::NotUtf8 {
                    offset: 5,
                    escaped: false
                }
            )
        );
        // Cut in the middle of a two-byte sequence.
        assert!(matches!(
            problem(text(b"caf\xc3", 1)),
            (Some(0), Problem::NotUtf8 { offset: 3, .. })
        ));
        for escaped_bad in [&b"1\t\\xff"[..], b"1\t\\377", b"1\t\\xc3x"] {
            assert!(
                matches!(
                    problem(text(escaped_bad, 2)),
                    (Some(1), Problem::NotUtf8 { escaped: true, .. })
                ),
                "{:?}",
                String::from_utf8_lossy(escaped_bad)
            );
        }
    }

    #[test]
    fn text_field_counts_follow_unescaped_tabs() {
        assert_eq!(
            problem(text(b"1", 2)),
            (
                Some(1),
                Problem::FieldCount {
                    found: 1,
                    expected: 2
                }
            )
        );
        assert_eq!(
            problem(text(b"1\t2\t3", 2)),
            (
                None,
                Problem::FieldCount {
                    found: 3,
                    expected: 2
                }
            )
        );
        text(b"1\ttwo\\\tstill two", 2).unwrap();
        text(b"\t", 2).unwrap();
    }

    #[test]
    fn csv_rows_that_are_fine_pass() {
        for ok in [
            &b"1,plain"[..],
            b"2,\"with, comma\"",
            b"3,\"two\nlines\"",
            b"4,\"a \"\"quote\"\"\"",
            b"5,",
            b"6,\"crlf\r\ninside\"",
            b"7,\"\\.\"",
            b"8,back\\slash",
            b"9,\"\\.\n\"",
            b"10,caf\xc3\xa9",
        ] {
            csv(ok, 2).unwrap_or_else(|e| panic!("{:?}: {e:?}", String::from_utf8_lossy(ok)));
        }
    }

    #[test]
    fn csv_faults_are_found() {
        assert_eq!(
            problem(csv(b"1,a\n2,b", 2)),
            (
                Some(1),
                Problem::LineBreak {
                    offset: 3,
                    byte: b'\n'
                }
            )
        );
        // The injection of issue 9 in CSV: a line break, then the marker.
        assert!(matches!(
            problem(csv(b"1,a\n\\.\n3,c", 2)).1,
            Problem::LineBreak { offset: 3, .. }
        ));
        assert_eq!(
            problem(csv(b"\\.", 1)),
            (Some(0), Problem::EndMarker { offset: 0 })
        );
        // A doubled quote inside quotes does not close them.
        assert_eq!(
            problem(csv(b"1,\"a\"\"\nb", 2)),
            (Some(1), Problem::UnclosedQuote { offset: 2 })
        );
        // A line break after a closed quote ends the row.
        assert!(matches!(
            problem(csv(b"1,\"a\"\r", 2)).1,
            Problem::LineBreak { byte: b'\r', .. }
        ));
        assert_eq!(
            problem(csv(b"1,a\0", 2)),
            (
                Some(1),
                Problem::Nul {
                    offset: 3,
                    escaped: false
                }
            )
        );
        assert_eq!(
            problem(csv(b"1,\"x,\xfe\"", 2)),
            (
                Some(1),
                Problem::NotUtf8 {
                    offset: 5,
                    escaped: false
                }
            )
        );
        assert_eq!(
            problem(csv(b"1,\"a,b\",c", 2)),
            (
                None,
                Problem::FieldCount {
                    found: 3,
                    expected: 2
                }
            )
        );
        assert_eq!(
            problem(csv(b"1", 3)).0,
            Some(1),
            "the first column without data"
        );
    }

    #[test]
    fn line_numbers_map_to_records_as_postgresql_counts_them() {
        // Text: one line per record.
        let mut text = LineMap::default();
        for i in 0..5 {
            text.push(i, b"1\tx", CopyFormat::Text);
        }
        assert_eq!(text.record_of(1), Some(0));
        assert_eq!(text.record_of(4), Some(3));
        assert_eq!(text.record_of(0), None);
        // CSV, as PostgreSQL 15 numbered these rows (checked with psql):
        // the first row's quoted LFs do not count, later ones do, and an
        // error names the row's last line.
        let rows: [&[u8]; 4] = [
            b"1,\"a\nb\nc\"",
            b"2,\"b\nc\"",
            b"3,\"b\nc\nd\ne\"",
            b"x4,b",
        ];
        let mut csv = LineMap::default();
        for (i, r) in rows.iter().enumerate() {
            csv.push(i as u64, r, CopyFormat::Csv);
        }
        assert_eq!(csv.record_of(1), Some(0));
        assert_eq!(csv.record_of(3), Some(1));
        assert_eq!(csv.record_of(7), Some(2));
        assert_eq!(csv.record_of(8), Some(3));
        assert_eq!(csv.record_of(9), None);
        // The first row's quoted CRs count (the line end is not known yet).
        let mut cr = LineMap::default();
        cr.push(0, b"1,\"a\r\rb\"", CopyFormat::Csv);
        cr.push(1, b"2,\"a\rb\"", CopyFormat::Csv);
        assert_eq!(cr.record_of(3), Some(0));
        assert_eq!(cr.record_of(4), Some(1));
        // Plain rows before the first multi-line one, and a row of many lines.
        let mut many = LineMap::default();
        many.push(0, b"1,a", CopyFormat::Csv);
        many.push(1, b"2,b", CopyFormat::Csv);
        let long = format!("3,\"{}\"", "\n".repeat(300));
        many.push(2, long.as_bytes(), CopyFormat::Csv);
        many.push(3, b"4,d", CopyFormat::Csv);
        assert_eq!(many.record_of(2), Some(1));
        assert_eq!(many.record_of(303), Some(2));
        assert_eq!(many.record_of(304), Some(3));
    }

    #[test]
    fn every_problem_says_what_to_do() {
        for p in [
            Problem::LineBreak {
                offset: 1,
                byte: b'\n',
            },
            Problem::TrailingBackslash,
            Problem::EndMarker { offset: 0 },
            Problem::UnclosedQuote { offset: 0 },
            Problem::Nul {
                offset: 0,
                escaped: true,
            },
            Problem::NotUtf8 {
                offset: 0,
                escaped: false,
            },
            Problem::FieldCount {
                found: 1,
                expected: 2,
            },
            Problem::FieldCount {
                found: 3,
                expected: 2,
            },
        ] {
            let s = p.to_string();
            assert!(
                [
                    "Escape",
                    "escape",
                    "Write",
                    "Close",
                    "Remove",
                    "Encode",
                    "Each record"
                ]
                .iter()
                .any(|w| s.contains(w)),
                "{s}"
            );
        }
    }
}
