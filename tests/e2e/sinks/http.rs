//! The HTTP webhook sink against a real receiver in the test process (an axum server on a
//! port of its own: tests/support/webhook.rs): the shared scenarios, then what is the HTTP
//! sink's own: the Standard Webhooks signature, 429/503 retried (Retry-After), 413 to a
//! dead-letter URL of its own, the polling source, and `check`.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_relay::sink::http::signature::SigningKey;

use crate::support::webhook::{Received, WebhookServer};
use crate::support::{free_port, unique_name, wait_for, Auth, Consumed, Relay};
use crate::{assert_delivered, insert, run_with_config, write_events, Written};

use super::{read_until, relay_args, setup, sink_scenarios, SinkServer};

/// Where the URL template puts the destination.
const HOOKS: &str = "/hooks/";

/// A receiver and the sink settings a test posts to it with.
struct Webhooks {
    server: Arc<WebhookServer>,
    /// More `[pipelines.sink]` lines (TOML).
    extra: String,
    /// The URL's scheme, host and port, if not the server's own [`WebhookServer::base_url`].
    base_url: Option<String>,
}

impl Webhooks {
    fn new(server: WebhookServer) -> Webhooks {
        Webhooks {
            server: Arc::new(server),
            extra: String::new(),
            base_url: None,
        }
    }

    /// The run's receiver with more sink settings.
    fn shared_with(extra: &str) -> Webhooks {
        Webhooks {
            server: Arc::clone(&shared().server),
            extra: extra.to_owned(),
            base_url: None,
        }
    }
}

/// The run's receiver, started on first use.
fn shared() -> &'static Webhooks {
    static SERVER: OnceLock<Webhooks> = OnceLock::new();
    SERVER.get_or_init(|| Webhooks::new(WebhookServer::spawn(free_port())))
}

/// `record` as a consumer sees it: the `outbox-` headers (the key's apart) and the body,
/// `None` for a request without `Content-Type` (a tombstone).
fn consumed(record: &Received, destination: &str, offset: usize) -> Consumed {
    let mut out = Consumed {
        topic: destination.to_owned(),
        partition: 0,
        offset: offset as i64,
        key: record.header("outbox-key").map(<[u8]>::to_vec),
        value: record.header("content-type").map(|_| record.body.clone()),
        headers: Vec::new(),
        timestamp_ms: None,
    };
    for (name, value) in &record.headers {
        if let Some(name) = name.strip_prefix("outbox-").filter(|n| *n != "key") {
            out.headers.push((name.to_owned(), Some(value.clone())));
        }
    }
    out
}

/// Waits (up to `deadline`) until as many records as `written` reached `destinations`, then
/// checks that every event arrived, per key in order (duplicates allowed).
async fn all_arrive(
    server: &Webhooks,
    destinations: &[String],
    written: &[Written],
    deadline: Duration,
) {
    let got = read_until(
        server,
        destinations,
        written.len(),
        Duration::from_secs(1),
        deadline,
    )
    .await;
    assert_delivered(written, &got, false);
}

impl SinkServer for Webhooks {
    fn kind(&self) -> &'static str {
        "http"
    }

    fn sink_settings(&self) -> String {
        format!(
            "url = \"{}{HOOKS}{{destination}}\"\nrequest_timeout_ms = 5000\n{}",
            self.base_url
                .clone()
                .unwrap_or_else(|| self.server.base_url()),
            self.extra
        )
    }

    async fn prepare(&self, _destinations: &[String]) {
        // Every path is a destination.
    }

    async fn read(&self, destinations: &[String]) -> Vec<Consumed> {
        let received = self.server.received();
        let mut out = Vec::new();
        for destination in destinations {
            let path = format!("{HOOKS}{destination}");
            let mine = received.iter().filter(|r| r.path == path);
            out.extend(mine.enumerate().map(|(i, r)| consumed(r, destination, i)));
        }
        out
    }

    async fn refuse(&self, destination: &str) {
        self.server
            .answer(&format!("{HOOKS}{destination}"), Some((400, None)));
    }

    fn stop(&self) {
        self.server.stop();
    }

    fn start(&self) {
        self.server.start();
    }

    fn invalid_aggregate_type(&self) -> &'static str {
        // A control character: no URL should carry it, even percent-encoded.
        "Bad\ttype"
    }
}

sink_scenarios!(
    shared(),
    Webhooks::new(WebhookServer::spawn(free_port())),
    bad_routing_input
);

