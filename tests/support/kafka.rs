//! The tansu Kafka-protocol broker (one per test-binary run, plus extra ones on request) and a
//! consumer that reads topics from the beginning.

use super::run::{self, run_dir, wait_tcp};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a broker may take to accept connections after it was spawned.
const BROKER_START_DEADLINE: Duration = Duration::from_secs(60);
/// How long topic creation (and the topic showing up in metadata) may take.
const TOPIC_DEADLINE: Duration = Duration::from_secs(60);

/// A tansu broker process (in-memory storage) listening on 127.0.0.1:`port`, advertising the
/// same address. Killed on drop and at process exit.
pub struct Broker {
    port: u16,
    child: Mutex<Option<Child>>,
    log: PathBuf,
}

/// The test run's broker, started on a free port on the first call (well under a second once
/// the binary is there). Panics if it cannot be started (and so does every later call).
pub fn kafka() -> &'static Broker {
    static BROKER: OnceLock<Result<Broker, String>> = OnceLock::new();
    let r = BROKER.get_or_init(|| {
        std::panic::catch_unwind(|| Broker::start_on(super::free_port())).map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into())
        })
    });
    match r {
        Ok(b) => b,
        Err(e) => panic!("the tansu test broker failed to start: {e}"),
    }
}

/// Path of the tansu binary: `$TANSU_BIN`, else `$CARGO_HOME/bin/tansu`, else
/// `~/.cargo/bin/tansu`, else `tansu` on `$PATH`.
pub fn tansu_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TANSU_BIN") {
        return PathBuf::from(p);
    }
    let mut candidates = Vec::new();
    if let Some(h) = std::env::var_os("CARGO_HOME") {
        candidates.push(PathBuf::from(h).join("bin/tansu"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(h).join(".cargo/bin/tansu"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("tansu")));
    }
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("tansu not found ($TANSU_BIN, $CARGO_HOME/bin, ~/.cargo/bin, $PATH): run tests/setup-deps.sh")
    })
}

impl Broker {
    /// Starts a broker on 127.0.0.1:`port` and waits (up to 60 s) until it accepts
    /// connections. Used directly by outage tests: point the relay at a port where nothing
    /// listens ([`super::free_port`]), later start the broker there. Killed on drop and at exit.
    pub fn start_on(port: u16) -> Broker {
        Broker::start_advertising(port, &format!("127.0.0.1:{port}"))
    }

