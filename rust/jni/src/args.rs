//! Reading native-method arguments: nulls, ranges and direct buffers are
//! checked here so that the protocol code only ever sees valid values.

use jni::objects::{JByteArray, JByteBuffer, JObjectArray, JString, Reference};
use jni::Env;
use twopc_core::error::SinkScope;
use twopc_core::{TransactionHandle, TwopcError};

use crate::error::{BridgeError, BridgeResult};

pub(crate) fn string(env: &Env<'_>, value: &JString<'_>, name: &str) -> BridgeResult<String> {
    if value.is_null() {
        return Err(BridgeError::illegal_argument(format!("{name} is null")));
    }
    decoded(env, value, name)
}

/// A `String` that may be null (a setting left unset).
pub(crate) fn optional_string(
    env: &Env<'_>,
    value: &JString<'_>,
    name: &str,
) -> BridgeResult<Option<String>> {
    if value.is_null() {
        return Ok(None);
    }
    decoded(env, value, name).map(Some)
}

/// The string's text, decoded strictly. jni's own conversion replaces a
/// string it cannot decode (a Java string with an unpaired surrogate) with
/// U+FFFD characters throughout, without an error: the destination would be
/// given another password, table or path than the one configured.
fn decoded(env: &Env<'_>, value: &JString<'_>, name: &str) -> BridgeResult<String> {
    let chars = value.mutf8_chars(env)?;
    match simd_cesu8::mutf8::decode(chars.to_bytes()) {
        Ok(text) => Ok(text.into_owned()),
        // A configuration error: fatal, so that the job stops once instead of restarting on
        // a setting no restart changes (a password is checked only here).
        Err(_) => Err(BridgeError::config(format!(
            "{name} holds an unpaired UTF-16 surrogate (half of a character outside the Basic \
             Multilingual Plane, e.g. a string cut in the middle of an emoji), which no \
             destination can be given; correct the setting"
        ))),
    }
}

/// This subtask's share of restored state (`byte[][] knownHandles`,
/// `byte[][] writerStates`). A null element means the restored state is
/// damaged: a state error, never skipped, since dropping a handle would let
/// recovery treat its transaction as lingering.
pub(crate) fn restored_bytes(
    env: &mut Env<'_>,
    value: &JObjectArray<'_, JByteArray<'_>>,
    name: &str,
) -> BridgeResult<Vec<Vec<u8>>> {
    if value.is_null() {
        return Err(BridgeError::illegal_argument(format!(
            "{name} is null; pass an empty array when nothing was restored"
        )));
    }
    let count = value.len(env)?;
    let mut known = Vec::with_capacity(count);
    for i in 0..count {
        let element = value.get_element(env, i)?;
        if element.is_null() {
            return Err(BridgeError::state(format!(
                "restored {name}[{i}] of {count} is null: the restored state is damaged; \
                 restore from another checkpoint or savepoint"
            )));
        }
        known.push(env.convert_byte_array(&element)?);
        // Handles are few, but a large restore should not pile up local
        // references in the caller's frame.
        env.delete_local_ref(element);
    }
    Ok(known)
}

/// Copies a (small) `byte[]` such as a transaction handle.
pub(crate) fn bytes(env: &Env<'_>, value: &JByteArray<'_>, name: &str) -> BridgeResult<Vec<u8>> {
    if value.is_null() {
        return Err(BridgeError::illegal_argument(format!("{name} is null")));
    }
    Ok(env.convert_byte_array(value)?)
}

/// A Java `long` that the core takes as an unsigned amount (milliseconds,
/// counts): a negative value is a configuration mistake, not a huge number.
pub(crate) fn non_negative(value: i64, name: &str) -> BridgeResult<u64> {
    u64::try_from(value)
        .map_err(|_| BridgeError::config(format!("{name} must not be negative (got {value})")))
}

/// Counters cross back as Java longs; none comes near `i64::MAX`, and if one
/// did, saturating is better than turning negative.
pub(crate) fn to_jlong(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Decodes a handle passed to an operation of a sink of `scope`. Damaged
/// bytes are a state error of that sink (fatal), named with its scope.
pub(crate) fn handle_of(scope: SinkScope, bytes: &[u8]) -> BridgeResult<TransactionHandle> {
    TransactionHandle::decode(bytes)
        .map_err(|source| BridgeError::Core(TwopcError::State { scope, source }))
}

/// The first `length` bytes of a direct buffer, without copying.
///
/// The Java caller owns the buffer and must not change or free it while the
/// native call runs (`NativeBridge.write` documents this); Flink calls the
/// sink from one task thread, which is also the thread that fills the
/// buffer.
pub(crate) fn direct_bytes<'b>(
    env: &Env<'_>,
    buffer: &'b JByteBuffer<'_>,
    length: usize,
    what: &str,
) -> BridgeResult<&'b [u8]> {
    if buffer.is_null() {
        return Err(BridgeError::illegal_argument(format!(
            "{what} buffer is null"
        )));
    }
    // GetDirectBufferCapacity answers -1 (an error here) for heap buffers;
    // asking it first also tells a heap buffer from an empty direct one,
    // whose address may legitimately be null.
    let capacity = env.get_direct_buffer_capacity(buffer).map_err(|_| {
        BridgeError::illegal_argument(format!(
            "{what} must be a direct ByteBuffer (ByteBuffer.allocateDirect), not a heap buffer"
        ))
    })?;
    if length > capacity {
        return Err(BridgeError::illegal_argument(format!(
            "{what} length {length} exceeds the buffer's capacity of {capacity} bytes"
        )));
    }
    if length == 0 {
        return Ok(&[]);
    }
    let address = env.get_direct_buffer_address(buffer).map_err(|_| {
        BridgeError::illegal_argument(format!("{what} buffer has no accessible memory address"))
    })?;
    if address.is_null() {
        return Err(BridgeError::illegal_argument(format!(
            "{what} buffer has no accessible memory address"
        )));
    }
    // SAFETY: `address` is the non-null start of the direct buffer's memory,
    // which the JVM guarantees spans `capacity` bytes, and `length <=
    // capacity`, so the slice stays inside that one allocation (u8 needs no
    // alignment and has no invalid values). The memory stays allocated for
    // the slice's lifetime: the slice borrows `buffer`, a JNI local
    // reference that keeps the ByteBuffer reachable until the native method
    // returns, and the memory of a buffer from `ByteBuffer.allocateDirect`
    // (the only kind the jar's callers pass: `RecordBatcher`) is freed only
    // by its cleaner once the buffer is unreachable. Memory that can be freed
    // while its buffer is reachable (a `MemorySegment` of a shared arena, an
    // explicit `invokeCleaner`) is not covered by that: `NativeBridge.write`
    // makes "not changed or freed until the call returns" the caller's
    // obligation, which this argument relies on. Nothing writes to it
    // meanwhile, by the same obligation, and this crate only reads it.
    Ok(unsafe { std::slice::from_raw_parts(address.cast_const(), length) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_amounts_are_config_errors() {
        assert_eq!(non_negative(5, "x").unwrap(), 5);
        let err = non_negative(-1, "retentionMs").unwrap_err();
        assert!(matches!(
            err,
            BridgeError::Java(crate::error::JavaException::Config, _)
        ));
        assert!(err.to_string().contains("retentionMs must not be negative"));
    }

    #[test]
    fn counters_saturate() {
        assert_eq!(to_jlong(7), 7);
        assert_eq!(to_jlong(u64::MAX), i64::MAX);
    }
}
