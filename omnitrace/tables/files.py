"""The tables written out: one Parquet file per table, or a Perfetto trace of the run."""
from __future__ import annotations

import os
from typing import Any

import pyarrow.parquet as pq

from omnitrace.tables import cache, perfetto
from omnitrace.tables import run as tables_run


def write_parquet(tables: dict[str, Any], out_dir: str) -> list[str]:
    """Each table (Arrow, or a dataset ``tables.cache`` kept) as ``out_dir/NAME.parquet``
    (the directory made if missing; each file replaced whole, never left half-written).
    Returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, t in tables.items():
        path = os.path.join(out_dir, f"{name}.parquet")
        pq.write_table(cache.materialize(t), path + ".tmp")
        os.replace(path + ".tmp", path)
        paths.append(path)
    return paths


def write_perfetto(run_dir: str, path: str, samples: Any = None) -> tuple[tables_run.RunTables, dict[str, int]]:
    """``run_dir``'s timeline as a Perfetto trace at ``path`` (``samples``: its py-spy
    samples, a ``profile.store.Store``, or None). Returns the tables read and the slices
    written per name."""
    rt = tables_run.load(run_dir, perfetto.TABLES_READ)
    with open(path + ".tmp", "wb") as f:
        counts = perfetto.write(f, rt.tables, samples)
    os.replace(path + ".tmp", path)
    return rt, counts
