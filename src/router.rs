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
//! - Allowed destinations: a destination that is the pipeline's dead-letter topic or a
//!   checkpoint topic (Kafka: the pipeline's `checkpoint_topic`, and the default one that
//!   relays share) is an error whatever the template; with `route.allowed_destinations`, so is
//!   one outside that list. Every row is untrusted input: without the list any row can pick
//!   any destination the template can make.
//! - Key: the aggregate id bytes (a bytea's bytes, unless `bytea_format = "hex"`); SQL NULL
//!   gives a null key.
//! - Value: the payload bytes exactly as PostgreSQL printed them (a bytea's bytes), or with
//!   `value_format = "envelope"` a JSON object `{"payload":...,"<alias>":...}`; SQL NULL gives
//!   a tombstone, or a zero-byte value with `null_payload = "empty"`. With
//!   `empty_payload = "tombstone"` an empty or blank text payload gives a tombstone too.
//! - Headers: `id` (the event id, as Debezium's outbox router), `event_type`, then every
//!   entry of the row's `headers` jsonb object in its order: a string as its text, any other
//!   JSON value as its JSON text, `null` as a null header value. Entries named `id` or
//!   `event_type` are left out: the relay's own headers are the ones consumers dedupe by;
//!   so are entries whose name starts with `outbox_relay_` ([`RESERVED_HEADER_PREFIX`]), the
//!   relay's own (dead-letter copies, exactly-once checkpoints).
//!   Header placements of `additional_placement` come last, in configuration order.
//!   Placed columns are rendered as Debezium's default converters render their type
//!   (`router/render.rs`).
//!   With `value_format = "cloudevents"` the value is a CloudEvent and its attribute headers
//!   follow `event_type` (`router/cloudevents.rs`); the `traceparent` and `tracestate` of the
//!   trace columns come last (`router/trace.rs`).
//! - Timestamp: the `columns.timestamp` column's value, else the transaction's commit time.
//! - Partition: the partition placement column's value, else chosen from the key.
//!
//! An event that fails any of these is a [`RouteError`]: the pipeline halts before
//! confirming its transaction, or publishes [`Router::dead_letter`] (`on_bad_event`); a record
//! the sink refuses for good becomes [`Router::dead_letter_refused`] (`router/dead_letter.rs`:
//! a copy that is always deliverable, whatever the row held).
//!
//! [`Router::new`] builds the router from a pipeline's configuration and refuses options that
//! cannot work, each problem with its field path (the checks are in `router/problems.rs`); the
//! start-up validation ([`crate::validation`]) reports them before anything connects.

use std::borrow::Cow;

use bytes::Bytes;
use regex::Regex;

pub use crate::config::validate_topic;
use crate::config::{
    matches_destination, ByteaFormat, ConfigError, ConfigErrors, EmptyPayload, JsonPayload,
    MissingPlacementColumn, NullPayload, PipelineConfig, Placement, SinkConfig, TableName,
    TopicCase, ValueFormat,
};
use crate::sink::Record;
use crate::source::outbox::{ColumnValue, OutboxEvent, ValueKind};

/// Where the routing value goes in a topic template.
pub const ROUTED_BY_VALUE: &str = "${routedByValue}";
/// Row header entries whose name starts with this are left out of records: such headers are
/// the relay's own (dead-letter copies, exactly-once checkpoint marks), and a row must not
/// pass for one.
pub const RESERVED_HEADER_PREFIX: &str = "outbox_relay_";
/// The setting that lists where rows may route to, as named in errors.
pub const ALLOWED_DESTINATIONS: &str = "route.allowed_destinations";
mod cloudevents;
mod dead_letter;
mod destinations;
mod error;
mod headers;
mod problems;
mod render;
mod template;
mod trace;

pub use cloudevents::STRUCTURED_CONTENT_TYPE;
pub use destinations::reserved_destinations;
pub use error::RouteError;
pub use template::{compile_topic_regex, Template};

pub use dead_letter::{ERROR_HEADER, TOPIC_HEADER};
use error::{refused, unrenderable};
use headers::row_headers_to_kafka;
use template::{Part, ROUTED_BY_GROUP};
pub use trace::{is_valid_traceparent, java_properties};

