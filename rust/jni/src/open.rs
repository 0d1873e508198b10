//! `NativeBridge.open` and `openPostgres`: from Flink's view of a subtask
//! (ids, options, restored state) to a running `SubtaskSink`.
//!
//! Both entry points share one path: [`SinkSetup`] reads the settings every
//! destination has (ids, retention, recovery policies, commit retries) and
//! decodes the restored state; a per-destination function builds the
//! destination; [`start`] runs recovery and registers the sink. Everything
//! is validated before the destination is touched, so a configuration
//! mistake fails the job at start with the setting to change, and damaged
//! state fails it before recovery acts on anything.

use std::path::PathBuf;
use std::time::Duration;

use twopc_core::config::validate_retention;
use twopc_core::{
    Destination, FreshStartPolicy, Restore, RetryPolicy, RewindPolicy, RunId, SinkId, SinkOptions,
    SubtaskContext, SubtaskSink, SystemClock, TransactionHandle, TwopcError,
};
use twopc_fs::{FsDestination, FsOptions, RecordFormat};
use twopc_pg::{CopyFormat, Endpoint, Password, PgDestination, PgMode, PgOptions};

use crate::args::non_negative;
use crate::error::{BridgeError, BridgeResult};
use crate::registry;

/// The settings of `open` and `openPostgres` that do not depend on the
/// destination, already read from the JVM.
pub(crate) struct SinkArgs {
    pub sink_id: String,
    pub run_id: String,
    pub subtask: i32,
    pub parallelism: i32,
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

/// The filesystem settings of `NativeBridge.open`.
pub(crate) struct FsArgs {
    pub output_dir: String,
    pub part_prefix: String,
    pub part_suffix: String,
    pub raw_format: bool,
}

/// The PostgreSQL settings of `NativeBridge.openPostgres`. Either `url` or
/// `host` (with port, database and user) names the server.
pub(crate) struct PgArgs {
    pub url: Option<String>,
    pub host: Option<String>,
    pub port: i32,
    pub database: Option<String>,
    pub user: Option<String>,
    /// Kept out of every message and log line (see `twopc_pg::Password`).
    pub password: Option<String>,
    pub table: String,
    pub columns: Vec<String>,
    /// `transactional` or `idempotent`.
    pub mode: String,
    pub key_columns: Vec<String>,
    /// `text` or `csv`.
    pub copy_format: String,
    pub transaction_id_column: Option<String>,
    pub control_schema: String,
    pub connect_timeout_ms: i64,
}

/// Opens a sink on the filesystem destination and registers it; returns its
/// id.
pub(crate) fn open_filesystem(sink: SinkArgs, fs: FsArgs) -> BridgeResult<i64> {
    let setup = SinkSetup::new(sink)?;
    let options = fs.into_options()?;
    let dest =
        FsDestination::open(options, &setup.ctx.sink).map_err(|source| TwopcError::Scan {
            scope: setup.ctx.scope(),
            action: "opening the output directory",
            source,
        })?;
    start(setup, Box::new(dest), "filesystem")
}

/// Opens a sink on the PostgreSQL destination and registers it; returns its
/// id. `PgDestination::connect` checks the server and the table before the
/// first record.
pub(crate) fn open_postgres(sink: SinkArgs, pg: PgArgs) -> BridgeResult<i64> {
    let setup = SinkSetup::new(sink)?;
    let options = pg.into_options()?;
    let dest = PgDestination::connect(options, &setup.ctx)?;
    start(setup, Box::new(dest), "PostgreSQL")
}

/// What every destination needs to start a subtask's sink.
struct SinkSetup {
    ctx: SubtaskContext,
    options: SinkOptions,
    restore: Option<Restore>,
}

impl SinkSetup {
    /// Validates the destination-independent settings and decodes the
    /// restored state.
    fn new(args: SinkArgs) -> BridgeResult<Self> {
        let sink_id = SinkId::new(args.sink_id)?;
        // The run is Flink's job id: kept by failover restarts, new for
        // every submission, which is what the core's fresh-start rules need.
        let run = RunId::new(args.run_id)?;
        let subtask = u32::try_from(args.subtask).map_err(|_| {
            BridgeError::config(format!("subtask index {} is negative", args.subtask))
        })?;
        let parallelism = u32::try_from(args.parallelism).map_err(|_| {
            BridgeError::config(format!("parallelism {} is negative", args.parallelism))
        })?;
        let ctx = SubtaskContext::new(sink_id, run, subtask, parallelism)?;

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
                max_backoff_ms: non_negative(
                    args.commit_max_backoff_ms,
                    "commit max backoff (ms)",
                )?,
            },
            ..SinkOptions::default()
        };
        let restore = restore(&ctx, args.restored_checkpoint_id, &args.known_handles)?;
        Ok(SinkSetup {
            ctx,
            options,
            restore,
        })
    }
}

