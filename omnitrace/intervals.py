"""Overlap of interval sets: the one home of the FIFO-blocking rule's arithmetic.

THE RULE. A FIFO wait -- a victim's chunk waiting from its enqueue E to its dequeue D --
is *blocked* while the FIFO's sender (one thread, one task at a time: the busy intervals
``spantable.sender_tasks`` makes) works on a task of *another* request. Its blocked time
is the overlap of [E, D] with those intervals (``omni.fifo.blocked_ns``); its culprits are
the other requests ranked by their overlap; the victim's own tasks never block it. The
senders are told apart by one key (``keys.sender_key``); every query here is against one
sender's intervals, the caller groups the rows by that key (``keys.groups``).

Intervals (``starts``, ``ends``, ``owners``: the request of each task) come sorted by
start with their ends ascending too (a sender's tasks are disjoint); queries (``q0``,
``q1``, ``qowner``) are in any order. The report's head-of-line wall time then takes the
union of each victim's blocked pieces, split among the culprits active at each moment
(:func:`union_shares`). Everything is vectorised (searchsorted, cumsum): the report runs
it over millions of spans. The culprit ranking, the overlap pieces and the head-of-line
pair figures have compiled twins in ``omnitrace/_intervalsc.c`` (built at install where a C
compiler is; tested to give the same arrays, the figures' floats bit for bit), used when
they are there: :func:`top_others_reference`, :func:`_pieces_in`,
:func:`other_overlap_reference` and :func:`pair_figures_reference` are the numpy they follow.
"""
from __future__ import annotations

import numpy as np

try:
    from omnitrace import _intervalsc
except ImportError:  # built without a C compiler: the numpy ranking alone
    _intervalsc = None
if _intervalsc is not None and not all(hasattr(_intervalsc, f) for f in ("rank", "pieces", "overlap", "pairs")):
    _intervalsc = None  # an extension built before these kernels: numpy until it is rebuilt

# (query, interval) overlaps ranked at once by :func:`top_others_reference`: ~200 MB of temporaries
# (a deep FIFO makes them quadratic in its depth)
RANK_BATCH = 1 << 22


def expand_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (owner, index) with lo[owner] <= index < hi[owner], without a Python loop:
    e.g. each FIFO wait against each sender task it overlapped."""
    cnt = np.maximum(hi - lo, 0)
    owner = np.repeat(np.arange(len(lo)), cnt)
    index = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(lo, cnt)
    return owner, index


def _candidates(starts: np.ndarray, ends: np.ndarray, q0: np.ndarray, q1: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the range [lo, hi) of intervals that may overlap it: those ending after
    its start and starting before its end."""
    return np.searchsorted(ends, q0, "right"), np.searchsorted(starts, q1, "left")


def other_pieces(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, q0: np.ndarray,
                 q1: np.ndarray, qowner: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each overlap of a query with an interval of another owner, of positive length:
    (query index, interval index, overlap start, overlap end), by query then interval."""
    first, stop = _candidates(starts, ends, q0, q1)
    if _intervalsc is None or not _int64_safe(starts, ends, owners, q0, q1, qowner):
        return _pieces_in(starts, ends, owners, q0, q1, qowner, first, stop)
    return _pieces_compiled(starts, ends, owners, q0, q1, qowner, first, stop)


def _int64_safe(*arrays: np.ndarray) -> bool:
    """Whether every array's values are integers an int64 holds (the compiled kernels' input)."""
    return all(a.dtype.kind in "iu" and (a.dtype.kind == "i" or a.dtype.itemsize < 8) for a in arrays)


def _pieces_compiled(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, q0: np.ndarray,
                     q1: np.ndarray, qowner: np.ndarray, first: np.ndarray, stop: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_pieces_in` by ``_intervalsc.pieces`` (one pass over each query's candidates,
    no temporaries per candidate); only the intervals some query may overlap are handed over."""
    some = stop > first
    rows = int((stop - first)[some].sum())
    out = [np.empty(rows, np.int64) for _ in range(4)]
    if rows:
        i0, i1 = int(first[some].min()), int(stop[some].max())
        as64 = [np.ascontiguousarray(a, np.int64) for a in (starts[i0:i1], ends[i0:i1], owners[i0:i1],
                                                           q0, q1, qowner, first - i0, stop - i0)]
        n = _intervalsc.pieces(*as64, *out)
        out = [c[:n] for c in out]
        out[1] += i0
    piece_dtype = np.result_type(starts.dtype, q0.dtype)  # np.maximum's in the reference
    return out[0], out[1], out[2].astype(piece_dtype, copy=False), out[3].astype(piece_dtype, copy=False)


