//! Loads the TOML config file: one `[[pipelines]]` entry per source database, `[kafka]`
//! defaults a pipeline may override, and `[metrics]`.
//!
//! Layering is figment's: the file, then `OUTBOX_RELAY__<SECTION>__<KEY>` environment
//! variables (`__` separates the levels; names are case-insensitive). Top-level sections merge
//! as figment's `Env` provider does (`OUTBOX_RELAY__KAFKA__BOOTSTRAP_SERVERS`,
//! `OUTBOX_RELAY__METRICS__LISTEN`). A pipeline is selected by its index in the file or its
//! name, then the field path follows: `OUTBOX_RELAY__PIPELINES__0__SLOT`,
//! `OUTBOX_RELAY__PIPELINES__ORDERS__KAFKA__BOOTSTRAP_SERVERS`,
//! `OUTBOX_RELAY__PIPELINES__orders__ROUTE__TOPIC_CASE` (a name matches case-insensitively when
//! no pipeline has exactly that name). Such a variable changes one field of a pipeline that
//! the file defines; naming a pipeline the file does not have, or no field, is an error
//! naming the variable. Values parse as figment's `Env` parses them (`5` a number, `true` a
//! boolean), except that a field the file holds as a string, every `kafka.properties`
//! value and the secrets (`secret`, `token`, `nkey`) stay strings. A value of the wrong type
//! is named by its field path, never shown. Environment variable names cannot contain `.`, so property names with
//! dots (`linger.ms`) cannot be reached this way: write `"linger.ms" = "${LINGER_MS}"` in the
//! file instead.
//!
//! Inside pipelines, values name environment variables with `${NAME}` (any string value of
//! `source_url`, `standby_url`, `kafka.bootstrap_servers` and `kafka.properties`), and `source_url_file`
//! reads the URL from a file (a mounted secret). Problems are listed all at once, each with its
//! field path.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Value};
use figment::Figment;
use serde::{Deserialize, Serialize};

pub use super::ConfigErrors;
use super::{ConfigError, KafkaConfig, PipelineConfig, Secret, SinkConfig, SourceKind};

/// The whole file, resolved: pipelines with their Kafka settings merged, and the metrics
/// listener.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub pipelines: Vec<PipelineConfig>,
    /// Address of the `/metrics`, `/healthz` and `/readyz` endpoint; `None`: not served.
    pub metrics_listen: Option<SocketAddr>,
    /// What a pipeline stopped by an error that retrying cannot fix does to the process.
    pub on_pipeline_failure: OnPipelineFailure,
}

/// What a pipeline stopped by an error that retrying cannot fix does to the process
/// (`on_pipeline_failure`; docs/operations/runbook.md, "Exit codes").
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
pub enum OnPipelineFailure {
    /// The other pipelines drain and the process exits with the failed pipeline's exit code,
    /// for systemd or Kubernetes to act on.
    #[default]
    Exit,
    /// The failed pipeline stays `failed` (`/readyz` fails, `/healthz` does not) and is
    /// started again after a long backoff (1 minute doubling to 15); the others go on.
    Retry,
}

/// The file as written: `[kafka]` defaults, `[metrics]`, and the `[[pipelines]]` entries
/// (what `import-debezium` prints).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Brokers and properties of every pipeline that does not set its own.
    #[serde(default)]
    pub kafka: KafkaConfig,
    #[serde(default, skip_serializing_if = "MetricsSection::is_empty")]
    #[schemars(!skip_serializing_if)]
    pub metrics: MetricsSection,
    /// What a pipeline stopped by an error that retrying cannot fix does.
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub on_pipeline_failure: OnPipelineFailure,
    /// The log's level and format.
    ///
    /// Read before the rest of the file, to set up logging ([`log_section`]).
    #[serde(default, skip_serializing_if = "is_default")]
    #[schemars(!skip_serializing_if)]
    pub log: LogSection,
    /// One entry per source database.
    #[serde(default)]
    pub pipelines: Vec<PipelineConfig>,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// `[log]`: the level and format of the log, under `--log-level` and `--log-format` (and
