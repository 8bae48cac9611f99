"""The previous agent's per-event span assembler, kept as the Python reference that
``omnitrace.spantable`` (vectorised) is tested against: both must give the same spans
for the same events (tests/system/test_spantable.py).

Events -> spans and metric observations.

Input: per ring, batches of records ``(kind, request, stage, chunk, a, b, t)`` with the
ring's writer identity (pid, replica, role, thread) and clock offset. Output: finished
:class:`Span` objects (explicit start/end in unix ns, deterministic ids) and histogram
observations, handed to the sinks as soon as both stamps of a pair are known.

Pairing (one trace per request, ``conventions.trace_id_for(request)``):

* ``omni.request``  REQUEST_ARRIVE -> REQUEST_END (API server), events TTFT/TTFP.
* ``omni.stage``    STAGE_ADD -> STAGE_FINISH per (request, stage, replica);
  ``omni.stage.queue`` STAGE_ADD -> STAGE_SCHEDULE.
* producer chunk spans keyed (request, producer stage, chunk): snapshot, fifo
  (enqueue -> dequeue), process, put; consumer chunk spans keyed (request, consumer
  stage, chunk): get, wait_schedule (ready -> scheduled), and poll_lag (producer put
  end -> consumer get begin, joined on (request, producer stage, chunk)).

Span ids come from ``conventions.span_id_for`` over the span's identity, so a child
names its parent before (or without) the parent being seen, whichever process or drain
round delivers it.

FIFO blocking: each sender thread (pid, stage) is busy with one task at a time, from
its FIFO_DEQUEUE to its PUT_END (or PROCESS_END with no payload, or the next dequeue).
For a task enqueued at E and dequeued at D, ``omni.fifo.blocked_ns`` is the total
overlap of [E, D] with that sender's busy intervals of tasks of *other* requests, and
``omni.fifo.blocked_by`` the (up to) three requests with the largest overlap.
``omni.fifo.ahead`` is the FIFO depth before the enqueue (tasks ahead),
``omni.fifo.depth`` the depth after it (ahead + 1).

Memory stays bounded: a request's state is freed a grace period after it completed
(REQUEST_END seen and all its stages finished, or, without an API server, all stages
finished) or after an idle timeout; spans still open then are emitted with
``omni.incomplete = true`` and a reason. Sender busy intervals are kept for a bounded
horizon.
"""
from __future__ import annotations

import bisect
import hashlib
import time
from collections import defaultdict
from typing import Callable, Iterable, Protocol

from omnitrace import conventions as cv
from omnitrace.agent.export_prometheus import HistogramSet
from omnitrace.otlp import _json_str as json_str
from omnitrace.otlp import _key_head as attr_head

E = cv.Ev


_NO_EVENTS: tuple = ()  # shared: most spans have no events


class Span:
    """A finished span with explicit times (unix ns) and deterministic ids."""

    __slots__ = ("name", "trace_id", "span_id", "parent_id", "start", "end", "attrs",
                 "events", "proc", "error", "text")

    def __init__(self, name: str, trace_id: int, span_id: int, parent_id: int | None,
                 start: int, end: int, attrs: dict, proc: tuple,
                 events: list | None = None, error: bool = False,
                 text: str | None = None) -> None:
        self.name, self.trace_id, self.span_id, self.parent_id = name, trace_id, span_id, parent_id
        self.start, self.end = start, max(end, start)
        self.attrs, self.proc, self.events, self.error = attrs, proc, events or _NO_EVENTS, error
        # the whole span as its OTLP/JSON object (what the file exporter writes), or None:
        # the assembler renders chunk spans from cached fragments, formatting only numbers
        self.text = text

    def __repr__(self) -> str:  # for test failure messages
        return f"Span({self.name} {self.attrs.get(cv.ATTR_REQUEST_ID)} {self.start}->{self.end})"


class MetricSink(Protocol):
    def observe(self, metric: str, value: float, labels: tuple[str, str, str],
                trace_hex: str | None) -> None: ...


class Proc:
    """What a span's resource says about the process that recorded it."""

    @staticmethod
    def key(pid: int, role: str, stage: int, replica: int, name: str) -> tuple:
        return (pid, role, stage, replica, name)


# producer pairs: begin kind -> (end kind, span name)
_PROD_PAIRS = {E.SNAPSHOT_BEGIN: (E.SNAPSHOT_END, cv.SPAN_SNAPSHOT),
               E.FIFO_ENQUEUE: (E.FIFO_DEQUEUE, cv.SPAN_FIFO),
               E.PROCESS_BEGIN: (E.PROCESS_END, cv.SPAN_PROCESS),
               E.PUT_BEGIN: (E.PUT_END, cv.SPAN_PUT)}
_CONS_PAIRS = {E.GET_BEGIN: (E.GET_END, cv.SPAN_GET),
               E.CHUNK_READY: (E.CHUNK_SCHEDULED, cv.SPAN_WAIT_SCHEDULE)}
_END_TO_BEGIN = {end: begin for pairs in (_PROD_PAIRS, _CONS_PAIRS)
                 for begin, (end, _) in pairs.items()}
