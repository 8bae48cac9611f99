"""The report's tables, taken from the span builder feed by feed (an hour-long run's spans
are never held whole).

Of each feed's span rows (``spantable.SPAN_DTYPE``) the report keeps:

* ``small``: request, stage and queue spans (a few per request), whole;
* ``chunks``: the chunk spans the per-stage figures and the sender-busy rule read (snapshot,
  FIFO, put, get, 0-byte process; and every incomplete one, for its count), of every
  request (a warm-up request's task can block a measured one), in the narrower
  :data:`CHUNK_DTYPE` (52 of the span row's 83 bytes);
* ``early``: chunk spans of measured requests that may have begun before their request's
  first audio packet -- what the attribution walk, the head-of-line waits and the
  waterfalls read (~5% of the chunk spans at c=32); a row whose request has not reached
  its first packet yet is kept, and the exact cut (start <= first packet) is made at the end;
* ``emits``: the emit/API-mark events up to the first packet (the walk reads the first).

Memory: about 0.39 chunk rows per event at c=32, so ~20 bytes per event (150M events,
about an hour: 3.0 GB), plus the early rows; the tables grow without copies
(:class:`Growing`).
"""
from __future__ import annotations

import mmap

import numpy as np

from omnitrace import conventions as cv
from omnitrace import rowops
from omnitrace import spantable as stt

CHUNK_DTYPE = np.dtype([(n, stt.SPAN_DTYPE[n]) for n in
                        ("name", "reason", "stage", "peer", "replica", "req", "chunk", "start",
                         "end", "v1", "v2")])
_FIGURE_NAMES = np.zeros(len(stt.NAMES), bool)
_FIGURE_NAMES[[stt.N_SNAPSHOT, stt.N_FIFO, stt.N_PUT, stt.N_GET]] = True


class Growing:
    """An array appended to in place; ``view()`` is its filled part.

    Backed by an anonymous ``MAP_NORESERVE`` mapping far larger than any run needs: only
    the pages written become memory, so growing never copies and never holds a second,
    bigger array beside the first (numpy's ``resize`` zero-fills its new capacity, which
    makes all of it resident, and a copy doubles the peak: ~6 GB for the 3 GB chunk table
    of an hour at c=32). Where the kernel refuses the reservation (strict overcommit), a
    doubling numpy array instead."""

    RESERVE = 1 << 38  # bytes of address space, not memory

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.n = 0
        try:  # the array keeps the mapping alive
            reserved = mmap.mmap(-1, self.RESERVE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                                 | getattr(mmap, "MAP_NORESERVE", 0x4000))
            self._buf = np.frombuffer(reserved, self.dtype, self.RESERVE // self.dtype.itemsize)
        except (OSError, ValueError):
            self._buf = np.zeros(0, self.dtype)

    def append(self, rows: np.ndarray) -> None:
        k = len(rows)
        if not k:
            return
        if self.n + k > len(self._buf):
            grown = np.empty(max(2 * len(self._buf), self.n + k, 1024), self.dtype)
            grown[:self.n] = self._buf[:self.n]
            self._buf = grown
        rowops.assign(self._buf, self.n, rows)
        self.n += k

    def view(self) -> np.ndarray:
        return self._buf[:self.n]


def chunk_rows(spans: np.ndarray) -> np.ndarray:
    """Chunk span rows -> the rows (and columns) ``chunks`` keeps."""
    name = spans["name"]
    keep = (_FIGURE_NAMES[name] | (spans["reason"] != 0)
            | ((name == stt.N_PROCESS) & (spans["v1"] == 0)))
    kept = rowops.select(spans, keep)
    out = np.empty(len(kept), CHUNK_DTYPE)
    for n in CHUNK_DTYPE.names:
        out[n] = kept[n]
    return out


class ReportTables:
    """Feed span tables in (``add``), then ``finish()``."""

    def __init__(self) -> None:
        self.small = Growing(stt.SPAN_DTYPE)
        self.early = Growing(stt.SPAN_DTYPE)
        self.emits = Growing(stt.EMIT_DTYPE)
        self.chunks = Growing(CHUNK_DTYPE)
        self.first_audio = np.zeros(1024, np.int64)  # per request: 0 unknown yet, -1 never
        self.rows = 0
        self.skipped = 0

    def _grow(self, top: int) -> None:
        if top >= len(self.first_audio):
            grown = np.zeros(max(top + 1, 2 * len(self.first_audio)), np.int64)
            grown[:len(self.first_audio)] = self.first_audio
            self.first_audio = grown

    def add(self, spans: np.ndarray, emits: np.ndarray, firsts: list, skip: np.ndarray) -> None:
        """One feed's output; ``firsts``: its first-packet notes (``spantable.Feed``);
        ``skip``: per request id (every id the feed holds), True for a request left out of
        attribution (warm-up)."""
        top = max(int(spans["req"].max()) if len(spans) else 0,
                  int(emits["req"].max()) if len(emits) else 0)
        self._grow(top)
        fa = self.first_audio
        for kind, req, _replica, _seconds, t in firsts:
            if kind == cv.Ev.REQUEST_FIRST_AUDIO:
                fa[req] = t
        roots = spans[spans["name"] == stt.N_REQUEST]
        if len(roots):  # the request's own account is final
            fa[roots["req"].astype(np.int64)] = np.where(roots["t2"] > 0, roots["t2"], -1)
        self.rows += len(spans)
        req = spans["req"].astype(np.int64)
        gone = skip[req]
        self.skipped += int(gone.sum())
        chunk = spans["name"] >= stt.N_SNAPSHOT
        self.small.append(rowops.select(spans, ~chunk & ~gone))
        C = rowops.select(spans, chunk)
        self.chunks.append(chunk_rows(C))
        t = fa[req[chunk]]
        self.early.append(rowops.select(C, ~gone[chunk] & ((t == 0) | (C["start"] <= t))))
        t = fa[emits["req"].astype(np.int64)]
        self.emits.append(rowops.select(emits, (t == 0) | (emits["t"] <= t)))

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(request/stage/queue rows, early chunk rows cut at the first packet, emits,
        chunk rows)."""
        early = self.early.view()
        early = rowops.select(early, early["start"] <= self.first_audio[early["req"].astype(np.int64)])
        return self.small.view(), early, self.emits.view(), self.chunks.view()
