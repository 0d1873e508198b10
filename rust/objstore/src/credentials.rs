//! Where the access keys come from: the standard AWS environment variables,
//! then the profile chain (`AWS_PROFILE`, `~/.aws/credentials`,
//! `~/.aws/config`), read by a minimal reader of those two files. When
//! neither has keys, object_store's own chain (instance metadata, web
//! identity, container credentials) takes over.
//!
//! Secrets never reach a log or a message: [`Secret`]'s `Debug` and
//! `Display` print a mask.

use std::path::{Path, PathBuf};

/// A value that must never be shown.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself, for the one place that signs requests with it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// An access key pair, with the session token of temporary credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// Not a secret (it names the key, like a user name), so it is shown.
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
    /// Where they were found, for messages ("environment", "profile 'x' in
    /// /root/.aws/credentials").
    pub source: String,
}

/// Where to look for credentials.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum CredentialSource {
    /// The environment, then the profile chain, then object_store's own
    /// chain (instance metadata and the like).
    #[default]
    Standard,
    /// These keys (a configuration that carries them itself).
    Static(Credentials),
}

/// What the resolver reads: the process environment and the home
/// directory, replaceable in tests.
pub struct Environment<'a> {
    pub var: &'a dyn Fn(&str) -> Option<String>,
    pub home: Option<PathBuf>,
}

impl Environment<'_> {
    /// The process's own environment.
    pub fn process() -> Environment<'static> {
        Environment {
            var: &|k| std::env::var(k).ok().filter(|v| !v.is_empty()),
            home: std::env::var_os("HOME").map(PathBuf::from),
        }
    }
}

/// The keys of the standard chain: the environment's, else the profile's
/// (`profile`, else `AWS_PROFILE`, else `default`). `Ok(None)` when neither
/// has any; an error when the files say something half (a key id without
/// its secret) or a named profile does not exist.
pub fn resolve(
    profile: Option<&str>,
    env: &Environment<'_>,
) -> Result<Option<Credentials>, String> {
    let var = |k: &str| (env.var)(k);
    match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) => {
            return Ok(Some(Credentials {
                access_key_id: id,
                secret_access_key: Secret(secret),
                session_token: var("AWS_SESSION_TOKEN").map(Secret),
                source: "the environment (AWS_ACCESS_KEY_ID)".to_string(),
            }))
        }
        (Some(_), None) => {
            return Err(
                "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not: set both, or \
                 neither to use a profile"
                    .to_string(),
            )
        }
        _ => {}
    }
    let named = profile.map(str::to_string).or_else(|| var("AWS_PROFILE"));
    let name = named.clone().unwrap_or_else(|| "default".to_string());
    let credentials_file = var("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| env.home.as_ref().map(|h| h.join(".aws/credentials")));
    let config_file = var("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| env.home.as_ref().map(|h| h.join(".aws/config")));
    let mut found_section = false;
    // ~/.aws/credentials names sections `[name]`; ~/.aws/config names them
    // `[profile name]` (and `[default]`).
    for (file, section) in [
        (credentials_file.as_deref(), name.clone()),
        (config_file.as_deref(), config_section(&name)),
    ] {
        let Some(file) = file else { continue };
        let Some(fields) = read_section(file, &section)? else {
            continue;
        };
        found_section = true;
        let get = |k: &str| {
            fields
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        match (get("aws_access_key_id"), get("aws_secret_access_key")) {
            (Some(id), Some(secret)) => {
                return Ok(Some(Credentials {
                    access_key_id: id,
                    secret_access_key: Secret(secret),
                    session_token: get("aws_session_token").map(Secret),
                    source: format!("profile '{name}' in {}", file.display()),
                }))
            }
            (Some(_), None) => {
                return Err(format!(
                    "profile '{name}' in {} has aws_access_key_id but no aws_secret_access_key",
                    file.display()
                ))
            }
            _ => {}
        }
    }
    if named.is_some() && !found_section {
        return Err(format!(
            "AWS profile '{name}' is not in {} nor in {}: check AWS_PROFILE or the profile option",
            shown(credentials_file.as_deref()),
            shown(config_file.as_deref())
        ));
    }
    Ok(None)
}

fn config_section(name: &str) -> String {
    if name == "default" {
        name.to_string()
    } else {
        format!("profile {name}")
    }
}

fn shown(p: Option<&Path>) -> String {
    p.map_or("(no home directory)".to_string(), |p| {
        p.display().to_string()
    })
}

/// The `key = value` lines of `[section]` in an INI file; `Ok(None)` when
/// the file or the section is absent. Comments (`#`, `;`) and other
/// sections are skipped; nothing is ever logged.
fn read_section(file: &Path, section: &str) -> Result<Option<Vec<(String, String)>>, String> {
    let text = match std::fs::read(file) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", file.display())),
    };
    let mut inside = false;
    let mut seen = false;
    let mut fields = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            seen |= inside;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                fields.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }
    Ok(seen.then_some(fields))
}

