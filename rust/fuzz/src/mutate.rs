//! Structure-aware mutation of valid encodings.
//!
//! Random bytes almost never get past a checksum, so a fuzzer that only
//! flips bits tests the framing and nothing behind it. Each framing here
//! knows where its length fields and checksum are, mutates the part behind
//! them and repairs them afterwards, so most inputs reach the body decoder
//! and the validation after it; a share of inputs is left unrepaired so the
//! framing checks themselves stay covered.

use twopc_core::envelope::{crc32, HEADER_LEN, MAX_BODY_LEN, TRAILER_LEN};

use crate::rng::Rng;

/// How a target's bytes are framed, i.e. what a mutation must repair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// The versioned envelope of `twopc_core::envelope`: header with a body
    /// length, bincode body, CRC-32 trailer.
    Envelope,
    /// A record batch's two parts: a count, the records' end offsets, a
    /// terminator, the data.
    RecordEnds,
    /// A name made of fields separated by `.` and `-` (ids, file names).
    Text,
    /// No structure known: byte mutations only.
    Bytes,
}

/// A mutated input; `valid` is true when it is a valid encoding left
/// untouched, which the decoder must accept.
pub struct Mutated {
    pub bytes: Vec<u8>,
    pub valid: bool,
}

/// Mutates `valid`, a valid encoding. `donor` makes another valid encoding
/// of the same target, for splicing.
pub fn mutate(
    rng: &mut Rng,
    framing: Framing,
    valid: Vec<u8>,
    donor: &dyn Fn(&mut Rng) -> Vec<u8>,
) -> Mutated {
    let roll = rng.below(100);
    if roll < 4 {
        return Mutated {
            bytes: valid,
            valid: true,
        };
    }
    let bytes = if roll < 8 {
        random_input(rng)
    } else {
        match framing {
            Framing::Envelope => envelope(rng, valid, donor),
            Framing::RecordEnds => record_ends(rng, valid, donor),
            Framing::Text => text(rng, valid, donor),
            Framing::Bytes => {
                let mut b = valid;
                byte_ops(rng, &mut b, donor);
                b
            }
        }
    };
    Mutated {
        bytes,
        valid: false,
    }
}

/// Fully random bytes, sometimes behind the envelope's magic so they get
/// one check further.
fn random_input(rng: &mut Rng) -> Vec<u8> {
    let len = if rng.percent(2) {
        rng.range(1024, 16 * 1024) as usize
    } else {
        rng.length(96)
    };
    let mut b = rng.bytes(len);
    if rng.percent(25) && b.len() >= 4 {
        b[..4].copy_from_slice(b"TWPC");
    }
    b
}

/// Envelope with `body` behind the first 8 header bytes of `header`
/// (magic, version, kind, reserved: whatever they hold), and a length and
/// CRC that match.
pub fn reseal(header: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len() + TRAILER_LEN);
    out.extend_from_slice(&header[..8]);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// Replaces the CRC trailer of an envelope-shaped buffer with the right one.
fn fix_crc(b: &mut [u8]) {
    if b.len() < TRAILER_LEN {
        return;
    }
    let end = b.len() - TRAILER_LEN;
    let crc = crc32(&b[..end]);
    b[end..].copy_from_slice(&crc.to_be_bytes());
}

