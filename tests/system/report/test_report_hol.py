"""Head-of-line blocking in wall time, on a hand-built schedule: three chunks of one victim
wait in the thinker's FIFO at once while the sender works on two other requests' tasks.
The rule on random schedules, in process: tests/unit/rules/test_headofline.py."""
from __future__ import annotations

import json
import subprocess
import sys

from omnitrace.conventions import Ev, Modality
from tests.support.event_fixture import (API, TALKER, TALKER_RECV, THINKER, THINKER_SEND, chunk_events,
                                         write_event_run)


def _victim_events(chunks=((400, 420), (450, 470), (500, 600))) -> list[tuple]:
    """Victim v: arrival 0, first packet 1000 us; thinker chunks 0, 1, 2 wait in the FIFO
    over [101, 400], [111, 450], [121, 500]; the talker's gating chunk is 2. Recorded
    through the rings and the agent's recorder: the FIFO blocked time is the builder's,
    from the sender's real tasks."""
    out = [(API, Ev.REQUEST_ARRIVE, "v", -1, -1, 100, 50, 0),
           (THINKER, Ev.STAGE_ADD, "v", 0, -1, 0, 0, 10), (THINKER, Ev.STAGE_SCHEDULE, "v", 0, -1, 1, 0, 20),
           (TALKER, Ev.STAGE_ADD, "v", 1, -1, 0, 0, 15), (TALKER, Ev.STAGE_SCHEDULE, "v", 1, -1, 1, 0, 16),
           (TALKER, Ev.STAGE_EMIT, "v", 1, -1, 0, int(Modality.AUDIO), 900),
           (API, Ev.REQUEST_FIRST_AUDIO, "v", -1, -1, 0, 0, 1000),
           (THINKER, Ev.STAGE_FINISH, "v", 0, -1, 0, 0, 1900), (TALKER, Ev.STAGE_FINISH, "v", 1, -1, 0, 0, 1900),
           (API, Ev.REQUEST_END, "v", -1, -1, 0, 1234, 2000)]
    for c, (e, ws_end) in enumerate(chunks):
        s = 100 + 10 * c if c < 3 else 699
        chunk_events(out, "v", THINKER, THINKER_SEND, TALKER_RECV, TALKER, 0, 1, c, (s, s + 1), e,
                     (e, e + 5), (e + 5, e + 10), (e + 10, e + 12), ws_end)
    return out


def _culprit_events(rid: str, enq: float, deq: float, put_end: float) -> list[tuple]:
    """Another request's thinker task: the sender is busy with it over [deq, put_end]."""
    return [(THINKER, Ev.SNAPSHOT_BEGIN, rid, 0, 0, 0, 1, enq - 1), (THINKER, Ev.SNAPSHOT_END, rid, 0, 0, 0, 1, enq),
            (THINKER, Ev.FIFO_ENQUEUE, rid, 0, 0, 0, 1, enq), (THINKER_SEND, Ev.FIFO_DEQUEUE, rid, 0, 0, 0, 1, deq),
            (THINKER_SEND, Ev.PROCESS_BEGIN, rid, 0, 0, 0, 1, deq), (THINKER_SEND, Ev.PROCESS_END, rid, 0, 0, 1000, 1, deq + 10),
            (THINKER_SEND, Ev.PUT_BEGIN, rid, 0, 0, 0, 1, deq + 10), (THINKER_SEND, Ev.PUT_END, rid, 0, 0, 1000, 1, put_end)]


def _hol_run(path: str, culprits: list[tuple], extra_chunk: bool = False) -> str:
    """The victim and ``culprits`` ((rid, enqueue, dequeue, put end) us) as a run's event
    log; ``extra_chunk``: v's thinker chunk 3, in the FIFO over [700, 1200]."""
    script = _victim_events(((400, 420), (450, 470), (500, 600)) + (((1200, 1300),) if extra_chunk else ()))
    for c in culprits:
        script += _culprit_events(*c)
    return write_event_run(path, sorted(script, key=lambda e: e[7]))


def test_wall_time_is_the_union_split_among_culprits(tmp_path):
    # sender: x busy [150, 250], y busy [250, 380]; v's own tasks from 400 on
    d = _hol_run(str(tmp_path / "r"), [("x", 140, 150, 250), ("y", 145, 250, 380)])
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", d, "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    (req,) = rep["requests"]
    assert req["hops"] == ["0->1#2"] and abs(req["ttfp_ms"] - 1.0) < 1e-9
    pairs = {(h["victim"], h["culprit"]): h for h in rep["head_of_line"]}
    assert set(pairs) == {("v", "x"), ("v", "y")}
    # hand-computed: every chunk waited through both tasks; the moment counts once
    assert abs(pairs[("v", "x")]["blocked_ms"] - 0.100) < 1e-9
    assert abs(pairs[("v", "y")]["blocked_ms"] - 0.130) < 1e-9
    assert pairs[("v", "x")]["tasks"] == 1 and pairs[("v", "y")]["tasks"] == 1
    (victim,) = rep["head_of_line_victims"]
    assert abs(victim["blocked_ms"] - 0.230) < 1e-9 and victim["blocked_ms"] <= victim["ttfp_ms"]
    # the per-chunk sum, kept and labelled, counts the same 230 us three times
    assert abs(victim["chunk_time_sum_ms"] - 0.690) < 1e-9
    assert "never more than" in rep["head_of_line_note"]


def test_only_critical_path_waits_before_the_first_packet_count(tmp_path):
    """x keeps the sender busy before v's chunks exist, z while v's chunk 3 (after the gating
    chunk 2, not on the critical path) waits: neither blocked v's first packet."""
    d = _hol_run(str(tmp_path / "r"), [("x", 30, 40, 90), ("z", 790, 800, 1100)],
                 extra_chunk=True)
    rep = json.loads(subprocess.run([sys.executable, "-m", "omnitrace", "report", d, "--json"],
                                    capture_output=True, text=True, timeout=60).stdout)
    assert rep["requests"][0]["hops"] == ["0->1#2"]
    assert rep["head_of_line"] == [] and rep["head_of_line_victims"] == []
