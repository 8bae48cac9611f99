"""The writers of the run directory's small files (docs/run-directory.md): run.json,
processes.jsonl, agent.json and metrics.jsonl (OTLP/JSON lines, the OpenTelemetry
file-exporter format); and the one read-modify-write of run.json (:func:`update_run`,
:func:`mark_status`) for what is added after its agent. bench.json is written by
``omnitrace.bench.output`` (it may go elsewhere: --out).

metrics.jsonl is printed with the official ``google.protobuf.json_format``; ids would be
base64 there (OTLP/JSON wants hex), which metrics do not have, and enums are written as
integers, so a Collector's otlpjsonfile receiver can replay the file.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import orjson
from google.protobuf.json_format import MessageToDict

from omnitrace import console
from omnitrace.runfiles import names
from omnitrace.runfiles.read import RunFileError, load_object


def otlp_json(message: Any) -> bytes:
    return orjson.dumps(MessageToDict(message, use_integers_for_enums=True))


def write_json_atomic(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    os.replace(tmp, path)


class RunDir:
    """Rewrites the small JSON files and appends metrics lines. A write that fails (disk
    full) leaves the previous version in place and is said once per file, on stderr; the
    next write tries again (the final one is what the report reads)."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self._metrics = open(names.path(path, names.METRICS), "ab", buffering=0)
        self.failing: dict[str, str] = {}  # file -> the error of its last failed write
        self.write_errors = 0
        self._reserve()

    RESERVE_BYTES = 1 << 20

    def _reserve(self) -> None:
        """Space held back for the run's final files: on a disk that fills up during the
        run it is given back at the end (:meth:`release_reserve`), so the final counts,
        run.json and agent.json still fit and the report can account for every event."""
        try:
            fd = os.open(self.file(names.RESERVE), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError:
            self.release_reserve()  # not even that much room: nothing held

    def release_reserve(self) -> None:
        release_reserve(self.path)

    def file(self, name: str) -> str:
        return names.path(self.path, name)

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
        self._guard(names.METRICS, lambda: self._append_line(otlp_json(request) + b"\n"))

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
        return self._guard(names.RUN, lambda: write_json_atomic(self.file(names.RUN), meta))

    def write_processes(self, procs: list[dict]) -> bool:
        def write() -> None:
            tmp = self.file(names.PROCESSES + ".tmp")
            with open(tmp, "wb") as f:
                for p in procs:
                    f.write(orjson.dumps(p) + b"\n")
            os.replace(tmp, self.file(names.PROCESSES))
        return self._guard(names.PROCESSES, write)

    def write_agent(self, counters: dict) -> bool:
        return self._guard(names.AGENT, lambda: write_json_atomic(self.file(names.AGENT), counters))

    def close(self) -> None:
        self.release_reserve()
        try:
            self._metrics.close()
        except OSError:
            pass


def release_reserve(run_dir: str) -> None:
    """Give back the space :class:`RunDir` held for the final files (a killed agent could not)."""
    try:
        os.unlink(names.path(run_dir, names.RESERVE))
    except OSError:
        pass


def update_run(run_dir: str, change: Callable[[dict[str, Any]], None]) -> None:
    """run.json read, changed by ``change`` and written back atomically: the one
    read-modify-write, for what is added once its agent is gone. A missing or unreadable
    run.json starts empty; a write that fails raises OSError."""
    try:
        meta = load_object(run_dir, names.RUN) or {}
    except RunFileError:
        meta = {}
    change(meta)
    write_json_atomic(names.path(run_dir, names.RUN), meta)


def mark_status(run_dir: str, status: str, exit_code: int, **fields: Any) -> None:
    """run.json's end as `omnitrace run` saw it, the agent gone: ``fields``, then
    ``status``, the command's ``exit_code`` and the time (OSError if not written)."""
    def change(meta: dict[str, Any]) -> None:
        meta.update(fields)
        meta.update(status=status, exit_code=exit_code, ended_unix_ns=time.time_ns())
    update_run(run_dir, change)
