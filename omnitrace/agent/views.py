"""Live views of the event stream: what the agent derives from each feed of spans.

Every view implements :class:`View` (the agent only wires them): a sink of the agent's
live span builder, the protocol a load of a recorded run feeds (``spanload.Sink``:
``feed`` gets the spans the :class:`~omnitrace.spantable.SpanBuilder` finished, with the
rings and request ids they refer to); ``close`` runs once at the end, ``counters`` goes
into agent.json. The run's record is the event log; a view that falls
behind never slows it down.
"""
from __future__ import annotations

import hashlib
import threading
from collections import deque
from typing import Protocol

import numpy as np

from omnitrace import conventions as cv
from omnitrace import spanload
from omnitrace import spantable as stt
from omnitrace.agent import export_otlp
from omnitrace.agent.export_prometheus import Metrics
from omnitrace.spantable import Feed


class View(spanload.Sink, Protocol):
    def close(self, deadline_s: float) -> None: ...
    def counters(self) -> dict: ...


class TraceIds:
    """Request number -> trace id hex (exemplar labels), computed on demand, bounded."""

    def __init__(self, requests: list[str]) -> None:
        self.requests = requests
        self._hex: dict[int, str] = {}

    def __call__(self, req: int) -> str:
        h = self._hex.get(req)
        if h is None:
            if len(self._hex) > 100_000:
                self._hex.clear()
            h = self._hex[req] = f"{cv.trace_id_for(self.requests[req]):032x}"
        return h


# chunk span name -> [(metric, value column or None for duration, scale, with exemplar)]
_CHUNK_METRICS = {
    stt.N_FIFO: ((cv.METRIC_FIFO_RESIDENCE, None, 1e-9, True),
                 (cv.METRIC_FIFO_BLOCKED, stt.BLOCKED, 1e-9, True),
                 (cv.METRIC_FIFO_DEPTH, "depth", 1.0, False)),
    stt.N_SNAPSHOT: ((cv.METRIC_SNAPSHOT, None, 1e-9, True),),
    stt.N_PROCESS: ((cv.METRIC_PROCESS, None, 1e-9, True),),
    stt.N_PUT: ((cv.METRIC_PUT, None, 1e-9, True), (cv.METRIC_SIZE, stt.BYTES, 1.0, True)),
    stt.N_GET: ((cv.METRIC_GET, None, 1e-9, True),),
}
_WANTED = np.zeros(len(stt.NAMES), bool)  # span name code -> has histograms
_WANTED[list(_CHUNK_METRICS)] = True

# a request latency's event kind -> its histogram
_REQUEST_METRICS = {cv.Ev.REQUEST_FIRST_TEXT: cv.METRIC_TTFT, cv.Ev.REQUEST_FIRST_AUDIO: cv.METRIC_TTFP,
                    cv.Ev.REQUEST_END: cv.METRIC_E2E}


class MetricsView:
    """Histograms of complete chunk spans and of TTFT/TTFP, bulk-observed per feed
    (the same buckets Prometheus scrapes and metrics.jsonl records)."""

    culprits = False
    steps = False

    def __init__(self, metrics: Metrics, requests: list[str]) -> None:
        self.metrics = metrics
        self.trace_hex = TraceIds(requests)

    def feed(self, feed: Feed, part: spanload.Part) -> None:
        spans = feed.spans.chunks
        if len(spans):
            self._observe_spans(spans, np.flatnonzero((spans["reason"] == 0) & _WANTED[spans["name"]]))
        self._sender_busy(feed, part)
        for kind, req, replica, seconds, _t in feed.latencies:
            self.metrics.hist.observe(_REQUEST_METRICS[kind], seconds, (str(cv.API_STAGE), str(replica), "", ""),
                                      self.trace_hex(req))

    def _observe_spans(self, spans: np.ndarray, sel: np.ndarray) -> None:
        """The ``sel`` spans into their histograms: grouped by (name, stage, peer, replica)
        with one sort, each group's columns observed as slices (no row copies)."""
        if not len(sel):
            return
        key = ((spans["name"][sel].astype(np.int64) << 48) | ((spans["stage"][sel].astype(np.int64) + 1) << 32)
               | ((spans["peer"][sel].astype(np.int64) + 1) << 16) | spans["replica"][sel].astype(np.int64))
        order = np.argsort(key, kind="stable")
        key, sel = key[order], sel[order]
        cols = {"dur": (spans["end"][sel] - spans["start"][sel]).astype(np.float64),
                # the figure columns, read below by the names _CHUNK_METRICS gives them
                "figure": spans["figure"][sel].astype(np.float64),
                "blocked": spans["blocked"][sel].astype(np.float64),
                "req": spans["req"][sel]}
        edges = np.flatnonzero(np.diff(key)) + 1
        for lo, hi in zip([0, *edges.tolist()], [*edges.tolist(), len(key)]):
            k = int(key[lo])
            name, stage, peer, replica = (k >> 48, ((k >> 32) & 0xFFFF) - 1,
                                          ((k >> 16) & 0xFFFF) - 1, k & 0xFFFF)
            src, dst = (stage, peer) if name in stt.PRODUCER_NAMES else (peer, stage)
            labels = (str(stage), str(replica), str(src), str(dst))
            reqs = cols["req"][lo:hi]
            for metric, col, scale, exemplar in _CHUNK_METRICS[name]:
                if col is None:
                    values = cols["dur"][lo:hi] * scale
                elif col == "depth":  # the tasks ahead of it, and itself
                    values = cols[stt.AHEAD][lo:hi] + 1.0
                else:
                    values = cols[col][lo:hi] * scale
                self.metrics.hist.child(metric, labels).observe_many(
                    values, self.trace_hex if exemplar else None, reqs if exemplar else None)

    def _sender_busy(self, feed: Feed, part: spanload.Part) -> None:
        """The sender tasks this feed closed, in seconds per (stage, replica)."""
        if not feed.busy:
            return
        replica = spanload.replica_of(part.rings)
        for pid, stage, starts, ends, _reqs in feed.busy:
            self.metrics.count(cv.METRIC_SENDER_BUSY, stage, replica.get(pid, 0),
                               float((ends - starts).sum()) / 1e9)

    def close(self, deadline_s: float) -> None:
        pass

    def counters(self) -> dict:
        return {}


