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
mod nats;
pub use http::{HttpConfig, DESTINATION_PLACEHOLDER};
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
/// Records published concurrently by a RabbitMQ sink (different keys), each on a channel of
/// its own until its confirm: enough to keep publisher confirms, which the server batches,
/// flowing.
pub const DEFAULT_RABBITMQ_MAX_CONCURRENCY: usize = 256;
/// RabbitMQ's own default `max_message_size` (3.8+): 128 MiB. A larger record is refused
/// before it is sent (the server would close the channel over it).
pub const DEFAULT_RABBITMQ_MAX_MESSAGE_BYTES: usize = 128 * 1024 * 1024;
/// The content type of each message: the outbox payload is `jsonb` by default.
pub const DEFAULT_RABBITMQ_CONTENT_TYPE: &str = "application/json";
/// AMQP's limit on a routing key (a short string): 255 bytes.
pub const MAX_ROUTING_KEY_BYTES: usize = 255;

/// A pipeline's `sink` table (the `kind` key chooses the variant).
#[derive(Clone, Debug, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SinkConfig {
    /// Kafka, with the pipeline's `kafka` table (the default).
    #[default]
    Kafka,
    /// Redis Streams: one `XADD` per record.
    Redis(RedisConfig),
    /// NATS JetStream: one publish per record, acknowledged by the stream's PubAck.
    Nats(NatsConfig),
    /// RabbitMQ: one persistent message per record, with publisher confirms.
    #[serde(rename = "rabbitmq")]
    RabbitMq(RabbitMqConfig),
    /// Webhooks: one `POST` per record.
    Http(HttpConfig),
}

