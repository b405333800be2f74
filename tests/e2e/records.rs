//! What a record carries for a column's type, as a consumer of Debezium's Outbox Event Router
//! expects it: bytea keys and payloads as raw bytes, placed columns rendered as Debezium's
//! default converters render them, empty payloads as tombstones when asked.

use std::time::Duration;

use crate::support::{consume, kafka, Auth, Consumed, Relay};
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
