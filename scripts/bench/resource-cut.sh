#!/usr/bin/env bash
# How long the sequencer stays dark after a cut from PostgreSQL heals: a 3-node raft fleet in
# network namespaces, `baton load` at 200 IDs/s (8 connections) with --history, the leader cut
# from PostgreSQL (DROP both ways) for CUT seconds 8 s in, then every request's completion time
# against the cut and the heal. Root only (netns).
#
#   scripts/bench/resource-cut.sh TAG [CUT]     # BATON= binary, OUT= directory
set -euo pipefail
cd "$(dirname "$0")/../.."
BATON=${BATON:-target/release/baton}
# shellcheck source=scripts/bench/fleet.sh
. scripts/bench/fleet.sh
tag=$1 cut=${2:-15} dir=state/bench/resource-cut out=${OUT:-experiments/results/resource-cut}
mkdir -p "$out"
fresh_fleet "$BATON" "$dir" --netns
down_on_exit "$BATON" "$dir"
sleep 2
"$BATON" load --dir "$dir" --rate 200 --duration $((cut + 30))s --connections 8 --json \
  --history "$out/$tag.jsonl" >"$out/$tag-load.json" 2>/dev/null &
load=$!
sleep 8
"$BATON" chaos partition-leader --from resource --secs "$cut" --dir "$dir" | tail -1 >"$out/$tag-fault.json"
wait "$load"
python3 - "$out/$tag.jsonl" "$out/$tag-fault.json" <<'PY' | tee "$out/$tag.txt"
import json, sys
ops = [json.loads(l) for l in open(sys.argv[1])]
fault = json.load(open(sys.argv[2]))
cut, heal = fault["applied_at_mono_ns"], fault["healed_at_mono_ns"]
ok_after = sorted(o["complete_ns"] for o in ops if o["outcome"] == "ok" and o["complete_ns"] > heal)
ok_before = [o["complete_ns"] for o in ops if o["outcome"] == "ok" and o["complete_ns"] <= cut]
print("cut held %.2f s; last ok before the cut %.3f s before it; first ok after the heal %.3f s after it"
      % ((heal - cut) / 1e9, (cut - max(ok_before)) / 1e9, (ok_after[0] - heal) / 1e9))
counts = {}
for o in ops:
    counts[o["outcome"]] = counts.get(o["outcome"], 0) + 1
print("outcomes:", counts, "tokens:", sorted({o["token"] for o in ops if o.get("token")}))
PY
