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
from omnitrace.cli.helpformat import DefaultsFormatter
from omnitrace.bench.client import BACKEND_HELP, resolve_backend
from omnitrace.bench.serve_and_bench import free_port, wait_healthy
from omnitrace import console


class LoadtestError(Exception):
    """One line for the user."""


@dataclass(frozen=True)
class Deployment:
    """One server configuration, as ``omnitrace run`` and ``serve`` take it."""

    label: str
    serve_args: tuple[str, ...] = ()
    model: str | None = None


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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"omnitrace loadtest: {message} (see omnitrace loadtest --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
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
    g.add_argument("--endpoint", default=None, help="route path (default: the backend's)")
    g.add_argument("--concurrency", nargs="+", default=["16"], help="levels to sweep")
    g.add_argument("--num-prompts", type=int, default=96, help="measured requests per level")
    g.add_argument("--warmup", type=int, default=None, help="warm-up requests per level (default: = concurrency)")
    g.add_argument("--input-len", type=int, default=1500, help="prompt tokens")
    g.add_argument("--output-len", type=int, default=60, help="output tokens")
    g.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in len*(1 +- ratio)")
    g.add_argument("--seed", type=int, default=0, help="prompt and length seed")
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


def _default_dir() -> str:
    parent = os.environ.get(cv.ENV_RUNS_DIR) or "omnitrace-runs"
    return os.path.join(parent, "loadtest-" + time.strftime("%Y%m%d-%H%M%S"))


def config_from_args(argv: list[str]) -> tuple[LoadtestConfig, argparse.Namespace]:
    p = _parser()
    args = p.parse_args(argv)
    if args.num_prompts <= 0 or args.input_len <= 0 or args.output_len <= 0:
        raise LoadtestError("--num-prompts, --input-len and --output-len must be positive")
    if args.ab and args.base_url:
        raise LoadtestError("--ab starts its own servers; it cannot be used with --base-url")
    if args.base_url and not (args.run_dir and os.path.isfile(os.path.join(args.run_dir, "run.json"))):
        raise LoadtestError("--base-url needs --run-dir R: the run directory of the `omnitrace run` "
                            "serving it")
    if args.repeats < 1 or not args.pattern or set(args.pattern.upper()) - {"A", "B"}:
        raise LoadtestError("--pattern is a string of A and B (e.g. ABBA), --repeats >= 1")
    try:
        backend, endpoint = resolve_backend(args.backend, args.endpoint)
    except ValueError as exc:
        raise LoadtestError(str(exc)) from None
    bench = ["--backend", backend.name, "--endpoint", endpoint,
             "--concurrency", *args.concurrency, "--num-prompts", str(args.num_prompts),
             "--input-len", str(args.input_len), "--output-len", str(args.output_len),
             "--range-ratio", str(args.range_ratio), "--seed", str(args.seed)]
    if args.warmup is not None:
        bench += ["--warmup", str(args.warmup)]
    if args.overwrite:  # with --base-url the run directory's bench.json is replaced too
        bench.append("--overwrite")
    run_args: list[str] = []
    if args.exporter:
        run_args += ["--exporter", args.exporter]
    if args.prometheus_port is not None:
        run_args += ["--prometheus-port", str(args.prometheus_port)]
    if args.flame:
        run_args.append("--flame")
    if args.overwrite:
        run_args.append("--overwrite")
    run_args += args.run_option
    try:
        if args.ab:
            deps = tuple(Deployment(x, tuple(shlex.split(s)), args.model) for x, s in zip("AB", args.ab))
        else:
            deps = (Deployment("A", tuple(shlex.split(args.serve)), args.model),)
    except ValueError as exc:
        raise LoadtestError(f"server arguments: {exc}") from None
    if args.model:
        bench += ["--model", served_model_name(args.model, args.ab or [args.serve])]
    startup = args.startup_timeout or (1200.0 if args.model else 180.0)
    cfg = LoadtestConfig(run_dir=args.run_dir or _default_dir(), bench_args=tuple(bench),
                         run_args=tuple(run_args), startup_timeout_s=startup,
                         html=not args.no_html, base_url=args.base_url, deployments=deps)
    return cfg, args


def served_model_name(model: str, serve_args: list[str]) -> str:
    """The name requests must give: vLLM's ``--served-model-name`` (the first, if several
    deployments name one), else the model argument itself."""
    for args in serve_args:
        try:
            words = shlex.split(args)
        except ValueError:  # reported where the deployments are parsed
            continue
        for i, w in enumerate(words):
            if w == "--served-model-name" and i + 1 < len(words):
                return words[i + 1]
            if w.startswith("--served-model-name="):
                return w.split("=", 1)[1]
    return model


