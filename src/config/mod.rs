//! Pipeline configuration as plain data: typed, serde's one schema for the flags, the config
//! file, its environment overrides and `import-debezium`'s output.
//!
//! One [`PipelineConfig`] per source database: a `[[pipelines]]` entry of the file (see
//! [`file`](mod@file)), or the single-database flags. This module depends on no other part of the relay;
//! the checks that need one (the router's template and regex, the source URL's syntax) live
//! there and [`crate::validation`] runs them all once at start.

use std::time::Duration;

use serde::{Deserialize, Serialize};

mod event_limit;
pub mod file;
mod kafka;
pub mod polling;
pub mod reference;
mod route;
pub mod secret_file;
pub mod sink;
mod summary;
mod table;
mod url;

pub use event_limit::{
    EventLimit, DEFAULT_KAFKA_MAX_EVENT_BYTES, DEFAULT_NATS_MAX_EVENT_BYTES,
    DEFAULT_UNBOUNDED_SINK_MAX_EVENT_BYTES,
};
use kafka::REQUIRED_KAFKA_PROPERTIES;
pub use kafka::{CreateTopics, KafkaConfig};
pub use polling::{MarkMode, PollingConfig, SourceKind};
pub use route::{
    matches_destination, validate_topic, AdditionalPlacement, ByteaFormat, CloudEventsConfig,
    CloudEventsMode, EmptyPayload, InvalidOpBehavior, JsonPayload, MissingPlacementColumn,
    NullPayload, OnBadEvent, OutboxColumns, Placement, RouteConfig, TopicCase, ValueFormat,
    DEFAULT_HEADERS_COLUMN,
};
pub use sink::{
    HttpConfig, NatsConfig, RabbitMqConfig, RedisConfig, Secret, SinkConfig, SinkUrl,
    DESTINATION_PLACEHOLDER,
};
pub use table::{quote_ident, TableName};
pub use url::{redact_url, redact_url_path, SourceUrl};

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
/// How long the oldest record may wait for the sink's acknowledgement before the pipeline is
/// `degraded` and `/readyz` fails: well above a healthy broker's worst round trip under a full
/// in-flight window, well below what an operator would call an outage.
pub const DEFAULT_MAX_EVENT_WAIT_SECS: u64 = 15;
/// Compacted topic for exactly-once checkpoints: one per Kafka cluster, keyed by pipeline name,
/// so several relays can share it.
pub const DEFAULT_CHECKPOINT_TOPIC: &str = "outbox-relay.checkpoints";
/// Most PostgreSQL transactions committed in one Kafka transaction in exactly-once mode: a
/// Kafka commit costs a coordinator round trip (19 ms on librdkafka's mock cluster), so a
/// backlog of small transactions needs hundreds per commit to keep up with at-least-once;
/// more buys little (bench/run.py, scenario 6).
pub const DEFAULT_EXACTLY_ONCE_MAX_BATCH_TRANSACTIONS: usize = 1_000;
/// Most record bytes (keys, values, headers) in one Kafka transaction in exactly-once mode:
/// bounds what an aborted batch sends again, well below `max_in_flight_bytes`.
pub const DEFAULT_EXACTLY_ONCE_MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// How long a Kafka transaction in exactly-once mode stays open for more PostgreSQL
/// transactions after its first one committed (milliseconds): a few ms keeps the latency low
/// at low rates, and a commit that is pending meanwhile fills the next batch anyway. A batch
/// also closes at once when the walsender reports it sent everything (a keepalive).
pub const DEFAULT_EXACTLY_ONCE_BATCH_LINGER_MS: u64 = 5;
/// Creating a missing slot at start is what a first run needs; once the relay streamed from a
/// slot, the slot record ([`DEFAULT_SLOT_RECORD`]) keeps a lost one from being created again.
pub const DEFAULT_CREATE_SLOT: bool = true;
/// Remembering each slot the relay streamed from is what keeps a lost slot from being
/// re-created silently on the next start (docs/concepts/guarantees.md, "A slot is never silently replaced").
pub const DEFAULT_SLOT_RECORD: bool = true;
/// The schema of the slot record table (`sql/slot_record.sql`): the relay's own, apart from
/// the application's tables.
pub const DEFAULT_SLOT_RECORD_SCHEMA: &str = "outbox_relay";

/// A configuration value that cannot work; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {field}: {problem}")]
pub struct ConfigError {
    pub field: String,
    pub problem: String,
}

