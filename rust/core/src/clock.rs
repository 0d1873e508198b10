//! Time as an input. The protocol asks a clock for the wall time (retention
//! is measured across processes, so it is wall time) and to wait between
//! commit retries; the simulation supplies a clock it controls.

pub trait Clock {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// Waits before a retry.
    fn sleep_ms(&self, ms: u64);
}

/// The real clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
    fn sleep_ms(&self, ms: u64) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
    fn sleep_ms(&self, ms: u64) {
        (**self).sleep_ms(ms)
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
    fn sleep_ms(&self, ms: u64) {
        (**self).sleep_ms(ms)
    }
}
