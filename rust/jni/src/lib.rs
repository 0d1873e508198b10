//! twopc-jni: the native side of `io.twopc.flink.internal.NativeBridge`.
//!
//! A thin layer: it reads the JVM's arguments, drives
//! `twopc_core::SubtaskSink` on the filesystem destination (`open`) or on
//! PostgreSQL (`openPostgres`, crate `twopc-pg`), and turns every outcome
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
mod describe;
mod error;
mod failpoints;
mod logging;
mod open;
mod registry;

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use jni::objects::{JByteArray, JByteBuffer, JClass, JLongArray, JObjectArray, JString};
use jni::sys::{jboolean, jint, jlong, JNI_ERR, JNI_VERSION_1_8};
use jni::vm::{AttachConfig, AttachmentExceptionPolicy, JavaVM};
use jni::{jni_str, Env, EnvUnowned};
use twopc_core::{AbortOutcome, CheckpointId, CommitOutcome};

use crate::args::to_jlong;
use crate::error::{BridgeError, BridgeResult, ThrowJava};

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

/// The settings `open` and `openPostgres` share, read from the JVM.
// Mirrors the shared part of both Java signatures.
#[allow(clippy::too_many_arguments)]
fn sink_args(
    env: &mut Env<'_>,
    sink_id: &JString<'_>,
    run_id: &JString<'_>,
    subtask: jint,
    parallelism: jint,
    retention_ms: jlong,
    checkpoint_interval_ms: jlong,
    restart_allowance_ms: jlong,
    rewind_replace_range: jboolean,
    fresh_start_abort_prepared: jboolean,
    commit_max_attempts: jint,
    commit_initial_backoff_ms: jlong,
    commit_max_backoff_ms: jlong,
    restored_checkpoint_id: jlong,
    known_handles: &JObjectArray<'_, JByteArray<'_>>,
) -> BridgeResult<open::SinkArgs> {
    Ok(open::SinkArgs {
        sink_id: args::string(env, sink_id, "sinkId")?,
        run_id: args::string(env, run_id, "runId")?,
        subtask,
        parallelism,
        retention_ms,
        checkpoint_interval_ms,
        restart_allowance_ms,
        rewind_replace_range,
        fresh_start_abort_prepared,
        commit_max_attempts,
        commit_initial_backoff_ms,
        commit_max_backoff_ms,
        restored_checkpoint_id,
        known_handles: args::known_handles(env, known_handles)?,
    })
}

/// `long open(String sinkId, String runId, int subtask, int parallelism,
/// String outputDir, String partPrefix, String partSuffix, boolean
/// rawFormat, long retentionMs, long checkpointIntervalMs, long
/// restartAllowanceMs, boolean rewindReplaceRange, boolean
/// freshStartAbortPrepared, int commitMaxAttempts, long
/// commitInitialBackoffMs, long commitMaxBackoffMs, long
/// restoredCheckpointId, byte[][] knownHandles)`
#[no_mangle]
// The Java contract fixes the argument list.
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_open<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    sink_id: JString<'l>,
    run_id: JString<'l>,
    subtask: jint,
    parallelism: jint,
    output_dir: JString<'l>,
    part_prefix: JString<'l>,
    part_suffix: JString<'l>,
    raw_format: jboolean,
    retention_ms: jlong,
    checkpoint_interval_ms: jlong,
    restart_allowance_ms: jlong,
    rewind_replace_range: jboolean,
    fresh_start_abort_prepared: jboolean,
    commit_max_attempts: jint,
    commit_initial_backoff_ms: jlong,
    commit_max_backoff_ms: jlong,
    restored_checkpoint_id: jlong,
    known_handles: JObjectArray<'l, JByteArray<'l>>,
) -> jlong {
    env.with_env(|env| -> BridgeResult<jlong> {
        let sink = sink_args(
            env,
            &sink_id,
            &run_id,
            subtask,
            parallelism,
            retention_ms,
            checkpoint_interval_ms,
            restart_allowance_ms,
            rewind_replace_range,
            fresh_start_abort_prepared,
            commit_max_attempts,
            commit_initial_backoff_ms,
            commit_max_backoff_ms,
            restored_checkpoint_id,
            &known_handles,
        )?;
        let fs = open::FsArgs {
            output_dir: args::string(env, &output_dir, "outputDir")?,
            part_prefix: args::string(env, &part_prefix, "partPrefix")?,
            part_suffix: args::string(env, &part_suffix, "partSuffix")?,
            raw_format,
        };
        open::open_filesystem(sink, fs)
    })
    .resolve::<ThrowJava>()
}

