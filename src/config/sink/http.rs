//! `kind = "http"`: webhooks, one `POST` per record to a URL template.
//!
//! ```toml
//! [pipelines.sink]
//! kind = "http"
//! url = "https://hooks.example.com/outbox/{destination}"
//! secret = "${WEBHOOK_SECRET}"
//! ```
//!
//! `{destination}` in `url` is replaced by the routed destination (`<aggregate_type>.events`
//! by default), percent-encoded so that it is one path segment (or one query value): every
//! byte but ASCII letters, digits and `-._~` as `%XX`. A URL without it receives every
//! record. The request, the headers and the signature are described in [`crate::sink::http`].

use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};

use super::{Secret, SinkUrl, DEFAULT_DELIVERY_TIMEOUT_MS};
use crate::config::ConfigError;

/// Where the routed destination goes in `url`.
pub const DESTINATION_PLACEHOLDER: &str = "{destination}";
/// Requests in flight at once (of different keys). Small: a webhook receiver is usually an
/// application server, not a broker, and 16 requests in flight already keep a fast one busy.
pub const DEFAULT_HTTP_MAX_CONCURRENCY: usize = 16;
/// How long one request may take, connecting included, before the attempt counts as failed
/// (and is retried): a receiver that has not answered in 10 s is down or overloaded.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// The prefix of the HTTP header names that carry the record's headers and key.
pub const DEFAULT_HEADER_PREFIX: &str = "outbox-";
/// The longest URL the relay sends: RFC 9110 (section 4.1) recommends that senders and
/// recipients support at least 8000 octets, so a longer one may be refused by any receiver.
pub const MAX_URL_LEN: usize = 8000;

/// What is left as is in a destination: RFC 3986's unreserved characters.
const DESTINATION_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `kind = "http"`: webhooks (see the module docs and [`crate::sink::http`]).
///
/// A 2xx answer is an acknowledgement; 408, 429, 5xx, timeouts and connection errors are
/// retried with backoff (for up to `delivery_timeout_ms`); 413 is a refusal as too large and
/// any other status a refusal (`on_bad_event` halts or dead-letters).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// `http(s)://host[:port]/path`, with `{destination}` where the destination goes (in the path or the query); `${NAME}` references are resolved from the
    /// environment.
    pub url: SinkUrl,
    /// A file holding `url`, instead of `url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub url_file: Option<String>,
    /// The HMAC-SHA256 signing key of the `webhook-signature` header (Standard Webhooks);
    /// `whsec_<base64>` is the key's bytes in base64, anything else is the key as is. Empty:
    /// requests are not signed. `${NAME}` references are resolved from the environment.
    #[serde(skip_serializing_if = "is_empty")]
    #[schemars(!skip_serializing_if)]
    pub secret: Secret,
    /// A file holding `secret` (a mounted secret), instead of `secret`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub secret_file: Option<String>,
    /// Prefix of the headers that carry the record's headers and key (Debezium Server's HTTP
    /// sink uses `X-DEBEZIUM-`).
    pub header_prefix: String,
    /// CA certificates for `https` (a PEM file), or `system` (the OS trust store, the
    /// default). The host name is always verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub tls_root_cert: Option<String>,
    /// A client certificate (PEM), with `tls_client_key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub tls_client_cert: Option<String>,
    /// The client certificate's key (PEM), with `tls_client_cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub tls_client_key: Option<String>,
    /// Milliseconds one attempt may take, connecting included.
    pub request_timeout_ms: u64,
    /// Records in flight at once, each of a different key (a key's records go one at a time).
    pub max_concurrency: usize,
    /// Milliseconds a record is retried for, from its first attempt (time queued behind its
    /// key's earlier records does not count); past it the record fails and the session restarts.
    pub delivery_timeout_ms: u64,
}

fn is_empty(secret: &Secret) -> bool {
    secret.0.is_empty()
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            url: SinkUrl::default(),
            url_file: None,
            secret: Secret::default(),
            secret_file: None,
            header_prefix: DEFAULT_HEADER_PREFIX.into(),
            tls_root_cert: None,
            tls_client_cert: None,
            tls_client_key: None,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            max_concurrency: DEFAULT_HTTP_MAX_CONCURRENCY,
            delivery_timeout_ms: DEFAULT_DELIVERY_TIMEOUT_MS,
        }
    }
}

