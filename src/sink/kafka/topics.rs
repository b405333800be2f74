//! The topic gate: a record goes to librdkafka only once its topic is known to exist.
//!
//! Without it, librdkafka holds a record for a missing topic for `topic.metadata.propagation.
//! max.ms` (30 s), then fails it; the session ends, and the next one publishes again
//! everything after the confirmed LSN, every half minute. Here the first record for a topic
//! waits (as for a full queue: the session stops reading) while a metadata request tells
//! whether the topic exists; with `kafka.create_topics` a missing one is created through the
//! admin API. A missing topic is named once, with the fix, and checked again every
//! [`RECHECK`]; the pipeline reads `degraded` meanwhile ([`TopicGate::waiting`]).
//!
//! When the cluster cannot be asked (unreachable, a metadata error), the record goes on to
//! librdkafka, which queues it until the broker answers, as it would without the gate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::Producer;

use crate::config::CreateTopics;
use crate::sink::producer::PolledProducer;

/// How long a metadata request or a topic creation may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a missing topic is looked for again.
pub const RECHECK: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
enum TopicState {
    /// A metadata request (or a creation) is under way.
    Checking,
    /// The topic exists, or the cluster could not be asked: records go on.
    Open,
    /// The cluster says there is no such topic (and it could not be created: `why`).
    Missing { checked: Instant, why: String },
}

/// What a session's Kafka sink knows of its topics (see the module docs).
#[derive(Clone)]
pub struct TopicGate {
    /// Whether topics are checked at all. Off in the unit tests of the Kafka sink, whose mock
    /// clusters have their topics made beforehand and which count on a record being taken at
    /// once; the gate's own tests turn it on, the end-to-end tests run with it.
    checks: bool,
    /// Whether a missing topic holds its records (log tailing); `false`: it is named (and
    /// created, with `create_topics`) but its records go on to librdkafka, which fails them
    /// after `message.timeout.ms`, so a polling cycle's transaction ends (the rows are retried).
    holds: bool,
    /// Whether a missing topic's records are refused for good once it is checked (with
    /// `on_bad_event = "dead_letter"`: a row naming a topic nobody made is bad input, and
    /// must not hold the others).
    refuses: bool,
    shared: Arc<Shared>,
}

/// What a gate's checks share with it.
struct Shared {
    states: Mutex<HashMap<String, TopicState>>,
    create: Option<CreateTopics>,
    /// The producer's settings, for an admin client when a topic is to be created.
    client: ClientConfig,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl TopicGate {
    /// A gate that creates missing topics as `create` says, through an admin client made from
    /// `client` (the producer's settings), or only waits for them when `create` is `None`.
    pub fn new(create: Option<CreateTopics>, client: ClientConfig) -> Self {
        TopicGate {
            checks: !cfg!(test),
            holds: true,
            refuses: false,
            shared: Arc::new(Shared {
                states: Mutex::default(),
                create,
                client,
            }),
        }
    }

    /// The same gate, letting the records of a missing topic go on once it is checked.
    pub fn not_holding(mut self) -> Self {
        self.holds = false;
        self
    }

    /// The same gate, refusing the records of a missing topic once it is checked
    /// ([`TopicGate::refusal`]).
    pub fn refusing(mut self) -> Self {
        self.refuses = true;
        self
    }

    /// Why a record for `topic` is refused for good: the topic was checked and is missing,
    /// and the gate refuses ([`TopicGate::refusing`]).
    pub fn refusal(&self, topic: &str) -> Option<String> {
        if !self.refuses {
            return None;
        }
        match lock(&self.shared.states).get(topic) {
            Some(TopicState::Missing { why, .. }) => Some(why.clone()),
            _ => None,
        }
    }

    /// The same gate, checking topics also in a unit test.
    #[cfg(test)]
    pub fn checking(mut self) -> Self {
        self.checks = true;
        self
    }

    /// Whether a record for `topic` may go to `producer` now. The first time (and every
    /// [`RECHECK`] while it is missing) starts a check on a blocking thread; until it
    /// answers, `false`.
    pub fn admits(&self, topic: &str, producer: &PolledProducer) -> bool {
        if !self.checks {
            return true;
        }
        let mut states = lock(&self.shared.states);
        match states.get(topic) {
            Some(TopicState::Open) => return true,
            Some(TopicState::Checking) => return false,
            Some(TopicState::Missing { .. }) if !self.holds => return true,
            Some(TopicState::Missing { checked, .. }) if checked.elapsed() < RECHECK => {
                return false
            }
            Some(TopicState::Missing { .. }) | None => {}
        }
        let first = !states.contains_key(topic);
        states.insert(topic.to_owned(), TopicState::Checking);
        drop(states);
        let (gate, topic, producer) = (self.clone(), topic.to_owned(), producer.clone());
        tokio::task::spawn_blocking(move || {
            let state = gate.check(&topic, &producer);
            if let TopicState::Missing { why, .. } = &state {
                if first {
                    tracing::warn!(topic, "{why}");
                } else {
                    tracing::debug!(topic, "{why}");
                }
            } else if !first {
                tracing::info!(topic, "topic found: its records go on");
            }
            lock(&gate.shared.states).insert(topic, state);
        });
        false
    }

    /// Why records wait, when a topic is missing: its name and the fix.
    pub fn waiting(&self) -> Option<String> {
        if self.refuses {
            // Its records are refused (and dead-lettered): nothing waits.
            return None;
        }
        lock(&self.shared.states)
            .values()
            .find_map(|state| match state {
                TopicState::Missing { why, .. } => Some(why.clone()),
                _ => None,
            })
    }

    /// Asks the cluster whether `topic` exists, and creates it if it may.
    fn check(&self, topic: &str, producer: &PolledProducer) -> TopicState {
        let metadata = producer
            .inner()
            .client()
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT);
        let missing = match metadata {
            Ok(metadata) => metadata.topics().iter().any(|t| {
                t.name() == topic
                    && matches!(
                        t.error().map(RDKafkaErrorCode::from),
                        Some(RDKafkaErrorCode::UnknownTopicOrPartition)
                    )
            }),
            // Cannot tell: librdkafka queues the record until the broker answers.
            Err(e) => {
                tracing::debug!(topic, error = %e, "cannot ask the cluster whether the topic exists; sending");
                false
            }
        };
        if !missing {
            return TopicState::Open;
        }
        let why = match &self.shared.create {
            None => format!(
                "topic {topic} does not exist on the Kafka cluster: its records wait and the pipeline reads no further until it exists; create it (kafka-topics.sh --bootstrap-server {} --create --topic {topic}), or set kafka.create_topics to have the relay create it",
                self.shared.client.get("bootstrap.servers").unwrap_or("<broker>")
            ),
            Some(create) => match self.create(topic, create) {
                Ok(()) => {
                    tracing::info!(
                        topic,
                        partitions = create.partitions,
                        replication_factor = create.replication_factor,
                        "created the topic (kafka.create_topics)"
                    );
                    return TopicState::Open;
                }
                Err(e) => format!(
                    "topic {topic} does not exist on the Kafka cluster and creating it failed ({e}): its records wait and the pipeline reads no further until it exists; create it, or give the relay's principal CREATE on the cluster or the topic"
                ),
            },
        };
        TopicState::Missing {
            checked: Instant::now(),
            why,
        }
    }

