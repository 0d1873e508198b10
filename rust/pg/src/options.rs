//! Options of the PostgreSQL destination and their validation.
//!
//! The password is held in [`Password`], which prints as `***`. A
//! connection string that carries one is refused (see [`crate::conninfo`]),
//! and printed with every part that could be one masked; [`PgOptions`]'s
//! `Debug` is written by hand for that reason.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use twopc_core::error::ConfigError;

use crate::conninfo::{self, redact};
use crate::sql::{quote_ident, validate_ident, TableName};

/// A password. It has no `Display`, and its `Debug` prints `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    pub fn new(p: impl Into<String>) -> Self {
        Password(p.into())
    }

    /// The clear text, for the connection only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where the server is.
#[derive(Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A libpq-style URL (`postgres://user@host:port/db`) or key=value
    /// string (`host=... port=... dbname=... user=...`), without a password
    /// (one is refused: it goes in [`PgOptions::password`]).
    Url(String),
    Params {
        host: String,
        port: u16,
        dbname: String,
        user: String,
    },
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Url(url) => f.debug_tuple("Url").field(&redact(url)).finish(),
            Endpoint::Params {
                host,
                port,
                dbname,
                user,
            } => f
                .debug_struct("Params")
                .field("host", host)
                .field("port", port)
                .field("dbname", dbname)
                .field("user", user)
                .finish(),
        }
    }
}

/// How a repeat of the same output is made harmless (see the crate docs).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum PgMode {
    /// One prepared transaction per subtask and checkpoint.
    #[default]
    Transactional,
    /// Upserts on a key, committed batch by batch.
    Idempotent { key_columns: Vec<String> },
}

/// The COPY format of the records the Java side produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CopyFormat {
    /// PostgreSQL's text format: tab-separated, `\N` for NULL, backslash
    /// escapes.
    #[default]
    Text,
    /// CSV with PostgreSQL's defaults (comma, double quotes, unquoted empty
    /// field = NULL).
    Csv,
}

