"""`omnitrace top` on a finished run: the report's whole window (same requests, TTFP and
attribution), stage names, and every section on an 80x24 terminal. In-process; the real
terminal: tests/system/cli/test_top.py."""
from __future__ import annotations

from collections import deque

import pytest

from omnitrace.agent import promproto
from omnitrace.agent.export_prometheus import Metrics
from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import load_run
from omnitrace.cli.top import render
from omnitrace.top import model, source
from tests.support.event_fixture import three_stage_events, write_event_run

HISTORY = {"rate": deque(), "ttfp_p99": deque()}


@pytest.fixture
def rep(tmp_path):
    ids = [f"r{i}" for i in range(6)]
    events = [e for i, r in enumerate(ids) for e in three_stage_events(r, off=i * 300)]
    bench = {"requests": [{"id": r, "warmup": False, "ttfp_s": 0.001} for r in ids]}
    return build_report(load_run([write_event_run(str(tmp_path / "r"), events, bench=bench)]))


def test_the_whole_run_as_the_report_has_it(rep):
    v = model.from_report(rep, "RUN")
    assert v.finished == rep["window"]["measured"] == 6 and v.attributed == 6
    assert v.ttfp == (rep["ttfp"]["server_ms"]["p50"] / 1e3, rep["ttfp"]["server_ms"]["p99"] / 1e3)
    assert [(a[0], a[1]) for a in v.attribution][:3] == [
        (a["stage"], a["category"]) for a in sorted(rep["attribution"], key=lambda a: -a["share"])[:3]]
    assert set(v.fifo) == {"0:thinker", "1:talker"}  # names, not numbers
    text = render(v, HISTORY, 120)
    assert "whole run" in text and "p50      0.9 ms" in text


def test_it_fits_80x24_with_every_section(rep):
    text = render(model.from_report(rep, "/some/run/dir"), HISTORY, 80, 22)
    lines = text.splitlines()
    assert len(lines) <= 22 and all(len(x) <= 80 for x in lines)
    for section in ("omnitrace top", "TTFP      p50", "Where TTFP goes", "FIFO residence per stage",
                    "Head-of-line", "recorder: events"):
        assert any(x.startswith(section) for x in lines), (section, text)
    assert sum(1 for x in lines if "█" in x) >= 3  # the top causes are still listed


def test_the_endpoint_alone_still_shows_the_head_of_line_leaders():
    """A URL source has no agent.json: the leaderboard comes from the endpoint's gauge
    (blocked time per culprit, largest first; the victims' count is agent.json's only)."""
    m = Metrics()
    m.set_culprits([{"culprit": "req-big", "blocked_s": 0.250, "victims": 3},
                    {"culprit": "req-small", "blocked_s": 0.004, "victims": 1}])
    body, _ = m.exposition(promproto.CONTENT_TYPE)
    v = model.build(source.parse_protobuf(body, 1.0), None, "http://127.0.0.1:9464/metrics")
    assert [(c["culprit"], c["blocked_s"]) for c in v.culprits] == [("req-big", 0.25), ("req-small", 0.004)]
    text = render(v, HISTORY, 100)
    assert "req-big" in text and "250.00 ms" in text and "(none yet" not in text
