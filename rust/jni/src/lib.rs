//! twopc-jni: the native side of `io.twopc.flink.internal.NativeBridge`.
//!
//! A thin layer: it reads the JVM's arguments, drives
//! `twopc_core::SubtaskSink` on the destination its configuration names (a
//! directory, PostgreSQL or an object store; `openSink0`, `openWriter0`,
//! `openCommitter0`), and turns every outcome
//! back into Java values or exceptions. It holds the crate's only
//! `unsafe` code (raw JNI boundaries), each block with its argument.
//!
//! * Every entry point runs inside `EnvUnowned::with_env`, which catches
//!   panics, and resolves with [`error::ThrowJava`]: core errors become the
//!   `io.twopc.flink.Twopc*Exception` of their kind, bridge errors
//!   `IllegalStateException`/`IllegalArgumentException`, panics a
//!   `TwopcException`. Nothing unwinds into the JVM.
//! * Sinks are reached through ids of a registry ([`registry`]), never
//!   through pointers.
//! * `log` records go to SLF4J ([`logging`]).
//!
//! The JVM loads one copy of this library per class loader (Flink gives each
//! job attempt its own), so every static here is per class loader as well.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod args;
pub mod config;
mod describe;
mod error;
mod failpoints;
mod interrupt;
mod logging;
mod open;
mod pin;
mod registry;

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use jni::objects::{JByteArray, JByteBuffer, JClass, JLongArray, JObjectArray, JString};
use jni::sys::{jint, jlong, JNI_ERR, JNI_VERSION_1_8};
use jni::vm::{AttachConfig, AttachmentExceptionPolicy, JavaVM};
use jni::{jni_str, Env, EnvUnowned};
use twopc_core::records::BatchParts;
use twopc_core::{AbortOutcome, CheckpointId, CommitOutcome, SystemClock};

use crate::args::to_jlong;
use crate::error::{BridgeError, BridgeResult, ThrowJava};
use crate::registry::Native;

/// Runs once per library copy, on the Java thread inside `System.load`.
/// That thread resolves classes through the loader of the class that
/// loaded the library, so this is where the exception classes and the log
/// bridge's class are looked up and kept (as weak global references, so as
/// not to pin the job's class loader; see `error::ExceptionClasses`).
///
/// On failure the pending Java exception (or an `UnsatisfiedLinkError`)
/// makes `System.load` throw; the library is then unusable.
///
/// # Safety
///
/// Only the JVM calls this, with a valid pointer to itself.
#[no_mangle]
pub unsafe extern "system" fn JNI_OnLoad(
    vm: *mut jni::sys::JavaVM,
    _reserved: *mut c_void,
) -> jint {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the JVM calls JNI_OnLoad with a valid, non-null pointer to
        // itself, which stays valid for as long as this library is loaded.
        let vm = unsafe { JavaVM::from_raw(vm) };
        // `Ignore`: an exception thrown here (NoClassDefFoundError, or the
        // UnsatisfiedLinkError below) must stay pending for System.load to
        // rethrow, not be caught by the attachment.
        vm.attach_current_thread_with_config(
            || AttachConfig::new().exceptions_policy(AttachmentExceptionPolicy::Ignore),
            Some(16),
            |env| -> jni::errors::Result<()> {
                let init = error::cache_exception_classes(env).and_then(|()| logging::install(env));
                if let Err(e) = &init {
                    if !env.exception_check() {
                        let msg = jni::strings::JNIString::new(format!(
                            "twopc native library failed to initialise: {e}"
                        ));
                        let _ = env.throw_new(jni_str!("java/lang/UnsatisfiedLinkError"), &msg);
                    }
                }
                init
            },
        )
    }));
    match outcome {
        Ok(Ok(())) => {
            error::install_panic_hook();
            log::debug!(
                target: "twopc::jni",
                "twopc native library {} loaded",
                env!("CARGO_PKG_VERSION")
            );
            JNI_VERSION_1_8
        }
        _ => JNI_ERR,
    }
}