    /// Creates `topic` as `create` says; one that exists meanwhile is no error.
    fn create(&self, topic: &str, create: &CreateTopics) -> Result<(), String> {
        let admin: AdminClient<DefaultClientContext> =
            self.shared.client.create().map_err(|e| e.to_string())?;
        let mut new = NewTopic::new(
            topic,
            create.partitions,
            TopicReplication::Fixed(create.replication_factor),
        );
        for (key, value) in &create.config {
            new = new.set(key, value);
        }
        let options = AdminOptions::new()
            .operation_timeout(Some(REQUEST_TIMEOUT))
            .request_timeout(Some(REQUEST_TIMEOUT));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let results = runtime
            .block_on(admin.create_topics([&new], &options))
            .map_err(|e| e.to_string())?;
        match results.into_iter().next() {
            Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => Ok(()),
            Some(Err((_, code))) => Err(code.to_string()),
            None => Err("the broker answered nothing".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::mocking::MockCluster;

    fn producer(bootstrap: &str) -> (PolledProducer, ClientConfig) {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", bootstrap)
            .set("allow.auto.create.topics", "false");
        (PolledProducer::new(&client).unwrap(), client)
    }

    /// Asks `gate` about `topic` until it admits it or `deadline` passes.
    async fn admitted_within(
        gate: &TopicGate,
        topic: &str,
        producer: &PolledProducer,
        deadline: Duration,
    ) -> bool {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if gate.admits(topic, producer) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_topic_that_exists_is_admitted_once_checked_and_a_missing_one_waits_named() {
        let mock = MockCluster::new(1).unwrap();
        mock.create_topic("present", 1, 1).unwrap();
        let (producer, client) = producer(&mock.bootstrap_servers());
        let gate = TopicGate::new(None, client).checking();
        assert!(
            !gate.admits("present", &producer),
            "the first record waits for the check"
        );
        assert!(admitted_within(&gate, "present", &producer, Duration::from_secs(20)).await);
        assert!(!admitted_within(&gate, "absent", &producer, Duration::from_secs(3)).await);
        let why = gate.waiting().expect("a missing topic is a reason to wait");
        assert!(
            why.contains("topic absent does not exist")
                && why.contains("kafka-topics.sh --bootstrap-server 127.0.0.1:")
                && why.contains("kafka.create_topics"),
            "{why}"
        );
    }
}
