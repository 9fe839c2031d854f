#!/usr/bin/env bash
# Installs the OS packages baton's fleets and tests need, only those missing, and says so.
# Debian, as root (or with sudo). Nothing here starts a service: baton starts private instances.
set -euo pipefail

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_pkg() { dpkg -s "$1" >/dev/null 2>&1; }

have_cmd etcd        || need+=(etcd-server)
have_cmd etcdctl     || need+=(etcd-client)
have_cmd protoc      || need+=(protobuf-compiler)   # etcd-client's build compiles .proto files
have_cmd redis-server || need+=(redis-server)
have_pkg zookeeper   || need+=(zookeeper)
have_cmd promtool    || need+=(prometheus)          # promtool checks /metrics and the alert rules
have_cmd iptables    || need+=(iptables)
have_cmd ip          || need+=(iproute2)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
have_cmd psql        || need+=(postgresql-client)

if [ ${#need[@]} -eq 0 ]; then
  echo "ensure-deps: all OS packages present"
  exit 0
fi
echo "ensure-deps: installing missing Debian packages: ${need[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian's packages may start their own system services; baton never uses them.
for svc in etcd redis-server zookeeper prometheus prometheus-node-exporter postgresql; do
  if have_cmd service; then $SUDO service "$svc" stop >/dev/null 2>&1 || true; fi
done
echo "ensure-deps: done"
