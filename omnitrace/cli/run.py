"""`omnitrace run [options] [--] COMMAND ...`: run a command with every Python process
it spawns instrumented, the agent alongside, and the run directory written.

How: the bootstrap directory (``omnitrace/inject/bootstrap``, holding a
``sitecustomize``) goes first on PYTHONPATH, which children inherit; OMNITRACE_RUN_ID
turns recording on. The agent is a separate process (``omnitrace agent``), started and
ready *before* the command, told the exit status and asked for its final drain and
flush after it. All options are validated before anything starts; a bad one is a
one-line error and exit status 2; a command that is not found gives 127 (126 if it is
not executable), as a shell would. This module parses and validates; the run itself is
``omnitrace.runner``'s.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time

from omnitrace import conventions as cv
from omnitrace.childproc import python_module
from omnitrace.agent.config import EXPORTERS, AgentConfig
from omnitrace import console
from omnitrace.cli.helpformat import OneLineParser
from omnitrace.runfiles.claim import clear_earlier_run
from omnitrace.runner.command import Command, run_with_agent
from omnitrace.runner.signals import StopSignals



class UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = OneLineParser(
        prog="omnitrace run",
        usage="omnitrace run [options] [--] COMMAND [ARGS...]  |  omnitrace run [options] serve [MODEL] [ARGS...]",
        description="Run COMMAND with every Python process it spawns instrumented; the agent "
                    "records every event in the run directory (events/) and serves live views "
                    "(OTLP spans and metrics, Prometheus) on request.")
    p.add_argument("--run-dir", help="run directory (default: $OMNITRACE_RUNS_DIR or "
                                     "./omnitrace-runs, then /<run-id>)")
    p.add_argument("--run-id", help="run id (default: YYYYmmdd-HHMMSS-<4 hex>)")
    p.add_argument("--exporter", "--exporters", dest="exporter", default=env(cv.ENV_EXPORTERS, "file"),
                   help="comma list of otlp-grpc, otlp-http, prometheus, file (file: the run "
                        "directory's event log, always on)")
    p.add_argument("--otlp-endpoint", default=env(cv.ENV_OTLP_ENDPOINT),
                   help="OTLP endpoint for the otlp exporters (else OTEL_EXPORTER_OTLP_* / SDK default)")
    p.add_argument("--otlp-grpc-endpoint", help="endpoint for otlp-grpc only (host:port or http[s]://host:port)")
    p.add_argument("--otlp-http-endpoint", help="endpoint for otlp-http only (base URL or .../v1/traces)")
    p.add_argument("--otlp-timeout", type=float, default=None,
                   help="seconds per OTLP export (default: OTEL_EXPORTER_OTLP_TIMEOUT or 10)")
    p.add_argument("--prometheus-port", default=env(cv.ENV_PROMETHEUS_PORT, str(cv.DEFAULT_PROMETHEUS_PORT)),
                   help="port of the /metrics endpoint (0 = any free port)")
    p.add_argument("--prometheus-addr", default=env(cv.ENV_PROMETHEUS_ADDR, "127.0.0.1"))
    p.add_argument("--ring-records", default=env(cv.ENV_RING_RECORDS),
                   help="records per thread ring, a power of two (default 65536)")
    p.add_argument("--max-run-bytes", default=None, metavar="SIZE",
                   help="cap on the run's event log on disk (e.g. 500M, 2G): past it new events "
                        "are counted, not recorded (default: no cap)")
    p.add_argument("--overwrite", action="store_true",
                   help="use a --run-dir that already holds a finished or dead run (its files are "
                        "replaced); a live run there is always refused")
    p.add_argument("--patches", action="append", default=[], metavar="DIR",
                   help="your own hook definitions (TARGET/VERSIONS/HOOKS modules, see "
                        "docs/vllm-omni.md), tried before the built-in ones; repeatable")
    p.add_argument("--agent-restarts", type=int, default=5, metavar="N",
                   help="an agent that dies is replaced by one that takes over its rings, at most "
                        "N times a minute (0: never; the command goes on unrecorded)")
    p.add_argument("--planned-stop", default=None, metavar="SIGNAL",
                   help="the signal that ends this run as planned: run.json says complete, not "
                        "terminated (one other than INT, TERM, HUP reaches the command as TERM; "
                        "`omnitrace loadtest` stops its server with USR1)")
    from omnitrace.profile.flags import add_flame_options
    add_flame_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def serve_command(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line (and extra environment) for `omnitrace run serve ARGS`.

    No model (no args, or options only) -> the built-in reference pipeline. A model ->
    vLLM-Omni's ``vllm serve MODEL --omni``; the hook definitions are applied in every
    process by the bootstrap through ``omnitrace.inject.patching`` (and the
    ``vllm.general_plugins`` entry point).
    """
    if not args or args[0].startswith("-"):
        return python_module("omnitrace.cli.serve", *args), {}
    model, rest = args[0], args[1:]
    extra = [] if "--omni" in rest else ["--omni"]
    if not any(a == "--host" or a.startswith("--host=") for a in rest):
        extra += ["--host", "127.0.0.1"]  # vLLM's default is every interface
    return ["vllm", "serve", model, *extra, *rest], {"OMNITRACE_TARGET": "vllm-omni"}


