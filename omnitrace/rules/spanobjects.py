"""Span objects of span-table rows (``omnitrace.spantable.SPAN_DTYPE``): what the
reference walk and the waterfalls read, for the live agent's rows as for the report's
tables (``analyze/chunkspans.py`` makes a report's chunk spans lazily from these)."""
from __future__ import annotations

import numpy as np

from omnitrace import conventions as cv
from omnitrace import rowops
from omnitrace import spantable as stt
from omnitrace.rules.span import Span


def chunk_span(row: tuple, requests: list[str]) -> Span:
    """One chunk span row (a ``spantable.SPAN_DTYPE`` row as a tuple) -> :class:`Span`."""
    (name, reason, _error, _status, stage, peer, replica, req, chunk, _ring, start, end, v1, v2,
     _t1, _t2, by0, by1, by2) = row
    if name == stt.N_FIFO:
        by = tuple(requests[x] for x in (by0, by1, by2) if x)
        return Span(stt.NAMES[name], requests[req], stage, peer, chunk, start, end, replica, v2, by,
                    v1 + 1, v1, 0, reason != 0)
    nb = v1 if name in (stt.N_PUT, stt.N_PROCESS, stt.N_GET) else 0
    return Span(stt.NAMES[name], requests[req], stage, peer, chunk, start, end, replica, 0, (),
                -1, -1, nb, reason != 0)


def chunk_spans(rows: np.ndarray, requests: list[str]) -> list[Span]:
    """Chunk span rows -> :class:`Span` objects, in row order."""
    return [chunk_span(row, requests) for row in rows.tolist()]


def _emit_firsts(emits: np.ndarray) -> dict[tuple[int, int, int], tuple[int | None, int | None]]:
    """(request, stage, replica) -> the first audio and the first ``omni.emit`` time of the
    events ``otlp.emit_events`` gives that stage span (API marks are not emits), by one sort
    of the emit rows: ``attribution.first_audio_emit`` otherwise looks at every packet's
    attributes (~40 per request before its first audio packet)."""
    e = rowops.select(emits, emits["modality"] != -1)
    if not len(e):
        return {}
    o = np.lexsort((e["replica"], e["stage"], e["req"]))
    req, stage, rep, t = e["req"][o], e["stage"][o], e["replica"][o], e["t"][o]
    head = np.ones(len(o), bool)
    head[1:] = (req[1:] != req[:-1]) | (stage[1:] != stage[:-1]) | (rep[1:] != rep[:-1])
    lo = np.flatnonzero(head)
    never = np.iinfo(np.int64).max
    audio = np.minimum.reduceat(np.where(e["modality"][o] == int(cv.Modality.AUDIO), t, never), lo)
    first = np.minimum.reduceat(t, lo)
    return {(r, s, p): (a if a != never else None, f) for r, s, p, a, f in zip(
        req[lo].tolist(), stage[lo].tolist(), rep[lo].tolist(), audio.tolist(), first.tolist())}


def spans_from_table(table, emits, requests: list[str], rings: dict[int, dict],
                     chunks_before_ttfp: bool = False, emit_events_too: bool = True) -> list[Span]:
    """Span-table rows (``omnitrace.spantable``) -> report :class:`Span` objects; with
    ``chunks_before_ttfp`` only chunk spans that began before their request's first audio
    packet (all attribution can walk) become objects. Without ``emit_events_too`` stage
    spans carry no ``omni.emit`` events (the walk reads only their first emits, kept)."""
    from omnitrace.otlp import emit_events, request_attrs, request_events, stage_attrs
    names = stt.NAMES
    by_stage = emit_events(emits if emit_events_too else emits[emits["modality"] == -1])
    firsts = _emit_firsts(emits)
    keep = np.ones(len(table), bool)
    if chunks_before_ttfp:
        roots = table[table["name"] == stt.N_REQUEST]
        ttfp = np.zeros(len(requests), np.int64)
        ttfp[roots["req"].astype(np.int64)] = np.where(roots["t2"] > 0, roots["t2"], 0)
        chunk = table["name"] >= stt.N_SNAPSHOT
        keep &= ~chunk | (table["start"] <= ttfp[table["req"].astype(np.int64)])
    out: list[Span] = []
    append = out.append
    for row in rowops.select(table, keep).tolist():
        if row[0] >= stt.N_SNAPSHOT:  # chunk spans: the hot part
            append(chunk_span(row, requests))
            continue
        (name, reason, error, status, stage, peer, replica, req, chunk, ring, start, end, v1, v2,
         t1, t2, by0, by1, by2) = row
        rid = requests[req]
        if name == stt.N_REQUEST:
            attrs = request_attrs(rid, status, replica, v1, v2)
            events = request_events(t1, t2, by_stage.get((req, cv.API_STAGE, replica), ()))
            append(Span(names[name], rid, cv.API_STAGE, -2, -1, start, end, replica,
                        incomplete=reason != 0, events=events, attrs=attrs))
        else:
            attrs = stage_attrs(rid, stage, rings.get(ring, {}).get("process") or f"stage{stage}", replica)
            events = by_stage.get((req, stage, replica), []) if name == stt.N_STAGE else []
            sp = Span(names[name], rid, stage, -2, -1, start, end, replica,
                      incomplete=reason != 0, events=events, attrs=attrs)
            if name == stt.N_STAGE:
                sp.emit_firsts = firsts.get((req, stage, replica), (None, None))
            append(sp)
    return out
