//! Start-up validation: every check of a pipeline's configuration, run once before anything
//! connects, each problem with its field path.
//!
//! The checks live with what they judge: [`PipelineConfig::problems`] (names, limits, Kafka and
//! exactly-once settings), [`Router::new`] (routing and record options) and
//! [`PipelineConfig::source_config`] (the source URL, in [`crate::source::conninfo`]). This
//! module only runs them together, so that [`crate::config`] stays plain data below the router
//! and the source. The sessions that run later trust the result.

use std::path::Path;

use crate::config::file::{self, RelayConfig};
use crate::config::{
    ConfigError, ConfigErrors, PipelineConfig, DEFAULT_EXACTLY_ONCE_BATCH_LINGER_MS,
    DEFAULT_EXACTLY_ONCE_MAX_BATCH_BYTES, DEFAULT_EXACTLY_ONCE_MAX_BATCH_TRANSACTIONS,
};
use crate::router::Router;

/// Checks one pipeline: its own fields, its routing and record options, its source URL.
///
/// Returns every problem found (empty: the pipeline can start), each naming its field path
/// relative to the pipeline (`slot`, `route.topic_regex`, `source_url` or `standby_url` without
/// the password).
pub fn pipeline(config: &PipelineConfig) -> Vec<ConfigError> {
    let mut problems = config.problems();
    problems.extend(exactly_once_batch_problems(config));
    if let Err(problem) = config.source_config() {
        problems.push(problem);
    }
    if let Err(ConfigErrors(routing)) = Router::new(config) {
        problems.extend(routing);
    }
    if let Some(standby) = crate::check::failover::standby_pipeline(config) {
        if let Err(problem) = standby.source_config() {
            problems.push(ConfigError::new("standby_url", problem.problem));
        }
    }
    problems
}

/// Longest batch linger in exactly-once mode: a Kafka transaction open longer holds
/// `read_committed` consumers back (the last stable offset waits for it), and the
/// coordinator aborts one open past `transaction.timeout.ms` (60 s by default).
pub const MAX_EXACTLY_ONCE_BATCH_LINGER_MS: u64 = 10_000;

/// Checks the batch options of exactly-once mode (`exactly_once_max_batch_transactions`,
/// `exactly_once_max_batch_bytes`, `exactly_once_batch_linger_ms`).
///
/// Returns every problem found: a limit of 0, a linger over
/// [`MAX_EXACTLY_ONCE_BATCH_LINGER_MS`], or one set without `exactly_once = true`.
pub fn exactly_once_batch_problems(config: &PipelineConfig) -> Vec<ConfigError> {
    let mut problems = Vec::new();
    let fields = [
        (
            "exactly_once_max_batch_transactions",
            config.exactly_once_max_batch_transactions as u64,
            DEFAULT_EXACTLY_ONCE_MAX_BATCH_TRANSACTIONS as u64,
        ),
        (
            "exactly_once_max_batch_bytes",
            config.exactly_once_max_batch_bytes as u64,
            DEFAULT_EXACTLY_ONCE_MAX_BATCH_BYTES as u64,
        ),
        (
            "exactly_once_batch_linger_ms",
            config.exactly_once_batch_linger_ms,
            DEFAULT_EXACTLY_ONCE_BATCH_LINGER_MS,
        ),
    ];
    for (field, value, default) in fields {
        if !config.exactly_once && value != default {
            problems.push(ConfigError::new(
                field,
                "only used with exactly_once = true",
            ));
        }
        if value == 0 && field != "exactly_once_batch_linger_ms" {
            problems.push(ConfigError::new(field, "must be greater than 0"));
        }
    }
    if config.exactly_once_batch_linger_ms > MAX_EXACTLY_ONCE_BATCH_LINGER_MS {
        problems.push(ConfigError::new(
            "exactly_once_batch_linger_ms",
            format!(
                "{} is too long: at most {MAX_EXACTLY_ONCE_BATCH_LINGER_MS}; an open Kafka transaction holds read_committed consumers back",
                config.exactly_once_batch_linger_ms
            ),
        ));
    }
    problems
}

/// Checks every pipeline of a config file.
///
/// Returns an error listing every problem, each field path under its entry
/// (`pipelines[1].slot`).
pub fn pipelines(configs: &[PipelineConfig]) -> Result<(), ConfigErrors> {
    with_known(configs, Vec::new())
}

/// Loads the config file at `path` ([`file::read`]) and checks its pipelines ([`pipelines`]).
///
/// Returns an error listing every problem at once: those of reading the file (`${NAME}`
/// references, pipelines that share a name or slot) and those of the values; a field with a
/// problem of the first kind is not judged again. If the file does not fit the schema
/// (syntax, unknown keys, wrong types), only those problems.
pub fn load_file(path: &Path) -> Result<RelayConfig, ConfigErrors> {
    let (relay, known) = file::read(path)?;
    with_known(&relay.pipelines, known)?;
    Ok(relay)
}

/// [`pipelines`], after the `known` problems of the file, leaving out problems of the fields
/// these already name.
fn with_known(
    configs: &[PipelineConfig],
    mut problems: Vec<ConfigError>,
) -> Result<(), ConfigErrors> {
    for (i, config) in configs.iter().enumerate() {
        let at = format!("pipelines[{i}]");
        for problem in pipeline(config) {
            let problem = problem.under(&at);
            if !problems.iter().any(|known| known.field == problem.field) {
                problems.push(problem);
            }
        }
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(ConfigErrors(problems)),
    }
}

#[cfg(test)]
mod tests;
