"""`omnitrace compare A B` or `omnitrace compare --a A1 A2 --b B1 B2`: per-category TTFP deltas
with bootstrap confidence intervals.

Each side may hold several runs (e.g. ABBA order, separate deployments). The bootstrap is
hierarchical: resample runs, then requests within each drawn run, so the interval includes
run-to-run variation and not only request-to-request noise.

Component figures (per stage: FIFO residence and blocked time, snapshot cost; per stage
pair: put and get) are compared the same way, chunks in place of requests, so runs without
API requests (the real vLLM-Omni classes under a harness) compare too. Sides whose bench
settings differ (concurrency, lengths, prompts, ...) are compared with a warning.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from omnitrace.analyze.compare import compare
from omnitrace.analyze.rundir import RunDirError
from omnitrace.render.console import table
from omnitrace import console


def mark(row: dict[str, Any]) -> str:
    """A delta's mark: * its CI excludes 0, ! a side is not fit to compare (``unfit``)."""
    return ("*" if row["significant"] else "") + ("!" if row.get("doubtful") else "")


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
        console.say("compare", f"{e}")
        return 2
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(res, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    print(f"A: {' '.join(a)}\nB: {' '.join(b)}")
    for w in res["warnings"]:
        print(f"warning: {w}")
    print(f"{int(res['confidence'] * 100)}% bootstrap CI (runs, then requests or chunks, resampled "
          f"{res['bootstrap']}x); * = CI excludes 0"
          + ("; ! = a side is not fit to compare (warnings above)" if res["unfit"] else ""))
    if res["rows"]:
        print("\nTTFP attribution")
        print(table(["stage", "category", "A ms", "B ms", "B-A ms", "CI low", "CI high", ""],
                    [[r["stage"], r["category"], r["a_ms"], r["b_ms"], r["delta_ms"], r["ci_low_ms"],
                      r["ci_high_ms"], mark(r)] for r in res["rows"]], left=(1,)))
    if res["components"]:
        print("\nComponents (mean per chunk)")
        print(table(["stage / pair", "metric", "A", "B", "B-A", "CI low", "CI high", ""],
                    [[r["group"], r["metric"], r["a"], r["b"], r["delta"], r["ci_low"], r["ci_high"],
                      mark(r)] for r in res["components"]], left=(1,)))
    return 0
