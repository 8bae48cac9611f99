"""Agent drain rate on one core: events/s through each layer of the agent.

    python benchmarks/agent_drain.py [--events 600000] [--json OUT]

A ring is pre-filled with a realistic event mix (32 requests in flight, 2 producer
stages, per chunk 8 producer + 4 consumer events, per-stage add/schedule/finish, API
arrive/first/end), then timed as the agent processes it in its own batch size:

1. drain      RingReader.read_batch (decode + string table)
2. assemble   + Assembler.feed: spans, FIFO residence/blocked, Prometheus observations
3. file       + OTLP-JSON encoding into spans.jsonl (the always-on exporter)
4. otlp-obj   + SDK ReadableSpan conversion (what an OTLP exporter adds, before the network)

and, with ``--gil``, the agent's GIL sharing: the file layer runs on the main thread while
a drain thread wakes every 20 ms (as the agent's does) and copies a second ring raw into
a spool; reported: how late that thread got to run after each sleep (max, p99), i.e.
whether assembly starves the drain.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

os.environ["OMNITRACE_RUN_ID"] = f"drainbench-{os.getpid()}"
os.environ["OMNITRACE_RING_RECORDS"] = str(1 << 21)

from omnitrace import record  # noqa: E402
from omnitrace.agent import export_otlp  # noqa: E402
from omnitrace.agent.assemble import Assembler  # noqa: E402
from omnitrace.agent.export_prometheus import Metrics  # noqa: E402
from omnitrace.agent.rundir import RunDir  # noqa: E402
from omnitrace.conventions import Ev  # noqa: E402


def fill(ring: record.Ring, n_events: int, chunks: int = 8, inflight: int = 32) -> int:
    rec, t, written, r = ring.record, time.perf_counter_ns(), 0, 0
    while written < n_events:
        batch = [f"req-{r + i}" for i in range(inflight)]
        r += inflight
        for q in batch:
            rec(Ev.REQUEST_ARRIVE, q, -1, -1, 100, 50, t); t += 1000
            for s in (0, 1, 2):
                rec(Ev.STAGE_ADD, q, s, -1, 0, 0, t); t += 1000
                rec(Ev.STAGE_SCHEDULE, q, s, -1, 1, 0, t); t += 1000
            written += 7
        for c in range(chunks):
            for s in (0, 1):
                for q in batch:
                    for k in (Ev.SNAPSHOT_BEGIN, Ev.SNAPSHOT_END, Ev.FIFO_ENQUEUE, Ev.FIFO_DEQUEUE,
                              Ev.PROCESS_BEGIN, Ev.PROCESS_END, Ev.PUT_BEGIN, Ev.PUT_END):
                        rec(k, q, s, c, 1024, s + 1, t); t += 700
                    for k in (Ev.GET_BEGIN, Ev.GET_END, Ev.CHUNK_READY, Ev.CHUNK_SCHEDULED):
                        rec(k, q, s + 1, c, 1024, s, t); t += 700
                    written += 12
        for q in batch:
            for s in (0, 1, 2):
                rec(Ev.STAGE_FINISH, q, s, -1, 0, 0, t); t += 1000
            rec(Ev.REQUEST_FIRST_TEXT, q, -1, -1, 0, 0, t)
            rec(Ev.REQUEST_FIRST_AUDIO, q, -1, -1, 0, 0, t)
            rec(Ev.REQUEST_END, q, -1, -1, 0, 0, t); t += 1000
            written += 6
    return written


def run_layer(layer: str, n_events: int, tmp: str) -> dict:
    ring = record.Ring(os.environ["OMNITRACE_RUN_ID"] + layer, record.ProcessInfo("stage", 0, 0, "bench"),
                       1 << 21)
    n = fill(ring, n_events)
    reader = record.RingReader(ring.name)
    spans: list = []
    # the agent's always-on path (no OTLP exporter) keeps complete chunk spans as text only
    asm = Assembler(spans.append, Metrics(), grace_s=0.0, text_only=layer in ("assemble", "file"))
    rundir = RunDir(os.path.join(tmp, layer)) if layer in ("file", "otlp-obj") else None
    resources = export_otlp.ResourceCache("bench")
    t0 = time.process_time()  # CPU time of this (single-threaded) process: "one core"
    w0 = time.perf_counter()
    got = 0
    while True:
        batch = reader.read_batch(1 << 18)
        if not batch:
            break
        got += len(batch)
        if layer != "drain":
            asm.feed(batch, 0, 1, 0, "stage", 0, "bench")
            asm.tick()
            if layer == "otlp-obj":
                [export_otlp.to_readable(s, resources) for s in spans]
            if rundir is not None:
                rundir.write_span_objects(spans, resources.attrs)
                if asm.texts:
                    rundir.write_span_texts(asm.texts, resources.attrs)
            if asm.texts:
                asm.texts.clear()
            spans.clear()
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    reader.close(unlink=True)
    ring.close()
    assert got == n, (got, n)
    return {"events": n, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "events_per_cpu_s": round(n / cpu), "spans": asm.spans_built}


def gil_lag(n_events: int, tmp: str, interval_s: float = 0.02) -> dict:
    """Drain-thread wake-up lateness while the main thread assembles (one process)."""
    from omnitrace.agent.spool import Spool
    side = record.Ring(os.environ["OMNITRACE_RUN_ID"] + "gil", record.ProcessInfo("stage", 1, 0, "x"),
                       1 << 16)
    side_reader = record.RingReader(side.name)
    spool = Spool(os.path.join(tmp, "events.bin"))
    lags: list[float] = []
    stop = threading.Event()

    def drain() -> None:
        while True:
            due = time.monotonic() + interval_s
            if stop.wait(interval_s):
                return
            lags.append((time.monotonic() - due) * 1e3)
            raw = side_reader.read_raw(1 << 15)
            if raw:
                spool.records(0, raw)
            spool.commit()

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    r = run_layer("file", n_events, tmp)
    stop.set()
    t.join()
    spool.close()
    side_reader.close(unlink=True)
    side.close()
    lags.sort()
    r.update(drain_wakeups=len(lags), lag_max_ms=round(lags[-1], 2),
             lag_p99_ms=round(lags[int(len(lags) * 0.99)], 2),
             lag_median_ms=round(lags[len(lags) // 2], 2))
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=600_000)
    ap.add_argument("--json")
    ap.add_argument("--gil", action="store_true", help="also measure drain-thread lateness")
    args = ap.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layer in ("drain", "assemble", "file", "otlp-obj"):
            out[layer] = r = run_layer(layer, args.events, tmp)
            print(f"{layer:<9} {r['events']:>8} events  {r['cpu_s']:>7.3f} s CPU  "
                  f"{r['events_per_cpu_s']:>10,} events/s  ({r['spans']} spans)")
        if args.gil:
            out["gil"] = r = gil_lag(args.events, tmp)
            print(f"gil       file layer with a 20 ms drain thread: {r['events_per_cpu_s']:,} events/s; "
                  f"drain wake-up late by median {r['lag_median_ms']} ms, p99 {r['lag_p99_ms']} ms, "
                  f"max {r['lag_max_ms']} ms over {r['drain_wakeups']} wake-ups; "
                  f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
