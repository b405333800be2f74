//! The session loop driven by a fake source and a fake sink, on tokio's paused clock (time
//! moves only when every task waits, so no test depends on the machine's speed).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::*;
use crate::metrics::{Metrics, PipelineState};
use crate::sink::SendError;
use crate::source::outbox::{OutboxError, ValueKind};
use crate::source::FailureHandling;

fn config() -> PipelineConfig {
    PipelineConfig {
        max_in_flight_events: 10,
        max_in_flight_bytes: 1 << 20,
        shutdown_timeout_secs: 2,
        ..PipelineConfig::test_pipeline()
    }
}

/// Where the test starts: the slot's confirmed LSN.
const START: Lsn = Lsn(0x100);

/// Transaction `i` with `events` events: its Begin, events and Commit items, at LSNs above
/// [`START`] that grow with `i`. Event ids are `e<i>.<n>`.
fn transaction(i: u64, events: u64) -> Vec<SourceItem> {
    let base = START.0 + 0x1000 * (i + 1);
    let mut items = vec![SourceItem::Begin {
        final_lsn: Lsn(base + 0x800),
        commit_time_ms: 1_700_000_000_000,
    }];
    for n in 0..events {
        let event = OutboxEvent {
            id: Bytes::from(format!("e{i}.{n}")),
            aggregate_type: Bytes::from_static(b"order"),
            aggregate_id: Some(Bytes::from(format!("k{i}"))),
            aggregate_id_kind: ValueKind::Text,
            event_type: Some(Bytes::from_static(b"created")),
            payload: Some(Bytes::from_static(b"{}")),
            headers: None,
            routed_by: None,
            payload_kind: ValueKind::Json,
            columns: vec![],
            lsn: Lsn(base + 0x10 * (n + 1)),
            refused: None,
        };
        items.push(SourceItem::Event {
            event,
            time_ms: None,
        });
    }
    items.push(SourceItem::Commit {
        end_lsn: commit_end(i),
    });
    items
}

/// The end LSN of [`transaction`] `i`.
fn commit_end(i: u64) -> Lsn {
    Lsn(START.0 + 0x1000 * (i + 1) + 0x900)
}

/// What the fake source saw.
#[derive(Default)]
struct SourceLog {
    begins: usize,
    confirmations: Vec<Lsn>,
    /// Event numbers and whether they were acknowledged, in the order the outcomes came.
    outcomes: Vec<(u64, bool)>,
    /// Event numbers of the failures that reached the server (`attempted`).
    attempted_failures: Vec<u64>,
}

/// Hands out scripted items, then waits forever; records failed deliveries itself (as the
/// polling source does) when `records_failures`; with `delay = Some((n, after))`, hands out
/// item number `n` (from 0) only `after` its first call; with `fail_at = Some(n)`, fails with
/// bad input (a relation it never saw) instead of handing out item number `n`.
struct FakeSource {
    items: VecDeque<SourceItem>,
    log: Arc<Mutex<SourceLog>>,
    records_failures: bool,
    delay: Option<(usize, Duration)>,
    fail_at: Option<usize>,
    handed: usize,
    first_call: Option<tokio::time::Instant>,
}

impl FakeSource {
    fn new(items: Vec<SourceItem>) -> (Self, Arc<Mutex<SourceLog>>) {
        let log = Arc::new(Mutex::new(SourceLog::default()));
        let source = FakeSource {
            items: items.into(),
            log: log.clone(),
            records_failures: false,
            delay: None,
            fail_at: None,
            handed: 0,
            first_call: None,
        };
        (source, log)
    }
}

impl Source for FakeSource {
    async fn next(&mut self) -> Result<SourceItem, Error> {
        let first_call = *self
            .first_call
            .get_or_insert_with(tokio::time::Instant::now);
        if let Some((_, after)) = self.delay.filter(|&(n, _)| n == self.handed) {
            // Cancel-safe: the deadline stays the same on the next call.
            tokio::time::sleep_until(first_call + after).await;
            self.delay = None;
        }
        if self.fail_at == Some(self.handed) {
            return Err(OutboxError::UnknownRelation {
                rel_id: 7,
                lsn: Lsn(START.0 + 0x10_0000),
            }
            .into());
        }
        self.handed += 1;
        match self.items.pop_front() {
            Some(item) => {
                if matches!(item, SourceItem::Begin { .. }) {
                    self.log.lock().unwrap().begins += 1;
                }
                Ok(item)
            }
            None => std::future::pending().await,
        }
    }

    async fn confirm(&mut self, confirmation: Confirmation) -> Result<(), Error> {
        self.log
            .lock()
            .unwrap()
            .confirmations
            .push(confirmation.position);
        Ok(())
    }

    fn on_outcome(&mut self, event: u64, outcome: Result<(), &DeliveryError>) -> FailureHandling {
        let mut log = self.log.lock().unwrap();
        log.outcomes.push((event, outcome.is_ok()));
        if outcome.is_err_and(|e| e.attempted) {
            log.attempted_failures.push(event);
        }
        drop(log);
        match self.records_failures {
            true => FailureHandling::Recorded,
            false => FailureHandling::Session,
        }
    }

    fn confirm_requested(&self) -> bool {
        false
    }

    async fn close(self) {}
}

