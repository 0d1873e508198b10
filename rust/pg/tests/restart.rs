//! Prepared transactions survive a server restart and are committed after
//! it: by the running sink (its sessions broke; the commit reconnects) and
//! by a restored one. Alone in its own test binary because a restart cuts
//! every session on the server: cargo runs test binaries one at a time.
//!
//! The restart runs `scripts/postgres.sh restart` for the port in
//! TWOPC_PG_URL, or the shell command in TWOPC_PG_RESTART_CMD if set (for a
//! server the script did not start).

#[macro_use]
mod common;

use std::process::Command;

use common::*;
use twopc_core::committer::CommitOutcome;

fn restart_server(url: &str) {
    let status = match std::env::var("TWOPC_PG_RESTART_CMD") {
        Ok(cmd) if !cmd.trim().is_empty() => Command::new("sh").arg("-c").arg(&cmd).status(),
        _ => {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/postgres.sh");
            Command::new("bash")
                .arg(script)
                .arg("restart")
                .env("TWOPC_PG_PORT", port_of(url).to_string())
                .status()
        }
    };
    let status = status.expect("running the restart command");
    assert!(
        status.success(),
        "restarting the server failed ({status}); set TWOPC_PG_RESTART_CMD to a command that \
         restarts the server behind TWOPC_PG_URL"
    );
}

#[test]
fn prepared_transactions_survive_a_server_restart_and_are_committed() {
    let url = server!();
    let mut f = Fixture::new(&url, "restart");

    let mut s = f.open("run1");
    let h1 = prepared(&mut s, &rows(0..100, "a"), 1);
    let h2 = prepared(&mut s, &rows(100..150, "b"), 2);

    restart_server(&url);

    f.reconnect();
    let mut gids = vec![h1.transaction.to_string(), h2.transaction.to_string()];
    gids.sort();
    assert_eq!(f.prepared_gids(), gids, "prepared survive the restart");
    assert_eq!(f.count(), 0, "and stay invisible");
    assert_eq!(f.side_rows(), gids, "handles too");

    // The running sink's control session died with the server: its commit
    // meets the broken session, and the core's retry reconnects and commits.
    capture_logs();
    assert_eq!(s.commit(&h1).unwrap(), CommitOutcome::Committed);
    let retried = commit_log(&h1);
    assert!(
        retried.iter().any(|l| l.contains("attempt 1/")),
        "the first attempt must have met the broken session: {retried:?}"
    );
    assert_eq!(f.count(), 100);

    // The job is restored from checkpoint 2 after the restart (new process):
    // recovery commits the prepared transaction by id.
    drop(s);
    let mut r = f.open_restored("run1", &restore_from(2, &[&h1, &h2]));
    assert_eq!(r.commit(&h1).unwrap(), CommitOutcome::AlreadyCommitted);
    assert_eq!(r.commit(&h2).unwrap(), CommitOutcome::Committed);
    assert_eq!(f.count(), 150);
    assert!(f.prepared_gids().is_empty());

    // The writer session is usable again after the restart.
    committed(&mut r, &rows(150..160, "c"), 3);
    assert_eq!(f.count(), 160);
}
