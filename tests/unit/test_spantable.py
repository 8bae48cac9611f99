"""The vectorised span builder (omnitrace.spantable) against the per-event Python
reference (tests/reference_assembler.py, the previous agent's assembler), and the
report on the event log against the report on the reference's spans.jsonl."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from omnitrace import conventions as cv
from omnitrace import eventlog, otlp
from omnitrace import spantable as stt
from omnitrace.eventlog import EVENT_DTYPE
from tests.support.reference_assembler import Assembler
from tests.support.report_util import report_json, rewrite_event_log

E = cv.Ev


def _identity(s) -> tuple:
    a = s.attrs
    return (s.name, a.get(cv.ATTR_REQUEST_ID), a.get(cv.ATTR_STAGE_ID), a.get(cv.ATTR_PEER_STAGE_ID),
            a.get(cv.ATTR_CHUNK_INDEX), s.span_id, s.parent_id, s.start, s.end,
            a.get(cv.ATTR_FIFO_BLOCKED_NS), tuple(a.get(cv.ATTR_FIFO_BLOCKED_BY) or ()),
            a.get(cv.ATTR_TRANSFER_BYTES), a.get(cv.ATTR_FIFO_AHEAD),
            a.get(cv.ATTR_SNAPSHOT_STRATEGY), bool(a.get(cv.ATTR_INCOMPLETE)),
            tuple((n, t) for n, t, _ in s.events), s.error)


def reference_spans(log: eventlog.EventLog) -> list:
    """The log's events through the reference assembler, ring by ring in ring order."""
    spans: list = []
    asm = Assembler(spans.append)
    strings = log.requests.strings
    ev = log.events
    for idx, ring in log.rings.items():
        rows = ev[ev["ring"] == idx]
        batch = [(k, strings[r], s, c, a, b, t) for t, a, r, c, k, s, b, _ in rows.tolist()]
        asm.feed(batch, 0, ring["pid"], ring["replica"], ring["role"], ring["stage"],
                 ring["process"])
    for idx in log.died:
        asm.process_died(log.rings[idx]["pid"])
    asm.flush("run-ended")
    return spans


def built_spans(log: eventlog.EventLog, cuts: int = 1, seed: int = 0) -> list:
    """The log's events through SpanBuilder, in ``cuts`` random time cuts (as live)."""
    b = stt.SpanBuilder(dict(log.rings))
    b.ring_changed()
    conv = otlp.SpanConverter(log.requests.strings, log.rings)
    ev = log.events[np.argsort(log.events["t"], kind="stable")]
    rng = np.random.default_rng(seed)
    edges = sorted(rng.choice(np.arange(1, len(ev)), size=cuts - 1, replace=False).tolist()) if cuts > 1 else []
    out = []
    for part in np.split(ev, edges):
        f = b.feed(part)
        out += conv.convert(f.spans, f.emits)
    for idx in log.died:
        b.process_died(log.rings[idx]["pid"])
    f = b.flush()
    out += conv.convert(f.spans, f.emits)
    return out


def test_builder_equals_reference_on_a_real_run(real_run):
    log = eventlog.read_event_log(real_run)
    assert log is not None and len(log.events) > 5000
    want = sorted(_identity(s) for s in reference_spans(log))
    for cuts in (1, 7, 60):
        got = sorted(_identity(s) for s in built_spans(log, cuts, seed=cuts))
        assert len(got) == len(want), cuts
        assert got == want, f"{cuts} cuts: first difference " + next(
            f"{g} != {w}" for g, w in zip(got, want) if g != w)
    names = {w[0] for w in want}
    assert {cv.SPAN_FIFO, cv.SPAN_PUT, cv.SPAN_POLL, cv.SPAN_REQUEST, cv.SPAN_STAGE} <= names
    assert any(w[9] for w in want), "some FIFO waits were blocked by other requests"


def test_report_on_events_equals_report_on_reference_spans(real_run, tmp_path):
    """Today's span path (reference spans -> spans.jsonl -> report) and the event log
    give the same attribution, FIFO, snapshot and transfer figures."""
    log = eventlog.read_event_log(real_run)
    old = tmp_path / "spans-path"
    old.mkdir()
    for name in ("run.json", "agent.json", "bench.json", "processes.jsonl"):
        shutil.copy(os.path.join(real_run, name), old / name)
    spans = reference_spans(log)
    run_id = "ref"
    with open(old / "spans.jsonl", "wb") as f:
        f.write(otlp.encode_json_lines(spans, lambda p: otlp.resource_attrs(run_id, p)))
    new_rep, old_rep = _canon(report_json(real_run)), _canon(report_json(str(old)))
    compared = 0
    for key in ("attribution", "fifo", "snapshot", "transfer", "ttfp", "head_of_line", "requests"):
        if key in old_rep or key in new_rep:
            assert new_rep.get(key) == old_rep.get(key), key
            compared += 1
    assert compared >= 7, sorted(new_rep)


