//! librdkafka's properties for the relay's producers: the relay's defaults, then the
//! operator's `properties`, then what the delivery guarantees rest on.

use rdkafka::config::ClientConfig;

use crate::config::KafkaConfig;

/// librdkafka's properties for the producer of [`super::KafkaSink::new`]: the relay's defaults, then
/// the operator's `properties`, then what the delivery guarantees rest on.
pub(super) fn producer_config(
    config: &KafkaConfig,
    client_id: &str,
    queue_messages: usize,
    queue_bytes: usize,
    transactional_id: Option<&str>,
) -> ClientConfig {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("client.id", client_id)
        // The Java client's partitioner (Debezium, Kafka Connect, Kafka Streams): an
        // aggregate keeps the partition it had before the switch to this relay.
        .set("partitioner", "murmur2_random");
    for (key, value) in &config.properties {
        client.set(key, value);
    }
    // What the delivery guarantees rest on, after the user's properties so nothing
    // weakens them (validation already rejects conflicting values).
    let queue_messages = client
        .get("queue.buffering.max.messages")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0)
        .max(queue_messages)
        .max(100_000);
    // librdkafka counts key and value bytes against `queue.buffering.max.kbytes`; the relay
    // lets one record (up to `message.max.bytes`) go past its byte limit, plus the
    // exactly-once checkpoint record. Lower than that, the queue would be full before the
    // in-flight limit is reached.
    let message_max_bytes = client
        .get("message.max.bytes")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(DEFAULT_MESSAGE_MAX_BYTES);
    let queue_kbytes = client
        .get("queue.buffering.max.kbytes")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0)
        .max(
            queue_bytes
                .saturating_add(message_max_bytes)
                .div_ceil(1024)
                .saturating_add(1),
        )
        .clamp(DEFAULT_QUEUE_KBYTES, MAX_QUEUE_KBYTES);
    // A record that times out can leave a gap that later records of its partition fill
    // ahead of it. Unless the operator sets a timeout, librdkafka retries in order for
    // as long as the broker is away, and the relay waits (reading no WAL beyond its
    // in-flight limits, still answering the walsender).
    if let Some(id) = transactional_id {
        client.set("transactional.id", id);
    } else if client.get("message.timeout.ms").is_none()
        && client.get("delivery.timeout.ms").is_none()
    {
        client.set("message.timeout.ms", "0");
    }
    client
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("queue.buffering.max.messages", queue_messages.to_string())
        .set("queue.buffering.max.kbytes", queue_kbytes.to_string());
    client
}

/// librdkafka's default `message.max.bytes`.
pub(crate) const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;
/// librdkafka's default `queue.buffering.max.kbytes` (1 GiB): never set lower.
const DEFAULT_QUEUE_KBYTES: usize = 1_048_576;
/// librdkafka's largest `queue.buffering.max.kbytes`.
const MAX_QUEUE_KBYTES: usize = 2_147_483_647;

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn kafka(properties: &[(&str, &str)]) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: "k:9092".into(),
            properties: properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            properties_file: None,
            create_topics: None,
        }
    }

    #[test]
    fn producer_settings_keep_what_the_guarantees_rest_on() {
        let config = producer_config(&kafka(&[]), "c", 10_000, 64 << 20, None);
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("message.timeout.ms"), Some("0"));
        assert_eq!(config.get("queue.buffering.max.messages"), Some("100000"));
        assert_eq!(config.get("partitioner"), Some("murmur2_random"));
        // librdkafka's 5 ms batching wait stays unless set (docs/performance.md).
        assert_eq!(config.get("linger.ms"), None);

        let config = producer_config(
            &kafka(&[("linger.ms", "0"), ("message.timeout.ms", "30000")]),
            "c",
            200_000,
            64 << 20,
            Some("tx"),
        );
        assert_eq!(config.get("linger.ms"), Some("0"));
        assert_eq!(config.get("message.timeout.ms"), Some("30000"));
        assert_eq!(config.get("queue.buffering.max.messages"), Some("200000"));
        assert_eq!(config.get("transactional.id"), Some("tx"));
    }

    /// Librdkafka's byte limit below `max_in_flight_bytes` made its queue
    /// full before the relay's limit, and `send` waited for room.
    #[test]
    fn librdkafka_queue_holds_the_in_flight_byte_limit_and_one_record_more() {
        let kbytes = |config: &ClientConfig| -> usize {
            config
                .get("queue.buffering.max.kbytes")
                .expect("queue.buffering.max.kbytes is set")
                .parse()
                .unwrap()
        };
        // 4 GiB in flight: above librdkafka's 1 GiB default.
        let limit = 4usize << 30;
        let config = producer_config(&kafka(&[]), "c", 10_000, limit, None);
        assert!(
            kbytes(&config) * 1024 >= limit + 1_000_000,
            "{}",
            kbytes(&config)
        );
        // An operator's lower setting is raised, a higher one kept.
        let low = producer_config(
            &kafka(&[
                ("queue.buffering.max.kbytes", "1024"),
                ("message.max.bytes", "5000000"),
            ]),
            "c",
            10_000,
            64 << 20,
            None,
        );
        assert!(kbytes(&low) * 1024 >= (64 << 20) + 5_000_000);
        let high = producer_config(
            &kafka(&[("queue.buffering.max.kbytes", "2000000")]),
            "c",
            10_000,
            64 << 20,
            None,
        );
        assert_eq!(kbytes(&high), 2_000_000);
    }
}
