//! A writer that waited too long for a lock, and what holds it.
//!
//! The writer session sets `lock_timeout` (see `WRITER_SETUP`), so a COPY or
//! an upsert blocked by a lock fails instead of waiting forever. The
//! blocker that never goes away by itself is a prepared transaction: it
//! keeps its locks, across server restarts, until it is committed or rolled
//! back, and one left by a job that no longer runs (another sink, a job
//! whose state was lost, a sink whose mode was switched) blocks every row
//! of the same key. The server's error (SQLSTATE 55P03) names no holder, so
//! it is completed here with the prepared transactions that hold locks on
//! the target table, which is what an operator has to decide.

use super::PgDestination;
use crate::link::Failure;

/// SQLSTATE lock_not_available: `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// At most this many holders are named.
const SHOWN: i64 = 10;

/// True when `f` is the writer's `lock_timeout` running out.
pub(super) fn timed_out(f: &Failure) -> bool {
    f.is(LOCK_NOT_AVAILABLE)
}

impl PgDestination {
    /// When `f` is a lock timeout of the writer, adds to its error the
    /// prepared transactions holding locks on the target table, and what to
    /// do (see [`PgDestination::lock_holders`]).
    pub(super) fn name_lock_holders(&mut self, f: &mut Failure) {
        let note = self.lock_holders(f);
        if !note.is_empty() {
            let message = format!("{}{note}", f.error.message);
            f.error.message = self.err(f.error.kind, message).message;
        }
    }

    /// When `f` is a lock timeout of the writer, a sentence naming the
    /// prepared transactions holding locks on the target table and what to
    /// do; else nothing. Best effort: a failing look-up is logged and
    /// leaves the error as it was.
    pub(super) fn lock_holders(&mut self, f: &Failure) -> String {
        if !timed_out(f) {
            return String::new();
        }
        // A prepared transaction's locks have no backend (pid is null); its
        // table locks are told from others by sharing the virtual
        // transaction of the lock it holds on its own xid.
        let sql = "SELECT x.gid, x.prepared::text, x.owner::text FROM pg_prepared_xacts x \
                   WHERE x.database = current_database() AND EXISTS ( \
                     SELECT 1 FROM pg_locks own JOIN pg_locks rel \
                       ON rel.virtualtransaction = own.virtualtransaction \
                     WHERE own.locktype = 'transactionid' AND own.transactionid = x.transaction \
                       AND own.pid IS NULL AND rel.locktype = 'relation' \
                       AND rel.relation = to_regclass($1::text)::oid) \
                   ORDER BY x.prepared LIMIT $2";
        let table = self.table.quoted();
        let holders = self
            .control
            .run("looking up prepared transactions holding locks", |c| {
                Ok(c.query(sql, &[&table, &SHOWN])?
                    .iter()
                    .map(|r| {
                        let (gid, at): (String, String) = (r.get(0), r.get(1));
                        // NULL when the role that prepared it was dropped.
                        let owner: Option<String> = r.get(2);
                        let by = owner.map_or_else(
                            || "a role since dropped; only a superuser can finish it".to_string(),
                            |o| format!("by {o}"),
                        );
                        format!("'{gid}' (prepared at {at} {by})")
                    })
                    .collect::<Vec<_>>())
            });
        match holders {
            Err(e) => {
                log::warn!(
                    "could not look up what holds the lock the writer waited for: {}",
                    e.error
                );
                String::new()
            }
            Ok(h) if h.is_empty() => format!(
                ". The writer waited longer than lock_timeout for a lock on {table}, and no \
                 prepared transaction holds one: find the session that does in pg_locks and \
                 pg_stat_activity (an ALTER TABLE, a VACUUM FULL, a long transaction). The \
                 writer waits at most a minute, or the lock_timeout set for the sink's user \
                 (ALTER ROLE ... SET lock_timeout)"
            ),
            Ok(h) => format!(
                ". The writer waited longer than lock_timeout for a lock on {table}; prepared \
                 transactions holding locks on it: {}. A prepared transaction keeps its locks \
                 until COMMIT PREPARED or ROLLBACK PREPARED, across restarts, so writes of its \
                 keys wait for it. If it belongs to no running job, decide it: with `twopc \
                 decide` when it is a twopc sink's (commit it if its checkpoint completed, abort \
                 it if not), else by COMMIT PREPARED or ROLLBACK PREPARED by hand",
                h.join(", ")
            ),
        }
    }
}
