//! Shared helpers of the tests against a local S3 server (moto).
//!
//! The server comes from `scripts/s3.sh start`, which prints the endpoint
//! to export as TWOPC_S3_ENDPOINT. Without it these tests FAIL and say how
//! to start it, unless TWOPC_S3_OPTIONAL=1 (developer convenience), when
//! they print "skipped: no server" and pass (as the PostgreSQL tests do).
#![allow(dead_code)] // each test binary uses a different subset

use std::sync::{Arc, Mutex};

use twopc_core::destination::Destination;
use twopc_core::handle::{PreparedInfo, TransactionHandle, TransactionState};
use twopc_core::ids::{random_u64, LineageId, RunId, SinkId, TransactionId};
use twopc_core::records::RecordBatchBuf;
use twopc_objstore::faults::{FaultAction, RequestFaults, RequestInfo, S3Call};
use twopc_objstore::{CredentialSource, Credentials, ObjectStoreDestination, S3Options, Secret};

/// The endpoint, or None (after printing why) when the developer opted out.
pub fn endpoint() -> Option<String> {
    match std::env::var("TWOPC_S3_ENDPOINT") {
        Ok(u) if !u.trim().is_empty() => Some(u),
        _ if std::env::var("TWOPC_S3_OPTIONAL").as_deref() == Ok("1") => {
            println!("skipped: no server (TWOPC_S3_ENDPOINT is not set)");
            None
        }
        _ => panic!(
            "TWOPC_S3_ENDPOINT is not set: these tests need a local S3 server. Run \
             `eval \"$(bash scripts/s3.sh start)\"` and run the tests again; set \
             TWOPC_S3_OPTIONAL=1 to skip them instead"
        ),
    }
}

/// Returns the endpoint or ends the test (see [`endpoint`]).
macro_rules! server {
    () => {
        match common::endpoint() {
            Some(e) => e,
            None => return,
        }
    };
}

pub const SECRET: &str = "test-secret-never-shown";

pub fn sink() -> SinkId {
    SinkId::new("orders").unwrap()
}

/// Options for a fresh bucket of its own (tests run in parallel on one
/// server), with no client retries (faults show at once).
pub fn options(endpoint: &str) -> S3Options {
    let bucket = format!("twopc-{:016x}", random_u64());
    let mut o = S3Options::new(format!("s3://{bucket}/out"));
    o.endpoint = Some(endpoint.to_string());
    o.path_style = true;
    o.allow_http = true;
    o.credentials = CredentialSource::Static(Credentials {
        access_key_id: "testing".into(),
        secret_access_key: Secret::new(SECRET),
        session_token: None,
        source: "test".into(),
    });
    o.max_retries = 0;
    o.retry_timeout_ms = 2_000;
    o.request_timeout_ms = 20_000;
    o
}

/// Opens a destination and creates its bucket.
pub fn open(o: &S3Options) -> ObjectStoreDestination {
    let d = ObjectStoreDestination::open(o.clone(), &sink()).unwrap();
    d.block_on(d.api().create_bucket()).unwrap();
    d
}

pub fn txn(seq: u64) -> TransactionId {
    TransactionId::compose(&sink(), 0, 0xabcd, seq)
}

pub fn handle(seq: u64, checkpoint: Option<u64>, records: &[Vec<u8>]) -> TransactionHandle {
    TransactionHandle {
        transaction: txn(seq),
        sink: sink(),
        lineage: LineageId(7),
        run: RunId::new("job1").unwrap(),
        subtask: 0,
        parallelism: 1,
        begun_at_ms: 0,
        state: match checkpoint {
            Some(c) => TransactionState::Prepared(PreparedInfo {
                checkpoint: c,
                records: records.len() as u64,
                bytes: records.iter().map(|r| r.len() as u64).sum(),
                prepared_at_ms: 1,
            }),
            None => TransactionState::Open,
        },
    }
}

pub fn records(n: usize, size: usize, tag: u8) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut r = format!("{tag}-{i}-").into_bytes();
            r.resize(size.max(r.len()), b'a' + (i % 26) as u8);
            r
        })
        .collect()
}

/// The object's bytes in LINES format.
pub fn lines(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        out.extend_from_slice(r);
        out.push(b'\n');
    }
    out
}

pub fn write(
    d: &mut impl Destination,
    seq: u64,
    records: &[Vec<u8>],
) -> Result<(), twopc_core::error::DestinationError> {
    // In LINES output form, as the JVM sends it for LINES output.
    let mut buf = RecordBatchBuf::terminated_by(b'\n');
    for r in records {
        buf.push(r);
    }
    d.write(&txn(seq), buf.batch())
}

