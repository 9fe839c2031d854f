#!/usr/bin/env bash
# The core crate stays a library a user can adopt:
#  1. no import circle between files, in any folder of the core or the lab (scripts/module-cycles.py
#     exits 1 on one);
#  2. each backend feature pulls in only its own client stack, and never the lab's tooling crates
#     (from `cargo tree`, so nothing is compiled for it);
#  3. the core compiles with each backend alone, and with no HTTP server (`cargo check`), so a
#     feature gate that only the all-features lab build exercised cannot rot;
#  4. it is clean under clippy (warnings are errors), and its docs build without a warning
#     (broken or private intra-doc links, unclosed HTML, bare URLs, an undocumented public item);
#  5. it passes `cargo publish --dry-run`: it packages as a crate that holds the library alone and
#     builds from what it holds (the packed copy is compiled), with publish's own checks of the
#     manifest; nothing is uploaded. --allow-dirty so it also runs on a work tree with
#     uncommitted changes.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 scripts/module-cycles.py src lab/src
# ...and it can fail: a circle planted between two files of a scratch folder is found.
planted=$(mktemp -d)
mkdir -p "$planted/x"
printf 'mod a;\nmod b;\n' > "$planted/x/mod.rs"
printf 'use crate::x::b::B;\npub struct A;\n' > "$planted/x/a.rs"
printf 'use super::a::A;\npub struct B(A);\n' > "$planted/x/b.rs"
if python3 scripts/module-cycles.py "$planted" >/dev/null; then
  echo "check-core: module-cycles.py missed a circle planted in $planted" >&2; exit 1
fi
rm -rf "$planted"

declare -A client=([raft]=openraft [etcd]=etcd-client [redis]=redis [zk]=zookeeper-client [pg-lease]=)
tooling="plotters hdrhistogram clap mimalloc tracing-subscriber baton-lab"
fail=0
for f in raft etcd redis zk pg-lease; do
  crates=$(cargo tree -q -p baton --no-default-features --features "$f" -e normal --prefix none \
    | sed 's/ .*//' | sort -u)
  for other in openraft etcd-client redis zookeeper-client $tooling; do
    [ "$other" = "${client[$f]}" ] && continue
    if grep -qx "$other" <<<"$crates"; then
      echo "check-core: --features $f pulls in $other" >&2; fail=1
    fi
  done
  echo "check-core: --no-default-features --features $f: $(wc -l <<<"$crates") crates"
done
[ "$fail" -eq 0 ] || exit 1

for f in raft etcd redis zk pg-lease "pg-lease,http" "etcd,prometheus"; do
  cargo check -q -p baton --no-default-features --features "$f"
done
cargo clippy -q -p baton -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -q -p baton
cargo publish --dry-run -q -p baton --allow-dirty
packed=$(cargo package -q -p baton --allow-dirty --no-verify --list)
if grep -Eq '^(lab|experiments|scripts|config)/' <<<"$packed"; then
  echo "check-core: the crate would pack tooling or experiments:" >&2
  grep -E '^(lab|experiments|scripts|config)/' <<<"$packed" | head >&2
  exit 1
fi
echo "check-core: no module cycle; each backend alone builds and pulls in only its own client;" \
  "clippy-clean; docs without a warning; the crate packs $(wc -l <<<"$packed") files and builds from them"
