#!/usr/bin/env bash
# What one group commit costs PostgreSQL, old seq_commit against new, side by side.
#
#   scripts/bench/seq-commit-cost.sh OLD_REV [NEW_REV] [ROUNDS] [SECONDS]
#
# Starts a scratch PostgreSQL 15 (initdb in a temp dir, Unix socket only, removed on exit), applies
# the fence migration of OLD_REV to database `old` and of NEW_REV (default: the working tree) to
# `new`, claims the sequence in each, then runs pgbench (one client, prepared statements,
# synchronous_commit off so the figure is CPU and not the disk's flush) on each in turn, ROUNDS
# times (default 3) for SECONDS each (default 8). Each transaction commits one range of 80 IDs,
# as a group commit of a busy leader does. Prints pgbench's mean latency per seq_commit call for
# each round, and the medians. A no-op SECURITY DEFINER function is timed too: the floor that
# the round trip, the call and the commit cost with no fenced work at all.
set -euo pipefail
cd "$(dirname "$0")/../.."
old_rev=${1:?usage: seq-commit-cost.sh OLD_REV [NEW_REV] [ROUNDS] [SECONDS]}
new_rev=${2:-WORKTREE}
rounds=${3:-3}
secs=${4:-8}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
tmp=$(mktemp -d)
chown postgres "$tmp"
as_pg() { su postgres -s /bin/bash -c "$*"; }
cleanup() { as_pg "$bin/pg_ctl -D $tmp/data -m immediate stop" >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
as_pg "$bin/initdb -D $tmp/data -A trust" >/dev/null
as_pg "$bin/pg_ctl -D $tmp/data -o \"-p 55499 -k $tmp -c listen_addresses=''\" -l $tmp/log -w start" >/dev/null
psql_() { psql -h "$tmp" -p 55499 -U postgres -v ON_ERROR_STOP=1 -q "$@"; }
sql_of() { # the migration's SQL at a revision (or in the working tree)
  if [ "$1" = WORKTREE ]; then cat "src/work/sql/$2"; else git show "$1:src/work/sql/$2"; fi
}
psql_ -f src/work/sql/0000_roles.sql postgres
for db in old new; do
  rev=$old_rev; [ $db = new ] && rev=$new_rev
  psql_ -c "CREATE DATABASE $db" postgres
  psql_ -c "GRANT CREATE ON DATABASE $db TO baton_owner" $db
  { echo "SET client_min_messages = warning; SET ROLE baton_owner;"; sql_of "$rev" 0001_fence.sql; } | psql_ $db
  psql_ -c "SELECT * FROM baton.seq_claim('sequence', 1, 'n1')" $db >/dev/null
  psql_ $db <<'SQL'
SET ROLE baton_owner;
CREATE FUNCTION baton.noop(p_resource TEXT, p_token BIGINT, p_holder TEXT, p_seq_lo BIGINT,
                           p_seq_hi BIGINT, OUT accepted BOOLEAN)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ BEGIN accepted := TRUE; END $$;
SQL
done
for f in commit noop; do
  call="baton.seq_commit('sequence', 1, 'n1', :lo, :lo + 79)"
  [ $f = noop ] && call="baton.noop('sequence', 1, 'n1', :lo, :lo + 79)"
  printf '%s\n' "SELECT last_seq + 1 AS lo FROM baton.sequence WHERE name = 'sequence' \\gset" \
    "SELECT * FROM $call;" >"$tmp/$f.sql"
done
echo "seq_commit: old = $old_rev, new = $new_rev; $rounds rounds of ${secs}s; ms per call (pgbench -r)"
declare -A lat
for round in $(seq 1 "$rounds"); do
  line="round $round:"
  for run in old:commit new:commit new:noop; do
    db=${run%%:*} f=${run##*:}
    ms=$(PGOPTIONS="-c synchronous_commit=off" "$bin/pgbench" -h "$tmp" -p 55499 -U postgres -n \
      -M prepared -r -T "$secs" -f "$tmp/$f.sql" "$db" 2>&1 | awk '/SELECT \* FROM baton/ {print $1}')
    lat[$run]+="$ms "
    line+=" $db $f $ms"
  done
  echo "$line"
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
o=$(echo "${lat[old:commit]}" | median); n=$(echo "${lat[new:commit]}" | median); z=$(echo "${lat[new:noop]}" | median)
echo "median ms per call: old seq_commit $o, new seq_commit $n, no-op floor $z"
python3 -c "o,n,z=$o,$n,$z; print(f'new/old {n/o:.2f}; above the floor: old {1000*(o-z):.0f} us, new {1000*(n-z):.0f} us')"
