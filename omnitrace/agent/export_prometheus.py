"""Metrics: histograms served to Prometheus (127.0.0.1) and written as OTLP.

One custom prometheus_client registry holds every omnitrace metric; the agent observes
into it whether or not the endpoint is enabled, because the run directory's
metrics.jsonl is built from the same data (one source of truth for both). Histograms are
in seconds with ``conventions.LATENCY_BUCKETS_S`` (10 us .. 30 s) and carry
``{trace_id}`` exemplars (OpenMetrics exposition, which Prometheus asks for by default).

The histograms are a custom *collector* (prometheus_client's documented extension
point) over plain bucket arrays: ``Histogram.observe(exemplar=...)`` validates the
exemplar and walks the buckets in Python on every call, which was a third of the
agent's CPU per event; a bisect into a list is a few hundred ns.
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, Iterator

import numpy as np

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from omnitrace import conventions as cv

LABELS = (cv.LABEL_STAGE, cv.LABEL_REPLICA, cv.LABEL_FROM_STAGE, cv.LABEL_TO_STAGE)

# conventions name -> (prometheus name, help, buckets, otlp unit)
HISTOGRAMS: dict[str, tuple[str, str, tuple, str]] = {
    cv.METRIC_FIFO_RESIDENCE: ("omnitrace_fifo_residence_seconds",
                               "Time a chunk task sat in the stage FIFO (enqueue -> dequeue).",
                               cv.LATENCY_BUCKETS_S, "s"),
    cv.METRIC_FIFO_BLOCKED: ("omnitrace_fifo_blocked_seconds",
                             "Part of FIFO residence the sender spent on other requests' tasks.",
                             cv.LATENCY_BUCKETS_S, "s"),
    cv.METRIC_FIFO_DEPTH: ("omnitrace_fifo_depth", "FIFO depth after an enqueue.",
                           tuple(float(x) for x in cv.DEPTH_BUCKETS), "1"),
    cv.METRIC_SNAPSHOT: ("omnitrace_snapshot_duration_seconds", "Request snapshot duration.",
                         cv.LATENCY_BUCKETS_S, "s"),
    cv.METRIC_PUT: ("omnitrace_transfer_put_duration_seconds", "Shared-memory put duration.",
                    cv.LATENCY_BUCKETS_S, "s"),
    cv.METRIC_GET: ("omnitrace_transfer_get_duration_seconds", "Shared-memory get duration.",
                    cv.LATENCY_BUCKETS_S, "s"),
    cv.METRIC_SIZE: ("omnitrace_transfer_size_bytes", "Bytes per chunk transfer.",
                     cv.SIZE_BUCKETS_BYTES, "By"),
    cv.METRIC_TTFT: ("omnitrace_request_ttft_seconds", "Time to first text token.",
                     cv.LATENCY_BUCKETS_S, "s"),
    cv.METRIC_TTFP: ("omnitrace_request_ttfp_seconds", "Time to first audio packet.",
                     cv.LATENCY_BUCKETS_S, "s"),
}
COUNTERS: dict[str, tuple[str, str]] = {
    cv.METRIC_EVENTS: ("omnitrace_events", "Events read from the rings by the agent."),
    cv.METRIC_DROPPED: ("omnitrace_events_dropped", "Events dropped because a ring was full."),
    cv.METRIC_SENDER_BUSY: ("omnitrace_sender_busy_seconds",
                            "Seconds a stage's sender thread spent on chunk tasks (dequeue to put "
                            "end); its rate is the sender's busy share."),
}


class _Child:
    """One label set's buckets: :meth:`observe` for one value, :meth:`observe_many` for a
    feed's worth at once (the agent's MetricsView)."""

    __slots__ = ("bounds", "_bounds_np", "counts", "sum", "exemplars")

    def __init__(self, bounds: list) -> None:
        n = len(bounds)
        self.bounds = bounds
        self._bounds_np = np.asarray(bounds, dtype=np.float64)
        self.counts = [0] * (n + 1)  # last = +Inf
        self.sum = 0.0
        self.exemplars: list[tuple[str, float] | None] = [None] * (n + 1)

    def observe(self, value: float, trace_hex: str | None,
                _bisect=bisect.bisect_left) -> None:
        i = _bisect(self.bounds, value)  # first bucket with value <= le
        self.counts[i] += 1
        self.sum += value
        if trace_hex is not None:
            self.exemplars[i] = (trace_hex, value)

    def observe_many(self, values: np.ndarray, exemplar_of: Callable[[int], str] | None = None,
                     keys: np.ndarray | None = None) -> None:
        """Observe every value at once; each bucket hit keeps the last value's exemplar
        (``exemplar_of(keys[i])``, a trace id computed only for those few values)."""
        if not len(values):
            return
        idx = np.searchsorted(self._bounds_np, values, "left")
        for i, c in enumerate(np.bincount(idx, minlength=len(self.counts)).tolist()):
            if c:
                self.counts[i] += c
        self.sum += float(values.sum())
        if exemplar_of is not None and keys is not None:
            buckets, rev = np.unique(idx[::-1], return_index=True)
            for b, pos in zip(buckets.tolist(), (len(idx) - 1 - rev).tolist()):
                self.exemplars[b] = (exemplar_of(int(keys[pos])), float(values[pos]))


class HistogramSet:
    """All omnitrace histograms as one prometheus_client collector."""

    def __init__(self) -> None:
        self.children: dict[str, dict[tuple, _Child]] = {name: {} for name in HISTOGRAMS}
        self.bounds = {name: list(b) for name, (_, _, b, _) in HISTOGRAMS.items()}

    def child(self, metric: str, labels: tuple) -> _Child:
        fam = self.children[metric]
        ch = fam.get(labels)
        if ch is None:
            ch = fam[labels] = _Child(self.bounds[metric])
        return ch

    def observe(self, metric: str, value: float, labels: tuple, trace_hex: str | None) -> None:
        ch = self.children[metric].get(labels)
        if ch is None:
            ch = self.child(metric, labels)
        ch.observe(value, trace_hex)

    def snapshot(self, metric: str) -> list[tuple[tuple, list[int], float, list]]:
        # list() copies under the GIL: the agent thread may add children meanwhile
        # a child that never saw a value is not a series yet
        return [(labels, list(ch.counts), ch.sum, list(ch.exemplars))
                for labels, ch in list(self.children[metric].items()) if any(ch.counts)]

    def describe(self) -> Iterator[HistogramMetricFamily]:
        for prom, help_, _, _ in HISTOGRAMS.values():
            yield HistogramMetricFamily(prom, help_, labels=LABELS)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        for name, (prom, help_, _, _) in HISTOGRAMS.items():
            fam = HistogramMetricFamily(prom, help_, labels=LABELS)
            les = [floatToGoString(b) for b in self.bounds[name]] + ["+Inf"]
            for labels, counts, total, exemplars in self.snapshot(name):
                buckets, cum = [], 0
                for le, c, ex in zip(les, counts, exemplars):
                    cum += c
                    if ex is None:
                        buckets.append((le, cum))
                    else:
                        buckets.append((le, cum, Exemplar({"trace_id": ex[0]}, ex[1])))
                fam.add_metric(list(labels), buckets, total)
            yield fam


class Metrics:
    """The agent's metric registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.hist = HistogramSet()
        self.registry.register(self.hist)
        self.observe = self.hist.observe
        self.counters = {name: Counter(prom, help_, (cv.LABEL_STAGE, cv.LABEL_REPLICA),
                                       registry=self.registry)
                         for name, (prom, help_) in COUNTERS.items()}
        self.export_spans = Counter("omnitrace_agent_export_spans",
                                    "Spans per exporter and outcome (exported/failed/dropped).",
                                    ("exporter", "outcome"), registry=self.registry)
        self.queue = Gauge("omnitrace_agent_open_requests", "Requests the agent holds state for.",
                           registry=self.registry)
        r = self.registry
        # live views of the requests (agent.views.RequestView, AttributionView)
        self.attribution = Counter(
            "omnitrace_ttfp_attribution_seconds",
            "TTFP of attributed requests, by the stage and category on their critical path "
            "(stage -1 = API server); divide by omnitrace_requests_attributed_total for the mean.",
            (cv.LABEL_STAGE, cv.LABEL_CATEGORY), registry=r)
        self.attributed = Counter("omnitrace_requests_attributed",
                                  "Requests whose TTFP was attributed.", registry=r)
        self.hol = Counter("omnitrace_head_of_line_blocked_seconds",
                           "Time on requests' critical paths spent in a stage's FIFO behind "
                           "other requests' tasks.", (cv.LABEL_STAGE,), registry=r)
        self.started = Counter("omnitrace_requests_started", "Requests that arrived at the API server.",
                               registry=r)
        self.finished = Counter("omnitrace_requests_finished", "Requests that ended, by status.",
                                (cv.LABEL_STATUS,), registry=r)
        self.in_flight = Gauge("omnitrace_requests_in_flight", "Requests arrived and not yet ended.",
                               registry=r)
        self.stage_info = Gauge("omnitrace_stage_info",
                                "1 per stage process: its stage id, replica and name (for joins).",
                                (cv.LABEL_STAGE, cv.LABEL_REPLICA, cv.LABEL_STAGE_NAME), registry=r)
        self.run_info = Gauge("omnitrace_run_info", "1: the run this agent records (its id, for "
                              "dashboards that tell runs apart).", ("run_id",), registry=r)
        self.lag = Gauge("omnitrace_agent_lag_seconds",
                         "How long the oldest event of the live views' latest feed waited for "
                         "them since its hook wrote it (drain cycle, view period, backlog).", registry=r)
        self.skipped = Counter("omnitrace_agent_view_events_skipped",
                               "Events recorded but not seen by the live views (they fell behind "
                               "or failed).", registry=r)
        self.sampled_out = Counter("omnitrace_agent_spans_sampled_out",
                                   "Spans not exported live because tail sampling left them out.",
                                   registry=r)
        self.server = None
        self.port = 0

    def stage_seen(self, stage: int, replica: int, name: str) -> None:
        """A stage process appeared: its info series, and its counters at 0 (a panel's
        rate() then shows 0, not "no data", for a stage that never drops or blocks)."""
        st, rep = str(stage), str(replica)
        self.stage_info.labels(st, rep, name).set(1)
        self.counters[cv.METRIC_DROPPED].labels(st, rep)
        if stage >= 0:
            self.counters[cv.METRIC_SENDER_BUSY].labels(st, rep)
        self.hol.labels(st)

    def count_events(self, ev: np.ndarray, rings: dict[int, dict]) -> None:
        """``omnitrace_events_total`` for a batch of decoded events, per ring's stage."""
        counts = np.bincount(ev["ring"])
        for idx in np.flatnonzero(counts).tolist():
            r = rings.get(idx, {})
            self.count(cv.METRIC_EVENTS, r.get("stage", cv.API_STAGE), r.get("replica", 0),
                       int(counts[idx]))

    def count(self, metric: str, stage: int, replica: int, n: float) -> None:
        if n > 0:
            self.counters[metric].labels(str(stage), str(replica)).inc(n)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the /metrics endpoint; returns the bound port (``port=0`` picks one)."""
        self.server, _ = start_http_server(port, addr=addr, registry=self.registry)
        self.port = self.server.server_address[1]
        return self.port

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # ------------------------------------------------------------------ OTLP form
    def to_otlp(self, resource_attrs: dict, start_ns: int, now_ns: int):
        """The registry as one ``ExportMetricsServiceRequest`` (cumulative temporality)."""
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest)
        from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
        from opentelemetry.proto.metrics.v1 import metrics_pb2 as mpb

        def kv(k: str, v: Any) -> KeyValue:
            if isinstance(v, int):
                return KeyValue(key=k, value=AnyValue(int_value=v))
            return KeyValue(key=k, value=AnyValue(string_value=str(v)))

        req = ExportMetricsServiceRequest()
        rm = req.resource_metrics.add()
        rm.resource.attributes.extend(kv(k, v) for k, v in resource_attrs.items())
        sm = rm.scope_metrics.add()
        sm.scope.name = "omnitrace.agent"
        for name, (_, help_, bounds, unit) in HISTOGRAMS.items():
            snap = self.hist.snapshot(name)
            if not snap:
                continue
            metric = sm.metrics.add(name=name, description=help_, unit=unit)
            metric.histogram.aggregation_temporality = mpb.AGGREGATION_TEMPORALITY_CUMULATIVE
            for labels, counts, total, _ in snap:
                dp = metric.histogram.data_points.add(
                    start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                    count=sum(counts), sum=total)
                dp.attributes.extend(kv(k, v) for k, v in zip(LABELS, labels))
                dp.explicit_bounds.extend(bounds)
                dp.bucket_counts.extend(counts)  # OTLP buckets are per bucket, not cumulative
        for family in self.registry.collect():
            if family.type == "histogram":
                continue
            if family.type == "counter":
                metric = sm.metrics.add(name=family.name.replace("_", "."), description=family.documentation)
                metric.sum.aggregation_temporality = mpb.AGGREGATION_TEMPORALITY_CUMULATIVE
                metric.sum.is_monotonic = True
                for s in family.samples:
                    if s.name.endswith("_total"):
                        value = ({"as_double": float(s.value)} if family.name.endswith("_seconds")
                                 else {"as_int": int(s.value)})
                        dp = metric.sum.data_points.add(start_time_unix_nano=start_ns,
                                                        time_unix_nano=now_ns, **value)
                        dp.attributes.extend(kv(k, v) for k, v in s.labels.items())
        return req