impl CopyFormat {
    pub(crate) fn delimiter(self) -> u8 {
        match self {
            CopyFormat::Text => b'\t',
            CopyFormat::Csv => b',',
        }
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct PgOptions {
    pub endpoint: Endpoint,
    /// The password; never part of the endpoint.
    pub password: Option<Password>,
    /// Target table, `table` or `schema.table`, case-sensitive.
    pub table: String,
    /// Target columns in the order the records' fields appear.
    pub columns: Vec<String>,
    pub mode: PgMode,
    pub copy_format: CopyFormat,
    /// Schema of the sink's own tables (commit records, prepared handles,
    /// expiry tombstones).
    pub control_schema: String,
    /// Transactional mode only: a text column of the target table that the
    /// sink fills with the transaction id of each row. Not part of
    /// `columns`; the records do not carry it. It makes `retract` (rewind
    /// with REPLACE_RANGE) possible: without it, rows of one transaction
    /// cannot be told apart from any other.
    pub transaction_id_column: Option<String>,
    /// Idempotent mode only: each record carries one more field after
    /// `columns`, the operation: `U` upserts the row, `D` deletes the row
    /// with the record's key (its other fields are ignored). Within a batch
    /// the last operation of each key wins. See [`crate::idempotent`].
    pub operation_field: bool,
    /// The type each of `columns` has where the records come from (the
    /// SQL connector's table), one per column, or empty when unknown (a
    /// DataStream job's own schema). The start-up check refuses a
    /// PostgreSQL column that would change such values silently; see the
    /// `column_types` module for the names.
    pub declared_types: Vec<String>,
    pub connect_timeout: Duration,
}

impl fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgOptions")
            .field("endpoint", &self.endpoint)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("table", &self.table)
            .field("columns", &self.columns)
            .field("mode", &self.mode)
            .field("copy_format", &self.copy_format)
            .field("control_schema", &self.control_schema)
            .field("transaction_id_column", &self.transaction_id_column)
            .field("operation_field", &self.operation_field)
            .field("declared_types", &self.declared_types)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl PgOptions {
    /// Transactional mode, text format, control tables in `public`.
    pub fn new(endpoint: Endpoint, table: impl Into<String>, columns: &[&str]) -> Self {
        PgOptions {
            endpoint,
            password: None,
            table: table.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            mode: PgMode::Transactional,
            copy_format: CopyFormat::Text,
            control_schema: "public".to_string(),
            transaction_id_column: None,
            operation_field: false,
            declared_types: Vec::new(),
            connect_timeout: Duration::from_secs(10),
        }
    }

    /// Checks everything that can be checked without a server.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.connection_config()?;
        TableName::parse("table", &self.table)?;
        validate_ident("control_schema", &self.control_schema)?;
        if self.columns.is_empty() {
            return Err(ConfigError::new(
                "columns is empty: list the target table's columns in the order the records' \
                 fields appear",
            ));
        }
        if !self.declared_types.is_empty() && self.declared_types.len() != self.columns.len() {
            return Err(ConfigError::new(format!(
                "{} declared types were given for {} columns; give one per column, or none",
                self.declared_types.len(),
                self.columns.len()
            )));
        }
        for (i, c) in self.columns.iter().enumerate() {
            validate_ident("column", c)?;
            if self.columns[..i].contains(c) {
                return Err(ConfigError::new(format!(
                    "column {} is listed twice in columns; list each once",
                    quote_ident(c)
                )));
            }
        }
        if let Some(col) = &self.transaction_id_column {
            validate_ident("transaction_id_column", col)?;
            if self.columns.contains(col) {
                return Err(ConfigError::new(format!(
                    "transaction_id_column {} is also in columns; remove it from columns: the \
                     sink fills it, the records do not carry it",
                    quote_ident(col)
                )));
            }
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::new(
                "connect_timeout is 0; set a positive timeout, e.g. 10 s",
            ));
        }
        if let PgMode::Idempotent { key_columns } = &self.mode {
            if key_columns.is_empty() {
                return Err(ConfigError::new(
                    "idempotent mode needs key_columns: the columns of a primary key or unique \
                     index that identify a row, so that a replay overwrites instead of adding",
                ));
            }
            for (i, k) in key_columns.iter().enumerate() {
                if !self.columns.contains(k) {
                    return Err(ConfigError::new(format!(
                        "key column {} is not in columns; every key column must be written, so \
                         add it to columns",
                        quote_ident(k)
                    )));
                }
                if key_columns[..i].contains(k) {
                    return Err(ConfigError::new(format!(
                        "key column {} is listed twice in key_columns",
                        quote_ident(k)
                    )));
                }
            }
            for reserved in [crate::idempotent::STAGE_SEQ, crate::idempotent::STAGE_OP] {
                if self.columns.iter().any(|c| c == reserved) {
                    return Err(ConfigError::new(format!(
                        "column name {reserved:?} is reserved by the idempotent mode's staging \
                         table; rename the column"
                    )));
                }
            }
            if self.transaction_id_column.is_some() {
                return Err(ConfigError::new(
                    "transaction_id_column applies to transactional mode only; in idempotent \
                     mode a replay overwrites rows by key, so remove it",
                ));
            }
        } else if self.operation_field {
            return Err(ConfigError::new(
                "operation_field (records that upsert or delete) applies to idempotent mode \
                 only: a transactional table takes inserts only. Choose idempotent mode with \
                 the table's key columns, or remove it",
            ));
        }
        Ok(())
    }

    /// The fields of each record: the columns, and the operation field
    /// when configured.
    pub(crate) fn record_fields(&self) -> usize {
        self.columns.len() + usize::from(self.operation_field)
    }

    pub(crate) fn table_name(&self) -> Result<TableName, ConfigError> {
        TableName::parse("table", &self.table)
    }

