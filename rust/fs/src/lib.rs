//! twopc-fs: the filesystem destination, a local or mounted directory (the
//! embedded default).
//!
//! ```text
//! <output>/
//!   part-<txn-id><suffix>                  committed output, visible
//!   _twopc/<sink>/staging/<txn-id>/data    staged records (hidden)
//!   _twopc/<sink>/staging/<txn-id>/prepared  prepare marker (handle, length)
//!   _twopc/<sink>/committed/<lineage>-<checkpoint>-<txn-id>  commit record
//!   _twopc/<sink>/expired/<txn-id>         tombstone left by retention cleanup
//!   _twopc/<sink>/tmp/                     scratch for atomic writes
//! ```
//!
//! Names starting with `_` or `.` are skipped by Flink's and Hadoop's file
//! readers, so nothing under `_twopc` is ever read as output.
//!
//! Prepare flushes and fsyncs the data file, writes the marker atomically
//! (temporary file, fsync, rename) and fsyncs the directories: after it
//! returns, a crash or power loss loses nothing. Commit first writes the
//! commit record durably (the decision), then renames the data file to its
//! visible name (the publication, atomic), then removes the staging
//! directory. A repeated commit finds the record and finishes whatever the
//! interrupted one left, so it can always tell "already committed" from
//! "lost" without guessing: lost means neither a record nor staged data.

#![forbid(unsafe_code)]

#[cfg(target_os = "linux")]
mod direct_io;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use twopc_core::destination::{
    AbortStatus, CommitStatus, CommittedTransaction, Destination, StagedTransaction,
};
use twopc_core::envelope::PayloadKind;
use twopc_core::error::{ConfigError, DestinationError};
use twopc_core::handle::{decode_payload, encode_payload, HandleError, TransactionHandle};
use twopc_core::ids::{random_u64, CheckpointId, LineageId, SinkId, TransactionId};
use twopc_core::records::RecordBatch;

/// Directory (under the output directory) holding everything not visible.
pub const CONTROL_DIR: &str = "_twopc";
const DATA_FILE: &str = "data";
const PREPARED_FILE: &str = "prepared";
const WRITE_BUFFER: usize = 256 * 1024;
/// Staged bytes after which the data written so far is handed to the
/// background writeback (see [`writeback`]), which then drops it from the
/// page cache. Small enough that the cache pages of a transaction are
/// reused while still hot; measured against 1 and 16 MiB on the benchmark
/// machine (1 MiB syncs too often, 16 MiB lets the cache grow).
const WRITEBACK_EVERY: u64 = 4 * 1024 * 1024;

/// How records are laid out in output files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RecordFormat {
    /// Each record followed by `\n` (what Flink's text line readers expect).
    #[default]
    Lines,
    /// Records written back to back, as the serializer produced them.
    Raw,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsOptions {
    pub output_dir: PathBuf,
    pub part_prefix: String,
    /// Appended to committed file names, e.g. `.txt`; may be empty.
    pub part_suffix: String,
    pub format: RecordFormat,
}

impl FsOptions {
    pub fn new(output_dir: impl Into<PathBuf>) -> Self {
        FsOptions {
            output_dir: output_dir.into(),
            part_prefix: "part".to_string(),
            part_suffix: String::new(),
            format: RecordFormat::Lines,
        }
    }

    /// Checks the names that configuration puts into paths.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.output_dir.as_os_str().is_empty() {
            return Err(ConfigError::new(
                "the output directory is empty; set a path",
            ));
        }
        twopc_core::ids::validate_token("part prefix", &self.part_prefix, 32)?;
        if !self.part_suffix.is_empty() {
            let rest = self.part_suffix.strip_prefix('.').ok_or_else(|| {
                ConfigError::new(format!(
                    "part suffix {:?} must start with '.', e.g. \".txt\"",
                    self.part_suffix
                ))
            })?;
            twopc_core::ids::validate_token("part suffix", rest, 16)?;
        }
        Ok(())
    }
}

/// Written at prepare, inside the staging directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedMarker {
    pub handle: TransactionHandle,
    /// Exact length of the data file; checked before publication.
    pub data_len: u64,
}

/// Written at commit: the durable proof that a transaction was committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRecord {
    pub handle: TransactionHandle,
    /// Visible file name, relative to the output directory (None when the
    /// transaction held no data).
    pub file: Option<String>,
    pub data_len: u64,
    pub committed_at_ms: u64,
}

