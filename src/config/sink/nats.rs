//! `kind = "nats"`: the NATS JetStream sink's settings, its server list and the rules of a
//! subject it publishes to.

use std::time::Duration;

use percent_encoding::percent_decode_str;
use serde::{Deserialize, Serialize};

use super::{optional_secret, secret, Secret, DEFAULT_DELIVERY_TIMEOUT_MS};

/// Records published concurrently by a NATS sink (different keys: one key's records go one at
/// a time). Each waits for its PubAck, so this many round trips overlap on the connection.
pub const DEFAULT_NATS_MAX_CONCURRENCY: usize = 256;

/// The longest subject the relay publishes to: a publish is one protocol line of at most
/// `max_control_line` (4096 bytes by default) that also holds the reply inbox and two sizes
/// (under 128 bytes).
pub const MAX_SUBJECT_LEN: usize = 3968;

/// `kind = "nats"`: NATS JetStream.
///
/// Each record is one JetStream publish to the routed destination as its subject
/// (`<aggregate_type>.events` by default), with the record's headers as NATS headers and
/// `Nats-Msg-Id` = the event id; the stream's PubAck is the acknowledgement (stored by the
/// stream, and replicated if it has replicas). A stream covering the subjects must exist:
/// creating it is the operator's.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// `nats://[user:password@]host[:port]`, `tls://...` for TLS (the system's trusted roots),
    /// several separated by commas (a cluster's seed servers); `${NAME}` references are
    /// resolved from the environment. A user without a password is a token, unless
    /// `password` is set.
    pub url: NatsUrl,
    /// A file holding `url` (a mounted secret), instead of `url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub url_file: Option<String>,
    /// The password of the user the URL names (`nats://user@host`), taken as written (no
    /// percent-encoding); `${NAME}` references are resolved.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub password: Option<Secret>,
    /// A file holding `password` (a mounted secret), instead of `password`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub password_file: Option<String>,
    /// An authentication token; `${NAME}` references are resolved.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub token: Option<Secret>,
    /// A file holding `token`, instead of `token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub token_file: Option<String>,
    /// A user nkey seed (`SU...`); `${NAME}` references are resolved.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub nkey: Option<Secret>,
    /// A file holding `nkey`, instead of `nkey`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub nkey_file: Option<String>,
    /// A `.creds` file (user JWT and nkey seed, as `nsc` writes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(!skip_serializing_if)]
    pub credentials_file: Option<String>,
    /// Records in flight at once, each of a different key (a key's records go one at a time).
    pub max_concurrency: usize,
    /// Milliseconds a record is retried for, from its first attempt (time queued behind its
    /// key's earlier records does not count); past it the record fails and the session restarts.
    pub delivery_timeout_ms: u64,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: NatsUrl::default(),
            url_file: None,
            password: None,
            password_file: None,
            token: None,
            token_file: None,
            nkey: None,
            nkey_file: None,
            credentials_file: None,
            max_concurrency: DEFAULT_NATS_MAX_CONCURRENCY,
            delivery_timeout_ms: DEFAULT_DELIVERY_TIMEOUT_MS,
        }
    }
}

/// A NATS server list; `Debug` hides passwords and tokens (a user without a password is a
/// token).
#[derive(Clone, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(transparent)]
pub struct NatsUrl(pub String);

impl std::ops::Deref for NatsUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&shown(self), f)
    }
}

/// The servers of `url` as [`NatsServer::shown`], comma separated (`***` if it does not parse).
fn shown(url: &str) -> String {
    match servers(url) {
        Ok(servers) => servers
            .iter()
            .map(NatsServer::shown)
            .collect::<Vec<_>>()
            .join(","),
        Err(_) => "***".into(),
    }
}

/// The servers of a `url` list (see [`NatsConfig::servers`]).
fn servers(url: &str) -> Result<Vec<NatsServer>, String> {
    let servers: Vec<NatsServer> = url
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_server)
        .collect::<Result<_, _>>()?;
    if servers.is_empty() {
        return Err("must name at least one server (nats://host:port)".into());
    }
    Ok(servers)
}

