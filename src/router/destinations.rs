//! The destinations no row may route to, whatever the template makes.

use crate::config::{PipelineConfig, SinkConfig, DEFAULT_CHECKPOINT_TOPIC};

/// The destinations no row of `config`'s pipeline may route to, with the field that names
/// each: the dead-letter topic, and with Kafka the pipeline's checkpoint topic and the default
/// one (shared by the relays of a cluster, whether or not this pipeline is exactly-once).
pub fn reserved_destinations(config: &PipelineConfig) -> Vec<(String, &'static str)> {
    let mut reserved = Vec::new();
    if let Some(topic) = &config.dead_letter_topic {
        reserved.push((topic.clone(), "dead_letter_topic"));
        // An HTTP dead-letter URL of its own: the destination whose request URL it would be.
        if let (SinkConfig::Http(http), true) =
            (&config.sink, crate::config::HttpConfig::is_absolute(topic))
        {
            if let Some(destination) = destination_of_url(http, topic) {
                reserved.push((destination, "dead_letter_topic"));
            }
        }
    }
    if config.sink == SinkConfig::Kafka {
        reserved.push((config.checkpoint_topic().to_owned(), "checkpoint_topic"));
        if config.checkpoint_topic() != DEFAULT_CHECKPOINT_TOPIC {
            reserved.push((DEFAULT_CHECKPOINT_TOPIC.to_owned(), "checkpoint_topic"));
        }
    }
    reserved
}

/// The destination whose request URL (`http`'s template rendered) is `url`, if there is one.
fn destination_of_url(http: &crate::config::HttpConfig, url: &str) -> Option<String> {
    use crate::config::sink::http::DESTINATION_PLACEHOLDER;
    let (prefix, suffix) = http.url.split_once(DESTINATION_PLACEHOLDER)?;
    let encoded = url.strip_prefix(prefix)?.strip_suffix(suffix)?;
    let destination = percent_encoding::percent_decode_str(encoded)
        .decode_utf8()
        .ok()?
        .into_owned();
    (http.render(&destination) == url).then_some(destination)
}
