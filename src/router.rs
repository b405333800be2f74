//! Routes outbox events to Kafka records: topic, key, value, headers, timestamp, partition.
//!
//! - Topic: the template (default `${routedByValue}.events`, Debezium's
//!   `route.topic.replacement`) with the routing value: the aggregate type, or the column
//!   configured as `route.by_field` (Debezium's `route.by.field`). Case preserved by default
//!   (Kafka topic names are case-sensitive, so folding would merge distinct aggregates);
//!   `lower` and `upper` are options. With `route.topic_regex`, the routing value (after the
//!   case) must match the whole regex and the template may use its groups (`${name}`,
//!   `${1}`); `${column:<name>}` inserts a column's text. A value that makes an illegal topic
//!   name is an error, never a silent rename.
//! - Key: the aggregate id bytes; SQL NULL gives a null key.
//! - Value: the payload bytes exactly as PostgreSQL printed them, or with
//!   `value_format = "envelope"` a JSON object `{"payload":...,"<alias>":...}`; SQL NULL gives
//!   a tombstone, or a zero-byte value with `null_payload = "empty"`.
//! - Headers: `id` (the event id, as Debezium's outbox router), `event_type`, then every
//!   entry of the row's `headers` jsonb object in its order: a string as its text, any other
//!   JSON value as its JSON text, `null` as a null header value. Entries named `id` or
//!   `event_type` are left out: the relay's own headers are the ones consumers dedupe by.
//!   Header placements of `additional_placement` come last, in configuration order.
//! - Timestamp: the `columns.timestamp` column's value, else the transaction's commit time.
//! - Partition: the partition placement column's value, else chosen from the key.
//!
//! An event that fails any of these is a [`RouteError`]: the pipeline halts before
//! confirming its transaction, or publishes [`Router::dead_letter`] (`on_bad_event`).
//!
//! [`Router::new`] builds the router from a pipeline's configuration and refuses options that
//! cannot work, each problem with its field path (the checks are in `router/problems.rs`); the
//! start-up validation ([`crate::validation`]) reports them before anything connects.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use regex::Regex;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

pub use crate::config::validate_topic;
use crate::config::{
    ConfigError, ConfigErrors, NullPayload, PipelineConfig, Placement, SinkConfig, TableName,
    TopicCase, ValueFormat,
};
use crate::sink::{DeliveryError, Header, Record};
use crate::source::outbox::{ColumnValue, OutboxEvent, ValueKind};

/// Where the routing value goes in a topic template.
pub const ROUTED_BY_VALUE: &str = "${routedByValue}";
mod problems;

/// The dead-letter record's header with the reason.
pub const ERROR_HEADER: &str = "outbox_relay_error";
/// Header of a dead-letter record refused by Kafka: the topic the record was meant for.
pub const TOPIC_HEADER: &str = "outbox_relay_topic";

/// An event that cannot be routed: bad input. The pipeline stops before confirming its
/// transaction, or dead-letters it (`on_bad_event`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("event {event_id}: routing value {value:?} gives topic {topic:?}, which is not a legal {noun}: {reason}")]
    IllegalTopic {
        event_id: String,
        /// The aggregate type, or the `route.by_field` column's value.
        value: String,
        topic: String,
        /// What the sink's destinations are ([`SinkConfig::destination_noun`]).
        noun: &'static str,
        reason: &'static str,
    },
    #[error("event {event_id}: the headers column is not a JSON object: {reason}")]
    Headers { event_id: String, reason: String },
    #[error(
        "event {event_id}: routing value {value:?} does not match route.topic_regex {regex:?}"
    )]
    RegexMismatch {
        event_id: String,
        value: String,
        regex: String,
    },
    #[error("event {event_id}: column {column:?} used in route.topic_template is {problem}")]
    TemplateColumn {
        event_id: String,
        column: String,
        /// `NULL` or `missing`.
        problem: &'static str,
    },
    #[error("event {event_id}: partition column {column:?} has value {value:?}, which is not a partition number (an integer 0 to 2147483647)")]
    Partition {
        event_id: String,
        column: String,
        value: String,
    },
    #[error("event {event_id}: timestamp column {column:?} has value {value:?}, which is not a timestamp Kafka takes (ISO, e.g. 2026-11-29 23:24:30.123456+00, not before 1970)")]
    Timestamp {
        event_id: String,
        column: String,
        value: String,
    },
    #[error(
        "event {event_id}: column {column:?} is not UTF-8 text and cannot go in the JSON envelope"
    )]
    NotUtf8 { event_id: String, column: String },
}

impl RouteError {
    /// A low-cardinality name of the kind of problem, for the `reason` metric label.
    pub fn reason_label(&self) -> &'static str {
        match self {
            RouteError::IllegalTopic { .. } => "illegal_topic",
            RouteError::Headers { .. } => "headers",
            RouteError::RegexMismatch { .. } => "topic_regex",
            RouteError::TemplateColumn { .. } => "template_column",
            RouteError::Partition { .. } => "partition",
            RouteError::Timestamp { .. } => "timestamp",
            RouteError::NotUtf8 { .. } => "not_utf8",
        }
    }
}

/// A `${...}` placeholder or literal text of a topic template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part<C> {
    Literal(String),
    RoutedBy,
    /// A numbered capture group of `route.topic_regex`.
    Index(usize),
    /// A named capture group of `route.topic_regex`.
    Name(String),
    /// A column: its name when parsed, its index in [`OutboxEvent::columns`] once resolved.
    Column(C),
}

/// A parsed `route.topic_template`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part<String>>,
}

