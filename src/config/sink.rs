//! Where a pipeline's events go: its `sink` table, `kind` plus that kind's settings.
//!
//! ```toml
//! [pipelines.sink]
//! kind = "redis"
//! url = "redis://relay:${REDIS_PASSWORD}@cache:6379/0"
//! ```
//!
//! Without a `sink` table a pipeline publishes to Kafka with its `kafka` table, as before
//! sinks had kinds. Every other kind is published through
//! [`crate::sink::ordered::OrderedSink`]: one key's records one at a time, retried with backoff
//! for up to `delivery_timeout_ms`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{redact_url, validate_topic};

mod nats;
pub use nats::{
    validate_subject, NatsConfig, NatsServer, NatsUrl, DEFAULT_NATS_MAX_CONCURRENCY,
    MAX_SUBJECT_LEN,
};

/// How long an ordered sink retries one record before the session fails over it (the
/// supervisor then reconnects): long enough to ride out a server restart, short enough that
/// an outage shows as failed sessions within a minute.
pub const DEFAULT_DELIVERY_TIMEOUT_MS: u64 = 60_000;
/// Records published concurrently by a Redis sink (different keys: one key's records go one
/// at a time). The multiplexed connection pipelines them.
pub const DEFAULT_REDIS_MAX_CONCURRENCY: usize = 256;

/// A pipeline's `sink` table (the `kind` key chooses the variant).
#[derive(Clone, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SinkConfig {
    /// Kafka, with the pipeline's `kafka` table (the default).
    #[default]
    Kafka,
    /// Redis Streams: one `XADD` per record.
    Redis(RedisConfig),
    /// NATS JetStream: one publish per record, acknowledged by the stream's PubAck.
    Nats(NatsConfig),
}

/// Which destination names a sink kind takes: the router checks the template and
/// `dead_letter_topic` against them at start, and each event's routed destination.
#[derive(Clone, Copy, Debug)]
pub struct DestinationRules {
    /// What a destination is, for errors: `Kafka topic name`, `NATS subject`.
    pub name: &'static str,
    /// Returns the rule a destination breaks.
    pub check: fn(&str) -> Result<(), &'static str>,
}

impl SinkConfig {
    /// The `kind` as written in the file, for logs, metrics and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Kafka => "kafka",
            SinkConfig::Redis(_) => "redis",
            SinkConfig::Nats(_) => "nats",
        }
    }

    /// The rules of this kind's destination names.
    pub fn destinations(&self) -> DestinationRules {
        match self {
            SinkConfig::Kafka => DestinationRules {
                name: "Kafka topic name",
                check: validate_topic,
            },
            SinkConfig::Redis(_) => DestinationRules {
                name: "Redis stream key",
                check: validate_stream_key,
            },
            SinkConfig::Nats(_) => DestinationRules {
                name: "NATS subject",
                check: validate_subject,
            },
        }
    }

    /// Checks the kind's settings; each problem names its field (`sink.url`, ...).
    pub fn problems(&self) -> Vec<super::ConfigError> {
        let mut problems = Vec::new();
        let mut problem =
            |field: &str, text: String| problems.push(super::ConfigError::new(&format!("sink.{field}"), text));
        match self {
            SinkConfig::Kafka => {}
            SinkConfig::Redis(redis) => {
                let scheme = redis.url.split_once("://").map(|(scheme, _)| scheme);
                if redis.url.trim().is_empty() {
                    problem("url", "must not be empty".into());
                } else if !matches!(scheme, Some("redis" | "rediss" | "redis+unix" | "unix")) {
                    problem(
                        "url",
                        format!("{:?}: expected redis://, rediss:// (TLS) or redis+unix://", redact_url(&redis.url)),
                    );
                }
                delivery_problems(redis.max_concurrency, redis.delivery_timeout_ms, &mut problem);
            }
            SinkConfig::Nats(nats) => {
                delivery_problems(nats.max_concurrency, nats.delivery_timeout_ms, &mut problem);
            }
        }
        problems
    }

    /// The server it connects to, password hidden, for logs and errors.
    pub fn server(&self) -> String {
        match self {
            SinkConfig::Kafka => String::new(),
            SinkConfig::Redis(redis) => redact_url(&redis.url),
            SinkConfig::Nats(nats) => nats.shown(),
        }
    }

    /// Resolves what the file may leave to the environment or a file: `${NAME}` references in
    /// URLs (with `expand`) and `*_file` settings read into their values. Returns each problem
    /// with its field name under `sink.`.
    pub(crate) fn resolve(
        &mut self,
        expand: &dyn Fn(&str) -> Result<String, String>,
    ) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        match self {
            SinkConfig::Kafka => {}
            SinkConfig::Redis(redis) => {
                if let Some(url) =
                    secret("url", &redis.url, redis.url_file.take(), expand, &mut problems)
                {
                    redis.url = SinkUrl(url);
                }
            }
            SinkConfig::Nats(nats) => nats.resolve(expand, &mut problems),
        }
        problems
    }
}

