//! The versioned envelope around everything twopc writes into Flink state or
//! onto a destination. We own this framing so that the body encoding
//! (bincode today) can change without making old checkpoints unreadable, and
//! so that truncated, corrupted or foreign bytes are recognised before any
//! decoding happens.
//!
//! ```text
//! offset size  field
//!      0    4  magic "TWPC"
//!      4    2  format version, big endian (1)
//!      6    1  payload kind (1 = transaction handle, 2 = manifest, 3 = writer state)
//!      7    1  reserved, 0
//!      8    4  body length N, big endian
//!     12    N  body (bincode 2, standard config, serde)
//!   12+N    4  CRC-32 (IEEE) of bytes 0..12+N, big endian
//! ```

use crate::handle::HandleError;

pub const MAGIC: [u8; 4] = *b"TWPC";
pub const FORMAT_VERSION: u16 = 1;
pub const HEADER_LEN: usize = 12;
pub const TRAILER_LEN: usize = 4;
/// Bodies are small (a handle is ~150 bytes); anything larger is not ours.
pub const MAX_BODY_LEN: usize = 1 << 20;

/// What an envelope carries; decoding one kind as another is an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PayloadKind {
    TransactionHandle = 1,
    Manifest = 2,
    /// A writer's own state (lineage, open transactions), see `state`.
    WriterState = 3,
    /// A segment of compacted commit history, see `history`.
    HistorySegment = 4,
}

pub fn seal(kind: PayloadKind, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len() + TRAILER_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
    out.push(kind as u8);
    out.push(0);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// Checks the framing and returns the body. Never panics on any input.
pub fn open(kind: PayloadKind, bytes: &[u8]) -> Result<&[u8], HandleError> {
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(HandleError::Truncated {
            len: bytes.len(),
            needed: HEADER_LEN + TRAILER_LEN,
        });
    }
    if bytes[0..4] != MAGIC {
        return Err(HandleError::BadMagic {
            found: [bytes[0], bytes[1], bytes[2], bytes[3]],
        });
    }
    let version = u16::from_be_bytes([bytes[4], bytes[5]]);
    if version != FORMAT_VERSION {
        return Err(HandleError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if bytes[6] != kind as u8 {
        return Err(HandleError::WrongKind {
            found: bytes[6],
            expected: kind as u8,
        });
    }
    let declared = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    if declared > MAX_BODY_LEN {
        return Err(HandleError::TooLarge { declared });
    }
    let actual = bytes.len() - HEADER_LEN - TRAILER_LEN;
    if declared != actual {
        return Err(HandleError::LengthMismatch { declared, actual });
    }
    let end = HEADER_LEN + declared;
    let stored = u32::from_be_bytes([bytes[end], bytes[end + 1], bytes[end + 2], bytes[end + 3]]);
    let computed = crc32(&bytes[..end]);
    if stored != computed {
        return Err(HandleError::Checksum { stored, computed });
    }
    Ok(&bytes[HEADER_LEN..end])
}

// A `static`, not a `const`: a `const` array is materialised at each use,
// and unoptimised builds then copy all 1 KiB of it for every byte summed.
static CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32 (IEEE 802.3, as in zlib and `java.util.zip.CRC32`).
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c = CRC_TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn seal_then_open_returns_the_body() {
        let sealed = seal(PayloadKind::TransactionHandle, b"hello");
        assert_eq!(
            open(PayloadKind::TransactionHandle, &sealed).unwrap(),
            b"hello"
        );
    }

    #[test]
    fn every_truncation_and_every_bit_flip_is_rejected() {
        let sealed = seal(PayloadKind::TransactionHandle, b"some body bytes");
        for len in 0..sealed.len() {
            assert!(open(PayloadKind::TransactionHandle, &sealed[..len]).is_err());
        }
        for i in 0..sealed.len() {
            for bit in 0..8 {
                let mut b = sealed.clone();
                b[i] ^= 1 << bit;
                assert!(
                    open(PayloadKind::TransactionHandle, &b).is_err(),
                    "flip {i}/{bit}"
                );
            }
        }
    }

    #[test]
    fn typed_errors_for_foreign_future_and_wrong_kind() {
        let sealed = seal(PayloadKind::TransactionHandle, b"x");
        let mut future = sealed.clone();
        future[5] = 2;
        assert!(matches!(
            open(PayloadKind::TransactionHandle, &future),
            Err(HandleError::UnsupportedVersion { found: 2, .. })
        ));
        assert!(matches!(
            open(
                PayloadKind::TransactionHandle,
                b"\xac\xed\x00\x05javaserialized"
            ),
            Err(HandleError::BadMagic { .. })
        ));
        assert!(matches!(
            open(PayloadKind::Manifest, &sealed),
            Err(HandleError::WrongKind { .. })
        ));
    }
}
