//! An rdkafka [`BaseProducer`] whose delivery reports one thread of ours serves: each record's
//! report completes a oneshot future, or goes into its sink's [`ReportQueue`] with what the
//! sink keeps of the record. rdkafka's `FutureProducer` without its idle cost.
//!
//! rdkafka's `ThreadedProducer` (under `FutureProducer`) polls in 100 ms steps, and
//! `BaseProducer::poll` spins for the last sub-millisecond of each step (the time left is
//! passed to librdkafka in whole milliseconds, so it ends as repeated non-blocking polls):
//! about 1 % of a core on an idle relay. Polling in 1 s steps leaves a tenth of that. A
//! delivery report wakes the poll at once whatever the step, so latency does not change.
//!
//! A sink's records report into one queue, which wakes the sink's task only when it goes from
//! empty to not empty: librdkafka hands over the reports of a produce response together, and
//! the sink takes them together, one wake-up per batch instead of one per record (a future per
//! record cost a wake-up, three allocations and a task node each; docs/performance.md).
//!
//! A new idempotent producer gets its producer id (and so sends its first record) only when
//! librdkafka's 500 ms id timer next finds a broker connected: on a cluster whose bootstrap
//! address is the broker's own, that took 1 s after start, every session (debug log of
//! `bench/run.py` scenario 2). librdkafka also requests the id whenever metadata arrives, so
//! [`PolledProducer::new`] asks for metadata at once, and again once the bootstrap connection
//! has made way for the brokers it named (best effort, `prime`): the first record then goes
//! out within a few round trips.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use futures::task::AtomicWaker;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{
    BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig,
};
use rdkafka::ClientContext;

use crate::ack::EventToken;

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

/// A record for [`PolledProducer::send`]: the opaque says where its report goes.
pub type ProducerRecord<'a> = BaseRecord<'a, [u8], [u8], Box<ReportTo>>;

/// Where a record's delivery report goes.
pub enum ReportTo {
    /// Completes a [`DeliveryFuture`] ([`PolledProducer::record`]).
    Future(oneshot::Sender<DeliveryReport>),
    /// Into a sink's queue, with the record's metadata ([`PolledProducer::queued_record`]).
    Queue(Arc<ReportQueue>, RecordMeta),
}

/// What a sink keeps of a record while it is in flight; given back with its report.
#[derive(Debug)]
pub struct RecordMeta {
    pub token: EventToken,
    pub topic: String,
    /// Bytes of key, value and headers ([`crate::sink::Record::size`]).
    pub size: usize,
    /// When the sink accepted it.
    pub sent: Instant,
    /// Unix ms.
    pub timestamp_ms: Option<i64>,
    /// The sink's number for it, in send order.
    pub seq: u64,
}

/// The delivery reports of one sink's records, in the order librdkafka gave them (per
/// partition, send order). The producer's delivery thread pushes; the sink takes them all at
/// once ([`ReportQueue::poll_take`]).
///
/// Once the sink has gone ([`ReportQueue::close`]), reports are handed to the closing sink's
/// callback instead (a shared producer outlives its sessions: their records still count
/// against the pipeline's limits until their reports come).
#[derive(Default)]
pub struct ReportQueue {
    state: Mutex<QueueState>,
    waker: AtomicWaker,
}

/// Called with each report that comes after [`ReportQueue::close`].
type Orphaned = Box<dyn Fn(&RecordMeta, &DeliveryReport) + Send + Sync>;

#[derive(Default)]
struct QueueState {
    reports: Vec<(RecordMeta, DeliveryReport)>,
    orphaned: Option<Orphaned>,
}

impl ReportQueue {
    fn push(&self, meta: RecordMeta, report: DeliveryReport) {
        let mut state = lock(&self.state);
        if let Some(orphaned) = &state.orphaned {
            orphaned(&meta, &report);
            return;
        }
        let was_empty = state.reports.is_empty();
        state.reports.push((meta, report));
        drop(state);
        // Not empty before: that push woke the sink, which has not taken its report yet.
        if was_empty {
            self.waker.wake();
        }
    }

