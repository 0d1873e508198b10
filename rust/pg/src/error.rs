//! Turning client errors into the core's `DestinationError`, with the
//! SQLSTATE, detail and hint kept (operators need them) and every password
//! masked.

use twopc_core::error::{DestinationError, DestinationErrorKind};

use crate::options::Secrets;

/// SQLSTATE of `COMMIT PREPARED` / `ROLLBACK PREPARED` on a gid PostgreSQL
/// does not hold: undefined_object. It is the same for "committed already"
/// and "rolled back / never existed", hence the commit-record table.
pub(crate) const UNDEFINED_OBJECT: &str = "42704";
/// SQLSTATE of `COMMIT PREPARED` / `ROLLBACK PREPARED` by a role that
/// neither prepared the transaction nor is a superuser.
pub(crate) const INSUFFICIENT_PRIVILEGE: &str = "42501";

pub(crate) fn sqlstate(e: &postgres::Error) -> Option<&str> {
    e.code().map(|c| c.code())
}

/// True when the connection is gone: the session and any open
/// (unprepared) transaction in it are lost.
pub(crate) fn is_connection_lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match sqlstate(e) {
        // connection_exception, admin_shutdown / crash_shutdown /
        // cannot_connect_now (pg_terminate_backend, server stop).
        Some(code) => code.starts_with("08") || code.starts_with("57P"),
        // No SQLSTATE: an I/O or protocol error below the SQL level.
        None => e.as_db_error().is_none(),
    }
}

fn kind_of(e: &postgres::Error) -> DestinationErrorKind {
    if is_connection_lost(e) {
        return DestinationErrorKind::Unavailable;
    }
    match sqlstate(e) {
        Some("53100") => DestinationErrorKind::StorageFull,
        // invalid_authorization_specification / invalid_password and
        // invalid_catalog_name (no such database): settings, not weather.
        Some(c) if c.starts_with("28") || c == "3D000" => DestinationErrorKind::Rejected,
        // insufficient_resources, out_of_memory, too_many_connections
        // (53000, 53200, 53300): a busy server, as after a failover whose
        // old sessions have not ended yet; a restart gets past it, where
        // "rejected" at start-up stopped the job for good (found by review).
        Some("53000" | "53200" | "53300") => DestinationErrorKind::Unavailable,
        Some(c)
            if c.starts_with("42")
                || c.starts_with("22")
                || c.starts_with("23")
                || c.starts_with("53") =>
        {
            DestinationErrorKind::Rejected
        }
        _ => DestinationErrorKind::Io,
    }
}

/// Formats a client error with its SQLSTATE, detail and hint.
pub(crate) fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
            if let Some(d) = db.detail() {
                s.push_str(&format!(" (detail: {d})"));
            }
            if let Some(h) = db.hint() {
                s.push_str(&format!(" (hint: {h})"));
            }
            s
        }
        None => {
            let mut s = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(inner) = source {
                s.push_str(&format!(": {inner}"));
                source = inner.source();
            }
            if is_connection_lost(e) {
                s.push_str(" (no usable connection to PostgreSQL)");
            }
            s
        }
    }
}

/// A destination error for a failed `op`.
pub(crate) fn pg(secrets: &Secrets, op: &str, e: &postgres::Error) -> DestinationError {
    DestinationError::new(kind_of(e), secrets.scrub(&format!("{op}: {}", describe(e))))
}

/// A destination error from our own text.
pub(crate) fn other(
    secrets: &Secrets,
    kind: DestinationErrorKind,
    msg: impl AsRef<str>,
) -> DestinationError {
    DestinationError::new(kind, secrets.scrub(msg.as_ref()))
}

/// What the server said when it refused a statement, kept beside the
/// formatted error so that a refused COPY row can be mapped back to the
/// record that carried it.
#[derive(Clone, Debug)]
pub(crate) struct ServerError {
    pub sqlstate: String,
    /// Severity, SQLSTATE, message, detail and hint ([`describe`]), with
    /// passwords masked.
    pub text: String,
    /// The error's `where` field. For a row of a COPY it ends in
    /// `COPY <table>, line <n>[, column <c>][: "<value or line>"]`.
    pub context: Option<String>,
    /// The column the server named (a NOT NULL violation names one).
    pub column: Option<String>,
    /// The constraint the server named (a unique or foreign key violation
    /// names one; for a unique index without a constraint, the index).
    pub constraint: Option<String>,
}

pub(crate) fn server_error(secrets: &Secrets, e: &postgres::Error) -> Option<ServerError> {
    let db = e.as_db_error()?;
    Some(ServerError {
        sqlstate: db.code().code().to_string(),
        text: secrets.scrub(&describe(e)),
        context: db.where_().map(|w| secrets.scrub(w)),
        column: db.column().map(str::to_string),
        constraint: db.constraint().map(str::to_string),
    })
}

/// True for the SQLSTATEs of a row refused for what it holds: replaying the
/// same record fails the same way, so a restart cannot help. Class 22 (data
/// exception: type syntax, range, length, encoding, COPY format), class 23
/// (integrity constraint violation: NOT NULL, CHECK, unique, foreign key,
/// exclusion), 42804 (datatype mismatch) and 54000 (program limit exceeded:
/// a value too large for an index row). Not lock, deadlock, cancel,
/// resource or connection errors: those can pass on a retry.
pub(crate) fn is_data_error(sqlstate: &str) -> bool {
    sqlstate.starts_with("22")
        || sqlstate.starts_with("23")
        || sqlstate == "42804"
        || sqlstate == "54000"
}

