"""The report opens with the answer: requests and losses, TTFP p50/p99, the top causes,
in the console's first lines (the HTML page's first screen: tests/system/report/test_report_pipeline.py)."""
from __future__ import annotations

import pytest

from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import load_run
from omnitrace.render.console import render
from omnitrace.render.headline import headline, top_causes
from tests.support.event_fixture import three_stage_events, write_event_run

@pytest.fixture
def rep(tmp_path):
    ids = [f"r{i}" for i in range(5)]
    bench = {"requests": [{"id": r, "warmup": r == "r0", "ttfp_s": 0.001 + i * 1e-4}
                          for i, r in enumerate(ids)]}
    events = [e for i, r in enumerate(ids) for e in three_stage_events(r, off=i * 2000)]
    return build_report(load_run([write_event_run(str(tmp_path / "r"), events, bench=bench)]))


def test_the_three_lines_say_what_the_report_says(rep):
    requests, ttfp, causes = headline(rep)
    w, s, c = rep["window"], rep["ttfp"]["server_ms"], rep["ttfp"]["client_ms"]
    assert requests == (f"{w['measured']} requests measured, {w['attributed']} attributed, "
                        "0 failed; all events recorded") and w["measured"] == 4
    assert ttfp == (f"TTFP p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms (server); "
                    f"client p50 {c['p50']:.1f} ms, p99 {c['p99']:.1f} ms")
    top = top_causes(rep)
    assert [a["share"] for a in top] == sorted((a["share"] for a in rep["attribution"]), reverse=True)[:3]
    # the worked example: code2wav computes 450 of the 900 us, the talker 100, the API delivers 100
    assert causes.startswith("Where TTFP went: 50.0% code2wav compute, ")
    assert render(rep).splitlines()[:3] == headline(rep)  # (a drop warning would come first)


def test_losses_and_no_first_packet_are_in_the_first_line(rep):
    rep["recorder"]["accounting"].update(events_written=1000, recorded=990)
    rep["window"]["no_first_packet"] = 2
    assert headline(rep)[0].endswith("2 without a first audio packet; 10 of 1000 events not in the record")


def test_per_request_columns_line_up(rep):
    text = render(rep)
    lines = text[text.index("Per request critical path"):].splitlines()[1:]
    head, rows = lines[0], [x for x in lines[2:] if x.strip()]
    starts = [head.index(h) for h in ("#1", "#2", "#3")]  # the causes' labels: left-aligned
    for row in rows:
        assert all(row[s - 2:s] == "  " and row[s] != " " for s in starts), (head, row)
