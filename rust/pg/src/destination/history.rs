//! Bounded commit history: the commit records of older checkpoints folded
//! into rows of `twopc_commit_segments`, and every reader of commit records
//! reading both tables.
//!
//! A segment row holds, in its `segment` column, the committed transactions
//! of one lineage and run in the core's encoding (versioned, checksummed;
//! see [`twopc_core::history`]), and beside it what a summary needs without
//! decoding it: how many transactions, their records, the checkpoint range.
//! Every read of a segment checks its bytes against its columns; a row that
//! does not agree was changed outside twopc and is a `Corrupt` error, never
//! guessed around: a segment read wrong would make a committed transaction
//! look LOST, or hide one from a rewind check.
//!
//! # Compaction
//!
//! One SQL transaction on the control session: a transaction-level advisory
//! lock per sink (a second compaction finds it taken and reports busy), the
//! sink's loose records read, the core's plan, then the planned records
//! deleted *with RETURNING* and one segment row inserted per group from what
//! the delete returned. Folding what the delete returned, not what was read,
//! matters: a retract that removed a record meanwhile makes the delete
//! return nothing for it (PostgreSQL re-checks a row a concurrent
//! transaction deleted), so a retracted record never comes back in a
//! segment. At COMMIT the records leave the loose table and appear in
//! segments at once.
//!
//! A commit record is inserted inside its prepared transaction, so it is
//! invisible, and not folded, until COMMIT PREPARED; a later compaction
//! folds it.
//!
//! Then, in the same SQL transaction, small segments are merged, so that
//! the number of rows grows with the history divided by `max_segment`, not
//! by what one compaction folds (a committer folds a few hundred records at
//! a time): the core's `plan_merge` groups them by their columns, each
//! group's rows are locked (`FOR UPDATE`, as a retract locks them) and read
//! back checked, their transactions deduplicated by id, one row inserted
//! and the old ones deleted. A damaged row in a group is a `Corrupt` error
//! and the whole compaction is rolled back: nothing folded, nothing merged.
//!
//! A retract takes the same advisory lock, waiting for it, first in its SQL
//! transaction: a merge replaces segment rows with a new one, which a
//! retract already reading (its statement's snapshot taken before the merge
//! committed) would not see; it would find the old rows deleted and take
//! the record for gone. Compactions are short, and one that finds a retract
//! holding the lock reports busy.
//!
//! # Readers
//!
//! Lists read the loose records first, then the segments, each statement
//! with its own snapshot: a compaction committing in between moves records
//! to where the second read looks, so a record may be seen twice (dropped
//! by id), never not at all. Sums (`lineages`, `history_tallies`) read both
//! tables in one statement, so they see one snapshot.
//!
//! Looking one transaction up (a repeated commit after 42704, a retract)
//! reads the segments covering its checkpoint in *every* lineage of the
//! sink, not only its own: a segment whose lineage column was changed must
//! show as damaged rather than make the transaction look lost. Lineages are
//! few, so this stays a handful of rows.
//!
//! An abort has no checkpoint to look a transaction up by, so it consults
//! the loose records only: an abort of a folded transaction answers
//! `NotFound` rather than `WasCommitted`, and removes nothing either way
//! (`twopc decide` looks committed transactions up through
//! `committed_after`, which reads segments).

use std::collections::{HashMap, HashSet};

use postgres::Row;
use twopc_core::destination::{CommittedTransaction, Compaction, HistoryPolicy, HistoryTally};
use twopc_core::error::{DestinationError, DestinationErrorKind};
use twopc_core::history::{
    decode_segment, encode_segment, plan_compaction, plan_merge, SegmentInfo,
};
use twopc_core::ids::{CheckpointId, LineageId, RunId, SinkId, TransactionId};

use super::{lock_key, to_i64, PgDestination};
use crate::link::CallError;

/// What a read of loose commit records selects, in [`record_of`]'s order.
pub(super) const RECORD_COLUMNS: &str =
    "transaction_id, lineage, checkpoint, subtask, run_id, row_count, \
     (extract(epoch FROM coalesce(committed_at, prepared_at)) * 1000)::int8, sink_id";

/// What a read of segment rows selects, in [`SegmentRow::of`]'s order.
const SEGMENT_COLUMNS: &str =
    "id, lineage, run_id, first_checkpoint, last_checkpoint, transactions, row_count, segment";

