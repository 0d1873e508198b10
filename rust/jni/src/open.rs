//! Opening the native side of a subtask: from Flink's view of it (the
//! configuration, ids, the restored state) to a running writer, committer,
//! or both (the SinkFunction shim).
//!
//! Everything is validated before the destination is touched: the
//! configuration (see [`crate::config`]), the ids, and the restored state,
//! so a mistake fails the job at start with the setting to change, and
//! damaged state fails it before recovery acts on anything.

use twopc_core::{
    CommitterSession, Restore, RunId, SubtaskContext, SubtaskSink, SystemClock, TransactionHandle,
    TwopcError, WriterSession, WriterState,
};

use crate::args::non_negative;
use crate::config::SinkConfig;
use crate::error::{BridgeError, BridgeResult};
use crate::registry::{self, CommitterEntry, Native, SinkEntry, WriterEntry};

/// What a subtask opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// The SinkFunction shim: writer and committer in one operator.
    Sink,
    /// The Sink V2 writer.
    Writer,
    /// The Sink V2 committer.
    Committer,
}

/// The arguments of `openSink`, `openWriter` and `openCommitter`, read from
/// the JVM.
pub(crate) struct OpenArgs {
    pub config: String,
    pub run_id: String,
    pub subtask: i32,
    pub parallelism: i32,
    pub attempt: i32,
    /// The interval the front end detected, for the retention check when
    /// the configuration leaves it to the job (0: unknown).
    pub checkpoint_interval_ms: i64,
    /// Read by the task manager from the source the configuration names.
    pub password: Option<String>,
    /// Negative: no restored state.
    pub restored_checkpoint_id: i64,
    pub writer_states: Vec<Vec<u8>>,
    pub known_handles: Vec<Vec<u8>>,
}

/// Opens and registers a writer, committer or both; returns the id.
pub(crate) fn open(role: Role, args: OpenArgs) -> BridgeResult<i64> {
    let config = SinkConfig::decode(&args.config)?;
    let subtask = u32::try_from(args.subtask)
        .map_err(|_| BridgeError::config(format!("subtask index {} is negative", args.subtask)))?;
    let parallelism = u32::try_from(args.parallelism).map_err(|_| {
        BridgeError::config(format!("parallelism {} is negative", args.parallelism))
    })?;
    let attempt = u32::try_from(args.attempt)
        .map_err(|_| BridgeError::config(format!("attempt number {} is negative", args.attempt)))?;
    // The run is Flink's job id: kept by failover restarts, new for every
    // submission, which is what the core's fresh-start rules need.
    let ctx = SubtaskContext::new(
        config.sink.clone(),
        RunId::new(args.run_id.clone())?,
        subtask,
        parallelism,
    )?
    .with_attempt(attempt, config.instance);
    let mut needed_retention_ms = None;
    if role != Role::Committer {
        let detected = non_negative(args.checkpoint_interval_ms, "checkpoint interval (ms)")?;
        config.check_interval(detected)?;
        needed_retention_ms = Some(config.needed_retention_ms(detected));
    }
    let restore = restore(&ctx, &args)?;
    let mut dest = config.open_destination(&ctx, args.password.clone(), needed_retention_ms)?;
    let native = match role {
        Role::Sink => Native::Sink(Box::new(SinkEntry {
            sink: SubtaskSink::open(
                dest,
                SystemClock,
                ctx.clone(),
                config.options.clone(),
                restore.as_ref(),
                None,
            )?
            .0,
            last_visible_nanos: -1,
        })),
        Role::Writer => {
            let (session, _) = WriterSession::open(
                &mut dest,
                &SystemClock,
                ctx.clone(),
                &config.options,
                restore.as_ref(),
                None,
            )?;
            Native::Writer(Box::new(WriterEntry { session, dest }))
        }
        Role::Committer => Native::Committer(Box::new(CommitterEntry {
            session: CommitterSession::new(
                ctx.clone(),
                config.options.clone(),
                restore.as_ref().map(|r| r.checkpoint),
            ),
            dest,
            last_visible_nanos: -1,
        })),
    };
    let id = registry::insert(native)?;
    log::debug!(
        target: "twopc::jni",
        "{}: {role:?} open ({}) as native #{id}",
        ctx.scope(),
        config.describe()
    );
    Ok(id)
}

