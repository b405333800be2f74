//! Start-up validation of whole pipelines and config files (the checks of every layer
//! together), and the example file.

use figment::providers::{Format, Toml};
use figment::Figment;

use super::*;

/// Loads `toml` as [`load_file`] loads a file, with `env` as the environment of `${NAME}`.
fn load_str(toml: &str, env: &[(&str, &str)]) -> Result<RelayConfig, ConfigErrors> {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (relay, known) = file::resolve(Figment::new().merge(Toml::string(toml)), &move |name| {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    })?;
    with_known(&relay.pipelines, known)?;
    Ok(relay)
}

fn config() -> PipelineConfig {
    PipelineConfig::test_pipeline()
}

#[test]
fn accepts_defaults() {
    assert_eq!(pipeline(&config()), vec![]);
    let mut c = config();
    c.terminate_stale_walsender_after_secs = Some(2);
    assert_eq!(pipeline(&c), vec![]);
}

/// A field path and a change that breaks it.
type Breaks = Vec<(&'static str, Box<dyn Fn(&mut PipelineConfig)>)>;

#[test]
fn errors_name_the_field() {
    let cases: Breaks = vec![
        ("slot", Box::new(|c| c.slot = "Bad-Slot".into())),
        ("slot", Box::new(|c| c.slot = String::new())),
        ("publication", Box::new(|c| c.publication = String::new())),
        (
            "publication",
            Box::new(|c| c.publication = "\"Outbox-Pub\"".into()),
        ),
        (
            "source_url",
            Box::new(|c| c.source_url = "postgres://u:pw@h:notaport/db".into()),
        ),
        (
            "kafka.bootstrap_servers",
            Box::new(|c| c.kafka.bootstrap_servers = " ".into()),
        ),
        (
            "kafka.properties",
            Box::new(|c| c.kafka.properties = vec![("enable.idempotence".into(), "false".into())]),
        ),
        (
            "kafka.properties",
            Box::new(|c| c.kafka.properties = vec![("acks".into(), "1".into())]),
        ),
        (
            "max_in_flight_events",
            Box::new(|c| c.max_in_flight_events = 0),
        ),
        (
            "route.topic_template",
            Box::new(|c| c.route.topic_template = "orders/${routedByValue}".into()),
        ),
        (
            "route.by_field",
            Box::new(|c| {
                c.route.by_field = Some("tenant_id".into());
                c.message_prefix = Some("outbox".into());
            }),
        ),
        (
            "terminate_stale_walsender_after_secs",
            Box::new(|c| c.terminate_stale_walsender_after_secs = Some(1)),
        ),
        (
            "terminate_stale_walsender_after_secs",
            Box::new(|c| {
                c.status_interval_ms = 10_000;
                c.terminate_stale_walsender_after_secs = Some(15);
            }),
        ),
    ];
    for (field, mutate) in cases {
        let mut c = config();
        mutate(&mut c);
        let problems = pipeline(&c);
        let err = problems.first().expect("a problem");
        assert_eq!(err.field, field, "{err}");
        assert!(!err.to_string().contains("pw@"), "password leaked: {err}");
    }
}

#[test]
fn exactly_once_options_are_checked_with_their_field_paths() {
    type Mutate = Box<dyn Fn(&mut PipelineConfig)>;
    let cases: Vec<(&str, Mutate)> = vec![
        (
            "transactional_id",
            Box::new(|c| c.transactional_id = Some("relay-a".into())),
        ),
        (
            "checkpoint_topic",
            Box::new(|c| c.checkpoint_topic = Some("checkpoints".into())),
        ),
        (
            "transactional_id",
            Box::new(|c| {
                c.exactly_once = true;
                c.transactional_id = Some(String::new());
            }),
        ),
        (
            "checkpoint_topic",
            Box::new(|c| {
                c.exactly_once = true;
                c.checkpoint_topic = Some("check points".into());
            }),
        ),
        (
            "kafka.properties",
            Box::new(|c| {
                c.exactly_once = true;
                c.kafka.properties = vec![("transactional.id".into(), "x".into())];
            }),
        ),
    ];
    for (field, mutate) in cases {
        let mut c = config();
        mutate(&mut c);
        let problems = c.exactly_once_problems();
        assert!(
            problems.iter().any(|p| p.field == field),
            "{field}: {problems:?}"
        );
        assert_eq!(pipeline(&c)[0].field, problems[0].field);
    }
    let mut c = config();
    c.exactly_once = true;
    assert_eq!(pipeline(&c), vec![]);
    assert_eq!(c.transactional_id(), "outbox-relay-main");
    assert_eq!(c.checkpoint_topic(), "outbox-relay.checkpoints");
    c.transactional_id = Some("orders-relay".into());
    c.checkpoint_topic = Some("relay.checkpoints".into());
    assert_eq!(pipeline(&c), vec![]);
    assert_eq!(c.transactional_id(), "orders-relay");
    assert_eq!(c.checkpoint_topic(), "relay.checkpoints");
}

const EXAMPLE: &str = include_str!("../../examples/relay.toml");

/// The variables the example's `${NAME}` references need (payments: its polling pipeline).
const EXAMPLE_ENV: &[(&str, &str)] = &[
    (
        "ORDERS_DATABASE_URL",
        "postgres://relay:pw@orders-db/orders",
    ),
    (
        "BILLING_DATABASE_URL",
        "postgres://relay:pw@billing-db/billing",
    ),
    (
        "PAYMENTS_DATABASE_URL",
        "postgres://relay:pw@payments-db/payments",
    ),
];

#[test]
fn the_example_file_loads() {
    let config = load_str(EXAMPLE, EXAMPLE_ENV).unwrap();
    assert_eq!(config.pipelines.len(), 2);
    let orders = &config.pipelines[0];
    assert_eq!(orders.source_url, "postgres://relay:pw@orders-db/orders");
    assert_eq!(orders.kafka.bootstrap_servers, "kafka-1:9092,kafka-2:9092");
    assert!(orders
        .kafka
        .properties
        .contains(&("linger.ms".into(), "5".into())));
    let billing = &config.pipelines[1];
    assert_eq!(billing.table.to_string(), "billing.outbox");
    assert_eq!(billing.columns.aggregate_type, "aggregatetype");
    assert_eq!(billing.max_in_flight_events, 2_000);
    assert!(config.metrics_listen.is_some());
}

#[test]
fn the_example_routing_options_load_when_uncommented() {
    let start = EXAMPLE.find("# --- Routing").unwrap();
    let end = start + EXAMPLE[start..].find("[[pipelines]]").unwrap();
    let mut example = EXAMPLE[..start].to_owned();
    for line in EXAMPLE[start..end].lines() {
        let option = line.strip_prefix("# ").filter(|l| {
            l.starts_with("  {")
                || *l == "]"
                || l.split_once(" = ").is_some_and(|(key, _)| {
                    key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                })
        });
        example.push_str(option.unwrap_or(line));
        example.push('\n');
    }
    example.push_str(&EXAMPLE[end..]);
    let config = load_str(&example, EXAMPLE_ENV).unwrap_or_else(|e| panic!("{e}\n{example}"));
    let orders = &config.pipelines[0];
    assert_eq!(orders.columns.timestamp.as_deref(), Some("created_at"));
    assert!(orders.route.topic_regex.is_some());
    assert_eq!(
        orders
            .route
            .allowed_destinations
            .as_deref()
            .map(<[String]>::len),
        Some(2)
    );
    assert_eq!(orders.additional_placement.len(), 3);
    assert_eq!(orders.on_bad_event, crate::config::OnBadEvent::DeadLetter);
    assert!(orders.exactly_once);
    assert_eq!(orders.transactional_id(), "outbox-relay-orders");
    assert_eq!(orders.checkpoint_topic(), "outbox-relay.checkpoints");
}

#[test]
fn the_example_polling_pipeline_loads_when_uncommented() {
    let start = EXAMPLE.find("# --- Polling source").unwrap();
    let mut example = EXAMPLE[..start].to_owned();
    for line in EXAMPLE[start..].lines() {
        // "# key = value" and "# [section]" are options; "# # ..." and prose stay comments.
        let option = line.strip_prefix("# ").filter(|l| {
            l.starts_with('[')
                || l.split_once(" = ").is_some_and(|(key, _)| {
                    key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                })
        });
        example.push_str(option.unwrap_or(line));
        example.push('\n');
    }
    let config = load_str(&example, EXAMPLE_ENV).unwrap_or_else(|e| panic!("{e}\n{example}"));
    let payments = &config.pipelines[2];
    assert_eq!(payments.source_kind, crate::config::SourceKind::Polling);
    assert_eq!(
        payments.polling,
        crate::config::PollingConfig {
            notify_channel: Some("outbox_relay".into()),
            purge_published_after_secs: Some(604_800),
            ..Default::default()
        },
        "the example shows the defaults"
    );
}

const PIPELINE: &str = "[[pipelines]]\nname = \"p\"\nsource_url = \"postgres://u@h/db\"\nslot = \"s\"\npublication = \"pub\"\ntable = \"outbox\"\nkafka = { bootstrap_servers = \"k:9092\" }\n";

#[test]
fn loads_routing_and_record_options() {
    let config = load_str(
        &format!(
            r#"{PIPELINE}
            columns = {{ timestamp = "created_at" }}
            route = {{ topic_regex = "(?P<domain>[a-z]+)", topic_template = "${{column:tenant_id}}.${{domain}}.events" }}
            additional_placement = [
              {{ field = "tenant_id", placement = "header", alias = "tenant" }},
              {{ field = "shard", placement = "partition" }},
              {{ field = "region", placement = "envelope" }},
            ]
            value_format = "envelope"
            null_payload = "empty"
            on_bad_event = "dead_letter"
            dead_letter_topic = "outbox.dlq"
            "#
        ),
        &[],
    )
    .unwrap();
    let p = &config.pipelines[0];
    assert_eq!(p.columns.timestamp.as_deref(), Some("created_at"));
    assert_eq!(p.route.topic_regex.as_deref(), Some("(?P<domain>[a-z]+)"));
    let r = p;
    assert_eq!(r.additional_placement.len(), 3);
    assert_eq!(r.additional_placement[0].name(), "tenant");
    assert_eq!(
        r.additional_placement[1].placement,
        crate::config::Placement::Partition
    );
    assert_eq!(r.additional_placement[2].name(), "region");
    assert_eq!(r.value_format, crate::config::ValueFormat::Envelope);
    assert_eq!(r.null_payload, crate::config::NullPayload::Empty);
    assert_eq!(r.on_bad_event, crate::config::OnBadEvent::DeadLetter);
    assert_eq!(r.dead_letter_topic.as_deref(), Some("outbox.dlq"));
    // Defaults: today's behaviour.
    let plain = &load_str(PIPELINE, &[]).unwrap().pipelines[0];
    assert_eq!(
        (
            plain.additional_placement.as_slice(),
            plain.value_format,
            plain.null_payload,
            plain.on_bad_event,
            plain.dead_letter_topic.as_deref(),
        ),
        (
            &[][..],
            Default::default(),
            Default::default(),
            Default::default(),
            None
        )
    );
    assert_eq!(plain.columns.timestamp, None);
    assert_eq!(plain.route.topic_regex, None);
}

#[test]
fn lists_every_routing_problem_with_its_field_path() {
    let errors = load_str(
        &format!(
            r#"{PIPELINE}
            route = {{ topic_regex = "(", topic_template = "${{x}}" }}
            additional_placement = [
              {{ field = "a", placement = "partition" }},
              {{ field = "b", placement = "partition" }},
              {{ field = "c", placement = "envelope" }},
            ]
            on_bad_event = "dead_letter"
            "#
        ),
        &[],
    )
    .unwrap_err();
    let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    for expected in [
        "pipelines[0].route.topic_regex",
        "pipelines[0].route.topic_template",
        "pipelines[0].additional_placement[1].placement",
        "pipelines[0].additional_placement[2].placement",
        "pipelines[0].dead_letter_topic",
    ] {
        assert!(fields.contains(&expected), "{expected} missing in {errors}");
    }
    let errors = load_str(
        &format!("{PIPELINE}\nadditional_placement = [{{ field = \"a\", placement = \"footer\" }}]\nvalue_format = \"xml\"\n"),
        &[],
    )
    .unwrap_err();
    let text = errors.to_string();
    assert!(
        text.contains("additional_placement") && text.contains("footer"),
        "{text}"
    );
}

#[test]
fn polling_pipelines_need_no_slot_and_log_tailing_ones_do() {
    let config = load_str(
        r#"
        [[pipelines]]
        name = "p"
        source_url = "postgres://u@h/db"
        source_kind = "polling"
        table = "outbox_events"
        kafka = { bootstrap_servers = "k:9092" }
        [pipelines.polling]
        mark = "flag"
        batch_size = 50
        notify_channel = "outbox_relay"
        "#,
        &[],
    )
    .unwrap();
    let p = &config.pipelines[0];
    assert_eq!(p.source_kind, crate::config::SourceKind::Polling);
    assert_eq!(p.polling.mark, crate::config::MarkMode::Flag);
    assert_eq!(p.polling.batch_size, 50);
    assert_eq!(p.polling.max_interval_ms, 1_000, "defaults for the rest");
    // Log tailing is the default, and needs its slot and publication.
    let errors = load_str(
        "[[pipelines]]\nname = \"p\"\nsource_url = \"postgres://u@h/db\"\ntable = \"outbox\"\nkafka = { bootstrap_servers = \"k:9092\" }\n",
        &[],
    )
    .unwrap_err();
    let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    assert!(fields.contains(&"pipelines[0].slot"), "{errors}");
    assert!(fields.contains(&"pipelines[0].publication"), "{errors}");
    // Polling problems name their field; unknown polling options are refused.
    let errors = load_str(
        &format!("{PIPELINE}source_kind = \"polling\"\npolling = {{ batch_size = 0 }}\nmessage_prefix = \"outbox\"\n"),
        &[],
    )
    .unwrap_err();
    assert!(
        errors
            .0
            .iter()
            .any(|e| e.field == "pipelines[0].polling.batch_size"),
        "{errors}"
    );
    let errors = load_str(&format!("{PIPELINE}polling = {{ batch_sise = 5 }}\n"), &[]).unwrap_err();
    assert!(errors.to_string().contains("batch_sise"), "{errors}");
}

#[test]
fn loads_exactly_once_options_and_refuses_a_shared_transactional_id() {
    let config = load_str(
        &format!("{PIPELINE}exactly_once = true\ncheckpoint_topic = \"relay.checkpoints\"\n"),
        &[],
    )
    .unwrap();
    let p = &config.pipelines[0];
    assert!(p.exactly_once);
    assert_eq!(p.transactional_id(), "outbox-relay-p");
    assert_eq!(p.checkpoint_topic(), "relay.checkpoints");
    assert!(!load_str(PIPELINE, &[]).unwrap().pipelines[0].exactly_once);

    let second = PIPELINE
        .replace("name = \"p\"", "name = \"q\"")
        .replace("slot = \"s\"", "slot = \"s2\"");
    let errors = load_str(
        &format!(
            "{PIPELINE}exactly_once = true\ntransactional_id = \"relay\"\n{second}exactly_once = true\ntransactional_id = \"relay\"\ncheckpoint_topic = \"bad topic\"\n"
        ),
        &[],
    )
    .unwrap_err();
    let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    for expected in [
        "pipelines[1].transactional_id",
        "pipelines[1].checkpoint_topic",
    ] {
        assert!(fields.contains(&expected), "{expected} missing in {errors}");
    }
    let errors = load_str(&format!("{PIPELINE}transactional_id = \"relay\"\n"), &[]).unwrap_err();
    assert!(
        errors
            .to_string()
            .contains("pipelines[0].transactional_id: only used with exactly_once = true"),
        "{errors}"
    );
}

#[test]
fn loads_failover_and_standby_url_and_names_a_bad_standby_url() {
    let config = load_str(
        &format!(
            "{PIPELINE}failover = true\nstandby_url = \"postgres://relay:${{PW}}@standby/app\"\n"
        ),
        &[("PW", "secret")],
    )
    .unwrap();
    let p = &config.pipelines[0];
    assert!(p.failover);
    assert_eq!(
        p.standby_url.as_deref().map(String::as_str),
        Some("postgres://relay:secret@standby/app")
    );
    assert!(
        !format!("{p:?}").contains("secret"),
        "Debug hides the standby's password"
    );
    assert!(!load_str(PIPELINE, &[]).unwrap().pipelines[0].failover);

    let errors = load_str(
        &format!("{PIPELINE}standby_url = \"postgres://relay:pw@standby:notaport/app\"\n"),
        &[],
    )
    .unwrap_err();
    let text = errors.to_string();
    assert!(text.contains("pipelines[0].standby_url"), "{text}");
    assert!(!text.contains(":pw@"), "the password is hidden: {text}");
    let errors = load_str(&format!("{PIPELINE}standby_url = \"${{MISSING}}\"\n"), &[]).unwrap_err();
    assert!(
        errors
            .to_string()
            .contains("pipelines[0].standby_url: environment variable MISSING is not set"),
        "{errors}"
    );
    let mut polling = PipelineConfig::test_pipeline();
    polling.source_kind = crate::config::SourceKind::Polling;
    polling.failover = true;
    assert!(
        polling.problems().iter().any(|e| e.field == "failover"),
        "{:?}",
        polling.problems()
    );
}

#[test]
fn exactly_once_batch_options_are_checked_with_their_field() {
    let eos = PipelineConfig {
        exactly_once: true,
        ..config()
    };
    assert_eq!(pipeline(&eos), vec![]);
    let tuned = PipelineConfig {
        exactly_once_max_batch_transactions: 50,
        exactly_once_max_batch_bytes: 1 << 20,
        exactly_once_batch_linger_ms: 0,
        ..eos.clone()
    };
    assert_eq!(pipeline(&tuned), vec![]);
    let fields = |c: &PipelineConfig| -> Vec<(String, String)> {
        pipeline(c)
            .into_iter()
            .map(|e| (e.field, e.problem))
            .collect()
    };
    let zero = PipelineConfig {
        exactly_once_max_batch_transactions: 0,
        exactly_once_max_batch_bytes: 0,
        ..eos.clone()
    };
    assert_eq!(
        fields(&zero),
        [
            (
                "exactly_once_max_batch_transactions".into(),
                "must be greater than 0".into()
            ),
            (
                "exactly_once_max_batch_bytes".into(),
                "must be greater than 0".into()
            ),
        ]
    );
    let long = PipelineConfig {
        exactly_once_batch_linger_ms: 10_001,
        ..eos
    };
    assert_eq!(
        fields(&long),
        [(
            "exactly_once_batch_linger_ms".into(),
            "10001 is too long: at most 10000; an open Kafka transaction holds read_committed consumers back".into()
        )]
    );
    let unused = PipelineConfig {
        exactly_once_batch_linger_ms: 20,
        ..config()
    };
    assert_eq!(
        fields(&unused),
        [(
            "exactly_once_batch_linger_ms".into(),
            "only used with exactly_once = true".into()
        )]
    );
}