impl Template {
    /// Parses `${routedByValue}`, `${<digits>}`, `${<name>}` and `${column:<name>}`
    /// placeholders; any other text is literal.
    ///
    /// Returns an error if a `${` is not closed or a placeholder is none of these.
    pub fn parse(template: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            if start > 0 {
                parts.push(Part::Literal(rest[..start].to_owned()));
            }
            let after = &rest[start + 2..];
            let end = after.find('}').ok_or_else(|| {
                format!(
                    "unclosed ${{ at byte {}",
                    template.len() - rest.len() + start
                )
            })?;
            let name = &after[..end];
            parts.push(if name == "routedByValue" {
                Part::RoutedBy
            } else if let Some(column) = name.strip_prefix("column:") {
                if column.is_empty() {
                    return Err("${column:} needs a column name".into());
                }
                Part::Column(column.to_owned())
            } else if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
                Part::Index(name.parse().map_err(|_| format!("group number {name} is too large"))?)
            } else if name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                Part::Name(name.to_owned())
            } else {
                return Err(format!(
                    "unknown placeholder ${{{name}}}: use ${{routedByValue}}, ${{column:<name>}}, or a route.topic_regex group as ${{<name>}} or ${{<number>}}"
                ));
            });
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        Ok(Template { parts })
    }

    /// Names of the columns the template uses, in order (repeats included).
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Column(c) => Some(c.as_str()),
            _ => None,
        })
    }

    /// Checks that every group placeholder names a group of `regex`.
    ///
    /// Returns an error naming the first group that is not there (or that there is no regex).
    pub fn check_groups(&self, regex: Option<&Regex>, regex_given: bool) -> Result<(), String> {
        for part in &self.parts {
            let (found, shown) = match (part, regex) {
                (Part::Index(n), Some(r)) => (*n < r.captures_len(), n.to_string()),
                (Part::Name(name), Some(r)) => {
                    (r.capture_names().any(|c| c == Some(name)), name.clone())
                }
                (Part::Index(n), None) => (false, n.to_string()),
                (Part::Name(name), None) => (false, name.clone()),
                _ => continue,
            };
            if !found {
                return Err(if regex_given || regex.is_some() {
                    format!("${{{shown}}} is not a group of route.topic_regex")
                } else {
                    format!("${{{shown}}} needs route.topic_regex with that group")
                });
            }
        }
        Ok(())
    }

    /// The topic with `x` for every placeholder, to check the literal parts.
    pub fn sample(&self) -> String {
        self.sample_with("x")
    }

    /// The topic with `placeholder` for every placeholder: what is known of every event's
    /// topic before any event.
    pub fn sample_with(&self, placeholder: &str) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Literal(text) => text.as_str(),
                _ => placeholder,
            })
            .collect()
    }
}

/// Compiles `route.topic_regex` anchored at both ends: the whole value must match.
///
/// Returns an error with the regex crate's explanation if it does not compile.
pub fn compile_topic_regex(regex: &str) -> Result<Regex, String> {
    Regex::new(&format!("^(?:{regex})$")).map_err(|e| e.to_string())
}

/// Turns events into records.
#[derive(Debug, Clone)]
pub struct Router {
    template: Vec<Part<usize>>,
    case: TopicCase,
    /// `route.topic_regex` as configured, and compiled anchored.
    regex: Option<(String, Regex)>,
    /// The extra columns events carry ([`OutboxEvent::columns`]), in that order.
    columns: Vec<String>,
    /// Indexes into `columns`.
    timestamp: Option<usize>,
    headers: Vec<(Cow<'static, str>, usize)>,
    envelope: Vec<(String, usize)>,
    partition: Option<usize>,
    value_format: ValueFormat,
    null_payload: NullPayload,
    /// Whose rules a destination must follow.
    sink: SinkConfig,
}

/// The router of a pipeline with the default routing and record options.
impl Default for Router {
    fn default() -> Self {
        let table = TableName {
            schema: "public".into(),
            name: "outbox".into(),
        };
        Router::new(&PipelineConfig::new("default", table))
            .expect("the default configuration is valid")
    }
}

impl Router {
    /// Builds the router of a pipeline from its `route`, `columns`, `message_prefix`,
    /// `additional_placement`, `value_format`, `null_payload`, `on_bad_event` and
    /// `dead_letter_topic`.
    ///
    /// Returns every problem of these options, each with its field path (`route.topic_regex`,
    /// `additional_placement[1].placement`, ...): a template or regex that does not parse, a
    /// placeholder without its group, a template that gives no legal topic name, columns
    /// combined with `message_prefix`, a second partition placement, envelope placements
    /// without `value_format = "envelope"` or with a name used twice, and a missing or illegal
    /// dead-letter topic.
    pub fn new(config: &PipelineConfig) -> Result<Self, ConfigErrors> {
        let problems = problems::problems(config);
        if !problems.is_empty() {
            return Err(ConfigErrors(problems));
        }
        Router::build(config)
            .map_err(|problem| ConfigErrors(vec![ConfigError::new("route", problem)]))
    }

    /// [`Router::new`] once its options are known to be good.
    fn build(config: &PipelineConfig) -> Result<Self, String> {
        let (route, columns) = (&config.route, &config.columns);
        let regex = match &route.topic_regex {
            Some(text) => Some((text.clone(), compile_topic_regex(text)?)),
            None => None,
        };
        let parsed = Template::parse(&route.topic_template)?;
        parsed.check_groups(regex.as_ref().map(|(_, r)| r), regex.is_some())?;
        let mut extra: Vec<String> = Vec::new();
        let mut index = |name: &str| match extra.iter().position(|c| c == name) {
            Some(i) => i,
            None => {
                extra.push(name.to_owned());
                extra.len() - 1
            }
        };
        let template = parsed
            .parts
            .into_iter()
            .map(|p| match p {
                Part::Column(name) => Part::Column(index(&name)),
                Part::Literal(t) => Part::Literal(t),
                Part::RoutedBy => Part::RoutedBy,
                Part::Index(n) => Part::Index(n),
                Part::Name(n) => Part::Name(n),
            })
            .collect();
        let timestamp = columns.timestamp.as_deref().map(&mut index);
        let (mut headers, mut envelope, mut partition) = (Vec::new(), Vec::new(), None);
        for p in &config.additional_placement {
            let i = index(&p.field);
            match p.placement {
                Placement::Header => headers.push((Cow::Owned(p.name().to_owned()), i)),
                Placement::Envelope => envelope.push((p.name().to_owned(), i)),
                Placement::Partition => partition = Some(i),
            }
        }
        Ok(Router {
            template,
            case: route.topic_case,
            regex,
            columns: extra,
            timestamp,
            headers,
            envelope,
            partition,
            value_format: config.value_format,
            null_payload: config.null_payload,
            sink: config.sink.clone(),
        })
    }

