//! W3C Trace Context from outbox columns: the `traceparent` and `tracestate` headers, so that a
//! trace continues from the service that wrote the row to the consumer.
//!
//! The trace parent comes from `columns.traceparent`, else from the `traceparent` entry of
//! `columns.tracing_span_context` (Debezium's `tracingspancontext`: a `java.util.Properties`
//! text); the state likewise from `columns.tracestate`, else that text's `tracestate`. The
//! relay starts no span of its own: the header names the writer's span as the parent.
//!
//! A value that is not a valid `traceparent` (W3C Trace Context, version `00` or a later
//! version's first four fields) is left out with a warning naming the event and the column,
//! and its `tracestate` with it: what the W3C specification tells a receiver to do with one,
//! and what OpenTelemetry's propagators do. The event itself is not bad: tracing data never
//! stops a pipeline nor sends an event to the dead-letter topic. An invalid `tracestate`
//! (longer than 512 characters, or not printable ASCII) is left out the same way.

use std::borrow::Cow;

use bytes::Bytes;

use crate::config::{PipelineConfig, Placement};
use crate::sink::Header;
use crate::source::outbox::OutboxEvent;

/// The header names, also left out of the row's `headers` column when a trace column is
/// configured (the column's value is the one a consumer sees).
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";
/// W3C Trace Context's limit on a `tracestate` a vendor must propagate.
const MAX_TRACESTATE_LEN: usize = 512;

/// The trace columns of a pipeline, as indexes into the event's extra columns, with names.
#[derive(Debug, Clone, Default)]
pub(super) struct TraceColumns {
    pub traceparent: Option<(usize, String)>,
    pub tracestate: Option<(usize, String)>,
    pub span_context: Option<(usize, String)>,
}

impl TraceColumns {
    /// Whether any trace column is configured.
    pub fn any(&self) -> bool {
        self.traceparent.is_some() || self.tracestate.is_some() || self.span_context.is_some()
    }

    /// The `traceparent` and `tracestate` headers of `event` (see the module docs): none, the
    /// parent, or both.
    pub fn headers(&self, event: &OutboxEvent) -> Vec<Header> {
        fn text<'a>(
            event: &OutboxEvent,
            column: &'a Option<(usize, String)>,
        ) -> Option<(Bytes, &'a str)> {
            let (i, name) = column.as_ref()?;
            let value = event.columns.get(*i)?.text.as_ref()?;
            Some((value.clone(), name.as_str()))
        }
        let properties = text(event, &self.span_context).map(|(value, name)| {
            (
                java_properties(&String::from_utf8_lossy(&value)),
                name.to_owned(),
            )
        });
        let from_properties = |key: &str| {
            properties.as_ref().and_then(|(entries, name)| {
                entries
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| (Bytes::from(v.clone()), name.as_str()))
            })
        };
        let parent = text(event, &self.traceparent).or_else(|| from_properties(TRACEPARENT));
        let Some((parent, column)) = parent else {
            return Vec::new();
        };
        let event_id = String::from_utf8_lossy(&event.id);
        if !is_valid_traceparent(&parent) {
            tracing::warn!(
                event_id = %event_id,
                column,
                "the traceparent is not a W3C trace context; the event goes without traceparent and tracestate headers"
            );
            return Vec::new();
        }
        let mut headers = vec![(Cow::Borrowed(TRACEPARENT), Some(parent))];
        if let Some((state, column)) =
            text(event, &self.tracestate).or_else(|| from_properties(TRACESTATE))
        {
            if is_valid_tracestate(&state) {
                headers.push((Cow::Borrowed(TRACESTATE), Some(state)));
            } else {
                tracing::warn!(
                    event_id = %event_id,
                    column,
                    "the tracestate is not a W3C trace state; the event goes without a tracestate header"
                );
            }
        }
        headers
    }
}

