#!/usr/bin/env python3
"""Benchmarks outbox-relay against its two limits and the reference relays, on one machine.

    bench/run.py [--rounds 3] [--backlog 100000] [--rates 1000,5000] [--steady-secs 60]
                 [--big 1000000] [--idle-secs 60] [--idle-wal-mb 500] [--only SCENARIO] ...

Starts its own PostgreSQL 15 cluster (wal_level=logical) and tansu broker (in memory; with
--broker mock, librdkafka's mock cluster from bench/mock_broker.rs instead, for every scenario:
a broker with next to no latency of its own, to show what the relay adds in scenario 3; every
bench topic has 3 partitions, or --partitions N), builds
the relay, bench/producer_ceiling.rs and bench/mock_broker.rs in release mode, and runs each
scenario for each contender in alternation (forward order in even rounds, reversed in odd
ones), then prints medians as a markdown table and writes them, with every run, to bench/results.json.

Contenders:
- pg_recvlogical: pgoutput on the same WAL, decode and stream to /dev/null. The WAL-side limit:
  no pgoutput client reads the slot faster.
- producer ceiling: bench/producer_ceiling.rs, a bare rdkafka producer loop with the relay's
  producer settings (idempotence, acks=all, murmur2_random, at most 10,000 in flight, the
  same --kafka-property values) and records of the same shape. The broker-side limit: the
  relay cannot publish faster than this.
- outbox-relay (release build).
- wal2json relay: PEERS_DIR/seed_cdc_relay.py (psycopg2 + wal2json + confluent-kafka;
  confirms before the broker's ack, so an upper bound for that design).
- polling relay: PEERS_DIR/seed_poll_relay.py (SELECT ... FOR UPDATE SKIP LOCKED LIMIT
  100 on its own outbox_events table, marks rows PUBLISHED in delivery callbacks).
The peers are not part of this repository: they run from PEERS_DIR (by default shared/peers
beside the repository's folder) and are left out when missing; the
wal2json relay needs postgresql-15-wal2json (installed with apt-get when missing, as root).
Python dependencies go into bench/.venv.

Scenarios:
1. backlog: N single-row transactions (~300-byte rows) committed while nothing reads;
   time from the contender's start until the last event is acknowledged by the broker (the
   relay's outbox_relay_events_published_total; the peers' and the ceiling's exit after their
   final flush), or for pg_recvlogical until it has read past the last commit. The polling
   relay gets the same rows in outbox_events, written before the slots are created. A peer
   still running after --peer-timeout is stopped and scored by what it published by then.
2. big transactions: 20 transactions of 5,000 rows, measured the same way.
3. steady load: RATE events/s (each of --rates) for --steady-secs through pgbench (-R, so
   Poisson arrivals); commit -> consumer receipt latency p50/p99/max. The value carries the
   inserting transaction's clock; the same consumer (confluent-kafka, fetch.wait.max.ms=1)
   reads every contender's topic. The producer ceiling sends at the same rate, evenly spaced,
   with its send time in the value: the broker path alone. With --exactly-once (mock cluster
   only: tansu has no transactions) the relay runs with --exactly-once: a lower bound of what
   the mode adds, since the mock cluster writes no transaction markers and its read_committed
   consumer sees a record once it is acknowledged, before its transaction commits (the wait
   for the previous batch's commit shows; the record's own batch linger and commit do not).
4. one transaction of BIG rows: the relay's peak RSS (VmHWM) and time to drain, and
   pg_recvlogical's time on the same WAL (one round: recvlogical, the ceiling, the relay).
5. idle: --idle-secs with no outbox writes while another table writes --idle-wal-mb of WAL;
   each WAL reader's CPU seconds over the window (utime + stime of its process) and the WAL
   its slot retains at the end (current LSN - restart_lsn) and its confirmed lag (current LSN
   - confirmed_flush_lsn), again 20 s later. The contenders run side by side in one window
   (CPU seconds of one process and one slot's position do not depend on the others' order).
6. exactly-once cost (outbox-relay only, always on librdkafka's mock cluster, the one broker
   here with Kafka transactions): --eos-txns transactions of --eos-rows rows from a backlog,
   with and without --exactly-once; events/s and ms per transaction from the first published
   event until the confirmed flush LSN reaches the end of the backlog, and the start-up before.
   `--kafka-property linger.ms=0` measures it without librdkafka's 5 ms batching delay.
7. sinks other than Kafka (`--only sinks`, bench/sinks.py; --sink redis|nats|rabbitmq|http,
   repeatable, default all four): scenario 1's backlog drained by the relay into a server of
   each kind of the bench's own (redis-server, nats-server -js, rabbitmq-server, the 200-to-
   every-POST bench/http_receiver.rs), from its start until its confirmed flush LSN passes the
   backlog, then the sink's count of its events; against that sink's bare client sending as
   many like records with the same acknowledgement into a destination of its own
   (redis-benchmark pipelining XADD; bench/nats_ceiling.rs, 256 awaiting their PubAck;
   bench/rabbitmq_ceiling.rs, lapin with confirms, 256 in flight; bench/http_ceiling.rs, 16
   in flight), alternating per round. Ratio: the relay's events/s over the bare client's.
   `--print` of results written before RabbitMQ and HTTP joined this scenario (keys
   "rabbitmq_backlog", "http") leaves those rows out.

8. pipelines (outbox-relay only): --pipelines (1, 10, 50) databases, each with its own outbox,
   slot and [[pipelines]] entry in one config file, served by one relay process. Once /readyz
   says every pipeline streams (and --pipelines-settle s more), the relay's CPU over
   --pipelines-idle-secs with nothing written (utime + stime from /proc/<pid>/stat, % of a
   core, and by thread kind from /proc/<pid>/task/*/stat), its threads (/proc/<pid>/status
   Threads) and RSS (VmRSS); then --pipelines-burst single-row transactions in every database,
   and RSS and threads again once all of them are published.

Ratios: each contender's events/s over the lower of the two limits (scenarios 1, 2).
"""
import argparse, json, os, re, resource, select, shutil, socket, statistics, subprocess, sys, tempfile, threading, time, urllib.request
from pathlib import Path

import sinks

