#!/usr/bin/env bash
# Issue 14 item 4 on a bare machine (the device tool's 16-core one): unpacks what
# scripts/bench/device-pack.sh packed, installs only what the machine lacks, and runs the same
# `baton bench next` as on the 2-core host at rising rates, nothing else running. Reports go to
# $OUT (the device tool brings back up to 8 files), or experiments/results/bench-next/device.
#
#   bash scripts/bench/device-run.sh [RATES] [DURATION]   # default "100000 250000 500000", 20s
#
# The nodes run experiments/bench-configs/raft-conns-4096.toml (the shipped raft timing with a
# 4,096-connection cap). After the rates, the last again with two group commits in flight
# (experiments/bench-configs/raft-commits-in-flight-2.toml), and the last rate's run also drives
# GET /healthz the same way (--plain-http), the machine's own HTTP limit in the same run. Then the
# last rate in window mode (experiments/bench-configs/raft-window-conns-4096.toml), also with
# --plain-http.
# Then lease reads (`baton bench read --modes lease`, raft) at each of $READ_RATES (default
# "250000 500000 1000000") for $READ_DURATION (10s), each followed by GET /healthz at the same
# rate, connections and threads: the ratio to plain HTTP in the same run.
# Then `baton bench shards` (pg-lease, K from $SHARDS, default 1,4,16) at the last rate in
# total, or at $SHARDS_RATE_PER_SHARD per shard (K times it in total); with
# $SHARDS_CONN_PER_SHARD (default 64) connections per shard, so every K's shards are loaded like
# K = 1's (SHARDS_CONN_PER_SHARD="" keeps 256 in total whatever K, the older comparison). The
# issue-28 goal (>= 1M fenced durable IDs/s in aggregate at p99 <= 20 ms on 16 cores):
#   SHARDS=1,4,16 SHARDS_RATE_PER_SHARD=100000 bash scripts/bench/device-run.sh
# Connections: Little's law on each warm-up's service time unless $CONNECTIONS is set; every
# report says what limited its run (nothing, the connections, the node, or the generator).
# Under the device tool ($OUT set) the JSON reports travel back packed in reports.tar.gz beside
# the log and summary.md (the tool brings back at most 8 files).
# DRY=1 installs and checks, and runs one 5 s bench at 20k: the rehearsal on a machine of ours.
# SMOKE=1 runs every step end to end at tiny rates and durations (next 2k/4k for 2 s, reads at
# 2k/4k/6k for 2 s, shards 1,2 at 8 connections and 1k IDs/s per shard): proof that the script
# runs, not a measurement.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${SMOKE:-}" ]; then
  rates=${1-2000 4000}
  duration=${2:-2s}
  READ_RATES=${READ_RATES:-2000 4000 6000}
  READ_DURATION=${READ_DURATION:-2s}
  SHARDS=${SHARDS-1,2}
  SHARDS_CONN_PER_SHARD=${SHARDS_CONN_PER_SHARD-8}
  SHARDS_RATE_PER_SHARD=${SHARDS_RATE_PER_SHARD-1000}
  short=(--warmup 1s --baseline-duration 1s)
  read_short=(--warmup 1s)
else
  rates=${1-100000 250000 500000}
  duration=${2:-20s}
  # BENCH_ARGS: more `bench next` arguments for every durable and window run, e.g.
  # "--warmup 3s --baseline-duration 3s" to fit a short lease.
  read -r -a short <<<"${BENCH_ARGS:-}"
  read_short=()
fi
read_rates=${READ_RATES-250000 500000 1000000}
read_duration=${READ_DURATION:-10s}
conns=()
[ -n "${CONNECTIONS:-}" ] && conns=(--connections "$CONNECTIONS")
# The nodes' configs: a client connection cap of 4,096 (the default 1,024 capped the durable
# runs of FINDINGS §18 before the node did). NEXT_CONFIG / WINDOW_CONFIG name others;
# CIF2="" skips the run with two commits in flight, WINDOW_CONFIG="" the window-mode run,
# READ_RATES="" the lease reads, and an empty RATES ("") every `bench next` run.
NEXT_CONFIG=${NEXT_CONFIG:-experiments/bench-configs/raft-conns-4096.toml}
WINDOW_CONFIG=${WINDOW_CONFIG-experiments/bench-configs/raft-window-conns-4096.toml}
CIF2=${CIF2-1}
out=${OUT:-experiments/results/bench-next/device}
mkdir -p "$out"
log="$out/device-run.log"
exec > >(tee -a "$log") 2>&1
say() { echo "## $*"; }

