"""Hot-path cost of one omnitrace record vs one OpenTelemetry SDK span, same process, same run.

    python benchmarks/record_cost.py [--passes 7] [--json OUT]

Rows: the Python writer (``record.Ring``, the reference), the compiled one
(``omnitrace/_ringc.c``, what ``thread_ring()`` hands out where it is built) and
``record.emit`` (a thread-local lookup, then the thread's writer).

Method (the same for every row): each statement runs in a compiled
``for _ in range(n)`` loop with its callables pre-bound as fast locals; one warm-up pass,
then timed passes; per-op ns = pass time / n (loop overhead ~8 ns included). Reports
min and median over passes. Every record reads its own perf_counter_ns(), like a hook
site does. The OTel row is the SDK TracerProvider + BatchSpanProcessor with an exporter
that discards (so no I/O is measured), ``start_span()+end()`` with 0 attributes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMNITRACE_RUN_ID", f"bench-{os.getpid()}")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (BatchSpanProcessor, SpanExporter,  # noqa: E402
                                            SpanExportResult)

from omnitrace import record  # noqa: E402
from omnitrace.conventions import Ev  # noqa: E402


class _Discard(SpanExporter):
    def export(self, spans):  # noqa: D401
        return SpanExportResult.SUCCESS


def timeit(stmt: str, env: dict, min_pass_s: float, passes: int, drain=None) -> dict:
    src = "def _f(_n, " + ", ".join(f"{k}=_env[{k!r}]" for k in env) + "):\n"
    src += "    for _i in range(_n):\n        " + stmt + "\n"
    ns: dict = {"_env": env}
    exec(src, ns)
    f = ns["_f"]
    n = 10000
    while True:  # size n so that one pass lasts >= min_pass_s
        t0 = time.perf_counter_ns()
        f(n)
        dt = time.perf_counter_ns() - t0
        if drain:
            drain()
        if dt >= min_pass_s * 1e9:
            break
        n = int(n * max(2.0, 1.2 * min_pass_s * 1e9 / max(dt, 1)))
    per = []
    for _ in range(passes):
        t0 = time.perf_counter_ns()
        f(n)
        per.append((time.perf_counter_ns() - t0) / n)
        if drain:
            drain()  # keep the ring from filling (a full ring would measure the drop path)
    return {"n": n, "min_ns": round(min(per), 1), "median_ns": round(statistics.median(per), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=7)
    ap.add_argument("--min-pass-s", type=float, default=0.25)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    run = os.environ["OMNITRACE_RUN_ID"]
    ring = record.Ring(run + "-py", record.ProcessInfo(), record.DEFAULT_RECORDS)
    owner = record.Ring(run + "-c", record.ProcessInfo(), record.DEFAULT_RECORDS)
    compiled = owner.writer()  # the ring itself where the C writer is not built
    record.emit(0, "warm-up", 0)  # this thread's ring, as thread_ring() makes it
    readers = [record.RingReader(r.name) for r in (ring, owner, *record._rings)]
    drain = lambda: [r.read_raw() for r in readers]  # noqa: E731
    provider = TracerProvider()
    bsp = BatchSpanProcessor(_Discard())
    provider.add_span_processor(bsp)
    tracer = provider.get_tracer("bench")
    kind = int(Ev.FIFO_ENQUEUE)
    rows = {
        "empty loop": timeit("pass", {}, args.min_pass_s, args.passes),
        "perf_counter_ns()": timeit("pc()", {"pc": time.perf_counter_ns}, args.min_pass_s, args.passes),
        "Ring.record(kind, req, stage, chunk, a, b)": timeit(
            "rec(k, 'req-123', 0, 5, 3, 1)", {"rec": ring.record, "k": kind},
            args.min_pass_s, args.passes, drain),
        f"compiled writer .record (built: {record._ringc is not None})": timeit(
            "rec(k, 'req-123', 0, 5, 3, 1)", {"rec": compiled.record, "k": kind},
            args.min_pass_s, args.passes, drain),
        "record.emit(kind, req, stage, chunk, a, b)": timeit(
            "emit(k, 'req-123', 0, 5, 3, 1)", {"emit": record.emit, "k": kind},
            args.min_pass_s, args.passes, drain),
        "OTel SDK + BatchSpanProcessor start_span()+end()": timeit(
            "ss('fifo').end()", {"ss": tracer.start_span}, args.min_pass_s, args.passes),
    }
    provider.shutdown()
    for r in readers:
        r.close(unlink=True)
    rec = rows["Ring.record(kind, req, stage, chunk, a, b)"]
    otel = rows["OTel SDK + BatchSpanProcessor start_span()+end()"]
    out = {
        "python": sys.version.split()[0],
        "rows": rows,
        "ratio_otel_over_record_median": round(otel["median_ns"] / rec["median_ns"], 1),
        "ratio_otel_over_record_min": round(otel["min_ns"] / rec["min_ns"], 1),
        "ratio_otel_over_compiled_median": round(otel["median_ns"] / rows[next(
            k for k in rows if k.startswith("compiled"))]["median_ns"], 1),
        "targets": {"record_ns_max": 300, "ratio_min": 30},
    }
    width = max(len(k) for k in rows)
    print(f"{'op':<{width}}  {'min ns':>9}  {'median ns':>9}  n")
    for k, v in rows.items():
        print(f"{k:<{width}}  {v['min_ns']:>9}  {v['median_ns']:>9}  {v['n']}")
    print(f"OTel BSP span / Ring.record: {out['ratio_otel_over_record_median']}x (median), "
          f"{out['ratio_otel_over_record_min']}x (min); over the compiled writer: "
          f"{out['ratio_otel_over_compiled_median']}x (median)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
