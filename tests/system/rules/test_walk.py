"""The batch walk (rules/walk.py) against the reference walk (attribution.attribute),
request by request, on a real run and on that run's chunk spans perturbed every way the
rule has a branch for (missing spans, several tasks under one key, 0-byte tasks, ties,
gets overlapping their puts, table order); and the report made with it against the report made by the reference.
Its compact keys' limit: tests/unit/rules/test_walk.py."""
from __future__ import annotations

import copy

import numpy as np
import orjson
import pytest

from omnitrace import conventions as cv
from omnitrace import eventlog, otlp
from omnitrace import spantable as stt
from omnitrace.analyze import report
from omnitrace.analyze.chunkspans import chunk_rows, with_chunks
from omnitrace.analyze.rundir import load_run
from omnitrace.rules import attribution as at
from omnitrace.rules import walk
from omnitrace.rules.spanobjects import spans_from_tables


def _both(run, batch: int = 5) -> tuple[dict, dict]:
    """Every request's attribution by the reference walk (over span objects) and by the
    batch walk (over the request table and the chunk rows)."""
    table = run.request_table()
    rids = sorted(run.chunk_requests[i] for i in table.numbers().tolist())
    want = {r.rid: at.attribute(r) for r in with_chunks(run, rids)}
    got = {}
    for part, nums, rows, counts in chunk_rows(run, rids, batch):
        assert walk.fits(rows)
        wk = walk.walk(part, table, nums, rows, np.repeat(np.arange(len(part)), counts))
        got.update((rid, wk.attribution(i) if wk.ok[i] else None) for i, rid in enumerate(part))
    return want, got


def test_batch_walk_equals_the_reference_on_a_real_run(real_run):
    want, got = _both(load_run([real_run]))
    assert sum(a is not None for a in want.values()) >= 10
    assert any(len(a.hops) >= 2 for a in want.values() if a)
    assert got == want


def test_span_objects_carry_what_the_otlp_edge_says(real_run):
    """The typed fields of request and stage spans (what the walk reads) equal what the
    OTLP edge makes of the same rows: the status attribute, the first of each event, the
    first (audio) ``omni.emit``; and the run's stage names are the edge's."""
    log = eventlog.read_event_log(real_run)
    b = stt.SpanBuilder(dict(log.rings))
    b.ring_changed()
    feeds = [b.feed(log.events[np.argsort(log.events["t"], kind="stable")]), b.flush()]
    whole = stt.SpanTables.concat([f.spans for f in feeds])
    spans = stt.SpanTables(whole.requests, whole.visits, emits=whole.emits)
    ours = {(s.name, s.rid, s.stage, s.replica): s
            for s in spans_from_tables(spans, log.requests.strings)}
    edge = otlp.SpanConverter(log.requests.strings, log.rings).convert(spans)
    assert len(ours) == len(edge) == len(spans)

    def first(o, name: str, audio: bool = False) -> int | None:
        return min((t for n, t, a in o.events if n == name and (not audio or a.get(cv.ATTR_MODALITY) == "audio")),
                   default=None)
    for o in edge:
        a = o.attrs
        sp = ours[(o.name, a[cv.ATTR_REQUEST_ID], a.get(cv.ATTR_STAGE_ID, cv.API_STAGE), a[cv.ATTR_REPLICA])]
        if o.name == cv.SPAN_REQUEST:
            assert (sp.status, sp.ttfp, sp.parsed, sp.dispatched, sp.packet_received, sp.packet_resumed) == (
                a[cv.ATTR_STATUS], first(o, cv.EVENT_TTFP), first(o, cv.EVENT_API_PARSED),
                first(o, cv.EVENT_API_DISPATCHED), first(o, cv.EVENT_API_PACKET_RECEIVED),
                first(o, cv.EVENT_API_PACKET_RESUMED))
        else:
            assert cv.stage_names(log.rings)[sp.stage] == a[cv.ATTR_STAGE_NAME]
        if o.name == cv.SPAN_STAGE:
            assert sp.emit_firsts == (first(o, cv.EVENT_EMIT, audio=True), first(o, cv.EVENT_EMIT))
    stages = [s for s in ours.values() if s.name == cv.SPAN_STAGE]
    assert any(s.emit_firsts[0] is None and s.emit_firsts[1] is not None for s in stages)  # text
    assert any(s.emit_firsts[0] is not None for s in stages)  # audio
    requests = [s for s in ours.values() if s.name == cv.SPAN_REQUEST]
    assert all(s.ttfp and s.parsed and s.dispatched and s.packet_received and s.packet_resumed
               for s in requests)


