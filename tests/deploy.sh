#!/usr/bin/env bash
# Checks the deployment files in deploy/ with the tools that use them, in a few seconds:
# - systemd: `systemd-analyze security` scores the unit's sandbox (exposure at most 2.0) and
#   `systemd-analyze verify` parses it (any warning, an unknown key say, fails).
# A check whose tool is missing fails, naming the step of tests/setup-deps.sh that installs it.
# Prints one line per check and "tests/deploy.sh: N checks passed" at the end; exits 1 when
# any failed. tests/run.sh runs it.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

passed=0
failed=0
ok() { echo "tests/deploy.sh: ok: $*"; passed=$((passed + 1)); }
fail() { echo "tests/deploy.sh: FAILED: $*" >&2; failed=$((failed + 1)); }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# systemd ---------------------------------------------------------------------------------------
unit=deploy/systemd/outbox-relay.service
# Exposure at most 2.0. --threshold is on systemd's internal scale, ten times the printed one
# (systemd-analyze(1): "default 100"), so 20 means 2.0.
max_exposure=20
if ! command -v systemd-analyze >/dev/null 2>&1; then
  fail "systemd-analyze not found (Debian package systemd)"
else
  out="$(systemd-analyze security --offline=yes --threshold="$max_exposure" "$unit" 2>&1)"
  status=$?
  level="$(grep -o 'Overall exposure level for [^:]*: [0-9.]* [A-Z]*' <<<"$out" | sed 's/.*: //')"
  if [ "$status" -eq 0 ] && [ -n "$level" ]; then
    ok "$unit: systemd-analyze security exposure $level (at most 2.0)"
  else
    grep '^✗' <<<"$out" >&2
    fail "$unit: systemd-analyze security exposure ${level:-unknown}, above 2.0 (the lines above)"
  fi
  # verify checks that ExecStart's program exists and is executable: point it at a stand-in,
  # so the unit is checked as written without the relay installed here. It reports problems as
  # warnings with exit status 0, so any output fails.
  mkdir -p "$tmp/systemd"
  printf '#!/bin/sh\nexit 0\n' >"$tmp/systemd/outbox-relay"
  chmod +x "$tmp/systemd/outbox-relay"
  sed "s#/usr/local/bin/outbox-relay#$tmp/systemd/outbox-relay#g" "$unit" >"$tmp/systemd/outbox-relay.service"
  if out="$(systemd-analyze verify --man=no "$tmp/systemd/outbox-relay.service" 2>&1)" && [ -z "$out" ]; then
    ok "$unit: systemd-analyze verify"
  else
    echo "${out//$tmp\/systemd\//}" >&2
    fail "$unit: systemd-analyze verify (the lines above)"
  fi
fi

echo "tests/deploy.sh: $passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