/// One server of `url`, its credentials taken out.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsServer {
    /// `nats://host:port` or `tls://host:port`, without user or password.
    pub address: String,
    /// The URL's user (percent-decoded), a token when `password` is `None`.
    pub user: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for NatsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl NatsServer {
    /// The address with its user, but never a password or token: for logs and errors.
    pub fn shown(&self) -> String {
        let Some((scheme, rest)) = self.address.split_once("://") else {
            return self.address.clone();
        };
        match (&self.user, &self.password) {
            (Some(user), Some(_)) => format!("{scheme}://{user}:***@{rest}"),
            (Some(_), None) => format!("{scheme}://***@{rest}"),
            _ => self.address.clone(),
        }
    }
}

impl NatsConfig {
    pub fn delivery_timeout(&self) -> Duration {
        Duration::from_millis(self.delivery_timeout_ms)
    }

    /// The servers of `url`, in order.
    ///
    /// Returns an error naming the server if one has a scheme other than `nats` or `tls`, no
    /// host, or a path, or if `url` is empty.
    pub fn servers(&self) -> Result<Vec<NatsServer>, String> {
        servers(&self.url)
    }

    /// The servers as [`NatsServer::shown`], comma separated: for logs and errors.
    pub fn shown(&self) -> String {
        shown(&self.url)
    }

    /// Resolves `url`, `token` and `nkey` (from the environment or their `*_file`) and checks
    /// the servers and that one way of authenticating at most is set. Adds each problem with
    /// its field under `sink.`.
    pub(super) fn resolve(
        &mut self,
        expand: &dyn Fn(&str) -> Result<String, String>,
        problems: &mut Vec<(String, String)>,
    ) {
        if let Some(url) = secret("url", &self.url, self.url_file.take(), expand, problems) {
            self.url = NatsUrl(url);
            match self.servers() {
                Ok(servers) => {
                    if servers.iter().any(|s| s.user.is_some())
                        && servers.iter().any(|s| s.user.is_none())
                    {
                        problems.push((
                            "sink.url".into(),
                            "give the user in every server of the list or in none".into(),
                        ));
                    }
                }
                Err(e) => problems.push(("sink.url".into(), e)),
            }
        }
        let (password, password_file) = (self.password.take(), self.password_file.take());
        self.password = optional_secret(
            "password",
            password.as_deref(),
            password_file,
            expand,
            problems,
        );
        if self.password.is_some() {
            match self.servers() {
                Ok(servers) if servers.iter().any(|s| s.password.is_some()) => problems.push((
                    "sink.password".into(),
                    "the URL has a password too: give it in one place".into(),
                )),
                Ok(servers) if servers.iter().all(|s| s.user.is_none()) => problems.push((
                    "sink.password".into(),
                    "name the user in the URL (nats://user@host:4222)".into(),
                )),
                _ => {}
            }
        }
        let (token, token_file) = (self.token.take(), self.token_file.take());
        self.token = optional_secret("token", token.as_deref(), token_file, expand, problems);
        let (nkey, nkey_file) = (self.nkey.take(), self.nkey_file.take());
        self.nkey = optional_secret("nkey", nkey.as_deref(), nkey_file, expand, problems);
        if let Some(path) = &self.credentials_file {
            match std::fs::metadata(path) {
                Ok(_) => crate::config::secret_file::warn_if_exposed(
                    std::path::Path::new(path),
                    "sink.credentials_file",
                ),
                Err(e) => problems.push((
                    "sink.credentials_file".into(),
                    format!("cannot read {path:?}: {e}"),
                )),
            }
        }
        let in_url = self
            .servers()
            .is_ok_and(|s| s.iter().any(|s| s.user.is_some()));
        let ways = [
            ("a user in url", in_url),
            ("token", self.token.is_some()),
            ("nkey", self.nkey.is_some()),
            ("credentials_file", self.credentials_file.is_some()),
        ];
        let set: Vec<&str> = ways
            .iter()
            .filter(|(_, set)| *set)
            .map(|(name, _)| *name)
            .collect();
        if set.len() > 1 {
            problems.push((
                "sink.token".into(),
                format!("set one way of authenticating, not {}", set.join(" and ")),
            ));
        }
    }
}

