//! The NATS JetStream sink: one JetStream publish per record, acknowledged by the stream's
//! PubAck, over one client connection that reconnects by itself (async-nats).
//!
//! A message is the record's value (empty for a tombstone) on the routed destination as its
//! subject (`<aggregate_type>.events` by default), with NATS headers:
//! - each record header by its name (`id` = the event id first, then `event_type` and the
//!   others as routed), a null header value as an empty one; NATS headers are a map, so the
//!   order between names is not kept (values of one name keep theirs); a header named `key`
//!   is written as `header.key`;
//! - `key`: the aggregate id (absent for a null key);
//! - `Nats-Msg-Id`: the event id, so a stream's duplicate window (2 minutes by default) drops
//!   the copies that a crash or a lost PubAck makes (the PubAck then says `duplicate`).
//!
//! A PubAck means the stream stored the message (a replicated stream: a quorum of its
//! replicas did; file storage writes to the operating system and flushes to disk periodically,
//! so an unreplicated stream can lose the last acknowledged messages if its machine crashes).
//! No stream taking the subject ("no responders") is a
//! refusal naming the subject: streams are the operator's to create. Before sending, a record
//! is refused (never sent) if a header cannot be a NATS header (a name outside printable
//! ASCII or with `:`, a value with a line break, a name starting with `Nats-`, which steers
//! JetStream) or if it is larger than the server's `max_payload` (a server closes the
//! connection of a client that sends more).

use async_nats::jetstream::context::{
    GetStreamByNameErrorKind, PublishErrorKind, RequestErrorKind,
};
use async_nats::jetstream::{self, message::PublishMessage, ErrorCode};
use async_nats::{ConnectErrorKind, ConnectOptions, HeaderMap, ServerAddr};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::TryStreamExt;
use tracing::{info, warn};

use super::ordered::{PublishError, Publisher};
use super::{ConnectError, Record};
use crate::config::{sink::validate_subject, NatsConfig};

/// How long one publish may wait for its PubAck before the attempt counts as failed (and is
/// retried; the retry has the same `Nats-Msg-Id`, so a late first copy is dropped).
const ACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The header with the aggregate id; a record header of that name gets a `header.` prefix.
pub const KEY_HEADER: &str = "key";
/// JetStream's de-duplication header.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// Headers starting with this steer JetStream (`Nats-Expected-Stream`, `Nats-Rollup`, ...).
const RESERVED_PREFIX: &str = "Nats-";

/// JetStream API error codes of a message over a limit: the stream's `max_msg_size`, 64 KiB of
/// headers.
const TOO_LARGE: [ErrorCode; 2] = [ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM, ErrorCode(10097)];

/// JetStream API error codes that publishing again will not change.
const PERMANENT: [ErrorCode; 5] = [
    ErrorCode::JETSTREAM_NOT_ENABLED,
    ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
    ErrorCode::STREAM_NOT_MATCH,
    ErrorCode::BAD_REQUEST,
    // The stream is sealed.
    ErrorCode(10109),
];

/// A NATS connection publishing records to JetStream.
pub struct NatsPublisher {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    /// The servers without credentials, for errors.
    server: String,
}

