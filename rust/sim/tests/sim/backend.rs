//! The destinations a schedule runs against (in memory, a directory, an S3
//! bucket), behind one interface: how to give a subtask its own
//! destination handle, and how to read back what readers see and what is
//! still staged.

use std::path::PathBuf;
use std::sync::Arc;

use twopc_core::destination::{CommittedTransaction, StagedState};
use twopc_core::memory::{MemoryDestination, MemoryStore};
use twopc_core::{CheckpointId, Destination, LineageId, SinkId, TransactionId};
use twopc_fs::{committed_view, CommitOrder, FsDestination, FsOptions, IoMode, Layout};

use twopc_objstore::{CredentialSource, Credentials, ObjectStoreDestination, S3Options, Secret};

use super::faults::{FaultyDestination, PlanIo, PlanRequests, SharedFaults};

pub trait Backend {
    type Dest: Destination;

    fn name(&self) -> &'static str;

    /// A new destination handle, as a (re)started subtask would open one.
    fn destination(&self) -> Self::Dest;

    /// Every record readers can see, one entry per visible copy.
    fn visible(&self) -> Vec<Vec<u8>>;

    /// Names of staged (uncommitted) transactions, however they got there.
    fn staged(&self) -> Vec<String>;

    /// Staged transactions that were prepared, with their checkpoint.
    fn prepared(&self) -> Vec<(TransactionId, CheckpointId)>;

    /// Staged transactions whose commit was decided but did not finish
    /// (the filesystem destination's `Committing`: interrupted while it
    /// published): they hold their records until a commit or a roll-forward
    /// finishes them.
    fn decided(&self) -> Vec<(TransactionId, CheckpointId, LineageId)>;

    /// The destination's commit records.
    fn committed(&self) -> Vec<CommittedTransaction>;

    /// The destination times out a staged transaction on its own (a
    /// broker's or database's transaction timeout). False if it was not
    /// staged.
    fn expire_externally(&self, txn: &TransactionId, now_ms: u64) -> bool;

    /// What the destination's own bookkeeping must satisfy at the end of a
    /// schedule, beyond what readers see (none for most).
    fn audit(&self) -> Result<(), String> {
        Ok(())
    }
}

pub struct MemoryBackend {
    pub store: MemoryStore,
    sink: SinkId,
}

impl MemoryBackend {
    pub fn new(sink: SinkId, faults: SharedFaults) -> Self {
        let store = MemoryStore::new();
        store.set_faults(move |op, txn| faults.decide(op, txn));
        MemoryBackend { store, sink }
    }
}

impl Backend for MemoryBackend {
    type Dest = MemoryDestination;

    fn name(&self) -> &'static str {
        "memory"
    }

    fn destination(&self) -> MemoryDestination {
        self.store.destination(&self.sink)
    }

    fn visible(&self) -> Vec<Vec<u8>> {
        self.store.visible_records()
    }

    fn staged(&self) -> Vec<String> {
        self.store
            .staged_ids()
            .into_iter()
            .map(|t| t.as_str().to_string())
            .collect()
    }

    fn prepared(&self) -> Vec<(TransactionId, CheckpointId)> {
        self.store.prepared_ids()
    }

    /// A commit in memory is one step: never half done.
    fn decided(&self) -> Vec<(TransactionId, CheckpointId, LineageId)> {
        Vec::new()
    }

    fn committed(&self) -> Vec<CommittedTransaction> {
        self.store.committed()
    }

    fn expire_externally(&self, txn: &TransactionId, _now_ms: u64) -> bool {
        self.store.expire_externally(txn)
    }
}

/// The real filesystem destination in a private temporary directory,
/// removed when the schedule ends.
pub struct FsBackend {
    dir: PathBuf,
    sink: SinkId,
    faults: SharedFaults,
    io_mode: IoMode,
    commit_order: CommitOrder,
}

