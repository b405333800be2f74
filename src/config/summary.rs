//! A pipeline's settings as one log line: the keys that differ from their defaults (the
//! schema leaves defaults out when it serializes), secrets hidden.

use serde_json::Value;

use super::{redact_url, PipelineConfig};

/// Key parts that name a secret: their values are never shown (a URL's password is hidden
/// by [`redact_url`] instead).
const SECRET_KEYS: &[&str] = &[
    "password",
    "secret",
    "token",
    "credential",
    "nkey",
    "sasl.",
    "ssl.key",
    "private",
];

impl PipelineConfig {
    /// The settings that differ from their defaults, as compact JSON on one line, with every
    /// secret replaced by `***` and URLs without their passwords.
    pub fn summary(&self) -> String {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        hide_secrets(&mut value, "");
        value.to_string()
    }
}

fn hide_secrets(value: &mut Value, key: &str) {
    let lower = key.to_ascii_lowercase();
    if SECRET_KEYS.iter().any(|part| lower.contains(part)) && !value.is_null() {
        *value = Value::String("***".into());
        return;
    }
    match value {
        // A libpq `key=value` string holds its password without `://`.
        Value::String(text) if key.ends_with("_url") && !text.contains("://") => {
            *text = redact_url(text)
        }
        Value::String(text) if text.contains("://") => *text = crate::config::redact_url_path(text),
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                hide_secrets(value, key);
            }
        }
        Value::Array(items) => {
            for item in items {
                // A `kafka.properties` entry is a [key, value] pair.
                if let Value::Array(pair) = item {
                    if let [Value::String(k), v] = pair.as_mut_slice() {
                        let k = k.clone();
                        hide_secrets(v, &k);
                        continue;
                    }
                }
                hide_secrets(item, key);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Secret, TableName};

    #[test]
    fn the_summary_shows_what_differs_from_the_defaults_and_no_secret() {
        let mut config =
            PipelineConfig::new("orders", "public.outbox".parse::<TableName>().unwrap());
        config.source_url = "postgres://relay:hunter2@db.internal/app".into();
        config.source_password = Some(Secret("s3cret-pw".into()));
        config.slot = "orders_slot".into();
        config.kafka.bootstrap_servers = "kafka-1:9092".into();
        config.kafka.properties = vec![
            ("sasl.password".into(), "kafka-pw".into()),
            ("ssl.key.password".into(), "key-pw".into()),
            ("linger.ms".into(), "1".into()),
        ];
        config.max_in_flight_events = 500;
        config.sink = crate::config::SinkConfig::Http(crate::config::HttpConfig {
            url: crate::config::SinkUrl("https://hooks.example.com/services/T0KEN?sig=abc".into()),
            secret: Secret("hmac-key".into()),
            ..Default::default()
        });
        config.standby_url = Some("host=standby user=relay password=kv-secret".into());
        let summary = config.summary();
        for secret in [
            "kv-secret",
            "hunter2",
            "s3cret-pw",
            "kafka-pw",
            "key-pw",
            "T0KEN",
            "abc",
            "hmac-key",
        ] {
            assert!(!summary.contains(secret), "{secret} in {summary}");
        }
        for shown in [
            "\"slot\":\"orders_slot\"",
            "\"max_in_flight_events\":500",
            "linger.ms",
            "db.internal",
        ] {
            assert!(summary.contains(shown), "{shown} missing in {summary}");
        }
        assert!(
            !summary.contains("shutdown_timeout_secs"),
            "defaults are left out: {summary}"
        );
        assert!(!summary.contains('\n'));
    }
}
