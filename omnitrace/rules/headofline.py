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

Sender busy intervals are the span builder's (:func:`omnitrace.spantable.sender_tasks`): a
task occupies its sender (stage, replica) from its dequeue to its put end, or the end of a
0-byte process of its chunk, or the next dequeue, whichever comes first. The overlaps and
their union are :mod:`omnitrace.intervals`' (the FIFO-blocking rule's one home).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnitrace import intervals, keys, rowops
from omnitrace import spantable as stt

Busy = dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass
class Victim:
    """What the critical-path walk of one request gives this computation."""

    req: int  # index into the chunk table's request list
    arrival: int
    first_packet: int
    hops: list[tuple[int, int, int]]  # (producer, consumer, gating chunk)


def _sender_key(stage: np.ndarray, replica: np.ndarray) -> np.ndarray:
    """The one sender key (``keys.sender_key``) of a report's sender: its replica and stage."""
    return keys.sender_key(replica, stage)


def _busy_key(key: int) -> tuple[int, int]:
    """The :data:`Busy` key (stage, replica) of one :func:`_sender_key`."""
    replica, stage = keys.sender_of(key)
    return stage, replica


def busy_from(stage: np.ndarray, replica: np.ndarray, starts: np.ndarray, ends: np.ndarray,
              reqs: np.ndarray) -> Busy:
    """Sender tasks as flat columns -> :data:`Busy`, each sender's sorted by start (one
    replica's tasks from several processes or run directories keep one timeline)."""
    key = _sender_key(stage, replica)
    order = np.lexsort((starts, key))
    out: Busy = {}
    for k, rows in keys.groups(key[order]):
        o = order[rows]
        out[_busy_key(k)] = (starts[o], ends[o], reqs[o])
    return out


def busy_of(parts: list[tuple[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]]) -> Busy:
    """Sender tasks in pieces, each ((stage, replica), (starts, ends, requests)) -> :data:`Busy`:
    the pieces of one (stage, replica) merged into one timeline."""
    if not parts:
        return {}
    lens = [len(v[0]) for _, v in parts]
    return busy_from(np.repeat([k[0] for k, _ in parts], lens), np.repeat([k[1] for k, _ in parts], lens),
                     *(np.concatenate([v[i] for _, v in parts]) for i in range(3)))


def busy_by_replica(senders: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]],
                    replica_of: dict[int, int]) -> Busy:
    """Each sender's (pid, stage) tasks (starts, ends, requests, in the order the builder
    closed them) -> Busy per (stage, replica); ``replica_of``: pid -> replica.
    A replica served by one sender process keeps its columns as they are (a sort of an
    hour's tasks, 3 s, when they are in time order already); several are merged."""
    by: dict[tuple[int, int], list] = {}
    for (pid, stage), cols in senders.items():
        if len(cols[0]):
            by.setdefault((stage, replica_of.get(pid, 0)), []).append(cols)
    out: Busy = {}
    for (stage, replica), parts in by.items():
        starts, ends, reqs = parts[0]
        if len(parts) == 1 and not (starts[1:] < starts[:-1]).any():
            out[(stage, replica)] = (starts, ends, reqs)
            continue
        out.update(busy_of([((stage, replica), p) for p in parts]))
    return out


def _hop_key(req: np.ndarray, producer: np.ndarray, consumer: np.ndarray) -> np.ndarray:
    """(request, producer stage, consumer stage) as one sortable int64 (a request id needs
    all 32 bits: more than ``keys.pack``'s signed fields hold beside two stages)."""
    return ((req.astype(np.int64) << 32) | ((producer.astype(np.int64) + 1) << 16)
            | (consumer.astype(np.int64) + 1))


