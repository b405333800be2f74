use super::super::parse_properties;
use super::*;

const SOURCE_AND_TRANSFORM: &str = r#"
debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector
debezium.source.database.hostname=db
debezium.source.database.port=5432
debezium.source.database.user=dbz
debezium.source.database.password=${env:DB_PASSWORD}
debezium.source.database.dbname=orders
debezium.source.topic.prefix=orders
debezium.source.plugin.name=pgoutput
debezium.source.slot.name=dbz_orders
debezium.source.publication.name=dbz_pub
debezium.source.table.include.list=public.outbox
debezium.source.offset.storage.file.filename=data/offsets.dat
debezium.transforms=outbox
debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
debezium.transforms.outbox.route.topic.replacement=${routedByValue}.events
quarkus.log.level=INFO
"#;

fn import(text: &str) -> Result<Imported, ImportError> {
    let connector = parse_properties(text).unwrap();
    assert!(is_server(&connector));
    translate(&connector)
}

fn option_noted(imported: &Imported, option: &str) -> bool {
    imported.notes.iter().any(|n| n.option == option)
}

#[test]
fn a_kafka_sink_keeps_its_producer_settings_and_the_source_its_slot() {
    let imported = import(&format!(
        "{SOURCE_AND_TRANSFORM}debezium.sink.type=kafka\ndebezium.sink.kafka.producer.bootstrap.servers=k1:9092,k2:9092\ndebezium.sink.kafka.producer.compression.type=zstd\ndebezium.sink.kafka.producer.key.serializer=org.apache.kafka.common.serialization.StringSerializer\n"
    ))
    .unwrap();
    let file: crate::config::file::FileConfig = toml::from_str(&imported.toml).unwrap();
    assert_eq!(file.kafka.bootstrap_servers, "k1:9092,k2:9092");
    let p = &file.pipelines[0];
    assert_eq!(p.sink, SinkConfig::Kafka);
    assert_eq!(p.slot, "dbz_orders");
    assert_eq!(p.publication, "dbz_pub");
    assert_eq!(p.route.topic_template, "${routedByValue}.events");
    assert!(p
        .kafka
        .properties
        .contains(&("compression.type".into(), "zstd".into())));
    assert_eq!(
        p.source_password.as_deref(),
        Some("${ORDERS_DB_PASSWORD}"),
        "the password goes beside the URL, taken as written"
    );
    assert!(!p.source_url.contains("PASSWORD"), "{:?}", p.source_url);
    assert!(
        imported.toml.contains("Debezium Server configuration"),
        "{}",
        imported.toml
    );
    assert!(
        !imported.toml.contains("KAFKA_BOOTSTRAP_SERVERS"),
        "{}",
        imported.toml
    );
    for option in [
        "debezium.sink.kafka.producer.key.serializer",
        "quarkus.log.level",
        "debezium.source.offset.storage.file.filename",
        "debezium.format.value",
    ] {
        assert!(
            option_noted(&imported, option),
            "{option} not noted: {:?}",
            imported.notes
        );
    }
    assert!(
        !option_noted(&imported, "value.converter"),
        "{:?}",
        imported.notes
    );
}

/// Java-only producer properties are noted, not copied: librdkafka refuses them, and one such
/// as `sasl.jaas.config` holds the password, which the import never prints.
#[test]
fn java_producer_properties_are_noted_not_copied_and_their_secrets_not_printed() {
    let imported = import(&format!(
        "{SOURCE_AND_TRANSFORM}debezium.sink.type=kafka\ndebezium.sink.kafka.producer.bootstrap.servers=k1:9092\ndebezium.sink.kafka.producer.security.protocol=SASL_SSL\ndebezium.sink.kafka.producer.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"k\" password=\"s3cret\";\ndebezium.sink.kafka.producer.ssl.truststore.password=s3cret2\ndebezium.sink.kafka.producer.buffer.memory=33554432\n"
    ))
    .unwrap();
    assert!(
        !imported.toml.contains("s3cret"),
        "a secret in the output:\n{}",
        imported.toml
    );
    let file: crate::config::file::FileConfig = toml::from_str(&imported.toml).unwrap();
    assert_eq!(
        file.pipelines[0].kafka.properties,
        [("security.protocol".to_string(), "SASL_SSL".to_string())]
    );
    for option in [
        "debezium.sink.kafka.producer.sasl.jaas.config",
        "debezium.sink.kafka.producer.ssl.truststore.password",
        "debezium.sink.kafka.producer.buffer.memory",
    ] {
        assert!(
            option_noted(&imported, option),
            "{option} not noted: {:?}",
            imported.notes
        );
    }
    assert!(
        imported.notes.iter().all(|n| !n.reason.contains("s3cret")),
        "{:?}",
        imported.notes
    );
}

