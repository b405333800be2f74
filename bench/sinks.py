"""Scenario 7 of bench/run.py: a backlog drained into each sink kind other than Kafka (Redis
Streams, NATS JetStream, RabbitMQ, HTTP webhooks), against a bare client of that sink as its
ceiling. `bench/run.py --only sinks [--sink KIND]...` (KIND: redis, nats, rabbitmq, http;
default all four; the backlog is --backlog events for every kind).

Per sink and round: a fresh server of that kind (its data in the bench's work directory), a new
slot, N single-row transactions (scenario 1's rows) committed while nothing reads, then
- outbox-relay with that sink (a config file: `[pipelines.sink] kind = ...`) from its start
  until its confirmed flush LSN reaches the end of that WAL: every event acknowledged; then
  the count check: the sink holds at least N of the relay's events in `Order.events`;
- the ceiling: the sink's own bare client sending N records of the same size with the
  acknowledgement the relay waits for, into a destination of its own (`ceiling`), timed from
  its start to its exit, then counted the same way.
The two alternate (forward in even rounds, reversed in odd ones); the ratio is the relay's
events/s over the ceiling's. The relay publishes one key's events one at a time (docs/how-to/sinks/README.md) and reads and decodes the WAL as well, so its ceiling is a bound, not a target.

A sink kind is a class with `kind`, `client` (the ceiling, for the printed rows),
`start(work)`, `stop()`, `settings()` (the sink table's TOML lines), `ceiling(events,
payload_bytes)` (seconds for N records; `Server` times `bare_client` and counts) and
`count(destination)`; SINKS lists them. Results go under "sinks", one entry per kind; result
files from before RabbitMQ and HTTP moved here ("rabbitmq_backlog", "http") print without
those rows.
"""
import os, re, shutil, socket, subprocess, time, urllib.request
from pathlib import Path

PAYLOAD_BYTES = 230  # scenario 1's rows: {"seq": n, "pad": "x" * 200} and an id header
EXAMPLES = Path(__file__).resolve().parent.parent / "target/release/examples"


def wait_until(ready, seconds, what):
    """Polls `ready()` every 50 ms until it is true; exits naming `what` after `seconds`."""
    deadline = time.time() + seconds
    while not ready():
        if time.time() > deadline:
            raise SystemExit(f"{what} did not start within {seconds} s")
        time.sleep(0.05)


def accepts(port):
    """Whether 127.0.0.1:`port` accepts a TCP connection."""
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


class Server:
    """What the sink kinds share: a port, their processes (stopped last first, their output in
    <work>/<kind>.log) and the timed, counted ceiling."""

    def __init__(self, free_port):
        self.free_port = free_port
        self.port = free_port()
        self.procs = []

    def spawn(self, work, command, env=None):
        self.procs.append(subprocess.Popen(command, env=env, stdout=open(work / f"{self.kind}.log", "a"),
                                           stderr=subprocess.STDOUT))

    def stop(self):
        while self.procs:
            proc = self.procs.pop()
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def ceiling(self, events, payload_bytes):
        """Seconds the bare client takes for `events` records, from its start to its exit.
        Exits if fewer than `events` arrived in `ceiling`."""
        start = time.time()
        self.bare_client(events, payload_bytes)
        seconds = time.time() - start
        stored = self.count("ceiling")
        if stored < events:
            raise SystemExit(f"{self.kind}: the ceiling stored {stored:,} of {events:,} records")
        return seconds


class RedisSink(Server):
    """redis-server with the persistence a production server has by default with AOF (fsync
    every second); the ceiling: redis-benchmark, 4 connections pipelining 64 XADDs each (256 in
    flight, the relay's default max_concurrency) with the relay's fields."""
    kind = "redis"
    client = "redis-benchmark, 256 pipelined XADDs"

    def start(self, work):
        data = work / f"redis-{self.port}"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir()
        self.spawn(work, ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(data),
                          "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no"])
        wait_until(lambda: self.cli("PING") == "PONG", 30, "redis-server")

    def cli(self, *command):
        return subprocess.run(["redis-cli", "-p", str(self.port), *command], capture_output=True,
                              text=True).stdout.strip()

    def settings(self):
        return f'url = "redis://127.0.0.1:{self.port}"'

    def bare_client(self, events, payload_bytes):
        subprocess.run(["redis-benchmark", "-p", str(self.port), "-n", str(events), "-c", "4", "-P", "64", "-q",
                        "XADD", "ceiling", "*", "id", "0b0e4e4e-8d7e-4b7c-9d8b-1f1f1f1f1f1f", "event_type", "Created",
                        "key", "key-1", "payload", "x" * payload_bytes],
                       check=True, stdout=subprocess.DEVNULL)

    def count(self, destination):
        return int(self.cli("XLEN", destination) or 0)


