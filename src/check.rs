//! `outbox-relay check` and `status`: what an operator asks before and while running.
//!
//! `check` verifies, per pipeline, everything the relay needs from PostgreSQL and Kafka and
//! says what to change; `status` reports each slot's position and the WAL it holds back.
//! [`failover`] adds failover slots, the standby that keeps them, and
//! `synchronized_standby_slots`; [`standby`] a pipeline that decodes on a standby.

use std::fmt;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::ClientContext;
use tokio_postgres::Client;

use crate::config::{InvalidOpBehavior, MarkMode, PipelineConfig, SourceKind};
use crate::error::chain;
use crate::source::slot::failover::Invalidation;
use crate::source::{slot, slot_record, SourceError};

pub mod failover;
mod record;
mod sink;
pub mod standby;

/// The verdict of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// Works, but worth a look.
    Warn,
    /// The relay cannot run like this.
    Fail,
}

/// One line of `check`'s report.
#[derive(Debug, Clone)]
pub struct Finding {
    pub check: &'static str,
    pub verdict: Verdict,
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.verdict {
            Verdict::Ok => "ok",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{verdict:<4}  {:<22}  {}", self.check, self.detail)
    }
}

fn finding(check: &'static str, verdict: Verdict, detail: impl Into<String>) -> Finding {
    Finding {
        check,
        verdict,
        detail: detail.into(),
    }
}

async fn connect(config: &PipelineConfig) -> Result<(Client, slot::SqlConnection), String> {
    slot::connect(config).await.map_err(|e| chain(&e))
}

/// Runs every check for `config`; never fails itself: problems are findings.
pub async fn check(config: &PipelineConfig) -> Vec<Finding> {
    let mut findings: Vec<Finding> = source_security(config).into_iter().collect();
    match connect(config).await {
        Ok((client, connection)) => {
            let checked = match config.source_kind {
                SourceKind::LogTailing => check_postgres(config, &client, &mut findings).await,
                SourceKind::Polling => check_polling(config, &client, &mut findings).await,
            };
            if let Err(e) = checked {
                findings.push(finding(
                    "postgres",
                    Verdict::Fail,
                    format!("query failed: {}", chain(&e)),
                ));
            }
            if config.source_kind == SourceKind::LogTailing {
                failover::check(config, &client, &mut findings).await;
            }
            drop(client);
            drop(connection);
        }
        Err(e) => findings.push(finding("connection", Verdict::Fail, e)),
    }
    findings.push(routing(config));
    findings.extend(sink::check(config).await);
    if config.exactly_once {
        findings.push(check_checkpoint(config).await);
    }
    findings
}

