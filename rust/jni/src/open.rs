//! `NativeBridge.open`: from Flink's view of a subtask (ids, options,
//! restored state) to a running `SubtaskSink` on the filesystem
//! destination. Everything is validated before the destination is touched,
//! so a configuration mistake fails the job at start with the setting to
//! change, and damaged state fails it before recovery acts on anything.

use std::path::PathBuf;

use twopc_core::config::validate_retention;
use twopc_core::fs::{FsDestination, FsOptions, RecordFormat};
use twopc_core::{
    FreshStartPolicy, Restore, RetryPolicy, RewindPolicy, RunId, SinkId, SinkOptions,
    SubtaskContext, SubtaskSink, SystemClock, TransactionHandle, TwopcError,
};

use crate::args::non_negative;
use crate::error::{BridgeError, BridgeResult};
use crate::registry;

/// The arguments of `NativeBridge.open`, already read from the JVM.
pub(crate) struct OpenArgs {
    pub sink_id: String,
    pub run_id: String,
    pub subtask: i32,
    pub parallelism: i32,
    pub output_dir: String,
    pub part_prefix: String,
    pub part_suffix: String,
    pub raw_format: bool,
    pub retention_ms: i64,
    pub checkpoint_interval_ms: i64,
    pub restart_allowance_ms: i64,
    pub rewind_replace_range: bool,
    pub fresh_start_abort_prepared: bool,
    pub commit_max_attempts: i32,
    pub commit_initial_backoff_ms: i64,
    pub commit_max_backoff_ms: i64,
    pub restored_checkpoint_id: i64,
    pub known_handles: Vec<Vec<u8>>,
}

/// Opens the sink and registers it; returns its id.
pub(crate) fn open(args: OpenArgs) -> BridgeResult<i64> {
    let sink_id = SinkId::new(args.sink_id)?;
    // The run is Flink's job id: kept by failover restarts, new for every
    // submission, which is what the core's fresh-start rules need.
    let run = RunId::new(args.run_id)?;
    let subtask = u32::try_from(args.subtask)
        .map_err(|_| BridgeError::config(format!("subtask index {} is negative", args.subtask)))?;
    let parallelism = u32::try_from(args.parallelism).map_err(|_| {
        BridgeError::config(format!("parallelism {} is negative", args.parallelism))
    })?;
    let ctx = SubtaskContext::new(sink_id.clone(), run, subtask, parallelism)?;

    let retention_ms = non_negative(args.retention_ms, "staged-transaction retention (ms)")?;
    let interval_ms = non_negative(args.checkpoint_interval_ms, "checkpoint interval (ms)")?;
    let allowance_ms = non_negative(args.restart_allowance_ms, "restart allowance (ms)")?;
    validate_retention(retention_ms, interval_ms, allowance_ms)?;

    let max_attempts = u32::try_from(args.commit_max_attempts)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| {
            BridgeError::config(format!(
                "commit max attempts must be at least 1 (got {})",
                args.commit_max_attempts
            ))
        })?;
    let options = SinkOptions {
        retention_ms,
        rewind: if args.rewind_replace_range {
            RewindPolicy::ReplaceRange
        } else {
            RewindPolicy::Fail
        },
        fresh_start: if args.fresh_start_abort_prepared {
            FreshStartPolicy::AbortPrepared
        } else {
            FreshStartPolicy::Fail
        },
        commit_retry: RetryPolicy {
            max_attempts,
            initial_backoff_ms: non_negative(
                args.commit_initial_backoff_ms,
                "commit initial backoff (ms)",
            )?,
            max_backoff_ms: non_negative(args.commit_max_backoff_ms, "commit max backoff (ms)")?,
        },
        ..SinkOptions::default()
    };

    let fs_options = FsOptions {
        output_dir: PathBuf::from(args.output_dir),
        part_prefix: args.part_prefix,
        part_suffix: args.part_suffix,
        format: if args.raw_format {
            RecordFormat::Raw
        } else {
            RecordFormat::Lines
        },
    };
    fs_options.validate()?;

    let restore = restore(&ctx, args.restored_checkpoint_id, &args.known_handles)?;

    let dest = FsDestination::open(fs_options, &sink_id).map_err(|source| TwopcError::Scan {
        scope: ctx.scope(),
        action: "opening the output directory",
        source,
    })?;
    let (sink, _report) =
        SubtaskSink::open(dest, SystemClock, ctx, options, restore.as_ref(), None)?;
    let scope = sink.scope();
    let id = registry::insert(sink);
    log::debug!(target: "twopc::jni", "{scope}: open as native sink #{id}");
    Ok(id)
}