impl ConfigError {
    pub fn new(field: &str, problem: impl Into<String>) -> Self {
        ConfigError {
            field: field.to_owned(),
            problem: problem.into(),
        }
    }

    /// The same problem with its field path under `prefix` (`pipelines[1]` + `slot`).
    pub fn under(self, prefix: &str) -> Self {
        ConfigError {
            field: format!("{prefix}.{}", self.field),
            problem: self.problem,
        }
    }
}

/// Every problem found in a configuration; `Display` lists them one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration:\n{}", .0.iter().map(|e| format!("  - {}: {}", e.field, e.problem)).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<ConfigError>);

/// The first problem, for callers whose error holds one (start-up validation lists them all).
impl From<ConfigErrors> for ConfigError {
    fn from(errors: ConfigErrors) -> Self {
        let mut problems = errors.0.into_iter();
        let first = problems
            .next()
            .unwrap_or_else(|| ConfigError::new("config", "invalid"));
        match problems.len() {
            0 => first,
            more => ConfigError {
                problem: format!("{} (and {more} more problems)", first.problem),
                ..first
            },
        }
    }
}

/// One source database and where its events go: a `[[pipelines]]` entry of the config file,
/// key for key, or what the single-database flags fill in.
///
/// `name` and `table` are required in the file; every other field has the default its
/// `DEFAULT_*` constant or its type's `Default` documents. After [`file::load`], `source_url`
/// holds the URL (`${NAME}` references and `source_url_file` resolved) and `kafka` the
/// pipeline's settings over the file's `[kafka]` defaults. [`crate::validation::pipelines`]
/// checks the values once at start.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Label in logs and metrics.
    pub name: String,
    /// libpq connection URL or `key=value` string of the source database.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    #[schemars(!skip_serializing_if)]
    pub source_url: SourceUrl,
    /// A file holding `source_url` (a mounted secret), instead of `source_url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub source_url_file: Option<String>,
    /// The source role's password, beside a URL without one: taken as written, so `@`, `#`
    /// or `/` need no percent-encoding (`${NAME}` takes it from the environment).
    ///
    /// After [`file::load`] it also holds what `source_password_file` read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub source_password: Option<Secret>,
    /// A file holding `source_password` (a mounted secret), instead of `source_password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub source_password_file: Option<String>,
    /// Logical replication slot (pgoutput); required with log tailing.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(!skip_serializing_if)]
    pub slot: String,
    /// Publication that includes the outbox table: its name exactly as stored, case and
    /// punctuation included, without quotes; required with log tailing.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(!skip_serializing_if)]
    pub publication: String,
    /// The outbox table: `schema.table`, or `table` for `public.table`; a part may be
    /// double-quoted as in SQL (`"Billing-Prod"."Outbox"`), an unquoted part is taken as
    /// written (no case folding). Required in a config file (the flag defaults to
    /// `public.outbox`).
    pub table: TableName,
    /// Log tailing (default; `slot`, `publication` and `create_slot` apply) or polling
    /// (`polling` applies).
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub source_kind: SourceKind,
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub polling: PollingConfig,
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub columns: OutboxColumns,
    /// Transactional logical decoding messages with this prefix are outbox events too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub message_prefix: Option<String>,
    /// The id of a message event that gives none.
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub message_default_id: MessageDefaultId,
    /// How events map to topics.
    ///
    /// Always written out: the topic names are what consumers see.
    #[serde(default)]
    pub route: RouteConfig,
    /// Extra columns put in the record, in this order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(!skip_serializing_if)]
    pub additional_placement: Vec<AdditionalPlacement>,
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub missing_placement_column: MissingPlacementColumn,
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub value_format: ValueFormat,
    /// The CloudEvents attributes and mode, with `value_format = "cloudevents"`.
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub cloudevents: CloudEventsConfig,
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub null_payload: NullPayload,
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub empty_payload: EmptyPayload,
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub bytea_format: ByteaFormat,
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub json_payload: JsonPayload,
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub on_bad_event: OnBadEvent,
    /// Required with `on_bad_event = "dead_letter"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub dead_letter_topic: Option<String>,
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub op_invalid_behavior: InvalidOpBehavior,
    /// Create the slot when it does not exist ([`DEFAULT_CREATE_SLOT`]).
    #[serde(
        default = "default_create_slot",
        skip_serializing_if = "is_default_create_slot"
    )]
    #[schemars(!skip_serializing_if)]
    pub create_slot: bool,
    /// Create the slot as a failover slot (PostgreSQL 17+: `FAILOVER`), which a standby with
    /// `sync_replication_slots = on` keeps in sync so that it survives a promotion; `setup`
    /// and the start also turn it on for an existing slot (with `create_slot = false` the start
    /// stops on one instead, exit code 3). Default false. An error on older servers and on a
    /// standby.
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub failover: bool,
    /// libpq URL of the physical standby that should keep the failover slot in sync, for
    /// `check` and `status` only (the relay never streams from it): they read its
    /// `sync_replication_slots`, `hot_standby_feedback`, `primary_slot_name`,
    /// `primary_conninfo` and its copy of the slot. `${NAME}` references are resolved as in
    /// `source_url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub standby_url: Option<SourceUrl>,
    /// Record in the source database (table `<slot_record_schema>.streamed_slots`) that this
    /// pipeline streamed from its slot, so that a start that finds the slot gone refuses to
    /// create it again ([`DEFAULT_SLOT_RECORD`]).
    #[serde(
        default = "default_slot_record",
        skip_serializing_if = "is_default_slot_record"
    )]
    #[schemars(!skip_serializing_if)]
    pub slot_record: bool,
    /// The schema of the slot record table, created if missing ([`DEFAULT_SLOT_RECORD_SCHEMA`]).
    #[serde(
        default = "default_slot_record_schema",
        skip_serializing_if = "is_default_slot_record_schema"
    )]
    #[schemars(!skip_serializing_if)]
    pub slot_record_schema: String,
    /// Where the events go (`kind` and its settings); default Kafka, with `kafka`.
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub sink: SinkConfig,
    /// The Kafka producer (with `sink` kind `kafka`, the default).
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub kafka: KafkaConfig,
    /// How often the confirmed position is sent to the walsender, ms (at most half its
    /// `wal_sender_timeout`).
    #[serde(
        default = "default_status_interval_ms",
        skip_serializing_if = "is_default_status_interval_ms"
    )]
    #[schemars(!skip_serializing_if)]
    pub status_interval_ms: u64,
    /// Records handed to the sink and not yet acknowledged before reading pauses.
    #[serde(
        default = "default_max_in_flight_events",
        skip_serializing_if = "is_default_max_in_flight_events"
    )]
    #[schemars(!skip_serializing_if)]
    pub max_in_flight_events: usize,
    /// Bytes (key, value and headers) of the records handed to the sink and not yet
    /// acknowledged before reading pauses.
    #[serde(
        default = "default_max_in_flight_bytes",
        skip_serializing_if = "is_default_max_in_flight_bytes"
    )]
    #[schemars(!skip_serializing_if)]
    pub max_in_flight_bytes: usize,
    /// The largest event the pipeline takes, bytes: the sum of the mapped columns' values as
    /// PostgreSQL printed them (id, aggregate type and id, event type, payload, headers and
    /// the columns routing and placements use). A larger row is refused before it is copied
    /// (its values are not rendered, routed or buffered for the sink): dead-lettered as a
    /// reference with `on_bad_event = "dead_letter"`, else the pipeline halts naming it.
    /// Unset: the sink's own maximum (Kafka: the producer's `message.max.bytes`; NATS 1 MiB;
    /// RabbitMQ: `sink.max_message_bytes`; Redis and HTTP 16 MiB).
    ///
    /// See [`PipelineConfig::max_event_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub max_event_bytes: Option<usize>,
    /// On SIGTERM, how long to wait for the sink's outstanding acknowledgements, seconds.
    #[serde(
        default = "default_shutdown_timeout_secs",
        skip_serializing_if = "is_default_shutdown_timeout_secs"
    )]
    #[schemars(!skip_serializing_if)]
    pub shutdown_timeout_secs: u64,
    /// Seconds a record may wait for the sink's
    /// acknowledgement before the pipeline reads as `degraded` and `/readyz` fails.
    #[serde(
        default = "default_max_event_wait_secs",
        skip_serializing_if = "is_default_max_event_wait_secs"
    )]
    #[schemars(!skip_serializing_if)]
    pub max_event_wait_secs: u64,
    /// When the slot is held by a walsender whose client has sent no status update for this
    /// long (seconds), terminate that walsender and take the slot over; `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub terminate_stale_walsender_after_secs: Option<u64>,
    /// Exactly-once mode: each PostgreSQL transaction's records and a checkpoint record go to
    /// Kafka in one Kafka transaction.
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub exactly_once: bool,
    /// Kafka `transactional.id` in exactly-once mode; `None`: `outbox-relay-<name>`. Stable
    /// across restarts and unique per pipeline: a relay started with the same id fences the
    /// one before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub transactional_id: Option<String>,
    /// Compacted topic for the checkpoints in exactly-once mode; unset:
    /// `outbox-relay.checkpoints`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub checkpoint_topic: Option<String>,
    /// Exactly-once mode: most PostgreSQL transactions in one Kafka transaction
    /// ([`DEFAULT_EXACTLY_ONCE_MAX_BATCH_TRANSACTIONS`]).
    #[serde(
        default = "default_exactly_once_max_batch_transactions",
        skip_serializing_if = "is_default_exactly_once_max_batch_transactions"
    )]
    #[schemars(!skip_serializing_if)]
    pub exactly_once_max_batch_transactions: usize,
    /// Exactly-once mode: most record bytes in one Kafka transaction; a transaction that
    /// passes it closes the batch after it ([`DEFAULT_EXACTLY_ONCE_MAX_BATCH_BYTES`]).
    #[serde(
        default = "default_exactly_once_max_batch_bytes",
        skip_serializing_if = "is_default_exactly_once_max_batch_bytes"
    )]
    #[schemars(!skip_serializing_if)]
    pub exactly_once_max_batch_bytes: usize,
    /// Exactly-once mode: milliseconds a Kafka transaction waits for more PostgreSQL
    /// transactions after its first one committed; 0: one per Kafka transaction unless more
    /// are read while a commit is pending ([`DEFAULT_EXACTLY_ONCE_BATCH_LINGER_MS`]).
    #[serde(
        default = "default_exactly_once_batch_linger_ms",
        skip_serializing_if = "is_default_exactly_once_batch_linger_ms"
    )]
    #[schemars(!skip_serializing_if)]
    pub exactly_once_batch_linger_ms: u64,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Serde's defaults of [`PipelineConfig`] and their `skip_serializing_if` twins: the