/// A line break in a header value, which no HTTP header carries (a receiver's 431 is the same
/// case): the dead-letter copy goes out all the same and the next row follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_no_request_can_carry_is_dead_lettered_and_the_next_row_follows() {
    super::hostile_headers_are_dead_lettered(shared(), r#"{"trace": "a\nb"}"#).await;
}

/// One transaction of 300 events of one aggregate to a receiver that takes 20 ms per request,
/// with `delivery_timeout_ms = 2000`: the last event waits 6 s behind the others, which must
/// not count against its own timeout. Every event arrives once, in order, and the slot is
/// confirmed. (The timeout ran from when the record was handed over: the session failed at
/// about the 100th event, every time, republishing the ones before it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_transaction_of_one_aggregate_on_a_slow_receiver_is_not_timed_out() {
    let mut server = Webhooks::new(WebhookServer::spawn(free_port()));
    server.extra = "delivery_timeout_ms = 2000".into();
    let setup = setup("http_slow", &["Order"]).await;
    let destinations = setup.topics();
    server.server.delay(
        &format!("{HOOKS}{}", destinations[0]),
        Duration::from_millis(20),
    );
    let (_dir, args) = relay_args(&setup, &server, "");
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (written, before_commit) =
        write_events(&setup.db.client, 1, 300, &setup.types, 1, 0, Duration::ZERO).await;
    let got = read_until(
        &server,
        &destinations,
        written.len(),
        Duration::from_secs(2),
        Duration::from_secs(120),
    )
    .await;
    assert_delivered(&written, &got, true);
    setup
        .wait_confirmed_past(
            before_commit[0],
            "the slot to be confirmed past the transaction",
            Duration::from_secs(30),
        )
        .await;
    drop(relay);
}

/// Each request carries `webhook-id` (the event id), a current `webhook-timestamp` and a
/// `webhook-signature` that the Standard Webhooks scheme verifies with the secret from
/// `secret_file` (and not with another secret).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_signed_with_the_secret_from_secret_file() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("webhook-secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let server = Webhooks::shared_with(&format!("secret_file = \"{}\"", secret_file.display()));
    let setup = setup("http_signed", &["Order"]).await;
    let destinations = setup.topics();
    let (_dir, args) = relay_args(&setup, &server, "");
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 3, 2, &setup.types, 2, 0, Duration::ZERO).await;
    read_until(
        &server,
        &destinations,
        written.len(),
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    drop(relay);
    let path = format!("{HOOKS}{}", destinations[0]);
    let requests: Vec<Received> = server
        .server
        .received()
        .into_iter()
        .filter(|r| r.path == path)
        .collect();
    let key = SigningKey::new(secret).unwrap();
    let other = SigningKey::new("whsec_Zm9vYmFy").unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let text = |r: &Received, name: &str| {
        String::from_utf8(
            r.header(name)
                .unwrap_or_else(|| panic!("no {name} header"))
                .to_vec(),
        )
        .unwrap()
    };
    for r in &requests {
        assert_eq!(r.method, "POST");
        let id = text(r, "webhook-id");
        assert_eq!(id, text(r, "outbox-id"), "webhook-id is the event id");
        assert_eq!(text(r, "content-type"), "application/json");
        let timestamp: u64 = text(r, "webhook-timestamp").parse().unwrap();
        assert!(
            now.abs_diff(timestamp) < 120,
            "webhook-timestamp {timestamp}, now {now}"
        );
        let signature = text(r, "webhook-signature");
        assert_eq!(
            signature,
            key.sign(&id, timestamp, &r.body),
            "signature of {id}"
        );
        assert_ne!(signature, other.sign(&id, timestamp, &r.body));
    }
    assert!(
        requests.len() >= written.len(),
        "{} requests",
        requests.len()
    );
}