def parse_size(text: str) -> int:
    """'500M', '2G', '1048576' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", text)
    if not m:
        raise ValueError(text)
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def _validate(ns: argparse.Namespace) -> AgentConfig:
    """Every check that can fail, before anything starts. Returns the agent's config."""
    from omnitrace.agent import export_otlp
    from omnitrace.runfiles.claim import check_writable

    kinds = []
    for k in (x.strip() for x in ns.exporter.split(",")):
        if not k:
            continue
        if k not in EXPORTERS:
            raise UsageError(f"unknown exporter {k!r} (choose from {', '.join(EXPORTERS)})")
        if k not in kinds:
            kinds.append(k)
    if "file" not in kinds:
        kinds.append("file")
    endpoints: dict[str, str | None] = {}
    for kind in ("otlp-grpc", "otlp-http"):
        if kind not in kinds:
            continue
        raw = getattr(ns, kind.replace("-", "_") + "_endpoint") or ns.otlp_endpoint
        try:
            if raw is not None:
                endpoints[kind] = export_otlp.normalize_endpoint(kind, raw)
            else:
                env_ep = export_otlp.endpoint_from_env(kind)
                if env_ep is not None:  # the SDK will use it: check it now, not at export time
                    export_otlp.normalize_endpoint(kind, env_ep)
                endpoints[kind] = None
        except export_otlp.ConfigError as exc:
            raise UsageError(str(exc)) from None
    if ns.otlp_timeout is not None and not ns.otlp_timeout > 0:
        raise UsageError(f"--otlp-timeout must be > 0 seconds, got {ns.otlp_timeout}")
    try:
        port = int(ns.prometheus_port)
        if not 0 <= port <= 65535:
            raise ValueError
    except (TypeError, ValueError):
        raise UsageError(f"bad Prometheus port {ns.prometheus_port!r} (want 0..65535)") from None
    if ns.ring_records is not None:
        try:
            n = int(ns.ring_records)
            if n < 16 or n & (n - 1):
                raise ValueError
        except ValueError:
            raise UsageError(f"bad ring size {ns.ring_records!r} (want a power of two >= 16)") from None
    for d in ns.patches:
        if not os.path.isdir(d):
            raise UsageError(f"--patches {d}: not a directory")
    if ns.agent_restarts < 0:
        raise UsageError(f"--agent-restarts must be >= 0, got {ns.agent_restarts}")
    if ns.planned_stop is not None:
        try:
            ns.planned_stop = signal.Signals[f"SIG{ns.planned_stop.upper().removeprefix('SIG')}"]
        except KeyError:
            raise UsageError(f"--planned-stop {ns.planned_stop!r}: not a signal name (e.g. TERM)") from None
    run_id = ns.run_id or new_run_id()
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", run_id):
        raise UsageError(f"bad run id {run_id!r} (letters, digits, '-' and '_', at most 64)")
    run_dir = ns.run_dir or os.path.join(os.environ.get(cv.ENV_RUNS_DIR, "omnitrace-runs"), run_id)
    run_dir = os.path.abspath(run_dir)
    max_bytes = None
    if ns.max_run_bytes is not None:
        try:
            max_bytes = parse_size(ns.max_run_bytes)
        except ValueError:
            raise UsageError(f"bad --max-run-bytes {ns.max_run_bytes!r} (want e.g. 500M, 2G)") from None
    why = check_writable(run_dir)
    if why is not None:
        raise UsageError(f"cannot write run directory {run_dir}: {why}")
    return AgentConfig(run_id=run_id, run_dir=run_dir, exporters=tuple(kinds),
                       otlp_endpoints=endpoints, otlp_timeout_s=ns.otlp_timeout,
                       prometheus_port=port, prometheus_addr=ns.prometheus_addr,
                       max_run_bytes=max_bytes)