/// Reads the keys of a profile (or of the environment) again.
type ReadKeys = dyn Fn(Option<&str>) -> Result<Option<Credentials>, String> + Send + Sync;

/// How long keys read from the environment or a profile are used before
/// they are read again.
pub const REREAD_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Keys found by [`resolve`], read again every [`REREAD_AFTER`]: temporary
/// credentials in a profile file (a session token that a sidecar or
/// `aws sso login` replaces before it expires) stay valid for the life of
/// the sink. Read once, every request failed once the token expired, and
/// a commit used up its attempts and stopped the job although a restart
/// would have read the new keys (found by review). When a read fails or
/// finds nothing, the last keys stay in use (and the failure is logged).
pub struct RereadCredentials {
    profile: Option<String>,
    read: Box<ReadKeys>,
    state: std::sync::Mutex<Reread>,
}

/// The keys in use, and other keys read but not yet taken.
struct Reread {
    read_at: std::time::Instant,
    in_use: std::sync::Arc<object_store::aws::AwsCredential>,
    /// Keys that differ from those in use, and when they were first read.
    /// They are taken only when read the same again at least
    /// [`CONFIRM_AFTER`] later: a tool that rewrites the file once per key
    /// (`aws configure set` for the id, the secret, the token in turn)
    /// leaves a mix of old and new keys in between, and signing with a mix
    /// is refused (403) as if the credentials were wrong, which stops the
    /// job (found by re-review).
    candidate: Option<(std::time::Instant, object_store::aws::AwsCredential)>,
}

/// How long new keys must read the same before they are taken.
pub const CONFIRM_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

impl std::fmt::Debug for RereadCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RereadCredentials")
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

impl RereadCredentials {
    /// Starts from `first` (what [`resolve`] found at the start), reading
    /// the process's environment and files again later.
    pub fn new(profile: Option<String>, first: &Credentials) -> Self {
        Self::with_reader(profile, first, |p| resolve(p, &Environment::process()))
    }

    /// As [`Self::new`], reading with `read` (tests).
    pub fn with_reader(
        profile: Option<String>,
        first: &Credentials,
        read: impl Fn(Option<&str>) -> Result<Option<Credentials>, String> + Send + Sync + 'static,
    ) -> Self {
        RereadCredentials {
            profile,
            read: Box::new(read),
            state: std::sync::Mutex::new(Reread {
                read_at: std::time::Instant::now(),
                in_use: std::sync::Arc::new(aws(first)),
                candidate: None,
            }),
        }
    }

