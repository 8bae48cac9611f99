"""The compiled request state (omnitrace/_reqc.c) gives what its rule does
(reqstate.RequestStates): two span builders, one on each, fed the same random streams
(every request and stage event kind, repeats, a schedule before its add, events after
the end, packets, API marks, trace contexts, statuses too wide for their field; some with
more requests and visits than the compiled pools start with) in random cuts, ticked as
the live agent ticks and flushed at the end with a writer dead, give the same rows in the
same order and the same lists beside them."""
from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

import numpy as np
import pytest

from omnitrace import conventions as cv
from omnitrace import record, reqstate
from omnitrace import spantable as stt
from omnitrace.eventlog import EVENT_DTYPE

built = pytest.mark.skipif(reqstate._reqc is None, reason="built without a C compiler")
E = cv.Ev
KINDS = [E.REQUEST_ARRIVE, E.REQUEST_DISPATCH, E.REQUEST_FIRST_TEXT, E.REQUEST_FIRST_AUDIO, E.REQUEST_END,
         E.REQUEST_PARSED, E.PACKET_RECEIVED, E.PACKET_RESUMED, E.REQUEST_TRACE_HI, E.REQUEST_TRACE_LO,
         E.STAGE_ADD, E.STAGE_SCHEDULE, E.STAGE_FINISH, E.STAGE_EMIT, E.SNAPSHOT_BEGIN]
RINGS = {i: {"pid": 100 + i, "replica": i % 2, "stage": i % 3} for i in range(4)}


def stream(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    big = seed % 10 == 9  # more requests and visits than the compiled pools start with
    n = 20000 if big else int(rng.choice([0, 1, 40, 400, 3000]))
    ev = np.zeros(n, EVENT_DTYPE)
    ev["t"] = np.sort(rng.integers(1, 5000, n))  # ties too
    ev["req"] = rng.integers(1, 5000 if big else [3, 30, 300][seed % 3], n)
    weights = np.array([3, 1, 2, 2, 3, 1, 1, 1, 1, 1, 4, 4, 4, 8, 2], float)
    ev["kind"] = rng.choice(np.array(KINDS, np.int64), n, p=weights / weights.sum())
    ev["stage"] = rng.integers(0, 3, n)
    ev["ring"] = rng.integers(0, len(RINGS), n)
    wide = rng.random(n) < 0.05  # a status no int16 holds: its low bits, in both
    ev["a"] = np.where(wide, rng.integers(1 << 20, 1 << 40, n), rng.integers(0, 3, n))
    ev["b"] = rng.integers(-1, 3, n)
    ev["chunk"] = rng.integers(-5, 5, n)
    return ev


def builders() -> tuple[stt.SpanBuilder, stt.SpanBuilder]:
    rule, compiled = stt.SpanBuilder(dict(RINGS)), stt.SpanBuilder(dict(RINGS))
    rule.states = reqstate.request_states(compiled=False)
    for b in (rule, compiled):
        b.ring_changed()
    assert type(rule.states) is reqstate.RequestStates and type(compiled.states) is not reqstate.RequestStates
    return rule, compiled


def same_feed(a: stt.Feed, b: stt.Feed) -> None:
    for x, y in zip(a.spans.tables(), b.spans.tables()):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    for name in ("latencies", "arrivals", "ends", "contexts", "repeated"):
        assert getattr(a, name) == getattr(b, name), name


@built
@pytest.mark.parametrize("seed", range(40))
def test_compiled_state_is_the_rule(seed):
    ev = stream(seed)
    rng = np.random.default_rng(seed + 1000)
    rule, compiled = builders()
    cuts = np.sort(rng.integers(0, len(ev) + 1, int(rng.integers(0, 8))))
    now = 0.0
    for part in np.split(ev, cuts):
        now += float(rng.integers(0, 4))
        same_feed(rule.feed(part, now), compiled.feed(part, now))
        assert rule.states.live() == compiled.states.live()
        if rng.random() < 0.5:  # the live agent's ticks
            same_feed(rule.tick(now, grace_s=1.0, ended_timeout_s=3.0, idle_timeout_s=5.0),
                      compiled.tick(now, grace_s=1.0, ended_timeout_s=3.0, idle_timeout_s=5.0))
        assert len(rule.states) == len(compiled.states) == rule.open_requests()
    for b in (rule, compiled):
        b.process_died(101)  # ring 1's writer: its open spans end writer-died
    same_feed(rule.flush(), compiled.flush())
    assert rule.requests_freed == compiled.requests_freed
    assert len(compiled.states) == 0 and compiled.states.live() == []


@built
def test_compiled_state_refuses_bad_input():
    s = reqstate.request_states()
    ev = np.zeros(1, EVENT_DTYPE)
    ev["kind"], ev["req"], ev["ring"] = E.STAGE_ADD, 1, 7
    with pytest.raises(IndexError):  # a ring with no replica
        s.events(ev, np.zeros(2, np.int64), 0.0, np.zeros(4, np.int64), reqstate.Found())
    with pytest.raises(ValueError):  # not whole rows
        s.events(np.zeros(5, np.uint8), np.zeros(2, np.int64), 0.0, np.zeros(4, np.int64), reqstate.Found())
    with pytest.raises(ValueError):  # a group past the rows
        s.emits(np.zeros(1, stt.EMIT_DTYPE), np.array([0, 3]), np.zeros(2, np.int64), 0.0)
    assert 5 not in s and "x" not in s


def test_flush_of_a_request_never_seen_frees_nothing():
    for s in (reqstate.request_states(compiled=False), reqstate.request_states()):
        assert s.flush([(9, stt.R_TIMEOUT)], np.zeros(10, np.int64), np.zeros(0, np.uint8)) == 0
        assert [len(t) for t in s.take()] == [0, 0, 0]


def test_the_rule_gives_the_golden_report(synthetic_run, monkeypatch):
    """The Python state (a build without a compiler) makes the same report."""
    from tests.support import golden_inputs as gi
    monkeypatch.setattr(reqstate, "_reqc", None)
    assert type(reqstate.request_states()) is reqstate.RequestStates
    parent, name = os.path.split(synthetic_run)
    with open(os.path.join(gi.REPORTS, "synthetic.json"), "rb") as f:
        assert gi.report_json(parent, name) == f.read()


def test_a_built_state_imports():
    """The compiled state is missing only where nothing was compiled, and its layouts and
    codes are Python's (else rowops.compiled refuses it)."""
    here = Path(reqstate.__file__).parent
    files = [p for suffix in importlib.machinery.EXTENSION_SUFFIXES for p in here.glob("_reqc" + suffix)]
    if files or record._ringc is not None:
        assert reqstate._reqc is not None, files
