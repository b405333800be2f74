//! outbox-relay: publishes transactional outbox rows from PostgreSQL to Kafka (or Redis
//! Streams, NATS JetStream, RabbitMQ, an HTTP endpoint) by tailing the write-ahead log through a
//! logical replication slot (pgoutput), or by polling the outbox table.
//!
//! ```text
//! PostgreSQL walsender
//!   │  CopyBoth: START_REPLICATION SLOT s LOGICAL 0/0 (proto_version '1', publication_names 'p', messages 'true')
//!   ▼
//! source::replication   connection, auth, keepalives, standby status updates
//!   ▼ XLogData bytes
//! source::pgoutput      sans-IO decoder: bytes -> Begin/Commit/Relation/Insert/...
//!   ▼
//! source::outbox        relation cache; Insert on the outbox table -> OutboxEvent
//!   ▼
//! source::logical       the above as a Source: Begin / Event / Commit / Idle items
//!   ▼                   (or source::polling: the outbox table read with SKIP LOCKED)
//! session               the loop: one select!, route-or-dead-letter, delivery metrics
//!   ▼
//! router                topic <aggregate_type>.events, key, value, headers
//!   ▼
//! sink::kafka           rdkafka idempotent producer; delivery reports
//!                       (or sink::ordered: Redis, NATS, RabbitMQ, HTTP, a key at a time)
//!   ▼                   (exactly_once: begin / commit with checkpoint / abort)
//! ack                   AckTracker: transactions in commit order -> flush LSN
//!   └──────────────────► Source::confirm: the flush/apply LSN to the walsender
//! ```
//!
//! The flush LSN sent to PostgreSQL never passes the commit of a transaction with an event
//! the sink has not acknowledged, so a crash or broker failure at any point loses nothing; the
//! price is that events after the last confirmed LSN may be published again.
//!
//! # Layout
//! - [`config`]: the pipeline configuration as plain data, at the bottom of the dependency
//!   graph (it imports no other module): one serde schema for the flags, the config file, its
//!   environment overrides and `import-debezium`'s output; [`config::secret_file`] reads the
//!   files that hold secrets, `config::summary` makes the start's one-line settings (secrets
//!   hidden), `config::reference` the configuration reference from the schema.
//! - [`validation`]: every start-up check of a pipeline (its own fields, the router's options,
//!   the source URL), run once before any command starts.
//! - [`source`]: the [`source::Source`] trait and its two implementations:
//!   [`source::logical`] (log tailing: replication connection, pgoutput decoder, outbox
//!   mapping, slot checks, [`source::slot_record`]: the record that keeps a lost slot from
//!   being re-created silently, [`source::slot::teardown`]: what `teardown` removes) and [`source::polling`] (`source_kind = "polling"`: the outbox
//!   table read with `FOR UPDATE SKIP LOCKED` where logical replication is not available);
//!   [`source::conninfo`] reads `source_url` as libpq does, [`source::target`] picks the
//!   host of a multi-host URL by `target_session_attrs`, for both connections, and
//!   [`source::tls`] makes their rustls configuration from `sslmode` and its files, and
//!   [`source::auth`] decides which authentication requests a server may make of them
//!   (`require_auth`, `channel_binding`, no cleartext password to an unverified server);
//!   [`source::coverage`] checks that the publication still covers the outbox, which idle
//!   progress waits for.
//! - [`session`]: the session loop, generic over source and sink; no IO of its own. Its
//!   tests include a deterministic simulation (`session/simulation/`, test builds only: the
//!   Kafka sink's and the ordered sink's, `simulation/publisher.rs`) and
//!   `session::mutation`, the deliberate defects they switch on to show that they catch them
//!   (a constant off outside test builds).
//! - [`supervisor`]: runs a pipeline's sessions for every source kind: states and readiness,
//!   backoff reset only by progress, standby while another relay holds the slot, recovery
//!   decided from [`error::Recovery`], a stop during set-up that drops the session.
//! - [`router`]: events to records, each destination checked by the sink kind's rules; built
//!   from a pipeline's config, refusing bad routing options with their field paths
//!   (`router::problems`); `router::render` renders column values as Debezium's converters
//!   do; `router::dead_letter` makes the dead-letter copy, always deliverable whatever the row
//!   held; `router::cloudevents` renders CloudEvents in the sink's protocol binding;
//!   `router::trace` the W3C trace context headers from outbox columns.
//! - [`sink`]: the [`sink::Sink`] trait, the Kafka producer ([`sink::kafka::SharedProducers`]:
//!   one producer for the pipelines with the same settings; [`sink::kafka::topics`]: a record
//!   for a missing topic waits, or the topic is created; [`sink::kafka::log`]: librdkafka's
//!   lines told once; [`sink::producer`]: the rdkafka
//!   producer, its delivery thread and the queue its reports wake a session through), and the
//!   other sink kinds ([`sink::redis`], [`sink::nats`], [`sink::rabbitmq`], [`sink::http`]) as
//!   [`sink::ordered::Publisher`]s behind [`sink::ordered::OrderedSink`] (per-key order,
//!   retries, the delivery timeout); [`sink::AnySink`] is the one a pipeline chose.
//! - [`exactly_once`]: the transactional capability of a sink, the checkpoint (with its
//!   origin: system identifier, timeline, slot) and its read-back, [`exactly_once::batch`]
//!   (several PostgreSQL transactions per Kafka transaction), and the redo that dead-letters
//!   a record Kafka refused inside a transaction.
//! - [`ack`]: the ack tracker that yields the flush LSN.
//! - [`pipeline`]: one source database end to end: builds the log-tailing source and the
//!   sink of each session, and hands both source kinds to the supervisor; `pipeline::slot_watch`
//!   reads the slot's metrics from the server the sessions reached, and runs the publication
//!   checks there.
//! - [`cli`]: the command line: its flags, what each command does, and the generated CLI
//!   reference; `main.rs` only parses, sets up logging and runs it.
//! - [`check`]: the `check` and `status` commands; [`check::failover`] judges failover slots
//!   and the standby that keeps them, [`check::standby`] a pipeline that decodes on a standby,
//!   `check::record` the slot record's table and grants, `check::sink` the sink (reachable,
//!   authenticated, what its kind can tell about the destinations).
//! - [`import`]: `import-debezium`, a Debezium outbox connector's config (or a Debezium
//!   Server's `application.properties`) as a pipeline entry (`import::tracing_options`: Debezium's
//!   tracing options).
//! - [`metrics`] and [`health`]: Prometheus metrics (registered with their descriptions:
//!   `metrics::catalog`; the `topic` label bounded:
//!   `metrics::topics`; the pipeline states, derived when read: `metrics::state`), `/metrics`,
//!   `/healthz`, `/readyz`, with limits on connections.
//! - [`logging`]: text logs with the control characters of rows and servers escaped.
//! - [`probe`]: the `probe` command, an HTTP GET for container health checks.
//! - [`shutdown`], [`error`], [`lsn`].

