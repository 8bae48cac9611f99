"""Spans -> OpenTelemetry SDK ReadableSpans -> the official OTLP exporters (gRPC / HTTP).

The agent builds ``ReadableSpan`` objects with explicit start/end times (the SDK's
tracer cannot backdate spans from another process) and hands batches to
``OTLPSpanExporter`` on a worker thread per exporter, through a bounded queue: when a
backend is down or hangs, the queue fills and further spans are dropped *and counted*
(the SDK's own warnings are rate-limited, so the agent keeps its own numbers). Nothing
here is on the pipeline's hot path; the pipeline never waits on an exporter.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Iterable
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from omnitrace import __version__
from omnitrace.otlp import OtlpSpan, resource_attrs
from omnitrace import console
from omnitrace.outages import Outages

SCOPE = InstrumentationScope("omnitrace.agent", __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_OK = Status(StatusCode.UNSET)
_ERR = Status(StatusCode.ERROR)

# The SDK exporters log a line per failed attempt and retry (16-30 lines per 50 s with a
# collector down): kept off the console; Health below says it once, with the counts.
logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)


class Health:
    """One line when a backend stops taking data and one when it takes it again, with
    what was lost meanwhile: never a line per attempt."""

    def __init__(self, what: str, unit: str) -> None:
        self.what, self.unit = what, unit
        self.down_since: float | None = None
        self.lost_while_down = 0
        self.outages = Outages()  # the same, with times, for agent.json and the report

    def ok(self) -> None:
        self.outages.ok()
        if self.down_since is not None:
            self._say(f"reachable again after {time.monotonic() - self.down_since:.0f} s; "
                      f"{self.lost_while_down} {self.unit} were not delivered meanwhile")
            self.down_since, self.lost_while_down = None, 0

    def failed(self, n: int, error: str) -> None:
        self.outages.failed(n)
        if self.down_since is None:
            self.down_since = time.monotonic()
            self._say(f"unreachable ({error}); {self.unit} are counted as not delivered "
                      "(the run's record keeps every span: `omnitrace export` resends them)")
        self.lost_while_down += n

    def _say(self, msg: str) -> None:
        console.say("agent", f"{self.what}: {msg}")


class ConfigError(ValueError):
    """Bad exporter configuration (reported as a one-line error before anything starts)."""


def normalize_endpoint(kind: str, endpoint: str) -> str:
    """Validate ``endpoint`` for exporter ``kind``; returns the form the exporter takes.

    gRPC: ``host:port`` or ``http(s)://host:port``; HTTP: a base URL (``/v1/traces`` is
    appended when no path is given, as the OTEL_EXPORTER_OTLP_ENDPOINT convention does).
    """
    raw = endpoint.strip()
    url = raw if "://" in raw else f"http://{raw}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"malformed OTLP endpoint {endpoint!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(f"malformed OTLP endpoint {endpoint!r}: want [http[s]://]HOST:PORT")
    if kind == "otlp-http":
        path = parts.path if parts.path not in ("", "/") else "/v1/traces"
        return f"{parts.scheme}://{parts.netloc}{path}"
    return f"{parts.scheme}://{parts.netloc}"


def endpoint_from_env(kind: str) -> str | None:
    """The standard OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, if set (validated by the caller)."""
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT") or None


def make_exporter(kind: str, endpoint: str | None, timeout_s: float | None):
    """The official exporter for ``kind``; endpoint None -> the SDK's env/default."""
    kwargs: dict = {}
    if timeout_s is not None:
        kwargs["timeout"] = timeout_s
    if kind == "otlp-grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        if endpoint is not None:
            kwargs["endpoint"] = endpoint
            kwargs["insecure"] = endpoint.startswith("http://")
        return OTLPSpanExporter(**kwargs)
    if kind == "otlp-http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as H
        if endpoint is not None:
            kwargs["endpoint"] = endpoint
        return H(**kwargs)
    raise ConfigError(f"unknown OTLP exporter {kind!r}")


