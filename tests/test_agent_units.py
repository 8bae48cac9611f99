"""Unit checks of the agent's pieces on real inputs (real rings, real official encoder)."""
from __future__ import annotations

import os

import orjson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from omnitrace import conventions as cv
from omnitrace import record
from omnitrace.agent import export_otlp, rundir
from omnitrace.agent.assemble import Assembler, Span, _Req
from omnitrace.agent.export_prometheus import Metrics
from omnitrace.conventions import Ev


def test_file_json_equals_official_encoder_output():
    rc = export_otlp.ResourceCache("r1")
    spans = [Span(cv.SPAN_FIFO, 123456789, 42, 7, 1000, 2000,
                  {"s": 'x"q\\\n\u00e9', "i": 3, "arr": ["q", "r"], "empty": [], "b": True,
                   "f": 1.5, "neg": -4}, (1, "stage", 0, 0, "thinker"),
                  [(cv.EVENT_EMIT, 1500, {cv.ATTR_PACKET_INDEX: 1})], False),
             Span(cv.SPAN_REQUEST, 123456789, 7, None, 900, 3000, {"a": "y"},
                  (2, "api", -1, 0, "api"), None, True)]
    official = orjson.loads(rundir.otlp_json(encode_spans([export_otlp.to_readable(s, rc) for s in spans])))
    assert orjson.loads(rundir.spans_request_bytes(spans, rc.attrs)) == official
    assert rundir.spans_request_json(spans, rc.attrs) == official
    assert official["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] == f"{123456789:032x}"


def test_cached_chunk_span_id_equals_conventions():
    r = _Req("req-\u00fc-1")
    for args in [(cv.SPAN_FIFO, 0, 3, 1), (cv.SPAN_GET, 2, 0, 1), (cv.SPAN_FIFO, 1, -1, 2)]:
        assert r.chunk_sid(*args) == cv.span_id_for("req-\u00fc-1", *args)


def _feed(asm: Assembler, events: list[tuple], pid: int = 10) -> None:
    asm.feed(events, 0, pid, 0, "stage", 0, "thinker")


def test_blocked_ns_is_overlap_with_other_requests_busy_sender():
    spans: list[Span] = []
    asm = Assembler(spans.append)
    E = Ev
    # scheduler enqueues A0 at 0, B0 at 10, A1 at 20; sender: A0 [5, 40], B0 [40, 100]
    # (put ends), A1 dequeued at 100. B0 waited [10, 40] behind A0 -> blocked 30 by A;
    # A1 waited [20, 100]: behind A0 (own request, not counted) 20..40 and B0 40..100 -> 60.
    sched = [(E.FIFO_ENQUEUE, "A", 0, 0, 0, 1, 0), (E.FIFO_ENQUEUE, "B", 0, 0, 1, 1, 10),
             (E.FIFO_ENQUEUE, "A", 0, 1, 2, 1, 20)]
    sender = [(E.FIFO_DEQUEUE, "A", 0, 0, 2, 1, 5), (E.PUT_BEGIN, "A", 0, 0, 0, 1, 30),
              (E.PUT_END, "A", 0, 0, 9, 1, 40),
              (E.FIFO_DEQUEUE, "B", 0, 0, 1, 1, 40), (E.PUT_BEGIN, "B", 0, 0, 0, 1, 90),
              (E.PUT_END, "B", 0, 0, 9, 1, 100),
              (E.FIFO_DEQUEUE, "A", 0, 1, 0, 1, 100)]
    _feed(asm, sender)  # the sender's ring drained first: pairs complete on the enqueues
    _feed(asm, sched)
    fifo = {(s.attrs[cv.ATTR_REQUEST_ID], s.attrs[cv.ATTR_CHUNK_INDEX]): s
            for s in spans if s.name == cv.SPAN_FIFO}
    assert fifo[("A", 0)].attrs[cv.ATTR_FIFO_BLOCKED_NS] == 0
    assert fifo[("B", 0)].attrs[cv.ATTR_FIFO_BLOCKED_NS] == 30
    assert fifo[("B", 0)].attrs[cv.ATTR_FIFO_BLOCKED_BY] == ["A"]
    assert fifo[("A", 1)].attrs[cv.ATTR_FIFO_BLOCKED_NS] == 60
    assert fifo[("A", 1)].attrs[cv.ATTR_FIFO_BLOCKED_BY] == ["B"]
    assert fifo[("A", 1)].end - fifo[("A", 1)].start == 80
    assert fifo[("A", 1)].attrs[cv.ATTR_FIFO_AHEAD] == 2
    assert fifo[("A", 1)].attrs[cv.ATTR_FIFO_DEPTH] == 3


def test_request_state_is_freed_and_incomplete_spans_flushed():
    now = [0.0]
    spans: list[Span] = []
    metrics = Metrics()
    asm = Assembler(spans.append, metrics, grace_s=1.0, idle_timeout_s=10.0, clock=lambda: now[0])
    for i in range(100):
        r = f"r{i}"
        asm.feed([(Ev.REQUEST_ARRIVE, r, -1, -1, 10, 5, 0), (Ev.REQUEST_FIRST_AUDIO, r, -1, -1, 0, 0, 5),
                  (Ev.REQUEST_END, r, -1, -1, 0, 0, 9)], 0, 1, 0, "api", -1, "api")
        asm.feed([(Ev.STAGE_ADD, r, 0, -1, 0, 0, 1), (Ev.STAGE_SCHEDULE, r, 0, -1, 0, 0, 2),
                  (Ev.STAGE_FINISH, r, 0, -1, 0, 0, 8)],
                 0, 2, 0, "stage", 0, "thinker")
    asm.feed([(Ev.REQUEST_ARRIVE, "open", -1, -1, 10, 5, 0)], 0, 1, 0, "api", -1, "api")
    asm.feed([(Ev.SNAPSHOT_BEGIN, "open", 0, 3, 0, 1, 4)], 0, 2, 0, "stage", 0, "thinker")
    assert len(asm.reqs) == 101
    now[0] = 2.0
    asm.tick()
    assert list(asm.reqs) == ["open"]  # completed requests freed after the grace period
    now[0] = 20.0
    asm.tick()
    assert not asm.reqs  # idle one freed too, its open spans flushed with the reason
    inc = [s for s in spans if s.attrs.get(cv.ATTR_INCOMPLETE)]
    assert {s.name for s in inc} == {cv.SPAN_SNAPSHOT, cv.SPAN_REQUEST}
    assert all(s.attrs[cv.ATTR_INCOMPLETE_REASON] == "timeout" for s in inc)
    ttfp = metrics.hist.snapshot(cv.METRIC_TTFP)
    assert sum(ttfp[0][1]) == 100


def test_ring_strings_wrap_and_drop_count_exact(tmp_path, monkeypatch):
    monkeypatch.setenv(cv.ENV_RUN_ID, f"unit-{os.getpid()}")
    ring = record.Ring(f"unit-{os.getpid()}", record.ProcessInfo(), 64)
    reader = record.RingReader(ring.name)
    try:
        got, calls = [], 0
        for i in range(2000):
            rid = f"request-{i % 13}-" + "x" * (i % 70)
            ring.record(Ev.FIFO_ENQUEUE, rid, 0, i, i, 1)
            calls += 1
            if i % 17 == 0:
                got += reader.read_batch()
        got += reader.read_batch()
        assert len(got) + reader.dropped() == calls
        assert reader.dropped() > 0
        for kind, req, stage, chunk, a, b, t in got:
            assert req == f"request-{a % 13}-" + "x" * (a % 70)
        assert os.stat(f"/dev/shm/{ring.name}").st_mode & 0o777 == 0o600
    finally:
        reader.close(unlink=True)
        ring.close()


def test_prerendered_chunk_span_text_equals_generic_rendering():
    """The assembler's pre-rendered span JSON == the generic writer's over attrs, for
    every span kind the fast path renders (and the same observations either way)."""
    import copy
    rc = export_otlp.ResourceCache("r1")
    spans: list = []
    metrics = Metrics()
    asm = Assembler(spans.append, metrics)
    events = []
    t = 1000
    for q in ("A", 'q"\u00e9'):
        for c in range(2):
            for k in (Ev.SNAPSHOT_BEGIN, Ev.SNAPSHOT_END, Ev.FIFO_ENQUEUE, Ev.FIFO_DEQUEUE,
                      Ev.PROCESS_BEGIN, Ev.PROCESS_END, Ev.PUT_BEGIN, Ev.PUT_END):
                events.append((int(k), q, 0, c, 1024 if k != Ev.SNAPSHOT_END else 1, 1, t)); t += 10
            for k in (Ev.GET_BEGIN, Ev.GET_END, Ev.CHUNK_READY, Ev.CHUNK_SCHEDULED):
                events.append((int(k), q, 1, c, 512, 0, t)); t += 10
    _feed(asm, events)
    fast = [s for s in spans if s.text is not None]
    assert {s.name for s in fast} == {cv.SPAN_SNAPSHOT, cv.SPAN_FIFO, cv.SPAN_PROCESS,
                                      cv.SPAN_PUT, cv.SPAN_GET, cv.SPAN_WAIT_SCHEDULE,
                                      cv.SPAN_POLL}
    generic = []
    for s in fast:
        g = copy.copy(s)
        g.text = None
        generic.append(g)
    assert orjson.loads(rundir.spans_request_bytes(fast, rc.attrs)) == \
        orjson.loads(rundir.spans_request_bytes(generic, rc.attrs)) == \
        rundir.spans_request_json(generic, rc.attrs)
    asm2 = Assembler(lambda s: None, _Recorder())
    _feed(asm2, events)
    snap = {m: sorted((l, sum(c), round(s, 12)) for l, c, s, _ in metrics.hist.snapshot(m))
            for m in metrics.hist.children}
    other = {m: sorted((l, len(v), round(sum(v), 12)) for l, v in asm2.metrics.seen[m].items())
             for m in asm2.metrics.seen}
    assert {m: v for m, v in snap.items() if v} == other


class _Recorder:
    def __init__(self) -> None:
        self.seen: dict = {}

    def observe(self, metric, value, labels, trace_hex) -> None:
        self.seen.setdefault(metric, {}).setdefault(labels, []).append(value)


def test_spool_roundtrip_equals_read_batch(tmp_path):
    """Raw slots copied through the spool in random cuts (strings split across blocks,
    partial reads, truncation at catch-up) decode to exactly what read_batch gives."""
    import random
    from omnitrace.agent.spool import RECORDS, RingDecoder, Spool
    run = f"spool-{os.getpid()}"
    ring = record.Ring(run, record.ProcessInfo("stage", 0, 0, "x"), 1 << 16)
    twin = record.Ring(run + "b", record.ProcessInfo("stage", 0, 0, "x"), 1 << 16)
    raw_r, dec_r = record.RingReader(ring.name), record.RingReader(twin.name)
    sp, dec = Spool(str(tmp_path / "events.bin")), RingDecoder()
    rng = random.Random(1)
    want: list = []
    got: list = []
    try:
        for _ in range(300):
            for i in range(rng.randint(0, 50)):
                q = "req-" + "\u00e9" * rng.randint(0, 60) + str(rng.randint(0, 5000))
                ring.record(3, q, 1, i, i, 2, 1000 + i)
                twin.record(3, q, 1, i, i, 2, 1000 + i)
            want += dec_r.read_batch()
            sp.records(0, raw_r.read_raw(rng.randint(1, 40)))
            sp.commit()
            for kind, _, payload in sp.read_blocks(rng.randint(1, 3000)):
                assert kind == RECORDS
                got += dec.decode(payload)
        while True:
            raw = raw_r.read_raw(7)
            if not raw:
                break
            sp.records(0, raw)
            sp.commit()
        for _, _, payload in sp.read_blocks(1 << 30):
            got += dec.decode(payload)
        assert got == want and len(want) > 5000
        assert sp.truncations > 0 and ring._dropped == 0
    finally:
        sp.close()
        raw_r.close(unlink=True)
        dec_r.close(unlink=True)
        ring.close()
        twin.close()