impl HttpConfig {
    pub fn delivery_timeout(&self) -> Duration {
        Duration::from_millis(self.delivery_timeout_ms)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The URL a record for `destination` is posted to: `url` with the placeholder replaced
    /// by the percent-encoded destination (unchecked: see [`HttpConfig::check_destination`]).
    pub fn render(&self, destination: &str) -> String {
        let encoded = utf8_percent_encode(destination, DESTINATION_ENCODE).to_string();
        self.url.replace(DESTINATION_PLACEHOLDER, &encoded)
    }

    /// Whether `topic` (the `dead_letter_topic`) is a URL of its own rather than a destination
    /// for the template: it starts with `http://` or `https://`.
    pub fn is_absolute(topic: &str) -> bool {
        topic.starts_with("http://") || topic.starts_with("https://")
    }

    /// Checks that `destination` makes a URL a receiver takes.
    ///
    /// Returns an error if it is `.` or `..` (path segments that mean another path), holds a
    /// control character, or makes a URL longer than [`MAX_URL_LEN`]. With no placeholder in
    /// `url`, every destination is good.
    pub fn check_destination(&self, destination: &str) -> Result<(), &'static str> {
        if !self.url.contains(DESTINATION_PLACEHOLDER) {
            return Ok(());
        }
        if destination == "." || destination == ".." {
            return Err("'.' and '..' are path segments that mean another path");
        }
        if destination.chars().any(char::is_control) {
            return Err("control characters are not allowed");
        }
        if self.render(destination).len() > MAX_URL_LEN {
            return Err("the URL would be longer than 8000 bytes (RFC 9110's recommended minimum)");
        }
        Ok(())
    }

    /// Checks the `dead_letter_topic` of a pipeline with this sink: an absolute `http(s)` URL
    /// of its own, or a destination for the template.
    ///
    /// Returns the problem, naming the topic.
    pub fn check_dead_letter(&self, topic: &str) -> Result<(), String> {
        if HttpConfig::is_absolute(topic) {
            return check_url(topic).map_err(|e| format!("{topic:?}: {e}"));
        }
        self.check_destination(topic)
            .map_err(|e| format!("{topic:?} is not a legal webhook destination: {e}"))
    }

    /// Checks the settings on their own (after `resolve`).
    ///
    /// Returns every problem, each with its field under `sink.`.
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        let mut problem = |field: &str, text: String| {
            problems.push(ConfigError::new(&format!("sink.{field}"), text))
        };
        if self.url.is_empty() {
            problem("url", "must not be empty".into());
        } else {
            let authority_end = self.url.find("://").map(|scheme| {
                let rest = &self.url[scheme + 3..];
                scheme + 3 + rest.find(['/', '?', '#']).unwrap_or(rest.len())
            });
            match (self.url.find(DESTINATION_PLACEHOLDER), authority_end) {
                (Some(at), Some(end)) if at < end => problem(
                    "url",
                    format!("{DESTINATION_PLACEHOLDER} may only be in the path or the query"),
                ),
                _ => {
                    if let Err(e) = check_url(&self.render("sample.events")) {
                        problem("url", e);
                    }
                }
            }
        }
        if self.header_prefix.is_empty() {
            problem(
                "header_prefix",
                "must not be empty: without a prefix a row's headers could set the request's own (Host, Authorization, Cookie, webhook-signature)".into(),
            );
        } else if let Some(own) = ["id", "event_type", "key"].iter().find_map(|name| {
            let full = format!("{}{name}", self.header_prefix);
            crate::sink::http::RESERVED_HEADERS
                .iter()
                .find(|reserved| reserved.eq_ignore_ascii_case(&full))
        }) {
            problem(
                "header_prefix",
                format!(
                    "{:?} makes the relay's own headers collide with the request's {own} header",
                    self.header_prefix
                ),
            );
        } else if reqwest::header::HeaderName::from_bytes(
            format!("{}id", self.header_prefix).as_bytes(),
        )
        .is_err()
        {
            problem(
                "header_prefix",
                format!("{:?} is not the start of an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)", self.header_prefix),
            );
        }
        if self.tls_client_cert.is_some() != self.tls_client_key.is_some() {
            problem(
                "tls_client_cert",
                "tls_client_cert and tls_client_key must be given together".into(),
            );
        }
        if self.request_timeout_ms == 0 {
            problem("request_timeout_ms", "must be greater than 0".into());
        }
        super::delivery_problems(self.max_concurrency, self.delivery_timeout_ms, &mut problem);
        problems
    }
}