/// A warning when the source URL reaches a host over the network without authenticating the
/// server: `sslmode` below `verify-ca` or `channel_binding` other than `require`. Local hosts
/// (Unix sockets, `localhost`, 127.0.0.0/8, ::1) are exempt; `None` also when the URL does
/// not parse (the connection check reports that).
fn source_security(config: &PipelineConfig) -> Option<Finding> {
    use crate::source::tls::SslMode;
    use tokio_postgres::config::{ChannelBinding, Host};
    let info = config.source_config().ok()?;
    let is_local = |endpoint: &crate::source::target::Endpoint| {
        let loopback = |text: &str| {
            text.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
        };
        match (&endpoint.host, endpoint.addr) {
            (Some(Host::Unix(_)), _) => true,
            (_, Some(addr)) => addr.is_loopback(),
            (Some(Host::Tcp(name)), None) => name == "localhost" || loopback(name),
            (None, None) => true,
        }
    };
    let remote: Vec<String> = crate::source::target::endpoints(&info.pg)
        .iter()
        .filter(|endpoint| !is_local(endpoint))
        .map(ToString::to_string)
        .collect();
    let mode = match info.tls.mode {
        SslMode::Disable => Some("disable"),
        SslMode::Prefer => Some("prefer"),
        SslMode::Require => Some("require"),
        SslMode::VerifyCa | SslMode::VerifyFull => None,
    };
    let binding = match info.pg.get_channel_binding() {
        ChannelBinding::Require => None,
        ChannelBinding::Prefer => Some("prefer"),
        ChannelBinding::Disable => Some("disable"),
        _ => Some("prefer"),
    };
    if remote.is_empty() || (mode.is_none() && binding.is_none()) {
        return None;
    }
    let settings: Vec<String> = [
        mode.map(|mode| format!("sslmode={mode}")),
        binding.map(|binding| format!("channel_binding={binding}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let risk = match mode {
        Some(_) => "anyone on the network path can pose as the server: take the role's password (a cleartext or md5 request), feed the relay forged WAL, and read the events",
        None => "a server that holds a certificate of the same CA, or one that can relay the handshake, is not refused: the password exchange is not bound to the TLS session",
    };
    Some(finding(
        "source tls",
        Verdict::Warn,
        format!(
            "{} with {}: {risk}; use sslmode=verify-full&sslrootcert=<CA file>&channel_binding=require",
            remote.join(", "),
            settings.join(" and "),
        ),
    ))
}

/// Where rows may route: an allow-list (`route.allowed_destinations`) or, without one, a
/// warning that any row can pick any destination the template makes.
fn routing(config: &PipelineConfig) -> Finding {
    let route = &config.route;
    match &route.allowed_destinations {
        Some(allowed) => finding(
            "routing",
            Verdict::Ok,
            format!(
                "rows route only to route.allowed_destinations: {}",
                allowed.join(", ")
            ),
        ),
        None => finding(
            "routing",
            Verdict::Warn,
            format!(
                "no route.allowed_destinations: any row can pick any destination {:?} makes (e.g. any {:?}); list the destinations rows may use",
                route.topic_template,
                crate::router::Template::parse(&route.topic_template)
                    .map_or_else(|_| route.topic_template.clone(), |t| t.sample_with("<X>")),
            ),
        ),
    }
}

/// Exactly-once mode: the checkpoint topic exists and its last checkpoint for the pipeline
/// reads back as the relay will read it.
async fn check_checkpoint(config: &PipelineConfig) -> Finding {
    let topic = config.checkpoint_topic();
    let transactional_id = config.transactional_id();
    match crate::exactly_once::read_checkpoint(
        &config.kafka,
        topic,
        &config.name,
        &transactional_id,
    )
    .await
    {
        Ok(Some(lsn)) => finding(
            "checkpoint",
            Verdict::Ok,
            format!("{topic}: last checkpoint {lsn} (the topic must have cleanup.policy=compact)"),
        ),
        Ok(None) => finding(
            "checkpoint",
            Verdict::Ok,
            format!("{topic}: no checkpoint yet (the topic must have cleanup.policy=compact)"),
        ),
        Err(e) => finding("checkpoint", Verdict::Fail, chain(&e)),
    }
}

/// The server's version, as the first finding of a pipeline that connected.
async fn connection_finding(client: &Client) -> Result<Finding, tokio_postgres::Error> {
    let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    Ok(finding(
        "connection",
        Verdict::Ok,
        format!("PostgreSQL {version}"),
    ))
}

async fn check_postgres(
    config: &PipelineConfig,
    client: &Client,
    out: &mut Vec<Finding>,
) -> Result<(), tokio_postgres::Error> {
    out.push(connection_finding(client).await?);

    let wal_level: String = client.query_one("SHOW wal_level", &[]).await?.get(0);
    out.push(match slot::wal_level_fix(&wal_level) {
        None => finding("wal_level", Verdict::Ok, "logical"),
        Some(fix) => finding("wal_level", Verdict::Fail, fix),
    });
    let standby = async {
        Ok::<_, SourceError>(match slot::standby::in_recovery(client).await? {
            true => Some(standby::decoding_standby(client, &config.slot).await?),
            false => None,
        })
    };
    match standby.await {
        Ok(Some(state)) => out.extend(standby::findings(&state)),
        Ok(None) => {}
        Err(e) => out.push(finding(
            "standby decoding",
            Verdict::Fail,
            format!("query failed: {}", chain(&e)),
        )),
    }

    let row = client
        .query_one(
            "SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)::int,
                    current_setting('max_wal_senders')::int - (SELECT count(*) FROM pg_stat_replication)::int,
                    EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)",
            &[&config.slot],
        )
        .await?;
    let (free_slots, free_senders, slot_exists): (i32, i32, bool) =
        (row.get(0), row.get(1), row.get(2));
    out.push(match (slot_exists, free_slots) {
        (true, _) => finding(
            "replication slots",
            Verdict::Ok,
            format!("slot {} exists; {free_slots} free", config.slot),
        ),
        (false, n) if n > 0 => finding(
            "replication slots",
            Verdict::Ok,
            format!("{n} free for slot {}", config.slot),
        ),
        _ => finding(
            "replication slots",
            Verdict::Fail,
            "none free: raise max_replication_slots",
        ),
    });
    out.push(if free_senders > 0 {
        finding("wal senders", Verdict::Ok, format!("{free_senders} free"))
    } else {
        finding(
            "wal senders",
            Verdict::Fail,
            "none free: raise max_wal_senders",
        )
    });

    let row = client
        .query_one("SELECT rolreplication OR rolsuper, current_user::text FROM pg_roles WHERE rolname = current_user", &[])
        .await?;
    let (replication, role): (bool, String) = (row.get(0), row.get(1));
    out.push(if replication {
        finding("role", Verdict::Ok, format!("{role} has REPLICATION"))
    } else {
        finding(
            "role",
            Verdict::Fail,
            format!("ALTER ROLE {} REPLICATION", quote(&role)),
        )
    });

    let table = config.table.quoted();
    let row = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL,
                    to_regclass($1) IS NOT NULL AND has_table_privilege(to_regclass($1), 'SELECT'),
                    (SELECT relreplident::text FROM pg_class WHERE oid = to_regclass($1))",
            &[&table],
        )
        .await?;
    let (exists, select, identity): (bool, bool, Option<String>) =
        (row.get(0), row.get(1), row.get(2));
    out.push(match (exists, select) {
        (false, _) => finding(
            "outbox table",
            Verdict::Fail,
            format!("{} does not exist (sql/outbox.sql)", config.table),
        ),
        (true, false) => finding(
            "outbox table",
            Verdict::Fail,
            format!("GRANT SELECT ON {table} TO {}", quote(&role)),
        ),
        (true, true) => finding(
            "outbox table",
            Verdict::Ok,
            format!(
                "{} readable; replica identity {}",
                config.table,
                match identity.as_deref() {
                    Some("d") => "default",
                    Some("f") => "full",
                    Some("i") => "index",
                    Some("n") => "nothing",
                    _ => "unknown",
                }
            ),
        ),
    });

    if exists {
        out.push(check_columns(config, client, &table).await?);
        out.push(
            check_published_columns(config, client)
                .await
                .unwrap_or_else(|e| {
                    finding(
                        "published columns",
                        Verdict::Fail,
                        format!("query failed: {}", chain(&e)),
                    )
                }),
        );
    }

    let row = client
        .query_opt(
            "SELECT p.pubinsert, p.pubupdate OR p.pubdelete,
                    EXISTS (SELECT 1 FROM pg_publication_tables t WHERE t.pubname = p.pubname AND t.schemaname = $2 AND t.tablename = $3)
             FROM pg_publication p WHERE p.pubname = $1",
            &[&config.publication, &config.table.schema, &config.table.name],
        )
        .await?;
    out.push(match row.map(|r| (r.get::<_, bool>(0), r.get::<_, bool>(1), r.get::<_, bool>(2))) {
        None => finding("publication", Verdict::Fail, format!("{} does not exist: outbox-relay setup creates it", config.publication)),
        Some((_, _, false)) => finding("publication", Verdict::Fail, format!("{} does not include {}", config.publication, config.table)),
        Some((false, _, _)) => finding("publication", Verdict::Fail, format!("{} does not publish inserts", config.publication)),
        Some((true, true, true)) if config.op_invalid_behavior == InvalidOpBehavior::Ignore => finding(
            "publication",
            Verdict::Warn,
            format!("{} also publishes updates/deletes, which the relay reads and passes over: WITH (publish = 'insert') saves work", config.publication),
        ),
        Some((true, true, true)) => finding("publication", Verdict::Ok, format!("{} publishes inserts, updates and deletes of {}", config.publication, config.table)),
        Some((true, false, true)) if config.op_invalid_behavior != InvalidOpBehavior::Ignore => finding(
            "publication",
            Verdict::Fail,
            format!("op_invalid_behavior needs updates and deletes: ALTER PUBLICATION {} SET (publish = 'insert, update, delete')", quote(&config.publication)),
        ),
        Some((true, false, true)) => finding("publication", Verdict::Ok, format!("{} publishes inserts of {}", config.publication, config.table)),
    });

    let row = client
        .query_opt(
            "SELECT plugin, database = current_database(), wal_status, active_pid,
                    to_jsonb(s) ->> 'invalidation_reason', (to_jsonb(s) ->> 'conflicting')::bool,
                    coalesce((to_jsonb(s) ->> 'synced')::bool, false) AND pg_is_in_recovery()
             FROM pg_replication_slots s WHERE slot_name = $1",
            &[&config.slot],
        )
        .await?;
    // A missing slot the relay streamed from is never created again: the start refuses.
    let recorded = match (&row, config.slot_record) {
        (None, true) => recorded_slot(client, config).await,
        _ => Ok(None),
    };
    out.push(match (row, recorded) {
        // The start reads the record too, and stops on the same error.
        (None, Err(e)) => finding(
            "slot",
            Verdict::Fail,
            format!(
                "{} does not exist and its slot record cannot be read, so the start refuses: {}",
                config.slot,
                chain(&e)
            ),
        ),
        (None, Ok(Some(r))) => finding(
            "slot",
            Verdict::Fail,
            format!(
                "{} does not exist but the relay streamed from it (last confirmed LSN {} at {}): the relay will not create it again; reconcile the events after it, then outbox-relay setup --accept-slot-loss",
                config.slot, r.confirmed_lsn, r.confirmed_at
            ),
        ),
        (None, Ok(None)) if config.create_slot => finding(
            "slot",
            Verdict::Warn,
            format!(
                "{} does not exist; the relay will create it (outbox-relay setup does it ahead)",
                config.slot
            ),
        ),
        (None, Ok(None)) => finding(
            "slot",
            Verdict::Fail,
            format!(
                "{} does not exist and create_slot is off: outbox-relay setup",
                config.slot
            ),
        ),
        (Some(r), _) => {
            let (plugin, same_db, wal_status, pid): (
                Option<String>,
                Option<bool>,
                Option<String>,
                Option<i32>,
            ) = (r.get(0), r.get(1), r.get(2), r.get(3));
            if plugin.as_deref() != Some("pgoutput") || same_db != Some(true) {
                finding(
                    "slot",
                    Verdict::Fail,
                    format!("{} is not a pgoutput slot of this database", config.slot),
                )
            } else if r.get::<_, bool>(6) {
                // The start refuses it (START_REPLICATION would, until a promotion).
                finding(
                    "slot",
                    Verdict::Fail,
                    slot::synced_copy_refused(&config.slot),
                )
            } else if wal_status.as_deref() == Some("lost") {
                finding(
                    "slot",
                    Verdict::Fail,
                    format!(
                        "{} is invalidated (wal_status lost, {}): events may be missing",
                        config.slot,
                        Invalidation::of_lost(r.get(4), r.get(5))
                    ),
                )
            } else {
                let holder =
                    pid.map_or_else(|| "inactive".to_owned(), |pid| format!("held by pid {pid}"));
                finding(
                    "slot",
                    Verdict::Ok,
                    format!(
                        "{} pgoutput, wal_status {}, {holder}",
                        config.slot,
                        wal_status.unwrap_or_default()
                    ),
                )
            }
        }
    });
    if config.slot_record {
        out.push(record::record_finding(config, client).await?);
    }
    if let Some(prefix) = &config.message_prefix {
        out.push(check_message_writers(prefix, client).await?);
    }
    Ok(())
}

