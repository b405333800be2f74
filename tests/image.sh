#!/usr/bin/env bash
# Builds the release and the runtime image from it, and runs the image against a real
# PostgreSQL and a real Kafka-protocol broker on this machine, with podman:
#
#   1. installs what is missing: podman, runc and debootstrap from apt; PostgreSQL 15 and the
#      tansu broker through tests/setup-deps.sh; podman-compose and confluent-kafka (a Kafka
#      consumer) from PyPI into a venv of its own;
#   2. makes the debian:bookworm-slim base image with debootstrap when podman has none (no
#      registry needed; about 1.5 minutes);
#   3. runs docker/release.sh --allow-dirty (the dist build: about 8 minutes the first time),
#      and checks the tarball: its SHA256SUMS, and the unpacked binary's --version;
#   4. builds docker/Dockerfile's `prebuilt` target from that binary, and checks the image: user
#      10001, labels, health check, the same binary, --version;
#   5. starts a throwaway PostgreSQL 15 cluster and tansu, runs `setup` and then `run` in the
#      image (host network, read-only root, no capabilities, as the Kubernetes manifests do),
#      waits for the health check to pass and /readyz to answer 200, writes outbox rows and reads
#      them back with a Kafka consumer, checks the slot is confirmed past them;
#   6. stops the container (SIGTERM) and checks it drained and exited 0 within the grace period;
#   7. runs the compose demo: docker/compose.yaml with tests/compose/override.yaml, which swaps
#      in stand-in images built here (PostgreSQL 15 from Debian's package for postgres:15, the
#      tansu broker for apache/kafka, the image of step 4 for the from-source build); waits for
#      the relay's health check (/readyz), reads the producer's first three events from
#      Order.events, checks the slot is confirmed past them, then `down -v`. This tests the
#      demo's wiring, ordering and health checks and the relay image, not the apache/kafka and
#      postgres images themselves (no registry here).
#
#   tests/image.sh                # everything; prints each step's time, then "image test passed"
#   tests/image.sh --keep-image   # leave the image outbox-relay:<version>-test and the
#                                 # demo's stand-in images behind
#
# Debian 12, as root (apt-get, debootstrap and rootful podman). Podman runs with runc, cgroupfs
# and no default ulimits, from a containers.conf of its own (CONTAINERS_CONF), so the machine's
# podman settings are left alone. Port 9187 (the image's health check, published by the demo)
# must be free. tests/run.sh runs it last (without arguments): it takes about 1.5 minutes once
# the dist build and the base image exist, about 11 minutes more on a fresh machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
export PATH="${CARGO_HOME:-${HOME:-/root}/.cargo}/bin:$PATH"

KEEP_IMAGE=0
for arg in "$@"; do
  case "$arg" in
    --keep-image) KEEP_IMAGE=1 ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "tests/image.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

BASE_IMAGE=docker.io/library/debian:bookworm-slim
PG_BINDIR=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
# Its own venv: the tools venv of tests/setup-deps.sh holds kubernetes-validate, left as it is.
IMAGE_VENV="${OUTBOX_RELAY_IMAGE_VENV:-/opt/outbox-relay-tests/image-venv}"
METRICS_PORT=9187  # the port the image's HEALTHCHECK probes
CONTAINER=outbox-relay-image-test
SLOT=image_test
DEMO_PROJECT=outbox-relay-image-test  # the compose project of step 7
DEMO_POSTGRES_IMAGE=localhost/outbox-relay-demo-postgres:15  # as tests/compose/override.yaml names them
DEMO_BROKER_IMAGE=localhost/outbox-relay-demo-broker:tansu
COMPOSE=("$IMAGE_VENV/bin/podman-compose" -p "$DEMO_PROJECT" -f docker/compose.yaml -f tests/compose/override.yaml)
STOP_GRACE_SECS=40  # above the relay's drain (shutdown_timeout_secs, 30 s), as compose.yaml

