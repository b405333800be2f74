//! `outbox-relay import-debezium`: turns a Debezium PostgreSQL connector configuration with
//! the Outbox Event Router transform into an outbox-relay `[[pipelines]]` entry; a Debezium
//! Server `application.properties` (its source, transform and sink) too, in `server`.
//!
//! The translation keeps what consumers see today: topic names (Debezium's default is
//! `outbox.event.${routedByValue}`, not outbox-relay's `${routedByValue}.events`, so the
//! template is always written out), keys, the `id` header and the additional fields. Every
//! option that is not carried over comes back as a [`Note`] with the reason: nothing is dropped
//! silently. Secrets are never copied: the password becomes a `${NAME}` environment reference.
//!
//! Debezium routes by `route.by.field` (default `aggregatetype`) and has no other notion of an
//! aggregate type, while outbox-relay requires its aggregate type column and routes by it
//! unless `route.by_field` says otherwise. So `route.by.field` becomes `columns.aggregate_type`:
//! the same topics, and no column required that Debezium did not read.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use crate::config::file::FileConfig;
use crate::config::{
    AdditionalPlacement, EmptyPayload, InvalidOpBehavior, KafkaConfig, MissingPlacementColumn,
    NullPayload, OutboxColumns, PipelineConfig, Placement, RouteConfig, Secret, TableName,
    ValueFormat,
};

mod formats;
mod server;
mod tracing_options;

const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";
const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
/// Debezium's `route.topic.regex` default: the whole routing value as `routedByValue`.
const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";
const DEFAULT_TOPIC_REPLACEMENT: &str = "outbox.event.${routedByValue}";
/// Java producer properties with the same name and meaning in librdkafka.
pub(super) const SAME_PRODUCER_PROPERTIES: &[&str] = &[
    "batch.size",
    "client.id",
    "compression.type",
    "linger.ms",
    "sasl.mechanism",
    "security.protocol",
];

/// A Debezium connector configuration: its name, if given, and its options as strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connector {
    pub name: Option<String>,
    pub options: BTreeMap<String, String>,
}

/// An option (or a column default) that was not carried over as it was, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub option: String,
    pub reason: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.option, self.reason)
    }
}

/// The translation: TOML for a config file (the serialized [`FileConfig`] with one pipeline,
/// under comments), and the notes for the operator.
#[derive(Debug, Clone)]
pub struct Imported {
    pub toml: String,
    pub notes: Vec<Note>,
}

/// A connector configuration that cannot be translated.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a connector configuration: {reason}")]
    Format { path: String, reason: String },
    #[error("{option}: {reason}")]
    Unsupported { option: String, reason: String },
}

/// Reads `path` (a `.properties` file, else JSON: `{"name": ..., "config": {...}}` as posted to
/// Kafka Connect, or the bare config map) and translates it.
///
/// Returns an error if the file cannot be read or parsed, or if it is not a Debezium
/// PostgreSQL connector with an Outbox Event Router transform.
pub fn import_file(path: &Path) -> Result<Imported, ImportError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
        path: shown.clone(),
        source,
    })?;
    let parsed = if path.extension().is_some_and(|e| e == "properties") {
        parse_properties(&text)
    } else {
        parse_json(&text)
    };
    let connector = parsed.map_err(|reason| ImportError::Format {
        path: shown,
        reason,
    })?;
    if server::is_server(&connector) {
        return server::translate(&connector);
    }
    translate(&connector)
}

/// Parses a connector as JSON: `{"name": ..., "config": {...}}` or the config map itself.
/// Numbers and booleans become their text.
///
/// Returns an error naming the option whose value is not a string, number or boolean.
pub fn parse_json(text: &str) -> Result<Connector, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let serde_json::Value::Object(top) = value else {
        return Err("expected a JSON object".into());
    };
    let (name, map) = match top.get("config") {
        Some(serde_json::Value::Object(config)) => (
            top.get("name").and_then(|n| n.as_str()).map(str::to_owned),
            config.clone(),
        ),
        Some(_) => return Err("\"config\" is not an object".into()),
        None => (None, top),
    };
    let mut options = BTreeMap::new();
    for (key, value) in map {
        let text = match value {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            serde_json::Value::Null => continue,
            _ => return Err(format!("{key}: expected a string, number or boolean")),
        };
        options.insert(key, text);
    }
    Ok(with_name(name, options))
}