/// A loose commit record read with [`RECORD_COLUMNS`]; `Err` says what is
/// wrong with the row of `table` (it was edited by hand). As for a segment,
/// every column is checked against what the transaction id says and what
/// the sink writes, never taken as it is: a negative checkpoint or count
/// read as a huge one, or a row filed under another sink or subtask than
/// its id names, would make rewind detection and retracts act on the wrong
/// transactions.
pub(super) fn record_of(row: &Row, table: &str) -> Result<CommittedTransaction, String> {
    let id: String = row.get(0);
    let edited = |what: String| {
        format!(
            "{table} holds a row for {id} whose {what}; it was edited by hand. Restore the row \
             from a backup, or correct it (DELETE FROM {table} WHERE transaction_id = '{id}' \
             if the transaction never committed)"
        )
    };
    let parsed = TransactionId::parse(&id).ok_or_else(|| {
        format!("{table} holds a row for {id:?}, which is not a twopc transaction id; it was edited by hand")
    })?;
    let sink: String = row.get(7);
    if sink != parsed.sink.as_str() {
        return Err(edited(format!(
            "sink_id is {sink:?} but its transaction id names sink '{}'",
            parsed.sink
        )));
    }
    let subtask: i32 = row.get(3);
    if i64::from(subtask) != i64::from(parsed.subtask) {
        return Err(edited(format!(
            "subtask is {subtask} but its transaction id names subtask {}",
            parsed.subtask
        )));
    }
    let unsigned = |column: &str, v: i64| {
        u64::try_from(v).map_err(|_| edited(format!("{column} is negative ({v})")))
    };
    let checkpoint = unsigned("checkpoint", row.get(2))?;
    let records = unsigned("row_count", row.get(5))?;
    let run = RunId::new(row.get::<_, String>(4))
        .map_err(|e| edited(format!("run_id is not a run id ({e})")))?;
    Ok(CommittedTransaction {
        transaction: parsed.id,
        // A bit pattern: the sink stores the u64 in a bigint as it is.
        lineage: LineageId(row.get::<_, i64>(1) as u64),
        checkpoint,
        subtask: parsed.subtask,
        run,
        records,
        committed_at_ms: row.get::<_, i64>(6).max(0) as u64,
    })
}

/// One row of the segments' table, as stored.
struct SegmentRow {
    id: i64,
    lineage: i64,
    run: String,
    first: i64,
    last: i64,
    transactions: i64,
    row_count: i64,
    bytes: Vec<u8>,
}

impl SegmentRow {
    /// A row read with [`SEGMENT_COLUMNS`].
    fn of(row: &Row) -> Self {
        SegmentRow {
            id: row.get(0),
            lineage: row.get(1),
            run: row.get(2),
            first: row.get(3),
            last: row.get(4),
            transactions: row.get(5),
            row_count: row.get(6),
            bytes: row.get(7),
        }
    }
}

/// The columns of a segment holding `txns` (one lineage and run, not
/// empty): transactions, records, first and last checkpoint.
fn summary(txns: &[CommittedTransaction]) -> (i64, i64, i64, i64) {
    let records: u64 = txns.iter().map(|c| c.records).sum();
    let first = txns.iter().map(|c| c.checkpoint).min().unwrap_or(0);
    let last = txns.iter().map(|c| c.checkpoint).max().unwrap_or(0);
    (
        txns.len() as i64,
        i64::try_from(records).unwrap_or(i64::MAX),
        first as i64,
        last as i64,
    )
}

/// Reads the segment rows of one sink back, checked.
#[derive(Clone)]
struct Segments {
    table: String,
    sink: SinkId,
}

impl Segments {
    /// The transactions of `s`, once its bytes decode as a segment of this
    /// sink filed under the row's lineage and run, and its columns say
    /// what it holds.
    fn read(&self, s: &SegmentRow) -> Result<Vec<CommittedTransaction>, String> {
        let run = RunId::new(s.run.as_str()).map_err(|e| {
            self.damaged(s, &format!("its run_id {:?} is not a run id ({e})", s.run))
        })?;
        let txns = decode_segment(
            &s.bytes,
            &self.sink,
            Some((LineageId(s.lineage as u64), &run)),
        )
        .map_err(|e| {
            self.damaged(
                s,
                &format!("its segment bytes do not read back as filed ({e})"),
            )
        })?;
        if txns.is_empty() {
            return Err(self.damaged(s, "it holds no transaction"));
        }
        let (n, records, first, last) = summary(&txns);
        let mut wrong = Vec::new();
        if n != s.transactions {
            wrong.push(format!(
                "transactions says {} but it holds {n}",
                s.transactions
            ));
        }
        if records != s.row_count {
            wrong.push(format!(
                "row_count says {} but its transactions hold {records} records",
                s.row_count
            ));
        }
        if (first, last) != (s.first, s.last) {
            wrong.push(format!("it holds checkpoints {first} to {last}"));
        }
        if !wrong.is_empty() {
            return Err(self.damaged(
                s,
                &format!("its columns contradict its content: {}", wrong.join("; ")),
            ));
        }
        Ok(txns)
    }

    fn damaged(&self, s: &SegmentRow, what: &str) -> String {
        format!(
            "the history segment in {table} with id {id} (sink '{sink}', lineage {lineage} = \
             {raw} in the table, checkpoints {first} to {last}) is damaged: {what}. It was \
             changed outside twopc. Restore the row from a backup; if there is none, delete it \
             (DELETE FROM {table} WHERE id = {id}) and reconcile its checkpoints by hand: twopc \
             then no longer knows the transactions it held, so it can neither detect a rewind \
             over them nor retract them",
            table = self.table,
            id = s.id,
            sink = self.sink,
            lineage = LineageId(s.lineage as u64),
            raw = s.lineage,
            first = s.first,
            last = s.last,
        )
    }
}

