#!/usr/bin/env bash
# Issue 14's measurements, one command each; every run writes its JSON (command, config, machine,
# leadership changes) under experiments/results/bench-next/, and `summarize.py` turns them into
# the tables README and FINDINGS quote.
#
#   scripts/bench/perf.sh neighbour [RATE] [DURATION]
#                                      # 5 consecutive runs (default 50k IDs/s, 60 s) beside stress-ng 15%
#                                      # (PLAIN=1: each also runs GET /healthz the same way after it;
#                                      # SLICE_MS=10, here and in pairs and session: the neighbour in
#                                      # steady 10 ms busy slices)
#   scripts/bench/perf.sh sweep [RATES] [DURATION]  # each rate (default "10000 20000 30000 40000",
#                                      # 30 s) beside the neighbour with --plain-http (ROUND= names it)
#   scripts/bench/perf.sh pairs OLD NEW [RATE] [PAIRS]  # two builds' `baton bench next` in turn
#                                      # (OLD, NEW, OLD, ...), each a fresh fleet beside the 15%
#                                      # neighbour with --plain-http, 30 s (default 50k, 3 pairs)
#   scripts/bench/perf.sh session [RATE] [PAIRS]  # the neighbour in the generator's session vs
#                                      # in its own (setsid), alternating, 30 s each (50k, 3 pairs)
#   scripts/bench/perf.sh slices [RATE] [PAIRS] [SLICE_MS]  # the same 15% neighbour with
#                                      # stress-ng's default busy slices (random, up to 0.5 s flat
#                                      # out on both cores) vs steady SLICE_MS (10) slices,
#                                      # alternating, 30 s each with --plain-http (50k, 5 pairs)
#   scripts/bench/perf.sh alternate [RATE] [PAIRS]  # two variants of bench next beside the
#                                      # neighbour, alternating, 30 s each with --plain-http (50k,
#                                      # 3 pairs): VARIANT_A / VARIANT_B are extra arguments (e.g.
#                                      # "--connections 512"), TAG_A / TAG_B name the files
#   scripts/bench/perf.sh saturation   # raft and etcd at 50k/70k/90k, without and with the neighbour
#   scripts/bench/perf.sh ratio        # wrk closed loop: GET /healthz vs POST /next on a raft leader
#                                      # (CONFIG=file: the fleet's base config; ROUNDS=2,
#                                      # SECONDS_EACH=20 per run)
#   scripts/bench/perf.sh ab OLD NEW [ROUNDS]  # two builds side by side: a fleet each, up together,
#                                      # wrk on OLD /next, NEW /next and NEW /healthz in turn
#   scripts/bench/perf.sh starve OLD NEW [SECONDS] [ROUNDS]  # a fleet of each build, both leaders
#                                      # flooded at once (wrk GET /healthz, POST /next); counts
#                                      # each fleet's leadership changes (terms) per round
#   scripts/bench/perf.sh split [RATE] [SECONDS] [NEIGHBOUR%]  # where a request's time goes: the
#                                      # client's view (baton load) beside the leader's own
#                                      # histograms (sequencer wait+commit, commit alone)
#   scripts/bench/perf.sh profile [ROUNDS]  # CPU per request by thread/process (perf record -a),
#                                      # wrk on GET /healthz then POST /next, same leader, in turn
#   scripts/bench/perf.sh httpthread [ROUNDS]  # the leader's HTTP thread alone, with call
#                                      # graphs (perf --call-graph dwarf), under wrk on GET /healthz
#                                      # then POST /next: the share of its time in each stage
#                                      # (reading requests, the handler, writing responses, parked)
#   scripts/bench/perf.sh gen [RATE]   # the open-loop generator's own cost: `baton load` at RATE
#                                      # (default 30k) for 12 s, the machine sampled for 6 s; the
#                                      # generator's threads summed apart from the nodes' (TAG= names the
#                                      # run, FLEET_CONFIG= another base node config); also the
#                                      # machine's CPU by thread name (-comm.txt). LOAD_SECONDS=,
#                                      # SAMPLE_AFTER=, SAMPLE_SECONDS=, HZ= change 12, 4, 6, 499
#   scripts/bench/perf.sh pipe [ROUNDS] # [sequencer] commits_in_flight 1 vs 2, two fleets side by
#                                      # side, wrk on each /next at 8, 32, 256 connections
#   scripts/bench/perf.sh linger [RATE] [MS] [ROUNDS]  # [sequencer] min_commit_interval_ms 0 vs MS,
#                                      # bench next beside the neighbour, alternating (DURATION=30s)
#   scripts/bench/perf.sh reads [RATE] [ROUNDS]  # lease reads against GET /healthz: one raft fleet,
#                                      # `bench read --modes lease --rounds ROUNDS` (lease, healthz,
#                                      # lease, ... each DURATION=10s) at RATE (default 150000,
#                                      # above this machine's capacity: the answered rates are the
#                                      # limits), the medians of the ratios; each row says what
#                                      # limited it (CONNECTIONS=, LOAD_THREADS= override)
#   scripts/bench/perf.sh readpairs OLD NEW [RATE] [PAIRS]  # the same for two builds in turn (OLD,
#                                      # NEW, OLD, ...), a fresh fleet and one round each
#   scripts/bench/perf.sh leaseab OLD NEW [ROUNDS]  # the lease-read server path of two builds: a
#                                      # fleet each, both up; wrk -t1 -c256 closed loop on each
#                                      # leader's GET /read?mode=lease and GET /healthz in turn
#                                      # (SECONDS_EACH=10), with the leader's HTTP thread's CPU per
#                                      # request (/proc ticks over the run)
#   scripts/bench/perf.sh serial OLD NEW [RATE] [ROUNDS]  # the sequencer's serial stage in µs of
#                                      # CPU per ID: a fresh fleet of each build in turn (OLD, NEW,
#                                      # OLD, ...), `baton load` at RATE (30k) and, over 6 s of it,
#                                      # perf --call-graph dwarf on the leader's commit thread
#                                      # (baton-http-0) and every thread's CPU from schedstat
#                                      # (ROUNDS=2; CONNECTIONS=256; CONFIG= a base node config;
#                                      # OLD_CONFIG= / NEW_CONFIG= one per side: the same build
#                                      # at two batch sizes, e.g. a linger, shows the per-commit
#                                      # cost is flat in the batch)
#   scripts/bench/perf.sh modes [ROUNDS]  # `POST /next` durable and window, and `GET /healthz`,
#                                      # wrk closed loop on one fleet of each mode, in turn: the
#                                      # ratios to plain HTTP of issue 31 (SECONDS_EACH=15;
#                                      # WRK_CONNECTIONS=256, the same for all three routes)
#
# Uses the release binary (cargo build --release --bin baton). ratio, ab and pipe first drive each
# leader's /next for WARMUP_SECONDS (10), unmeasured. The neighbour is
# `stress-ng --cpu 2 --cpu-load 15` (about 15% of this 2-core machine), started after the warm-up.
set -euo pipefail
cd "$(dirname "$0")/../.."
BATON=${BATON:-target/release/baton}
OUT=${OUT:-experiments/results/bench-next}
mkdir -p "$OUT"
[ -x "$BATON" ] || { echo "build first: cargo build --release --bin baton" >&2; exit 2; }
# shellcheck source=scripts/bench/fleet.sh
. scripts/bench/fleet.sh