/// Checks that `url` is an absolute `http` or `https` URL with a host, within
/// [`MAX_URL_LEN`]. Returns the problem, without the URL (it may hold a token).
fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("scheme {:?}: only http and https", parsed.scheme()));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("no host".into());
    }
    if url.len() > MAX_URL_LEN {
        return Err(format!("longer than {MAX_URL_LEN} bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> HttpConfig {
        HttpConfig {
            url: SinkUrl(url.into()),
            ..HttpConfig::default()
        }
    }

    #[test]
    fn the_destination_is_one_percent_encoded_segment() {
        let http = config("https://h/hooks/{destination}?d={destination}");
        assert_eq!(
            http.render("Order.events"),
            "https://h/hooks/Order.events?d=Order.events"
        );
        assert_eq!(
            http.render("a/b c&d=é"),
            "https://h/hooks/a%2Fb%20c%26d%3D%C3%A9?d=a%2Fb%20c%26d%3D%C3%A9"
        );
        assert_eq!(config("https://h/all").render("x"), "https://h/all");
    }

    #[test]
    fn destinations_that_make_no_good_url_are_refused() {
        let http = config("https://h/hooks/{destination}");
        assert!(http.check_destination("Order.events").is_ok());
        assert!(http.check_destination("with space/and slash").is_ok());
        for bad in [".", "..", "tab\there", "nul\0", &"x".repeat(MAX_URL_LEN)] {
            assert!(http.check_destination(bad).is_err(), "{bad:?}");
        }
        // Without the placeholder the destination is not in the URL.
        assert!(config("https://h/all").check_destination("..").is_ok());
    }

    #[test]
    fn dead_letter_is_an_absolute_url_or_a_destination() {
        let http = config("https://h/hooks/{destination}");
        assert!(http.check_dead_letter("https://other/dead").is_ok());
        assert!(http.check_dead_letter("relay.dead-letter").is_ok());
        assert!(http
            .check_dead_letter("https://")
            .unwrap_err()
            .contains("https://"));
        assert!(http.check_dead_letter("..").is_err());
    }

    #[test]
    fn every_bad_setting_names_its_field() {
        let fields = |http: HttpConfig| -> Vec<String> {
            http.problems().into_iter().map(|p| p.field).collect()
        };
        assert!(fields(config("https://h/hooks/{destination}")).is_empty());
        assert!(fields(config("http://127.0.0.1:8080/all")).is_empty());
        assert_eq!(fields(config("")), ["sink.url"]);
        assert_eq!(fields(config("ftp://h/{destination}")), ["sink.url"]);
        assert_eq!(fields(config("not a url")), ["sink.url"]);
        assert_eq!(fields(config("https://{destination}.h/")), ["sink.url"]);
        let mut http = config("https://h/");
        http.header_prefix = String::new();
        assert_eq!(fields(http), ["sink.header_prefix"], "an empty prefix");
        let mut http = config("https://h/");
        http.header_prefix = "Webhook-".into();
        assert_eq!(
            fields(http),
            ["sink.header_prefix"],
            "webhook-id is the request's own"
        );
        let mut http = config("https://h/");
        http.header_prefix = "bad prefix ".into();
        http.tls_client_cert = Some("c.pem".into());
        http.request_timeout_ms = 0;
        http.max_concurrency = 0;
        http.delivery_timeout_ms = 0;
        assert_eq!(
            fields(http),
            [
                "sink.header_prefix",
                "sink.tls_client_cert",
                "sink.request_timeout_ms",
                "sink.max_concurrency",
                "sink.delivery_timeout_ms"
            ]
        );
    }

    #[test]
    fn debug_hides_the_secret() {
        let mut http = config("https://u:pw@h/");
        http.secret = Secret("whsec_abc".into());
        let debug = format!("{http:?}");
        assert!(!debug.contains("abc") && !debug.contains("pw"), "{debug}");
    }
}
