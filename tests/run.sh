#!/usr/bin/env bash
# The project's single test command (CI's .ci/run execs it): makes sure the dependencies are
# installed (tests/setup-deps.sh), then runs every test. The integration tests start their own
# PostgreSQL cluster and tansu broker (tests/support), so nothing is started here. Without
# arguments it checks the formatting too (cargo fmt --check), the docs (tests/docs.sh) and the
# deployment files (tests/deploy.sh), after the tests, then builds the release and the image
# and runs the image and the compose demo with podman (tests/image.sh; as root only, skipped
# with a message otherwise; OUTBOX_RELAY_SKIP_IMAGE_TEST=1 leaves it out).
# Extra arguments go to `cargo test` (e.g. tests/run.sh --test e2e -- roundtrip).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="${CARGO_HOME:-${HOME:-/root}/.cargo}/bin:$PATH"
tests/setup-deps.sh
status=0
cargo test --locked "$@" || status=$?
# The whole suite ends with the layout check (rustfmt ships with rustup's default profile).
if [ "$#" -eq 0 ]; then
  if ! cargo fmt --version >/dev/null 2>&1; then
    echo "tests/run.sh: formatting not checked: no rustfmt (rustup component add rustfmt)" >&2
  elif ! cargo fmt --check -- -l; then  # lists the files that are not formatted
    echo "tests/run.sh: the files above are not formatted (cargo fmt --check); run cargo fmt" >&2
    [ "$status" -ne 0 ] || status=1
  else
    echo "tests/run.sh: formatting checked (cargo fmt --check)"
  fi
  tests/docs.sh || { [ "$status" -ne 0 ] || status=1; }  # links, table of contents, no history
  tests/deploy.sh || { [ "$status" -ne 0 ] || status=1; }  # systemd, Prometheus and Kubernetes files
  if [ "${OUTBOX_RELAY_SKIP_IMAGE_TEST:-0}" = 1 ]; then
    echo "tests/run.sh: the release, image and compose demo test skipped (OUTBOX_RELAY_SKIP_IMAGE_TEST=1)" >&2
  elif [ "$(id -u)" != 0 ]; then
    echo "tests/run.sh: the release, image and compose demo test skipped: tests/image.sh needs root (CI runs it)" >&2
  else
    tests/image.sh || { [ "$status" -ne 0 ] || status=1; }  # release, image, compose demo
  fi
fi
exit "$status"
