//! Idempotent mode: upserts on a key, visible batch by batch.
//!
//! | | |
//! |---|---|
//! | How a repeat is made harmless | A replayed record is written again with `INSERT ... ON CONFLICT (key) DO UPDATE`: it overwrites the row it wrote the first time with the same values, changing nothing. |
//! | Needs from the destination | A stable key in every record and a primary key or unique index on exactly those columns (checked at start-up); UPDATE rights on the other columns; TEMP rights for the staging table. |
//! | Cost | No prepared transactions and no checkpoint latency: each batch commits on its own and is visible at once. But readers can see a state the job later rewinds (output of records that are replayed after a failure is visible before the replay rewrites it), and every write is an upsert. |
//! | Fails when | Records carry no stable key, or the same key means different things across a replay (the replay then overwrites with different values and the last write wins); output that must not be visible before the checkpoint; rows removed by anything but the job's own delete records (a replay cannot undo a row it no longer produces). |
//!
//! **Deletes.** With an operation field (`PgOptions::operation_field`, what
//! the SQL connector's upsert tables use), each record ends with one more
//! field: `U` upserts the row, `D` deletes the row with the record's key
//! (its other fields are ignored). A changelog replayed from a checkpoint
//! repeats the same upserts and deletes in the same order per key, so the
//! table ends as the changelog says. The batch statement then takes the
//! last staged row of each key and either deletes that key (`DELETE ...
//! USING`, first) or upserts it; a delete of an absent key does nothing.
//!
//! **New keys go straight in.** Without an operation field, a batch is
//! first copied straight into the target (`COPY`, in its own short
//! transaction): when none of its keys is in the table yet, nor twice in
//! the batch, that is the upsert's result at the cost of a plain load. A
//! key that is there already (a replay), or any other refusal, fails the
//! COPY, which is rolled back whole; the batch is then upserted as below,
//! and so are the following batches until the next checkpoint (a replay
//! repeats batch after batch, and a failed COPY costs a batch's work).
//!
//! How a batch is upserted, so that it stays bulk: `COPY` into a temporary
//! staging table (created once per session, emptied at every commit), then
//! one `INSERT ... SELECT ... ON CONFLICT` into the target, both in one
//! short transaction. The staging table numbers rows in arrival order, and
//! the `INSERT` takes only the last row of each key (`DISTINCT ON`): a
//! batch that holds a key twice would otherwise fail ("ON CONFLICT DO
//! UPDATE command cannot affect row a second time"), and the last value is
//! the one a record-at-a-time writer would have left.
//!
//! A record the server refuses makes the whole batch fail. Refused by the
//! COPY into the staging table (type syntax, range, length, encoding), the
//! error names the row's line, which is the record's position in the batch.
//! Refused by the upsert or the delete (NOT NULL, CHECK, unique, foreign
//! key), it names no row; then the batch is staged again in a transaction that is rolled back,
//! and upserted in parts under savepoints, bisecting down to the first
//! record (in arrival order) that fails on its own once the records before
//! it are in: a few dozen statements for a batch of thousands, run only on
//! the way to stopping the job. A batch that fails only a check deferred to
//! its COMMIT (a `DEFERRABLE` foreign key, a constraint trigger) is bisected
//! again with every check immediate; the record found is named only if the
//! batch without it passes, otherwise the batch is refused without a
//! position (see `locate_in_batch` in the destination).
//!
//! In this mode `prepare` is a flush (there is nothing buffered: every
//! write already committed), `commit` reports `Committed` with nothing to
//! do, `abort` finds nothing staged (rows already upserted stay; the replay
//! rewrites them), and there are no commit records, so rewind detection
//! does not apply: a replay from an old checkpoint rewrites the same keys.
//! The exception is what a transactional run of the same sink left
//! prepared, which `commit`, `abort` and `staged` finish as that mode would
//! (see the destination's `mode_switch` module).

use crate::sql::{quote_ident, TableName};

/// Name of the per-session staging table and of its arrival-order column.
/// The column name is chosen so it cannot clash with a configured column
/// (configured names are quoted, and this one is checked against them).
pub(crate) const STAGE_TABLE: &str = "twopc_stage";
pub(crate) const STAGE_SEQ: &str = "twopc_stage_seq";
/// The staging column of the operation field (`U` or `D`), when records
/// carry one.
pub(crate) const STAGE_OP: &str = "twopc_stage_op";

