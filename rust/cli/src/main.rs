//! `twopc`: command-line tools for the destinations of the twopc sink
//! (output directories and PostgreSQL).
//!
//! Exit codes: 0 done, nothing needs attention; 1 something needs attention
//! (or a dry run found output to remove); 2 usage or I/O error; 3 refused
//! (a live run owns the sink, or the decision is not allowed).

mod args;
mod inspect;
mod operate;
mod render;
mod timefmt;

use std::ffi::OsString;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use twopc_core::{Clock, SinkOptions, SystemClock};

use crate::inspect::{InspectOptions, Report};

const EXIT_OK: u8 = 0;
const EXIT_ATTENTION: u8 = 1;
const EXIT_USAGE: u8 = 2;

const USAGE: &str = "\
twopc: tools for output directories of the twopc exactly-once Flink sink

Usage:
  twopc inspect <output-dir> [--json] [--limit N | --all] [--retention-ms N] [--run RUN]
                [--part-prefix P]
  twopc inspect <postgres-url> --sink S [--json] [--limit N | --all] [PostgreSQL options]
  twopc reconcile <destination> --sink S --lineage L --after-checkpoint N [--apply]
  twopc decide <destination> --sink S (--commit TXN | --abort TXN)
  twopc help [inspect|reconcile|decide]
  twopc --version

<destination> is an output directory or a postgres:// URL (see
'twopc help reconcile' for the PostgreSQL options).

Commands:
  inspect     Show committed and staged transactions of every sink in an output
              directory, and what needs an operator. Changes nothing.
  reconcile   List (dry run) or remove (--apply) a sink's output committed after
              a checkpoint of a lineage, before restoring that checkpoint.
  decide      Commit or abort one prepared leftover transaction by hand.

Exit codes: 0 done, nothing needs attention; 1 something needs attention (or a
dry run found output to remove); 2 usage or I/O error; 3 refused (a live run
owns the sink, or the decision is not allowed). Set RUST_LOG=debug for
diagnostics on stderr.
";

