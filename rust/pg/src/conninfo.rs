//! Connection strings: a URL (`postgres://user@host:port/db?param=value`)
//! or libpq's key=value form (`host=... port=... dbname=... user=...`).
//!
//! Neither may carry a password. A connection string travels with the job
//! (Flink ships it in the job graph) and is printed in logs and errors; the
//! password is given on its own ([`crate::Password`]; in Java
//! `passwordFromEnvironment` / `passwordFromSystemProperty`), read where the
//! sink runs.
//!
//! A URL is split by a real URL parser (the `url` crate), and also as the
//! client library reads it: `tokio-postgres` takes everything between
//! `://` and the *first* `@` as `user:password`, even past a `/`, `?` or
//! `#` (so `postgres://u:pw/x@host/db` carries the password `pw/x`). A URL
//! is refused when either reading finds a password, when a query parameter
//! names one, and when the two readings could differ at all (an `@` outside
//! the user part, a `#` fragment). The Java side (`PostgresDestination`)
//! applies the same rules with `java.net.URI`.
//!
//! [`redact`] renders any string safely: an accepted one as it is (it holds
//! no password by construction), anything else with every part that any
//! reading could take for a password masked.

use std::fmt::Write as _;
use std::str::FromStr;

use twopc_core::error::ConfigError;

/// The URL schemes the client library accepts (it compares them exactly).
const SCHEMES: [&str; 2] = ["postgresql://", "postgres://"];

/// What every refusal of a password says to do instead.
const GIVE_IT_SEPARATELY: &str = "remove it, and give the password on its own: in Java with \
    PostgresDestination.passwordFromEnvironment(\"VARIABLE\") or \
    passwordFromSystemProperty(\"property\"), in Rust with PgOptions::password. A password in the \
    connection string would travel inside the job graph and show in logs";

/// Checks a connection string: no password in any form, and (for a URL)
/// one that every reader reads the same way. The error never shows a
/// password.
pub(crate) fn check(s: &str) -> Result<(), ConfigError> {
    if s.contains("://") {
        check_url(s)
    } else {
        check_key_value(s)
    }
}

/// `s` as it may be shown in messages and `Debug` output.
pub fn redact(s: &str) -> String {
    if s.contains("://") {
        if check_url(s).is_ok() {
            s.to_string()
        } else {
            mask_url(s)
        }
    } else {
        match parse_key_value(s) {
            Ok(pairs) => render_key_value(&pairs),
            Err(_) => "(a key=value connection string that does not parse; not shown, as it may \
                       hold a password)"
                .to_string(),
        }
    }
}

