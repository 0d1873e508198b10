//! Start-up checks and the sink's own tables.
//!
//! Everything that would make the sink fail later, or fail in a way that is
//! hard to read (COPY rejecting every row, PREPARE TRANSACTION refusing at
//! the first checkpoint, a permission error at commit time), is checked once
//! when the destination connects, with a message that says what to change.

use postgres::Client;
use twopc_core::config::SubtaskContext;
use twopc_core::error::{ConfigError, DestinationError};

use crate::column_types::{declared_name, silent_change, PgColumnType};
use crate::error;
use crate::idempotent::TargetTraits;
use crate::options::{PgMode, PgOptions, Secrets};
use crate::sql::{quote_ident, TableName};

/// Names of the control tables (created in `control_schema` when absent).
pub const COMMIT_RECORDS_TABLE: &str = "twopc_commit_records";
pub const PREPARED_TABLE: &str = "twopc_prepared";
pub const EXPIRED_TABLE: &str = "twopc_expired";
pub const OWNERS_TABLE: &str = "twopc_owners";
pub const LINEAGES_TABLE: &str = "twopc_lineages";
pub const RUNS_TABLE: &str = "twopc_runs";
/// Notes of transactions found LOST. Created with the others, but not
/// required: a database whose tables an administrator created before it
/// existed works without it (`twopc inspect` then cannot show such a loss).
pub const LOST_TABLE: &str = "twopc_lost";
/// The operations log: changes made by hand (`twopc reconcile --apply`,
/// `twopc decide`). Optional like the lost notes; `twopc` creates it on its
/// first change when it may.
pub const OPERATIONS_TABLE: &str = "twopc_operations";
/// Older commit records folded together (see
/// [`crate::destination`]'s bounded history). Optional like the lost notes:
/// created with the others when the user may, else by the first compaction
/// when it may; without it nothing is folded and the records stay single.
pub const SEGMENTS_TABLE: &str = "twopc_commit_segments";
/// What each transactional sink recorded of its configuration at its
/// latest start (target table as resolved, transaction-id column, control
/// schema), so that `twopc reconcile` needs no `--table`. Optional like the
/// lost notes: created with the others when the user may; without it the
/// sink runs (with a warning) and the tool asks for `--table`.
pub const SINKS_TABLE: &str = "twopc_sinks";

/// Oldest server accepted: generated columns (checked below) and
/// `to_regclass(text)` need 12.
const MIN_SERVER_VERSION: i32 = 120000;

/// Arbitrary constant key of the advisory lock that serialises creation of
/// the control tables, so that subtasks starting together do not race on
/// `CREATE TABLE` (which can fail with a duplicate-key error on the catalog
/// when two sessions create the same table at once).
const DDL_LOCK_KEY: i64 = 0x7477_6f70_6364_646c; // "twopcddl"

pub(crate) enum StartupError {
    Config(ConfigError),
    Pg(DestinationError),
}

impl From<ConfigError> for StartupError {
    fn from(e: ConfigError) -> Self {
        StartupError::Config(e)
    }
}

impl From<DestinationError> for StartupError {
    fn from(e: DestinationError) -> Self {
        StartupError::Pg(e)
    }
}

/// The quoted, schema-qualified names of the control tables.
#[derive(Clone, Debug)]
pub(crate) struct ControlTables {
    pub schema: String,
    pub commit_records: String,
    pub prepared: String,
    pub expired: String,
    pub owners: String,
    pub lineages: String,
    pub runs: String,
    pub lost: String,
    pub operations: String,
    pub segments: String,
    pub sinks: String,
}

impl ControlTables {
    pub fn new(schema: &str) -> Self {
        let q = |t: &str| format!("{}.{}", quote_ident(schema), quote_ident(t));
        ControlTables {
            schema: schema.to_string(),
            commit_records: q(COMMIT_RECORDS_TABLE),
            prepared: q(PREPARED_TABLE),
            expired: q(EXPIRED_TABLE),
            owners: q(OWNERS_TABLE),
            lineages: q(LINEAGES_TABLE),
            runs: q(RUNS_TABLE),
            lost: q(LOST_TABLE),
            operations: q(OPERATIONS_TABLE),
            segments: q(SEGMENTS_TABLE),
            sinks: q(SINKS_TABLE),
        }
    }

    /// Every control table.
    pub fn all(&self) -> [&String; 6] {
        [
            &self.commit_records,
            &self.prepared,
            &self.expired,
            &self.owners,
            &self.lineages,
            &self.runs,
        ]
    }