/// Decodes the restored handles. A handle that does not decode stops the
/// job: recovery must never act on a partial picture of the checkpoint.
fn restore(
    ctx: &SubtaskContext,
    checkpoint: i64,
    known: &[Vec<u8>],
) -> BridgeResult<Option<Restore>> {
    let Ok(checkpoint) = u64::try_from(checkpoint) else {
        if known.is_empty() {
            return Ok(None);
        }
        // Without a checkpoint id the handles cannot be placed; dropping
        // them would let recovery treat their transactions as lingering.
        return Err(BridgeError::illegal_argument(format!(
            "{} restored transaction handles were passed without a restored checkpoint id",
            known.len()
        )));
    };
    let handles = known
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            TransactionHandle::decode(bytes).map_err(|source| {
                let err = TwopcError::State {
                    scope: ctx.scope(),
                    source,
                };
                BridgeError::state(format!(
                    "{err} [restored transaction handle knownHandles[{i}] of {}, {} bytes]",
                    known.len(),
                    bytes.len()
                ))
            })
        })
        .collect::<BridgeResult<Vec<_>>>()?;
    Ok(Some(Restore {
        checkpoint,
        known: handles,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::JavaException;

    fn args(dir: &std::path::Path) -> OpenArgs {
        OpenArgs {
            sink_id: "orders".into(),
            run_id: "a1b2c3d4e5f60718293a4b5c6d7e8f90".into(),
            subtask: 0,
            parallelism: 1,
            output_dir: dir.to_string_lossy().into_owned(),
            part_prefix: "part".into(),
            part_suffix: ".txt".into(),
            raw_format: false,
            retention_ms: 3_600_000,
            checkpoint_interval_ms: 10_000,
            restart_allowance_ms: 60_000,
            rewind_replace_range: false,
            fresh_start_abort_prepared: false,
            commit_max_attempts: 3,
            commit_initial_backoff_ms: 10,
            commit_max_backoff_ms: 100,
            restored_checkpoint_id: -1,
            known_handles: Vec::new(),
        }
    }

    fn class_of(err: &BridgeError) -> JavaException {
        match err {
            BridgeError::Core(e) => JavaException::for_core(e),
            BridgeError::Java(c, _) => *c,
            BridgeError::Jni(_) => JavaException::Twopc,
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "twopc-jni-{name}-{:016x}",
            twopc_core::ids::random_u64()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn opens_and_closes() {
        let dir = temp_dir("open");
        let id = open(args(&dir)).unwrap();
        registry::remove(id).unwrap();
        assert!(registry::remove(id).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn configuration_mistakes_are_config_errors() {
        let dir = temp_dir("config");
        let cases: Vec<fn(&mut OpenArgs)> = vec![
            |a| a.retention_ms = 1_000,
            |a| a.checkpoint_interval_ms = 0,
            |a| a.retention_ms = -5,
            |a| a.sink_id = "../etc".into(),
            |a| a.run_id = String::new(),
            |a| a.subtask = 3,
            |a| a.subtask = -1,
            |a| a.part_suffix = "txt".into(),
            |a| a.commit_max_attempts = 0,
        ];
        for (i, change) in cases.iter().enumerate() {
            let mut a = args(&dir);
            change(&mut a);
            let err = open(a).unwrap_err();
            assert_eq!(class_of(&err), JavaException::Config, "case {i}: {err}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn damaged_restored_handles_are_named() {
        let dir = temp_dir("restore");
        let mut a = args(&dir);
        a.restored_checkpoint_id = 3;
        a.known_handles = vec![b"TWPC garbage".to_vec()];
        let err = open(a).unwrap_err();
        assert_eq!(class_of(&err), JavaException::State);
        assert!(err.to_string().contains("knownHandles[0] of 1"), "{err}");

        let mut a = args(&dir);
        a.known_handles = vec![Vec::new()];
        let err = open(a).unwrap_err();
        assert_eq!(class_of(&err), JavaException::IllegalArgument, "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
