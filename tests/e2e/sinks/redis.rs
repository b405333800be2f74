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
    args = crate::as_command(&args, "check");
    let mut check = crate::support::Relay::spawn(&args);
    let status = check.wait(std::time::Duration::from_secs(60));
    let log = check.log();
    // The harness's server runs with appendonly yes and appendfsync always.
    assert!(
        log.contains("ok    redis")
            && log.contains("appendfsync always: an acknowledged entry is on disk"),
        "{status}:\n{log}"
    );

    let port = free_port();
    let down = Redis(start(port));
    down.0.stop();
    let (_dir, mut args) = super::relay_args(&setup, &down, "");
    args = crate::as_command(&args, "check");
    let mut check = crate::support::Relay::spawn(&args);
    let status = check.wait(std::time::Duration::from_secs(60));
    let log = check.log();
    assert!(
        !status.success(),
        "check passed with the Redis server down:\n{log}"
    );
    assert!(
        log.contains("FAIL  redis") && log.contains(&format!("127.0.0.1:{port}")),
        "{log}"
    );
}

/// The server down for longer than `delivery_timeout_ms`: sessions fail and the supervisor
/// reconnects with backoff until it is back; nothing is lost or confirmed early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_delivery_timeout_loses_nothing() {
    use std::time::Duration;

    use crate::{assert_delivered, write_events};

    let setup = super::setup("redis_outage", &["Order"]).await;
    let server = Redis(start(free_port()));
    let destinations = setup.topics();
    let toml = format!(
        "[[pipelines]]\nname = \"{slot}\"\nsource_url = \"{url}\"\nslot = \"{slot}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n[pipelines.sink]\nkind = \"redis\"\n{settings}\ndelivery_timeout_ms = 1500\n",
        slot = setup.slot,
        url = setup.db.url(crate::support::Auth::Trust),
        settings = server.sink_settings(),
    );
    let (_dir, args) = crate::run_with_config(&toml);
    let relay = crate::support::Relay::spawn(&args);
    setup.wait_streaming().await;
    server.0.stop();
    let witness = setup.witness().await;
    let (written, before_commit) = write_events(
        &setup.db.client,
        10,
        3,
        &setup.types,
        4,
        0,
        Duration::from_millis(200),
    )
    .await;
    let first_commit = setup.commit_end_of(&witness, &written[0].id).await;
    // Well past the delivery timeout: several sessions fail meanwhile.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < first_commit,
        "confirmed_flush_lsn {confirmed:X} passed a commit ({first_commit:X}) with Redis down"
    );
    let log = relay.log();
    assert!(
        log.contains("cannot connect to the redis sink") || log.contains("publishing failed"),
        "the relay says why it makes no progress:\n{}",
        crate::support::tail_lines(&log, 30)
    );
    server.0.start();
    let got = super::read_until(
        &server,
        &destinations,
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(90),
    )
    .await;
    assert_delivered(&written, &got, false);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the slot to be confirmed once Redis is back",
            Duration::from_secs(60),
        )
        .await;
    drop(relay);
}

/// The polling source with Redis down for longer than `delivery_timeout_ms`: once it is back,
/// every row is published and marked PUBLISHED (none stays held or ends FAILED), per key in
/// order. (A sink that kept a failed key held for the whole session failed this.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_through_an_outage_longer_than_the_delivery_timeout() {
    use std::time::Duration;

    use crate::support::wait_for;
    use crate::{assert_delivered, write_events};

    let setup = super::setup("redis_poll_outage", &["Order"]).await;
    let server = Redis(start(free_port()));
    let destinations = setup.topics();
    let (_dir, args) =
        super::polling_relay_args(&setup, &server, "delivery_timeout_ms = 1500").await;
    let relay = crate::support::Relay::spawn(&args);
    let client = &setup.db.client;
    let (mut written, _) = write_events(client, 5, 2, &setup.types, 3, 0, Duration::ZERO).await;
    super::read_until(
        &server,
        &destinations,
        written.len(),
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    server.0.stop();
    let (during, _) = write_events(
        client,
        10,
        2,
        &setup.types,
        3,
        10,
        Duration::from_millis(300),
    )
    .await;
    written.extend(during);
    tokio::time::sleep(Duration::from_secs(4)).await;
    server.0.start();
    let (after, _) = write_events(client, 5, 2, &setup.types, 3, 40, Duration::ZERO).await;
    written.extend(after);
    let got = super::read_until(
        &server,
        &destinations,
        written.len(),
        Duration::from_secs(1),
        Duration::from_secs(120),
    )
    .await;
    assert_delivered(&written, &got, false);
    wait_for("every outbox row to be marked PUBLISHED", Duration::from_secs(60), || async {
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE status <> 'PUBLISHED'), count(*) FILTER (WHERE status = 'FAILED') FROM outbox",
                &[],
            )
            .await
            .unwrap();
        let (unpublished, failed): (i64, i64) = (row.get(0), row.get(1));
        assert_eq!(failed, 0, "rows marked FAILED although Redis came back");
        (unpublished == 0).then_some(())
    })
    .await;
    drop(relay);
}

