//! Renders an event as a CloudEvent (CloudEvents 1.0.2) in the sink's protocol binding, with
//! `value_format = "cloudevents"`.
//!
//! Attributes: `specversion` `1.0`, `id` the event id, `source` (`cloudevents.source`, default
//! `/outbox-relay/<database>/<schema>.<table>`), `type` the event type (required: a NULL or
//! empty one is a bad event), `subject` the aggregate id (left out when NULL or empty), `time`
//! the record's time (the commit time, or `columns.timestamp`) in RFC 3339 with milliseconds
//! in UTC, and `datacontenttype` ([`crate::config::CloudEventsConfig::data_content_type`]),
//! left out with the data when the payload is NULL (or blank, with
//! `empty_payload = "tombstone"`).
//!
//! - Structured mode: the value is the JSON event format, members in that order, then `data`:
//!   a JSON payload as its bytes (never parsed and written again), a bytea payload as
//!   `data_base64`, any other as a JSON string. The `content-type` header (NATS:
//!   `Content-Type`) is `application/cloudevents+json; charset=UTF-8` (AMQP: the RabbitMQ sink
//!   makes it the message's `content_type` property).
//! - Binary mode: the value is the payload (as with `value_format = "payload"`; none for a
//!   NULL one: the Kafka binding's tombstone) and every attribute is a header: Kafka `ce_<name>`
//!   with the value as it is and `content-type` for `datacontenttype`; HTTP `ce-<name>` and
//!   the request's `Content-Type`; NATS `ce-<name>` including `ce-datacontenttype`. HTTP and
//!   NATS header values are percent-encoded as their bindings say (space, `"`, `%` and
//!   anything outside printable ASCII, upper-case hex); AMQP (RabbitMQ, whose headers table
//!   stands for AMQP 1.0's application-properties) `cloudEvents_<name>` with the value as it
//!   is (a string) and `content-type` for `datacontenttype`, which the sink makes the
//!   message's `content_type` property.
//!
//! The AMQP binding allows the `cloudEvents_` and `cloudEvents:` prefixes and prefers `_`:
//! JMS 2.0 property names and message selectors cannot hold `:`, so `cloudEvents_` is the
//! one JMS clients (and the AMQP consumers that read both) can read.
//!
//! Row header entries whose names these headers use (`ce_`/`ce-`/`cloudEvents_`/`cloudEvents:`
//! prefixes, `content-type`, any case) are left out in both modes: a row must not pass for an
//! attribute.

use bytes::Bytes;
use std::borrow::Cow;

use super::{render, RouteError};
use crate::config::{
    ByteaFormat, CloudEventsMode, NullPayload, PipelineConfig, Placement, SinkConfig, ValueFormat,
};
use crate::sink::Header;
use crate::source::outbox::{OutboxEvent, ValueKind};

/// The media type of the JSON event format, as the bindings' examples write it.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json; charset=UTF-8";
const SPEC_VERSION: &str = "1.0";

/// The protocol binding whose header form the attributes take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    Kafka,
    Http,
    Nats,
    Amqp,
}

/// How a pipeline's events become CloudEvents.
#[derive(Debug, Clone)]
pub(super) struct CloudEvents {
    mode: CloudEventsMode,
    source: String,
    data_content_type: Option<String>,
    binding: Binding,
}

/// A CloudEvent as a record: its value and the headers that go after `id` and `event_type`.
pub(super) struct Rendered {
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
}

impl CloudEvents {
    /// The rendering of `config`'s events, in its sink's binding (Kafka for a sink without
    /// one: [`problems`] refuses those).
    pub fn new(config: &PipelineConfig) -> Self {
        let binding = match config.sink {
            SinkConfig::Http(_) => Binding::Http,
            SinkConfig::Nats(_) => Binding::Nats,
            SinkConfig::RabbitMq(_) => Binding::Amqp,
            _ => Binding::Kafka,
        };
        CloudEvents {
            mode: config.cloudevents.mode,
            source: config
                .cloudevents
                .source
                .clone()
                .unwrap_or_else(|| default_source(config)),
            data_content_type: config.cloudevents.data_content_type.clone(),
            binding,
        }
    }