/// A control file of the filesystem destination, as stored (inside the
/// versioned envelope, payload kind "manifest").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlFile {
    Prepared(PreparedMarker),
    Committed(CommitRecord),
}

/// Decodes the bytes of a control file read back from a destination. Any
/// input, however damaged, gives a typed error, never a panic.
///
/// Serde bypasses the constructors, so what they would refuse is refused
/// here: the handle inside must pass the checks of a restored handle (its
/// ids become paths), and a commit record's file, which `retract` removes
/// from the output directory, must be a plain visible name in it, not a
/// path (found by the fuzz harness, `rust/fuzz`).
pub fn decode_control_file(bytes: &[u8]) -> Result<ControlFile, HandleError> {
    let control = decode_payload::<ControlFile>(PayloadKind::Manifest, bytes)?;
    match &control {
        ControlFile::Prepared(m) => m.handle.validate()?,
        ControlFile::Committed(r) => {
            r.handle.validate()?;
            if let Some(file) = r.file.as_deref().filter(|f| !is_visible_name(f)) {
                return Err(HandleError::Invalid(format!(
                    "commit record names file {file:?}, which is not a file name in the output \
                     directory"
                )));
            }
        }
    }
    Ok(control)
}

/// A name `part_name` can produce: a validated prefix (letter or digit
/// first), `-`, a transaction id, an optional `.suffix`. So: 1 to 255 of
/// `[A-Za-z0-9._-]`, starting with a letter or digit (no separators, no
/// `..`, not hidden).
fn is_visible_name(name: &str) -> bool {
    name.len() <= 255
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Paths of one sink inside an output directory.
#[derive(Clone, Debug)]
pub struct Layout {
    pub output: PathBuf,
    pub sink: SinkId,
    pub sink_dir: PathBuf,
    pub staging: PathBuf,
    pub committed: PathBuf,
    pub expired: PathBuf,
    pub tmp: PathBuf,
}

impl Layout {
    pub fn new(output: &Path, sink: &SinkId) -> Self {
        let sink_dir = output.join(CONTROL_DIR).join(sink.as_str());
        Layout {
            output: output.to_path_buf(),
            sink: sink.clone(),
            staging: sink_dir.join("staging"),
            committed: sink_dir.join("committed"),
            expired: sink_dir.join("expired"),
            tmp: sink_dir.join("tmp"),
            sink_dir,
        }
    }

    /// Sinks that have a control directory under `output`.
    pub fn sinks_in(output: &Path) -> Result<Vec<SinkId>, DestinationError> {
        let dir = output.join(CONTROL_DIR);
        let mut sinks = Vec::new();
        for name in list_names(&dir)? {
            // Only directories are sinks; a stray file is not ours to read.
            if !dir.join(&name).is_dir() {
                continue;
            }
            if let Ok(s) = SinkId::new(name) {
                sinks.push(s);
            }
        }
        sinks.sort();
        Ok(sinks)
    }

    pub fn staging_dir(&self, txn: &TransactionId) -> PathBuf {
        self.staging.join(txn.as_str())
    }

    pub fn commit_record_name(
        lineage: LineageId,
        checkpoint: CheckpointId,
        txn: &TransactionId,
    ) -> String {
        format!("{lineage}-{checkpoint}-{txn}")
    }

    /// Parses a commit record name into (lineage, checkpoint, transaction).
    /// Only the spelling [`Self::commit_record_name`] writes is accepted:
    /// `retract` finds a record by that spelling, so a record named
    /// otherwise (`+`, upper-case hex, leading zeros, all of which the
    /// number parsers take) would be listed but never retracted (found by
    /// the fuzz harness, `rust/fuzz`).
    pub fn parse_commit_record_name(
        name: &str,
    ) -> Option<(LineageId, CheckpointId, TransactionId)> {
        let (lineage, rest) = name.split_once('-')?;
        let (checkpoint, txn) = rest.split_once('-')?;
        if lineage.len() != 16 {
            return None;
        }
        let lineage = LineageId(u64::from_str_radix(lineage, 16).ok()?);
        let checkpoint: CheckpointId = checkpoint.parse().ok()?;
        let txn = TransactionId::parse(txn)?.id;
        if Self::commit_record_name(lineage, checkpoint, &txn) != name {
            return None;
        }
        Some((lineage, checkpoint, txn))
    }

    pub fn commit_record_path(
        &self,
        handle: &TransactionHandle,
        checkpoint: CheckpointId,
    ) -> PathBuf {
        self.committed.join(Self::commit_record_name(
            handle.lineage,
            checkpoint,
            &handle.transaction,
        ))
    }

    pub fn ensure(&self) -> Result<(), DestinationError> {
        for d in [&self.staging, &self.committed, &self.expired, &self.tmp] {
            fs::create_dir_all(d).map_err(|e| DestinationError::io("creating directory", d, e))?;
        }
        Ok(())
    }

    /// Reads every commit record of this sink.
    pub fn read_commit_records(&self) -> Result<Vec<CommitRecord>, DestinationError> {
        let mut out = Vec::new();
        for name in list_names(&self.committed)? {
            if Self::parse_commit_record_name(&name).is_none() {
                continue;
            }
            let path = self.committed.join(&name);
            match read_record(&path)? {
                Some(ControlFile::Committed(c)) => out.push(c),
                _ => {
                    return Err(DestinationError::corrupt(format!(
                        "{} is not a commit record",
                        path.display()
                    )))
                }
            }
        }
        Ok(out)
    }

    /// Reads the prepare marker of a staged transaction, if present.
    pub fn read_prepared(
        &self,
        txn: &TransactionId,
    ) -> Result<Option<PreparedMarker>, DestinationError> {
        let path = self.staging_dir(txn).join(PREPARED_FILE);
        match read_record(&path)? {
            None => Ok(None),
            Some(ControlFile::Prepared(p)) => Ok(Some(p)),
            Some(ControlFile::Committed(_)) => Err(DestinationError::corrupt(format!(
                "{} holds a commit record where a prepare marker belongs",
                path.display()
            ))),
        }
    }

    /// Staged transactions; names that are not transaction ids are returned
    /// separately so tools can report them.
    pub fn read_staged(&self) -> Result<(Vec<StagedTransaction>, Vec<String>), DestinationError> {
        let mut staged = Vec::new();
        let mut foreign = Vec::new();
        for name in list_names(&self.staging)? {
            let Some(parsed) = TransactionId::parse(&name).filter(|p| p.sink == self.sink) else {
                foreign.push(name);
                continue;
            };
            let path = self.staging.join(&name);
            if !path.is_dir() {
                // A file named like a transaction is not ours; a directory
                // that vanished since the listing was committed or aborted.
                if path.exists() {
                    foreign.push(name);
                }
                continue;
            }
            let dir = self.staging_dir(&parsed.id);
            let prepared = self.read_prepared(&parsed.id)?.map(|m| m.handle);
            let activity_path = if prepared.is_some() {
                dir.join(PREPARED_FILE)
            } else if dir.join(DATA_FILE).exists() {
                dir.join(DATA_FILE)
            } else {
                dir.clone()
            };
            // Other subtasks commit and abort their own transactions while
            // this scan runs: one that vanished since the listing is no
            // longer staged, which is all this scan reports.
            let last_activity_ms = match modified_ms(&activity_path) {
                Ok(ms) => ms,
                Err(_) if !dir.exists() => continue,
                Err(e) => return Err(e),
            };
            staged.push(StagedTransaction {
                transaction: parsed.id,
                subtask: parsed.subtask,
                attempt_nonce: parsed.attempt_nonce,
                prepared,
                last_activity_ms,
            });
        }
        Ok((staged, foreign))
    }

    /// When cleanup expired a transaction, if it did.
    pub fn expired_at(&self, txn: &TransactionId) -> Result<Option<u64>, DestinationError> {
        let path = self.expired.join(txn.as_str());
        match fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s.trim().parse().unwrap_or(0))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(DestinationError::io("reading", &path, e)),
        }
    }
}