    /// The keys to sign with: those in use, read again when `reread_after`
    /// has passed (or `confirm_after`, while new keys wait to be read the
    /// same again); new keys are taken once read the same twice at least
    /// `confirm_after` apart.
    pub fn current(
        &self,
        reread_after: std::time::Duration,
        confirm_after: std::time::Duration,
    ) -> std::sync::Arc<object_store::aws::AwsCredential> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let due = if state.candidate.is_some() {
            confirm_after.min(reread_after)
        } else {
            reread_after
        };
        if state.read_at.elapsed() < due {
            return state.in_use.clone();
        }
        state.read_at = std::time::Instant::now();
        match (self.read)(self.profile.as_deref()) {
            Ok(Some(c)) => {
                let read = aws(&c);
                if same(&read, &state.in_use) {
                    state.candidate = None;
                } else {
                    match &state.candidate {
                        Some((since, waiting))
                            if same(waiting, &read) && since.elapsed() >= confirm_after =>
                        {
                            log::info!(
                                "S3 credentials: taking the new keys (access key {}) of {}",
                                read.key_id,
                                c.source
                            );
                            state.in_use = std::sync::Arc::new(read);
                            state.candidate = None;
                        }
                        Some((_, waiting)) if same(waiting, &read) => {}
                        _ => state.candidate = Some((std::time::Instant::now(), read)),
                    }
                }
            }
            Ok(None) => {
                log::warn!("reading the S3 credentials again found none; the last ones stay in use")
            }
            Err(e) => log::warn!(
                "reading the S3 credentials again failed ({e}); the last ones stay in use"
            ),
        }
        state.in_use.clone()
    }
}

fn same(a: &object_store::aws::AwsCredential, b: &object_store::aws::AwsCredential) -> bool {
    a.key_id == b.key_id && a.secret_key == b.secret_key && a.token == b.token
}

#[async_trait::async_trait]
impl object_store::CredentialProvider for RereadCredentials {
    type Credential = object_store::aws::AwsCredential;

    async fn get_credential(&self) -> object_store::Result<std::sync::Arc<Self::Credential>> {
        Ok(self.current(REREAD_AFTER, CONFIRM_AFTER))
    }
}

