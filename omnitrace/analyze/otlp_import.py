"""The importer of runs recorded before the event log: ``spans.jsonl`` (OTLP/JSON lines,
one ``ExportTraceServiceRequest`` each) -> the span and emit rows the event log's loader
gives (``spantable.SPAN_DTYPE``, ``EMIT_DTYPE``) as one feed for the same sinks
(``spanload.Sink``: the report's tables). Past the import, such a run is analysed exactly
as a recorded one.

A million spans must import in seconds: each line is parsed with orjson and each span
reduced in one pass over its attributes to what the rows hold; a big file is parsed by a
process pool over line-aligned byte ranges. A torn last line (writer killed) is dropped
with a warning; malformed lines and spans are counted.

What the rows cannot hold is left out, as the report never reads it: attributes other
than the rows' columns, span events other than TTFT/TTFP, the API marks and ``omni.emit``.
Stage names become ring descriptions (one per name), and each (stage, replica)'s sender
tasks are rebuilt from the chunk spans by the builder's rule (``headofline.sender_busy``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import orjson

from omnitrace import conventions as cv
from omnitrace import spanload
from omnitrace import spantable as stt
from omnitrace.rules import headofline


def _value(v: dict[str, Any]) -> Any:
    """OTLP JSON AnyValue -> Python (intValue is a string in OTLP JSON)."""
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def _attrs(items: Iterable[dict[str, Any]] | None) -> dict[str, Any]:
    return {a["key"]: _value(a.get("value") or {}) for a in items or ()}


def _culprits(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, list):
        return tuple(str(x) for x in v if str(x))
    return tuple(x.strip() for x in str(v).split(",") if x.strip())


_KEEP_EVENTS = (cv.SPAN_REQUEST, cv.SPAN_STAGE)


_RID, _STG, _PEER, _CHK, _REP = (cv.ATTR_REQUEST_ID, cv.ATTR_STAGE_ID, cv.ATTR_PEER_STAGE_ID,
                                 cv.ATTR_CHUNK_INDEX, cv.ATTR_REPLICA)
_BNS, _BBY, _DEP, _AHD, _NB, _INC = (cv.ATTR_FIFO_BLOCKED_NS, cv.ATTR_FIFO_BLOCKED_BY, cv.ATTR_FIFO_DEPTH,
                                     cv.ATTR_FIFO_AHEAD, cv.ATTR_TRANSFER_BYTES, cv.ATTR_INCOMPLETE)


def _iv(v: dict[str, Any]) -> int:
    x = v.get("intValue")
    if x is not None:
        return int(x)
    try:
        return int(_value(v))
    except (TypeError, ValueError):
        return 0


def _rid(attrs: list[dict[str, Any]]) -> str:
    for a in attrs:
        if a["key"] == _RID:
            v = a["value"]
            return v.get("stringValue") or str(_value(v))
    return ""


def _fields(d: dict[str, Any], rid: str | None = None) -> tuple:
    """Hot loop (a million spans): one pass over the attributes, decoding only what we use.
    Returns a tuple (it pickles fast between processes): name, request id, stage, peer,
    chunk, start, end, replica, blocked ns, blocked by, depth, ahead, bytes, incomplete,
    and the events and attributes of request and stage spans."""
    name = d["name"]
    attrs = d.get("attributes") or ()
    stage: int | None = None
    peer, chunk, rep, bns, dep, ahd, nb = -2, -1, 0, 0, -1, -1, 0
    by: tuple[str, ...] = ()
    inc = False
    for a in attrs:
        k = a["key"]
        v = a["value"]
        if k == _RID:
            if rid is None:
                rid = v.get("stringValue") or str(_value(v))
        elif k == _STG:
            stage = _iv(v)
        elif k == _CHK:
            chunk = _iv(v)
        elif k == _PEER:
            peer = _iv(v)
        elif k == _REP:
            rep = _iv(v)
        elif k == _NB:
            nb = _iv(v)
        elif k == _BNS:
            bns = _iv(v)
        elif k == _BBY:
            by = _culprits(_value(v))
        elif k == _DEP:
            dep = _iv(v)
        elif k == _AHD:
            ahd = _iv(v)
        elif k == _INC:
            inc = bool(_value(v))
    if stage is None:
        stage = cv.API_STAGE if name == cv.SPAN_REQUEST else -2
    ev = None
    full = None
    if name in _KEEP_EVENTS:
        ev = [(e.get("name", ""), int(e.get("timeUnixNano", 0)), _attrs(e.get("attributes")))
              for e in d.get("events") or ()]
        full = _attrs(attrs)
    return (name, rid or "", stage, peer, chunk, int(d.get("startTimeUnixNano", 0)),
            int(d.get("endTimeUnixNano", 0)), rep, bns, by, dep, ahd, nb, inc, ev, full)


PARALLEL_MIN_BYTES = 64 << 20  # below this, one process parses faster than a pool starts


def _parse_block(data: bytes, skip: set[str] | frozenset[str]) -> tuple[list[tuple], int, int, int]:
    """(span field tuples, lines, malformed, skipped) of complete lines in ``data``."""
    out: list[tuple] = []
    lines = bad = skipped = 0
    loads, append = orjson.loads, out.append
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        lines += 1
        try:
            msg = loads(line)
        except orjson.JSONDecodeError:
            bad += 1
            continue
        if not _is_traces_request(msg):
            bad += 1
            continue
        for rs in msg["resourceSpans"]:
            for ss in rs.get("scopeSpans") or ():
                for d in ss.get("spans") or ():
                    try:
                        if skip:
                            rid = _rid(d.get("attributes") or ())
                            if rid in skip:
                                skipped += 1
                                continue
                            append(_fields(d, rid))
                        else:
                            append(_fields(d))
                    except (KeyError, TypeError, ValueError, AttributeError):
                        bad += 1
    return out, lines, bad, skipped


def _is_traces_request(msg: Any) -> bool:
    """The shape of an OTLP/JSON ExportTraceServiceRequest (down to span objects)."""
    if not isinstance(msg, dict) or not isinstance(msg.get("resourceSpans"), list):
        return False
    for rs in msg["resourceSpans"]:
        if not isinstance(rs, dict) or not isinstance(rs.get("scopeSpans", []), list):
            return False
        for ss in rs.get("scopeSpans") or ():
            if not isinstance(ss, dict) or not isinstance(ss.get("spans", []), list):
                return False
            if not all(isinstance(d, dict) for d in ss.get("spans") or ()):
                return False
    return True


def _parse_range(job: tuple[str, int, int, frozenset[str]]) -> tuple[list[tuple], int, int, int]:
    path, start, end, skip = job
    with open(path, "rb") as f:
        f.seek(start)
        return _parse_block(f.read(end - start), skip)


def _ranges(path: str, end: int, n: int) -> list[tuple[int, int]]:
    """``n`` byte ranges of [0, end) that start and end on line boundaries."""
    cuts = [0]
    with open(path, "rb") as f:
        for i in range(1, n):
            f.seek(max(cuts[-1], end * i // n))
            f.readline()
            pos = min(f.tell(), end)
            if pos > cuts[-1]:
                cuts.append(pos)
    cuts.append(end)
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


_CODE = {n: i for i, n in enumerate(stt.NAMES)}
_MARK_KIND = {name: kind for kind, name in cv.API_MARKS.items()}
_MODALITY_CODE = {m.name.lower(): int(m) for m in cv.Modality}
_UNKNOWN_MODALITY = -2  # -1 marks an API mark in EMIT_DTYPE


@dataclass
class Imported:
    """One spans.jsonl as the loader's feed, and what its reading saw."""

    feed: stt.Feed
    part: spanload.Part
    replica_of: dict[int, int]  # the feed's sender "pids" (replicas) -> replica
    spans: int = 0  # spans kept
    lines: int = 0
    skipped: int = 0  # spans of warm-up requests, not kept
    malformed: int = 0
    warnings: list[str] = field(default_factory=list)