impl SinkConfig {
    /// The `kind` as written in the file, for logs, metrics and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Kafka => "kafka",
            SinkConfig::Redis(_) => "redis",
            SinkConfig::Nats(_) => "nats",
            SinkConfig::RabbitMq(_) => "rabbitmq",
            SinkConfig::Http(_) => "http",
        }
    }

    /// Checks the kind's settings; each problem names its field (`sink.url`, ...).
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        let mut problem = |field: &str, text: String| {
            problems.push(ConfigError::new(&format!("sink.{field}"), text))
        };
        match self {
            SinkConfig::Kafka => {}
            SinkConfig::Redis(redis) => {
                let scheme = redis.url.split_once("://").map(|(scheme, _)| scheme);
                if redis.url.trim().is_empty() {
                    problem("url", "must not be empty".into());
                } else if !matches!(scheme, Some("redis" | "rediss" | "redis+unix" | "unix")) {
                    problem(
                        "url",
                        format!(
                            "{:?}: expected redis://, rediss:// (TLS) or redis+unix://",
                            redact_url(&redis.url)
                        ),
                    );
                }
                delivery_problems(
                    redis.max_concurrency,
                    redis.delivery_timeout_ms,
                    &mut problem,
                );
            }
            SinkConfig::Nats(nats) => {
                delivery_problems(nats.max_concurrency, nats.delivery_timeout_ms, &mut problem);
            }
            SinkConfig::RabbitMq(rabbitmq) => {
                if !(rabbitmq.url.starts_with("amqp://") || rabbitmq.url.starts_with("amqps://")) {
                    problem(
                        "url",
                        format!(
                            "{:?} is not an amqp:// or amqps:// URL",
                            redact_url(&rabbitmq.url)
                        ),
                    );
                }
                if rabbitmq.exchange.len() > MAX_ROUTING_KEY_BYTES {
                    problem(
                        "exchange",
                        format!("longer than {MAX_ROUTING_KEY_BYTES} bytes"),
                    );
                }
                if rabbitmq.max_message_bytes == 0 {
                    problem("max_message_bytes", "must be at least 1".into());
                }
                delivery_problems(
                    rabbitmq.max_concurrency,
                    rabbitmq.delivery_timeout_ms,
                    &mut problem,
                );
            }
            SinkConfig::Http(http) => return http.problems(),
        }
        problems
    }

    /// The server it connects to, password hidden, for logs and errors.
    pub fn server(&self) -> String {
        match self {
            SinkConfig::Kafka => String::new(),
            SinkConfig::Redis(redis) => redact_url(&redis.url),
            SinkConfig::Nats(nats) => nats.shown(),
            SinkConfig::RabbitMq(rabbitmq) => redact_url(&rabbitmq.url),
            SinkConfig::Http(http) => crate::config::url::redact_url_path(&http.url),
        }
    }

    /// What a destination of this sink is called, for errors ("Kafka topic name").
    pub fn destination_noun(&self) -> &'static str {
        match self {
            SinkConfig::Kafka => "Kafka topic name",
            SinkConfig::Redis(_) => "Redis stream key",
            SinkConfig::Nats(_) => "NATS subject",
            SinkConfig::RabbitMq(_) => "RabbitMQ routing key",
            SinkConfig::Http(_) => "webhook destination",
        }
    }

    /// Checks that the sink can take `destination` (a routed topic, the sample of the topic
    /// template at start, the dead-letter topic) by the kind's rules: the router checks the
    /// template and `dead_letter_topic` at start, and each event's routed destination.
    ///
    /// Returns the rule it breaks.
    pub fn check_destination(&self, destination: &str) -> Result<(), &'static str> {
        match self {
            SinkConfig::Kafka => validate_topic(destination),
            SinkConfig::Redis(_) => validate_stream_key(destination),
            SinkConfig::Nats(_) => validate_subject(destination),
            SinkConfig::RabbitMq(_) => validate_routing_key(destination),
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
                format!(
                    "{topic:?} is not a legal {}: {reason}",
                    self.destination_noun()
                )
            }),
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
                resolve_url(&mut redis.url, &mut redis.url_file, expand, &mut problems);
                redis.password = resolve_password(
                    &redis.url,
                    redis.password.take(),
                    redis.password_file.take(),
                    expand,
                    &mut problems,
                );
            }
            SinkConfig::Nats(nats) => nats.resolve(expand, &mut problems),
            SinkConfig::RabbitMq(rabbitmq) => {
                resolve_url(
                    &mut rabbitmq.url,
                    &mut rabbitmq.url_file,
                    expand,
                    &mut problems,
                );
                rabbitmq.password = resolve_password(
                    &rabbitmq.url,
                    rabbitmq.password.take(),
                    rabbitmq.password_file.take(),
                    expand,
                    &mut problems,
                );
            }
            SinkConfig::Http(http) => {
                resolve_url(&mut http.url, &mut http.url_file, expand, &mut problems);
                if let Some(value) = secret(
                    "secret",
                    &http.secret.0,
                    http.secret_file.take(),
                    expand,
                    &mut problems,
                ) {
                    http.secret = Secret(value);
                }
            }
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

/// `sink.password` (or `sink.password_file` read into it) beside `url`, which must then hold
/// no password of its own.
fn resolve_password(
    url: &SinkUrl,
    value: Option<Secret>,
    file: Option<String>,
    expand: &dyn Fn(&str) -> Result<String, String>,
    problems: &mut Vec<(String, String)>,
) -> Option<Secret> {
    let password = optional_secret(
        "password",
        value.as_ref().map(|s| s.0.as_str()),
        file,
        expand,
        problems,
    )?;
    if super::redact_url(url) != url.0 {
        problems.push((
            "sink.password".into(),
            "the URL has a password too: give it in one place".into(),
        ));
        return None;
    }
    Some(password)
}