def _perturbed(run, rng: np.random.Generator, how: str):
    early = run.early.copy()
    n = len(early)
    if how == "drop":  # missing spans of every kind, whole hops missing
        early = early[rng.random(n) > 0.2]
    elif how == "duplicate":  # several tasks under one key, some ending later, some ties
        extra = early[rng.integers(0, n, n // 3)].copy()
        shift = rng.integers(-3, 4, len(extra)) * rng.integers(0, 2_000_000, len(extra))
        extra["start"] += shift
        extra["end"] = np.maximum(extra["start"], extra["end"] + shift * rng.integers(0, 2, len(extra)))
        early = np.concatenate((early, extra))
    elif how == "zero-bytes":  # 0-byte tasks (the producing task unrecorded), 0-byte puts
        zero = rng.random(n) < 0.3
        early["figure"] = np.where(zero & np.isin(early["name"], (stt.N_PROCESS, stt.N_PUT)), 0, early["figure"])
    elif how == "jitter":  # overlaps clamped, gaps, spans past the cursor, equal ends
        j = rng.integers(-2_000_000, 2_000_000, n)
        early["end"] = np.where(rng.random(n) < 0.1, early["start"], early["end"] + j)
        early["start"] = np.minimum(early["start"] + rng.integers(-1_000_000, 1_000_000, n), early["end"])
        early["reason"] = np.where(rng.random(n) < 0.05, 1, early["reason"])
        early["blocked"] = np.where(rng.random(n) < 0.3, rng.integers(0, 10_000_000, n), early["blocked"])
    elif how == "early-get":  # gets entered before their put began or ended (a receiver
        # thread descheduled in a non-blocking get): matched to their put by causality
        get = early["name"] == stt.N_GET
        early["start"] = np.where(get & (rng.random(n) < 0.5), early["start"] - rng.integers(0, 5_000_000, n),
                                  early["start"])
    elif how == "cycle":  # stage loops: a hop key met again, the hop limit reached
        wait = early["name"] == stt.N_WAIT
        early["peer"] = np.where(wait & (rng.random(n) < 0.5), early["stage"], early["peer"])
        early["chunk"] = np.where(wait, early["chunk"] % 3, early["chunk"])
    early = early[rng.permutation(len(early))] if how != "jitter" else early  # table order
    out = copy.copy(run)
    out.early = early
    rs = run.request_spans
    if how == "drop":  # no queue span (compute from the stage's start), no stage span (no
        # emit, the walk stops unwalked), no API mark
        marks = rs.emits["modality"] == stt.MARK_MODALITY
        out.request_spans = stt.SpanTables(rs.requests, rs.visits[rng.random(len(rs.visits)) > 0.3],
                                           emits=rs.emits[~marks | (rng.random(len(marks)) > 0.3)])
    elif how == "duplicate":  # repeated request and visit spans, moved: the last counts
        def again(rows: np.ndarray) -> np.ndarray:
            extra = rows[rng.integers(0, len(rows), len(rows) // 3)].copy()
            shift = rng.integers(-3, 4, len(extra)) * rng.integers(0, 2_000_000, len(extra))
            extra["start"] += shift
            extra["end"] += shift
            return np.concatenate((rows, extra))
        out.request_spans = stt.SpanTables(again(rs.requests), again(rs.visits), emits=rs.emits)
    return out


@pytest.mark.parametrize("how", ["drop", "duplicate", "zero-bytes", "jitter", "early-get", "cycle"])
def test_batch_walk_equals_the_reference_on_perturbed_spans(real_run, how):
    run = load_run([real_run])
    rng = np.random.default_rng(len(how))
    for _ in range(3):
        want, got = _both(_perturbed(run, rng, how), batch=int(rng.integers(1, 8)))
        assert got == want


def test_report_by_the_batch_walk_equals_the_report_by_the_reference(real_run, monkeypatch):
    """Rows, totals, waterfalls, head-of-line pairs: the same report either way."""
    fast = report.build_report(load_run([real_run]), waterfalls=3)
    monkeypatch.setattr(walk, "fits", lambda rows: False)  # every batch by the reference
    ref = report.build_report(load_run([real_run]), waterfalls=3)
    assert fast["window"]["attributed"] >= 10 and fast["head_of_line"]
    assert orjson.dumps(fast) == orjson.dumps(ref)  # the JSON's order too
