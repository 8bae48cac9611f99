"""The vectorised span builder (omnitrace.spantable) on hand-written feeds: pairing, FIFO
blocking and its culprits, sender busy time, batches, a chunk wait never scheduled.
Against the per-event Python reference on a real run: tests/system/test_spantable.py."""
from __future__ import annotations

import numpy as np
import pytest

from omnitrace import conventions as cv
from omnitrace import spantable as stt
from omnitrace.conventions import Ev
from omnitrace.eventlog import EVENT_DTYPE
from tests.support import hol_reference

E = cv.Ev


def _ev(rows: list[tuple]) -> np.ndarray:
    """rows of (t, kind, req, stage, chunk, a, b, ring)."""
    a = np.zeros(len(rows), EVENT_DTYPE)
    for i, (t, kind, req, stage, chunk, x, y, ring) in enumerate(rows):
        a[i] = (t, x, req, chunk, kind, stage, y, ring)
    return a


RINGS = {0: {"pid": 10, "replica": 0, "role": "stage", "stage": 0, "process": "thinker"},
         1: {"pid": 10, "replica": 0, "role": "stage", "stage": 0, "process": "thinker"}}
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
    rows = sorted(f2.spans.chunks.tolist(), key=lambda r: r[8])
    fifo = [r for r in rows if r[0] == stt.N_FIFO]
    snaps = [r for r in rows if r[0] == stt.N_SNAPSHOT]
    assert [(r[8], r[9], r[10]) for r in fifo] == [(100, 200, 3)]  # start, end, ahead
    assert [(r[8], r[9], r[10]) for r in snaps] == [(300, 310, 0), (400, 450, 1)]
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
    fifo = f.spans.chunks[f.spans.chunks["name"] == stt.N_FIFO]
    assert len(fifo) == 1 and int(fifo[0]["blocked"]) == 35  # the culprits' own enqueues unseen
    b2 = stt.SpanBuilder(dict(RINGS))
    b2.ring_changed()
    f = b2.feed(_ev([
        (5, E.FIFO_ENQUEUE, 1, 0, 0, 2, 1, 0), (6, E.FIFO_ENQUEUE, 2, 0, 0, 0, 1, 0),
        (7, E.FIFO_ENQUEUE, 3, 0, 0, 1, 1, 0),
        (10, E.FIFO_DEQUEUE, 2, 0, 0, 0, 1, 1), (40, E.PUT_END, 2, 0, 0, 99, 1, 1),
        (40, E.FIFO_DEQUEUE, 3, 0, 0, 0, 1, 1), (45, E.PROCESS_END, 3, 0, 0, 0, 1, 1),
        (50, E.FIFO_DEQUEUE, 1, 0, 0, 0, 1, 1), (60, E.PUT_END, 1, 0, 0, 7, 1, 1),
    ]))
    fifo = {r["req"]: r for r in f.spans.chunks[f.spans.chunks["name"] == stt.N_FIFO]}
    assert int(fifo[1]["blocked"]) == 35 and (int(fifo[1]["by0"]), int(fifo[1]["by1"])) == (2, 3)
    assert int(fifo[3]["blocked"]) == 30 and int(fifo[3]["by0"]) == 2  # [7, 40] behind request 2
    assert int(fifo[2]["blocked"]) == 0
def test_sender_busy_from_the_builder_equals_the_rule_over_spans():
    """The busy intervals the builder hands out (``Feed.busy``, what the report's
    head-of-line rule reads) and those rebuilt from its spans by the same rule
    (tests/support/hol_reference.py), by hand: a put closes its task, a 0-byte process closes it, a process with bytes
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
    spans = np.concatenate([f.spans.chunks for f in feeds])
    assert not spans["reason"].any()
    from_spans = hol_reference.sender_busy(spans)
    assert list(from_spans) == list(from_builder) == [(0, 0)]
    for a, c in zip(from_spans[(0, 0)], from_builder[(0, 0)]):
        assert a.tolist() == c.tolist()
def test_a_batch_dequeued_at_once_is_worked_through_in_turn():
    """MRv2's output worker takes requests 1-3 off its queue at one instant and builds them
    in turn (puts on another thread): each task runs from the one before's build end to its
    own, not all of it charged to the last. Request 4, enqueued at 5 and taken alone at 200,
    waited behind 1, 2 and 3 for 10, 15 and 15 ns: blocked 40, culprits 2 then 3 then 1
    (equal overlaps: the earlier task first). Rebuilt from the spans alike."""
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
    fifo = {int(r["req"]): r for r in f.spans.chunks[f.spans.chunks["name"] == stt.N_FIFO]}
    assert int(fifo[4]["blocked"]) == 40
    assert [int(fifo[4][c]) for c in ("by0", "by1", "by2")] == [2, 3, 1]
    busy = hol_reference.sender_busy(np.concatenate([f.spans.chunks, b.flush().spans.chunks]))
    assert [tuple(map(int, x)) for x in zip(*busy[(0, 0)])] == got


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


def test_never_scheduled_wait_is_marked_not_writer_died():
    """CHUNK_READY on the consumer, never CHUNK_SCHEDULED, then every process exits: the
    consumer's scheduler never took the chunk; its writer did not die mid-span."""
    rings = {0: {"pid": 7, "replica": 0, "role": "stage", "stage": 1, "process": "talker"}}
    b = stt.SpanBuilder(dict(rings))
    b.ring_changed()
    ev = np.zeros(3, EVENT_DTYPE)
    for i, (kind, chunk, t) in enumerate(((Ev.CHUNK_READY, 0, 10), (Ev.CHUNK_SCHEDULED, 0, 20),
                                          (Ev.CHUNK_READY, 1, 30))):
        ev[i] = (t, 0, 1, chunk, kind, 1, 0, 0)
    done = b.feed(ev).spans.chunks
    b.process_died(7)
    left = b.flush().spans.chunks
    assert [stt.REASONS[r] for r in done["reason"]] == [""]
    assert [(stt.NAMES[n], stt.REASONS[r]) for n, r in zip(left["name"], left["reason"])] == [
        (cv.SPAN_WAIT_SCHEDULE, "consumer-never-scheduled")]


