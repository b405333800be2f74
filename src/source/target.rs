//! Which server of a multi-host source URL to take: libpq's `target_session_attrs`
//! (PostgreSQL docs, 34.1.2 "Parameter Key Words", and 34.1.1.3 "Specifying Multiple Hosts").
//!
//! The hosts are tried in the order given; one that cannot be reached, or that is not what
//! `target_session_attrs` asks for, is passed over. With `prefer-standby` every host is tried
//! as `standby` first, then again as `any`. A server of PostgreSQL 14 or later reports
//! `in_hot_standby` and `default_transaction_read_only` in ParameterStatus at start-up; an
//! older one would be asked (`SELECT pg_is_in_recovery()`, `SHOW transaction_read_only`), as
//! libpq does, but refuses the relay's sessions at start-up first (their options set
//! `idle_session_timeout`, new in 14: see `conninfo::SESSION_OPTIONS`). Both connections of a pipeline (replication and SQL) choose this way, afresh at every
//! session: after a failover, the next session finds the new primary.
//!
//! This module holds the rules (pure: [`TargetSessionAttrs::check`], [`endpoints`]) and the
//! loop over the hosts ([`select`]), generic over how a connection is opened.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;

use tokio_postgres::config::Host;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, SimpleQueryMessage};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::auth::{AuthGuard, AuthPolicy, GuardedTls};
use super::conninfo::ConnInfo;
use super::replication::{open_stream, within_connect_timeout, Socket};
use super::tls::Verification;
use super::SourceError;

/// libpq's `target_session_attrs`: what a server must be for the relay to keep a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetSessionAttrs {
    /// Any server that accepts the connection (libpq's default).
    #[default]
    Any,
    /// A session that accepts read-write transactions by default: not in hot standby and
    /// `default_transaction_read_only = off`.
    ReadWrite,
    /// A session that does not accept read-write transactions by default.
    ReadOnly,
    /// A server not in hot standby.
    Primary,
    /// A server in hot standby.
    Standby,
    /// A standby if any host is one, else any server.
    PreferStandby,
}

impl TargetSessionAttrs {
    /// The checks to try each host with, in order: `prefer-standby` is `standby`, then `any`.
    pub fn passes(self) -> &'static [TargetSessionAttrs] {
        use TargetSessionAttrs::*;
        match self {
            Any => &[Any],
            ReadWrite => &[ReadWrite],
            ReadOnly => &[ReadOnly],
            Primary => &[Primary],
            Standby => &[Standby],
            PreferStandby => &[Standby, Any],
        }
    }

    /// What must still be asked of a server to decide, given what it reported: `None` when
    /// `state` suffices.
    pub fn question(self, state: &ServerState) -> Option<Question> {
        use TargetSessionAttrs::*;
        match self {
            Any | PreferStandby => None,
            ReadWrite | ReadOnly if state.read_only.is_none() => Some(Question::ReadOnly),
            Primary | Standby if state.hot_standby.is_none() => Some(Question::Recovery),
            _ => None,
        }
    }

    /// Decides whether a server in `state` is what `self` asks for (one pass: not
    /// `prefer-standby`, see [`Self::passes`]).
    ///
    /// Returns an error saying what the server is and what was asked, e.g. `is a standby
    /// (in_hot_standby=on), target_session_attrs=primary`, also when `state` lacks the fact
    /// needed (see [`Self::question`]).
    pub fn check(self, state: &ServerState) -> Result<(), String> {
        use TargetSessionAttrs::*;
        let (fact, wanted, is, is_not) = match self {
            Any | PreferStandby => return Ok(()),
            ReadWrite => (&state.read_only, false, "read-only", "read-write"),
            ReadOnly => (&state.read_only, true, "read-only", "read-write"),
            Primary => (&state.hot_standby, false, "a standby", "a primary"),
            Standby => (&state.hot_standby, true, "a standby", "a primary"),
        };
        match fact {
            Some(fact) if fact.value == wanted => Ok(()),
            Some(fact) => Err(format!(
                "is {} ({}={}), target_session_attrs={self}",
                if fact.value { is } else { is_not },
                fact.source,
                if fact.value { "on" } else { "off" }
            )),
            None => Err(format!(
                "did not say whether it is {is}, target_session_attrs={self}"
            )),
        }
    }
}