/// One server of a `url` list.
fn parse_server(text: &str) -> Result<NatsServer, String> {
    let (scheme, rest) = text.split_once("://").unwrap_or(("nats", text));
    if scheme != "nats" && scheme != "tls" {
        // A lone user is a token in NATS: all of the user info goes.
        let host = rest.rfind('@').map_or(rest, |at| &rest[at + 1..]);
        let shown = if host.len() < rest.len() {
            format!("{scheme}://***@{host}")
        } else {
            text.to_owned()
        };
        return Err(format!(
            "server {shown:?}: scheme {scheme:?} is not nats:// or tls://"
        ));
    }
    let (user_info, host) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let host = host.strip_suffix('/').unwrap_or(host);
    if host.is_empty() || host.contains(['/', '?', '#']) {
        return Err(format!("server {scheme}://{host}: give host[:port] only"));
    }
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let (user, password) =
        match user_info.map(|u| u.split_once(':').map_or((u, None), |(u, p)| (u, Some(p)))) {
            None => (None, None),
            Some((user, password)) => (Some(decode(user)), password.map(decode)),
        };
    Ok(NatsServer {
        address: format!("{scheme}://{host}"),
        user,
        password,
    })
}

/// Checks a subject the relay publishes to: not empty, at most [`MAX_SUBJECT_LEN`] bytes, no
/// whitespace or control characters, no empty token (a leading, trailing or doubled `.`), no
/// `*` or `>` (wildcards: a publish subject names one subject), not starting with `$`
/// (reserved for the system: `$JS`, `$SYS`, `$KV`).
///
/// Returns the rule `subject` breaks.
pub fn validate_subject(subject: &str) -> Result<(), &'static str> {
    if subject.is_empty() {
        return Err("empty");
    }
    if subject.len() > MAX_SUBJECT_LEN {
        return Err("longer than 3968 bytes");
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("whitespace and control characters are not allowed");
    }
    if subject.split('.').any(str::is_empty) {
        return Err("a token is empty (a leading, trailing or doubled '.')");
    }
    if subject.contains(['*', '>']) {
        return Err("'*' and '>' are wildcards, not allowed in a subject to publish to");
    }
    if subject.starts_with('$') {
        return Err("subjects starting with '$' are reserved for the system ($JS, $SYS, ...)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SinkConfig;

    fn resolve(config: NatsConfig) -> (NatsConfig, Vec<(String, String)>) {
        let mut sink = SinkConfig::Nats(config);
        let expand = |v: &str| Ok::<_, String>(v.replace("${T}", "tok-from-env"));
        let problems = sink.resolve(&expand);
        let SinkConfig::Nats(nats) = sink else {
            unreachable!()
        };
        (nats, problems)
    }

    #[test]
    fn a_sink_table_of_kind_nats_reads_its_settings() {
        #[derive(Deserialize)]
        struct Holder {
            sink: SinkConfig,
        }
        let h: Holder = toml::from_str(
            "[sink]\nkind = \"nats\"\nurl = \"tls://n1:4222\"\ncredentials_file = \"/run/relay.creds\"\nmax_concurrency = 8",
        )
        .unwrap();
        let SinkConfig::Nats(nats) = h.sink else {
            panic!("not nats")
        };
        assert_eq!(&*nats.url, "tls://n1:4222");
        assert_eq!(nats.credentials_file.as_deref(), Some("/run/relay.creds"));
        assert_eq!(nats.max_concurrency, 8);
        assert_eq!(nats.delivery_timeout_ms, DEFAULT_DELIVERY_TIMEOUT_MS);
        let e = toml::from_str::<Holder>("[sink]\nkind = \"nats\"\nuser = \"x\"")
            .err()
            .unwrap();
        assert!(e.to_string().contains("user"), "{e}");
    }

    #[test]
    fn a_password_beside_the_url_is_the_url_users_and_taken_as_written() {
        let (nats, problems) = resolve(NatsConfig {
            url: NatsUrl("nats://relay@n1:4222".into()),
            password: Some(Secret("p@ss#w/rd".into())),
            ..NatsConfig::default()
        });
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(nats.password.as_deref(), Some("p@ss#w/rd"));
        let (_, problems) = resolve(NatsConfig {
            url: NatsUrl("nats://n1:4222".into()),
            password: Some(Secret("pw".into())),
            ..NatsConfig::default()
        });
        assert!(
            format!("{problems:?}").contains("name the user in the URL"),
            "{problems:?}"
        );
        let (_, problems) = resolve(NatsConfig {
            url: NatsUrl("nats://relay:other@n1:4222".into()),
            password: Some(Secret("pw".into())),
            ..NatsConfig::default()
        });
        assert!(
            format!("{problems:?}").contains("give it in one place"),
            "{problems:?}"
        );
    }

    /// A lone user in a NATS URL is a token: a URL refused for its scheme is shown without it.
    #[test]
    fn a_refused_url_does_not_show_its_token() {
        let (_, problems) = resolve(NatsConfig {
            url: NatsUrl("wss://s3cret@n1:443".into()),
            ..NatsConfig::default()
        });
        let text = format!("{problems:?}");
        assert!(text.contains("is not nats:// or tls://"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
    }

    #[test]
    fn subjects_follow_the_nats_rules() {
        for good in [
            "Order.events",
            "a",
            "a-b_c.D9",
            "ünïcode.events",
            "x:y.events",
        ] {
            assert_eq!(validate_subject(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "a b",
            "a\tb",
            "a\nb",
            ".a",
            "a.",
            "a..b",
            "a.*.b",
            "a.>",
            "a*",
            ">",
            "$JS.API.x",
            "a\u{0}b",
        ] {
            assert!(validate_subject(bad).is_err(), "{bad:?} passed");
        }
        assert!(validate_subject(&"a".repeat(MAX_SUBJECT_LEN)).is_ok());
        assert!(validate_subject(&"a".repeat(MAX_SUBJECT_LEN + 1)).is_err());
    }

    #[test]
    fn the_url_gives_servers_without_their_credentials() {
        let config = NatsConfig {
            url: NatsUrl("nats://relay:p%40ss@n1:4222, tls://relay:p%40ss@n2".into()),
            ..NatsConfig::default()
        };
        let servers = config.servers().unwrap();
        assert_eq!(servers[0].address, "nats://n1:4222");
        assert_eq!(servers[1].address, "tls://n2");
        assert_eq!(servers[0].user.as_deref(), Some("relay"));
        assert_eq!(servers[0].password.as_deref(), Some("p@ss"));
        assert_eq!(
            config.shown(),
            "nats://relay:***@n1:4222,tls://relay:***@n2"
        );
        assert!(!format!("{config:?}").contains("p%40ss"), "{config:?}");

        let token = NatsConfig {
            url: NatsUrl("s3cret@n1".into()),
            ..NatsConfig::default()
        };
        assert_eq!(token.servers().unwrap()[0].address, "nats://n1");
        assert_eq!(token.shown(), "nats://***@n1");
        assert!(!format!("{token:?}").contains("s3cret"), "{token:?}");

        for bad in ["", "http://n1", "nats://", "nats://n1/path"] {
            let config = NatsConfig {
                url: NatsUrl(bad.into()),
                ..NatsConfig::default()
            };
            assert!(config.servers().is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn secrets_come_from_files_or_the_environment_and_one_way_at_most() {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("seed");
        std::fs::write(&seed, "SUAEXAMPLE\n").unwrap();
        let (nats, problems) = resolve(NatsConfig {
            url: NatsUrl("nats://n1".into()),
            nkey_file: Some(seed.display().to_string()),
            ..NatsConfig::default()
        });
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(nats.nkey.as_deref(), Some("SUAEXAMPLE"));
        assert!(!format!("{nats:?}").contains("SUAEXAMPLE"), "{nats:?}");

        let (nats, problems) = resolve(NatsConfig {
            url: NatsUrl("nats://n1".into()),
            token: Some(Secret("${T}".into())),
            ..NatsConfig::default()
        });
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(nats.token.as_deref(), Some("tok-from-env"));

        let (_, problems) = resolve(NatsConfig {
            url: NatsUrl("nats://u:p@n1".into()),
            token: Some(Secret("t".into())),
            ..NatsConfig::default()
        });
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "sink.token");
        assert!(
            problems[0].1.contains("a user in url and token"),
            "{problems:?}"
        );

        let (_, problems) = resolve(NatsConfig {
            url: NatsUrl("nats://n1".into()),
            credentials_file: Some(dir.path().join("missing.creds").display().to_string()),
            ..NatsConfig::default()
        });
        assert_eq!(problems[0].0, "sink.credentials_file", "{problems:?}");

        let (_, problems) = resolve(NatsConfig {
            url: NatsUrl("redis://n1".into()),
            ..NatsConfig::default()
        });
        assert_eq!(problems[0].0, "sink.url", "{problems:?}");
        assert!(problems[0].1.contains("redis"), "{problems:?}");
    }
}