    /// Like [`Broker::start_on`], advertising `advertised` (`host:port`) as its address in
    /// metadata instead, so clients reach it through what listens there (a TLS front:
    /// [`super::tls_front`]).
    pub fn start_advertising(port: u16, advertised: &str) -> Broker {
        let t0 = Instant::now();
        let bin = tansu_bin();
        let log = run_dir().join(format!("tansu-{port}.log"));
        let out =
            fs::File::create(&log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let err = out.try_clone().expect("cloning log file handle");
        let mut cmd = Command::new(&bin);
        cmd.arg("broker")
            .args(["--storage-engine", "memory://tansu/"])
            .args(["--listener-url", &format!("tcp://127.0.0.1:{port}")])
            .args(["--advertised-listener-url", &format!("tcp://{advertised}")])
            .current_dir(run_dir())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // tansu reads its settings from these too; keep the caller's environment out of it.
        for k in [
            "CLUSTER_ID",
            "LISTENER_URL",
            "ADVERTISED_LISTENER_URL",
            "STORAGE_ENGINE",
            "SCHEMA_REGISTRY",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "RUST_LOG",
        ] {
            cmd.env_remove(k);
        }
        if let Some(l) = std::env::var_os("TANSU_RUST_LOG") {
            cmd.env("RUST_LOG", l);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {} broker: {e}", bin.display()));
        run::register_child(child.id(), &bin);
        let mut exited = None;
        let up = wait_tcp(port, BROKER_START_DEADLINE, || {
            exited = child.try_wait().ok().flatten();
            exited.is_some()
        });
        if !up {
            let _ = child.kill();
            let status = child.wait().ok();
            run::unregister_child(child.id());
            let text = fs::read_to_string(&log).unwrap_or_default();
            panic!(
                "tansu broker on 127.0.0.1:{port} did not accept connections within {:?} \
                 (exit status: {:?})\n--- {}:\n{}",
                BROKER_START_DEADLINE,
                exited.or(status),
                log.display(),
                super::tail_lines(&text, 50)
            );
        }
        let b = Broker {
            port,
            child: Mutex::new(Some(child)),
            log,
        };
        b.wait_metadata();
        eprintln!(
            "[support] tansu broker on 127.0.0.1:{port} up in {:?} (log {})",
            t0.elapsed(),
            b.log.display()
        );
        b
    }

    /// Waits until the broker answers a metadata request (panics after 60 s).
    fn wait_metadata(&self) {
        let consumer = base_consumer(&self.bootstrap());
        let mut last;
        let start = Instant::now();
        loop {
            match consumer.fetch_metadata(None, Duration::from_secs(5)) {
                Ok(md) if !md.brokers().is_empty() => return,
                Ok(_) => last = "metadata without brokers".into(),
                Err(e) => last = e.to_string(),
            }
            if start.elapsed() > BROKER_START_DEADLINE {
                panic!(
                    "timed out after {:?} waiting for broker {} to answer a metadata request: {last}",
                    start.elapsed(),
                    self.bootstrap()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The broker's stdout+stderr log file.
    pub fn log_file(&self) -> PathBuf {
        self.log.clone()
    }

    /// Kills the broker now (SIGKILL; with in-memory storage its topics and records are gone).
    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the broker process: connections stay open
    /// but nothing is answered, as with a hung broker.
    pub fn pause(&self, paused: bool) {
        let g = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(child) = g.as_ref() {
            let signal = if paused { libc::SIGSTOP } else { libc::SIGCONT };
            // SAFETY: kill(2) on a child process id this harness owns.
            unsafe { libc::kill(child.id() as i32, signal) };
        }
    }

    pub fn stop(&self) {
        let mut g = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut c) = g.take() {
            let _ = c.kill();
            let _ = c.wait();
            run::unregister_child(c.id());
        }
    }

    /// Creates topic `name` with `partitions` partitions (replication factor 1) through the
    /// Kafka admin API, then waits until metadata shows all its partitions. An existing topic
    /// is accepted. Blocking (no tokio runtime needed); panics after 60 s.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .expect("creating an rdkafka AdminClient");
        let opts = AdminOptions::new()
            .request_timeout(Some(Duration::from_secs(30)))
            .operation_timeout(Some(Duration::from_secs(30)));
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        // The admin future is completed by librdkafka's own thread: no runtime needed, and
        // request_timeout bounds it.
        let res = futures::executor::block_on(admin.create_topics([&topic], &opts));
        match res {
            Ok(results) => {
                for r in results {
                    match r {
                        Ok(_) => {}
                        Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                        Err((t, e)) => panic!("creating topic {t} on {}: {e}", self.bootstrap()),
                    }
                }
            }
            Err(e) => panic!("creating topic {name} on {}: {e}", self.bootstrap()),
        }
        self.wait_topic(name, partitions as usize, TOPIC_DEADLINE);
    }

    /// Waits until metadata shows topic `name` with at least `partitions` partitions, all with
    /// a leader; returns the partition count. Blocking; panics after `deadline`.
    pub fn wait_topic(&self, name: &str, partitions: usize, deadline: Duration) -> usize {
        topic_partitions(&self.bootstrap(), name, partitions, deadline)
    }

    /// Names of the topics the broker knows (blocking; panics after 30 s).
    pub fn topics(&self) -> Vec<String> {
        let consumer = base_consumer(&self.bootstrap());
        let md = consumer
            .fetch_metadata(None, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("listing topics on {}: {e}", self.bootstrap()));
        md.topics().iter().map(|t| t.name().to_string()).collect()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn base_consumer(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", super::unique_name("it_meta"))
        .set("allow.auto.create.topics", "false")
        .create()
        .expect("creating an rdkafka BaseConsumer")
}

/// Blocking: waits until `topic` shows up with >= `min_partitions` partitions (each with a
/// leader) and returns how many it has.
fn topic_partitions(
    bootstrap: &str,
    topic: &str,
    min_partitions: usize,
    deadline: Duration,
) -> usize {
    let consumer = base_consumer(bootstrap);
    let start = Instant::now();
    let mut last;
    loop {
        match consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            Ok(md) => match md.topics().iter().find(|t| t.name() == topic) {
                Some(t) if t.error().is_some() => last = format!("topic error {:?}", t.error()),
                Some(t) => {
                    let n = t.partitions().len();
                    let led = t
                        .partitions()
                        .iter()
                        .all(|p| p.leader() >= 0 && p.error().is_none());
                    if n >= min_partitions.max(1) && led {
                        return n;
                    }
                    last = format!("{n} partitions (all with leader: {led})");
                }
                None => last = "not in metadata".into(),
            },
            Err(e) => last = e.to_string(),
        }
        if start.elapsed() >= deadline {
            panic!(
                "timed out after {:?} waiting for topic {topic} on {bootstrap} to have {min_partitions} partition(s): {last}",
                start.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An idempotent producer (`enable.idempotence=true`, `acks=all`) for tests that publish
/// themselves. Use it on one runtime only.
pub fn producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("creating an rdkafka FutureProducer")
}

/// A record as a consumer saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumed {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// Key bytes (None for a null key).
    pub key: Option<Vec<u8>>,
    /// Value bytes (None for a tombstone).
    pub value: Option<Vec<u8>>,
    /// Headers in record order (a header value may be null).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Record timestamp in ms since the epoch, if the record has one.
    pub timestamp_ms: Option<i64>,
}

impl Consumed {
    /// The key as UTF-8 (lossy).
    pub fn key_str(&self) -> Option<String> {
        self.key
            .as_deref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// The value as UTF-8 (lossy).
    pub fn value_str(&self) -> Option<String> {
        self.value
            .as_deref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// The value of the first header named `name`: None if absent, Some(None) if null.
    pub fn header(&self, name: &str) -> Option<Option<&[u8]>> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_deref())
    }

    /// The value of the first header named `name` as UTF-8 (lossy); None if absent or null.
    pub fn header_str(&self, name: &str) -> Option<String> {
        self.header(name)
            .flatten()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

/// Reads `topics` from the beginning (all partitions assigned explicitly at offset Beginning;
/// no consumer-group membership, a unique group.id) until at least `expected` records arrived,
/// then keeps reading for `settle` more to catch duplicates. Panics at `deadline` (from the
/// call) with how many arrived, and also if a topic does not exist by then. Returns the records
/// sorted by (topic, partition, offset), i.e. in offset order per partition.
pub async fn consume(
    bootstrap: &str,
    topics: &[&str],
    expected: usize,
    settle: Duration,
    deadline: Duration,
) -> Vec<Consumed> {
    consume_with(bootstrap, topics, expected, settle, deadline, &[]).await
}

/// Like [`consume`], with extra consumer properties (e.g. `isolation.level`; librdkafka's
/// default is `read_committed`).
pub async fn consume_with(
    bootstrap: &str,
    topics: &[&str],
    expected: usize,
    settle: Duration,
    deadline: Duration,
    properties: &[(&str, &str)],
) -> Vec<Consumed> {
    let start = Instant::now();
    let end = start + deadline;

    // Partition discovery is blocking librdkafka work: keep it off the runtime's thread.
    let owned: Vec<String> = topics.iter().map(|s| s.to_string()).collect();
    let bs = bootstrap.to_string();
    let parts: Vec<(String, usize)> = tokio::task::spawn_blocking(move || {
        owned
            .into_iter()
            .map(|t| {
                let left = end.saturating_duration_since(Instant::now());
                let n = topic_partitions(&bs, &t, 1, left);
                (t, n)
            })
            .collect()
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));

    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", super::unique_name("it_consume"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("allow.auto.create.topics", "false")
        .set("fetch.wait.max.ms", "100");
    for (key, value) in properties {
        config.set(*key, *value);
    }
    let consumer: StreamConsumer = config.create().expect("creating an rdkafka StreamConsumer");
    let mut tpl = TopicPartitionList::new();
    for (t, n) in &parts {
        for p in 0..*n as i32 {
            tpl.add_partition_offset(t, p, Offset::Beginning)
                .expect("building the assignment");
        }
    }
    consumer
        .assign(&tpl)
        .unwrap_or_else(|e| panic!("assigning {parts:?}: {e}"));

    let mut out: Vec<Consumed> = Vec::new();
    let mut settle_end: Option<Instant> = None;
    let mut last_err: Option<String> = None;
    loop {
        let now = Instant::now();
        if settle_end.is_none() && out.len() >= expected {
            settle_end = Some(now + settle);
        }
        let wake = settle_end.unwrap_or(end);
        if now >= wake {
            if settle_end.is_some() {
                break;
            }
            panic!(
                "timed out after {:?} waiting for {expected} record(s) from {topics:?} on {bootstrap}: \
                 {} arrived{}",
                start.elapsed(),
                out.len(),
                last_err.map(|e| format!(" (last consumer error: {e})")).unwrap_or_default()
            );
        }
        match tokio::time::timeout(wake - now, consumer.recv()).await {
            Err(_) => {}
            Ok(Err(e)) => last_err = Some(e.to_string()),
            Ok(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_string(), h.value.map(|v| v.to_vec())))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Consumed {
                    topic: m.topic().to_string(),
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(|k| k.to_vec()),
                    value: m.payload().map(|v| v.to_vec()),
                    headers,
                    timestamp_ms: m.timestamp().to_millis(),
                });
            }
        }
    }
    out.sort_by(|a, b| (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset)));
    out
}
