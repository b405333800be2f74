//! Prometheus metrics, defined once here. Names follow `outbox_relay_<what>_<unit>[_total]`;
//! labels are low-cardinality (pipeline, message kind), never event ids.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};
use serde::Serialize;

/// All metrics of the process, registered in one [`Registry`].
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    events_published: IntCounterVec,
    events_null_key: IntCounterVec,
    events_dead_lettered: IntCounterVec,
    messages_skipped: IntCounterVec,
    transactions: IntCounterVec,
    delivery_failures: IntCounterVec,
    status_updates: IntCounterVec,
    reconnects: IntCounterVec,
    kafka_transactions: IntCounterVec,
    confirmed_flush_lsn: IntGaugeVec,
    in_flight_events: IntGaugeVec,
    in_flight_bytes: IntGaugeVec,
    streaming: IntGaugeVec,
    lag_bytes: IntGaugeVec,
    delivery_latency: HistogramVec,
    commit_to_ack: HistogramVec,
    health: Arc<Mutex<BTreeMap<String, PipelineHealth>>>,
}

/// Seconds: 1 ms to 60 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

fn histogram(registry: &Registry, name: &str, help: &str) -> HistogramVec {
    let metric = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
        &["pipeline"],
    )
    .expect("valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("metric registered once");
    metric
}

/// Where a pipeline is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PipelineState {
    Connecting,
    Streaming,
    /// Waiting to reconnect after a transient error.
    Reconnecting,
    /// Stopped by an error that retrying cannot fix.
    Failed,
    Stopped,
}

/// A pipeline's state as `/readyz` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineHealth {
    pub state: PipelineState,
    /// When the pipeline entered this state, Unix epoch ms.
    pub since_unix_ms: u64,
    pub last_error: Option<String>,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("metric registered once");
    metric
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), &["pipeline"]).expect("valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("metric registered once");
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        Metrics {
            events_published: counter(&r, "outbox_relay_events_published_total", "Events acknowledged by Kafka.", &["pipeline"]),
            events_null_key: counter(&r, "outbox_relay_events_null_key_total", "Events published with a null key because the aggregate id was NULL.", &["pipeline"]),
            events_dead_lettered: counter(&r, "outbox_relay_events_dead_lettered_total", "Events that could not be routed, sent to the dead-letter topic, by reason.", &["pipeline", "reason"]),
            messages_skipped: counter(&r, "outbox_relay_messages_skipped_total", "pgoutput messages passed over: not an insert into the outbox table.", &["pipeline", "kind"]),
            transactions: counter(&r, "outbox_relay_transactions_total", "Committed transactions received.", &["pipeline"]),
            delivery_failures: counter(&r, "outbox_relay_delivery_failures_total", "Records Kafka did not acknowledge.", &["pipeline", "retryable"]),
            status_updates: counter(&r, "outbox_relay_status_updates_sent_total", "Standby status updates sent to the walsender.", &["pipeline"]),
            reconnects: counter(&r, "outbox_relay_reconnects_total", "Pipeline sessions restarted after a transient error.", &["pipeline"]),
            kafka_transactions: counter(&r, "outbox_relay_kafka_transactions_total", "Exactly-once mode: Kafka transactions ended, by outcome (committed, aborted).", &["pipeline", "outcome"]),
            confirmed_flush_lsn: gauge(&r, "outbox_relay_confirmed_flush_lsn_bytes", "Flush LSN last sent to PostgreSQL, as a WAL byte position."),
            in_flight_events: gauge(&r, "outbox_relay_in_flight_events", "Records sent to Kafka and not yet acknowledged."),
            in_flight_bytes: gauge(&r, "outbox_relay_in_flight_bytes", "Bytes of key, value and headers of in-flight records."),
            streaming: gauge(&r, "outbox_relay_pipeline_streaming", "1 while the pipeline streams from its slot, else 0."),
            lag_bytes: gauge(&r, "outbox_relay_replication_lag_bytes", "Bytes of WAL between the server's end of WAL and the confirmed flush LSN."),
            delivery_latency: histogram(&r, "outbox_relay_delivery_latency_seconds", "From handing a record to the producer to Kafka's acknowledgement."),
            commit_to_ack: histogram(&r, "outbox_relay_commit_to_ack_latency_seconds", "From the PostgreSQL commit to Kafka's acknowledgement (wall clocks of both hosts)."),
            health: Arc::default(),
            registry: r,
        }
    }

    /// Handles labelled for one pipeline.
    pub fn pipeline(&self, pipeline: &str) -> PipelineMetrics {
        PipelineMetrics {
            events_published: self.events_published.with_label_values(&[pipeline]),
            events_null_key: self.events_null_key.with_label_values(&[pipeline]),
            events_dead_lettered: self.events_dead_lettered.clone(),
            messages_skipped: self.messages_skipped.clone(),
            transactions: self.transactions.with_label_values(&[pipeline]),
            delivery_failures: self.delivery_failures.clone(),
            status_updates: self.status_updates.with_label_values(&[pipeline]),
            reconnects: self.reconnects.with_label_values(&[pipeline]),
            kafka_transactions: self.kafka_transactions.clone(),
            confirmed_flush_lsn: self.confirmed_flush_lsn.with_label_values(&[pipeline]),
            in_flight_events: self.in_flight_events.with_label_values(&[pipeline]),
            in_flight_bytes: self.in_flight_bytes.with_label_values(&[pipeline]),
            streaming: self.streaming.with_label_values(&[pipeline]),
            lag_bytes: self.lag_bytes.with_label_values(&[pipeline]),
            delivery_latency: self.delivery_latency.with_label_values(&[pipeline]),
            commit_to_ack: self.commit_to_ack.with_label_values(&[pipeline]),
            health: self.health.clone(),
            pipeline: pipeline.to_owned(),
        }
    }

    /// Every pipeline's state, by name.
    pub fn health(&self) -> BTreeMap<String, PipelineHealth> {
        self.health.lock().expect("health lock").clone()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}

