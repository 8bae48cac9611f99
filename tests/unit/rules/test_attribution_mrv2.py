"""A request on Model Runner V2 with talker-first audio, recorded as the MRv2 hooks record
it (patches/vllm_omni/mrv2.py): each stage's chunks leave through the worker's output
queue (enqueued by the model thread, dequeued, snapshotted and built by the output worker,
put by the save thread), and the Talker delivers the first audio packet itself, before
Code2Wav's. The report attributes it from the Talker's packet back, categories summing to
its TTFP exactly, with Code2Wav off its critical path."""
from __future__ import annotations


from omnitrace.analyze.chunkspans import request_spans
from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import load_run
from omnitrace.conventions import Ev, Modality
from omnitrace.rules import attribution as at
from tests.support.event_fixture import API, US, write_event_run

AUDIO = int(Modality.AUDIO)


def _ring(stage: int, thread: str) -> tuple:
    return ("stage", stage, thread)


def _mrv2_chunk(script: list, rid: str, p: int, c: int, enq: float, deq: float, snap: tuple, proc: tuple,
                put: tuple, get: tuple, scheduled: float) -> None:
    """One chunk p -> c over MRv2's native data plane, each event on the thread that records it."""
    model, worker, save = _ring(p, "model"), _ring(p, f"omni-native-output-{p}"), _ring(p, "omni-mixin-save")
    recv, sched = _ring(c, "omni-mixin-recv"), _ring(c, "scheduler")
    script += [
        (model, Ev.FIFO_ENQUEUE, rid, p, 0, 0, c, enq),
        (worker, Ev.FIFO_DEQUEUE, rid, p, 0, 0, c, deq),
        (worker, Ev.SNAPSHOT_BEGIN, rid, p, 0, 0, c, snap[0]),
        (worker, Ev.SNAPSHOT_END, rid, p, 0, 0, c, snap[1]),
        (worker, Ev.PROCESS_BEGIN, rid, p, 0, 0, c, proc[0]),
        (worker, Ev.PROCESS_END, rid, p, 0, 1000, c, proc[1]),
        (save, Ev.PUT_BEGIN, rid, p, 0, 0, c, put[0]),
        (save, Ev.PUT_END, rid, p, 0, 1000, c, put[1]),
        (recv, Ev.GET_BEGIN, rid, c, 0, 0, p, get[0]),
        (recv, Ev.GET_END, rid, c, 0, 1000, p, get[1]),
        (recv, Ev.CHUNK_READY, rid, c, 0, 0, p, get[1]),
        (sched, Ev.CHUNK_SCHEDULED, rid, c, 0, 0, p, scheduled),
    ]


def talker_first_events(rid: str) -> list[tuple]:
    s = [(API, Ev.REQUEST_ARRIVE, rid, -1, -1, 100, 50, 0)]
    for stage, add in ((0, 10), (1, 30), (2, 32)):  # the orchestrator's prewarm adds them all
        s += [(_ring(stage, "scheduler"), Ev.STAGE_ADD, rid, stage, -1, 0, 0, add),
              (_ring(stage, "scheduler"), Ev.STAGE_SCHEDULE, rid, stage, -1, 1, 0, add + 10)]
    _mrv2_chunk(s, rid, 0, 1, 100, 150, (150, 155), (155, 165), (170, 180), (185, 190), 200)
    s.append((_ring(1, "omni-first-audio-sender"), Ev.STAGE_EMIT, rid, 1, -1, 0, AUDIO, 400))
    _mrv2_chunk(s, rid, 1, 2, 300, 300, (301, 302), (302, 310), (310, 320), (330, 340), 350)
    s += [(API, Ev.REQUEST_FIRST_AUDIO, rid, -1, -1, 0, 0, 450),
          (_ring(2, "scheduler"), Ev.STAGE_EMIT, rid, 2, -1, 0, AUDIO, 600)]
    s += [(_ring(stage, "scheduler"), Ev.STAGE_FINISH, rid, stage, -1, 0, 0, 990) for stage in (0, 1, 2)]
    s.append((API, Ev.REQUEST_END, rid, -1, -1, 0, 1234, 1000))
    return sorted(s, key=lambda e: e[7])


def test_talker_first_audio_is_walked_from_the_talkers_packet(tmp_path):
    run = load_run([write_event_run(str(tmp_path / "r"), talker_first_events("tf"))])
    a = at.attribute(request_spans(run)["tf"])
    assert a is not None and a.ttfp_ns == 450 * US
    assert at.first_audio_emit(request_spans(run)["tf"])[0] == 1  # the Talker's packet, not Code2Wav's
    assert a.hops == [(0, 1, 0)]  # thinker -> talker only: Code2Wav is off the critical path
    assert sum(a.totals().values()) == a.ttfp_ns
    assert all(x.end == y.start for x, y in zip(a.segments, a.segments[1:]))
    totals = {k: v // US for k, v in a.totals().items()}
    assert totals[(-1, at.DELIVER)] == 50  # the Talker's emit (400) -> the client's first packet (450)
    assert totals[(1, at.COMPUTE)] == 200 and totals[(1, at.WAIT_SCHEDULE)] == 10
    # the thinker's chunk: its output-queue residence (100 -> 150), build and put
    assert totals[(0, at.FIFO_OWN)] + totals.get((0, at.FIFO_BLOCKED), 0) == 50
    assert totals[(0, at.PROCESS)] == 10 and totals[(0, at.PUT)] == 10
    # the output worker snapshots after its dequeue (150 -> 155): that is the snapshot,
    # walked in the worker's own order, not a gap
    assert totals[(0, at.SNAPSHOT)] == 5
    gaps = [(g.start - a.arrival) // US for g in a.segments if g.category == at.REMAINDER]
    assert 150 not in gaps, gaps
    assert not [k for k in totals if k[0] == 2]


def test_the_report_attributes_it_exactly(tmp_path):
    rep = build_report(load_run([write_event_run(str(tmp_path / "r"), talker_first_events("tf"))]))
    assert rep["window"]["attributed"] == 1 and rep["ttfp"]["sum_error_max_ns"] == 0
    (row,) = rep["requests"]
    assert abs(sum(row["categories_ms"].values()) - row["ttfp_ms"]) < 1e-9 and abs(row["ttfp_ms"] - 0.45) < 1e-9
    assert {f["stage_id"] for f in rep["fifo"]} == {0, 1}
