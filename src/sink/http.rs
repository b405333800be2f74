//! The HTTP webhook sink: one `POST` per record, to the URL template with the routed
//! destination in it ([`crate::config::HttpConfig`]), or to `dead_letter_topic` when that is
//! a URL of its own.
//!
//! The request:
//! - body: the record value as is; `Content-Type: application/json` when it is JSON,
//!   `application/octet-stream` otherwise; a tombstone has an empty body and no
//!   `Content-Type`.
//! - `webhook-id` (the event id: the same on every retry, for the receiver to drop copies),
//!   `webhook-timestamp` (the attempt's time, Unix seconds) and, with a `secret`,
//!   `webhook-signature` ([`signature`]): the Standard Webhooks headers.
//! - each record header as `<header_prefix><name>` (default `outbox-id`, `outbox-event_type`,
//!   then the row's headers, in order; a null value as an empty one), the key as
//!   `<header_prefix>key` (none for a null key; a header named `key` becomes
//!   `<header_prefix>header.key`). HTTP header names are case-insensitive: receivers see them
//!   in lower case. A header name or value HTTP cannot carry (a space in a name, a line break
//!   in a value) makes the record a refusal naming the header.
//!
//! With `value_format = "cloudevents"` (the CloudEvents HTTP binding), the record's
//! `content-type` header is the `Content-Type` (`application/cloudevents+json; charset=UTF-8`
//! in structured mode, the `datacontenttype` in binary mode) and its `ce-*` headers go as
//! they are, without `header_prefix`; with a trace column, so do `traceparent` and
//! `tracestate` (W3C Trace Context's HTTP headers). The router leaves row headers of those
//! names out.
//!
//! The answer: 2xx is the acknowledgement (the receiver took the record: how durably is its
//! business, and a receiver should answer only once it stored it). 408, 429, 5xx, a timeout
//! (`request_timeout_ms`) and connection errors are retried, after `Retry-After` seconds
//! (at most [`MAX_RETRY_AFTER`]) when the receiver sends it; 413 is a refusal as too large,
//! any other status (redirects are not followed) a refusal.

pub mod signature;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Client, StatusCode};

use self::signature::SigningKey;
use super::ordered::{PublishError, Publisher};
use super::{ConnectError, Record};
use crate::config::{redact_url_path, HttpConfig, DESTINATION_PLACEHOLDER};
// Errors with their causes: reqwest's own message is only "error sending request", the cause
// says "connection refused".
use crate::error::chain;
use crate::source::tls::{SslMode, TlsSettings};

/// The longest `Retry-After` the relay waits for before trying again (a longer one is cut to
/// this: the delivery timeout keeps running meanwhile).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// How much of a refusing answer's body goes into the error.
const BODY_IN_ERROR: usize = 200;
/// The most of an answer's body the relay reads, bytes: enough to quote a refusal. A longer
/// body is not read further (its connection is closed instead of reused), so a receiver cannot
/// make the relay buffer what it sends.
pub const MAX_BODY_READ: usize = 4096;

/// Headers of the request itself, which no record header may set, whatever `header_prefix`
/// makes of its name: the relay's own (a second `webhook-signature` would let a row sign its
/// own request), and those that change what the request is, where it goes or whom it is from.
pub(crate) const RESERVED_HEADERS: [&str; 17] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "host",
    "authorization",
    "proxy-authorization",
    "cookie",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// A client posting records to webhook URLs.
pub struct HttpPublisher {
    client: Client,
    config: Arc<HttpConfig>,
    /// `dead_letter_topic` when it is a URL of its own.
    dead_letter_url: Option<String>,
    key: Option<SigningKey>,
    standard: StandardHeaders,
}

/// Which record headers are headers of a standard the receiver reads by their own names, sent
/// without `header_prefix` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StandardHeaders {
    /// `value_format = "cloudevents"`: the router's `content-type` header is the request's
    /// `Content-Type` and its `ce-*` headers go as they are (the CloudEvents HTTP binding).
    pub cloudevents: bool,
    /// A trace column is configured: `traceparent` and `tracestate` go as they are (W3C Trace
    /// Context's HTTP headers).
    pub trace_context: bool,
}

