#!/usr/bin/env python3
"""Tables from scripts/bench/perf.sh's outputs (what README and FINDINGS quote).

  summarize.py next FILE.json...   one row per `baton bench next` report
  summarize.py ratio wrk-ratio.txt GET /healthz vs POST /next requests/s, and their ratio
  summarize.py ab wrk-ab.txt       old vs new POST /next (and new GET /healthz), per round and median
  summarize.py split PREFIX         client latency beside the leader's own histograms (perf.sh split)
  summarize.py profile PREFIX [ROUNDS]  CPU per request by thread, /healthz vs /next (perf.sh profile)
  summarize.py gen PREFIX          the open-loop generator's rate, latency and CPU per request (perf.sh gen)
  summarize.py leaseab wrk-lease-ab.txt  per build: lease reads over GET /healthz per round (req/s,
                                   and the HTTP thread's CPU per request), and the medians
  summarize.py read FILE.json...   `baton bench read` reports: each row with what limited it, and
                                   each mode's answered rate over GET /healthz's in the same run
  summarize.py serial PREFIX       the sequencer's serial stage in µs of CPU per ID, one run (perf.sh serial)
  summarize.py serial-table serial.txt  those runs as a table, old against new
  summarize.py modes wrk-modes.txt durable and window POST /next against GET /healthz (perf.sh modes)
"""
import json
import os
import re
import statistics
import sys


def leaseab(path):
    """perf.sh leaseab: per build and round, lease read over /healthz (rate; HTTP thread CPU)."""
    pat = re.compile(r"round (\d+) (\w+) (\S+): (\d+) req/s, non-2xx (\d+), p99 (\S+), HTTP thread ([\d.]+) us/request")
    runs = {}
    for line in open(path):
        m = pat.search(line)
        if m:
            rnd, side, what, rps, non2xx, p99, us = m.groups()
            runs.setdefault((side, int(rnd)), {})["lease" if what.startswith("read") else "healthz"] = (
                float(rps), int(non2xx), p99, float(us))
    print("| build | round | lease req/s | /healthz req/s | ratio | lease p99 / healthz p99 | HTTP thread µs per request, lease / healthz | extra µs per lease read |")
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for (side, rnd), r in sorted(runs.items()):
        if "lease" not in r or "healthz" not in r:
            continue
        (lr, ln, lp, lu), (hr, hn, hp, hu) = r["lease"], r["healthz"]
        summary.setdefault(side, []).append((lr / hr, lu - hu, hu / lu))
        print(f"| {side} | {rnd} | {lr:.0f}{f' ({ln} non-2xx)' if ln else ''} | {hr:.0f} | {lr / hr:.2f} | {lp} / {hp} | {lu:.2f} / {hu:.2f} | {lu - hu:.2f} |")
    for side, v in summary.items():
        print(f"\n{side}: {len(v)} rounds, median ratio {statistics.median(x[0] for x in v):.2f}, "
              f"median extra HTTP-thread CPU per lease read {statistics.median(x[1] for x in v):.2f} µs, "
              f"median CPU ratio (healthz / lease) {statistics.median(x[2] for x in v):.2f}")


