//! Ownership of a subtask's share of the sink: a lease object per subtask,
//! `_twopc/<sink>/owners/<subtask>`, because an object store has no locks.
//!
//! # How
//!
//! * Claim: read the lease. None: create it with `PutMode::Create`
//!   (If-None-Match: `*`): of two claimants exactly one create succeeds.
//!   One that expired, or one of an older attempt of the same run and sink
//!   operator (a failover), or our own: replace it with `PutMode::Update`
//!   (If-Match: the ETag read), so that of two claimants taking over the
//!   same expired lease exactly one wins. Otherwise: `HeldBy`. A write that
//!   fails in transit is read back: if the lease now holds this claim, the
//!   write landed with its answer lost, and the lease is held (and
//!   released) as acquired, instead of barring everyone until it lapses.
//! * Renewal: the holder renews (If-Match its own last ETag) when a third
//!   of the lease has passed, at its next call (every write, prepare and
//!   commit passes by). A renewal that finds another ETag means someone
//!   took the lease over: the call fails with `NotPermitted`, so this
//!   writer stops instead of working next to the new owner. (Unless the
//!   lease read back still holds this writer's claim: then the other ETag
//!   came from its own earlier write whose answer was lost.)
//! * Fence before clean-up: a call that removes or changes transactions
//!   other than the one this writer has open (abort, expiry, retraction,
//!   listing staged transactions, which records unrecorded completions,
//!   and history compaction) first renews every lease held, whatever its
//!   age (`ObjectStoreDestination::fence`). A renewal counts for the
//!   clean-up calls of the next moment (one pass), so a pass costs one
//!   conditional PUT per lease, not one per transaction. A failover takes
//!   the lease over at once (a newer attempt of the same operator needs no
//!   expiry), so without this an older attempt that lives on (a
//!   TaskManager cut off from the JobManager) could abort or expire the
//!   newer attempt's transactions for as long as its own renewal was not
//!   due. The Sink V2 committer claims no lease (its writer, a separate
//!   destination, does); told which attempt it works for
//!   (`ObjectStoreDestination::watch_ownership`), it reads the lease of
//!   the share it cleans up in instead (one GET per share and pass) and
//!   is refused once a newer attempt holds it. A committer that was never
//!   told has nothing to check.
//! * Release, when the destination is dropped: the lease is rewritten as
//!   expired (If-Match), never deleted, so a release cannot remove a
//!   successor's lease.
//!
//! # Limits (honestly)
//!
//! A lease is not a lock. Expiry is judged by the claimant's wall clock
//! against the holder's: clocks skewed by more than the margin, or a
//! holder paused (GC, VM freeze) for longer than the lease without a call
//! that would notice, let two writers overlap until the old one's next
//! renewal fails. S3 has no fencing token to refuse the old writer's
//! requests meanwhile. What an overlap can do is bounded by the protocol:
//! commits and aborts are atomic per upload (complete vs. abort: exactly
//! one wins, see `destination`), so an overlap can abort the other
//! writer's transactions (which then fail their checkpoint, or are found
//! LOST at commit and stop the job with evidence), never publish a
//! transaction twice or half. The fence before clean-up narrows this, it
//! does not close it: a takeover between a fence and the requests that
//! follow it (within the second a fence counts for) goes unnoticed, and
//! the write and commit path is not fenced at all (its lease is renewed
//! only when a third of it has passed). A late commit of a retracted
//! transaction is caught by the retraction's tombstone instead (see the
//! crate docs). An idle writer (no records for longer than
//! the lease) does not renew; its lease lapses and a newcomer may take
//! over, which that writer learns at its next call.

use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use twopc_core::destination::{OwnerClaim, OwnerInfo};
use twopc_core::error::{DestinationError, DestinationErrorKind};

use crate::control::{decode, encode, ControlObject, LeaseRecord, MAX_CONTROL_OBJECT};

/// A lease this destination holds.
#[derive(Clone, Debug)]
pub(crate) struct HeldLease {
    pub key: Path,
    pub record: LeaseRecord,
    pub version: UpdateVersion,
    pub renewed_at_ms: u64,
}

pub(crate) enum Claimed {
    Acquired(HeldLease),
    HeldBy(OwnerInfo),
}

fn holder_of_this_process() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".to_string());
    format!("{host} pid {}", std::process::id())
}

fn store_err(what: &str, key: &Path, e: object_store::Error) -> DestinationError {
    DestinationError::new(
        DestinationErrorKind::Io,
        format!("{what} the ownership lease {key}: {e}"),
    )
}

