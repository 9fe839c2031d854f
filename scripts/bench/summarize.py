#!/usr/bin/env python3
"""Tables from scripts/bench/perf.sh's outputs (what README and FINDINGS quote).

  summarize.py next FILE.json...   one row per `baton bench next` report
  summarize.py ratio wrk-ratio.txt GET /healthz vs POST /next requests/s, and their ratio
"""
import json
import re
import statistics
import sys


def next_rows(paths):
    print("| run | backend | offered | neighbour | achieved IDs/s | p50 ms | p99 ms | service p99 ms | errors | leadership changes | mean batch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    p99s = []
    for p in paths:
        r = json.load(open(p))
        b = r["baton"]
        p99s.append(b["p99_ms"])
        print(f"| {p.rsplit('/', 1)[-1]} | {r['backend']} | {r['offered_rate']:.0f} | "
              f"{r.get('neighbour_cpu_percent', 0)}% | {b['ids_per_s']:.0f} | {b['p50_ms']:.2f} | "
              f"**{b['p99_ms']:.2f}** | {b.get('service_p99_ms') or float('nan'):.2f} | {b['errors']} | "
              f"{r.get('leadership_changes', '?')} | {r['mean_batch_ids']:.1f} |")
    if len(p99s) > 1:
        print(f"\np99 over {len(p99s)} runs: median {statistics.median(p99s):.2f} ms, "
              f"min {min(p99s):.2f}, max {max(p99s):.2f}")


def ratio(path):
    text = open(path).read()
    rates = {"healthz": [], "next": []}
    for block in text.split("## round ")[1:]:
        what = "healthz" if "/healthz" in block.splitlines()[0] else "next"
        m = re.search(r"Requests/sec:\s+([\d.]+)", block)
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", block)
        if m:
            rates[what].append(float(m.group(1)))
        if non2xx:
            print(f"{what}: {non2xx.group(1)} non-2xx responses", file=sys.stderr)
    h, n = statistics.median(rates["healthz"]), statistics.median(rates["next"])
    print(f"GET /healthz {h:,.0f} req/s (runs {rates['healthz']}); POST /next {n:,.0f} IDs/s "
          f"(runs {rates['next']}); ratio {n / h:.2f}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    if sys.argv[1] == "next":
        next_rows(sys.argv[2:])
    elif sys.argv[1] == "ratio":
        ratio(sys.argv[2])
