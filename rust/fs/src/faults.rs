//! Injected I/O faults, for tests and the crash simulation: every step of
//! the filesystem destination that touches the disk asks a hook first (and
//! after), so a test can fail exactly that step with the error a full disk
//! or a dying device gives, and check that nothing is lost or published
//! wrong.

use std::io;
use std::path::Path;
use std::sync::Arc;

/// One kind of I/O step of the filesystem destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IoStep {
    /// Appending staged records to a transaction's data file.
    Write,
    /// Syncing a data file (at prepare, or the background write-back).
    DataSync,
    /// Writing a prepare marker.
    Marker,
    /// Writing a commit record.
    CommitRecord,
    /// Writing an expiry tombstone or a lineage record.
    Note,
    /// Claiming a staged transaction for a commit or an abort (a rename).
    Claim,
    /// Publishing committed output under its visible name (a rename).
    Publish,
    /// Syncing a directory after a change of its entries.
    DirSync,
    /// Removing files or directories.
    Remove,
    /// Listing a directory.
    List,
    /// Reading a control file.
    Read,
    /// Creating a file or directory.
    Create,
}

/// Whether a fault strikes before the step (it has no effect) or after it
/// (it took effect, but the caller sees an error: a lost response).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoTiming {
    Before,
    After,
}

/// Decides, per step, whether to fail it.
pub trait IoFaults: Send + Sync {
    /// The error to inject at `step` on `path`, or `None` to let it run.
    fn inject(&self, step: IoStep, timing: IoTiming, path: &Path) -> Option<io::Error>;

    /// True to act as on a file system without `RENAME_NOREPLACE` (NFS):
    /// renames that must not replace anything take the fallback (a link and
    /// an unlink for files, a look and a rename for directories), so that
    /// tests race it too.
    fn lacks_rename_noreplace(&self) -> bool {
        false
    }

    /// True to act as a file system without hard links: a commit then
    /// publishes by a rename after its record (the older, slower order).
    fn lacks_hard_links(&self) -> bool {
        false
    }
}

/// The hook a destination carries; empty in production.
#[derive(Clone, Default)]
pub(crate) struct FaultHook(Option<Arc<dyn IoFaults>>);

impl FaultHook {
    pub(crate) fn new(faults: Arc<dyn IoFaults>) -> Self {
        FaultHook(Some(faults))
    }

    pub(crate) fn check(&self, step: IoStep, timing: IoTiming, path: &Path) -> io::Result<()> {
        match &self.0 {
            Some(f) => f.inject(step, timing, path).map_or(Ok(()), Err),
            None => Ok(()),
        }
    }

    pub(crate) fn lacks_rename_noreplace(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.lacks_rename_noreplace())
    }

    pub(crate) fn lacks_hard_links(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.lacks_hard_links())
    }

    /// Runs `effect` between the before- and after-checks of `step`.
    pub(crate) fn around<T>(
        &self,
        step: IoStep,
        path: &Path,
        effect: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        self.check(step, IoTiming::Before, path)?;
        let value = effect()?;
        self.check(step, IoTiming::After, path)?;
        Ok(value)
    }
}

/// The errors a full disk and a failing device give, for tests.
pub fn no_space() -> io::Error {
    io::Error::from_raw_os_error(28) // ENOSPC
}

pub fn io_error() -> io::Error {
    io::Error::from_raw_os_error(5) // EIO
}