impl std::str::FromStr for TargetSessionAttrs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        use TargetSessionAttrs::*;
        Ok(match s {
            "any" => Any,
            "read-write" => ReadWrite,
            "read-only" => ReadOnly,
            "primary" => Primary,
            "standby" => Standby,
            "prefer-standby" => PreferStandby,
            other => return Err(format!(
                "target_session_attrs {other:?} is not one of any, read-write, read-only, primary, standby, prefer-standby"
            )),
        })
    }
}

impl fmt::Display for TargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TargetSessionAttrs::*;
        f.write_str(match self {
            Any => "any",
            ReadWrite => "read-write",
            ReadOnly => "read-only",
            Primary => "primary",
            Standby => "standby",
            PreferStandby => "prefer-standby",
        })
    }
}

/// One thing a server said about itself, and which setting or function said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fact {
    pub value: bool,
    /// `in_hot_standby`, `default_transaction_read_only`, `pg_is_in_recovery()` or
    /// `transaction_read_only`.
    pub source: &'static str,
}

/// What is known of a server: what it reported at start-up, then what it was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerState {
    /// Whether it is in hot standby (recovery).
    pub hot_standby: Option<Fact>,
    /// Whether a new session is read-only by default.
    pub read_only: Option<Fact>,
}

impl ServerState {
    /// The state from the ParameterStatus values of start-up (`param` looks one up by name):
    /// both facts on PostgreSQL 14+, neither before.
    pub fn reported(param: impl Fn(&str) -> Option<String>) -> Self {
        let flag = |name: &'static str| {
            param(name).map(|value| Fact {
                value: value == "on",
                source: name,
            })
        };
        let hot_standby = flag("in_hot_standby");
        // As libpq: a session on a hot standby is read-only whatever the setting says.
        let read_only = match hot_standby {
            Some(fact) if fact.value => Some(fact),
            Some(_) => flag("default_transaction_read_only"),
            None => None,
        };
        ServerState {
            hot_standby,
            read_only,
        }
    }

    /// Records the answer to `question` (the first column of its only row, as text).
    pub fn answer(&mut self, question: Question, text: &str) {
        let value = matches!(text, "t" | "on" | "true");
        match question {
            Question::Recovery => {
                self.hot_standby = Some(Fact {
                    value,
                    source: "pg_is_in_recovery()",
                })
            }
            Question::ReadOnly => {
                self.read_only = Some(Fact {
                    value,
                    source: "transaction_read_only",
                })
            }
        }
    }
}

/// A query for a server that did not report what the check needs (before PostgreSQL 14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Question {
    Recovery,
    ReadOnly,
}

impl Question {
    /// The SQL, valid on an ordinary and on a `replication=database` connection; its answer is
    /// one row with one boolean column.
    pub fn sql(self) -> &'static str {
        match self {
            Question::Recovery => "SELECT pg_catalog.pg_is_in_recovery()",
            Question::ReadOnly => "SHOW transaction_read_only",
        }
    }
}

/// One host of a source URL: `host` and `hostaddr` at the same position, and its port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The name to verify TLS against and to resolve when there is no `addr`.
    pub host: Option<Host>,
    /// libpq's `hostaddr`: the address to connect to.
    pub addr: Option<IpAddr>,
    pub port: u16,
}

impl Endpoint {
    /// The socket file of a Unix-domain host, `None` for TCP.
    pub fn socket_path(&self) -> Option<PathBuf> {
        match &self.host {
            Some(Host::Unix(dir)) => Some(dir.join(format!(".s.PGSQL.{}", self.port))),
            _ => None,
        }
    }