/// 429 and 503 (with `Retry-After`) are retried until the receiver takes the records: none
/// is lost or out of order, and nothing is confirmed while they are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_and_unavailable_answers_are_retried_until_taken() {
    let server = shared();
    let setup = setup("http_busy", &["Order"]).await;
    let destinations = setup.topics();
    let path = format!("{HOOKS}{}", destinations[0]);
    server.server.answer(&path, Some((429, Some(1))));
    let (_dir, args) = relay_args(&setup, server, "");
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let witness = setup.witness().await;
    let (written, before_commit) =
        write_events(&setup.db.client, 6, 2, &setup.types, 2, 0, Duration::ZERO).await;
    let first_commit = setup.commit_end_of(&witness, &written[0].id).await;
    let refused_at_least = |n: usize| {
        let server = &server.server;
        let path = path.clone();
        async move { (server.refused(&path) >= n).then_some(()) }
    };
    wait_for("two 429 answers", Duration::from_secs(30), || {
        refused_at_least(2)
    })
    .await;
    server.server.answer(&path, Some((503, None)));
    wait_for("two 503 answers more", Duration::from_secs(30), || {
        refused_at_least(4)
    })
    .await;
    let confirmed = setup.confirmed_flush().await;
    assert!(
        confirmed < first_commit,
        "confirmed_flush_lsn {confirmed:X} passed a commit ({first_commit:X}) the receiver refused"
    );
    assert!(server.read(&destinations).await.is_empty());
    server.server.answer(&path, None);
    all_arrive(server, &destinations, &written, Duration::from_secs(90)).await;
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the slot to be confirmed once the receiver takes the records",
            Duration::from_secs(30),
        )
        .await;
    drop(relay);
}

