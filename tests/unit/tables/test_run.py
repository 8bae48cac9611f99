"""The typed tables (omnitrace/tables) against what the reference inputs were made of: row
counts from the scripts' own events, values from the simulation's own schedule (FIFO
blocking computed here, pair by pair, from the sender's tasks), keys, nulls, the schema's
one home."""
from __future__ import annotations

import os

import numpy as np
import pyarrow.compute as pc
import pytest

from omnitrace import keys
from omnitrace.conventions import Ev
from omnitrace.tables import run as tables_run
from omnitrace.tables import schema
from tests.support import event_fixture as ef
from tests.support import golden_inputs as gi

US = 1000

# table -> the event kind that begins each of its rows
BEGUN_BY = {"snapshots": Ev.SNAPSHOT_BEGIN, "fifo_tasks": Ev.FIFO_ENQUEUE, "payloads": Ev.PROCESS_BEGIN,
            "puts": Ev.PUT_BEGIN, "gets": Ev.GET_BEGIN, "waits": Ev.CHUNK_READY, "poll_lags": Ev.GET_BEGIN,
            "sender_tasks": Ev.FIFO_DEQUEUE}


@pytest.fixture(scope="module")
def synthetic(synthetic_run) -> tuple[str, list[tuple], list[str]]:
    events, ids = gi.synthetic_events()
    return synthetic_run, events, ids


def _script_counts(script: list[tuple]) -> dict[str, int]:
    """Rows each table must have, counted from a hand-made script's events."""
    kinds = [int(e[1]) for e in script]
    out = {t: kinds.count(int(k)) for t, k in BEGUN_BY.items()}
    out["requests"] = len({e[2] for e in script})
    out["stage_visits"] = len({(e[2], e[3]) for e in script if e[3] >= 0 and Ev.STAGE_ADD <= e[1] <= Ev.STAGE_EMIT})
    return out


@pytest.mark.parametrize("name,script", [("hol", gi.hol_script), ("worked", gi.worked_script)])
def test_a_row_per_recorded_span(name, script):
    rt = tables_run.load(os.path.join(gi.RUNS, name))
    got = {t: rt.tables[t].num_rows for t in _script_counts(script())}
    assert got == _script_counts(script())


def test_the_synthetic_run_has_a_row_per_simulated_span(synthetic):
    d, events, ids = synthetic
    rt = tables_run.load(d)
    kinds = np.array([e[2] for e in events])
    for table, kind in BEGUN_BY.items():
        assert rt.tables[table].num_rows == int((kinds == kind).sum()), table
    assert rt.tables["requests"].column("request").to_pylist() == ids
    assert rt.tables["stage_visits"].num_rows == 3 * len(ids)


def _sim_fifo(events: list[tuple], stage: int) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(request, chunk) -> (enqueue, dequeue, put end) us of stage ``stage``'s FIFO tasks."""
    by: dict[tuple[int, int], dict[int, int]] = {}
    for t, _ring, kind, req, st, chunk, _a, _b in events:
        if st == stage and kind in (Ev.FIFO_ENQUEUE, Ev.FIFO_DEQUEUE, Ev.PUT_END):
            by.setdefault((req, chunk), {})[kind] = t
    return {k: (v[Ev.FIFO_ENQUEUE], v[Ev.FIFO_DEQUEUE], v[Ev.PUT_END]) for k, v in by.items()}


@pytest.mark.parametrize("stage", [0, 1])
def test_fifo_blocked_time_is_the_overlap_with_other_requests_tasks(synthetic, stage):
    """The simulated sender does one task at a time, dequeue to put end: each task's
    blocked time is its wait's overlap with other requests' tasks, computed here over every
    pair; its first culprit the one with the largest overlap."""
    d, events, ids = synthetic
    tasks = _sim_fifo(events, stage)
    k = list(tasks)
    enq, deq, put = (np.array([tasks[x][i] for x in k]) for i in range(3))
    req = np.array([x[0] for x in k])
    ov = np.clip(np.minimum(deq[:, None], put[None, :]) - np.maximum(enq[:, None], deq[None, :]), 0, None)
    ov[req[:, None] == req[None, :]] = 0
    want = dict(zip(k, (ov.sum(axis=1) * US).tolist()))
    f = tables_run.load(d, {"fifo_tasks"}).tables["fifo_tasks"].filter(
        pc.equal(pc.field("producer_stage"), stage))
    got = {(r - 1, c): (b, by) for r, c, b, by in zip(*(f.column(n).to_pylist() for n in
                                                         ("request_id", "chunk", "blocked_ns", "blocked_by")))}
    assert {x: v[0] for x, v in got.items()} == want
    assert sum(v > 0 for v in want.values()) > 100  # the run has head-of-line blocking to check
    for i, x in enumerate(k):  # the top culprit, where one request overlapped most
        per = np.bincount(req, weights=ov[i], minlength=len(ids))
        if per.max() > 0 and (per == per.max()).sum() == 1:
            assert got[x][1][0] == int(per.argmax()) + 1


