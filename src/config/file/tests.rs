use super::*;

fn load_str(toml: &str, env: &[(&str, &str)]) -> Result<RelayConfig, ConfigErrors> {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (relay, problems) = resolve(Figment::new().merge(Toml::string(toml)), &move |name| {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    })?;
    match problems.is_empty() {
        true => Ok(relay),
        false => Err(ConfigErrors(problems)),
    }
}

/// Like [`load_str`], with `vars` as the process environment for overrides.
fn load_with_overrides(toml: &str, vars: &[(&str, &str)]) -> Result<RelayConfig, ConfigErrors> {
    let vars = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    let figment = with_pipeline_overrides(Figment::new().merge(Toml::string(toml)), vars)?;
    let (relay, problems) = resolve(figment, &|_| None)?;
    match problems.is_empty() {
        true => Ok(relay),
        false => Err(ConfigErrors(problems)),
    }
}

const TWO_PIPELINES: &str = r#"
    [kafka]
    bootstrap_servers = "k:9092"
    [[pipelines]]
    name = "orders"
    source_url = "postgres://u@h/orders"
    slot = "orders_slot"
    publication = "pub"
    table = "outbox"
    [[pipelines]]
    name = "Billing"
    source_url = "postgres://u@h/billing"
    slot = "billing_slot"
    publication = "pub"
    table = "outbox"
    kafka = { properties = { "acks" = "all" } }
    "#;

#[test]
fn a_pipeline_with_another_sink_needs_no_kafka_and_resolves_its_url() {
    let toml = r#"
        [kafka]
        bootstrap_servers = "${UNSET_BROKERS}"
        properties = { "linger.ms" = "${UNSET_LINGER}" }
        [[pipelines]]
        name = "orders"
        source_url = "postgres://u@h/orders"
        slot = "orders_slot"
        publication = "pub"
        table = "outbox"
        [pipelines.sink]
        kind = "redis"
        url = "redis://:${REDIS_PASSWORD}@cache:6379"
    "#;
    let figment = Figment::new().merge(Toml::string(toml));
    let env = |name: &str| (name == "REDIS_PASSWORD").then(|| "pw".to_owned());
    let (relay, problems) = resolve(figment, &env).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let SinkConfig::Redis(redis) = &relay.pipelines[0].sink else {
        panic!("not redis")
    };
    assert_eq!(&*redis.url, "redis://:pw@cache:6379");
    assert!(relay.pipelines[0].kafka.properties.is_empty());

    let with_kafka_settings = toml.replace(
        "[pipelines.sink]",
        "kafka = { properties = { \"acks\" = \"all\" } }\n            [pipelines.sink]",
    );
    let figment = Figment::new().merge(Toml::string(&with_kafka_settings));
    let (_, problems) = resolve(figment, &env).unwrap();
    assert_eq!(
        problems[0].field, "pipelines[0].kafka.properties",
        "{problems:?}"
    );
}

#[test]
fn environment_overrides_reach_pipelines_by_index_or_name() {
    let config = load_with_overrides(
        TWO_PIPELINES,
        &[
            ("OUTBOX_RELAY__PIPELINES__0__SLOT", "from_env"),
            ("OUTBOX_RELAY__PIPELINES__0__MAX_IN_FLIGHT_EVENTS", "42"),
            (
                "OUTBOX_RELAY__PIPELINES__orders__ROUTE__TOPIC_CASE",
                "lower",
            ),
            ("OUTBOX_RELAY__PIPELINES__BILLING__PUBLICATION", "123"),
            (
                "OUTBOX_RELAY__PIPELINES__1__KAFKA__BOOTSTRAP_SERVERS",
                "b:9092",
            ),
            (
                "OUTBOX_RELAY__PIPELINES__Billing__KAFKA__PROPERTIES__BATCH_SIZE",
                "1000",
            ),
            ("outbox_relay__pipelines__1__create_slot", "false"),
            ("OTHER__PIPELINES__0__SLOT", "ignored"),
        ],
    )
    .unwrap();
    let [orders, billing] = &config.pipelines[..] else {
        panic!("two pipelines expected: {:?}", config.pipelines)
    };
    assert_eq!(orders.slot, "from_env");
    assert_eq!(orders.max_in_flight_events, 42);
    assert_eq!(orders.route.topic_case, crate::config::TopicCase::Lower);
    assert_eq!(orders.publication, "pub", "untouched fields stay");
    assert_eq!(orders.kafka.bootstrap_servers, "k:9092");
    // A number where the file has a string stays the string.
    assert_eq!(billing.publication, "123");
    assert_eq!(billing.slot, "billing_slot");
    assert_eq!(billing.kafka.bootstrap_servers, "b:9092");
    assert!(!billing.create_slot);
    assert!(billing
        .kafka
        .properties
        .contains(&("batch_size".into(), "1000".into())));
    assert!(billing
        .kafka
        .properties
        .contains(&("acks".into(), "all".into())));
}

