"""Percentiles and summaries (numpy, linear interpolation like numpy's default)."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np


def summary(values: Sequence[float] | Iterable[float], scale: float = 1.0) -> dict[str, float]:
    """count, mean, p50, p90, p99, max (values multiplied by ``scale``); zeros when empty."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu" and values.size:
        # integer ns: the exact sum, so the mean does not depend on the rows' order (a float
        # sum's last bits do, and the report's tables are in feed order)
        mean = int(values.sum(dtype=np.int64)) / values.size * scale
    else:
        mean = None
    # a copy of our own, scaled in place, partitioned in place by the percentiles (an hour's
    # FIFO rows: 17M values, each copy ~0.1 s); the mean and max are taken before that
    a = np.array(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64)
    if a.size == 0:
        return {"count": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    a *= scale
    if mean is None:
        mean = float(a.mean())
    top = float(a.max())
    p50, p90, p99 = np.percentile(a, [50, 90, 99], overwrite_input=True)
    return {"count": int(a.size), "mean": mean, "p50": float(p50), "p90": float(p90),
            "p99": float(p99), "max": top}


def median(values: Sequence[float]) -> float | None:
    return float(np.median(np.asarray(values, dtype=np.float64))) if len(values) else None


NS_TO_MS = 1e-6
NS_TO_US = 1e-3
