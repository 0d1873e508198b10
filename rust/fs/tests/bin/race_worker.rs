//! Test helper for `tests/races.rs`: one side of a commit/abort race, in a
//! process of its own. Reads commands from stdin, one per line, runs each
//! on its own filesystem destination over the directory given as the first
//! argument (the sink's id second, its commit order third: `durable-first`,
//! the default, or `visible-first`), and answers one line per command:
//!
//! ```text
//! commit <handle, hex>   ->  Committed | AlreadyCommitted | Missing | error: ...
//! abort <transaction>    ->  Aborted | NotFound | WasCommitted | error: ...
//! ```

use std::io::{BufRead, Write};

use twopc_core::destination::{AbortStatus, CommitStatus, Destination};
use twopc_core::ids::{SinkId, TransactionId};
use twopc_core::TransactionHandle;
use twopc_fs::{CommitOrder, FsDestination, FsOptions};

fn main() {
    let dir = std::env::args()
        .nth(1)
        .expect("usage: race_worker <output dir> <sink>");
    let sink = SinkId::new(std::env::args().nth(2).expect("sink id")).expect("valid sink id");
    let commit_order = match std::env::args().nth(3).as_deref() {
        None | Some("durable-first") => CommitOrder::DurableFirst,
        Some("visible-first") => CommitOrder::VisibleFirst,
        Some(other) => panic!("unknown commit order {other}"),
    };
    let options = FsOptions {
        commit_order,
        ..FsOptions::new(&dir)
    };
    let mut dest = FsDestination::open(options, &sink).expect("opening the destination");
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line.expect("reading a command");
        let answer = match line.split_once(' ') {
            Some(("commit", hex)) => {
                let bytes: Vec<u8> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                    .collect();
                let handle = TransactionHandle::decode(&bytes).expect("a handle");
                match dest.commit(&handle, 1) {
                    Ok(CommitStatus::Committed) => "Committed".to_string(),
                    Ok(CommitStatus::AlreadyCommitted) => "AlreadyCommitted".to_string(),
                    Ok(CommitStatus::Missing { .. }) => "Missing".to_string(),
                    Ok(CommitStatus::Refused { reason }) => format!("Refused: {reason}"),
                    Err(e) => format!("error: {e}"),
                }
            }
            Some(("abort", txn)) => {
                let txn = TransactionId::parse(txn).expect("a transaction id").id;
                match dest.abort(&txn) {
                    Ok(AbortStatus::Aborted) => "Aborted".to_string(),
                    Ok(AbortStatus::NotFound) => "NotFound".to_string(),
                    Ok(AbortStatus::WasCommitted) => "WasCommitted".to_string(),
                    Err(e) => format!("error: {e}"),
                }
            }
            _ => format!("error: unknown command {line:?}"),
        };
        writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .expect("answering");
    }
}
