"""The two culprit rankings (intervals.top_others_reference, numpy, and its compiled twin
omnitrace/_intervalsc.c) give the same rows in the same order, with the same dtypes, on
random inputs of many shapes: no tasks or no waits, one owner, ties in total overlap,
waits of the tasks' own owner, zero-length tasks and overlaps, waits spanning thousands
of tasks of thousands of owners, k from 0 to beyond any wait's owners. And where the
compiled ranking is built, top_others uses it."""
from __future__ import annotations

import importlib.machinery
from pathlib import Path

import numpy as np
import pytest

from omnitrace import intervals, record
from omnitrace.rules import walk

built = pytest.mark.skipif(intervals._intervalsc is None, reason="built without a C compiler")

KS = (0, 1, 2, 3, 5, 17, 1000)


def tasks(rng: np.random.Generator, n: int, span: int, owners: np.ndarray, dtype
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` disjoint tasks sorted by start in [0, span) (some touching, some 0 ns long),
    owners drawn from ``owners``."""
    edges = np.sort(rng.integers(0, span, 2 * n))
    return edges[0::2].copy(), edges[1::2].copy(), rng.choice(owners, n).astype(dtype)


def unit_tasks(rng: np.random.Generator, n: int, owners: np.ndarray, dtype
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` back-to-back 1 ns tasks: owners' totals tie whenever their counts do."""
    t = np.arange(n, dtype=np.int64)
    return t, t + 1, rng.choice(owners, n).astype(dtype)


def waits(rng: np.random.Generator, n: int, span: int, width: int, owners: np.ndarray, dtype
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` waits starting anywhere around [0, span), up to ``width`` long (some empty);
    owners drawn from ``owners`` and one that owns no task."""
    q0 = rng.integers(-5, span + 5, n)
    q1 = q0 + rng.integers(0, width + 1, n)
    return q0, q1, rng.choice(np.append(owners, owners.max() + 1), n).astype(dtype)


def owner_set(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` distinct owners: small ids, or ones spread wide (multiples of 2**20: the hash
    table must still tell them apart)."""
    ids = np.arange(1, n + 1, dtype=np.int64)
    return ids << 20 if rng.random() < 0.3 else ids


def shape(seed: int):
    """One random input: tasks, waits, and the shape they were drawn in."""
    rng = np.random.default_rng(seed)
    kind = ["small", "one owner", "ties", "wide", "deep"][seed % 5]
    dtype = np.uint32 if seed % 2 else np.int64
    n_owners = {"one owner": 1, "ties": int(rng.integers(2, 6)), "wide": 3000}.get(kind, int(rng.integers(1, 8)))
    own = owner_set(rng, n_owners)
    n = int(rng.integers(0, 15)) if kind == "small" else int(rng.integers(200, 5000))
    if kind == "ties":
        s, e, o = unit_tasks(rng, n, own, dtype)
        span = n
    else:
        span = 60 if kind == "small" else 40 * n
        s, e, o = tasks(rng, n, span, own, dtype)
    width = {"small": 70, "ties": 40}.get(kind, span)
    nq = int(rng.integers(0, 12)) if kind == "small" else int(rng.integers(1, 300))
    return kind, (s, e, o, *waits(rng, nq, span, width, own, dtype))


def assert_same(got, want, *label):
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype, label
        assert g.tolist() == w.tolist(), label


@built
@pytest.mark.parametrize("seed", range(80))
def test_compiled_ranks_as_the_reference(seed):
    kind, args = shape(seed)
    for k in KS:
        want = intervals.top_others_reference(*args, k)
        assert_same(intervals._top_others_compiled(*args, k), want, kind, k)


@built
def test_compiled_on_a_wait_with_every_task():
    """One wait over 20,000 tasks of 20,000 owners, several k (sorted, not inserted, past 16)."""
    rng = np.random.default_rng(5)
    s, e, o = tasks(rng, 20_000, 10**9, np.arange(20_000), np.int64)
    q = np.array([-1]), np.array([10**9]), np.array([7])
    for k in (3, 16, 17, 25_000):
        assert_same(intervals._top_others_compiled(s, e, o, *q, k), intervals.top_others_reference(s, e, o, *q, k))


@built
def test_compiled_refuses_bad_buffers():
    z = np.zeros(2, np.int64)
    out = np.zeros(4, np.int64)
    with pytest.raises(TypeError):
        intervals._intervalsc.rank(z.astype(np.int32), z, z, z, z, z, z, z, 3, out, out, out)
    with pytest.raises(IndexError):
        intervals._intervalsc.rank(z, z, z, z, z, z, z, z + 5, 3, out, out, out)
    with pytest.raises(ValueError):
        intervals._intervalsc.rank(z, z, z, z, z, z, z, z + 2, 3, out[:1], out, out)


@built
def test_top_others_uses_the_compiled_ranking(monkeypatch):
    calls = []
    real = intervals._intervalsc

    class Spy:
        def rank(self, *args):
            calls.append(args)
            return real.rank(*args)

    monkeypatch.setattr(intervals, "_intervalsc", Spy())
    s, e, o = np.array([0, 10]), np.array([10, 20]), np.array([2, 3])
    assert [c.tolist() for c in intervals.top_others(s, e, o, np.array([5]), np.array([15]),
                                                     np.array([1]), 3)] == [[0, 0], [2, 3], [0, 1]]
    assert len(calls) == 1


def test_a_built_ranking_imports():
    """The compiled ranking is missing only where nothing was compiled: an extension file
    beside intervals.py that fails to import, or the ring writer built without it (its
    compile failed; setup.py's optional=True lets the install go on), is a broken build,
    mended by `pip install -e .` or `python setup.py build_ext --inplace`."""
    here = Path(intervals.__file__).parent
    files = [p for suffix in importlib.machinery.EXTENSION_SUFFIXES for p in here.glob("_intervalsc" + suffix)]
    if files or record._ringc is not None:  # and every kernel is there (not a stale build)
        assert intervals._intervalsc is not None and walk._intervalsc is not None, files


def blocked_pieces(seed: int) -> tuple[tuple[np.ndarray, ...], int]:
    """Random head-of-line pieces: victims without any, culprits with several pieces
    (nested, touching, repeated, zero-length), tasks shared by pieces, times tied and far
    apart; or none at all."""
    rng = np.random.default_rng(seed)
    victims = int(rng.integers(1, 40))
    n = 0 if seed % 7 == 0 else int(rng.integers(1, 3000))
    span = int(rng.choice([20, 1000, 10**12]))
    start = rng.integers(0, span, n)
    end = start + rng.integers(0, max(span // 10, 2), n) * (rng.random(n) > 0.05)  # some 0 long
    vi = rng.integers(0, victims, n)
    culprit = rng.choice(owner_set(rng, int(rng.integers(1, 30))), n)
    sender = rng.integers(0, 3, n)
    task = rng.integers(0, 1 + n // 4, n)
    dtype = np.uint32 if seed % 2 else np.int64  # the span builder's request ids are uint32
    return (vi, culprit.astype(dtype), start, end, sender, task), victims


@built
@pytest.mark.parametrize("seed", range(60))
def test_compiled_pair_figures_are_the_reference_bit_for_bit(seed):
    """Shares are floats summed along one running integral: equal bit for bit, not close."""
    args, victims = blocked_pieces(seed)
    want = intervals.pair_figures_reference(*args, victims)
    got = intervals.pair_figures(*args, victims)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes(), seed


@built
def test_compiled_pair_figures_refuse_bad_buffers():
    z, f = np.zeros(2, np.int64), np.zeros(2)
    with pytest.raises(TypeError):
        intervals._intervalsc.pairs(z, z, z, z, z, z, z, z, z, z, f, z, z)  # wall must be float64
    with pytest.raises(IndexError):
        intervals._intervalsc.pairs(z + 2, z, z, z, z, z, f, z, z, z, f, z, z)
    with pytest.raises(ValueError):
        intervals._intervalsc.pairs(z, z, z, z, z, z, f, z, z[:1], z, f, z, z)


@built
@pytest.mark.parametrize("seed", range(60))
def test_compiled_pieces_are_the_reference(seed):
    """other_pieces, compiled, gives the numpy pieces (same rows, order and dtypes)."""
    kind, (s, e, o, q0, q1, qo) = shape(seed)
    want = intervals._pieces_in(s, e, o, q0, q1, qo, *intervals._candidates(s, e, q0, q1))
    assert_same(intervals.other_pieces(s, e, o, q0, q1, qo), want, kind)
    # the waits' owners as int64 against uint32 tasks' (the head-of-line rule's mix)
    qo = qo.astype(np.int64)
    want = intervals._pieces_in(s, e, o, q0, q1, qo, *intervals._candidates(s, e, q0, q1))
    assert_same(intervals.other_pieces(s, e, o, q0, q1, qo), want, kind)


@built
def test_compiled_pieces_refuse_bad_buffers():
    z = np.zeros(2, np.int64)
    out = np.zeros(4, np.int64)
    with pytest.raises(TypeError):
        intervals._intervalsc.pieces(z.astype(np.int32), z, z, z, z, z, z, z, out, out, out, out)
    with pytest.raises(IndexError):
        intervals._intervalsc.pieces(z, z, z, z, z, z, z, z + 5, out, out, out, out)
    with pytest.raises(ValueError):
        intervals._intervalsc.pieces(z, z, z, z, z, z, z, z + 2, out[:1], out, out, out)


def test_pieces_of_floats_stay_numpy():
    """Times that are not integers (or uint64) never reach the int64 kernel."""
    s, e, o = np.array([0.5, 2.0]), np.array([1.5, 3.0]), np.array([1, 2])
    got = intervals.other_pieces(s, e, o, np.array([0.0]), np.array([2.5]), np.array([3]))
    assert [c.tolist() for c in got] == [[0, 0], [0, 1], [0.5, 2.0], [1.5, 2.5]]


def overlap_numpy(monkeypatch, *args):
    """other_overlap with the compiled kernels switched off: the prefix sums alone."""
    with monkeypatch.context() as m:
        m.setattr(intervals, "_intervalsc", None)
        return intervals.other_overlap(*args)


@built
@pytest.mark.parametrize("seed", range(60))
def test_compiled_overlap_is_the_prefix_sums(seed, monkeypatch):
    """Disjoint tasks (touching, 0 ns long, ties in total): the compiled sums; tasks that
    overlap or waits that end before they start: the prefix sums' answer, as before."""
    kind, (s, e, o, q0, q1, qo) = shape(seed)
    for args in ((s, e, o, q0, q1, qo), (s, e, o, q0, q1, qo.astype(np.int64))):
        got, want = intervals.other_overlap(*args), overlap_numpy(monkeypatch, *args)
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), kind
    if len(s) > 2:  # not disjoint: one task runs into the next
        e2 = e.copy()
        e2[len(e2) // 2] = s[-1] + 3
        args = (s, e2, o, q0, q1, qo)
        assert intervals.other_overlap(*args).tolist() == overlap_numpy(monkeypatch, *args).tolist()
    if len(q0):  # a wait ending before it starts
        args = (s, e, o, q1, q0, qo)
        assert intervals.other_overlap(*args).tolist() == overlap_numpy(monkeypatch, *args).tolist()


def overlap_walk(s, e, o, q0, q1, qo, lo, hi):
    """The overlap kernel's rule, one candidate at a time: query i's summed overlap with
    the intervals [lo[i], hi[i]) of other owners."""
    out = []
    for a0, b0, me, i, j in zip(q0.tolist(), q1.tolist(), qo.tolist(), lo.tolist(), hi.tolist()):
        out.append(sum(max(min(e[k], b0) - max(s[k], a0), 0) for k in range(i, j) if o[k] != me))
    return out


@built
@pytest.mark.parametrize("seed", range(40))
def test_compiled_overlap_any_range(seed):
    """Any [lo, hi) of the intervals, not only each query's candidates (clipped tasks at
    both ends, tasks wholly outside the wait, the own owner's anywhere, owners near or far
    apart, a query owner with no task), and times near int64's ends: the prefix sums
    inside match the walk."""
    rng = np.random.default_rng(seed)
    n, nq = int(rng.integers(0, 40)), int(rng.integers(1, 30))
    gaps = rng.integers(0, 4, 2 * n)  # 0: touching tasks and 0 ns tasks
    edges = np.cumsum(gaps) + (np.int64(1) << 62 if seed % 4 == 0 else 0)
    s, e = np.ascontiguousarray(edges[0::2]), np.ascontiguousarray(edges[1::2])
    wide = 10 ** 12 if seed % 3 == 1 else 1  # owners far apart: sorted, not counted
    o = rng.integers(0, 3, n) * wide
    top = int(edges[-1]) + 3 if n else 10
    base = int(edges[0]) - 3 if n else 0
    q0 = rng.integers(base, top, nq)
    q1 = q0 + rng.integers(0, top - base, nq)
    qo = rng.integers(0, 4, nq) * wide
    lo = rng.integers(0, n + 1, nq)
    hi = np.minimum(lo + rng.integers(-2, n + 2, nq), n)
    out = np.full(nq, -7, np.int64)
    assert intervals._intervalsc.overlap(s, e, o, q0, q1, qo, lo, hi, out) is True
    assert out.tolist() == overlap_walk(s.tolist(), e.tolist(), o.tolist(), q0, q1, qo, lo, hi)


@built
def test_compiled_overlap_refuses_bad_buffers():
    z = np.zeros(2, np.int64)
    with pytest.raises(TypeError):
        intervals._intervalsc.overlap(z.astype(np.int32), z, z, z, z, z, z, z, z.copy())
    with pytest.raises(ValueError):  # [lo, hi) past the intervals
        intervals._intervalsc.overlap(z, z, z, z, z, z, z, z + 5, z.copy())
    with pytest.raises(ValueError):  # q1 < q0
        intervals._intervalsc.overlap(z, z, z, z + 1, z, z, z, z, z.copy())
    assert intervals._intervalsc.overlap(z, z + 1, z, z, z, z, z, z, z.copy()) is False  # not disjoint
