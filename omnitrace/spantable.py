"""Events -> spans, vectorised: the one span-building library (live metrics, live OTLP
export, `omnitrace export` and `omnitrace report` all use :class:`SpanBuilder`).

Input: ``eventlog.EVENT_DTYPE`` rows (any number of rings, any cut of time) fed in
order of arrival; output per feed: the finished spans, a table per kind
(:data:`REQUEST_DTYPE`, :data:`VISIT_DTYPE`, :data:`CHUNK_DTYPE`), and the ``omni.emit``
events of finished stage spans (:data:`EMIT_DTYPE`; rows of stage
``API_STAGE`` are the request span's API marks, ``conventions.API_MARKS``). Nothing here
builds a Python object per event: chunk pairs are matched with sorts and binary searches
over integer keys; request and stage events (a few per request per stage) and the emits
(one per output packet, a visit at a time) go to each request's state (``reqstate``:
compiled, its rule in Python beside it).

Pairing rules (one trace per request, ``conventions.trace_id_for(request)``):

* ``omni.request``  REQUEST_ARRIVE -> REQUEST_END (API server), events TTFT/TTFP.
* ``omni.stage``    STAGE_ADD -> STAGE_FINISH per (request, stage, replica), with the
  stage's STAGE_EMIT events; ``omni.stage.queue`` STAGE_ADD -> STAGE_SCHEDULE.
* producer chunk spans keyed (request, producer stage, chunk): snapshot, fifo
  (enqueue -> dequeue), process, put; consumer chunk spans keyed (request, consumer
  stage, chunk): get, wait_schedule (ready -> scheduled); poll_lag: producer put end ->
  consumer get begin, joined on (request, producer stage, chunk).
* Within one key the k-th begin (in time order) pairs with the k-th end, so a key reused
  by a retried task gives a second span, not a mismatched one. A stamp whose partner has
  not arrived yet waits in the builder (an end can arrive one drain before its begin when
  the two are on different rings).
* The peer stage of a chunk span is the end stamp's ``b``; its replica and process are
  those of the ring that recorded its begin.

FIFO blocking (the rule: :mod:`omnitrace.intervals`): each sender (pid, stage) is busy
with one task at a time (:func:`sender_tasks`); a FIFO span's ``blocked_ns`` (:data:`BLOCKED`)
and ``blocked_by`` (by0..by2) are its wait's overlap with that sender's tasks of *other*
requests and the three requests with the largest. Every busy interval that overlaps a
wait [E, D] ends by D on the sender's own ring, so it is known when D is.
The tasks each feed closes are handed out with it (``Feed.busy``): the report's
head-of-line rule and the flame graphs' sender join read the same intervals.

Spans whose end never came (writer died, run ended, request freed unfinished or idle)
are emitted by :meth:`SpanBuilder.flush` with a reason code (:data:`REASONS`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from omnitrace import conventions as cv
from omnitrace import intervals, keys, reqstate, rowops, tracecontext
from omnitrace.eventlog import EVENT_DTYPE
from omnitrace.spanrows import (  # noqa: F401 - the builder's output, named here too
    AHEAD, BLOCKED, BYTES, CHUNK_DTYPE, CONSUMER_NAMES, EMIT_DTYPE, MARK_MODALITY, N_FIFO, N_GET, N_POLL,
    N_PROCESS, N_PUT, N_QUEUE, N_REQUEST, N_SNAPSHOT, N_STAGE, N_WAIT, NAMES, PRODUCER_NAMES, R_NEVER_SCHEDULED,
    R_NONE, R_RUN_ENDED, R_TIMEOUT, R_UNFINISHED, R_WRITER_DIED, REASONS, REQUEST_DTYPE, STRATEGY, VISIT_DTYPE)

try:
    from omnitrace import _decodec
except ImportError:  # built without a C compiler: the numpy references
    _decodec = None

E = cv.Ev



@dataclass(frozen=True)
class VisitEmits:
    """Each stage visit's packets, the rule's one home (the report's stage spans and the
    ``stage_visits`` table read it): per (request, stage, replica) with an ``omni.emit``
    (API marks are not emits), in key order, the first emit's time, the first audio
    emit's (``NO_EMIT``: none) and the count."""

    req: np.ndarray
    stage: np.ndarray
    replica: np.ndarray
    first: np.ndarray
    first_audio: np.ndarray
    count: np.ndarray

    @staticmethod
    def of(emits: np.ndarray) -> "VisitEmits":
        """The visits' packets in ``emits`` (EMIT_DTYPE rows; API marks left out)."""
        e = rowops.select(emits, emits["modality"] != MARK_MODALITY)
        t = e["t"]
        audio = np.where(e["modality"] == int(cv.Modality.AUDIO), t, NO_EMIT)
        return VisitEmits(e["req"], e["stage"], e["replica"], t, audio, np.ones(len(e), np.int64)).grouped()

    @staticmethod
    def concat(parts: list["VisitEmits"]) -> "VisitEmits":
        """Several parts' rows as one (a visit may be in several: :meth:`grouped` joins it)."""
        cols = [np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0, np.int64)
                for f in VisitEmits.__dataclass_fields__]
        return VisitEmits(*cols)

    def grouped(self) -> "VisitEmits":
        """One row per visit, in key order: the earliest first and first audio emit, the
        counts summed (the emits of several feeds give the same as all of them at once)."""
        o = np.lexsort((self.replica, self.stage, self.req))
        req, stage, rep = self.req[o], self.stage[o], self.replica[o]
        head = np.ones(len(o), bool)
        head[1:] = (req[1:] != req[:-1]) | (stage[1:] != stage[:-1]) | (rep[1:] != rep[:-1])
        lo = np.flatnonzero(head)
        if not len(lo):
            none = np.zeros(0, np.int64)
            return VisitEmits(req[lo], stage[lo], rep[lo], none, none, none)
        return VisitEmits(req[lo], stage[lo], rep[lo], np.minimum.reduceat(self.first[o], lo),
                          np.minimum.reduceat(self.first_audio[o], lo), np.add.reduceat(self.count[o], lo))


NO_EMIT = np.iinfo(np.int64).max

# chunk pairs: (name code, begin kind, end kind, producer side)
_PAIRS = ((N_SNAPSHOT, E.SNAPSHOT_BEGIN, E.SNAPSHOT_END),
          (N_FIFO, E.FIFO_ENQUEUE, E.FIFO_DEQUEUE),
          (N_PROCESS, E.PROCESS_BEGIN, E.PROCESS_END),
          (N_PUT, E.PUT_BEGIN, E.PUT_END),
          (N_GET, E.GET_BEGIN, E.GET_END),
          (N_WAIT, E.CHUNK_READY, E.CHUNK_SCHEDULED))
