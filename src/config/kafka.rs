//! The Kafka producer's settings of a pipeline, and the librdkafka properties the relay's
//! guarantees depend on.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Kafka producer settings: a pipeline's `kafka` table, and the file's `[kafka]` defaults.
#[derive(Clone, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// `host:port[,host:port...]`; empty in a pipeline of the file: the `[kafka]` default.
    #[serde(skip_serializing_if = "String::is_empty")]
    #[schemars(!skip_serializing_if)]
    pub bootstrap_servers: String,
    /// Extra librdkafka properties (`security.protocol`, `sasl.*`, `linger.ms`, ...), a TOML
    /// table of strings in the file.
    #[serde(with = "properties_table", skip_serializing_if = "Vec::is_empty")]
    #[schemars(!skip_serializing_if)]
    #[schemars(with = "std::collections::BTreeMap<String, String>")]
    pub properties: Vec<(String, String)>,
    /// A file of librdkafka properties (`key=value` lines, `#` comments), such as a mounted
    /// secret with `sasl.password`: read at start, before `properties`, which win for a key set
    /// in both. Its values are taken as written (no `${NAME}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub properties_file: Option<String>,
    /// Create a missing topic through the admin API before its first record; `None`: a
    /// missing topic holds its records (and reading) until someone creates it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub create_topics: Option<CreateTopics>,
}

/// `kafka.create_topics`: how a topic the relay creates is made.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTopics {
    /// Partitions; -1: the broker's `num.partitions`.
    #[serde(default = "broker_default")]
    pub partitions: i32,
    /// Replicas of each partition; -1: the broker's `default.replication.factor`.
    #[serde(default = "broker_default")]
    pub replication_factor: i32,
    /// Topic configs (`cleanup.policy`, `retention.ms`, `min.insync.replicas`, ...), a table
    /// of strings.
    #[serde(
        default,
        with = "properties_table",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(!skip_serializing_if)]
    #[schemars(with = "std::collections::BTreeMap<String, String>")]
    pub config: Vec<(String, String)>,
}

fn broker_default() -> i32 {
    -1
}

impl CreateTopics {
    /// Every problem of the settings, as (field under `kafka.create_topics`, text).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        for (field, value) in [
            ("partitions", self.partitions),
            ("replication_factor", self.replication_factor),
        ] {
            if value == 0 || value < -1 {
                problems.push((
                    field,
                    format!("{value}: give a positive number, or -1 for the broker's default"),
                ));
            }
        }
        problems
    }
}

/// `kafka.properties` as a table of strings; read in key order, a later key replacing an
/// earlier one.
mod properties_table {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(
        properties: &[(String, String)],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let table: BTreeMap<&str, &str> = properties
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        table.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<(String, String)>, D::Error> {
        Ok(BTreeMap::<String, String>::deserialize(deserializer)?
            .into_iter()
            .collect())
    }
}

/// Reads the librdkafka properties of `path` (`kafka.properties_file`), warning when others
/// may read it ([`super::secret_file::warn_if_exposed`]).
///
/// Returns an error naming the file, and the line without its text (it may hold a secret).
pub(super) fn properties_from_file(path: &str) -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path:?}: {e}"))?;
    super::secret_file::warn_if_exposed(std::path::Path::new(path), "kafka.properties_file");
    parse_properties(&text).map_err(|e| format!("{path:?}: {e}"))
}

impl KafkaConfig {
    /// Reads `properties_file` (if set) into `properties`, under the properties given there
    /// already (the `--kafka-property` flags win), as [`super::file::load`] does for a file's
    /// pipelines.
    ///
    /// Returns an error naming the setting and the file if it cannot be read or parsed.
    pub fn read_properties_file(&mut self) -> Result<(), super::ConfigError> {
        let Some(path) = self.properties_file.take() else {
            return Ok(());
        };
        let mut properties: std::collections::BTreeMap<String, String> =
            properties_from_file(&path)
                .map_err(|e| super::ConfigError::new("kafka.properties_file", e))?
                .into_iter()
                .collect();
        properties.extend(std::mem::take(&mut self.properties));
        self.properties = properties.into_iter().collect();
        Ok(())
    }
}

/// The properties in `text`: librdkafka's `key=value` (or `key: value`) lines, the key trimmed
/// and the value without its leading blanks and taken as written (no Java `.properties`
/// escapes: a backslash is a backslash), lines starting with `#` or `!` and blank lines left
/// out, a later key replacing an earlier one; a UTF-8 byte order mark at the start is dropped.
///
/// Returns an error naming the line (never its text) for a line without `=` or `:`, a key with
/// blanks inside (Java's `key value` form), and a line ending in `\` (Java's continuation).
fn parse_properties(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut properties = std::collections::BTreeMap::new();
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_start().trim_end_matches('\r');
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        if line.ends_with('\\') {
            return Err(format!(
                "line {}: a line continued with a backslash is not supported; write the value on one line",
                n + 1
            ));
        }
        let Some(split) = line.find(['=', ':']) else {
            return Err(format!("line {}: expected key=value", n + 1));
        };
        let key = line[..split].trim();
        if key.is_empty() {
            return Err(format!("line {}: no key before the '='", n + 1));
        }
        if key.contains(char::is_whitespace) {
            return Err(format!(
                "line {}: a key with blanks inside; write key=value",
                n + 1
            ));
        }
        properties.insert(key.to_owned(), line[split + 1..].trim_start().to_owned());
    }
    Ok(properties.into_iter().collect())
}

/// librdkafka properties the relay's guarantees depend on; setting them otherwise is an error.
pub(super) const REQUIRED_KAFKA_PROPERTIES: &[(&str, &str)] =
    &[("enable.idempotence", "true"), ("acks", "all")];

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Property values may hold SASL passwords or keys.
        let keys: Vec<&str> = self.properties.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("properties", &keys)
            .field("properties_file", &self.properties_file)
            .field("create_topics", &self.create_topics)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_properties_file_is_read_as_kafka_clients_write_it() {
        let text = "\u{feff}# SASL\n! also a comment\n\nsecurity.protocol=SASL_SSL\n  sasl.mechanism : SCRAM-SHA-512\nsasl.password=p@ss#w/rd=:x \r\nlinger.ms=5\nlinger.ms=1\n";
        assert_eq!(
            parse_properties(text).unwrap(),
            [
                ("linger.ms", "1"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.password", "p@ss#w/rd=:x "),
                ("security.protocol", "SASL_SSL"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn a_line_that_is_no_property_is_named_by_its_number_never_its_text() {
        for (text, expected) in [
            ("a=1\nhunter2\n", "line 2: expected key=value"),
            ("=hunter2\n", "line 1: no key"),
            (
                "sasl.password hunter2:x\n",
                "line 1: a key with blanks inside",
            ),
            ("sasl.password=hun\\\n  ter2\n", "line 1: a line continued"),
        ] {
            let error = parse_properties(text).unwrap_err();
            assert!(error.starts_with(expected), "{error}");
            assert!(!error.contains("hun"), "{error}");
        }
    }
}