    /// Moves every report that came into `into`, which must be empty, oldest first; `Pending`
    /// (the task woken by the next report) when none did.
    pub fn poll_take(
        &self,
        cx: &mut Context<'_>,
        into: &mut Vec<(RecordMeta, DeliveryReport)>,
    ) -> Poll<()> {
        debug_assert!(into.is_empty(), "reports taken before are returned first");
        self.waker.register(cx.waker());
        let mut state = lock(&self.state);
        if state.reports.is_empty() {
            return Poll::Pending;
        }
        // The two buffers trade places: neither allocates again once grown.
        std::mem::swap(into, &mut state.reports);
        Poll::Ready(())
    }

    /// No report waits to be taken.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        lock(&self.state).reports.is_empty()
    }

    /// The sink has gone: reports not taken yet, and every later one, go to `orphaned`.
    pub fn close(&self, orphaned: Orphaned) {
        let mut state = lock(&self.state);
        for (meta, report) in state.reports.drain(..) {
            orphaned(&meta, &report);
        }
        state.orphaned = Some(orphaned);
    }
}

/// Locks `mutex`; a panic elsewhere while it was held leaves plain data, still usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `lock` for reading, as [`lock`] does.
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Client context: librdkafka's logs and errors go to `tracing`, each distinct line once and
/// then summarised ([`crate::sink::kafka::log`]); each delivery report goes where the record's
/// [`ReportTo`] says.
#[derive(Default)]
pub struct DeliveryContext {
    log: crate::sink::kafka::log::Repeats,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.log.log(level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.log.error(&error, reason);
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<ReportTo>;

    fn delivery(&self, result: &DeliveryResult<'_>, to: Self::DeliveryOpaque) {
        let report = match result {
            Ok(_) => Ok(()),
            Err((error, message)) => Err((error.clone(), message.detach())),
        };
        match *to {
            // The receiver is gone when its sender was dropped: nobody waits.
            ReportTo::Future(sender) => drop(sender.send(report)),
            ReportTo::Queue(queue, meta) => queue.push(meta, report),
        }
    }
}

/// A producer with one delivery report thread. Clones share the producer; when the last clone
/// is dropped the thread ends within `POLL_STEP` (1 s) and destroys the producer itself (purging
/// what is still queued, as rdkafka does), so dropping never blocks the caller. The thread is
/// detached: when the process exits first, the producer is not destroyed at all (the relay
/// drains before it exits, so nothing is left in flight; the broker sees the connection close).
#[derive(Clone)]
pub struct PolledProducer {
    // Fields drop in order: this reference goes before the stop flag is set, so the delivery
    // thread's is normally the last one.
    producer: Arc<BaseProducer<DeliveryContext>>,
    /// Set by [`PolledProducer::retire`]: its queue was purged, and no record goes in again.
    /// [`PolledProducer::send`] holds it for reading while it queues a record, so no record
    /// goes in once it is set.
    retired: Arc<RwLock<bool>>,
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
    /// (`rdkafka-prime`, `prime`) so that the producer id comes at once.
    ///
    /// Returns an error if librdkafka rejects the configuration or the delivery report thread
    /// cannot start.
    pub fn new(config: &ClientConfig) -> Result<Self, KafkaError> {
        let producer: Arc<BaseProducer<DeliveryContext>> =
            Arc::new(config.create_with_context(DeliveryContext::default())?);
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
            retired: Arc::default(),
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

    /// Queues `record` (made by [`PolledProducer::record`] or [`PolledProducer::queued_record`]);
    /// its delivery report completes the future or goes into the queue. On error the record is
    /// given back (`QueueFull` among them: wait for a delivery, then send it again;
    /// `PurgeQueue`: the producer is retired, [`PolledProducer::retire`]).
    #[allow(clippy::result_large_err)] // the record is given back to be sent again
    pub fn send<'a>(
        &self,
        record: ProducerRecord<'a>,
    ) -> Result<(), (KafkaError, ProducerRecord<'a>)> {
        let retired = read(&self.retired);
        if *retired {
            return Err((
                KafkaError::MessageProduction(RDKafkaErrorCode::PurgeQueue),
                record,
            ));
        }
        self.producer.send(record)
    }

