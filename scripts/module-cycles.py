#!/usr/bin/env python3
"""Module import graph of a crate's src/: which top-level modules import which (`crate::X`,
`super::` resolved), and every cycle (strongly connected component of more than one module).

    scripts/module-cycles.py [SRC_DIR]     # default: src (the core crate)

Exits 1 when there is a cycle, so the suite can hold the core to "no import circles".
A module is a top-level file or directory under SRC_DIR (`config.rs`, `backends/`, ...); imports
inside one module (e.g. backends/raft -> backends/mod.rs) are not edges.
"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "src"
mods = set()
for name in os.listdir(src):
    if name.endswith(".rs") and name not in ("lib.rs", "main.rs"):
        mods.add(name[:-3])
    elif os.path.isdir(os.path.join(src, name)):
        mods.add(name)

# `crate::foo`, `crate::{foo, bar::baz}` and `use crate::{\n foo,\n}` forms.
path_re = re.compile(r"crate::(\{[^;]*?\}|[a-z_][a-z0-9_]*)", re.S)
edges = {m: set() for m in mods}
for m in sorted(mods):
    base = os.path.join(src, m)
    files = [base + ".rs"] if os.path.isfile(base + ".rs") else [
        os.path.join(d, f) for d, _, fs in os.walk(base) for f in fs if f.endswith(".rs")]
    for f in files:
        text = open(f, encoding="utf-8").read()
        # drop line comments and doc comments, so prose mentioning crate::x is no edge
        text = re.sub(r"//[^\n]*", "", text)
        for hit in path_re.findall(text):
            names = re.findall(r"(?:^|[{,\s])([a-z_][a-z0-9_]*)", hit.strip("{}")) if hit.startswith("{") else [hit]
            for n in names:
                if n in mods and n != m:
                    edges[m].add(n)

# Tarjan's strongly connected components.
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        sccs.append(comp)
for v in sorted(mods):
    if v not in index:
        visit(v)

for m in sorted(mods):
    print(f"{m:10} -> {', '.join(sorted(edges[m])) or '-'}")
cycles = [sorted(c) for c in sccs if len(c) > 1]
if cycles:
    for c in cycles:
        print("CYCLE:", " <-> ".join(c))
    sys.exit(1)
print(f"no cycles among {len(mods)} modules of {src}")
