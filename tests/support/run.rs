//! Process-wide run state: the run directory, the exit handler, leftovers of earlier runs,
//! free ports and running external commands with a deadline.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Prefix of every run directory (under /tmp when root, else the temp dir).
const RUN_PREFIX: &str = "outbox-relay-it-";

/// What the exit handler has to stop.
enum Cleanup {
    /// `pg_ctl stop -m immediate` on this data directory.
    PgCluster { data: PathBuf },
    /// SIGKILL + reap this child process.
    Process { pid: i32 },
}

struct Run {
    dir: PathBuf,
}

static RUN: OnceLock<Run> = OnceLock::new();
static CLEANUPS: Mutex<Vec<Cleanup>> = Mutex::new(Vec::new());

fn lock_cleanups() -> std::sync::MutexGuard<'static, Vec<Cleanup>> {
    CLEANUPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The directory of this test-binary run (created on first use, removed at exit). Creating it
/// also registers the exit handler and removes leftovers of earlier runs.
pub fn run_dir() -> &'static Path {
    &RUN.get_or_init(|| {
        let base = base_tmp();
        clean_stale_runs(&base);
        let dir = base.join(format!(
            "{RUN_PREFIX}{}-{}",
            std::process::id(),
            super::unique_name("r")
        ));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        set_mode(&dir, 0o755);
        let me = std::process::id();
        fs::write(
            dir.join("owner"),
            format!("{me} {}\n", proc_start_time(me as i32).unwrap_or(0)),
        )
        .expect("writing run owner file");
        let rc = unsafe { libc::atexit(at_exit) };
        assert_eq!(rc, 0, "libc::atexit failed");
        eprintln!("[support] run directory: {}", dir.display());
        Run { dir }
    })
    .dir
}

/// Where run directories go: /tmp when root (the `postgres` user must be able to reach it;
/// $TMPDIR might be under /root), else the temp dir.
fn base_tmp() -> PathBuf {
    if is_root() {
        PathBuf::from("/tmp")
    } else {
        std::env::temp_dir()
    }
}

/// Registers a PostgreSQL data directory to be stopped (`-m immediate`) at exit.
pub(crate) fn register_pg(data: &Path) {
    lock_cleanups().push(Cleanup::PgCluster {
        data: data.to_path_buf(),
    });
}