def read_rows(paths):
    """`baton bench read` reports: every row, then the ratios to plain HTTP, per file."""
    print("| file | backend | mode | round | offered/s | answered/s | errors | p99 ms (schedule) | service p50 / p99 ms | connections (busy) | limited by | busiest node / generator thread |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for p in paths:
        r = json.load(open(p))
        name = p.rsplit('/', 1)[-1]
        for row in r["rows"]:
            def busiest(what):
                for t in row.get("threads", []):
                    if t["what"].startswith(what) and t["busiest"]:
                        b = t["busiest"][0]
                        return f"{b['name']} {b['busy'] * 100:.0f}%"
                return "-"
            print(f"| {name} | {row['backend']} | {row['mode']} | {row.get('round', 1)} | {row['offered_rate']:.0f} | "
                  f"{row['ok_per_s']:.0f} | {row['errors']} | {row['p99_ms']:.2f} | "
                  f"{row['service_p50_ms']:.2f} / {row['service_p99_ms']:.2f} | "
                  f"{row.get('connections', '?')} ({row.get('busy_connections_mean', 0):.0f}) | "
                  f"{row.get('limited_by', {}).get('limit', '?')} | {busiest('leader')} / {busiest('generator')} |")
        for m in r.get("ratio_medians", []):
            ratios.append((name, m))
    if ratios:
        print("\n| file | backend | mode | rounds | answered/s | /healthz req/s | ratio median (min-max) | p99 ms, mode / healthz |")
        print("|---|---|---|---|---|---|---|---|")
        for name, m in ratios:
            print(f"| {name} | {m['backend']} | {m['mode']} | {m['rounds']} | {m['ok_per_s_median']:.0f} | "
                  f"{m['plain_http_ok_per_s_median']:.0f} | **{m['ratio_median']:.2f}** "
                  f"({m['ratio_min']:.2f}-{m['ratio_max']:.2f}) | {m['p99_ms_median']:.2f} / {m['plain_http_p99_ms_median']:.2f} |")


def neighbour_words(r):
    """The neighbour as the report names it: its share, and its busy slice when not stress-ng's."""
    words = f"{r.get('neighbour_cpu_percent', 0)}%"
    if r.get("neighbour_slice_ms"):
        words += f", {r['neighbour_slice_ms']} ms slices"
    return words


def machine_words(r):
    """The whole machine over the measured window, where the report has it."""
    w = r.get("machine_cpu")
    return f"{w['busy_cores']:.2f}, {w['steal_percent']:.1f}%" if w else "-"


def commit_words(r):
    """The commit threads' CPU per ID (the serial stage), where the node ran commit threads."""
    us = r.get("commit_thread_us_per_id")
    return f"{us:.3f}" if us is not None else "-"


def next_rows(paths):
    print("| run | backend | offered | neighbour | achieved IDs/s | p50 ms | p99 ms | service p99 ms | errors | leadership changes | mean batch | commit thread µs CPU/ID | machine busy cores, steal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    p99s = []
    runs = [(p, json.load(open(p))) for p in paths]
    for p, r in runs:
        b = r["baton"]
        p99s.append(b["p99_ms"])
        print(f"| {p.rsplit('/', 1)[-1]} | {r['backend']} | {r['offered_rate']:.0f} | "
              f"{neighbour_words(r)} | {b['ids_per_s']:.0f} | {b['p50_ms']:.2f} | "
              f"**{b['p99_ms']:.2f}** | {b.get('service_p99_ms') or float('nan'):.2f} | {b['errors']} | "
              f"{r.get('leadership_changes', '?')} | {r['mean_batch_ids']:.1f} | {commit_words(r)} | {machine_words(r)} |")
    if len(p99s) > 1:
        print(f"\np99 over {len(p99s)} runs: median {statistics.median(p99s):.2f} ms, "
              f"min {min(p99s):.2f}, max {max(p99s):.2f}")
    plain_rows(runs)


def cpu_per_request_words(r):
    """The whole machine's busy CPU per request served in each window (the neighbour's share
    included in both alike), where the report has both windows."""
    w, pw = r.get("machine_cpu"), r.get("plain_http_machine_cpu")
    if not (w and pw and r["baton"]["ids_per_s"] and r["plain_http"]["ids_per_s"]):
        return "-"
    nxt = w["busy_cores"] * 1e6 / r["baton"]["ids_per_s"]
    plain = pw["busy_cores"] * 1e6 / r["plain_http"]["ids_per_s"]
    return f"{nxt:.1f} / {plain:.1f}"


def plain_rows(runs):
    """`--plain-http` runs (path, report): the same open loop on GET /healthz beside POST /next."""
    runs = [(p, r) for p, r in runs if r.get("plain_http")]
    if not runs:
        return
    print("\n| run | `/next` IDs/s | `/next` p99 ms | `/healthz` req/s | `/healthz` p99 ms | `/healthz` service p99 ms | `/healthz` errors | p99 `/next` : `/healthz` | machine CPU µs per request, `/next` / `/healthz` |")
    print("|---|---|---|---|---|---|---|---|---|")
    plain = []
    for p, r in runs:
        b, h = r["baton"], r["plain_http"]
        plain.append(h["p99_ms"])
        print(f"| {p.rsplit('/', 1)[-1]} | {b['ids_per_s']:.0f} | {b['p99_ms']:.2f} | {h['ids_per_s']:.0f} | "
              f"**{h['p99_ms']:.2f}** | {h.get('service_p99_ms') or float('nan'):.2f} | {h['errors']} | "
              f"{r.get('p99_over_plain_http') or float('nan'):.2f} | {cpu_per_request_words(r)} |")
    if len(plain) > 1:
        print(f"\nplain HTTP p99 over {len(plain)} runs: median {statistics.median(plain):.2f} ms, "
              f"min {min(plain):.2f}, max {max(plain):.2f}")


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


def ab(path):
    """A run with any non-2xx reply (leadership moved, say) is shown and left out of the medians."""
    text = open(path).read()
    runs = {}
    for block in text.split("## round ")[1:]:
        head = block.splitlines()[0]
        side = head.split(": ")[1].split()[0]
        what = "healthz" if "/healthz" in head else "next"
        m = re.search(r"Requests/sec:\s+([\d.]+)", block)
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", block)
        bad = int(non2xx.group(1)) if non2xx else 0
        runs.setdefault((side, what), []).append((float(m.group(1)) if m else 0.0, bad))

    def cell(run):
        rate, bad = run
        return f"{rate:,.0f}" if not bad else f"~~{rate:,.0f}~~ ({bad:,} non-2xx)"

    def ok(side, what):
        return [r for r, bad in runs[(side, what)] if not bad]

    old, new, h = runs[("old", "next")], runs[("new", "next")], runs[("new", "healthz")]
    print("| round | old /next | new /next | new /healthz | new:old | new /next : /healthz |")
    print("|---|---|---|---|---|---|")
    for i, (o, n, hz) in enumerate(zip(old, new, h), 1):
        no = f"{n[0] / o[0]:.2f}" if not (o[1] or n[1]) else "–"
        nh = f"{n[0] / hz[0]:.2f}" if not (n[1] or hz[1]) else "–"
        print(f"| {i} | {cell(o)} | {cell(n)} | {cell(hz)} | {no} | {nh} |")
    mo, mn, mh = (statistics.median(ok(*k)) for k in [("old", "next"), ("new", "next"), ("new", "healthz")])
    print(f"| median of valid runs | {mo:,.0f} | {mn:,.0f} | {mh:,.0f} | {mn / mo:.2f} | {mn / mh:.2f} |")


def pipe(path):
    """`perf.sh pipe`: per connection count, each round's /next rate and wrk p99 for
    commits_in_flight 1 and 2, and the medians."""
    runs = {}
    for block in open(path).read().split("## round ")[1:]:
        head = block.splitlines()[0]
        side = int(re.search(r"commits_in_flight=(\d+)", head).group(1))
        conns = int(re.search(r" -c(\d+)", head).group(1))
        rate = re.search(r"Requests/sec:\s+([\d.]+)", block)
        p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)", block, re.M)
        scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
        runs.setdefault((conns, side), []).append(
            (float(rate.group(1)) if rate else 0.0, float(p99.group(1)) * scale[p99.group(2)] if p99 else float("nan")))
    print("| connections | in flight 1: IDs/s per round | in flight 2: IDs/s per round | median 1 | median 2 | 2:1 | wrk p99 ms, median 1 / 2 |")
    print("|---|---|---|---|---|---|---|")
    for conns in sorted({c for c, _ in runs}):
        one, two = runs[(conns, 1)], runs[(conns, 2)]
        m1, m2 = (statistics.median(r for r, _ in x) for x in (one, two))
        p1, p2 = (statistics.median(p for _, p in x) for x in (one, two))
        fmt = lambda x: " / ".join(f"{r:,.0f}" for r, _ in x)
        print(f"| {conns} | {fmt(one)} | {fmt(two)} | {m1:,.0f} | {m2:,.0f} | {m2 / m1:.2f} | {p1:.2f} / {p2:.2f} |")


def buckets(path, name):
    """{le: count} of one Prometheus histogram in a text exposition."""
    out = {}
    for line in open(path):
        m = re.match(name + r'_bucket\{[^}]*le="([^"]+)"\} (\S+)', line)
        if m:
            out[float(m.group(1))] = float(m.group(2))
    return out


def bucket_quantile(before, after, q):
    """The upper bound of the bucket holding quantile q of the observations between two scrapes."""
    les = sorted(after)
    delta = [(le, after[le] - before.get(le, 0.0)) for le in les]
    total = delta[-1][1]
    for le, c in delta:
        if total and c >= q * total:
            return le, total
    return float("inf"), total


def split(prefix):
    client = json.load(open(prefix + "-client.json"))
    lat, svc = client["latency_ms"], client["service_ms"]
    print(f"client (baton load, {client['ok_rate']:.0f} IDs/s ok, {client['rejected'] + client['unknown']} errors, "
          f"tokens {client['tokens']}): from schedule p50 {lat['p50']} ms, p99 {lat['p99']} ms, "
          f"p99.9 {lat['p999']} ms; service (sent -> answered) p50 {svc['p50']} ms, p99 {svc['p99']} ms, "
          f"p99.9 {svc['p999']} ms")
    for name, what in [("baton_next_request_duration_seconds", "leader: intake -> answer (wait + commit)"),
                       ("baton_sequencer_commit_duration_seconds", "leader: one group commit")]:
        b, a = buckets(prefix + "-before.prom", name), buckets(prefix + "-after.prom", name)
        cells = []
        for q in (0.5, 0.99, 0.999):
            le, total = bucket_quantile(b, a, q)
            cells.append(f"p{q * 100:g} <= {le * 1000:g} ms")
        print(f"{what}: {', '.join(cells)} ({total:.0f} observations)")


# Threads and processes `perf.sh profile` reports apart; everything else is "other".
PROFILE_GROUPS = [("baton-http", "leader's HTTP thread"), ("wrk", "load generator (wrk)"),
                  ("postgres", "PostgreSQL"), ("tokio-rt-worker", "nodes' runtimes (actors, PG client, raft)"),
                  ("swapper", "idle")]


def profile_round(tag):
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", open(tag + "-wrk.txt").read()).group(1))
    shares = {}
    for line in open(tag + "-comm.txt"):
        pct, comm = line.split(None, 1)
        comm = comm.strip()
        # The client threads are baton-http-0, -1, ...: summed as one group.
        key = next((g for g, _ in PROFILE_GROUPS if comm == g or comm.startswith(g + "-")), "other")
        shares[key] = shares.get(key, 0.0) + float(pct.rstrip("%"))
    return rate, shares


def profile(prefix, rounds):
    # A share of the whole machine (2 cores = 200 core-%) divided by the rate: CPU per request.
    print("| round | what | req/s | " + " | ".join(f"{d} µs/req" for _, d in PROFILE_GROUPS[:-1]) + " | other µs/req | idle % |")
    print("|---" * (len(PROFILE_GROUPS) + 4) + "|")
    cores = os.cpu_count()
    for r in range(1, int(rounds) + 1):
        for what in ("healthz", "next"):
            rate, shares = profile_round(f"{prefix}-{r}-{what}")
            us = lambda k: shares.get(k, 0.0) / 100 * cores / rate * 1e6
            cells = [f"{us(g):.1f}" for g, _ in PROFILE_GROUPS[:-1]] + [f"{us('other'):.1f}"]
            print(f"| {r} | {what} | {rate:.0f} | " + " | ".join(cells) + f" | {shares.get('swapper', 0.0):.1f} |")


def gen(prefix):
    # perf's `--sort pid` rows are threads ("TID:comm"); the generator's are the ones listed
    # in /proc/PID/task during the run, whatever their names.
    report = json.load(open(prefix + ".json"))
    rate = report["achieved_rate"]
    tids = {line.strip() for line in open(prefix + "-tids.txt") if line.strip()}
    shares = {}
    for line in open(prefix + "-threads.txt"):
        pct, who = line.split(None, 1)
        tid, _, comm = who.strip().partition(":")
        comm = "baton-http" if comm.strip().startswith("baton-http-") else comm.strip()
        key = "generator" if tid in tids else {"baton-http": "http", "postgres": "postgres",
                                               "swapper": "idle"}.get(comm, "other")
        shares[key] = shares.get(key, 0.0) + float(pct.rstrip("%"))
    us = lambda k: shares.get(k, 0.0) / 100 * os.cpu_count() / rate * 1e6
    print(f"{os.path.basename(prefix)}: offered {report['offered_rate']:.0f}/s, achieved {rate:.0f}/s, "
          f"p50 {report['latency_ms']['p50']:.2f} ms, p99 {report['latency_ms']['p99']:.2f} ms from schedule, "
          f"service p99 {report['service_ms']['p99']:.2f} ms; CPU per request: generator {us('generator'):.1f} µs, "
          f"leader's HTTP thread {us('http'):.1f}, PostgreSQL {us('postgres'):.1f}, other {us('other'):.1f}; "
          f"idle {shares.get('idle', 0.0):.1f}%")


def prom_value(path, name):
    """The sum over every series of `name` in a Prometheus text file (0 if absent)."""
    total = 0.0
    for line in open(path):
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line.strip())
        if m:
            total += float(m.group(2))
    return total