    /// The extra columns the decoder must put in [`OutboxEvent::columns`], in that order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Routes `event`, committed at `commit_time_ms` (Unix epoch, ms).
    ///
    /// Returns an error naming the event id, the value and the reason if the routing value
    /// is empty, does not match `route.topic_regex` or does not make a legal topic name; a
    /// template column is NULL or missing; the headers column is not a JSON object; the
    /// partition or timestamp column's value is not one; or an envelope value is not UTF-8.
    pub fn route(&self, event: &OutboxEvent, commit_time_ms: i64) -> Result<Record, RouteError> {
        let event_id = || String::from_utf8_lossy(&event.id).into_owned();
        let topic = self.topic(event)?;
        let mut headers: Vec<(Cow<'static, str>, Option<Bytes>)> =
            Vec::with_capacity(2 + self.headers.len());
        headers.push((Cow::Borrowed("id"), Some(event.id.clone())));
        if let Some(event_type) = &event.event_type {
            headers.push((Cow::Borrowed("event_type"), Some(event_type.clone())));
        }
        if let Some(row_headers) = event.headers.as_deref().filter(|h| *h != b"{}") {
            let entries =
                row_headers_to_kafka(row_headers).map_err(|reason| RouteError::Headers {
                    event_id: event_id(),
                    reason,
                })?;
            headers.extend(entries);
        }
        for (name, i) in &self.headers {
            headers.push((name.clone(), column(event, *i).and_then(|c| c.text.clone())));
        }
        let mut timestamp_ms = commit_time_ms;
        if let Some(i) = self.timestamp {
            if let Some(text) = column(event, i).and_then(|c| c.text.as_deref()) {
                // Kafka refuses negative timestamps (before 1970).
                timestamp_ms = parse_timestamp_ms(text)
                    .filter(|ms| *ms >= 0)
                    .ok_or_else(|| RouteError::Timestamp {
                        event_id: event_id(),
                        column: self.columns[i].clone(),
                        value: String::from_utf8_lossy(text).into_owned(),
                    })?;
            }
        }
        let mut partition = None;
        if let Some(i) = self.partition {
            if let Some(text) = column(event, i).and_then(|c| c.text.as_deref()) {
                let value = std::str::from_utf8(text)
                    .ok()
                    .and_then(|t| t.parse::<i32>().ok());
                partition =
                    Some(
                        value
                            .filter(|p| *p >= 0)
                            .ok_or_else(|| RouteError::Partition {
                                event_id: event_id(),
                                column: self.columns[i].clone(),
                                value: String::from_utf8_lossy(text).into_owned(),
                            })?,
                    );
            }
        }
        let value = match (&event.payload, self.null_payload, self.value_format) {
            (None, NullPayload::Tombstone, _) => None,
            (None, NullPayload::Empty, _) => Some(Bytes::new()),
            (None, NullPayload::JsonNull, ValueFormat::Payload) => {
                Some(Bytes::from_static(b"null"))
            }
            (Some(payload), _, ValueFormat::Payload) => Some(payload.clone()),
            (payload, _, ValueFormat::Envelope) => Some(self.envelope(event, payload.as_ref())?),
        };
        Ok(Record {
            topic,
            key: event.aggregate_id.clone(),
            value,
            headers,
            timestamp_ms: Some(timestamp_ms),
            partition,
        })
    }

    /// The dead-letter copy of a record Kafka refused for good (`error`): its key and headers,
    /// plus `outbox_relay_error` (the reason, with the size and limit for an oversized record)
    /// and `outbox_relay_topic` (where it was going), to `topic`. The value is kept, except for
    /// a record refused as too large: the copy would be refused too, so it carries no value
    /// (the event stays readable in the outbox table by its `id` if rows are kept).
    pub fn dead_letter_refused(record: Record, error: &DeliveryError, topic: &str) -> Record {
        let mut headers = record.headers;
        headers.retain(|(name, _)| name != ERROR_HEADER && name != TOPIC_HEADER);
        headers.push((
            Cow::Borrowed(ERROR_HEADER),
            Some(Bytes::from(error.reason.clone())),
        ));
        headers.push((Cow::Borrowed(TOPIC_HEADER), Some(Bytes::from(record.topic))));
        Record {
            topic: topic.to_owned(),
            key: record.key,
            value: if error.too_large { None } else { record.value },
            headers,
            // The producer's clock: the original timestamp may be why Kafka refused it
            // (log.message.timestamp.*); it stays in the original row.
            timestamp_ms: None,
            partition: None,
        }
    }

    /// The record that carries a bad `event` to `topic` instead: the original key and raw
    /// payload, headers `id`, `event_type` (when known) and `outbox_relay_error` (`error`'s
    /// text), at the commit time.
    pub fn dead_letter(
        event: &OutboxEvent,
        error: &RouteError,
        topic: &str,
        commit_time_ms: i64,
    ) -> Record {
        let mut headers = vec![(Cow::Borrowed("id"), Some(event.id.clone()))];
        if let Some(event_type) = &event.event_type {
            headers.push((Cow::Borrowed("event_type"), Some(event_type.clone())));
        }
        headers.push((
            Cow::Borrowed(ERROR_HEADER),
            Some(Bytes::from(error.to_string())),
        ));
        Record {
            topic: topic.to_owned(),
            key: event.aggregate_id.clone(),
            value: event.payload.clone(),
            headers,
            timestamp_ms: Some(commit_time_ms),
            partition: None,
        }
    }

    fn topic(&self, event: &OutboxEvent) -> Result<String, RouteError> {
        let event_id = || String::from_utf8_lossy(&event.id).into_owned();
        let raw = event.routed_by.as_ref().unwrap_or(&event.aggregate_type);
        let value = String::from_utf8_lossy(raw);
        let cased = match self.case {
            TopicCase::Preserve => Cow::Borrowed(value.as_ref()),
            // ASCII only: Unicode folding could turn an illegal name into a legal one that
            // another aggregate already uses ("K" Kelvin sign -> "k").
            TopicCase::Lower => Cow::Owned(value.to_ascii_lowercase()),
            TopicCase::Upper => Cow::Owned(value.to_ascii_uppercase()),
        };
        let captures = match &self.regex {
            Some((text, regex)) => {
                Some(
                    regex
                        .captures(&cased)
                        .ok_or_else(|| RouteError::RegexMismatch {
                            event_id: event_id(),
                            value: value.clone().into_owned(),
                            regex: text.clone(),
                        })?,
                )
            }
            None => None,
        };
        let mut topic = String::with_capacity(64);
        for part in &self.template {
            match part {
                Part::Literal(text) => topic.push_str(text),
                Part::RoutedBy => topic.push_str(&cased),
                // Groups exist (checked at start); one that took no part in the match is empty.
                Part::Index(n) => topic.push_str(
                    captures
                        .as_ref()
                        .and_then(|c| c.get(*n))
                        .map_or("", |m| m.as_str()),
                ),
                Part::Name(name) => topic.push_str(
                    captures
                        .as_ref()
                        .and_then(|c| c.name(name))
                        .map_or("", |m| m.as_str()),
                ),
                Part::Column(i) => {
                    let problem = match column(event, *i) {
                        Some(ColumnValue {
                            text: Some(text), ..
                        }) => {
                            topic.push_str(&String::from_utf8_lossy(text));
                            continue;
                        }
                        Some(_) => "NULL",
                        None => "missing",
                    };
                    return Err(RouteError::TemplateColumn {
                        event_id: event_id(),
                        column: self.columns[*i].clone(),
                        problem,
                    });
                }
            }
        }
        let valid = if value.is_empty() {
            Err("the routing value is empty")
        } else {
            self.sink.check_destination(&topic)
        };
        if let Err(reason) = valid {
            return Err(RouteError::IllegalTopic {
                event_id: event_id(),
                value: value.into_owned(),
                topic,
                noun: self.sink.destination_noun(),
                reason,
            });
        }
        Ok(topic)
    }

    /// `{"payload":<payload>,"<alias>":<value>,...}`: JSON text as is, numbers and booleans as
    /// JSON, anything else as a JSON string.
    fn envelope(&self, event: &OutboxEvent, payload: Option<&Bytes>) -> Result<Bytes, RouteError> {
        let size = payload.map_or(0, Bytes::len)
            + 16
            + self
                .envelope
                .iter()
                .map(|(n, _)| n.len() + 32)
                .sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(b"{\"payload\":");
        match payload {
            Some(payload) => push_json(&mut out, payload, event.payload_kind).map_err(|()| {
                RouteError::NotUtf8 {
                    event_id: String::from_utf8_lossy(&event.id).into_owned(),
                    column: "payload".into(),
                }
            })?,
            None => out.extend_from_slice(b"null"),
        }
        for (name, i) in &self.envelope {
            out.push(b',');
            serde_json::to_writer(&mut out, name).expect("writing to a Vec cannot fail");
            out.push(b':');
            match column(event, *i) {
                Some(ColumnValue {
                    text: Some(text),
                    kind,
                }) => push_json(&mut out, text, *kind).map_err(|()| RouteError::NotUtf8 {
                    event_id: String::from_utf8_lossy(&event.id).into_owned(),
                    column: self.columns[*i].clone(),
                })?,
                _ => out.extend_from_slice(b"null"),
            }
        }
        out.push(b'}');
        Ok(Bytes::from(out))
    }
}

fn column(event: &OutboxEvent, index: usize) -> Option<&ColumnValue> {
    event.columns.get(index)
}

/// Appends `text` of a column of `kind` as JSON; `Err` if it must be a string and is not UTF-8.
fn push_json(out: &mut Vec<u8>, text: &[u8], kind: ValueKind) -> Result<(), ()> {
    match kind {
        ValueKind::Json => out.extend_from_slice(text),
        ValueKind::Number if is_json_number(text) => out.extend_from_slice(text),
        ValueKind::Bool if text == b"t" => out.extend_from_slice(b"true"),
        ValueKind::Bool if text == b"f" => out.extend_from_slice(b"false"),
        // Text, and numbers JSON has no form for (NaN, Infinity).
        _ => {
            let text = std::str::from_utf8(text).map_err(|_| ())?;
            serde_json::to_writer(&mut *out, text).expect("writing to a Vec cannot fail");
        }
    }
    Ok(())
}

/// Whether `text` is a JSON number: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_json_number(text: &[u8]) -> bool {
    fn digits(s: &[u8]) -> usize {
        s.iter().take_while(|b| b.is_ascii_digit()).count()
    }
    let mut s = text.strip_prefix(b"-").unwrap_or(text);
    match digits(s) {
        0 => return false,
        n if n > 1 && s[0] == b'0' => return false,
        n => s = &s[n..],
    }
    if let Some(fraction) = s.strip_prefix(b".") {
        let n = digits(fraction);
        if n == 0 {
            return false;
        }
        s = &fraction[n..];
    }
    if let Some(exponent) = s.strip_prefix(b"e").or_else(|| s.strip_prefix(b"E")) {
        let exponent = exponent
            .strip_prefix(b"+")
            .or_else(|| exponent.strip_prefix(b"-"))
            .unwrap_or(exponent);
        let n = digits(exponent);
        if n == 0 {
            return false;
        }
        s = &exponent[n..];
    }
    s.is_empty()
}

/// Parses a `timestamptz` or `timestamp` as PostgreSQL prints it with `DateStyle = ISO`
/// (`2026-11-29 23:24:30.123456+00`, offsets like `+05:30` or `-03`; a `T` separator is
/// accepted too) into Unix epoch ms; a value without an offset is UTC. `None` for anything
/// else (`infinity`, BC dates, other date styles).
pub fn parse_timestamp_ms(text: &[u8]) -> Option<i64> {
    use chrono::{DateTime, NaiveDateTime};
    let text = std::str::from_utf8(text).ok()?.trim();
    let owned;
    let text = if text.as_bytes().get(10) == Some(&b'T') {
        owned = text.replacen('T', " ", 1);
        owned.as_str()
    } else {
        text
    };
    if let Ok(t) = DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z") {
        return Some(t.timestamp_millis());
    }
    // An offset with seconds (local mean time before 1900, `+05:53:28`), which chrono does
    // not parse: parse without the seconds, then take them off.
    let offset = text
        .rfind(['+', '-'])
        .filter(|&i| i > 10)
        .map_or("", |i| &text[i..]);
    if let [_, _, seconds] = offset.split(':').collect::<Vec<_>>()[..] {
        let seconds: i64 = seconds.parse().ok().filter(|s| (0..60).contains(s))?;
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let without = &text[..text.len() - seconds_len(offset)];
        let t = DateTime::parse_from_str(without, "%Y-%m-%d %H:%M:%S%.f%#z").ok()?;
        return Some(t.timestamp_millis() - sign * seconds * 1_000);
    }
    NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

/// Length of `:SS` at the end of an offset `+HH:MM:SS`.
fn seconds_len(offset: &str) -> usize {
    offset.len() - offset.rfind(':').unwrap_or(offset.len())
}

/// Turns a jsonb object's text into headers, in the object's order.
fn row_headers_to_kafka(json: &[u8]) -> Result<Vec<Header>, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let entries = deserializer
        .deserialize_map(EntriesVisitor)
        .map_err(|e| e.to_string())?;
    deserializer.end().map_err(|e| e.to_string())?;
    let mut headers = Vec::with_capacity(entries.len());
    for (key, raw) in entries {
        if key == "id" || key == "event_type" {
            continue;
        }
        let text = raw.get();
        let value = match text.as_bytes().first() {
            Some(b'"') => Some(Bytes::from(
                serde_json::from_str::<String>(text).map_err(|e| e.to_string())?,
            )),
            _ if text == "null" => None,
            _ => Some(Bytes::copy_from_slice(text.as_bytes())),
        };
        headers.push((Cow::Owned(key), value));
    }
    Ok(headers)
}