/// Accepts records while it holds fewer than `queue_limit`, acknowledges each at once except
/// the first `hold` ones, which never get an outcome (an unavailable partition), those
/// numbered (from 0, in send order) in `fail`, which time out (a retryable failure), and
/// those in `refuse`, which the broker refuses for good [`REFUSAL_DELAY`] after their send.
/// With `full = Some((topic, n))` the first `n` records for `topic` find the queue full
/// whatever it holds (as when an ended session's records fill the pipeline's room). Dead-letter
/// copies (topic [`DEAD_LETTER_TOPIC`]) of the events in `copy_full_once` find it full at their
/// first send, and those of `copy_refused` are refused at send (a topic that does not exist).
/// Outcomes numbered in `delay` come that much later.
struct FakeSink {
    queue_limit: usize,
    hold: usize,
    fail: Vec<usize>,
    /// Numbered records that fail because the client's connection is gone for good.
    lose_connection: Vec<usize>,
    refuse: Vec<usize>,
    full: Option<(&'static str, usize)>,
    /// The topic of `full` is a missing topic while it is full ([`Sink::waiting`]).
    full_is_missing_topic: bool,
    copy_full_once: Vec<String>,
    copy_refused: Vec<String>,
    /// Dead-letter copies larger than this are refused at send as too large.
    copy_max_bytes: Option<usize>,
    delay: Vec<(usize, Duration)>,
    /// What it reports an ended session left in a shared client ([`Sink::left_over`]), and
    /// when the oldest of that was accepted.
    left_over: InFlight,
    left_over_since: Option<Instant>,
    /// Outcomes with the record's size and when they come.
    ready: VecDeque<(Delivery, usize, tokio::time::Instant)>,
    in_flight: InFlight,
    /// Event ids in the order the sink accepted them.
    sent: Arc<Mutex<Vec<String>>>,
    /// Every call of [`Sink::send`], accepted or not.
    offers: Arc<Mutex<usize>>,
    /// The records in flight at each [`Sink::withdraw_in_flight`].
    withdrew: Arc<Mutex<Vec<usize>>>,
}

impl FakeSink {
    fn new(queue_limit: usize, hold: usize) -> (Self, Arc<Mutex<Vec<String>>>) {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let sink = FakeSink {
            queue_limit,
            hold,
            fail: Vec::new(),
            lose_connection: Vec::new(),
            refuse: Vec::new(),
            full: None,
            full_is_missing_topic: false,
            copy_full_once: Vec::new(),
            copy_refused: Vec::new(),
            copy_max_bytes: None,
            delay: Vec::new(),
            left_over: InFlight::default(),
            left_over_since: None,
            ready: VecDeque::new(),
            in_flight: InFlight::default(),
            sent: sent.clone(),
            offers: Arc::default(),
            withdrew: Arc::default(),
        };
        (sink, sent)
    }
}

impl Sink for FakeSink {
    fn send(&mut self, record: Record, token: EventToken) -> Result<(), SendError> {
        *self.offers.lock().unwrap() += 1;
        if self.in_flight.events >= self.queue_limit {
            return Err(SendError::Full(Box::new(record)));
        }
        if let Some((topic, n)) = &mut self.full {
            if *n > 0 && record.topic == *topic {
                *n -= 1;
                return Err(SendError::Full(Box::new(record)));
            }
        }
        let id = record.event_id();
        if record.topic == DEAD_LETTER_TOPIC {
            if let Some(i) = self.copy_full_once.iter().position(|e| *e == id) {
                self.copy_full_once.remove(i);
                return Err(SendError::Full(Box::new(record)));
            }
            if self.copy_max_bytes.is_some_and(|max| record.size() > max) {
                return Err(SendError::Refused(DeliveryError {
                    event_id: id,
                    topic: record.topic.clone(),
                    reason: "Broker: Message size too large".into(),
                    retryable: false,
                    too_large: true,
                    connection_lost: false,
                    attempted: true,
                    record: Some(Box::new(record)),
                }));
            }
            if self.copy_refused.contains(&id) {
                return Err(SendError::Refused(DeliveryError {
                    event_id: id,
                    topic: record.topic.clone(),
                    reason: "Broker: Unknown topic or partition".into(),
                    retryable: false,
                    too_large: false,
                    connection_lost: false,
                    attempted: true,
                    record: Some(Box::new(record)),
                }));
            }
        }
        let size = record.size();
        self.in_flight.events += 1;
        self.in_flight.bytes += size;
        let mut sent = self.sent.lock().unwrap();
        sent.push(record.event_id());
        if sent.len() > self.hold {
            let number = sent.len() - 1;
            let mut at = tokio::time::Instant::now();
            if let Some((_, delay)) = self.delay.iter().find(|(n, _)| *n == number) {
                at += *delay;
            }
            let lost = self.lose_connection.contains(&number);
            let result = if self.fail.contains(&number) || lost {
                Err(DeliveryError {
                    event_id: record.event_id(),
                    topic: record.topic.clone(),
                    reason: "Local: Message timed out".into(),
                    retryable: true,
                    too_large: false,
                    connection_lost: lost,
                    attempted: true,
                    record: None,
                })
            } else if self.refuse.contains(&number) {
                at += REFUSAL_DELAY;
                Err(DeliveryError {
                    event_id: record.event_id(),
                    topic: record.topic.clone(),
                    reason: "Broker: Invalid record".into(),
                    retryable: false,
                    too_large: false,
                    connection_lost: false,
                    attempted: true,
                    record: Some(Box::new(record.clone())),
                })
            } else {
                Ok(())
            };
            let delivery = Delivery {
                token,
                topic: record.topic,
                result,
                latency: Duration::ZERO,
                timestamp_ms: None,
            };
            self.ready.push_back((delivery, size, at));
        }
        Ok(())
    }

    fn waiting(&self) -> Option<String> {
        match self.full {
            Some((topic, n)) if self.full_is_missing_topic && n > 0 => {
                Some(format!("topic {topic} does not exist"))
            }
            _ => None,
        }
    }

    async fn next_delivery(&mut self) -> Option<Delivery> {
        // Cancel-safe: the outcome stays queued until the sleep is over.
        if let Some(&(_, _, at)) = self.ready.front() {
            tokio::time::sleep_until(at).await;
        }
        match self.ready.pop_front() {
            Some((delivery, size, _)) => {
                self.in_flight.events -= 1;
                self.in_flight.bytes -= size;
                Some(delivery)
            }
            None => std::future::pending().await,
        }
    }

