//! The command line: the commands and their flags, as clap parses them.
//!
//! The doc comments of the flags are their `--help` text, written for a terminal: rustdoc's
//! link and HTML checks do not apply to them.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use clap::builder::BoolishValueParser;
use clap::{Parser, Subcommand};

use super::readers::{
    check_flags, refuse_pipeline_without_config, refuse_unread, setup_flags, status_flags,
    teardown_flags,
};

use crate::config::{self, KafkaConfig, PipelineConfig, TableName};
use crate::logging::LogFormat;

/// Relays transactional outbox rows from PostgreSQL (logical replication, pgoutput) to Kafka.
#[derive(Parser)]
#[command(version = VERSION_WITH_COMMIT, about)]
pub struct Cli {
    /// Log format [default: the config file's [log] format, else text].
    #[arg(
        help_heading = "Logging",
        long,
        value_enum,
        env = "OUTBOX_RELAY_LOG_FORMAT",
        global = true
    )]
    pub log_format: Option<LogFormat>,
    /// Log level (error, warn, info, debug, trace, or a tracing filter such as
    /// outbox_relay=debug,info); RUST_LOG, when set, wins [default: the config file's [log]
    /// level, else info].
    #[arg(
        value_name = "LEVEL",
        help_heading = "Logging",
        long,
        env = "OUTBOX_RELAY_LOG_LEVEL",
        global = true
    )]
    pub log_level: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses `argv` (its first item the program's name) like [`Parser::try_parse_from`], and
    /// refuses a flag of `run` given on the command line to a command that does not read it
    /// (`--metrics-listen is a flag of run; setup does not read it`); the environment
    /// variables of such flags are accepted and ignored.
    ///
    /// Returns clap's error, whose [`clap::Error::exit`] prints it and exits with 2 (0 for
    /// `--help` and `--version`).
    pub fn try_parse_command_line<I, T>(argv: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut cli = <Cli as clap::CommandFactory>::command();
        let mut matches = cli.try_get_matches_from_mut(argv)?;
        refuse_unread(&cli, &matches)?;
        refuse_pipeline_without_config(&cli, &matches)?;
        <Cli as clap::FromArgMatches>::from_arg_matches_mut(&mut matches)
            .map_err(|e| e.format(&mut cli))
    }
}

/// `--version`: the version and the commit it was built from.
const VERSION_WITH_COMMIT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("OUTBOX_RELAY_COMMIT"),
    ")"
);

