use std::time::Duration;

use crate::support::{self, http_get, kafka, pg, unique_name, wait_for, Auth, Relay};
use crate::{assert_delivered, write_events, Setup};

/// The relay's own parsing of a source URL (TLS parameters and `require_auth` included; any
/// host).
fn source_config(url: &str) -> outbox_relay::source::conninfo::ConnInfo {
    let (rest, tls) = outbox_relay::source::tls::split_url(url).unwrap();
    let (rest, taken) = outbox_relay::source::tls::split_params(&rest, &["require_auth"]);
    outbox_relay::source::conninfo::ConnInfo {
        pg: rest.parse().unwrap(),
        tls,
        target: Default::default(),
        require_auth: taken.last().map(|(_, list)| list.parse().unwrap()),
    }
}

#[tokio::test]
async fn replication_connection_authenticates_with_every_method() {
    use outbox_relay::source::replication::ReplicationClient;
    let db = pg().create_database(&unique_name("auth")).await;
    // A cleartext password only where the URL allows it (the connection is not verified).
    let url = |auth| match auth {
        Auth::Password => format!("{}?require_auth=password", db.url(auth)),
        _ => db.url(auth),
    };
    for auth in [Auth::Trust, Auth::Password, Auth::Md5, Auth::Scram] {
        let source = source_config(&url(auth));
        let mut client = ReplicationClient::connect(&source)
            .await
            .unwrap_or_else(|e| panic!("{auth:?}: {}", outbox_relay::error::chain(&e)));
        let identity = client.identify_system().await.unwrap();
        assert_eq!(
            identity.dbname.as_deref(),
            Some(db.name.as_str()),
            "{auth:?}"
        );
        assert!(identity.xlogpos.0 > 0);
    }
    for auth in [Auth::Password, Auth::Md5, Auth::Scram] {
        let source = source_config(&url(auth).replace(support::PASSWORD, "wrong"));
        let error = ReplicationClient::connect(&source)
            .await
            .err()
            .expect("wrong password accepted");
        assert!(
            matches!(&error, outbox_relay::source::SourceError::Server { code, .. } if code == "28P01"),
            "{auth:?}: {error}"
        );
        assert!(
            !error.is_transient(),
            "{auth:?}: a wrong password is not worth retrying"
        );
    }
}

/// Whoever answers for an unverified server must not get the password: neither connection
/// answers a cleartext request unless `require_auth` allows it, `require_auth` refuses what it
/// does not list, and `channel_binding=require` refuses everything but SCRAM-SHA-256-PLUS.
#[tokio::test]
async fn unverified_servers_get_no_cleartext_password_and_require_auth_holds() {
    use outbox_relay::source::replication::ReplicationClient;
    use outbox_relay::source::target::connect_sql;
    use outbox_relay::source::SourceError;
    let db = pg().create_database(&unique_name("reqauth")).await;
    let server = format!("127.0.0.1:{}", pg().port());
    let refused = |url: String, why: &'static str| {
        let server = server.clone();
        async move {
            let source = source_config(&url);
            let error = ReplicationClient::connect(&source)
                .await
                .err()
                .unwrap_or_else(|| panic!("replication connection accepted: {url}"));
            assert!(
                matches!(&error, SourceError::Auth(text) if text.contains(why) && text.contains(&server)),
                "{url}: {error}"
            );
            assert!(!error.is_transient(), "{url}: {error}");
            let error = connect_sql(&source)
                .await
                .err()
                .unwrap_or_else(|| panic!("SQL connection accepted: {url}"));
            let text = outbox_relay::error::chain(&error);
            assert!(text.contains(why), "{url}: {text}");
            assert!(!error.is_transient(), "{url}: {text}");
        }
    };
    let password = db.url(Auth::Password);
    // prefer (TLS, nothing verified), require (no CA file) and no TLS at all.
    for mode in ["prefer", "require", "disable"] {
        refused(format!("{password}?sslmode={mode}"), "cleartext").await;
    }
    refused(
        format!("{}?require_auth=scram-sha-256", db.url(Auth::Md5)),
        "require_auth=scram-sha-256",
    )
    .await;
    refused(
        format!("{password}?require_auth=password&channel_binding=require"),
        "channel_binding",
    )
    .await;
    // Allowed explicitly, both connections answer.
    let source = source_config(&format!("{password}?require_auth=password,md5"));
    ReplicationClient::connect(&source)
        .await
        .unwrap_or_else(|e| panic!("{}", outbox_relay::error::chain(&e)));
    let _sql = connect_sql(&source)
        .await
        .unwrap_or_else(|e| panic!("{}", outbox_relay::error::chain(&e)));
}