    /// The DDL, also useful to an administrator who creates the tables for
    /// a sink user without CREATE rights.
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {cr} (\n\
             \x20   transaction_id text PRIMARY KEY,\n\
             \x20   sink_id text NOT NULL,\n\
             \x20   subtask integer NOT NULL,\n\
             \x20   lineage bigint NOT NULL,\n\
             \x20   checkpoint bigint NOT NULL,\n\
             \x20   run_id text NOT NULL,\n\
             \x20   row_count bigint NOT NULL,\n\
             \x20   prepared_at timestamptz NOT NULL,\n\
             \x20   committed_at timestamptz\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {cri} ON {cr} (sink_id, lineage, checkpoint);\n\
             CREATE TABLE IF NOT EXISTS {p} (\n\
             \x20   transaction_id text PRIMARY KEY,\n\
             \x20   sink_id text NOT NULL,\n\
             \x20   handle bytea NOT NULL,\n\
             \x20   prepared_at timestamptz NOT NULL\n\
             );\n\
             CREATE TABLE IF NOT EXISTS {e} (\n\
             \x20   transaction_id text PRIMARY KEY,\n\
             \x20   sink_id text NOT NULL,\n\
             \x20   expired_at timestamptz NOT NULL\n\
             );\n\
             CREATE TABLE IF NOT EXISTS {o} (\n\
             \x20   sink_id text NOT NULL,\n\
             \x20   subtask integer NOT NULL,\n\
             \x20   run_id text NOT NULL,\n\
             \x20   attempt integer NOT NULL,\n\
             \x20   instance text NOT NULL,\n\
             \x20   backend_pid integer NOT NULL,\n\
             \x20   since timestamptz NOT NULL,\n\
             \x20   PRIMARY KEY (sink_id, subtask)\n\
             );\n\
             CREATE TABLE IF NOT EXISTS {l} (\n\
             \x20   sink_id text NOT NULL,\n\
             \x20   lineage bigint NOT NULL,\n\
             \x20   run_id text NOT NULL,\n\
             \x20   started_at timestamptz NOT NULL,\n\
             \x20   appended boolean NOT NULL,\n\
             \x20   PRIMARY KEY (sink_id, lineage)\n\
             );\n\
             CREATE TABLE IF NOT EXISTS {r} (\n\
             \x20   sink_id text NOT NULL,\n\
             \x20   run_id text NOT NULL,\n\
             \x20   lineage bigint NOT NULL,\n\
             \x20   PRIMARY KEY (sink_id, run_id)\n\
             );\n\
             CREATE TABLE IF NOT EXISTS {lost} (\n\
             \x20   transaction_id text PRIMARY KEY,\n\
             \x20   sink_id text NOT NULL,\n\
             \x20   lineage bigint NOT NULL,\n\
             \x20   checkpoint bigint NOT NULL,\n\
             \x20   note text NOT NULL\n\
             );\n\
             CREATE TABLE IF NOT EXISTS {ops} (\n\
             \x20   id bigserial PRIMARY KEY,\n\
             \x20   sink_id text NOT NULL,\n\
             \x20   at_ms bigint NOT NULL,\n\
             \x20   record text NOT NULL\n\
             );\n\
             CREATE TABLE IF NOT EXISTS {seg} (\n\
             \x20   id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,\n\
             \x20   sink_id text NOT NULL,\n\
             \x20   lineage bigint NOT NULL,\n\
             \x20   run_id text NOT NULL,\n\
             \x20   first_checkpoint bigint NOT NULL,\n\
             \x20   last_checkpoint bigint NOT NULL,\n\
             \x20   transactions bigint NOT NULL,\n\
             \x20   row_count bigint NOT NULL,\n\
             \x20   segment bytea NOT NULL,\n\
             \x20   created_at timestamptz NOT NULL\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {segl} ON {seg} (sink_id, lineage, last_checkpoint);\n\
             CREATE INDEX IF NOT EXISTS {segf} ON {seg} (sink_id, lineage, first_checkpoint);\n\
             CREATE TABLE IF NOT EXISTS {sinks} (\n\
             \x20   sink_id text PRIMARY KEY,\n\
             \x20   table_schema text NOT NULL,\n\
             \x20   table_name text NOT NULL,\n\
             \x20   transaction_id_column text,\n\
             \x20   control_schema text NOT NULL,\n\
             \x20   recorded_at timestamptz NOT NULL\n\
             );\n",
            cr = self.commit_records,
            cri = quote_ident("twopc_commit_records_by_lineage"),
            p = self.prepared,
            e = self.expired,
            o = self.owners,
            l = self.lineages,
            r = self.runs,
            lost = self.lost,
            ops = self.operations,
            seg = self.segments,
            segl = quote_ident("twopc_commit_segments_by_last"),
            segf = quote_ident("twopc_commit_segments_by_first"),
            sinks = self.sinks,
        )
    }
}

impl ControlTables {
    /// The statement that creates the operations log alone, serialised with
    /// every other creation of control tables.
    pub(crate) fn operations_ddl(&self) -> String {
        serialised_ddl(&self.operations_create())
    }

    /// The `CREATE TABLE` of the operations log, for an administrator.
    pub(crate) fn operations_create(&self) -> String {
        self.create_statements(&self.operations)
    }

    /// The statement that creates the history segments' table alone (with
    /// its indexes), serialised like [`Self::operations_ddl`].
    pub(crate) fn segments_ddl(&self) -> String {
        serialised_ddl(&self.segments_create())
    }

    /// The `CREATE TABLE` and `CREATE INDEX` statements of the history
    /// segments' table, for an administrator.
    pub(crate) fn segments_create(&self) -> String {
        self.create_statements(&self.segments)
    }

    /// The statements of [`Self::ddl`] that create `table` and its indexes:
    /// from its `CREATE TABLE` to the next table's.
    pub(crate) fn create_statements(&self, table: &str) -> String {
        let ddl = self.ddl();
        let start = ddl
            .find(&format!("CREATE TABLE IF NOT EXISTS {table} ("))
            .expect("the DDL creates every control table");
        let rest = &ddl[start..];
        let end = rest[1..]
            .find("CREATE TABLE ")
            .map_or(rest.len(), |i| i + 1);
        rest[..end].trim().to_string()
    }
}