/// A COPY row the server refused, as its error context names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RefusedRow {
    /// 1-based line of the COPY: one record per line.
    pub line: u64,
    pub column: Option<String>,
    pub quoted: Quoted,
}

/// What a COPY error's context quotes of the refused row (PostgreSQL cuts
/// it at about 100 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Quoted {
    Nothing,
    /// The value of the column the context names.
    Value(String),
    /// The whole line.
    Line(String),
}

/// The refused row of a data error raised by the COPY into `relname`
/// (the table's bare name, as PostgreSQL prints it), or `None` when the
/// error is not a data error or names no COPY line. `columns` are the COPY's
/// columns, used to read a column name exactly even if it contains `:` or
/// `, `.
pub(crate) fn refused_row(
    server: &ServerError,
    relname: &str,
    columns: &[String],
) -> Option<RefusedRow> {
    if !is_data_error(&server.sqlstate) {
        return None;
    }
    let context = server.context.as_deref()?;
    // The COPY's own context is the outermost, so the last one; an error in
    // a trigger or a function adds its context lines before it.
    let prefix = format!("COPY {relname}, line ");
    let start = if context.starts_with(&prefix) {
        0
    } else {
        context.rfind(&format!("\n{prefix}"))? + 1
    };
    let rest = &context[start + prefix.len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let line: u64 = rest[..digits].parse().ok()?;
    let mut rest = &rest[digits..];
    let mut column = None;
    let mut in_column = false;
    if let Some(after) = rest.strip_prefix(", column ") {
        in_column = true;
        // The longest configured name that ends where the context's column
        // name does (at ':' or at the end).
        let named = columns
            .iter()
            .filter(|c| {
                after
                    .strip_prefix(c.as_str())
                    .is_some_and(|tail| tail.is_empty() || tail.starts_with(':'))
            })
            .max_by_key(|c| c.len());
        match named {
            Some(c) => {
                rest = &after[c.len()..];
                column = Some(c.clone());
            }
            None => rest = "",
        }
    }
    let quoted = match rest
        .strip_prefix(": \"")
        .and_then(|v| v.rfind('"').map(|end| v[..end].to_string()))
    {
        Some(v) if in_column => Quoted::Value(v),
        Some(v) => Quoted::Line(v),
        None => Quoted::Nothing,
    };
    Some(RefusedRow {
        line,
        column: column.or_else(|| server.column.clone()),
        quoted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(sqlstate: &str, context: Option<&str>) -> ServerError {
        ServerError {
            sqlstate: sqlstate.into(),
            text: "ERROR".into(),
            context: context.map(str::to_string),
            column: None,
            constraint: None,
        }
    }

    fn cols(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn copy_contexts_name_line_column_and_value() {
        let c = cols(&["id", "body", "body: x"]);
        let r = refused_row(
            &server(
                "22P02",
                Some("COPY t_x, line 12, column id: \"not-a-number\""),
            ),
            "t_x",
            &c,
        )
        .unwrap();
        assert_eq!(
            r,
            RefusedRow {
                line: 12,
                column: Some("id".into()),
                quoted: Quoted::Value("not-a-number".into())
            }
        );
        // A line-level error quotes the line, quotes and line breaks included.
        let r = refused_row(
            &server("22P04", Some("COPY t_x, line 3: \"1,ok,\"abc\n\"")),
            "t_x",
            &c,
        )
        .unwrap();
        assert_eq!((r.line, r.column.as_deref()), (3, None));
        assert_eq!(r.quoted, Quoted::Line("1,ok,\"abc\n".into()));
        // A unique violation names the line only.
        let r = refused_row(&server("23505", Some("COPY t_x, line 2")), "t_x", &c).unwrap();
        assert_eq!((r.line, r.column, r.quoted), (2, None, Quoted::Nothing));
        // The longest configured name wins, and a null input quotes nothing.
        let r = refused_row(
            &server(
                "23502",
                Some("COPY t_x, line 4, column body: x: null input"),
            ),
            "t_x",
            &c,
        )
        .unwrap();
        assert_eq!(
            (r.column.as_deref(), r.quoted),
            (Some("body: x"), Quoted::Nothing)
        );
        // The COPY context comes after a trigger's.
        let r = refused_row(
            &server(
                "23514",
                Some("PL/pgSQL function f() line 3 at RAISE\nCOPY t_x, line 7"),
            ),
            "t_x",
            &c,
        )
        .unwrap();
        assert_eq!(r.line, 7);
    }

    #[test]
    fn only_data_errors_of_this_copy_are_refused_rows() {
        let c = cols(&["id"]);
        for retryable in [
            "40P01", "55P03", "57014", "53100", "08006", "XX000", "42501",
        ] {
            assert!(
                refused_row(&server(retryable, Some("COPY t, line 2")), "t", &c).is_none(),
                "{retryable}"
            );
        }
        assert!(refused_row(&server("22P02", None), "t", &c).is_none());
        assert!(refused_row(&server("22P02", Some("COPY other, line 2")), "t", &c).is_none());
        assert!(refused_row(&server("22P02", Some("SQL statement \"x\"")), "t", &c).is_none());
        for data in [
            "22003", "22001", "22021", "23505", "23503", "42804", "54000",
        ] {
            assert!(
                refused_row(&server(data, Some("COPY t, line 2")), "t", &c).is_some(),
                "{data}"
            );
        }
    }
}
