//! The Kafka producer's settings of a pipeline, and the librdkafka properties the relay's
//! guarantees depend on.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Kafka producer settings: a pipeline's `kafka` table, and the file's `[kafka]` defaults.
#[derive(Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// `host:port[,host:port...]`; empty in a pipeline of the file: the `[kafka]` default.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub bootstrap_servers: String,
    /// Extra librdkafka properties (`security.protocol`, `sasl.*`, `linger.ms`, ...), a TOML
    /// table of strings in the file.
    #[serde(with = "properties_table", skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<(String, String)>,
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
            .finish()
    }
}
