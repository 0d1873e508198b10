//! Reading a sink's control data back, checked: shared by the destination
//! (which acts on it) and the inventory of `twopc inspect` (which only
//! reports it, and must work on a read-only directory where some of the
//! control directories may not exist yet).

use std::path::Path;

use twopc_core::destination::{LineageRecord, StagedState, StagedTransaction};
use twopc_core::error::{DestinationError, DestinationErrorKind};
use twopc_core::ids::{CheckpointId, LineageId, SinkId, TransactionId};

use crate::control::{
    check_lineage, decode_control_file, CommitRecord, ControlFile, PreparedMarker, MAX_CONTROL_FILE,
};
use crate::dir::{Dir, EntryKind};
use crate::names::{self, DATA_FILE, PREPARED_FILE};

pub(crate) fn io_err(op: &str, path: &Path) -> impl FnOnce(std::io::Error) -> DestinationError {
    let op = op.to_string();
    let path = path.to_path_buf();
    move |e| DestinationError::io(&op, &path, e)
}

/// Reads one sink's control data under one output directory.
pub(crate) struct Reader<'a> {
    pub sink: &'a SinkId,
    pub output: &'a Path,
}

impl Reader<'_> {
    pub(crate) fn corrupt(&self, message: String) -> DestinationError {
        DestinationError::corrupt(format!(
            "{message}. The output directory's control data was changed outside twopc; nothing \
             was published, renamed or removed because of it. Inspect it with `twopc inspect {}`",
            self.output.display()
        ))
    }

    /// Reads and decodes a control file; `None` if absent.
    pub(crate) fn read_control(
        &self,
        dir: &Dir,
        name: &str,
    ) -> Result<Option<ControlFile>, DestinationError> {
        let path = dir.child(name);
        let Some(bytes) = dir.read_file(name, MAX_CONTROL_FILE).map_err(|e| {
            // A link (ELOOP with O_NOFOLLOW), a directory or a device where
            // a control file belongs was put there by someone else.
            if e.raw_os_error() == Some(40) || e.kind() == std::io::ErrorKind::InvalidData {
                self.corrupt(format!(
                    "{} is not a control file of twopc's: {e}",
                    path.display()
                ))
            } else {
                DestinationError::io("reading", &path, e)
            }
        })?
        else {
            return Ok(None);
        };
        decode_control_file(&bytes)
            .map(Some)
            .map_err(|e| self.corrupt(format!("{} is unreadable: {e}", dir.child(name).display())))
    }

    /// The prepare marker of a transaction directory, checked.
    pub(crate) fn read_marker(
        &self,
        txn_dir: &Dir,
        txn: &TransactionId,
    ) -> Result<Option<PreparedMarker>, DestinationError> {
        let path = txn_dir.child(PREPARED_FILE);
        match self.read_control(txn_dir, PREPARED_FILE)? {
            None => Ok(None),
            Some(ControlFile::Prepared(m)) => {
                m.check(self.sink, txn)
                    .map_err(|e| self.corrupt(format!("{}: {e}", path.display())))?;
                Ok(Some(m))
            }
            Some(_) => Err(self.corrupt(format!("{} is not a prepare marker", path.display()))),
        }
    }

    /// A commit record by name, checked.
    pub(crate) fn read_commit_record(
        &self,
        committed: &Dir,
        name: &str,
    ) -> Result<Option<CommitRecord>, DestinationError> {
        let path = committed.child(name);
        match self.read_control(committed, name)? {
            None => Ok(None),
            Some(ControlFile::Committed(r)) => {
                r.check(self.sink, name)
                    .map_err(|e| self.corrupt(format!("{}: {e}", path.display())))?;
                Ok(Some(r))
            }
            Some(_) => Err(self.corrupt(format!("{} is not a commit record", path.display()))),
        }
    }

    /// Opens `parent/name` as a transaction directory; `None` if absent.
    pub(crate) fn open_txn_dir(
        &self,
        parent: &Dir,
        name: &str,
    ) -> Result<Option<Dir>, DestinationError> {
        match parent.open_dir(name) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            // A file (ENOTDIR), a link (ELOOP with O_NOFOLLOW) or a name no
            // directory of twopc's has: put there by someone else. Anything
            // else is the file system's answer, reported as such: an error
            // of the moment (EMFILE, EIO, ESTALE) is retryable, a restart
            // may get past it, where a "corrupt" would stop the job for
            // good; a refusal (EACCES, EPERM, EROFS) stays NotPermitted.
            Err(e)
                if e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
                    || e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
                    || e.kind() == std::io::ErrorKind::InvalidInput =>
            {
                Err(self.corrupt(format!(
                    "{} is not a directory of twopc's ({e})",
                    parent.child(name).display()
                )))
            }
            Err(e) => Err(DestinationError::io("opening", &parent.child(name), e)),
        }
    }

    /// When retention cleanup expired a transaction, if it did.
    pub(crate) fn expired_at(
        &self,
        expired: &Dir,
        txn: &TransactionId,
    ) -> Result<Option<u64>, DestinationError> {
        Ok(expired
            .read_file(txn.as_str(), 64)
            .map_err(io_err("reading", &expired.child(txn.as_str())))?
            .map(|b| String::from_utf8_lossy(&b).trim().parse().unwrap_or(0)))
    }

    /// One staged or claimed transaction, as the protocol sees it; `None`
    /// if it is not this sink's or vanished since the listing.
    fn describe_staged(
        &self,
        parent: &Dir,
        name: &str,
        committing: bool,
    ) -> Result<Option<StagedTransaction>, DestinationError> {
        let Some(parsed) = TransactionId::parse(name).filter(|p| &p.sink == self.sink) else {
            return Ok(None);
        };
        let Some(dir) = self.open_txn_dir(parent, name)? else {
            return Ok(None); // committed or aborted since the listing
        };
        let state = match (self.read_marker(&dir, &parsed.id), committing) {
            (Ok(Some(m)), false) => StagedState::Prepared(m.handle),
            (Ok(Some(m)), true) => StagedState::Committing(m.handle),
            (Ok(None), false) => StagedState::Open,
            (Ok(None), true) => StagedState::PreparedUnreadable {
                reason: format!(
                    "{} was claimed for commit but has no prepare marker",
                    dir.path().display()
                ),
            },
            (Err(e), _) if e.kind == DestinationErrorKind::Corrupt => {
                StagedState::PreparedUnreadable {
                    reason: e.message.to_string(),
                }
            }
            (Err(e), _) => return Err(e),
        };
        let activity = [PREPARED_FILE, DATA_FILE]
            .iter()
            .find_map(|f| dir.stat(f).ok().flatten())
            .or_else(|| parent.stat(name).ok().flatten());
        let Some(activity) = activity else {
            return Ok(None); // vanished meanwhile
        };
        Ok(Some(StagedTransaction {
            transaction: parsed.id,
            subtask: parsed.subtask,
            attempt_nonce: parsed.attempt_nonce,
            state,
            last_activity_ms: activity.modified_ms,
        }))
    }

    /// Staged and claimed-for-commit transactions, and the entries in those
    /// areas that are not this sink's transactions (for tools to report).
    pub(crate) fn scan_staged(
        &self,
        staging: Option<&Dir>,
        committing: Option<&Dir>,
    ) -> Result<(Vec<StagedTransaction>, Vec<String>), DestinationError> {
        let mut staged = Vec::new();
        let mut foreign = Vec::new();
        for (dir, is_committing) in [(staging, false), (committing, true)] {
            let Some(dir) = dir else { continue };
            for e in dir.entries().map_err(io_err("listing", dir.path()))? {
                let name = match (&e.name, e.kind) {
                    (Some(n), EntryKind::Dir) => n,
                    _ => {
                        foreign.push(dir.child(&e.raw_name).display().to_string());
                        continue;
                    }
                };
                match self.describe_staged(dir, name, is_committing)? {
                    Some(s) => staged.push(s),
                    None if TransactionId::parse(name).is_some_and(|p| &p.sink == self.sink) => {}
                    None => foreign.push(dir.child(name).display().to_string()),
                }
            }
        }
        Ok((staged, foreign))
    }

    /// The commit records whose (lineage, checkpoint) pass `filter`,
    /// checked; entries that are not commit records are reported apart.
    pub(crate) fn scan_commit_records(
        &self,
        committed: Option<&Dir>,
        filter: impl Fn(LineageId, CheckpointId) -> bool,
    ) -> Result<(Vec<CommitRecord>, Vec<String>), DestinationError> {
        let mut records = Vec::new();
        let mut foreign = Vec::new();
        let Some(dir) = committed else {
            return Ok((records, foreign));
        };
        for e in dir.entries().map_err(io_err("listing", dir.path()))? {
            let parsed = e.name.as_deref().and_then(names::parse_commit_record_name);
            let (Some((lineage, checkpoint, _)), Some(name)) = (parsed, &e.name) else {
                foreign.push(dir.child(&e.raw_name).display().to_string());
                continue;
            };
            if !filter(lineage, checkpoint) {
                continue;
            }
            if e.kind != EntryKind::File {
                // Named like a record but a link or a directory: someone
                // replaced a record. Skipping it could hide a commit.
                return Err(self.corrupt(format!(
                    "{} is named like a commit record but is not a regular file",
                    dir.child(name).display()
                )));
            }
            // A record retracted meanwhile is simply not there any more.
            if let Some(r) = self.read_commit_record(dir, name)? {
                records.push(r);
            }
        }
        Ok((records, foreign))
    }

    /// The lineage records, checked.
    pub(crate) fn lineage_records(
        &self,
        lineages: Option<&Dir>,
    ) -> Result<Vec<LineageRecord>, DestinationError> {
        let mut out = Vec::new();
        let Some(dir) = lineages else {
            return Ok(out);
        };
        for name in dir
            .names_of(EntryKind::File)
            .map_err(io_err("listing", dir.path()))?
        {
            let Some(lineage) = names::parse_lineage_record_name(&name) else {
                continue;
            };
            let path = dir.child(&name);
            match self.read_control(dir, &name)? {
                Some(ControlFile::Lineage(r)) => {
                    check_lineage(&r, lineage)
                        .map_err(|e| self.corrupt(format!("{}: {e}", path.display())))?;
                    out.push(r);
                }
                None => {}
                Some(_) => {
                    return Err(self.corrupt(format!("{} is not a lineage record", path.display())))
                }
            }
        }
        Ok(out)
    }

    /// Expiry tombstones: transaction id and when.
    pub(crate) fn tombstones(
        &self,
        expired: Option<&Dir>,
    ) -> Result<Vec<(String, u64)>, DestinationError> {
        let mut out = Vec::new();
        let Some(dir) = expired else {
            return Ok(out);
        };
        for name in dir
            .names_of(EntryKind::File)
            .map_err(io_err("listing", dir.path()))?
        {
            if let Some(t) = TransactionId::parse(&name) {
                out.push((name, self.expired_at(dir, &t.id)?.unwrap_or(0)));
            }
        }
        Ok(out)
    }
}
