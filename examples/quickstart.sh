#!/usr/bin/env bash
# Runs outbox-relay end to end on this machine: installs what is missing, starts a throwaway
# PostgreSQL 15 cluster (wal_level=logical) and a local Kafka-protocol broker (tansu), creates
# the outbox, starts the relay, writes sample business transactions with outbox rows and
# shows the events arriving in their topics. Everything is stopped and removed on exit.
#
#   examples/quickstart.sh                 # all local
#   examples/quickstart.sh --keep          # leave Postgres, broker and relay running
#   examples/quickstart.sh --source-url postgres://me:pw@db:5432/app --bootstrap-servers kafka:9092
#       (an existing database that already has sql/outbox.sql applied, and an existing broker)
set -euo pipefail
cd "$(dirname "$0")/.."

SOURCE_URL=""
BOOTSTRAP=""
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --source-url) SOURCE_URL="$2"; shift 2 ;;
    --bootstrap-servers) BOOTSTRAP="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

# An existing database given with --source-url keeps nothing of the demo's slot, even when
# the run fails: a slot nobody reads holds WAL on that server for good.
EXTERNAL_DB=0
[ -n "$SOURCE_URL" ] && EXTERNAL_DB=1
RELAY_PID=""
SLOT_DROPPED=0

step() { printf '\n== %s\n' "$*"; }
# A port nothing listens on (a random one in 20000-59999 that refuses a connection).
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}

step "installing what is missing (PostgreSQL 15, build tools, tansu broker)"
tests/setup-deps.sh --no-pg-matrix --no-sink-servers --no-deploy-tools
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

step "building outbox-relay"
cargo build --locked --bin outbox-relay --example tail
TARGET_DIR=${CARGO_TARGET_DIR:-target}
RELAY=$TARGET_DIR/debug/outbox-relay

