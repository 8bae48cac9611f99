"""`omnitrace bench`: load-test an omni server's streaming route, sweep concurrency.

``--backend openai-chat-omni`` (the default; ``/v1/chat/completions``) or
``openai-audio-speech`` (``/v1/audio/speech``), named and sent as ``vllm bench serve
--omni --backend`` sends them (``omnitrace/bench/client.py``); ``--endpoint`` alone picks
the backend whose path it ends in. An unknown one is one line, exit 2, nothing sent.

Writes ``bench.json`` into ``$OMNITRACE_RUN_DIR`` (set by ``omnitrace run``) or ``--out``:
per-request rows (id = the x-request-id sent, so rows join to traces) and, per concurrency
level, ``measured_window`` {start_unix_ns, end_unix_ns} and the warm-up ids that analysis
excludes. The file is rewritten after every level, so an interrupted sweep keeps what it
measured, labelled by how it stopped, ``status: "interrupted"`` (Ctrl-C), ``"terminated"``
(SIGTERM) or ``"hangup"`` (SIGHUP: its terminal, or the loadtest that started it, went
away), the level cut short included, marked ``interrupted``. ``status: "complete"`` only when every request of every level succeeded;
``complete-with-errors`` when every level ran but some requests failed. Results already at
the destination are never replaced without ``--overwrite``, and results that cannot be
written there are never lost (``omnitrace/bench/output.py``).
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import sys
import textwrap
import time
from typing import Any

import orjson
from tqdm import tqdm

from omnitrace import __version__, childproc
from omnitrace import conventions as cv
from omnitrace.analyze.stats import summary
from omnitrace.bench.client import BACKEND_HELP, ENDPOINT_HELP, RequestResult, resolve_backend
from omnitrace.bench.load import (BENCH_DEFAULTS, BURSTINESS_HELP, RATE_HELP, REQUEST_TIMEOUT_S,
                                  LevelResult, LoadSpec, check_arrivals, concurrency_levels,
                                  loadtest_differences, run_level)
from omnitrace.bench.stall import DEFAULT_AFTER_S, StallWatch
from omnitrace.bench.output import BenchOutput, OutputError
from omnitrace.cli.helpformat import DefaultsFormatter
from omnitrace.render.console import table
from omnitrace import console
from omnitrace.runfiles import names


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnitrace bench", description=__doc__.split("\n")[0],
                                formatter_class=DefaultsFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--backend", default=None, help=BACKEND_HELP)
    p.add_argument("--endpoint", default=None, help=ENDPOINT_HELP)
    p.add_argument("--model", default="reference")
    p.add_argument("--concurrency", nargs="+", default=BENCH_DEFAULTS["concurrency"],
                   help="one level or a list to sweep (8 16 32 or 8,16)")
    p.add_argument("--num-prompts", type=int, default=BENCH_DEFAULTS["num_prompts"],
                   help="measured requests per level")
    p.add_argument("--warmup", type=int, default=None, help="warm-up requests per level (default: = concurrency)")
    p.add_argument("--input-len", type=int, default=BENCH_DEFAULTS["input_len"], help="prompt tokens")
    p.add_argument("--output-len", type=int, default=BENCH_DEFAULTS["output_len"], help="max_tokens (ignore_eos)")
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in len*(1 +- ratio)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S,
                   help="seconds per request (> 0)")
    p.add_argument("--request-rate", type=float, default=None, metavar="R", help=RATE_HELP)
    p.add_argument("--burstiness", type=float, default=1.0, help=BURSTINESS_HELP)
    p.add_argument("--stall-after", type=float, default=DEFAULT_AFTER_S, metavar="S",
                   help="say so when no request has progressed for S seconds, and which stage "
                        "stopped stepping where the run directory is known (0: never)")
    p.add_argument("--extra-body", default=None, help="JSON merged into every request body")
    p.add_argument("--out", default=None, help="bench.json path (default: $OMNITRACE_RUN_DIR/bench.json)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results already at --out (otherwise refused)")
    p.add_argument("--no-progress", action="store_true")
    p.epilog = textwrap.fill("`omnitrace loadtest` runs this load with other defaults: "
                             + ", ".join(loadtest_differences()) + " (and serves, stops and reports).", 80)
    return p


def _level_summary(lv: LevelResult) -> dict[str, Any]:
    m = [r for r in lv.results if not r.warmup]
    ok = [r for r in m if r.error is None]
    span_s = ((lv.measured_window["end_unix_ns"] - lv.measured_window["start_unix_ns"]) / 1e9
              if lv.measured_window else 0.0)
    return {
        "requests": len(m), "ok": len(ok), "failed": len(m) - len(ok),
        "duration_s": span_s, "request_rate": len(ok) / span_s if span_s > 0 else 0.0,
        "ttft_ms": summary([r.ttft_s for r in ok if r.ttft_s is not None], 1e3),
        "ttfp_ms": summary([r.ttfp_s for r in ok if r.ttfp_s is not None], 1e3),
        "e2e_ms": summary([r.latency_s for r in ok if r.latency_s is not None], 1e3),
        "errors": sorted({r.error for r in m if r.error})[:5],
    }


def _doc(args: argparse.Namespace, levels: list[LevelResult], partial: list[RequestResult],
         status: str) -> dict[str, Any]:
    rows = [r.row() for lv in levels for r in lv.results] + [r.row() for r in partial]
    return {
        "omnitrace_version": __version__, "status": status, "base_url": args.base_url,
        "args": {k: v for k, v in vars(args).items() if k not in ("no_progress",)},
        "levels": [{"concurrency": lv.concurrency, "measured_window": lv.measured_window,
                    "warmup_ids": lv.warmup_ids, "aborted": lv.aborted,
                    "interrupted": lv.interrupted, "summary": _level_summary(lv)}
                   for lv in levels],
        "requests": rows,
    }


def _cut_level(c: int, done: list[RequestResult]) -> LevelResult:
    """The level Ctrl-C cut short, from the requests that finished (or were cancelled):
    its measured window runs from the first measured request to the interruption."""
    starts = [r.start_unix_ns for r in done if not r.warmup and r.start_unix_ns]
    window = {"start_unix_ns": min(starts), "end_unix_ns": time.time_ns()} if starts else None
    return LevelResult(c, [r.id for r in done if r.warmup], list(done), window, interrupted=True)


def _print_summary(levels: list[LevelResult], offered: float | None) -> None:
    rows = []
    for lv in levels:
        if lv.measured_window is None:
            continue
        s = _level_summary(lv)
        for metric in ("ttft_ms", "ttfp_ms", "e2e_ms"):
            x = s[metric]
            if not x["count"] and metric == "ttft_ms":  # speech: no text
                continue
            rows.append([lv.concurrency, metric[:-3].upper(), x["count"], x["mean"], x["p50"], x["p90"], x["p99"]])
    if rows:
        print(table(["concurrency", "metric (ms)", "n", "mean", "median", "p90", "p99"], rows))
    for lv in levels:
        s = _level_summary(lv)
        print(f"c={lv.concurrency}: {s['ok']}/{s['requests']} ok, {s['request_rate']:.2f} req/s"
              + (f" (offered {offered:g})" if offered is not None and math.isfinite(offered) else "")
              + (f", {s['failed']} failed: {'; '.join(s['errors'])}" if s["failed"] else "")
              + (f" [ABORTED: {lv.aborted}]" if lv.aborted else "")
              + (" [INTERRUPTED: partial level]" if lv.interrupted else ""))


def _run_interruptible(coro, grace_s: float = 2.0):
    """asyncio.run, except that Ctrl-C cancels the run and gives the cancelled requests
    ``grace_s`` to wind down, then raises KeyboardInterrupt: asyncio.run waits for every
    task, and with thousands of requests queued and the server gone it could wait for
    minutes. SIGINT cancels the main task from a loop signal handler rather than raising
    KeyboardInterrupt inside whichever request task runs (that task would die with it and
    asyncio would print its traceback)."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    got: list[int] = []  # the signal that stopped the load (SIGTERM/SIGHUP: as a Ctrl-C)
    stops = (signal.SIGINT, *childproc.STOP_SIGNALS)

    def on_signal(signum: int) -> None:
        got.append(signum)
        task.cancel()

    def stopped() -> KeyboardInterrupt:
        return KeyboardInterrupt() if got[0] == signal.SIGINT else childproc.Stopped(got[0])

    for s in stops:
        try:
            loop.add_signal_handler(s, on_signal, s)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    try:
        try:
            result = loop.run_until_complete(task)
        except asyncio.CancelledError:
            if not got:
                raise
            raise stopped() from None
        if got:  # the coroutine absorbed the cancellation
            raise stopped()
        return result
    except KeyboardInterrupt:
        pending = asyncio.all_tasks(loop)
        for t in pending:
            t.cancel()
        if pending:
            try:
                loop.run_until_complete(asyncio.wait(pending, timeout=grace_s))
            except BaseException:
                pass
        for t in pending:  # retrieved: asyncio would log each as never retrieved
            if t.done() and not t.cancelled():
                t.exception()
        raise
    finally:
        for s in stops:
            try:
                loop.remove_signal_handler(s)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        except BaseException:
            pass
        loop.close()


