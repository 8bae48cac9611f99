"""Span objects of the span tables (``omnitrace.spantable.SpanTables``): what the
reference walk (``attribution``) reads, where the batch walk's keys do not hold a run's
numbers and in the tests that compare the two (``analyze/chunkspans.py`` makes a report's
chunk spans lazily from these)."""
from __future__ import annotations

import numpy as np

from omnitrace import conventions as cv
from omnitrace import keys, rowops
from omnitrace import spantable as stt
from omnitrace.rules.span import NO_EMITS, Span


def chunk_span(row: tuple, requests: list[str]) -> Span:
    """One chunk span row (a ``spantable.CHUNK_DTYPE`` row as a tuple: its positions, for
    speed; ``figure`` is a FIFO span's AHEAD or another's STRATEGY or BYTES) -> :class:`Span`."""
    (name, reason, stage, peer, replica, req, chunk, _ring, start, end, figure,
     blocked_ns, by0, by1, by2) = row
    if name == stt.N_FIFO:
        by = tuple(requests[x] for x in (by0, by1, by2) if x)
        return Span(stt.NAMES[name], requests[req], stage, peer, chunk, start, end, replica, blocked_ns, by,
                    figure + 1, figure, 0, reason != 0)
    nb = figure if name in (stt.N_PUT, stt.N_PROCESS, stt.N_GET) else 0
    return Span(stt.NAMES[name], requests[req], stage, peer, chunk, start, end, replica, 0, (),
                -1, -1, nb, reason != 0)


def chunk_spans(rows: np.ndarray, requests: list[str]) -> list[Span]:
    """Chunk span rows -> :class:`Span` objects, in row order."""
    return [chunk_span(row, requests) for row in rows.tolist()]


_PARSED, _DISPATCHED, _RECEIVED, _RESUMED = (int(k) for k in (
    cv.Ev.REQUEST_PARSED, cv.Ev.REQUEST_DISPATCH, cv.Ev.PACKET_RECEIVED, cv.Ev.PACKET_RESUMED))
_NO_MARKS: dict[int, int] = {}


def _emit_firsts(emits: np.ndarray) -> dict[tuple[int, int, int], tuple[int | None, int | None]]:
    """(request, stage, replica) -> the first audio and the first ``omni.emit`` time of
    that stage span's packets (``spantable.VisitEmits``)."""
    v = stt.VisitEmits.of(emits)
    return {(r, s, p): (a if a != stt.NO_EMIT else None, f) for r, s, p, a, f in zip(
        v.req.tolist(), v.stage.tolist(), v.replica.tolist(), v.first_audio.tolist(), v.first.tolist())}


def _first_marks(emits: np.ndarray) -> dict[tuple[int, int], dict[int, int]]:
    """(request, replica) -> the first time of each API mark of its request span, by the
    mark's event kind (the mark rows of ``emits``: a few per request)."""
    m = rowops.select(emits, (emits["modality"] == stt.MARK_MODALITY) & (emits["stage"] == cv.API_STAGE))
    out: dict[tuple[int, int], dict[int, int]] = {}
    for req, replica, t, kind in zip(m["req"].tolist(), m["replica"].tolist(), m["t"].tolist(),
                                     m["packet"].tolist()):
        marks = out.setdefault((req, replica), {})
        if t < marks.get(kind, t + 1):
            marks[kind] = t
    return out


def _request_span(row: tuple, requests: list[str], marks: dict[int, int]) -> Span:
    """An ``omni.request`` row (``spantable.REQUEST_DTYPE``) -> :class:`Span` with its
    status, first audio packet (0: none) and ``marks`` (event kind -> first time)."""
    (req, reason, _error, status, replica, _ring, start, end, _prompt, _max_tokens, _first_text,
     first_audio) = row
    sp = Span(stt.NAMES[stt.N_REQUEST], requests[req], cv.API_STAGE, -2, -1, start, end, replica,
              incomplete=reason != 0)
    sp.status, sp.ttfp = status, first_audio or None
    sp.parsed, sp.dispatched = marks.get(_PARSED), marks.get(_DISPATCHED)
    sp.packet_received, sp.packet_resumed = marks.get(_RECEIVED), marks.get(_RESUMED)
    return sp


def _stage_span(row: tuple, requests: list[str],
                firsts: dict[tuple[int, int, int], tuple[int | None, int | None]]) -> Span:
    """An ``omni.stage`` or ``omni.stage.queue`` row (``spantable.VISIT_DTYPE``) ->
    :class:`Span` with, a stage span, its first emits (``firsts``: :func:`_emit_firsts`)."""
    name, reason, _error, _status, stage, replica, req, _ring, start, end = row
    sp = Span(stt.NAMES[name], requests[req], stage, -2, -1, start, end, replica, incomplete=reason != 0)
    if name == stt.N_STAGE:
        sp.emit_firsts = firsts.get((req, stage, replica), NO_EMITS)
    return sp


def first_packet_of(reqs: np.ndarray, known: np.ndarray, first: np.ndarray, unknown: int) -> np.ndarray:
    """Each of ``reqs``' first audio packet time, from ``known`` requests and their
    ``first`` packet times; ``unknown`` for a request not among them."""
    order = np.argsort(known, kind="stable")
    return keys.lookup(known[order], reqs, first[order], unknown)


def before_first_packet(spans: stt.SpanTables) -> np.ndarray:
    """The chunk rows that began by their request's first audio packet (its request span's
    ``first_audio``; 0 or no request span: no row kept): all attribution can walk."""
    chunks, roots = spans.chunks, spans.requests
    limit = first_packet_of(chunks["req"].astype(np.int64), roots["req"].astype(np.int64),
                            roots["first_audio"].astype(np.int64), 0)
    return rowops.select(chunks, chunks["start"] <= limit)


def spans_from_tables(spans: stt.SpanTables, requests: list[str], chunks_before_ttfp: bool = False
                      ) -> list[Span]:
    """Span tables -> report :class:`Span` objects (chunk spans, request spans, then stage
    and queue spans, each in table order); with ``chunks_before_ttfp`` only chunk spans
    that began before their request's first audio packet (all attribution can walk)."""
    firsts, marks = _emit_firsts(spans.emits), _first_marks(spans.emits)
    chunks = before_first_packet(spans) if chunks_before_ttfp else spans.chunks
    out = chunk_spans(chunks, requests)
    out += [_request_span(row, requests, marks.get((row[0], row[4]), _NO_MARKS))
            for row in spans.requests.tolist()]
    out += [_stage_span(row, requests, firsts) for row in spans.visits.tolist()]
    return out