/// `url` from [`secret`] (`sink.url`, or `sink.url_file` read into it); unchanged after
/// recording a problem.
fn resolve_url(
    url: &mut SinkUrl,
    file: &mut Option<String>,
    expand: &dyn Fn(&str) -> Result<String, String>,
    problems: &mut Vec<(String, String)>,
) {
    if let Some(value) = secret("url", url, file.take(), expand, problems) {
        *url = SinkUrl(value);
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
        (true, Some(file)) => {
            match super::secret_file::read(&file, &format!("sink.{field}_file")) {
                Ok(value) => Some(value),
                Err(e) => {
                    problems.push((
                        format!("sink.{field}_file"),
                        format!("cannot read {file:?}: {e}"),
                    ));
                    None
                }
            }
        }
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

/// A secret setting (a token, a key seed, a signing key); `Debug` shows `***`, or `""` when it
/// is empty (not set).
#[derive(Clone, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize)]
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
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

/// A sink server's URL; `Debug` hides its password.
#[derive(Clone, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize)]
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
/// server's persistence settings (docs/how-to/sinks/redis.md, "What acknowledged means").
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host[:port][/db]` (`rediss://` for TLS); `${NAME}` references
    /// are resolved from the environment.
    pub url: SinkUrl,
    /// A file holding `url` (a mounted secret), instead of `url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub url_file: Option<String>,
    /// The password, beside a URL without one: taken as written (no percent-encoding);
    /// `${NAME}` takes it from the environment.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub password: Option<Secret>,
    /// A file holding `password` (a mounted secret), instead of `password`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub password_file: Option<String>,
    /// `MAXLEN ~ <n>` on each `XADD`: trims the stream to about that many entries; `None`:
    /// never trimmed by the relay.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub max_len: Option<u64>,
    /// Records in flight at once, each of a different key (a key's records go one at a time).
    pub max_concurrency: usize,
    /// Milliseconds a record is retried for, from its first attempt (time queued behind its
    /// key's earlier records does not count); past it the record fails and the session restarts.
    pub delivery_timeout_ms: u64,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: SinkUrl::default(),
            url_file: None,
            password: None,
            password_file: None,
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

/// `kind = "rabbitmq"`: RabbitMQ (AMQP 0-9-1).
///
/// Each record is a persistent message published with `mandatory` to `exchange`, its routing
/// key the routed destination (`<aggregate_type>.events` by default): with a topic exchange,
/// consumers bind `Order.#`, `*.events` and so on. The server's publisher confirm is the
/// acknowledgement; a message no queue takes (returned) is refused. docs/how-to/sinks/rabbitmq.md, "What acknowledged means".
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RabbitMqConfig {
    /// `amqp://[user:password@]host[:port][/vhost]` (`amqps://` for TLS); `${NAME}` references
    /// are resolved from the environment.
    pub url: SinkUrl,
    /// A file holding `url` (a mounted secret), instead of `url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub url_file: Option<String>,
    /// The password, beside a URL without one: taken as written (no percent-encoding);
    /// `${NAME}` takes it from the environment.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub password: Option<Secret>,
    /// A file holding `password` (a mounted secret), instead of `password`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub password_file: Option<String>,
    /// The exchange every record is published to, declared by the operator (`check` verifies
    /// it exists); `""` (the default): the default exchange, which routes to the queue named
    /// like the routing key.
    pub exchange: String,
    /// The `content_type` property of each message; `""`: none. A tombstone never has one.
    /// With `value_format = "cloudevents"` each message's own media type is used instead
    /// (`datacontenttype`, or the JSON event format's in structured mode).
    pub content_type: String,
    /// The largest message published, in bytes: match the server's `max_message_size`. A
    /// larger record is refused (a bad event).
    pub max_message_bytes: usize,
    /// Records in flight at once, each of a different key (a key's records go one at a time).
    pub max_concurrency: usize,
    /// Milliseconds a record is retried for, from its first attempt (time queued behind its
    /// key's earlier records does not count); past it the record fails and the session restarts.
    pub delivery_timeout_ms: u64,
}

impl Default for RabbitMqConfig {
    fn default() -> Self {
        RabbitMqConfig {
            url: SinkUrl::default(),
            url_file: None,
            password: None,
            password_file: None,
            exchange: String::new(),
            content_type: DEFAULT_RABBITMQ_CONTENT_TYPE.into(),
            max_message_bytes: DEFAULT_RABBITMQ_MAX_MESSAGE_BYTES,
            max_concurrency: DEFAULT_RABBITMQ_MAX_CONCURRENCY,
            delivery_timeout_ms: DEFAULT_DELIVERY_TIMEOUT_MS,
        }
    }
}

impl RabbitMqConfig {
    pub fn delivery_timeout(&self) -> Duration {
        Duration::from_millis(self.delivery_timeout_ms)
    }
}

/// Checks an AMQP routing key: not empty (the router's rule for every destination) and at most
/// [`MAX_ROUTING_KEY_BYTES`] bytes; any bytes are allowed.
///
/// Returns the rule `key` breaks.
pub fn validate_routing_key(key: &str) -> Result<(), &'static str> {
    if key.is_empty() {
        return Err("empty");
    }
    if key.len() > MAX_ROUTING_KEY_BYTES {
        return Err("longer than 255 bytes (AMQP's limit on a routing key)");
    }
    Ok(())
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
        let h: Holder =
            toml::from_str("[sink]\nkind = \"redis\"\nurl = \"redis://h\"\nmax_len = 5").unwrap();
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
        let SinkConfig::Http(http) = &sink else {
            unreachable!()
        };
        assert_eq!(http.secret.0, "whsec_Zm9v");
        let mut sink = SinkConfig::Http(HttpConfig {
            secret_file: Some("/nonexistent/secret".into()),
            ..HttpConfig::default()
        });
        assert_eq!(sink.resolve(&expand)[0].0, "sink.secret_file");
    }

    #[test]
    fn unknown_kinds_and_keys_are_refused() {
        let Err(e) = toml::from_str::<Holder>("[sink]\nkind = \"pulsar\"") else {
            panic!("kind pulsar was taken");
        };
        assert!(e.to_string().contains("pulsar"), "{e}");
        let Err(e) = toml::from_str::<Holder>("[sink]\nkind = \"redis\"\nurll = \"x\"") else {
            panic!("key urll was taken");
        };
        assert!(e.to_string().contains("urll"), "{e}");
    }

    #[test]
    fn bad_settings_are_problems_naming_the_field() {
        let fields = |redis: RedisConfig| -> Vec<String> {
            SinkConfig::Redis(redis)
                .problems()
                .into_iter()
                .map(|p| p.field)
                .collect()
        };
        assert_eq!(fields(RedisConfig::default()), ["sink.url"]);
        assert_eq!(
            fields(RedisConfig {
                url: SinkUrl("http://h".into()),
                max_concurrency: 0,
                delivery_timeout_ms: 0,
                ..RedisConfig::default()
            }),
            [
                "sink.url",
                "sink.max_concurrency",
                "sink.delivery_timeout_ms"
            ]
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
        let SinkConfig::Redis(redis) = &sink else {
            unreachable!()
        };
        assert_eq!(&*redis.url, "redis://:pw@h");
        assert!(!format!("{:?}", redis.url).contains("pw"));

        let mut sink = SinkConfig::Redis(RedisConfig {
            url: SinkUrl("redis://:${P}@h".into()),
            ..RedisConfig::default()
        });
        assert!(sink.resolve(&expand).is_empty());
        let SinkConfig::Redis(redis) = &sink else {
            unreachable!()
        };
        assert_eq!(&*redis.url, "redis://:secret@h");

        let mut sink = SinkConfig::Redis(RedisConfig {
            url: SinkUrl("redis://h".into()),
            url_file: Some(path.display().to_string()),
            ..RedisConfig::default()
        });
        let problems = sink.resolve(&expand);
        assert_eq!(problems[0].0, "sink.url", "{problems:?}");
    }

    #[test]
    fn rabbitmq_settings_have_defaults_and_the_url_must_be_amqp() {
        let h: Holder = toml::from_str(
            "[sink]\nkind = \"rabbitmq\"\nurl = \"amqp://u:${P}@h/vhost\"\nexchange = \"outbox\"",
        )
        .unwrap();
        let mut sink = h.sink;
        let SinkConfig::RabbitMq(rabbitmq) = &sink else {
            panic!("not rabbitmq: {sink:?}")
        };
        assert_eq!(rabbitmq.exchange, "outbox");
        assert_eq!(rabbitmq.content_type, DEFAULT_RABBITMQ_CONTENT_TYPE);
        assert_eq!(
            rabbitmq.max_message_bytes,
            DEFAULT_RABBITMQ_MAX_MESSAGE_BYTES
        );
        assert_eq!(rabbitmq.max_concurrency, DEFAULT_RABBITMQ_MAX_CONCURRENCY);
        assert_eq!(sink.kind(), "rabbitmq");
        let expand = |v: &str| Ok::<_, String>(v.replace("${P}", "secret"));
        assert!(sink.resolve(&expand).is_empty());
        assert_eq!(sink.server(), "amqp://u:***@h/vhost");
        assert!(!format!("{sink:?}").contains("secret"), "{sink:?}");

        assert!(sink.problems().is_empty(), "{:?}", sink.problems());

        // Checked in `problems`, so a config built in code is checked too.
        let sink = SinkConfig::RabbitMq(RabbitMqConfig {
            url: SinkUrl("http://u:pw@h".into()),
            exchange: "e".repeat(256),
            max_message_bytes: 0,
            ..RabbitMqConfig::default()
        });
        let problems = sink.problems();
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            ["sink.url", "sink.exchange", "sink.max_message_bytes"],
            "{problems:?}"
        );
        assert!(!problems[0].problem.contains("pw"), "{problems:?}");
    }

    #[test]
    fn a_routing_key_takes_any_text_up_to_255_bytes_and_kafka_keeps_its_topic_rules() {
        let rabbitmq = SinkConfig::RabbitMq(RabbitMqConfig::default());
        for good in [
            "Order.events",
            "has space",
            "a/b",
            "ünicode",
            &"x".repeat(255),
        ] {
            assert_eq!(rabbitmq.check_destination(good), Ok(()), "{good:?}");
        }
        assert!(rabbitmq.check_destination(&"x".repeat(256)).is_err());
        assert!(rabbitmq.check_destination("").is_err());
        assert!(SinkConfig::Kafka.check_destination("a/b").is_err());
        assert!(SinkConfig::Kafka.check_destination("Order.events").is_ok());
    }

    #[test]
    fn the_router_checks_destinations_by_the_sink_kinds_rule() {
        use crate::config::{OnBadEvent, PipelineConfig, TableName};
        use crate::router::{RouteError, Router};
        let table = TableName {
            schema: "public".into(),
            name: "outbox".into(),
        };
        let mut config = PipelineConfig::new("p", table);
        config.sink = SinkConfig::RabbitMq(RabbitMqConfig::default());
        config.route.topic_template = "orders/${routedByValue}".into();
        config.on_bad_event = OnBadEvent::DeadLetter;
        config.dead_letter_topic = Some("dead letters".into());
        let router = Router::new(&config).expect("a routing key may hold '/' and spaces");
        let event = |aggregate_type: &str| crate::source::outbox::OutboxEvent {
            id: bytes::Bytes::from_static(b"e-1"),
            aggregate_type: bytes::Bytes::copy_from_slice(aggregate_type.as_bytes()),
            aggregate_id: None,
            aggregate_id_kind: crate::source::outbox::ValueKind::Text,
            event_type: None,
            payload: None,
            headers: None,
            routed_by: None,
            payload_kind: crate::source::outbox::ValueKind::Json,
            columns: Vec::new(),
            lsn: crate::lsn::Lsn(1),
            refused: None,
        };
        assert_eq!(
            router.route(&event("Order Line"), 0).unwrap().topic,
            "orders/Order Line"
        );
        let err = router.route(&event(&"x".repeat(250)), 0).unwrap_err();
        assert!(
            matches!(&err, RouteError::IllegalTopic { event_id, reason, .. } if event_id == "e-1" && reason.contains("255")),
            "{err}"
        );

        config.dead_letter_topic = Some("d".repeat(256));
        let Err(e) = Router::new(&config) else {
            panic!("a dead-letter routing key over 255 bytes")
        };
        assert!(e.to_string().contains("dead_letter_topic"), "{e}");
        config.sink = SinkConfig::Kafka;
        config.dead_letter_topic = Some("dead-letters".into());
        let Err(e) = Router::new(&config) else {
            panic!("Kafka: '/' is no topic name")
        };
        assert!(e.to_string().contains("route.topic_template"), "{e}");
    }
}
