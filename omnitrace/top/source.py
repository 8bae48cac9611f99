"""Where `omnitrace top` reads from: the agent's Prometheus endpoint, or a run directory.

A :class:`Sample` is one reading of the agent's registry: counters and gauges by
``(name, labels)``, histograms as (bounds, cumulative counts, sum). Two readings make
rates. Sources:

* a URL: the agent's ``/metrics``, asked for in the protobuf format, whose native
  histograms give quantiles within one 4.4% bucket (an endpoint that answers in text:
  prometheus_client's own parser, classic buckets);
* a run directory: its live endpoint (``run.json`` ``prometheus_endpoint``) while the run
  is going; otherwise the agent's last two ``metrics.jsonl`` messages (OTLP JSON, written
  every few seconds and at the end), and ``agent.json`` for the head-of-line leaderboard,
  drops and lag.
"""
from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from omnitrace import conventions as cv
from omnitrace.agent import promproto
from omnitrace.agent.export_prometheus import HISTOGRAMS
from omnitrace.runfiles import names
from omnitrace.runfiles.read import last_metrics, read_or_empty

Labels = tuple[tuple[str, str], ...]
DEFAULT_URL = f"http://127.0.0.1:{cv.DEFAULT_PROMETHEUS_PORT}/metrics"
# metrics.jsonl names (OTLP) -> Prometheus names
_OTLP_HIST = {name: prom for name, (prom, _, _, _) in HISTOGRAMS.items()}


class SourceError(Exception):
    """The source cannot be read (one line for the user)."""


@dataclass
class Histogram:
    bounds: list[float]  # finite upper bounds; the last bucket is +Inf
    cumulative: list[float]  # len(bounds) + 1
    sum: float = 0.0

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0


@dataclass
class Sample:
    t: float  # seconds (monotonic for live sources, unix for files)
    values: dict[tuple[str, Labels], float] = field(default_factory=dict)
    hists: dict[tuple[str, Labels], Histogram] = field(default_factory=dict)
    agent: dict[str, Any] = field(default_factory=dict)  # agent.json, when there is one
    live: bool = True
    note: str = ""  # e.g. "run ended"

    def series(self, name: str) -> dict[Labels, float]:
        return {lab: v for (n, lab), v in self.values.items() if n == name}

    def total(self, name: str) -> float:
        return sum(self.series(name).values())


def _labels(d: dict[str, str]) -> Labels:
    return tuple(sorted(d.items()))


def parse_prometheus(text: str, t: float) -> Sample:
    s = Sample(t)
    for fam in text_string_to_metric_families(text):
        if fam.type == "histogram":
            per: dict[Labels, dict] = {}
            for smp in fam.samples:
                lab = {k: v for k, v in smp.labels.items() if k != "le"}
                h = per.setdefault(_labels(lab), {"b": [], "sum": 0.0})
                if smp.name.endswith("_bucket"):
                    h["b"].append((float(smp.labels["le"]), smp.value))
                elif smp.name.endswith("_sum"):
                    h["sum"] = smp.value
            for lab, h in per.items():
                b = sorted(h["b"])
                s.hists[(fam.name, lab)] = Histogram([x for x, _ in b if x != float("inf")],
                                                     [c for _, c in b], h["sum"])
            continue
        for smp in fam.samples:
            if smp.name.endswith("_created"):
                continue
            s.values[(smp.name, _labels(smp.labels))] = smp.value
    return s


def _otlp_value(attrs: list[dict]) -> Labels:
    return _labels({a["key"]: str(next(iter(a["value"].values()))) for a in attrs or ()})


# Native histograms on one fixed grid of their buckets, 2^-20 (~1 us) .. 2^30 (~1 GB), so
# two readings subtract bucket by bucket; values outside land in the end buckets.
_GRID = range(-20 * cv.NATIVE_PER_DOUBLING, 30 * cv.NATIVE_PER_DOUBLING + 1)
_GRID_BOUNDS = [2.0 ** (k / cv.NATIVE_PER_DOUBLING) for k in _GRID]


def native_histogram(buckets: dict[int, int], zeros: int, total: float) -> Histogram:
    """Native buckets (index -> count) as a :class:`Histogram` on the fixed grid."""
    counts = [0.0] * (len(_GRID) + 1)
    counts[0] += zeros
    lo, hi = _GRID.start, _GRID.stop - 1
    for key, n in buckets.items():
        counts[min(max(key, lo), hi + 1) - lo] += n
    cum, acc = [], 0.0
    for c in counts:
        acc += c
        cum.append(acc)
    return Histogram(_GRID_BOUNDS, cum, total)


def parse_protobuf(body: bytes, t: float) -> Sample:
    """The agent's protobuf exposition -> Sample (histograms from their native buckets)."""
    s = Sample(t)
    for fam in promproto.families(body):
        for m in fam.metric:
            lab = _labels({lp.name: lp.value for lp in m.label})
            if fam.type == promproto.HISTOGRAM:
                h = m.histogram
                s.hists[(fam.name, lab)] = native_histogram(promproto.native_buckets(h), h.zero_count,
                                                            h.sample_sum)
            else:
                field = m.counter if fam.type == promproto.COUNTER else m.gauge
                s.values[(fam.name, lab)] = field.value
    return s


