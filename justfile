# Thin recipes over the `baton` binary and scripts/. `just` is optional: every recipe is one command.

baton := "target/release/baton"

default: test

# Build the release binary.
build:
    cargo build --release --bin baton

# A local fleet in the foreground (Ctrl-C stops everything): `just fleet 9`, `just fleet 3 etcd`.
fleet n="3" backend="raft": build
    {{baton}} fleet down --dir state/fleet >/dev/null 2>&1 || true
    rm -rf state/fleet
    {{baton}} fleet up {{n}} --backend {{backend}} --dir state/fleet --foreground

# A detached fleet, then status / down.
up n="3" backend="raft": build
    {{baton}} fleet up {{n}} --backend {{backend}} --dir state/fleet

status:
    {{baton}} fleet status --dir state/fleet

down:
    {{baton}} fleet down --dir state/fleet

# kill -9 the current leader of state/fleet.
kill-leader:
    {{baton}} fleet kill $({{baton}} fleet status --dir state/fleet --json | python3 -c 'import json,sys; print([r["id"] for r in json.load(sys.stdin) if r["role"]=="leader"][0])') --dir state/fleet

# Failover after kill -9, N trials, from the resource's ledger: `just bench-failover etcd 20`.
bench-failover backend="raft" trials="20": build
    {{baton}} bench failover --backend {{backend}} --trials {{trials}}

# An experiment from experiments/NAME.toml into experiments/results/NAME/: `just exp gc-pause`,
# `just exp churn --backends etcd --duration 90s`, `just exp clean-kill --quick`.
exp name *args: build
    {{baton}} exp {{name}} {{args}}

# The full test suite (what CI runs).
test:
    bash scripts/test.sh

# Regenerate deploy/ui-screenshot.png: the fleet page (GET /ui) of a 3-node, 4-shard fleet.
ui-screenshot: build
    bash scripts/ui-screenshot.sh

# Validate the Prometheus scrape config and alert rules.
promtool:
    promtool check config config/prometheus.yml
    promtool check rules config/alerts.yml
    promtool test rules config/alerts_test.yml