/// The filesystem destination for one sink and one subtask.
pub struct FsDestination {
    layout: Layout,
    options: FsOptions,
    open: Option<OpenFile>,
}

struct OpenFile {
    txn: TransactionId,
    path: PathBuf,
    out: StagedOut,
    len: u64,
    /// `len` when the file was last handed to the background writeback.
    written_back: u64,
}

/// How the open data file is written: with direct I/O where the file
/// system allows it (see [`crate::direct_io`]), else through the page
/// cache, with background writeback.
enum StagedOut {
    Cached(BufWriter<File>),
    #[cfg(target_os = "linux")]
    Direct(crate::direct_io::DirectWriter),
}

impl StagedOut {
    fn open(file: File, path: &Path, len: u64) -> StagedOut {
        #[cfg(target_os = "linux")]
        if let Some(direct) = crate::direct_io::DirectWriter::open(path, len) {
            return StagedOut::Direct(direct);
        }
        let _ = (path, len);
        StagedOut::Cached(BufWriter::with_capacity(WRITE_BUFFER, file))
    }

    /// Appends a record, and a line break after it if `newline`.
    fn write_record(&mut self, record: &[u8], newline: bool) -> std::io::Result<()> {
        match self {
            StagedOut::Cached(out) => {
                out.write_all(record)?;
                if newline {
                    out.write_all(b"\n")?;
                }
                Ok(())
            }
            #[cfg(target_os = "linux")]
            StagedOut::Direct(out) => out.write_record(record, newline),
        }
    }