def test_report_streamed_over_many_segments_equals_one_feed(real_run, tmp_path):
    """`report` takes the event log segment by segment and keeps only what it needs of
    each feed's spans (analyze/tables.py): cut into ~50 segments, the same run gives the
    same report, every figure of it, as read in one piece."""
    one = str(tmp_path / "one")
    many = str(tmp_path / "many")
    assert rewrite_event_log(real_run, one, 1, segment_raw_bytes=1 << 30) == 1
    assert rewrite_event_log(real_run, many, 50, segment_raw_bytes=1 << 10) >= 40
    a, b = report_json(one), report_json(many)
    assert a["window"]["attributed"] >= 10 and a["head_of_line_victims"] and a["waterfalls"]
    for key in ("runs", "run"):
        a.pop(key), b.pop(key)
    assert _canon(a) == _canon(b)  # a mean's last bit follows the rows' order


def _canon(x):
    """Lists of plain numbers are samples (their order follows span order): sorted; floats
    to 9 significant digits (a mean's last bit depends on summation order)."""
    if isinstance(x, float):
        return float(f"{x:.9g}")
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items()}
    if isinstance(x, list):
        if x and all(isinstance(v, (int, float)) for v in x):
            return sorted(_canon(v) for v in x)
        return [_canon(v) for v in x]
    return x


def _ev(rows: list[tuple]) -> np.ndarray:
    """rows of (t, kind, req, stage, chunk, a, b, ring)."""
    a = np.zeros(len(rows), EVENT_DTYPE)
    for i, (t, kind, req, stage, chunk, x, y, ring) in enumerate(rows):
        a[i] = (t, x, req, chunk, kind, stage, y, ring)
    return a


RINGS = {0: {"pid": 10, "replica": 0, "role": "stage", "stage": 0, "process": "thinker"},
         1: {"pid": 10, "replica": 0, "role": "stage", "stage": 0, "process": "thinker"}}


@pytest.mark.unit
def test_end_before_begin_across_feeds_and_retries_pair_in_order():
    b = stt.SpanBuilder(dict(RINGS))
    b.ring_changed()
    # the dequeue (sender ring 1) is drained one feed before its enqueue (ring 0)
    f1 = b.feed(_ev([(200, E.FIFO_DEQUEUE, 1, 0, 0, 0, 1, 1)]))
    assert not len(f1.spans)
    f2 = b.feed(_ev([(100, E.FIFO_ENQUEUE, 1, 0, 0, 3, 1, 0),
                     # a retried task: same key twice, pairs in time order
                     (300, E.SNAPSHOT_BEGIN, 1, 0, 5, 0, 1, 0), (310, E.SNAPSHOT_END, 1, 0, 5, 0, 1, 0),
                     (400, E.SNAPSHOT_BEGIN, 1, 0, 5, 0, 1, 0), (450, E.SNAPSHOT_END, 1, 0, 5, 1, 1, 0)]))
    rows = sorted(f2.spans.tolist(), key=lambda r: r[10])
    fifo = [r for r in rows if r[0] == stt.N_FIFO]
    snaps = [r for r in rows if r[0] == stt.N_SNAPSHOT]
    assert [(r[10], r[11], r[12]) for r in fifo] == [(100, 200, 3)]  # start, end, ahead
    assert [(r[10], r[11], r[12]) for r in snaps] == [(300, 310, 0), (400, 450, 1)]


