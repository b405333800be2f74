//! `outbox-relay import-debezium`: turns a Debezium PostgreSQL connector configuration with
//! the Outbox Event Router transform into an outbox-relay `[[pipelines]]` entry.
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

use crate::config::TableName;

const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";
const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
/// Debezium's `route.topic.regex` default: the whole routing value as `routedByValue`.
const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";
const DEFAULT_TOPIC_REPLACEMENT: &str = "outbox.event.${routedByValue}";
/// Java producer properties with the same name and meaning in librdkafka.
const SAME_PRODUCER_PROPERTIES: &[&str] = &[
    "batch.size",
    "client.id",
    "compression.type",
    "linger.ms",
    "request.timeout.ms",
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

/// The translation: TOML for a config file, and the notes for the operator.
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

/// The options not yet carried over.
struct Options {
    map: BTreeMap<String, String>,
    used: BTreeSet<String>,
}

impl Options {
    /// The value of `key`, marking it carried over.
    fn take(&mut self, key: &str) -> Option<String> {
        let value = self.map.get(key).cloned();
        if value.is_some() {
            self.used.insert(key.to_owned());
        }
        value
    }
}

/// Translates `connector` into an outbox-relay config and notes.
///
/// Returns an error if it is not a Debezium PostgreSQL connector, has no Outbox Event Router
/// transform, or its `table.fields.additional.placement` is malformed.
pub fn translate(connector: &Connector) -> Result<Imported, ImportError> {
    let mut o = Options {
        map: connector.options.clone(),
        used: BTreeSet::new(),
    };
    let mut notes = Vec::new();
    let mut note = |option: &str, reason: String| {
        notes.push(Note {
            option: option.to_owned(),
            reason,
        })
    };

    if let Some(class) = o.take("connector.class") {
        if class != POSTGRES_CONNECTOR {
            return Err(ImportError::Unsupported {
                option: "connector.class".into(),
                reason: format!(
                    "{class} is not Debezium's PostgreSQL connector ({POSTGRES_CONNECTOR})"
                ),
            });
        }
    }
    let aliases: Vec<String> = o
        .take("transforms")
        .unwrap_or_default()
        .split(',')
        .map(|a| a.trim().to_owned())
        .filter(|a| !a.is_empty())
        .collect();
    let routers: Vec<&String> = aliases
        .iter()
        .filter(|a| {
            o.map
                .get(&format!("transforms.{a}.type"))
                .map(String::as_str)
                == Some(EVENT_ROUTER)
        })
        .collect();
    let Some(router) = routers.first().map(|a| a.to_string()) else {
        return Err(ImportError::Unsupported {
            option: "transforms".into(),
            reason: format!(
                "no transform of type {EVENT_ROUTER}: this connector does not route outbox events"
            ),
        });
    };
    o.take(&format!("transforms.{router}.type"));
    let smt = |o: &mut Options, option: &str| o.take(&format!("transforms.{router}.{option}"));

    let name = connector
        .name
        .clone()
        .or_else(|| o.map.get("database.dbname").cloned())
        .unwrap_or_else(|| "outbox".into());
    let env_prefix: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();

    // Source URL.
    let url_part = |o: &mut Options,
                    option: &str,
                    field: &str,
                    note: &mut dyn FnMut(&str, String)| {
        o.take(option).map(|value| match env_reference(&value) {
            Reference::None => percent_encoding::utf8_percent_encode(&value, URL_COMPONENT).to_string(),
            Reference::Env(var) => format!("${{{var}}}"),
            Reference::Other => {
                let var = format!("{env_prefix}_{field}");
                note(option, format!("{value:?} is a Kafka Connect config provider reference: the URL takes ${{{var}}} from the environment instead"));
                format!("${{{var}}}")
            }
        })
    };
    let host = url_part(&mut o, "database.hostname", "DB_HOST", &mut note).unwrap_or_else(|| {
        note("database.hostname", "not set: localhost assumed".into());
        "localhost".into()
    });
    let host = if host.contains("%3A") {
        // An IPv6 address, encoded above.
        format!("[{}]", host.replace("%3A", ":"))
    } else {
        host
    };
    let port =
        url_part(&mut o, "database.port", "DB_PORT", &mut note).unwrap_or_else(|| "5432".into());
    let user = url_part(&mut o, "database.user", "DB_USER", &mut note);
    let dbname = url_part(&mut o, "database.dbname", "DB_NAME", &mut note);
    let password_var = format!("{env_prefix}_DB_PASSWORD");
    let password = o.take("database.password").map(|_| {
        note(
            "database.password",
            format!("not copied: set {password_var} in the relay's environment (percent-encoded if it has characters such as @ / : ? # %)"),
        );
        format!(":${{{password_var}}}")
    });
    let mut source_url = String::from("postgres://");
    if let Some(user) = &user {
        source_url.push_str(user);
        source_url.push_str(password.as_deref().unwrap_or_default());
        source_url.push('@');
    }
    source_url.push_str(&format!("{host}:{port}"));
    if let Some(dbname) = &dbname {
        source_url.push('/');
        source_url.push_str(dbname);
    }
    let mut query = Vec::new();
    if let Some(mode) = o.take("database.sslmode") {
        let mode = mode.to_ascii_lowercase();
        if [
            "disable",
            "allow",
            "prefer",
            "require",
            "verify-ca",
            "verify-full",
        ]
        .contains(&mode.as_str())
        {
            query.push(format!("sslmode={mode}"));
        } else {
            note(
                "database.sslmode",
                format!("{mode:?} is not a libpq sslmode; left out (prefer)"),
            );
        }
    }
    for (option, param) in [
        ("database.sslrootcert", "sslrootcert"),
        ("database.sslcert", "sslcert"),
        ("database.sslkey", "sslkey"),
    ] {
        let field = format!("DB_{}", param.to_ascii_uppercase());
        if let Some(value) = url_part(&mut o, option, &field, &mut note) {
            query.push(format!("{param}={value}"));
        }
    }
    if !query.is_empty() {
        source_url.push('?');
        source_url.push_str(&query.join("&"));
    }

    // Slot and publication.
    let plugin = o
        .take("plugin.name")
        .unwrap_or_else(|| "decoderbufs".into());
    let debezium_slot = o.take("slot.name").unwrap_or_else(|| "debezium".into());
    let slot = if plugin == "pgoutput" {
        debezium_slot
    } else {
        note(
            "plugin.name",
            format!("{plugin} (Debezium's default is decoderbufs): outbox-relay reads pgoutput only, so it cannot take over slot {debezium_slot:?}; the config names a new slot outbox_relay: create it with `outbox-relay setup` before stopping Debezium (events in between are published twice; consumers dedupe by the id header), then drop {debezium_slot:?}"),
        );
        "outbox_relay".into()
    };
    let publication = o
        .take("publication.name")
        .unwrap_or_else(|| "dbz_publication".into());

    // The outbox table.
    let include = o
        .take("table.include.list")
        .or_else(|| o.take("table.whitelist"))
        .unwrap_or_default();
    let tables: Vec<&str> = include
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    let table = match tables
        .iter()
        .position(|t| t.to_ascii_lowercase().contains("outbox"))
        .or((!tables.is_empty()).then_some(0))
    {
        Some(i) => {
            let others: Vec<&str> = tables
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, t)| *t)
                .collect();
            if !others.is_empty() {
                note("table.include.list", format!("also lists {}: a pipeline reads one outbox table; add a [[pipelines]] entry (with its own slot) for each other outbox table", others.join(", ")));
            }
            let text = tables[i].replace("\\.", ".");
            if text.contains([
                '*', '+', '?', '(', ')', '[', ']', '{', '}', '|', '^', '$', '\\',
            ]) {
                note(
                    "table.include.list",
                    format!(
                        "{:?} is a regular expression: name the outbox table in `table`",
                        tables[i]
                    ),
                );
            }
            let (schema, name) = text.split_once('.').unwrap_or(("public", &text));
            TableName {
                schema: schema.to_owned(),
                name: name.to_owned(),
            }
        }
        None => {
            note("table.include.list", "not set (Debezium captured every table): table = public.outbox is a guess, name the outbox table".into());
            TableName {
                schema: "public".into(),
                name: "outbox".into(),
            }
        }
    };

    // Event Router columns and routing.
    let id = smt(&mut o, "table.field.event.id").unwrap_or_else(|| "id".into());
    let key = smt(&mut o, "table.field.event.key").unwrap_or_else(|| "aggregateid".into());
    let payload = smt(&mut o, "table.field.event.payload")
        .or_else(|| smt(&mut o, "table.field.payload"))
        .unwrap_or_else(|| "payload".into());
    let event_type = smt(&mut o, "table.field.event.type").unwrap_or_else(|| {
        note("columns.event_type", "\"type\", the column of Debezium's documented outbox table: outbox-relay requires an event type column and sends it as header event_type (Debezium 2.x has no such option); name yours if it differs".into());
        "type".into()
    });
    let timestamp = smt(&mut o, "table.field.event.timestamp");
    let aggregate_type = smt(&mut o, "route.by.field").unwrap_or_else(|| "aggregatetype".into());
    let topic_regex = smt(&mut o, "route.topic.regex").filter(|r| r != DEFAULT_TOPIC_REGEX);
    if topic_regex.is_some() {
        note(&format!("transforms.{router}.route.topic.regex"), "copied to route.topic_regex (Java regex syntax); where it did not match, Debezium's RegexRouter kept the routing value itself as the topic: check the topics outbox-relay gives such values".into());
    }
    let topic_template = java_replacement(
        &smt(&mut o, "route.topic.replacement").unwrap_or_else(|| DEFAULT_TOPIC_REPLACEMENT.into()),
    );
    if let Some(tombstone) = smt(&mut o, "route.tombstone.on.empty.payload") {
        note(&format!("transforms.{router}.route.tombstone.on.empty.payload"), format!("{tombstone}: outbox-relay publishes a NULL payload as a tombstone (null_payload, default \"tombstone\"); an empty or blank text payload is published as it is"));
    }
    let op_invalid = smt(&mut o, "table.op.invalid.behavior")
        .map(|v| ("table.op.invalid.behavior", v))
        .or_else(|| {
            smt(&mut o, "debezium.op.invalid.behavior").map(|v| ("debezium.op.invalid.behavior", v))
        });
    let op_invalid_behavior = op_invalid.map(|(option, value)| {
        let option = format!("transforms.{router}.{option}");
        let mapped = match value.trim().to_ascii_lowercase().as_str() {
            "fatal" => "error",
            "error" => {
                note(&option, "error (log and go on) becomes \"warn\": outbox-relay's \"error\" stops the pipeline, like Debezium's fatal".into());
                "warn"
            }
            _ => "warn",
        };
        note(&option, format!("op_invalid_behavior = {mapped:?} also covers DELETEs (Debezium drops them silently) and needs a publication that publishes updates and deletes; if your services delete outbox rows, leave it out (ignore)"));
        mapped
    });
    let additional = match smt(&mut o, "table.fields.additional.placement") {
        Some(list) => additional_placement(&list).map_err(|reason| ImportError::Unsupported {
            option: format!("transforms.{router}.table.fields.additional.placement"),
            reason,
        })?,
        None => Vec::new(),
    };
    if let Some(expand) = smt(&mut o, "table.expand.json.payload") {
        note(&format!("transforms.{router}.table.expand.json.payload"), format!("{expand}: outbox-relay always publishes the payload text as PostgreSQL prints it, so a json/jsonb payload is JSON already (as expansion gave), byte for byte"));
    }

    // Kafka.
    let bootstrap = o.take("producer.override.bootstrap.servers");
    let mut properties = Vec::new();
    let producer_keys: Vec<String> = o
        .map
        .keys()
        .filter(|k| k.starts_with("producer.override."))
        .cloned()
        .collect();
    for option in producer_keys {
        let property = &option["producer.override.".len()..];
        let value = o.take(&option).unwrap_or_default();
        match property {
            "acks" | "enable.idempotence" => {
                if !matches!((property, value.as_str()), ("acks", "all" | "-1") | ("enable.idempotence", "true")) {
                    note(&option, format!("{value}: outbox-relay always uses acks=all and enable.idempotence=true"));
                }
            }
            p if SAME_PRODUCER_PROPERTIES.contains(&p) => properties.push((p.to_owned(), value)),
            _ => note(&option, "a Java producer property: set the librdkafka equivalent under kafka.properties by hand".into()),
        }
    }

    // Every option left gets a line with the reason.
    let routers_rest: Vec<String> = routers[1..].iter().map(|a| a.to_string()).collect();
    let unused: Vec<(String, String)> = o
        .map
        .iter()
        .filter(|(k, _)| !o.used.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (option, value) in unused {
        note(&option, reason_for(&option, &value, &router, &routers_rest));
    }

    // The TOML.
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!(
        "# Imported from Debezium connector {} by `outbox-relay import-debezium`.",
        q(&name)
    ));
    line("# Options not carried over are listed on stderr with the reason.".into());
    line("[kafka]".into());
    match &bootstrap {
        Some(servers) => line(format!("bootstrap_servers = {}", q(servers))),
        None => {
            line("# Debezium's connector config has no brokers (the Kafka Connect worker's bootstrap.servers".into());
            line("# has them): set KAFKA_BOOTSTRAP_SERVERS, or write them here.".into());
            line("bootstrap_servers = \"${KAFKA_BOOTSTRAP_SERVERS}\"".into());
        }
    }
    line(String::new());
    line("[[pipelines]]".into());
    line(format!("name = {}", q(&name)));
    if password.is_some() {
        line(format!(
            "# The password is not copied: set {password_var} in the relay's environment."
        ));
    }
    line(format!("source_url = {}", q(&source_url)));
    line(
        "# Debezium's slot and publication: stop the connector first (a slot admits one reader);"
            .into(),
    );
    line("# the relay resumes at the slot's confirmed position (what Debezium sent after it is sent again).".into());
    line(format!("slot = {}", q(&slot)));
    line(format!("publication = {}", q(&publication)));
    line(format!("table = {}", q(&table.to_string())));
    line("create_slot = false".into());
    if let Some(mapped) = op_invalid_behavior {
        line(format!("op_invalid_behavior = {}", q(mapped)));
    }
    if additional.iter().any(|a| a.placement == "envelope") {
        line("value_format = \"envelope\"".into());
    }
    if !additional.is_empty() {
        let entries: Vec<String> = additional
            .iter()
            .map(|a| match &a.alias {
                Some(alias) => format!(
                    "{{ field = {}, placement = {}, alias = {} }}",
                    q(&a.field),
                    q(&a.placement),
                    q(alias)
                ),
                None => format!(
                    "{{ field = {}, placement = {} }}",
                    q(&a.field),
                    q(&a.placement)
                ),
            })
            .collect();
        line(format!("additional_placement = [{}]", entries.join(", ")));
    }
    line("[pipelines.columns]".into());
    for (field, column) in [
        ("id", &id),
        ("aggregate_type", &aggregate_type),
        ("aggregate_id", &key),
        ("event_type", &event_type),
        ("payload", &payload),
    ] {
        line(format!("{field} = {}", q(column)));
    }
    if let Some(column) = &timestamp {
        line(format!("timestamp = {}", q(column)));
    }
    line("[pipelines.route]".into());
    line("# Debezium's topic names (its default is outbox.event.${routedByValue}).".into());
    line(format!("topic_template = {}", q(&topic_template)));
    if let Some(regex) = &topic_regex {
        line(format!("topic_regex = {}", q(regex)));
    }
    if !properties.is_empty() {
        line("[pipelines.kafka.properties]".into());
        for (key, value) in &properties {
            line(format!("{} = {}", q(key), q(value)));
        }
    }
    Ok(Imported { toml: out, notes })
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

