# Sourced by the bench scripts (perf.sh, timeline.sh, resource-cut.sh): one way to bring up a
# fresh fleet for a measurement and to take it down however the script ends.

# A new 3-node raft fleet of binary $1 in dir $2 (whatever was there is taken down and removed);
# further arguments go to `fleet up`.
fresh_fleet() {
  local bin=$1 dir=$2
  shift 2
  "$bin" fleet down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
  "$bin" fleet up 3 --backend raft --dir "$dir" "$@" >/dev/null
}

# Takes the fleet of binary $1 in dir $2 down when the script exits (replaces any EXIT trap).
down_on_exit() {
  trap "\"$1\" fleet down --dir \"$2\" >/dev/null 2>&1 || true" EXIT
}