/// The arguments shared by `openSink`, `openWriter` and `openCommitter`.
#[allow(clippy::too_many_arguments)]
fn open_args(
    env: &mut Env<'_>,
    config: &JString<'_>,
    run_id: &JString<'_>,
    subtask: jint,
    parallelism: jint,
    attempt: jint,
    checkpoint_interval_ms: jlong,
    password: &JString<'_>,
    restored_checkpoint_id: jlong,
    writer_states: &JObjectArray<'_, JByteArray<'_>>,
    known_handles: &JObjectArray<'_, JByteArray<'_>>,
) -> BridgeResult<open::OpenArgs> {
    Ok(open::OpenArgs {
        config: args::string(env, config, "config")?,
        run_id: args::string(env, run_id, "runId")?,
        subtask,
        parallelism,
        attempt,
        checkpoint_interval_ms,
        password: args::optional_string(env, password, "password")?,
        restored_checkpoint_id,
        writer_states: args::restored_bytes(env, writer_states, "writerStates")?,
        known_handles: args::restored_bytes(env, known_handles, "knownHandles")?,
    })
}

/// `void validateConfig(String config)`: decodes and checks a
/// configuration the way `open*` will (the Java builders call it at
/// `build()`).
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_validateConfig<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    config: JString<'l>,
) {
    env.with_env(|env| -> BridgeResult<()> {
        let text = args::string(env, &config, "config")?;
        config::SinkConfig::decode(&text)?;
        Ok(())
    })
    .resolve::<ThrowJava>()
}

macro_rules! open_entry_point {
    ($name:ident, $role:expr) => {
        /// `long <open>(String config, String runId, int subtask, int
        /// parallelism, int attempt, long checkpointIntervalMs, String
        /// password, long restoredCheckpointId, byte[][] writerStates,
        /// byte[][] knownHandles)`: see `NativeBridge`.
        #[no_mangle]
        // The Java contract fixes the argument list.
        #[allow(clippy::too_many_arguments)]
        pub extern "system" fn $name<'l>(
            mut env: EnvUnowned<'l>,
            _class: JClass<'l>,
            config: JString<'l>,
            run_id: JString<'l>,
            subtask: jint,
            parallelism: jint,
            attempt: jint,
            checkpoint_interval_ms: jlong,
            password: JString<'l>,
            restored_checkpoint_id: jlong,
            writer_states: JObjectArray<'l, JByteArray<'l>>,
            known_handles: JObjectArray<'l, JByteArray<'l>>,
        ) -> jlong {
            env.with_env(|env| -> BridgeResult<jlong> {
                let a = open_args(
                    env,
                    &config,
                    &run_id,
                    subtask,
                    parallelism,
                    attempt,
                    checkpoint_interval_ms,
                    &password,
                    restored_checkpoint_id,
                    &writer_states,
                    &known_handles,
                )?;
                interrupt::checked(|| open::open($role, a))
            })
            .resolve::<ThrowJava>()
        }
    };
}

open_entry_point!(
    Java_io_twopc_flink_internal_NativeBridge_openSink0,
    open::Role::Sink
);
open_entry_point!(
    Java_io_twopc_flink_internal_NativeBridge_openWriter0,
    open::Role::Writer
);
open_entry_point!(
    Java_io_twopc_flink_internal_NativeBridge_openCommitter0,
    open::Role::Committer
);

fn not_a(role: &str, n: &Native, id: i64) -> BridgeError {
    BridgeError::illegal_state(format!(
        "twopc native #{id} is a {}, not a {role}",
        n.kind()
    ))
}

/// `byte[] begin(long writer)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_begin<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
) -> JByteArray<'l> {
    env.with_env(|env| -> BridgeResult<JByteArray<'l>> {
        let handle = registry::with_native(id, |n| {
            Ok(match n {
                Native::Sink(s) => s.begin()?,
                Native::Writer(w) => w.session.begin(&mut w.dest, &SystemClock)?,
                other => return Err(not_a("writer", other, id)),
            }
            .encode())
        })?;
        Ok(env.byte_array_from_slice(&handle)?)
    })
    .resolve::<ThrowJava>()
}

