//! The Redis Streams sink against a real redis-server (append-only file on). No bad-routing
//! scenario: any byte string is a stream key (the router's own checks are in `routing`).

use std::sync::OnceLock;

use crate::support::redis::{read_streams, redis_url, start};
use crate::support::server::ServerProcess;
use crate::support::{free_port, within, Consumed};

use super::{sink_scenarios, SinkServer};

struct Redis(ServerProcess);

/// The run's Redis server, started on first use.
fn shared() -> &'static Redis {
    static SERVER: OnceLock<Redis> = OnceLock::new();
    SERVER.get_or_init(|| Redis(start(free_port())))
}

impl SinkServer for Redis {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn sink_settings(&self) -> String {
        format!("url = \"{}\"", redis_url(&self.0))
    }

    async fn prepare(&self, _destinations: &[String]) {
        // XADD creates a stream on first use.
    }

    async fn read(&self, destinations: &[String]) -> Vec<Consumed> {
        read_streams(&self.0, destinations).await
    }

    async fn refuse(&self, destination: &str) {
        // A key of another type: XADD answers WRONGTYPE, for good.
        let client = redis::Client::open(redis_url(&self.0)).unwrap();
        let mut connection = within(
            "connecting to redis-server",
            std::time::Duration::from_secs(30),
            client.get_multiplexed_async_connection(),
        )
        .await
        .unwrap();
        let _: () = redis::cmd("SET")
            .arg(destination)
            .arg("not a stream")
            .query_async(&mut connection)
            .await
            .unwrap();
    }

    fn stop(&self) {
        self.0.stop();
    }

    fn start(&self) {
        self.0.start();
    }

    fn invalid_aggregate_type(&self) -> &'static str {
        unreachable!("any byte string is a stream key: no bad routing input of Redis's own")
    }
}

sink_scenarios!(shared(), Redis(start(free_port())));

/// `check` says what the server's persistence makes of an acknowledgement, and names the
/// server it cannot reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_persistence_and_an_unreachable_server() {
    let setup = super::setup("redis_check", &["Order"]).await;
    let server = shared();
    let (_dir, mut args) = super::relay_args(&setup, server, "");
    args[0] = "check".into();
    let mut check = crate::support::Relay::spawn(&args);
    let status = check.wait(std::time::Duration::from_secs(60));
    let log = check.log();
    // The harness's server runs with appendonly yes and appendfsync always.
    assert!(
        log.contains("ok    redis") && log.contains("appendfsync always: an acknowledged entry is on disk"),
        "{status}:\n{log}"
    );

    let port = free_port();
    let down = Redis(start(port));
    down.0.stop();
    let (_dir, mut args) = super::relay_args(&setup, &down, "");
    args[0] = "check".into();
    let mut check = crate::support::Relay::spawn(&args);
    let status = check.wait(std::time::Duration::from_secs(60));
    let log = check.log();
    assert!(!status.success(), "check passed with the Redis server down:\n{log}");
    assert!(
        log.contains("FAIL  redis") && log.contains(&format!("127.0.0.1:{port}")),
        "{log}"
    );
}
