//! Debezium's JSON payload expansion (`table.expand.json.payload=true` with `JsonConverter`,
//! `schemas.enable=false`) imported and run: the relay publishes the bytes Debezium did.

use std::path::Path;
use std::time::Duration;

use crate::support::{kafka, run_within, Relay};
use crate::{header, Setup};

/// The expected values are what Debezium's expansion gives for PostgreSQL's jsonb text (keys
/// ordered by length, then bytes): null fields and empty arrays left out at every depth, an
/// object left empty kept, objects in an array sharing the union of their fields, numbers as
/// Jackson writes ints, longs and doubles, compact JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_json_expansion_publishes_the_bytes_debezium_published() {
    let setup = Setup::new("expansion", &["User"], 1).await;
    let t = setup.types[0].clone();
    let c = &setup.db.client;
    let sql = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("sql")
            .join("outbox_debezium.sql"),
    )
    .unwrap();
    c.batch_execute(&sql).await.unwrap();
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
                "transforms.outbox.table.expand.json.payload": "true"
            }
        })
        .to_string(),
    )
    .unwrap();
    let mut import = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    import.args(["import-debezium".as_ref(), connector.as_os_str()]);
    let output = run_within(import, Duration::from_secs(60));
    assert!(
        output.status.success(),
        "no differences, so the config is printed:\n{}",
        output.stderr
    );
    assert!(
        output
            .stdout
            .contains(r#"json_payload = "debezium_expanded""#),
        "{}",
        output.stdout
    );
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

    let rows: [(&str, &str); 3] = [
        (
            r#"{"id": 7, "tags": [], "note": null, "price": 9.50, "nested": {"gone": null, "empty": []},
                "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": null}], "big": 3000000000,
                "ratio": 1e-5, "text": "é \"q\""}"#,
            r#"{"id":7,"big":3000000000,"text":"é \"q\"","items":[{"qty":1,"sku":"a"},{"qty":null,"sku":"b"}],"price":9.5,"ratio":1.0E-5,"nested":{}}"#,
        ),
        (r#"{"a": null, "b": []}"#, "{}"),
        (
            r#"{"pets": [{"type": "dog", "colors": []}, {"type": "cat", "colors": [{"name": "white"}]}], "n": [null, 2, 3]}"#,
            r#"{"n":[null,2,3],"pets":[{"type":"dog","colors":[]},{"type":"cat","colors":[{"name":"white"}]}]}"#,
        ),
    ];
    let mut ids = Vec::new();
    for (payload, _) in rows {
        let id: String = c
            .query_one(
                "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
                 VALUES (gen_random_uuid(), $1, 'u-1', 'UserCreated', $2::text::jsonb) RETURNING id::text",
                &[&t, &payload],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }
    let consumed = setup
        .consume_all(rows.len(), Duration::from_secs(1), Duration::from_secs(60))
        .await;
    for ((payload, expected), id) in rows.iter().zip(&ids) {
        let found: Vec<_> = consumed
            .iter()
            .filter(|r| header(r, "id") == Some(id.as_bytes()))
            .collect();
        assert_eq!(found.len(), 1, "event {id} once in {consumed:#?}");
        assert_eq!(
            found[0].value_str().as_deref(),
            Some(*expected),
            "value for payload {payload}"
        );
    }
    drop(relay);
}
