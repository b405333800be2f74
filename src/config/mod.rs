//! Pipeline configuration: typed, validated once at start.
//!
//! One [`PipelineConfig`] per source database. The CLI builds one from flags and environment
//! variables today; a config file with several `[[pipelines]]` will deserialize into the same
//! structs.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use crate::router;
use crate::source::tls::{self, TlsSettings};

pub mod file;
pub mod libpq_env;
pub mod polling;

pub use polling::{MarkMode, PollingConfig, SourceKind};

/// Standby status update interval: PostgreSQL's default `wal_sender_timeout` is 60 s; 1 s
/// keeps the slot's confirmed position fresh for monitoring and is cheap (34 bytes).
pub const DEFAULT_STATUS_INTERVAL_MS: u64 = 1_000;
/// In-flight events: enough to keep a broker round trip of ~100 ms busy at 100k events/s.
pub const DEFAULT_MAX_IN_FLIGHT_EVENTS: usize = 10_000;
/// In-flight bytes (keys, values and headers): bounds memory whatever the event size.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 64 * 1024 * 1024;
/// Time to wait for outstanding acknowledgements on shutdown before giving up (then the
/// events after the last confirmed LSN are published again on restart).
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECS: u64 = 30;
/// Compacted topic for exactly-once checkpoints: one per Kafka cluster, keyed by pipeline name,
/// so several relays can share it.
pub const DEFAULT_CHECKPOINT_TOPIC: &str = "outbox-relay.checkpoints";

/// A configuration value that cannot work; the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {field}: {problem}")]
pub struct ConfigError {
    pub field: String,
    pub problem: String,
}

impl ConfigError {
    pub(crate) fn new(field: &str, problem: impl Into<String>) -> Self {
        ConfigError {
            field: field.to_owned(),
            problem: problem.into(),
        }
    }
}

/// A schema-qualified table name: `schema.table`, or `table` for `public.table`.
///
/// Each part is either double-quoted with PostgreSQL's rules (`"Billing-Prod"."Outbox"`, `""`
/// for a quote inside, dots allowed) or unquoted, which is taken as written: no case folding
/// (`Billing.Outbox` names the schema `Billing`, unlike in SQL), and no `.`, `"` or
/// whitespace. [`TableName::quoted`] gives the SQL form; `Display` the config form.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct TableName {
    /// The schema as PostgreSQL stores it (`pg_namespace.nspname`), without quotes.
    pub schema: String,
    /// The table as PostgreSQL stores it (`pg_class.relname`), without quotes.
    pub name: String,
}

/// PostgreSQL keeps the first 63 bytes of an identifier (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;

impl TableName {
    /// The name for SQL text: both parts double-quoted (`"Billing-Prod"."Outbox"`).
    pub fn quoted(&self) -> String {
        format!(
            "{}.{}",
            crate::source::replication::quote_ident(&self.schema),
            crate::source::replication::quote_ident(&self.name)
        )
    }
}

/// Reads one identifier from the start of `s`; returns it and the rest of `s`.
fn parse_identifier(s: &str) -> Result<(String, &str), String> {
    if let Some(mut rest) = s.strip_prefix('"') {
        let mut ident = String::new();
        loop {
            let Some(end) = rest.find('"') else {
                return Err("a quoted name is not closed".into());
            };
            ident.push_str(&rest[..end]);
            rest = &rest[end + 1..];
            match rest.strip_prefix('"') {
                // `""` is a quote inside the name.
                Some(after) => {
                    ident.push('"');
                    rest = after;
                }
                None => break,
            }
        }
        if ident.is_empty() {
            return Err("a quoted name is empty".into());
        }
        return Ok((ident, rest));
    }
    let end = s.find(['.', '"']).unwrap_or(s.len());
    let ident = &s[..end];
    if ident.is_empty() {
        return Err("a name is empty".into());
    }
    if ident.contains(char::is_whitespace) {
        return Err(format!(
            "{ident:?} contains whitespace: double-quote the name"
        ));
    }
    if s[end..].starts_with('"') {
        return Err(format!(
            "a quote after {ident:?}: double-quote the whole name"
        ));
    }
    Ok((ident.to_owned(), &s[end..]))
}

impl FromStr for TableName {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |problem: String| {
            ConfigError::new(
                "table",
                format!(
                    "{s:?}: {problem} (write schema.table; double-quote a name as in SQL, e.g. \"Billing-Prod\".\"Outbox\")"
                ),
            )
        };
        let (first, rest) = parse_identifier(s).map_err(invalid)?;
        let (schema, name) = match rest.strip_prefix('.') {
            None if rest.is_empty() => ("public".to_owned(), first),
            None => return Err(invalid(format!("unexpected {rest:?} after the name"))),
            Some(rest) => {
                let (second, rest) = parse_identifier(rest).map_err(invalid)?;
                if !rest.is_empty() {
                    return Err(invalid(format!("unexpected {rest:?} after schema.table")));
                }
                (first, second)
            }
        };
        for part in [&schema, &name] {
            if part.len() > MAX_IDENTIFIER_BYTES {
                return Err(invalid(format!(
                    "{part:?} is longer than {MAX_IDENTIFIER_BYTES} bytes, and PostgreSQL shortens such names"
                )));
            }
        }
        Ok(TableName { schema, name })
    }
}

