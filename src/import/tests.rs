use super::event_router::java_replacement;
use super::*;
use crate::config::{AdditionalPlacement, Placement};
use figment::providers::{Format, Toml};
use figment::Figment;
use severities::refused;

/// The connector of Debezium's outbox example (debezium-examples/outbox), in the form
/// posted to Kafka Connect, on Debezium 2.x option names.
const EXAMPLE: &str = r#"{
  "name": "outbox-connector",
  "config": {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "tasks.max": "1",
    "database.hostname": "order-db",
    "database.port": 5432,
    "database.user": "postgresuser",
    "database.password": "postgrespw",
    "database.dbname": "orderdb",
    "topic.prefix": "dbserver1",
    "schema.include.list": "inventory",
    "table.include.list": "inventory.outboxevent",
    "tombstones.on.delete": "false",
    "plugin.name": "pgoutput",
    "transforms": "outbox",
    "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
    "transforms.outbox.route.topic.replacement": "${routedByValue}.events"
  }
}"#;

fn load(toml: &str, env: &[(&str, &str)]) -> crate::config::file::RelayConfig {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (relay, problems) =
        crate::config::file::resolve(Figment::new().merge(Toml::string(toml)), &move |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .unwrap_or_else(|e| panic!("{e}\n{toml}"));
    assert_eq!(problems, vec![], "{toml}");
    let valid = crate::validation::pipelines(&relay.pipelines);
    assert!(valid.is_ok(), "{valid:?}\n{toml}");
    relay
}

fn options(notes: &[Note]) -> Vec<&str> {
    notes.iter().map(|n| n.option.as_str()).collect()
}

#[test]
fn debeziums_outbox_example_loads_with_the_same_topics_and_columns() {
    let imported = translate(&parse_json(EXAMPLE).unwrap()).unwrap();
    assert!(!imported.toml.contains("postgrespw"), "{}", imported.toml);
    let config = load(
        &imported.toml,
        &[
            ("OUTBOX_CONNECTOR_DB_PASSWORD", "pw"),
            ("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092"),
        ],
    );
    let p = &config.pipelines[0];
    assert_eq!(p.name, "outbox-connector");
    assert_eq!(
        p.source_url,
        "postgres://postgresuser@order-db:5432/orderdb"
    );
    assert_eq!(p.source_password.as_deref(), Some("pw"));
    assert_eq!(
        (p.slot.as_str(), p.publication.as_str()),
        ("debezium", "dbz_publication")
    );
    assert_eq!(p.table.to_string(), "inventory.outboxevent");
    assert!(!p.create_slot);
    assert_eq!(p.kafka.bootstrap_servers, "kafka:9092");
    assert_eq!(p.route.topic_template, "${routedByValue}.events");
    assert_eq!(p.route.by_field, None);
    let c = &p.columns;
    assert_eq!(
        [
            &c.id,
            &c.aggregate_type,
            &c.aggregate_id,
            &c.event_type,
            &c.payload
        ]
        .map(String::as_str),
        ["id", "aggregatetype", "aggregateid", "type", "payload"]
    );
    let notes = options(&imported.notes);
    for option in [
        "database.password",
        "tasks.max",
        "topic.prefix",
        "schema.include.list",
        "tombstones.on.delete",
        "columns.event_type",
        "value.converter",
        // Kafka Connect's default JsonConverter quoted the key: other partitions now.
        "key.converter",
    ] {
        assert!(notes.contains(&option), "no note for {option}: {notes:?}");
    }
    for carried in [
        "transforms.outbox.route.topic.replacement",
        "table.include.list",
        "plugin.name",
        "database.hostname",
    ] {
        assert!(
            !notes.contains(&carried),
            "{carried} was carried over: {notes:?}"
        );
    }
}

#[test]
fn debezium_1x_option_names_are_understood() {
    // debezium-examples/outbox/register-postgres.json before Debezium 2.0: the bare map.
    let connector = parse_json(
        r#"{
          "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
          "tasks.max": "1",
          "database.hostname": "order-db",
          "database.port": "5432",
          "database.user": "postgresuser",
          "database.password": "postgrespw",
          "database.dbname": "orderdb",
          "database.server.name": "dbserver1",
          "schema.whitelist": "inventory",
          "table.whitelist": "inventory.outboxevent",
          "tombstones.on.delete": "false",
          "transforms": "outbox",
          "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
          "transforms.outbox.route.topic.replacement": "${routedByValue}.events",
          "transforms.outbox.table.field.event.timestamp": "timestamp",
          "transforms.outbox.table.field.event.type": "eventtype",
          "transforms.outbox.debezium.op.invalid.behavior": "warn"
        }"#,
    )
    .unwrap();
    let imported = translate(&connector).unwrap();
    for expected in [
        r#"name = "orderdb""#,
        r#"table = "inventory.outboxevent""#,
        r#"timestamp = "timestamp""#,
        r#"event_type = "eventtype""#,
        r#"op_invalid_behavior = "warn""#,
        r#"topic_template = "${routedByValue}.events""#,
        "source_url = \"postgres://postgresuser@order-db:5432/orderdb\"",
        "source_password = \"${ORDERDB_DB_PASSWORD}\"",
    ] {
        assert!(
            imported.toml.contains(expected),
            "{expected} missing in\n{}",
            imported.toml
        );
    }
    let notes = options(&imported.notes);
    for option in [
        "database.server.name",
        "schema.whitelist",
        "plugin.name",
        "transforms.outbox.debezium.op.invalid.behavior",
    ] {
        assert!(notes.contains(&option), "no note for {option}: {notes:?}");
    }
    assert!(!notes.contains(&"columns.event_type"), "{notes:?}");
}

