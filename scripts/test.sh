#!/usr/bin/env bash
# The full test suite: unit tests, and integration tests against real etcd, PostgreSQL, Redis and
# ZooKeeper that the tests start themselves as private instances in temp dirs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-deps.sh
# The core stays a library: no import circles, one client stack per backend feature.
bash scripts/check-core.sh
# Two test threads per binary: the machine has 2 cores and the lease tests measure time.
cargo test --no-fail-fast -- --test-threads=2
