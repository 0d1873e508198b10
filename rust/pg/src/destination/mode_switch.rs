//! A sink whose mode was switched between runs: a checkpoint taken in one
//! mode restored in the other.
//!
//! The mode is a setting, and nothing stops a job from restoring a
//! checkpoint written in the other one. Its transactions were written the
//! other way, and each mode must not mistake them for its own:
//!
//! * **Transactional, then idempotent.** The checkpoint's transactions are
//!   PostgreSQL prepared transactions: invisible, holding their row locks,
//!   until `COMMIT PREPARED`. The idempotent mode, which keeps nothing
//!   staged itself, used to answer `Committed` to their commit and list no
//!   staged transactions, so they stayed prepared forever: their output
//!   never showed and their locks blocked every write of their keys. It
//!   now finishes them as the transactional mode would, with the same
//!   statements (both modes create the same control tables): a commit runs
//!   `COMMIT PREPARED` (and so still answers `AlreadyCommitted` or
//!   `Missing` from the commit records), `staged` lists the sink's prepared
//!   transactions so that the lingering and fresh-start rules apply to
//!   them, and abort and expiry roll them back.
//! * **Idempotent, then transactional.** An idempotent transaction was
//!   never prepared: its rows were upserted as they arrived, and it has no
//!   commit record, so `COMMIT PREPARED` answers 42704 and the record is
//!   missing, as for a lost transaction. The idempotent mode marks its
//!   handles ([`IDEMPOTENT_HANDLE`], the handle's location), and the
//!   transactional mode refuses a marked one with evidence that says what
//!   happened and what to do, instead of calling it rolled back. Nothing of
//!   it is lost, but the transactional mode cannot go on from that
//!   checkpoint: its replay would COPY again records the idempotent run
//!   already upserted.
//!
//! Handles written by the idempotent mode before it marked them cannot be
//! told from the transactional mode's. In idempotent mode such a handle
//! whose transaction is neither prepared nor committed is taken as one of
//! those (`Committed`, as the mode always answered) unless something shows
//! it had been prepared: its handle row in `twopc_prepared` (kept for this
//! by the idempotent mode's scans), an expiry tombstone or a note that it
//! was found lost. In transactional mode the evidence of such a loss names
//! the possibility.

use twopc_core::destination::CommitStatus;
use twopc_core::error::DestinationError;
use twopc_core::handle::TransactionHandle;

use super::PgDestination;

/// The location the idempotent mode gives its prepared handles: "written
/// in idempotent mode, never a prepared transaction". Versioned, so that a
/// later mark is never read as this one.
pub(super) const IDEMPOTENT_HANDLE: &[u8] = b"twopc-pg idempotent v1";

/// What the transactional mode's evidence of a missing transaction adds
/// when nothing shows it had ever been prepared.
pub(super) const UNMARKED_NOTE: &str = ". If this sink ran in idempotent mode when the \
     checkpoint was taken (by a release whose handles did not yet say their mode), the \
     transaction was never prepared and its rows were upserted as they arrived: restore the \
     checkpoint in idempotent mode instead";

/// True for a handle the idempotent mode wrote.
pub(super) fn written_idempotent(handle: &TransactionHandle) -> bool {
    handle.location() == Some(IDEMPOTENT_HANDLE)
}

impl PgDestination {
    /// Commit in idempotent mode: nothing to do for its own transactions
    /// (every batch committed when written); a transaction of the
    /// transactional mode is committed as that mode would.
    pub(super) fn commit_idempotent(
        &mut self,
        handle: &TransactionHandle,
    ) -> Result<CommitStatus, DestinationError> {
        if written_idempotent(handle) {
            return Ok(CommitStatus::Committed);
        }
        self.commit_transactional(handle)
    }

    /// Why the transactional mode cannot commit `handle`, which the
    /// idempotent mode wrote (the evidence of a `Missing` commit).
    pub(super) fn idempotent_handle_evidence(&self) -> String {
        format!(
            "it was written in idempotent mode (its handle says so), and this sink now runs in \
             transactional mode. Nothing of it is lost: its rows were upserted into {} as they \
             arrived. But it was never a prepared transaction and has no commit record, so the \
             transactional mode can neither commit it nor account for it, and its replay would \
             write again records the idempotent run already wrote. Restore this checkpoint with \
             the idempotent mode; to switch to the transactional mode, start it without state \
             (its fresh-start rules then apply) at an input position that follows what the \
             idempotent run wrote",
            self.table
        )
    }

    /// In idempotent mode, for a handle without the idempotent mark whose
    /// transaction is neither prepared nor committed and has no handle row
    /// or tombstone: true when it is taken for an idempotent handle of a
    /// release that did not mark them (see the module docs), which is
    /// unless twopc noted it lost before.
    pub(super) fn unmarked_idempotent(
        &mut self,
        handle: &TransactionHandle,
    ) -> Result<bool, DestinationError> {
        if self.txn_sql().is_some() {
            return Ok(false);
        }
        if !self.lost_table_exists()? {
            return Ok(true);
        }
        let sql = format!(
            "SELECT 1 FROM {} WHERE transaction_id = $1",
            self.control_tables.lost
        );
        let txn = handle.transaction.as_str();
        let noted = self
            .control
            .run("looking up notes of lost transactions", |c| {
                Ok(c.query_opt(&sql, &[&txn])?.is_some())
            })?;
        if !noted {
            log::info!(
                "{}: transaction {txn} is neither prepared nor committed, and its handle does \
                 not say which mode wrote it: taken for one the idempotent mode wrote (its rows \
                 were upserted when written)",
                self.sink
            );
        }
        Ok(!noted)
    }
}
