"""Scenario 7a of bench/run.py: a backlog drained into a sink kind other than Kafka (Redis Streams,
NATS JetStream; RabbitMQ and HTTP are scenarios 7b and 7c in run.py itself), against a
bare client of that sink as its ceiling.

Per sink and round: a fresh server of that kind (its data in the bench's work directory), a new
slot, N single-row transactions (scenario 1's rows) committed while nothing reads, then
- outbox-relay with that sink (a config file: `[pipelines.sink] kind = ...`) from its start
  until its confirmed flush LSN reaches the end of that WAL: every event acknowledged;
- the ceiling: the sink's own benchmark client publishing N records of the same size with the
  acknowledgement the relay waits for (Redis: `redis-benchmark` pipelining XADD; NATS:
  bench/nats_ceiling.rs, async-nats with 256 awaiting their PubAck).
The two alternate (forward in even rounds, reversed in odd ones); the ratio is the relay's
events/s over the ceiling's. The relay publishes one key's events one at a time (README,
Sinks) and reads and decodes the WAL as well, so its ceiling is a bound, not a target.

A sink kind is a class with `kind`, `start(work)`, `stop()`, `settings()` (the sink table's
TOML lines), `ceiling(events, payload_bytes)` (seconds for N records) and `count(destination)`;
SINKS lists them.
"""
import re, shutil, subprocess, time
from pathlib import Path

PAYLOAD_BYTES = 230  # scenario 1's rows: {"seq": n, "pad": "x" * 200} and an id header


class RedisSink:
    kind = "redis"

    def __init__(self, free_port):
        self.port = free_port()
        self.proc = None

    def start(self, work):
        self.dir = work / f"redis-{self.port}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir()
        # The persistence a production server has by default with AOF: fsync every second.
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no"],
            stdout=open(work / "redis.log", "a"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while subprocess.run(["redis-cli", "-p", str(self.port), "PING"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            if time.time() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.05)

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc = None

    def settings(self):
        return f'url = "redis://127.0.0.1:{self.port}"'

    def ceiling(self, events, payload_bytes):
        """redis-benchmark: 4 connections pipelining 64 XADDs each (256 in flight, the relay's default
        max_concurrency), with the relay's fields."""
        start = time.time()
        subprocess.run(["redis-benchmark", "-p", str(self.port), "-n", str(events), "-c", "4", "-P", "64", "-q",
                        "XADD", "ceiling", "*", "id", "0b0e4e4e-8d7e-4b7c-9d8b-1f1f1f1f1f1f", "event_type", "Created",
                        "key", "key-1", "payload", "x" * payload_bytes],
                       check=True, stdout=subprocess.DEVNULL)
        seconds = time.time() - start
        if self.count("ceiling") < events:
            raise SystemExit(f"redis-benchmark wrote {self.count('ceiling')} of {events} entries")
        return seconds

    def count(self, destination):
        out = subprocess.run(["redis-cli", "-p", str(self.port), "XLEN", destination], capture_output=True,
                             text=True, check=True).stdout.strip()
        return int(out or 0)


class NatsSink:
    """nats-server with JetStream (file storage in the work directory); streams OUTBOX
    (`*.events`, what the relay publishes) and CEILING (`ceiling`), made by
    bench/nats_ceiling.rs; the ceiling publishes with 256 awaiting their PubAck."""
    kind = "nats"

    def __init__(self, free_port):
        self.port = free_port()
        self.proc = None
        self.ceiling_bin = Path(__file__).resolve().parent.parent / "target/release/examples/nats_ceiling"

    def url(self):
        return f"nats://127.0.0.1:{self.port}"

    def start(self, work):
        self.dir = work / f"nats-{self.port}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir()
        self.proc = subprocess.Popen(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port),
                                      "-sd", str(self.dir)],
                                     stdout=open(work / "nats.log", "a"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while subprocess.run([str(self.ceiling_bin), self.url(), "create", "OUTBOX", "*.events"],
                             capture_output=True).returncode != 0:
            if time.time() > deadline:
                raise SystemExit("nats-server did not start")
            time.sleep(0.1)
        subprocess.run([str(self.ceiling_bin), self.url(), "create", "CEILING", "ceiling"], check=True)

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc = None

    def settings(self):
        return f'url = "{self.url()}"'

    def ceiling(self, events, payload_bytes):
        start = time.time()
        subprocess.run([str(self.ceiling_bin), self.url(), "publish", "ceiling", str(events), "256"], check=True)
        seconds = time.time() - start
        if self.count("ceiling") < events:
            raise SystemExit(f"the NATS ceiling stored {self.count('ceiling')} of {events} messages")
        return seconds

    def count(self, destination):
        stream = "CEILING" if destination == "ceiling" else "OUTBOX"
        out = subprocess.run([str(self.ceiling_bin), self.url(), "count", stream, destination],
                             capture_output=True, text=True, check=True).stdout.strip()
        return int(out or 0)


SINKS = {"redis": RedisSink, "nats": NatsSink}


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
    from its start and its CPU seconds."""
    import urllib.request
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
    if sink.count("Order.events") < events:
        raise SystemExit(f"{sink.kind}: {sink.count('Order.events')} of {events} events in Order.events")
    return seconds, cpu


def sink_scenario(root, cluster, work, kinds, events, rounds, free_port, cpu_seconds, parse_lsn, median, log):
    """Scenario 7 for each of `kinds`; returns {kind: {relay, ceiling, ratio, runs}}."""
    results = {}
    for kind in kinds:
        runs = []
        for r in range(rounds):
            sink = SINKS[kind](free_port)
            sink.start(work)
            slot = f"sink_{kind}_{r}"
            try:
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
        print(f"7. {kind} sink, backlog of {x['events']:,} single-row txns: relay {x['relay_events_per_second']:,.0f} ev/s, "
              f"bare client {x['ceiling_events_per_second']:,.0f} ev/s (relay / bare client: {x['ratio']:.2f})")