# The raft leader's HTTP address in the fleet at $2 (run with binary $1), once there is one.
leader_of() {
  local bin=$1 dir=$2 leader=""
  for _ in $(seq 1 100); do
    leader=$("$bin" fleet status --dir "$dir" --json | python3 -c \
      'import json,sys; print(next((r["http_addr"] for r in json.load(sys.stdin) if r.get("role")=="leader"), ""))')
    [ -n "$leader" ] && { echo "$leader"; return; }
    sleep 0.2
  done
  echo "no leader in $dir" >&2
  exit 1
}

# The current raft term of the fleet at $2 (its leader's token), or 0.
term_of() {
  "$1" fleet status --dir "$2" --json | python3 -c \
    'import json,sys; print(max([r.get("token") or 0 for r in json.load(sys.stdin)] or [0]))'
}

# Fleets of two builds side by side: $1 in $3, $2 in $4, both taken down on exit.
two_fleets() {
  local old=$1 new=$2 a=$3 b=$4 config_a=${5:-} config_b=${6:-}
  fresh_fleet "$old" "$a" ${config_a:+--config "$config_a"}
  fresh_fleet "$new" "$b" ${config_b:+--config "$config_b"}
  trap '"'"$old"'" fleet down --dir "'"$a"'" >/dev/null 2>&1; "'"$new"'" fleet down --dir "'"$b"'" >/dev/null 2>&1 || true' EXIT
}

# Drives the leader at $1 with `POST /next` for WARMUP_SECONDS (10) before anything is measured:
# the first run on fresh fleets was the slow one, whichever build it hit (FINDINGS §11.6).
warm_up() {
  wrk -t1 -c256 -d"${WARMUP_SECONDS:-10}"s -s scripts/bench/post-next.lua "http://$1/next" >/dev/null
}

# "R req/s, N non-2xx" from one wrk output file.
wrk_result() {
  echo "$(grep -oP 'Requests/sec:\s+\K[\d.]+' "$1") req/s, $(grep -oP 'Non-2xx or 3xx responses: \K\d+' "$1" || echo 0) non-2xx"
}

