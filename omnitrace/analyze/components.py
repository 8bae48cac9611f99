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


def select(chunks: Any, chunk_requests: list[str], ids: set[str]) -> np.ndarray:
    """Rows of the requests in ``ids``."""
    if chunks is None or not len(chunks):
        return np.zeros(0, CHUNK_DTYPE)
    member = np.fromiter((r in ids for r in chunk_requests), bool, len(chunk_requests))
    keep = member[chunks["req"]]
    return chunks if keep.all() else chunks[keep]  # all measured (no warm-up): no copy


def incomplete(C: np.ndarray) -> dict[str, int]:
    """'span name: reason' -> count of the spans closed without their end event."""
    out: dict[str, int] = {}
    bad = C[C["reason"] != 0]
    if len(bad):
        keys, counts = np.unique(bad["name"].astype(np.int64) * 64 + bad["reason"], return_counts=True)
        for k, n in zip(keys.tolist(), counts.tolist()):
            out[f"{stt.NAMES[k // 64]}: {stt.REASONS[k % 64]}"] = int(n)
    return out


def samples(C: np.ndarray) -> dict[tuple[str, str], np.ndarray]:
    """(group, metric) -> per-chunk values, for `compare`: ("stage 0", "fifo residence ms"),
    ("stage 0", "snapshot us"), ("0->1", "put us"), ... (complete spans only)."""
    C = C[C["reason"] == 0]
    dur = (C["end"] - C["start"]).astype(np.float64)
    out: dict[tuple[str, str], np.ndarray] = {}
    for code, metric, scale in ((stt.N_FIFO, "fifo residence ms", NS_TO_MS),
                                (stt.N_SNAPSHOT, "snapshot us", NS_TO_US)):
        m = C["name"] == code
        for st in np.unique(C["stage"][m]).tolist():
            out[(f"stage {st}", metric)] = dur[m & (C["stage"] == st)] * scale
        if code == stt.N_FIFO:
            for st in np.unique(C["stage"][m]).tolist():
                sel = m & (C["stage"] == st)
                out[(f"stage {st}", "fifo blocked ms")] = np.minimum(C["v2"][sel], dur[sel]) * NS_TO_MS
    for code, metric in ((stt.N_PUT, "put us"), (stt.N_GET, "get us")):
        m = C["name"] == code
        prod = C["stage"] if code == stt.N_PUT else C["peer"]
        cons = C["peer"] if code == stt.N_PUT else C["stage"]
        for p, c in sorted(set(zip(prod[m].tolist(), cons[m].tolist()))):
            out[(cv.stage_pair(p, c), metric)] = dur[m & (prod == p) & (cons == c)] * NS_TO_US
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


def _columns(C: np.ndarray, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The complete spans' columns, each contiguous: masks over a structured table's
    strided fields, repeated per stage, cost more than copying the few columns once."""
    ok = C["reason"] == 0
    return {n: C[n][ok] for n in names}


def figures(C: np.ndarray, label: Callable[[int], str]) -> tuple[list, list, list]:
    """(fifo, snapshot, transfer) rows of the report."""
    c = _columns(C, ("name", "stage", "peer", "start", "end", "v1", "v2"))
    name, stage = c["name"], c["stage"]
    fifo = []
    F = np.flatnonzero(name == stt.N_FIFO)
    f_stage = stage[F]
    for st in np.unique(f_stage).tolist():
        m = F[f_stage == st]
        d = c["end"][m] - c["start"][m]
        res = summary(d, NS_TO_MS)
        blk = summary(np.minimum(c["v2"][m], d), NS_TO_MS)
        depth = c["v1"][m] + 1
        depth = depth[depth >= 0]
        fifo.append({"stage": label(st), "stage_id": st, "count": res["count"],
                     "residence_p50_ms": res["p50"], "residence_p99_ms": res["p99"],
                     "residence_max_ms": res["max"], "blocked_p50_ms": blk["p50"],
                     "blocked_p99_ms": blk["p99"],
                     "depth_mean": float(depth.mean()) if len(depth) else None,
                     "depth_max": int(depth.max()) if len(depth) else None,
                     "residence_hist": residence_hist(d)})
    snapshot = []
    S = np.flatnonzero(name == stt.N_SNAPSHOT)
    s_stage = stage[S]
    for st in np.unique(s_stage).tolist():
        m = S[s_stage == st]
        sm = summary(c["end"][m] - c["start"][m], NS_TO_US)
        snapshot.append({"stage": label(st), "stage_id": st, "count": sm["count"],
                         "mean_us": sm["mean"], "p50_us": sm["p50"], "p99_us": sm["p99"],
                         "max_us": sm["max"]})
    X = np.flatnonzero((name == stt.N_PUT) | (name == stt.N_GET))
    put = name[X] == stt.N_PUT
    producer = np.where(put, stage[X], c["peer"][X])
    consumer = np.where(put, c["peer"][X], stage[X])
    dur, nb = c["end"][X] - c["start"][X], c["v1"][X]
    transfer = []
    for p, q in sorted(set(zip(producer.tolist(), consumer.tolist()))):
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
