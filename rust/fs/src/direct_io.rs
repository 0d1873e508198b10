//! The staged data file written with direct I/O (`O_DIRECT`), from a thread
//! of its own.
//!
//! Why: staged data is written once and read back by nobody until it is
//! committed. Through the page cache, each byte is first copied into a
//! freshly allocated cache page and later written back. On the benchmark
//! machine, the copy and the page allocation cost more than the disk: raw
//! sequential writes reached about 0.45 GB/s through the cache and 2 GB/s
//! with `O_DIRECT` (`docs/benchmarks.md`). Direct I/O sends the bytes from
//! the writer's buffer to the device.
//!
//! A direct write returns only when the device has the data, so the writes
//! run on an I/O thread. The task thread fills one aligned chunk while the
//! thread writes the previous ones. [`CHUNKS`] buffers are shared between
//! the two sides, so memory is bounded; when the disk falls behind, the
//! task thread waits for a free chunk.
//!
//! Direct I/O needs the file offset, the length and the buffer address
//! aligned to the device's block size. Chunks are [`CHUNK_BYTES`] long and
//! [`ALIGN`]-aligned. The tail shorter than a chunk is written through the
//! page cache when the file is sealed (at prepare), followed by the same
//! `fsync` as before. If the file system refuses direct I/O when the file
//! is opened, or refuses a direct write (`EINVAL`), the file is written
//! through the page cache instead. The result on disk is the same.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::thread::JoinHandle;

/// Alignment of offsets, lengths and buffers: the largest logical block
/// size of common devices.
pub const ALIGN: usize = 4096;
/// Bytes per direct write.
pub const CHUNK_BYTES: usize = 1024 * 1024;
/// Chunk buffers per open file: one being filled, the rest being written.
pub const CHUNKS: usize = 3;

/// A heap buffer with an [`ALIGN`]-aligned window of [`CHUNK_BYTES`]. The
/// window stays aligned when the buffer moves, because the heap block does
/// not.
struct Chunk {
    storage: Vec<u8>,
    start: usize,
}

impl Chunk {
    fn new() -> Chunk {
        let storage = vec![0u8; CHUNK_BYTES + ALIGN];
        let start = storage.as_ptr().align_offset(ALIGN);
        Chunk { storage, start }
    }

    fn window(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + CHUNK_BYTES]
    }

    fn bytes(&self, len: usize) -> &[u8] {
        &self.storage[self.start..self.start + len]
    }
}

/// Appends to a staged data file with direct I/O; see the module docs.
pub struct DirectWriter {
    /// The same file through the page cache: the tail, `fsync`, metadata.
    file: File,
    /// The chunk being filled and how much of it is.
    filling: Chunk,
    filled: usize,
    /// File offset of `filling`'s first byte.
    offset: u64,
    to_io: Option<SyncSender<(Chunk, u64)>>,
    from_io: Receiver<(Chunk, io::Result<()>)>,
    /// Chunks handed to the I/O thread and not yet returned.
    in_flight: usize,
    spare: Vec<Chunk>,
    io: Option<JoinHandle<()>>,
}

impl DirectWriter {
    /// Starts direct appends to a file that is `len` bytes long (a multiple
    /// of [`ALIGN`]), given two descriptors of it: `direct`, opened with
    /// `O_DIRECT`, and `cached`, without. Fails only if no thread can be
    /// started.
    pub fn start(direct: File, cached: File, len: u64) -> io::Result<DirectWriter> {
        Self::start_with(direct, cached, len, false)
    }