/// A JSON object's entries in order, values as their raw JSON text.
struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, Box<RawValue>)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
            entries.push(entry);
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsn::Lsn;

    fn event(aggregate_type: &str) -> OutboxEvent {
        OutboxEvent {
            id: Bytes::from_static(b"00000000-0000-0000-0000-000000000001"),
            aggregate_type: Bytes::copy_from_slice(aggregate_type.as_bytes()),
            aggregate_id: Some(Bytes::from_static(b"42")),
            event_type: Some(Bytes::from_static(b"CreditDisbursed")),
            payload: Some(Bytes::from_static(b"{\"amount\": 1500000.10}")),
            headers: Some(Bytes::from_static(b"{}")),
            routed_by: None,
            payload_kind: ValueKind::Json,
            columns: Vec::new(),
            lsn: Lsn(1),
        }
    }

    #[test]
    fn routes_by_aggregate_type_preserving_case_and_bytes() {
        let record = Router::default().route(&event("Order"), 1234).unwrap();
        assert_eq!(record.topic, "Order.events");
        assert_eq!(record.key.as_deref(), Some(&b"42"[..]));
        assert_eq!(
            record.value.as_deref(),
            Some(&b"{\"amount\": 1500000.10}"[..])
        );
        assert_eq!(
            record.headers,
            vec![
                (
                    Cow::Borrowed("id"),
                    Some(Bytes::from_static(b"00000000-0000-0000-0000-000000000001"))
                ),
                (
                    Cow::Borrowed("event_type"),
                    Some(Bytes::from_static(b"CreditDisbursed"))
                ),
            ]
        );
        assert_eq!(record.timestamp_ms, Some(1234));
    }

    #[test]
    fn row_headers_follow_in_order_with_json_text_for_non_strings() {
        let mut e = event("Order");
        e.headers = Some(Bytes::from_static(
            br#"{"n": 12.50, "id": "spoofed", "trace": "t-\"1\" \u00e9", "none": null, "obj": {"a": [1, 2]}}"#,
        ));
        let record = Router::default().route(&e, 0).unwrap();
        let headers: Vec<(&str, Option<&[u8]>)> = record
            .headers
            .iter()
            .map(|(k, v)| (k.as_ref(), v.as_deref()))
            .collect();
        assert_eq!(
            headers,
            vec![
                ("id", Some(&b"00000000-0000-0000-0000-000000000001"[..])),
                ("event_type", Some(&b"CreditDisbursed"[..])),
                ("n", Some(&b"12.50"[..])),
                ("trace", Some("t-\"1\" é".as_bytes())),
                ("none", None),
                ("obj", Some(&br#"{"a": [1, 2]}"#[..])),
            ]
        );
    }

    #[test]
    fn headers_that_are_not_an_object_are_an_error_naming_the_event() {
        for bad in [&b"[1]"[..], b"\"x\"", b"{\"a\": ", b"{} trailing"] {
            let mut e = event("Order");
            e.headers = Some(Bytes::copy_from_slice(bad));
            let err = Router::default().route(&e, 0).unwrap_err();
            assert!(
                matches!(&err, RouteError::Headers { event_id, .. } if event_id == "00000000-0000-0000-0000-000000000001"),
                "{err}"
            );
        }
    }

    #[test]
    fn templates_case_and_route_by_field() {
        let router = |template: &str, case| {
            with(
                RouteConfig {
                    by_field: None,
                    topic_template: template.into(),
                    topic_case: case,
                    topic_regex: None,
                },
                None,
                pipeline(),
            )
        };
        assert_eq!(
            router("outbox.${routedByValue}", TopicCase::Lower)
                .route(&event("OrderLine"), 0)
                .unwrap()
                .topic,
            "outbox.orderline"
        );
        assert_eq!(
            router("${routedByValue}-v1", TopicCase::Upper)
                .route(&event("order"), 0)
                .unwrap()
                .topic,
            "ORDER-v1"
        );
        assert_eq!(
            router("all.events", TopicCase::Preserve)
                .route(&event("x"), 0)
                .unwrap()
                .topic,
            "all.events"
        );
        let mut e = event("Order");
        e.routed_by = Some(Bytes::from_static(b"tenant-7"));
        assert_eq!(
            Router::default().route(&e, 0).unwrap().topic,
            "tenant-7.events"
        );
        let kelvin = router("${routedByValue}", TopicCase::Lower).route(&event("\u{212A}unde"), 0);
        assert!(
            kelvin.is_err(),
            "a non-ASCII name must not fold into a legal one"
        );
        let mut e = event("Order");
        e.routed_by = Some(Bytes::new());
        assert!(
            matches!(
                Router::default().route(&e, 0),
                Err(RouteError::IllegalTopic { .. })
            ),
            "an empty routing value is bad input"
        );
    }

    #[test]
    fn null_payload_is_a_tombstone_and_null_id_a_null_key() {
        let mut e = event("order");
        e.payload = None;
        e.aggregate_id = None;
        let record = Router::default().route(&e, 0).unwrap();
        assert_eq!(record.value, None);
        assert_eq!(record.key, None);
    }

    #[test]
    fn illegal_topic_names_are_errors_naming_the_event() {
        for bad in ["", "has space", "ünicode", "a/b", &"x".repeat(250)] {
            let err = Router::default().route(&event(bad), 0).unwrap_err();
            assert!(
                matches!(&err, RouteError::IllegalTopic { event_id, value, .. } if event_id == "00000000-0000-0000-0000-000000000001" && value == bad)
            );
            assert!(err
                .to_string()
                .contains("00000000-0000-0000-0000-000000000001"));
        }
        assert!(validate_topic("..").is_err());
        assert!(validate_topic("a-b_c.D9").is_ok());
    }

    #[test]
    fn the_sink_kind_decides_which_topics_are_legal() {
        let mut config = pipeline();
        config.sink = crate::config::SinkConfig::Nats(Default::default());
        let nats = Router::new(&config).unwrap();
        // Legal for Kafka, not a NATS subject (an empty token), and the other way round.
        assert!(Router::default().route(&event("a..b"), 0).is_ok());
        let err = nats.route(&event("a..b"), 0).unwrap_err();
        assert!(
            err.to_string()
                .contains("not a legal NATS subject: a token is empty"),
            "{err}"
        );
        assert_eq!(
            nats.route(&event("Bestellung:ü"), 0).unwrap().topic,
            "Bestellung:ü.events"
        );
        for bad in ["a b", "*", "a.>", "$JS.API"] {
            assert!(
                matches!(
                    nats.route(&event(bad), 0),
                    Err(RouteError::IllegalTopic {
                        noun: "NATS subject",
                        ..
                    })
                ),
                "{bad:?} passed"
            );
        }
        // At start: the template's literal parts and the dead-letter subject.
        config.route.topic_template = "events.>.${routedByValue}".into();
        config.on_bad_event = crate::config::OnBadEvent::DeadLetter;
        config.dead_letter_topic = Some("dead letters".into());
        let problems = Router::new(&config).unwrap_err().0;
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            ["route.topic_template", "dead_letter_topic"],
            "{problems:?}"
        );
        assert!(
            problems[0].problem.contains("gives no legal NATS subject"),
            "{problems:?}"
        );
    }

    #[test]
    fn the_sink_kind_decides_which_destinations_are_legal() {
        let mut config = pipeline();
        config.sink = SinkConfig::Http(crate::config::HttpConfig {
            url: crate::config::SinkUrl("https://h/hooks/{destination}".into()),
            ..Default::default()
        });
        let router = Router::new(&config).unwrap();
        let record = router.route(&event("has space/ünicode"), 0).unwrap();
        assert_eq!(record.topic, "has space/ünicode.events");
        let err = router.route(&event("tab\there"), 0).unwrap_err();
        assert!(
            matches!(
                &err,
                RouteError::IllegalTopic {
                    noun: "webhook destination",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("00000000-0000-0000-0000-000000000001"),
            "{err}"
        );
        // Kafka's rules for Kafka.
        let err = Router::default().route(&event("has space"), 0).unwrap_err();
        assert!(
            err.to_string().contains("not a legal Kafka topic name"),
            "{err}"
        );
    }

    use crate::config::{AdditionalPlacement, RouteConfig};

    /// A pipeline with the default routing and record options.
    fn pipeline() -> PipelineConfig {
        PipelineConfig::test_pipeline()
    }

    /// The router of `config` with `route` and the timestamp column `timestamp`.
    fn with(route: RouteConfig, timestamp: Option<&str>, mut config: PipelineConfig) -> Router {
        config.route = route;
        config.columns.timestamp = timestamp.map(str::to_owned);
        Router::new(&config).unwrap_or_else(|e| panic!("{e}"))
    }

    fn route(template: &str, regex: Option<&str>) -> RouteConfig {
        RouteConfig {
            topic_template: template.into(),
            topic_regex: regex.map(str::to_owned),
            ..RouteConfig::default()
        }
    }

    fn placement(field: &str, placement: Placement, alias: Option<&str>) -> AdditionalPlacement {
        AdditionalPlacement {
            field: field.into(),
            placement,
            alias: alias.map(str::to_owned),
        }
    }

    /// `event` with extra column values for `router`'s columns, by name.
    fn with_columns(
        router: &Router,
        mut e: OutboxEvent,
        values: &[(&str, Option<&str>, ValueKind)],
    ) -> OutboxEvent {
        e.columns = router
            .columns()
            .iter()
            .map(|name| {
                let (_, text, kind) = values
                    .iter()
                    .find(|(n, _, _)| n == name)
                    .unwrap_or_else(|| panic!("no test value for column {name}"));
                ColumnValue {
                    text: text.map(|t| Bytes::copy_from_slice(t.as_bytes())),
                    kind: *kind,
                }
            })
            .collect();
        e
    }

    const ID: &str = "00000000-0000-0000-0000-000000000001";

    #[test]
    fn timestamp_column_sets_the_record_time_and_null_falls_back_to_the_commit_time() {
        let router = with(RouteConfig::default(), Some("created_at"), pipeline());
        assert_eq!(router.columns(), ["created_at"]);
        let cases = [
            (Some("2026-11-29 23:24:30.123456+00"), 1_795_994_670_123),
            (Some("2026-11-29 23:24:30+00"), 1_795_994_670_000),
            (Some("2026-11-30 04:54:30.5+05:30"), 1_795_994_670_500),
            (Some("2026-11-29 20:24:30.123-03"), 1_795_994_670_123),
            (Some("2026-11-29T23:24:30.123456+00:00"), 1_795_994_670_123),
            // timestamp without time zone: UTC.
            (Some("2026-11-29 23:24:30.123456"), 1_795_994_670_123),
            (Some("1970-01-01 05:53:28+05:53:28"), 0),
            (None, 42),
        ];
        for (text, expected) in cases {
            let e = with_columns(
                &router,
                event("Order"),
                &[("created_at", text, ValueKind::Text)],
            );
            assert_eq!(
                router.route(&e, 42).unwrap().timestamp_ms,
                Some(expected),
                "{text:?}"
            );
        }
        for bad in [
            "infinity",
            "2026-11-29",
            "29/11/2026 23:24:30",
            "2026-11-29 23:24:30+00 BC",
            "",
            // Kafka refuses timestamps before 1970.
            "1969-12-31 23:59:59.999+00",
        ] {
            let e = with_columns(
                &router,
                event("Order"),
                &[("created_at", Some(bad), ValueKind::Text)],
            );
            let err = router.route(&e, 42).unwrap_err();
            assert!(
                matches!(&err, RouteError::Timestamp { event_id, column, value } if event_id == ID && column == "created_at" && value == bad),
                "{err}"
            );
            assert_eq!(err.reason_label(), "timestamp");
        }
    }

    #[test]
    fn topic_regex_groups_by_name_and_number_after_the_case() {
        let router = with(
            route(
                "${domain}.${2}.events",
                Some(r"(?P<domain>[a-z]+)_(v[0-9]+)"),
            ),
            None,
            pipeline(),
        );
        assert_eq!(
            router.route(&event("billing_v2"), 0).unwrap().topic,
            "billing.v2.events"
        );
        let lower = with(
            RouteConfig {
                topic_case: TopicCase::Lower,
                ..route("${routedByValue}-${kind}", Some("(?P<kind>[a-z]+)"))
            },
            None,
            pipeline(),
        );
        assert_eq!(
            lower.route(&event("Order"), 0).unwrap().topic,
            "order-order"
        );
        // The whole value must match: the regex is anchored.
        for bad in ["billing_v2x", "billing_v2_v3", "Billing_v2"] {
            let err = router.route(&event(bad), 0).unwrap_err();
            assert!(
                matches!(&err, RouteError::RegexMismatch { event_id, value, .. } if event_id == ID && value == bad),
                "{err}"
            );
            assert!(err.to_string().contains(bad));
            assert_eq!(err.reason_label(), "topic_regex");
        }
        // A group that takes no part in the match is empty, and an empty topic is illegal.
        let optional = with(route("${1}", Some("(a)?b")), None, pipeline());
        assert!(matches!(
            optional.route(&event("b"), 0),
            Err(RouteError::IllegalTopic { .. })
        ));
        // Group placeholders need the regex and an existing group.
        let none = Router::new(&PipelineConfig {
            route: route("${x}.events", None),
            ..pipeline()
        });
        assert!(none.unwrap_err().to_string().contains("route.topic_regex"));
        let missing = Router::new(&PipelineConfig {
            route: route("${3}", Some("(a)(b)")),
            ..pipeline()
        });
        assert!(missing.unwrap_err().to_string().contains("${3}"));
    }

    #[test]
    fn column_placeholders_insert_the_column_text_and_null_or_missing_is_bad_input() {
        let router = with(
            route(
                "${column:tenant_id}.${routedByValue}.${column:tenant_id}",
                None,
            ),
            None,
            pipeline(),
        );
        assert_eq!(router.columns(), ["tenant_id"], "a column is carried once");
        let e = with_columns(
            &router,
            event("Order"),
            &[("tenant_id", Some("acme"), ValueKind::Text)],
        );
        assert_eq!(router.route(&e, 0).unwrap().topic, "acme.Order.acme");
        let e = with_columns(
            &router,
            event("Order"),
            &[("tenant_id", None, ValueKind::Text)],
        );
        let err = router.route(&e, 0).unwrap_err();
        assert_eq!(
            err,
            RouteError::TemplateColumn {
                event_id: ID.into(),
                column: "tenant_id".into(),
                problem: "NULL"
            }
        );
        assert_eq!(err.reason_label(), "template_column");
        // A logical decoding message carries no columns.
        let err = router.route(&event("Order"), 0).unwrap_err();
        assert!(
            matches!(
                err,
                RouteError::TemplateColumn {
                    problem: "missing",
                    ..
                }
            ),
            "{err}"
        );
        // A column value that makes an illegal topic is bad input like the routing value.
        let e = with_columns(
            &router,
            event("Order"),
            &[("tenant_id", Some("a b"), ValueKind::Text)],
        );
        assert!(matches!(
            router.route(&e, 0),
            Err(RouteError::IllegalTopic { .. })
        ));
    }

    #[test]
    fn template_parsing() {
        assert!(Template::parse("${routedByValue")
            .unwrap_err()
            .contains("unclosed"));
        assert!(Template::parse("${column:}").is_err());
        assert!(Template::parse("${a-b}")
            .unwrap_err()
            .contains("unknown placeholder"));
        let t = Template::parse("t.${column:c}.${routedByValue}.${g}.${1}").unwrap();
        assert_eq!(t.sample(), "t.x.x.x.x");
        assert_eq!(t.columns().collect::<Vec<_>>(), ["c"]);
    }

    #[test]
    fn header_placements_follow_the_other_headers_with_null_as_a_null_value() {
        let record = PipelineConfig {
            additional_placement: vec![
                placement("tenant_id", Placement::Header, Some("tenant")),
                placement("region", Placement::Header, None),
            ],
            ..pipeline()
        };
        let router = with(RouteConfig::default(), None, record);
        let mut e = with_columns(
            &router,
            event("Order"),
            &[
                ("tenant_id", Some("acme"), ValueKind::Text),
                ("region", None, ValueKind::Text),
            ],
        );
        e.headers = Some(Bytes::from_static(br#"{"trace": "t-1"}"#));
        let headers: Vec<(String, Option<Vec<u8>>)> = router
            .route(&e, 0)
            .unwrap()
            .headers
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v.map(|v| v.to_vec())))
            .collect();
        assert_eq!(
            headers,
            vec![
                ("id".into(), Some(ID.as_bytes().to_vec())),
                ("event_type".into(), Some(b"CreditDisbursed".to_vec())),
                ("trace".into(), Some(b"t-1".to_vec())),
                ("tenant".into(), Some(b"acme".to_vec())),
                ("region".into(), None),
            ]
        );
    }

    #[test]
    fn partition_placement_takes_a_non_negative_integer_and_null_partitions_by_key() {
        let record = PipelineConfig {
            additional_placement: vec![placement("shard", Placement::Partition, None)],
            ..pipeline()
        };
        let router = with(RouteConfig::default(), None, record);
        for (text, expected) in [(Some("3"), Some(3)), (Some("0"), Some(0)), (None, None)] {
            let e = with_columns(
                &router,
                event("Order"),
                &[("shard", text, ValueKind::Number)],
            );
            assert_eq!(router.route(&e, 0).unwrap().partition, expected);
        }
        for bad in ["-1", "1.5", "x", "2147483648", ""] {
            let e = with_columns(
                &router,
                event("Order"),
                &[("shard", Some(bad), ValueKind::Number)],
            );
            let err = router.route(&e, 0).unwrap_err();
            assert!(
                matches!(&err, RouteError::Partition { event_id, column, value } if event_id == ID && column == "shard" && value == bad),
                "{err}"
            );
            assert_eq!(err.reason_label(), "partition");
        }
        assert_eq!(
            Router::default()
                .route(&event("Order"), 0)
                .unwrap()
                .partition,
            None
        );
    }

    fn envelope_router(null_payload: NullPayload) -> Router {
        with(
            RouteConfig::default(),
            None,
            PipelineConfig {
                additional_placement: vec![
                    placement("tenant_id", Placement::Envelope, Some("tenant")),
                    placement("meta", Placement::Envelope, None),
                    placement("amount", Placement::Envelope, None),
                    placement("ratio", Placement::Envelope, None),
                    placement("active", Placement::Envelope, None),
                    placement("note", Placement::Envelope, None),
                ],
                value_format: ValueFormat::Envelope,
                null_payload,
                ..pipeline()
            },
        )
    }

    fn envelope_event(router: &Router, payload: Option<&str>, kind: ValueKind) -> OutboxEvent {
        let mut e = with_columns(
            router,
            event("Order"),
            &[
                ("tenant_id", Some("ac\"me"), ValueKind::Text),
                ("meta", Some(r#"{"a": [1, 2.50]}"#), ValueKind::Json),
                ("amount", Some("1500000.10"), ValueKind::Number),
                ("ratio", Some("NaN"), ValueKind::Number),
                ("active", Some("t"), ValueKind::Bool),
                ("note", None, ValueKind::Text),
            ],
        );
        e.payload = payload.map(|p| Bytes::copy_from_slice(p.as_bytes()));
        e.payload_kind = kind;
        e
    }

    #[test]
    fn envelope_embeds_json_verbatim_and_other_values_as_valid_json() {
        let router = envelope_router(NullPayload::Tombstone);
        let payload = r#"{"amount": 1500000.10, "s": "é"}"#;
        let value = router
            .route(&envelope_event(&router, Some(payload), ValueKind::Json), 0)
            .unwrap()
            .value
            .unwrap();
        let expected = r#"{"payload":{"amount": 1500000.10, "s": "é"},"tenant":"ac\"me","meta":{"a": [1, 2.50]},"amount":1500000.10,"ratio":"NaN","active":true,"note":null}"#;
        assert_eq!(std::str::from_utf8(&value).unwrap(), expected);
        serde_json::from_slice::<serde_json::Value>(&value).expect("valid JSON");
        // A text payload is a JSON string.
        let value = router
            .route(
                &envelope_event(&router, Some("plain \"text\""), ValueKind::Text),
                0,
            )
            .unwrap()
            .value
            .unwrap();
        assert!(
            value.starts_with(br#"{"payload":"plain \"text\"","tenant""#),
            "{value:?}"
        );
        // A NULL payload is still a tombstone.
        let record = router
            .route(&envelope_event(&router, None, ValueKind::Json), 0)
            .unwrap();
        assert_eq!(record.value, None);
        // Text that is not UTF-8 cannot be a JSON string.
        let mut e = envelope_event(&router, Some("x"), ValueKind::Text);
        e.payload = Some(Bytes::from_static(b"\xff"));
        assert!(matches!(
            router.route(&e, 0),
            Err(RouteError::NotUtf8 { column, .. }) if column == "payload"
        ));
    }

    #[test]
    fn json_numbers() {
        for good in [
            "0",
            "-1",
            "1.50",
            "1e10",
            "-0.5E-3",
            "123456789012345678901234567890",
        ] {
            assert!(is_json_number(good.as_bytes()), "{good}");
        }
        for bad in [
            "",
            "-",
            "01",
            "1.",
            ".5",
            "1e",
            "NaN",
            "Infinity",
            "-Infinity",
            "1 ",
        ] {
            assert!(!is_json_number(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn null_payload_empty_gives_a_zero_byte_value_in_both_formats() {
        let mut e = event("Order");
        e.payload = None;
        let empty = with(
            RouteConfig::default(),
            None,
            PipelineConfig {
                null_payload: NullPayload::Empty,
                ..pipeline()
            },
        );
        assert_eq!(empty.route(&e, 0).unwrap().value, Some(Bytes::new()));
        let router = envelope_router(NullPayload::Empty);
        let record = router
            .route(&envelope_event(&router, None, ValueKind::Json), 0)
            .unwrap();
        assert_eq!(record.value, Some(Bytes::new()));
        assert_eq!(
            Router::default().route(&e, 0).unwrap().value,
            None,
            "default: tombstone"
        );
    }

    #[test]
    fn null_payload_json_null_keeps_the_envelope_as_debezium_does() {
        let router = envelope_router(NullPayload::JsonNull);
        let record = router
            .route(&envelope_event(&router, None, ValueKind::Json), 0)
            .unwrap();
        let value = record.value.expect("not a tombstone");
        assert!(value.starts_with(b"{\"payload\":null,"), "{value:?}");
        let parsed: serde_json::Value = serde_json::from_slice(&value).unwrap();
        assert!(parsed["payload"].is_null());
        let mut e = event("Order");
        e.payload = None;
        let plain = with(
            RouteConfig::default(),
            None,
            PipelineConfig {
                null_payload: NullPayload::JsonNull,
                ..pipeline()
            },
        );
        assert_eq!(
            plain.route(&e, 0).unwrap().value.as_deref(),
            Some(&b"null"[..])
        );
    }

    #[test]
    fn dead_letter_record_keeps_key_and_raw_payload_and_names_the_reason() {
        let e = event("has space");
        let err = Router::default().route(&e, 0).unwrap_err();
        let record = Router::dead_letter(&e, &err, "outbox.dlq", 7);
        assert_eq!(record.topic, "outbox.dlq");
        assert_eq!(record.key.as_deref(), Some(&b"42"[..]));
        assert_eq!(record.value, e.payload);
        assert_eq!(record.timestamp_ms, Some(7));
        assert_eq!(record.partition, None);
        let names: Vec<&str> = record.headers.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(names, ["id", "event_type", ERROR_HEADER]);
        assert_eq!(
            record.headers[2].1.as_deref(),
            Some(err.to_string().as_bytes())
        );
        assert!(err.to_string().contains("has space") && err.to_string().contains(ID));
        assert_eq!(err.reason_label(), "illegal_topic");
        let mut e = event("has space");
        e.event_type = None;
        e.payload = None;
        let record = Router::dead_letter(&e, &err, "outbox.dlq", 7);
        assert_eq!(record.value, None);
        assert_eq!(
            record.headers.len(),
            2,
            "no event_type header when it is NULL"
        );
    }
    #[test]
    fn a_refused_record_keeps_key_and_headers_and_drops_an_oversized_value() {
        let record = Router::default().route(&event("Order"), 7).unwrap();
        let error = |too_large| DeliveryError {
            event_id: "e".into(),
            topic: record.topic.clone(),
            reason: "Broker: Message size too large".into(),
            retryable: false,
            too_large,
            record: None,
        };
        let copy = Router::dead_letter_refused(record.clone(), &error(true), "dlq");
        assert_eq!(copy.topic, "dlq");
        assert_eq!(copy.key, record.key);
        assert_eq!(copy.value, None);
        assert_eq!(copy.timestamp_ms, None);
        let names: Vec<&str> = copy.headers.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(names, ["id", "event_type", ERROR_HEADER, TOPIC_HEADER]);
        assert_eq!(copy.headers[3].1.as_deref(), Some(record.topic.as_bytes()));
        let copy = Router::dead_letter_refused(record.clone(), &error(false), "dlq");
        assert_eq!(copy.value, record.value, "other refusals keep the value");
    }
}
