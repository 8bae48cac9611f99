"""The span builder's request and stage state: each request's API events and each of its
(stage, replica) visits, from their first event until their spans are out.

Rows out: a request span (REQUEST_DTYPE) at the request's first REQUEST_END, a queue span
(VISIT_DTYPE, ``N_QUEUE``) once a visit has both its STAGE_ADD and STAGE_SCHEDULE, a stage
span (``N_STAGE``) at its first STAGE_FINISH, and a visit's packets (EMIT_DTYPE) right
after its stage span; a request span's API marks (stage ``API_STAGE``) right after it. What
is still open when a request is freed (:meth:`RequestStates.flush`: the run ended, a
writer died, a live request went idle) comes out then, marked incomplete with the reason.

:class:`RequestStates` is the rule, in Python; ``omnitrace/_reqc.c`` follows it (one
request's event at ~0.1 us, not ~1.4) and tests/unit/test_reqstate.py compares the two on
random event streams. :func:`request_states` gives the compiled one where it is built.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from omnitrace import conventions as cv
from omnitrace import rowops
from omnitrace.eventlog import EVENT_DTYPE
from omnitrace.spanrows import (EMIT_DTYPE, MARK_MODALITY, N_QUEUE, N_STAGE, R_NONE, R_TIMEOUT,
                                R_UNFINISHED, R_WRITER_DIED, REQUEST_DTYPE, VISIT_DTYPE)

E = cv.Ev

# the request and stage events' kinds as plain ints: the per-event loop compares each
# event's kind with several of them (an IntEnum member lookup costs ~0.2 us)
(_ADD, _SCHEDULE, _FINISH, _ARRIVE, _FIRST_TEXT, _FIRST_AUDIO, _TRACE_HI, _TRACE_LO,
 _END) = (int(k) for k in (E.STAGE_ADD, E.STAGE_SCHEDULE, E.STAGE_FINISH, E.REQUEST_ARRIVE,
                           E.REQUEST_FIRST_TEXT, E.REQUEST_FIRST_AUDIO, E.REQUEST_TRACE_HI,
                           E.REQUEST_TRACE_LO, E.REQUEST_END))
_MARK_KINDS = frozenset(cv.API_MARKS)  # API marks: request-span events, via the emit rows
assert all(k < _ADD for k in (*_MARK_KINDS, _ARRIVE, _FIRST_TEXT, _FIRST_AUDIO, _TRACE_HI, _TRACE_LO, _END))
assert _ADD < _SCHEDULE < _FINISH and _FINISH + 1 == int(E.STAGE_EMIT)
# the kinds :meth:`RequestStates.events` takes (a request's and its stages' but the packets)
FIRST_KIND, LAST_KIND = int(E.REQUEST_ARRIVE), _FINISH
assert _MARK_KINDS == {int(E.REQUEST_DISPATCH), int(E.REQUEST_PARSED), int(E.PACKET_RECEIVED),
                       int(E.PACKET_RESUMED)}  # the marks _reqc has built in
_reqc = rowops.compiled("_reqc", constants=dict(
    ARRIVE=E.REQUEST_ARRIVE, DISPATCH=E.REQUEST_DISPATCH, FIRST_TEXT=E.REQUEST_FIRST_TEXT,
    FIRST_AUDIO=E.REQUEST_FIRST_AUDIO, END=E.REQUEST_END, PARSED=E.REQUEST_PARSED,
    PACKET_RECEIVED=E.PACKET_RECEIVED, PACKET_RESUMED=E.PACKET_RESUMED, TRACE_HI=E.REQUEST_TRACE_HI,
    TRACE_LO=E.REQUEST_TRACE_LO, ADD=E.STAGE_ADD, SCHEDULE=E.STAGE_SCHEDULE, FINISH=E.STAGE_FINISH,
    N_STAGE=N_STAGE, N_QUEUE=N_QUEUE, R_NONE=R_NONE, R_WRITER_DIED=R_WRITER_DIED, R_UNFINISHED=R_UNFINISHED,
    R_TIMEOUT=R_TIMEOUT, API_STAGE=cv.API_STAGE, MARK_MODALITY=MARK_MODALITY),
    E=EVENT_DTYPE, R=REQUEST_DTYPE, V=VISIT_DTYPE, M=EMIT_DTYPE)


class _Stage:
    __slots__ = ("add", "sched", "finish", "status", "ring", "last", "queue_done", "done",
                 "emits")

    def __init__(self, ring: int) -> None:
        self.add = self.sched = self.finish = None
        self.status = 0
        self.ring, self.last = ring, 0
        self.queue_done = self.done = False
        self.emits: list[np.ndarray] = []  # EMIT_DTYPE rows, each array in time order


class _Req:
    __slots__ = ("arrive", "end", "first_text", "first_audio", "prompt", "max_tokens",
                 "status", "ring", "replica", "stages", "unfinished", "done", "complete_at",
                 "last_seen", "marks", "trace_hi")

    def __init__(self) -> None:
        self.arrive = self.end = self.first_text = self.first_audio = None
        self.prompt = self.max_tokens = -1
        self.status = 0
        self.ring = -1
        self.replica = 0
        self.stages: dict[tuple[int, int], _Stage] = {}
        self.unfinished = 0  # stages without a finish yet (a count: each FINISH asks)
        self.done = False
        self.complete_at: float | None = None
        self.last_seen = 0.0
        self.marks: list[tuple[int, int]] = []  # (t, kind) of API marks
        self.trace_hi: int | None = None  # the caller's trace id, high half (tracecontext)


class Found:
    """What one feed's request events said beside the rows (the builder's ``Feed`` lists):
    latencies (kind, req, replica, seconds since arrival, unix ns), arrivals, ends (req,
    status), trace contexts as recorded (req, trace hi, lo a, lo chunk, lo b) and the ids
    that arrived again."""

    __slots__ = ("latencies", "arrivals", "ends", "contexts", "repeated")

    def __init__(self) -> None:
        self.latencies: list[tuple[int, int, int, float, int]] = []
        self.arrivals: list[int] = []
        self.ends: list[tuple[int, int]] = []
        self.contexts: list[tuple[int, int, int, int, int]] = []
        self.repeated: list[int] = []


def _latency(found: Found, kind: int, req: int, st: _Req, t: int) -> None:
    """A first text, first audio or end of an arrived request, as a latency."""
    if st.arrive is not None:
        found.latencies.append((kind, req, st.replica, (t - st.arrive) / 1e9, t))


class RequestStates:
    """The rule (see the module doc). Rows collect until :meth:`take`; ``last_t`` (each
    request's latest event time, by id) ends what has no end of its own; ``dead`` (uint8 by
    ring: its writer died) turns a freed span's reason into writer-died."""

    def __init__(self) -> None:
        self.reqs: dict[int, _Req] = {}
        self._arrived: set[int] = set()  # request ids whose REQUEST_ARRIVE was seen
        self._requests: list[tuple] = []  # REQUEST_DTYPE rows
        self._visits: list[tuple] = []  # VISIT_DTYPE rows
        self._emits: list[np.ndarray] = []  # EMIT_DTYPE rows, in the order they came out
        # API mark rows (tuples) not yet in _emits: one array per run of them, not one per
        # request (a small np.array costs ~8 us)
        self._marks: list[tuple] = []

    def __len__(self) -> int:
        return len(self.reqs)

    def __contains__(self, req: int) -> bool:
        return req in self.reqs

    def _state(self, req: int, now: float) -> _Req:
        st = self.reqs.get(req)
        if st is None:
            st = self.reqs[req] = _Req()
        st.last_seen = now
        st.complete_at = None
        return st

    @staticmethod
    def _visit(st: _Req, stage: int, replica: int, ring: int) -> _Stage:
        sg = st.stages.get((stage, replica))
        if sg is None:
            sg = st.stages[(stage, replica)] = _Stage(ring)
            st.unfinished += 1
        return sg

    def events(self, ev: np.ndarray, replicas: np.ndarray, now: float, last_t: np.ndarray,
               found: Found) -> None:
        """Take ``ev`` (EVENT_DTYPE, kinds FIRST_KIND..LAST_KIND, in time order);
        ``replicas``: the replica by ring."""
        reps = replicas.tolist()
        for t, a, req, chunk, kind, stage, b, ring in ev.tolist():
            st = self._state(req, now)
            if kind >= _ADD:
                replica = reps[ring]
                sg = self._visit(st, stage, replica, ring)
                if t > sg.last:
                    sg.last = t
                if kind == _ADD:
                    if sg.add is None:
                        sg.add = t
                        if sg.sched is not None:  # the schedule was fed first (another
                            # thread's ring drained earlier): the queue span is whole now
                            self._queue_row(req, stage, replica, sg, R_NONE, None)
                elif kind == _SCHEDULE:
                    if sg.sched is None:
                        sg.sched = t
                        self._queue_row(req, stage, replica, sg, R_NONE, None)
                elif kind == _FINISH:
                    if sg.finish is None:
                        st.unfinished -= 1
                    sg.finish, sg.status = t, a
                    self._stage_row(req, stage, replica, sg, R_NONE, None)
                    if st.unfinished == 0 and self._complete(st):
                        st.complete_at = now
                continue
            st.ring, st.replica = ring, reps[ring]
            if kind == _ARRIVE:
                if st.arrive is None:
                    found.arrivals.append(req)
                if req in self._arrived:
                    found.repeated.append(req)
                self._arrived.add(req)
                st.arrive, st.prompt, st.max_tokens = t, a, b
            elif kind == _FIRST_TEXT:
                if st.first_text is None:
                    st.first_text = t
                    _latency(found, kind, req, st, t)
            elif kind == _FIRST_AUDIO:
                if st.first_audio is None:
                    st.first_audio = t
                    _latency(found, kind, req, st, t)
            elif kind == _TRACE_HI:
                st.trace_hi = a
            elif kind == _TRACE_LO:
                if st.trace_hi is not None:
                    found.contexts.append((req, st.trace_hi, a, chunk, b))
            elif kind == _END:
                if st.end is None:
                    found.ends.append((req, a))
                    _latency(found, kind, req, st, t)
                st.end, st.status = t, a
                self._request_row(req, st, R_NONE, last_t, None)
                if self._complete(st):
                    st.complete_at = now
            elif kind in _MARK_KINDS:
                st.marks.append((t, kind))

    def emits(self, rows: np.ndarray, lo: np.ndarray, ring: np.ndarray, now: float) -> None:
        """Take packets (EMIT_DTYPE rows grouped by (request, stage, replica), each group in
        time order, starting at ``lo``; ``ring``: each group's first packet's ring) onto
        their visits."""
        hi = np.append(lo[1:], len(rows)).tolist()
        last = np.maximum.reduceat(rows["t"], lo).tolist() if len(lo) else []
        for i, j, req, stage, rep, rg, t in zip(lo.tolist(), hi, rows["req"][lo].tolist(),
                                                rows["stage"][lo].tolist(), rows["replica"][lo].tolist(),
                                                ring.tolist(), last):
            sg = self._visit(self._state(req, now), stage, rep, rg)
            if t > sg.last:
                sg.last = t
            sg.emits.append(rows[i:j])

    def seen(self, reqs: Iterable[int], now: float) -> None:
        """Any event of a request keeps it alive; one after its END re-checks whether it
        is complete (the grace period counts from its last event)."""
        for r in reqs:
            st = self.reqs.get(r)
            if st is not None:
                st.last_seen = now
                if st.complete_at is not None or st.end is not None:
                    st.complete_at = now if self._complete(st) else None

    def expired(self, now: float, grace_s: float, ended_timeout_s: float,
                idle_timeout_s: float) -> list[tuple[int, int]]:
        """(request, reason) of those complete ``grace_s`` ago or gone quiet, in the order
        they first came."""
        out = []
        for req, st in self.reqs.items():
            if st.complete_at is not None and now - st.complete_at >= grace_s:
                out.append((req, R_UNFINISHED))
            elif st.end is not None and now - st.last_seen >= ended_timeout_s:
                out.append((req, R_UNFINISHED))
            elif now - st.last_seen >= idle_timeout_s:
                out.append((req, R_TIMEOUT))
        return out

    def live(self) -> list[int]:
        """The open requests, in the order they first came."""
        return list(self.reqs)

    def flush(self, which: list[tuple[int, int]], last_t: np.ndarray, dead: np.ndarray) -> int:
        """Put out what is open of the requests ``which`` ((request, reason)) and forget
        them; the number forgotten."""
        freed = 0
        for req, r in which:
            st = self.reqs.pop(req, None)
            if st is None:
                continue
            freed += 1
            for (stage, replica), sg in st.stages.items():
                if not sg.queue_done:
                    self._queue_row(req, stage, replica, sg, r, dead)
                self._stage_row(req, stage, replica, sg, R_NONE if sg.finish is not None else r, dead)
            if not st.done and (st.arrive is not None or st.end is not None):
                self._request_row(req, st, R_NONE if st.end is not None else r, last_t, dead)
        return freed

    def take(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The request, visit and emit rows put out since the last take."""
        self._flush_marks()
        out = (_rows(self._requests, REQUEST_DTYPE), _rows(self._visits, VISIT_DTYPE),
               rowops.concat(self._emits, EMIT_DTYPE))
        self._requests, self._visits, self._emits = [], [], []
        return out

    def _flush_marks(self) -> None:
        if self._marks:
            self._emits.append(np.array(self._marks, EMIT_DTYPE))
            self._marks = []

    @staticmethod
    def _complete(st: _Req) -> bool:
        if st.arrive is not None or st.end is not None:
            if st.end is None:
                return False
        elif not st.stages:
            return False
        return st.unfinished == 0

    @staticmethod
    def _reason(ring: int, reason: int, dead: np.ndarray | None) -> int:
        if reason != R_NONE and dead is not None and 0 <= ring < len(dead) and dead[ring]:
            return R_WRITER_DIED
        return reason

    def _request_row(self, req: int, st: _Req, reason: int, last_t: np.ndarray,
                     dead: np.ndarray | None) -> None:
        if st.done or (st.arrive is None and reason == R_NONE):
            return
        st.done = True
        last = int(last_t[req]) if req < len(last_t) else 0
        start = st.arrive if st.arrive is not None else (st.end or last)
        end = st.end if st.end is not None else last
        self._requests.append((req, self._reason(st.ring, reason, dead), st.status != cv.Status.OK,
                               st.status, st.replica, st.ring, start, max(end, start), st.prompt,
                               st.max_tokens, st.first_text or 0, st.first_audio or 0))
        # API marks travel as emit rows of stage API_STAGE (EMIT_DTYPE)
        if st.marks:
            self._marks.extend([(req, cv.API_STAGE, st.replica, t, k, MARK_MODALITY) for t, k in st.marks])
            st.marks = []

    def _queue_row(self, req: int, stage: int, replica: int, sg: _Stage, reason: int,
                   dead: np.ndarray | None) -> None:
        if sg.queue_done or (sg.add is None and (reason == R_NONE or sg.sched is None)):
            return
        sg.queue_done = True
        start = sg.add if sg.add is not None else sg.sched
        end = sg.sched if sg.sched is not None else sg.last
        self._visits.append((N_QUEUE, self._reason(sg.ring, reason, dead), False, 0, stage, replica,
                             req, sg.ring, start, end if end > start else start))

    def _stage_row(self, req: int, stage: int, replica: int, sg: _Stage, reason: int,
                   dead: np.ndarray | None) -> None:
        if sg.done:
            return
        sg.done = True
        start = sg.add if sg.add is not None else (sg.sched or sg.last)
        end = sg.finish if sg.finish is not None else sg.last
        self._visits.append((N_STAGE, self._reason(sg.ring, reason, dead), sg.status != 0, sg.status,
                             stage, replica, req, sg.ring, start, end if end > start else start))
        if sg.emits:
            self._flush_marks()  # the marks before these rows keep their place
            self._emits.extend(sg.emits)
            sg.emits = []


def _rows(rows: list[tuple], dtype: np.dtype) -> np.ndarray:
    """Tuples as ``dtype`` rows, a column at a time (numpy converts a structured row's tuple
    field by field), each value cast as C casts it: a status too wide for its int16 field
    keeps its low bits, as the compiled state's rows do, rather than stopping the build."""
    out = np.zeros(len(rows), dtype)
    for name, column in zip(dtype.names, zip(*rows)):
        out[name] = np.array(column, np.int64).astype(dtype[name])
    return out


if _reqc is not None:
    class _CompiledStates(_reqc.States):  # type: ignore[name-defined,misc]
        """The compiled state, its rows as arrays."""

        def take(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            r, v, e = super().take()
            return (np.frombuffer(r, REQUEST_DTYPE), np.frombuffer(v, VISIT_DTYPE), np.frombuffer(e, EMIT_DTYPE))


def request_states(compiled: bool = True) -> RequestStates:
    """The compiled state where it is built (the same rows: tests/unit/test_reqstate.py),
    else (or ``compiled`` False) the rule itself."""
    return _CompiledStates() if compiled and _reqc is not None else RequestStates()