@pytest.mark.unit
def test_blocked_time_and_culprits_by_hand():
    """Sender busy with request 2 over [10, 40] and request 3 over [40, 45], then
    request 1's own task; request 1's chunk waited [5, 50]: blocked 30 + 5 = 35 ns,
    culprits 2 then 3."""
    b = stt.SpanBuilder(dict(RINGS))
    b.ring_changed()
    f = b.feed(_ev([
        (5, E.FIFO_ENQUEUE, 1, 0, 0, 2, 1, 0),
        (10, E.FIFO_DEQUEUE, 2, 0, 0, 0, 1, 1), (40, E.PUT_END, 2, 0, 0, 99, 1, 1),
        (40, E.FIFO_DEQUEUE, 3, 0, 0, 0, 1, 1), (45, E.PROCESS_END, 3, 0, 0, 0, 1, 1),
        (50, E.FIFO_DEQUEUE, 1, 0, 0, 0, 1, 1), (60, E.PUT_END, 1, 0, 0, 7, 1, 1),
    ]))
    fifo = f.spans[f.spans["name"] == stt.N_FIFO]
    assert len(fifo) == 1 and int(fifo[0]["v2"]) == 35  # the culprits' own enqueues unseen
    b2 = stt.SpanBuilder(dict(RINGS))
    b2.ring_changed()
    f = b2.feed(_ev([
        (5, E.FIFO_ENQUEUE, 1, 0, 0, 2, 1, 0), (6, E.FIFO_ENQUEUE, 2, 0, 0, 0, 1, 0),
        (7, E.FIFO_ENQUEUE, 3, 0, 0, 1, 1, 0),
        (10, E.FIFO_DEQUEUE, 2, 0, 0, 0, 1, 1), (40, E.PUT_END, 2, 0, 0, 99, 1, 1),
        (40, E.FIFO_DEQUEUE, 3, 0, 0, 0, 1, 1), (45, E.PROCESS_END, 3, 0, 0, 0, 1, 1),
        (50, E.FIFO_DEQUEUE, 1, 0, 0, 0, 1, 1), (60, E.PUT_END, 1, 0, 0, 7, 1, 1),
    ]))
    fifo = {r["req"]: r for r in f.spans[f.spans["name"] == stt.N_FIFO]}
    assert int(fifo[1]["v2"]) == 35 and (int(fifo[1]["by0"]), int(fifo[1]["by1"])) == (2, 3)
    assert int(fifo[3]["v2"]) == 30 and int(fifo[3]["by0"]) == 2  # [7, 40] behind request 2
    assert int(fifo[2]["v2"]) == 0


@pytest.mark.unit
def test_sender_busy_from_the_builder_equals_the_rule_over_spans():
    """The busy intervals the builder hands out (``Feed.busy``, what the report's
    head-of-line rule reads) and those rebuilt from spans (a run recorded before the event
    log) by hand: a put closes its task, a 0-byte process closes it, a process with bytes
    does not, another task's closer falls back to the next dequeue, and the last task
    without a closer stays open. Fed in three cuts."""
    from omnitrace.rules import headofline
    ev = _ev([(1, E.FIFO_ENQUEUE, 1, 0, 0, 0, 1, 0), (2, E.FIFO_ENQUEUE, 2, 0, 0, 1, 1, 0),
              (3, E.FIFO_ENQUEUE, 3, 0, 0, 2, 1, 0), (4, E.FIFO_ENQUEUE, 4, 0, 0, 3, 1, 0),
              (10, E.FIFO_DEQUEUE, 1, 0, 0, 0, 1, 1), (12, E.PROCESS_BEGIN, 1, 0, 0, 0, 1, 1),
              (15, E.PROCESS_END, 1, 0, 0, 100, 1, 1), (16, E.PUT_BEGIN, 1, 0, 0, 0, 1, 1),
              (20, E.PUT_END, 1, 0, 0, 100, 1, 1),
              (30, E.FIFO_DEQUEUE, 2, 0, 0, 0, 1, 1), (32, E.PROCESS_BEGIN, 2, 0, 0, 0, 1, 1),
              (35, E.PROCESS_END, 2, 0, 0, 0, 1, 1),
              (40, E.FIFO_DEQUEUE, 3, 0, 0, 0, 1, 1), (41, E.PUT_BEGIN, 1, 0, 1, 0, 1, 1),
              (44, E.PUT_END, 1, 0, 1, 50, 1, 1),
              (50, E.FIFO_DEQUEUE, 4, 0, 0, 0, 1, 1)])
    b = stt.SpanBuilder(dict(RINGS))
    b.ring_changed()
    feeds = [b.feed(part) for part in np.split(ev, [6, 11])] + [b.flush()]
    got = [(pid, stage, s, e, r) for f in feeds for pid, stage, *cols in f.busy
           for s, e, r in zip(*(c.tolist() for c in cols))]
    assert got == [(10, 0, 10, 20, 1), (10, 0, 30, 35, 2), (10, 0, 40, 50, 3)]
    from_builder = headofline.busy_by_replica(
        {(10, 0): tuple(np.array(c) for c in ([g[2] for g in got], [g[3] for g in got], [g[4] for g in got]))},
        {10: 0})
    spans = np.concatenate([f.spans for f in feeds])
    assert not spans["reason"].any()
    from_spans = headofline.sender_busy(spans)
    assert list(from_spans) == list(from_builder) == [(0, 0)]
    for a, c in zip(from_spans[(0, 0)], from_builder[(0, 0)]):
        assert a.tolist() == c.tolist()


