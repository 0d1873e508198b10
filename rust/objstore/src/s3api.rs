//! The few S3 calls object_store does not have: ListMultipartUploads (the
//! open uploads under a prefix: `staged()` and lingering cleanup),
//! GetBucketLifecycleConfiguration (the retention check), and, for tests and
//! tools, CreateBucket, DeleteBucket and PutBucketLifecycleConfiguration.
//!
//! Why no signer of our own: object_store exports its SigV4 signer
//! (`AwsAuthorizer::try_authorize`) and its credential chain
//! (`AmazonS3::credentials()`), and its HTTP client takes any
//! `http::Request`. So these calls are signed by the same code, with the
//! same credentials (environment, profile, instance metadata, web identity)
//! and sent through the same connector (and the same test fault hook) as
//! every other call: no second implementation of SigV4 to get subtly
//! wrong, and no AWS SDK (hundreds of crates) for three requests.

use std::sync::Arc;

use bytes::Bytes;
use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::{HttpClient, HttpRequest, HttpRequestBody};
use serde::Deserialize;

/// A failed call, in words (status, S3's error code and message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status, when the server answered.
    pub status: Option<u16>,
    /// S3's error code (`NoSuchLifecycleConfiguration`, `AccessDenied`).
    pub code: Option<String>,
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// One open multipart upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenUpload {
    pub key: String,
    pub upload_id: String,
    /// As the server reports it (ISO 8601), when it does.
    pub initiated: Option<String>,
}

/// One rule of a bucket's lifecycle configuration, as far as the
/// retention check needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleRule {
    pub id: Option<String>,
    pub enabled: bool,
    /// The key prefix it covers (from `Filter/Prefix`, `Filter/And/Prefix`
    /// or the legacy `Prefix`); empty covers the whole bucket.
    pub prefix: String,
    /// True when it filters by tag or size too (such rules never abort
    /// multipart uploads: S3 refuses that combination).
    pub narrowed: bool,
    pub abort_incomplete_days: Option<u64>,
    /// True when it expires (deletes) current objects, after some days or
    /// at a date: such a rule over the sink's control area deletes its
    /// commit records, history and markers.
    pub expires_objects: bool,
    /// True when it moves current objects to an archive storage class
    /// (GLACIER, DEEP_ARCHIVE) that answers GETs only after a restore: such
    /// a rule over the sink's control area makes its history unreadable.
    pub archives_objects: bool,
    /// True when it filters by tag (the sink's objects carry none, so
    /// such a rule never matches them); a size filter may match them.
    pub by_tag: bool,
}

/// After a page of ListMultipartUploads: the markers of the next page,
/// `None` at the end, or `Err` when the answer cannot be followed: truncated
/// without markers, or with markers it gave before (a server that cycles
/// between pages would otherwise be listed for ever).
fn next_page(
    seen: &mut std::collections::HashSet<(String, String)>,
    truncated: bool,
    key_marker: Option<String>,
    upload_id_marker: Option<String>,
) -> Result<Option<(String, String)>, ()> {
    match (truncated, key_marker, upload_id_marker) {
        (false, ..) => Ok(None),
        (true, Some(k), Some(u)) if seen.insert((k.clone(), u.clone())) => Ok(Some((k, u))),
        (true, ..) => Err(()),
    }
}

