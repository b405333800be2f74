//! The source URL as libpq reads it: [`PipelineConfig::source_config`] parses `source_url`
//! into a tokio-postgres config and the TLS settings, and [`apply`] fills in what the URL leaves
//! out the way libpq does: the `PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD`,
//! `PGAPPNAME`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, `PGCONNECT_TIMEOUT`,
//! `PGTARGETSESSIONATTRS` and `PGREQUIREAUTH` environment variables, then libpq's defaults (the local socket
//! directory, the OS user name). Without a password there, [`ConnInfo::config_for`] reads the
//! password file (`PGPASSFILE`, default `~/.pgpass`; PostgreSQL docs, 34.16 "The Password
//! File") for each host as it is tried, as libpq does: each host of a multi-host URL gets the
//! line of its own name and port.
//!
//! The method lives here, not in [`crate::config`], so that configuration stays plain data
//! that imports nothing of the source.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tokio_postgres::config::Host;

use crate::config::{redact_url, ConfigError, PipelineConfig};
use crate::source::auth::RequireAuth;
use crate::source::target::{Endpoint, TargetSessionAttrs};
use crate::source::tls::{self, TlsSettings};

/// How to reach a pipeline's database: what tokio-postgres parsed of the source URL, the TLS
/// settings and which host to take. Built afresh for every session, so nothing of an earlier
/// server (one that failed over) is kept.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Every host, port and setting tokio-postgres knows (its `target_session_attrs` is
    /// always `any`: the relay chooses the host itself).
    pub pg: tokio_postgres::Config,
    pub tls: TlsSettings,
    /// `target_session_attrs` of the URL, else `PGTARGETSESSIONATTRS`, else `any`.
    pub target: TargetSessionAttrs,
    /// libpq's `require_auth` of the URL, else `PGREQUIREAUTH` (see [`crate::source::auth`]).
    pub require_auth: Option<RequireAuth>,
}

/// Parameters taken out of the URL before tokio-postgres parses it, besides TLS's: it knows
/// only `any` and `read-write` of libpq's `target_session_attrs`, and not `require_auth`.
const TARGET_PARAM: &str = "target_session_attrs";
const REQUIRE_AUTH_PARAM: &str = "require_auth";

/// What [`split`] takes out of a URL besides TLS's (`None`: not set).
#[derive(Debug, Default)]
struct Taken {
    target: Option<TargetSessionAttrs>,
    require_auth: Option<RequireAuth>,
}

/// Splits `url` into what tokio-postgres parses, the TLS settings, `target_session_attrs`
/// and `require_auth`.
fn split(url: &str) -> Result<(String, TlsSettings, Taken), String> {
    let (rest, tls) = tls::split_url(url)?;
    let (rest, taken) = tls::split_params(&rest, &[TARGET_PARAM, REQUIRE_AUTH_PARAM]);
    let mut out = Taken::default();
    for (key, value) in taken {
        match key {
            TARGET_PARAM => out.target = Some(value.parse()?),
            _ => out.require_auth = Some(value.parse()?),
        }
    }
    Ok((rest, tls, out))
}

/// Session settings of every connection the relay opens to a source (SQL and replication), so
/// role and database defaults (`ALTER ROLE ... SET`, `ALTER DATABASE ... SET`) cannot break
/// them: catalog names resolve in `pg_catalog` only, no timeout ends a slot creation waiting
/// for running transactions or an idle connection kept between status queries, and values
/// print in one format.
///
/// They travel in the start-up packet's `options` (PostgreSQL docs, 20.1.4 "Parameter
/// Interaction via the Shell", and StartupMessage in 55.7 "Message Formats"), after any
/// `options` of the source URL, so the server applies them at backend start, over the role's
/// and database's defaults and before the first statement: a `SET` sent after connecting
/// would itself run under, say, a `statement_timeout` of 1 ms. `idle_session_timeout` needs
/// PostgreSQL 14 or later. PostgreSQL 17's `transaction_timeout` is not among them: 14 to 16
/// refuse a start-up option they do not know.
pub const SESSION_OPTIONS: &str = "-c search_path=pg_catalog,pg_temp -c statement_timeout=0 \
-c lock_timeout=0 -c idle_in_transaction_session_timeout=0 -c idle_session_timeout=0 \
-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres -c bytea_output=hex \
-c extra_float_digits=1";