/// Checks the trace columns: not empty, and not with `message_prefix` (logical messages carry
/// no columns).
pub(super) fn problems(config: &PipelineConfig, problem: &mut impl FnMut(&str, String)) {
    let columns = &config.columns;
    for (field, name) in [
        ("columns.traceparent", &columns.traceparent),
        ("columns.tracestate", &columns.tracestate),
        (
            "columns.tracing_span_context",
            &columns.tracing_span_context,
        ),
    ] {
        match name.as_deref() {
            Some("") => problem(field, "must not be empty".into()),
            Some(_) if config.message_prefix.is_some() => problem(
                field,
                "cannot be combined with message_prefix: logical messages carry no such column"
                    .into(),
            ),
            _ => {}
        }
    }
    let any = [
        &columns.traceparent,
        &columns.tracestate,
        &columns.tracing_span_context,
    ]
    .iter()
    .any(|c| c.is_some());
    for (i, placement) in config.additional_placement.iter().enumerate() {
        let name = placement.name();
        let trace_name =
            name.eq_ignore_ascii_case(TRACEPARENT) || name.eq_ignore_ascii_case(TRACESTATE);
        if any && placement.placement == Placement::Header && trace_name {
            problem(
                &format!("additional_placement[{i}].alias"),
                format!("header {name:?} is the trace columns' (columns.traceparent, columns.tracestate, columns.tracing_span_context): use one or the other"),
            );
        }
    }
}

/// Whether `value` is a W3C `traceparent`: `version-traceid-parentid-flags` in lower-case hex
/// (2, 32, 16 and 2 digits), version not `ff`, trace id and parent id not all zeros; version
/// `00` has nothing after the flags, a later version may have `-` and more.
pub fn is_valid_traceparent(value: &[u8]) -> bool {
    let hex = |s: &[u8]| {
        !s.is_empty()
            && s.iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    let zeros = |s: &[u8]| s.iter().all(|b| *b == b'0');
    if value.len() < 55 {
        return false;
    }
    let (head, rest) = value.split_at(55);
    let fields: Vec<&[u8]> = head.split(|b| *b == b'-').collect();
    let [version, trace_id, parent_id, flags] = fields[..] else {
        return false;
    };
    let shaped = version.len() == 2
        && trace_id.len() == 32
        && parent_id.len() == 16
        && flags.len() == 2
        && [version, trace_id, parent_id, flags].iter().all(|f| hex(f));
    if !shaped || version == b"ff" || zeros(trace_id) || zeros(parent_id) {
        return false;
    }
    match version {
        b"00" => rest.is_empty(),
        _ => rest.is_empty() || rest.first() == Some(&b'-'),
    }
}

/// Whether `value` may be propagated as `tracestate`: at most 512 characters, printable ASCII
/// (spaces and tabs allowed between members), not empty.
pub fn is_valid_tracestate(value: &[u8]) -> bool {
    !value.is_empty()
        && value.len() <= MAX_TRACESTATE_LEN
        && value
            .iter()
            .all(|b| (0x20..=0x7e).contains(b) || *b == b'\t')
}

/// The entries of a `java.util.Properties` text (what `Properties.store` writes): one
/// `key=value` (or `key:value`, `key value`) a line, `#` and `!` comment lines, backslash
/// escapes (`\t`, `\n`, `\r`, `\f`, `\uXXXX`, any other character as itself) and a backslash
/// at the end of a line continuing it on the next.
pub fn java_properties(text: &str) -> Vec<(String, String)> {
    let mut entries = Vec::new();
    let mut lines = text.lines();
    while let Some(first) = lines.next() {
        let mut line = first.trim_start().to_owned();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        // An odd number of trailing backslashes continues the line.
        while line.chars().rev().take_while(|c| *c == '\\').count() % 2 == 1 {
            line.pop();
            match lines.next() {
                Some(next) => line.push_str(next.trim_start()),
                None => break,
            }
        }
        let (key, value) = split_entry(&line);
        entries.push((unescape(key), unescape(value)));
    }
    entries
}

/// A logical line's key and the rest after the separator (`=`, `:` or whitespace, with
/// whitespace around it).
fn split_entry(line: &str) -> (&str, &str) {
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '=' | ':' => return (&line[..i], line[i + 1..].trim_start()),
            c if c.is_whitespace() => {
                let rest = line[i..].trim_start();
                let rest = rest
                    .strip_prefix('=')
                    .or_else(|| rest.strip_prefix(':'))
                    .unwrap_or(rest);
                return (&line[..i], rest.trim_start());
            }
            _ => {}
        }
    }
    (line, "")
}

fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let digits: String = chars.by_ref().take(4).collect();
                if let Some(c) = u32::from_str_radix(&digits, 16)
                    .ok()
                    .and_then(char::from_u32)
                {
                    out.push(c);
                }
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests;
