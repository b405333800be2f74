//! The `outbox-relay` binary: parses the CLI, sets up logging and runs the library.

use anyhow::Context;
use clap::{Parser, Subcommand};
use outbox_relay::config::{self, KafkaConfig, PipelineConfig, TableName};
use outbox_relay::error::chain;
use outbox_relay::logging::LogFormat;
use outbox_relay::Metrics;

/// Relays transactional outbox rows from PostgreSQL (logical replication, pgoutput) to Kafka.
#[derive(Parser)]
#[command(version = VERSION_WITH_COMMIT, about)]
struct Cli {
    /// Log format [default: the config file's [log] format, else text].
    #[arg(long, value_enum, env = "OUTBOX_RELAY_LOG_FORMAT", global = true)]
    log_format: Option<LogFormat>,
    /// Log level (error, warn, info, debug, trace, or a tracing filter such as
    /// outbox_relay=debug,info); RUST_LOG, when set, wins [default: the config file's [log]
    /// level, else info].
    #[arg(long, env = "OUTBOX_RELAY_LOG_LEVEL", global = true)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// `--version`: the version and the commit it was built from.
const VERSION_WITH_COMMIT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("OUTBOX_RELAY_COMMIT"),
    ")"
);

#[derive(Subcommand)]
enum Command {
    /// Streams the outbox tables' inserts to Kafka until SIGINT or SIGTERM.
    ///
    /// One database from flags (the password from the environment, not the command line,
    /// which other users of the host can read):
    ///   export OUTBOX_RELAY_SOURCE_URL='postgres://relay:secret@localhost/app'
    ///   outbox-relay run --slot outbox_relay --publication outbox_pub --table public.outbox \
    ///     --bootstrap-servers localhost:9092
    ///
    /// Several databases from a config file (see examples/relay.toml):
    ///   outbox-relay run --config relay.toml
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Creates what each pipeline needs in its database: the publication (FOR TABLE the
    /// outbox, publish = 'insert') when missing, the slot record table (sql/slot_record.sql)
    /// and the logical replication slot (with --failover a failover slot, PostgreSQL 17+;
    /// FAILOVER is also turned on for an existing slot no walsender holds), and says what it
    /// did. A slot the relay streamed from and that is gone now (dropped, lost in a failover)
    /// is not created again: setup, like the relay, stops with the last LSN the relay
    /// confirmed; reconcile the events after it, then run setup with --accept-slot-loss.
    ///
    ///   outbox-relay setup --config relay.toml
    ///   outbox-relay setup --source-url ... --bootstrap-servers ... --print-sql
    ///   outbox-relay setup --config relay.toml --pipeline orders --accept-slot-loss
    #[command(verbatim_doc_comment)]
    Setup {
        #[command(flatten)]
        args: RunArgs,
        /// Print the SQL instead of running it.
        #[arg(long)]
        print_sql: bool,
        /// Accept that a slot the relay streamed from is lost (the events after its last
        /// confirmed LSN were not published by the relay): clear its record and create the slot.
        #[arg(long, conflicts_with = "print_sql")]
        accept_slot_loss: bool,
    },
    /// Checks, per pipeline, what the relay needs: server version, wal_level = logical, free
    /// slots and WAL senders, REPLICATION and SELECT on the outbox, its mapped columns, the
    /// publication, the slot, whether it is a failover slot, synchronized_standby_slots, the
    /// idle slot timeout (PostgreSQL 18), with --standby-url the standby's slot
    /// synchronization settings and its copy of the slot, and that the Kafka brokers answer (for a polling pipeline: the
    /// outbox table's columns, SELECT and UPDATE or DELETE, pending and FAILED rows, the NOTIFY
    /// trigger). Exits 1 if anything fails.
    ///
    ///   outbox-relay check --config relay.toml
    #[command(verbatim_doc_comment)]
    Check(RunArgs),
    /// Removes what a pipeline left in its database once it is gone from service: its
    /// replication slot (which keeps WAL until dropped; refused while a relay streams from it),
    /// its slot record row, and its publication when that publishes the outbox table alone and
    /// no other pipeline of the config uses it. Says what it will remove and asks for the
    /// pipeline's name to confirm (--yes: no question); --print-sql prints the statements.
    /// With --config, name the pipelines with --pipeline; for a pipeline already removed from
    /// the file, give its database and slot with the single-database flags.
    ///
    ///   outbox-relay teardown --config relay.toml --pipeline orders
    ///   outbox-relay teardown --source-url ... --slot old_slot --publication outbox_pub --yes
    #[command(verbatim_doc_comment)]
    Teardown {
        #[command(flatten)]
        args: RunArgs,
        /// Print the SQL instead of running it.
        #[arg(long)]
        print_sql: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Shows, per pipeline, the slot's holder pid, confirmed flush LSN, lag in bytes behind
    /// the server's WAL, wal_status and safe_wal_size, whether it is a failover slot, with
    /// --standby-url its copy on the standby (synced, temporary, local, invalidated, missing),
    /// and why it was invalidated.
    ///
    ///   outbox-relay status --config relay.toml
    #[command(verbatim_doc_comment)]
    Status(RunArgs),
    /// Sends an HTTP GET to the relay's health endpoint and exits 0 on a 2xx answer, 1
    /// otherwise (another status, no answer within the timeout, connection refused). For
    /// container health checks in images without curl:
    ///
    ///   HEALTHCHECK CMD ["outbox-relay", "probe", "--url", "http://127.0.0.1:9187/healthz"]
    #[command(verbatim_doc_comment)]
    Probe {
        /// Plain http:// URL to GET.
        #[arg(long, default_value = "http://127.0.0.1:9187/readyz")]
        url: String,
        /// How long to wait for the connection and the status line, ms.
        #[arg(long, default_value_t = 2_000)]
        timeout_ms: u64,
    },
    /// Prints the outbox-relay config (TOML) equivalent to a Debezium PostgreSQL connector with
    /// the Outbox Event Router: the JSON posted to Kafka Connect, its bare config map, or a
    /// .properties file; or a Debezium Server application.properties (source, outbox transform
    /// and sink: debezium.sink.type kafka, redis, nats-jetstream, rabbitmq or http). Options it
    /// does not carry over go to stderr, one per line, with the reason, most severe first
    /// (error, difference, info). Passwords are never printed: URLs refer to environment
    /// variables. Exits 1 without printing a config when Debezium itself refuses an option's
    /// value, or when the relay would publish something other than Debezium did (a difference)
    /// and --accept-differences is not given.
    ///
    ///   outbox-relay import-debezium orders-connector.json > relay.toml
    ///   outbox-relay import-debezium conf/application.properties > relay.toml
    #[command(verbatim_doc_comment)]
    ImportDebezium {
        /// Connector configuration file (.json or .properties), or Debezium Server's
        /// application.properties.
        connector: std::path::PathBuf,
        /// Print the config even where the relay publishes something other than Debezium did
        /// (the notes marked "difference"), once you have checked each.
        #[arg(long)]
        accept_differences: bool,
    },
}

impl Command {
    /// The config file the command reads, if any.
    fn config_path(&self) -> Option<&std::path::Path> {
        match self {
            Command::Run(args)
            | Command::Check(args)
            | Command::Status(args)
            | Command::Setup { args, .. }
            | Command::Teardown { args, .. } => args.config.as_deref(),
            Command::Probe { .. } | Command::ImportDebezium { .. } => None,
        }
    }
}

#[derive(clap::Args)]
struct RunArgs {
    /// TOML config file with one [[pipelines]] entry per database (examples/relay.toml);
    /// replaces the single-database flags.
    #[arg(help_heading = "Config file", long, env = "OUTBOX_RELAY_CONFIG", conflicts_with_all = [
        "source_url", "source_password", "source_password_file", "bootstrap_servers", "slot", "publication", "table", "kafka_properties", "pipeline_name",
        "message_prefix", "status_interval_ms", "route_by_field", "topic_case", "topic_template", "op_invalid_behavior", "max_in_flight_events", "max_in_flight_bytes",
        "shutdown_timeout_secs", "max_event_wait_secs", "terminate_stale_walsender_after_secs", "exactly_once", "transactional_id", "checkpoint_topic",
        "failover", "standby_url", "slot_record_schema",
    ])]
    config: Option<std::path::PathBuf>,
    /// With --config: run only this pipeline (repeatable).
    #[arg(help_heading = "Config file", long = "pipeline", requires = "config")]
    pipelines: Vec<String>,
    /// Serve /metrics, /healthz and /readyz on this address (e.g. 0.0.0.0:9187).
    #[arg(help_heading = "Process", long, env = "OUTBOX_RELAY_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// What a pipeline stopped by an error that retrying cannot fix does: exit (the others
    /// drain, the process exits with its exit code) or retry (it starts again after a long
    /// backoff, the others go on) [default: the config file's on_pipeline_failure, else exit].
    #[arg(
        help_heading = "Process",
        long,
        env = "OUTBOX_RELAY_ON_PIPELINE_FAILURE",
        value_enum
    )]
    on_pipeline_failure: Option<outbox_relay::OnPipelineFailure>,
    /// libpq URL or key=value string of the source database; the role needs REPLICATION.
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_SOURCE_URL",
        hide_env_values = true
    )]
    source_url: Option<String>,
    /// The source role's password when the URL has none, taken as written (no
    /// percent-encoding); give it in the environment, not on the command line.
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_SOURCE_PASSWORD",
        hide_env_values = true,
        hide = true
    )]
    source_password: Option<String>,
    /// A file holding the source role's password (a mounted secret), when the URL has none.
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_SOURCE_PASSWORD_FILE"
    )]
    source_password_file: Option<String>,
    /// Logical replication slot (pgoutput); created if missing unless --no-create-slot, or
    /// unless the slot record says the relay streamed from it before.
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_SLOT",
        default_value = "outbox_relay"
    )]
    slot: String,
    /// Publication that includes the outbox table; its exact name, without quotes.
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_PUBLICATION",
        default_value = "outbox_pub"
    )]
    publication: String,
    /// The outbox table, schema.table; double-quote a part as in SQL ('"Billing-Prod"."Outbox"'),
    /// an unquoted part is taken as written (no case folding).
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_TABLE",
        default_value = "public.outbox"
    )]
    table: TableName,
    /// Kafka bootstrap servers, host:port[,host:port].
    #[arg(help_heading = "Kafka", long, env = "OUTBOX_RELAY_BOOTSTRAP_SERVERS")]
    bootstrap_servers: Option<String>,
    /// Extra librdkafka property, key=value; repeatable (e.g. security.protocol=SASL_SSL).
    #[arg(help_heading = "Kafka", long = "kafka-property", value_parser = parse_property)]
    kafka_properties: Vec<(String, String)>,
    /// Publish transactional logical decoding messages with this prefix as outbox events
    /// (pg_logical_emit_message(true, 'PREFIX', '{"aggregate_type": ..., "payload": ...}')).
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_MESSAGE_PREFIX"
    )]
    message_prefix: Option<String>,
    /// Topic for each event, with ${routedByValue} where the routing value goes.
    #[arg(
        help_heading = "Routing",
        long,
        env = "OUTBOX_RELAY_TOPIC_TEMPLATE",
        default_value = "${routedByValue}.events"
    )]
    topic_template: String,
    /// Route by this column's value instead of the aggregate type (Debezium's route.by.field).
    #[arg(help_heading = "Routing", long, env = "OUTBOX_RELAY_ROUTE_BY_FIELD")]
    route_by_field: Option<String>,
    /// Case of the routing value in the topic name.
    #[arg(help_heading = "Routing", long, env = "OUTBOX_RELAY_TOPIC_CASE", value_enum, default_value_t = config::TopicCase::Preserve)]
    topic_case: config::TopicCase,
    /// What an UPDATE or DELETE of an outbox row does.
    #[arg(help_heading = "Routing", long, env = "OUTBOX_RELAY_OP_INVALID_BEHAVIOR", value_enum, default_value_t = config::InvalidOpBehavior::Ignore)]
    op_invalid_behavior: config::InvalidOpBehavior,
    /// Pipeline name in logs and metrics.
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_PIPELINE_NAME",
        default_value = "default"
    )]
    pipeline_name: String,
    /// Fail instead of creating the slot when it does not exist (with --config: for every
    /// pipeline, whatever the file says).
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_NO_CREATE_SLOT"
    )]
    no_create_slot: bool,
    /// Create the slot as a failover slot (PostgreSQL 17+), which a standby with
    /// sync_replication_slots = on keeps in sync; `setup` also turns it on for an existing
    /// slot no walsender holds.
    #[arg(help_heading = "Source database", long, env = "OUTBOX_RELAY_FAILOVER")]
    failover: bool,
    /// libpq URL of the physical standby that should keep the failover slot in sync; `check`
    /// and `status` read its settings and its copy of the slot.
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_STANDBY_URL",
        hide_env_values = true
    )]
    standby_url: Option<String>,
    /// Do not record in the source database which slot the relay streamed from (with
    /// --config: for every pipeline). Without the record, a relay started after its slot was
    /// lost creates a new one and never publishes the events in between.
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_NO_SLOT_RECORD"
    )]
    no_slot_record: bool,
    /// Schema of the slot record table (streamed_slots), created if missing.
    #[arg(help_heading = "Source database", long, env = "OUTBOX_RELAY_SLOT_RECORD_SCHEMA", default_value = config::DEFAULT_SLOT_RECORD_SCHEMA)]
    slot_record_schema: String,
    /// Standby status update interval, ms.
    #[arg(help_heading = "Source database", long, env = "OUTBOX_RELAY_STATUS_INTERVAL_MS", default_value_t = config::DEFAULT_STATUS_INTERVAL_MS)]
    status_interval_ms: u64,
    /// Records sent to Kafka and not yet acknowledged before WAL reading pauses.
    #[arg(help_heading = "Delivery", long, env = "OUTBOX_RELAY_MAX_IN_FLIGHT_EVENTS", default_value_t = config::DEFAULT_MAX_IN_FLIGHT_EVENTS)]
    max_in_flight_events: usize,
    /// Bytes (key + value + headers) in flight before WAL reading pauses.
    #[arg(help_heading = "Delivery", long, env = "OUTBOX_RELAY_MAX_IN_FLIGHT_BYTES", default_value_t = config::DEFAULT_MAX_IN_FLIGHT_BYTES)]
    max_in_flight_bytes: usize,
    /// On shutdown, how long to wait for outstanding acknowledgements, seconds.
    #[arg(help_heading = "Delivery", long, env = "OUTBOX_RELAY_SHUTDOWN_TIMEOUT_SECS", default_value_t = config::DEFAULT_SHUTDOWN_TIMEOUT_SECS)]
    shutdown_timeout_secs: u64,
    /// Seconds a record may wait for the sink's acknowledgement before the pipeline reads as
    /// degraded and /readyz fails.
    #[arg(help_heading = "Delivery", long, env = "OUTBOX_RELAY_MAX_EVENT_WAIT_SECS", default_value_t = config::DEFAULT_MAX_EVENT_WAIT_SECS)]
    max_event_wait_secs: u64,
    /// When another walsender holds the slot and its client has sent no status update for
    /// this many seconds (a hung or stopped relay), terminate it and take the slot over.
    /// Default: never. The role needs pg_read_all_stats (to see reply_time) and
    /// pg_signal_backend (or the holder's role, or superuser).
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_TERMINATE_STALE_WALSENDER_AFTER_SECS"
    )]
    terminate_stale_walsender_after_secs: Option<u64>,
    /// Exactly-once mode: a transactional producer commits consecutive PostgreSQL
    /// transactions' events in batches (a config file's exactly_once_max_batch_* and
    /// exactly_once_batch_linger_ms), each with a checkpoint record in one Kafka transaction;
    /// read_committed consumers see every event once, also after a crash. Needs a broker with
    /// transactions and the checkpoint topic (cleanup.policy=compact).
    #[arg(help_heading = "Exactly-once", long, env = "OUTBOX_RELAY_EXACTLY_ONCE")]
    exactly_once: bool,
    /// With --exactly-once: the Kafka transactional.id [default: outbox-relay-<pipeline name>];
    /// a relay started with the same id fences the one before it.
    #[arg(
        help_heading = "Exactly-once",
        long,
        env = "OUTBOX_RELAY_TRANSACTIONAL_ID",
        requires = "exactly_once"
    )]
    transactional_id: Option<String>,
    /// With --exactly-once: the compacted checkpoint topic [default: outbox-relay.checkpoints].
    #[arg(
        help_heading = "Exactly-once",
        long,
        env = "OUTBOX_RELAY_CHECKPOINT_TOPIC",
        requires = "exactly_once"
    )]
    checkpoint_topic: Option<String>,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not key=value"))
}