/// What start-up learnt about the target that shapes the statements
/// (`schema::check`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetTraits {
    /// A batch of new keys copied straight into the target leaves what the
    /// upsert would (see the module docs).
    pub copy_straight_in: bool,
    /// A key column is an identity column GENERATED ALWAYS: the upserts
    /// say `OVERRIDING SYSTEM VALUE`, so that they write the record's value
    /// as a COPY does (the transactional mode's and the one straight in),
    /// where a plain INSERT is refused. (Start-up refuses such a column
    /// outside the key: a replay would update it, which the server allows
    /// only to DEFAULT.)
    pub overriding_identity: bool,
}

pub(crate) struct IdempotentSql {
    /// The COPY straight into the target (see the module docs); none with
    /// an operation field, whose deletes only the upsert path applies.
    pub copy_target: Option<String>,
    pub create_stage: String,
    pub copy_stage: String,
    /// Deletes the rows of the keys whose last staged operation is `D`
    /// (only with an operation field); runs before `upsert`.
    pub delete: Option<String>,
    pub upsert: String,
    /// The rows the upsert (and delete) takes (the last of each key) as
    /// (arrival order, 0-based position in the batch), in no particular
    /// order.
    pub last_rows: String,
    /// The delete of the staged rows whose arrival order is in `$1` (only
    /// with an operation field).
    pub delete_some: Option<String>,
    /// The upsert of the staged rows whose arrival order is in `$1`.
    pub upsert_some: String,
}

