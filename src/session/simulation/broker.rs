//! A fake Kafka: the sink (the producer's queue, partitions that acknowledge in order each,
//! in any order across them, timeouts, refusals at send and after it) and the transactional
//! capability against a model of a real transaction coordinator (abort markers, fencing of an
//! older producer epoch, commits whose outcome the client does not learn).

use std::collections::VecDeque;
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::time::{sleep, sleep_until, Instant};

use super::wal::DEAD_LETTER_TOPIC;
use super::world::{txn_of, LateCommit, Shared, TxnStatus, Written};
use crate::ack::EventToken;
use crate::exactly_once::{Checkpoint, TransactionError, Transactions};
use crate::session::mutation::{self, Mutation};
use crate::session::tests::transaction_error;
use crate::sink::{Delivery, DeliveryError, InFlight, Record, SendError, Sink};

/// How long a hanging transaction call takes to fail (the relay's own call timeout).
pub(super) const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Acknowledged,
    /// A message timeout: publishing again may succeed.
    Retryable,
    /// The broker refused it for good.
    Refused {
        too_large: bool,
    },
}

struct Pending {
    record: Record,
    token: EventToken,
    id: String,
    size: usize,
    /// `None`: the partition is unavailable, no outcome comes in this session.
    ready_at: Option<Instant>,
    outcome: Outcome,
    /// The Kafka transaction it was sent in (exactly-once).
    txn: Option<usize>,
}

impl Pending {
    /// The record as the broker writes it.
    fn written(&self) -> Written {
        Written {
            id: self.id.clone(),
            key: self
                .record
                .key
                .as_ref()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
            topic: self.record.topic.clone(),
            txn: self.txn,
        }
    }
}

/// One session's producer.
pub(super) struct SimSink {
    world: Shared,
    partitions: Vec<VecDeque<Pending>>,
    /// A record of the partition timed out: those behind it in the producer's queue time out
    /// too (the idempotent producer keeps no gaps).
    timed_out: Vec<bool>,
    in_flight: InFlight,
}

impl SimSink {
    pub fn new(world: Shared) -> Self {
        let partitions = world.lock().setup.partitions;
        SimSink {
            world,
            partitions: (0..partitions).map(|_| VecDeque::new()).collect(),
            timed_out: vec![false; partitions],
            in_flight: InFlight::default(),
        }
    }
}

fn delivery_error(
    record: &Record,
    reason: &str,
    retryable: bool,
    too_large: bool,
) -> DeliveryError {
    DeliveryError {
        event_id: record.event_id(),
        topic: record.topic.clone(),
        reason: reason.into(),
        retryable,
        too_large,
        connection_lost: false,
        attempted: true,
        record: None,
    }
}

impl Sink for SimSink {
    fn send(&mut self, record: Record, token: EventToken) -> Result<(), SendError> {
        let mut w = self.world.lock();
        if self.in_flight.events >= w.setup.queue_limit {
            return Err(SendError::Full(Box::new(record)));
        }
        if w.setup.exactly_once && w.coordinator.abortable.is_some() {
            let error = delivery_error(&record, "Local: Erroneous state", true, false);
            return Err(SendError::Refused(error));
        }
        let size = record.size();
        if size > w.setup.producer_max_bytes {
            let mut error = delivery_error(&record, "Broker: Message size too large", false, true);
            error.record = Some(Box::new(record));
            return Err(SendError::Refused(error));
        }
        let id = record.event_id();
        let faults = w.faults;
        let partition = match &record.key {
            Some(key) => key.iter().map(|&b| usize::from(b)).sum::<usize>() % self.partitions.len(),
            None => w.rng.usize(0..self.partitions.len()),
        };
        let outcome = if self.timed_out[partition] {
            Outcome::Retryable
        } else if size > w.setup.broker_max_bytes {
            Outcome::Refused { too_large: true }
        } else if w.chance(faults.retryable_per_mille) {
            self.timed_out[partition] = true;
            Outcome::Retryable
        } else if w.chance(faults.permanent_per_mille) {
            Outcome::Refused { too_large: false }
        } else {
            Outcome::Acknowledged
        };
        let ready_at = match faults.unavailable_partition == Some(partition) {
            true => None,
            false => {
                let latency = Duration::from_millis(w.rng.u64(0..=faults.latency_max_ms));
                let behind = self.partitions[partition]
                    .iter()
                    .filter_map(|p| p.ready_at)
                    .max();
                Some((Instant::now() + latency).max(behind.unwrap_or(Instant::now())))
            }
        };
        let txn = match w.setup.exactly_once {
            false => None,
            true => {
                let ongoing = w.coordinator.ongoing;
                match (ongoing, txn_of(&id)) {
                    (None, _) => w.violate(format!("record {id} sent outside a Kafka transaction")),
                    (Some(txn), Some(pg)) => {
                        w.coordinator.batches.entry(txn).or_default().insert(pg);
                    }
                    (Some(_), None) => {}
                }
                ongoing
            }
        };
        if let Outcome::Refused { .. } = outcome {
            w.refused_after_send.insert(id.clone());
        }
        self.in_flight.events += 1;
        self.in_flight.bytes += size;
        let dead_letter_bytes = self
            .partitions
            .iter()
            .flatten()
            .filter(|p| p.record.topic == DEAD_LETTER_TOPIC)
            .map(|p| p.size)
            .sum::<usize>()
            + if record.topic == DEAD_LETTER_TOPIC {
                size
            } else {
                0
            };
        let largest = self
            .partitions
            .iter()
            .flatten()
            .map(|p| p.size)
            .max()
            .unwrap_or(0)
            .max(size);
        w.on_sent(&id, self.in_flight, largest, dead_letter_bytes);
        self.partitions[partition].push_back(Pending {
            record,
            token,
            id,
            size,
            ready_at,
            outcome,
            txn,
        });
        Ok(())
    }