fn envelope(rng: &mut Rng, valid: Vec<u8>, donor: &dyn Fn(&mut Rng) -> Vec<u8>) -> Vec<u8> {
    // Valid encodings always have a full header and trailer.
    let header: Vec<u8> = valid[..HEADER_LEN].to_vec();
    let body: Vec<u8> = valid[HEADER_LEN..valid.len() - TRAILER_LEN].to_vec();
    let roll = rng.below(100);
    match roll {
        // The bulk: a damaged body behind correct framing, i.e. what the
        // bincode decoder and the validation after it must reject.
        0..=54 => {
            let mut body = body;
            byte_ops(rng, &mut body, &|r: &mut Rng| body_of(&donor(r)));
            reseal(&header, &body)
        }
        // Header fields (magic, version, kind, reserved) with a repaired
        // length and CRC, so each header check is reached on its own.
        55..=62 => {
            let (mut header, mut body) = (header, body);
            let i = rng.index(8);
            if rng.percent(50) {
                header[i] ^= 1 << rng.below(8);
            } else {
                header[i] = *rng.pick(&INTERESTING_BYTES);
            }
            if rng.percent(30) {
                byte_ops(rng, &mut body, &|r: &mut Rng| body_of(&donor(r)));
            }
            reseal(&header, &body)
        }
        // A body mutated behind a repaired length but a stale checksum.
        63..=68 => {
            let mut body = body;
            byte_ops(rng, &mut body, &|r: &mut Rng| body_of(&donor(r)));
            let mut b = reseal(&header, &body);
            let end = b.len() - TRAILER_LEN;
            b[end..].copy_from_slice(&valid[valid.len() - TRAILER_LEN..]);
            b
        }
        // Declared body lengths at and around the limits, CRC repaired:
        // the length checks must refuse them before anything is allocated.
        69..=74 => {
            let mut b = valid;
            let declared: u64 = match rng.below(7) {
                0 => MAX_BODY_LEN as u64,
                1 => MAX_BODY_LEN as u64 + 1,
                2 => u32::MAX as u64,
                3 => body.len() as u64 + 1,
                4 => (body.len() as u64).saturating_sub(1),
                5 => 0,
                _ => rng.below(u32::MAX as u64 + 1),
            };
            b[8..12].copy_from_slice(&(declared as u32).to_be_bytes());
            if rng.percent(50) {
                let extra = rng.length(32);
                let at = rng.index(b.len() + 1);
                let filler = rng.bytes(extra);
                b.splice(at..at, filler);
            }
            fix_crc(&mut b);
            b
        }
        // The whole buffer damaged, nothing repaired (or only the CRC).
        75..=86 => {
            let mut b = valid;
            byte_ops(rng, &mut b, donor);
            if rng.percent(40) {
                fix_crc(&mut b);
            }
            b
        }
        // Two valid bodies spliced: each half is well-formed bincode, the
        // seam is not.
        87..=93 => {
            let other = body_of(&donor(rng));
            let cut_a = rng.index(body.len() + 1);
            let cut_b = rng.index(other.len() + 1);
            let mut spliced = body[..cut_a].to_vec();
            spliced.extend_from_slice(&other[cut_b..]);
            reseal(&header, &spliced)
        }
        // A random body behind a valid header: nothing of the structure.
        _ => {
            let len = if rng.percent(3) {
                rng.range(4096, 64 * 1024) as usize
            } else {
                rng.length(256)
            };
            reseal(&header, &rng.bytes(len))
        }
    }
}

/// The body of a valid envelope.
fn body_of(envelope: &[u8]) -> Vec<u8> {
    envelope[HEADER_LEN..envelope.len() - TRAILER_LEN].to_vec()
}

/// The fuzz encoding of a record batch's two parts (see
/// `targets::encode_batch`): `count (u32 LE)`, `count` record ends, a
/// terminator flag (0 or 1, then the byte), the data.
const BATCH_ENDS_AT: usize = 4;

fn record_ends(rng: &mut Rng, valid: Vec<u8>, donor: &dyn Fn(&mut Rng) -> Vec<u8>) -> Vec<u8> {
    let mut b = valid;
    let count = b
        .get(..4)
        .map_or(0, |c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize);
    let ends_end = BATCH_ENDS_AT + 4 * count;
    let data_len = b.len().saturating_sub(ends_end + 2) as u64;
    match rng.below(100) {
        // Rewrite one record end to a boundary of the data.
        0..=44 if count > 0 && b.len() >= ends_end => {
            let at = BATCH_ENDS_AT + 4 * rng.below(count as u64) as usize;
            let old = u64::from(u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]));
            let n: u64 = match rng.below(9) {
                0 => 0,
                1 => data_len,
                2 => data_len + 1,
                3 => old.saturating_sub(1),
                4 => old + 1,
                5 => u32::MAX as u64,
                6 => 1 << 31,
                7 => rng.below(data_len + 2),
                _ => rng.below(u32::MAX as u64 + 1),
            };
            b[at..at + 4].copy_from_slice(&(n as u32).to_le_bytes());
        }
        // The count off by one, or the terminator changed.
        45..=59 if b.len() >= ends_end + 2 => match rng.below(4) {
            0 => b[..4].copy_from_slice(&(count as u32 + 1).to_le_bytes()),
            1 => b[..4].copy_from_slice(&(count as u32).wrapping_sub(1).to_le_bytes()),
            2 => b[ends_end] ^= 1,
            _ => b[ends_end + 1] = rng.bytes(1)[0],
        },
        _ => byte_ops(rng, &mut b, donor),
    }
    b
}

