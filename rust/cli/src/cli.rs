//! The command line, declared with clap: commands, options and their help.
//! Clap checks the syntax (unknown options, missing values, `--help`,
//! `--version`); the checks of meaning (a valid sink id, an option that only
//! fits a PostgreSQL destination) turn the parsed options into the commands'
//! own argument types here, with messages that say what to give instead.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use twopc_core::operator::Decision;
use twopc_core::{Clock, SinkOptions, SystemClock, TransactionId};

use crate::inspect::{self, InspectOptions};
use crate::operate::{
    self, DecideArgs, DirTarget, PgTarget, ReconcileArgs, Target, DEFAULT_PASSWORD_ENV,
};

const EXIT_CODES: &str = "\
Exit codes: 0 done, nothing needs attention; 1 something needs attention (or a
dry run found output to remove); 2 usage or I/O error; 3 refused (a live run
owns the sink, or the decision is not allowed). Set RUST_LOG=debug for
diagnostics on stderr.";

/// twopc: tools for the destinations of the twopc exactly-once Flink sink
/// (output directories and PostgreSQL tables).
#[derive(Parser, Debug)]
#[command(name = "twopc", version, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show committed and staged transactions, and what needs an operator.
    /// Changes nothing.
    #[command(
        long_about = "Lists, for every sink under <DESTINATION>/_twopc/ (or one sink of a \
                      PostgreSQL destination): committed output per lineage and run, the latest \
                      committed transactions, staged transactions (prepared or open, their age \
                      and retention), expired tombstones and problems, plus visible part files \
                      that no commit record references. Nothing is changed.",
        after_help = "Needs attention (exit code 1): any problem the scan found, any prepared \
                      transaction (each with the reason and what to do), any staged transaction \
                      past retention, any visible part file no commit record references, \
                      committed files changed after their commit, a partly visible checkpoint \
                      (a transaction of it LOST, or prepared beside committed ones), and a gap in \
                      a lineage (output committed past a lost checkpoint). Progress of long scans \
                      goes to stderr."
    )]
    Inspect(InspectCli),
    /// List (dry run) or remove (--apply) a sink's output committed after a
    /// checkpoint of a lineage, before restoring that checkpoint.
    #[command(
        long_about = "Lists this sink's output committed after checkpoint N of lineage L: what a \
                      restore of checkpoint N would write again. Nothing is changed unless \
                      --apply is given; then that output (files, or rows and their commit \
                      records) is removed, each removal logged. Repeating it is harmless: removed \
                      output is not listed again. Refused while a live run owns the sink (stop \
                      the job first); a run that starts meanwhile waits for it.",
        after_help = "Exit codes: 0 nothing to remove, or removed; 1 dry run found output (or \
                      notes of lost transactions) to remove, lost transactions at or before N, or \
                      a lineage that never ran in this sink (mistyped?); 2 usage or I/O error; 3 \
                      refused."
    )]
    Reconcile(ReconcileCli),
    /// Commit or abort one prepared leftover transaction by hand.
    #[command(
        long_about = "Resolves one staged transaction of the sink by hand, typically a prepared \
                      leftover that a job started without state refused. Commit it when its \
                      checkpoint completed (its records exist nowhere else); abort it when it did \
                      not, or when its output is not wanted. A transaction whose commit was \
                      decided is only ever committed; one never prepared, or whose prepared \
                      handle cannot be read, is never committed; committed output is never \
                      aborted (see 'twopc reconcile'). Repeating a decision is harmless. Refused \
                      while a live run owns the sink.",
        after_help = "Exit codes: 0 done (or already done); 2 usage or I/O error; 3 refused."
    )]
    Decide(DecideCli),
}

