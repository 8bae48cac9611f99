"""The ``--flame*`` options of `omnitrace run`, and what `omnitrace run` does with them:
build and check a :class:`FlameConfig`, start the command under the profile runner, and
write ``profiles/`` once the run is over."""
from __future__ import annotations

import argparse
import os
import shutil

from omnitrace import console
from omnitrace.profile.config import (API_PROFILERS, DEFAULT_RATE, ENV_FLAME_ROTATE_S, MODES, WINDOWS,
                                      FlameConfig, FlameConfigError)

__all__ = ["FlameConfigError", "add_flame_options", "flame_config", "wrap", "finish"]


def add_flame_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("flame graphs (profiles/ in the run directory)")
    g.add_argument("--flame", action="store_true",
                   help="sample every API server and stage process with py-spy, from its start to "
                        "its end; profiles/ gets speedscope JSON and an SVG per role and stage")
    g.add_argument("--flame-rate", type=int, default=None, metavar="HZ",
                   help=f"py-spy samples per second (default {DEFAULT_RATE})")
    g.add_argument("--flame-mode", default=None, choices=MODES,
                   help="py-spy nonblocking (default, ~0%% cost) or blocking (pauses the process "
                        "per sample: consistent stacks, a few %% cost)")
    g.add_argument("--flame-window", default=None, choices=WINDOWS,
                   help="run (default): the whole run; measured: only the bench's measured window")
    g.add_argument("--flame-api", default=None, choices=API_PROFILERS,
                   help="the API server's profile: py-spy (default) or pyinstrument (its asyncio "
                        "loop, awaits charged to the coroutine that waited)")
    g.add_argument("--flame-tool", default=None, metavar="PATH",
                   help="the py-spy executable (default: py-spy on PATH)")


def flame_config(ns: argparse.Namespace, run_dir: str) -> FlameConfig | None:
    """The checked config, or None without --flame; FlameConfigError on a bad option."""
    given = [name for name in ("flame_rate", "flame_mode", "flame_window", "flame_api", "flame_tool")
             if getattr(ns, name) is not None]
    if not ns.flame:
        if given:
            raise FlameConfigError(f"--{given[0].replace('_', '-')} needs --flame")
        return None
    tool = ns.flame_tool or "py-spy"
    if shutil.which(tool) is None:
        raise FlameConfigError(f"--flame-tool {tool}: not found or not executable")
    rotate = os.environ.get(ENV_FLAME_ROTATE_S, "60")
    try:
        rotate_s = float(rotate)
    except ValueError:
        raise FlameConfigError(f"{ENV_FLAME_ROTATE_S}={rotate!r}: not a number of seconds") from None
    return FlameConfig(run_dir=run_dir, rate=DEFAULT_RATE if ns.flame_rate is None else ns.flame_rate,
                       mode=ns.flame_mode or "nonblocking", window=ns.flame_window or "run",
                       api=ns.flame_api or "py-spy", tool=os.path.abspath(tool) if os.sep in tool else tool,
                       rotate_s=rotate_s).validate()


def wrap(cfg: FlameConfig | None, cmd: list[str]) -> list[str]:
    if cfg is None:
        return cmd
    from omnitrace.childproc import python_module
    return python_module("omnitrace.profile.runner", "--config", cfg.to_json(), "--", *cmd)


def finish(run_dir: str, who: str = "run") -> None:
    """Write profiles/ (one line on stderr says what is there and what is missing)."""
    from omnitrace.profile.finalize import finalize
    try:
        index = finalize(run_dir)
    except Exception as exc:  # the run itself is recorded: profiles must never fail it
        console.say(who, f"warning: flame graphs not written: {type(exc).__name__}: {exc}")
        return
    names = ", ".join(p["name"] for p in index["profiles"]) or "none"
    line = f"flame graphs in {os.path.join(run_dir, 'profiles')}: {names}"
    if index["missing"]:  # why: in the runner's warning, in index.json, in the report
        line += (f"; py-spy profile missing for {', '.join(m['name'] for m in index['missing'])} "
                 "(profiles/index.json says why)")
    console.say(who, line)
