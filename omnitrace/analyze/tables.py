"""The report's tables, taken from the span builder feed by feed (an hour-long run's spans
are never held whole).

Of each feed the report keeps:

* ``requests``, ``visits``: request, stage and queue spans (a few per request), whole;
* the per-stage figures' columns of every chunk span (:class:`ChunkFigures`): one narrow
  table per kind -- snapshot (14 bytes a row), FIFO (26), put/get (25) -- of the complete
  spans, and (request, name, reason) of the incomplete ones, for their count; every
  request's rows, warm-up included (the request selection is made by the report);
* ``busy``: the sender tasks the builder closed (``Feed.busy``, 20 bytes each), per
  sender in the order closed (time order): the head-of-line rule's busy intervals;
* ``early``: chunk spans of measured requests that may have begun before their request's
  first audio packet -- what the attribution walk, the head-of-line waits and the
  waterfalls read (~5% of the chunk spans at c=32; 19% in the synthetic c=32 runs), the
  columns they read (:data:`EARLY_DTYPE`, 48 of a chunk row's 64 bytes); a row whose
  request has not reached its first packet yet is kept, and the exact cut (start <= first
  packet) is made at the end;
* ``emits``: the emit/API-mark events up to the first packet (the walk reads the first).

Memory (measured at c=32): 0.31 figure rows and 0.12 sender tasks per event, ~9 bytes per
event in all (150M events, about an hour: ~1.4 GB), plus the early rows (~1 byte per event
at c=32; ~4 in the synthetic runs); the tables grow without copies (:class:`Growing`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnitrace import conventions as cv
from omnitrace import rowops, spanload
from omnitrace.rowops import Growing
from omnitrace import spantable as stt
from omnitrace.rules.headofline import Busy, busy_by_replica

SNAPSHOT_DTYPE = np.dtype([("req", "<u4"), ("stage", "<i2"), ("dur", "<i8")])
FIFO_DTYPE = np.dtype([("req", "<u4"), ("stage", "<i2"), ("ahead", "<i4"), ("dur", "<i8"),
                       ("blocked", "<i8")])
TRANSFER_DTYPE = np.dtype([("req", "<u4"), ("put", "?"), ("producer", "<i2"), ("consumer", "<i2"),
                           ("dur", "<i8"), ("bytes", "<i8")])
INCOMPLETE_DTYPE = np.dtype([("req", "<u4"), ("name", "i1"), ("reason", "i1")])
# An early chunk span: the chunk row's columns its readers read (by name; the walk's span
# objects are made of whole rows, :func:`as_chunk_rows`). Of the rest none is read (ring) or
# it is 0 in the report (by0..by2: its builder names no culprits).
EARLY_DTYPE = np.dtype([(n, stt.CHUNK_DTYPE[n]) for n in (
    "name", "reason", "stage", "peer", "replica", "req", "chunk", "start", "end", "figure", "blocked")])
_spanc = rowops.compiled("_spanc", dict(N_SNAPSHOT=stt.N_SNAPSHOT, N_FIFO=stt.N_FIFO, N_PUT=stt.N_PUT,
                                        N_GET=stt.N_GET),
                         S=stt.CHUNK_DTYPE, P=SNAPSHOT_DTYPE, F=FIFO_DTYPE, X=TRANSFER_DTYPE,
                         I=INCOMPLETE_DTYPE, R=EARLY_DTYPE)
_NONE = np.iinfo(np.int64).max


@dataclass
class ChunkFigures:
    """What the per-stage figures read of the chunk spans (complete ones; the incomplete
    are counted by name and reason), and each request's earliest chunk span start
    (``first_start``, by request id; int64 max: none). ``req`` columns index the run's
    request list."""

    snapshot: np.ndarray
    fifo: np.ndarray
    transfer: np.ndarray
    incomplete: np.ndarray
    first_start: np.ndarray

    @staticmethod
    def empty() -> "ChunkFigures":
        return ChunkFigures(np.zeros(0, SNAPSHOT_DTYPE), np.zeros(0, FIFO_DTYPE),
                            np.zeros(0, TRANSFER_DTYPE), np.zeros(0, INCOMPLETE_DTYPE),
                            np.zeros(0, np.int64))

    def tables(self) -> list[np.ndarray]:
        return [self.snapshot, self.fifo, self.transfer, self.incomplete]

    def renumbered(self, remap: np.ndarray, n_requests: int) -> "ChunkFigures":
        """Request ids mapped through ``remap`` (old id -> new), ``first_start`` sized for
        ``n_requests`` ids: to merge several run directories."""
        for t in self.tables():
            t["req"] = remap[t["req"].astype(np.int64)]
        first = np.full(n_requests, _NONE, np.int64)
        np.minimum.at(first, remap[:len(self.first_start)], self.first_start[:len(remap)])
        self.first_start = first
        return self

    @staticmethod
    def of(spans: np.ndarray, n_requests: int) -> "ChunkFigures":
        """The figures of chunk span rows (``spantable.CHUNK_DTYPE``) of ``n_requests`` ids."""
        first = np.full(n_requests, _NONE, np.int64)
        first_starts(spans, first)
        return ChunkFigures(*figure_rows(spans), first)

    def merged(self, other: "ChunkFigures") -> "ChunkFigures":
        n = max(len(self.first_start), len(other.first_start))
        first = np.full(n, _NONE, np.int64)
        for f in (self.first_start, other.first_start):
            first[:len(f)] = np.minimum(first[:len(f)], f)
        return ChunkFigures(*(rowops.concat((a, b), a.dtype) for a, b in zip(self.tables(), other.tables())),
                            first)


def figure_rows(spans: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Chunk span rows (``spantable.CHUNK_DTYPE``) -> (snapshot, FIFO, put/get, incomplete)
    rows of :class:`ChunkFigures`."""
    name, ok = spans["name"], spans["reason"] == 0
    dur = spans["end"] - spans["start"]

    def table(dtype: np.dtype, sel: np.ndarray) -> np.ndarray:
        out = np.empty(len(sel), dtype)
        out["req"], out["dur"] = spans["req"][sel], dur[sel]
        return out

    i = np.flatnonzero(ok & (name == stt.N_SNAPSHOT))
    snap = table(SNAPSHOT_DTYPE, i)
    snap["stage"] = spans["stage"][i]
    i = np.flatnonzero(ok & (name == stt.N_FIFO))
    fifo = table(FIFO_DTYPE, i)
    fifo["stage"], fifo["ahead"], fifo["blocked"] = spans["stage"][i], spans[stt.AHEAD][i], spans[stt.BLOCKED][i]
    i = np.flatnonzero(ok & ((name == stt.N_PUT) | (name == stt.N_GET)))
    xfer = table(TRANSFER_DTYPE, i)
    put = name[i] == stt.N_PUT
    stage, peer = spans["stage"][i], spans["peer"][i]
    xfer["put"], xfer["bytes"] = put, spans[stt.BYTES][i]
    xfer["producer"], xfer["consumer"] = np.where(put, stage, peer), np.where(put, peer, stage)
    i = np.flatnonzero(~ok)
    bad = np.empty(len(i), INCOMPLETE_DTYPE)
    bad["req"], bad["name"], bad["reason"] = spans["req"][i], name[i], spans["reason"][i]
    return snap, fifo, xfer, bad


