//! Debezium Server's `application.properties`: `debezium.source.*` is a PostgreSQL connector's
//! configuration, `debezium.transforms*` its transforms, and `debezium.sink.type` with
//! `debezium.sink.<type>.*` the sink. The source and the outbox transform are translated as a
//! connector's ([`super::translate`]); the sink becomes the pipeline's `sink` table (or its
//! Kafka settings). What is not carried over comes back as a [`Note`]; passwords become
//! `${NAME}` environment references.

use std::collections::BTreeMap;

use super::{render, sorted, translate_parts, Connector, ImportError, Imported, Note, Severity};
use crate::config::sink::NatsUrl;
use crate::config::JsonPayload;
use crate::config::{
    HttpConfig, KafkaConfig, NatsConfig, RabbitMqConfig, RedisConfig, SinkConfig, SinkUrl,
};

const SOURCE: &str = "debezium.source.";
const TRANSFORMS: &str = "debezium.transforms";
const SINK: &str = "debezium.sink.";

/// Sink types outbox-relay has, as Debezium Server names them.
const SINK_TYPES: &[&str] = &["kafka", "redis", "nats-jetstream", "rabbitmq", "http"];

/// Debezium Server's HTTP sink: its header prefix and request timeout when not set.
const DEBEZIUM_HTTP_HEADER_PREFIX: &str = "X-DEBEZIUM-";
const DEBEZIUM_HTTP_TIMEOUT_MS: u64 = 60_000;

/// Whether `connector` is a Debezium Server file (it has `debezium.source.*` or
/// `debezium.sink.type`) rather than a Kafka Connect connector.
pub(super) fn is_server(connector: &Connector) -> bool {
    connector
        .options
        .keys()
        .any(|k| k.starts_with(SOURCE) || k == "debezium.sink.type")
}

