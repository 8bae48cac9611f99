"""A run's tables kept beside it (``RUN/.table-cache/``: ``NAME.parquet`` and
``manifest.json``), so that the second question asked of a long run is answered in
seconds: an hour's run (~150M events) takes tens of seconds or more to load, its tables
read back in one or two (``benchmarks/RESULTS.md``).

A table is kept only when its load took :data:`MIN_LOAD_S` or longer (a short run loads
faster than the cache pays for itself, and the files would only clutter its directory),
never while the run is still recording, and used only while fresh: the manifest holds
the fingerprint of what the tables were made from -- every file of the run they read
(size and mtime) and omnitrace's own code (a digest of its modules: a fix changes the
answers) -- and a fingerprint that differs discards them all. Writes are atomic (a
temporary file renamed) and best effort: a read-only directory or a full disk leaves the
answer as it was, only not kept.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from omnitrace import eventlog
from omnitrace.runfiles import names, read
from omnitrace.tables.schema import TABLES

MIN_LOAD_S = 5.0
MANIFEST = "manifest.json"
# the run's files the tables are made from (with the event log's segments)
SOURCES = (names.RUN, names.AGENT, names.BENCH, names.PROCESSES)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_code_digest: str | None = None


def code_digest() -> str:
    """A digest of omnitrace's modules (their bytes): tables made by other code differ."""
    global _code_digest
    if _code_digest is None:
        h = hashlib.blake2b(digest_size=16)
        for root, dirs, files in os.walk(_PACKAGE):
            dirs.sort()
            for f in sorted(files):
                if f.endswith((".py", ".c")):
                    path = os.path.join(root, f)
                    h.update(os.path.relpath(path, _PACKAGE).encode())
                    with open(path, "rb") as fh:
                        h.update(fh.read())
        _code_digest = h.hexdigest()
    return _code_digest


def fingerprint(run_dir: str) -> dict[str, Any]:
    """What ``run_dir``'s tables are made from: each source file's [size, mtime ns] by name
    (absent files absent), and the code's digest."""
    files = {}
    for path in [names.path(run_dir, n) for n in SOURCES] + eventlog.segments(run_dir):
        try:
            st = os.stat(path)
        except OSError:
            continue
        files[os.path.relpath(path, run_dir)] = [st.st_size, st.st_mtime_ns]
    return {"code": code_digest(), "files": files}


def _dir(run_dir: str) -> str:
    return names.path(run_dir, names.TABLE_CACHE)


def _manifest(run_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(_dir(run_dir), MANIFEST), "rb") as f:
            doc = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("tables"), list) else None


def read_fresh(run_dir: str, wanted: set[str]) -> tuple[dict[str, pads.Dataset], list[str]]:
    """The tables of ``wanted`` kept for ``run_dir`` and still fresh, as Parquet datasets
    (``materialize`` makes one a table; those absent, stale or unreadable are not in the
    answer: the caller makes them), and the notes kept with them."""
    doc = _manifest(run_dir)
    if doc is None or doc.get("fingerprint") != fingerprint(run_dir):
        return {}, []
    out = {}
    for name in wanted & set(doc["tables"]) & set(TABLES):
        try:  # opened, not read: DuckDB reads the columns and row groups a query needs
            t = pads.dataset(os.path.join(_dir(run_dir), f"{name}.parquet"), format="parquet")
        except (OSError, pa.ArrowException):
            continue
        if t.schema.equals(TABLES[name].schema()):
            out[name] = t
    return out, [str(n) for n in doc.get("notes", [])]


def materialize(t: pa.Table | pads.Dataset) -> pa.Table:
    """A table kept here (a dataset, read lazily) as an Arrow table; a table as it is."""
    return t.to_table() if isinstance(t, pads.Dataset) else t


def keep(run_dir: str, tables: dict[str, pa.Table], notes: list[str], load_s: float) -> bool:
    """Keep ``tables`` (made in ``load_s`` seconds) and ``notes`` (what the load said of the
    run) for the next load of ``run_dir``, where worth it and allowed; True if kept."""
    if load_s < MIN_LOAD_S or not tables or _recording(run_dir):
        return False
    fp = fingerprint(run_dir)
    d = _dir(run_dir)
    doc = _manifest(run_dir)
    kept = set(doc["tables"]) if doc is not None and doc.get("fingerprint") == fp else set()
    try:
        if doc is not None and not kept:  # stale: made from other files or code
            _forget(d, doc["tables"])
        os.makedirs(d, exist_ok=True)
        for name, t in tables.items():
            path = os.path.join(d, f"{name}.parquet")
            pq.write_table(t, f"{path}.{os.getpid()}.tmp")
            os.replace(f"{path}.{os.getpid()}.tmp", path)
            kept.add(name)
        tmp = os.path.join(d, f"{MANIFEST}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(orjson.dumps({"fingerprint": fp, "tables": sorted(kept), "notes": notes}))
        os.replace(tmp, os.path.join(d, MANIFEST))
    except OSError:
        return False
    finally:  # what Arrow's pool holds of the writes, back to the system (a report goes on)
        pa.default_memory_pool().release_unused()
    return True


def _forget(d: str, tables: list) -> None:
    """Remove the stale manifest first, then its tables (only files this module names)."""
    os.unlink(os.path.join(d, MANIFEST))
    for name in set(map(str, tables)) & set(TABLES):
        try:
            os.unlink(os.path.join(d, f"{name}.parquet"))
        except FileNotFoundError:
            pass


def _recording(run_dir: str) -> bool:
    """The run is still being recorded (its segments grow: the tables would be stale at once)."""
    try:
        doc = read.load_object(run_dir, names.RUN)
    except read.RunFileError:
        return False
    return doc is not None and doc.get("status") == "running"