def thread_ns(path):
    rows = {}
    for line in open(path):
        parts = line.split()
        if len(parts) == 3:
            rows[parts[0]] = (parts[1], int(parts[2]))
    return rows


# The serial stage on the commit thread, from `perf script` stacks (one sample each): a sample
# counts for the first category whose frame is in its stack. The sequencer's is the only actor on
# that thread, so ractor's actor task there is its own; its commit tasks are `Answering::after`
# (inside `start_commit`'s task when the commit first takes a connection) in builds before the
# commit loop, and the commit loop's task (`sequencer::commit_loop`) after it; the connection is the
# sequencer's own PostgreSQL connection, the only one whose I/O runs there. Within the actor and
# the commit tasks, samples in the per-ID answer loop of earlier builds (`deliver`, `send_all`)
# are told apart. A home's answers (`HomeAnswers`, per request, on the thread serving it) are
# counted beside, not as serial.
SERIAL_CATEGORIES = [
    ("connection", "<tokio_postgres::connection::Connection<S,T> as core::future::future::Future>::poll"),
    ("actor", "ractor::actor::ActorRuntime<TActor>::start::"),
    ("commit tasks", "baton::work::sequencer::Answering::after"),
    ("commit tasks", "baton::work::sequencer::SequencerState::start_commit::{{closure}}"),
    ("commit loop", "baton::work::sequencer::commit_loop::"),
    ("home answers (per thread, not serial)", "baton::work::sequencer::HomeAnswers"),
]
PER_ID = ["baton::work::sequencer::send_all", "baton::work::sequencer::deliver"]