/// Translates a Debezium Server configuration.
///
/// Returns an error if the source is not Debezium's PostgreSQL connector with an Outbox Event
/// Router transform, or if `debezium.sink.type` is missing or names a sink outbox-relay does not
/// have.
pub(super) fn translate(server: &Connector) -> Result<Imported, ImportError> {
    let mut source = BTreeMap::new();
    let mut sink = BTreeMap::new();
    let mut other = Vec::new();
    for (key, value) in &server.options {
        if let Some(option) = key.strip_prefix(SOURCE) {
            source.insert(option.to_owned(), value.clone());
        } else if let Some(rest) = key.strip_prefix(TRANSFORMS) {
            source.insert(format!("transforms{rest}"), value.clone());
        } else if let Some(option) = key.strip_prefix(SINK) {
            sink.insert(option.to_owned(), value.clone());
        } else {
            other.push(key.clone());
        }
    }
    let kind = sink
        .remove("type")
        .ok_or_else(|| ImportError::Unsupported {
            option: "debezium.sink.type".into(),
            reason: "not set: Debezium Server needs a sink type".into(),
        })?;
    if !SINK_TYPES.contains(&kind.as_str()) {
        return Err(ImportError::Unsupported {
            option: "debezium.sink.type".into(),
            reason: format!(
                "{kind:?}: outbox-relay has no such sink (it has {})",
                SINK_TYPES.join(", ")
            ),
        });
    }
    let connector = Connector {
        name: server.name.clone(),
        options: source,
    };
    let (mut file, mut comments, mut notes) = translate_parts(&connector).map_err(|e| match e {
        ImportError::Refused { mut notes } => {
            for note in &mut notes {
                note.option = original_name(&note.option);
            }
            ImportError::Refused { notes }
        }
        e => e,
    })?;
    // Debezium Server has no converters: its value format is `debezium.format.value`.
    notes.retain(|n| {
        n.option != "value.converter" || connector.options.contains_key("value.converter")
    });
    for note in &mut notes {
        note.option = original_name(&note.option);
    }
    if !server.options.contains_key("debezium.format.value") {
        notes.push(Note {
            severity: Severity::Difference,
            option: "debezium.format.value".into(),
            reason: "not set, so Debezium Server wrote values in its json format (a text payload column as a quoted JSON string); outbox-relay writes the payload text itself: check your consumers".into(),
        });
    }
    let expanded = file.pipelines[0].json_payload == JsonPayload::DebeziumExpanded;
    for key in other {
        if key == "debezium.format.value" {
            let value = server.options.get(&key).cloned().unwrap_or_default();
            let schemas = server
                .options
                .get("debezium.format.value.schemas.enable")
                .and_then(|v| super::boolean(v));
            notes.push(value_format(key, &value, expanded, schemas));
            continue;
        }
        let reason = if key.starts_with("debezium.format.") {
            "Debezium Server's output format: outbox-relay writes the payload column as the value (the outbox transform's output) and headers as its sink kind carries them"
        } else if key.starts_with("quarkus.") {
            "a Quarkus runtime setting of Debezium Server: not used (logging: RUST_LOG; metrics: [metrics] listen)"
        } else {
            "not a Debezium Server option outbox-relay knows"
        };
        notes.push(Note::info(key, reason));
    }
    let env_prefix = env_prefix(&file.pipelines[0].name);
    let pipeline = &mut file.pipelines[0];
    let mut sink = SinkOptions {
        kind: kind.clone(),
        options: sink,
        notes: Vec::new(),
        env_prefix,
    };
    match kind.as_str() {
        "kafka" => {
            let mut properties = std::mem::take(&mut pipeline.kafka.properties);
            for (option, value) in sink.take_prefixed("producer.") {
                match option.as_str() {
                    "bootstrap.servers" => file.kafka.bootstrap_servers = value,
                    "key.serializer" | "value.serializer" => sink.note(
                        &format!("producer.{option}"),
                        "outbox-relay writes keys and values as bytes; no serializer to set",
                    ),
                    "acks" | "enable.idempotence" => sink.note(
                        &format!("producer.{option}"),
                        "outbox-relay always uses acks=all and enable.idempotence=true",
                    ),
                    _ if super::SAME_PRODUCER_PROPERTIES.contains(&option.as_str()) => {
                        properties.push((option, value))
                    }
                    // A Java property (sasl.jaas.config, buffer.memory, ...): librdkafka would
                    // refuse it, and its value may be a secret, never printed.
                    _ => sink.note(
                        &format!("producer.{option}"),
                        "a Java producer property: set the librdkafka equivalent under kafka.properties by hand",
                    ),
                }
            }
            pipeline.kafka.properties = properties;
            if !file.kafka.bootstrap_servers.starts_with("${") {
                comments.retain(|c| !c.starts_with("[kafka] bootstrap_servers"));
            }
        }
        "redis" | "nats-jetstream" | "rabbitmq" | "http" => {
            pipeline.sink = match kind.as_str() {
                "redis" => SinkConfig::Redis(sink.redis(&mut comments)),
                "nats-jetstream" => SinkConfig::Nats(sink.nats(&mut comments)),
                "rabbitmq" => {
                    let (rabbitmq, routing_key) = sink.rabbitmq(&mut comments);
                    if let Some(key) = routing_key {
                        // Debezium sent every message with this one routing key.
                        pipeline.route.topic_template = key;
                    }
                    SinkConfig::RabbitMq(rabbitmq)
                }
                _ => SinkConfig::Http(sink.http(&mut comments)),
            };
            drop_kafka(
                &mut file.kafka,
                &mut pipeline.kafka,
                &mut comments,
                &mut notes,
            );
        }
        _ => unreachable!("checked against SINK_TYPES"),
    }
    sink.note_the_rest();
    notes.extend(sink.notes);
    comments[0] = comments[0].replace("Debezium connector", "Debezium Server configuration");
    Ok(Imported {
        toml: render(&comments, &file),
        notes: sorted(notes),
    })
}

/// How Debezium Server's `debezium.format.value` compares with what the relay writes;
/// `schemas` is `debezium.format.value.schemas.enable` when given.
fn value_format(option: String, value: &str, expanded: bool, schemas: Option<bool>) -> Note {
    match value.trim().to_ascii_lowercase().as_str() {
        "simplestring" | "binary" => Note::info(option, format!("{value}: not needed: outbox-relay writes the payload text, or a bytea payload's bytes, too")),
        "json" if expanded && schemas == Some(false) => Note::info(option, "json without schemas, with table.expand.json.payload: the same bytes as json_payload = \"debezium_expanded\" writes"),
        "avro" | "protobuf" => Note::difference(option, format!("{value}: not supported: Avro and Protobuf with a schema registry; outbox-relay registers no schemas and writes the payload as it is stored, because no schema registry can be run to test against")),
        _ => Note::difference(option, format!("{value}: Debezium Server wrote the payload in that format (json: a text payload as a quoted JSON string, with a schema wrapper unless schemas.enable=false); outbox-relay writes the payload text itself: check your consumers")),
    }
}

