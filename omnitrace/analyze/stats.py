"""Percentiles and summaries (numpy, linear interpolation like numpy's default)."""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

# the percentiles a summary gives, as np.percentile takes them (q / 100, in float64)
_Q = np.true_divide(np.array([50, 90, 99]), 100)


def summary(values: Sequence[float] | Iterable[float], scale: float = 1.0, own: bool = False
            ) -> dict[str, float]:
    """count, mean, p50, p90, p99, max (values multiplied by ``scale``); zeros when empty.
    ``own``: ``values`` is an array the caller lets go of (reordered in place, not copied)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu" and values.size and scale > 0:
        return _int_summary(values if own else values.copy(), scale)
    # a copy of our own, scaled in place, partitioned in place by the percentiles (an hour's
    # FIFO rows: 17M values, each copy ~0.1 s); the mean and max are taken before that
    a = np.array(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64)
    if a.size == 0:
        return {"count": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    a *= scale
    mean = float(a.mean())
    top = float(a.max())
    p50, p90, p99 = np.percentile(a, [50, 90, 99], overwrite_input=True)
    return {"count": int(a.size), "mean": mean, "p50": float(p50), "p90": float(p90),
            "p99": float(p99), "max": top}


def _int_summary(a: np.ndarray, scale: float) -> dict[str, float]:
    """:func:`summary` of integer ns ``a`` (ours: partitioned in place) without a float copy.
    A positive scale keeps the order, so the order statistics of the scaled values are the
    scaled order statistics of the integers: np.percentile's interpolation of those gives its
    exact floats (tests/unit/analyze: against np.percentile of the scaled copy)."""
    n = a.size
    # integer ns: the exact sum, so the mean does not depend on the rows' order (a float
    # sum's last bits do, and the report's tables are in feed order)
    mean = int(a.sum(dtype=np.int64)) / n * scale
    prev, nxt, gamma = _neighbours(n)
    top = a.max()
    at = _order_stats(a, prev.tolist(), top)
    lo = np.array([at[k] for k in prev.tolist()]).astype(np.float64) * scale
    hi = np.array([at[k] for k in nxt.tolist()]).astype(np.float64) * scale
    p50, p90, p99 = _lerp(lo, hi, gamma).tolist()
    return {"count": int(n), "mean": mean, "p50": p50, "p90": p90, "p99": p99,
            "max": float(np.float64(top) * scale)}


def _order_stats(a: np.ndarray, places: list[int], top: Any) -> dict[int, Any]:
    """The values at each of ``places`` and the next place (clipped to the last) were ``a``
    sorted, ``top`` its max; ``a`` is reordered. A selection of one place at a time, each
    on the part below the last (numpy selects one place by SIMD, several ~10x slower),
    and the next place as the least above it."""
    n = len(a)
    at: dict[int, Any] = {n - 1: top}
    hi = n
    for k in sorted(set(places), reverse=True):
        if k >= n - 1:
            continue
        a[:hi].partition(k)
        at[k] = a[k]
        if k + 1 < hi:
            at[k + 1] = a[k + 1:hi].min()
        hi = k
    return at


def _neighbours(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """np.percentile's (method 'linear') sorted places below and above each of ``_Q`` among
    ``n`` values (>= 0, not its -1 for the last), and its interpolation weights."""
    virtual = (n - 1) * _Q
    prev = np.floor(virtual)
    nxt = prev + 1
    last = virtual >= n - 1
    prev[last] = -1
    nxt[last] = -1
    prev, nxt = prev.astype(np.intp), nxt.astype(np.intp)
    gamma = np.asanyarray(virtual - prev, dtype=virtual.dtype)
    return prev % n, nxt % n, gamma


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's percentile interpolation (numpy.lib._function_base_impl._lerp), op for op."""
    diff_b_a = b - a
    out = np.add(a, diff_b_a * t)
    np.subtract(b, diff_b_a * (1 - t), out=out, where=t >= 0.5, casting="unsafe", dtype=type(out.dtype))
    return out


def median(values: Sequence[float]) -> float | None:
    return float(np.median(np.asarray(values, dtype=np.float64))) if len(values) else None


NS_TO_MS = 1e-6
NS_TO_US = 1e-3