/// Parses a connector as a Java `.properties` file.
///
/// Returns an error naming the line that does not parse.
pub fn parse_properties(text: &str) -> Result<Connector, String> {
    let options = java_properties::read(text.as_bytes()).map_err(|e| e.to_string())?;
    Ok(with_name(None, options.into_iter().collect()))
}

fn with_name(name: Option<String>, mut options: BTreeMap<String, String>) -> Connector {
    let inner = options.remove("name");
    Connector {
        name: name.or(inner),
        options,
    }
}

/// Translates `connector` into an outbox-relay config and notes.
///
/// Returns an error if it is not a Debezium PostgreSQL connector, has no Outbox Event Router
/// transform, or its `table.fields.additional.placement` is malformed.
pub fn translate(connector: &Connector) -> Result<Imported, ImportError> {
    let (file, comments, notes) = translate_parts(connector)?;
    Ok(Imported {
        toml: render(&comments, &file),
        notes,
    })
}

/// What [`translate`] renders: the file with one pipeline, its header comments and the notes.
fn translate_parts(
    connector: &Connector,
) -> Result<(FileConfig, Vec<String>, Vec<Note>), ImportError> {
    let mut im = Importer {
        options: connector.options.clone(),
        used: BTreeSet::new(),
        notes: Vec::new(),
    };
    if let Some(class) = im.take("connector.class") {
        if class != POSTGRES_CONNECTOR {
            return Err(ImportError::Unsupported {
                option: "connector.class".into(),
                reason: format!(
                    "{class} is not Debezium's PostgreSQL connector ({POSTGRES_CONNECTOR})"
                ),
            });
        }
    }
    let aliases: Vec<String> = im
        .take("transforms")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .filter(|a| {
            im.options
                .get(&format!("transforms.{a}.type"))
                .map(String::as_str)
                == Some(EVENT_ROUTER)
        })
        .map(str::to_owned)
        .collect();
    let Some((alias, other_routers)) = aliases.split_first() else {
        return Err(ImportError::Unsupported {
            option: "transforms".into(),
            reason: format!(
                "no transform of type {EVENT_ROUTER}: this connector does not route outbox events"
            ),
        });
    };

    let name = connector
        .name
        .clone()
        .or_else(|| im.options.get("database.dbname").cloned())
        .unwrap_or_else(|| "outbox".into());
    let env_prefix: String = name
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c.to_ascii_uppercase(),
            false => '_',
        })
        .collect();
    let source_url = im.source_url(&env_prefix);
    let (slot, new_slot) = im.slot();
    let publication = im
        .take("publication.name")
        .unwrap_or_else(|| "dbz_publication".into());
    let mut pipeline = PipelineConfig {
        source_url: source_url.url.into(),
        source_password: source_url
            .password_var
            .as_ref()
            .map(|var| Secret(format!("${{{var}}}"))),
        slot,
        publication,
        // Debezium's slot, or one `setup` creates before the switch.
        create_slot: false,
        // Debezium 3's failover slot option (PostgreSQL 17+).
        failover: im
            .take("slot.failover")
            .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        ..PipelineConfig::new(name.clone(), im.table())
    };
    im.router(alias, &mut pipeline)?;
    let bootstrap_servers = im.take("producer.override.bootstrap.servers");
    pipeline.kafka.properties = im.producer_properties();
    im.note_the_rest(alias, other_routers);
    let mut comments = vec![
        format!(
            "Imported from Debezium connector {:?} by `outbox-relay import-debezium`.",
            name
        ),
        "Options not carried over are listed on stderr with the reason.".to_owned(),
    ];
    if bootstrap_servers.is_none() {
        comments.push("[kafka] bootstrap_servers: Debezium's connector config has no brokers (the Kafka Connect worker's bootstrap.servers has them): set KAFKA_BOOTSTRAP_SERVERS, or write them here.".into());
    }
    if let Some(var) = &source_url.password_var {
        comments.push(format!(
            "source_password: the password is not copied: set {var} in the relay's environment."
        ));
    }
    comments.push(match new_slot {
        true => "slot: a new pgoutput slot (Debezium's plugin was not pgoutput): create it with `outbox-relay setup` before stopping Debezium; events in between are published twice.".into(),
        false => "slot, publication: Debezium's; stop the connector first (a slot admits one reader); the relay resumes at the slot's confirmed position (what Debezium sent after it is sent again).".into(),
    });
    comments.push(
        "route.topic_template: Debezium's topic names (its default is outbox.event.${routedByValue})."
            .into(),
    );
    let file = FileConfig {
        kafka: KafkaConfig {
            bootstrap_servers: bootstrap_servers
                .unwrap_or_else(|| "${KAFKA_BOOTSTRAP_SERVERS}".into()),
            properties: Vec::new(),
            create_topics: None,
        },
        pipelines: vec![pipeline],
        ..FileConfig::default()
    };
    Ok((file, comments, im.notes))
}

