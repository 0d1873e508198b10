//! An open directory, and every file system call the destination makes,
//! relative to it.
//!
//! Why not paths: everything under the output directory can be changed by
//! someone else while a sink runs. A path is resolved again at every call,
//! through whatever symbolic links sit in it by then; a planted link in
//! `_twopc/<sink>/staging/<txn>` would make the sink write, rename or
//! delete outside the output directory. So the output directory is opened
//! once (following the user's own path, which may legitimately be a link),
//! and every later call names one entry of an open directory
//! (`openat`, `mkdirat`, `renameat2`, `unlinkat`, ...) with `O_NOFOLLOW`:
//! a link where a file or directory of ours belongs is an error, never
//! followed. Entry names are always single components: callers build them
//! from validated identifiers, and [`check_name`] refuses anything else.
//!
//! Files are created exclusively (`O_CREAT|O_EXCL`), and renames that
//! publish or claim never replace an existing entry (`RENAME_NOREPLACE`,
//! with a link-and-unlink fallback where the file system lacks it).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::faults::{FaultHook, IoStep, IoTiming};

/// What an entry is, without following links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

impl EntryKind {
    fn of(t: FileType) -> EntryKind {
        match t {
            FileType::RegularFile => EntryKind::File,
            FileType::Directory => EntryKind::Dir,
            FileType::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        }
    }
}

/// One directory entry. `name` is `None` for names that are not UTF-8
/// (never ours; listed so that tools can report them).
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub name: Option<String>,
    pub raw_name: String,
    pub kind: EntryKind,
}

/// Facts about one entry, not following links.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EntryStat {
    pub kind: EntryKind,
    pub len: u64,
    pub inode: (u64, u64),
    /// How many names the entry has: more than one for staged data a
    /// commit has linked to its visible name.
    pub links: u64,
    pub modified_ms: u64,
}

/// An open directory (see the module docs).
pub(crate) struct Dir {
    fd: OwnedFd,
    path: PathBuf,
    faults: FaultHook,
}

const DIR_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o644;
/// How deep [`Dir::remove_tree`] descends before refusing a tree.
pub(crate) const MAX_REMOVE_DEPTH: usize = 16;

fn nofollow_dir() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Refuses names that are not a single, ordinary path component: a name
/// with a separator would walk through directories (and links) on the way.
pub(crate) fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single file name"),
        ));
    }
    Ok(())
}

