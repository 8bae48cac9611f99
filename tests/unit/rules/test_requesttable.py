"""The request table (omnitrace.rules.requesttable) against the reference's span objects
(``spanobjects.spans_from_tables`` then ``attribution.index_requests``), request by
request, over random span tables: repeated request and visit rows (the last counts), API
marks on several replicas, packets of every modality, stage spans without packets or
queues, incomplete spans, the empty id. On a real run: tests/system/rules/test_walk.py."""
from __future__ import annotations

import numpy as np
import pytest

from omnitrace import conventions as cv
from omnitrace import spantable as stt
from omnitrace.rules import attribution as at
from omnitrace.rules.requesttable import NO_STAGE, NONE, RequestTable
from omnitrace.rules.spanobjects import spans_from_tables

_MARK_KINDS = [int(k) for k in (cv.Ev.REQUEST_PARSED, cv.Ev.REQUEST_DISPATCH, cv.Ev.PACKET_RECEIVED,
                                cv.Ev.PACKET_RESUMED)]


def _random_tables(seed: int) -> tuple[stt.SpanTables, list[str]]:
    rng = np.random.default_rng(seed)
    n_req = int(rng.integers(1, 40))
    ids = [""] + [f"r{i}" for i in range(1, n_req + 1)]

    def some(dtype: np.dtype, k: int) -> np.ndarray:
        rows = np.zeros(k, dtype)
        rows["req"] = rng.integers(0, n_req + 1, k)  # 0: the empty id, never a request
        rows["replica"] = rng.integers(0, 3, k)
        if "start" in dtype.names:
            rows["start"] = rng.integers(0, 1000, k)
            rows["end"] = rows["start"] + rng.integers(0, 500, k)
        return rows
    roots = some(stt.REQUEST_DTYPE, int(rng.integers(0, 2 * n_req)))
    roots["reason"] = rng.choice([0, 0, 0, stt.R_RUN_ENDED], len(roots))
    roots["status"] = rng.integers(0, 4, len(roots))
    roots["first_audio"] = np.where(rng.random(len(roots)) < 0.2, 0, rng.integers(-100, 2000, len(roots)))
    visits = some(stt.VISIT_DTYPE, int(rng.integers(0, 6 * n_req)))
    visits["name"] = rng.choice([stt.N_STAGE, stt.N_QUEUE], len(visits))
    visits["stage"] = rng.integers(0, 4, len(visits))
    visits["reason"] = rng.choice([0, 0, stt.R_WRITER_DIED], len(visits))
    emits = some(stt.EMIT_DTYPE, int(rng.integers(0, 10 * n_req)))
    mark = rng.random(len(emits)) < 0.4
    emits["t"] = rng.integers(0, 1000, len(emits)) // int(rng.choice([1, 50]))  # ties
    emits["modality"] = np.where(mark, stt.MARK_MODALITY,
                                 rng.choice([int(cv.Modality.TEXT), int(cv.Modality.AUDIO)], len(emits)))
    emits["stage"] = np.where(mark, cv.API_STAGE, rng.integers(0, 4, len(emits)))
    emits["packet"] = np.where(mark, rng.choice(_MARK_KINDS + [99], len(emits)), rng.integers(0, 9, len(emits)))
    return stt.SpanTables(roots, visits, emits=emits), ids


def _opt(v: int) -> int | None:
    return None if v == NONE else v


@pytest.mark.parametrize("seed", range(60))
def test_the_table_says_what_the_span_objects_say(seed):
    spans, ids = _random_tables(seed)
    ref = at.index_requests(spans_from_tables(spans, ids))
    t = RequestTable.of(spans, len(ids))
    assert sorted(ids[i] for i in t.numbers().tolist()) == sorted(ref)
    for i, rid in enumerate(ids):
        r = ref.get(rid)
        rq = r.request if r else None
        assert bool(t.has_request[i]) == (rq is not None), rid
        if rq is not None:
            assert (t.arrival[i], t.end[i], t.status[i], t.ttfp[i] or None) == (rq.start, rq.end, rq.status, rq.ttfp)
            assert [_opt(int(x[i])) for x in (t.parsed, t.dispatched, t.received, t.resumed)] == [
                rq.parsed, rq.dispatched, rq.packet_received, rq.packet_resumed]
            ok = rq.ttfp is not None and rq.ttfp >= rq.start
            assert bool(t.walkable(np.array([i]))[0]) == ok
        if r is None:
            continue
        emit = at.first_audio_emit(r)
        got = None if t.emit_stage[i] == NO_STAGE else (int(t.emit_stage[i]), int(t.emit_t[i]))
        assert got == emit, rid
        assert (None if t.last_stage[i] == NO_STAGE else int(t.last_stage[i])) == (max(r.stages) if r.stages else None)
        assert int(t.incomplete[i]) == r.incomplete
        for which, objects in ((t.stages, r.stages), (t.queues, r.queues)):
            assert which.of_request(i) == [(s, sp.start, sp.end) for s, sp in sorted(objects.items())]
            stages = np.arange(-1, 5)
            has, start, end = which.times(np.full(len(stages), i), stages)
            assert [(s, a, b) for s, h, a, b in zip(stages.tolist(), has, start.tolist(), end.tolist()) if h] == [
                (s, sp.start, sp.end) for s, sp in sorted(objects.items())]


@pytest.mark.parametrize("seed", range(20))
def test_a_dense_table_is_the_whole_table_renumbered(seed):
    """The live agent's table: only the requests of the rows it holds, numbered from 1."""
    spans, ids = _random_tables(seed)
    whole = RequestTable.of(spans, len(ids))
    dense, nums = RequestTable.dense(spans)
    assert nums[0] == 0 and nums[1:].tolist() == whole.numbers().tolist()
    for field in ("has_request", "arrival", "ttfp", "parsed", "resumed", "emit_stage", "emit_t",
                  "last_stage", "incomplete"):
        assert getattr(dense, field)[1:].tolist() == getattr(whole, field)[nums[1:]].tolist(), field
    for k, i in enumerate(nums[1:].tolist(), 1):
        assert dense.stages.of_request(k) == whole.stages.of_request(i)
        assert dense.queues.of_request(k) == whole.queues.of_request(i)


def test_no_spans_no_requests():
    t = RequestTable.of(stt.SpanTables(), 3)
    assert not t.numbers().size and not t.has_request.any()
    assert t.queues.times(np.array([1]), np.array([0]))[0].tolist() == [False]
    dense, nums = RequestTable.dense(stt.SpanTables())
    assert nums.tolist() == [0] and not dense.numbers().size
