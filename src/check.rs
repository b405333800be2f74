//! `outbox-relay check` and `status`: what an operator asks before and while running.
//!
//! `check` verifies, per pipeline, everything the relay needs from PostgreSQL and Kafka and
//! says what to change; `status` reports each slot's position and the WAL it holds back.
//! [`failover`] adds failover slots, the standby that keeps them, and
//! `synchronized_standby_slots`; [`standby`] a pipeline that decodes on a standby. The
//! source's findings are in `replication` (log tailing) and `polling`; where the start of `run`
//! stops, they print the sentence it stops with.

use std::fmt;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::ClientContext;
use tokio_postgres::Client;

use crate::config::{PipelineConfig, SourceKind};
use crate::error::chain;
use crate::source::slot::failover::Invalidation;
use crate::source::{slot, SourceError};

pub mod failover;
mod polling;
mod record;
mod replication;
mod sink;
pub mod standby;

/// The verdict of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// Works, but worth a look.
    Warn,
    /// The relay cannot run like this.
    Fail,
}

/// One line of `check`'s report.
#[derive(Debug, Clone)]
pub struct Finding {
    pub check: &'static str,
    pub verdict: Verdict,
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.verdict {
            Verdict::Ok => "ok",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{verdict:<4}  {:<22}  {}", self.check, self.detail)
    }
}

fn finding(check: &'static str, verdict: Verdict, detail: impl Into<String>) -> Finding {
    Finding {
        check,
        verdict,
        detail: detail.into(),
    }
}

async fn connect(config: &PipelineConfig) -> Result<(Client, slot::SqlConnection), String> {
    slot::connect(config).await.map_err(|e| chain(&e))
}

/// Runs every check for `config`; never fails itself: problems are findings.
pub async fn check(config: &PipelineConfig) -> Vec<Finding> {
    let mut findings: Vec<Finding> = source_security(config).into_iter().collect();
    match connect(config).await {
        Ok((client, connection)) => {
            let checked = match config.source_kind {
                SourceKind::LogTailing => replication::check(config, &client, &mut findings).await,
                SourceKind::Polling => polling::check(config, &client, &mut findings).await,
            };
            if let Err(e) = checked {
                findings.push(finding(
                    "postgres",
                    Verdict::Fail,
                    format!("query failed: {}", chain(&e)),
                ));
            }
            if config.source_kind == SourceKind::LogTailing {
                failover::check(config, &client, &mut findings).await;
            }
            drop(client);
            drop(connection);
        }
        Err(e) => findings.push(finding("connection", Verdict::Fail, e)),
    }
    findings.push(routing(config));
    findings.extend(sink::check(config).await);
    if config.exactly_once {
        findings.push(check_checkpoint(config).await);
    }
    findings
}