class ResourceCache:
    """One SDK Resource per recording process."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._cache: dict[tuple, Resource] = {}

    def attrs(self, proc: tuple) -> dict:
        return resource_attrs(self.run_id, proc)

    def get(self, proc: tuple) -> Resource:
        res = self._cache.get(proc)
        if res is None:
            res = self._cache[proc] = Resource(self.attrs(proc))
        return res


def to_readable(span: OtlpSpan, resources: ResourceCache) -> ReadableSpan:
    ctx = SpanContext(span.trace_id, span.span_id, False, _SAMPLED)
    parent = (SpanContext(span.trace_id, span.parent_id, False, _SAMPLED)
              if span.parent_id else None)
    events = [Event(name, attrs, ts) for name, ts, attrs in span.events]
    return ReadableSpan(name=span.name, context=ctx, parent=parent,
                        resource=resources.get(span.proc), attributes=span.attrs,
                        events=events, kind=SpanKind.INTERNAL, instrumentation_scope=SCOPE,
                        status=_ERR if span.error else _OK, start_time=span.start,
                        end_time=span.end)


class QueuedExporter:
    """A worker thread draining a bounded queue of span batches into one exporter."""

    def __init__(self, kind: str, exporter, max_queue_spans: int = 65536,
                 max_batch: int = 512, endpoint: str = "") -> None:
        self.kind, self.exporter = kind, exporter
        self.health = Health(f"{kind} span export{' to ' + endpoint if endpoint else ''}", "spans")
        self.max_queue_spans, self.max_batch = max_queue_spans, max_batch
        self.queue: deque[list[ReadableSpan]] = deque()
        self.queued = 0
        self.exported = self.failed = self.dropped = 0
        self.in_flight = 0
        self._written_off = False  # close() counted the in-flight batch as dropped
        self.last_error = ""
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"omnitrace-{kind}", daemon=True)
        self._thread.start()

    def submit(self, spans: list[ReadableSpan]) -> None:
        with self._cond:
            for i in range(0, len(spans), self.max_batch):
                batch = spans[i:i + self.max_batch]
                if self.queued + len(batch) > self.max_queue_spans:
                    self.dropped += len(batch)  # backend too slow or down: count, never block
                    continue
                self.queue.append(batch)
                self.queued += len(batch)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self.queue and not self._stop:
                    self._cond.wait()
                if not self.queue:
                    return
                batch = self.queue.popleft()
                self.queued -= len(batch)
                self.in_flight = len(batch)
            try:
                ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
                if not ok:
                    self.last_error = "export returned FAILURE"
            except Exception as exc:  # an exporter bug must not kill the agent
                ok = False
                self.last_error = f"{type(exc).__name__}: {exc}"[:200]
            with self._cond:
                self.in_flight = 0
                if self._written_off:  # already counted as dropped by close(): once only
                    self._written_off = False
                elif ok:
                    self.exported += len(batch)
                else:
                    self.failed += len(batch)
                self._cond.notify_all()
            if ok:
                self.health.ok()
            else:
                self.health.failed(len(batch), self.last_error)

    def close(self, deadline_s: float) -> None:
        """Export what is queued until the deadline; whatever is left counts as dropped."""
        end = time.monotonic() + deadline_s
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            while (self.queue or self.in_flight) and time.monotonic() < end:
                self._cond.wait(max(0.0, min(0.2, end - time.monotonic())))
            self.dropped += self.queued + self.in_flight
            self.queue.clear()
            self.queued = 0
            stuck = self.in_flight > 0
            self._written_off = stuck
            self.in_flight = 0
        if not stuck:
            try:
                self.exporter.shutdown()
            except Exception:
                pass

    def counters(self) -> dict:
        return {"exported": self.exported, "failed": self.failed, "dropped": self.dropped,
                "queued": self.queued, "last_error": self.last_error,
                "outages": self.health.outages.to_list()}


def build(kinds: Iterable[str], endpoints: dict[str, str | None], timeout_s: float | None,
          max_queue_spans: int = 65536) -> list[QueuedExporter]:
    return [QueuedExporter(k, make_exporter(k, endpoints.get(k), timeout_s), max_queue_spans,
                           endpoint=endpoints.get(k) or "")
            for k in kinds]


class MetricsPusher:
    """Sends the agent's metrics (an ``ExportMetricsServiceRequest``, the same message
    metrics.jsonl holds) to an OTLP collector: gRPC through the official MetricsService
    stub, HTTP as protobuf POSTed to ``/v1/metrics``. The SDK's OTLPMetricExporter takes
    SDK-side metric objects, not a message, hence the stub. One push at a time on a
    worker thread; a push due while the last one still runs is skipped and counted."""

    def __init__(self, kind: str, endpoint: str | None, timeout_s: float | None) -> None:
        self.kind = kind
        self.timeout = timeout_s if timeout_s is not None else 10.0
        self.sent = self.failed = self.skipped = 0
        self.last_error = ""
        self._busy = threading.Lock()
        env = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT")
        if kind == "otlp-grpc":
            url = endpoint or (normalize_endpoint(kind, env) if env else "http://localhost:4317")
            parts = urlsplit(url)
            import grpc
            from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as msvc
            target = f"{parts.hostname}:{parts.port}"
            self._channel = (grpc.secure_channel(target, grpc.ssl_channel_credentials())
                             if parts.scheme == "https" else grpc.insecure_channel(target))
            self._stub = msvc.MetricsServiceStub(self._channel)
            self.url = target
        else:
            base = endpoint or (normalize_endpoint(kind, env) if env else "http://localhost:4318/v1/traces")
            self.url = base[:-len("/v1/traces")] + "/v1/metrics" if base.endswith("/v1/traces") \
                else base.rstrip("/") + "/v1/metrics"
        self.health = Health(f"{kind} metrics push to {self.url}", "pushes")

    def push(self, request) -> None:
        if not self._busy.acquire(blocking=False):
            self.skipped += 1
            return
        threading.Thread(target=self._send, args=(request,), daemon=True,
                         name=f"omnitrace-{self.kind}-metrics").start()

    def _send(self, request) -> None:
        try:
            if self.kind == "otlp-grpc":
                self._stub.Export(request, timeout=self.timeout)
            else:
                import urllib.request
                req = urllib.request.Request(self.url, data=request.SerializeToString(), method="POST",
                                             headers={"Content-Type": "application/x-protobuf"})
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    r.read()
            self.sent += 1
            self.health.ok()
        except Exception as exc:  # a collector that is down must not kill the agent
            self.failed += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:200]
            self.health.failed(1, self.last_error)
        finally:
            self._busy.release()

    def close(self, deadline_s: float) -> None:
        if self._busy.acquire(timeout=deadline_s):
            self._busy.release()
        if self.kind == "otlp-grpc":
            self._channel.close()

    def counters(self) -> dict:
        return {"sent": self.sent, "failed": self.failed, "skipped": self.skipped,
                "last_error": self.last_error}