class OtlpView:
    """Live spans to OTLP collectors, with tail-based sampling when they fall behind.

    While every exporter's queue has room, every span goes out as soon as it is built.
    When a queue passes half full, spans are held per request until the request's root
    span is built, and only requests worth a look are sent whole: the slowest by TTFP
    (above the running p90 of the requests seen), any with head-of-line blocking (a FIFO
    wait behind another request's task), and a head sample (1 in ``head_every`` by
    request id). The requests and spans not sent are counted, never silent.
    """

    HOLD_MAX_SPANS = 200_000  # spans held for sampling decisions; past it, oldest go unsent

    culprits = True  # the spans it sends carry omni.fifo.blocked_by
    steps = False

    def __init__(self, exporters: list, converter, head_every: int = 10) -> None:
        self.exporters = exporters
        self.converter = converter
        self.head_every = head_every
        self.resources = export_otlp.ResourceCache(converter.run_id)
        self.held: dict[int, list] = {}
        self.held_spans = 0
        self.hol: set[int] = set()
        self.ttfps: list[float] = []
        self.sampling = False
        self.requests_sampled_out = 0
        self.spans_sampled_out = 0
        self.requests_kept = 0
        self.not_exported_ids: deque[str] = deque(maxlen=1000)  # newest last

    def _room(self) -> bool:
        return all(e.queued < e.max_queue_spans // 2 for e in self.exporters)

    def _send(self, spans: list) -> None:
        if spans:
            readable = [export_otlp.to_readable(s, self.resources) for s in spans]
            for exp in self.exporters:
                exp.submit(readable)

    def feed(self, feed: Feed, part: spanload.Part) -> None:
        if feed.contexts:
            self.converter.add_contexts(feed.contexts)
        spans = feed.spans
        if not len(spans):
            return
        chunks = spans.chunks
        blocked = chunks[(chunks["name"] == stt.N_FIFO) & (chunks[stt.BLOCKED] > 0)]
        self.hol.update(blocked["req"].tolist())
        converted = self.converter.convert(spans)
        done = spans.requests
        if not self.sampling and self._room() and not self.held:
            self._send(converted)
            self.converter.forget(done["req"].tolist())
            return
        self.sampling = not self._room()
        for row, span in zip(spans.span_reqs().tolist(), converted):
            self.held.setdefault(row, []).append(span)
        self.held_spans += len(converted)
        for req, start, audio in zip(done["req"].tolist(), done["start"].tolist(),
                                     done["first_audio"].tolist()):
            self._decide(req, (audio - start) / 1e9 if audio else None)
        while self.held_spans > self.HOLD_MAX_SPANS and self.held:
            self._decide(next(iter(self.held)), None, force_drop=True)

    def _decide(self, req: int, ttfp: float | None, force_drop: bool = False) -> None:
        spans = self.held.pop(req, [])
        self.held_spans -= len(spans)
        keep = not force_drop and (self._room() and not self.sampling)
        if not keep and not force_drop:
            slow = False
            if ttfp is not None:
                self.ttfps.append(ttfp)
                if len(self.ttfps) > 10_000:
                    del self.ttfps[:5_000]
                slow = ttfp >= float(np.percentile(self.ttfps, 90))
            head = int(hashlib.blake2b(self.converter.requests[req].encode(),
                                       digest_size=4).hexdigest(), 16) % self.head_every == 0
            keep = slow or req in self.hol or head
        self.hol.discard(req)
        self.converter.forget((req,))
        if keep:
            self.requests_kept += 1
            self._send(spans)
        else:
            self.requests_sampled_out += 1
            self.spans_sampled_out += len(spans)
            self.not_exported_ids.append(self.converter.requests[req])

    def close(self, deadline_s: float) -> None:
        for req in list(self.held):
            self._decide(req, None)
        threads = [threading.Thread(target=e.close, args=(deadline_s,)) for e in self.exporters]
        for t in threads:
            t.start()
        for t in threads:
            t.join(deadline_s + 5)

    def counters(self) -> dict:
        return {"sampling": self.sampling, "requests_not_exported": self.requests_sampled_out,
                "spans_not_exported": self.spans_sampled_out,
                "requests_kept_while_sampling": self.requests_kept, "spans_held": self.held_spans,
                "last_requests_not_exported": list(self.not_exported_ids)[-20:]}

