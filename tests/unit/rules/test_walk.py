"""The batch walk's compact keys (omnitrace.rules.walk): a batch they cannot hold is walked
by the reference. The batch walk against the reference on a real run:
tests/system/rules/test_walk.py."""
from __future__ import annotations

import numpy as np

from omnitrace import spantable as stt
from omnitrace.rules import walk


def test_a_batch_beyond_the_compact_keys_is_walked_by_the_reference():
    rows = np.zeros(2, stt.SPAN_DTYPE)
    assert walk.fits(rows)
    rows["stage"][1] = 300
    assert not walk.fits(rows)
    rows["stage"][1], rows["chunk"][0] = 0, -2
    assert not walk.fits(rows)
