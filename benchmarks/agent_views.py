"""Where the live agent's CPU goes, per event: a real run's record replayed through the
agent's own span builder and views, in the feeds the agent makes (what was drained in
``Agent.VIEW_PERIOD_S`` of event time), each component timed on its own (CPU time).

    python benchmarks/agent_views.py RUN_DIR [--period S] [--culprits] [--json OUT]

RUN_DIR is any run's directory with an event log (e.g. ``omnitrace run --run-dir R serve``
under ``omnitrace bench``). The views read the clock to settle requests; the replay gives
them the feed's event time instead, so they settle as they would have live.
The drain, decode and record layers are ``benchmarks/agent_drain.py``'s.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from omnitrace import eventlog, spanload  # noqa: E402
from omnitrace.agent import attribution_view, promproto  # noqa: E402
from omnitrace.agent.attribution_view import AttributionView, RequestView  # noqa: E402
from omnitrace.agent.export_prometheus import Metrics  # noqa: E402
from omnitrace.agent.main import Agent  # noqa: E402
from omnitrace.agent.views import MetricsView  # noqa: E402
from omnitrace.spantable import SpanBuilder  # noqa: E402


class _Clock:
    """The views' ``time.monotonic``, set to the replayed feed's event time."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def replay(run_dir: str, period_s: float, culprits: bool = False) -> dict:
    got = eventlog.stream_event_log(run_dir)
    if got is None:
        raise SystemExit(f"{run_dir}: no event log")
    log, parts = got
    ev = np.concatenate(list(parts))
    ev = ev[np.argsort(ev["t"], kind="stable")]
    clock = _Clock()
    attribution_view.time = clock  # type: ignore[attr-defined]  (the replay's clock)
    metrics = Metrics()
    builder = SpanBuilder(log.rings, culprits=culprits)  # the agent ranks them for OTLP only
    builder.ring_changed()
    views = {"metrics": MetricsView(metrics, log.requests.strings), "requests": RequestView(metrics),
             "attribution": AttributionView(metrics, log.requests.strings, log.rings)}
    seen = spanload.Part(log.rings, log.requests.strings)
    cpu = dict.fromkeys(["builder", *views, "count_events"], 0.0)
    edges = np.searchsorted(ev["t"], np.arange(ev["t"][0], ev["t"][-1] + period_s * 1e9, period_s * 1e9))
    feeds = 0
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi <= lo:
            continue
        part = ev[lo:hi]
        clock.now = float(part["t"][-1]) / 1e9
        t = time.process_time()
        feed = builder.feed(part, clock.now)
        cpu["builder"] += time.process_time() - t
        for name, view in views.items():
            t = time.process_time()
            view.feed(feed, seen)
            cpu[name] += time.process_time() - t
        t = time.process_time()
        metrics.count_events(part, log.rings)
        cpu["count_events"] += time.process_time() - t
        feeds += 1
    clock.now += 60.0
    t = time.process_time()
    feed = builder.flush()
    for view in views.values():
        view.feed(feed, seen)
        view.close(1.0)
    cpu["builder"] += time.process_time() - t
    n = len(ev)
    return {"events": n, "feeds": feeds, "events_per_feed": n / max(feeds, 1),
            "attributed": views["attribution"].attributed, "scrape": scrape_cost(metrics),
            "us_per_event": {k: v / n * 1e6 for k, v in cpu.items()},
            "total_us_per_event": sum(cpu.values()) / n * 1e6}


def scrape_cost(metrics: Metrics, rounds: int = 20) -> dict:
    """CPU ms and bytes of one /metrics answer at the run's end, per format Prometheus asks
    for: protobuf (native histograms on) and OpenMetrics text (classic buckets)."""
    out = {}
    for fmt, accept in (("protobuf", promproto.CONTENT_TYPE), ("openmetrics", "application/openmetrics-text")):
        t = time.process_time()
        for _ in range(rounds):
            body, _ = metrics.exposition(accept)
        out[fmt] = {"cpu_ms": (time.process_time() - t) / rounds * 1e3, "bytes": len(body)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--period", type=float, default=Agent.VIEW_PERIOD_S,
                   help=f"event-time seconds per feed (default: the agent's, {Agent.VIEW_PERIOD_S})")
    p.add_argument("--culprits", action="store_true",
                   help="rank each FIFO span's blocking requests (what a live OTLP exporter adds)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    r = replay(args.run_dir, args.period, args.culprits)
    print(f"{r['events']} events in {r['feeds']} feeds (~{r['events_per_feed']:.0f} per feed), "
          f"{r['attributed']} requests attributed")
    for k, v in r["us_per_event"].items():
        print(f"  {k:<13} {v:6.3f} µs/event")
    print(f"  {'total':<13} {r['total_us_per_event']:6.3f} µs/event")
    for fmt, c in r["scrape"].items():
        print(f"  one scrape, {fmt}: {c['cpu_ms']:.1f} ms CPU, {c['bytes'] / 1e3:.0f} kB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
