"""The tables as a Perfetto trace (open it in ui.perfetto.dev, or query it with Perfetto's
trace processor): a process track per recorded process, a thread track per recording
thread, every span a slice with its request id, each sender's FIFO depth a counter, and
the py-spy samples of a ``--flame`` run as a time-ordered flame chart per thread.

Written with the ``perfetto`` package's own protos (``perfetto_trace_pb2``) and streaming
builder: TrackEvent packets on one sequence, absolute timestamps (unix ns), no interning.

* Slices of one kind on one thread overlap (chunks wait in a FIFO together), and a
  Perfetto track holds only nested slices: each kind gets child tracks of its thread, named
  after the kind, each span on the first of them free at its start ("lanes"; the UI shows
  same-named siblings as one track).
* py-spy samples come as *stretches* (a thread's stack from the round it changed until it
  changed again, ``profile/store.py``): each stretch's frames become nested slices, frames
  shared with the next contiguous stretch staying open; Perfetto's ``perf_sample`` packets
  would need native mappings, which Python frames have not.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from omnitrace import conventions as cv

SEQUENCE = 1
CATEGORY = "omnitrace"
# table -> (slice name, start column, end column); each row one slice on its thread_id
SLICES = {
    "snapshots": (cv.SPAN_SNAPSHOT, "start_ns", "end_ns"),
    "fifo_tasks": (cv.SPAN_FIFO, "enqueue_ns", "dequeue_ns"),
    "payloads": (cv.SPAN_PROCESS, "start_ns", "end_ns"),
    "puts": (cv.SPAN_PUT, "start_ns", "end_ns"),
    "gets": (cv.SPAN_GET, "start_ns", "end_ns"),
    "waits": (cv.SPAN_WAIT_SCHEDULE, "ready_ns", "scheduled_ns"),
    "poll_lags": (cv.SPAN_POLL, "put_end_ns", "get_begin_ns"),
}
SAMPLES_TRACK = "py-spy"
TABLES_READ = ("requests", "stage_visits", *SLICES, "senders", "processes", "threads", "stages")


@dataclass
class _Slices:
    """Slices of one name: times, track, nesting depth, and per-slice arguments."""

    name: str
    start: np.ndarray
    end: np.ndarray
    track: np.ndarray
    depth: np.ndarray
    args: list[dict[str, Any]] = field(default_factory=list)


class _Tracks:
    """Track descriptors, numbered as made; one process track per pid, one thread track
    per thread, child tracks and counters under them."""

    def __init__(self) -> None:
        self.descriptors: list[pb.TrackDescriptor] = []
        self.process: dict[int, int] = {}
        self.thread: dict[Any, int] = {}
        self.children: dict[tuple[int, str], list[int]] = {}

    def _new(self) -> pb.TrackDescriptor:
        d = pb.TrackDescriptor(uuid=len(self.descriptors) + 1)
        self.descriptors.append(d)
        return d

    def of_process(self, pid: int, name: str) -> int:
        if pid not in self.process:
            d = self._new()
            d.process.pid, d.process.process_name = pid, name
            self.process[pid] = d.uuid
        return self.process[pid]

    def of_thread(self, key: Any, pid: int, tid: int, name: str) -> int:
        if key not in self.thread:
            d = self._new()
            d.thread.pid, d.thread.tid, d.thread.thread_name = pid, tid, name
            self.thread[key] = d.uuid
        return self.thread[key]

    def child(self, parent: int, name: str, lane: int) -> int:
        lanes = self.children.setdefault((parent, name), [])
        while len(lanes) <= lane:
            d = self._new()
            d.parent_uuid, d.name = parent, name
            lanes.append(d.uuid)
        return lanes[lane]

    def counter(self, parent: int, name: str) -> int:
        d = self._new()
        d.parent_uuid, d.name = parent, name
        d.counter.SetInParent()
        return d.uuid


def lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A lane per interval, the lowest free at its start, so that no two intervals of a lane
    overlap (an instant never shares a lane with an interval that starts when it does)."""
    out = np.zeros(len(start), np.int64)
    free: list[int] = []
    busy: list[tuple[int, int, int]] = []  # (end, zero-length, lane)
    for i in np.lexsort((end, start)).tolist():
        s, e = int(start[i]), int(end[i])
        while busy and (busy[0][0] < s or (busy[0][0] == s and not busy[0][1])):
            heapq.heappush(free, heapq.heappop(busy)[2])
        lane = heapq.heappop(free) if free else len(busy) + len(free)
        out[i] = lane
        heapq.heappush(busy, (e, int(e == s), lane))
    return out


def _column(t: pa.Table, name: str) -> np.ndarray:
    return t.column(name).to_numpy(zero_copy_only=False)


