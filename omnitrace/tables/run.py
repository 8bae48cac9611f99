"""One run directory's tables: the event log through the one loader into
:class:`build.TablesSink`, and bench.json's requests."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from omnitrace import eventlog, spanload
from omnitrace.runfiles import names, read
from omnitrace.tables.build import LOADED, TablesSink
from omnitrace.tables.schema import TABLES, arrow_table


# what a report's load makes for sql besides its own: the requests, their stage visits and
# API marks (a few rows per request) and the tables of the rings (no emits: a row per
# packet; no chunk table: a row per chunk span)
ALONGSIDE = frozenset({"requests", "stage_visits", "api_marks", "processes", "threads", "stages"})


class TablesError(Exception):
    """A run directory whose tables cannot be made (one line for the user)."""


@dataclass
class RunTables:
    """The tables made (name -> Arrow table), the request id strings by request_id (index
    0: no request) and what the load saw (``spanload.Loaded``)."""

    tables: dict[str, pa.Table]
    requests: list[str]
    loaded: spanload.Loaded

    def request_id(self) -> dict[str, int]:
        return {r: i for i, r in enumerate(self.requests) if i}


def load(run_dir: str, wanted: Iterable[str] | None = None) -> RunTables:
    """The tables of ``run_dir`` (``wanted``: these only; None: every table the event log
    and bench.json make). Raises :class:`TablesError` for a directory without an event log
    or with a corrupt one, or an unreadable bench.json."""
    wanted = set(TABLES if wanted is None else wanted)
    if not os.path.isdir(run_dir):
        raise TablesError(f"{run_dir}: not a run directory")
    bench = _bench_rows(run_dir)
    sink = TablesSink(wanted & LOADED)
    try:
        loaded = spanload.load(run_dir, [sink])
    except eventlog.EventLogError as exc:
        raise TablesError(str(exc)) from None
    if loaded is None:
        raise TablesError(f"{run_dir}: no event log (events/) in this run directory")
    return _finished(sink, loaded, wanted, bench)


def _finished(sink: TablesSink, loaded: spanload.Loaded, wanted: set[str],
              bench: list[dict[str, Any]]) -> RunTables:
    """The tables of a load ``sink`` took, the bench's requests among them."""
    requests = list(loaded.log.requests.strings)
    known = set(requests)
    requests += list(dict.fromkeys(str(r["id"]) for r in bench if str(r["id"]) not in known))
    tables = sink.finish(loaded.log.rings, requests)
    if "bench_requests" in wanted:
        tables["bench_requests"] = bench_table(bench, {r: i for i, r in enumerate(requests) if i})
    return RunTables({n: tables[n] for n in TABLES if n in tables}, requests, loaded)


class Alongside:
    """The request tables (:data:`ALONGSIDE`) made alongside another reader's load of
    ``run_dir`` (the report's: its sink rides the same load, pairing nothing more), for
    ``omnitrace sql`` to keep (``tables.cache``): after a long run's report, a question
    about its requests is answered without loading the log again."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.sink = TablesSink(ALONGSIDE)

    def tables(self, loaded: spanload.Loaded) -> dict[str, pa.Table]:
        """The tables (none where bench.json cannot be read: ``sql`` says why itself)."""
        try:
            return _finished(self.sink, loaded, set(ALONGSIDE), _bench_rows(self.run_dir)).tables
        except TablesError:
            return {}


def _bench_rows(run_dir: str) -> list[dict[str, Any]]:
    """bench.json's request rows that have an id (none: no bench.json)."""
    try:
        doc = read.read(run_dir, names.BENCH)
    except read.RunFileError as exc:
        raise TablesError(f"{names.path(run_dir, exc.name)}: {exc.why}") from None
    if doc is None:
        return []
    rows = doc.get("requests")
    if not isinstance(rows, list):
        raise TablesError(f"{names.path(run_dir, names.BENCH)}: not an omnitrace bench file (no 'requests' list)")
    return [r for r in rows if isinstance(r, dict) and r.get("id")]


def _ns(rows: list[dict[str, Any]], key: str, scale: float = 1.0) -> pa.Array:
    """A numeric bench field as int64 (seconds -> ns with ``scale``); null where absent."""
    vals = [r.get(key) for r in rows]
    ok = [isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals]
    out = np.array([round(v * scale) if good else 0 for v, good in zip(vals, ok)], np.int64)
    return pa.array(out, pa.int64(), mask=~np.array(ok, bool))


def bench_table(rows: list[dict[str, Any]], request_id: dict[str, int]) -> pa.Table:
    return arrow_table("bench_requests", {
        "request_id": [request_id[str(r["id"])] for r in rows], "concurrency": _ns(rows, "concurrency"),
        "warmup": [bool(r.get("warmup")) for r in rows], "start_ns": _ns(rows, "start_unix_ns"),
        "ttft_ns": _ns(rows, "ttft_s", 1e9), "ttfp_ns": _ns(rows, "ttfp_s", 1e9),
        "latency_ns": _ns(rows, "latency_s", 1e9), "input_len": _ns(rows, "input_len"),
        "output_len": _ns(rows, "output_len"),
        "error": pa.array([str(r["error"]) if r.get("error") else None for r in rows], pa.string())})
