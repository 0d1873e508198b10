//! Start-up checks against real servers: each setting that cannot work is
//! rejected by `PgDestination::connect` with a message that says what to
//! change, and the password never shows.

#[macro_use]
mod common;

use common::*;
use std::ops::Not;
use twopc_core::destination::Destination;
use twopc_core::TwopcError;

use twopc_pg::{Endpoint, Password, PgDestination, PgMode, PgOptions};

/// `opts` with the declared (Flink) types of its columns.
fn declaring(opts: &PgOptions, types: &[&str]) -> PgOptions {
    let mut o = opts.clone();
    o.declared_types = types.iter().map(|t| t.to_string()).collect();
    o
}

fn config_error(opts: &PgOptions, parallelism: u32) -> String {
    let sink = unique("startup");
    match PgDestination::connect(opts.clone(), &ctx(&sink, "run1", 0, parallelism)) {
        Ok(d) => panic!("connect must fail, got {d:?}"),
        Err(TwopcError::Config(e)) => e.to_string(),
        Err(e) => panic!("expected a configuration error, got: {e}"),
    }
}

#[test]
fn max_prepared_transactions_zero_is_rejected() {
    let url = server!("TWOPC_PG_URL_NO_2PC");
    let mut f = Fixture::new(&url, "no2pc");
    let msg = config_error(&f.opts, 2);
    for needle in [
        "max_prepared_transactions is 0",
        "PREPARE TRANSACTION is disabled",
        "set max_prepared_transactions >= 2",
        "postgresql.conf and restart the server",
    ] {
        assert!(msg.contains(needle), "missing {needle:?} in: {msg}");
    }
    // The idempotent mode needs no prepared transactions.
    f.admin
        .batch_execute(&format!("ALTER TABLE {} ADD PRIMARY KEY (id)", f.table))
        .unwrap();
    let mut opts = f.opts.clone();
    opts.mode = PgMode::Idempotent {
        key_columns: vec!["id".into()],
    };
    PgDestination::connect(opts, &ctx(&unique("idem"), "run1", 0, 2)).unwrap();
}

#[test]
fn max_prepared_transactions_below_the_parallelism_is_rejected() {
    let url = server!();
    let f = Fixture::new(&url, "par");
    let msg = config_error(&f.opts, 1000);
    assert!(
        msg.contains("at most 64 transactions") && msg.contains(">= 1000"),
        "{msg}"
    );
}

#[test]
fn missing_table_is_rejected() {
    let url = server!();
    let msg = config_error(&options(&url, "public.no_such_table_xyz"), 1);
    assert!(
        msg.contains("\"public\".\"no_such_table_xyz\" does not exist"),
        "{msg}"
    );
    assert!(msg.contains("case-sensitive"), "{msg}");
}

#[test]
fn wrong_columns_are_rejected() {
    let url = server!();
    let columns = format!("{ID_BODY}, extra int NOT NULL");
    let f = Fixture::with_columns(&url, "cols", &columns);

    let mut opts = f.opts.clone();
    opts.columns = vec!["id".into(), "Body".into()];
    let msg = config_error(&opts, 1);
    assert!(msg.contains("has no column \"Body\""), "{msg}");
    assert!(msg.contains("\"id\", \"body\", \"extra\""), "{msg}");

    // NOT NULL without a default and not written: every row would fail.
    let msg = config_error(&f.opts, 1);
    assert!(
        msg.contains("\"extra\" is NOT NULL without a default"),
        "{msg}"
    );

    // Idempotent mode without a unique index on the key.
    let mut opts = f.opts.clone();
    opts.columns.push("extra".into());
    opts.mode = PgMode::Idempotent {
        key_columns: vec!["id".into()],
    };
    let msg = config_error(&opts, 1);
    assert!(
        msg.contains("no primary key or unique index on exactly (\"id\")"),
        "{msg}"
    );
}

