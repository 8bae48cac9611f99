"""Real OTLP trace receivers for tests, on the official opentelemetry-proto stubs:
gRPC (TraceServiceServicer) and HTTP/protobuf (aiohttp, POST /v1/traces). 127.0.0.1 only.
Also a "hanging" endpoint: a socket that accepts connections and never answers."""
from __future__ import annotations

import asyncio
import gzip
import socket
import threading
from concurrent import futures

import grpc
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as msvc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as msvc_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tsvc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tsvc_grpc


class Store:
    def __init__(self) -> None:
        self.requests: list = []
        self.metrics: list = []  # ExportMetricsServiceRequest messages
        self.cond = threading.Condition()

    def add(self, req) -> None:
        with self.cond:
            if isinstance(req, msvc.ExportMetricsServiceRequest):
                self.metrics.append(req)
            else:
                self.requests.append(req)
            self.cond.notify_all()

    def metric_names(self) -> set[str]:
        with self.cond:
            return {m.name for r in self.metrics for rm in r.resource_metrics
                    for sm in rm.scope_metrics for m in sm.metrics}

    def spans(self) -> list:
        """[(resource attrs dict, span proto)]"""
        with self.cond:
            out = []
            for r in self.requests:
                for rs in r.resource_spans:
                    res = {kv.key: kv.value for kv in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        out.extend((res, s) for s in ss.spans)
            return out

    def spans_from(self, k: int) -> tuple[list, int]:
        """The spans of the export requests from the ``k``-th on, and where the next
        call starts: a poller that reads only what is new (a scan of everything under the
        lock, each poll, slowed the receiver behind a long load until the exporter dropped)."""
        with self.cond:
            new, k = self.requests[k:], len(self.requests)
        return [s for r in new for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans], k

    def wait(self, pred, timeout: float = 20.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: pred(self), timeout)


class _Trace(tsvc_grpc.TraceServiceServicer):
    def __init__(self, store: Store) -> None:
        self.store = store

    def Export(self, request, context):  # noqa: N802 (the stub's name)
        self.store.add(request)
        return tsvc.ExportTraceServiceResponse()


class _Metrics(msvc_grpc.MetricsServiceServicer):
    def __init__(self, store: Store) -> None:
        self.store = store

    def Export(self, request, context):  # noqa: N802 (the stub's name)
        self.store.add(request)
        return msvc.ExportMetricsServiceResponse()


def start_grpc(store: Store) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    tsvc_grpc.add_TraceServiceServicer_to_server(_Trace(store), server)
    msvc_grpc.add_MetricsServiceServicer_to_server(_Metrics(store), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


class HttpReceiver:
    """aiohttp app accepting protobuf POST /v1/traces, on its own loop thread."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        started.wait(10)

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.store.add(tsvc.ExportTraceServiceRequest.FromString(body))
        return web.Response(body=tsvc.ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.store.add(msvc.ExportMetricsServiceRequest.FromString(body))
        return web.Response(body=msvc.ExportMetricsServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        app.router.add_post("/v1/metrics", self._metrics)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        started.set()
        self.loop.run_forever()

    def stop(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop)
        fut.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class HangingEndpoint:
    """Accepts TCP connections and never answers (a hung backend)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._stop = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
            except OSError:
                continue

    def stop(self) -> None:
        self._stop = True
        self.thread.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
