"""How fast is this machine right now? A fixed piece of work, timed in CPU time, every
``PERIOD_S`` while a benchmark round runs: a measure of the machine's speed that the
variants under test do not change, to set the rounds' CPU figures against.

Why: on a shared VM the CPU time one request costs moves +-7% between rounds by itself
(the host's other tenants, the SMT sibling), the same way for every process; a paired
benchmark's spread is mostly that. The probe sees the same drift. It runs at real-time
priority above py-spy's (``omnitrace.profile.runner.prioritize`` gives py-spy FIFO 1), so
nothing of a run preempts it mid-burst: a burst's CPU time is the work's cost at the
machine's speed, not the preemptions a variant adds. Its duty is ~2% of one core, the
same in every variant.

    p = start(); ...; median_us = stop(p)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np

PERIOD_S = 0.05
PRIORITY = 2  # SCHED_FIFO, above py-spy's 1

_PROBE = f"""
import json, os, signal, sys, time
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param({PRIORITY}))
    rt = True
except PermissionError:
    rt = False
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
buf = bytearray(os.urandom(1 << 18))
costs = []
def work():
    t0 = time.thread_time_ns()
    acc = 0
    for i in range(0, len(buf), 64):  # touches every cache line of 256 KiB
        acc += buf[i]
    for i in range(4000):
        acc = (acc * 31 + i) & 0xffffffff
    return time.thread_time_ns() - t0
while not stop:
    costs.append(work())
    time.sleep({PERIOD_S})
json.dump({{"costs": costs, "realtime": rt}}, sys.stdout)
"""


def start() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _PROBE], stdout=subprocess.PIPE, text=True)


def stop(p: subprocess.Popen) -> float:
    """The bursts' median CPU time (µs; the first, cold, left out; NaN if none). Said on
    stderr where the probe got no real-time priority: py-spy may then preempt it."""
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    doc = json.loads(out)
    if not doc["realtime"]:
        print("speed_probe: no real-time priority (not root?): its bursts can be preempted", file=sys.stderr)
    costs = doc["costs"][1:]
    return float(np.median(costs)) / 1e3 if costs else float("nan")


if __name__ == "__main__":  # a quick look: the probe for N seconds
    import time
    proc = start()
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
    print(stop(proc))
    os._exit(0)