/// `DEFAULT_*` constants.
macro_rules! defaults {
    ($($default:ident, $is_default:ident: $ty:ty = $value:expr;)*) => {$(
        fn $default() -> $ty {
            $value
        }
        fn $is_default(value: &$ty) -> bool {
            *value == $value
        }
    )*};
}

defaults! {
    default_create_slot, is_default_create_slot: bool = DEFAULT_CREATE_SLOT;
    default_slot_record, is_default_slot_record: bool = DEFAULT_SLOT_RECORD;
    default_slot_record_schema, is_default_slot_record_schema: String = DEFAULT_SLOT_RECORD_SCHEMA.to_owned();
    default_status_interval_ms, is_default_status_interval_ms: u64 = DEFAULT_STATUS_INTERVAL_MS;
    default_max_in_flight_events, is_default_max_in_flight_events: usize = DEFAULT_MAX_IN_FLIGHT_EVENTS;
    default_max_in_flight_bytes, is_default_max_in_flight_bytes: usize = DEFAULT_MAX_IN_FLIGHT_BYTES;
    default_shutdown_timeout_secs, is_default_shutdown_timeout_secs: u64 = DEFAULT_SHUTDOWN_TIMEOUT_SECS;
    default_max_event_wait_secs, is_default_max_event_wait_secs: u64 = DEFAULT_MAX_EVENT_WAIT_SECS;
    default_exactly_once_max_batch_transactions, is_default_exactly_once_max_batch_transactions: usize = DEFAULT_EXACTLY_ONCE_MAX_BATCH_TRANSACTIONS;
    default_exactly_once_max_batch_bytes, is_default_exactly_once_max_batch_bytes: usize = DEFAULT_EXACTLY_ONCE_MAX_BATCH_BYTES;
    default_exactly_once_batch_linger_ms, is_default_exactly_once_batch_linger_ms: u64 = DEFAULT_EXACTLY_ONCE_BATCH_LINGER_MS;
}