    fn left_over(&self) -> InFlight {
        self.left_over
    }

    fn oldest_left_over(&self) -> Option<Instant> {
        self.left_over_since
    }

    fn in_flight(&self) -> InFlight {
        self.in_flight
    }

    fn oldest_in_flight(&self) -> Option<Instant> {
        None
    }

    fn withdraw_in_flight(&mut self) {
        self.withdrew.lock().unwrap().push(self.in_flight.events);
    }
}

/// How long after its send [`FakeSink`] refuses a record numbered in `refuse`.
const REFUSAL_DELAY: Duration = Duration::from_millis(100);
/// The dead-letter topic of the tests that dead-letter.
const DEAD_LETTER_TOPIC: &str = "outbox.dead-letter";

/// [`config`] with `on_bad_event = "dead_letter"` to [`DEAD_LETTER_TOPIC`].
fn dead_letter_config() -> PipelineConfig {
    PipelineConfig {
        on_bad_event: OnBadEvent::DeadLetter,
        dead_letter_topic: Some(DEAD_LETTER_TOPIC.into()),
        ..config()
    }
}

/// An at-least-once session over `source` and `sink` from [`START`].
fn at_least_once<'a>(
    config: &'a PipelineConfig,
    metrics: &'a PipelineMetrics,
    progress: &'a SessionProgress,
    source: FakeSource,
    sink: FakeSink,
) -> Session<'a, FakeSource, FakeSink> {
    let router = Router::new(config).unwrap();
    Session::new(
        config,
        metrics,
        source,
        sink,
        router,
        Mode::AtLeastOnce,
        START,
        progress,
    )
}

/// Runs a session over `source` and `sink` and cancels it after `run_for` (virtual time);
/// returns its result and how long it ran.
async fn run_session(
    config: &PipelineConfig,
    source: FakeSource,
    sink: FakeSink,
    run_for: Duration,
) -> (Result<(), Error>, Duration) {
    let metrics = Metrics::new().pipeline(&config.name);
    let progress = SessionProgress::new(metrics.clone());
    let shutdown = CancellationToken::new();
    let cancel = shutdown.clone();
    let timer = tokio::spawn(async move {
        tokio::time::sleep(run_for).await;
        cancel.cancel();
    });
    let started = tokio::time::Instant::now();
    let session = at_least_once(config, &metrics, &progress, source, sink);
    let result = tokio::time::timeout(
        run_for + Duration::from_secs(600),
        session.run(&shutdown, config.status_interval()),
    )
    .await
    .expect("the session ends after shutdown");
    timer.abort();
    (result, started.elapsed())
}

/// Reading was gated only on the sink's in-flight count, so behind one
/// record that is never acknowledged every later (acknowledged) transaction stayed queued in
/// the ack tracker, as many as the source had.
#[tokio::test(start_paused = true)]
async fn one_unacknowledged_record_does_not_let_the_ack_tracker_grow_with_the_source() {
    let config = config();
    let items = (0..10_000).flat_map(|i| transaction(i, 1)).collect();
    let (source, log) = FakeSource::new(items);
    let (sink, sent) = FakeSink::new(usize::MAX, 1);
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(5)).await;
    result.unwrap();
    let log = log.lock().unwrap();
    assert!(
        log.begins <= config.max_in_flight_events + 1,
        "{} transactions read behind one unacknowledged record with max_in_flight_events = {}",
        log.begins,
        config.max_in_flight_events
    );
    assert_eq!(sent.lock().unwrap().len(), log.begins);
    assert!(!log.confirmations.is_empty(), "confirmations go on");
    assert!(
        log.confirmations.iter().all(|&lsn| lsn == START),
        "confirmed past the unacknowledged record: {:?}",
        log.confirmations
    );
}

/// With the sink's queue full, `send` waited inside the select arm: no
/// confirmations (the walsender times out) and no shutdown until an outcome came.
#[tokio::test(start_paused = true)]
async fn a_full_sink_queue_keeps_confirmations_and_shutdown_alive() {
    let config = config();
    let (source, log) = FakeSource::new(transaction(0, 5));
    // Two records fit and never get an outcome (the broker is away); the third finds the
    // queue full.
    let (sink, sent) = FakeSink::new(2, usize::MAX);
    let run_for = Duration::from_secs(10);
    let (result, ran) = run_session(&config, source, sink, run_for).await;
    result.unwrap();
    assert!(
        ran <= run_for + config.shutdown_timeout() + Duration::from_secs(1),
        "shutdown took {ran:?}"
    );
    let log = log.lock().unwrap();
    assert!(
        log.confirmations.len() >= 10,
        "one confirmation per status interval while the queue is full: {:?}",
        log.confirmations
    );
    assert!(log.confirmations.iter().all(|&lsn| lsn == START));
    assert_eq!(*sent.lock().unwrap(), ["e0.0", "e0.1"]);
}

/// A record the full queue gave back is sent again once outcomes made room, in order, and
/// its transaction is confirmed after it is acknowledged.
#[tokio::test(start_paused = true)]
async fn records_the_full_queue_gave_back_go_out_in_order_once_there_is_room() {
    let config = config();
    let items = (0..3).flat_map(|i| transaction(i, 4)).collect();
    let (source, log) = FakeSource::new(items);
    let (sink, sent) = FakeSink::new(2, 0);
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(5)).await;
    result.unwrap();
    let expected: Vec<String> = (0..3)
        .flat_map(|i| (0..4).map(move |n| format!("e{i}.{n}")))
        .collect();
    assert_eq!(*sent.lock().unwrap(), expected);
    let log = log.lock().unwrap();
    assert_eq!(log.confirmations.last(), Some(&commit_end(2)));
    assert!(
        log.confirmations.windows(2).all(|w| w[0] <= w[1]),
        "confirmations went backwards: {:?}",
        log.confirmations
    );
}

