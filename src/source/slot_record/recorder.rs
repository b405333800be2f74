//! The record's updates while a session streams: the source hands over confirmed LSNs without
//! waiting, a task writes the latest at most once per [`UPDATE_INTERVAL`].

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::Client;
use tracing::{debug, warn};

use super::update;
use crate::config::PipelineConfig;
use crate::lsn::Lsn;
use crate::source::slot::SqlConnection;
use crate::source::target::Endpoint;

/// How often, at most, the record's confirmed LSN is updated: often enough that a lost slot's
/// message names a recent position, rare enough to be no load (one small UPDATE).
pub const UPDATE_INTERVAL: Duration = Duration::from_secs(5);

/// The log-tailing source's side of the record's updates: [`Recorder::delivered`] hands the
/// latest confirmed LSN to the task of [`Recorder::spawn`] without waiting.
pub struct Recorder {
    confirmed: watch::Sender<Lsn>,
}

/// The task that writes the record's updates; aborted when dropped.
pub struct RecorderTask(tokio::task::JoinHandle<()>);

impl Drop for RecorderTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl RecorderTask {
    /// Waits up to `timeout` for the task's last write, which it makes once the [`Recorder`]
    /// is dropped.
    pub async fn finish(mut self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, &mut self.0).await;
    }
}

impl Recorder {
    /// Starts the task that records, at most every [`UPDATE_INTERVAL`], the confirmed LSNs
    /// passed to [`Recorder::delivered`] ([`update`]) over `client` (made again to `server`,
    /// the one the pipeline streams from, with [`crate::source::slot::connect_to`] after an
    /// error), and once more when the recorder is
    /// dropped. A failed write is logged and retried with the next LSN: the row already says the
    /// relay streamed from the slot, only its LSN is older.
    pub fn spawn(
        config: &PipelineConfig,
        server: Endpoint,
        client: Client,
        connection: SqlConnection,
        confirmed: Lsn,
    ) -> (Recorder, RecorderTask) {
        let (tx, rx) = watch::channel(confirmed);
        let writer = SqlWriter {
            config: config.clone(),
            server,
            connection: Some((client, connection)),
        };
        let task = tokio::spawn(pace(rx, confirmed, UPDATE_INTERVAL, writer));
        (Recorder { confirmed: tx }, RecorderTask(task))
    }

    /// Notes that the source confirmed `lsn` to the slot after delivering events (an idle
    /// position alone does not call this: recording it would be WAL the relay then confirms,
    /// a write every interval on an idle database). Never waits.
    pub fn delivered(&self, lsn: Lsn) {
        self.confirmed.send_if_modified(|current| {
            let moved = lsn > *current;
            if moved {
                *current = lsn;
            }
            moved
        });
    }
}

/// Writes one LSN to the record; the pacing of [`pace`] is apart from the SQL so that it can
/// be tested without a server.
trait WriteRecord: Send {
    /// Records `lsn`; returns whether it was written (else the next LSN tries again).
    fn write(&mut self, lsn: Lsn) -> impl Future<Output = bool> + Send;
}

/// Writes with [`update`] over a connection of its own, made again after an error.
struct SqlWriter {
    config: PipelineConfig,
    /// The server the pipeline streams from: a new connection goes there.
    server: Endpoint,
    connection: Option<(Client, SqlConnection)>,
}

impl WriteRecord for SqlWriter {
    async fn write(&mut self, lsn: Lsn) -> bool {
        let config = &self.config;
        if self.connection.is_none() {
            self.connection = crate::source::slot::connect_to(config, &self.server)
                .await
                .ok();
        }
        let Some((client, _)) = &self.connection else {
            return false;
        };
        match update(client, &config.slot_record_schema, &config.slot, lsn).await {
            Ok(recorded) => {
                debug!(pipeline = %config.name, %lsn, recorded = ?recorded.map(|l| l.to_string()), "slot record updated");
                true
            }
            Err(e) => {
                warn!(pipeline = %config.name, error = %crate::error::chain(&e), "cannot update the slot record's confirmed LSN; retrying with the next one");
                self.connection = None;
                false
            }
        }
    }
}

