//! The NATS JetStream sink against a real nats-server (JetStream, file storage), one stream per
//! destination subject as an operator would create them; and what is NATS's own: the
//! duplicate window against the copies of a `kill -9`, a message over the stream's size
//! limit, credentials, `check`.

use std::sync::OnceLock;
use std::time::Duration;

use crate::support::nats::{create_stream, jetstream, nats_url, read_subjects, start, stream_name};
use crate::support::server::ServerProcess;
use crate::support::{free_port, within, Consumed};

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
        within(&format!("deleting stream {name}"), Duration::from_secs(30), js.delete_stream(&name))
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