    /// Everything written so far on the disk, data and metadata; then out
    /// of the page cache.
    fn seal(&mut self) -> std::io::Result<()> {
        let file = match self {
            StagedOut::Cached(out) => {
                out.flush()?;
                out.get_ref().sync_all()?;
                out.get_ref()
            }
            #[cfg(target_os = "linux")]
            StagedOut::Direct(out) => {
                out.seal()?;
                out.file()
            }
        };
        drop_from_page_cache(file);
        Ok(())
    }

    /// Asks for background writeback of what was written through the page
    /// cache (direct writes need none).
    fn request_writeback(&self) {
        match self {
            StagedOut::Cached(out) => writeback::request(out.get_ref()),
            #[cfg(target_os = "linux")]
            StagedOut::Direct(_) => {}
        }
    }
}

impl FsDestination {
    /// Validates the options and creates the directories.
    pub fn open(options: FsOptions, sink: &SinkId) -> Result<Self, DestinationError> {
        options.validate().map_err(|e| {
            DestinationError::new(
                twopc_core::error::DestinationErrorKind::Rejected,
                e.to_string(),
            )
        })?;
        fs::create_dir_all(&options.output_dir).map_err(|e| {
            DestinationError::io("creating output directory", &options.output_dir, e)
        })?;
        let layout = Layout::new(&options.output_dir, sink);
        layout.ensure()?;
        remove_stale_scratch(&layout.tmp)?;
        Ok(FsDestination {
            layout,
            options,
            open: None,
        })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Visible file name of a transaction: deterministic, so a repeated
    /// commit publishes to the same name.
    pub fn part_name(&self, txn: &TransactionId) -> String {
        format!(
            "{}-{}{}",
            self.options.part_prefix, txn, self.options.part_suffix
        )
    }

    fn data_file(&mut self, txn: &TransactionId) -> Result<&mut OpenFile, DestinationError> {
        let reuse = matches!(&self.open, Some(o) if &o.txn == txn);
        if !reuse {
            // Only one transaction is open at a time; a different one means
            // the previous was prepared or aborted already.
            self.open = None;
            let dir = self.layout.staging_dir(txn);
            fs::create_dir_all(&dir)
                .map_err(|e| DestinationError::io("creating staging directory", &dir, e))?;
            let path = dir.join(DATA_FILE);
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| DestinationError::io("opening staged file", &path, e))?;
            let len = file
                .metadata()
                .map_err(|e| DestinationError::io("reading size of", &path, e))?
                .len();
            let out = StagedOut::open(file, &path, len);
            self.open = Some(OpenFile {
                txn: txn.clone(),
                path,
                out,
                len,
                written_back: len,
            });
        }
        Ok(self.open.as_mut().expect("set above"))
    }

