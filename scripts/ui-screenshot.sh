#!/usr/bin/env bash
# Regenerates deploy/ui-screenshot.png: the fleet page (GET /ui) of a local 3-node fleet with 4
# shards, rendered by headless Chromium (scripts/ensure-deps.sh installs it). Shards need a lease
# backend; pg-lease needs nothing beyond the fleet's own PostgreSQL.
#
#   scripts/ui-screenshot.sh [OUT.png]     # BATON=target/debug/baton to use another build
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-deploy/ui-screenshot.png}")
baton=${BATON:-target/release/baton}
[ -x "$baton" ] || cargo build --release --bin baton

dir=$(mktemp -d /tmp/baton-ui-shot.XXXXXX)
trap '"$baton" fleet down --dir "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
"$baton" fleet up 3 --backend pg-lease --shards 4 --dir "$dir" >/dev/null
# Placement spreads the shards once every member has seen the others live for a few probes.
sleep "${SETTLE_S:-8}"
addr=$("$baton" fleet status --dir "$dir" --json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["http_addr"])')

# A few polls of virtual time, so the page shows a settled answer, not its first one.
chromium --headless --disable-gpu --no-sandbox --hide-scrollbars \
  --user-data-dir="$dir/chromium" --window-size=1100,680 --virtual-time-budget=3000 \
  --screenshot="$out" "http://$addr/ui" 2>/dev/null
echo "wrote $out (the page of $addr)"