/// One pipeline's metric handles.
#[derive(Clone)]
pub struct PipelineMetrics {
    pipeline: String,
    pub events_published: IntCounter,
    pub events_null_key: IntCounter,
    events_dead_lettered: IntCounterVec,
    messages_skipped: IntCounterVec,
    pub transactions: IntCounter,
    delivery_failures: IntCounterVec,
    pub status_updates: IntCounter,
    pub reconnects: IntCounter,
    kafka_transactions: IntCounterVec,
    pub confirmed_flush_lsn: IntGauge,
    pub in_flight_events: IntGauge,
    pub in_flight_bytes: IntGauge,
    streaming: IntGauge,
    pub lag_bytes: IntGauge,
    pub delivery_latency: Histogram,
    pub commit_to_ack: Histogram,
    health: Arc<Mutex<BTreeMap<String, PipelineHealth>>>,
}

impl PipelineMetrics {
    /// Records the pipeline's state (and the error that led to it) for `/readyz`.
    pub fn set_state(&self, state: PipelineState, error: Option<String>) {
        self.streaming
            .set(i64::from(state == PipelineState::Streaming));
        let since_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut health = self.health.lock().expect("health lock");
        let last_error = error.or_else(|| {
            health
                .get(&self.pipeline)
                .and_then(|h| h.last_error.clone())
        });
        health.insert(
            self.pipeline.clone(),
            PipelineHealth {
                state,
                since_unix_ms,
                last_error,
            },
        );
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

    /// Counts a Kafka transaction that ended with `outcome` (`committed` or `aborted`).
    pub fn kafka_transaction(&self, outcome: &str) {
        self.kafka_transactions
            .with_label_values(&[&self.pipeline, outcome])
            .inc();
    }

    pub fn delivery_failed(&self, retryable: bool) {
        let label = if retryable { "true" } else { "false" };
        self.delivery_failures
            .with_label_values(&[&self.pipeline, label])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_labelled_metrics() {
        let metrics = Metrics::new();
        let p = metrics.pipeline("orders");
        p.events_published.inc_by(3);
        p.skipped("update");
        let text = metrics.render();
        assert!(
            text.contains("outbox_relay_events_published_total{pipeline=\"orders\"} 3"),
            "{text}"
        );
        assert!(
            text.contains(
                "outbox_relay_messages_skipped_total{kind=\"update\",pipeline=\"orders\"} 1"
            ),
            "{text}"
        );
    }
}
