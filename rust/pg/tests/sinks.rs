//! What a transactional sink records of its configuration at start-up
//! (`twopc_sinks`), for `twopc reconcile`: its target table as the server
//! resolved it, its transaction-id column and control schema; updated when
//! the configuration changes; never written by the operator's connection;
//! and a sink whose user may not create the table runs without it.

#[macro_use]
mod common;

use common::*;
use twopc_core::config::{FreshStartPolicy, SinkOptions};
use twopc_core::destination::{AbortStatus, CommitStatus, Destination};
use twopc_core::error::DestinationErrorKind;
use twopc_core::SinkId;
use twopc_pg::{PgDestination, PgMode, SinkRecord};

type Row = (String, String, Option<String>, String, i64);

/// The sink's row, as stored: schema, table, column, control schema and
/// the time in microseconds.
fn row(f: &mut Fixture, control_schema: &str) -> Option<Row> {
    f.admin
        .query_opt(
            &format!(
                "SELECT table_schema, table_name, transaction_id_column, control_schema, \
                        (extract(epoch FROM recorded_at) * 1000000)::int8 \
                 FROM {control_schema}.twopc_sinks WHERE sink_id = $1"
            ),
            &[&f.sink],
        )
        .unwrap()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
}

/// The control tables and `table`, quoted and comma-separated, for GRANTs
/// on this test's tables only, never on other tests' tables (which they may
/// be altering or dropping meanwhile).
fn tables_of(admin: &mut postgres::Client, table: &str) -> String {
    let tables: Vec<String> = admin
        .query(
            "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public' \
               AND (tablename LIKE 'twopc\\_%' OR tablename = $1)",
            &[&table],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    tables.join(", ")
}

#[test]
fn a_transactional_sink_records_its_resolved_table_and_updates_it_when_it_changes() {
    let url = server!();
    let mut f = Fixture::with_columns(&url, "sinks_rec", "id bigint NOT NULL, body text, txn text");
    f.opts.transaction_id_column = Some("txn".into());
    // Configured unqualified: recorded as the server resolved it.
    assert!(!f.opts.table.contains('.'));
    let mut s = f.open("run1");
    committed(&mut s, &rows(0..2, "a"), 1);
    let (schema, table, column, control, at) = row(&mut f, "public").expect("recorded");
    assert_eq!(
        (
            schema.as_str(),
            table.as_str(),
            column.as_deref(),
            control.as_str()
        ),
        ("public", f.table.as_str(), Some("txn"), "public")
    );
    let read = s.destination().sink_record().unwrap().unwrap();
    assert_eq!(
        read,
        SinkRecord {
            table_schema: "public".into(),
            table_name: f.table.clone(),
            transaction_id_column: Some("txn".into()),
            control_schema: "public".into(),
            recorded_at_ms: read.recorded_at_ms,
        }
    );
    assert_eq!(read.table(), format!("public.{}", f.table));
    // Milliseconds, rounded.
    assert!(
        (read.recorded_at_ms as i64 - at / 1000).abs() <= 1,
        "{read:?} at {at}"
    );
    drop(s);

    // The same configuration again (another subtask, a restart): the row
    // and its time stay.
    drop(f.destination("run2"));
    assert_eq!(
        row(&mut f, "public"),
        Some((schema, table, column, control, at))
    );

    // The configuration changed: the row follows, with the time of the
    // change.
    f.opts.transaction_id_column = None;
    f.opts.table = format!("public.{}", f.table);
    drop(f.destination("run3"));
    let (_, _, column, _, changed_at) = row(&mut f, "public").unwrap();
    assert_eq!(column, None);
    assert!(changed_at > at, "{changed_at} after {at}");

    // The operator's connection reads it and never writes it.
    f.admin
        .execute(
            "DELETE FROM public.twopc_sinks WHERE sink_id = $1",
            &[&f.sink],
        )
        .unwrap();
    let mut operator =
        PgDestination::connect_operator(f.opts.clone(), &SinkId::new(f.sink.as_str()).unwrap())
            .unwrap();
    assert_eq!(operator.sink_record().unwrap(), None);
    assert_eq!(row(&mut f, "public"), None);
}

#[test]
fn an_idempotent_sink_records_nothing() {
    let url = server!();
    let mut f = Fixture::with_columns(&url, "sinks_idem", "id bigint PRIMARY KEY, body text");
    f.opts.mode = PgMode::Idempotent {
        key_columns: vec!["id".into()],
    };
    drop(f.destination("run1"));
    assert_eq!(row(&mut f, "public"), None);
}

#[test]
fn a_user_who_may_not_create_the_sinks_table_runs_the_sink_with_a_warning() {
    capture_logs();
    let url = server!();
    let mut f = Fixture::with_columns(
        &url,
        "sinks_nocreate",
        "id bigint NOT NULL, body text, txn text",
    );
    let schema = unique("ctl");
    let role = unique("nosinks");
    let pw = "nosinks-pw-93c1";
    f.opts.control_schema = schema.clone();
    f.admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .unwrap();
    // Control tables of a release before twopc_sinks, and a sink user who
    // may not create tables.
    drop(f.destination("run1"));
    let table = f.table.clone();
    f.admin
        .batch_execute(&format!(
            "DROP TABLE {schema}.twopc_sinks; \
             CREATE ROLE {role} LOGIN PASSWORD '{pw}'; \
             GRANT USAGE ON SCHEMA {schema} TO {role}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}; \
             GRANT SELECT, INSERT, DELETE ON {table} TO {role}"
        ))
        .unwrap();
    let cleanup = |f: &mut Fixture| {
        for sql in [
            format!("DROP SCHEMA {schema} CASCADE"),
            format!("REVOKE ALL ON {} FROM {role}", f.table),
            format!("DROP ROLE {role}"),
        ] {
            if let Err(e) = f.admin.batch_execute(&sql) {
                eprintln!("cleanup: {sql}: {e}");
            }
        }
    };
    let mut opts = options_as(&url, &role, pw, table.clone(), &["id", "body"]);
    opts.control_schema = schema.clone();
    opts.transaction_id_column = Some("txn".into());
    let result = || {
        let mut s = open(&opts, f.ctx("run2"), sink_options(), None).unwrap();
        committed(&mut s, &rows(0..3, "n"), 1);
        assert_eq!(f.count(), 3, "the sink runs");
        let warned = logged(&format!(
            "sink '{}' could not record its target table",
            f.sink
        ));
        assert_eq!(warned.len(), 1, "{warned:?}");
        for needle in [
            "WARN",
            "twopc_sinks",
            &format!("--table public.{table} --transaction-id-column txn"),
            "CREATE TABLE IF NOT EXISTS",
        ] {
            assert!(
                warned[0].contains(needle),
                "{needle:?} missing: {}",
                warned[0]
            );
        }
        assert_eq!(s.destination().sink_record().unwrap(), None);
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(result));
    cleanup(&mut f);
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

/// A finish of another role's transaction is refused (42501), and its
/// owner finishes it before the refusal is looked into: the answer is what
/// PostgreSQL's state then says, not "refused". A commit finds its commit
/// record (committed earlier), an abort finds none (not found), an expiry
/// has nothing left to do and leaves no expiry record. Before, each was
/// reported as refused, naming a role that no longer held anything, and
/// the job stopped.
#[test]
fn a_refused_finish_whose_owner_finished_it_meanwhile_is_not_reported_refused() {
    let url = server!();
    let mut f = Fixture::with_columns(&url, "owner_race", "id bigint NOT NULL, body text");
    let role = unique("racer");
    let pw = "racer-pw-17b9";
    let mut s = f.open("run1");
    let committed = prepared(&mut s, &rows(0..2, "c"), 1);
    let aborted = prepared(&mut s, &rows(2..4, "a"), 2);
    let expired = prepared(&mut s, &rows(4..6, "e"), 3);
    drop(s);
    let table = f.table.clone();
    let on = tables_of(&mut f.admin, &table);
    grant_serialized(
        &mut f.admin,
        &format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{pw}'; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON {on} TO {role}"
        ),
    );
    let opts = options_as(&url, &role, pw, table.clone(), &["id", "body"]);
    // The owner's session finishes `gid` with `verb` when the hook runs.
    let owner_finishes = |verb: &'static str, gid: String| {
        let mut owner = admin(&url);
        move || {
            owner
                .batch_execute(&format!("{verb} PREPARED '{gid}'"))
                .unwrap()
        }
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut other = PgDestination::connect(opts.clone(), &f.ctx("run2")).unwrap();
        other.after_next_refusal(owner_finishes(
            "COMMIT",
            committed.transaction.as_str().to_string(),
        ));
        assert_eq!(
            other.commit(&committed, 0).unwrap(),
            CommitStatus::AlreadyCommitted
        );
        other.after_next_refusal(owner_finishes(
            "ROLLBACK",
            aborted.transaction.as_str().to_string(),
        ));
        assert_eq!(
            other.abort(&aborted.transaction).unwrap(),
            AbortStatus::NotFound
        );
        other.after_next_refusal(owner_finishes(
            "ROLLBACK",
            expired.transaction.as_str().to_string(),
        ));
        other.expire(&expired.transaction, 1).unwrap();
        let tombstones: i64 = f
            .admin
            .query_one(
                "SELECT count(*) FROM public.twopc_expired WHERE transaction_id = $1",
                &[&expired.transaction.as_str()],
            )
            .unwrap()
            .get(0);
        assert_eq!(tombstones, 0, "an expiry that did not happen left a record");
        assert!(prepared_gids(&mut f.admin, &f.sink).is_empty());
        let ids: Vec<i64> = f
            .admin
            .query(&format!("SELECT id FROM {table} ORDER BY id"), &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(ids, vec![0, 1], "only the committed transaction's rows");
    }));
    rollback_all(&mut f.admin, &f.sink.clone());
    for sql in [
        format!("REVOKE ALL ON {on} FROM {role}"),
        format!("DROP ROLE {role}"),
    ] {
        let _ = grants_serialized(&mut f.admin, &sql);
    }
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// A transaction of this sink prepared by another role (the job's
/// credentials changed, or an operator's tool connects as someone else) is
/// listed all the same, with a warning naming its owner: before, the list
/// was filtered by the connection's role, so a fresh start's check, the
/// recovery and `twopc decide` saw nothing ("nothing staged") while the
/// transaction stayed prepared and held its locks. Finishing it is left to
/// PostgreSQL's rule (that role or a superuser), and refused loudly.
#[test]
fn a_transaction_another_role_prepared_is_listed_and_not_taken_for_absent() {
    capture_logs();
    let url = server!();
    let mut f = Fixture::with_columns(&url, "owner", "id bigint NOT NULL, body text");
    let role = unique("other");
    let pw = "other-pw-5d2e";
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..2, "p"), 1);
    drop(s);
    let table = f.table.clone();
    let on = tables_of(&mut f.admin, &table);
    grant_serialized(
        &mut f.admin,
        &format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{pw}'; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON {on} TO {role}"
        ),
    );
    let cleanup = |f: &mut Fixture| {
        for sql in [
            format!("REVOKE ALL ON {on} FROM {role}"),
            format!("DROP ROLE {role}"),
        ] {
            if let Err(e) = grants_serialized(&mut f.admin, &sql) {
                eprintln!("cleanup: {sql}: {e}");
            }
        }
    };
    let opts = options_as(&url, &role, pw, table.clone(), &["id", "body"]);
    let result = || {
        let mut other = PgDestination::connect(opts.clone(), &f.ctx("run2")).unwrap();
        let staged = other.staged().unwrap();
        assert!(
            staged
                .iter()
                .any(|t| t.transaction == h.transaction && t.is_prepared()),
            "{staged:?}"
        );
        let warned = logged(&format!(
            "{} of sink '{}' was prepared by role",
            h.transaction, f.sink
        ));
        assert!(!warned.is_empty(), "no warning naming the owner");
        let owner = owner_of(&mut f.admin, h.transaction.as_str());
        assert!(warned[0].contains(&format!("{owner:?}")), "{}", warned[0]);
        let err = other.abort(&h.transaction).unwrap_err();
        assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
        // An expiry refused the same way leaves no expiry record behind:
        // should the owner roll it back, a commit must not read as expired.
        let err = other.expire(&h.transaction, 1).unwrap_err();
        assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
        let tombstones: i64 = f
            .admin
            .query_one(
                "SELECT count(*) FROM public.twopc_expired WHERE transaction_id = $1",
                &[&h.transaction.as_str()],
            )
            .unwrap()
            .get(0);
        assert_eq!(tombstones, 0, "the refused expiry's record was removed");
        let owner = owner_of(&mut f.admin, h.transaction.as_str());
        for needle in ["42501", &format!("prepared by role {owner:?}"), "superuser"] {
            assert!(
                err.to_string().contains(needle),
                "{needle:?} missing: {err}"
            );
        }
        drop(other);
        // A fresh start that would abort it stops at once, fatally, naming
        // the role, instead of failing the same way at every restart.
        let abort_prepared = SinkOptions {
            fresh_start: FreshStartPolicy::AbortPrepared,
            ..sink_options()
        };
        let Err(err) = open(&opts, f.ctx("run3"), abort_prepared, None) else {
            panic!("a fresh start that must abort another role's transaction started");
        };
        assert!(err.is_fatal(), "{err}");
        assert!(err.to_string().contains(&owner), "{err}");
        assert_eq!(
            prepared_gids(&mut f.admin, &f.sink),
            vec![h.transaction.as_str().to_string()],
            "still prepared"
        );
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(result));
    rollback_all(&mut f.admin, &f.sink.clone());
    cleanup(&mut f);
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

