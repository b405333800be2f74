//! The RabbitMQ sink: one persistent message per record, each on a confirm-mode channel of its
//! own while it waits for its confirm (lapin, on tokio).
//!
//! Each record is `basic.publish` to the configured `exchange` (`""`: the default exchange)
//! with `mandatory` set, the routing key being the routed destination
//! (`<aggregate_type>.events` by default), and:
//! - the body: the record value (empty for a tombstone, which also has no `content_type`);
//! - properties: `delivery_mode` 2 (persistent), `message_id` = the event id, `content_type`
//!   as configured (`application/json` by default; with `value_format = "cloudevents"` the
//!   record's `content-type` header instead, which is then not a header: `datacontenttype`
//!   in binary mode, the JSON event format's media type in structured mode, as the CloudEvents
//!   AMQP binding says), `timestamp` = the commit time (seconds);
//! - headers (an AMQP field table, so unordered): each record header as a long string (a null
//!   value as void, a name given twice as an array of its values), then `key` = the aggregate
//!   id (absent for a null key). A record header whose name the relay or RabbitMQ reads as its
//!   own is written with a `header.` prefix: `key`, `CC` and `BCC` (sender-selected routing:
//!   a row would choose queues), and names starting with `x-` (`x-delay`, ...).
//!
//! Acknowledged means the server's publisher confirm (`basic.ack`): the message was routed and,
//! being persistent, written to disk by every durable queue that took it (for quorum queues,
//! by a majority of their members). A `basic.nack` is retried. A message no queue took comes
//! back (`basic.return`, then its ack): a refusal naming exchange and routing key, never a
//! silent drop. A closed connection is broken: lapin does not reconnect, the next session
//! connects again; a channel the server closed (say, the exchange was deleted) is opened again
//! and the record retried, unless the server closed it with `PRECONDITION_FAILED`, its answer
//! to a message over its `max_message_size`: a too-large refusal.
//!
//! Why a channel per message in flight: lapin hands a `basic.return` to
//! whichever confirm of the channel it resolves next, and RabbitMQ acknowledges several
//! messages with one `multiple` ack, so with several messages in flight on one channel a
//! return can be taken for another message's (an unroutable event counted as delivered, a
//! delivered one refused). With one, the return, and the server closing the channel, are that
//! message's own. The channels are kept and reused; there are at most `max_concurrency` (the
//! ordered sink's limit on publishes at once).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ErrorKind, ExchangeKind};

use tracing::warn;

use super::ordered::{PublishError, Publisher};
use super::{ConnectError, Record};
use crate::config::sink::MAX_ROUTING_KEY_BYTES;
use crate::config::{redact_url, RabbitMqConfig};

/// How long one message may wait for its confirm before the attempt counts as failed (and is
/// retried): a server under a memory or disk alarm blocks publishers for as long as it lasts.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// The header the aggregate id goes in; a record header of that name gets a `header.` prefix.
pub const KEY_HEADER: &str = "key";

/// A RabbitMQ connection publishing records as persistent messages with confirms.
pub struct RabbitMqPublisher {
    connection: Arc<Connection>,
    /// Confirm-mode channels with no message in flight.
    channels: Arc<Channels>,
    exchange: String,
    /// `None`: no `content_type`.
    content_type: Option<ShortString>,
    /// `value_format = "cloudevents"`: a record's `content-type` header is the `content_type`.
    cloudevents: bool,
    max_message_bytes: usize,
    /// The server without credentials, for errors.
    server: String,
}

