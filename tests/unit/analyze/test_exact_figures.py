"""The component figures without float copies (analyze/stats.py's integer summary,
analyze/components.py's integer-ns histogram) give the floats and counts of the float
computations they replace, on many random inputs (the report JSON is compared byte for
byte)."""
from __future__ import annotations

import numpy as np

from omnitrace.analyze import components, stats


def float_summary(values: np.ndarray, scale: float) -> dict[str, float]:
    """The summary as made before: a scaled float64 copy, np.percentile."""
    a = np.array(values, dtype=np.float64)
    a *= scale
    p50, p90, p99 = np.percentile(a, [50, 90, 99], overwrite_input=True)
    return {"count": a.size, "mean": int(values.sum(dtype=np.int64)) / values.size * scale,
            "p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(a.max())}


def random_ints(rng: np.random.Generator, n: int) -> np.ndarray:
    dtype = np.dtype(rng.choice([np.int64, np.int32, np.uint32, np.int16]))
    hi = min(int(rng.choice([3, 1000, 10**6, 10**12])), int(np.iinfo(dtype).max))
    lo = -hi if dtype.kind == "i" and rng.random() < 0.2 else 0
    return rng.integers(lo, hi, n).astype(dtype)


def test_integer_summary_is_np_percentile_of_the_scaled_floats():
    rng = np.random.default_rng(7)
    for it in range(1500):
        n = int(rng.integers(1, 200)) if it % 8 else int(rng.integers(1, 20000))
        v = random_ints(rng, n)
        scale = float(rng.choice([1e-6, 1e-3, 1.0, 0.37, 3.3]))
        want = float_summary(v, scale)
        kept = v.copy()
        assert stats.summary(v, scale) == want
        assert np.array_equal(v, kept)  # not ``own``: untouched
        assert stats.summary(v, scale, own=True) == want


def test_integer_hist_is_the_ms_hist():
    rng = np.random.default_rng(11)
    edges = components.RESIDENCE_EDGES_NS
    near = np.concatenate((edges - 1, edges, edges + 1))
    for _ in range(300):
        n = int(rng.integers(0, 3000))
        v = np.concatenate((rng.integers(-10, 10**12, n), rng.choice(near, n // 4 + 1),
                            10 ** rng.uniform(0, 12, n).astype(np.int64)))
        assert components.residence_hist(v) == components.residence_hist_reference(v)
    f = rng.uniform(0, 1e9, 100)  # floats: the reference itself
    assert components.residence_hist(f) == components.residence_hist_reference(f)


def not_observed_per_row(requests, label):
    """observed.not_observed as it was: every name parsed in every row."""
    from omnitrace.analyze import observed as ob
    hops, missing = {}, {}
    for r in requests:
        for h in r["hops"]:
            p, c = (int(x) for x in h.split("#")[0].split("->"))
            hops[(p, c)] = hops.get((p, c), 0) + 1
        for m in r["missing_spans"]:
            g = ob._HOP.match(m)
            if g and g["span"] in ob._CATEGORIES:
                k = (g["span"], int(g["p"]), int(g["c"]))
                missing[k] = missing.get(k, 0) + 1
    out = []
    for (span, p, c), n in sorted(missing.items(), key=lambda x: (x[0][1], x[0][2], x[0][0])):
        if n < hops.get((p, c), 0):
            continue
        cats, producer = ob._CATEGORIES[span]
        stage = p if producer else c
        out += [{"stage": label(stage), "stage_id": stage, "category": cat, "span": span,
                 "hops": n, "pair": f"{p}->{c}"} for cat in cats]
    return out


def test_not_observed_counts_distinct_names_as_every_row():
    from omnitrace.analyze import observed
    spans = list(observed._CATEGORIES) + ["other.span"]
    rng = np.random.default_rng(3)
    for _ in range(200):
        rows = []
        for _ in range(int(rng.integers(0, 40))):
            hops = [(int(rng.integers(-1, 3)), int(rng.integers(0, 3)), int(rng.integers(0, 4)))
                    for _ in range(int(rng.integers(0, 4)))]
            missing = [f"{spans[int(rng.integers(len(spans)))]}[{p}->{c}#{k}]" for p, c, k in hops
                       if rng.random() < 0.7] + (["garbage"] if rng.random() < 0.1 else [])
            rows.append({"hops": [f"{p}->{c}#{k}" for p, c, k in hops], "missing_spans": missing})
        assert observed.not_observed(rows, str) == not_observed_per_row(rows, str)
