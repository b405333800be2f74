//! An rdkafka [`BaseProducer`] whose delivery reports one thread of ours serves, each record
//! completing a oneshot future: rdkafka's `FutureProducer` without its idle cost.
//!
//! rdkafka's `ThreadedProducer` (under `FutureProducer`) polls in 100 ms steps, and
//! `BaseProducer::poll` spins for the last sub-millisecond of each step (the time left is
//! passed to librdkafka in whole milliseconds, so it ends as repeated non-blocking polls):
//! about 1 % of a core on an idle relay. Polling in 1 s steps leaves a tenth of that. A
//! delivery report wakes the poll at once whatever the step, so latency does not change.
//!
//! A new idempotent producer gets its producer id (and so sends its first record) only when
//! librdkafka's 500 ms id timer next finds a broker connected: on a cluster whose bootstrap
//! address is the broker's own, that took 1 s after start, every session (debug log of
//! `bench/run.py` scenario 2). librdkafka also requests the id whenever metadata arrives, so
//! [`PolledProducer::new`] asks for metadata at once, and again once the bootstrap connection
//! has made way for the brokers it named (best effort, [`prime`]): the first record then goes
//! out within a few round trips.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::oneshot;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

/// How long one poll of the delivery report queue may block when nothing arrives.
const POLL_STEP: Duration = Duration::from_secs(1);
/// How long each early metadata request (see the module docs) may wait for a broker.
const PRIME_TIMEOUT: Duration = Duration::from_secs(1);
/// Between early metadata requests: the bootstrap connection closes within a few ms of the
/// first answer (4 ms in the debug log of a local broker).
const PRIME_PAUSE: Duration = Duration::from_millis(20);
/// Early metadata requests at most, answered or not.
const PRIME_ATTEMPTS: u32 = 4;

/// A record's delivery report: `Err` carries librdkafka's error and the record it gave back.
pub type DeliveryReport = Result<(), (KafkaError, OwnedMessage)>;

/// Resolves with the record's [`DeliveryReport`]. Destroying the producer purges what it still
/// holds, each record with a report (`PurgeQueue` / `PurgeInflight`); `Err(Canceled)` only if
/// the record was refused by [`PolledProducer::send`] and then dropped.
pub type DeliveryFuture = oneshot::Receiver<DeliveryReport>;

/// A record for [`PolledProducer::send`]: the opaque is its delivery future's sender.
pub type ProducerRecord<'a> = BaseRecord<'a, [u8], [u8], Box<oneshot::Sender<DeliveryReport>>>;

/// Client context: librdkafka's logs and errors go to `tracing` (rdkafka's defaults); each
/// delivery report completes the record's future.
pub struct DeliveryContext;

impl ClientContext for DeliveryContext {}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<oneshot::Sender<DeliveryReport>>;

    fn delivery(&self, result: &DeliveryResult<'_>, sender: Self::DeliveryOpaque) {
        let report = match result {
            Ok(_) => Ok(()),
            Err((error, message)) => Err((error.clone(), message.detach())),
        };
        // The receiver is gone when the sink that sent the record was dropped: nobody waits.
        let _ = sender.send(report);
    }
}

/// A producer with one delivery report thread. Clones share the producer; when the last clone
/// is dropped the thread ends within [`POLL_STEP`] and destroys the producer itself (purging
/// what is still queued, as rdkafka does), so dropping never blocks the caller. The thread is
/// detached: when the process exits first, the producer is not destroyed at all (the relay
/// drains before it exits, so nothing is left in flight; the broker sees the connection close).
#[derive(Clone)]
pub struct PolledProducer {
    // Fields drop in order: this reference goes before the stop flag is set, so the delivery
    // thread's is normally the last one.
    producer: Arc<BaseProducer<DeliveryContext>>,
    _stop: Arc<StopOnDrop>,
}

/// Best effort, on the `rdkafka-prime` thread: asks for the metadata of all topics (their names
/// are not known yet) until two answers came, at most [`PRIME_ATTEMPTS`] times. The first
/// answer usually comes over the bootstrap connection, which librdkafka then closes in favour
/// of the brokers it names; the second, after [`PRIME_PAUSE`], from one of those, which is what
/// the producer id needs. Holds the producer only during a request (at most
/// [`PRIME_TIMEOUT`]), so a dropped producer is destroyed at most that much later.
fn prime(producer: &std::sync::Weak<BaseProducer<DeliveryContext>>) {
    let mut answers = 0;
    for attempt in 0..PRIME_ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(PRIME_PAUSE);
        }
        let Some(producer) = producer.upgrade() else {
            return;
        };
        match producer.client().fetch_metadata(None, PRIME_TIMEOUT) {
            Ok(_) => answers += 1,
            Err(e) => tracing::debug!(error = %e, attempt, "early metadata request failed"),
        }
        if answers == 2 {
            return;
        }
    }
}