/// Fields that break parsers of names: separators, signs, leading zeros,
/// hex and decimal limits and one past them, traversal, non-ASCII.
const TEXT_TOKENS: [&str; 32] = [
    "",
    ".",
    "-",
    "+",
    "+1",
    "0",
    "00",
    "01",
    "/",
    "..",
    "../",
    "_",
    "\u{e9}",
    "\u{0}",
    " ",
    "A",
    "F",
    "ff",
    "FFFFFFFFFFFFFFFF",
    "ffffffffffffffff",
    "+fffffffffffffff",
    "0000000000000000",
    "00000000000000000",
    "18446744073709551615",
    "18446744073709551616",
    "4294967295",
    "4294967296",
    "-1",
    "0x10",
    "1e3",
    "a.b",
    "x-y",
];

fn text(rng: &mut Rng, valid: Vec<u8>, donor: &dyn Fn(&mut Rng) -> Vec<u8>) -> Vec<u8> {
    let mut b = valid;
    let ops = 1 + rng.below(3);
    for _ in 0..ops {
        match rng.below(100) {
            // Replace one field (between separators) with a token.
            0..=39 => {
                let seps: Vec<usize> = b
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| **c == b'.' || **c == b'-')
                    .map(|(i, _)| i)
                    .collect();
                let mut bounds = vec![0];
                bounds.extend(seps.iter().flat_map(|&s| [s, s + 1]));
                bounds.push(b.len());
                let field = rng.index(bounds.len() / 2) * 2;
                let (start, end) = (bounds[field], bounds[field + 1]);
                let token = text_token(rng);
                b.splice(start..end, token);
            }
            // Insert a token anywhere.
            40..=59 => {
                let at = rng.index(b.len() + 1);
                let token = text_token(rng);
                b.splice(at..at, token);
            }
            // Drop or double a separator.
            60..=69 => {
                let seps: Vec<usize> = (0..b.len())
                    .filter(|&i| b[i] == b'.' || b[i] == b'-')
                    .collect();
                if !seps.is_empty() {
                    let at = *rng.pick(&seps);
                    if rng.percent(50) {
                        b.remove(at);
                    } else {
                        let c = b[at];
                        b.insert(at, c);
                    }
                }
            }
            _ => byte_ops(rng, &mut b, donor),
        }
    }
    b
}

fn text_token(rng: &mut Rng) -> Vec<u8> {
    if rng.percent(10) {
        // Around the 64-character limit of sink ids.
        let len = *rng.pick(&[63usize, 64, 65]);
        return vec![b'a'; len];
    }
    rng.pick(&TEXT_TOKENS).as_bytes().to_vec()
}

/// Bytes that sit on a boundary of some decoder: zero, sign bits,
/// bincode's varint markers (250 is the largest one-byte value, 251..=254
/// announce 2, 4, 8 and 16 bytes), separators and hex-digit edges.
const INTERESTING_BYTES: [u8; 22] = [
    0x00, 0x01, 0x02, 0x7f, 0x80, 0xff, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe, b'.', b'-', b'/', b'_', b'+',
    b'0', b'9', b'a', b'f', b'g', b' ',
];

/// A bincode varint of a boundary value, to plant over a length or an
/// integer field.
fn varint_boundary(rng: &mut Rng) -> Vec<u8> {
    let v: u64 = match rng.below(10) {
        0 => 0,
        1 => 250,
        2 => 251,
        3 => 65_535,
        4 => MAX_BODY_LEN as u64,
        5 => MAX_BODY_LEN as u64 + 1,
        6 => u32::MAX as u64,
        7 => u64::MAX,
        _ => rng.interesting_u64(),
    };
    match rng.below(5) {
        // The shortest form, as the encoder writes it...
        0..=1 => {
            if v < 251 {
                vec![v as u8]
            } else if v <= u16::MAX as u64 {
                let mut o = vec![251];
                o.extend_from_slice(&(v as u16).to_le_bytes());
                o
            } else if v <= u32::MAX as u64 {
                let mut o = vec![252];
                o.extend_from_slice(&(v as u32).to_le_bytes());
                o
            } else {
                let mut o = vec![253];
                o.extend_from_slice(&v.to_le_bytes());
                o
            }
        }
        // ...or a longer one than needed, or the 16-byte form.
        2 => {
            let mut o = vec![253];
            o.extend_from_slice(&v.to_le_bytes());
            o
        }
        3 => {
            let mut o = vec![254];
            o.extend_from_slice(&(v as u128).to_le_bytes());
            o
        }
        _ => {
            let mut o = vec![252];
            o.extend_from_slice(&(v as u32).to_le_bytes());
            o
        }
    }
}

