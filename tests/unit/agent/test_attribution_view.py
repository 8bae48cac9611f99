"""The live attribution view (omnitrace.agent.attribution_view) fed a hand-written run in
process. Against the report's walk on a real pipeline's run:
tests/system/agent/test_live_attribution.py."""
from __future__ import annotations


def test_a_load_that_starts_long_after_the_agent_is_attributed_live(tmp_path):
    """Issue 41: `top` read 64 attributed from the live endpoint and 80 from the run
    directory for one run. The agent's ticks fed the view from its start; a load that began
    more than NO_API_S later had its first feed taken for a run without API hooks, so its
    first requests' spans were never held and those requests stayed unattributed for good
    (the report, and `top` on the finished run, count them). Three requests, fed in one
    piece a minute after the agent's first (empty) tick, then a tick past SETTLE_MAX_S."""
    import numpy as np

    from omnitrace import eventlog
    from omnitrace.agent.attribution_view import AttributionView
    from omnitrace.agent.export_prometheus import Metrics
    from omnitrace.spanload import Part
    from omnitrace.spantable import SpanBuilder
    from tests.support.event_fixture import three_stage_events, write_event_run

    script = sorted((e for i in range(3) for e in three_stage_events(f"r{i}", off=i * 3000)),
                    key=lambda e: e[7])
    d = write_event_run(str(tmp_path / "run"), script)
    log = eventlog.read_event_log(d)
    builder = SpanBuilder(log.rings)
    builder.ring_changed()
    now = [0.0]
    view = AttributionView(Metrics(), log.requests.strings, log.rings, clock=lambda: now[0])
    seen = Part(log.rings, log.requests.strings)
    view.feed(builder.tick(now[0]), seen)  # the agent's first tick: no load yet
    now[0] = 2 * view.NO_API_S
    view.feed(builder.feed(np.sort(log.events, order="t", kind="stable"), now[0]), seen)
    now[0] += 2 * view.SETTLE_MAX_S
    view.feed(builder.tick(now[0]), seen)
    assert (view.attributed, len(view.arrived)) == (3, 0)
