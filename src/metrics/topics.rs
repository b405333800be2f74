//! The `topic` label of the delivery metrics, bounded: a destination comes from a row (its
//! aggregate type), so a table with many distinct values would make as many series of each
//! metric (70,000 aggregate types took the relay to 141 MB and an 8.3 MB scrape). The first
//! [`MAX_TOPIC_LABELS`] destinations of a pipeline are labelled by name; later ones share
//! [`OTHER_TOPIC`].

use std::collections::HashSet;
use std::sync::RwLock;

/// Destinations of one pipeline labelled by name.
pub const MAX_TOPIC_LABELS: usize = 200;
/// The label of the destinations past [`MAX_TOPIC_LABELS`]: in parentheses, which no Kafka
/// topic name can hold, so that it is never mistaken for a destination's.
pub const OTHER_TOPIC: &str = "(other)";

/// The destinations one pipeline has labelled by name so far.
#[derive(Default)]
pub struct TopicLabels {
    named: RwLock<HashSet<String>>,
}

impl TopicLabels {
    /// The label for `topic`: its name while fewer than [`MAX_TOPIC_LABELS`] destinations
    /// have one (or it has one already), else [`OTHER_TOPIC`]. Logs a warning the first time
    /// a destination goes under [`OTHER_TOPIC`].
    pub fn label<'a>(&self, topic: &'a str, pipeline: &str) -> &'a str {
        if self.named.read().expect("topic labels").contains(topic) {
            return topic;
        }
        let mut named = self.named.write().expect("topic labels");
        if named.len() < MAX_TOPIC_LABELS {
            named.insert(topic.to_owned());
            return topic;
        }
        if named.insert(OTHER_TOPIC.to_owned()) {
            tracing::warn!(
                pipeline,
                limit = MAX_TOPIC_LABELS,
                "more destinations than the metrics label by name; the delivery metrics count the others under topic=\"(other)\""
            );
        }
        OTHER_TOPIC
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_limit_destinations_share_one_label() {
        let labels = TopicLabels::default();
        let topics: Vec<String> = (0..MAX_TOPIC_LABELS + 50)
            .map(|n| format!("t{n}"))
            .collect();
        let mut distinct = HashSet::new();
        for topic in &topics {
            distinct.insert(labels.label(topic, "p").to_owned());
        }
        assert_eq!(distinct.len(), MAX_TOPIC_LABELS + 1);
        assert!(distinct.contains(OTHER_TOPIC));
        assert_eq!(labels.label("t0", "p"), "t0", "a named one keeps its name");
        assert_eq!(labels.label("t-new", "p"), OTHER_TOPIC);
    }
}