fn aws(c: &Credentials) -> object_store::aws::AwsCredential {
    object_store::aws::AwsCredential {
        key_id: c.access_key_id.clone(),
        secret_key: c.secret_access_key.expose().to_string(),
        token: c.session_token.as_ref().map(|t| t.expose().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(id: &str, token: &str) -> Credentials {
        Credentials {
            access_key_id: id.into(),
            secret_access_key: Secret::new(format!("secret-{id}")),
            session_token: Some(Secret::new(token)),
            source: "test".into(),
        }
    }

    /// Temporary keys in a profile are replaced before they expire: the
    /// sink signs with the new ones once it read them the same twice (a
    /// file rewritten once per key shows a mix in between), keeps the last
    /// good ones when a read fails or finds none, and reads no more often
    /// than asked.
    #[test]
    fn keys_are_read_again_and_taken_when_read_the_same_twice() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::time::Duration;
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = reads.clone();
        let reader = move |profile: Option<&str>| {
            assert_eq!(profile, Some("sso"));
            match counted.fetch_add(1, Ordering::SeqCst) {
                // The new id with the old secret and token: a mix.
                0 => Ok(Some(Credentials {
                    access_key_id: "B".into(),
                    ..keys("A", "token-1")
                })),
                1 | 2 => Ok(Some(keys("B", "token-2"))),
                3 => Err("the file is being rewritten".to_string()),
                _ => Ok(None),
            }
        };
        let c = RereadCredentials::with_reader(Some("sso".into()), &keys("A", "token-1"), reader);
        let (hour, zero) = (Duration::from_secs(3600), Duration::ZERO);
        let id = |k: Arc<object_store::aws::AwsCredential>| k.key_id.clone();
        assert_eq!(
            id(c.current(hour, hour)),
            "A",
            "not read again before its time"
        );
        assert_eq!(reads.load(Ordering::SeqCst), 0);
        assert_eq!(id(c.current(zero, zero)), "A", "a mix is not taken");
        assert_eq!(
            id(c.current(zero, zero)),
            "A",
            "new keys read once are not taken"
        );
        let now = c.current(zero, zero);
        assert_eq!(
            (now.key_id.as_str(), now.token.as_deref()),
            ("B", Some("token-2"))
        );
        assert_eq!(
            id(c.current(zero, zero)),
            "B",
            "a failed read keeps the last"
        );
        assert_eq!(id(c.current(zero, zero)), "B", "none found keeps the last");
        assert_eq!(reads.load(Ordering::SeqCst), 5);
        assert_eq!(id(c.current(hour, hour)), "B");
        assert_eq!(reads.load(Ordering::SeqCst), 5);
    }

    fn env_of<'a>(
        vars: &'a [(&'a str, &'a str)],
        home: Option<PathBuf>,
    ) -> (impl Fn(&str) -> Option<String> + 'a, Option<PathBuf>) {
        (
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            },
            home,
        )
    }

    fn home_with(credentials: &str, config: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "twopc-objstore-creds-{:016x}",
            twopc_core::ids::random_u64()
        ));
        std::fs::create_dir_all(dir.join(".aws")).unwrap();
        std::fs::write(dir.join(".aws/credentials"), credentials).unwrap();
        std::fs::write(dir.join(".aws/config"), config).unwrap();
        dir
    }

    #[test]
    fn the_environment_comes_first_and_secrets_never_show() {
        let vars = [
            ("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "very-secret-key"),
            ("AWS_SESSION_TOKEN", "very-secret-token"),
        ];
        let (var, home) = env_of(&vars, None);
        let c = resolve(None, &Environment { var: &var, home })
            .unwrap()
            .unwrap();
        assert_eq!(c.access_key_id, "AKIAEXAMPLE");
        assert_eq!(c.secret_access_key.expose(), "very-secret-key");
        let shown = format!("{c:?} {}", c.secret_access_key);
        assert!(!shown.contains("very-secret"), "{shown}");
    }

    #[test]
    fn profiles_are_read_from_both_files() {
        let home = home_with(
            "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n\
             # comment\n[other]\naws_access_key_id=OTH\naws_secret_access_key=othsecret\n\
             aws_session_token = tok\n",
            "[profile cfgonly]\naws_access_key_id = CFG\naws_secret_access_key = cfgsecret\n",
        );
        let none: [(&str, &str); 0] = [];
        let (var, h) = env_of(&none, Some(home.clone()));
        let env = Environment { var: &var, home: h };
        let c = resolve(None, &env).unwrap().unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.secret_access_key.expose()),
            ("DEF", "defsecret")
        );
        let c = resolve(Some("other"), &env).unwrap().unwrap();
        assert_eq!(c.access_key_id, "OTH");
        assert_eq!(c.session_token.as_ref().map(Secret::expose), Some("tok"));
        let c = resolve(Some("cfgonly"), &env).unwrap().unwrap();
        assert_eq!(c.access_key_id, "CFG");
        let err = resolve(Some("absent"), &env).unwrap_err();
        assert!(err.contains("'absent'"), "{err}");
        // AWS_PROFILE picks the profile when the option does not.
        let vars = [("AWS_PROFILE", "other")];
        let (var, h) = env_of(&vars, Some(home.clone()));
        let c = resolve(None, &Environment { var: &var, home: h })
            .unwrap()
            .unwrap();
        assert_eq!(c.access_key_id, "OTH");
        std::fs::remove_dir_all(home).unwrap();
    }

    #[test]
    fn half_credentials_are_an_error_and_none_is_none() {
        let vars = [("AWS_ACCESS_KEY_ID", "X")];
        let (var, h) = env_of(&vars, None);
        assert!(resolve(None, &Environment { var: &var, home: h }).is_err());
        let none: [(&str, &str); 0] = [];
        let (var, h) = env_of(&none, None);
        assert_eq!(resolve(None, &Environment { var: &var, home: h }), Ok(None));
    }
}