def test_visit_emits_first_first_audio_and_count_per_visit_marks_excluded():
    rows = [(3, 0, 1, 0, 50, int(cv.Modality.TEXT)), (1, 1, 1, 0, 60, int(cv.Modality.TEXT)), (2, 1, 1, 0, 61, int(cv.Modality.AUDIO)),
            (5, 1, 0, 1, 70, int(cv.Modality.AUDIO)), (0, 1, cv.API_STAGE, 0, 9, stt.MARK_MODALITY)]
    emits = np.array([(req, stage, rep, t, pk, mod) for t, req, stage, rep, pk, mod in rows], stt.EMIT_DTYPE)
    v = stt.VisitEmits.of(emits)
    got = list(zip(v.req.tolist(), v.stage.tolist(), v.replica.tolist(), v.first.tolist(),
                   v.first_audio.tolist(), v.count.tolist()))
    assert got == [(0, 1, 0, 3, stt.NO_EMIT, 1), (1, 0, 1, 5, 5, 1), (1, 1, 0, 1, 2, 2)]
    none = stt.VisitEmits.of(emits[-1:])
    assert len(none.req) == len(none.first) == len(none.count) == 0


@pytest.mark.parametrize("seed", range(30))
def test_stable_key_order_is_the_stable_argsort(seed):
    """Packed key and position, sorted: the stable argsort's order and keys, for keys with
    many ties, none, one, a range too wide to pack (the stable argsort itself)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    span = [3, 1 << 20, 1 << 45, 1 << 62][seed % 4]
    key = rng.integers(0, span, n, dtype=np.int64) + (1 << 40 if seed % 5 == 0 else 0)
    order, k = stt.stable_key_order(key)
    want = np.argsort(key, kind="stable")
    assert order.tolist() == want.tolist() and k.tolist() == key[want].tolist()
    assert k.dtype == key.dtype


@pytest.mark.parametrize("seed", range(30))
def test_emit_order_is_the_lexsort(seed):
    """Emits by (request, stage, replica, time), ties in arrival order: the four-key
    lexsort's order, with repeated times, negative stages, wide request ids, none."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 200))
    ev = np.zeros(n, EVENT_DTYPE)
    ev["t"] = rng.integers(0, [5, 1 << 40, 1 << 62][seed % 3], n)
    ev["req"] = rng.integers(0, [4, 1 << 32][seed % 2], n, dtype=np.int64)
    ev["stage"] = rng.integers(-2, 6, n)
    replica = rng.integers(0, [2, 1 << 40][seed % 5 == 0], n)
    want = np.lexsort((ev["t"], replica, ev["stage"], ev["req"]))
    assert stt.emit_order(ev, replica).tolist() == want.tolist()