#[test]
fn a_user_without_insert_rights_is_rejected() {
    let url = server!();
    let mut f = Fixture::new(&url, "rights");
    let table = &f.table;
    let role = unique("reader");
    let pw = "reader-pw-5d1e";
    f.admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{pw}'; GRANT SELECT ON {table} TO {role}"
        ))
        .unwrap();
    let opts = options_as(&url, &role, pw, format!("public.{table}"), &["id", "body"]);
    let msg = config_error(&opts, 1);
    let _ = f.admin.batch_execute(&format!(
        "REVOKE ALL ON {table} FROM {role}; DROP ROLE {role}"
    ));
    assert!(msg.contains("lacks the INSERT privilege"), "{msg}");
    assert!(
        msg.contains(&format!("GRANT INSERT ON \"public\".\"{table}\"")),
        "{msg}"
    );
    assert!(!msg.contains(pw), "{msg}");
}

#[test]
fn the_password_appears_in_no_error_and_no_debug_output() {
    let url = server!();
    let f = Fixture::new(&url, "pw");

    // A wrong password: rejected as configuration, password masked.
    let wrong = "wrong-pw-9c7f2";
    let mut opts = f.opts.clone();
    opts.password = Some(Password::new(wrong));
    let msg = config_error(&opts, 1);
    assert!(msg.contains("password authentication failed"), "{msg}");
    assert!(!msg.contains(wrong), "{msg}");
    assert!(!format!("{opts:?}").contains(wrong));

    // The right password, given on its own: never in Debug of the options
    // or of the connected destination.
    let right = postgres::Config::from_str_url(&url);
    let opts = f.opts.clone();
    let dest = PgDestination::connect(opts.clone(), &ctx(&unique("pw"), "run1", 0, 1)).unwrap();
    for text in [format!("{opts:?}"), format!("{dest:?}")] {
        assert!(!text.contains(&right), "password shown in {text}");
        assert!(text.contains("***"), "{text}");
    }

    // The same password inside the URL, where it would work: refused before
    // connecting, as configuration, saying where the password goes instead.
    let mut in_url = f.opts.clone();
    in_url.endpoint = Endpoint::Url(url.clone());
    in_url.password = None;
    let err =
        PgDestination::connect(in_url.clone(), &ctx(&unique("pw"), "run1", 0, 1)).unwrap_err();
    assert!(matches!(err, TwopcError::Config(_)), "{err}");
    for text in [err.to_string(), format!("{err:?}"), format!("{in_url:?}")] {
        assert!(!text.contains(&right), "password shown in {text}");
    }
    assert!(err.to_string().contains("passwordFromEnvironment"), "{err}");

    // A URL whose host does not answer: the error (retryable) names no
    // password either.
    let mut opts = options(
        &url.replace(&format!(":{}/", port_of(&url)), ":1/"),
        &f.table,
    );
    opts.connect_timeout = std::time::Duration::from_secs(2);
    let err = PgDestination::connect(opts, &ctx(&unique("pw"), "run1", 0, 1)).unwrap_err();
    assert!(matches!(err, TwopcError::Scan { .. }), "{err}");
    assert!(!err.to_string().contains(&right), "{err}");
}

#[test]
fn missing_control_schema_is_rejected() {
    let url = server!();
    let mut f = Fixture::new(&url, "ctl");
    f.opts.control_schema = "no_such_schema_xyz".into();
    let msg = config_error(&f.opts, 1);
    assert!(
        msg.contains("control_schema \"no_such_schema_xyz\" does not exist"),
        "{msg}"
    );
}

/// The password of a URL, for the checks above.
trait UrlPassword {
    fn from_str_url(url: &str) -> String;
}

impl UrlPassword for postgres::Config {
    fn from_str_url(url: &str) -> String {
        let c: postgres::Config = url.parse().unwrap();
        String::from_utf8(
            c.get_password()
                .expect("the test URL has a password")
                .to_vec(),
        )
        .unwrap()
    }
}

