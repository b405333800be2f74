//! The Outbox Event Router transform's options: the outbox columns, the route, the record
//! options, JSON expansion. Debezium validates them when the connector starts; a value it
//! refuses is an error note here too, with the values it takes.

use super::{boolean, Importer, Note, Severity, DEFAULT_TOPIC_REGEX, DEFAULT_TOPIC_REPLACEMENT};
use crate::config::{
    AdditionalPlacement, EmptyPayload, InvalidOpBehavior, JsonPayload, MissingPlacementColumn,
    NullPayload, OutboxColumns, PipelineConfig, Placement, RouteConfig, ValueFormat,
};

impl Importer {
    /// Sets `pipeline`'s columns, route and record options from the Event Router transform
    /// `alias`.
    pub(super) fn router(&mut self, alias: &str, pipeline: &mut PipelineConfig) {
        let option = |name: &str| format!("transforms.{alias}.{name}");
        self.take(&option("type"));
        let get = |im: &mut Importer, name: &str| im.take(&option(name));
        let event_type = get(self, "table.field.event.type").unwrap_or_else(|| {
            self.note("columns.event_type", "\"type\", the default of Debezium's table.field.event.type: Debezium reads the column only where table.fields.additional.placement places it, while outbox-relay requires it and always sends it as header event_type (one more header); name yours if it differs");
            "type".into()
        });
        let topic_regex = get(self, "route.topic.regex").filter(|r| r != DEFAULT_TOPIC_REGEX);
        if topic_regex.is_some() {
            self.difference(&option("route.topic.regex"), "copied to route.topic_regex (Java regex syntax); where it did not match, Debezium's RegexRouter kept the routing value itself as the topic, while outbox-relay stops on such an event (on_bad_event): check the values your services write");
        }
        // A NULL or empty payload gives a tombstone (value_format envelope included).
        let tombstone_on_empty = self.boolean_option(&option("route.tombstone.on.empty.payload"));
        if tombstone_on_empty {
            pipeline.empty_payload = EmptyPayload::Tombstone;
        }
        let op_invalid = ["table.op.invalid.behavior", "debezium.op.invalid.behavior"]
            .into_iter()
            .find_map(|name| get(self, name).map(|value| (option(name), value)));
        let op_invalid_behavior = op_invalid.and_then(|(option, value)| {
            let mapped = match value.trim().to_ascii_lowercase().as_str() {
                "fatal" => {
                    self.difference(&option, "fatal becomes op_invalid_behavior = \"error\", which stops the pipeline on a DELETE of an outbox row too (Debezium drops deletes silently) when the publication publishes deletes; if your services delete outbox rows, publish inserts only or leave it out");
                    InvalidOpBehavior::Error
                }
                "error" => {
                    self.note(&option, "error (log at level ERROR and go on) becomes op_invalid_behavior = \"warn\" (log at level WARN and go on): outbox-relay's \"error\" stops the pipeline, like Debezium's fatal; it needs a publication that publishes updates, and logs deletes too");
                    InvalidOpBehavior::Warn
                }
                "warn" => {
                    self.note(&option, "op_invalid_behavior = \"warn\": it needs a publication that publishes updates, and logs deletes too (Debezium drops them silently)");
                    InvalidOpBehavior::Warn
                }
                _ => {
                    self.refuse(&option, &value, "warn, error and fatal");
                    return None;
                }
            };
            Some(mapped)
        });
        if let Some(value) = get(self, "table.field.additional.missing") {
            match value.trim().to_ascii_lowercase().as_str() {
                "error" => pipeline.missing_placement_column = MissingPlacementColumn::Error,
                "ignore" => pipeline.missing_placement_column = MissingPlacementColumn::Ignore,
                _ => self.refuse(
                    &option("table.field.additional.missing"),
                    &value,
                    "error and ignore",
                ),
            }
        }
        let additional = match get(self, "table.fields.additional.placement") {
            Some(list) => match additional_placement(&list) {
                Ok(additional) => additional,
                Err(reason) => {
                    let option = option("table.fields.additional.placement");
                    self.notes.push(Note {
                        severity: Severity::Error,
                        option,
                        reason,
                    });
                    Vec::new()
                }
            },
            None => Vec::new(),
        };
        self.json_expansion(alias, pipeline);
        pipeline.columns = OutboxColumns {
            id: get(self, "table.field.event.id").unwrap_or_else(|| "id".into()),
            aggregate_type: get(self, "route.by.field").unwrap_or_else(|| "aggregatetype".into()),
            aggregate_id: get(self, "table.field.event.key")
                .unwrap_or_else(|| "aggregateid".into()),
            event_type,
            payload: get(self, "table.field.event.payload")
                .or_else(|| get(self, "table.field.payload"))
                .unwrap_or_else(|| "payload".into()),
            timestamp: get(self, "table.field.event.timestamp"),
            ..OutboxColumns::default()
        };
        pipeline.route = RouteConfig {
            topic_template: java_replacement(
                &get(self, "route.topic.replacement")
                    .unwrap_or_else(|| DEFAULT_TOPIC_REPLACEMENT.into()),
            ),
            topic_regex,
            ..RouteConfig::default()
        };
        if let Some(behavior) = op_invalid_behavior {
            pipeline.op_invalid_behavior = behavior;
        }
        if additional
            .iter()
            .any(|a| a.placement == Placement::Envelope)
        {
            pipeline.value_format = ValueFormat::Envelope;
            // Debezium's envelope keeps a NULL payload as "payload": null unless told to
            // send a tombstone.
            if !tombstone_on_empty {
                pipeline.null_payload = NullPayload::JsonNull;
            }
        }
        pipeline.additional_placement = additional;
        self.tracing(alias, pipeline);
    }