/// `long write(long writer, byte[] openHandle, ByteBuffer data, int
/// length, ByteBuffer ends, int records, int terminator)`: a batch (see
/// `twopc_core::records`) of `records` records in the first `length` bytes
/// of `data`, their end offsets the first `records` little-endian ints of
/// `ends`, each followed by the byte `terminator` (-1: none). Returns the
/// records staged in the transaction so far.
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_write<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
    open_handle: JByteArray<'l>,
    data: JByteBuffer<'l>,
    length: jint,
    ends: JByteBuffer<'l>,
    records: jint,
    terminator: jint,
) -> jlong {
    env.with_env(|env| -> BridgeResult<jlong> {
        let handle = args::bytes(env, &open_handle, "openHandle")?;
        let length = usize::try_from(length).map_err(|_| {
            BridgeError::illegal_argument(format!("batch length {length} is negative"))
        })?;
        let ends_length = usize::try_from(records)
            .ok()
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| {
                BridgeError::illegal_argument(format!("record count {records} is negative"))
            })?;
        let terminator = match terminator {
            -1 => None,
            t => Some(u8::try_from(t).map_err(|_| {
                BridgeError::illegal_argument(format!(
                    "record terminator {t} is neither -1 (none) nor a byte value (0-255)"
                ))
            })?),
        };
        let records = BatchParts {
            data: args::direct_bytes(env, &data, length, "batch")?,
            ends: args::direct_bytes(env, &ends, ends_length, "record ends")?,
            terminator,
        };
        registry::with_native(id, |n| {
            let staged = match n {
                Native::Sink(s) => {
                    let h = args::handle_of(s.scope(), &handle)?;
                    s.write(&h.transaction, records)?
                }
                Native::Writer(w) => {
                    let h = args::handle_of(w.session.scope(), &handle)?;
                    w.session.write(&mut w.dest, &h.transaction, records)?
                }
                other => return Err(not_a("writer", other, id)),
            };
            Ok(to_jlong(staged.records))
        })
    })
    .resolve::<ThrowJava>()
}

/// `byte[] prepare(long writer, byte[] openHandle, long checkpointId)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_prepare<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
    open_handle: JByteArray<'l>,
    checkpoint_id: jlong,
) -> JByteArray<'l> {
    env.with_env(|env| -> BridgeResult<JByteArray<'l>> {
        let handle = args::bytes(env, &open_handle, "openHandle")?;
        let checkpoint = CheckpointId::try_from(checkpoint_id).map_err(|_| {
            BridgeError::illegal_argument(format!("checkpoint id {checkpoint_id} is negative"))
        })?;
        let prepared = registry::with_native(id, |n| {
            Ok(match n {
                Native::Sink(s) => {
                    let h = args::handle_of(s.scope(), &handle)?;
                    s.prepare(&h.transaction, checkpoint)?
                }
                Native::Writer(w) => {
                    let h = args::handle_of(w.session.scope(), &handle)?;
                    w.session
                        .prepare(&mut w.dest, &SystemClock, &h.transaction, checkpoint)?
                }
                other => return Err(not_a("writer", other, id)),
            }
            .encode())
        })?;
        Ok(env.byte_array_from_slice(&prepared)?)
    })
    .resolve::<ThrowJava>()
}

/// `int abort(long writer, byte[] handle)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_abort<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
    handle: JByteArray<'l>,
) -> jint {
    env.with_env(|env| -> BridgeResult<jint> {
        let handle = args::bytes(env, &handle, "handle")?;
        registry::with_native(id, |n| {
            let outcome = match n {
                Native::Sink(s) => {
                    let h = args::handle_of(s.scope(), &handle)?;
                    s.abort(&h)?
                }
                Native::Writer(w) => {
                    let h = args::handle_of(w.session.scope(), &handle)?;
                    w.session.abort(&mut w.dest, &h)?
                }
                other => return Err(not_a("writer", other, id)),
            };
            // The numbers are NativeBridge.ABORTED / NOTHING_STAGED.
            Ok(match outcome {
                AbortOutcome::Aborted => 0,
                AbortOutcome::NothingStaged => 1,
            })
        })
    })
    .resolve::<ThrowJava>()
}

/// `byte[] writerState(long writer)`: the writer's state for a checkpoint.
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_writerState<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
) -> JByteArray<'l> {
    env.with_env(|env| -> BridgeResult<JByteArray<'l>> {
        let state = registry::with_native(id, |n| {
            Ok(match n {
                Native::Sink(s) => s.writer_state(),
                Native::Writer(w) => w.session.state(),
                other => return Err(not_a("writer", other, id)),
            }
            .encode())
        })?;
        Ok(env.byte_array_from_slice(&state)?)
    })
    .resolve::<ThrowJava>()
}

