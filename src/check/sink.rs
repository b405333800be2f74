//! `check` of the pipeline's sink: reachable, authenticated, and what its kind can tell about
//! the destinations and the durability of an acknowledgement.

use super::{check_kafka, finding, Finding, Verdict};
use crate::config::{PipelineConfig, SinkConfig};
use crate::sink::rabbitmq::RabbitMqPublisher;
use crate::sink::redis::RedisPublisher;

/// The findings about `config.sink`.
pub(super) async fn check(config: &PipelineConfig) -> Vec<Finding> {
    match &config.sink {
        SinkConfig::Kafka => vec![check_kafka(config).await],
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
        SinkConfig::RabbitMq(rabbitmq) => match RabbitMqPublisher::connect(rabbitmq).await {
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
