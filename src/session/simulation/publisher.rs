//! A fake server behind the real [`OrderedSink`] (the sink of NATS, RabbitMQ, Redis and HTTP):
//! a [`Publisher`] whose attempts are answered after a random latency, and a thin [`Sink`]
//! around the ordered sink that tells the invariant checks what the session handed over and
//! which outcomes came back.
//!
//! An attempt's fate is drawn when it is made: acknowledged; a retryable error, before the
//! server wrote the record or after (the acknowledgement is lost: the retry writes it again);
//! refused for good (larger than the server's limit, or not routable); no answer at all (the
//! sink's delivery timeout ends it; the server may have written the record). While the server
//! is down (a window of the session) attempts fail as unavailable, and succeed again once it
//! is back. Once the connection broke, every attempt, and every answer still on its way, is a
//! broken connection (`connection_lost`). The server writes a record halfway through the
//! attempt's latency: an attempt dropped before that (the session ended) never arrived.

use std::collections::HashSet;
use std::time::Duration;

use fastrand::Rng;
use futures::future::BoxFuture;
use tokio::time::{sleep, Instant};

use super::wal::DEAD_LETTER_TOPIC;
use super::world::{Faults, Shared, Written};
use crate::ack::EventToken;
use crate::sink::ordered::{OrderedSettings, OrderedSink, PublishError, Publisher};
use crate::sink::{Delivery, InFlight, Record, SendError, Sink};

/// The ordered sink's settings a schedule draws (`hold_on_refusal` follows the session's
/// `on_bad_event`).
#[derive(Clone, Copy, Debug)]
pub(super) struct PublisherSetup {
    pub max_concurrency: usize,
    pub delivery_timeout: Duration,
}

impl PublisherSetup {
    pub fn draw(rng: &mut Rng) -> Self {
        PublisherSetup {
            max_concurrency: rng.usize(1..=4),
            delivery_timeout: Duration::from_millis(rng.u64(300..=5_000)),
        }
    }
}

/// The server's side of the invariants: what it acknowledged, what the sink reported.
#[derive(Debug, Default)]
pub(super) struct Server {
    /// Events whose acknowledgement the sink reported to a session.
    pub acknowledged: HashSet<String>,
    /// This session: the records (event id, destination) the session handed over, and those
    /// the server acknowledged.
    handed_over: HashSet<(String, String)>,
    acknowledged_now: HashSet<(String, String)>,
    /// Attempts waiting for their answer now, and the most at once over the schedule.
    running: usize,
    pub peak_running: usize,
    /// This session's sink holds a key after a refusal (`on_bad_event = "halt"`).
    pub hold_on_refusal: bool,
    pub max_concurrency: usize,
}

impl Server {
    /// A new session: a new client, connected.
    pub fn begin_session(&mut self) {
        self.handed_over.clear();
        self.acknowledged_now.clear();
        self.running = 0;
    }

    /// Draws the server's faults of a session with faults.
    pub fn draw_faults(rng: &mut Rng, faults: &mut Faults) {
        faults.silent_per_mille = if rng.bool() { rng.u16(0..=60) } else { 0 };
        faults.server_down = (rng.u8(0..3) == 0).then(|| {
            let from = Duration::from_millis(rng.u64(0..2_000));
            (from, from + Duration::from_millis(rng.u64(0..4_000)))
        });
        faults.broken_after = (rng.u8(0..4) == 0).then(|| Duration::from_millis(rng.u64(0..2_000)));
    }
}

/// What an attempt meets, drawn when it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Acknowledged,
    Retry { written: bool },
    Refused { too_large: bool },
    Silent { written: bool },
    Unavailable,
    Broken,
}

/// One session's client of the server.
pub(super) struct FakePublisher {
    world: Shared,
}

/// Counts an attempt as running until its future ends or is dropped.
struct Running(Shared);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.lock().server.running -= 1;
    }
}

/// Whether the session's connection has broken by now.
fn broken(faults: &Faults, session_start: Instant) -> bool {
    faults
        .broken_after
        .is_some_and(|after| Instant::now() >= session_start + after)
}

