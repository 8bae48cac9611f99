"""`omnitrace loadtest`: from nothing to the answer in one command.

One deployment: start the instrumented server (``omnitrace run ... serve``: the reference
pipeline, or vLLM-Omni with ``--model``), wait until it answers, run ``omnitrace bench``
(warm-up excluded, measured window marked), stop the server (the agent's final drain),
print the attribution report and write ``report.html`` and ``bench.json`` into the run
directory, whose path is the last line printed. ``--base-url`` loads a server that already
runs under ``omnitrace run --run-dir R`` instead (give that ``--run-dir R``).

A/B: ``--ab "SERVE ARGS A" "SERVE ARGS B"`` runs the two deployments alternately in the
order ``--pattern`` (default ABBA) repeated ``--repeats`` times, each in its own run
directory under one parent, then compares all A runs with all B runs (``omnitrace
compare``'s hierarchical bootstrap: runs, then requests) and prints one verdict line per
category that moved, with ``compare.json`` and ``compare.html`` in the parent. Alternating
is what separates a real difference from drift over time (a warming machine, another
job): drift hits A and B alike in ABBA order.

Ctrl-C at any point stops the load and the server cleanly; what was recorded stays a
loadable run directory, and the message says which.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from omnitrace import conventions as cv
from omnitrace import childproc
from omnitrace.childproc import python_module
from omnitrace.cli.helpformat import DefaultsFormatter, OneLineParser
from omnitrace.bench.load import (BURSTINESS_HELP, LOADTEST_DEFAULTS, RATE_HELP, REQUEST_TIMEOUT_S,
                                  check_arrivals, concurrency_levels)
from omnitrace.bench.client import BACKEND_HELP, ENDPOINT_HELP, resolve_backend
from omnitrace.bench.serve_and_bench import free_port, wait_healthy
from omnitrace.bench.stall import DEFAULT_AFTER_S
from omnitrace import console
from omnitrace.runfiles import names


class LoadtestError(Exception):
    """One line for the user."""


@dataclass(frozen=True)
class Deployment:
    """One server configuration, as ``omnitrace run`` and ``serve`` take it."""

    label: str
    serve_args: tuple[str, ...] = ()
    model: str | None = None
    port: int | None = None  # given among serve_args (--port P): used instead of a free one


@dataclass(frozen=True)
class LoadtestConfig:
    run_dir: str
    bench_args: tuple[str, ...]
    run_args: tuple[str, ...] = ()  # options for `omnitrace run` (exporters, --flame ...)
    startup_timeout_s: float = 180.0
    html: bool = True
    base_url: str | None = None
    deployments: tuple[Deployment, ...] = field(default_factory=tuple)


def _py() -> list[str]:
    return python_module("omnitrace")


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="omnitrace loadtest",
        description="Serve (instrumented), warm up, load, stop, report: the attribution report\n"
                    "on the console, report.html and bench.json in one run directory (its path is\n"
                    "printed last). --ab runs two deployments alternately and compares them.",
        formatter_class=DefaultsFormatter,
        epilog="examples:\n  omnitrace loadtest\n"
               "  omnitrace loadtest --serve '--snapshot recursive' --concurrency 32 --input-len 2500\n"
               "  omnitrace loadtest --ab '--snapshot recursive' '--snapshot copy' --repeats 2\n"
               "  omnitrace loadtest --backend openai-audio-speech --concurrency 4 --num-prompts 16\n"
               "  omnitrace loadtest --model Qwen/Qwen3-Omni-30B-A3B-Instruct --serve '--omni'")
    p.add_argument("--run-dir", default=None,
                   help="the run directory (with --ab: the parent of one directory per run); "
                        "default: $OMNITRACE_RUNS_DIR or ./omnitrace-runs, then loadtest-<time>")
    p.add_argument("--serve", default="", metavar="ARGS",
                   help="server arguments as one string (reference pipeline: --snapshot, "
                        "--pipeline, --shm; with --model: vLLM-Omni's)")
    p.add_argument("--model", default=None, help="serve this model with vLLM-Omni instead of the "
                                                 "reference pipeline")
    p.add_argument("--base-url", default=None,
                   help="load a server already running under `omnitrace run --run-dir R` (give --run-dir R)")
    g = p.add_argument_group("load (passed to omnitrace bench)")
    g.add_argument("--backend", default=None, help=BACKEND_HELP)
    g.add_argument("--endpoint", default=None, help=ENDPOINT_HELP)
    g.add_argument("--concurrency", nargs="+", default=LOADTEST_DEFAULTS["concurrency"], help="levels to sweep")
    g.add_argument("--num-prompts", type=int, default=LOADTEST_DEFAULTS["num_prompts"],
                   help="measured requests per level")
    g.add_argument("--warmup", type=int, default=None, help="warm-up requests per level (default: = concurrency)")
    g.add_argument("--input-len", type=int, default=LOADTEST_DEFAULTS["input_len"], help="prompt tokens")
    g.add_argument("--output-len", type=int, default=LOADTEST_DEFAULTS["output_len"], help="output tokens")
    g.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in len*(1 +- ratio)")
    g.add_argument("--seed", type=int, default=0, help="prompt and length seed")
    g.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S,
                   help="seconds per request (> 0)")
    g.add_argument("--request-rate", type=float, default=None, metavar="R", help=RATE_HELP)
    g.add_argument("--burstiness", type=float, default=1.0, help=BURSTINESS_HELP)
    g.add_argument("--stall-after", type=float, default=DEFAULT_AFTER_S, metavar="S",
                   help="say so when no request has progressed for S seconds, and which stage "
                        "stopped stepping (0: never)")
    r = p.add_argument_group("recording (passed to omnitrace run)")
    r.add_argument("--exporter", default=None, help="live views besides the record, e.g. otlp-grpc,prometheus")
    r.add_argument("--prometheus-port", default=None, help="with --exporter prometheus (0 = any free port)")
    r.add_argument("--flame", action="store_true", help="sample every stage with py-spy (see `omnitrace flame`)")
    r.add_argument("--run-option", action="append", default=[], metavar="OPT",
                   help="any other `omnitrace run` option, e.g. --run-option=--flame-rate=50 (repeatable)")
    r.add_argument("--overwrite", action="store_true", help="reuse a --run-dir that holds a run")
    a = p.add_argument_group("A/B")
    a.add_argument("--ab", nargs=2, metavar=("A", "B"), default=None,
                   help="two server argument strings to compare")
    a.add_argument("--pattern", default="ABBA", help="run order of one repeat")
    a.add_argument("--repeats", type=int, default=1, help="times the pattern is run")
    p.add_argument("--startup-timeout", type=float, default=None,
                   help="seconds for the server to answer (default: 180; with --model 1200, "
                        "vLLM-Omni starts its stages one after another)")
    p.add_argument("--no-html", action="store_true", help="skip report.html / compare.html")
    return p


def _new_run_dir() -> str:
    """A new directory under $OMNITRACE_RUNS_DIR (or ./omnitrace-runs) named by the time,
    made here: two loadtests started in the same second get two (``-2``, ``-3``, ...)."""
    parent = os.environ.get(cv.ENV_RUNS_DIR) or "omnitrace-runs"
    base = os.path.join(parent, "loadtest-" + time.strftime("%Y%m%d-%H%M%S"))
    try:
        os.makedirs(parent, exist_ok=True)
        n = 1
        while True:
            d = base if n == 1 else f"{base}-{n}"
            try:
                os.mkdir(d)  # atomic: the one that makes it has it
                return d
            except FileExistsError:
                n += 1
    except OSError as exc:
        raise LoadtestError(f"cannot make a run directory in {parent}: {exc.strerror or exc}") from None


def _check_numbers(args: argparse.Namespace) -> None:
    """Bad numbers are a usage error before anything starts."""
    if args.num_prompts <= 0 or args.input_len <= 0 or args.output_len <= 0:
        raise LoadtestError("--num-prompts, --input-len and --output-len must be positive")
    try:
        concurrency_levels(args.concurrency)
    except ValueError:
        raise LoadtestError("--concurrency: positive integers expected, got "
                            + " ".join(args.concurrency)) from None
    if args.request_timeout <= 0 or args.stall_after < 0 or (args.warmup or 0) < 0:
        raise LoadtestError("--request-timeout must be positive; --stall-after and --warmup not negative")
    try:
        check_arrivals(args.request_rate, args.burstiness)
    except ValueError as exc:
        raise LoadtestError(str(exc)) from None
    if not 0 <= args.range_ratio < 1 or (args.startup_timeout is not None and args.startup_timeout <= 0):
        raise LoadtestError("--range-ratio must be in [0, 1) and --startup-timeout positive")
    if args.repeats < 1 or not args.pattern or set(args.pattern.upper()) - {"A", "B"}:
        raise LoadtestError("--pattern is a string of A and B (e.g. ABBA), --repeats >= 1")


def _bench_args(args: argparse.Namespace) -> list[str]:
    try:
        backend, endpoint = resolve_backend(args.backend, args.endpoint)
    except ValueError as exc:
        raise LoadtestError(str(exc)) from None
    bench = ["--backend", backend.name, "--endpoint", endpoint,
             "--concurrency", *args.concurrency, "--num-prompts", str(args.num_prompts),
             "--input-len", str(args.input_len), "--output-len", str(args.output_len),
             "--range-ratio", str(args.range_ratio), "--seed", str(args.seed),
             "--request-timeout", str(args.request_timeout), "--stall-after", str(args.stall_after)]
    if args.warmup is not None:
        bench += ["--warmup", str(args.warmup)]
    if args.request_rate is not None:
        bench += ["--request-rate", str(args.request_rate), "--burstiness", str(args.burstiness)]
    if args.overwrite:  # with --base-url the run directory's bench.json is replaced too
        bench.append("--overwrite")
    if args.model:
        words = [shlex.split(x) for x in (args.ab or [args.serve])]
        bench += ["--model", next((v for w in words if (v := server_option(w, "--served-model-name"))),
                                  args.model)]
    return bench


def _run_args(args: argparse.Namespace) -> list[str]:
    run_args: list[str] = []
    if args.exporter:
        run_args += ["--exporter", args.exporter]
    if args.prometheus_port is not None:
        run_args += ["--prometheus-port", str(args.prometheus_port)]
    if args.flame:
        run_args.append("--flame")
    if args.overwrite:
        run_args.append("--overwrite")
    return run_args + args.run_option


def _deployments(args: argparse.Namespace) -> tuple[Deployment, ...]:
    """The server argument strings as deployments; a --port among them is the one used."""
    out = []
    for label, text in zip("AB", args.ab or [args.serve]):
        try:
            words = tuple(shlex.split(text))
        except ValueError as exc:
            raise LoadtestError(f"server arguments: {exc}") from None
        port = server_option(list(words), "--port")
        if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
            raise LoadtestError(f"server arguments: --port {port}: a port number expected")
        out.append(Deployment(label, words, args.model, int(port) if port else None))
    return tuple(out)


def config_from_args(argv: list[str]) -> tuple[LoadtestConfig, argparse.Namespace]:
    p = _parser()
    args = p.parse_args(argv)
    _check_numbers(args)
    if args.ab and args.base_url:
        raise LoadtestError("--ab starts its own servers; it cannot be used with --base-url")
    if args.base_url and not (args.run_dir and os.path.isfile(names.path(args.run_dir, names.RUN))):
        raise LoadtestError("--base-url needs --run-dir R: the run directory of the `omnitrace run` "
                            "serving it")
    deps = _deployments(args)
    bench = _bench_args(args)
    startup = args.startup_timeout or (1200.0 if args.model else 180.0)
    cfg = LoadtestConfig(run_dir=args.run_dir or _new_run_dir(), bench_args=tuple(bench),
                         run_args=tuple(_run_args(args)), startup_timeout_s=startup,
                         html=not args.no_html, base_url=args.base_url, deployments=deps)
    return cfg, args


def server_option(words: list[str], name: str) -> str | None:
    """The value of option ``name`` among server arguments (``--name V`` or ``--name=V``;
    the last one, as the server's own parser takes it)."""
    found = None
    for i, w in enumerate(words):
        if w == name and i + 1 < len(words):
            found = words[i + 1]
        elif w.startswith(name + "="):
            found = w.split("=", 1)[1]
    return found


# --------------------------------------------------------------------------- one run
class Interrupted(Exception):
    """A load stopped by a signal (Ctrl-C, or SIGTERM/SIGHUP: ``childproc.Stopped``)."""

    def __init__(self, run_dir: str, signum: int = signal.SIGINT) -> None:
        super().__init__(run_dir)
        self.run_dir = run_dir
        self.signum = signum


# How loadtest ends its server when the load is done: `omnitrace run --planned-stop` with a
# signal no user sends by hand, so that a user's SIGTERM (passed on to the run) still reads
# terminated in run.json, and this stop complete. The run passes it on as SIGTERM.
PLANNED_STOP = signal.SIGUSR1


def _stop(proc: subprocess.Popen, timeout_s: float = 120.0) -> int:
    """The server's own shutdown (the planned stop to `omnitrace run`: SIGTERM to the
    server, then the agent's final drain); killed only if it does not end."""
    if proc.poll() is None:
        proc.send_signal(PLANNED_STOP)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _wait_quietly(proc: subprocess.Popen | None, timeout_s: float) -> None:
    """After Ctrl-C: the children got it too; let them finish their own shutdown."""
    if proc is None:
        return
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            proc.wait(0.5)
        except subprocess.TimeoutExpired:
            pass
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting politely
            break
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()


def _run_child(cmd: list[str]) -> int:
    """One of our commands to its end; on Ctrl-C (it got one too) its own quiet exit first."""
    proc = childproc.start(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        _wait_quietly(proc, 30)
        raise


def bench(url: str, run_dir: str, bench_args: tuple[str, ...],
          server: subprocess.Popen | None = None) -> int:
    """bench's exit status. A server we started that stops during the load stops bench too
    (SIGTERM: bench.json says ``terminated``): an open loop (--request-rate) would otherwise
    go on sending its schedule's requests to nothing. A --base-url server is not ours to watch."""
    cmd = [*_py(), "bench", "--base-url", url, "--out", names.path(run_dir, names.BENCH), *bench_args]
    proc = childproc.start(cmd)
    watching = server is not None
    try:
        while True:
            try:
                return childproc.shell_status(proc.wait(timeout=0.5))
            except subprocess.TimeoutExpired:
                if watching and server.poll() is not None:
                    watching = False  # once: a second SIGTERM would kill bench before it wrote bench.json
                    proc.terminate()
    except KeyboardInterrupt as exc:
        _wait_quietly(proc, 30)
        raise Interrupted(run_dir, childproc.signal_of(exc)) from None


def _ended(rc: int) -> str:
    return f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"


def one_run(cfg: LoadtestConfig, dep: Deployment, run_dir: str) -> int:
    """Serve, load, stop; bench's exit status (1 also when the server stopped during the
    load). Raises Interrupted on a stop signal, LoadtestError on failure."""
    port = dep.port or free_port()
    serve = ["serve", *([dep.model] if dep.model else []), *(["--port", str(port)] if not dep.port else []),
             *dep.serve_args]
    # stopping the server after the load is this run's planned end (run.json: complete)
    cmd = [*_py(), "run", "--run-dir", run_dir, "--planned-stop", PLANNED_STOP.name, *cfg.run_args, *serve]
    shown = ['omnitrace', *cmd[len(_py()):]]
    console.say("loadtest", f"starting {' '.join(shlex.quote(c) for c in shown)}")
    server = childproc.start(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        why = wait_healthy(url, server, cfg.startup_timeout_s)
        if why and server.returncode in (130, -signal.SIGINT):  # a Ctrl-C reached it first
            raise Interrupted(run_dir)
        if why:
            raise LoadtestError(f"{why} (see the server's output above)")
        rc = bench(url, run_dir, cfg.bench_args, server)
        if server.poll() is not None:  # not stopped by us: run.json says how (launcher-killed ...)
            console.say("loadtest", f"the server (omnitrace run) stopped during the load "
                        f"({_ended(server.returncode)}); the report shows what was recorded")
            rc = 1  # whether bench saw it fail or was stopped for it
        elif rc != 0:
            console.say("loadtest", f"the load test did not complete (bench exit {rc}); "
                        "the report shows what was measured")
        return rc
    except KeyboardInterrupt as exc:
        _wait_quietly(server, 120)
        raise Interrupted(run_dir, childproc.signal_of(exc)) from None
    except Interrupted:
        _wait_quietly(server, 120)
        raise
    finally:
        if server.poll() is None:
            try:
                _stop(server)
            except KeyboardInterrupt as exc:
                _wait_quietly(server, 60)
                raise Interrupted(run_dir, childproc.signal_of(exc)) from None


def report(run_dir: str, html: bool) -> int:
    """The attribution report on the console (and report.html); its exit status."""
    cmd = [*_py(), "report", run_dir]
    if html:
        cmd += ["--html", os.path.join(run_dir, "report.html")]
    return _run_child(cmd)


# --------------------------------------------------------------------------- A/B
def ab_order(pattern: str, repeats: int) -> list[str]:
    return list(pattern.upper() * repeats)


RESOLUTION_MS = 0.005  # the verdict lines print ms with two decimals


def verdicts(res: dict, min_share: float = 0.05) -> list[str]:
    """One line per (stage, category) whose CI excludes zero and that moved at least
    ``min_share`` of its A mean (or of A's TTFP, for categories absent in A); its relative
    interval is the ratio's (never below -100%). Categories whose means both print as 0.00
    ms are counted on one line, not shown; ``!`` marks every line when a side is not fit to
    compare (``compare``'s ``unfit``)."""
    ttfp_a = next((r["a_ms"] for r in res["rows"] if r["category"] == "ttfp"), 0.0)
    mark = " !" if res.get("unfit") else ""
    out, tiny = [], 0
    for r in res["rows"]:
        if not r.get("significant"):
            continue
        base = r["a_ms"] if r["a_ms"] > 0 else ttfp_a
        if base <= 0 or abs(r["delta_ms"]) < min_share * base and r["category"] != "ttfp":
            continue
        a, b = r["a_ms"], r["b_ms"]
        if max(a, b) < RESOLUTION_MS:
            tiny += 1
            continue
        if a > 0 and r.get("rel_ci_low") is not None:
            lo, hi = 100 * r["rel_ci_low"], 100 * r["rel_ci_high"]
        else:  # absent in A: a share of A's TTFP
            lo, hi = 100 * r["ci_low_ms"] / base, 100 * r["ci_high_ms"] / base
        name = "TTFP" if r["category"] == "ttfp" else f"{r['stage']} {r['category']}"
        factor = (f", {a / b:.1f}x less" if a > b else f", {b / a:.1f}x more") if a > 0 and b > 0 else ""
        out.append(f"{name} {100 * r['delta_ms'] / base:+.0f}% [{lo:+.0f}, {hi:+.0f}]"
                   f"  ({a:.2f} -> {b:.2f} ms per request{factor}){mark}")
    if tiny:
        out.append(f"({tiny} more moved, each under {RESOLUTION_MS} ms per request on both sides)")
    return out


def run_ab(cfg: LoadtestConfig, pattern: str, repeats: int) -> int:
    os.makedirs(cfg.run_dir, exist_ok=True)
    runs: dict[str, list[str]] = {"A": [], "B": []}
    deps = {d.label: d for d in cfg.deployments}
    order = ab_order(pattern, repeats)
    for i, label in enumerate(order, 1):
        d = os.path.join(cfg.run_dir, f"{i:02d}-{label}")
        console.say("loadtest", f"run {i}/{len(order)}: {label} "
                    f"({' '.join(deps[label].serve_args) or 'default'}) -> {d}", gap=True)
        try:
            one_run(cfg, deps[label], d)
        except Interrupted as exc:
            console.say("loadtest", f"{childproc.stop_status(exc.signum)} during run {i}; finished runs: "
                        f"{' '.join(runs['A'] + runs['B']) or 'none'}; {d} holds what was recorded "
                        f"(omnitrace compare --a ... --b ... on the finished ones)", gap=True)
            return 128 + exc.signum
        runs[label].append(d)
    from omnitrace.analyze.compare import compare
    from omnitrace.analyze.rundir import RunDirError
    try:
        res = compare(runs["A"], runs["B"])
    except (RunDirError, OSError) as exc:
        console.say("loadtest", f"cannot compare: {exc}")
        return 1
    res["deployments"] = {k: list(v.serve_args) for k, v in deps.items()}
    res["order"] = order
    import orjson
    with open(os.path.join(cfg.run_dir, "compare.json"), "wb") as f:
        f.write(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    _run_child([*_py(), "compare", "--a", *runs["A"], "--b", *runs["B"]])
    print(f"\nA = {' '.join(deps['A'].serve_args) or 'default'}; B = {' '.join(deps['B'].serve_args) or 'default'}; "
          f"order {''.join(order)}; {len(runs['A'])} + {len(runs['B'])} runs")
    lines = verdicts(res)
    doubt = "; ! = a side is not fit to compare: see the warnings above" if res["unfit"] else ""
    print(f"What moved (B vs A, 95% CI{doubt}):" if lines else
          f"Nothing moved by >= 5% with a CI excluding 0{doubt}.")
    for line in lines:
        print(f"  {line}")
    if cfg.html:
        from omnitrace.render.compare_html import write_compare_html
        write_compare_html(res, os.path.join(cfg.run_dir, "compare.html"))
        print(f"HTML comparison: {os.path.join(cfg.run_dir, 'compare.html')}")
    print(cfg.run_dir)
    return 0


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    try:
        cfg, args = config_from_args(list(sys.argv[1:] if argv is None else argv))
    except LoadtestError as exc:
        console.say("loadtest", f"{exc}")
        return 2
    childproc.stop_like_ctrl_c()  # a `kill` of loadtest stops the whole run, as Ctrl-C does
    try:
        if args.ab:
            return run_ab(cfg, args.pattern, args.repeats)
        if cfg.base_url:
            rc = bench(cfg.base_url, cfg.run_dir, cfg.bench_args)
        else:
            rc = one_run(cfg, cfg.deployments[0], cfg.run_dir)
        rep = report(cfg.run_dir, cfg.html)
        if rep not in (0, 3):
            return rep
        if rep == 3:
            console.say("loadtest", "no measured request got its first audio packet (the report "
                        "above and bench.json say why)")
        print(cfg.run_dir)
        return rc or (1 if rep == 3 else 0)
    except LoadtestError as exc:
        console.say("loadtest", f"{exc}")
        return 1
    except (Interrupted, KeyboardInterrupt) as exc:
        d = exc.run_dir if isinstance(exc, Interrupted) else cfg.run_dir
        signum = exc.signum if isinstance(exc, Interrupted) else childproc.signal_of(exc)
        console.say("loadtest", f"{childproc.stop_status(signum)}; the run directory keeps what was "
                    f"recorded: {d}\n  omnitrace report {d}", gap=True)
        return 128 + signum
