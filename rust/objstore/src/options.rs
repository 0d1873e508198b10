//! The options of the object store destination: plain fields, so that a
//! configuration (JNI, SQL, a tool's flags) fills them in directly, and a
//! [`S3Options::validate`] that says what to change.

use twopc_core::error::ConfigError;

use crate::credentials::CredentialSource;

/// S3's smallest part (all but the last part of an upload); servers refuse
/// to complete an upload with a smaller one (`EntityTooSmall`).
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;
/// S3's largest part.
pub const MAX_PART_SIZE: usize = 5 * 1024 * 1024 * 1024;
/// S3's largest number of parts of one upload.
pub const MAX_PARTS: usize = 10_000;

/// How records are laid out in the output objects (as in the filesystem
/// destination).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RecordFormat {
    /// Each record followed by `\n`.
    #[default]
    Lines,
    /// Records back to back, as the serializer produced them.
    Raw,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Options {
    /// `s3://bucket/prefix` (the prefix may be empty or nested: `a/b`).
    pub url: String,
    /// Another endpoint than AWS's, e.g. `http://127.0.0.1:54371` for a
    /// local server, or a provider's S3-compatible endpoint.
    pub endpoint: Option<String>,
    pub region: String,
    /// Path-style requests (`endpoint/bucket/key`) instead of
    /// virtual-hosted ones (`bucket.endpoint/key`); most local and
    /// S3-compatible servers need this.
    pub path_style: bool,
    /// Permit plain `http://` endpoints (a local test server only).
    pub allow_http: bool,
    pub credentials: CredentialSource,
    /// The profile of `~/.aws/credentials` / `~/.aws/config` to read when
    /// the environment has no keys (else `AWS_PROFILE`, else `default`).
    pub profile: Option<String>,
    pub part_prefix: String,
    /// Appended to object names, e.g. `.txt`; may be empty.
    pub part_suffix: String,
    pub format: RecordFormat,
    /// Bytes per uploaded part (the last part of a transaction may be
    /// smaller). Memory per open transaction is about one part.
    pub part_size: usize,
    /// Accept a `part_size` under S3's 5 MiB minimum. Only for servers that
    /// accept small parts (tests): S3 refuses to complete such uploads.
    pub allow_small_parts: bool,
    /// Retries of one request inside object_store (transient errors), and
    /// the time after which it stops retrying.
    pub max_retries: usize,
    pub retry_timeout_ms: u64,
    /// Time limit of one HTTP request.
    pub request_timeout_ms: u64,
    /// How long an ownership lease lasts without renewal (see `lease`).
    pub lease_ms: u64,
}

impl S3Options {
    /// Defaults for `url`: AWS, region us-east-1, virtual-hosted requests,
    /// HTTPS only, the standard credential chain, 8 MiB parts.
    pub fn new(url: impl Into<String>) -> Self {
        S3Options {
            url: url.into(),
            endpoint: None,
            region: "us-east-1".to_string(),
            path_style: false,
            allow_http: false,
            credentials: CredentialSource::Standard,
            profile: None,
            part_prefix: "part".to_string(),
            part_suffix: String::new(),
            format: RecordFormat::Lines,
            part_size: 8 * 1024 * 1024,
            allow_small_parts: false,
            max_retries: 10,
            retry_timeout_ms: 180_000,
            request_timeout_ms: 30_000,
            lease_ms: 10 * 60 * 1000,
        }
    }

    /// The bucket and the key prefix (without a trailing `/`; empty for the
    /// bucket's root) of `url`.
    pub fn target(&self) -> Result<(String, String), ConfigError> {
        let rest = self.url.strip_prefix("s3://").ok_or_else(|| {
            ConfigError::new(format!(
                "the object store URL {:?} must start with s3://, e.g. s3://my-bucket/output",
                self.url
            ))
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        check_bucket(bucket)?;
        let prefix = prefix.trim_end_matches('/');
        if !prefix.is_empty() {
            for segment in prefix.split('/') {
                if segment.is_empty() || segment == "." || segment == ".." {
                    return Err(ConfigError::new(format!(
                        "the key prefix {prefix:?} of {} has an empty, '.' or '..' segment; \
                         write it as a/b/c",
                        self.url
                    )));
                }
                if let Some(bad) = segment.chars().find(|c| {
                    !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '=' | '+'))
                }) {
                    return Err(ConfigError::new(format!(
                        "the key prefix {prefix:?} of {} contains {bad:?}; use letters, digits \
                         and - _ . = + between the slashes",
                        self.url
                    )));
                }
            }
        }
        Ok((bucket.to_string(), prefix.to_string()))
    }

