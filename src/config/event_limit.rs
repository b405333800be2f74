//! `max_event_bytes`: the largest event a pipeline takes, by default the sink's own maximum.

use super::{PipelineConfig, SinkConfig};

/// `max_event_bytes` with a Kafka sink whose properties do not set `message.max.bytes`:
/// librdkafka's default for it, the largest record the producer sends.
pub const DEFAULT_KAFKA_MAX_EVENT_BYTES: usize = 1_000_000;
/// `max_event_bytes` with a NATS sink: nats-server's default `max_payload` (1 MiB), the
/// largest message a server takes unless configured otherwise.
pub const DEFAULT_NATS_MAX_EVENT_BYTES: usize = 1024 * 1024;
/// `max_event_bytes` with a Redis or HTTP sink, which have no maximum the relay can read
/// (Redis's `proto-max-bulk-len` is 512 MB; receivers of webhooks differ): 16 MiB keeps what
/// one row costs the relay (a few times its size, docs/operations/runbook.md, Memory) well inside
/// a 256 MiB container.
pub const DEFAULT_UNBOUNDED_SINK_MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// The largest event a pipeline takes ([`PipelineConfig::max_event_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventLimit {
    /// Bytes.
    pub bytes: usize,
    /// Where the value comes from, for errors (`max_event_bytes`, or which default).
    pub from: &'static str,
}

impl EventLimit {
    /// No limit (tests of other things).
    pub const NONE: EventLimit = EventLimit {
        bytes: usize::MAX,
        from: "no limit",
    };
}

impl PipelineConfig {
    /// The largest event the pipeline takes, bytes, and the setting it comes from (for
    /// errors): `max_event_bytes` when set, else the sink's own maximum: Kafka's producer
    /// `message.max.bytes` (a `kafka.properties` entry, else [`DEFAULT_KAFKA_MAX_EVENT_BYTES`]),
    /// NATS [`DEFAULT_NATS_MAX_EVENT_BYTES`], RabbitMQ `sink.max_message_bytes`, Redis and
    /// HTTP [`DEFAULT_UNBOUNDED_SINK_MAX_EVENT_BYTES`].
    pub fn max_event_bytes(&self) -> EventLimit {
        let (bytes, from) = match (self.max_event_bytes, &self.sink) {
            (Some(bytes), _) => (bytes, "max_event_bytes"),
            (None, SinkConfig::Kafka) => {
                let property = self
                    .kafka
                    .properties
                    .iter()
                    .rev()
                    .find(|(key, _)| key == "message.max.bytes")
                    .and_then(|(_, value)| value.trim().parse().ok());
                match property {
                    Some(bytes) => (bytes, "the default: kafka.properties message.max.bytes"),
                    None => (
                        DEFAULT_KAFKA_MAX_EVENT_BYTES,
                        "the default: the Kafka producer's message.max.bytes",
                    ),
                }
            }
            (None, SinkConfig::Nats(_)) => (
                DEFAULT_NATS_MAX_EVENT_BYTES,
                "the default: nats-server's max_payload",
            ),
            (None, SinkConfig::RabbitMq(rabbitmq)) => (
                rabbitmq.max_message_bytes,
                "the default: sink.max_message_bytes",
            ),
            (None, SinkConfig::Redis(_) | SinkConfig::Http(_)) => (
                DEFAULT_UNBOUNDED_SINK_MAX_EVENT_BYTES,
                "the default for this sink",
            ),
        };
        EventLimit { bytes, from }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigError, NatsConfig, RabbitMqConfig, RedisConfig};

    fn config() -> PipelineConfig {
        PipelineConfig::test_pipeline()
    }

    /// Without `max_event_bytes`, the limit is the sink's own maximum; with it, that value;
    /// 0 is refused.
    #[test]
    fn max_event_bytes_defaults_to_the_sink_s_maximum() {
        let limit = |config: &PipelineConfig| config.max_event_bytes().bytes;
        let mut kafka = config();
        assert_eq!(limit(&kafka), DEFAULT_KAFKA_MAX_EVENT_BYTES);
        kafka.kafka.properties = vec![("message.max.bytes".into(), "2000".into())];
        assert_eq!(
            kafka.max_event_bytes(),
            EventLimit {
                bytes: 2000,
                from: "the default: kafka.properties message.max.bytes"
            }
        );
        let sink = |sink: SinkConfig| PipelineConfig { sink, ..config() };
        assert_eq!(
            limit(&sink(SinkConfig::Nats(NatsConfig::default()))),
            DEFAULT_NATS_MAX_EVENT_BYTES
        );
        let rabbitmq = RabbitMqConfig {
            max_message_bytes: 5_000,
            ..RabbitMqConfig::default()
        };
        assert_eq!(limit(&sink(SinkConfig::RabbitMq(rabbitmq))), 5_000);
        assert_eq!(
            limit(&sink(SinkConfig::Redis(RedisConfig::default()))),
            DEFAULT_UNBOUNDED_SINK_MAX_EVENT_BYTES
        );
        let set = PipelineConfig {
            max_event_bytes: Some(10),
            ..kafka
        };
        assert_eq!(
            set.max_event_bytes(),
            EventLimit {
                bytes: 10,
                from: "max_event_bytes"
            }
        );
        assert!(set.problems().is_empty());
        let zero = PipelineConfig {
            max_event_bytes: Some(0),
            ..set
        };
        assert_eq!(
            zero.problems(),
            vec![ConfigError::new(
                "max_event_bytes",
                "must be greater than 0"
            )]
        );
    }
}