impl RunArgs {
    /// The pipeline the single-database flags describe: the file's schema, filled in from
    /// the flags (whose defaults are the same `DEFAULT_*` constants).
    fn into_config(self) -> PipelineConfig {
        PipelineConfig {
            source_url: self.source_url.unwrap_or_default().into(),
            source_password: self.source_password.map(config::Secret),
            source_password_file: self.source_password_file,
            slot: self.slot,
            publication: self.publication,
            message_prefix: self.message_prefix,
            route: config::RouteConfig {
                by_field: self.route_by_field,
                topic_template: self.topic_template,
                topic_case: self.topic_case,
                topic_regex: None,
                allowed_destinations: None,
            },
            op_invalid_behavior: self.op_invalid_behavior,
            create_slot: !self.no_create_slot,
            failover: self.failover,
            standby_url: self.standby_url.map(Into::into),
            slot_record: !self.no_slot_record,
            slot_record_schema: self.slot_record_schema,
            kafka: KafkaConfig {
                bootstrap_servers: self.bootstrap_servers.unwrap_or_default(),
                properties: self.kafka_properties,
                create_topics: None,
            },
            status_interval_ms: self.status_interval_ms,
            max_in_flight_events: self.max_in_flight_events,
            max_in_flight_bytes: self.max_in_flight_bytes,
            shutdown_timeout_secs: self.shutdown_timeout_secs,
            max_event_wait_secs: self.max_event_wait_secs,
            terminate_stale_walsender_after_secs: self.terminate_stale_walsender_after_secs,
            exactly_once: self.exactly_once,
            transactional_id: self.transactional_id,
            checkpoint_topic: self.checkpoint_topic,
            ..PipelineConfig::new(self.pipeline_name, self.table)
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => e.exit_naming_variable(),
    };
    let file_log = cli
        .command
        .config_path()
        .map(config::file::log_section)
        .unwrap_or_default();
    let format = cli.log_format.or(file_log.format).unwrap_or_default();
    let level = cli.log_level.or(file_log.level);
    if let Err(e) = outbox_relay::logging::init(format, level.as_deref()) {
        eprintln!("outbox-relay: {e}");
        return std::process::ExitCode::from(outbox_relay::error::EXIT_CONFIG);
    }
    match run(cli.command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let code = exit_code(&e);
            if format == LogFormat::Text && e.downcast_ref::<config::ConfigErrors>().is_some() {
                // The file's or the flags' problems, one per line, as a terminal shows them.
                eprintln!("outbox-relay: {}", chain(e.as_ref()));
            } else {
                tracing::error!(error = %chain(e.as_ref()), exit_code = code, "outbox-relay failed");
            }
            std::process::ExitCode::from(code)
        }
    }
}

