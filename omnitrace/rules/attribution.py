"""Critical-path attribution of each request's time to first audio packet (TTFP).

Rule (the analytical core; also in docs/bench-and-report.md). For one request, from its
`omni.request` start (arrival, A) to its `omni.ttfp` event (T), walk BACKWARD:

1. T <- the first audio `omni.emit` of the last stage (E): [E, T] is the API's delivery,
   split by the request span's API marks into `deliver` (E -> the packet left the stage
   pipe), `loop_lag` (-> the stream handler resumed with it) and `sse_write` (-> T).
2. In the emitting stage S, the step that produced the output at time t started computing
   when S had the input it needed. The gating input is **the latest input chunk whose
   `omni.chunk.wait_schedule` ended (chunk taken into a step) at or before t** for this
   request in S. (The reference Talker's frame i needs Thinker chunk i and sends codec
   chunk 0 after 4 frames, so "latest scheduled before the snapshot" is the chunk the
   step that snapshotted needed.) [scheduled, t] is S `compute`.
3. That chunk c from producer P is walked back through its spans, each charged to the
   stage that spends the time: S `wait_schedule` (ready -> scheduled), S `get`,
   S `poll_lag` (P's put end -> S's get begin), P `put`, P `process`, P FIFO residence
   split into `fifo_blocked` (= omni.fifo.blocked_ns, capped at the residence) and
   `fifo_own` (the rest), P `snapshot`. Then t = P's snapshot begin and S = P; go to 2.
   Which span of a kind is the chunk's (several can share its key: retries, a producer's
   no-chunk tasks under the next chunk's index) follows the ORDERING RULE below.

Ordering rule (the one home; the walk here and ``walk.py`` apply it). One process's spans
are ordered by their stamps: one monotonic clock, and the sender runs a task's dequeue,
process and put in turn on one thread. Spans of two processes are ordered only by
causality, never by which call began first: a receiver thread can enter a non-blocking get
before the put begins and be descheduled until the segment exists (seen on the real
server under load: get 476.38-477.91 ms around put 477.28-477.52). So: the consumer's get
is the latest ending by the chunk's ready; its put is the latest that BEGAN by that get's
end (the one it can have read); the producing task is the latest process ending by that
put's begin, its FIFO wait the latest ending by the process begin, its snapshot the latest
ending by the process begin if it began after that wait (MRv2's output worker snapshots
what it dequeued), else the latest ending by the wait's begin (V1: snapshot, then
enqueue); `poll_lag` is [put end, get begin] of that pair. A get
that began before its put ended is charged as `get` only from the put's end (segment
detail ``overlap``): before it the chunk was not yet written, and that time is the
producer's put and task, whatever the receiver thread was doing.
4. A stage with no input chunk before t (stage 0): [scheduled, t] is `compute`, its
   `omni.stage.queue` (add -> scheduled) is `queue`, and [A, add] is the API's `parse`
   (A -> body parsed) and `dispatch` (-> handed to the stage queues), then the stage's
   own `dispatch` (its inbox, until its scheduler loop takes the request: after a step).

The intervals tile [A, T]: a span that overlaps the part already walked is clamped to it,
and any gap between consecutive spans becomes an explicit `remainder` of the stage whose
span follows the gap. So the categories sum EXACTLY (integer ns) to the server-side TTFP.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from omnitrace import conventions as cv
from omnitrace import spantable as stt

# the vocabulary (names, descriptions, colours) lives in omnitrace.categories; the rule here
from omnitrace.categories import (CATEGORIES, COMPUTE, DELIVER, DESCRIPTIONS, DISPATCH,  # noqa: F401
                                  FIFO_BLOCKED, FIFO_OWN, GET, LOOP_LAG, PARSE, POLL_LAG, PROCESS,
                                  PUT, QUEUE, REMAINDER, SNAPSHOT, SSE_WRITE, WAIT_SCHEDULE)
from omnitrace.rules.span import Span

_PRODUCER = tuple(stt.NAMES[c] for c in stt.PRODUCER_NAMES)
_CONSUMER = tuple(stt.NAMES[c] for c in stt.CONSUMER_NAMES)
_MAX_HOPS = 32


@dataclass
class Segment:
    start: int
    end: int
    stage: int  # -1 = API server
    category: str
    detail: str = ""

    @property
    def dur(self) -> int:
        return self.end - self.start


@dataclass
class RequestSpans:
    """All spans of one request, indexed for the walk."""

    rid: str
    request: Span | None = None
    stages: dict[int, Span] = field(default_factory=dict)
    queues: dict[int, Span] = field(default_factory=dict)
    # (producer stage, consumer stage, chunk) -> span name -> spans. A producer may run
    # several tasks under one chunk index (the talker labels its no-chunk tasks with the
    # index of the next chunk), so several spans of one name can share a key.
    producer: dict[tuple[int, int, int], dict[str, list[Span]]] = field(default_factory=dict)
    consumer: dict[tuple[int, int, int], dict[str, list[Span]]] = field(default_factory=dict)
    # consumer stage -> wait_schedule spans
    scheduled: dict[int, list[Span]] = field(default_factory=dict)
    incomplete: int = 0

    def drop_chunks(self) -> None:
        """Forget the chunk spans (walked already; an hour's would not fit in memory)."""
        self.producer, self.consumer, self.scheduled = {}, {}, {}


@dataclass
class Attribution:
    rid: str
    arrival: int
    ttfp: int  # absolute unix ns of the omni.ttfp event
    segments: list[Segment]  # in time order, tiling [arrival, ttfp]
    hops: list[tuple[int, int, int]]  # (producer, consumer, chunk) on the path
    missing: list[str]  # spans the walk expected but did not find
    unrecorded_tasks: list[tuple[int, int, int]] = field(default_factory=list)  # hops whose producing task had no own spans

    @property
    def ttfp_ns(self) -> int:
        return self.ttfp - self.arrival

    def packed(self) -> tuple:
        """As plain tuples, to cross a process boundary: pickling tens of thousands of
        dataclass objects (each with ~15 segments) costs ~3x as much."""
        return (self.rid, self.arrival, self.ttfp,
                [(s.start, s.end, s.stage, s.category, s.detail) for s in self.segments],
                self.hops, self.missing, self.unrecorded_tasks)

    @classmethod
    def unpacked(cls, t: tuple) -> "Attribution":
        rid, arrival, ttfp, segs, hops, missing, unrecorded = t
        return cls(rid, arrival, ttfp, [Segment(*s) for s in segs], hops, missing, unrecorded)

    def totals(self) -> dict[tuple[int, str], int]:
        out: dict[tuple[int, str], int] = {}
        for s in self.segments:
            out[(s.stage, s.category)] = out.get((s.stage, s.category), 0) + s.dur
        return out


def index_requests(spans: Iterable[Span], into: dict[str, RequestSpans] | None = None
                   ) -> dict[str, RequestSpans]:
    """Spans by request (added to ``into`` if given)."""
    reqs: dict[str, RequestSpans] = {} if into is None else into
    for s in spans:
        if not s.rid:
            continue
        r = reqs.get(s.rid)
        if r is None:
            r = reqs[s.rid] = RequestSpans(s.rid)
        n = s.name
        if s.incomplete and n not in _PRODUCER and n not in _CONSUMER:
            r.incomplete += 1  # chunk spans are counted from the run's chunk table
        if n == cv.SPAN_WAIT_SCHEDULE and s.incomplete:
            continue  # ready, never taken into a step: no interval to walk
        if n in _PRODUCER:
            r.producer.setdefault((s.stage, s.peer, s.chunk), {}).setdefault(n, []).append(s)
        elif n in _CONSUMER:
            r.consumer.setdefault((s.peer, s.stage, s.chunk), {}).setdefault(n, []).append(s)
            if n == cv.SPAN_WAIT_SCHEDULE:
                r.scheduled.setdefault(s.stage, []).append(s)
        elif n == cv.SPAN_REQUEST:
            r.request = s
        elif n == cv.SPAN_STAGE:
            r.stages[s.stage] = s
        elif n == cv.SPAN_STAGE_QUEUE:
            r.queues[s.stage] = s
    return reqs


def first_audio_emit(r: RequestSpans) -> tuple[int, int] | None:
    """(stage, time) of the first audio packet emitted by a stage."""
    best: tuple[int, int] | None = None
    for st, sp in r.stages.items():
        t = sp.emit_firsts[0]
        if t is not None and (best is None or t < best[1]):
            best = (st, t)
    if best is None and r.stages:  # no audio packet (modality unknown): first emit of the last stage
        last = max(r.stages)
        t = r.stages[last].emit_firsts[1]
        if t is not None:
            best = (last, t)
    return best


class _Walker:
    """Builds segments backward from T, clamping so they tile [A, T] exactly."""

    def __init__(self, arrival: int, ttfp: int) -> None:
        self.arrival = arrival
        self.cursor = ttfp
        self.segs: list[Segment] = []
        self.last_stage = cv.API_STAGE
        self.origin: int | None = None  # first stage, once the walk reached its queue

    def push(self, start: int, end: int, stage: int, cat: str, detail: str = "") -> None:
        end = min(end, self.cursor)
        if end < self.cursor:
            gap_start = max(end, self.arrival)
            if gap_start < self.cursor:
                self.segs.append(Segment(gap_start, self.cursor, self.last_stage, REMAINDER, "gap"))
                self.cursor = gap_start
        start = max(min(start, self.cursor), self.arrival)
        if start < self.cursor:
            self.segs.append(Segment(start, self.cursor, stage, cat, detail))
            self.cursor = start
        self.last_stage = stage

    def finish(self, parsed: int | None = None, dispatched: int | None = None) -> list[Segment]:
        if self.cursor > self.arrival:
            if self.origin is not None:  # [arrival, first stage's add]: parse, then dispatch
                api = cv.API_STAGE
                if dispatched is not None and self.arrival <= dispatched <= self.cursor:
                    self.push(dispatched, self.cursor, self.origin, DISPATCH, "inbox")
                if parsed is not None and self.arrival <= parsed <= self.cursor:
                    self.push(parsed, self.cursor, api, DISPATCH, "submit")
                    self.push(self.arrival, parsed, api, PARSE)
                else:
                    self.push(self.arrival, self.cursor, api, DISPATCH)
            else:
                self.segs.append(Segment(self.arrival, self.cursor, cv.API_STAGE, REMAINDER, "unwalked"))
                self.cursor = self.arrival
        return list(reversed(self.segs))


def _delivery(r: RequestSpans, w: _Walker, ttfp: int, missing: list[str]) -> tuple[int | None, int]:
    """The API's part, from the first audio packet's emit to the client's first packet
    (SSE write, event-loop lag, delivery); the emitting stage and the emit time."""
    emit = first_audio_emit(r)
    if emit is None:
        missing.append("omni.emit")
        return (max(r.stages) if r.stages else None), ttfp
    stage, t = emit
    api = cv.API_STAGE
    recv, resumed = r.request.packet_received, r.request.packet_resumed
    if resumed is not None and t <= resumed <= ttfp:
        w.push(resumed, ttfp, api, SSE_WRITE)
    if recv is not None and t <= recv <= w.cursor:
        w.push(recv, w.cursor, api, LOOP_LAG)
    w.push(t, w.cursor, api, DELIVER)
    return stage, t


def attribute(r: RequestSpans) -> Attribution | None:
    """The critical path of one request; None when it has no arrival or no first packet."""
    if r.request is None:
        return None
    arrival = r.request.start
    ttfp = r.request.ttfp
    if ttfp is None or ttfp < arrival:
        return None
    w = _Walker(arrival, ttfp)
    missing: list[str] = []
    hops: list[tuple[int, int, int]] = []
    stale: list[tuple[int, int, int]] = []
    stage, t = _delivery(r, w, ttfp, missing)
    seen: set[tuple[int, int, int]] = set()
    for _ in range(_MAX_HOPS):
        if stage is None:
            break
        ws = _gating_chunk(r.scheduled.get(stage, ()), min(t, w.cursor))
        key = (ws.peer, ws.stage, ws.chunk) if ws is not None else None
        if ws is None or key in seen:
            _origin(r, w, stage, t, missing)
            break
        seen.add(key)
        hops.append(key)
        w.push(ws.end, t, key[1], COMPUTE)
        w.push(ws.start, ws.end, key[1], WAIT_SCHEDULE)
        _hop(r, w, key, missing, stale)
        t = w.cursor
        stage = key[0]
    segs = w.finish(r.request.parsed, r.request.dispatched)
    return Attribution(r.rid, arrival, ttfp, segs, list(reversed(hops)), missing, stale)


def _origin(r: RequestSpans, w: _Walker, stage: int, t: int, missing: list[str]) -> None:
    """A stage with no (new) gating chunk: its compute from its queue's end, its queue."""
    q = r.queues.get(stage)
    if q is not None:
        w.push(q.end, t, stage, COMPUTE)
        w.push(q.start, q.end, stage, QUEUE)
        w.origin = stage
    elif stage in r.stages:
        missing.append(f"{cv.SPAN_STAGE_QUEUE}[{stage}]")
        w.push(r.stages[stage].start, t, stage, COMPUTE)
        w.origin = stage


def _hop(r: RequestSpans, w: _Walker, key: tuple[int, int, int], missing: list[str],
         stale: list[tuple[int, int, int]]) -> None:
    """One chunk walked back from its consumer's ready to its producer's first task span."""
    prod, cons, c = key
    where = f"[{prod}->{cons}#{c}]"
    csp = r.consumer.get(key, {})
    psp = r.producer.get(key, {})
    # the chunk's get and put, matched by causality (the ordering rule)
    get = _latest(csp.get(cv.SPAN_GET), w.cursor)
    put = _latest(psp.get(cv.SPAN_PUT), get.end if get is not None else w.cursor, begun=True)
    if get is None:
        missing.append(f"{cv.SPAN_GET}{where}")
    else:
        got = get.start if put is None else max(get.start, min(put.end, get.end))
        w.push(got, get.end, cons, GET, "overlap" if got > get.start else "")
    if get is None or put is None:
        missing.append(f"{cv.SPAN_POLL}{where}")
    else:
        w.push(put.end, max(get.start, put.end), cons, POLL_LAG)
    if put is None:
        missing.append(f"{cv.SPAN_PUT}{where}")
    else:
        w.push(put.start, put.end, prod, PUT)
    task = _task(psp, put, w.cursor)
    if task is None:  # only an earlier no-chunk task under this index: not recorded
        missing.append(f"task{where}")
        stale.append(key)
        return
    proc, f, snap, after = task
    for span, name in ((proc, cv.SPAN_PROCESS), (f, cv.SPAN_FIFO), (snap, cv.SPAN_SNAPSHOT)):
        if span is None:
            missing.append(f"{name}{where}")
    if proc is not None:
        w.push(proc.start, proc.end, prod, PROCESS)
    if after:  # MRv2: the snapshot after the dequeue, so walked before the FIFO wait
        w.push(snap.start, snap.end, prod, SNAPSHOT)
        snap = None
    if f is not None:
        blocked = max(0, min(f.blocked_ns, f.dur))
        # Order inside the residence does not change sums; own work is drawn last.
        w.push(f.end - (f.dur - blocked), f.end, prod, FIFO_OWN)
        w.push(f.start, f.start + blocked, prod, FIFO_BLOCKED)
    if snap is not None:
        w.push(snap.start, snap.end, prod, SNAPSHOT)


def _task(psp: dict[str, list[Span]], put: Span | None, cursor: int
          ) -> tuple[Span | None, Span | None, Span | None, bool] | None:
    """The producing task's (process, FIFO wait, snapshot, whether the snapshot followed
    the wait); None when the trace holds only
    no-chunk tasks under the chunk's index. It is the task that made this chunk: its
    process span carries the payload bytes. A producer runs one task per step and labels
    no-chunk tasks (0 bytes) with the index of the next chunk; if only such tasks are in
    the trace, the producing task was not recorded on its own, so its time stays in the
    producer's compute (walked next) and the hop is listed. Its spans are found on the
    producer's own clock (the ordering rule): the last process before the put, the last
    FIFO wait before the process; the snapshot is the last one between that wait's end and
    the process (MRv2: the output worker snapshots what it dequeued), else the last before
    the wait (V1: the scheduler snapshots, then enqueues)."""
    by = put.start if put is not None else cursor
    procs = [x for x in psp.get(cv.SPAN_PROCESS, ()) if x.end <= by] or psp.get(cv.SPAN_PROCESS, [])
    made = [x for x in procs if x.nbytes > 0]
    if put is not None and put.nbytes > 0 and procs and not made:
        return None
    proc = max(made, key=lambda x: x.end) if made else _latest(procs, by)
    cut = proc.start if proc is not None else by
    f = _latest(psp.get(cv.SPAN_FIFO), cut)
    snaps = psp.get(cv.SPAN_SNAPSHOT)
    last = max((s for s in snaps or () if s.end <= cut), key=lambda s: s.end, default=None)
    if f is not None and last is not None and last.start >= f.end:
        return proc, f, last, True
    return proc, f, _latest(snaps, f.start if f is not None else cut), False


def _latest(spans: list[Span] | None, t: int, begun: bool = False) -> Span | None:
    """Of several spans under one key, the one on the path: the latest ending (``begun``:
    beginning) by ``t``, or if none does, the latest of all."""
    if not spans:
        return None
    if len(spans) == 1:
        return spans[0]
    at = (lambda s: s.start) if begun else (lambda s: s.end)
    before = [s for s in spans if at(s) <= t]
    return max(before or spans, key=at)


def _gating_chunk(scheduled: Iterable[Span], t: int) -> Span | None:
    best: Span | None = None
    for s in scheduled:
        if s.end <= t and (best is None or s.end > best.end):
            best = s
    return best