/// `statements` in one transaction holding the lock that serialises every
/// creation of control tables.
fn serialised_ddl(statements: &str) -> String {
    format!("BEGIN; SELECT pg_advisory_xact_lock({DDL_LOCK_KEY}); {statements} COMMIT;")
}

/// What the checks learnt about the target table.
#[derive(Clone, Debug)]
pub(crate) struct TargetInfo {
    /// SQL types of the configured columns, with their collations where
    /// not the type's default, in configured order (for the
    /// idempotent mode's staging table).
    pub column_types: Vec<String>,
    /// Idempotent mode: how the statements must be built. A batch of new
    /// keys copied straight into the target leaves what the upsert would
    /// (see [`crate::idempotent`]), except when the target has INSERT rules
    /// (COPY skips them) or a key column may be NULL (NULL keys never
    /// conflict, and the upsert keeps one row per NULL key and batch).
    pub traits: TargetTraits,
    /// The target table as the server resolved it: its schema and name.
    pub schema: String,
    pub name: String,
}

struct Column {
    name: String,
    /// The type's name and modifier, for the declared-type check.
    pg_type: PgColumnType,
    /// ` COLLATE "schema"."name"` when the column's collation is not its
    /// type's default, else empty: a staging column without it would
    /// compare keys under another collation than the target's (an error,
    /// or rows told apart that the target's index takes as one).
    collate: String,
    not_null: bool,
    has_default: bool,
    generated: bool,
    /// `GENERATED ALWAYS AS IDENTITY`.
    identity_always: bool,
    type_sql: String,
    string_like: bool,
}

pub(crate) fn check(
    client: &mut Client,
    options: &PgOptions,
    ctx: &SubtaskContext,
    control: &ControlTables,
    secrets: &Secrets,
) -> Result<TargetInfo, StartupError> {
    let pg = |op: &str| {
        let op = op.to_string();
        move |e: postgres::Error| StartupError::Pg(error::pg(secrets, &op, &e))
    };
    let row = client
        .query_one(
            "SELECT current_user::text, current_database()::text, \
             current_setting('max_prepared_transactions')::int4, \
             current_setting('server_version_num')::int4",
            &[],
        )
        .map_err(pg("reading server settings"))?;
    let user: String = row.get(0);
    let db: String = row.get(1);
    let max_prepared: i32 = row.get(2);
    let version: i32 = row.get(3);
    let who = format!("database {db:?} as user {user:?}");

    if version < MIN_SERVER_VERSION {
        return Err(ConfigError::new(format!(
            "the PostgreSQL server is version {version}; twopc needs 12 or newer"
        ))
        .into());
    }

    let transactional = options.mode == PgMode::Transactional;
    if transactional {
        let n = ctx.parallelism;
        if max_prepared == 0 || (max_prepared as u32) < n {
            return Err(ConfigError::new(format!(
                "PostgreSQL's max_prepared_transactions is {max_prepared} ({who}), so {}. Each \
                 of the sink's {n} subtasks keeps at least one transaction prepared between a \
                 checkpoint and its commit: set max_prepared_transactions >= {n} (more if other \
                 sinks or jobs prepare transactions on this server, or checkpoints overlap) in \
                 postgresql.conf and restart the server. Or use the idempotent mode, which \
                 needs no prepared transactions",
                if max_prepared == 0 {
                    "PREPARE TRANSACTION is disabled".to_string()
                } else {
                    format!("at most {max_prepared} transactions can be prepared at once")
                }
            ))
            .into());
        }
    }

    let table = options.table_name()?;
    let (oid, schema, name) = target_oid(client, &table, &who, secrets)?;
    let columns = read_columns(client, oid, secrets)?;
    let column_types = check_columns(options, &table, &columns)?;
    check_rights(client, options, &table, oid, &user, secrets)?;

    let mut traits = TargetTraits::default();
    if let PgMode::Idempotent { key_columns } = &options.mode {
        let nullable: Vec<&String> = key_columns
            .iter()
            .filter(|k| !columns.iter().any(|c| &c.name == *k && c.not_null))
            .collect();
        check_unique_key(client, &table, oid, key_columns, &nullable, secrets)?;
        // Deletes match keys with `=`, under which NULL equals nothing: a
        // delete record with a NULL key would remove no row, without an
        // error, where the upsert (NULLS NOT DISTINCT) treats it as a key
        // like any other (found by review). Flink SQL's primary keys are
        // NOT NULL, so only a DataStream job can meet this.
        if options.operation_field && !nullable.is_empty() {
            let cols: Vec<String> = nullable.iter().map(|c| quote_ident(c)).collect();
            return Err(ConfigError::new(format!(
                "the operation field is set, so records may delete rows by key, but key columns \
                 of {table} may be NULL ({}): a delete of a key holding NULL would remove \
                 nothing. Make the key columns NOT NULL (ALTER TABLE {table} ALTER COLUMN ... SET \
                 NOT NULL), or leave the operation field out",
                cols.join(", ")
            ))
            .into());
        }
        let insert_rules: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_rewrite WHERE ev_class = $1 AND ev_type = '3')",
                &[&oid],
            )
            .map_err(pg("reading the target's rules"))?
            .get(0);
        let configured = |name: &String| columns.iter().find(|c| &c.name == name);
        let identity_always = |name: &&String| configured(name).is_some_and(|c| c.identity_always);
        if let Some(col) = options
            .columns
            .iter()
            .filter(|c| !key_columns.contains(c))
            .find(identity_always)
        {
            return Err(ConfigError::new(format!(
                "column {col} of {table} is an identity column GENERATED ALWAYS but not a key \
                 column: the idempotent mode writes every other column of a key again when a \
                 record repeats it, and PostgreSQL lets such a column be updated only to its \
                 default. Remove {col} from columns (the server then numbers new rows), or make \
                 it GENERATED BY DEFAULT (ALTER TABLE {table} ALTER COLUMN {col} SET GENERATED \
                 BY DEFAULT)",
                col = quote_ident(col)
            ))
            .into());
        }
        traits = TargetTraits {
            copy_straight_in: !insert_rules
                && key_columns
                    .iter()
                    .all(|k| configured(k).is_some_and(|c| c.not_null)),
            overriding_identity: key_columns.iter().any(|k| identity_always(&k)),
        };
        let temp: bool = client
            .query_one(
                "SELECT has_database_privilege(current_database(), 'TEMP')",
                &[],
            )
            .map_err(pg("checking TEMP privilege"))?
            .get(0);
        if !temp {
            return Err(ConfigError::new(format!(
                "user {user:?} may not create temporary tables in {db:?}; the idempotent mode \
                 loads each batch through a temporary staging table. Run: GRANT TEMP ON \
                 DATABASE {} TO {}",
                quote_ident(&db),
                quote_ident(&user)
            ))
            .into());
        }
    }

    // Both modes keep the owner of each subtask's share there (idempotent
    // mode needs no other control table).
    ensure_control_tables(client, control, &user, secrets)?;
    Ok(TargetInfo {
        column_types,
        traits,
        schema,
        name,
    })
}