# --------------------------------------------------------------------------- one run
class Interrupted(Exception):
    def __init__(self, run_dir: str) -> None:
        super().__init__(run_dir)
        self.run_dir = run_dir


def _stop(proc: subprocess.Popen, timeout_s: float = 120.0) -> int:
    """The server's own shutdown (SIGTERM to `omnitrace run`: forwarded, then the agent's
    final drain); killed only if it does not end."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
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


def bench(url: str, run_dir: str, bench_args: tuple[str, ...]) -> int:
    cmd = [*_py(), "bench", "--base-url", url, "--out", os.path.join(run_dir, "bench.json"), *bench_args]
    proc = childproc.start(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        _wait_quietly(proc, 30)
        raise Interrupted(run_dir) from None


def one_run(cfg: LoadtestConfig, dep: Deployment, run_dir: str) -> None:
    """Serve, load, stop. Raises Interrupted on Ctrl-C, LoadtestError on failure."""
    port = free_port()
    serve = ["serve", *([dep.model] if dep.model else []), "--port", str(port), *dep.serve_args]
    cmd = [*_py(), "run", "--run-dir", run_dir, *cfg.run_args, *serve]
    shown = ['omnitrace', *cmd[len(_py()):]]
    console.say("loadtest", f"starting {' '.join(shlex.quote(c) for c in shown)}")
    server = childproc.start(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        why = wait_healthy(url, server, cfg.startup_timeout_s)
        if why:
            raise LoadtestError(f"{why} (see the server's output above)")
        rc = bench(url, run_dir, cfg.bench_args)
        if rc != 0:
            console.say("loadtest", f"the load test did not complete (bench exit {rc}); "
                        "the report shows what was measured")
    except KeyboardInterrupt:
        _wait_quietly(server, 120)
        raise Interrupted(run_dir) from None
    except Interrupted:
        _wait_quietly(server, 120)
        raise
    finally:
        if server.poll() is None:
            try:
                _stop(server)
            except KeyboardInterrupt:
                _wait_quietly(server, 60)
                raise Interrupted(run_dir) from None


def report(run_dir: str, html: bool) -> int:
    """The attribution report on the console (and report.html); its exit status."""
    cmd = [*_py(), "report", run_dir]
    if html:
        cmd += ["--html", os.path.join(run_dir, "report.html")]
    return _run_child(cmd)


# --------------------------------------------------------------------------- A/B
def ab_order(pattern: str, repeats: int) -> list[str]:
    return list(pattern.upper() * repeats)


def verdicts(res: dict, min_share: float = 0.05) -> list[str]:
    """One line per (stage, category) whose CI excludes zero and that moved at least
    ``min_share`` of its A mean (or of A's TTFP, for categories absent in A)."""
    ttfp_a = next((r["a_ms"] for r in res["rows"] if r["category"] == "ttfp"), 0.0)
    out = []
    for r in res["rows"]:
        if not r.get("significant"):
            continue
        base = r["a_ms"] if r["a_ms"] > 0 else ttfp_a
        if base <= 0 or abs(r["delta_ms"]) < min_share * base and r["category"] != "ttfp":
            continue
        pct = lambda x: 100.0 * x / base  # noqa: E731
        name = "TTFP" if r["category"] == "ttfp" else f"{r['stage']} {r['category']}"
        a, b = r["a_ms"], r["b_ms"]
        factor = (f", {a / b:.1f}x less" if a > b else f", {b / a:.1f}x more") if a > 0 and b > 0 else ""
        out.append(f"{name} {pct(r['delta_ms']):+.0f}% [{pct(r['ci_low_ms']):+.0f}, {pct(r['ci_high_ms']):+.0f}]"
                   f"  ({a:.2f} -> {b:.2f} ms per request{factor})")
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
        except Interrupted:
            console.say("loadtest", f"interrupted during run {i}; finished runs: "
                        f"{' '.join(runs['A'] + runs['B']) or 'none'}; {d} holds what was recorded "
                        f"(omnitrace compare --a ... --b ... on the finished ones)", gap=True)
            return 130
        runs[label].append(d)
    from omnitrace.cli.compare import compare
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
    print("What moved (B vs A, 95% CI):" if lines else "Nothing moved by >= 5% with a CI excluding 0.")
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
    try:
        if args.ab:
            return run_ab(cfg, args.pattern, args.repeats)
        if cfg.base_url:
            rc = bench(cfg.base_url, cfg.run_dir, cfg.bench_args)
        else:
            one_run(cfg, cfg.deployments[0], cfg.run_dir)
            rc = 0
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
        console.say("loadtest", f"interrupted; the run directory keeps what was recorded: {d}\n"
                    f"  omnitrace report {d}", gap=True)
        return 130