/// `sslmode=require` verifies the chain against `~/.postgresql/root.crt` when that file exists
/// (libpq: then it behaves as `verify-ca`): a CA that did not sign the server's certificate
/// stops the relay; the right one streams, with channel binding on both connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_verifies_against_root_crt_in_home_and_channel_binding_streams() {
    let setup = Setup::new("rootcrt", &["Order"], 1).await;
    // 127.0.0.1 is not in the certificate: require checks no host name.
    let url = format!(
        "postgres://relay_tls:{}@127.0.0.1:{}/{}?sslmode=require&channel_binding=require",
        support::PASSWORD,
        pg().port(),
        setup.db.name,
    );
    let home_with = |ca: &std::path::Path| {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".postgresql")).unwrap();
        std::fs::copy(ca, home.path().join(".postgresql/root.crt")).unwrap();
        home
    };
    let other = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("openssl")
        .current_dir(other.path())
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "other.crt",
            "-days",
            "2",
            "-subj",
            "/CN=another CA",
        ])
        .output()
        .expect("running openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args[2] = url;

    let wrong = home_with(&other.path().join("other.crt"));
    let home = wrong.path().display().to_string();
    let mut refused = Relay::spawn_with_env(&args, &[("HOME", &home)]);
    let status = refused.wait(Duration::from_secs(30));
    assert!(
        !status.success(),
        "sslmode=require ignored ~/.postgresql/root.crt"
    );
    assert!(
        refused.log().to_lowercase().contains("certificate"),
        "{}",
        refused.log()
    );

    let right = home_with(&pg().ca_cert());
    let home = right.path().display().to_string();
    let relay = Relay::spawn_with_env(&args, &[("HOME", &home)]);
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    setup.assert_first_topic(&written, true).await;
    assert!(
        !relay.log().contains(support::PASSWORD),
        "the password was logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_walsender_is_terminated_and_loses_nothing() {
    reconnects_after_the_walsender_is_terminated_and_loses_nothing_on(pg()).await;
}

/// A walsender terminated on `cluster` mid-stream: the relay reconnects and loses nothing.
pub(crate) async fn reconnects_after_the_walsender_is_terminated_and_loses_nothing_on(
    cluster: &support::PgCluster,
) {
    let setup = Setup::new_on(cluster, "terminate", &["Order", "Refund"], 2).await;
    let mut relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Scram));
    setup.wait_streaming().await;
    let first_pid = setup.db.slot_active_pid(&setup.slot).await.unwrap();

    let (mut written, _) =
        write_events(&setup.db.client, 30, 3, &setup.types, 5, 0, Duration::ZERO).await;
    assert!(
        setup.db.terminate_slot_backend(&setup.slot).await,
        "no walsender to terminate"
    );
    let (more, before_commit) =
        write_events(&setup.db.client, 30, 3, &setup.types, 5, 90, Duration::ZERO).await;
    written.extend(more);

    relay
        .wait_for_log("reconnecting", Duration::from_secs(30))
        .await;
    wait_for(
        "the relay to stream again from a new walsender",
        Duration::from_secs(60),
        || async {
            setup
                .db
                .slot_active_pid(&setup.slot)
                .await
                .filter(|pid| *pid != first_pid)
        },
    )
    .await;
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(90),
        )
        .await;
    assert_delivered(&written, &consumed, false);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "confirmed_flush_lsn to pass the last commit after the reconnect",
            Duration::from_secs(30),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_slot_one_streams_and_the_other_takes_over() {
    let setup = Setup::new("standby", &["Order"], 2).await;
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Md5);
    let mut active = Relay::spawn(&args);
    setup.wait_streaming().await;
    let mut standby = Relay::spawn(&args);
    standby
        .wait_for_log("is active for PID", Duration::from_secs(30))
        .await;

    let (mut written, _) =
        write_events(&setup.db.client, 10, 2, &setup.types, 3, 0, Duration::ZERO).await;
    setup
        .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
        .await;
    assert!(
        !standby.log().contains("streaming"),
        "the standby streamed while the slot was held:\n{}",
        standby.log()
    );

    active.kill();
    let (more, before_commit) =
        write_events(&setup.db.client, 10, 2, &setup.types, 3, 20, Duration::ZERO).await;
    written.extend(more);
    standby
        .wait_for_log("streaming", Duration::from_secs(60))
        .await;
    let consumed = setup
        .consume_all(
            written.len(),
            Duration::from_secs(2),
            Duration::from_secs(90),
        )
        .await;
    assert_delivered(&written, &consumed, false);
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "the standby to confirm past the last commit",
            Duration::from_secs(30),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verify_full_streams_and_a_wrong_host_name_is_refused() {
    use outbox_relay::source::replication::ReplicationClient;
    use outbox_relay::source::SourceError;
    let setup = Setup::new("tls", &["Order"], 1).await;
    let ca = pg().ca_cert();
    // relay_tls may only connect over TLS (pg_hba: hostnossl reject).
    let url = |host: &str, mode: &str| {
        format!(
            "postgres://relay_tls:{}@{host}:{}/{}?sslmode={mode}&sslrootcert={}",
            support::PASSWORD,
            pg().port(),
            setup.db.name,
            ca.display()
        )
    };

    for (host, mode) in [
        ("localhost", "verify-full"),
        ("127.0.0.1", "verify-ca"),
        ("127.0.0.1", "require"),
    ] {
        let source = source_config(&url(host, mode));
        let mut client = ReplicationClient::connect(&source)
            .await
            .unwrap_or_else(|e| panic!("{host} {mode}: {}", outbox_relay::error::chain(&e)));
        client.identify_system().await.unwrap();
    }
    // The server certificate names only localhost.
    let source = source_config(&url("127.0.0.1", "verify-full"));
    let error = ReplicationClient::connect(&source)
        .await
        .err()
        .expect("verify-full accepted a wrong host name");
    assert!(
        matches!(&error, SourceError::Tls(text) if text.contains("127.0.0.1")),
        "{error}"
    );
    assert!(!error.is_transient());
    // Without TLS the server refuses relay_tls: the connections above really used TLS.
    let source = source_config(&url("localhost", "disable"));
    let error = ReplicationClient::connect(&source)
        .await
        .err()
        .expect("plain connection accepted");
    assert!(
        matches!(&error, SourceError::Server { code, .. } if code == "28000"),
        "{error}"
    );

    // SCRAM over TLS binds the channel (SCRAM-SHA-256-PLUS), so channel_binding=require
    // connects; without TLS there is nothing to bind and require is refused before the
    // password is sent.
    let source = source_config(&format!(
        "{}&channel_binding=require",
        url("localhost", "verify-full")
    ));
    ReplicationClient::connect(&source)
        .await
        .unwrap_or_else(|e| panic!("channel binding: {}", outbox_relay::error::chain(&e)));
    let source = source_config(&format!(
        "{}?sslmode=disable&channel_binding=require",
        setup.db.url(Auth::Scram)
    ));
    let error = ReplicationClient::connect(&source)
        .await
        .err()
        .expect("channel_binding=require accepted a session without TLS");
    assert!(
        matches!(&error, SourceError::Auth(text) if text.contains("channel_binding")),
        "{error}"
    );
    // hostaddr gives the address; the host name is only for TLS verification.
    let source = source_config(&format!(
        "postgres://relay_tls:{}@localhost.invalid:{}/{}?hostaddr=127.0.0.1&sslmode=verify-ca&sslrootcert={}",
        support::PASSWORD,
        pg().port(),
        setup.db.name,
        ca.display()
    ));
    ReplicationClient::connect(&source)
        .await
        .unwrap_or_else(|e| panic!("hostaddr: {}", outbox_relay::error::chain(&e)));
    // hostaddr alone, as libpq allows.
    let source = source_config(&format!(
        "hostaddr=127.0.0.1 port={} dbname={} user=relay_tls password={} sslmode=require",
        pg().port(),
        setup.db.name,
        support::PASSWORD,
    ));
    ReplicationClient::connect(&source)
        .await
        .unwrap_or_else(|e| panic!("hostaddr alone: {}", outbox_relay::error::chain(&e)));

    // The relay stops on a certificate that does not verify instead of retrying forever.
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args[2] = url("127.0.0.1", "verify-full");
    let mut refused = Relay::spawn(&args);
    let status = refused.wait(Duration::from_secs(30));
    assert!(
        !status.success(),
        "the relay accepted a certificate for another host"
    );
    assert!(
        refused.log().to_lowercase().contains("certificate"),
        "{}",
        refused.log()
    );

    // The relay end to end over TLS (replication and SQL connections).
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args[2] = url("localhost", "verify-full");
    let relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    setup.assert_first_topic(&written, true).await;
    assert!(
        !relay.log().contains(support::PASSWORD),
        "the password was logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libpq_environment_and_password_file_are_honoured() {
    use std::os::unix::fs::PermissionsExt;
    let setup = Setup::new("pgenv", &["Order"], 1).await;
    let dir = tempfile::tempdir().unwrap();
    let passfile = dir.path().join("pgpass");
    std::fs::write(
        &passfile,
        format!(
            "127.0.0.1:{}:{}:relay_scram:{}\n",
            pg().port(),
            setup.db.name,
            support::PASSWORD
        ),
    )
    .unwrap();
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args[2] = format!("dbname={}", setup.db.name);
    let port = pg().port().to_string();
    let passfile = passfile.display().to_string();
    let relay = Relay::spawn_with_env(
        &args,
        &[
            ("PGHOST", "127.0.0.1"),
            ("PGPORT", &port),
            ("PGUSER", "relay_scram"),
            ("PGPASSFILE", &passfile),
            ("PGSSLMODE", "disable"),
        ],
    );
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    setup.assert_first_topic(&written, true).await;
    assert!(
        !relay.log().contains(support::PASSWORD),
        "the password was logged"
    );
}

/// Role and database defaults cannot break the relay's sessions: a 1 ms statement_timeout, a
/// 1 s idle_session_timeout, a search_path without pg_catalog's friends and other DateStyle,
/// TimeZone, IntervalStyle, bytea_output and extra_float_digits on the database. The relay's
/// settings are in force from the start of its SQL and replication sessions; it streams, stays
/// connected while idle and publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_database_defaults_do_not_break_the_sessions() {
    let setup = Setup::new("defaults", &["Order"], 1).await;
    let db = setup.db.name.clone();
    for setting in [
        "statement_timeout = '1ms'",
        "lock_timeout = '1ms'",
        "idle_session_timeout = '1s'",
        "idle_in_transaction_session_timeout = '1s'",
        "search_path = nowhere",
        "DateStyle = 'SQL, DMY'",
        "TimeZone = 'America/Bogota'",
        "IntervalStyle = 'sql_standard'",
        "bytea_output = 'escape'",
        "extra_float_digits = 0",
    ] {
        setup
            .db
            .client
            .batch_execute(&format!("ALTER DATABASE {db} SET {setting}"))
            .await
            .unwrap();
    }
    // The relay's settings are in force from the start of its sessions (source `client`, the
    // start-up packet), never the database's: a SET sent after connecting ran under a 1 ms
    // statement_timeout and was cancelled when the machine was busy.
    let mut config =
        outbox_relay::config::PipelineConfig::new("defaults", "public.outbox".parse().unwrap());
    config.source_url = setup.db.url(Auth::Trust).into();
    const SETTINGS: &str = "SELECT lower(name), setting, source FROM pg_catalog.pg_settings WHERE lower(name) IN ('bytea_output', 'datestyle', 'extra_float_digits', 'idle_in_transaction_session_timeout', 'idle_session_timeout', 'intervalstyle', 'lock_timeout', 'search_path', 'statement_timeout', 'timezone') ORDER BY 1";
    let expected = [
        ("bytea_output", "hex"),
        ("datestyle", "ISO, MDY"),
        ("extra_float_digits", "1"),
        ("idle_in_transaction_session_timeout", "0"),
        ("idle_session_timeout", "0"),
        ("intervalstyle", "postgres"),
        ("lock_timeout", "0"),
        ("search_path", "pg_catalog,pg_temp"),
        ("statement_timeout", "0"),
        ("timezone", "UTC"),
    ]
    .map(|(name, setting)| {
        [name, setting, "client"]
            .map(|s| Some(s.to_owned()))
            .to_vec()
    })
    .to_vec();
    let (client, _connection) = outbox_relay::source::slot::connect(&config).await.unwrap();
    let sql_session: Vec<Vec<Option<String>>> = client
        .query(SETTINGS, &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (0..3).map(|i| row.get(i)).collect())
        .collect();
    assert_eq!(sql_session, expected, "SQL session (name, setting, source)");
    let mut replication = outbox_relay::source::replication::ReplicationClient::connect(
        &config.source_config().unwrap(),
    )
    .await
    .unwrap();
    let walsender = replication.simple_query(SETTINGS).await.unwrap();
    assert_eq!(
        walsender, expected,
        "replication session (name, setting, source)"
    );
    drop(replication);
    let relay = Relay::spawn(&setup.relay_args(&kafka().bootstrap(), Auth::Trust));
    setup.wait_streaming().await;
    let pid = setup.db.slot_active_pid(&setup.slot).await.unwrap();
    let (mut written, _) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 0, Duration::ZERO).await;
    // Idle well past idle_session_timeout.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (more, before_commit) =
        write_events(&setup.db.client, 2, 2, &setup.types, 2, 4, Duration::ZERO).await;
    written.extend(more);
    setup.assert_first_topic(&written, true).await;
    setup
        .wait_confirmed_past(
            *before_commit.last().unwrap(),
            "confirmed_flush_lsn to pass the last commit",
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(
        setup.db.slot_active_pid(&setup.slot).await,
        Some(pid),
        "the relay reconnected:\n{}",
        relay.log()
    );
    assert!(!relay.log().contains("reconnecting"), "{}", relay.log());
}

