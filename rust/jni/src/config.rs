//! The one configuration of a sink, as the Java builders write it: JSON,
//! versioned, with the sink's settings and a tagged destination section.
//! It is decoded and validated here, once, both when the Java builder's
//! `build()` asks (so a mistake is refused before the job is submitted)
//! and when a subtask opens the sink (so Java and Rust cannot disagree).
//!
//! ```json
//! {"version": 1,
//!  "sink": {"sinkId": "orders", "instance": "00112233aabbccdd", ...},
//!  "destination": {"type": "filesystem", "path": "/data/out", ...}}
//! ```
//!
//! Unknown fields are refused (a misspelt setting must not be silently
//! ignored). A password is never part of it: the PostgreSQL section names
//! where the task manager reads one (an environment variable or a system
//! property), and the password itself crosses at open, apart.

use std::path::PathBuf;
use std::time::Duration;
use twopc_core::timefmt::exact;

use serde::Deserialize;
use twopc_core::config::{validate_retention, FreshStartPolicy, RetryPolicy, RewindPolicy};
use twopc_core::error::ConfigError;
use twopc_core::{Destination, SinkId, SinkOptions, SubtaskContext, TwopcError};
use twopc_fs::{CommitOrder, FsDestination, FsOptions, IoMode, RecordFormat};
use twopc_objstore::{ObjectStoreDestination, S3Options};
use twopc_pg::{CopyFormat, Endpoint, Password, PgDestination, PgMode, PgOptions};

/// The version this release writes and reads.
pub const CONFIG_VERSION: u32 = 1;

/// Configurations are small; anything larger is not one.
const MAX_CONFIG_LEN: usize = 1 << 20;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    version: u32,
    sink: SinkSection,
    destination: DestinationSection,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SinkSection {
    sink_id: String,
    /// 16 hex digits, drawn when the sink was built.
    instance: String,
    retention_ms: u64,
    restart_allowance_ms: u64,
    /// 0 when the front end detects it at open.
    #[serde(default)]
    checkpoint_interval_ms: u64,
    rewind_policy: String,
    fresh_start_policy: String,
    commit_max_attempts: u32,
    commit_initial_backoff_ms: u64,
    commit_max_backoff_ms: u64,
    #[serde(default = "defaults::owner_wait_ms")]
    owner_wait_ms: u64,
    #[serde(default = "defaults::lineage_wait_ms")]
    lineage_wait_ms: u64,
    #[serde(default = "defaults::expiry_scan_interval_ms")]
    expiry_scan_interval_ms: u64,
}