    /// Flushes and fsyncs the open data file of `txn`, returning its length.
    fn seal_data(&mut self, txn: &TransactionId) -> Result<Option<u64>, DestinationError> {
        match self.open.take() {
            Some(mut o) if &o.txn == txn => {
                o.out
                    .seal()
                    .map_err(|e| DestinationError::io("writing and syncing", &o.path, e))?;
                Ok(Some(o.len))
            }
            other => {
                self.open = other;
                let path = self.layout.staging_dir(txn).join(DATA_FILE);
                match fs::metadata(&path) {
                    Ok(m) => {
                        File::open(&path)
                            .and_then(|f| f.sync_all())
                            .map_err(|e| DestinationError::io("syncing", &path, e))?;
                        Ok(Some(m.len()))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(DestinationError::io("reading size of", &path, e)),
                }
            }
        }
    }

    fn missing_evidence(&self, txn: &TransactionId) -> Result<String, DestinationError> {
        Ok(match self.layout.expired_at(txn)? {
            Some(at) => format!(
                "its staged data was removed by retention cleanup at {at} ms since the epoch \
                 (tombstone {})",
                self.layout.expired.join(txn.as_str()).display()
            ),
            None => format!(
                "neither its staged data ({}) nor a commit record exists; it was removed or \
                 rolled back outside twopc",
                self.layout.staging_dir(txn).display()
            ),
        })
    }
}

impl Destination for FsDestination {
    fn begin(&mut self, _handle: &TransactionHandle) -> Result<(), DestinationError> {
        // Lazy: the staging directory appears with the first record, so an
        // empty checkpoint costs no file system operations.
        Ok(())
    }

    fn write(
        &mut self,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<(), DestinationError> {
        let lines = self.options.format == RecordFormat::Lines;
        let o = self.data_file(txn)?;
        let mut written = 0u64;
        for record in batch.iter() {
            o.out
                .write_record(record, lines)
                .map_err(|e| DestinationError::io("writing", &o.path, e))?;
            written += record.len() as u64 + u64::from(lines);
        }
        o.len += written;
        if o.len - o.written_back >= WRITEBACK_EVERY {
            o.written_back = o.len;
            o.out.request_writeback();
        }
        Ok(())
    }

    fn prepare(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        let txn = &handle.transaction;
        let Some(data_len) = self.seal_data(txn)? else {
            if handle.prepared().is_some_and(|p| p.records > 0) {
                return Err(DestinationError::corrupt(format!(
                    "staged data of {txn} is missing at prepare ({})",
                    self.layout.staging_dir(txn).display()
                )));
            }
            return Ok(()); // empty transaction: nothing staged, nothing to prepare
        };
        let dir = self.layout.staging_dir(txn);
        let marker = ControlFile::Prepared(PreparedMarker {
            handle: handle.clone(),
            data_len,
        });
        // Syncs the marker and the transaction directory...
        write_atomically(
            &self.layout.tmp,
            &dir.join(PREPARED_FILE),
            &encode_payload(PayloadKind::Manifest, &marker),
        )?;
        // ...and this makes the transaction directory's own entry durable.
        sync_dir(&self.layout.staging)?;
        Ok(())
    }

    fn commit(
        &mut self,
        handle: &TransactionHandle,
        now_ms: u64,
    ) -> Result<CommitStatus, DestinationError> {
        let txn = &handle.transaction;
        let checkpoint = handle.checkpoint().ok_or_else(|| {
            DestinationError::corrupt(format!("commit of {txn} without a prepared state"))
        })?;
        let record_path = self.layout.commit_record_path(handle, checkpoint);
        let staging = self.layout.staging_dir(txn);
        let data = staging.join(DATA_FILE);
        let visible_name = self.part_name(txn);
        let visible = self.layout.output.join(&visible_name);

        if record_path.exists() {
            // Decided earlier: finish what an interrupted commit left.
            if data.exists() && !visible.exists() {
                rename_durably(&data, &visible)?;
            }
            remove_dir_if_exists(&staging)?;
            if !visible.exists() && handle.prepared().is_some_and(|p| p.records > 0) {
                log::warn!(
                    "transaction {txn} is recorded as committed but its output {} is gone; it \
                     was removed after the commit",
                    visible.display()
                );
            }
            return Ok(CommitStatus::AlreadyCommitted);
        }

        let marker = match self.layout.read_prepared(txn)? {
            Some(m) => m,
            None => {
                return Ok(CommitStatus::Missing {
                    evidence: self.missing_evidence(txn)?,
                })
            }
        };
        if marker.handle.transaction != *txn || marker.handle.lineage != handle.lineage {
            return Err(DestinationError::corrupt(format!(
                "prepare marker of {txn} names transaction {} of lineage {}",
                marker.handle.transaction, marker.handle.lineage
            )));
        }
        let actual_len = match fs::metadata(&data) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(CommitStatus::Missing {
                    evidence: format!(
                        "its prepare marker exists but its data file {} is gone",
                        data.display()
                    ),
                })
            }
            Err(e) => return Err(DestinationError::io("reading size of", &data, e)),
        };
        if actual_len != marker.data_len {
            return Ok(CommitStatus::Missing {
                evidence: format!(
                    "its staged data file {} has {actual_len} bytes but {} were prepared; it was \
                     truncated or changed",
                    data.display(),
                    marker.data_len
                ),
            });
        }

