"""The naive alternative, for benchmarks/observer_effect.py only: what instrumenting the
same hook sites with the OpenTelemetry SDK in-process costs.

On PYTHONPATH of an uninstrumented `omnitrace serve`, this replaces the recorder in every
process: each event a hook site records becomes one SDK span (``start_span`` + ``end``)
with the event's fields as attributes, exported by BatchSpanProcessor over OTLP/gRPC to
``NAIVE_OTEL_ENDPOINT`` (the benchmark's receiver). Nothing else changes.
"""
from __future__ import annotations

import os
import threading

_endpoint = os.environ.get("NAIVE_OTEL_ENDPOINT")

if _endpoint:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from omnitrace import record
    from omnitrace.conventions import Ev

    _provider: TracerProvider | None = None
    _lock = threading.Lock()
    _names = {int(e): e.name.lower() for e in Ev}

    def _tracer():
        global _provider
        with _lock:
            if _provider is None or _provider_pid[0] != os.getpid():  # one per process (fork)
                _provider = TracerProvider(resource=Resource.create(
                    {"service.name": "naive-otel", "process.pid": os.getpid()}))
                _provider.add_span_processor(BatchSpanProcessor(
                    OTLPSpanExporter(endpoint=_endpoint, insecure=True)))
                _provider_pid[0] = os.getpid()
            return _provider.get_tracer("naive")

    _provider_pid = [0]

    class _SpanRing:
        def record(self, kind, req, stage, chunk=-1, a=0, b=0, t=0):
            _tracer().start_span(_names.get(kind, str(kind)), attributes={
                "request.id": req, "stage": stage, "chunk": chunk, "a": a, "b": b}).end()

    _ring = _SpanRing()

    def _thread_ring():
        return _ring

    def _emit(kind, req, stage, chunk=-1, a=0, b=0, t=0):
        _ring.record(kind, req, stage, chunk, a, b, t)

    record.thread_ring = _thread_ring
    record.emit = _emit