#[test]
fn debezium_defaults_keep_debeziums_topic_names() {
    let properties = "name=orders\nconnector.class=io.debezium.connector.postgresql.PostgresConnector\ndatabase.hostname=db\ndatabase.user=relay\ndatabase.dbname=orders\ntable.include.list=public\\\\.outbox\ntransforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n";
    let imported = translate(&parse_properties(properties).unwrap()).unwrap();
    let config = load(&imported.toml, &[("KAFKA_BOOTSTRAP_SERVERS", "k:9092")]);
    let p = &config.pipelines[0];
    assert_eq!(p.route.topic_template, "outbox.event.${routedByValue}");
    assert_eq!(p.source_url, "postgres://relay@db:5432/orders");
    assert_eq!(p.table.to_string(), "public.outbox");
    // Debezium's default plugin is decoderbufs: its slot cannot be taken over.
    assert_eq!(p.slot, "outbox_relay");
    assert!(options(&imported.notes).contains(&"plugin.name"));
}

#[test]
fn every_router_option_is_mapped_or_noted() {
    let connector = Connector {
        name: Some("billing".into()),
        options: [
            ("database.hostname", "fe80::1"),
            ("database.user", "${env:DB_USER}"),
            (
                "database.password",
                "${file:/secrets/db.properties:password}",
            ),
            ("database.dbname", "bill ing"),
            ("database.sslmode", "verify-full"),
            ("database.sslrootcert", "/etc/ssl/ca.pem"),
            ("plugin.name", "pgoutput"),
            ("slot.name", "billing_slot"),
            ("slot.failover", "true"),
            ("publication.name", "Billing-Pub"),
            ("table.include.list", "audit.log,Billing-Prod.Outbox"),
            ("transforms", "unwrap,router"),
            (
                "transforms.unwrap.type",
                "io.debezium.transforms.ExtractNewRecordState",
            ),
            ("transforms.router.type", EVENT_ROUTER),
            ("transforms.router.table.field.event.id", "event_id"),
            ("transforms.router.table.field.event.key", "aggregate_id"),
            ("transforms.router.table.field.event.payload", "body"),
            (
                "transforms.router.table.field.event.timestamp",
                "created_at",
            ),
            ("transforms.router.route.by.field", "aggregate_type"),
            (
                "transforms.router.route.topic.regex",
                "(?<kind>[a-z]+)-(.*)",
            ),
            (
                "transforms.router.route.topic.replacement",
                "billing.${kind}.$2",
            ),
            ("transforms.router.route.tombstone.on.empty.payload", "true"),
            (
                "transforms.router.table.fields.additional.placement",
                "type:header:eventType,tenant:envelope,part:partition:ignored",
            ),
            ("transforms.router.table.op.invalid.behavior", "fatal"),
            ("transforms.router.table.expand.json.payload", "true"),
            (
                "value.converter",
                "org.apache.kafka.connect.json.JsonConverter",
            ),
            ("producer.override.linger.ms", "10"),
            ("producer.override.acks", "1"),
            ("producer.override.max.request.size", "2000000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
    };
    let imported = translate(&connector).unwrap();
    let toml = &imported.toml;
    for expected in [
        r#"source_url = "postgres://${DB_USER}@[fe80::1]:5432/bill%20ing?sslmode=verify-full&sslrootcert=/etc/ssl/ca.pem""#,
        r#"source_password = "${BILLING_DB_PASSWORD}""#,
        r#"slot = "billing_slot""#,
        "failover = true",
        r#"publication = "Billing-Pub""#,
        r#"table = '"Billing-Prod"."Outbox"'"#,
        r#"op_invalid_behavior = "error""#,
        r#"value_format = "envelope""#,
        r#"id = "event_id""#,
        r#"aggregate_type = "aggregate_type""#,
        r#"aggregate_id = "aggregate_id""#,
        r#"payload = "body""#,
        r#"timestamp = "created_at""#,
        r#"topic_template = "billing.${kind}.${2}""#,
        r#"topic_regex = "(?<kind>[a-z]+)-(.*)""#,
        r#""linger.ms" = "10""#,
        r#"json_payload = "debezium_expanded""#,
    ] {
        assert!(toml.contains(expected), "{expected} missing in\n{toml}");
    }
    assert!(!toml.contains("/secrets/"), "{toml}");
    // The placements, in order (the TOML has them as an array of tables).
    let config = load(
        toml,
        &[
            ("DB_USER", "relay"),
            ("BILLING_DB_PASSWORD", "pw"),
            ("KAFKA_BOOTSTRAP_SERVERS", "k:9092"),
        ],
    );
    let placement = |field: &str, placement, alias: Option<&str>| AdditionalPlacement {
        field: field.into(),
        placement,
        alias: alias.map(str::to_owned),
    };
    assert_eq!(
        config.pipelines[0].additional_placement,
        [
            placement("type", Placement::Header, Some("eventType")),
            placement("tenant", Placement::Envelope, None),
            placement("part", Placement::Partition, None),
        ]
    );
    // route.tombstone.on.empty.payload = true: NULL payloads stay tombstones, and empty ones
    // become tombstones.
    assert!(!toml.contains("json_null"), "{toml}");
    assert!(toml.contains(r#"empty_payload = "tombstone""#), "{toml}");
    let notes = options(&imported.notes);
    for option in [
        "database.password",
        "table.include.list",
        "transforms.unwrap.type",
        "transforms.router.route.topic.regex",
        "transforms.router.table.op.invalid.behavior",
        "value.converter",
        "producer.override.acks",
        "producer.override.max.request.size",
    ] {
        assert!(notes.contains(&option), "no note for {option}: {notes:?}");
    }
    let table_note = imported
        .notes
        .iter()
        .find(|n| n.option == "table.include.list")
        .unwrap();
    assert!(table_note.reason.contains("audit.log"), "{table_note}");
}

#[test]
fn not_an_outbox_connector_is_an_error() {
    let mut connector = parse_json(EXAMPLE).unwrap();
    connector.options.insert(
        "connector.class".into(),
        "io.debezium.connector.mysql.MySqlConnector".into(),
    );
    assert!(
        matches!(translate(&connector), Err(ImportError::Unsupported { option, .. }) if option == "connector.class")
    );
    let mut connector = parse_json(EXAMPLE).unwrap();
    connector.options.remove("transforms");
    assert!(
        matches!(translate(&connector), Err(ImportError::Unsupported { option, .. }) if option == "transforms")
    );
    let mut connector = parse_json(EXAMPLE).unwrap();
    connector.options.insert(
        "transforms.outbox.table.fields.additional.placement".into(),
        "type:body".into(),
    );
    let err = translate(&connector).unwrap_err();
    assert!(err.to_string().contains("type:body"), "{err}");
}

#[test]
fn bare_config_maps_and_bad_files_parse_as_expected() {
    let bare =
        parse_json(r#"{"name": "n", "database.port": 5433, "slot.drop.on.stop": false}"#).unwrap();
    assert_eq!(bare.name.as_deref(), Some("n"));
    assert_eq!(bare.options["database.port"], "5433");
    assert_eq!(bare.options["slot.drop.on.stop"], "false");
    assert!(parse_json("[]").is_err());
    assert!(parse_json(r#"{"config": 1}"#).is_err());
    assert!(parse_json(r#"{"a": [1]}"#).unwrap_err().contains('a'));
    assert_eq!(java_replacement("x.$1-${name}.$23"), "x.${1}-${name}.${23}");
}

/// The notes of `EXAMPLE` with `extra` options added.
fn notes_with(extra: &[(&str, &str)]) -> Vec<Note> {
    let mut connector = parse_json(EXAMPLE).unwrap();
    for (k, v) in extra {
        connector.options.insert((*k).to_owned(), (*v).to_owned());
    }
    translate(&connector).unwrap().notes
}

fn reason<'a>(notes: &'a [Note], option: &str) -> &'a str {
    &notes
        .iter()
        .find(|n| n.option == option)
        .unwrap_or_else(|| panic!("no note for {option}: {notes:?}"))
        .reason
}

#[test]
fn bytea_notes_say_the_bytes_are_published_as_they_are() {
    let notes = notes_with(&[
        (
            "value.converter",
            "io.debezium.converters.BinaryDataConverter",
        ),
        (
            "key.converter",
            "org.apache.kafka.connect.converters.ByteArrayConverter",
        ),
        ("binary.handling.mode", "bytes"),
    ]);
    for option in ["value.converter", "key.converter", "binary.handling.mode"] {
        let reason = reason(&notes, option);
        assert!(reason.starts_with("not needed"), "{option}: {reason}");
        assert!(!reason.contains("\\x"), "{option}: {reason}");
    }
    let notes = notes_with(&[("binary.handling.mode", "base64")]);
    let reason = reason(&notes, "binary.handling.mode");
    assert!(
        reason.contains("base64") && reason.contains("bytea_format"),
        "{reason}"
    );
}

#[test]
fn notes_say_how_placed_columns_compare_with_the_converters_and_handling_modes() {
    let notes = notes_with(&[
        (
            "header.converter",
            "org.apache.kafka.connect.storage.SimpleHeaderConverter",
        ),
        ("time.precision.mode", "adaptive"),
    ]);
    for option in ["header.converter", "time.precision.mode"] {
        let reason = reason(&notes, option);
        assert!(reason.starts_with("not needed"), "{option}: {reason}");
    }
    let notes = notes_with(&[
        (
            "header.converter",
            "io.debezium.converters.BinaryDataConverter",
        ),
        ("time.precision.mode", "connect"),
        ("decimal.handling.mode", "string"),
    ]);
    for (option, words) in [
        ("header.converter", "SimpleHeaderConverter"),
        ("time.precision.mode", "connect"),
        ("decimal.handling.mode", "JSON number"),
    ] {
        let reason = reason(&notes, option);
        assert!(
            !reason.starts_with("not needed") && reason.contains(words),
            "{option}: {reason}"
        );
    }
}

#[test]
fn tombstone_on_empty_payload_is_carried_over_and_a_value_debezium_refuses_is_refused() {
    let translated = |value: &str| {
        let mut connector = parse_json(EXAMPLE).unwrap();
        connector.options.insert(
            "transforms.outbox.route.tombstone.on.empty.payload".into(),
            value.into(),
        );
        translate(&connector)
    };
    for value in ["true", " TRUE "] {
        let imported = translated(value).unwrap();
        assert!(
            imported.toml.contains(r#"empty_payload = "tombstone""#),
            "{value:?}: {}",
            imported.toml
        );
        assert!(
            !options(&imported.notes)
                .contains(&"transforms.outbox.route.tombstone.on.empty.payload"),
            "{:?}",
            imported.notes
        );
    }
    let imported = translated("false").unwrap();
    assert!(
        !imported.toml.contains("empty_payload"),
        "{}",
        imported.toml
    );
    // Kafka's ConfigDef takes only true or false for a boolean.
    let err = translated("yes").unwrap_err();
    assert_eq!(
        refused(&err),
        ["transforms.outbox.route.tombstone.on.empty.payload"]
    );
}

#[test]
fn a_missing_additional_field_may_be_ignored_under_debeziums_option_name() {
    let translated = |value: &str| {
        let mut connector = parse_json(EXAMPLE).unwrap();
        for (k, v) in [
            ("table.fields.additional.placement", "tenant:header"),
            ("table.field.additional.missing", value),
        ] {
            connector
                .options
                .insert(format!("transforms.outbox.{k}"), v.into());
        }
        translate(&connector)
    };
    let imported = translated(" Ignore ").unwrap();
    assert!(
        imported
            .toml
            .contains(r#"missing_placement_column = "ignore""#),
        "{}",
        imported.toml
    );
    assert!(
        !options(&imported.notes).contains(&"transforms.outbox.table.field.additional.missing"),
        "carried over, not noted: {:?}",
        imported.notes
    );
    let imported = translated("error").unwrap();
    assert!(
        !imported.toml.contains("missing_placement_column"),
        "{}",
        imported.toml
    );
    // Debezium's option takes error or ignore only.
    let err = translated("skip").unwrap_err();
    assert_eq!(
        refused(&err),
        ["transforms.outbox.table.field.additional.missing"]
    );
    assert!(err.to_string().contains("error and ignore"), "{err}");
}

mod severities;
#[test]
fn debeziums_tracing_options_are_carried_over_or_noted() {
    let mut connector = parse_json(EXAMPLE).unwrap();
    for (k, v) in [
        ("tracing.span.context.field", "span_ctx"),
        ("tracing.operation.name", "debezium-read"),
        ("tracing.with.context.field.only", "false"),
    ] {
        connector
            .options
            .insert(format!("transforms.outbox.{k}"), v.into());
    }
    let imported = translate(&connector).unwrap();
    let config = load(
        &imported.toml,
        &[
            ("OUTBOX_CONNECTOR_DB_PASSWORD", "pw"),
            ("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092"),
        ],
    );
    assert_eq!(
        config.pipelines[0].columns.tracing_span_context.as_deref(),
        Some("span_ctx")
    );
    let notes = &imported.notes;
    assert!(reason(notes, "transforms.outbox.tracing.operation.name").contains("starts no spans"));
    assert!(
        reason(notes, "transforms.outbox.tracing.with.context.field.only")
            .contains("without trace headers")
    );
    assert!(reason(notes, "columns.tracing_span_context").contains("as they are"));
    connector.options.insert(
        "transforms.outbox.tracing.with.context.field.only".into(),
        "yes".into(),
    );
    let err = translate(&connector).unwrap_err();
    assert!(
        matches!(&err, ImportError::Refused { notes } if notes.iter().any(|n| n.severity == Severity::Error && n.option == "transforms.outbox.tracing.with.context.field.only")),
        "{err}"
    );
}