impl FsBackend {
    pub fn new(
        sink: SinkId,
        faults: SharedFaults,
        seed: u64,
        buffered: bool,
        visible_first: bool,
    ) -> Self {
        let dir = std::env::temp_dir().join(format!("twopc-sim-{}-{seed}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the simulation's temporary directory");
        FsBackend {
            dir,
            sink,
            faults,
            io_mode: if buffered {
                IoMode::Buffered
            } else {
                IoMode::Auto
            },
            commit_order: if visible_first {
                CommitOrder::VisibleFirst
            } else {
                CommitOrder::DurableFirst
            },
        }
    }

    fn layout(&self) -> Layout {
        Layout::new(&self.dir, &self.sink)
    }

    fn options(&self) -> FsOptions {
        FsOptions {
            io_mode: self.io_mode,
            commit_order: self.commit_order,
            ..FsOptions::new(&self.dir)
        }
    }
}

/// Filesystem schedules that ended with commit records folded into history
/// segments: the run checks that compaction met the protocol's trouble.
pub static FS_RUNS_WITH_HISTORY: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

impl Drop for FsBackend {
    fn drop(&mut self) {
        let history = self
            .dir
            .join("_twopc")
            .join(self.sink.as_str())
            .join("history");
        if std::fs::read_dir(history).is_ok_and(|mut d| d.next().is_some()) {
            FS_RUNS_WITH_HISTORY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Backend for FsBackend {
    type Dest = FaultyDestination<FsDestination>;

    fn name(&self) -> &'static str {
        "fs"
    }

    /// A destination whose calls may fail as a whole (before or after
    /// their effect) and whose I/O steps may fail one by one (ENOSPC, EIO).
    fn destination(&self) -> Self::Dest {
        let io = Arc::new(PlanIo::new(self.faults.clone()));
        let fs = FsDestination::open_with_faults(self.options(), &self.sink, io.clone())
            .expect("opening the filesystem destination");
        io.activate();
        FaultyDestination::new(fs, self.faults.clone(), &self.sink)
    }

    /// What a file reader sees: every file directly in the output directory
    /// except hidden ones (`.`/`_`, which Flink's and Hadoop's readers skip),
    /// one record per line.
    fn visible(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return out;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('_') || name.starts_with('.') || !entry.path().is_file() {
                continue;
            }
            let bytes = std::fs::read(entry.path()).expect("reading a visible file");
            out.extend(
                bytes
                    .split(|b| *b == b'\n')
                    .filter(|line| !line.is_empty())
                    .map(<[u8]>::to_vec),
            );
        }
        out
    }

    /// Raw directory names under `_twopc/<sink>/staging`, so that anything
    /// left there counts, parseable or not.
    fn staged(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.layout().staging) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn prepared(&self) -> Vec<(TransactionId, CheckpointId)> {
        let (staged, _) = self
            .layout()
            .read_staged()
            .expect("reading the staging area");
        staged
            .into_iter()
            .filter_map(|s| {
                let cp = s.prepared().and_then(|h| h.checkpoint())?;
                Some((s.transaction, cp))
            })
            .collect()
    }

    fn decided(&self) -> Vec<(TransactionId, CheckpointId, LineageId)> {
        let (staged, _) = self
            .layout()
            .read_staged()
            .expect("reading the staging area");
        staged
            .into_iter()
            .filter_map(|s| match s.state {
                StagedState::Committing(h) => Some((s.transaction, h.checkpoint()?, h.lineage)),
                _ => None,
            })
            .collect()
    }

    fn committed(&self) -> Vec<CommittedTransaction> {
        self.layout()
            .read_commit_records()
            .expect("reading commit records")
            .iter()
            .map(committed_view)
            .collect()
    }

    /// Emulates the destination's own timeout the way retention cleanup
    /// does it: tombstone, then the staging directory goes.
    fn expire_externally(&self, txn: &TransactionId, now_ms: u64) -> bool {
        if !self.layout().staging_dir(txn).is_dir() {
            return false;
        }
        let mut fs = FsDestination::open(self.options(), &self.sink)
            .expect("opening the filesystem destination");
        fs.expire(txn, now_ms)
            .expect("expiring a staged transaction");
        true
    }
}

/// The environment variable naming the local S3 server.
pub const S3_ENDPOINT_VAR: &str = "TWOPC_S3_ENDPOINT";

/// Object store schedules that ended with commit records folded into
/// history segments.
pub static OBJ_RUNS_WITH_HISTORY: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// The real object store destination on the local S3 server (moto), in a
/// bucket of its own per schedule.
///
/// What it emulates, and how:
/// * faults: the plan's call-level faults (`FaultyDestination`, as for the
///   filesystem) and request-level ones through the destination's request
///   hook: any S3 request refused before the server, or acted on by the
///   server with its answer lost (the object store's I/O steps);
/// * the destination's own timeout (`expire_externally`): a bucket
///   lifecycle rule (AbortIncompleteMultipartUpload) aborting the
///   transaction's upload behind the sink's back; it leaves the prepared
///   marker, as S3 would;
/// * a crash: the dropped handle's ownership lease is released (not
///   faulted), standing for a lease that lapsed during the downtime: the
///   lease's own expiry runs on the wall clock, which the simulation does
///   not wait for;
/// * `decided()`: none. A commit publishes with one CompleteMultipartUpload,
///   so a commit never stays half done: its output is visible, or its
///   upload still prepared.
///
/// What readers see is read from the bucket: listings of the objects and of
/// the multipart uploads, taken again whenever a destination sent a request
/// since (the server is slow, and the oracle looks often).
pub struct ObjBackend {
    options: S3Options,
    sink: SinkId,
    faults: SharedFaults,
    /// The reader's view (no faults): what tools and readers see.
    reader: std::sync::Mutex<ObjectStoreDestination>,
    /// Requests the destinations sent so far.
    sent: Arc<std::sync::atomic::AtomicU64>,
    /// The objects directly under the prefix, the prepared markers, the
    /// uploads and the commit records, as read when `sent` had the value
    /// kept with each.
    direct: Stamped<Vec<object_store::ObjectMeta>>,
    markers: Stamped<Vec<object_store::ObjectMeta>>,
    uploads: Stamped<Vec<twopc_objstore::s3api::OpenUpload>>,
    records: Stamped<Vec<CommittedTransaction>>,
    /// Objects read so far: (key, ETag, size) -> bytes. Objects never change
    /// in place (a key is one transaction's output or control object).
    seen: std::sync::Mutex<std::collections::HashMap<VersionKey, Arc<Vec<u8>>>>,
}

type VersionKey = (String, Option<String>, u64);

/// A value read from the bucket, with the number of destination requests
/// sent before it was read: still good while no request was sent since.
type Stamped<T> = std::sync::Mutex<Option<(u64, Arc<T>)>>;

impl ObjBackend {
    /// A fresh bucket on the server at `endpoint`.
    pub fn new(sink: SinkId, faults: SharedFaults, seed: u64, endpoint: &str) -> Self {
        let bucket = format!(
            "twopc-sim-{seed}-{:08x}",
            twopc_core::ids::random_u64() as u32
        );
        let mut options = S3Options::new(format!("s3://{bucket}/out"));
        options.endpoint = Some(endpoint.to_string());
        options.path_style = true;
        options.allow_http = true;
        options.credentials = CredentialSource::Static(Credentials {
            access_key_id: "testing".into(),
            secret_access_key: Secret::new("testing"),
            session_token: None,
            source: "simulation".into(),
        });
        // Faults show at once: no retries inside the client.
        options.max_retries = 0;
        options.retry_timeout_ms = 5_000;
        options.request_timeout_ms = 30_000;
        let reader = ObjectStoreDestination::open(options.clone(), &sink)
            .expect("opening the object store destination");
        reader
            .block_on(reader.api().create_bucket())
            .unwrap_or_else(|e| panic!("creating bucket {bucket} on {endpoint}: {e}"));
        ObjBackend {
            options,
            sink,
            faults,
            reader: std::sync::Mutex::new(reader),
            sent: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            direct: Default::default(),
            markers: Default::default(),
            uploads: Default::default(),
            records: Default::default(),
            seen: Default::default(),
        }
    }

