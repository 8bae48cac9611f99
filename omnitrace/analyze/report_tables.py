"""The report's attribution as tables (``segments``, ``hops``: declared in
``omnitrace.tables.schema``): each attributed measured request's critical path, from the
report itself (``build_report``'s rows), so a query reads exactly what the report shows.

A row's segments are [ms after arrival, ms, stage label, category, detail]; times go back
to unix ns from the request's arrival (``requests.arrival_ns``): a float ms of an integer
ns count rounds back to it exactly at these magnitudes.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import RunDirError, load_run
from omnitrace.rules import attribution as at
from omnitrace.tables import combine, run as tables_run
from omnitrace.tables.build import enum
from omnitrace.tables.schema import TABLES, arrow_table

REPORT = frozenset(n for n, t in TABLES.items() if t.source == "report")

_HOP = re.compile(r"^(-?\d+)->(-?\d+)#(-?\d+)$")


def load(run_dir: str, wanted: Iterable[str] | None = None) -> tables_run.RunTables:
    """``run_dir``'s tables (``wanted``: these only; None: all), the report's among them
    when asked for. Raises ``tables.run.TablesError`` (one line) for an unusable run."""
    wanted = set(TABLES if wanted is None else wanted)
    report = wanted & REPORT
    rt = tables_run.load(run_dir, (wanted - REPORT) | ({"requests"} if report else set()))
    if report:
        try:
            made = attribution_tables(run_dir, rt.tables["requests"])
        except RunDirError as exc:
            raise tables_run.TablesError(str(exc)) from None
        rt.tables.update({n: made[n] for n in report})
    rt.tables = combine.combine([run_dir], [{n: t for n, t in rt.tables.items() if n in wanted}], wanted)
    return rt


def load_runs(run_dirs: Sequence[str], wanted: Iterable[str] | None = None) -> dict[str, pa.Table]:
    """The tables of several run directories as one set (``tables.combine``: a ``run``
    column, ids numbered on across runs; ``runs`` lists them). Each run's attribution is its
    own report's. Raises ``tables.run.TablesError`` for an unusable run or one given twice."""
    wanted = set(TABLES if wanted is None else wanted)
    try:
        paths = combine.distinct(run_dirs)
    except combine.SameRunTwice as exc:
        raise tables_run.TablesError(str(exc)) from None
    made = combine.combine(paths, [load(p, (wanted | combine.KEY_TABLES) - {"runs"}).tables for p in paths],
                           wanted)
    return {n: t for n, t in made.items() if n in wanted}


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