def test_requests_carry_their_times_status_and_incompleteness(synthetic):
    d, events, ids = synthetic
    r = tables_run.load(d, {"requests"}).tables["requests"].to_pylist()
    first = {(req, kind): t for t, _r, kind, req, *_ in reversed(events)
             if kind in (Ev.REQUEST_ARRIVE, Ev.REQUEST_FIRST_AUDIO, Ev.REQUEST_FIRST_TEXT)}
    for i, row in enumerate(r):
        assert row["ttfp_ns"] == (first[(i, Ev.REQUEST_FIRST_AUDIO)] - first[(i, Ev.REQUEST_ARRIVE)]) * US
        assert row["ttft_ns"] == (first[(i, Ev.REQUEST_FIRST_TEXT)] - first[(i, Ev.REQUEST_ARRIVE)]) * US
    assert (r[gi.FAILS]["status"], r[gi.OPEN]["status"], r[0]["status"]) == ("error", None, "ok")
    assert (r[gi.OPEN]["incomplete"], r[gi.OPEN]["end_ns"]) == ("run-ended", None)
    assert r[gi.OPEN]["last_ns"] >= r[gi.OPEN]["first_audio_ns"]


def test_the_hol_run_read_back_in_microseconds():
    """The victim v's own schedule (golden_inputs.hol_script), relative to its arrival."""
    rt = tables_run.load(os.path.join(gi.RUNS, "hol"))
    t = rt.tables
    rid = rt.request_id()
    t0 = t["requests"].column("arrival_ns").to_pylist()[rid["v"] - 1]

    def us(ns: int) -> float:
        return (ns - t0) / US

    tasks = {rt.requests[r]: (us(s), us(e)) for r, s, e in zip(
        *(t["sender_tasks"].column(c).to_pylist() for c in ("request_id", "start_ns", "end_ns")))
        if rt.requests[r] != "v"}
    assert tasks == {"x": (150, 250), "y": (250, 380), "z": (800, 1100)}
    fifo = t["fifo_tasks"].filter(pc.equal(pc.field("request_id"), rid["v"])).to_pylist()
    first = next(f for f in fifo if f["chunk"] == 0)
    assert (us(first["enqueue_ns"]), us(first["dequeue_ns"]), first["blocked_ns"]) == (101, 400, 230 * US)
    assert [rt.requests[x] for x in first["blocked_by"]] == ["y", "x"]
    (thinker,) = [v for v in t["stage_visits"].to_pylist() if v["request_id"] == rid["v"] and v["stage"] == 0]
    assert (us(thinker["add_ns"]), us(thinker["schedule_ns"]), us(thinker["finish_ns"])) == (10, 20, 1900)
    assert t["senders"].num_rows == 1 and t["stages"].to_pylist()[0] == {"run": 0, "stage": -1, "name": "api"}


def test_the_request_string_is_in_requests_only():
    for name, t in schema.TABLES.items():
        cols = {c.name for c in t.columns}
        assert ("request" in cols) == (name == "requests"), name
        assert "req" not in cols


def test_keys_sort_as_tuples_and_refuse_what_does_not_fit():
    a, b = np.array([3, -1, 3, 0]), np.array([-2, 5, 1, 0])
    k = keys.pack([(a, 8), (b, 8)])
    assert np.argsort(k).tolist() == sorted(range(4), key=lambda i: (a[i], b[i]))
    assert [x.tolist() for x in keys.unpack(k, (8, 8))] == [a.tolist(), b.tolist()]
    with pytest.raises(keys.KeyOverflow):
        keys.pack([(np.array([200]), 8)])
    with pytest.raises(keys.KeyOverflow):
        keys.pack([(a, 40), (b, 40)])


def test_a_table_takes_only_its_declared_columns():
    with pytest.raises(schema.SchemaError):
        schema.arrow_table("stages", {"stage": [0], "name": ["x"], "extra": [1]})
    assert schema.arrow_table("stages", {"stage": [0], "name": ["x"]}).schema == schema.TABLES["stages"].schema()


def test_docs_list_every_table_and_column_as_the_schema_does():
    with open(os.path.join(gi.ROOT, "docs", "tables.md")) as f:
        text = f.read()
    start = text.index("\n", text.index("<!-- generated from omnitrace/tables/schema.py")) + 1
    assert text[start:text.index("<!-- end of the generated reference -->")] == schema.markdown()



def test_request_tables_alone_are_those_of_the_whole_load(tmp_path):
    """A load for request tables only pairs no chunk stamps; a request still open ends at
    its last event of any kind, here a chunk event."""
    script = [e for e in ef.three_stage_events("r1")
              if e[2] == "r1" and e[-1] <= 350]  # up to code2wav's chunk scheduled: open
    d = ef.write_event_run(str(tmp_path / "run"), script)
    alone = tables_run.load(d, {"requests", "stage_visits"}).tables
    whole = tables_run.load(d).tables
    assert alone["requests"].equals(whole["requests"]) and alone["stage_visits"].equals(whole["stage_visits"])
    last = max(script, key=lambda e: e[-1])
    assert last[1] == Ev.CHUNK_SCHEDULED
    row = alone["requests"].to_pylist()[0]
    assert (row["incomplete"], row["last_ns"] - row["arrival_ns"]) == ("run-ended", last[-1] * US)