/// What the fake transaction calls saw, and how commits end.
#[derive(Default)]
struct TransactionLog {
    calls: Vec<&'static str>,
    /// Checkpoints of the commits called.
    checkpoints: Vec<Lsn>,
}

/// Transaction calls that succeed at once, except that commit number `fail_commit` (from 0)
/// fails.
struct FakeTransactions {
    log: Arc<Mutex<TransactionLog>>,
    fail_commit: Option<usize>,
}

/// A transaction call's failure that a new session may get past (shared with the simulation).
pub(super) fn transaction_error(operation: &'static str) -> TransactionError {
    TransactionError {
        operation,
        source: rdkafka::error::KafkaError::Canceled,
    }
}

impl crate::exactly_once::Transactions for FakeTransactions {
    fn init(&self) -> futures::future::BoxFuture<'static, Result<(), TransactionError>> {
        self.log.lock().unwrap().calls.push("init");
        Box::pin(async { Ok(()) })
    }

    fn begin(&self) -> futures::future::BoxFuture<'static, Result<(), TransactionError>> {
        self.log.lock().unwrap().calls.push("begin");
        Box::pin(async { Ok(()) })
    }

    fn commit(
        &self,
        checkpoint: crate::exactly_once::Checkpoint,
    ) -> futures::future::BoxFuture<'static, Result<(), TransactionError>> {
        let mut log = self.log.lock().unwrap();
        log.calls.push("commit");
        let fail = self.fail_commit == Some(log.checkpoints.len());
        log.checkpoints.push(checkpoint.0);
        Box::pin(async move {
            // A commit takes time: the loop must not confirm meanwhile.
            tokio::time::sleep(Duration::from_millis(500)).await;
            if fail {
                Err(transaction_error("commit"))
            } else {
                Ok(())
            }
        })
    }

    fn abort(
        &self,
        _timeout: Duration,
    ) -> futures::future::BoxFuture<'static, Result<(), TransactionError>> {
        self.log.lock().unwrap().calls.push("abort");
        Box::pin(async { Ok(()) })
    }
}

/// Runs an exactly-once session of `config` over `source` and `sink`, with fake transaction
/// calls whose commit number `fail_commit` fails, batching within `limits`, until it ends (at
/// most 600 s of the paused clock). Returns its result and what the transaction calls saw.
async fn run_exactly_once(
    config: &PipelineConfig,
    source: FakeSource,
    sink: FakeSink,
    fail_commit: Option<usize>,
    limits: crate::exactly_once::BatchLimits,
) -> (Result<(), Error>, Arc<Mutex<TransactionLog>>) {
    let transactions = Arc::new(Mutex::new(TransactionLog::default()));
    let fake = FakeTransactions {
        log: transactions.clone(),
        fail_commit,
    };
    let metrics = Metrics::new().pipeline(&config.name);
    let progress = SessionProgress::new(metrics.clone());
    let router = Router::new(config).unwrap();
    let session = Session::new(
        config,
        &metrics,
        source,
        sink,
        router,
        Mode::ExactlyOnce(Box::new(
            ExactlyOnce::new(Box::new(fake), None).with_limits(limits),
        )),
        START,
        &progress,
    );
    let shutdown = CancellationToken::new();
    let result = tokio::time::timeout(
        Duration::from_secs(600),
        session.run(&shutdown, config.status_interval()),
    )
    .await
    .expect("the session ends");
    (result, transactions)
}

/// Exactly-once: each source transaction's records go in one sink transaction committed with
/// its end LSN as checkpoint; nothing is confirmed past a transaction before its commit
/// completed, and a failed commit ends the session with the transaction unconfirmed.
#[tokio::test(start_paused = true)]
async fn exactly_once_confirms_a_transaction_only_after_its_commit_and_never_after_a_failed_one() {
    let config = config();
    let items = (0..3).flat_map(|i| transaction(i, 2)).collect();
    let (source, log) = FakeSource::new(items);
    let (sink, sent) = FakeSink::new(usize::MAX, 0);
    let (result, transactions) = run_exactly_once(
        &config,
        source,
        sink,
        Some(1),
        crate::exactly_once::BatchLimits::SINGLE,
    )
    .await;
    let error = result.expect_err("a failed commit is an error");
    assert!(matches!(error, Error::Transaction(_)), "{error:?}");
    let transactions = transactions.lock().unwrap();
    // The failed transaction is aborted as the session ends.
    assert_eq!(
        transactions.calls,
        ["begin", "commit", "begin", "commit", "abort"]
    );
    assert_eq!(transactions.checkpoints, [commit_end(0), commit_end(1)]);
    assert_eq!(*sent.lock().unwrap(), ["e0.0", "e0.1", "e1.0", "e1.1"]);
    let log = log.lock().unwrap();
    assert_eq!(
        log.begins, 3,
        "the next transaction is read while a commit is pending (its records are not sent: the commit failed)"
    );
    assert!(
        log.confirmations.iter().all(|&lsn| lsn <= commit_end(0)),
        "confirmed past the transaction whose commit failed: {:?}",
        log.confirmations
    );
    assert!(
        log.confirmations.contains(&commit_end(0)),
        "the committed transaction is confirmed: {:?}",
        log.confirmations
    );
}