/// A transaction found in a segment: which row holds it.
pub(super) struct Folded {
    pub segment_id: i64,
    pub lineage: LineageId,
    pub first: i64,
    pub last: i64,
}

/// What a retract removed of a transaction's commit record.
pub(super) enum RecordRemoved {
    /// Its loose row.
    Loose,
    /// Its entry in segment `id`, and the whole row when it was the last.
    Folded { id: i64, emptied: bool },
    /// Nothing: already retracted.
    Nothing,
}

impl PgDestination {
    fn segments(&self) -> Segments {
        Segments {
            table: self.control_tables.segments.clone(),
            sink: self.sink.clone(),
        }
    }

    /// The advisory lock of this sink's commit history: a compaction takes
    /// it (or reports busy), a retract waits for it.
    fn history_lock_key(&self) -> i64 {
        lock_key(&format!(
            "twopc-history\0{}\0{}",
            self.options.control_schema, self.sink
        ))
    }

    fn corrupt(&self, message: String) -> DestinationError {
        self.err(DestinationErrorKind::Corrupt, message)
    }

    /// Whether the segments' table exists. Only a yes is remembered: another
    /// process's compaction may create it later, and a reader that still
    /// took it for absent would miss what that compaction folded. Callers
    /// ask after reading the loose records, for the same reason.
    pub(super) fn segments_exist(&mut self) -> Result<bool, DestinationError> {
        if !self.segments_known {
            let name = self.control_tables.segments.clone();
            self.segments_known = self.table_exists(&name)?;
        }
        Ok(self.segments_known)
    }

    /// Runs a statement that sums this sink's history, built by `sql` for
    /// whether the segments' table exists, with the sink id as `$1`. The
    /// table can appear between that look and the statement (the first
    /// compaction creates it and folds records into it in one go), and
    /// a sum without it would then miss them: it is taken again with it.
    fn sum_history(
        &mut self,
        op: &str,
        sql: impl Fn(bool) -> String,
    ) -> Result<Vec<postgres::Row>, DestinationError> {
        let sink = self.sink.as_str().to_string();
        loop {
            let with_segments = self.segments_exist()?;
            let statement = sql(with_segments);
            let rows = self
                .control
                .run(op, |c| Ok(c.query(&statement, &[&sink])?))?;
            // Once the table is known it stays known: this ends.
            if with_segments || !self.segments_exist()? {
                return Ok(rows);
            }
        }
    }

