"""The vectorised span builder (omnitrace.spantable) against the per-event Python
reference (tests/support/reference_assembler.py, the previous agent's assembler),
and the report over the same run. On hand-written feeds: tests/unit/test_spantable.py."""
from __future__ import annotations

import numpy as np

from omnitrace import conventions as cv
from omnitrace import eventlog, otlp
from omnitrace import spantable as stt
from tests.support.reference_assembler import Assembler
from tests.support.report_util import report_json, rewrite_event_log


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
        out += conv.convert(f.spans)
    for idx in log.died:
        b.process_died(log.rings[idx]["pid"])
    f = b.flush()
    out += conv.convert(f.spans)
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


def test_walk_over_lazy_chunk_indexes_equals_walk_over_objects(real_run):
    """The report walks each request over lazy chunk indexes (Span objects only for the
    hops it reads); every request's attribution equals the walk over all its chunk spans
    as objects."""
    from omnitrace.analyze.chunkspans import request_spans, with_chunks
    from omnitrace.analyze.rundir import load_run
    from omnitrace.rules import attribution as at
    run = load_run([real_run])
    want = {rid: at.attribute(r) for rid, r in request_spans(run).items()}
    got = {r.rid: at.attribute(r) for r in with_chunks(run, sorted(want), batch=3)}
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