# plain ints: Enum attribute access costs more than a global in the per-event path
_FIFO_DEQUEUE = int(E.FIFO_DEQUEUE)
_GET_BEGIN = int(E.GET_BEGIN)
_PROCESS_END = int(E.PROCESS_END)
_PUT_END = int(E.PUT_END)
_REQUEST_ARRIVE = int(E.REQUEST_ARRIVE)
_REQUEST_END = int(E.REQUEST_END)
_REQUEST_FIRST_AUDIO = int(E.REQUEST_FIRST_AUDIO)
_REQUEST_FIRST_TEXT = int(E.REQUEST_FIRST_TEXT)
_STAGE_ADD = int(E.STAGE_ADD)
_STAGE_EMIT = int(E.STAGE_EMIT)
_STAGE_FINISH = int(E.STAGE_FINISH)
_STAGE_SCHEDULE = int(E.STAGE_SCHEDULE)
_PRODUCER_KINDS = frozenset(k for b, (e, _) in _PROD_PAIRS.items() for k in (b, e))
_CONSUMER_KINDS = frozenset(k for b, (e, _) in _CONS_PAIRS.items() for k in (b, e))


class _Chunk:
    """Unpaired stamps of one chunk key on one side: begin kind -> ([begins], [ends]),
    each stamp (wall_ns, a, b). Pairs match in order, so a key reused by a retried task
    (same request, stage and chunk index) gives a second span, not a mismatched one."""

    __slots__ = ("pend", "proc", "replica")

    def __init__(self, proc: tuple, replica: int) -> None:
        self.pend: dict[int, tuple[list, list]] = {}
        self.proc, self.replica = proc, replica


class _Stage:
    __slots__ = ("add", "sched", "finish", "status", "emits", "proc", "replica", "name",
                 "done", "queue_done", "last")

    def __init__(self, proc: tuple, replica: int, name: str) -> None:
        self.add = self.sched = self.finish = None
        self.status = 0
        self.emits: list = []
        self.proc, self.replica, self.name = proc, replica, name
        self.done = self.queue_done = False
        self.last = 0


class _Req:
    __slots__ = ("id", "trace_id", "root_id", "arrive", "end", "first_text", "first_audio",
                 "prompt_tokens", "max_tokens", "status", "api_proc", "api_replica",
                 "stages", "prod", "put_end", "get_begin", "occ", "cons", "trace_hex", "last_wall", "last_mono", "complete_at", "done",
                 "sids", "hashers", "rid_text", "marks")

    def __init__(self, rid: str) -> None:
        self.id = rid
        self.trace_id = cv.trace_id_for(rid)
        self.trace_hex = f"{self.trace_id:032x}"  # exemplar label, formatted once
        self.rid_text: str | None = None  # request-id attribute as OTLP/JSON, on first chunk span
        self.root_id = cv.span_id_for(rid, cv.SPAN_REQUEST)
        self.marks: list = []  # API marks (conventions.API_MARKS): request-span events
        self.arrive = self.end = self.first_text = self.first_audio = None
        self.prompt_tokens = self.max_tokens = None
        self.status = 0
        self.api_proc: tuple | None = None
        self.api_replica = 0
        self.stages: dict[tuple[int, int], _Stage] = {}
        self.prod: dict[tuple[int, int], _Chunk] = {}
        self.put_end: dict[tuple[int, int], int] = {}  # (producer stage, chunk) -> put end
        self.get_begin: dict[tuple[int, int], tuple] = {}  # (producer stage, chunk) -> get begin
        self.occ: dict[tuple, int] = {}  # chunk span identity -> times emitted
        self.cons: dict[tuple[int, int], _Chunk] = {}
        self.last_wall = 0
        self.last_mono = 0.0
        self.complete_at: float | None = None
        self.done = False
        self.sids: dict[tuple[int, int], int] = {}  # (stage, replica) -> omni.stage span id
        self.hashers: dict[str, object] = {}  # span name -> blake2b primed with "rid\x1fname\x1f"

    def chunk_sid(self, name: str, stage: int, chunk: int, peer: int) -> int:
        """== conventions.span_id_for(rid, name, stage, chunk, peer), at a third of the cost:
        the hash state over the common prefix is computed once per request and name."""
        h = self.hashers.get(name)
        if h is None:
            h = self.hashers[name] = hashlib.blake2b(f"{self.id}\x1f{name}\x1f".encode(),
                                                     digest_size=8)
        h = h.copy()  # type: ignore[attr-defined]
        h.update(f"{stage}\x1f{chunk}\x1f{peer}".encode())
        return int.from_bytes(h.digest(), "big") or 1

    def stage_sid(self, stage: int, replica: int) -> int:
        sid = self.sids.get((stage, replica))
        if sid is None:  # hashing is most of a span's cost: once per stage, not per chunk
            sid = self.sids[(stage, replica)] = cv.span_id_for(self.id, cv.SPAN_STAGE, stage, replica)
        return sid


