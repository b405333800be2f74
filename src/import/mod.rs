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
use crate::config::{KafkaConfig, PipelineConfig, Secret, TableName};

mod event_router;
mod formats;
mod reasons;
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

/// How much a [`Note`] matters, most first: notes are listed in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Debezium itself refuses the option's value: nothing is imported.
    Error,
    /// The relay will not publish what Debezium published (or cannot reproduce the option):
    /// `import-debezium` prints no config unless `--accept-differences` is given.
    Difference,
    /// Carried over, not needed, or without effect on the records.
    Info,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Difference => "difference",
            Severity::Info => "info",
        })
    }
}

/// An option (or a column default) that was not carried over as it was, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub severity: Severity,
    pub option: String,
    pub reason: String,
}

impl Note {
    /// A note of [`Severity::Info`].
    pub fn info(option: impl Into<String>, reason: impl Into<String>) -> Note {
        Note {
            severity: Severity::Info,
            option: option.into(),
            reason: reason.into(),
        }
    }

    /// A note of [`Severity::Difference`].
    pub fn difference(option: impl Into<String>, reason: impl Into<String>) -> Note {
        Note {
            severity: Severity::Difference,
            ..Note::info(option, reason)
        }
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.severity, self.option, self.reason)
    }
}

/// `notes` sorted by [`Severity`], most severe first, each severity in its original order.
fn sorted(mut notes: Vec<Note>) -> Vec<Note> {
    notes.sort_by_key(|n| n.severity);
    notes
}

/// The translation: TOML for a config file (the serialized [`FileConfig`] with one pipeline,
/// under comments), and the notes for the operator, sorted by [`Severity`] (never an error).
#[derive(Debug, Clone)]
pub struct Imported {
    pub toml: String,
    pub notes: Vec<Note>,
}

impl Imported {
    /// The notes of [`Severity::Difference`].
    pub fn differences(&self) -> usize {
        self.notes
            .iter()
            .filter(|n| n.severity == Severity::Difference)
            .count()
    }
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
    /// Options whose values Debezium refuses; `notes` holds every note, errors first.
    #[error("Debezium refuses {} option value(s): {}", .notes.iter().filter(|n| n.severity == Severity::Error).count(), .notes.iter().filter(|n| n.severity == Severity::Error).map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Refused { notes: Vec<Note> },
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
/// transform, or Debezium refuses one of its option values ([`ImportError::Refused`], with
/// every note).
pub fn translate(connector: &Connector) -> Result<Imported, ImportError> {
    let (file, comments, notes) = translate_parts(connector)?;
    Ok(Imported {
        toml: render(&comments, &file),
        notes: sorted(notes),
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
        expanded: false,
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
    im.router(alias, &mut pipeline);
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
            properties_file: None,
            create_topics: None,
        },
        pipelines: vec![pipeline],
        ..FileConfig::default()
    };
    if im.notes.iter().any(|n| n.severity == Severity::Error) {
        return Err(ImportError::Refused {
            notes: sorted(im.notes),
        });
    }
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
    /// `table.expand.json.payload` is true.
    expanded: bool,
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
        self.notes.push(Note::info(option, reason));
    }

    fn difference(&mut self, option: &str, reason: impl Into<String>) {
        self.notes.push(Note::difference(option, reason));
    }

    /// A value Debezium refuses: `accepted` lists what it takes.
    fn refuse(&mut self, option: &str, value: &str, accepted: &str) {
        self.notes.push(Note {
            severity: Severity::Error,
            option: option.to_owned(),
            reason: format!(
                "{value:?} is refused by Debezium too: the accepted values are {accepted}"
            ),
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
                // Debezium's sslmode takes libpq's values only.
                self.refuse(
                    "database.sslmode",
                    &mode,
                    "disable, allow, prefer, require, verify-ca and verify-full",
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
        match plugin.trim().to_ascii_lowercase().as_str() {
            "pgoutput" => return (slot, false),
            // wal2json: Debezium 1.x.
            "decoderbufs" | "wal2json" | "wal2json_streaming" | "wal2json_rds"
            | "wal2json_rds_streaming" => self.difference(
                "plugin.name",
                format!("{plugin} (Debezium's default is decoderbufs): outbox-relay reads pgoutput only, so it cannot take over slot {slot:?}; the config names a new slot outbox_relay: create it with `outbox-relay setup` before stopping Debezium (events in between are published twice; consumers dedupe by the id header), then drop {slot:?}"),
            ),
            _ => self.refuse("plugin.name", &plugin, "pgoutput and decoderbufs"),
        }
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
                _ => self.difference(
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
        let context = formats::Context {
            expanded: self.expanded,
            value_schemas: self
                .options
                .get("value.converter.schemas.enable")
                .and_then(|v| boolean(v))
                .unwrap_or(true),
        };
        for (option, value) in rest {
            let (severity, reason) =
                reasons::reason_for(&option, &value, router, other_routers, &context);
            self.notes.push(Note {
                severity,
                option,
                reason,
            });
        }
        if !self.options.contains_key("value.converter") {
            self.difference("value.converter", "not set, so the Kafka Connect worker's default applied; with JsonConverter (Kafka's default) Debezium wrote the payload as a JSON string (quoted and escaped, in a schema envelope unless schemas.enable=false), while outbox-relay writes the payload text itself: check your consumers");
        }
        if !self.options.contains_key("key.converter") {
            self.difference("key.converter", "not set, so the Kafka Connect worker's default applied; with JsonConverter (Kafka's default) Debezium wrote the key (aggregate id) as a quoted JSON string, while outbox-relay writes its text: the same aggregate goes to another partition, so its order across the switch-over is not kept (see Coming from Debezium)");
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

#[cfg(test)]
mod tests;
