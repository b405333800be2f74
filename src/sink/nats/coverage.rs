//! Which JetStream streams take the subjects a pipeline publishes to, for `check`: a publish to
//! a subject no stream takes is refused ("no responders"), and creating streams is the
//! operator's.

use std::time::Duration;

use async_nats::jetstream::stream::Config;

/// The token that stands for a template's placeholder in [`pattern`].
const PLACEHOLDER: &str = "\u{1}";

/// The subjects a topic template gives, as a NATS filter: each token with a placeholder in it
/// becomes `*` (`${routedByValue}.events` -> `*.events`). A routing value with a `.` in it
/// gives more tokens than this assumes: `check` says so.
pub fn pattern(template: &crate::router::Template) -> String {
    template
        .sample_with(PLACEHOLDER)
        .split('.')
        .map(|token| {
            if token.contains(PLACEHOLDER) {
                "*"
            } else {
                token
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// How the streams take the subjects of a filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// Every subject goes to this stream.
    Full {
        stream: String,
        duplicate_window: Duration,
    },
    /// Some subjects go to these streams, others to none.
    Partial { streams: Vec<(String, String)> },
    /// No stream takes any of them.
    None,
}

/// How `streams` take the subjects of `filter`.
pub fn coverage(streams: &[Config], filter: &str) -> Coverage {
    let mut partial = Vec::new();
    for stream in streams {
        for subject in &stream.subjects {
            if covers(subject, filter) {
                return Coverage::Full {
                    stream: stream.name.clone(),
                    duplicate_window: stream.duplicate_window,
                };
            }
            if overlaps(subject, filter) {
                partial.push((stream.name.clone(), subject.clone()));
            }
        }
    }
    if partial.is_empty() {
        Coverage::None
    } else {
        Coverage::Partial { streams: partial }
    }
}

/// Whether every subject `filter` matches is matched by `by` (both may have wildcards).
pub fn covers(by: &str, filter: &str) -> bool {
    let (by, filter): (Vec<&str>, Vec<&str>) =
        (by.split('.').collect(), filter.split('.').collect());
    for (i, token) in by.iter().enumerate() {
        match (*token, filter.get(i).copied()) {
            (">", Some(_)) => return true,
            (_, None | Some(">")) => return false,
            ("*", Some(_)) => {}
            (_, Some("*")) => return false,
            (a, Some(b)) if a != b => return false,
            _ => {}
        }
    }
    by.len() == filter.len()
}

/// Whether some subject matches both `a` and `b` (both may have wildcards).
pub fn overlaps(a: &str, b: &str) -> bool {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
    for i in 0..a.len().max(b.len()) {
        match (a.get(i).copied(), b.get(i).copied()) {
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (None, _) | (_, None) => return false,
            (Some("*"), _) | (_, Some("*")) => {}
            (Some(x), Some(y)) if x != y => return false,
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::Template;

    #[test]
    fn a_template_gives_a_filter_with_a_star_per_placeholder_token() {
        let pattern_of = |t: &str| pattern(&Template::parse(t).unwrap());
        assert_eq!(pattern_of("${routedByValue}.events"), "*.events");
        assert_eq!(
            pattern_of("outbox.${routedByValue}-x.${column:region}"),
            "outbox.*.*"
        );
        assert_eq!(pattern_of("orders.created"), "orders.created");
    }

    #[test]
    fn covers_and_overlaps_follow_nats_wildcards() {
        for (by, filter) in [
            (">", "*.events"),
            ("*.events", "*.events"),
            ("*.events", "Order.events"),
            ("*.*", "a.b"),
            ("a.>", "a.b.c"),
            ("a.>", "a.*"),
            ("a.b", "a.b"),
        ] {
            assert!(covers(by, filter), "{by} covers {filter}");
            assert!(overlaps(by, filter), "{by} overlaps {filter}");
        }
        for (by, filter) in [
            ("Order.events", "*.events"),
            ("a.*", "a.>"),
            ("a.>", "a"),
            ("*", "a.b"),
            ("a.b", "a.b.c"),
        ] {
            assert!(!covers(by, filter), "{by} does not cover {filter}");
        }
        assert!(overlaps("Order.events", "*.events"));
        assert!(overlaps("a.*", "a.>"));
        for (a, b) in [
            ("a.b", "a.c"),
            ("a.>", "a"),
            ("*.x", "a.y"),
            ("a.b", "a.b.c"),
        ] {
            assert!(!overlaps(a, b), "{a} overlaps {b}");
        }
        assert!(overlaps("x.>", "*.events.y"));
    }

    #[test]
    fn coverage_names_the_stream_or_the_partial_ones() {
        let stream = |name: &str, subjects: &[&str]| Config {
            name: name.into(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            duplicate_window: Duration::from_secs(120),
            ..Config::default()
        };
        let streams = [
            stream("ORDERS", &["Order.events"]),
            stream("ALL", &["all.x.>"]),
        ];
        assert_eq!(
            coverage(&streams, "*.events"),
            Coverage::Partial {
                streams: vec![("ORDERS".into(), "Order.events".into())]
            }
        );
        assert_eq!(
            coverage(&streams, "all.x.*.events"),
            Coverage::Full {
                stream: "ALL".into(),
                duplicate_window: Duration::from_secs(120)
            }
        );
        assert_eq!(coverage(&streams, "other.events"), Coverage::None);
    }
}