    fn reader(&self) -> std::sync::MutexGuard<'_, ObjectStoreDestination> {
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `cached`, or else `read()` kept as it: read again once a destination
    /// sent a request since (or the backend changed the bucket itself).
    fn stamped<T>(
        &self,
        cached: &Stamped<T>,
        read: impl FnOnce(&ObjectStoreDestination) -> T,
    ) -> Arc<T> {
        let mut cached = cached.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.sent.load(std::sync::atomic::Ordering::SeqCst);
        if let Some((at, value)) = cached.as_ref() {
            if *at == now {
                return value.clone();
            }
        }
        let value = Arc::new(read(&self.reader()));
        *cached = Some((now, value.clone()));
        value
    }

    /// The objects directly under the prefix (one level: a listing of the
    /// whole bucket costs the server several times more).
    fn direct(&self) -> Arc<Vec<object_store::ObjectMeta>> {
        use object_store::ObjectStore;
        let prefix = self.options.target().expect("a valid URL").1;
        self.stamped(&self.direct, |r| {
            let prefix = object_store::path::Path::parse(&prefix).expect("a valid prefix");
            r.block_on(r.store().list_with_delimiter(Some(&prefix)))
                .expect("listing the bucket")
                .objects
        })
    }

    /// The prepared markers.
    fn markers(&self) -> Arc<Vec<object_store::ObjectMeta>> {
        use futures_util::TryStreamExt;
        use object_store::ObjectStore;
        self.stamped(&self.markers, |r| {
            let area = r.layout().area(twopc_objstore::names::PREPARED);
            let area = object_store::path::Path::parse(area.trim_end_matches('/'))
                .expect("a valid prefix");
            r.block_on(r.store().list(Some(&area)).try_collect())
                .expect("listing the prepared markers")
        })
    }

