//! [`ObjectStoreDestination`]: the [`Destination`] trait over an S3 bucket.
//! See the crate docs for the layout and the protocol; this module does
//! the calls.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, MultipartId, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode,
    PutOptions, PutPayload, RetryConfig, UpdateVersion,
};

use twopc_core::destination::{
    AbortStatus, CommitStatus, CommittedTransaction, Compaction, Destination, HistoryPolicy,
    HistoryTally, LineageRecord, LineageSummary, LostNote, OperationRecord, OwnerClaim, Ownership,
    StagedState, StagedTransaction,
};
use twopc_core::error::{DestinationError, DestinationErrorKind};
use twopc_core::handle::{TransactionHandle, TransactionState};
use twopc_core::ids::{CheckpointId, LineageId, RunId, SinkId, TransactionId};
use twopc_core::records::RecordBatch;

use crate::control::{
    decode, encode, CommitRecord, ControlObject, PreparedMarker, UploadLocation, MAX_CONTROL_OBJECT,
};
use crate::credentials::{self, CredentialSource, Environment};
use crate::faults::{Connector, RequestFaults};
use crate::lease::{self, Claimed, HeldLease};
use crate::names::{
    self, parse_commit_record_name, Layout, COMMITTED, EXPIRED, LINEAGES, LOST, OPERATIONS, OWNERS,
    PREPARED, PROBES, RETRACTED, RUNS,
};
use crate::options::{RecordFormat, S3Options, MAX_PARTS};
use crate::s3api::{OpenUpload, S3Api};

mod history;

/// Lost notes and operation records are a few hundred bytes.
const NOTE_LIMIT: usize = 64 * 1024;

/// How long a fence (every held lease renewed, see `lease`) covers the
/// clean-up calls after it: one pass of clean-up (a listing of staged
/// transactions and the aborts or expiries that follow) costs one
/// conditional PUT per lease, not one per transaction. Short, because a
/// takeover inside it goes unnoticed until the next fence.
const FENCE_REUSE_MS: u64 = 1_000;

/// Prepare markers read by one pass, by transaction: absent (`None`),
/// unreadable (`Err`), or the handle and upload they name.
type MarkersRead = std::collections::BTreeMap<
    TransactionId,
    Option<Result<(TransactionHandle, UploadLocation), String>>,
>;

/// The transaction being written: its upload, the parts sent so far and
/// the bytes not sent yet (at most about one part).
struct OpenTxn {
    txn: TransactionId,
    key: Path,
    upload_id: MultipartId,
    parts: Vec<PartId>,
    buffer: BytesMut,
    uploaded: u64,
    /// Why it can only be aborted now: a part or the prepare failed, so
    /// the upload may lack records that were handed over.
    poisoned: Option<String>,
}

/// The object store destination for one sink and one subtask.
pub struct ObjectStoreDestination {
    options: S3Options,
    layout: Layout,
    rt: tokio::runtime::Runtime,
    store: Arc<AmazonS3>,
    api: S3Api,
    open: Option<OpenTxn>,
    /// The location of the transaction prepared last, until the writer
    /// asks for it (`prepared_location`).
    last_prepared: Option<(TransactionId, Vec<u8>)>,
    leases: Vec<HeldLease>,
    /// When every held lease was last renewed by a fence (ms since the
    /// epoch); clean-up calls within [`FENCE_REUSE_MS`] of it need none.
    fenced_at_ms: Option<u64>,
    /// The attempt a destination without a lease works for, when told
    /// (see [`Self::watch_ownership`]), and when each share's lease was
    /// last found still its own (share, ms since the epoch).
    watched: Option<OwnerClaim>,
    watch_checked: std::collections::BTreeMap<u32, u64>,
    /// Prepared transactions the last listing found under an earlier part
    /// name (see [`Self::staged_under_other_names`]): their key and upload
    /// id, for the aborts and expiries of the clean-up pass that follows.
    other_names: std::collections::BTreeMap<TransactionId, (String, String)>,
    /// Uploads this destination completed (or found completed) whose commit
    /// record is not written yet: a retry of the commit writes the record
    /// from here, without asking S3 again whether the upload completed.
    /// By then the upload is gone and a reader may have consumed (deleted)
    /// the object, and the look would read as a loss (found by review).
    /// Behind a lock because the commit's requests borrow `self` shared.
    completed: std::sync::Mutex<std::collections::BTreeMap<TransactionId, Completion>>,
}

/// An upload known to be completed, as its commit record will name it.
#[derive(Clone, Debug)]
struct Completion {
    /// The handle's, so that an entry serves only the commit of the same
    /// transaction of the same checkpoint.
    lineage: LineageId,
    checkpoint: CheckpointId,
    key: String,
    size: u64,
    e_tag: Option<String>,
    upload_id: String,
}

/// Whether a fence may reuse a recent one (a call inside a clean-up pass)
/// or must renew now (the call that starts a pass).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fence {
    Renew,
    Reuse,
}

/// What writing a commit record found.
enum Recorded {
    Yes,
    /// The transaction was retracted: the record (and the object) were
    /// removed again; the evidence says so.
    Retracted(String),
}