/// The ordered sink's settings every kind but Kafka has: both must be above 0.
fn delivery_problems(
    max_concurrency: usize,
    delivery_timeout_ms: u64,
    problem: &mut impl FnMut(&str, String),
) {
    if max_concurrency == 0 {
        problem("max_concurrency", "must be greater than 0".into());
    }
    if delivery_timeout_ms == 0 {
        problem("delivery_timeout_ms", "must be greater than 0".into());
    }
}

/// Any byte string but the empty one is a Redis key (`orders:events` included).
fn validate_stream_key(key: &str) -> Result<(), &'static str> {
    if key.is_empty() {
        return Err("empty");
    }
    Ok(())
}

/// `value` with `${NAME}` references expanded, or the contents of `file` (trimmed) when one is
/// given instead; `None` after recording a problem for `field`.
fn secret(
    field: &str,
    value: &str,
    file: Option<String>,
    expand: &dyn Fn(&str) -> Result<String, String>,
    problems: &mut Vec<(String, String)>,
) -> Option<String> {
    match (value.is_empty(), file) {
        (_, None) => match expand(value) {
            Ok(value) => Some(value),
            Err(e) => {
                problems.push((format!("sink.{field}"), e));
                None
            }
        },
        (true, Some(file)) => match std::fs::read_to_string(&file) {
            Ok(value) => Some(value.trim().to_owned()),
            Err(e) => {
                problems.push((format!("sink.{field}_file"), format!("cannot read {file:?}: {e}")));
                None
            }
        },
        (false, Some(_)) => {
            problems.push((
                format!("sink.{field}"),
                format!("set one of {field} and {field}_file, not both"),
            ));
            None
        }
    }
}

/// [`secret`] for a setting that may be left out: `None` when neither `value` nor `file` is
/// given.
fn optional_secret(
    field: &str,
    value: Option<&str>,
    file: Option<String>,
    expand: &dyn Fn(&str) -> Result<String, String>,
    problems: &mut Vec<(String, String)>,
) -> Option<Secret> {
    if value.is_none() && file.is_none() {
        return None;
    }
    secret(field, value.unwrap_or_default(), file, expand, problems).map(Secret)
}

/// A secret setting (a token, a key seed); `Debug` shows `***`.
#[derive(Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::ops::Deref for Secret {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// A sink server's URL; `Debug` hides its password.
#[derive(Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct SinkUrl(pub String);

impl std::ops::Deref for SinkUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SinkUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact_url(&self.0), f)
    }
}

/// `kind = "redis"`: Redis Streams.
///
/// Each record is `XADD <stream> * id <event id> key <aggregate id> [event_type ...] [header
/// fields] payload <value>`, the stream being the routed destination (`<aggregate_type>.events`
/// by default). An `XADD` reply is an acknowledgement: how durable it is depends on the
/// server's persistence settings (README, "Redis Streams").
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host[:port][/db]` (`rediss://` for TLS); `${NAME}` references
    /// are resolved from the environment.
    pub url: SinkUrl,
    /// A file holding `url` (a mounted secret), instead of `url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url_file: Option<String>,
    /// `MAXLEN ~ <n>` on each `XADD`: trims the stream to about that many entries; `None`:
    /// never trimmed by the relay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_len: Option<u64>,
    /// [`DEFAULT_REDIS_MAX_CONCURRENCY`].
    pub max_concurrency: usize,
    /// [`DEFAULT_DELIVERY_TIMEOUT_MS`].
    pub delivery_timeout_ms: u64,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: SinkUrl::default(),
            url_file: None,
            max_len: None,
            max_concurrency: DEFAULT_REDIS_MAX_CONCURRENCY,
            delivery_timeout_ms: DEFAULT_DELIVERY_TIMEOUT_MS,
        }
    }
}

