//! The NATS JetStream sink against a real nats-server (JetStream, file storage), one stream per
//! destination subject as an operator would create them; and what is NATS's own: the
//! duplicate window against the copies of a `kill -9`, a message over the stream's size
//! limit, credentials, `check`.

use std::sync::OnceLock;
use std::time::Duration;

use crate::support::nats::{create_stream, jetstream, nats_url, read_subjects, start, stream_name};
use crate::support::server::ServerProcess;
use crate::support::{free_port, wait_for, within, Consumed, Relay};
use crate::{assert_delivered, write_events};

use super::{sink_scenarios, SinkServer};

/// JetStream's default duplicate window.
const TWO_MINUTES: Duration = Duration::from_secs(120);

/// A nats-server and the duplicate window of the streams [`SinkServer::prepare`] creates.
struct Nats {
    process: &'static ServerProcess,
    duplicate_window: Duration,
}

/// The run's NATS server, started on first use.
fn shared_process() -> &'static ServerProcess {
    static SERVER: OnceLock<ServerProcess> = OnceLock::new();
    SERVER.get_or_init(|| start(free_port(), &[]))
}

/// The run's NATS server with streams of the default duplicate window.
fn shared() -> &'static Nats {
    static NATS: OnceLock<Nats> = OnceLock::new();
    NATS.get_or_init(|| Nats {
        process: shared_process(),
        duplicate_window: TWO_MINUTES,
    })
}

/// A server of the test's own (the restart test stops it; it is killed at the run's end).
fn private() -> Nats {
    Nats {
        process: Box::leak(Box::new(start(free_port(), &[]))),
        duplicate_window: TWO_MINUTES,
    }
}

impl SinkServer for Nats {
    fn kind(&self) -> &'static str {
        "nats"
    }

    fn sink_settings(&self) -> String {
        format!("url = \"{}\"", nats_url(self.process))
    }

    async fn prepare(&self, destinations: &[String]) {
        let js = jetstream(self.process).await;
        for subject in destinations {
            create_stream(&js, subject, self.duplicate_window, -1).await;
        }
    }

    async fn read(&self, destinations: &[String]) -> Vec<Consumed> {
        read_subjects(&jetstream(self.process).await, destinations).await
    }

    async fn refuse(&self, destination: &str) {
        // No stream takes the subject any more: JetStream answers "no responders".
        let js = jetstream(self.process).await;
        let name = stream_name(destination);
        within(
            &format!("deleting stream {name}"),
            Duration::from_secs(30),
            js.delete_stream(&name),
        )
        .await
        .unwrap_or_else(|e| panic!("deleting stream {name}: {e}"));
    }

    fn stop(&self) {
        self.process.stop();
    }

    fn start(&self) {
        self.process.start();
    }

    fn invalid_aggregate_type(&self) -> &'static str {
        // A legal Kafka topic name, not a NATS subject (an empty token).
        "Orders..v2"
    }
}

sink_scenarios!(shared(), private(), bad_routing_input);

/// Events in the stream of `subject` (copies included).
async fn stored(js: &async_nats::jetstream::Context, subject: &str) -> u64 {
    let name = stream_name(subject);
    let mut stream = within(
        &format!("stream {name}"),
        Duration::from_secs(30),
        js.get_stream(&name),
    )
    .await
    .unwrap_or_else(|e| panic!("stream {name}: {e}"));
    within(
        &format!("info of {name}"),
        Duration::from_secs(30),
        stream.info(),
    )
    .await
    .unwrap_or_else(|e| panic!("info of {name}: {e}"))
    .state
    .messages
}

/// A backlog of 10 transactions of 500 events drained by a relay killed with `kill -9` five
/// times, each when the stream holds about half a transaction more than the last time (so
/// acknowledged events of an unconfirmed transaction are published again); then drained to
/// the end. Returns the records in the stream and the events written.
async fn kill_9_while_draining(server: &Nats) -> (usize, usize) {
    let setup = super::setup("nats_dupes", &["Order"]).await;
    let destinations = setup.topics();
    server.prepare(&destinations).await;
    let (_dir, args) = super::relay_args(&setup, server, "");
    let released = |round: usize| {
        let setup = &setup;
        async move {
            wait_for(
                &format!("the slot to be released after kill -9 {round}"),
                Duration::from_secs(30),
                || async {
                    setup
                        .db
                        .slot_active_pid(&setup.slot)
                        .await
                        .is_none()
                        .then_some(())
                },
            )
            .await
        }
    };
    // The slot first, then the backlog behind it.
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    relay.kill();
    released(0).await;
    let (written, before_commit) = write_events(
        &setup.db.client,
        10,
        500,
        &setup.types,
        50,
        0,
        Duration::ZERO,
    )
    .await;
    let js = jetstream(server.process).await;
    for round in 1..=5u64 {
        let threshold = (round - 1) * 1000 + 250;
        let mut relay = Relay::spawn(&args);
        wait_for(
            &format!("{threshold} messages in the stream before kill -9 {round}"),
            Duration::from_secs(60),
            || async { (stored(&js, &destinations[0]).await >= threshold).then_some(()) },
        )
        .await;
        relay.kill();
        released(round as usize).await;
    }
    let relay = Relay::spawn(&args);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the slot to be confirmed past the backlog",
            Duration::from_secs(120),
        )
        .await;
    let got = read_subjects(&js, &destinations).await;
    assert_delivered(&written, &got, false);
    drop(relay);
    (got.len(), written.len())
}

/// The copies that `kill -9`s make: none stay in a stream whose duplicate window covers the
/// test (the default 2 minutes; `Nats-Msg-Id` is the event id), some with the shortest window
/// JetStream takes (100 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_window_drops_the_copies_a_kill_9_makes() {
    let without = Nats {
        process: shared_process(),
        duplicate_window: Duration::from_millis(100),
    };
    let (copies, events_without) = kill_9_while_draining(&without).await;
    let with = Nats {
        process: shared_process(),
        duplicate_window: TWO_MINUTES,
    };
    let (records, events) = kill_9_while_draining(&with).await;
    eprintln!(
        "kill -9 x5 while draining: duplicate window 100 ms: {copies} records for {events_without} events; 2 min: {records} records for {events} events"
    );
    assert!(
        copies > events_without,
        "the kills made no copies ({copies} records for {events_without} events): the test shows nothing"
    );
    assert_eq!(
        records, events,
        "a 2 minute duplicate window leaves one copy of each event"
    );
}