/// Options of a PostgreSQL destination (<DESTINATION> = postgres://user@host:port/db).
#[derive(Args, Debug, Default)]
pub struct PgCli {
    /// The table the sink writes to (schema.table). Needed by reconcile
    /// unless the sink recorded it at start-up (then it must agree).
    #[arg(long, value_name = "T")]
    pub table: Option<String>,
    /// The sink's transaction-id column (transactionIdColumn); reconcile
    /// --apply removes rows by it and refuses without it. Needed unless the
    /// sink recorded it at start-up (then it must agree).
    #[arg(long, value_name = "C")]
    pub transaction_id_column: Option<String>,
    /// Schema of the twopc_* control tables [default: public].
    #[arg(long, value_name = "S")]
    pub control_schema: Option<String>,
    /// Environment variable holding the password [default: PGPASSWORD]. A
    /// password in the URL is refused.
    #[arg(long, value_name = "VAR")]
    pub password_env: Option<String>,
}

#[derive(Args, Debug)]
pub struct InspectCli {
    /// An output directory, or a postgres:// URL.
    pub destination: PathBuf,
    /// Print one JSON document to stdout instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Staged-transaction retention to judge ages against, in milliseconds
    /// (pass the value the job is configured with) [default: the sink's
    /// default, 7 days].
    #[arg(long, value_name = "N")]
    pub retention_ms: Option<u64>,
    /// The run (Flink job id) prepared transactions are judged against;
    /// prepared transactions of any other run are flagged [default: the run
    /// with the latest activity in each sink].
    #[arg(long, value_name = "RUN")]
    pub run: Option<String>,
    /// Prefix of visible output files.
    #[arg(long, value_name = "P", default_value = "part")]
    pub part_prefix: String,
    /// Suffix of visible output files, e.g. `.csv` (for the commands the
    /// report prints).
    #[arg(long, value_name = "S", default_value = "")]
    pub part_suffix: String,
    /// List the latest N committed transactions per sink (counts per lineage
    /// and run, and every finding, always cover all of them) [default: 20].
    #[arg(long, value_name = "N", conflicts_with = "all")]
    pub limit: Option<usize>,
    /// List every committed transaction.
    #[arg(long)]
    pub all: bool,
    /// For a PostgreSQL destination: the sink to inspect [default: every
    /// sink the control tables know].
    #[arg(long, value_name = "S")]
    pub sink: Option<String>,
    #[command(flatten)]
    pub pg: PgCli,
}

#[derive(Args, Debug)]
pub struct ReconcileCli {
    /// The sink's output directory, or its postgres:// URL.
    pub destination: String,
    /// The sink id.
    #[arg(long, value_name = "S")]
    pub sink: String,
    /// The lineage (16 hex digits, as the job's error and 'twopc inspect'
    /// print it).
    #[arg(long, value_name = "L")]
    pub lineage: String,
    /// The checkpoint the job will be restored from.
    #[arg(long, value_name = "N")]
    pub after_checkpoint: u64,
    /// Remove the output (default: a dry run that only lists it).
    #[arg(long)]
    pub apply: bool,
    /// PostgreSQL, a sink without a transaction-id column: the rows of
    /// these transactions were deleted by hand; remove their commit records
    /// only (single or folded into history segments).
    #[arg(long, conflicts_with = "transaction_id_column")]
    pub rows_deleted_by_hand: bool,
    #[command(flatten)]
    pub dir: DirCli,
    #[command(flatten)]
    pub pg: PgCli,
}

/// Options of a directory destination: the names its sink gives its
/// files, as the sink is configured (`partPrefix`, `partSuffix`).
#[derive(Args, Debug)]
pub struct DirCli {
    /// Prefix of the sink's visible output files.
    #[arg(long, value_name = "P", default_value = "part")]
    pub part_prefix: String,
    /// Suffix of the sink's visible output files, e.g. `.csv`.
    #[arg(long, value_name = "S", default_value = "")]
    pub part_suffix: String,
}

impl DirCli {
    fn first_set(&self) -> Option<&'static str> {
        if self.part_prefix != "part" {
            Some("--part-prefix")
        } else if !self.part_suffix.is_empty() {
            Some("--part-suffix")
        } else {
            None
        }
    }
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("decision").required(true).args(["commit", "abort"])))]
pub struct DecideCli {
    /// The sink's output directory, or its postgres:// URL.
    pub destination: String,
    /// The sink id.
    #[arg(long, value_name = "S")]
    pub sink: String,
    /// Commit transaction TXN.
    #[arg(long, value_name = "TXN")]
    pub commit: Option<String>,
    /// Abort transaction TXN.
    #[arg(long, value_name = "TXN")]
    pub abort: Option<String>,
    /// Commit under the file names given (--part-prefix, --part-suffix)
    /// although the sink has published no file yet whose commit record
    /// would show its names: without it, such a commit is refused.
    #[arg(long)]
    pub names_as_given: bool,
    #[command(flatten)]
    pub dir: DirCli,
    #[command(flatten)]
    pub pg: PgCli,
}