#[derive(Subcommand)]
pub enum Command {
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
    ///   outbox-relay setup --source-url ... --print-sql
    ///   outbox-relay setup --config relay.toml --pipeline orders --accept-slot-loss
    #[command(verbatim_doc_comment, mut_args = setup_flags)]
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
    /// synchronization settings and its copy of the slot, and that the Kafka brokers answer
    /// (for a polling pipeline: the outbox table's columns, SELECT and UPDATE or DELETE,
    /// pending and FAILED rows, the NOTIFY trigger). Exits 1 if anything fails.
    ///
    ///   outbox-relay check --config relay.toml
    #[command(verbatim_doc_comment, mut_args = check_flags)]
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
    #[command(verbatim_doc_comment, mut_args = teardown_flags)]
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
    #[command(verbatim_doc_comment, mut_args = status_flags)]
    Status(RunArgs),
    /// Sends an HTTP GET to the relay's health endpoint and exits 0 on a 2xx answer, 1
    /// otherwise (another status, no answer within the timeout, connection refused). For
    /// container health checks in images without curl:
    ///
    ///   HEALTHCHECK CMD ["outbox-relay", "probe", "--url", "http://127.0.0.1:9187/healthz"]
    #[command(verbatim_doc_comment)]
    Probe {
        /// Plain http:// URL to GET.
        #[arg(
            value_name = "URL",
            long,
            default_value = "http://127.0.0.1:9187/readyz"
        )]
        url: String,
        /// How long to wait for the connection and the status line, ms.
        #[arg(value_name = "MS", long, default_value_t = 2_000)]
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
    pub fn config_path(&self) -> Option<&std::path::Path> {
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
pub struct RunArgs {
    /// TOML config file with one [[pipelines]] entry per database (examples/relay.toml);
    /// replaces the single-database flags.
    #[arg(value_name = "FILE", help_heading = "Config file", long, env = "OUTBOX_RELAY_CONFIG", conflicts_with_all = [
        "source_url", "source_password", "source_password_file", "bootstrap_servers", "slot", "publication", "table", "kafka_properties", "kafka_properties_file", "pipeline_name",
        "message_prefix", "status_interval_ms", "route_by_field", "topic_case", "topic_template", "op_invalid_behavior", "max_in_flight_events", "max_in_flight_bytes",
        "max_event_bytes", "shutdown_timeout_secs", "max_event_wait_secs", "terminate_stale_walsender_after_secs", "exactly_once", "transactional_id", "checkpoint_topic",
        "failover", "standby_url", "slot_record_schema",
    ])]
    pub(crate) config: Option<std::path::PathBuf>,
    /// With --config: this pipeline only (give the flag again for more).
    #[arg(
        value_name = "NAME",
        help_heading = "Config file",
        long = "pipeline",
        requires = "config"
    )]
    pub(crate) pipelines: Vec<String>,
    /// Serve /metrics, /healthz and /readyz on this address (e.g. 0.0.0.0:9187).
    #[arg(
        value_name = "ADDR",
        help_heading = "Process",
        long,
        env = "OUTBOX_RELAY_METRICS_LISTEN"
    )]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    /// What a pipeline stopped by an error that retrying cannot fix does: exit (the others
    /// drain, the process exits with its exit code) or retry (it starts again after a long
    /// backoff, the others go on) [default: the config file's on_pipeline_failure, else exit].
    #[arg(
        help_heading = "Process",
        long,
        env = "OUTBOX_RELAY_ON_PIPELINE_FAILURE",
        value_enum
    )]
    pub(crate) on_pipeline_failure: Option<crate::OnPipelineFailure>,
    /// libpq URL or key=value string of the source database; the role needs REPLICATION.
    #[arg(
        value_name = "URL",
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_SOURCE_URL",
        hide_env_values = true
    )]
    pub(crate) source_url: Option<String>,
    /// The source role's password when the URL has none, taken as written (no
    /// percent-encoding); give it in the environment, not on the command line.
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_SOURCE_PASSWORD",
        hide_env_values = true,
        hide = true
    )]
    pub(crate) source_password: Option<String>,
    /// A file holding the source role's password (a mounted secret), when the URL has none.
    #[arg(
        value_name = "FILE",
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_SOURCE_PASSWORD_FILE"
    )]
    pub(crate) source_password_file: Option<String>,
    /// Logical replication slot (pgoutput); created if missing unless --no-create-slot, or
    /// unless the slot record says the relay streamed from it before.
    #[arg(
        value_name = "NAME",
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_SLOT",
        default_value = "outbox_relay"
    )]
    pub(crate) slot: String,
    /// Publication that includes the outbox table; its exact name, without quotes.
    #[arg(
        value_name = "NAME",
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_PUBLICATION",
        default_value = "outbox_pub"
    )]
    pub(crate) publication: String,
    /// The outbox table, schema.table; double-quote a part as in SQL ('"Billing-Prod"."Outbox"'),
    /// an unquoted part is taken as written (no case folding).
    #[arg(
        value_name = "SCHEMA.TABLE",
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_TABLE",
        default_value = "public.outbox"
    )]
    pub(crate) table: TableName,
    /// Kafka bootstrap servers, host:port[,host:port].
    #[arg(
        value_name = "HOST:PORT,...",
        help_heading = "Kafka",
        long,
        env = "OUTBOX_RELAY_BOOTSTRAP_SERVERS"
    )]
    pub(crate) bootstrap_servers: Option<String>,
    /// Extra librdkafka property, key=value; repeatable (e.g. security.protocol=SASL_SSL).
    #[arg(value_name = "KEY=VALUE", help_heading = "Kafka", long = "kafka-property", value_parser = parse_property)]
    pub(crate) kafka_properties: Vec<(String, String)>,
    /// File of librdkafka properties, key=value lines (a mounted secret with sasl.password);
    /// --kafka-property wins for a key set in both.
    #[arg(
        value_name = "FILE",
        help_heading = "Kafka",
        long,
        env = "OUTBOX_RELAY_KAFKA_PROPERTIES_FILE"
    )]
    pub(crate) kafka_properties_file: Option<String>,
    /// Publish transactional logical decoding messages with this prefix as outbox events
    /// (pg_logical_emit_message(true, 'PREFIX', '{"aggregate_type": ..., "payload": ...}')).
    #[arg(
        value_name = "PREFIX",
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_MESSAGE_PREFIX"
    )]
    pub(crate) message_prefix: Option<String>,
    /// Topic for each event, with ${routedByValue} where the routing value goes.
    #[arg(
        value_name = "TEMPLATE",
        help_heading = "Routing",
        long,
        env = "OUTBOX_RELAY_TOPIC_TEMPLATE",
        default_value = "${routedByValue}.events"
    )]
    pub(crate) topic_template: String,
    /// Route by this column's value instead of the aggregate type (Debezium's route.by.field).
    #[arg(
        value_name = "COLUMN",
        help_heading = "Routing",
        long,
        env = "OUTBOX_RELAY_ROUTE_BY_FIELD"
    )]
    pub(crate) route_by_field: Option<String>,
    /// Case of the routing value in the topic name.
    #[arg(help_heading = "Routing", long, env = "OUTBOX_RELAY_TOPIC_CASE", value_enum, default_value_t = config::TopicCase::Preserve)]
    pub(crate) topic_case: config::TopicCase,
    /// What an UPDATE or DELETE of an outbox row does.
    #[arg(help_heading = "Routing", long, env = "OUTBOX_RELAY_OP_INVALID_BEHAVIOR", value_enum, default_value_t = config::InvalidOpBehavior::Ignore)]
    pub(crate) op_invalid_behavior: config::InvalidOpBehavior,
    /// Pipeline name in logs and metrics.
    #[arg(
        value_name = "NAME",
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_PIPELINE_NAME",
        default_value = "default"
    )]
    pub(crate) pipeline_name: String,
    /// Fail instead of creating the slot when it does not exist (with --config: for every
    /// pipeline, whatever the file says).
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_NO_CREATE_SLOT",
        value_parser = BoolishValueParser::new()
    )]
    pub(crate) no_create_slot: bool,
    /// Create the slot as a failover slot (PostgreSQL 17+), which a standby with
    /// sync_replication_slots = on keeps in sync; `setup` and the start also turn it on for an
    /// existing slot no walsender holds.
    #[arg(help_heading = "Source database", long, env = "OUTBOX_RELAY_FAILOVER", value_parser = BoolishValueParser::new())]
    pub(crate) failover: bool,
    /// libpq URL of the physical standby that should keep the failover slot in sync; `check`
    /// and `status` read its settings and its copy of the slot.
    #[arg(
        value_name = "URL",
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_STANDBY_URL",
        hide_env_values = true
    )]
    pub(crate) standby_url: Option<String>,
    /// Do not record in the source database which slot the relay streamed from (with
    /// --config: for every pipeline). Without the record, a relay started after its slot was
    /// lost creates a new one and never publishes the events in between.
    #[arg(
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_NO_SLOT_RECORD",
        value_parser = BoolishValueParser::new()
    )]
    pub(crate) no_slot_record: bool,
    /// Schema of the slot record table (streamed_slots), created if missing.
    #[arg(value_name = "SCHEMA", help_heading = "Source database", long, env = "OUTBOX_RELAY_SLOT_RECORD_SCHEMA", default_value = config::DEFAULT_SLOT_RECORD_SCHEMA)]
    pub(crate) slot_record_schema: String,
    /// Standby status update interval, ms.
    #[arg(value_name = "MS", help_heading = "Source database", long, env = "OUTBOX_RELAY_STATUS_INTERVAL_MS", default_value_t = config::DEFAULT_STATUS_INTERVAL_MS)]
    pub(crate) status_interval_ms: u64,
    /// Records sent to Kafka and not yet acknowledged before WAL reading pauses.
    #[arg(value_name = "EVENTS", help_heading = "Delivery", long, env = "OUTBOX_RELAY_MAX_IN_FLIGHT_EVENTS", default_value_t = config::DEFAULT_MAX_IN_FLIGHT_EVENTS)]
    pub(crate) max_in_flight_events: usize,
    /// Bytes (key + value + headers) in flight before WAL reading pauses.
    #[arg(value_name = "BYTES", help_heading = "Delivery", long, env = "OUTBOX_RELAY_MAX_IN_FLIGHT_BYTES", default_value_t = config::DEFAULT_MAX_IN_FLIGHT_BYTES)]
    pub(crate) max_in_flight_bytes: usize,
    /// The largest event taken, bytes (its mapped columns' values); a larger row is refused
    /// before it is copied [default: the sink's own maximum].
    #[arg(
        value_name = "BYTES",
        help_heading = "Delivery",
        long,
        env = "OUTBOX_RELAY_MAX_EVENT_BYTES"
    )]
    pub(crate) max_event_bytes: Option<usize>,
    /// On shutdown, how long to wait for outstanding acknowledgements, seconds.
    #[arg(value_name = "SECS", help_heading = "Delivery", long, env = "OUTBOX_RELAY_SHUTDOWN_TIMEOUT_SECS", default_value_t = config::DEFAULT_SHUTDOWN_TIMEOUT_SECS)]
    pub(crate) shutdown_timeout_secs: u64,
    /// Seconds a record may wait for the sink's acknowledgement before the pipeline reads as
    /// degraded and /readyz fails.
    #[arg(value_name = "SECS", help_heading = "Delivery", long, env = "OUTBOX_RELAY_MAX_EVENT_WAIT_SECS", default_value_t = config::DEFAULT_MAX_EVENT_WAIT_SECS)]
    pub(crate) max_event_wait_secs: u64,
    /// When another walsender holds the slot and its client has sent no status update for
    /// this many seconds (a hung or stopped relay), terminate it and take the slot over.
    /// Default: never. The role needs pg_read_all_stats (to see reply_time) and
    /// pg_signal_backend (or the holder's role, or superuser).
    #[arg(
        value_name = "SECS",
        help_heading = "Source database",
        long,
        env = "OUTBOX_RELAY_TERMINATE_STALE_WALSENDER_AFTER_SECS"
    )]
    pub(crate) terminate_stale_walsender_after_secs: Option<u64>,
    /// Exactly-once mode: a transactional producer commits consecutive PostgreSQL
    /// transactions' events in batches (a config file's exactly_once_max_batch_* and
    /// exactly_once_batch_linger_ms), each with a checkpoint record in one Kafka transaction;
    /// read_committed consumers see every event once, also after a crash. Needs a broker with
    /// transactions and the checkpoint topic (cleanup.policy=compact).
    #[arg(help_heading = "Exactly-once", long, env = "OUTBOX_RELAY_EXACTLY_ONCE", value_parser = BoolishValueParser::new())]
    pub(crate) exactly_once: bool,
    /// With --exactly-once: the Kafka transactional.id [default: outbox-relay-<pipeline name>];
    /// a relay started with the same id fences the one before it.
    #[arg(
        value_name = "ID",
        help_heading = "Exactly-once",
        long,
        env = "OUTBOX_RELAY_TRANSACTIONAL_ID",
        requires = "exactly_once"
    )]
    pub(crate) transactional_id: Option<String>,
    /// With --exactly-once: the compacted checkpoint topic [default: outbox-relay.checkpoints].
    #[arg(
        value_name = "TOPIC",
        help_heading = "Exactly-once",
        long,
        env = "OUTBOX_RELAY_CHECKPOINT_TOPIC",
        requires = "exactly_once"
    )]
    pub(crate) checkpoint_topic: Option<String>,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not key=value"))
}

impl RunArgs {
    /// The pipeline the single-database flags describe: the file's schema, filled in from
    /// the flags (whose defaults are the same `DEFAULT_*` constants).
    pub(crate) fn into_config(self) -> PipelineConfig {
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
                properties_file: self.kafka_properties_file,
                create_topics: None,
            },
            status_interval_ms: self.status_interval_ms,
            max_in_flight_events: self.max_in_flight_events,
            max_in_flight_bytes: self.max_in_flight_bytes,
            max_event_bytes: self.max_event_bytes,
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