    /// Creates the segments' table when absent (databases whose control
    /// tables predate it, set up by a user who could not create it then).
    fn ensure_segments_table(&mut self) -> Result<(), DestinationError> {
        if self.segments_exist()? {
            return Ok(());
        }
        let ddl = self.control_tables.segments_ddl();
        let created = self
            .control
            .run("creating the history segments' table", |c| {
                if let Err(e) = c.batch_execute(&ddl) {
                    let _ = c.batch_execute("ROLLBACK");
                    return Err(e.into());
                }
                Ok(())
            });
        if let Err(f) = created {
            return Err(self.err(
                DestinationErrorKind::NotPermitted,
                format!(
                    "{} does not exist and could not be created ({}), so the commit records of \
                     sink '{}' stay one row per transaction and {} keeps growing. Have it \
                     created (`{}`, with SELECT, INSERT, UPDATE and DELETE for this user), or \
                     let this user create tables in schema {}; compaction is tried again later",
                    self.control_tables.segments,
                    f.error,
                    self.sink,
                    self.control_tables.commit_records,
                    self.control_tables
                        .segments_create()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" "),
                    crate::sql::quote_ident(&self.control_tables.schema),
                ),
            ));
        }
        self.segments_known = true;
        Ok(())
    }

    /// Adds to `out` the transactions of `lineage` after `checkpoint` that
    /// are folded into segments, leaving out those already in it (read
    /// after the loose records: see the module docs).
    pub(super) fn add_folded_after(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
        out: &mut Vec<CommittedTransaction>,
    ) -> Result<(), DestinationError> {
        if !self.segments_exist()? {
            return Ok(());
        }
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM {} \
             WHERE sink_id = $1 AND lineage = $2 AND last_checkpoint > $3 \
             ORDER BY first_checkpoint, id",
            self.control_tables.segments
        );
        let sink = self.sink.as_str().to_string();
        let after = to_i64(checkpoint, "checkpoint id")?;
        let rows = self.control.run("reading history segments", |c| {
            Ok(c.query(&sql, &[&sink, &(lineage.0 as i64), &after])?)
        })?;
        let segments = self.segments();
        let mut seen: HashSet<TransactionId> = out.iter().map(|c| c.transaction.clone()).collect();
        for row in &rows {
            let txns = segments
                .read(&SegmentRow::of(row))
                .map_err(|m| self.corrupt(m))?;
            for c in txns {
                if c.checkpoint > checkpoint && seen.insert(c.transaction.clone()) {
                    out.push(c);
                }
            }
        }
        Ok(())
    }

    /// The segment holding `txn`, committed at `checkpoint`, if any (see
    /// the module docs for why every lineage's segments covering the
    /// checkpoint are read). Any of them damaged is an error.
    pub(super) fn folded(
        &mut self,
        txn: &TransactionId,
        checkpoint: CheckpointId,
    ) -> Result<Option<Folded>, DestinationError> {
        if !self.segments_exist()? {
            return Ok(None);
        }
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM {} \
             WHERE sink_id = $1 AND first_checkpoint <= $2 AND last_checkpoint >= $2 \
             ORDER BY id",
            self.control_tables.segments
        );
        let sink = self.sink.as_str().to_string();
        let cp = to_i64(checkpoint, "checkpoint id")?;
        let rows = self
            .control
            .run("looking the transaction up in history segments", |c| {
                Ok(c.query(&sql, &[&sink, &cp])?)
            })?;
        let segments = self.segments();
        let mut found = None;
        for row in &rows {
            let s = SegmentRow::of(row);
            let txns = segments.read(&s).map_err(|m| self.corrupt(m))?;
            if found.is_none() && txns.iter().any(|c| &c.transaction == txn) {
                found = Some(Folded {
                    segment_id: s.id,
                    lineage: LineageId(s.lineage as u64),
                    first: s.first,
                    last: s.last,
                });
            }
        }
        Ok(found)
    }

    /// Removes the rows of a committed transaction from the target table
    /// (`retract_rows`; none when `None`, rows deleted by hand) and its
    /// commit record, loose or folded, in one SQL transaction: both go, or
    /// neither. A folded record's segment row is locked, rewritten without
    /// it, and deleted when it was the last.
    pub(super) fn retract_record(
        &mut self,
        committed: &CommittedTransaction,
        retract_rows: Option<&str>,
        delete_record: &str,
    ) -> Result<(u64, RecordRemoved), DestinationError> {
        let txn = committed.transaction.clone();
        let records = committed.records;
        let cp = to_i64(committed.checkpoint, "checkpoint id")?;
        let seg = self.control_tables.segments.clone();
        let covering = format!(
            "SELECT {SEGMENT_COLUMNS} FROM {seg} \
             WHERE sink_id = $1 AND first_checkpoint <= $2 AND last_checkpoint >= $2 \
             ORDER BY id FOR UPDATE"
        );
        let rewrite = format!(
            "UPDATE {seg} SET segment = $2, transactions = $3, row_count = $4, \
                              first_checkpoint = $5, last_checkpoint = $6 \
             WHERE id = $1"
        );
        let remove = format!("DELETE FROM {seg} WHERE id = $1");
        let known = self.segments_known;
        let sink = self.sink.as_str().to_string();
        let segments = self.segments();
        let key = self.history_lock_key();
        let outcome = self
            .control
            .run("retracting a committed transaction", |c| {
                let mut t = c.transaction()?;
                // Waits for a compaction that runs: one that merges the
                // segment holding this transaction replaces its row with a
                // new one, which a read of this statement's snapshot would
                // not see (it would find the old row deleted, and the
                // record gone). Taken first, before any row lock, so that
                // neither waits for the other holding what it needs.
                t.execute("SELECT pg_advisory_xact_lock($1)", &[&key])?;
                let rows = match retract_rows {
                    Some(sql) => t.execute(sql, &[&txn.as_str()])?,
                    None => 0,
                };
                // Each record of a transactional commit is one row holding
                // its transaction id. None while its record is still there
                // (a repeated retraction finds neither), or more than it
                // wrote, says the column is not the one the sink fills (a
                // wrong --transaction-id-column where nothing recorded the
                // sink's): removing the record alone would hide output the
                // replay then writes again (found by review). Returning
                // drops the SQL transaction, which undoes the delete.
                // The same for a job: its column may have been added or
                // renamed after these commits (their rows hold none of it),
                // and removing the record alone would let the replay write
                // every one of those rows again (found by review). A row
                // trigger that skipped all of a transaction's rows looks the
                // same; the job stops and says both (see the refusal).
                let wrong_rows = |record_found: bool| {
                    retract_rows.is_some()
                        && records > 0
                        && (rows > records || (rows == 0 && record_found))
                };
                if t.execute(delete_record, &[&txn.as_str()])? > 0 {
                    if wrong_rows(true) {
                        return Ok(Err(Refusal::Rows(rows)));
                    }
                    t.commit()?;
                    return Ok(Ok((rows, RecordRemoved::Loose)));
                }
                // Not loose: folded, or already retracted. Looked for after
                // the loose delete (a compaction may just have folded it).
                let exists = known
                    || t.query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&seg])?
                        .get::<_, bool>(0);
                if !exists {
                    if wrong_rows(false) {
                        return Ok(Err(Refusal::Rows(rows)));
                    }
                    t.commit()?;
                    return Ok(Ok((rows, RecordRemoved::Nothing)));
                }
                let mut removed = RecordRemoved::Nothing;
                for row in t.query(&covering, &[&sink, &cp])? {
                    let s = SegmentRow::of(&row);
                    // A damaged segment rolls everything back (the
                    // transaction is dropped): rows and record stay
                    // together.
                    let mut txns = match segments.read(&s) {
                        Ok(txns) => txns,
                        Err(m) => return Ok(Err(Refusal::Segment(m))),
                    };
                    let before = txns.len();
                    txns.retain(|c| c.transaction != txn);
                    if txns.len() == before {
                        continue;
                    }
                    let emptied = txns.is_empty();
                    if emptied {
                        t.execute(&remove, &[&s.id])?;
                    } else {
                        // Every entry carries the run it is filed under.
                        let run = txns[0].run.clone();
                        let bytes = encode_segment(LineageId(s.lineage as u64), &run, &txns);
                        let (n, records, first, last) = summary(&txns);
                        t.execute(&rewrite, &[&s.id, &bytes, &n, &records, &first, &last])?;
                    }
                    removed = RecordRemoved::Folded { id: s.id, emptied };
                }
                if wrong_rows(!matches!(removed, RecordRemoved::Nothing)) {
                    return Ok(Err(Refusal::Rows(rows)));
                }
                t.commit()?;
                Ok(Ok((rows, removed)))
            })?;
        if matches!(outcome, Ok((_, RecordRemoved::Folded { .. }))) {
            self.segments_known = true;
        }
        outcome.map_err(|refusal| match refusal {
            Refusal::Segment(m) => self.corrupt(format!(
                "{m}. Transaction {txn} (checkpoint {}) was not retracted: its rows and its \
                 commit record stay until the segment is repaired",
                committed.checkpoint
            )),
            Refusal::Rows(rows) if !self.operator => DestinationError::new(
                // A restart meets the same rows: a stop, with the way out.
                DestinationErrorKind::NotPermitted,
                format!(
                    "transaction {txn} (checkpoint {}) committed {records} rows, but deleting \
                     the rows whose {column} is its id would remove {rows}, so the rewind cannot \
                     remove its output. Nothing was changed. Either {column} was added or renamed \
                     after this commit (its rows do not hold the id), or a row trigger skipped \
                     all of its rows. Delete the rows of lineage {} after the restored \
                     checkpoint by hand if they are there, then run `twopc reconcile <database> \
                     --sink {} --lineage {} --after-checkpoint <the restored checkpoint> \
                     --rows-deleted-by-hand --apply` and restore again; or restore the latest \
                     checkpoint instead",
                    committed.checkpoint,
                    committed.lineage,
                    self.sink,
                    committed.lineage,
                    column = self
                        .options
                        .transaction_id_column
                        .as_deref()
                        .unwrap_or("transaction id column"),
                ),
            ),
            Refusal::Rows(rows) => DestinationError::new(
                DestinationErrorKind::Rejected,
                format!(
                    "transaction {txn} (checkpoint {}) committed {records} rows, but deleting \
                     the rows whose {} is its id would remove {rows}: that column is not the \
                     one the sink fills with transaction ids. Nothing was changed. Pass the \
                     sink's transactionIdColumn; if its rows were already deleted by hand, use \
                     --rows-deleted-by-hand instead",
                    committed.checkpoint,
                    self.options
                        .transaction_id_column
                        .as_deref()
                        .unwrap_or("transaction id column")
                ),
            ),
        })
    }

    /// See [`twopc_core::destination::Destination::compact_history`] and
    /// the module docs.
    pub(super) fn compact_transactional(
        &mut self,
        policy: &HistoryPolicy,
    ) -> Result<Compaction, DestinationError> {
        self.ensure_segments_table()?;
        let statements = Statements::new(
            &self.control_tables.commit_records,
            &self.control_tables.segments,
        );
        let read = format!(
            "SELECT {RECORD_COLUMNS} FROM {} WHERE sink_id = $1",
            statements.records
        );
        let cr = statements.records.clone();
        let key = self.history_lock_key();
        let sink = self.sink.clone();
        let sink_text = sink.as_str().to_string();
        let segments = self.segments();
        let policy = *policy;
        let done = self.control.run("compacting the commit history", |c| {
            let mut t = c.transaction()?;
            let got: bool = t
                .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&key])?
                .get(0);
            if !got {
                return Ok(Ok(Compaction {
                    busy: true,
                    ..Compaction::default()
                }));
            }
            let mut done = Compaction::default();
            let mut loose = Vec::new();
            for row in t.query(&read, &[&sink_text])? {
                match record_of(&row, &cr) {
                    Ok(r) => loose.push(r),
                    Err(m) => return Ok(Err(m)),
                }
            }
            let groups = plan_compaction(&loose, &policy);
            if !groups.is_empty() {
                match fold(&mut t, &sink, &loose, &groups, &statements) {
                    Ok((folded, written)) => {
                        done.folded = folded;
                        done.segments = written;
                    }
                    Err(Failed::Sql(e)) => return Err(e),
                    Err(Failed::Refused(m)) => return Ok(Err(m)),
                }
            }
            match merge(&mut t, &segments, &policy, &statements) {
                Ok(merged) => done.merged = merged,
                Err(Failed::Sql(e)) => return Err(e),
                Err(Failed::Refused(m)) => {
                    return Ok(Err(format!(
                        "{m}. The compaction that met it while merging small segments changed \
                         nothing"
                    )))
                }
            }
            if done == Compaction::default() {
                // Nothing to fold or merge: the transaction only held the lock.
                return Ok(Ok(done));
            }
            t.commit()?;
            Ok(Ok(done))
        })?;
        done.map_err(|m| self.corrupt(m))
    }

    /// See [`twopc_core::destination::Destination::history_tallies`]: one
    /// statement over the loose records and the segments' columns, never
    /// their bytes.
    pub(super) fn tallies_transactional(&mut self) -> Result<Vec<HistoryTally>, DestinationError> {
        let cr = &self.control_tables.commit_records;
        let loose = format!(
            "SELECT lineage, run_id, count(*)::int8 AS n, sum(row_count)::int8 AS r, \
                    min(checkpoint) AS f, max(checkpoint) AS l \
             FROM {cr} WHERE sink_id = $1 GROUP BY lineage, run_id"
        );
        let segments = self.control_tables.segments.clone();
        let rows = self.sum_history("summing the commit history", |with_segments| {
            if with_segments {
                format!(
                    "SELECT lineage, run_id, sum(n)::int8, sum(r)::int8, min(f), max(l) FROM ( \
                       {loose} \
                       UNION ALL \
                       SELECT lineage, run_id, sum(transactions)::int8, sum(row_count)::int8, \
                              min(first_checkpoint), max(last_checkpoint) \
                       FROM {segments} WHERE sink_id = $1 GROUP BY lineage, run_id \
                     ) u GROUP BY lineage, run_id ORDER BY lineage, run_id"
                )
            } else {
                format!("{loose} ORDER BY lineage, run_id")
            }
        })?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let lineage = LineageId(row.get::<_, i64>(0) as u64);
            let run: String = row.get(1);
            let run = RunId::new(run.as_str()).map_err(|e| {
                self.corrupt(format!(
                    "{} or {} holds run_id {run:?} for lineage {lineage} of sink '{}', which is \
                     not a run id ({e}); it was edited by hand",
                    self.control_tables.commit_records, self.control_tables.segments, self.sink
                ))
            })?;
            out.push(HistoryTally {
                lineage,
                run,
                transactions: row.get::<_, i64>(2).max(0) as u64,
                records: row.get::<_, i64>(3).max(0) as u64,
                first_checkpoint: row.get::<_, i64>(4).max(0) as u64,
                last_checkpoint: row.get::<_, i64>(5).max(0) as u64,
            });
        }
        Ok(out)
    }

    /// Per lineage of this sink: transactions committed (loose and folded)
    /// and the latest checkpoint, in one statement (one snapshot).
    pub(super) fn lineage_counts(&mut self) -> Result<Vec<(i64, i64, i64)>, DestinationError> {
        let cr = &self.control_tables.commit_records;
        let loose = format!(
            "SELECT lineage, count(*)::int8 AS n, max(checkpoint) AS l FROM {cr} \
             WHERE sink_id = $1 GROUP BY lineage"
        );
        let segments = self.control_tables.segments.clone();
        let rows = self.sum_history("reading committed lineages", |with_segments| {
            if with_segments {
                format!(
                    "SELECT lineage, sum(n)::int8, max(l) FROM ( \
                       {loose} \
                       UNION ALL \
                       SELECT lineage, sum(transactions)::int8, max(last_checkpoint) \
                       FROM {segments} WHERE sink_id = $1 GROUP BY lineage \
                     ) u GROUP BY lineage ORDER BY lineage"
                )
            } else {
                format!("{loose} ORDER BY lineage")
            }
        })?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }

    /// The transactions of `lineage` at its latest checkpoint `last`,
    /// loose or folded, sorted by id.
    pub(super) fn transactions_at(
        &mut self,
        lineage: LineageId,
        last: i64,
    ) -> Result<Vec<CommittedTransaction>, DestinationError> {
        let cr = self.control_tables.commit_records.clone();
        let sql = format!(
            "SELECT {RECORD_COLUMNS} FROM {cr} \
             WHERE sink_id = $1 AND lineage = $2 AND checkpoint = $3"
        );
        let sink = self.sink.as_str().to_string();
        let rows = self.control.run("reading the latest commit records", |c| {
            Ok(c.query(&sql, &[&sink, &(lineage.0 as i64), &last])?)
        })?;
        let mut out = Vec::new();
        for row in &rows {
            // A loose row that is not a record of twopc is left out here, as
            // ever: the summary is for display; committed_after refuses it.
            if let Ok(r) = record_of(row, &cr) {
                out.push(r);
            }
        }
        if self.segments_exist()? {
            // `last` is the lineage's latest checkpoint, so a segment
            // holding it ends there.
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS} FROM {} \
                 WHERE sink_id = $1 AND lineage = $2 AND last_checkpoint = $3 ORDER BY id",
                self.control_tables.segments
            );
            let rows = self
                .control
                .run("reading the latest history segment", |c| {
                    Ok(c.query(&sql, &[&sink, &(lineage.0 as i64), &last])?)
                })?;
            let segments = self.segments();
            let mut seen: HashSet<TransactionId> =
                out.iter().map(|c| c.transaction.clone()).collect();
            for row in &rows {
                let txns = segments
                    .read(&SegmentRow::of(row))
                    .map_err(|m| self.corrupt(m))?;
                for c in txns {
                    if c.checkpoint as i64 == last && seen.insert(c.transaction.clone()) {
                        out.push(c);
                    }
                }
            }
        }
        out.sort_by(|a, b| a.transaction.cmp(&b.transaction));
        Ok(out)
    }
}

