//! One `COPY ... FROM STDIN` kept open for a whole transaction, fed from a
//! thread of its own.
//!
//! Why: with one COPY per batch, the task thread and the server backend
//! take turns. The task thread sends a batch and then waits until the
//! server has parsed and inserted all of it; the server then idles while
//! the next batch is produced. On the benchmark machine, that left about a
//! sixth of the CPU idle during a load.
//!
//! A [`CopyStream`] moves the writer session's client to a feeder thread.
//! The feeder opens the COPY once and writes every chunk it receives from a
//! small bounded channel. The task thread hands over a chunk and goes back
//! to producing records while the server parses the last one.
//!
//! The channel holds at most [`CHUNKS_IN_FLIGHT`] chunks (a chunk is one
//! batch, so at most a few MiB per subtask). A server slower than the
//! producer therefore slows the producer down instead of filling memory.
//!
//! The synchronous `postgres` client ties a COPY writer to a borrow of its
//! client. Moving the client, not the writer, to the thread keeps the COPY
//! open across calls without any self-referential state: the thread owns
//! the client, borrows it for the COPY, and gives it back when the COPY
//! ends (finished, abandoned or failed).
//!
//! The server reports a rejected row only when the COPY ends. So a value
//! the server refuses shows at `prepare`, not at the `write` that carried
//! it; the destination maps the line the server names back to the record
//! (see [`crate::destination`]). What can be checked before sending (the
//! row's framing, encoding, field count) is, so such records never reach
//! the COPY.

use std::io::Write;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use postgres::Client;

use crate::link::CallError;

/// Chunks the task thread may run ahead of the server.
pub(crate) const CHUNKS_IN_FLIGHT: usize = 2;

enum Chunk {
    /// Shared, not copied: the destination keeps the latest chunks to show
    /// a row the server refuses when the COPY ends.
    Rows(Arc<Vec<u8>>),
    /// End the COPY normally; any other end of the channel abandons it.
    Finish,
}

/// How the feeder's COPY ended.
pub(crate) enum CopyEnd {
    /// `Finish` was sent and the server loaded this many rows.
    Finished(u64),
    /// The sender went away without `Finish`. The COPY was cancelled
    /// (`CopyFail`), so the transaction it ran in is aborted on the server.
    Abandoned,
}

/// What the feeder thread hands back when it ends: what it borrowed, and
/// how the COPY went.
pub(crate) type FeederResult<S> = (S, Result<CopyEnd, CallError>);

/// An open COPY on a feeder thread that owns the session `S` (the client
/// plus whatever the caller keeps with it) until the COPY ends.
pub(crate) struct CopyStream<S: Send + 'static> {
    chunks: SyncSender<Chunk>,
    feeder: JoinHandle<FeederResult<S>>,
}

impl<S: Send + 'static> CopyStream<S> {
    /// Starts the COPY `sql` on a feeder thread, which owns `session`
    /// until the stream ends. `client` picks the client out of the session.
    /// If the thread cannot be started, the session is dropped (closing the
    /// connection, so the server rolls back what was open in it), and the
    /// error says so.
    pub fn start(
        session: S,
        client: fn(&mut S) -> &mut Client,
        sql: String,
    ) -> Result<Self, std::io::Error> {
        let (chunks, received) = sync_channel(CHUNKS_IN_FLIGHT);
        let feeder = std::thread::Builder::new()
            .name("twopc-pg-copy".to_string())
            .spawn(move || {
                let mut session = session;
                let end = feed(client(&mut session), &sql, received);
                (session, end)
            })?;
        Ok(CopyStream { chunks, feeder })
    }

    /// Hands `rows` (whole COPY rows, each ending in a line break) to the
    /// feeder, waiting while the channel is full. `Err` means the feeder
    /// has ended: its COPY failed. Then [`CopyStream::end`] returns the
    /// reason.
    pub fn send(&self, rows: Arc<Vec<u8>>) -> Result<(), ()> {
        self.chunks.send(Chunk::Rows(rows)).map_err(|_| ())
    }

    /// Ends the COPY and waits for the feeder. If `finish`, the COPY is
    /// completed. Otherwise it is cancelled. `None` means the feeder thread
    /// panicked: the session is gone with it.
    pub fn end(self, finish: bool) -> Option<FeederResult<S>> {
        if finish {
            // A feeder that already ended (its COPY failed) has dropped the
            // receiver; its result is what `join` returns below.
            let _ = self.chunks.send(Chunk::Finish);
        }
        drop(self.chunks);
        self.feeder.join().ok()
    }
}

fn feed(client: &mut Client, sql: &str, chunks: Receiver<Chunk>) -> Result<CopyEnd, CallError> {
    let mut copy = client.copy_in(sql)?;
    loop {
        match chunks.recv() {
            Ok(Chunk::Rows(rows)) => {
                // The writer keeps what it is given until more arrives;
                // flushing hands the chunk to the server now, so it parses
                // it while the task thread produces the next one.
                copy.write_all(&rows)?;
                copy.flush()?;
            }
            Ok(Chunk::Finish) => return Ok(CopyEnd::Finished(copy.finish()?)),
            // Dropping the unfinished writer cancels the COPY.
            Err(_) => return Ok(CopyEnd::Abandoned),
        }
    }
}
