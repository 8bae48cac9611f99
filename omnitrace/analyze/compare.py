"""The comparison behind `omnitrace compare` and `omnitrace loadtest --ab`: per-category
TTFP deltas and component figures of two sides of runs, with hierarchical bootstrap
confidence intervals (runs resampled, then requests or chunks within each drawn run, so
the interval includes run-to-run variation and not only request-to-request noise). Sides
whose bench settings differ are compared with a warning."""
from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from omnitrace.analyze import components, quality
from omnitrace.analyze.report import build_report, measured_ids
from omnitrace.analyze.rundir import RunDirError, distinct_runs, load_run, run_identity

TTFP = ("all", "ttfp")
BOOT_SAMPLES = 4000  # per run and component: a seeded subsample keeps the bootstrap fast


class Side:
    def __init__(self) -> None:
        self.ttfp: list[dict[tuple[str, str], np.ndarray]] = []  # per run with API requests
        self.comp: list[dict[tuple[str, str], np.ndarray]] = []  # per run
        self.bench: list[dict[str, Any] | None] = []
        self.no_api: list[str] = []
        self.issues: dict[str, list[str]] = {}  # run -> why it is not fit to compare (quality)
        self.repeats: list[str] = []  # runs given twice on this side, read once
        self.paths: list[str] = []  # each run once


def _side(paths: list[str]) -> Side:
    """Per run: (stage, category) -> per-request ms (zeros where absent), plus TTFP; and
    (group, metric) -> per-chunk component values."""
    side = Side()
    side.paths, side.repeats = distinct_runs(paths)
    for p in side.paths:
        run = load_run([p])
        rep = build_report(run, per_request_segments=False, waterfalls=0)
        side.issues[p] = quality.issues(rep)
        comp = components.samples(components.Rows(run.figures, run.chunk_requests, measured_ids(run)))
        reqs = rep["requests"]
        if not reqs and not comp:
            raise RunDirError(f"{p}: no measured request could be attributed and no per-stage figures")
        side.comp.append(comp)
        side.bench.append(rep["bench"])
        if not reqs:  # a component-level run, or one whose every request failed (issues)
            if not rep["window"]["api_requests"]:
                side.no_api.append(p)
            continue
        keys = {tuple(k.split("/", 1)) for r in reqs for k in r["categories_ms"]}
        cats = {k: np.array([r["categories_ms"].get("/".join(k), 0.0) for r in reqs]) for k in keys}
        cats[TTFP] = np.array([r["ttfp_ms"] for r in reqs])
        side.ttfp.append(cats)
    return side


def _settings_warnings(a: Side, b: Side) -> list[str]:
    """Bench settings that differ between (or within) the two sides."""
    keys = sorted({k for s in a.bench + b.bench if s for k in s})
    out = []
    for k in keys:
        va = [json_value(s.get(k)) if s else "-" for s in a.bench]
        vb = [json_value(s.get(k)) if s else "-" for s in b.bench]
        if len(set(va + vb)) > 1:
            out.append(f"bench setting {k!r} differs: A {', '.join(va)} vs B {', '.join(vb)}")
    return out


def json_value(v: Any) -> str:
    return orjson.dumps(v).decode()


def _boot(runs: list[dict], key: tuple[str, str], rng: np.random.Generator, n: int) -> np.ndarray:
    arrays = [r.get(key, np.zeros(len(r[TTFP]))) if TTFP in r else r.get(key, np.zeros(1)) for r in runs]
    arrays = [x if len(x) else np.zeros(1) for x in arrays]
    arrays = [rng.choice(x, BOOT_SAMPLES, replace=False) if len(x) > BOOT_SAMPLES else x for x in arrays]
    res = np.empty(n)
    for i in range(n):
        pick = rng.integers(0, len(arrays), len(arrays))
        res[i] = np.mean([arrays[j][rng.integers(0, len(arrays[j]), len(arrays[j]))].mean() for j in pick])
    return res


