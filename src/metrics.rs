//! Prometheus metrics, defined once here. Names follow `outbox_relay_<what>_<unit>[_total]`;
//! labels are low-cardinality (pipeline, message kind), never event ids; the `topic` label is
//! bounded per pipeline (`metrics/topics.rs`).

mod catalog;
mod state;
mod topics;

pub use catalog::{reference_markdown, MetricInfo};

pub use state::{Behind, PipelineHealth, PipelineState, CATCHING_UP_AFTER};
pub use topics::{MAX_TOPIC_LABELS, OTHER_TOPIC};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use catalog::Registrar;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Registry,
};
use state::Reported;

/// All metrics of the process, registered in one [`Registry`].
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    events_decoded: IntCounterVec,
    events_published: IntCounterVec,
    events_null_key: IntCounterVec,
    events_dead_lettered: IntCounterVec,
    messages_skipped: IntCounterVec,
    transactions: IntCounterVec,
    delivery_failures: IntCounterVec,
    status_updates: IntCounterVec,
    reconnects: IntCounterVec,
    consecutive_failed_sessions: IntGaugeVec,
    kafka_transactions: IntCounterVec,
    confirmed_flush_lsn: IntGaugeVec,
    in_flight_events: IntGaugeVec,
    in_flight_bytes: IntGaugeVec,
    streaming: IntGaugeVec,
    pipeline_state: IntGaugeVec,
    lag_bytes: IntGaugeVec,
    oldest_unacked_age: GaugeVec,
    slot_wal_status: IntGaugeVec,
    slot_safe_wal_size: IntGaugeVec,
    slot_invalidated: IntGaugeVec,
    slot_failover: IntGaugeVec,
    standby_slots_stalled: IntGaugeVec,
    delivery_latency: HistogramVec,
    commit_to_ack: HistogramVec,
    polling: PollingMetricVecs,
    health: Arc<Mutex<BTreeMap<String, HealthEntry>>>,
    /// Per pipeline, the destinations its delivery metrics label by name.
    topic_labels: Arc<Mutex<HashMap<String, Arc<topics::TopicLabels>>>>,
    /// What each metric is, in the order registered.
    catalog: Arc<[MetricInfo]>,
}

/// Metrics of the polling source only.
#[derive(Clone)]
struct PollingMetricVecs {
    pending_rows: IntGaugeVec,
    oldest_pending_age: GaugeVec,
    failed_rows: IntGaugeVec,
    events_failed: IntCounterVec,
    polls: IntCounterVec,
    rows_purged: IntCounterVec,
}