    /// Cancel-safe: nothing changes before the outcome is returned.
    async fn next_delivery(&mut self) -> Option<Delivery> {
        let next = self
            .partitions
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((p.front()?.ready_at?, i)))
            .min();
        let Some((ready_at, partition)) = next else {
            return std::future::pending().await;
        };
        sleep_until(ready_at).await;
        let pending = self.partitions[partition].pop_front()?;
        self.in_flight.events -= 1;
        self.in_flight.bytes -= pending.size;
        let mut w = self.world.lock();
        let result = match pending.outcome {
            Outcome::Acknowledged => {
                if !(mutation::active(Mutation::AckUnwritten) && w.rng.u8(0..4) == 0) {
                    w.write(pending.written());
                }
                w.on_acknowledged(&pending.id);
                Ok(())
            }
            Outcome::Retryable => Err(delivery_error(
                &pending.record,
                "Local: Message timed out",
                true,
                false,
            )),
            Outcome::Refused { too_large } => {
                if pending.txn.is_some() {
                    w.coordinator.abortable = pending.txn;
                }
                let reason = match too_large {
                    true => "Broker: Message size too large",
                    false => "Broker: Topic authorization failed",
                };
                let mut error = delivery_error(&pending.record, reason, false, too_large);
                error.record = Some(Box::new(pending.record.clone()));
                Err(error)
            }
        };
        Some(Delivery {
            token: pending.token,
            topic: pending.record.topic,
            result,
            latency: Duration::ZERO,
            timestamp_ms: None,
        })
    }

    fn in_flight(&self) -> InFlight {
        self.in_flight
    }

    fn oldest_in_flight(&self) -> Option<std::time::Instant> {
        None
    }
}

impl Drop for SimSink {
    /// The producer goes away: records the broker had already written stay written (their
    /// acknowledgement is lost), the rest are purged.
    fn drop(&mut self) {
        let mut w = self.world.lock();
        let now = Instant::now();
        for pending in self.partitions.iter().flatten() {
            if pending.outcome == Outcome::Acknowledged
                && pending.ready_at.is_some_and(|at| at <= now)
            {
                w.write(pending.written());
            }
        }
    }
}

/// The transaction calls of one session's producer against the coordinator model.
pub(super) struct SimTransactions {
    world: Shared,
}

impl SimTransactions {
    pub fn new(world: Shared) -> Self {
        SimTransactions { world }
    }
}

fn fenced(operation: &'static str) -> TransactionError {
    TransactionError {
        operation,
        source: KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
    }
}

/// What a commit call does, drawn when it is made.
#[derive(Clone, Copy, Debug)]
enum CommitFate {
    Commits,
    /// Fails before the coordinator acted: the transaction is still open.
    Fails,
    /// The coordinator committed; the client sees a timeout.
    Unknown,
    /// The call takes its whole timeout; the coordinator committed or not.
    Hangs {
        committed: bool,
    },
    /// The client gives up; the request reaches the coordinator later.
    Late {
        after: Duration,
    },
}