        let record = ControlFile::Committed(CommitRecord {
            handle: marker.handle.clone(),
            file: Some(visible_name),
            data_len: marker.data_len,
            committed_at_ms: now_ms,
        });
        // The decision, durable (the record and its directory are synced)...
        write_atomically(
            &self.layout.tmp,
            &record_path,
            &encode_payload(PayloadKind::Manifest, &record),
        )?;
        // ...then the publication.
        rename_durably(&data, &visible)?;
        remove_dir_if_exists(&staging)?;
        Ok(CommitStatus::Committed)
    }

    fn abort(&mut self, txn: &TransactionId) -> Result<AbortStatus, DestinationError> {
        if matches!(&self.open, Some(o) if &o.txn == txn) {
            self.open = None;
        }
        let staging = self.layout.staging_dir(txn);
        if let Some(marker) = self.layout.read_prepared(txn)? {
            if let Some(c) = marker.handle.checkpoint() {
                if self.layout.commit_record_path(&marker.handle, c).exists() {
                    // A commit was decided but not finished: never undo it.
                    return Ok(AbortStatus::WasCommitted);
                }
            }
        }
        // Once a commit has finished, nothing is staged any more and an abort
        // finds nothing to remove; the visible output is never touched here.
        // (No search of the commit records: an abort runs for every empty
        // checkpoint and must stay cheap.)
        if remove_dir_if_exists(&staging)? {
            Ok(AbortStatus::Aborted)
        } else {
            Ok(AbortStatus::NotFound)
        }
    }

    fn staged(&mut self) -> Result<Vec<StagedTransaction>, DestinationError> {
        let (staged, foreign) = self.layout.read_staged()?;
        for name in foreign {
            log::warn!(
                "ignoring {} in the staging area: not a transaction of sink '{}'",
                self.layout.staging.join(name).display(),
                self.layout.sink
            );
        }
        Ok(staged)
    }

    fn committed_after(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<Vec<CommittedTransaction>, DestinationError> {
        let mut out = Vec::new();
        for name in list_names(&self.layout.committed)? {
            let Some((l, c, _)) = Layout::parse_commit_record_name(&name) else {
                continue;
            };
            if l != lineage || c <= checkpoint {
                continue;
            }
            let path = self.layout.committed.join(&name);
            if let Some(ControlFile::Committed(r)) = read_record(&path)? {
                out.push(committed_view(&r));
            }
        }
        Ok(out)
    }

    fn retract(&mut self, committed: &CommittedTransaction) -> Result<(), DestinationError> {
        let path = self.layout.committed.join(Layout::commit_record_name(
            committed.lineage,
            committed.checkpoint,
            &committed.transaction,
        ));
        let Some(ControlFile::Committed(record)) = read_record(&path)? else {
            return Ok(()); // already retracted
        };
        if let Some(file) = &record.file {
            let visible = self.layout.output.join(file);
            match fs::remove_file(&visible) {
                Ok(()) => sync_dir(&self.layout.output)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(DestinationError::io("removing", &visible, e)),
            }
        }
        // Leftovers of an interrupted commit go too.
        remove_dir_if_exists(&self.layout.staging_dir(&committed.transaction))?;
        // Two subtasks may retract the same commit at once (each retracts
        // what the restored state knows); whoever removes the record second
        // finds it gone, which is the state both wanted.
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(DestinationError::io("removing", &path, e)),
        }
        sync_dir(&self.layout.committed)
    }

