//! Ownership of a sink's share of an output directory: one lock file per
//! sink and subtask, `_twopc/<sink>/owners/<subtask>`, locked with
//! `flock(LOCK_EX|LOCK_NB)` for as long as the writer runs, and holding the
//! owner's claim in plain text for the next one to read.
//!
//! Why a lock and not a lease with heartbeats: the kernel releases a lock
//! when its process dies, however it dies (kill -9, a crashed JVM), so a
//! crashed run is taken over at once and safely, with no clock and no
//! timeout to tune. Two writers in one JVM exclude each other too, because
//! `flock` locks belong to open files, not processes.
//!
//! On NFS, Linux implements `flock` with the server's byte-range locks
//! (NFSv4, or NFSv3 with lockd): the lock works across clients, and a
//! client that crashed loses it when its lease with the server expires
//! (90 s by default), which is when a new run can take over. A mount with
//! `local_lock=flock` or `nolock` keeps locks on one client only: twopc
//! then cannot see a writer on another machine, so do not share such a
//! mount between two jobs with one sink id. A file system without locks
//! (ENOLCK, EOPNOTSUPP) is refused at open with a message saying so.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};

use twopc_core::destination::{OwnerClaim, OwnerInfo, Ownership};
use twopc_core::ids::{RunId, SinkId};

use crate::dir::Dir;

/// How often, and how far apart, a held lock's claim is read before it
/// counts as unreadable (about half a second in all).
const CLAIM_READ_ATTEMPTS: u32 = 25;
const CLAIM_READ_PAUSE_MS: u64 = 20;
/// More than any claim this module writes (`render`).
const MAX_CLAIM_BYTES: u64 = 4096;

/// Tries to take the lock of `claim.subtask` in `owners`. On success the
/// returned file holds it (drop it to release).
pub(crate) fn claim(owners: &Dir, claim: &OwnerClaim) -> io::Result<(Ownership, Option<File>)> {
    let name = claim.subtask.to_string();
    let mut file = owners.open_or_create(&name)?;
    if let Some(holder) = lock_or_holder(&mut file, owners, claim)? {
        return Ok((Ownership::HeldBy(holder), None));
    }
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(render(claim).as_bytes())?;
    file.sync_data()?;
    Ok((Ownership::Acquired, Some(file)))
}

/// Checks that `held`, the file through which this process took the lock
/// of `claim.subtask`, holds it still. Locking it again is a no-op for the
/// holder; it fails only when the lock was lost meanwhile (an NFS client
/// whose lease with the server expired while it was cut off, and another
/// client took the lock since): then the new holder is named.
pub(crate) fn confirm(owners: &Dir, held: &mut File, claim: &OwnerClaim) -> io::Result<Ownership> {
    Ok(match lock_or_holder(held, owners, claim)? {
        None => Ownership::Acquired,
        Some(holder) => Ownership::HeldBy(holder),
    })
}

/// Locks `file` (`None`), or names who holds its lock.
fn lock_or_holder(
    file: &mut File,
    owners: &Dir,
    claim: &OwnerClaim,
) -> io::Result<Option<OwnerInfo>> {
    let name = claim.subtask.to_string();
    match rustix::fs::flock(&*file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(None),
        Err(rustix::io::Errno::WOULDBLOCK) => {
            // The holder writes its claim right after locking: a claim
            // that is empty or half-written is read again for a moment
            // before it counts as unknown (two sinks starting together
            // would otherwise see each other's lock without its record).
            let mut text = String::new();
            let mut parsed = None;
            for _ in 0..CLAIM_READ_ATTEMPTS {
                text.clear();
                file.seek(SeekFrom::Start(0))?;
                // A claim is a few hundred bytes; a larger file is not one,
                // and is not read whole (25 times over) into memory.
                (&mut *file)
                    .take(MAX_CLAIM_BYTES)
                    .read_to_string(&mut text)
                    .ok();
                parsed = parse(&text, &claim.sink, claim.subtask);
                if parsed.is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(CLAIM_READ_PAUSE_MS));
            }
            Ok(Some(OwnerInfo {
                claim: parsed,
                holder: describe(&text, owners, &name),
            }))
        }
        Err(e) => Err(lock_failed(e, &owners.child(&name))),
    }
}

/// A file system that takes no file locks: a configuration error (no
/// restart changes it), told apart by its type because the message
/// wrapped around it hides the errno (found by review: it was read as a
/// retryable I/O error, and the job restarted over and over).
#[derive(Debug)]
pub(crate) struct LocksUnsupported(String);

impl std::fmt::Display for LocksUnsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LocksUnsupported {}

impl LocksUnsupported {
    /// Whether `e` says that the file system takes no locks.
    pub(crate) fn is(e: &io::Error) -> bool {
        e.get_ref()
            .is_some_and(|inner| inner.is::<LocksUnsupported>())
    }
}