/// One to four generic byte mutations.
pub fn byte_ops(rng: &mut Rng, b: &mut Vec<u8>, donor: &dyn Fn(&mut Rng) -> Vec<u8>) {
    let ops = 1 + rng.below(4);
    for _ in 0..ops {
        let len = b.len();
        match rng.below(13) {
            0 if len > 0 => {
                let i = rng.index(len);
                b[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.index(len);
                b[i] = *rng.pick(&INTERESTING_BYTES);
            }
            2 if len > 0 => {
                let i = rng.index(len);
                b[i] = rng.byte();
            }
            3 => {
                let at = rng.index(len + 1);
                let n = 1 + rng.index(8);
                let filler = rng.bytes(n);
                b.splice(at..at, filler);
            }
            4 => {
                let at = rng.index(len + 1);
                let n = 1 + rng.index(4);
                let c = *rng.pick(&INTERESTING_BYTES);
                b.splice(at..at, std::iter::repeat_n(c, n));
            }
            5 if len > 0 => {
                let at = rng.index(len);
                let n = 1 + rng.index((len - at).min(16));
                b.drain(at..at + n);
            }
            6 => {
                let at = rng.index(len + 1);
                b.truncate(at);
            }
            7 if len > 0 => {
                // Duplicate a range (repeated fields, repeated records).
                let at = rng.index(len);
                let n = 1 + rng.index((len - at).min(32));
                let chunk = b[at..at + n].to_vec();
                let to = rng.index(len + 1);
                b.splice(to..to, chunk);
            }
            8 => {
                let other = donor(rng);
                let cut = rng.index(len + 1);
                let from = rng.index(other.len() + 1);
                b.truncate(cut);
                b.extend_from_slice(&other[from..]);
            }
            9 => {
                // Plant a varint, over or between existing bytes.
                let v = varint_boundary(rng);
                let at = rng.index(len + 1);
                if rng.percent(50) {
                    let end = (at + v.len()).min(len);
                    b.splice(at..end, v);
                } else {
                    b.splice(at..at, v);
                }
            }
            10 if len > 0 => {
                let i = rng.index(len);
                b[i] = if rng.percent(50) {
                    b[i].wrapping_add(1)
                } else {
                    b[i].wrapping_sub(1)
                };
            }
            11 if len > 1 => {
                let i = rng.index(len);
                let j = rng.index(len);
                b.swap(i, j);
            }
            12 if len > 0 => {
                // Overwrite a run with one value (zeroed or saturated fields).
                let at = rng.index(len);
                let n = 1 + rng.index((len - at).min(16));
                let c = if rng.percent(50) { 0 } else { 0xff };
                b[at..at + n].fill(c);
            }
            _ => {
                let at = rng.index(len + 1);
                b.insert(at, rng.byte());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use twopc_core::envelope::{open, seal, PayloadKind};

    #[test]
    fn reseal_makes_framing_valid_again() {
        let sealed = seal(PayloadKind::TransactionHandle, b"body");
        let again = reseal(&sealed, b"a longer body than before");
        assert_eq!(
            open(PayloadKind::TransactionHandle, &again).unwrap(),
            b"a longer body than before"
        );
    }

    #[test]
    fn envelope_mutations_mostly_pass_the_framing() {
        let donor = |_: &mut Rng| seal(PayloadKind::Manifest, b"donor body");
        let mut passed = 0;
        for seed in 0..2000 {
            let mut rng = Rng::new(seed);
            let m = mutate(
                &mut rng,
                Framing::Envelope,
                seal(PayloadKind::Manifest, b"valid body bytes"),
                &donor,
            );
            if open(PayloadKind::Manifest, &m.bytes).is_ok() {
                passed += 1;
            }
        }
        assert!(passed > 1000, "only {passed} of 2000 passed the framing");
    }

    #[test]
    fn record_end_mutations_stay_in_the_ends() {
        // A batch of two records ("a", "b", each followed by a line
        // break): nearly every mutation changes it.
        let valid = [
            2, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0, 1, b'\n', b'a', b'\n', b'b', b'\n',
        ];
        let mut rng = Rng::for_input("record-ends", 1);
        let mut changed = 0;
        for _ in 0..200 {
            let m = record_ends(&mut rng, valid.to_vec(), &|_| Vec::new());
            changed += usize::from(m != valid);
        }
        assert!(changed > 150, "mutations changed {changed} of 200");
    }
}