fn target_oid(
    client: &mut Client,
    table: &TableName,
    who: &str,
    secrets: &Secrets,
) -> Result<(u32, String, String), StartupError> {
    let row = client
        .query_opt(
            "SELECT c.oid, c.relkind::text, n.nspname::text, c.relname::text \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = to_regclass($1::text)",
            &[&table.quoted()],
        )
        .map_err(|e| StartupError::Pg(error::pg(secrets, "looking up the target table", &e)))?;
    let Some(row) = row else {
        let where_ = if table.schema.is_none() {
            " on the search_path"
        } else {
            ""
        };
        return Err(ConfigError::new(format!(
            "target table {table} does not exist{where_} in {who}. Create it, or fix the table \
             option (names are case-sensitive and used exactly as written: \"Orders\" and \
             \"orders\" are different tables)"
        ))
        .into());
    };
    let oid: u32 = row.get(0);
    let kind: String = row.get(1);
    if kind != "r" && kind != "p" {
        let what = match kind.as_str() {
            "v" => "a view",
            "m" => "a materialized view",
            "f" => "a foreign table",
            "S" => "a sequence",
            "i" | "I" => "an index",
            _ => "not a table",
        };
        return Err(ConfigError::new(format!(
            "{table} is {what}; the sink writes with COPY into an ordinary or partitioned table"
        ))
        .into());
    }
    Ok((oid, row.get(2), row.get(3)))
}

fn read_columns(
    client: &mut Client,
    oid: u32,
    secrets: &Secrets,
) -> Result<Vec<Column>, StartupError> {
    // The declared-type check judges a column by the type its values are
    // kept as: `walk` follows domains to their base type (a domain over a
    // domain too) and an array to its element (an array of a domain, a
    // domain over an array), keeping the first type modifier met on the
    // way (a column's own, then each domain's: a domain carries the
    // modifier of the type it is declared as). The deepest step of each
    // column is that type.
    let rows = client
        .query(
            "WITH RECURSIVE walk(attnum, typ, typmod, is_array, depth) AS ( \
                 SELECT a.attnum, a.atttypid, a.atttypmod, false, 0 \
                 FROM pg_attribute a \
                 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
               UNION ALL \
                 SELECT w.attnum, \
                        CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.typelem END, \
                        CASE WHEN w.typmod >= 0 OR t.typtype <> 'd' THEN w.typmod \
                             ELSE t.typtypmod END, \
                        w.is_array OR t.typtype <> 'd', \
                        w.depth + 1 \
                 FROM walk w JOIN pg_type t ON t.oid = w.typ \
                 WHERE w.depth < 64 AND (t.typtype = 'd' OR (NOT w.is_array \
                       AND t.typcategory = 'A' AND t.typelem <> 0)) \
             ), \
             kept AS ( \
                 SELECT DISTINCT ON (attnum) attnum, typ, typmod, is_array \
                 FROM walk ORDER BY attnum, depth DESC \
             ) \
             SELECT a.attname::text, a.attnotnull, a.atthasdef OR a.attidentity <> '', \
                    a.attgenerated <> '', format_type(a.atttypid, a.atttypmod), \
                    t.typcategory = 'S', a.attidentity = 'a', \
                    k.typname::text, kept.is_array, kept.typmod, \
                    CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation \
                         THEN ' COLLATE ' || quote_ident(cn.nspname) || '.' || quote_ident(co.collname) \
                         ELSE '' END \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             JOIN kept ON kept.attnum = a.attnum \
             JOIN pg_type k ON k.oid = kept.typ \
             LEFT JOIN pg_collation co ON co.oid = a.attcollation \
             LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&oid],
        )
        .map_err(|e| StartupError::Pg(error::pg(secrets, "reading the target's columns", &e)))?;
    Ok(rows
        .iter()
        .map(|r| Column {
            name: r.get(0),
            not_null: r.get(1),
            has_default: r.get(2),
            generated: r.get(3),
            type_sql: r.get(4),
            string_like: r.get(5),
            identity_always: r.get(6),
            pg_type: PgColumnType {
                name: r.get(7),
                is_array: r.get(8),
                typmod: r.get(9),
            },
            collate: r.get(10),
        })
        .collect())
}