impl NatsPublisher {
    /// Connects to one of the servers of `config.url` (the client tries them in turn and
    /// reconnects by itself later), authenticating with the URL's user, the token, the nkey or
    /// the credentials file.
    ///
    /// Returns a retryable [`ConnectError`] if no server can be reached, a permanent one if the
    /// URL or TLS setup is malformed, the credentials file cannot be read or the credentials
    /// are refused.
    pub async fn connect(config: &NatsConfig) -> Result<Self, ConnectError> {
        let server = config.shown();
        let fail = |reason: String, retryable: bool| ConnectError {
            kind: "nats",
            server: server.clone(),
            reason,
            retryable,
        };
        let servers = config.servers().map_err(|e| fail(e, false))?;
        let shown = server.clone();
        let mut options = ConnectOptions::new()
            .name("outbox-relay")
            .connection_timeout(super::any::CONNECT_TIMEOUT)
            .event_callback(move |event| {
                let server = shown.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => info!(%server, "nats connected"),
                        event => warn!(%server, %event, "nats connection"),
                    }
                }
            });
        if let Some(user) = &servers[0].user {
            let password = servers[0]
                .password
                .clone()
                .or_else(|| config.password.as_ref().map(|p| p.0.clone()));
            options = match password {
                Some(password) => options.user_and_password(user.clone(), password),
                None => options.token(user.clone()),
            };
        }
        if let Some(token) = &config.token {
            options = options.token(token.to_string());
        }
        if let Some(seed) = &config.nkey {
            options = options.nkey(seed.to_string());
        }
        if let Some(path) = &config.credentials_file {
            options = options
                .credentials_file(path)
                .await
                .map_err(|e| fail(format!("credentials_file {path:?}: {e}"), false))?;
        }
        let addresses = servers
            .iter()
            .map(|s| s.address.parse::<ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(e.to_string(), false))?;
        let client = options.connect(addresses).await.map_err(|e| {
            let retryable = matches!(
                e.kind(),
                ConnectErrorKind::Dns | ConnectErrorKind::TimedOut | ConnectErrorKind::Io
            ) && !refuses_certificate(&e);
            fail(e.to_string(), retryable)
        })?;
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(ACK_TIMEOUT)
            .build(client.clone());
        Ok(NatsPublisher {
            client,
            jetstream,
            server,
        })
    }

    /// The streams of the account, for `check`: name, subjects and duplicate window.
    ///
    /// Returns an error if JetStream does not answer (not enabled for the account, no server).
    pub async fn streams(&self) -> Result<Vec<jetstream::stream::Config>, String> {
        self.jetstream
            .streams()
            .map_ok(|info| info.config)
            .try_collect()
            .await
            .map_err(|e| format!("{}: listing JetStream streams: {e}", self.server))
    }
}

/// Whether TLS verification refused the server's certificate (an unknown issuer, a name
/// mismatch, an expired certificate): connecting again will not change it.
fn refuses_certificate(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        let rustls = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if matches!(rustls, Some(rustls::Error::InvalidCertificate(_))) {
            return true;
        }
        next = e.source();
    }
    false
}

impl Publisher for NatsPublisher {
    fn publish(&self, record: &Record) -> BoxFuture<'static, Result<(), PublishError>> {
        let max_payload = self.client.server_info().max_payload;
        let message = match message(record, max_payload) {
            Ok((payload, headers)) => PublishMessage::build().payload(payload).headers(headers),
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let jetstream = self.jetstream.clone();
        let subject = record.topic.clone();
        let server = self.server.clone();
        Box::pin(async move {
            let published = match jetstream.send_publish(subject.clone(), message).await {
                Ok(ack) => ack.await.map(|_ack| ()),
                Err(e) => Err(e),
            };
            match published {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                    let stream = jetstream.stream_by_subject(subject.as_str()).await;
                    Err(no_responders(stream, &subject, &server))
                }
                Err(e) => Err(classify(&e, &subject, &server)),
            }
        })
    }
}

/// The payload and headers of the JetStream message for `record` (see the module docs).
///
/// Returns a refusal naming the event if the subject, a header or the size cannot go to NATS.
fn message(record: &Record, max_payload: usize) -> Result<(Bytes, HeaderMap), PublishError> {
    let refuse =
        |what: String| PublishError::refused(format!("event {}: {what}", record.event_id()));
    validate_subject(&record.topic).map_err(|reason| {
        refuse(format!(
            "subject {:?} is not a NATS subject: {reason}",
            record.topic
        ))
    })?;
    let mut headers: Vec<(String, &str)> = Vec::with_capacity(record.headers.len() + 2);
    for (name, value) in &record.headers {
        let value = value.as_deref().unwrap_or_default();
        if !name.bytes().all(|b| (33..=126).contains(&b) && b != b':') {
            return Err(refuse(format!(
                "header {name:?} cannot be a NATS header name (printable ASCII without ':')"
            )));
        }
        if name.len() >= RESERVED_PREFIX.len()
            && name[..RESERVED_PREFIX.len()].eq_ignore_ascii_case(RESERVED_PREFIX)
        {
            return Err(refuse(format!(
                "header {name:?}: names starting with {RESERVED_PREFIX:?} steer JetStream and are the relay's ({MSG_ID_HEADER} is the event id)"
            )));
        }
        let name = if name == KEY_HEADER {
            format!("header.{name}")
        } else {
            name.to_string()
        };
        let value =
            header_value(value).map_err(|what| refuse(format!("header {name:?} {what}")))?;
        headers.push((name, value));
    }
    if let Some(key) = &record.key {
        let key = header_value(key).map_err(|what| refuse(format!("the key {what}")))?;
        headers.push((KEY_HEADER.into(), key));
    }
    let id = record.event_id();
    headers.push((
        MSG_ID_HEADER.into(),
        header_value(id.as_bytes()).map_err(|what| refuse(format!("the id {what}")))?,
    ));
    let payload = record.value.clone().unwrap_or_default();
    // As the protocol sends them: `NATS/1.0\r\n`, `name: value\r\n` each, `\r\n`.
    let header_bytes = 12
        + headers
            .iter()
            .map(|(n, v)| n.len() + v.len() + 4)
            .sum::<usize>();
    let size = header_bytes + payload.len();
    if size > max_payload {
        return Err(PublishError::too_large(format!(
            "event {id}: {size} bytes (headers and payload) exceed the server's max_payload of {max_payload} bytes"
        )));
    }
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(name.as_str(), value);
    }
    Ok((payload, map))
}