impl RabbitMqPublisher {
    /// Connects to `config.url`, authenticates, checks that `config.exchange` exists (a
    /// passive declare; the default exchange always does) and opens a channel in confirm mode.
    ///
    /// With `cloudevents` (`value_format = "cloudevents"`), a record's `content-type` header is
    /// its message's `content_type` property (see the module docs).
    ///
    /// Returns a retryable [`ConnectError`] if the server cannot be reached, a permanent one if
    /// the URL is malformed, the credentials or the vhost are refused, or the exchange does not
    /// exist.
    pub async fn connect(config: &RabbitMqConfig, cloudevents: bool) -> Result<Self, ConnectError> {
        let server = redact_url(&config.url);
        let error = |retryable: bool, reason: String| ConnectError {
            kind: "rabbitmq",
            server: server.clone(),
            retryable,
            reason,
        };
        let properties = ConnectionProperties::default()
            .with_connection_name("outbox-relay".into())
            .with_executor(tokio_executor_trait::Tokio::current())
            .with_reactor(tokio_reactor_trait::Tokio);
        let mut uri: AMQPUri = config.url.parse().map_err(|_| {
            error(
                false,
                "sink.url does not parse as amqp[s]://[user:password@]host[:port][/vhost]".into(),
            )
        })?;
        if let Some(password) = &config.password {
            uri.authority.userinfo.password = password.0.clone();
        }
        let connection = Connection::connect_uri(uri, properties)
            .await
            .map_err(|e| error(connect_retryable(&e), e.to_string()))?;
        // One channel per message awaiting its confirm (module docs); 0: no limit.
        let channel_max = usize::from(connection.configuration().channel_max());
        if channel_max != 0 && config.max_concurrency > channel_max {
            warn!(%server, max_concurrency = config.max_concurrency, channel_max, "sink.max_concurrency is above the server's channel_max: publishes beyond it fail to open a channel and are retried; lower max_concurrency or raise channel_max");
        }
        let channel = open_channel(&connection)
            .await
            .map_err(|e| error(true, format!("opening a channel: {e}")))?;
        if !config.exchange.is_empty() {
            channel
                .exchange_declare(
                    &config.exchange,
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        passive: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    error(
                        false,
                        format!(
                            "exchange {:?} (setting sink.exchange): {e} (the operator declares it; the relay does not)",
                            config.exchange
                        ),
                    )
                })?;
        }
        Ok(RabbitMqPublisher {
            connection: Arc::new(connection),
            channels: Arc::new(Channels::with(channel)),
            exchange: config.exchange.clone(),
            content_type: (!config.content_type.is_empty())
                .then(|| config.content_type.as_str().into()),
            cloudevents,
            max_message_bytes: config.max_message_bytes,
            server,
        })
    }
}

/// Whether connecting again may succeed: not after the server refused the login
/// (`ACCESS_REFUSED`) or the vhost (`NOT_ALLOWED`), nor with another protocol version; yes
/// for anything about reaching the server (refused, reset, closed while it shuts down).
fn connect_retryable(e: &lapin::Error) -> bool {
    match e.kind() {
        ErrorKind::ProtocolError(amqp) => !matches!(
            amqp.kind(),
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
                | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED)
        ),
        ErrorKind::InvalidProtocolVersion(_) => false,
        _ => true,
    }
}

/// Confirm-mode channels of one connection with no message in flight (see the module docs).
struct Channels {
    idle: std::sync::Mutex<Vec<Channel>>,
}

impl Channels {
    fn with(channel: Channel) -> Channels {
        Channels {
            idle: std::sync::Mutex::new(vec![channel]),
        }
    }

    /// An idle channel that is still open, if there is one (closed ones are dropped).
    fn take(&self) -> Option<Channel> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(channel) = idle.pop() {
            if channel.status().connected() {
                return Some(channel);
            }
        }
        None
    }

    /// `channel`, its message confirmed, back for the next one.
    fn give_back(&self, channel: Channel) {
        if channel.status().connected() {
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(channel);
        }
    }
}

/// A channel of `connection` in confirm mode.
async fn open_channel(connection: &Connection) -> lapin::Result<Channel> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

impl Drop for RabbitMqPublisher {
    fn drop(&mut self) {
        // lapin keeps a connection open until it is closed: close it (the session ended).
        let connection = Arc::clone(&self.connection);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = connection.close(200, "outbox-relay session ended").await;
            });
        }
    }
}

