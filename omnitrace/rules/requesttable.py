"""Per request, what the walk and the report read of its request, stage and queue spans,
as typed columns over the span tables (``spantable.SpanTables``: requests, visits and
emits), indexed by the tables' request number. The live agent's walk and the report's read
the same table; no span object is made.

Where a request has several spans of one kind (a repeated id, several run directories)
the last in table order counts, as in the reference's ``attribution.index_requests`` (the
tests compare the two request by request):

- ``arrival``/``end``/``status``/``ttfp``: its last ``omni.request`` span's (``ttfp`` 0:
  no first audio packet), its API marks the first of each kind on that span's replica;
- per stage, its last ``omni.stage`` and last ``omni.stage.queue`` span;
- the first audio emit: the earliest first audio ``omni.emit`` among its stage spans (a
  tie: the stage seen first), else the first emit of its last stage's span;
- ``incomplete``: all its request, stage and queue spans that are incomplete.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnitrace import conventions as cv
from omnitrace import keys, rowops
from omnitrace import spantable as stt

NONE = np.iinfo(np.int64).min  # no such time (a mark, an emit)
NO_STAGE = -1 << 20  # no such stage (outside the int16 stage numbers)
_MARKS = tuple(int(k) for k in (cv.Ev.REQUEST_PARSED, cv.Ev.REQUEST_DISPATCH, cv.Ev.PACKET_RECEIVED,
                                cv.Ev.PACKET_RESUMED))


def _last(key: np.ndarray) -> np.ndarray:
    """The row of the last occurrence of each distinct ``key``, in key order."""
    rev = key[::-1]
    _, first = np.unique(rev, return_index=True)
    return len(key) - 1 - first


@dataclass
class StageSpans:
    """One kind of stage-visit span (``omni.stage`` or ``omni.stage.queue``): the last per
    (request, stage), in key order."""

    key: np.ndarray  # keys.request_stage_key
    req: np.ndarray
    stage: np.ndarray
    replica: np.ndarray
    start: np.ndarray
    end: np.ndarray
    seen: np.ndarray  # the row of the first span of its key: orders a request's stages

    @staticmethod
    def of(visits: np.ndarray, name: int) -> "StageSpans":
        v = rowops.select(visits, visits["name"] == name)
        key = keys.request_stage_key(v["req"], v["stage"])
        last = _last(key)
        _, first = np.unique(key, return_index=True)
        req, stage = v["req"].astype(np.int64), v["stage"].astype(np.int64)
        return StageSpans(key[last], req[last], stage[last], v["replica"][last].astype(np.int64),
                          v["start"][last], v["end"][last], first)

    def value(self, req: np.ndarray, stage: np.ndarray, values: np.ndarray, missing: int) -> np.ndarray:
        """``values`` (a column of these spans) of each (request, stage); ``missing`` where none."""
        return keys.lookup(self.key, keys.request_stage_key(req, stage), values, missing)

    def times(self, req: np.ndarray, stage: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(whether each (request, stage) has a span, its start, its end; 0 where none)."""
        hit = self.value(req, stage, np.ones(len(self.key), bool), False)
        return hit, self.value(req, stage, self.start, 0), self.value(req, stage, self.end, 0)

    def of_request(self, req: int) -> list[tuple[int, int, int]]:
        """(stage, start, end) of one request's spans, by stage."""
        lo, hi = np.searchsorted(self.req, [req, req + 1]).tolist()
        return list(zip(self.stage[lo:hi].tolist(), self.start[lo:hi].tolist(), self.end[lo:hi].tolist()))


def _first_marks(emits: np.ndarray, req: np.ndarray, replica: np.ndarray) -> list[np.ndarray]:
    """Per request row (``req``, ``replica``), the first time of each of ``_MARKS`` among
    its replica's API marks (NONE: none)."""
    m = rowops.select(emits, (emits["modality"] == stt.MARK_MODALITY) & (emits["stage"] == cv.API_STAGE))
    out = []
    for kind in _MARKS:
        k = rowops.select(m, m["packet"] == kind)
        key = keys.request_stage_key(k["req"], k["replica"])  # (request, replica)
        o = np.lexsort((k["t"], key))
        first = o[np.r_[True, key[o][1:] != key[o][:-1]]] if len(o) else o
        out.append(keys.lookup(key[first], keys.request_stage_key(req, replica), k["t"][first], NONE))
    return out