impl StandardHeaders {
    /// The standard headers of `config`'s records.
    pub fn of(config: &crate::config::PipelineConfig) -> Self {
        let columns = &config.columns;
        StandardHeaders {
            cloudevents: config.value_format == crate::config::ValueFormat::CloudEvents,
            trace_context: columns.traceparent.is_some()
                || columns.tracestate.is_some()
                || columns.tracing_span_context.is_some(),
        }
    }
}

impl HttpPublisher {
    /// Builds the client (no request is made: a receiver that is down shows in the first
    /// records' retries). `dead_letter_topic` and `standard` ([`StandardHeaders::of`]) are the
    /// pipeline's.
    ///
    /// Returns a permanent [`ConnectError`] if the TLS files cannot be read or the secret is
    /// not a valid `whsec_` key.
    pub fn connect(
        config: &HttpConfig,
        dead_letter_topic: Option<&str>,
        standard: StandardHeaders,
    ) -> Result<Self, ConnectError> {
        let error = |reason: String| ConnectError {
            kind: "http",
            server: shown(&config.url),
            reason,
            retryable: false,
        };
        let dead_letter_url = dead_letter_topic
            .filter(|topic| HttpConfig::is_absolute(topic))
            .map(str::to_owned);
        let https = std::iter::once(&*config.url)
            .chain(dead_letter_url.as_deref())
            .any(|url| url.starts_with("https://"));
        let tls = TlsSettings {
            // The trust settings of `sslmode=verify-full`; with only http:// URLs no TLS
            // connection is ever made and no trust store is needed.
            mode: if https {
                SslMode::VerifyFull
            } else {
                SslMode::Disable
            },
            mode_given: true,
            root_cert: https.then(|| config.tls_root_cert.clone().unwrap_or("system".into())),
            client_cert: config.tls_client_cert.as_ref().map(Into::into),
            client_key: config.tls_client_key.as_ref().map(Into::into),
        };
        let mut tls = tls
            .client_config()
            .map_err(|e| error(e.replace("sslrootcert", "sink.tls_root_cert")))?;
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let client = Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(config.request_timeout())
            .connect_timeout(super::any::CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("outbox-relay/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| error(e.to_string()))?;
        let key = match config.secret.0.as_str() {
            "" => None,
            secret => Some(SigningKey::new(secret).map_err(error)?),
        };
        Ok(HttpPublisher {
            client,
            config: Arc::new(config.clone()),
            dead_letter_url,
            key,
            standard,
        })
    }

    /// For `check`: resolves the host of `url` (the template, or the dead-letter URL: the
    /// `setting` named in errors),
    /// connects (with the TLS handshake and its trust settings) and sends `OPTIONS` to `url`
    /// up to the placeholder, never a `POST`. Any answer counts: a receiver need not
    /// implement `OPTIONS`. Returns what it found (addresses, the answer's status).
    ///
    /// Returns an error naming the host if it does not resolve or accept a connection.
    pub async fn probe(&self, url: &str, setting: &str) -> Result<String, String> {
        let target = url.split(DESTINATION_PLACEHOLDER).next().unwrap_or(url);
        let parsed = reqwest::Url::parse(target).map_err(|e| format!("{}: {e}", shown(url)))?;
        let host = parsed.host_str().unwrap_or_default().to_owned();
        let port = parsed.port_or_known_default().unwrap_or(80);
        let addresses: Vec<_> = tokio::net::lookup_host((host.trim_matches(['[', ']']), port))
            .await
            .map_err(|e| format!("host {host} (from {setting}) does not resolve: {e}"))?
            .collect();
        let answer = self
            .client
            .request(reqwest::Method::OPTIONS, target)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "{host}:{port} (from {setting}): {}",
                    chain(&e.without_url())
                )
            })?;
        let first = addresses
            .first()
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        Ok(format!(
            "{host} resolves ({first}) and accepts connections; OPTIONS {} answered HTTP {} (nothing posted)",
            shown(target),
            answer.status()
        ))
    }

    /// The URL `record` goes to.
    pub fn url(&self, record: &Record) -> String {
        match &self.dead_letter_url {
            Some(url) if *url == record.topic => url.clone(),
            _ => self.config.render(&record.topic),
        }
    }

    /// The request headers for `record`, signed for `timestamp_secs` (see the module docs).
    ///
    /// Returns a refusal naming the header HTTP cannot carry.
    fn headers(&self, record: &Record, timestamp_secs: u64) -> Result<HeaderMap, PublishError> {
        let prefix = &self.config.header_prefix;
        let event_id = record.event_id();
        let mut headers = HeaderMap::with_capacity(record.headers.len() + 5);
        let mut add = |name: &str, value: &[u8]| -> Result<(), PublishError> {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                PublishError::refused(format!("header {name:?} is not a legal HTTP header name"))
            })?;
            let value = HeaderValue::from_bytes(value).map_err(|_| {
                PublishError::refused(format!(
                    "the value of header {name:?} holds a byte HTTP headers cannot carry (a control character)"
                ))
            })?;
            headers.append(header, value);
            Ok(())
        };
        let declared = record
            .headers
            .iter()
            .find(|(name, _)| self.standard.cloudevents && name == "content-type")
            .and_then(|(_, value)| value.as_ref());
        if let Some(content_type) = declared {
            add(CONTENT_TYPE.as_str(), content_type)?;
        } else if let Some(value) = &record.value {
            let json = serde_json::from_slice::<serde::de::IgnoredAny>(value).is_ok();
            let kind: &[u8] = if json {
                b"application/json"
            } else {
                b"application/octet-stream"
            };
            add(CONTENT_TYPE.as_str(), kind)?;
        }
        add("webhook-id", event_id.as_bytes())?;
        add("webhook-timestamp", timestamp_secs.to_string().as_bytes())?;
        if let Some(key) = &self.key {
            let body = record.value.as_deref().unwrap_or_default();
            add(
                "webhook-signature",
                key.sign(&event_id, timestamp_secs, body).as_bytes(),
            )?;
        }
        for (name, value) in &record.headers {
            let value = value.as_deref().unwrap_or_default();
            let trace = name == "traceparent" || name == "tracestate";
            if (self.standard.cloudevents && name.starts_with("ce-"))
                || (self.standard.trace_context && trace)
            {
                add(name, value)?;
                continue;
            }
            if self.standard.cloudevents && name == "content-type" {
                continue;
            }
            let name = match name.as_ref() {
                "key" => format!("{prefix}header.key"),
                name => format!("{prefix}{name}"),
            };
            if let Some(reserved) = RESERVED_HEADERS
                .iter()
                .find(|reserved| reserved.eq_ignore_ascii_case(&name))
            {
                return Err(PublishError::refused(format!(
                    "header {name:?} would set the request's own {reserved} header"
                )));
            }
            add(&name, value)?;
        }
        if let Some(key) = &record.key {
            add(&format!("{prefix}key"), key)?;
        }
        Ok(headers)
    }
}

