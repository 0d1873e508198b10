//! Injected request failures, for tests and the crash simulation: a hook
//! in the HTTP connector that every request of the destination goes
//! through (object_store's own and the signed extra calls), so a test
//! fails exactly one S3 call, before it reaches the server or after the
//! server handled it (the answer lost on the way back), under the real
//! client with its retries.

use std::sync::Arc;

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};
use object_store::ClientOptions;

/// Which S3 call a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum S3Call {
    CreateUpload,
    /// `number` counts from 1, as S3 numbers parts.
    PutPart {
        number: u32,
    },
    CompleteUpload,
    AbortUpload,
    ListUploads,
    PutObject,
    GetObject,
    HeadObject,
    DeleteObject,
    List,
    Other,
}

/// A request as the hook sees it.
#[derive(Clone, Debug)]
pub struct RequestInfo {
    pub call: S3Call,
    /// The URL path (bucket and key, percent-encoded).
    pub path: String,
    /// The URL query (percent-encoded), empty when there is none.
    pub query: String,
}

/// What to do with one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    Proceed,
    /// Fail without sending (a refused connection).
    FailBefore(String),
    /// Send, let the server act on it, then fail as if the connection broke
    /// before the answer arrived.
    FailAfter(String),
    /// Do not send; answer 200 with this body, as a server that behaves
    /// otherwise than S3 would (e.g. one that lists multipart uploads only
    /// by exact key).
    Answer(String),
    /// Do not send; answer with this status and body (e.g. 409
    /// ConditionalRequestConflict to a conditional create).
    AnswerStatus(u16, String),
}

/// Decides the fate of each request.
pub trait RequestFaults: Send + Sync + std::fmt::Debug {
    fn decide(&self, request: &RequestInfo) -> FaultAction;
}

fn classify(request: &HttpRequest) -> S3Call {
    let query = request.uri().query().unwrap_or("");
    let has = |name: &str| {
        query
            .split('&')
            .any(|kv| kv == name || kv.starts_with(&format!("{name}=")))
    };
    let method = request.method().as_str();
    match method {
        "POST" if has("uploads") => S3Call::CreateUpload,
        "POST" if has("uploadId") => S3Call::CompleteUpload,
        "PUT" if has("partNumber") => S3Call::PutPart {
            number: query
                .split('&')
                .find_map(|kv| kv.strip_prefix("partNumber="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
        },
        "PUT" => S3Call::PutObject,
        "DELETE" if has("uploadId") => S3Call::AbortUpload,
        "DELETE" => S3Call::DeleteObject,
        "GET" if has("uploads") => S3Call::ListUploads,
        "GET" if has("list-type") => S3Call::List,
        "GET" => S3Call::GetObject,
        "HEAD" => S3Call::HeadObject,
        _ => S3Call::Other,
    }
}

/// The connector of every destination: object_store's reqwest client,
/// wrapped by the fault hook when there is one.
#[derive(Clone, Debug, Default)]
pub(crate) struct Connector {
    pub faults: Option<Arc<dyn RequestFaults>>,
}

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(match &self.faults {
            None => inner,
            Some(faults) => HttpClient::new(Faulty {
                inner,
                faults: faults.clone(),
            }),
        })
    }
}

#[derive(Debug)]
struct Faulty {
    inner: HttpClient,
    faults: Arc<dyn RequestFaults>,
}

fn injected(kind: HttpErrorKind, why: String) -> HttpError {
    HttpError::new(kind, std::io::Error::other(why))
}

#[async_trait::async_trait]
impl HttpService for Faulty {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let info = RequestInfo {
            call: classify(&request),
            path: request.uri().path().to_string(),
            query: request.uri().query().unwrap_or("").to_string(),
        };
        match self.faults.decide(&info) {
            FaultAction::Proceed => self.inner.execute(request).await,
            FaultAction::Answer(body) => Ok(answer(http::StatusCode::OK, body)),
            FaultAction::AnswerStatus(status, body) => Ok(answer(
                http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::CONFLICT),
                body,
            )),
            FaultAction::FailBefore(why) => Err(injected(
                HttpErrorKind::Connect,
                format!("injected before sending: {why}"),
            )),
            FaultAction::FailAfter(why) => {
                // The server acts on it; its answer is dropped.
                let answer = self.inner.execute(request).await;
                if let Ok(response) = answer {
                    let _ = response.into_body().bytes().await;
                }
                Err(injected(
                    HttpErrorKind::Request,
                    format!("injected after the server answered: {why}"),
                ))
            }
        }
    }
}

/// An answer made in the server's place, with the ETag header a PUT's
/// answer carries (the client requires one).
fn answer(status: http::StatusCode, body: String) -> HttpResponse {
    let mut response = http::Response::new(body.into());
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::ETAG,
        http::HeaderValue::from_static("\"answered-by-the-test-hook\""),
    );
    response
}
