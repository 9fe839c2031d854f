#!/usr/bin/env python3
"""CPU by thread over a window, the whole machine: which thread is the serial stage.

    scripts/bench/threads.py SECONDS [TOP]

Reads every thread's utime + stime from /proc/PID/task/TID/stat at the start and the end of the
window and prints the TOP busiest (default 15) as a share of one core, with the thread's name
and its process's. A thread near 100% of a core while the machine has idle time is a stage that
more cores cannot help (FINDINGS §11.12).
"""
import os
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def snapshot():
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
            proc = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            continue
        for tid in tids:
            try:
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
            except OSError:
                continue
            # The name is in parentheses and may hold spaces: split after its closing one.
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[(pid, tid)] = (proc, name, int(fields[11]) + int(fields[12]))
    return out


def main():
    secs = float(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    a, t0 = snapshot(), time.monotonic()
    time.sleep(secs)
    b, t1 = snapshot(), time.monotonic()
    rows = []
    for key, (proc, name, ticks) in b.items():
        before = a[key][2] if key in a else 0
        rows.append(((ticks - before) / HZ / (t1 - t0) * 100, proc, name, key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"all threads: {total:.0f}% of a core over {t1 - t0:.1f} s ({os.cpu_count()} cores)")
    for pct, proc, name, (pid, tid) in rows[:top]:
        print(f"{pct:6.1f}%  {proc:16} {name:16} pid {pid} tid {tid}")


if __name__ == "__main__":
    main()
