"""Metrics: histograms served to Prometheus (127.0.0.1) and written as OTLP (exponential
histograms: the native buckets below).

One custom prometheus_client registry holds every omnitrace metric; the agent observes
into it whether or not the endpoint is enabled, because the run directory's
metrics.jsonl is built from the same data (one source of truth for both). Histograms are
in seconds with ``conventions.LATENCY_BUCKETS_S`` (10 us .. 30 s) and carry
``{trace_id}`` exemplars (OpenMetrics exposition, which Prometheus asks for by default).

The histograms are a custom *collector* (prometheus_client's documented extension
point) over plain bucket arrays: ``Histogram.observe(exemplar=...)`` validates the
exemplar and walks the buckets in Python on every call, which was a third of the
agent's CPU per event; a bisect into a list is a few hundred ns.

Every histogram is also a *native* histogram (``conventions.NATIVE_SCHEMA``: 16 buckets
per doubling, each 4.4% wide, kept sparse), served in Prometheus's protobuf format to a
scraper that asks for it (``agent.promproto``): quantiles from it are within a bucket's
width of the exact ones, where the classic buckets above are 2-2.5x apart. Scrapers of
the text formats get the classic buckets.
"""
from __future__ import annotations

import bisect
import http.server
import math
import socket
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from omnitrace import conventions as cv
from omnitrace.agent import promproto

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
    cv.METRIC_PROCESS: ("omnitrace_payload_build_duration_seconds",
                        "Building a chunk's payload on the sender thread, before its put.",
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
    cv.METRIC_E2E: ("omnitrace_request_e2e_seconds", "Arrival to the request's end at the API server.",
                    cv.LATENCY_BUCKETS_S, "s"),
}
COUNTERS: dict[str, tuple[str, str]] = {
    cv.METRIC_EVENTS: ("omnitrace_events", "Events read from the rings by the agent."),
    cv.METRIC_DROPPED: ("omnitrace_events_dropped", "Events dropped because a ring was full."),
    cv.METRIC_SENDER_BUSY: ("omnitrace_sender_busy_seconds",
                            "Seconds a stage's sender thread spent on chunk tasks (dequeue to put "
                            "end); its rate is the sender's busy share."),
}


def native_key(value: float) -> int:
    """The native bucket of a positive value: bucket ``k`` holds (2^((k-1)/16), 2^(k/16)].
    (A value on a boundary may land one bucket up from rounding in log2; both paths, this
    and the vectorised one in :func:`_native_counts`, round alike.)"""
    return math.ceil(math.log2(value) * cv.NATIVE_PER_DOUBLING)


def _native_counts(positive: np.ndarray) -> tuple[list[int], list[int]]:
    """(native bucket keys, counts) of positive values (:func:`native_key`, vectorised):
    a bincount over the few hundred keys between the least and the greatest, no sort."""
    if not len(positive):
        return [], []
    keys = np.ceil(np.log2(positive) * cv.NATIVE_PER_DOUBLING).astype(np.int64)
    low = int(keys.min())
    counts = np.bincount(keys - low)
    found = np.flatnonzero(counts)
    return (found + low).tolist(), counts[found].tolist()


class Series(NamedTuple):
    """One label set's histogram, copied for an exposition."""
    labels: tuple
    counts: list[int]  # per classic bucket, the last = +Inf
    sum: float
    exemplars: list  # per classic bucket: (trace id, value, unix seconds) or None
    native: dict[int, int]  # native bucket -> count (values above the zero threshold)
    zeros: int  # values at or below cv.NATIVE_ZERO_THRESHOLD


