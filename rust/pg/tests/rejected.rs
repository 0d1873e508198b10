//! Records PostgreSQL can never accept, against a real server: each is a
//! `RecordRejected` error (fatal: a replay would fail the same way) naming
//! its position in the transaction, the column, the reason and the record's
//! first bytes; nothing of the transaction becomes visible.
//!
//! Records that are not exactly one row, hold NUL bytes or invalid UTF-8, or
//! have the wrong number of fields are refused at write, before any of their
//! batch reaches the server. Values only the server can judge are refused
//! when the COPY ends, at prepare, and mapped back to the record by the
//! line PostgreSQL names.

#[macro_use]
mod common;

use common::*;
use twopc_core::destination::Destination;
use twopc_core::handle::{PreparedInfo, TransactionState};
use twopc_core::records::preview;
use twopc_core::{FreshStartPolicy, SinkOptions, TwopcError};
use twopc_pg::CopyFormat;

/// Each case starts a run of its own next to the output of the cases
/// before it (a start without state under a job id that committed output
/// is refused: that is a reused job id, not a restart).
fn open_new_run(f: &Fixture) -> Sink {
    let options = SinkOptions {
        fresh_start: FreshStartPolicy::Append,
        ..sink_options()
    };
    open(&f.opts, f.ctx(&unique("run")), options, None).unwrap()
}

/// Writes `good` in one batch, then `before` good records, `hostile` and one
/// more good record in a second, on a sink of its own: the second write
/// must be refused, naming the hostile record, and nothing of its batch may
/// reach the server. Returns the refusal's message.
fn refused_at_write(
    f: &mut Fixture,
    good: &[&[u8]],
    before: &[&[u8]],
    hostile: &[u8],
    column: Option<&str>,
    needle: &str,
) -> String {
    let mut s = open_new_run(f);
    let h = s.begin().unwrap();
    s.write(&h.transaction, &batch_bytes(good)).unwrap();

    let mut second: Vec<&[u8]> = before.to_vec();
    second.push(hostile);
    second.push(good[0]);
    let (r, msg) = rejected(s.write(&h.transaction, &batch_bytes(&second)));
    let shown = String::from_utf8_lossy(hostile);
    assert_eq!(
        r.position,
        Some((good.len() + before.len()) as u64),
        "{shown:?}: {msg}"
    );
    assert_eq!(r.checkpoint, None, "found at write: {msg}");
    assert_eq!(r.column.as_deref(), column, "{shown:?}: {msg}");
    assert_eq!(r.preview, preview(hostile), "{msg}");
    assert_eq!(r.transaction, h.transaction);
    for part in [
        needle,
        &format!("record #{}", r.position.unwrap()),
        h.transaction.as_str(),
        "while writing",
        "Filter or fix such records before the sink",
        &preview(hostile),
    ] {
        assert!(msg.contains(part), "{shown:?}: missing {part:?} in {msg}");
    }

    // The core only aborts the transaction now...
    assert!(matches!(
        s.prepare(&h.transaction, 1),
        Err(TwopcError::Protocol { .. })
    ));
    // ...but to see what reached the server, prepare and commit it through
    // the destination itself: exactly the first batch, nothing of the
    // refused one (a line break or end marker in it would have shown as an
    // injected row, a cut COPY or a failed one).
    let mut seen = h.clone();
    seen.state = TransactionState::Prepared(PreparedInfo {
        checkpoint: 1,
        records: good.len() as u64,
        bytes: 0,
        prepared_at_ms: 0,
    });
    s.destination().prepare(&seen).unwrap();
    s.destination().commit(&seen, 0).unwrap();
    assert_eq!(f.count(), good.len() as i64, "{shown:?}");
    f.admin
        .batch_execute(&format!("DELETE FROM {}", f.table))
        .unwrap();
    msg
}