def fifo_by_hop(chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The complete FIFO rows of ``chunks`` (columns the waits read) sorted by their
    (request, producer, consumer) key, and the keys: made once for every victim batch."""
    fifo = rowops.select(chunks, (chunks["reason"] == 0) & (chunks["name"] == stt.N_FIFO))
    key = _hop_key(fifo["req"], fifo["stage"], fifo["peer"])
    order = np.argsort(key, kind="stable")
    cols = np.empty(len(fifo), [(n, fifo.dtype[n]) for n in ("req", "replica", "chunk", "start", "end")])
    for n in cols.dtype.names:
        cols[n] = fifo[n][order]
    return cols, key[order]


def _critical_waits(victims: list[Victim], fifo: np.ndarray, key: np.ndarray) -> dict[str, np.ndarray]:
    """The FIFO waits of every victim's critical-path chunks, clipped to [arrival, first
    packet]: columns vi (victim index), prod, replica, w0, w1 (``fifo``, ``key``: from
    :func:`fifo_by_hop`)."""
    hops = np.array([(i, v.req, p, c, g, v.arrival, v.first_packet)
                     for i, v in enumerate(victims) for p, c, g in v.hops], np.int64).reshape(-1, 7)
    hkey = _hop_key(hops[:, 1], hops[:, 2], hops[:, 3])
    h, row = intervals.expand_ranges(np.searchsorted(key, hkey, "left"), np.searchsorted(key, hkey, "right"))
    f = rowops.take(fifo, row)
    ok = f["chunk"] <= hops[h, 4]
    h, f = h[ok], f[ok]
    w0 = np.maximum(f["start"], hops[h, 5])
    w1 = np.minimum(f["end"], hops[h, 6])
    ok = w1 > w0
    return {"vi": hops[h, 0][ok], "prod": hops[h, 2][ok], "replica": f["replica"][ok].astype(np.int64),
            "w0": w0[ok], "w1": w1[ok], "req": f["req"][ok].astype(np.int64)}


def _pieces(waits: dict[str, np.ndarray], busy: Busy) -> dict[str, np.ndarray]:
    """Each (critical-path wait, other request's sender task) overlap: vi, start, end,
    culprit, prod, task (the task's start: identifies it on its sender)."""
    parts = []
    for k, sel in keys.groups(_sender_key(waits["prod"], waits["replica"])):
        snd = busy.get(_busy_key(k))
        if snd is None:
            continue
        starts, ends, reqs = snd
        q, iv, ps, pe = intervals.other_pieces(starts, ends, reqs, waits["w0"][sel], waits["w1"][sel],
                                               waits["req"][sel])
        parts.append((waits["vi"][sel][q], ps, pe, reqs[iv].astype(np.int64), waits["prod"][sel][q], starts[iv]))
    cols = ("vi", "start", "end", "culprit", "prod", "task")
    if not parts:
        return {c: np.zeros(0, np.int64) for c in cols}
    return {c: np.concatenate([p[i] for p in parts]) for i, c in enumerate(cols)}


@dataclass
class Pairs:
    """Wall-time blocking as arrays: per victim index (``wall``, ``chunk_ns``, ``culprits``:
    how many requests blocked it) and per (victim, culprit) pair (``victim``, ``culprit``,
    ``pair_wall``, ``pair_chunk``, ``pair_tasks``). An hour's run has millions of pairs:
    the report makes objects only of the largest."""

    wall: np.ndarray
    chunk_ns: np.ndarray
    culprits: np.ndarray
    victim: np.ndarray
    culprit: np.ndarray
    pair_wall: np.ndarray
    pair_chunk: np.ndarray
    pair_tasks: np.ndarray

    @staticmethod
    def unblocked(victims: int) -> "Pairs":
        """``victims`` victims that nothing blocked (no pairs)."""
        none = np.zeros(0, np.int64)
        return Pairs(np.zeros(victims), np.zeros(victims, np.int64), np.zeros(victims, np.int64), none, none,
                     np.zeros(0), none, none)


VICTIM_BATCH = 2048  # victims computed at once: their (wait, task) overlaps are the temporaries


def blocked_pairs(victims: list[Victim], chunks: np.ndarray, busy: Busy,
                  fifo: tuple[np.ndarray, np.ndarray] | None = None) -> Pairs:
    """Wall-time head-of-line blocking of each victim (see the module doc), vectorised
    over a batch of victims at a time (tests/support/hol_reference.py is the per-victim loop it is
    tested against); victims are independent, so batches only bound the memory. ``busy``:
    the senders' tasks as the span builder closed them (``Feed.busy``); ``fifo``: the
    :func:`fifo_by_hop` of ``chunks`` where the caller made it already (once for two processes)."""
    fifo = fifo_by_hop(chunks) if fifo is None else fifo
    return joined([_batch_pairs(victims[i:i + VICTIM_BATCH], fifo, busy)
                   for i in range(0, max(len(victims), 1), VICTIM_BATCH)])


def joined(parts: list[Pairs]) -> Pairs:
    """The pairs of consecutive runs of victims as those of all of them (victim indexes
    offset; each part's pairs are in (victim, culprit) order, and so is the whole)."""
    if len(parts) == 1:
        return parts[0]
    offsets = np.cumsum([0] + [len(p.wall) for p in parts[:-1]])
    return Pairs(*(np.concatenate([getattr(p, f) + (off if f == "victim" else 0)
                                   for p, off in zip(parts, offsets)])
                   for f in Pairs.__dataclass_fields__))


def _batch_pairs(victims: list[Victim], fifo: tuple[np.ndarray, np.ndarray], busy: Busy) -> Pairs:
    nv = len(victims)
    out = Pairs.unblocked(nv)
    if not victims or not len(fifo[0]) or not busy:
        return out
    p = _pieces(_critical_waits(victims, *fifo), busy)
    if not len(p["vi"]):
        return out
    (out.wall, out.chunk_ns, out.victim, out.culprit, out.pair_wall, out.pair_chunk,
     out.pair_tasks) = intervals.pair_figures(p["vi"], p["culprit"], p["start"], p["end"], p["prod"],
                                               p["task"], nv)
    out.culprits = np.bincount(out.victim, minlength=nv)
    return out
