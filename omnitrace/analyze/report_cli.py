"""`omnitrace report RUN [RUN ...]`: per-stage TTFP attribution of run directories."""
from __future__ import annotations

import argparse
import sys

import orjson

from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import RunDirError, load_run


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnitrace report",
                                description="Where did each request's time to first audio packet go: "
                                            "critical-path attribution per stage and category.")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run directory; several = one deployment (e.g. one per host), merged")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write the report as JSON to FILE (or stdout when no FILE)")
    p.add_argument("--html", metavar="FILE", help="write a self-contained interactive HTML report")
    p.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="only the bench level at concurrency C (a sweep is otherwise aggregated)")
    p.add_argument("--limit", type=int, default=20, help="rows of per-request and head-of-line tables")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        run = load_run(args.runs)
        rep = build_report(run, level=args.concurrency)
    except RunDirError as e:
        print(f"omnitrace report: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"omnitrace report: cannot read run directory: {e}", file=sys.stderr)
        return 2
    # files first, the console last: a reader that stops early (`| head`) loses no file
    if args.json and args.json != "-":
        with open(args.json, "wb") as f:
            f.write(orjson.dumps(rep, option=orjson.OPT_INDENT_2))
    if args.html:
        from omnitrace.render.html import write_html
        try:
            write_html(rep, args.html)
        except OSError as e:
            print(f"omnitrace report: cannot write {args.html}: {e}", file=sys.stderr)
            return 2
    if args.json == "-":
        sys.stdout.buffer.write(orjson.dumps(rep, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        from omnitrace.render.console import render
        print(render(rep, limit=args.limit))
        if args.json:
            print(f"\nJSON report: {args.json}")
        if args.html:
            print(f"HTML report: {args.html}")
    # No measured request attributed: the report is printed but the exit code says so.
    return 0 if rep["window"]["attributed"] else 3