def _two_requests() -> list[stt.Feed]:
    """Requests 1 and 2, each through the API and stage 0 with one snapshot and one FIFO
    task; request 2's FIFO task still open at the first feed's end (flushed)."""
    rings = {**RINGS, 2: {"pid": 11, "replica": 0, "role": "api", "stage": cv.API_STAGE, "process": "api"}}
    b = stt.SpanBuilder(rings)
    b.ring_changed()
    script = []
    for r, t0 in ((1, 0), (2, 50)):
        script += [(t0, E.REQUEST_ARRIVE, r, cv.API_STAGE, -1, 10, 20, 2), (t0 + 1, E.STAGE_ADD, r, 0, -1, 0, 0, 0),
                   (t0 + 2, E.STAGE_SCHEDULE, r, 0, -1, 0, 0, 0), (t0 + 3, E.SNAPSHOT_BEGIN, r, 0, 0, 0, 1, 0),
                   (t0 + 4, E.SNAPSHOT_END, r, 0, 0, 1, 1, 0), (t0 + 5, E.FIFO_ENQUEUE, r, 0, 0, 0, 1, 0)]
    script += [(20, E.FIFO_DEQUEUE, 1, 0, 0, 0, 1, 1), (30, E.STAGE_FINISH, 1, 0, -1, 0, 0, 0),
               (31, E.REQUEST_END, 1, cv.API_STAGE, -1, 0, 0, 2)]
    return [b.feed(_ev(sorted(script))), b.flush()]


def test_span_tables_are_a_plain_value():
    """A table per kind, each row in exactly one; tables of several feeds concatenate; a
    set of requests' rows select; the slices are every span's common columns in span order
    (chunk, request, then visit spans: the order span objects and OTLP spans come in)."""
    from omnitrace import otlp
    from omnitrace.rules.spanobjects import spans_from_tables
    feeds = _two_requests()
    whole = stt.SpanTables.concat([f.spans for f in feeds])
    assert [t.dtype for t in whole.tables()] == list(stt.TABLE_DTYPES)
    assert (len(whole.requests), len(whole.visits), len(whole.chunks)) == (2, 4, 4)
    assert len(whole) == sum(len(f.spans) for f in feeds) == 10
    assert sorted(whole.requests["req"].tolist()) == [1, 2]
    assert whole.requests["prompt_tokens"].tolist() == [10, 10] and whole.requests["max_tokens"].tolist() == [20, 20]
    one, rest = whole.of(np.array([1])), whole.where_request(lambda r: r != 1)
    assert len(one) + len(rest) == len(whole) and set(one.span_reqs().tolist()) == {1}
    assert one.rows() == len(one) + len(one.emits)
    s = whole.slices()
    assert len(s) == len(whole) and s["req"].tolist() == whole.span_reqs().tolist()
    n = len(whole.chunks)
    assert s["name"][:n].tolist() == whole.chunks["name"].tolist()
    assert set(s["name"][n:n + 2].tolist()) == {stt.N_REQUEST} and set(s["stage"][n:n + 2].tolist()) == {cv.API_STAGE}
    assert s["start"][n + 2:].tolist() == whole.visits["start"].tolist()
    assert s["reason"].tolist() == np.concatenate([t["reason"] for t in (whole.chunks, whole.requests, whole.visits)]).tolist()
    requests = ["", "r1", "r2"]
    objects = spans_from_tables(whole, requests)
    edge = otlp.SpanConverter(requests, {}).convert(whole)
    assert [o.rid for o in objects] == [requests[r] for r in whole.span_reqs().tolist()]
    assert [o.attrs[cv.ATTR_REQUEST_ID] for o in edge] == [requests[r] for r in whole.span_reqs().tolist()]


@pytest.mark.parametrize("seed", range(6))
def test_visit_emits_of_parts_grouped_are_those_of_the_whole(seed):
    """A visit's packets counted part by part (the sql tables' way without the emits
    table) and then grouped: the first, first audio and count of all of them at once."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    emits = np.zeros(n, stt.EMIT_DTYPE)
    emits["req"], emits["stage"], emits["replica"] = rng.integers(0, 6, n), rng.integers(-1, 3, n), rng.integers(0, 2, n)
    emits["t"] = rng.integers(0, 1000, n)
    emits["modality"] = rng.choice([stt.MARK_MODALITY, int(cv.Modality.TEXT), int(cv.Modality.AUDIO)], n)
    cuts = sorted(rng.integers(0, n + 1, int(rng.integers(0, 6))).tolist())
    parts = [stt.VisitEmits.of(p) for p in np.split(emits, cuts)]
    got = stt.VisitEmits.concat(parts).grouped()
    want: dict = {}  # the rule, visit by visit
    for req, stage, rep, t, _, mod in emits.tolist():
        if mod != stt.MARK_MODALITY:
            first, audio, count = want.get((req, stage, rep), (stt.NO_EMIT, stt.NO_EMIT, 0))
            want[(req, stage, rep)] = (min(first, t), min(audio, t) if mod == int(cv.Modality.AUDIO) else audio,
                                       count + 1)
    assert list(zip(got.req.tolist(), got.stage.tolist(), got.replica.tolist())) == sorted(want)
    assert list(zip(got.first.tolist(), got.first_audio.tolist(), got.count.tolist())) == [
        want[k] for k in sorted(want)]