/// A warning when the source URL reaches a host over the network without authenticating the
/// server: `sslmode` below `verify-ca` or `channel_binding` other than `require`. Local hosts
/// (Unix sockets, `localhost`, 127.0.0.0/8, ::1) are exempt; `None` also when the URL does
/// not parse (the connection check reports that).
fn source_security(config: &PipelineConfig) -> Option<Finding> {
    use crate::source::tls::SslMode;
    use tokio_postgres::config::{ChannelBinding, Host};
    let info = config.source_config().ok()?;
    let is_local = |endpoint: &crate::source::target::Endpoint| {
        let loopback = |text: &str| {
            text.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
        };
        match (&endpoint.host, endpoint.addr) {
            (Some(Host::Unix(_)), _) => true,
            (_, Some(addr)) => addr.is_loopback(),
            (Some(Host::Tcp(name)), None) => name == "localhost" || loopback(name),
            (None, None) => true,
        }
    };
    let remote: Vec<String> = crate::source::target::endpoints(&info.pg)
        .iter()
        .filter(|endpoint| !is_local(endpoint))
        .map(ToString::to_string)
        .collect();
    let mode = match info.tls.mode {
        SslMode::Disable => Some("disable"),
        SslMode::Prefer => Some("prefer"),
        SslMode::Require => Some("require"),
        SslMode::VerifyCa | SslMode::VerifyFull => None,
    };
    let binding = match info.pg.get_channel_binding() {
        ChannelBinding::Require => None,
        ChannelBinding::Prefer => Some("prefer"),
        ChannelBinding::Disable => Some("disable"),
        _ => Some("prefer"),
    };
    if remote.is_empty() || (mode.is_none() && binding.is_none()) {
        return None;
    }
    let settings: Vec<String> = [
        mode.map(|mode| format!("sslmode={mode}")),
        binding.map(|binding| format!("channel_binding={binding}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let risk = match mode {
        Some(_) => "anyone on the network path can pose as the server: take the role's password (a cleartext or md5 request), feed the relay forged WAL, and read the events",
        None => "a server that holds a certificate of the same CA, or one that can relay the handshake, is not refused: the password exchange is not bound to the TLS session",
    };
    Some(finding(
        "source tls",
        Verdict::Warn,
        format!(
            "{} with {}: {risk}; use sslmode=verify-full&sslrootcert=<CA file>&channel_binding=require",
            remote.join(", "),
            settings.join(" and "),
        ),
    ))
}

/// Where rows may route: an allow-list (`route.allowed_destinations`) or, without one, a
/// warning that any row can pick any destination the template makes.
fn routing(config: &PipelineConfig) -> Finding {
    let route = &config.route;
    match &route.allowed_destinations {
        Some(allowed) => finding(
            "routing",
            Verdict::Ok,
            format!(
                "rows route only to route.allowed_destinations: {}",
                allowed.join(", ")
            ),
        ),
        None => finding(
            "routing",
            Verdict::Warn,
            format!(
                "no route.allowed_destinations: any row can pick any destination {:?} makes (e.g. any {:?}); list the destinations rows may use",
                route.topic_template,
                crate::router::Template::parse(&route.topic_template)
                    .map_or_else(|_| route.topic_template.clone(), |t| t.sample_with("<X>")),
            ),
        ),
    }
}

/// Exactly-once mode: the checkpoint topic exists and its last checkpoint for the pipeline
/// reads back as the relay will read it.
async fn check_checkpoint(config: &PipelineConfig) -> Finding {
    let topic = config.checkpoint_topic();
    let transactional_id = config.transactional_id();
    match crate::exactly_once::read_checkpoint(
        &config.kafka,
        topic,
        &config.name,
        &transactional_id,
    )
    .await
    {
        Ok(Some(lsn)) => finding(
            "checkpoint",
            Verdict::Ok,
            format!("{topic}: last checkpoint {lsn} (the topic must have cleanup.policy=compact)"),
        ),
        Ok(None) => finding(
            "checkpoint",
            Verdict::Ok,
            format!("{topic}: no checkpoint yet (the topic must have cleanup.policy=compact)"),
        ),
        Err(e) => finding("checkpoint", Verdict::Fail, chain(&e)),
    }
}

/// The `check` client's context: keeps librdkafka's first few distinct errors and warnings
/// (a refused TLS certificate, a failed SASL handshake, a name that does not resolve), which
/// a failed metadata request only reports as "broker transport failure".
#[derive(Default)]
struct ClientErrors(std::sync::Mutex<Vec<String>>);

impl ClientErrors {
    /// How many are kept.
    const KEPT: usize = 3;

    fn keep(&self, text: String) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < Self::KEPT && !kept.contains(&text) {
            kept.push(text);
        }
    }
}

impl ClientContext for ClientErrors {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        // CONFWARN: a producer property set on this consumer (acks, linger.ms, ...), which
        // would crowd out the errors that matter.
        if (level as i32) <= (RDKafkaLogLevel::Warning as i32) && fac != "CONFWARN" {
            self.keep(format!("{fac} {log_message}"));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // "All broker connections are down" only sums up the errors before it.
        if error.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::AllBrokersDown) {
            self.keep(format!("{error}: {reason}"));
        }
    }
}

impl ConsumerContext for ClientErrors {}

/// Whether the brokers answer a metadata request with the pipeline's librdkafka settings.
/// A failure names the bootstrap servers and librdkafka's first errors ([`ClientErrors`]).
pub(crate) async fn check_kafka(config: &PipelineConfig) -> Finding {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", &config.kafka.bootstrap_servers);
    for (key, value) in &config.kafka.properties {
        client.set(key, value);
    }
    let result = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer<ClientErrors> = client
            .create_with_context(ClientErrors::default())
            .map_err(|e| e.to_string())?;
        let metadata = consumer
            .fetch_metadata(None, Duration::from_secs(10))
            .map_err(|e| {
                // librdkafka queues its logs and errors for a poll to serve (`log.queue`).
                let until = std::time::Instant::now() + Duration::from_millis(200);
                while std::time::Instant::now() < until {
                    let _ = consumer.poll(Duration::from_millis(20));
                }
                let kept = consumer.context().0.lock().map(|k| k.join("; "));
                match kept {
                    Ok(errors) if !errors.is_empty() => format!("{e} ({errors})"),
                    _ => e.to_string(),
                }
            })?;
        let names: Vec<String> = metadata
            .topics()
            .iter()
            .map(|t| t.name().to_owned())
            .collect();
        Ok::<_, String>((metadata.brokers().len(), names))
    })
    .await;
    match result {
        Ok(Ok((brokers, names))) => topics_finding(config, brokers, &names),
        Ok(Err(e)) => finding(
            "kafka",
            Verdict::Fail,
            format!("{}: {e}", config.kafka.bootstrap_servers),
        ),
        Err(e) => finding("kafka", Verdict::Fail, e.to_string()),
    }
}

