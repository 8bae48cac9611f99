"""Agent throughput on one core: events/s through each layer of the agent, side by side
in one run, with the previous agent's per-event assembler as the reference.

    python benchmarks/agent_drain.py [--events 600000] [--json OUT]

A ring is pre-filled with a realistic event mix (32 requests in flight, 2 producer
stages, per chunk 8 producer + 4 consumer events, per-stage add/schedule/finish, API
arrive/first/end), then timed as the agent processes it in its own batch size. Each
layer includes the ones above it:

1. drain      RingReader.read_raw (the copy that frees the ring)
2. decode     + record.SlotDecoder (string tables, run-wide request ids)
3. record     + eventlog.EventLogWriter (zstd segments: the run's record)
4. spans      + spantable.SpanBuilder (pairing, FIFO blocking)
5. metrics    + MetricsView (Prometheus histograms): the agent's default path
6. otlp-obj   + OtlpSpan and SDK ReadableSpan objects (what a live OTLP exporter adds)
7. old-assemble  the previous agent: tests/support/reference_assembler.Assembler per event, text
   spans (its always-on path before the event log), for the ratio old -> new
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ["OMNITRACE_RUN_ID"] = f"drainbench-{os.getpid()}"
os.environ["OMNITRACE_RING_RECORDS"] = str(1 << 21)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from omnitrace import eventlog, otlp, record, spanload  # noqa: E402
from omnitrace.agent import export_otlp  # noqa: E402
from omnitrace.agent.export_prometheus import Metrics  # noqa: E402
from omnitrace.agent.views import MetricsView  # noqa: E402
from omnitrace.conventions import Ev  # noqa: E402
from omnitrace.spantable import SpanBuilder  # noqa: E402

LAYERS = ("drain", "decode", "record", "spans", "metrics", "otlp-obj", "old-assemble")


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
    level = LAYERS.index(layer)
    requests = record.RequestIds()
    dec = record.SlotDecoder(requests)
    rings = {0: {"pid": 1, "replica": 0, "role": "stage", "stage": 0, "process": "bench"}}
    log = eventlog.EventLogWriter(os.path.join(tmp, layer), "bench", 0) if level >= 2 else None
    builder = SpanBuilder(rings)
    builder.ring_changed()
    view = MetricsView(Metrics(), requests.strings)
    part = spanload.Part({}, requests.strings)
    conv = otlp.SpanConverter(requests.strings, rings, "bench")
    resources = export_otlp.ResourceCache("bench")
    old = None
    if layer == "old-assemble":
        from tests.support.reference_assembler import Assembler
        old = Assembler(lambda s: None, Metrics(), grace_s=0.0, text_only=True)
    t0 = time.process_time()  # CPU time of this (single-threaded) process: "one core"
    w0 = time.perf_counter()
    got = spans = 0
    while True:
        raw = reader.read_raw(1 << 15)  # the agent's per-ring cycle size
        if not raw:
            break
        if layer == "drain":
            got += len(raw) // record.RECORD_SIZE
            continue
        if old is not None:
            batch = dec.tuples(raw)
            got += len(batch)
            old.feed(batch, 0, 1, 0, "stage", 0, "bench")
            old.tick()
            old.texts.clear()
            continue
        rec = dec.decode(raw)
        got += len(rec)
        if log is not None:
            log.records(0, raw, len(rec))
            log.commit({0: dec.strings}, can_rotate=not dec.cut)
        if level >= 3:
            f = builder.feed(eventlog.to_events(rec, 0, 0))
            spans += len(f.spans)
            if level >= 4:
                view.feed(f, part)
            if level >= 5:
                [export_otlp.to_readable(s, resources) for s in conv.convert(f.spans, f.emits)]
    if log is not None:
        log.close()
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    reader.close(unlink=True)
    ring.close()
    if layer != "drain":
        assert got == n, (got, n)
    return {"events": n, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "events_per_cpu_s": round(n / cpu),
            "spans": old.spans_built if old is not None else spans,
            "record_bytes": log.bytes_written if log is not None else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=600_000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layer in LAYERS:
            out[layer] = r = run_layer(layer, args.events, tmp)
            print(f"{layer:<9} {r['events']:>8} events  {r['cpu_s']:>7.3f} s CPU  "
                  f"{r['events_per_cpu_s']:>10,} events/s  ({r['spans']} spans)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
