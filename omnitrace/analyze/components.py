"""Per-stage component figures from the run's chunk spans (``tables.ChunkFigures``): FIFO
residence, snapshot cost, put/get per stage pair. They need no API requests, so runs of the
real vLLM-Omni adapter pair under a harness have them too, and `compare` compares them.

Spans closed without their end event (``reason`` != 0) are left out of every figure and
counted by span and reason instead: their durations end at an arbitrary moment.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from omnitrace import conventions as cv
from omnitrace import rowops
from omnitrace import spantable as stt
from omnitrace.analyze.stats import NS_TO_MS, NS_TO_US, summary
from omnitrace.analyze.tables import ChunkFigures


class Rows:
    """The measured requests' rows of the run's figure tables (``tables.ChunkFigures``):
    each figure gathers its own columns by index (an hour's tables are GBs: never copied
    whole)."""

    def __init__(self, figures: ChunkFigures | None, chunk_requests: list[str], ids: set[str]) -> None:
        self.F = figures if figures is not None else ChunkFigures.empty()
        self._member = np.fromiter((r in ids for r in chunk_requests), bool, len(chunk_requests))

    def member(self, table: np.ndarray) -> np.ndarray:
        """Which of ``table``'s rows are the measured requests'."""
        return np.take(self._member, table["req"])

    def cols(self, table: np.ndarray, *names: str) -> list[np.ndarray]:
        """These columns of ``table``'s measured rows."""
        member = self.member(table)
        # a boolean mask: ~9x faster than gathering by index from a field of packed rows
        # (strided), 17M FIFO rows 0.54 -> 0.06 s a column
        return [table[n][member] for n in names]


def incomplete(R: Rows) -> dict[str, int]:
    """'span name: reason' -> count of the spans closed without their end event."""
    out: dict[str, int] = {}
    name, reason = R.cols(R.F.incomplete, "name", "reason")
    keys, counts = np.unique(name.astype(np.int64) * 64 + reason, return_counts=True)
    for k, n in zip(keys.tolist(), counts.tolist()):
        out[f"{stt.NAMES[k // 64]}: {stt.REASONS[k % 64]}"] = int(n)
    return out


def _pairs(producer: np.ndarray, consumer: np.ndarray) -> list[tuple[int, int]]:
    """The distinct (producer, consumer) stage pairs, sorted (no Python tuple per row)."""
    key = rowops.distinct(((producer.astype(np.int64) + 32768) << 16) | (consumer.astype(np.int64) + 32768))
    return [((k >> 16) - 32768, (k & 0xFFFF) - 32768) for k in key]


def samples(R: Rows) -> dict[tuple[str, str], np.ndarray]:
    """(group, metric) -> per-chunk values, for `compare`: ("stage 0", "fifo residence ms"),
    ("stage 0", "snapshot us"), ("0->1", "put us"), ... (complete spans only)."""
    out: dict[tuple[str, str], np.ndarray] = {}
    stage, dur, blocked = R.cols(R.F.fifo, "stage", "dur", "blocked")
    for st in rowops.distinct(stage):
        m = stage == st
        out[(f"stage {st}", "fifo residence ms")] = dur[m] * NS_TO_MS
        out[(f"stage {st}", "fifo blocked ms")] = np.minimum(blocked[m], dur[m]) * NS_TO_MS
    stage, dur = R.cols(R.F.snapshot, "stage", "dur")
    for st in rowops.distinct(stage):
        out[(f"stage {st}", "snapshot us")] = dur[stage == st] * NS_TO_US
    put, prod, cons, dur = R.cols(R.F.transfer, "put", "producer", "consumer", "dur")
    for tag, sel in (("put us", put), ("get us", ~put)):
        for p, c in _pairs(prod[sel], cons[sel]):
            out[(cv.stage_pair(p, c), tag)] = dur[sel & (prod == p) & (cons == c)] * NS_TO_US
    return out


# FIFO residence histogram bins, the same for every stage and every run (so stages and
# runs compare bin by bin): 8 log-spaced bins per decade from 1 us to 100 s, plus an
# underflow and an overflow bin. A run's JSON holds counts, not one value per task (a
# 10-minute c=32 run has millions of FIFO tasks).
RESIDENCE_EDGES_MS = np.logspace(-3, 5, 8 * 8 + 1)


def _first_ns_at(edge_ms: float) -> int:
    """The least integer ns whose ms (ns * NS_TO_MS, as numpy computes it) reach ``edge_ms``."""
    t = int(np.ceil(edge_ms / NS_TO_MS))
    while np.float64(t - 1) * NS_TO_MS >= edge_ms:
        t -= 1
    while np.float64(t) * NS_TO_MS < edge_ms:
        t += 1
    return t


# the edges in integer ns: a bin by integer comparisons (no ms copy of an hour's FIFO rows)
RESIDENCE_EDGES_NS = np.array([_first_ns_at(e) for e in RESIDENCE_EDGES_MS.tolist()], np.int64)