impl Recorded {
    /// The answer of the commit that wrote it.
    fn status(self) -> CommitStatus {
        match self {
            Recorded::Yes => CommitStatus::Committed,
            Recorded::Retracted(evidence) => CommitStatus::Missing { evidence },
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Turns an object_store error into the core's error, naming the call and
/// the object, with what to do for permission errors.
fn store_err(op: &str, bucket: &str, key: &str, e: object_store::Error) -> DestinationError {
    let (kind, hint) = match &e {
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => (
            DestinationErrorKind::NotPermitted,
            " (the credentials may not do this: grant s3:GetObject, PutObject, DeleteObject, \
             ListBucket, AbortMultipartUpload and ListBucketMultipartUploads on the bucket, or \
             use other credentials; a restart alone would fail the same way)",
        ),
        _ => (DestinationErrorKind::Io, ""),
    };
    DestinationError::new(kind, format!("{op} s3://{bucket}/{key}: {e}{hint}"))
}

/// The kind of a failed call of the signed extra API (lifecycle, upload
/// listings): refused credentials (401, 403) are `NotPermitted`, as in
/// [`store_err`], so the job stops saying so instead of restarting into
/// the same refusal; anything else may pass.
fn api_kind(e: &crate::s3api::ApiError) -> DestinationErrorKind {
    match e.status {
        Some(401 | 403) => DestinationErrorKind::NotPermitted,
        _ => DestinationErrorKind::Io,
    }
}

/// What to grant when listing multipart uploads was refused.
const LIST_UPLOADS_HINT: &str = " (refused: if for AccessDenied, the credentials may not list \
                                 multipart uploads: grant s3:ListBucketMultipartUploads on the \
                                 bucket; otherwise see the server's code, e.g. a clock skew or a \
                                 wrong secret; a restart alone would fail the same way)";

fn path(key: &str) -> Result<Path, DestinationError> {
    Path::parse(key)
        .map_err(|e| DestinationError::corrupt(format!("{key:?} is not a usable object key: {e}")))
}

/// An ETag without its quotes: the header of HEAD has them, the XML answer
/// of some servers to CompleteMultipartUpload (whose ETag a commit record
/// keeps) may not.
fn unquoted(e_tag: &str) -> &str {
    e_tag.trim_matches('"')
}

/// The number of parts an S3 multipart ETag names (`"<hex>-<n>"`), when it
/// has that form (some providers and encryption modes give other ETags).
fn etag_parts(e_tag: &str) -> Option<usize> {
    e_tag.trim_matches('"').rsplit_once('-')?.1.parse().ok()
}

/// Milliseconds since the epoch of an ISO 8601 UTC time
/// (`2010-11-10T20:48:33.000Z`), as S3 lists an upload's initiation.
fn iso_ms(text: &str) -> Option<u64> {
    let (date, time) = text.trim_end_matches('Z').split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    // Within bounds, the arithmetic below cannot overflow (hostile values
    // could, found by review).
    let plausible = (1970..=9999).contains(&y)
        && (1..=12).contains(&m)
        && (1..=31).contains(&day)
        && (0..24).contains(&hh)
        && (0..60).contains(&mm)
        && (0..=60).contains(&ss);
    if !plausible {
        return None;
    }
    let ms: i64 = format!("{:0<3}", frac.get(..3.min(frac.len()))?)
        .parse()
        .ok()?;
    // Days from the civil date (proleptic Gregorian).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(((days * 24 + hh) * 60 + mm) * 60 * 1000 + ss * 1000 + ms).ok()
}

impl ObjectStoreDestination {
    /// Validates the options and connects (lazily: the first call reaches
    /// the server). No retention check: see [`Self::open_checked`].
    pub fn open(options: S3Options, sink: &SinkId) -> Result<Self, DestinationError> {
        Self::build(options, sink, None)
    }

    /// As [`Self::open`], then refuses a bucket lifecycle rule that would
    /// abort this sink's prepared uploads within `needed_retention_ms` (see
    /// [`crate::retention::needed_retention_ms`]). What a sink opens with.
    pub fn open_checked(
        options: S3Options,
        sink: &SinkId,
        needed_retention_ms: u64,
    ) -> Result<Self, DestinationError> {
        let mut dest = Self::open(options, sink)?;
        dest.check_lifecycle(needed_retention_ms)?;
        dest.check_conditional_writes()?;
        Ok(dest)
    }

    /// Checks that the server refuses a conditional create of a key that
    /// exists (If-None-Match) and a conditional update of a key that
    /// changed (If-Match). Leases, commit records and the history index
    /// rely on both: a server that ignores them (older S3-compatible
    /// releases, some gateways) would let two owners hold one share, and
    /// a compaction undo a retraction, without any error. Three requests
    /// on an object of its own, removed after.
    pub fn check_conditional_writes(&mut self) -> Result<(), DestinationError> {
        let key = self
            .layout
            .control(PROBES, &format!("{:016x}", twopc_core::ids::random_u64()));
        let refused = |what: &str| {
            DestinationError::new(
                DestinationErrorKind::NotPermitted,
                format!(
                    "the S3 server at s3://{}/ {what}, which the sink relies on for its leases, \
                     commit records and history (found by writing {key} twice, then removed). \
                     Use a server that supports conditional writes (AWS S3, MinIO since 2024, \
                     or another that honours If-None-Match and If-Match on PUT)",
                    self.layout.bucket
                ),
            )
        };
        // A server that does not implement a conditional header answers 501
        // NotImplemented (S3's answer to a header it does not support): as
        // good as ignoring it, refused by name. Seen only in the error's
        // text (object_store keeps the status to itself); before, it was an
        // I/O error and every subtask restarted forever (found by review).
        let not_implemented = |e: &DestinationError| {
            e.message.contains("NotImplemented") || e.message.contains("status code: 501")
        };
        let outcome = self.wait(async {
            match self.put(&key, b"probe".to_vec(), PutMode::Create).await {
                Ok(true) => {}
                Ok(false) => return Ok(None), // a random name taken: nothing to learn
                Err(e) if not_implemented(&e) => {
                    return Ok(Some("does not implement a create with If-None-Match"))
                }
                Err(e) => return Err(e),
            }
            if self.put(&key, b"probe".to_vec(), PutMode::Create).await? {
                return Ok(Some(
                    "overwrote an existing object on a create with If-None-Match",
                ));
            }
            let stale = UpdateVersion {
                e_tag: Some("\"00000000000000000000000000000000\"".to_string()),
                version: None,
            };
            let update = self
                .store
                .put_opts(
                    &path(&key)?,
                    PutPayload::from(b"probe".to_vec()),
                    PutOptions::from(PutMode::Update(stale)),
                )
                .await;
            match update {
                Err(object_store::Error::Precondition { .. }) => Ok(None),
                Ok(_) => Ok(Some(
                    "overwrote an object on an update with If-Match naming another ETag",
                )),
                Err(e) => match self.err("checking conditional writes on", &key, e) {
                    e if not_implemented(&e) => {
                        Ok(Some("does not implement an update with If-Match"))
                    }
                    e => Err(e),
                },
            }
        });
        let _ = self.wait(self.delete(&key));
        match outcome? {
            None => Ok(()),
            Some(what) => Err(refused(what)),
        }
    }

    /// As [`Self::open`], with every request passing `faults` first (tests
    /// and the crash simulation).
    pub fn open_with_faults(
        options: S3Options,
        sink: &SinkId,
        faults: Arc<dyn RequestFaults>,
    ) -> Result<Self, DestinationError> {
        Self::build(options, sink, Some(faults))
    }

    fn build(
        options: S3Options,
        sink: &SinkId,
        faults: Option<Arc<dyn RequestFaults>>,
    ) -> Result<Self, DestinationError> {
        let not_permitted =
            |m: String| DestinationError::new(DestinationErrorKind::NotPermitted, m);
        options
            .validate()
            .map_err(|e| not_permitted(format!("sink '{sink}': {e}")))?;
        let (bucket, prefix) = options
            .target()
            .map_err(|e| not_permitted(format!("sink '{sink}': {e}")))?;
        let connector = Connector { faults };
        let client_options = ClientOptions::new()
            .with_timeout(Duration::from_millis(options.request_timeout_ms))
            .with_allow_http(options.allow_http);
        // from_env: object_store's credential chain (web identity, container
        // and instance credentials) for when the keys come from neither the
        // environment nor a profile; everything set below overrides it.
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            .with_region(&options.region)
            .with_virtual_hosted_style_request(!options.path_style)
            .with_allow_http(options.allow_http)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(15),
                    base: 2.0,
                },
                max_retries: options.max_retries,
                retry_timeout: Duration::from_millis(options.retry_timeout_ms),
            })
            .with_client_options(client_options.clone())
            .with_http_connector(connector.clone());
        // The client is given the bucket's URL in the form its addressing
        // style reads (the endpoint itself, virtual-hosted; the endpoint
        // before the bucket, path-style), made from the same URL the sink's
        // own listings and lifecycle check use, and under both endpoint
        // keys, so that AWS_ENDPOINT_URL_S3 from the environment cannot
        // take precedence. Before, a custom endpoint without path-style
        // sent objects to `<endpoint>/<bucket-as-path...>` (read by the
        // server as another bucket) while the listings went to
        // `<bucket>.<endpoint>` (found by review).
        let client_endpoint = client_endpoint(&options, &bucket);
        builder = builder
            .with_endpoint(&client_endpoint)
            .with_config(AmazonS3ConfigKey::S3Endpoint, &client_endpoint);
        match &options.credentials {
            CredentialSource::Static(c) => {
                log::debug!(
                    "sink '{sink}': S3 access key {} from {}",
                    c.access_key_id,
                    c.source
                );
                builder = builder
                    .with_access_key_id(&c.access_key_id)
                    .with_secret_access_key(c.secret_access_key.expose());
                if let Some(token) = &c.session_token {
                    builder = builder.with_token(token.expose());
                }
            }
            CredentialSource::Standard => {
                let found =
                    credentials::resolve(options.profile.as_deref(), &Environment::process())
                        .map_err(|e| not_permitted(format!("sink '{sink}': credentials: {e}")))?;
                // Found in the environment or a profile: read again while
                // the sink runs (see RereadCredentials); otherwise
                // object_store's own chain, which refreshes itself.
                if let Some(c) = found {
                    log::debug!(
                        "sink '{sink}': S3 access key {} from {}",
                        c.access_key_id,
                        c.source
                    );
                    builder = builder.with_credentials(Arc::new(
                        credentials::RereadCredentials::new(options.profile.clone(), &c),
                    ));
                }
            }
        }
        let store = Arc::new(builder.build().map_err(|e| {
            not_permitted(format!(
                "sink '{sink}': the S3 client for s3://{bucket} cannot be built: {e}"
            ))
        })?);
        let client = object_store::client::HttpConnector::connect(&connector, &client_options)
            .map_err(|e| DestinationError::new(DestinationErrorKind::Io, e.to_string()))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                DestinationError::new(
                    DestinationErrorKind::Io,
                    format!("sink '{sink}': starting the S3 client's runtime: {e}"),
                )
            })?;
        let api = S3Api {
            client,
            store: store.clone(),
            bucket_url: bucket_url(&options, &bucket),
            region: options.region.clone(),
            bucket: bucket.clone(),
            max_retries: options.max_retries,
            retry_timeout: Duration::from_millis(options.retry_timeout_ms),
        };
        let layout = Layout {
            bucket,
            prefix,
            sink: sink.clone(),
            part_prefix: options.part_prefix.clone(),
            part_suffix: options.part_suffix.clone(),
        };
        Ok(ObjectStoreDestination {
            options,
            layout,
            rt,
            store,
            api,
            open: None,
            last_prepared: None,
            leases: Vec::new(),
            fenced_at_ms: None,
            watched: None,
            watch_checked: Default::default(),
            other_names: Default::default(),
            completed: Default::default(),
        })
    }

    /// Tells a destination that claims no lease which attempt of which run
    /// it works for: the Sink V2 committer, whose writer (a destination of
    /// its own) holds the lease. Its clean-up calls then read the lease of
    /// the share they act in (once per share and pass) and are refused
    /// when a newer attempt holds it, as a lease holder's are (see
    /// `lease`). Without it such a destination has nothing to check. A
    /// destination that claims leases checks those instead.
    pub fn watch_ownership(&mut self, claim: OwnerClaim) {
        self.watched = Some(claim);
        self.watch_checked.clear();
    }

    /// The keys of this sink.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The signed calls object_store lacks (for tests and tools: creating a
    /// bucket, setting a lifecycle rule, listing uploads).
    pub fn api(&self) -> &S3Api {
        &self.api
    }

    /// Runs `f` on this destination's runtime (tests and tools).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Runs a call's requests on this destination's runtime to their end,
    /// unless the caller gives the call up meanwhile (the task is being
    /// cancelled: see `twopc_core::interrupt`). A request in flight then
    /// has an unknown outcome, which the protocol resolves as it does a
    /// lost response; without this, a bucket that went away would hold a
    /// cancelled task for the client's whole retry time, longer than Flink
    /// waits before it kills the TaskManager.
    fn wait<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, DestinationError>>,
    ) -> Result<T, DestinationError> {
        self.wait_or_give_up(call)
            .unwrap_or_else(|| Err(self.given_up()))
    }

    /// [`Self::wait`] for a call whose errors are not yet the
    /// destination's: `None` when the caller gave it up.
    fn wait_or_give_up<F: std::future::Future>(&self, call: F) -> Option<F::Output> {
        const POLL: std::time::Duration = std::time::Duration::from_millis(100);
        self.rt.block_on(async {
            let mut call = std::pin::pin!(call);
            loop {
                match tokio::time::timeout(POLL, &mut call).await {
                    Ok(result) => return Some(result),
                    Err(_still_waiting) if twopc_core::interrupt::requested() => return None,
                    Err(_still_waiting) => {}
                }
            }
        })
    }

    /// The error of a call given up (see [`Self::wait`]).
    fn given_up(&self) -> DestinationError {
        DestinationError::new(
            DestinationErrorKind::Io,
            format!(
                "{} (sink '{}', bucket {})",
                twopc_core::interrupt::INTERRUPTED,
                self.layout.sink,
                self.layout.bucket
            ),
        )
    }

    /// The underlying store (tests and tools).
    pub fn store(&self) -> &AmazonS3 {
        &self.store
    }

    /// Reads the bucket's lifecycle configuration and refuses a rule that
    /// aborts this sink's uploads before `needed_ms` (see `retention`).
    pub fn check_lifecycle(&mut self, needed_ms: u64) -> Result<(), DestinationError> {
        let rules = self.wait(async {
            self.api.lifecycle_rules().await.map_err(|e| {
                if e.code.as_deref() == Some(crate::s3api::UNREADABLE_LIFECYCLE) {
                    return DestinationError::new(
                        DestinationErrorKind::NotPermitted,
                        format!(
                            "sink '{}': {}. Nothing was changed. Use a bucket whose lifecycle \
                             rules the S3 API describes in S3's form (or one without rules)",
                            self.layout.sink, e.message
                        ),
                    );
                }
                DestinationError::new(
                    api_kind(&e),
                    format!(
                        "sink '{}': reading the lifecycle configuration of bucket {} (to check \
                         that no rule aborts prepared uploads too soon): {e}. Grant \
                         s3:GetLifecycleConfiguration to the sink's credentials",
                        self.layout.sink, self.layout.bucket
                    ),
                )
            })
        })?;
        let rules = rules.unwrap_or_default();
        let why = crate::retention::refusal(
            &rules,
            &self.layout.bucket,
            &self.layout.parts_of_sink(),
            needed_ms,
        )
        .or_else(|| {
            crate::retention::control_refusal(
                &rules,
                &self.layout.bucket,
                &self.layout.control_area_of(&self.layout.sink),
            )
        });
        if let Some(why) = why {
            return Err(DestinationError::new(
                DestinationErrorKind::NotPermitted,
                format!("sink '{}': {why}", self.layout.sink),
            ));
        }
        Ok(())
    }

    fn err(&self, op: &str, key: &str, e: object_store::Error) -> DestinationError {
        store_err(op, &self.layout.bucket, key, e)
    }

    fn corrupt(&self, message: String) -> DestinationError {
        DestinationError::corrupt(format!(
            "sink '{}' at s3://{}: {message}",
            self.layout.sink, self.layout.bucket
        ))
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, DestinationError> {
        match self.store.head(&path(key)?).await {
            Ok(meta) => Ok(Some(meta)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err("looking at", key, e)),
        }
    }

    /// A control object's bytes; `None` when absent. Anything larger than a
    /// control object may be is refused before it is read.
    async fn get_small(&self, key: &str, limit: usize) -> Result<Option<Bytes>, DestinationError> {
        let got = match self.store.get(&path(key)?).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.err("reading", key, e)),
        };
        if got.meta.size > limit as u64 {
            return Err(self.corrupt(format!(
                "{key} has {} bytes, more than a control object of twopc has; it is not ours. \
                 Move it away",
                got.meta.size
            )));
        }
        got.bytes()
            .await
            .map(Some)
            .map_err(|e| self.err("reading", key, e))
    }

    async fn put(
        &self,
        key: &str,
        bytes: Vec<u8>,
        mode: PutMode,
    ) -> Result<bool, DestinationError> {
        // "Already there" answers only a create. object_store reads any 409
        // as that, and a 409 to an overwrite (S3's OperationAborted, a
        // gateway's conflict) wrote nothing: a failure, or a prepare would
        // count a marker that is not there (found by review).
        let create = matches!(mode, PutMode::Create);
        match self
            .store
            .put_opts(&path(key)?, PutPayload::from(bytes), PutOptions::from(mode))
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) if create => Ok(false),
            Err(e) => Err(self.err("writing", key, e)),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), DestinationError> {
        match self.store.delete(&path(key)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err("removing", key, e)),
        }
    }

    /// Names (after the area's prefix) of the objects in a control area.
    async fn names_in(&self, area: &str) -> Result<Vec<String>, DestinationError> {
        let prefix = self.layout.area(area);
        let listed: Vec<ObjectMeta> = self
            .store
            .list(Some(&path(prefix.trim_end_matches('/'))?))
            .try_collect()
            .await
            .map_err(|e| match e {
                // A key the store's client cannot read as a path (an empty
                // or `.`/`..` segment, a control character: a stray upload
                // of another tool) fails the whole listing, at every start
                // again: damaged control data, named, not I/O to retry
                // (found by review).
                object_store::Error::InvalidPath { source } => self.corrupt(format!(
                    "a key under s3://{}/{prefix} is not a valid object path ({source}); twopc \
                     writes no such key there. Move it away (list the prefix with another \
                     tool), then restart",
                    self.layout.bucket
                )),
                e => self.err("listing", &prefix, e),
            })?;
        let mut names: Vec<String> = listed
            .iter()
            .filter_map(|m| m.location.as_ref().strip_prefix(prefix.as_str()))
            .filter(|n| !n.contains('/'))
            .map(str::to_string)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Another sink's transaction that `txn`'s upload keys read as too
    /// (see `Layout::other_readings`) and that this other sink prepared:
    /// its prepare marker is there. One HEAD per reading, made only for
    /// uploads without a marker of this sink.
    async fn prepared_by_other_sink(
        &self,
        txn: &TransactionId,
        uploads: &[OpenUpload],
    ) -> Result<Option<TransactionId>, DestinationError> {
        let mut others: Vec<TransactionId> = uploads
            .iter()
            .filter_map(|u| self.layout.other_readings(&u.key, txn))
            .flatten()
            .collect();
        others.sort();
        others.dedup();
        for other in others {
            let Some(marker) = self.layout.marker_of_other_sink(&other) else {
                continue;
            };
            if self.head(&marker).await?.is_some() {
                return Ok(Some(other));
            }
        }
        Ok(None)
    }

    /// The open uploads of exactly `key`.
    async fn uploads_of(&self, key: &str) -> Result<Vec<OpenUpload>, DestinationError> {
        let mut uploads = self.api.list_multipart_uploads(key).await.map_err(|e| {
            let kind = api_kind(&e);
            DestinationError::new(
                kind,
                format!(
                    "listing the multipart uploads of s3://{}/{key}: {e}{}",
                    self.layout.bucket,
                    if kind == DestinationErrorKind::NotPermitted {
                        LIST_UPLOADS_HINT
                    } else {
                        ""
                    }
                ),
            )
        })?;
        uploads.retain(|u| u.key == key);
        Ok(uploads)
    }

    /// A commit record by name: the single record, or else the one folded
    /// into a history segment (in that order; see `crate::history`).
    async fn read_commit_record(
        &self,
        name: &str,
    ) -> Result<Option<CommitRecord>, DestinationError> {
        if let Some(r) = self.read_single_record(name).await? {
            return Ok(Some(r));
        }
        let Some((lineage, checkpoint, txn)) = parse_commit_record_name(name) else {
            return Ok(None);
        };
        self.find_folded(lineage, checkpoint, &txn).await
    }

    /// The single commit record `name`, checked.
    async fn read_single_record(
        &self,
        name: &str,
    ) -> Result<Option<CommitRecord>, DestinationError> {
        let key = self.layout.control(COMMITTED, name);
        let Some(bytes) = self.get_small(&key, MAX_CONTROL_OBJECT).await? else {
            return Ok(None);
        };
        match decode(&bytes) {
            Ok(ControlObject::Committed(r)) => {
                r.check(&self.layout, name).map_err(|e| {
                    self.corrupt(format!("{e}; restore {key} from a backup or move it away"))
                })?;
                Ok(Some(r))
            }
            Ok(_) => Err(self.corrupt(format!("{key} is not a commit record"))),
            Err(e) => Err(self.corrupt(format!(
                "commit record {key} does not decode ({e}); restore it from a backup or a bucket \
                 version, or move it away and compare the output with the other commit records \
                 (the twopc command-line tool does not read object stores yet)"
            ))),
        }
    }

    /// The prepared marker of `txn` and the location it holds: `Ok(None)`
    /// when absent, `Err(reason)` inside when unreadable.
    async fn read_marker(
        &self,
        txn: &TransactionId,
    ) -> Result<Option<Result<(TransactionHandle, UploadLocation), String>>, DestinationError> {
        let key = self.layout.control(PREPARED, txn.as_str());
        let Some(bytes) = self.get_small(&key, MAX_CONTROL_OBJECT).await? else {
            return Ok(None);
        };
        Ok(Some(match decode(&bytes) {
            Ok(ControlObject::Prepared(m)) => m
                .check(&self.layout, txn)
                .map(|location| (m.handle, location))
                .map_err(|e| format!("prepared marker {key}: {e}")),
            Ok(_) => Err(format!("{key} is not a prepared marker")),
            Err(e) => Err(format!("prepared marker {key} does not decode: {e}")),
        }))
    }

    /// The uploads completed here and not yet recorded (a poisoned lock
    /// only means a panic elsewhere: the map itself is always whole).
    fn completions(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<TransactionId, Completion>> {
        self.completed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The completion remembered for `handle`'s transaction, if it was of
    /// the same lineage and checkpoint.
    fn completion_for(&self, handle: &TransactionHandle) -> Option<Completion> {
        let completions = self.completions();
        let c = completions.get(&handle.transaction)?;
        (c.lineage == handle.lineage && Some(c.checkpoint) == handle.checkpoint())
            .then(|| c.clone())
    }

    /// Writes the commit record of an upload known to be completed,
    /// remembering the completion until the record is written (see
    /// [`Self::completed`]).
    async fn record_completion(
        &self,
        handle: &TransactionHandle,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Recorded, DestinationError> {
        self.completions()
            .insert(handle.transaction.clone(), completion.clone());
        self.record_commit(
            handle,
            &completion.key,
            completion.size,
            completion.e_tag,
            Some(&completion.upload_id),
            now_ms,
        )
        .await
    }

    /// Writes the commit record (never replacing one), then tidies: the
    /// prepared marker goes, and so do other uploads of the same key (a
    /// retried CreateMultipartUpload can leave one). With the record in
    /// place it looks for a retraction's tombstone: a retraction that
    /// began before (this commit was in flight, an older attempt's) is
    /// finished again, and the commit answers `Retracted` (see the crate
    /// docs for why after, not before).
    /// A completion this destination remembered for the transaction is
    /// forgotten once its record is written.
    async fn record_commit(
        &self,
        handle: &TransactionHandle,
        key: &str,
        size: u64,
        e_tag: Option<String>,
        keep_upload: Option<&str>,
        now_ms: u64,
    ) -> Result<Recorded, DestinationError> {
        let checkpoint = handle.checkpoint().unwrap_or_default();
        let name = names::commit_record_name(handle.lineage, checkpoint, &handle.transaction);
        let record = CommitRecord {
            handle: handle.clone(),
            key: key.to_string(),
            size,
            e_tag: e_tag.unwrap_or_default(),
            committed_at_ms: now_ms,
        };
        let record_key = self.layout.control(COMMITTED, &name);
        if !self
            .put(
                &record_key,
                encode(&ControlObject::Committed(record)),
                PutMode::Create,
            )
            .await?
        {
            // A concurrent commit (or our own lost first try) wrote it: it
            // must be this transaction's record.
            if self.read_commit_record(&name).await?.is_none() {
                return Err(DestinationError::new(
                    DestinationErrorKind::Io,
                    format!(
                        "{record_key} exists and vanished at once; the commit is retried by id"
                    ),
                ));
            }
        }
        self.completions().remove(&handle.transaction);
        if let Some(evidence) = self.undo_if_retracted(handle, key, &name, true).await? {
            return Ok(Recorded::Retracted(evidence));
        }
        self.tidy_after_commit(&handle.transaction, key, keep_upload)
            .await;
        Ok(Recorded::Yes)
    }

    /// When `handle`'s transaction has a retraction tombstone: removes its
    /// object `key` and then its commit record `name` (the object first:
    /// a retraction interrupted after its tombstone is restarted only
    /// through the record), and returns the evidence for `Missing`.
    /// `completed_here`: `key` is the upload this call just completed or
    /// found completed, not a key read from a record.
    async fn undo_if_retracted(
        &self,
        handle: &TransactionHandle,
        key: &str,
        name: &str,
        completed_here: bool,
    ) -> Result<Option<String>, DestinationError> {
        let txn = &handle.transaction;
        let Some(at) = self.retracted_at(txn).await? else {
            return Ok(None);
        };
        // A key read from a record is removed only when it is the one this
        // sink gives the transaction, as `retract` insists (a forged record
        // must not remove another sink's object); a key from the handle's
        // location is the upload this commit just completed.
        if !completed_here && key != self.layout.part_key(txn) {
            return Err(self.corrupt(format!(
                "{txn} was retracted, but its commit record names the object {key}, which is not \
                 its output; nothing was deleted. Remove the record {} by hand",
                self.layout.control(COMMITTED, name)
            )));
        }
        self.delete(key).await?;
        self.delete(&self.layout.control(COMMITTED, name)).await?;
        // A compaction may have folded the late record already.
        self.retract_folded(&CommittedTransaction {
            transaction: txn.clone(),
            lineage: handle.lineage,
            checkpoint: handle.checkpoint().unwrap_or_default(),
            subtask: handle.subtask,
            run: handle.run.clone(),
            records: handle.prepared().map_or(0, |p| p.records),
            committed_at_ms: 0,
        })
        .await?;
        log::warn!(
            "sink '{}': a commit of {txn} (checkpoint {}) arrived after its retraction; its \
             object and commit record were removed again",
            self.layout.sink,
            handle.checkpoint().unwrap_or_default()
        );
        Ok(Some(format!(
            "it was retracted{} (tombstone {}): a rewind under the REPLACE_RANGE policy removed \
             its output, and this commit (of checkpoint {}, from run {}) came after that, so its \
             output and commit record were removed again. A commit this late comes from an \
             older attempt that lived on after the restore; its job must not carry on",
            at.map(|t| format!(" at {}", twopc_core::timefmt::utc(t)))
                .unwrap_or_default(),
            self.layout.control(RETRACTED, txn.as_str()),
            handle.checkpoint().unwrap_or_default(),
            handle.run
        )))
    }

    /// When `txn` was retracted (its tombstone's time, if readable);
    /// `None` when it was not.
    async fn retracted_at(
        &self,
        txn: &TransactionId,
    ) -> Result<Option<Option<u64>>, DestinationError> {
        let tombstone = self.layout.control(RETRACTED, txn.as_str());
        Ok(self
            .get_small(&tombstone, 64)
            .await?
            .map(|bytes| String::from_utf8_lossy(&bytes).trim().parse::<u64>().ok()))
    }

    /// Housekeeping after a commit: failures are logged, never fail it.
    async fn tidy_after_commit(&self, txn: &TransactionId, key: &str, keep: Option<&str>) {
        let marker = self.layout.control(PREPARED, txn.as_str());
        if let Err(e) = self.delete(&marker).await {
            log::warn!("sink '{}': {e} (left behind; harmless)", self.layout.sink);
        }
        match self.uploads_of(key).await {
            Ok(strays) => {
                for u in strays.iter().filter(|u| Some(u.upload_id.as_str()) != keep) {
                    let id = MultipartId::from(u.upload_id.clone());
                    if let Err(e) = self.store.abort_multipart(&Path::from(key), &id).await {
                        log::warn!(
                            "sink '{}': aborting stray upload {} of {key}: {e}",
                            self.layout.sink,
                            u.upload_id
                        );
                    }
                }
            }
            Err(e) => log::warn!("sink '{}': {e}", self.layout.sink),
        }
    }

    /// What the sink knows about a transaction that is neither open nor
    /// visible, in words: the evidence of a LOST transaction.
    async fn missing_evidence(
        &self,
        txn: &TransactionId,
        key: &str,
        looked_for: &str,
        uploads: &[OpenUpload],
    ) -> Result<String, DestinationError> {
        let record_names = "no commit record";
        let history = format!(
            " nor in the history segments listed by {}",
            self.layout.history_index()
        );
        let mut evidence = format!(
            "{looked_for}; ListMultipartUploads with prefix {key} lists {}; HEAD of \
             s3://{}/{key} finds no object; {record_names} under {}{history}",
            if uploads.is_empty() {
                "no upload".to_string()
            } else {
                format!(
                    "only other uploads ({})",
                    uploads
                        .iter()
                        .map(|u| u.upload_id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            self.layout.bucket,
            self.layout.area(COMMITTED)
        );
        // Read after the looks above: an expiry writes its tombstone before
        // it removes the upload, so one that removed it is seen here.
        let tombstone = self.layout.control(EXPIRED, txn.as_str());
        if let Some(at) = self.retracted_at(txn).await? {
            evidence.push_str(&format!(
                ". It was committed and then retracted{} by a rewind under the REPLACE_RANGE \
                 policy (tombstone {})",
                at.map(|t| format!(" at {}", twopc_core::timefmt::utc(t)))
                    .unwrap_or_default(),
                self.layout.control(RETRACTED, txn.as_str())
            ));
        } else if let Some(bytes) = self.get_small(&tombstone, 64).await? {
            let at = String::from_utf8_lossy(&bytes).trim().parse::<u64>().ok();
            evidence.push_str(&format!(
                ". Retention cleanup removed it{} (tombstone {tombstone})",
                at.map(|t| format!(" at {}", twopc_core::timefmt::utc(t)))
                    .unwrap_or_default()
            ));
        } else {
            evidence.push_str(
                ". It was aborted, aborted by a bucket lifecycle rule \
                 (AbortIncompleteMultipartUpload), or removed outside twopc",
            );
        }
        Ok(evidence)
    }

    /// The answer to a commit whose record exists.
    async fn already_committed(
        &self,
        record: &CommitRecord,
    ) -> Result<CommitStatus, DestinationError> {
        let txn = &record.handle.transaction;
        // A record beside a retraction's tombstone: a retraction that was
        // interrupted, or a late commit's record: never committed again.
        let name = names::commit_record_name(
            record.handle.lineage,
            record.handle.checkpoint().unwrap_or_default(),
            txn,
        );
        if let Some(evidence) = self
            .undo_if_retracted(&record.handle, &record.key, &name, false)
            .await?
        {
            return Ok(CommitStatus::Missing { evidence });
        }
        match self.head(&record.key).await? {
            // The record is written after the upload was completed, so the
            // object was visible; a retraction's tombstone was looked for
            // above. A reader that consumes objects by deleting or moving
            // them, or an expiry rule on the output, took it since: the
            // commit stands, and a restore that repeats it must succeed
            // (found by review: such a job stopped as LOST at every
            // failover).
            None => {
                log::warn!(
                    "sink '{}': transaction {txn} was committed at {}, and its object s3://{}/{} \
                     has been removed since (a reader that deletes or moves what it consumes, \
                     an expiry rule, or an operator); the commit stands and is not repeated",
                    self.layout.sink,
                    twopc_core::timefmt::utc(record.committed_at_ms),
                    self.layout.bucket,
                    record.key
                );
                self.tidy_after_commit(txn, &record.key, None).await;
                Ok(CommitStatus::AlreadyCommitted)
            }
            Some(meta)
                if meta.size == record.size
                    && (record.e_tag.is_empty()
                        || meta.e_tag.as_deref().map(unquoted)
                            == Some(unquoted(&record.e_tag))) =>
            {
                self.tidy_after_commit(txn, &record.key, None).await;
                Ok(CommitStatus::AlreadyCommitted)
            }
            Some(meta) => Err(self.corrupt(format!(
                "{txn} was committed as s3://{}/{} ({} bytes, ETag {}), but that object now has \
                 {} bytes and ETag {}: it was replaced after the commit. Restore it from a \
                 backup or a bucket version; or, for its records to be written again, delete the \
                 object and its commit record and restore a checkpoint from before it",
                self.layout.bucket,
                record.key,
                record.size,
                record.e_tag,
                meta.size,
                meta.e_tag.unwrap_or_default()
            ))),
        }
    }

    /// Does an object of `size` bytes and ETag `e_tag` look like the
    /// completion of `location`'s upload?
    fn is_completion_of(size: u64, e_tag: Option<&str>, location: &UploadLocation) -> bool {
        size == location.bytes
            && e_tag
                .and_then(etag_parts)
                .is_none_or(|n| n == location.parts.len())
    }

    /// A commit whose CompleteMultipartUpload failed: the outcome is told
    /// by the object and the upload, never by the error alone (a repeated
    /// complete of a completed upload answers NoSuchUpload on S3 and 500 on
    /// moto, and the same for an aborted one).
    async fn after_failed_complete(
        &self,
        handle: &TransactionHandle,
        location: &UploadLocation,
        error: object_store::Error,
        now_ms: u64,
    ) -> Result<CommitStatus, DestinationError> {
        let txn = &handle.transaction;
        let key = location.key.as_str();
        // The uploads first, then the object: a completion landing between
        // the two looks (this call's own request still in flight, or a
        // racing commit) then shows as the object, whereas in the other
        // order it hid from both and a committed transaction was reported
        // missing (found by review).
        let uploads = self.uploads_of(key).await?;
        if let Some(meta) = self.head(key).await? {
            if Self::is_completion_of(meta.size, meta.e_tag.as_deref(), location) {
                // Completed, by this call (its answer lost) or an earlier one.
                let completion = Completion {
                    lineage: handle.lineage,
                    checkpoint: handle.checkpoint().unwrap_or_default(),
                    key: key.to_string(),
                    size: meta.size,
                    e_tag: meta.e_tag,
                    upload_id: location.upload_id.clone(),
                };
                return Ok(self
                    .record_completion(handle, completion, now_ms)
                    .await?
                    .status());
            }
            return Err(self.corrupt(format!(
                "the commit of {txn} failed ({error}), and s3://{}/{key} holds an object of {} \
                 bytes (ETag {}) that is not its upload of {} bytes in {} parts: something else \
                 wrote this key. Move it away; the commit is retried by id",
                self.layout.bucket,
                meta.size,
                meta.e_tag.unwrap_or_default(),
                location.bytes,
                location.parts.len()
            )));
        }
        if uploads.iter().any(|u| u.upload_id == location.upload_id) {
            return Err(DestinationError::new(
                DestinationErrorKind::Io,
                format!(
                    "completing the upload of {txn} (s3://{}/{key}, upload {}) failed: {error}. \
                     The upload is still open and the object absent, so nothing is published \
                     yet; the commit is retried by id",
                    self.layout.bucket, location.upload_id
                ),
            ));
        }
        // Neither the upload nor the object: a commit that raced us would
        // have left the object, so nobody completed it.
        Ok(CommitStatus::Missing {
            evidence: self
                .missing_evidence(
                    txn,
                    key,
                    &format!(
                        "CompleteMultipartUpload of upload {} failed ({error})",
                        location.upload_id
                    ),
                    &uploads,
                )
                .await?,
        })
    }

    /// Renews the leases this destination holds when a third of their time
    /// has passed; an error when one was taken over.
    fn keep_leases(&mut self) -> Result<(), DestinationError> {
        let now = now_ms();
        let lease_ms = self.options.lease_ms;
        let due: Vec<usize> = (0..self.leases.len())
            .filter(|&i| now.saturating_sub(self.leases[i].renewed_at_ms) > lease_ms / 3)
            .collect();
        for i in due {
            let mut held = self.leases[i].clone();
            self.wait(lease::rewrite(&self.store, &mut held, lease_ms, now, false))?;
            self.leases[i] = held;
        }
        Ok(())
    }

    /// Makes sure, before a clean-up call that removes or changes other
    /// transactions' objects, that this destination still holds every
    /// lease it claimed: each is renewed now with If-Match on its last
    /// ETag (`Fence::Renew`, or `Fence::Reuse` when no fence succeeded in
    /// the last [`FENCE_REUSE_MS`]). A lease another attempt took over
    /// refuses the call, with nothing changed. A destination that holds no
    /// lease (tools reading the sink, the Sink V2 committer, which claims
    /// none: its writer does) renews nothing; it reads the lease of the
    /// share it is told to watch instead ([`Self::check_watched`]), and a
    /// tool that watches none is not fenced.
    fn fence(
        &mut self,
        mode: Fence,
        doing: &str,
        txn: Option<&TransactionId>,
    ) -> Result<(), DestinationError> {
        if self.leases.is_empty() {
            return self.check_watched(mode, doing, txn);
        }
        let now = now_ms();
        if mode == Fence::Reuse
            && self
                .fenced_at_ms
                .is_some_and(|at| now.saturating_sub(at) < FENCE_REUSE_MS)
        {
            return Ok(());
        }
        self.fenced_at_ms = None;
        let lease_ms = self.options.lease_ms;
        for i in 0..self.leases.len() {
            let mut held = self.leases[i].clone();
            match self.wait(lease::rewrite(&self.store, &mut held, lease_ms, now, false)) {
                Ok(()) => self.leases[i] = held,
                Err(e) if e.kind == DestinationErrorKind::NotPermitted => {
                    return Err(self.fenced_out(&held, doing, txn))
                }
                Err(e) => {
                    return Err(DestinationError::new(
                        e.kind,
                        format!(
                            "sink '{}': renewing the ownership lease before {doing} failed, so \
                             nothing was changed: {e}. Tried again at the next clean-up",
                            self.layout.sink
                        ),
                    ))
                }
            }
        }
        self.fenced_at_ms = Some(now);
        Ok(())
    }

    /// The fence of a destination without a lease (see
    /// [`Self::watch_ownership`]): the lease of the share `txn` belongs to
    /// (this attempt's own share for a call without one) must not name a
    /// newer attempt.
    fn check_watched(
        &mut self,
        mode: Fence,
        doing: &str,
        txn: Option<&TransactionId>,
    ) -> Result<(), DestinationError> {
        let Some(ours) = self.watched.clone() else {
            return Ok(());
        };
        let share = txn
            .and_then(|t| TransactionId::parse(t.as_str()))
            .map_or(ours.subtask, |p| p.subtask);
        let now = now_ms();
        if mode == Fence::Renew {
            self.watch_checked.clear();
        } else if self
            .watch_checked
            .get(&share)
            .is_some_and(|&at| now.saturating_sub(at) < FENCE_REUSE_MS)
        {
            return Ok(());
        }
        self.watch_checked.remove(&share);
        let key = path(&self.layout.control(OWNERS, &share.to_string()))?;
        let held = self.wait(lease::read(&self.store, &key)).map_err(|e| {
            DestinationError::new(
                e.kind,
                format!(
                    "sink '{}': reading the ownership lease before {doing} failed, so nothing \
                     was changed: {e}. Tried again at the next clean-up",
                    self.layout.sink
                ),
            )
        })?;
        if lease::superseded_by(&ours, held.as_ref(), now) {
            let l = held.expect("a lease supersedes");
            return Err(DestinationError::new(
                DestinationErrorKind::NotPermitted,
                format!(
                    "sink '{}': refused to {doing}{}: subtask {share}'s share of the sink (lease \
                     {key}) is held by attempt {} of run {} ({}, since {}), while this \
                     committer works for attempt {} of run {}. This is an older attempt that \
                     lives on (a TaskManager cut off from the JobManager, or a task still \
                     shutting down): it must not abort or expire what the newer attempt owns. \
                     Nothing was changed; this attempt must stop, and the newer one carries on. \
                     If the holder is another job writing with the same sink id, give one of \
                     them another sink id",
                    self.layout.sink,
                    txn.map(|t| format!(" (transaction {t})"))
                        .unwrap_or_default(),
                    l.attempt,
                    l.run,
                    l.holder,
                    twopc_core::timefmt::utc(l.acquired_at_ms),
                    ours.attempt,
                    ours.run,
                ),
            ));
        }
        self.watch_checked.insert(share, now);
        Ok(())
    }

    /// The refusal of a clean-up call whose lease another attempt took
    /// over, naming who holds the share now.
    fn fenced_out(
        &self,
        held: &HeldLease,
        doing: &str,
        txn: Option<&TransactionId>,
    ) -> DestinationError {
        let ours = &held.record;
        // Only for the message: a call given up meanwhile names no holder.
        let now_held = self
            .wait(async { Ok(lease::current(&self.store, &held.key).await) })
            .ok()
            .flatten();
        let now_held = match now_held {
            Some(l) => format!(
                "attempt {} of run {} ({}, since {})",
                l.attempt,
                l.run,
                l.holder,
                twopc_core::timefmt::utc(l.acquired_at_ms)
            ),
            None => "another claimant (its lease is gone or unreadable now)".to_string(),
        };
        DestinationError::new(
            DestinationErrorKind::NotPermitted,
            format!(
                "sink '{}': refused to {doing}{}: subtask {}'s share of the sink (lease {}) was \
                 taken over by {now_held}, while this destination still worked for attempt {} \
                 of run {}. This is an older attempt that lives on (a TaskManager cut off from \
                 the JobManager, or a task still shutting down): it must not abort, expire or \
                 retract what the newer attempt owns. Nothing was changed; this attempt stops \
                 here, and the newer one carries on. If the newer holder is another job writing \
                 with the same sink id, give one of them another sink id",
                self.layout.sink,
                txn.map(|t| format!(" (transaction {t})"))
                    .unwrap_or_default(),
                ours.subtask,
                held.key,
                ours.attempt,
                ours.run,
            ),
        )
    }

    /// In LINES format a record must not hold a line break.
    fn check_records(&self, batch: &RecordBatch<'_>) -> Result<(), DestinationError> {
        if self.options.format != RecordFormat::Lines {
            return Ok(());
        }
        match twopc_core::records::line_break_fault(batch) {
            None => Ok(()),
            Some(fault) => Err(DestinationError::record(fault)),
        }
    }

    /// Uploads the next part of the open transaction: `bytes` of the
    /// buffer's front (all of it for the last part). A failure poisons the
    /// transaction.
    fn send_part(&mut self, bytes: usize) -> Result<(), DestinationError> {
        let bucket = self.layout.bucket.clone();
        let Some(open) = self.open.as_mut() else {
            return Ok(());
        };
        if open.parts.len() >= MAX_PARTS {
            let why = format!(
                "it reached S3's limit of {MAX_PARTS} parts per upload; raise the part size \
                 (now {} bytes) or checkpoint more often",
                self.options.part_size
            );
            open.poisoned = Some(why.clone());
            return Err(DestinationError::new(
                DestinationErrorKind::StorageFull,
                format!("transaction {}: {why}", open.txn),
            ));
        }
        let data = open.buffer.split_to(bytes).freeze();
        let len = data.len() as u64;
        let index = open.parts.len();
        let store = self.store.clone();
        let (key, upload_id) = (open.key.clone(), open.upload_id.clone());
        let sent =
            self.wait_or_give_up(store.put_part(&key, &upload_id, index, PutPayload::from(data)));
        let given_up = self.given_up();
        let open = self.open.as_mut().expect("checked above");
        let Some(sent) = sent else {
            // Whether the part arrived is unknown: the transaction's records
            // at the destination are incomplete, as after a failed upload.
            open.poisoned = Some(format!("uploading part {} was given up", index + 1));
            return Err(given_up);
        };
        match sent {
            Ok(part) => {
                open.parts.push(part);
                open.uploaded += len;
                Ok(())
            }
            Err(e) => {
                let why = format!(
                    "uploading part {} of s3://{bucket}/{key} failed: {e}",
                    index + 1
                );
                open.poisoned = Some(why.clone());
                Err(DestinationError::new(
                    DestinationErrorKind::Io,
                    format!(
                        "transaction {}: {why}. Its records so far are incomplete at the \
                         destination, so it can only be aborted; the job restarts from its last \
                         checkpoint",
                        open.txn
                    ),
                ))
            }
        }
    }

    /// The open transaction `txn`, its upload created at the first write.
    fn open_txn(&mut self, txn: &TransactionId) -> Result<(), DestinationError> {
        if matches!(&self.open, Some(o) if &o.txn == txn) {
            return Ok(());
        }
        // One transaction is open at a time; another id means the previous
        // one was prepared or aborted already.
        self.open = None;
        let key = self.layout.part_key(txn);
        let key_path = path(&key)?;
        let upload_id = self
            .wait_or_give_up(self.store.create_multipart(&key_path))
            .ok_or_else(|| self.given_up())?
            .map_err(|e| self.err("starting a multipart upload of", &key, e))?;
        self.open = Some(OpenTxn {
            txn: txn.clone(),
            key: key_path,
            upload_id,
            parts: Vec::new(),
            buffer: BytesMut::with_capacity(self.options.part_size.min(64 << 20)),
            uploaded: 0,
            poisoned: None,
        });
        Ok(())
    }

    /// Every open multipart upload under this sink's part names.
    async fn sink_uploads(&self) -> Result<Vec<OpenUpload>, DestinationError> {
        let prefix = self.layout.parts_of_sink();
        self.api.list_multipart_uploads(&prefix).await.map_err(|e| {
            let kind = api_kind(&e);
            DestinationError::new(
                kind,
                format!(
                    "listing the multipart uploads of sink '{}' under s3://{}/{prefix}: {e}{}",
                    self.layout.sink,
                    self.layout.bucket,
                    if kind == DestinationErrorKind::NotPermitted {
                        LIST_UPLOADS_HINT
                    } else {
                        ""
                    }
                ),
            )
        })
    }

    /// Records the commits whose upload was completed but whose commit
    /// record was never written: a crash between the two requests, or a
    /// record PUT that kept failing until the job stopped. Their output is
    /// visible, and without a record no check would see it: not the rewind
    /// check of a restore, nor a fresh start's, nor `twopc reconcile` (found
    /// by review). Their prepare marker (removed only after the record) is
    /// the way to them. Run before anything reads records or staged
    /// transactions; a commit of the same transaction racing this writes
    /// the same record, and either write is kept.
    ///
    /// Still staged means the marker's own upload is still listed, not
    /// any upload of the key: a resent CreateMultipartUpload (the client
    /// retries it) can leave a stray beside the one the marker names, and
    /// a completion next to a stray was passed over here before (found by
    /// review: the rewind check then missed its output). Returns the
    /// markers read, for the staged listing that follows.
    async fn record_unrecorded_completions(&self) -> Result<MarkersRead, DestinationError> {
        let mut read = MarkersRead::new();
        let markers = self.names_in(PREPARED).await?;
        if markers.is_empty() {
            return Ok(read);
        }
        let uploads = self.sink_uploads().await?;
        for name in markers {
            let Some(parsed) = TransactionId::parse(&name) else {
                continue;
            };
            if parsed.sink != self.layout.sink {
                continue;
            }
            let txn = parsed.id;
            let marker = self.read_marker(&txn).await?;
            read.insert(txn.clone(), marker.clone());
            let (handle, location) = match marker {
                None => continue, // gone meanwhile
                Some(Ok(read)) => read,
                Some(Err(why)) => {
                    self.check_unreadable_marker(&txn, &why).await?;
                    continue;
                }
            };
            if uploads.iter().any(|u| u.upload_id == location.upload_id) {
                continue; // still staged
            }
            let Some(checkpoint) = handle.checkpoint() else {
                continue;
            };
            let record = names::commit_record_name(handle.lineage, checkpoint, &txn);
            if self.read_commit_record(&record).await?.is_some() {
                self.completions().remove(&txn);
                // Recorded; only its marker was left (its commit's tidying
                // failed or was cut short). Removed now: nothing else ever
                // removes it, and every listing paid for it again (found by
                // review). Best effort, as in the commit's own tidying.
                let marker = self.layout.control(PREPARED, txn.as_str());
                if let Err(e) = self.delete(&marker).await {
                    log::debug!("removing the leftover marker of committed {txn}: {e}");
                }
                continue;
            }
            if let Some(completion) = self.completion_for(&handle) {
                // Completed here, its record not written yet: recorded from
                // what this destination knows, whether or not a reader took
                // the object since.
                self.record_completion(&handle, completion, now_ms())
                    .await?;
                continue;
            }
            let Some(meta) = self.head(&location.key).await? else {
                // Aborted or lost (a commit of it reports which), unless the
                // upload is open after all and only the listing by prefix
                // missed it: a server that lists uploads by exact key only
                // (MinIO does, minio/minio#20989) hides every staged
                // transaction, and a fresh start's check, the lingering
                // cleanup and the retention would pass them over silently.
                let open_by_key = location.key.starts_with(&self.layout.parts_of_sink())
                    && self
                        .uploads_of(&location.key)
                        .await?
                        .iter()
                        .any(|u| u.upload_id == location.upload_id);
                // Listed again by prefix before concluding: a listing that
                // merely lagged behind the upload shows it now.
                if open_by_key
                    && !self
                        .sink_uploads()
                        .await?
                        .iter()
                        .any(|u| u.upload_id == location.upload_id)
                {
                    return Err(DestinationError::new(
                        DestinationErrorKind::NotPermitted,
                        format!(
                            "sink '{}' at s3://{}: the upload of prepared transaction {txn} \
                             ({}) is open, yet the listing of multipart uploads under {} did \
                             not show it: this server lists multipart uploads by exact key \
                             only, not by prefix (MinIO does), so the sink cannot see its \
                             staged transactions. Nothing was changed. Use a server whose \
                             ListMultipartUploads filters by prefix as S3 does",
                            self.layout.sink,
                            self.layout.bucket,
                            location.key,
                            self.layout.parts_of_sink()
                        ),
                    ));
                }
                continue;
            };
            if !Self::is_completion_of(meta.size, meta.e_tag.as_deref(), &location) {
                continue;
            }
            log::warn!(
                "recording the commit of transaction {txn} (checkpoint {checkpoint}): its upload \
                 was completed as s3://{}/{}, but its commit record was never written",
                self.layout.bucket,
                location.key
            );
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            // A retracted one is removed again inside (and logged): no
            // commit of it is answered here.
            self.record_commit(&handle, &location.key, meta.size, meta.e_tag, None, now_ms)
                .await?;
        }
        Ok(read)
    }

    /// A prepare marker that cannot be read, met while looking for
    /// completions without their record. Without output, its transaction
    /// is staged (`staged` reports it) or was aborted, and it hides nothing.
    /// With output, the transaction's upload was completed (an upload of
    /// the same key still open is a stray a resent CreateMultipartUpload
    /// left), and only the marker could tell whether its commit was
    /// recorded: an unrecorded one would be missed by the rewind check of a
    /// restore (whose replay would write its records a second time) and by
    /// a fresh start's check. So this stops every reader, naming the
    /// marker, until an operator has looked (found by review).
    async fn check_unreadable_marker(
        &self,
        txn: &TransactionId,
        why: &str,
    ) -> Result<(), DestinationError> {
        let part = self.layout.part_key(txn);
        if self.head(&part).await?.is_none() {
            return Ok(());
        }
        Err(DestinationError::new(
            DestinationErrorKind::Corrupt,
            format!(
                "{why}. Transaction {txn}'s upload is no longer open and its output \
                 s3://{bucket}/{part} exists, so it was committed, but whether its commit was \
                 recorded can only be read from that marker; without a record, a restore of a \
                 checkpoint before it would write its records a second time. Nothing was changed. \
                 Delete the damaged marker s3://{bucket}/{marker} and restore the job from its \
                 latest checkpoint, which replays none of {txn}'s records (and records its \
                 commit if it belongs to that checkpoint). Before restoring an earlier \
                 checkpoint instead, make sure that {txn} has a commit record (under \
                 s3://{bucket}/{committed}), or remove its output too",
                bucket = self.layout.bucket,
                marker = self.layout.control(PREPARED, txn.as_str()),
                committed = self.layout.area(COMMITTED),
            ),
        ))
    }

    /// Staged transactions, and keys of uploads under this sink's names
    /// that are not its transactions. `known` holds markers read just
    /// before (a marker never changes once written, only goes).
    fn scan_staged(&self, known: &MarkersRead) -> Result<ScannedStaged, DestinationError> {
        self.wait(async {
            let uploads = self.sink_uploads().await?;
            // Markers listed after the uploads: a transaction prepared before
            // this listing shows its marker (it is written after its parts).
            let markers = self.names_in(PREPARED).await?;
            if uploads.is_empty() && markers.is_empty() {
                return Ok(ScannedStaged::default()); // nothing staged
            }
            let mut by_txn: std::collections::BTreeMap<TransactionId, Vec<OpenUpload>> =
                Default::default();
            let mut foreign = Vec::new();
            for u in uploads {
                match self.layout.txn_of_part_key(&u.key) {
                    Some(txn) => by_txn.entry(txn).or_default().push(u),
                    None => foreign.push(u.key),
                }
            }
            let mut out = Vec::new();
            for (txn, uploads) in by_txn {
                let Some(parsed) = TransactionId::parse(txn.as_str()) else {
                    continue;
                };
                // An initiation time the server did not give (or gave in a
                // form not read here) counts as now: such an upload is
                // never expired early, only later than its retention.
                let initiated = uploads
                    .iter()
                    .map(|u| {
                        u.initiated
                            .as_deref()
                            .and_then(iso_ms)
                            .unwrap_or_else(now_ms)
                    })
                    .max()
                    .unwrap_or_else(now_ms);
                let marker = if markers.iter().any(|m| m == txn.as_str()) {
                    match known.get(&txn) {
                        Some(m) => m.clone(),
                        None => self.read_marker(&txn).await?,
                    }
                } else {
                    None
                };
                let (state, activity) = match marker {
                    Some(Ok((handle, location)))
                        if uploads.iter().any(|u| u.upload_id == location.upload_id) =>
                    {
                        let at = handle.prepared().map_or(initiated, |p| p.prepared_at_ms);
                        (StagedState::Prepared(handle), at)
                    }
                    Some(Err(reason)) => (StagedState::PreparedUnreadable { reason }, initiated),
                    // No marker, or one naming another upload (its own was
                    // completed or aborted).
                    other => {
                        // Without a marker of this sink, a name that reads
                        // as another sink's transaction too is that sink's
                        // when that sink prepared it (its marker is there):
                        // aborting it would lose its prepared output (found
                        // by review).
                        if other.is_none() {
                            if let Some(theirs) =
                                self.prepared_by_other_sink(&txn, &uploads).await?
                            {
                                log::warn!(
                                    "the multipart upload of {} reads as transaction {txn} of \
                                     sink '{}' and as transaction {theirs}, which its sink \
                                     prepared: left to that sink. Give the two sinks part \
                                     prefixes that cannot be read as each other's (no '-' in \
                                     either, or different prefixes or buckets)",
                                    uploads[0].key,
                                    self.layout.sink
                                );
                                continue;
                            }
                        }
                        let completed = other.and_then(Result::ok).map(|(_, l)| l);
                        if self
                            .abort_strays_of_published(&txn, completed.as_ref(), &uploads)
                            .await?
                        {
                            continue;
                        }
                        (StagedState::Open, initiated)
                    }
                };
                out.push(StagedTransaction {
                    transaction: txn,
                    subtask: parsed.subtask,
                    attempt_nonce: parsed.attempt_nonce,
                    state,
                    last_activity_ms: activity,
                });
            }
            let other_names = self.staged_under_other_names(&markers, known).await?;
            // Under an earlier suffix an upload can still be under today's
            // listing prefix: it is one of ours, not a stranger's.
            foreign.retain(|key| !other_names.values().any(|(k, _, _)| k == key));
            out.extend(other_names.iter().filter_map(|(txn, (_, _, initiated))| {
                let (handle, _) = known.get(txn)?.clone()?.ok()?;
                let parsed = TransactionId::parse(txn.as_str())?;
                Some(StagedTransaction {
                    transaction: txn.clone(),
                    subtask: parsed.subtask,
                    attempt_nonce: parsed.attempt_nonce,
                    last_activity_ms: handle.prepared().map_or(*initiated, |p| p.prepared_at_ms),
                    state: StagedState::Prepared(handle),
                })
            }));
            Ok(ScannedStaged {
                staged: out,
                foreign,
                other_names: other_names
                    .into_iter()
                    .map(|(txn, (key, upload, _))| (txn, (key, upload)))
                    .collect(),
            })
        })
    }

    /// Prepared transactions whose upload is under a name other than the
    /// one today's part prefix and suffix give them: prepared before the
    /// options changed (a restore with new options), they are still this
    /// sink's, and a fresh start's check, the lingering cleanup and the
    /// retention must see them (found by review: they were passed over,
    /// so a completed checkpoint's leftovers could be skipped silently).
    /// Their marker names the upload; one listing per such marker, and
    /// only for markers whose transaction has no upload under today's name.
    /// A marker naming a key that could be another sink's (see
    /// `Layout::could_be_another_sinks`) is passed over and logged: acting
    /// on it could abort that sink's upload. Returns, per transaction, its
    /// key, its upload id and when the upload began.
    async fn staged_under_other_names(
        &self,
        markers: &[String],
        known: &MarkersRead,
    ) -> Result<std::collections::BTreeMap<TransactionId, (String, String, u64)>, DestinationError>
    {
        let mut out = std::collections::BTreeMap::new();
        for name in markers {
            let Some(parsed) = TransactionId::parse(name) else {
                continue;
            };
            if parsed.sink != self.layout.sink {
                continue;
            }
            let txn = parsed.id;
            let Some(Some(Ok((_, location)))) = known.get(&txn) else {
                continue; // gone, unreadable, or written after the listing
            };
            if location.key == self.layout.part_key(&txn) {
                continue; // under today's name: listed above if open
            }
            if self.layout.could_be_another_sinks(&location.key, &txn) {
                log::warn!(
                    "transaction {txn}'s prepare marker names the upload of {}, a name that \
                     could be another sink's part; it is left alone. If it is this sink's, \
                     restore the sink's earlier part prefix and suffix to let it be committed or \
                     aborted",
                    location.key
                );
                continue;
            }
            let uploads = self.uploads_of(&location.key).await?;
            let Some(upload) = uploads.iter().find(|u| u.upload_id == location.upload_id) else {
                continue; // completed (recorded by now) or aborted
            };
            let initiated = upload
                .initiated
                .as_deref()
                .and_then(iso_ms)
                .unwrap_or_else(now_ms);
            out.insert(
                txn,
                (location.key.clone(), location.upload_id.clone(), initiated),
            );
        }
        Ok(out)
    }

    /// Uploads left on the key of a transaction whose output is published
    /// (its marker's upload completed, or its marker gone after its commit
    /// record): strays of a resent CreateMultipartUpload, which the commit's
    /// tidying did not remove. They are not a transaction to report (an
    /// abort of one would find the output and answer "was committed"), so
    /// they go here; one that cannot go now is tried again by the next
    /// listing. True when the output is published.
    async fn abort_strays_of_published(
        &self,
        txn: &TransactionId,
        completed: Option<&UploadLocation>,
        uploads: &[OpenUpload],
    ) -> Result<bool, DestinationError> {
        let key = self.layout.part_key(txn);
        let Some(meta) = self.head(&key).await? else {
            return Ok(false);
        };
        if let Some(location) = completed {
            if !Self::is_completion_of(meta.size, meta.e_tag.as_deref(), location) {
                return Ok(false);
            }
        }
        let key_path = path(&key)?;
        for u in uploads {
            match self
                .store
                .abort_multipart(&key_path, &MultipartId::from(u.upload_id.clone()))
                .await
            {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    log::info!(
                        "aborted upload {} of s3://{}/{key}: a stray beside transaction {txn}'s \
                         published output",
                        u.upload_id,
                        self.layout.bucket
                    );
                }
                Err(e) => log::warn!(
                    "could not abort upload {} of s3://{}/{key}, a stray beside transaction \
                     {txn}'s published output (tried again by the next listing): {e}",
                    u.upload_id,
                    self.layout.bucket
                ),
            }
        }
        Ok(true)
    }

    /// Every commit record of this sink, single or folded, each
    /// transaction once (tests, tools and the crash simulation).
    pub fn all_commit_records(&self) -> Result<Vec<CommitRecord>, DestinationError> {
        self.wait(self.all_records(|_, _| true, |_| true))
    }

    /// The live history segments (as the index lists them) and the name of
    /// every object under `_twopc/<sink>/history/` (more than the live
    /// ones while leftovers of an interrupted compaction wait for the next).
    pub fn history_segments(
        &self,
    ) -> Result<(Vec<crate::history::SegmentName>, Vec<String>), DestinationError> {
        self.wait(self.segments_and_objects())
    }

    fn removal(&mut self, txn: &TransactionId) -> Result<Removal, DestinationError> {
        let known = self
            .open
            .take_if(|o| &o.txn == txn)
            .map(|o| o.upload_id.clone());
        let key = self.layout.part_key(txn);
        let found = self.wait(self.remove_at(txn, &key, known, None))?;
        if !matches!(found, Removal::Nothing) {
            return Ok(found);
        }
        // Nothing under today's name: a transaction the listing found
        // prepared under an earlier part name (a restore with new options)
        // goes under that name (found by review: it was never aborted nor
        // expired). Only its own upload is aborted, and the HEAD of that
        // name still tells a commit that finished meanwhile (its marker
        // gone by now) from an abort.
        match self.other_names.get(txn).cloned() {
            Some((other, upload)) => self.wait(self.remove_at(txn, &other, None, Some(upload))),
            None => Ok(found),
        }
    }

    /// Aborts every upload of `key` (and `known`, the id of this run's own
    /// open upload), or only the upload `only`, and says whether the
    /// transaction's output exists.
    async fn remove_at(
        &self,
        txn: &TransactionId,
        key: &str,
        known: Option<String>,
        only: Option<String>,
    ) -> Result<Removal, DestinationError> {
        // The uploads first, the object after: an upload completed
        // before the listing shows as the object below, one completed
        // after it fails our abort and shows there too. (An object with
        // uploads beside it is a committed transaction with strays of
        // its key, which go as well.)
        let mut ids: Vec<String> = match only {
            Some(id) => vec![id],
            None => self
                .uploads_of(key)
                .await?
                .into_iter()
                .map(|u| u.upload_id)
                .collect(),
        };
        if let Some(id) = known {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let key_path = path(key)?;
        let mut removed = false;
        for id in &ids {
            match self
                .store
                .abort_multipart(&key_path, &MultipartId::from(id.clone()))
                .await
            {
                Ok(()) => removed = true,
                // Completed or aborted meanwhile: the HEAD below tells.
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.err("aborting the upload of", key, e)),
            }
        }
        // Committed before, or a complete that won the race against the
        // abort published it.
        if self.head(key).await?.is_some() {
            return Ok(Removal::Published);
        }
        // The marker goes with the upload. Without an upload (the usual
        // abort of a transaction that never received a record) there is
        // none, or a leftover of an upload removed outside twopc, which
        // nothing reads: one request saved per such abort.
        if !ids.is_empty() {
            self.delete(&self.layout.control(PREPARED, txn.as_str()))
                .await?;
        }
        Ok(if removed {
            Removal::Removed
        } else {
            Removal::Nothing
        })
    }
}

/// What a listing of staged transactions found.
#[derive(Default)]
struct ScannedStaged {
    staged: Vec<StagedTransaction>,
    /// Keys of uploads under this sink's names that are not its
    /// transactions.
    foreign: Vec<String>,
    /// Transactions prepared under an earlier part name: key, upload id.
    other_names: std::collections::BTreeMap<TransactionId, (String, String)>,
}

/// What a removal (abort, expiry) found.
enum Removal {
    Removed,
    Nothing,
    /// The upload was completed: the commit was decided, nothing removed.
    Published,
}

/// The endpoint the S3 client is given (see [`ObjectStoreDestination`]'s
/// open): with virtual-hosted requests the client takes it as the bucket's
/// URL as it is, with path-style requests it appends the bucket.
fn client_endpoint(options: &S3Options, bucket: &str) -> String {
    match (&options.endpoint, options.path_style) {
        (_, false) => bucket_url(options, bucket)
            .trim_end_matches('/')
            .to_string(),
        (Some(e), true) => e.trim_end_matches('/').to_string(),
        (None, true) => format!("https://s3.{}.amazonaws.com", options.region),
    }
}

fn bucket_url(options: &S3Options, bucket: &str) -> String {
    match (&options.endpoint, options.path_style) {
        (Some(e), true) => format!("{}/{bucket}", e.trim_end_matches('/')),
        (Some(e), false) => {
            let e = e.trim_end_matches('/');
            match e.split_once("://") {
                Some((scheme, host)) => format!("{scheme}://{bucket}.{host}/"),
                None => format!("{e}/{bucket}"),
            }
        }
        (None, true) => format!("https://s3.{}.amazonaws.com/{bucket}", options.region),
        (None, false) => format!("https://{bucket}.s3.{}.amazonaws.com/", options.region),
    }
}

/// How long dropping a destination waits for the store to take back its
/// leases: a drop may run on a thread that must not hang on an unreachable
/// store (the job class loader's release hook, a task's cancellation).
const LEASE_RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for ObjectStoreDestination {
    /// Releases the leases (rewritten as expired; a failure, or no answer
    /// within [`LEASE_RELEASE_TIMEOUT`], only delays a successor until the
    /// lease lapses).
    fn drop(&mut self) {
        let now = now_ms();
        for mut held in std::mem::take(&mut self.leases) {
            let released = self.rt.block_on(async {
                tokio::time::timeout(
                    LEASE_RELEASE_TIMEOUT,
                    lease::rewrite(&self.store, &mut held, self.options.lease_ms, now, true),
                )
                .await
            });
            let failure = match released {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {LEASE_RELEASE_TIMEOUT:?}"),
            };
            log::warn!(
                "sink '{}': releasing the ownership lease {}: {failure}; it lapses by itself",
                self.layout.sink,
                held.key
            );
        }
    }
}

impl Destination for ObjectStoreDestination {
    fn begin(&mut self, _handle: &TransactionHandle) -> Result<(), DestinationError> {
        // Lazy: the upload starts with the first record, so an empty
        // checkpoint costs no request.
        Ok(())
    }

    fn write(
        &mut self,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<(), DestinationError> {
        self.check_records(&batch)?;
        self.keep_leases()?;
        self.open_txn(txn)?;
        let lines = self.options.format == RecordFormat::Lines;
        let part_size = self.options.part_size;
        let open = self.open.as_mut().expect("opened above");
        if let Some(why) = &open.poisoned {
            return Err(DestinationError::new(
                DestinationErrorKind::Io,
                format!("refusing to write to transaction {txn}: {why}. It can only be aborted"),
            ));
        }
        match batch.output_form(lines.then_some(b'\n')) {
            // Laid out as the object holds it (the JVM sends it so): one copy.
            Some(bytes) => open.buffer.extend_from_slice(bytes),
            None => {
                for record in batch.iter() {
                    open.buffer.extend_from_slice(record);
                    if lines {
                        open.buffer.extend_from_slice(b"\n");
                    }
                }
            }
        }
        // Parts are cut at exactly `part_size` bytes wherever the batches
        // ended, so the object is the same however records were batched.
        while self
            .open
            .as_ref()
            .is_some_and(|o| o.buffer.len() >= part_size)
        {
            self.send_part(part_size)?;
        }
        Ok(())
    }

    fn prepare(&mut self, handle: &TransactionHandle) -> Result<(), DestinationError> {
        let txn = &handle.transaction;
        self.last_prepared = None;
        let counted = handle
            .prepared()
            .map(|p| (p.records, p.bytes))
            .unwrap_or((0, 0));
        let Some(open) = self.open.as_ref().filter(|o| &o.txn == txn) else {
            if counted.0 > 0 {
                return Err(self.corrupt(format!(
                    "the upload of {txn} ({} records) is not open in this writer at prepare",
                    counted.0
                )));
            }
            return Ok(()); // empty: nothing staged, nothing to prepare
        };
        if let Some(why) = &open.poisoned {
            return Err(DestinationError::new(
                DestinationErrorKind::Io,
                format!("refusing to prepare transaction {txn}: {why}. It can only be aborted"),
            ));
        }
        let (rest, no_parts) = (open.buffer.len(), open.parts.is_empty());
        self.keep_leases()?;
        if rest > 0 || no_parts {
            self.send_part(rest)?;
        }
        let open = self.open.as_mut().expect("still open");
        let expected = match self.options.format {
            RecordFormat::Lines => counted.1 + counted.0,
            RecordFormat::Raw => counted.1,
        };
        if open.uploaded != expected {
            let why = format!(
                "its upload holds {} bytes, but the {} records counted in its handle make \
                 {expected}",
                open.uploaded, counted.0
            );
            open.poisoned = Some(why.clone());
            return Err(self.corrupt(format!("{txn} is not prepared: {why}")));
        }
        let location = UploadLocation {
            bucket: self.layout.bucket.clone(),
            key: open.key.as_ref().to_string(),
            upload_id: open.upload_id.clone(),
            parts: open.parts.iter().map(|p| p.content_id.clone()).collect(),
            bytes: open.uploaded,
        };
        let location_bytes = location.encode();
        let info = handle.prepared().cloned().ok_or_else(|| {
            self.corrupt(format!(
                "prepare of {txn} with a handle that is not prepared"
            ))
        })?;
        let marker = PreparedMarker {
            handle: TransactionHandle {
                state: TransactionState::PreparedAt {
                    info,
                    location: location_bytes.clone(),
                },
                ..handle.clone()
            },
        };
        // The marker, written after the last part: an upload without one
        // was never prepared (see the crate docs). Overwrite, not create: a
        // PUT retried inside the client must not fail on its own first try.
        let marker_key = self.layout.control(PREPARED, txn.as_str());
        let written = self.wait(self.put(
            &marker_key,
            encode(&ControlObject::Prepared(marker)),
            PutMode::Overwrite,
        ));
        if let Err(e) = written {
            if let Some(open) = self.open.as_mut() {
                open.poisoned = Some(format!("writing its prepared marker failed: {e}"));
            }
            return Err(e);
        }
        self.open = None;
        self.last_prepared = Some((txn.clone(), location_bytes));
        Ok(())
    }

    fn prepared_location(
        &mut self,
        txn: &TransactionId,
    ) -> Result<Option<Vec<u8>>, DestinationError> {
        Ok(self
            .last_prepared
            .take_if(|(t, _)| t == txn)
            .map(|(_, bytes)| bytes))
    }

    fn commit(
        &mut self,
        handle: &TransactionHandle,
        now_ms: u64,
    ) -> Result<CommitStatus, DestinationError> {
        let txn = &handle.transaction;
        let checkpoint = handle
            .checkpoint()
            .ok_or_else(|| self.corrupt(format!("commit of {txn} without a prepared state")))?;
        self.keep_leases()?;
        let name = names::commit_record_name(handle.lineage, checkpoint, txn);
        self.wait(async {
            if let Some(record) = self.read_commit_record(&name).await? {
                self.completions().remove(txn);
                return self.already_committed(&record).await;
            }
            if let Some(completion) = self.completion_for(handle) {
                return Ok(self
                    .record_completion(handle, completion, now_ms)
                    .await?
                    .status());
            }
            // Where the upload is: the handle says (the checkpoint's copy);
            // a handle from before locations existed falls back on the
            // marker.
            let location = match handle.location() {
                Some(bytes) => UploadLocation::decode_for(bytes, handle, &self.layout)
                    .map_err(|e| self.corrupt(format!("cannot commit {txn}: {e}")))?,
                None => match self.read_marker(txn).await? {
                    Some(Ok((_, location))) => location,
                    Some(Err(reason)) => {
                        return Err(self.corrupt(format!(
                            "cannot commit {txn}: its handle has no location and {reason}"
                        )))
                    }
                    None => {
                        // A concurrent commit of it may have finished since
                        // the look above (it writes the record before it
                        // removes the marker).
                        if let Some(record) = self.read_commit_record(&name).await? {
                            return self.already_committed(&record).await;
                        }
                        let key = self.layout.part_key(txn);
                        let uploads = self.uploads_of(&key).await?;
                        if self.head(&key).await?.is_some() {
                            return Err(self.corrupt(format!(
                                "cannot commit {txn}: its handle has no location, no commit \
                                 record exists, and s3://{}/{key} holds an object that cannot be \
                                 checked against the handle",
                                self.layout.bucket
                            )));
                        }
                        return Ok(CommitStatus::Missing {
                            evidence: self
                                .missing_evidence(
                                    txn,
                                    &key,
                                    "its handle has no location and no prepared marker exists",
                                    &uploads,
                                )
                                .await?,
                        });
                    }
                },
            };
            let key = path(&location.key)?;
            let parts: Vec<PartId> = location
                .parts
                .iter()
                .map(|p| PartId {
                    content_id: p.clone(),
                })
                .collect();
            let id = MultipartId::from(location.upload_id.clone());
            match self.store.complete_multipart(&key, &id, parts).await {
                Ok(done) => {
                    // The answer names the object's ETag; its size is the sum
                    // of the parts S3 just joined, which the location counts.
                    // Only an answer without an ETag is looked at again.
                    let (size, e_tag) = match done.e_tag {
                        Some(e_tag) => (location.bytes, Some(e_tag)),
                        None => {
                            let Some(meta) = self.head(&location.key).await? else {
                                return Err(DestinationError::new(
                                    DestinationErrorKind::Io,
                                    format!(
                                        "the upload of {txn} was completed but s3://{}/{} is \
                                         not there yet; the commit is retried by id",
                                        self.layout.bucket, location.key
                                    ),
                                ));
                            };
                            (meta.size, meta.e_tag)
                        }
                    };
                    if !Self::is_completion_of(size, e_tag.as_deref(), &location) {
                        return Err(self.corrupt(format!(
                            "completing the upload of {txn} gave s3://{}/{} of {size} bytes \
                             (ETag {}), but {} bytes in {} parts were prepared",
                            self.layout.bucket,
                            location.key,
                            e_tag.unwrap_or_default(),
                            location.bytes,
                            location.parts.len()
                        )));
                    }
                    let completion = Completion {
                        lineage: handle.lineage,
                        checkpoint,
                        key: location.key.clone(),
                        size,
                        e_tag,
                        upload_id: location.upload_id.clone(),
                    };
                    Ok(self
                        .record_completion(handle, completion, now_ms)
                        .await?
                        .status())
                }
                Err(e) => {
                    self.after_failed_complete(handle, &location, e, now_ms)
                        .await
                }
            }
        })
    }

    fn abort(&mut self, txn: &TransactionId) -> Result<AbortStatus, DestinationError> {
        self.fence(Fence::Reuse, "abort", Some(txn))?;
        Ok(match self.removal(txn)? {
            Removal::Removed => AbortStatus::Aborted,
            Removal::Nothing => AbortStatus::NotFound,
            Removal::Published => AbortStatus::WasCommitted,
        })
    }

    fn staged(&mut self) -> Result<Vec<StagedTransaction>, DestinationError> {
        // The listing starts a clean-up pass (its aborts and expiries
        // follow) and records unrecorded completions itself.
        self.fence(Fence::Renew, "list staged transactions", None)?;
        let known = self.wait(self.record_unrecorded_completions())?;
        let ScannedStaged {
            staged,
            foreign,
            other_names,
        } = self.scan_staged(&known)?;
        // Merged, not replaced: a caller may list again between its listing
        // and its aborts, and an entry of a transaction finished meanwhile
        // must still lead its abort to the name that tells it was committed
        // (an entry names one upload id, so an old one touches nothing
        // else).
        self.other_names.extend(other_names);
        for key in foreign {
            log::warn!(
                "ignoring the multipart upload of {key}: not a transaction of sink '{}'",
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
        // The listing a rewind check retracts from.
        self.fence(Fence::Renew, "list committed transactions", None)?;
        self.wait(self.record_unrecorded_completions())?;
        Ok(self
            .wait(self.records_after(lineage, checkpoint))?
            .iter()
            .map(CommitRecord::view)
            .collect())
    }

    fn retract(&mut self, committed: &CommittedTransaction) -> Result<(), DestinationError> {
        self.fence(Fence::Reuse, "retract", Some(&committed.transaction))?;
        let name = names::commit_record_name(
            committed.lineage,
            committed.checkpoint,
            &committed.transaction,
        );
        let ours = self.layout.part_key(&committed.transaction);
        self.wait(async {
            // Single or folded; none when retracted already (a folded copy
            // may still be on its way out: `retract_folded` sees to it).
            if let Some(record) = self.read_commit_record(&name).await? {
                // The record was checked: its key names this transaction.
                // Deleted only when it is the key this sink gives it: another
                // sink's object can look the same with a longer part prefix
                // (found by review).
                if record.key != ours {
                    return Err(self.corrupt(format!(
                        "commit record {name} names the object {}, but this sink names the \
                         output of {} {ours}: the record was altered, or the part prefix or \
                         suffix changed since the commit. Nothing was deleted; if it is this \
                         transaction's output, delete it and the record by hand",
                        record.key, committed.transaction
                    )));
                }
            }
            // The tombstone before anything goes: a commit of this
            // transaction still in flight (an older attempt's) that PUTs
            // the record again afterwards finds it and undoes its record
            // (see `record_commit`). Kept for good: ids never come back.
            let tombstone = self
                .layout
                .control(RETRACTED, committed.transaction.as_str());
            self.put(
                &tombstone,
                now_ms().to_string().into_bytes(),
                PutMode::Create,
            )
            .await?;
            // The key this sink gives the transaction, whether or not the
            // record was still there to name it: a repeated retraction
            // after a crash must still remove an object a late commit put
            // back.
            self.delete(&ours).await?;
            self.delete(&self.layout.control(COMMITTED, &name)).await?;
            self.retract_folded(committed).await
        })
    }

    fn expire(&mut self, txn: &TransactionId, now_ms: u64) -> Result<(), DestinationError> {
        self.fence(Fence::Reuse, "expire", Some(txn))?;
        // The tombstone first: a commit that finds the upload gone reads it
        // after its own looks, so it says "expired" however the two race
        // (see the crate docs for a crash between the steps).
        let tombstone = self.layout.control(EXPIRED, txn.as_str());
        let created =
            self.wait(self.put(&tombstone, now_ms.to_string().into_bytes(), PutMode::Create))?;
        if matches!(self.removal(txn)?, Removal::Published) && created {
            // A commit won: it was not expired, and a later loss of the
            // object must not be blamed on retention cleanup. Only our own
            // tombstone goes: an earlier expiry's may explain another
            // removal. A failure leaves a note that nothing reads while
            // the object is there.
            if let Err(e) = self.wait(self.delete(&tombstone)) {
                log::warn!(
                    "sink '{}': {e} (the tombstone of an expiry that lost to a commit of {txn})",
                    self.layout.sink
                );
            }
        }
        Ok(()) // removed, or committed, aborted or expired meanwhile
    }

    fn claim_ownership(&mut self, claim: &OwnerClaim) -> Result<Ownership, DestinationError> {
        let key = path(&self.layout.control(OWNERS, &claim.subtask.to_string()))?;
        match self.wait(lease::claim(
            &self.store,
            key,
            claim,
            self.options.lease_ms,
            now_ms(),
        ))? {
            Claimed::Acquired(held) => {
                self.leases.retain(|l| l.key != held.key);
                self.leases.push(held);
                Ok(Ownership::Acquired)
            }
            Claimed::HeldBy(info) => Ok(Ownership::HeldBy(info)),
        }
    }

    fn owner_subtasks(&mut self) -> Result<Vec<u32>, DestinationError> {
        Ok(self
            .wait(self.names_in(OWNERS))?
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect())
    }

    fn record_lost(&mut self, note: &LostNote) -> Result<(), DestinationError> {
        let key = self.layout.control(LOST, note.transaction.as_str());
        self.wait(self.put(&key, note.render().into_bytes(), PutMode::Create))
            .map(|_| ())
    }

    fn lost_notes(&mut self) -> Result<Vec<LostNote>, DestinationError> {
        Ok(self
            .read_notes(LOST)?
            .into_iter()
            .filter_map(|(_, text)| LostNote::parse(&text))
            .collect())
    }

    fn clear_lost(
        &mut self,
        lineage: LineageId,
        checkpoint: CheckpointId,
    ) -> Result<u64, DestinationError> {
        let mut removed = 0;
        for (name, text) in self.read_notes(LOST)? {
            if LostNote::parse(&text)
                .is_some_and(|n| n.lineage == lineage && n.checkpoint > checkpoint)
            {
                self.wait(self.delete(&self.layout.control(LOST, &name)))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    fn record_operation(&mut self, record: &OperationRecord) -> Result<(), DestinationError> {
        let name = record.storage_name();
        let key = self.layout.control(OPERATIONS, &name);
        self.wait(self.put(&key, record.render().into_bytes(), PutMode::Create))
            .map(|_| ())
    }

    fn operations(&mut self) -> Result<Vec<OperationRecord>, DestinationError> {
        // Oldest first: the names sort so (`OperationRecord::storage_name`).
        let mut notes = self.read_notes(OPERATIONS)?;
        notes.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(notes
            .into_iter()
            .filter_map(|(_, text)| OperationRecord::parse(&text))
            .collect())
    }

    fn lineages(&mut self) -> Result<Vec<LineageSummary>, DestinationError> {
        self.wait(self.record_unrecorded_completions())?;
        // Counts from the names of single records and segments; records are
        // read only for each lineage's latest checkpoint.
        let latest = self.wait(self.lineage_view())?;
        let records = self.lineage_records()?;
        let mut out = Vec::new();
        for (lineage, (count, last, latest)) in latest {
            out.push(LineageSummary::from_latest(
                lineage,
                count,
                last,
                latest
                    .iter()
                    .map(|r| (&r.handle.transaction, &r.handle.run)),
                records.iter().find(|r| r.lineage == lineage).cloned(),
            ));
        }
        Ok(out)
    }

    fn compact_history(&mut self, policy: &HistoryPolicy) -> Result<Compaction, DestinationError> {
        self.fence(Fence::Renew, "compact the commit history", None)?;
        let policy = crate::history::effective(policy, &self.layout);
        self.wait(self.compact(&policy))
    }

    fn history_tallies(&mut self) -> Result<Vec<HistoryTally>, DestinationError> {
        self.wait(self.tallies())
    }

    fn record_lineage(&mut self, record: &LineageRecord) -> Result<(), DestinationError> {
        let key = self.layout.control(LINEAGES, &record.lineage.to_string());
        // Every subtask records it; the first one's record stays.
        self.wait(self.put(
            &key,
            encode(&ControlObject::Lineage(record.clone())),
            PutMode::Create,
        ))
        .map(|_| ())
    }

    fn record_run_lineage(
        &mut self,
        run: &RunId,
        lineage: LineageId,
    ) -> Result<(), DestinationError> {
        let key = self.layout.control(RUNS, run.as_str());
        // Read first: every subtask of every attempt records it, and only
        // the first finds it absent.
        let recorded = match self.run_lineage(run)? {
            Some(l) => Some(l),
            None => {
                let created =
                    self.wait(self.put(&key, lineage.to_string().into_bytes(), PutMode::Create))?;
                if created {
                    return Ok(());
                }
                self.run_lineage(run)?
            }
        };
        match recorded {
            Some(l) if l == lineage => Ok(()),
            // The create was refused (it exists, or a concurrent create of
            // it is under way: S3 answers 409 ConditionalRequestConflict),
            // yet it cannot be read yet: the other writer's PUT has not
            // finished. Not damage: retried (found by review).
            None => Err(DestinationError::new(
                DestinationErrorKind::Io,
                format!(
                    "{key}: recording run {run}'s lineage met another subtask's record being \
                     written; retried"
                ),
            )),
            Some(other) => Err(self.corrupt(format!(
                "{key} records lineage {other} for run {run}, but this run writes in lineage \
                 {lineage}"
            ))),
        }
    }

    fn run_lineage(&mut self, run: &RunId) -> Result<Option<LineageId>, DestinationError> {
        let key = self.layout.control(RUNS, run.as_str());
        let Some(bytes) = self.wait(self.get_small(&key, 64))? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&bytes);
        LineageId::parse(text.trim())
            .map(Some)
            .ok_or_else(|| self.corrupt(format!("{key} does not hold a lineage")))
    }
}

impl ObjectStoreDestination {
    /// The text of every note in `area` (lost notes, operation records),
    /// by name, oldest name first. Unreadable ones are skipped with a
    /// warning (tools show what they can).
    fn read_notes(&self, area: &str) -> Result<Vec<(String, String)>, DestinationError> {
        self.wait(async {
            let mut out = Vec::new();
            for name in self.names_in(area).await? {
                let key = self.layout.control(area, &name);
                match self.get_small(&key, NOTE_LIMIT).await {
                    Ok(Some(bytes)) => {
                        out.push((name, String::from_utf8_lossy(&bytes).into_owned()))
                    }
                    Ok(None) => {}
                    Err(e) => log::warn!("sink '{}': skipping {key}: {e}", self.layout.sink),
                }
            }
            Ok(out)
        })
    }

    /// Every lineage record, checked against its name.
    fn lineage_records(&self) -> Result<Vec<LineageRecord>, DestinationError> {
        self.wait(async {
            let mut out = Vec::new();
            for name in self.names_in(LINEAGES).await? {
                let Some(lineage) = LineageId::parse(&name) else {
                    continue;
                };
                let key = self.layout.control(LINEAGES, &name);
                let Some(bytes) = self.get_small(&key, MAX_CONTROL_OBJECT).await? else {
                    continue;
                };
                match decode(&bytes) {
                    Ok(ControlObject::Lineage(r)) if r.lineage == lineage => out.push(r),
                    Ok(_) => {
                        return Err(self.corrupt(format!(
                            "{key} is not the lineage record of lineage {lineage}; move it away"
                        )))
                    }
                    Err(e) => {
                        return Err(self.corrupt(format!(
                            "lineage record {key} does not decode ({e}); move it away"
                        )))
                    }
                }
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_times_and_etags_read() {
        assert_eq!(iso_ms("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(iso_ms("2010-11-10T20:48:33.000Z"), Some(1_289_422_113_000));
        assert_eq!(iso_ms("2010-11-10T20:48:33Z"), Some(1_289_422_113_000));
        assert_eq!(iso_ms("garbage"), None);
        assert_eq!(iso_ms("99999999999999-01-01T00:00:00Z"), None);
        assert_eq!(iso_ms("2010-13-10T20:48:33Z"), None);
        assert_eq!(iso_ms("2010-11-10T99999999999999:48:33Z"), None);
        assert_eq!(
            etag_parts("\"d41d8cd98f00b204e9800998ecf8427e-3\""),
            Some(3)
        );
        assert_eq!(etag_parts("\"d41d8cd98f00b204e9800998ecf8427e\""), None);
    }

    /// The S3 client reaches the bucket at the very URL the sink's own
    /// listings and lifecycle check use, in every addressing style, with
    /// and without a custom endpoint. (A presigned URL shows where the
    /// client sends a request.) Before, a custom endpoint without
    /// path-style put objects elsewhere than the listings looked.
    #[test]
    fn the_client_and_the_listings_reach_the_same_bucket_url() {
        use object_store::signer::Signer;
        for endpoint in [
            None,
            Some("https://s3.example.com"),
            Some("http://10.0.0.5:9000/"),
        ] {
            for path_style in [true, false] {
                let mut options = S3Options::new("s3://data/orders/eu");
                options.endpoint = endpoint.map(str::to_string);
                options.path_style = path_style;
                options.region = "eu-west-1".to_string();
                options.allow_http = true;
                if endpoint.is_some_and(|e| e.contains("10.0.0.5")) && !path_style {
                    let e = options.validate().unwrap_err().to_string();
                    assert!(e.contains("set path-style access"), "{e}");
                    continue;
                }
                options.validate().unwrap();
                let ce = client_endpoint(&options, "data");
                let store = AmazonS3Builder::new()
                    .with_bucket_name("data")
                    .with_region("eu-west-1")
                    .with_virtual_hosted_style_request(!path_style)
                    .with_allow_http(true)
                    .with_endpoint(&ce)
                    .with_config(AmazonS3ConfigKey::S3Endpoint, &ce)
                    .with_access_key_id("key")
                    .with_secret_access_key("secret")
                    .build()
                    .unwrap();
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                let url = runtime
                    .block_on(store.signed_url(
                        http::Method::GET,
                        &Path::from("orders/eu/part-x"),
                        Duration::from_secs(60),
                    ))
                    .unwrap();
                let base = bucket_url(&options, "data");
                let expected = format!("{}/orders/eu/part-x", base.trim_end_matches('/'));
                assert!(
                    url.as_str().starts_with(&expected),
                    "{endpoint:?} path_style={path_style}: client {url}, listings {base}"
                );
            }
        }
    }
}
