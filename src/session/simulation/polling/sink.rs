//! The server behind the polling simulation's sink: a fake [`Publisher`] under the real
//! [`OrderedSink`], and a thin [`Sink`] around the ordered sink that tells the table's checks
//! which acknowledgements reached the session.
//!
//! An attempt's fate is drawn when it is made, as in the log-tailing simulation's fake server
//! (`super::super::publisher`): acknowledged; a retryable error, before or after the server
//! wrote the record; refused for good; no answer; unavailable while the server is down; a
//! broken connection. Each attempt checks that its row is not marked published or FAILED in
//! the table (a published row published again, beyond the duplicates a crash or a failed
//! COMMIT explains) and records that the row was tried in its cycle.

use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::{sleep, Instant};

use super::world::{Faults, RowState, Shared, Written};
use crate::ack::EventToken;
use crate::config::PipelineConfig;
use crate::sink::ordered::{OrderedSettings, OrderedSink, PublishError, Publisher};
use crate::sink::{Delivery, InFlight, Record, SendError, Sink};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Acknowledged,
    Retry { written: bool },
    Refused,
    Silent { written: bool },
    Unavailable,
    Broken,
}

/// One poller session's client of the server.
struct FakePublisher {
    world: Shared,
    poller: usize,
}

fn broken(faults: &Faults, start: Instant) -> bool {
    faults
        .broken_after
        .is_some_and(|after| Instant::now() >= start + after)
}

impl Publisher for FakePublisher {
    fn publish(&self, record: &Record) -> BoxFuture<'static, Result<(), PublishError>> {
        let mut w = self.world.lock();
        let id = record.event_id();
        let session = w.sessions[self.poller].clone();
        let (faults, start) = (session.faults, session.start);
        let since = Instant::now() - start;
        let fate = if broken(&faults, start) {
            Fate::Broken
        } else if faults
            .server_down
            .is_some_and(|(from, until)| from <= since && since < until)
        {
            Fate::Unavailable
        } else if w.chance(faults.permanent_per_mille) {
            Fate::Refused
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
        match w.row_mut(&id) {
            None => w.violate(format!("a record of {id}, which is no row, published")),
            Some(row) => {
                row.tried = true;
                row.last_refused = fate == Fate::Refused;
                let state = row.state;
                match state {
                    RowState::Published | RowState::Deleted => w.violate(format!(
                        "row {id} published again after its published mark was committed"
                    )),
                    RowState::Failed => w.violate(format!(
                        "row {id} published again after it was marked FAILED"
                    )),
                    RowState::Pending => {}
                }
            }
        }
        let latency = Duration::from_millis(w.rng.u64(0..=faults.latency_max_ms));
        drop(w);
        let written = Written {
            id,
            key: record
                .key
                .as_ref()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
        };
        let world = self.world.clone();
        Box::pin(async move {
            sleep(latency / 2).await;
            if let Fate::Acknowledged
            | Fate::Retry { written: true }
            | Fate::Silent { written: true } = fate
            {
                world.lock().log.push(written);
            }
            if let Fate::Silent { .. } = fate {
                return std::future::pending().await;
            }
            sleep(latency - latency / 2).await;
            if fate != Fate::Broken && broken(&faults, start) {
                return Err(PublishError::broken("simulated connection loss"));
            }
            match fate {
                Fate::Acknowledged => Ok(()),
                Fate::Retry { .. } => Err(PublishError::retry("simulated timeout")),
                Fate::Refused => Err(PublishError::refused("simulated refusal")),
                Fate::Unavailable => Err(PublishError::retry("simulated server down")),
                Fate::Broken => Err(PublishError::broken("simulated connection loss")),
                Fate::Silent { .. } => unreachable!("answered above"),
            }
        })
    }
}

/// One poller session's [`OrderedSink`] over a [`FakePublisher`], reporting to the checks.
pub(super) struct PollSink {
    world: Shared,
    sink: OrderedSink,
    /// Records in flight: token, event id, size.
    pending: Vec<(EventToken, String, usize)>,
}

impl PollSink {
    /// The sink of a session with `config`: its hold after a refusal as the pipeline's.
    pub fn new(world: Shared, poller: usize, config: &PipelineConfig) -> Self {
        let setup = world.lock().setup;
        let sink = OrderedSink::new(
            FakePublisher {
                world: world.clone(),
                poller,
            },
            OrderedSettings {
                max_concurrency: setup.max_concurrency,
                delivery_timeout: setup.delivery_timeout,
                hold_on_refusal: crate::sink::hold_on_refusal(config),
            },
        );
        PollSink {
            world,
            sink,
            pending: Vec::new(),
        }
    }
}

impl Sink for PollSink {
    fn send(&mut self, record: Record, token: EventToken) -> Result<(), SendError> {
        let (id, size) = (record.event_id(), record.size());
        self.sink.send(record, token)?;
        self.pending.push((token, id, size));
        let in_flight = self.sink.in_flight();
        let largest = self.pending.iter().map(|p| p.2).max().unwrap_or(0);
        let mut w = self.world.lock();
        let (events, bytes) = (w.setup.max_in_flight_events, w.setup.max_in_flight_bytes);
        if in_flight.events > events {
            w.violate(format!(
                "{} records in flight, max_in_flight_events = {events}",
                in_flight.events
            ));
        }
        if in_flight.bytes >= bytes + largest {
            w.violate(format!(
                "{} bytes in flight, the largest record {largest}, max_in_flight_bytes = {bytes}",
                in_flight.bytes
            ));
        }
        Ok(())
    }

    /// Cancel-safe: the ordered sink's is, and nothing here waits after it.
    async fn next_delivery(&mut self) -> Option<Delivery> {
        let delivery = self.sink.next_delivery().await?;
        let Some(i) = self.pending.iter().position(|p| p.0 == delivery.token) else {
            self.world
                .lock()
                .violate("an outcome for a record not in flight".into());
            return Some(delivery);
        };
        let (_, id, _) = self.pending.swap_remove(i);
        if delivery.result.is_ok() {
            let mut w = self.world.lock();
            if let Some(row) = w.row_mut(&id) {
                row.ack_reported = true;
                row.acknowledged = true;
            }
        }
        Some(delivery)
    }

    fn in_flight(&self) -> InFlight {
        self.sink.in_flight()
    }

    fn oldest_in_flight(&self) -> Option<std::time::Instant> {
        self.sink.oldest_in_flight()
    }
}