impl Dir {
    /// Opens a directory by path, following links in it: this is for the
    /// output directory the user configured, nothing below it.
    pub(crate) fn open_path(path: &Path, faults: FaultHook) -> io::Result<Dir> {
        let fd = rustix::fs::openat(
            rustix::fs::CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
            faults,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of an entry, for messages.
    pub(crate) fn child(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub(crate) fn faults(&self) -> &FaultHook {
        &self.faults
    }

    /// Opens a subdirectory; a link or a file there is an error.
    pub(crate) fn open_dir(&self, name: &str) -> io::Result<Dir> {
        check_name(name)?;
        self.faults
            .check(IoStep::Read, IoTiming::Before, &self.child(name))?;
        let fd = rustix::fs::openat(&self.fd, name, nofollow_dir(), Mode::empty())?;
        Ok(Dir {
            fd,
            path: self.child(name),
            faults: self.faults.clone(),
        })
    }

    /// Opens a subdirectory, creating it if absent.
    pub(crate) fn ensure_dir(&self, name: &str) -> io::Result<Dir> {
        check_name(name)?;
        match self.faults.around(IoStep::Create, &self.child(name), || {
            Ok(rustix::fs::mkdirat(
                &self.fd,
                name,
                Mode::from_raw_mode(DIR_MODE),
            )?)
        }) {
            // A new directory's entry is durable before anything inside it
            // counts on it: a prepare syncs what it writes and the
            // directory it writes in, never that directory's parent, and a
            // file system may lose a new entry whose parent was not synced
            // (found by review).
            Ok(()) => self.sync()?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        self.open_dir(name)
    }

    /// Creates a subdirectory; fails with `AlreadyExists` if anything has
    /// the name.
    pub(crate) fn create_dir_new(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        self.faults.around(IoStep::Create, &self.child(name), || {
            Ok(rustix::fs::mkdirat(
                &self.fd,
                name,
                Mode::from_raw_mode(DIR_MODE),
            )?)
        })
    }

    /// Creates a new regular file for writing; fails if anything (a file, a
    /// link, a directory) already has the name.
    pub(crate) fn create_new_file(&self, name: &str) -> io::Result<File> {
        check_name(name)?;
        let fd = self.faults.around(IoStep::Create, &self.child(name), || {
            Ok(rustix::fs::openat(
                &self.fd,
                name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(FILE_MODE),
            )?)
        })?;
        Ok(File::from(fd))
    }

    /// Opens an existing regular file for writing with extra flags (e.g.
    /// `O_DIRECT` for a second descriptor of a staged file).
    #[cfg(target_os = "linux")]
    pub(crate) fn open_for_write(&self, name: &str, extra: OFlags) -> io::Result<File> {
        check_name(name)?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | extra,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// Opens a file read-write, creating it if absent (never through a
    /// link); for lock files.
    pub(crate) fn open_or_create(&self, name: &str) -> io::Result<File> {
        check_name(name)?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(FILE_MODE),
        )?;
        let file = File::from(fd);
        if EntryKind::of(FileType::from_raw_mode(rustix::fs::fstat(&file)?.st_mode))
            != EntryKind::File
        {
            return Err(not_regular(&self.child(name)));
        }
        Ok(file)
    }

    /// Reads a small regular file whole; `None` if absent. A link, a
    /// directory or a file larger than `limit` is an error.
    pub(crate) fn read_file(&self, name: &str, limit: u64) -> io::Result<Option<Vec<u8>>> {
        check_name(name)?;
        let path = self.child(name);
        self.faults.check(IoStep::Read, IoTiming::Before, &path)?;
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut file = File::from(fd);
        let stat = rustix::fs::fstat(&file)?;
        if EntryKind::of(FileType::from_raw_mode(stat.st_mode)) != EntryKind::File {
            return Err(not_regular(&path));
        }
        if stat.st_size as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} has {} bytes, more than any file of twopc's ({limit})",
                    path.display(),
                    stat.st_size
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(stat.st_size as usize);
        (&mut file).take(limit + 1).read_to_end(&mut bytes)?;
        self.faults.check(IoStep::Read, IoTiming::After, &path)?;
        Ok(Some(bytes))
    }

    /// This directory's own (device, inode), read from its descriptor: it
    /// follows the directory wherever it was renamed since it was opened.
    pub(crate) fn inode(&self) -> io::Result<(u64, u64)> {
        let st = rustix::fs::fstat(&self.fd)?;
        Ok((st.st_dev, st.st_ino))
    }

    /// Facts about an entry, not following links; `None` if absent.
    pub(crate) fn stat(&self, name: &str) -> io::Result<Option<EntryStat>> {
        check_name(name)?;
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(EntryStat {
                kind: EntryKind::of(FileType::from_raw_mode(st.st_mode)),
                len: st.st_size as u64,
                inode: (st.st_dev, st.st_ino),
                // nlink_t is 32 bits on some targets.
                #[allow(clippy::unnecessary_cast)]
                links: st.st_nlink as u64,
                modified_ms: (st.st_mtime.max(0) as u64) * 1000 + st.st_mtime_nsec / 1_000_000,
            })),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The entries of this directory, sorted by name.
    pub(crate) fn entries(&self) -> io::Result<Vec<Entry>> {
        self.faults
            .check(IoStep::List, IoTiming::Before, &self.path)?;
        let mut dir = rustix::fs::Dir::read_from(&self.fd)?;
        let mut out = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry?;
            let bytes = entry.file_name().to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            let name = std::str::from_utf8(bytes).ok().map(str::to_string);
            let raw_name = String::from_utf8_lossy(bytes).into_owned();
            let mut kind = EntryKind::of(entry.file_type());
            if entry.file_type() == FileType::Unknown {
                // Some file systems do not fill in the type: ask, without
                // following a link.
                kind = match rustix::fs::statat(
                    &self.fd,
                    entry.file_name(),
                    AtFlags::SYMLINK_NOFOLLOW,
                ) {
                    Ok(st) => EntryKind::of(FileType::from_raw_mode(st.st_mode)),
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(e) => return Err(e.into()),
                };
            }
            out.push(Entry {
                name,
                raw_name,
                kind,
            });
        }
        out.sort_by(|a, b| a.raw_name.cmp(&b.raw_name));
        self.faults
            .check(IoStep::List, IoTiming::After, &self.path)?;
        Ok(out)
    }

    /// Names of the entries of one kind, sorted; other entries are skipped.
    pub(crate) fn names_of(&self, kind: EntryKind) -> io::Result<Vec<String>> {
        Ok(self
            .entries()?
            .into_iter()
            .filter(|e| e.kind == kind)
            .filter_map(|e| e.name)
            .collect())
    }

    /// Renames `from` here to `to_name` in `to`, failing with
    /// `AlreadyExists` if anything has that name: the rename is atomic and
    /// never replaces (see the module docs).
    pub(crate) fn rename_noreplace(
        &self,
        from: &str,
        to: &Dir,
        to_name: &str,
        step: IoStep,
    ) -> io::Result<()> {
        check_name(from)?;
        check_name(to_name)?;
        self.faults.around(step, &to.child(to_name), || {
            self.rename_noreplace_raw(from, to, to_name)
        })
    }

    fn rename_noreplace_raw(&self, from: &str, to: &Dir, to_name: &str) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        if !self.faults.lacks_rename_noreplace() {
            match rustix::fs::renameat_with(
                &self.fd,
                from,
                &to.fd,
                to_name,
                rustix::fs::RenameFlags::NOREPLACE,
            ) {
                Ok(()) => return Ok(()),
                Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOSYS) => {
                    // The file system lacks RENAME_NOREPLACE (e.g. NFS): below.
                }
                Err(e) => return Err(e.into()),
            }
        }
        match rustix::fs::statat(&self.fd, from, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                // Directories cannot be hard-linked. A plain rename would
                // replace only an empty directory at the target, which none
                // of our targets ever is; check first.
                if rustix::fs::statat(&to.fd, to_name, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                    return Err(io::Error::from(io::ErrorKind::AlreadyExists));
                }
                Ok(rustix::fs::renameat(&self.fd, from, &to.fd, to_name)?)
            }
            Ok(_) => {
                // A hard link fails if the target exists: atomic and
                // non-replacing; then the old name goes.
                rustix::fs::linkat(&self.fd, from, &to.fd, to_name, AtFlags::empty())?;
                match rustix::fs::unlinkat(&self.fd, from, AtFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the file `from` here a second name, `to_name` in `to`, failing
    /// with `AlreadyExists` if anything has that name (a hard link never
    /// replaces). `Ok(false)` where the file system has no hard links.
    pub(crate) fn link_noreplace(
        &self,
        from: &str,
        to: &Dir,
        to_name: &str,
        step: IoStep,
    ) -> io::Result<bool> {
        check_name(from)?;
        check_name(to_name)?;
        if self.faults.lacks_hard_links() {
            return Ok(false);
        }
        self.faults.around(step, &to.child(to_name), || {
            match rustix::fs::linkat(&self.fd, from, &to.fd, to_name, AtFlags::empty()) {
                Ok(()) => Ok(true),
                // No hard links here (FAT, some FUSE and network file
                // systems answer one of these).
                Err(rustix::io::Errno::PERM)
                | Err(rustix::io::Errno::OPNOTSUPP)
                | Err(rustix::io::Errno::NOSYS)
                | Err(rustix::io::Errno::MLINK) => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// Removes a file (or a link, never its target); false if absent.
    pub(crate) fn unlink(&self, name: &str) -> io::Result<bool> {
        check_name(name)?;
        let result = self.faults.around(IoStep::Remove, &self.child(name), || {
            Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())?)
        });
        match result {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes a directory tree without following links (a link inside is
    /// removed, not what it points to); false if absent. Entries that
    /// vanish meanwhile (another process removing the same tree) are fine.
    /// Refuses a tree deeper than [`MAX_REMOVE_DEPTH`]: twopc's own are two
    /// levels, and each level holds a descriptor and a stack frame.
    pub(crate) fn remove_tree(&self, name: &str) -> io::Result<bool> {
        self.remove_tree_at(name, 0)
    }

    fn remove_tree_at(&self, name: &str, depth: usize) -> io::Result<bool> {
        check_name(name)?;
        if depth > MAX_REMOVE_DEPTH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is more than {MAX_REMOVE_DEPTH} directories deep: not ours, not removed",
                    self.child(name).display()
                ),
            ));
        }
        self.faults
            .check(IoStep::Remove, IoTiming::Before, &self.child(name))?;
        match self.stat(name)? {
            None => return Ok(false),
            Some(st) if st.kind != EntryKind::Dir => {
                return match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(true),
                    Err(e) => Err(e.into()),
                };
            }
            Some(_) => {}
        }
        let sub = match self.open_dir(name) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let entries = match sub.entries() {
            Ok(entries) => entries,
            // Removed meanwhile by another remover (Linux lists a removed
            // directory as ENOENT).
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let Some(child) = entry.name else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} holds {:?}, whose name is not UTF-8: not ours, not removed",
                        sub.path.display(),
                        entry.raw_name
                    ),
                ));
            };
            if entry.kind == EntryKind::Dir {
                sub.remove_tree_at(&child, depth + 1)?;
            } else {
                match rustix::fs::unlinkat(&sub.fd, child.as_str(), AtFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        self.faults
            .check(IoStep::Remove, IoTiming::After, &self.child(name))?;
        Ok(true)
    }

    /// Makes this directory's entries durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.faults.around(IoStep::DirSync, &self.path, || {
            Ok(rustix::fs::fsync(&self.fd)?)
        })
    }

    /// Writes `bytes` as `name` so that readers see all or nothing: a
    /// scratch file in `tmp`, synced, then renamed into place; this
    /// directory is synced after. With `replace` false an existing `name`
    /// is an `AlreadyExists` error and stays as it was.
    pub(crate) fn write_atomically(
        &self,
        tmp: &Dir,
        name: &str,
        bytes: &[u8],
        replace: bool,
        step: IoStep,
    ) -> io::Result<()> {
        check_name(name)?;
        let scratch = format!("{:016x}.tmp", twopc_core::ids::random_u64());
        let target = self.child(name);
        let result = self.faults.around(step, &target, || {
            let mut file = tmp.create_new_file(&scratch)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            drop(file);
            if replace {
                rustix::fs::renameat(&tmp.fd, scratch.as_str(), &self.fd, name)?;
                Ok(())
            } else {
                tmp.rename_noreplace_raw(&scratch, self, name)
            }
        });
        if result.is_err() {
            let _ = rustix::fs::unlinkat(&tmp.fd, scratch.as_str(), AtFlags::empty());
        }
        result?;
        self.sync()
    }
}