impl RedisConfig {
    pub fn delivery_timeout(&self) -> Duration {
        Duration::from_millis(self.delivery_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Holder {
        #[serde(default)]
        sink: SinkConfig,
    }

    #[test]
    fn kafka_is_the_default_and_kind_chooses_the_variant() {
        let h: Holder = toml::from_str("").unwrap();
        assert_eq!(h.sink, SinkConfig::Kafka);
        let h: Holder = toml::from_str("[sink]\nkind = \"redis\"\nurl = \"redis://h\"\nmax_len = 5").unwrap();
        let SinkConfig::Redis(redis) = h.sink else {
            panic!("not redis")
        };
        assert_eq!(&*redis.url, "redis://h");
        assert_eq!(redis.max_len, Some(5));
        assert_eq!(redis.max_concurrency, DEFAULT_REDIS_MAX_CONCURRENCY);
    }

    #[test]
    fn unknown_kinds_and_keys_are_refused() {
        let e = toml::from_str::<Holder>("[sink]\nkind = \"pulsar\"").err().unwrap();
        assert!(e.to_string().contains("pulsar"), "{e}");
        let e = toml::from_str::<Holder>("[sink]\nkind = \"redis\"\nurll = \"x\"").err().unwrap();
        assert!(e.to_string().contains("urll"), "{e}");
    }

    #[test]
    fn bad_settings_are_problems_naming_the_field() {
        let fields = |redis: RedisConfig| -> Vec<String> {
            SinkConfig::Redis(redis).problems().into_iter().map(|p| p.field).collect()
        };
        assert_eq!(fields(RedisConfig::default()), ["sink.url"]);
        assert_eq!(
            fields(RedisConfig {
                url: SinkUrl("http://h".into()),
                max_concurrency: 0,
                delivery_timeout_ms: 0,
                ..RedisConfig::default()
            }),
            ["sink.url", "sink.max_concurrency", "sink.delivery_timeout_ms"]
        );
        assert!(fields(RedisConfig {
            url: SinkUrl("rediss://u:p@h:6380/1".into()),
            ..RedisConfig::default()
        })
        .is_empty());
    }

    #[test]
    fn url_file_replaces_url_and_both_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("url");
        std::fs::write(&path, "redis://:pw@h\n").unwrap();
        let expand = |v: &str| Ok::<_, String>(v.replace("${P}", "secret"));
        let mut sink = SinkConfig::Redis(RedisConfig {
            url_file: Some(path.display().to_string()),
            ..RedisConfig::default()
        });
        assert!(sink.resolve(&expand).is_empty());
        let SinkConfig::Redis(redis) = &sink else { unreachable!() };
        assert_eq!(&*redis.url, "redis://:pw@h");
        assert!(!format!("{:?}", redis.url).contains("pw"));

        let mut sink = SinkConfig::Redis(RedisConfig {
            url: SinkUrl("redis://:${P}@h".into()),
            ..RedisConfig::default()
        });
        assert!(sink.resolve(&expand).is_empty());
        let SinkConfig::Redis(redis) = &sink else { unreachable!() };
        assert_eq!(&*redis.url, "redis://:secret@h");

        let mut sink = SinkConfig::Redis(RedisConfig {
            url: SinkUrl("redis://h".into()),
            url_file: Some(path.display().to_string()),
            ..RedisConfig::default()
        });
        let problems = sink.resolve(&expand);
        assert_eq!(problems[0].0, "sink.url", "{problems:?}");
    }
}