    /// Every open multipart upload of the bucket.
    fn uploads(&self) -> Arc<Vec<twopc_objstore::s3api::OpenUpload>> {
        self.stamped(&self.uploads, |r| {
            r.block_on(r.api().list_multipart_uploads(""))
                .expect("listing the multipart uploads")
        })
    }

    /// The bytes of a listed object (each version read once).
    fn read(&self, meta: &object_store::ObjectMeta) -> Arc<Vec<u8>> {
        use object_store::ObjectStoreExt;
        let version = (meta.location.to_string(), meta.e_tag.clone(), meta.size);
        if let Some(bytes) = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&version)
        {
            return bytes.clone();
        }
        let r = self.reader();
        let bytes = r
            .block_on(async { r.store().get(&meta.location).await?.bytes().await })
            .map(|b| Arc::new(b.to_vec()))
            .unwrap_or_else(|e| panic!("reading {}: {e}", meta.location));
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(version, bytes.clone());
        bytes
    }
}

impl Drop for ObjBackend {
    /// Counts a folded history, then empties and deletes the bucket (the
    /// server keeps everything in memory, and is shared).
    fn drop(&mut self) {
        use futures_util::{StreamExt, TryStreamExt};
        use object_store::multipart::MultipartStore;
        use object_store::ObjectStore;
        let r = self.reader();
        if r.history_segments().is_ok_and(|(live, _)| !live.is_empty()) {
            OBJ_RUNS_WITH_HISTORY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        r.block_on(async {
            if let Ok(uploads) = r.api().list_multipart_uploads("").await {
                for u in uploads {
                    if let Ok(path) = object_store::path::Path::parse(&u.key) {
                        let id = object_store::MultipartId::from(u.upload_id);
                        let _ = r.store().abort_multipart(&path, &id).await;
                    }
                }
            }
            let keys = r.store().list(None).map_ok(|m| m.location).boxed();
            let _: Vec<_> = r.store().delete_stream(keys).collect().await;
            let _ = r.api().delete_bucket().await;
        });
    }
}

impl Backend for ObjBackend {
    type Dest = FaultyDestination<ObjectStoreDestination>;

    fn name(&self) -> &'static str {
        "obj"
    }

    /// A destination whose calls may fail as a whole (before or after
    /// their effect) and whose S3 requests may fail one by one.
    fn destination(&self) -> Self::Dest {
        let requests = Arc::new(PlanRequests::new(self.faults.clone(), self.sent.clone()));
        let d = ObjectStoreDestination::open_with_faults(
            self.options.clone(),
            &self.sink,
            requests.clone(),
        )
        .expect("opening the object store destination");
        FaultyDestination::with_requests(d, self.faults.clone(), &self.sink, requests)
    }

