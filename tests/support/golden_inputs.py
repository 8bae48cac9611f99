"""The golden report's reference inputs (tests/golden/): what `omnitrace report --json`
must keep giving byte for byte while the analysis code beneath it is moved.

* Hand-made runs, recorded through the real rings and the agent's recorder
  (``event_fixture.write_event_run``), stored in ``tests/golden/runs/`` (the recorder's
  clock offset, pids and run id differ every time they are made: stored once, they are
  fixed inputs):

  - ``worked``: six requests of the worked example (``three_stage_events``) 300 us apart,
    the first a warm-up: their chunks wait behind each other in the thinker's FIFO;
  - ``hol``: one victim whose three chunks wait in the thinker's FIFO at once behind two
    other requests' tasks, plus a chunk after its gating one (not on its critical path),
    without bench.json (every traced request measured, with the warning).

* ``synthetic``: a run of 300 requests through three stages, each stage's sender doing one
  task at a time (real FIFO waits behind other requests), made by a seeded simulation and
  written straight through the agent's log writer (``event_fixture.write_log``) with a fixed
  clock offset, run id and ring descriptions: the same bytes of events every time, so it is
  made where it is needed, not stored.

``python -m tests.support.golden_inputs`` rewrites the stored runs and every golden report
(only when a change of the report is intended: say why in the commit).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile

import numpy as np
import orjson

from omnitrace import conventions as cv
from omnitrace.conventions import Ev, Modality
from omnitrace.eventlog import EVENT_DTYPE
from tests.support.event_fixture import (API, TALKER, TALKER_RECV, THINKER, THINKER_SEND, chunk_events,
                                         three_stage_events, write_event_run, write_log)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "golden")
RUNS = os.path.join(GOLDEN, "runs")
REPORTS = os.path.join(GOLDEN, "reports")
STORED = ("worked", "hol")
ALL = (*STORED, "synthetic")


# ---------------------------------------------------------------- hand-made, recorded
WORKED_IDS = [f"w{i}" for i in range(6)]


def worked_script() -> list[tuple]:
    return sorted((e for i, r in enumerate(WORKED_IDS) for e in three_stage_events(r, off=i * 300)),
                  key=lambda e: e[7])


def _worked(d: str) -> str:
    bench = {"status": "complete",
             "requests": [{"id": r, "warmup": i == 0, "concurrency": 4, "ttfp_s": 0.0009 + i * 1e-5,
                           "status": "ok"} for i, r in enumerate(WORKED_IDS)]}
    return write_event_run(d, worked_script(), bench=bench)


def hol_script() -> list[tuple]:
    """Victim v (arrival 0, first packet 1000 us; thinker chunks 0-2 in the FIFO over [101,
    400], [111, 450], [121, 500], gating chunk 2; chunk 3 after it); x holds the sender over
    [150, 250], y over [250, 380], z over [800, 1100] (while only chunk 3 waits)."""
    s = [(API, Ev.REQUEST_ARRIVE, "v", -1, -1, 100, 50, 0),
         (THINKER, Ev.STAGE_ADD, "v", 0, -1, 0, 0, 10), (THINKER, Ev.STAGE_SCHEDULE, "v", 0, -1, 1, 0, 20),
         (TALKER, Ev.STAGE_ADD, "v", 1, -1, 0, 0, 15), (TALKER, Ev.STAGE_SCHEDULE, "v", 1, -1, 1, 0, 16),
         (TALKER, Ev.STAGE_EMIT, "v", 1, -1, 0, int(Modality.AUDIO), 900),
         (API, Ev.REQUEST_FIRST_AUDIO, "v", -1, -1, 0, 0, 1000),
         (THINKER, Ev.STAGE_FINISH, "v", 0, -1, 0, 0, 1900), (TALKER, Ev.STAGE_FINISH, "v", 1, -1, 0, 0, 1900),
         (API, Ev.REQUEST_END, "v", -1, -1, 0, 1234, 2000)]
    for c, (e, ws_end) in enumerate(((400, 420), (450, 470), (500, 600), (1200, 1300))):
        b = 100 + 10 * c if c < 3 else 699
        chunk_events(s, "v", THINKER, THINKER_SEND, TALKER_RECV, TALKER, 0, 1, c, (b, b + 1), e,
                     (e, e + 5), (e + 5, e + 10), (e + 10, e + 12), ws_end)
    for rid, enq, deq, put_end in (("x", 140, 150, 250), ("y", 145, 250, 380), ("z", 790, 800, 1100)):
        s += [(THINKER, Ev.SNAPSHOT_BEGIN, rid, 0, 0, 0, 1, enq - 1), (THINKER, Ev.SNAPSHOT_END, rid, 0, 0, 0, 1, enq),
              (THINKER, Ev.FIFO_ENQUEUE, rid, 0, 0, 0, 1, enq), (THINKER_SEND, Ev.FIFO_DEQUEUE, rid, 0, 0, 0, 1, deq),
              (THINKER_SEND, Ev.PROCESS_BEGIN, rid, 0, 0, 0, 1, deq),
              (THINKER_SEND, Ev.PROCESS_END, rid, 0, 0, 1000, 1, deq + 10),
              (THINKER_SEND, Ev.PUT_BEGIN, rid, 0, 0, 0, 1, deq + 10),
              (THINKER_SEND, Ev.PUT_END, rid, 0, 0, 1000, 1, put_end)]
    return sorted(s, key=lambda e: e[7])


HAND_MADE = {"worked": _worked, "hol": lambda d: write_event_run(d, hol_script())}


# ---------------------------------------------------------------- synthetic, simulated
SYNTH_OFFSET_NS = 1_790_000_000_000_000_000  # unix ns of perf_counter 0
SYNTH_T0_NS = 5_000_000_000  # perf_counter_ns of the first arrival
STAGE_NAMES = {0: "thinker", 1: "talker", 2: "code2wav"}
# ring -> (pid, thread, stage); one process per stage, one ring per thread
SYNTH_RINGS = {0: (4000, "api", -1), 1: (4001, "scheduler", 0), 2: (4001, "sender", 0),
               3: (4002, "receiver", 1), 4: (4002, "scheduler", 1), 5: (4002, "sender", 1),
               6: (4003, "receiver", 2), 7: (4003, "scheduler", 2)}
FAILS, OPEN = 20, 31  # the request that fails, the one whose end never comes
_RING_OF = {(stage, thread): idx for idx, (_, thread, stage) in SYNTH_RINGS.items()}


class _Sim:
    """Events as (t_us, ring, kind, request index, stage, chunk, a, b) of a seeded run."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.ev: list[tuple[int, int, int, int, int, int, int, int]] = []

    def add(self, t: int, stage: int, thread: str, kind: Ev, req: int, chunk: int = -1,
            a: int = 0, b: int = 0, ev_stage: int | None = None) -> None:
        self.ev.append((int(t), _RING_OF[(stage, thread)], int(kind), req,
                        stage if ev_stage is None else ev_stage, chunk, int(a), int(b)))

    def r(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi))