def _rows(ra: list[dict], rb: list[dict], keys: list, rng: np.random.Generator, n_boot: int,
          conf: float, names: tuple[str, str, str, str]) -> list[dict[str, Any]]:
    lo_q, hi_q = (1 - conf) / 2 * 100, (1 + conf) / 2 * 100
    g, m, va, vb = names
    rows = []
    for k in keys:
        ma = float(np.mean([r[k].mean() if len(r.get(k, ())) else 0.0 for r in ra]))
        mb = float(np.mean([r[k].mean() if len(r.get(k, ())) else 0.0 for r in rb]))
        boot_b = _boot(rb, k, rng, n_boot)
        boot_a = _boot(ra, k, rng, n_boot)
        lo, hi = np.percentile(boot_b - boot_a, [lo_q, hi_q])
        # the relative change's interval from the ratio of the same draws: never below -100%
        rel = np.percentile(boot_b / boot_a - 1, [lo_q, hi_q]) if boot_a.min() > 0 else (None, None)
        rows.append({g: k[0], m: k[1], va: ma, vb: mb, "delta": mb - ma,
                     "ci_low": float(lo), "ci_high": float(hi), "significant": bool(lo > 0 or hi < 0),
                     "rel_ci_low": _opt(rel[0]), "rel_ci_high": _opt(rel[1])})
    return rows


def ttfp_rows(ra: list[dict], rb: list[dict], rng: np.random.Generator, n_boot: int,
              conf: float) -> list[dict[str, Any]]:
    """TTFP and each (stage, category): A and B means per request, B - A with its CI."""
    keys = sorted({k for r in ra + rb for k in r if k != TTFP})
    rows = _rows(ra, rb, [TTFP] + keys, rng, n_boot, conf, ("stage", "category", "a_ms", "b_ms"))
    for r in rows:  # the TTFP table's historical key names
        r["delta_ms"], r["ci_low_ms"], r["ci_high_ms"] = r.pop("delta"), r.pop("ci_low"), r.pop("ci_high")
    return rows


def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


def _unfit(sa: Side, sb: Side) -> list[str]:
    """What makes every delta doubtful: the same run on both sides, a run not fit to compare."""
    in_a = {run_identity(p): p for p in sa.paths}
    out = [f"A {in_a[k]} and B {p} are the same run: a run against itself differs by 0 by "
            "construction (deltas marked !)" for p in sb.paths if (k := run_identity(p)) in in_a]
    out += [f"{label} run {p} is not a clean run ({'; '.join(why)}): deltas against it (marked !) "
            "measure that as much as the deployments"
            for label, s in (("A", sa), ("B", sb)) for p, why in s.issues.items() if why]
    return out


def compare(a: list[str], b: list[str], n_boot: int = 2000, seed: int = 0, conf: float = 0.95) -> dict[str, Any]:
    sa, sb = _side(a), _side(b)
    rng = np.random.default_rng(seed)
    unfit = _unfit(sa, sb)
    warnings = ([f"side {label}: {line}" for label, s in (("A", sa), ("B", sb)) for line in s.repeats]
                + unfit + _settings_warnings(sa, sb))
    rows = ttfp_rows(sa.ttfp, sb.ttfp, rng, n_boot, conf) if sa.ttfp and sb.ttfp else []
    if sa.no_api or sb.no_api:
        warnings.append("runs without API requests (component level: no TTFP attribution): "
                        + " ".join(sa.no_api + sb.no_api))
    ckeys = sorted({k for r in sa.comp + sb.comp for k in r})
    comp = _rows(sa.comp, sb.comp, ckeys, rng, n_boot, conf, ("group", "metric", "a", "b"))
    for r in rows + comp:
        r["doubtful"] = bool(unfit)
    return {"a": a, "b": b, "confidence": conf, "bootstrap": n_boot, "warnings": warnings,
            "unfit": unfit, "rows": rows, "components": comp}