class _Child:
    """One label set's buckets, classic and native: :meth:`observe` for one value,
    :meth:`observe_many` for a feed's worth at once (the agent's MetricsView). A lock keeps
    a scrape's copy whole: Prometheus rejects a native histogram whose count differs from
    its buckets' sum, which a copy between two updates would give."""

    __slots__ = ("bounds", "_bounds_np", "counts", "sum", "exemplars", "native", "zeros", "lock")

    def __init__(self, bounds: list) -> None:
        n = len(bounds)
        self.bounds = bounds
        self._bounds_np = np.asarray(bounds, dtype=np.float64)
        self.counts = [0] * (n + 1)  # last = +Inf
        self.sum = 0.0
        self.exemplars: list[tuple[str, float, float] | None] = [None] * (n + 1)
        self.native: dict[int, int] = {}
        self.zeros = 0
        self.lock = threading.Lock()

    def observe(self, value: float, trace_hex: str | None,
                _bisect=bisect.bisect_left) -> None:
        i = _bisect(self.bounds, value)  # first bucket with value <= le
        k = native_key(value) if value > cv.NATIVE_ZERO_THRESHOLD else None
        with self.lock:
            self.counts[i] += 1
            self.sum += value
            if k is None:
                self.zeros += 1
            else:
                self.native[k] = self.native.get(k, 0) + 1
            if trace_hex is not None:
                self.exemplars[i] = (trace_hex, value, time.time())

    def copy(self, labels: tuple) -> Series:
        with self.lock:
            return Series(labels, list(self.counts), self.sum, list(self.exemplars), dict(self.native), self.zeros)

    def observe_many(self, values: np.ndarray, exemplar_of: Callable[[int], str] | None = None,
                     keys: np.ndarray | None = None) -> None:
        """Observe every value at once; each bucket hit keeps the last value's exemplar
        (``exemplar_of(keys[i])``, a trace id computed only for those few values)."""
        if not len(values):
            return
        idx = np.searchsorted(self._bounds_np, values, "left")
        classic = np.bincount(idx, minlength=len(self.counts)).tolist()
        positive = values[values > cv.NATIVE_ZERO_THRESHOLD]
        found, hits = _native_counts(positive)
        exemplars = []
        if exemplar_of is not None and keys is not None:
            now = time.time()
            last = np.full(len(self.counts), -1, np.int64)  # each bucket's last value's position
            np.maximum.at(last, idx, np.arange(len(idx)))
            exemplars = [(b, (exemplar_of(int(keys[pos])), float(values[pos]), now))
                         for b, pos in enumerate(last.tolist()) if pos >= 0]
        with self.lock:
            for i, c in enumerate(classic):
                if c:
                    self.counts[i] += c
            self.sum += float(values.sum())
            self.zeros += len(values) - len(positive)
            native = self.native
            for k, c in zip(found, hits):
                native[k] = native.get(k, 0) + c
            for b, ex in exemplars:
                self.exemplars[b] = ex


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

    def snapshot(self, metric: str) -> list[Series]:
        # list() copies under the GIL: the agent thread may add children meanwhile
        return [ch.copy(labels) for labels, ch in list(self.children[metric].items())]

    def describe(self) -> Iterator[HistogramMetricFamily]:
        for prom, help_, _, _ in HISTOGRAMS.values():
            yield HistogramMetricFamily(prom, help_, labels=LABELS)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        for name, (prom, help_, _, _) in HISTOGRAMS.items():
            fam = HistogramMetricFamily(prom, help_, labels=LABELS)
            les = [floatToGoString(b) for b in self.bounds[name]] + ["+Inf"]
            for s in self.snapshot(name):
                buckets, cum = [], 0
                for le, c, ex in zip(les, s.counts, s.exemplars):
                    cum += c
                    if ex is None:
                        buckets.append((le, cum))
                    else:
                        buckets.append((le, cum, Exemplar({"trace_id": ex[0]}, ex[1], ex[2])))
                fam.add_metric(list(s.labels), buckets, s.sum)
            yield fam

    def protobuf_families(self) -> Iterator:
        """Each histogram as a protobuf MetricFamily: classic buckets (cumulative; +Inf left
        implicit, as client_golang does) and the native ones; every bucket's latest exemplar,
        with its timestamp, in ``exemplars`` (what Prometheus 3 reads for native histograms)."""
        for name, (prom, help_, bounds, _) in HISTOGRAMS.items():
            fam = promproto.MetricFamily(name=prom, help=help_, type=promproto.HISTOGRAM)
            for s in self.snapshot(name):
                m = fam.metric.add()
                for k, v in zip(LABELS, s.labels):
                    if v:  # an empty label is no label (as in the text format)
                        m.label.add(name=k, value=v)
                h = m.histogram
                h.sample_count, h.sample_sum = sum(s.counts), s.sum
                # the buckets carry only the newest exemplar (of a feed's, the slowest):
                # Prometheus 2.x takes a native histogram's first bucket exemplar per scrape,
                # which would pin it to the fastest requests
                newest = max((ex for ex in s.exemplars if ex is not None), key=lambda ex: (ex[2], ex[1]),
                             default=None)
                cum = 0
                for le, c, ex in zip(bounds, s.counts, s.exemplars):
                    cum += c
                    b = h.bucket.add(cumulative_count=cum, upper_bound=le)
                    if ex is not None and ex is newest:
                        b.exemplar.CopyFrom(promproto.exemplar(*ex))
                h.schema, h.zero_threshold, h.zero_count = cv.NATIVE_SCHEMA, cv.NATIVE_ZERO_THRESHOLD, s.zeros
                spans, deltas = promproto.spans_and_deltas(s.native)
                for offset, length in spans:
                    h.positive_span.add(offset=offset, length=length)
                h.positive_delta.extend(deltas)
                h.exemplars.extend(promproto.exemplar(*ex) for ex in s.exemplars if ex is not None)
            if fam.metric:
                yield fam


