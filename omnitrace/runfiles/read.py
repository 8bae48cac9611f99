"""Readers of the run directory's small files. Each checks the types of the fields
omnitrace reads (:mod:`.fieldtypes`): a file omnitrace did not write is one line
(:class:`RunFileError`, naming the file and the field), never a traceback later on. A
missing file is None: what it would say is unknown, which the callers say in their way."""
from __future__ import annotations

import os
from typing import Any

import orjson

from omnitrace.runfiles import fieldtypes, names


class RunFileError(Exception):
    """A run-directory file that is not what omnitrace writes: ``name`` and ``why``."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: {why}")
        self.name, self.why = name, why


class UnreadableFile(RunFileError):
    """Not JSON, or not readable: a torn write or a foreign file; the rest of the run stands."""


def load_object(run_dir: str, name: str) -> dict[str, Any] | None:
    """The JSON object in ``name``, unchecked (None: no such file)."""
    path = names.path(run_dir, name)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            doc = orjson.loads(f.read())
    except (orjson.JSONDecodeError, OSError) as exc:
        raise UnreadableFile(name, f"unreadable ({exc.__class__.__name__}: {str(exc)[:80]})") from None
    if not isinstance(doc, dict):
        raise RunFileError(name, f"a JSON {type(doc).__name__}, not the object omnitrace writes")
    return doc


def read(run_dir: str, name: str) -> dict[str, Any] | None:
    """run.json, agent.json or bench.json, its fields' types checked (None: missing)."""
    doc = load_object(run_dir, name)
    if doc is None:
        return None
    if name == names.BENCH:
        _check_bench_shape(doc)
    why = fieldtypes.check(name, doc)
    if why:
        raise RunFileError(name, f"{why} (not a file omnitrace writes)")
    return doc


def _check_bench_shape(bench: dict[str, Any]) -> None:
    """Request and level lists that are not lists of objects: another tool's file, said
    so before any field is looked at."""
    for key in ("levels", "requests"):
        v = bench.get(key)
        if v is None:
            continue
        if not isinstance(v, list):
            why = f"{key!r} is {type(v).__name__}, not a list"
        elif not all(isinstance(x, dict) for x in v):
            why = f"{key!r} holds a non-object"
        else:
            continue
        raise RunFileError(names.BENCH, f"not an omnitrace bench file ({why})")


def read_or_empty(run_dir: str, name: str) -> dict[str, Any]:
    """:func:`read`, or {} where the file is missing or not omnitrace's: for live readers
    (the terminal view, the sweep after a run, a successor agent) that go on without it."""
    try:
        return read(run_dir, name) or {}
    except RunFileError:
        return {}


def run_id(run_dir: str) -> str | None:
    """run.json's run id, or None (no run.json, or not omnitrace's)."""
    rid = read_or_empty(run_dir, names.RUN).get("run_id")
    return str(rid) if rid else None


def read_processes(run_dir: str, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """processes.jsonl's objects, their fields unchecked: who needs one checks it (none:
    empty). A torn last line (the agent killed mid-write) is skipped, said in ``warnings``
    where given; other bad lines are skipped."""
    out = []
    try:
        with open(names.path(run_dir, names.PROCESSES), "rb") as f:
            for i, line in enumerate(f, 1):
                try:
                    p = orjson.loads(line)
                except orjson.JSONDecodeError:
                    if not line.endswith(b"\n") and line.strip() and warnings is not None:
                        warnings.append(f"{names.PROCESSES}: last line {i} is truncated (writer "
                                        "killed mid-write?); ignored")
                    continue
                if isinstance(p, dict):
                    out.append(p)
    except OSError:
        pass
    return out


def last_metrics(run_dir: str, count: int) -> list[dict[str, Any]]:
    """The last ``count`` metrics.jsonl messages, oldest first (only the file's last 8 MiB
    is read: a long run's file is large; a line torn by a write under way, or foreign, is
    passed over)."""
    try:
        with open(names.path(run_dir, names.METRICS), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - (8 << 20)))
            lines = [ln for ln in f.read().splitlines() if ln.startswith(b"{")]
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for line in reversed(lines):
        if len(out) == count:
            break
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(msg, dict):
            out.append(msg)
    return out[::-1]


def read_profiles_index(run_dir: str) -> dict[str, Any] | None:
    """--flame's profiles/index.json (None: no profiles, or unreadable)."""
    try:
        return load_object(run_dir, names.PROFILES_INDEX)
    except RunFileError:
        return None