impl PgCli {
    /// The destination, refusing PostgreSQL options for a directory.
    fn target(self, destination: String, dir: DirCli) -> Result<Target, String> {
        if !Target::is_postgres(&destination) {
            if let Some(flag) = self.first_set() {
                return Err(format!(
                    "{flag} is for a PostgreSQL destination (postgres://...), and {destination} \
                     is a directory"
                ));
            }
            twopc_core::part_names::validate_part_affixes(&dir.part_prefix, &dir.part_suffix)
                .map_err(|e| format!("--part-prefix/--part-suffix: {}", e.message()))?;
            return Ok(Target::Dir(DirTarget {
                dir: PathBuf::from(destination),
                part_prefix: dir.part_prefix,
                part_suffix: dir.part_suffix,
            }));
        }
        if let Some(flag) = dir.first_set() {
            return Err(format!(
                "{flag} is for a directory destination; a PostgreSQL sink names no files"
            ));
        }
        Ok(Target::Postgres(self.into_pg(destination)))
    }

    fn first_set(&self) -> Option<&'static str> {
        [
            ("--table", self.table.is_some()),
            (
                "--transaction-id-column",
                self.transaction_id_column.is_some(),
            ),
            ("--control-schema", self.control_schema.is_some()),
            ("--password-env", self.password_env.is_some()),
        ]
        .into_iter()
        .find(|(_, set)| *set)
        .map(|(flag, _)| flag)
    }

    fn into_pg(self, url: String) -> PgTarget {
        PgTarget {
            url,
            table: self.table,
            transaction_id_column: self.transaction_id_column,
            control_schema: self.control_schema.unwrap_or_else(|| "public".to_string()),
            password_env: self
                .password_env
                .unwrap_or_else(|| DEFAULT_PASSWORD_ENV.to_string()),
        }
    }
}

impl InspectCli {
    /// The inspection to run, and whether to print JSON.
    pub fn into_options(self) -> Result<(InspectOptions, bool), String> {
        if let Some(run) = &self.run {
            twopc_core::RunId::new(run.as_str()).map_err(|e| format!("--run: {e}"))?;
        }
        twopc_core::ids::validate_token("part prefix", &self.part_prefix, 32)
            .map_err(|e| format!("--part-prefix: {e}"))?;
        twopc_core::part_names::validate_part_affixes(&self.part_prefix, &self.part_suffix)
            .map_err(|e| format!("--part-prefix/--part-suffix: {}", e.message()))?;
        if let Some(sink) = &self.sink {
            operate::parse_sink(sink)?;
        }
        let url = self
            .destination
            .to_str()
            .filter(|d| Target::is_postgres(d))
            .map(str::to_string);
        let postgres = match url {
            Some(url) => {
                if self.pg.transaction_id_column.is_some() {
                    return Err("--transaction-id-column is for reconcile, not inspect".to_string());
                }
                Some(self.pg.into_pg(url))
            }
            None => {
                let sink = self.sink.is_some().then_some("--sink");
                if let Some(flag) = sink.or_else(|| self.pg.first_set()) {
                    return Err(format!(
                        "{flag} is for a PostgreSQL destination (postgres://...); a directory is \
                         inspected whole"
                    ));
                }
                None
            }
        };
        let limit = if self.all {
            None
        } else {
            Some(self.limit.unwrap_or(inspect::DEFAULT_LIMIT))
        };
        Ok((
            InspectOptions {
                output: self.destination,
                retention_ms: self
                    .retention_ms
                    .unwrap_or(SinkOptions::default().retention_ms),
                run: self.run,
                part_prefix: self.part_prefix,
                part_suffix: self.part_suffix,
                now_ms: SystemClock.now_ms(),
                limit,
                sink: self.sink,
                postgres,
            },
            self.json,
        ))
    }
}

