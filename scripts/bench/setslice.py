#!/usr/bin/env python3
"""Sets an EEVDF custom slice (sched_setattr sched_runtime, Linux >= 6.12; 0 = default) on the
given thread ids, keeping their nice values. An exploratory probe for FINDINGS 11.4 / issue 14:
    python3 scripts/bench/setslice.py 100000 TID...   # 0.1 ms slices"""
import ctypes, os, sys, struct
libc = ctypes.CDLL(None, use_errno=True)
SYS_sched_setattr = 314
def setslice(tid, ns):
    nice = os.getpriority(os.PRIO_PROCESS, tid)
    attr = struct.pack("IIQiIQQQII", 56, 0, 0, nice, 0, ns, 0, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr)
    r = libc.syscall(SYS_sched_setattr, tid, buf, 0)
    if r != 0:
        print("fail", tid, ctypes.get_errno())
ns = int(sys.argv[1])
for tid in sys.argv[2:]:
    setslice(int(tid), ns)
