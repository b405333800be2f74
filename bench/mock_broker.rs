//! librdkafka's mock cluster as a stand-alone broker for `bench/run.py --broker mock`: a
//! Kafka-protocol broker in one process with next to no latency of its own, so the latency
//! scenario shows what the relay and PostgreSQL add without tansu's produce and fetch times.
//!
//! ```sh
//! cargo run --release --example mock_broker -- TOPIC[:PARTITIONS] ...
//! ```
//!
//! Creates each topic (3 partitions unless given), prints the bootstrap address on one line
//! and serves until stdin closes. Not a real broker: it keeps every record in memory, writes
//! no transaction markers and does not fence (see `rdkafka::mocking`); tests never rely on it
//! as the proof that delivery works.

use std::io::Read;

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

fn main() {
    let cluster: MockCluster<'static, DefaultProducerContext> =
        MockCluster::new(1).expect("creating a librdkafka mock cluster");
    for arg in std::env::args().skip(1) {
        let (topic, partitions) = match arg.split_once(':') {
            Some((topic, n)) => (topic.to_owned(), n.parse().expect("PARTITIONS is a number")),
            None => (arg, 3),
        };
        cluster
            .create_topic(&topic, partitions, 1)
            .unwrap_or_else(|e| panic!("creating topic {topic}: {e}"));
    }
    println!("{}", cluster.bootstrap_servers());
    // Serve until the harness closes our stdin (or exits).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}