    /// The client configuration, with the password applied.
    pub(crate) fn connection_config(&self) -> Result<postgres::Config, ConfigError> {
        let mut config = match &self.endpoint {
            Endpoint::Url(url) => {
                if url.trim().is_empty() {
                    return Err(ConfigError::new(
                        "the connection URL is empty; set it, e.g. \
                         postgres://user@host:5432/dbname",
                    ));
                }
                conninfo::check(url)?;
                postgres::Config::from_str(url).map_err(|e| {
                    // The parser's message names the bad part; the string is
                    // shown masked and the message scrubbed, belt and braces
                    // (the check above refused any password).
                    let secrets = Secrets::of(self);
                    ConfigError::new(format!(
                        "the connection URL {} is not valid: {}; write it as \
                         postgres://user@host:port/dbname or host=... port=... dbname=... user=...",
                        redact(url),
                        secrets.scrub(&e.to_string())
                    ))
                })?
            }
            Endpoint::Params {
                host,
                port,
                dbname,
                user,
            } => {
                for (what, v) in [("host", host), ("dbname", dbname), ("user", user)] {
                    if v.trim().is_empty() {
                        return Err(ConfigError::new(format!(
                            "the connection {what} is empty; set it"
                        )));
                    }
                }
                if *port == 0 {
                    return Err(ConfigError::new(
                        "the connection port is 0; set the server's port (5432 by default)",
                    ));
                }
                let mut c = postgres::Config::new();
                c.host(host).port(*port).dbname(dbname).user(user);
                c
            }
        };
        if config.get_user().is_none() {
            return Err(ConfigError::new(
                "the connection names no user; add one to the URL (postgres://USER@host/db)",
            ));
        }
        if let Some(p) = &self.password {
            config.password(p.expose());
        }
        if config.get_ssl_mode() == postgres::config::SslMode::Require {
            return Err(ConfigError::new(
                "the connection asks for TLS (sslmode=require or stricter), which this sink does not \
                 support: it connects without TLS. Remove sslmode from the connection, or reach the \
                 server through a TLS tunnel (a local proxy that encrypts)",
            ));
        }
        if let Some(given) = config.get_connect_timeout() {
            // Said, not refused: URLs written for libpq often carry it, and
            // the operator's tools read the same URLs.
            log::warn!(
                "the connection sets connect_timeout={}s; the sink's own connect timeout ({}) is \
                 used instead (connectTimeout(...), or 'connect-timeout' in SQL)",
                given.as_secs(),
                twopc_core::timefmt::exact(self.connect_timeout.as_millis() as u64)
            );
        }
        config.connect_timeout(self.connect_timeout);
        // A commit must not wait for hours on a dead peer: keepalives and a
        // send timeout turn a silent network failure into an error within
        // about a minute, which the core treats as an unknown outcome and
        // retries by id.
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(30));
        config.tcp_user_timeout(Duration::from_secs(60));
        Ok(config)
    }
}

/// The secrets to keep out of messages: the configured password and any
/// password in the URL.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Vec<String>);