def read(path: str, label: str, skip: frozenset[str] = frozenset(), workers: int | None = None) -> Imported:
    """Import ``path``; spans of requests in ``skip`` (warm-up) are not kept."""
    warnings: list[str] = []
    end = _complete_end(path, label, warnings)
    n = workers or min(os.cpu_count() or 1, 8)
    if n > 1 and end >= PARALLEL_MIN_BYTES:
        import multiprocessing as mp
        jobs = [(path, a, b, skip) for a, b in _ranges(path, end, n)]
        with mp.get_context("fork").Pool(len(jobs)) as pool:
            parts = pool.map(_parse_range, jobs)
    else:
        parts = [_parse_range((path, 0, end, skip))]
    fields = [t for p in parts for t in p[0]]
    imp = _as_feed(fields)
    imp.warnings = warnings
    imp.spans = len(fields)
    imp.lines = sum(p[1] for p in parts)
    imp.malformed = sum(p[2] for p in parts)
    imp.skipped = sum(p[3] for p in parts)
    return imp


def _complete_end(path: str, label: str, warnings: list[str]) -> int:
    """The file's size without a torn last line."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
    end = size
    if tail and not tail.endswith(b"\n"):
        nl = tail.rfind(b"\n")
        end = size - len(tail) + nl + 1 if nl >= 0 else (0 if size <= len(tail) else size)
        torn = tail[nl + 1:] if nl >= 0 else tail
        try:
            orjson.loads(torn)
            end = size  # complete JSON, just no newline
        except orjson.JSONDecodeError:
            warnings.append(f"{label}: last line is truncated (writer killed mid-write?); ignored")
    return end


def _modality(attrs: dict[str, Any]) -> int:
    for k, v in attrs.items():
        if "modality" in k:
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                return int(v)
            return _MODALITY_CODE.get(str(v).lower(), _UNKNOWN_MODALITY)
    return _UNKNOWN_MODALITY


def _as_feed(fields: list[tuple]) -> Imported:
    """Span field tuples (``_fields``) -> rows, emit rows, request ids, rings."""
    requests: dict[str, int] = {"": 0}
    rings: dict[str, int] = {}  # stage name -> ring index
    rows: list[tuple] = []
    emits: list[tuple] = []
    for (name, rid, stage, peer, chunk, start, end, rep, bns, by, _dep, ahd, nb, inc, ev,
         full) in fields:
        c = _CODE.get(name, -1)
        if c < 0:
            continue
        req = requests.setdefault(rid, len(requests))
        if c >= stt.N_SNAPSHOT:
            b = [requests.setdefault(x, len(requests)) for x in by[:3]] + [0, 0, 0]
            rows.append((c, 1 if inc else 0, False, 0, stage, peer, rep, req, chunk, -1, start, end,
                         ahd if c == stt.N_FIFO else nb, bns, 0, 0, b[0], b[1], b[2]))
        elif c == stt.N_REQUEST:
            rows.append(_request_row(req, rep, start, end, inc, ev or (), full or {}, emits))
        else:
            sname = (full or {}).get(cv.ATTR_STAGE_NAME)
            ring = rings.setdefault(str(sname), len(rings)) if sname else -1
            rows.append((c, 1 if inc else 0, False, 0, stage, -2, rep, req, -1, ring, start, end,
                         0, 0, 0, 0, 0, 0, 0))
            if c == stt.N_STAGE:
                emits.extend((req, stage, rep, t, int(a.get(cv.ATTR_PACKET_INDEX, 0) or 0), _modality(a))
                             for n, t, a in ev or () if n == cv.EVENT_EMIT)
    table = np.array(rows, stt.SPAN_DTYPE) if rows else np.zeros(0, stt.SPAN_DTYPE)
    busy = headofline.sender_busy(table[table["name"] >= stt.N_SNAPSHOT])
    replicas = {rep for _, rep in busy} | {int(r) for r in table["replica"]}
    feed = stt.Feed(table, np.array(emits, stt.EMIT_DTYPE) if emits else np.zeros(0, stt.EMIT_DTYPE),
                    busy=[(rep, stage, s, e, r) for (stage, rep), (s, e, r) in busy.items()])
    part = spanload.Part({i: {"process": n} for n, i in rings.items()}, list(requests))
    return Imported(feed, part, {r: r for r in replicas})


def _request_row(req: int, rep: int, start: int, end: int, inc: bool, events: Iterable,
                 attrs: dict[str, Any], emits: list[tuple]) -> tuple:
    """A request span as a row (TTFT/TTFP events as t1/t2), its API marks into ``emits``."""
    t1 = t2 = 0
    for n, t, _ in events:
        if n == cv.EVENT_TTFT:
            t1 = t if not t1 else min(t1, t)
        elif n == cv.EVENT_TTFP:
            t2 = t if not t2 else min(t2, t)
        elif n in _MARK_KIND:
            emits.append((req, cv.API_STAGE, rep, t, _MARK_KIND[n], -1))
    try:
        status = int(attrs.get(cv.ATTR_STATUS, 0) or 0)
    except (TypeError, ValueError):
        status = 0
    prompt = attrs.get(cv.ATTR_PROMPT_TOKENS)
    v1, v2 = (int(prompt), int(attrs.get(cv.ATTR_MAX_TOKENS) or 0)) if prompt is not None else (-1, 0)
    return (stt.N_REQUEST, 1 if inc else 0, False, status, cv.API_STAGE, -2, rep, req, -1, -1,
            start, end, v1, v2, t1, t2, 0, 0, 0)