impl TryFrom<String> for TableName {
    type Error = ConfigError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// The config form: a part is double-quoted unless it is a plain lower-case identifier, so
/// the text parses back to the same name and reads the same in SQL.
impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |ident: &str| {
            let plain = ident.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && ident
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if plain {
                ident.to_owned()
            } else {
                crate::source::replication::quote_ident(ident)
            }
        };
        write!(f, "{}.{}", part(&self.schema), part(&self.name))
    }
}

/// Names of the outbox table's columns (the defaults of `sql/outbox.sql`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
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
    /// Optional jsonb object whose entries become Kafka headers.
    pub headers: String,
    /// Optional `timestamptz` or `timestamp` column (a `timestamp` is taken as UTC) whose
    /// value is the Kafka record timestamp; `None` or a NULL value: the commit time.
    pub timestamp: Option<String>,
}

impl Default for OutboxColumns {
    fn default() -> Self {
        OutboxColumns {
            id: "id".into(),
            aggregate_type: "aggregate_type".into(),
            aggregate_id: "aggregate_id".into(),
            event_type: "event_type".into(),
            payload: "payload".into(),
            headers: "headers".into(),
            timestamp: None,
        }
    }
}

/// How events map to topics (Debezium's `route.by.field`, `route.topic.replacement`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteConfig {
    /// Column whose value routes the event; `None`: the aggregate type column.
    pub by_field: Option<String>,
    /// Topic name with placeholders: `${routedByValue}` (the routing value), `${name}` or
    /// `${1}` (a capture group of `topic_regex`), `${column:<name>}` (a column's text).
    pub topic_template: String,
    pub topic_case: TopicCase,
    /// Regex the whole routing value (after `topic_case`) must match; its capture groups
    /// may be used in `topic_template` (Debezium's `route.topic.regex`).
    pub topic_regex: Option<String>,
}

impl Default for RouteConfig {
    fn default() -> Self {
        RouteConfig {
            by_field: None,
            topic_template: "${routedByValue}.events".into(),
            topic_case: TopicCase::Preserve,
            topic_regex: None,
        }
    }
}

/// An extra column put in the record (Debezium's `table.fields.additional.placement`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdditionalPlacement {
    /// The column.
    pub field: String,
    pub placement: Placement,
    /// Header or envelope field name; defaults to `field`.
    pub alias: Option<String>,
}

impl AdditionalPlacement {
    /// The header or envelope field name.
    pub fn name(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.field)
    }
}

/// Where an [`AdditionalPlacement`] column goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueFormat {
    /// The payload bytes exactly as PostgreSQL printed them.
    #[default]
    Payload,
    /// A JSON object `{"payload": ..., "<alias>": ...}` with the envelope placements.
    Envelope,
}

/// What a SQL NULL payload becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
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

/// What an event that cannot be routed does (illegal topic, regex mismatch, NULL template
/// column, bad headers JSON, bad partition or timestamp value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBadEvent {
    /// The pipeline stops before confirming the event's transaction.
    #[default]
    Halt,
    /// The raw event goes to `dead_letter_topic` with an `outbox_relay_error` header.
    DeadLetter,
}

/// How records are shaped beyond routing: extra columns, value format, NULL payloads and
/// the bad-input policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordConfig {
    pub additional_placement: Vec<AdditionalPlacement>,
    pub value_format: ValueFormat,
    pub null_payload: NullPayload,
    pub on_bad_event: OnBadEvent,
    /// Required with `on_bad_event = "dead_letter"`.
    pub dead_letter_topic: Option<String>,
}

/// What happens to the routing value's case in the topic name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TopicCase {
    /// Kafka topic names are case-sensitive: `Order` and `order` stay two topics.
    #[default]
    Preserve,
    Lower,
    Upper,
}

/// What an UPDATE or DELETE of an outbox row does (Debezium's `table.op.invalid.behavior`).
/// Rows may be deleted right after the insert, so the default passes over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
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

/// Kafka producer settings.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    /// `host:port[,host:port...]`.
    pub bootstrap_servers: String,
    /// Extra librdkafka properties (`security.protocol`, `sasl.*`, `linger.ms`, ...).
    pub properties: Vec<(String, String)>,
}