/// Runs recovery on `dest` and registers the running sink.
fn start(setup: SinkSetup, dest: Box<dyn Destination + Send>, kind: &str) -> BridgeResult<i64> {
    let (sink, _report) = SubtaskSink::open(
        dest,
        SystemClock,
        setup.ctx,
        setup.options,
        setup.restore.as_ref(),
        None,
    )?;
    let scope = sink.scope();
    let id = registry::insert(sink);
    log::debug!(target: "twopc::jni", "{scope}: open on the {kind} destination as native sink #{id}");
    Ok(id)
}

impl FsArgs {
    fn into_options(self) -> BridgeResult<FsOptions> {
        let options = FsOptions {
            output_dir: PathBuf::from(self.output_dir),
            part_prefix: self.part_prefix,
            part_suffix: self.part_suffix,
            format: if self.raw_format {
                RecordFormat::Raw
            } else {
                RecordFormat::Lines
            },
            io_mode: twopc_fs::IoMode::Auto,
        };
        options.validate()?;
        Ok(options)
    }
}

impl PgArgs {
    /// The destination's options, checked as far as they can be without a
    /// server (`PgOptions::validate` plus what only the bridge knows: which
    /// of the Java arguments were given).
    fn into_options(self) -> BridgeResult<PgOptions> {
        let endpoint =
            match (self.url, self.host) {
                (Some(url), None) => {
                    if self.database.is_some() || self.user.is_some() {
                        return Err(BridgeError::config(
                        "the PostgreSQL connection is given both as a URL and as database/user; \
                         put the database and user into the URL, or give host, port, database \
                         and user instead of the URL",
                    ));
                    }
                    Endpoint::Url(url)
                }
                (None, Some(host)) => Endpoint::Params {
                    host,
                    port: u16::try_from(self.port).map_err(|_| {
                        BridgeError::config(format!(
                            "PostgreSQL port {} is not a TCP port; set 1..65535 (5432 by default)",
                            self.port
                        ))
                    })?,
                    dbname: self.database.unwrap_or_default(),
                    user: self.user.unwrap_or_default(),
                },
                (Some(_), Some(_)) => return Err(BridgeError::config(
                    "the PostgreSQL connection is given both as a URL and as a host; set one of \
                     them",
                )),
                (None, None) => return Err(BridgeError::config(
                    "no PostgreSQL connection is set; give a URL (postgres://user@host:5432/db) \
                     or host, port, database and user",
                )),
            };
        let mode = match self.mode.to_ascii_lowercase().as_str() {
            "transactional" => {
                if !self.key_columns.is_empty() {
                    return Err(BridgeError::config(format!(
                        "key columns {:?} are set for transactional mode, which does not use \
                         them; remove them, or choose idempotent mode",
                        self.key_columns
                    )));
                }
                PgMode::Transactional
            }
            "idempotent" => PgMode::Idempotent {
                key_columns: self.key_columns,
            },
            other => {
                return Err(BridgeError::config(format!(
                    "unknown PostgreSQL mode {other:?}; choose transactional or idempotent"
                )))
            }
        };
        let copy_format = match self.copy_format.to_ascii_lowercase().as_str() {
            "text" => CopyFormat::Text,
            "csv" => CopyFormat::Csv,
            other => {
                return Err(BridgeError::config(format!(
                    "unknown COPY format {other:?}; choose text or csv"
                )))
            }
        };
        let connect_timeout_ms = non_negative(self.connect_timeout_ms, "connect timeout (ms)")?;
        let options = PgOptions {
            endpoint,
            password: self.password.map(Password::new),
            table: self.table,
            columns: self.columns,
            mode,
            copy_format,
            control_schema: self.control_schema,
            transaction_id_column: self.transaction_id_column,
            connect_timeout: Duration::from_millis(connect_timeout_ms),
        };
        options.validate()?;
        Ok(options)
    }
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
        states: Vec::new(),
        checkpoint,
        known: handles,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::JavaException;

