//! Simulated wall time. The committer's retry backoff (`sleep_ms`) advances
//! it instead of waiting, so schedules run at full speed and their timing is
//! part of the seed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use twopc_core::memory::MemoryStore;
use twopc_core::Clock;

#[derive(Clone)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
    /// The in-memory destination stamps activity with its own notion of
    /// "now"; keeping it in step lets retention compare like with like.
    store: Option<MemoryStore>,
}

impl ManualClock {
    pub fn new(start_ms: u64, store: Option<MemoryStore>) -> Self {
        if let Some(s) = &store {
            s.set_now(start_ms);
        }
        ManualClock {
            now: Arc::new(AtomicU64::new(start_ms)),
            store,
        }
    }

    pub fn advance(&self, ms: u64) {
        let now = self.now.fetch_add(ms, Ordering::SeqCst) + ms;
        if let Some(s) = &self.store {
            s.set_now(now);
        }
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep_ms(&self, ms: u64) {
        self.advance(ms);
    }
}
