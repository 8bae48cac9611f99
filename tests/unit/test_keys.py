"""The one key module's lookup (omnitrace.keys.lookup) against a dict, over random sorted
keys and queries with and without a match, empty either side, and every dtype the
callers pass (times, row numbers, flags). Packing: tests/unit/tables/test_run.py."""
from __future__ import annotations

import numpy as np
import pytest

from omnitrace import keys


@pytest.mark.parametrize("seed", range(30))
def test_lookup_is_a_dict_lookup(seed):
    rng = np.random.default_rng(seed)
    have = np.unique(rng.integers(-50, 50, int(rng.integers(0, 40))))
    values = rng.integers(-(1 << 40), 1 << 40, len(have))
    if seed % 3 == 1:
        values = values > 0  # flags
    query = rng.integers(-60, 60, int(rng.integers(0, 80)))
    missing = False if values.dtype == bool else -7
    got = keys.lookup(have, query, values, missing)
    want = dict(zip(have.tolist(), values.tolist()))
    assert got.tolist() == [want.get(q, missing) for q in query.tolist()]
    assert got.dtype == values.dtype
