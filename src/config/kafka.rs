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
            .field("create_topics", &self.create_topics)
            .finish()
    }
}
