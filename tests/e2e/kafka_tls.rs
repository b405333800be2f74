//! Kafka over TLS (`security.protocol=SSL`, librdkafka built with OpenSSL): a private tansu
//! behind a TLS front (`tests/support/tls_front.rs`; tansu has no TLS listener) advertising the
//! front's `localhost` address, the certificate the test cluster's CA signed for `localhost`.

use std::time::Duration;

use crate::support::tls_front::TlsFront;
use crate::support::{consume, free_port, pg, tail_lines, unique_name, Auth, Broker, Relay};
use crate::{assert_delivered, write_events, Setup};

/// Without the CA the relay trusts nothing the front shows (`check` fails naming the
/// certificate); with `ssl.ca.location` it verifies the broker and delivers every event over
/// TLS, and the slot is confirmed past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_verifies_the_brokers_certificate_and_delivers_over_tls() {
    let ca = pg().ca_cert();
    let certs = ca.parent().unwrap();
    let front_port = free_port();
    let broker = Broker::start_advertising(free_port(), &format!("localhost:{front_port}"));
    let front = TlsFront::start(
        front_port,
        broker.port(),
        &certs.join("server.crt"),
        &certs.join("server.key"),
    )
    .await;
    let name = unique_name("kafka_tls");
    let setup = Setup {
        db: pg().create_database(&name).await,
        slot: format!("{name}_slot"),
        types: vec![format!("Order_{name}")],
    };
    let topic = setup.topics().remove(0);
    broker.create_topic(&topic, 1);
    let bootstrap = format!("localhost:{front_port}");
    let with = |properties: &[String]| {
        let mut args = setup.relay_args(&bootstrap, Auth::Trust);
        for property in properties {
            args.extend(["--kafka-property".to_string(), property.clone()]);
        }
        args
    };

    let mut check = with(&["security.protocol=SSL".into()]);
    check = crate::as_command(&check, "check");
    let mut relay = Relay::spawn(&check);
    let status = relay.wait(Duration::from_secs(90));
    let log = relay.log();
    assert!(
        !status.success(),
        "check passed with a broker certificate no trusted root signed:\n{log}"
    );
    assert!(
        log.contains("certificate verify failed"),
        "check names the certificate:\n{}",
        tail_lines(&log, 30)
    );
    assert_eq!(front.tls_connections(), 0, "a TLS handshake completed");

    let relay = Relay::spawn(&with(&[
        "security.protocol=SSL".into(),
        format!("ssl.ca.location={}", ca.display()),
    ]));
    setup.wait_streaming().await;
    let (written, before_commit) =
        write_events(&setup.db.client, 5, 2, &setup.types, 3, 0, Duration::ZERO).await;
    let consumed = consume(
        &broker.bootstrap(),
        &[topic.as_str()],
        written.len(),
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&written, &consumed, false);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the slot confirmed past the last commit",
            Duration::from_secs(30),
        )
        .await;
    assert!(
        front.tls_connections() >= 1,
        "the relay delivered without a TLS connection ({} plaintext ones: the harness's)",
        front.plaintext_connections()
    );
    drop(relay);
}
