#!/usr/bin/env bash
# Installs the OS packages baton's build, fleets and tests need, only those missing, and says so.
# Debian, as root (or with sudo). Nothing here starts a service: baton starts private instances.
#
# Each package is checked by a file the build or the tests actually use, not only by a command on
# PATH: `protoc` alone is not enough for etcd-client's build script, which also needs
# google/protobuf/descriptor.proto from libprotobuf-dev (a fresh machine once failed inside the build,
# 2.5 minutes in, while CI stayed green on a machine that happened to have the file).
set -euo pipefail

need=()
# need PACKAGE FILE...: the package is installed unless every FILE (a path or a glob) exists.
need_unless_files() {
  local pkg=$1; shift
  local f
  for f in "$@"; do
    # shellcheck disable=SC2086
    if ! compgen -G "$f" >/dev/null; then need+=("$pkg"); return; fi
  done
}

need_unless_files etcd-server        /usr/bin/etcd
need_unless_files etcd-client        /usr/bin/etcdctl
need_unless_files protobuf-compiler  /usr/bin/protoc
need_unless_files libprotobuf-dev    /usr/include/google/protobuf/descriptor.proto
# Debian's redis-server (7.x) is built with TLS (it links libssl3): the lab's TLS Redis and the
# Sentinels over TLS (`redis-server --sentinel`, no separate redis-sentinel package) need nothing more.
need_unless_files redis-server       /usr/bin/redis-server
need_unless_files zookeeper          /usr/share/java/zookeeper.jar
need_unless_files libslf4j-java      /usr/share/java/slf4j-simple.jar  # ZooKeeper's log backend
need_unless_files default-jre-headless /usr/bin/java
need_unless_files prometheus         /usr/bin/promtool                # checks /metrics and the alert rules
need_unless_files iptables           /usr/sbin/iptables               # chaos: partitions inside netns
need_unless_files iproute2           /usr/sbin/ip /usr/bin/ip
need_unless_files postgresql         '/usr/lib/postgresql/*/bin/postgres' '/usr/lib/postgresql/*/bin/initdb'
need_unless_files postgresql-client  /usr/bin/psql
need_unless_files faketime           '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1' /usr/bin/faketime
need_unless_files stress-ng          /usr/bin/stress-ng                # a reproducible neighbour for benchmarks
need_unless_files wrk                /usr/bin/wrk                      # closed-loop HTTP baseline
need_unless_files linux-perf         /usr/bin/perf                     # FINDINGS' profiles (perf record -a -g)
need_unless_files openssl            /usr/bin/openssl
need_unless_files procps             /usr/bin/pgrep
need_unless_files python3            /usr/bin/python3
need_unless_files chromium           /usr/bin/chromium                # headless: the /ui page test, the screenshot

# `just` runs the justfile's recipes (`just fleet 9`, `just exp graceful-stepdown`, `just test`).
# Debian 12 has no package for it; PyPI's rust-just wheel carries the prebuilt binary (seconds,
# where `cargo install --locked just`, the fallback, compiles for minutes on 2 cores).
JUST_VERSION=1.59.0
JUST_DIR=/usr/local/lib/rust-just
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
ensure_just() {
  command -v just >/dev/null 2>&1 && return 0
  echo "ensure-deps: installing just $JUST_VERSION (PyPI rust-just) into $JUST_DIR"
  if $SUDO python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
       --target "$JUST_DIR" "rust-just==$JUST_VERSION" && [ -x "$JUST_DIR/bin/just" ]; then
    $SUDO ln -sf "$JUST_DIR/bin/just" /usr/local/bin/just
  else
    echo "ensure-deps: pip could not install rust-just; building just with cargo instead"
    cargo install --locked --quiet "just@$JUST_VERSION"
  fi
}

check_all() {
  local missing=()
  command -v just >/dev/null 2>&1 || missing+=("just (PyPI rust-just or crates.io just)")
  [ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=("google/protobuf/descriptor.proto (libprotobuf-dev)")
  command -v protoc >/dev/null 2>&1 || missing+=("protoc (protobuf-compiler)")
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=("initdb (postgresql)")
  [ -f /usr/share/java/zookeeper.jar ] || missing+=("zookeeper.jar (zookeeper)")
  [ -f /usr/share/java/slf4j-simple.jar ] || missing+=("slf4j-simple.jar (libslf4j-java)")
  [ -x /usr/bin/java ] || missing+=("java (default-jre-headless)")
  command -v etcd >/dev/null 2>&1 || missing+=("etcd (etcd-server)")
  command -v redis-server >/dev/null 2>&1 || missing+=("redis-server")
  # The TLS tests (lab/tests/tls.rs, redis_sentinel.rs) start redis-server with --tls-port.
  # grep reads all of ldd's output: under pipefail, `grep -q` exiting at the first match can leave
  # ldd dying of SIGPIPE, and the check then failed on a redis-server that does link libssl.
  if command -v redis-server >/dev/null 2>&1 && command -v ldd >/dev/null 2>&1 \
     && ! ldd "$(command -v redis-server)" | grep libssl >/dev/null; then
    missing+=("redis-server built with TLS (this one does not link libssl)")
  fi
  [ -x /usr/bin/chromium ] || missing+=("chromium")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "ensure-deps: FAILED, still missing after install: ${missing[*]}" >&2
    exit 1
  fi
}

if [ ${#need[@]} -eq 0 ]; then
  ensure_just
  check_all
  echo "ensure-deps: all OS packages present"
  exit 0
fi
echo "ensure-deps: installing missing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# Debian's packages may start their own system services; baton never uses them. policy-rc.d keeps
# them from starting at all (no systemd here; `service` would otherwise start them).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  made_policy=1
fi
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
[ "$made_policy" -eq 0 ] || $SUDO rm -f "$policy"
ensure_just  # after apt: python3 may have been one of the packages
for svc in etcd redis-server zookeeper prometheus prometheus-node-exporter postgresql; do
  if command -v service >/dev/null 2>&1; then $SUDO service "$svc" stop >/dev/null 2>&1 || true; fi
done
check_all
echo "ensure-deps: done"