/// librdkafka properties the relay's guarantees depend on; setting them otherwise is an error.
const REQUIRED_KAFKA_PROPERTIES: &[(&str, &str)] =
    &[("enable.idempotence", "true"), ("acks", "all")];

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Property values may hold SASL passwords or keys.
        let keys: Vec<&str> = self.properties.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("properties", &keys)
            .finish()
    }
}

/// One source database and where its events go.
#[derive(Clone)]
pub struct PipelineConfig {
    /// Label in logs and metrics.
    pub name: String,
    /// libpq connection URL or `key=value` string of the source database.
    pub source_url: String,
    /// Logical replication slot (pgoutput).
    pub slot: String,
    /// Publication that includes the outbox table: its name exactly as stored, case and
    /// punctuation included, without quotes.
    pub publication: String,
    /// The outbox table (see [`TableName`] for quoting).
    pub table: TableName,
    pub columns: OutboxColumns,
    /// Transactional logical decoding messages with this prefix are outbox events too.
    pub message_prefix: Option<String>,
    pub route: RouteConfig,
    pub record: RecordConfig,
    pub op_invalid_behavior: InvalidOpBehavior,
    /// Create the slot when it does not exist.
    pub create_slot: bool,
    pub kafka: KafkaConfig,
    pub status_interval_ms: u64,
    pub max_in_flight_events: usize,
    pub max_in_flight_bytes: usize,
    pub shutdown_timeout_secs: u64,
    /// When the slot is held by a walsender whose client has sent no status update for this
    /// long (seconds), terminate that walsender and take the slot over; `None`: never.
    pub terminate_stale_walsender_after_secs: Option<u64>,
    /// Log tailing (default; `slot`, `publication` and `create_slot` apply) or polling
    /// (`polling` applies).
    pub source_kind: SourceKind,
    pub polling: PollingConfig,
    /// Exactly-once mode: each PostgreSQL transaction's records and a checkpoint record go to
    /// Kafka in one Kafka transaction (see [`crate::sink::kafka::Transactions`]).
    pub exactly_once: bool,
    /// Kafka `transactional.id` in exactly-once mode; `None`: `outbox-relay-<name>`. Stable
    /// across restarts and unique per pipeline: a relay started with the same id fences the
    /// one before it.
    pub transactional_id: Option<String>,
    /// Compacted topic for the checkpoints in exactly-once mode; `None`:
    /// [`DEFAULT_CHECKPOINT_TOPIC`].
    pub checkpoint_topic: Option<String>,
}

impl fmt::Debug for PipelineConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineConfig")
            .field("name", &self.name)
            .field("source_url", &redact_url(&self.source_url))
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("table", &self.table)
            .field("columns", &self.columns)
            .field("message_prefix", &self.message_prefix)
            .field("route", &self.route)
            .field("record", &self.record)
            .field("op_invalid_behavior", &self.op_invalid_behavior)
            .field("create_slot", &self.create_slot)
            .field("kafka", &self.kafka)
            .field("status_interval_ms", &self.status_interval_ms)
            .field("max_in_flight_events", &self.max_in_flight_events)
            .field("max_in_flight_bytes", &self.max_in_flight_bytes)
            .field("shutdown_timeout_secs", &self.shutdown_timeout_secs)
            .field(
                "terminate_stale_walsender_after_secs",
                &self.terminate_stale_walsender_after_secs,
            )
            .field("source_kind", &self.source_kind)
            .field("polling", &self.polling)
            .field("exactly_once", &self.exactly_once)
            .field("transactional_id", &self.transactional_id)
            .field("checkpoint_topic", &self.checkpoint_topic)
            .finish()
    }
}

