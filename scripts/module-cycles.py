#!/usr/bin/env python3
"""Import circles between files of a crate, at every level of its module tree.

    scripts/module-cycles.py [SRC_DIR ...]     # default: src (the core crate)

For each folder (the crate root included) the nodes are its children: each file other than
mod.rs / lib.rs / main.rs, and each subfolder (with everything below it). An edge A -> B means
a file in A names a path that resolves into B (`crate::x::y`, `super::y`, `self::y`, and a
child module by its bare name, in `use` lines and in code). Items defined in the folder's own
mod.rs are the parent's, not a child's, so naming them is no edge. Every strongly connected
component of more than one node is a circle; the script exits 1 when there is one, so the suite
holds the code to "no import circles between files anywhere".

Line comments and doc comments are dropped first, so prose naming `crate::x` is no edge.
"""
import os
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_of(src, path):
    """The module path of a file: src/a/b.rs -> (a, b); src/a/mod.rs -> (a,); src/lib.rs -> ()."""
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def resolve(src, base, segments):
    """The deepest module (a file or folder under src) that `base` + `segments` names."""
    mod = list(base)
    for seg in segments:
        d = os.path.join(src, *mod, seg)
        if os.path.isdir(d) or os.path.isfile(d + ".rs"):
            mod.append(seg)
        else:
            break
    return tuple(mod)


def expand(text, start):
    """Paths of a `use` tree starting at text[start:] (after a root like `crate::`): returns
    (list of segment lists, end index). Handles `a::b`, `a::{b, c::d}`, `a::b as c`, nesting."""
    paths = []
    i = start
    prefix = []
    while True:
        m = re.match(r"\s*(" + IDENT + r"|\{)", text[i:])
        if not m:
            break
        if m.group(1) == "{":
            i += m.end()
            while True:
                sub, i = expand(text, i)
                paths.extend(prefix + p for p in sub)
                m2 = re.match(r"\s*(,|\})", text[i:])
                if not m2:
                    return paths or [prefix], i
                i += m2.end()
                if m2.group(1) == "}":
                    return paths, i
                if re.match(r"\s*\}", text[i:]):
                    i += re.match(r"\s*\}", text[i:]).end()
                    return paths, i
        prefix.append(m.group(1))
        i += m.end()
        m3 = re.match(r"::", text[i:])
        if not m3:
            break
        i += m3.end()
    paths.append(prefix)
    return paths, i


def edges_of(src):
    files = [os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.endswith(".rs")]
    refs = defaultdict(set)  # module -> modules it names
    for f in files:
        if os.path.relpath(f, src) == "main.rs":
            continue  # a binary beside the library is another crate
        me = module_of(src, f)
        text = open(f, encoding="utf-8").read()
        text = re.sub(r"//[^\n]*", "", text)
        for m in re.finditer(r"\b(crate|super|self)::", text):
            root = m.group(1)
            if root == "crate":
                base = ()
            elif root == "self":
                base = me
            else:
                base = me[:-1]
                j = m.end()
                while text.startswith("super::", j):  # super::super::x
                    base = base[:-1]
                    j += len("super::")
                paths, _ = expand(text, j)
                for p in paths:
                    refs[me].add(resolve(src, base, p))
                continue
            paths, _ = expand(text, m.end())
            for p in paths:
                refs[me].add(resolve(src, base, p))
        # A child module named bare (`use child::X;`, `child::f()`) from its parent's files.
        for m in re.finditer(r"(?<![:\w])(" + IDENT + r")::", text):
            name = m.group(1)
            if name in ("crate", "super", "self", "std", "core", "alloc"):
                continue
            d = os.path.join(src, *me, name)
            if os.path.isdir(d) or os.path.isfile(d + ".rs"):
                refs[me].add(me + (name,))
    # Project each reference onto the folder where the two modules part.
    graph = defaultdict(lambda: defaultdict(set))  # folder -> child -> children
    for a, targets in refs.items():
        for b in targets:
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            if k == len(a) or k == len(b):
                continue  # one contains the other: a module and its parent's own items
            folder = a[:k]
            graph[folder][a[k]].add(b[k])
    return graph


def cycles(edges):
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    nodes = set(edges) | {w for ws in edges.values() for w in ws}

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sccs


def main():
    srcs = sys.argv[1:] or ["src"]
    found = 0
    folders = 0
    for src in srcs:
        graph = edges_of(src)
        for folder in sorted(graph):
            folders += 1
            where = os.path.join(src, *folder)
            for comp in cycles(graph[folder]):
                found += 1
                print(f"CYCLE in {where}/: " + " <-> ".join(comp))
                for a in comp:
                    inside = sorted(b for b in graph[folder][a] if b in comp)
                    print(f"    {a} -> {', '.join(inside)}")
    if found:
        sys.exit(1)
    print(f"no import circle between files in {', '.join(srcs)} ({folders} folders with edges)")


if __name__ == "__main__":
    main()