def _produce(sim: _Sim, p: int, c: int, tasks: list[tuple[int, int, int, int]]) -> dict[tuple[int, int], int]:
    """Stage ``p``'s chunk tasks (snapshot begin, snapshot us, request, chunk) to stage ``c``:
    snapshot and enqueue on its scheduler; its one sender takes them in enqueue order
    (dequeue, payload, put); ``c``'s receiver gets each (a get sometimes entered before the
    put ended), its scheduler takes it into a step. Returns (request, chunk) -> scheduled."""
    queue: list[tuple[int, int, int, int]] = sorted((b + d, b, req, k) for b, d, req, k in tasks)
    free, scheduled, waiting = 0, {}, []
    for enq, b, req, k in queue:
        waiting = [t for t in waiting if t > enq]  # dequeued by now
        sim.add(b, p, "scheduler", Ev.SNAPSHOT_BEGIN, req, k, 0, c)
        sim.add(enq, p, "scheduler", Ev.SNAPSHOT_END, req, k, int(cv.Snapshot.COPY), c)
        sim.add(enq, p, "scheduler", Ev.FIFO_ENQUEUE, req, k, len(waiting), c)
        deq = max(enq + sim.r(1, 6), free)
        waiting.append(deq)
        nbytes = 4096 * sim.r(1, 9)
        proc_end = deq + sim.r(8, 40)
        put_end = proc_end + sim.r(4, 25)
        free = put_end
        sim.add(deq, p, "sender", Ev.FIFO_DEQUEUE, req, k, 0, c)
        sim.add(deq, p, "sender", Ev.PROCESS_BEGIN, req, k, 0, c)
        sim.add(proc_end, p, "sender", Ev.PROCESS_END, req, k, nbytes, c)
        sim.add(proc_end, p, "sender", Ev.PUT_BEGIN, req, k, 0, c)
        sim.add(put_end, p, "sender", Ev.PUT_END, req, k, nbytes, c)
        get0 = put_end - 3 if sim.r(0, 20) == 0 else put_end + sim.r(1, 30)
        get1 = max(get0, put_end) + sim.r(2, 10)
        sched = get1 + sim.r(2, 60)
        sim.add(get0, c, "receiver", Ev.GET_BEGIN, req, k, 0, p)
        sim.add(get1, c, "receiver", Ev.GET_END, req, k, nbytes, p)
        sim.add(get1, c, "receiver", Ev.CHUNK_READY, req, k, 0, p)
        sim.add(sched, c, "scheduler", Ev.CHUNK_SCHEDULED, req, k, 0, p)
        scheduled[(req, k)] = sched
    return scheduled