# What this script and `baton` call on the machine (baton runs PostgreSQL through runuser and
# chown when root): say at once which is missing rather than halfway through.
for cmd in tar xz ldd ldconfig chown runuser python3; do
  command -v "$cmd" >/dev/null || { echo "this machine lacks $cmd" >&2; exit 2; }
done

unpacked=${DEVICE_DIR:-/opt/baton-device}
say "unpacking .device/bundle.tar.xz into $unpacked"
rm -rf "$unpacked"
mkdir -p "$unpacked"
tar -C "$unpacked" -xJf .device/bundle.tar.xz
baton="$unpacked/baton"

# PostgreSQL where `baton` looks for it (the newest /usr/lib/postgresql/N/bin/postgres), unless
# the machine has one already.
if ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  say "PostgreSQL already here: $(ls -d /usr/lib/postgresql/*/bin | tr '\n' ' ')"
else
  say "installing PostgreSQL's files under /usr/lib/postgresql and /usr/share/postgresql"
  mkdir -p /usr/lib/postgresql /usr/share/postgresql
  cp -a "$unpacked/root/usr/lib/postgresql/." /usr/lib/postgresql/
  cp -a "$unpacked/root/usr/share/postgresql/." /usr/share/postgresql/
fi
if [ ! -e /usr/share/zoneinfo/UTC ]; then
  say "installing UTC's time zone files (no tzdata here)"
  mkdir -p /usr/share/zoneinfo
  cp -an "$unpacked/root/usr/share/zoneinfo/." /usr/share/zoneinfo/
fi
pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)

# Shared libraries: only those the loader cannot find, so nothing of the machine's own is
# shadowed. A library brought in may need another: repeat until nothing is missing.
# The files to check are the ones device-pack.sh listed in the bundle (`needed`); ldd on a file
# that is not there would print no "not found" either, so their presence is checked first.
checked=("$baton" $(printf "$pg_bin/../%s " $(cat "$unpacked/needed")))
for f in "${checked[@]}"; do
  [ -f "$f" ] || { echo "no $f" >&2; exit 2; }
done
missing_libs() {
  for f in "${checked[@]}"; do
    ldd "$f" 2>/dev/null | awk '/=> not found/ {print $1}'
  done | sort -u
}
libdir=/usr/local/lib/baton-device
for _ in 1 2 3 4 5; do
  missing=$(missing_libs)
  [ -z "$missing" ] && break
  mkdir -p "$libdir"
  for lib in $missing; do
    [ -f "$unpacked/lib/$lib" ] || { echo "no $lib in the bundle" >&2; exit 2; }
    say "adding $lib"
    cp "$unpacked/lib/$lib" "$libdir/"
  done
  echo "$libdir" >/etc/ld.so.conf.d/baton-device.conf
  ldconfig
done
missing=$(missing_libs)
[ -z "$missing" ] || { echo "still missing: $missing" >&2; exit 2; }

# PostgreSQL runs as `postgres` when we are root (initdb refuses root).
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  say "adding the user postgres"
  if [ -x "$(command -v useradd)" ]; then
    useradd --system --user-group --home-dir /nonexistent --shell /usr/sbin/nologin postgres
  else # a minimal image without the shadow tools: the two lines useradd would write
    uid=990
    while grep -q "^[^:]*:[^:]*:$uid:" /etc/passwd /etc/group; do uid=$((uid - 1)); done
    echo "postgres:x:$uid:" >>/etc/group
    echo "postgres:x:$uid:$uid:PostgreSQL:/nonexistent:/usr/sbin/nologin" >>/etc/passwd
  fi
fi

say "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(uname -r)"
"$baton" --version || true
"$pg_bin/postgres" --version

bench() { # TAG, then bench next's arguments
  local tag=$1
  shift
  say "baton bench next $* --out $out/$tag.json"
  "$baton" bench next --backend raft "$@" "${conns[@]}" --out "$out/$tag.json" | tail -n 24
}

