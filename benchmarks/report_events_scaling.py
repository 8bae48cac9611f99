"""How long `omnitrace report` takes on a big event log: a real run's events (the
reference pipeline under `omnitrace bench`) replicated K times with new request ids and
shifted times into a synthetic run directory, then `omnitrace report` timed in a child
process (wall time, CPU time, peak RSS).

    python benchmarks/report_events_scaling.py BASE_RUN --events 10000000 [--keep DIR]

BASE_RUN is any run directory with an event log (e.g. from `omnitrace run -- python -m
omnitrace.bench.serve_and_bench -- --concurrency 32 ...`).
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from omnitrace import eventlog, record  # noqa: E402
from omnitrace.runfiles import names, read, write  # noqa: E402


def synthesise(base: str, out: str, events: int) -> int:
    log = eventlog.read_event_log(base)
    assert log is not None, f"{base}: no event log"
    ev = log.events
    copies = max(1, events // len(ev))
    span_ns = int(ev["t"].max() - ev["t"].min()) + 1_000_000
    os.makedirs(out, exist_ok=True)
    for name in ("run.json", "processes.jsonl"):
        if os.path.exists(os.path.join(base, name)):
            shutil.copy(os.path.join(base, name), out)
    w = eventlog.EventLogWriter(out, _run_id(base), log.offset_ns)
    for idx, ring in log.rings.items():
        w.ring(idx, ring)
    per_ring = {idx: ev[ev["ring"] == idx] for idx in log.rings}
    strings = log.requests.strings
    for k in range(copies):
        for idx, rows in per_ring.items():
            if not len(rows):
                continue
            reqs = np.unique(rows["req"])
            local = np.zeros(int(reqs.max()) + 1, np.uint32)
            head = []
            for i, r in enumerate(reqs.tolist(), 1):
                local[r] = i if r else 0
                if r:
                    head.append(record.string_slots(i, f"k{k}-{strings[r]}"))
            rec = np.zeros(len(rows), record.RECORD_DTYPE)
            for f in ("a", "chunk", "kind", "stage", "b"):
                rec[f] = rows[f]
            rec["t"] = rows["t"] - log.offset_ns + k * span_ns
            rec["req"] = local[rows["req"]]
            raw = b"".join(head) + rec.tobytes()
            w.records(idx, raw, len(rows))
        w.commit({})
    w.close()
    _agent_json(base, out, copies, w.counters())
    return copies * len(ev)


def _run_id(base: str) -> str:
    """The base run's id (its run.json beside the log names the same run), else "synthetic"."""
    run = read.read(base, names.RUN)
    return str(run["run_id"]) if run and run.get("run_id") else "synthetic"


def _agent_json(base: str, out: str, copies: int, record_counters: dict) -> None:
    """The base run's agent.json with the counts of what this run's log holds: each ring
    wrote and the agent recorded ``copies`` times its events (the base's counts beside the
    replicated log read as events counted twice)."""
    agent = read.read(base, names.AGENT)
    if agent is None:
        return
    for ring in agent.get("rings", []):
        for key in ("events", "events_written", "dropped"):
            if key in ring:
                ring[key] *= copies
    acc = agent.get("accounting", {})
    for key, value in acc.items():
        if isinstance(value, int):
            acc[key] = value * copies
    if "events_read" in agent:
        agent["events_read"] *= copies
    agent["record"] = record_counters
    write.write_json_atomic(names.path(out, names.AGENT), agent)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--keep", default=None)
    args = p.parse_args()
    out = args.keep or tempfile.mkdtemp(prefix="report-events-")
    t0 = time.monotonic()
    n = synthesise(args.base, out, args.events)
    disk = sum(os.path.getsize(x) for x in eventlog.segments(out))
    print(f"synthesised {n:,} events ({disk / 1e6:.0f} MB on disk) in {time.monotonic() - t0:.1f} s")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", out, "--json", os.devnull],
                       capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"omnitrace report: exit {r.returncode}, {wall:.1f} s wall, {cpu:.1f} s CPU, "
          f"peak RSS {after.ru_maxrss / 2**20:.2f} GB, load avg {os.getloadavg()[0]:.1f}")
    if r.returncode not in (0, 3):
        print(r.stderr[-2000:])
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