/// Signed requests to one bucket.
pub struct S3Api {
    pub(crate) client: HttpClient,
    pub(crate) store: Arc<AmazonS3>,
    /// `scheme://host[:port]` plus `/bucket` for path-style requests: what
    /// a key is appended to.
    pub(crate) bucket_url: String,
    pub(crate) region: String,
    pub(crate) bucket: String,
    /// Retries of a GET that failed for a reason that passes (a dropped
    /// connection, 429, 5xx), as object_store retries its own requests, and
    /// the time all of them may take.
    pub(crate) max_retries: usize,
    pub(crate) retry_timeout: std::time::Duration,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListMultipartUploadsResult {
    #[serde(default)]
    upload: Vec<UploadXml>,
    #[serde(default)]
    is_truncated: bool,
    next_key_marker: Option<String>,
    next_upload_id_marker: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UploadXml {
    key: String,
    upload_id: String,
    initiated: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct LifecycleConfigurationXml {
    #[serde(default)]
    rule: Vec<RuleXml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RuleXml {
    #[serde(rename = "ID")]
    id: Option<String>,
    status: Option<String>,
    prefix: Option<String>,
    filter: Option<FilterXml>,
    abort_incomplete_multipart_upload: Option<AbortXml>,
    expiration: Option<ExpirationXml>,
    #[serde(default)]
    transition: Vec<TransitionXml>,
}

/// `Transition`: current objects move to `StorageClass` after `Days` or at
/// a `Date`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TransitionXml {
    storage_class: Option<String>,
}

/// Storage classes whose objects must be restored before a GET reads them
/// (GLACIER_IR and the Intelligent-Tiering tiers a lifecycle rule can pick
/// answer GETs at once).
const ARCHIVE_CLASSES: [&str; 2] = ["GLACIER", "DEEP_ARCHIVE"];

/// `Expiration`: `Days` or `Date` delete current objects;
/// `ExpiredObjectDeleteMarker` alone only removes delete markers.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ExpirationXml {
    days: Option<serde::de::IgnoredAny>,
    date: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct FilterXml {
    prefix: Option<String>,
    tag: Option<serde::de::IgnoredAny>,
    object_size_greater_than: Option<serde::de::IgnoredAny>,
    object_size_less_than: Option<serde::de::IgnoredAny>,
    and: Option<AndXml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AndXml {
    prefix: Option<String>,
    #[serde(default)]
    tag: Vec<serde::de::IgnoredAny>,
    object_size_greater_than: Option<serde::de::IgnoredAny>,
    object_size_less_than: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AbortXml {
    days_after_initiation: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorXml {
    code: Option<String>,
    message: Option<String>,
}

/// Percent-encodes a query value or a key segment as SigV4 wants it
/// (unreserved characters stay; `/` too when `keep_slash`).
pub(crate) fn uri_encode(value: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl S3Api {
    /// [`Self::send_once`], again after a failure that passes, for a GET
    /// (these calls read: a repeat changes nothing). Without it, one
    /// throttled answer (503 SlowDown, which a restore of every subtask at
    /// once invites) failed the listing of multipart uploads or the
    /// lifecycle read at once, and each failed commit attempt with it
    /// (found by review). Back-off doubles from 100 ms, at most 15 s.
    async fn send(
        &self,
        method: http::Method,
        path: &str,
        query: &str,
        body: Bytes,
        headers: &[(&str, String)],
    ) -> Result<Bytes, ApiError> {
        let started = std::time::Instant::now();
        let mut backoff = std::time::Duration::from_millis(100);
        let mut retries = 0;
        loop {
            let result = self
                .send_once(method.clone(), path, query, body.clone(), headers)
                .await;
            match result {
                Err(e)
                    if method == http::Method::GET
                        && passes(&e)
                        && retries < self.max_retries
                        && started.elapsed() + backoff < self.retry_timeout =>
                {
                    log::debug!("retrying after {}ms: {}", backoff.as_millis(), e.message);
                    tokio::time::sleep(backoff).await;
                    retries += 1;
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(15));
                }
                other => return other,
            }
        }
    }

    /// Sends a signed request to `path` (after the bucket URL, starting
    /// with `/` or empty) with `query` (already encoded), and returns the
    /// body of a 2xx answer.
    async fn send_once(
        &self,
        method: http::Method,
        path: &str,
        query: &str,
        body: Bytes,
        headers: &[(&str, String)],
    ) -> Result<Bytes, ApiError> {
        let uri = if query.is_empty() {
            format!("{}{path}", self.bucket_url)
        } else {
            format!("{}{path}?{query}", self.bucket_url)
        };
        let mut builder = http::Request::builder().method(method).uri(&uri);
        for (name, value) in headers {
            builder = builder.header(*name, value);
        }
        let mut request: HttpRequest =
            builder
                .body(HttpRequestBody::from(body))
                .map_err(|e| ApiError {
                    status: None,
                    code: None,
                    message: format!("building the request to {uri}: {e}"),
                })?;
        let credential = self
            .store
            .credentials()
            .get_credential()
            .await
            .map_err(|e| ApiError {
                status: None,
                code: None,
                message: format!("getting credentials for bucket {}: {e}", self.bucket),
            })?;
        AwsAuthorizer::new(&credential, "s3", &self.region)
            .try_authorize(&mut request, None)
            .map_err(|e| ApiError {
                status: None,
                code: None,
                message: format!("signing the request to {uri}: {e}"),
            })?;
        let response = self.client.execute(request).await.map_err(|e| ApiError {
            status: None,
            code: None,
            message: format!("sending the request to {uri}: {e}"),
        })?;
        let status = response.status();
        let body = response.into_body().bytes().await.map_err(|e| ApiError {
            status: Some(status.as_u16()),
            code: None,
            message: format!("reading the answer from {uri}: {e}"),
        })?;
        if status.is_success() {
            return Ok(body);
        }
        let parsed: Option<ErrorXml> = quick_xml::de::from_reader(body.as_ref()).ok();
        let code = parsed.as_ref().and_then(|e| e.code.clone());
        let text = parsed.and_then(|e| e.message).unwrap_or_default();
        Err(ApiError {
            status: Some(status.as_u16()),
            message: format!(
                "{uri} answered {status}{}{}",
                code.as_deref().map(|c| format!(" {c}")).unwrap_or_default(),
                if text.is_empty() {
                    String::new()
                } else {
                    format!(": {text}")
                }
            ),
            code,
        })
    }

    /// Every open multipart upload whose key starts with `prefix`, page by
    /// page.
    pub async fn list_multipart_uploads(&self, prefix: &str) -> Result<Vec<OpenUpload>, ApiError> {
        let mut out = Vec::new();
        let mut markers: Option<(String, String)> = None;
        let mut seen: std::collections::HashSet<(String, String)> = Default::default();
        loop {
            // Keys in alphabetical order, as SigV4's canonical query wants.
            let mut query = String::new();
            if let Some((key, id)) = &markers {
                query.push_str(&format!("key-marker={}&", uri_encode(key, false)));
                query.push_str(&format!("prefix={}&", uri_encode(prefix, false)));
                query.push_str(&format!(
                    "upload-id-marker={}&uploads=",
                    uri_encode(id, false)
                ));
            } else {
                query.push_str(&format!("prefix={}&uploads=", uri_encode(prefix, false)));
            }
            let body = self
                .send(http::Method::GET, "", &query, Bytes::new(), &[])
                .await?;
            let page: ListMultipartUploadsResult = quick_xml::de::from_reader(body.as_ref())
                .map_err(|e| ApiError {
                    status: None,
                    code: None,
                    message: format!(
                        "the ListMultipartUploads answer of bucket {} does not parse: {e}",
                        self.bucket
                    ),
                })?;
            out.extend(page.upload.into_iter().map(|u| OpenUpload {
                key: u.key,
                upload_id: u.upload_id,
                initiated: u.initiated,
            }));
            match next_page(
                &mut seen,
                page.is_truncated,
                page.next_key_marker,
                page.next_upload_id_marker,
            ) {
                Ok(Some(next)) => markers = Some(next),
                Ok(None) => return Ok(out),
                Err(()) => {
                    return Err(ApiError {
                        status: None,
                        code: None,
                        message: format!(
                            "the ListMultipartUploads answer of bucket {} is truncated without \
                             a usable next marker (none, or one it gave before)",
                            self.bucket
                        ),
                    })
                }
            }
        }
    }

    /// The bucket's lifecycle rules; `Ok(None)` when it has no
    /// configuration.
    pub async fn lifecycle_rules(&self) -> Result<Option<Vec<LifecycleRule>>, ApiError> {
        let body = match self
            .send(http::Method::GET, "", "lifecycle=", Bytes::new(), &[])
            .await
        {
            Ok(b) => b,
            Err(e) if e.code.as_deref() == Some("NoSuchLifecycleConfiguration") => return Ok(None),
            Err(e) => return Err(e),
        };
        let config: LifecycleConfigurationXml =
            quick_xml::de::from_reader(body.as_ref()).map_err(|e| ApiError {
                status: None,
                code: None,
                message: format!(
                    "the lifecycle configuration of bucket {} does not parse: {e}",
                    self.bucket
                ),
            })?;
        // S3 requires every rule's Status. A rule without one is another
        // service's form (GCS's XML API answers its own rules, whose
        // conditions and actions this reader does not know): read as S3's,
        // every rule would look disabled and pass the checks unread
        // (found by review).
        if let Some(r) = config.rule.iter().find(|r| r.status.is_none()) {
            return Err(ApiError {
                status: None,
                code: Some(UNREADABLE_LIFECYCLE.to_string()),
                message: format!(
                    "the lifecycle configuration of bucket {} has a rule without a Status{} \
                     (not S3's form), so the sink cannot tell whether it aborts prepared \
                     uploads or removes the sink's control objects",
                    self.bucket,
                    r.id.as_deref()
                        .map(|id| format!(" ('{id}')"))
                        .unwrap_or_default()
                ),
            });
        }
        Ok(Some(
            config.rule.into_iter().map(LifecycleRule::from).collect(),
        ))
    }

    /// Creates the bucket (tests and tools; the sink never creates one).
    pub async fn create_bucket(&self) -> Result<(), ApiError> {
        // Outside us-east-1, S3 wants the region in the body.
        let body = if self.region == "us-east-1" {
            Bytes::new()
        } else {
            Bytes::from(format!(
                "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                 <LocationConstraint>{}</LocationConstraint></CreateBucketConfiguration>",
                self.region
            ))
        };
        match self.send(http::Method::PUT, "", "", body, &[]).await {
            Ok(_) => Ok(()),
            Err(e) if e.code.as_deref() == Some("BucketAlreadyOwnedByYou") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Deletes the bucket, which must be empty (tests and tools: a
    /// throw-away bucket on a local server).
    pub async fn delete_bucket(&self) -> Result<(), ApiError> {
        match self
            .send(http::Method::DELETE, "", "", Bytes::new(), &[])
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code.as_deref() == Some("NoSuchBucket") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Replaces the bucket's lifecycle configuration with `xml` (tests and
    /// tools).
    pub async fn put_lifecycle(&self, xml: &str) -> Result<(), ApiError> {
        use base64::Engine;
        use md5::Digest;
        let md5 =
            base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(xml.as_bytes()));
        self.send(
            http::Method::PUT,
            "",
            "lifecycle=",
            Bytes::from(xml.to_string()),
            &[("content-md5", md5)],
        )
        .await
        .map(|_| ())
    }
}

/// The code of [`S3Api::lifecycle_rules`]'s refusal of a configuration it
/// cannot read as S3's.
pub const UNREADABLE_LIFECYCLE: &str = "TwopcUnreadableLifecycle";

/// Whether a failed call may succeed if repeated: no answer (a dropped or
/// refused connection, a timeout), an answer cut off while its body was
/// read (its status is a success's), throttling, or a server error.
fn passes(e: &ApiError) -> bool {
    matches!(
        e.status,
        None | Some(200..=299 | 429 | 500 | 502 | 503 | 504)
    )
}

impl From<RuleXml> for LifecycleRule {
    fn from(r: RuleXml) -> Self {
        // (prefix, filtered by tag, filtered by size)
        let (prefix, by_tag, by_size) = match r.filter {
            Some(f) => match f.and {
                Some(a) => (
                    a.prefix.unwrap_or_default(),
                    !a.tag.is_empty(),
                    a.object_size_greater_than.is_some() || a.object_size_less_than.is_some(),
                ),
                None => (
                    f.prefix.unwrap_or_default(),
                    f.tag.is_some(),
                    f.object_size_greater_than.is_some() || f.object_size_less_than.is_some(),
                ),
            },
            None => (r.prefix.unwrap_or_default(), false, false),
        };
        let narrowed = by_tag || by_size;
        LifecycleRule {
            id: r.id,
            enabled: r.status.as_deref() == Some("Enabled"),
            prefix,
            narrowed,
            abort_incomplete_days: r
                .abort_incomplete_multipart_upload
                .and_then(|a| a.days_after_initiation),
            expires_objects: r
                .expiration
                .is_some_and(|e| e.days.is_some() || e.date.is_some()),
            archives_objects: r.transition.iter().any(|t| {
                t.storage_class
                    .as_deref()
                    .is_some_and(|c| ARCHIVE_CLASSES.contains(&c))
            }),
            by_tag,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_rules_parse_in_every_form() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<LifecycleConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Rule><ID>short</ID><Filter><Prefix>out/</Prefix></Filter><Status>Enabled</Status>
    <AbortIncompleteMultipartUpload><DaysAfterInitiation>1</DaysAfterInitiation></AbortIncompleteMultipartUpload></Rule>
  <Rule><ID>legacy</ID><Prefix>logs/</Prefix><Status>Disabled</Status>
    <Expiration><Days>30</Days></Expiration></Rule>
  <Rule><ID>tagged</ID><Filter><And><Prefix>x</Prefix><Tag><Key>k</Key><Value>v</Value></Tag></And></Filter>
    <Status>Enabled</Status></Rule>
</LifecycleConfiguration>"#;
        let c: LifecycleConfigurationXml = quick_xml::de::from_str(xml).unwrap();
        let rules: Vec<LifecycleRule> = c.rule.into_iter().map(LifecycleRule::from).collect();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[0].id.as_deref(), Some("short"));
        assert_eq!((rules[0].prefix.as_str(), rules[0].enabled), ("out/", true));
        assert_eq!(rules[0].abort_incomplete_days, Some(1));
        assert_eq!(
            (rules[1].prefix.as_str(), rules[1].enabled),
            ("logs/", false)
        );
        assert_eq!(rules[1].abort_incomplete_days, None);
        assert!(rules[2].narrowed && rules[2].by_tag && rules[2].prefix == "x");
        assert!(rules[1].expires_objects && !rules[0].expires_objects);
        let xml = r#"<LifecycleConfiguration>
  <Rule><ID>dated</ID><Filter><Prefix></Prefix></Filter><Status>Enabled</Status>
    <Expiration><Date>2030-01-01T00:00:00Z</Date></Expiration></Rule>
  <Rule><ID>markers</ID><Filter><Prefix></Prefix></Filter><Status>Enabled</Status>
    <Expiration><ExpiredObjectDeleteMarker>true</ExpiredObjectDeleteMarker></Expiration></Rule>
</LifecycleConfiguration>"#;
        let c: LifecycleConfigurationXml = quick_xml::de::from_str(xml).unwrap();
        let rules: Vec<LifecycleRule> = c.rule.into_iter().map(LifecycleRule::from).collect();
        assert!(rules[0].expires_objects, "a date expires objects");
        assert!(!rules[0].by_tag);
        assert!(!rules[1].expires_objects, "delete markers only");
        let xml = r#"<LifecycleConfiguration>
  <Rule><ID>cold</ID><Filter><Prefix></Prefix></Filter><Status>Enabled</Status>
    <Transition><Days>30</Days><StorageClass>STANDARD_IA</StorageClass></Transition>
    <Transition><Days>90</Days><StorageClass>DEEP_ARCHIVE</StorageClass></Transition></Rule>
  <Rule><ID>instant</ID><Filter><Prefix></Prefix></Filter><Status>Enabled</Status>
    <Transition><Days>30</Days><StorageClass>GLACIER_IR</StorageClass></Transition></Rule>
</LifecycleConfiguration>"#;
        let c: LifecycleConfigurationXml = quick_xml::de::from_str(xml).unwrap();
        let rules: Vec<LifecycleRule> = c.rule.into_iter().map(LifecycleRule::from).collect();
        assert!(rules[0].archives_objects && !rules[0].expires_objects);
        assert!(
            !rules[1].archives_objects,
            "instant retrieval reads at once"
        );
    }

    #[test]
    fn a_listing_that_cycles_between_pages_is_refused_not_followed() {
        let mut seen = Default::default();
        let page = |k: &str, u: &str| (true, Some(k.to_string()), Some(u.to_string()));
        let mut next =
            |(t, k, u): (bool, Option<String>, Option<String>)| next_page(&mut seen, t, k, u);
        assert_eq!(next(page("a", "1")), Ok(Some(("a".into(), "1".into()))));
        assert_eq!(next(page("b", "2")), Ok(Some(("b".into(), "2".into()))));
        // The same key with another upload is a new page.
        assert_eq!(next(page("b", "3")), Ok(Some(("b".into(), "3".into()))));
        assert_eq!(next(page("a", "1")), Err(()), "back to the first page");
        assert_eq!(next((true, None, Some("9".into()))), Err(()));
        assert_eq!(next((false, None, None)), Ok(None));
    }

    #[test]
    fn uploads_parse_with_pages() {
        let xml = r#"<ListMultipartUploadsResult><Bucket>b</Bucket><IsTruncated>true</IsTruncated>
<NextKeyMarker>k2</NextKeyMarker><NextUploadIdMarker>u2</NextUploadIdMarker>
<Upload><Key>k1</Key><UploadId>u1</UploadId><Initiated>2010-11-10T20:48:33.000Z</Initiated></Upload>
<Upload><Key>k2</Key><UploadId>u2</UploadId></Upload></ListMultipartUploadsResult>"#;
        let page: ListMultipartUploadsResult = quick_xml::de::from_str(xml).unwrap();
        assert_eq!(page.upload.len(), 2);
        assert!(page.is_truncated);
        assert_eq!(page.next_key_marker.as_deref(), Some("k2"));
        assert_eq!(uri_encode("a/b c+", false), "a%2Fb%20c%2B");
        assert_eq!(uri_encode("a/b", true), "a/b");
    }
}