def classify_stacks(path):
    """Counts `perf script --no-inline` samples by SERIAL_CATEGORIES; (counts, samples)."""
    counts, total = {}, 0
    for block in open(path).read().split("\n\n"):
        lines = [l.strip() for l in block.strip().split("\n")]
        if not lines or not lines[0]:
            continue
        total += 1
        frames = [re.sub(r"^[0-9a-f]+ (.*?)\+0x[0-9a-f]+ \(.*$", r"\1", l) for l in lines[1:]]
        for name, frame in SERIAL_CATEGORIES:
            if any(f.startswith(frame) or f.startswith("<" + frame) for f in frames):
                if name in ("actor", "commit tasks") and any(f.startswith(p) for p in PER_ID for f in frames):
                    name += ", its per-ID answer loop"
                counts[name] = counts.get(name, 0) + 1
                break
    return counts, total


def serial_run(tag):
    """One `perf.sh serial` run: IDs, commits, the serial stage's µs per ID and per commit, the
    categories (µs per commit each), CPU µs/ID by thread name, the check."""
    delta = lambda name: prom_value(f"{tag}-after.prom", name) - prom_value(f"{tag}-before.prom", name)
    ids, commits = delta("baton_sequencer_batch_ids_sum"), delta("baton_sequencer_batch_ids_count")
    before, after = thread_ns(f"{tag}-threads-before.txt"), thread_ns(f"{tag}-threads-after.txt")
    threads = {}
    for tid, (comm, ns) in after.items():
        if tid in before:
            threads[(tid, comm)] = ns - before[tid][1]
    http0 = sum(ns for (_, comm), ns in threads.items() if comm == "baton-http-0")
    if os.path.exists(f"{tag}-stacks.txt"):
        counts, total = classify_stacks(f"{tag}-stacks.txt")
        with open(f"{tag}-categories.json", "w") as f:
            json.dump({"samples": total, "counts": counts}, f)
        os.remove(f"{tag}-stacks.txt")
    c = json.load(open(f"{tag}-categories.json"))
    counts, total = c["counts"], c["samples"]
    ns_per_sample = http0 / total if total else 0.0
    us = {k: v * ns_per_sample / 1000.0 for k, v in counts.items()}
    serial_us = sum(v for k, v in us.items() if "not serial" not in k)
    by_comm = {}
    for (_, comm), ns in threads.items():
        by_comm[comm] = by_comm.get(comm, 0) + ns
    per_thread = sorted(((ns / 1000.0 / ids if ids else float("nan"), comm)
                         for comm, ns in by_comm.items()), reverse=True)
    check = open(f"{tag}-check.txt").read().strip() if os.path.exists(f"{tag}-check.txt") else "?"
    return {
        "ids": ids, "commits": commits,
        "us_per_id": serial_us / ids if ids else float("nan"),
        "us_per_commit": serial_us / commits if commits else float("nan"),
        "parts": {k: v / commits for k, v in us.items()} if commits else {},
        "per_thread": per_thread, "check": check,
    }