/// The error of a failed `flock` of `path`: [`LocksUnsupported`] where the
/// file system takes no locks, else the errno as it is.
fn lock_failed(e: rustix::io::Errno, path: &std::path::Path) -> io::Error {
    match e {
        rustix::io::Errno::NOLCK | rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS => {
            io::Error::new(
                io::Error::from(e).kind(),
                LocksUnsupported(format!(
                    "locking {} failed ({e}): this file system does not support file locks, so \
                     twopc cannot make sure that no second job writes with the same sink id. \
                     Use a local file system, or NFSv4 (or NFSv3 with lockd) without \
                     local_lock/nolock",
                    path.display()
                )),
            )
        }
        other => io::Error::from(other),
    }
}

fn render(c: &OwnerClaim) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!(
        "sink={}\nsubtask={}\nrun={}\nattempt={}\ninstance={:016x}\nhost={host}\npid={}\nsince_ms={since}\n",
        c.sink,
        c.subtask,
        c.run,
        c.attempt,
        c.instance,
        std::process::id()
    )
}

fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// Reads a claim back; `None` when it is not a complete claim for this
/// sink and subtask.
fn parse(text: &str, sink: &SinkId, subtask: u32) -> Option<OwnerClaim> {
    let claim = OwnerClaim {
        sink: SinkId::new(field(text, "sink")?).ok()?,
        subtask: field(text, "subtask")?.parse().ok()?,
        run: RunId::new(field(text, "run")?).ok()?,
        attempt: field(text, "attempt")?.parse().ok()?,
        instance: u64::from_str_radix(field(text, "instance")?, 16).ok()?,
    };
    (&claim.sink == sink && claim.subtask == subtask).then_some(claim)
}

fn describe(text: &str, owners: &Dir, name: &str) -> String {
    let path = owners.child(name);
    match (field(text, "run"), field(text, "host"), field(text, "pid")) {
        (Some(run), Some(host), Some(pid)) => format!(
            "run {run} (attempt {}) holds it from host {host}, process {pid}, since {} (lock \
             file {})",
            field(text, "attempt").unwrap_or("?"),
            field(text, "since_ms")
                .and_then(|ms| ms.parse().ok())
                .map_or_else(
                    || "an unknown time".to_string(),
                    twopc_core::clock::format_utc
                ),
            path.display()
        ),
        _ => format!("a process holds the lock file {}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_system_without_locks_is_told_apart_from_other_lock_failures() {
        let path = std::path::Path::new("/out/_twopc/s/owners/0");
        for errno in [rustix::io::Errno::NOLCK, rustix::io::Errno::OPNOTSUPP] {
            let e = super::lock_failed(errno, path);
            assert!(super::LocksUnsupported::is(&e), "{e}");
            assert!(e.to_string().contains("does not support file locks"), "{e}");
        }
        let e = super::lock_failed(rustix::io::Errno::INTR, path);
        assert!(!super::LocksUnsupported::is(&e), "{e}");
        assert_eq!(
            e.raw_os_error(),
            Some(rustix::io::Errno::INTR.raw_os_error())
        );
    }

    use super::*;
    use crate::faults::FaultHook;

    fn claim_of(run: &str, instance: u64) -> OwnerClaim {
        OwnerClaim {
            sink: SinkId::new("orders").unwrap(),
            subtask: 0,
            run: RunId::new(run).unwrap(),
            attempt: 0,
            instance,
        }
    }

    /// Two sinks starting together: the second meets the first's lock
    /// before its claim is written, and must still name it (not report an
    /// unreadable owner).
    #[test]
    fn a_claim_written_just_after_locking_is_still_read() {
        let root = std::env::temp_dir().join(format!(
            "twopc-owner-{:016x}",
            twopc_core::ids::random_u64()
        ));
        std::fs::create_dir_all(&root).unwrap();
        let owners = Dir::open_path(&root, FaultHook::default()).unwrap();
        let holder = owners.open_or_create("0").unwrap();
        rustix::fs::flock(
            &holder,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        )
        .unwrap();
        let first = claim_of("a1b2c3d4e5f60718293a4b5c6d7e8f90", 1);
        let late = {
            let first = first.clone();
            let mut holder = holder.try_clone().unwrap();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(150));
                holder.write_all(render(&first).as_bytes()).unwrap();
            })
        };
        let (ownership, file) =
            claim(&owners, &claim_of("ffffffffffffffffffffffffffffffff", 2)).unwrap();
        late.join().unwrap();
        assert!(file.is_none());
        match ownership {
            Ownership::HeldBy(info) => {
                assert_eq!(info.claim, Some(first));
                assert!(
                    info.holder.contains("a1b2c3d4e5f60718293a4b5c6d7e8f90"),
                    "{}",
                    info.holder
                );
            }
            other => panic!("expected the lock to be held, got {other:?}"),
        }
        drop(holder);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
