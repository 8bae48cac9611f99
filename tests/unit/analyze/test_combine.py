"""Several run directories in one report (replicas behind a load balancer, repeated runs):
each request's attribution is the one its own directory gives."""
from __future__ import annotations

from omnitrace.analyze.chunkspans import request_spans
from omnitrace.analyze.rundir import load_run
from omnitrace.rules import attribution as at
from tests.support.event_fixture import three_stage_events, write_event_run


def _attributions(run) -> dict:
    return {rid: at.attribute(spans).totals() for rid, spans in request_spans(run).items()}


def test_two_runs_with_other_requests_keep_each_requests_attribution(tmp_path):
    """The second directory's request ids are renumbered into the first's list: its chunk
    rows (the early rows the walk reads) follow, so each request walks its own spans."""
    a = write_event_run(str(tmp_path / "a"), three_stage_events("a"))
    b = write_event_run(str(tmp_path / "b"), three_stage_events("b", off=5000.0))
    alone = {**_attributions(load_run([a])), **_attributions(load_run([b]))}
    both = load_run([a, b])
    assert both.chunk_requests[1:] == ["a", "other-a", "b", "other-b"]
    assert _attributions(both) == alone and {"a", "b"} <= set(alone)