@pytest.mark.unit
def test_a_batch_dequeued_at_once_is_worked_through_in_turn():
    """MRv2's output worker takes requests 1-3 off its queue at one instant and builds them
    in turn (puts on another thread): each task runs from the one before's build end to its
    own, not all of it charged to the last. Request 4, enqueued at 5 and taken alone at 200,
    waited behind 1, 2 and 3 for 10, 15 and 15 ns: blocked 40, culprits 2 then 3 then 1
    (equal overlaps: the earlier task first). Rebuilt from the spans alike."""
    from omnitrace.rules import headofline
    script = [(5, E.FIFO_ENQUEUE, 4, 0, 0, 0, 1, 0)]
    for r, done in ((1, 110), (2, 125), (3, 140)):
        script += [(90 + r, E.FIFO_ENQUEUE, r, 0, 0, 0, 1, 0), (100, E.FIFO_DEQUEUE, r, 0, 0, 0, 1, 1),
                   (done - 5, E.PROCESS_BEGIN, r, 0, 0, 0, 1, 1), (done, E.PROCESS_END, r, 0, 0, 64, 1, 1),
                   (done + 40, E.PUT_BEGIN, r, 0, 0, 0, 1, 2), (done + 45, E.PUT_END, r, 0, 0, 64, 1, 2)]
    script += [(200, E.FIFO_DEQUEUE, 4, 0, 0, 0, 1, 1), (205, E.PROCESS_BEGIN, 4, 0, 0, 0, 1, 1),
               (210, E.PROCESS_END, 4, 0, 0, 64, 1, 1), (215, E.PUT_BEGIN, 4, 0, 0, 0, 1, 1),
               (220, E.PUT_END, 4, 0, 0, 64, 1, 1)]
    rings = {**RINGS, 2: dict(RINGS[1])}
    b = stt.SpanBuilder(rings)
    b.ring_changed()
    f = b.feed(_ev(sorted(script, key=lambda e: (e[0], e[1] != E.FIFO_DEQUEUE))))
    got = [(int(s), int(e), int(r)) for _, _, *cols in f.busy for s, e, r in zip(*cols)]
    assert got == [(100, 110, 1), (110, 125, 2), (125, 140, 3), (200, 220, 4)]
    fifo = {int(r["req"]): r for r in f.spans[f.spans["name"] == stt.N_FIFO]}
    assert int(fifo[4]["v2"]) == 40
    assert [int(fifo[4][c]) for c in ("by0", "by1", "by2")] == [2, 3, 1]
    busy = headofline.sender_busy(np.concatenate([f.spans, b.flush().spans]))
    assert [tuple(map(int, x)) for x in zip(*busy[(0, 0)])] == got


def test_walk_over_lazy_chunk_indexes_equals_walk_over_objects(real_run):
    """The report walks each request over lazy chunk indexes (Span objects only for the
    hops it reads); every request's attribution equals the walk over all its chunk spans
    as objects."""
    from omnitrace.analyze.chunkspans import request_spans, with_chunks
    from omnitrace.analyze.rundir import load_run
    from omnitrace.rules import attribution as at
    run = load_run([real_run])
    want = {rid: at.attribute(r) for rid, r in request_spans(run).items()}
    lazy = at.index_requests(run.spans)
    got = {r.rid: at.attribute(r) for r in with_chunks(run, lazy, sorted(lazy), batch=3)}
    assert sum(a is not None for a in want.values()) >= 10
    assert got == want