/// `int commit(long committer, byte[] preparedHandle)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_commit<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
    prepared_handle: JByteArray<'l>,
) -> jint {
    env.with_env(|env| -> BridgeResult<jint> {
        let handle = args::bytes(env, &prepared_handle, "preparedHandle")?;
        registry::with_native(id, |n| {
            let outcome = match n {
                Native::Sink(s) => {
                    let h = args::handle_of(s.scope(), &handle)?;
                    let started = std::time::Instant::now();
                    s.last_visible_nanos = -1;
                    let outcome = s.commit(&h)?;
                    s.last_visible_nanos =
                        visible_after(s.destination().last_visible_at(), started);
                    outcome
                }
                Native::Committer(c) => {
                    let h = args::handle_of(c.session.scope(), &handle)?;
                    committer_commit(c, &h)?
                }
                other => return Err(not_a("committer", other, id)),
            };
            // The numbers are NativeBridge.COMMITTED / ALREADY_COMMITTED / EMPTY.
            Ok(match outcome {
                CommitOutcome::Committed => 0,
                CommitOutcome::AlreadyCommitted => 1,
                CommitOutcome::Empty => 2,
            })
        })
    })
    .resolve::<ThrowJava>()
}

/// A Sink V2 commit, with the same test-only fault points as the shim's.
fn committer_commit(
    c: &mut registry::CommitterEntry,
    h: &twopc_core::TransactionHandle,
) -> Result<CommitOutcome, twopc_core::TwopcError> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!("twopc-commit-before", |_| Err(injected(
        "twopc-commit-before",
        c.session.scope(),
        &h.transaction
    )));
    let started = std::time::Instant::now();
    c.last_visible_nanos = -1;
    let outcome = c.session.commit(&mut c.dest, &SystemClock, h)?;
    c.last_visible_nanos = visible_after(c.dest.last_visible_at(), started);
    #[cfg(feature = "failpoints")]
    fail::fail_point!("twopc-commit-after", |_| Err(injected(
        "twopc-commit-after",
        c.session.scope(),
        &h.transaction
    )));
    Ok(outcome)
}

#[cfg(feature = "failpoints")]
fn injected(
    point: &'static str,
    scope: twopc_core::error::SinkScope,
    txn: &twopc_core::TransactionId,
) -> twopc_core::TwopcError {
    twopc_core::TwopcError::Destination {
        scope,
        action: "injected fault at",
        transaction: txn.clone(),
        consequence: point,
        source: twopc_core::error::DestinationError::new(
            twopc_core::error::DestinationErrorKind::Io,
            format!("fail point {point} triggered"),
        ),
    }
}

/// `long[] checkpointCompleted(long committer, long checkpointId)`:
/// housekeeping after the checkpoint's commits; returns {lingering aborted,
/// expired, failures} (failures are logged, and tried again next time).
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_checkpointCompleted<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
    checkpoint_id: jlong,
) -> JLongArray<'l> {
    env.with_env(|env| -> BridgeResult<JLongArray<'l>> {
        let checkpoint = CheckpointId::try_from(checkpoint_id).map_err(|_| {
            BridgeError::illegal_argument(format!("checkpoint id {checkpoint_id} is negative"))
        })?;
        let report = registry::with_native(id, |n| {
            Ok(match n {
                Native::Sink(s) => s.checkpoint_completed(checkpoint)?,
                Native::Committer(c) => {
                    c.session
                        .checkpoint_completed(&mut c.dest, &SystemClock, checkpoint)?
                }
                other => return Err(not_a("committer", other, id)),
            })
        })?;
        long_array(
            env,
            &[
                report.aborted.len() as i64,
                report.expired.len() as i64,
                report.failures.len() as i64,
            ],
        )
    })
    .resolve::<ThrowJava>()
}

