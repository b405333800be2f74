#!/bin/bash
# The part of the official postgres image's entrypoint that docker/compose.yaml uses:
# - `postgres [-c name=value ...]` (or only flags): on the first start (empty PGDATA) makes a
#   cluster whose superuser is POSTGRES_USER (default postgres) with POSTGRES_PASSWORD, creates
#   POSTGRES_DB (default: the user's name), runs /docker-entrypoint-initdb.d/*.sql in it in name
#   order (stopping at the first error) on a server that listens on the Unix socket only, then
#   runs postgres as user postgres, listening on all addresses, password (scram) auth over TCP;
# - any other command (the producer's `bash -c ...`) is run as it is.
set -euo pipefail
if [ "${1:0:1}" = - ]; then set -- postgres "$@"; fi
[ "$1" = postgres ] || exec "$@"
shift

user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
as_postgres() { runuser -u postgres -- "$@"; }

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  [ -n "${POSTGRES_PASSWORD:-}" ] || { echo "postgres-entrypoint: POSTGRES_PASSWORD is not set" >&2; exit 1; }
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  chown postgres "$pwfile"
  as_postgres initdb -D "$PGDATA" --username="$user" --pwfile="$pwfile" --auth-local=trust \
    --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  # As the official image: the init scripts run with the command's settings, on a server TCP
  # clients cannot reach yet.
  as_postgres pg_ctl -D "$PGDATA" -o "$(printf '%q ' "$@") -c listen_addresses=''" -w -t 60 start >/dev/null
  psql=(psql -X -v ON_ERROR_STOP=1 --username "$user" --no-password)
  if [ "$db" != postgres ]; then
    as_postgres "${psql[@]}" --dbname postgres -q -c "CREATE DATABASE \"$db\""
  fi
  for f in /docker-entrypoint-initdb.d/*.sql; do
    [ -e "$f" ] || continue
    echo "postgres-entrypoint: running $f"
    as_postgres "${psql[@]}" --dbname "$db" -q -f "$f"
  done
  as_postgres pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres-entrypoint: initialised $PGDATA (user $user, database $db)"
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses='*' "$@"