def _args(argv: list[str] | None) -> tuple[argparse.Namespace, list[int], dict[str, Any]]:
    """The arguments, the concurrency levels and the extra body; a usage error otherwise."""
    p = _parser()
    args = p.parse_args(argv)
    try:
        conc = concurrency_levels(args.concurrency)
    except ValueError:
        p.error(f"--concurrency: positive integers expected, got {' '.join(args.concurrency)}")
    if args.num_prompts <= 0 or args.input_len <= 0 or args.output_len <= 0 or not 0 <= args.range_ratio < 1:
        p.error("--num-prompts, --input-len, --output-len must be positive and 0 <= --range-ratio < 1")
    if args.request_timeout <= 0 or args.stall_after < 0 or (args.warmup or 0) < 0:
        p.error("--request-timeout must be positive; --stall-after and --warmup not negative")
    try:
        check_arrivals(args.request_rate, args.burstiness)
    except ValueError as exc:
        p.error(str(exc))
    try:
        backend, args.endpoint = resolve_backend(args.backend, args.endpoint)
    except ValueError as exc:  # one line, nothing sent
        p.exit(2, f"omnitrace bench: {exc}\n")
    args.backend = backend.name
    extra: dict[str, Any] = {}
    if args.extra_body:
        try:
            extra = orjson.loads(args.extra_body)
            assert isinstance(extra, dict)
        except (orjson.JSONDecodeError, AssertionError):
            p.error("--extra-body: a JSON object expected")
    return args, conc, extra


