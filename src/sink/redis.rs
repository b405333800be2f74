//! The Redis Streams sink: one `XADD` per record over a multiplexed connection that
//! reconnects by itself (the `redis` crate's `ConnectionManager`).
//!
//! An entry is `XADD <stream> [MAXLEN ~ n] * <fields>`, the stream being the routed destination
//! (`<aggregate_type>.events` by default), with fields in this order:
//! - each header by its name (`id` = the event id first, then `event_type` and the others as
//!   routed), a null header value as an empty string; a header named `key` or `payload` is
//!   written as `header.key` / `header.payload`;
//! - `key`: the aggregate id (absent for a null key);
//! - `payload`: the record value (absent for a tombstone).
//!
//! The `XADD` reply is the acknowledgement: the entry is in the server's memory, and as durable
//! as its persistence settings make it (with `appendonly yes` and `appendfsync always`, on
//! disk; with the default `everysec`, at most the last second is lost if the server's machine
//! fails; without AOF, everything since the last RDB snapshot). docs/how-to/sinks/redis.md.

use futures::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::RedisError;

use super::ordered::{PublishError, Publisher};
use super::{ConnectError, Record};
use crate::config::{redact_url, RedisConfig};

/// How long one `XADD` may wait for its reply before the attempt counts as failed (and is
/// retried).
const RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Fields the relay writes itself: headers with these names get a `header.` prefix.
const OWN_FIELDS: [&str; 2] = ["key", "payload"];

/// A Redis connection publishing records as stream entries.
pub struct RedisPublisher {
    connection: ConnectionManager,
    max_len: Option<u64>,
    /// The server without credentials, for errors.
    server: String,
}

impl RedisPublisher {
    /// Connects to `config.url` (and authenticates, as the URL says).
    ///
    /// Returns a retryable [`ConnectError`] if the server cannot be reached, a permanent one if
    /// the URL is malformed or the credentials are refused.
    pub async fn connect(config: &RedisConfig) -> Result<Self, ConnectError> {
        let server = redact_url(&config.url);
        let error = |e: RedisError| {
            let reason = e.to_string();
            // A certificate the trusted roots do not vouch for stays so: stop and say it.
            let certificate = reason.to_lowercase().contains("certificate");
            ConnectError {
                kind: "redis",
                server: server.clone(),
                retryable: is_transient(&e) && !certificate,
                reason,
            }
        };
        let mut info =
            redis::IntoConnectionInfo::into_connection_info(&*config.url).map_err(error)?;
        if let Some(password) = &config.password {
            let settings = info.redis_settings().clone().set_password(&**password);
            info = info.set_redis_settings(settings);
        }
        let client = redis::Client::open(info).map_err(error)?;
        // One reconnect attempt per failed command: the ordered sink's backoff and delivery
        // timeout pace the retries, and a connect error (a refused certificate) surfaces.
        let manager = ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(super::any::CONNECT_TIMEOUT))
            .set_number_of_retries(1);
        let connection = client
            .get_connection_manager_with_config(manager)
            .await
            .map_err(error)?;
        Ok(RedisPublisher {
            connection,
            max_len: config.max_len,
            server,
        })
    }
}

impl RedisPublisher {
    /// The server's persistence settings (`INFO persistence`, `CONFIG GET appendfsync`), for
    /// `check`: what an `XADD` reply means for durability. `CONFIG` may be refused (managed
    /// services rename it): `appendfsync` is then unknown.
    ///
    /// Returns an error if the server does not answer `INFO`.
    pub async fn persistence(&self) -> Result<Persistence, String> {
        let mut connection = self.connection.clone();
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query_async(&mut connection)
            .await
            .map_err(|e| format!("{}: INFO persistence: {e}", self.server))?;
        let aof = info
            .lines()
            .find_map(|line| line.strip_prefix("aof_enabled:"))
            .map(|v| v.trim() == "1");
        let appendfsync = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .query_async::<Vec<String>>(&mut connection)
            .await
            .ok()
            .and_then(|reply| reply.into_iter().nth(1));
        Ok(Persistence { aof, appendfsync })
    }
}

/// What a Redis server persists, as `check` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    /// `aof_enabled` (`None`: not reported).
    pub aof: Option<bool>,
    /// `appendfsync` (`None`: `CONFIG GET` refused).
    pub appendfsync: Option<String>,
}

impl Persistence {
    /// Whether an acknowledged entry can be lost when the server or its machine fails.
    pub fn loses_acknowledged(&self) -> bool {
        !(self.aof == Some(true) && self.appendfsync.as_deref() == Some("always"))
    }
}

impl std::fmt::Display for Persistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.aof, self.appendfsync.as_deref()) {
            (Some(true), Some("always")) => f.write_str("appendonly yes, appendfsync always: an acknowledged entry is on disk"),
            (Some(true), Some(fsync)) => write!(f, "appendonly yes, appendfsync {fsync}: an acknowledged entry may be lost if the server's machine fails before the next fsync (up to a second with everysec)"),
            (Some(true), None) => f.write_str("appendonly yes, appendfsync unknown (CONFIG GET refused): an acknowledged entry is on disk only with appendfsync always"),
            (Some(false), _) => f.write_str("appendonly no: an acknowledged entry is lost if the server restarts before its next RDB snapshot; the relay will not publish it again"),
            (None, _) => f.write_str("persistence unknown (INFO reports no aof_enabled)"),
        }
    }
}

impl Publisher for RedisPublisher {
    fn publish(&self, record: &Record) -> BoxFuture<'static, Result<(), PublishError>> {
        let command = xadd(record, self.max_len);
        let mut connection = self.connection.clone();
        let server = self.server.clone();
        Box::pin(async move {
            command
                .query_async::<String>(&mut connection)
                .await
                .map(|_entry_id| ())
                .map_err(|e| classify(&e, &server))
        })
    }
}