/// What the brokers' topics (`names`) say of the routing: how many match the topic template,
/// and which names of `route.allowed_destinations` (the exact ones) do not exist yet.
fn topics_finding(config: &PipelineConfig, brokers: usize, names: &[String]) -> Finding {
    use crate::config::matches_destination;
    let pattern = crate::router::Template::parse(&config.route.topic_template).map_or_else(
        |_| config.route.topic_template.clone(),
        |t| t.sample_with("*"),
    );
    let matching = names
        .iter()
        .filter(|name| matches_destination(&pattern, name))
        .count();
    let mut detail = format!(
        "{brokers} broker(s) reachable; {matching} topic(s) match the template ({pattern:?})"
    );
    let missing: Vec<&String> = config
        .route
        .allowed_destinations
        .iter()
        .flatten()
        .filter(|allowed| !allowed.contains('*') && !names.contains(allowed))
        .collect();
    let verdict = match missing.is_empty() {
        true => Verdict::Ok,
        false => {
            let missing: Vec<&str> = missing.iter().map(|m| m.as_str()).collect();
            detail.push_str(&format!(
                "; allowed but missing: {} (create them before events are routed there)",
                missing.join(", ")
            ));
            Verdict::Warn
        }
    };
    if verdict == Verdict::Ok {
        detail.push_str(" (topics must exist or be auto-created)");
    }
    finding("kafka", verdict, detail)
}

/// A slot's position, as `status` prints it.
#[derive(Debug, Clone)]
pub struct SlotStatus {
    pub active_pid: Option<i32>,
    pub confirmed_flush_lsn: Option<String>,
    /// Bytes of WAL between the server's end of WAL (on a standby: its replay position) and
    /// the confirmed LSN.
    pub lag_bytes: Option<i64>,
    pub wal_status: Option<String>,
    /// Bytes of WAL that may still be written before the slot is invalidated (`None`: no
    /// `max_slot_wal_keep_size` limit).
    pub safe_wal_size: Option<i64>,
    /// Why the slot is invalidated; `None` unless `wal_status` is `lost`.
    pub invalidation: Option<Invalidation>,
    /// Whether it is a failover slot (false before PostgreSQL 17).
    pub failover: bool,
    /// With `standby_url`: the standby's copy of the slot (see
    /// [`failover::standby_slot_state`]).
    pub standby: Option<String>,
}