/// With `message_prefix`: whether PUBLIC may still call `pg_logical_emit_message` (its
/// default), which lets any role that can connect publish events under the prefix.
async fn check_message_writers(
    prefix: &str,
    client: &Client,
) -> Result<Finding, tokio_postgres::Error> {
    let public: Vec<String> = client
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.proname = 'pg_logical_emit_message'
               AND p.pronamespace = 'pg_catalog'::regnamespace
               AND has_function_privilege('public', p.oid, 'EXECUTE')
             ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    Ok(match public.is_empty() {
        true => finding(
            "logical messages",
            Verdict::Ok,
            format!("only the roles granted pg_logical_emit_message can publish events with prefix {prefix:?}"),
        ),
        false => finding(
            "logical messages",
            Verdict::Warn,
            format!(
                "PUBLIC may execute {}: any role that can connect can publish events with prefix {prefix:?}, with any id, key and headers; revoke it from PUBLIC and grant it to the writer roles (sql/logical_messages.sql)",
                public.join(", ")
            ),
        ),
    })
}

/// Whether the table `quoted` has every column the mapping needs (the relay stops at the first
/// insert without one).
async fn check_columns(
    config: &PipelineConfig,
    client: &Client,
    quoted: &str,
) -> Result<Finding, tokio_postgres::Error> {
    let present: Vec<String> = client
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&quoted],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let missing: Vec<String> = slot::columns::mapped_columns(config)
        .iter()
        .filter(|m| m.required && !present.iter().any(|p| p == m.column))
        .map(|m| format!("{:?} ({})", m.column, m.field))
        .collect();
    Ok(if missing.is_empty() {
        finding("outbox columns", Verdict::Ok, "every mapped column exists")
    } else {
        finding(
            "outbox columns",
            Verdict::Fail,
            format!(
                "missing {}; the table has {}",
                missing.join(", "),
                present.join(", ")
            ),
        )
    })
}