impl ReconcileCli {
    pub fn into_args(self) -> Result<ReconcileArgs, String> {
        if self.rows_deleted_by_hand && !Target::is_postgres(&self.destination) {
            return Err(format!(
                "--rows-deleted-by-hand is for a PostgreSQL destination (postgres://...), and {} \
                 is a directory",
                self.destination
            ));
        }
        Ok(ReconcileArgs {
            sink: operate::parse_sink(&self.sink)?,
            lineage: operate::parse_lineage(&self.lineage)?,
            after: self.after_checkpoint,
            apply: self.apply,
            rows_deleted_by_hand: self.rows_deleted_by_hand,
            target: self.pg.target(self.destination, self.dir)?,
        })
    }
}

impl DecideCli {
    pub fn into_args(self) -> Result<DecideArgs, String> {
        let (decision, txn) = match (self.commit, self.abort) {
            (Some(txn), None) => (Decision::Commit, txn),
            (None, Some(txn)) => (Decision::Abort, txn),
            _ => return Err("give one decision: --commit TXN or --abort TXN".to_string()),
        };
        let transaction = TransactionId::parse(&txn)
            .ok_or_else(|| {
                format!(
                    "{txn:?} is not a twopc transaction id (they read \
                     <sink>.<subtask>.<nonce>.<sequence>, as the job's error and `twopc inspect` \
                     print them)"
                )
            })?
            .id;
        Ok(DecideArgs {
            sink: operate::parse_sink(&self.sink)?,
            decision,
            transaction,
            names_as_given: self.names_as_given,
            target: self.pg.target(self.destination, self.dir)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("twopc").chain(args.iter().copied()))
    }

    #[test]
    fn decide_takes_exactly_one_decision() {
        for args in [
            &["decide", "/d", "--sink", "s"][..],
            &[
                "decide", "/d", "--sink", "s", "--commit", "a", "--abort", "b",
            ][..],
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
        }
    }

    #[test]
    fn limit_and_all_exclude_each_other() {
        let e = parse(&["inspect", "/d", "--limit", "3", "--all"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let Command::Inspect(i) = parse(&["inspect", "/d", "--all"]).unwrap().command else {
            panic!("inspect")
        };
        assert_eq!(i.into_options().unwrap().0.limit, None);
    }

    #[test]
    fn postgres_options_are_refused_for_a_directory() {
        let Command::Reconcile(r) = parse(&[
            "reconcile",
            "/d",
            "--sink",
            "s",
            "--lineage",
            "1f",
            "--after-checkpoint",
            "3",
            "--table",
            "t",
        ])
        .unwrap()
        .command
        else {
            panic!("reconcile")
        };
        let e = r.into_args().err().unwrap();
        assert!(e.contains("--table is for a PostgreSQL destination"), "{e}");
    }

    #[test]
    fn rows_deleted_by_hand_is_for_postgres_and_excludes_a_column() {
        let reconcile = |dest: &str, extra: &[&str]| {
            let args = [
                &[
                    "reconcile",
                    dest,
                    "--sink",
                    "s",
                    "--lineage",
                    "1f",
                    "--after-checkpoint",
                    "3",
                    "--rows-deleted-by-hand",
                ][..],
                extra,
            ]
            .concat();
            parse(&args)
        };
        let Command::Reconcile(r) = reconcile("/d", &[]).unwrap().command else {
            panic!("reconcile")
        };
        let e = r.into_args().err().unwrap();
        assert!(
            e.contains("--rows-deleted-by-hand is for a PostgreSQL destination"),
            "{e}"
        );
        let Command::Reconcile(r) = reconcile("postgres://u@h/db", &[]).unwrap().command else {
            panic!("reconcile")
        };
        assert!(r.into_args().unwrap().rows_deleted_by_hand);
        let e = reconcile("postgres://u@h/db", &["--transaction-id-column", "txn"]).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
    }
}