def _pieces_in(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, q0: np.ndarray,
               q1: np.ndarray, qowner: np.ndarray, first: np.ndarray, stop: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`other_pieces` among each query's candidate intervals [first, stop)."""
    q, iv = expand_ranges(first, stop)
    lo, hi = np.maximum(starts[iv], q0[q]), np.minimum(ends[iv], q1[q])
    keep = (owners[iv] != qowner[q]) & (hi > lo)
    return q[keep], iv[keep], lo[keep], hi[keep]


def _before(keys: np.ndarray, ends: np.ndarray, cum: np.ndarray, qkeys: np.ndarray,
            t: np.ndarray, lo: np.ndarray | int = 0) -> np.ndarray:
    """Interval time before each ``t`` of disjoint time-sorted intervals [lo, k): ``keys``
    order their starts and ``qkeys`` the times alike (``k``: those starting at or before
    ``t``), ``cum`` their prefix sums; less the part of the last one after ``t``."""
    k = np.searchsorted(keys, qkeys, "right")
    last = np.maximum(k - 1, 0)
    past = np.where(k > lo, np.maximum(ends[last] - t, 0), 0)
    return cum[k] - cum[lo] - past


def other_overlap(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, q0: np.ndarray,
                  q1: np.ndarray, qowner: np.ndarray) -> np.ndarray:
    """Per query, its total overlap with intervals of other owners: all the overlap less
    its own owner's, each from prefix sums (O(log n) per query however many intervals it
    spans; :func:`other_overlap_reference`), or compiled, each query's candidate intervals
    summed. The intervals must be disjoint."""
    out = np.zeros(len(q0), np.int64)
    if not len(q0) or not len(starts):
        return out
    # only the intervals that can overlap some query: a sender keeps seconds of them, the
    # queries of one call span far less (each sum below is the same over these)
    i0 = int(np.searchsorted(ends, q0.min(), "right"))
    i1 = int(np.searchsorted(starts, q1.max(), "left"))
    if i1 <= i0:
        return out
    starts, ends, owners = starts[i0:i1], ends[i0:i1], owners[i0:i1]
    if _intervalsc is not None and _int64_safe(starts, ends, owners, q0, q1, qowner) and (q1 >= q0).all():
        i8 = np.int64
        as64 = [np.ascontiguousarray(a, i8) for a in (starts, ends, owners, q0, q1, qowner,
                                                     *_candidates(starts, ends, q0, q1))]
        if _intervalsc.overlap(*as64, out):  # False: not disjoint, the prefix sums' answer stands
            return out
    return other_overlap_reference(starts, ends, owners, q0, q1, qowner)


def other_overlap_reference(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, q0: np.ndarray,
                            q1: np.ndarray, qowner: np.ndarray) -> np.ndarray:
    """:func:`other_overlap` by prefix sums (numpy), over intervals that may overlap some
    query; the compiled ``_intervalsc.overlap`` walks each query's candidates instead."""
    cum = np.concatenate(([0], np.cumsum(ends - starts)))
    total = _before(starts, ends, cum, q1, q1) - _before(starts, ends, cum, q0, q0)
    return total - _own_overlap(starts, ends, owners, q0, q1, qowner)


def _own_overlap(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, q0: np.ndarray,
                 q1: np.ndarray, qowner: np.ndarray) -> np.ndarray:
    """Per query, its overlap with its own owner's intervals: :func:`_before` over the
    intervals grouped by owner (stable: each group stays time-sorted); a time's rank among
    all starts stands in for it (monotone, <= n), so keys (group, rank) make one
    searchsorted serve every group."""
    n = len(starts)
    order = np.argsort(owners, kind="stable")
    g_owner = owners[order]
    first = np.ones(n, bool)
    first[1:] = g_owner[1:] != g_owner[:-1]
    heads = np.flatnonzero(first)
    o_s, o_e = starts[order], ends[order]
    o_cum = np.concatenate(([0], np.cumsum(o_e - o_s)))
    keys = (np.cumsum(first) - 1) * (n + 1) + np.searchsorted(starts, o_s, "right")
    g = np.minimum(np.searchsorted(g_owner[heads], qowner), len(heads) - 1)
    has, lo = g_owner[heads[g]] == qowner, heads[g]

    def own_before(t: np.ndarray) -> np.ndarray:
        return _before(keys, o_e, o_cum, g * (n + 1) + np.searchsorted(starts, t, "right"), t, lo)

    return np.where(has, own_before(q1) - own_before(q0), 0)


def top_others(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, q0: np.ndarray,
               q1: np.ndarray, qowner: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per query, the (up to) ``k`` other owners whose intervals overlapped it most, by
    total overlap (ties: the owner of the earliest interval first): (query index, owner,
    rank from 0), by query index then rank. Compiled where built, else
    :func:`top_others_reference`."""
    if _intervalsc is None:
        return top_others_reference(starts, ends, owners, q0, q1, qowner, k)
    return _top_others_compiled(starts, ends, owners, q0, q1, qowner, k)


def _top_others_compiled(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, q0: np.ndarray,
                         q1: np.ndarray, qowner: np.ndarray, k: int
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`top_others` by ``_intervalsc.rank``: each query walks its candidate intervals
    once (no overlap pairs materialised); only the intervals some query may overlap are
    handed over, as int64."""
    lo, hi = _candidates(starts, ends, q0, q1)
    some = hi > lo
    if k <= 0 or not some.any():
        none = np.zeros(0, np.int64)
        return none, owners[:0], none
    i0, i1 = int(lo[some].min()), int(hi[some].max())
    rows = int(np.minimum(hi - lo, k)[some].sum())
    q, first, rank = np.empty(rows, np.int64), np.empty(rows, np.int64), np.empty(rows, np.int64)
    as64 = [np.ascontiguousarray(a, np.int64) for a in (starts[i0:i1], ends[i0:i1], owners[i0:i1],
                                                       q0, q1, qowner, lo - i0, hi - i0)]
    n = _intervalsc.rank(*as64, k, q, first, rank)
    return q[:n], owners[first[:n] + i0], rank[:n]


def top_others_reference(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray, q0: np.ndarray,
                         q1: np.ndarray, qowner: np.ndarray, k: int
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`top_others` in numpy, the reference ``_intervalsc.c`` follows: enumerates
    every overlap, RANK_BATCH of them at a time, and ranks them by two lexsorts."""
    lo, hi = _candidates(starts, ends, q0, q1)
    cnt = np.maximum(hi - lo, 0)
    edges = np.searchsorted(np.cumsum(cnt), np.arange(RANK_BATCH, int(cnt.sum()), RANK_BATCH))
    out = [_ranked(part, *_pieces_in(starts, ends, owners, q0[part], q1[part], qowner[part], lo[part], hi[part]),
                   owners, k)
           for part in np.split(np.arange(len(q0)), np.unique(edges)) if len(part) and cnt[part].sum()]
    if not out:
        none = np.zeros(0, np.int64)
        return none, owners[:0], none
    q, owner, rank = (np.concatenate(cols) for cols in zip(*out))
    return q, owner, rank


def _ranked(part: np.ndarray, q: np.ndarray, iv: np.ndarray, lo: np.ndarray, hi: np.ndarray,
            owners: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`top_others_reference` of the queries ``part`` from their overlaps (``q``
    indexes ``part``)."""
    culprit, ov = owners[iv], hi - lo
    # per (query, owner): overlap sum and first interval (ties keep the first seen)
    order = np.lexsort((iv, culprit, q))
    q, culprit, ov, iv = q[order], culprit[order], ov[order], iv[order]
    first = np.ones(len(q), bool)
    first[1:] = (q[1:] != q[:-1]) | (culprit[1:] != culprit[:-1])
    heads = np.flatnonzero(first)
    sums = np.add.reduceat(ov, heads) if len(heads) else ov
    gq, gc, gfirst = q[heads], culprit[heads], iv[heads]
    order = np.lexsort((gfirst, -sums, gq))
    gq, gc = gq[order], gc[order]
    rank = np.arange(len(gq)) - np.searchsorted(gq, gq, "left")
    top = rank < k
    return part[gq[top]], gc[top], rank[top]


def pair_figures(vi: np.ndarray, culprit: np.ndarray, start: np.ndarray, end: np.ndarray,
                 sender: np.ndarray, task: np.ndarray, victims: int) -> tuple[np.ndarray, ...]:
    """The head-of-line figures of blocked pieces (each a victim's critical-path wait
    overlapping a ``task`` of another request ``culprit`` on ``sender``: [start, end)):
    per victim index below ``victims`` its union (float) and summed length; per (victim,
    culprit), by victim then culprit, the two, its share of the union (:func:`union_shares`)
    and its distinct (sender, task)s: (wall, chunk, victim, culprit, pair_wall, pair_chunk,
    pair_tasks). Compiled where built, else :func:`pair_figures_reference`."""
    if _intervalsc is None:
        return pair_figures_reference(vi, culprit, start, end, sender, task, victims)
    n = len(vi)
    wall, chunk = np.zeros(victims), np.zeros(victims, np.int64)
    p_victim, p_culprit, p_chunk, p_tasks = (np.empty(n, np.int64) for _ in range(4))
    p_wall = np.empty(n)
    cols = [np.ascontiguousarray(a, np.int64) for a in (vi, culprit, start, end, sender, task)]
    k = _intervalsc.pairs(*cols, wall, chunk, p_victim, p_culprit, p_wall, p_chunk, p_tasks)
    return wall, chunk, p_victim[:k], p_culprit[:k], p_wall[:k], p_chunk[:k], p_tasks[:k]


def pair_figures_reference(vi: np.ndarray, culprit: np.ndarray, start: np.ndarray, end: np.ndarray,
                           sender: np.ndarray, task: np.ndarray, victims: int) -> tuple[np.ndarray, ...]:
    """:func:`pair_figures` in numpy, the reference ``_intervalsc.c`` follows."""
    vi, culprit = np.asarray(vi, np.int64), np.asarray(culprit, np.int64)
    wall = np.zeros(victims)
    none = np.zeros(0, np.int64)
    if not len(vi):
        return wall, np.zeros(victims, np.int64), none, none, np.zeros(0), none, none
    dur = end - start
    chunk = np.bincount(vi, weights=dur, minlength=victims).astype(np.int64)
    # per (victim, culprit): overlap sum and distinct sender tasks
    pairs, inv = np.unique((vi << 32) | culprit, return_inverse=True)
    pair_chunk = np.bincount(inv, weights=dur, minlength=len(pairs)).astype(np.int64)
    # distinct (pair, sender, task) triples: a task may block several chunks (by a lexsort:
    # a row-wise np.unique took 0.75 s of this phase's 2.4 s on 10M events)
    o = np.lexsort((task, sender, inv))
    i, snd, tsk = inv[o], sender[o], task[o]
    new = np.ones(len(o), bool)
    new[1:] = (i[1:] != i[:-1]) | (snd[1:] != snd[:-1]) | (tsk[1:] != tsk[:-1])
    pair_tasks = np.bincount(i[new], minlength=len(pairs))
    union, m_victim, m_culprit, shares = union_shares(vi, culprit, start, end)
    pair_wall = np.bincount(np.searchsorted(pairs, (m_victim << 32) | m_culprit), weights=shares,
                            minlength=len(pairs))
    wall[:len(union)] = union
    wall[chunk == 0] = 0.0
    return wall, chunk, pairs >> 32, pairs & 0xFFFFFFFF, pair_wall, pair_chunk, pair_tasks


def union_shares(group: np.ndarray, owner: np.ndarray, start: np.ndarray, end: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group (a victim), the union length of its intervals, and per (group, owner) its
    even share of it: an owner's intervals are merged first (one active twice at once
    counts once), and a moment when n owners are active gives each 1/n of it.
    Returns (union length per group index, the merged intervals' groups and owners, their
    shares)."""
    ng = int(group.max()) + 1
    g, o, s, e = _merged_per_owner(group, owner, start, end)
    # sweep each group's edges: active-owner count, then the integral of 1/count
    n = len(g)
    t = np.concatenate((s, e))
    d = np.concatenate((np.ones(n, np.int64), -np.ones(n, np.int64)))
    ev_g = np.concatenate((g, g))
    order = np.lexsort((d, t, ev_g))
    t, d, ev_g = t[order], d[order], ev_g[order]
    active = np.cumsum(d)  # each group's edges net to zero: the count restarts per group
    length = np.zeros(2 * n, np.float64)
    length[:-1] = np.where(ev_g[1:] == ev_g[:-1], t[1:] - t[:-1], 0)
    length[active == 0] = 0.0
    wall = np.bincount(ev_g, weights=length, minlength=ng)
    per = np.divide(length, active, out=np.zeros_like(length), where=active > 0)
    F = np.concatenate(([0.0], np.cumsum(per)))  # F[k]: integral up to edge k
    pos = np.empty(2 * n, np.int64)
    pos[order] = np.arange(2 * n)
    share = F[pos[n:]] - F[pos[:n]]  # each merged interval: from its start edge to its end edge
    return wall, g, o, share


def _merged_per_owner(group: np.ndarray, owner: np.ndarray, start: np.ndarray, end: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each (group, owner)'s intervals merged into disjoint ones: (group, owner, start,
    end) of each, by group, owner, start."""
    order = np.lexsort((start, owner, group))
    group, owner, start, end = group[order], owner[order], start[order], end[order]
    head = np.ones(len(group), bool)
    head[1:] = (group[1:] != group[:-1]) | (owner[1:] != owner[:-1])
    gid = np.cumsum(head) - 1
    # running max of `end` within each (group, owner), by one accumulate over (gid, rank of
    # end) keys: ranks (< m) keep the keys exact whatever the times
    m = len(end)
    ranked = np.sort(end)
    shifted = gid * m + np.searchsorted(ranked, end, "left")
    reach = ranked[np.maximum.accumulate(shifted) - gid * m]  # max end so far in the group
    new = head.copy()
    new[1:] |= start[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    return group[heads], owner[heads], start[heads], np.maximum.reduceat(end, heads)