    fn expire(&mut self, txn: &TransactionId, now_ms: u64) -> Result<(), DestinationError> {
        let tombstone = self.layout.expired.join(txn.as_str());
        write_atomically(&self.layout.tmp, &tombstone, now_ms.to_string().as_bytes())?;
        sync_dir(&self.layout.expired)?;
        remove_dir_if_exists(&self.layout.staging_dir(txn))?;
        Ok(())
    }
}

/// Writes staged data back to the disk while the transaction is still being
/// written, so that the fsync at prepare (which holds up the checkpoint
/// barrier and the task thread) finds little left to do.
///
/// Without it the kernel starts writeback only past its dirty thresholds
/// (10 % of memory, or 30 s), i.e. never within a checkpoint interval: all of
/// an interval's data would be written out inside prepare, with the task
/// thread waiting and the disk idle the rest of the time. One thread per
/// process takes `fdatasync` requests for open data files; a request that
/// finds it busy is dropped (the next one, or prepare, covers the data), so
/// the writer never waits for it. Its errors are ignored: prepare's own
/// fsync is the durability point and reports them. What it has synced it
/// drops from the page cache ([`drop_from_page_cache`]).
mod writeback {
    use std::fs::File;
    use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
    use std::sync::{Mutex, OnceLock};

    static QUEUE: OnceLock<Option<Mutex<SyncSender<File>>>> = OnceLock::new();

    fn queue() -> Option<&'static Mutex<SyncSender<File>>> {
        QUEUE
            .get_or_init(|| {
                let (tx, rx) = sync_channel::<File>(1);
                std::thread::Builder::new()
                    .name("twopc-writeback".to_string())
                    .spawn(move || {
                        for file in rx {
                            if file.sync_data().is_ok() {
                                super::drop_from_page_cache(&file);
                            }
                        }
                    })
                    .ok()
                    .map(|_| Mutex::new(tx))
            })
            .as_ref()
    }

    /// Asks for `file`'s written data to be synced in the background.
    pub(super) fn request(file: &File) {
        let Some(queue) = queue() else { return };
        // A second descriptor of the same open file, owned by the request.
        let Ok(dup) = file.try_clone() else { return };
        let Ok(tx) = queue.lock() else { return };
        match tx.try_send(dup) {
            Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// Tells the kernel that the file's data, already on the disk, need not stay
/// in the page cache (`POSIX_FADV_DONTNEED`; advice only, so errors are
/// ignored and other systems skip it).
///
/// Why: staged data is written once and never read back by the sink; it is
/// read, if at all, later and by someone else. Left in the cache it only
/// makes the cache grow by the write rate, and every new page-cache page
/// costs the writer a fresh page allocation (and reclaim, once memory is
/// full). Dropped right after writeback, the same few pages are reused. On
/// the benchmark machine (a virtual machine, where touching memory the
/// guest freed is expensive) this took twopc-fs from about 3.5 to 6.5
/// million records/s at 1 s checkpoints, and from 3.4 to 7-8 million at
/// 10 s (`docs/benchmarks.md`).
fn drop_from_page_cache(file: &File) {
    #[cfg(target_os = "linux")]
    {
        let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// The protocol's view of a commit record.
pub fn committed_view(r: &CommitRecord) -> CommittedTransaction {
    CommittedTransaction {
        transaction: r.handle.transaction.clone(),
        lineage: r.handle.lineage,
        checkpoint: r.handle.checkpoint().unwrap_or_default(),
        subtask: r.handle.subtask,
        records: r.handle.prepared().map(|p| p.records).unwrap_or(0),
        committed_at_ms: r.committed_at_ms,
    }
}

fn read_record(path: &Path) -> Result<Option<ControlFile>, DestinationError> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => f
            .read_to_end(&mut bytes)
            .map_err(|e| DestinationError::io("reading", path, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DestinationError::io("opening", path, e)),
    };
    decode_control_file(&bytes)
        .map(Some)
        .map_err(|e: HandleError| {
            DestinationError::corrupt(format!(
                "{} is unreadable ({e}); it was damaged outside twopc. Inspect it with \
                 `twopc inspect` before removing anything",
                path.display()
            ))
        })
}

/// Sorted names in a directory; a missing directory is empty.
fn list_names(dir: &Path) -> Result<Vec<String>, DestinationError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DestinationError::io("listing", dir, e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| DestinationError::io("listing", dir, e))?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

fn modified_ms(path: &Path) -> Result<u64, DestinationError> {
    let m = fs::metadata(path).map_err(|e| DestinationError::io("reading time of", path, e))?;
    Ok(m.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0))
}

fn sync_dir(dir: &Path) -> Result<(), DestinationError> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| DestinationError::io("syncing directory", dir, e))
}

