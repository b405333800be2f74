#!/usr/bin/env bash
# Checks the deployment files in deploy/ with the tools that use them, in a few seconds:
# - systemd: `systemd-analyze security` scores the unit's sandbox (exposure at most 2.0) and
#   `systemd-analyze verify` parses it (any warning, an unknown key say, fails);
# - Prometheus: `promtool check rules` and `promtool test rules` (each alert fires on series
#   that should fire it and stays silent on others); deploy/kubernetes/prometheusrule.yaml
#   holds the same rules as deploy/prometheus/outbox-relay-rules.yaml, as this script makes it;
# Tools: systemd-analyze from systemd; promtool (Debian's prometheus) from tests/setup-deps.sh.
# A missing tool fails its check.
# `tests/deploy.sh --write-prometheusrule` writes deploy/kubernetes/prometheusrule.yaml from
# the rule file, and changes nothing else.
# Prints one line per check and "tests/deploy.sh: N passed, M failed" at the end; exits
# 1 when any failed. tests/run.sh runs it.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rules=deploy/prometheus/outbox-relay-rules.yaml
prometheusrule=deploy/kubernetes/prometheusrule.yaml
# The PrometheusRule object: a header, then the rule file's groups under spec, as they are.
make_prometheusrule() {
  cat <<'YAML'
# Generated from deploy/prometheus/outbox-relay-rules.yaml by
# `tests/deploy.sh --write-prometheusrule`: edit that file, not this one (tests/deploy.sh fails
# while they differ). The Prometheus Operator loads it; your Prometheus's ruleSelector may need
# a label here (kube-prometheus-stack: release: <its name>). The alerts expect the job label
# "outbox-relay", which servicemonitor.yaml gives. What each alert means and what to do:
# docs/operations/monitoring.md, "Alerts".
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: outbox-relay
  labels:
    app.kubernetes.io/name: outbox-relay
spec:
YAML
  sed -n '/^groups:/,$p' "$rules" | sed 's/^\(.\)/  \1/'
}
if [ "${1:-}" = "--write-prometheusrule" ]; then
  make_prometheusrule >"$prometheusrule"
  echo "tests/deploy.sh: wrote $prometheusrule"
  exit 0
elif [ "$#" -gt 0 ]; then
  echo "tests/deploy.sh: unknown argument $1 (known: --write-prometheusrule)" >&2
  exit 2
fi

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

# Prometheus ------------------------------------------------------------------------------------
if ! command -v promtool >/dev/null 2>&1; then
  fail "promtool not found (Debian package prometheus: tests/setup-deps.sh)"
else
  if out="$(promtool check rules "$rules" 2>&1)"; then
    ok "$rules: promtool check rules ($(grep -o '[0-9]* rules found' <<<"$out"))"
  else
    echo "$out" >&2
    fail "$rules: promtool check rules (the lines above)"
  fi
  tests="deploy/prometheus/outbox-relay-rules.test.yaml"
  if out="$(promtool test rules "$tests" 2>&1)"; then
    ok "$tests: promtool test rules ($(grep -c 'alertname:' "$tests") alert evaluations)"
  else
    echo "$out" >&2
    fail "$tests: promtool test rules (the lines above)"
  fi
fi
if make_prometheusrule | diff -u "$prometheusrule" - >"$tmp/prometheusrule.diff"; then
  ok "$prometheusrule: the rules of $rules"
else
  cat "$tmp/prometheusrule.diff" >&2
  fail "$prometheusrule differs from $rules (the diff above): run tests/deploy.sh --write-prometheusrule"
fi

echo "tests/deploy.sh: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