    /// The name TLS verifies for a TCP host: the host name, else the address itself.
    pub fn tls_name(&self) -> String {
        match &self.host {
            Some(Host::Tcp(name)) => name.clone(),
            _ => self.addr.map(|a| a.to_string()).unwrap_or_default(),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = self.socket_path() {
            return write!(f, "{}", path.display());
        }
        match (&self.host, self.addr) {
            (Some(Host::Tcp(name)), Some(addr)) if *name != addr.to_string() => {
                write!(f, "{name} ({addr}):{}", self.port)
            }
            (Some(Host::Tcp(name)), _) => write!(f, "{name}:{}", self.port),
            (_, Some(IpAddr::V6(addr))) => write!(f, "[{addr}]:{}", self.port),
            (_, addr) => write!(
                f,
                "{}:{}",
                addr.map(|a| a.to_string()).unwrap_or_default(),
                self.port
            ),
        }
    }
}

/// The hosts of `config` in order, as libpq pairs them: `host` and `hostaddr` by position
/// (either may be given alone), one port for all or one per host, 5432 by default.
pub fn endpoints(config: &tokio_postgres::Config) -> Vec<Endpoint> {
    let (hosts, addrs, ports) = (
        config.get_hosts(),
        config.get_hostaddrs(),
        config.get_ports(),
    );
    (0..hosts.len().max(addrs.len()))
        .map(|i| Endpoint {
            host: hosts.get(i).cloned(),
            addr: addrs.get(i).copied(),
            port: ports.get(i).or(ports.first()).copied().unwrap_or(5432),
        })
        .collect()
}

/// No host of the source URL could be used: each one with why it was passed over. Transient:
/// during a failover no server is the primary for a while.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no host of the source url fits: {}", .passed_over.iter().map(|(host, why)| format!("{host} {why}")).collect::<Vec<_>>().join("; "))]
pub struct NoHostFits {
    /// `(host, reason)`, e.g. `("127.0.0.1:5433", "is a standby (in_hot_standby=on),
    /// target_session_attrs=primary")` or `("127.0.0.1:5432", "failed: connection refused")`.
    pub passed_over: Vec<(String, String)>,
    /// Some host was reached but did not fit (a standby where a primary is wanted): a
    /// failover under way rather than a database that is down.
    pub unfit: bool,
}

/// A connection that has started up, as [`select`] judges it.
pub trait Candidate: Send {
    /// What the server reported at start-up (see [`ServerState::reported`]).
    fn reported(&self) -> ServerState;

    /// Runs `sql` and returns the first column of its first row as text.
    fn ask(
        &mut self,
        sql: &'static str,
    ) -> impl Future<Output = Result<String, SourceError>> + Send;
}

/// How [`select`] opens a connection to one host.
pub trait Connector: Sync {
    type Connection: Candidate;

