//! One lazily (re)connected session. A call on a lost connection drops it;
//! the next call connects again. That is how a commit whose connection
//! broke is resolved: the core retries by id, the retry opens a new session
//! and asks the server what became of the gid.
//!
//! While a [`CopyStream`] is open, its feeder thread holds the session; the
//! link gets it back when the COPY ends.

use std::io;
use std::sync::Arc;

use postgres::{Client, NoTls};
use twopc_core::error::{DestinationError, DestinationErrorKind};

use crate::copy_stream::{CopyEnd, CopyStream};
use crate::error::{self, ServerError};
use crate::options::Secrets;

/// A failed call: the error to report, plus what the caller needs to decide
/// (the SQLSTATE; whether the session, and any transaction open in it, is
/// gone).
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: DestinationError,
    pub sqlstate: Option<String>,
    pub lost: bool,
    /// What the server said, when it refused the call (not set for a lost
    /// connection or an error of our own). Boxed: failures travel in every
    /// `Result` of the link.
    pub server: Option<Box<ServerError>>,
}

impl Failure {
    pub fn is(&self, sqlstate: &str) -> bool {
        self.sqlstate.as_deref() == Some(sqlstate)
    }
}

impl From<Failure> for DestinationError {
    fn from(f: Failure) -> Self {
        f.error
    }
}

/// What a call made inside [`Link::run`] can fail with: a client error, or
/// an I/O error of the COPY stream.
pub(crate) enum CallError {
    Pg(postgres::Error),
    Io(io::Error),
}

impl From<postgres::Error> for CallError {
    fn from(e: postgres::Error) -> Self {
        CallError::Pg(e)
    }
}

impl From<io::Error> for CallError {
    fn from(e: io::Error) -> Self {
        CallError::Io(e)
    }
}

pub(crate) struct Session {
    client: Client,
    pid: i32,
}

/// A COPY in progress: the feeder thread holds the session.
struct Copying {
    stream: CopyStream<Session>,
    pid: i32,
}

pub(crate) struct Link {
    role: &'static str,
    config: postgres::Config,
    secrets: Secrets,
    /// Statements run once per new session.
    setup: &'static str,
    session: Option<Session>,
    copying: Option<Copying>,
    /// Counts sessions opened, so that state tied to one session (the open
    /// transaction, a temporary table) can tell it outlived its session.
    generation: u64,
    /// Refuse a session that is read-only (see [`Link::writing`]).
    writes: bool,
}

impl Link {
    pub fn new(
        role: &'static str,
        mut config: postgres::Config,
        application_name: &str,
        secrets: Secrets,
        setup: &'static str,
    ) -> Self {
        config.application_name(application_name);
        Link {
            role,
            config,
            secrets,
            setup,
            session: None,
            copying: None,
            generation: 0,
            writes: false,
        }
    }

