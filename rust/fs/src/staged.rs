//! The data file of the open transaction: how staged records reach the
//! disk, and how every failure on the way is kept until prepare reports it.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::dir::Dir;
use crate::faults::{FaultHook, IoStep, IoTiming};
use crate::names::DATA_FILE;
use twopc_core::records::RecordBatch;

const WRITE_BUFFER: usize = 256 * 1024;
/// Staged bytes after which the data written so far is handed to the
/// background write-back (see [`writeback`]), which then drops it from the
/// page cache. Small enough that the cache pages of a transaction are
/// reused while still hot; measured against 1 and 16 MiB on the benchmark
/// machine (1 MiB syncs too often, 16 MiB lets the cache grow).
const WRITEBACK_EVERY: u64 = 4 * 1024 * 1024;

/// How staged data is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoMode {
    /// Direct I/O where the file system allows it, else the page cache.
    #[default]
    Auto,
    /// Direct I/O only: a file system that refuses it is an error at the
    /// first write, naming the directory.
    Direct,
    /// Through the page cache, with background write-back.
    Buffered,
}

/// The first error the background write-back met for one data file, kept
/// for prepare to report. The thread syncs through an open file description
/// of its own (see `writeback::request`): Linux reports a failed write-back
/// once per description, so prepare's own `fsync` reports it too; the slot
/// is a second way.
type WritebackError = Arc<Mutex<Option<io::Error>>>;

enum Out {
    Cached(BufWriter<File>),
    #[cfg(target_os = "linux")]
    Direct(crate::direct_io::DirectWriter),
}

/// The open transaction's data file.
pub(crate) struct StagedFile {
    path: PathBuf,
    out: Out,
    len: u64,
    written_back: u64,
    writeback_error: WritebackError,
    faults: FaultHook,
}

impl StagedFile {
    /// Creates the data file in `dir` (the transaction's directory),
    /// exclusively and without following links.
    pub(crate) fn create(dir: &Dir, mode: IoMode) -> io::Result<StagedFile> {
        let path = dir.child(DATA_FILE);
        let file = dir.create_new_file(DATA_FILE)?;
        let out = match mode {
            IoMode::Buffered => Out::Cached(BufWriter::with_capacity(WRITE_BUFFER, file)),
            IoMode::Auto | IoMode::Direct => direct_or_cached(dir, file, mode)?,
        };
        Ok(StagedFile {
            path,
            out,
            len: 0,
            written_back: 0,
            writeback_error: Arc::new(Mutex::new(None)),
            faults: dir.faults().clone(),
        })
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// True when records go through direct I/O.
    #[cfg(test)]
    pub(crate) fn is_direct(&self) -> bool {
        match self.out {
            Out::Cached(_) => false,
            #[cfg(target_os = "linux")]
            Out::Direct(_) => true,
        }
    }

    /// Appends a batch's records, each followed by a line break if
    /// `newline`.
    pub(crate) fn write_batch(&mut self, batch: &RecordBatch<'_>, newline: bool) -> io::Result<()> {
        self.faults
            .check(IoStep::Write, IoTiming::Before, &self.path)?;
        let terminator = newline.then_some(b'\n');
        let written = match batch.output_form(terminator) {
            // Laid out as the file holds it (the JVM sends it so): one copy.
            Some(bytes) => {
                self.append(bytes)?;
                bytes.len() as u64
            }
            None => self.append_records(batch, newline)?,
        };
        self.len += written;
        if self.len - self.written_back >= WRITEBACK_EVERY {
            self.written_back = self.len;
            if let Out::Cached(out) = &mut self.out {
                // What the buffer holds reaches the file first.
                out.flush()?;
                writeback::request(out.get_ref(), &self.writeback_error);
            }
        }
        self.faults
            .check(IoStep::Write, IoTiming::After, &self.path)?;
        Ok(())
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.out {
            Out::Cached(out) => out.write_all(bytes),
            #[cfg(target_os = "linux")]
            Out::Direct(out) => out.write_all(bytes),
        }
    }

    /// The per-record path: each record copied, a line break after it if
    /// `newline`. Returns the bytes appended.
    fn append_records(&mut self, batch: &RecordBatch<'_>, newline: bool) -> io::Result<u64> {
        let mut written = 0u64;
        for record in batch.iter() {
            match &mut self.out {
                Out::Cached(out) => {
                    out.write_all(record)?;
                    if newline {
                        out.write_all(b"\n")?;
                    }
                }
                #[cfg(target_os = "linux")]
                Out::Direct(out) => out.write_record(record, newline)?,
            }
            written += record.len() as u64 + u64::from(newline);
        }
        Ok(written)
    }

    /// Everything written on the disk, data and metadata, and out of the
    /// page cache; returns the file's length. An error the background
    /// write-back met is reported here, even if this `fsync` succeeds.
    pub(crate) fn seal(&mut self) -> io::Result<u64> {
        let path = self.path.clone();
        self.faults
            .check(IoStep::DataSync, IoTiming::Before, &path)?;
        let file = match &mut self.out {
            Out::Cached(out) => {
                out.flush()?;
                out.get_ref().sync_all()?;
                out.get_ref()
            }
            #[cfg(target_os = "linux")]
            Out::Direct(out) => {
                out.seal()?;
                out.file()
            }
        };
        if let Some(e) = self
            .writeback_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "the background write-back of {} failed earlier: {e}",
                    path.display()
                ),
            ));
        }
        let on_disk = file.metadata()?.len();
        drop_from_page_cache(file);
        self.faults
            .check(IoStep::DataSync, IoTiming::After, &path)?;
        if on_disk != self.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds {on_disk} bytes after syncing, but {} were written to it",
                    path.display(),
                    self.len
                ),
            ));
        }
        Ok(self.len)
    }
}

