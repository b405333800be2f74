#!/usr/bin/env bash
# The project's single test command (CI's .ci/run execs it): makes sure the dependencies are
# installed (tests/setup-deps.sh), then runs every test. The integration tests start their own
# PostgreSQL cluster and tansu broker (tests/support), so nothing is started here.
# Extra arguments go to `cargo test` (e.g. tests/run.sh --test e2e -- roundtrip).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="${CARGO_HOME:-${HOME:-/root}/.cargo}/bin:$PATH"
tests/setup-deps.sh
exec cargo test --locked "$@"