/// The id a logical decoding message event gets when its JSON has no `id`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum MessageDefaultId {
    /// `pg-<system identifier>-<timeline>-<LSN>`: unique across clusters and across a
    /// failover's timelines (the timeline that wrote the LSN, the same on every replay).
    #[default]
    Origin,
    /// `lsn-<LSN>`: unique within one cluster's timeline only.
    Lsn,
}

impl PipelineConfig {
    /// The pipeline `name` reading `table`, every other field at its default (as a file entry
    /// with only these two keys): no source URL, slot or publication yet, no Kafka brokers.
    pub fn new(name: impl Into<String>, table: TableName) -> Self {
        PipelineConfig {
            name: name.into(),
            source_url: SourceUrl::default(),
            source_url_file: None,
            source_password: None,
            source_password_file: None,
            slot: String::new(),
            publication: String::new(),
            table,
            source_kind: SourceKind::default(),
            polling: PollingConfig::default(),
            columns: OutboxColumns::default(),
            message_prefix: None,
            message_default_id: MessageDefaultId::default(),
            route: RouteConfig::default(),
            additional_placement: Vec::new(),
            missing_placement_column: MissingPlacementColumn::default(),
            value_format: ValueFormat::default(),
            cloudevents: CloudEventsConfig::default(),
            null_payload: NullPayload::default(),
            empty_payload: EmptyPayload::default(),
            bytea_format: ByteaFormat::default(),
            json_payload: JsonPayload::default(),
            on_bad_event: OnBadEvent::default(),
            dead_letter_topic: None,
            op_invalid_behavior: InvalidOpBehavior::default(),
            create_slot: DEFAULT_CREATE_SLOT,
            failover: false,
            standby_url: None,
            slot_record: DEFAULT_SLOT_RECORD,
            slot_record_schema: DEFAULT_SLOT_RECORD_SCHEMA.to_owned(),
            sink: SinkConfig::default(),
            kafka: KafkaConfig::default(),
            status_interval_ms: DEFAULT_STATUS_INTERVAL_MS,
            max_in_flight_events: DEFAULT_MAX_IN_FLIGHT_EVENTS,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            max_event_bytes: None,
            shutdown_timeout_secs: DEFAULT_SHUTDOWN_TIMEOUT_SECS,
            max_event_wait_secs: DEFAULT_MAX_EVENT_WAIT_SECS,
            terminate_stale_walsender_after_secs: None,
            exactly_once: false,
            transactional_id: None,
            checkpoint_topic: None,
            exactly_once_max_batch_transactions: DEFAULT_EXACTLY_ONCE_MAX_BATCH_TRANSACTIONS,
            exactly_once_max_batch_bytes: DEFAULT_EXACTLY_ONCE_MAX_BATCH_BYTES,
            exactly_once_batch_linger_ms: DEFAULT_EXACTLY_ONCE_BATCH_LINGER_MS,
        }
    }