/// Whether the publication publishes every mapped column (see [`slot::columns`]): a
/// generated column is published only on PostgreSQL 18 with `publish_generated_columns =
/// stored`.
async fn check_published_columns(
    config: &PipelineConfig,
    client: &Client,
) -> Result<Finding, SourceError> {
    use slot::columns;
    let rows = columns::column_rows(client, config).await?;
    let unpublished = columns::unpublished(&columns::mapped_columns(config), &rows);
    let server = slot::failover::server(client).await?;
    let table = config.table.to_string();
    Ok(
        match columns::unpublished_message(&unpublished, &config.publication, &table, &server) {
            Some(message) => finding("published columns", Verdict::Fail, message),
            None if rows.is_empty() => finding(
                "published columns",
                Verdict::Ok,
                format!(
                    "nothing to check: {table} is not in publication {:?}, or has none of the mapped columns (see publication, outbox columns)",
                    config.publication
                ),
            ),
            None => finding(
                "published columns",
                Verdict::Ok,
                format!(
                    "publication {:?} publishes every mapped column",
                    config.publication
                ),
            ),
        },
    )
}

/// What a polling pipeline needs: the table with its columns (as the relay checks them at
/// start), SELECT and UPDATE (DELETE with `mark = "delete"` or the purge), and for
/// `notify_channel` a trigger. No REPLICATION, `wal_level` or slot.
async fn check_polling(
    config: &PipelineConfig,
    client: &Client,
    out: &mut Vec<Finding>,
) -> Result<(), tokio_postgres::Error> {
    out.push(connection_finding(client).await?);
    out.push(finding(
        "source",
        Verdict::Ok,
        "polling: needs no REPLICATION, wal_level = logical or slot",
    ));
    let stats = match crate::source::polling::check_table(client, config).await {
        Ok(stats) => stats,
        Err(e) => {
            out.push(finding("outbox table", Verdict::Fail, chain(&e)));
            return Ok(());
        }
    };
    let table = format!(
        "{}.{}",
        quote(&config.table.schema),
        quote(&config.table.name)
    );
    let polling = &config.polling;
    let mut needed = vec!["SELECT"];
    match polling.mark {
        MarkMode::Status | MarkMode::Flag => needed.push("UPDATE"),
        MarkMode::Delete => needed.push("DELETE"),
    }
    if polling.purge_published_after_secs.is_some() {
        needed.push("DELETE");
    }
    let role: String = client
        .query_one("SELECT current_user::text", &[])
        .await?
        .get(0);
    let mut missing = Vec::new();
    for privilege in needed {
        let granted: bool = client
            .query_one(
                "SELECT has_table_privilege(to_regclass($1), $2)",
                &[&table, &privilege],
            )
            .await?
            .get(0);
        if !granted {
            missing.push(privilege);
        }
    }
    out.push(if missing.is_empty() {
        finding(
            "outbox table",
            Verdict::Ok,
            format!(
                "{} has the columns of mark = {:?}; {role} may read and mark rows",
                config.table, polling.mark
            ),
        )
    } else {
        finding(
            "outbox table",
            Verdict::Fail,
            format!("GRANT {} ON {table} TO {role}", missing.join(", ")),
        )
    });
    let row = client.query_one(&stats, &[]).await?;
    let (pending, age, failed): (i64, f64, i64) = (row.get(0), row.get(1), row.get(2));
    out.push(finding(
        "outbox rows",
        if failed > 0 {
            Verdict::Warn
        } else {
            Verdict::Ok
        },
        format!("{pending} pending (oldest {age:.0} s), {failed} FAILED"),
    ));
    if let Some(channel) = &polling.notify_channel {
        let triggers: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass($1) AND NOT tgisinternal",
                &[&table],
            )
            .await?
            .get(0);
        out.push(if triggers > 0 {
            finding(
                "notify",
                Verdict::Ok,
                format!("LISTEN {channel}; {table} has a trigger (sql/outbox_polling.sql's notifies outbox_relay)"),
            )
        } else {
            finding(
                "notify",
                Verdict::Warn,
                format!("notify_channel = {channel:?} but {table} has no trigger: idle latency is max_interval_ms (sql/outbox_polling.sql has the trigger)"),
            )
        });
    }
    Ok(())
}