/// `value` as a NATS header value: UTF-8 without line breaks.
fn header_value(value: &[u8]) -> Result<&str, &'static str> {
    match std::str::from_utf8(value) {
        Ok(text) if !text.contains(['\r', '\n']) => Ok(text),
        Ok(_) => Err("has a line break, which a NATS header cannot carry"),
        Err(_) => Err("is not UTF-8, which a NATS header must be"),
    }
}

/// A publish nobody answered ("no responders") as the ordered sink's [`PublishError`], by
/// what JetStream says of the subject (`stream`: `stream_by_subject`'s answer). No stream
/// takes it: a refusal. A stream does: retried, for that stream's leader is out of reach for
/// now (its server restarting, a leader election; nats.go retries this too). The lookup
/// unanswered too, or answered that JetStream is not enabled for the account: a refusal (no
/// JetStream, nothing to wait for). Any other failed lookup (a leaderless cluster's API
/// error, a timeout): retried.
fn no_responders(
    stream: Result<String, jetstream::context::GetStreamByNameError>,
    subject: &str,
    server: &str,
) -> PublishError {
    match stream {
        Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => PublishError::refused(format!(
            "{server}: no stream takes subject {subject:?} (no responders): create a stream whose subjects cover it"
        )),
        Ok(stream) => PublishError::retry(format!(
            "{server}: stream {stream:?} takes subject {subject:?} but did not answer (no responders): its leader is out of reach"
        )),
        Err(e) if without_jetstream(&e) => PublishError::refused(format!(
            "{server}: nothing answered for subject {subject:?} (no responders) and JetStream is not enabled for this account or server ({e}): run nats-server with -js"
        )),
        Err(e) => PublishError::retry(format!(
            "{server}: nothing answered for subject {subject:?} (no responders), and looking up its stream failed: {e}"
        )),
    }
}

/// Whether a failed `stream_by_subject` says there is no JetStream: somewhere in its chain of
/// causes its API request had no responders, or the API answered JetStream is not enabled.
fn without_jetstream(e: &jetstream::context::GetStreamByNameError) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(error) = cause {
        if let Some(request) = error.downcast_ref::<jetstream::context::RequestError>() {
            if request.kind() == RequestErrorKind::NoResponders {
                return true;
            }
        }
        if let Some(api) = error.downcast_ref::<jetstream::Error>() {
            if matches!(
                api.error_code(),
                ErrorCode::JETSTREAM_NOT_ENABLED | ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
            ) {
                return true;
            }
        }
        cause = error.source();
    }
    false
}

/// A publish failure as the ordered sink's [`PublishError`]: a message larger than the
/// stream's `max_msg_size`, JetStream not enabled or a sealed stream is a refusal; a timeout,
/// a lost connection, a full stream or an unavailable cluster is retried ("no responders":
/// [`no_responders`]).
fn classify(e: &jetstream::context::PublishError, subject: &str, server: &str) -> PublishError {
    let code = std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code);
    match e.kind() {
        PublishErrorKind::TimedOut => PublishError::retry(format!(
            "{server}: no PubAck for subject {subject:?} within {} s",
            ACK_TIMEOUT.as_secs()
        )),
        _ if code.is_some_and(|code| TOO_LARGE.contains(&code)) => {
            PublishError::too_large(format!("{server}: subject {subject:?}: {e}"))
        }
        PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => {
            PublishError::refused(format!("{server}: subject {subject:?}: {e}"))
        }
        _ if code.is_some_and(|code| PERMANENT.contains(&code)) => {
            PublishError::refused(format!("{server}: subject {subject:?}: {e}"))
        }
        _ => PublishError::retry(format!("{server}: subject {subject:?}: {e}")),
    }
}

pub mod coverage;

#[cfg(test)]
mod tests;