/// Reads the slot of `config`; `Ok(None)` if it does not exist.
///
/// Returns an error if the database cannot be reached.
pub async fn status(config: &PipelineConfig) -> Result<Option<SlotStatus>, String> {
    let (client, connection) = connect(config).await?;
    let sql = format!(
        "SELECT active_pid, confirmed_flush_lsn::text,
                    pg_wal_lsn_diff({}, confirmed_flush_lsn)::bigint,
                    wal_status, safe_wal_size,
                    to_jsonb(s) ->> 'invalidation_reason', (to_jsonb(s) ->> 'conflicting')::bool,
                    COALESCE((to_jsonb(s) ->> 'failover')::bool, false)
             FROM pg_replication_slots s WHERE slot_name = $1",
        slot::standby::WAL_END_SQL
    );
    let row = client
        .query_opt(&sql, &[&config.slot])
        .await
        .map_err(|e| chain(&SourceError::Sql(e)))?;
    drop(client);
    drop(connection);
    let Some(r) = row else { return Ok(None) };
    let wal_status: Option<String> = r.get(3);
    Ok(Some(SlotStatus {
        active_pid: r.get(0),
        confirmed_flush_lsn: r.get(1),
        lag_bytes: r.get(2),
        invalidation: (wal_status.as_deref() == Some("lost"))
            .then(|| Invalidation::of_lost(r.get(5), r.get(6))),
        wal_status,
        safe_wal_size: r.get(4),
        failover: r.get(7),
        standby: failover::standby_slot_state(config).await,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_sources_without_an_authenticated_server_are_warned_about() {
        let finding_for = |url: &str| {
            let mut config = PipelineConfig::test_pipeline();
            config.source_url = url.into();
            source_security(&config)
        };
        for (url, says) in [
            ("postgres://u@db.example/app", "sslmode=prefer"),
            (
                "postgres://u@db.example/app?sslmode=disable",
                "sslmode=disable",
            ),
            (
                "postgres://u@10.0.0.5:5433/app?sslmode=require",
                "10.0.0.5:5433",
            ),
            (
                "postgres://u@db.example/app?sslmode=verify-full&sslrootcert=%2Fca.pem",
                "channel_binding=prefer",
            ),
            ("postgres://u@localhost,db.example/app", "db.example:5432"),
        ] {
            let finding = finding_for(url).unwrap_or_else(|| panic!("no finding for {url}"));
            assert_eq!(finding.verdict, Verdict::Warn, "{url}");
            assert!(
                finding.detail.contains(says)
                    && finding.detail.contains(
                        "sslmode=verify-full&sslrootcert=<CA file>&channel_binding=require"
                    ),
                "{url}: {}",
                finding.detail
            );
            assert!(!finding.detail.contains("localhost"), "{}", finding.detail);
        }
        assert!(finding_for("postgres://u@db.example/app?sslmode=prefer")
            .unwrap()
            .detail
            .contains("password"));
        for url in [
            "postgres://u@db.example/app?sslmode=verify-full&sslrootcert=%2Fca.pem&channel_binding=require",
            "postgres://u@localhost/app?sslmode=disable",
            "postgres://u@127.0.0.2/app",
            "postgres://u@[::1]/app?sslmode=prefer",
            "postgres://u@%2Frun%2Fpostgresql/app",
            "host=/var/run/postgresql user=u",
            "postgres://u@db.example/app?hostaddr=127.0.0.1",
        ] {
            assert!(finding_for(url).is_none(), "{url}: {:?}", finding_for(url));
        }
    }

    /// librdkafka's warnings about producer properties on `check`'s consumer (CONFWARN) are
    /// not kept: with `acks`, `enable.idempotence` and `linger.ms` set they filled every slot
    /// before the certificate or SASL error came.
    #[test]
    fn client_errors_keep_the_failures_not_the_configuration_warnings() {
        let errors = ClientErrors::default();
        for property in ["acks", "enable.idempotence", "linger.ms"] {
            errors.log(
                RDKafkaLogLevel::Warning,
                "CONFWARN",
                &format!("[thrd:app]: Configuration property {property} is a producer property and will be ignored by this consumer instance"),
            );
        }
        errors.log(
            RDKafkaLogLevel::Error,
            "FAIL",
            "ssl://k:9093/bootstrap: SSL handshake failed: certificate verify failed",
        );
        errors.log(
            RDKafkaLogLevel::Debug,
            "BROKER",
            "ssl://k:9093/bootstrap: connecting",
        );
        let kept = errors.0.lock().unwrap();
        assert_eq!(
            *kept,
            ["FAIL ssl://k:9093/bootstrap: SSL handshake failed: certificate verify failed"]
        );
    }

    #[test]
    fn routing_warns_without_an_allow_list() {
        let mut config = PipelineConfig::test_pipeline();
        let open = routing(&config);
        assert_eq!(open.verdict, Verdict::Warn);
        assert!(
            open.detail.contains("any row can pick any destination")
                && open.detail.contains("\"<X>.events\""),
            "{}",
            open.detail
        );
        config.route.allowed_destinations = Some(vec!["Order.events".into(), "billing.*".into()]);
        let listed = routing(&config);
        assert_eq!(listed.verdict, Verdict::Ok);
        assert!(
            listed.detail.ends_with("Order.events, billing.*"),
            "{}",
            listed.detail
        );
    }

    /// Topics are counted by the configured template, not by a `.events` suffix (an imported
    /// Debezium template such as `outbox.event.${routedByValue}` showed 0), and the exact names
    /// of the allow-list that do not exist are named.
    #[test]
    fn check_counts_the_topics_the_template_makes_and_names_missing_allowed_ones() {
        let mut config = PipelineConfig::test_pipeline();
        config.route.topic_template = "outbox.event.${routedByValue}".into();
        let names: Vec<String> = ["outbox.event.Order", "outbox.event.Payment", "Order.events"]
            .map(String::from)
            .to_vec();
        let found = topics_finding(&config, 1, &names);
        assert_eq!(found.verdict, Verdict::Ok);
        assert!(
            found
                .detail
                .contains("2 topic(s) match the template (\"outbox.event.*\")"),
            "{}",
            found.detail
        );
        config.route.allowed_destinations = Some(vec![
            "outbox.event.Order".into(),
            "outbox.event.Refund".into(),
            "x.*".into(),
        ]);
        let found = topics_finding(&config, 1, &names);
        assert_eq!(found.verdict, Verdict::Warn);
        assert!(
            found
                .detail
                .contains("allowed but missing: outbox.event.Refund ("),
            "{}",
            found.detail
        );
    }
}
