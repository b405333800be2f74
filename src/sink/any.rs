//! [`AnySink`]: the sink a pipeline's `sink` table chose, connected.

use std::time::{Duration, Instant};

use super::kafka::{KafkaSink, ProducerError};
use super::ordered::{OrderedSettings, OrderedSink};
use super::{http, nats, rabbitmq, redis, Delivery, InFlight, Record, SendError, Sink};
use crate::ack::EventToken;
use crate::config::{OnBadEvent, PipelineConfig, SinkConfig, SourceKind};
use crate::error::Error;

/// How long connecting to a sink server may take before the session fails (and is retried).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A sink server could not be reached or refused the relay (the address is redacted).
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to the {kind} sink at {server}: {reason}")]
pub struct ConnectError {
    /// The sink's `kind`.
    pub kind: &'static str,
    /// Host and port (or the URL without its password).
    pub server: String,
    pub reason: String,
    /// Whether connecting again may succeed (server down) or not (bad URL, bad credentials).
    pub retryable: bool,
}

/// Whether an ordered sink holds a key after a refusal, as after any failure: unless the
/// session sends the refused record to the dead-letter destination instead
/// (`on_bad_event = "dead_letter"` with log tailing), so that the key's next records go ahead.
/// A polling source records a refusal itself (the row is FAILED or the pipeline halts) and
/// never dead-letters it: without the hold, the key's next rows would reach the server
/// before the refused one is published again.
pub(crate) fn hold_on_refusal(config: &PipelineConfig) -> bool {
    config.on_bad_event == OnBadEvent::Halt || config.source_kind == SourceKind::Polling
}

/// One of the sink kinds, as the session sees it.
pub enum AnySink {
    Kafka(KafkaSink),
    Ordered(OrderedSink),
}

impl AnySink {
    /// Connects the sink `config.sink` names, within `CONNECT_TIMEOUT`; for Kafka (whose
    /// producer depends on the source kind and mode) calls `kafka`, which never waits.
    ///
    /// Returns [`Error::SinkConnect`] if the server cannot be reached or refuses the relay,
    /// [`Error::Producer`] if librdkafka refuses the Kafka settings.
    pub async fn connect(
        config: &PipelineConfig,
        kafka: impl FnOnce() -> Result<KafkaSink, ProducerError>,
    ) -> Result<AnySink, Error> {
        let hold_on_refusal = hold_on_refusal(config);
        let connecting = async {
            match &config.sink {
                SinkConfig::Kafka => unreachable!("Kafka is not connected here"),
                SinkConfig::Http(http) => Ok(OrderedSink::new(
                    http::HttpPublisher::connect(
                        http,
                        config.dead_letter_topic.as_deref(),
                        http::StandardHeaders::of(config),
                    )?,
                    OrderedSettings {
                        max_concurrency: http.max_concurrency,
                        delivery_timeout: http.delivery_timeout(),
                        hold_on_refusal,
                    },
                )),
                SinkConfig::Redis(redis) => Ok(OrderedSink::new(
                    redis::RedisPublisher::connect(redis).await?,
                    OrderedSettings {
                        max_concurrency: redis.max_concurrency,
                        delivery_timeout: redis.delivery_timeout(),
                        hold_on_refusal,
                    },
                )),
                SinkConfig::Nats(nats) => Ok(OrderedSink::new(
                    nats::NatsPublisher::connect(nats).await?,
                    OrderedSettings {
                        max_concurrency: nats.max_concurrency,
                        delivery_timeout: nats.delivery_timeout(),
                        hold_on_refusal,
                    },
                )),
                SinkConfig::RabbitMq(rabbitmq) => Ok(OrderedSink::new(
                    rabbitmq::RabbitMqPublisher::connect(
                        rabbitmq,
                        config.value_format == crate::config::ValueFormat::CloudEvents,
                    )
                    .await?,
                    OrderedSettings {
                        max_concurrency: rabbitmq.max_concurrency,
                        delivery_timeout: rabbitmq.delivery_timeout(),
                        hold_on_refusal,
                    },
                )),
            }
        };
        if config.sink == SinkConfig::Kafka {
            return Ok(AnySink::Kafka(kafka()?));
        }
        match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(sink)) => Ok(AnySink::Ordered(sink)),
            Ok(Err(e)) => Err(Error::SinkConnect(e)),
            Err(_) => Err(Error::SinkConnect(ConnectError {
                kind: config.sink.kind(),
                server: config.sink.server(),
                reason: format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()),
                retryable: true,
            })),
        }
    }
}

impl Sink for AnySink {
    fn send(&mut self, record: Record, token: EventToken) -> Result<(), SendError> {
        match self {
            AnySink::Kafka(sink) => sink.send(record, token),
            AnySink::Ordered(sink) => sink.send(record, token),
        }
    }

    async fn next_delivery(&mut self) -> Option<Delivery> {
        match self {
            AnySink::Kafka(sink) => sink.next_delivery().await,
            AnySink::Ordered(sink) => sink.next_delivery().await,
        }
    }

    fn in_flight(&self) -> InFlight {
        match self {
            AnySink::Kafka(sink) => sink.in_flight(),
            AnySink::Ordered(sink) => sink.in_flight(),
        }
    }

    fn left_over(&self) -> InFlight {
        match self {
            AnySink::Kafka(sink) => sink.left_over(),
            AnySink::Ordered(sink) => sink.left_over(),
        }
    }

    fn waiting(&self) -> Option<String> {
        match self {
            AnySink::Kafka(sink) => sink.waiting(),
            AnySink::Ordered(sink) => sink.waiting(),
        }
    }

    fn oldest_left_over(&self) -> Option<Instant> {
        match self {
            AnySink::Kafka(sink) => sink.oldest_left_over(),
            AnySink::Ordered(sink) => sink.oldest_left_over(),
        }
    }

    fn oldest_in_flight(&self) -> Option<Instant> {
        match self {
            AnySink::Kafka(sink) => sink.oldest_in_flight(),
            AnySink::Ordered(sink) => sink.oldest_in_flight(),
        }
    }

    fn withdraw_in_flight(&mut self) {
        match self {
            AnySink::Kafka(sink) => sink.withdraw_in_flight(),
            AnySink::Ordered(sink) => sink.withdraw_in_flight(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordered_sink_holds_a_refused_key_unless_the_session_dead_letters_the_record() {
        let config = |source_kind, on_bad_event| PipelineConfig {
            source_kind,
            on_bad_event,
            ..PipelineConfig::test_pipeline()
        };
        assert!(hold_on_refusal(&config(
            SourceKind::LogTailing,
            OnBadEvent::Halt
        )));
        assert!(!hold_on_refusal(&config(
            SourceKind::LogTailing,
            OnBadEvent::DeadLetter
        )));
        // Polling records a refusal itself and never dead-letters it.
        assert!(hold_on_refusal(&config(
            SourceKind::Polling,
            OnBadEvent::Halt
        )));
        assert!(hold_on_refusal(&config(
            SourceKind::Polling,
            OnBadEvent::DeadLetter
        )));
    }
}