def _claim(run_dir: str, overwrite: bool) -> int:
    """The run directory locked for this run (the fd holding the lock), or UsageError: a
    live run there is refused even with --overwrite (deleting its files under its agent
    would mix two runs); a finished or dead one only without --overwrite."""
    from omnitrace.runfiles.claim import RunDirBusy, claim, holds_run
    try:
        lock = claim(run_dir)
    except RunDirBusy as exc:
        raise UsageError(str(exc)) from None
    held = holds_run(run_dir)
    if held is not None and not overwrite:
        os.close(lock)
        raise UsageError(f"run directory {run_dir} already holds a run ({held}); choose "
                         "another --run-dir, or pass --overwrite to replace it")
    return lock


def _resolve_command(cmd: list[str]) -> tuple[list[str], dict[str, str], int | None]:
    """(argv, extra env, shell-like error status or None)."""
    extra: dict[str, str] = {}
    if cmd and cmd[0] == "serve":
        cmd, extra = serve_command(cmd[1:])
    exe = cmd[0]
    if os.sep in exe:
        if not os.path.exists(exe):
            console.say("run", f"{exe}: No such file or directory")
            return cmd, extra, 127
        if os.path.isdir(exe) or not os.access(exe, os.X_OK):
            console.say("run", f"{exe}: Permission denied")
            return cmd, extra, 126
    elif shutil.which(exe) is None:
        console.say("run", f"{exe}: command not found")
        return cmd, extra, 127
    return cmd, extra, None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    ns = parser.parse_args(argv)
    cmd = list(ns.command)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        console.say("run", "no command given (omnitrace run [options] -- COMMAND ...)")
        return 2
    if cmd[0] == "serve" and any(a in ("-h", "--help") for a in cmd[1:]):
        # help for `serve` starts nothing: no agent, no run directory
        return subprocess.call(serve_command(cmd[1:])[0])
    from omnitrace.profile import flags as flame_flags
    try:
        cfg = _validate(ns)
        flame = flame_flags.flame_config(ns, cfg.run_dir)
        lock = _claim(cfg.run_dir, ns.overwrite)  # held until this process ends
    except (UsageError, flame_flags.FlameConfigError) as exc:
        console.say("run", f"{exc}")
        return 2
    full_cmd, extra_env, status = _resolve_command(cmd)
    if status is not None:
        return status
    cfg = dataclasses.replace(cfg, command=tuple(full_cmd))
    if ns.overwrite:
        clear_earlier_run(cfg.run_dir)

    command = Command(full_cmd, extra_env, flame, None if ns.ring_records is None else int(ns.ring_records),
                      tuple(ns.patches), ns.agent_restarts)
    sigs = StopSignals(ns.planned_stop)  # from here a signal is remembered and forwarded, never a traceback
    try:
        return run_with_agent(cfg, lock, command, sigs)
    finally:
        sigs.restore()


if __name__ == "__main__":
    sys.exit(main())