/// The statements of a compaction.
struct Statements {
    /// The loose records' table, for messages.
    records: String,
    /// Deletes the planned loose records, returning what it deleted.
    delete_records: String,
    /// Inserts one segment row.
    insert_segment: String,
    /// The summary columns of every segment row of a sink, for the merge
    /// plan (no bytes).
    list_segments: String,
    /// Locks and reads the segment rows of a merge group.
    lock_segments: String,
    /// Deletes the segment rows of a merge group.
    delete_segments: String,
}

impl Statements {
    fn new(records: &str, segments: &str) -> Self {
        Statements {
            records: records.to_string(),
            delete_records: format!(
                "DELETE FROM {records} WHERE sink_id = $1 AND transaction_id = ANY($2::text[]) \
                 RETURNING {RECORD_COLUMNS}"
            ),
            insert_segment: format!(
                "INSERT INTO {segments} (sink_id, lineage, run_id, first_checkpoint, \
                                         last_checkpoint, transactions, row_count, segment, \
                                         created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now())"
            ),
            list_segments: format!(
                "SELECT id, lineage, run_id, first_checkpoint, transactions FROM {segments} \
                 WHERE sink_id = $1"
            ),
            lock_segments: format!(
                "SELECT {SEGMENT_COLUMNS} FROM {segments} \
                 WHERE sink_id = $1 AND id = ANY($2::int8[]) \
                 ORDER BY first_checkpoint, id FOR UPDATE"
            ),
            delete_segments: format!("DELETE FROM {segments} WHERE id = ANY($1::int8[])"),
        }
    }
}

