//! `twopc`: command-line tools for the destinations of the twopc sink
//! (output directories and PostgreSQL).
//!
//! Exit codes: 0 done, nothing needs attention; 1 something needs attention
//! (or a dry run found output to remove); 2 usage or I/O error; 3 refused
//! (a live run owns the sink, or the decision is not allowed).

mod cli;
mod inspect;
mod operate;
mod render;

use std::ffi::OsString;
use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::inspect::{InspectOptions, Report};

const EXIT_OK: u8 = 0;
const EXIT_ATTENTION: u8 = 1;
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    ExitCode::from(run(args))
}

fn run(args: Vec<OsString>) -> u8 {
    let cli = match Cli::try_parse_from(std::iter::once(OsString::from("twopc")).chain(args)) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version land here too, on stdout with exit code 0;
            // usage errors on stderr with 2 (EXIT_USAGE).
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(EXIT_USAGE);
        }
    };
    match cli.command {
        Command::Inspect(i) => match i.into_options() {
            Ok((opts, json)) => run_inspect(&opts, json),
            Err(msg) => usage_error("inspect", &msg),
        },
        Command::Reconcile(r) => match r.into_args() {
            Ok(a) => finish("reconcile", operate::reconcile(&a)),
            Err(msg) => usage_error("reconcile", &msg),
        },
        Command::Decide(d) => match d.into_args() {
            Ok(a) => finish("decide", operate::decide(&a)),
            Err(msg) => usage_error("decide", &msg),
        },
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

fn usage_error(command: &str, msg: &str) -> u8 {
    eprintln!("twopc {command}: {msg}\nRun 'twopc {command} --help' for usage.");
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

/// `twopc inspect postgres://...` without `--sink`: every sink the control
/// tables know, one report.
fn inspect_every_pg_sink(
    pg: &operate::PgTarget,
    opts: &InspectOptions,
) -> Result<Report, inspect::InspectError> {
    let fail = |f: operate::Failed| inspect::InspectError(f.message);
    // Only the control tables are read: any sink id opens them.
    let lister = twopc_core::SinkId::new("twopc-inspect").expect("a valid sink id");
    let sinks = operate::open_pg(pg, &lister, false)
        .map_err(fail)?
        .sink_ids()
        .map_err(|e| inspect::InspectError(format!("listing the sinks failed: {e}")))?;
    let destination = twopc_pg::redact_url(&pg.url);
    let mut merged: Option<Report> = None;
    for sink in &sinks {
        let mut dest = operate::open_pg(pg, sink, false).map_err(fail)?;
        let mut report = inspect::inspect_destination(&mut dest, sink, &destination, opts)?;
        inspect::add_pg_target(&mut report, &mut dest);
        merged = Some(match merged {
            None => report,
            Some(mut all) => {
                all.needs_attention |= report.needs_attention;
                all.sinks.extend(report.sinks);
                all.attention.extend(report.attention);
                all.notes.extend(report.notes);
                all
            }
        });
    }
    merged.ok_or_else(|| {
        inspect::InspectError(format!(
            "{destination} has twopc control tables in schema {} but no sink has used them yet",
            pg.control_schema
        ))
    })
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
                )
                .map(|mut report| {
                    inspect::add_pg_target(&mut report, &mut dest);
                    report
                }),
                Err(f) => Err(inspect::InspectError(f.message)),
            }
        }
        (Some(pg), None) => inspect_every_pg_sink(pg, opts),
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
