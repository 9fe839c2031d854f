#!/bin/bash
# One profile of the new build's commit loop at 30k/s: where its time per commit goes.
set -u
cd /work/s40-commit
source scripts/bench/fleet.sh
bin=target/release/baton dir=state/bench/s40-loop out=/tmp/s40-prof
fresh_fleet "$bin" "$dir"
down_on_exit "$bin" "$dir"
sleep 2
leader=$("$bin" fleet status --dir "$dir" --json | python3 -c 'import json,sys; print(next(r["http_addr"] for r in json.load(sys.stdin) if r.get("role")=="leader"))')
pid=$("$bin" fleet status --dir "$dir" --json | python3 -c 'import json,sys; print(next(r["pid"] for r in json.load(sys.stdin) if r.get("role")=="leader"))')
tid=$(grep -l '^baton-http-0$' /proc/"$pid"/task/*/comm | head -1 | cut -d/ -f5)
wrk -t1 -c256 -d5s -s scripts/bench/post-next.lua "http://$leader/next" >/dev/null
"$bin" load --dir "$dir" --rate 30000 --duration 12s --connections 256 --json >"$out/load.json" &
load=$!
sleep 4
perf record -t "$tid" -F 999 --call-graph dwarf,16384 -o "$out/loop.data" -- sleep 6 >/dev/null 2>&1
wait "$load"
perf script -i "$out/loop.data" --no-inline 2>/dev/null >"$out/stacks.txt"
rm -f "$out/loop.data"
python3 "$out/loop-parts.py" "$out/stacks.txt" | tee "$out/loop-parts.txt"