# Rates RATES (a quoted list) beside the 15% neighbour, each with --plain-http: at which rate the
# sequencer's p99 from schedule, and plain HTTP's on the same generator, stay under 20 ms.
sweep() {
  local rates=${1:-"10000 20000 30000 40000"} duration=${2:-30s} round=${ROUND:-1}
  for rate in $rates; do
    "$BATON" bench next --backend raft --rate "$rate" --duration "$duration" --neighbour-cpu-percent 15 \
      --plain-http --out "$OUT/sweep-raft-$((rate / 1000))k-$duration-round$round.json"
  done
}

# One `bench next` of binary $1 on raft at rate $2 for $3 beside the 15% neighbour, report to $4;
# further arguments go to bench next.
next_beside_neighbour() {
  local bin=$1 rate=$2 duration=$3 out=$4
  shift 4
  "$bin" bench next --backend raft --rate "$rate" --duration "$duration" --neighbour-cpu-percent 15 \
    ${SLICE_MS:+--neighbour-slice-ms "$SLICE_MS"} "$@" --out "$out"
}

neighbour() {
  local rate=${1:-50000} duration=${2:-60s}
  for i in 1 2 3 4 5; do
    next_beside_neighbour "$BATON" "$rate" "$duration" \
      "$OUT/neighbour15${SLICE_MS:+-slice$SLICE_MS}-raft-$((rate / 1000))k-$duration${PLAIN:+-plain}-run$i.json" \
      ${PLAIN:+--plain-http}
  done
}