/// Writes the latest LSN of `rx` once it passed `written`: after a change, once `interval`
/// has passed (later changes in that time only replace the LSN), and once more at once when
/// the sender is dropped. Returns after that last write.
async fn pace(
    mut rx: watch::Receiver<Lsn>,
    mut written: Lsn,
    interval: Duration,
    mut writer: impl WriteRecord,
) {
    loop {
        let mut open = rx.changed().await.is_ok();
        if open {
            open = tokio::time::timeout(interval, async { while rx.changed().await.is_ok() {} })
                .await
                .is_err();
        }
        let lsn = *rx.borrow_and_update();
        if lsn > written && writer.write(lsn).await {
            written = lsn;
        }
        if !open {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;

    /// Notes each write with its time; fails the writes whose LSN is in `failing`.
    #[derive(Clone, Default)]
    struct Fake {
        writes: Arc<Mutex<Vec<(Lsn, Duration)>>>,
        failing: Vec<Lsn>,
        start: Option<Instant>,
    }

    impl WriteRecord for Fake {
        async fn write(&mut self, lsn: Lsn) -> bool {
            let at = self.start.unwrap().elapsed();
            self.writes.lock().unwrap().push((lsn, at));
            !self.failing.contains(&lsn)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_recorder_passes_on_only_forward_moves() {
        let (tx, mut rx) = watch::channel(Lsn(100));
        let recorder = Recorder { confirmed: tx };
        recorder.delivered(Lsn(50));
        assert!(!rx.has_changed().unwrap(), "an older LSN was passed on");
        recorder.delivered(Lsn(200));
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), Lsn(200));
        drop(recorder);
        assert!(rx.changed().await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn writes_the_latest_lsn_at_most_once_per_interval_and_once_more_at_the_end() {
        let interval = Duration::from_secs(5);
        let fake = Fake {
            start: Some(Instant::now()),
            ..Fake::default()
        };
        let (tx, rx) = watch::channel(Lsn(100));
        let recorder = Recorder { confirmed: tx };
        let task = tokio::spawn(pace(rx, Lsn(100), interval, fake.clone()));
        // A confirmation every 100 ms for 12 s.
        for n in 1..=120u64 {
            recorder.delivered(Lsn(100 + n));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drop(recorder);
        task.await.unwrap();
        let writes = fake.writes.lock().unwrap().clone();
        assert!(writes.len() >= 2, "{writes:?}");
        for pair in writes.windows(2) {
            assert!(pair[1].0 > pair[0].0, "not increasing: {writes:?}");
        }
        // Every write but the last (made when the recorder was dropped) is an interval apart.
        let (last, rest) = writes.split_last().unwrap();
        for pair in rest.windows(2) {
            assert!(pair[1].1 - pair[0].1 >= interval, "too close: {writes:?}");
        }
        assert_eq!(
            last.0,
            Lsn(220),
            "the last write is not the last LSN: {writes:?}"
        );
        assert!(
            last.1 <= Duration::from_secs(12) + Duration::from_millis(1),
            "{writes:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_is_tried_again_with_the_next_lsn_and_nothing_is_written_without_a_move()
    {
        let fake = Fake {
            start: Some(Instant::now()),
            failing: vec![Lsn(150)],
            ..Fake::default()
        };
        let (tx, rx) = watch::channel(Lsn(100));
        let recorder = Recorder { confirmed: tx };
        let task = tokio::spawn(pace(rx, Lsn(100), Duration::from_secs(5), fake.clone()));
        recorder.delivered(Lsn(150));
        tokio::time::sleep(Duration::from_secs(20)).await;
        // An older LSN is not a move.
        recorder.delivered(Lsn(120));
        tokio::time::sleep(Duration::from_secs(20)).await;
        drop(recorder);
        task.await.unwrap();
        let lsns: Vec<Lsn> = fake
            .writes
            .lock()
            .unwrap()
            .iter()
            .map(|(l, _)| *l)
            .collect();
        // 150 failed, so the end tries it again; nothing else was written.
        assert_eq!(lsns, vec![Lsn(150), Lsn(150)]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_lsn_written_already_is_not_written_again_at_the_end() {
        let fake = Fake {
            start: Some(Instant::now()),
            ..Fake::default()
        };
        let (tx, rx) = watch::channel(Lsn(100));
        let recorder = Recorder { confirmed: tx };
        let task = tokio::spawn(pace(rx, Lsn(100), Duration::from_secs(5), fake.clone()));
        recorder.delivered(Lsn(300));
        tokio::time::sleep(Duration::from_secs(20)).await;
        drop(recorder);
        task.await.unwrap();
        let writes = fake.writes.lock().unwrap().clone();
        assert_eq!(writes, vec![(Lsn(300), Duration::from_secs(5))]);
    }
}