impl PipelineConfig {
    /// The source database's name as libpq chooses it: the URL's `dbname`, else `PGDATABASE`,
    /// else the user (the URL's, `PGUSER`, `USER`). Reads no file (unlike
    /// [`PipelineConfig::source_config`], which may read the password file).
    ///
    /// Returns `None` if the URL does not parse or no user can be determined.
    pub fn source_database(&self) -> Option<String> {
        let (rest, _, _) = split(&self.source_url).ok()?;
        let config: tokio_postgres::Config = rest.parse().ok()?;
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        config
            .get_dbname()
            .map(str::to_owned)
            .or_else(|| env("PGDATABASE"))
            .or_else(|| config.get_user().map(str::to_owned))
            .or_else(|| env("PGUSER"))
            .or_else(|| env("USER"))
    }

    /// The user the source URL names itself (not one the environment would fill in); `None`
    /// when it names none or does not parse.
    pub fn url_user(&self) -> Option<String> {
        let (rest, _, _) = split(&self.source_url).ok()?;
        let config: tokio_postgres::Config = rest.parse().ok()?;
        config.get_user().map(str::to_owned)
    }

    /// The source URL parsed by tokio-postgres, with what it leaves out filled in as libpq
    /// would (`PG*` environment variables, the password file, the local socket directory;
    /// see [`apply`]), its TLS settings and `target_session_attrs`. Its `options` end with
    /// [`SESSION_OPTIONS`].
    ///
    /// Returns an error naming `source_url` (without its password) if it does not parse.
    pub fn source_config(&self) -> Result<ConnInfo, ConfigError> {
        let invalid = |e: &dyn fmt::Display| {
            let shown = redact_url(&self.source_url);
            // The password is hidden, so the URL shown may look right: say what breaks one.
            let parses_without_password = || {
                split(&shown)
                    .ok()
                    .and_then(|(rest, _, _)| rest.parse::<tokio_postgres::Config>().ok())
                    .is_some()
            };
            let hint = if shown != *self.source_url
                && self.source_url.contains("://")
                && parses_without_password()
            {
                "; a password in the URL must have @ # / ? : and % percent-encoded (%40 %23 %2F \
                 %3F %3A %25), or go in source_password (OUTBOX_RELAY_SOURCE_PASSWORD) or \
                 source_password_file, taken as written"
            } else {
                ""
            };
            ConfigError::new("source_url", format!("{shown}: {e}{hint}"))
        };
        let (rest, mut tls, taken) = split(&self.source_url).map_err(|e| invalid(&e))?;
        let mut config: tokio_postgres::Config = rest.parse().map_err(|e| invalid(&e))?;
        if let Some(password) = &self.source_password {
            if config.get_password().is_some() {
                return Err(ConfigError::new(
                    "source_password",
                    "the source URL has a password too: give it in one place",
                ));
            }
            config.password(password.as_bytes());
        }
        // tokio-postgres may have parsed an sslmode this parser did not see (`sslmode = require`
        // with spaces): never go below it.
        if !tls.mode_given && config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            tls.mode = tls.mode.max(tls::SslMode::Require);
            tls.mode_given = true;
        }
        let env = |name: &str| std::env::var(name).ok();
        apply(&mut config, &mut tls, &env).map_err(|e| invalid(&e))?;
        let target = target_or_env(taken.target, &env).map_err(|e| invalid(&e))?;
        let require_auth = match (taken.require_auth, env("PGREQUIREAUTH")) {
            (Some(list), _) => Some(list),
            (None, Some(value)) => Some(
                value
                    .parse()
                    .map_err(|e| invalid(&format!("PGREQUIREAUTH: {e}")))?,
            ),
            (None, None) => None,
        };
        // Unix sockets never use TLS (as libpq and the replication client).
        let all_unix = config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
        config.ssl_mode(if all_unix {
            tokio_postgres::config::SslMode::Disable
        } else {
            tls.tokio_postgres_mode()
        });
        let options = match config.get_options() {
            // A lone backslash at the end would escape the space before the relay's own.
            Some(given) if (given.len() - given.trim_end_matches('\\').len()) % 2 == 1 => {
                return Err(invalid(&"options ends in a backslash that escapes nothing"));
            }
            Some(given) => format!("{given} {SESSION_OPTIONS}"),
            None => SESSION_OPTIONS.to_owned(),
        };
        config.options(&options);
        Ok(ConnInfo {
            pg: config,
            tls,
            target,
            require_auth,
        })
    }
}