/// `long openPostgres(String sinkId, String runId, int subtask, int
/// parallelism, String url, String host, int port, String database, String
/// user, String password, String table, String[] columns, String mode,
/// String[] keyColumns, String copyFormat, String transactionIdColumn,
/// String controlSchema, long connectTimeoutMs, long retentionMs, long
/// checkpointIntervalMs, long restartAllowanceMs, boolean
/// rewindReplaceRange, boolean freshStartAbortPrepared, int
/// commitMaxAttempts, long commitInitialBackoffMs, long commitMaxBackoffMs,
/// long restoredCheckpointId, byte[][] knownHandles)`
///
/// `url`, `host`, `database`, `user`, `password` and
/// `transactionIdColumn` may be null. The password never appears in a
/// message or log line.
#[no_mangle]
// The Java contract fixes the argument list.
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_openPostgres<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    sink_id: JString<'l>,
    run_id: JString<'l>,
    subtask: jint,
    parallelism: jint,
    url: JString<'l>,
    host: JString<'l>,
    port: jint,
    database: JString<'l>,
    user: JString<'l>,
    password: JString<'l>,
    table: JString<'l>,
    columns: JObjectArray<'l, JString<'l>>,
    mode: JString<'l>,
    key_columns: JObjectArray<'l, JString<'l>>,
    copy_format: JString<'l>,
    transaction_id_column: JString<'l>,
    control_schema: JString<'l>,
    connect_timeout_ms: jlong,
    retention_ms: jlong,
    checkpoint_interval_ms: jlong,
    restart_allowance_ms: jlong,
    rewind_replace_range: jboolean,
    fresh_start_abort_prepared: jboolean,
    commit_max_attempts: jint,
    commit_initial_backoff_ms: jlong,
    commit_max_backoff_ms: jlong,
    restored_checkpoint_id: jlong,
    known_handles: JObjectArray<'l, JByteArray<'l>>,
) -> jlong {
    env.with_env(|env| -> BridgeResult<jlong> {
        let sink = sink_args(
            env,
            &sink_id,
            &run_id,
            subtask,
            parallelism,
            retention_ms,
            checkpoint_interval_ms,
            restart_allowance_ms,
            rewind_replace_range,
            fresh_start_abort_prepared,
            commit_max_attempts,
            commit_initial_backoff_ms,
            commit_max_backoff_ms,
            restored_checkpoint_id,
            &known_handles,
        )?;
        let pg = open::PgArgs {
            url: args::optional_string(env, &url)?,
            host: args::optional_string(env, &host)?,
            port,
            database: args::optional_string(env, &database)?,
            user: args::optional_string(env, &user)?,
            password: args::optional_string(env, &password)?,
            table: args::string(env, &table, "table")?,
            columns: args::strings(env, &columns, "columns")?,
            mode: args::string(env, &mode, "mode")?,
            key_columns: args::strings(env, &key_columns, "keyColumns")?,
            copy_format: args::string(env, &copy_format, "copyFormat")?,
            transaction_id_column: args::optional_string(env, &transaction_id_column)?,
            control_schema: args::string(env, &control_schema, "controlSchema")?,
            connect_timeout_ms,
        };
        open::open_postgres(sink, pg)
    })
    .resolve::<ThrowJava>()
}

/// `byte[] begin(long sink)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_begin<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    sink: jlong,
) -> JByteArray<'l> {
    env.with_env(|env| -> BridgeResult<JByteArray<'l>> {
        let handle = registry::with_sink(sink, |s| Ok(s.begin()?.encode()))?;
        Ok(env.byte_array_from_slice(&handle)?)
    })
    .resolve::<ThrowJava>()
}