/// Exactly-once with batches: consecutive source transactions share one sink transaction,
/// committed with the last one's end LSN; the next batch is read (not sent) while a commit is
/// pending; nothing is confirmed inside a batch or past one whose commit failed; a batch that
/// is not full closes when its linger ends.
#[tokio::test(start_paused = true)]
async fn exactly_once_commits_several_transactions_in_one_sink_transaction() {
    let config = config();
    let items = (0..7).flat_map(|i| transaction(i, 2)).collect();
    let (source, log) = FakeSource::new(items);
    let (sink, sent) = FakeSink::new(usize::MAX, 0);
    let limits = crate::exactly_once::BatchLimits {
        max_transactions: 3,
        max_bytes: usize::MAX,
        linger: Duration::from_secs(1),
    };
    let started = tokio::time::Instant::now();
    let (result, transactions) = run_exactly_once(&config, source, sink, Some(2), limits).await;
    let error = result.expect_err("a failed commit is an error");
    assert!(matches!(error, Error::Transaction(_)), "{error:?}");
    // Two commits of 500 ms, then the last batch's linger of 1 s and its commit.
    assert!(
        started.elapsed() >= Duration::from_millis(2_000),
        "the last batch did not linger: {:?}",
        started.elapsed()
    );
    let transactions = transactions.lock().unwrap();
    assert_eq!(
        transactions.calls,
        ["begin", "commit", "begin", "commit", "begin", "commit", "abort"]
    );
    assert_eq!(
        transactions.checkpoints,
        [commit_end(2), commit_end(5), commit_end(6)]
    );
    let expected: Vec<String> = (0..7)
        .flat_map(|i| (0..2).map(move |n| format!("e{i}.{n}")))
        .collect();
    assert_eq!(*sent.lock().unwrap(), expected);
    let log = log.lock().unwrap();
    assert!(
        log.confirmations
            .iter()
            .all(|lsn| [START, commit_end(2), commit_end(5)].contains(lsn)),
        "confirmed inside a batch or past the failed one: {:?}",
        log.confirmations
    );
    assert!(
        log.confirmations.contains(&commit_end(2)) && log.confirmations.contains(&commit_end(5)),
        "the committed batches are confirmed: {:?}",
        log.confirmations
    );
}

/// A failure the source records (polling: retry_count) settles its event: the session goes
/// on and confirms past it. A failure left to the session (log tailing) ends it unconfirmed.
#[tokio::test(start_paused = true)]
async fn failures_the_source_records_settle_their_events_and_the_session_goes_on() {
    let config = config();
    let items: Vec<SourceItem> = (0..3).flat_map(|i| transaction(i, 2)).collect();

    let (mut source, log) = FakeSource::new(items.clone());
    source.records_failures = true;
    let (mut sink, sent) = FakeSink::new(usize::MAX, 0);
    sink.fail = vec![1];
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(5)).await;
    result.unwrap();
    assert_eq!(sent.lock().unwrap().len(), 6);
    {
        let log = log.lock().unwrap();
        let mut outcomes = log.outcomes.clone();
        outcomes.sort();
        assert_eq!(
            outcomes,
            [
                (0, true),
                (1, false),
                (2, true),
                (3, true),
                (4, true),
                (5, true)
            ]
        );
        assert_eq!(log.confirmations.last(), Some(&commit_end(2)));
    }

    let (source, log) = FakeSource::new(items);
    let (mut sink, _) = FakeSink::new(usize::MAX, 0);
    sink.fail = vec![1];
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(5)).await;
    let error = result.expect_err("a retryable failure ends a log-tailing session");
    assert!(
        matches!(&error, Error::Delivery(e) if e.retryable),
        "{error:?}"
    );
    let log = log.lock().unwrap();
    assert!(
        log.confirmations.iter().all(|&lsn| lsn == START),
        "confirmed past the failed event: {:?}",
        log.confirmations
    );
}

/// A client whose connection is gone for good (a closed RabbitMQ connection, a Redis server
/// turned replica) fails every record after it: even where the source records the failure
/// (polling), the session ends so that the next one connects again. It first finishes the
/// source transaction it is in (the polling cycle marks what was acknowledged and records the
/// failures) and reads no other. (The session went on with the dead client, and every polled
/// row burnt its attempts against it.)
#[tokio::test(start_paused = true)]
async fn a_lost_connection_ends_the_session_even_where_the_source_records_failures() {
    let config = config();
    let items: Vec<SourceItem> = (0..3).flat_map(|i| transaction(i, 2)).collect();
    let (mut source, log) = FakeSource::new(items);
    source.records_failures = true;
    let (mut sink, _) = FakeSink::new(usize::MAX, 0);
    // The client finds its connection gone at record 2; record 3 fails on the dead client.
    sink.lose_connection = vec![2, 3];
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(5)).await;
    let error = result.expect_err("a lost connection ends the session");
    assert!(
        matches!(&error, Error::Delivery(e) if e.retryable && e.connection_lost),
        "{error:?}"
    );
    assert_eq!(error.recovery(), Recovery::Retry);
    let log = log.lock().unwrap();
    assert_eq!(
        log.confirmations.last(),
        Some(&commit_end(1)),
        "the transaction with the lost record is finished: {:?}",
        log.confirmations
    );
    assert_eq!(
        log.begins, 2,
        "no transaction read after the lost connection"
    );
    let mut outcomes = log.outcomes.clone();
    outcomes.sort();
    assert_eq!(outcomes, [(0, true), (1, true), (2, false), (3, false)]);
    // The record that found the loss is charged an attempt; the one after it, failing on the
    // dead client, is not (a polling batch's rows each lost an attempt at every flap).
    assert_eq!(log.attempted_failures, [2]);
}