/// Writes `bytes` to `target` so that readers see all or nothing.
fn write_atomically(tmp_dir: &Path, target: &Path, bytes: &[u8]) -> Result<(), DestinationError> {
    let tmp = tmp_dir.join(format!("{:016x}.tmp", random_u64()));
    let result = (|| {
        let mut f = File::create(&tmp).map_err(|e| DestinationError::io("creating", &tmp, e))?;
        f.write_all(bytes)
            .map_err(|e| DestinationError::io("writing", &tmp, e))?;
        f.sync_all()
            .map_err(|e| DestinationError::io("syncing", &tmp, e))?;
        fs::rename(&tmp, target).map_err(|e| DestinationError::io("publishing", target, e))?;
        if let Some(parent) = target.parent() {
            sync_dir(parent)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn rename_durably(from: &Path, to: &Path) -> Result<(), DestinationError> {
    fs::rename(from, to).map_err(|e| DestinationError::io("publishing", to, e))?;
    if let Some(parent) = to.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Scratch files older than this were left by a writer that died during an
/// atomic write; younger ones may belong to another subtask writing now.
const STALE_SCRATCH_MS: u64 = 3600 * 1000;

/// Removes scratch files that interrupted atomic writes left behind.
fn remove_stale_scratch(tmp: &Path) -> Result<(), DestinationError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    for name in list_names(tmp)? {
        if !name.ends_with(".tmp") {
            continue;
        }
        let path = tmp.join(&name);
        // A file that vanished meanwhile was cleaned by another subtask.
        let Ok(modified) = modified_ms(&path) else {
            continue;
        };
        if now.saturating_sub(modified) > STALE_SCRATCH_MS {
            match fs::remove_file(&path) {
                Ok(()) => log::debug!("removed stale scratch file {}", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(DestinationError::io("removing", &path, e)),
            }
        }
    }
    Ok(())
}

/// Removes a directory tree; returns whether it existed.
fn remove_dir_if_exists(dir: &Path) -> Result<bool, DestinationError> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(DestinationError::io("removing", dir, e)),
    }
}

/// Everything `twopc inspect` reports about one sink.
#[derive(Clone, Debug)]
pub struct SinkInventory {
    pub sink: SinkId,
    pub committed: Vec<CommitRecord>,
    pub staged: Vec<StagedTransaction>,
    /// Expired transaction ids and when.
    pub expired: BTreeMap<String, u64>,
    /// Problems found: names that are not ours, records whose output is
    /// gone, unreadable files.
    pub problems: Vec<String>,
}

/// Reads the whole state of every sink in an output directory.
pub fn inventory(output: &Path) -> Result<Vec<SinkInventory>, DestinationError> {
    let mut out = Vec::new();
    for sink in Layout::sinks_in(output)? {
        let layout = Layout::new(output, &sink);
        let mut problems = Vec::new();
        let committed = match layout.read_commit_records() {
            Ok(c) => c,
            Err(e) => {
                problems.push(e.to_string());
                Vec::new()
            }
        };
        for c in &committed {
            if let Some(f) = &c.file {
                if !output.join(f).exists() {
                    problems.push(format!(
                        "committed transaction {} lists {f}, which no longer exists",
                        c.handle.transaction
                    ));
                }
            }
        }
        let staged = match layout.read_staged() {
            Ok((s, foreign)) => {
                for name in foreign {
                    problems.push(format!(
                        "{} is not a transaction of this sink",
                        layout.staging.join(name).display()
                    ));
                }
                s
            }
            Err(e) => {
                problems.push(e.to_string());
                Vec::new()
            }
        };
        let mut expired = BTreeMap::new();
        for name in list_names(&layout.expired)? {
            if let Some(t) = TransactionId::parse(&name) {
                let at = layout.expired_at(&t.id)?.unwrap_or(0);
                expired.insert(name, at);
            }
        }
        out.push(SinkInventory {
            sink,
            committed,
            staged,
            expired,
            problems,
        });
    }
    Ok(out)
}