impl ConnInfo {
    /// The tokio-postgres config for connecting to `endpoint`: [`ConnInfo::pg`], with the
    /// password of the password file's first line for that host, port, database and user when
    /// neither the URL nor `PGPASSWORD` gave one.
    pub fn config_for(&self, endpoint: &Endpoint) -> tokio_postgres::Config {
        self.config_for_env(endpoint, &|name| std::env::var(name).ok())
    }

    fn config_for_env(&self, endpoint: &Endpoint, env: Env<'_>) -> tokio_postgres::Config {
        let mut config = self.pg.clone();
        if config.get_password().is_none() {
            if let Some(password) = from_passfile(&config, endpoint, env) {
                config.password(password);
            }
        }
        config
    }
}

type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The socket directory libpq (Debian's build) uses without a host, which the password file
/// names `localhost`.
const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// Completes `config` and `tls` from `env` (the password file is read per host, by
/// [`ConnInfo::config_for`]).
///
/// Returns an error naming the variable if one holds an invalid value, or if no user can be
/// determined.
pub fn apply(
    config: &mut tokio_postgres::Config,
    tls: &mut TlsSettings,
    env: Env<'_>,
) -> Result<(), String> {
    // tokio-postgres fills in port 5432 for a URL host without one, so PGPORT applies only
    // when the host, too, comes from the environment or the default.
    let port_from_env = config.get_hosts().is_empty() || config.get_ports().is_empty();
    if config.get_hosts().is_empty() {
        match env("PGHOST") {
            Some(hosts) => {
                for host in hosts.split(',') {
                    if host.starts_with('/') {
                        config.host_path(host);
                    } else {
                        config.host(host);
                    }
                }
            }
            None => {
                config.host_path(DEFAULT_SOCKET_DIR);
            }
        }
    }
    if port_from_env {
        if let Some(port) = env("PGPORT") {
            config.port(
                port.parse()
                    .map_err(|_| format!("PGPORT {port:?} is not a port"))?,
            );
        }
    }
    if config.get_user().is_none() {
        let user = env("PGUSER")
            .or_else(|| env("USER"))
            .ok_or("no user given (source_url, PGUSER or USER)")?;
        config.user(&user);
    }
    if config.get_dbname().is_none() {
        if let Some(db) = env("PGDATABASE") {
            config.dbname(&db);
        }
    }
    if config.get_application_name().is_none() {
        if let Some(name) = env("PGAPPNAME") {
            config.application_name(&name);
        }
    }
    if config.get_connect_timeout().is_none() {
        if let Some(secs) = env("PGCONNECT_TIMEOUT") {
            let secs: u64 = secs
                .parse()
                .map_err(|_| format!("PGCONNECT_TIMEOUT {secs:?} is not a number of seconds"))?;
            config.connect_timeout(Duration::from_secs(secs));
        }
    }
    if !tls.mode_given {
        if let Some(mode) = env("PGSSLMODE") {
            tls.mode = mode.parse().map_err(|e| format!("PGSSLMODE: {e}"))?;
        }
    }
    tls.root_cert = tls.root_cert.take().or_else(|| env("PGSSLROOTCERT"));
    tls.client_cert = tls
        .client_cert
        .take()
        .or_else(|| env("PGSSLCERT").map(PathBuf::from));
    tls.client_key = tls
        .client_key
        .take()
        .or_else(|| env("PGSSLKEY").map(PathBuf::from));
    if config.get_password().is_none() {
        if let Some(password) = env("PGPASSWORD") {
            config.password(password);
        }
    }
    Ok(())
}

/// `target` from the URL, else `PGTARGETSESSIONATTRS`, else `any`.
///
/// Returns an error naming the variable if it holds an unknown value.
fn target_or_env(
    target: Option<TargetSessionAttrs>,
    env: Env<'_>,
) -> Result<TargetSessionAttrs, String> {
    match (target, env("PGTARGETSESSIONATTRS")) {
        (Some(target), _) => Ok(target),
        (None, Some(value)) => value
            .parse()
            .map_err(|e| format!("PGTARGETSESSIONATTRS: {e}")),
        (None, None) => Ok(TargetSessionAttrs::Any),
    }
}

/// The password for `endpoint` (one of `config`'s hosts) from the password file, if any line
/// matches. Its host field is matched against the host name (else `hostaddr`), a socket
/// directory as libpq does: `localhost` for the default one, else its path.
fn from_passfile(
    config: &tokio_postgres::Config,
    endpoint: &Endpoint,
    env: Env<'_>,
) -> Option<String> {
    let path = env("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|home| PathBuf::from(home).join(".pgpass")))?;
    let text = std::fs::read_to_string(&path).ok()?;
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).ok()?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(path = %path.display(), "password file has group or world access and is ignored (chmod 0600)");
            return None;
        }
    }
    let host = match (&endpoint.host, endpoint.addr) {
        (Some(Host::Tcp(name)), _) => name.clone(),
        (Some(Host::Unix(dir)), _) if dir.as_path() == std::path::Path::new(DEFAULT_SOCKET_DIR) => {
            "localhost".to_owned()
        }
        (Some(Host::Unix(dir)), _) => dir.display().to_string(),
        (None, Some(addr)) => addr.to_string(),
        (None, None) => return None,
    };
    let port = endpoint.port.to_string();
    let user = config.get_user()?;
    let database = config.get_dbname().unwrap_or(user);
    passfile_lookup(&text, [&host, &port, database, user])
}