_PUT = next(i for i, (n, _, _) in enumerate(_PAIRS) if n == N_PUT)
_REQUEST_KINDS = (*(E(k) for k in sorted(cv.API_MARKS)), E.REQUEST_ARRIVE, E.REQUEST_FIRST_TEXT,
                  E.REQUEST_FIRST_AUDIO, E.REQUEST_END, E.REQUEST_TRACE_HI, E.REQUEST_TRACE_LO)
_STAGE_KINDS = (E.STAGE_ADD, E.STAGE_SCHEDULE, E.STAGE_FINISH, E.STAGE_EMIT)
_CHUNK_KINDS = tuple(k for _, b, e in _PAIRS for k in (b, e))
_SENDER_KINDS = (E.FIFO_DEQUEUE, E.PROCESS_END, E.PUT_END)
_KNOWN = np.zeros(256, bool)
for _k in (*_REQUEST_KINDS, *_STAGE_KINDS, *_CHUNK_KINDS, E.STEP_BEGIN, E.STEP_END,
           E.STAGE_DIED, E.DELIVERY_TIMEOUT):
    _KNOWN[int(_k)] = True
assert not _KNOWN[255]  # kinds past 255 read _KNOWN[255]: unknown (_decodec.group relies on it)
_KNOWN_BYTES = _KNOWN.tobytes()
# the known kinds a feed keeps when no chunk span is wanted: all but the chunk stamps (at
# 150M events, 95% of them; counted, never copied)
_UNCHUNKED = _KNOWN.copy()
_UNCHUNKED[[int(k) for k in _CHUNK_KINDS]] = False
_UNCHUNKED_BYTES = _UNCHUNKED.tobytes()
_EMPTY_EV = np.empty(0, EVENT_DTYPE)
_DEQUEUE, _PROCESS_END, _PUT_END = (int(k) for k in (E.FIFO_DEQUEUE, E.PROCESS_END, E.PUT_END))
# Busy intervals a sender keeps: those a FIFO span still to be built may overlap, i.e. ending
# after the oldest enqueue still waiting for its dequeue, or less than SENDER_LATE_S before
# the newest event (an enqueue drained late from another ring); at most SENDER_CAP (memory
# bound, live) -- a one-feed report keeps all of them while it builds its spans.
SENDER_LATE_S = 10.0
SENDER_CAP = 1 << 20
CULPRIT_COLUMNS = ("by0", "by1", "by2")  # a FIFO span's top culprits
# where a chunk span's figure comes from, by name (chunk_rows_reference): 1 its begin's ``a``,
# 0 nowhere, else (2) its end's ``a``
_FIGURE_FROM = {N_FIFO: 1, N_WAIT: 0}
_POLL_ROWS = 3  # chunk_spans' figure_from of poll lag rows (poll_rows_reference)
_spanc = rowops.compiled("_spanc", E=EVENT_DTYPE, S=CHUNK_DTYPE)
# group_reference's answer: rows, their indexes, kind starts, unknown, steps, max ring,
# events per (ring, kind) (or None)
Grouped = tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int, "np.ndarray | None"]


def group_reference(ev: np.ndarray, chunks: bool = True, rings: int = 0) -> Grouped:
    """The feed's events of a known kind that carry a request, grouped by kind in feed
    order (a stable radix sort): (those rows, each one's index in ``ev``, ``starts``: kind
    k's rows are ``rows[starts[k]:starts[k + 1]]``, events of no known kind, events of a
    known kind without a request, the greatest ring of all, -1: none, and where ``rings``
    is given, the events per ring and kind of every ring: :func:`ring_kinds_reference` of
    ``max(rings, greatest ring + 1)`` rings); ``chunks`` False: no chunk stamp among the
    rows (still counted as known). The rule; ``_decodec.group`` does the same in C."""
    kind = ev["kind"]
    known = _KNOWN[np.minimum(kind, 255)]
    has_req = ev["req"] != 0
    unknown, steps = int(len(ev) - known.sum()), int(np.count_nonzero(known & ~has_req))
    kept = known if chunks else _UNCHUNKED[np.minimum(kind, 255)]
    pos = np.flatnonzero(kept & has_req)
    order = pos[np.argsort(kind[pos], kind="stable")]
    starts = np.searchsorted(kind[order], np.arange(257))
    max_ring = int(ev["ring"].max()) if len(ev) else -1
    counts = ring_kinds_reference(ev, max(rings, max_ring + 1)) if rings else None
    return rowops.take(ev, order), order, starts, unknown, steps, max_ring, counts


def ring_kinds_reference(ev: np.ndarray, rings: int) -> np.ndarray:
    """The events per (ring, kind) of rings 0..``rings``-1 and kinds up to 255 (int64,
    ``(rings, 256)``): what a load counts per thread (``spanload.Loaded.ring_kinds``), and
    where it looks for the rare kinds it keeps whole."""
    ring, kind = ev["ring"].astype(np.int64), ev["kind"].astype(np.int64)
    ok = (ring >= 0) & (ring < rings) & (kind <= 255)
    return np.bincount(ring[ok] * 256 + kind[ok], minlength=rings * 256).reshape(rings, 256)


def _group(ev: np.ndarray, chunks: bool, rings: int = 0) -> Grouped:
    if _decodec is None:
        return group_reference(ev, chunks, rings)
    ev = np.ascontiguousarray(ev)
    rows, pos, starts = np.empty(len(ev), EVENT_DTYPE), np.empty(len(ev), np.int64), np.empty(257, np.int64)
    counts = np.zeros((rings, 256), np.int64) if rings else None
    kept, unknown, steps, max_ring, uncounted = _decodec.group(
        ev, _KNOWN_BYTES, rows, pos, starts, _KNOWN_BYTES if chunks else _UNCHUNKED_BYTES,
        *(() if counts is None else (counts,)))
    if uncounted and max_ring >= rings:  # a ring past those described: counted again, all of them
        counts = ring_kinds_reference(ev, max_ring + 1)
    return rows[:kept], pos[:kept], starts, unknown, steps, max_ring, counts


