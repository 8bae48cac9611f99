"""The report's attribution as tables (``segments``, ``hops``: declared in
``omnitrace.tables.schema``): each attributed measured request's critical path, from the
report itself (``build_report``'s rows), so a query reads exactly what the report shows.

A row's segments are [ms after arrival, ms, stage label, category, detail]; times go back
to unix ns from the request's arrival (``requests.arrival_ns``): a float ms of an integer
ns count rounds back to it exactly at these magnitudes.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from omnitrace.analyze import accounting
from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import RunDirError, load_run
from omnitrace.rules import attribution as at
from omnitrace.tables import cache, combine, run as tables_run
from omnitrace.tables.build import enum
from omnitrace.tables.schema import TABLES, arrow_table

REPORT = frozenset(n for n, t in TABLES.items() if t.source == "report")

_HOP = re.compile(r"^(-?\d+)->(-?\d+)#(-?\d+)$")


@dataclass
class Loaded:
    """Tables (name -> Arrow table) and what the user should know of the runs they come
    from: one line per warning, e.g. that the spans are built from part of a run."""

    tables: dict[str, pa.Table]
    notes: list[str] = field(default_factory=list)


def load(run_dir: str, wanted: Iterable[str] | None = None) -> Loaded:
    """``run_dir``'s own tables (``wanted``: these only; None: all; never ``runs``, which
    says how runs combine: :func:`load_runs`), the report's among them when asked for:
    those a long run's earlier load kept (``tables.cache``) read back, the rest made (and
    kept, where worth it). Raises ``tables.run.TablesError`` (one line) for an unusable run."""
    wanted = set(TABLES if wanted is None else wanted) - {"runs"}
    tables, notes = cache.read_fresh(run_dir, wanted)
    if wanted - set(tables):
        t0 = time.monotonic()
        made, notes = _make(run_dir, wanted - set(tables))
        cache.keep(run_dir, made, notes, time.monotonic() - t0)
        tables.update(made)
    return Loaded({n: tables[n] for n in TABLES if n in tables}, notes)


def _make(run_dir: str, wanted: set[str]) -> tuple[dict[str, pa.Table], list[str]]:
    report = wanted & REPORT
    rt = tables_run.load(run_dir, (wanted - REPORT) | ({"requests"} if report else set()))
    if report:
        try:
            made = attribution_tables(run_dir, rt.tables["requests"])
        except RunDirError as exc:
            raise tables_run.TablesError(str(exc)) from None
        rt.tables.update({n: made[n] for n in report})
    tables = {n: t for n, t in rt.tables.items() if n in wanted}
    return tables, accounting.notes_of_load(run_dir, rt.loaded.log, rt.loaded.events)


def load_runs(run_dirs: Sequence[str], wanted: Iterable[str] | None = None) -> Loaded:
    """The tables of several run directories as one set (``tables.combine``: a ``run``
    column, ids numbered on across runs; ``runs`` lists them), and each run's notes (its
    path first where there are several). Each run's attribution is its own report's.
    Raises ``tables.run.TablesError`` for an unusable run or one given twice."""
    wanted = set(TABLES if wanted is None else wanted)
    try:
        paths = combine.distinct(run_dirs)
    except combine.SameRunTwice as exc:
        raise tables_run.TablesError(str(exc)) from None
    each = [load(p, combine.with_key_tables(wanted)) for p in paths]
    made = combine.combine(paths, [one.tables for one in each], wanted)
    notes = [f"{p}: {n}" if len(paths) > 1 else n for p, one in zip(paths, each) for n in one.notes]
    return Loaded({n: t for n, t in made.items() if n in wanted}, notes)


def attribution_tables(run_dir: str, requests: pa.Table) -> dict[str, pa.Table]:
    """``segments`` and ``hops`` of the report on ``run_dir``; ``requests``: its requests
    table (ids and arrivals). Raises ``rundir.RunDirError`` as the report does."""
    rep = build_report(load_run([run_dir]), per_request_segments=True, waterfalls=0)
    return tables_of_report(rep, requests)


def tables_of_report(rep: dict[str, Any], requests: pa.Table) -> dict[str, pa.Table]:
    ids = dict(zip(requests.column("request").to_pylist(), requests.column("request_id").to_pylist()))
    arrival = dict(zip(requests.column("request_id").to_pylist(), requests.column("arrival_ns").to_pylist()))
    stage_of = {a["stage"]: a["stage_id"] for a in rep["attribution"]}
    seg: dict[str, list] = {k: [] for k in ("request_id", "stage", "category", "detail", "start_ns", "dur_ns")}
    hop: dict[str, list] = {k: [] for k in ("request_id", "producer_stage", "consumer_stage", "gating_chunk")}
    for row in rep["requests"]:
        rid = ids[row["id"]]
        t0 = arrival[rid]
        for start_ms, ms, label, category, detail in row["segments"]:
            seg["request_id"].append(rid)
            seg["stage"].append(stage_of[label])
            seg["category"].append(at.CATEGORIES.index(category))
            seg["detail"].append(detail or None)
            seg["start_ns"].append(t0 + round(start_ms * 1e6))
            seg["dur_ns"].append(round(ms * 1e6))
        for h in row["hops"]:
            p, c, k = map(int, _HOP.match(h).groups())
            for col, v in zip(("request_id", "producer_stage", "consumer_stage", "gating_chunk"), (rid, p, c, k)):
                hop[col].append(v)
    start, dur = np.array(seg["start_ns"], np.int64), np.array(seg["dur_ns"], np.int64)
    return {
        "segments": arrow_table("segments", {
            "request_id": seg["request_id"], "stage": seg["stage"],
            "category": enum(np.array(seg["category"], np.int8), tuple(at.CATEGORIES)),
            "detail": pa.array(seg["detail"], pa.string()), "start_ns": start, "end_ns": start + dur,
            "dur_ns": dur}),
        "hops": arrow_table("hops", hop)}