/// Every text in `s` that some reading takes for a password, as written and
/// decoded, for scrubbing messages.
pub(crate) fn passwords(s: &str) -> Vec<String> {
    let mut found = Vec::new();
    if s.contains("://") {
        if let Some(p) = client_url_password(s) {
            found.push(p.to_string());
        }
        if let Ok(url) = url::Url::parse(s) {
            found.extend(url.password().map(str::to_string));
            found.extend(
                url.query_pairs()
                    .filter(|(k, _)| is_password_key(k))
                    .map(|(_, v)| v.into_owned()),
            );
        }
    } else if let Ok(pairs) = parse_key_value(s) {
        found.extend(
            pairs
                .into_iter()
                .filter(|(k, _)| is_password_key(k))
                .map(|(_, v)| v),
        );
    }
    if let Ok(c) = postgres::Config::from_str(s) {
        if let Some(p) = c.get_password() {
            found.push(String::from_utf8_lossy(p).into_owned());
        }
    }
    let decoded: Vec<String> = found
        .iter()
        .map(|p| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    found.extend(decoded);
    found.retain(|p| !p.is_empty());
    found.sort();
    found.dedup();
    found
}

/// A parameter that names a password (`password`, `sslpassword`, in any
/// case: a misspelt one still holds a secret).
fn is_password_key(key: &str) -> bool {
    key.to_ascii_lowercase().contains("password")
}

/// Where a URL's user part is, as the refusal says it.
const USERINFO: &str = "in user:password@, the text between :// and the first @, which \
    PostgreSQL's client reads as user and password";

fn password_refused(shown: &str, what: &str) -> ConfigError {
    ConfigError::new(format!(
        "the PostgreSQL connection URL {shown} carries a password ({what}); {GIVE_IT_SEPARATELY}"
    ))
}

/// The password as the client library reads a URL: what follows the first
/// `:` of the text between `://` and the first `@`.
fn client_url_password(s: &str) -> Option<&str> {
    let (_, rest) = s.split_once("://")?;
    let (userinfo, _) = rest.split_once('@')?;
    userinfo.split_once(':').map(|(_, p)| p)
}

fn check_url(s: &str) -> Result<(), ConfigError> {
    let shown = mask_url(s);
    let Some(rest) = SCHEMES.iter().find_map(|p| s.strip_prefix(p)) else {
        return Err(ConfigError::new(format!(
            "the PostgreSQL connection URL {shown} does not start with postgres:// or \
             postgresql:// (in lower case); write postgres://user@host:port/dbname"
        )));
    };
    if client_url_password(s).is_some() {
        return Err(password_refused(&shown, USERINFO));
    }
    let url = url::Url::parse(s).map_err(|e| {
        ConfigError::new(format!(
            "the PostgreSQL connection URL {shown} is not a valid URL ({e}); write \
             postgres://user@host:port/dbname, percent-encoding special characters"
        ))
    })?;
    if url.password().is_some() {
        return Err(password_refused(&shown, USERINFO));
    }
    if let Some((key, _)) = url.query_pairs().find(|(k, _)| is_password_key(k)) {
        return Err(password_refused(&shown, &format!("the parameter {key}")));
    }
    // With at most one '@', and that one inside the authority, the client
    // library and a URL parser agree on the user; otherwise the client
    // would read a user (or a password) out of the path or the query.
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if rest.matches('@').count() > usize::from(authority.contains('@')) {
        return Err(ConfigError::new(format!(
            "the PostgreSQL connection URL {shown} holds an '@' outside its user part, where \
             PostgreSQL's client would read what comes before it as user and password; write a \
             literal @ in a user, database or parameter as %40"
        )));
    }
    if url.fragment().is_some() {
        return Err(ConfigError::new(format!(
            "the PostgreSQL connection URL {shown} ends in a '#' fragment, which means nothing to \
             PostgreSQL (its client would take it into the database name or a parameter); \
             remove it, or write a literal # as %23"
        )));
    }
    // A setting given twice is taken by the client from the last place it
    // reads, silently: the sink would connect as another user, or to
    // another database, than the rest of the string says.
    let keys: Vec<String> = url.query_pairs().map(|(k, _)| k.into_owned()).collect();
    if let Some(key) = first_repeated(&keys) {
        return Err(given_twice(&shown, key, "give each parameter once"));
    }
    let has = |key: &str| keys.iter().any(|k| k == key);
    if !url.username().is_empty() && has("user") {
        return Err(given_twice(
            &shown,
            "user",
            "name it either before the '@' or in the parameter user, not both",
        ));
    }
    if url.path().len() > 1 && has("dbname") {
        return Err(given_twice(
            &shown,
            "dbname",
            "name the database either in the path or in the parameter dbname, not both",
        ));
    }
    Ok(())
}

/// Keys that name where to connect: given twice, libpq takes the last one,
/// this sink's client (`tokio-postgres`) a list of both.
const HOST_KEYS: [&str; 3] = ["host", "hostaddr", "port"];

/// The first key that occurs again later in `keys`.
fn first_repeated<S: AsRef<str>>(keys: &[S]) -> Option<&str> {
    keys.iter()
        .enumerate()
        .find(|(i, k)| {
            keys[i + 1..]
                .iter()
                .any(|later| later.as_ref() == k.as_ref())
        })
        .map(|(_, k)| k.as_ref())
}

/// The refusal of a setting given twice; `shown` is the string with any
/// password masked.
fn given_twice(shown: &str, key: &str, instead: &str) -> ConfigError {
    if HOST_KEYS.contains(&key) {
        return ConfigError::new(format!(
            "the PostgreSQL connection string {shown} sets {key} twice, which PostgreSQL's \
             clients read differently (libpq takes the last, this sink's client a list of \
             both); give several as one list ({key}=a,b)"
        ));
    }
    ConfigError::new(format!(
        "the PostgreSQL connection string {shown} sets {key} twice, and PostgreSQL's client \
         would silently take one of them; {instead} (with the SQL connector, the table option \
         'username' sets user: then leave the user out of 'url')"
    ))
}

/// A URL with every part that some reading could take for a password
/// masked: the user information up to the *last* `@` (after the user's
/// name), password parameters, and any fragment.
fn mask_url(s: &str) -> String {
    let Some((scheme, rest)) = s.split_once("://") else {
        return "(not shown)".to_string();
    };
    let mut out = format!("{scheme}://");
    let rest = match rest.rfind('@') {
        // Without a ':' before it, no reading finds a password there.
        Some(last) if !rest[..last].contains(':') => {
            out.push_str(&rest[..=last]);
            &rest[last + 1..]
        }
        Some(last) => {
            let user_end = rest.find([':', '@']).unwrap_or(last);
            let _ = write!(out, "{}:***@", &rest[..user_end]);
            &rest[last + 1..]
        }
        None => rest,
    };
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, _)) => (r, Some("***")),
        None => (rest, None),
    };
    match rest.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((k, _))
                        if is_password_key(
                            &percent_encoding::percent_decode_str(k).decode_utf8_lossy(),
                        ) =>
                    {
                        format!("{k}=***")
                    }
                    _ => param.to_string(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(rest),
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

fn check_key_value(s: &str) -> Result<(), ConfigError> {
    let pairs = parse_key_value(s).map_err(|why| {
        ConfigError::new(format!(
            "the PostgreSQL connection string (not shown, as it may hold a password) is neither a \
             postgres:// URL nor a valid key=value string ({why}); write postgres://user@host:port/\
             dbname or host=... port=... dbname=... user=..."
        ))
    })?;
    let named = pairs
        .iter()
        .find(|(k, _)| is_password_key(k))
        .map(|(k, _)| k);
    // The client library's own reading too, should it ever differ.
    let read = postgres::Config::from_str(s)
        .ok()
        .is_some_and(|c| c.get_password().is_some());
    if named.is_some() || read {
        return Err(ConfigError::new(format!(
            "the PostgreSQL connection string {} sets {}; {GIVE_IT_SEPARATELY}",
            render_key_value(&pairs),
            named.map_or("a password", String::as_str)
        )));
    }
    let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    if let Some(key) = first_repeated(&keys) {
        return Err(given_twice(&render_key_value(&pairs), key, "give it once"));
    }
    Ok(())
}

/// Splits libpq's key=value form as the client library does: keywords end
/// at white space or `=`; white space may surround `=`; a value is either
/// single-quoted (a backslash escapes the next character) or runs to the
/// next white space (a backslash escapes there too).
fn parse_key_value(s: &str) -> Result<Vec<(String, String)>, &'static str> {
    let mut pairs = Vec::new();
    let mut it = s.chars().peekable();
    loop {
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = it.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        if key.is_empty() {
            return Err("an '=' without a keyword before it");
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.next_if_eq(&'=').is_none() {
            return Err("a keyword without '=' after it");
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if it.next_if_eq(&'\'').is_some() {
            loop {
                match it.next() {
                    None => return Err("a quoted value without its closing quote"),
                    Some('\'') => break,
                    Some('\\') => match it.next() {
                        Some(c) => value.push(c),
                        None => return Err("a quoted value without its closing quote"),
                    },
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = it.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(it.next());
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return Err("a keyword without a value");
            }
        }
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// Key=value pairs as a string, password values masked, quoted where
/// needed.
fn render_key_value(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            if is_password_key(k) {
                format!("{k}=***")
            } else if v.is_empty()
                || v.contains(|c: char| c.is_whitespace() || c == '\'' || c == '\\')
            {
                format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
            } else {
                format!("{k}={v}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// (connection string, the password text it carries or "" for none,
    /// accepted?). The URL forms of the Java test, plus key=value ones.
    pub(crate) const FORMS: &[(&str, &str, bool)] = &[
        ("postgres://app@db.example:5432/shop", "", true),
        ("postgresql://app@db.example/shop", "", true),
        ("postgres://db.example:5432/shop", "", true),
        ("postgres://app@[::1]:5432/shop", "", true),
        (
            "postgres://app@[2001:db8::7]/shop?application_name=x",
            "",
            true,
        ),
        ("postgres://app%40corp@db/shop", "", true),
        ("postgres://app@%2Fvar%2Frun%2Fpostgresql/shop", "", true),
        ("postgres://app:s3cret-Pw@db:5432/shop", "s3cret-Pw", false),
        ("postgresql://app:s3cret-Pw@db/shop", "s3cret-Pw", false),
        ("postgres://app:pw/x-Tail9@db/shop", "pw/x-Tail9", false),
        ("postgres://app:pw?x-Tail9@db/shop", "pw?x-Tail9", false),
        ("postgres://app:pw#x-Tail9@db/shop", "pw#x-Tail9", false),
        ("postgres://app:p@ss-Tail9@db/shop", "ss-Tail9", false),
        ("postgres://app:p%40ss-Tail9@db/shop", "p%40ss-Tail9", false),
        (
            "postgres://app:s3cret-Pw@[::1]:5432/shop",
            "s3cret-Pw",
            false,
        ),
        ("postgres://app:@db/shop", "", false),
        (
            "postgres://app@db/shop?password=s3cret-Pw",
            "s3cret-Pw",
            false,
        ),
        (
            "postgres://app@db/shop?sslmode=disable&PassWord=s3cret-Pw",
            "s3cret-Pw",
            false,
        ),
        (
            "postgres://db/shop?options=x:s3cret-Pw@evil",
            "s3cret-Pw",
            false,
        ),
        ("postgres://app@db/shop#s3cret-Pw", "s3cret-Pw", false),
        ("POSTGRES://app:s3cret-Pw@db/shop", "s3cret-Pw", false),
        ("mysql://app:s3cret-Pw@db/shop", "s3cret-Pw", false),
        ("host=db port=5432 dbname=shop user=app", "", true),
        (
            "host=db user=app password=s3cret-Pw dbname=shop",
            "s3cret-Pw",
            false,
        ),
        (
            "host=db user=app password = s3cret-Pw dbname=shop",
            "s3cret-Pw",
            false,
        ),
        (
            "host=db user=app password='s3cret Pw' dbname=shop",
            "s3cret Pw",
            false,
        ),
        (
            "host=db user=app password='it\\'s-s3cret' dbname=shop",
            "s3cret",
            false,
        ),
        ("host=db user=app password='s3cret-Pw", "s3cret-Pw", false),
        ("host=db user=app sslpassword=s3cret-Pw", "s3cret-Pw", false),
        // A setting given twice: the client would silently take one of them.
        ("host=db user=app dbname=shop user=other", "", false),
        ("host=a host=b user=app", "", false),
        ("host=a,b user=app dbname=shop", "", true),
        ("postgres://app@db/shop?user=other", "", false),
        ("postgres://app@%2Fvar%2Frun/shop?user=x", "", false),
        ("postgres://db/shop?a=1&&b=2&&c=3", "", true),
        ("postgres://db/shop?port=1&port=2", "", false),
        ("postgres://db/shop?user=app", "", true),
        ("postgres://app@db/shop?dbname=other", "", false),
        ("postgres://app@db?dbname=shop", "", true),
        (
            "postgres://app@db/shop?application_name=a&application_name=b",
            "",
            false,
        ),
    ];

    #[test]
    fn forms_are_refused_or_accepted_and_never_show_a_password() {
        for (s, secret, accepted) in FORMS {
            let checked = check(s);
            assert_eq!(checked.is_ok(), *accepted, "{s}: {checked:?}");
            let shown = redact(s);
            if let Err(e) = &checked {
                let text = e.to_string();
                if !secret.is_empty() {
                    for rendering in [&text, &format!("{e:?}"), &shown] {
                        assert!(!rendering.contains(secret), "{s}: {rendering}");
                    }
                }
                if secret.len() > 1 && s.contains("Tail9") {
                    assert!(
                        !text.contains("Tail9") && !shown.contains("Tail9"),
                        "{text}"
                    );
                }
            } else {
                assert_eq!(shown, *s, "an accepted string is shown as it is");
            }
        }
    }

    #[test]
    fn refusals_say_what_to_do() {
        let e = check("postgres://app:s3cret@db/shop")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("passwordFromEnvironment")
                && e.contains("passwordFromSystemProperty")
                && e.contains("postgres://app:***@db/shop"),
            "{e}"
        );
        let e = check("host=db password = 'a b' user=app")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sets password") && e.contains("host=db password=*** user=app"),
            "{e}"
        );
        let e = check("postgres://app@db/x@y").unwrap_err().to_string();
        assert!(e.contains("%40"), "{e}");
        let e = check("postgres://app@db:port/x").unwrap_err().to_string();
        assert!(e.contains("not a valid URL"), "{e}");
        let e = check("host=db 'user").unwrap_err().to_string();
        assert!(e.contains("not shown"), "{e}");
        let e = check("host=db user=app user = 'b'")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sets user twice") && e.contains("host=db user=app user=b"),
            "{e}"
        );
        let e = check("host=a host=b").unwrap_err().to_string();
        assert!(
            e.contains("host=a,b") && e.contains("a list of both"),
            "{e}"
        );
        let e = check("postgres://app@db/shop?user=b")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sets user twice") && e.contains("'username'"),
            "{e}"
        );
        let e = check("postgres://app@db/shop?dbname=x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sets dbname twice") && e.contains("path"), "{e}");
    }

    #[test]
    fn key_value_strings_parse_as_the_client_reads_them() {
        let pairs = parse_key_value("host = db  user='a \\'b\\' c' dbname=x\\ y").unwrap();
        assert_eq!(
            pairs,
            vec![
                ("host".into(), "db".into()),
                ("user".into(), "a 'b' c".into()),
                ("dbname".into(), "x y".into())
            ]
        );
        assert_eq!(
            render_key_value(&pairs),
            "host=db user='a \\'b\\' c' dbname='x y'"
        );
        assert!(parse_key_value("=x").is_err());
        assert!(parse_key_value("host").is_err());
        assert!(parse_key_value("host=").is_err());
    }

    #[test]
    fn every_reading_of_a_password_is_collected_for_scrubbing() {
        let found = passwords("postgres://app:p%40ss@db/shop");
        assert!(found.contains(&"p%40ss".to_string()), "{found:?}");
        assert!(found.contains(&"p@ss".to_string()), "{found:?}");
        let found = passwords("postgres://app:pw/x@db/shop");
        assert!(found.contains(&"pw/x".to_string()), "{found:?}");
        let found = passwords("host=h password='a b'");
        assert_eq!(found, vec!["a b".to_string()]);
        assert!(passwords("postgres://app@db/shop").is_empty());
    }
}
