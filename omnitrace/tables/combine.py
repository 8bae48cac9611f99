"""Several run directories as one set of tables: replicas of one deployment behind a load
balancer, or repeated runs of one load. Each table's ``run`` column says which directory a
row came from (``runs``), and the ids other tables refer to (``request_id``,
``thread_id``, ``sender_id``) are numbered on from the previous run's, so every join on an
id stays a join within one run and a query written for one run reads several unchanged."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from omnitrace.runfiles import read as runfiles_read
from omnitrace.tables import cache
from omnitrace.tables.schema import TABLES, arrow_table

KEYS = ("request_id", "thread_id", "sender_id")  # numbered per run from 0 (schema's ids)
# the table that holds every id of its key: loaded with any table that refers to the key,
# so a run's ids are numbered on by the same amount in every load (a shell loads tables as
# its queries need them); a key no wanted table holds needs none (senders would cost the
# load its chunk pairing)
KEY_TABLE = {"request_id": "requests", "thread_id": "threads", "sender_id": "senders"}


def with_key_tables(wanted: set[str]) -> set[str]:
    """``wanted`` and the key tables of the ids its tables hold."""
    held = {c.name for n in wanted if n in TABLES for c in TABLES[n].columns}
    return wanted | {KEY_TABLE[k] for k in KEYS if k in held}

class SameRunTwice(ValueError):
    """One run directory given twice (its rows would count twice)."""


def distinct(paths: Sequence[str]) -> list[str]:
    """``paths``, refusing one directory given twice (by its real path)."""
    seen: dict[str, str] = {}
    for p in paths:
        real = os.path.realpath(p)
        if real in seen:
            raise SameRunTwice(f"{p}: the same run directory as {seen[real]}; give each run once")
        seen[real] = p
    return list(paths)


def combine(paths: Sequence[str], parts: Sequence[dict[str, pa.Table]],
            wanted: set[str] | None = None) -> dict[str, pa.Table]:
    """The tables of the runs ``paths`` (``parts``: each one's tables, in order) as one set,
    with ``runs`` when ``wanted`` (None: every table) holds it."""
    if len(parts) == 1:  # run 0, ids from 0: as made (a table kept as a dataset stays unread)
        made = dict(parts[0])
    else:
        out: dict[str, list[pa.Table]] = {}
        offset = dict.fromkeys(KEYS, 0)
        for run, tables in enumerate(parts):
            tables = {name: cache.materialize(t) for name, t in tables.items()}
            for name, t in tables.items():
                out.setdefault(name, []).append(_renumbered(t, run, offset))
            for key in KEYS:
                offset[key] += _span_of(tables, key)
        made = {name: pa.concat_tables(ts) for name, ts in out.items()}
    if wanted is None or "runs" in wanted:
        made["runs"] = arrow_table("runs", {"run": np.arange(len(paths), dtype=np.int32),
                                            "path": list(paths), "run_id": [_run_id(p) for p in paths]})
    return {n: made[n] for n in TABLES if n in made}


def _renumbered(t: pa.Table, run: int, offset: dict[str, int]) -> pa.Table:
    t = t.set_column(t.schema.get_field_index("run"), "run", pa.array(np.full(t.num_rows, run, np.int32)))
    for key in KEYS:
        i = t.schema.get_field_index(key)
        if i >= 0 and offset[key]:
            t = t.set_column(i, key, pc.add(t.column(key), pa.scalar(offset[key], pa.int64())))
    return t


def _span_of(tables: dict[str, pa.Table], key: str) -> int:
    """How many ids of ``key`` one run's tables use: its largest + 1 (0 where none)."""
    top = [pc.max(t.column(key)).as_py() for t in tables.values() if key in t.column_names and t.num_rows]
    return max([v + 1 for v in top if v is not None], default=0)


def _run_id(path: str) -> str:
    return runfiles_read.run_id(path) or os.path.basename(os.path.normpath(path))