impl Publisher for HttpPublisher {
    fn publish(&self, record: &Record) -> BoxFuture<'static, Result<(), PublishError>> {
        let url = self.url(record);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let headers = match self.headers(record, now.as_secs()) {
            Ok(headers) => headers,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        // A dead-letter URL of its own is the record's topic: shown as far as its host too.
        let destination = match HttpConfig::is_absolute(&record.topic) {
            true => redact_url_path(&record.topic),
            false => record.topic.clone(),
        };
        let request = self
            .client
            .post(&url)
            .headers(headers)
            .body(record.value.clone().unwrap_or_default());
        Box::pin(async move {
            let shown = format!("{} (destination {:?})", shown(&url), destination);
            let response = request.send().await.map_err(|e| {
                let e = e.without_url();
                match e.is_builder() {
                    true => PublishError::refused(format!("POST {shown}: {}", chain(&e))),
                    false => PublishError::retry(format!("POST {shown}: {}", chain(&e))),
                }
            })?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                .map(|secs| Duration::from_secs(secs).min(MAX_RETRY_AFTER));
            // Read the body so the connection can be used again (and to quote a refusal).
            let body = read_some(response).await;
            let failure = match classify(status) {
                None => return Ok(()),
                Some(failure) => failure,
            };
            let reason = format!("POST {shown}: HTTP {status}{}", quote(&body));
            if let (Some(wait), Failure::Retry) = (retry_after, failure) {
                tokio::time::sleep(wait).await;
            }
            Err(match failure {
                Failure::Retry => PublishError::retry(reason),
                Failure::TooLarge => PublishError::too_large(reason),
                Failure::Refused => PublishError::refused(reason),
            })
        })
    }
}