T0=$SECONDS
step_start=$SECONDS
step() {
  [ "$step_start" = "$SECONDS" ] || printf '   (%d s)\n' $((SECONDS - step_start))
  step_start=$SECONDS
  printf '\n== %s\n' "$*"
}
fail() { echo "tests/image.sh: FAILED: $*" >&2; exit 1; }
# Runs "$@" every 0.5 s until it succeeds; fails with $2 after $1 seconds.
wait_for() {
  local secs=$1 what=$2
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.5
  done
  return 0
}
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# The container podman-compose made for service $1.
service_container() {
  podman ps -a --filter "label=com.docker.compose.project=$DEMO_PROJECT" \
    --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | head -n 1
}

[ "$(id -u)" = 0 ] || fail "run as root: it installs packages, runs debootstrap and rootful podman"

WORK=$(mktemp -d /tmp/outbox-relay-image-test.XXXXXX)
PIDS=()
PG_STARTED=0
COMPOSE_UP=0
cleanup() {
  local status=$?
  if [ "$status" -ne 0 ] && podman container exists "$CONTAINER" 2>/dev/null; then
    echo "--- the relay container's log (last 40 lines)" >&2
    podman logs --tail 40 "$CONTAINER" >&2 || true
  fi
  podman rm -f -t 0 "$CONTAINER" >/dev/null 2>&1 || true
  if [ "$COMPOSE_UP" = 1 ]; then
    if [ "$status" -ne 0 ]; then
      for service in outbox-relay producer kafka postgres; do
        echo "--- the demo's $service log (last 15 lines)" >&2
        podman logs --tail 15 "$(service_container "$service")" 2>&1 | cut -c1-300 >&2 || true
      done
    fi
    timeout 120 "${COMPOSE[@]}" down -v -t 0 >/dev/null 2>&1 || true
  fi
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
  if [ "$PG_STARTED" = 1 ]; then
    (cd / && runuser -u postgres -- "$PG_BINDIR/pg_ctl" -D "$WORK/pg/data" -m immediate stop) >/dev/null 2>&1 || true
  fi
  if [ "$KEEP_IMAGE" = 0 ] && [ -n "${IMAGE:-}" ]; then
    podman rmi -f "$IMAGE" "$DEMO_POSTGRES_IMAGE" "$DEMO_BROKER_IMAGE" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# 1 ---------------------------------------------------------------------------------------------
step "installing what is missing (podman, runc, debootstrap; PostgreSQL 15, tansu; podman-compose, confluent-kafka)"
missing=()
for p in podman runc debootstrap; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
tests/setup-deps.sh --no-pg-matrix --no-sink-servers --no-deploy-tools
# A Kafka consumer (confluent-kafka's wheel carries a current librdkafka: Debian's kcat has
# librdkafka 2.0, which fails tansu's ApiVersions answer) and podman-compose, from PyPI.
if [ ! -x "$IMAGE_VENV/bin/podman-compose" ] || ! "$IMAGE_VENV/bin/python" -c 'import confluent_kafka' 2>/dev/null; then
  [ -x "$IMAGE_VENV/bin/pip" ] || python3 -m venv "$IMAGE_VENV" \
    || fail "python3 cannot make a venv at $IMAGE_VENV (apt-get install python3-venv)"
  echo "pip install podman-compose confluent-kafka (into $IMAGE_VENV)"
  "$IMAGE_VENV/bin/pip" install -q podman-compose==1.6.0 confluent-kafka==2.16.2
fi
# The settings podman needs on these machines: runc (crun refuses a hybrid cgroup layout),
# cgroupfs (no systemd), no default ulimits (podman's exceed the hard limits).
cat >"$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
EOF
export CONTAINERS_CONF="$WORK/containers.conf"
# The Kafka consumer (librdkafka through confluent-kafka) of steps 5 and 7.
cat >"$WORK/consume.py" <<'PY'
import json, sys, time
from confluent_kafka import Consumer, TopicPartition

# consume.py BOOTSTRAP TOPIC ROWS [exact|contains]: reads every partition of TOPIC from the
# beginning for up to 30 s. ROWS is a JSON list of [key, value, id header, event_type header].
# exact: the records are ROWS, in that order (reads 3 s more after as many records, for one
# that must not come); contains: ROWS are among the records (stops once all arrived).
bootstrap, topic, rows = sys.argv[1], sys.argv[2], sys.argv[3]
mode = sys.argv[4] if len(sys.argv) > 4 else "exact"
want = [tuple(row) for row in json.loads(rows)]
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "image-test", "enable.auto.commit": False})
partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
got, deadline = [], time.monotonic() + 30
while time.monotonic() < deadline:
    m = consumer.poll(0.2)
    if m is None:
        continue
    if m.error():
        print(f"consumer: {m.error()}", file=sys.stderr)
        continue
    headers = {k: v.decode() for k, v in (m.headers() or [])}
    record = {"key": m.key().decode(), "value": m.value().decode(), "headers": headers}
    print(json.dumps(record))
    got.append((record["key"], record["value"], headers.get("id"), headers.get("event_type")))
    if mode == "exact" and len(got) == len(want):
        deadline = min(deadline, time.monotonic() + 3)
    if mode == "contains" and set(want) <= set(got):
        break