/// Writes and prepares `seq` for `checkpoint` as the core writer does:
/// prepare, then the location into the handle.
pub fn stage(
    d: &mut impl Destination,
    seq: u64,
    checkpoint: u64,
    records: &[Vec<u8>],
) -> TransactionHandle {
    write(d, seq, records).unwrap();
    let mut h = handle(seq, Some(checkpoint), records);
    d.prepare(&h).unwrap();
    let location = d.prepared_location(&h.transaction).unwrap().unwrap();
    let TransactionState::Prepared(info) = h.state.clone() else {
        unreachable!()
    };
    h.state = TransactionState::PreparedAt { info, location };
    h
}

/// The visible object of `seq`, if any.
pub fn object(d: &ObjectStoreDestination, seq: u64) -> Option<Vec<u8>> {
    use object_store::ObjectStoreExt;
    let key = object_store::path::Path::parse(d.layout().part_key(&txn(seq))).unwrap();
    d.block_on(async {
        match d.store().get(&key).await {
            Ok(g) => Some(g.bytes().await.unwrap().to_vec()),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => panic!("{e}"),
        }
    })
}

/// Upload ids open for `seq`'s key.
pub fn uploads(d: &ObjectStoreDestination, seq: u64) -> Vec<String> {
    let key = d.layout().part_key(&txn(seq));
    d.block_on(d.api().list_multipart_uploads(&key))
        .unwrap()
        .into_iter()
        .filter(|u| u.key == key)
        .map(|u| u.upload_id)
        .collect()
}

/// Opens another upload on `seq`'s key, as a resent
/// CreateMultipartUpload leaves one (the client retries it); its id.
pub fn stray_upload(d: &ObjectStoreDestination, seq: u64) -> String {
    use object_store::multipart::MultipartStore;
    let key = object_store::path::Path::parse(d.layout().part_key(&txn(seq))).unwrap();
    d.block_on(d.store().create_multipart(&key)).unwrap()
}

pub fn put_raw(d: &ObjectStoreDestination, key: &str, bytes: &[u8]) {
    use object_store::ObjectStoreExt;
    let p = object_store::path::Path::parse(key).unwrap();
    d.block_on(d.store().put(&p, bytes.to_vec().into()))
        .unwrap();
}

pub fn delete_raw(d: &ObjectStoreDestination, key: &str) {
    use object_store::ObjectStoreExt;
    let p = object_store::path::Path::parse(key).unwrap();
    d.block_on(d.store().delete(&p)).unwrap();
}

/// Fails the calls a test arms, once each.
#[derive(Debug, Default)]
pub struct Faults {
    armed: Mutex<Vec<(S3Call, FaultAction)>>,
    pub seen: Mutex<Vec<S3Call>>,
}

impl Faults {
    pub fn arm(&self, call: S3Call, action: FaultAction) {
        self.armed.lock().unwrap().push((call, action));
    }
}

impl RequestFaults for Faults {
    fn decide(&self, request: &RequestInfo) -> FaultAction {
        self.seen.lock().unwrap().push(request.call);
        let mut armed = self.armed.lock().unwrap();
        match armed.iter().position(|(c, _)| *c == request.call) {
            Some(i) => armed.remove(i).1,
            None => FaultAction::Proceed,
        }
    }
}

/// Answers the requests `matches` picks with `action`, without sending
/// them (the first `times` of them, or all), and lets every other request
/// through: a server that behaves otherwise than S3, in a line.
pub struct AnswerTo {
    matches: Box<dyn Fn(&RequestInfo) -> bool + Send + Sync>,
    action: FaultAction,
    times: Option<usize>,
    /// How many requests it matched.
    pub seen: Mutex<usize>,
}

impl std::fmt::Debug for AnswerTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerTo")
            .field("action", &self.action)
            .field("times", &self.times)
            .finish_non_exhaustive()
    }
}

impl AnswerTo {
    /// Every request `matches` picks.
    pub fn every(
        matches: impl Fn(&RequestInfo) -> bool + Send + Sync + 'static,
        action: FaultAction,
    ) -> Arc<AnswerTo> {
        Self::up_to(None, matches, action)
    }

    /// The first `times` requests `matches` picks.
    pub fn first(
        times: usize,
        matches: impl Fn(&RequestInfo) -> bool + Send + Sync + 'static,
        action: FaultAction,
    ) -> Arc<AnswerTo> {
        Self::up_to(Some(times), matches, action)
    }