/// The values of `pg_replication_slots.wal_status` (PostgreSQL 13+), one series each.
pub const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreserved", "lost"];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registrar::new();
        r.section("Log tailing and delivery");
        let mut metrics = Metrics {
            events_decoded: r.counter("outbox_relay_events_decoded_total", "Outbox events decoded from the WAL (table inserts and logical messages).", &["pipeline"]),
            events_published: r.counter("outbox_relay_events_published_total", "Records acknowledged by the sink (Kafka or another kind), by topic or destination (dead-letter copies under theirs).", &["pipeline", "sink", "topic"]),
            events_null_key: r.counter("outbox_relay_events_null_key_total", "Events published with a null key because the aggregate id was NULL.", &["pipeline"]),
            events_dead_lettered: r.counter("outbox_relay_events_dead_lettered_total", "Events published to the dead-letter destination instead of their own (not routable, or refused by the sink), by reason.", &["pipeline", "reason"]),
            messages_skipped: r.counter("outbox_relay_messages_skipped_total", "Changes passed over, by kind: other tables, updates and deletes, non-transactional messages (message_non_transactional), transactions already checkpointed in exactly-once mode (checkpointed).", &["pipeline", "kind"]),
            transactions: r.counter("outbox_relay_transactions_total", "Committed transactions received.", &["pipeline"]),
            delivery_failures: r.counter("outbox_relay_delivery_failures_total", "Records the sink did not acknowledge, by topic or destination and whether publishing again may succeed.", &["pipeline", "sink", "topic", "retryable"]),
            status_updates: r.counter("outbox_relay_status_updates_sent_total", "Standby status updates sent to the walsender.", &["pipeline"]),
            reconnects: r.counter("outbox_relay_reconnects_total", "Pipeline sessions restarted after a transient error; a standby's retries while another relay holds the slot are not counted.", &["pipeline"]),
            consecutive_failed_sessions: r.gauge("outbox_relay_consecutive_failed_sessions", "Sessions in a row that ended in a retryable error without progress (no flush LSN confirmed, no polling batch marked); 0 once a session makes progress."),
            kafka_transactions: r.counter("outbox_relay_kafka_transactions_total", "Exactly-once mode: Kafka transactions ended, by outcome (committed, aborted).", &["pipeline", "outcome"]),
            confirmed_flush_lsn: r.gauge("outbox_relay_confirmed_flush_lsn_bytes", "Flush LSN last sent to PostgreSQL, as a WAL byte position."),
            in_flight_events: r.labelled_gauge("outbox_relay_in_flight_events", "Records handed to the sink and not yet acknowledged (with those an ended session left in a shared Kafka producer).", &["pipeline", "sink"]),
            in_flight_bytes: r.labelled_gauge("outbox_relay_in_flight_bytes", "Bytes of key, value and headers of in-flight records.", &["pipeline", "sink"]),
            streaming: r.gauge("outbox_relay_pipeline_streaming", "1 while the pipeline's session streams (states streaming, catching_up and degraded by waiting records), else 0."),
            pipeline_state: r.labelled_gauge("outbox_relay_pipeline_state", "1 for the pipeline's current state (starting, streaming, catching_up, degraded, standing_by, draining, failed, stopped), 0 for the others.", &["pipeline", "state"]),
            lag_bytes: r.gauge("outbox_relay_replication_lag_bytes", "Bytes of WAL between the server's end of WAL (the replayed end on a standby) and the slot's confirmed flush LSN, read every 10 s; 0 when the slot is missing."),
            oldest_unacked_age: r.float_gauge("outbox_relay_oldest_unacked_event_age_seconds", "Seconds since the oldest record still awaiting the sink's acknowledgement was handed to it; 0 when none.", &["pipeline", "sink"]),
            delivery_latency: r.histogram("outbox_relay_delivery_latency_seconds", "From handing a record to the sink to its acknowledgement.", &["pipeline", "sink"]),
            commit_to_ack: r.histogram("outbox_relay_commit_to_ack_latency_seconds", "From the PostgreSQL commit (polling: the row's created_at) to the sink's acknowledgement (wall clocks of both hosts).", &["pipeline", "sink"]),
            slot_wal_status: {
                r.section("The slot");
                r.labelled_gauge("outbox_relay_slot_wal_status", "1 for the slot's current wal_status (reserved, extended, unreserved, lost), 0 for the others; refreshed every 10 s.", &["pipeline", "status"])
            },
            slot_safe_wal_size: r.gauge("outbox_relay_slot_safe_wal_size_bytes", "Bytes of WAL that can still be written before the slot is at risk of being lost (pg_replication_slots.safe_wal_size); absent when max_slot_wal_keep_size is unlimited; refreshed every 10 s."),
            slot_invalidated: r.labelled_gauge("outbox_relay_slot_invalidated", "1 while the slot is invalidated (wal_status lost), labelled with why: invalidation_reason (wal_removed, rows_removed, wal_level_insufficient, idle_timeout) or conflict (PostgreSQL 16); absent otherwise; refreshed every 10 s.", &["pipeline", "reason"]),
            slot_failover: r.gauge("outbox_relay_slot_failover", "1 if the slot is a failover slot (PostgreSQL 17+), which a standby with sync_replication_slots keeps in sync, else 0; refreshed every 10 s."),
            standby_slots_stalled: r.gauge("outbox_relay_standby_slots_stalled", "1 while the slot is a failover slot and synchronized_standby_slots on the server names a physical slot that is missing, inactive, invalidated or not physical, so the walsender sends no change; else 0; refreshed every 10 s."),
            polling: {
                r.section("Polling source");
                PollingMetricVecs {
                pending_rows: r.gauge("outbox_relay_pending_rows", "Polling: outbox rows waiting to be published (including those waiting for a retry); refreshed every stats_interval_ms (5 s)."),
                oldest_pending_age: r.float_gauge("outbox_relay_oldest_pending_age_seconds", "Polling: age of the oldest pending outbox row in seconds (0 when none); refreshed every stats_interval_ms.", &["pipeline"]),
                failed_rows: r.gauge("outbox_relay_failed_rows", "Polling: outbox rows marked FAILED (not retried; need an operator); refreshed every stats_interval_ms."),
                events_failed: r.counter("outbox_relay_events_failed_total", "Polling: events this relay marked FAILED, by whether the last error was retryable.", &["pipeline", "retryable"]),
                polls: r.counter("outbox_relay_polls_total", "Polling: poll cycles run.", &["pipeline"]),
                rows_purged: r.counter("outbox_relay_rows_purged_total", "Polling: published rows deleted by the retention purge.", &["pipeline"]),
            }},
            health: Arc::default(),
            topic_labels: Arc::default(),
            registry: r.registry.clone(),
            catalog: Arc::default(),
        };
        r.section("Process");
        let build_info = r.labelled_gauge("outbox_relay_build_info", "1, labelled with the relay's version and the commit it was built from (unknown when built outside a git checkout).", &["version", "commit"]);
        metrics.catalog = r.catalog.into();
        build_info
            .with_label_values(&[crate::VERSION, crate::COMMIT])
            .set(1);
        metrics
    }

    /// What each metric is (name, type, labels, HELP text), in the order registered: the
    /// metrics reference page is generated from it.
    pub fn catalog(&self) -> &[MetricInfo] {
        &self.catalog
    }

    /// Handles labelled for one pipeline publishing to Kafka.
    pub fn pipeline(&self, pipeline: &str) -> PipelineMetrics {
        self.pipeline_with_sink(pipeline, "kafka")
    }

    /// Handles labelled for one pipeline; the delivery metrics also with its sink's kind.
    pub fn pipeline_with_sink(&self, pipeline: &str, sink: &'static str) -> PipelineMetrics {
        let with_sink = [pipeline, sink];
        PipelineMetrics {
            events_decoded: self.events_decoded.with_label_values(&[pipeline]),
            events_published: self.events_published.clone(),
            events_null_key: self.events_null_key.with_label_values(&[pipeline]),
            events_dead_lettered: self.events_dead_lettered.clone(),
            messages_skipped: self.messages_skipped.clone(),
            transactions: self.transactions.with_label_values(&[pipeline]),
            delivery_failures: self.delivery_failures.clone(),
            status_updates: self.status_updates.with_label_values(&[pipeline]),
            reconnects: self.reconnects.with_label_values(&[pipeline]),
            consecutive_failed_sessions: self
                .consecutive_failed_sessions
                .with_label_values(&[pipeline]),
            kafka_transactions: self.kafka_transactions.clone(),
            confirmed_flush_lsn: self.confirmed_flush_lsn.with_label_values(&[pipeline]),
            in_flight_events: self.in_flight_events.with_label_values(&with_sink),
            in_flight_bytes: self.in_flight_bytes.with_label_values(&with_sink),
            streaming: self.streaming.with_label_values(&[pipeline]),
            behind: Arc::default(),
            waiting: Arc::default(),
            max_event_wait: Duration::from_secs(crate::config::DEFAULT_MAX_EVENT_WAIT_SECS),
            lag_bytes: self.lag_bytes.with_label_values(&[pipeline]),
            oldest_unacked_age: self.oldest_unacked_age.with_label_values(&with_sink),
            slot_wal_status: self.slot_wal_status.clone(),
            slot_safe_wal_size: self.slot_safe_wal_size.clone(),
            slot_invalidated: self.slot_invalidated.clone(),
            slot_failover: self.slot_failover.with_label_values(&[pipeline]),
            standby_slots_stalled: self.standby_slots_stalled.with_label_values(&[pipeline]),
            delivery_latency: self.delivery_latency.with_label_values(&with_sink),
            commit_to_ack: self.commit_to_ack.with_label_values(&with_sink),
            polling: PollingMetrics {
                pending_rows: self.polling.pending_rows.with_label_values(&[pipeline]),
                oldest_pending_age: self
                    .polling
                    .oldest_pending_age
                    .with_label_values(&[pipeline]),
                failed_rows: self.polling.failed_rows.with_label_values(&[pipeline]),
                events_failed: self.polling.events_failed.clone(),
                polls: self.polling.polls.with_label_values(&[pipeline]),
                rows_purged: self.polling.rows_purged.with_label_values(&[pipeline]),
            },
            health: self.health.clone(),
            topics: Arc::clone(
                self.topic_labels
                    .lock()
                    .expect("topic labels")
                    .entry(pipeline.to_owned())
                    .or_default(),
            ),
            pipeline: pipeline.to_owned(),
            sink,
        }
    }

    /// Every pipeline's state, by name, as of now.
    pub fn health(&self) -> BTreeMap<String, PipelineHealth> {
        let now = now_ms();
        self.health
            .lock()
            .expect("health lock")
            .iter()
            .map(|(name, entry)| (name.clone(), entry.derive(now)))
            .collect()
    }

    /// The Prometheus text exposition of every metric, `outbox_relay_pipeline_state` as of
    /// now.
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        for (pipeline, health) in self.health() {
            for state in PipelineState::ALL {
                self.pipeline_state
                    .with_label_values(&[pipeline.as_str(), state.as_str()])
                    .set(i64::from(state == health.state));
            }
        }
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}