#[test]
fn an_override_of_a_missing_pipeline_or_without_a_field_names_the_variable() {
    let errors = load_with_overrides(
        TWO_PIPELINES,
        &[
            ("OUTBOX_RELAY__PIPELINES__2__SLOT", "x"),
            ("OUTBOX_RELAY__PIPELINES__shipping__SLOT", "x"),
            ("OUTBOX_RELAY__PIPELINES__orders", "x"),
            ("OUTBOX_RELAY__PIPELINES__0__SLOT__NAME", "x"),
        ],
    )
    .unwrap_err();
    let text = errors.to_string();
    for expected in [
        "OUTBOX_RELAY__PIPELINES__2__SLOT: no pipeline at index 2: the file has 2",
        "OUTBOX_RELAY__PIPELINES__shipping__SLOT: no pipeline named \"shipping\"",
        "OUTBOX_RELAY__PIPELINES__orders: name a field",
        "OUTBOX_RELAY__PIPELINES__0__SLOT__NAME: pipelines[0].slot is not a table",
    ] {
        assert!(text.contains(expected), "{expected:?} missing in {text}");
    }
    // An unknown field is the usual unknown-field error, with its path.
    let errors = load_with_overrides(TWO_PIPELINES, &[("OUTBOX_RELAY__PIPELINES__0__SLOTT", "x")])
        .unwrap_err();
    assert!(errors.to_string().contains("slott"), "{errors}");
}

#[test]
fn a_pipeline_named_like_another_index_makes_that_index_ambiguous() {
    let toml = TWO_PIPELINES.replace("\"Billing\"", "\"0\"");
    let errors =
        load_with_overrides(&toml, &[("OUTBOX_RELAY__PIPELINES__0__SLOT", "x")]).unwrap_err();
    assert!(
        errors
            .to_string()
            .contains("\"0\" is both the index of pipelines[0] and the name of pipelines[1]"),
        "{errors}"
    );
    // Index 1 is unambiguous.
    let config = load_with_overrides(&toml, &[("OUTBOX_RELAY__PIPELINES__1__SLOT", "x")]).unwrap();
    assert_eq!(config.pipelines[1].slot, "x");
}

#[test]
fn names_differing_only_in_case_need_the_exact_name_or_an_index() {
    let toml = TWO_PIPELINES.replace("\"Billing\"", "\"ORDERS\"");
    let config =
        load_with_overrides(&toml, &[("OUTBOX_RELAY__PIPELINES__ORDERS__SLOT", "b")]).unwrap();
    assert_eq!(config.pipelines[1].slot, "b", "exact name wins");
    let errors =
        load_with_overrides(&toml, &[("OUTBOX_RELAY__PIPELINES__Orders__SLOT", "b")]).unwrap_err();
    assert!(
        errors.to_string().contains("select it by index"),
        "{errors}"
    );
}

#[test]
// figment::Jail's closure returns figment's (large) error type.
#[allow(clippy::result_large_err)]
fn load_merges_top_level_and_pipeline_variables_from_the_process_environment() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("relay.toml", TWO_PIPELINES)?;
        jail.set_env("OUTBOX_RELAY__KAFKA__BOOTSTRAP_SERVERS", "env:9092");
        jail.set_env("OUTBOX_RELAY__PIPELINES__BILLING__SLOT", "env_slot");
        let config = load(&jail.directory().join("relay.toml")).map_err(|e| e.to_string())?;
        assert_eq!(config.pipelines.len(), 2, "the array is kept");
        assert_eq!(config.pipelines[0].kafka.bootstrap_servers, "env:9092");
        assert_eq!(config.pipelines[0].slot, "orders_slot");
        assert_eq!(config.pipelines[1].slot, "env_slot");
        jail.set_env("OUTBOX_RELAY__PIPELINES__7__SLOT", "x");
        let errors = load(&jail.directory().join("relay.toml")).unwrap_err();
        assert!(
            errors
                .to_string()
                .contains("OUTBOX_RELAY__PIPELINES__7__SLOT"),
            "{errors}"
        );
        Ok(())
    });
}