impl Publisher for RabbitMqPublisher {
    fn publish(&self, record: &Record) -> BoxFuture<'static, Result<(), PublishError>> {
        let prepared = message(
            record,
            self.content_type.as_ref(),
            self.cloudevents,
            self.max_message_bytes,
        )
        .map_err(|e| PublishError {
            reason: format!("{}: {}", self.server, e.reason),
            ..e
        });
        let (connection, channels) = (Arc::clone(&self.connection), Arc::clone(&self.channels));
        let (exchange, server) = (self.exchange.clone(), self.server.clone());
        let routing_key = record.topic.clone();
        let body = record.value.clone().unwrap_or_default();
        Box::pin(async move {
            let properties = prepared?;
            let where_to =
                || format!("{server}: exchange {exchange:?}, routing key {routing_key:?}");
            let channel = match channels.take() {
                Some(channel) => channel,
                None => {
                    if !connection.status().connected() {
                        return Err(PublishError::broken(format!(
                            "{server}: the connection is closed"
                        )));
                    }
                    tokio::time::timeout(CONFIRM_TIMEOUT, open_channel(&connection))
                        .await
                        .map_err(|_| {
                            PublishError::retry(format!(
                                "{server}: no channel opened within {} s",
                                CONFIRM_TIMEOUT.as_secs()
                            ))
                        })?
                        .map_err(|e| {
                            lost(&connection, format!("{server}: opening a channel: {e}"))
                        })?
                }
            };
            let publishing = async {
                channel
                    .basic_publish(
                        &exchange,
                        &routing_key,
                        BasicPublishOptions {
                            mandatory: true,
                            immediate: false,
                        },
                        &body,
                        properties,
                    )
                    .await?
                    .await
            };
            match tokio::time::timeout(CONFIRM_TIMEOUT, publishing).await {
                Ok(Ok(confirmation)) => {
                    channels.give_back(channel);
                    outcome(confirmation, &where_to())
                }
                Ok(Err(e)) => {
                    discard(channel);
                    Err(failed(&connection, &e, &where_to()))
                }
                Err(_) => {
                    // Its confirm may still come, and would be taken for the next message's.
                    discard(channel);
                    Err(PublishError::retry(format!(
                        "{}: no publisher confirm within {} s",
                        where_to(),
                        CONFIRM_TIMEOUT.as_secs()
                    )))
                }
            }
        })
    }
}

/// Closes `channel` if it is still open: a message of unknown fate was on it, whose confirm
/// or return could be taken for the next message's.
fn discard(channel: Channel) {
    if channel.status().connected() {
        tokio::spawn(async move {
            let _ = channel
                .close(200, "a message of unknown fate was on it")
                .await;
        });
    }
}

/// A publish or confirm that failed. The server closing the channel with
/// `PRECONDITION_FAILED` is about the one message on it: a refusal, too large when it says so
/// (RabbitMQ's "message size N is larger than configured max size M", its answer to a message
/// over `max_message_size`). Otherwise as [`lost`].
fn failed(connection: &Connection, e: &lapin::Error, where_to: &str) -> PublishError {
    let reason = format!("{where_to}: {e}");
    match e.kind() {
        ErrorKind::ProtocolError(amqp)
            if amqp.kind() == &AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) =>
        {
            if amqp.get_message().as_str().contains("larger than") {
                PublishError::too_large(reason)
            } else {
                PublishError::refused(reason)
            }
        }
        _ => lost(connection, reason),
    }
}

/// A failed publish or confirm: broken if the connection is gone, else retryable (the next
/// attempt takes another channel).
fn lost(connection: &Connection, reason: String) -> PublishError {
    if connection.status().connected() {
        PublishError::retry(reason)
    } else {
        PublishError::broken(reason)
    }
}