mod defaults {
    pub fn owner_wait_ms() -> u64 {
        twopc_core::SinkOptions::default().owner_wait_ms
    }
    pub fn lineage_wait_ms() -> u64 {
        twopc_core::SinkOptions::default().lineage_wait_ms
    }
    pub fn expiry_scan_interval_ms() -> u64 {
        twopc_core::SinkOptions::default().expiry_scan_interval_ms
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum DestinationSection {
    Filesystem(FsSection),
    Postgres(PgSection),
    S3(S3Section),
}

/// An S3-compatible object store: `s3://bucket/prefix` where a directory
/// path goes for the filesystem. Credentials are never part of it: each
/// task manager reads them from the standard AWS environment and profile
/// chain.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct S3Section {
    url: String,
    /// Another endpoint than AWS's (an S3-compatible store, a local server).
    endpoint: Option<String>,
    region: Option<String>,
    #[serde(default)]
    path_style: bool,
    #[serde(default)]
    allow_http: bool,
    /// The AWS profile to read when the environment has no keys.
    profile: Option<String>,
    part_prefix: String,
    part_suffix: String,
    record_format: String,
    part_size_bytes: Option<u64>,
    /// How long savepoints that may be restored are kept: prepared uploads
    /// must outlive it (the bucket's lifecycle rules are checked at open).
    #[serde(default)]
    savepoint_retention_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FsSection {
    path: String,
    part_prefix: String,
    part_suffix: String,
    record_format: String,
    io_mode: String,
    /// Optional: DURABLE_FIRST when absent.
    #[serde(default)]
    commit_order: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PgSection {
    url: Option<String>,
    host: Option<String>,
    port: Option<u32>,
    database: Option<String>,
    user: Option<String>,
    /// `env:NAME`, `property:NAME` or `option:password`: where each task
    /// manager reads the password (never the password itself; `option:`
    /// means the SQL connector's table option, shipped with the sink and
    /// handed over at open like the others).
    password_source: Option<String>,
    table: String,
    columns: Vec<String>,
    mode: String,
    #[serde(default)]
    key_columns: Vec<String>,
    /// Idempotent mode: records end with an operation field (`U` upsert,
    /// `D` delete by key).
    #[serde(default)]
    operation_field: bool,
    /// The SQL connector's column types (see `twopc_pg`'s start-up check);
    /// absent for DataStream jobs.
    #[serde(default)]
    column_types: Vec<String>,
    copy_format: String,
    transaction_id_column: Option<String>,
    control_schema: String,
    connect_timeout_ms: u64,
}

/// A decoded, validated configuration.
#[derive(Debug)]
pub struct SinkConfig {
    pub sink: SinkId,
    pub instance: u64,
    pub options: SinkOptions,
    retention_ms: u64,
    restart_allowance_ms: u64,
    checkpoint_interval_ms: u64,
    destination: DestinationSpec,
}

#[derive(Debug)]
enum DestinationSpec {
    Filesystem(FsOptions),
    Postgres(Box<PgOptions>),
    ObjectStore {
        options: Box<S3Options>,
        savepoint_retention_ms: u64,
    },
}

fn config_error(msg: impl Into<String>) -> ConfigError {
    ConfigError::new(msg)
}

fn policy<T>(what: &str, value: &str, choices: &[(&str, T)]) -> Result<T, ConfigError>
where
    T: Copy,
{
    choices
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(value))
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            config_error(format!(
                "unknown {what} {value:?}; choose one of {}",
                choices
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

impl SinkConfig {
    /// Decodes and validates a configuration. Any input, however damaged,
    /// gives a `ConfigError` saying what to change, never a panic.
    pub fn decode(text: &str) -> Result<SinkConfig, ConfigError> {
        if text.len() > MAX_CONFIG_LEN {
            return Err(config_error(format!(
                "the sink configuration has {} bytes, more than any real one ({MAX_CONFIG_LEN})",
                text.len()
            )));
        }
        let value = serde_json::from_str::<serde_json::Value>(text).ok();
        let version = value
            .as_ref()
            .and_then(|v| v.get("version").and_then(|v| v.as_u64()));
        // The sink id, when it can be read, names the sink in errors the
        // document's shape causes (a job may have several sinks).
        let named = value
            .as_ref()
            .and_then(|v| v.get("sink")?.get("sinkId")?.as_str())
            .and_then(|id| SinkId::new(id).ok());
        match version {
            Some(v) if v == u64::from(CONFIG_VERSION) => {}
            Some(v) => {
                return Err(config_error(format!(
                    "the sink configuration has version {v}, but this twopc library reads \
                     version {CONFIG_VERSION}: the jar's Java classes and its native library \
                     come from different releases; use one jar"
                )))
            }
            None => {
                return Err(config_error(
                    "the sink configuration is not a twopc configuration (no version)",
                ))
            }
        }
        let doc: Document = serde_json::from_str(text).map_err(|e| {
            config_error(match &named {
                Some(sink) => format!("sink '{sink}': the sink configuration is not valid: {e}"),
                None => format!("the sink configuration is not valid: {e}"),
            })
        })?;
        debug_assert_eq!(doc.version, CONFIG_VERSION);
        Self::from_document(doc)
    }

    fn from_document(doc: Document) -> Result<SinkConfig, ConfigError> {
        let sink = SinkId::new(doc.sink.sink_id.clone())?;
        // Every later error names the sink: a job may have several.
        Self::from_document_of(doc, sink.clone())
            .map_err(|e| config_error(format!("sink '{sink}': {}", e.message())))
    }

    fn from_document_of(doc: Document, sink: SinkId) -> Result<SinkConfig, ConfigError> {
        let s = doc.sink;
        let instance = (s.instance.len() == 16)
            .then(|| u64::from_str_radix(&s.instance, 16).ok())
            .flatten()
            .ok_or_else(|| {
                config_error(format!(
                    "the sink instance {:?} is not 16 hex digits",
                    s.instance
                ))
            })?;
        let rewind = policy(
            "rewind policy",
            &s.rewind_policy,
            &[
                ("FAIL", RewindPolicy::Fail),
                ("REPLACE_RANGE", RewindPolicy::ReplaceRange),
            ],
        )?;
        let fresh_start = policy(
            "fresh-start policy",
            &s.fresh_start_policy,
            &[
                ("FAIL", FreshStartPolicy::Fail),
                ("ABORT_PREPARED", FreshStartPolicy::AbortPrepared),
                ("APPEND", FreshStartPolicy::Append),
                (
                    "APPEND_AND_ABORT_PREPARED",
                    FreshStartPolicy::AppendAndAbortPrepared,
                ),
            ],
        )?;
        if s.commit_max_attempts == 0 {
            return Err(config_error(
                "commit max attempts must be at least 1 (the first attempt counts)",
            ));
        }
        if s.commit_initial_backoff_ms > s.commit_max_backoff_ms {
            return Err(config_error(format!(
                "the initial commit back-off ({}) exceeds the maximum back-off ({})",
                exact(s.commit_initial_backoff_ms),
                exact(s.commit_max_backoff_ms)
            )));
        }
        if s.checkpoint_interval_ms > 0 {
            validate_retention(
                s.retention_ms,
                s.checkpoint_interval_ms,
                s.restart_allowance_ms,
            )?;
        } else if s.retention_ms == 0 {
            return Err(config_error(
                "the staged-transaction retention must not be 0",
            ));
        }
        let options = SinkOptions {
            retention_ms: s.retention_ms,
            rewind,
            fresh_start,
            commit_retry: RetryPolicy {
                max_attempts: s.commit_max_attempts,
                initial_backoff_ms: s.commit_initial_backoff_ms,
                max_backoff_ms: s.commit_max_backoff_ms,
            },
            expiry_scan_interval_ms: s.expiry_scan_interval_ms,
            owner_wait_ms: s.owner_wait_ms,
            lineage_wait_ms: s.lineage_wait_ms,
            history: Default::default(),
        };
        let destination = match doc.destination {
            DestinationSection::Filesystem(f) => DestinationSpec::Filesystem(fs_options(f)?),
            DestinationSection::Postgres(p) => {
                DestinationSpec::Postgres(Box::new(pg_options(p, rewind)?))
            }
            DestinationSection::S3(o) => DestinationSpec::ObjectStore {
                savepoint_retention_ms: o.savepoint_retention_ms,
                options: Box::new(s3_options(o)?),
            },
        };
        Ok(SinkConfig {
            sink,
            instance,
            options,
            retention_ms: s.retention_ms,
            restart_allowance_ms: s.restart_allowance_ms,
            checkpoint_interval_ms: s.checkpoint_interval_ms,
            destination,
        })
    }

    /// The checkpoint interval the retention must cover: the longer of the
    /// job's, as the front end detected it at open, and the configured one.
    /// The job's counts whatever is configured: a configured interval
    /// shorter than the job's passed a retention too short for it, and the
    /// first ordinary restart found prepared transactions expired (found
    /// by review). A longer configured one counts too: checkpoints may be
    /// rarer than the job's interval says (interval-during-backlog).
    fn interval_in_force(&self, detected_ms: u64) -> u64 {
        detected_ms.max(self.checkpoint_interval_ms)
    }

    /// The retention check against the checkpoint interval in force.
    pub fn check_interval(&self, detected_ms: u64) -> Result<(), ConfigError> {
        let interval = self.interval_in_force(detected_ms);
        validate_retention(self.retention_ms, interval, self.restart_allowance_ms)
            .map_err(|e| config_error(format!("sink '{}': {}", self.sink, e.message())))
    }

    /// A short description for log lines: no password can be in it.
    pub fn describe(&self) -> String {
        match &self.destination {
            DestinationSpec::Filesystem(f) => format!(
                "sink '{}' on directory {}",
                self.sink,
                f.output_dir.display()
            ),
            DestinationSpec::Postgres(p) => format!(
                "sink '{}' on PostgreSQL table {} ({:?})",
                self.sink, p.table, p.endpoint
            ),
            DestinationSpec::ObjectStore { options, .. } => format!(
                "sink '{}' on object store {}{}",
                self.sink,
                options.url,
                options
                    .endpoint
                    .as_ref()
                    .map(|e| format!(" at {e}"))
                    .unwrap_or_default()
            ),
        }
    }

    /// How long a prepared transaction must survive at the destination,
    /// for a writer whose job checkpoints every `detected_ms` (0: unknown;
    /// see `interval_in_force`).
    pub fn needed_retention_ms(&self, detected_ms: u64) -> u64 {
        let interval = self.interval_in_force(detected_ms);
        let savepoints = match &self.destination {
            DestinationSpec::ObjectStore {
                savepoint_retention_ms,
                ..
            } => *savepoint_retention_ms,
            _ => 0,
        };
        twopc_objstore::retention::needed_retention_ms(
            interval,
            self.restart_allowance_ms,
            savepoints,
        )
    }

    /// Opens the configured destination for `ctx`'s subtask (the factory:
    /// the only place that knows every kind). `password` is the one the
    /// task manager read from the source the configuration names.
    ///
    /// `needed_retention_ms` is given for a writer: an object store's
    /// lifecycle rules are checked against it (a committer only commits
    /// what writers prepared).
    pub fn open_destination(
        &self,
        ctx: &SubtaskContext,
        password: Option<String>,
        needed_retention_ms: Option<u64>,
    ) -> Result<Box<dyn Destination + Send>, TwopcError> {
        match &self.destination {
            DestinationSpec::ObjectStore { options, .. } => {
                let opened = match needed_retention_ms {
                    Some(needed) => ObjectStoreDestination::open_checked(
                        (**options).clone(),
                        &self.sink,
                        needed,
                    ),
                    None => ObjectStoreDestination::open((**options).clone(), &self.sink),
                };
                let mut dest = opened.map_err(|source| TwopcError::Scan {
                    scope: ctx.scope(),
                    action: "opening the object store",
                    source,
                })?;
                // The Sink V2 committer claims no lease (its writer does):
                // told its attempt, its clean-up is refused once a newer
                // attempt holds the share. A writer's claimed lease takes
                // precedence over this.
                dest.watch_ownership(ctx.owner_claim());
                Ok(Box::new(dest))
            }
            DestinationSpec::Filesystem(options) => {
                let dest = FsDestination::open(options.clone(), &self.sink).map_err(|source| {
                    TwopcError::Scan {
                        scope: ctx.scope(),
                        action: "opening the output directory",
                        source,
                    }
                })?;
                Ok(Box::new(dest))
            }
            DestinationSpec::Postgres(options) => {
                let mut options = (**options).clone();
                options.password = password.map(Password::new);
                // A configuration the server refuses (no such table, a
                // column missing) names the sink, as every error does.
                let dest = PgDestination::connect(options, ctx).map_err(|e| match e {
                    TwopcError::Config(c) if !c.message().starts_with("sink '") => {
                        TwopcError::Config(config_error(format!(
                            "sink '{}': {}",
                            self.sink,
                            c.message()
                        )))
                    }
                    other => other,
                })?;
                Ok(Box::new(dest))
            }
        }
    }
}

fn fs_options(f: FsSection) -> Result<FsOptions, ConfigError> {
    let options = FsOptions {
        output_dir: PathBuf::from(f.path),
        part_prefix: f.part_prefix,
        part_suffix: f.part_suffix,
        format: policy(
            "record format",
            &f.record_format,
            &[("LINES", RecordFormat::Lines), ("RAW", RecordFormat::Raw)],
        )?,
        io_mode: policy(
            "I/O mode",
            &f.io_mode,
            &[
                ("AUTO", IoMode::Auto),
                ("DIRECT", IoMode::Direct),
                ("BUFFERED", IoMode::Buffered),
            ],
        )?,
        commit_order: match &f.commit_order {
            None => CommitOrder::DurableFirst,
            Some(order) => policy(
                "commit order",
                order,
                &[
                    ("DURABLE_FIRST", CommitOrder::DurableFirst),
                    ("VISIBLE_FIRST", CommitOrder::VisibleFirst),
                ],
            )?,
        },
    };
    options.validate()?;
    Ok(options)
}

fn s3_options(o: S3Section) -> Result<S3Options, ConfigError> {
    let mut options = S3Options::new(o.url);
    options.endpoint = o.endpoint;
    if let Some(region) = o.region {
        options.region = region;
    }
    options.path_style = o.path_style;
    options.allow_http = o.allow_http;
    options.profile = o.profile;
    options.part_prefix = o.part_prefix;
    options.part_suffix = o.part_suffix;
    options.format = policy(
        "record format",
        &o.record_format,
        &[
            ("LINES", twopc_objstore::RecordFormat::Lines),
            ("RAW", twopc_objstore::RecordFormat::Raw),
        ],
    )?;
    if let Some(size) = o.part_size_bytes {
        options.part_size = usize::try_from(size)
            .map_err(|_| config_error(format!("part size {size} bytes is too large")))?;
    }
    options.validate()?;
    Ok(options)
}

fn pg_options(p: PgSection, rewind: RewindPolicy) -> Result<PgOptions, ConfigError> {
    let endpoint =
        match (p.url, p.host) {
            (Some(url), None) => {
                if p.database.is_some() || p.user.is_some() || p.port.is_some() {
                    return Err(config_error(
                    "the PostgreSQL connection is given both as a URL and as port/database/user; \
                     put them into the URL, or give host, port, database and user instead",
                ));
                }
                Endpoint::Url(url)
            }
            (None, Some(host)) => Endpoint::Params {
                host,
                port: p
                    .port
                    .and_then(|port| u16::try_from(port).ok())
                    .filter(|port| *port > 0)
                    .ok_or_else(|| {
                        config_error(format!(
                        "PostgreSQL port {:?} is not a TCP port; set 1..65535 (5432 by default)",
                        p.port
                    ))
                    })?,
                dbname: p.database.unwrap_or_default(),
                user: p.user.unwrap_or_default(),
            },
            (Some(_), Some(_)) => return Err(config_error(
                "the PostgreSQL connection is given both as a URL and as a host; set one of them",
            )),
            (None, None) => return Err(config_error(
                "no PostgreSQL connection is set; give a URL (postgres://user@host:5432/db) or \
                 host, port, database and user",
            )),
        };
    if let Some(source) = &p.password_source {
        let ok = source.split_once(':').is_some_and(|(kind, name)| {
            matches!(kind, "env" | "property" | "option") && !name.is_empty()
        });
        if !ok {
            return Err(config_error(format!(
                "the password source {source:?} is none of env:<VARIABLE>, property:<name> and \
                 option:<name>"
            )));
        }
    }
    let mode = match p.mode.to_ascii_uppercase().as_str() {
        "TRANSACTIONAL" => {
            if !p.key_columns.is_empty() {
                return Err(config_error(format!(
                    "key columns {:?} are set for transactional mode, which does not use them; \
                     remove them, or choose idempotent mode",
                    p.key_columns
                )));
            }
            PgMode::Transactional
        }
        "IDEMPOTENT" => PgMode::Idempotent {
            key_columns: p.key_columns,
        },
        other => {
            return Err(config_error(format!(
                "unknown PostgreSQL mode {other:?}; choose TRANSACTIONAL or IDEMPOTENT"
            )))
        }
    };
    if rewind == RewindPolicy::ReplaceRange && matches!(mode, PgMode::Idempotent { .. }) {
        return Err(config_error(
            "the rewind policy REPLACE_RANGE applies to PostgreSQL's transactional mode only (in \
             idempotent mode a replay rewrites the same keys, so there is no rewind to repair); use \
             the rewind policy FAIL",
        ));
    }
    if rewind == RewindPolicy::ReplaceRange && p.transaction_id_column.is_none() {
        return Err(config_error(
            "the rewind policy REPLACE_RANGE needs a transaction-id column on PostgreSQL (set \
             transactionIdColumn): without it the rows a rewind must remove cannot be told apart \
             from the others",
        ));
    }
    let copy_format = policy(
        "COPY format",
        &p.copy_format,
        &[("TEXT", CopyFormat::Text), ("CSV", CopyFormat::Csv)],
    )?;
    let options = PgOptions {
        endpoint,
        password: None,
        table: p.table,
        columns: p.columns,
        mode,
        copy_format,
        control_schema: p.control_schema,
        transaction_id_column: p.transaction_id_column,
        operation_field: p.operation_field,
        declared_types: p.column_types,
        connect_timeout: Duration::from_millis(p.connect_timeout_ms),
    };
    options.validate()?;
    Ok(options)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn fs_config(path: &str) -> String {
        format!(
            r#"{{"version":1,"sink":{{"sinkId":"orders","instance":"00000000000000aa",
            "retentionMs":604800000,"restartAllowanceMs":600000,"checkpointIntervalMs":1000,
            "rewindPolicy":"FAIL","freshStartPolicy":"FAIL","commitMaxAttempts":5,
            "commitInitialBackoffMs":100,"commitMaxBackoffMs":5000}},
            "destination":{{"type":"filesystem","path":"{path}","partPrefix":"part",
            "partSuffix":"","recordFormat":"LINES","ioMode":"AUTO"}}}}"#
        )
    }

    fn pg_config(extra: &str) -> String {
        format!(
            r#"{{"version":1,"sink":{{"sinkId":"orders","instance":"00000000000000aa",
            "retentionMs":604800000,"restartAllowanceMs":600000,
            "rewindPolicy":"REPLACE_RANGE","freshStartPolicy":"APPEND","commitMaxAttempts":5,
            "commitInitialBackoffMs":100,"commitMaxBackoffMs":5000}},
            "destination":{{"type":"postgres","url":"postgres://app@db/shop",
            "passwordSource":"env:PW","table":"public.orders","columns":["id","body"],
            "mode":"TRANSACTIONAL","copyFormat":"CSV","controlSchema":"public",
            "connectTimeoutMs":1000{extra}}}}}"#
        )
    }

    fn s3_config(url: &str, extra: &str) -> String {
        fs_config("/x").replace(
            r#"{"type":"filesystem","path":"/x","partPrefix":"part",
            "partSuffix":"","recordFormat":"LINES","ioMode":"AUTO"}"#,
            &format!(
                r#"{{"type":"s3","url":"{url}","endpoint":"http://127.0.0.1:1","pathStyle":true,
                "allowHttp":true,"partPrefix":"part","partSuffix":".csv","recordFormat":"LINES"{extra}}}"#
            ),
        )
    }

    #[test]
    fn an_object_store_configuration_decodes_and_is_checked() {
        let c = SinkConfig::decode(&s3_config(
            "s3://bucket/out",
            r#","savepointRetentionMs":86400000,"partSizeBytes":16777216"#,
        ))
        .unwrap();
        assert!(c
            .describe()
            .contains("s3://bucket/out at http://127.0.0.1:1"));
        let DestinationSpec::ObjectStore {
            options,
            savepoint_retention_ms,
        } = &c.destination
        else {
            panic!("an object store")
        };
        assert_eq!(*savepoint_retention_ms, 86_400_000);
        assert_eq!(options.part_size, 16 << 20);
        assert!(options.path_style && options.allow_http);
        // Two intervals, the restart allowance and the savepoint retention.
        assert_eq!(c.needed_retention_ms(0), 2 * 1000 + 600_000 + 86_400_000);
        for (text, needle) in [
            (s3_config("bucket/out", ""), "s3://"),
            (s3_config("s3://bucket/../x", ""), "'..'"),
            (
                s3_config("s3://bucket/out", r#","partSizeBytes":1024"#),
                "5 MiB",
            ),
            (
                s3_config("s3://bucket/out", r#","accessKey":"x""#),
                "accessKey",
            ),
        ] {
            let err = SinkConfig::decode(&text).unwrap_err().to_string();
            assert!(err.contains(needle), "{needle:?}: {err}");
            assert!(err.contains("sink 'orders'"), "{err}");
        }
    }

    #[test]
    fn a_valid_configuration_decodes() {
        let c = SinkConfig::decode(&fs_config("/tmp/x")).unwrap();
        assert_eq!(c.sink.as_str(), "orders");
        assert_eq!(c.instance, 0xaa);
        assert!(c.describe().contains("/tmp/x"));
        let c = SinkConfig::decode(&pg_config(r#","transactionIdColumn":"txn""#)).unwrap();
        assert_eq!(c.options.fresh_start, FreshStartPolicy::Append);
    }

    #[test]
    fn a_directory_commit_order_is_optional_and_checked() {
        let order = |text: &str| match SinkConfig::decode(text).unwrap().destination {
            DestinationSpec::Filesystem(o) => o.commit_order,
            other => panic!("{other:?}"),
        };
        assert_eq!(order(&fs_config("/x")), CommitOrder::DurableFirst);
        let with = |value: &str| {
            fs_config("/x").replace(
                "\"ioMode\":\"AUTO\"",
                &format!("\"ioMode\":\"AUTO\",\"commitOrder\":\"{value}\""),
            )
        };
        assert_eq!(order(&with("VISIBLE_FIRST")), CommitOrder::VisibleFirst);
        assert_eq!(order(&with("DURABLE_FIRST")), CommitOrder::DurableFirst);
        let err = SinkConfig::decode(&with("SOON")).unwrap_err();
        assert!(
            err.to_string().contains("commit order") && err.to_string().contains("VISIBLE_FIRST"),
            "{err}"
        );
    }

    #[test]
    fn mistakes_are_refused_saying_what_to_change() {
        let cases = [
            (fs_config("").replace("\"orders\"", "\"../x\""), "sink id"),
            (fs_config("/x").replace("\"AUTO\"", "\"FAST\""), "I/O mode"),
            (
                fs_config("/x").replace("\"FAIL\",\"fresh", "\"MAYBE\",\"fresh"),
                "rewind policy",
            ),
            (fs_config("/x").replace("604800000", "1000"), "retention"),
            (
                fs_config("/x").replace("\"version\":1", "\"version\":9"),
                "version 9",
            ),
            (fs_config("/x").replace("\"ioMode\"", "\"ioMod\""), "ioMod"),
            (
                fs_config("/x").replace("\"partPrefix\":\"part\"", "\"partPrefix\":\"a/b\""),
                "part prefix",
            ),
            // REPLACE_RANGE on PostgreSQL without a transaction-id column.
            (pg_config(""), "REPLACE_RANGE needs a transaction-id column"),
            // REPLACE_RANGE with the idempotent mode, which has nothing to
            // repair: said as such, not as a missing transaction-id column
            // (which that mode refuses).
            (
                pg_config("").replace(
                    "\"TRANSACTIONAL\"",
                    "\"IDEMPOTENT\",\"keyColumns\":[\"id\"]",
                ),
                "transactional mode only",
            ),
            // Deletes into a transactional table.
            (
                pg_config(r#","transactionIdColumn":"txn","operationField":true"#),
                "applies to idempotent mode only",
            ),
            (
                pg_config(r#","transactionIdColumn":"txn""#).replace("env:PW", "vault:PW"),
                "password source",
            ),
            ("not json".to_string(), "not a twopc configuration"),
            ("{\"version\":1}".to_string(), "not valid"),
        ];
        for (text, needle) in cases {
            let err = SinkConfig::decode(&text).unwrap_err();
            assert!(err.to_string().contains(needle), "{needle:?}: {err}");
            // Once the sink id is known, the error names the sink.
            if text.contains("\"orders\"") && !needle.contains("version") {
                assert!(err.to_string().contains("sink 'orders'"), "{err}");
            }
        }
        let mut c = SinkConfig::decode(&fs_config("/x")).unwrap();
        c.checkpoint_interval_ms = 0; // the detected interval counts
        let err = c.check_interval(7 * 24 * 3600 * 1000).unwrap_err();
        assert!(err.to_string().contains("sink 'orders'"), "{err}");
    }

    /// The longer of the job's interval, as the front end detected it, and
    /// the configured one counts: a configured 1 s with a 30 min retention
    /// must not pass a job that checkpoints hourly (its first ordinary
    /// restart would find prepared transactions expired).
    #[test]
    fn the_longer_of_the_jobs_and_the_configured_checkpoint_interval_counts() {
        let text = fs_config("/x").replace("\"retentionMs\":604800000", "\"retentionMs\":1800000");
        let c = SinkConfig::decode(&text).unwrap();
        assert_eq!(c.checkpoint_interval_ms, 1000);
        let err = c.check_interval(3_600_000).unwrap_err();
        assert!(err.to_string().contains("1h"), "{err}");
        c.check_interval(0).unwrap();
        c.check_interval(60_000).unwrap();
        assert_eq!(c.needed_retention_ms(3_600_000), 2 * 3_600_000 + 600_000);
        assert_eq!(c.needed_retention_ms(0), 2 * 1000 + 600_000);
        // The other way round: a configured interval longer than the job's
        // (checkpoints spaced out during a backlog) counts too.
        let mut c = c;
        c.checkpoint_interval_ms = 3_600_000;
        let err = c.check_interval(60_000).unwrap_err();
        assert!(err.to_string().contains("1h"), "{err}");
        assert_eq!(c.needed_retention_ms(60_000), 2 * 3_600_000 + 600_000);
    }

    #[test]
    fn an_idempotent_table_may_take_deletes_and_a_password_from_a_table_option() {
        let text = pg_config(r#","operationField":true"#)
            .replace("\"REPLACE_RANGE\"", "\"FAIL\"")
            .replace(
                "\"TRANSACTIONAL\"",
                "\"IDEMPOTENT\",\"keyColumns\":[\"id\"]",
            )
            .replace("env:PW", "option:password");
        let c = SinkConfig::decode(&text).unwrap();
        let DestinationSpec::Postgres(p) = &c.destination else {
            panic!("a PostgreSQL destination")
        };
        assert!(p.operation_field);
        assert_eq!(
            p.mode,
            PgMode::Idempotent {
                key_columns: vec!["id".into()]
            }
        );
        // Without the field, no deletes (configurations of earlier releases).
        let text = text.replace(",\"operationField\":true", "");
        let c = SinkConfig::decode(&text).unwrap();
        let DestinationSpec::Postgres(p) = &c.destination else {
            panic!("a PostgreSQL destination")
        };
        assert!(!p.operation_field);
    }

    #[test]
    fn a_password_in_the_url_is_refused_and_never_shown() {
        let text = pg_config(r#","transactionIdColumn":"txn""#)
            .replace("postgres://app@db", "postgres://app:s3cr3t@db");
        let err = SinkConfig::decode(&text).unwrap_err();
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
    }
}