def serial(tag):
    r = serial_run(tag)
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["parts"].items()))
    busiest = ", ".join(f"{comm} {v:.2f}" for v, comm in r["per_thread"][:3])
    print(f"IDs {r['ids']:,.0f}; serial stage **{r['us_per_id']:.3f} µs/ID**; {r['commits']:,.0f} commits of "
          f"{r['ids'] / r['commits'] if r['commits'] else 0:.1f} IDs, {r['us_per_commit']:.1f} µs each "
          f"(µs per commit: {parts}); CPU µs/ID by thread name: {busiest}; {r['check']}")


def serial_table(path):
    rows = []
    for line in open(path):
        m = re.match(r"^## round (\d+), (\w+) \(([^)]*)\): IDs ([\d,]+); serial stage \*\*([\d.na]+) µs/ID\*\*; "
                     r"([\d,]+) commits of ([\d.]+) IDs, ([\d.na]+) µs each \(µs per commit: (.*)\); "
                     r"CPU µs/ID by thread name: ([^;]*);", line)
        if m:
            rows.append(m.groups())
    print("| round | build | IDs in 6 s | mean IDs per commit | serial µs/ID | serial µs per commit | of which (µs per commit) | CPU µs/ID by thread name |")
    print("|---|---|---|---|---|---|---|---|")
    med = {}
    for rnd, side, _, ids, us, _, batch, per_commit, parts, threads in rows:
        print(f"| {rnd} | {side} | {ids} | {batch} | **{us}** | {per_commit} | {parts} | {threads} |")
        med.setdefault(side, []).append((float(us), float(per_commit)))
    if "old" in med and "new" in med:
        (o, oc), (n, nc) = ([statistics.median(x[i] for x in med[k]) for i in (0, 1)] for k in ("old", "new"))
        print(f"\nmedians: serial µs/ID old {o:.3f}, new {n:.3f} (new : old {n / o:.2f}); "
              f"µs per commit old {oc:.1f}, new {nc:.1f}")