    /// Connects to `endpoint` and completes start-up (authentication included).
    fn connect(
        &self,
        endpoint: Endpoint,
    ) -> impl Future<Output = Result<Self::Connection, SourceError>> + Send;
}

/// Connects to the first host of `endpoints` that fits `target` (see the module doc), trying
/// each with `connector`.
///
/// A host that fails with a transient error (unreachable, shutting down, starting up) or does
/// not fit is passed over. Returns the first error that retrying cannot fix (authentication,
/// TLS) at once; a host's transient error when it was the only host tried and nothing was
/// passed over for not fitting; else [`SourceError::NoHostFits`] naming every host.
pub async fn select<K: Connector>(
    target: TargetSessionAttrs,
    endpoints: &[Endpoint],
    connector: &K,
) -> Result<K::Connection, SourceError> {
    if endpoints.is_empty() {
        return Err(SourceError::Config("source url names no host".into()));
    }
    let mut passed_over = Vec::new();
    let mut unfit = false;
    let mut last_error = None;
    for &pass in target.passes() {
        for endpoint in endpoints {
            match try_host(connector, endpoint, pass).await {
                Ok(connection) => return Ok(connection),
                Err(PassedOver::Failed(error)) if !error.is_transient() => return Err(error),
                Err(PassedOver::Failed(error)) => {
                    let why = format!("failed: {}", crate::error::chain(&error));
                    passed_over.push((endpoint.to_string(), why));
                    last_error = Some(error);
                }
                Err(PassedOver::Unfit(why)) => {
                    unfit = true;
                    passed_over.push((endpoint.to_string(), why));
                }
            }
        }
    }
    match last_error {
        Some(error) if passed_over.len() == 1 => Err(error),
        _ => Err(SourceError::NoHostFits(NoHostFits { passed_over, unfit })),
    }
}

/// Why [`try_host`] did not keep a host.
enum PassedOver {
    Failed(SourceError),
    Unfit(String),
}

/// Connects to `endpoint` and keeps the connection if the server fits `pass`.
async fn try_host<K: Connector>(
    connector: &K,
    endpoint: &Endpoint,
    pass: TargetSessionAttrs,
) -> Result<K::Connection, PassedOver> {
    let mut candidate = connector
        .connect(endpoint.clone())
        .await
        .map_err(PassedOver::Failed)?;
    let mut state = candidate.reported();
    if let Some(question) = pass.question(&state) {
        let text = candidate
            .ask(question.sql())
            .await
            .map_err(PassedOver::Failed)?;
        state.answer(question, &text);
    }
    pass.check(&state).map_err(PassedOver::Unfit)?;
    Ok(candidate)
}

/// The IO half of an SQL connection opened by [`connect_sql`]: poll it (or spawn it) for the
/// client's queries to make progress; its `poll_message` yields notifications.
pub type SqlConnectionIo = tokio_postgres::Connection<
    Box<dyn Socket>,
    AuthGuard<<MakeRustlsConnect as MakeTlsConnect<Box<dyn Socket>>>::Stream>,
>;

/// Opens an ordinary SQL connection (tokio-postgres) to the first host of `info` that fits
/// its `target_session_attrs`, with TLS as `info.tls` says (never over a Unix socket).
/// `connect_timeout` (default 30 s) bounds each host's attempt.
///
/// Returns an error as [`select`] does, or if TLS cannot be set up.
pub async fn connect_sql(info: &ConnInfo) -> Result<(Client, SqlConnectionIo), SourceError> {
    let connector = SqlConnector {
        info,
        tls: MakeRustlsConnect::new(info.tls.client_config().map_err(SourceError::Tls)?),
    };
    let chosen = select(info.target, &endpoints(&info.pg), &connector).await?;
    Ok((chosen.client, chosen.connection))
}

/// Like [`connect_sql`], to `server` alone (the host a replication connection of `info`
/// reached: [`super::replication::ReplicationClient::server`]), whatever it is now: the
/// replication connection chose it by `target_session_attrs` already.
///
/// Returns an error if that server cannot be reached or refuses, or TLS cannot be set up.
pub async fn connect_sql_to(
    info: &ConnInfo,
    server: &Endpoint,
) -> Result<(Client, SqlConnectionIo), SourceError> {
    let connector = SqlConnector {
        info,
        tls: MakeRustlsConnect::new(info.tls.client_config().map_err(SourceError::Tls)?),
    };
    let chosen = select(
        TargetSessionAttrs::Any,
        std::slice::from_ref(server),
        &connector,
    )
    .await?;
    Ok((chosen.client, chosen.connection))
}

struct SqlConnector<'a> {
    info: &'a ConnInfo,
    tls: MakeRustlsConnect,
}