    fn sink_args() -> SinkArgs {
        SinkArgs {
            sink_id: "orders".into(),
            run_id: "a1b2c3d4e5f60718293a4b5c6d7e8f90".into(),
            subtask: 0,
            parallelism: 1,
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

    fn fs_args(dir: &std::path::Path) -> FsArgs {
        FsArgs {
            output_dir: dir.to_string_lossy().into_owned(),
            part_prefix: "part".into(),
            part_suffix: ".txt".into(),
            raw_format: false,
        }
    }

    /// Settings that pass every check made without a server; the port is
    /// one nothing listens on, so a test that got as far as connecting
    /// would fail with a connection error, not a configuration error.
    fn pg_args() -> PgArgs {
        PgArgs {
            url: None,
            host: Some("127.0.0.1".into()),
            port: 1,
            database: Some("db".into()),
            user: Some("u".into()),
            password: Some("pw-never-shown".into()),
            table: "public.orders".into(),
            columns: vec!["id".into(), "body".into()],
            mode: "transactional".into(),
            key_columns: Vec::new(),
            copy_format: "text".into(),
            transaction_id_column: None,
            control_schema: "public".into(),
            connect_timeout_ms: 1_000,
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
        let id = open_filesystem(sink_args(), fs_args(&dir)).unwrap();
        registry::remove(id).unwrap();
        assert!(registry::remove(id).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn configuration_mistakes_are_config_errors() {
        let dir = temp_dir("config");
        let sink_cases: Vec<fn(&mut SinkArgs)> = vec![
            |a| a.retention_ms = 1_000,
            |a| a.checkpoint_interval_ms = 0,
            |a| a.retention_ms = -5,
            |a| a.sink_id = "../etc".into(),
            |a| a.run_id = String::new(),
            |a| a.subtask = 3,
            |a| a.subtask = -1,
            |a| a.commit_max_attempts = 0,
        ];
        for (i, change) in sink_cases.iter().enumerate() {
            let mut a = sink_args();
            change(&mut a);
            // Destination-independent settings fail the same way for both
            // destinations, before either is touched.
            let err = open_filesystem(a, fs_args(&dir)).unwrap_err();
            assert_eq!(class_of(&err), JavaException::Config, "fs case {i}: {err}");
            let mut a = sink_args();
            change(&mut a);
            let err = open_postgres(a, pg_args()).unwrap_err();
            assert_eq!(class_of(&err), JavaException::Config, "pg case {i}: {err}");
        }
        let mut fs = fs_args(&dir);
        fs.part_suffix = "txt".into();
        let err = open_filesystem(sink_args(), fs).unwrap_err();
        assert_eq!(class_of(&err), JavaException::Config, "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn postgres_settings_are_checked_before_connecting() {
        // Each case: a change to working settings, and what its message says.
        type Case = (fn(&mut PgArgs), &'static str);
        let cases: Vec<Case> = vec![
            (|a| a.host = None, "no PostgreSQL connection is set"),
            (
                |a| a.url = Some("postgres://u@h/db".into()),
                "both as a URL and as a host",
            ),
            (
                |a| {
                    a.host = None;
                    a.url = Some("postgres://u@h/db".into());
                },
                "both as a URL and as database/user",
            ),
            (|a| a.port = 70_000, "not a TCP port"),
            (|a| a.user = None, "user is empty"),
            (
                |a| a.mode = "eventual".into(),
                "choose transactional or idempotent",
            ),
            (|a| a.key_columns = vec!["id".into()], "remove them"),
            (|a| a.mode = "idempotent".into(), "needs key_columns"),
            (
                |a| {
                    a.mode = "IDEMPOTENT".into();
                    a.key_columns = vec!["nope".into()];
                },
                "not in columns",
            ),
            (|a| a.copy_format = "binary".into(), "choose text or csv"),
            (|a| a.columns.clear(), "columns is empty"),
            (|a| a.table = "a.b.c".into(), "table"),
            (|a| a.connect_timeout_ms = 0, "connect_timeout"),
            (|a| a.connect_timeout_ms = -1, "must not be negative"),
            (
                |a| a.transaction_id_column = Some("body".into()),
                "also in columns",
            ),
            // A password inside the connection string: refused before
            // connecting, never shown.
            (
                |a| {
                    a.host = None;
                    a.database = None;
                    a.user = None;
                    a.url = Some("postgres://u:pw-never-shown/x@h/db".into());
                },
                "passwordFromEnvironment",
            ),
            (
                |a| {
                    a.host = None;
                    a.database = None;
                    a.user = None;
                    a.url = Some("host=h user=u password = 'pw-never-shown' dbname=db".into());
                },
                "passwordFromSystemProperty",
            ),
        ];
        for (i, (change, expected)) in cases.iter().enumerate() {
            let mut a = pg_args();
            change(&mut a);
            let err = open_postgres(sink_args(), a).unwrap_err();
            assert_eq!(class_of(&err), JavaException::Config, "case {i}: {err}");
            let text = err.to_string();
            assert!(text.contains(expected), "case {i}: {text}");
            assert!(!text.contains("pw-never-shown"), "case {i}: {text}");
        }
    }

    #[test]
    fn an_unreachable_server_is_retryable_and_keeps_the_password_out() {
        let err = open_postgres(sink_args(), pg_args()).unwrap_err();
        assert_eq!(class_of(&err), JavaException::Twopc, "{err}");
        assert!(!err.to_string().contains("pw-never-shown"), "{err}");
    }

    #[test]
    fn damaged_restored_handles_are_named() {
        let dir = temp_dir("restore");
        let mut a = sink_args();
        a.restored_checkpoint_id = 3;
        a.known_handles = vec![b"TWPC garbage".to_vec()];
        let err = open_filesystem(a, fs_args(&dir)).unwrap_err();
        assert_eq!(class_of(&err), JavaException::State);
        assert!(err.to_string().contains("knownHandles[0] of 1"), "{err}");

        let mut a = sink_args();
        a.known_handles = vec![Vec::new()];
        let err = open_filesystem(a, fs_args(&dir)).unwrap_err();
        assert_eq!(class_of(&err), JavaException::IllegalArgument, "{err}");

        // The restored state is read before PostgreSQL is contacted.
        let mut a = sink_args();
        a.restored_checkpoint_id = 3;
        a.known_handles = vec![b"TWPC garbage".to_vec()];
        let err = open_postgres(a, pg_args()).unwrap_err();
        assert_eq!(class_of(&err), JavaException::State, "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