/// A transaction whose role was dropped after it prepared it (PostgreSQL
/// allows that; `pg_prepared_xacts.owner` reads NULL then) is listed, and
/// finishing it as an ordinary role is refused naming the way out (a
/// superuser), without a panic on the NULL owner in the listing or the
/// refusal.
#[test]
fn a_transaction_whose_role_was_dropped_is_listed_and_named() {
    capture_logs();
    let url = server!();
    let mut f = Fixture::with_columns(&url, "dropped_owner", "id bigint NOT NULL, body text");
    // The sink's control tables exist before the short-lived role writes.
    drop(f.open("run0"));
    let (gone, other) = (unique("gone"), unique("stays"));
    let pw = "dropped-owner-pw-81c3";
    let mut admin = admin(&url);
    admin.batch_execute("SET lock_timeout = '20s'").unwrap();
    let on = tables_of(&mut admin, &f.table);
    let grant = |role: &str| {
        format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{pw}'; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON {on} TO {role}"
        )
    };
    grant_serialized(&mut admin, &grant(&gone));
    grant_serialized(&mut admin, &grant(&other));
    let table = f.table.clone();
    let sink = f.sink.clone();
    let result = || {
        let as_gone = options_as(&url, &gone, pw, table.clone(), &["id", "body"]);
        let mut s = open(&as_gone, f.ctx("run1"), sink_options(), None).unwrap();
        let h = prepared(&mut s, &rows(0..2, "d"), 1);
        drop(s);
        grant_serialized(
            &mut f.admin,
            &format!("REVOKE ALL ON {on} FROM {gone}; DROP ROLE {gone}"),
        );
        let owner: Option<String> = f
            .admin
            .query_one(
                "SELECT owner::text FROM pg_prepared_xacts WHERE gid = $1",
                &[&h.transaction.as_str()],
            )
            .unwrap()
            .get(0);
        assert_eq!(owner, None, "PostgreSQL reads the dropped role as NULL");

        let as_other = options_as(&url, &other, pw, table.clone(), &["id", "body"]);
        let mut d = PgDestination::connect(as_other, &f.ctx("run2")).unwrap();
        let staged = d.staged().unwrap();
        assert!(
            staged
                .iter()
                .any(|t| t.transaction == h.transaction && t.is_prepared()),
            "{staged:?}"
        );
        let warned = logged(&format!("{} of sink '{}'", h.transaction, sink));
        assert!(
            warned.iter().any(|w| w.contains("since dropped")),
            "{warned:?}"
        );
        let err = d.abort(&h.transaction).unwrap_err();
        assert_eq!(err.kind, DestinationErrorKind::NotPermitted, "{err}");
        assert!(err.to_string().contains("dropped since"), "{err}");
        assert!(err.to_string().contains("superuser"), "{err}");
        assert_eq!(
            prepared_gids(&mut f.admin, &sink).len(),
            1,
            "still prepared"
        );
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(result));
    rollback_all(&mut admin, &sink);
    for sql in [
        format!("REVOKE ALL ON {on} FROM {other}"),
        format!("DROP ROLE {other}"),
        format!("REVOKE ALL ON {on} FROM {gone}"),
        format!("DROP ROLE IF EXISTS {gone}"),
    ] {
        let _ = grants_serialized(&mut admin, &sql);
    }
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