/// A source URL whose first host refuses walsenders but takes SQL: the pipeline's SQL
/// connection (slot checks, confirmed LSN) and the slot watcher (the slot's metrics) go to
/// the server the replication connection reached, the second host. Found by review: the
/// watcher chose its host by itself and read the first host's (missing) slot, so the slot's
/// `wal_status` and lag described another server than the WAL streamed from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_connections_follow_the_host_the_walsender_was_reached_on() {
    let refusing = support::PgCluster::start_private(&unique_name("nowalsender"));
    // No walsender slots: a walsender is refused (53300, a transient error, so the next
    // host is tried), an ordinary connection is not.
    refusing.psql("postgres", "ALTER SYSTEM SET max_wal_senders = 0");
    refusing.restart("fast");
    let setup = Setup::new("pinned_sql", &["Order"], 1).await;
    // The same database on the refusing host, where SQL connections succeed first.
    let decoy = refusing.create_database(&setup.db.name).await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{}",
        refusing.port(),
        setup.db.port(),
        setup.db.name
    );
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let at = args.iter().position(|a| a == "--source-url").unwrap() + 1;
    args[at] = url;
    args.extend(["--metrics-listen".into(), metrics.clone()]);
    // Made beforehand, so that the first reading of the streamed server finds it.
    setup.db.create_slot(&setup.slot).await;
    let relay = Relay::spawn(&args);
    let reserved = format!(
        "outbox_relay_slot_wal_status{{pipeline=\"{}\",status=\"reserved\"}}",
        setup.slot
    );
    // The slot's first reading is already the streamed server's (it was the first host's,
    // for up to one interval).
    let first = wait_for(
        "the slot watcher's first reading",
        Duration::from_secs(45),
        || async {
            let text = http_get(&metrics, "/metrics").await?.1;
            text.contains(&reserved)
                .then(|| support::metric_value(&text, &reserved))
        },
    )
    .await;
    assert_eq!(first, 1.0, "the first reading was not the streamed slot's");
    setup.wait_streaming().await;
    let (written, _) =
        write_events(&setup.db.client, 4, 2, &setup.types, 2, 0, Duration::ZERO).await;
    let consumed = setup
        .consume_all(written.len(), Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_delivered(&written, &consumed, true);

    wait_for(
        "the slot watcher to read the streamed slot's wal_status",
        Duration::from_secs(45),
        || async {
            let text = support::scrape_metrics(&metrics).await;
            (support::metric_value(&text, &reserved) == 1.0).then_some(())
        },
    )
    .await;
    let slots: i64 = decoy
        .client
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "a slot was made on the host refusing walsenders");
    drop(relay);
    refusing.stop("fast");
}