    /// A link whose sessions write (the sink's writer: its COPY, handle
    /// rows and commit records): a read-only session is refused when it
    /// opens. The others are refused on a hot standby only: `COMMIT
    /// PREPARED` and `ROLLBACK PREPARED` work in a read-only session (a
    /// primary put in read-only mode, as some services do when the disk is
    /// full), and the commit records were written inside the prepared
    /// transactions (found by review: refusing them stopped commits that
    /// would have succeeded).
    pub fn writing(mut self) -> Self {
        self.writes = true;
        self
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// True when a session is open and not known to be broken. A session
    /// lent to a COPY counts as open: a broken one shows when the COPY
    /// ends.
    pub fn is_connected(&self) -> bool {
        self.copying.is_some() || self.session.as_ref().is_some_and(|s| !s.client.is_closed())
    }

    /// True while a COPY stream holds the session.
    pub fn is_copying(&self) -> bool {
        self.copying.is_some()
    }

    pub fn pid(&self) -> Option<i32> {
        if let Some(c) = &self.copying {
            return Some(c.pid);
        }
        self.session
            .as_ref()
            .filter(|s| !s.client.is_closed())
            .map(|s| s.pid)
    }

    /// Closes the session; the server rolls back whatever was open in it.
    /// A COPY in progress is cancelled, and its feeder thread closes the
    /// session when it ends.
    pub fn disconnect(&mut self) {
        self.copying = None;
        self.session = None;
    }

    fn connect(&mut self) -> Result<(), Failure> {
        let fail = |e: postgres::Error, what: &str| Failure {
            error: error::pg(
                &self.secrets,
                &format!("{what} ({} connection)", self.role),
                &e,
            ),
            sqlstate: error::sqlstate(&e).map(str::to_string),
            lost: true,
            server: None,
        };
        let mut client = self
            .config
            .connect(NoTls)
            .map_err(|e| fail(e, "connecting to PostgreSQL"))?;
        if !self.setup.is_empty() {
            client
                .batch_execute(self.setup)
                .map_err(|e| fail(e, "setting up the session"))?;
        }
        let row = client
            .query_one(
                "SELECT pg_backend_pid(), pg_is_in_recovery(), \
                 current_setting('transaction_read_only') = 'on'",
                &[],
            )
            .map_err(|e| fail(e, "setting up the session"))?;
        let pid: i32 = row.get(0);
        let read_only = self.writes && row.get::<_, bool>(2);
        if let Some(message) = read_only_refusal(self.role, row.get(1), read_only) {
            // Dropped here, so the next call connects again: a standby
            // promoted meanwhile, or a multi-host URL's next pick, may be
            // writable then.
            return Err(self.lost(message));
        }
        self.generation += 1;
        if self.generation > 1 {
            log::info!(
                "reconnected the {} connection to PostgreSQL (backend {pid})",
                self.role
            );
        }
        self.session = Some(Session { client, pid });
        Ok(())
    }

    /// Connects if needed, then runs `f`. A failure that lost the
    /// connection drops the session so the next call reconnects.
    pub fn run<T>(
        &mut self,
        op: &str,
        f: impl FnOnce(&mut Client) -> Result<T, CallError>,
    ) -> Result<T, Failure> {
        let session = self.session_for(op)?;
        let result = f(&mut session.client);
        let closed = session.client.is_closed();
        result.map_err(|e| self.failure(op, e, closed))
    }

    /// True when the session of `generation` is open and not known to be
    /// broken (and no COPY holds it).
    pub fn holds_session(&self, generation: u64) -> bool {
        self.generation == generation
            && self.copying.is_none()
            && self.session.as_ref().is_some_and(|s| !s.client.is_closed())
    }

    /// The failure of a call that needed a session that is gone; drops it
    /// if it is known to be broken.
    fn session_gone(&mut self, op: &str) -> Failure {
        if self.session.as_ref().is_some_and(|s| s.client.is_closed()) {
            self.session = None;
        }
        self.lost(format!(
            "{op}: the {} session this belongs to was lost (PostgreSQL rolled back what was open \
             in it and released its locks); nothing was run in another session",
            self.role
        ))
    }

    /// Runs `f` in the session of `generation` only, never in a new one:
    /// for the statements of a transaction that session holds open. A
    /// new session would run them outside any transaction, in autocommit,
    /// where `PREPARE TRANSACTION` is only a warning, so a commit record
    /// would be committed for rows the server rolled back with the old
    /// session. Fails as lost, running nothing, when that session is gone
    /// or known to be broken.
    pub fn run_in_session<T>(
        &mut self,
        op: &str,
        generation: u64,
        f: impl FnOnce(&mut Client) -> Result<T, CallError>,
    ) -> Result<T, Failure> {
        if self.copying.is_some() {
            return Err(self.lost(format!(
                "{op}: a COPY is still open in the {} session (a bug; please report it)",
                self.role
            )));
        }
        if !self.holds_session(generation) {
            return Err(self.session_gone(op));
        }
        let session = self.session.as_mut().expect("checked above");
        let result = f(&mut session.client);
        let closed = session.client.is_closed();
        result.map_err(|e| self.failure(op, e, closed))
    }

    /// The session's client, connecting if needed (start-up checks).
    pub fn client(&mut self) -> Result<&mut Client, Failure> {
        Ok(&mut self.session_for("connecting")?.client)
    }

    /// The session, connected. A statement has no place inside a COPY: the
    /// callers end their COPY first, and should one not, the COPY is
    /// cancelled here (which aborts its transaction on the server) rather
    /// than the statement being sent into the data stream.
    fn session_for(&mut self, op: &str) -> Result<&mut Session, Failure> {
        if self.copying.is_some() {
            log::warn!(
                "{op} on the {} connection while a COPY was open; cancelling the COPY",
                self.role
            );
            let _ = self.end_copy(op, false);
        }
        if !self.is_connected() {
            self.session = None;
            self.connect()?;
        }
        Ok(self.session.as_mut().expect("connected above"))
    }

    /// The failure of a call, dropping the session when the connection is
    /// gone (`closed`: the client said so after the call).
    fn failure(&mut self, op: &str, e: CallError, closed: bool) -> Failure {
        match e {
            CallError::Pg(e) => {
                let lost = closed || error::is_connection_lost(&e);
                if lost {
                    self.session = None;
                }
                Failure {
                    error: error::pg(&self.secrets, op, &e),
                    sqlstate: error::sqlstate(&e).map(str::to_string),
                    server: error::server_error(&self.secrets, &e).map(Box::new),
                    lost,
                }
            }
            CallError::Io(e) => {
                // A COPY stream write fails only when the connection does.
                self.session = None;
                self.lost(format!("{op}: {e} (the connection to PostgreSQL was lost)"))
            }
        }
    }

    fn lost(&self, message: String) -> Failure {
        Failure {
            error: error::other(&self.secrets, DestinationErrorKind::Unavailable, message),
            sqlstate: None,
            lost: true,
            server: None,
        }
    }

    /// Starts `COPY ... FROM STDIN` (`sql`) on a feeder thread that holds the
    /// session until [`Link::end_copy`]; rows go in with [`Link::send_copy`].
    /// Only in the session of `generation`, the one whose transaction the
    /// rows belong to (see [`Link::run_in_session`]): a COPY in a new
    /// session would load them in autocommit.
    pub fn start_copy(&mut self, op: &str, generation: u64, sql: String) -> Result<(), Failure> {
        if !self.holds_session(generation) {
            return Err(self.session_gone(op));
        }
        let session = self.session.take().expect("checked above");
        let pid = session.pid;
        match CopyStream::start(session, |s| &mut s.client, sql) {
            Ok(stream) => {
                self.copying = Some(Copying { stream, pid });
                Ok(())
            }
            Err(e) => Err(self.lost(format!(
                "{op}: no thread could be started for the COPY ({e}); the {} connection was \
                 closed, so PostgreSQL rolls back what was open in it",
                self.role
            ))),
        }
    }

    /// Hands whole COPY rows to the open COPY. When the COPY has failed,
    /// returns why (and the session is back, or dropped if lost).
    pub fn send_copy(&mut self, op: &str, rows: Arc<Vec<u8>>) -> Result<(), Failure> {
        let Some(copying) = &self.copying else {
            return Err(self.lost(format!("{op}: no COPY is open (a bug; please report it)")));
        };
        if copying.stream.send(rows).is_ok() {
            return Ok(());
        }
        // The feeder has ended early, which it does only when its COPY failed.
        match self.end_copy(op, false) {
            Err(f) => Err(f),
            Ok(_) => Err(self.lost(format!("{op}: the COPY ended early without an error"))),
        }
    }

    /// Ends the open COPY: completes it (`finish`) or cancels it, and takes
    /// the session back from the feeder thread.
    pub fn end_copy(&mut self, op: &str, finish: bool) -> Result<CopyEnd, Failure> {
        let Some(copying) = self.copying.take() else {
            return Err(self.lost(format!("{op}: no COPY is open (a bug; please report it)")));
        };
        match copying.stream.end(finish) {
            Some((session, result)) => {
                let closed = session.client.is_closed();
                self.session = Some(session);
                result.map_err(|e| self.failure(op, e, closed))
            }
            None => {
                self.session = None;
                Err(self.lost(format!(
                    "{op}: the COPY thread failed; the {} connection was closed, so PostgreSQL \
                     rolls back what was open in it",
                    self.role
                )))
            }
        }
    }
}

/// Why a new session on a server that cannot take writes is refused, or
/// `None` when it can. Checked when the session opens, not left to the
/// first statement: on a hot standby `COMMIT PREPARED` fails with 25006,
/// which would read as a commit whose outcome is unknown, and the writer's
/// COPY would fail once per checkpoint with the server's bare words. A
/// session is refused as unavailable (retryable): a standby gets promoted,
/// a read-only mode set for maintenance or a full disk gets lifted, and a
/// multi-host URL may pick another server at the next attempt.
fn read_only_refusal(role: &str, in_recovery: bool, read_only: bool) -> Option<String> {
    if in_recovery {
        return Some(format!(
            "the {role} connection reached a PostgreSQL server in recovery (a hot standby): \
             twopc writes, prepares and commits on a primary only, and nothing was run there. \
             Point the sink at the primary; with several hosts in the URL, add \
             target_session_attrs=read-write"
        ));
    }
    if read_only {
        return Some(format!(
            "the {role} connection is read-only (default_transaction_read_only is on for the \
             sink's user, its database or the server): twopc cannot write its records or its \
             control tables, and nothing was run. Turn it off for the sink's user (ALTER ROLE \
             ... SET default_transaction_read_only = off) or point the sink at a writable server"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link to a port nobody listens on: any attempt to connect fails
    /// with a connection error, which the calls below must never reach.
    fn unreachable_link() -> Link {
        let mut config = postgres::Config::new();
        config.host("127.0.0.1").port(1).user("nobody");
        config.connect_timeout(std::time::Duration::from_millis(200));
        Link::new("writer", config, "twopc-test", Secrets::default(), "")
    }

    /// The statements of a transaction, and its COPY, run in the session
    /// that holds it or nowhere: without that session they fail as lost
    /// at once, run nothing, and do not open a new session (where they
    /// would run in autocommit).
    #[test]
    fn calls_bound_to_a_session_never_open_another() {
        let mut link = unreachable_link();
        let mut ran = false;
        let f = link
            .run_in_session("preparing the transaction", 0, |_| {
                ran = true;
                Ok(())
            })
            .unwrap_err();
        assert!(!ran);
        assert!(f.lost, "{}", f.error);
        assert!(f.error.message.contains("nothing was run"), "{}", f.error);
        let f = link
            .start_copy("copying", 0, "COPY t FROM STDIN".into())
            .unwrap_err();
        assert!(
            f.lost && f.error.message.contains("nothing was run"),
            "{}",
            f.error
        );
        assert_eq!(link.generation(), 0, "no session was opened");
        // A plain call does try to connect (and fails here).
        let f = link.run("reading", |_| Ok(())).unwrap_err();
        assert!(f.error.message.contains("connecting"), "{}", f.error);
    }
}