/// A connector option's name as Debezium Server writes it.
fn original_name(option: &str) -> String {
    match option.strip_prefix("transforms") {
        Some(rest) => format!("{TRANSFORMS}{rest}"),
        None => format!("{SOURCE}{option}"),
    }
}

/// `ORDERS_DB` from a pipeline name, for environment references.
fn env_prefix(name: &str) -> String {
    name.chars()
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c.to_ascii_uppercase(),
            false => '_',
        })
        .collect()
}

/// A non-Kafka sink needs no Kafka settings: the `[kafka]` default and the connector's
/// producer overrides go, with a note for each override.
fn drop_kafka(
    file_kafka: &mut KafkaConfig,
    pipeline_kafka: &mut KafkaConfig,
    comments: &mut Vec<String>,
    notes: &mut Vec<Note>,
) {
    *file_kafka = KafkaConfig::default();
    for (key, _) in std::mem::take(&mut pipeline_kafka.properties) {
        notes.push(Note::info(
            format!("{SOURCE}producer.override.{key}"),
            "a Kafka producer setting: this pipeline's sink is not Kafka",
        ));
    }
    comments.retain(|c| !c.starts_with("[kafka] bootstrap_servers"));
}

/// `debezium.sink.<kind>.*` options being carried over.
struct SinkOptions {
    kind: String,
    /// Without the `debezium.sink.` prefix: `redis.address`, ...
    options: BTreeMap<String, String>,
    notes: Vec<Note>,
    env_prefix: String,
}

impl SinkOptions {
    /// Removes and returns `debezium.sink.<kind>.<option>`.
    fn take(&mut self, option: &str) -> Option<String> {
        self.options.remove(&format!("{}.{option}", self.kind))
    }

    /// Removes and returns every `debezium.sink.<kind>.<prefix>*`, without that prefix.
    fn take_prefixed(&mut self, prefix: &str) -> Vec<(String, String)> {
        let full = format!("{}.{prefix}", self.kind);
        let keys: Vec<String> = self
            .options
            .keys()
            .filter(|k| k.starts_with(&full))
            .cloned()
            .collect();
        keys.into_iter()
            .map(|k| {
                let value = self.options.remove(&k).expect("listed key");
                (k[full.len()..].to_owned(), value)
            })
            .collect()
    }

    fn note(&mut self, option: &str, reason: impl Into<String>) {
        self.notes
            .push(Note::info(format!("{SINK}{}.{option}", self.kind), reason));
    }

    fn difference(&mut self, option: &str, reason: impl Into<String>) {
        self.notes.push(Note::difference(
            format!("{SINK}{}.{option}", self.kind),
            reason,
        ));
    }

    /// A password option as an environment reference: `${PREFIX_<WHAT>_PASSWORD}`, with a
    /// comment saying to set it (an `${env:NAME}` reference keeps its name).
    fn password(&mut self, option: &str, what: &str, comments: &mut Vec<String>) -> Option<String> {
        let value = self.take(option)?;
        let var = match value
            .strip_prefix("${env:")
            .and_then(|rest| rest.strip_suffix('}'))
        {
            Some(name) => name.to_owned(),
            None => format!("{}_{what}_PASSWORD", self.env_prefix),
        };
        comments.push(format!(
            "sink.url: the {what} password is not copied: set {var} in the relay's environment."
        ));
        Some(format!("${{{var}}}"))
    }