    /// As [`DirectWriter::start`]; `refuse_direct` makes the I/O thread act
    /// as if the file system refused every direct write with `EINVAL`, so
    /// the fallback to the page cache can be tested where direct I/O works.
    pub(crate) fn start_with(
        direct: File,
        cached: File,
        len: u64,
        refuse_direct: bool,
    ) -> io::Result<DirectWriter> {
        if len % ALIGN as u64 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("direct appends must start at a block boundary, not at byte {len}"),
            ));
        }
        let file = cached;
        let for_io = file.try_clone()?;
        let (to_io, jobs) = sync_channel::<(Chunk, u64)>(CHUNKS);
        let (done, from_io) = channel();
        let io = std::thread::Builder::new()
            .name("twopc-direct-io".to_string())
            .spawn(move || write_chunks(direct, for_io, jobs, done, refuse_direct))?;
        Ok(DirectWriter {
            file,
            filling: Chunk::new(),
            filled: 0,
            offset: len,
            to_io: Some(to_io),
            from_io,
            in_flight: 0,
            spare: Vec::new(),
            io: Some(io),
        })
    }

    /// The file through the page cache.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Appends `bytes`. An error of an earlier chunk's write is reported
    /// here (or by [`DirectWriter::seal`]); after an error the file's
    /// content is undefined and the transaction must be aborted.
    pub fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let n = bytes.len().min(CHUNK_BYTES - self.filled);
            self.filling.window()[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == CHUNK_BYTES {
                self.submit()?;
            }
        }
        Ok(())
    }

    /// Appends one record, and a line break after it if `newline`: the
    /// per-record path, one copy when the record fits the chunk.
    pub fn write_record(&mut self, record: &[u8], newline: bool) -> io::Result<()> {
        let n = record.len() + usize::from(newline);
        if n > CHUNK_BYTES - self.filled {
            self.write_all(record)?;
            return if newline {
                self.write_all(b"\n")
            } else {
                Ok(())
            };
        }
        let at = self.filled;
        let window = self.filling.window();
        window[at..at + record.len()].copy_from_slice(record);
        if newline {
            window[at + record.len()] = b'\n';
        }
        self.filled += n;
        if self.filled == CHUNK_BYTES {
            self.submit()?;
        }
        Ok(())
    }

    /// Hands the full chunk to the I/O thread and takes a free one.
    fn submit(&mut self) -> io::Result<()> {
        let next = match self.spare.pop() {
            Some(c) => c,
            None if self.in_flight + 1 < CHUNKS => Chunk::new(),
            None => self.reclaim()?,
        };
        let full = std::mem::replace(&mut self.filling, next);
        let Some(to_io) = &self.to_io else {
            return Err(io_thread_gone());
        };
        to_io
            .send((full, self.offset))
            .map_err(|_| io_thread_gone())?;
        self.in_flight += 1;
        self.offset += CHUNK_BYTES as u64;
        self.filled = 0;
        Ok(())
    }

    /// Waits for the I/O thread to return a chunk, with its write's result.
    fn reclaim(&mut self) -> io::Result<Chunk> {
        let (chunk, result) = self.from_io.recv().map_err(|_| io_thread_gone())?;
        self.in_flight -= 1;
        result.map(|()| chunk)
    }

    /// Waits for every chunk to be written, writes the tail through the page
    /// cache and syncs the file (data and metadata). Returns the file's
    /// length.
    pub fn seal(&mut self) -> io::Result<u64> {
        while self.in_flight > 0 {
            let chunk = self.reclaim()?;
            self.spare.push(chunk);
        }
        if self.filled > 0 {
            self.file
                .write_all_at(self.filling.bytes(self.filled), self.offset)?;
            self.offset += self.filled as u64;
            self.filled = 0;
        }
        self.file.sync_all()?;
        Ok(self.offset)
    }
}

impl Drop for DirectWriter {
    fn drop(&mut self) {
        // Closing the channel ends the I/O thread after its current write;
        // joining means no write of this file outlives the writer.
        self.to_io = None;
        if let Some(io) = self.io.take() {
            let _ = io.join();
        }
    }
}

fn io_thread_gone() -> io::Error {
    io::Error::other("the direct I/O thread of the staged file has stopped")
}

/// The I/O thread: writes each chunk at its offset and hands it back.
fn write_chunks(
    direct: File,
    cached: File,
    jobs: Receiver<(Chunk, u64)>,
    done: Sender<(Chunk, io::Result<()>)>,
    refuse_direct: bool,
) {
    let mut use_direct = true;
    for (chunk, offset) in jobs {
        let bytes = chunk.bytes(CHUNK_BYTES);
        let mut result = if use_direct && refuse_direct {
            Err(io::Error::from_raw_os_error(
                rustix::io::Errno::INVAL.raw_os_error(),
            ))
        } else if use_direct {
            direct.write_all_at(bytes, offset)
        } else {
            cached.write_all_at(bytes, offset)
        };
        if use_direct && is_invalid_argument(&result) {
            // This file system takes O_DIRECT at open but not these
            // writes: the page cache then, for the rest of the file.
            use_direct = false;
            log::debug!("direct I/O refused (EINVAL); writing through the page cache");
            result = cached.write_all_at(bytes, offset);
        }
        if done.send((chunk, result)).is_err() {
            return;
        }
    }
}