#[cfg(target_os = "linux")]
fn direct_or_cached(dir: &Dir, file: File, mode: IoMode) -> io::Result<Out> {
    use crate::direct_io::DirectWriter;
    match dir.open_for_write(DATA_FILE, rustix::fs::OFlags::DIRECT) {
        Ok(direct) => Ok(Out::Direct(DirectWriter::start(direct, file, 0)?)),
        Err(e) if mode == IoMode::Direct => Err(io::Error::new(
            e.kind(),
            format!(
                "direct I/O was required (I/O mode DIRECT) but {} refuses it: {e}. Use the I/O \
                 mode AUTO or BUFFERED for this file system",
                dir.path().display()
            ),
        )),
        Err(e) => {
            log::debug!(
                "{}: direct I/O refused ({e}); writing through the page cache",
                dir.path().display()
            );
            Ok(Out::Cached(BufWriter::with_capacity(WRITE_BUFFER, file)))
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn direct_or_cached(dir: &Dir, file: File, mode: IoMode) -> io::Result<Out> {
    if mode == IoMode::Direct {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "direct I/O was required (I/O mode DIRECT) but is not available on this \
                 platform for {}",
                dir.path().display()
            ),
        ));
    }
    Ok(Out::Cached(BufWriter::with_capacity(WRITE_BUFFER, file)))
}

/// Writes staged data back to the disk while the transaction is still being
/// written, so that the fsync at prepare (which holds up the checkpoint
/// barrier and the task thread) finds little left to do.
///
/// Without it the kernel starts write-back only past its dirty thresholds
/// (10 % of memory, or 30 s), i.e. never within a checkpoint interval: all of
/// an interval's data would be written out inside prepare, with the task
/// thread waiting and the disk idle the rest of the time. One thread per
/// process takes `fdatasync` requests for open data files; a request that
/// finds it busy is dropped (the next one, or prepare, covers the data), so
/// the writer never waits for it. An error it meets is kept in the file's
/// slot and fails the prepare; what it synced it drops from the page cache
/// ([`drop_from_page_cache`]).
mod writeback {
    use std::fs::File;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
    use std::sync::{Mutex, MutexGuard};
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use super::WritebackError;

    type Request = (File, WritebackError);

    /// The thread and the way to reach it; started by the first request.
    struct Worker {
        requests: SyncSender<Request>,
        thread: JoinHandle<()>,
    }

    static WORKER: Mutex<Option<Worker>> = Mutex::new(None);
    /// Set by [`stop`]: no thread is started again in this process (or this
    /// copy of the library), so none can outlive its release.
    static STOPPED: AtomicBool = AtomicBool::new(false);

    /// The worker slot. A panic while it was locked leaves at worst no
    /// worker (the next request starts one), so the poison flag is ignored.
    fn worker() -> MutexGuard<'static, Option<Worker>> {
        WORKER.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start() -> Option<Worker> {
        let (requests, rx) = sync_channel::<Request>(1);
        let thread = std::thread::Builder::new()
            .name("twopc-writeback".to_string())
            .spawn(move || {
                for (file, slot) in rx {
                    match file.sync_data() {
                        Ok(()) => super::drop_from_page_cache(&file),
                        // Only a failed write-back is kept. A file system
                        // that refuses a sync through a read-only handle
                        // (some FUSE or network ones) must not fail every
                        // prepare, whose own sync checks the data anyway
                        // (found by review).
                        Err(e) if super::write_back_failed(&e) => {
                            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
                            slot.get_or_insert(e);
                        }
                        Err(e) => log::debug!("background write-back skipped: {e}"),
                    }
                }
            })
            .ok()?;
        Some(Worker { requests, thread })
    }