def _live_run_dir(out: str | None) -> str | None:
    """The run directory whose live record names a stalled stage: ``omnitrace run``'s, or
    the one --out writes into."""
    for d in (os.environ.get(cv.ENV_RUN_DIR), os.path.dirname(os.path.abspath(out)) if out else None):
        if d and os.path.isfile(names.path(d, names.RUN)):
            return d
    return None


def main(argv: list[str] | None = None) -> int:
    args, conc, extra = _args(argv)
    run_dir = os.environ.get(cv.ENV_RUN_DIR)
    output = BenchOutput(args.out or (names.path(run_dir, names.BENCH) if run_dir else None),
                         args.overwrite)
    try:
        output.check()
    except OutputError as exc:
        console.say("bench", f"{exc}")
        return 2
    spec = LoadSpec(base_url=args.base_url, model=args.model, backend=args.backend, endpoint=args.endpoint,
                    num_prompts=args.num_prompts, warmup=args.warmup, input_len=args.input_len,
                    output_len=args.output_len, range_ratio=args.range_ratio, seed=args.seed,
                    request_timeout_s=args.request_timeout, request_rate=args.request_rate,
                    burstiness=args.burstiness, extra_body=extra,
                    tag=f"b{os.getpid():x}{time.time_ns() & 0xffff:04x}-")
    rng = random.Random(args.seed)
    watch = StallWatch(args.stall_after, lambda line: tqdm.write(f"omnitrace bench: {line}", file=sys.stderr),
                       _live_run_dir(output.path))
    levels: list[LevelResult] = []
    partial: list[RequestResult] = []
    status = "complete"
    c = conc[0]
    try:
        for c in conc:
            progress = _Progress(c, c if args.warmup is None else args.warmup, args.num_prompts,
                                 args.no_progress)
            partial = progress.done
            lv = _run_interruptible(run_level(spec, c, rng, progress, watch))
            progress.bar.close()
            partial = []
            levels.append(lv)
            output.write(_doc(args, levels, [], "running"))
            if lv.aborted:
                status = "failed"
                break
    except KeyboardInterrupt as exc:
        status = childproc.stop_status(childproc.signal_of(exc))
        console.say("bench", f"{status}; partial results kept", gap=True)
        if partial:
            levels.append(_cut_level(c, partial))
            partial = []
    return _finish(args, output, levels, partial, status)


