#!/usr/bin/env bash
# Checks the deployment files in deploy/ with the tools that use them, in a few seconds:
# - systemd: `systemd-analyze security` scores the unit's sandbox (exposure at most 2.0) and
#   `systemd-analyze verify` parses it (any warning, an unknown key say, fails);
# - Prometheus: `promtool check rules` and `promtool test rules` (each alert fires on series
#   that should fire it and stays silent on others); deploy/kubernetes/prometheusrule.yaml
#   holds the same rules as deploy/prometheus/outbox-relay-rules.yaml, as this script makes it;
# - Kubernetes: `kubernetes-validate --strict` against the API schemas of the oldest and the
#   newest version it knows of; every pod meets the "restricted" Pod Security Standard with a
#   read-only root filesystem; and the objects fit together (probes, grace period against
#   shutdown_timeout_secs, anti-affinity, PodDisruptionBudget, Service and ServiceMonitor).
# Tools, which tests/setup-deps.sh installs: systemd-analyze (Debian's systemd), promtool
# (Debian's prometheus), kubernetes-validate and PyYAML (a venv in $OUTBOX_RELAY_TOOLS_VENV,
# /opt/outbox-relay-tests/venv by default). A missing tool fails its checks.
# `tests/deploy.sh --write-prometheusrule` writes deploy/kubernetes/prometheusrule.yaml from
# the rule file, and changes nothing else.
# Prints one line per check and "tests/deploy.sh: N passed, M failed" at the end; exits
# 1 when any failed. tests/run.sh runs it.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${OUTBOX_RELAY_TOOLS_VENV:-/opt/outbox-relay-tests/venv}"
K8S_MIN_VERSION="1.29"  # the oldest whose schema takes podFailurePolicy rules without onPodConditions

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
  fail "systemd-analyze not found (Debian package systemd: tests/setup-deps.sh)"
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

# Kubernetes ------------------------------------------------------------------------------------
# kubernetes-validate knows the built-in kinds only; the Prometheus Operator's (ServiceMonitor,
# PrometheusRule) are checked by the script below instead.
builtin=(deploy/kubernetes/outbox-relay.yaml deploy/kubernetes/setup-job.yaml)
if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  fail "$VENV/bin/kubernetes-validate not found (tests/setup-deps.sh installs it)"
else
  newest="$("$VENV/bin/kubernetes-validate" --help | grep -o 'Defaults to [0-9.]*' | grep -o '[0-9][0-9.]*')"
  for version in "$K8S_MIN_VERSION" "$newest"; do
    if out="$("$VENV/bin/kubernetes-validate" --strict --quiet -k "$version" "${builtin[@]}" 2>&1)" && [ -z "$out" ]; then
      ok "${builtin[*]}: kubernetes-validate --strict, Kubernetes $version"
    else
      echo "$out" >&2
      fail "${builtin[*]}: kubernetes-validate --strict, Kubernetes $version (the lines above)"
    fi
  done
fi
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import yaml, tomllib' 2>/dev/null; then
  fail "$VENV/bin/python with PyYAML and tomllib (Python 3.11+) not found (tests/setup-deps.sh installs it)"