def split_reference(chunks: np.ndarray, skip: np.ndarray, first_audio: np.ndarray,
                    first_start: np.ndarray) -> tuple[np.ndarray, ...]:
    """One feed's chunk spans split as the report keeps them (``_spanc.report_split``
    follows this): (early rows, the figure tables' rows (snapshot, FIFO, put/get,
    incomplete), how many spans were skipped); ``first_start`` updated in place.
    ``skip``: per request id, warm-up; ``first_audio``: per request id, its first audio
    packet (0: unknown yet)."""
    req = chunks["req"].astype(np.int64)
    gone = skip[req]
    figures = figure_rows(chunks)
    first_starts(chunks, first_start)
    t = first_audio[req]
    early = early_rows(rowops.select(chunks, ~gone & ((t == 0) | (chunks["start"] <= t))))
    return (early, *figures, int(gone.sum()))


def early_rows(chunks: np.ndarray) -> np.ndarray:
    """Chunk span rows (``spantable.CHUNK_DTYPE``) as early rows (:data:`EARLY_DTYPE`)."""
    out = np.empty(len(chunks), EARLY_DTYPE)
    for n in EARLY_DTYPE.names:
        out[n] = chunks[n]
    return out


def as_chunk_rows(early: np.ndarray) -> np.ndarray:
    """Early rows as chunk span rows (``spantable.CHUNK_DTYPE``: the other columns 0), for
    what reads whole rows; chunk rows as they are."""
    if early.dtype == stt.CHUNK_DTYPE:
        return early
    out = np.zeros(len(early), stt.CHUNK_DTYPE)
    for n in early.dtype.names:
        out[n] = early[n]
    return out


def first_starts(spans: np.ndarray, into: np.ndarray) -> None:
    """``into[req] = min(into[req], start)`` over chunk span rows, in place."""
    np.minimum.at(into, spans["req"].astype(np.int64), np.ascontiguousarray(spans["start"]))