fn is_invalid_argument(result: &io::Result<()>) -> bool {
    matches!(result, Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::{Path, PathBuf};

    /// A fresh directory under `base` (removed at the end of the test).
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(base: &Path, name: &str) -> TempDir {
            let dir = base.join(format!("twopc-direct-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Bytes that tell every position apart, so a chunk written at the
    /// wrong offset shows.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i % 251) as u8 ^ (i / 251 % 256) as u8)
            .collect()
    }

    /// Opens `path` twice, with and (where the file system refuses
    /// O_DIRECT) without direct I/O; true when direct I/O was granted.
    fn descriptors(path: &Path) -> (File, File, bool) {
        let cached = OpenOptions::new().write(true).open(path).unwrap();
        let flag = rustix::fs::OFlags::DIRECT.bits() as i32;
        match OpenOptions::new().write(true).custom_flags(flag).open(path) {
            Ok(direct) => (direct, cached, true),
            Err(_) => (cached.try_clone().unwrap(), cached, false),
        }
    }

    /// Writes `total` bytes in odd pieces and checks the file is exact.
    fn write_in_pieces(dir: &Path, total: usize, refuse_direct: bool) -> u64 {
        let path = dir.join("data");
        File::create(&path).unwrap();
        let expected = pattern(total);
        let (direct, cached, _) = descriptors(&path);
        let mut w = DirectWriter::start_with(direct, cached, 0, refuse_direct).unwrap();
        // Odd piece sizes, so pieces straddle chunk boundaries.
        for piece in expected.chunks(100_003) {
            w.write_all(piece).unwrap();
        }
        let len = w.seal().unwrap();
        drop(w);
        assert_eq!(std::fs::read(&path).unwrap(), expected, "file content");
        len
    }

    #[test]
    fn chunks_and_tail_land_at_their_offsets() {
        let dir = TempDir::new(&std::env::temp_dir(), "content");
        // More chunks than buffers, plus a tail that is not block-aligned.
        let total = CHUNK_BYTES * (CHUNKS + 4) + 12_345;
        assert_eq!(write_in_pieces(&dir.0, total, false), total as u64);
    }

    #[test]
    fn exact_chunks_and_tiny_files_are_whole() {
        let dir = TempDir::new(&std::env::temp_dir(), "sizes");
        for total in [0, 1, ALIGN - 1, ALIGN, CHUNK_BYTES, 2 * CHUNK_BYTES] {
            let sub = dir.0.join(total.to_string());
            std::fs::create_dir_all(&sub).unwrap();
            assert_eq!(write_in_pieces(&sub, total, false), total as u64);
        }
    }

    #[test]
    fn refused_direct_writes_fall_back_to_the_page_cache() {
        // EINVAL on a direct write (a file system that takes O_DIRECT at
        // open but not these writes): the rest goes through the page cache
        // and the content is exact.
        let dir = TempDir::new(&std::env::temp_dir(), "einval");
        let total = CHUNK_BYTES * 3 + 77;
        assert_eq!(write_in_pieces(&dir.0, total, true), total as u64);
    }

    #[test]
    fn a_start_off_a_block_boundary_is_refused() {
        let dir = TempDir::new(&std::env::temp_dir(), "unaligned");
        let path = dir.0.join("data");
        std::fs::write(&path, b"seven b").unwrap();
        let (direct, cached, _) = descriptors(&path);
        let err = DirectWriter::start(direct, cached, 7)
            .err()
            .expect("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn content_is_whole_on_disk_and_on_tmpfs() {
        // Whether or not the file system grants O_DIRECT, the content must
        // be exact.
        for base in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
            if !base.is_dir() {
                continue;
            }
            let dir = TempDir::new(&base, "fs-kinds");
            assert_eq!(
                write_in_pieces(&dir.0, CHUNK_BYTES + 10, false),
                (CHUNK_BYTES + 10) as u64
            );
        }
    }
}