else
  "$VENV/bin/python" - deploy/kubernetes/*.yaml >"$tmp/k8s.out" 2>&1 <<'PY'
import sys, tomllib, yaml

problems, passed = [], []
objects = []  # (file, object)
for path in sys.argv[1:]:
    with open(path) as f:
        objects += [(path, o) for o in yaml.safe_load_all(f) if o]

def where(path, o):
    return f"{path}: {o['kind']}/{o['metadata']['name']}"

def pod_spec(o):
    kind, spec = o["kind"], o.get("spec", {})
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return spec["template"]["spec"]
    return None

def pod_labels(o):
    return o["spec"]["template"]["metadata"].get("labels", {})

def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())

# The restricted Pod Security Standard (kubernetes.io/docs/concepts/security/pod-security-standards),
# plus a read-only root filesystem, for every pod.
def restricted(spec):
    found = []
    psc = spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"{key} is set")
    for v in spec.get("volumes", []):
        if "hostPath" in v:
            found.append(f"volume {v['name']} is a hostPath")
    containers = spec.get("containers", []) + spec.get("initContainers", [])
    for c in containers:
        csc = c.get("securityContext", {})
        name = f"container {c['name']}"
        def either(key):
            return csc.get(key, psc.get(key))
        if either("runAsNonRoot") is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        uid = either("runAsUser")
        if not isinstance(uid, int) or isinstance(uid, bool) or uid <= 0:
            found.append(f"{name}: runAsUser is not a numeric non-root uid ({uid!r})")
        seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile.type is {seccomp!r}, not RuntimeDefault or Localhost")
        if csc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        if csc.get("privileged"):
            found.append(f"{name}: privileged")
        caps = csc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            found.append(f"{name}: capabilities.drop lacks ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {caps['add']}")
        if csc.get("readOnlyRootFilesystem") is not True:
            found.append(f"{name}: readOnlyRootFilesystem is not true")
        for p in c.get("ports", []):
            if p.get("hostPort"):
                found.append(f"{name}: hostPort {p['hostPort']}")
    if spec.get("automountServiceAccountToken") is not False:
        found.append("automountServiceAccountToken is not false (the relay needs no API token)")
    return found

pods = [(p, o) for p, o in objects if pod_spec(o) is not None]
if not pods:
    problems.append("no pod templates found")
for path, o in pods:
    found = restricted(pod_spec(o))
    if found:
        problems += [f"{where(path, o)}: {f}" for f in found]
    else:
        passed.append(f"{where(path, o)}: restricted Pod Security Standard, read-only root")

def one(kind):
    found = [(p, o) for p, o in objects if o["kind"] == kind]
    if len(found) != 1:
        problems.append(f"{len(found)} {kind} objects in deploy/kubernetes, want 1")
        return None, None
    return found[0]

dpath, deployment = one("Deployment")
_, configmap = one("ConfigMap")
spath, service = one("Service")
if deployment:
    spec = pod_spec(deployment)
    c = spec["containers"][0]
    name = where(dpath, deployment)
    found = []
    if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
        found.append("livenessProbe is not GET /healthz")
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
        found.append("readinessProbe is not GET /readyz")
    # The drain: the largest shutdown_timeout_secs of the config file (30 s by default), twice
    # for a polling pipeline (the drain, then its marks' COMMIT), and 10 s more for the final
    # confirmation and exit. Without a config file the manifest may run either source.
    drain = 60
    if configmap:
        config = tomllib.loads(configmap["data"]["relay.toml"])
        drain = max([p.get("shutdown_timeout_secs", 30) * (2 if p.get("source_kind") == "polling" else 1)
                     for p in config.get("pipelines", [])] or [30])
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < drain + 10:
        found.append(f"terminationGracePeriodSeconds {grace} leaves no room after the {drain} s drain")
    terms = spec.get("affinity", {}).get("podAntiAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", [])
    if not any(t.get("topologyKey") == "kubernetes.io/hostname"
               and matches(t.get("labelSelector", {}), pod_labels(deployment)) for t in terms):
        found.append("no required podAntiAffinity on kubernetes.io/hostname for its own pods")
    surge = deployment["spec"].get("strategy", {}).get("rollingUpdate", {}).get("maxSurge")
    if terms and surge not in (0, "0%"):
        found.append(f"maxSurge {surge!r}: with required anti-affinity a surge pod may find no node")
    pdbs = [o for _, o in objects if o["kind"] == "PodDisruptionBudget"
            and matches(o["spec"]["selector"], pod_labels(deployment))]
    if not pdbs:
        found.append("no PodDisruptionBudget selects its pods")
    problems += [f"{name}: {f}" for f in found]
    if not found:
        passed.append(f"{name}: probes, grace period {grace} s > drain {drain} s, one replica per node, PodDisruptionBudget")
if deployment and service:
    name = where(spath, service)
    ports = {p["name"] for p in pod_spec(deployment)["containers"][0].get("ports", [])}
    found = []
    if not matches({"matchLabels": service["spec"]["selector"]}, pod_labels(deployment)):
        found.append("its selector does not select the Deployment's pods")
    for p in service["spec"]["ports"]:
        if p.get("targetPort") not in ports:
            found.append(f"targetPort {p.get('targetPort')!r} is no container port ({sorted(ports)})")
    sm = [(p, o) for p, o in objects if o["kind"] == "ServiceMonitor"]
    for mpath, monitor in sm:
        mname = where(mpath, monitor)
        if monitor["apiVersion"] != "monitoring.coreos.com/v1":
            found.append(f"{mname}: apiVersion {monitor['apiVersion']}")
        if not matches(monitor["spec"]["selector"], service["metadata"].get("labels", {})):
            found.append(f"{mname}: its selector does not select the Service")
        for e in monitor["spec"]["endpoints"]:
            if e.get("port") not in {p["name"] for p in service["spec"]["ports"]}:
                found.append(f"{mname}: endpoint port {e.get('port')!r} is not a port of the Service")
        job = service["metadata"].get("labels", {}).get(monitor["spec"].get("jobLabel", ""))
        if job != "outbox-relay":
            found.append(f"{mname}: the job label would be {job!r}, the alerts expect outbox-relay")
    if not sm:
        found.append("no ServiceMonitor")
    problems += [f"{name}: {f}" for f in found]
    if not found:
        passed.append(f"{name}: selects the pods; the ServiceMonitor scrapes its metrics port as job outbox-relay")
with open("deploy/prometheus/outbox-relay-rules.yaml") as f:
    rule_groups = yaml.safe_load(f)["groups"]
for path, o in objects:
    if o["kind"] == "PrometheusRule":
        if o["apiVersion"] != "monitoring.coreos.com/v1":
            problems.append(f"{where(path, o)}: apiVersion {o['apiVersion']}")
        elif o["spec"]["groups"] != rule_groups:
            problems.append(f"{where(path, o)}: its groups are not those of the rule file")
        else:
            alerts = sum(len(g["rules"]) for g in rule_groups)
            passed.append(f"{where(path, o)}: the {alerts} rules of the rule file, parsed")

for p in passed:
    print(f"ok: {p}")
for p in problems:
    print(f"FAILED: {p}")
sys.exit(1 if problems else 0)
PY
  while IFS= read -r line; do
    case "$line" in
      "ok: "*) ok "${line#ok: }" ;;
      "FAILED: "*) fail "${line#FAILED: }" ;;
      *) echo "$line" >&2; fail "the Kubernetes checks (the line above)" ;;
    esac
  done <"$tmp/k8s.out"
fi

echo "tests/deploy.sh: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