    /// Whether a row header entry named `name` would pass for one of the attribute headers.
    pub fn reserved_header(name: &str) -> bool {
        let lower = name.to_ascii_lowercase();
        ["ce_", "ce-", "cloudevents_", "cloudevents:"]
            .iter()
            .any(|prefix| lower.starts_with(prefix))
            || lower == "content-type"
    }

    /// Renders `event` at `time_ms` (Unix ms); `payload` is `None` for an event without data.
    ///
    /// Returns an error naming the event if its type is NULL or empty, an attribute is not
    /// UTF-8, a bytea is not hex, or a text payload declared JSON is not JSON.
    pub fn render(
        &self,
        event: &OutboxEvent,
        time_ms: i64,
        payload: Option<&Bytes>,
        bytea: ByteaFormat,
    ) -> Result<Rendered, RouteError> {
        let event_id = || String::from_utf8_lossy(&event.id).into_owned();
        let bad = |reason: String| RouteError::CloudEvents {
            event_id: event_id(),
            reason,
        };
        let text = |bytes: &[u8], what: &str| {
            std::str::from_utf8(bytes)
                .map(str::to_owned)
                .map_err(|_| bad(format!("the {what} is not UTF-8")))
        };
        let id = text(&event.id, "event id")?;
        if id.is_empty() {
            return Err(bad(
                "the event id is empty, and CloudEvents requires an id".into()
            ));
        }
        let kind = match event.event_type.as_deref() {
            Some(t) if !t.is_empty() => text(t, "event type")?,
            _ => {
                return Err(bad(
                    "the event type is NULL or empty, and CloudEvents requires a type".into(),
                ))
            }
        };
        let subject = match &event.aggregate_id {
            Some(key) => {
                let rendered = render::header(key, event.aggregate_id_kind, bytea)
                    .map_err(|problem| super::unrenderable(event, "aggregate_id", problem))?;
                Some(text(&rendered, "aggregate id")?).filter(|s| !s.is_empty())
            }
            None => None,
        };
        let time = rfc3339_ms(time_ms).ok_or_else(|| bad(format!("time {time_ms} ms")))?;
        let content_type = payload.map(|_| self.content_type(event.payload_kind, bytea));
        let mut attributes: Vec<(&str, &str)> = vec![
            ("specversion", SPEC_VERSION),
            ("id", &id),
            ("source", &self.source),
            ("type", &kind),
        ];
        if let Some(subject) = &subject {
            attributes.push(("subject", subject));
        }
        attributes.push(("time", &time));
        match self.mode {
            CloudEventsMode::Structured => {
                let mut out = Vec::with_capacity(256 + payload.map_or(0, Bytes::len));
                out.push(b'{');
                for (i, (name, value)) in attributes.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    push_member(&mut out, name, value);
                }
                if let (Some(payload), Some(content_type)) = (payload, &content_type) {
                    out.push(b',');
                    push_member(&mut out, "datacontenttype", content_type);
                    self.push_data(&mut out, event, payload, content_type, bytea)?;
                }
                out.push(b'}');
                let name = match self.binding {
                    Binding::Nats => "Content-Type",
                    Binding::Kafka | Binding::Http | Binding::Amqp => "content-type",
                };
                Ok(Rendered {
                    value: Some(Bytes::from(out)),
                    headers: vec![(
                        Cow::Borrowed(name),
                        Some(Bytes::from_static(STRUCTURED_CONTENT_TYPE.as_bytes())),
                    )],
                })
            }
            CloudEventsMode::Binary => {
                let mut headers: Vec<Header> = attributes
                    .iter()
                    .map(|(name, value)| self.header(name, value))
                    .collect();
                if let Some(content_type) = &content_type {
                    headers.push(match self.binding {
                        Binding::Nats => self.header("datacontenttype", content_type),
                        Binding::Kafka | Binding::Http | Binding::Amqp => (
                            Cow::Borrowed("content-type"),
                            Some(Bytes::from(self.value(content_type))),
                        ),
                    });
                }
                let value = payload
                    .map(|p| {
                        render::raw(p, event.payload_kind, bytea)
                            .map_err(|problem| super::unrenderable(event, "payload", problem))
                    })
                    .transpose()?;
                Ok(Rendered { value, headers })
            }
        }
    }

    /// The `datacontenttype` of a payload of `kind`.
    fn content_type(&self, kind: ValueKind, bytea: ByteaFormat) -> String {
        if let Some(configured) = &self.data_content_type {
            return configured.clone();
        }
        match (kind, bytea) {
            (ValueKind::Json, _) => "application/json",
            (ValueKind::Bytea, ByteaFormat::Raw) => "application/octet-stream",
            _ => "text/plain; charset=utf-8",
        }
        .to_owned()
    }

    /// Appends `,"data":...` or `,"data_base64":"..."` (see the module docs).
    fn push_data(
        &self,
        out: &mut Vec<u8>,
        event: &OutboxEvent,
        payload: &Bytes,
        content_type: &str,
        bytea: ByteaFormat,
    ) -> Result<(), RouteError> {
        let kind = event.payload_kind;
        if kind == ValueKind::Bytea && bytea == ByteaFormat::Raw {
            let bytes = render::decode_hex(payload)
                .map_err(|problem| super::unrenderable(event, "payload", problem))?;
            out.extend_from_slice(b",\"data_base64\":");
            push_string(out, &render::base64(&bytes));
        } else if kind == ValueKind::Json {
            out.extend_from_slice(b",\"data\":");
            out.extend_from_slice(payload);
        } else if is_json_media_type(content_type) {
            if serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_err() {
                return Err(RouteError::CloudEvents {
                    event_id: String::from_utf8_lossy(&event.id).into_owned(),
                    reason: format!(
                        "the payload is not JSON, and cloudevents.data_content_type is {content_type:?}"
                    ),
                });
            }
            out.extend_from_slice(b",\"data\":");
            out.extend_from_slice(payload);
        } else {
            let text = std::str::from_utf8(payload).map_err(|_| {
                super::unrenderable(event, "payload", render::Unrenderable::NotUtf8)
            })?;
            out.extend_from_slice(b",\"data\":");
            push_string(out, text);
        }
        Ok(())
    }

    /// The binary-mode header of attribute `name`.
    fn header(&self, name: &str, value: &str) -> Header {
        let prefix = match self.binding {
            Binding::Kafka => "ce_",
            Binding::Http | Binding::Nats => "ce-",
            // The binding's other prefix, `cloudEvents:`, is no JMS property name (module docs).
            Binding::Amqp => "cloudEvents_",
        };
        (
            Cow::Owned(format!("{prefix}{name}")),
            Some(Bytes::from(self.value(value))),
        )
    }

    /// A header value in the binding's form: percent-encoded for HTTP and NATS.
    fn value(&self, value: &str) -> Vec<u8> {
        match self.binding {
            Binding::Kafka | Binding::Amqp => value.as_bytes().to_vec(),
            Binding::Http | Binding::Nats => percent_encode(value).into_bytes(),
        }
    }
}