    /// Takes no record again and purges every record the producer holds, queued, waiting to be
    /// retried or sent and awaiting the broker's answer: each gets a failed delivery report
    /// (`PurgeQueue` or `PurgeInflight`, the latter perhaps written by the broker all the
    /// same), and nothing is sent or retried after, so what a partition gets of them is a
    /// prefix in send order. [`PolledProducer::send`] refuses with `PurgeQueue` from now on.
    /// Does not wait for librdkafka's broker threads to finish the purge.
    ///
    /// For a session that ends on a failed delivery: its records behind the failed one must
    /// not reach the broker before the failed one's second copy, and a producer that outlives
    /// the session (shared, or destroyed only when its delivery thread next wakes) would
    /// still send them, or retry them after the failed one.
    pub fn retire(&self) {
        *self.retired.write().unwrap_or_else(PoisonError::into_inner) = true;
        self.producer
            .purge(PurgeConfig::default().queue().inflight().non_blocking());
    }

    /// Whether [`PolledProducer::retire`] was called on this producer (or a clone).
    pub fn is_retired(&self) -> bool {
        *read(&self.retired)
    }

    /// Creates a record for `topic` and the future its delivery report completes.
    pub fn record(topic: &str) -> (ProducerRecord<'_>, DeliveryFuture) {
        let (sender, receiver) = oneshot::channel();
        (
            BaseRecord::with_opaque_to(topic, Box::new(ReportTo::Future(sender))),
            receiver,
        )
    }

    /// Creates a record for `topic` (the same as `meta.topic`) whose report goes into `queue`
    /// with `meta`.
    pub fn queued_record<'a>(
        topic: &'a str,
        queue: &Arc<ReportQueue>,
        meta: RecordMeta,
    ) -> ProducerRecord<'a> {
        BaseRecord::with_opaque_to(topic, Box::new(ReportTo::Queue(Arc::clone(queue), meta)))
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

    fn meta(seq: u64, size: usize) -> RecordMeta {
        let mut tracker = crate::ack::AckTracker::new(crate::lsn::Lsn(0x100));
        tracker.begin().unwrap();
        RecordMeta {
            token: tracker.track_event().unwrap(),
            topic: "t".into(),
            size,
            sent: Instant::now(),
            timestamp_ms: None,
            seq,
        }
    }

    /// Counts the wake-ups of the task that polls the queue.
    struct CountingWaker(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The reports of one batch wake the sink once, and it takes them all, in order.
    #[test]
    fn a_batch_of_reports_wakes_the_sink_once() {
        let queue = ReportQueue::default();
        let counter = Arc::new(CountingWaker(Default::default()));
        let waker = std::task::Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        let mut taken = Vec::new();
        assert!(queue.poll_take(&mut cx, &mut taken).is_pending());
        for seq in 0..3 {
            queue.push(meta(seq, 1), Ok(()));
        }
        assert_eq!(
            counter.0.load(Ordering::SeqCst),
            1,
            "woken once for three reports"
        );
        assert!(queue.poll_take(&mut cx, &mut taken).is_ready());
        let seqs: Vec<u64> = taken.iter().map(|(m, _)| m.seq).collect();
        assert_eq!(seqs, [0, 1, 2]);
        // Taken: the next report wakes the sink again.
        queue.push(meta(3, 1), Ok(()));
        assert_eq!(counter.0.load(Ordering::SeqCst), 2);
        taken.clear();
        assert!(queue.poll_take(&mut cx, &mut taken).is_ready());
        assert_eq!(taken.len(), 1);
    }

    /// After `close`, reports not taken and every later one go to the callback, none lost.
    #[test]
    fn a_closed_queue_hands_its_reports_to_the_callback() {
        let queue = ReportQueue::default();
        queue.push(meta(0, 10), Ok(()));
        let bytes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&bytes);
        queue.close(Box::new(move |m: &RecordMeta, _: &DeliveryReport| {
            counted.fetch_add(m.size, Ordering::SeqCst);
        }));
        assert_eq!(bytes.load(Ordering::SeqCst), 10, "the report not taken");
        queue.push(meta(1, 5), Ok(()));
        assert_eq!(bytes.load(Ordering::SeqCst), 15, "a report after close");
        let waker = futures::task::noop_waker();
        let mut taken = Vec::new();
        assert!(queue
            .poll_take(&mut Context::from_waker(&waker), &mut taken)
            .is_pending());
    }

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