/// A record that finds the queue full with nothing in flight (an ended session's records fill
/// a shared producer's room, and their reports wake no session) is offered again with a wait
/// that doubles to half a second, not every 10 ms; it goes out once there is room. (The loop
/// woke 100 times a second for as long as the room stayed taken.)
#[tokio::test(start_paused = true)]
async fn a_record_waiting_for_room_is_offered_again_with_a_growing_wait() {
    let config = config();
    // Full for good: over 5 s (virtual), 10 ms doubling to 500 ms is about 17 offers.
    let (source, _) = FakeSource::new(transaction(0, 1));
    let (mut sink, _) = FakeSink::new(usize::MAX, 0);
    sink.full = Some(("order.events", usize::MAX));
    let offers = Arc::clone(&sink.offers);
    let _ = run_session(&config, source, sink, Duration::from_secs(5)).await;
    let offers = *offers.lock().unwrap();
    assert!(offers <= 30, "{offers} offers in 5 s");
    // Full 15 times, then room: it goes out and its transaction is confirmed.
    let (source, log) = FakeSource::new(transaction(0, 1));
    let (mut sink, sent) = FakeSink::new(usize::MAX, 0);
    sink.full = Some(("order.events", 15));
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(10)).await;
    result.unwrap();
    assert_eq!(
        *sent.lock().unwrap(),
        ["e0.0"],
        "it went out once there was room"
    );
    assert_eq!(
        log.lock().unwrap().confirmations.last(),
        Some(&commit_end(0))
    );
}

/// A refused record whose dead-letter copy is refused as too large (the copy's document is
/// larger than the record): the copy goes again in its too-large form, and the transaction is
/// confirmed. (The pipeline stopped on the row.)
#[tokio::test(start_paused = true)]
async fn a_dead_letter_copy_refused_as_too_large_goes_again_without_the_value() {
    let config = dead_letter_config();
    let mut items: Vec<SourceItem> = (0..2).flat_map(|i| transaction(i, 1)).collect();
    if let SourceItem::Event { event, .. } = &mut items[1] {
        event.payload = Some(Bytes::from(format!("{{\"s\": \"{}\"}}", "q\"".repeat(400))));
    }
    let (source, log) = FakeSource::new(items);
    let (mut sink, sent) = FakeSink::new(usize::MAX, 0);
    sink.refuse = vec![0];
    // The full copy of e0.0 (a document with its headers and escaped value) is larger.
    sink.copy_max_bytes = Some(1000);
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(5)).await;
    result.unwrap();
    let sent = sent.lock().unwrap().clone();
    assert_eq!(
        sent,
        ["e0.0", "e1.0", "e0.0"],
        "the original, the next, the shrunk copy"
    );
    let log = log.lock().unwrap();
    assert_eq!(log.confirmations.last(), Some(&commit_end(1)));
}

/// A session that ends on a failed delivery has the sink withdraw the records still in
/// flight, which may be of the failed record's key and must not overtake its second copy
/// (review: a shared producer went on sending them after the session had ended); a session
/// that ends on a shutdown leaves them be.
#[tokio::test(start_paused = true)]
async fn a_failed_delivery_has_the_sink_withdraw_the_records_behind_it() {
    let config = config();
    let items: Vec<SourceItem> = (0..3).flat_map(|i| transaction(i, 2)).collect();
    let (source, _) = FakeSource::new(items.clone());
    let (mut sink, sent) = FakeSink::new(usize::MAX, 0);
    // Record 1 times out a second after its send: the four after it are in flight by then.
    sink.fail = vec![1];
    sink.delay = vec![(1, Duration::from_secs(1))];
    let withdrew = Arc::clone(&sink.withdrew);
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(5)).await;
    let error = result.expect_err("a retryable failure ends a log-tailing session");
    assert!(matches!(&error, Error::Delivery(_)), "{error:?}");
    assert_eq!(sent.lock().unwrap().len(), 6);
    assert_eq!(*withdrew.lock().unwrap(), [4]);

    let (source, _) = FakeSource::new(items);
    let (mut sink, _) = FakeSink::new(usize::MAX, 0);
    sink.delay = vec![(1, Duration::from_secs(1))];
    let withdrew = Arc::clone(&sink.withdrew);
    let (result, _) = run_session(&config, source, sink, Duration::from_millis(500)).await;
    result.unwrap();
    assert_eq!(*withdrew.lock().unwrap(), Vec::<usize>::new());
}

/// Bad input stops the session and its drain meets a refused record with two more behind it:
/// the sink withdraws them, as when a failed delivery ends the session (review: the drain
/// stopped there and left them to go out after the pipeline had halted).
#[tokio::test(start_paused = true)]
async fn a_failed_delivery_in_the_drain_after_bad_input_withdraws_the_records_behind_it() {
    let config = config();
    let mut items = transaction(0, 4);
    let SourceItem::Event { event, .. } = &mut items[4] else {
        panic!("the transaction's fourth event")
    };
    event.aggregate_type = Bytes::from_static(b"bad type");
    let (source, _) = FakeSource::new(items);
    let (mut sink, sent) = FakeSink::new(usize::MAX, 0);
    sink.refuse = vec![0];
    let withdrew = Arc::clone(&sink.withdrew);
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(60)).await;
    let error = result.expect_err("bad input stops the session");
    assert!(matches!(&error, Error::Route { .. }), "{error:?}");
    assert_eq!(sent.lock().unwrap().len(), 3);
    assert_eq!(*withdrew.lock().unwrap(), [2]);
}

/// Bad routing input stops the session with an error naming the event's LSN as well as its
/// id (docs/concepts/guarantees.md, "Bad input"); the router alone knows no LSN.
#[tokio::test(start_paused = true)]
async fn bad_routing_input_names_the_events_lsn_and_id() {
    let config = config();
    let mut items = transaction(0, 2);
    let SourceItem::Event { event, .. } = &mut items[2] else {
        panic!("the transaction's second event")
    };
    event.aggregate_type = Bytes::from_static(b"bad type");
    let lsn = event.lsn;
    let (source, _) = FakeSource::new(items);
    let (sink, _) = FakeSink::new(usize::MAX, usize::MAX);
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(60)).await;
    let error = crate::error::chain(&result.expect_err("bad input stops the session"));
    assert!(
        error.contains(&format!("at LSN {lsn}")) && error.contains("event e0.1"),
        "{error}"
    );
}