#[test]
fn a_redis_sink_becomes_a_redis_url_with_its_password_from_the_environment() {
    let imported = import(&format!(
        "{SOURCE_AND_TRANSFORM}debezium.sink.type=redis\ndebezium.sink.redis.address=cache:6380\ndebezium.sink.redis.user=relay\ndebezium.sink.redis.password=hunter2\ndebezium.sink.redis.ssl.enabled=true\ndebezium.sink.redis.batch.size=500\n"
    ))
    .unwrap();
    assert!(!imported.toml.contains("hunter2"), "{}", imported.toml);
    let file: crate::config::file::FileConfig = toml::from_str(&imported.toml).unwrap();
    let SinkConfig::Redis(redis) = &file.pipelines[0].sink else {
        panic!("not a redis sink: {}", imported.toml)
    };
    assert_eq!(
        &*redis.url,
        "rediss://relay:${ORDERS_REDIS_PASSWORD}@cache:6380"
    );
    assert!(
        imported.toml.contains("set ORDERS_REDIS_PASSWORD"),
        "{}",
        imported.toml
    );
    assert!(file.kafka.bootstrap_servers.is_empty(), "{}", imported.toml);
    assert!(option_noted(&imported, "debezium.sink.redis.batch.size"));
    assert!(option_noted(
        &imported,
        "debezium.sink.redis.message.format"
    ));
}

#[test]
fn a_sink_type_outbox_relay_lacks_or_none_is_an_error_naming_the_option() {
    let e = import(&format!(
        "{SOURCE_AND_TRANSFORM}debezium.sink.type=pulsar\n"
    ))
    .unwrap_err();
    assert!(
        e.to_string().starts_with("debezium.sink.type: \"pulsar\""),
        "{e}"
    );
    let e = import(SOURCE_AND_TRANSFORM).unwrap_err();
    assert!(
        e.to_string().starts_with("debezium.sink.type: not set"),
        "{e}"
    );
}

#[test]
fn a_connector_file_is_not_taken_for_a_server_file() {
    let connector = parse_properties(
        "connector.class=io.debezium.connector.postgresql.PostgresConnector\ntransforms=outbox\n",
    )
    .unwrap();
    assert!(!is_server(&connector));
}

#[test]
fn nats_rabbitmq_and_http_sinks_carry_their_server_and_note_the_rest() {
    let nats = import(&format!(
        "{SOURCE_AND_TRANSFORM}debezium.sink.type=nats-jetstream\ndebezium.sink.nats-jetstream.url=nats://nats:4222\ndebezium.sink.nats-jetstream.create-stream=true\ndebezium.sink.nats-jetstream.subjects=*.events\n"
    ))
    .unwrap();
    let file: crate::config::file::FileConfig = toml::from_str(&nats.toml).unwrap();
    let SinkConfig::Nats(n) = &file.pipelines[0].sink else {
        panic!("{}", nats.toml)
    };
    assert_eq!(&*n.url, "nats://nats:4222");
    assert!(
        option_noted(&nats, "debezium.sink.nats-jetstream.create-stream"),
        "{:?}",
        nats.notes
    );

    let rabbit = import(&format!(
        "{SOURCE_AND_TRANSFORM}debezium.sink.type=rabbitmq\ndebezium.sink.rabbitmq.connection.host=mq\ndebezium.sink.rabbitmq.connection.username=relay\ndebezium.sink.rabbitmq.connection.password=s3cret\ndebezium.sink.rabbitmq.connection.virtual.host=/\ndebezium.sink.rabbitmq.exchange=outbox\ndebezium.sink.rabbitmq.routingKey=orders\ndebezium.sink.rabbitmq.ackTimeout=30000\n"
    ))
    .unwrap();
    assert!(!rabbit.toml.contains("s3cret"), "{}", rabbit.toml);
    let file: crate::config::file::FileConfig = toml::from_str(&rabbit.toml).unwrap();
    let p = &file.pipelines[0];
    let SinkConfig::RabbitMq(r) = &p.sink else {
        panic!("{}", rabbit.toml)
    };
    assert_eq!(
        &*r.url,
        "amqp://relay:${ORDERS_RABBITMQ_PASSWORD}@mq:5672/%2F"
    );
    assert_eq!(r.exchange, "outbox");
    assert_eq!(
        p.route.topic_template, "orders",
        "Debezium's one routing key"
    );
    assert!(
        option_noted(&rabbit, "debezium.sink.rabbitmq.ackTimeout"),
        "{:?}",
        rabbit.notes
    );

    let http = import(&format!(
        "{SOURCE_AND_TRANSFORM}debezium.sink.type=http\ndebezium.sink.http.url=https://hooks.example.com/in\ndebezium.sink.http.timeout.ms=5000\ndebezium.sink.http.headers.prefix=X-DEBEZIUM-\ndebezium.sink.http.retries=5\n"
    ))
    .unwrap();
    let file: crate::config::file::FileConfig = toml::from_str(&http.toml).unwrap();
    let SinkConfig::Http(h) = &file.pipelines[0].sink else {
        panic!("{}", http.toml)
    };
    assert_eq!(&*h.url, "https://hooks.example.com/in");
    assert_eq!(h.request_timeout_ms, 5000);
    assert_eq!(h.header_prefix, "X-DEBEZIUM-");
    assert!(
        option_noted(&http, "debezium.sink.http.retries"),
        "{:?}",
        http.notes
    );
}