/// `long finish(long committer)`: the subtask's input ended and the final
/// checkpoint's commit is done; housekeeping still due is tried once more
/// and its failure returned (the Java side reports it: nothing runs after
/// this, so raising it could only restart the task). Returns the lingering
/// transactions aborted. Test-only fault point `twopc-finish`: every call
/// fails before doing anything, which tells a test where the Java side
/// called it.
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_finish<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
) -> jlong {
    env.with_env(|_env| -> BridgeResult<jlong> {
        registry::with_native(id, |n| {
            #[cfg(feature = "failpoints")]
            {
                let scope = match &*n {
                    Native::Sink(s) => Some(s.scope()),
                    Native::Committer(c) => Some(c.session.scope()),
                    _ => None,
                };
                if let Some(scope) = scope {
                    fail::fail_point!("twopc-finish", |_| Err(twopc_core::TwopcError::Scan {
                        scope,
                        action: "the final housekeeping (fail point twopc-finish)",
                        source: twopc_core::error::DestinationError::new(
                            twopc_core::error::DestinationErrorKind::Io,
                            "fail point twopc-finish triggered".to_string(),
                        ),
                    }
                    .into()));
                }
            }
            let aborted = match n {
                Native::Sink(s) => s.finish()?,
                Native::Committer(c) => c.session.finish(&mut c.dest, &SystemClock)?,
                other => return Err(not_a("committer", other, id)),
            };
            Ok(aborted.len() as i64)
        })
    })
    .resolve::<ThrowJava>()
}

fn long_array<'l>(env: &mut Env<'l>, values: &[i64]) -> BridgeResult<JLongArray<'l>> {
    let array = env.new_long_array(values.len())?;
    array.set_region(env, 0, values)?;
    Ok(array)
}

/// `long[] stats(long id)`: records written, bytes written, committed,
/// aborted, last committed checkpoint (-1 if none), records in the open
/// transaction, already committed, lingering aborted, expired, housekeeping
/// failures (zeros for the counters a role does not have).
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_stats<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
) -> JLongArray<'l> {
    env.with_env(|env| -> BridgeResult<JLongArray<'l>> {
        let values = registry::with_native(id, |n| {
            Ok(match n {
                Native::Sink(s) => {
                    let st = s.stats();
                    let c = s.committer_stats();
                    [
                        to_jlong(st.records_written),
                        to_jlong(st.bytes_written),
                        to_jlong(st.committed),
                        to_jlong(st.aborted),
                        st.last_committed_checkpoint.map_or(-1, to_jlong),
                        to_jlong(s.open_stats().records),
                        to_jlong(c.already_committed),
                        to_jlong(c.lingering_aborted),
                        to_jlong(c.expired),
                        to_jlong(c.housekeeping_failures),
                    ]
                }
                Native::Writer(w) => {
                    let st = w.session.stats();
                    [
                        to_jlong(st.records_written),
                        to_jlong(st.bytes_written),
                        0,
                        to_jlong(st.aborted),
                        -1,
                        to_jlong(w.session.open_stats().records),
                        0,
                        0,
                        0,
                        0,
                    ]
                }
                Native::Committer(c) => {
                    let st = c.session.stats();
                    [
                        0,
                        0,
                        to_jlong(st.committed),
                        0,
                        st.last_committed_checkpoint.map_or(-1, to_jlong),
                        0,
                        to_jlong(st.already_committed),
                        to_jlong(st.lingering_aborted),
                        to_jlong(st.expired),
                        to_jlong(st.housekeeping_failures),
                    ]
                }
            })
        })?;
        long_array(env, &values)
    })
    .resolve::<ThrowJava>()
}

/// `void close(long id)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_close<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
) {
    env.with_env(|_env| -> BridgeResult<()> {
        registry::remove(id)?;
        log::debug!(target: "twopc::jni", "native #{id} closed");
        Ok(())
    })
    .resolve::<ThrowJava>()
}

