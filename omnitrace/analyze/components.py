"""Per-stage component figures from the run's chunk span table: FIFO residence, snapshot
cost, put/get per stage pair. They need no API requests, so runs of the real vLLM-Omni
adapter pair under a harness have them too, and `compare` compares them.

Spans closed without their end event (``reason`` != 0) are left out of every figure and
counted by span and reason instead: their durations end at an arbitrary moment.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from omnitrace import conventions as cv
from omnitrace import spantable as stt
from omnitrace.analyze.stats import NS_TO_MS, NS_TO_US, summary
from omnitrace.analyze.tables import CHUNK_DTYPE


class Rows:
    """The measured requests' rows of the run's chunk table, as a mask (a 150M-event run's
    table is ~2.4 GB: never copied whole); each figure gathers only its own rows' columns."""

    def __init__(self, chunks: Any, chunk_requests: list[str], ids: set[str]) -> None:
        self.C = chunks if chunks is not None else np.zeros(0, CHUNK_DTYPE)
        member = np.fromiter((r in ids for r in chunk_requests), bool, len(chunk_requests))
        self.keep = member[self.C["req"]]
        self._complete = self.keep & (self.C["reason"] == 0)

    def of(self, *codes: int) -> np.ndarray:
        """Indices of the complete rows of these span names."""
        name = self.C["name"]
        m = name == codes[0]
        for c in codes[1:]:
            m |= name == c
        return np.flatnonzero(self._complete & m)

    def col(self, name: str, idx: np.ndarray) -> np.ndarray:
        return self.C[name][idx]

    def dur(self, idx: np.ndarray) -> np.ndarray:
        return self.C["end"][idx] - self.C["start"][idx]


def incomplete(R: Rows) -> dict[str, int]:
    """'span name: reason' -> count of the spans closed without their end event."""
    out: dict[str, int] = {}
    bad = R.C[R.keep & (R.C["reason"] != 0)]
    if len(bad):
        keys, counts = np.unique(bad["name"].astype(np.int64) * 64 + bad["reason"], return_counts=True)
        for k, n in zip(keys.tolist(), counts.tolist()):
            out[f"{stt.NAMES[k // 64]}: {stt.REASONS[k % 64]}"] = int(n)
    return out