/// Decodes the restored state. Bytes that do not decode stop the job:
/// recovery must never act on a partial picture of the checkpoint.
fn restore(ctx: &SubtaskContext, args: &OpenArgs) -> BridgeResult<Option<Restore>> {
    let Ok(checkpoint) = u64::try_from(args.restored_checkpoint_id) else {
        if args.known_handles.is_empty() && args.writer_states.is_empty() {
            return Ok(None);
        }
        // Without a checkpoint id the state cannot be placed; dropping it
        // would let recovery treat its transactions as lingering.
        return Err(BridgeError::illegal_argument(format!(
            "{} restored handles and {} writer states were passed without a restored checkpoint \
             id",
            args.known_handles.len(),
            args.writer_states.len()
        )));
    };
    let damaged = |what: &str, i: usize, n: usize, len: usize, source| {
        let err = TwopcError::State {
            scope: ctx.scope(),
            source,
        };
        BridgeError::state(format!("{err} [restored {what} [{i}] of {n}, {len} bytes]"))
    };
    let known = args
        .known_handles
        .iter()
        .enumerate()
        .map(|(i, b)| {
            TransactionHandle::decode(b).map_err(|e| {
                damaged(
                    "transaction handle",
                    i,
                    args.known_handles.len(),
                    b.len(),
                    e,
                )
            })
        })
        .collect::<BridgeResult<Vec<_>>>()?;
    let states = args
        .writer_states
        .iter()
        .enumerate()
        .map(|(i, b)| {
            WriterState::decode(b)
                .map_err(|e| damaged("writer state", i, args.writer_states.len(), b.len(), e))
        })
        .collect::<BridgeResult<Vec<_>>>()?;
    Ok(Some(Restore {
        checkpoint,
        states,
        known,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::JavaException;

    fn class_of(err: &BridgeError) -> JavaException {
        match err {
            BridgeError::Core(e) => JavaException::for_core(e),
            BridgeError::Java(c, _) => *c,
            BridgeError::Jni(_) => JavaException::Twopc,
        }
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "twopc-jni-{name}-{:016x}",
            twopc_core::ids::random_u64()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn args(config: String) -> OpenArgs {
        OpenArgs {
            config,
            run_id: "a1b2c3d4e5f60718293a4b5c6d7e8f90".into(),
            subtask: 0,
            parallelism: 1,
            attempt: 0,
            checkpoint_interval_ms: 1_000,
            password: None,
            restored_checkpoint_id: -1,
            writer_states: Vec::new(),
            known_handles: Vec::new(),
        }
    }

    #[test]
    fn every_role_opens_and_closes() {
        let dir = temp_dir("open");
        let config = crate::config::tests::fs_config(dir.to_str().unwrap());
        for role in [Role::Sink, Role::Writer, Role::Committer] {
            let id = open(role, args(config.clone())).unwrap();
            registry::remove(id).unwrap();
            assert!(registry::remove(id).is_err());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn mistakes_in_the_ids_and_state_are_named() {
        let dir = temp_dir("ids");
        let config = crate::config::tests::fs_config(dir.to_str().unwrap());
        type Case = (fn(&mut OpenArgs), JavaException);
        let cases: Vec<Case> = vec![
            (|a| a.subtask = 3, JavaException::Config),
            (|a| a.subtask = -1, JavaException::Config),
            (|a| a.attempt = -1, JavaException::Config),
            (|a| a.run_id = String::new(), JavaException::Config),
            (
                |a| {
                    a.restored_checkpoint_id = 3;
                    a.known_handles = vec![b"TWPC garbage".to_vec()];
                },
                JavaException::State,
            ),
            (
                |a| {
                    a.restored_checkpoint_id = 3;
                    a.writer_states = vec![vec![0; 40]];
                },
                JavaException::State,
            ),
            (
                |a| a.known_handles = vec![vec![1]],
                JavaException::IllegalArgument,
            ),
        ];
        for (i, (change, class)) in cases.into_iter().enumerate() {
            let mut a = args(config.clone());
            change(&mut a);
            let err = open(Role::Writer, a).unwrap_err();
            assert_eq!(class_of(&err), class, "case {i}: {err}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
