"""The report's chunk rows a batch of requests at a time (:func:`chunk_rows`: what the
batch walk reads), and the span objects the reference walk reads where the batch walk's
keys do not hold a run's numbers (and the tests that compare the two): a batch's request,
stage and queue spans (``rules.spanobjects.spans_from_tables``) with their chunk spans,
millions in an hour's run, made only where the walk asks for them (:func:`with_chunks`,
:class:`_BatchChunks`).
The tables themselves are ``rundir``'s (``Run.request_spans``, ``Run.early``,
``Run.chunk_requests``).
"""
from __future__ import annotations

import bisect
from typing import Any, Iterator

import numpy as np

from omnitrace import intervals, rowops
from omnitrace import spantable as stt
from omnitrace.analyze.run import Run
from omnitrace.analyze.tables import EARLY_DTYPE, as_chunk_rows
from omnitrace.rules.span import Span
from omnitrace.rules import attribution as at
from omnitrace.rules.spanobjects import chunk_span, chunk_spans, spans_from_tables

# the walk's three indexes of a request's chunk spans (``attribution.RequestSpans``)
_PRODUCER, _CONSUMER, _SCHEDULED = range(3)
_PRODUCER_CODES = np.array(stt.PRODUCER_NAMES)
_CONSUMER_CODES = np.array(stt.CONSUMER_NAMES)


def _key_code(a: int, b: int, chunk: int) -> int:
    """(stage, stage, chunk) -> one int < 2^64: an index key (:func:`_key_codes` alike)."""
    return ((a + 32768) << 48) | ((b + 32768) << 32) | (chunk + (1 << 31))