/// Why a step of a compaction stopped: the server failed (retryable, as
/// any statement), or what it found refuses it (a `Corrupt` error). Either
/// way the compaction's SQL transaction is rolled back.
enum Failed {
    Sql(CallError),
    Refused(String),
}

impl From<postgres::Error> for Failed {
    fn from(e: postgres::Error) -> Self {
        Failed::Sql(e.into())
    }
}

/// Checks that `txns` (one lineage and run) read back from the segment
/// they encode to; returns its bytes. `what` names them in the error.
fn encoded(
    sink: &SinkId,
    lineage: LineageId,
    run: &RunId,
    txns: &[CommittedTransaction],
    what: &str,
) -> Result<Vec<u8>, Failed> {
    let bytes = encode_segment(lineage, run, txns);
    // Read back before it replaces what it holds: what a later reader would
    // refuse (a record whose subtask contradicts its id, checkpoint 0)
    // stays where it is, and the error names it.
    match decode_segment(&bytes, sink, Some((lineage, run))) {
        Ok(back) if back == txns => Ok(bytes),
        Ok(_) => Err(Failed::Refused(format!(
            "a history segment of lineage {lineage} run {run} did not read back as written (a \
             bug; please report it); nothing was folded or merged"
        ))),
        Err(e) => Err(Failed::Refused(format!(
            "{what} of lineage {lineage} run {run} cannot be folded: {e}. A row was edited by \
             hand (its transaction id, subtask and checkpoint disagree); nothing was folded or \
             merged. Correct or remove that row"
        ))),
    }
}

