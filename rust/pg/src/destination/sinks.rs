//! What a transactional sink records of its configuration at start-up, in
//! `twopc_sinks` (one row per sink id): its target table as the server
//! resolved it (schema and name), its transaction-id column (or none) and
//! its control schema. `twopc reconcile` reads it, so that an operator need
//! not know the sink's settings, and refuses settings that contradict it.
//!
//! The row is written by every writer's start (upserted: a sink whose
//! configuration changed updates it; `recorded_at` is when the current
//! configuration was first recorded, kept while it stays the same). The
//! table is optional like the lost notes: a user who may not create it
//! runs the sink without it, with a warning, and the tool then asks for
//! `--table`. The operator's connection never writes it.

use twopc_core::error::{DestinationError, DestinationErrorKind};

use super::PgDestination;

/// A sink's configuration as it recorded it at its latest start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkRecord {
    /// The target table's schema and name, as the server resolved the
    /// configured table (an unqualified name by the sink's search_path).
    pub table_schema: String,
    pub table_name: String,
    /// The column the sink fills with each row's transaction id; `None`
    /// when it fills none.
    pub transaction_id_column: Option<String>,
    pub control_schema: String,
    /// When this configuration was first recorded (milliseconds since the
    /// epoch).
    pub recorded_at_ms: u64,
}

impl SinkRecord {
    /// The table as `schema.table`, the form the `table` option and the
    /// tool's `--table` take.
    pub fn table(&self) -> String {
        format!("{}.{}", self.table_schema, self.table_name)
    }
}

impl PgDestination {
    /// Records this sink's target table (`schema`, `name`, as resolved at
    /// start-up), transaction-id column and control schema. Never fails the
    /// start: without the table (a user who may not create it) or the right
    /// to write it, the sink runs, and a warning says what the tool will
    /// ask for instead.
    pub(super) fn record_sink(&mut self, schema: &str, name: &str) {
        let t = &self.control_tables.sinks;
        let sql = format!(
            "INSERT INTO {t} AS s (sink_id, table_schema, table_name, transaction_id_column, \
                                  control_schema, recorded_at) \
             VALUES ($1, $2, $3, $4, $5, now()) \
             ON CONFLICT (sink_id) DO UPDATE SET table_schema = excluded.table_schema, \
               table_name = excluded.table_name, \
               transaction_id_column = excluded.transaction_id_column, \
               control_schema = excluded.control_schema, recorded_at = excluded.recorded_at \
             WHERE (s.table_schema, s.table_name, s.transaction_id_column, s.control_schema) \
                   IS DISTINCT FROM (excluded.table_schema, excluded.table_name, \
                                     excluded.transaction_id_column, excluded.control_schema)"
        );
        let (sink, column, control) = (
            self.sink.as_str().to_string(),
            self.options.transaction_id_column.clone(),
            self.options.control_schema.clone(),
        );
        let done = self.control.run("recording the sink's target table", |c| {
            Ok(c.execute(&sql, &[&sink, &schema, &name, &column, &control])?)
        });
        if let Err(f) = done {
            log::warn!(
                "sink '{}' could not record its target table in {} ({}); the sink runs \
                 without it, but `twopc reconcile` then needs --table {}.{}{}. Have the table \
                 created (`{}`, with SELECT, INSERT and UPDATE for this user), or let this user \
                 create tables in schema {}",
                self.sink,
                t,
                f.error,
                schema,
                name,
                match &self.options.transaction_id_column {
                    Some(c) => format!(" --transaction-id-column {c}"),
                    None => String::new(),
                },
                self.control_tables
                    .create_statements(t)
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" "),
                crate::sql::quote_ident(&self.control_tables.schema),
            );
        }
    }

    /// What this sink recorded at its latest start, if it could: `None`
    /// when the table or the sink's row is absent.
    pub fn sink_record(&mut self) -> Result<Option<SinkRecord>, DestinationError> {
        let t = self.control_tables.sinks.clone();
        if !self.table_exists(&t)? {
            return Ok(None);
        }
        let sql = format!(
            "SELECT table_schema, table_name, transaction_id_column, control_schema, \
                    (extract(epoch FROM recorded_at) * 1000)::int8 \
             FROM {t} WHERE sink_id = $1"
        );
        let sink = self.sink.as_str().to_string();
        let row = self
            .control
            .run("reading the sink's recorded target table", |c| {
                Ok(c.query_opt(&sql, &[&sink])?)
            })?;
        Ok(row.map(|r| SinkRecord {
            table_schema: r.get(0),
            table_name: r.get(1),
            transaction_id_column: r.get(2),
            control_schema: r.get(3),
            recorded_at_ms: r.get::<_, i64>(4).max(0) as u64,
        }))
    }

    /// The target table as this session's server resolves it: its schema
    /// and name (an unqualified name by the search_path).
    pub fn resolved_table(&mut self) -> Result<(String, String), DestinationError> {
        let quoted = self.table.quoted();
        let row = self.control.run("looking up the target table", |c| {
            Ok(c.query_opt(
                "SELECT n.nspname::text, c.relname::text \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.oid = to_regclass($1::text)",
                &[&quoted],
            )?)
        })?;
        row.map(|r| (r.get(0), r.get(1))).ok_or_else(|| {
            self.err(
                DestinationErrorKind::Rejected,
                format!("target table {} does not exist", self.table),
            )
        })
    }
}