def test_report_with_a_forked_walk_equals_the_report_in_one_process(real_run, monkeypatch):
    """A long run's report walks part of its requests (and their head-of-line pairs) in a
    forked child beside the component figures (analyze/beside.py); forced on a short run,
    every figure, row and pair is the same as computed in one process."""
    from omnitrace.analyze import report
    from omnitrace.analyze.rundir import load_run
    alone = load_run([real_run])
    one = report.build_report(alone)
    # a waterfall asked for by id, of a request the child walks (the last id in order)
    last = max(r["id"] for r in one["requests"])
    one_asked = report.build_report(alone, waterfalls=2, waterfall_ids=[last],
                                    per_request_segments=False)
    monkeypatch.setattr(report, "MIN_WORK", 1)
    run = load_run([real_run])
    walked = one["window"]["attributed"]
    rows = sum(len(t) for t in run.figures.tables())
    assert 0 < report._walk_here(walked, rows) < walked  # some requests are the child's
    forked = report.build_report(run)
    assert walked >= 10 and one["head_of_line"] and one["waterfalls"]
    assert forked == one
    asked = report.build_report(run, waterfalls=2, waterfall_ids=[last], per_request_segments=False)
    # the asked id is drawn (last, or among the slowest when it is one of them: which
    # requests are slowest depends on the run's timing)
    assert last in [w["id"] for w in asked["waterfalls"]] and asked == one_asked


def test_report_without_every_rows_path_differs_only_in_those_paths(real_run):
    """The console and HTML report (no JSON) give only the slowest requests' rows their
    critical path (what the HTML draws): otherwise the same report as the JSON's."""
    from omnitrace.analyze import report
    from omnitrace.analyze.rundir import load_run
    full = report.build_report(load_run([real_run]), waterfalls=3)
    lean = report.build_report(load_run([real_run]), waterfalls=3, per_request_segments=False)
    assert len(full["requests"]) >= 6
    assert [r["id"] for r in lean["requests"] if "segments" in r] == \
        [r["id"] for r in full["requests"][:3]]
    for row in full["requests"][3:]:
        del row["segments"]
    assert lean == full


def _match_by_definition(bkey, bt, ekey, et) -> set:
    """``spantable.match`` as its rule reads: per key, begins and ends each in time order
    (ties in arrival order), the k-th begin with the k-th end."""
    def by_key(keys, ts):
        out: dict = {}
        for i in sorted(range(len(keys)), key=lambda i: (ts[i], i)):
            out.setdefault(int(keys[i]), []).append(i)
        return out
    b, e = by_key(bkey, bt), by_key(ekey, et)
    return {pair for k in b.keys() & e.keys() for pair in zip(b[k], e[k])}


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(4))
def test_match_pairs_the_kth_begin_of_a_key_with_its_kth_end(seed) -> None:
    """Every path of ``match``: keys once or repeated (a chunk index held over steps), a
    repeated key's stamps in time order or not, more begins than ends and the reverse."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        nb, ne = (int(x) for x in rng.integers(0, 40, 2))
        keys = int(rng.integers(1, 3 * max(nb, ne, 1)))
        bkey, ekey = rng.integers(0, keys, nb), rng.integers(0, keys, ne)
        bt, et = rng.integers(0, 50, nb), rng.integers(0, 50, ne)
        if rng.random() < 0.5:  # arrival in time order: the common case
            bt.sort()
            et.sort()
        bi, ei = stt.match(bkey, bt, ekey, et)
        got = set(zip(bi.tolist(), ei.tolist()))
        assert len(got) == len(bi)
        assert got == _match_by_definition(bkey, bt, ekey, et)
        order = np.lexsort((bt[bi], bkey[bi]))  # pairs come out in (key, time) order
        assert (order == np.arange(len(bi))).all()


@pytest.mark.unit
@pytest.mark.parametrize("ids", [[3, 9, 3, 4, 9, 9], [1, 1 << 21, 1, 5, 1 << 21]],
                         ids=["narrow: per id", "wide: by a sort"])
def test_a_feeds_latest_time_per_request(ids) -> None:
    """Prepared.latest (what the builder's last_t takes of a feed) is each request's
    latest stamp, however far apart the feed's request ids are."""
    rng = np.random.default_rng(1)
    req = np.array(ids, np.uint32)
    t = rng.integers(0, 1 << 40, len(ids)).astype(np.int64)
    got_ids, got_t = stt._latest(req, t, sorted(set(ids)))
    assert got_ids.tolist() == sorted(set(ids))
    assert got_t.tolist() == [int(t[req == r].max()) for r in sorted(set(ids))]
