"""Flame-graph capture configuration: one typed object, built once by `omnitrace run` from
its ``--flame*`` flags (``omnitrace.cli.run``), validated there and handed whole
as JSON to the profile runner (``omnitrace.profile.runner``) and, through
``OMNITRACE_FLAME``, to the in-process profiler (``omnitrace.profile.inproc``).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import orjson

from omnitrace.runfiles import names

MODES = ("nonblocking", "blocking")
WINDOWS = ("run", "measured")
API_PROFILERS = ("py-spy", "pyinstrument")
# samples/s. py-spy spends ~0.8 ms of CPU per sample of a process with ~8 threads
# (whatever the flags): at 100 Hz, 4 processes take a third of a core, which a 2-core box
# serving c=32 pays in throughput and TTFP (benchmarks/flame_results.md). 25 Hz is 4x less,
# and a minute still gives 1,500 samples per thread; raise it where cores are free.
DEFAULT_RATE = 25
ENV_FLAME = "OMNITRACE_FLAME"  # FlameConfig JSON, set for the command's processes
ENV_FLAME_INPROC = "OMNITRACE_FLAME_INPROC"  # "api" (pyinstrument on the API loop) or "all" (fallback)
ENV_FLAME_SOCKET = "OMNITRACE_FLAME_SOCKET"  # the runner's socket: each process announces itself
ENV_FLAME_ROTATE_S = "OMNITRACE_FLAME_ROTATE_S"  # a fresh py-spy per process this often (default 60)
RAW_DIR = os.path.join(names.PROFILES, "raw")  # py-spy chunks and the clock, until finalized


class FlameConfigError(ValueError):
    """A bad --flame option: one line for the user."""


@dataclass(frozen=True)
class FlameConfig:
    run_dir: str
    rate: int = DEFAULT_RATE  # py-spy samples per second
    mode: str = "nonblocking"  # py-spy: nonblocking (~0% cost) or blocking (consistent stacks)
    window: str = "run"  # run: whole run; measured: only the bench's measured window(s)
    api: str = "py-spy"  # the API server's profile: py-spy, or pyinstrument (async mode)
    tool: str = "py-spy"  # the py-spy executable (a path or a name on PATH)
    rotate_s: float = 60.0  # a fresh py-spy every this many seconds: its memory stays bounded

    def validate(self) -> "FlameConfig":
        if not isinstance(self.rate, int) or not 1 <= self.rate <= 1000:
            raise FlameConfigError(f"--flame-rate must be 1..1000 samples/s, got {self.rate!r}")
        for name, value, allowed in (("--flame-mode", self.mode, MODES),
                                     ("--flame-window", self.window, WINDOWS),
                                     ("--flame-api", self.api, API_PROFILERS)):
            if value not in allowed:
                raise FlameConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        if not self.tool:
            raise FlameConfigError("--flame-tool: empty")
        if not self.rotate_s >= 2:
            raise FlameConfigError(f"{ENV_FLAME_ROTATE_S} must be >= 2 s, got {self.rotate_s}")
        return self

    @property
    def raw_dir(self) -> str:
        return os.path.join(self.run_dir, RAW_DIR)

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> "FlameConfig":
        d = orjson.loads(text)
        if not isinstance(d, dict):
            raise FlameConfigError("flame config: not a JSON object")
        try:
            return cls(**d).validate()
        except TypeError as exc:
            raise FlameConfigError(f"flame config: {exc}") from None