impl Connector for SqlConnector<'_> {
    type Connection = SqlCandidate;

    async fn connect(&self, endpoint: Endpoint) -> Result<SqlCandidate, SourceError> {
        let attempt = async {
            let mut config = self.info.config_for(&endpoint);
            if endpoint.socket_path().is_some() {
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
            }
            let stream = open_stream(&config, &endpoint).await?;
            // The server's first request is checked in plaintext (a Unix socket, or `prefer`
            // and a server without TLS) or under TLS, whichever the session is.
            let policy = |trusted_channel| AuthPolicy {
                require_auth: self.info.require_auth.clone(),
                trusted_channel,
                channel_binding_required: config.get_channel_binding()
                    == tokio_postgres::config::ChannelBinding::Require,
                server: endpoint.to_string(),
            };
            let ssl_request = config.get_ssl_mode() != tokio_postgres::config::SslMode::Disable;
            let stream: Box<dyn Socket> = Box::new(AuthGuard::new(
                stream,
                policy(endpoint.socket_path().is_some()),
                ssl_request,
            ));
            let tls = GuardedTls {
                inner: MakeTlsConnect::<Box<dyn Socket + 'static>>::make_tls_connect(
                    &mut self.tls.clone(),
                    &endpoint.tls_name(),
                )
                .unwrap_or_else(|never| match never {}),
                policy: policy(self.info.tls.verification() >= Verification::Chain),
            };
            // Boxed as `dyn Future + Send`: rustc cannot prove the unboxed future `Send` for
            // every lifetime (its `'static` bound on the stream gets lost in the proof).
            let handshake: Pin<Box<dyn Future<Output = _> + Send + '_>> =
                Box::pin(config.connect_raw(stream, tls));
            let (client, connection) = handshake.await?;
            Ok(SqlCandidate { client, connection })
        };
        within_connect_timeout(&self.info.pg, attempt).await
    }
}

struct SqlCandidate {
    client: Client,
    connection: SqlConnectionIo,
}

impl Candidate for SqlCandidate {
    fn reported(&self) -> ServerState {
        ServerState::reported(|name| self.connection.parameter(name).map(str::to_owned))
    }