class _Progress:
    """One level's progress bar: it counts the measured requests; the warm-up is counted
    in its label until it is over."""

    def __init__(self, concurrency: int, warmup: int, measured: int, disable: bool) -> None:
        self.concurrency, self.warmup, self.warm = concurrency, warmup, 0
        self.done: list[RequestResult] = []
        self.errors = 0
        self.bar = tqdm(total=measured, desc=self._label(), file=sys.stderr, disable=disable, unit="req")

    def _label(self) -> str:
        return f"c={self.concurrency}" + (f" warm-up {self.warm}/{self.warmup}" if self.warm < self.warmup else "")

    def __call__(self, r: RequestResult) -> None:
        self.done.append(r)
        if r.warmup:
            self.warm += 1
            self.bar.set_description_str(self._label())
        else:
            self.bar.update(1)
        if r.error:
            self.errors += 1
            self.bar.set_postfix_str(f"errors={self.errors}")


def _finish(args: argparse.Namespace, output: BenchOutput, levels: list[LevelResult],
            partial: list[RequestResult], status: str) -> int:
    """bench.json's last write, the summary, and the exit status."""
    every = [r for lv in levels for r in lv.results]
    errors = [r for r in every if r.error]
    if status == "complete" and errors:
        status = "complete-with-errors"
    out = output.finish(_doc(args, levels, partial, status))
    if levels:
        _print_summary(levels, args.request_rate)
    if out:
        print(f"bench results: {out} ({status}"
              + (f": {len(errors)}/{len(every)} requests failed" if errors else "") + ")")
    elif not output.path:  # nothing to join the traces with later: say so rather than drop it silently
        console.say("bench", f"results not written ({status}; not under `omnitrace run` and no --out: "
                    "pass --out FILE, e.g. RUN_DIR/bench.json, so `omnitrace report` can tell "
                    "warm-up from measured requests)")
    measured = [r for lv in levels for r in lv.results if not r.warmup]
    failed = [r for r in measured if r.error]
    if status not in ("complete", "complete-with-errors") or not measured:
        if levels and levels[-1].aborted:
            console.say("bench", f"{args.base_url}: {levels[-1].aborted}")
        return 1
    if failed:
        console.say("bench", f"{len(failed)}/{len(measured)} measured requests failed "
                    f"(first: {failed[0].error})")
        return 1
    return 0 if out == output.path else 1  # results elsewhere than asked: a script must notice