/// A password with `@`, `#`, `/`, `:` and `?` given beside the URL (`source_password_file` in
/// a config file, `OUTBOX_RELAY_SOURCE_PASSWORD` with the flags) is taken as written: no
/// percent-encoding, and a SCRAM server accepts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_with_url_characters_is_given_beside_the_url() {
    const TRICKY: &str = "p@ss#w/rd:1?x";
    let cluster = support::PgCluster::start_private(&unique_name("tricky_pw"));
    cluster.psql(
        "postgres",
        &format!("ALTER ROLE relay_scram PASSWORD '{TRICKY}'"),
    );
    let setup = crate::Setup::new_on(&cluster, "tricky_pw", &["Order"], 1).await;
    let url = format!(
        "postgres://relay_scram@127.0.0.1:{}/{}",
        setup.db.port(),
        setup.db.name
    );
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, format!("{TRICKY}\n")).unwrap();
    std::fs::set_permissions(
        &password_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let toml = format!(
        "[kafka]\nbootstrap_servers = \"{}\"\n[[pipelines]]\nname = \"p\"\nsource_url = \"{url}\"\nsource_password_file = \"{}\"\nslot = \"{}\"\npublication = \"outbox_pub\"\ntable = \"public.outbox\"\n",
        kafka().bootstrap(),
        password_file.display(),
        setup.slot
    );
    let (_config_dir, args) = crate::run_with_config(&toml);
    let mut relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    setup.one_event_flows().await;
    relay.sigterm();
    assert!(
        relay.wait(Duration::from_secs(40)).success(),
        "{}",
        relay.log()
    );

    // The same with the single-database flags and the password in the environment.
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let at = args.iter().position(|a| a == "--source-url").unwrap() + 1;
    args[at] = url;
    let mut relay = Relay::spawn_with_env(&args, &[("OUTBOX_RELAY_SOURCE_PASSWORD", TRICKY)]);
    setup.wait_streaming().await;
    let second = setup
        .db
        .insert_event(&setup.types[0], "1", "Updated", Some("{}"), None)
        .await;
    let consumed = setup
        .consume_all(2, Duration::ZERO, Duration::from_secs(60))
        .await;
    assert_eq!(
        consumed[1].header_str("id").as_deref(),
        Some(second.as_str())
    );
    assert!(!relay.log().contains(TRICKY), "the password was logged");
    relay.sigterm();
    assert!(
        relay.wait(Duration::from_secs(40)).success(),
        "{}",
        relay.log()
    );
}