/// their variables), which win.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `error`, `warn`, `info`, `debug`, `trace`, or a filter such as
    /// `outbox_relay=debug,info` (`RUST_LOG`, when set, wins); unset: `info`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub level: Option<String>,
    /// Unset: `text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub format: Option<crate::logging::LogFormat>,
}

/// The `[log]` section of the file at `path`, with its `OUTBOX_RELAY__LOG__*` overrides, read
/// on its own before logging is set up; a file that cannot be read or parsed gives none
/// (loading it later reports why).
pub fn log_section(path: &Path) -> LogSection {
    Figment::new()
        .merge(Toml::file_exact(path))
        .merge(
            Env::prefixed(ENV_PREFIX)
                .split("__")
                .filter(|key| key.starts_with("log.")),
        )
        .extract_inner::<LogSection>("log")
        .unwrap_or_default()
}

/// `[metrics]`: the HTTP endpoint of `/metrics`, `/healthz` and `/readyz`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// The address to listen on, e.g. `127.0.0.1:9187`; unset: no endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub listen: Option<SocketAddr>,
}

impl MetricsSection {
    fn is_empty(&self) -> bool {
        self.listen.is_none()
    }
}

/// Loads `path`, applies `OUTBOX_RELAY__...` overrides, resolves `${NAME}` references and
/// secret files; [`crate::validation::load_file`] also checks the values.
///
/// Returns all problems at once, each naming its field path (e.g. `pipelines[1].slot`).
pub fn load(path: &Path) -> Result<RelayConfig, ConfigErrors> {
    match read(path)? {
        (relay, problems) if problems.is_empty() => Ok(relay),
        (_, problems) => Err(ConfigErrors(problems)),
    }
}

/// [`load`], returning the problems of resolution with the config instead of failing on them
/// (a field with a problem is left empty), so that a caller can list them together with its
/// own checks.
///
/// Returns an error if the file cannot be read or does not fit the schema, or if an
/// `OUTBOX_RELAY__PIPELINES__...` variable selects no pipeline or field.
pub fn read(path: &Path) -> Result<(RelayConfig, Vec<ConfigError>), ConfigErrors> {
    let figment = Figment::new().merge(Toml::file_exact(path)).merge(
        Env::prefixed(ENV_PREFIX)
            .split("__")
            .filter(|key| !key.starts_with("pipelines.")),
    );
    let figment = with_pipeline_overrides(figment, std::env::vars())?;
    resolve(figment, &|name| std::env::var(name).ok())
}

/// Prefix of the environment variables that override the file.
const ENV_PREFIX: &str = "OUTBOX_RELAY__";

/// Applies the `OUTBOX_RELAY__PIPELINES__<index or name>__<field>[__<field>...]` variables
/// among `vars` to the `pipelines` array of `figment` (see the module doc). Figment's own `Env`
/// provider would replace the array with a table keyed `0`, `orders`, ...
///
/// Returns an error naming the variable if it selects no pipeline of the file, or no field.
fn with_pipeline_overrides(
    figment: Figment,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<Figment, ConfigErrors> {
    let prefix = format!("{ENV_PREFIX}PIPELINES__");
    let mut overrides: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(name, _)| {
            name.len() > prefix.len()
                && name.is_char_boundary(prefix.len())
                && name[..prefix.len()].eq_ignore_ascii_case(&prefix)
        })
        .collect();
    if overrides.is_empty() {
        return Ok(figment);
    }
    // Deterministic order (and errors) whatever the environment's order.
    overrides.sort();
    let mut pipelines = match figment.find_value("pipelines") {
        Ok(Value::Array(_, pipelines)) => pipelines,
        // No array, or not one: extract reports it with its path.
        _ => Vec::new(),
    };
    let mut problems = Vec::new();
    for (name, raw) in overrides {
        let rest = &name[prefix.len()..];
        if let Err(problem) = apply_override(&mut pipelines, rest, &raw) {
            problems.push(ConfigError {
                field: name.clone(),
                problem,
            });
        }
    }
    if !problems.is_empty() {
        return Err(ConfigErrors(problems));
    }
    Ok(figment.merge(Serialized::default("pipelines", pipelines)))
}