def residence_hist(dur_ns: np.ndarray) -> dict[str, Any]:
    """Counts of ``dur_ns`` in ``RESIDENCE_EDGES_MS`` (``counts[0]`` below the first edge,
    ``counts[-1]`` above the last): integer ns by ``RESIDENCE_EDGES_NS``, as their ms would
    bin (:func:`residence_hist_reference`)."""
    if dur_ns.dtype.kind not in "iu":
        return residence_hist_reference(dur_ns)
    counts = np.bincount(np.searchsorted(RESIDENCE_EDGES_NS, dur_ns.astype(np.int64, copy=False), "right"),
                         minlength=len(RESIDENCE_EDGES_MS) + 1)
    return {"edges_ms": RESIDENCE_EDGES_MS.tolist(), "counts": counts.tolist()}


def residence_hist_reference(dur_ns: np.ndarray) -> dict[str, Any]:
    """:func:`residence_hist` by the ms of each value."""
    counts = np.bincount(np.searchsorted(RESIDENCE_EDGES_MS, dur_ns * NS_TO_MS, "right"),
                         minlength=len(RESIDENCE_EDGES_MS) + 1)
    return {"edges_ms": RESIDENCE_EDGES_MS.tolist(), "counts": counts.tolist()}


def figures(R: Rows, label: Callable[[int], str]) -> tuple[list, list, list]:
    """(fifo, snapshot, transfer) rows of the report. Every figure is a percentile, an
    integer sum or a count: none depends on the rows' order, so each stage's values are
    gathered from the table (a mask per stage) and reordered in place by its percentiles,
    one stage at a time (the measured rows' columns all at once were the report's peak)."""
    return _fifo(R, label), _snapshot(R, label), _transfer(R)


def _by_stage(R: Rows, table: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """Each stage of ``table``'s measured rows, with the mask of its rows in ``table``."""
    member = R.member(table)
    stage = table["stage"]
    if not len(stage):
        return
    lo, hi = int(stage.min()), int(stage.max())
    # a few stages: a comparison each (no gathered or widened copy of the column to count them)
    for st in range(lo, hi + 1) if hi - lo < 64 else rowops.distinct(stage[member]):
        m = stage == st
        m &= member
        if m.any():
            yield st, m


def _fifo(R: Rows, label: Callable[[int], str]) -> list[dict[str, Any]]:
    fifo = []
    t = R.F.fifo
    for st, m in _by_stage(R, t):
        depth_mean, depth_max = _depth(t["ahead"][m])
        d = t["dur"][m]
        blocked = t["blocked"][m]
        blk = summary(np.minimum(blocked, d, out=blocked), NS_TO_MS, own=True)
        del blocked, m
        hist = residence_hist(d)
        res = summary(d, NS_TO_MS, own=True)
        fifo.append({"stage": label(st), "stage_id": st, "count": res["count"],
                     "residence_p50_ms": res["p50"], "residence_p99_ms": res["p99"],
                     "residence_max_ms": res["max"], "blocked_p50_ms": blk["p50"],
                     "blocked_p99_ms": blk["p99"], "depth_mean": depth_mean, "depth_max": depth_max,
                     "residence_hist": hist})
    return fifo


def _depth(ahead: np.ndarray) -> tuple[float | None, int | None]:
    """Mean and max FIFO depth (tasks ahead + 1) of the tasks whose depth is known (>= 0)."""
    ahead = ahead[ahead >= -1]
    if not len(ahead):
        return None, None
    n = len(ahead)
    total = int(ahead.sum(dtype=np.int64)) + n
    if total < 2 ** 53 and int(ahead.min()) >= -1:
        # every partial sum of the depths is an integer below 2^53, so numpy's float mean of
        # them is exactly this quotient (no int64 copy of an hour's FIFO rows)
        mean = float(np.float64(total) / n)
    else:
        mean = float((ahead.astype(np.int64) + 1).mean())
    return mean, int(ahead.max()) + 1


def _snapshot(R: Rows, label: Callable[[int], str]) -> list[dict[str, Any]]:
    snapshot = []
    for st, m in _by_stage(R, R.F.snapshot):
        sm = summary(R.F.snapshot["dur"][m], NS_TO_US, own=True)
        snapshot.append({"stage": label(st), "stage_id": st, "count": sm["count"],
                         "mean_us": sm["mean"], "p50_us": sm["p50"], "p99_us": sm["p99"],
                         "max_us": sm["max"]})
    return snapshot


def _transfer(R: Rows) -> list[dict[str, Any]]:
    t = R.F.transfer
    member = R.member(t)
    producer, consumer = t["producer"], t["consumer"]
    transfer = []
    for p, q in _pairs(producer[member], consumer[member]):
        row: dict[str, Any] = {"pair": cv.stage_pair(p, q)}
        pair = member & (producer == p) & (consumer == q)
        put = t["put"]
        for sel, tag in ((pair & put, "put"), (pair & ~put, "get")):
            nbytes = int(t["bytes"][sel].sum())
            d = t["dur"][sel]
            del sel
            total = int(d.sum())
            sm = summary(d, NS_TO_US, own=True)
            n = sm["count"]
            row[tag] = {"count": n, "p50_us": sm["p50"], "p99_us": sm["p99"],
                        "mean_bytes": nbytes / n if n else 0.0,
                        "bandwidth_mb_s": (nbytes / 1e6) / (total / 1e9) if total > 0 else None}
        transfer.append(row)
    return transfer