    /// Checks everything; the error says what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.target()?;
        if self.region.is_empty()
            || !self
                .region
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(ConfigError::new(format!(
                "region {:?} is not a region name; set one, e.g. us-east-1",
                self.region
            )));
        }
        if let Some(endpoint) = &self.endpoint {
            let plain = endpoint.starts_with("http://");
            if !plain && !endpoint.starts_with("https://") {
                return Err(ConfigError::new(format!(
                    "endpoint {endpoint:?} must start with https:// (or http:// for a local \
                     server, with allow-http)"
                )));
            }
            if plain && !self.allow_http {
                return Err(ConfigError::new(format!(
                    "endpoint {endpoint:?} is plain HTTP: set allow-http for a local test \
                     server, or use https://"
                )));
            }
            if endpoint.contains('@') {
                return Err(ConfigError::new(
                    "the endpoint holds user information ('@'); give credentials through the \
                     environment or a profile, never in the endpoint",
                ));
            }
            // Virtual-hosted requests put the bucket into the host name,
            // which an address cannot take.
            let host = url::Url::parse(endpoint).ok().and_then(|u| {
                u.host()
                    .map(|h| matches!(h, url::Host::Ipv4(_) | url::Host::Ipv6(_)))
            });
            if host == Some(true) && !self.path_style {
                return Err(ConfigError::new(format!(
                    "endpoint {endpoint:?} is an IP address, so the bucket cannot go into its \
                     host name (virtual-hosted requests): set path-style access"
                )));
            }
        }
        if let Some(p) = &self.profile {
            if p.is_empty() || p.contains(['[', ']', '\n']) {
                return Err(ConfigError::new(format!(
                    "profile {p:?} is not a profile name"
                )));
            }
        }
        twopc_core::part_names::validate_part_affixes(&self.part_prefix, &self.part_suffix)?;
        let min = if self.allow_small_parts {
            1
        } else {
            MIN_PART_SIZE
        };
        if self.part_size < min || self.part_size > MAX_PART_SIZE {
            return Err(ConfigError::new(format!(
                "part size {} is outside S3's limits: set it between {MIN_PART_SIZE} (5 MiB) and \
                 {MAX_PART_SIZE} (5 GiB) bytes",
                self.part_size
            )));
        }
        if self.request_timeout_ms == 0 {
            return Err(ConfigError::new(
                "the request timeout is 0; set it to a few seconds at least",
            ));
        }
        if self.lease_ms < 10_000 {
            return Err(ConfigError::new(format!(
                "the ownership lease of {} ms is shorter than 10 s; a holder could not renew \
                 it in time. Set it to minutes",
                self.lease_ms
            )));
        }
        Ok(())
    }
}

/// S3's bucket naming rules (the common subset every provider accepts).
fn check_bucket(bucket: &str) -> Result<(), ConfigError> {
    let ok = (3..=63).contains(&bucket.len())
        && bucket
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric())
        && !bucket.contains("..");
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(format!(
            "bucket name {bucket:?} is not valid: 3 to 63 lowercase letters, digits, '-' and \
             '.', starting and ending with a letter or digit"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::{Credentials, Secret};

    #[test]
    fn targets_parse_and_bad_ones_say_what_to_change() {
        let t = |u: &str| S3Options::new(u).target();
        assert_eq!(t("s3://bkt").unwrap(), ("bkt".into(), String::new()));
        assert_eq!(t("s3://bkt/a/b/").unwrap(), ("bkt".into(), "a/b".into()));
        for bad in [
            "bkt/x",
            "s3://B",
            "s3://bkt/a//b",
            "s3://bkt/../x",
            "s3://bkt/a b",
        ] {
            assert!(t(bad).is_err(), "{bad} accepted");
        }
        let mut o = S3Options::new("s3://bkt/p");
        assert!(o.validate().is_ok());
        o.endpoint = Some("http://127.0.0.1:1".into());
        assert!(o.validate().unwrap_err().message().contains("allow-http"));
        o.allow_http = true;
        // An address cannot take the bucket into its host name.
        assert!(o.validate().unwrap_err().message().contains("path-style"));
        o.path_style = true;
        assert!(o.validate().is_ok());
        o.part_size = 1024;
        assert!(o.validate().unwrap_err().message().contains("5 MiB"));
        o.allow_small_parts = true;
        assert!(o.validate().is_ok());
    }

    #[test]
    fn debug_of_the_options_never_shows_a_secret() {
        let mut o = S3Options::new("s3://bkt/p");
        o.credentials = CredentialSource::Static(Credentials {
            access_key_id: "AKIDSHOWN".into(),
            secret_access_key: Secret::new("s3cr3t-value"),
            session_token: Some(Secret::new("t0ken-value")),
            source: "test".into(),
        });
        let shown = format!("{o:?} {o:#?}");
        assert!(shown.contains("AKIDSHOWN"));
        assert!(!shown.contains("s3cr3t-value") && !shown.contains("t0ken-value"));
    }
}
