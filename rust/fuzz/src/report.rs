//! Hex for failure reports: one line to paste into `--hex`, and a dump to
//! read.

use std::fmt::Write;

pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

pub fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    if digits.len() % 2 != 0 {
        return Err(format!("{} hex digits: an odd number", digits.len()));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).map_err(|_| "not hex".to_string())?;
            u8::from_str_radix(text, 16).map_err(|_| format!("{text:?} is not a hex byte"))
        })
        .collect()
}

/// Offset, 16 bytes in hex, the same bytes as printable ASCII.
pub fn dump(bytes: &[u8]) -> String {
    let mut s = String::new();
    for (row, chunk) in bytes.chunks(16).enumerate() {
        let _ = write!(s, "  {:06x}  ", row * 16);
        for i in 0..16 {
            match chunk.get(i) {
                Some(b) => {
                    let _ = write!(s, "{b:02x} ");
                }
                None => s.push_str("   "),
            }
        }
        s.push(' ');
        for &b in chunk {
            s.push(if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '.'
            });
        }
        s.push('\n');
    }
    if bytes.is_empty() {
        s.push_str("  (empty)\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&b), "0001abff");
        assert_eq!(parse_hex("00 01 AB ff").unwrap(), b);
        assert!(parse_hex("abc").is_err());
        assert!(parse_hex("zz").is_err());
    }

    #[test]
    fn dump_shows_offsets_and_text() {
        let d = dump(b"TWPC\x00\x01 seventeen bytes");
        assert!(d.starts_with("  000000  54 57 50 43 00 01"));
        assert!(d.contains("TWPC.. seventeen"));
        assert!(d.contains("  000010  "));
    }
}