impl IdempotentSql {
    /// The statements of one target. `operation_field`: each staged row
    /// carries `U` (upsert) or `D` (delete by key) in [`STAGE_OP`].
    pub fn new(
        table: &TableName,
        columns: &[String],
        types: &[String],
        keys: &[String],
        copy_options: &str,
        operation_field: bool,
        target: TargetTraits,
    ) -> Self {
        let cols = quoted_list(columns);
        // Where INSERT INTO {table} ({cols}) is followed by a query.
        let into = if target.overriding_identity {
            format!("{table} ({cols}) OVERRIDING SYSTEM VALUE")
        } else {
            format!("{table} ({cols})")
        };
        let stage = quote_ident(STAGE_TABLE);
        let seq = quote_ident(STAGE_SEQ);
        let op = quote_ident(STAGE_OP);
        let mut stage_cols: Vec<String> = columns
            .iter()
            .zip(types)
            .map(|(c, t)| format!("{} {t}", quote_ident(c)))
            .collect();
        if operation_field {
            stage_cols.push(format!("{op} text NOT NULL CHECK ({op} IN ('U', 'D'))"));
        }
        // Built from the target's column types read at start-up, not with
        // CREATE TABLE ... AS SELECT, so that no SELECT right is needed.
        let create_stage = format!(
            "CREATE TEMP TABLE IF NOT EXISTS {stage} ({}, {seq} bigint GENERATED ALWAYS AS \
             IDENTITY) ON COMMIT DELETE ROWS",
            stage_cols.join(", "),
        );
        let copy_cols = if operation_field {
            format!("{cols}, {op}")
        } else {
            cols.clone()
        };
        let copy_stage = format!("COPY pg_temp.{stage} ({copy_cols}) FROM STDIN{copy_options}");
        let key_list = quoted_list(keys);
        let updates: Vec<String> = columns
            .iter()
            .filter(|c| !keys.contains(c))
            .map(|c| format!("{q} = EXCLUDED.{q}", q = quote_ident(c)))
            .collect();
        let action = if updates.is_empty() {
            // Every column is part of the key: a repeat is the same row.
            "DO NOTHING".to_string()
        } else {
            format!("DO UPDATE SET {}", updates.join(", "))
        };
        // The last staged row of each key: what a record-at-a-time writer
        // would have left. The upsert inserts them in arrival order, as
        // such a writer would and as the search for a refused record
        // (`upsert_some`) does: a unique index other than the key is
        // checked row by row, so another order could fail where the search
        // passes, leaving the error retryable forever (found by review).
        let last_of_each_key = |what: &str| {
            format!(
                "SELECT DISTINCT ON ({key_list}) {what} FROM pg_temp.{stage} \
                 ORDER BY {key_list}, {seq} DESC"
            )
        };
        let (upsert, delete, upsert_some, delete_some) = if operation_field {
            let target = quote_ident("twopc_target");
            let last = quote_ident("twopc_last");
            let key_match = |other: &str| {
                keys.iter()
                    .map(|k| format!("{target}.{q} = {other}.{q}", q = quote_ident(k)))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            };
            let upsert = format!(
                "INSERT INTO {into} SELECT {cols} FROM ({}) AS {last} \
                 WHERE {last}.{op} = 'U' ORDER BY {last}.{seq} ON CONFLICT ({key_list}) {action}",
                last_of_each_key(&format!("{copy_cols}, {seq}"))
            );
            let delete = format!(
                "DELETE FROM {table} AS {target} USING ({}) AS {last} \
                 WHERE {last}.{op} = 'D' AND {}",
                last_of_each_key(&format!("{key_list}, {op}")),
                key_match(&last)
            );
            let upsert_some = format!(
                "INSERT INTO {into} \
                 SELECT {cols} FROM pg_temp.{stage} WHERE {seq} = ANY($1::int8[]) AND {op} = 'U' \
                 ORDER BY {seq} ON CONFLICT ({key_list}) {action}"
            );
            let staged = quote_ident("twopc_staged");
            let delete_some = format!(
                "DELETE FROM {table} AS {target} USING pg_temp.{stage} AS {staged} \
                 WHERE {staged}.{seq} = ANY($1::int8[]) AND {staged}.{op} = 'D' AND {}",
                key_match(&staged)
            );
            (upsert, Some(delete), upsert_some, Some(delete_some))
        } else {
            let last = quote_ident("twopc_last");
            let upsert = format!(
                "INSERT INTO {into} SELECT {cols} FROM ({}) AS {last} \
                 ORDER BY {last}.{seq} ON CONFLICT ({key_list}) {action}",
                last_of_each_key(&format!("{cols}, {seq}"))
            );
            let upsert_some = format!(
                "INSERT INTO {into} \
                 SELECT {cols} FROM pg_temp.{stage} WHERE {seq} = ANY($1::int8[]) ORDER BY {seq} \
                 ON CONFLICT ({key_list}) {action}",
            );
            (upsert, None, upsert_some, None)
        };
        // Window functions run before DISTINCT ON, so the position counts
        // every staged row, not only the last of each key.
        let last_rows = format!(
            "SELECT DISTINCT ON ({key_list}) {seq}, row_number() OVER (ORDER BY {seq}) - 1 \
             FROM pg_temp.{stage} ORDER BY {key_list}, {seq} DESC",
        );
        let copy_target = (target.copy_straight_in && !operation_field)
            .then(|| format!("COPY {table} ({cols}) FROM STDIN{copy_options}"));
        IdempotentSql {
            copy_target,
            create_stage,
            copy_stage,
            delete,
            upsert,
            last_rows,
            delete_some,
            upsert_some,
        }
    }
}

