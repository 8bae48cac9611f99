"""Metrics: prometheus_client histograms (served on 127.0.0.1) and their OTLP form.

One custom registry holds every omnitrace metric; the agent observes into it whether or
not the Prometheus endpoint is enabled, because the run directory's metrics.jsonl is
built from the same registry (one source of truth for both). Histograms are in seconds
with ``conventions.LATENCY_BUCKETS_S`` (10 us .. 30 s) and carry ``{trace_id}``
exemplars; prometheus_client emits exemplars only in OpenMetrics format, which
Prometheus asks for by default.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from omnitrace import conventions as cv

LABELS = (cv.LABEL_STAGE, cv.LABEL_REPLICA, cv.LABEL_STAGE_PAIR)

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
}


class Metrics:
    """The agent's metric registry; ``observe`` is the assembler's MetricSink."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.hist = {name: Histogram(prom, help_, LABELS, buckets=buckets, registry=self.registry)
                     for name, (prom, help_, buckets, _) in HISTOGRAMS.items()}
        self.counters = {name: Counter(prom, help_, (cv.LABEL_STAGE, cv.LABEL_REPLICA),
                                       registry=self.registry)
                         for name, (prom, help_) in COUNTERS.items()}
        self.export_spans = Counter("omnitrace_agent_export_spans",
                                    "Spans per exporter and outcome (exported/failed/dropped).",
                                    ("exporter", "outcome"), registry=self.registry)
        self.queue = Gauge("omnitrace_agent_open_requests", "Requests the agent holds state for.",
                           registry=self.registry)
        self._children: dict[tuple, Any] = {}
        self.server = None
        self.port = 0

    def observe(self, metric: str, value: float, labels: tuple[str, str, str],
                trace_hex: str | None) -> None:
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:  # pre-bind: labels() is the slow part of prometheus_client
            child = self._children[key] = self.hist[metric].labels(*labels)
        if trace_hex is None:
            child.observe(value)
        else:
            child.observe(value, exemplar={"trace_id": trace_hex})

    def count(self, metric: str, stage: int, replica: int, n: int) -> None:
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
        prom_to_cv = {prom: (name, unit) for name, (prom, _, _, unit) in HISTOGRAMS.items()}
        for family in self.registry.collect():
            if family.type == "histogram" and family.name in prom_to_cv:
                name, unit = prom_to_cv[family.name]
                metric = sm.metrics.add(name=name, description=family.documentation, unit=unit)
                metric.histogram.aggregation_temporality = mpb.AGGREGATION_TEMPORALITY_CUMULATIVE
                points: dict[tuple, dict] = {}
                for s in family.samples:
                    labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                    p = points.setdefault(labels, {"buckets": [], "count": 0, "sum": 0.0})
                    if s.name.endswith("_bucket"):
                        p["buckets"].append((float(s.labels["le"]), s.value))
                    elif s.name.endswith("_count"):
                        p["count"] = int(s.value)
                    elif s.name.endswith("_sum"):
                        p["sum"] = s.value
                for labels, p in points.items():
                    dp = metric.histogram.data_points.add(
                        start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                        count=p["count"], sum=p["sum"])
                    dp.attributes.extend(kv(k, v) for k, v in labels)
                    cum = sorted(p["buckets"])
                    dp.explicit_bounds.extend(b for b, _ in cum if b != float("inf"))
                    prev = 0.0
                    for _, c in cum:  # prometheus buckets are cumulative, OTLP's are not
                        dp.bucket_counts.append(int(c - prev))
                        prev = c
            elif family.type == "counter":
                metric = sm.metrics.add(name=family.name.replace("_", "."), description=family.documentation)
                metric.sum.aggregation_temporality = mpb.AGGREGATION_TEMPORALITY_CUMULATIVE
                metric.sum.is_monotonic = True
                for s in family.samples:
                    if s.name.endswith("_total"):
                        dp = metric.sum.data_points.add(start_time_unix_nano=start_ns,
                                                        time_unix_nano=now_ns, as_int=int(s.value))
                        dp.attributes.extend(kv(k, v) for k, v in s.labels.items())
        return req