fn not_regular(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{} is not a regular file (a link, a directory or a device was put where twopc keeps \
             a file of its own); it is not followed or used",
            path.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("twopc-dir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Two removers of the same tree at once (the subtasks of a sink each
    /// clear the trash when they open): both succeed, whichever removes an
    /// entry first. (A kernel that lists a directory removed meanwhile as
    /// ENOENT is tolerated too; this one lists it as empty.)
    #[test]
    fn two_removers_of_one_tree_both_succeed() {
        let root = scratch("race");
        for round in 0..20 {
            let tree = root.join("t");
            // Many small directories: each is a moment where one remover
            // has opened a directory the other is about to remove.
            for a in 0..400 {
                let leaf = tree.join(format!("a{a}"));
                std::fs::create_dir_all(&leaf).unwrap();
                if a % 4 == 0 {
                    std::fs::write(leaf.join("f"), b"x").unwrap();
                }
            }
            let barrier = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                let removers: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(|| {
                            let dir = Dir::open_path(&root, FaultHook::default()).unwrap();
                            barrier.wait();
                            dir.remove_tree("t")
                        })
                    })
                    .collect();
                for r in removers {
                    let result = r.join().unwrap();
                    assert!(result.is_ok(), "round {round}: {result:?}");
                }
            });
            assert!(!tree.exists(), "round {round}");
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A tree deeper than any of twopc's is refused, not descended into
    /// (each level holds a descriptor and a stack frame), and left whole.
    #[test]
    fn a_tree_deeper_than_the_limit_is_refused() {
        let root = scratch("deep");
        let mut deep = root.join("t");
        for i in 0..=MAX_REMOVE_DEPTH + 1 {
            deep = deep.join(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        let dir = Dir::open_path(&root, FaultHook::default()).unwrap();
        let err = dir.remove_tree("t").unwrap_err();
        assert!(err.to_string().contains("directories deep"), "{err}");
        assert!(deep.exists());
        // Within the limit it goes.
        let mut ok = root.join("u");
        for i in 0..MAX_REMOVE_DEPTH {
            ok = ok.join(format!("d{i}"));
        }
        std::fs::create_dir_all(&ok).unwrap();
        assert!(dir.remove_tree("u").unwrap());
        assert!(!root.join("u").exists());
        let _ = std::fs::remove_dir_all(&root);
    }
}