pub(crate) fn quoted_list(names: &[String]) -> String {
    names
        .iter()
        .map(|n| quote_ident(n))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRAIGHT_IN: TargetTraits = TargetTraits {
        copy_straight_in: true,
        overriding_identity: false,
    };

    #[test]
    fn upsert_takes_the_last_row_of_each_key() {
        let t = TableName::parse("table", "s.kv").unwrap();
        let cols = vec!["k".to_string(), "v".to_string()];
        let sql = IdempotentSql::new(
            &t,
            &cols,
            &["bigint".into(), "text".into()],
            &["k".into()],
            "",
            false,
            STRAIGHT_IN,
        );
        assert_eq!(
            sql.copy_target.as_deref(),
            Some("COPY \"s\".\"kv\" (\"k\", \"v\") FROM STDIN")
        );
        assert_eq!(
            sql.upsert,
            "INSERT INTO \"s\".\"kv\" (\"k\", \"v\") SELECT \"k\", \"v\" FROM (SELECT \
             DISTINCT ON (\"k\") \"k\", \"v\", \"twopc_stage_seq\" FROM pg_temp.\"twopc_stage\" \
             ORDER BY \"k\", \"twopc_stage_seq\" DESC) AS \"twopc_last\" \
             ORDER BY \"twopc_last\".\"twopc_stage_seq\" \
             ON CONFLICT (\"k\") DO UPDATE SET \"v\" = EXCLUDED.\"v\""
        );
        assert!(sql.create_stage.contains("\"k\" bigint, \"v\" text"));
        assert!(sql.delete.is_none() && sql.delete_some.is_none());
        let all_key = IdempotentSql::new(
            &t,
            &cols,
            &["int".into(), "int".into()],
            &cols,
            "",
            false,
            STRAIGHT_IN,
        );
        assert!(all_key.upsert.ends_with("DO NOTHING"));
        let no_copy = IdempotentSql::new(
            &t,
            &cols,
            &["int".into(), "int".into()],
            &cols,
            "",
            false,
            TargetTraits::default(),
        );
        assert!(no_copy.copy_target.is_none());
        assert!(!sql.upsert.contains("OVERRIDING"));
        let identity_key = IdempotentSql::new(
            &t,
            &cols,
            &["bigint".into(), "text".into()],
            &["k".into()],
            "",
            false,
            TargetTraits {
                overriding_identity: true,
                ..STRAIGHT_IN
            },
        );
        for insert in [&identity_key.upsert, &identity_key.upsert_some] {
            assert!(
                insert.starts_with(
                    "INSERT INTO \"s\".\"kv\" (\"k\", \"v\") OVERRIDING SYSTEM VALUE SELECT "
                ),
                "{insert}"
            );
        }
    }

    #[test]
    fn with_an_operation_field_the_last_operation_of_each_key_decides() {
        let t = TableName::parse("table", "s.kv").unwrap();
        let cols = vec!["k".to_string(), "v".to_string()];
        let sql = IdempotentSql::new(
            &t,
            &cols,
            &["bigint".into(), "text".into()],
            &["k".into()],
            "",
            true,
            STRAIGHT_IN,
        );
        // Deletes go through the upsert path only.
        assert!(sql.copy_target.is_none());
        assert!(sql
            .create_stage
            .contains("\"twopc_stage_op\" text NOT NULL CHECK (\"twopc_stage_op\" IN ('U', 'D'))"));
        assert!(sql
            .copy_stage
            .contains("(\"k\", \"v\", \"twopc_stage_op\") FROM STDIN"));
        assert_eq!(
            sql.upsert,
            "INSERT INTO \"s\".\"kv\" (\"k\", \"v\") SELECT \"k\", \"v\" FROM (SELECT \
             DISTINCT ON (\"k\") \"k\", \"v\", \"twopc_stage_op\", \"twopc_stage_seq\" FROM \
             pg_temp.\"twopc_stage\" ORDER BY \"k\", \"twopc_stage_seq\" DESC) AS \
             \"twopc_last\" WHERE \"twopc_last\".\"twopc_stage_op\" = 'U' ORDER BY \
             \"twopc_last\".\"twopc_stage_seq\" ON CONFLICT (\"k\") DO UPDATE SET \"v\" = \
             EXCLUDED.\"v\""
        );
        assert_eq!(
            sql.delete.as_deref(),
            Some(
                "DELETE FROM \"s\".\"kv\" AS \"twopc_target\" USING (SELECT DISTINCT ON (\"k\") \
                 \"k\", \"twopc_stage_op\" FROM pg_temp.\"twopc_stage\" ORDER BY \"k\", \
                 \"twopc_stage_seq\" DESC) AS \"twopc_last\" WHERE \
                 \"twopc_last\".\"twopc_stage_op\" = 'D' AND \"twopc_target\".\"k\" = \
                 \"twopc_last\".\"k\""
            )
        );
        assert!(sql
            .delete_some
            .unwrap()
            .contains("\"twopc_staged\".\"twopc_stage_op\" = 'D'"));
        assert!(sql.upsert_some.contains("AND \"twopc_stage_op\" = 'U'"));
    }
}