/// Checks `value_format = "cloudevents"` and its `cloudevents` options: a sink with a
/// binding, a NULL payload as the bindings render it, non-empty attributes, header
/// placements that do not pass for attribute headers.
pub(super) fn problems(config: &PipelineConfig, problem: &mut impl FnMut(&str, String)) {
    let options = &config.cloudevents;
    if config.value_format != ValueFormat::CloudEvents {
        if *options != Default::default() {
            problem(
                "cloudevents",
                "only used with value_format = \"cloudevents\"".into(),
            );
        }
        return;
    }
    match &config.sink {
        SinkConfig::Http(http) if http.header_prefix.to_ascii_lowercase().starts_with("ce-") => {
            problem(
                "sink.header_prefix",
                "must not start with \"ce-\" with value_format = \"cloudevents\": row headers would pass for attribute headers".into(),
            )
        }
        SinkConfig::Kafka | SinkConfig::Http(_) | SinkConfig::Nats(_) | SinkConfig::RabbitMq(_) => {
        }
        SinkConfig::Redis(_) => problem(
            "value_format",
            format!(
                "\"cloudevents\" is not supported with sink kind {}: the relay implements the Kafka, HTTP, NATS and AMQP (RabbitMQ) bindings",
                config.sink.kind()
            ),
        ),
    }
    if config.null_payload != NullPayload::Tombstone {
        problem(
            "null_payload",
            "with value_format = \"cloudevents\" a NULL payload is an event without data (structured mode) or a record without value (binary mode), as the bindings say; leave null_payload out".into(),
        );
    }
    match options.source.as_deref() {
        Some("") => problem("cloudevents.source", "must not be empty".into()),
        Some(source) if !is_uri_reference(source) => problem(
            "cloudevents.source",
            format!("{source:?} is not a URI-reference (RFC 3986): percent-encode spaces and other characters outside it"),
        ),
        _ => {}
    }
    match options.data_content_type.as_deref() {
        Some(media_type) if !is_media_type(media_type) => problem(
            "cloudevents.data_content_type",
            format!("{media_type:?} is not a media type (type/subtype, parameters after ';')"),
        ),
        _ => {}
    }
    for (i, placement) in config.additional_placement.iter().enumerate() {
        if placement.placement == Placement::Header
            && CloudEvents::reserved_header(placement.name())
        {
            problem(
                &format!("additional_placement[{i}].alias"),
                format!(
                    "header {:?} would pass for a CloudEvents attribute header",
                    placement.name()
                ),
            );
        }
    }
}