/// The record of the configured slot, read as the start reads it; `None` when there is none,
/// or no record table yet (the start creates it).
///
/// Returns the start's error for a record it cannot read (grants, an invalid row).
async fn recorded_slot(
    client: &Client,
    config: &PipelineConfig,
) -> Result<Option<slot_record::SlotRecord>, SourceError> {
    let table = slot_record::table(&config.slot_record_schema);
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get(0);
    match exists {
        true => slot_record::read(client, &config.slot_record_schema, &config.slot).await,
        false => Ok(None),
    }
}

fn quote(ident: &str) -> String {
    crate::source::replication::quote_ident(ident)
}

/// The `check` client's context: keeps librdkafka's first few distinct errors and warnings
/// (a refused TLS certificate, a failed SASL handshake, a name that does not resolve), which
/// a failed metadata request only reports as "broker transport failure".
#[derive(Default)]
struct ClientErrors(std::sync::Mutex<Vec<String>>);

impl ClientErrors {
    /// How many are kept.
    const KEPT: usize = 3;

    fn keep(&self, text: String) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < Self::KEPT && !kept.contains(&text) {
            kept.push(text);
        }
    }
}

impl ClientContext for ClientErrors {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        // CONFWARN: a producer property set on this consumer (acks, linger.ms, ...), which
        // would crowd out the errors that matter.
        if (level as i32) <= (RDKafkaLogLevel::Warning as i32) && fac != "CONFWARN" {
            self.keep(format!("{fac} {log_message}"));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // "All broker connections are down" only sums up the errors before it.
        if error.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::AllBrokersDown) {
            self.keep(format!("{error}: {reason}"));
        }
    }
}