def of_kinds_reference(ev: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """The rows of ``ev`` whose kind is one of ``kinds`` (bool by kind, 256; none past 255),
    in order: the rule ``_decodec.of_kinds`` follows."""
    kind = ev["kind"]
    return rowops.select(ev, (kind <= 255) & kinds[np.minimum(kind, 255)])


def of_kinds(ev: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """:func:`of_kinds_reference`, compiled where built (one pass, no mask)."""
    if _decodec is None:
        return of_kinds_reference(ev, kinds)
    ev = np.ascontiguousarray(ev)
    out = np.empty(len(ev), EVENT_DTYPE)
    return out[:_decodec.of_kinds(ev, kinds.astype(bool).tobytes(), out)]


class _ByKind:
    """One feed's events grouped by kind (:func:`group_reference`): each kind, or range of
    kinds, is a contiguous slice, not a mask over the whole feed. ``pos`` keeps each
    event's place in the feed (ring order), which breaks ties between equal stamps."""

    __slots__ = ("ev", "_starts", "pos")

    def __init__(self, ev: np.ndarray, pos: np.ndarray, starts: np.ndarray) -> None:
        self.ev, self.pos = ev, pos
        self._starts = starts.tolist()

    def _bounds(self, first: int, last: int) -> tuple[int, int]:
        return self._starts[first], self._starts[last + 1]

    def range(self, first: int, last: int) -> np.ndarray:
        lo, hi = self._bounds(first, last)
        return self.ev[lo:hi]

    def kind(self, k: int) -> np.ndarray:
        return self.range(k, k)

    def in_time_order(self, *ranges: tuple[int, int]) -> np.ndarray:
        """The events of these (first, last) kind ranges in time order (ties in feed order)."""
        rows = np.concatenate([np.arange(*self._bounds(a, b)) for a, b in ranges])
        if not len(rows):
            return _EMPTY_EV
        return rowops.take(self.ev, rows[np.lexsort((self.pos[rows], self.ev["t"][rows]))])  # rows moved once


class Prepared:
    """One feed's events made ready for the builder without reading any of its state: the
    known kinds that carry a request, grouped by kind, and what derives from them alone
    (request and sender events in time order, the distinct requests, each pair kind's
    stamps in key order). A reader may make it on another thread, beside the builder's work
    on the previous feed (its few large numpy operations release the GIL), or in another
    process (:meth:`arrays`: the loader's helper, ``spanload.py``)."""

    __slots__ = ("events", "max_ring", "unknown", "steps", "emitted", "small", "senders", "reqs",
                 "latest", "pairs", "gets", "closed", "ring_kinds")

    def __init__(self, ev: np.ndarray, chunks: bool = True, rings: int = 0) -> None:
        """``chunks``: make the chunk spans' and the senders' stamps ready; without them the
        builder makes request, stage and queue spans only, and the same ones (a request's
        latest event, where an incomplete one ends, is still taken over all its events).
        ``rings`` (the rings described, at least): count the events per ring and kind
        (``ring_kinds``, of every ring: :func:`group_reference`; the reader's, it does not
        travel in :meth:`arrays`)."""
        self.events = len(ev)
        rows, pos, starts, self.unknown, self.steps, self.max_ring, self.ring_kinds = _group(ev, chunks, rings)
        by = _ByKind(rows, pos, starts)
        # the distinct requests, and each one's latest event: (ids, times), over every
        # event of a known kind (grouped: in kind order, which the answer does not depend on)
        self.reqs, self.latest = _requests(by.ev) if chunks else _requests(ev, known=True)
        ev = by.ev
        self.emitted = by.kind(E.STAGE_EMIT)
        self.small = by.in_time_order((reqstate.FIRST_KIND, reqstate.LAST_KIND))
        self.senders, self.gets = _EMPTY_EV, _EMPTY_EV
        self.pairs = [(_EMPTY_EV, _EMPTY_EV)] * len(_PAIRS)
        if chunks:
            self.senders = by.in_time_order(*((k, k) for k in _SENDER_KINDS))
            # each pair kind's begins and ends (the builder's match sorts them by key, with
            # the stamps it carries: sorting them here too cost the decoding process ~20%)
            self.pairs = [(by.kind(b), by.kind(e)) for _, b, e in _PAIRS]
            self.gets = by.kind(E.GET_BEGIN)  # the poll lag's ends, by producer
        # the sender tasks ``senders`` close, where a SenderTasks outside the builder has
        # taken them (the report's helper process); None: the builder takes them
        self.closed: Closed | None = None

    # what :meth:`arrays` gives, in order: dtypes of the arrays after the plain values
    ARRAY_DTYPES = (EVENT_DTYPE, EVENT_DTYPE, *(np.dtype(np.int64),) * 4, np.dtype(np.uint32),
                    *(EVENT_DTYPE,) * (2 * len(_PAIRS) + 1))

    def arrays(self) -> tuple[tuple, list[np.ndarray]]:
        """Itself, its sender events taken as ``closed`` tasks (set them first), as (plain
        values, arrays of ``ARRAY_DTYPES``), for :meth:`of_arrays` in another process."""
        closed = self.closed
        if closed is None:  # the sender events themselves do not travel
            raise ValueError("Prepared.arrays: closed (SenderTasks.close of senders) not set")
        senders = [(pid, stage, len(starts)) for pid, stage, starts, _, _ in closed]
        tasks = [np.concatenate([c[i] for c in closed]) if closed else np.zeros(0, self.ARRAY_DTYPES[i + 2])
                 for i in (2, 3, 4)]
        return ((self.events, self.max_ring, self.unknown, self.steps, self.reqs, senders),
                [self.emitted, self.small, *self.latest, *tasks,
                 *(a for pair in self.pairs for a in pair), self.gets])

    @classmethod
    def of_arrays(cls, values: tuple, arrays: list[np.ndarray]) -> "Prepared":
        p = cls.__new__(cls)
        p.events, p.max_ring, p.unknown, p.steps, p.reqs, senders = values
        p.emitted, p.small, ids, times, starts, ends, reqs, *pairs, p.gets = arrays
        p.latest = (ids, times)
        p.ring_kinds = None
        p.pairs = list(zip(pairs[::2], pairs[1::2]))
        p.senders = _EMPTY_EV
        p.closed = []
        lo = 0
        for pid, stage, n in senders:
            p.closed.append((pid, stage, starts[lo:lo + n], ends[lo:lo + n], reqs[lo:lo + n]))
            lo += n
        return p


def requests_reference(ev: np.ndarray, known: bool = False) -> tuple[list[int], tuple[np.ndarray, np.ndarray]]:
    """The distinct requests of events ``ev`` and (them, each one's latest ``t``);
    ``known``: of its events of a known kind with a request only. The rule;
    ``_decodec.latest`` does the same in C where they span a narrow range."""
    if known:
        ev = ev[_KNOWN[np.minimum(ev["kind"], 255)] & (ev["req"] != 0)]
    reqs = rowops.distinct(ev["req"])
    return reqs, _latest(ev["req"], ev["t"], reqs)


def _requests(ev: np.ndarray, known: bool = False) -> tuple[list[int], tuple[np.ndarray, np.ndarray]]:
    if _decodec is None or not len(ev):
        return requests_reference(ev, known)
    # ~9 MB of address space, of which only the pages up to hi - lo are touched
    top, seen = np.empty(_NARROW_REQUESTS, np.int64), np.empty(_NARROW_REQUESTS, np.uint8)
    lo, hi = _decodec.latest(np.ascontiguousarray(ev), top, seen, *((_KNOWN_BYTES,) if known else ()))
    if lo > hi:  # none counted
        return [], (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if hi - lo >= _NARROW_REQUESTS:
        return requests_reference(ev, known)
    at = np.flatnonzero(seen[:hi - lo + 1])
    return (at + lo).tolist(), (at + lo, top[at])


_NARROW_REQUESTS = 1 << 20  # requests spanning fewer ids: a table by id (rowops.distinct, _latest)


def _latest(req: np.ndarray, t: np.ndarray, reqs: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct ``reqs``, each one's latest ``t``)."""
    ids = np.array(reqs, np.int64)
    if not len(ids):
        return ids, np.zeros(0, np.int64)
    lo, hi = int(ids[0]), int(ids[-1])
    if hi - lo >= 1 << 20:  # a wide range (an old request beside new ones): by a sort
        order = np.argsort(req, kind="stable")
        return ids, np.maximum.reduceat(t[order], np.searchsorted(req[order], ids))
    top = np.full(hi - lo + 1, np.iinfo(np.int64).min, np.int64)
    # contiguous values: ufunc.at over a strided field takes its slow path (~7x)
    np.maximum.at(top, np.subtract(req, lo, dtype=np.int64), np.ascontiguousarray(t))
    return ids, top[ids - lo]


def _key(req: np.ndarray, stage: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """(request, stage, chunk) as one sortable int64 (stage < 127, chunk < 2^24)."""
    return ((req.astype(np.int64) << 31) | ((stage.astype(np.int64) + 1) << 24)
            | (chunk.astype(np.int64) + 1))


def _event_keys(ev: np.ndarray, stage: str = "stage") -> np.ndarray:
    """:func:`_key` of events' (request, ``ev[stage]``, chunk); compiled where built."""
    if _spanc is None or not len(ev):
        return _key(ev["req"], ev[stage], ev["chunk"])
    out = np.empty(len(ev), np.int64)
    _spanc.event_keys(np.ascontiguousarray(ev), stage == "b", out)
    return out


def sender_tasks(seq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """THE sender rule, over one sender's events in time order (FIFO_DEQUEUE, PROCESS_END,
    PUT_END; others are ignored): a task occupies the sender from its dequeue to its own
    PUT_END, a 0-byte PROCESS_END of its chunk, or the next dequeue, whichever comes first
    (the sender does one at a time; a closer of another task falls back to the next
    dequeue). A batch, dequeues stamped at one instant (MRv2's output worker takes several
    requests off its queue at once and builds them in turn, their puts on another thread),
    is worked through in order: each of its tasks ends at its own PROCESS_END and starts
    where the one before it ended. Returns (indices of the dequeues of closed tasks, their
    start and end times, index of the first dequeue still open, or ``len(seq)``)."""
    n = len(seq)
    if _decodec is None or not n:
        return sender_tasks_reference(seq)
    seq = np.ascontiguousarray(seq)
    deq = np.flatnonzero(seq["kind"] == E.FIFO_DEQUEUE)
    if not len(deq):
        return deq, np.empty(0, np.int64), np.empty(0, np.int64), n
    start, end, j = (np.empty(len(deq), np.int64) for _ in range(3))
    _decodec.sender_tasks(seq, _DEQUEUE, _PROCESS_END, _PUT_END, deq, start, end, j)
    done = j < n
    open_ = deq[~done]
    return deq[done], start[done], end[done], int(open_[0]) if len(open_) else n


def sender_tasks_reference(seq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`sender_tasks` in numpy: the statement of the rule ``_decodec.sender_tasks``
    follows (tests/unit/test_decodec.py compares the two)."""
    kinds, n = seq["kind"], len(seq)
    deq = np.flatnonzero(kinds == E.FIFO_DEQUEUE)
    if not len(deq):
        return deq, np.empty(0, np.int64), np.empty(0, np.int64), n
    closer = np.flatnonzero((kinds == E.PUT_END) | ((kinds == E.PROCESS_END) & (seq["a"] == 0))
                            | (kinds == E.FIFO_DEQUEUE))
    nxt = np.searchsorted(closer, deq, "right")
    has = nxt < len(closer)
    j = np.where(has, closer[np.minimum(nxt, len(closer) - 1)], n)
    jj = np.minimum(j, n - 1)
    kj = kinds[jj]
    same = seq["req"][jj] == seq["req"][deq]
    valid = has & ((kj == E.FIFO_DEQUEUE)
                   | (same & ((kj == E.PUT_END) | (seq["chunk"][jj] == seq["chunk"][deq]))))
    next_deq = np.append(deq[1:], n)  # deq ascends: each one's next is the next in it
    j = np.where(valid, j, next_deq)
    t = seq["t"]
    starts = t[deq].copy()
    batch = _batched(t[deq])
    if batch.any():
        own = _own_process_end(seq, deq)
        j = np.where(batch, own, j)
        prev_end = np.where(batch[:-1] & batch[1:] & (t[deq][1:] == t[deq][:-1]) & (j[:-1] < n),
                            t[np.minimum(j[:-1], n - 1)], 0)
        starts[1:] = np.maximum(starts[1:], prev_end)
    done = j < n
    d = deq[done]
    open_ = deq[~done]
    return d, starts[done], np.maximum(t[j[done]], starts[done]), int(open_[0]) if len(open_) else n


def _batched(t: np.ndarray) -> np.ndarray:
    """Which of these dequeue times (ascending) share their instant with another."""
    same = t[1:] == t[:-1]
    out = np.zeros(len(t), bool)
    out[1:] |= same
    out[:-1] |= same
    return out


def _own_process_end(seq: np.ndarray, deq: np.ndarray) -> np.ndarray:
    """For each dequeue, the index of the first PROCESS_END after it of its own request and
    chunk (``len(seq)``: none yet)."""
    n = len(seq)
    pe = np.flatnonzero(seq["kind"] == E.PROCESS_END)
    out = np.full(len(deq), n, np.int64)
    if not len(pe):
        return out
    key = (seq["req"].astype(np.int64) << 32) | (seq["chunk"].astype(np.int64) & 0xFFFFFFFF)
    uk, g = np.unique(key[pe], return_inverse=True)
    comp = np.sort(g * (n + 1) + pe)
    qg = np.minimum(np.searchsorted(uk, key[deq]), len(uk) - 1)
    hit = np.searchsorted(comp, qg * (n + 1) + deq, "right")
    ok = (uk[qg] == key[deq]) & (hit < len(comp))
    found = comp[np.minimum(hit, len(comp) - 1)]
    ok &= found // (n + 1) == qg
    out[ok] = (found % (n + 1))[ok]
    return out


def match(bkey: np.ndarray, bt: np.ndarray, ekey: np.ndarray, et: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """Pair the k-th begin of each key (by time) with the k-th end of that key.
    Returns index arrays (into the inputs) of the matched begins and their ends, in
    (key, k) order; compiled where built (the same pairs as :func:`pair_reference`)."""
    if not len(bkey) or not len(ekey):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    (bo, bk), (eo, ek) = _by_key_then_time(bkey, bt), _by_key_then_time(ekey, et)
    if _spanc is None:
        return pair_reference(bk, bo, ek, eo)
    n = min(len(bk), len(ek))
    bi, ei = np.empty(n, np.int64), np.empty(n, np.int64)
    n = _spanc.pair_sorted(bk, bo.astype(np.int64, copy=False), ek, eo.astype(np.int64, copy=False), bi, ei)
    return bi[:n], ei[:n]


def _by_key_then_time(key: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stamps' order by key, then time, then arrival; and the keys in it. One stable
    sort by key: a repeated key's stamps stay in arrival order, which is almost always
    their time order already (one ring records them); only where it is not does time
    break the ties (lexsort: the same order, at more cost)."""
    order, k = stable_key_order(key)
    tie = k[1:] == k[:-1]
    if tie.any():
        ts = t[order]
        if (tie & (ts[1:] < ts[:-1])).any():
            order = np.lexsort((t, key))
            k = key[order]
    return order, k


def stable_key_order(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.argsort(key, kind="stable")`` and the keys in that order. Where each key (less
    the least) and its position fit one int64 side by side, one plain sort of those: the
    values are distinct, so any sort is stable, and numpy's vectorized int64 sort is ~5x
    quicker than its stable one (a feed's keys span its requests' range, well within)."""
    n = len(key)
    if n and key.dtype == np.int64:
        lo = int(key.min())
        bits = max(n - 1, 1).bit_length()
        if int(key.max()) - lo < 1 << (63 - bits):
            packed = ((key - lo) << bits) | np.arange(n, dtype=np.int64)
            packed.sort()
            return packed & ((1 << bits) - 1), (packed >> bits) + lo
    order = np.argsort(key, kind="stable")
    return order, key[order]


def emit_order(ev: np.ndarray, replica: np.ndarray) -> np.ndarray:
    """``np.lexsort((ev["t"], replica, ev["stage"], ev["req"]))`` by two stable sorts: by
    time, then by (request, stage, replica) packed in one int64 where it fits (each by
    :func:`stable_key_order`; ~3x quicker than the four-key lexsort)."""
    if len(ev):
        by_t, _ = stable_key_order(ev["t"])
        req = ev["req"][by_t].astype(np.int64)
        stage, rep = ev["stage"][by_t].astype(np.int64), replica[by_t].astype(np.int64)
        s_lo, r_lo = int(stage.min()), int(rep.min())
        s_bits, r_bits = (int(stage.max()) - s_lo).bit_length(), (int(rep.max()) - r_lo).bit_length()
        if int(req.min()) >= 0 and int(req.max()) < 1 << (62 - s_bits - r_bits):
            group = (req << (s_bits + r_bits)) | ((stage - s_lo) << r_bits) | (rep - r_lo)
            return by_t[stable_key_order(group)[0]]
    return np.lexsort((ev["t"], replica, ev["stage"], ev["req"]))


def pair_reference(bk: np.ndarray, bo: np.ndarray, ek: np.ndarray, eo: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`match`'s pairing of begins and ends in (key, time) order (``bk``/``ek``: their
    keys, ``bo``/``eo``: their indexes), in numpy: ``_spanc.pair_sorted`` follows it."""
    nb = len(bk)
    if (bk[1:] != bk[:-1]).all():  # every begin key once: the first end of the key, if any
        lo = np.searchsorted(ek, bk, "left")
        ok = ek[np.minimum(lo, len(ek) - 1)] == bk
        return bo[ok], eo[lo[ok]]
    # repeated keys (a chunk index held over several steps): a stable sort of the two sorted
    # runs side by side merges them in one pass, each key's begins before its ends (three
    # binary searches cost ~2x); of a key with b begins and e ends, begin j < min(b, e)
    # pairs with end j
    both = np.concatenate((bk, ek))
    order = np.argsort(both, kind="stable")
    k = both[order]
    head = np.ones(len(k), bool)
    head[1:] = k[1:] != k[:-1]
    starts = np.flatnonzero(head)
    begins = np.add.reduceat((order < nb).astype(np.int64), starts)
    ends = np.diff(np.append(starts, len(k))) - begins
    owner, pos = intervals.expand_ranges(starts, starts + np.minimum(begins, ends))
    return bo[order[pos]], eo[order[pos + begins[owner]] - nb]


def _joined(waiting: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Stamps still waiting for a partner, then a feed's new ones (no copy where none wait)."""
    return rowops.concat((waiting, new), EVENT_DTYPE) if len(waiting) else new


class _Pool:
    """Unpaired stamps of one pair kind (begins and ends), carried between feeds."""

    __slots__ = ("begins", "ends")

    def __init__(self) -> None:
        self.begins = _EMPTY_EV
        self.ends = _EMPTY_EV


@dataclass
class _Sender:
    """Busy intervals of one sender (sorted, non-overlapping)."""

    starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    ends: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    reqs: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint32))


# the tasks a feed's sender events closed, per sender: (pid, stage, starts, ends, requests),
# each in time order (``Feed.busy``)
Closed = list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]


class SenderTasks:
    """:func:`sender_tasks` applied feed by feed: each sender's (pid, stage) events from
    its open dequeue on wait for the next feed. The builder keeps one; the report's helper
    process keeps its own and hands the builder each feed's closed tasks
    (``Prepared.closed``): the same events in the same order, the same tasks."""

    def __init__(self) -> None:
        self.tails: dict[tuple[int, int], np.ndarray] = {}

    def close(self, ev: np.ndarray, pids: np.ndarray) -> Closed:
        """This feed's sender events in time order (``Prepared.senders``; ``pids``: pid by
        ring) -> the tasks they close."""
        groups: dict[tuple[int, int], np.ndarray] = {}
        for k, rows in keys.groups(keys.sender_key(pids[ev["ring"]], ev["stage"])):
            groups[keys.sender_of(k)] = rowops.take(ev, rows)
        out: Closed = []
        for key in set(groups) | {k for k, tail in self.tails.items() if len(tail)}:
            new, tail = groups.get(key, _EMPTY_EV), self.tails.get(key, _EMPTY_EV)
            seq = rowops.concat((tail, new), EVENT_DTYPE) if len(tail) else new
            if not len(seq):
                continue
            d, start, end, open_from = sender_tasks(seq)
            if len(d):
                out.append((*key, start, end, seq["req"][d]))
            self.tails[key] = seq[open_from:] if open_from < len(seq) else _EMPTY_EV
        return out


def ring_column(rings: dict[int, dict], n: int, name: str) -> np.ndarray:
    """``name`` (pid, replica) of rings 0..n-1 as an int64 array (0 where unknown)."""
    return np.array([rings.get(i, {}).get(name, 0) for i in range(n)], np.int64)


def _empty(dtype: np.dtype):
    return field(default_factory=lambda: np.zeros(0, dtype))


@dataclass
class SpanTables:
    """Finished spans, a table per kind, and their stage spans' emits (with the request
    spans' API marks): the one currency from the builder to every reader. A plain value:
    the tables of several feeds concatenate, a set of requests' rows select."""

    requests: np.ndarray = _empty(REQUEST_DTYPE)
    visits: np.ndarray = _empty(VISIT_DTYPE)
    chunks: np.ndarray = _empty(CHUNK_DTYPE)
    emits: np.ndarray = _empty(EMIT_DTYPE)

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.requests, self.visits, self.chunks, self.emits

    def __len__(self) -> int:
        """The spans (the emits are not spans)."""
        return len(self.requests) + len(self.visits) + len(self.chunks)

    def rows(self) -> int:
        """Every row, emits included."""
        return len(self) + len(self.emits)

    def span_reqs(self) -> np.ndarray:
        """Each span's request id in span order -- chunk spans, request spans, then stage
        and queue spans -- the order the span objects made of the tables come in."""
        return np.concatenate((self.chunks["req"], self.requests["req"], self.visits["req"]))

    def slices(self) -> np.ndarray:
        """Every span's common columns (:data:`SLICE_DTYPE`), in span order: the one
        table of all spans, as Perfetto's ``slice`` beside its per-kind tables."""
        out = np.empty(len(self), SLICE_DTYPE)
        lo = 0
        for t in (self.chunks, self.requests, self.visits):
            part = out[lo:lo + len(t)]
            for col in SLICE_DTYPE.names:
                if col in t.dtype.names:
                    part[col] = t[col]
            lo += len(t)
        r = out[len(self.chunks):len(self.chunks) + len(self.requests)]
        r["name"], r["stage"] = N_REQUEST, cv.API_STAGE
        return out

    def where_request(self, keep: Callable[[np.ndarray], np.ndarray]) -> "SpanTables":
        """The rows whose request ``keep(req column)`` (a mask) keeps."""
        return SpanTables(*(rowops.select(t, keep(t["req"])) for t in self.tables()))

    def of(self, reqs: np.ndarray) -> "SpanTables":
        """The rows of request ids ``reqs``."""
        return self.where_request(lambda r: np.isin(r, reqs))

    @staticmethod
    def concat(parts: list["SpanTables"]) -> "SpanTables":
        return SpanTables(*(rowops.concat([p.tables()[i] for p in parts], d)
                            for i, d in enumerate(TABLE_DTYPES)))


TABLE_DTYPES = (REQUEST_DTYPE, VISIT_DTYPE, CHUNK_DTYPE, EMIT_DTYPE)  # SpanTables' order
# what every span has (SpanTables.slices): a request span's stage is API_STAGE
SLICE_DTYPE = np.dtype([("name", "i1"), ("reason", "i1"), ("stage", "<i2"), ("replica", "<i2"),
                        ("req", "<u4"), ("ring", "<i4"), ("start", "<i8"), ("end", "<i8")])


@dataclass
class Feed:
    """What one feed produced: its finished spans (:class:`SpanTables`) and the request
    events it saw."""

    spans: SpanTables = field(default_factory=SpanTables)
    # request latencies as their events arrive: first text, first audio, end (the event's
    # kind): (kind, req, replica, seconds since arrival, unix ns of the event)
    latencies: list[tuple[int, int, int, float, int]] = field(default_factory=list)
    arrivals: list[int] = field(default_factory=list)  # requests that arrived
    # the caller's trace context of requests that carried one: (req, trace id, parent span id)
    contexts: list[tuple[int, int, int]] = field(default_factory=list)
    ends: list[tuple[int, int]] = field(default_factory=list)  # (req, status) that ended
    # requests whose id had arrived before (a client that sent one x-request-id twice):
    # their events are joined into one id's spans
    repeated: list[int] = field(default_factory=list)
    # sender tasks closed by this feed (the FIFO-blocking rule's busy intervals), per sender:
    # (pid, stage, starts, ends, requests), each in time order
    busy: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)


class SpanBuilder:
    """Feed events, get spans. ``rings``: ring index -> ring description (pid, replica,
    process, role, stage), as in the event log's RING blocks; kept current by the caller.
    ``culprits``: name each FIFO span's top three blocking requests (by0..by2, the spans'
    ``omni.fifo.blocked_by``); the report needs only blocked_ns and skips that ranking,
    which costs a sort over every (span, sender task) overlap."""

    def __init__(self, rings: dict[int, dict] | None = None, culprits: bool = True) -> None:
        self.rings: dict[int, dict] = rings if rings is not None else {}
        self.culprits = culprits
        self._pids = np.zeros(0, np.int64)
        self._replicas = np.zeros(0, np.int64)
        self._pools = {name: _Pool() for name, _, _ in _PAIRS}
        self._poll = _Pool()  # begins: PUT_END rows, ends: GET_BEGIN rows
        self.senders: dict[tuple[int, int], _Sender] = {}
        self._tasks = SenderTasks()
        self.states = reqstate.request_states()  # each open request's and its visits'
        self.last_t = np.zeros(1024, np.int64)  # per request id: latest event time
        self.newest_t = 0  # the latest event time of any request (last_t's max, kept)
        self.dead_pids: set[int] = set()
        self.events = 0
        self.step_events = 0
        self.unknown_events = 0
        self.spans_built = 0
        self.incomplete_spans = 0
        self.requests_freed = 0
        self._busy: Closed = []

    # ------------------------------------------------------------------ rings
    def _ring_arrays(self, max_ring: int) -> None:
        n = max(max_ring + 1, max(self.rings, default=-1) + 1)
        self._pids = ring_column(self.rings, n, "pid")
        self._replicas = ring_column(self.rings, n, "replica")

    def ring_changed(self) -> None:
        """Call after adding or changing a ring description."""
        self._ring_arrays(max(self.rings, default=-1))

    def process_died(self, pid: int) -> None:
        self.dead_pids.add(pid)

    # ------------------------------------------------------------------ feed
    def feed(self, ev: np.ndarray | Prepared, now: float = 0.0) -> Feed:
        """Pair ``ev`` (EVENT_DTYPE rows, or them :class:`Prepared`) with what is waiting;
        returns finished spans."""
        p = ev if isinstance(ev, Prepared) else Prepared(ev)
        found = reqstate.Found()
        if p.max_ring >= len(self._pids):
            self._ring_arrays(p.max_ring)
        self.events += p.events
        self.unknown_events += p.unknown
        self.step_events += p.steps
        self._note_times(*p.latest)
        if len(p.emitted):
            self._stage_emits(p.emitted, now)
        if len(p.small):
            self.states.events(p.small, self._replicas, now, self.last_t, found)
        if p.reqs and len(self.states):
            self.states.seen(p.reqs, now)
        chunks = self._pair_chunks(p)
        requests, visits, emits = self.states.take()
        self._count(requests, visits)
        self.spans_built += len(chunks)  # paired chunk spans are complete: reason 0
        busy, self._busy = self._busy, []
        return Feed(SpanTables(requests, visits, chunks, emits), found.latencies, arrivals=found.arrivals,
                    ends=found.ends, contexts=[(req, *tracecontext.decode(hi, a, c, b))
                                               for req, hi, a, c, b in found.contexts],
                    busy=busy, repeated=found.repeated)

    def _count(self, *tables: np.ndarray) -> None:
        for t in tables:
            self.spans_built += len(t)
            self.incomplete_spans += int(np.count_nonzero(t["reason"]))

    def _note_times(self, ids: np.ndarray, times: np.ndarray) -> None:
        if not len(ids):
            return
        top = int(ids[-1])
        if top >= len(self.last_t):
            grown = np.zeros(max(top + 1, 2 * len(self.last_t)), np.int64)
            grown[:len(self.last_t)] = self.last_t
            self.last_t = grown
        self.last_t[ids] = np.maximum(self.last_t[ids], times)
        self.newest_t = max(self.newest_t, int(times.max()))

    # ------------------------------------------------------------------ requests, stages
    def _stage_emits(self, ev: np.ndarray, now: float) -> None:
        """STAGE_EMIT events (a = packet index, b = modality; one per output packet, most of
        the request and stage events) onto their visits a (request, stage, replica) group at
        a time, not one by one."""
        replica = self._replicas[ev["ring"]]
        order = emit_order(ev, replica)
        ev, replica = rowops.take(ev, order), replica[order]
        rows = np.empty(len(ev), EMIT_DTYPE)
        rows["req"], rows["stage"], rows["replica"], rows["t"] = ev["req"], ev["stage"], replica, ev["t"]
        rows["packet"], rows["modality"] = ev["a"], ev["b"]
        head = np.ones(len(ev), bool)
        head[1:] = ((ev["req"][1:] != ev["req"][:-1]) | (ev["stage"][1:] != ev["stage"][:-1])
                    | (replica[1:] != replica[:-1]))
        lo = np.flatnonzero(head)
        self.states.emits(rows, lo, ev["ring"][lo].astype(np.int64), now)

    # ------------------------------------------------------------------ chunks
    def _pair_chunks(self, p: Prepared) -> np.ndarray:
        """The feed's chunk spans: every pair kind matched first, so that each writes its
        rows in place."""
        self._add_busy(self._tasks.close(p.senders, self._pids) if p.closed is None else p.closed)
        matched = []  # (name, begins, their indexes, ends, theirs)
        for (name, _, _), (b_new, e_new) in zip(_PAIRS, p.pairs):
            pool = self._pools[name]
            B, En = _joined(pool.begins, b_new), _joined(pool.ends, e_new)
            bi, ei = match(_event_keys(B), B["t"], _event_keys(En), En["t"])
            if len(bi):
                matched.append((name, B, bi, En, ei))
            pool.begins = rowops.delete(B, bi)
            pool.ends = rowops.delete(En, ei)
        # poll lag: producer PUT_END (request, stage, chunk) -> consumer GET_BEGIN
        # (request, b = producer stage, chunk)
        pool = self._poll
        P = _joined(pool.begins, p.pairs[_PUT][1])
        G = _joined(pool.ends, p.gets)
        pi, gi = match(_event_keys(P), P["t"], _event_keys(G, "b"), G["t"])
        pool.begins = rowops.delete(P, pi)
        pool.ends = rowops.delete(G, gi)
        out = np.empty(sum(len(m[2]) for m in matched) + len(pi), CHUNK_DTYPE)
        lo = 0
        for name, B, bi, En, ei in matched:
            self._chunk_rows(out[lo:lo + len(bi)], name, B, bi, En, ei)
            lo += len(bi)
        self._trim_senders()
        if len(pi):
            self._poll_rows(out[lo:lo + len(pi)], P, pi, G, gi)
        return out

    def _poll_rows(self, rows: np.ndarray, P: np.ndarray, pi: np.ndarray, G: np.ndarray,
                   gi: np.ndarray) -> None:
        """Poll lag rows, in place: from the producer's PUT_END ``P[pi[i]]`` to the
        GET_BEGIN ``G[gi[i]]``; compiled where built."""
        if _spanc is None:
            rowops.assign(rows, 0, self.poll_rows_reference(rowops.take(P, pi), rowops.take(G, gi)))
        else:
            _spanc.chunk_spans(np.ascontiguousarray(P), pi.astype(np.int64, copy=False),
                               np.ascontiguousarray(G), gi.astype(np.int64, copy=False),
                               self._replicas, N_POLL, _POLL_ROWS, rows)

    def poll_rows_reference(self, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Poll lag rows from the producer's PUT_ENDs ``p`` to their GET_BEGINs ``g``: the
        rule ``_spanc.chunk_spans`` follows (``_POLL_ROWS``)."""
        rows = np.zeros(len(p), CHUNK_DTYPE)
        rows["name"] = N_POLL
        rows["stage"], rows["peer"], rows["chunk"] = g["stage"], p["stage"], g["chunk"]
        rows["replica"] = self._replicas[g["ring"]]
        rows["req"], rows["ring"] = g["req"], g["ring"]
        rows["start"], rows["end"] = p["t"], np.maximum(g["t"], p["t"])
        return rows

    def _span_rows(self, name: int, first: np.ndarray, peer_from: np.ndarray) -> np.ndarray:
        """Span rows named by their first stamp (request, stage, chunk, ring, start);
        the peer stage is ``peer_from``'s ``b``."""
        rows = np.zeros(len(first), CHUNK_DTYPE)
        rows["name"] = name
        rows["stage"], rows["chunk"], rows["req"] = first["stage"], first["chunk"], first["req"]
        rows["peer"] = peer_from["b"]
        rows["replica"] = self._replicas[first["ring"]]
        rows["ring"] = first["ring"]
        rows["start"] = first["t"]
        return rows

    def _chunk_rows(self, rows: np.ndarray, name: int, B: np.ndarray, bi: np.ndarray,
                    En: np.ndarray, ei: np.ndarray) -> None:
        """Spans of pair kind ``name``, in place: begin ``B[bi[i]]`` with end ``En[ei[i]]``;
        compiled where built (the same rows as :meth:`chunk_rows_reference`)."""
        if _spanc is None:
            rowops.assign(rows, 0, self.chunk_rows_reference(name, rowops.take(B, bi), rowops.take(En, ei)))
        else:
            bi, ei = np.ascontiguousarray(bi, np.int64), np.ascontiguousarray(ei, np.int64)
            _spanc.chunk_spans(np.ascontiguousarray(B), bi, np.ascontiguousarray(En), ei,
                               self._replicas, name, _FIGURE_FROM.get(name, 2), rows)
        if name == N_FIFO:
            self._blocked(rows, self._pids[B["ring"][bi]])

    def chunk_rows_reference(self, name: int, b: np.ndarray, e: np.ndarray) -> np.ndarray:
        """Spans of pair kind ``name`` from begins ``b`` and their ends ``e`` (blocked_ns
        not yet filled in): the rule ``_spanc.chunk_spans`` follows."""
        rows = self._span_rows(name, b, e)
        rows["end"] = np.maximum(e["t"], b["t"])
        if name == N_FIFO:
            rows[AHEAD] = b["a"]
        elif name == N_SNAPSHOT:
            rows[STRATEGY] = e["a"]
        elif name != N_WAIT:
            rows[BYTES] = e["a"]
        return rows

    # ------------------------------------------------------------------ FIFO blocking
    def _add_busy(self, closed: Closed) -> None:
        """Extend each sender's busy intervals with the tasks this feed closed."""
        for pid, stage, starts, end, reqs in closed:
            snd = self.senders.get((pid, stage))
            if snd is None:
                snd = self.senders[(pid, stage)] = _Sender()
            snd.starts = np.concatenate((snd.starts, starts))
            snd.ends = np.concatenate((snd.ends, end))
            snd.reqs = np.concatenate((snd.reqs, reqs))
        self._busy.extend(closed)

    def _trim_senders(self) -> None:
        if not self.senders:
            return
        waiting = self._pools[N_FIFO].begins
        horizon = self.newest_t - int(SENDER_LATE_S * 1e9)
        if len(waiting):
            horizon = min(horizon, int(waiting["t"].min()))
        for snd in self.senders.values():
            keep = max(int(np.searchsorted(snd.ends, horizon, "left")), len(snd.ends) - SENDER_CAP)
            if keep > 0:
                snd.starts, snd.ends, snd.reqs = snd.starts[keep:], snd.ends[keep:], snd.reqs[keep:]

    def _blocked(self, rows: np.ndarray, pids: np.ndarray) -> None:
        """blocked_ns (BLOCKED) of complete FIFO spans, in place: the time their sender worked on
        other requests' tasks while they waited (``intervals.other_overlap``). With
        ``culprits``, also by0..by2: the top three other requests by overlap."""
        for k, sel in keys.groups(keys.sender_key(pids, rows["stage"])):
            snd = self.senders.get(keys.sender_of(k))
            if snd is None or not len(snd.starts):
                continue
            wait = rows["start"][sel], rows["end"][sel], rows["req"][sel]
            rows[BLOCKED][sel] = intervals.other_overlap(snd.starts, snd.ends, snd.reqs, *wait)
            if self.culprits:
                q, culprit, rank = intervals.top_others(snd.starts, snd.ends, snd.reqs, *wait,
                                                        len(CULPRIT_COLUMNS))
                for r, col in enumerate(CULPRIT_COLUMNS):
                    m = rank == r
                    rows[col][sel[q[m]]] = culprit[m]

    # ------------------------------------------------------------------ lifetime
    def tick(self, now: float, grace_s: float = 2.0, ended_timeout_s: float = 30.0,
             idle_timeout_s: float = 120.0) -> Feed:
        """Free requests that completed ``grace_s`` ago or went idle (live use)."""
        gone = dict(self.states.expired(now, grace_s, ended_timeout_s, idle_timeout_s))
        # stamps waiting for a partner whose request has no request/stage state (freed
        # already, or a run without API and stage hooks): out after the idle timeout
        horizon = self.newest_t - int(idle_timeout_s * 1e9)
        for pool in (*self._pools.values(), self._poll):
            for rows in (pool.begins, pool.ends):
                if len(rows):
                    for r in np.unique(rows["req"][rows["t"] < horizon]).tolist():
                        if r not in self.states and self.last_t[r] < horizon:
                            gone[r] = R_TIMEOUT
        return self.flush(gone) if gone else Feed()

    def flush(self, which: dict[int, int] | None = None, reason: int = R_RUN_ENDED) -> Feed:
        """Emit everything still open of the requests in ``which`` (request -> reason), or
        of every request (end of run), as incomplete spans; forget them."""
        if which is None:
            which = {req: reason for req in self.states.live()}
            pools_all = True
        else:
            pools_all = False
        out = []
        ids = np.fromiter(which, np.int64, len(which))
        codes = np.zeros(int(ids.max()) + 1 if len(ids) else 1, np.int8)
        for req, r in which.items():
            codes[req] = r
        pools = [(name, p, False) for name, p in self._pools.items()] + [(N_POLL, self._poll, True)]
        for name, pool, is_poll in pools:
            for side in ("begins", "ends"):
                rows = getattr(pool, side)
                if not len(rows):
                    continue
                sel = np.ones(len(rows), bool) if pools_all else np.isin(rows["req"], ids)
                if not sel.any():
                    continue
                stale, rest = rows[sel], rows[~sel]
                setattr(pool, side, rest)
                if is_poll:
                    continue  # a poll lag without both ends is no interval
                out.append(self._incomplete(name, stale, side == "begins", codes))
        dead = np.isin(self._pids, np.fromiter(self.dead_pids, np.int64)).astype(np.uint8)
        self.requests_freed += self.states.flush(list(which.items()), self.last_t, dead)
        chunks = rowops.concat(out, CHUNK_DTYPE)
        requests, visits, emits = self.states.take()
        self._count(chunks, requests, visits)
        return Feed(SpanTables(requests, visits, chunks, emits))

    def _incomplete(self, name: int, ev: np.ndarray, begun: bool, codes: np.ndarray) -> np.ndarray:
        rows = self._span_rows(name, ev, ev)
        if begun:  # began, never ended: up to the request's last event
            rows["end"] = np.maximum(ev["t"], self.last_t[ev["req"].astype(np.int64)])
            if name == N_FIFO:
                rows[AHEAD] = ev["a"]
        else:  # ended, its begin lost (dropped or never drained)
            rows["end"] = ev["t"]
            if name not in (N_FIFO, N_WAIT):  # the end's own figure: strategy or bytes
                rows[STRATEGY if name == N_SNAPSHOT else BYTES] = ev["a"]
        reason = codes[np.minimum(ev["req"].astype(np.int64), len(codes) - 1)]
        dead = np.isin(self._pids[ev["ring"]], np.fromiter(self.dead_pids, np.int64))
        rows["reason"] = np.where(dead, R_WRITER_DIED, reason)
        if name == N_WAIT and begun:  # ready, never taken into a step: nobody died
            rows["reason"] = R_NEVER_SCHEDULED
        return rows

    def open_requests(self) -> int:
        return len(self.states)

    def state_size(self) -> dict:
        return {"requests": len(self.states),
                "waiting_stamps": sum(len(p.begins) + len(p.ends) for p in self._pools.values()),
                "sender_intervals": sum(len(s.starts) for s in self.senders.values())}