    /// `url` with the password of its user info (`scheme://user:secret@host`) replaced by an
    /// environment reference `${PREFIX_<WHAT>_PASSWORD}`, with a comment saying to set it: the
    /// output file is not a place for a secret.
    fn url_without_password(&self, url: &str, what: &str, comments: &mut Vec<String>) -> String {
        let Some(scheme_end) = url.find("://") else {
            return url.to_owned();
        };
        let rest = &url[scheme_end + 3..];
        let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
        let Some(at) = authority.rfind('@') else {
            return url.to_owned();
        };
        let Some(colon) = authority[..at].find(':') else {
            return url.to_owned();
        };
        if authority[colon + 1..at].starts_with("${") {
            return url.to_owned();
        }
        let var = format!("{}_{what}_PASSWORD", self.env_prefix);
        comments.push(format!(
            "sink.url: the {what} password is not copied: set {var} in the relay's environment."
        ));
        format!(
            "{}{}:${{{var}}}{}",
            &url[..scheme_end + 3],
            &authority[..colon],
            &rest[at..]
        )
    }

    /// `debezium.sink.redis.*` as a Redis sink.
    fn redis(&mut self, comments: &mut Vec<String>) -> RedisConfig {
        let address = self
            .take("address")
            .unwrap_or_else(|| "localhost:6379".into());
        let user = self.take("user");
        let password = self.password("password", "REDIS", comments);
        let tls = self
            .take("ssl.enabled")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let credentials = match (user, password) {
            (Some(user), Some(password)) => format!("{user}:{password}@"),
            (None, Some(password)) => format!(":{password}@"),
            (Some(user), None) => format!("{user}@"),
            (None, None) => String::new(),
        };
        let scheme = if tls { "rediss" } else { "redis" };
        if let Some(format) = self.take("message.format") {
            self.difference("message.format", format!("{format}: outbox-relay writes one entry per event with the fields id, event headers, key and payload (docs/how-to/sinks/redis.md), not Debezium's key -> value field"));
        } else {
            self.difference("message.format", "not set, so Debezium wrote each entry as one field named after the key holding the value; outbox-relay writes the fields id, event headers, key and payload (docs/how-to/sinks/redis.md): check your consumers");
        }
        RedisConfig {
            url: SinkUrl(format!("{scheme}://{credentials}{address}")),
            ..RedisConfig::default()
        }
    }

    /// `debezium.sink.nats-jetstream.*` as a NATS sink.
    fn nats(&mut self, comments: &mut Vec<String>) -> NatsConfig {
        let url = self
            .take("url")
            .unwrap_or_else(|| "nats://localhost:4222".into());
        let url = self.url_without_password(&url, "NATS", comments);
        if let Some(create) = self.take("create-stream") {
            let subjects = self.take("subjects").unwrap_or_default();
            let storage = self.take("storage").unwrap_or_default();
            self.note("create-stream", format!("{create}: outbox-relay never creates streams; create one that takes the pipeline's subjects (e.g. `nats stream add OUTBOX --subjects '*.events' --storage {}`; Debezium's subjects were {subjects:?}); `check` says whether one does", if storage.is_empty() { "file" } else { storage.as_str() }));
        }
        for option in ["auth.jwt", "auth.seed", "auth.user", "auth.password"] {
            if self.take(option).is_some() {
                self.note(option, "not copied: give the user and password in sink.url, or sink.token / nkey / credentials_file (docs/how-to/sinks/nats.md)");
            }
        }
        NatsConfig {
            url: NatsUrl(url),
            ..NatsConfig::default()
        }
    }

