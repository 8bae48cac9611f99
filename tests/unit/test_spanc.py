"""The span load's compiled row passes (omnitrace/_spanc.c) write the same bytes as their
numpy references on random inputs: the chunk span rows (SpanBuilder.chunk_rows_reference)
and the report tables' split of a feed (analyze.tables.split_reference), every name,
reason, warm-up flag and first-packet cut; out-of-range input is refused, not read; the
golden report is the same with the references; and where anything was compiled, the
module is built and its row layouts are the dtypes'."""
from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

import numpy as np
import pytest

from omnitrace import record, rowops
from omnitrace import spantable as stt
from omnitrace.analyze import tables
from omnitrace.eventlog import EVENT_DTYPE

built = pytest.mark.skipif(stt._spanc is None, reason="built without a C compiler")


def random_rows(rng: np.random.Generator, n: int, dtype: np.dtype) -> np.ndarray:
    """``n`` rows of ``dtype`` with random bytes in every field."""
    return rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)


def events(rng: np.random.Generator, n: int, rings: int) -> np.ndarray:
    ev = random_rows(rng, n, EVENT_DTYPE)
    ev["ring"] = rng.integers(0, rings, n)
    return ev


@built
@pytest.mark.parametrize("seed", range(6))
def test_compiled_chunk_rows_are_the_reference(seed):
    rng = np.random.default_rng(seed)
    builder = stt.SpanBuilder()
    rings = int(rng.integers(1, 40))
    builder._replicas = rng.integers(-(1 << 40), 1 << 40, rings)
    nb, ne = (int(x) for x in rng.integers(1, 3000, 2))
    B, En = events(rng, nb, rings), events(rng, ne, rings)
    n = int(rng.integers(0, 2 * min(nb, ne)))
    bi, ei = rng.integers(0, nb, n), rng.integers(0, ne, n)
    for name, _, _ in stt._PAIRS:
        want = builder.chunk_rows_reference(name, rowops.take(B, bi), rowops.take(En, ei))
        got = random_rows(rng, n, stt.CHUNK_DTYPE).copy()  # every byte must be written
        stt._spanc.chunk_spans(B, bi, En, ei, builder._replicas, name, stt._FIGURE_FROM.get(name, 2), got)
        assert got.tobytes() == want.tobytes(), name


@built
@pytest.mark.parametrize("seed", range(4))
def test_compiled_poll_rows_are_the_reference(seed):
    rng = np.random.default_rng(50 + seed)
    builder = stt.SpanBuilder()
    builder._replicas = rng.integers(-(1 << 40), 1 << 40, 7)
    P, G = events(rng, 500, 7), events(rng, 800, 7)
    pi, gi = rng.integers(0, 500, 600), rng.integers(0, 800, 600)
    want = builder.poll_rows_reference(rowops.take(P, pi), rowops.take(G, gi))
    got = random_rows(rng, 600, stt.CHUNK_DTYPE).copy()
    stt._spanc.chunk_spans(P, pi, G, gi, builder._replicas, stt.N_POLL, stt._POLL_ROWS, got)
    assert got.tobytes() == want.tobytes()


@built
@pytest.mark.parametrize("seed", range(4))
def test_compiled_keys_are_the_reference(seed):
    ev = events(np.random.default_rng(60 + seed), 3000, 5)  # any stage, b, chunk: negative too
    for field in ("stage", "b"):
        assert stt._event_keys(ev, field).tolist() == stt._key(ev["req"], ev[field], ev["chunk"]).tolist()