/// Registers a child process (by pid) to be killed at exit, and records it in the run
/// directory so that a later run can kill it if this one dies without its exit handler.
pub(crate) fn register_child(pid: u32, exe: &Path) {
    lock_cleanups().push(Cleanup::Process { pid: pid as i32 });
    let line = format!("{pid} {}\n", exe.display());
    if let Ok(mut f) = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(run_dir().join("children"))
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Forgets a child registered with [`register_child`] (it has been reaped).
pub(crate) fn unregister_child(pid: u32) {
    lock_cleanups().retain(|c| !matches!(c, Cleanup::Process { pid: p } if *p == pid as i32));
}

extern "C" fn at_exit() {
    // Never unwind out of an extern "C" fn.
    let _ = std::panic::catch_unwind(|| {
        let cleanups = std::mem::take(&mut *lock_cleanups());
        for c in &cleanups {
            if let Cleanup::Process { pid } = c {
                unsafe {
                    libc::kill(*pid, libc::SIGKILL);
                }
            }
        }
        for c in &cleanups {
            match c {
                Cleanup::Process { pid } => unsafe {
                    let mut status = 0;
                    libc::waitpid(*pid, &mut status, 0);
                },
                Cleanup::PgCluster { data } => pg_stop_immediate(data),
            }
        }
        if let Some(run) = RUN.get() {
            if std::env::var_os("OUTBOX_IT_KEEP").is_some_and(|v| v != "0") {
                eprintln!("[support] kept run directory {}", run.dir.display());
            } else {
                let _ = fs::remove_dir_all(&run.dir);
            }
        }
    });
}

/// Stops a cluster as `pg_ctl stop -m immediate` does, whatever its major version: SIGQUIT to
/// the postmaster named in `postmaster.pid`, then waits up to 20 s for the file to go.
pub(crate) fn pg_stop_immediate(data: &Path) {
    let pid_file = data.join("postmaster.pid");
    let Some(pid) = fs::read_to_string(&pid_file)
        .ok()
        .and_then(|text| text.lines().next()?.trim().parse::<i32>().ok())
    else {
        return;
    };
    unsafe {
        libc::kill(pid, libc::SIGQUIT);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while pid_file.exists() && std::time::Instant::now() < deadline {
        // The postmaster may be gone already (a stale file): then nothing removes it.
        if unsafe { libc::kill(pid, 0) } != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removes run directories of earlier runs whose owner process is gone, stopping what they
/// left running (a PostgreSQL cluster, tansu brokers, relays).
fn clean_stale_runs(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(RUN_PREFIX) {
            continue;
        }
        let dir = e.path();
        let owner = fs::read_to_string(dir.join("owner")).unwrap_or_default();
        let mut it = owner.split_whitespace();
        let pid: i32 = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let start: u64 = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let alive = pid > 0 && proc_start_time(pid).is_some_and(|s| s == start);
        if alive {
            continue;
        }
        if pid == 0 {
            // No owner file: either being created right now or very old. Leave young ones.
            let young = fs::metadata(&dir)
                .and_then(|m| m.modified())
                .map(|t| {
                    t.elapsed()
                        .map(|d| d < Duration::from_secs(600))
                        .unwrap_or(true)
                })
                .unwrap_or(true);
            if young {
                continue;
            }
        }
        eprintln!(
            "[support] cleaning up leftovers of an earlier run: {}",
            dir.display()
        );
        for line in fs::read_to_string(dir.join("children"))
            .unwrap_or_default()
            .lines()
        {
            let mut it = line.splitn(2, ' ');
            let (Some(cpid), Some(exe)) =
                (it.next().and_then(|s| s.parse::<i32>().ok()), it.next())
            else {
                continue;
            };
            // Kill only if that pid still runs the same program (pids get reused).
            let cmd0 = fs::read(format!("/proc/{cpid}/cmdline")).unwrap_or_default();
            let arg0 = cmd0.split(|b| *b == 0).next().unwrap_or_default();
            if !arg0.is_empty() && arg0 == exe.as_bytes() {
                unsafe {
                    libc::kill(cpid, libc::SIGKILL);
                }
            }
        }
        // Every cluster of that run: the shared one (pg/), private ones, other majors.
        for cluster in fs::read_dir(&dir).into_iter().flatten().flatten() {
            pg_stop_immediate(&cluster.path().join("data"));
        }
        let _ = fs::remove_dir_all(&dir);
    }
}

/// Start time (in clock ticks since boot) of process `pid`, from /proc; None if it is gone.
fn proc_start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    // rest starts at field 3 (state); starttime is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether this process runs as root.
pub(crate) fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// uid and gid of the `postgres` user, used to run PostgreSQL binaries when we are root.
pub(crate) fn postgres_ids() -> (u32, u32) {
    static IDS: OnceLock<(u32, u32)> = OnceLock::new();
    *IDS.get_or_init(|| {
        let name = std::ffi::CString::new("postgres").unwrap();
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        assert!(
            !pw.is_null(),
            "running as root, but there is no `postgres` user to run initdb/pg_ctl as \
             (install postgresql-15: tests/setup-deps.sh)"
        );
        unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
    })
}

/// chown `path` to the user that runs the PostgreSQL binaries (no-op when not root).
pub(crate) fn chown_for_pg(path: &Path) {
    if !is_root() {
        return;
    }
    let (uid, gid) = postgres_ids();
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", path.display()));
}

pub(crate) fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = fs::set_permissions(path, fs::Permissions::from_mode(mode));
}

/// Directory with the PostgreSQL server binaries.
pub(crate) fn pg_bindir() -> PathBuf {
    std::env::var_os("PG_BINDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

/// A command for PostgreSQL 15's binary `prog` ([`pg_bindir`]), run as `postgres` when we
/// are root.
pub(crate) fn pg_command(prog: &str) -> Command {
    pg_command_in(&pg_bindir(), prog)
}

/// A command for the PostgreSQL binary `prog` in `bindir`, run as `postgres` when we are root.
pub(crate) fn pg_command_in(bindir: &Path, prog: &str) -> Command {
    let path = bindir.join(prog);
    assert!(
        path.exists(),
        "{} not found: install PostgreSQL 15-18 with tests/setup-deps.sh (or set PG_BINDIR for 15)",
        path.display()
    );
    let mut cmd = Command::new(path);
    if is_root() {
        let (uid, gid) = postgres_ids();
        cmd.uid(uid).gid(gid);
        cmd.env("HOME", "/var/lib/postgresql");
        cmd.env("USER", "postgres");
        cmd.env("LOGNAME", "postgres");
    }
    // Keep the environment from redirecting the binaries elsewhere.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PG") && k != "PG_BINDIR" {
            cmd.env_remove(&k);
        }
    }
    cmd.env("LC_ALL", "C.UTF-8");
    cmd
}

/// Output of a finished command.
pub struct CmdOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` with stdin from /dev/null and stdout/stderr captured to files (not pipes, so a
/// daemon it leaves behind cannot keep us waiting for EOF), killing it and returning an error
/// if it is still running after `deadline`.
pub(crate) fn run_cmd_status(mut cmd: Command, deadline: Duration) -> Result<CmdOutput, String> {
    let out = tempfile::tempfile().map_err(|e| format!("tempfile: {e}"))?;
    let err = tempfile::tempfile().map_err(|e| format!("tempfile: {e}"))?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(err.try_clone().map_err(|e| e.to_string())?);
    let what = format!("{cmd:?}");
    let mut child = cmd.spawn().map_err(|e| format!("spawning {what}: {e}"))?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for {what}: {e}")),
        }
        if start.elapsed() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("timed out after {deadline:?} waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |mut f: fs::File| {
        use std::io::{Read, Seek, SeekFrom};
        let mut s = Vec::new();
        let _ = f.seek(SeekFrom::Start(0));
        let _ = f.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    };
    Ok(CmdOutput {
        status,
        stdout: read(out),
        stderr: read(err),
    })
}

/// Runs `cmd` as [`run_cmd_status`] does and returns its output whatever its exit status.
/// Panics if it cannot be started or is still running after `deadline` (it is then killed).
pub fn run_within(cmd: Command, deadline: Duration) -> CmdOutput {
    run_cmd_status(cmd, deadline).unwrap_or_else(|e| panic!("{e}"))
}

/// Like [`run_cmd_status`], but panics (with the output) unless the command succeeds.
pub(crate) fn run_cmd(cmd: Command, deadline: Duration) -> CmdOutput {
    let what = format!("{cmd:?}");
    match run_cmd_status(cmd, deadline) {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!(
            "command failed ({}): {what}\n--- stdout:\n{}\n--- stderr:\n{}",
            o.status, o.stdout, o.stderr
        ),
        Err(e) => panic!("{e}"),
    }
}

/// Returns a TCP port on 127.0.0.1 that was free a moment ago (bind to port 0 and release).
/// Never returns the same port twice in one process.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    for _ in 0..1000 {
        let l = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0 to find a free port");
        let port = l.local_addr().expect("local_addr").port();
        drop(l);
        let mut g = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if g.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
    panic!("could not find a free TCP port on 127.0.0.1 after 1000 tries");
}

/// Waits until something accepts TCP connections on 127.0.0.1:`port`, or `deadline` passes
/// (returns false), polling every 50 ms; stops early (false) if `gave_up` says so.
pub(crate) fn wait_tcp(port: u16, deadline: Duration, mut gave_up: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    while start.elapsed() < deadline {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
            return true;
        }
        if gave_up() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}