impl ConsumerContext for ClientErrors {}

/// Whether the brokers answer a metadata request with the pipeline's librdkafka settings.
/// A failure names the bootstrap servers and librdkafka's first errors ([`ClientErrors`]).
pub(crate) async fn check_kafka(config: &PipelineConfig) -> Finding {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", &config.kafka.bootstrap_servers);
    for (key, value) in &config.kafka.properties {
        client.set(key, value);
    }
    let result = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer<ClientErrors> = client
            .create_with_context(ClientErrors::default())
            .map_err(|e| e.to_string())?;
        let metadata = consumer
            .fetch_metadata(None, Duration::from_secs(10))
            .map_err(|e| {
                // librdkafka queues its logs and errors for a poll to serve (`log.queue`).
                let until = std::time::Instant::now() + Duration::from_millis(200);
                while std::time::Instant::now() < until {
                    let _ = consumer.poll(Duration::from_millis(20));
                }
                let kept = consumer.context().0.lock().map(|k| k.join("; "));
                match kept {
                    Ok(errors) if !errors.is_empty() => format!("{e} ({errors})"),
                    _ => e.to_string(),
                }
            })?;
        let names: Vec<String> = metadata
            .topics()
            .iter()
            .map(|t| t.name().to_owned())
            .collect();
        Ok::<_, String>((metadata.brokers().len(), names))
    })
    .await;
    match result {
        Ok(Ok((brokers, names))) => topics_finding(config, brokers, &names),
        Ok(Err(e)) => finding(
            "kafka",
            Verdict::Fail,
            format!("{}: {e}", config.kafka.bootstrap_servers),
        ),
        Err(e) => finding("kafka", Verdict::Fail, e.to_string()),
    }
}

