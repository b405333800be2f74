//! What each command does, once its flags are parsed.

use anyhow::Context;

use super::args::{Command, RunArgs};
use super::teardown::teardown;
use crate::config::{self, PipelineConfig};
use crate::Metrics;

/// The exit code for an error that ended a command (docs/operations/runbook.md, "Exit
/// codes"): 3 for the configuration, 4 and 5 for a permanent source or sink error, 1 for
/// anything else, transient errors included (a database or broker not up yet ends a one-shot
/// command such as `setup` with 1: running it again may succeed). (2 is clap's, for
/// command-line usage errors; 130 a second signal's.)
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if let Some(e) = e.downcast_ref::<crate::Error>() {
        return match e.recovery() {
            crate::error::Recovery::Stop => e.exit_code(),
            crate::error::Recovery::Retry | crate::error::Recovery::StandBy => 1,
        };
    }
    if e.downcast_ref::<config::ConfigErrors>().is_some() {
        return crate::error::EXIT_CONFIG;
    }
    1
}

/// The pipelines and metrics address of [`relay`].
pub(super) fn pipelines(
    args: RunArgs,
    need_kafka: bool,
) -> anyhow::Result<(Vec<PipelineConfig>, Option<std::net::SocketAddr>)> {
    let relay = relay(args, need_kafka)?;
    Ok((relay.pipelines, relay.metrics_listen))
}