/// Found by the simulation (schedule 26554): bad input met while a shutdown's drain finishes
/// the open transaction stops the session, and the drain after such an error waited a whole
/// `shutdown_timeout` again, so the stop took up to twice the timeout (here 4 s instead of 3).
#[tokio::test(start_paused = true)]
async fn bad_input_met_while_draining_does_not_extend_the_shutdown() {
    let config = config();
    let mut items = transaction(0, 2);
    if let SourceItem::Event { event, .. } = &mut items[2] {
        event.aggregate_type = Bytes::from_static(b"bad type");
    }
    let (mut source, _) = FakeSource::new(items);
    // The bad event comes 2 s in: after the shutdown (1 s), before the drain's end (3 s).
    source.delay = Some((2, Duration::from_secs(2)));
    // Nothing is ever acknowledged: each drain lasts until its deadline.
    let (sink, sent) = FakeSink::new(usize::MAX, usize::MAX);
    let run_for = Duration::from_secs(1);
    let (result, ran) = run_session(&config, source, sink, run_for).await;
    let error = result.expect_err("bad input stops the session");
    assert!(matches!(error, Error::Route { .. }), "{error:?}");
    assert_eq!(*sent.lock().unwrap(), ["e0.0"]);
    assert_eq!(
        ran,
        run_for + config.shutdown_timeout(),
        "the stop took {ran:?}, the shutdown timeout is {:?}",
        config.shutdown_timeout()
    );
}

/// Found by review: a shutdown's drain ended once nothing was in flight and no transaction
/// was open, with a dead-letter copy still waiting for room in the sink's queue: the
/// transaction whose record the broker refused after its Commit was read stayed unconfirmed,
/// so the graceful stop published all of it again on restart.
#[tokio::test(start_paused = true)]
async fn a_drain_waits_for_a_dead_letter_copy_that_found_the_queue_full() {
    let config = dead_letter_config();
    let (source, log) = FakeSource::new(transaction(0, 2));
    let (mut sink, sent) = FakeSink::new(usize::MAX, 0);
    // The broker refuses the second record after the Commit was read and the shutdown
    // began; its copy finds the queue full at its send and at the retry in the same turn.
    sink.refuse = vec![1];
    sink.full = Some((DEAD_LETTER_TOPIC, 2));
    let run_for = REFUSAL_DELAY / 2;
    let (result, ran) = run_session(&config, source, sink, run_for).await;
    result.unwrap();
    assert!(
        ran < run_for + config.shutdown_timeout(),
        "the drain timed out after {ran:?}"
    );
    assert_eq!(*sent.lock().unwrap(), ["e0.0", "e0.1", "e0.1"]);
    let log = log.lock().unwrap();
    assert_eq!(
        log.confirmations.last(),
        Some(&commit_end(0)),
        "the drain stopped before the dead-letter copy was sent: {:?}",
        log.confirmations
    );
}

/// Found by review: the drain after bad input stopped the session waited only for records in
/// flight, so a dead-letter copy that found the sink's queue full (of a record the broker
/// refused after its Commit was read) was never sent: its transaction stayed unconfirmed and
/// was published again on restart.
#[tokio::test(start_paused = true)]
async fn the_drain_after_bad_input_sends_a_dead_letter_copy_that_found_the_queue_full() {
    let config = dead_letter_config();
    let (mut source, log) = FakeSource::new(transaction(0, 2));
    // Bad input right after the transaction's Commit, before the broker's refusal comes.
    source.fail_at = Some(4);
    let (mut sink, sent) = FakeSink::new(usize::MAX, 0);
    sink.refuse = vec![1];
    sink.full = Some((DEAD_LETTER_TOPIC, 1));
    let (result, _) = run_session(&config, source, sink, Duration::from_secs(10)).await;
    let error = result.expect_err("bad input stops the session");
    assert!(matches!(error, Error::Outbox(_)), "{error:?}");
    assert_eq!(*sent.lock().unwrap(), ["e0.0", "e0.1", "e0.1"]);
    let log = log.lock().unwrap();
    assert_eq!(
        log.confirmations.last(),
        Some(&commit_end(0)),
        "the drain stopped before the dead-letter copy was sent: {:?}",
        log.confirmations
    );
}

/// Found by review: the in-flight gauges counted only the session's own records, so while an
/// ended session's records in a shared producer held the pipeline's reads they read 0.
#[tokio::test(start_paused = true)]
async fn the_in_flight_gauges_count_what_an_ended_session_left_in_a_shared_producer() {
    let config = config();
    let (source, _) = FakeSource::new(transaction(0, 1));
    let (mut sink, _) = FakeSink::new(usize::MAX, usize::MAX);
    sink.left_over = InFlight {
        events: 3,
        bytes: 300,
    };
    sink.left_over_since = Some(Instant::now() - Duration::from_secs(120));
    let metrics = Metrics::new().pipeline(&config.name);
    let progress = SessionProgress::new(metrics.clone());
    let session = at_least_once(&config, &metrics, &progress, source, sink);
    let shutdown = CancellationToken::new();
    let watch = async {
        tokio::time::sleep(config.status_interval() * 2).await;
        let seen = (
            metrics.in_flight_events.get(),
            metrics.in_flight_bytes.get(),
            metrics.oldest_unacked_age.get(),
        );
        shutdown.cancel();
        seen
    };
    let (_, (events, bytes, age)) =
        tokio::join!(session.run(&shutdown, config.status_interval()), watch);
    assert_eq!(events, 1 + 3, "the session's record and the 3 left over");
    assert!(bytes > 300, "{bytes} bytes");
    // The left-over records were accepted two minutes ago (std's clock, not the paused one).
    assert!(
        age >= 120.0,
        "oldest unacknowledged age {age} s ignores the left-over records"
    );
}