/// What the brokers' topics (`names`) say of the routing: how many match the topic template,
/// and which names of `route.allowed_destinations` (the exact ones) do not exist yet.
fn topics_finding(config: &PipelineConfig, brokers: usize, names: &[String]) -> Finding {
    use crate::config::matches_destination;
    let pattern = crate::router::Template::parse(&config.route.topic_template).map_or_else(
        |_| config.route.topic_template.clone(),
        |t| t.sample_with("*"),
    );
    let matching = names
        .iter()
        .filter(|name| matches_destination(&pattern, name))
        .count();
    let mut detail = format!(
        "{brokers} broker(s) reachable; {matching} topic(s) match the template ({pattern:?})"
    );
    let missing: Vec<&String> = config
        .route
        .allowed_destinations
        .iter()
        .flatten()
        .filter(|allowed| !allowed.contains('*') && !names.contains(allowed))
        .collect();
    let verdict = match missing.is_empty() {
        true => Verdict::Ok,
        false => {
            let missing: Vec<&str> = missing.iter().map(|m| m.as_str()).collect();
            detail.push_str(&format!(
                "; allowed but missing: {} (create them before events are routed there)",
                missing.join(", ")
            ));
            Verdict::Warn
        }
    };
    if verdict == Verdict::Ok {
        detail.push_str(" (topics must exist or be auto-created)");
    }
    finding("kafka", verdict, detail)
}

/// A slot's position, as `status` prints it.
#[derive(Debug, Clone)]
pub struct SlotStatus {
    pub active_pid: Option<i32>,
    pub confirmed_flush_lsn: Option<String>,
    /// Bytes of WAL between the server's end of WAL (on a standby: its replay position) and
    /// the confirmed LSN.
    pub lag_bytes: Option<i64>,
    pub wal_status: Option<String>,
    /// Bytes of WAL that may still be written before the slot is invalidated (`None`: no
    /// `max_slot_wal_keep_size` limit).
    pub safe_wal_size: Option<i64>,
    /// Why the slot is invalidated; `None` unless `wal_status` is `lost`.
    pub invalidation: Option<Invalidation>,
    /// Whether it is a failover slot (false before PostgreSQL 17).
    pub failover: bool,
    /// With `standby_url`: the standby's copy of the slot (see
    /// [`failover::standby_slot_state`]).
    pub standby: Option<String>,
}