    fn up_to(
        times: Option<usize>,
        matches: impl Fn(&RequestInfo) -> bool + Send + Sync + 'static,
        action: FaultAction,
    ) -> Arc<AnswerTo> {
        Arc::new(AnswerTo {
            matches: Box::new(matches),
            action,
            times,
            seen: Mutex::new(0),
        })
    }

    /// An S3 error answer: `status` with an `<Error>` naming `code`.
    pub fn error(status: u16, code: &str) -> FaultAction {
        FaultAction::AnswerStatus(
            status,
            format!("<Error><Code>{code}</Code><Message>{code}</Message></Error>"),
        )
    }

    pub fn seen(&self) -> usize {
        *self.seen.lock().unwrap()
    }
}

impl RequestFaults for AnswerTo {
    fn decide(&self, request: &RequestInfo) -> FaultAction {
        if !(self.matches)(request) {
            return FaultAction::Proceed;
        }
        let mut seen = self.seen.lock().unwrap();
        *seen += 1;
        match self.times {
            Some(n) if *seen > n => FaultAction::Proceed,
            _ => self.action.clone(),
        }
    }
}

/// Opens a destination of `o` whose requests pass `faults` first.
pub fn open_answering(o: &S3Options, faults: Arc<AnswerTo>) -> ObjectStoreDestination {
    ObjectStoreDestination::open_with_faults(o.clone(), &sink(), faults).unwrap()
}

pub fn open_faulty(o: &S3Options) -> (ObjectStoreDestination, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let d = ObjectStoreDestination::open_with_faults(o.clone(), &sink(), faults.clone()).unwrap();
    d.block_on(d.api().create_bucket()).unwrap();
    (d, faults)
}

/// The object's metadata, if any.
pub fn head(d: &ObjectStoreDestination, key: &str) -> Option<object_store::ObjectMeta> {
    use object_store::ObjectStoreExt;
    let p = object_store::path::Path::parse(key).unwrap();
    d.block_on(async {
        match d.store().head(&p).await {
            Ok(m) => Some(m),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => panic!("{e}"),
        }
    })
}

/// Fails the n-th request after being armed (counting from 1), once:
/// walks a failure through every request of an operation.
#[derive(Debug, Default)]
pub struct StepFaults {
    armed: Mutex<Option<(usize, FaultAction)>>,
    count: std::sync::atomic::AtomicUsize,
    fired: Mutex<Option<S3Call>>,
}

impl StepFaults {
    pub fn arm(&self, n: usize, action: FaultAction) {
        self.count.store(0, std::sync::atomic::Ordering::SeqCst);
        *self.fired.lock().unwrap() = None;
        *self.armed.lock().unwrap() = Some((n, action));
    }

    /// The call that failed, if the armed request came.
    pub fn fired(&self) -> Option<S3Call> {
        *self.fired.lock().unwrap()
    }
}

impl RequestFaults for StepFaults {
    fn decide(&self, request: &RequestInfo) -> FaultAction {
        let mut armed = self.armed.lock().unwrap();
        let Some((n, action)) = armed.clone() else {
            return FaultAction::Proceed;
        };
        let seen = self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if seen < n {
            return FaultAction::Proceed;
        }
        *armed = None;
        *self.fired.lock().unwrap() = Some(request.call);
        action
    }
}

pub fn open_stepped(o: &S3Options) -> (ObjectStoreDestination, Arc<StepFaults>) {
    let faults = Arc::new(StepFaults::default());
    let d = ObjectStoreDestination::open_with_faults(o.clone(), &sink(), faults.clone()).unwrap();
    d.block_on(d.api().create_bucket()).unwrap();
    (d, faults)
}

/// Names of the objects directly under a control area of the sink.
pub fn names_in(d: &ObjectStoreDestination, area: &str) -> Vec<String> {
    use futures_util::TryStreamExt;
    use object_store::ObjectStore;
    let prefix = d.layout().area(area);
    let p = object_store::path::Path::parse(prefix.trim_end_matches('/')).unwrap();
    let listed: Vec<object_store::ObjectMeta> =
        d.block_on(d.store().list(Some(&p)).try_collect()).unwrap();
    let mut names: Vec<String> = listed
        .iter()
        .filter_map(|m| m.location.as_ref().strip_prefix(prefix.as_str()))
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

pub fn get_raw(d: &ObjectStoreDestination, key: &str) -> Option<Vec<u8>> {
    use object_store::ObjectStoreExt;
    let p = object_store::path::Path::parse(key).unwrap();
    d.block_on(async {
        match d.store().get(&p).await {
            Ok(g) => Some(g.bytes().await.unwrap().to_vec()),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => panic!("{e}"),
        }
    })
}
