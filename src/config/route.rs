//! How an outbox row becomes a record: the table's column names, the topic route and the
//! per-event options (value format, NULL payload, bad events, UPDATE/DELETE of outbox rows).

use serde::{Deserialize, Serialize};

/// Kafka's limit on topic name length.
const MAX_TOPIC_LEN: usize = 249;

/// Checks Kafka's rules for topic names: 1-249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
///
/// Returns the rule `topic` breaks.
pub fn validate_topic(topic: &str) -> Result<(), &'static str> {
    if topic.is_empty() {
        return Err("empty");
    }
    if topic.len() > MAX_TOPIC_LEN {
        return Err("longer than 249 characters");
    }
    if topic == "." || topic == ".." {
        return Err("'.' and '..' are reserved");
    }
    if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}

/// Whether `name` matches `pattern`: `*` stands for any run of characters (none included),
/// every other character for itself (case-sensitive).
pub fn matches_destination(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else {
        return rest.is_empty();
    };
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Names of the outbox table's columns (the defaults of `sql/outbox.sql`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxColumns {
    /// Event id: the Kafka header `id`.
    pub id: String,
    /// Routes the event: topic `<aggregate_type>.events`.
    pub aggregate_type: String,
    /// The Kafka key; NULL gives a null key.
    pub aggregate_id: String,
    /// The Kafka header `event_type`.
    pub event_type: String,
    /// The Kafka value, byte for byte as PostgreSQL prints it; NULL gives a tombstone.
    pub payload: String,
    /// Optional jsonb object whose entries become Kafka headers: a table without a column of
    /// the default name ([`DEFAULT_HEADERS_COLUMN`]) has no row headers; another name must
    /// exist (a misspelling is a missing column, not headers silently left out).
    pub headers: String,
    /// Optional `timestamptz` or `timestamp` column (a `timestamp` is taken as UTC) whose
    /// value is the Kafka record timestamp; `None` or a NULL value: the commit time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub timestamp: Option<String>,
    /// Optional column holding a W3C `traceparent`, published as the `traceparent` header;
    /// `None`, a NULL value or an invalid one (left out with a warning): no such header.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub traceparent: Option<String>,
    /// Optional column holding a W3C `tracestate`, published as the `tracestate` header
    /// beside a valid `traceparent` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub tracestate: Option<String>,
    /// Optional column holding a span context as a `java.util.Properties` text with
    /// `traceparent=...` (and `tracestate=...`) lines: Debezium's `tracingspancontext`. Used
    /// where the `traceparent` column is not configured or NULL.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub tracing_span_context: Option<String>,
}

/// The default `columns.headers`, the one mapped column a table may lack.
pub const DEFAULT_HEADERS_COLUMN: &str = "headers";

impl OutboxColumns {
    /// Whether the table may lack the `headers` column: only under its default name (see
    /// [`OutboxColumns::headers`]).
    pub fn headers_optional(&self) -> bool {
        self.headers == DEFAULT_HEADERS_COLUMN
    }
}

impl Default for OutboxColumns {
    fn default() -> Self {
        OutboxColumns {
            id: "id".into(),
            aggregate_type: "aggregate_type".into(),
            aggregate_id: "aggregate_id".into(),
            event_type: "event_type".into(),
            payload: "payload".into(),
            headers: DEFAULT_HEADERS_COLUMN.into(),
            timestamp: None,
            traceparent: None,
            tracestate: None,
            tracing_span_context: None,
        }
    }
}

/// How events map to topics (Debezium's `route.by.field`, `route.topic.replacement`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteConfig {
    /// Column whose value routes the event; `None`: the aggregate type column.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub by_field: Option<String>,
    /// Topic name with placeholders: `${routedByValue}` (the routing value), `${name}` or
    /// `${1}` (a capture group of `topic_regex`), `${column:<name>}` (a column's text).
    pub topic_template: String,
    pub topic_case: TopicCase,
    /// Regex the whole routing value (after `topic_case`) must match; its capture groups
    /// may be used in `topic_template` (Debezium's `route.topic.regex`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub topic_regex: Option<String>,
    /// The destinations rows may route to: exact names, or patterns where `*` stands for any
    /// run of characters (none included). A routed destination outside the list is a bad
    /// event (`on_bad_event`). `None`: any destination the template makes, so any row can
    /// pick any `<X>.events` topic. The dead-letter and checkpoint topics are never
    /// destinations, whatever the template; a list that admits one is refused at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub allowed_destinations: Option<Vec<String>>,
}

impl Default for RouteConfig {
    fn default() -> Self {
        RouteConfig {
            by_field: None,
            topic_template: "${routedByValue}.events".into(),
            topic_case: TopicCase::Preserve,
            topic_regex: None,
            allowed_destinations: None,
        }
    }
}

/// An extra column put in the record (Debezium's `table.fields.additional.placement`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdditionalPlacement {
    /// The column.
    pub field: String,
    pub placement: Placement,
    /// Header or envelope field name; defaults to `field`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub alias: Option<String>,
}

impl AdditionalPlacement {
    /// The header or envelope field name.
    pub fn name(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.field)
    }
}

/// What a placement whose column the table does not have does (Debezium's
/// `table.field.additional.missing`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum MissingPlacementColumn {
    /// The pipeline stops at the table's first insert without it.
    #[default]
    Error,
    /// The placement is left out: no header, no envelope field, the partition by key. A column
    /// that routing or the timestamp also uses is still required.
    Ignore,
}

