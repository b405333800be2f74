//! The source database's connection string, and how it is logged (password hidden).

use std::fmt;

use serde::{Deserialize, Serialize};

/// A libpq connection URL or `key=value` string (`source_url`); it derefs to the text, and its
/// `Debug` hides the password ([`redact_url`]), so configs can be logged.
#[derive(Clone, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(transparent)]
pub struct SourceUrl(pub String);

impl std::ops::Deref for SourceUrl {
    type Target = String;
    fn deref(&self) -> &String {
        &self.0
    }
}

impl From<String> for SourceUrl {
    fn from(url: String) -> Self {
        SourceUrl(url)
    }
}

impl From<&str> for SourceUrl {
    fn from(url: &str) -> Self {
        SourceUrl(url.to_owned())
    }
}

impl PartialEq<&str> for SourceUrl {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl fmt::Debug for SourceUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact_url(&self.0), f)
    }
}

/// Query parameters whose values [`redact_url`] hides: these names, and any that contains
/// one of [`SECRET_WORDS`] (compared percent-decoded and in lower case).
const SECRET_PARAMETERS: &[&str] = &[
    "pass", "key", "apikey", "api_key", "api-key", "code", "sig", "auth",
];
/// See [`SECRET_PARAMETERS`]: `sslpassword`, `client_secret`, `X-Amz-Security-Token`, ...
const SECRET_WORDS: &[&str] = &["password", "secret", "token", "signature", "credential"];

/// Whether the query parameter `name` holds a secret (see [`SECRET_PARAMETERS`]).
fn is_secret_parameter(name: &str) -> bool {
    let name = percent_encoding::percent_decode_str(name)
        .decode_utf8_lossy()
        .to_ascii_lowercase();
    SECRET_PARAMETERS.contains(&name.as_str()) || SECRET_WORDS.iter().any(|w| name.contains(w))
}

/// `url` without its password, and, unless it is a PostgreSQL URL, without its path and query
/// (a webhook's path or query may hold a token): `https://hooks.example.com/***`.
pub fn redact_url_path(url: &str) -> String {
    let redacted = redact_url(url);
    if redacted.starts_with("postgres://") || redacted.starts_with("postgresql://") {
        return redacted;
    }
    let Some(scheme_end) = redacted.find("://") else {
        return redacted;
    };
    let rest = &redacted[scheme_end + 3..];
    match rest.find(['/', '?', '#']) {
        Some(end) => format!("{}{}/***", &redacted[..scheme_end + 3], &rest[..end]),
        None => redacted,
    }
}

/// Hides the password of a libpq URL (`postgres://user:secret@host` -> `postgres://user:***@host`)
/// or key=value string (`password=secret` -> `password=***`) for logs and errors, and the
/// values of query parameters such as `token`, `key`, `sig` or `sslpassword`.
pub fn redact_url(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        // The user info ends at the last '@' (a password may hold '/' or an unencoded '?'; an
        // '@' in a query value makes this hide more than the password, never less).
        let mut out = url.to_owned();
        if let Some(at) = rest.rfind('@') {
            if let Some(colon) = rest[..at].find(':') {
                out = format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &rest[..colon],
                    &rest[at..]
                );
            }
        }
        // A password may also come as a query parameter, and a webhook's URL often carries a
        // token or a signature there.
        if let Some((base, query)) = out.clone().split_once('?') {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if is_secret_parameter(name) => format!("{name}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            out = format!("{base}?{}", query.join("&"));
        }
        return out;
    }
    // key=value form; a quoted value may contain spaces. The key in any case: libpq refuses
    // `PASSWORD=...`, and the error that says so must not show the value.
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(start) = rest.to_ascii_lowercase().find("password") {
        let after = &rest[start + "password".len()..];
        let Some(value) = after.trim_start().strip_prefix('=') else {
            out.push_str(&rest[..start + "password".len()]);
            rest = after;
            continue;
        };
        let value = value.trim_start();
        let end = if let Some(quoted) = value.strip_prefix('\'') {
            let mut escaped = false;
            quoted
                .char_indices()
                .find(|&(_, c)| {
                    let close = c == '\'' && !escaped;
                    escaped = c == '\\' && !escaped;
                    close
                })
                .map_or(value.len(), |(i, _)| i + 2)
        } else {
            value.find(char::is_whitespace).unwrap_or(value.len())
        };
        out.push_str(&rest[..start]);
        out.push_str("password=***");
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}