ROOT = Path(__file__).resolve().parent.parent
PGBIN = Path(os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin"))
TANSU = Path(os.environ.get("TANSU_BIN", Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")) / "bin" / "tansu"))
PEERS = Path(os.environ.get("PEERS_DIR", ROOT.parent / "shared" / "peers"))
VENV = ROOT / "bench" / ".venv"
PY_DEPS = {"psycopg2": "psycopg2-binary", "confluent_kafka": "confluent-kafka", "sqlalchemy": "sqlalchemy"}
CEILING = ROOT / "target" / "release" / "examples" / "producer_ceiling"
MOCK_BROKER = ROOT / "target" / "release" / "examples" / "mock_broker"
RELAY_BIN = ROOT / "target" / "release" / "outbox-relay"  # --relay-bin replaces it
BROKERS = {"tansu": "tansu (memory storage)",
           "mock": "librdkafka's mock cluster (bench/mock_broker.rs: next to no broker latency; not a real broker)"}
PAD = "x" * 200  # ~300-byte outbox rows with the other columns

RECV, CEIL, RELAY, CDC, POLL = "pg_recvlogical", "producer ceiling", "outbox-relay", "wal2json relay", "polling relay"
LIMITS = (RECV, CEIL)
CONTENDERS = (RECV, CEIL, RELAY, CDC, POLL)
SELECTED = set(CONTENDERS)  # --contender narrows it
PERF_DIR = None  # --perf


def selected(contenders):
    return [c for c in contenders if c in SELECTED]

# The peers' outbox (the README.md in PEERS_DIR).
OUTBOX_EVENTS = """CREATE TABLE outbox_events (
    id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_id VARCHAR(255) NOT NULL, aggregate_type VARCHAR(100) NOT NULL,
    event_type VARCHAR(100) NOT NULL, payload JSONB NOT NULL, headers JSONB DEFAULT '{}',
    created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(), published_at TIMESTAMPTZ,
    status VARCHAR(20) NOT NULL DEFAULT 'PENDING', retry_count INTEGER NOT NULL DEFAULT 0,
    next_retry_at TIMESTAMPTZ)"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def uptime():
    return Path("/proc/loadavg").read_text().split()[:3]


def machine_cpu():
    """(busy, total) jiffies of all cores, from /proc/stat."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cpu_seconds(pid):
    """utime + stime of a process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid):
    """utime + stime of each thread of a process, by thread id: (name, seconds)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[task.name] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def context_switches(pid):
    """Voluntary + involuntary context switches of all threads of a process."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def cpu_by_thread_kind(before, after):
    """CPU seconds between two thread_cpu_seconds samples, summed by thread name without digits."""
    kinds = {}
    for tid, (name, seconds) in after.items():
        kind = re.sub(r"[-_]?\d+$", "", name)
        kinds[kind] = kinds.get(kind, 0) + seconds - before.get(tid, (name, 0))[1]
    return {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}


class Cluster:
    def __init__(self, work):
        self.dir = work / "pg"
        self.dir.mkdir()
        self.port = free_port()
        root = os.geteuid() == 0
        self.prefix = ["runuser", "-u", "postgres", "--"] if root else []
        if root:
            shutil.chown(work, "postgres")
            shutil.chown(self.dir, "postgres")
        self.run([PGBIN / "initdb", "-D", self.dir / "data", "-U", "postgres", "-A", "trust", "--no-sync"])
        with open(self.dir / "data" / "postgresql.conf", "a") as conf:
            conf.write(f"""
port = {self.port}
listen_addresses = '127.0.0.1'
unix_socket_directories = '{self.dir}'
wal_level = logical
max_replication_slots = 64
max_wal_senders = 64
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
max_wal_size = 8GB
shared_buffers = 512MB
""")
        self.run([PGBIN / "pg_ctl", "-D", self.dir / "data", "-l", self.dir / "log", "-w", "start"])

    def run(self, cmd):
        subprocess.run(self.prefix + [str(c) for c in cmd], check=True, cwd="/", stdout=subprocess.DEVNULL)

    def stop(self):
        subprocess.run(self.prefix + [str(PGBIN / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop"],
                       cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def url(self, db="bench"):
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def sql(self, sql, db="bench"):
        out = subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", self.url(db), "-c", sql],
                             check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def drop_slot(self, slot):
        """Drops `slot` once its reader has let go of it (up to 30 s)."""
        deadline = time.time() + 30
        while self.sql(f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'") == "t":
            if time.time() > deadline:
                raise SystemExit(f"slot {slot} still active after 30 s")
            time.sleep(0.1)
        if self.sql(f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'") == "1":
            self.sql(f"SELECT pg_drop_replication_slot('{slot}')")


TOPICS = ("Order.events", "Steady.events", "order.events", "steady.events", "ceiling.events")
# The relay's exactly-once checkpoint topic (its --checkpoint-topic default).
CHECKPOINT_TOPIC = "outbox-relay.checkpoints"


def start_mock_broker(work, topics):
    """Starts bench/mock_broker.rs with `topics`, each of Broker.partitions (--partitions)
    partitions; returns the process (it serves until its stdin closes) and its bootstrap address."""
    topics = [f"{topic}:{Broker.partitions}" for topic in topics]
    proc = subprocess.Popen([str(MOCK_BROKER), *topics], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(work / "mock-broker.log", "a"), text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    bootstrap = proc.stdout.readline().strip() if ready else ""
    if not bootstrap:
        stop_process(proc)
        raise SystemExit(f"the mock broker did not start: see {work / 'mock-broker.log'}")
    return proc, bootstrap


class Broker:
    """tansu with memory storage (or, with --broker mock, bench/mock_broker.rs: librdkafka's
    mock cluster). tansu keeps every record in memory and slows down as they pile
    up (at 1,000 events/s its CPU doubled after the 1.2 million records of scenarios 1-2), so
    each scenario and each steady-load run starts with a fresh broker: `fresh()`."""

    def __init__(self, work):
        self.work, self.proc = work, None
        self.fresh()

    kind = "tansu"
    # Partitions of every bench topic (--partitions).
    partitions = 3

    def fresh(self):
        """Stops the running broker, if any, and starts an empty one with the bench's topics."""
        if self.proc:
            stop_process(self.proc)
        if Broker.kind == "mock":
            # Topics are made at start (as many partitions as tansu's); it serves until stdin closes.
            self.proc, self.bootstrap = start_mock_broker(self.work, [*TOPICS, CHECKPOINT_TOPIC])
            self.port = int(self.bootstrap.rsplit(":", 1)[1])
            return
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(TANSU), "broker", "--storage-engine", "memory://tansu/",
                                      "--listener-url", f"tcp://{self.bootstrap}",
                                      "--advertised-listener-url", f"tcp://{self.bootstrap}"],
                                     stdout=open(self.work / "tansu.log", "a"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SystemExit("tansu did not start")
        for topic in TOPICS:
            self.topic(topic)

    def topic(self, name):
        subprocess.run([str(TANSU), "topic", "create", name, "--partitions", str(Broker.partitions),
                        "--broker", f"tcp://{self.bootstrap}"], check=True, stdout=subprocess.DEVNULL)


class Relay:
    """The relay on one slot, with its metrics endpoint."""

    extra_args = []
    # Scenario 3's relay only (--exactly-once).
    steady_args = []

    def __init__(self, work, cluster, broker, slot, extra=(), config=None):
        """`config`: a TOML config file to run instead of the single-pipeline flags (`extra` and
        `Relay.extra_args` then unused)."""
        self.metrics = f"127.0.0.1:{free_port()}"
        args = (["--config", str(config)] if config else
                ["--source-url", cluster.url(), "--slot", slot, "--publication", "outbox_pub", "--table",
                 "public.outbox", "--bootstrap-servers", broker.bootstrap, "--pipeline-name", "bench",
                 "--no-create-slot", *Relay.extra_args, *extra])
        self.proc = subprocess.Popen(
            [str(RELAY_BIN), "run", *args, "--metrics-listen", self.metrics],
            stdout=open(work / f"relay-{slot}.log", "w"), stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": "warn"})

    def metrics_text(self):
        """The relay's /metrics page ("" while it does not answer)."""
        try:
            return urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=1).read().decode()
        except OSError:
            return ""

    def published(self):
        text = self.metrics_text()
        for line in text.splitlines():
            if line.startswith("outbox_relay_events_published_total"):
                return int(float(line.rsplit(" ", 1)[1]))
        return 0

    def wait_published(self, n, timeout=900):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.published() >= n:
                return
            if self.proc.poll() is not None:
                raise SystemExit(f"relay exited with {self.proc.returncode}")
            time.sleep(0.01)
        raise SystemExit(f"relay published {self.published()} of {n} within {timeout} s")

    def mean_seconds(self, histogram):
        """Mean of one of the relay's latency histograms (sum / count), seconds."""
        text = urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=1).read().decode()
        values = {}
        for line in text.splitlines():
            for part in ("sum", "count"):
                if line.startswith(f"{histogram}_{part}"):
                    values[part] = float(line.rsplit(" ", 1)[1])
        return values["sum"] / values["count"] if values.get("count") else None

    def peak_rss_mib(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


def recvlogical_cmd(cluster, slot, endpos=None):
    return [str(PGBIN / "pg_recvlogical"), "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres",
            "-d", "bench", "--slot", slot, "--start", "-f", "/dev/null", "--no-loop",
            "-o", "proto_version=1", "-o", "publication_names=outbox_pub",
            *([f"--endpos={endpos}"] if endpos else [])]


def ceiling_cmd(broker, topic, *mode):
    props = [p for i, p in enumerate(Relay.extra_args) if i % 2 == 1]  # --kafka-property k=v pairs
    return [str(CEILING), broker.bootstrap, topic, *map(str, mode), *props]


def stop_process(proc, timeout=30):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Peers:
    """The reference relays in PEERS_DIR and what they need: bench/.venv, wal2json."""

    def __init__(self, cluster, broker, work, use):
        self.cluster, self.broker, self.work = cluster, broker, work
        self.python = venv_python() if use else None
        self.cdc = use and (PEERS / "seed_cdc_relay.py").exists() and ensure_wal2json()
        self.poll = use and (PEERS / "seed_poll_relay.py").exists()
        for name, script in ((CDC, "seed_cdc_relay.py"), (POLL, "seed_poll_relay.py")):
            if use and not (PEERS / script).exists():
                log(f"  the {name} is left out: {PEERS / script} is missing")

    def contenders(self):
        return [c for c, ok in ((CDC, self.cdc), (POLL, self.poll)) if ok]

    def log_tail(self, contender, lines=15):
        logs = sorted(self.work.glob("cdc-*.log" if contender == CDC else "poll.log"), key=os.path.getmtime)
        return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:]) if logs else ""

    def start_cdc(self, slot, stop_after=0):
        dsn = f"host=127.0.0.1 port={self.cluster.port} user=postgres dbname=bench"
        return subprocess.Popen([str(self.python), str(PEERS / "seed_cdc_relay.py"), dsn, self.broker.bootstrap,
                                 slot, "public.outbox", str(stop_after)],
                                stdout=open(self.work / f"cdc-{slot}.log", "a"), stderr=subprocess.STDOUT)

    def start_poll(self, stop_after):
        # SQLAlchemy 2.1 maps plain postgresql:// to psycopg 3; the peers README installs psycopg2.
        url = f"postgresql+psycopg2://postgres@127.0.0.1:{self.cluster.port}/bench"
        return subprocess.Popen([str(self.python), str(PEERS / "seed_poll_relay.py"), url, self.broker.bootstrap,
                                 str(stop_after)],
                                stdout=open(self.work / "poll.log", "a"), stderr=subprocess.STDOUT)


def venv_python():
    """bench/.venv's python, with the peers' and the consumer's packages installed."""
    python = VENV / "bin" / "python"
    if getattr(venv_python, "checked", False):
        return python
    venv_python.checked = True
    if not python.exists():
        log("  creating bench/.venv")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    missing = [pkg for mod, pkg in PY_DEPS.items()
               if subprocess.run([str(python), "-c", f"import {mod}"], capture_output=True).returncode != 0]
    if missing:
        log(f"  installing {' '.join(missing)} into bench/.venv")
        subprocess.run([str(python), "-m", "pip", "install", "-q", *missing], check=True)
    return python


def ensure_wal2json():
    """Installs postgresql-15-wal2json with apt-get when missing; False if that cannot be done."""
    if (PGBIN.parent / "lib" / "wal2json.so").exists():
        return True
    if os.geteuid() != 0:
        log("  wal2json missing and not root: running without the wal2json relay")
        return False
    log("  installing postgresql-15-wal2json (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql-15-wal2json"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return (PGBIN.parent / "lib" / "wal2json.so").exists()


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ordered(contenders, r):
    """A B C in even rounds, C B A in odd ones."""
    return list(contenders) if r % 2 == 0 else list(reversed(contenders))


def recvlogical_drain(cluster, slot, endpos, start):
    """pg_recvlogical from `slot` to `endpos`: its CPU and context switches (from wait4, as the
    psql calls made meanwhile are children too) and its walsender's CPU from the first sample
    of the walsender's /proc figures (`walsender_first_sample_seconds` after `start`) to the last
    one before it ends with pg_recvlogical. /proc's CPU times move in 10 ms ticks, so it samples
    every 20 ms."""
    proc = subprocess.Popen(recvlogical_cmd(cluster, slot, endpos))
    run, walsender, first, last = {}, None, None, None
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            walsender = walsender or cluster.sql(
                f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{slot}'")
            try:
                last = cpu_seconds(int(walsender)) if walsender else last
            except OSError:
                pass  # the walsender has ended; pg_recvlogical is about to
            if first is None and last is not None:
                first = last
                run["walsender_first_sample_seconds"] = time.time() - start
            time.sleep(0.02)
    except BaseException:
        stop_process(proc)  # it would hold the slot, and the slot's drop would wait for it
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"pg_recvlogical exited with {proc.returncode}")
    run["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    run["context_switches"] = usage.ru_nvcsw + usage.ru_nivcsw
    if first is None:
        log("    (pg_recvlogical's walsender was not sampled: it ended before its first sample)")
    else:
        run["walsender_cpu_seconds"] = last - first
    return run


def drain_scenario(name, cluster, broker, peers, work, fill, events, rounds, peer_timeout):
    """Per round: fills the peers' table, creates one slot per WAL reader at one LSN, fills the
    outbox, then drains with each contender in turn."""
    contenders = selected([RECV, CEIL, RELAY, *peers.contenders()])
    runs = {c: [] for c in contenders}
    broker.fresh()
    for r in range(rounds):
        cluster.sql("TRUNCATE outbox, outbox_events")
        if POLL in contenders:
            cluster.sql(fill.format(table="outbox_events"))
            cluster.sql("VACUUM ANALYZE outbox_events")
        slots = {RECV: (f"{name}_{r}_recv", "pgoutput"), RELAY: (f"{name}_{r}_relay", "pgoutput"),
                 CDC: (f"{name}_{r}_cdc", "wal2json")}
        slots = {c: s for c, s in slots.items() if c in contenders}
        for slot, plugin in slots.values():
            cluster.sql(f"SELECT pg_create_logical_replication_slot('{slot}', '{plugin}')")
        t0 = time.time()
        cluster.sql(fill.format(table="outbox"))
        endpos = cluster.sql("SELECT pg_current_wal_lsn()")
        log(f"  round {r + 1}: wrote {events:,} events in {time.time() - t0:.1f} s (load {' '.join(uptime())})")
        for contender in ordered(contenders, r):
            start = time.time()
            run = {}
            children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if contender == RECV:
                run.update(recvlogical_drain(cluster, slots[RECV][0], endpos, start))
            elif contender == CEIL:
                out = subprocess.run(ceiling_cmd(broker, "ceiling.events", "count", events), check=True,
                                     capture_output=True, text=True).stdout
                run["own"] = json.loads(out)
                children = resource.getrusage(resource.RUSAGE_CHILDREN)
                run["cpu_seconds"] = (children.ru_utime + children.ru_stime
                                      - children0.ru_utime - children0.ru_stime)
                run["context_switches"] = (children.ru_nvcsw + children.ru_nivcsw
                                           - children0.ru_nvcsw - children0.ru_nivcsw)
            elif contender == RELAY:
                relay = Relay(work, cluster, broker, slots[RELAY][0])
                perf = None
                if PERF_DIR:  # --perf DIR: where the relay's CPU time goes, by function
                    perf = subprocess.Popen(["perf", "record", "-q", "-g", "-F", "999", "-p", str(relay.proc.pid),
                                             "-o", str(PERF_DIR / f"{name}-{r + 1}.perf.data")],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                walsender = None
                while relay.published() == 0 and relay.proc.poll() is None and time.time() - start < 60:
                    walsender = walsender or cluster.sql(
                        f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{slots[RELAY][0]}'")
                    time.sleep(0.005)
                run["first_ack_seconds"] = time.time() - start  # start-up plus one round trip
                walsender_cpu0 = cpu_seconds(int(walsender)) if walsender else None
                relay.wait_published(events)
                # Where the time goes: the relay's own CPU and its walsender's, over the drain.
                run["cpu_seconds"] = cpu_seconds(relay.proc.pid)
                run["cpu_seconds_by_thread"] = cpu_by_thread_kind({}, thread_cpu_seconds(relay.proc.pid))
                run["context_switches"] = context_switches(relay.proc.pid)
                if walsender_cpu0 is not None:
                    run["walsender_cpu_seconds_after_first_event"] = cpu_seconds(int(walsender)) - walsender_cpu0
                if perf:
                    perf.send_signal(2)
                    perf.wait(60)
                relay.stop()
            elif contender != RECV:  # a peer
                proc = (peers.start_cdc(slots[CDC][0], events) if contender == CDC else peers.start_poll(events))
                try:
                    proc.wait(peer_timeout)
                except subprocess.TimeoutExpired:
                    stop_process(proc)
                    run["partial"] = True
                if proc.returncode not in (0, None) and not run.get("partial"):
                    raise SystemExit(f"{contender} exited with {proc.returncode}:\n{peers.log_tail(contender)}")
            elapsed = time.time() - start
            done = events
            if run.get("partial"):
                done = (int(cluster.sql("SELECT count(*) FROM outbox_events WHERE status = 'PUBLISHED'"))
                        if contender == POLL else None)
            run.update(seconds=elapsed, events=done, events_per_second=done / elapsed if done else None)
            runs[contender].append(run)
            rate = f"{run['events_per_second']:,.0f} events/s" if done else "rate unknown"
            cpu = (f", first ack after {run['first_ack_seconds']:.2f} s" if "first_ack_seconds" in run else "") + (
                f", {run['cpu_seconds']:.2f} CPU s" if "cpu_seconds" in run else "") + (
                f", {run['context_switches'] / events:.2f} context switches/event" if "context_switches" in run else "") + (
                f" (walsender {run['walsender_cpu_seconds_after_first_event']:.2f})"
                if "walsender_cpu_seconds_after_first_event" in run else "") + (
                f" (walsender {run['walsender_cpu_seconds']:.2f})" if "walsender_cpu_seconds" in run else "") + (
                f"; by thread {run['cpu_seconds_by_thread']}" if "cpu_seconds_by_thread" in run else "")
            log(f"    {contender}: {elapsed:.2f} s ({rate}{cpu})" + (f", stopped after {peer_timeout} s with "
                f"{done if done is not None else 'an unknown number of'} of {events:,} published"
                if run.get("partial") else ""))
        for slot, _ in slots.values():
            cluster.drop_slot(slot)
    out = {}
    for c, v in runs.items():
        out[c] = {"events_per_second": median([x["events_per_second"] for x in v]),
                  "seconds": median([x["seconds"] for x in v]), "partial": any(x.get("partial") for x in v),
                  "runs": v}
    limit = min((out[c]["events_per_second"] for c in LIMITS if c in out), default=None)
    out["lower_limit_events_per_second"] = limit
    for c in contenders:
        eps = out[c]["events_per_second"]
        out[c]["ratio_to_lower_limit"] = eps / limit if eps and limit else None
    return out


CONSUMER = r"""
import json, sys, threading, time
from confluent_kafka import Consumer, TopicPartition
bootstrap, topic, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
expected = None  # the number of events actually written, once the load generator knows it
def actual():
    global expected
    expected = int(sys.stdin.readline())
threading.Thread(target=actual, daemon=True).start()
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency", "fetch.wait.max.ms": 1,
              "enable.auto.commit": False, "auto.offset.reset": "latest"})
parts = c.list_topics(topic, timeout=10).topics[topic].partitions
c.assign([TopicPartition(topic, p, -1) for p in parts])  # from the end: only new records
print("ready", flush=True)
lat, seen, duplicates, redelivered, deadline = [], {}, 0, 0, time.time() + timeout
while (expected is None or len(lat) < expected) and time.time() < deadline:
    m = c.poll(0.1)
    if m is None or m.error():
        continue
    received = time.time()
    t = json.loads(m.value()).get("t")
    if t is None:  # the producer ceiling's warm-up record
        continue
    event_id = dict(m.headers() or []).get("id")
    if event_id in seen:  # at-least-once: the first copy counts
        if seen[event_id] == (m.partition(), m.offset()):
            redelivered += 1  # the same record again: the consumer's side
        else:
            duplicates += 1  # published twice
        continue
    seen[event_id] = (m.partition(), m.offset())
    lat.append((received - t) * 1000)
print(json.dumps({"latencies_ms": lat, "duplicates": duplicates, "redelivered": redelivered,
                  "cpu_seconds": time.process_time()}))
"""


def pgbench(cluster, work, table, rate, seconds):
    script = work / f"steady-{table}.sql"
    script.write_text(f"INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) VALUES "
                      "('Steady', 'k-' || (random() * 100)::int, 'Tick', "
                      "jsonb_build_object('t', extract(epoch FROM clock_timestamp()), 'pad', repeat('x', 200)));\n")
    out = subprocess.run([str(PGBIN / "pgbench"), "-n", "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres",
                          "-f", str(script), "-R", str(rate), "-T", str(seconds), "-c", "2", "-j", "2", "bench"],
                         check=True, capture_output=True, text=True,
                   # The walsender sends only flushed WAL: with the cluster's synchronous_commit=off a
                   # commit waits up to wal_writer_delay (200 ms) before any reader can see it.
                         env={**os.environ, "PGOPTIONS": "-c synchronous_commit=on"}).stdout
    # pgbench falls behind its schedule when the machine is busy: what it actually committed.
    return int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))


def latency_run(contender, cluster, broker, peers, work, rate, seconds, grace):
    """One steady-load run: commit (or send) -> consumer receipt latencies, ms."""
    expected = rate * seconds
    topic = {RELAY: "Steady.events", CEIL: "ceiling.events"}.get(contender, "steady.events")
    broker.fresh()
    slot, proc, relay, extra = None, None, None, {}
    if contender == RELAY:
        slot = "steady_relay"
        cluster.sql(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
        relay = Relay(work, cluster, broker, slot, Relay.steady_args)
    elif contender == CDC:
        slot = "steady_cdc"
        cluster.sql(f"SELECT pg_create_logical_replication_slot('{slot}', 'wal2json')")
        proc = peers.start_cdc(slot)  # no stop count: pgbench may commit a few more than rate x seconds
    elif contender == POLL:
        cluster.sql("TRUNCATE outbox_events")
        proc = peers.start_poll(10**9)
    if contender != CEIL:
        time.sleep(2)  # connected and caught up before the load starts
    walsender = cluster.sql("SELECT pid FROM pg_stat_replication LIMIT 1") if slot else ""
    consumer = subprocess.Popen([str(venv_python()), "-c", CONSUMER, broker.bootstrap, topic, str(seconds + grace)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert consumer.stdout.readline().strip() == "ready"
    time.sleep(1)  # the consumer's end offsets resolved before the first record
    # Where the CPU goes during the run: the contender, its walsender, the broker, the machine.
    watched = {"contender": (relay.proc if relay else proc).pid if (relay or proc) else None,
               "walsender": int(walsender) if walsender else None, Broker.kind: broker.proc.pid}
    cpu0 = {k: cpu_seconds(pid) for k, pid in watched.items() if pid}
    machine0, children0 = machine_cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
    # How far the walsender's sent position trails the WAL, twice a second: whether commit ->
    # ack time goes before the WAL reaches the reader (walsender) or after (the reader).
    behind, sampling = [], threading.Event()
    if walsender:
        def sample():
            while not sampling.wait(0.5):
                try:
                    behind.append(int(cluster.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), sent_lsn) "
                                                  f"FROM pg_stat_replication WHERE pid = {walsender}") or 0))
                except (subprocess.CalledProcessError, ValueError):
                    pass
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
    start = time.time()
    if contender == CEIL:
        out = subprocess.run(ceiling_cmd(broker, topic, "rate", rate, seconds), check=True,
                             capture_output=True, text=True).stdout
        extra["mean_produce_to_ack_ms"] = json.loads(out)["mean_produce_to_ack_ms"]
    else:
        expected = pgbench(cluster, work, "outbox_events" if contender == POLL else "outbox", rate, seconds)
    consumer.stdin.write(f"{expected}\n")
    consumer.stdin.flush()
    consumed = json.loads(consumer.stdout.readline())
    elapsed = time.time() - start
    sampling.set()
    if behind:
        extra["walsender_behind_wal_mib"] = {"mean": statistics.mean(behind) / 2**20, "max": max(behind) / 2**20}
    cpu = {}
    for k, pid in watched.items():
        try:
            cpu[k] = cpu_seconds(pid) - cpu0[k] if pid else None
        except OSError:
            pass  # ended already (the wal2json relay exits after the events it was told to expect)
    cpu = {k: v for k, v in cpu.items() if v is not None}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if contender == CEIL:  # the only child that ended in the window
        cpu["contender"] = children.ru_utime + children.ru_stime - children0.ru_utime - children0.ru_stime
    cpu["consumer"] = consumed["cpu_seconds"]
    busy, total = (b - a for a, b in zip(machine0, machine_cpu()))
    extra["cpu_percent_of_a_core"] = {k: round(100 * v / elapsed, 1) for k, v in cpu.items()}
    extra["machine_busy_percent"] = round(100 * busy / total, 1)
    lat = sorted(consumed["latencies_ms"])
    consumer.wait(30)
    if relay:
        # Where the time goes: the relay's own view, commit -> broker ack and producer -> ack.
        extra["mean_commit_to_ack_ms"] = (relay.mean_seconds("outbox_relay_commit_to_ack_latency_seconds") or 0) * 1000
        extra["mean_produce_to_ack_ms"] = (relay.mean_seconds("outbox_relay_delivery_latency_seconds") or 0) * 1000
        relay.stop()
    if proc:
        stop_process(proc)
    if slot:
        cluster.drop_slot(slot)
    pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None
    return {"expected": expected, "target": rate * seconds, "received": len(lat), "duplicates": consumed["duplicates"],
            "redelivered_to_consumer": consumed["redelivered"], "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "max_ms": lat[-1] if lat else None, **extra}


def latency_scenario(cluster, broker, peers, work, rate, seconds, rounds, grace):
    contenders = selected([CEIL, RELAY, *peers.contenders()])
    runs = {c: [] for c in contenders}
    for r in range(rounds):
        for contender in ordered(contenders, r):
            run = latency_run(contender, cluster, broker, peers, work, rate, seconds, grace)
            runs[contender].append(run)
            fmt = lambda v: f"{v:.1f}" if v is not None else "-"
            log(f"    round {r + 1} {contender}: p50 {fmt(run['p50_ms'])} ms, p99 {fmt(run['p99_ms'])} ms, "
                f"max {fmt(run['max_ms'])} ms, {run['received']:,} of {run['expected']:,} received"
                + (f" (and {run['duplicates']:,} duplicates)" if run["duplicates"] else "")
                + (f" (and {run['redelivered_to_consumer']:,} offsets read twice)" if run["redelivered_to_consumer"] else "")
                + (f"; produce -> ack {run['mean_produce_to_ack_ms']:.1f} ms" if "mean_produce_to_ack_ms" in run else "")
                + (f", commit -> ack {run['mean_commit_to_ack_ms']:.1f} ms" if "mean_commit_to_ack_ms" in run else "")
                + (f"; walsender behind the WAL by {run['walsender_behind_wal_mib']['mean']:.2f} MiB on average, "
                   f"{run['walsender_behind_wal_mib']['max']:.2f} at most" if "walsender_behind_wal_mib" in run else "")
                + f"; CPU % of a core {run['cpu_percent_of_a_core']}, machine busy {run['machine_busy_percent']} %")
    out = {}
    for c, v in runs.items():
        out[c] = {k: median([x.get(k) for x in v]) for k in
                  ("p50_ms", "p99_ms", "max_ms", "mean_commit_to_ack_ms", "mean_produce_to_ack_ms")}
        out[c].update(target=v[0]["target"], written_min=min(x["expected"] for x in v),
                      missed_max=max(x["expected"] - x["received"] for x in v),
                      duplicates_max=max(x["duplicates"] for x in v), runs=v)
    return {"rate": rate, "seconds": seconds, "contenders": out}


def big_scenario(cluster, broker, work, rows):
    broker.fresh()
    cluster.sql("TRUNCATE outbox")
    cluster.sql("SELECT pg_create_logical_replication_slot('big_relay', 'pgoutput')")
    cluster.sql("SELECT pg_create_logical_replication_slot('big_recv', 'pgoutput')")
    t0 = time.time()
    cluster.sql(f"INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) "
                f"SELECT 'Order', 'key-' || (g % 1000), 'Bulk', jsonb_build_object('seq', g, 'pad', '{PAD}') "
                f"FROM generate_series(1, {rows}) g")
    endpos = cluster.sql("SELECT pg_current_wal_lsn()")
    log(f"  wrote {rows:,} rows in one transaction in {time.time() - t0:.1f} s")
    start = time.time()
    subprocess.run(recvlogical_cmd(cluster, "big_recv", endpos), check=True)
    recv_seconds = time.time() - start
    log(f"    {RECV}: {recv_seconds:.2f} s")
    start = time.time()
    subprocess.run(ceiling_cmd(broker, "ceiling.events", "count", rows), check=True, stdout=subprocess.DEVNULL)
    ceiling_seconds = time.time() - start
    log(f"    {CEIL}: {ceiling_seconds:.2f} s")
    start = time.time()
    relay = Relay(work, cluster, broker, "big_relay")
    relay.wait_published(rows, timeout=3600)
    elapsed = time.time() - start
    rss = relay.peak_rss_mib()
    relay.stop()
    log(f"    {RELAY}: {elapsed:.2f} s, peak RSS {rss:.0f} MiB")
    for slot in ("big_relay", "big_recv"):
        cluster.drop_slot(slot)
    cluster.sql("CHECKPOINT")
    return {"rows": rows, "seconds": elapsed, "events_per_second": rows / elapsed, "peak_rss_mib": rss,
            RECV: {"seconds": recv_seconds, "events_per_second": rows / recv_seconds},
            CEIL: {"seconds": ceiling_seconds, "events_per_second": rows / ceiling_seconds}}


def slot_positions(cluster):
    rows = cluster.sql("SELECT slot_name, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), "
                       "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) FROM pg_replication_slots")
    out = {}
    for line in rows.splitlines():
        name, retained, lag = line.split("|")
        out[name] = {"retained_mib": float(retained) / 2**20, "confirmed_lag_mib": float(lag) / 2**20}
    return out


def idle_scenario(cluster, broker, peers, work, seconds, wal_mb, rounds):
    """Per round: every contender side by side for `seconds` while `filler` writes `wal_mb` of WAL."""
    contenders = selected([RECV, RELAY, *peers.contenders()])
    runs = {c: [] for c in contenders}
    broker.fresh()
    for r in range(rounds):
        cluster.sql("TRUNCATE outbox, outbox_events, filler")
        slots = {RECV: f"idle_{r}_recv", RELAY: f"idle_{r}_relay", CDC: f"idle_{r}_cdc"}
        slots = {c: s for c, s in slots.items() if c in contenders}
        procs = {}
        for c in contenders:
            if c in slots:
                plugin = "wal2json" if c == CDC else "pgoutput"
                cluster.sql(f"SELECT pg_create_logical_replication_slot('{slots[c]}', '{plugin}')")
            if c == RECV:
                procs[c] = subprocess.Popen(recvlogical_cmd(cluster, slots[c]))
            elif c == RELAY:
                procs[c] = Relay(work, cluster, broker, slots[c]).proc
            elif c == CDC:
                procs[c] = peers.start_cdc(slots[c])
            else:
                procs[c] = peers.start_poll(10**9)
        time.sleep(3)  # past start-up
        perf = None
        if PERF_DIR and RELAY in procs:
            perf = subprocess.Popen(["perf", "record", "-q", "-g", "-F", "999", "-p", str(procs[RELAY].pid),
                                     "-o", str(PERF_DIR / f"idle-{r + 1}.perf.data")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cpu0 = {c: cpu_seconds(p.pid) for c, p in procs.items()}
        relay_threads0 = thread_cpu_seconds(procs[RELAY].pid) if RELAY in procs else {}
        start = time.time()
        cluster.sql(f"CALL fill_wal({wal_mb}, {seconds})")
        elapsed = time.time() - start
        cpu1 = {c: cpu_seconds(p.pid) for c, p in procs.items()}
        relay_threads = cpu_by_thread_kind(relay_threads0, thread_cpu_seconds(procs[RELAY].pid)) if RELAY in procs else {}
        if perf:
            perf.send_signal(2)
            perf.wait(60)
        at_end = slot_positions(cluster)
        wal = float(cluster.sql("SELECT sum(pg_wal_lsn_diff(end_lsn, start_lsn)) FROM filler_progress")) / 2**20
        time.sleep(20)
        later = slot_positions(cluster)
        for c, p in procs.items():
            if p.poll() is not None:
                raise SystemExit(f"{c} exited with {p.returncode} during the idle window:\n"
                                 + (peers.log_tail(c) if c in (CDC, POLL) else ""))
            stop_process(p)
        for c in contenders:
            run = {"cpu_seconds": cpu1[c] - cpu0[c], "window_seconds": elapsed, "wal_written_mib": wal}
            run["core_percent"] = 100 * run["cpu_seconds"] / elapsed
            if c == RELAY:
                run["cpu_seconds_by_thread"] = relay_threads
            if c in slots:
                run.update(at_end[slots[c]])
                run.update({f"{k}_20s_later": v for k, v in later[slots[c]].items()})
            runs[c].append(run)
            log(f"    round {r + 1} {c}: {run['cpu_seconds']:.2f} CPU s in {elapsed:.0f} s "
                f"({run['core_percent']:.2f} % of a core)"
                + (f", retained {run['retained_mib']:.0f} MiB (confirmed lag {run['confirmed_lag_mib']:.1f} MiB), "
                   f"20 s later {run['retained_mib_20s_later']:.0f} MiB" if c in slots else "")
                + (f"; by thread: {relay_threads}" if c == RELAY else ""))
        for slot in slots.values():
            cluster.drop_slot(slot)
        cluster.sql("TRUNCATE filler_progress")
        cluster.sql("CHECKPOINT")
    keys = ("cpu_seconds", "core_percent", "retained_mib", "confirmed_lag_mib", "retained_mib_20s_later",
            "confirmed_lag_mib_20s_later", "wal_written_mib")
    return {"seconds": seconds, "wal_mb": wal_mb,
            "contenders": {c: {**{k: median([x.get(k) for x in v]) for k in keys}, "runs": v}
                           for c, v in runs.items()}}


SETUP_SQL = [
    f"{OUTBOX_EVENTS}",
    # Static INSERTs (cached plans) into the relay's outbox or the peers' outbox_events.
    """CREATE PROCEDURE fill_single(n int, tbl text) LANGUAGE plpgsql AS $$
       BEGIN FOR i IN 1..n LOOP
         IF tbl = 'outbox' THEN
           INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
           VALUES ('Order', 'key-' || (i % 1000), 'Created', jsonb_build_object('seq', i, 'pad', repeat('x', 200)));
         ELSE
           INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
           VALUES ('Order', 'key-' || (i % 1000), 'Created', jsonb_build_object('seq', i, 'pad', repeat('x', 200)));
         END IF;
         COMMIT;
       END LOOP; END $$""",
    """CREATE PROCEDURE fill_big(txns int, rows int, tbl text) LANGUAGE plpgsql AS $$
       BEGIN FOR t IN 1..txns LOOP
         IF tbl = 'outbox' THEN
           INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
           SELECT 'Order', 'key-' || (g % 1000), 'Bulk', jsonb_build_object('seq', g, 'pad', repeat('x', 200))
           FROM generate_series(1, rows) g;
         ELSE
           INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
           SELECT 'Order', 'key-' || (g % 1000), 'Bulk', jsonb_build_object('seq', g, 'pad', repeat('x', 200))
           FROM generate_series(1, rows) g;
         END IF;
         COMMIT;
       END LOOP; END $$""",
    # Scenario 5: WAL from another table, at an even pace (kB-sized rows, committed every ~1 MB).
    "CREATE TABLE filler (id bigserial PRIMARY KEY, pad text)",
    "CREATE TABLE filler_progress (start_lsn pg_lsn, end_lsn pg_lsn)",
    """CREATE PROCEDURE fill_wal(total_mb int, duration_s int) LANGUAGE plpgsql AS $$
       DECLARE start_lsn pg_lsn := pg_current_wal_lsn(); t0 timestamptz := clock_timestamp(); due float8;
       BEGIN LOOP
         EXIT WHEN clock_timestamp() - t0 >= make_interval(secs => duration_s);
         due := total_mb * 1048576.0 * extract(epoch FROM clock_timestamp() - t0) / duration_s;
         IF pg_wal_lsn_diff(pg_current_wal_lsn(), start_lsn) < due THEN
           INSERT INTO filler (pad) SELECT repeat('y', 1000) FROM generate_series(1, 1000);
         ELSE
           PERFORM pg_sleep(0.02);
         END IF;
         COMMIT;
       END LOOP;
       INSERT INTO filler_progress VALUES (start_lsn, pg_current_wal_lsn());
       END $$""",
]


def process_status(pid):
    """Threads, VmRSS and VmHWM (MiB) of a process, from /proc/<pid>/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "Threads":
            out["threads"] = int(value)
        elif key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return {"threads": out["threads"], "rss_mib": out["VmRSS"], "peak_rss_mib": out["VmHWM"]}


def threads_by_kind(pid):
    """Thread count by thread name without digits."""
    kinds = {}
    for name, _ in thread_cpu_seconds(pid).values():
        kind = re.sub(r"[-_]?\d+$", "", name)
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def pipelines_run(cluster, broker, work, n, seconds, settle, burst, kafka_properties):
    """One relay process with `n` pipelines: idle CPU, threads and RSS, then after a burst."""
    dbs = [f"pipe_{n}_{i}" for i in range(n)]
    metrics = f"127.0.0.1:{free_port()}"
    toml = [f'[kafka]\nbootstrap_servers = "{broker.bootstrap}"\n']
    if kafka_properties:
        toml.append("[kafka.properties]\n" + "".join(f'"{k}" = "{v}"\n' for k, v in
                                                    (p.split("=", 1) for p in kafka_properties)))
    toml.append(f'[metrics]\nlisten = "{metrics}"\n')
    for db in dbs:
        cluster.sql(f"CREATE DATABASE {db}", db="postgres")
        subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", cluster.url(db), "-f",
                        str(ROOT / "sql" / "outbox.sql")], check=True, stdout=subprocess.DEVNULL)
        cluster.sql(f"SELECT pg_create_logical_replication_slot('{db}', 'pgoutput')", db=db)
        toml.append(f'[[pipelines]]\nname = "{db}"\nsource_url = "{cluster.url(db)}"\nslot = "{db}"\n'
                    f'publication = "outbox_pub"\ntable = "public.outbox"\ncreate_slot = false\n')
    config = work / f"pipelines-{n}.toml"
    config.write_text("".join(toml))
    proc = subprocess.Popen([str(RELAY_BIN), "run", "--config", str(config)],
                            stdout=open(work / f"relay-pipelines-{n}.log", "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "RUST_LOG": "warn"})
    try:
        deadline = time.time() + 120
        while True:
            try:
                if urllib.request.urlopen(f"http://{metrics}/readyz", timeout=1).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"relay with {n} pipelines exited with {proc.returncode}: "
                                 f"see {work / f'relay-pipelines-{n}.log'}")
            if time.time() > deadline:
                raise SystemExit(f"/readyz of the relay with {n} pipelines not ready within 120 s")
            time.sleep(0.2)
        time.sleep(settle)
        cpu0, threads0, start = cpu_seconds(proc.pid), thread_cpu_seconds(proc.pid), time.time()
        time.sleep(seconds)
        cpu1, threads1, elapsed = cpu_seconds(proc.pid), thread_cpu_seconds(proc.pid), time.time() - start
        idle = process_status(proc.pid)
        run = {"pipelines": n, "window_seconds": elapsed, "cpu_seconds": cpu1 - cpu0,
               "core_percent": 100 * (cpu1 - cpu0) / elapsed, "idle": idle,
               "cpu_seconds_by_thread": cpu_by_thread_kind(threads0, threads1),
               "threads_by_kind": threads_by_kind(proc.pid)}
        for db in dbs:
            cluster.sql(f"DO $$ BEGIN FOR i IN 1..{burst} LOOP "
                        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES "
                        f"('Order', 'key-' || (i % 1000), 'Created', jsonb_build_object('seq', i, 'pad', '{PAD}')); "
                        "COMMIT; END LOOP; END $$", db=db)
        deadline = time.time() + 300
        while published_total(metrics) < n * burst:
            if time.time() > deadline:
                raise SystemExit(f"{published_total(metrics)} of {n * burst} events published within 300 s")
            time.sleep(0.1)
        run["after_burst"] = process_status(proc.pid)
        log(f"    {n} pipelines: {run['cpu_seconds']:.2f} CPU s in {elapsed:.0f} s idle "
            f"({run['core_percent']:.2f} % of a core), {idle['threads']} threads, {idle['rss_mib']:.1f} MiB RSS; "
            f"after {n} x {burst} events {run['after_burst']['rss_mib']:.1f} MiB "
            f"(peak {run['after_burst']['peak_rss_mib']:.1f}), {run['after_burst']['threads']} threads; "
            f"CPU by thread: {run['cpu_seconds_by_thread']}; threads: {run['threads_by_kind']}")
        return run
    finally:
        stop_process(proc, 60)
        for db in dbs:
            cluster.drop_slot(db)
            cluster.sql(f"DROP DATABASE {db}", db="postgres")


def published_total(metrics):
    """The sum of outbox_relay_events_published_total over every pipeline (0 while it does not answer)."""
    try:
        text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=1).read().decode()
    except OSError:
        return 0
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("outbox_relay_events_published_total"))


def pipelines_scenario(cluster, broker, work, counts, seconds, settle, burst, rounds, kafka_properties):
    """Scenario 7: per round, a relay for each pipeline count in `counts` (alternating order)."""
    broker.fresh()
    runs = {n: [] for n in counts}
    for r in range(rounds):
        for n in ordered(counts, r):
            runs[n].append(pipelines_run(cluster, broker, work, n, seconds, settle, burst, kafka_properties))
    med = lambda xs: median(xs)
    return {"seconds": seconds, "burst": burst,
            "counts": {str(n): {"core_percent": med([x["core_percent"] for x in v]),
                                "threads": med([x["idle"]["threads"] for x in v]),
                                "rss_mib": med([x["idle"]["rss_mib"] for x in v]),
                                "rss_mib_after_burst": med([x["after_burst"]["rss_mib"] for x in v]),
                                "peak_rss_mib": med([x["after_burst"]["peak_rss_mib"] for x in v]),
                                "runs": v}
                       for n, v in runs.items()}}


def parse_lsn(text):
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def exactly_once_cost_scenario(cluster, work, txns, per_txn, rounds, only_modes=None):
    """Scenario 6, what exactly-once costs: per round and mode (at-least-once and exactly-once,
    in alternating order), a fresh mock cluster (bench/mock_broker.rs: librdkafka's mock
    cluster, the one broker here with Kafka transactions) with Order.events and the checkpoint
    topic, a new slot, `txns` transactions of `per_txn` rows written while nothing reads, then
    the relay from its start until its confirmed flush LSN (outbox_relay_confirmed_flush_lsn_bytes)
    reaches the end of that WAL. Start-up is until the first event is published (exactly-once's
    includes reading the checkpoint); the rate is over the rest. The walsender decodes the
    backlog meanwhile, so a longer start-up gives the drain a head start: the total rate (relay
    start to confirmation) is reported too. `only_modes`: run only these modes. Exactly-once runs with its
    default batches, and once more with one PostgreSQL transaction per Kafka transaction
    (`exactly_once_max_batch_transactions = 1`, no linger: the cost before batching, but
    reading on while a commit is pending), from a config file."""
    modes = {"at-least-once": [], "exactly-once": ["--exactly-once"],
             "exactly-once-unbatched": {"exactly_once_max_batch_transactions": 1,
                                        "exactly_once_batch_linger_ms": 0}}
    if only_modes:
        modes = {m: a for m, a in modes.items() if m in only_modes}
    runs = {m: [] for m in modes}
    events = txns * per_txn
    for r in range(rounds):
        for mode in (list(modes) if r % 2 == 0 else list(reversed(modes))):
            proc, bootstrap = start_mock_broker(work, ["Order.events", CHECKPOINT_TOPIC])
            relay = None
            try:
                slot = f"eoscost_{r}_{mode.replace('-', '_')}"
                cluster.sql("TRUNCATE outbox")
                cluster.sql(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
                cluster.sql(f"CALL fill_big({txns}, {per_txn}, 'outbox')")
                endpos = parse_lsn(cluster.sql("SELECT pg_current_wal_lsn()"))
                start = time.time()
                config = None
                if isinstance(modes[mode], dict):
                    config = work / f"relay-{slot}.toml"
                    options = "".join(f"{k} = {v}\n" for k, v in modes[mode].items())
                    config.write_text(f"""[kafka]\nbootstrap_servers = "{bootstrap}"\n\n[[pipelines]]\nname = "bench"
source_url = "{cluster.url()}"\nslot = "{slot}"\npublication = "outbox_pub"\ntable = "public.outbox"
create_slot = false\nexactly_once = true\n{options}""")
                relay = Relay(work, cluster, argparse.Namespace(bootstrap=bootstrap), slot,
                              [] if config else modes[mode], config=config)
                first_event = None
                while True:
                    text = relay.metrics_text()
                    if first_event is None and re.search(r"^outbox_relay_events_published_total\S* [1-9]", text, re.M):
                        first_event = time.time()
                    confirmed = re.search(r"^outbox_relay_confirmed_flush_lsn_bytes\S* (\d+)", text, re.M)
                    if confirmed and int(confirmed.group(1)) >= endpos:
                        break
                    if relay.proc.poll() is not None:
                        raise SystemExit(f"relay ({mode}) exited with {relay.proc.returncode}: see {work}/relay-{slot}.log")
                    if time.time() - start > 900:
                        raise SystemExit(f"relay ({mode}) did not confirm {events:,} events within 900 s")
                    time.sleep(0.01)
                end = time.time()
                first_event = first_event or end
                run = {"startup_seconds": first_event - start, "drain_seconds": end - first_event,
                       "events_per_second": events / max(end - first_event, 1e-9),
                       "total_events_per_second": events / max(end - start, 1e-9),
                       "ms_per_transaction": (end - first_event) * 1000 / txns,
                       "cpu_seconds": cpu_seconds(relay.proc.pid)}
                runs[mode].append(run)
                log(f"  round {r + 1}, {mode}: {run['events_per_second']:,.0f} events/s, "
                    f"{run['ms_per_transaction']:.2f} ms per transaction, start-up {run['startup_seconds']:.1f} s, "
                    f"{run['total_events_per_second']:,.0f} events/s from the relay's start")
            finally:
                if relay:
                    relay.stop()
                stop_process(proc)
            cluster.drop_slot(slot)
    return {"transactions": txns, "rows_per_transaction": per_txn,
            "modes": {m: {"events_per_second": median([x["events_per_second"] for x in rs]),
                          "total_events_per_second": median([x["total_events_per_second"] for x in rs]),
                          "ms_per_transaction": median([x["ms_per_transaction"] for x in rs]),
                          "startup_seconds": median([x["startup_seconds"] for x in rs]),
                          "runs": rs} for m, rs in runs.items()}}


def fmt_eps(v, partial=False):
    return "-" if v is None else f"{v:,.0f} ev/s" + (" (partial)" if partial else "")


def fmt_ms(v):
    return "-" if v is None else f"{v:.1f}"


def print_table(results, args):
    drains = [k for k in ("backlog", "big_transactions") if k in results]
    contenders = CONTENDERS
    present = [c for c in contenders if any(c in results[k] for k in drains)
               or any(c in s["contenders"] for s in results.get("steady", []))
               or c in results.get("idle", {}).get("contenders", {})
               or c in results.get("one_big_transaction", {}) or (c == RELAY and "one_big_transaction" in results)]
    if present:  # scenarios 1-5 ran; 6-8 print lines of their own
        print("| scenario | " + " | ".join(present) + " | relay / lower limit |")
        print("|---|" + "---|" * len(present) + "---|")
    labels = {"backlog": f"1. backlog, {args.backlog:,} single-row txns", "big_transactions": f"2. 20 txns x {args.bigtx_rows:,} rows"}
    for k in drains:
        d = results[k]
        cells = [fmt_eps(d[c]["events_per_second"], d[c]["partial"]) + (
            f" ({d[c]['ratio_to_lower_limit']:.2f})" if d[c]["ratio_to_lower_limit"] and c not in LIMITS else "")
            if c in d else "-" for c in present]
        ratio = d.get(RELAY, {}).get("ratio_to_lower_limit")
        print(f"| {labels[k]} | " + " | ".join(cells) + (f" | **{ratio:.2f}** |" if ratio else " | - |"))
    def steady_cell(x):
        cell = f"{fmt_ms(x['p50_ms'])} / {fmt_ms(x['p99_ms'])} / {fmt_ms(x['max_ms'])} ms"
        if x["missed_max"] > 0:
            cell += f" ({x['missed_max']:,} not received in time)"
        if x["duplicates_max"] > 0:
            cell += f" ({x['duplicates_max']:,} duplicates)"
        if x["written_min"] < 0.97 * x["target"]:
            cell += f" (pgbench wrote {x['written_min']:,} of {x['target']:,})"
        return cell

    def idle_cell(x):
        cell = f"{x['core_percent']:.2f} % of a core"
        if x.get("retained_mib") is not None:
            cell += (f", retained {x['retained_mib']:.0f} MiB (confirmed lag {x['confirmed_lag_mib']:.1f}); "
                     f"20 s later {x['retained_mib_20s_later']:.0f} MiB")
        return cell

    # One cell per contender present in the run, "-" for those without a result here.
    row = lambda contenders, cell: [cell(contenders[c]) if contenders.get(c) else "-" for c in present]
    for s in results.get("steady", []):
        cells = row(s["contenders"], steady_cell)
        print(f"| 3. steady {s['rate']:,} ev/s, commit -> consumer p50 / p99 / max | " + " | ".join(cells) + " | - |")
    if "one_big_transaction" in results:
        b = results["one_big_transaction"]
        limit = min(b[c]["events_per_second"] for c in LIMITS if c in b)
        cells = {c: fmt_eps(b[c]["events_per_second"]) for c in LIMITS if c in b}
        cells[RELAY] = f"{fmt_eps(b['events_per_second'])}, peak RSS {b['peak_rss_mib']:.0f} MiB"
        print(f"| 4. one txn of {b['rows']:,} rows | " + " | ".join(cells.get(c, "-") for c in present)
              + f" | {b['events_per_second'] / limit:.2f} |")
    if "idle" in results:
        i = results["idle"]
        cells = row(i["contenders"], idle_cell)
        wal = next(iter(i["contenders"].values()))["wal_written_mib"]
        print(f"| 5. idle {i['seconds']} s, {wal:.0f} MiB of other WAL | "
              + " | ".join(cells) + " | - |")
    if "exactly_once_cost" in results:
        e = results["exactly_once_cost"]
        cells = [f"{m}: {x['events_per_second']:,.0f} ev/s, {x['ms_per_transaction']:.2f} ms/txn"
                 + (f", {x['total_events_per_second']:,.0f} ev/s from the start" if "total_events_per_second" in x else "")
                 for m, x in e["modes"].items()]
        ratios = ""
        if "exactly-once" in e["modes"] and "at-least-once" in e["modes"]:
            eos, alo = e["modes"]["exactly-once"], e["modes"]["at-least-once"]
            ratios = f" (exactly-once / at-least-once: {eos['events_per_second'] / alo['events_per_second']:.2f}"
            if "total_events_per_second" in eos:
                ratios += f", from the start {eos['total_events_per_second'] / alo['total_events_per_second']:.2f}"
            ratios += ")"
        print(f"\n6. exactly-once cost, backlog of {e['transactions']} txns x {e['rows_per_transaction']} rows on the mock "
              f"cluster: {'; '.join(cells)}{ratios}")
    if "sinks" in results:
        print()
        sinks.print_rows(results["sinks"])
    if "pipelines" in results:
        p = results["pipelines"]
        print(f"\n8. pipelines in one process, {p['seconds']} s idle; then {p['burst']} events per pipeline:\n")
        print("| pipelines | idle CPU | threads | RSS idle | RSS after the burst (peak) |")
        print("|---|---|---|---|---|")
        for n, x in p["counts"].items():
            print(f"| {n} | {x['core_percent']:.2f} % of a core | {x['threads']:.0f} | {x['rss_mib']:.1f} MiB | "
                  f"{x['rss_mib_after_burst']:.1f} MiB ({x['peak_rss_mib']:.1f}) |")
    m = results["machine"]
    print(f"\n(medians of {args.rounds} alternating rounds, scenario 4 one round; {m['cores']} cores, load average "
          f"{' '.join(m['load_before'])} before and {' '.join(m['load_after'])} after; broker: {results.get('broker', BROKERS['tansu'])}; "
          f"ratios in parentheses are to the lower of the two limits; bench/results.json)")


SCENARIOS = ("backlog", "bigtx", "steady", "onebig", "idle", "eoscost", "sinks", "pipelines")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--rates", default="1000,5000", help="steady-load rates, events/s, comma-separated")
    ap.add_argument("--steady-secs", type=int, default=60)
    ap.add_argument("--bigtx-rows", type=int, default=5_000, help="rows in each of scenario 2's 20 transactions")
    ap.add_argument("--big", type=int, default=1_000_000)
    ap.add_argument("--idle-secs", type=int, default=60)
    ap.add_argument("--idle-wal-mb", type=int, default=500)
    ap.add_argument("--eos-txns", type=int, default=300, help="scenario 6: transactions in the backlog")
    ap.add_argument("--eos-rows", type=int, default=10, help="scenario 6: rows per transaction")
    ap.add_argument("--sink", action="append", default=[], choices=list(sinks.SINKS),
                    help="scenario 7: only these sink kinds (repeatable; default: all four)")
    ap.add_argument("--eos-modes", default="at-least-once,exactly-once,exactly-once-unbatched",
                    help="scenario 6: modes to run, comma-separated")
    ap.add_argument("--pipelines", default="1,10,50", help="scenario 8: pipeline counts, comma-separated")
    ap.add_argument("--pipelines-idle-secs", type=int, default=60, help="scenario 8: the idle window")
    ap.add_argument("--pipelines-settle", type=int, default=10,
                    help="scenario 8: seconds after /readyz before the idle window")
    ap.add_argument("--pipelines-burst", type=int, default=200, help="scenario 8: transactions per pipeline")
    ap.add_argument("--relay-bin", type=Path, metavar="PATH",
                    help="run this relay binary (e.g. an older build, side by side) instead of building one")
    ap.add_argument("--no-setup-deps", action="store_true",
                    help="do not run tests/setup-deps.sh (PostgreSQL 15 and tansu are there already)")
    ap.add_argument("--peer-timeout", type=int, default=60,
                    help="seconds a peer relay may take to drain a backlog before it is stopped and scored")
    ap.add_argument("--no-peers", action="store_true", help="without the reference relays in PEERS_DIR")
    ap.add_argument("--only", action="append", default=[], choices=SCENARIOS, help="run only these scenarios")
    ap.add_argument("--skip", action="append", default=[], choices=SCENARIOS, help="scenario to skip")
    ap.add_argument("--contender", action="append", default=[], choices=CONTENDERS,
                    help="run only these contenders (scenario 4 always runs the relay and pg_recvlogical)")
    ap.add_argument("--perf", type=Path, metavar="DIR",
                    help="record the relay with `perf record -g` in scenarios 1, 2 and 5 into DIR/<scenario>-<round>.perf.data")
    ap.add_argument("--print", type=Path, metavar="RESULTS_JSON",
                    help="print the table of an earlier run's results.json and exit")
    ap.add_argument("--broker", choices=sorted(BROKERS), default="tansu",
                    help="tansu (the default), or librdkafka's mock cluster to take the broker's own latency out")
    ap.add_argument("--kafka-property", action="append", default=[],
                    help="key=value, passed to the relay and the producer ceiling")
    ap.add_argument("--partitions", type=int, default=3,
                    help="partitions of every bench topic (default 3; librdkafka sends one request per partition)")
    ap.add_argument("--exactly-once", action="store_true",
                    help="scenario 3: the relay with --exactly-once (needs --broker mock)")
    args = ap.parse_args()
    if args.print:
        results = json.loads(args.print.read_text())
        results["machine"].setdefault("load_after", ["?"] * 3)
        print_table(results, argparse.Namespace(**results["args"]))
        return
    Broker.kind = args.broker
    if args.partitions < 1:
        ap.error(f"--partitions must be at least 1, not {args.partitions}")
    Broker.partitions = args.partitions
    if args.exactly_once:
        if args.broker != "mock":
            ap.error("--exactly-once needs --broker mock: tansu has no Kafka transactions")
        Relay.steady_args = ["--exactly-once"]
    for prop in args.kafka_property:
        Relay.extra_args += ["--kafka-property", prop]
    if args.contender:
        SELECTED.intersection_update(args.contender)
    if args.perf:
        global PERF_DIR
        PERF_DIR = args.perf.resolve()
        PERF_DIR.mkdir(parents=True, exist_ok=True)
    run = lambda s: s not in args.skip and (not args.only or s in args.only)

    if not args.no_setup_deps:
        subprocess.run([str(ROOT / "tests" / "setup-deps.sh"), "--no-pg-matrix"], check=True,
                       stdout=subprocess.DEVNULL)
    # Scenario 8 alone needs neither the examples nor bench/.venv.
    relay_only = all(not run(s) or s == "pipelines" for s in SCENARIOS)
    examples = [] if relay_only else ["--example", "producer_ceiling", "--example", "mock_broker",
                                        "--example", "rabbitmq_ceiling", "--example", "http_receiver",
                                        "--example", "http_ceiling", "--example", "nats_ceiling"]
    log("building outbox-relay" + ("" if relay_only else " and bench/producer_ceiling.rs") + " (release)")
    if args.relay_bin:
        global RELAY_BIN
        RELAY_BIN = args.relay_bin.resolve()
    if not args.relay_bin or examples:
        subprocess.run(["cargo", "build", "--release", "--locked",
                        *([] if args.relay_bin else ["--bin", "outbox-relay"]), *examples],
                       cwd=ROOT, check=True)
    if not relay_only:
        venv_python()  # the latency consumer, and the peers
    work = Path(tempfile.mkdtemp(prefix="outbox-relay-bench."))
    cluster = broker = None
    results = {"machine": {"cores": os.cpu_count(), "load_before": uptime()}, "broker": BROKERS[args.broker],
               "command": " ".join(sys.argv), "kafka_properties": args.kafka_property,
               "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    try:
        cluster = Cluster(work)
        cluster.sql("CREATE DATABASE bench", db="postgres")
        subprocess.run(["psql", "-X", "-q", cluster.url(), "-f", str(ROOT / "sql" / "outbox.sql")], check=True)
        for statement in SETUP_SQL:
            cluster.sql(statement)
        broker = Broker(work)
        peers = Peers(cluster, broker, work, not args.no_peers and not relay_only)
        save = lambda: (ROOT / "bench" / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        log(f"contenders: {', '.join(selected([RECV, CEIL, RELAY, *peers.contenders()]))}")
        if run("backlog"):
            log(f"scenario 1: backlog of {args.backlog:,} single-row transactions")
            results["backlog"] = drain_scenario("backlog", cluster, broker, peers, work,
                                                f"CALL fill_single({args.backlog}, '{{table}}')", args.backlog,
                                                args.rounds, args.peer_timeout)
            save()
        if run("bigtx"):
            log(f"scenario 2: 20 transactions of {args.bigtx_rows:,} rows")
            results["big_transactions"] = drain_scenario("bigtx", cluster, broker, peers, work,
                                                         f"CALL fill_big(20, {args.bigtx_rows}, '{{table}}')",
                                                         20 * args.bigtx_rows,
                                                         args.rounds, args.peer_timeout)
            save()
        if run("steady"):
            results["steady"] = []
            for rate in (int(r) for r in args.rates.split(",")):
                log(f"scenario 3: {rate:,} events/s for {args.steady_secs} s")
                results["steady"].append(latency_scenario(cluster, broker, peers, work, rate, args.steady_secs,
                                                          args.rounds, grace=15))
                save()
        if run("onebig"):
            log(f"scenario 4: one transaction of {args.big:,} rows")
            results["one_big_transaction"] = big_scenario(cluster, broker, work, args.big)
            save()
        if run("idle"):
            log(f"scenario 5: {args.idle_secs} s without outbox writes, {args.idle_wal_mb} MB of other WAL")
            results["idle"] = idle_scenario(cluster, broker, peers, work, args.idle_secs, args.idle_wal_mb,
                                            args.rounds)
            save()
        if run("eoscost"):
            log(f"scenario 6: exactly-once against at-least-once, {args.eos_txns} txns x {args.eos_rows} rows "
                "on the mock cluster")
            results["exactly_once_cost"] = exactly_once_cost_scenario(cluster, work, args.eos_txns, args.eos_rows,
                                                                      args.rounds, args.eos_modes.split(","))
            save()
        if run("sinks"):
            kinds = list(dict.fromkeys(args.sink)) or list(sinks.SINKS)
            log(f"scenario 7: backlog of {args.backlog:,} single-row transactions into {', '.join(kinds)}")
            results["sinks"] = sinks.sink_scenario(ROOT, cluster, work, kinds, args.backlog, args.rounds, free_port,
                                                   cpu_seconds, parse_lsn, median, log)
            save()
        if run("pipelines"):
            counts = [int(n) for n in args.pipelines.split(",")]
            log(f"scenario 8: {', '.join(map(str, counts))} pipelines in one process, "
                f"{args.pipelines_idle_secs} s idle, then {args.pipelines_burst} events each")
            results["pipelines"] = pipelines_scenario(cluster, broker, work, counts, args.pipelines_idle_secs,
                                                      args.pipelines_settle, args.pipelines_burst, args.rounds,
                                                      args.kafka_property)
            save()
    finally:
        if broker:
            stop_process(broker.proc)
        if cluster:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)

    results["machine"]["load_after"] = uptime()
    (ROOT / "bench" / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_table(results, args)


if __name__ == "__main__":
    main()