def _server(addr: str, port: int, exposition: Callable[[str], tuple[bytes, str]]):
    """A threading HTTP server answering every GET with ``exposition(Accept)``.
    prometheus_client's own server negotiates only its text formats."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body, content_type = exposition(self.headers.get("Accept", ""))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # scrapes are not news
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
    return Server((addr, port), Handler)


class Metrics:
    """The agent's metric registry."""

    def __init__(self) -> None:
        # every family but the histograms in ``plain``; ``registry`` serves both
        self.plain = r = CollectorRegistry(auto_describe=True)
        self.hist = HistogramSet()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self.hist)
        self.registry.register(self.plain)
        self.observe = self.hist.observe
        self.counters = {name: Counter(prom, help_, (cv.LABEL_STAGE, cv.LABEL_REPLICA), registry=r)
                         for name, (prom, help_) in COUNTERS.items()}
        self.export_spans = Counter("omnitrace_agent_export_spans",
                                    "Spans per exporter and outcome (exported/failed/dropped).",
                                    ("exporter", "outcome"), registry=r)
        self.queue = Gauge("omnitrace_agent_open_requests", "Requests the agent holds state for.",
                           registry=r)
        # live views of the requests (agent.views.RequestView, AttributionView)
        self.attribution = Counter(
            "omnitrace_ttfp_attribution_seconds",
            "TTFP of attributed requests, by the stage and category on their critical path "
            "(stage -1 = API server); divide by omnitrace_requests_attributed_total for the mean.",
            (cv.LABEL_STAGE, cv.LABEL_CATEGORY), registry=r)
        self.attributed = Counter("omnitrace_requests_attributed",
                                  "Requests whose TTFP was attributed.", registry=r)
        self.culprits = Gauge("omnitrace_head_of_line_culprit_seconds",
                              "The requests others' first packets waited behind most (the live top "
                              "10, by the report's head-of-line rule): seconds of their waits.",
                              ("culprit",), registry=r)
        self._leaders: set[str] = set()
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

    def api_seen(self, replica: int) -> None:
        """An API server process appeared: its request histograms from 0, so rate() over
        a window counts the first requests too (a series born with them leaves out what
        its first scrape already held: the first, often slowest, requests)."""
        for metric in (cv.METRIC_TTFT, cv.METRIC_TTFP, cv.METRIC_E2E):
            self.hist.child(metric, (str(cv.API_STAGE), str(replica), "", ""))

    def set_culprits(self, top: list[dict]) -> None:
        """The head-of-line leaderboard as a bounded gauge: only the current leaders are
        series (request ids as labels, so never more than the top's length)."""
        leaders = {row["culprit"]: row["blocked_s"] for row in top}
        for gone in self._leaders - leaders.keys():  # removed, not cleared: a scrape never sees none
            self.culprits.remove(gone)
        for who, seconds in leaders.items():
            self.culprits.labels(who).set(seconds)
        self._leaders = set(leaders)

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
        self.server = _server(addr, port, self.exposition)
        threading.Thread(target=self.server.serve_forever, name="omnitrace-metrics", daemon=True).start()
        self.port = self.server.server_address[1]
        return self.port

    def exposition(self, accept: str) -> tuple[bytes, str]:
        """The body and content type for a scraper's Accept header: protobuf (native
        histograms) when offered, else the text format it prefers (prometheus_client's)."""
        if promproto.wants_protobuf(accept):
            fams = list(self.hist.protobuf_families())
            fams += [promproto.from_client(f) for f in self.plain.collect() if f.samples]
            return promproto.delimited(fams), promproto.CONTENT_TYPE
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

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
        for name, (_, help_, _, unit) in HISTOGRAMS.items():
            snap = self.hist.snapshot(name)
            if not snap:
                continue
            # exponential: the native buckets (scale = schema; OTLP's bucket i is
            # (base^i, base^(i+1)], the native k is (base^(k-1), base^k]: i = k - 1)
            metric = sm.metrics.add(name=name, description=help_, unit=unit)
            metric.exponential_histogram.aggregation_temporality = mpb.AGGREGATION_TEMPORALITY_CUMULATIVE
            for s in snap:
                dp = metric.exponential_histogram.data_points.add(
                    start_time_unix_nano=start_ns, time_unix_nano=now_ns, count=sum(s.counts), sum=s.sum,
                    scale=cv.NATIVE_SCHEMA, zero_count=s.zeros, zero_threshold=cv.NATIVE_ZERO_THRESHOLD)
                dp.attributes.extend(kv(k, v) for k, v in zip(LABELS, s.labels) if v)
                if s.native:
                    lo, hi = min(s.native), max(s.native)
                    dp.positive.offset = lo - 1
                    dp.positive.bucket_counts.extend(s.native.get(k, 0) for k in range(lo, hi + 1))
        for family in self.plain.collect():
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