    /// Stops the thread for good (later requests are ignored: prepare syncs
    /// every file itself, so nothing is lost). Waits up to `wait` for a sync
    /// under way to finish.
    ///
    /// The wait polls instead of blocking on a channel: a blocking receive
    /// gives the calling thread a thread-local with a destructor in this
    /// library, and glibc then keeps the library mapped for as long as that
    /// thread lives, which, for a JVM thread, defeats the release.
    pub(crate) fn stop(wait: Duration) -> super::WritebackStop {
        let worker = {
            let mut slot = worker();
            STOPPED.store(true, Ordering::SeqCst);
            slot.take()
        };
        let Some(Worker { requests, thread }) = worker else {
            return super::WritebackStop::NeverRan;
        };
        drop(requests); // ends the thread's loop
        let deadline = Instant::now() + wait;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                log::warn!(
                    "the background write-back thread is still syncing a file after {}; it \
                     ends when that sync returns",
                    twopc_core::timefmt::exact(wait.as_millis() as u64)
                );
                return super::WritebackStop::StillRunning;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = thread.join();
        super::WritebackStop::Ended
    }

    /// Asks for `file`'s written data to be synced in the background.
    pub(super) fn request(file: &File, slot: &WritebackError) {
        // A description of its own, not a `dup` of the writer's: an error
        // is reported once per open file description, so through a shared
        // one the thread's `fsync` would take it from prepare's, and
        // prepare could read the slot before the thread filled it (found
        // by review). Without one, no request: prepare syncs everything.
        let Some(dup) = super::own_description(file) else {
            return;
        };
        let mut worker = worker();
        if STOPPED.load(Ordering::SeqCst) {
            return;
        }
        if worker.is_none() {
            *worker = start();
        }
        let Some(Worker { requests, .. }) = worker.as_ref() else {
            return; // no thread could be started: prepare syncs everything
        };
        match requests.try_send((dup, slot.clone())) {
            Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Records `error` as if the write-back had met it (tests).
    #[cfg(test)]
    pub(super) fn fail(slot: &WritebackError, error: std::io::Error) {
        slot.lock().unwrap().get_or_insert(error);
    }
}

/// Whether `e` says that written data did not reach the disk (EIO,
/// ENOSPC, EDQUOT), rather than that the sync was refused.
fn write_back_failed(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(5 | 28 | 122))
}

/// A new open file description of the file `file` has open (its own
/// offset and error state), read-only, for syncing it: through the
/// process's own descriptor link, which names that very file whatever its
/// path is now. `None` where that is not possible (no `/proc`).
fn own_description(file: &File) -> Option<File> {
    use std::os::fd::AsRawFd;
    std::fs::File::open(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// What [`stop_writeback`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritebackStop {
    /// No write-back thread was started.
    NeverRan,
    /// The thread ran and has ended.
    Ended,
    /// The thread is still in a sync after the wait (a disk that does not
    /// answer); it ends when that sync returns.
    StillRunning,
}

/// Stops the background write-back thread for good, if one runs, waiting
/// up to `wait` for a sync under way.
/// Later writes go without background write-back (prepare still syncs
/// everything). For the unloading of the library that holds this code (a
/// JVM unloads a job's copy of it when the job's class loader is released):
/// no thread of ours may still run code of a copy that is about to be
/// unmapped, and none may start after.
pub fn stop_writeback(wait: std::time::Duration) -> WritebackStop {
    writeback::stop(wait)
}

/// Tells the kernel that the file's data, already on the disk, need not stay
/// in the page cache (`POSIX_FADV_DONTNEED`; advice only, so errors are
/// ignored and other systems skip it).
///
/// Why: staged data is written once and never read back by the sink; it is
/// read, if at all, later and by someone else. Left in the cache it only
/// makes the cache grow by the write rate, and every new page-cache page
/// costs the writer a fresh page allocation (and reclaim, once memory is
/// full). Dropped right after write-back, the same few pages are reused. On
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::FaultHook;
    use twopc_core::records::RecordBatchBuf;

    fn temp(name: &str) -> (PathBuf, Dir) {
        let path = std::env::temp_dir().join(format!("twopc-staged-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        let dir = Dir::open_path(&path, FaultHook::default()).unwrap();
        (path, dir)
    }

    #[test]
    fn a_write_back_error_fails_the_seal_even_if_fsync_then_succeeds() {
        let (path, dir) = temp("wb");
        let mut f = StagedFile::create(&dir, IoMode::Buffered).unwrap();
        assert!(!f.is_direct());
        f.write_batch(&RecordBatchBuf::from_records(["abc"]).batch(), true)
            .unwrap();
        writeback::fail(&f.writeback_error, io::Error::from_raw_os_error(5));
        let err = f.seal().unwrap_err();
        assert!(err.to_string().contains("background write-back"), "{err}");
        let _ = std::fs::remove_dir_all(path);
    }

    /// The write-back thread's description of a data file is its own, not
    /// a `dup` (which shares the offset, and the error state an `fsync`
    /// takes).
    #[test]
    fn the_write_back_syncs_through_a_description_of_its_own() {
        use std::io::Seek;
        let (path, _dir) = temp("wb-own");
        let mut file = std::fs::File::create(path.join("data")).unwrap();
        file.write_all(b"0123456789").unwrap();
        let mut own = own_description(&file).unwrap();
        assert_eq!(own.stream_position().unwrap(), 0, "not a dup");
        assert_eq!(file.stream_position().unwrap(), 10);
        let a = std::fs::metadata(path.join("data")).unwrap();
        let b = own.metadata().unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "the same file");
        own.sync_data().unwrap();
        let _ = std::fs::remove_dir_all(path);
        // Only errors of the data itself are kept for prepare.
        for (errno, kept) in [(5, true), (28, true), (122, true), (9, false), (22, false)] {
            assert_eq!(
                write_back_failed(&io::Error::from_raw_os_error(errno)),
                kept,
                "{errno}"
            );
        }
    }

    /// The only test that stops the thread (tests share it, and a stop is
    /// for good): so the stop below finds the thread its own writes started.
    #[test]
    fn the_write_back_thread_stops_for_good_with_nothing_lost() {
        let (path, dir) = temp("wb-stop");
        let mut f = StagedFile::create(&dir, IoMode::Buffered).unwrap();
        let record = RecordBatchBuf::from_records([vec![b'x'; 64 * 1024]]);
        let per_request = WRITEBACK_EVERY / record.batch().payload_bytes() + 1;
        for round in 0..2 {
            for _ in 0..per_request {
                f.write_batch(&record.batch(), false).unwrap();
            }
            // The first round started the thread; after the stop, writes
            // start none.
            assert_eq!(
                stop_writeback(std::time::Duration::from_secs(10)),
                if round == 0 {
                    WritebackStop::Ended
                } else {
                    WritebackStop::NeverRan
                },
                "round {round}"
            );
        }
        let len = f.seal().unwrap();
        assert_eq!(len, 2 * per_request * record.batch().payload_bytes());
        assert_eq!(std::fs::metadata(path.join(DATA_FILE)).unwrap().len(), len);
        let _ = std::fs::remove_dir_all(path);
    }

    #[test]
    fn every_mode_writes_the_same_bytes() {
        for mode in [IoMode::Auto, IoMode::Direct, IoMode::Buffered] {
            let (path, dir) = temp(&format!("{mode:?}"));
            let mut f = StagedFile::create(&dir, mode).unwrap();
            assert_eq!(f.is_direct(), mode != IoMode::Buffered, "{mode:?}");
            let records: Vec<Vec<u8>> = (0..50_000).map(|i| format!("r{i}").into_bytes()).collect();
            // Both layouts a batch comes in, alternating: the file must not
            // tell them apart.
            for (i, chunk) in records.chunks(977).enumerate() {
                let mut batch = if i % 2 == 0 {
                    RecordBatchBuf::terminated_by(b'\n')
                } else {
                    RecordBatchBuf::new()
                };
                for r in chunk {
                    batch.push(r);
                }
                f.write_batch(&batch.batch(), true).unwrap();
            }
            let len = f.seal().unwrap();
            drop(f);
            let expected: Vec<u8> = records
                .iter()
                .flat_map(|r| [&r[..], b"\n"].concat())
                .collect();
            assert_eq!(len, expected.len() as u64);
            assert_eq!(
                std::fs::read(path.join(DATA_FILE)).unwrap(),
                expected,
                "{mode:?}"
            );
            let _ = std::fs::remove_dir_all(path);
        }
    }
}
