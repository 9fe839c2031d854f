#!/usr/bin/env bash
# Where an open-loop run's tail forms, 100 ms at a time: `baton load` with --history on a fresh
# raft fleet beside `stress-ng --cpu 2 --cpu-load 15`, new PostgreSQL WAL segments timed on the
# same clock (CLOCK_MONOTONIC), then each 100 ms of schedule whose worst request took over 30 ms,
# split into "late" (scheduled -> sent: every connection busy, or the generator not running) and
# "svc" (sent -> answered).
#
#   scripts/bench/timeline.sh TAG [RATE]     # BATON= binary, CONN= connections (256),
#                                            # FLEET_CONFIG= base node config, OUT= directory,
#                                            # SLICE_MS= the neighbour's busy slice (0: stress-ng's
#                                            # random 0-500 ms; 10: a steady neighbour)
set -euo pipefail
cd "$(dirname "$0")/../.."
BATON=${BATON:-target/release/baton}
# shellcheck source=scripts/bench/fleet.sh
. scripts/bench/fleet.sh
tag=$1 rate=${2:-50000} dir=state/bench/timeline out=${OUT:-experiments/results/bench-next/timeline}
mkdir -p "$out"
fresh_fleet "$BATON" "$dir" ${FLEET_CONFIG:+--config "$FLEET_CONFIG"}
down_on_exit "$BATON" "$dir"
sleep 2
"$BATON" load --dir "$dir" --rate "$rate" --duration 5s --connections "${CONN:-256}" >/dev/null 2>&1
python3 - "$dir/postgres/data/pg_wal" "$out/$tag.wal" 40 <<'PY' &
import os, sys, time
d, out, end = sys.argv[1], open(sys.argv[2], "w"), time.time() + float(sys.argv[3])
seen = set(os.listdir(d))
while time.time() < end:
    cur = set(os.listdir(d))
    for f in sorted(cur - seen):
        out.write("%d %s\n" % (time.monotonic_ns(), f))
        out.flush()
    seen = cur
    time.sleep(0.005)
PY
watcher=$!
stress-ng --cpu 2 --cpu-load 15 --cpu-load-slice "${SLICE_MS:-0}" --timeout 40s >/dev/null 2>&1 &
neighbour=$!
sleep 1
"$BATON" load --dir "$dir" --rate "$rate" --duration 30s --connections "${CONN:-256}" --json \
  --history "$out/$tag.jsonl" >"$out/$tag-load.json" 2>/dev/null
kill "$neighbour" "$watcher" 2>/dev/null || true
wait || true
python3 - "$out/$tag.jsonl" "$out/$tag.wal" <<'PY' | tee "$out/$tag-timeline.txt"
import json, sys
ops = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t0 = min(o["sched_ns"] for o in ops)
ms = lambda a, b: (a - b) / 1e6
def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]
lat = [ms(o["complete_ns"], o["sched_ns"]) for o in ops]
svc = [ms(o["complete_ns"], o["invoke_ns"]) for o in ops]
print("requests %d; from schedule p50 %.1f p99 %.1f ms; service mean %.2f p50 %.2f p99 %.2f ms"
      % (len(ops), pct(lat, .5), pct(lat, .99), sum(svc) / len(svc), pct(svc, .5), pct(svc, .99)))
for line in open(sys.argv[2]):
    ns, name = line.split()
    print("WAL file %s appeared at t=%.2f s" % (name, (int(ns) - t0) / 1e9))
buckets = {}
for o in ops:
    buckets.setdefault((o["sched_ns"] - t0) // 100_000_000, []).append(o)
for k, v in sorted(buckets.items()):
    worst = max(ms(o["complete_ns"], o["sched_ns"]) for o in v)
    if worst > 30:
        print("t=%.1f s  worst %.1f ms  late %.1f  svc %.1f  over 20 ms: %d of %d" % (
            k / 10, worst, max(ms(o["invoke_ns"], o["sched_ns"]) for o in v),
            max(ms(o["complete_ns"], o["invoke_ns"]) for o in v),
            sum(1 for o in v if ms(o["complete_ns"], o["sched_ns"]) > 20), len(v)))
PY
rm -f "$out/$tag.jsonl"