impl Transactions for SimTransactions {
    /// Fences the earlier epoch: its open transaction is aborted.
    fn init(&self) -> BoxFuture<'static, Result<(), TransactionError>> {
        let mut w = self.world.lock();
        w.coordinator.deliver_late(Instant::now());
        w.coordinator.epoch += 1;
        if let Some(txn) = w.coordinator.ongoing.take() {
            w.coordinator.txns[txn] = TxnStatus::Aborted;
        }
        w.coordinator.abortable = None;
        w.producer_epoch = w.coordinator.epoch;
        let result = match w.faults.init_fails {
            true => Err(transaction_error("init")),
            false => Ok(()),
        };
        Box::pin(async move { result })
    }

    fn begin(&self) -> BoxFuture<'static, Result<(), TransactionError>> {
        let mut w = self.world.lock();
        w.coordinator.deliver_late(Instant::now());
        let result = if w.producer_epoch != w.coordinator.epoch {
            Err(fenced("begin"))
        } else if let Some(txn) = w.coordinator.ongoing {
            w.violate(format!("begin while Kafka transaction {txn} is open"));
            Ok(())
        } else {
            w.coordinator.txns.push(TxnStatus::Ongoing);
            w.coordinator.ongoing = Some(w.coordinator.txns.len() - 1);
            Ok(())
        };
        Box::pin(async move { result })
    }

    fn commit(&self, checkpoint: Checkpoint) -> BoxFuture<'static, Result<(), TransactionError>> {
        let mut w = self.world.lock();
        let epoch = w.producer_epoch;
        let Some(txn) = w.coordinator.ongoing else {
            w.violate("commit without an open Kafka transaction".into());
            return Box::pin(async { Err(transaction_error("commit")) });
        };
        w.coordinator.checkpoints.push((txn, checkpoint.0));
        let faults = w.faults;
        let delay = Duration::from_millis(w.rng.u64(0..=faults.latency_max_ms));
        let fate = if w.coordinator.abortable == Some(txn) || w.chance(faults.commit_fail_per_mille)
        {
            CommitFate::Fails
        } else if w.chance(faults.commit_unknown_per_mille) {
            CommitFate::Unknown
        } else if w.chance(faults.commit_hang_per_mille) {
            CommitFate::Hangs {
                committed: w.rng.bool(),
            }
        } else if w.chance(faults.commit_late_per_mille) {
            CommitFate::Late {
                after: Duration::from_millis(w.rng.u64(0..20_000)),
            }
        } else {
            CommitFate::Commits
        };
        drop(w);
        let world = self.world.clone();
        Box::pin(async move {
            let commit = |world: &Shared| {
                let mut w = world.lock();
                w.coordinator.deliver_late(Instant::now());
                let current =
                    w.coordinator.epoch == epoch && w.coordinator.txns[txn] == TxnStatus::Ongoing;
                if current {
                    w.coordinator.commit(txn);
                }
                current
            };
            match fate {
                CommitFate::Commits => {
                    sleep(delay).await;
                    match commit(&world) {
                        true => Ok(()),
                        false => Err(fenced("commit")),
                    }
                }
                CommitFate::Fails => {
                    sleep(delay).await;
                    Err(transaction_error("commit"))
                }
                CommitFate::Unknown => {
                    sleep(delay).await;
                    commit(&world);
                    Err(transaction_error("commit"))
                }
                CommitFate::Hangs { committed } => {
                    sleep(TRANSACTION_CALL_TIMEOUT).await;
                    if committed {
                        commit(&world);
                    }
                    Err(transaction_error("commit"))
                }
                CommitFate::Late { after } => {
                    sleep(delay).await;
                    world.lock().coordinator.late.push(LateCommit {
                        arrives_at: Instant::now() + after,
                        epoch,
                        txn,
                    });
                    Err(transaction_error("commit"))
                }
            }
        })
    }

    fn abort(&self, _timeout: Duration) -> BoxFuture<'static, Result<(), TransactionError>> {
        let mut w = self.world.lock();
        w.coordinator.deliver_late(Instant::now());
        let abort_fail = w.faults.abort_fail_per_mille;
        let result = if w.producer_epoch != w.coordinator.epoch {
            Err(fenced("abort"))
        } else if w.chance(abort_fail) {
            // Left to the next registration, which aborts it.
            Err(transaction_error("abort"))
        } else {
            match w.coordinator.ongoing.take() {
                Some(txn) => {
                    w.coordinator.txns[txn] = TxnStatus::Aborted;
                    w.coordinator.abortable = None;
                    Ok(())
                }
                // Committed after all (an outcome the client did not learn).
                None => Err(transaction_error("abort")),
            }
        };
        Box::pin(async move { result })
    }
}