#[derive(Debug, PartialEq, Eq)]
struct Additional {
    field: String,
    placement: String,
    alias: Option<String>,
}

/// Parses `column:placement[:alias],...`.
fn additional_placement(list: &str) -> Result<Vec<Additional>, String> {
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
            let placement = placement.to_ascii_lowercase();
            if !["header", "envelope", "partition"].contains(&placement.as_str()) {
                return Err(format!(
                    "{entry:?}: placement must be header, envelope or partition"
                ));
            }
            Ok(Additional {
                field: field.to_owned(),
                // Debezium ignores an alias for the partition.
                alias: alias
                    .filter(|_| placement != "partition")
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
            r if r.starts_with("tracing.") => "outbox-relay creates no tracing spans".into(),
            "predicate" | "negate" => {
                "outbox-relay applies its routing to the configured table only".into()
            }
            "table.field.payload.id"
            | "table.field.event.schema.version"
            | "table.field.schema.version" => {
                "Debezium 1.x envelope metadata; outbox-relay has no equivalent".into()
            }
            "table.fields.additional.error.on.missing" => {
                "a missing column always stops outbox-relay".into()
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
        "key.converter" | "value.converter" => converter_reason(option, value),
        "max.batch.size" | "max.queue.size" | "max.queue.size.in.bytes" | "poll.interval.ms" => {
            "see max_in_flight_events and max_in_flight_bytes".into()
        }
        "database.sslpassword" | "database.sslfactory" => "not supported by outbox-relay's TLS".into(),
        "database.initial.statements" => "outbox-relay runs no statements of yours".into(),
        _ if starts("key.converter.") || starts("value.converter.") || starts("header.converter") => {
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

fn converter_reason(option: &str, value: &str) -> String {
    let what = if option == "key.converter" {
        "key (aggregate id)"
    } else {
        "payload"
    };
    match value.rsplit('.').next().unwrap_or(value) {
        "StringConverter" => format!("as outbox-relay: the {what} text"),
        "JsonConverter" => format!(
            "Debezium wrote the {what} as a JSON string (quoted and escaped, with a schema envelope unless schemas.enable=false); outbox-relay writes its text itself: check your consumers"
        ),
        "BinaryDataConverter" | "ByteArrayConverter" => format!(
            "outbox-relay publishes text: a bytea {what} arrives as PostgreSQL's hex text (\\x...), not raw bytes"
        ),
        _ => format!("{value}: outbox-relay publishes the {what} text as PostgreSQL prints it, without a converter"),
    }
}

/// A TOML string.
fn q(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::providers::{Format, Toml};
    use figment::Figment;

    /// The connector of Debezium's outbox example (debezium-examples/outbox), in the form
    /// posted to Kafka Connect, on Debezium 2.x option names.
    const EXAMPLE: &str = r#"{
      "name": "outbox-connector",
      "config": {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": "order-db",
        "database.port": 5432,
        "database.user": "postgresuser",
        "database.password": "postgrespw",
        "database.dbname": "orderdb",
        "topic.prefix": "dbserver1",
        "schema.include.list": "inventory",
        "table.include.list": "inventory.outboxevent",
        "tombstones.on.delete": "false",
        "plugin.name": "pgoutput",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.route.topic.replacement": "${routedByValue}.events"
      }
    }"#;

    fn load(toml: &str, env: &[(&str, &str)]) -> crate::config::file::RelayConfig {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        crate::config::file::resolve(Figment::new().merge(Toml::string(toml)), &move |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .unwrap_or_else(|e| panic!("{e}\n{toml}"))
    }

    fn options(notes: &[Note]) -> Vec<&str> {
        notes.iter().map(|n| n.option.as_str()).collect()
    }

    #[test]
    fn debeziums_outbox_example_loads_with_the_same_topics_and_columns() {
        let imported = translate(&parse_json(EXAMPLE).unwrap()).unwrap();
        assert!(!imported.toml.contains("postgrespw"), "{}", imported.toml);
        let config = load(
            &imported.toml,
            &[
                ("OUTBOX_CONNECTOR_DB_PASSWORD", "pw"),
                ("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092"),
            ],
        );
        let p = &config.pipelines[0];
        assert_eq!(p.name, "outbox-connector");
        assert_eq!(
            p.source_url,
            "postgres://postgresuser:pw@order-db:5432/orderdb"
        );
        assert_eq!(
            (p.slot.as_str(), p.publication.as_str()),
            ("debezium", "dbz_publication")
        );
        assert_eq!(p.table.to_string(), "inventory.outboxevent");
        assert!(!p.create_slot);
        assert_eq!(p.kafka.bootstrap_servers, "kafka:9092");
        assert_eq!(p.route.topic_template, "${routedByValue}.events");
        assert_eq!(p.route.by_field, None);
        let c = &p.columns;
        assert_eq!(
            [
                &c.id,
                &c.aggregate_type,
                &c.aggregate_id,
                &c.event_type,
                &c.payload
            ]
            .map(String::as_str),
            ["id", "aggregatetype", "aggregateid", "type", "payload"]
        );
        let notes = options(&imported.notes);
        for option in [
            "database.password",
            "tasks.max",
            "topic.prefix",
            "schema.include.list",
            "tombstones.on.delete",
            "columns.event_type",
        ] {
            assert!(notes.contains(&option), "no note for {option}: {notes:?}");
        }
        for carried in [
            "transforms.outbox.route.topic.replacement",
            "table.include.list",
            "plugin.name",
            "database.hostname",
        ] {
            assert!(
                !notes.contains(&carried),
                "{carried} was carried over: {notes:?}"
            );
        }
    }

    #[test]
    fn debezium_defaults_keep_debeziums_topic_names() {
        let properties = "name=orders\nconnector.class=io.debezium.connector.postgresql.PostgresConnector\ndatabase.hostname=db\ndatabase.user=relay\ndatabase.dbname=orders\ntable.include.list=public\\\\.outbox\ntransforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n";
        let imported = translate(&parse_properties(properties).unwrap()).unwrap();
        let config = load(&imported.toml, &[("KAFKA_BOOTSTRAP_SERVERS", "k:9092")]);
        let p = &config.pipelines[0];
        assert_eq!(p.route.topic_template, "outbox.event.${routedByValue}");
        assert_eq!(p.source_url, "postgres://relay@db:5432/orders");
        assert_eq!(p.table.to_string(), "public.outbox");
        // Debezium's default plugin is decoderbufs: its slot cannot be taken over.
        assert_eq!(p.slot, "outbox_relay");
        assert!(options(&imported.notes).contains(&"plugin.name"));
    }

    #[test]
    fn every_router_option_is_mapped_or_noted() {
        let connector = Connector {
            name: Some("billing".into()),
            options: [
                ("database.hostname", "fe80::1"),
                ("database.user", "${env:DB_USER}"),
                (
                    "database.password",
                    "${file:/secrets/db.properties:password}",
                ),
                ("database.dbname", "bill ing"),
                ("database.sslmode", "verify-full"),
                ("database.sslrootcert", "/etc/ssl/ca.pem"),
                ("plugin.name", "pgoutput"),
                ("slot.name", "billing_slot"),
                ("publication.name", "Billing-Pub"),
                ("table.include.list", "audit.log,Billing-Prod.Outbox"),
                ("transforms", "unwrap,router"),
                (
                    "transforms.unwrap.type",
                    "io.debezium.transforms.ExtractNewRecordState",
                ),
                ("transforms.router.type", EVENT_ROUTER),
                ("transforms.router.table.field.event.id", "event_id"),
                ("transforms.router.table.field.event.key", "aggregate_id"),
                ("transforms.router.table.field.event.payload", "body"),
                (
                    "transforms.router.table.field.event.timestamp",
                    "created_at",
                ),
                ("transforms.router.route.by.field", "aggregate_type"),
                (
                    "transforms.router.route.topic.regex",
                    "(?<kind>[a-z]+)-(.*)",
                ),
                (
                    "transforms.router.route.topic.replacement",
                    "billing.${kind}.$2",
                ),
                ("transforms.router.route.tombstone.on.empty.payload", "true"),
                (
                    "transforms.router.table.fields.additional.placement",
                    "type:header:eventType,tenant:envelope,part:partition:ignored",
                ),
                ("transforms.router.table.op.invalid.behavior", "fatal"),
                ("transforms.router.table.expand.json.payload", "true"),
                (
                    "value.converter",
                    "org.apache.kafka.connect.json.JsonConverter",
                ),
                ("producer.override.linger.ms", "10"),
                ("producer.override.acks", "1"),
                ("producer.override.max.request.size", "2000000"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        };
        let imported = translate(&connector).unwrap();
        let toml = &imported.toml;
        for expected in [
            r#"source_url = "postgres://${DB_USER}:${BILLING_DB_PASSWORD}@[fe80::1]:5432/bill%20ing?sslmode=verify-full&sslrootcert=/etc/ssl/ca.pem""#,
            r#"slot = "billing_slot""#,
            r#"publication = "Billing-Pub""#,
            r#"table = '"Billing-Prod"."Outbox"'"#,
            r#"op_invalid_behavior = "error""#,
            r#"value_format = "envelope""#,
            r#"additional_placement = [{ field = "type", placement = "header", alias = "eventType" }, { field = "tenant", placement = "envelope" }, { field = "part", placement = "partition" }]"#,
            r#"id = "event_id""#,
            r#"aggregate_type = "aggregate_type""#,
            r#"aggregate_id = "aggregate_id""#,
            r#"payload = "body""#,
            r#"timestamp = "created_at""#,
            r#"topic_template = "billing.${kind}.${2}""#,
            r#"topic_regex = "(?<kind>[a-z]+)-(.*)""#,
            r#""linger.ms" = "10""#,
        ] {
            assert!(toml.contains(expected), "{expected} missing in\n{toml}");
        }
        assert!(!toml.contains("/secrets/"), "{toml}");
        let notes = options(&imported.notes);
        for option in [
            "database.password",
            "table.include.list",
            "transforms.unwrap.type",
            "transforms.router.route.topic.regex",
            "transforms.router.route.tombstone.on.empty.payload",
            "transforms.router.table.op.invalid.behavior",
            "transforms.router.table.expand.json.payload",
            "value.converter",
            "producer.override.acks",
            "producer.override.max.request.size",
        ] {
            assert!(notes.contains(&option), "no note for {option}: {notes:?}");
        }
        let table_note = imported
            .notes
            .iter()
            .find(|n| n.option == "table.include.list")
            .unwrap();
        assert!(table_note.reason.contains("audit.log"), "{table_note}");
    }

    #[test]
    fn not_an_outbox_connector_is_an_error() {
        let mut connector = parse_json(EXAMPLE).unwrap();
        connector.options.insert(
            "connector.class".into(),
            "io.debezium.connector.mysql.MySqlConnector".into(),
        );
        assert!(
            matches!(translate(&connector), Err(ImportError::Unsupported { option, .. }) if option == "connector.class")
        );
        let mut connector = parse_json(EXAMPLE).unwrap();
        connector.options.remove("transforms");
        assert!(
            matches!(translate(&connector), Err(ImportError::Unsupported { option, .. }) if option == "transforms")
        );
        let mut connector = parse_json(EXAMPLE).unwrap();
        connector.options.insert(
            "transforms.outbox.table.fields.additional.placement".into(),
            "type:body".into(),
        );
        let err = translate(&connector).unwrap_err();
        assert!(err.to_string().contains("type:body"), "{err}");
    }

    #[test]
    fn bare_config_maps_and_bad_files_parse_as_expected() {
        let bare =
            parse_json(r#"{"name": "n", "database.port": 5433, "slot.drop.on.stop": false}"#)
                .unwrap();
        assert_eq!(bare.name.as_deref(), Some("n"));
        assert_eq!(bare.options["database.port"], "5433");
        assert_eq!(bare.options["slot.drop.on.stop"], "false");
        assert!(parse_json("[]").is_err());
        assert!(parse_json(r#"{"config": 1}"#).is_err());
        assert!(parse_json(r#"{"a": [1]}"#).unwrap_err().contains('a'));
        assert_eq!(java_replacement("x.$1-${name}.$23"), "x.${1}-${name}.${23}");
    }
}