/// The config file text: `comments` as `#` lines wrapped at 96 columns, then `file`.
fn render(comments: &[String], file: &FileConfig) -> String {
    let mut text = String::new();
    for comment in comments {
        let mut line = String::from("#");
        for word in comment.split(' ') {
            if line.len() + 1 + word.len() > 96 && line.len() > 1 {
                text.push_str(&line);
                text.push('\n');
                line = String::from("#  ");
            }
            line.push(' ');
            line.push_str(word);
        }
        text.push_str(&line);
        text.push('\n');
    }
    text.push('\n');
    text.push_str(&toml::to_string(file).expect("a config file serializes to TOML"));
    text
}

/// The connector's options, which of them were carried over, and the notes so far.
struct Importer {
    options: BTreeMap<String, String>,
    used: BTreeSet<String>,
    notes: Vec<Note>,
}

struct UrlWithSecret {
    url: String,
    password_var: Option<String>,
}

impl Importer {
    /// The value of `option`, marking it carried over.
    fn take(&mut self, option: &str) -> Option<String> {
        let value = self.options.get(option).cloned();
        if value.is_some() {
            self.used.insert(option.to_owned());
        }
        value
    }

    fn note(&mut self, option: &str, reason: impl Into<String>) {
        self.notes.push(Note {
            option: option.to_owned(),
            reason: reason.into(),
        });
    }

    /// `option` as a URL component: percent-encoded, or an environment reference for a
    /// `${env:NAME}` value; another config provider's reference becomes `${<PREFIX>_<FIELD>}`.
    fn url_part(&mut self, option: &str, env_prefix: &str, field: &str) -> Option<String> {
        let value = self.take(option)?;
        Some(match env_reference(&value) {
            Reference::None => {
                percent_encoding::utf8_percent_encode(&value, URL_COMPONENT).to_string()
            }
            Reference::Env(var) => format!("${{{var}}}"),
            Reference::Other => {
                let var = format!("{env_prefix}_{field}");
                self.note(
                    option,
                    format!("{value:?} is a Kafka Connect config provider reference: the URL takes ${{{var}}} from the environment instead"),
                );
                format!("${{{var}}}")
            }
        })
    }

    /// `postgres://user@host:port/dbname?sslmode=...` from `database.*`, and the variable
    /// `source_password` takes the password from (`${PASSWORD_VAR}`: taken as written, no
    /// percent-encoding).
    fn source_url(&mut self, env_prefix: &str) -> UrlWithSecret {
        let host = self
            .url_part("database.hostname", env_prefix, "DB_HOST")
            .unwrap_or_else(|| {
                self.note("database.hostname", "not set: localhost assumed");
                "localhost".into()
            });
        // An IPv6 address, its colons encoded above.
        let host = match host.contains("%3A") {
            true => format!("[{}]", host.replace("%3A", ":")),
            false => host,
        };
        let port = self
            .url_part("database.port", env_prefix, "DB_PORT")
            .unwrap_or_else(|| "5432".into());
        let user = self.url_part("database.user", env_prefix, "DB_USER");
        let dbname = self.url_part("database.dbname", env_prefix, "DB_NAME");
        let password_var = self.take("database.password").map(|_| {
            let var = format!("{env_prefix}_DB_PASSWORD");
            self.note(
                "database.password",
                format!("not copied: set {var} in the relay's environment (source_password takes it as written)"),
            );
            var
        });
        let mut url = String::from("postgres://");
        if let Some(user) = &user {
            url.push_str(user);
            url.push('@');
        }
        url.push_str(&format!("{host}:{port}"));
        if let Some(dbname) = &dbname {
            url.push('/');
            url.push_str(dbname);
        }
        let mut query = Vec::new();
        if let Some(mode) = self.take("database.sslmode") {
            let mode = mode.to_ascii_lowercase();
            let libpq = [
                "disable",
                "allow",
                "prefer",
                "require",
                "verify-ca",
                "verify-full",
            ];
            if libpq.contains(&mode.as_str()) {
                query.push(format!("sslmode={mode}"));
            } else {
                self.note(
                    "database.sslmode",
                    format!("{mode:?} is not a libpq sslmode: left out (prefer)"),
                );
            }
        }
        for param in ["sslrootcert", "sslcert", "sslkey"] {
            let field = format!("DB_{}", param.to_ascii_uppercase());
            if let Some(value) = self.url_part(&format!("database.{param}"), env_prefix, &field) {
                query.push(format!("{param}={value}"));
            }
        }
        if !query.is_empty() {
            url.push('?');
            url.push_str(&query.join("&"));
        }
        UrlWithSecret { url, password_var }
    }