/// What an answer's status means, when it is not an acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Retry,
    TooLarge,
    Refused,
}

/// `None` for a 2xx (acknowledged); 408, 429 and 5xx are retried, 413 is too large, anything
/// else (1xx, 3xx, other 4xx) a refusal.
fn classify(status: StatusCode) -> Option<Failure> {
    match status.as_u16() {
        200..=299 => None,
        408 | 429 | 500..=599 => Some(Failure::Retry),
        413 => Some(Failure::TooLarge),
        _ => Some(Failure::Refused),
    }
}

/// `url` for messages: as far as its host, without its password (its path and query may hold
/// a token): `https://hooks.example.com/***`. Errors of a record name its destination beside.
fn shown(url: &str) -> String {
    redact_url_path(url)
}

/// The first [`MAX_BODY_READ`] bytes of `response`'s body (fewer if it ends sooner or fails).
async fn read_some(mut response: reqwest::Response) -> Bytes {
    let mut body = bytes::BytesMut::new();
    while body.len() < MAX_BODY_READ {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_BODY_READ - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    body.freeze()
}

/// The start of an answer's body for an error: `: "<text>"`, or nothing when empty.
fn quote(body: &Bytes) -> String {
    if body.is_empty() {
        return String::new();
    }
    let text: String = String::from_utf8_lossy(body)
        .chars()
        .filter(|c| !c.is_control())
        .take(BODY_IN_ERROR)
        .collect();
    format!(": {text:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Secret, SinkUrl};
    use crate::sink::ordered::Failure as PublishFailure;

    fn publisher(dead_letter: Option<&str>) -> HttpPublisher {
        let config = HttpConfig {
            url: SinkUrl("http://127.0.0.1:1/hooks/{destination}?token=t0ken".into()),
            secret: Secret("s3cret".into()),
            ..HttpConfig::default()
        };
        HttpPublisher::connect(&config, dead_letter, StandardHeaders::default()).unwrap()
    }

    fn record(topic: &str, value: Option<&'static [u8]>) -> Record {
        Record {
            topic: topic.into(),
            key: Some(Bytes::from_static(b"o-1")),
            value: value.map(Bytes::from_static),
            headers: vec![
                ("id".into(), Some(Bytes::from_static(b"e-1"))),
                ("event_type".into(), Some(Bytes::from_static(b"Created"))),
                ("key".into(), Some(Bytes::from_static(b"clash"))),
                ("Trace".into(), None),
            ],
            timestamp_ms: None,
            partition: None,
        }
    }

    fn names_and_values(headers: &HeaderMap) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect()
    }

    #[test]
    fn a_request_has_the_standard_webhooks_headers_then_the_records() {
        let p = publisher(None);
        let r = record("Order.events", Some(br#"{"a":1}"#));
        let headers = names_and_values(&p.headers(&r, 1614265330).unwrap());
        let signature = SigningKey::new("s3cret")
            .unwrap()
            .sign("e-1", 1614265330, br#"{"a":1}"#);
        assert_eq!(
            headers,
            [
                ("content-type", "application/json"),
                ("webhook-id", "e-1"),
                ("webhook-timestamp", "1614265330"),
                ("webhook-signature", signature.as_str()),
                ("outbox-id", "e-1"),
                ("outbox-event_type", "Created"),
                ("outbox-header.key", "clash"),
                ("outbox-trace", ""),
                ("outbox-key", "o-1"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn standard_headers_go_unprefixed_and_content_type_is_the_record_s_with_cloudevents() {
        let config = HttpConfig {
            url: SinkUrl("http://127.0.0.1:1/hooks/{destination}".into()),
            ..HttpConfig::default()
        };
        let standard = StandardHeaders {
            cloudevents: true,
            trace_context: true,
        };
        let p = HttpPublisher::connect(&config, None, standard).unwrap();
        let mut r = record("Order.events", Some(br#"{"a":1}"#));
        r.headers.truncate(2);
        r.headers.extend([
            ("ce-id".into(), Some(Bytes::from_static(b"e-1"))),
            ("ce-subject".into(), Some(Bytes::from_static(b"o%201"))),
            (
                "content-type".into(),
                Some(Bytes::from_static(b"text/plain")),
            ),
            ("traceparent".into(), Some(Bytes::from_static(b"00-ab"))),
        ]);
        assert_eq!(
            names_and_values(&p.headers(&r, 7).unwrap()),
            [
                ("content-type", "text/plain"),
                ("webhook-id", "e-1"),
                ("webhook-timestamp", "7"),
                ("outbox-id", "e-1"),
                ("outbox-event_type", "Created"),
                ("ce-id", "e-1"),
                ("ce-subject", "o%201"),
                ("traceparent", "00-ab"),
                ("outbox-key", "o-1"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        // Without cloudevents the same names are record headers like any other.
        let names = names_and_values(&publisher(None).headers(&r, 7).unwrap());
        assert!(
            names.contains(&("outbox-ce-id".into(), "e-1".into())),
            "{names:?}"
        );
        assert!(names.contains(&("content-type".into(), "application/json".into())));
        assert!(names.contains(&("outbox-traceparent".into(), "00-ab".into())));
    }

    #[test]
    fn content_type_follows_the_value_and_a_tombstone_has_none() {
        let p = publisher(None);
        let content_type = |value| {
            p.headers(&record("t", value), 0)
                .unwrap()
                .get(CONTENT_TYPE)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            content_type(Some(b"not json")).as_deref(),
            Some("application/octet-stream")
        );
        assert_eq!(
            content_type(Some(b"")).as_deref(),
            Some("application/octet-stream")
        );
        assert_eq!(content_type(None), None);
    }

    #[test]
    fn a_header_http_cannot_carry_is_a_refusal_naming_it() {
        let p = publisher(None);
        let mut r = record("t", None);
        r.headers.push(("bad name".into(), None));
        let e = p.headers(&r, 0).unwrap_err();
        assert_eq!(e.failure, PublishFailure::Refused { too_large: false });
        assert!(e.reason.contains("bad name"), "{}", e.reason);
        let mut r = record("t", None);
        r.headers
            .push(("multi".into(), Some(Bytes::from_static(b"line\nbreak"))));
        assert!(p.headers(&r, 0).unwrap_err().reason.contains("multi"));
    }

    #[test]
    fn the_dead_letter_url_is_used_as_is_and_other_topics_fill_the_template() {
        let p = publisher(Some("https://dead.example/letters"));
        assert_eq!(
            p.url(&record("https://dead.example/letters", None)),
            "https://dead.example/letters"
        );
        assert_eq!(
            p.url(&record("a b", None)),
            "http://127.0.0.1:1/hooks/a%20b?token=t0ken"
        );
        let p = publisher(Some("relay.dead-letter"));
        assert_eq!(
            p.url(&record("relay.dead-letter", None)),
            "http://127.0.0.1:1/hooks/relay.dead-letter?token=t0ken"
        );
    }

    #[test]
    fn statuses_are_acknowledgements_retries_or_refusals() {
        let code = |n| classify(StatusCode::from_u16(n).unwrap());
        for ok in [200, 201, 202, 204] {
            assert_eq!(code(ok), None, "{ok}");
        }
        for retry in [408, 429, 500, 502, 503, 504] {
            assert_eq!(code(retry), Some(Failure::Retry), "{retry}");
        }
        assert_eq!(code(413), Some(Failure::TooLarge));
        for refused in [301, 302, 400, 401, 403, 404, 410, 422] {
            assert_eq!(code(refused), Some(Failure::Refused), "{refused}");
        }
    }

    #[test]
    fn messages_show_no_path_query_or_password() {
        assert_eq!(
            shown("https://u:pw@h/hooks/T0K3N/x?token=t"),
            "https://u:***@h/***"
        );
    }

    /// A receiver that answers 400 with a body that never ends: the refusal comes at once,
    /// quoting the start of the body, with no more than [`MAX_BODY_READ`] of it read. (The
    /// whole body was read: an 800 MB one took the relay to 2.9 GB.)
    #[tokio::test]
    async fn a_refusal_s_body_is_read_only_as_far_as_it_is_quoted() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&sent);
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            let head = "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
            socket.write_all(head.as_bytes()).await.unwrap();
            let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, "x".repeat(64 * 1024));
            // 1 GiB at most, unless the client stops reading first.
            for _ in 0..16 * 1024 {
                if socket.write_all(chunk.as_bytes()).await.is_err() {
                    break;
                }
                counter.fetch_add(64 * 1024, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let config = HttpConfig {
            url: SinkUrl(format!("http://127.0.0.1:{port}/hooks/{{destination}}")),
            request_timeout_ms: 60_000,
            ..HttpConfig::default()
        };
        let publisher = HttpPublisher::connect(&config, None, StandardHeaders::default()).unwrap();
        let e = tokio::time::timeout(
            Duration::from_secs(20),
            publisher.publish(&record("t", None)),
        )
        .await
        .expect("the refusal within 20 s, not after the whole body")
        .unwrap_err();
        assert_eq!(
            e.failure,
            PublishFailure::Refused { too_large: false },
            "{e:?}"
        );
        assert!(
            e.reason.contains("HTTP 400 Bad Request: \"xxx"),
            "{}",
            e.reason
        );
        server.abort();
        let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            sent < 64 << 20,
            "{sent} bytes of the body went out: it was read on"
        );
    }

    /// A prefix such as `content-` would let a row's header `type` become a second
    /// `content-type`: a refusal, as for any name of the request's own headers.
    #[test]
    fn a_header_that_would_set_one_of_the_request_s_own_is_a_refusal() {
        let mut publisher = publisher(None);
        Arc::make_mut(&mut publisher.config).header_prefix = "content-".into();
        for name in ["Type", "length"] {
            let mut r = record("t", None);
            r.headers
                .push((name.to_owned().into(), Some(Bytes::from_static(b"x"))));
            let e = publisher.headers(&r, 1).unwrap_err();
            assert_eq!(e.failure, PublishFailure::Refused { too_large: false });
            assert!(e.reason.contains("request's own content-"), "{}", e.reason);
        }
        let mut r = record("t", None);
        r.headers.push(("other".into(), None));
        assert!(publisher.headers(&r, 1).is_ok());
    }

    #[tokio::test]
    async fn a_receiver_that_is_not_there_is_retried() {
        // Port 1 on loopback: nothing listens, the connection is refused at once.
        let e = publisher(None)
            .publish(&record("t", None))
            .await
            .unwrap_err();
        assert_eq!(e.failure, PublishFailure::Retry, "{e:?}");
        assert!(
            e.reason
                .starts_with("POST http://127.0.0.1:1/*** (destination \"t\"):"),
            "{}",
            e.reason
        );
        assert!(!e.reason.contains("t0ken"), "{}", e.reason);
    }
}