#[test]
fn idempotent_keys_need_a_unique_index_checked_at_once_on_exactly_their_columns() {
    let url = server!();
    let idempotent = |f: &Fixture, keys: &[&str]| {
        let mut opts = f.opts.clone();
        opts.columns = vec!["k".into(), "v".into()];
        opts.mode = PgMode::Idempotent {
            key_columns: keys.iter().map(|k| k.to_string()).collect(),
        };
        opts
    };

    // UNIQUE (k) INCLUDE (v) makes k unique, not (k, v): ON CONFLICT (k, v)
    // cannot use it. Before the fix its INCLUDE column counted as a key
    // column, the start passed and every replayed record failed later.
    let f = Fixture::with_columns(
        &url,
        "key_include",
        "k bigint NOT NULL, v text, UNIQUE (k) INCLUDE (v)",
    );
    let msg = config_error(&idempotent(&f, &["k", "v"]), 1);
    assert!(
        msg.contains("no primary key or unique index on exactly (\"k\", \"v\")")
            && msg.contains("INCLUDE"),
        "{msg}"
    );
    // On its key column it is an arbiter: a replay rewrites the row.
    let mut s = open(&idempotent(&f, &["k"]), f.ctx("run1"), sink_options(), None).unwrap();
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&["1\ta"])).unwrap();
    s.write(&h.transaction, &batch(&["1\tb"])).unwrap();
    drop(s);
    let mut f = f;
    let rows: Vec<String> = f
        .admin
        .query(&format!("SELECT k || '|' || v FROM {}", f.table), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, ["1|b"]);

    // A deferrable unique constraint on the key: ON CONFLICT refuses to run
    // while one matches ("ON CONFLICT does not support deferrable unique
    // constraints"), even next to a unique index checked at once. Before
    // the fix the start passed and every replayed key failed later.
    // (Constraint names are index names: unique per run, like the table.)
    let constraint = unique("k_once");
    let mut f = Fixture::with_columns(
        &url,
        "key_deferrable",
        &format!(
            "k bigint NOT NULL, v text, CONSTRAINT {constraint} UNIQUE (k) DEFERRABLE INITIALLY IMMEDIATE"
        ),
    );
    f.admin
        .batch_execute(&format!("CREATE UNIQUE INDEX ON {} (k)", f.table))
        .unwrap();
    let msg = config_error(&idempotent(&f, &["k"]), 1);
    assert!(
        msg.contains(&format!("\"{constraint}\""))
            && msg.contains("DEFERRABLE")
            && msg.contains("DROP CONSTRAINT"),
        "{msg}"
    );
    // Made immediate as the message says, the key is usable.
    f.admin
        .batch_execute(&format!(
            "ALTER TABLE {} DROP CONSTRAINT \"{constraint}\", \
             ADD CONSTRAINT \"{constraint}\" UNIQUE (\"k\")",
            f.table
        ))
        .unwrap();
    let mut s = open(&idempotent(&f, &["k"]), f.ctx("run1"), sink_options(), None).unwrap();
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&["1\ta"])).unwrap();
    s.write(&h.transaction, &batch(&["1\tb"])).unwrap();
    drop(s);

    // A foreign key of the table onto its own key uses the key's index
    // too: the index's constraint is the unique one, not the foreign key
    // (the lookup took both and the start failed with "more than one row
    // returned by a subquery").
    let mut g = Fixture::with_columns(&url, "key_self_ref", "k bigint PRIMARY KEY, v bigint");
    g.admin
        .batch_execute(&format!(
            "ALTER TABLE {t} ADD FOREIGN KEY (v) REFERENCES {t} (k)",
            t = g.table
        ))
        .unwrap();
    let mut s = open(&idempotent(&g, &["k"]), g.ctx("run1"), sink_options(), None).unwrap();
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch(&["1\t\\N"])).unwrap();
}