pairs() {
  local old=$1 new=$2 rate=${3:-50000} n=${4:-3}
  for i in $(seq 1 "$n"); do
    for bin in "$old" "$new"; do
      next_beside_neighbour "$bin" "$rate" 30s "$OUT/$(basename "$bin")-$((rate / 1000))k-run$i.json" \
        --plain-http >/dev/null
    done
  done
  python3 scripts/bench/summarize.py next "$OUT"/*-run*.json
}

# The neighbour in the generator's session (bench next's default, every run above) against the
# same neighbour in a session of its own (--neighbour-own-session), alternating, PAIRS pairs at
# RATE, 30 s each. With sched_autogroup_enabled = 1 the kernel shares CPU between sessions first,
# so the neighbour's session decides whose share it takes.
session() {
  local rate=${1:-50000} n=${2:-3}
  echo "# session: $(nproc) cores; sched_autogroup_enabled=$(cat /proc/sys/kernel/sched_autogroup_enabled)"
  TAG_A=shared VARIANT_A="" TAG_B=own VARIANT_B="--neighbour-own-session" alternate "$rate" "$n"
}

# The neighbour's shape: the same 15% either in stress-ng's default busy slices (a random 0-500
# ms each, both cores flat out, then a sleep) or in steady SLICE_MS ones, alternating, PAIRS pairs.
slices() {
  local rate=${1:-50000} n=${2:-5} slice=${3:-10}
  TAG_A=slice0 VARIANT_A="--neighbour-slice-ms 0" TAG_B="slice$slice" \
    VARIANT_B="--neighbour-slice-ms $slice" alternate "$rate" "$n"
}

# Two variants of `bench next` (VARIANT_A / VARIANT_B: extra arguments) beside the neighbour,
# alternating, PAIRS pairs of 30 s runs with --plain-http at RATE; TAG_A / TAG_B name the files.
alternate() {
  local rate=${1:-50000} n=${2:-3}
  : "${TAG_A:?}" "${TAG_B:?}"
  for i in $(seq 1 "$n"); do
    for v in A B; do
      local tag=TAG_$v variant=VARIANT_$v
      # Word splitting of the variant is the point: it is a list of arguments.
      # shellcheck disable=SC2086
      next_beside_neighbour "$BATON" "$rate" 30s "$OUT/${!tag}-$((rate / 1000))k-run$i.json" \
        --plain-http ${!variant:-} >/dev/null
    done
  done
  python3 scripts/bench/summarize.py next "$OUT/$TAG_A"-*-run*.json "$OUT/$TAG_B"-*-run*.json
}

saturation() {
  for backend in raft etcd; do
    for rate in 50000 70000 90000; do
      for n in 0 15; do
        "$BATON" bench next --backend "$backend" --rate "$rate" --duration 30s --connections 512 \
          --baseline-duration 2s --neighbour-cpu-percent "$n" --out "$OUT/saturation-$backend-$((rate / 1000))k-n$n-30s.json"
      done
    done
  done
}

ratio() {
  local dir=state/bench/wrk leader
  fresh_fleet "$BATON" "$dir" ${CONFIG:+--config "$CONFIG"}
  down_on_exit "$BATON" "$dir"
  leader=$(leader_of "$BATON" "$dir")
  warm_up "$leader"
  local log="$OUT/wrk-ratio.txt"
  : >"$log"
  # Alternate the two, twice each (ROUNDS=), so a neighbour's drift hits both alike;
  # SECONDS_EACH=60 ROUNDS=1 is the issue's "sustained for 60 s".
  local secs=${SECONDS_EACH:-20}
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for what in healthz next; do
      if [ "$what" = healthz ]; then
        echo "## round $round: wrk -t1 -c256 -d${secs}s http://$leader/healthz" | tee -a "$log"
        wrk -t1 -c256 -d"${secs}"s --latency "http://$leader/healthz" | tee -a "$log"
      else
        echo "## round $round: wrk -t1 -c256 -d${secs}s -s scripts/bench/post-next.lua http://$leader/next" | tee -a "$log"
        wrk -t1 -c256 -d"${secs}"s --latency -s scripts/bench/post-next.lua "http://$leader/next" | tee -a "$log"
      fi
    done
  done
  "$BATON" check --dir "$dir" | tee -a "$log"
  python3 scripts/bench/summarize.py ratio "$log"
}

ab() {
  local old=$1 new=$2 rounds=${3:-3}
  local a=state/bench/ab-old b=state/bench/ab-new
  two_fleets "$old" "$new" "$a" "$b"
  local la lb
  la=$(leader_of "$old" "$a")
  lb=$(leader_of "$new" "$b")
  warm_up "$la"
  warm_up "$lb"
  local log="$OUT/wrk-ab.txt"
  {
    echo "# ab: old=$old ($("$old" --version 2>/dev/null || true)) new=$new; $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo)"
    echo "# both fleets up throughout (the idle one is the other's neighbour)"
  } | tee "$log"
  for round in $(seq 1 "$rounds"); do
    for what in "old next $la" "new next $lb" "new healthz $lb"; do
      set -- $what
      local url="http://$3/$2" script=()
      [ "$2" = next ] && script=(-s scripts/bench/post-next.lua)
      echo "## round $round: $1 wrk -t1 -c256 -d15s ${script[*]} $url" | tee -a "$log"
      wrk -t1 -c256 -d15s --latency "${script[@]}" "$url" | tee -a "$log"
    done
  done
  "$old" check --dir "$a" | tee -a "$log"
  "$new" check --dir "$b" | tee -a "$log"
  python3 scripts/bench/summarize.py ab "$log"
}

starve() {
  local old=$1 new=$2 secs=${3:-60} rounds=${4:-2}
  local a=state/bench/starve-old b=state/bench/starve-new
  two_fleets "$old" "$new" "$a" "$b"
  local log="$OUT/starve.txt"
  echo "# starve: old=$old new=$new; ${secs}s rounds; $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo)" | tee "$log"
  for round in $(seq 1 "$rounds"); do
    for what in healthz next; do
      local la lb ta tb script=()
      la=$(leader_of "$old" "$a"); lb=$(leader_of "$new" "$b")
      ta=$(term_of "$old" "$a"); tb=$(term_of "$new" "$b")
      [ "$what" = next ] && script=(-s scripts/bench/post-next.lua)
      wrk -t1 -c256 -d"${secs}s" "${script[@]}" "http://$la/$what" >"$OUT/starve-old-$round-$what.txt" &
      wrk -t1 -c256 -d"${secs}s" "${script[@]}" "http://$lb/$what" >"$OUT/starve-new-$round-$what.txt"
      wait
      sleep 2
      echo "round $round $what: old term $ta -> $(term_of "$old" "$a") ($(wrk_result "$OUT/starve-old-$round-$what.txt")); new term $tb -> $(term_of "$new" "$b") ($(wrk_result "$OUT/starve-new-$round-$what.txt"))" | tee -a "$log"
    done
  done
  "$old" check --dir "$a" | tee -a "$log"
  "$new" check --dir "$b" | tee -a "$log"
}

split() {
  local rate=${1:-15000} secs=${2:-20} neighbour=${3:-0} dir=state/bench/split
  # FLEET_CONFIG: another base node config (e.g. one [http] setting changed) for a control run.
  fresh_fleet "$BATON" "$dir" ${FLEET_CONFIG:+--config "$FLEET_CONFIG"}
  down_on_exit "$BATON" "$dir"
  local leader tag="raft-$((rate / 1000))k-${secs}s-n$neighbour${TAG:+-$TAG}"
  leader=$(leader_of "$BATON" "$dir")
  curl -s "http://$leader/metrics" >"$OUT/split-$tag-before.prom"
  # The neighbour ends by itself (--timeout) just after the measured window.
  [ "$neighbour" -gt 0 ] && { stress-ng --cpu 2 --cpu-load "$neighbour" --timeout "$((secs + 5))s" >/dev/null 2>&1 & }
  "$BATON" load --dir "$dir" --rate "$rate" --duration "${secs}s" --connections 256 --json >"$OUT/split-$tag-client.json"
  curl -s "http://$leader/metrics" >"$OUT/split-$tag-after.prom"
  python3 scripts/bench/summarize.py split "$OUT/split-$tag"
}

# Samples into $1.data for 6 s in the middle of a 12 s wrk run on the leader $2's /$3 (wrk's
# report in $1-wrk.txt); further arguments go to `perf record` and say what to sample (-a: the
# whole machine, -t TID: one thread).
sample_under_wrk() {
  local tag=$1 leader=$2 what=$3 script=()
  shift 3
  [ "$what" = next ] && script=(-s scripts/bench/post-next.lua)
  wrk -t1 -c256 -d12s "${script[@]}" "http://$leader/$what" >"$tag-wrk.txt" &
  sleep 3
  perf record "$@" -o "$tag.data" -- sleep 6 >/dev/null 2>&1
  wait
}

# Where the CPU goes per request: the whole machine sampled (no call graphs, so the sampling
# costs little) on /healthz, then on /next, against the same leader; summarize.py divides each
# thread's share by the run's rate. Then one /next run with call graphs for PostgreSQL's share.
profile() {
  local rounds=${1:-2} dir=state/bench/profile leader
  fresh_fleet "$BATON" "$dir"
  down_on_exit "$BATON" "$dir"
  leader=$(leader_of "$BATON" "$dir")
  local base="$OUT/profile"
  for round in $(seq 1 "$rounds"); do
    for what in healthz next; do
      local tag="$base-$round-$what"
      sample_under_wrk "$tag" "$leader" "$what" -a -F 499
      perf report -i "$tag.data" --sort comm --stdio 2>/dev/null | grep -E '^ +[0-9]' >"$tag-comm.txt"
      rm -f "$tag.data"
    done
  done
  sample_under_wrk "$base-pg" "$leader" next -a -F 999 -g
  perf report -i "$base-pg.data" --comm postgres --children --sort sym --stdio -g none 2>/dev/null |
    grep -E '^ +[0-9]' | grep -v '0x0000' | awk 'NR <= 40' >"$base-pg-callers.txt"
  rm -f "$base-pg.data"
  curl -s "http://$leader/metrics" | grep -E '^baton_(sequencer_commit|next_request)_duration_seconds_count' >"$base-counts.txt"
  "$BATON" check --dir "$dir" | tee "$base-check.txt"
  python3 scripts/bench/summarize.py profile "$base" "$rounds"
}

# The HTTP thread's time by stage, from inclusive (children) shares of its own samples. The
# frames named are hyper's and tokio's that every request passes through (with debug info, perf
# resolves inlined frames); their shares say how much of the thread's time each stage takes.
# perf lists a frame again for the odd sample it resolved elsewhere: the first (largest) counts.
httpthread() {
  local rounds=${1:-1} dir=state/bench/httpthread leader pid tid
  fresh_fleet "$BATON" "$dir"
  down_on_exit "$BATON" "$dir"
  leader=$(leader_of "$BATON" "$dir")
  pid=$("$BATON" fleet status --dir "$dir" --json | python3 -c \
    'import json,sys; print(next(r["pid"] for r in json.load(sys.stdin) if r.get("role")=="leader"))')
  tid=$(grep -l '^baton-http' /proc/"$pid"/task/*/comm | head -1 | cut -d/ -f5)
  warm_up "$leader"
  local log="$OUT/httpthread.txt" tag="$OUT/httpthread-sample"
  echo "# the leader's HTTP thread (tid $tid), perf record -F 999 --call-graph dwarf for 6 s under wrk -t1 -c256; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" | tee "$log"
  for round in $(seq 1 "$rounds"); do
    for what in healthz next; do
      sample_under_wrk "$tag" "$leader" "$what" -t "$tid" -F 999 --call-graph dwarf,16384
      echo "## round $round, $what: $(wrk_result "$tag-wrk.txt")" | tee -a "$log"
      perf report -i "$tag.data" --children --sort sym --stdio -g none 2>/dev/null |
        grep -E 'Dispatcher<D,Bs,I,T>::poll_(flush|read_head) |Dispatch>::poll_msg |CoreGuard::block_on$|routes::bounded_route' |
        sed -E 's/^ +([0-9.]+%) +[0-9.]+% +\[.\] /\1 /' | awk '!seen[substr($0, index($0, " "))]++' | tee -a "$log"
      rm -f "$tag.data" "$tag-wrk.txt"
    done
  done
}