class _Sender:
    """Busy intervals of one sender thread (sorted, non-overlapping)."""

    __slots__ = ("starts", "ends", "reqs", "open")
    MAX = 1 << 14  # intervals kept per sender (older ones only matter to very old enqueues)

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.reqs: list[str] = []
        self.open: tuple[int, str, int] | None = None  # (start, request, chunk)

    def close(self, t: int) -> None:
        if self.open is not None:
            start, req, _ = self.open
            self.starts.append(start)
            self.ends.append(max(t, start))
            self.reqs.append(req)
            self.open = None
            if len(self.starts) > 2 * self.MAX:
                del self.starts[:self.MAX], self.ends[:self.MAX], self.reqs[:self.MAX]

    def blocked(self, req: str, enq: int, deq: int) -> tuple[int, list[str]]:
        total = 0
        by: dict[str, int] = defaultdict(int)
        i = bisect.bisect_right(self.ends, enq)
        starts, ends, reqs = self.starts, self.ends, self.reqs
        n = len(starts)
        while i < n and starts[i] < deq:
            if reqs[i] != req:
                ov = min(ends[i], deq) - max(starts[i], enq)
                if ov > 0:
                    total += ov
                    by[reqs[i]] += ov
            i += 1
        top = sorted(by.items(), key=lambda kv: -kv[1])[:3]
        return total, [r for r, _ in top]


_SPAN_FIFO, _SPAN_PUT, _SPAN_GET = cv.SPAN_FIFO, cv.SPAN_PUT, cv.SPAN_GET
_SPAN_PROCESS, _SPAN_SNAPSHOT = cv.SPAN_PROCESS, cv.SPAN_SNAPSHOT
_NAME_KIND = {n: f'"name":{json_str(n)},"kind":1,' for n in (
    cv.SPAN_FIFO, cv.SPAN_PUT, cv.SPAN_GET, cv.SPAN_PROCESS, cv.SPAN_SNAPSHOT, cv.SPAN_POLL,
    cv.SPAN_WAIT_SCHEDULE)}
_SNAP_NAMES = {int(v): v.name.lower() for v in cv.Snapshot if int(v) in (0, 1)}
_H_BYTES = attr_head(cv.ATTR_TRANSFER_BYTES)
_H_AHEAD = attr_head(cv.ATTR_FIFO_AHEAD)
_H_DEPTH = attr_head(cv.ATTR_FIFO_DEPTH)
_H_BLOCKED = attr_head(cv.ATTR_FIFO_BLOCKED_NS)
_H_BY = attr_head(cv.ATTR_FIFO_BLOCKED_BY)
_H_STRATEGY = attr_head(cv.ATTR_SNAPSHOT_STRATEGY)


class _LazyAttrs:
    """A chunk span's attributes, made into a dict when a Span object is built."""

    __slots__ = ("rid", "stage", "peer", "chunk", "replica", "pair", "extra")

    def __init__(self, rid: str, stage: int, peer: int, chunk: int, replica: int, pair: str,
                 extra: tuple) -> None:
        self.rid, self.stage, self.peer, self.chunk = rid, stage, peer, chunk
        self.replica, self.pair, self.extra = replica, pair, extra

    def __call__(self) -> dict:
        d = {cv.ATTR_REQUEST_ID: self.rid, cv.ATTR_STAGE_ID: self.stage,
             cv.ATTR_PEER_STAGE_ID: self.peer, cv.ATTR_CHUNK_INDEX: self.chunk,
             cv.ATTR_REPLICA: self.replica, cv.ATTR_STAGE_PAIR: self.pair}
        x = self.extra
        for i in range(0, len(x), 2):
            d[x[i]] = x[i + 1]
        return d


class _SinkChild:
    """A (metric, labels) handle over a generic MetricSink (tests, other sinks)."""

    __slots__ = ("sink", "metric", "labels")

    def __init__(self, sink: Callable, metric: str, labels: tuple) -> None:
        self.sink, self.metric, self.labels = sink, metric, labels

    def observe(self, value: float, trace_hex: str | None) -> None:
        self.sink(self.metric, value, self.labels, trace_hex)


class _Ctx:
    """What is constant for chunk spans of one (stage, peer, replica, side): the stage
    pair, metric labels, pre-bound histogram children and the OTLP/JSON text of the
    identity attributes around the chunk index."""

    __slots__ = ("pair", "labels", "mid", "tail", "fifo_res", "fifo_blk", "fifo_depth",
                 "snap", "put", "size", "get")

    def __init__(self, stage: int, peer: int, replica: int, pair: str, labels: tuple,
                 child: Callable[[str, tuple], object]) -> None:
        self.pair, self.labels = pair, labels
        self.mid = (f',{attr_head(cv.ATTR_STAGE_ID)}{{"intValue":"{stage}"}}}},'
                    f'{attr_head(cv.ATTR_PEER_STAGE_ID)}{{"intValue":"{peer}"}}}},'
                    f'{attr_head(cv.ATTR_CHUNK_INDEX)}{{"intValue":"')
        self.tail = (f'"}}}},{attr_head(cv.ATTR_REPLICA)}{{"intValue":"{replica}"}}}},'
                     f'{attr_head(cv.ATTR_STAGE_PAIR)}{{"stringValue":{json_str(pair)}}}}}')
        self.fifo_res = child(cv.METRIC_FIFO_RESIDENCE, labels)
        self.fifo_blk = child(cv.METRIC_FIFO_BLOCKED, labels)
        self.fifo_depth = child(cv.METRIC_FIFO_DEPTH, labels)
        self.snap = child(cv.METRIC_SNAPSHOT, labels)
        self.put = child(cv.METRIC_PUT, labels)
        self.size = child(cv.METRIC_SIZE, labels)
        self.get = child(cv.METRIC_GET, labels)


