#!/usr/bin/env python3
"""Benchmarks outbox-relay against the decode-and-stream limit on the same WAL.

    bench/run.py [--rounds 3] [--backlog 100000] [--rate 1000] [--steady-secs 60] [--big 1000000]

Starts its own PostgreSQL 15 cluster (wal_level=logical) and tansu broker, builds the relay in
release mode, and runs each scenario for each contender in alternation (A B A B ...), then
prints medians as a markdown table and writes bench/results.json:

1. backlog: N single-row transactions (~300-byte rows) committed while nothing reads the
   slot; time until the last event is acknowledged by the broker (the relay's
   outbox_relay_events_published_total) or, for pg_recvlogical, until it has read past the
   last commit.
2. big transactions: 20 transactions of 5,000 rows, measured the same way.
3. steady load: RATE events/s for STEADY seconds through pgbench; commit -> consumer receipt
   latency p50/p99/max (payload carries the commit-side clock; same machine, same clock;
   consumer with fetch.wait.max.ms=1 from a venv with confluent-kafka).
4. one transaction of BIG rows: the relay's peak RSS (VmHWM) and drain time.

Contenders: `pg_recvlogical` with pgoutput (decode and stream only, the limit for any pgoutput
client) and outbox-relay (decode, route, publish, wait for acks, confirm). Only Python's
standard library is needed, except scenario 3's consumer (installed into bench/.venv).
"""
import argparse, json, os, shutil, socket, statistics, subprocess, sys, tempfile, time, urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PGBIN = Path(os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin"))
TANSU = Path(os.environ.get("TANSU_BIN", Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")) / "bin" / "tansu"))
PAD = "x" * 200  # ~300-byte outbox rows with the other columns


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(*args):
    print(*args, file=sys.stderr, flush=True)


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
max_replication_slots = 20
max_wal_senders = 20
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


class Broker:
    def __init__(self, work):
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(TANSU), "broker", "--storage-engine", "memory://tansu/",
                                      "--listener-url", f"tcp://{self.bootstrap}",
                                      "--advertised-listener-url", f"tcp://{self.bootstrap}"],
                                     stdout=open(work / "tansu.log", "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("tansu did not start")

    def topic(self, name, partitions=3):
        subprocess.run([str(TANSU), "topic", "create", name, "--partitions", str(partitions),
                        "--broker", f"tcp://{self.bootstrap}"], check=True, stdout=subprocess.DEVNULL)


class Relay:
    """The relay on one slot, with its metrics endpoint."""

    extra_args = []

    def __init__(self, work, cluster, broker, slot, extra=()):
        self.metrics = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [str(ROOT / "target/release/outbox-relay"), "run", "--source-url", cluster.url(), "--slot", slot,
             "--publication", "outbox_pub", "--table", "public.outbox", "--bootstrap-servers", broker.bootstrap,
             "--pipeline-name", "bench", "--no-create-slot", "--metrics-listen", self.metrics,
             *Relay.extra_args, *extra],
            stdout=open(work / f"relay-{slot}.log", "w"), stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": "warn"})

    def published(self):
        try:
            text = urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=1).read().decode()
        except OSError:
            return 0
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


def recvlogical(cluster, slot, endpos):
    subprocess.run([str(PGBIN / "pg_recvlogical"), "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres",
                    "-d", "bench", "--slot", slot, "--start", "-f", "/dev/null", "--no-loop",
                    "-o", "proto_version=1", "-o", "publication_names=outbox_pub", f"--endpos={endpos}"], check=True)


def median(xs):
    return statistics.median(xs) if xs else None


def drain_scenario(name, cluster, broker, work, fill_sql, events, rounds):
    """Creates two slots at one LSN, fills, then drains each (alternating who goes first)."""
    results = {"pg_recvlogical": [], "outbox-relay": []}
    for r in range(rounds):
        cluster.sql("TRUNCATE outbox")
        slots = {c: f"{name}_{r}_{i}" for i, c in enumerate(results)}
        for slot in slots.values():
            cluster.sql(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
        t0 = time.time()
        cluster.sql(fill_sql)
        endpos = cluster.sql("SELECT pg_current_wal_lsn()")
        log(f"  round {r + 1}: wrote {events} events in {time.time() - t0:.1f} s")
        order = list(results) if r % 2 == 0 else list(reversed(results))
        for contender in order:
            start = time.time()
            if contender == "pg_recvlogical":
                recvlogical(cluster, slots[contender], endpos)
            else:
                relay = Relay(work, cluster, broker, slots[contender])
                relay.wait_published(events)
                relay.stop()
            elapsed = time.time() - start
            results[contender].append(elapsed)
            log(f"    {contender}: {elapsed:.2f} s ({events / elapsed:,.0f} events/s)")
        for slot in slots.values():
            cluster.sql(f"SELECT pg_drop_replication_slot('{slot}')")
    return {c: {"seconds": median(v), "events_per_second": events / median(v), "runs": v} for c, v in results.items()}


def venv_python():
    venv = ROOT / "bench" / ".venv"
    python = venv / "bin" / "python"
    if not python.exists():
        log("  installing confluent-kafka into bench/.venv")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "confluent-kafka"], check=True)
    return python


CONSUMER = r"""
import json, sys, time
from confluent_kafka import Consumer, TopicPartition
bootstrap, topic, expected, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency", "fetch.wait.max.ms": 1,
              "enable.auto.commit": False, "auto.offset.reset": "latest"})
parts = c.list_topics(topic, timeout=10).topics[topic].partitions
c.assign([TopicPartition(topic, p, -1) for p in parts])  # from the end: only new records
print("ready", flush=True)
lat, deadline = [], time.time() + timeout
while len(lat) < expected and time.time() < deadline:
    m = c.poll(0.1)
    if m is None or m.error():
        continue
    lat.append((time.time() - json.loads(m.value())["t"]) * 1000)
print(json.dumps(lat))
"""


def latency_scenario(cluster, broker, work, rate, seconds):
    python = venv_python()
    slot = "steady"
    cluster.sql("TRUNCATE outbox")
    cluster.sql(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    relay = Relay(work, cluster, broker, slot)
    time.sleep(2)
    expected = rate * seconds
    consumer = subprocess.Popen([str(python), "-c", CONSUMER, broker.bootstrap, "Steady.events", str(expected),
                                 str(seconds + 60)], stdout=subprocess.PIPE, text=True)
    assert consumer.stdout.readline().strip() == "ready"
    script = work / "steady.sql"
    script.write_text("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES "
                      "('Steady', 'k-' || (random() * 100)::int, 'Tick', "
                      "jsonb_build_object('t', extract(epoch FROM clock_timestamp()), 'pad', repeat('x', 200)));\n")
    subprocess.run([str(PGBIN / "pgbench"), "-n", "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres",
                    "-f", str(script), "-R", str(rate), "-T", str(seconds), "-c", "2", "-j", "2", "bench"],
                   check=True, stdout=subprocess.DEVNULL,
                   # The walsender sends only flushed WAL: with the cluster's synchronous_commit=off a
                   # commit waits up to wal_writer_delay (200 ms) before any reader can see it.
                   env={**os.environ, "PGOPTIONS": "-c synchronous_commit=on"})
    lat = sorted(json.loads(consumer.stdout.readline()))
    consumer.wait(30)
    # Where the time goes: the relay's own view, commit -> broker ack and producer -> ack.
    commit_to_ack_ms = (relay.mean_seconds("outbox_relay_commit_to_ack_latency_seconds") or 0) * 1000
    produce_to_ack_ms = (relay.mean_seconds("outbox_relay_delivery_latency_seconds") or 0) * 1000
    relay.stop()
    cluster.sql(f"SELECT pg_drop_replication_slot('{slot}')")
    pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None
    return {"rate": rate, "seconds": seconds, "received": len(lat), "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "max_ms": lat[-1] if lat else None, "mean_commit_to_ack_ms": commit_to_ack_ms,
            "mean_produce_to_ack_ms": produce_to_ack_ms}


def big_scenario(cluster, broker, work, rows):
    cluster.sql("TRUNCATE outbox")
    cluster.sql("SELECT pg_create_logical_replication_slot('big', 'pgoutput')")
    cluster.sql(f"INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) "
                f"SELECT 'Order', 'key-' || (g % 1000), 'Bulk', jsonb_build_object('seq', g, 'pad', '{PAD}') "
                f"FROM generate_series(1, {rows}) g")
    start = time.time()
    relay = Relay(work, cluster, broker, "big")
    relay.wait_published(rows, timeout=3600)
    elapsed = time.time() - start
    rss = relay.peak_rss_mib()
    relay.stop()
    cluster.sql("SELECT pg_drop_replication_slot('big')")
    return {"rows": rows, "seconds": elapsed, "events_per_second": rows / elapsed, "peak_rss_mib": rss}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--steady-secs", type=int, default=60)
    ap.add_argument("--big", type=int, default=1_000_000)
    ap.add_argument("--skip", action="append", default=[], help="scenario to skip: backlog, bigtx, steady, onebig")
    ap.add_argument("--kafka-property", action="append", default=[], help="passed to the relay, key=value")
    args = ap.parse_args()
    for prop in args.kafka_property:
        Relay.extra_args += ["--kafka-property", prop]

    subprocess.run([str(ROOT / "tests" / "setup-deps.sh")], check=True, stdout=subprocess.DEVNULL)
    log("building outbox-relay (release)")
    subprocess.run(["cargo", "build", "--release", "--locked", "--bin", "outbox-relay"], cwd=ROOT, check=True)
    work = Path(tempfile.mkdtemp(prefix="outbox-relay-bench."))
    cluster = broker = None
    try:
        cluster = Cluster(work)
        cluster.sql("CREATE DATABASE bench", db="postgres")
        subprocess.run(["psql", "-X", "-q", cluster.url(), "-f", str(ROOT / "sql" / "outbox.sql")], check=True)
        cluster.sql("""CREATE PROCEDURE fill_single(n int) LANGUAGE plpgsql AS $$
            BEGIN FOR i IN 1..n LOOP
              INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
              VALUES ('Order', 'key-' || (i % 1000), 'Created', jsonb_build_object('seq', i, 'pad', repeat('x', 200)));
              COMMIT;
            END LOOP; END $$""")
        cluster.sql("""CREATE PROCEDURE fill_big(txns int, rows int) LANGUAGE plpgsql AS $$
            BEGIN FOR t IN 1..txns LOOP
              INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
              SELECT 'Order', 'key-' || (g % 1000), 'Bulk', jsonb_build_object('seq', g, 'pad', repeat('x', 200))
              FROM generate_series(1, rows) g;
              COMMIT;
            END LOOP; END $$""")
        broker = Broker(work)
        for topic in ("Order.events", "Steady.events"):
            broker.topic(topic)
        results = {"machine": {"cores": os.cpu_count()}, "broker": "tansu (memory storage)"}
        if "backlog" not in args.skip:
            log(f"scenario 1: backlog of {args.backlog:,} single-row transactions")
            results["backlog"] = drain_scenario("backlog", cluster, broker, work, f"CALL fill_single({args.backlog})",
                                                args.backlog, args.rounds)
        if "bigtx" not in args.skip:
            log("scenario 2: 20 transactions of 5,000 rows")
            results["big_transactions"] = drain_scenario("bigtx", cluster, broker, work, "CALL fill_big(20, 5000)",
                                                         100_000, args.rounds)
        if "steady" not in args.skip:
            log(f"scenario 3: {args.rate} events/s for {args.steady_secs} s")
            results["steady"] = latency_scenario(cluster, broker, work, args.rate, args.steady_secs)
        if "onebig" not in args.skip:
            log(f"scenario 4: one transaction of {args.big:,} rows")
            results["one_big_transaction"] = big_scenario(cluster, broker, work, args.big)
    finally:
        if broker:
            broker.proc.terminate()
        if cluster:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)

    (ROOT / "bench" / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print("| scenario | pg_recvlogical (limit) | outbox-relay | relay / limit |")
    print("|---|---|---|---|")
    for key, label in (("backlog", f"backlog, {args.backlog:,} single-row txns"), ("big_transactions", "20 txns x 5,000 rows")):
        if key in results:
            lim, rel = results[key]["pg_recvlogical"], results[key]["outbox-relay"]
            print(f"| {label} | {lim['events_per_second']:,.0f} ev/s | {rel['events_per_second']:,.0f} ev/s "
                  f"| {rel['events_per_second'] / lim['events_per_second']:.2f} |")
    if "steady" in results:
        s = results["steady"]
        print(f"| steady {s['rate']} ev/s, commit -> consumer | - | p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms, "
              f"max {s['max_ms']:.1f} ms ({s['received']} received); relay's mean commit -> ack "
              f"{s['mean_commit_to_ack_ms']:.1f} ms, producer -> ack {s['mean_produce_to_ack_ms']:.1f} ms | - |")
    if "one_big_transaction" in results:
        b = results["one_big_transaction"]
        print(f"| one txn of {b['rows']:,} rows | - | {b['events_per_second']:,.0f} ev/s, peak RSS "
              f"{b['peak_rss_mib']:.0f} MiB | - |")
    print(f"\n(medians of {args.rounds} alternating rounds; 2-core machine; tansu broker in memory; bench/results.json)")


if __name__ == "__main__":
    main()
