//! Turning client errors into the core's `DestinationError`, with the
//! SQLSTATE, detail and hint kept (operators need them) and every password
//! masked.

use twopc_core::error::{DestinationError, DestinationErrorKind};

use crate::options::Secrets;

/// SQLSTATE of `COMMIT PREPARED` / `ROLLBACK PREPARED` on a gid PostgreSQL
/// does not hold: undefined_object. It is the same for "committed already"
/// and "rolled back / never existed", hence the commit-record table.
pub(crate) const UNDEFINED_OBJECT: &str = "42704";

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