def _first_emits(stages: StageSpans, emits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each stage span's (first audio emit, first emit) of its visit's packets (NONE: none)."""
    v = stt.VisitEmits.of(emits)
    have, want = keys.visit_key(v.req, v.stage, v.replica), keys.visit_key(stages.req, stages.stage, stages.replica)
    audio = keys.lookup(have, want, v.first_audio, NONE)
    return np.where(audio == stt.NO_EMIT, NONE, audio), keys.lookup(have, want, v.first, NONE)


@dataclass
class RequestTable:
    """Per request number (``n`` of them), its request span's columns, its first audio
    emit and where the walk begins; per (request, stage) its stage and queue spans."""

    has_request: np.ndarray  # bool: an omni.request span
    arrival: np.ndarray
    end: np.ndarray
    status: np.ndarray
    ttfp: np.ndarray  # its first audio packet (0: none)
    parsed: np.ndarray  # the API marks (NONE: none)
    dispatched: np.ndarray
    received: np.ndarray
    resumed: np.ndarray
    emit_stage: np.ndarray  # the first audio emit (the walk's first stage; NO_STAGE: no emit)
    emit_t: np.ndarray
    last_stage: np.ndarray  # its largest stage with a stage span (NO_STAGE: none)
    incomplete: np.ndarray
    seen: np.ndarray  # bool: any request, stage or queue span
    stages: StageSpans
    queues: StageSpans

    @staticmethod
    def of(spans: stt.SpanTables, n: int) -> "RequestTable":
        """The table of ``spans`` (request numbers below ``n``; number 0, the empty id,
        is never a request)."""
        def col(fill: int) -> np.ndarray:
            return np.full(n, fill, np.int64)
        roots, visits = spans.requests, spans.visits
        last = _last(roots["req"])
        r = roots[last]
        req = r["req"].astype(np.int64)
        t = RequestTable(np.zeros(n, bool), col(0), col(0), col(0), col(0), *(col(NONE) for _ in _MARKS),
                         col(NO_STAGE), col(NONE), col(NO_STAGE), col(0), np.zeros(n, bool),
                         StageSpans.of(visits, stt.N_STAGE), StageSpans.of(visits, stt.N_QUEUE))
        t.has_request[req] = True
        t.arrival[req], t.end[req], t.status[req], t.ttfp[req] = r["start"], r["end"], r["status"], r["first_audio"]
        for column, first in zip((t.parsed, t.dispatched, t.received, t.resumed),
                                 _first_marks(spans.emits, req, r["replica"])):
            column[req] = first
        t._emits(spans.emits)
        np.add.at(t.incomplete, roots["req"].astype(np.int64), roots["reason"] != 0)
        np.add.at(t.incomplete, visits["req"].astype(np.int64), visits["reason"] != 0)
        t.seen[roots["req"].astype(np.int64)] = True
        t.seen[visits["req"].astype(np.int64)] = True
        t.seen[0] = t.has_request[0] = False
        t.incomplete[0] = 0
        return t

    @staticmethod
    def dense(spans: stt.SpanTables) -> tuple["RequestTable", np.ndarray]:
        """The table of ``spans``' own requests only, numbered 1.. (0: the empty id): (it,
        each number's request number in ``spans``, from 1)."""
        nums = np.unique(np.concatenate((spans.requests["req"], spans.visits["req"]))).astype(np.int64)
        nums = np.concatenate(([0], nums[nums != 0]))

        def local(rows: np.ndarray) -> np.ndarray:
            rows = rowops.select(rows, np.isin(rows["req"], nums))
            rows["req"] = np.searchsorted(nums, rows["req"])
            return rows
        mine = stt.SpanTables(local(spans.requests), local(spans.visits), emits=local(spans.emits))
        return RequestTable.of(mine, len(nums)), nums

    def _emits(self, emits: np.ndarray) -> None:
        """The first audio emit (``attribution.first_audio_emit``) and the last stage."""
        st = self.stages
        audio, first = _first_emits(st, emits)
        if not len(st.req):
            return
        np.maximum.at(self.last_stage, st.req, st.stage)
        a = np.flatnonzero(audio != NONE)
        o = a[np.lexsort((st.seen[a], audio[a], st.req[a]))]  # per request: earliest, then seen first
        head = o[np.r_[True, st.req[o][1:] != st.req[o][:-1]]] if len(o) else o
        self.emit_stage[st.req[head]], self.emit_t[st.req[head]] = st.stage[head], audio[head]
        # no audio packet (modality unknown): the first emit of the last stage
        rest = np.flatnonzero((self.emit_stage == NO_STAGE) & (self.last_stage != NO_STAGE))
        t = st.value(rest, self.last_stage[rest], first, NONE)
        has = t != NONE
        self.emit_stage[rest[has]], self.emit_t[rest[has]] = self.last_stage[rest[has]], t[has]

    def walkable(self, req: np.ndarray) -> np.ndarray:
        """Whether each request has an arrival and a first packet not before it."""
        return self.has_request[req] & (self.ttfp[req] != 0) & (self.ttfp[req] >= self.arrival[req])

    def numbers(self) -> np.ndarray:
        """The request numbers with any request, stage or queue span."""
        return np.flatnonzero(self.seen)
