"""W3C `traceparent` (omnitrace.tracecontext) in process: what is parsed and refused, and
ids that round-trip. A request that carries one joins the caller's trace, live and in
`omnitrace export`: tests/system/agent/test_tracecontext.py."""
from __future__ import annotations

import random

import pytest

from omnitrace import tracecontext as tc
from tests.support.traceparent import PARENT, TRACE


@pytest.mark.parametrize("value,ok", [
    (f"00-{TRACE}-{PARENT}-01", True),
    (f"00-{TRACE.upper()}-{PARENT}-00", True),  # case-insensitive on the way in
    (f"01-{TRACE}-{PARENT}-01-future", True),  # a later version may append fields
    (f"00-{TRACE}-{PARENT}-01-extra", False),  # version 00 may not
    (f"ff-{TRACE}-{PARENT}-01", False),
    (f"00-{'0' * 32}-{PARENT}-01", False),
    (f"00-{TRACE}-{'0' * 16}-01", False),
    (f"00-{TRACE[:-1]}-{PARENT}-01", False),
    ("", False), (None, False), ("garbage", False)])
def test_parse_traceparent(value, ok):
    got = tc.parse_traceparent(value)
    assert (got is not None) == ok
    if ok:
        assert got[:2] == (int(TRACE, 16), int(PARENT, 16))
def test_encoding_round_trips():
    rng = random.Random(7)
    for trace, parent in [(1, 1), ((1 << 128) - 1, (1 << 64) - 1), (1 << 127, 1 << 63)] + \
            [(rng.getrandbits(128) or 1, rng.getrandbits(64) or 1) for _ in range(500)]:
        (ha, hc, hb), (la, lc, lb) = tc.encode(trace, parent)
        for v, bits in ((ha, 64), (la, 64), (lc, 32), (lb, 32)):
            assert -(1 << (bits - 1)) <= v < 1 << (bits - 1)  # fits the record's signed fields
        assert tc.decode(ha, la, lc, lb) == (trace, parent)