/// The `XADD` command for `record` (see the module docs for its fields).
fn xadd(record: &Record, max_len: Option<u64>) -> redis::Cmd {
    let mut command = redis::cmd("XADD");
    command.arg(&record.topic);
    if let Some(n) = max_len {
        command.arg("MAXLEN").arg("~").arg(n);
    }
    command.arg("*");
    for (name, value) in &record.headers {
        let value: &[u8] = value.as_deref().unwrap_or_default();
        if OWN_FIELDS.contains(&name.as_ref()) {
            command.arg(format!("header.{name}")).arg(value);
        } else {
            command.arg(name.as_ref()).arg(value);
        }
    }
    if let Some(key) = &record.key {
        command.arg("key").arg(key.as_ref());
    }
    if let Some(value) = &record.value {
        command.arg("payload").arg(value.as_ref());
    }
    command
}

/// Whether the error is about reaching the server rather than about the request.
fn is_transient(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.code(),
            Some(
                "LOADING"
                    | "BUSY"
                    | "TRYAGAIN"
                    | "CLUSTERDOWN"
                    | "OOM"
                    // Fewer replicas in reach than `min-replicas-to-write`: a lagging replica.
                    | "NOREPLICAS"
                    // A failed background save with `stop-writes-on-bgsave-error`: a full disk.
                    | "MISCONF"
            )
        )
}

/// An `XADD` failure as the ordered sink's [`PublishError`]:
/// - the server unreachable, loading, busy, out of memory, short of the replicas
///   `min-replicas-to-write` asks for (`NOREPLICAS`) or refusing writes after a failed
///   background save (`MISCONF`): retried;
/// - `READONLY` / `MASTERDOWN` (the server became a replica in a failover) and refused
///   credentials (`NOAUTH`, `WRONGPASS`, a failed re-authentication after a reconnect): the
///   connection is of no more use, so the session ends and the next connects again;
/// - a record over the server's `proto-max-bulk-len`: too large;
/// - anything else (the key holds another type, an ACL refusal of the command): a refusal.
fn classify(e: &RedisError, server: &str) -> PublishError {
    let reason = format!("{server}: {e}");
    let text = e.to_string();
    if matches!(
        e.code(),
        Some("READONLY" | "MASTERDOWN" | "NOAUTH" | "WRONGPASS")
    ) || e.kind() == redis::ErrorKind::AuthenticationFailed
    {
        PublishError::broken(reason)
    } else if is_transient(e) {
        PublishError::retry(reason)
    } else if text.contains("invalid bulk length") || text.contains("proto-max-bulk-len") {
        PublishError::too_large(reason)
    } else {
        PublishError::refused(reason)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::sink::ordered::Failure;

    fn args(command: &redis::Cmd) -> Vec<String> {
        command
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<not simple>".into(),
            })
            .collect()
    }

    #[test]
    fn an_entry_has_the_headers_then_key_and_payload() {
        let record = Record {
            topic: "Order.events".into(),
            key: Some(Bytes::from_static(b"o-1")),
            value: Some(Bytes::from_static(br#"{"a":1}"#)),
            headers: vec![
                ("id".into(), Some(Bytes::from_static(b"e-1"))),
                ("event_type".into(), Some(Bytes::from_static(b"Created"))),
                ("key".into(), Some(Bytes::from_static(b"clash"))),
                ("trace".into(), None),
            ],
            timestamp_ms: None,
            partition: None,
        };
        assert_eq!(
            args(&xadd(&record, Some(1000))),
            [
                "XADD",
                "Order.events",
                "MAXLEN",
                "~",
                "1000",
                "*",
                "id",
                "e-1",
                "event_type",
                "Created",
                "header.key",
                "clash",
                "trace",
                "",
                "key",
                "o-1",
                "payload",
                r#"{"a":1}"#
            ]
        );
    }

    /// The error the client makes of a server's error reply `line`.
    fn server_error(line: &str) -> RedisError {
        redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    #[test]
    fn errors_are_classified_by_what_a_retry_can_change() {
        let cases = [
            (
                "LOADING Redis is loading the dataset in memory",
                Failure::Retry,
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                Failure::Retry,
            ),
            (
                "READONLY You can't write against a read only replica.",
                Failure::Broken,
            ),
            (
                "NOREPLICAS Not enough good replicas to write.",
                Failure::Retry,
            ),
            (
                "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
                Failure::Retry,
            ),
            ("MASTERDOWN Link with MASTER is down", Failure::Broken),
            ("NOAUTH Authentication required.", Failure::Broken),
            (
                "WRONGPASS invalid username-password pair or user is disabled.",
                Failure::Broken,
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                Failure::Refused { too_large: false },
            ),
            (
                "NOPERM User relay has no permissions to run the 'xadd' command",
                Failure::Refused { too_large: false },
            ),
            (
                "ERR Protocol error: invalid bulk length",
                Failure::Refused { too_large: true },
            ),
        ];
        for (line, failure) in cases {
            let e = classify(&server_error(line), "cache:6379");
            assert_eq!(e.failure, failure, "{line}");
            assert!(e.reason.starts_with("cache:6379: "), "{}", e.reason);
        }
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(classify(&io, "h").failure, Failure::Retry);
    }

    #[test]
    fn a_tombstone_has_no_payload_and_a_null_key_no_key() {
        let record = Record {
            topic: "s".into(),
            key: None,
            value: None,
            headers: vec![("id".into(), Some(Bytes::from_static(b"e-2")))],
            timestamp_ms: None,
            partition: None,
        };
        assert_eq!(args(&xadd(&record, None)), ["XADD", "s", "*", "id", "e-2"]);
    }
}