/// A command-line error whose value came from an environment variable says so: clap names
/// the flag only (`invalid value 'abc' for '--max-in-flight-events'`), and the flag is nowhere
/// on the command line.
trait NamingVariable {
    fn exit_naming_variable(self) -> !;
}

impl NamingVariable for clap::Error {
    fn exit_naming_variable(self) -> ! {
        use clap::error::{ContextKind, ContextValue};
        let flag = match self.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(flag)) => flag.clone(),
            _ => self.exit(),
        };
        let long = flag
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .trim_start_matches("--")
            .to_owned();
        let on_command_line = std::env::args().any(|a| {
            a.strip_prefix("--")
                .is_some_and(|a| a.split('=').next() == Some(long.as_str()))
        });
        let command = <Cli as clap::CommandFactory>::command();
        let variable = command
            .get_subcommands()
            .chain(std::iter::once(&command))
            .flat_map(|c| c.get_arguments())
            .find(|a| a.get_long() == Some(long.as_str()))
            .and_then(|a| a.get_env())
            .map(|v| v.to_string_lossy().into_owned());
        match variable {
            Some(variable) if !on_command_line && std::env::var_os(&variable).is_some() => {
                let reason = self.to_string();
                let reason = reason
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ");
                eprintln!("error: environment variable {variable}: {reason}");
                std::process::exit(2);
            }
            _ => self.exit(),
        }
    }
}

