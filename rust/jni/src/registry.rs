//! Open writers, committers and sinks, reached from Java by opaque ids.
//!
//! Java never holds a pointer: a stale, closed or forged id can then only
//! miss the map (an `IllegalStateException`), never dereference freed or
//! foreign memory. Ids are a counter passed through a bijection keyed with
//! a random per-library salt, so they are unique within one library copy,
//! never 0 (Java's "no sink"), and an id of one class loader's copy of the
//! library (a previous job attempt under Flink) is unlikely to name a sink
//! of another.
//!
//! Each sink sits behind its own mutex: two Java threads calling into the
//! same sink are serialised rather than racing on the writer state. The
//! registry lock is held only to look an id up, never during I/O.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use twopc_core::{CommitterSession, Destination, SubtaskSink, SystemClock, WriterSession};

use crate::error::{BridgeError, BridgeResult};

/// A destination of whichever kind the configuration named: the entry
/// points after `open` do not care which.
pub(crate) type AnyDestination = Box<dyn Destination + Send>;

/// The SinkFunction shim's writer and committer in one.
pub(crate) type Sink = SubtaskSink<AnyDestination, SystemClock>;

/// The SinkFunction shim's sink, with what the bridge remembers of it.
/// Dereferences to the sink: the entry points call it as they would the
/// sink itself.
pub(crate) struct SinkEntry {
    pub sink: Sink,
    /// As [`CommitterEntry::last_visible_nanos`].
    pub last_visible_nanos: i64,
}

impl std::ops::Deref for SinkEntry {
    type Target = Sink;

    fn deref(&self) -> &Sink {
        &self.sink
    }
}

impl std::ops::DerefMut for SinkEntry {
    fn deref_mut(&mut self) -> &mut Sink {
        &mut self.sink
    }
}

/// A Sink V2 writer and its destination.
pub(crate) struct WriterEntry {
    pub session: WriterSession,
    pub dest: AnyDestination,
}

/// A Sink V2 committer and its destination.
pub(crate) struct CommitterEntry {
    pub session: CommitterSession,
    pub dest: AnyDestination,
    /// Nanoseconds from the start of the last commit call until its output
    /// was visible, where the destination tells; -1 otherwise.
    pub last_visible_nanos: i64,
}

/// What an id names.
pub(crate) enum Native {
    // Boxed: the three differ in size, and an entry lives on the heap anyway.
    Sink(Box<SinkEntry>),
    Writer(Box<WriterEntry>),
    Committer(Box<CommitterEntry>),
}

impl Native {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Native::Sink(_) => "sink",
            Native::Writer(_) => "writer",
            Native::Committer(_) => "committer",
        }
    }
}

type Shared = Arc<Mutex<Native>>;

static SINKS: LazyLock<Mutex<HashMap<i64, Shared>>> = LazyLock::new(Default::default);
static NEXT: AtomicU64 = AtomicU64::new(1);
static SALT: LazyLock<u64> = LazyLock::new(twopc_core::ids::random_u64);

/// Odd, so multiplying by it is a bijection on u64.
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

fn mint_id() -> i64 {
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = ((n ^ *SALT).wrapping_mul(MIX)) as i64;
        if id != 0 {
            return id;
        }
    }
}

/// The registry only inserts and removes whole entries, so a panic while it
/// was locked cannot have left the map half-updated: its poison flag carries
/// no information and is ignored.
fn sinks() -> MutexGuard<'static, HashMap<i64, Shared>> {
    SINKS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn unknown(id: i64) -> BridgeError {
    BridgeError::illegal_state(format!(
        "twopc native sink #{id} is closed or was never opened"
    ))
}

/// Set by [`remove_all`]: this copy of the library is being released with
/// its class loader, and opens nothing more.
static RELEASED: AtomicBool = AtomicBool::new(false);

pub(crate) fn insert(native: Native) -> BridgeResult<i64> {
    let mut sinks = sinks();
    // Checked under the registry lock, so nothing is inserted after
    // remove_all drained the map.
    if RELEASED.load(Ordering::SeqCst) {
        return Err(BridgeError::illegal_state(
            "this copy of the twopc native library was released with its job's class loader \
             (the job left this TaskManager); it opens no sink any more. The task is being \
             cancelled; Flink restarts it with a new class loader",
        ));
    }
    let id = mint_id();
    sinks.insert(id, Arc::new(Mutex::new(native)));
    Ok(id)
}

/// Runs `f` on the object `id`, holding its lock, with the calling
/// thread's interrupt as the core's interrupt check (`crate::interrupt`).
pub(crate) fn with_native<R>(
    id: i64,
    f: impl FnOnce(&mut Native) -> BridgeResult<R>,
) -> BridgeResult<R> {
    let shared = sinks().get(&id).cloned().ok_or_else(|| unknown(id))?;
    // Unlike the registry, a sink poisoned by a panic mid-operation may hold
    // a half-updated writer: refuse further use instead of guessing. Close
    // still works, and the job restarts into a fresh sink.
    let mut sink = shared.lock().map_err(|_| {
        BridgeError::illegal_state(format!(
            "twopc native sink #{id} is unusable: an earlier call on it failed with an internal \
             error (Rust panic) part way through; close it and restart from the last checkpoint"
        ))
    })?;
    crate::interrupt::checked(|| f(&mut sink))
}

/// Removes the sink `id`. A call still running on it (another thread) keeps
/// its own reference and finishes; the sink is dropped after it.
pub(crate) fn remove(id: i64) -> BridgeResult<()> {
    let removed = sinks().remove(&id).ok_or_else(|| unknown(id))?;
    drop(removed);
    Ok(())
}

/// Removes every entry and refuses new ones, for the release of the
/// library: returns what was still open, by kind ("busy" for one a call is
/// still using). It never waits for a call: one still running keeps its own
/// reference, finishes, and drops the object then, as with [`remove`].
pub(crate) fn remove_all() -> Vec<&'static str> {
    let drained: Vec<Shared> = {
        let mut sinks = sinks();
        RELEASED.store(true, Ordering::SeqCst);
        sinks.drain().map(|(_, shared)| shared).collect()
    };
    drained
        .into_iter()
        .map(|shared| match shared.try_lock() {
            Ok(native) => native.kind(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().kind(),
            Err(std::sync::TryLockError::WouldBlock) => "busy",
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_unique_and_never_zero() {
        let ids: HashSet<i64> = (0..10_000).map(|_| mint_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(!ids.contains(&0));
    }

    #[test]
    fn unknown_ids_are_refused() {
        for id in [0, 12345, i64::MIN, i64::MAX, -1] {
            let err = with_native(id, |_| Ok(())).unwrap_err();
            assert!(
                err.to_string().contains("is closed or was never opened"),
                "{err}"
            );
            assert!(remove(id).is_err());
        }
    }
}
