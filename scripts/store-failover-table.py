#!/usr/bin/env python3
"""The tables of FINDINGS §15.x from `baton exp` results of the store-failover experiments.

    scripts/store-failover-table.py experiments/results/store-failover-pg-async/*.json

One row per run (`LABEL.json`). For `pg-promote` runs, each promotion's detail carries the
fence's `max_token`, the ledger's highest seq and (pg-lease) the lease epoch, read on the primary
just before its kill and on the standby just before its promotion: what went back is what the
promotion lost. The acknowledged IDs lost (in no ledger row of their token) and repeated (a seq
acknowledged again) are the run's own counts over the whole history (`verdict.acked_missing`,
`verdict.acked_repeats`). For `sentinel-failover` runs, the time from the kill to the Sentinels
naming the replica, and the failovers the Sentinels made on their own.
"""

import json
import re
import statistics
import sys

MARKS = re.compile(
    r"the primary before the kill: max_token (\d+), seq (\d+)(?:, epoch (\d+))?; "
    r"the standby before its promotion: max_token (\d+), seq (\d+)(?:, epoch (\d+))?"
)


def med_max(xs, fmt="{:.0f}"):
    if not xs:
        return "–"
    return f"{fmt.format(statistics.median(xs))} / {fmt.format(max(xs))}"


def count(d, key):
    """A verdict count; `–` for results written before the run counted it."""
    v = d["verdict"].get(key)
    return "–" if v is None else f"{v:,}"


def verdict(d):
    v = d["verdict"]
    if v["pass"]:
        word = "PASS"
    else:
        word = "FAIL " + ", ".join(f"`{x['invariant']}`" for x in v["violations"])
    if d["expect"] == "any":
        word += " (reported, not judged)"
    return word


def pg_row(d):
    n = d["nemesis"]
    promos = [f for f in d["faults"] if f["kind"] == "pg-promote"]
    after_kill = []
    seq_lost, token_back, epoch_back, handed = [], 0, 0, 0
    for f in promos:
        m = re.search(r"promoted after (\d+) ms", f["detail"])
        if m:
            after_kill.append(float(m.group(1)))
        if "stepped down" in f["detail"] and "leads with token" in f["detail"]:
            handed += 1
        mk = MARKS.search(f["detail"])
        if not mk:
            continue
        t0, s0, e0, t1, s1, e1 = mk.groups()
        seq_lost.append(max(0, int(s0) - int(s1)))
        if int(t1) < int(t0):
            token_back += 1
        if e0 is not None and e1 is not None and int(e1) < int(e0):
            epoch_back += 1
    marked = sum(1 for f in promos if MARKS.search(f["detail"]))
    return [
        d["label"],
        f"{n['took_effect']} / {n['drawn']}",
        f"{len(promos)}" + (f" ({handed} with a hand-over)" if handed else ""),
        med_max(after_kill),
        (f"{med_max(seq_lost)} (total {sum(seq_lost)})" if seq_lost else "–"),
        f"{token_back} / {marked}" if marked else "–",
        f"{epoch_back} / {marked}" if marked and d["backend"] == "pg-lease" else "–",
        count(d, "acked_missing"),
        count(d, "acked_repeats"),
        f"{d['rejections_total']}",
        f"{100 * n['availability']:.1f}% ({n['acked']:,} acked)",
        verdict(d),
    ]


PG_HEAD = [
    "run",
    "faults in effect",
    "of them pg-promote",
    "promoted after the kill, ms (median / max)",
    "seq the standby lacked per promotion (median / max)",
    "promotions where `max_token` went back",
    "promotions where the lease epoch went back",
    "acknowledged IDs lost",
    "acknowledged again (re-issued)",
    "refusals",
    "`/next` availability",
    "verdict",
]


def sentinel_row(d):
    n = d["nemesis"]
    fo = [f for f in d["faults"] if f["kind"] == "sentinel-failover"]
    named = [(f["healed_at_mono_ns"] - f["applied_at_mono_ns"]) / 1e6 for f in fo if f.get("healed_at_mono_ns")]
    own = sum(1 for f in fo if "on their own" in f["detail"])
    return [
        d["label"],
        f"{n['took_effect']} / {n['drawn']}",
        f"{len(fo)}",
        med_max(named),
        f"{own}",
        f"{d['rejections_total']}",
        count(d, "acked_missing"),
        count(d, "acked_repeats"),
        f"{100 * n['availability']:.1f}% ({n['acked']:,} acked)",
        verdict(d),
    ]


SENTINEL_HEAD = [
    "run",
    "faults in effect",
    "of them sentinel-failover",
    "replica named after the kill, ms (median / max)",
    "failed over on their own",
    "refusals",
    "acknowledged IDs lost",
    "acknowledged again",
    "`/next` availability",
    "verdict",
]


def main(paths):
    pg, sentinel = [], []
    for p in sorted(paths):
        if p.endswith("runs.csv") or not p.endswith(".json"):
            continue
        d = json.load(open(p))
        if "nemesis" not in d or not d["nemesis"]:
            continue
        kinds = {f["kind"] for f in d["faults"]}
        if "sentinel-failover" in kinds:
            sentinel.append(sentinel_row(d))
        else:
            pg.append(pg_row(d))
    for head, rows in ((PG_HEAD, pg), (SENTINEL_HEAD, sentinel)):
        if not rows:
            continue
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