/// What a confirm says about the message: acknowledged, returned (refused) or nacked (retried).
fn outcome(confirmation: Confirmation, where_to: &str) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
            Err(PublishError::refused(format!(
                "{where_to}: returned unroutable ({} {}): no queue is bound for it",
                returned.reply_code, returned.reply_text
            )))
        }
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Nack(None) => Err(PublishError::retry(format!(
            "{where_to}: the server nacked the message (basic.nack)"
        ))),
        Confirmation::NotRequested => Err(PublishError::broken(format!(
            "{where_to}: the channel is not in confirm mode"
        ))),
    }
}

/// The properties of `record`'s message (see the module docs), or the refusal saying why it
/// cannot be one: larger than `max_message_bytes` (too large), a routing key, event id,
/// header name or (with `cloudevents`) content type over AMQP's 255 bytes.
fn message(
    record: &Record,
    content_type: Option<&ShortString>,
    cloudevents: bool,
    max_message_bytes: usize,
) -> Result<BasicProperties, PublishError> {
    if record.size() > max_message_bytes {
        return Err(PublishError::too_large(format!(
            "a message of {} bytes is larger than sink.max_message_bytes ({max_message_bytes})",
            record.size()
        )));
    }
    let short = |what: &str, text: &str| {
        if text.len() > MAX_ROUTING_KEY_BYTES {
            Err(PublishError::refused(format!(
                "{what} is longer than {MAX_ROUTING_KEY_BYTES} bytes (AMQP's short string)"
            )))
        } else {
            Ok(ShortString::from(text))
        }
    };
    short("the routing key", &record.topic)?;
    let mut headers = FieldTable::default();
    let mut declared = None;
    for (name, value) in &record.headers {
        if cloudevents && name == "content-type" {
            let text = String::from_utf8_lossy(value.as_deref().unwrap_or_default());
            declared = Some(short("the content type", &text)?);
            continue;
        }
        let name = if reserved(name) {
            format!("header.{name}")
        } else {
            name.to_string()
        };
        let value = match value {
            Some(bytes) => AMQPValue::LongString(LongString::from(bytes.to_vec())),
            None => AMQPValue::Void,
        };
        let name = short(&format!("header {name:?}"), &name)?;
        add_header(&mut headers, name, value);
    }
    if let Some(key) = &record.key {
        headers.insert(
            KEY_HEADER.into(),
            AMQPValue::LongString(key.to_vec().into()),
        );
    }
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(short("the event id", &record.event_id())?)
        .with_headers(headers);
    if let Some(content_type) = declared {
        properties = properties.with_content_type(content_type);
    } else if let (Some(content_type), Some(_)) = (content_type, &record.value) {
        properties = properties.with_content_type(content_type.clone());
    }
    if let Some(ms) = record.timestamp_ms.and_then(|ms| u64::try_from(ms).ok()) {
        properties = properties.with_timestamp(ms / 1000);
    }
    Ok(properties)
}

/// Whether a record header named `name` would be read by the relay or RabbitMQ as theirs: the
/// relay's `key`; `CC` and `BCC`, which RabbitMQ takes as a list of more routing keys (a row
/// choosing queues the operator did not route to); and the `x-` names of RabbitMQ and its
/// plugins (`x-delay`, `x-death`, ...).
fn reserved(name: &str) -> bool {
    name == KEY_HEADER
        || name.eq_ignore_ascii_case("CC")
        || name.eq_ignore_ascii_case("BCC")
        || name.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("x-"))
}

/// Adds `name` = `value`; a name already there becomes an array of its values, in order.
fn add_header(headers: &mut FieldTable, name: ShortString, value: AMQPValue) {
    let merged = match headers.inner().get(name.as_str()) {
        None => value,
        Some(AMQPValue::FieldArray(values)) => {
            let mut values = values.clone();
            values.push(value);
            AMQPValue::FieldArray(values)
        }
        Some(first) => AMQPValue::FieldArray(FieldArray::from(vec![first.clone(), value])),
    };
    headers.insert(name, merged);
}

#[cfg(test)]
mod tests;
