#!/usr/bin/env bash
# Quick start, the main job: a local fleet on the embedded default backend (raft) with a private
# PostgreSQL as the fenced resource, in the foreground until Ctrl-C (or `--for 20s`).
#   scripts/run.sh [NODES] [more `baton fleet up` flags, e.g. --backend etcd --for 20s]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-deps.sh
# cargo's own progress stays on: a first release build takes minutes on a small machine.
echo "run.sh: building the release binary (target/release/baton); the first build takes a while" >&2
cargo build --release --bin baton
nodes="${1:-3}"
[ $# -gt 0 ] && shift
dir="state/quickstart"
target/release/baton fleet down --dir "$dir" >/dev/null 2>&1 || true
rm -rf "$dir"
exec target/release/baton fleet up "$nodes" --dir "$dir" --foreground "$@"