def stamps(rng: np.random.Generator, n: int, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` stamps of ``keys`` distinct keys (repeats, ties in time, times out of order)."""
    return rng.integers(0, keys, n) * 1000003, rng.integers(0, max(2, n // 3), n)


@built
@pytest.mark.parametrize("seed", range(12))
def test_compiled_pairing_is_the_reference(seed, monkeypatch):
    rng = np.random.default_rng(70 + seed)
    keys = int(rng.choice([3, 50, 10000]))  # few keys: repeats; many: mostly each once
    (bk, bt), (ek, et) = stamps(rng, int(rng.integers(0, 2000)), keys), stamps(rng, int(rng.integers(0, 2000)), keys)
    got = stt.match(bk, bt, ek, et)
    monkeypatch.setattr(stt, "_spanc", None)
    want = stt.match(bk, bt, ek, et)
    assert [a.tolist() for a in got] == [a.tolist() for a in want]


def random_spans(rng: np.random.Generator, n: int, reqs: int) -> np.ndarray:
    spans = random_rows(rng, n, stt.CHUNK_DTYPE).copy()
    spans["name"] = rng.integers(stt.N_SNAPSHOT, len(stt.NAMES), n)
    spans["reason"] = np.where(rng.random(n) < 0.7, 0, rng.integers(1, len(stt.REASONS), n))
    spans["req"] = rng.integers(0, reqs, n)
    spans["start"] = rng.integers(-5, 50, n)
    return spans


def split_inputs(rng: np.random.Generator, reqs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    skip = rng.random(reqs) < rng.random()
    first_audio = np.where(rng.random(reqs) < 0.3, 0, rng.integers(-1, 50, reqs))
    first_start = np.where(rng.random(reqs) < 0.5, tables._NONE, rng.integers(-10, 60, reqs))
    return skip, first_audio, first_start


@built
@pytest.mark.parametrize("seed", range(8))
def test_compiled_split_is_the_reference(seed):
    rng = np.random.default_rng(100 + seed)
    reqs = int(rng.integers(1, 300))
    n = int(rng.integers(0, 5000))
    spans = random_spans(rng, n, reqs)
    skip, first_audio, first_start = split_inputs(rng, reqs)
    want_first, got_first = first_start.copy(), first_start.copy()
    *want, want_skipped = tables.split_reference(spans, skip, first_audio, want_first)
    dtypes = (tables.EARLY_DTYPE, tables.SNAPSHOT_DTYPE, tables.FIFO_DTYPE, tables.TRANSFER_DTYPE,
              tables.INCOMPLETE_DTYPE)
    outs = [np.zeros(n, d) for d in dtypes]
    *counts, skipped = stt._spanc.report_split(spans, skip, first_audio, got_first, *outs)
    assert skipped == want_skipped
    assert got_first.tolist() == want_first.tolist()
    for w, o, k in zip(want, outs, counts):
        assert o[:k].tobytes() == w.tobytes(), o.dtype


@built
def test_compiled_passes_refuse_bad_input():
    rng = np.random.default_rng(7)
    B = events(rng, 10, 3)
    out = np.zeros(4, stt.CHUNK_DTYPE)
    reps = np.zeros(3, np.int64)
    B["ring"][0] = 2
    with pytest.raises(IndexError):  # an index past the events
        stt._spanc.chunk_spans(B, np.array([0, 10]), B, np.array([0, 1]), reps, stt.N_PUT, 2, out)
    with pytest.raises(IndexError):  # a ring past the replicas
        stt._spanc.chunk_spans(B, np.array([0]), B, np.array([0]), reps[:2], stt.N_PUT, 2, out)
    with pytest.raises(ValueError):  # short output
        stt._spanc.chunk_spans(B, np.arange(5), B, np.arange(5), reps, stt.N_PUT, 2, out)
    spans = random_spans(rng, 4, 5)
    skip, fa, first = split_inputs(rng, 4)
    outs = [np.zeros(4, d) for d in (tables.EARLY_DTYPE, tables.SNAPSHOT_DTYPE, tables.FIFO_DTYPE,
                                     tables.TRANSFER_DTYPE, tables.INCOMPLETE_DTYPE)]
    spans["req"] = 4  # past the flags
    with pytest.raises(IndexError):
        stt._spanc.report_split(spans, skip, fa, first, *outs)
    spans["req"] = 0
    with pytest.raises(ValueError):
        stt._spanc.report_split(spans, skip, fa, first, *outs[:-1], outs[-1][:3])


def test_the_references_give_the_golden_report(synthetic_run, monkeypatch):
    """The numpy passes (a build without a compiler) make the same report."""
    from tests.support import golden_inputs as gi
    monkeypatch.setattr(stt, "_spanc", None)
    monkeypatch.setattr(tables, "_spanc", None)
    parent, name = os.path.split(synthetic_run)
    with open(os.path.join(gi.REPORTS, "synthetic.json"), "rb") as f:
        assert gi.report_json(parent, name) == f.read()


def test_a_built_span_pass_imports():
    """The compiled passes are missing only where nothing was compiled (see
    test_intervals_paths.test_a_built_ranking_imports), and its layouts are the dtypes'."""
    here = Path(stt.__file__).parent
    files = [p for suffix in importlib.machinery.EXTENSION_SUFFIXES for p in here.glob("_spanc" + suffix)]
    if files or record._ringc is not None:
        assert stt._spanc is not None and tables._spanc is not None, files


def test_early_rows_are_chunk_span_rows_narrowed():
    """What the report keeps of an early chunk span gives the whole row back: its other
    columns are unread (ring) or 0 in the report's rows (no culprits)."""
    rows = random_spans(np.random.default_rng(3), 500, 50)
    for col in ("ring", "by0", "by1", "by2"):
        rows[col] = 0
    early = tables.early_rows(rows)
    assert early.dtype.itemsize == 48
    assert tables.as_chunk_rows(early).tobytes() == rows.tobytes()
    assert tables.as_chunk_rows(rows) is rows


def test_row_operations_on_any_row_type():
    """rowops' opaque-row view over the rows' buffer, and a view where the buffer protocol
    cannot name a field's type (datetime64): the same rows either way."""
    for dtype in (stt.CHUNK_DTYPE, np.dtype([("t", "M8[ns]"), ("x", "<i4")])):
        rows = random_rows(np.random.default_rng(9), 40, dtype)
        idx = np.array([5, 0, 39, 5])
        assert rowops.take(rows, idx).tobytes() == b"".join(rows[i:i + 1].tobytes() for i in idx)
        mask = np.arange(40) % 3 == 0
        assert rowops.select(rows[1:], mask[1:]).tobytes() == rows[1:][mask[1:]].tobytes()
        assert rowops.concat((rows[:3], rows[10:12]), dtype).tobytes() == rows[[0, 1, 2, 10, 11]].tobytes()
        grow = rowops.Growing(dtype)
        grow.append(rows[:7])
        grow.spare(5)[:2] = rows[20:22]
        grow.added(2)
        assert grow.view().tobytes() == rows[[0, 1, 2, 3, 4, 5, 6, 20, 21]].tobytes()


@pytest.mark.skipif(stt._spanc is None, reason="built without a C compiler")
def test_a_compiled_module_with_other_codes_is_refused():
    """rowops.compiled uses a module only where its built-in codes are Python's: a span name
    numbered otherwise (or one it does not name) and the numpy reference runs instead."""
    assert rowops.compiled("_spanc", dict(N_FIFO=stt.N_FIFO), S=stt.CHUNK_DTYPE) is stt._spanc
    assert rowops.compiled("_spanc", dict(N_FIFO=stt.N_FIFO + 1), S=stt.CHUNK_DTYPE) is None
    assert rowops.compiled("_spanc", dict(N_NONE=0), S=stt.CHUNK_DTYPE) is None
    assert tables._spanc is stt._spanc  # the report's split: its codes agree
