"""Attribution arithmetic on a hand-written three-stage trace (exact expected tiling).
`omnitrace report` run on it: tests/system/rules/test_attribution.py."""
from __future__ import annotations

from omnitrace.rules import attribution as at
from omnitrace.analyze.report import build_report
from omnitrace.analyze.chunkspans import request_spans
from omnitrace.analyze.rundir import load_run
from omnitrace.conventions import Ev
from tests.support.event_fixture import (CODEC_RECV, EXPECTED_US, TALKER, TALKER_SEND, US, three_stage_events,
                                         write_event_run)


def test_worked_example_tiles_exactly(tmp_path):
    """The example written into real rings, drained by the agent's Recorder into an event
    log, loaded and paired by the production path. The FIFO's blocked time is measured
    (another request's task holds the sender), not given."""
    run = load_run([write_event_run(str(tmp_path / "r"), three_stage_events("a"))])
    reqs = request_spans(run)
    a = at.attribute(reqs["a"])
    assert a is not None and a.missing == []
    assert a.ttfp_ns == 900 * US
    assert {k: v // US for k, v in a.totals().items()} == EXPECTED_US
    # segments tile [arrival, ttfp] with no gaps or overlaps
    segs = a.segments
    assert segs[0].start == a.arrival and segs[-1].end == a.ttfp
    assert all(x.end == y.start for x, y in zip(segs, segs[1:]))
    assert a.hops == [(0, 1, 0), (1, 2, 0)]


def _moved(events: list[tuple], ring: tuple, kind: Ev, stage: int, t_us: float) -> list[tuple]:
    """``events`` with chunk 0's ``kind`` event of ``stage`` on ``ring`` moved to ``t_us``."""
    return sorted(((*e[:7], t_us) if e[0] == ring and e[1] == kind and e[3] == stage and e[4] == 0 else e
                   for e in events), key=lambda e: e[7])


def test_overlap_is_clamped_and_gaps_become_remainder(tmp_path):
    # the talker's put of chunk 0 (320-330) ends 3 us after code2wav's get of it began (340)
    events = _moved(three_stage_events("b"), TALKER_SEND, Ev.PUT_END, 1, 343)
    run = load_run([write_event_run(str(tmp_path / "r"), events)])
    a = at.attribute(request_spans(run)["b"])
    assert sum(a.totals().values()) == a.ttfp_ns
    assert all(x.end == y.start for x, y in zip(a.segments, a.segments[1:]))


def test_report_aggregates_and_sum_error_zero(tmp_path):
    events = [e for i in range(1, 6) for e in three_stage_events(f"r{i}", off=i * 2000)]
    bench = {"requests": [{"id": f"r{i}", "warmup": i == 1, "ttfp_s": 0.0009 + 0.0001} for i in range(1, 6)]}
    rep = build_report(load_run([write_event_run(str(tmp_path / "r"), sorted(events, key=lambda e: e[7]),
                                                 bench=bench)]))
    assert rep["window"]["measured"] == 4 and rep["window"]["attributed"] == 4  # warm-up r1 excluded
    assert rep["ttfp"]["sum_error_max_ns"] == 0
    assert abs(rep["ttfp"]["client_minus_server_median_ms"] - 0.1) < 1e-6
    assert abs(sum(a["share"] for a in rep["attribution"]) - 1.0) < 1e-9
    blocked = [a for a in rep["attribution"] if a["category"] == "fifo_blocked"][0]
    assert abs(blocked["mean_ms"] - 0.030) < 1e-9
    # the requests never overlap in time: each waited only behind its own "other-" task,
    # the 30 us its thinker chunk 0 spent in the FIFO while the sender worked on that
    pairs = {(h["victim"], h["culprit"]): h["blocked_ms"] for h in rep["head_of_line"]}
    assert pairs.keys() == {(f"r{i}", f"other-r{i}") for i in range(2, 6)}
    assert all(abs(ms - 0.030) < 1e-9 for ms in pairs.values())
    assert {f["stage_id"] for f in rep["fifo"]} == {0, 1}


def _no_chunk_talker_task(rid: str, t: float) -> list[tuple]:
    """A talker task labelled with code2wav chunk 0 that wrote no chunk (process bytes 0):
    snapshot [t, t+1], FIFO [t+1, t+2], process [t+2, t+3]."""
    return [(TALKER, Ev.SNAPSHOT_BEGIN, rid, 1, 0, 0, 2, t), (TALKER, Ev.SNAPSHOT_END, rid, 1, 0, 0, 2, t + 1),
            (TALKER, Ev.FIFO_ENQUEUE, rid, 1, 0, 0, 2, t + 1),
            (TALKER_SEND, Ev.FIFO_DEQUEUE, rid, 1, 0, 0, 2, t + 2),
            (TALKER_SEND, Ev.PROCESS_BEGIN, rid, 1, 0, 0, 2, t + 2),
            (TALKER_SEND, Ev.PROCESS_END, rid, 1, 0, 0, 2, t + 3)]


def test_several_tasks_under_one_chunk_index_take_the_last(tmp_path):
    """The talker labels its no-chunk tasks with the next chunk's index: the walk must use
    the task that produced the chunk (latest before the put), not the first one."""
    # an earlier no-chunk talker task under codec chunk 0 (frame 1 of 4)
    events = sorted(three_stage_events("t") + _no_chunk_talker_task("t", 210), key=lambda e: e[7])
    run = load_run([write_event_run(str(tmp_path / "r"), events)])
    a = at.attribute(request_spans(run)["t"])
    assert {k: v // US for k, v in a.totals().items()} == EXPECTED_US


def test_only_no_chunk_task_recorded_is_flagged(tmp_path):
    """If the trace holds only a 0-byte (no-chunk) task under the index, the producing task
    is unrecorded: its time goes to the producer's compute and the hop is reported."""
    task = (Ev.SNAPSHOT_BEGIN, Ev.SNAPSHOT_END, Ev.FIFO_ENQUEUE, Ev.FIFO_DEQUEUE, Ev.PROCESS_BEGIN,
            Ev.PROCESS_END)
    events = [e for e in three_stage_events("u") if not (e[3] == 1 and e[1] in task)]  # the put is kept
    run = load_run([write_event_run(str(tmp_path / "r"), sorted(events + _no_chunk_talker_task("u", 210),
                                                                 key=lambda e: e[7]))])
    a = at.attribute(request_spans(run)["u"])
    assert a.unrecorded_tasks == [(1, 2, 0)] and "task[1->2#0]" in a.missing
    tot = {k: v // US for k, v in a.totals().items()}
    assert tot[(1, "compute")] == 120 and (1, "snapshot") not in tot  # [200, 320] up to the put
    assert sum(a.totals().values()) == a.ttfp_ns


def test_waterfall_marks_only_the_queues_the_critical_path_waited_in(tmp_path):
    bench = {"requests": [{"id": "a", "warmup": False, "ttfp_s": 0.001}]}
    rep = build_report(load_run([write_event_run(str(tmp_path / "r"), three_stage_events("a"), bench=bench)]))
    (wf,) = rep["waterfalls"]
    queues = {s[0]: s[5] for s in wf["spans"] if s[1] == "queue"}
    # the thinker's queue gates the request; the talker's and code2wav's wait for a chunk
    assert queues == {"0:thinker": True, "1:talker": False, "2:code2wav": False}
    assert {p[2] for p in wf["path"] if p[3] == "queue"} == {"0:thinker"}


def _get_overlapping_its_put(rid: str) -> list[tuple]:
    """The worked example with code2wav's get of talker chunk 0 entered before the talker's
    put began and left after it ended (a receiver thread descheduled inside a non-blocking
    get: seen on the real server), behind two earlier no-chunk talker tasks under the same
    chunk index, which finished before the get began."""
    out = []
    for e in three_stage_events(rid):
        ring, kind, _, stage, chunk = e[:5]
        if ring == CODEC_RECV and chunk == 0 and kind == Ev.GET_BEGIN:
            e = (*e[:7], 315)  # put: 320-330
        elif ring == CODEC_RECV and chunk == 0 and kind in (Ev.GET_END, Ev.CHUNK_READY):
            e = (*e[:7], 335)
        out.append(e)
    for t in (210, 250):
        out += _no_chunk_talker_task(rid, t)
    return sorted(out, key=lambda e: e[7])


def test_a_get_overlapping_its_put_takes_the_task_that_put_it(tmp_path):
    """The get is matched to the put it can have read (begun before the get ended) and the
    put to its own task (the sender's last process before it), not to whatever finished
    before the get began: no task is called unrecorded, and the overlap is the producer's."""
    bench = {"requests": [{"id": "o", "warmup": False, "ttfp_s": 0.001}]}
    run = load_run([write_event_run(str(tmp_path / "r"), _get_overlapping_its_put("o"), bench=bench)])
    a = at.attribute(request_spans(run)["o"])
    assert a.missing == [] and a.unrecorded_tasks == []
    tot = {k: v // US for k, v in a.totals().items()}
    # talker: snapshot 300-305, FIFO 305-310, process 310-320, put 320-330; code2wav's get
    # counts from the put's end (330-335), no poll lag
    assert (tot[(1, "snapshot")], tot[(1, "fifo_own")], tot[(1, "process")], tot[(1, "put")]) == (5, 5, 10, 10)
    assert tot[(2, "get")] == 5 and (2, "poll_lag") not in tot
    assert sum(a.totals().values()) == a.ttfp_ns
    (get,) = [s for s in a.segments if s.category == "get" and s.stage == 2]
    assert get.detail == "overlap" and get.start == a.arrival + 330 * US
    row = build_report(run)["requests"][0]  # the batch walk reads the same
    assert row["missing_spans"] == [] and row["unrecorded_tasks"] == []
    assert [s[4] for s in row["segments"] if s[3] == "get" and s[2] == "2:code2wav"] == ["overlap"]