def _thread_tracks(tables: dict[str, pa.Table], tracks: _Tracks) -> dict[int, int]:
    """thread_id -> its thread track (under its process track)."""
    procs = tables["processes"]
    for pid, name in zip(procs.column("pid").to_pylist(), procs.column("name").to_pylist()):
        tracks.of_process(pid, name or f"pid {pid}")
    th = tables["threads"]
    out = {}
    for tid_, pid, tid, name in zip(*(th.column(c).to_pylist() for c in ("thread_id", "pid", "tid", "thread"))):
        tracks.of_process(pid, f"pid {pid}")
        out[tid_] = tracks.of_thread((pid, tid), pid, tid, name or f"thread {tid}")
    return out


def _on_lanes(name: str, kind: str, start: np.ndarray, end: np.ndarray, thread: np.ndarray,
              threads: dict[int, int], tracks: _Tracks, args: list[dict[str, Any]]) -> _Slices:
    """Slices of ``kind`` on child tracks of their threads, lanes per thread."""
    track = np.zeros(len(start), np.int64)
    for th in np.unique(thread).tolist():
        sel = np.flatnonzero(thread == th)
        lane = lanes(start[sel], end[sel])
        parent = threads[th]
        track[sel] = [tracks.child(parent, kind, k) for k in lane.tolist()]
    return _Slices(name, start, end, track, np.zeros(len(start), np.int64), args)


def _table_slices(tables: dict[str, pa.Table], threads: dict[int, int], tracks: _Tracks) -> list[_Slices]:
    req_of = dict(zip(*(tables["requests"].column(c).to_pylist() for c in ("request_id", "request"))))
    out = []
    r = tables["requests"].filter(pc.is_valid(tables["requests"].column("arrival_ns")))
    out.append(_on_lanes(cv.SPAN_REQUEST, "requests", _column(r, "arrival_ns"), _column(r, "last_ns"),
                         _column(r, "thread_id"), threads, tracks,
                         [{"request": q} for q in r.column("request").to_pylist()]))
    v = tables["stage_visits"]
    out.append(_on_lanes(cv.SPAN_STAGE, "stage_visits", _column(v, "add_ns"), _column(v, "last_ns"),
                         _column(v, "thread_id"), threads, tracks,
                         [{"request": req_of[q]} for q in v.column("request_id").to_pylist()]))
    q = v.filter(pc.is_valid(v.column("schedule_ns")))
    out.append(_on_lanes(cv.SPAN_STAGE_QUEUE, "stage queue", _column(q, "add_ns"), _column(q, "schedule_ns"),
                         _column(q, "thread_id"), threads, tracks,
                         [{"request": req_of[x]} for x in q.column("request_id").to_pylist()]))
    for table, (name, start, end) in SLICES.items():
        t = tables[table]
        args = [{"request": req_of[x], "chunk": c} for x, c in
                zip(t.column("request_id").to_pylist(), t.column("chunk").to_pylist())]
        if "incomplete" in t.column_names:
            for a, why in zip(args, t.column("incomplete").to_pylist()):
                if why:
                    a["incomplete"] = why
        out.append(_on_lanes(name, table, _column(t, start), _column(t, end), _column(t, "thread_id"),
                             threads, tracks, args))
    return out


def _fifo_depth(tables: dict[str, pa.Table], tracks: _Tracks) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per sender, (counter track, times, FIFO depth after each): +1 at each enqueue, -1 at
    each dequeue (an incomplete task's at its request's last event)."""
    f, senders = tables["fifo_tasks"], tables["senders"]
    stage_name = dict(zip(*(tables["stages"].column(c).to_pylist() for c in ("stage", "name"))))
    sid, enq, deq = (_column(f, c) for c in ("sender_id", "enqueue_ns", "dequeue_ns"))
    out = []
    for s, pid, stage in zip(*(senders.column(c).to_pylist() for c in ("sender_id", "pid", "stage"))):
        sel = sid == s
        t = np.concatenate((enq[sel], deq[sel]))
        d = np.concatenate((np.ones(sel.sum(), np.int64), -np.ones(sel.sum(), np.int64)))
        order = np.lexsort((d, t))  # at one time, dequeues first
        t, depth = t[order], np.cumsum(d[order])
        last = np.append(t[1:] != t[:-1], True)  # one value per time: the depth after it
        parent = tracks.of_process(pid, f"pid {pid}")
        out.append((tracks.counter(parent, f"FIFO depth {stage_name.get(stage, stage)}"), t[last], depth[last]))
    return out


def _sample_slices(samples: Any, tracks: _Tracks, thread_of: dict[tuple[int, int], int]) -> _Slices:
    """py-spy's stretches as nested frame slices on a ``py-spy`` track per sampled thread."""
    st = samples.stretches
    starts, ends, track, depth, args = [], [], [], [], []
    order = np.lexsort((st["t"], st["tid"], st["pid"]))
    open_: list[tuple[int, int]] = []  # (frame, start) of the open frames, root first
    prev = (None, None)

    def close(keep: int, t: int, where: int) -> None:
        while len(open_) > keep:
            fid, t0 = open_.pop()
            starts.append(t0), ends.append(t), track.append(where), depth.append(len(open_))
            args.append({"frame": samples.frame_label(fid)})

    where, last_end = 0, 0
    for i in order.tolist():
        pid, tid, t, end = int(st["pid"][i]), int(st["tid"][i]), int(st["t"][i]), int(st["end"][i])
        if end <= t:
            continue  # no time: no slice
        if (pid, tid) != prev or t > last_end:
            close(0, last_end, where)
        if (pid, tid) != prev:
            parent = thread_of.get((pid, tid)) or tracks.of_thread(
                (pid, tid), pid, tid, samples.threads.get((pid, tid), f"thread {tid}"))
            tracks.of_process(pid, f"pid {pid}")
            where, prev = tracks.child(parent, SAMPLES_TRACK, 0), (pid, tid)
        frames = samples.stacks[int(st["stack"][i])]
        common = 0
        while common < min(len(open_), len(frames)) and open_[common][0] == frames[common]:
            common += 1
        close(common, t, where)
        open_ += [(f, t) for f in frames[common:]]
        last_end = end
    close(0, last_end, where)
    names = [a["frame"] for a in args]
    return _Slices("", np.array(starts, np.int64), np.array(ends, np.int64), np.array(track, np.int64),
                   np.array(depth, np.int64), [{"name": n} for n in names])


