//! Note severities: values Debezium refuses, differences the relay cannot reproduce, and
//! what JSON expansion carries over.

use super::super::*;
use super::EXAMPLE;

/// The options of the error notes of a refused import.
pub(super) fn refused(err: &ImportError) -> Vec<&str> {
    let ImportError::Refused { notes } = err else {
        panic!("not refused: {err}");
    };
    notes
        .iter()
        .filter(|n| n.severity == Severity::Error)
        .map(|n| n.option.as_str())
        .collect()
}

fn with_router_options(extra: &[(&str, &str)]) -> Result<Imported, ImportError> {
    let mut connector = parse_json(EXAMPLE).unwrap();
    for (k, v) in extra {
        connector
            .options
            .insert(format!("transforms.outbox.{k}"), (*v).into());
    }
    translate(&connector)
}

#[test]
fn values_debezium_refuses_are_all_refused_at_once_with_the_accepted_values() {
    let err = with_router_options(&[
        ("table.op.invalid.behavior", "loud"),
        ("table.expand.json.payload", "yes"),
        ("table.json.payload.null.behavior", "drop"),
        ("table.json.payload.empty.array.behavior", "drop"),
    ])
    .unwrap_err();
    assert_eq!(
        refused(&err),
        [
            "transforms.outbox.table.op.invalid.behavior",
            "transforms.outbox.table.expand.json.payload",
            "transforms.outbox.table.json.payload.null.behavior",
            "transforms.outbox.table.json.payload.empty.array.behavior",
        ]
    );
    let text = err.to_string();
    for accepted in [
        "warn, error and fatal",
        "true and false",
        "ignore and optional_bytes",
        "ignore and optional_string",
    ] {
        assert!(text.contains(accepted), "{accepted} missing in {text}");
    }
    // Errors come first, then the other notes.
    let ImportError::Refused { notes } = &err else {
        unreachable!()
    };
    let severities: Vec<Severity> = notes.iter().map(|n| n.severity).collect();
    let mut sorted = severities.clone();
    sorted.sort();
    assert_eq!(severities, sorted);
    assert!(severities.contains(&Severity::Info), "{notes:?}");
}

#[test]
fn an_sslmode_or_plugin_debezium_refuses_is_refused() {
    let mut connector = parse_json(EXAMPLE).unwrap();
    connector
        .options
        .insert("database.sslmode".into(), "strict".into());
    connector
        .options
        .insert("plugin.name".into(), "test_decoding".into());
    let err = translate(&connector).unwrap_err();
    assert_eq!(refused(&err), ["database.sslmode", "plugin.name"]);
    assert!(
        err.to_string().contains("verify-full")
            && err.to_string().contains("pgoutput and decoderbufs"),
        "{err}"
    );
}