/// A pipeline's reported state with the live measures its shown state is derived from.
struct HealthEntry {
    reported: Reported,
    oldest_unacked_age: Gauge,
    behind: Arc<Behind>,
    waiting: Arc<Mutex<Option<String>>>,
}

impl HealthEntry {
    fn derive(&self, now_ms: i64) -> PipelineHealth {
        state::derive(
            &self.reported,
            self.oldest_unacked_age.get(),
            self.waiting.lock().expect("waiting lock").as_deref(),
            &self.behind,
            now_ms,
        )
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One pipeline's metric handles.
#[derive(Clone)]
pub struct PipelineMetrics {
    pipeline: String,
    /// The sink's kind, the `sink` label of the delivery metrics.
    sink: &'static str,
    pub events_decoded: IntCounter,
    events_published: IntCounterVec,
    pub events_null_key: IntCounter,
    events_dead_lettered: IntCounterVec,
    messages_skipped: IntCounterVec,
    pub transactions: IntCounter,
    delivery_failures: IntCounterVec,
    pub status_updates: IntCounter,
    pub reconnects: IntCounter,
    consecutive_failed_sessions: IntGauge,
    kafka_transactions: IntCounterVec,
    pub confirmed_flush_lsn: IntGauge,
    pub in_flight_events: IntGauge,
    pub in_flight_bytes: IntGauge,
    streaming: IntGauge,
    /// How old the commits read are, for the `catching_up` state.
    behind: Arc<Behind>,
    /// Why records wait before the sink takes them, for the `degraded` state.
    waiting: Arc<Mutex<Option<String>>>,
    /// `max_event_wait_secs`: a longer wait for an acknowledgement is `degraded`.
    max_event_wait: Duration,
    pub lag_bytes: IntGauge,
    /// Seconds; 0 when nothing is in flight.
    pub oldest_unacked_age: Gauge,
    slot_wal_status: IntGaugeVec,
    slot_safe_wal_size: IntGaugeVec,
    slot_invalidated: IntGaugeVec,
    slot_failover: IntGauge,
    standby_slots_stalled: IntGauge,
    pub delivery_latency: Histogram,
    pub commit_to_ack: Histogram,
    /// Used by the polling source only.
    pub polling: PollingMetrics,
    health: Arc<Mutex<BTreeMap<String, HealthEntry>>>,
    topics: Arc<topics::TopicLabels>,
}

/// One pipeline's polling-source metric handles.
#[derive(Clone)]
pub struct PollingMetrics {
    pub pending_rows: IntGauge,
    pub oldest_pending_age: Gauge,
    pub failed_rows: IntGauge,
    events_failed: IntCounterVec,
    pub polls: IntCounter,
    pub rows_purged: IntCounter,
}

impl PollingMetrics {
    /// Counts an event marked FAILED; `pipeline` labels it.
    pub fn failed(&self, pipeline: &str, retryable: bool) {
        let label = if retryable { "true" } else { "false" };
        self.events_failed
            .with_label_values(&[pipeline, label])
            .inc();
    }
}

impl PipelineMetrics {
    /// The same handles, with `max_event_wait_secs` for the `degraded` state.
    pub fn with_max_event_wait(mut self, max_event_wait: Duration) -> Self {
        self.max_event_wait = max_event_wait;
        self
    }

    /// Records the state the supervisor or the session reports and why (the error, the
    /// relay that holds the slot). A `degraded`, `failed` or `draining` reason is an error:
    /// it becomes `last_error`, which stays until a session makes progress.
    pub fn set_state(&self, state: PipelineState, reason: Option<String>) {
        self.streaming
            .set(i64::from(state == PipelineState::Streaming));
        let mut health = self.health.lock().expect("health lock");
        let previous = health.get(&self.pipeline).map(|e| &e.reported);
        let failed_sessions = previous.map_or(0, |r| r.consecutive_failed_sessions);
        let is_error = matches!(
            state,
            PipelineState::Degraded | PipelineState::Failed | PipelineState::Draining
        );
        let took_over = previous.is_some_and(|r| r.state == PipelineState::StandingBy);
        let last_error = match (&reason, previous) {
            (Some(reason), _) if is_error => Some(reason.clone()),
            // A takeover from standing by with no failed session behind it: the last error is
            // over. Otherwise it stays until the session makes progress
            // ([`Self::set_failed_sessions`] with 0): a pipeline that streams again after a
            // failure has not shown yet that the failure is gone.
            _ if state == PipelineState::Streaming && took_over && failed_sessions == 0 => None,
            (_, previous) => previous.and_then(|r| r.last_error.clone()),
        };
        let entry = HealthEntry {
            reported: Reported {
                state,
                sink: self.sink,
                since_unix_ms: now_ms() as u64,
                reason,
                last_error,
                consecutive_failed_sessions: failed_sessions,
                max_event_wait: self.max_event_wait,
            },
            oldest_unacked_age: self.oldest_unacked_age.clone(),
            behind: Arc::clone(&self.behind),
            waiting: Arc::clone(&self.waiting),
        };
        health.insert(self.pipeline.clone(), entry);
    }

    /// Records how many sessions in a row ended in a retryable error without progress, for
    /// `outbox_relay_consecutive_failed_sessions` and `/readyz`; 0 (progress) while streaming
    /// ends `last_error`.
    pub fn set_failed_sessions(&self, sessions: u64) {
        self.consecutive_failed_sessions
            .set(i64::try_from(sessions).unwrap_or(i64::MAX));
        let mut health = self.health.lock().expect("health lock");
        if let Some(e) = health.get_mut(&self.pipeline) {
            e.reported.consecutive_failed_sessions = sessions;
            if sessions == 0 && e.reported.state == PipelineState::Streaming {
                e.reported.last_error = None;
            }
        }
    }

    /// Records that an event committed at `commit_ms` (Unix epoch ms) was read, for the
    /// `catching_up` state. Lock-free: called for every event.
    pub fn read_event(&self, commit_ms: i64) {
        self.behind.read(commit_ms, now_ms());
    }

    /// Records why records wait before the sink takes them (`None`: they do not), for the
    /// `degraded` state.
    pub fn set_waiting(&self, reason: Option<String>) {
        *self.waiting.lock().expect("waiting lock") = reason;
    }

    /// The pipeline's state as of now, as `/readyz` shows it.
    pub fn state(&self) -> Option<PipelineHealth> {
        let health = self.health.lock().expect("health lock");
        health.get(&self.pipeline).map(|e| e.derive(now_ms()))
    }

    /// Counts a pgoutput message of `kind` that is not an outbox insert.
    pub fn skipped(&self, kind: &str) {
        self.messages_skipped
            .with_label_values(&[&self.pipeline, kind])
            .inc();
    }

    /// Counts an event sent to the dead-letter topic; `reason` is low-cardinality
    /// ([`crate::router::RouteError::reason_label`]).
    pub fn dead_lettered(&self, reason: &str) {
        self.events_dead_lettered
            .with_label_values(&[&self.pipeline, reason])
            .inc();
    }

    /// The pipeline's name, as in the labels.
    pub fn name(&self) -> &str {
        &self.pipeline
    }

    /// Records the slot's `wal_status` (one of [`WAL_STATUSES`] gets 1, the others 0; an unknown
    /// or NULL status sets all to 0) and `safe_wal_size` in bytes (`None`, no
    /// `max_slot_wal_keep_size` limit: the series is removed).
    pub fn set_slot_wal(&self, wal_status: Option<&str>, safe_wal_size: Option<i64>) {
        for status in WAL_STATUSES {
            self.slot_wal_status
                .with_label_values(&[&self.pipeline, status])
                .set(i64::from(wal_status == Some(status)));
        }
        match safe_wal_size {
            Some(bytes) => self
                .slot_safe_wal_size
                .with_label_values(&[&self.pipeline])
                .set(bytes),
            None => {
                // Absent, not a sentinel: there is no limit to approach.
                let _ = self
                    .slot_safe_wal_size
                    .remove_label_values(&[&self.pipeline]);
            }
        }
    }

    /// Records why the slot is invalidated (`reason`, e.g. `wal_removed`, gets 1); `None`:
    /// not invalidated, the series are removed.
    pub fn set_slot_invalidation(&self, reason: Option<&str>) {
        use prometheus::core::Collector;
        for metric in self.slot_invalidated.collect() {
            for series in metric.get_metric() {
                let labels = series.get_label();
                let of_this = labels
                    .iter()
                    .any(|l| l.name() == "pipeline" && l.value() == self.pipeline);
                let other_reason = labels
                    .iter()
                    .find(|l| l.name() == "reason")
                    .map(|l| l.value())
                    .filter(|r| Some(*r) != reason);
                if let (true, Some(other)) = (of_this, other_reason) {
                    let _ = self
                        .slot_invalidated
                        .remove_label_values(&[&self.pipeline, other]);
                }
            }
        }
        if let Some(reason) = reason {
            self.slot_invalidated
                .with_label_values(&[&self.pipeline, reason])
                .set(1);
        }
    }

    /// Records whether the slot is a failover slot.
    pub fn set_slot_failover(&self, failover: bool) {
        self.slot_failover.set(i64::from(failover));
    }

    /// Records whether `synchronized_standby_slots` holds the failover slot's walsender back.
    pub fn set_standby_slots_stalled(&self, stalled: bool) {
        self.standby_slots_stalled.set(i64::from(stalled));
    }

    /// Counts a record the sink acknowledged on `topic` (its destination).
    pub fn published(&self, topic: &str) {
        let topic = self.topics.label(topic, &self.pipeline);
        self.events_published
            .with_label_values(&[&self.pipeline, self.sink, topic])
            .inc();
    }

    /// Counts a Kafka transaction that ended with `outcome` (`committed` or `aborted`).
    pub fn kafka_transaction(&self, outcome: &str) {
        self.kafka_transactions
            .with_label_values(&[&self.pipeline, outcome])
            .inc();
    }

    /// Counts a record the sink did not acknowledge on `topic` (its destination).
    pub fn delivery_failed(&self, topic: &str, retryable: bool) {
        let label = if retryable { "true" } else { "false" };
        let topic = self.topics.label(topic, &self.pipeline);
        self.delivery_failures
            .with_label_values(&[&self.pipeline, self.sink, topic, label])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_error_stays_after_a_restart_until_the_session_makes_progress() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("orders");
        let last_error = || metrics.health()["orders"].last_error.clone();
        p.set_state(
            PipelineState::Failed,
            Some("password authentication failed".into()),
        );
        p.set_state(PipelineState::Starting, None);
        p.set_state(PipelineState::Streaming, None);
        assert_eq!(
            last_error().as_deref(),
            Some("password authentication failed")
        );
        p.set_failed_sessions(0);
        assert_eq!(last_error(), None, "progress ends it");
        // A takeover from standing by ends it too.
        p.set_state(PipelineState::Degraded, Some("broker down".into()));
        p.set_failed_sessions(0);
        p.set_state(
            PipelineState::StandingBy,
            Some("another relay holds the slot".into()),
        );
        p.set_state(PipelineState::Streaming, None);
        assert_eq!(last_error(), None);
    }

    #[test]
    fn renders_labelled_metrics() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("orders");
        for _ in 0..3 {
            p.published("Order.events");
        }
        p.skipped("update");
        let text = metrics.render();
        assert!(
            text.contains(
                "outbox_relay_events_published_total{pipeline=\"orders\",sink=\"kafka\",topic=\"Order.events\"} 3"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "outbox_relay_messages_skipped_total{kind=\"update\",pipeline=\"orders\"} 1"
            ),
            "{text}"
        );
    }

    /// Destinations come from rows: 70,000 aggregate types made as many series of each
    /// delivery metric (141 MB, an 8.3 MB scrape). Past the limit they share `topic="(other)"`,
    /// for every session of the pipeline (a new handle keeps the names already given).
    #[test]
    fn the_topic_label_is_bounded_per_pipeline() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("orders");
        for n in 0..MAX_TOPIC_LABELS + 100 {
            p.published(&format!("T{n}.events"));
        }
        let again = metrics.pipeline("orders");
        again.published("Tnew.events");
        again.delivery_failed("Tnewer.events", true);
        metrics.pipeline("billing").published("B.events");
        let text = metrics.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("outbox_relay_events_published_total{pipeline=\"orders\""))
            .count();
        assert_eq!(
            series,
            MAX_TOPIC_LABELS + 1,
            "published series of one pipeline"
        );
        assert!(
            text.contains("outbox_relay_events_published_total{pipeline=\"orders\",sink=\"kafka\",topic=\"(other)\"} 101"),
            "{text}"
        );
        assert!(
            text.contains("topic=\"B.events\""),
            "another pipeline has its own"
        );
        assert!(text.contains("outbox_relay_delivery_failures_total{pipeline=\"orders\",retryable=\"true\",sink=\"kafka\",topic=\"(other)\"} 1"),
            "{text}");
    }

    #[test]
    fn slot_invalidation_names_one_reason_and_disappears_when_cleared() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("orders");
        let other = metrics.pipeline("billing");
        other.set_slot_invalidation(Some("wal_removed"));
        p.set_slot_invalidation(Some("rows_removed"));
        p.set_slot_invalidation(Some("idle_timeout"));
        p.set_standby_slots_stalled(true);
        p.set_slot_failover(true);
        let text = metrics.render();
        for line in [
            "outbox_relay_slot_invalidated{pipeline=\"orders\",reason=\"idle_timeout\"} 1",
            "outbox_relay_slot_invalidated{pipeline=\"billing\",reason=\"wal_removed\"} 1",
            "outbox_relay_standby_slots_stalled{pipeline=\"orders\"} 1",
            "outbox_relay_slot_failover{pipeline=\"orders\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        assert!(!text.contains("reason=\"rows_removed\""), "{text}");
        p.set_slot_invalidation(None);
        p.set_standby_slots_stalled(false);
        let text = metrics.render();
        assert!(!text.contains("pipeline=\"orders\",reason="), "{text}");
        assert!(
            text.contains("reason=\"wal_removed\""),
            "other pipelines stay: {text}"
        );
        assert!(
            text.contains("outbox_relay_standby_slots_stalled{pipeline=\"orders\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn slot_wal_status_is_one_hot_and_safe_wal_size_absent_without_a_limit() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("orders");
        p.set_slot_wal(Some("extended"), Some(1_048_576));
        let text = metrics.render();
        for (status, value) in [
            ("reserved", 0),
            ("extended", 1),
            ("unreserved", 0),
            ("lost", 0),
        ] {
            let line = format!(
                "outbox_relay_slot_wal_status{{pipeline=\"orders\",status=\"{status}\"}} {value}"
            );
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
        assert!(
            text.contains("outbox_relay_slot_safe_wal_size_bytes{pipeline=\"orders\"} 1048576"),
            "{text}"
        );
        p.set_slot_wal(Some("reserved"), None);
        let text = metrics.render();
        assert!(
            text.contains(
                "outbox_relay_slot_wal_status{pipeline=\"orders\",status=\"reserved\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "outbox_relay_slot_wal_status{pipeline=\"orders\",status=\"extended\"} 0"
            ),
            "{text}"
        );
        assert!(
            !text.contains("outbox_relay_slot_safe_wal_size_bytes{"),
            "{text}"
        );
    }
}