/// The SQL connector's declared types against the PostgreSQL columns: a
/// pairing that would change values without an error (rounded fractions,
/// a time zone taken from the session) is refused at the start, naming the
/// column and both types; matching ones, and a connection without declared
/// types (a DataStream job's), start.
#[test]
fn declared_types_that_postgres_would_change_silently_are_rejected() {
    let url = server!();
    let f = Fixture::with_columns(
        &url,
        "decl",
        "id bigint PRIMARY KEY, amount numeric(10,2), at timestamptz, tags timestamp(3)[]",
    );
    let mut opts = f.opts.clone();
    opts.columns = vec!["id".into(), "amount".into(), "at".into(), "tags".into()];
    let with = |types: [&str; 4]| declaring(&opts, &types);
    let msg = config_error(
        &with([
            "bigint",
            "decimal:10:4",
            "timestamp_ltz:6",
            "array:timestamp:3",
        ]),
        1,
    );
    assert!(msg.contains("column \"amount\""), "{msg}");
    assert!(msg.contains("numeric(10,2)"), "{msg}");
    assert!(msg.contains("DECIMAL(10, 4)"), "{msg}");
    assert!(msg.contains("round its 4 fraction digits to 2"), "{msg}");
    let msg = config_error(
        &with(["bigint", "decimal:10:2", "timestamp:6", "array:timestamp:3"]),
        1,
    );
    assert!(msg.contains("column \"at\""), "{msg}");
    assert!(msg.contains("session's time zone"), "{msg}");
    let msg = config_error(
        &with([
            "bigint",
            "decimal:10:2",
            "timestamp_ltz:6",
            "array:timestamp:6",
        ]),
        1,
    );
    assert!(msg.contains("column \"tags\""), "{msg}");
    assert!(msg.contains("ARRAY<TIMESTAMP(6)>"), "{msg}");
    let sink = unique("decl-ok");
    for ok in [
        with([
            "bigint",
            "decimal:10:2",
            "timestamp_ltz:6",
            "array:timestamp:3",
        ]),
        opts.clone(),
    ] {
        PgDestination::connect(ok, &ctx(&sink, "run1", 0, 1)).unwrap();
    }
}

/// `"char"` and `name` cut strings short without an error: refused, while
/// `char(1)` (bpchar, which refuses an overlong value loudly) starts.
#[test]
fn strings_into_columns_that_cut_them_short_are_rejected() {
    let url = server!();
    let f = Fixture::with_columns(
        &url,
        "cut",
        "id bigint PRIMARY KEY, flag \"char\", label name, code char(1)",
    );
    let mut opts = f.opts.clone();
    opts.columns = vec!["id".into(), "flag".into(), "label".into(), "code".into()];
    let with = |types: [&str; 4]| declaring(&opts, &types);
    for flag in ["string", "boolean"] {
        let msg = config_error(&with(["bigint", flag, "int", "string"]), 1);
        assert!(msg.contains("column \"flag\""), "{msg}");
        assert!(msg.contains("only the first byte"), "{msg}");
    }
    let mut without_flag = opts.clone();
    without_flag.columns = vec!["id".into(), "label".into(), "code".into()];
    let msg = config_error(
        &declaring(&without_flag, &["bigint", "string", "string"]),
        1,
    );
    assert!(msg.contains("column \"label\""), "{msg}");
    assert!(msg.contains("at most 63 bytes"), "{msg}");
    let sink = unique("cut-ok");
    PgDestination::connect(
        declaring(&without_flag, &["bigint", "int", "string"]),
        &ctx(&sink, "run1", 0, 1),
    )
    .unwrap();
}

/// A domain is judged by its base type and modifier: a domain over
/// numeric(10,2) rounds DECIMAL(10, 4) values as the type itself would.
#[test]
fn declared_types_are_judged_through_a_domain() {
    let url = server!();
    let mut admin = admin(&url);
    let domain = unique("money");
    admin
        .batch_execute(&format!("CREATE DOMAIN {domain} AS numeric(10,2)"))
        .unwrap();
    let f = Fixture::with_columns(
        &url,
        "decl_dom",
        &format!("id bigint PRIMARY KEY, amount {domain}"),
    );
    let mut opts = f.opts.clone();
    opts.columns = vec!["id".into(), "amount".into()];
    let msg = config_error(&declaring(&opts, &["bigint", "decimal:10:4"]), 1);
    assert!(msg.contains("column \"amount\""), "{msg}");
    assert!(msg.contains("round its 4 fraction digits to 2"), "{msg}");
    PgDestination::connect(
        declaring(&opts, &["bigint", "decimal:10:2"]),
        &ctx(&unique("decl-dom-ok"), "run1", 0, 1),
    )
    .unwrap();
    drop(f);
    let _ = admin.batch_execute(&format!("DROP DOMAIN {domain} CASCADE"));
}

