"""Hand-written run directories recorded the way a real run records them: each event is
written by ``record.Ring`` into shared memory, and the agent's own ``Recorder`` drains the
rings into the run's event log; in this process, in milliseconds (the unit tier). What a
test reads back went through the production path: ring slots, string interning, the
drain, the event log, the loader and the span builder.

A script is a list of ``(ring, kind, request, stage, chunk, a, b, t_us)``; ``ring`` names
the thread that writes it, ``(role, stage, thread)``: one ring per thread as in a real
process (the scheduler, sender and receiver threads of a stage). Times are microseconds
from the run's start.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Iterable

import numpy as np

from omnitrace import eventlog, record
from omnitrace.agent.config import AgentConfig
from omnitrace.agent.export_prometheus import Metrics
from omnitrace.agent.recorder import Handoff, Recorder
from omnitrace.conventions import Ev, Modality

US = 1_000
T0 = 10**12  # perf_counter_ns of the run's start (any value the clock could have)
STAGE_NAMES = {-1: "api", 0: "thinker", 1: "talker", 2: "code2wav"}
RING_RECORDS = 1 << 12  # each ring's slots: a ring written past them drops, as a real one
_runs = iter(range(1, 1 << 30))


def write_event_run(d: str, script: list[tuple], bench: dict | None = None) -> str:
    """``d`` as `omnitrace run` leaves it (event log, run.json, agent.json[, bench.json])."""
    os.makedirs(d, exist_ok=True)
    run_id = f"fixture{os.getpid()}x{next(_runs)}"
    rings: dict[tuple, record.Ring] = {}
    try:
        for ring_key, kind, req, stage, chunk, a, b, t_us in script:
            ring = rings.get(ring_key)
            if ring is None:
                role, sid, thread = ring_key
                info = record.ProcessInfo(role, sid, 0, STAGE_NAMES.get(sid, f"stage{sid}"))
                ring = rings[ring_key] = _ring_of_a_thread(run_id, info, thread)
            ring.record(int(kind), req, stage, chunk, a, b, T0 + int(t_us * US))
        rec = Recorder(AgentConfig(run_id=run_id, run_dir=d), Metrics(), Handoff())
        rec.start(stop := threading.Event())
        stop.set()
        rec.drained.wait(30)
        assert not rec.error, rec.error
    finally:
        for ring in rings.values():
            ring.close()
            try:
                os.unlink(os.path.join(record.SHM_DIR, ring.name))
            except FileNotFoundError:
                pass  # the recorder's final drain unlinked it
    write_side_files(d, {"run_id": run_id, "status": "complete", "exit_code": 0,
                         "started_unix_ns": time.time_ns()},
                     {"events_read": rec.events_read, "events_dropped": 0}, bench)
    return d


def write_side_files(d: str, run: dict, agent: dict, bench: dict | None = None) -> None:
    """run.json, agent.json and (if given) bench.json: what every run directory has."""
    for name, doc in (("run.json", run), ("agent.json", agent), ("bench.json", bench)):
        if doc is not None:
            with open(os.path.join(d, name), "w") as f:
                json.dump(doc, f)


def write_log(dst: str, run_id: str, offset_ns: int, rings: dict[int, dict], ev: np.ndarray,
              strings: list[str], windows: int, segment_raw_bytes: int = 1 << 16,
              died: Iterable[int] = (), accounts: dict[int, dict] | None = None) -> int:
    """``ev`` (``eventlog.EVENT_DTYPE`` rows in time order, unix ns; ``req`` indexes
    ``strings``) written straight through the agent's log writer into ``dst``'s event log,
    in ``windows`` time windows (each ring's events of a window as one block, a request's
    id string before its first use in the ring), in segments of ``segment_raw_bytes``;
    then ``died`` rings and ``accounts`` (ring -> final counts). For runs too large for
    the rings, or rewritten from another. Returns the segments written."""
    w = eventlog.EventLogWriter(dst, run_id, offset_ns, segment_raw_bytes=segment_raw_bytes)
    tables: dict[int, dict[int, str]] = {}
    for idx, ring in rings.items():
        w.ring(idx, ring)
    for part in np.array_split(ev, windows):
        for idx in rings:
            rows = part[part["ring"] == idx]
            if not len(rows):
                continue
            head = []
            table = tables.setdefault(idx, {})
            for r in np.unique(rows["req"]).tolist():
                if r and r not in table:
                    table[r] = strings[r]
                    head.append(record.string_slots(r, strings[r]))
            rec = np.zeros(len(rows), record.RECORD_DTYPE)
            for f in ("a", "req", "chunk", "kind", "stage", "b"):
                rec[f] = rows[f]
            rec["t"] = rows["t"] - offset_ns
            w.records(idx, b"".join(head) + rec.tobytes(), len(rows))
        w.commit(tables)
    for idx in died:
        w.died(idx)
    for idx, counts in (accounts or {}).items():
        w.account(idx, counts)
    w.close(tables)
    return w.segment + 1


def _ring_of_a_thread(run_id: str, info: record.ProcessInfo, thread: str) -> record.Ring:
    """A ring made by a thread of its own (a ring is named after its thread), written
    here afterwards: one writer at a time, as the ring requires."""
    made: list[record.Ring] = []
    t = threading.Thread(target=lambda: made.append(record.Ring(run_id, info, RING_RECORDS, thread_name=thread)))
    t.start()
    t.join()
    return made[0]


API, THINKER, THINKER_SEND, TALKER, TALKER_RECV, TALKER_SEND, CODEC, CODEC_RECV = (
    ("api", -1, "api"), ("stage", 0, "scheduler"), ("stage", 0, "sender"),
    ("stage", 1, "scheduler"), ("stage", 1, "receiver"), ("stage", 1, "sender"),
    ("stage", 2, "scheduler"), ("stage", 2, "receiver"))


def chunk_events(script: list, rid: str, prod: tuple, send: tuple, recv: tuple, cons_sched: tuple,
                 p: int, c: int, chunk: int, snap: tuple, deq: float, proc: tuple, put: tuple,
                 get: tuple, scheduled: float | None) -> None:
    """One chunk from stage ``p`` to ``c``: snapshot and enqueue (producer scheduler),
    dequeue, payload and put (sender), get and ready (consumer receiver), scheduled."""
    script += [
        (prod, Ev.SNAPSHOT_BEGIN, rid, p, chunk, 0, c, snap[0]),
        (prod, Ev.SNAPSHOT_END, rid, p, chunk, 0, c, snap[1]),
        (prod, Ev.FIFO_ENQUEUE, rid, p, chunk, 0, c, snap[1]),
        (send, Ev.FIFO_DEQUEUE, rid, p, chunk, 0, c, deq),
        (send, Ev.PROCESS_BEGIN, rid, p, chunk, 0, c, proc[0]),
        (send, Ev.PROCESS_END, rid, p, chunk, 1000, c, proc[1]),
        (send, Ev.PUT_BEGIN, rid, p, chunk, 0, c, put[0]),
        (send, Ev.PUT_END, rid, p, chunk, 1000, c, put[1]),
        (recv, Ev.GET_BEGIN, rid, c, chunk, 0, p, get[0]),
        (recv, Ev.GET_END, rid, c, chunk, 1000, p, get[1]),
        (recv, Ev.CHUNK_READY, rid, c, chunk, 0, p, get[1]),
    ]
    if scheduled is not None:
        script.append((cons_sched, Ev.CHUNK_SCHEDULED, rid, c, chunk, 0, p, scheduled))


def three_stage_events(rid: str, off: float = 0.0) -> list[tuple]:
    """The worked example of tests/unit/rules/test_attribution.py (attributed as
    :data:`EXPECTED_US`) as the events that make it, times in us from ``off``: three
    stages, thinker chunk 0 gating the talker, talker chunk 0 gating code2wav, and a later
    thinker chunk that must not. Its FIFO blocked time (30 us of thinker chunk 0's 40 us in
    the FIFO) is real: another request's task (``other-<rid>``) holds the thinker's sender
    from 110 to 140 us."""
    o, other = off, f"other-{rid}"
    s = [(API, Ev.REQUEST_ARRIVE, rid, -1, -1, 100, 50, o),
         (THINKER, Ev.STAGE_ADD, rid, 0, -1, 0, 0, o + 10),
         (THINKER, Ev.STAGE_SCHEDULE, rid, 0, -1, 1, 0, o + 20),
         # the task ahead of ours in the thinker's FIFO: the sender is busy 110-140 us
         (THINKER, Ev.FIFO_ENQUEUE, other, 0, 0, 0, 1, o + 105),
         (THINKER_SEND, Ev.FIFO_DEQUEUE, other, 0, 0, 1, 1, o + 110),
         (THINKER_SEND, Ev.PROCESS_BEGIN, other, 0, 0, 0, 1, o + 110),
         (THINKER_SEND, Ev.PROCESS_END, other, 0, 0, 10, 1, o + 120),
         (THINKER_SEND, Ev.PUT_BEGIN, other, 0, 0, 0, 1, o + 120),
         (THINKER_SEND, Ev.PUT_END, other, 0, 0, 10, 1, o + 140),
         (THINKER, Ev.STAGE_EMIT, rid, 0, -1, 0, int(Modality.TEXT), o + 120),
         (API, Ev.REQUEST_FIRST_TEXT, rid, -1, -1, 0, 0, o + 150),
         (TALKER, Ev.STAGE_ADD, rid, 1, -1, 0, 0, o + 180),
         (TALKER, Ev.STAGE_SCHEDULE, rid, 1, -1, 1, 0, o + 190)]
    chunk_events(s, rid, THINKER, THINKER_SEND, TALKER_RECV, TALKER, 0, 1, 0, (o + 100, o + 110), o + 150,
                 (o + 150, o + 160), (o + 160, o + 170), (o + 175, o + 180), o + 200)
    chunk_events(s, rid, TALKER, TALKER_SEND, CODEC_RECV, CODEC, 1, 2, 0, (o + 300, o + 305), o + 310,
                 (o + 310, o + 320), (o + 320, o + 330), (o + 340, o + 345), o + 350)
    s += [(CODEC, Ev.STAGE_ADD, rid, 2, -1, 0, 0, o + 330),
          (CODEC, Ev.STAGE_SCHEDULE, rid, 2, -1, 1, 0, o + 331)]
    # a later thinker chunk, scheduled after the talker's snapshot: must NOT gate codec chunk 0
    chunk_events(s, rid, THINKER, THINKER_SEND, TALKER_RECV, TALKER, 0, 1, 1, (o + 400, o + 401), o + 402,
                 (o + 402, o + 403), (o + 403, o + 404), (o + 405, o + 406), o + 407)
    s += [(CODEC, Ev.STAGE_EMIT, rid, 2, -1, 0, int(Modality.AUDIO), o + 800),
          (API, Ev.REQUEST_FIRST_AUDIO, rid, -1, -1, 0, 0, o + 900),
          (THINKER, Ev.STAGE_FINISH, rid, 0, -1, 0, 0, o + 990),
          (TALKER, Ev.STAGE_FINISH, rid, 1, -1, 0, 0, o + 990),
          (CODEC, Ev.STAGE_FINISH, rid, 2, -1, 0, 0, o + 990),
          (API, Ev.REQUEST_END, rid, -1, -1, 0, 1234, o + 1000)]
    # each ring's events in time order, as one thread writes them
    return sorted(s, key=lambda e: e[7])


# the worked example's attribution (three_stage_events), in us per (stage, category)
EXPECTED_US = {
    (-1, "dispatch"): 10, (-1, "deliver"): 100,  # no API marks in this trace: not split further
    (0, "queue"): 10, (0, "compute"): 80, (0, "snapshot"): 10, (0, "fifo_blocked"): 30,
    (0, "fifo_own"): 10, (0, "process"): 10, (0, "put"): 10,
    (1, "poll_lag"): 5, (1, "get"): 5, (1, "wait_schedule"): 20, (1, "compute"): 100,
    (1, "snapshot"): 5, (1, "fifo_own"): 5, (1, "process"): 10, (1, "put"): 10,
    (2, "poll_lag"): 10, (2, "get"): 5, (2, "wait_schedule"): 5, (2, "compute"): 450,
}