/// `/outbox-relay/<database>/<schema>.<table>`, each part percent-encoded as a URI path
/// segment; the database is the source's (its URL's `dbname`, else `PGDATABASE`, else the
/// user, as libpq chooses), or the pipeline name when the URL does not parse (which start-up
/// validation reports).
pub fn default_source(config: &PipelineConfig) -> String {
    let database = config
        .source_database()
        .unwrap_or_else(|| config.name.clone());
    format!(
        "/outbox-relay/{}/{}.{}",
        segment(&database),
        segment(&config.table.schema),
        segment(&config.table.name)
    )
}

/// `text` with every byte outside RFC 3986's unreserved characters and `.` percent-encoded.
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The HTTP and NATS bindings' header value encoding: space, `"`, `%` and every byte outside
/// printable ASCII as `%XY` (upper-case hex of each UTF-8 byte).
pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'"' && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether `text` has only the characters RFC 3986 allows in a URI-reference (unreserved,
/// reserved and `%`).
fn is_uri_reference(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~:/?#[]@!$&'()*+,;=%".contains(&b))
}

/// Whether `text` looks like an RFC 2046 media type: `type/subtype` of printable ASCII without
/// spaces, optionally followed by `;` and parameters without control characters.
fn is_media_type(text: &str) -> bool {
    let essence = text.split(';').next().unwrap_or("").trim();
    let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
    matches!(essence.split_once('/'), Some((t, sub)) if token(t) && token(sub))
        && !text.chars().any(char::is_control)
}

/// Whether `media_type` (parameters ignored) is JSON: `application/json`, `text/json` or a
/// `+json` suffix.
fn is_json_media_type(media_type: &str) -> bool {
    let essence = media_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
}

/// `time_ms` (Unix ms) as RFC 3339 in UTC with milliseconds: `2026-12-06T11:26:51.123Z`.
fn rfc3339_ms(time_ms: i64) -> Option<String> {
    let time = chrono::DateTime::from_timestamp_millis(time_ms)?;
    Some(time.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
}

fn push_member(out: &mut Vec<u8>, name: &str, value: &str) {
    push_string(out, name);
    out.push(b':');
    push_string(out, value);
}

fn push_string(out: &mut Vec<u8>, text: &str) {
    serde_json::to_writer(&mut *out, text).expect("writing to a Vec cannot fail");
}

#[cfg(test)]
mod tests;
