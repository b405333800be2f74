//! Why an option is not carried over, and whether the relay publishes the same records
//! without it.

use super::formats;
use super::Severity;

/// How an option not carried over compares, and why: `converters` says how the connector's
/// converters and expansion write records ([`formats::Context`]).
pub(super) fn reason_for(
    option: &str,
    value: &str,
    router: &str,
    other_routers: &[String],
    context: &formats::Context,
) -> (Severity, String) {
    use Severity::{Difference, Info};
    let starts = |prefix: &str| option.starts_with(prefix);
    if let Some(rest) = option.strip_prefix(&format!("transforms.{router}.")) {
        return match rest {
            r if r.starts_with("tracing.") => (Difference, "a tracing option outbox-relay does not know (it carries over span.context.field, operation.name and with.context.field.only)".into()),
            "predicate" | "negate" => (
                Info,
                "outbox-relay applies its routing to the configured table only".into(),
            ),
            "table.field.event.schema.version" => (
                Difference,
                "not supported: it versions Kafka Connect value schemas, and outbox-relay writes no schemas".into(),
            ),
            "table.field.payload.id" | "table.field.schema.version" => (
                Difference,
                "Debezium 1.x envelope metadata: not supported".into(),
            ),
            _ => (
                Info,
                "not an option of Debezium's Event Router (it ignored it too)".into(),
            ),
        };
    }
    if let Some(alias) = other_routers
        .iter()
        .find(|a| starts(&format!("transforms.{a}.")))
    {
        return (
            Difference,
            format!("a second Event Router ({alias}): one pipeline per outbox table, import it separately"),
        );
    }
    if starts("predicates") {
        return (
            Info,
            "a predicate: outbox-relay reads the configured outbox table only".into(),
        );
    }
    if starts("transforms.") {
        return (
            Difference,
            "another transform: outbox-relay applies only the outbox routing".into(),
        );
    }
    if let Some(found) = formats::reason(option, value, context) {
        return found;
    }
    let info = |reason: &str| (Info, reason.to_owned());
    let difference = |reason: &str| (Difference, reason.to_owned());
    match option {
        "topic.prefix" | "database.server.name" => {
            info("not needed: it names Debezium's own topics; the outbox topics come from route.topic_template")
        }
        "tasks.max" => info("one pipeline reads one slot"),
        "snapshot.mode" => info("outbox-relay never snapshots: it publishes rows committed after the slot's position"),
        "slot.drop.on.stop" if value == "true" => {
            info("the slot was dropped whenever Debezium stopped: create it with `outbox-relay setup`")
        }
        "publication.autocreate.mode" => (Info, format!(
            "{value}: outbox-relay does not create publications while running (`outbox-relay setup` does); a publication FOR ALL TABLES works, and other tables' changes are passed over"
        )),
        "heartbeat.interval.ms" | "heartbeat.action.query" | "heartbeat.topics.prefix" => {
            info("outbox-relay confirms the slot's position from keepalives when idle: no heartbeats needed")
        }
        "tombstones.on.delete" | "skipped.operations" => {
            info("outbox-relay publishes inserts only (op_invalid_behavior covers updates and deletes)")
        }
        "max.batch.size" | "max.queue.size" | "max.queue.size.in.bytes" | "poll.interval.ms" => {
            info("see max_in_flight_events and max_in_flight_bytes")
        }
        "database.sslpassword" | "database.sslfactory" => difference("not supported by outbox-relay's TLS"),
        "database.initial.statements" => difference("outbox-relay runs no statements of yours"),
        _ if starts("errors.log.") || starts("errors.retry.") => {
            info("Kafka Connect error logging and retries: outbox-relay logs bad input and retries transient failures")
        }
        "errors.tolerance" if value.trim().eq_ignore_ascii_case("none") => {
            info("Kafka Connect's default: outbox-relay does not skip bad input either")
        }
        _ if starts("errors.") => {
            difference("Kafka Connect error handling: outbox-relay does not skip bad input; it stops on it, or dead-letters it with on_bad_event = \"dead_letter\"")
        }
        _ if starts("topic.creation.") => info("outbox-relay creates no topics unless [kafka] create_topics says so: they must exist or be auto-created"),
        _ if starts("slot.") => info("outbox-relay retries and keeps its slot itself"),
        _ if starts("snapshot.") || starts("incremental.snapshot") || starts("signal.") || starts("notification.") => {
            info("outbox-relay has no snapshots or signals")
        }
        _ if starts("column.mask")
            || starts("column.truncate")
            || option == "column.exclude.list"
            || option == "column.include.list"
            || option == "column.blacklist"
            || option == "column.whitelist" => difference("column masks, truncation and exclusions changed the columns Debezium read; outbox-relay reads them as stored"),
        _ if starts("schema.")
            || starts("table.")
            || starts("message.")
            || starts("database.") =>
        {
            info("shapes Debezium's change events; outbox-relay reads the configured table only")
        }
        _ if option.ends_with(".handling.mode") || option.ends_with(".adjustment.mode") => {
            info("shapes Debezium's change events; outbox-relay publishes the columns' text as PostgreSQL prints it")
        }
        _ => info("no outbox-relay equivalent"),
    }
}