    /// A valid log-tailing pipeline `main` for unit tests: a source URL with the password
    /// `pw`, slot `outbox_relay`, publication `outbox_pub`, table `public.outbox`, brokers
    /// `localhost:9092`.
    #[cfg(test)]
    pub(crate) fn test_pipeline() -> Self {
        PipelineConfig {
            source_url: "postgres://relay:pw@localhost/app".into(),
            slot: "outbox_relay".into(),
            publication: "outbox_pub".into(),
            kafka: KafkaConfig {
                bootstrap_servers: "localhost:9092".into(),
                properties: vec![],
                properties_file: None,
                create_topics: None,
            },
            ..PipelineConfig::new("main", "public.outbox".parse().unwrap())
        }
    }

    /// Checks the fields this module can judge on its own: names, the source kind's options,
    /// Kafka settings, limits, exactly-once options. The router's options and the source URL
    /// are checked by [`crate::router::Router::new`] and
    /// [`PipelineConfig::source_config`]; [`crate::validation`] runs all of them.
    ///
    /// Returns every problem found, each naming its field path and the constraint.
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        if self.name.is_empty() {
            problems.push(ConfigError::new("name", "must not be empty"));
        }
        match self.source_kind {
            SourceKind::Polling => {
                problems.extend(self.polling.problems());
                if self.message_prefix.is_some() {
                    problems.push(ConfigError::new(
                        "message_prefix",
                        "logical decoding messages need source_kind = \"log_tailing\"",
                    ));
                }
            }
            SourceKind::LogTailing => {
                let required = "required with source_kind = \"log_tailing\"";
                // PostgreSQL's rule for slot names (ReplicationSlotValidateName).
                if self.slot.is_empty() {
                    problems.push(ConfigError::new("slot", required));
                } else if self.slot.len() > 63
                    || !self
                        .slot
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                {
                    problems.push(ConfigError::new(
                        "slot",
                        format!("{:?} must be 1-63 characters of a-z, 0-9 and _", self.slot),
                    ));
                }
                if self.publication.is_empty() {
                    problems.push(ConfigError::new("publication", required));
                }
                if self.slot_record && self.slot_record_schema.is_empty() {
                    problems.push(ConfigError::new(
                        "slot_record_schema",
                        "must not be empty (or set slot_record = false)",
                    ));
                }
            }
        }
        if self.source_kind == SourceKind::Polling {
            for (field, set) in [
                ("failover", self.failover),
                ("standby_url", self.standby_url.is_some()),
            ] {
                if set {
                    problems.push(ConfigError::new(
                        field,
                        "is about the replication slot: only with source_kind = \"log_tailing\"",
                    ));
                }
            }
        }
        if self
            .standby_url
            .as_ref()
            .is_some_and(|url| url.trim().is_empty())
        {
            problems.push(ConfigError::new(
                "standby_url",
                "must not be empty when set",
            ));
        }
        // Unlike `table`, the publication is a name as PostgreSQL stores it.
        if self.publication.starts_with('"') && self.publication.ends_with('"') {
            problems.push(ConfigError::new(
                "publication",
                format!(
                    "{:?}: write the name without quotes; it is used exactly as written",
                    self.publication
                ),
            ));
        }
        problems.extend(self.exactly_once_problems());
        problems.extend(self.sink.problems());
        if self.sink != SinkConfig::Kafka && self.exactly_once {
            problems.push(ConfigError::new(
                "exactly_once",
                format!(
                    "needs Kafka transactions: not available with sink kind {:?}",
                    self.sink.kind()
                ),
            ));
        }
        if self.sink == SinkConfig::Kafka && self.kafka.bootstrap_servers.trim().is_empty() {
            problems.push(ConfigError::new(
                "kafka.bootstrap_servers",
                "must not be empty",
            ));
        }
        for (key, value) in &self.kafka.properties {
            if key == "bootstrap.servers" {
                problems.push(ConfigError::new(
                    "kafka.properties",
                    "bootstrap.servers: set kafka.bootstrap_servers instead",
                ));
            }
            if let Some((_, required)) = REQUIRED_KAFKA_PROPERTIES.iter().find(|(k, _)| k == key) {
                if value != required {
                    problems.push(ConfigError::new(
                        "kafka.properties",
                        format!("{key}={value}: the relay needs {key}={required} for per-key order without loss"),
                    ));
                }
            }
        }
        if let Some(create) = &self.kafka.create_topics {
            for (field, text) in create.problems() {
                problems.push(ConfigError::new(
                    &format!("kafka.create_topics.{field}"),
                    text,
                ));
            }
        }
        for (field, value) in [
            ("status_interval_ms", self.status_interval_ms),
            ("max_in_flight_events", self.max_in_flight_events as u64),
            ("max_in_flight_bytes", self.max_in_flight_bytes as u64),
            ("max_event_wait_secs", self.max_event_wait_secs),
        ] {
            if value == 0 {
                problems.push(ConfigError::new(field, "must be greater than 0"));
            }
        }
        if self.max_event_bytes == Some(0) {
            problems.push(ConfigError::new(
                "max_event_bytes",
                "must be greater than 0",
            ));
        }
        if let Some(secs) = self.terminate_stale_walsender_after_secs {
            // A live relay replies every status interval: twice that is never stale.
            let min_secs = (2 * self.status_interval_ms).div_ceil(1_000).max(2);
            if secs < min_secs {
                problems.push(ConfigError::new(
                    "terminate_stale_walsender_after_secs",
                    format!("{secs} is too short: at least {min_secs} (twice status_interval_ms, and 2 s), so a live relay is never terminated"),
                ));
            }
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
            if let Err(reason) = validate_topic(topic) {
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

    /// Reads `source_password_file` into `source_password`, as [`file::load`] does for a
    /// file's pipelines (the single-database flags).
    ///
    /// Returns an error naming the setting if both are given or the file cannot be read.
    pub fn read_source_password_file(&mut self) -> Result<(), ConfigError> {
        let Some(file) = self.source_password_file.take() else {
            return Ok(());
        };
        if self.source_password.is_some() {
            return Err(ConfigError::new(
                "source_password",
                "set one of source_password and source_password_file, not both",
            ));
        }
        let password = secret_file::read(&file, "source_password_file").map_err(|e| {
            ConfigError::new("source_password_file", format!("cannot read {file:?}: {e}"))
        })?;
        self.source_password = Some(Secret(password));
        Ok(())
    }

    pub fn status_interval(&self) -> Duration {
        Duration::from_millis(self.status_interval_ms)
    }

    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout_secs)
    }

