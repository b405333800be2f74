//! Debezium's tracing options of the Event Router (`tracing.span.context.field`,
//! `tracing.operation.name`, `tracing.with.context.field.only`, as `ActivateTracingSpan`
//! defines them) in outbox-relay's terms.
//!
//! Debezium reads the span context column (a `java.util.Properties` text, default column
//! `tracingspancontext`) and, with the OpenTelemetry API on the Connect worker, starts its own
//! `db-log-write` and `debezium-read` spans under it and injects the last as `traceparent`.
//! outbox-relay starts no spans: it publishes the writer's `traceparent` (and `tracestate`) as
//! they are, so a consumer's span is the writer's child rather than Debezium's.

use super::Importer;
use crate::config::PipelineConfig;

impl Importer {
    /// Carries the tracing options of the Event Router `alias` over to `pipeline`'s
    /// `columns.tracing_span_context`, noting what differs; a `tracing.with.context.field.only`
    /// that is not a boolean is refused, as Debezium refuses it.
    pub(super) fn tracing(&mut self, alias: &str, pipeline: &mut PipelineConfig) {
        let option = |name: &str| format!("transforms.{alias}.tracing.{name}");
        if let Some(column) = self.take(&option("span.context.field")) {
            pipeline.columns.tracing_span_context = Some(column);
        }
        if let Some(name) = self.take(&option("operation.name")) {
            self.difference(
                &option("operation.name"),
                format!("{name:?} names Debezium's own span; outbox-relay starts no spans: the traceparent header names the writing service's span"),
            );
        }
        let only_option = option("with.context.field.only");
        let given = self.options.contains_key(&only_option);
        let only = self.boolean_option(&only_option);
        if given && !only {
            self.difference(
                &only_option,
                "false: Debezium started a new trace for rows without a span context; outbox-relay sends such rows without trace headers (as with true)",
            );
        }
        if pipeline.columns.tracing_span_context.is_some() {
            self.note(
                "columns.tracing_span_context",
                "the span context's traceparent and tracestate are published as they are (no Debezium spans in between); a traceparent that is not W3C Trace Context is left out with a warning",
            );
        }
    }
}