impl Secrets {
    pub(crate) fn of(options: &PgOptions) -> Self {
        let mut v = Vec::new();
        if let Some(p) = &options.password {
            v.push(p.expose().to_string());
        }
        if let Endpoint::Url(url) = &options.endpoint {
            v.extend(conninfo::passwords(url));
        }
        v.retain(|s| !s.is_empty());
        v.sort();
        v.dedup();
        // Longest first, so a password containing another is masked whole.
        v.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Secrets(v)
    }

    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.0 {
            out = out.replace(s.as_str(), "***");
        }
        out
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} masked)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url_opts(url: &str) -> PgOptions {
        PgOptions::new(Endpoint::Url(url.to_string()), "public.t", &["a", "b"])
    }

    /// TLS in the connection, which the sink cannot honour, is refused when
    /// the sink is built, not at every task start (it connects without it).
    #[test]
    fn tls_in_the_connection_is_refused_and_a_connect_timeout_replaced() {
        for url in [
            "postgres://app@db:5432/shop?sslmode=require",
            "host=db port=5432 dbname=shop user=app sslmode=require",
        ] {
            let e = url_opts(url).validate().unwrap_err();
            assert!(e.message().contains("TLS"), "{url}: {e}");
        }
        // Stricter modes the client does not even parse are refused too.
        url_opts("postgres://app@db:5432/shop?sslmode=verify-full")
            .validate()
            .unwrap_err();
        // A connect_timeout is replaced by the sink's own (with a warning),
        // not refused: URLs written for libpq carry it.
        for url in [
            "postgres://app@db:5432/shop?connect_timeout=60",
            "host=db dbname=shop user=app connect_timeout=60",
        ] {
            let o = url_opts(url);
            let config = o.connection_config().unwrap();
            assert_eq!(
                config.get_connect_timeout(),
                Some(&o.connect_timeout),
                "{url}"
            );
        }
        for url in [
            "postgres://app@db:5432/shop",
            "postgres://app@db:5432/shop?sslmode=disable",
            "postgres://app@db:5432/shop?sslmode=prefer",
        ] {
            url_opts(url).validate().unwrap();
        }
    }

    #[test]
    fn debug_and_validation_never_show_the_password_of_any_form() {
        for (form, secret, accepted) in crate::conninfo::tests::FORMS {
            let mut o = url_opts(form);
            o.password = Some(Password::new("third-secret"));
            let debug = format!("{o:?}");
            assert!(!debug.contains("third-secret"), "{debug}");
            let checked = o.validate();
            if !*accepted {
                let e = checked.expect_err(form);
                assert!(
                    e.message().contains("passwordFromEnvironment")
                        || e.message().contains("a valid")
                        || e.message().contains("does not start with")
                        || e.message().contains("'@'")
                        || e.message().contains("fragment")
                        || e.message().contains(" twice"),
                    "{form}: {e}"
                );
                for rendering in [e.to_string(), format!("{e:?}"), debug.clone()] {
                    assert!(
                        secret.is_empty() || !rendering.contains(secret),
                        "{form}: {rendering}"
                    );
                }
            } else if form.contains('@') || form.contains("user=") {
                checked.unwrap_or_else(|e| panic!("{form}: {e}"));
                assert!(debug.contains(form), "{debug}");
            }
        }
        // The key=value form with spaces around '=' and a quoted value.
        let o = url_opts("host=h user=u password = 'a b c' dbname=d");
        assert!(format!("{o:?}").contains("host=h user=u password=*** dbname=d"));
    }

    #[test]
    fn secrets_are_scrubbed_from_text() {
        let mut o = url_opts("postgres://u:hunter2-secret@h/db");
        o.password = Some(Password::new("xyzzy-pw"));
        let s = Secrets::of(&o);
        assert_eq!(
            s.scrub("failed for hunter2-secret and xyzzy-pw"),
            "failed for *** and ***"
        );
        assert!(!format!("{s:?}").contains("xyzzy"));
    }

    #[test]
    fn validation_says_what_to_change() {
        let mut o = url_opts("postgres://u@h/db");
        o.validate().unwrap();
        o.columns.clear();
        assert!(o
            .validate()
            .unwrap_err()
            .message()
            .contains("columns is empty"));
        let mut o = url_opts("postgres://u@h/db");
        o.columns.push("a".into());
        assert!(o.validate().unwrap_err().message().contains("listed twice"));
        let mut o = url_opts("postgres://u@h/db");
        o.mode = PgMode::Idempotent {
            key_columns: vec!["k".into()],
        };
        assert!(o
            .validate()
            .unwrap_err()
            .message()
            .contains("not in columns"));
        let mut o = url_opts("postgres://u@h/db");
        o.transaction_id_column = Some("a".into());
        assert!(o
            .validate()
            .unwrap_err()
            .message()
            .contains("also in columns"));
        let o = url_opts("postgres://h/db");
        assert!(o.validate().unwrap_err().message().contains("no user"));
        let o = url_opts("postgres://u:pw-in-url@h:notaport/db");
        let e = o.validate().unwrap_err().to_string();
        assert!(
            !e.contains("pw-in-url") && e.contains("carries a password"),
            "{e}"
        );
        let o = url_opts("postgres://u@h:notaport/db");
        let e = o.validate().unwrap_err().to_string();
        assert!(e.contains("not a valid URL"), "{e}");
    }
}
