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
use crate::config::{ConfigError, ConfigErrors, PipelineConfig};
use crate::router::Router;

/// Checks one pipeline: its own fields, its routing and record options, its source URL.
///
/// Returns every problem found (empty: the pipeline can start), each naming its field path
/// relative to the pipeline (`slot`, `route.topic_regex`, `source_url` or `standby_url` without
/// the password).
pub fn pipeline(config: &PipelineConfig) -> Vec<ConfigError> {
    let mut problems = config.problems();
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