/// A role (or database) whose default isolation level is REPEATABLE READ
/// or SERIALIZABLE: the writer's transaction still runs at READ COMMITTED,
/// so at prepare it sees the handle row the control session committed
/// after its first statement. Before, every prepare failed saying the row
/// had vanished, and no checkpoint ever committed (found by review).
#[test]
fn a_stricter_default_isolation_level_does_not_fail_every_prepare() {
    let url = server!();
    let mut f = Fixture::with_columns(&url, "isolation", "id bigint NOT NULL, body text");
    // The sink's control tables exist before the role writes.
    drop(f.open("run0"));
    let pw = "isolation-pw-4e1a";
    let on = tables_of(&mut f.admin, &f.table);
    let mut roles = Vec::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for (i, level) in ["repeatable read", "serializable"].into_iter().enumerate() {
            let role = unique("strict");
            roles.push(role.clone());
            grant_serialized(
                &mut f.admin,
                &format!(
                    "CREATE ROLE {role} LOGIN PASSWORD '{pw}'; \
                     ALTER ROLE {role} SET default_transaction_isolation = '{level}'; \
                     GRANT SELECT, INSERT, UPDATE, DELETE ON {on} TO {role}"
                ),
            );
            let opts = options_as(&url, &role, pw, f.table.clone(), &["id", "body"]);
            let run = format!("run{}", i + 1);
            // The second run starts next to the first one's output.
            let append = SinkOptions {
                fresh_start: FreshStartPolicy::Append,
                ..sink_options()
            };
            let mut s = open(&opts, f.ctx(&run), append, None).unwrap();
            let first = i as i64 * 10;
            committed(&mut s, &rows(first..first + 3, level), 1);
        }
        assert_eq!(
            count(&mut f.admin, &f.table),
            6,
            "{level_rows:?}",
            level_rows = visible(&mut f.admin, &f.table)
        );
    }));
    rollback_all(&mut f.admin, &f.sink.clone());
    for role in &roles {
        for sql in [
            format!("REVOKE ALL ON {on} FROM {role}"),
            format!("DROP ROLE {role}"),
        ] {
            let _ = grants_serialized(&mut f.admin, &sql);
        }
    }
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// The role that prepared `gid`, as PostgreSQL records it.
fn owner_of(admin: &mut postgres::Client, gid: &str) -> String {
    admin
        .query_one(
            "SELECT owner::text FROM pg_prepared_xacts WHERE gid = $1",
            &[&gid],
        )
        .unwrap()
        .get(0)
}