fn inspect_usage() -> String {
    format!(
        "\
Usage: twopc inspect <output-dir> [options]

Lists, for every sink under <output-dir>/_twopc/: committed output per lineage
and run, the latest committed transactions,
staged transactions (prepared or open, their age and retention), expired
tombstones and problems, plus visible part files that no commit record
references. Nothing is changed on disk.

Options:
  --json              Print one JSON document to stdout instead of tables.
  --retention-ms N    Staged-transaction retention to judge ages against
                      (default {} ms, the sink's default; pass the value the
                      job is configured with).
  --run RUN           The run (Flink job id) prepared transactions are judged
                      against; prepared transactions of any other run are
                      flagged. Default: the run with the latest activity in
                      each sink.
  --part-prefix P     Prefix of visible output files (default \"part\").
  --limit N           List the latest N committed transactions per sink
                      (default {limit}); counts per lineage and run, and every
                      finding, always cover all of them.
  --all               List every committed transaction.
  --sink S            For a PostgreSQL destination (postgres://user@host/db, the
                      password from $PGPASSWORD or --password-env VAR): the
                      sink to inspect; --control-schema S if not public.
  -h, --help          Show this help.

Needs attention (exit code 1): any problem the scan found, any prepared
transaction (each with the reason and what to do), any staged transaction past
retention, any visible part file no commit record references, committed
files changed after their commit, a partly visible checkpoint (a transaction of
it LOST, or prepared beside committed ones), and a gap in a lineage (output
committed past a lost checkpoint). Progress of long scans goes to stderr.
",
        SinkOptions::default().retention_ms,
        limit = inspect::DEFAULT_LIMIT
    )
}

const PG_OPTIONS: &str = "\
PostgreSQL destinations (<destination> = postgres://user@host:port/db):
  --table T                   The table the sink writes to (schema.table).
                              Needed by reconcile.
  --transaction-id-column C   The sink's transaction-id column
                              (transactionIdColumn); reconcile --apply
                              removes rows by it and refuses without it.
  --control-schema S          Schema of the twopc_* control tables
                              (default public).
  --password-env VAR          Environment variable holding the password
                              (default PGPASSWORD). A password in the URL
                              is refused.
";

fn reconcile_usage() -> String {
    format!(
        "\
Usage: twopc reconcile <destination> --sink S --lineage L --after-checkpoint N [--apply]

Lists this sink's output committed after checkpoint N of lineage L: what a
restore of checkpoint N would write again. Nothing is changed unless --apply
is given; then that output (files, or rows and their commit records) is
removed, each removal logged. Repeating it is harmless: removed output is not
listed again. Refused while a live run owns the sink (stop the job first);
a run that starts meanwhile waits for it.

Options:
  --sink S                The sink id.
  --lineage L             The lineage (16 hex digits, as the job's error and
                          'twopc inspect' print it).
  --after-checkpoint N    The checkpoint the job will be restored from.
  --apply                 Remove the output (default: dry run).
  -h, --help              Show this help.

{PG_OPTIONS}
Exit codes: 0 nothing to remove, or removed; 1 dry run found output to
remove; 2 usage or I/O error; 3 refused.
"
    )
}

fn decide_usage() -> String {
    format!(
        "\
Usage: twopc decide <destination> --sink S (--commit TXN | --abort TXN)

Resolves one staged transaction of the sink by hand, typically a prepared
leftover that a job started without state refused. Commit it when its
checkpoint completed (its records exist nowhere else); abort it when it did
not, or when its output is not wanted. A transaction whose commit was decided
is only ever committed; one never prepared, or whose prepared handle cannot
be read, is never committed; committed output is never aborted (see
'twopc reconcile'). Repeating a decision is harmless. Refused while a live
run owns the sink.

Options:
  --sink S          The sink id.
  --commit TXN      Commit transaction TXN.
  --abort TXN       Abort transaction TXN.
  -h, --help        Show this help.

{PG_OPTIONS}
Exit codes: 0 done (or already done); 2 usage or I/O error; 3 refused.
"
    )
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    ExitCode::from(run(args))
}

fn run(args: Vec<OsString>) -> u8 {
    let mut args = args.into_iter();
    let Some(command) = args.next() else {
        eprint!("{USAGE}");
        return EXIT_USAGE;
    };
    match command.to_str() {
        Some("-h" | "--help") => print_out(USAGE, EXIT_OK),
        Some("help") => match args.next().as_ref().and_then(|a| a.to_str()) {
            None => print_out(USAGE, EXIT_OK),
            Some("inspect") => print_out(&inspect_usage(), EXIT_OK),
            Some("reconcile") => print_out(&reconcile_usage(), EXIT_OK),
            Some("decide") => print_out(&decide_usage(), EXIT_OK),
            Some(other) => usage_error(&format!("no help for unknown command '{other}'")),
        },
        Some("-V" | "--version") => {
            print_out(&format!("twopc {}\n", env!("CARGO_PKG_VERSION")), EXIT_OK)
        }
        Some("inspect") => match parse_inspect(args) {
            Ok(Parsed::Help) => print_out(&inspect_usage(), EXIT_OK),
            Ok(Parsed::Run(opts, json)) => run_inspect(&opts, json),
            Err(msg) => {
                eprintln!("twopc inspect: {msg}\nRun 'twopc inspect --help' for usage.");
                EXIT_USAGE
            }
        },
        Some("reconcile") => match operate::parse_reconcile(args.collect()) {
            Ok(operate::Parsed::Help) => print_out(&reconcile_usage(), EXIT_OK),
            Ok(operate::Parsed::Run(a)) => finish("reconcile", operate::reconcile(&a)),
            Err(msg) => {
                eprintln!("twopc reconcile: {msg}\nRun 'twopc reconcile --help' for usage.");
                EXIT_USAGE
            }
        },
        Some("decide") => match operate::parse_decide(args.collect()) {
            Ok(operate::Parsed::Help) => print_out(&decide_usage(), EXIT_OK),
            Ok(operate::Parsed::Run(a)) => finish("decide", operate::decide(&a)),
            Err(msg) => {
                eprintln!("twopc decide: {msg}\nRun 'twopc decide --help' for usage.");
                EXIT_USAGE
            }
        },
        _ => usage_error(&format!("unknown command '{}'", command.to_string_lossy())),
    }
}

fn finish(command: &str, result: Result<(u8, String), operate::Failed>) -> u8 {
    match result {
        Ok((code, out)) => print_out(&out, code),
        Err(f) => {
            eprintln!("twopc {command}: {}", f.message);
            f.code
        }
    }
}

fn usage_error(msg: &str) -> u8 {
    eprintln!("twopc: {msg}\nRun 'twopc --help' for usage.");
    EXIT_USAGE
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn print_out(s: &str, code: u8) -> u8 {
    let mut out = io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => code,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => code,
        Err(e) => {
            eprintln!("twopc: cannot write to stdout: {e}");
            EXIT_USAGE
        }
    }
}

enum Parsed {
    Help,
    Run(Box<InspectOptions>, bool),
}

fn parse_inspect(args: impl Iterator<Item = OsString>) -> Result<Parsed, String> {
    let mut output: Option<PathBuf> = None;
    let mut json = false;
    let mut retention_ms = SinkOptions::default().retention_ms;
    let mut run: Option<String> = None;
    let mut part_prefix = "part".to_string();
    let mut limit = Some(inspect::DEFAULT_LIMIT);
    let mut sink: Option<String> = None;
    let (mut table, mut control_schema, mut password_env) = (None, None, None);
    let mut args = args.peekable();
    let mut only_positional = false;

    while let Some(arg) = args.next() {
        let text = arg.to_str();
        if only_positional || !text.is_some_and(|t| t.starts_with('-') && t.len() > 1) {
            if output.is_some() {
                return Err(format!(
                    "unexpected argument '{}': give exactly one output directory",
                    arg.to_string_lossy()
                ));
            }
            output = Some(PathBuf::from(arg));
            continue;
        }
        let text = text.expect("checked above");
        let (flag, inline) = match text.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (text, None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            match args.next() {
                Some(v) => v
                    .into_string()
                    .map_err(|v| format!("{name} value {v:?} is not valid UTF-8")),
                None => Err(format!("{name} needs a value")),
            }
        };
        match flag {
            "--" => only_positional = true,
            "-h" | "--help" => return Ok(Parsed::Help),
            "--json" => json = true,
            "--retention-ms" => {
                let v = value("--retention-ms")?;
                retention_ms = v.trim().parse().map_err(|_| {
                    format!(
                        "--retention-ms takes a whole number of milliseconds, not {v:?} (e.g. \
                         --retention-ms 604800000 for 7 days)"
                    )
                })?;
            }
            "--run" => {
                let v = value("--run")?;
                twopc_core::RunId::new(v.as_str()).map_err(|e| format!("--run: {e}"))?;
                run = Some(v);
            }
            "--part-prefix" => {
                let v = value("--part-prefix")?;
                twopc_core::ids::validate_token("part prefix", &v, 32)
                    .map_err(|e| format!("--part-prefix: {e}"))?;
                part_prefix = v;
            }
            "--limit" => {
                let v = value("--limit")?;
                limit =
                    Some(v.trim().parse().map_err(|_| {
                        format!("--limit takes a number of transactions, not {v:?}")
                    })?);
            }
            "--all" => limit = None,
            "--sink" => {
                let v = value("--sink")?;
                operate::parse_sink(&v)?;
                sink = Some(v);
            }
            "--table" => table = Some(value("--table")?),
            "--control-schema" => control_schema = Some(value("--control-schema")?),
            "--password-env" => password_env = Some(value("--password-env")?),
            other => return Err(format!("unknown option '{other}'")),
        }
    }
    let output = output.ok_or("missing <output-dir>: give the sink's output directory")?;
    let url = output
        .to_str()
        .filter(|o| operate::Target::is_postgres(o))
        .map(str::to_string);
    let postgres = match url {
        Some(url) => {
            if sink.is_none() {
                return Err(
                    "missing --sink: a PostgreSQL destination is inspected one sink at a time"
                        .to_string(),
                );
            }
            Some(operate::PgTarget {
                url,
                table,
                transaction_id_column: None,
                control_schema: control_schema.unwrap_or_else(|| "public".to_string()),
                password_env: password_env
                    .unwrap_or_else(|| operate::DEFAULT_PASSWORD_ENV.to_string()),
            })
        }
        None => {
            if let Some((flag, _)) = [
                ("--sink", sink.is_some()),
                ("--table", table.is_some()),
                ("--control-schema", control_schema.is_some()),
                ("--password-env", password_env.is_some()),
            ]
            .into_iter()
            .find(|(_, set)| *set)
            {
                return Err(format!(
                    "{flag} is for a PostgreSQL destination (postgres://...); a directory is \
                     inspected whole"
                ));
            }
            None
        }
    };
    Ok(Parsed::Run(
        Box::new(InspectOptions {
            output,
            retention_ms,
            run,
            part_prefix,
            now_ms: SystemClock.now_ms(),
            limit,
            sink,
            postgres,
        }),
        json,
    ))
}

fn run_inspect(opts: &InspectOptions, json: bool) -> u8 {
    let result = match (&opts.postgres, &opts.sink) {
        (Some(pg), Some(sink)) => {
            let sink = twopc_core::SinkId::new(sink.as_str()).expect("checked when parsed");
            match operate::open_pg(pg, &sink, false) {
                Ok(mut dest) => inspect::inspect_destination(
                    &mut dest,
                    &sink,
                    &twopc_pg::redact_url(&pg.url),
                    opts,
                ),
                Err(f) => Err(inspect::InspectError(f.message)),
            }
        }
        _ => inspect::inspect(opts),
    };
    let report: Report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("twopc inspect: {e}");
            return EXIT_USAGE;
        }
    };
    log::debug!(
        "inspected {}: {} sinks, {} findings need attention",
        report.output_dir,
        report.sinks.len(),
        report.attention.len()
    );
    let code = if report.needs_attention {
        EXIT_ATTENTION
    } else {
        EXIT_OK
    };
    let body = if json {
        match serde_json::to_string_pretty(&report) {
            Ok(mut s) => {
                s.push('\n');
                s
            }
            Err(e) => {
                eprintln!("twopc inspect: cannot encode the report as JSON: {e}");
                return EXIT_USAGE;
            }
        }
    } else {
        render::text(&report)
    };
    print_out(&body, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Parsed, String> {
        parse_inspect(
            args.iter()
                .map(OsString::from)
                .collect::<Vec<_>>()
                .into_iter(),
        )
    }

    #[test]
    fn parses_inspect_arguments() {
        let Ok(Parsed::Run(o, json)) = parse(&["out", "--json", "--retention-ms=5", "--run", "r1"])
        else {
            panic!("did not parse");
        };
        assert!(json);
        assert_eq!(o.output, PathBuf::from("out"));
        assert_eq!(o.retention_ms, 5);
        assert_eq!(o.run.as_deref(), Some("r1"));
        assert!(matches!(parse(&["--help"]), Ok(Parsed::Help)));
        let Ok(Parsed::Run(o, _)) = parse(&["--", "-dir"]) else {
            panic!("did not parse");
        };
        assert_eq!(o.output, PathBuf::from("-dir"));
    }

    #[test]
    fn rejects_bad_arguments() {
        for (args, needle) in [
            (&[][..], "missing <output-dir>"),
            (&["a", "b"][..], "exactly one output directory"),
            (&["a", "--retention-ms", "x"][..], "whole number"),
            (&["a", "--retention-ms"][..], "needs a value"),
            (&["a", "--bogus"][..], "unknown option '--bogus'"),
            (&["a", "--run", "a/b"][..], "--run"),
        ] {
            match parse(args) {
                Err(e) => assert!(e.contains(needle), "{args:?}: {e}"),
                Ok(_) => panic!("{args:?} parsed"),
            }
        }
    }
}