/// The pipelines, metrics address and failure policy from --config or from the
/// single-database flags, checked once ([`crate::validation`]) before any command
/// starts. Commands that never contact Kafka (`setup`, `status`, `teardown`) pass `need_kafka = false`.
fn relay(mut args: RunArgs, need_kafka: bool) -> anyhow::Result<config::file::RelayConfig> {
    if !need_kafka && args.config.is_none() && args.bootstrap_servers.is_none() {
        args.bootstrap_servers = Some("unused:9092".into());
    }
    if !need_kafka {
        // Its variable may be set for `run` (one environment serves every command) while
        // the file is mounted only where `run` runs.
        args.kafka_properties_file = None;
    }
    match &args.config {
        Some(path) => {
            let file = crate::validation::load_file(path)
                .with_context(|| format!("loading {}", path.display()))?;
            let mut pipelines = file.pipelines;
            for name in &args.pipelines {
                anyhow::ensure!(
                    pipelines.iter().any(|p| &p.name == name),
                    "--pipeline {name}: no such pipeline in {}",
                    path.display()
                );
            }
            if !args.pipelines.is_empty() {
                pipelines.retain(|p| args.pipelines.contains(&p.name));
            }
            if args.no_create_slot {
                for p in &mut pipelines {
                    p.create_slot = false;
                }
            }
            if args.no_slot_record {
                for p in &mut pipelines {
                    p.slot_record = false;
                }
            }
            Ok(config::file::RelayConfig {
                pipelines,
                metrics_listen: args.metrics_listen.or(file.metrics_listen),
                on_pipeline_failure: args.on_pipeline_failure.unwrap_or(file.on_pipeline_failure),
            })
        }
        None if args.source_url.is_none() => Err(config::ConfigErrors(vec![config::ConfigError::new(
            "source_url",
            "no source database: give --config FILE (one or several databases; see examples/relay.toml) or --source-url URL (one database; or OUTBOX_RELAY_SOURCE_URL, OUTBOX_RELAY_CONFIG)",
        )])
        .into()),
        None => {
            let metrics_listen = args.metrics_listen;
            let on_pipeline_failure = args.on_pipeline_failure.unwrap_or_default();
            let mut config = args.into_config();
            let mut problems: Vec<_> = config
                .read_source_password_file()
                .err()
                .into_iter()
                .chain(config.kafka.read_properties_file().err())
                .collect();
            problems.extend(crate::validation::pipeline(&config));
            // Given by flags: each problem names the flag (or variable) too.
            for problem in &mut problems {
                if let Some(flag) = super::reference::flag_or_variable_of_key(&format!(
                    "pipelines.{}",
                    problem.field
                )) {
                    problem.field = format!("{} ({flag})", problem.field);
                }
            }
            if !problems.is_empty() {
                return Err(config::ConfigErrors(problems))
                    .context("check the flags and OUTBOX_RELAY_* variables");
            }
            Ok(config::file::RelayConfig {
                pipelines: vec![config],
                metrics_listen,
                on_pipeline_failure,
            })
        }
    }
}

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Probe { url, timeout_ms } => {
            let timeout = std::time::Duration::from_millis(timeout_ms);
            let status = crate::probe::get_status(&url, timeout).await?;
            println!("{url}: {status}");
            anyhow::ensure!((200..300).contains(&status), "{url} answered {status}");
            Ok(())
        }
        Command::Run(args) => {
            let config::file::RelayConfig {
                pipelines,
                metrics_listen,
                on_pipeline_failure,
            } = relay(args, true)?;
            tracing::info!(
                version = crate::VERSION,
                commit = crate::COMMIT,
                ?on_pipeline_failure,
                "starting outbox-relay"
            );
            for config in &pipelines {
                // One line: the settings that differ from their defaults, secrets hidden.
                tracing::info!(
                    pipeline = %config.name,
                    sink = config.sink.kind(),
                    settings = %config.summary(),
                    "starting pipeline"
                );
            }
            crate::run(
                pipelines,
                Metrics::new(),
                metrics_listen,
                on_pipeline_failure,
                async {
                    crate::shutdown::signal().await;
                    tokio::spawn(crate::shutdown::exit_on_second_signal());
                },
            )
            .await?;
            Ok(())
        }
        Command::Setup {
            args,
            print_sql,
            accept_slot_loss,
        } => {
            let (pipelines, _) = pipelines(args, false)?;
            for config in &pipelines {
                if config.source_kind == config::SourceKind::Polling {
                    println!(
                        "pipeline {}: polling source, no publication or slot (the outbox table and its indexes: sql/outbox_polling.sql)",
                        config.name
                    );
                    continue;
                }
                if print_sql {
                    println!(
                        "-- pipeline {}, in its database (psql -f stops at the first error):\n\\set ON_ERROR_STOP on\n{}\n",
                        config.name,
                        crate::source::slot::setup_sql(config)
                    );
                    continue;
                }
                let outcome = crate::source::slot::setup(config, accept_slot_loss)
                    .await
                    .with_context(|| format!("pipeline {}", config.name))?;
                for done in &outcome.done {
                    println!("pipeline {}: {done}", config.name);
                }
                println!(
                    "pipeline {}: publication {} includes {}; slot {} confirmed at {}",
                    config.name,
                    config.publication,
                    config.table,
                    config.slot,
                    outcome.confirmed_flush_lsn
                );
            }
            Ok(())
        }
        Command::Teardown {
            mut args,
            print_sql,
            yes,
        } => {
            let names = std::mem::take(&mut args.pipelines);
            anyhow::ensure!(
                args.config.is_none() || !names.is_empty(),
                "name the pipelines to tear down with --pipeline NAME"
            );
            let all = relay(args, false)?.pipelines;
            for name in &names {
                anyhow::ensure!(
                    all.iter().any(|p| &p.name == name),
                    "--pipeline {name}: no such pipeline in the config file"
                );
            }
            let (chosen, others): (Vec<_>, Vec<_>) = all
                .into_iter()
                .partition(|p| names.is_empty() || names.contains(&p.name));
            for config in &chosen {
                teardown(config, &others, print_sql, yes).await?;
            }
            Ok(())
        }
        Command::Check(args) => {
            let (pipelines, _) = pipelines(args, true)?;
            let mut failed = false;
            for config in &pipelines {
                println!("pipeline {}", config.name);
                for finding in crate::check::check(config).await {
                    failed |= finding.verdict == crate::check::Verdict::Fail;
                    println!("  {finding}");
                }
            }
            anyhow::ensure!(!failed, "some checks failed");
            Ok(())
        }
        Command::ImportDebezium {
            connector,
            accept_differences,
        } => {
            let imported = match crate::import::import_file(&connector) {
                Err(crate::import::ImportError::Refused { notes }) => {
                    for note in &notes {
                        eprintln!("{note}");
                    }
                    let errors = notes
                        .iter()
                        .filter(|n| n.severity == crate::import::Severity::Error)
                        .count();
                    anyhow::bail!("{}: Debezium refuses {errors} of its option values (the error lines above): no config printed", connector.display());
                }
                result => result?,
            };
            for note in &imported.notes {
                eprintln!("{note}");
            }
            let differences = imported.differences();
            anyhow::ensure!(
                differences == 0 || accept_differences,
                "{}: the relay would publish other records than Debezium did in {differences} place(s) (the difference lines above): no config printed; check each, then run again with --accept-differences",
                connector.display()
            );
            print!("{}", imported.toml);
            Ok(())
        }
        Command::Status(args) => {
            let (pipelines, _) = pipelines(args, false)?;
            println!(
                "{:<16} {:<24} {:>8} {:>14} {:>14} {:>10} {:>14} {:>8} {:>11}  INVALIDATION",
                "PIPELINE",
                "SLOT",
                "PID",
                "CONFIRMED",
                "LAG_BYTES",
                "WAL",
                "SAFE_WAL_SIZE",
                "FAILOVER",
                "STANDBY"
            );
            let mut failed = false;
            for config in &pipelines {
                if config.source_kind == config::SourceKind::Polling {
                    println!(
                        "{:<16} polling: no slot (see outbox_relay_pending_rows and `check`)",
                        config.name
                    );
                    continue;
                }
                let text = |v: Option<String>| v.unwrap_or_else(|| "-".into());
                match crate::check::status(config).await {
                    Ok(Some(s)) => println!(
                        "{:<16} {:<24} {:>8} {:>14} {:>14} {:>10} {:>14} {:>8} {:>11}  {}",
                        config.name,
                        config.slot,
                        text(s.active_pid.map(|p| p.to_string())),
                        text(s.confirmed_flush_lsn),
                        text(s.lag_bytes.map(|b| b.to_string())),
                        text(s.wal_status),
                        text(s.safe_wal_size.map(|b| b.to_string())),
                        if s.failover { "yes" } else { "no" },
                        text(s.standby),
                        text(s.invalidation.map(|i| i.to_string())),
                    ),
                    Ok(None) => {
                        failed = true;
                        let lost = match crate::source::slot_record::recorded(config).await
                        {
                            Some(r) => format!(
                                " but the relay streamed from it (last confirmed LSN {} at {}): reconcile the events after it, then setup --accept-slot-loss",
                                r.confirmed_lsn, r.confirmed_at
                            ),
                            None => String::new(),
                        };
                        println!(
                            "{:<16} {:<24} slot does not exist{lost}",
                            config.name, config.slot
                        )
                    }
                    Err(e) => {
                        failed = true;
                        println!("{:<16} {:<24} {e}", config.name, config.slot)
                    }
                }
            }
            anyhow::ensure!(!failed, "some pipelines have no readable slot");
            Ok(())
        }
    }
}