#[test]
fn text_records_that_are_not_exactly_one_row_are_refused_at_write() {
    let url = server!();
    let mut f = Fixture::new(&url, "rj_text");
    let good: &[&[u8]] = &[b"1\ta", b"2\tb", b"3\tc"];
    let before: &[&[u8]] = &[b"4\td", b"5\te"];
    let cases: &[(&[u8], Option<&str>, &str)] = &[
        // Issue 9: a line break and the end marker used to end the COPY
        // early and inject a row, dropping records silently.
        (b"6\tx\n\\.\n7\tinjected", Some("body"), "line feed"),
        (b"6\tx\n7\tinjected", Some("body"), "line feed"),
        (b"6\tx\r7\ty", Some("body"), "carriage return"),
        (b"\\.", Some("id"), "end-of-data marker"),
        (
            b"6\tends with the marker \\.",
            Some("body"),
            "end-of-data marker",
        ),
        (b"6\tlone backslash \\", Some("body"), "lone backslash"),
    ];
    for (hostile, column, needle) in cases {
        refused_at_write(&mut f, good, before, hostile, *column, needle);
    }
    // Escapes that are data pass.
    let mut s = open_new_run(&f);
    committed(&mut s, &["8\tline\\nbreak \\\\. and tab\\t", "9\t\\N"], 2);
    assert_eq!(f.visible(), vec!["8|line\nbreak \\. and tab\t", "9|<null>"]);
}

#[test]
fn csv_records_that_are_not_exactly_one_row_are_refused_at_write() {
    let url = server!();
    let mut f = Fixture::new(&url, "rj_csv");
    f.opts.copy_format = CopyFormat::Csv;
    let good: &[&[u8]] = &[b"1,a", b"2,\"b\nwith a line break\""];
    let before: &[&[u8]] = &[b"3,c"];
    let cases: &[(&[u8], Option<&str>, &str)] = &[
        (b"4,x\n\\.\n5,injected", Some("body"), "line feed"),
        (b"4,x\r\n5,y", Some("body"), "carriage return"),
        (b"\\.", Some("id"), "end-of-data marker"),
        (b"4,\"never closed", Some("body"), "never closed"),
        (b"4,\"a \"\" quote\"\n", Some("body"), "line feed"),
    ];
    for (hostile, column, needle) in cases {
        refused_at_write(&mut f, good, before, hostile, *column, needle);
    }
    let mut s = open_new_run(&f);
    committed(
        &mut s,
        &["6,\"\\.\"", "7,\"x\r\ny\"", "8,\"a \"\"q\"\"\""],
        2,
    );
    assert_eq!(f.visible(), vec!["6|\\.", "7|x\r\ny", "8|a \"q\""]);
}

#[test]
fn nul_bytes_invalid_utf8_and_wrong_field_counts_are_refused_at_write() {
    let url = server!();
    for format in [CopyFormat::Text, CopyFormat::Csv] {
        let mut f = Fixture::new(&url, "rj_bytes");
        f.opts.copy_format = format;
        let (good, before): (&[&[u8]], &[&[u8]]) = match format {
            CopyFormat::Text => (&[b"1\ta", b"2\tb"], &[b"3\tc"]),
            CopyFormat::Csv => (&[b"1,a", b"2,b"], &[b"3,c"]),
        };
        let mut cases: Vec<(&[u8], Option<&str>, &str)> = match format {
            CopyFormat::Text => vec![
                (b"4\ta\0b", Some("body"), "NUL byte"),
                (b"4\ta\\000b", Some("body"), "NUL byte (from an escape"),
                (b"4\tcaf\xe9", Some("body"), "not valid UTF-8"),
                (b"4\t\\xff", Some("body"), "bytes from escapes"),
                (b"4", Some("body"), "1 field but 2 columns"),
                (b"4\tx\ty", None, "3 fields but only 2 columns"),
            ],
            CopyFormat::Csv => vec![
                (b"4,a\0b", Some("body"), "NUL byte"),
                (b"4,\"caf\xe9\"", Some("body"), "not valid UTF-8"),
                (b"4", Some("body"), "1 field but 2 columns"),
                (b"4,x,\"y\"", None, "3 fields but only 2 columns"),
            ],
        };
        cases.push((b"\xff\xfe", Some("id"), "not valid UTF-8"));
        for (hostile, column, needle) in cases {
            refused_at_write(&mut f, good, before, hostile, column, needle);
        }
    }
}

