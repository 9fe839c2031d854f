#!/usr/bin/env bash
# deploy/baton-run.service's timing on one host: three `baton run` nodes (raft) with the unit's
# --stop-timeout and --child-stop-margin, and the lease and election timeout that `baton config
# init --child-stop-margin` derives for that margin. Then:
#   1. MINUTES (10) beside `stress-ng --cpu 2`, no fault: every demotion counted (the watchdog's
#      `deadline-passed`, the supervisor's `demoted`, every `elected` after the first);
#   2. KILLS (5) kill -9 of the leader's baton, no neighbour: failover = kill to the next
#      `elected` in another node's trace (wall clock, one host), and to its program's start.
#
#   scripts/bench/run-unit-neighbour.sh [MINUTES] [KILLS]
#     BATON=  the binary (target/release/baton)
#     OUT=    where the summary and the nodes' traces and logs go
#             (experiments/results/run-unit-neighbour)
#     LEASE_TTL_MS= / ELECTION_TIMEOUT=  timing in place of config init's (e.g. the old derivation,
#             5400 and 5400-10800, for a before/after on the same host)
#
# The fleet's PostgreSQL, node roles, raft peers and cluster secret come from `baton fleet up`;
# its `baton node` processes are stopped and `baton run` nodes start on the same configs with
# the timing above. The program is a shell loop that ends when its baton is gone.
set -euo pipefail
cd "$(dirname "$0")/../.."
BATON=${BATON:-target/release/baton}
minutes=${1:-10} kills=${2:-5}
dir=state/bench/run-unit out=${OUT:-experiments/results/run-unit-neighbour}
# shellcheck source=scripts/bench/fleet.sh
. scripts/bench/fleet.sh
mkdir -p "$out"