impl PipelineConfig {
    /// Checks every field once at start.
    ///
    /// Returns the first problem found, naming the field and the constraint.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::new("name", "must not be empty"));
        }
        self.source_config()?;
        if self.source_kind == SourceKind::Polling {
            if let Some(first) = self.polling.problems().into_iter().next() {
                return Err(first);
            }
            if self.message_prefix.is_some() {
                return Err(ConfigError::new(
                    "message_prefix",
                    "logical decoding messages need source_kind = \"log_tailing\"",
                ));
            }
        }
        // PostgreSQL's rule for slot names (ReplicationSlotValidateName).
        if self.source_kind == SourceKind::LogTailing
            && (self.slot.is_empty()
                || self.slot.len() > 63
                || !self
                    .slot
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'))
        {
            return Err(ConfigError::new(
                "slot",
                format!("{:?} must be 1-63 characters of a-z, 0-9 and _", self.slot),
            ));
        }
        if self.source_kind == SourceKind::LogTailing && self.publication.is_empty() {
            return Err(ConfigError::new("publication", "must not be empty"));
        }
        // Unlike `table`, the publication is a name as PostgreSQL stores it.
        if self.publication.starts_with('"') && self.publication.ends_with('"') {
            return Err(ConfigError::new(
                "publication",
                format!(
                    "{:?}: write the name without quotes; it is used exactly as written",
                    self.publication
                ),
            ));
        }
        if let Some(first) = self.routing_problems().into_iter().next() {
            return Err(first);
        }
        if let Some(first) = self.exactly_once_problems().into_iter().next() {
            return Err(first);
        }
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::new(
                "kafka.bootstrap_servers",
                "must not be empty",
            ));
        }
        for (key, value) in &self.kafka.properties {
            if key == "bootstrap.servers" {
                return Err(ConfigError::new(
                    "kafka.properties",
                    "bootstrap.servers: set kafka.bootstrap_servers instead",
                ));
            }
            if let Some((_, required)) = REQUIRED_KAFKA_PROPERTIES.iter().find(|(k, _)| k == key) {
                if value != required {
                    return Err(ConfigError::new(
                        "kafka.properties",
                        format!("{key}={value}: the relay needs {key}={required} for per-key order without loss"),
                    ));
                }
            }
        }
        for (field, value) in [
            ("status_interval_ms", self.status_interval_ms),
            ("max_in_flight_events", self.max_in_flight_events as u64),
            ("max_in_flight_bytes", self.max_in_flight_bytes as u64),
        ] {
            if value == 0 {
                return Err(ConfigError::new(field, "must be greater than 0"));
            }
        }
        if let Some(secs) = self.terminate_stale_walsender_after_secs {
            // A live relay replies every status interval: twice that is never stale.
            let min_secs = (2 * self.status_interval_ms).div_ceil(1_000).max(2);
            if secs < min_secs {
                return Err(ConfigError::new(
                    "terminate_stale_walsender_after_secs",
                    format!("{secs} is too short: at least {min_secs} (twice status_interval_ms, and 2 s), so a live relay is never terminated"),
                ));
            }
        }
        Ok(())
    }

    /// Checks routing and record options (`route`, `columns.timestamp`,
    /// `additional_placement`, `value_format`, `on_bad_event`, `dead_letter_topic`).
    ///
    /// Returns every problem found, each naming its field path.
    pub fn routing_problems(&self) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        let mut problem = |field: &str, text: String| problems.push(ConfigError::new(field, text));
        let no_columns =
            "cannot be combined with message_prefix: logical messages carry no such column";
        let route = &self.route;
        if route.by_field.as_deref() == Some("") {
            problem("route.by_field", "must not be empty".into());
        }
        if route.by_field.is_some() && self.message_prefix.is_some() {
            problem("route.by_field", no_columns.into());
        }
        let regex = match route
            .topic_regex
            .as_deref()
            .map(router::compile_topic_regex)
        {
            Some(Err(e)) => {
                problem("route.topic_regex", e);
                None
            }
            Some(Ok(regex)) => Some(regex),
            None => None,
        };
        if route.topic_template.is_empty() {
            problem("route.topic_template", "must not be empty".into());
        } else {
            match router::Template::parse(&route.topic_template) {
                Err(e) => problem("route.topic_template", e),
                Ok(template) => {
                    if let Err(e) =
                        template.check_groups(regex.as_ref(), route.topic_regex.is_some())
                    {
                        problem("route.topic_template", e);
                    }
                    if template.columns().next().is_some() && self.message_prefix.is_some() {
                        problem(
                            "route.topic_template",
                            format!("${{column:...}} {no_columns}"),
                        );
                    }
                    if let Err(reason) = router::validate_topic(&template.sample()) {
                        problem(
                            "route.topic_template",
                            format!("gives no legal topic name: {reason}"),
                        );
                    }
                }
            }
        }
        match self.columns.timestamp.as_deref() {
            Some("") => problem("columns.timestamp", "must not be empty".into()),
            Some(_) if self.message_prefix.is_some() => {
                problem("columns.timestamp", no_columns.into())
            }
            _ => {}
        }
        let record = &self.record;
        let mut partitions = 0;
        let mut envelope_names = std::collections::HashSet::new();
        for (i, placement) in record.additional_placement.iter().enumerate() {
            let at = |field: &str| format!("additional_placement[{i}].{field}");
            if placement.field.is_empty() {
                problem(&at("field"), "must not be empty".into());
            } else if self.message_prefix.is_some() {
                problem(&at("field"), no_columns.into());
            }
            if placement.alias.as_deref() == Some("") {
                problem(&at("alias"), "must not be empty".into());
            }
            match placement.placement {
                Placement::Header => {}
                Placement::Partition => {
                    partitions += 1;
                    if partitions > 1 {
                        problem(
                            &at("placement"),
                            "only one partition placement is allowed".into(),
                        );
                    }
                }
                Placement::Envelope => {
                    if record.value_format != ValueFormat::Envelope {
                        problem(
                            &at("placement"),
                            "envelope placement needs value_format = \"envelope\"".into(),
                        );
                    }
                    let name = placement.name();
                    if name == "payload" || !envelope_names.insert(name) {
                        problem(
                            &at("alias"),
                            format!("envelope field {name:?} is already used (\"payload\" is the payload's)"),
                        );
                    }
                }
            }
        }
        match (record.on_bad_event, record.dead_letter_topic.as_deref()) {
            (OnBadEvent::DeadLetter, None) => problem(
                "dead_letter_topic",
                "required when on_bad_event = \"dead_letter\"".into(),
            ),
            (OnBadEvent::DeadLetter, Some(topic)) => {
                if let Err(reason) = router::validate_topic(topic) {
                    problem(
                        "dead_letter_topic",
                        format!("{topic:?} is not a legal topic name: {reason}"),
                    );
                }
            }
            (OnBadEvent::Halt, Some(_)) => problem(
                "dead_letter_topic",
                "only used with on_bad_event = \"dead_letter\"".into(),
            ),
            (OnBadEvent::Halt, None) => {}
        }
        problems
    }

    /// Checks the exactly-once options (`exactly_once`, `transactional_id`, `checkpoint_topic`
    /// and the Kafka properties they own).
    ///
    /// Returns every problem found, each naming its field path.
    pub fn exactly_once_problems(&self) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        let mut problem = |field: &str, text: String| problems.push(ConfigError::new(field, text));
        if !self.exactly_once {
            for (field, set) in [
                ("transactional_id", self.transactional_id.is_some()),
                ("checkpoint_topic", self.checkpoint_topic.is_some()),
            ] {
                if set {
                    problem(field, "only used with exactly_once = true".into());
                }
            }
        }
        if self.exactly_once && self.source_kind == SourceKind::Polling {
            problem(
                "exactly_once",
                "is for log tailing: a polling source marks rows after the acknowledgement instead"
                    .into(),
            );
        }
        if self.transactional_id.as_deref() == Some("") {
            problem("transactional_id", "must not be empty".into());
        }
        if let Some(topic) = &self.checkpoint_topic {
            if let Err(reason) = router::validate_topic(topic) {
                problem(
                    "checkpoint_topic",
                    format!("{topic:?} is not a legal topic name: {reason}"),
                );
            }
        }
        for (key, _) in &self.kafka.properties {
            if key == "transactional.id" {
                problem(
                    "kafka.properties",
                    "transactional.id: set transactional_id (with exactly_once = true) instead"
                        .into(),
                );
            }
        }
        problems
    }

    /// The Kafka `transactional.id` of exactly-once mode.
    pub fn transactional_id(&self) -> String {
        self.transactional_id
            .clone()
            .unwrap_or_else(|| format!("outbox-relay-{}", self.name))
    }

    /// The checkpoint topic of exactly-once mode.
    pub fn checkpoint_topic(&self) -> &str {
        self.checkpoint_topic
            .as_deref()
            .unwrap_or(DEFAULT_CHECKPOINT_TOPIC)
    }

    /// The source URL parsed by tokio-postgres, with what it leaves out filled in as libpq
    /// would (`PG*` environment variables, the password file, the local socket directory;
    /// see [`libpq_env`]), and its TLS settings.
    ///
    /// Returns an error naming `source_url` (without its password) if it does not parse.
    pub fn source_config(&self) -> Result<(tokio_postgres::Config, TlsSettings), ConfigError> {
        let invalid = |e: &dyn fmt::Display| {
            ConfigError::new(
                "source_url",
                format!("{}: {e}", redact_url(&self.source_url)),
            )
        };
        let (rest, mut tls) = tls::split_url(&self.source_url).map_err(|e| invalid(&e))?;
        let mut config: tokio_postgres::Config = rest.parse().map_err(|e| invalid(&e))?;
        // tokio-postgres may have parsed an sslmode this parser did not see (`sslmode = require`
        // with spaces): never go below it.
        if !tls.mode_given && config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            tls.mode = tls.mode.max(tls::SslMode::Require);
            tls.mode_given = true;
        }
        libpq_env::apply(&mut config, &mut tls, &|name| std::env::var(name).ok())
            .map_err(|e| invalid(&e))?;
        // Unix sockets never use TLS (as libpq and the replication client).
        let all_unix = config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
        config.ssl_mode(if all_unix {
            tokio_postgres::config::SslMode::Disable
        } else {
            tls.tokio_postgres_mode()
        });
        Ok((config, tls))
    }

    pub fn status_interval(&self) -> Duration {
        Duration::from_millis(self.status_interval_ms)
    }

    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout_secs)
    }

    /// `terminate_stale_walsender_after_secs` as a duration.
    pub fn terminate_stale_walsender_after(&self) -> Option<Duration> {
        self.terminate_stale_walsender_after_secs
            .map(Duration::from_secs)
    }
}