    /// `max_event_wait_secs` as a duration.
    pub fn max_event_wait(&self) -> Duration {
        Duration::from_secs(self.max_event_wait_secs)
    }

    /// `terminate_stale_walsender_after_secs` as a duration.
    pub fn terminate_stale_walsender_after(&self) -> Option<Duration> {
        self.terminate_stale_walsender_after_secs
            .map(Duration::from_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PipelineConfig {
        PipelineConfig::test_pipeline()
    }

    /// A sink's URL is shown as far as its host (a webhook's path may hold a token); a
    /// PostgreSQL URL keeps its database name, without its password.
    #[test]
    fn sink_urls_are_shown_as_far_as_their_host() {
        assert_eq!(
            redact_url_path("https://u:pw@hooks.example.com/T0/B1/s3cret?x=1"),
            "https://u:***@hooks.example.com/***"
        );
        assert_eq!(redact_url_path("http://h:8080"), "http://h:8080");
        assert_eq!(
            redact_url_path("postgres://relay:pw@db:5432/app"),
            "postgres://relay:***@db:5432/app"
        );
    }

    #[test]
    fn redacts_passwords_with_unencoded_characters_and_as_pass() {
        assert_eq!(
            redact_url("redis://relay:ab?cd@cache:6379"),
            "redis://relay:***@cache:6379"
        );
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?db=0&pass=secret"),
            "redis+unix:///run/redis.sock?db=0&pass=***"
        );
        // A webhook URL's token, key or signature (the sink's config is logged at start).
        assert_eq!(
            redact_url("https://h/in?Token=s3cret&v=1&code=abc&sig=x"),
            "https://h/in?Token=***&v=1&code=***&sig=***"
        );
        assert_eq!(
            redact_url(
                "postgres://h/db?sslpassword=x&sslkey=/k.pem&application_name=keys&pass%77ord=y"
            ),
            "postgres://h/db?sslpassword=***&sslkey=/k.pem&application_name=keys&pass%77ord=***"
        );
        assert_eq!(
            redact_url("https://s3/b?X-Amz-Security-Token=t&X-Amz-Signature=s&client_secret=c"),
            "https://s3/b?X-Amz-Security-Token=***&X-Amz-Signature=***&client_secret=***"
        );
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
        // A key in capitals (libpq refuses it, and its error must not show the value).
        assert_eq!(
            redact_url("host=h PASSWORD=secret user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=require&password=secret"),
            "postgres://u@h/db?sslmode=require&password=***"
        );
        assert!(!format!("{:?}", config()).contains(":pw@"));
    }

    #[test]
    fn the_slot_record_is_on_by_default_and_its_schema_must_be_named() {
        let defaults = config();
        assert!(defaults.slot_record);
        assert_eq!(defaults.slot_record_schema, "outbox_relay");
        assert!(defaults.problems().is_empty());
        let unnamed = PipelineConfig {
            slot_record_schema: String::new(),
            ..config()
        };
        assert_eq!(
            unnamed.problems(),
            vec![ConfigError::new(
                "slot_record_schema",
                "must not be empty (or set slot_record = false)"
            )]
        );
        let off = PipelineConfig {
            slot_record: false,
            ..unnamed
        };
        assert!(off.problems().is_empty());
        let parsed: PipelineConfig = toml::from_str(
            "name = \"a\"\ntable = \"public.outbox\"\nslot_record = false\nslot_record_schema = \"relay_state\"\n",
        )
        .unwrap();
        assert!(!parsed.slot_record);
        assert_eq!(parsed.slot_record_schema, "relay_state");
        // Defaults are not written out (import-debezium's output stays short).
        let written =
            toml::to_string(&PipelineConfig::new("a", "public.outbox".parse().unwrap())).unwrap();
        assert!(!written.contains("slot_record"), "{written}");
    }
}