def _key_codes(a: np.ndarray, b: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """:func:`_key_code` of int16/int16/int32 columns (uint64: no sign bit to wrap into)."""
    u = np.uint64
    return (((a.astype(np.int64) + 32768).astype(u) << u(48)) | ((b.astype(np.int64) + 32768).astype(u) << u(32))
            | (chunk.astype(np.int64) + (1 << 31)).astype(u))


class _BatchChunks:
    """The chunk span rows of a batch of requests (each request's rows contiguous, in table
    order), indexed by the keys ``attribution.index_requests`` uses: per (request, index)
    its keys sorted, a key's rows in table order. One lexsort per batch, not a Python step
    per row: the walk reads a few hops of a request's ~100 chunk spans before its first
    packet, and an hour's run has millions of them; Span objects are made only for the keys
    the walk asks for (:class:`_LazyChunks`)."""

    __slots__ = ("rows", "requests", "keys", "bounds")

    def __init__(self, rows: np.ndarray, counts: np.ndarray, requests: list[str]) -> None:
        self.requests = requests
        owner = np.repeat(np.arange(len(counts)), counts)
        name, stage, peer, chunk = rows["name"], rows["stage"], rows["peer"], rows["chunk"]
        # incomplete wait_schedule spans are left out, as index_requests leaves them
        ready = (name == stt.N_WAIT) & (rows["reason"] == 0)
        cons = np.isin(name, _CONSUMER_CODES) & ((name != stt.N_WAIT) | ready)
        parts = [(np.flatnonzero(sel), key) for sel, key in (
            (np.isin(name, _PRODUCER_CODES), _key_codes(stage, peer, chunk)),
            (cons, _key_codes(peer, stage, chunk)),
            (ready, stage.astype(np.uint64)))]
        rowno = np.concatenate([at for at, _ in parts])
        key = np.concatenate([k[at] for at, k in parts])
        group = owner[rowno] * 3 + np.repeat(np.arange(3), [len(at) for at, _ in parts])
        order = np.lexsort((key, group))  # stable: a key's rows stay in table order
        # the rows in index order (a ready wait_schedule row twice: consumer and scheduled
        # index): a key's rows are a slice, no gather per lookup
        self.keys, self.rows = key[order].tolist(), as_chunk_rows(rowops.take(rows, rowno[order]))
        self.bounds = np.searchsorted(group[order], np.arange(3 * len(counts) + 1)).tolist()

    def spans(self, request: int, which: int, code: int) -> list[Span]:
        """Span objects of the rows of ``request`` (its place in the batch) under key
        ``code`` of index ``which``, in table order."""
        lo, hi = self.bounds[3 * request + which], self.bounds[3 * request + which + 1]
        a = bisect.bisect_left(self.keys, code, lo, hi)
        b = bisect.bisect_right(self.keys, code, a, hi)
        if a == b:
            return []
        requests = self.requests
        return [chunk_span(row, requests) for row in self.rows[a:b].tolist()]


class _LazyChunks:
    """``attribution.RequestSpans.producer`` / ``consumer`` / ``scheduled`` (``which``) of
    one request of a :class:`_BatchChunks`: ``get`` makes the Span objects of one key."""

    __slots__ = ("batch", "request", "which", "cache")

    def __init__(self, batch: _BatchChunks, request: int, which: int) -> None:
        self.batch, self.request, self.which = batch, request, which
        self.cache: dict = {}

    def get(self, key: Any, default: Any = None) -> Any:
        hit = self.cache.get(key)
        if hit is None:
            code = key if self.which == _SCHEDULED else _key_code(*key)
            spans = self.batch.spans(self.request, self.which, code)
            if self.which == _SCHEDULED:
                hit = spans
            else:
                hit = {}
                for sp in spans:
                    hit.setdefault(sp.name, []).append(sp)
            self.cache[key] = hit
        return hit if hit else default


def chunk_rows(run: Run, rids: list[str], batch: int
               ) -> Iterator[tuple[list[str], np.ndarray, np.ndarray, np.ndarray]]:
    """``rids`` in batches of ``batch``: (the batch, its request numbers (-1: none), its
    requests' rows of ``run.early``, each request in turn with its rows in table order, and
    the rows per request)."""
    early = run.early if run.early is not None else np.zeros(0, EARLY_DTYPE)
    order = np.argsort(early["req"], kind="stable")  # a request's rows stay in table order
    sreq = early["req"][order]
    cidx = run.chunk_index()
    for k in range(0, len(rids), batch):
        part = rids[k:k + batch]
        ids = np.array([cidx.get(r, -1) for r in part], np.int64)
        lo, hi = np.searchsorted(sreq, ids, "left"), np.searchsorted(sreq, ids, "right")
        counts = np.where(ids >= 0, hi - lo, 0)
        _, pos = intervals.expand_ranges(lo, lo + counts)
        yield part, ids, rowops.take(early, order[pos]), counts


def request_objects(run: Run, nums: np.ndarray) -> dict[str, at.RequestSpans]:
    """The ``attribution.RequestSpans`` of the requests numbered ``nums``, without their
    chunk spans."""
    return at.index_requests(spans_from_tables(run.request_spans.of(nums), run.chunk_requests))


def with_chunks(run: Run, rids: list[str], batch: int = 2048) -> Iterator[at.RequestSpans]:
    """Each of ``rids``' ``attribution.RequestSpans`` with its chunk spans attached
    (lazily, from ``run.early``), in batches of ``batch`` requests; a batch's rows are
    dropped when the next one is taken."""
    for part, nums, rows, counts in chunk_rows(run, rids, batch):
        yield from attach_chunks(run, request_objects(run, nums), part, rows, counts)


def attach_chunks(run: Run, reqs: dict[str, at.RequestSpans], part: list[str], rows: np.ndarray,
                  counts: np.ndarray) -> Iterator[at.RequestSpans]:
    """A :func:`chunk_rows` batch's ``attribution.RequestSpans`` (``reqs``: those of its
    requests that have any) with their chunk spans attached (lazily), dropped again once
    the batch is walked."""
    chunks = _BatchChunks(rows, counts, run.chunk_requests)
    for i, (rid, n) in enumerate(zip(part, counts.tolist())):
        if n and rid in reqs:
            r = reqs[rid]
            r.producer, r.consumer, r.scheduled = (_LazyChunks(chunks, i, w)
                                                   for w in (_PRODUCER, _CONSUMER, _SCHEDULED))
    for rid in part:
        if rid in reqs:
            yield reqs[rid]
    for r in reqs.values():
        r.drop_chunks()


def request_spans(run: Run) -> dict[str, at.RequestSpans]:
    """Every request's ``attribution.RequestSpans`` with all its chunk spans as objects
    (the whole run: for small runs and tests; the report walks ``with_chunks``)."""
    reqs = at.index_requests(spans_from_tables(run.request_spans, run.chunk_requests))
    early = run.early if run.early is not None else np.zeros(0, EARLY_DTYPE)
    known = np.array([r in reqs for r in run.chunk_requests], bool)
    rows = rowops.select(early, known[early["req"].astype(np.int64)])
    at.index_requests(chunk_spans(as_chunk_rows(rows), run.chunk_requests), reqs)
    return reqs