/// A 413 is a refusal as too large: with `on_bad_event = "dead_letter"` and an absolute URL as
/// `dead_letter_topic`, the copy goes to that URL naming the answer, and the rest flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_large_goes_to_a_dead_letter_url_of_its_own() {
    let server = shared();
    let setup = setup("http_413", &["Order", "Huge"]).await;
    let destinations = setup.topics();
    server
        .server
        .answer(&format!("{HOOKS}{}", destinations[1]), Some((413, None)));
    let dead_path = format!("/dead/{}", setup.slot);
    let extra = format!(
        "on_bad_event = \"dead_letter\"\ndead_letter_topic = \"{}{dead_path}\"",
        server.server.base_url()
    );
    let (_dir, args) = relay_args(&setup, server, &extra);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let client = &setup.db.client;
    let huge = insert(client, &setup.types[1], "k1", r#"{"n": 1}"#).await;
    let after = insert(client, &setup.types[0], "k1", r#"{"n": 2}"#).await;
    let got = read_until(
        server,
        &destinations[..1],
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    assert_delivered(&[after], &got, true);
    let dead = wait_for(
        "the dead-letter copy at its URL",
        Duration::from_secs(60),
        || async {
            let received = server.server.received();
            received.into_iter().find(|r| r.path == dead_path)
        },
    )
    .await;
    assert_eq!(dead.header("outbox-id"), Some(huge.id.as_bytes()));
    let reason = String::from_utf8_lossy(dead.header("outbox-outbox_relay_error").unwrap());
    assert!(
        reason.contains("413"),
        "the copy names the answer: {reason}"
    );
    drop(relay);
}

/// The polling source publishes through the HTTP sink and marks the rows once acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_source_posts_every_row_and_marks_it() {
    let server = shared();
    let name = unique_name("http_polling");
    let db = crate::polling::polling_database(&name).await;
    let aggregate_type = format!("Order_{name}");
    let destination = format!("{aggregate_type}.events");
    let toml = format!(
        "[[pipelines]]\nname = \"{name}\"\nsource_url = \"{url}\"\nsource_kind = \"polling\"\ntable = \"public.outbox\"\n[pipelines.sink]\nkind = \"http\"\n{settings}\n",
        url = db.url(Auth::Trust),
        settings = server.sink_settings(),
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    let mut written = Vec::new();
    for n in 0..12 {
        let key = format!("k{}", n % 3);
        written.push(
            insert(
                &db.client,
                &aggregate_type,
                &key,
                &format!(r#"{{"n": {n}}}"#),
            )
            .await,
        );
    }
    let destinations = [destination];
    all_arrive(server, &destinations, &written, Duration::from_secs(60)).await;
    wait_for(
        "every row marked PUBLISHED",
        Duration::from_secs(30),
        || async {
            let row = db
                .client
                .query_one(
                    "SELECT count(*) FROM outbox WHERE status <> 'PUBLISHED'",
                    &[],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0) == 0).then_some(())
        },
    )
    .await;
    drop(relay);
}

/// Polling, one aggregate's three rows in one cycle, the receiver answering 503: the first row
/// is tried until `delivery_timeout_ms` and charged an attempt; the two behind it were never
/// sent, so they stay pending with no attempt charged (they were charged as if tried, and could
/// end FAILED). Once the receiver takes them, all three arrive in order and are PUBLISHED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_charges_no_attempt_to_rows_held_behind_a_failed_one() {
    let server = Webhooks::shared_with("delivery_timeout_ms = 500");
    let name = unique_name("http_untried");
    let db = crate::polling::polling_database(&name).await;
    let aggregate_type = format!("Order_{name}");
    let destination = format!("{aggregate_type}.events");
    let path = format!("{HOOKS}{destination}");
    server.server.answer(&path, Some((503, None)));
    let mut written = Vec::new();
    for n in 0..3 {
        written.push(
            insert(
                &db.client,
                &aggregate_type,
                "k1",
                &format!(r#"{{"n": {n}}}"#),
            )
            .await,
        );
    }
    let toml = format!(
        "[[pipelines]]\nname = \"{name}\"\nsource_url = \"{url}\"\nsource_kind = \"polling\"\ntable = \"public.outbox\"\n[pipelines.polling]\nretry_min_ms = 200\nretry_max_ms = 400\n[pipelines.sink]\nkind = \"http\"\n{settings}\n",
        url = db.url(Auth::Trust),
        settings = server.sink_settings(),
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    let attempts = || async {
        let rows = db
            .client
            .query(
                "SELECT retry_count FROM outbox ORDER BY created_at, id",
                &[],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| r.get::<_, i32>(0))
            .collect::<Vec<i32>>()
    };
    wait_for(
        "the first row to be charged two attempts",
        Duration::from_secs(60),
        || async { (attempts().await[0] >= 2).then_some(()) },
    )
    .await;
    let charged = attempts().await;
    assert_eq!(
        &charged[1..],
        [0, 0],
        "attempts charged to rows never sent: {charged:?}"
    );
    server.server.answer(&path, None);
    all_arrive(&server, &[destination], &written, Duration::from_secs(60)).await;
    wait_for(
        "every row marked PUBLISHED",
        Duration::from_secs(30),
        || async {
            let row = db
                .client
                .query_one(
                    "SELECT count(*) FROM outbox WHERE status <> 'PUBLISHED'",
                    &[],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0) == 0).then_some(())
        },
    )
    .await;
    drop(relay);
}

/// `https` with `sslmode=verify-full`'s trust settings: delivered with the test CA as
/// `tls_root_cert`; `check` fails, naming the certificate, with the system trust store (which
/// does not hold the test CA) and with the CA but a host the certificate is not for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_trusts_tls_root_cert_and_checks_the_host_name() {
    let ca = crate::support::pg().ca_cert();
    let dir = ca.parent().unwrap();
    let tls = Arc::new(WebhookServer::spawn_tls(
        free_port(),
        &dir.join("server.crt"),
        &dir.join("server.key"),
    ));
    let with_ca = format!("tls_root_cert = \"{}\"", ca.display());
    let server = Webhooks {
        server: Arc::clone(&tls),
        extra: with_ca.clone(),
        base_url: None,
    };
    let setup = setup("http_tls", &["Order"]).await;
    let destinations = setup.topics();
    let (_dir, args) = relay_args(&setup, &server, "");
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 4, 2, &setup.types, 2, 0, Duration::ZERO).await;
    all_arrive(&server, &destinations, &written, Duration::from_secs(60)).await;
    drop(relay);

    let untrusted = Webhooks {
        server: Arc::clone(&tls),
        extra: String::new(),
        base_url: None,
    };
    let wrong_host = Webhooks {
        server: Arc::clone(&tls),
        extra: with_ca,
        base_url: Some(format!("https://127.0.0.1:{}", tls.port)),
    };
    for (server, expected) in [
        (&server, "  ok    http"),
        (&untrusted, "  FAIL  http"),
        (&wrong_host, "  FAIL  http"),
    ] {
        let (_dir, mut args) = relay_args(&setup, server, "");
        args = crate::as_command(&args, "check");
        let mut check = Relay::spawn(&args);
        check.wait(Duration::from_secs(60));
        let out = check.log();
        let line = out
            .lines()
            .find(|l| l.starts_with(expected))
            .unwrap_or_else(|| panic!("no line starting {expected:?} in:\n{out}"));
        eprintln!("{line}");
        if expected.contains("FAIL") {
            assert!(
                line.contains("certificate"),
                "the finding names the certificate: {line}"
            );
        }
    }
}