/// Sets, in the pipeline that `rest` (`<index or name>__<field>[__...]`) selects, the field
/// it names to `raw`.
///
/// Returns the problem if no pipeline or no field is selected, or a level of the path is
/// not a table.
fn apply_override(pipelines: &mut [Value], rest: &str, raw: &str) -> Result<(), String> {
    let (selector, path) = rest.split_once("__").unwrap_or((rest, ""));
    let path: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
    if path.iter().any(String::is_empty) {
        return Err(format!(
            "name a field after the pipeline, e.g. {ENV_PREFIX}PIPELINES__{selector}__SLOT"
        ));
    }
    let index = select_pipeline(pipelines, selector)?;
    let Value::Dict(_, mut dict) = pipelines[index].clone() else {
        return Err(format!("pipelines[{index}] is not a table"));
    };
    set_path(&mut dict, &path, raw)
        .map_err(|at| format!("pipelines[{index}].{at} is not a table"))?;
    pipelines[index] = Value::from(dict);
    Ok(())
}

/// The index of the pipeline `selector` names: an index into the file's `[[pipelines]]`, or a
/// pipeline's `name` (exact, else the only case-insensitive match).
fn select_pipeline(pipelines: &[Value], selector: &str) -> Result<usize, String> {
    let names: Vec<Option<&str>> = pipelines
        .iter()
        .map(|p| p.find_ref("name").and_then(Value::as_str))
        .collect();
    if let Ok(index) = selector.parse::<usize>() {
        // A pipeline named like another one's index would make the variable ambiguous.
        if let Some(named) = names.iter().position(|n| *n == Some(selector)) {
            if named != index {
                return Err(format!(
                    "{selector:?} is both the index of pipelines[{index}] and the name of pipelines[{named}]: rename that pipeline"
                ));
            }
        }
        return if index < pipelines.len() {
            Ok(index)
        } else {
            Err(format!(
                "no pipeline at index {index}: the file has {} [[pipelines]] entries",
                pipelines.len()
            ))
        };
    }
    if let Some(index) = names.iter().position(|n| *n == Some(selector)) {
        return Ok(index);
    }
    let matches: Vec<usize> = (0..names.len())
        .filter(|&i| names[i].is_some_and(|n| n.eq_ignore_ascii_case(selector)))
        .collect();
    match matches[..] {
        [index] => Ok(index),
        [] => Err(format!(
            "no pipeline named {selector:?} (pipelines: {})",
            names
                .iter()
                .map(|n| format!("{:?}", n.unwrap_or("")))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => Err(format!(
            "{selector:?} matches several pipeline names when case is ignored: select it by index"
        )),
    }
}

/// Fields that hold secrets (the HTTP sink's `secret`, NATS's `token` and `nkey`, the
/// passwords beside URLs): an override of one is its text as it is, never a number (`0042` is
/// not 42).
const SECRET_FIELDS: [&str; 5] = ["secret", "token", "nkey", "password", "source_password"];

/// Sets `path` in `dict` to `raw`, creating tables on the way. The value is parsed as
/// figment's `Env` parses values, unless the file holds a string there, it is a
/// `kafka.properties` value (always strings) or a secret ([`SECRET_FIELDS`]).
///
/// Returns the dotted path of a level that exists and is not a table.
fn set_path(dict: &mut Dict, path: &[String], raw: &str) -> Result<(), String> {
    let (last, parents) = path.split_last().expect("path has at least one segment");
    let keep_string = parents.ends_with(&["kafka".to_owned(), "properties".to_owned()])
        || SECRET_FIELDS.contains(&last.as_str());
    let mut at = dict;
    for (depth, key) in parents.iter().enumerate() {
        let entry = at
            .entry(key.clone())
            .or_insert_with(|| Value::from(Dict::new()));
        match entry {
            Value::Dict(_, inner) => at = inner,
            _ => return Err(path[..=depth].join(".")),
        }
    }
    let parsed: Value = raw.parse().expect("parsing an env value is infallible");
    let value = match at.get(last) {
        Some(Value::String(..)) => Value::from(raw.to_owned()),
        _ if keep_string => Value::from(raw.to_owned()),
        _ => parsed,
    };
    at.insert(last.clone(), value);
    Ok(())
}

/// Extracts the file from `figment` and resolves each pipeline: `${NAME}` references (looked
/// up with `env`), `source_url_file`, the `[kafka]` defaults. Checks what only the file as a
/// whole can say: at least one pipeline, names, slots and transactional ids used once.
///
/// Returns the config with the problems found, each with its field path (a field with a
/// problem is left empty), or an error if the file does not fit the schema at all (syntax,
/// unknown keys, wrong types). The values themselves are checked by [`crate::validation`].
pub(crate) fn resolve(
    figment: Figment,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(RelayConfig, Vec<ConfigError>), ConfigErrors> {
    let file = extract(&figment)?;
    let mut problems = Vec::new();
    if file.pipelines.is_empty() {
        problems.push(ConfigError::new(
            "pipelines",
            "at least one [[pipelines]] entry is required",
        ));
    }
    let mut names = HashSet::new();
    let mut slots = HashSet::new();
    let mut transactional_ids = HashSet::new();
    let mut pipelines = Vec::new();
    for (i, mut p) in file.pipelines.into_iter().enumerate() {
        let at = format!("pipelines[{i}]");
        let mut problem =
            |field: &str, text: String| problems.push(ConfigError::new(field, text).under(&at));
        if !names.insert(p.name.clone()) {
            problem("name", format!("{:?} is used by another pipeline", p.name));
        }
        let url = match (p.source_url.is_empty(), &p.source_url_file) {
            (false, None) => expand(&p.source_url, env).unwrap_or_else(|e| {
                problem("source_url", e);
                String::new()
            }),
            (true, Some(file)) => match super::secret_file::read(file, "source_url_file") {
                Ok(url) => url,
                Err(e) => {
                    problem("source_url_file", format!("cannot read {file:?}: {e}"));
                    String::new()
                }
            },
            _ => {
                problem(
                    "source_url",
                    "set exactly one of source_url and source_url_file".into(),
                );
                String::new()
            }
        };
        p.source_url = url.into();
        match (p.source_password.take(), p.source_password_file.take()) {
            (None, None) => {}
            (Some(password), None) => match expand(&password, env) {
                Ok(password) => p.source_password = Some(Secret(password)),
                Err(e) => problem("source_password", e),
            },
            (None, Some(file)) => match super::secret_file::read(&file, "source_password_file") {
                Ok(password) => p.source_password = Some(Secret(password)),
                Err(e) => problem("source_password_file", format!("cannot read {file:?}: {e}")),
            },
            (Some(_), Some(_)) => problem(
                "source_password",
                "set one of source_password and source_password_file, not both".into(),
            ),
        }
        if let Some(standby) = &p.standby_url {
            p.standby_url = Some(
                expand(standby, env)
                    .unwrap_or_else(|e| {
                        problem("standby_url", e);
                        String::new()
                    })
                    .into(),
            );
        }
        for (field, text) in p.sink.resolve(&|value| expand(value, env)) {
            problem(&field, text);
        }
        if p.kafka.bootstrap_servers.is_empty() {
            p.kafka.bootstrap_servers = file.kafka.bootstrap_servers.clone();
        }
        if p.kafka.create_topics.is_none() {
            p.kafka.create_topics = file.kafka.create_topics.clone();
        }
        p.kafka.bootstrap_servers = if p.sink != SinkConfig::Kafka {
            // Not used: a `[kafka]` default naming an unset variable is no problem here.
            String::new()
        } else if p.kafka.bootstrap_servers.is_empty() {
            problem(
                "kafka.bootstrap_servers",
                "not set here nor in [kafka]".into(),
            );
            String::new()
        } else {
            expand(&p.kafka.bootstrap_servers, env).unwrap_or_else(|e| {
                problem("kafka.bootstrap_servers", e);
                String::new()
            })
        };
        if p.sink != SinkConfig::Kafka && !p.kafka.properties.is_empty() {
            problem(
                "kafka.properties",
                format!(
                    "only used with sink kind \"kafka\", not {:?}",
                    p.sink.kind()
                ),
            );
        }
        if p.sink != SinkConfig::Kafka && p.kafka.properties_file.is_some() {
            problem(
                "kafka.properties_file",
                format!(
                    "only used with sink kind \"kafka\", not {:?}",
                    p.sink.kind()
                ),
            );
        }
        // Layered, a later one winning for a key: [kafka]'s properties_file, its properties,
        // the pipeline's properties_file, its properties. A file's values are taken as written.
        let mut properties = BTreeMap::new();
        let defaults = match p.sink {
            SinkConfig::Kafka => Some(&file.kafka),
            _ => None,
        };
        let pipeline_kafka = std::mem::take(&mut p.kafka.properties);
        let pipeline_file = p.kafka.properties_file.take();
        for (from_file, inline) in [
            (
                defaults.and_then(|k| k.properties_file.clone()),
                defaults.map(|k| k.properties.clone()),
            ),
            (pipeline_file, Some(pipeline_kafka)),
        ] {
            if let Some(path) = from_file {
                match super::kafka::properties_from_file(&path) {
                    Ok(read) => properties.extend(read),
                    Err(e) => problem("kafka.properties_file", e),
                }
            }
            for (key, value) in inline.unwrap_or_default() {
                let value = expand(&value, env).unwrap_or_else(|e| {
                    problem(&format!("kafka.properties.{key}"), e);
                    String::new()
                });
                properties.insert(key, value);
            }
        }
        p.kafka.properties = properties.into_iter().collect();
        if p.source_kind == SourceKind::LogTailing
            && !p.source_url.is_empty()
            && !p.slot.is_empty()
            && !slots.insert((p.source_url.0.clone(), p.slot.clone()))
        {
            problem("slot", format!("{:?} on the same database is used by another pipeline (a slot admits one reader)", p.slot));
        }
        if p.exactly_once && !transactional_ids.insert(p.transactional_id()) {
            problem(
                "transactional_id",
                format!("{:?} is used by another pipeline: relays with one transactional id fence each other", p.transactional_id()),
            );
        }
        pipelines.push(p);
    }
    let relay = RelayConfig {
        pipelines,
        metrics_listen: file.metrics.listen,
        on_pipeline_failure: file.on_pipeline_failure,
    };
    Ok((relay, problems))
}

/// Extracts the file's schema from `figment`. serde stops at the first unknown key: each one
/// is taken out and the extraction tried again, so that every unknown key is reported at
/// once, each with the known key it most resembles.
///
/// Returns every unknown key, or else the first other problem, each with its field path.
fn extract(figment: &Figment) -> Result<FileConfig, ConfigErrors> {
    use figment::error::Kind;
    let mut value = figment.find_value("").ok();
    let mut unknown = Vec::new();
    // Bounded: each round takes one key out.
    for _ in 0..100 {
        let attempt = match &value {
            Some(v) if !unknown.is_empty() => {
                Figment::from(Serialized::defaults(v.clone())).extract::<FileConfig>()
            }
            _ => figment.extract::<FileConfig>(),
        };
        let errors = match attempt {
            Ok(file) if unknown.is_empty() => return Ok(file),
            Ok(_) => return Err(ConfigErrors(unknown)),
            Err(errors) => errors,
        };
        let mut other = Vec::new();
        let mut removed = false;
        for e in errors {
            match (&e.kind, value.as_mut()) {
                (Kind::UnknownField(name, expected), Some(root)) => {
                    let mut parent = e.path.clone();
                    parent.pop();
                    removed |= remove_key(root, &parent, name);
                    unknown.push(ConfigError {
                        field: field_path(&e.path),
                        problem: match closest(name, expected) {
                            Some(known) => format!("unknown key; did you mean `{known}`?"),
                            None => format!("unknown key; known here: {}", expected.join(", ")),
                        },
                    });
                }
                _ => other.push(ConfigError {
                    field: field_path(&e.path),
                    problem: without_value(&e.kind),
                }),
            }
        }
        if !removed {
            unknown.extend(other);
            return Err(ConfigErrors(unknown));
        }
    }
    Err(ConfigErrors(unknown))
}

/// `pipelines[0].route.by_field` from figment's path `["pipelines", "0", "route", ...]`; the
/// file as a whole is `config`.
fn field_path(path: &[String]) -> String {
    let mut text = String::new();
    for part in path {
        if part.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() {
            text.push_str(&format!("[{part}]"));
        } else {
            if !text.is_empty() {
                text.push('.');
            }
            text.push_str(part);
        }
    }
    if text.is_empty() {
        "config".into()
    } else {
        text
    }
}

/// Takes `key` out of the table at `parent` (figment path parts) under `root`; whether it was
/// there.
fn remove_key(root: &mut Value, parent: &[String], key: &str) -> bool {
    let mut at = root;
    for part in parent {
        at = match at {
            Value::Dict(_, dict) => match dict.get_mut(part) {
                Some(v) => v,
                None => return false,
            },
            Value::Array(_, items) => {
                match part.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    Some(v) => v,
                    None => return false,
                }
            }
            _ => return false,
        };
    }
    match at {
        Value::Dict(_, dict) => dict.remove(key).is_some(),
        _ => false,
    }
}

/// The known key closest to `name` by edit distance, if close enough to be a misspelling.
fn closest<'a>(name: &str, known: &'a [&'static str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .filter(|(d, k)| *d <= (k.len().max(name.len()) / 3).max(1))
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// figment's text for `kind` without the value it found, which may be a secret: the field
/// path names where it is (`invalid type: found unsigned int, expected a string`).
fn without_value(kind: &figment::error::Kind) -> String {
    use figment::error::{Actual, Kind};
    let shown = |actual: &Actual| match actual {
        Actual::Bool(_) => "a boolean".to_owned(),
        Actual::Unsigned(_) => "unsigned int".to_owned(),
        Actual::Signed(_) => "signed int".to_owned(),
        Actual::Float(_) => "float".to_owned(),
        Actual::Char(_) => "char".to_owned(),
        Actual::Str(_) => "string".to_owned(),
        Actual::Bytes(_) => "bytes".to_owned(),
        Actual::Other(_) => "a value".to_owned(),
        other => other.to_string(),
    };
    match kind {
        Kind::InvalidType(actual, expected) => {
            format!("invalid type: found {}, expected {expected}", shown(actual))
        }
        Kind::InvalidValue(actual, expected) => {
            format!(
                "invalid value: found {}, expected {expected}",
                shown(actual)
            )
        }
        Kind::Unsupported(actual) => format!("unsupported type {}", shown(actual)),
        Kind::UnsupportedKey(actual, expected) => {
            format!("unsupported key {}: expected {expected}", shown(actual))
        }
        Kind::Message(message) => without_snippet(message),
        other => other.to_string(),
    }
}

/// A parse error's text without the parser's snippet of the file (`5 | secret = "...`), which
/// may hold a secret: `TOML parse error at line 5, column 27: invalid basic string`.
fn without_snippet(message: &str) -> String {
    let is_snippet = |line: &str| {
        line.trim_start()
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .trim_start()
            .starts_with('|')
    };
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !is_snippet(line))
        .collect::<Vec<_>>()
        .join(": ")
}

/// Replaces each `${NAME}` in `value` with the environment variable `NAME`.
///
/// Returns an error naming the variable if it is not set, or if a `${` is not closed.
fn expand(value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        // The value may be a secret: name the position, not the text.
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ at byte {}", value.len() - rest.len() + start))?;
        let name = &after[..end];
        out.push_str(&env(name).ok_or_else(|| format!("environment variable {name} is not set"))?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests;
