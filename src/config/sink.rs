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

use super::{redact_url, validate_topic, ConfigError};

pub mod http;
pub use http::{HttpConfig, SinkSecret, DESTINATION_PLACEHOLDER};

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
    /// Webhooks: one `POST` per record.
    Http(HttpConfig),
}

impl SinkConfig {
    /// The `kind` as written in the file, for logs, metrics and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Kafka => "kafka",
            SinkConfig::Redis(_) => "redis",
            SinkConfig::Http(_) => "http",
        }
    }

    /// The server it connects to, password hidden, for logs and errors.
    pub fn server(&self) -> String {
        match self {
            SinkConfig::Kafka => String::new(),
            SinkConfig::Redis(redis) => redact_url(&redis.url),
            SinkConfig::Http(http) => redact_url(&http.url),
        }
    }

    /// What a destination of this sink is called, for errors ("Kafka topic name").
    pub fn destination_noun(&self) -> &'static str {
        match self {
            SinkConfig::Kafka | SinkConfig::Redis(_) => "Kafka topic name",
            SinkConfig::Http(_) => "webhook destination",
        }
    }

    /// Checks that the sink can take `destination` (a routed topic, or the sample of the
    /// topic template at start): Kafka's topic name rules, or the kind's own.
    ///
    /// Returns the rule it breaks.
    pub fn check_destination(&self, destination: &str) -> Result<(), &'static str> {
        match self {
            SinkConfig::Kafka | SinkConfig::Redis(_) => validate_topic(destination),
            SinkConfig::Http(http) => http.check_destination(destination),
        }
    }

    /// Checks `dead_letter_topic` for this sink.
    ///
    /// Returns the problem, naming the topic.
    pub fn check_dead_letter(&self, topic: &str) -> Result<(), String> {
        match self {
            SinkConfig::Http(http) => http.check_dead_letter(topic),
            _ => self.check_destination(topic).map_err(|reason| {
                format!("{topic:?} is not a legal {}: {reason}", self.destination_noun())
            }),
        }
    }

    /// Checks the kind's settings (after [`SinkConfig::resolve`]).
    ///
    /// Returns every problem, each with its field under `sink.`.
    pub fn problems(&self) -> Vec<ConfigError> {
        match self {
            SinkConfig::Kafka | SinkConfig::Redis(_) => Vec::new(),
            SinkConfig::Http(http) => http.problems(),
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
            SinkConfig::Http(http) => {
                if let Some(url) =
                    secret("url", &http.url, http.url_file.take(), expand, &mut problems)
                {
                    http.url = SinkUrl(url);
                }
                if let Some(value) =
                    secret("secret", &http.secret.0, http.secret_file.take(), expand, &mut problems)
                {
                    http.secret = SinkSecret(value);
                }
            }
        }
        problems
    }
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
    fn http_takes_its_url_and_secret_from_the_environment_or_files() {
        let h: Holder = toml::from_str(
            "[sink]\nkind = \"http\"\nurl = \"https://h/${P}/{destination}\"\nsecret = \"${P}\"",
        )
        .unwrap();
        let mut sink = h.sink;
        let expand = |v: &str| Ok::<_, String>(v.replace("${P}", "secret"));
        assert!(sink.resolve(&expand).is_empty());
        let SinkConfig::Http(http) = &sink else {
            panic!("not http")
        };
        assert_eq!(&*http.url, "https://h/secret/{destination}");
        assert_eq!(http.secret.0, "secret");
        assert_eq!(http.max_concurrency, http::DEFAULT_HTTP_MAX_CONCURRENCY);
        assert!(!format!("{sink:?}").contains("secret\""), "{sink:?}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "whsec_Zm9v\n").unwrap();
        let mut sink = SinkConfig::Http(HttpConfig {
            url: SinkUrl("https://h/".into()),
            secret_file: Some(path.display().to_string()),
            ..HttpConfig::default()
        });
        assert!(sink.resolve(&expand).is_empty());
        let SinkConfig::Http(http) = &sink else { unreachable!() };
        assert_eq!(http.secret.0, "whsec_Zm9v");
        let mut sink = SinkConfig::Http(HttpConfig {
            secret_file: Some("/nonexistent/secret".into()),
            ..HttpConfig::default()
        });
        assert_eq!(sink.resolve(&expand)[0].0, "sink.secret_file");
    }

    #[test]
    fn unknown_kinds_and_keys_are_refused() {
        let e = toml::from_str::<Holder>("[sink]\nkind = \"pulsar\"").err().unwrap();
        assert!(e.to_string().contains("pulsar"), "{e}");
        let e = toml::from_str::<Holder>("[sink]\nkind = \"redis\"\nurll = \"x\"").err().unwrap();
        assert!(e.to_string().contains("urll"), "{e}");
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