unit=deploy/baton-run.service
stop_timeout=$(grep -o -- '--stop-timeout [^ ]*' "$unit" | cut -d' ' -f2)
margin=$(grep -o -- '--child-stop-margin [^ ]*' "$unit" | cut -d' ' -f2)
derived=$("$BATON" config init --node-id n1 --peers n1=127.0.0.1:7001/7101 \
  --database-url postgres://baton_node_n1@127.0.0.1/baton --child-stop-margin "$margin")
ttl=${LEASE_TTL_MS:-$(sed -n 's/^lease_ttl_ms = //p' <<<"$derived")}
election=${ELECTION_TIMEOUT:-$(sed -n 's/^election_timeout_ms = "\(.*\)"/\1/p' <<<"$derived")}
echo "unit: --stop-timeout $stop_timeout --child-stop-margin $margin; lease_ttl_ms $ttl, election_timeout_ms $election"

fresh_fleet "$BATON" "$dir"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$BATON" fleet down --dir "$dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT
for n in n1 n2 n3; do "$BATON" fleet kill "$n" --dir "$dir" >/dev/null; done

declare -A pid_of
start_node() {
  local n=$1 cfg=$dir/run-$1.toml
  setsid "$BATON" run --config "$cfg" --stop-timeout "$stop_timeout" --child-stop-margin "$margin" \
    -- sh -c 'while kill -0 "$PPID" 2>/dev/null; do sleep 0.5; done' >>"$dir/run-$n.log" 2>&1 &
  pid_of[$n]=$!
  pids+=("$!")
}
for n in n1 n2 n3; do
  sed -e "s/^lease_ttl_ms = .*/lease_ttl_ms = $ttl/" \
      -e "s/^election_timeout_ms = .*/election_timeout_ms = \"$election\"/" \
      -e "s|^state_dir = .*|state_dir = \"$PWD/$dir/run-$n\"|" \
      "$dir/nodes/$n/config.toml" >"$dir/run-$n.toml"
  chmod 600 "$dir/run-$n.toml"
  start_node "$n"
done

addr() { sed -n 's/^http_listen = "\(.*\)"/\1/p' "$dir/run-$1.toml"; }
leader() {
  for n in n1 n2 n3; do
    if curl -s -m 1 "http://$(addr "$n")/status" 2>/dev/null | grep -q '"role":"leader"'; then
      echo "$n"; return
    fi
  done
}
wait_leader() {
  for _ in $(seq 1 600); do
    l=$(leader); [ -n "$l" ] && { echo "$l"; return; }
    sleep 0.1
  done
  echo "no leader within 60 s" >&2; exit 1
}
now_ms() { date +%s%3N; }

first=$(wait_leader)
echo "leader $first; settling 5 s"
sleep 5

# 1. The neighbour, no fault.
t0=$(now_ms)
echo "phase 1: ${minutes} min beside stress-ng --cpu 2 (from $t0)"
stress-ng --cpu 2 --timeout "${minutes}m" >/dev/null 2>&1
t1=$(now_ms)

# 2. kill -9 of the leader, KILLS times.
kill_ms=()
for k in $(seq 1 "$kills"); do
  l=$(wait_leader)
  sleep 2
  kill_ms+=("$(now_ms):$l")
  kill -9 "${pid_of[$l]}"
  echo "kill $k: $l"
  # Wait for someone else to lead, then give the restarted node time to rejoin.
  for _ in $(seq 1 300); do
    nl=$(leader); [ -n "$nl" ] && [ "$nl" != "$l" ] && break
    sleep 0.1
  done
  start_node "$l"
  sleep 15
done

python3 - "$dir" "$out" "$t0" "$t1" "$ttl" "$election" "$stop_timeout" "$margin" "$minutes" "${kill_ms[@]}" <<'PY'
import json, sys, statistics
d, out, t0, t1, ttl, election, stop, margin, minutes = sys.argv[1:10]
t0, t1 = int(t0), int(t1)
kills = [(int(k.split(":")[0]), k.split(":")[1]) for k in sys.argv[10:]]
events = []
for n in ("n1", "n2", "n3"):
    with open(f"{d}/run-{n}/actor-trace.jsonl") as f:
        for line in f:
            e = json.loads(line)
            events.append(e)
events.sort(key=lambda e: e["wall_ms"])
def during(a, b, actor, event):
    return [e for e in events if a <= e["wall_ms"] <= b and e["actor"] == actor and e["event"] == event]
phase1 = {
    "deadline_passed": during(t0, t1, "watchdog", "deadline-passed"),
    "demoted": during(t0, t1, "supervisor", "demoted"),
    "elected": during(t0, t1, "supervisor", "elected"),
}
failovers = []
for at, victim in kills:
    won = next((e for e in events if e["wall_ms"] > at and e["actor"] == "supervisor"
                and e["event"] == "elected" and e["node"] != victim), None)
    started = next((e for e in events if won and e["wall_ms"] >= won["wall_ms"]
                    and e["actor"] == "supervisor" and e["event"] == "work-started"
                    and e["node"] == won["node"]), None)
    failovers.append({
        "killed": victim,
        "new_leader": won and won["node"],
        "to_elected_ms": won and won["wall_ms"] - at,
        "to_program_ms": started and started["wall_ms"] - at,
    })
summary = {
    "timing": {"lease_ttl_ms": int(ttl), "election_timeout_ms": election,
               "stop_timeout": stop, "child_stop_margin": margin},
    "neighbour": {"minutes": float(minutes), "load": "stress-ng --cpu 2",
                  "window_ms": t1 - t0,
                  "watchdog_deadline_passed": len(phase1["deadline_passed"]),
                  "demotions": len(phase1["demoted"]),
                  "elections": len(phase1["elected"]),
                  "demotion_reasons": [e["detail"] for e in phase1["demoted"]]},
    "kill9_failover": failovers,
}
ok = [f["to_elected_ms"] for f in failovers if f["to_elected_ms"] is not None]
if ok:
    summary["kill9_failover_ms"] = {"min": min(ok), "median": statistics.median(ok), "max": max(ok)}
text = json.dumps(summary, indent=2)
print(text)
with open(f"{out}/summary-{ttl}.json", "w") as f:
    f.write(text + "\n")
PY
for n in n1 n2 n3; do
  cp "$dir/run-$n/actor-trace.jsonl" "$out/actor-trace-$ttl-$n.jsonl"
done
