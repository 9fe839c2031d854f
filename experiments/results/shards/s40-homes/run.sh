#!/bin/bash
# old (before one-home-per-shard) vs new, same command, alternating
cd /work/main
for round in 1 2; do
for side in old new; do
  /tmp/baton-$side bench shards --backend pg-lease --nodes 3 --shards 1,4,16 --rate 40000 --connections 64 \
    --duration 10s --warmup 3s --idle 0 --dir state/bench/shards-$side \
    --out /tmp/s40-shards/total64-$side-r$round.json > /tmp/s40-shards/total64-$side-r$round.log 2>&1
  echo "$(date +%T) done $side r$round load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/s40-shards/progress
done
done
