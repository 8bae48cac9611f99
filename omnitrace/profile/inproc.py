"""What a `--flame` run does inside each of its Python processes (from the bootstrap,
``sitecustomize``, when ``OMNITRACE_FLAME`` is set):

* once the process is the API server or a stage, with py-spy: start the clock thread
  (``omnitrace.profile.clock``) and announce the process to the profile runner (one
  datagram with the pid), which starts a py-spy for it; the clock's switches go to
  ``profiles/raw/clock-<pid>.bin`` as they accumulate and at exit;
* pyinstrument where py-spy cannot help, as ``OMNITRACE_FLAME_INPROC`` says:

* ``api`` (``--flame-api pyinstrument``): the API server's asyncio loop. The profiler
  starts on the thread that names the process the API server (``record.set_process_info(
  role="api")``, called before the loop runs), in pyinstrument's async mode. Started
  outside the loop, every task is in its context: the loop's CPU is charged to the
  coroutines it runs, and every await (the server's main coroutine's too) shows as the
  loop's idle ``select``/``epoll.poll``, not as an ``[await]`` frame.
* ``all`` (py-spy could not attach): the API server and each stage profile the thread
  that named them (their main thread) from then on.

At exit the session is saved as ``profiles/raw/pyinstrument-<pid>.json`` for the
finalizer. pyinstrument costs 1.5-5x on the profiled thread (a setprofile hook per call):
a diagnosis tool, not for overhead-sensitive runs.
"""
from __future__ import annotations

import atexit
import os
from typing import Any

from omnitrace.profile.config import ENV_FLAME, ENV_FLAME_INPROC, ENV_FLAME_SOCKET, FlameConfig

INTERVAL_S = 0.001
_state: dict[str, Any] = {"profiler": None}


def _raw_path(name: str) -> str | None:
    try:
        cfg = FlameConfig.from_json(os.environ[ENV_FLAME])
    except (KeyError, ValueError):
        return None
    return os.path.join(cfg.raw_dir, name)


def _out_path() -> str | None:
    return _raw_path(f"pyinstrument-{os.getpid()}.json")


def _sample() -> None:
    """Start the clock, then ask the runner for a py-spy (it samples from now on)."""
    import socket

    from omnitrace.profile.clock import Clock
    clock = Clock(_raw_path(f"clock-{os.getpid()}.bin"))
    clock.start()

    def save() -> None:
        clock.stop.set()
        clock.flush()

    atexit.register(save)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(str(os.getpid()).encode(), "\0" + os.environ[ENV_FLAME_SOCKET])
    except OSError:
        pass  # the runner is gone: nothing samples this process


def _begin() -> None:
    if _state["profiler"] is not None:
        return
    from pyinstrument import Profiler
    prof = Profiler(interval=INTERVAL_S, async_mode="enabled")
    prof.start()
    _state["profiler"] = prof
    atexit.register(_save)


def _save() -> None:
    prof = _state.pop("profiler", None)
    if prof is None:
        return
    from omnitrace import record
    try:
        session = prof.stop()
    except Exception:
        return
    if record.process_info().role not in ("api", "stage"):
        return  # a helper, the bench, ...: not a profile anyone asked for
    path = _out_path()
    if path is not None:
        try:
            session.save(path)
        except OSError:
            pass


def start() -> None:
    """Called by the bootstrap in every Python process of a --flame run. Nothing happens
    until the process names itself the API server or a stage (``record.set_process_info``,
    right after its start-up imports): the bench, helpers and tools are never profiled."""
    from omnitrace import record
    orig = record.set_process_info

    def set_process_info(role: str | None = None, *args: Any, **kwargs: Any) -> None:
        orig(role, *args, **kwargs)
        if role in ("api", "stage") and not _state.get("became"):
            _state["became"] = True
            try:
                _became(role)
            except Exception as exc:  # profiling must never break the process it profiles
                import sys
                sys.stderr.write(f"omnitrace: warning: flame profiling of this {role} process "
                                 f"failed, continuing: {type(exc).__name__}: {exc}\n")

    record.set_process_info = set_process_info  # type: ignore[assignment]


def _became(role: str) -> None:
    if os.environ.get(ENV_FLAME_SOCKET):
        _sample()
    mode = os.environ.get(ENV_FLAME_INPROC)
    if mode == "all" or (mode == "api" and role == "api"):
        _begin()


def load_collapsed(path: str) -> tuple[dict[tuple[str, ...], float], dict]:
    """A saved pyinstrument session -> (collapsed stacks in seconds, speedscope document)."""
    import orjson
    from pyinstrument.renderers import SpeedscopeRenderer
    from pyinstrument.session import Session

    session = Session.load(path)
    out: dict[tuple[str, ...], float] = {}
    root = session.root_frame()

    def walk(frame: Any, path: tuple[str, ...]) -> None:
        label = f"{frame.function} ({os.path.basename(frame.file_path or '')})" \
            if frame.file_path else str(frame.function)
        here = path if frame.function == "[self]" else path + (label,)  # [self]: its parent's time
        if not frame.children:
            out[here or (label,)] = out.get(here or (label,), 0.0) + float(frame.time)
        for child in frame.children:
            walk(child, here)

    if root is not None:
        walk(root, ())
    # show_all: pyinstrument's renderers drop frames under 1% of the total by default; the
    # speedscope file keeps every frame, as the SVG (from the unprocessed tree above) does
    doc = orjson.loads(SpeedscopeRenderer(show_all=True).render(session))
    return out, doc
