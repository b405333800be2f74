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