/// Tells the polling thread to end when the last [`PolledProducer`] clone goes.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl PolledProducer {
    /// Creates the producer for `config`, starts its delivery report thread
    /// (`rdkafka-delivery`) and requests the cluster's metadata on a short-lived thread
    /// (`rdkafka-prime`, [`prime`]) so that the producer id comes at once.
    ///
    /// Returns an error if librdkafka rejects the configuration or the delivery report thread
    /// cannot start.
    pub fn new(config: &ClientConfig) -> Result<Self, KafkaError> {
        let producer: Arc<BaseProducer<DeliveryContext>> =
            Arc::new(config.create_with_context(DeliveryContext)?);
        let stop = Arc::new(AtomicBool::new(false));
        let (polled, stopped) = (Arc::clone(&producer), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("rdkafka-delivery".into())
            .spawn(move || {
                while !stopped.load(Ordering::Acquire) {
                    polled.poll(POLL_STEP);
                }
                // Usually the last reference: librdkafka's threads are joined here, off the
                // async runtime.
                drop(polled);
            })
            .map_err(|e| {
                KafkaError::ClientCreation(format!("cannot start the delivery report thread: {e}"))
            })?;
        let producer = PolledProducer {
            producer,
            _stop: Arc::new(StopOnDrop(stop)),
        };
        let primed = Arc::downgrade(&producer.producer);
        let prime = std::thread::Builder::new()
            .name("rdkafka-prime".into())
            .spawn(move || prime(&primed));
        // Without it the producer id only comes later (librdkafka's timer): not an error.
        if let Err(e) = prime {
            tracing::debug!(error = %e, "cannot start the early metadata request");
        }
        Ok(producer)
    }

    /// Queues `record` (made by [`PolledProducer::record`]); its future resolves with the
    /// delivery report. On error the record is given back (`QueueFull` among them: wait for a
    /// delivery, then send it again).
    #[allow(clippy::result_large_err)] // the record is given back to be sent again
    pub fn send<'a>(
        &self,
        record: ProducerRecord<'a>,
    ) -> Result<(), (KafkaError, ProducerRecord<'a>)> {
        self.producer.send(record)
    }

    /// Creates a record for `topic` and the future its delivery report completes.
    pub fn record(topic: &str) -> (ProducerRecord<'_>, DeliveryFuture) {
        let (sender, receiver) = oneshot::channel();
        (
            BaseRecord::with_opaque_to(topic, Box::new(sender)),
            receiver,
        )
    }

    /// Whether `self` and `other` are clones of one producer.
    pub fn same(&self, other: &PolledProducer) -> bool {
        Arc::ptr_eq(&self.producer, &other.producer)
    }

    /// The producer, for the calls of rdkafka's [`rdkafka::producer::Producer`] trait
    /// (transactions, flush, ...).
    pub fn inner(&self) -> &BaseProducer<DeliveryContext> {
        &self.producer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dropping the last clone ends the delivery thread, which destroys the producer: a record
    /// still queued (no broker answers) gets its report (purged) instead of waiting forever.
    #[test]
    fn dropping_the_last_clone_destroys_the_producer() {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "0");
        let producer = PolledProducer::new(&config).expect("a valid configuration");
        let clone = producer.clone();
        let (record, delivery) = PolledProducer::record("t");
        producer
            .send(record.key(b"k".as_slice()).payload(b"v".as_slice()))
            .map_err(|(e, _)| e)
            .expect("queued");
        drop(producer);
        let mut delivery = delivery;
        // A clone keeps it alive: no report yet.
        std::thread::sleep(Duration::from_millis(200));
        assert!(matches!(delivery.try_recv(), Ok(None)));
        drop(clone);
        // Destroyed within a poll step (1 s) plus an early metadata request (1 s).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let report = loop {
            match delivery.try_recv() {
                Ok(Some(report)) => break report,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => panic!("no delivery report 30 s after the last clone was dropped"),
                Err(_) => panic!("the record's sender was dropped without a report"),
            }
        };
        let (error, message) = report.expect_err("never delivered");
        assert_eq!(
            error.rdkafka_error_code(),
            Some(rdkafka::error::RDKafkaErrorCode::PurgeQueue),
            "{error}"
        );
        assert_eq!(rdkafka::Message::payload(&message), Some(b"v".as_slice()));
    }
}
