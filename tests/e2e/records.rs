//! What a record carries for a column's type, as a consumer of Debezium's Outbox Event Router
//! expects it: bytea keys and payloads as raw bytes, placed columns rendered as Debezium's
//! default converters render them, empty payloads as tombstones when asked.

use std::path::Path;
use std::time::Duration;

use crate::support::{consume, kafka, run_within, Auth, Consumed, Relay};
use crate::{header, run_with_config, Setup};

/// The record of event `id` among `consumed`, which must hold it exactly once.
fn record<'a>(consumed: &'a [Consumed], id: &str) -> &'a Consumed {
    let found: Vec<&Consumed> = consumed
        .iter()
        .filter(|r| header(r, "id") == Some(id.as_bytes()))
        .collect();
    assert_eq!(found.len(), 1, "event {id} once in {consumed:#?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytea_keys_and_payloads_arrive_as_raw_bytes_or_as_hex_text_when_asked() {
    let setup = Setup::new("bytea", &["Blob"], 1).await;
    let t = setup.types[0].clone();
    let hex_topic = format!("{t}.hex");
    kafka().create_topic(&hex_topic, 1);
    let c = &setup.db.client;
    c.batch_execute(
        "ALTER TABLE outbox ALTER COLUMN aggregate_id TYPE bytea USING convert_to(aggregate_id, 'UTF8'),
                            ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, 'UTF8')",
    )
    .await
    .unwrap();
    // The default: raw bytes. A second relay asks for PostgreSQL's hex text; it starts once
    // the raw bytes arrived, on its own slot, created before the rows were written.
    let raw = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    let hex_slot = format!("{}_hex", setup.slot);
    setup.db.create_slot(&hex_slot).await;
    setup.wait_streaming().await;

    // A protobuf message (field 1 "hello", field 2 = 1) under a key that is not UTF-8; every
    // byte value; a zero-byte payload; NULL.
    let every_byte: Vec<u8> = (0..=255).collect();
    let rows: [(&[u8], Option<&[u8]>); 4] = [
        (b"\x00\xff\x10", Some(b"\x0a\x05hello\x10\x01")),
        (b"k", Some(&every_byte)),
        (b"e", Some(b"")),
        (b"n", None),
    ];
    let mut ids = Vec::new();
    for (key, payload) in rows {
        let id: String = c
            .query_one(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ($1, $2, 'Binary', $3) RETURNING id::text",
                &[&t, &key, &payload],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }

    let consumed = consume(
        &kafka().bootstrap(),
        &[format!("{t}.events").as_str()],
        rows.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    for ((key, payload), id) in rows.iter().zip(&ids) {
        let r = record(&consumed, id);
        assert_eq!(r.key.as_deref(), Some(*key), "raw key of {id}");
        assert_eq!(r.value.as_deref(), *payload, "raw payload of {id}");
    }

    let (_dir, args) = run_with_config(&format!(
        r#"[kafka]
bootstrap_servers = "{bootstrap}"
[[pipelines]]
name = "hex"
source_url = "{url}"
slot = "{hex_slot}"
publication = "outbox_pub"
table = "public.outbox"
route = {{ topic_template = "${{routedByValue}}.hex" }}
bytea_format = "hex"
"#,
        bootstrap = kafka().bootstrap(),
        url = setup.db.url(Auth::Trust),
    ));
    let hex = Relay::spawn(&args);
    let consumed = consume(
        &kafka().bootstrap(),
        &[hex_topic.as_str()],
        rows.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    let pg_hex = |bytes: &[u8]| {
        let digits: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("\\x{digits}").into_bytes()
    };
    for ((key, payload), id) in rows.iter().zip(&ids) {
        let r = record(&consumed, id);
        assert_eq!(r.key, Some(pg_hex(key)), "hex key of {id}");
        assert_eq!(r.value, payload.map(pg_hex), "hex payload of {id}");
    }
    assert_eq!(
        record(&consumed, &ids[0]).value_str().as_deref(),
        Some("\\x0a0568656c6c6f1001")
    );
    drop((raw, hex));
}

/// Each placed column type as a header and in the envelope: the table of
/// docs/concepts/records.md, values worked out by hand from Debezium's rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placed_columns_are_rendered_as_debeziums_default_converters_render_them() {
    let setup = Setup::new("placed", &["Typed"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    let columns = [
        ("flag", "boolean"),
        ("n", "int4"),
        ("amount", "numeric(12,2)"),
        ("ratio", "float8"),
        ("small", "real"),
        ("at", "timestamptz"),
        ("at0", "timestamptz(0)"),
        ("local_at", "timestamp"),
        ("local_ms", "timestamp(3)"),
        ("day", "date"),
        ("clock", "time"),
        ("blob", "bytea"),
        ("doc", "jsonb"),
        ("ref", "uuid"),
    ];
    let add: Vec<String> = columns
        .iter()
        .map(|(name, ty)| format!("ADD COLUMN {name} {ty}"))
        .collect();
    c.batch_execute(&format!("ALTER TABLE outbox {}", add.join(", ")))
        .await
        .unwrap();
    let placements: Vec<String> = columns
        .iter()
        .flat_map(|(name, _)| {
            [
                format!(r#"{{ field = "{name}", placement = "header" }}"#),
                format!(r#"{{ field = "{name}", placement = "envelope" }}"#),
            ]
        })
        .collect();
    let (_dir, args) = run_with_config(&format!(
        r#"[kafka]
bootstrap_servers = "{bootstrap}"
[[pipelines]]
name = "placed"
source_url = "{url}"
slot = "{slot}"
publication = "outbox_pub"
table = "public.outbox"
value_format = "envelope"
additional_placement = [{placements}]
"#,
        bootstrap = kafka().bootstrap(),
        url = setup.db.url(Auth::Trust),
        slot = setup.slot,
        placements = placements.join(", "),
    ));
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;

    let full: String = c
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, flag, n, amount,
                 ratio, small, at, at0, local_at, local_ms, day, clock, blob, doc, ref)
             VALUES ($1, 'k', 'Typed', '{\"x\": 1}', true, 42, 1500000.10, 1e20, 3,
                 '2026-11-29 23:24:30.5+01', '2026-11-29 23:24:30+01', '2026-11-29 23:24:30.123456',
                 '2026-11-29 23:24:30.123', '2026-11-29', '23:24:30.5', '\\x00ff10',
                 '{\"a\": [1, 2.50]}', '1b4e28ba-2fa1-11d2-883f-0016d3cca427')
             RETURNING id::text",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    let sparse: String = c
        .query_one(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, flag, ratio, small)
             VALUES ($1, 'k', 'Typed', '{}', false, 'NaN', '-Infinity') RETURNING id::text",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    let consumed = setup
        .consume_all(2, Duration::from_secs(1), Duration::from_secs(60))
        .await;

    // (column, header bytes, envelope JSON) of the full row.
    let expected: [(&str, &str, &str); 14] = [
        ("flag", "true", "true"),
        ("n", "42", "42"),
        ("amount", "1500000.10", "1500000.10"),
        ("ratio", "1.0E20", "1.0E20"),
        ("small", "3.0", "3.0"),
        (
            "at",
            "2026-11-29T22:24:30.500000Z",
            r#""2026-11-29T22:24:30.500000Z""#,
        ),
        ("at0", "2026-11-29T22:24:30Z", r#""2026-11-29T22:24:30Z""#),
        // Microseconds since 1970 for timestamp, milliseconds for timestamp(0) to (3).
        ("local_at", "1795994670123456", "1795994670123456"),
        ("local_ms", "1795994670123", "1795994670123"),
        // Days since 1970; microseconds since midnight.
        ("day", "20786", "20786"),
        ("clock", "84270500000", "84270500000"),
        ("blob", "AP8Q", r#""AP8Q""#),
        ("doc", r#"{"a": [1, 2.50]}"#, r#"{"a": [1, 2.50]}"#),
        (
            "ref",
            "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
            r#""1b4e28ba-2fa1-11d2-883f-0016d3cca427""#,
        ),
    ];
    let r = record(&consumed, &full);
    let headers: Vec<(&str, Option<&str>)> = r
        .headers
        .iter()
        .skip(2)
        .map(|(k, v)| {
            (
                k.as_str(),
                v.as_deref().map(|v| std::str::from_utf8(v).unwrap()),
            )
        })
        .collect();
    let want: Vec<(&str, Option<&str>)> = expected.iter().map(|(n, h, _)| (*n, Some(*h))).collect();
    assert_eq!(headers, want, "header placements");
    let envelope: Vec<String> = expected
        .iter()
        .map(|(n, _, json)| format!(r#""{n}":{json}"#))
        .collect();
    assert_eq!(
        r.value_str().unwrap(),
        format!(r#"{{"payload":{{"x": 1}},{}}}"#, envelope.join(",")),
        "envelope placements"
    );

    let r = record(&consumed, &sparse);
    let header_of = |name: &str| header(r, name).map(|v| std::str::from_utf8(v).unwrap());
    assert_eq!(header_of("flag"), Some("false"));
    assert_eq!(header_of("ratio"), Some("NaN"));
    assert_eq!(header_of("small"), Some("-Infinity"));
    assert!(
        r.headers.iter().any(|(k, v)| k == "day" && v.is_none()),
        "NULL is a null header value"
    );
    let value: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
    assert_eq!(value["flag"], false);
    assert_eq!(
        value["ratio"], "NaN",
        "JSON has no NaN: a string, as Jackson writes it"
    );
    assert_eq!(value["small"], "-Infinity");
    assert!(value["day"].is_null() && value["blob"].is_null(), "{value}");
    drop(relay);
}

/// A Debezium connector with `route.tombstone.on.empty.payload=true`, imported and run: the
/// records Debezium's own tests describe (a text payload, a boolean placed in the envelope as
/// `deleted`; an empty payload gives a tombstone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_tombstone_on_empty_payload_turns_empty_and_blank_text_into_tombstones() {
    let setup = Setup::new("tombstone", &["User"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    let sql = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("sql")
            .join("outbox_debezium.sql"),
    )
    .unwrap();
    c.batch_execute(&sql).await.unwrap();
    c.batch_execute(
        "ALTER TABLE outboxevent ALTER COLUMN payload TYPE text, ADD COLUMN is_deleted boolean",
    )
    .await
    .unwrap();
    setup.db.create_slot(&setup.slot).await;

    let dir = tempfile::tempdir().unwrap();
    let connector = dir.path().join("users-connector.json");
    std::fs::write(
        &connector,
        serde_json::json!({
            "name": "users-connector",
            "config": {
                "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "database.hostname": "127.0.0.1",
                "database.port": setup.db.port(),
                "database.user": "postgres",
                "database.dbname": setup.db.name,
                "topic.prefix": "users",
                "plugin.name": "pgoutput",
                "slot.name": setup.slot,
                "publication.name": "outboxevent_pub",
                "table.include.list": "public.outboxevent",
                "key.converter": "org.apache.kafka.connect.storage.StringConverter",
                "value.converter": "org.apache.kafka.connect.json.JsonConverter",
                "value.converter.schemas.enable": "false",
                "transforms": "outbox",
                "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
                "transforms.outbox.route.topic.replacement": "${routedByValue}.events",
                "transforms.outbox.route.tombstone.on.empty.payload": "true",
                "transforms.outbox.table.fields.additional.placement": "is_deleted:envelope:deleted"
            }
        })
        .to_string(),
    )
    .unwrap();
    let mut import = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    // Kafka Connect's default converters wrote other bytes: accepted, the test reads the relay's.
    import.args([
        "import-debezium".as_ref(),
        "--accept-differences".as_ref(),
        connector.as_os_str(),
    ]);
    let output = run_within(import, Duration::from_secs(60));
    assert!(output.status.success(), "{}", output.stderr);
    let config = dir.path().join("relay.toml");
    std::fs::write(&config, &output.stdout).unwrap();
    let bootstrap = kafka().bootstrap();
    let relay = Relay::spawn_with_env(
        &[
            "run".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        &[
            ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
            ("USERS_CONNECTOR_DB_PASSWORD", "unused-with-trust"),
        ],
    );
    setup.wait_streaming().await;

    // (payload, is_deleted, the value expected: None for a tombstone)
    let rows: [(Option<&str>, bool, Option<&str>); 5] = [
        (Some("{}"), true, Some(r#"{"payload":"{}","deleted":true}"#)),
        (Some(""), true, None),
        (Some(" \t\r\n "), true, None),
        (None, true, None),
        (
            Some(" x "),
            false,
            Some(r#"{"payload":" x ","deleted":false}"#),
        ),
    ];
    let mut ids = Vec::new();
    for (payload, deleted, _) in rows {
        let id: String = c
            .query_one(
                "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload, is_deleted)
                 VALUES (gen_random_uuid(), $1, '10711fa5', 'UserUpdated', $2, $3) RETURNING id::text",
                &[&t, &payload, &deleted],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }
    let consumed = setup
        .consume_all(rows.len(), Duration::from_secs(1), Duration::from_secs(60))
        .await;
    for ((payload, _, expected), id) in rows.iter().zip(&ids) {
        let r = record(&consumed, id);
        assert_eq!(
            r.value_str().as_deref(),
            *expected,
            "value for payload {payload:?}"
        );
        assert_eq!(r.key.as_deref(), Some(&b"10711fa5"[..]), "the key stays");
    }
    assert!(
        !output.stderr.contains("route.tombstone.on.empty.payload"),
        "carried over, so not in the notes:\n{}",
        output.stderr
    );
    drop(relay);
}

/// A Debezium connector with `table.field.additional.missing=ignore` whose placements name a
/// column the table does not have, imported and run: the events flow without those
/// placements (no header, no envelope field), the others stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_connector_ignoring_missing_additional_fields_leaves_those_placements_out() {
    let setup = Setup::new("missingfield", &["User"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    let sql = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("sql")
            .join("outbox_debezium.sql"),
    )
    .unwrap();
    c.batch_execute(&sql).await.unwrap();
    c.batch_execute("ALTER TABLE outboxevent ADD COLUMN tenant text")
        .await
        .unwrap();
    setup.db.create_slot(&setup.slot).await;

    let dir = tempfile::tempdir().unwrap();
    let connector = dir.path().join("users-connector.properties");
    std::fs::write(
        &connector,
        format!(
            "name=users-connector
connector.class=io.debezium.connector.postgresql.PostgresConnector
database.hostname=127.0.0.1
database.port={port}
database.user=postgres
database.dbname={db}
topic.prefix=users
plugin.name=pgoutput
slot.name={slot}
publication.name=outboxevent_pub
table.include.list=public.outboxevent
value.converter=org.apache.kafka.connect.json.JsonConverter
value.converter.schemas.enable=false
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.route.topic.replacement=${{routedByValue}}.events
transforms.outbox.table.fields.additional.placement=tenant:header,region:header,tenant:envelope:tenant,region:envelope:region,shard:partition
transforms.outbox.table.field.additional.missing=ignore
",
            port = setup.db.port(),
            db = setup.db.name,
            slot = setup.slot,
        ),
    )
    .unwrap();
    let mut import = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    // Kafka Connect's default converters wrote other bytes: accepted, the test reads the relay's.
    import.args([
        "import-debezium".as_ref(),
        "--accept-differences".as_ref(),
        connector.as_os_str(),
    ]);
    let output = run_within(import, Duration::from_secs(60));
    assert!(output.status.success(), "{}", output.stderr);
    let config = dir.path().join("relay.toml");
    std::fs::write(&config, &output.stdout).unwrap();
    let bootstrap = kafka().bootstrap();
    let relay = Relay::spawn_with_env(
        &[
            "run".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        &[
            ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
            ("USERS_CONNECTOR_DB_PASSWORD", "unused-with-trust"),
        ],
    );
    setup.wait_streaming().await;

    let mut ids = Vec::new();
    for tenant in [Some("acme"), None] {
        let id: String = c
            .query_one(
                "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload, tenant)
                 VALUES (gen_random_uuid(), $1, 'u-1', 'UserUpdated', '{\"n\": 1}', $2) RETURNING id::text",
                &[&t, &tenant],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }
    let consumed = setup
        .consume_all(ids.len(), Duration::from_secs(1), Duration::from_secs(60))
        .await;
    for (id, tenant, envelope) in [
        (
            &ids[0],
            Some(&b"acme"[..]),
            r#"{"payload":{"n": 1},"tenant":"acme"}"#,
        ),
        (&ids[1], None, r#"{"payload":{"n": 1},"tenant":null}"#),
    ] {
        let r = record(&consumed, id);
        let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["id", "event_type", "tenant"],
            "no header for the missing column region"
        );
        assert_eq!(
            header(r, "tenant"),
            tenant,
            "NULL stays a null header value"
        );
        assert_eq!(r.value_str().as_deref(), Some(envelope));
        assert_eq!(r.partition, 0, "partitioned by key");
    }
    drop(relay);
}