/// `int release0()`: the job's class loader is being released (its release
/// hook, registered by the writers). Closes whatever is still open and stops
/// the background write-back thread, so that no code of this copy of the
/// library runs when the JVM unloads it. Returns how many were still open.
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_release0<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
) -> jint {
    env.with_env(|_env| -> BridgeResult<jint> {
        let open = registry::remove_all();
        if !open.is_empty() {
            log::warn!(
                target: "twopc::jni",
                "closing {} native object(s) still open when the job's class loader was released \
                 ({}); their tasks ended without closing them. Staged data stays and is resolved \
                 by the next start from a checkpoint",
                open.len(),
                open.join(", ")
            );
        }
        // Bounded: the hook runs on a TaskManager thread that must not hang
        // on a stuck disk. A thread still syncing then ends on its own.
        let stopped = twopc_fs::stop_writeback(std::time::Duration::from_secs(10));
        if stopped != twopc_fs::WritebackStop::StillRunning {
            log::debug!(target: "twopc::jni", "library released (write-back thread: {stopped:?})");
        } else {
            // Unloaded under a running thread, the JVM would crash (`pin`).
            let pinned = pin::keep_this_library_loaded();
            log::warn!(
                target: "twopc::jni",
                "the write-back thread did not stop within 10 s (a disk that does not answer?); \
                 {}",
                if pinned {
                    "this copy of the native library stays loaded so that the thread cannot \
                     run into unloaded code"
                } else {
                    "the native library could not be kept loaded: if the thread is still \
                     running when the JVM unloads it, the process may crash"
                }
            );
        }
        Ok(jint::try_from(open.len()).unwrap_or(jint::MAX))
    })
    .resolve::<ThrowJava>()
}

/// `String describeHandle(byte[] handle)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_describeHandle<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    handle: JByteArray<'l>,
) -> JString<'l> {
    env.with_env(|env| -> BridgeResult<JString<'l>> {
        let bytes = args::bytes(env, &handle, "handle")?;
        let json = describe::describe(&bytes)?;
        Ok(JString::from_str(env, json)?)
    })
    .resolve::<ThrowJava>()
}

/// `long preparedAgeMs(byte[] handle, long nowMs)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_preparedAgeMs<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    handle: JByteArray<'l>,
    now_ms: jlong,
) -> jlong {
    env.with_env(|env| -> BridgeResult<jlong> {
        let bytes = args::bytes(env, &handle, "handle")?;
        describe::prepared_age_ms(&bytes, now_ms)
    })
    .resolve::<ThrowJava>()
}

/// Nanoseconds from `started` (a commit call's start) until `visible` (when
/// the destination last showed output), or -1 if that was not during the
/// call (the commit published nothing) or the destination does not tell.
fn visible_after(visible: Option<std::time::Instant>, started: std::time::Instant) -> i64 {
    visible
        .and_then(|t| t.checked_duration_since(started))
        .map_or(-1, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// `long lastCommitVisibleNanos(long committer)`: from the start of the
/// last commit call of a committer or sink until its output was visible;
/// -1 if the destination does not tell or that commit published nothing.
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_lastCommitVisibleNanos<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    id: jlong,
) -> jlong {
    env.with_env(|_env| -> BridgeResult<jlong> {
        registry::with_native(id, |n| match n {
            Native::Committer(c) => Ok(c.last_visible_nanos),
            Native::Sink(s) => Ok(s.last_visible_nanos),
            other => Err(not_a("committer or sink", other, id)),
        })
    })
    .resolve::<ThrowJava>()
}

/// `long handleCheckpoint(byte[] handle)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_handleCheckpoint<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    handle: JByteArray<'l>,
) -> jlong {
    env.with_env(|env| -> BridgeResult<jlong> {
        let bytes = args::bytes(env, &handle, "handle")?;
        describe::checkpoint_of(&bytes)
    })
    .resolve::<ThrowJava>()
}

/// `String handleTransaction(byte[] handle)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_handleTransaction<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    handle: JByteArray<'l>,
) -> JString<'l> {
    env.with_env(|env| -> BridgeResult<JString<'l>> {
        let bytes = args::bytes(env, &handle, "handle")?;
        let transaction = describe::transaction_of(&bytes)?;
        Ok(JString::from_str(env, transaction)?)
    })
    .resolve::<ThrowJava>()
}

/// `void configureFailPoints(String spec)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_configureFailPoints<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    spec: JString<'l>,
) {
    env.with_env(|env| -> BridgeResult<()> {
        // Without the feature the call fails whatever the spec says.
        if cfg!(not(feature = "failpoints")) {
            return failpoints::configure("");
        }
        let spec = args::string(env, &spec, "spec")?;
        failpoints::configure(&spec)
    })
    .resolve::<ThrowJava>()
}