def synthetic_events(n: int = 300, chunks: int = 6, seed: int = 42) -> tuple[list[tuple], list[str]]:
    """The simulated run's events (see ``_Sim``; times in us) and its request ids: ``n``
    requests arriving 150-650 us apart through thinker -> talker -> code2wav; request 20
    fails, request 31 never ends (still open at the end of the run)."""
    sim = _Sim(seed)
    arrive = np.cumsum(sim.rng.integers(150, 650, n)).tolist()
    thinker: list[tuple[int, int, int, int]] = []
    sched0 = {}
    for i, a in enumerate(arrive):
        prompt = sim.r(100, 3000)
        sim.add(a, -1, "api", Ev.REQUEST_ARRIVE, i, a=prompt, b=60)
        sim.add(a + 8, -1, "api", Ev.REQUEST_PARSED, i)
        add = a + 20 + sim.r(0, 10)
        sched0[i] = sched = add + sim.r(5, 80)
        sim.add(add, 0, "scheduler", Ev.STAGE_ADD, i, a=sim.r(0, 4))
        sim.add(sched, 0, "scheduler", Ev.STAGE_SCHEDULE, i, a=sim.r(1, 8))
        first = sched + 100 + prompt // 20
        sim.add(first, 0, "scheduler", Ev.STAGE_EMIT, i, a=0, b=int(Modality.TEXT))
        sim.add(first + 15, -1, "api", Ev.REQUEST_FIRST_TEXT, i)
        thinker += [(first + k * 120 + sim.r(0, 40), 3 + prompt // 400, i, k) for k in range(chunks)]
    at_talker = _produce(sim, 0, 1, thinker)
    talker = []
    for i, a in enumerate(arrive):
        add = a + 30
        sim.add(add, 1, "scheduler", Ev.STAGE_ADD, i)
        sim.add(add + sim.r(1, 10), 1, "scheduler", Ev.STAGE_SCHEDULE, i, a=1)
        last = 0
        for k in range(chunks):
            b = max(at_talker[(i, k)] + sim.r(20, 90), last + 5)
            last = b + 4
            talker.append((b, 4, i, k))
    at_codec = _produce(sim, 1, 2, talker)
    for i, a in enumerate(arrive):
        add = a + 40
        sim.add(add, 2, "scheduler", Ev.STAGE_ADD, i)
        sim.add(add + 2, 2, "scheduler", Ev.STAGE_SCHEDULE, i, a=1)
        emits = [at_codec[(i, k)] + sim.r(40, 160) for k in range(chunks)]
        for k, t in enumerate(emits):
            sim.add(t, 2, "scheduler", Ev.STAGE_EMIT, i, a=k, b=int(Modality.AUDIO))
        received = emits[0] + sim.r(5, 30)
        sim.add(received, -1, "api", Ev.PACKET_RECEIVED, i)
        sim.add(received + sim.r(1, 40), -1, "api", Ev.PACKET_RESUMED, i)
        sim.add(received + 60, -1, "api", Ev.REQUEST_FIRST_AUDIO, i)
        end = max(emits) + 200
        for st in (0, 1, 2):
            sim.add(end - 50, st, "scheduler", Ev.STAGE_FINISH, i, a=int(i == FAILS))
        if i != OPEN:
            sim.add(end, -1, "api", Ev.REQUEST_END, i, a=int(cv.Status.ERROR if i == FAILS else cv.Status.OK),
                    b=9000)
    return sim.ev, [f"syn-{i:04d}" for i in range(n)]


def write_synthetic(d: str, n: int = 300) -> str:
    """The synthetic run in ``d``: event log, run.json, agent.json and bench.json (the first
    eight requests warm-up), the same bytes of events every time."""
    events, ids = synthetic_events(n)
    ev = np.zeros(len(events), EVENT_DTYPE)
    cols = np.array(events, np.int64)
    order = np.lexsort((np.arange(len(cols)), cols[:, 0]))  # time order, ties as made
    cols = cols[order]
    ev["t"] = SYNTH_OFFSET_NS + SYNTH_T0_NS + cols[:, 0] * 1000
    ev["ring"], ev["kind"], ev["req"] = cols[:, 1], cols[:, 2], cols[:, 3] + 1
    ev["stage"], ev["chunk"], ev["a"], ev["b"] = cols[:, 4], cols[:, 5], cols[:, 6], cols[:, 7]
    rings = {idx: {"name": f"omnitrace.synthetic.{pid}.{pid * 10 + idx}", "pid": pid, "tid": pid * 10 + idx,
                   "thread": thread, "role": "api" if stage < 0 else "stage", "stage": stage, "replica": 0,
                   "process": "api" if stage < 0 else STAGE_NAMES[stage], "capacity": 1 << 16}
             for idx, (pid, thread, stage) in SYNTH_RINGS.items()}
    counts = np.bincount(ev["ring"], minlength=len(rings))
    accounts = {idx: {"events_written": int(counts[idx]), "dropped": 0, "events_read": int(counts[idx])}
                for idx in rings}
    os.makedirs(d)  # a new directory: never segments of another run beside these
    write_log(d, "synthetic-golden", SYNTH_OFFSET_NS, rings, ev, ["", *ids], windows=40,
              accounts=accounts)
    start = SYNTH_OFFSET_NS + SYNTH_T0_NS
    end = int(ev["t"].max())
    first, audio = ({r: int(t) for r, t in zip(ev["req"][ev["kind"] == k].tolist(), ev["t"][ev["kind"] == k].tolist())}
                    for k in (Ev.REQUEST_ARRIVE, Ev.REQUEST_FIRST_AUDIO))
    bench = {"status": "complete-with-errors",
             "levels": [{"concurrency": 8, "measured_window": {"start_unix_ns": start, "end_unix_ns": end}}],
             "requests": [{"id": rid, "concurrency": 8, "warmup": i < 8, "start_unix_ns": first[i + 1],
                           "ttfp_s": (audio[i + 1] - first[i + 1] + 45_000) / 1e9,
                           "error": "HTTP 500 {\"message\": \"stage 1 failed\"}" if i == FAILS else ""}
                          for i, rid in enumerate(ids)]}
    for name, doc in (("run.json", {"run_id": "synthetic-golden", "status": "complete", "exit_code": 0,
                                    "started_unix_ns": start, "ended_unix_ns": end}),
                      ("agent.json", {"events_read": len(ev), "events_dropped": 0}), ("bench.json", bench)):
        with open(os.path.join(d, name), "wb") as f:
            f.write(orjson.dumps(doc))
    return d


# ---------------------------------------------------------------- the reports
def report_json(parent: str, name: str) -> bytes:
    """`omnitrace report NAME --json FILE` run in ``parent`` (the run named by a relative
    path, as the golden file records it), in this process: the file's bytes."""
    from omnitrace.cli import report
    with tempfile.TemporaryDirectory() as tmp, _cwd(parent):
        out = os.path.join(tmp, "report.json")
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            code = report.main([name, "--json", out])
        assert code == 0, f"omnitrace report {name}: exit {code}"
        with open(out, "rb") as f:
            return f.read()


@contextlib.contextmanager
def _cwd(path: str):
    was = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(was)


def main(argv: list[str] | None = None) -> int:
    """The golden reports rewritten from the stored inputs (a change that moves the report
    on purpose); ``--inputs``: the hand-made runs recorded anew first (new run ids and
    times: only when the recording itself changed)."""
    import sys
    os.makedirs(REPORTS, exist_ok=True)
    if "--inputs" in (sys.argv[1:] if argv is None else argv):
        for name, make in HAND_MADE.items():
            shutil.rmtree(os.path.join(RUNS, name), ignore_errors=True)
            make(os.path.join(RUNS, name))
    for name in STORED:
        with open(os.path.join(REPORTS, f"{name}.json"), "wb") as f:
            f.write(report_json(RUNS, name))
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic(os.path.join(tmp, "synthetic"))
        with open(os.path.join(REPORTS, "synthetic.json"), "wb") as f:
            f.write(report_json(tmp, "synthetic"))
    print(f"golden inputs and reports rewritten under {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
