"""The run directory's small files (docs/run-directory.md): run.json, processes.jsonl,
agent.json and metrics.jsonl (OTLP/JSON lines, the OpenTelemetry file-exporter format).
The events themselves are ``omnitrace.eventlog``'s.

metrics.jsonl is printed with the official ``google.protobuf.json_format``; ids would be
base64 there (OTLP/JSON wants hex), which metrics do not have, and enums are written as
integers, so a Collector's otlpjsonfile receiver can replay the file.
"""
from __future__ import annotations

import json
import os
import socket
from typing import Any, Callable

import orjson
from google.protobuf.json_format import MessageToDict

from omnitrace import eventlog
from omnitrace import console

RUN_FILES = ("run.json", "agent.json", "spans.jsonl")


def otlp_json(message: Any) -> bytes:
    return orjson.dumps(MessageToDict(message, use_integers_for_enums=True))


def write_json_atomic(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    os.replace(tmp, path)


def check_writable(path: str) -> str | None:
    """None if ``path`` can be created/written as a run directory, else why not."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".omnitrace-write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        return f"{exc.strerror or exc}"
    return None


LOCK_FILE = ".omnitrace-lock"


class RunDirBusy(Exception):
    """One line for the user: another run is live in this directory."""


def claim(path: str) -> int:
    """Make ``path`` this run's: an fd holding an exclusive lock on ``path/.omnitrace-lock``
    (kept open by `omnitrace run` and passed to its agent), or RunDirBusy naming the live
    run. The kernel drops the lock when the last process holding it ends, so a killed
    run never leaves a stale lock; the lock also closes the window before run.json exists.
    A run.json saying "running" whose agent is alive (a run of an omnitrace without the
    lock) is refused as well."""
    import fcntl

    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirBusy(_busy(path, live_agent(path) or "starting or stopping")) from None
    why = live_agent(path)
    if why is not None:
        os.close(fd)
        raise RunDirBusy(_busy(path, why))
    return fd


def _busy(path: str, who: str) -> str:
    return (f"run directory {path} belongs to a run that is still live ({who}); wait for it "
            "to end, or choose another --run-dir (--overwrite never replaces a live run)")


def live_agent(path: str) -> str | None:
    """'run ID, agent pid N' if run.json says running and that agent process is alive on
    this host, else None (finished, dead, unreadable, or on another host)."""
    try:
        with open(os.path.join(path, "run.json"), "rb") as f:
            meta = orjson.loads(f.read())
        run_id, pid = str(meta["run_id"]), int(meta["agent_pid"])
        if meta.get("status") != "running" or meta.get("host") != socket.gethostname():
            return None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return f"run {run_id}, agent pid {pid}" if _is_agent(pid, run_id) else None


def _is_agent(pid: int, run_id: str) -> bool:
    """pid is alive and (where /proc tells) the agent of ``run_id``, not a reused pid."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            return False
        return b"omnitrace.cli.agent" in cmd and run_id.encode() in cmd
    try:  # no /proc here: alive is all we can tell
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def holds_run(path: str) -> str | None:
    """The first file that shows ``path`` already holds a run, or None (an agent that
    could not start leaves at most an empty events/ folder: not a run)."""
    for name in RUN_FILES:
        if os.path.exists(os.path.join(path, name)):
            return name
    segs = eventlog.segments(path)
    return os.path.relpath(segs[0], path) if segs else None


class RunDir:
    """Rewrites the small JSON files and appends metrics lines. A write that fails (disk
    full) leaves the previous version in place and is said once per file, on stderr; the
    next write tries again (the final one is what the report reads)."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self._metrics = open(os.path.join(path, "metrics.jsonl"), "ab", buffering=0)
        self.failing: dict[str, str] = {}  # file -> the error of its last failed write
        self.write_errors = 0
        self._reserve()

    RESERVE = ".omnitrace-reserve"
    RESERVE_BYTES = 1 << 20

    def _reserve(self) -> None:
        """Space held back for the run's final files: on a disk that fills up during the
        run it is given back at the end (:meth:`release_reserve`), so the final counts,
        run.json and agent.json still fit and the report can account for every event."""
        try:
            fd = os.open(self.file(self.RESERVE), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError:
            self.release_reserve()  # not even that much room: nothing held

    def release_reserve(self) -> None:
        try:
            os.unlink(self.file(self.RESERVE))
        except OSError:
            pass

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _guard(self, name: str, write: Callable[[], None]) -> bool:
        try:
            write()
        except OSError as exc:
            self.write_errors += 1
            why = exc.strerror or str(exc)
            if name not in self.failing:
                console.say("agent", f"warning: cannot write {name} ({why}); the previous "
                            "version stays, the next update tries again")
            self.failing[name] = why
            try:
                os.unlink(self.file(name) + ".tmp")
            except OSError:
                pass
            return False
        self.failing.pop(name, None)
        return True

    def write_metrics(self, request: Any) -> None:
        self._guard("metrics.jsonl", lambda: self._append_line(otlp_json(request) + b"\n"))

    def _append_line(self, line: bytes) -> None:
        """A whole line or none: a partial write (disk full) is cut off again."""
        f = self._metrics
        at = f.seek(0, os.SEEK_END)
        try:
            n = f.write(line)
            if n != len(line):
                raise OSError(28, "No space left on device")
        except OSError:
            f.truncate(at)
            raise

    def write_run(self, meta: dict) -> bool:
        return self._guard("run.json", lambda: write_json_atomic(self.file("run.json"), meta))

    def write_processes(self, procs: list[dict]) -> bool:
        def write() -> None:
            tmp = self.file("processes.jsonl.tmp")
            with open(tmp, "wb") as f:
                for p in procs:
                    f.write(orjson.dumps(p) + b"\n")
            os.replace(tmp, self.file("processes.jsonl"))
        return self._guard("processes.jsonl", write)

    def read_processes(self) -> list[dict]:
        """processes.jsonl as written (none: empty; a torn last line is skipped)."""
        out = []
        try:
            with open(self.file("processes.jsonl"), "rb") as f:
                for line in f:
                    try:
                        p = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue
                    if isinstance(p, dict) and isinstance(p.get("pid"), int):
                        out.append(p)
        except OSError:
            pass
        return out

    def write_agent(self, counters: dict) -> bool:
        return self._guard("agent.json", lambda: write_json_atomic(self.file("agent.json"), counters))

    def close(self) -> None:
        self.release_reserve()
        try:
            self._metrics.close()
        except OSError:
            pass


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)