pub mod ack;
pub mod check;
pub mod cli;
pub mod config;
pub mod error;
pub mod exactly_once;
pub mod health;
pub mod import;
pub mod logging;
pub mod lsn;
pub mod metrics;
pub mod pipeline;
pub mod probe;
pub mod router;
pub mod session;
pub mod shutdown;
pub mod sink;
pub mod source;
pub mod supervisor;
pub mod validation;

use std::future::Future;
use std::net::SocketAddr;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The relay's version (Cargo.toml).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit the relay was built from (12 hex digits), or `unknown` (`src/build.rs`).
pub const COMMIT: &str = env!("OUTBOX_RELAY_COMMIT");

pub use config::file::OnPipelineFailure;
pub use config::PipelineConfig;
pub use error::Error;
pub use metrics::Metrics;

/// Runs every pipeline until `shutdown` completes, then drains them (in-flight deliveries up
/// to each pipeline's `shutdown_timeout_secs`, final status update) and returns. Serves
/// `/metrics`, `/healthz` and `/readyz` on `metrics_listen` when given, until every pipeline
/// has ended (so through the drain).
///
/// The pipelines must have passed [`validation::pipelines`] (or [`validation::pipeline`]) at
/// start; `run` checks nothing again. A pipeline stopped by a permanent error stops the others
/// (they drain) with [`OnPipelineFailure::Exit`], or starts again after a long backoff with
/// [`OnPipelineFailure::Retry`]; `run` returns the first such error once all pipelines have
/// ended.
pub async fn run(
    pipelines: Vec<PipelineConfig>,
    metrics: Metrics,
    metrics_listen: Option<SocketAddr>,
    on_failure: OnPipelineFailure,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let token = CancellationToken::new();
    // The endpoint outlives the pipelines' drain (its own token), so the drain can be watched.
    let server_token = CancellationToken::new();
    let server = match metrics_listen {
        Some(listen) => {
            let listener = health::bind(listen)
                .await
                .map_err(|source| Error::Listen { listen, source })?;
            Some(tokio::spawn(health::serve(
                listener,
                metrics.clone(),
                server_token.clone(),
            )))
        }
        None => None,
    };
    let mut tasks = JoinSet::new();
    // At-least-once pipelines with the same Kafka settings share a producer
    // (docs/how-to/several-databases.md: its threads and wakeups were most of an idle process's cost).
    let producers = sink::kafka::SharedProducers::for_pipelines(&pipelines);
    for pipeline in pipelines {
        let metrics = metrics
            .pipeline_with_sink(&pipeline.name, pipeline.sink.kind())
            .with_max_event_wait(pipeline.max_event_wait());
        tasks.spawn(pipeline::run(
            pipeline,
            metrics,
            producers.clone(),
            token.clone(),
            on_failure,
        ));
    }
    let mut first_error = None;
    let mut signalled = false;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            // Also after a failed pipeline cancelled the others: a signal during that drain
            // still arms what follows one (the second signal's exit).
            _ = &mut shutdown, if !signalled => {
                signalled = true;
                token.cancel();
            }
            joined = tasks.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => {
                    if !token.is_cancelled() {
                        tracing::error!("a pipeline failed and on_pipeline_failure = \"exit\": draining the other pipelines, then exiting");
                        token.cancel();
                    }
                    first_error.get_or_insert(e);
                }
                Some(Err(join_error)) => std::panic::resume_unwind(join_error.into_panic()),
            },
        }
    }
    token.cancel();
    server_token.cancel();
    if let Some(server) = server {
        match server.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "metrics endpoint failed"),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            _ => {}
        }
    }
    first_error.map_or(Ok(()), Err)
}
