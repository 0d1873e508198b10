//! One lazily (re)connected session. A call on a lost connection drops it;
//! the next call connects again. That is how a commit whose connection
//! broke is resolved: the core retries by id, the retry opens a new session
//! and asks the server what became of the gid.

use std::io;

use postgres::{Client, NoTls};
use twopc_core::error::{DestinationError, DestinationErrorKind};

use crate::error;
use crate::options::Secrets;

/// A failed call: the error to report, plus what the caller needs to decide
/// (the SQLSTATE; whether the session, and any transaction open in it, is
/// gone).
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: DestinationError,
    pub sqlstate: Option<String>,
    pub lost: bool,
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

struct Session {
    client: Client,
    pid: i32,
}

pub(crate) struct Link {
    role: &'static str,
    config: postgres::Config,
    secrets: Secrets,
    /// Statements run once per new session.
    setup: &'static str,
    session: Option<Session>,
    /// Counts sessions opened, so that state tied to one session (the open
    /// transaction, a temporary table) can tell it outlived its session.
    generation: u64,
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
            generation: 0,
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// True when a session is open and not known to be broken.
    pub fn is_connected(&self) -> bool {
        self.session.as_ref().is_some_and(|s| !s.client.is_closed())
    }

    pub fn pid(&self) -> Option<i32> {
        self.session
            .as_ref()
            .filter(|s| !s.client.is_closed())
            .map(|s| s.pid)
    }

    /// Closes the session; the server rolls back whatever was open in it.
    pub fn disconnect(&mut self) {
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
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .map_err(|e| fail(e, "setting up the session"))?
            .get(0);
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
        if !self.is_connected() {
            self.session = None;
            self.connect()?;
        }
        let session = self.session.as_mut().expect("connected above");
        let result = f(&mut session.client);
        let closed = session.client.is_closed();
        match result {
            Ok(v) => Ok(v),
            Err(CallError::Pg(e)) => {
                let lost = closed || error::is_connection_lost(&e);
                if lost {
                    self.session = None;
                }
                Err(Failure {
                    error: error::pg(&self.secrets, op, &e),
                    sqlstate: error::sqlstate(&e).map(str::to_string),
                    lost,
                })
            }
            Err(CallError::Io(e)) => {
                // A COPY stream write fails only when the connection does.
                self.session = None;
                Err(Failure {
                    error: error::other(
                        &self.secrets,
                        DestinationErrorKind::Unavailable,
                        format!("{op}: {e} (the connection to PostgreSQL was lost)"),
                    ),
                    sqlstate: None,
                    lost: true,
                })
            }
        }
    }

    /// The session's client, connecting if needed (start-up checks).
    pub fn client(&mut self) -> Result<&mut Client, Failure> {
        if !self.is_connected() {
            self.session = None;
            self.connect()?;
        }
        Ok(&mut self.session.as_mut().expect("connected above").client)
    }
}
