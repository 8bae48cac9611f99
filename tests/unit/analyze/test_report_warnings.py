"""The report's warnings (omnitrace.analyze.report_warnings) on a hand-written run, in
process: a request id sent twice is named. `omnitrace report` on bad input:
tests/system/report/test_report_bad_input.py."""
from __future__ import annotations

from tests.support.event_fixture import three_stage_events, write_event_run


def test_one_request_id_sent_twice_is_named(tmp_path):
    """Issue 41: a client that sends one x-request-id twice got one trace and no word. The
    span builder, where ids join events into requests, counts the repeated arrival; the
    report names the id."""
    from omnitrace.analyze.report import build_report
    from omnitrace.analyze.rundir import load_run
    once = three_stage_events("r1", off=20_000)
    twice = three_stage_events("r0") + three_stage_events("r0", off=10_000) + once
    for script, said in ((once, 0), (twice, 1)):
        d = write_event_run(str(tmp_path / str(said)), sorted(script, key=lambda e: e[7]))
        lines = [w for w in build_report(load_run([d]), waterfalls=0)["warnings"] if "more than once" in w]
        assert len(lines) == said, lines
    assert lines[0].startswith("1 request id(s) arrived more than once ('r0' 2x)"), lines