fn check_columns(
    options: &PgOptions,
    table: &TableName,
    columns: &[Column],
) -> Result<Vec<String>, ConfigError> {
    let actual = || {
        columns
            .iter()
            .map(|c| quote_ident(&c.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let find = |name: &str| columns.iter().find(|c| c.name == name);
    let mut types = Vec::new();
    let mut missing = Vec::new();
    for name in &options.columns {
        match find(name) {
            Some(c) if c.generated => {
                return Err(ConfigError::new(format!(
                    "column {} of {table} is a generated column and cannot be written; remove it \
                     from columns",
                    quote_ident(name)
                )))
            }
            Some(c) => types.push(format!("{}{}", c.type_sql, c.collate)),
            None => missing.push(quote_ident(name)),
        }
    }
    for (name, declared) in options.columns.iter().zip(&options.declared_types) {
        let Some(c) = find(name) else { continue };
        if let Some(why) = silent_change(declared, &c.pg_type) {
            return Err(ConfigError::new(format!(
                "column {} of {table} is {} in PostgreSQL, and the table declares it {}: {why}. \
                 This start wrote nothing. Declare the column in the table's DDL as the \
                 PostgreSQL column keeps it (a restored job's prepared transactions are then \
                 committed by its recovery), or change the PostgreSQL column once no transaction \
                 of this sink is prepared (`twopc inspect` lists them; an ALTER TABLE waits for \
                 the row locks they hold). To let PostgreSQL convert the values as releases \
                 before this check did, set 'sink.check-column-types' = 'false' in the table's \
                 WITH clause",
                quote_ident(name),
                c.type_sql,
                declared_name(declared)
            )));
        }
    }
    if !missing.is_empty() {
        return Err(ConfigError::new(format!(
            "the configured columns do not match table {table}: it has no column {} (its columns \
             are {}). Fix the columns option (names are case-sensitive) or the table",
            missing.join(", "),
            actual()
        )));
    }
    if let Some(col) = &options.transaction_id_column {
        match find(col) {
            None => {
                return Err(ConfigError::new(format!(
                    "transaction_id_column {} does not exist in {table} (its columns are {}); \
                     add it (ALTER TABLE {table} ADD COLUMN {} text) or unset the option",
                    quote_ident(col),
                    actual(),
                    quote_ident(col)
                )))
            }
            Some(c) if !c.string_like || c.generated => {
                return Err(ConfigError::new(format!(
                    "transaction_id_column {} of {table} is of type {}; it must be a writable \
                     text column (text or varchar of at least 120 characters)",
                    quote_ident(col),
                    c.type_sql
                )))
            }
            Some(_) => {}
        }
    }
    let unfilled: Vec<String> = columns
        .iter()
        .filter(|c| c.not_null && !c.has_default && !c.generated)
        .filter(|c| !options.columns.contains(&c.name))
        .filter(|c| options.transaction_id_column.as_ref() != Some(&c.name))
        .map(|c| quote_ident(&c.name))
        .collect();
    if !unfilled.is_empty() {
        return Err(ConfigError::new(format!(
            "the configured columns do not match table {table}: {} NOT NULL without a default \
             but not in columns, so every row would be rejected. Add {} to columns, or give \
             {} a default",
            if unfilled.len() == 1 {
                format!("{} is", unfilled[0])
            } else {
                format!("{} are", unfilled.join(", "))
            },
            if unfilled.len() == 1 { "it" } else { "them" },
            if unfilled.len() == 1 { "it" } else { "them" },
        )));
    }
    Ok(types)
}

fn check_rights(
    client: &mut Client,
    options: &PgOptions,
    table: &TableName,
    oid: u32,
    user: &str,
    secrets: &Secrets,
) -> Result<(), StartupError> {
    let mut insert_cols: Vec<String> = options.columns.clone();
    if let Some(c) = &options.transaction_id_column {
        insert_cols.push(c.clone());
    }
    let lacking = |client: &mut Client, cols: &[String], right: &str| {
        client
            .query(
                "SELECT c FROM unnest($2::text[]) AS c WHERE NOT has_column_privilege($1::oid, c, $3::text)",
                &[&oid, &cols, &right],
            )
            .map(|rows| rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>())
            .map_err(|e| StartupError::Pg(error::pg(secrets, "checking privileges", &e)))
    };
    let fail = |right: &str, cols: &[String], why: &str| {
        let quoted: Vec<String> = cols.iter().map(|c| quote_ident(c)).collect();
        StartupError::Config(ConfigError::new(format!(
            "user {user:?} lacks the {right} privilege on {table} (columns {}), which {why}. \
             Run: GRANT {right} ON {table} TO {} (or grant it on those columns)",
            quoted.join(", "),
            quote_ident(user)
        )))
    };
    let no_insert = lacking(client, &insert_cols, "INSERT")?;
    if !no_insert.is_empty() {
        return Err(fail("INSERT", &no_insert, "the sink needs to write rows"));
    }
    if let PgMode::Idempotent { key_columns } = &options.mode {
        let updated: Vec<String> = options
            .columns
            .iter()
            .filter(|c| !key_columns.contains(c))
            .cloned()
            .collect();
        let no_update = lacking(client, &updated, "UPDATE")?;
        if !no_update.is_empty() {
            return Err(fail(
                "UPDATE",
                &no_update,
                "the idempotent mode needs to overwrite rows of a replay",
            ));
        }
    }
    let delete_needed = if options.transaction_id_column.is_some() {
        Some(
            "retracting the rows of a rewound transaction needs (transaction_id_column is set). \
             Run: GRANT DELETE ON {table} TO {user}, or unset transaction_id_column",
        )
    } else if options.operation_field {
        Some(
            "the records that delete rows by key need (the operation field is set: the table \
             takes deletes). Run: GRANT DELETE ON {table} TO {user}",
        )
    } else {
        None
    };
    if let Some(why) = delete_needed {
        let can_delete: bool = client
            .query_one("SELECT has_table_privilege($1::oid, 'DELETE')", &[&oid])
            .map_err(|e| StartupError::Pg(error::pg(secrets, "checking privileges", &e)))?
            .get(0);
        if !can_delete {
            let why = why
                .replace("{table}", &table.to_string())
                .replace("{user}", &quote_ident(user));
            return Err(ConfigError::new(format!(
                "user {user:?} lacks the DELETE privilege on {table}, which {why}"
            ))
            .into());
        }
    }
    Ok(())
}

fn check_unique_key(
    client: &mut Client,
    table: &TableName,
    oid: u32,
    key_columns: &[String],
    nullable: &[&String],
    secrets: &Secrets,
) -> Result<(), StartupError> {
    // The unique indexes INSERT ... ON CONFLICT (key) infers as arbiters:
    // on columns only (no expression, no predicate), matched by their key
    // columns alone (the first indnkeyatts of indkey; INCLUDE columns
    // follow and take no part in uniqueness). The server refuses the
    // statement when any of them is deferrable, even beside one checked at
    // once, so one of those (indimmediate false) is refused here too.
    let rows = client
        .query(
            "SELECT array(SELECT a.attname::text FROM generate_series(0, i.indnkeyatts - 1) AS n \
                          JOIN pg_attribute a \
                            ON a.attrelid = i.indrelid AND a.attnum = i.indkey[n]), \
                    i.indimmediate, \
                    coalesce((SELECT '\"' || replace(c.conname, '\"', '\"\"') || '\"' FROM pg_constraint c \
                              WHERE c.conindid = i.indexrelid AND c.conrelid = i.indrelid \
                                AND c.contype IN ('p', 'u')), \
                             i.indexrelid::regclass::text), \
                    coalesce((to_jsonb(i) ->> 'indnullsnotdistinct')::boolean, false), \
                    NOT EXISTS (SELECT 1 FROM generate_series(0, i.indnkeyatts - 1) AS n \
                                JOIN pg_attribute a \
                                  ON a.attrelid = i.indrelid AND a.attnum = i.indkey[n] \
                                WHERE i.indcollation[n] <> a.attcollation \
                                  AND EXISTS (SELECT 1 FROM pg_collation c \
                                              WHERE c.oid IN (i.indcollation[n], a.attcollation) \
                                                AND NOT coalesce((to_jsonb(c) ->> \
                                                    'collisdeterministic')::boolean, true))) \
             FROM pg_index i \
             WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid \
               AND i.indpred IS NULL AND i.indexprs IS NULL",
            &[&oid],
        )
        .map_err(|e| StartupError::Pg(error::pg(secrets, "reading unique indexes", &e)))?;
    let mut wanted: Vec<&String> = key_columns.iter().collect();
    wanted.sort();
    let on_key = |r: &&postgres::Row| {
        let mut cols: Vec<String> = r.get(0);
        cols.sort();
        cols.iter().collect::<Vec<_>>() == wanted
    };
    let matching: Vec<&postgres::Row> = rows.iter().filter(on_key).collect();
    let keys: Vec<String> = key_columns.iter().map(|k| quote_ident(k)).collect();
    let keys = keys.join(", ");
    if let Some(deferrable) = matching.iter().find(|r| !r.get::<_, bool>(1)) {
        // Quoted by the server already (a regclass is schema-qualified
        // where the search path needs it).
        let name: String = deferrable.get(2);
        return Err(ConfigError::new(format!(
            "the unique constraint {name} of {table} on ({keys}) is DEFERRABLE, and INSERT ... \
             ON CONFLICT ({keys}) refuses to run while a deferrable constraint matches its \
             key (\"ON CONFLICT does not support deferrable unique constraints\"), so every \
             replayed key would fail. Make it checked at once: ALTER TABLE {table} DROP \
             CONSTRAINT {name}, ADD CONSTRAINT {name} UNIQUE ({keys}) (or PRIMARY KEY)"
        ))
        .into());
    }
    // The staging table takes each column's own collation (see
    // `read_columns`), and a batch's keys are de-duplicated and matched
    // under it. An arbiter index that compares the key under another
    // collation, when either is non-deterministic (equality is not byte
    // equality), would take two of those keys as one (the upsert then
    // meets a row twice, a failure every replay repeats) or one as two
    // (a row folded away): refused (found by review). Deterministic ones
    // agree on equality whatever their order (a "C" index on a default
    // column is a common choice).
    if let Some(other) = matching.iter().find(|r| !r.get::<_, bool>(4)) {
        let name: String = other.get(2);
        return Err(ConfigError::new(format!(
            "the unique index {name} of {table} compares its key ({keys}) under another \
             collation than the columns' own, and the idempotent mode matches a batch's keys \
             under the columns' collation: keys the index takes as one would be two here, or \
             the reverse. Give the index the columns' collations (recreate it without COLLATE), \
             or give the columns the index's (ALTER TABLE {table} ALTER COLUMN ... TYPE ... \
             COLLATE ...)"
        ))
        .into());
    }
    // A unique index counts NULLs as distinct from each other unless it
    // says NULLS NOT DISTINCT (PostgreSQL 15+; the column is read through
    // to_jsonb so that older servers answer false): a row whose key is NULL
    // then never conflicts, so its replay is inserted again, and a batch's
    // rows with NULL keys are folded into one (found by review).
    if !nullable.is_empty() && !matching.is_empty() && !matching.iter().any(|r| r.get::<_, bool>(3))
    {
        let cols: Vec<String> = nullable.iter().map(|c| quote_ident(c)).collect();
        let cols = cols.join(", ");
        return Err(ConfigError::new(format!(
            "the key of the idempotent mode, ({keys}) of {table}, may be NULL ({cols} without \
             NOT NULL), and its unique index treats NULLs as distinct: a record with a NULL key \
             would be written again by every replay, so it cannot be de-duplicated. Make the key \
             columns NOT NULL (ALTER TABLE {table} ALTER COLUMN ... SET NOT NULL), or on \
             PostgreSQL 15 or later make the unique index NULLS NOT DISTINCT"
        ))
        .into());
    }
    if matching.is_empty() {
        return Err(ConfigError::new(format!(
            "table {table} has no primary key or unique index on exactly ({keys}) (columns \
             listed with INCLUDE do not count: they are not part of the key); INSERT ... ON \
             CONFLICT needs one to recognise a replayed row. Create it (ALTER TABLE {table} ADD \
             PRIMARY KEY ({keys})) or fix key_columns"
        ))
        .into());
    }
    Ok(())
}

fn ensure_control_tables(
    client: &mut Client,
    control: &ControlTables,
    user: &str,
    secrets: &Secrets,
) -> Result<(), StartupError> {
    let pg =
        |op: &'static str| move |e: postgres::Error| StartupError::Pg(error::pg(secrets, op, &e));
    let tables = control.all();
    let missing = |client: &mut Client| -> Result<Vec<String>, StartupError> {
        let mut out = Vec::new();
        for t in tables {
            let exists: bool = client
                .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[t])
                .map_err(pg("looking up control tables"))?
                .get(0);
            if !exists {
                out.push(t.clone());
            }
        }
        Ok(out)
    };
    if !missing(client)?.is_empty() {
        // CREATE TABLE IF NOT EXISTS checks the schema's CREATE privilege
        // even when the table exists, so check first and say what to do.
        let row = client
            .query_opt(
                "SELECT has_schema_privilege(n.oid, 'CREATE') FROM pg_namespace n \
                 WHERE n.nspname = $1",
                &[&control.schema],
            )
            .map_err(pg("checking the control schema"))?;
        match row.map(|r| r.get::<_, bool>(0)) {
            None => {
                return Err(ConfigError::new(format!(
                    "control_schema {} does not exist; create it (CREATE SCHEMA {}) or set \
                     control_schema to an existing schema",
                    quote_ident(&control.schema),
                    quote_ident(&control.schema)
                ))
                .into())
            }
            Some(false) => {
                return Err(ConfigError::new(format!(
                    "the sink's control tables are missing in schema {} and user {user:?} may \
                     not create tables there. Either GRANT CREATE ON SCHEMA {} TO {}, or have \
                     an administrator run:\n{}and grant {user:?} SELECT, INSERT, UPDATE, DELETE \
                     on them",
                    quote_ident(&control.schema),
                    quote_ident(&control.schema),
                    quote_ident(user),
                    control.ddl()
                ))
                .into())
            }
            Some(true) => {}
        }
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({DDL_LOCK_KEY}); {} COMMIT;",
                control.ddl()
            ))
            .map_err(|e| {
                let _ = client.batch_execute("ROLLBACK");
                StartupError::Pg(error::pg(secrets, "creating the control tables", &e))
            })?;
        log::info!(
            "created twopc control tables in schema {}",
            quote_ident(&control.schema)
        );
    }
    // The tables of lost-transaction notes, of the operations log, of the
    // history segments and of the sinks' recorded configuration came later:
    // created when the user may, else left out (the sink works without
    // them).
    let later = [
        &control.lost,
        &control.operations,
        &control.segments,
        &control.sinks,
    ];
    let later_missing: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM unnest($1::text[]) AS t WHERE to_regclass(t) IS NULL) \
               AND has_schema_privilege($2::text, 'CREATE')",
            &[&later.map(String::as_str).to_vec(), &control.schema],
        )
        .map_err(pg("looking up the later control tables"))?
        .get(0);
    if later_missing {
        let statements: Vec<String> = later.iter().map(|t| control.create_statements(t)).collect();
        client
            .batch_execute(&serialised_ddl(&statements.join("\n")))
            .map_err(|e| {
                let _ = client.batch_execute("ROLLBACK");
                StartupError::Pg(error::pg(
                    secrets,
                    "creating the lost-transaction, operations-log, history-segment and sink \
                     tables",
                    &e,
                ))
            })?;
    }
    // The segments' table, when there, is read by every rewind check, so a
    // missing right shows here rather than at the first restore.
    let segments_exist: bool = client
        .query_one(
            "SELECT to_regclass($1::text) IS NOT NULL",
            &[&control.segments],
        )
        .map_err(pg("looking up the history segments' table"))?
        .get(0);
    let checked: Vec<&String> = tables
        .into_iter()
        .chain(segments_exist.then_some(&control.segments))
        .collect();
    for t in checked {
        let row = client
            .query_one(
                "SELECT has_table_privilege($1::text, 'SELECT'), \
                        has_table_privilege($1::text, 'INSERT'), \
                        has_table_privilege($1::text, 'UPDATE'), \
                        has_table_privilege($1::text, 'DELETE')",
                &[t],
            )
            .map_err(pg("checking privileges on control tables"))?;
        let lacking: Vec<&str> = ["SELECT", "INSERT", "UPDATE", "DELETE"]
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !row.get::<_, bool>(*i))
            .map(|(_, r)| r)
            .collect();
        if !lacking.is_empty() {
            return Err(ConfigError::new(format!(
                "user {user:?} lacks {} on the control table {t}; the sink records prepared \
                 handles and commits there. Run: GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {}",
                lacking.join(", "),
                quote_ident(user)
            ))
            .into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operations_log_can_be_created_alone_and_is_in_the_full_ddl() {
        let t = ControlTables::new("ops schema");
        let create = t.operations_create();
        assert!(
            create.starts_with("CREATE TABLE IF NOT EXISTS \"ops schema\".\"twopc_operations\" ("),
            "{create}"
        );
        assert!(create.ends_with(");"), "{create}");
        assert!(create.contains("record text NOT NULL"), "{create}");
        assert!(t.ddl().contains(&create));
        let ddl = t.operations_ddl();
        assert!(
            ddl.starts_with("BEGIN; SELECT pg_advisory_xact_lock("),
            "{ddl}"
        );
        assert!(ddl.ends_with(" COMMIT;"), "{ddl}");
        // The statements of one table only.
        assert!(!create.contains("twopc_commit_segments"), "{create}");
    }

    #[test]
    fn the_sinks_table_is_in_the_full_ddl_and_can_be_created_alone() {
        let t = ControlTables::new("ops schema");
        let create = t.create_statements(&t.sinks);
        assert!(
            create.starts_with("CREATE TABLE IF NOT EXISTS \"ops schema\".\"twopc_sinks\" ("),
            "{create}"
        );
        for column in [
            "sink_id text PRIMARY KEY",
            "table_schema text NOT NULL",
            "table_name text NOT NULL",
            "transaction_id_column text,",
            "control_schema text NOT NULL",
            "recorded_at timestamptz NOT NULL",
        ] {
            assert!(create.contains(column), "{column} missing in {create}");
        }
        assert_eq!(create.matches("CREATE TABLE").count(), 1, "{create}");
        assert!(create.ends_with(");"), "{create}");
        // The segments' statements end where it begins.
        assert!(!t.segments_create().contains("twopc_sinks"));
    }

    #[test]
    fn the_history_segments_can_be_created_alone_with_their_indexes() {
        let t = ControlTables::new("ops schema");
        let create = t.segments_create();
        assert!(
            create.starts_with(
                "CREATE TABLE IF NOT EXISTS \"ops schema\".\"twopc_commit_segments\" ("
            ),
            "{create}"
        );
        for column in [
            "sink_id text NOT NULL",
            "lineage bigint NOT NULL",
            "run_id text NOT NULL",
            "first_checkpoint bigint NOT NULL",
            "last_checkpoint bigint NOT NULL",
            "transactions bigint NOT NULL",
            "row_count bigint NOT NULL",
            "segment bytea NOT NULL",
            "created_at timestamptz NOT NULL",
        ] {
            assert!(create.contains(column), "{column} missing in {create}");
        }
        // Both lookups (a checkpoint's segment; segments after one) have an
        // index, and nothing of another table comes along.
        assert!(
            create.contains(
                "ON \"ops schema\".\"twopc_commit_segments\" (sink_id, lineage, last_checkpoint);"
            ),
            "{create}"
        );
        assert!(
            create.contains(
                "ON \"ops schema\".\"twopc_commit_segments\" (sink_id, lineage, first_checkpoint);"
            ),
            "{create}"
        );
        assert_eq!(create.matches("CREATE TABLE").count(), 1, "{create}");
        assert!(create.ends_with(");"), "{create}");
        assert!(t.ddl().contains(&create));
        let ddl = t.segments_ddl();
        assert!(
            ddl.starts_with("BEGIN; SELECT pg_advisory_xact_lock("),
            "{ddl}"
        );
        assert!(ddl.contains(&create) && ddl.ends_with(" COMMIT;"), "{ddl}");
        // The commit records' own index stays with them.
        let records = t.create_statements(&t.commit_records);
        assert!(
            records.contains("twopc_commit_records_by_lineage"),
            "{records}"
        );
        assert!(!records.contains("twopc_prepared"), "{records}");
    }
}
