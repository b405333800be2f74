//! Topics that do not exist: the records for one wait (the pipeline reads no further and is
//! `degraded`, the topic named once with the fix) and go out once it exists, without a session
//! restart publishing everything again; with `kafka.create_topics` the relay creates it.

use std::time::Duration;

use crate::support::{self, consume, http_get, kafka, wait_for, Auth, Relay};
use crate::{run_with_config, Setup};

/// The relay's arguments for `setup` with `--metrics-listen`, and the address.
fn with_metrics(setup: &Setup) -> (Vec<String>, String) {
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args.extend(["--metrics-listen".to_owned(), metrics.clone()]);
    (args, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_for_a_missing_topic_wait_named_once_and_go_out_once_it_exists() {
    let setup = Setup::new("missing_topic", &["Order"], 1).await;
    let (args, metrics) = with_metrics(&setup);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let missing = format!("Refund_{}", setup.slot);
    let topic = format!("{missing}.events");
    let first = setup
        .db
        .insert_event(&missing, "r-1", "Refunded", Some("{\"n\":1}"), None)
        .await;
    let second = setup
        .db
        .insert_event(&missing, "r-1", "Refunded", Some("{\"n\":2}"), None)
        .await;
    let body = wait_for(
        "/readyz to name the missing topic",
        Duration::from_secs(30),
        || async {
            http_get(&metrics, "/readyz")
                .await
                .filter(|(status, body)| *status == 503 && body.contains(&topic))
                .map(|(_, body)| body)
        },
    )
    .await;
    assert!(
        body.contains("\"degraded\"") && body.contains("kafka.create_topics"),
        "{body}"
    );
    // Longer than librdkafka's 30 s metadata propagation wait, after which a record sent to
    // a missing topic fails and a session would end.
    tokio::time::sleep(Duration::from_secs(35)).await;
    let log = relay.log();
    let warnings = log
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains(&topic))
        .count();
    assert_eq!(warnings, 1, "the missing topic is named once:\n{log}");
    assert!(!log.contains("reconnecting"), "a session ended:\n{log}");

    kafka().create_topic(&topic, 1);
    let consumed = consume(
        &kafka().bootstrap(),
        &[topic.as_str()],
        2,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await;
    let ids: Vec<String> = consumed
        .iter()
        .map(|r| r.header_str("id").unwrap_or_default())
        .collect();
    assert_eq!(ids, [first, second], "each once, in order");
    wait_for(
        "/readyz to say streaming once the topic exists",
        Duration::from_secs(30),
        || async {
            http_get(&metrics, "/readyz")
                .await
                .filter(|(status, _)| *status == 200)
        },
    )
    .await;
    assert!(relay.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_create_topics_the_relay_creates_a_missing_topic_before_its_first_record() {
    let setup = Setup::new("create_topic", &["Order"], 1).await;
    let toml = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[kafka.create_topics]\npartitions = 2\nreplication_factor = 1\n\
         [[pipelines]]\nname = \"p\"\nsource_url = \"{}\"\nslot = \"{}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n",
        kafka().bootstrap(),
        setup.db.url(Auth::Trust),
        setup.slot
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let missing = format!("Credit_{}", setup.slot);
    let topic = format!("{missing}.events");
    let id = setup
        .db
        .insert_event(&missing, "c-1", "Credited", Some("{}"), None)
        .await;
    let consumed = consume(
        &kafka().bootstrap(),
        &[topic.as_str()],
        1,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(consumed[0].header_str("id").as_deref(), Some(id.as_str()));
    assert_eq!(
        kafka().wait_topic(&topic, 2, Duration::from_secs(30)),
        2,
        "created with kafka.create_topics.partitions"
    );
    let log = relay.log();
    assert!(log.contains("created the topic"), "{log}");
}

/// With `on_bad_event = "dead_letter"`, a row naming a topic nobody made is bad input: it is
/// dead-lettered once the topic is found missing, and the rows after it flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_dead_lettering_a_row_for_a_missing_topic_is_dead_lettered_and_the_rest_flow() {
    let setup = Setup::new("missing_dlq", &["Order"], 1).await;
    let dead_letters = format!("{}.dead-letters", setup.slot);
    kafka().create_topic(&dead_letters, 1);
    let toml = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n\
         [[pipelines]]\nname = \"p\"\nsource_url = \"{}\"\nslot = \"{}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\non_bad_event = \"dead_letter\"\ndead_letter_topic = \"{dead_letters}\"\n",
        kafka().bootstrap(),
        setup.db.url(Auth::Trust),
        setup.slot
    );
    let (_dir, args) = run_with_config(&toml);
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let bogus = setup
        .db
        .insert_event(
            &format!("Nobody_{}", setup.slot),
            "x",
            "Bogus",
            Some("{}"),
            None,
        )
        .await;
    let good = setup
        .db
        .insert_event(&setup.types[0], "1", "Created", Some("{}"), None)
        .await;
    let delivered = setup
        .consume_all(1, Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_eq!(
        delivered[0].header_str("id").as_deref(),
        Some(good.as_str())
    );
    let copies = consume(
        &kafka().bootstrap(),
        &[dead_letters.as_str()],
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    let document = copies[0].value_str().unwrap_or_default();
    assert!(
        document.contains(&bogus) && document.contains("does not exist"),
        "{document}"
    );
    assert!(!relay.log().contains("reconnecting"), "{}", relay.log());
}
