//! twopc-fs: the filesystem destination, a local or mounted directory (the
//! embedded default).
//!
//! Staged records go to `_twopc/<sink>/staging/<txn>/data` (names starting
//! with `_` or `.` are skipped by Flink's and Hadoop's file readers, so
//! nothing under `_twopc` is read as output). Prepare syncs the data, writes
//! a prepare marker atomically and syncs the directories: after it returns,
//! a crash or power loss loses nothing. Commit claims the staged directory,
//! writes the commit record durably (the decision is recorded), then
//! publishes the data under its visible name with one atomic rename. See
//! [`destination`] for the layout and the commit steps, [`dir`] for why
//! every call is relative to an open directory and never follows links, and
//! [`ownership`] for how a live run owns its sink id.
#![forbid(unsafe_code)]

mod control;
pub mod destination;
mod dir;
#[cfg(target_os = "linux")]
mod direct_io;
pub mod faults;
mod history;
mod inventory;
mod names;
mod ownership;
mod scan;
mod staged;

pub use control::{committed_view, decode_control_file, CommitRecord, ControlFile, PreparedMarker};
pub use destination::{CommitOrder, FsDestination, FsOptions, RecordFormat};
pub use faults::{IoFaults, IoStep, IoTiming};
pub use history::SegmentName;
pub use inventory::{inventory, inventory_with, Depth, Layout, SinkInventory};
pub use names::{
    check_part_name, commit_record_name, parse_commit_record_name, part_name, CONTROL_DIR,
};
pub use staged::{stop_writeback, IoMode, WritebackStop};
