//! `check` of the pipeline's sink: reachable, authenticated, and what its kind can tell about
//! the destinations and the durability of an acknowledgement.

use super::{check_kafka, finding, Finding, Verdict};
use crate::config::{HttpConfig, PipelineConfig, SinkConfig};
use crate::sink::http::HttpPublisher;
use crate::sink::redis::RedisPublisher;

/// The findings about `config.sink`.
pub(super) async fn check(config: &PipelineConfig) -> Vec<Finding> {
    match &config.sink {
        SinkConfig::Kafka => vec![check_kafka(config).await],
        SinkConfig::Http(http) => {
            let dead_letter = config.dead_letter_topic.as_deref();
            let publisher = match HttpPublisher::connect(http, dead_letter) {
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
    }
}