/// Claims the lease at `key` for `claim` until `now_ms + lease_ms`.
pub(crate) async fn claim(
    store: &AmazonS3,
    key: Path,
    claim: &OwnerClaim,
    lease_ms: u64,
    now_ms: u64,
) -> Result<Claimed, DestinationError> {
    let record = LeaseRecord {
        sink: claim.sink.clone(),
        subtask: claim.subtask,
        run: claim.run.clone(),
        attempt: claim.attempt,
        instance: claim.instance,
        holder: holder_of_this_process(),
        acquired_at_ms: now_ms,
        expires_at_ms: now_ms.saturating_add(lease_ms),
    };
    let payload = || PutPayload::from(encode(&ControlObject::Lease(record.clone())));
    // Each round sees a later state; a claimant that keeps losing races
    // reports the winner.
    for _ in 0..4 {
        let current = match store.get(&key).await {
            Ok(got) => {
                let version = UpdateVersion {
                    e_tag: got.meta.e_tag.clone(),
                    version: got.meta.version.clone(),
                };
                let bytes = lease_bytes(got, &key).await?;
                Some((bytes, version))
            }
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(store_err("reading", &key, e)),
        };
        let mode = match current {
            None => PutMode::Create,
            Some((bytes, version)) => {
                let held = match decode(&bytes) {
                    Ok(ControlObject::Lease(l)) => l,
                    Ok(_) | Err(_) => {
                        return Err(DestinationError::corrupt(format!(
                            "the ownership lease {key} is not a readable lease; delete it if no \
                             job writes this sink's subtask {} now, then start again",
                            claim.subtask
                        )))
                    }
                };
                let same_operator = held.run == claim.run && held.instance == claim.instance;
                let free = held.expires_at_ms <= now_ms
                    || (same_operator && held.attempt <= claim.attempt);
                if !free {
                    return Ok(Claimed::HeldBy(OwnerInfo {
                        claim: Some(OwnerClaim {
                            sink: held.sink.clone(),
                            subtask: held.subtask,
                            run: held.run.clone(),
                            attempt: held.attempt,
                            instance: held.instance,
                        }),
                        holder: format!(
                            "{} since {}, lease until {} ({key})",
                            held.holder,
                            twopc_core::timefmt::utc(held.acquired_at_ms),
                            twopc_core::timefmt::utc(held.expires_at_ms)
                        ),
                    }));
                }
                PutMode::Update(version)
            }
        };
        match store
            .put_opts(&key, payload(), PutOptions::from(mode))
            .await
        {
            Ok(result) => {
                return Ok(Claimed::Acquired(HeldLease {
                    key,
                    record,
                    version: UpdateVersion::from(result),
                    renewed_at_ms: now_ms,
                }))
            }
            // Another claimant was faster (or our own write, resent after
            // its answer was lost): look again.
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => continue,
            // The write may have landed with its answer lost: then the lease
            // is ours, and must be held (and released) as ours, or it
            // would bar everyone else until it lapses.
            Err(e) => {
                return match read_own(store, &key, &record).await {
                    Ok(Some(version)) => Ok(Claimed::Acquired(HeldLease {
                        key,
                        record,
                        version,
                        renewed_at_ms: now_ms,
                    })),
                    // Not ours, or not readable either: the write's own
                    // error says what happened.
                    Ok(None) | Err(_) => Err(store_err("writing", &key, e)),
                };
            }
        }
    }
    Err(DestinationError::new(
        DestinationErrorKind::Io,
        format!(
            "the ownership lease {key} kept changing while subtask {} claimed it; try again",
            claim.subtask
        ),
    ))
}

/// Renews `held` until `now_ms + lease_ms`, or writes it expired when
/// `release`. An error when someone else's write came in between.
pub(crate) async fn rewrite(
    store: &AmazonS3,
    held: &mut HeldLease,
    lease_ms: u64,
    now_ms: u64,
    release: bool,
) -> Result<(), DestinationError> {
    let mut record = held.record.clone();
    record.expires_at_ms = if release {
        now_ms.min(record.expires_at_ms).saturating_sub(1)
    } else {
        now_ms.saturating_add(lease_ms)
    };
    let mut read_back = false;
    loop {
        let mode = PutMode::Update(held.version.clone());
        let put = store
            .put_opts(
                &held.key,
                PutPayload::from(encode(&ControlObject::Lease(record.clone()))),
                PutOptions::from(mode),
            )
            .await;
        match put {
            Ok(result) => {
                held.version = UpdateVersion::from(result);
                held.record = record;
                held.renewed_at_ms = now_ms;
                return Ok(());
            }
            // An earlier write of ours whose answer was lost (a renewal
            // that failed, or this one resent) changed the ETag: the lease
            // is still ours if it holds our claim. Looked at once.
            Err(object_store::Error::Precondition { .. }) if !read_back => {
                read_back = true;
                // A lease read back and found another's is a takeover; one
                // that could not be read (the store failing) is not known
                // to be one, and stays a failure a retry may get past
                // (found by review: it stopped the job as fenced out).
                match read_own(store, &held.key, &held.record).await? {
                    Some(version) => {
                        held.version = version;
                        continue;
                    }
                    None => return Err(taken_over(held)),
                }
            }
            Err(object_store::Error::Precondition { .. })
            | Err(object_store::Error::NotFound { .. }) => return Err(taken_over(held)),
            Err(e) => return Err(store_err("renewing", &held.key, e)),
        }
    }
}

