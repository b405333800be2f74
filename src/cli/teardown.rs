//! `teardown`: removing what a pipeline left in its database.

use anyhow::Context;

use crate::config::{self, PipelineConfig};

/// Tears `config` down (see `Command::Teardown`), `others` being the config's other
/// pipelines.
pub(super) async fn teardown(
    config: &PipelineConfig,
    others: &[PipelineConfig],
    print_sql: bool,
    yes: bool,
) -> anyhow::Result<()> {
    use crate::source::slot::{self, teardown};
    if config.source_kind == config::SourceKind::Polling {
        println!(
            "pipeline {}: polling source: no slot or publication to remove (the outbox table is the application's)",
            config.name
        );
        return Ok(());
    }
    if print_sql {
        println!(
            "-- pipeline {}, in its database:\n{}\n",
            config.name,
            teardown::sql(config)
        );
        return Ok(());
    }
    let context = || format!("pipeline {}", config.name);
    let (client, _connection) = slot::connect(config).await.with_context(context)?;
    let plan = teardown::plan(&client, config, others)
        .await
        .map_err(crate::Error::from)
        .with_context(context)?;
    for kept in &plan.kept {
        println!("pipeline {}: keeps {kept}", config.name);
    }
    if plan.steps.is_empty() {
        println!("pipeline {}: nothing to remove", config.name);
        return Ok(());
    }
    for step in &plan.steps {
        println!("pipeline {}: will remove {}", config.name, step.what);
    }
    // Before the question: a role that may not run every step removes nothing.
    if let Some(refused) = plan.refusal() {
        return Err(crate::Error::from(refused)).with_context(context);
    }
    if !yes {
        anyhow::ensure!(
            std::io::IsTerminal::is_terminal(&std::io::stdin()),
            "pipeline {}: not confirmed: run it in a terminal to be asked, or pass --yes",
            config.name
        );
        eprint!(
            "type {:?} (the pipeline's name) to remove these: ",
            config.name
        );
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        anyhow::ensure!(
            answer.trim() == config.name,
            "pipeline {}: not confirmed; nothing removed",
            config.name
        );
    }
    for removed in teardown::run(&client, &plan)
        .await
        .map_err(|stopped| crate::Error::from(crate::source::SourceError::from(stopped)))
        .with_context(context)?
    {
        println!("pipeline {}: removed {removed}", config.name);
    }
    Ok(())
}