    /// Debezium's slot when it is a pgoutput slot (`false`), else a new one (`true`).
    fn slot(&mut self) -> (String, bool) {
        let plugin = self
            .take("plugin.name")
            .unwrap_or_else(|| "decoderbufs".into());
        let slot = self.take("slot.name").unwrap_or_else(|| "debezium".into());
        if plugin == "pgoutput" {
            return (slot, false);
        }
        self.note(
            "plugin.name",
            format!("{plugin} (Debezium's default is decoderbufs): outbox-relay reads pgoutput only, so it cannot take over slot {slot:?}; the config names a new slot outbox_relay: create it with `outbox-relay setup` before stopping Debezium (events in between are published twice; consumers dedupe by the id header), then drop {slot:?}"),
        );
        ("outbox_relay".into(), true)
    }

    /// The outbox table from `table.include.list` (or 1.x `table.whitelist`): the entry naming
    /// an outbox, else the first.
    fn table(&mut self) -> TableName {
        let include = self
            .take("table.include.list")
            .or_else(|| self.take("table.whitelist"))
            .unwrap_or_default();
        let tables: Vec<&str> = include
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .collect();
        let Some(chosen) = tables
            .iter()
            .position(|t| t.to_ascii_lowercase().contains("outbox"))
            .or((!tables.is_empty()).then_some(0))
        else {
            self.note("table.include.list", "not set (Debezium captured every table): table = public.outbox is a guess, name the outbox table");
            return TableName {
                schema: "public".into(),
                name: "outbox".into(),
            };
        };
        let others: Vec<&str> = (0..tables.len())
            .filter(|&i| i != chosen)
            .map(|i| tables[i])
            .collect();
        if !others.is_empty() {
            self.note(
                "table.include.list",
                format!("also lists {}: a pipeline reads one outbox table; add a [[pipelines]] entry (with its own slot) for each other outbox table", others.join(", ")),
            );
        }
        // Entries are regular expressions over `schema.table`; most are names with `\.`.
        let text = tables[chosen].replace("\\.", ".");
        if text.contains([
            '*', '+', '?', '(', ')', '[', ']', '{', '}', '|', '^', '$', '\\',
        ]) {
            self.note(
                "table.include.list",
                format!(
                    "{:?} is a regular expression: name the outbox table in `table`",
                    tables[chosen]
                ),
            );
        }
        let (schema, name) = text.split_once('.').unwrap_or(("public", &text));
        TableName {
            schema: schema.to_owned(),
            name: name.to_owned(),
        }
    }