/// Writes `rows` (valid, one per record) in batches of 10 and prepares:
/// the prepare must be refused for the record at `position`.
fn refused_at_prepare(
    f: &mut Fixture,
    s: &mut Sink,
    records: &[String],
    position: u64,
    column: Option<&str>,
    needles: &[&str],
) -> String {
    let h = s.begin().unwrap();
    for chunk in records.chunks(10) {
        s.write(&h.transaction, &batch(chunk)).unwrap();
    }
    let (r, msg) = rejected(s.prepare(&h.transaction, 7));
    assert_eq!(r.position, Some(position), "{msg}");
    assert_eq!(r.checkpoint, Some(7), "found at prepare: {msg}");
    assert_eq!(r.column.as_deref(), column, "{msg}");
    let bad = &records[position as usize];
    assert_eq!(r.preview, preview(bad.as_bytes()), "{msg}");
    let named = format!("record #{position}");
    for part in needles.iter().copied().chain([
        named.as_str(),
        h.transaction.as_str(),
        "while preparing it for checkpoint 7",
        "PostgreSQL: ERROR",
        "Filter or fix such records before the sink",
    ]) {
        assert!(msg.contains(part), "missing {part:?} in {msg}");
    }
    s.abort(&h).unwrap();
    assert_eq!(f.count(), 0);
    assert!(f.prepared_gids().is_empty());
    msg
}

/// `n` good rows with `bad` at index `at`.
fn rows_with(n: i64, at: usize, bad: &str) -> Vec<String> {
    let mut v = rows(0..n, "ok");
    v[at] = bad.to_string();
    v
}

#[test]
fn values_only_the_server_can_judge_are_refused_at_prepare_by_position() {
    let url = server!();
    let mut f = Fixture::with_columns(
        &url,
        "rj_server",
        "id bigint NOT NULL, body varchar(12) CHECK (body <> 'forbidden'), txn text",
    );
    // With the transaction-id field the sink appends to each row: the
    // preview is the record without it.
    f.opts.transaction_id_column = Some("txn".into());
    let mut s = open_new_run(&f);
    let cases: &[(&str, Option<&str>, &[&str])] = &[
        (
            "99999999999999999999\tbig",
            Some("id"),
            &["22003", "out of range for type bigint"],
        ),
        (
            "abc\tnot a number",
            Some("id"),
            &["22P02", "invalid input syntax for type bigint: \"abc\""],
        ),
        (
            "\\N\tnull id",
            Some("id"),
            &["23502", "not-null constraint"],
        ),
        ("5\tforbidden", None, &["23514", "check constraint"]),
        (
            "5\tfar too long for it",
            Some("body"),
            &["22001", "value too long for type character varying(12)"],
        ),
    ];
    for (bad, column, needles) in cases {
        // Three batches; the bad record is the fifth of the second.
        refused_at_prepare(
            &mut f,
            &mut s,
            &rows_with(30, 14, bad),
            14,
            *column,
            needles,
        );
    }
    committed(&mut s, &rows(0..3, "fine"), 8);
    assert_eq!(f.count(), 3);
}

#[test]
fn a_duplicate_key_is_refused_at_prepare_at_its_second_occurrence() {
    let url = server!();
    let mut f = Fixture::with_columns(&url, "rj_unique", "id bigint PRIMARY KEY, body text");
    let mut s = open_new_run(&f);
    let records = rows_with(25, 21, "3\tagain");
    let msg = refused_at_prepare(
        &mut f,
        &mut s,
        &records,
        21,
        None,
        &[
            "23505",
            "duplicate key value",
            "Key (id)=(3) already exists",
        ],
    );
    assert!(!msg.contains(&TestUrl::password()), "{msg}");
}

