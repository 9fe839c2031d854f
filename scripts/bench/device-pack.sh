#!/usr/bin/env bash
# Packs what issue 14 item 4 (the sequencer past two cores) needs on a bare 16-core machine into
# one file, .device/bundle.tar.xz, for the device tool's `carry` (".device"):
#   - the release binary, stripped (the debug info is 85% of it and the carry is 64 MiB with the
#     working tree);
#   - PostgreSQL's server and client programs (postgres, initdb, pg_ctl, psql), its modules (less
#     the LLVM JIT, which we do not use) and its share files, in Debian's layout, so the binaries
#     find their share files where they were built to look and `baton` finds them where it looks
#     on any Debian machine (/usr/lib/postgresql/N/bin);
#   - UTC's time zone files (Debian's PostgreSQL reads the system's tzdata);
#   - every shared library those and the binary load, except glibc's own: the machine's image is
#     not ours, so scripts/bench/device-run.sh installs the ones it lacks and no others.
#
#   scripts/bench/device-pack.sh        # then: device run, carry [".device"],
#                                       # command "bash scripts/bench/device-run.sh"
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.device
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

cargo build --release --bin baton
strip -o "$stage/baton" target/release/baton

pg=$(ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V | tail -1)
[ -n "$pg" ] || { echo "no PostgreSQL here: bash scripts/ensure-deps.sh first" >&2; exit 2; }
pg=$(dirname "$(dirname "$pg")")     # /usr/lib/postgresql/N
version=$(basename "$pg")
# The files whose libraries must load, relative to $pg: the programs baton runs, and the modules
# a fresh database loads (plpgsql, snowball; the encoding conversions need nothing). The list
# travels in the bundle, so device-run.sh checks the same files.
needed="bin/postgres bin/initdb bin/pg_ctl bin/psql lib/plpgsql.so lib/dict_snowball.so"
mkdir -p "$stage/root$pg/bin" "$stage/root$pg/lib" "$stage/root/usr/share/postgresql"
echo "$needed" >"$stage/needed"
for f in $needed; do [ "${f%%/*}" = bin ] && cp "$pg/$f" "$stage/root$pg/bin/"; done
cp "$pg"/lib/*.so "$stage/root$pg/lib/"
rm -f "$stage/root$pg/lib/llvmjit.so"
cp -a "/usr/share/postgresql/$version" "$stage/root/usr/share/postgresql/"
rm -rf "$stage/root/usr/share/postgresql/$version/man"  # manual pages: not read by the server
# Debian's PostgreSQL reads time zones from the system's tzdata, which a bare image may lack:
# UTC under its usual names is all a private server needs.
mkdir -p "$stage/root/usr/share/zoneinfo/Etc"
cp -L /usr/share/zoneinfo/{UTC,GMT} "$stage/root/usr/share/zoneinfo/"
cp -L /usr/share/zoneinfo/Etc/UTC "$stage/root/usr/share/zoneinfo/Etc/"

# What they load. Other modules are not used by baton: their libraries stay behind, and they
# would fail to load.
# DEVICE_LIBS (an extended regex on the library's file name) packs only those: the carry is 64
# MiB with the working tree, and the device image's own libraries are most of the list. The
# November run's log (experiments/results/bench-next/device-s37/device-run.log) shows that image
# lacking ICU, LDAP and libpq alone:
#   DEVICE_LIBS='^lib(icu|ldap|lber|pq|sasl2)' scripts/bench/device-pack.sh
# A library the machine lacks and the bundle left out stops device-run.sh at once, naming it.
mkdir -p "$stage/lib"
for f in "$stage/baton" $(printf "$stage/root$pg/%s " $needed); do
  ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|libutil)\.so' |
  while read -r lib; do
    if [ -z "${DEVICE_LIBS:-}" ] || basename "$lib" | grep -qE "$DEVICE_LIBS"; then
      cp -L "$lib" "$stage/lib/"
    fi
  done

rm -rf "$out"
mkdir -p "$out"
tar -C "$stage" -cf - baton needed root lib | xz -T0 -9 >"$out/bundle.tar.xz"
bundle=$(stat -c %s "$out/bundle.tar.xz")
tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
python3 - "$bundle" "$tree" <<'PY'
import sys
bundle, tree = (int(x) for x in sys.argv[1:])
mib = 1 << 20
total = bundle + tree
print(f".device/bundle.tar.xz {bundle / mib:.1f} MiB + tracked files {tree / mib:.1f} MiB = "
      f"{total / mib:.1f} MiB of the device tool's 64 MiB")
if total > 63 * mib:
    sys.exit("over (or within 1 MiB of) what the device tool carries: leave something out")
PY