    /// Sets `pipeline`'s columns, route and record options from the Event Router transform
    /// `alias`.
    fn router(&mut self, alias: &str, pipeline: &mut PipelineConfig) -> Result<(), ImportError> {
        let option = |name: &str| format!("transforms.{alias}.{name}");
        self.take(&option("type"));
        let get = |im: &mut Importer, name: &str| im.take(&option(name));
        let event_type = get(self, "table.field.event.type").unwrap_or_else(|| {
            self.note("columns.event_type", "\"type\", the column of Debezium's documented outbox table: outbox-relay requires an event type column and sends it as header event_type (Debezium 2.x has no such option); name yours if it differs");
            "type".into()
        });
        let topic_regex = get(self, "route.topic.regex").filter(|r| r != DEFAULT_TOPIC_REGEX);
        if topic_regex.is_some() {
            self.note(&option("route.topic.regex"), "copied to route.topic_regex (Java regex syntax); where it did not match, Debezium's RegexRouter kept the routing value itself as the topic: check the topics outbox-relay gives such values");
        }
        // A NULL or empty payload gives a tombstone (value_format envelope included).
        let tombstone_on_empty = match get(self, "route.tombstone.on.empty.payload") {
            Some(value) => boolean(&value).ok_or_else(|| ImportError::Unsupported {
                option: option("route.tombstone.on.empty.payload"),
                reason: format!("{value:?} is not true or false, which Debezium refuses too"),
            })?,
            None => false,
        };
        if tombstone_on_empty {
            pipeline.empty_payload = EmptyPayload::Tombstone;
        }
        let op_invalid = ["table.op.invalid.behavior", "debezium.op.invalid.behavior"]
            .into_iter()
            .find_map(|name| get(self, name).map(|value| (option(name), value)));
        let op_invalid_behavior = op_invalid.map(|(option, value)| {
            let (mapped, name) = match value.trim().to_ascii_lowercase().as_str() {
                "fatal" => (InvalidOpBehavior::Error, "error"),
                "error" => {
                    self.note(&option, "error (log and go on) becomes \"warn\": outbox-relay's \"error\" stops the pipeline, like Debezium's fatal");
                    (InvalidOpBehavior::Warn, "warn")
                }
                _ => (InvalidOpBehavior::Warn, "warn"),
            };
            self.note(
                &option,
                format!("op_invalid_behavior = {name:?} also covers DELETEs (Debezium drops them silently) and needs a publication that publishes updates and deletes; if your services delete outbox rows, leave it out (ignore)"),
            );
            mapped
        });
        if let Some(value) = get(self, "table.field.additional.missing") {
            pipeline.missing_placement_column = match value.trim().to_ascii_lowercase().as_str() {
                "error" => MissingPlacementColumn::Error,
                "ignore" => MissingPlacementColumn::Ignore,
                _ => {
                    return Err(ImportError::Unsupported {
                        option: option("table.field.additional.missing"),
                        reason: format!(
                            "{value:?} is not error or ignore, which Debezium refuses too"
                        ),
                    })
                }
            };
        }
        let additional = match get(self, "table.fields.additional.placement") {
            Some(list) => {
                additional_placement(&list).map_err(|reason| ImportError::Unsupported {
                    option: option("table.fields.additional.placement"),
                    reason,
                })?
            }
            None => Vec::new(),
        };
        if let Some(expand) = get(self, "table.expand.json.payload") {
            self.note(
                &option("table.expand.json.payload"),
                format!("{expand}: outbox-relay always publishes the payload text as PostgreSQL prints it, so a json/jsonb payload is JSON already (as expansion gave), byte for byte"),
            );
        }
        pipeline.columns = OutboxColumns {
            id: get(self, "table.field.event.id").unwrap_or_else(|| "id".into()),
            aggregate_type: get(self, "route.by.field").unwrap_or_else(|| "aggregatetype".into()),
            aggregate_id: get(self, "table.field.event.key")
                .unwrap_or_else(|| "aggregateid".into()),
            event_type,
            payload: get(self, "table.field.event.payload")
                .or_else(|| get(self, "table.field.payload"))
                .unwrap_or_else(|| "payload".into()),
            timestamp: get(self, "table.field.event.timestamp"),
            ..OutboxColumns::default()
        };
        pipeline.route = RouteConfig {
            topic_template: java_replacement(
                &get(self, "route.topic.replacement")
                    .unwrap_or_else(|| DEFAULT_TOPIC_REPLACEMENT.into()),
            ),
            topic_regex,
            ..RouteConfig::default()
        };
        if let Some(behavior) = op_invalid_behavior {
            pipeline.op_invalid_behavior = behavior;
        }
        if additional
            .iter()
            .any(|a| a.placement == Placement::Envelope)
        {
            pipeline.value_format = ValueFormat::Envelope;
            // Debezium's envelope keeps a NULL payload as "payload": null unless told to
            // send a tombstone.
            if !tombstone_on_empty {
                pipeline.null_payload = NullPayload::JsonNull;
            }
        }
        pipeline.additional_placement = additional;
        self.tracing(alias, pipeline)
    }