    /// What a reader of the bucket sees: every object directly under the
    /// prefix except hidden ones (`.`/`_`, which Flink's and Hadoop's
    /// readers skip), one record per line.
    fn visible(&self) -> Vec<Vec<u8>> {
        let prefix = format!("{}/", self.options.target().expect("a valid URL").1);
        let mut out = Vec::new();
        for meta in self.direct().iter() {
            let Some(name) = meta.location.as_ref().strip_prefix(&prefix) else {
                continue;
            };
            if name.contains('/') || name.starts_with('_') || name.starts_with('.') {
                continue;
            }
            out.extend(
                self.read(meta)
                    .split(|b| *b == b'\n')
                    .filter(|line| !line.is_empty())
                    .map(<[u8]>::to_vec),
            );
        }
        out
    }

    /// Every open multipart upload in the bucket, by transaction id when
    /// it is one of the sink's, else by key, so that anything left counts.
    fn staged(&self) -> Vec<String> {
        let layout = self.reader().layout().clone();
        let mut names: Vec<String> = self
            .uploads()
            .iter()
            .map(|u| {
                layout
                    .txn_of_part_key(&u.key)
                    .map_or_else(|| u.key.clone(), |t| t.as_str().to_string())
            })
            .collect();
        names.sort();
        names
    }

    /// Uploads with a prepared marker that names them, as the destination
    /// itself tells prepared from open (see `twopc_objstore`'s docs).
    fn prepared(&self) -> Vec<(TransactionId, CheckpointId)> {
        use twopc_objstore::control::{decode, ControlObject};
        let layout = self.reader().layout().clone();
        let uploads = self.uploads();
        let mut out = Vec::new();
        for meta in self.markers().iter() {
            let Some(name) = meta
                .location
                .as_ref()
                .strip_prefix(&layout.area(twopc_objstore::names::PREPARED))
            else {
                continue;
            };
            let Some(txn) = TransactionId::parse(name).map(|p| p.id) else {
                continue;
            };
            let key = layout.part_key(&txn);
            let Ok(ControlObject::Prepared(marker)) = decode(&self.read(meta)) else {
                continue;
            };
            let Ok(location) = marker.check(&layout, &txn) else {
                continue;
            };
            let live = uploads
                .iter()
                .any(|u| u.key == key && u.upload_id == location.upload_id);
            if let (true, Some(cp)) = (live, marker.handle.checkpoint()) {
                out.push((txn, cp));
            }
        }
        out
    }

    fn decided(&self) -> Vec<(TransactionId, CheckpointId, LineageId)> {
        Vec::new()
    }

    fn committed(&self) -> Vec<CommittedTransaction> {
        self.stamped(&self.records, |r| {
            r.all_commit_records()
                .expect("reading commit records")
                .iter()
                .map(|r| r.view())
                .collect()
        })
        .to_vec()
    }

    /// A lifecycle rule (AbortIncompleteMultipartUpload) aborts the
    /// transaction's upload; nothing else changes.
    fn expire_externally(&self, txn: &TransactionId, _now_ms: u64) -> bool {
        use object_store::multipart::MultipartStore;
        let r = self.reader();
        let key = r.layout().part_key(txn);
        let uploads = r
            .block_on(r.api().list_multipart_uploads(&key))
            .expect("listing the multipart uploads");
        let mut aborted = false;
        for u in uploads.iter().filter(|u| u.key == key) {
            let path = object_store::path::Path::parse(&key).expect("a valid key");
            let id = object_store::MultipartId::from(u.upload_id.clone());
            r.block_on(r.store().abort_multipart(&path, &id))
                .expect("aborting an upload");
            aborted = true;
        }
        // The bucket changed behind the destinations' backs.
        drop(r);
        self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        aborted
    }

    /// The history reads back whole: every commit record checked, every
    /// segment the index lists present and matching its name.
    fn audit(&self) -> Result<(), String> {
        let r = self.reader();
        r.all_commit_records()
            .map_err(|e| format!("the commit history does not read back: {e}"))?;
        let (live, objects) = r
            .history_segments()
            .map_err(|e| format!("the history index does not read back: {e}"))?;
        let missing: Vec<String> = live
            .iter()
            .map(|s| s.render())
            .filter(|n| !objects.contains(n))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the history index lists segments that do not exist: {missing:?}"
            ));
        }
        Ok(())
    }
}
