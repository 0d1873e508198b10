//! The step-by-step story of one schedule. Off while the batch runs
//! (formatting every step of 10,000 schedules would dominate the run time);
//! a seed given with `TWOPC_SIM_SEED`, or a failing one, is replayed with it
//! on, together with the core's own log lines.

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Clone, Copy, Debug, Default)]
pub struct Trace {
    on: bool,
}

impl Trace {
    pub fn new(on: bool) -> Self {
        CORE_LOG.enabled.store(on, Ordering::Relaxed);
        log::set_max_level(if on {
            log::LevelFilter::Debug
        } else {
            log::LevelFilter::Off
        });
        Trace { on }
    }

    pub fn on(&self) -> bool {
        self.on
    }

    pub fn line(&self, text: impl AsRef<str>) {
        if self.on {
            println!("  {}", text.as_ref());
        }
    }
}

/// Prints the core's `log` output inside a trace, so a replay shows the
/// protocol's own decisions (lingering aborts, retractions, retries).
struct CoreLog {
    enabled: AtomicBool,
}

static CORE_LOG: CoreLog = CoreLog {
    enabled: AtomicBool::new(false),
};

impl log::Log for CoreLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            println!("      core {:5}: {}", record.level(), record.args());
        }
    }

    fn flush(&self) {}
}

/// Installs the logger once per process; it stays silent until a trace is on.
pub fn install_core_logger() {
    let _ = log::set_logger(&CORE_LOG);
    log::set_max_level(log::LevelFilter::Off);
}