#[test]
fn an_empty_or_malformed_additional_placement_is_refused_as_debezium_refuses_it() {
    for list in [
        "",
        " ",
        ",tenant:header",
        "tenant:header,,region:header",
        "tenant",
    ] {
        let err = with_router_options(&[("table.fields.additional.placement", list)]).unwrap_err();
        assert_eq!(
            refused(&err),
            ["transforms.outbox.table.fields.additional.placement"],
            "{list:?}"
        );
    }
    // Empty pieces at the end are dropped, as Java's String.split drops them.
    let imported =
        with_router_options(&[("table.fields.additional.placement", "tenant:header,")]).unwrap();
    assert!(
        imported.toml.contains(r#"field = "tenant""#),
        "{}",
        imported.toml
    );
}

#[test]
fn json_expansion_is_carried_over_and_behaviours_it_cannot_reproduce_are_differences() {
    let imported = with_router_options(&[
        ("table.expand.json.payload", "true"),
        ("table.json.payload.null.behavior", "ignore"),
    ])
    .unwrap();
    assert!(
        imported
            .toml
            .contains(r#"json_payload = "debezium_expanded""#),
        "{}",
        imported.toml
    );
    let note = |imported: &Imported, option: &str| {
        imported
            .notes
            .iter()
            .find(|n| n.option == format!("transforms.outbox.{option}"))
            .cloned()
            .unwrap_or_else(|| panic!("no note for {option}: {:?}", imported.notes))
    };
    assert_eq!(
        note(&imported, "table.json.payload.null.behavior").severity,
        Severity::Info
    );
    let imported = with_router_options(&[
        ("table.expand.json.payload", "true"),
        ("table.json.payload.null.behavior", "optional_bytes"),
        ("table.json.payload.empty.array.behavior", "OPTIONAL_STRING"),
    ])
    .unwrap();
    for option in [
        "table.json.payload.null.behavior",
        "table.json.payload.empty.array.behavior",
    ] {
        let note = note(&imported, option);
        assert_eq!(note.severity, Severity::Difference, "{note}");
        assert!(note.reason.contains("not supported"), "{note}");
    }
    // The transform's own field.name.adjustment.mode renames expanded fields.
    let imported = with_router_options(&[
        ("table.expand.json.payload", "true"),
        ("field.name.adjustment.mode", "avro"),
    ])
    .unwrap();
    assert_eq!(
        note(&imported, "field.name.adjustment.mode").severity,
        Severity::Difference
    );
    // Without expansion the relay keeps the stored text.
    let imported = with_router_options(&[("table.expand.json.payload", "false")]).unwrap();
    assert!(!imported.toml.contains("json_payload"), "{}", imported.toml);
}

#[test]
fn converters_the_relay_cannot_reproduce_are_differences_sorted_before_the_rest() {
    let mut connector = parse_json(EXAMPLE).unwrap();
    for (k, v) in [
        ("value.converter", "io.confluent.connect.avro.AvroConverter"),
        (
            "value.converter.schema.registry.url",
            "http://registry:8081",
        ),
        (
            "key.converter",
            "org.apache.kafka.connect.storage.StringConverter",
        ),
    ] {
        connector.options.insert(k.into(), v.into());
    }
    let imported = translate(&connector).unwrap();
    let avro = imported
        .notes
        .iter()
        .find(|n| n.option == "value.converter")
        .unwrap();
    assert_eq!(avro.severity, Severity::Difference);
    assert!(
        avro.reason.contains("not supported") && avro.reason.contains("schema registry"),
        "{avro}"
    );
    assert!(imported.differences() >= 2, "{:?}", imported.notes);
    let severities: Vec<Severity> = imported.notes.iter().map(|n| n.severity).collect();
    let mut sorted = severities.clone();
    sorted.sort();
    assert_eq!(severities, sorted, "{:?}", imported.notes);
    assert!(avro
        .to_string()
        .starts_with("difference: value.converter: "));
    // JsonConverter without schemas writes an expanded payload as json_payload does.
    let mut connector = parse_json(EXAMPLE).unwrap();
    for (k, v) in [
        (
            "value.converter",
            "org.apache.kafka.connect.json.JsonConverter",
        ),
        ("value.converter.schemas.enable", "false"),
        (
            "key.converter",
            "org.apache.kafka.connect.storage.StringConverter",
        ),
        ("transforms.outbox.table.expand.json.payload", "true"),
    ] {
        connector.options.insert(k.into(), v.into());
    }
    let imported = translate(&connector).unwrap();
    assert_eq!(imported.differences(), 0, "{:?}", imported.notes);
}

#[test]
fn the_event_type_note_says_debezium_defines_the_option() {
    let imported = translate(&parse_json(EXAMPLE).unwrap()).unwrap();
    let note = imported
        .notes
        .iter()
        .find(|n| n.option == "columns.event_type")
        .expect("a note for the event type column");
    assert!(
        note.reason
            .contains("default of Debezium's table.field.event.type")
            && !note.reason.contains("no such option"),
        "{note}"
    );
}

#[test]
fn options_that_do_not_change_the_records_are_info_and_those_that_do_are_differences() {
    let mut connector = parse_json(EXAMPLE).unwrap();
    for (k, v) in [
        ("predicates", "isOutbox"),
        (
            "predicates.isOutbox.type",
            "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
        ),
        ("transforms.outbox.predicate", "isOutbox"),
        ("errors.tolerance", "none"),
        ("column.propagate.source.type", ".*"),
        ("column.mask.with.12.chars", "public.outboxevent.payload"),
        ("errors.deadletterqueue.topic.name", "dlq"),
    ] {
        connector.options.insert(k.into(), v.into());
    }
    let imported = translate(&connector).unwrap();
    let severity = |option: &str| {
        imported
            .notes
            .iter()
            .find(|n| n.option == option)
            .map(|n| n.severity)
            .unwrap_or_else(|| panic!("no note for {option}: {:?}", imported.notes))
    };
    for option in [
        "predicates",
        "predicates.isOutbox.type",
        "transforms.outbox.predicate",
        "errors.tolerance",
        "column.propagate.source.type",
    ] {
        assert_eq!(severity(option), Severity::Info, "{option}");
    }
    for option in [
        "column.mask.with.12.chars",
        "errors.deadletterqueue.topic.name",
    ] {
        assert_eq!(severity(option), Severity::Difference, "{option}");
    }
}
