//! The checks of a pipeline's routing and record options, with their field paths: what
//! [`Router::new`](super::Router::new) refuses to build.

use std::collections::HashSet;

use super::{compile_topic_regex, Template};
use crate::config::{
    matches_destination, ConfigError, OnBadEvent, PipelineConfig, Placement, ValueFormat,
};

/// Checks a pipeline's routing and record options (`route`, including an allow-list that
/// admits the dead-letter or a checkpoint topic, `columns.timestamp`,
/// `additional_placement`, `value_format`, `on_bad_event`, `dead_letter_topic`).
///
/// Returns every problem found, each naming its field path.
pub(super) fn problems(config: &PipelineConfig) -> Vec<ConfigError> {
    let mut problems = Vec::new();
    let mut problem = |field: &str, text: String| problems.push(ConfigError::new(field, text));
    let no_columns =
        "cannot be combined with message_prefix: logical messages carry no such column";
    let route = &config.route;
    if route.by_field.as_deref() == Some("") {
        problem("route.by_field", "must not be empty".into());
    }
    if route.by_field.is_some() && config.message_prefix.is_some() {
        problem("route.by_field", no_columns.into());
    }
    let regex = match route.topic_regex.as_deref().map(compile_topic_regex) {
        Some(Err(e)) => {
            problem("route.topic_regex", e);
            None
        }
        Some(Ok(regex)) => Some(regex),
        None => None,
    };
    if route.topic_template.is_empty() {
        problem("route.topic_template", "must not be empty".into());
    } else {
        match Template::parse(&route.topic_template) {
            Err(e) => problem("route.topic_template", e),
            Ok(template) => {
                if let Err(e) = template.check_groups(regex.as_ref(), route.topic_regex.is_some()) {
                    problem("route.topic_template", e);
                }
                if template.columns().next().is_some() && config.message_prefix.is_some() {
                    problem(
                        "route.topic_template",
                        format!("${{column:...}} {no_columns}"),
                    );
                }
                if let Err(reason) = config.sink.check_destination(&template.sample()) {
                    problem(
                        "route.topic_template",
                        format!(
                            "gives no legal {}: {reason}",
                            config.sink.destination_noun()
                        ),
                    );
                }
            }
        }
    }
    if let Some(allowed) = &route.allowed_destinations {
        if allowed.is_empty() {
            problem(
                "route.allowed_destinations",
                "must not be empty: list the destinations rows may route to, or leave it out to allow any".into(),
            );
        }
        let reserved = super::reserved_destinations(config);
        for (i, entry) in allowed.iter().enumerate() {
            let at = format!("route.allowed_destinations[{i}]");
            if entry.is_empty() {
                problem(&at, "must not be empty".into());
                continue;
            }
            if !entry.contains('*') {
                if let Err(reason) = config.sink.check_destination(entry) {
                    problem(
                        &at,
                        format!(
                            "{entry:?} is not a legal {}: {reason}",
                            config.sink.destination_noun()
                        ),
                    );
                }
            }
            for (topic, field) in &reserved {
                if matches_destination(entry, topic) {
                    problem(
                        &at,
                        format!("{entry:?} admits {topic:?}, the {field}: rows never route there; list the destinations without it"),
                    );
                }
            }
        }
    }
    match config.columns.timestamp.as_deref() {
        Some("") => problem("columns.timestamp", "must not be empty".into()),
        Some(_) if config.message_prefix.is_some() => {
            problem("columns.timestamp", no_columns.into())
        }
        _ => {}
    }
    let mut partitions = 0;
    let mut envelope_names = HashSet::new();
    for (i, placement) in config.additional_placement.iter().enumerate() {
        let at = |field: &str| format!("additional_placement[{i}].{field}");
        if placement.field.is_empty() {
            problem(&at("field"), "must not be empty".into());
        } else if config.message_prefix.is_some() {
            problem(&at("field"), no_columns.into());
        }
        if placement.alias.as_deref() == Some("") {
            problem(&at("alias"), "must not be empty".into());
        }
        match placement.placement {
            Placement::Header => {}
            Placement::Partition => {
                partitions += 1;
                if partitions > 1 {
                    problem(
                        &at("placement"),
                        "only one partition placement is allowed".into(),
                    );
                }
            }
            Placement::Envelope => {
                if config.value_format != ValueFormat::Envelope {
                    problem(
                        &at("placement"),
                        "envelope placement needs value_format = \"envelope\"".into(),
                    );
                }
                let name = placement.name();
                if name == "payload" || !envelope_names.insert(name) {
                    problem(
                        &at("alias"),
                        format!("envelope field {name:?} is already used (\"payload\" is the payload's)"),
                    );
                }
            }
        }
    }
    super::cloudevents::problems(config, &mut problem);
    super::trace::problems(config, &mut problem);
    match (config.on_bad_event, config.dead_letter_topic.as_deref()) {
        (OnBadEvent::DeadLetter, None) => problem(
            "dead_letter_topic",
            "required when on_bad_event = \"dead_letter\"".into(),
        ),
        (OnBadEvent::DeadLetter, Some(topic)) => {
            if let Err(e) = config.sink.check_dead_letter(topic) {
                problem("dead_letter_topic", e);
            }
        }
        (OnBadEvent::Halt, Some(_)) => problem(
            "dead_letter_topic",
            "only used with on_bad_event = \"dead_letter\"".into(),
        ),
        (OnBadEvent::Halt, None) => {}
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AdditionalPlacement, NullPayload};

    fn config() -> PipelineConfig {
        PipelineConfig::test_pipeline()
    }

    fn placement(field: &str, placement: Placement, alias: Option<&str>) -> AdditionalPlacement {
        AdditionalPlacement {
            field: field.into(),
            placement,
            alias: alias.map(str::to_owned),
        }
    }

    #[test]
    fn every_bad_routing_combination_names_its_field() {
        type Mutate = Box<dyn Fn(&mut PipelineConfig)>;
        let cases: Vec<(&str, Mutate)> = vec![
            (
                "route.topic_regex",
                Box::new(|c| c.route.topic_regex = Some("(".into())),
            ),
            (
                "route.topic_template",
                Box::new(|c| c.route.topic_template = "${name}.events".into()),
            ),
            (
                "route.topic_template",
                Box::new(|c| {
                    c.route.topic_regex = Some("(?P<name>.+)".into());
                    c.route.topic_template = "${other}.${2}".into();
                }),
            ),
            (
                "route.topic_template",
                Box::new(|c| c.route.topic_template = "${column:tenant_id".into()),
            ),
            (
                "route.topic_template",
                Box::new(|c| {
                    c.route.topic_template = "${column:tenant_id}.events".into();
                    c.message_prefix = Some("outbox".into());
                }),
            ),
            (
                "route.topic_template",
                Box::new(|c| c.route.topic_template = String::new()),
            ),
            (
                "columns.timestamp",
                Box::new(|c| c.columns.timestamp = Some(String::new())),
            ),
            (
                "columns.timestamp",
                Box::new(|c| {
                    c.columns.timestamp = Some("created_at".into());
                    c.message_prefix = Some("outbox".into());
                }),
            ),
            (
                "additional_placement[0].field",
                Box::new(|c| c.additional_placement = vec![placement("", Placement::Header, None)]),
            ),
            (
                "additional_placement[0].alias",
                Box::new(|c| {
                    c.additional_placement = vec![placement("t", Placement::Header, Some(""))]
                }),
            ),
            (
                "additional_placement[1].placement",
                Box::new(|c| {
                    c.additional_placement = vec![
                        placement("a", Placement::Partition, None),
                        placement("b", Placement::Partition, None),
                    ]
                }),
            ),
            (
                "additional_placement[0].placement",
                Box::new(|c| {
                    c.additional_placement = vec![placement("a", Placement::Envelope, None)]
                }),
            ),
            (
                "additional_placement[0].alias",
                Box::new(|c| {
                    c.value_format = ValueFormat::Envelope;
                    c.additional_placement =
                        vec![placement("p", Placement::Envelope, Some("payload"))]
                }),
            ),
            (
                "additional_placement[1].alias",
                Box::new(|c| {
                    c.value_format = ValueFormat::Envelope;
                    c.additional_placement = vec![
                        placement("a", Placement::Envelope, Some("x")),
                        placement("x", Placement::Envelope, None),
                    ]
                }),
            ),
            (
                "additional_placement[0].field",
                Box::new(|c| {
                    c.additional_placement = vec![placement("t", Placement::Header, None)];
                    c.message_prefix = Some("outbox".into());
                }),
            ),
            (
                "dead_letter_topic",
                Box::new(|c| c.on_bad_event = OnBadEvent::DeadLetter),
            ),
            (
                "dead_letter_topic",
                Box::new(|c| {
                    c.on_bad_event = OnBadEvent::DeadLetter;
                    c.dead_letter_topic = Some("dead letters".into());
                }),
            ),
            (
                "dead_letter_topic",
                Box::new(|c| c.dead_letter_topic = Some("dlq".into())),
            ),
            (
                "route.allowed_destinations",
                Box::new(|c| c.route.allowed_destinations = Some(vec![])),
            ),
            (
                "route.allowed_destinations[1]",
                Box::new(|c| {
                    c.route.allowed_destinations = Some(vec!["*.events".into(), String::new()])
                }),
            ),
            (
                "route.allowed_destinations[0]",
                Box::new(|c| c.route.allowed_destinations = Some(vec!["bad topic".into()])),
            ),
            (
                "route.allowed_destinations[1]",
                Box::new(|c| {
                    c.on_bad_event = OnBadEvent::DeadLetter;
                    c.dead_letter_topic = Some("outbox.dlq".into());
                    c.route.allowed_destinations =
                        Some(vec!["Order.events".into(), "outbox.*".into()]);
                }),
            ),
            (
                "route.allowed_destinations[0]",
                Box::new(|c| {
                    c.exactly_once = true;
                    c.checkpoint_topic = Some("relay.checkpoints".into());
                    c.route.allowed_destinations = Some(vec!["*.checkpoints".into()]);
                }),
            ),
            (
                "route.allowed_destinations[0]",
                Box::new(|c| c.route.allowed_destinations = Some(vec!["*".into()])),
            ),
        ];
        for (field, mutate) in cases {
            let mut c = config();
            mutate(&mut c);
            let problems = problems(&c);
            assert!(
                problems.iter().any(|p| p.field == field),
                "{field}: {problems:?}"
            );
            assert_eq!(super::super::Router::new(&c).unwrap_err().0, problems);
            assert_eq!(crate::validation::pipeline(&c)[0].field, problems[0].field);
        }
        let mut good = config();
        good.columns.timestamp = Some("created_at".into());
        good.route.topic_regex = Some("(?P<domain>[a-z]+)_(v[0-9]+)".into());
        good.route.topic_template = "${column:tenant_id}.${domain}.${2}.${routedByValue}".into();
        good.additional_placement = vec![
            placement("tenant_id", Placement::Header, Some("tenant")),
            placement("shard", Placement::Partition, None),
            placement("tenant_id", Placement::Envelope, Some("tenant")),
        ];
        good.value_format = ValueFormat::Envelope;
        good.null_payload = NullPayload::Empty;
        good.on_bad_event = OnBadEvent::DeadLetter;
        good.dead_letter_topic = Some("outbox.dlq".into());
        good.route.allowed_destinations = Some(vec!["acme.*.events".into(), "audit".into()]);
        assert!(problems(&good).is_empty(), "{:?}", problems(&good));
        let validation = crate::validation::pipeline(&good);
        assert!(validation.is_empty(), "{validation:?}");
        super::super::Router::new(&good).unwrap();
    }
}