#[test]
fn pipeline_kafka_settings_override_the_defaults() {
    let config = load_str(
        r#"
        [kafka]
        bootstrap_servers = "a:9092"
        properties = { "linger.ms" = "5", "compression.type" = "lz4" }
        [[pipelines]]
        name = "p"
        source_url = "postgres://u@h/db"
        slot = "s"
        publication = "pub"
        table = "outbox"
        kafka = { bootstrap_servers = "b:9092", properties = { "linger.ms" = "0" } }
        route = { by_field = "tenant_id", topic_template = "t.${routedByValue}", topic_case = "lower" }
        "#,
        &[],
    )
    .unwrap();
    let kafka = &config.pipelines[0].kafka;
    assert_eq!(kafka.bootstrap_servers, "b:9092");
    let route = &config.pipelines[0].route;
    assert_eq!(
        (route.by_field.as_deref(), route.topic_template.as_str()),
        (Some("tenant_id"), "t.${routedByValue}")
    );
    assert_eq!(route.topic_case, crate::config::TopicCase::Lower);
    assert!(kafka.properties.contains(&("linger.ms".into(), "0".into())));
    assert!(kafka
        .properties
        .contains(&("compression.type".into(), "lz4".into())));
}

/// `properties_file` layers under `properties` at each level: `[kafka]`'s file, its table,
/// the pipeline's file, its table; a file's values are taken as written (`${...}` stays).
#[test]
fn kafka_properties_files_layer_under_the_tables_and_keep_their_text() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let shared = write(
        "shared.properties",
        "sasl.username=relay\nsasl.password=${not expanded}\nlinger.ms=50\nacks=all\n",
    );
    let own = write("own.properties", "linger.ms=20\ncompression.type=zstd\n");
    let config = load_str(
        &format!(
            r#"
        [kafka]
        bootstrap_servers = "a:9092"
        properties_file = "{shared}"
        properties = {{ "linger.ms" = "5", "compression.type" = "lz4" }}
        [[pipelines]]
        name = "p"
        source_url = "postgres://u@h/db"
        slot = "s"
        publication = "pub"
        table = "outbox"
        kafka = {{ properties_file = "{own}", properties = {{ "compression.type" = "${{CODEC}}" }} }}
        "#
        ),
        &[("CODEC", "gzip")],
    )
    .unwrap();
    let kafka = &config.pipelines[0].kafka;
    let get = |key: &str| {
        kafka
            .properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("sasl.username"), Some("relay"));
    assert_eq!(get("sasl.password"), Some("${not expanded}"));
    assert_eq!(get("linger.ms"), Some("20"));
    assert_eq!(get("compression.type"), Some("gzip"));
    assert_eq!(kafka.properties_file, None, "read into properties");

    // A file that cannot be read, or a line that is no property, is named by its setting.
    let bad = write("bad.properties", "hunter2\n");
    for (file, expected) in [
        (
            dir.path().join("absent").display().to_string(),
            "cannot read",
        ),
        (bad, "line 1: expected key=value"),
    ] {
        let errors = load_str(
            &format!(
                r#"
        [[pipelines]]
        name = "p"
        source_url = "postgres://u@h/db"
        slot = "s"
        publication = "pub"
        table = "outbox"
        kafka = {{ bootstrap_servers = "a:9092", properties_file = "{file}" }}
        "#
            ),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            errors.contains("pipelines[0].kafka.properties_file") && errors.contains(expected),
            "{errors}"
        );
        assert!(!errors.contains("hunter2"), "{errors}");
    }
}

#[test]
fn lists_every_problem_with_its_field_path() {
    let errors = load_str(
        r#"
        [[pipelines]]
        name = "a"
        source_url = "${MISSING_URL}"
        slot = "Bad-Slot"
        publication = "pub"
        table = "outbox"
        [[pipelines]]
        name = "a"
        source_url = "postgres://u@h/db"
        slot = "ok"
        publication = "pub"
        table = "outbox"
        kafka = { properties = { "acks" = "1" } }
        "#,
        &[],
    )
    .unwrap_err();
    let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    for expected in [
        "pipelines[0].source_url",
        "pipelines[0].kafka.bootstrap_servers",
        "pipelines[1].name",
        "pipelines[1].kafka.bootstrap_servers",
    ] {
        assert!(fields.contains(&expected), "{expected} missing in {errors}");
    }
    assert!(errors.to_string().contains("MISSING_URL"));
}