    /// A boolean option's value (`false` when not set); a value Debezium refuses is an error
    /// note.
    pub(super) fn boolean_option(&mut self, option: &str) -> bool {
        let value = self.take(option);
        match value.as_deref().map(boolean) {
            None => false,
            Some(Some(b)) => b,
            Some(None) => {
                self.refuse(
                    option,
                    value.as_deref().unwrap_or_default(),
                    "true and false",
                );
                false
            }
        }
    }

    /// `table.expand.json.payload` as `json_payload`, with its null and empty array behaviours
    /// and the transform's own `field.name.adjustment.mode` (the connector's is not passed to
    /// it), which renames expanded fields.
    fn json_expansion(&mut self, alias: &str, pipeline: &mut PipelineConfig) {
        let option = |name: &str| format!("transforms.{alias}.{name}");
        self.expanded = self.boolean_option(&option("table.expand.json.payload"));
        if self.expanded {
            pipeline.json_payload = JsonPayload::DebeziumExpanded;
        }
        let unused = "only used with table.expand.json.payload=true";
        for (name, default, other, what) in [
            (
                "table.json.payload.null.behavior",
                "ignore",
                "optional_bytes",
                "null fields",
            ),
            (
                "table.json.payload.empty.array.behavior",
                "ignore",
                "optional_string",
                "empty arrays",
            ),
        ] {
            let full = option(name);
            let Some(value) = self.take(&full) else {
                continue;
            };
            match value.trim().to_ascii_lowercase() {
                v if v == default && self.expanded => self.note(&full, format!("the default: json_payload = \"debezium_expanded\" leaves {what} out too")),
                v if v == other && self.expanded => self.difference(&full, format!("not supported: {other} keeps {what} in the expanded payload, while json_payload = \"debezium_expanded\" leaves them out (Debezium's default) and json_payload = \"as_stored\" keeps the text as PostgreSQL prints it")),
                v if v == default || v == other => self.note(&full, unused),
                _ => self.refuse(&full, &value, &format!("{default} and {other}")),
            }
        }
        let adjustment = option("field.name.adjustment.mode");
        if let Some(mode) = self.take(&adjustment) {
            // Debezium reads it only when expanding (and fails to start on a value it does
            // not know).
            match mode.trim().to_ascii_lowercase().as_str() {
                _ if !self.expanded => self.note(&adjustment, unused),
                "none" => self.note(&adjustment, "the default: field names kept as written"),
                "avro" | "avro_unicode" => self.difference(&adjustment, format!("not supported: {mode} renamed expanded payload fields that Avro does not take; json_payload = \"debezium_expanded\" keeps the names as written")),
                _ => self.refuse(&adjustment, &mode, "none, avro and avro_unicode"),
            }
        }
    }
}

/// A Java regex replacement (`$1`, `${name}`) in outbox-relay's template form (`${1}`, `${name}`).
pub(super) fn java_replacement(replacement: &str) -> String {
    let mut out = String::with_capacity(replacement.len());
    let mut chars = replacement.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push_str("${");
            while let Some(d) = chars.next_if(char::is_ascii_digit) {
                out.push(d);
            }
            out.push('}');
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses `column:placement[:alias],...` as Debezium does: split at commas, then colons,
/// empty pieces at the end dropped (Java's `String.split`), every entry two or three pieces.
///
/// Returns an error, as Debezium's validation does, for an empty list, an empty entry, an
/// entry of another shape, an empty column name, or a placement other than header, envelope
/// and partition.
pub(super) fn additional_placement(list: &str) -> Result<Vec<AdditionalPlacement>, String> {
    let entries = java_split(list, ',');
    if entries.is_empty() || entries.iter().all(|e| e.trim().is_empty()) {
        return Err(format!("{list:?} is empty, which Debezium refuses too: give column:placement[:alias] entries (placement header, envelope or partition), or leave the option out"));
    }
    entries
        .into_iter()
        .map(|entry| {
            let parts: Vec<&str> = java_split(entry, ':').into_iter().map(str::trim).collect();
            let (field, placement, alias) = match parts[..] {
                [field, placement] => (field, placement, None),
                [field, placement, alias] => (field, placement, Some(alias)),
                _ => {
                    return Err(format!(
                        "{entry:?} is not column:placement or column:placement:alias, which Debezium refuses too"
                    ))
                }
            };
            if field.is_empty() {
                return Err(format!("{entry:?} names no column"));
            }
            let placement = match placement.to_ascii_lowercase().as_str() {
                "header" => Placement::Header,
                "envelope" => Placement::Envelope,
                "partition" => Placement::Partition,
                _ => {
                    return Err(format!(
                        "{entry:?}: the accepted placements are header, envelope and partition"
                    ))
                }
            };
            Ok(AdditionalPlacement {
                field: field.to_owned(),
                // Debezium ignores an alias for the partition.
                alias: alias
                    .filter(|_| placement != Placement::Partition)
                    .map(str::to_owned),
                placement,
            })
        })
        .collect()
}

/// `text` split at `separator` as Java's `String.split` does: empty pieces at the end dropped.
fn java_split(text: &str, separator: char) -> Vec<&str> {
    let mut pieces: Vec<&str> = text.split(separator).collect();
    while pieces.last().is_some_and(|p| p.is_empty()) {
        pieces.pop();
    }
    pieces
}