# Lease reads at RATE, then GET /healthz the same way (bench read's plain HTTP row).
read_bench() {
  local rate=$1 tag
  tag="read-lease-$((rate / 1000))k"
  say "baton bench read --backends raft --modes lease --rate $rate --duration $read_duration ${read_short[*]} ${conns[*]} --out $out/$tag.json"
  "$baton" bench read --backends raft --modes lease --rate "$rate" --duration "$read_duration" \
    "${read_short[@]}" "${conns[@]}" --dir "state/bench" --out "$out/$tag.json" | tail -n 12
}

if [ -n "${DRY:-}" ]; then
  bench dry-20k --rate 20000 --duration 5s --warmup 2s --baseline-duration 2s
  bench dry-20k-window --rate 20000 --duration 5s --warmup 2s --baseline-duration 2s \
    --config experiments/bench-configs/raft-window.toml
  python3 scripts/bench/summarize.py next "$out/dry-20k.json" "$out/dry-20k-window.json"
  exit 0
fi
last=${rates##* }
if [ -n "$rates" ]; then
  next_config=(--config "$NEXT_CONFIG")
  for rate in $rates; do
    plain=()
    [ "$rate" = "$last" ] && plain=(--plain-http)
    bench "next-$((rate / 1000))k" --rate "$rate" --duration "$duration" "${short[@]}" "${plain[@]}" \
      "${next_config[@]}"
  done
  if [ -n "$CIF2" ]; then
    bench "next-$((last / 1000))k-cif2" --rate "$last" --duration "$duration" "${short[@]}" \
      --config experiments/bench-configs/raft-commits-in-flight-2.toml
  fi
  if [ -n "$WINDOW_CONFIG" ]; then
    bench "next-$((last / 1000))k-window" --rate "$last" --duration "$duration" "${short[@]}" --plain-http \
      --config "$WINDOW_CONFIG"
  fi
  python3 scripts/bench/summarize.py next "$out"/next-*.json | tee "$out/summary.md"
fi
if [ -n "$read_rates" ]; then
  for rate in $read_rates; do
    read_bench "$rate"
  done
  python3 scripts/bench/summarize.py read "$out"/read-lease-*.json | tee -a "$out/summary.md"
fi
# Sharded leadership (issue 28): aggregate IDs/s against K on the same machine, one fleet per K
# pg-lease by default, whose only server, PostgreSQL, is in the bundle (SHARDS_BACKEND=raft
# needs nothing else either). SHARDS="1,4,16" by default; SHARDS="" skips it.
shards=${SHARDS-1,4,16}
shards_backend=${SHARDS_BACKEND-pg-lease}
shards_load=(--rate "${last:-500000}")
[ -n "${SHARDS_RATE_PER_SHARD:-}" ] && shards_load=(--rate-per-shard "$SHARDS_RATE_PER_SHARD")
shards_conns=${SHARDS_CONN_PER_SHARD-64}
[ -n "$shards_conns" ] && shards_load+=(--connections-per-shard "$shards_conns")
# Its nodes' config: $SHARDS_CONFIG; for pg-lease by default config/pg-lease.toml with a
# 4,096-connection cap (K x the per-shard connections reach each node in thirds); other
# backends, the bench's own default.
default_shards_config=
[ "$shards_backend" = pg-lease ] && default_shards_config=experiments/bench-configs/pg-lease-conns-4096.toml
shards_config=${SHARDS_CONFIG-$default_shards_config}
shards_config_arg=()
[ -n "$shards_config" ] && shards_config_arg=(--config "$shards_config")
if [ -n "$shards" ]; then
  say "baton bench shards --backend $shards_backend --shards $shards ${shards_load[*]} ${shards_config_arg[*]} --duration $duration"
  "$baton" bench shards --backend "$shards_backend" --shards "$shards" "${shards_load[@]}" \
    "${shards_config_arg[@]}" --duration "$duration" --out "$out/shards.json" | tail -n 8 | tee -a "$out/summary.md"
fi
# The device tool brings back 8 files: the reports travel as one.
if [ -n "${OUT:-}" ]; then
  tar -C "$out" -czf "$out/reports.tar.gz" $(cd "$out" && ls -- *.json)
  (cd "$out" && rm -f -- *.json)
  say "reports packed: $out/reports.tar.gz ($(tar -tzf "$out/reports.tar.gz" | wc -l) files)"
fi
