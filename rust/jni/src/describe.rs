//! `NativeBridge.describeHandle`, `preparedAgeMs`, `handleCheckpoint` and
//! `handleTransaction`: reading a handle without a sink, for tests, tools,
//! metrics and log lines.

use twopc_core::TransactionHandle;

use crate::error::{BridgeError, BridgeResult};

/// Decodes handle bytes seen outside any sink. Damage is a state error: the
/// bytes come from checkpoint state.
fn decode(bytes: &[u8]) -> BridgeResult<TransactionHandle> {
    TransactionHandle::decode(bytes).map_err(|e| {
        BridgeError::state(format!(
            "{} bytes are not a readable twopc transaction handle: {e}",
            bytes.len()
        ))
    })
}

/// The handle's fields as a JSON object (`TransactionHandle::describe`).
/// Numbers are unsigned 64-bit and may exceed a Java long.
pub(crate) fn describe(bytes: &[u8]) -> BridgeResult<String> {
    let h = decode(bytes)?;
    serde_json::to_string(&h.describe())
        .map_err(|e| BridgeError::state(format!("describing handle {}: {e}", h.transaction)))
}

/// Milliseconds from the handle's prepare to `now_ms` (0 if the clock is
/// behind), or -1 for an open handle.
pub(crate) fn prepared_age_ms(bytes: &[u8], now_ms: i64) -> BridgeResult<i64> {
    let h = decode(bytes)?;
    Ok(match h.prepared() {
        None => -1,
        Some(p) => {
            let now = u64::try_from(now_ms).unwrap_or(0);
            crate::args::to_jlong(now.saturating_sub(p.prepared_at_ms))
        }
    })
}

/// The checkpoint a prepared handle was prepared for, or -1 for an open
/// handle.
pub(crate) fn checkpoint_of(bytes: &[u8]) -> BridgeResult<i64> {
    Ok(decode(bytes)?
        .checkpoint()
        .map_or(-1, crate::args::to_jlong))
}

/// The id of the handle's transaction.
pub(crate) fn transaction_of(bytes: &[u8]) -> BridgeResult<String> {
    Ok(decode(bytes)?.transaction.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(name: &str) -> (Vec<u8>, serde_json::Value) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors");
        let bin = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
        let json =
            serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.json"))).unwrap())
                .unwrap();
        (bin, json)
    }

    #[test]
    fn describes_the_golden_vectors() {
        for name in [
            "handle-open-v1",
            "handle-prepared-v1",
            "handle-prepared-large-v1",
        ] {
            let (bin, expected) = vector(name);
            let got: serde_json::Value = serde_json::from_str(&describe(&bin).unwrap()).unwrap();
            assert_eq!(got, expected, "{name}");
        }
    }

    #[test]
    fn ages() {
        let (open, _) = vector("handle-open-v1");
        assert_eq!(prepared_age_ms(&open, 5).unwrap(), -1);
        let (prepared, json) = vector("handle-prepared-v1");
        let at = json["preparedAtMs"].as_u64().unwrap() as i64;
        assert_eq!(prepared_age_ms(&prepared, at + 250).unwrap(), 250);
        assert_eq!(prepared_age_ms(&prepared, at - 250).unwrap(), 0);
    }

    #[test]
    fn damage_is_a_state_error() {
        let (mut bin, _) = vector("handle-prepared-v1");
        let err = describe(&bin[..bin.len() - 1]).unwrap_err();
        assert!(matches!(
            err,
            BridgeError::Java(crate::error::JavaException::State, _)
        ));
        let mid = bin.len() / 2;
        bin[mid] ^= 0x40;
        assert!(err
            .to_string()
            .contains("not a readable twopc transaction handle"));
        assert!(describe(&bin).is_err());
        assert!(describe(&[]).is_err());
    }
}