gen() {
  local rate=${1:-30000} dir=state/bench/gen
  fresh_fleet "$BATON" "$dir" ${FLEET_CONFIG:+--config "$FLEET_CONFIG"}
  down_on_exit "$BATON" "$dir"
  leader_of "$BATON" "$dir" >/dev/null
  local tag="$OUT/gen-$((rate / 1000))k${TAG:+-$TAG}" pid
  "$BATON" load --dir "$dir" --rate "$rate" --duration "${LOAD_SECONDS:-12}s" --connections 256 --json >"$tag.json" &
  pid=$!
  sleep "${SAMPLE_AFTER:-4}"
  ls "/proc/$pid/task" >"$tag-tids.txt"
  perf record -F "${HZ:-499}" -a -o "$tag.data" -- sleep "${SAMPLE_SECONDS:-6}" >/dev/null 2>&1
  wait "$pid"
  perf report -i "$tag.data" --sort pid --stdio 2>/dev/null | grep -E '^ +[0-9]' >"$tag-threads.txt"
  perf report -i "$tag.data" --sort comm --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -15 >"$tag-comm.txt"
  rm -f "$tag.data"
  python3 scripts/bench/summarize.py gen "$tag"
}

# Two raft fleets of the same build up at once, `[sequencer] commits_in_flight` 1 and 2
# (experiments/bench-configs/raft-commits-in-flight-{1,2}.toml), wrk closed loop on each
# leader's POST /next in turn at 8, 32 and 256 connections, ROUNDS rounds.
pipe() {
  local rounds=${1:-3} a=state/bench/pipe1 b=state/bench/pipe2
  two_fleets "$BATON" "$BATON" "$a" "$b" experiments/bench-configs/raft-commits-in-flight-1.toml \
    experiments/bench-configs/raft-commits-in-flight-2.toml
  local la lb log="$OUT/wrk-pipe.txt"
  la=$(leader_of "$BATON" "$a")
  lb=$(leader_of "$BATON" "$b")
  warm_up "$la"
  warm_up "$lb"
  echo "# pipe: $("$BATON" --version 2>/dev/null || true); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo); both fleets up throughout" | tee "$log"
  for round in $(seq 1 "$rounds"); do
    for c in 8 32 256; do
      for side in "1 $la" "2 $lb"; do
        set -- $side
        echo "## round $round: commits_in_flight=$1 wrk -t1 -c$c -d10s --latency -s scripts/bench/post-next.lua http://$2/next" | tee -a "$log"
        wrk -t1 -c"$c" -d10s --latency -s scripts/bench/post-next.lua "http://$2/next" | tee -a "$log"
      done
    done
  done
  "$BATON" check --dir "$a" | tail -1 | tee -a "$log"
  "$BATON" check --dir "$b" | tail -1 | tee -a "$log"
  python3 scripts/bench/summarize.py pipe "$log"
}