class NatsSink(Server):
    """nats-server with JetStream (file storage in the work directory); streams OUTBOX
    (`*.events`, what the relay publishes) and CEILING (`ceiling`), made by
    bench/nats_ceiling.rs; the ceiling publishes with 256 awaiting their PubAck."""
    kind = "nats"
    client = "bench/nats_ceiling.rs, 256 awaiting their PubAck"
    tool = EXAMPLES / "nats_ceiling"

    def url(self):
        return f"nats://127.0.0.1:{self.port}"

    def start(self, work):
        data = work / f"nats-{self.port}"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir()
        self.spawn(work, ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(data)])
        wait_until(lambda: subprocess.run([str(self.tool), self.url(), "create", "OUTBOX", "*.events"],
                                          capture_output=True).returncode == 0, 30, "nats-server")
        subprocess.run([str(self.tool), self.url(), "create", "CEILING", "ceiling"], check=True)

    def settings(self):
        return f'url = "{self.url()}"'

    def bare_client(self, events, payload_bytes):
        subprocess.run([str(self.tool), self.url(), "publish", "ceiling", str(events), "256"], check=True)

    def count(self, destination):
        stream = "CEILING" if destination == "ceiling" else "OUTBOX"
        out = subprocess.run([str(self.tool), self.url(), "count", stream, destination],
                             capture_output=True, text=True, check=True).stdout.strip()
        return int(out or 0)


