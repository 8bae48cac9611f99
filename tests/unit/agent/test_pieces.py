"""Unit checks of the agent's pieces on real inputs (real rings, real zstd segments,
the real official encoder). The event log's round trip in random cuts:
tests/system/test_eventlog.py."""
from __future__ import annotations

import os

import numpy as np
import orjson
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from omnitrace import conventions as cv
from omnitrace import eventlog, otlp, record, rowops, spanload
from omnitrace import spantable as stt
from omnitrace.agent import export_otlp
from omnitrace.agent.export_prometheus import Metrics
from omnitrace.agent import views
from omnitrace.agent.views import MetricsView
from omnitrace.conventions import Ev
from omnitrace.eventlog import EVENT_DTYPE


def _official_json(spans: list, rc: export_otlp.ResourceCache) -> dict:
    """The official path: SDK ReadableSpans -> protobuf encoder -> json_format, ids to hex."""
    d = MessageToDict(encode_spans([export_otlp.to_readable(s, rc) for s in spans]),
                      use_integers_for_enums=True)
    import base64
    for rs in d["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = base64.b64decode(sp[k]).hex()
    return d


def test_otlp_json_equals_official_encoder_output():
    rc = export_otlp.ResourceCache("r1")
    spans = [otlp.OtlpSpan(cv.SPAN_FIFO, 123456789, 42, 7, 1000, 2000,
                           {"s": 'x"q\\\n\u00e9', "i": 3, "arr": ["q", "r"], "empty": [], "b": True,
                            "f": 1.5, "neg": -4}, (1, "stage", 0, 0, "thinker"),
                           [(cv.EVENT_EMIT, 1500, {cv.ATTR_PACKET_INDEX: 1})], False),
             otlp.OtlpSpan(cv.SPAN_REQUEST, 123456789, 7, None, 900, 3000, {"a": "y"},
                           (2, "api", -1, 0, "api"), (), True)]
    official = _official_json(spans, rc)
    assert orjson.loads(otlp.encode_json(spans, rc.attrs)) == official
    assert official["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] == f"{123456789:032x}"


RINGS = {0: {"pid": 1, "replica": 0, "role": "api", "stage": -1, "process": "api"},
         1: {"pid": 2, "replica": 0, "role": "stage", "stage": 0, "process": "thinker"}}


def _ev(rows: list[tuple]) -> np.ndarray:
    """rows of (kind, req, stage, chunk, a, b, t, ring)."""
    a = np.zeros(len(rows), EVENT_DTYPE)
    for i, (kind, req, stage, chunk, x, y, t, ring) in enumerate(rows):
        a[i] = (t, x, req, chunk, kind, stage, y, ring)
    return a


def test_request_state_is_freed_and_incomplete_spans_flushed():
    b = stt.SpanBuilder(dict(RINGS))
    b.ring_changed()
    metrics = Metrics()
    view = MetricsView(metrics, [f"r{i}" for i in range(102)])
    rows = []
    for r in range(1, 101):
        rows += [(Ev.REQUEST_ARRIVE, r, -1, -1, 10, 5, 0, 0), (Ev.REQUEST_FIRST_AUDIO, r, -1, -1, 0, 0, 5, 0),
                 (Ev.REQUEST_END, r, -1, -1, 0, 0, 9, 0), (Ev.STAGE_ADD, r, 0, -1, 0, 0, 1, 1),
                 (Ev.STAGE_SCHEDULE, r, 0, -1, 0, 0, 2, 1), (Ev.STAGE_FINISH, r, 0, -1, 0, 0, 8, 1)]
    rows += [(Ev.REQUEST_ARRIVE, 101, -1, -1, 10, 5, 0, 0), (Ev.SNAPSHOT_BEGIN, 101, 0, 3, 0, 1, 4, 1)]
    spans = []
    f = b.feed(_ev(rows), now=0.0)
    view.feed(f, spanload.Part({}, []))
    spans.append(f.spans)
    assert b.open_requests() == 101
    spans.append(b.tick(2.0, grace_s=1.0, idle_timeout_s=10.0).spans)
    assert b.states.live() == [101]  # completed requests freed after the grace period
    spans.append(b.tick(20.0, grace_s=1.0, idle_timeout_s=10.0).spans)
    assert not b.states.live()  # the idle one freed too, its open spans flushed with the reason
    allspans = stt.SpanTables.concat(spans).slices()
    inc = allspans[allspans["reason"] != 0]
    assert sorted(stt.NAMES[n] for n in inc["name"]) == sorted([cv.SPAN_SNAPSHOT, cv.SPAN_REQUEST])
    assert {stt.REASONS[r] for r in inc["reason"]} == {"timeout"}
    assert (allspans["name"] == stt.N_REQUEST).sum() == 101
    ttfp = metrics.hist.snapshot(cv.METRIC_TTFP)
    assert sum(ttfp[0][1]) == 100


def test_sender_busy_seconds_are_the_tasks_the_sender_closed():
    """Two chunk tasks on the thinker's sender (dequeue -> put end: 30 and 50 ns) and one
    still running at the feed's end: the counter holds the two, by stage and replica."""
    rings = {**RINGS, 2: {"pid": 2, "replica": 1, "role": "stage", "stage": 0, "process": "thinker"}}
    b = stt.SpanBuilder(dict(rings))
    b.ring_changed()
    metrics = Metrics()
    view = MetricsView(metrics, [f"r{i}" for i in range(4)])
    rows = []
    for req, (deq, end) in enumerate(((1000, 1030), (1040, 1090), (1100, None)), 1):
        rows += [(Ev.FIFO_ENQUEUE, req, 0, 0, 0, 1, 900, 1), (Ev.FIFO_DEQUEUE, req, 0, 0, 0, 1, deq, 2),
                 (Ev.PROCESS_BEGIN, req, 0, 0, 0, 1, deq, 2), (Ev.PROCESS_END, req, 0, 0, 10, 1, deq + 5, 2)]
        if end is not None:
            rows += [(Ev.PUT_BEGIN, req, 0, 0, 0, 1, deq + 5, 2), (Ev.PUT_END, req, 0, 0, 10, 1, end, 2)]
    f = b.feed(_ev(sorted(rows, key=lambda r: r[6])), now=0.0)
    view.feed(f, spanload.Part(rings, []))
    got = metrics.registry.get_sample_value("omnitrace_sender_busy_seconds_total", {"stage": "0", "replica": "1"})
    assert got == pytest.approx(80e-9)


def test_metrics_view_fills_what_one_observation_per_span_would():
    """The view's grouped, vectorised path against the rule applied span by span: every
    complete chunk span with a histogram, its labels, value and exemplar (the last one per
    bucket)."""
    rng = np.random.default_rng(11)
    n = 5000
    spans = np.zeros(n, stt.CHUNK_DTYPE)
    spans["name"] = rng.integers(stt.N_SNAPSHOT, len(stt.NAMES), n)
    spans["stage"], spans["peer"] = rng.integers(0, 3, n), rng.integers(0, 3, n)
    spans["replica"], spans["req"] = rng.integers(0, 2, n), rng.integers(0, 50, n)
    spans["reason"] = np.where(rng.random(n) < 0.1, stt.R_TIMEOUT, 0)
    spans["start"] = rng.integers(0, 10**9, n)
    spans["end"] = spans["start"] + rng.lognormal(12, 2, n).astype(np.int64)
    spans["figure"], spans["blocked"] = rng.integers(0, 1 << 20, n), rng.integers(0, 10**6, n)
    requests = [f"r{i}" for i in range(50)]
    fast, ref = Metrics(), Metrics()
    MetricsView(fast, requests).feed(stt.Feed(stt.SpanTables(chunks=spans)), spanload.Part({}, requests))
    trace_hex = views.TraceIds(requests)
    for row in spans[(spans["reason"] == 0) & np.isin(spans["name"], list(views._CHUNK_METRICS))]:
        name, stage, peer, replica = (int(row[c]) for c in ("name", "stage", "peer", "replica"))
        src, dst = (stage, peer) if name in stt.PRODUCER_NAMES else (peer, stage)
        for metric, col, scale, exemplar in views._CHUNK_METRICS[name]:
            value = ((int(row["end"]) - int(row["start"])) * scale if col is None
                     else float(int(row["figure"]) + 1) if col == "depth" else int(row[col]) * scale)
            ref.observe(metric, value, (str(stage), str(replica), str(src), str(dst)),
                        trace_hex(int(row["req"])) if exemplar else None)
    for metric in {m for specs in views._CHUNK_METRICS.values() for m, *_ in specs}:
        got = {s.labels: s for s in fast.hist.snapshot(metric)}
        want = {s.labels: s for s in ref.hist.snapshot(metric)}
        assert got.keys() == want.keys() and want
        for labels, w in want.items():
            g = got[labels]
            assert (g.counts, g.native, g.zeros) == (w.counts, w.native, w.zeros)
            assert g.sum == pytest.approx(w.sum, rel=1e-12)
            assert [e and e[:2] for e in g.exemplars] == [e and e[:2] for e in w.exemplars]


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


def _small_log(tmp_path, n: int = 3000, **kw) -> eventlog.EventLogWriter:
    run = f"elog2-{os.getpid()}"
    ring = record.Ring(run, record.ProcessInfo("stage", 0, 0, "x"), 1 << 14)
    reader = record.RingReader(ring.name)
    w = eventlog.EventLogWriter(str(tmp_path), run, offset_ns=0, **kw)
    dec = record.SlotDecoder(record.RequestIds())
    w.ring(0, {"pid": 1, "replica": 0})
    try:
        for i in range(n):
            ring.record(Ev.FIFO_ENQUEUE, f"r{i % 50}", 0, i, i, 1)
            if i % 100 == 99:
                raw = reader.read_raw()
                w.records(0, raw, len(dec.decode(raw)))
                w.commit({0: dec.strings})
    finally:
        reader.close(unlink=True)
        ring.close()
    return w


def test_blocks_cut_anywhere_between_inflated_pieces_decode_the_same(tmp_path):
    """The reader inflates a segment a slice at a time, and zstd hands out whole zstd
    blocks: a segment re-compressed with a zstd block ending every few bytes cuts block
    headers and payloads at every place; it decodes to the same events."""
    import zstandard
    _small_log(tmp_path / "a", n=5000).close()
    path = eventlog.segments(str(tmp_path / "a"))[0]
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(open(path, "rb").read())
    want = eventlog.read_event_log(str(tmp_path / "a"))
    for step in (5, 13, 4099):
        cobj = zstandard.ZstdCompressor().compressobj()
        data = b"".join(cobj.compress(raw[i:i + step]) + cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
                        for i in range(0, len(raw), step)) + cobj.flush()
        os.makedirs(tmp_path / str(step) / "events")
        (tmp_path / str(step) / "events" / os.path.basename(path)).write_bytes(data)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(eventlog, "INFLATE_BYTES", 64)
            got = eventlog.read_event_log(str(tmp_path / str(step)))
        assert len(want.events) == 5000 and not got.warnings and got.torn_records == 0
        assert (got.events == want.events).all()


def test_torn_last_segment_loses_only_its_torn_records(tmp_path):
    w = _small_log(tmp_path)
    w.close()
    path = eventlog.segments(str(tmp_path))[-1]
    data = open(path, "rb").read()
    full = eventlog.read_event_log(str(tmp_path))
    assert len(full.events) == 3000 and full.torn_records == 0
    with open(path, "wb") as f:
        f.write(data[:len(data) - 200])  # the writer killed mid-write
    torn = eventlog.read_event_log(str(tmp_path))
    assert 0 < len(torn.events) < 3000
    assert len(torn.events) + torn.torn_records <= 3000
    assert torn.warnings and "ends early" in torn.warnings[0] and torn.torn_segments == 1 and torn.last_torn


def test_corrupt_segment_is_one_clear_error(tmp_path):
    w = _small_log(tmp_path)
    w.close()
    path = eventlog.segments(str(tmp_path))[-1]
    data = bytearray(open(path, "rb").read())
    data[10:40] = b"\xff" * 30
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(eventlog.EventLogError, match="corrupt"):
        eventlog.read_event_log(str(tmp_path))


def test_max_bytes_stops_recording_and_counts_exactly(tmp_path):
    w = _small_log(tmp_path, n=20000, max_bytes=2000)
    w.close()
    c = w.counters()
    assert c["capped"] and c["events_not_recorded"] > 0
    assert c["events_recorded"] + c["events_not_recorded"] == 20000
    log = eventlog.read_event_log(str(tmp_path))
    assert len(log.events) == c["events_recorded"]


def test_orphan_stamps_leave_after_the_idle_timeout():
    """A begin whose request has no request/stage state (an adapter-only run) does not
    wait forever: it is emitted incomplete ("timeout") once the run is idle_timeout past it."""
    b = stt.SpanBuilder(dict(RINGS))
    b.ring_changed()
    b.feed(_ev([(Ev.SNAPSHOT_BEGIN, 5, 0, 0, 0, 1, 1_000, 1)]), now=0.0)
    assert not len(b.tick(1.0, idle_timeout_s=120.0).spans)
    b.feed(_ev([(Ev.SNAPSHOT_BEGIN, 6, 0, 0, 0, 1, 200 * 10**9, 1),
                (Ev.SNAPSHOT_END, 6, 0, 0, 0, 1, 200 * 10**9 + 5, 1)]), now=2.0)
    out = b.tick(3.0, idle_timeout_s=120.0).spans.slices()
    assert [(int(r["req"]), stt.REASONS[r["reason"]]) for r in out] == [(5, "timeout")]
    assert b.state_size()["waiting_stamps"] == 0


def _long_wait(n_tasks: int) -> np.ndarray:
    """Request 1's chunk 1 waits in the thinker's FIFO while the sender sends request 1's
    chunk 0 (its own task, [100, 105]) and then ``n_tasks`` tasks of request 2 (5 ns each)."""
    rings = 2
    rows = [(Ev.FIFO_ENQUEUE, 1, 0, 0, 0, 1, 0, rings), (Ev.FIFO_ENQUEUE, 1, 0, 1, 1, 1, 1, rings),
            (Ev.FIFO_DEQUEUE, 1, 0, 0, 0, 1, 100, rings), (Ev.PUT_END, 1, 0, 0, 64, 1, 105, rings)]
    for i in range(n_tasks):
        rows += [(Ev.FIFO_ENQUEUE, 2, 0, i, 0, 1, 108 + 10 * i, rings), (Ev.FIFO_DEQUEUE, 2, 0, i, 0, 1, 110 + 10 * i, rings),
                 (Ev.PUT_END, 2, 0, i, 64, 1, 115 + 10 * i, rings)]
    end = 110 + 10 * n_tasks
    rows += [(Ev.FIFO_DEQUEUE, 1, 0, 1, 0, 1, end, rings), (Ev.PUT_END, 1, 0, 1, 64, 1, end + 5, rings)]
    ev = _ev(rows)
    return ev[np.argsort(ev["t"], kind="stable")]


@pytest.mark.parametrize("cuts", [1, 40])
def test_fifo_blocked_counts_every_task_waited_behind(cuts):
    """blocked_ns of a FIFO wait behind 40,000 other tasks: all of them, in one feed (the
    report) as in many (live); the request's own task in the wait is not blocking."""
    rings = dict(RINGS)
    rings[2] = {"pid": 2, "replica": 0, "role": "stage", "stage": 0, "process": "thinker"}
    b = stt.SpanBuilder(rings)
    b.ring_changed()
    spans = [b.feed(part).spans for part in np.array_split(_long_wait(40_000), cuts)]
    spans.append(b.flush().spans)
    s = stt.SpanTables.concat(spans).chunks
    (fifo,) = s[(s["name"] == stt.N_FIFO) & (s["req"] == 1) & (s["chunk"] == 1)]
    assert fifo["blocked"] == 40_000 * 5
    assert fifo["by0"] == 2 and fifo["by1"] == 0


@pytest.mark.parametrize("values", [[], [7], [3, -2, 3, 0, -2, 65535], [5, 1 << 40, 5, -(1 << 33)],
                                    [(i % 13) << 30 for i in range(100)]],
                         ids=["empty", "one", "narrow with negatives", "wide, few: peeled",
                              "wide, many: the sort"])
def test_distinct_equals_numpy_unique(values) -> None:
    """rowops.distinct (a count per value over a narrow range, few wide values peeled off)
    lists what np.unique lists, for every dtype the report and the builder pass it."""
    for dtype in (np.int64, np.int32, np.int16, np.uint32):
        if values and (min(values) < np.iinfo(dtype).min or max(values) > np.iinfo(dtype).max):
            continue
        a = np.array(values, dtype)
        assert rowops.distinct(a) == np.unique(a).tolist()
