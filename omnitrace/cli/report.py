"""`omnitrace report RUN [RUN ...]`: per-stage TTFP attribution of run directories."""
from __future__ import annotations

import argparse
import sys

import orjson

from omnitrace.analyze.report import WATERFALLS, build_report
from omnitrace.analyze.rundir import RunDirError, load_run
from omnitrace.analyze.select import Selection, SelectionError, parse_window
from omnitrace import console


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
    sel = p.add_argument_group("request selection (a client other than `omnitrace bench`: no bench.json)")
    sel.add_argument("--requests", metavar="PREFIX", help="only requests whose id starts with PREFIX")
    sel.add_argument("--window", metavar="START:END",
                     help="only requests arriving START..END seconds after the first one (either may be empty)")
    sel.add_argument("--warmup", type=int, default=0, metavar="N",
                     help="exclude the first N selected requests (by arrival) as warm-up")
    p.add_argument("--request", action="append", default=[], metavar="ID",
                   help="also draw this request's waterfall in the HTML (repeatable)")
    p.add_argument("--waterfalls", type=int, default=WATERFALLS, metavar="N",
                   help=f"waterfalls of the N slowest requests in the HTML (default {WATERFALLS})")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.warmup < 0 or args.waterfalls < 0 or args.limit < 0:
        p.error("--warmup, --waterfalls and --limit must not be negative")
    try:
        sel = Selection(args.requests or None, parse_window(args.window) if args.window else None,
                        args.warmup)
    except SelectionError as e:
        p.error(str(e))
    try:
        # every row's critical path only for the JSON (an hour's run: ~1M segments); the
        # HTML draws the waterfall requests', which the report gives their rows anyway. The
        # run is held by nothing else: its tables (an hour's run: GBs) are freed as the
        # report is done with them, all before it is written
        later: list = []  # the request tables kept for sql, once the report's files are written
        rep = build_report(load_run(args.runs, later=later), per_request_segments=bool(args.json),
                           level=args.concurrency, select=sel, waterfalls=args.waterfalls,
                           waterfall_ids=args.request, consume=True)
    except RunDirError as e:
        console.say("report", f"{e}")
        return 2
    except OSError as e:
        console.say("report", f"cannot read run directory: {e}")
        return 2
    # files first, the console last: a reader that stops early (`| head`) loses no file
    if args.json and args.json != "-":
        try:
            with open(args.json, "wb") as f:
                f.write(orjson.dumps(rep, option=orjson.OPT_INDENT_2))
        except OSError as e:
            console.say("report", f"cannot write {args.json}: {e.strerror or e}")
            return 2
    if args.html:
        from omnitrace.profile import flamegraphs
        from omnitrace.render.html import write_html
        try:
            write_html(rep, args.html, flamegraphs.gather(rep))
        except OSError as e:
            console.say("report", f"cannot write {args.html}: {e}")
            return 2
    for keep in later:
        keep()
    if args.json == "-":
        sys.stdout.buffer.write(orjson.dumps(rep, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        from omnitrace.render.console import render
        print(render(rep, limit=args.limit))
        if args.json:
            print(f"\nJSON report: {args.json}")
        if args.html:
            print(f"HTML report: {args.html}")
    # Nothing measured to show: the report is printed but the exit code says so. A run
    # without API requests (component level) is fine when it has per-stage figures.
    component = not rep["window"]["api_requests"] and (rep["fifo"] or rep["snapshot"] or rep["transfer"])
    return 0 if rep["window"]["attributed"] or component else 3