/// The base type is found however deep it lies: a domain over a domain,
/// an array of a domain, and a domain over an array are each judged by
/// the type their values are kept as (each passed the check before it
/// followed more than one step).
#[test]
fn declared_types_are_judged_through_domain_chains_and_arrays() {
    let url = server!();
    let mut admin = admin(&url);
    let (d1, d2, stamps) = (unique("amt1"), unique("amt2"), unique("stamps"));
    admin
        .batch_execute(&format!(
            "CREATE DOMAIN {d1} AS numeric(10,2); CREATE DOMAIN {d2} AS {d1}; \
             CREATE DOMAIN {stamps} AS timestamptz[]"
        ))
        .unwrap();
    let f = Fixture::with_columns(
        &url,
        "decl_chain",
        &format!("id bigint PRIMARY KEY, a {d2}, b {d1}[], c {stamps}"),
    );
    let mut opts = f.opts.clone();
    opts.columns = vec!["id".into(), "a".into(), "b".into(), "c".into()];
    let with = |types: [&str; 4]| declaring(&opts, &types);
    let msg = config_error(
        &with([
            "bigint",
            "decimal:10:4",
            "array:decimal:10:2",
            "array:timestamp_ltz:6",
        ]),
        1,
    );
    assert!(msg.contains("column \"a\""), "{msg}");
    assert!(msg.contains("round its 4 fraction digits to 2"), "{msg}");
    let msg = config_error(
        &with([
            "bigint",
            "decimal:10:2",
            "array:decimal:10:4",
            "array:timestamp_ltz:6",
        ]),
        1,
    );
    assert!(msg.contains("column \"b\""), "{msg}");
    assert!(msg.contains("round its 4 fraction digits to 2"), "{msg}");
    let msg = config_error(
        &with([
            "bigint",
            "decimal:10:2",
            "array:decimal:10:2",
            "array:timestamp:6",
        ]),
        1,
    );
    assert!(msg.contains("column \"c\""), "{msg}");
    assert!(msg.contains("session's time zone"), "{msg}");
    PgDestination::connect(
        with([
            "bigint",
            "decimal:10:2",
            "array:decimal:10:2",
            "array:timestamp_ltz:6",
        ]),
        &ctx(&unique("decl-chain-ok"), "run1", 0, 1),
    )
    .unwrap();
    drop(f);
    let _ = admin.batch_execute(&format!(
        "DROP DOMAIN {stamps} CASCADE; DROP DOMAIN {d2} CASCADE; DROP DOMAIN {d1} CASCADE"
    ));
}

/// The error of a connect that must be refused as retryable (the server
/// may become writable), with its message.
fn refused_for_now(opts: &PgOptions) -> String {
    match PgDestination::connect(opts.clone(), &ctx(&unique("ro"), "run1", 0, 1)) {
        Ok(d) => panic!("connect must fail, got {d:?}"),
        Err(e @ TwopcError::Scan { .. }) => e.to_string(),
        Err(e) => panic!("expected a retryable start-up error, got: {e}"),
    }
}