class RabbitSink(Server):
    """A rabbitmq-server node of the bench's own, as tests/support/rabbitmq.rs starts one: its
    own epmd, node name, ports and Mnesia under the work directory, no plugins; a durable topic
    exchange `outbox` with durable queues `Order.events` and `ceiling`, each bound by its name.
    The relay publishes persistent messages with publisher confirms; the ceiling,
    bench/rabbitmq_ceiling.rs, the same number of like messages with 256 awaiting their confirm
    (the relay's max_concurrency) and no per-key order."""
    kind = "rabbitmq"
    client = "bench/rabbitmq_ceiling.rs: lapin, confirms, 256 in flight"
    tool = EXAMPLES / "rabbitmq_ceiling"

    def start(self, work):
        node = work / f"rabbitmq-{self.port}"
        for sub in ("home", "mnesia", "log"):
            (node / sub).mkdir(parents=True)
        epmd, dist = self.free_port(), self.free_port()
        self.spawn(work, ["epmd", "-port", str(epmd)])
        wait_until(lambda: accepts(epmd), 30, "epmd")
        (node / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users = none\n")
        (node / "enabled_plugins").write_text("[].\n")
        env = {**os.environ, "RUNNING_UNDER_SYSTEMD": "true", "HOME": str(node / "home"),
               "ERL_EPMD_PORT": str(epmd), "RABBITMQ_NODENAME": f"bench-{self.port}@localhost",
               "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(self.port),
               "RABBITMQ_DIST_PORT": str(dist), "RABBITMQ_MNESIA_BASE": str(node / "mnesia"),
               "RABBITMQ_LOG_BASE": str(node / "log"), "RABBITMQ_CONFIG_FILE": str(node / "rabbitmq.conf"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(node / "enabled_plugins")}
        self.spawn(work, ["/usr/lib/rabbitmq/bin/rabbitmq-server"], env=env)
        wait_until(lambda: accepts(self.port), 120, "rabbitmq-server")
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2f"
        for queue in ("Order.events", "ceiling"):
            self.run_tool(queue, "declare")

    def run_tool(self, queue, *command):
        """bench/rabbitmq_ceiling.rs on exchange `outbox` and `queue` (= its routing key)."""
        return subprocess.run([str(self.tool), self.url, "outbox", queue, *command],
                              check=True, capture_output=True, text=True).stdout

    def settings(self):
        return f'url = "{self.url}"\nexchange = "outbox"'

    def bare_client(self, events, payload_bytes):
        self.run_tool("ceiling", "publish", str(events))

    def count(self, destination):
        return int(self.run_tool(destination, "count").strip())


class HttpSink(Server):
    """bench/http_receiver.rs (200 to every POST, counted by path) taking the relay's posts at
    /hooks/{destination} (its default max_concurrency of 16); the ceiling, bench/http_ceiling.rs,
    posts bodies of a row's size to /hooks/ceiling with 16 requests in flight."""
    kind = "http"
    client = "bench/http_ceiling.rs: reqwest, 16 in flight"

    def start(self, work):
        self.spawn(work, [str(EXAMPLES / "http_receiver"), str(self.port)])
        wait_until(lambda: accepts(self.port), 30, "bench/http_receiver.rs")

    def settings(self):
        return f'url = "http://127.0.0.1:{self.port}/hooks/{{destination}}"'

    def bare_client(self, events, payload_bytes):
        subprocess.run([str(EXAMPLES / "http_ceiling"), f"http://127.0.0.1:{self.port}/hooks/ceiling", str(events),
                        "16", str(payload_bytes)], check=True, stdout=subprocess.DEVNULL)

    def count(self, destination):
        return int(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/hooks/{destination}", timeout=5).read())


SINKS = {s.kind: s for s in (RedisSink, NatsSink, RabbitSink, HttpSink)}


def relay_config(work, cluster, slot, sink, metrics):
    """A config file for one pipeline on `slot` publishing to `sink`."""
    path = work / f"relay-{sink.kind}-{slot}.toml"
    path.write_text(f"""[metrics]
listen = "{metrics}"

[[pipelines]]
name = "bench"
source_url = "{cluster.url()}"
slot = "{slot}"
publication = "outbox_pub"
table = "public.outbox"
create_slot = false
slot_record = false
[pipelines.sink]
kind = "{sink.kind}"
{sink.settings()}
""")
    return path


def drain_with_relay(root, work, cluster, sink, slot, endpos, events, free_port, cpu_seconds):
    """Runs the relay on `slot` until its confirmed flush LSN reaches `endpos`; returns seconds
    from its start and its CPU seconds. Exits if fewer than `events` arrived in Order.events."""
    metrics = f"127.0.0.1:{free_port()}"
    config = relay_config(work, cluster, slot, sink, metrics)
    start = time.time()
    proc = subprocess.Popen([str(root / "target/release/outbox-relay"), "run", "--config", str(config)],
                            stdout=open(work / f"relay-{slot}.log", "w"), stderr=subprocess.STDOUT,
                            env={"RUST_LOG": "warn", "PATH": "/usr/bin:/bin"})
    try:
        while True:
            try:
                text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=1).read().decode()
            except OSError:
                text = ""
            confirmed = re.search(r"^outbox_relay_confirmed_flush_lsn_bytes\S* (\d+)", text, re.M)
            if confirmed and int(confirmed.group(1)) >= endpos:
                break
            if proc.poll() is not None:
                raise SystemExit(f"relay ({sink.kind}) exited with {proc.returncode}: see {work}/relay-{slot}.log")
            if time.time() - start > 900:
                raise SystemExit(f"relay ({sink.kind}) did not confirm {events:,} events within 900 s")
            time.sleep(0.01)
        seconds = time.time() - start
        cpu = cpu_seconds(proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)
    stored = sink.count("Order.events")
    if stored < events:
        raise SystemExit(f"{sink.kind}: {stored:,} of {events:,} events in Order.events")
    return seconds, cpu


def sink_scenario(root, cluster, work, kinds, events, rounds, free_port, cpu_seconds, parse_lsn, median, log):
    """Scenario 7 for each of `kinds`; returns {kind: {events, relay_events_per_second,
    ceiling_events_per_second, ratio, runs}}."""
    results = {}
    for kind in kinds:
        runs = []
        for r in range(rounds):
            sink = SINKS[kind](free_port)
            slot = f"sink_{kind}_{r}"
            try:
                sink.start(work)
                cluster.sql("TRUNCATE outbox")
                cluster.sql(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
                cluster.sql(f"CALL fill_single({events}, 'outbox')")
                endpos = parse_lsn(cluster.sql("SELECT pg_current_wal_lsn()"))
                run = {}
                for contender in (["relay", "ceiling"] if r % 2 == 0 else ["ceiling", "relay"]):
                    if contender == "relay":
                        seconds, cpu = drain_with_relay(root, work, cluster, sink, slot, endpos, events, free_port,
                                                        cpu_seconds)
                        run["relay"] = {"seconds": seconds, "events_per_second": events / seconds, "cpu_seconds": cpu}
                    else:
                        seconds = sink.ceiling(events, PAYLOAD_BYTES)
                        run["ceiling"] = {"seconds": seconds, "events_per_second": events / seconds}
                run["ratio"] = run["relay"]["events_per_second"] / run["ceiling"]["events_per_second"]
                runs.append(run)
                log(f"  {kind} round {r + 1}: relay {run['relay']['events_per_second']:,.0f} ev/s "
                    f"(CPU {run['relay']['cpu_seconds']:.1f} s), ceiling {run['ceiling']['events_per_second']:,.0f} ev/s, "
                    f"ratio {run['ratio']:.2f}")
            finally:
                sink.stop()
                cluster.drop_slot(slot)
        results[kind] = {"events": events,
                         "relay_events_per_second": median([x["relay"]["events_per_second"] for x in runs]),
                         "ceiling_events_per_second": median([x["ceiling"]["events_per_second"] for x in runs]),
                         "ratio": median([x["ratio"] for x in runs]), "runs": runs}
    return results


def print_rows(results):
    for kind, x in results.items():
        client = SINKS[kind].client if kind in SINKS else "bare client"
        print(f"7. {kind} sink, backlog of {x['events']:,} single-row txns: relay {x['relay_events_per_second']:,.0f} ev/s, "
              f"bare client ({client}) {x['ceiling_events_per_second']:,.0f} ev/s "
              f"(relay / bare client: {x['ratio']:.2f})")