def modes(path):
    """`perf.sh modes`: per round, durable and window /next and /healthz, and the ratios."""
    text = open(path).read()
    runs = {}
    for block in text.split("## round ")[1:]:
        head = block.splitlines()[0]
        side = head.split(": ")[1].split()[0]
        what = "healthz" if "/healthz" in head else "next"
        m = re.search(r"Requests/sec:\s+([\d.]+)", block)
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", block)
        p99 = re.search(r"\s99%\s+([\d.]+)(us|ms|s)", block)
        runs.setdefault((side, what), []).append(
            (float(m.group(1)) if m else 0.0, int(non2xx.group(1)) if non2xx else 0))
    d, w, h = runs[("durable", "next")], runs[("window", "next")], runs[("durable", "healthz")]
    print("| round | durable /next IDs/s | window /next IDs/s | /healthz req/s | durable : healthz | window : healthz |")
    print("|---|---|---|---|---|---|")
    rd, rw = [], []
    for i, (a, b, c) in enumerate(zip(d, w, h), 1):
        bad = ", ".join(f"{n:,} non-2xx" for n in (a[1], b[1], c[1]) if n)
        rd.append(a[0] / c[0])
        rw.append(b[0] / c[0])
        print(f"| {i} | {a[0]:,.0f} | {b[0]:,.0f} | {c[0]:,.0f} | {rd[-1]:.2f} | {rw[-1]:.2f} |" + (f" {bad}" if bad else ""))
    print(f"| median | {statistics.median(x[0] for x in d):,.0f} | {statistics.median(x[0] for x in w):,.0f} | "
          f"{statistics.median(x[0] for x in h):,.0f} | {statistics.median(rd):.2f} | {statistics.median(rw):.2f} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    if sys.argv[1] == "next":
        next_rows(sys.argv[2:])
    elif sys.argv[1] == "read":
        read_rows(sys.argv[2:])
    elif sys.argv[1] == "leaseab":
        leaseab(sys.argv[2])
    elif sys.argv[1] == "ratio":
        ratio(sys.argv[2])
    elif sys.argv[1] == "ab":
        ab(sys.argv[2])
    elif sys.argv[1] == "split":
        split(sys.argv[2])
    elif sys.argv[1] == "gen":
        gen(sys.argv[2])
    elif sys.argv[1] == "pipe":
        pipe(sys.argv[2])
    elif sys.argv[1] == "serial":
        serial(sys.argv[2])
    elif sys.argv[1] == "serial-table":
        serial_table(sys.argv[2])
    elif sys.argv[1] == "modes":
        modes(sys.argv[2])
    elif sys.argv[1] == "profile":
        profile(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else 2)
