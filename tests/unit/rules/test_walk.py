"""The batch walk's compact keys (omnitrace.rules.walk): a batch they cannot hold is walked
by the reference. The batch walk against the reference on a real run:
tests/system/rules/test_walk.py."""
from __future__ import annotations

import numpy as np
import pytest

from omnitrace import spantable as stt
from omnitrace.rules import walk


def test_a_batch_beyond_the_compact_keys_is_walked_by_the_reference():
    rows = np.zeros(2, stt.CHUNK_DTYPE)
    assert walk.fits(rows)
    rows["stage"][1] = 300
    assert not walk.fits(rows)
    rows["stage"][1], rows["chunk"][0] = 0, -2
    assert not walk.fits(rows)


def _random_index(seed: int) -> tuple[walk._Latest, np.ndarray, np.ndarray]:
    """A latest-span index of random spans (groups of one and of hundreds, ends tied within
    and across groups, rows in table order) and queries: codes with and without a group,
    times before, at, between and after the ends."""
    rng = np.random.default_rng(seed)
    n = 0 if seed % 9 == 0 else int(rng.integers(1, 2000))
    groups = int(rng.integers(1, 60))
    code = rng.integers(0, groups, n) * (1 << 40) - (1 << 20)  # far apart, some negative
    end = rng.integers(0, int(rng.choice([3, 50, 10**12])), n)
    index = walk._Latest(code, end, np.arange(n) * 3)
    nq = int(rng.integers(0, 500))
    q = rng.integers(-1, groups + 2, nq) * (1 << 40) - (1 << 20)
    t = rng.choice(np.concatenate((end, [-1, 0, 10**13])), nq) + rng.integers(-1, 2, nq)
    return index, q, t


@pytest.mark.skipif(walk._intervalsc is None, reason="built without a C compiler")
@pytest.mark.parametrize("seed", range(40))
def test_compiled_latest_is_the_reference(seed):
    index, q, t = _random_index(seed)
    for fallback in (False, True):
        got, want = index.by(q, t, fallback), index.by_reference(q, t, fallback)
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), fallback


@pytest.mark.skipif(walk._intervalsc is None, reason="built without a C compiler")
def test_compiled_latest_refuses_bad_groups():
    z = np.zeros(2, np.int64)
    with pytest.raises(ValueError):  # lo past the rows
        walk._intervalsc.latest(z[:1], np.array([0, 5]), z, z, z, z, True, z.copy())
    with pytest.raises(TypeError):
        walk._intervalsc.latest(z[:1], np.array([0, 2]), z.astype(np.int32), z, z, z, True, z.copy())


@pytest.mark.parametrize("seed", range(30))
def test_sort_by_code_then_end_is_lexsort(seed):
    """Groups in time order, groups out of it, ties of end within a group (table order kept)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    code = rng.integers(0, int(rng.integers(1, 400)), n) << 33
    end = np.sort(rng.integers(0, 50, n)) if seed % 3 == 0 else rng.integers(0, int(rng.choice([3, 10**9])), n)
    assert walk._by_code_then_end(code, end).tolist() == np.lexsort((end, code)).tolist()


def test_codes_both_ways_are_two_codes():
    rng = np.random.default_rng(3)
    req, a, b = rng.integers(0, 1 << 16, 500), rng.integers(-1, 255, 500), rng.integers(-1, 255, 500)
    chunk = rng.integers(-1, (1 << 31) - 1, 500)
    p, c = walk._codes_both_ways(req, a, b, chunk)
    assert p.tolist() == walk._code(req, a, b, chunk).tolist()
    assert c.tolist() == walk._code(req, b, a, chunk).tolist()