WORK=$(mktemp -d /tmp/outbox-relay-quickstart.XXXXXX)
PIDS=()
PGBIN=/usr/lib/postgresql/15/bin
# initdb refuses to run as root: run the server as the postgres user (from /, which it can read).
as_pg() { if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi; }
# Stops the relay with signal $1 (TERM: it drains in-flight deliveries and confirms the LSN;
# KILL after a failure: the slot goes anyway), then drops slot quickstart and its row in the
# slot record (see docs/concepts/guarantees.md, "A slot is never silently replaced": the row
# would refuse a later quickstart against the same database; the demo slot's loss is intended). Returns non-zero
# if the slot or the row could not be dropped.
drop_demo_slot() {
  if [ -n "$RELAY_PID" ]; then
    kill "-$1" "$RELAY_PID" 2>/dev/null || true
    wait "$RELAY_PID" 2>/dev/null || true
  fi
  # Dropping fails while the walsender still holds the slot: try for 5 s.
  local dropped=1
  for _ in $(seq 50); do
    "${PSQL[@]}" "$SOURCE_URL" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'quickstart'" >/dev/null 2>&1 \
      && { dropped=0; break; }
    sleep 0.1
  done
  [ "$dropped" = 0 ] || return 1
  "${PSQL[@]}" "$SOURCE_URL" >/dev/null 2>&1 <<'SQL' || return 1
DO $$ BEGIN
  IF to_regclass('outbox_relay.streamed_slots') IS NOT NULL THEN
    DELETE FROM outbox_relay.streamed_slots WHERE slot_name = 'quickstart';
  END IF;
END $$;
SQL
  SLOT_DROPPED=1
}
cleanup() {
  if [ "$KEEP" = 1 ]; then
    printf '\nLeft running (--keep). Work dir: %s\nHealth and metrics: http://%s/readyz, http://%s/metrics\nStop everything: kill %s; %s\n' \
      "$WORK" "${METRICS:-}" "${METRICS:-}" "${PIDS[*]:-}" "${PGDATA_STOP:-}"
    return
  fi
  if [ "$EXTERNAL_DB" = 1 ] && [ -n "$RELAY_PID" ] && [ "$SLOT_DROPPED" = 0 ]; then
    # A second Ctrl-C must not leave the slot behind: this takes at most a few seconds.
    trap '' INT
    echo "the run did not finish: dropping slot quickstart and its slot record row" >&2
    drop_demo_slot KILL || echo "could not drop them: run SELECT pg_drop_replication_slot('quickstart'); DELETE FROM outbox_relay.streamed_slots WHERE slot_name = 'quickstart'; on that database" >&2
  fi
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
  if [ -n "${PGDATA_STOP:-}" ]; then eval "$PGDATA_STOP" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

PSQL=(psql -X -q -v ON_ERROR_STOP=1)
if [ -z "$SOURCE_URL" ]; then
  step "starting a throwaway PostgreSQL 15 cluster (wal_level=logical)"
  PGPORT=$(free_port)
  mkdir -p "$WORK/pg"
  [ "$(id -u)" = 0 ] && chown postgres "$WORK" "$WORK/pg"
  as_pg "$PGBIN/initdb" -D "$WORK/pg/data" -U postgres --auth=trust >/dev/null
  cat >> "$WORK/pg/data/postgresql.conf" <<CONF
wal_level = logical
port = $PGPORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK/pg'
CONF
  as_pg "$PGBIN/pg_ctl" -D "$WORK/pg/data" -l "$WORK/pg/log" -w start >/dev/null
  PGDATA_STOP="cd / && runuser -u postgres -- $PGBIN/pg_ctl -D $WORK/pg/data -m fast stop"
  [ "$(id -u)" = 0 ] || PGDATA_STOP="$PGBIN/pg_ctl -D $WORK/pg/data -m fast stop"
  "${PSQL[@]}" -h 127.0.0.1 -p "$PGPORT" -U postgres -c "CREATE DATABASE shop"
  SOURCE_URL="postgres://postgres@127.0.0.1:$PGPORT/shop"
  "${PSQL[@]}" "$SOURCE_URL" -f sql/outbox.sql
  echo "PostgreSQL on 127.0.0.1:$PGPORT, database shop, outbox table and publication outbox_pub from sql/outbox.sql"
fi

# The demo's business table (also in an existing database given with --source-url).
"${PSQL[@]}" "$SOURCE_URL" -c "CREATE TABLE IF NOT EXISTS quickstart_orders (id text PRIMARY KEY, state text NOT NULL, total numeric NOT NULL)"

if [ -z "$BOOTSTRAP" ]; then
  step "starting a local Kafka-protocol broker (tansu, in memory)"
  KPORT=$(free_port)
  tansu broker --storage-engine memory://tansu/ --listener-url "tcp://127.0.0.1:$KPORT" \
    --advertised-listener-url "tcp://127.0.0.1:$KPORT" >"$WORK/broker.log" 2>&1 &
  PIDS+=($!)
  BOOTSTRAP="127.0.0.1:$KPORT"
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$KPORT") 2>/dev/null && break; sleep 0.1; done
  for topic in Order.events Customer.events; do
    tansu topic create "$topic" --partitions 3 --broker "tcp://$BOOTSTRAP" >/dev/null
  done
  echo "broker on $BOOTSTRAP, topics Order.events and Customer.events"
fi

step "starting outbox-relay (log: $WORK/relay.log)"
METRICS="127.0.0.1:$(free_port)"
RUST_LOG=${RUST_LOG:-info} "$RELAY" run --source-url "$SOURCE_URL" --slot quickstart --publication outbox_pub \
  --table public.outbox --bootstrap-servers "$BOOTSTRAP" --metrics-listen "$METRICS" >"$WORK/relay.log" 2>&1 &
RELAY_PID=$!
PIDS=("$RELAY_PID" "${PIDS[@]}")
for _ in $(seq 100); do grep -q "streaming" "$WORK/relay.log" && break; sleep 0.2; done
grep -q "streaming" "$WORK/relay.log" || { cat "$WORK/relay.log"; echo "relay did not start" >&2; exit 1; }
echo "relay is streaming from slot quickstart; health and metrics: http://$METRICS/readyz, http://$METRICS/metrics"

step "writing business transactions, each with its outbox row"
"${PSQL[@]}" "$SOURCE_URL" <<'SQL'
BEGIN;
INSERT INTO quickstart_orders VALUES ('o-42', 'CREATED', 1500000.10) ON CONFLICT (id) DO UPDATE SET state = 'CREATED';
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Order', 'o-42', 'OrderCreated', '{"orderId": "o-42", "total": 1500000.10, "currency": "COP"}');
COMMIT;
BEGIN;
UPDATE quickstart_orders SET state = 'PAID' WHERE id = 'o-42';
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Order', 'o-42', 'OrderPaid', '{"orderId": "o-42", "paidAt": "2026-11-29T12:00:00Z"}');
COMMIT;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Customer', 'c-7', 'CustomerRegistered', '{"name": "Zoë 😀"}');
-- Rolled back: must never reach Kafka.
BEGIN;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Order', 'o-43', 'OrderCreated', '{"orderId": "o-43"}');
ROLLBACK;
SQL
echo "3 committed events (2 Order, 1 Customer), 1 rolled back"

step "the events as a Kafka consumer sees them (examples/tail.rs, an rdkafka consumer)"
"$TARGET_DIR/debug/examples/tail" --bootstrap-servers "$BOOTSTRAP" --topics Order.events,Customer.events --count 3 --timeout-secs 30

step "the slot: confirmed only after Kafka acknowledged"
WRITTEN_UP_TO=$("${PSQL[@]}" -At "$SOURCE_URL" -c "SELECT pg_current_wal_lsn()")
confirmed=f
deadline=$((SECONDS + 10))
while [ "$SECONDS" -lt "$deadline" ]; do
  confirmed=$("${PSQL[@]}" -At "$SOURCE_URL" -c "SELECT confirmed_flush_lsn >= '$WRITTEN_UP_TO' FROM pg_replication_slots WHERE slot_name = 'quickstart'") || confirmed=f
  [ "$confirmed" = t ] && break
  sleep 0.1
done
[ "$confirmed" = t ] || { tail -n 20 "$WORK/relay.log"; echo "slot quickstart not confirmed up to $WRITTEN_UP_TO within 10 s" >&2; exit 1; }
"${PSQL[@]}" "$SOURCE_URL" -c "SELECT slot_name, active_pid, confirmed_flush_lsn, pg_current_wal_lsn() AS current_wal_lsn FROM pg_replication_slots WHERE slot_name = 'quickstart'"

if [ "$KEEP" = 0 ]; then
  step "stopping (SIGTERM drains in-flight deliveries and confirms the LSN)"
  drop_demo_slot TERM || { echo "could not drop slot quickstart or its slot record row" >&2; exit 1; }
  tail -n 2 "$WORK/relay.log"
  echo "relay stopped, slot quickstart and its slot record dropped"
fi