/// A password in a NATS or HTTP URL is not copied into the output, which is not a place for
/// a secret: it becomes an environment reference, with a comment saying to set it.
#[test]
fn a_password_in_a_nats_or_http_url_becomes_an_environment_reference() {
    for (kind, url, expected) in [
        (
            "nats-jetstream",
            "nats://relay:s3cret@nats:4222",
            "nats://relay:${ORDERS_NATS_PASSWORD}@nats:4222",
        ),
        (
            "http",
            "https://relay:s3cret@hooks.example.com/in",
            "https://relay:${ORDERS_HTTP_PASSWORD}@hooks.example.com/in",
        ),
    ] {
        let imported = import(&format!(
            "{SOURCE_AND_TRANSFORM}debezium.sink.type={kind}\ndebezium.sink.{kind}.url={url}\n"
        ))
        .unwrap();
        assert!(!imported.toml.contains("s3cret"), "{}", imported.toml);
        assert!(imported.toml.contains(expected), "{}", imported.toml);
    }
}

/// A RabbitMQ connection with TLS (the Java client's `ssl.enabled` under `connection.`) stays
/// TLS: `amqps://` on the TLS port, and the store settings that do not carry over are noted.
/// (It became plain `amqp://` with only a note: credentials and events in the clear.)
#[test]
fn a_rabbitmq_connection_with_tls_stays_tls() {
    let imported = import(&format!(
        "{SOURCE_AND_TRANSFORM}debezium.sink.type=rabbitmq\ndebezium.sink.rabbitmq.connection.host=mq\ndebezium.sink.rabbitmq.connection.ssl.enabled=true\ndebezium.sink.rabbitmq.connection.ssl.truststore.path=/etc/ts.jks\ndebezium.sink.rabbitmq.exchange=outbox\n"
    ))
    .unwrap();
    let file: crate::config::file::FileConfig = toml::from_str(&imported.toml).unwrap();
    let SinkConfig::RabbitMq(r) = &file.pipelines[0].sink else {
        panic!("{}", imported.toml)
    };
    assert_eq!(&*r.url, "amqps://mq:5671/%2F");
    assert!(
        option_noted(
            &imported,
            "debezium.sink.rabbitmq.connection.ssl.truststore.path"
        ),
        "{:?}",
        imported.notes
    );
}

/// Without `exchange` Debezium Server published to an exchange named after each topic; the
/// relay publishes to one: that difference is noted.
#[test]
fn a_rabbitmq_sink_without_an_exchange_notes_debeziums_exchange_per_topic() {
    let imported = import(&format!(
        "{SOURCE_AND_TRANSFORM}debezium.sink.type=rabbitmq\ndebezium.sink.rabbitmq.connection.host=mq\n"
    ))
    .unwrap();
    assert!(
        option_noted(&imported, "debezium.sink.rabbitmq.exchange"),
        "{:?}",
        imported.notes
    );
}

/// An HTTP sink that relied on Debezium Server's defaults keeps its header prefix and
/// timeout, and the base64 header values it no longer gets are noted.
#[test]
fn an_http_sink_keeps_debeziums_default_prefix_and_timeout() {
    let imported = import(&format!(
        "{SOURCE_AND_TRANSFORM}debezium.sink.type=http\ndebezium.sink.http.url=https://hooks.example.com/in\n"
    ))
    .unwrap();
    let file: crate::config::file::FileConfig = toml::from_str(&imported.toml).unwrap();
    let SinkConfig::Http(http) = &file.pipelines[0].sink else {
        panic!("{}", imported.toml)
    };
    assert_eq!(http.header_prefix, "X-DEBEZIUM-");
    assert_eq!(http.request_timeout_ms, 60_000);
    assert!(
        option_noted(&imported, "debezium.sink.http.headers.encode.base64"),
        "{:?}",
        imported.notes
    );
}

#[test]
fn the_value_format_is_a_difference_unless_it_writes_what_the_relay_writes() {
    let severity = |extra: &str| {
        let text = format!("{SOURCE_AND_TRANSFORM}debezium.sink.type=kafka\n{extra}");
        let imported = import(&text).unwrap();
        imported
            .notes
            .iter()
            .find(|n| n.option == "debezium.format.value")
            .map(|n| (n.severity, n.reason.clone()))
            .expect("a note for debezium.format.value")
    };
    assert_eq!(severity("").0, Severity::Difference);
    assert_eq!(
        severity("debezium.format.value=json\n").0,
        Severity::Difference
    );
    let (avro, reason) = severity("debezium.format.value=avro\n");
    assert_eq!(avro, Severity::Difference);
    assert!(reason.contains("schema registry"), "{reason}");
    assert_eq!(
        severity("debezium.format.value=simplestring\n").0,
        Severity::Info
    );
    assert_eq!(
        severity(
            "debezium.format.value=json\ndebezium.format.value.schemas.enable=false\ndebezium.transforms.outbox.table.expand.json.payload=true\n"
        )
        .0,
        Severity::Info
    );
}