/// `long write(long sink, byte[] openHandle, ByteBuffer batch, int length)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_write<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    sink: jlong,
    open_handle: JByteArray<'l>,
    batch: JByteBuffer<'l>,
    length: jint,
) -> jlong {
    env.with_env(|env| -> BridgeResult<jlong> {
        let handle = args::bytes(env, &open_handle, "openHandle")?;
        let records = args::direct_bytes(env, &batch, length)?;
        registry::with_sink(sink, |s| {
            let handle = args::handle_of(s, &handle)?;
            let staged = s.write(&handle.transaction, records)?;
            Ok(to_jlong(staged.records))
        })
    })
    .resolve::<ThrowJava>()
}

/// `byte[] prepare(long sink, byte[] openHandle, long checkpointId)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_prepare<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    sink: jlong,
    open_handle: JByteArray<'l>,
    checkpoint_id: jlong,
) -> JByteArray<'l> {
    env.with_env(|env| -> BridgeResult<JByteArray<'l>> {
        let handle = args::bytes(env, &open_handle, "openHandle")?;
        let checkpoint = CheckpointId::try_from(checkpoint_id).map_err(|_| {
            BridgeError::illegal_argument(format!("checkpoint id {checkpoint_id} is negative"))
        })?;
        let prepared = registry::with_sink(sink, |s| {
            let handle = args::handle_of(s, &handle)?;
            Ok(s.prepare(&handle.transaction, checkpoint)?.encode())
        })?;
        Ok(env.byte_array_from_slice(&prepared)?)
    })
    .resolve::<ThrowJava>()
}

/// `int commit(long sink, byte[] preparedHandle)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_commit<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    sink: jlong,
    prepared_handle: JByteArray<'l>,
) -> jint {
    env.with_env(|env| -> BridgeResult<jint> {
        let handle = args::bytes(env, &prepared_handle, "preparedHandle")?;
        registry::with_sink(sink, |s| {
            let handle = args::handle_of(s, &handle)?;
            // The numbers are NativeBridge.COMMITTED / ALREADY_COMMITTED / EMPTY.
            Ok(match s.commit(&handle)? {
                CommitOutcome::Committed => 0,
                CommitOutcome::AlreadyCommitted => 1,
                CommitOutcome::Empty => 2,
            })
        })
    })
    .resolve::<ThrowJava>()
}

/// `int abort(long sink, byte[] handle)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_abort<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    sink: jlong,
    handle: JByteArray<'l>,
) -> jint {
    env.with_env(|env| -> BridgeResult<jint> {
        let handle = args::bytes(env, &handle, "handle")?;
        registry::with_sink(sink, |s| {
            let handle = args::handle_of(s, &handle)?;
            // The numbers are NativeBridge.ABORTED / NOTHING_STAGED.
            Ok(match s.abort(&handle)? {
                AbortOutcome::Aborted => 0,
                AbortOutcome::NothingStaged => 1,
            })
        })
    })
    .resolve::<ThrowJava>()
}

/// `long[] stats(long sink)`: records written, bytes written, committed,
/// aborted, last committed checkpoint (-1 if none), records in the open
/// transaction.
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_stats<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    sink: jlong,
) -> JLongArray<'l> {
    env.with_env(|env| -> BridgeResult<JLongArray<'l>> {
        let values = registry::with_sink(sink, |s| {
            let stats = s.stats();
            Ok([
                to_jlong(stats.records_written),
                to_jlong(stats.bytes_written),
                to_jlong(stats.committed),
                to_jlong(stats.aborted),
                stats.last_committed_checkpoint.map_or(-1, to_jlong),
                to_jlong(s.open_stats().records),
            ])
        })?;
        let array = env.new_long_array(values.len())?;
        array.set_region(env, 0, &values)?;
        Ok(array)
    })
    .resolve::<ThrowJava>()
}

/// `void close(long sink)`
#[no_mangle]
pub extern "system" fn Java_io_twopc_flink_internal_NativeBridge_close<'l>(
    mut env: EnvUnowned<'l>,
    _class: JClass<'l>,
    sink: jlong,
) {
    env.with_env(|_env| -> BridgeResult<()> {
        registry::remove(sink)?;
        log::debug!(target: "twopc::jni", "native sink #{sink} closed");
        Ok(())
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
