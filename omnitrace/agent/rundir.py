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
from typing import Any

import orjson
from google.protobuf.json_format import MessageToDict

from omnitrace import eventlog

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


def holds_run(path: str) -> str | None:
    """The first file that shows ``path`` already holds a run, or None (an agent that
    could not start leaves at most an empty events/ folder: not a run)."""
    for name in RUN_FILES:
        if os.path.exists(os.path.join(path, name)):
            return name
    segs = eventlog.segments(path)
    return os.path.relpath(segs[0], path) if segs else None


class RunDir:
    """Rewrites the small JSON files and appends metrics lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self._metrics = open(os.path.join(path, "metrics.jsonl"), "ab")

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def write_metrics(self, request: Any) -> None:
        self._metrics.write(otlp_json(request) + b"\n")
        self._metrics.flush()

    def write_run(self, meta: dict) -> None:
        write_json_atomic(self.file("run.json"), meta)

    def write_processes(self, procs: list[dict]) -> None:
        tmp = self.file("processes.jsonl.tmp")
        with open(tmp, "wb") as f:
            for p in procs:
                f.write(orjson.dumps(p) + b"\n")
        os.replace(tmp, self.file("processes.jsonl"))

    def write_agent(self, counters: dict) -> None:
        write_json_atomic(self.file("agent.json"), counters)

    def close(self) -> None:
        try:
            self._metrics.close()
        except OSError:
            pass


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)