/// Where a placed column goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// A header with the column's text (NULL: a null header value), after the others.
    Header,
    /// A field of the JSON envelope (`value_format = "envelope"`).
    Envelope,
    /// The Kafka partition: the column's integer value (NULL: partition by key).
    Partition,
}

/// What the record value is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ValueFormat {
    /// The payload bytes exactly as PostgreSQL printed them.
    #[default]
    Payload,
    /// A JSON object `{"payload": ..., "<alias>": ...}` with the envelope placements.
    Envelope,
    /// A CloudEvent (spec 1.0.2) in the sink's protocol binding, structured or binary as
    /// `cloudevents.mode` says. A value of `value_format` rather than a key of its own: like
    /// the envelope, it decides what the record value is, and it excludes the other two.
    #[serde(rename = "cloudevents")]
    CloudEvents,
}

/// How events are CloudEvents, with `value_format = "cloudevents"`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CloudEventsConfig {
    /// Where the attributes go.
    pub mode: CloudEventsMode,
    /// The `source` attribute, a URI-reference; `None`:
    /// `/outbox-relay/<database>/<schema>.<table>` (each part percent-encoded).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub source: Option<String>,
    /// The `datacontenttype` attribute; `None`: `application/json` for a json or jsonb payload,
    /// `application/octet-stream` for a bytea one (with `bytea_format = "raw"`),
    /// `text/plain; charset=utf-8` for any other. A JSON media type (`application/json`,
    /// `*/*+json`) for a text payload makes it JSON data, each payload checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub data_content_type: Option<String>,
}

/// Where a CloudEvent's attributes go.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum CloudEventsMode {
    /// The whole event as the JSON event format (`application/cloudevents+json`) in the value.
    #[default]
    Structured,
    /// The payload as the value, the attributes as headers in the binding's form.
    Binary,
}

/// What a SQL NULL payload becomes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum NullPayload {
    /// A null value: a delete on compacted topics.
    #[default]
    Tombstone,
    /// A zero-byte value, which compacted topics keep.
    Empty,
    /// The JSON `null`: the value `null`, or with `value_format = "envelope"` the envelope
    /// with `"payload":null` (Debezium's envelope output for a NULL payload).
    JsonNull,
}

/// What an empty or blank payload becomes (Debezium's `route.tombstone.on.empty.payload`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum EmptyPayload {
    /// Published as it is: a zero-byte (or blank) value.
    #[default]
    Keep,
    /// A tombstone (a null value, in either `value_format`) for a payload whose text is empty
    /// or only characters up to U+0020 (what Java's `String.trim` removes); a bytea payload
    /// is never empty in this sense, as in Debezium.
    Tombstone,
}

/// How a bytea key or payload is published.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ByteaFormat {
    /// The bytes themselves (what Debezium publishes with `BinaryDataConverter` or
    /// `ByteArrayConverter`): a protobuf or Avro payload as the application wrote it.
    #[default]
    Raw,
    /// PostgreSQL's hex text (`\x0aff`), bytea placed columns included.
    Hex,
}

/// How a json, jsonb or text payload is published.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum JsonPayload {
    /// The text as PostgreSQL prints it, byte for byte (what Debezium publishes with
    /// `StringConverter` and no expansion).
    #[default]
    AsStored,
    /// What Debezium publishes with `table.expand.json.payload = true` and `JsonConverter`
    /// (`schemas.enable = false`): the object re-written compactly, null fields and empty
    /// arrays left out. A payload Debezium would not expand is a
    /// bad event.
    DebeziumExpanded,
}

/// What an event that cannot be routed does (illegal topic, regex mismatch, NULL template
/// column, a destination outside `route.allowed_destinations` or reserved for the relay, bad
/// headers JSON, bad partition or timestamp value).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum OnBadEvent {
    /// The pipeline stops before confirming the event's transaction.
    #[default]
    Halt,
    /// The raw event goes to `dead_letter_topic` with an `outbox_relay_error` header.
    DeadLetter,
}

/// What happens to the routing value's case in the topic name.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Deserialize,
    schemars::JsonSchema,
    Serialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum TopicCase {
    /// As written: Kafka topic names are case-sensitive, so `Order` and `order` stay two topics.
    #[default]
    Preserve,
    /// Lower-cased.
    Lower,
    /// Upper-cased.
    Upper,
}

/// What an UPDATE or DELETE of an outbox row does (Debezium's `table.op.invalid.behavior`).
/// Rows may be deleted right after the insert, so the default passes over them. With `"warn"`
/// or `"error"` the publication must publish updates and deletes: `setup` creates it so, and
/// the relay refuses one that does not.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Deserialize,
    schemars::JsonSchema,
    Serialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum InvalidOpBehavior {
    /// Passed over, counted in `outbox_relay_messages_skipped_total{kind}`.
    #[default]
    Ignore,
    /// Passed over with a warning naming the LSN.
    Warn,
    /// The pipeline stops before confirming the transaction.
    Error,
}

impl InvalidOpBehavior {
    /// Whether the pipeline reads updates and deletes of the outbox (to warn or stop on them),
    /// so that its publication must publish them.
    pub fn needs_updates(self) -> bool {
        self != InvalidOpBehavior::Ignore
    }

    /// The publication's `publish` setting the pipeline needs: `insert`, or with
    /// [`Self::needs_updates`] `insert, update, delete`.
    pub fn publish(self) -> &'static str {
        match self.needs_updates() {
            true => "insert, update, delete",
            false => "insert",
        }
    }
}