class Assembler:
    """Turns ring events into spans (``on_span``) and observations (``metrics``)."""

    def __init__(self, on_span: Callable[[Span], None], metrics: MetricSink | None = None,
                 grace_s: float = 2.0, idle_timeout_s: float = 120.0,
                 ended_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 text_only: bool = False) -> None:
        self.on_span = on_span
        # text_only: complete chunk spans (7 of every 12 events) are not built as Span
        # objects at all; their OTLP/JSON text is collected per process in ``texts`` for
        # the file exporter. For agents without an OTLP exporter (the always-on path).
        self.texts: dict[tuple, list[str]] | None = {} if text_only else None
        self.metrics = metrics
        self.grace_s, self.idle_timeout_s, self.clock = grace_s, idle_timeout_s, clock
        # REQUEST_END seen but a stage never finished (its FINISH lost or still in an
        # undrained ring): free after this long without events
        self.ended_timeout_s = ended_timeout_s
        self.reqs: dict[str, _Req] = {}
        self.senders: dict[tuple[int, int], _Sender] = {}
        self.dead_pids: set[int] = set()
        self.spans_built = 0
        self.incomplete_spans = 0
        self.requests_freed = 0
        self.events = 0
        self._labels: dict[tuple, tuple[str, tuple[str, str, str]]] = {}
        self._ctx: dict[tuple, _Ctx] = {}
        hist = getattr(metrics, "hist", None)
        if isinstance(hist, HistogramSet):  # observe straight into the bucket arrays
            self._child: Callable[[str, tuple], object] = hist.child
        else:
            self._child = lambda metric, labels: _SinkChild(self._observe, metric, labels)
        self.unknown_events = 0
        self.step_events = 0

    # ------------------------------------------------------------------ input
    def feed(self, events: Iterable[tuple], offset_ns: int, pid: int, replica: int,
             role: str, proc_stage: int, proc_name: str) -> None:
        """One ring's batch, in that ring's order. ``offset_ns`` converts t to unix ns."""
        proc = (pid, role, proc_stage, replica, proc_name)
        now = self.clock()
        if not isinstance(events, (list, tuple)):
            events = list(events)
        self.events += len(events)
        reqs = self.reqs
        for kind, req, stage, chunk, a, b, t in events:
            wall = t + offset_ns
            if not req:
                self.step_events += 1  # per-step events carry no request
                continue
            st = reqs.get(req)
            if st is None:
                st = reqs[req] = _Req(req)
            st.last_mono = now
            if wall > st.last_wall:
                st.last_wall = wall
            st.complete_at = None
            if kind in _PRODUCER_KINDS:
                self._producer(st, kind, stage, chunk, a, b, wall, proc, replica, pid)
            elif kind in _CONSUMER_KINDS:
                self._consumer(st, kind, stage, chunk, a, b, wall, proc, replica)
            elif _STAGE_ADD <= kind <= _STAGE_EMIT:
                self._stage(st, kind, stage, a, b, wall, proc, replica, proc_name)
            elif _REQUEST_ARRIVE <= kind <= _REQUEST_END or kind in cv.API_MARKS:
                self._request(st, kind, a, b, wall, proc, replica)
            else:
                self.unknown_events += 1
            if (kind == _STAGE_FINISH or kind == _REQUEST_END or st.end is not None) and \
                    self._complete(st):  # only these can complete a request: skip the walk
                st.complete_at = now

    # ------------------------------------------------------------------ request / stage
    def _request(self, st: _Req, kind: int, a: int, b: int, wall: int, proc: tuple,
                 replica: int) -> None:
        st.api_proc, st.api_replica = proc, replica
        if kind == _REQUEST_ARRIVE:
            st.arrive, st.prompt_tokens, st.max_tokens = wall, a, b
        elif kind == _REQUEST_FIRST_TEXT:
            if st.first_text is None:
                st.first_text = wall
                if st.arrive is not None:
                    self._observe(cv.METRIC_TTFT, (wall - st.arrive) / 1e9,
                                  (str(cv.API_STAGE), str(replica), ""), st.trace_hex)
        elif kind == _REQUEST_FIRST_AUDIO:
            if st.first_audio is None:
                st.first_audio = wall
                if st.arrive is not None:
                    self._observe(cv.METRIC_TTFP, (wall - st.arrive) / 1e9,
                                  (str(cv.API_STAGE), str(replica), ""), st.trace_hex)
        elif kind == _REQUEST_END:
            st.end, st.status = wall, a
            self._emit_request(st, None)
        elif kind in cv.API_MARKS:
            st.marks.append((cv.API_MARKS[kind], wall, {}))

    def _emit_request(self, st: _Req, reason: str | None) -> None:
        if st.done or (st.arrive is None and reason is None):
            return
        st.done = True
        start = st.arrive if st.arrive is not None else (st.end or st.last_wall)
        end = st.end if st.end is not None else st.last_wall
        attrs: dict = {cv.ATTR_REQUEST_ID: st.id, cv.ATTR_STATUS: int(st.status),
                       cv.ATTR_REPLICA: st.api_replica}
        if st.prompt_tokens is not None:
            attrs[cv.ATTR_PROMPT_TOKENS] = st.prompt_tokens
            attrs[cv.ATTR_MAX_TOKENS] = st.max_tokens
        events = []
        if st.first_text is not None:
            events.append((cv.EVENT_TTFT, st.first_text, {}))
        if st.first_audio is not None:
            events.append((cv.EVENT_TTFP, st.first_audio, {}))
        events.extend(st.marks)
        self._span(cv.SPAN_REQUEST, st, st.root_id, None, start, end, attrs,
                   st.api_proc or (0, "api", cv.API_STAGE, 0, ""), events,
                   error=st.status != cv.Status.OK, reason=reason)

    def _stage(self, st: _Req, kind: int, stage: int, a: int, b: int, wall: int,
               proc: tuple, replica: int, proc_name: str) -> None:
        sg = st.stages.get((stage, replica))
        if sg is None:
            sg = st.stages[(stage, replica)] = _Stage(proc, replica, proc_name)
        sg.last = max(sg.last, wall)
        if kind == _STAGE_ADD:
            if sg.add is None:
                sg.add = wall
        elif kind == _STAGE_SCHEDULE:
            if sg.sched is None:
                sg.sched = wall
                self._emit_queue(st, stage, sg, None)
        elif kind == _STAGE_FINISH:
            sg.finish, sg.status = wall, a
            self._emit_stage(st, stage, sg, None)
        elif kind == _STAGE_EMIT:
            sg.emits.append((cv.EVENT_EMIT, wall, {cv.ATTR_PACKET_INDEX: a,
                                                   cv.ATTR_MODALITY: cv.Modality(b).name.lower()
                                                   if b in (0, 1) else str(b)}))

    def _stage_attrs(self, st: _Req, stage: int, sg: _Stage) -> dict:
        return {cv.ATTR_REQUEST_ID: st.id, cv.ATTR_STAGE_ID: stage,
                cv.ATTR_STAGE_NAME: sg.name or f"stage{stage}", cv.ATTR_REPLICA: sg.replica}

    def _emit_queue(self, st: _Req, stage: int, sg: _Stage, reason: str | None) -> None:
        if sg.queue_done or (sg.add is None and (reason is None or sg.sched is None)):
            return
        sg.queue_done = True
        start = sg.add if sg.add is not None else sg.sched
        end = sg.sched if sg.sched is not None else sg.last
        parent = st.stage_sid(stage, sg.replica)
        self._span(cv.SPAN_STAGE_QUEUE, st, cv.span_id_for(st.id, cv.SPAN_STAGE_QUEUE, stage, sg.replica),
                   parent, start, end, self._stage_attrs(st, stage, sg), sg.proc, reason=reason)

    def _emit_stage(self, st: _Req, stage: int, sg: _Stage, reason: str | None) -> None:
        if sg.done:
            return
        sg.done = True
        start = sg.add if sg.add is not None else (sg.sched or sg.last)
        end = sg.finish if sg.finish is not None else sg.last
        self._span(cv.SPAN_STAGE, st, st.stage_sid(stage, sg.replica),
                   st.root_id, start, end, self._stage_attrs(st, stage, sg), sg.proc,
                   sg.emits, error=sg.status not in (0,), reason=reason)
        sg.emits = []

    # ------------------------------------------------------------------ chunks
    def _pair(self, st: _Req, side: dict, pairs: dict, kind: int, stage: int, chunk: int,
              a: int, b: int, wall: int, proc: tuple, replica: int, producer: bool,
              pid: int) -> None:
        key = (stage, chunk)
        ch = side.get(key)
        if ch is None:
            ch = side[key] = _Chunk(proc, replica)
        begin = _END_TO_BEGIN.get(kind, kind)
        pend = ch.pend
        p = pend.get(begin)
        is_begin = kind == begin
        # the usual case: the other stamp of the pair is waiting alone -> pair at once,
        # without appending and popping (this runs for every chunk event)
        if p is not None:
            other = p[1] if is_begin else p[0]
            mine = p[0] if is_begin else p[1]
            if other and not mine:
                o = other.pop(0)
                if not other:
                    del pend[begin]
                    if not pend:  # nothing left open: its memory goes now, not at request end
                        del side[key]
                stamp = (wall, a, b)
                if is_begin:
                    self._emit_chunk(st, ch, pairs[begin][1], stamp, o, stage, chunk, producer,
                                     pid, None)
                else:
                    self._emit_chunk(st, ch, pairs[begin][1], o, stamp, stage, chunk, producer,
                                     pid, None)
                return
            mine.append((wall, a, b))
            return
        pend[begin] = ([(wall, a, b)], []) if is_begin else ([], [(wall, a, b)])

    def _producer(self, st: _Req, kind: int, stage: int, chunk: int, a: int, b: int,
                  wall: int, proc: tuple, replica: int, pid: int) -> None:
        # sender busy intervals first, so a dequeue closes the previous task
        if kind == _FIFO_DEQUEUE or kind == _PUT_END or kind == _PROCESS_END:
            snd = self.senders.get((pid, stage))
            if snd is None:
                snd = self.senders[(pid, stage)] = _Sender()
            if kind == _FIFO_DEQUEUE:
                snd.close(wall)
                snd.open = (wall, st.id, chunk)
            elif snd.open is not None and snd.open[1] == st.id and (
                    kind == _PUT_END or (a == 0 and snd.open[2] == chunk)):
                snd.close(wall)
        self._pair(st, st.prod, _PROD_PAIRS, kind, stage, chunk, a, b, wall, proc, replica,
                   True, pid)
        if kind == _PUT_END:  # poll lag: producer put end -> consumer get begin
            got = st.get_begin.pop((stage, chunk), None)
            if got is None:
                st.put_end[(stage, chunk)] = wall
            else:
                self._emit_poll(st, wall, got, stage, chunk)

    def _consumer(self, st: _Req, kind: int, stage: int, chunk: int, a: int, b: int,
                  wall: int, proc: tuple, replica: int) -> None:
        self._pair(st, st.cons, _CONS_PAIRS, kind, stage, chunk, a, b, wall, proc, replica,
                   False, 0)
        if kind == _GET_BEGIN:
            put_end = st.put_end.pop((b, chunk), None)
            got = (wall, stage, replica, proc)
            if put_end is None:
                st.get_begin[(b, chunk)] = got
            else:
                self._emit_poll(st, put_end, got, b, chunk)

    def _chunk_attrs(self, st: _Req, stage: int, peer: int, chunk: int, replica: int) -> dict:
        return {cv.ATTR_REQUEST_ID: st.id, cv.ATTR_STAGE_ID: stage, cv.ATTR_PEER_STAGE_ID: peer,
                cv.ATTR_CHUNK_INDEX: chunk, cv.ATTR_REPLICA: replica}

    def _sid(self, st: _Req, name: str, stage: int, chunk: int, peer: int) -> int:
        key = (name, stage, chunk, peer)
        n = st.occ.get(key, 0)
        st.occ[key] = n + 1
        # the first span of a key has the documented id; a repeat (retried task) a new one
        return st.chunk_sid(name, stage, chunk if n == 0 else f"{chunk}.{n}", peer)  # type: ignore[arg-type]

    def _ctx_for(self, stage: int, peer: int, replica: int, producer: bool) -> "_Ctx":
        key = (stage, peer, replica, producer)
        ctx = self._ctx.get(key)
        if ctx is None:
            pair = cv.stage_pair(stage, peer) if producer else cv.stage_pair(peer, stage)
            labels = (str(stage), str(replica), pair)
            self._labels[key] = (pair, labels)
            ctx = self._ctx[key] = _Ctx(stage, peer, replica, pair, labels, self._child)
        return ctx

    def _emit_chunk(self, st: _Req, ch: _Chunk, name: str, b0: tuple | None, e0: tuple | None,
                    stage: int, chunk: int, producer: bool, pid: int,
                    reason: str | None) -> None:
        """A chunk span. The common case (both stamps, no reason) is written out flat:
        it runs for 7 of every 12 events, so its dict/attribute churn and method calls
        were most of the assembler's cost; incomplete spans take the general path."""
        if reason is not None or b0 is None or e0 is None:
            self._emit_chunk_slow(st, ch, name, b0, e0, stage, chunk, producer, pid, reason)
            return
        start = b0[0]
        end = e0[0]
        peer = e0[2]
        replica = ch.replica
        ctx = self._ctx.get((stage, peer, replica, producer))
        if ctx is None:
            ctx = self._ctx_for(stage, peer, replica, producer)
        rid = st.rid_text
        if rid is None:
            rid = st.rid_text = attr_head(cv.ATTR_REQUEST_ID) + '{"stringValue":' + json_str(st.id) + "}}"
        hexs = st.trace_hex
        head = f"{rid}{ctx.mid}{chunk}{ctx.tail}"
        extra: tuple = ()
        if name == _SPAN_PUT:
            nbytes = e0[1]
            extra = (cv.ATTR_TRANSFER_BYTES, nbytes)
            text = f'{head},{_H_BYTES}{{"intValue":"{nbytes}"}}}}'
            ctx.put.observe((end - start) / 1e9, hexs)
            ctx.size.observe(float(nbytes), hexs)
        elif name == _SPAN_FIFO:
            ahead = b0[1]
            snd = self.senders.get((pid, stage))
            blocked, by = snd.blocked(st.id, start, end) if snd else (0, [])
            extra = (cv.ATTR_FIFO_AHEAD, ahead, cv.ATTR_FIFO_DEPTH, ahead + 1,
                     cv.ATTR_FIFO_BLOCKED_NS, blocked, cv.ATTR_FIFO_BLOCKED_BY, by)
            by_text = ('{"arrayValue":{"values":[' + ",".join(
                '{"stringValue":' + json_str(r) + "}" for r in by) + "]}}") if by \
                else '{"arrayValue":{}}'
            text = (f'{head},{_H_AHEAD}{{"intValue":"{ahead}"}}}},'
                    f'{_H_DEPTH}{{"intValue":"{ahead + 1}"}}}},'
                    f'{_H_BLOCKED}{{"intValue":"{blocked}"}}}},{_H_BY}{by_text}}}')
            ctx.fifo_res.observe((end - start) / 1e9, hexs)
            ctx.fifo_blk.observe(blocked / 1e9, hexs)
            ctx.fifo_depth.observe(float(ahead + 1), None)
        elif name == _SPAN_PROCESS or name == _SPAN_GET:
            nbytes = e0[1]
            extra = (cv.ATTR_TRANSFER_BYTES, nbytes)
            text = f'{head},{_H_BYTES}{{"intValue":"{nbytes}"}}}}'
            if name == _SPAN_GET:
                ctx.get.observe((end - start) / 1e9, hexs)
        elif name == _SPAN_SNAPSHOT:
            strat = e0[1]
            strat_s = _SNAP_NAMES.get(strat) or str(strat)
            extra = (cv.ATTR_SNAPSHOT_STRATEGY, strat_s)
            text = f'{head},{_H_STRATEGY}{{"stringValue":{json_str(strat_s)}}}}}'
            ctx.snap.observe((end - start) / 1e9, hexs)
        else:  # wait_schedule: identity attributes only
            text = head
        if self.texts is None:
            attrs = _LazyAttrs(st.id, stage, peer, chunk, replica, ctx.pair, extra)
        else:
            attrs = None
        self._fast_span(st, name, stage, chunk, peer, replica, start, end, attrs, text, ch.proc)

    def _fast_span(self, st: _Req, name: str, stage: int, chunk: int, peer: int, replica: int,
                   start: int, end: int, attrs: "_LazyAttrs | None", attrs_text: str,
                   proc: tuple) -> None:
        """A complete chunk span (no events, no error) with its JSON text; ``_sid`` and
        ``_span`` inlined."""
        key = (name, stage, chunk, peer)
        occ = st.occ
        n = occ.get(key, 0)
        occ[key] = n + 1
        sid = st.chunk_sid(name, stage, chunk if n == 0 else f"{chunk}.{n}", peer)  # type: ignore[arg-type]
        parent = st.stage_sid(stage, replica)
        if end < start:
            end = start
        self.spans_built += 1
        text = (f'{{"traceId":"{st.trace_hex}","spanId":"{sid:016x}",'
                f'"parentSpanId":"{parent:016x}",{_NAME_KIND[name]}'
                f'"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}",'
                f'"attributes":[{attrs_text}],"status":{{}},"flags":256}}')
        texts = self.texts
        if texts is None:
            self.on_span(Span(name, st.trace_id, sid, parent, start, end, attrs(), proc, None,
                              False, text))
        else:
            out = texts.get(proc)
            if out is None:
                out = texts[proc] = []
            out.append(text)

    def _emit_chunk_slow(self, st: _Req, ch: _Chunk, name: str, b0: tuple | None, e0: tuple | None,
                    stage: int, chunk: int, producer: bool, pid: int,
                    reason: str | None) -> None:
        start = b0[0] if b0 else e0[0]  # type: ignore[index]
        end = e0[0] if e0 else max(start, st.last_wall)
        peer = (e0 or b0)[2]  # type: ignore[index]
        key = (stage, peer, ch.replica, producer)
        cached = self._labels.get(key)
        if cached is None:
            pair = cv.stage_pair(stage, peer) if producer else cv.stage_pair(peer, stage)
            cached = self._labels[key] = (pair, (str(stage), str(ch.replica), pair))
        pair, labels = cached
        attrs = self._chunk_attrs(st, stage, peer, chunk, ch.replica)
        attrs[cv.ATTR_STAGE_PAIR] = pair
        complete = reason is None
        if name == cv.SPAN_WAIT_SCHEDULE and b0 is not None and e0 is None and reason is not None:
            reason = "consumer-never-scheduled"  # ready, never taken into a step
        if name == cv.SPAN_FIFO:
            if b0 is not None:
                attrs[cv.ATTR_FIFO_AHEAD] = b0[1]
                attrs[cv.ATTR_FIFO_DEPTH] = b0[1] + 1
            if complete:
                snd = self.senders.get((pid, stage))
                blocked, by = snd.blocked(st.id, start, end) if snd else (0, [])
                attrs[cv.ATTR_FIFO_BLOCKED_NS] = blocked
                attrs[cv.ATTR_FIFO_BLOCKED_BY] = by
                self._observe(cv.METRIC_FIFO_RESIDENCE, (end - start) / 1e9, labels, st.trace_hex)
                self._observe(cv.METRIC_FIFO_BLOCKED, blocked / 1e9, labels, st.trace_hex)
                self._observe(cv.METRIC_FIFO_DEPTH, float(b0[1] + 1), labels, None)  # type: ignore[index]
        elif name == cv.SPAN_SNAPSHOT:
            if e0 is not None:
                attrs[cv.ATTR_SNAPSHOT_STRATEGY] = (cv.Snapshot(e0[1]).name.lower()
                                                    if e0[1] in (0, 1) else str(e0[1]))
            if complete:
                self._observe(cv.METRIC_SNAPSHOT, (end - start) / 1e9, labels, st.trace_hex)
        elif name == cv.SPAN_PROCESS:
            if e0 is not None:
                attrs[cv.ATTR_TRANSFER_BYTES] = e0[1]
            if complete:
                self._observe(cv.METRIC_PROCESS, (end - start) / 1e9, labels, st.trace_hex)
        elif name == cv.SPAN_PUT:
            if e0 is not None:
                attrs[cv.ATTR_TRANSFER_BYTES] = e0[1]
            if complete:
                self._observe(cv.METRIC_PUT, (end - start) / 1e9, labels, st.trace_hex)
                self._observe(cv.METRIC_SIZE, float(e0[1]), labels, st.trace_hex)  # type: ignore[index]
        elif name == cv.SPAN_GET:
            if e0 is not None:
                attrs[cv.ATTR_TRANSFER_BYTES] = e0[1]
            if complete:
                self._observe(cv.METRIC_GET, (end - start) / 1e9, labels, st.trace_hex)
        parent = st.stage_sid(stage, ch.replica)
        self._span(name, st, self._sid(st, name, stage, chunk, peer), parent, start, end, attrs,
                   ch.proc, reason=reason)

    def _emit_poll(self, st: _Req, put_end: int, got: tuple, pstage: int, chunk: int) -> None:
        get_begin, cstage, replica, proc = got
        ctx = self._ctx.get((cstage, pstage, replica, False))
        if ctx is None:
            ctx = self._ctx_for(cstage, pstage, replica, False)
        rid = st.rid_text
        if rid is None:
            rid = st.rid_text = attr_head(cv.ATTR_REQUEST_ID) + '{"stringValue":' + json_str(st.id) + "}}"
        # the consumer side's pair is producer->consumer
        attrs = (_LazyAttrs(st.id, cstage, pstage, chunk, replica, ctx.pair, ())
                 if self.texts is None else None)
        self._fast_span(st, cv.SPAN_POLL, cstage, chunk, pstage, replica, put_end, get_begin,
                        attrs, f"{rid}{ctx.mid}{chunk}{ctx.tail}", proc)

    # ------------------------------------------------------------------ output
    def _span(self, name: str, st: _Req, sid: int, parent: int | None, start: int, end: int,
              attrs: dict, proc: tuple, events: list | None = None, error: bool = False,
              reason: str | None = None) -> None:
        if reason is not None:
            attrs[cv.ATTR_INCOMPLETE] = True
            attrs[cv.ATTR_INCOMPLETE_REASON] = ("writer-died" if proc[0] in self.dead_pids
                                                and reason != "consumer-never-scheduled" else reason)
            self.incomplete_spans += 1
        self.spans_built += 1
        self.on_span(Span(name, st.trace_id, sid, parent, start, end, attrs, proc, events, error))

    def _observe(self, metric: str, value: float, labels: tuple[str, str, str],
                 trace_hex: str | None) -> None:
        if self.metrics is not None:
            self.metrics.observe(metric, value, labels, trace_hex)

    # ------------------------------------------------------------------ lifetime
    @staticmethod
    def _complete(st: _Req) -> bool:
        if st.arrive is not None or st.end is not None:
            if st.end is None:
                return False
        elif not st.stages:
            return False
        return all(sg.finish is not None for sg in st.stages.values())

    def process_died(self, pid: int) -> None:
        self.dead_pids.add(pid)

    def tick(self) -> int:
        """Free requests that completed a grace period ago or went idle; returns how many."""
        now = self.clock()
        gone = []
        for rid, st in self.reqs.items():
            if st.complete_at is not None and now - st.complete_at >= self.grace_s:
                gone.append((rid, "unfinished"))
            elif st.end is not None and now - st.last_mono >= self.ended_timeout_s:
                gone.append((rid, "unfinished"))
            elif now - st.last_mono >= self.idle_timeout_s:
                gone.append((rid, "timeout"))
        for rid, reason in gone:
            self._finish(self.reqs.pop(rid), reason)
        return len(gone)

    def flush(self, reason: str = "run-ended") -> None:
        """Emit everything still open (end of run)."""
        for st in list(self.reqs.values()):
            self._finish(st, reason)
        self.reqs.clear()

    def _finish(self, st: _Req, reason: str) -> None:
        self.requests_freed += 1
        for side, pairs, producer in ((st.prod, _PROD_PAIRS, True), (st.cons, _CONS_PAIRS, False)):
            for (stage, chunk), ch in side.items():
                for begin, (begins, ends) in ch.pend.items():
                    name = pairs[begin][1]
                    for b0 in begins:  # began, never ended
                        self._emit_chunk(st, ch, name, b0, None, stage, chunk, producer,
                                         ch.proc[0], reason)
                    for e0 in ends:  # ended, its begin lost (dropped or never drained)
                        self._emit_chunk(st, ch, name, None, e0, stage, chunk, producer,
                                         ch.proc[0], reason)
        for (stage, _), sg in st.stages.items():
            if not sg.queue_done:
                self._emit_queue(st, stage, sg, reason)
            self._emit_stage(st, stage, sg, None if sg.finish is not None else reason)
        if not st.done and (st.arrive is not None or st.end is not None):
            self._emit_request(st, None if st.end is not None else reason)

    def state_size(self) -> dict:
        return {"requests": len(self.reqs),
                "sender_intervals": sum(len(s.starts) for s in self.senders.values())}