/// A foreign key is checked once the COPY's rows are in, and a DEFERRABLE
/// one only at PREPARE TRANSACTION: PostgreSQL names no row either way.
/// The violation used to stay retryable, so every replay failed the same
/// way and the job restarted forever. It is now a refused record of an
/// unknown position, which stops the job once, with the server's detail
/// naming the value.
#[test]
fn a_foreign_key_violation_stops_the_job_once_without_a_position() {
    let url = server!();
    for deferred in [false, true] {
        let mut admin = admin(&url);
        let parent = unique("t_rj_parent");
        admin
            .batch_execute(&format!(
                "CREATE TABLE {parent} (k bigint PRIMARY KEY); \
                 INSERT INTO {parent} SELECT generate_series(0, 99)"
            ))
            .unwrap();
        let timing = if deferred {
            "DEFERRABLE INITIALLY DEFERRED"
        } else {
            ""
        };
        let mut f = Fixture::with_columns(
            &url,
            "rj_fk",
            &format!("id bigint, parent bigint REFERENCES {parent} (k) {timing}"),
        );
        f.opts.columns = vec!["id".into(), "parent".into()];
        let mut s = open_new_run(&f);
        let h = s.begin().unwrap();
        let records: Vec<String> = (0..30)
            .map(|i| format!("{i}\t{}", if i == 17 { 4242 } else { i }))
            .collect();
        for chunk in records.chunks(10) {
            s.write(&h.transaction, &batch(chunk)).unwrap();
        }
        let (r, msg) = rejected(s.prepare(&h.transaction, 5));
        assert_eq!(r.position, None, "deferred {deferred}: {msg}");
        assert_eq!(r.checkpoint, Some(5), "{msg}");
        let when = if deferred {
            "at PREPARE TRANSACTION"
        } else {
            "when the COPY ended"
        };
        for part in [
            "23503",
            "Key (parent)=(4242) is not present",
            "a record of transaction",
            h.transaction.as_str(),
            when,
            "did not say which record",
            "while preparing it for checkpoint 5",
        ] {
            assert!(
                msg.contains(part),
                "deferred {deferred}: missing {part:?} in {msg}"
            );
        }
        s.abort(&h).unwrap();
        assert_eq!(f.count(), 0);
        assert!(f.prepared_gids().is_empty(), "deferred {deferred}");
        // The session carries on: the next transaction without the record
        // commits.
        let fine: Vec<String> = (0..3).map(|i| format!("{i}\t{i}")).collect();
        committed(&mut s, &fine, 6);
        assert_eq!(f.count(), 3, "deferred {deferred}");
    }
}

#[test]
fn csv_line_breaks_inside_quotes_do_not_shift_positions() {
    let url = server!();
    let mut f = Fixture::new(&url, "rj_csvpos");
    f.opts.copy_format = CopyFormat::Csv;
    let mut s = open_new_run(&f);
    let mut records: Vec<String> = (0..20)
        .map(|i| format!("{i},\"two\nlines \"\"{i}\"\"\""))
        .collect();
    records[17] = "x17,\"a\nb\"".to_string();
    refused_at_prepare(
        &mut f,
        &mut s,
        &records,
        17,
        Some("id"),
        &["invalid input syntax for type bigint: \"x17\""],
    );
}

#[test]
fn a_refused_record_no_longer_held_is_shown_as_postgresql_quotes_it() {
    let url = server!();
    let mut f = Fixture::new(&url, "rj_far");
    let mut s = open_new_run(&f);
    let h = s.begin().unwrap();
    s.write(
        &h.transaction,
        &batch(&rows_with(100, 42, "not-a-number\tbad")),
    )
    .unwrap();
    // More than the few MiB of latest batches the destination keeps.
    let body = "y".repeat(200);
    for b in 0..30i64 {
        let more: Vec<String> = (0..1000)
            .map(|i| format!("{}\t{body}", 1000 + b * 1000 + i))
            .collect();
        s.write(&h.transaction, &batch(&more)).unwrap();
    }
    let (r, msg) = rejected(s.prepare(&h.transaction, 3));
    assert_eq!(r.position, Some(42), "{msg}");
    assert_eq!(r.column.as_deref(), Some("id"), "{msg}");
    assert_eq!(
        r.preview,
        "not-a-number (the value of column id as PostgreSQL quotes it; the record itself is no \
         longer held)",
        "{msg}"
    );
    s.abort(&h).unwrap();
    assert_eq!(f.count(), 0);
}

/// The test server's password, to check it shows nowhere.
struct TestUrl;

impl TestUrl {
    fn password() -> String {
        let url = std::env::var("TWOPC_PG_URL").unwrap_or_default();
        split_password(&url)
            .1
            .unwrap_or_else(|| "no password".into())
    }
}