    async fn ask(&mut self, sql: &'static str) -> Result<String, SourceError> {
        let SqlCandidate { client, connection } = self;
        let query = client.simple_query(sql);
        tokio::pin!(query);
        // The connection is not spawned yet: drive it while the query runs.
        let drive = futures::future::poll_fn(|cx| loop {
            match std::task::ready!(connection.poll_message(cx)) {
                Some(Ok(_)) => {}
                Some(Err(e)) => return std::task::Poll::Ready(SourceError::Sql(e)),
                None => return std::task::Poll::Ready(SourceError::Closed),
            }
        });
        let messages = tokio::select! {
            messages = &mut query => messages?,
            broken = drive => return Err(broken),
        };
        messages
            .into_iter()
            .find_map(|message| match message {
                SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
                _ => None,
            })
            .flatten()
            .ok_or_else(|| SourceError::Protocol(format!("{sql} returned no value")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn reported(params: &[(&str, &str)]) -> ServerState {
        let params: HashMap<_, _> = params.iter().copied().collect();
        ServerState::reported(|name| params.get(name).map(|v| v.to_string()))
    }

    const PRIMARY: &[(&str, &str)] = &[
        ("in_hot_standby", "off"),
        ("default_transaction_read_only", "off"),
    ];
    const STANDBY: &[(&str, &str)] = &[
        ("in_hot_standby", "on"),
        ("default_transaction_read_only", "off"),
    ];
    const READ_ONLY_PRIMARY: &[(&str, &str)] = &[
        ("in_hot_standby", "off"),
        ("default_transaction_read_only", "on"),
    ];

    #[test]
    fn parses_every_libpq_value_and_names_the_parameter_otherwise() {
        for text in [
            "any",
            "read-write",
            "read-only",
            "primary",
            "standby",
            "prefer-standby",
        ] {
            let target: TargetSessionAttrs = text.parse().unwrap();
            assert_eq!(target.to_string(), text);
        }
        assert_eq!(TargetSessionAttrs::default(), TargetSessionAttrs::Any);
        let error = "master".parse::<TargetSessionAttrs>().unwrap_err();
        assert!(
            error.contains("target_session_attrs") && error.contains("master"),
            "{error}"
        );
    }

    #[test]
    fn decides_per_host_from_what_a_14_plus_server_reports() {
        use TargetSessionAttrs::*;
        let cases = [
            (Any, STANDBY, true),
            (Primary, PRIMARY, true),
            (Primary, STANDBY, false),
            (Primary, READ_ONLY_PRIMARY, true),
            (Standby, STANDBY, true),
            (Standby, PRIMARY, false),
            (ReadWrite, PRIMARY, true),
            (ReadWrite, STANDBY, false),
            (ReadWrite, READ_ONLY_PRIMARY, false),
            (ReadOnly, READ_ONLY_PRIMARY, true),
            (ReadOnly, STANDBY, true),
            (ReadOnly, PRIMARY, false),
        ];
        for (target, params, fits) in cases {
            let state = reported(params);
            assert_eq!(target.question(&state), None, "{target} {params:?}");
            assert_eq!(target.check(&state).is_ok(), fits, "{target} {params:?}");
        }
        assert_eq!(
            Primary.check(&reported(STANDBY)).unwrap_err(),
            "is a standby (in_hot_standby=on), target_session_attrs=primary"
        );
        assert_eq!(
            ReadWrite.check(&reported(READ_ONLY_PRIMARY)).unwrap_err(),
            "is read-only (default_transaction_read_only=on), target_session_attrs=read-write"
        );
        assert_eq!(
            Standby.check(&reported(PRIMARY)).unwrap_err(),
            "is a primary (in_hot_standby=off), target_session_attrs=standby"
        );
    }

    #[test]
    fn asks_an_older_server_what_it_did_not_report() {
        use TargetSessionAttrs::*;
        let silent = ServerState::default();
        assert_eq!(Any.question(&silent), None);
        assert_eq!(Primary.question(&silent), Some(Question::Recovery));
        assert_eq!(Standby.question(&silent), Some(Question::Recovery));
        assert_eq!(ReadWrite.question(&silent), Some(Question::ReadOnly));
        assert!(Primary.check(&silent).is_err(), "no fact, no match");
        let mut state = silent;
        state.answer(Question::Recovery, "t");
        assert_eq!(
            Primary.check(&state).unwrap_err(),
            "is a standby (pg_is_in_recovery()=on), target_session_attrs=primary"
        );
        let mut state = silent;
        state.answer(Question::ReadOnly, "off");
        assert!(ReadWrite.check(&state).is_ok());
    }

    #[test]
    fn prefer_standby_tries_for_a_standby_first() {
        assert_eq!(
            TargetSessionAttrs::PreferStandby.passes(),
            &[TargetSessionAttrs::Standby, TargetSessionAttrs::Any]
        );
        assert_eq!(
            TargetSessionAttrs::Primary.passes(),
            &[TargetSessionAttrs::Primary]
        );
    }

    #[test]
    fn pairs_hosts_addresses_and_ports_as_libpq() {
        let config: tokio_postgres::Config = "postgres://u@a:5433,b:5434/db".parse().unwrap();
        let hosts: Vec<String> = endpoints(&config).iter().map(ToString::to_string).collect();
        assert_eq!(hosts, ["a:5433", "b:5434"]);
        let config: tokio_postgres::Config = "host=a,b hostaddr=10.0.0.1,10.0.0.2 port=6000 user=u"
            .parse()
            .unwrap();
        let hosts: Vec<String> = endpoints(&config).iter().map(ToString::to_string).collect();
        assert_eq!(hosts, ["a (10.0.0.1):6000", "b (10.0.0.2):6000"]);
        assert_eq!(endpoints(&config)[1].tls_name(), "b");
        let config: tokio_postgres::Config = "host=/run/pg user=u".parse().unwrap();
        assert_eq!(endpoints(&config)[0].to_string(), "/run/pg/.s.PGSQL.5432");
    }

    /// Fake hosts 127.0.0.1:5432.. for [`select`]: each reports `params` (and answers
    /// questions with `answer`), or fails with `error` when `params` is `None`.
    struct FakeHosts {
        servers: Vec<Option<&'static [(&'static str, &'static str)]>>,
        answer: fn(u16) -> &'static str,
        error: fn() -> SourceError,
    }

    struct Fake {
        state: ServerState,
        answer: &'static str,
        port: u16,
    }

    impl Candidate for Fake {
        fn reported(&self) -> ServerState {
            self.state
        }

        async fn ask(&mut self, _sql: &'static str) -> Result<String, SourceError> {
            Ok(self.answer.to_owned())
        }
    }

    impl Connector for FakeHosts {
        type Connection = Fake;

        async fn connect(&self, endpoint: Endpoint) -> Result<Fake, SourceError> {
            match self.servers[usize::from(endpoint.port - 5432)] {
                Some(params) => Ok(Fake {
                    state: reported(params),
                    answer: (self.answer)(endpoint.port),
                    port: endpoint.port,
                }),
                None => Err((self.error)()),
            }
        }
    }

    fn refused() -> SourceError {
        SourceError::Io(std::io::ErrorKind::ConnectionRefused.into())
    }

    /// Runs [`select`] over hosts 5432.. whose servers are `servers[i]` (`None`: refuses).
    fn run_select(
        target: TargetSessionAttrs,
        servers: Vec<Option<&'static [(&'static str, &'static str)]>>,
    ) -> Result<u16, SourceError> {
        let hosts = FakeHosts {
            servers,
            answer: |_| "f",
            error: refused,
        };
        run(target, &hosts)
    }

    fn run(target: TargetSessionAttrs, hosts: &FakeHosts) -> Result<u16, SourceError> {
        let endpoints: Vec<Endpoint> = (0..hosts.servers.len() as u16)
            .map(|i| Endpoint {
                host: Some(Host::Tcp("127.0.0.1".into())),
                addr: None,
                port: 5432 + i,
            })
            .collect();
        futures::executor::block_on(select(target, &endpoints, hosts)).map(|fake| fake.port)
    }

    #[test]
    fn passes_over_hosts_that_do_not_fit_in_order() {
        use TargetSessionAttrs::*;
        assert_eq!(
            run_select(Primary, vec![Some(STANDBY), Some(PRIMARY)]).unwrap(),
            5433
        );
        assert_eq!(
            run_select(Primary, vec![None, Some(PRIMARY)]).unwrap(),
            5433
        );
        assert_eq!(
            run_select(Any, vec![Some(STANDBY), Some(PRIMARY)]).unwrap(),
            5432
        );
        assert_eq!(
            run_select(PreferStandby, vec![Some(PRIMARY), Some(STANDBY)]).unwrap(),
            5433
        );
        assert_eq!(
            run_select(PreferStandby, vec![None, Some(PRIMARY)]).unwrap(),
            5433,
            "no standby: any host"
        );
    }

    #[test]
    fn no_fitting_host_is_a_transient_error_naming_each_host() {
        use TargetSessionAttrs::*;
        let error = run_select(Primary, vec![Some(STANDBY), None]).unwrap_err();
        assert!(error.is_transient(), "{error}");
        let text = error.to_string();
        assert!(
            text.contains(
                "127.0.0.1:5432 is a standby (in_hot_standby=on), target_session_attrs=primary"
            ),
            "{text}"
        );
        assert!(text.contains("127.0.0.1:5433 failed: "), "{text}");
        // One unreachable host: its own error, as before target_session_attrs.
        let error = run_select(Any, vec![None]).unwrap_err();
        assert!(matches!(error, SourceError::Io(_)), "{error}");
    }

    #[test]
    fn an_error_retrying_cannot_fix_ends_the_search() {
        let hosts = FakeHosts {
            servers: vec![None, Some(PRIMARY)],
            answer: |_| "f",
            error: || SourceError::Auth("wrong password".into()),
        };
        let result = run(TargetSessionAttrs::Primary, &hosts);
        assert!(matches!(result, Err(SourceError::Auth(_))), "{result:?}");
    }

    #[test]
    fn asks_a_server_that_reports_nothing() {
        const SILENT: &[(&str, &str)] = &[];
        let hosts = FakeHosts {
            servers: vec![Some(SILENT), Some(SILENT)],
            answer: |port| if port == 5432 { "t" } else { "f" },
            error: refused,
        };
        assert_eq!(run(TargetSessionAttrs::Primary, &hosts).unwrap(), 5433);
        assert_eq!(run(TargetSessionAttrs::Standby, &hosts).unwrap(), 5432);
    }
}