impl Publisher for FakePublisher {
    fn publish(&self, record: &Record) -> BoxFuture<'static, Result<(), PublishError>> {
        let mut w = self.world.lock();
        let id = record.event_id();
        let published = (id.clone(), record.topic.clone());
        if w.server.acknowledged_now.contains(&published) {
            w.violate(format!(
                "event {id} published to {} again after the server acknowledged it",
                record.topic
            ));
        }
        w.server.running += 1;
        w.server.peak_running = w.server.peak_running.max(w.server.running);
        if w.server.running > w.server.max_concurrency {
            let (running, max) = (w.server.running, w.server.max_concurrency);
            w.violate(format!(
                "{running} attempts published at once, max_concurrency = {max}"
            ));
        }
        let running = Running(self.world.clone());
        let faults = w.faults;
        let since = Instant::now() - w.session_start;
        let fate = if broken(&faults, w.session_start) {
            Fate::Broken
        } else if faults
            .server_down
            .is_some_and(|(from, until)| from <= since && since < until)
        {
            Fate::Unavailable
        } else if record.size() > w.setup.broker_max_bytes {
            Fate::Refused { too_large: true }
        } else if w.chance(faults.permanent_per_mille) {
            Fate::Refused { too_large: false }
        } else if w.chance(faults.silent_per_mille) {
            Fate::Silent {
                written: w.rng.bool(),
            }
        } else if w.chance(faults.retryable_per_mille) {
            Fate::Retry {
                written: w.rng.bool(),
            }
        } else {
            Fate::Acknowledged
        };
        // With a dead-letter topic a refusal does not hold the key: the next session may
        // publish the event after later ones of its key (docs/concepts/guarantees.md).
        if matches!(fate, Fate::Refused { .. }) && !w.server.hold_on_refusal {
            w.refused_after_send.insert(id.clone());
        }
        let latency = Duration::from_millis(w.rng.u64(0..=faults.latency_max_ms));
        let session_start = w.session_start;
        drop(w);
        let written = Written {
            id,
            key: record
                .key
                .as_ref()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
            topic: record.topic.clone(),
            txn: None,
        };
        let world = self.world.clone();
        Box::pin(async move {
            let _running = running;
            sleep(latency / 2).await;
            if let Fate::Acknowledged
            | Fate::Retry { written: true }
            | Fate::Silent { written: true } = fate
            {
                world.lock().write(written);
            }
            if let Fate::Silent { .. } = fate {
                return std::future::pending().await;
            }
            sleep(latency - latency / 2).await;
            let mut w = world.lock();
            if fate != Fate::Broken && broken(&faults, session_start) {
                return Err(PublishError::broken("simulated connection loss"));
            }
            match fate {
                Fate::Acknowledged => {
                    w.server.acknowledged_now.insert(published);
                    Ok(())
                }
                Fate::Retry { .. } => Err(PublishError::retry("simulated timeout")),
                Fate::Refused { too_large: true } => {
                    Err(PublishError::too_large("simulated size limit"))
                }
                Fate::Refused { too_large: false } => {
                    Err(PublishError::refused("simulated refusal"))
                }
                Fate::Unavailable => Err(PublishError::retry("simulated server down")),
                Fate::Broken => Err(PublishError::broken("simulated connection loss")),
                Fate::Silent { .. } => unreachable!("answered above"),
            }
        })
    }
}

/// A record in flight, as [`SimOrderedSink`] keeps it.
struct Pending {
    token: EventToken,
    id: String,
    topic: String,
    size: usize,
}

/// One session's [`OrderedSink`] over a [`FakePublisher`], reporting to the checks.
pub(super) struct SimOrderedSink {
    world: Shared,
    sink: OrderedSink,
    pending: Vec<Pending>,
}

impl SimOrderedSink {
    /// Starts the session's sink; `hold_on_refusal` as `on_bad_event = "halt"`.
    pub fn new(world: Shared, hold_on_refusal: bool) -> Self {
        let setup = {
            let mut w = world.lock();
            let setup = w.setup.ordered.expect("the schedule runs the ordered sink");
            w.server.hold_on_refusal = hold_on_refusal;
            w.server.max_concurrency = setup.max_concurrency;
            setup
        };
        let publisher = FakePublisher {
            world: world.clone(),
        };
        let sink = OrderedSink::new(
            publisher,
            OrderedSettings {
                max_concurrency: setup.max_concurrency,
                delivery_timeout: setup.delivery_timeout,
                hold_on_refusal,
            },
        );
        SimOrderedSink {
            world,
            sink,
            pending: Vec::new(),
        }
    }
}

impl Sink for SimOrderedSink {
    fn send(&mut self, record: Record, token: EventToken) -> Result<(), SendError> {
        let pending = Pending {
            token,
            id: record.event_id(),
            topic: record.topic.clone(),
            size: record.size(),
        };
        self.sink.send(record, token)?;
        let mut w = self.world.lock();
        if !w
            .server
            .handed_over
            .insert((pending.id.clone(), pending.topic.clone()))
        {
            w.violate(format!(
                "event {} handed to the sink twice for {} in one session",
                pending.id, pending.topic
            ));
        }
        self.pending.push(pending);
        let largest = self.pending.iter().map(|p| p.size).max().unwrap_or(0);
        let dead_letter_bytes = self
            .pending
            .iter()
            .filter(|p| p.topic == DEAD_LETTER_TOPIC)
            .map(|p| p.size)
            .sum();
        let id = &self.pending[self.pending.len() - 1].id;
        w.on_sent(id, self.sink.in_flight(), largest, dead_letter_bytes);
        Ok(())
    }

    /// Cancel-safe: the ordered sink's is, and nothing here waits after it.
    async fn next_delivery(&mut self) -> Option<Delivery> {
        let delivery = self.sink.next_delivery().await?;
        let Some(i) = self.pending.iter().position(|p| p.token == delivery.token) else {
            self.world
                .lock()
                .violate("an outcome for a record not in flight".into());
            return Some(delivery);
        };
        let pending = self.pending.swap_remove(i);
        let mut w = self.world.lock();
        match &delivery.result {
            Ok(()) => {
                w.on_acknowledged(&pending.id);
                w.server.acknowledged.insert(pending.id);
            }
            // The session may send the copy's shrunk form (to the same destination).
            Err(e) if e.too_large && pending.topic == DEAD_LETTER_TOPIC => {
                w.server.handed_over.remove(&(pending.id, pending.topic));
            }
            Err(_) => {}
        }
        drop(w);
        Some(delivery)
    }

    fn in_flight(&self) -> InFlight {
        self.sink.in_flight()
    }

    fn oldest_in_flight(&self) -> Option<std::time::Instant> {
        self.sink.oldest_in_flight()
    }
}