def parse_otlp(msg: dict, t: float) -> Sample:
    """One metrics.jsonl line (ExportMetricsServiceRequest as JSON) -> Sample."""
    s = Sample(t, live=False)
    for rm in msg.get("resourceMetrics", ()):
        for sm in rm.get("scopeMetrics", ()):
            for m in sm.get("metrics", ()):
                name = m.get("name", "")
                if "exponentialHistogram" in m and name in _OTLP_HIST:
                    for dp in m["exponentialHistogram"].get("dataPoints", ()):
                        pos = dp.get("positive", {})
                        first = int(pos.get("offset", 0)) + 1  # OTLP bucket i = native key i + 1
                        buckets = {first + i: int(c) for i, c in enumerate(pos.get("bucketCounts", ())) if int(c)}
                        s.hists[(_OTLP_HIST[name], _otlp_value(dp.get("attributes")))] = native_histogram(
                            buckets, int(dp.get("zeroCount", 0)), float(dp.get("sum", 0)))
                elif "histogram" in m and name in _OTLP_HIST:  # runs recorded before exponential
                    for dp in m["histogram"].get("dataPoints", ()):
                        counts = [float(c) for c in dp.get("bucketCounts", ())]
                        cum, acc = [], 0.0
                        for c in counts:
                            acc += c
                            cum.append(acc)
                        s.hists[(_OTLP_HIST[name], _otlp_value(dp.get("attributes")))] = Histogram(
                            [float(b) for b in dp.get("explicitBounds", ())], cum, float(dp.get("sum", 0)))
                elif "sum" in m:
                    prom = name.replace(".", "_") + "_total"
                    for dp in m["sum"].get("dataPoints", ()):
                        v = dp.get("asDouble", dp.get("asInt", 0))
                        s.values[(prom, _otlp_value(dp.get("attributes")))] = float(v)
    return s


class UrlSource:
    def __init__(self, url: str) -> None:
        self.url = url if "://" in url else f"http://{url}"
        if not self.url.rstrip("/").endswith("/metrics"):
            self.url = self.url.rstrip("/") + "/metrics"
        self.label = self.url

    def read(self) -> Sample:
        req = urllib.request.Request(self.url, headers={"Accept": f"{promproto.CONTENT_TYPE},text/plain;q=0.5"})
        try:
            with urllib.request.urlopen(req, timeout=2.0) as r:
                body, ctype = r.read(), r.headers.get("Content-Type", "")
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            if isinstance(why, ConnectionRefusedError):
                raise SourceError(f"no agent answers at {self.url} (connection refused): start a run "
                                  "with a live endpoint (`omnitrace run --exporter prometheus serve`, "
                                  "`omnitrace loadtest --exporter prometheus`), or give its run "
                                  "directory: omnitrace top RUN_DIR") from None
            raise SourceError(f"cannot read {self.url}: {why}") from None
        if ctype.startswith("application/vnd.google.protobuf"):
            return parse_protobuf(body, time.monotonic())
        return parse_prometheus(body.decode(), time.monotonic())


class RunDirSource:
    def __init__(self, path: str) -> None:
        if not os.path.isfile(names.path(path, names.RUN)):
            raise SourceError(f"{path}: not a run directory (no run.json)")
        self.path = path
        self.label = path

    def finished(self) -> bool:
        """The run has ended (run.json says so): its record is complete."""
        return read_or_empty(self.path, names.RUN).get("status", "running") != "running"

    def read(self) -> Sample:
        run = read_or_empty(self.path, names.RUN)
        agent = read_or_empty(self.path, names.AGENT)
        endpoint = run.get("prometheus_endpoint")
        if run.get("status") == "running" and endpoint:
            try:
                s = UrlSource(endpoint).read()
                s.agent = agent
                return s
            except SourceError:
                pass  # ending, or the endpoint is not reachable from here: the files
        s = self.file_samples(run)[-1]
        s.agent = agent
        return s

    def file_samples(self, run: dict | None = None) -> list[Sample]:
        """The last two metrics.jsonl messages (rates between them), oldest first."""
        out = []
        for msg in last_metrics(self.path, 2):
            t = 0.0
            for rm in msg.get("resourceMetrics", ()):
                for sm in rm.get("scopeMetrics", ()):
                    for m in sm.get("metrics", ()):
                        for kind in ("sum", "histogram", "exponentialHistogram"):
                            for dp in m.get(kind, {}).get("dataPoints", ()):
                                t = max(t, int(dp.get("timeUnixNano", 0)) / 1e9)
            out.append(parse_otlp(msg, t))
        if not out:
            raise SourceError(f"{self.path}: no metrics yet (metrics.jsonl is empty)")
        run = run if run is not None else read_or_empty(self.path, names.RUN)
        if run.get("status") != "running":
            out[-1].note = f"run {run.get('status', 'ended')}"
        return out


def open_source(spec: str) -> UrlSource | RunDirSource:
    if spec.startswith(("http://", "https://")) or (":" in spec and not os.path.exists(spec)):
        return UrlSource(spec)
    if os.path.isdir(spec):
        return RunDirSource(spec)
    raise SourceError(f"{spec}: neither a run directory nor a URL")