/// The exit code for an error that ended a command (docs/operations/runbook.md, "Exit
/// codes"): 3 for the configuration, 4 and 5 for a pipeline stopped by a permanent source or
/// sink error, 1 for anything else. (2 is clap's, for command-line usage errors; 130 a second
/// signal's.)
fn exit_code(e: &anyhow::Error) -> u8 {
    if let Some(e) = e.downcast_ref::<outbox_relay::Error>() {
        return e.exit_code();
    }
    if e.downcast_ref::<config::ConfigErrors>().is_some() {
        return outbox_relay::error::EXIT_CONFIG;
    }
    1
}

/// The pipelines and metrics address of [`relay`].
fn pipelines(
    args: RunArgs,
    need_kafka: bool,
) -> anyhow::Result<(Vec<PipelineConfig>, Option<std::net::SocketAddr>)> {
    let relay = relay(args, need_kafka)?;
    Ok((relay.pipelines, relay.metrics_listen))
}

/// The pipelines, metrics address and failure policy from --config or from the
/// single-database flags, checked once ([`outbox_relay::validation`]) before any command
/// starts. Commands that never contact Kafka (`setup`, `status`) pass `need_kafka = false`.
fn relay(mut args: RunArgs, need_kafka: bool) -> anyhow::Result<config::file::RelayConfig> {
    if !need_kafka && args.config.is_none() && args.bootstrap_servers.is_none() {
        args.bootstrap_servers = Some("unused:9092".into());
    }
    match &args.config {
        Some(path) => {
            let file = outbox_relay::validation::load_file(path)
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
                .collect();
            problems.extend(outbox_relay::validation::pipeline(&config));
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

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Probe { url, timeout_ms } => {
            let timeout = std::time::Duration::from_millis(timeout_ms);
            let status = outbox_relay::probe::get_status(&url, timeout).await?;
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
                version = outbox_relay::VERSION,
                commit = outbox_relay::COMMIT,
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
            outbox_relay::run(
                pipelines,
                Metrics::new(),
                metrics_listen,
                on_pipeline_failure,
                async {
                    outbox_relay::shutdown::signal().await;
                    tokio::spawn(outbox_relay::shutdown::exit_on_second_signal());
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
                        "-- pipeline {}, in its database:\n{}\n",
                        config.name,
                        outbox_relay::source::slot::setup_sql(config)
                    );
                    continue;
                }
                let outcome = outbox_relay::source::slot::setup(config, accept_slot_loss)
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
                for finding in outbox_relay::check::check(config).await {
                    failed |= finding.verdict == outbox_relay::check::Verdict::Fail;
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
            let imported = match outbox_relay::import::import_file(&connector) {
                Err(outbox_relay::import::ImportError::Refused { notes }) => {
                    for note in &notes {
                        eprintln!("{note}");
                    }
                    let errors = notes
                        .iter()
                        .filter(|n| n.severity == outbox_relay::import::Severity::Error)
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
                match outbox_relay::check::status(config).await {
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
                        let lost = match outbox_relay::source::slot_record::recorded(config).await
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

/// Tears `config` down (see `Command::Teardown`), `others` being the config's other
/// pipelines.
async fn teardown(
    config: &PipelineConfig,
    others: &[PipelineConfig],
    print_sql: bool,
    yes: bool,
) -> anyhow::Result<()> {
    use outbox_relay::source::slot::{self, teardown};
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
        .map_err(outbox_relay::Error::from)
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
    if !yes {
        anyhow::ensure!(
            std::io::IsTerminal::is_terminal(&std::io::stdin()),
            "pipeline {}: not confirmed: run it in a terminal to be asked, or pass --yes",
            config.name
        );
        eprint!(
            "type the pipeline's name ({}) to remove these: ",
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
    for done in teardown::run(&client, &plan)
        .await
        .map_err(outbox_relay::Error::from)
        .with_context(context)?
    {
        println!("pipeline {}: {done}", config.name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::CommandFactory;

    /// Flags of `run` that apply with `--config` too; every other one is a single-database
    /// flag, which `--config` must refuse rather than ignore.
    const WITH_CONFIG: &[&str] = &[
        "config",
        "pipelines",
        "metrics_listen",
        "no_create_slot",
        "no_slot_record",
        "on_pipeline_failure",
        "log_format",
        "log_level",
        "help",
    ];

    /// Held by every test that parses: one of them sets an `OUTBOX_RELAY_*` variable, which a
    /// parse on another test thread would otherwise see.
    static ENVIRONMENT: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn environment() -> std::sync::MutexGuard<'static, ()> {
        ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("outbox-relay").chain(argv.iter().copied()))
    }

    fn run_args(argv: &[&str]) -> RunArgs {
        match parse(argv)
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
            .command
        {
            Command::Run(args) => args,
            _ => unreachable!("not run"),
        }
    }

    #[test]
    fn config_refuses_every_single_database_flag_and_its_variable() {
        let _environment = environment();
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("a run command");
        let mut refused = 0;
        for arg in run.get_arguments() {
            if WITH_CONFIG.contains(&arg.get_id().as_str()) {
                continue;
            }
            let flag = format!("--{}", arg.get_long().expect("every flag is long"));
            let mut argv = vec!["run", "--config", "relay.toml", flag.as_str()];
            let possible = arg.get_possible_values();
            if arg.get_action().takes_values() {
                argv.push(match flag.as_str() {
                    _ if !possible.is_empty() => possible[0].get_name(),
                    "--kafka-property" => "linger.ms=1",
                    "--table" => "public.outbox",
                    _ => "1",
                });
            }
            match parse(&argv) {
                Err(e) if e.kind() == ErrorKind::ArgumentConflict => refused += 1,
                Err(e) => panic!("{argv:?}: not refused as a conflict: {e}"),
                Ok(_) => panic!("{argv:?}: --config accepted {flag}, which it would ignore"),
            }
        }
        assert!(refused >= 20, "only {refused} single-database flags");
        // From the environment too: a variable left over from a single-database deployment
        // must not be ignored.
        std::env::set_var("OUTBOX_RELAY_EXACTLY_ONCE", "true");
        let from_env = parse(&["run", "--config", "relay.toml"]);
        std::env::remove_var("OUTBOX_RELAY_EXACTLY_ONCE");
        assert_eq!(
            from_env.err().map(|e| e.kind()),
            Some(ErrorKind::ArgumentConflict),
            "--config with OUTBOX_RELAY_EXACTLY_ONCE=true"
        );
    }

    #[test]
    fn pipeline_no_create_slot_and_no_slot_record_apply_to_the_config_file() {
        let _environment = environment();
        let dir = std::env::temp_dir().join(format!("outbox-relay-main-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("relay.toml");
        std::fs::write(
            &path,
            r#"
            [kafka]
            bootstrap_servers = "k:9092"
            [[pipelines]]
            name = "orders"
            source_url = "postgres://u@h/orders"
            slot = "orders_slot"
            publication = "pub"
            table = "outbox"
            [[pipelines]]
            name = "billing"
            source_url = "postgres://u@h/billing"
            slot = "billing_slot"
            publication = "pub"
            table = "outbox"
            "#,
        )
        .unwrap();
        let file = path.to_str().unwrap();

        let (all, _) = pipelines(run_args(&["run", "--config", file]), true).unwrap();
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(|p| p.create_slot && p.slot_record));

        let (chosen, _) = pipelines(
            run_args(&[
                "run",
                "--config",
                file,
                "--pipeline",
                "billing",
                "--no-create-slot",
                "--no-slot-record",
            ]),
            true,
        )
        .unwrap();
        assert_eq!(
            chosen
                .iter()
                .map(|p| (p.name.as_str(), p.create_slot, p.slot_record))
                .collect::<Vec<_>>(),
            [("billing", false, false)]
        );

        let unknown = pipelines(
            run_args(&["run", "--config", file, "--pipeline", "payments"]),
            true,
        )
        .unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("--pipeline payments: no such pipeline in"),
            "{unknown}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