    /// `producer.override.*` properties librdkafka knows by the same name.
    fn producer_properties(&mut self) -> Vec<(String, String)> {
        let options: Vec<String> = self
            .options
            .keys()
            .filter(|k| k.starts_with("producer.override.") && !self.used.contains(*k))
            .cloned()
            .collect();
        let mut properties = Vec::new();
        for option in options {
            let property = &option["producer.override.".len()..];
            let value = self.take(&option).unwrap_or_default();
            match (property, value.as_str()) {
                ("acks", "all" | "-1") | ("enable.idempotence", "true") => {}
                ("acks" | "enable.idempotence", _) => self.note(
                    &option,
                    format!("{value}: outbox-relay always uses acks=all and enable.idempotence=true"),
                ),
                (p, _) if SAME_PRODUCER_PROPERTIES.contains(&p) => {
                    properties.push((p.to_owned(), value))
                }
                _ => self.note(
                    &option,
                    "a Java producer property: set the librdkafka equivalent under kafka.properties by hand",
                ),
            }
        }
        properties
    }

    /// A note for every option not carried over.
    fn note_the_rest(&mut self, router: &str, other_routers: &[String]) {
        let rest: Vec<(String, String)> = self
            .options
            .iter()
            .filter(|(k, _)| !self.used.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (option, value) in rest {
            let reason = reason_for(&option, &value, router, other_routers);
            self.note(&option, reason);
        }
        if !self.options.contains_key("value.converter") {
            self.note("value.converter", "not set, so the Kafka Connect worker's default applied; with JsonConverter (Kafka's default) Debezium wrote the payload as a JSON string (quoted and escaped, in a schema envelope unless schemas.enable=false), while outbox-relay writes the payload text itself: check your consumers");
        }
        if !self.options.contains_key("key.converter") {
            self.note("key.converter", "not set, so the Kafka Connect worker's default applied; with JsonConverter (Kafka's default) Debezium wrote the key (aggregate id) as a quoted JSON string, while outbox-relay writes its text: the same aggregate goes to another partition, so its order across the switch-over is not kept (see Coming from Debezium)");
        }
    }
}

/// A boolean option as Kafka's `ConfigDef` reads it: `true` or `false` in any case, blanks
/// around it ignored; `None` for anything else.
fn boolean(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// Characters kept as they are in URL user, host, database and parameter values.
const URL_COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

enum Reference {
    None,
    /// `${env:NAME}` (Kafka's EnvVarConfigProvider): outbox-relay's `${NAME}`.
    Env(String),
    /// Another config provider (`${file:...}`, `${vault:...}`).
    Other,
}

fn env_reference(value: &str) -> Reference {
    if !value.contains("${") {
        return Reference::None;
    }
    match value
        .strip_prefix("${env:")
        .and_then(|rest| rest.strip_suffix('}'))
    {
        Some(name)
            if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
        {
            Reference::Env(name.to_owned())
        }
        _ => Reference::Other,
    }
}

/// A Java regex replacement (`$1`, `${name}`) in outbox-relay's template form (`${1}`, `${name}`).
fn java_replacement(replacement: &str) -> String {
    let mut out = String::with_capacity(replacement.len());
    let mut chars = replacement.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push_str("${");
            while let Some(d) = chars.next_if(char::is_ascii_digit) {
                out.push(d);
            }
            out.push('}');
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses `column:placement[:alias],...`.
fn additional_placement(list: &str) -> Result<Vec<AdditionalPlacement>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
            let (field, placement, alias) = match parts[..] {
                [field, placement] => (field, placement, None),
                [field, placement, alias] => (field, placement, Some(alias)),
                _ => {
                    return Err(format!(
                        "{entry:?} is not column:placement or column:placement:alias"
                    ))
                }
            };
            let placement = match placement.to_ascii_lowercase().as_str() {
                "header" => Placement::Header,
                "envelope" => Placement::Envelope,
                "partition" => Placement::Partition,
                _ => {
                    return Err(format!(
                        "{entry:?}: placement must be header, envelope or partition"
                    ))
                }
            };
            Ok(AdditionalPlacement {
                field: field.to_owned(),
                // Debezium ignores an alias for the partition.
                alias: alias
                    .filter(|_| placement != Placement::Partition)
                    .map(str::to_owned),
                placement,
            })
        })
        .collect()
}