#[test]
fn unknown_fields_and_wrong_types_name_the_key() {
    let errors = load_str("[[pipelines]]\nname = \"a\"\nslott = \"x\"\n", &[]).unwrap_err();
    assert!(errors.to_string().contains("slott"), "{errors}");
    // Also in every table of a pipeline: a misspelt column would silently read the default.
    for table in ["columns", "route", "kafka", "polling"] {
        let errors = load_str(
            &format!("[[pipelines]]\nname = \"a\"\ntable = \"t\"\n{table} = {{ aggregatetype = \"x\" }}\n"),
            &[],
        )
        .unwrap_err();
        assert!(
            errors.to_string().contains("aggregatetype"),
            "{table}: {errors}"
        );
    }
    let errors = load_str("[[pipelines]]\nname = \"a\"\nsource_url = \"x\"\nslot = \"s\"\npublication = \"p\"\ntable = \"t\"\nmax_in_flight_events = \"many\"\n", &[]).unwrap_err();
    assert!(
        errors.to_string().contains("max_in_flight_events"),
        "{errors}"
    );
}

/// A pipeline with a value other than the default in every field.
fn every_field_set() -> PipelineConfig {
    use crate::config::*;
    PipelineConfig {
        source_url: "postgres://u@h/db".into(),
        slot: "s".into(),
        publication: "Pub".into(),
        source_kind: SourceKind::Polling,
        polling: PollingConfig {
            batch_size: 7,
            mark: MarkMode::Flag,
            notify_channel: Some("c".into()),
            ..PollingConfig::default()
        },
        columns: OutboxColumns {
            id: "event_id".into(),
            timestamp: Some("created_at".into()),
            traceparent: Some("tp".into()),
            tracestate: Some("ts".into()),
            tracing_span_context: Some("ctx".into()),
            ..OutboxColumns::default()
        },
        message_prefix: Some("outbox".into()),
        route: RouteConfig {
            by_field: Some("tenant".into()),
            topic_template: "t.${routedByValue}".into(),
            topic_case: TopicCase::Lower,
            topic_regex: Some("(.*)".into()),
            allowed_destinations: None,
        },
        additional_placement: vec![AdditionalPlacement {
            field: "tenant".into(),
            placement: Placement::Header,
            alias: Some("t".into()),
        }],
        value_format: ValueFormat::Envelope,
        null_payload: NullPayload::JsonNull,
        on_bad_event: OnBadEvent::DeadLetter,
        dead_letter_topic: Some("dlq".into()),
        op_invalid_behavior: InvalidOpBehavior::Warn,
        create_slot: false,
        kafka: KafkaConfig {
            bootstrap_servers: "k:9092".into(),
            properties: vec![("linger.ms".into(), "5".into())],
            properties_file: None,
            create_topics: None,
        },
        status_interval_ms: 2,
        max_in_flight_events: 3,
        max_in_flight_bytes: 4,
        max_event_bytes: Some(5),
        shutdown_timeout_secs: 5,
        terminate_stale_walsender_after_secs: Some(6),
        exactly_once: true,
        transactional_id: Some("tx".into()),
        checkpoint_topic: Some("cp".into()),
        ..PipelineConfig::new("p", "app.\"Outbox\"".parse().unwrap())
    }
}

#[test]
fn a_pipeline_serializes_to_the_file_it_was_read_from() {
    let file = |pipeline: PipelineConfig| FileConfig {
        pipelines: vec![pipeline],
        ..FileConfig::default()
    };
    for pipeline in [
        every_field_set(),
        PipelineConfig::new("q", "outbox".parse().unwrap()),
    ] {
        let toml = toml::to_string(&file(pipeline.clone())).unwrap();
        let read: FileConfig = Figment::new()
            .merge(Toml::string(&toml))
            .extract()
            .unwrap_or_else(|e| panic!("{e}\n{toml}"));
        assert_eq!(read.pipelines, [pipeline], "{toml}");
    }
    // Defaults are left out: the entry says what differs.
    let plain =
        toml::to_string(&file(PipelineConfig::new("q", "outbox".parse().unwrap()))).unwrap();
    let keys: Vec<&str> = plain
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(key, _)| key))
        .collect();
    assert_eq!(
        keys,
        ["name", "table", "topic_template", "topic_case"],
        "{plain}"
    );
}

#[test]
fn expands_environment_references() {
    let env = |name: &str| (name == "PW").then(|| "s3cret".to_owned());
    assert_eq!(
        expand("postgres://u:${PW}@h/db", &env).unwrap(),
        "postgres://u:s3cret@h/db"
    );
    assert_eq!(expand("plain", &env).unwrap(), "plain");
    assert!(expand("${NOPE}", &env).unwrap_err().contains("NOPE"));
    assert!(expand("${PW", &env).is_err());
}

