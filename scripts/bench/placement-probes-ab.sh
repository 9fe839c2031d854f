#!/bin/bash
# Placement's probes, old against new, beside a CPU neighbour (FINDINGS §13.10): pg-lease,
# 3 nodes, K = 1024, the idle window of `baton bench shards`, two rounds of OLD then NEW.
#   OLD=/path/to/baton-with-old-probes NEW=/path/to/baton scripts/bench/placement-probes-ab.sh
# Neighbour: stress-ng, 4 CPU workers at 100 %, in a session of its own, for each run. After each
# run: the fleet's term endings by reason, from the nodes' actor traces.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-experiments/results/shards}
STATE=${STATE:-state/bench/probes-ab}
for round in 1 2; do
  for v in old new; do
    if [ $v = old ]; then B=$OLD; else B=$NEW; fi
    echo "== round $round $v $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    setsid stress-ng --cpu 4 --cpu-load 100 --timeout 240s >/dev/null 2>&1 &
    sleep 5
    timeout 300 "$B" bench shards --backend pg-lease --nodes 3 --shards 1024 --idle 15s \
      --idle-only --dir "$STATE-$v" \
      --out "$OUT/idle-pg-lease-n3-k1024-neighbour-$v-r$round.json" 2>&1 | tail -4
    echo "rc=${PIPESTATUS[0]} $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    pkill -f "stress-ng --cpu 4 --cpu-load 100" || true
    wait
    find "$STATE-$v" -name actor-trace.jsonl -exec grep -h '"demoted"' {} + | python3 -c "
import sys, json, collections
print('terms ended, by reason:', dict(collections.Counter(json.loads(l).get('detail', '') for l in sys.stdin)))"
    sleep 5
  done
done