/// Finds the first line of a password file whose host, port, database and user fields match
/// (`*` matches anything; `\:` and `\\` are escapes).
fn passfile_lookup(text: &str, wanted: [&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_fields(line);
        if fields.len() != 5 {
            continue;
        }
        if fields[..4]
            .iter()
            .zip(wanted)
            .all(|(field, want)| field == "*" || field == want)
        {
            return Some(fields[4].clone());
        }
    }
    None
}

fn split_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields.last_mut().expect("one field").push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().expect("one field").push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(
        url: &str,
        vars: &[(&str, &str)],
    ) -> Result<(tokio_postgres::Config, TlsSettings), String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (rest, mut tls) = crate::source::tls::split_url(url)?;
        let mut config: tokio_postgres::Config = rest.parse().map_err(|e| format!("{e}"))?;
        apply(&mut config, &mut tls, &|name| vars.get(name).cloned())?;
        Ok((config, tls))
    }

    /// A URL whose password holds a character the URL syntax reserves does not parse, and
    /// the URL shown hides the password: the error says what to do about it.
    #[test]
    fn a_url_broken_by_its_password_says_how_to_give_the_password() {
        let parsed = |url: &str| {
            let mut config = PipelineConfig::test_pipeline();
            config.source_url = url.into();
            config.source_config()
        };
        let error = parsed("postgres://relay:p@ss#w/rd:x?@127.0.0.1:5432/shop")
            .unwrap_err()
            .to_string();
        assert!(!error.contains("ss#w"), "the password is shown: {error}");
        for says in ["source_url", "percent-encoded", "source_password"] {
            assert!(error.contains(says), "{says:?} missing: {error}");
        }
        // A URL wrong elsewhere, with a password or without, gets no such advice.
        for url in [
            "postgres://relay@h:notaport/shop",
            "postgres://relay:secret@h:notaport/shop",
        ] {
            let error = parsed(url).unwrap_err().to_string();
            assert!(!error.contains("percent-encoded"), "{error}");
        }
    }

    #[test]
    fn environment_fills_what_the_url_leaves_out() {
        let (config, tls) = resolve(
            "postgres:///",
            &[
                ("PGHOST", "db.internal"),
                ("PGPORT", "6432"),
                ("PGUSER", "relay"),
                ("PGDATABASE", "app"),
                ("PGPASSWORD", "pw"),
                ("PGSSLMODE", "verify-full"),
                ("PGSSLROOTCERT", "/ca.pem"),
            ],
        )
        .unwrap();
        assert!(
            matches!(&config.get_hosts()[0], tokio_postgres::config::Host::Tcp(h) if h == "db.internal")
        );
        assert_eq!(config.get_ports(), &[6432]);
        assert_eq!(
            (config.get_user(), config.get_dbname()),
            (Some("relay"), Some("app"))
        );
        assert_eq!(config.get_password(), Some(&b"pw"[..]));
        assert_eq!(tls.mode, crate::source::tls::SslMode::VerifyFull);
        assert_eq!(tls.root_cert.as_deref(), Some("/ca.pem"));
    }

    /// A `SET` after connecting runs under the database's defaults (a 1 ms `statement_timeout`
    /// cancelled it under load): the settings must be in the start-up packet, after the URL's
    /// own `options` so that they win.
    #[test]
    fn session_settings_travel_in_the_startup_options_after_the_urls() {
        let parsed = |url: &str| {
            let mut config = PipelineConfig::test_pipeline();
            config.source_url = url.into();
            config.source_config()
        };
        let options = |url: &str| parsed(url).unwrap().pg.get_options().map(str::to_owned);
        let plain = options("postgres://relay@localhost/app").unwrap();
        assert_eq!(plain, SESSION_OPTIONS);
        for setting in [
            "statement_timeout=0",
            "lock_timeout=0",
            "idle_session_timeout=0",
            "idle_in_transaction_session_timeout=0",
            "search_path=pg_catalog,pg_temp",
            "bytea_output=hex",
            "extra_float_digits=1",
        ] {
            assert!(
                plain.contains(&format!("-c {setting}")),
                "{setting}: {plain}"
            );
        }
        let given = options("postgres://relay@localhost/app?options=-c%20work_mem%3D8MB").unwrap();
        assert_eq!(given, format!("-c work_mem=8MB {SESSION_OPTIONS}"));
        // An escaped backslash is the URL's; a lone one would swallow the space before ours.
        let escaped = options("postgres://relay@localhost/app?options=-c%20x.y%3Da%5C%5C").unwrap();
        assert!(escaped.starts_with("-c x.y=a\\\\ -c "), "{escaped}");
        let error = parsed("postgres://relay@localhost/app?options=-c%20x.y%3Da%5C").unwrap_err();
        assert!(
            error.to_string().contains("source_url") && error.to_string().contains("backslash"),
            "{error}"
        );
    }

    #[test]
    fn the_url_wins_over_the_environment() {
        let (config, tls) = resolve(
            "postgres://u:secret@h:5433/db?sslmode=disable",
            &[
                ("PGHOST", "other"),
                ("PGPORT", "1"),
                ("PGUSER", "x"),
                ("PGPASSWORD", "y"),
                ("PGSSLMODE", "verify-full"),
            ],
        )
        .unwrap();
        assert!(matches!(&config.get_hosts()[0], tokio_postgres::config::Host::Tcp(h) if h == "h"));
        assert_eq!(
            (config.get_ports(), config.get_user()),
            (&[5433][..], Some("u"))
        );
        assert_eq!(config.get_password(), Some(&b"secret"[..]));
        assert_eq!(tls.mode, crate::source::tls::SslMode::Disable);
    }

    #[test]
    fn bad_values_name_the_variable() {
        assert!(resolve("postgres:///db?user=u", &[("PGPORT", "x")])
            .unwrap_err()
            .contains("PGPORT"));
        assert!(resolve("postgres://u@h/db", &[("PGSSLMODE", "maybe")])
            .unwrap_err()
            .contains("PGSSLMODE"));
        assert!(resolve("postgres://h/db", &[])
            .unwrap_err()
            .contains("no user"));
    }

    #[test]
    fn target_session_attrs_from_the_url_else_the_environment() {
        let target = |url: &str, vars: &[(&str, &str)]| {
            let vars: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let (rest, _, taken) = split(url)?;
            rest.parse::<tokio_postgres::Config>()
                .map_err(|e| e.to_string())?;
            target_or_env(taken.target, &|name| vars.get(name).cloned())
        };
        let url = "postgres://u@a:5432,b:5433/db?target_session_attrs=primary&sslmode=disable";
        assert_eq!(target(url, &[]), Ok(TargetSessionAttrs::Primary));
        assert_eq!(
            target(url, &[("PGTARGETSESSIONATTRS", "standby")]),
            Ok(TargetSessionAttrs::Primary),
            "the URL wins"
        );
        assert_eq!(
            target("host=a,b user=u target_session_attrs=prefer-standby", &[]),
            Ok(TargetSessionAttrs::PreferStandby)
        );
        assert_eq!(
            target(
                "postgres://u@a/db",
                &[("PGTARGETSESSIONATTRS", "read-only")]
            ),
            Ok(TargetSessionAttrs::ReadOnly)
        );
        assert_eq!(
            target("postgres://u@a/db", &[]),
            Ok(TargetSessionAttrs::Any)
        );
        assert!(target("postgres://u@a/db?target_session_attrs=master", &[])
            .unwrap_err()
            .contains("target_session_attrs"));
        assert!(
            target("postgres://u@a/db", &[("PGTARGETSESSIONATTRS", "master")])
                .unwrap_err()
                .contains("PGTARGETSESSIONATTRS")
        );
    }

    #[test]
    fn require_auth_from_the_url_else_the_environment() {
        let parsed = |url: &str| {
            let mut config = PipelineConfig::test_pipeline();
            config.source_url = url.into();
            config.source_config()
        };
        let info = parsed("postgres://u@h/db?require_auth=scram-sha-256&sslmode=verify-full&sslrootcert=%2Fca.pem&channel_binding=require").unwrap();
        assert_eq!(
            info.require_auth.map(|list| list.to_string()).as_deref(),
            Some("scram-sha-256")
        );
        assert_eq!(
            info.pg.get_channel_binding(),
            tokio_postgres::config::ChannelBinding::Require
        );
        let info = parsed("host=h user=u require_auth=!password,!md5").unwrap();
        assert_eq!(
            info.require_auth.map(|list| list.to_string()).as_deref(),
            Some("!password,!md5")
        );
        let error = parsed("postgres://u@h/db?require_auth=password,!md5").unwrap_err();
        assert!(error.to_string().contains("require_auth"), "{error}");
    }

    #[test]
    fn password_file_lines_match_with_wildcards_and_escapes() {
        let file = "# comment\nother:5432:*:relay:wrong\ndb\\:1:*:app:relay:pa\\:ss\\\\word\n*:*:*:*:fallback\n";
        assert_eq!(
            passfile_lookup(file, ["db:1", "5432", "app", "relay"]).as_deref(),
            Some("pa:ss\\word")
        );
        assert_eq!(
            passfile_lookup(file, ["x", "1", "y", "z"]).as_deref(),
            Some("fallback")
        );
        assert_eq!(
            passfile_lookup("h:5432:db:u:pw\n", ["h", "5432", "db", "v"]),
            None
        );
    }

    /// A private password file with `text`; the directory lives as long as it is held.
    fn passfile(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pgpass");
        std::fs::write(&path, text).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let file = path.display().to_string();
        (dir, file)
    }

    /// The password each host of `url` is tried with, given `vars`.
    fn passwords(url: &str, vars: &[(&str, &str)]) -> Vec<Option<String>> {
        let (config, tls) = resolve(url, vars).unwrap();
        let info = ConnInfo {
            pg: config,
            tls,
            target: TargetSessionAttrs::Any,
            require_auth: None,
        };
        let vars: HashMap<&str, &str> = vars.iter().copied().collect();
        let env = |name: &str| vars.get(name).map(|v| v.to_string());
        crate::source::target::endpoints(&info.pg)
            .iter()
            .map(|endpoint| {
                info.config_for_env(endpoint, &env)
                    .get_password()
                    .map(|p| String::from_utf8(p.to_vec()).unwrap())
            })
            .collect()
    }

    #[test]
    fn password_file_is_read_when_private() {
        let (_dir, file) = passfile("h:5432:db:u:from-file\n");
        assert_eq!(
            passwords("postgres://u@h/db", &[("PGPASSFILE", &file)]),
            [Some("from-file".to_owned())]
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            passwords("postgres://u@h/db", &[("PGPASSFILE", &file)]),
            [None],
            "a world-readable password file is ignored"
        );
    }

    #[test]
    fn each_host_of_a_multi_host_url_gets_its_own_password_line() {
        let (_dir, file) = passfile(
            "primary.db:5432:db:u:pw-primary\nstandby.db:5433:db:u:pw-standby\nlocalhost:5432:db:u:pw-socket\n/run/pg:5432:db:u:pw-dir\n",
        );
        let env = [("PGPASSFILE", file.as_str())];
        assert_eq!(
            passwords("postgres://u@primary.db:5432,standby.db:5433/db", &env),
            [Some("pw-primary".to_owned()), Some("pw-standby".to_owned())]
        );
        // Standby first, and a port that matches no line for it.
        assert_eq!(
            passwords("postgres://u@standby.db:5432,primary.db:5432/db", &env),
            [None, Some("pw-primary".to_owned())]
        );
        // The default socket directory is `localhost`, another one its path.
        assert_eq!(
            passwords(
                "postgres://u@%2Fvar%2Frun%2Fpostgresql,%2Frun%2Fpg/db",
                &env
            ),
            [Some("pw-socket".to_owned()), Some("pw-dir".to_owned())]
        );
        // A password in the URL or PGPASSWORD is used for every host.
        assert_eq!(
            passwords("postgres://u:given@primary.db,standby.db:5433/db", &env),
            [Some("given".to_owned()), Some("given".to_owned())]
        );
        assert_eq!(
            passwords(
                "postgres://u@primary.db,standby.db:5433/db",
                &[("PGPASSFILE", &file), ("PGPASSWORD", "env")]
            ),
            [Some("env".to_owned()), Some("env".to_owned())]
        );
    }
}