def _transfers(R: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(indices, is put, producer, consumer) of the put and get rows."""
    X = R.of(stt.N_PUT, stt.N_GET)
    put = R.col("name", X) == stt.N_PUT
    stage, peer = R.col("stage", X), R.col("peer", X)
    return X, put, np.where(put, stage, peer), np.where(put, peer, stage)


def _pairs(producer: np.ndarray, consumer: np.ndarray) -> list[tuple[int, int]]:
    """The distinct (producer, consumer) stage pairs, sorted (no Python tuple per row)."""
    key = np.unique(((producer.astype(np.int64) + 32768) << 16) | (consumer.astype(np.int64) + 32768))
    return [((k >> 16) - 32768, (k & 0xFFFF) - 32768) for k in key.tolist()]


def samples(R: Rows) -> dict[tuple[str, str], np.ndarray]:
    """(group, metric) -> per-chunk values, for `compare`: ("stage 0", "fifo residence ms"),
    ("stage 0", "snapshot us"), ("0->1", "put us"), ... (complete spans only)."""
    out: dict[tuple[str, str], np.ndarray] = {}
    for code, metric, scale in ((stt.N_FIFO, "fifo residence ms", NS_TO_MS),
                                (stt.N_SNAPSHOT, "snapshot us", NS_TO_US)):
        idx = R.of(code)
        stage, dur = R.col("stage", idx), R.dur(idx).astype(np.float64)
        for st in np.unique(stage).tolist():
            out[(f"stage {st}", metric)] = dur[stage == st] * scale
        if code == stt.N_FIFO:
            blocked = np.minimum(R.col("v2", idx), dur)
            for st in np.unique(stage).tolist():
                out[(f"stage {st}", "fifo blocked ms")] = blocked[stage == st] * NS_TO_MS
    X, put, prod, cons = _transfers(R)
    dur = R.dur(X).astype(np.float64)
    for tag, sel in (("put us", put), ("get us", ~put)):
        for p, c in _pairs(prod[sel], cons[sel]):
            out[(cv.stage_pair(p, c), tag)] = dur[sel & (prod == p) & (cons == c)] * NS_TO_US
    return out


# FIFO residence histogram bins, the same for every stage and every run (so stages and
# runs compare bin by bin): 8 log-spaced bins per decade from 1 us to 100 s, plus an
# underflow and an overflow bin. A run's JSON holds counts, not one value per task (a
# 10-minute c=32 run has millions of FIFO tasks).
RESIDENCE_EDGES_MS = np.logspace(-3, 5, 8 * 8 + 1)


def residence_hist(dur_ns: np.ndarray) -> dict[str, Any]:
    """Counts of ``dur_ns`` in ``RESIDENCE_EDGES_MS`` (``counts[0]`` below the first edge,
    ``counts[-1]`` above the last)."""
    counts = np.bincount(np.searchsorted(RESIDENCE_EDGES_MS, dur_ns * NS_TO_MS, "right"),
                         minlength=len(RESIDENCE_EDGES_MS) + 1)
    return {"edges_ms": RESIDENCE_EDGES_MS.tolist(), "counts": counts.tolist()}


def figures(R: Rows, label: Callable[[int], str]) -> tuple[list, list, list]:
    """(fifo, snapshot, transfer) rows of the report."""
    fifo = []
    F = R.of(stt.N_FIFO)
    f_stage, f_dur = R.col("stage", F), R.dur(F)
    f_v1, f_v2 = R.col("v1", F), R.col("v2", F)
    for st in np.unique(f_stage).tolist():
        m = f_stage == st
        d = f_dur[m]
        res = summary(d, NS_TO_MS)
        blk = summary(np.minimum(f_v2[m], d), NS_TO_MS)
        depth = f_v1[m] + 1
        depth = depth[depth >= 0]
        fifo.append({"stage": label(st), "stage_id": st, "count": res["count"],
                     "residence_p50_ms": res["p50"], "residence_p99_ms": res["p99"],
                     "residence_max_ms": res["max"], "blocked_p50_ms": blk["p50"],
                     "blocked_p99_ms": blk["p99"],
                     "depth_mean": float(depth.mean()) if len(depth) else None,
                     "depth_max": int(depth.max()) if len(depth) else None,
                     "residence_hist": residence_hist(d)})
    del F, f_stage, f_dur, f_v1, f_v2
    snapshot = []
    S = R.of(stt.N_SNAPSHOT)
    s_stage, s_dur = R.col("stage", S), R.dur(S)
    for st in np.unique(s_stage).tolist():
        sm = summary(s_dur[s_stage == st], NS_TO_US)
        snapshot.append({"stage": label(st), "stage_id": st, "count": sm["count"],
                         "mean_us": sm["mean"], "p50_us": sm["p50"], "p99_us": sm["p99"],
                         "max_us": sm["max"]})
    del S, s_stage, s_dur
    X, put, producer, consumer = _transfers(R)
    dur, nb = R.dur(X), R.col("v1", X)
    transfer = []
    for p, q in _pairs(producer, consumer):
        row: dict[str, Any] = {"pair": cv.stage_pair(p, q)}
        for sel, tag in ((put, "put"), (~put, "get")):
            m = sel & (producer == p) & (consumer == q)
            sm = summary(dur[m], NS_TO_US)
            nbytes, total = int(nb[m].sum()), int(dur[m].sum())
            n = int(m.sum())
            row[tag] = {"count": sm["count"], "p50_us": sm["p50"], "p99_us": sm["p99"],
                        "mean_bytes": nbytes / n if n else 0.0,
                        "bandwidth_mb_s": (nbytes / 1e6) / (total / 1e9) if total > 0 else None}
        transfer.append(row)
    return fifo, snapshot, transfer