consumer.close()
if (got != want) if mode == "exact" else not set(want) <= set(got):
    print(f"consumer: got {got},\nwant ({mode}; key, value, id, event_type) {want}", file=sys.stderr)
    sys.exit(1)
PY
echo "$(podman --version), $(runc --version | head -n 1)"

# 2 ---------------------------------------------------------------------------------------------
step "base image $BASE_IMAGE"
if podman image exists "$BASE_IMAGE"; then
  echo "found"
else
  echo "none: making it with debootstrap --variant=minbase bookworm"
  debootstrap --variant=minbase bookworm "$WORK/rootfs" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -n 20 "$WORK/debootstrap.log" >&2; fail "debootstrap failed (log above)"; }
  # Trimmed as the official slim image is: no package cache, lists, manuals or translations,
  # and dpkg leaves them out of later installs too.
  rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/* \
    "$WORK"/rootfs/usr/share/man/* "$WORK"/rootfs/usr/share/locale/* "$WORK"/rootfs/usr/share/info/*
  find "$WORK/rootfs/usr/share/doc" -type f ! -name copyright -delete
  cat >"$WORK/rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
  tar -C "$WORK/rootfs" -c . | podman import - "$BASE_IMAGE" >/dev/null
  rm -rf "$WORK/rootfs"
  echo "imported ($(podman image inspect --format '{{.Size}}' "$BASE_IMAGE") bytes)"
fi

# 3 ---------------------------------------------------------------------------------------------
step "release: docker/release.sh --allow-dirty"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
docker/release.sh --allow-dirty --out "$WORK/artifacts"
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
BIN="$TARGET_DIR/dist/outbox-relay"
# --version says "outbox-relay <version> (commit <commit>)".
COMMIT=$("$BIN" --version | sed -n 's/.*(commit \(.*\))$/\1/p')
[ -n "$COMMIT" ] || fail "$BIN --version names no commit: $("$BIN" --version)"
NAME="outbox-relay-$VERSION-x86_64-unknown-linux-gnu"
(cd "$WORK/artifacts" && sha256sum --quiet -c SHA256SUMS) || fail "the tarball does not match SHA256SUMS"
mkdir "$WORK/unpacked"
tar -C "$WORK/unpacked" -xzf "$WORK/artifacts/$NAME.tar.gz"
(cd "$WORK/unpacked/$NAME" && sha256sum --quiet -c SHA256SUMS) || fail "the unpacked files do not match their SHA256SUMS"
for f in outbox-relay LICENSE README.md CHANGELOG.md sql/outbox.sql examples/relay.toml \
  deploy/systemd/outbox-relay.service docs/README.md; do
  [ -e "$WORK/unpacked/$NAME/$f" ] || fail "the tarball has no $NAME/$f"
done
"$WORK/unpacked/$NAME/outbox-relay" --version | grep -qx "outbox-relay $VERSION (commit $COMMIT)" \
  || fail "the unpacked binary's --version: $("$WORK/unpacked/$NAME/outbox-relay" --version)"
echo "tarball: $(stat -c %s "$WORK/artifacts/$NAME.tar.gz") bytes, binary $(stat -c %s "$BIN") bytes, commit $COMMIT"

# 4 ---------------------------------------------------------------------------------------------
step "image: docker/Dockerfile --target prebuilt"
# The prebuilt target copies target/dist/outbox-relay from the build context (the repository).
if [ "$(realpath "$BIN")" != "$ROOT/target/dist/outbox-relay" ]; then
  mkdir -p target/dist
  cp "$BIN" target/dist/outbox-relay
fi
IMAGE="localhost/outbox-relay:$VERSION-test"
# --format docker: an OCI image has no place for HEALTHCHECK, and podman would drop it.
podman build --network host --format docker -f docker/Dockerfile --target prebuilt \
  --build-arg "VERSION=$VERSION" --build-arg "REVISION=$COMMIT" -t "$IMAGE" . >"$WORK/build.log" 2>&1 \
  || { tail -n 30 "$WORK/build.log" >&2; fail "podman build failed (log above)"; }
inspect() { podman image inspect --format "$1" "$IMAGE"; }
[ "$(inspect '{{.Config.User}}')" = "10001:10001" ] || fail "image user is '$(inspect '{{.Config.User}}')', want 10001:10001"
for label in "version=$VERSION" "revision=$COMMIT" "licenses=Apache-2.0"; do
  got=$(inspect "{{index .Config.Labels \"org.opencontainers.image.${label%%=*}\"}}")
  [ "$got" = "${label#*=}" ] || fail "label org.opencontainers.image.${label%%=*} is '$got', want '${label#*=}'"
done
inspect '{{.Config.Healthcheck.Test}}' | grep -q 'probe --url http://127.0.0.1:9187/healthz' \
  || fail "the image's health check is '$(inspect '{{.Config.Healthcheck.Test}}')'"
in_image=$(podman run --rm --no-healthcheck --network none --entrypoint /usr/bin/sha256sum "$IMAGE" /usr/local/bin/outbox-relay | cut -d' ' -f1)
[ "$in_image" = "$(sha256sum "$BIN" | cut -d' ' -f1)" ] || fail "the image's binary is not $BIN"
printed=$(podman run --rm --no-healthcheck --network none "$IMAGE" --version)
[ "$printed" = "outbox-relay $VERSION (commit $COMMIT)" ] || fail "the image's --version printed '$printed'"
echo "$IMAGE: $(inspect '{{.Size}}') bytes, user 10001, --version: $printed"

# 5 ---------------------------------------------------------------------------------------------
step "PostgreSQL 15 and tansu on 127.0.0.1"
! port_in_use "$METRICS_PORT" || fail "port $METRICS_PORT is in use: the image's health check needs it"
PGPORT=$(free_port)
mkdir -p "$WORK/pg"
chown postgres "$WORK" "$WORK/pg"
(cd / && runuser -u postgres -- "$PG_BINDIR/initdb" -D "$WORK/pg/data" -U postgres --auth=trust) >/dev/null
cat >>"$WORK/pg/data/postgresql.conf" <<CONF
wal_level = logical
port = $PGPORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK/pg'
CONF
(cd / && runuser -u postgres -- "$PG_BINDIR/pg_ctl" -D "$WORK/pg/data" -l "$WORK/pg/log" -w -t 30 start) >/dev/null \
  || { tail -n 20 "$WORK/pg/log" >&2; fail "PostgreSQL did not start within 30 s"; }
PG_STARTED=1
PSQL=(psql -X -q -v ON_ERROR_STOP=1)
"${PSQL[@]}" -h 127.0.0.1 -p "$PGPORT" -U postgres -c "CREATE DATABASE shop"
SOURCE_URL="postgres://postgres@127.0.0.1:$PGPORT/shop"
"${PSQL[@]}" "$SOURCE_URL" -f sql/outbox.sql

KPORT=$(free_port)
BOOTSTRAP="127.0.0.1:$KPORT"
env -u RUST_LOG tansu broker --storage-engine memory://tansu/ --listener-url "tcp://$BOOTSTRAP" \
  --advertised-listener-url "tcp://$BOOTSTRAP" >"$WORK/broker.log" 2>&1 &
PIDS+=($!)
wait_for 30 "tansu" port_in_use "$KPORT" || { tail -n 20 "$WORK/broker.log" >&2; fail "tansu did not listen on $BOOTSTRAP within 30 s"; }
tansu topic create Order.events --partitions 3 --broker "tcp://$BOOTSTRAP" >/dev/null
echo "PostgreSQL on 127.0.0.1:$PGPORT (database shop, sql/outbox.sql), tansu on $BOOTSTRAP (topic Order.events)"

step "outbox-relay setup, then run, in the image"
# As the Kubernetes manifests run it: read-only root, no capabilities, no privilege escalation.
RUN_OPTS=(--network host --read-only --cap-drop ALL --security-opt no-new-privileges
  -e "OUTBOX_RELAY_SOURCE_URL=$SOURCE_URL" -e OUTBOX_RELAY_SLOT=$SLOT
  -e OUTBOX_RELAY_PUBLICATION=outbox_pub -e OUTBOX_RELAY_TABLE=public.outbox
  -e "OUTBOX_RELAY_BOOTSTRAP_SERVERS=$BOOTSTRAP" -e RUST_LOG=info)
timeout 60 podman run --rm --no-healthcheck "${RUN_OPTS[@]}" "$IMAGE" setup >"$WORK/setup.log" 2>&1 \
  || { cat "$WORK/setup.log" >&2; fail "outbox-relay setup in the image failed or took over 60 s (log above)"; }
[ "$("${PSQL[@]}" -At "$SOURCE_URL" -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$SLOT'")" = 1 ] \
  || fail "setup exited 0 but slot $SLOT does not exist"
podman rm -f -t 0 "$CONTAINER" >/dev/null 2>&1 || true  # left by a run that was killed
# Podman runs HEALTHCHECK from a systemd timer; without systemd it says so (in podman.log) and
# the check is run here by hand, as the timer would, until it passes.
podman run -d --name "$CONTAINER" "${RUN_OPTS[@]}" \
  -e "OUTBOX_RELAY_METRICS_LISTEN=127.0.0.1:$METRICS_PORT" "$IMAGE" run --no-create-slot \
  >/dev/null 2>"$WORK/podman.log" || { cat "$WORK/podman.log" >&2; fail "podman run failed"; }
wait_for 60 "health check" podman healthcheck run "$CONTAINER" \
  || fail "the container's health check (/healthz) did not pass within 60 s"
health=$(podman inspect --format '{{.State.Health.Status}}' "$CONTAINER" 2>/dev/null \
  || podman inspect --format '{{.State.Healthcheck.Status}}' "$CONTAINER")
[ "$health" = healthy ] || fail "podman says the container is '$health' after a passing health check"
wait_for 60 "/readyz" podman exec "$CONTAINER" /usr/local/bin/outbox-relay probe \
  --url "http://127.0.0.1:$METRICS_PORT/readyz" \
  || fail "/readyz did not answer 200 within 60 s (the pipeline is not streaming)"
echo "container $CONTAINER: $health, /readyz 200"

step "outbox rows in, records out (a librdkafka consumer)"
"${PSQL[@]}" "$SOURCE_URL" <<'SQL'
BEGIN;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Order', 'o-42', 'OrderCreated', '{"orderId": "o-42", "total": 12.50}');
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Order', 'o-42', 'OrderPaid', '{"orderId": "o-42"}');
COMMIT;
BEGIN;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Order', 'o-43', 'OrderCreated', '{"orderId": "o-43"}');
ROLLBACK;
SQL
WRITTEN_UP_TO=$("${PSQL[@]}" -At "$SOURCE_URL" -c "SELECT pg_current_wal_lsn()")
# A consumer with librdkafka (confluent-kafka): every partition from the beginning, for the two
# committed records, then 3 s more for one that must not come (the rolled-back row).
# The rows as PostgreSQL stored them (jsonb orders the keys): the records must carry them byte
# for byte, in commit order, with the row's id in the id header.
ROWS=$("${PSQL[@]}" -At "$SOURCE_URL" -c "SELECT json_agg(json_build_array(aggregate_id, payload::text, id, event_type) ORDER BY ctid) FROM outbox")
"$IMAGE_VENV/bin/python" "$WORK/consume.py" "$BOOTSTRAP" Order.events "$ROWS" >"$WORK/records.txt" 2>"$WORK/consumer.log" \
  || { cat "$WORK/records.txt" "$WORK/consumer.log" >&2; fail "the records in Order.events are not the two committed rows"; }
cat "$WORK/records.txt"
slot_confirmed() {
  [ "$("${PSQL[@]}" -At "$SOURCE_URL" -c "SELECT confirmed_flush_lsn >= '$WRITTEN_UP_TO' FROM pg_replication_slots WHERE slot_name = '$SLOT'")" = t ]
}
wait_for 10 "slot confirmed" slot_confirmed \
  || fail "slot $SLOT not confirmed up to $WRITTEN_UP_TO within 10 s"
echo "2 committed events arrived in order, the rolled-back one did not; slot confirmed past $WRITTEN_UP_TO"

# 6 ---------------------------------------------------------------------------------------------
step "podman stop (SIGTERM): drain and exit 0"
stop_start=$SECONDS
podman stop --time "$STOP_GRACE_SECS" "$CONTAINER" >/dev/null 2>>"$WORK/podman.log"
took=$((SECONDS - stop_start))
code=$(podman inspect --format '{{.State.ExitCode}}' "$CONTAINER")
podman logs --tail 3 "$CONTAINER" 2>&1 | cut -c1-200
[ "$code" = 0 ] || fail "the relay exited with $code after SIGTERM, want 0 (137: killed after the $STOP_GRACE_SECS s grace period)"
[ "$took" -lt "$STOP_GRACE_SECS" ] || fail "the stop took $took s, the grace period is $STOP_GRACE_SECS s"
echo "exited 0 in $took s"

# 7 ---------------------------------------------------------------------------------------------
step "the compose demo: docker/compose.yaml with stand-in images (tests/compose/override.yaml)"
# No registry: PostgreSQL 15 from Debian's package stands in for postgres:15, tansu for
# apache/kafka, the image of step 4 for the from-source build (tests/compose/*.Dockerfile).
podman build --network host --format docker -f tests/compose/postgres.Dockerfile \
  -t "$DEMO_POSTGRES_IMAGE" tests/compose >"$WORK/build-postgres.log" 2>&1 \
  || { tail -n 30 "$WORK/build-postgres.log" >&2; fail "building the PostgreSQL stand-in failed (log above)"; }
mkdir "$WORK/broker"
cp "$(command -v tansu)" tests/compose/broker-entrypoint.sh "$WORK/broker/"
podman build --network host --format docker -f tests/compose/broker.Dockerfile \
  -t "$DEMO_BROKER_IMAGE" "$WORK/broker" >"$WORK/build-broker.log" 2>&1 \
  || { tail -n 30 "$WORK/build-broker.log" >&2; fail "building the tansu stand-in failed (log above)"; }
! port_in_use "$METRICS_PORT" || fail "port $METRICS_PORT is in use: the demo publishes the relay's metrics there"
OUTBOX_RELAY_IMAGE=$IMAGE timeout 120 "${COMPOSE[@]}" down -v -t 0 >/dev/null 2>&1 || true  # left by a run that was killed
COMPOSE_UP=1
export OUTBOX_RELAY_IMAGE=$IMAGE  # tests/compose/override.yaml's relay image
# Podman runs health checks from systemd timers, and there is no systemd here: this loop runs
# them as the timers would, so a podman that waits for `condition: service_healthy` (4.6 and
# later) sees them pass. Podman 4.3 does not wait (podman-compose says it ignores the
# conditions): the relay and the producer must cope with starting first, and do.
(while :; do
   for c in $(podman ps -q --filter "label=com.docker.compose.project=$DEMO_PROJECT"); do
     podman healthcheck run "$c" >/dev/null 2>&1 || true
   done
   sleep 2
 done) &
PIDS+=($!)
timeout 300 "${COMPOSE[@]}" up -d >"$WORK/compose-up.log" 2>&1 \
  || { tail -n 30 "$WORK/compose-up.log" >&2; fail "podman-compose up failed or took over 300 s (log above)"; }
for service in postgres kafka outbox-relay producer; do
  [ -n "$(service_container "$service")" ] || fail "podman-compose up made no container for service $service"
done
RELAY_CONTAINER=$(service_container outbox-relay)
PG_CONTAINER=$(service_container postgres)
# The health checks are compose.yaml's own (/readyz for the relay), the broker's excepted.
wait_for 120 "broker health" podman healthcheck run "$(service_container kafka)" \
  || fail "the kafka service's health check did not pass within 120 s"
wait_for 180 "relay health" podman healthcheck run "$RELAY_CONTAINER" \
  || fail "the outbox-relay service's health check (/readyz) did not pass within 180 s: its pipeline does not stream"
demo_sql() { podman exec "$PG_CONTAINER" psql -X -q -At -v ON_ERROR_STOP=1 -U app -d app -c "$1"; }
three_events() { [ "$(demo_sql "SELECT count(*) FROM outbox")" -ge 3 ]; }
wait_for 60 "producer" three_events \
  || fail "the producer wrote $(demo_sql "SELECT count(*) FROM outbox" || echo no) outbox rows within 60 s of the relay streaming, want 3"
# Its first three events, the first one included: it starts writing once the slot exists, so
# none is lost. The consumer runs on the demo's network, where kafka:9092 resolves, with this
# machine's python and the venv mounted (the base image has no python).
ROWS=$(demo_sql "SELECT json_agg(json_build_array(aggregate_id, payload::text, id, event_type)) FROM (SELECT * FROM outbox ORDER BY (payload->>'n')::int LIMIT 3) r")
WRITTEN_UP_TO=$(demo_sql "SELECT pg_current_wal_lsn()")
NETWORK=$(podman inspect --format '{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}' "$RELAY_CONTAINER" | cut -d' ' -f1)
PY_PREFIX=$("$IMAGE_VENV/bin/python" -c 'import sys; print(sys.base_prefix)')
timeout 90 podman run --rm --network "$NETWORK" -v /usr:/usr:ro -v "$PY_PREFIX:$PY_PREFIX:ro" \
  -v "$IMAGE_VENV:$IMAGE_VENV:ro" -v "$WORK/consume.py:/consume.py:ro" "$BASE_IMAGE" \
  "$IMAGE_VENV/bin/python" /consume.py kafka:9092 Order.events "$ROWS" contains \
  >"$WORK/demo-records.txt" 2>"$WORK/demo-consumer.log" \
  || { tail -n 5 "$WORK/demo-records.txt" >&2; cat "$WORK/demo-consumer.log" >&2
       fail "the producer's first three events did not all arrive on Order.events (key, payload, id and event_type headers) within 30 s"; }
head -n 3 "$WORK/demo-records.txt"
demo_confirmed() {
  [ "$(demo_sql "SELECT confirmed_flush_lsn >= '$WRITTEN_UP_TO' FROM pg_replication_slots WHERE slot_name = 'outbox_relay'")" = t ]
}
wait_for 30 "demo slot confirmed" demo_confirmed \
  || fail "slot outbox_relay not confirmed up to $WRITTEN_UP_TO within 30 s (at $(demo_sql "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outbox_relay'"))"
echo "the producer's first 3 events arrived with their keys, payloads and ids; slot outbox_relay confirmed past $WRITTEN_UP_TO"
timeout 180 "${COMPOSE[@]}" down -v -t "$STOP_GRACE_SECS" >"$WORK/compose-down.log" 2>&1 \
  || { tail -n 20 "$WORK/compose-down.log" >&2; fail "podman-compose down failed or took over 180 s (log above)"; }
COMPOSE_UP=0
left=$(podman ps -a -q --filter "label=com.docker.compose.project=$DEMO_PROJECT")
[ -z "$left" ] || fail "podman-compose down left containers: $left"
left=$(podman volume ls -q --filter "label=com.docker.compose.project=$DEMO_PROJECT")
[ -z "$left" ] || fail "podman-compose down -v left volumes: $left"
! podman network exists "$NETWORK" || fail "podman-compose down left the network $NETWORK"
echo "down: no containers, volumes or network left"

step "done"
echo "image test passed in $((SECONDS - T0)) s"