def write(out: IO[bytes], tables: dict[str, pa.Table], samples: Any = None) -> dict[str, int]:
    """``tables`` (``TABLES_READ`` of them) and, if given, a ``profile.store.Store`` of
    py-spy samples, as a Perfetto trace to ``out``. Returns slices written per name."""
    tracks = _Tracks()
    threads = _thread_tracks(tables, tracks)
    groups = _table_slices(tables, threads, tracks)
    thread_of = {k: v for k, v in tracks.thread.items()}
    if samples is not None and len(samples.stretches):
        groups.append(_sample_slices(samples, tracks, thread_of))
    counters = _fifo_depth(tables, tracks)
    b = StreamingTraceProtoBuilder(out)
    for i, d in enumerate(tracks.descriptors):
        p = b.create_packet()
        p.trusted_packet_sequence_id = SEQUENCE
        if i == 0:
            p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        p.track_descriptor.CopyFrom(d)
        b.write_packet(p)
    _write_events(b, groups, counters)
    written: dict[str, int] = {}
    for g in groups:
        for a in g.args:
            name = g.name or a["name"]
            written[name] = written.get(name, 0) + 1
    return written


def _write_events(b: StreamingTraceProtoBuilder, groups: list[_Slices],
                  counters: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
    """Every slice's begin and end, and the counters' values, in time order: at one time
    ends before begins, inner slices end first and outer ones begin first; an instant
    (start == end) begins after the other begins and ends after them."""
    g_idx = np.concatenate([np.full(len(g.start), i) for i, g in enumerate(groups)] + [np.zeros(0, np.int64)])
    row = np.concatenate([np.arange(len(g.start)) for g in groups] + [np.zeros(0, np.int64)])
    start = np.concatenate([g.start for g in groups] + [np.zeros(0, np.int64)])
    end = np.concatenate([g.end for g in groups] + [np.zeros(0, np.int64)])
    depth = np.concatenate([g.depth for g in groups] + [np.zeros(0, np.int64)])
    n = len(start)
    t = np.concatenate((start, end))
    phase = np.concatenate((np.ones(n, np.int64), np.where(end == start, 2, 0)))
    rank = np.concatenate((depth, -depth))
    order = np.lexsort((rank, phase, t))
    for k in order.tolist():
        i = k % n if n else 0
        g = groups[g_idx[i]]
        p = b.create_packet()
        p.trusted_packet_sequence_id = SEQUENCE
        p.timestamp = int(t[k])
        ev = p.track_event
        ev.track_uuid = int(g.track[row[i]])
        if k < n:
            ev.type = pb.TrackEvent.TYPE_SLICE_BEGIN
            a = g.args[row[i]]
            ev.name = g.name or a["name"]
            ev.categories.append(CATEGORY)
            for key, val in a.items():
                if key != "name":
                    _annotate(ev.debug_annotations.add(), key, val)
        else:
            ev.type = pb.TrackEvent.TYPE_SLICE_END
        b.write_packet(p)
    for track, times, values in counters:
        for tt, v in zip(times.tolist(), values.tolist()):
            p = b.create_packet()
            p.trusted_packet_sequence_id = SEQUENCE
            p.timestamp = tt
            p.track_event.type = pb.TrackEvent.TYPE_COUNTER
            p.track_event.track_uuid = track
            p.track_event.counter_value = v
            b.write_packet(p)


def _annotate(d: pb.DebugAnnotation, key: str, val: Any) -> None:
    d.name = key
    if isinstance(val, int):
        d.int_value = val
    else:
        d.string_value = str(val)