/// Found by review: the drain after bad input stopped waiting for the records in flight once
/// a waiting dead-letter copy was refused at its send: an earlier copy acknowledged within the
/// drain's time went unconfirmed, and its transaction was published again on restart.
#[tokio::test(start_paused = true)]
async fn the_drain_after_bad_input_still_awaits_what_is_in_flight_after_a_copy_is_refused() {
    let config = dead_letter_config();
    let mut items = transaction(0, 1);
    items.extend(transaction(1, 1));
    let (mut source, log) = FakeSource::new(items);
    // Bad input after the second Commit, before the broker refuses either record.
    source.fail_at = Some(6);
    let (mut sink, sent) = FakeSink::new(usize::MAX, 0);
    sink.refuse = vec![0, 1];
    // e0.0's copy (the third record sent) is acknowledged 500 ms after its send; e1.0's
    // finds the queue full, then is refused.
    sink.delay = vec![(2, Duration::from_millis(500))];
    sink.copy_full_once = vec!["e1.0".into()];
    sink.copy_refused = vec!["e1.0".into()];
    let (result, ran) = run_session(&config, source, sink, Duration::from_secs(10)).await;
    let error = result.expect_err("bad input stops the session");
    assert!(matches!(error, Error::Outbox(_)), "{error:?}");
    assert_eq!(*sent.lock().unwrap(), ["e0.0", "e1.0", "e0.0"]);
    let log = log.lock().unwrap();
    assert_eq!(
        log.confirmations.last(),
        Some(&commit_end(0)),
        "the first transaction's copy was acknowledged within the drain: {:?}",
        log.confirmations
    );
    assert!(ran < config.shutdown_timeout(), "the drain took {ran:?}");
}

/// Found by review: while the session drained after bad input stopped it, `/readyz` still
/// said "streaming".
#[tokio::test(start_paused = true)]
async fn the_drain_after_bad_input_is_shown_as_draining() {
    let config = config();
    let (mut source, _) = FakeSource::new(transaction(0, 1));
    source.fail_at = Some(3);
    // Never acknowledged: the drain lasts the shutdown timeout.
    let (sink, _) = FakeSink::new(usize::MAX, usize::MAX);
    let all = Metrics::new();
    let metrics = all.pipeline(&config.name);
    metrics.set_state(PipelineState::Streaming, None);
    let progress = SessionProgress::new(metrics.clone());
    let session = at_least_once(&config, &metrics, &progress, source, sink);
    let shutdown = CancellationToken::new();
    let watch = async {
        tokio::time::sleep(config.shutdown_timeout() / 2).await;
        all.health()[&config.name].clone()
    };
    let (result, health) = tokio::join!(session.run(&shutdown, config.status_interval()), watch);
    assert!(result.is_err(), "{result:?}");
    assert_eq!(health.state, PipelineState::Draining, "{health:?}");
    assert!(
        health
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("relation")),
        "{health:?}"
    );
}

/// Exactly-once with batches: the first record of a transaction waits for a missing topic
/// while the Kafka transaction holds the records of the transactions before it. Those commit
/// without it (holding them open would hold the broker's partitions until its transaction
/// timeout, and aborting them would redo them forever while the topic is missing); its
/// records go in the next Kafka transaction once the topic exists. Nothing is aborted, and
/// nothing is confirmed past a transaction before its commit.
#[tokio::test(start_paused = true)]
async fn exactly_once_commits_the_transactions_before_one_waiting_for_a_missing_topic() {
    let config = config();
    let mut items: Vec<SourceItem> = (0..4).flat_map(|i| transaction(i, 2)).collect();
    // Transaction 2's first event routes to the missing topic.
    let mut events = items.iter_mut().filter_map(|item| match item {
        SourceItem::Event { event, .. } => Some(event),
        _ => None,
    });
    events.nth(4).unwrap().aggregate_type = Bytes::from_static(b"missing");
    let (source, log) = FakeSource::new(items);
    let (mut sink, sent) = FakeSink::new(usize::MAX, 0);
    sink.full = Some(("missing.events", 20));
    sink.full_is_missing_topic = true;
    let limits = crate::exactly_once::BatchLimits {
        max_transactions: 10,
        max_bytes: usize::MAX,
        linger: Duration::from_secs(1),
    };
    let (result, transactions) = run_exactly_once(&config, source, sink, Some(1), limits).await;
    let error = result.expect_err("a failed commit is an error");
    assert!(matches!(error, Error::Transaction(_)), "{error:?}");
    let transactions = transactions.lock().unwrap();
    assert_eq!(
        transactions.calls,
        ["begin", "commit", "begin", "commit", "abort"],
        "the batch before the waiting transaction committed, not aborted"
    );
    assert_eq!(
        transactions.checkpoints,
        [commit_end(1), commit_end(3)],
        "the waiting transaction and the one after it form the next batch"
    );
    assert_eq!(
        *sent.lock().unwrap(),
        ["e0.0", "e0.1", "e1.0", "e1.1", "e2.0", "e2.1", "e3.0", "e3.1"]
    );
    let log = log.lock().unwrap();
    assert!(
        log.confirmations.contains(&commit_end(1)),
        "the committed batch is confirmed: {:?}",
        log.confirmations
    );
    assert!(
        log.confirmations.iter().all(|&lsn| lsn <= commit_end(1)),
        "confirmed past the batch whose commit failed: {:?}",
        log.confirmations
    );
}