/// Reads the slot of `config`; `Ok(None)` if it does not exist.
///
/// Returns an error if the database cannot be reached.
pub async fn status(config: &PipelineConfig) -> Result<Option<SlotStatus>, String> {
    let (client, connection) = connect(config).await?;
    let sql = format!(
        "SELECT active_pid, confirmed_flush_lsn::text,
                    pg_wal_lsn_diff({}, confirmed_flush_lsn)::bigint,
                    wal_status, safe_wal_size,
                    to_jsonb(s) ->> 'invalidation_reason', (to_jsonb(s) ->> 'conflicting')::bool,
                    COALESCE((to_jsonb(s) ->> 'failover')::bool, false)
             FROM pg_replication_slots s WHERE slot_name = $1",
        slot::standby::WAL_END_SQL
    );
    let row = client
        .query_opt(&sql, &[&config.slot])
        .await
        .map_err(|e| chain(&SourceError::Sql(e)))?;
    drop(client);
    drop(connection);
    let Some(r) = row else { return Ok(None) };
    let wal_status: Option<String> = r.get(3);
    Ok(Some(SlotStatus {
        active_pid: r.get(0),
        confirmed_flush_lsn: r.get(1),
        lag_bytes: r.get(2),
        invalidation: (wal_status.as_deref() == Some("lost"))
            .then(|| Invalidation::of_lost(r.get(5), r.get(6))),
        wal_status,
        safe_wal_size: r.get(4),
        failover: r.get(7),
        standby: failover::standby_slot_state(config).await,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_sources_without_an_authenticated_server_are_warned_about() {
        let finding_for = |url: &str| {
            let mut config = PipelineConfig::test_pipeline();
            config.source_url = url.into();
            source_security(&config)
        };
        for (url, says) in [
            ("postgres://u@db.example/app", "sslmode=prefer"),
            (
                "postgres://u@db.example/app?sslmode=disable",
                "sslmode=disable",
            ),
            (
                "postgres://u@10.0.0.5:5433/app?sslmode=require",
                "10.0.0.5:5433",
            ),
            (
                "postgres://u@db.example/app?sslmode=verify-full&sslrootcert=%2Fca.pem",
                "channel_binding=prefer",
            ),
            ("postgres://u@localhost,db.example/app", "db.example:5432"),
        ] {
            let finding = finding_for(url).unwrap_or_else(|| panic!("no finding for {url}"));
            assert_eq!(finding.verdict, Verdict::Warn, "{url}");
            assert!(
                finding.detail.contains(says)
                    && finding.detail.contains(
                        "sslmode=verify-full&sslrootcert=<CA file>&channel_binding=require"
                    ),
                "{url}: {}",
                finding.detail
            );
            assert!(!finding.detail.contains("localhost"), "{}", finding.detail);
        }
        assert!(finding_for("postgres://u@db.example/app?sslmode=prefer")
            .unwrap()
            .detail
            .contains("password"));
        for url in [
            "postgres://u@db.example/app?sslmode=verify-full&sslrootcert=%2Fca.pem&channel_binding=require",
            "postgres://u@localhost/app?sslmode=disable",
            "postgres://u@127.0.0.2/app",
            "postgres://u@[::1]/app?sslmode=prefer",
            "postgres://u@%2Frun%2Fpostgresql/app",
            "host=/var/run/postgresql user=u",
            "postgres://u@db.example/app?hostaddr=127.0.0.1",
        ] {
            assert!(finding_for(url).is_none(), "{url}: {:?}", finding_for(url));
        }
    }

    /// librdkafka's warnings about producer properties on `check`'s consumer (CONFWARN) are
    /// not kept: with `acks`, `enable.idempotence` and `linger.ms` set they filled every slot
    /// before the certificate or SASL error came.
    #[test]
    fn client_errors_keep_the_failures_not_the_configuration_warnings() {
        let errors = ClientErrors::default();
        for property in ["acks", "enable.idempotence", "linger.ms"] {
            errors.log(
                RDKafkaLogLevel::Warning,
                "CONFWARN",
                &format!("[thrd:app]: Configuration property {property} is a producer property and will be ignored by this consumer instance"),
            );
        }
        errors.log(
            RDKafkaLogLevel::Error,
            "FAIL",
            "ssl://k:9093/bootstrap: SSL handshake failed: certificate verify failed",
        );
        errors.log(
            RDKafkaLogLevel::Debug,
            "BROKER",
            "ssl://k:9093/bootstrap: connecting",
        );
        let kept = errors.0.lock().unwrap();
        assert_eq!(
            *kept,
            ["FAIL ssl://k:9093/bootstrap: SSL handshake failed: certificate verify failed"]
        );
    }

    #[test]
    fn routing_warns_without_an_allow_list() {
        let mut config = PipelineConfig::test_pipeline();
        let open = routing(&config);
        assert_eq!(open.verdict, Verdict::Warn);
        assert!(
            open.detail.contains("any row can pick any destination")
                && open.detail.contains("\"<X>.events\""),
            "{}",
            open.detail
        );
        config.route.allowed_destinations = Some(vec!["Order.events".into(), "billing.*".into()]);
        let listed = routing(&config);
        assert_eq!(listed.verdict, Verdict::Ok);
        assert!(
            listed.detail.ends_with("Order.events, billing.*"),
            "{}",
            listed.detail
        );
    }

    /// Topics are counted by the configured template, not by a `.events` suffix (an imported
    /// Debezium template such as `outbox.event.${routedByValue}` showed 0), and the exact names
    /// of the allow-list that do not exist are named.
    #[test]
    fn check_counts_the_topics_the_template_makes_and_names_missing_allowed_ones() {
        let mut config = PipelineConfig::test_pipeline();
        config.route.topic_template = "outbox.event.${routedByValue}".into();
        let names: Vec<String> = ["outbox.event.Order", "outbox.event.Payment", "Order.events"]
            .map(String::from)
            .to_vec();
        let found = topics_finding(&config, 1, &names);
        assert_eq!(found.verdict, Verdict::Ok);
        assert!(
            found
                .detail
                .contains("2 topic(s) match the template (\"outbox.event.*\")"),
            "{}",
            found.detail
        );
        config.route.allowed_destinations = Some(vec![
            "outbox.event.Order".into(),
            "outbox.event.Refund".into(),
            "x.*".into(),
        ]);
        let found = topics_finding(&config, 1, &names);
        assert_eq!(found.verdict, Verdict::Warn);
        assert!(
            found
                .detail
                .contains("allowed but missing: outbox.event.Refund ("),
            "{}",
            found.detail
        );
    }
}
