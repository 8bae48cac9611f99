"""The first head-of-line implementation, a per-victim Python loop, kept as the reference
that the vectorised ``omnitrace.rules.headofline.blocked_pairs`` is tested against: both must
give the same wall time, chunk-time sum, culprits and task counts for the same schedule
(tests/unit/rules/test_headofline.py). And the senders' tasks rebuilt from chunk spans
(:func:`sender_busy`), what the builder's own (``Feed.busy``) are tested against
(tests/unit/test_spantable.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from omnitrace import spantable as stt
from omnitrace.conventions import Ev
from omnitrace.eventlog import EVENT_DTYPE
from omnitrace.rules.headofline import Busy, Victim, blocked_pairs


@dataclass
class Blocked:
    req: int
    wall_ns: float = 0.0
    chunk_ns: int = 0  # per-chunk sum (overlapping waits counted once per chunk)
    by_culprit: dict[int, list] = field(default_factory=dict)  # culprit -> [wall, chunk, tasks]


def sender_busy(spans: np.ndarray) -> Busy:
    """(stage, replica) -> (starts, ends, request) of the sender's tasks, rebuilt from chunk
    span rows (``spantable.CHUNK_DTYPE``) by the builder's rule (``spantable.sender_tasks``)
    over the stamps the spans keep: a FIFO span ends at its dequeue, a put at its PUT_END,
    a process at its PROCESS_END."""
    name = spans["name"]
    sel = np.flatnonzero((spans["reason"] == 0) & ((name == stt.N_FIFO) | (name == stt.N_PUT)
                                                   | (name == stt.N_PROCESS)))
    ev = np.zeros(len(sel), EVENT_DTYPE)
    kind = np.zeros(len(stt.NAMES), np.int64)
    kind[[stt.N_FIFO, stt.N_PUT, stt.N_PROCESS]] = Ev.FIFO_DEQUEUE, Ev.PUT_END, Ev.PROCESS_END
    ev["kind"] = kind[name[sel]]
    for col in ("req", "chunk", "stage"):
        ev[col] = spans[col][sel]
    ev["t"] = spans["end"][sel]
    ev["a"] = np.where(name[sel] == stt.N_PROCESS, spans["figure"][sel], 0)  # a process end's bytes
    replica = spans["replica"][sel]
    out: Busy = {}
    for stage, rep in sorted(set(zip(ev["stage"].tolist(), replica.tolist()))):
        seq = ev[(ev["stage"] == stage) & (replica == rep)]
        # one sender's stamps in time order; at one time a closer before a dequeue (ring order)
        seq = seq[np.lexsort((seq["kind"] == Ev.FIFO_DEQUEUE, seq["t"]))]
        d, start, end, _ = stt.sender_tasks(seq)
        if len(d):
            out[(stage, rep)] = (start, end, seq["req"][d])
    return out


def as_blocked(victims: list[Victim], chunks: np.ndarray, busy: Busy) -> list[Blocked]:
    """``headofline.blocked_pairs`` in the reference's shape: one Blocked per victim."""
    p = blocked_pairs(victims, chunks, busy)
    out = [Blocked(v.req) for v in victims]
    for i in np.flatnonzero(p.chunk_ns).tolist():
        out[i].chunk_ns, out[i].wall_ns = int(p.chunk_ns[i]), float(p.wall[i])
    for v, c, w, cn, tk in zip(p.victim.tolist(), p.culprit.tolist(), p.pair_wall.tolist(),
                               p.pair_chunk.tolist(), p.pair_tasks.tolist()):
        out[v].by_culprit[c] = [w, cn, tk]
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