class ReportTables:
    """The report's sink of the one load (``spanload.Sink``): every feed's spans in
    (``feed``), then ``finish()``. ``skip``: warm-up request ids, left out of attribution."""

    culprits = False  # blocked_by: no report reads it
    steps = False

    def __init__(self, skip: frozenset[str] = frozenset()) -> None:
        self._skip = skip
        self._warmup: _Warmup | None = None
        self.requests = Growing(stt.REQUEST_DTYPE)
        self.visits = Growing(stt.VISIT_DTYPE)
        self.early = Growing(EARLY_DTYPE)
        self.emits = Growing(stt.EMIT_DTYPE)
        self.figures = [Growing(d) for d in (SNAPSHOT_DTYPE, FIFO_DTYPE, TRANSFER_DTYPE,
                                             INCOMPLETE_DTYPE)]
        # per sender (pid, stage): its tasks' starts, ends, requests (contiguous columns:
        # the head-of-line rule binary-searches them)
        self.busy: dict[tuple[int, int], tuple[Growing, Growing, Growing]] = {}
        self.first_audio = np.zeros(1024, np.int64)  # per request: 0 unknown yet, -1 never
        self.first_start = np.full(1024, _NONE, np.int64)  # per request: earliest chunk span
        self.rows = 0
        self.skipped = 0
        self.repeated: dict[str, int] = {}  # request id -> its arrivals after the first

    def _grow(self, top: int) -> None:
        if top >= len(self.first_audio):
            n = max(top + 1, 2 * len(self.first_audio))
            self.first_audio = np.concatenate((self.first_audio, np.zeros(n - len(self.first_audio), np.int64)))
            self.first_start = np.concatenate((self.first_start, np.full(n - len(self.first_start), _NONE)))

    def feed(self, feed: stt.Feed, part: spanload.Part) -> None:
        if self._warmup is None:
            self._warmup = _Warmup(part.requests, self._skip)
        for req in feed.repeated:
            rid = part.requests[req]
            self.repeated[rid] = self.repeated.get(rid, 0) + 1
        self._add(feed, self._warmup.flags())

    def _add(self, feed: stt.Feed, skip: np.ndarray) -> None:
        """One feed's output; ``skip``: per request id (every id the feed holds), True for
        a request left out of attribution (warm-up)."""
        spans = feed.spans
        self._grow(max((int(t["req"].max()) for t in spans.tables() if len(t)), default=0))
        fa = self.first_audio
        for kind, req, _replica, _seconds, t in feed.latencies:
            if kind == cv.Ev.REQUEST_FIRST_AUDIO:
                fa[req] = t
        roots = spans.requests
        if len(roots):  # the request's own account is final
            fa[roots["req"].astype(np.int64)] = np.where(roots["first_audio"] > 0, roots["first_audio"], -1)
        self.rows += len(spans)
        for table, rows in ((self.requests, spans.requests), (self.visits, spans.visits)):
            gone = skip[rows["req"].astype(np.int64)]
            table.append(rowops.select(rows, ~gone))
            self.skipped += int(gone.sum())
        self.skipped += self._split(spans.chunks, skip)
        emits = spans.emits
        t = fa[emits["req"].astype(np.int64)]
        self.emits.append(rowops.select(emits, (t == 0) | (emits["t"] <= t)))
        for pid, stage, *cols in feed.busy:
            grow = self.busy.get((pid, stage))
            if grow is None:
                grow = self.busy[(pid, stage)] = (Growing(np.int64), Growing(np.int64), Growing(np.uint32))
            for g, c in zip(grow, cols):
                g.append(c)

    def _split(self, chunks: np.ndarray, skip: np.ndarray) -> int:
        """One feed's chunk spans into the tables (:func:`split_reference`'s rule; compiled
        where built, written straight into the tables); how many were skipped (warm-up)."""
        outs = (self.early, *self.figures)
        if _spanc is None:
            *rows, skipped = split_reference(chunks, skip, self.first_audio, self.first_start)
            for table, r in zip(outs, rows):
                table.append(r)
            return skipped
        *counts, skipped = _spanc.report_split(
            np.ascontiguousarray(chunks), np.ascontiguousarray(skip), self.first_audio,
            self.first_start, *(t.spare(len(chunks)) for t in outs))
        for table, n in zip(outs, counts):
            table.added(n)
        return skipped

    def finish(self, replica_of: dict[int, int]) -> tuple[stt.SpanTables, np.ndarray, ChunkFigures,
                                                          Busy]:
        """(the request and visit spans and the emits, the early chunk rows cut at the first
        packet, the figures' tables, the senders' busy intervals by (stage, replica);
        ``replica_of``: pid -> replica, from the rings)."""
        early = self.early.view()
        early = self.early.keep(early["start"] <= self.first_audio[early["req"].astype(np.int64)])
        figs = ChunkFigures(*(t.view() for t in self.figures), self.first_start)
        senders = {k: tuple(g.view() for g in grow) for k, grow in self.busy.items()}
        kept = stt.SpanTables(self.requests.view(), self.visits.view(), emits=self.emits.view())
        return kept, early, figs, busy_by_replica(senders, replica_of)


class _Warmup:
    """Per request id, True for a warm-up request (attribution skips it); grows with the
    load's request ids, which the reader extends as it reads."""

    def __init__(self, strings: list[str], skip: frozenset[str]) -> None:
        self.strings, self.skip = strings, skip
        self._flags = np.zeros(0, bool)

    def flags(self) -> np.ndarray:
        """A new array when the flags grow (the caller may still hold the old one)."""
        have, strings = len(self._flags), self.strings
        if have < len(strings):
            self._flags = np.concatenate((self._flags, np.fromiter(
                (r in self.skip for r in strings[have:]), bool, len(strings) - have)))
        return self._flags