# `[sequencer] min_commit_interval_ms` 0 against MS (experiments/bench-configs/
# raft-min-commit-interval-{0,MS}.toml), `baton bench next` at RATE beside the 15% neighbour,
# alternating, ROUNDS rounds: what fewer, larger group commits do to the rate carried and the tail.
linger() {
  local rate=${1:-50000} ms=${2:-2} rounds=${3:-3} duration=${DURATION:-30s}
  for round in $(seq 1 "$rounds"); do
    for interval in 0 "$ms"; do
      "$BATON" bench next --backend raft --rate "$rate" --duration "$duration" --neighbour-cpu-percent 15 \
        --config "experiments/bench-configs/raft-min-commit-interval-$interval.toml" \
        --out "$OUT/linger-$((rate / 1000))k-$duration-interval$interval-run$round.json"
    done
  done
}

# `bench read --modes lease` of binary $1 at rate $2, ROUNDS $3, report to $4.
read_lease() {
  local bin=$1 rate=$2 rounds=$3 out=$4
  "$bin" bench read --backends raft --modes lease --rate "$rate" --duration "${DURATION:-10s}" \
    --rounds "$rounds" ${CONNECTIONS:+--connections "$CONNECTIONS"} \
    ${LOAD_THREADS:+--load-threads "$LOAD_THREADS"} --out "$out"
}

reads() {
  local rate=${1:-150000} rounds=${2:-5}
  local out="$OUT/reads-lease-$((rate / 1000))k-rounds$rounds${TAG:+-$TAG}.json"
  read_lease "$BATON" "$rate" "$rounds" "$out"
  python3 scripts/bench/summarize.py read "$out"
}

readpairs() {
  local old=$1 new=$2 rate=${3:-150000} n=${4:-3}
  for i in $(seq 1 "$n"); do
    for bin in "$old" "$new"; do
      read_lease "$bin" "$rate" 1 "$OUT/readpair-$(basename "$bin")-$((rate / 1000))k-run$i.json" >/dev/null
    done
  done
  python3 scripts/bench/summarize.py read "$OUT"/readpair-*-"$((rate / 1000))"k-run*.json
}

