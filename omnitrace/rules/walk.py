"""The attribution rule (``attribution.attribute``: its module doc states it) applied to
many requests at once: each step of the backward walk -- find the gating chunk, take the
latest span of each kind under its key, push the clamped segment -- is a few numpy
operations over every request still walking, not Python per request.

``attribution.attribute`` stays the reference (and the walk of live and small runs); the
tests compare the two request by request, as pyinstrument tests its C fast path against
its Python one. An hour's run has ~30k requests of ~30 segments: the per-request walk
took ~0.45 ms each, ~13 s of the report.

Chunk spans arrive as ``spantable.CHUNK_DTYPE`` rows (the report's ``early`` table) with
the index of their request in the batch. A batch whose stage or chunk numbers fall
outside what the compact keys hold (stages -1..254, chunks -1..2^31-2) is walked by the
reference instead (:func:`fits`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnitrace import conventions as cv
from omnitrace import spantable as stt
from omnitrace.rules import attribution as at
from omnitrace.rules.requesttable import NO_STAGE, NONE, RequestTable

try:  # the latest-span lookups compiled (omnitrace/_intervalsc.c), where built
    from omnitrace import _intervalsc
except ImportError:
    _intervalsc = None
if not hasattr(_intervalsc, "latest"):
    _intervalsc = None  # none, or built before the lookups: numpy until it is rebuilt

CAT = {c: i for i, c in enumerate(at.CATEGORIES)}
DETAILS = ("", "gap", "inbox", "submit", "unwalked", "overlap")
_GAP, _INBOX, _SUBMIT, _UNWALKED, _OVERLAP = 1, 2, 3, 4, 5
_NONE = -1
# missing-span kinds, in the order a hop notes them (their names: the reference's strings)
_MISSING = (cv.SPAN_GET, cv.SPAN_POLL, cv.SPAN_PUT, "task", cv.SPAN_PROCESS, cv.SPAN_FIFO,
            cv.SPAN_SNAPSHOT)
_M_GET, _M_POLL, _M_PUT, _M_TASK, _M_PROCESS, _M_FIFO, _M_SNAPSHOT = range(len(_MISSING))


def fits(rows: np.ndarray) -> bool:
    """Whether the compact keys hold every row's stages and chunk."""
    if not len(rows):
        return True
    lo = min(int(rows["stage"].min()), int(rows["peer"].min()))
    hi = max(int(rows["stage"].max()), int(rows["peer"].max()))
    chunk = rows["chunk"]
    return lo >= -1 and hi <= 254 and int(chunk.min()) >= -1 and int(chunk.max()) < (1 << 31) - 1