/// Turns events into records.
#[derive(Debug, Clone)]
pub struct Router {
    template: Vec<Part<usize>>,
    case: TopicCase,
    /// `route.topic_regex` as configured, and compiled anchored.
    regex: Option<(String, Regex)>,
    /// The extra columns events carry ([`OutboxEvent::columns`]), in that order.
    columns: Vec<String>,
    /// Those of `columns` the table may lack: placement-only ones with
    /// `missing_placement_column = "ignore"`.
    optional: Vec<String>,
    /// Indexes into `columns`.
    timestamp: Option<usize>,
    headers: Vec<(Cow<'static, str>, usize)>,
    envelope: Vec<(String, usize)>,
    partition: Option<usize>,
    value_format: ValueFormat,
    null_payload: NullPayload,
    empty_payload: EmptyPayload,
    bytea: ByteaFormat,
    json_payload: JsonPayload,
    /// What `value_format = "cloudevents"` renders.
    cloudevents: cloudevents::CloudEvents,
    trace: trace::TraceColumns,
    /// Whose rules a destination must follow.
    sink: SinkConfig,
    /// `route.allowed_destinations`: names and `*` patterns; `None`: any destination.
    allowed: Option<Vec<String>>,
    /// Destinations no row routes to, with the field that names them.
    reserved: Vec<(String, &'static str)>,
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
    /// without `value_format = "envelope"` or with a name used twice, a missing or illegal
    /// dead-letter topic, CloudEvents options a sink cannot carry (`router/cloudevents.rs`)
    /// and empty trace columns (`router/trace.rs`).
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
        // Routing, the timestamp and the trace context need their columns whatever the
        // placements may lack.
        let needed: Vec<String> = parsed
            .columns()
            .chain(columns.timestamp.as_deref())
            .chain(columns.traceparent.as_deref())
            .chain(columns.tracestate.as_deref())
            .chain(columns.tracing_span_context.as_deref())
            .map(str::to_owned)
            .collect();
        let mut extra: Vec<String> = Vec::new();
        let mut index = |name: &str| match extra.iter().position(|c| c == name) {
            Some(i) => i,
            None => {
                extra.push(name.to_owned());
                extra.len() - 1
            }
        };
        // Debezium's replacement takes the regex's own `routedByValue` group if it has one
        // (its default regex is `(?<routedByValue>.*)`: the whole value): that group then, empty
        // when it took no part in the match, like any group.
        let routed_by_group = regex
            .as_ref()
            .is_some_and(|(_, r)| r.capture_names().any(|n| n == Some(ROUTED_BY_GROUP)));
        let template = parsed
            .parts
            .into_iter()
            .map(|p| match p {
                Part::Column(name) => Part::Column(index(&name)),
                Part::Literal(t) => Part::Literal(t),
                Part::RoutedBy if routed_by_group => Part::Name(ROUTED_BY_GROUP.to_owned()),
                Part::RoutedBy => Part::RoutedBy,
                Part::Index(n) => Part::Index(n),
                Part::Name(n) => Part::Name(n),
            })
            .collect();
        let timestamp = columns.timestamp.as_deref().map(&mut index);
        let mut trace_column =
            |name: &Option<String>| name.as_deref().map(|n| (index(n), n.to_owned()));
        let trace = trace::TraceColumns {
            traceparent: trace_column(&columns.traceparent),
            tracestate: trace_column(&columns.tracestate),
            span_context: trace_column(&columns.tracing_span_context),
        };
        let (mut headers, mut envelope, mut partition) = (Vec::new(), Vec::new(), None);
        for p in &config.additional_placement {
            let i = index(&p.field);
            match p.placement {
                Placement::Header => headers.push((Cow::Owned(p.name().to_owned()), i)),
                Placement::Envelope => envelope.push((p.name().to_owned(), i)),
                Placement::Partition => partition = Some(i),
            }
        }
        let optional = match config.missing_placement_column {
            MissingPlacementColumn::Error => Vec::new(),
            MissingPlacementColumn::Ignore => config
                .additional_placement
                .iter()
                .map(|p| p.field.clone())
                .filter(|field| !needed.contains(field))
                .collect(),
        };
        Ok(Router {
            template,
            case: route.topic_case,
            regex,
            columns: extra,
            optional,
            timestamp,
            headers,
            envelope,
            partition,
            value_format: config.value_format,
            null_payload: config.null_payload,
            empty_payload: config.empty_payload,
            bytea: config.bytea_format,
            json_payload: config.json_payload,
            cloudevents: cloudevents::CloudEvents::new(config),
            trace,
            sink: config.sink.clone(),
            allowed: route.allowed_destinations.clone(),
            reserved: reserved_destinations(config),
        })
    }

    /// The extra columns the decoder must put in [`OutboxEvent::columns`], in that order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Those of [`Router::columns`] the table may lack ([`ColumnValue::absent`]): the columns
    /// only placements use, with `missing_placement_column = "ignore"`.
    pub fn optional_columns(&self) -> Vec<String> {
        self.optional.clone()
    }

    /// Routes `event`, committed at `commit_time_ms` (Unix epoch, ms).
    ///
    /// Returns an error naming the event id, the value and the reason if the routing value
    /// is empty, does not match `route.topic_regex` or does not make a legal topic name; the
    /// topic is the dead-letter or a checkpoint topic, or not in `route.allowed_destinations`; a
    /// template column is NULL or missing; the headers column is not a JSON object; the
    /// partition or timestamp column's value is not one; an envelope value is not UTF-8; or
    /// the source refused the event ([`OutboxEvent::refused`]: too large, not UTF-8).
    pub fn route(&self, event: &OutboxEvent, commit_time_ms: i64) -> Result<Record, RouteError> {
        let event_id = || String::from_utf8_lossy(&event.id).into_owned();
        if let Some(refusal) = &event.refused {
            return Err(refused(event, refusal));
        }
        let topic = self.topic(event)?;
        let mut headers: Vec<(Cow<'static, str>, Option<Bytes>)> =
            Vec::with_capacity(2 + self.headers.len());
        headers.push((Cow::Borrowed("id"), Some(event.id.clone())));
        if let Some(event_type) = &event.event_type {
            headers.push((Cow::Borrowed("event_type"), Some(event_type.clone())));
        }
        // Where the CloudEvents attribute headers go: after the relay's own.
        let attributes_at = headers.len();
        if let Some(row_headers) = event.headers.as_deref().filter(|h| *h != b"{}") {
            let mut entries =
                row_headers_to_kafka(row_headers).map_err(|reason| RouteError::Headers {
                    event_id: event_id(),
                    reason,
                })?;
            entries.retain(|(name, _)| !self.reserved_row_header(name));
            headers.extend(entries);
        }
        for (name, i) in &self.headers {
            let value = match column(event, *i) {
                Some(ColumnValue { absent: true, .. }) => continue,
                Some(ColumnValue {
                    text: Some(text),
                    kind,
                    ..
                }) => Some(
                    render::header(text, *kind, self.bytea)
                        .map_err(|problem| unrenderable(event, &self.columns[*i], problem))?,
                ),
                _ => None,
            };
            headers.push((name.clone(), value));
        }
        headers.extend(self.trace.headers(event));
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
        // Debezium's route.tombstone.on.empty.payload: a tombstone in either value format.
        let empty = self.empty_payload == EmptyPayload::Tombstone
            && event.payload.as_deref().is_some_and(|p| is_blank(p, event));
        let value = match (event.payload.as_ref(), self.null_payload, self.value_format) {
            (payload, _, ValueFormat::CloudEvents) => {
                let data = payload.filter(|_| !empty);
                let rendered = self
                    .cloudevents
                    .render(event, timestamp_ms, data, self.bytea)?;
                headers.splice(attributes_at..attributes_at, rendered.headers);
                rendered.value
            }
            _ if empty => None,
            (None, NullPayload::Tombstone, _) => None,
            (None, NullPayload::Empty, _) => Some(Bytes::new()),
            (None, NullPayload::JsonNull, ValueFormat::Payload) => {
                Some(Bytes::from_static(b"null"))
            }
            (Some(payload), _, ValueFormat::Payload) => {
                Some(match self.expanded(event, payload)? {
                    Some(expanded) => Bytes::from(expanded),
                    None => render::raw(payload, event.payload_kind, self.bytea)
                        .map_err(|problem| unrenderable(event, "payload", problem))?,
                })
            }
            (payload, _, ValueFormat::Envelope) => Some(self.envelope(event, payload)?),
        };
        Ok(Record {
            topic,
            key: self.key(event)?,
            value,
            headers,
            timestamp_ms: Some(timestamp_ms),
            partition,
        })
    }

    /// Whether a row header entry named `name` is left out: it would pass for a CloudEvents
    /// attribute header, or for a trace header a trace column gives.
    fn reserved_row_header(&self, name: &str) -> bool {
        (self.value_format == ValueFormat::CloudEvents
            && cloudevents::CloudEvents::reserved_header(name))
            || (self.trace.any()
                && (name.eq_ignore_ascii_case(trace::TRACEPARENT)
                    || name.eq_ignore_ascii_case(trace::TRACESTATE)))
    }

    /// The record key: the aggregate id's bytes (see [`render::raw`]).
    fn key(&self, event: &OutboxEvent) -> Result<Option<Bytes>, RouteError> {
        event
            .aggregate_id
            .as_ref()
            .map(|key| {
                render::raw(key, event.aggregate_id_kind, self.bytea)
                    .map_err(|problem| unrenderable(event, "aggregate_id", problem))
            })
            .transpose()
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
        if let Some((_, field)) = self.reserved.iter().find(|(r, _)| *r == topic) {
            return Err(RouteError::Reserved {
                event_id: event_id(),
                destination: topic,
                field,
            });
        }
        if let Some(allowed) = &self.allowed {
            if !allowed.iter().any(|p| matches_destination(p, &topic)) {
                return Err(RouteError::NotAllowed {
                    event_id: event_id(),
                    destination: topic,
                });
            }
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
        if let Some(payload) = payload {
            match self.expanded(event, payload)? {
                Some(expanded) => out.extend_from_slice(&expanded),
                None => render::push_json(&mut out, payload, event.payload_kind, self.bytea)
                    .map_err(|problem| unrenderable(event, "payload", problem))?,
            }
        } else {
            out.extend_from_slice(b"null");
        }
        for (name, i) in &self.envelope {
            if column(event, *i).is_some_and(|c| c.absent) {
                continue;
            }
            out.push(b',');
            serde_json::to_writer(&mut out, name).expect("writing to a Vec cannot fail");
            out.push(b':');
            match column(event, *i) {
                Some(ColumnValue {
                    text: Some(text),
                    kind,
                    ..
                }) => render::push_json(&mut out, text, *kind, self.bytea)
                    .map_err(|problem| unrenderable(event, &self.columns[*i], problem))?,
                _ => out.extend_from_slice(b"null"),
            }
        }
        out.push(b'}');
        Ok(Bytes::from(out))
    }
}

impl Router {
    /// `payload` of `event` as Debezium's JSON expansion gives it, with `json_payload =
    /// "debezium_expanded"` and a json, jsonb or text payload (Debezium expands only a payload
    /// it holds as a string); `None` otherwise.
    ///
    /// Returns an error if Debezium's expansion would fail on the payload.
    fn expanded(&self, event: &OutboxEvent, payload: &[u8]) -> Result<Option<Vec<u8>>, RouteError> {
        if self.json_payload != JsonPayload::DebeziumExpanded
            || !matches!(event.payload_kind, ValueKind::Json | ValueKind::Text)
        {
            return Ok(None);
        }
        render::expand::debezium_expanded(payload)
            .map(Some)
            .map_err(|reason| RouteError::JsonExpansion {
                event_id: String::from_utf8_lossy(&event.id).into_owned(),
                reason,
            })
    }
}

/// Whether `payload` of `event` is empty as Debezium's `route.tombstone.on.empty.payload` sees
/// it: text that Java's `String.trim` leaves empty (every character U+0000 to U+0020). Debezium
/// checks the payload's text, so a bytea (a byte buffer there) is never empty.
fn is_blank(payload: &[u8], event: &OutboxEvent) -> bool {
    event.payload_kind != ValueKind::Bytea && payload.iter().all(|b| *b <= b' ')
}

fn column(event: &OutboxEvent, index: usize) -> Option<&ColumnValue> {
    event.columns.get(index)
}

/// Parses a `timestamptz` or `timestamp` as PostgreSQL prints it with `DateStyle = ISO`
/// (`2026-11-29 23:24:30.123456+00`, offsets like `+05:30` or `-03`, ` BC` after years before
/// 1; a `T` separator is accepted too) into Unix epoch ms; a value without an offset is UTC.
/// `None` for anything else (`infinity`, other date styles).
pub fn parse_timestamp_ms(text: &[u8]) -> Option<i64> {
    render::time::parse_utc(text).map(|t| t.and_utc().timestamp_millis())
}

#[cfg(test)]
mod tests;