# The HTTP thread's CPU ticks of process $1 (its first `baton-http-*` thread).
http_thread_ticks() {
  awk '/\(baton-http-0\)/ { i = index($0, ") "); split(substr($0, i + 2), f, " "); print f[12] + f[13] }' \
    /proc/"$1"/task/*/stat
}

# The raft leader of the fleet at $2 (binary $1): "ADDR PID".
leader_pid_of() {
  "$1" fleet status --dir "$2" --json | python3 -c \
    'import json,sys; print(next((r["http_addr"] + " " + str(r["pid"]) for r in json.load(sys.stdin) if r.get("role")=="leader"), ""))'
}

leaseab() {
  local old=$1 new=$2 rounds=${3:-5} secs=${SECONDS_EACH:-10}
  local a=state/bench/lease-old b=state/bench/lease-new log="$OUT/wrk-lease-ab.txt"
  two_fleets "$old" "$new" "$a" "$b"
  leader_of "$old" "$a" >/dev/null
  leader_of "$new" "$b" >/dev/null
  echo "# leaseab: old=$old new=$new; wrk -t1 -c256 -d${secs}s; $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$log"
  for round in $(seq 1 "$rounds"); do
    for side in "old $old $a" "new $new $b"; do
      set -- $side
      for what in "read?mode=lease" healthz; do
        local l pid t0 t1
        read -r l pid < <(leader_pid_of "$2" "$3")
        t0=$(http_thread_ticks "$pid")
        wrk -t1 -c256 -d"${secs}s" --latency "http://$l/$what" >"$OUT/lease-ab.wrk"
        t1=$(http_thread_ticks "$pid")
        python3 - "$OUT/lease-ab.wrk" "$round" "$1" "$what" "$((t1 - t0))" "$(getconf CLK_TCK)" <<'PY' | tee -a "$log"
import re, sys
text = open(sys.argv[1]).read()
rnd, side, what, ticks, hz = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
total = int(re.search(r"(\d+) requests in", text).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
p99 = re.search(r"^\s+99%\s+(\S+)", text, re.M).group(1)
print(f"round {rnd} {side} {what}: {rps:.0f} req/s, non-2xx {non2xx.group(1) if non2xx else 0}, "
      f"p99 {p99}, HTTP thread {ticks / hz / max(total, 1) * 1e6:.2f} us/request")
PY
      done
    done
  done
  rm -f "$OUT/lease-ab.wrk"
  python3 scripts/bench/summarize.py leaseab "$log"
}

# The serial stage of the sequencer, per ID (issue 31 item 1): what one thread must do for every
# group commit, which caps a shard's IDs/s however many cores serve HTTP. It is the sequencer
# actor (taking the waiting requests, cutting the range, sending the commit), its commit tasks
# (the outcome, and handing out the answers), or in builds since FINDINGS §17.6 the one commit
# loop that does all of that, and its PostgreSQL connection's I/O, all on the
# leader's first client thread (src/work/sequencer.rs); their inclusive share of that thread's
# samples (perf --call-graph dwarf), times the thread's CPU time over
# the window (schedstat), over the IDs committed in it (the leader's baton_sequencer_batch_ids
# sum) is µs per ID. Per-request work that runs on the thread that serves the request (parsing,
# the reply channel, the answer's text) is not serial and not counted; every thread's CPU per ID
# is printed beside it.
thread_times() { # PID -> "tid comm ns" per thread
  local pid=$1 t
  for t in /proc/"$pid"/task/*; do
    echo "${t##*/} $(tr ' ' '_' <"$t/comm") $(cut -d' ' -f1 "$t/schedstat")"
  done
}