/// `rediss://`: the server's certificate is verified against the system's roots
/// (`SSL_CERT_FILE` here), events arrive; without the CA among the roots the relay refuses the
/// server and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verifies_the_server_and_delivers() {
    use std::time::Duration;

    use crate::support::{pg, Relay};
    use crate::{assert_delivered, write_events};

    let setup = super::setup("redis_tls", &["Order"]).await;
    let ca = pg().ca_cert();
    let port = free_port();
    let tls = crate::support::redis::start_tls(port, ca.parent().unwrap());
    let toml = format!(
        "[[pipelines]]\nname = \"{slot}\"\nsource_url = \"{url}\"\nslot = \"{slot}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n[pipelines.sink]\nkind = \"redis\"\nurl = \"rediss://localhost:{port}\"\n",
        slot = setup.slot,
        url = setup.db.url(crate::support::Auth::Trust),
    );
    let (_dir, args) = crate::run_with_config(&toml);

    // Without the CA among the trusted roots: refused, and the log says it is the certificate.
    let empty_roots = tempfile::NamedTempFile::new().unwrap();
    let mut untrusting = Relay::spawn_with_env(
        &args,
        &[("SSL_CERT_FILE", &empty_roots.path().display().to_string())],
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let log = untrusting.log();
        if log.contains("cannot connect to the redis sink")
            && log.to_lowercase().contains("certificate")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the relay did not say within 60 s that it refuses the certificate:\n{}",
            crate::support::tail_lines(&log, 20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    untrusting.kill();

    let relay = Relay::spawn_with_env(&args, &[("SSL_CERT_FILE", &ca.display().to_string())]);
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 5, 2, &setup.types, 2, 0, Duration::ZERO).await;
    // Read over TLS too: the test's client trusts the same CA.
    let reader = redis::Client::build_with_tls(
        format!("rediss://localhost:{port}"),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(&ca).unwrap()),
        },
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let stream = &setup.topics()[0];
    let got = loop {
        let mut connection = reader.get_multiplexed_async_connection().await.unwrap();
        let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(&mut connection)
            .await
            .unwrap();
        if entries.len() >= written.len() || std::time::Instant::now() > deadline {
            break entries;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let consumed: Vec<Consumed> = got
        .into_iter()
        .enumerate()
        .map(|(offset, (_, fields))| {
            let mut record = Consumed {
                topic: stream.clone(),
                partition: 0,
                offset: offset as i64,
                key: None,
                value: None,
                headers: Vec::new(),
                timestamp_ms: None,
            };
            for pair in fields.chunks(2) {
                let field = String::from_utf8_lossy(&pair[0]).into_owned();
                match field.as_str() {
                    "key" => record.key = Some(pair[1].clone()),
                    "payload" => record.value = Some(pair[1].clone()),
                    _ => record.headers.push((field, Some(pair[1].clone()))),
                }
            }
            record
        })
        .collect();
    assert_delivered(&written, &consumed, true);
    drop(relay);
    drop(tls);
}

/// A password with `@`, `#` and `/` given as `sink.password` beside a URL without one: taken
/// as written, no percent-encoding, and the server that requires it takes the events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_beside_the_url_is_taken_as_written() {
    use std::time::Duration;

    use crate::support::Relay;

    const TRICKY: &str = "p@ss#w/rd:1?x";
    let server = start(free_port());
    let url = redis_url(&server);
    let admin = redis::Client::open(url.as_str()).unwrap();
    let mut connection = within(
        "connecting to redis-server",
        Duration::from_secs(30),
        admin.get_multiplexed_async_connection(),
    )
    .await
    .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(TRICKY)
        .query_async(&mut connection)
        .await
        .unwrap();
    let setup = super::setup("redis_password", &["Order"]).await;
    let toml = format!(
        "[[pipelines]]\nname = \"{slot}\"\nsource_url = \"{source}\"\nslot = \"{slot}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n[pipelines.sink]\nkind = \"redis\"\nurl = \"{url}\"\npassword = \"${{REDIS_PASSWORD}}\"\n",
        slot = setup.slot,
        source = setup.db.url(crate::support::Auth::Trust),
    );
    let (_dir, args) = crate::run_with_config(&toml);
    let relay = Relay::spawn_with_env(&args, &[("REDIS_PASSWORD", TRICKY)]);
    setup.wait_streaming().await;
    let id = setup
        .db
        .insert_event(&setup.types[0], "1", "Created", Some("{}"), None)
        .await;
    let reader = redis::Client::open(
        redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .map(|info| {
                let settings = info.redis_settings().clone().set_password(TRICKY);
                info.set_redis_settings(settings)
            })
            .unwrap(),
    )
    .unwrap();
    let stream = &setup.topics()[0];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut connection = reader.get_multiplexed_async_connection().await.unwrap();
        let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(&mut connection)
            .await
            .unwrap();
        if let Some((_, fields)) = entries.first() {
            assert!(
                fields.iter().any(|f| f == id.as_bytes()),
                "the entry names event {id}: {fields:?}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no entry in {stream} within 60 s:\n{}",
            crate::support::tail_lines(&relay.log(), 20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!relay.log().contains(TRICKY), "the password was logged");
}