/// Inserts the segment row holding `txns` (one lineage and run).
fn insert_segment(
    t: &mut postgres::Transaction<'_>,
    statements: &Statements,
    sink: &SinkId,
    txns: &[CommittedTransaction],
    bytes: &[u8],
) -> Result<(), Failed> {
    let (n, records, first, last) = summary(txns);
    let head = &txns[0];
    t.execute(
        &statements.insert_segment,
        &[
            &sink.as_str(),
            &(head.lineage.0 as i64),
            &head.run.as_str(),
            &first,
            &last,
            &n,
            &records,
            &bytes,
        ],
    )?;
    Ok(())
}

/// Folds the planned `groups` of `loose` records, inside the compaction's
/// SQL transaction: deletes them with RETURNING and writes one segment row
/// per group from what the delete returned (see the module docs). Returns
/// the records folded and the segments written.
fn fold(
    t: &mut postgres::Transaction<'_>,
    sink: &SinkId,
    loose: &[CommittedTransaction],
    groups: &[Vec<usize>],
    statements: &Statements,
) -> Result<(u64, u64), Failed> {
    let cr = &statements.records;
    let ids: Vec<&str> = groups
        .iter()
        .flatten()
        .map(|&i| loose[i].transaction.as_str())
        .collect();
    let mut current: HashMap<TransactionId, CommittedTransaction> = HashMap::new();
    for row in t.query(&statements.delete_records, &[&sink.as_str(), &ids])? {
        let r = record_of(&row, cr).map_err(Failed::Refused)?;
        current.insert(r.transaction.clone(), r);
    }
    let (mut folded, mut written) = (0, 0);
    for group in groups {
        // What the delete returned: a record retracted meanwhile is not
        // folded (see the module docs).
        let txns: Vec<CommittedTransaction> = group
            .iter()
            .filter_map(|&i| current.get(&loose[i].transaction).cloned())
            .collect();
        let Some(head) = txns.first() else { continue };
        let (lineage, run) = (head.lineage, head.run.clone());
        if txns.iter().any(|c| c.lineage != lineage || c.run != run) {
            return Err(Failed::Refused(format!(
                "the commit records of {} in {cr} changed lineage or run while being folded; \
                 they were edited by hand",
                txns.iter()
                    .map(|c| c.transaction.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let bytes = encoded(
            sink,
            lineage,
            &run,
            &txns,
            &format!("the commit records in {cr}"),
        )?;
        insert_segment(t, statements, sink, &txns, &bytes)?;
        folded += txns.len() as u64;
        written += 1;
    }
    Ok((folded, written))
}

/// Merges small segment rows of one lineage and run into one row each
/// group (the core's `plan_merge`), inside the compaction's SQL
/// transaction: the group's rows locked and read (checked: a damaged one
/// refuses the whole compaction), their transactions deduplicated by id,
/// one row inserted, the old rows deleted. Returns how many rows went.
fn merge(
    t: &mut postgres::Transaction<'_>,
    segments: &Segments,
    policy: &HistoryPolicy,
    statements: &Statements,
) -> Result<u64, Failed> {
    let sink = segments.sink.as_str();
    let mut ids = Vec::new();
    let mut infos = Vec::new();
    for row in t.query(&statements.list_segments, &[&sink])? {
        // A row whose run is no run id is left alone here; every reader
        // reports it.
        let Ok(run) = RunId::new(row.get::<_, String>(2)) else {
            continue;
        };
        ids.push(row.get::<_, i64>(0));
        infos.push(SegmentInfo {
            lineage: LineageId(row.get::<_, i64>(1) as u64),
            run,
            first: row.get::<_, i64>(3).max(0) as u64,
            transactions: row.get::<_, i64>(4).max(0) as u64,
        });
    }
    let mut merged = 0;
    for group in plan_merge(&infos, policy) {
        let wanted: Vec<i64> = group.iter().map(|&i| ids[i]).collect();
        // Locked, then read as they are now: a retract that rewrote or
        // emptied one meanwhile is seen (it locks them the same way).
        let rows: Vec<SegmentRow> = t
            .query(&statements.lock_segments, &[&sink, &wanted])?
            .iter()
            .map(SegmentRow::of)
            .collect();
        let Some(head) = rows.first() else { continue };
        let (lineage, run) = (head.lineage, head.run.clone());
        if rows.len() < 2 || rows.iter().any(|s| s.lineage != lineage || s.run != run) {
            continue;
        }
        let mut by_id: HashMap<TransactionId, CommittedTransaction> = HashMap::new();
        for s in &rows {
            for c in segments.read(s).map_err(Failed::Refused)? {
                by_id.entry(c.transaction.clone()).or_insert(c);
            }
        }
        let mut txns: Vec<CommittedTransaction> = by_id.into_values().collect();
        txns.sort_by(|a, b| (a.checkpoint, &a.transaction).cmp(&(b.checkpoint, &b.transaction)));
        let lineage = LineageId(lineage as u64);
        let run = RunId::new(run.as_str()).map_err(|e| Failed::Refused(e.to_string()))?;
        let what = format!("the history segments in {}", segments.table);
        let bytes = encoded(&segments.sink, lineage, &run, &txns, &what)?;
        insert_segment(t, statements, &segments.sink, &txns, &bytes)?;
        let gone: Vec<i64> = rows.iter().map(|s| s.id).collect();
        t.execute(&statements.delete_segments, &[&gone])?;
        merged += gone.len() as u64;
    }
    Ok(merged)
}

/// Why a retraction did not happen (its SQL transaction was dropped).
enum Refusal {
    /// A history segment does not decode.
    Segment(String),
    /// The rows the delete would remove: none, or more than committed.
    Rows(u64),
}