serial() {
  local old=$1 new=$2 rate=${3:-30000} rounds=${4:-2} dir=state/bench/serial
  local log="$OUT/serial.txt"
  echo "# serial: old=$old${OLD_CONFIG:+ ($OLD_CONFIG)} new=$new${NEW_CONFIG:+ ($NEW_CONFIG)}; rate $rate; $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" | tee "$log"
  for round in $(seq 1 "$rounds"); do
    for side in old new; do
      local bin=${!side} tag="$OUT/serial-$round-$side" leader pid tid cfg
      # OLD_CONFIG / NEW_CONFIG: a config per side (e.g. one build at two batch sizes).
      cfg=$([ "$side" = old ] && echo "${OLD_CONFIG:-${CONFIG:-}}" || echo "${NEW_CONFIG:-${CONFIG:-}}")
      fresh_fleet "$bin" "$dir" ${cfg:+--config "$cfg"}
      down_on_exit "$bin" "$dir"
      leader=$(leader_of "$bin" "$dir")
      pid=$("$bin" fleet status --dir "$dir" --json | python3 -c \
        'import json,sys; print(next(r["pid"] for r in json.load(sys.stdin) if r.get("role")=="leader"))')
      tid=$(grep -l '^baton-http-0$' /proc/"$pid"/task/*/comm | head -1 | cut -d/ -f5)
      WARMUP_SECONDS=5 warm_up "$leader"
      "$bin" load --dir "$dir" --rate "$rate" --duration 14s --connections "${CONNECTIONS:-256}" --json >"$tag-load.json" &
      local load=$!
      sleep 4
      curl -s "http://$leader/metrics" | grep -E '^baton_sequencer_batch_ids_(sum|count)' >"$tag-before.prom"
      thread_times "$pid" >"$tag-threads-before.txt"
      perf record -t "$tid" -F 999 --call-graph dwarf,16384 -o "$tag.data" -- sleep 6 >/dev/null 2>&1
      thread_times "$pid" >"$tag-threads-after.txt"
      curl -s "http://$leader/metrics" | grep -E '^baton_sequencer_batch_ids_(sum|count)' >"$tag-after.prom"
      wait "$load"
      # --no-inline: resolving inlined frames takes minutes on this binary; the frames counted
      # are the tasks' own poll functions, which are not inlined. summarize.py classifies the
      # stacks (-categories.json) and removes them.
      perf script -i "$tag.data" --no-inline 2>/dev/null >"$tag-stacks.txt"
      rm -f "$tag.data"
      "$bin" check --dir "$dir" | tail -1 >"$tag-check.txt"
      "$bin" fleet down --dir "$dir" >/dev/null 2>&1 || true
      echo "## round $round, $side ($bin): $(python3 scripts/bench/summarize.py serial "$tag")" | tee -a "$log"
    done
  done
  python3 scripts/bench/summarize.py serial-table "$log" | tee -a "$log"
}

# Issue 31's ratios on this machine: `POST /next` in durable mode and in window mode against
# `GET /healthz`, wrk closed loop (-t1 -c256, SECONDS_EACH s each), one fleet per mode up in
# turn, the three alternating for ROUNDS rounds; `baton check` on each fleet's ledger.
modes() {
  local rounds=${1:-3} secs=${SECONDS_EACH:-15} conns=${WRK_CONNECTIONS:-256}
  local log="$OUT/wrk-modes${WRK_CONNECTIONS:+-c$WRK_CONNECTIONS}.txt"
  local a=state/bench/modes-durable b=state/bench/modes-window
  two_fleets "$BATON" "$BATON" "$a" "$b" "" experiments/bench-configs/raft-window.toml
  local la lb
  la=$(leader_of "$BATON" "$a")
  lb=$(leader_of "$BATON" "$b")
  warm_up "$la"
  warm_up "$lb"
  echo "# modes: $("$BATON" --version 2>/dev/null || true); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo); both fleets up throughout" | tee "$log"
  for round in $(seq 1 "$rounds"); do
    for what in "durable next $la" "window next $lb" "durable healthz $la"; do
      set -- $what
      local url="http://$3/$2" script=()
      [ "$2" = next ] && script=(-s scripts/bench/post-next.lua)
      echo "## round $round: $1 wrk -t1 -c$conns -d${secs}s ${script[*]} $url" | tee -a "$log"
      wrk -t1 -c"$conns" -d"${secs}"s --latency "${script[@]}" "$url" | tee -a "$log"
    done
  done
  "$BATON" check --dir "$a" | tail -1 | tee -a "$log"
  "$BATON" check --dir "$b" | tail -1 | tee -a "$log"
  python3 scripts/bench/summarize.py modes "$log"
}

case "${1:-}" in
  neighbour) shift; neighbour "$@" ;;
  sweep) shift; sweep "$@" ;;
  pairs) shift; pairs "$@" ;;
  session) shift; session "$@" ;;
  slices) shift; slices "$@" ;;
  alternate) shift; alternate "$@" ;;
  saturation) saturation ;;
  ratio) ratio ;;
  ab) shift; ab "$@" ;;
  starve) shift; starve "$@" ;;
  split) shift; split "$@" ;;
  profile) shift; profile "$@" ;;
  httpthread) shift; httpthread "$@" ;;
  gen) shift; gen "$@" ;;
  pipe) shift; pipe "$@" ;;
  linger) shift; linger "$@" ;;
  reads) shift; reads "$@" ;;
  readpairs) shift; readpairs "$@" ;;
  leaseab) shift; leaseab "$@" ;;
  serial) shift; serial "$@" ;;
  modes) shift; modes "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | grep '^#'; exit 2 ;;
esac
