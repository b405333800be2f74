//! `check` of the pipeline's sink: reachable, authenticated, and what its kind can tell about
//! the destinations and the durability of an acknowledgement.

use super::{check_kafka, finding, Finding, Verdict};
use crate::config::{HttpConfig, NatsConfig, PipelineConfig, SinkConfig};
use crate::router::Template;
use crate::sink::http::{HttpPublisher, StandardHeaders};
use crate::sink::nats::coverage::{self, Coverage};
use crate::sink::nats::NatsPublisher;
use crate::sink::rabbitmq::RabbitMqPublisher;
use crate::sink::redis::RedisPublisher;

/// The findings about `config.sink`.
pub(super) async fn check(config: &PipelineConfig) -> Vec<Finding> {
    match &config.sink {
        SinkConfig::Kafka => vec![check_kafka(config).await],
        SinkConfig::Http(http) => {
            let dead_letter = config.dead_letter_topic.as_deref();
            let publisher = match HttpPublisher::connect(http, dead_letter, StandardHeaders::of(config)) {
                Ok(publisher) => publisher,
                Err(e) => return vec![finding("http", Verdict::Fail, e.to_string())],
            };
            let mut urls = vec![(&*http.url, "sink.url")];
            urls.extend(
                dead_letter
                    .filter(|t| HttpConfig::is_absolute(t))
                    .map(|t| (t, "dead_letter_topic")),
            );
            let mut findings = Vec::new();
            for (url, setting) in urls {
                findings.push(match publisher.probe(url, setting).await {
                    Ok(detail) if http.secret.0.is_empty() => finding(
                        "http",
                        Verdict::Ok,
                        format!("{detail}; requests are not signed (no sink.secret)"),
                    ),
                    Ok(detail) => finding("http", Verdict::Ok, detail),
                    Err(e) => finding("http", Verdict::Fail, e),
                });
            }
            findings
        }
        SinkConfig::Redis(redis) => match RedisPublisher::connect(redis).await {
            Err(e) => vec![finding("redis", Verdict::Fail, e.to_string())],
            Ok(publisher) => match publisher.persistence().await {
                Err(e) => vec![finding("redis", Verdict::Fail, e)],
                Ok(persistence) => vec![finding(
                    "redis",
                    if persistence.loses_acknowledged() {
                        Verdict::Warn
                    } else {
                        Verdict::Ok
                    },
                    format!("{} reachable; {persistence}", config.sink.server()),
                )],
            },
        },
        SinkConfig::Nats(nats) => check_nats(config, nats).await,
        SinkConfig::RabbitMq(rabbitmq) => match RabbitMqPublisher::connect(
            rabbitmq,
            config.value_format == crate::config::ValueFormat::CloudEvents,
        )
        .await {
            Err(e) => vec![finding("rabbitmq", Verdict::Fail, e.to_string())],
            Ok(_publisher) => vec![finding(
                "rabbitmq",
                Verdict::Ok,
                format!(
                    "{} reachable, authenticated; {}; messages are persistent and confirmed, a message no queue is bound for is refused",
                    config.sink.server(),
                    match rabbitmq.exchange.as_str() {
                        "" => "the default exchange (routing key = queue name)".to_owned(),
                        name => format!("exchange {name:?} exists (sink.exchange)"),
                    }
                ),
            )],
        },
    }
}

/// NATS: connects and authenticates, lists the streams, and says which stream takes the
/// subjects of the topic template and of `dead_letter_topic`.
async fn check_nats(config: &PipelineConfig, nats: &NatsConfig) -> Vec<Finding> {
    let publisher = match NatsPublisher::connect(nats).await {
        Ok(publisher) => publisher,
        Err(e) => return vec![finding("nats", Verdict::Fail, e.to_string())],
    };
    let streams = match publisher.streams().await {
        Ok(streams) => streams,
        Err(e) => return vec![finding("nats", Verdict::Fail, e)],
    };
    let mut findings = vec![finding(
        "nats",
        Verdict::Ok,
        format!(
            "{} reachable, JetStream answers ({} streams)",
            nats.shown(),
            streams.len()
        ),
    )];
    let mut subjects = Vec::new();
    if let Ok(template) = Template::parse(&config.route.topic_template) {
        subjects.push(("route.topic_template", coverage::pattern(&template)));
    }
    if let Some(topic) = &config.dead_letter_topic {
        subjects.push(("dead_letter_topic", topic.clone()));
    }
    for (field, subject) in subjects {
        let (verdict, detail) = match coverage::coverage(&streams, &subject) {
            Coverage::Full { stream, duplicate_window } => (
                Verdict::Ok,
                format!("{field}: subjects {subject} go to stream {stream} (duplicate window {duplicate_window:?}: copies of an event published again within it are dropped)"),
            ),
            Coverage::Partial { streams } => (
                Verdict::Warn,
                format!(
                    "{field}: only some subjects {subject} go to a stream ({}); an event whose subject no stream takes stops the pipeline (or is dead-lettered)",
                    streams.iter().map(|(name, subject)| format!("{name}: {subject}")).collect::<Vec<_>>().join(", ")
                ),
            ),
            Coverage::None => (
                Verdict::Fail,
                format!("{field}: no stream takes subjects {subject}: create one whose subjects cover them (e.g. nats stream add OUTBOX --subjects '{subject}')"),
            ),
        };
        findings.push(finding("nats stream", verdict, detail));
    }
    findings
}