/// A sink pointed at a hot standby is refused when it connects, by name and
/// with the way out, instead of failing later at its first COPY, or at a
/// COMMIT PREPARED whose refusal (25006) would read as an unknown outcome.
/// With the standby first in a multi-host connection string, the advice
/// given (target_session_attrs=read-write) is shown to work.
#[test]
fn a_hot_standby_is_refused_by_name() {
    let standby = server!("TWOPC_PG_STANDBY_URL");
    let url = server!();
    let f = Fixture::new(&url, "standby");
    // The table must have reached the standby, so that the refusal is the
    // standby's, not a missing table's.
    let mut replica = admin(&standby);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while replica
        .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&f.table])
        .unwrap()
        .get::<_, bool>(0)
        .not()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the standby did not replay the table"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let msg = refused_for_now(&options(&standby, &f.table));
    for needle in [
        "control connection reached a PostgreSQL server in recovery (a hot standby)",
        "nothing was run there",
        "target_session_attrs=read-write",
    ] {
        assert!(msg.contains(needle), "missing {needle:?} in: {msg}");
    }
    let (_, password) = split_password(&url);
    let both = |attrs: &str| {
        let mut o = f.opts.clone();
        o.endpoint = Endpoint::Url(format!(
            "host=127.0.0.1,127.0.0.1 port={},{} dbname=twopc user=twopc{attrs}",
            port_of(&standby),
            port_of(&url)
        ));
        o.password = password.clone().map(Password::new);
        o
    };
    let msg = refused_for_now(&both(""));
    assert!(msg.contains("a hot standby"), "{msg}");
    PgDestination::connect(
        both(" target_session_attrs=read-write"),
        &ctx(&unique("ro"), "run1", 0, 1),
    )
    .expect("with target_session_attrs=read-write the primary is chosen");
}

/// A session made read-only by default_transaction_read_only (set here in
/// the connection's options, as an ALTER ROLE or a server's read-only mode
/// would): the writer's session is refused when it opens, naming the
/// setting, but a commit still works there (COMMIT PREPARED is allowed in a
/// read-only session, and the commit record is inside the prepared
/// transaction), so a primary put in read-only mode does not stop the
/// commits of completed checkpoints.
#[test]
fn a_read_only_session_refuses_the_writer_and_still_commits() {
    let url = server!();
    let mut f = Fixture::new(&url, "readonly");
    let mut s = f.open("run1");
    let h = prepared(&mut s, &rows(0..3, "r"), 1);
    drop(s);
    let mut read_only = f.opts.clone();
    let Endpoint::Url(plain) = &read_only.endpoint else {
        unreachable!("options() gives a URL")
    };
    read_only.endpoint = Endpoint::Url(format!(
        "{plain}?options=-c%20default_transaction_read_only%3Don"
    ));
    let mut committer = PgDestination::connect(read_only.clone(), &f.ctx("run1")).unwrap();
    assert_eq!(
        committer.commit(&h, 5).unwrap(),
        twopc_core::destination::CommitStatus::Committed
    );
    drop(committer);
    let count: i64 = f
        .admin
        .query_one(&format!("SELECT count(*) FROM {}", f.table), &[])
        .unwrap()
        .get(0);
    assert_eq!(count, 3);
    let Err(err) = open(&read_only, f.ctx("run2"), sink_options(), None) else {
        panic!("a writer on a read-only session started");
    };
    assert!(!err.is_fatal(), "{err}");
    let msg = err.to_string();
    for needle in [
        "writer connection is read-only (default_transaction_read_only is on",
        "ALTER ROLE ... SET default_transaction_read_only = off",
    ] {
        assert!(msg.contains(needle), "missing {needle:?} in: {msg}");
    }
}

/// A server with no connection to spare (53300: too many connections, as
/// after a failover whose old sessions have not ended yet; here a role
/// limited to none) is retried by Flink's restart strategy, not taken for
/// settings to fix: before, the start-up stopped the job for good.
#[test]
fn a_server_with_no_connection_to_spare_is_retried_not_refused() {
    let url = server!();
    let mut f = Fixture::new(&url, "busy");
    let role = unique("busy");
    let pw = "busy-pw-3a7c";
    f.admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{pw}' CONNECTION LIMIT 0"
        ))
        .unwrap();
    let opts = options_as(&url, &role, pw, f.table.clone(), &["id", "body"]);
    let result = PgDestination::connect(opts, &ctx(&unique("busy"), "run1", 0, 1));
    let _ = f.admin.batch_execute(&format!("DROP ROLE {role}"));
    match result {
        Err(e @ TwopcError::Scan { .. }) => {
            assert!(!e.is_fatal(), "{e}");
            assert!(e.to_string().contains("53300"), "{e}");
        }
        Err(e) => panic!("expected a retryable start-up error, got: {e}"),
        Ok(d) => panic!("connect must fail, got {d:?}"),
    }
}