/// Hides the password of a libpq URL (`postgres://user:secret@host` -> `postgres://user:***@host`)
/// or key=value string (`password=secret` -> `password=***`) for logs and errors.
pub fn redact_url(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        // The user info ends at the last '@' before the query (a password may hold '/').
        let authority_end = rest.find('?').unwrap_or(rest.len());
        let mut out = url.to_owned();
        if let Some(at) = rest[..authority_end].rfind('@') {
            if let Some(colon) = rest[..at].find(':') {
                out = format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &rest[..colon],
                    &rest[at..]
                );
            }
        }
        // A password may also come as a query parameter.
        if let Some((base, query)) = out.clone().split_once('?') {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some(("password", _)) => "password=***".to_owned(),
                    _ => pair.to_owned(),
                })
                .collect();
            out = format!("{base}?{}", query.join("&"));
        }
        return out;
    }
    // key=value form; a quoted value may contain spaces.
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(start) = rest.find("password") {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PipelineConfig {
        PipelineConfig {
            name: "main".into(),
            source_url: "postgres://relay:pw@localhost/app".into(),
            slot: "outbox_relay".into(),
            publication: "outbox_pub".into(),
            table: "public.outbox".parse().unwrap(),
            columns: OutboxColumns::default(),
            message_prefix: None,
            route: RouteConfig::default(),
            record: RecordConfig::default(),
            op_invalid_behavior: InvalidOpBehavior::Ignore,
            create_slot: true,
            kafka: KafkaConfig {
                bootstrap_servers: "localhost:9092".into(),
                properties: vec![],
            },
            status_interval_ms: DEFAULT_STATUS_INTERVAL_MS,
            max_in_flight_events: DEFAULT_MAX_IN_FLIGHT_EVENTS,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            shutdown_timeout_secs: DEFAULT_SHUTDOWN_TIMEOUT_SECS,
            terminate_stale_walsender_after_secs: None,
            source_kind: SourceKind::LogTailing,
            polling: PollingConfig::default(),
            exactly_once: false,
            transactional_id: None,
            checkpoint_topic: None,
        }
    }

    #[test]
    fn accepts_defaults() {
        config().validate().unwrap();
        let mut c = config();
        c.terminate_stale_walsender_after_secs = Some(2);
        c.validate().unwrap();
    }

    /// A field path and a change that breaks it.
    type Breaks = Vec<(&'static str, Box<dyn Fn(&mut PipelineConfig)>)>;

    #[test]
    fn errors_name_the_field() {
        let cases: Breaks = vec![
            ("slot", Box::new(|c| c.slot = "Bad-Slot".into())),
            ("slot", Box::new(|c| c.slot = String::new())),
            ("publication", Box::new(|c| c.publication = String::new())),
            (
                "publication",
                Box::new(|c| c.publication = "\"Outbox-Pub\"".into()),
            ),
            (
                "source_url",
                Box::new(|c| c.source_url = "postgres://u:pw@h:notaport/db".into()),
            ),
            (
                "kafka.bootstrap_servers",
                Box::new(|c| c.kafka.bootstrap_servers = " ".into()),
            ),
            (
                "kafka.properties",
                Box::new(|c| {
                    c.kafka.properties = vec![("enable.idempotence".into(), "false".into())]
                }),
            ),
            (
                "kafka.properties",
                Box::new(|c| c.kafka.properties = vec![("acks".into(), "1".into())]),
            ),
            (
                "max_in_flight_events",
                Box::new(|c| c.max_in_flight_events = 0),
            ),
            (
                "route.topic_template",
                Box::new(|c| c.route.topic_template = "orders/${routedByValue}".into()),
            ),
            (
                "route.by_field",
                Box::new(|c| {
                    c.route.by_field = Some("tenant_id".into());
                    c.message_prefix = Some("outbox".into());
                }),
            ),
            (
                "terminate_stale_walsender_after_secs",
                Box::new(|c| c.terminate_stale_walsender_after_secs = Some(1)),
            ),
            (
                "terminate_stale_walsender_after_secs",
                Box::new(|c| {
                    c.status_interval_ms = 10_000;
                    c.terminate_stale_walsender_after_secs = Some(15);
                }),
            ),
        ];
        for (field, mutate) in cases {
            let mut c = config();
            mutate(&mut c);
            let err = c.validate().unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(!err.to_string().contains("pw@"), "password leaked: {err}");
        }
    }

    fn placement(field: &str, placement: Placement, alias: Option<&str>) -> AdditionalPlacement {
        AdditionalPlacement {
            field: field.into(),
            placement,
            alias: alias.map(str::to_owned),
        }
    }

    #[test]
    fn every_bad_routing_combination_names_its_field() {
        type Mutate = Box<dyn Fn(&mut PipelineConfig)>;
        let cases: Vec<(&str, Mutate)> = vec![
            (
                "route.topic_regex",
                Box::new(|c| c.route.topic_regex = Some("(".into())),
            ),
            (
                "route.topic_template",
                Box::new(|c| c.route.topic_template = "${name}.events".into()),
            ),
            (
                "route.topic_template",
                Box::new(|c| {
                    c.route.topic_regex = Some("(?P<name>.+)".into());
                    c.route.topic_template = "${other}.${2}".into();
                }),
            ),
            (
                "route.topic_template",
                Box::new(|c| c.route.topic_template = "${column:tenant_id".into()),
            ),
            (
                "route.topic_template",
                Box::new(|c| {
                    c.route.topic_template = "${column:tenant_id}.events".into();
                    c.message_prefix = Some("outbox".into());
                }),
            ),
            (
                "route.topic_template",
                Box::new(|c| c.route.topic_template = String::new()),
            ),
            (
                "columns.timestamp",
                Box::new(|c| c.columns.timestamp = Some(String::new())),
            ),
            (
                "columns.timestamp",
                Box::new(|c| {
                    c.columns.timestamp = Some("created_at".into());
                    c.message_prefix = Some("outbox".into());
                }),
            ),
            (
                "additional_placement[0].field",
                Box::new(|c| {
                    c.record.additional_placement = vec![placement("", Placement::Header, None)]
                }),
            ),
            (
                "additional_placement[0].alias",
                Box::new(|c| {
                    c.record.additional_placement =
                        vec![placement("t", Placement::Header, Some(""))]
                }),
            ),
            (
                "additional_placement[1].placement",
                Box::new(|c| {
                    c.record.additional_placement = vec![
                        placement("a", Placement::Partition, None),
                        placement("b", Placement::Partition, None),
                    ]
                }),
            ),
            (
                "additional_placement[0].placement",
                Box::new(|c| {
                    c.record.additional_placement = vec![placement("a", Placement::Envelope, None)]
                }),
            ),
            (
                "additional_placement[0].alias",
                Box::new(|c| {
                    c.record.value_format = ValueFormat::Envelope;
                    c.record.additional_placement =
                        vec![placement("p", Placement::Envelope, Some("payload"))]
                }),
            ),
            (
                "additional_placement[1].alias",
                Box::new(|c| {
                    c.record.value_format = ValueFormat::Envelope;
                    c.record.additional_placement = vec![
                        placement("a", Placement::Envelope, Some("x")),
                        placement("x", Placement::Envelope, None),
                    ]
                }),
            ),
            (
                "additional_placement[0].field",
                Box::new(|c| {
                    c.record.additional_placement = vec![placement("t", Placement::Header, None)];
                    c.message_prefix = Some("outbox".into());
                }),
            ),
            (
                "dead_letter_topic",
                Box::new(|c| c.record.on_bad_event = OnBadEvent::DeadLetter),
            ),
            (
                "dead_letter_topic",
                Box::new(|c| {
                    c.record.on_bad_event = OnBadEvent::DeadLetter;
                    c.record.dead_letter_topic = Some("dead letters".into());
                }),
            ),
            (
                "dead_letter_topic",
                Box::new(|c| c.record.dead_letter_topic = Some("dlq".into())),
            ),
        ];
        for (field, mutate) in cases {
            let mut c = config();
            mutate(&mut c);
            let problems = c.routing_problems();
            assert!(
                problems.iter().any(|p| p.field == field),
                "{field}: {problems:?}"
            );
            assert_eq!(c.validate().unwrap_err().field, problems[0].field);
        }
        let mut good = config();
        good.columns.timestamp = Some("created_at".into());
        good.route.topic_regex = Some("(?P<domain>[a-z]+)_(v[0-9]+)".into());
        good.route.topic_template = "${column:tenant_id}.${domain}.${2}.${routedByValue}".into();
        good.record = RecordConfig {
            additional_placement: vec![
                placement("tenant_id", Placement::Header, Some("tenant")),
                placement("shard", Placement::Partition, None),
                placement("tenant_id", Placement::Envelope, Some("tenant")),
            ],
            value_format: ValueFormat::Envelope,
            null_payload: NullPayload::Empty,
            on_bad_event: OnBadEvent::DeadLetter,
            dead_letter_topic: Some("outbox.dlq".into()),
        };
        assert!(
            good.routing_problems().is_empty(),
            "{:?}",
            good.routing_problems()
        );
        good.validate().unwrap();
    }

    #[test]
    fn exactly_once_options_are_checked_with_their_field_paths() {
        type Mutate = Box<dyn Fn(&mut PipelineConfig)>;
        let cases: Vec<(&str, Mutate)> = vec![
            (
                "transactional_id",
                Box::new(|c| c.transactional_id = Some("relay-a".into())),
            ),
            (
                "checkpoint_topic",
                Box::new(|c| c.checkpoint_topic = Some("checkpoints".into())),
            ),
            (
                "transactional_id",
                Box::new(|c| {
                    c.exactly_once = true;
                    c.transactional_id = Some(String::new());
                }),
            ),
            (
                "checkpoint_topic",
                Box::new(|c| {
                    c.exactly_once = true;
                    c.checkpoint_topic = Some("check points".into());
                }),
            ),
            (
                "kafka.properties",
                Box::new(|c| {
                    c.exactly_once = true;
                    c.kafka.properties = vec![("transactional.id".into(), "x".into())];
                }),
            ),
        ];
        for (field, mutate) in cases {
            let mut c = config();
            mutate(&mut c);
            let problems = c.exactly_once_problems();
            assert!(
                problems.iter().any(|p| p.field == field),
                "{field}: {problems:?}"
            );
            assert_eq!(c.validate().unwrap_err().field, problems[0].field);
        }
        let mut c = config();
        c.exactly_once = true;
        c.validate().unwrap();
        assert_eq!(c.transactional_id(), "outbox-relay-main");
        assert_eq!(c.checkpoint_topic(), "outbox-relay.checkpoints");
        c.transactional_id = Some("orders-relay".into());
        c.checkpoint_topic = Some("relay.checkpoints".into());
        c.validate().unwrap();
        assert_eq!(c.transactional_id(), "orders-relay");
        assert_eq!(c.checkpoint_topic(), "relay.checkpoints");
    }

    #[test]
    fn parses_table_names() {
        let table = |s: &str| s.parse::<TableName>().ok().map(|t| (t.schema, t.name));
        let pair = |a: &str, b: &str| Some((a.to_owned(), b.to_owned()));
        assert_eq!(table("outbox"), pair("public", "outbox"));
        assert_eq!(table("app.events"), pair("app", "events"));
        // Quoted parts follow PostgreSQL's rules; unquoted ones are taken as written.
        assert_eq!(
            table(r#""Billing-Prod"."Outbox""#),
            pair("Billing-Prod", "Outbox")
        );
        assert_eq!(table("Billing-Prod.Outbox"), pair("Billing-Prod", "Outbox"));
        assert_eq!(table(r#""Outbox""#), pair("public", "Outbox"));
        assert_eq!(table(r#"app."my.table""#), pair("app", "my.table"));
        assert_eq!(table(r#""say ""hi"""."x""#), pair(r#"say "hi""#, "x"));
        for bad in [
            "a.b.c",
            ".x",
            "x.",
            "",
            r#""""#,
            r#""open"#,
            r#""a"b"#,
            r#"a"b""#,
            "my table",
            r#""a".b.c"#,
            r#""a"."#,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("public.{}", "x".repeat(64))])
        {
            let err = bad.parse::<TableName>().unwrap_err();
            assert_eq!(err.field, "table", "{bad:?}: {err}");
        }
    }

    #[test]
    fn table_names_print_as_they_parse() {
        for (text, display, quoted) in [
            ("outbox", "public.outbox", r#""public"."outbox""#),
            (
                r#""Billing-Prod"."Outbox""#,
                r#""Billing-Prod"."Outbox""#,
                r#""Billing-Prod"."Outbox""#,
            ),
            (r#"app."a""b""#, r#"app."a""b""#, r#""app"."a""b""#),
        ] {
            let table: TableName = text.parse().unwrap();
            assert_eq!(table.to_string(), display);
            assert_eq!(table.quoted(), quoted);
            assert_eq!(display.parse::<TableName>().unwrap(), table);
        }
    }

    proptest::proptest! {
        /// Any name PostgreSQL can store prints (`Display`) as text that parses back to it.
        #[test]
        fn table_names_round_trip(
            // At most 15 characters of at most 4 bytes: within PostgreSQL's 63 bytes.
            schema in "[^\\x00]{1,15}",
            name in "[^\\x00]{1,15}",
        ) {
            let table = TableName { schema, name };
            let text = table.to_string();
            proptest::prop_assert_eq!(text.parse::<TableName>().ok(), Some(table), "{}", text);
        }
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact_url("postgres://u:pa/ss@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(
            redact_url("host=h password=secret user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(
            redact_url("host=h password = 'a b\\' c' user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=require&password=secret"),
            "postgres://u@h/db?sslmode=require&password=***"
        );
        assert!(!format!("{:?}", config()).contains(":pw@"));
    }
}
