"""`omnitrace compare A B` or `omnitrace compare --a A1 A2 --b B1 B2`: per-category TTFP deltas
with bootstrap confidence intervals.

Each side may hold several runs (e.g. ABBA order, separate deployments). The bootstrap is
hierarchical: resample runs, then requests within each drawn run, so the interval includes
run-to-run variation and not only request-to-request noise.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
import orjson

from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import RunDirError, load_run
from omnitrace.render.console import table

TTFP = ("all", "ttfp")


def _side(paths: list[str]) -> list[dict[tuple[str, str], np.ndarray]]:
    """Per run: (stage, category) -> per-request ms (zeros where absent), plus TTFP."""
    out = []
    for p in paths:
        rep = build_report(load_run([p]), per_request_segments=False)
        reqs = rep["requests"]
        if not reqs:
            raise RunDirError(f"{p}: no measured request could be attributed")
        keys = {tuple(k.split("/", 1)) for r in reqs for k in r["categories_ms"]}
        run = {k: np.array([r["categories_ms"].get("/".join(k), 0.0) for r in reqs]) for k in keys}
        run[TTFP] = np.array([r["ttfp_ms"] for r in reqs])
        out.append(run)
    return out


def _boot(runs: list[dict], key: tuple[str, str], rng: np.random.Generator, n: int) -> np.ndarray:
    arrays = [r.get(key, np.zeros(len(r[TTFP]))) for r in runs]
    res = np.empty(n)
    for i in range(n):
        pick = rng.integers(0, len(arrays), len(arrays))
        res[i] = np.mean([arrays[j][rng.integers(0, len(arrays[j]), len(arrays[j]))].mean() for j in pick])
    return res


def compare(a: list[str], b: list[str], n_boot: int = 2000, seed: int = 0, conf: float = 0.95) -> dict[str, Any]:
    ra, rb = _side(a), _side(b)
    keys = sorted({k for r in ra + rb for k in r if k != TTFP})
    rng = np.random.default_rng(seed)
    lo_q, hi_q = (1 - conf) / 2 * 100, (1 + conf) / 2 * 100
    rows = []
    for k in [TTFP] + keys:
        ma = float(np.mean([r.get(k, np.zeros(1)).mean() for r in ra]))
        mb = float(np.mean([r.get(k, np.zeros(1)).mean() for r in rb]))
        d = _boot(rb, k, rng, n_boot) - _boot(ra, k, rng, n_boot)
        lo, hi = np.percentile(d, [lo_q, hi_q])
        rows.append({"stage": k[0], "category": k[1], "a_ms": ma, "b_ms": mb, "delta_ms": mb - ma,
                     "ci_low_ms": float(lo), "ci_high_ms": float(hi),
                     "significant": bool(lo > 0 or hi < 0)})
    return {"a": a, "b": b, "confidence": conf, "bootstrap": n_boot, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="omnitrace compare", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="*", metavar="RUN", help="exactly two runs: A B")
    p.add_argument("--a", nargs="+", default=[], metavar="RUN", help="runs of side A")
    p.add_argument("--b", nargs="+", default=[], metavar="RUN", help="runs of side B")
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    a, b = list(args.a), list(args.b)
    if args.runs:
        if len(args.runs) != 2 or a or b:
            p.error("give two runs A B, or --a RUN... --b RUN...")
        a, b = [args.runs[0]], [args.runs[1]]
    if not a or not b:
        p.error("give two runs A B, or --a RUN... --b RUN...")
    try:
        res = compare(a, b, args.bootstrap, args.seed)
    except (RunDirError, OSError) as e:
        print(f"omnitrace compare: {e}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(res, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    print(f"A: {' '.join(a)}\nB: {' '.join(b)}\n{int(res['confidence'] * 100)}% bootstrap CI "
          f"(runs, then requests, resampled {res['bootstrap']}x); * = CI excludes 0")
    print(table(["stage", "category", "A ms", "B ms", "B-A ms", "CI low", "CI high", ""],
                [[r["stage"], r["category"], r["a_ms"], r["b_ms"], r["delta_ms"], r["ci_low_ms"],
                  r["ci_high_ms"], "*" if r["significant"] else ""] for r in res["rows"]]))
    return 0