fn taken_over(held: &HeldLease) -> DestinationError {
    DestinationError::new(
        DestinationErrorKind::NotPermitted,
        format!(
            "subtask {} of sink '{}' lost its ownership lease {}: another writer took it over \
             after it lapsed (this writer was idle or paused longer than the lease). This writer \
             stops; the job restarts from its last checkpoint. If two jobs write the same sink \
             id, give one of them another sink id",
            held.record.subtask, held.record.sink, held.key
        ),
    )
}

/// A lease object's bytes, refused unread when it is larger than any
/// lease: a hostile or misplaced object would otherwise be buffered whole.
async fn lease_bytes(
    got: object_store::GetResult,
    key: &Path,
) -> Result<bytes::Bytes, DestinationError> {
    if got.meta.size > MAX_CONTROL_OBJECT as u64 {
        return Err(DestinationError::corrupt(format!(
            "the ownership lease {key} has {} bytes, more than any lease of twopc; it is not a \
             readable lease. Delete it if no job writes this share of the sink now",
            got.meta.size
        )));
    }
    got.bytes().await.map_err(|e| store_err("reading", key, e))
}

/// The lease record at `key` as it is now (for the message of a refused
/// clean-up: who took the share over); `None` when absent or unreadable.
pub(crate) async fn current(store: &AmazonS3, key: &Path) -> Option<LeaseRecord> {
    read(store, key).await.ok().flatten()
}

/// The lease record at `key`: `None` when absent, an error when it cannot
/// be read or is not a lease.
pub(crate) async fn read(
    store: &AmazonS3,
    key: &Path,
) -> Result<Option<LeaseRecord>, DestinationError> {
    let got = match store.get(key).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(store_err("reading", key, e)),
    };
    let bytes = lease_bytes(got, key).await?;
    match decode(&bytes) {
        Ok(ControlObject::Lease(l)) => Ok(Some(l)),
        Ok(_) | Err(_) => Err(DestinationError::corrupt(format!(
            "the ownership lease {key} is not a readable lease; delete it if no job writes this \
             share of the sink now"
        ))),
    }
}

/// For a destination that holds no lease but works for the attempt
/// `ours` (the Sink V2 committer: its writer holds the lease): whether
/// `held`, the lease of the share it is about to clean up in, says that
/// another attempt owns that share now. A newer attempt of the same run
/// does, whatever the lease's expiry (a failover takes over at once);
/// another run does while its lease is live (an expired one of an earlier
/// run is a leftover). No lease, this attempt's, or an older attempt's: go
/// ahead. The operator instance is not compared: the writer's instance is
/// mixed with its operator's id, which the committer does not know (found
/// by the integration tests: every committer refused its own writer's
/// lease). Two sink operators of one job with one sink id are refused by
/// their writers at the start.
pub(crate) fn superseded_by(ours: &OwnerClaim, held: Option<&LeaseRecord>, now_ms: u64) -> bool {
    match held {
        None => false,
        Some(l) if l.run == ours.run => l.attempt > ours.attempt,
        Some(l) => l.expires_at_ms > now_ms,
    }
}

/// The version of the lease at `key` if it is `ours` (the same claim of
/// the same process, whatever its expiry): what a write whose answer was
/// lost left. `None` when it is absent or another's (or not a lease); an
/// error when it could not be read.
async fn read_own(
    store: &AmazonS3,
    key: &Path,
    ours: &LeaseRecord,
) -> Result<Option<UpdateVersion>, DestinationError> {
    let got = match store.get(key).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(store_err("reading", key, e)),
    };
    let version = UpdateVersion {
        e_tag: got.meta.e_tag.clone(),
        version: got.meta.version.clone(),
    };
    let bytes = match lease_bytes(got, key).await {
        Ok(bytes) => bytes,
        // Too large to be any lease of ours: not ours.
        Err(e) if e.kind == DestinationErrorKind::Corrupt => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(match decode(&bytes) {
        Ok(ControlObject::Lease(l))
            if l.sink == ours.sink
                && l.subtask == ours.subtask
                && l.run == ours.run
                && l.attempt == ours.attempt
                && l.instance == ours.instance
                && l.holder == ours.holder
                && l.acquired_at_ms == ours.acquired_at_ms =>
        {
            Some(version)
        }
        _ => None,
    })
}