/// An override of a secret is the variable's text as it is (`0042` is no number 42), and a
/// value of the wrong type is named by its field, never shown (it may be a secret).
#[test]
fn overrides_keep_secrets_as_text_and_type_errors_do_not_show_values() {
    let toml = r#"
        [[pipelines]]
        name = "hooks"
        source_url = "postgres://u@h/orders"
        slot = "hooks_slot"
        publication = "pub"
        table = "outbox"
        [pipelines.sink]
        kind = "http"
        url = "https://hooks.example.com/{destination}"
    "#;
    let config = load_with_overrides(
        toml,
        &[("OUTBOX_RELAY__PIPELINES__0__SINK__SECRET", "0042")],
    )
    .unwrap();
    let SinkConfig::Http(http) = &config.pipelines[0].sink else {
        panic!("not http")
    };
    assert_eq!(&*http.secret, "0042");
    let config = load_with_overrides(
        toml,
        &[("OUTBOX_RELAY__PIPELINES__0__SOURCE_PASSWORD", "0042")],
    )
    .unwrap();
    assert_eq!(config.pipelines[0].source_password.as_deref(), Some("0042"));

    let without_url = toml.replace("url = \"https", "# url = \"https");
    let errors = load_with_overrides(
        &without_url,
        &[("OUTBOX_RELAY__PIPELINES__0__SINK__URL", "987654321")],
    )
    .unwrap_err()
    .to_string();
    assert!(
        errors.contains("sink.url") || errors.contains("sink"),
        "{errors}"
    );
    assert!(errors.contains("expected"), "{errors}");
    assert!(
        !errors.contains("987654321"),
        "the value is shown: {errors}"
    );
}

/// Found by review: a syntax error went out with the TOML parser's snippet of the line, so an
/// unterminated secret was printed in the log. The error gives the line and column instead.
#[test]
fn a_syntax_error_names_the_line_without_showing_it() {
    let toml = "[[pipelines]]\nname = \"hooks\"\n[pipelines.sink]\nkind = \"http\"\nsecret = \"s3cr3t-value-xyz\nurl = \"https://h\"\n";
    let errors = load_str(toml, &[]).unwrap_err().to_string();
    assert!(errors.contains("line 5"), "{errors}");
    assert!(!errors.contains("s3cr3t"), "the line is shown: {errors}");
    let unquoted = toml.replace("\"s3cr3t-value-xyz", "0042");
    let errors = load_str(&unquoted, &[]).unwrap_err().to_string();
    assert!(errors.contains("line 5"), "{errors}");
    assert!(!errors.contains("0042"), "the line is shown: {errors}");
}

#[test]
fn the_log_section_is_read_on_its_own_and_a_broken_file_gives_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    std::fs::write(
        &path,
        "[log]\nlevel = \"debug\"\nformat = \"json\"\n[[pipelines]]\nname = 1\n",
    )
    .unwrap();
    let log = super::log_section(&path);
    assert_eq!(log.level.as_deref(), Some("debug"));
    assert_eq!(log.format, Some(crate::logging::LogFormat::Json));
    std::fs::write(&path, "[log\nlevel = ").unwrap();
    assert_eq!(super::log_section(&path), super::LogSection::default());
}

#[test]
fn every_unknown_key_is_reported_at_once_with_the_key_it_resembles() {
    let errors = load_str(
        "[kafka]\nbootstrap_servers = \"k:9092\"\n[[pipelines]]\nname = \"p\"\ntable = \"public.outbox\"\nslott = \"s\"\nsource_urll = \"x\"\n[pipelines.routee]\nby_field = \"t\"\n[metrics]\nlisen = \"127.0.0.1:1\"\n",
        &[],
    )
    .unwrap_err();
    let text = errors.to_string();
    for expected in [
        "pipelines[0].slott: unknown key; did you mean `slot`?",
        "pipelines[0].source_urll: unknown key; did you mean `source_url`?",
        "pipelines[0].routee: unknown key; did you mean `route`?",
        "metrics.lisen: unknown key; did you mean `listen`?",
    ] {
        assert!(text.contains(expected), "{expected} missing in {text}");
    }
    assert_eq!(errors.0.len(), 4, "{text}");
}

#[test]
// figment::Jail's closure returns figment's (large) error type.
#[allow(clippy::result_large_err)]
fn the_log_section_takes_its_environment_overrides() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("relay.toml", "[log]\nlevel = \"warn\"\n")?;
        let path = jail.directory().join("relay.toml");
        assert_eq!(super::log_section(&path).level.as_deref(), Some("warn"));
        jail.set_env("OUTBOX_RELAY__LOG__LEVEL", "debug");
        jail.set_env("OUTBOX_RELAY__LOG__FORMAT", "json");
        let log = super::log_section(&path);
        assert_eq!(log.level.as_deref(), Some("debug"));
        assert_eq!(log.format, Some(crate::logging::LogFormat::Json));
        Ok(())
    });
}