    /// `debezium.sink.rabbitmq.*` as a RabbitMQ sink, and the one routing key Debezium used
    /// for every message, if it did (`routingKey` without `routingKeyFromTopicName`).
    fn rabbitmq(&mut self, comments: &mut Vec<String>) -> (RabbitMqConfig, Option<String>) {
        let host = self
            .take("connection.host")
            .unwrap_or_else(|| "localhost".into());
        // The Java client's ConnectionFactory keys, under connection.: TLS on with
        // ssl.enabled, and its default port 5671 then.
        let tls = self
            .take("connection.ssl.enabled")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let port = self
            .take("connection.port")
            .unwrap_or_else(|| if tls { "5671" } else { "5672" }.into());
        for (option, _) in self.take_prefixed("connection.ssl.") {
            let what = match option.as_str() {
                "validate.server.certificate" | "verify.hostname" => "outbox-relay always verifies the server's certificate and host name, with the system's trusted roots (SSL_CERT_FILE / SSL_CERT_DIR)",
                _ => "not copied: outbox-relay takes TLS settings from the amqps:// URL and the system's trusted roots (SSL_CERT_FILE / SSL_CERT_DIR); key and trust stores do not carry over",
            };
            self.note(&format!("connection.ssl.{option}"), what);
        }
        let user = self.take("connection.username");
        let password = self.password("connection.password", "RABBITMQ", comments);
        let vhost = self
            .take("connection.virtual.host")
            .unwrap_or_else(|| "/".into());
        let credentials = match (user, password) {
            (Some(user), Some(password)) => format!("{user}:{password}@"),
            (Some(user), None) => format!("{user}@"),
            (None, Some(password)) => format!("guest:{password}@"),
            (None, None) => String::new(),
        };
        let vhost =
            percent_encoding::utf8_percent_encode(&vhost, percent_encoding::NON_ALPHANUMERIC);
        let exchange = self.take("exchange").unwrap_or_default();
        if exchange.is_empty() {
            // Debezium Server publishes to an exchange named after each topic then.
            self.difference("exchange", "not set: Debezium published each message to an exchange named after its topic (routing key \"\" unless set); outbox-relay publishes to one exchange, here the default one (routing key = the destination, which names the queue): declare a topic exchange, set sink.exchange and bind your queues to it by routing key");
        }
        let from_topic = self
            .take("routingKeyFromTopicName")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let routing_key = self
            .take("routingKey")
            .filter(|key| !from_topic && !key.is_empty());
        if routing_key.is_some() {
            self.note("routingKey", "became route.topic_template: every message keeps that one routing key (outbox-relay's default is the routed destination, <aggregate_type>.events)");
        }
        (
            RabbitMqConfig {
                url: SinkUrl(format!(
                    "{}://{credentials}{host}:{port}/{vhost}",
                    if tls { "amqps" } else { "amqp" }
                )),
                exchange,
                ..RabbitMqConfig::default()
            },
            routing_key,
        )
    }

    /// `debezium.sink.http.*` as an HTTP sink (every event to the one URL, as Debezium did),
    /// with Debezium's defaults for the header prefix and the request timeout where the file
    /// did not set them.
    fn http(&mut self, comments: &mut Vec<String>) -> HttpConfig {
        let url = self.take("url").unwrap_or_default();
        let mut http = HttpConfig {
            url: SinkUrl(self.url_without_password(&url, "HTTP", comments)),
            ..HttpConfig::default()
        };
        // Debezium Server's own defaults, where the file relied on them.
        http.header_prefix = self
            .take("headers.prefix")
            .unwrap_or_else(|| DEBEZIUM_HTTP_HEADER_PREFIX.into());
        http.request_timeout_ms = self
            .take("timeout.ms")
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(DEBEZIUM_HTTP_TIMEOUT_MS);
        if self.take("headers.encode.base64").as_deref() != Some("false") {
            self.difference("headers.encode.base64", "true or not set (Debezium's default): Debezium sent header values base64-encoded; outbox-relay sends them as text, so receivers that decode them must stop");
        }
        if self.take("authentication.type").is_some() {
            self.difference("authentication.type", "outbox-relay signs each request (Standard Webhooks, sink.secret_file) instead of sending a JWT");
        }
        http
    }

    /// Notes every option left, with the reason.
    fn note_the_rest(&mut self) {
        let rest: Vec<String> = self.options.keys().cloned().collect();
        for key in rest {
            let reason = match key.strip_prefix(&format!("{}.", self.kind)) {
                Some(option) if option.contains("batch") => "outbox-relay publishes each event on its own with per-key order; the sink's max_concurrency bounds what is in flight".to_owned(),
                Some(option) if option.contains("retry") || option.contains("retries") => "outbox-relay retries with backoff until the sink's delivery_timeout_ms".to_owned(),
                Some(_) => format!("not carried over to the {} sink", self.kind),
                None => format!("an option of another sink type (this one is {})", self.kind),
            };
            self.notes.push(Note::info(format!("{SINK}{key}"), reason));
        }
    }
}

#[cfg(test)]
mod tests;