/// `check` finds the receiver reachable without posting anything, and names the host when
/// nothing listens there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_the_receiver_without_posting() {
    // Receivers of its own: what reached them is the check's alone.
    let up = Webhooks::new(WebhookServer::spawn(free_port()));
    let down = Webhooks::new(WebhookServer::spawn(free_port()));
    down.server.stop();
    let setup = setup("http_check", &["Order"]).await;
    for (server, expected) in [(&up, "  ok    http"), (&down, "  FAIL  http")] {
        let (_dir, mut args) = relay_args(&setup, server, "");
        args = crate::as_command(&args, "check");
        let mut check = Relay::spawn(&args);
        check.wait(Duration::from_secs(60));
        let out = check.log();
        let line = out
            .lines()
            .find(|l| l.starts_with(expected))
            .unwrap_or_else(|| panic!("no line starting {expected:?} in:\n{out}"));
        assert!(
            line.contains("127.0.0.1"),
            "the finding names the host: {line}"
        );
    }
    let methods: Vec<String> = up
        .server
        .received()
        .iter()
        .map(|r| r.method.to_string())
        .collect();
    assert_eq!(
        methods,
        ["OPTIONS"],
        "check sent one OPTIONS and posted nothing"
    );
}

/// CloudEvents in binary mode over HTTP (the HTTP binding): the `ce-` headers without the
/// `outbox-` prefix, values percent-encoded, `Content-Type` the `datacontenttype`, the body
/// the payload byte for byte; the trace column's `traceparent` without the prefix too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_cloudevents_post_ce_headers_and_the_payload() {
    let server = shared();
    let setup = setup("http_ce", &["Order"]).await;
    setup
        .db
        .client
        .batch_execute("ALTER TABLE outbox ADD COLUMN traceparent text")
        .await
        .unwrap();
    let destinations = setup.topics();
    let (_dir, args) = relay_args(
        &setup,
        server,
        "value_format = \"cloudevents\"\ncolumns = { timestamp = \"created_at\", traceparent = \"traceparent\" }\ncloudevents = { mode = \"binary\" }",
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let id: String = setup
        .db
        .client
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, traceparent)
             VALUES ($1, 'o 1 €', 'OrderCreated', '{\"total\": 12.50}', '2026-12-06 11:26:51.123+00',
                     '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')
             RETURNING id::text",
            &[&setup.types[0]],
        )
        .await
        .unwrap()
        .get(0);
    read_until(
        server,
        &destinations,
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    drop(relay);
    let path = format!("{HOOKS}{}", destinations[0]);
    let request = server
        .server
        .received()
        .into_iter()
        .find(|r| r.path == path)
        .unwrap();
    let text = |name: &str| {
        request
            .header(name)
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
    };
    let source = format!("/outbox-relay/{}/public.outbox", setup.db.name);
    for (name, value) in [
        ("content-type", "application/json"),
        ("ce-specversion", "1.0"),
        ("ce-id", id.as_str()),
        ("ce-source", source.as_str()),
        ("ce-type", "OrderCreated"),
        ("ce-subject", "o%201%20%E2%82%AC"),
        ("ce-time", "2026-12-06T11:26:51.123Z"),
        ("outbox-id", id.as_str()),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
    ] {
        assert_eq!(text(name).as_deref(), Some(value), "header {name}");
    }
    assert_eq!(text("outbox-ce-id"), None);
    assert_eq!(request.body, br#"{"total": 12.50}"#);
}

/// CloudEvents in structured mode over HTTP: `Content-Type: application/cloudevents+json`
/// and the JSON event format as the body, the jsonb payload as `data` byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_cloudevents_post_the_json_event_format() {
    let server = shared();
    let setup = setup("http_ce_structured", &["Order"]).await;
    let destinations = setup.topics();
    let (_dir, args) = relay_args(
        &setup,
        server,
        "value_format = \"cloudevents\"\ncolumns = { timestamp = \"created_at\" }",
    );
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let id: String = setup
        .db
        .client
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
             VALUES ($1, 'o-1', 'OrderCreated', '{\"total\": 12.50}', '2026-12-06 11:26:51.123+00')
             RETURNING id::text",
            &[&setup.types[0]],
        )
        .await
        .unwrap()
        .get(0);
    read_until(
        server,
        &destinations,
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    drop(relay);
    let path = format!("{HOOKS}{}", destinations[0]);
    let request = server
        .server
        .received()
        .into_iter()
        .find(|r| r.path == path)
        .unwrap();
    assert_eq!(
        request.header("content-type"),
        Some(&b"application/cloudevents+json; charset=UTF-8"[..])
    );
    let source = format!("/outbox-relay/{}/public.outbox", setup.db.name);
    assert_eq!(
        String::from_utf8(request.body.clone()).unwrap(),
        format!(
            r#"{{"specversion":"1.0","id":"{id}","source":"{source}","type":"OrderCreated","subject":"o-1","time":"2026-12-06T11:26:51.123Z","datacontenttype":"application/json","data":{{"total": 12.50}}}}"#
        )
    );
    assert_eq!(request.header("outbox-content-type"), None);
}
