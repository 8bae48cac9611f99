"""Head-of-line blocking in wall time.

For one victim request: the wall-clock time, between its arrival and its first audio
packet, during which at least one of its chunks on the critical path waited in a FIFO
while that FIFO's sender worked on OTHER requests' tasks; split among those requests.

* Chunks on the critical path: for each hop (producer P -> consumer S, gating chunk c) of
  the victim's attribution, its P->S chunks with index <= c (S takes them in order, so
  each one delayed the gating one). Several of them often wait at once.
* The waits are clipped to [arrival, first packet] and their union is taken, so a moment
  counts once however many chunks waited in it: the total can never exceed the TTFP.
* A moment is charged to the request whose task occupied the sender then; when two
  senders were blocked at once (two hops overlapping) it is split evenly between them.

The chunk-time sum (each chunk's blocked time added up, as `omni.fifo.blocked_ns` does
per span) is kept beside it, labelled, to show how much the waits overlapped.

Sender busy intervals are rebuilt from the chunk spans by the span builder's rule
(:mod:`omnitrace.spantable`): a task occupies its sender (stage, replica) from its
dequeue to its put end, or the end of a 0-byte process of its chunk, or the next dequeue,
whichever comes first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from omnitrace import spantable as stt

_NEVER = np.iinfo(np.int64).max

Busy = dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass
class Victim:
    """What the critical-path walk of one request gives this computation."""

    req: int  # index into the chunk table's request list
    arrival: int
    first_packet: int
    hops: list[tuple[int, int, int]]  # (producer, consumer, gating chunk)


@dataclass
class Blocked:
    req: int
    wall_ns: float = 0.0
    chunk_ns: int = 0  # per-chunk sum (overlapping waits counted once per chunk)
    by_culprit: dict[int, list] = field(default_factory=dict)  # culprit -> [wall, chunk, tasks]


def sender_busy(chunks: np.ndarray) -> Busy:
    """(stage, replica) -> (starts, ends, request) of the sender's tasks, sorted, disjoint."""
    ok = chunks["reason"] == 0
    fifo = chunks[ok & (chunks["name"] == stt.N_FIFO)]
    closers = chunks[ok & ((chunks["name"] == stt.N_PUT)
                           | ((chunks["name"] == stt.N_PROCESS) & (chunks["v1"] == 0)))]
    fkey = (fifo["stage"].astype(np.int64) << 16) | (fifo["replica"].astype(np.int64) & 0xFFFF)
    ckey = (closers["stage"].astype(np.int64) << 16) | (closers["replica"].astype(np.int64) & 0xFFFF)
    out: Busy = {}
    for k in np.unique(fkey).tolist():
        f = fifo[fkey == k]
        f = f[np.argsort(f["end"], kind="stable")]
        deq, req, chunk = f["end"], f["req"], f["chunk"]
        end = np.empty_like(deq)
        end[:-1], end[-1] = deq[1:], _NEVER  # the next dequeue closes a task at the latest
        c = closers[ckey == k]
        idx = np.searchsorted(deq, c["start"], "right") - 1  # the task the closer belongs to
        i = np.maximum(idx, 0)
        mine = (idx >= 0) & (req[i] == c["req"]) & ((c["name"] == stt.N_PUT) | (chunk[i] == c["chunk"]))
        np.minimum.at(end, i[mine], c["end"][mine])
        done = end != _NEVER  # the last task without a closer is still open: not counted
        out[(k >> 16, int(np.int16(k & 0xFFFF)))] = (deq[done], np.maximum(end[done], deq[done]),
                                                      req[done])
    return out


def _union_split(pieces: list[tuple[int, int, int]]) -> tuple[float, dict[int, float]]:
    """Union length of (start, end, culprit) pieces and each culprit's even share of it
    (a sweep over the pieces' edges; a culprit active twice at once counts once)."""
    edges = sorted([(s, 1, c) for s, _, c in pieces] + [(e, -1, c) for _, e, c in pieces])
    active: dict[int, int] = {}
    share: dict[int, float] = {}
    total = 0.0
    prev = edges[0][0] if edges else 0
    for t, d, c in edges:
        if t > prev and active:
            total += t - prev
            for x in active:
                share[x] = share.get(x, 0.0) + (t - prev) / len(active)
        prev = t
        n = active.get(c, 0) + d
        if n:
            active[c] = n
        else:
            del active[c]
    return total, share


def blocked(victims: Iterable[Victim], chunks: np.ndarray, busy: Busy | None = None) -> list[Blocked]:
    """Wall-time head-of-line blocking of each victim (see the module doc)."""
    if busy is None:
        busy = sender_busy(chunks)
    fifo = chunks[(chunks["reason"] == 0) & (chunks["name"] == stt.N_FIFO)]
    fifo = fifo[np.argsort(fifo["req"], kind="stable")]
    freq = np.ascontiguousarray(fifo["req"])  # a strided field view is copied per searchsorted
    out = []
    for v in victims:
        res = Blocked(v.req)
        lo, hi = np.searchsorted(freq, [v.req, v.req + 1])
        mine = fifo[lo:hi]
        pieces: list[tuple[int, int, int]] = []
        tasks: set[tuple[int, int]] = set()
        for prod, cons, gate in v.hops:
            rows = mine[(mine["stage"] == prod) & (mine["peer"] == cons) & (mine["chunk"] <= gate)]
            for start, end, replica in zip(rows["start"].tolist(), rows["end"].tolist(),
                                           rows["replica"].tolist()):
                w0, w1 = max(start, v.arrival), min(end, v.first_packet)
                snd = busy.get((prod, replica))
                if w1 <= w0 or snd is None:
                    continue
                starts, ends, reqs = snd
                a = int(np.searchsorted(ends, w0, "right"))
                b = int(np.searchsorted(starts, w1, "left"))
                for s, e, c in zip(starts[a:b].tolist(), ends[a:b].tolist(), reqs[a:b].tolist()):
                    if c == v.req or min(e, w1) <= max(s, w0):
                        continue
                    entry = res.by_culprit.setdefault(c, [0.0, 0, 0])
                    entry[1] += min(e, w1) - max(s, w0)
                    res.chunk_ns += min(e, w1) - max(s, w0)
                    if (prod, s) not in tasks:  # one culprit task may block several chunks
                        tasks.add((prod, s))
                        entry[2] += 1
                    pieces.append((max(s, w0), min(e, w1), c))
        if pieces:
            res.wall_ns, share = _union_split(pieces)
            for c, ns in share.items():
                res.by_culprit[c][0] = ns
        out.append(res)
    return out