/// Why an option is not carried over.
fn reason_for(option: &str, value: &str, router: &str, other_routers: &[String]) -> String {
    let starts = |prefix: &str| option.starts_with(prefix);
    if let Some(rest) = option.strip_prefix(&format!("transforms.{router}.")) {
        return match rest {
            r if r.starts_with("tracing.") => {
                "a tracing option outbox-relay does not know (it carries over span.context.field, operation.name and with.context.field.only)".into()
            }
            "predicate" | "negate" => {
                "outbox-relay applies its routing to the configured table only".into()
            }
            "table.field.payload.id"
            | "table.field.event.schema.version"
            | "table.field.schema.version" => {
                "Debezium 1.x envelope metadata; outbox-relay has no equivalent".into()
            }
            "table.json.payload.null.behavior" => {
                "about JSON expansion, which outbox-relay does not need".into()
            }
            _ => "an Event Router option outbox-relay does not know".into(),
        };
    }
    if let Some(alias) = other_routers
        .iter()
        .find(|a| starts(&format!("transforms.{a}.")))
    {
        return format!(
            "a second Event Router ({alias}): one pipeline per outbox table, import it separately"
        );
    }
    if starts("transforms.") || starts("predicates") {
        return "another transform: outbox-relay applies only the outbox routing".into();
    }
    if let Some(reason) = formats::reason(option, value) {
        return reason;
    }
    match option {
        "topic.prefix" | "database.server.name" => {
            "not needed: it names Debezium's own topics; the outbox topics come from route.topic_template".into()
        }
        "tasks.max" => "one pipeline reads one slot".into(),
        "snapshot.mode" => "outbox-relay never snapshots: it publishes rows committed after the slot's position".into(),
        "slot.drop.on.stop" if value == "true" => {
            "the slot was dropped whenever Debezium stopped: create it with `outbox-relay setup`".into()
        }
        "publication.autocreate.mode" => format!(
            "{value}: outbox-relay does not create publications while running (`outbox-relay setup` does); a publication FOR ALL TABLES works, and other tables' changes are passed over"
        ),
        "heartbeat.interval.ms" | "heartbeat.action.query" | "heartbeat.topics.prefix" => {
            "outbox-relay confirms the slot's position from keepalives when idle: no heartbeats needed".into()
        }
        "tombstones.on.delete" | "skipped.operations" => {
            "outbox-relay publishes inserts only (op_invalid_behavior covers updates and deletes)".into()
        }
        "max.batch.size" | "max.queue.size" | "max.queue.size.in.bytes" | "poll.interval.ms" => {
            "see max_in_flight_events and max_in_flight_bytes".into()
        }
        "database.sslpassword" | "database.sslfactory" => "not supported by outbox-relay's TLS".into(),
        "database.initial.statements" => "outbox-relay runs no statements of yours".into(),
        _ if starts("key.converter.") || starts("value.converter.") || starts("header.converter.") => {
            "converter setting: outbox-relay publishes the columns' text (see the converter lines)".into()
        }
        _ if starts("errors.") => {
            "Kafka Connect error handling: outbox-relay stops on bad input (on_bad_event) and retries transient failures".into()
        }
        _ if starts("topic.creation.") => "outbox-relay creates no topics: they must exist or be auto-created".into(),
        _ if starts("slot.") => "outbox-relay retries and keeps its slot itself".into(),
        _ if starts("snapshot.") || starts("incremental.snapshot") || starts("signal.") || starts("notification.") => {
            "outbox-relay has no snapshots or signals".into()
        }
        _ if starts("schema.")
            || starts("table.")
            || starts("column.")
            || starts("message.")
            || starts("database.") =>
        {
            "shapes Debezium's change events; outbox-relay reads the configured table only".into()
        }
        _ if option.ends_with(".handling.mode") || option.ends_with(".adjustment.mode") => {
            "shapes Debezium's change events; outbox-relay publishes the columns' text as PostgreSQL prints it".into()
        }
        _ => "no outbox-relay equivalent".into(),
    }
}

#[cfg(test)]
mod tests;