def _code(req: np.ndarray, a: np.ndarray, b: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """(request in batch < 2^16, stage a, stage b, chunk) -> one int64 (see :func:`fits`)."""
    i8 = np.int64
    return ((np.asarray(req, i8) << 47) | ((np.asarray(a, i8) + 1) << 39) | ((np.asarray(b, i8) + 1) << 31)
            | (np.asarray(chunk, i8) + 1))


def _by_code_then_end(code: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``np.lexsort((end, code))`` (ties in table order): a stable sort by code, then only
    the groups whose ends are not in table order already re-sorted by end (most groups are
    one span, or spans in time order: a full sort by end cost as much as the rest)."""
    order = np.argsort(code, kind="stable")
    c, e = code[order], end[order]
    same = c[1:] == c[:-1]
    bad = same & (e[1:] < e[:-1])
    if bad.any():
        gid = np.cumsum(np.concatenate(([True], ~same)))
        rows = np.flatnonzero(np.isin(gid, gid[1:][bad]))  # contiguous per group, in order
        order[rows] = order[rows][np.lexsort((e[rows], c[rows]))]
    return order


def _codes_both_ways(req: np.ndarray, a: np.ndarray, b: np.ndarray, chunk: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``_code(req, a, b, chunk)`` and ``_code(req, b, a, chunk)``, sharing their request
    and chunk bits."""
    i8 = np.int64
    base = (np.asarray(req, i8) << 47) | (np.asarray(chunk, i8) + 1)
    a1, b1 = np.asarray(a, i8) + 1, np.asarray(b, i8) + 1
    return base | (a1 << 39) | (b1 << 31), base | (b1 << 39) | (a1 << 31)


class _Latest:
    """Spans grouped by an int64 code, for "the latest span ending by t" lookups: per
    group sorted by end, ties in table order (a Python ``max`` keeps the first). The
    lookups are ``_intervalsc.latest`` where built (a binary search per query in its
    group), else :meth:`by_reference` (numpy, the one the compiled one is tested against)."""

    def __init__(self, code: np.ndarray, end: np.ndarray, rowno: np.ndarray) -> None:
        order = _by_code_then_end(code, end)
        self.rowno, code, end = rowno[order], code[order], end[order]
        self.end = end
        head = np.ones(len(code), bool)
        head[1:] = code[1:] != code[:-1]
        self.groups = code[head]
        self.lo = np.append(np.flatnonzero(head), len(code))
        self._head = head
        self.comp = self.ends = None

    def _ranked(self) -> None:
        """(group, rank of end) as one sorted int64 (``comp``): one searchsorted finds the
        latest end <= t in any group (ranks among all ends, ties alike: exact whatever
        the times; end <= t exactly when rank(end) < #ends <= t). Made for the reference
        lookups only."""
        if self.comp is None:
            self.ends = np.sort(self.end)
            self.width = len(self.ends) + 1
            self.comp = (np.cumsum(self._head) - 1) * self.width + np.searchsorted(self.ends, self.end) + 1

    def _group(self, code: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each code's group, its rows [lo, hi), whether it has any (some groups)."""
        g = np.minimum(np.searchsorted(self.groups, code), len(self.groups) - 1)
        return g, self.lo[g], self.lo[g + 1], self.groups[g] == code

    def _first_of_end(self, p: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.comp, self.comp[p], "left")

    def by(self, code: np.ndarray, t: np.ndarray, fallback: bool = True) -> np.ndarray:
        """Row numbers (-1: none) of the latest span of each group ending by ``t``; with
        ``fallback`` the reference's ``_latest``: if none ends by ``t``, the latest of all
        (so a group of one gives that one)."""
        if _intervalsc is None or not len(self.groups) or not len(code):
            return self.by_reference(code, t, fallback)
        out = np.empty(len(code), np.int64)
        i8 = np.int64
        _intervalsc.latest(self.groups, self.lo, np.ascontiguousarray(self.end, i8), self.rowno,
                           np.ascontiguousarray(code, i8), np.ascontiguousarray(np.broadcast_to(t, len(code)), i8),
                           fallback, out)
        return out

    def by_reference(self, code: np.ndarray, t: np.ndarray, fallback: bool = True) -> np.ndarray:
        """:meth:`by` in numpy."""
        out = np.full(len(code), _NONE, np.int64)
        if not len(self.groups) or not len(code):
            return out
        self._ranked()
        g, lo, hi, found = self._group(code)
        q = g * self.width + np.searchsorted(self.ends, t, "right")
        p = np.searchsorted(self.comp, q, "right") - 1
        hit = found & (p >= lo)
        pick = np.where(hit, self._first_of_end(np.maximum(p, 0)), _NONE)
        if fallback:
            last = self._first_of_end(np.maximum(hi - 1, 0))
            pick = np.where(found & ~hit, last, pick)
        pick = np.where(found, pick, _NONE)
        ok = pick >= 0
        out[ok] = self.rowno[pick[ok]]
        return out

    def any_by(self, code: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether some span of each group ends by ``t``."""
        if not len(self.groups) or not len(code):
            return np.zeros(len(code), bool)
        g, lo, _, found = self._group(code)
        return found & (self.end[np.minimum(lo, len(self.end) - 1)] <= t)

    def count(self, code: np.ndarray) -> np.ndarray:
        """How many spans each group has."""
        if not len(self.groups) or not len(code):
            return np.zeros(len(code), np.int64)
        _, lo, hi, found = self._group(code)
        return np.where(found, hi - lo, 0)


@dataclass
class Walked:
    """The attributions of a batch as arrays: segments (in time order per request, request
    ``i``'s from ``seg_lo[i]`` to ``seg_lo[i + 1]``), hops, missing spans, stale hops."""

    rids: list[str]
    ok: np.ndarray
    arrival: np.ndarray
    ttfp: np.ndarray
    seg_lo: np.ndarray
    seg_start: np.ndarray
    seg_end: np.ndarray
    seg_stage: np.ndarray
    seg_cat: np.ndarray
    seg_detail: np.ndarray
    hops: list[list[tuple[int, int, int]]]
    missing: list[list[str]]
    stale: list[list[tuple[int, int, int]]]

    def attribution(self, i: int) -> at.Attribution:
        lo, hi = int(self.seg_lo[i]), int(self.seg_lo[i + 1])
        segs = [at.Segment(s, e, st, at.CATEGORIES[c], DETAILS[d]) for s, e, st, c, d in zip(
            self.seg_start[lo:hi].tolist(), self.seg_end[lo:hi].tolist(), self.seg_stage[lo:hi].tolist(),
            self.seg_cat[lo:hi].tolist(), self.seg_detail[lo:hi].tolist())]
        return at.Attribution(self.rids[i], int(self.arrival[i]), int(self.ttfp[i]), segs,
                              self.hops[i], self.missing[i], self.stale[i])


class _Segments:
    """The walker's state over all requests of a batch (``attribution._Walker``, vectorised)."""

    def __init__(self, arrival: np.ndarray, ttfp: np.ndarray) -> None:
        self.arrival = arrival
        self.cursor = ttfp.copy()
        self.last_stage = np.full(len(arrival), cv.API_STAGE, np.int64)
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.k = 0  # pushes so far: orders a request's segments

    def _add(self, idx: np.ndarray, start: np.ndarray, end: np.ndarray, stage: np.ndarray | int,
             cat: int, detail: np.ndarray | int, order: int) -> None:
        if len(idx):
            n = len(idx)
            self.parts.append((idx, np.full(n, order, np.int64), start, end,
                               np.broadcast_to(np.asarray(stage, np.int64), (n,)),
                               np.full(n, cat, np.int8), np.broadcast_to(np.asarray(detail, np.int8), (n,))))

    def push(self, idx: np.ndarray, start: np.ndarray, end: np.ndarray, stage: np.ndarray | int,
             cat: str, detail: np.ndarray | int = 0) -> None:
        """``_Walker.push`` for the requests ``idx``."""
        if not len(idx):
            return
        self.k += 1
        cur, arr = self.cursor[idx], self.arrival[idx]
        gs = np.maximum(np.minimum(end, cur), arr)
        gap = gs < cur  # the span ends before the cursor, after arrival
        self._add(idx[gap], gs[gap], cur[gap], self.last_stage[idx][gap], CAT[at.REMAINDER], _GAP, 2 * self.k)
        cur = np.where(gap, gs, cur)
        start = np.maximum(np.minimum(start, cur), arr)
        m = start < cur
        st = np.broadcast_to(np.asarray(stage, np.int64), (len(idx),))
        det = np.broadcast_to(np.asarray(detail, np.int8), (len(idx),))
        self._add(idx[m], start[m], cur[m], st[m], CAT[cat], det[m], 2 * self.k + 1)
        self.cursor[idx] = np.where(m, start, cur)
        self.last_stage[idx] = st

    def unwalked(self, idx: np.ndarray) -> None:
        self.k += 1
        cur = self.cursor[idx]
        m = cur > self.arrival[idx]
        self._add(idx[m], self.arrival[idx][m], cur[m], cv.API_STAGE, CAT[at.REMAINDER], _UNWALKED,
                  2 * self.k + 1)
        self.cursor[idx[m]] = self.arrival[idx[m]]

    def in_time_order(self, n: int) -> tuple[np.ndarray, ...]:
        if not self.parts:
            z = np.zeros(0, np.int64)
            return np.zeros(n + 1, np.int64), z, z, z, np.zeros(0, np.int8), np.zeros(0, np.int8)
        req, order, start, end, stage, cat, detail = (np.concatenate(c) for c in zip(*self.parts))
        o = np.lexsort((-order, req))  # pushed backward: the last push is the earliest
        lo = np.searchsorted(req[o], np.arange(n + 1))
        return lo, start[o], end[o], stage[o], cat[o], detail[o]


def walk(rids: list[str], table: RequestTable, nums: np.ndarray, rows: np.ndarray,
         owner: np.ndarray) -> Walked:
    """Attribute the requests ``rids`` (their numbers ``nums`` in ``table``) over their
    chunk span ``rows`` (``owner``: each row's request index in ``rids``; rows of a request
    in table order). Requires :func:`fits` (``rows``) and < 2^16 requests."""
    n = len(rids)
    nums = np.asarray(nums, np.int64)
    ok = table.walkable(nums)
    arrival = np.where(ok, table.arrival[nums], 0)
    ttfp = np.where(ok, table.ttfp[nums], 0)
    W = _Segments(arrival, ttfp)
    hops: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    missing: list[list[str]] = [[] for _ in range(n)]
    stale: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]

    stage, peer, chunk = rows["stage"], rows["peer"], rows["chunk"]
    start, end = rows["start"], rows["end"]
    prod_code, cons_code = _codes_both_ways(owner, stage, peer, chunk)

    sched, get, put, fifo, snap, proc, made = _indexes(rows, owner, prod_code, cons_code)

    t, cur_stage, has_stage = _delivery(W, table, nums, ok, ttfp, missing)

    # ---- hops
    origin = np.full(n, _NONE, np.int64)
    has_origin = np.zeros(n, bool)
    seen = np.zeros((n, at._MAX_HOPS), np.int64)  # hop codes (request bits 0)
    active = np.flatnonzero(ok & has_stage)
    for h in range(at._MAX_HOPS):
        if not len(active):
            break
        st_, t_ = cur_stage[active], t[active]
        ws = sched.by(_code(active, st_, -1, -1), np.minimum(t_, W.cursor[active]), fallback=False)
        found = ws >= 0
        wsi = np.maximum(ws, 0)
        key = _code(np.zeros(len(active), np.int64), peer[wsi], stage[wsi], chunk[wsi])
        again = found & (seen[active, :h] == key[:, None]).any(axis=1)
        stop = ~found | again
        _terminate(W, table, nums, active[stop], st_[stop], t_[stop], origin, has_origin, missing)
        go = ~stop
        idx, ws, key = active[go], ws[go], key[go]
        seen[idx, h] = key
        prod, cons, c = peer[ws].astype(np.int64), stage[ws].astype(np.int64), chunk[ws].astype(np.int64)
        for i, p, q, k in zip(idx.tolist(), prod.tolist(), cons.tolist(), c.tolist()):
            hops[i].append((p, q, k))
        t_ = t[idx]
        W.push(idx, end[ws], t_, cons, at.COMPUTE)
        W.push(idx, start[ws], end[ws], cons, at.WAIT_SCHEDULE)
        pc = _code(idx, prod, cons, c)  # producer-side code of the hop's key
        # the chunk's get and put, matched by causality (attribution's ordering rule)
        g = get.by(pc, W.cursor[idx])
        have_get = g >= 0
        gi = np.maximum(g, 0)
        pu = put.by(pc, np.where(have_get, end[gi], W.cursor[idx]))
        have_put = pu >= 0
        pui = np.maximum(pu, 0)
        got = np.where(have_put, np.maximum(start[gi], np.minimum(end[pui], end[gi])), start[gi])
        overlap = np.where(got > start[gi], _OVERLAP, 0).astype(np.int8)
        W.push(idx[have_get], got[have_get], end[gi][have_get], cons[have_get], at.GET, overlap[have_get])
        both = have_get & have_put
        W.push(idx[both], end[pui][both], np.maximum(start[gi], end[pui])[both], cons[both], at.POLL_LAG)
        notes: list[tuple[np.ndarray, int]] = [(~have_get, _M_GET), (~both, _M_POLL), (~have_put, _M_PUT)]
        W.push(idx[have_put], start[pui][have_put], end[pui][have_put], prod[have_put], at.PUT)
        _producer_task(W, rows, idx, pc, prod, have_put, pu, (proc, made, fifo, snap), notes)
        _note(notes, idx, (prod, cons, c), missing, stale)
        t[idx] = W.cursor[idx]
        cur_stage[idx] = prod
        active = idx

    _dispatch(W, table, nums, ok, arrival, origin, has_origin)
    lo, s0, s1, sst, scat, sdet = W.in_time_order(n)
    return Walked(rids, ok, arrival, ttfp, lo, s0, s1, sst, scat, sdet,
                  [h[::-1] for h in hops], missing, stale)  # hops: walked backward


def _indexes(rows: np.ndarray, owner: np.ndarray, prod_code: np.ndarray, cons_code: np.ndarray
             ) -> tuple[_Latest, ...]:
    """The latest-by-time indexes the walk looks spans up in: the consumer's ready-to-
    scheduled waits (by request and stage), gets, puts (the latest BEGUN by a time), FIFO
    waits, snapshots, payload builds, and the builds that made a chunk."""
    name, end = rows["name"], np.ascontiguousarray(rows["end"])

    def index(sel: np.ndarray, code: np.ndarray, by: np.ndarray = end) -> _Latest:
        rowno = np.flatnonzero(sel)
        return _Latest(code[rowno], by[rowno], rowno)

    ready = np.flatnonzero((name == stt.N_WAIT) & (rows["reason"] == 0))
    return (_Latest(_code(owner[ready], rows["stage"][ready], -1, -1), end[ready], ready),
            index(name == stt.N_GET, cons_code), index(name == stt.N_PUT, prod_code, by=rows["start"]),
            index(name == stt.N_FIFO, prod_code), index(name == stt.N_SNAPSHOT, prod_code),
            index(name == stt.N_PROCESS, prod_code),
            index((name == stt.N_PROCESS) & (rows[stt.BYTES] > 0), prod_code))


def _note(notes: list[tuple[np.ndarray, int]], idx: np.ndarray, hop_of: tuple[np.ndarray, ...],
          missing: list[list[str]], stale: list[list[tuple[int, int, int]]]) -> None:
    """Name each hop's missing spans (``notes``: mask per kind, in the order the reference
    notes them); a missing task also marks the hop stale."""
    prod, cons, c = hop_of
    for mask, kind in notes:
        for j in np.flatnonzero(mask).tolist():
            hop = (int(prod[j]), int(cons[j]), int(c[j]))
            i = int(idx[j])
            if kind == _M_TASK:
                stale[i].append(hop)
            missing[i].append(f"{_MISSING[kind]}[{hop[0]}->{hop[1]}#{hop[2]}]")


def _producer_task(W: _Segments, rows: np.ndarray, idx: np.ndarray, pc: np.ndarray, prod: np.ndarray,
                   have_put: np.ndarray, pu: np.ndarray, ix: tuple, notes: list) -> None:
    """The producing task's process, FIFO and snapshot spans of each hop ``idx`` (the
    reference's ``attribute`` says how the task is found), pushed; what is missing noted."""
    proc, made, fifo, snap = ix
    start, end, nbytes, blocked_ns = rows["start"], rows["end"], rows[stt.BYTES], rows[stt.BLOCKED]
    # the producing task (the reference's comment says why): procs = its process spans
    # ending by the put's begin (the sender's own clock; no put: the cursor), or all;
    # made = those with payload bytes
    cur = np.where(have_put, start[np.maximum(pu, 0)], W.cursor[idx])
    n_proc = proc.count(pc)
    some_by = proc.any_by(pc, cur)
    made_by = made.by(pc, cur, fallback=False)
    made_any = made.by(pc, np.full(len(idx), np.iinfo(np.int64).max), fallback=False)
    mk = np.where(some_by, made_by, made_any)
    put_bytes = np.where(have_put, nbytes[np.maximum(pu, 0)], 0)
    is_stale = have_put & (put_bytes > 0) & (n_proc > 0) & (mk < 0)
    notes.append((is_stale, _M_TASK))
    pr = np.where(mk >= 0, mk, proc.by(pc, cur))
    pr = np.where(is_stale, _NONE, pr)
    cut = np.where(pr >= 0, start[np.maximum(pr, 0)], cur)
    fi = np.where(is_stale, _NONE, fifo.by(pc, cut))
    fii = np.maximum(fi, 0)
    last = snap.by(pc, cut, fallback=False)  # MRv2: snapshotted after the dequeue
    after = (fi >= 0) & (last >= 0) & (start[np.maximum(last, 0)] >= end[fii]) & ~is_stale
    sn = np.where(after, last, snap.by(pc, np.where(fi >= 0, start[fii], cut)))
    sn = np.where(is_stale, _NONE, sn)
    have = pr >= 0
    notes.append((~have & ~is_stale, _M_PROCESS))
    notes.append((~(fi >= 0) & ~is_stale, _M_FIFO))
    notes.append((~(sn >= 0) & ~is_stale, _M_SNAPSHOT))
    pri = pr[have]
    W.push(idx[have], start[pri], end[pri], prod[have], at.PROCESS)
    s = sn[after]
    W.push(idx[after], start[s], end[s], prod[after], at.SNAPSHOT)
    have = fi >= 0
    f = fi[have]
    dur = end[f] - start[f]
    blocked = np.maximum(0, np.minimum(blocked_ns[f], dur))
    W.push(idx[have], end[f] - (dur - blocked), end[f], prod[have], at.FIFO_OWN)
    W.push(idx[have], start[f], start[f] + blocked, prod[have], at.FIFO_BLOCKED)
    have = (sn >= 0) & ~after
    s = sn[have]
    W.push(idx[have], start[s], end[s], prod[have], at.SNAPSHOT)


def _delivery(W: _Segments, table: RequestTable, nums: np.ndarray, ok: np.ndarray, ttfp: np.ndarray,
              missing: list[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[first audio emit, first packet] of every request (``attribution._delivery``);
    returns where the hops begin: the emit time, the emitting stage, whether there is one."""
    emit_t, emit_stage, last = table.emit_t[nums], table.emit_stage[nums], table.last_stage[nums]
    has_emit = ok & (emit_stage != NO_STAGE)
    cur_stage = np.where(has_emit, emit_stage, last)
    has_stage = ok & (cur_stage != NO_STAGE)
    t = np.where(has_emit, emit_t, ttfp)
    for i in np.flatnonzero(ok & ~has_emit).tolist():
        missing[i].append("omni.emit")
    recv, resumed = table.received[nums], table.resumed[nums]
    e = np.flatnonzero(has_emit)
    m = e[(resumed[e] != NONE) & (emit_t[e] <= resumed[e]) & (resumed[e] <= ttfp[e])]
    W.push(m, resumed[m], ttfp[m], cv.API_STAGE, at.SSE_WRITE)
    m = e[(recv[e] != NONE) & (emit_t[e] <= recv[e]) & (recv[e] <= W.cursor[e])]
    W.push(m, recv[m], W.cursor[m], cv.API_STAGE, at.LOOP_LAG)
    W.push(e, emit_t[e], W.cursor[e], cv.API_STAGE, at.DELIVER)
    return t, cur_stage, has_stage


def _dispatch(W: _Segments, table: RequestTable, nums: np.ndarray, ok: np.ndarray, arrival: np.ndarray,
              origin: np.ndarray, has_origin: np.ndarray) -> None:
    """[arrival, first stage's add]: parse, then dispatch (or unwalked: no stage reached)."""
    done = np.flatnonzero(ok & (W.cursor > arrival))
    walked, lost = done[has_origin[done]], done[~has_origin[done]]
    W.unwalked(lost)
    parsed, disp = table.parsed[nums], table.dispatched[nums]
    w = walked
    m = w[(disp[w] != NONE) & (arrival[w] <= disp[w]) & (disp[w] <= W.cursor[w])]
    W.push(m, disp[m], W.cursor[m], origin[m], at.DISPATCH, _INBOX)
    p_ok = (parsed[w] != NONE) & (arrival[w] <= parsed[w]) & (parsed[w] <= W.cursor[w])
    m = w[p_ok]
    W.push(m, parsed[m], W.cursor[m], cv.API_STAGE, at.DISPATCH, _SUBMIT)
    W.push(m, arrival[m], parsed[m], cv.API_STAGE, at.PARSE)
    m = w[~p_ok]
    W.push(m, arrival[m], W.cursor[m], cv.API_STAGE, at.DISPATCH)


def _terminate(W: _Segments, table: RequestTable, nums: np.ndarray, idx: np.ndarray, stage: np.ndarray,
               t: np.ndarray, origin: np.ndarray, has_origin: np.ndarray, missing: list[list[str]]) -> None:
    """A stage with no (new) gating chunk: its compute from its queue's end, its queue."""
    if not len(idx):
        return
    hq, ql, qh = table.queues.times(nums[idx], stage)
    hs, ss, _ = table.stages.times(nums[idx], stage)
    for i, st in zip(idx[~hq & hs].tolist(), stage[~hq & hs].tolist()):
        missing[i].append(f"{cv.SPAN_STAGE_QUEUE}[{st}]")
    W.push(idx[hq], qh[hq], t[hq], stage[hq], at.COMPUTE)
    W.push(idx[hq], ql[hq], qh[hq], stage[hq], at.QUEUE)
    m = ~hq & hs
    W.push(idx[m], ss[m], t[m], stage[m], at.COMPUTE)
    at_origin = hq | hs
    origin[idx[at_origin]] = stage[at_origin]
    has_origin[idx[at_origin]] = True
