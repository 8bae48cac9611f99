"""A Perfetto trace decoded with the ``perfetto`` package's own protos and held to the rules
Perfetto's trace processor imports TrackEvent slices by (its own binary cannot be fetched
here: the package downloads it at first use): every event on a declared track; a track's
slices properly nested (an end closes the track's innermost open slice, never before it
began); nothing left open; counter values on counter tracks only."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from omnitrace.conventions import Ev

# slice name -> the event kind that begins each one
BEGUN_BY = {"omni.chunk.snapshot": Ev.SNAPSHOT_BEGIN, "omni.chunk.fifo": Ev.FIFO_ENQUEUE,
            "omni.chunk.process": Ev.PROCESS_BEGIN, "omni.chunk.put": Ev.PUT_BEGIN, "omni.chunk.get": Ev.GET_BEGIN,
            "omni.chunk.wait_schedule": Ev.CHUNK_READY, "omni.chunk.poll_lag": Ev.GET_BEGIN,
            "omni.request": Ev.REQUEST_ARRIVE, "omni.stage": Ev.STAGE_ADD, "omni.stage.queue": Ev.STAGE_SCHEDULE}


def script_slices(script: list[tuple]) -> dict[str, int]:
    """Slices per name a hand-made script's events make (``event_fixture`` tuples): its own
    count of the events that begin each span."""
    kinds = [int(e[1]) for e in script]
    return {n: kinds.count(int(k)) for n, k in BEGUN_BY.items() if kinds.count(int(k))}


@dataclass
class Decoded:
    slices: Counter = field(default_factory=Counter)  # slice name -> count
    tracks: dict[int, pb.TrackDescriptor] = field(default_factory=dict)
    # per slice: (name, track uuid, start, end, depth, args)
    rows: list[tuple[str, int, int, int, int, dict]] = field(default_factory=list)
    counters: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def track_name(self, uuid: int) -> str:
        d = self.tracks[uuid]
        return d.name or d.thread.thread_name or d.process.process_name


def _args(ev: pb.TrackEvent) -> dict:
    return {a.name: (a.string_value if a.HasField("string_value") else a.int_value)
            for a in ev.debug_annotations}


def decode(data: bytes) -> Decoded:
    trace = pb.Trace()
    trace.ParseFromString(data)
    out = Decoded()
    open_: dict[int, list[tuple[str, int, dict]]] = {}
    last_t: dict[int, int] = {}
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            out.tracks[p.track_descriptor.uuid] = p.track_descriptor
            continue
        if not p.HasField("track_event"):
            continue
        ev, t = p.track_event, p.timestamp
        track = ev.track_uuid
        if track not in out.tracks:
            out.errors.append(f"event on undeclared track {track}")
            continue
        if t < last_t.get(track, t):
            out.errors.append(f"track {track}: time goes back at {t}")
        last_t[track] = t
        stack = open_.setdefault(track, [])
        if ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stack.append((ev.name, t, _args(ev)))
        elif ev.type == pb.TrackEvent.TYPE_SLICE_END:
            if not stack:
                out.errors.append(f"track {track}: an end with no open slice at {t}")
                continue
            name, t0, args = stack.pop()
            out.slices[name] += 1
            out.rows.append((name, track, t0, t, len(stack), args))
        elif ev.type == pb.TrackEvent.TYPE_COUNTER:
            if not out.tracks[track].HasField("counter"):
                out.errors.append(f"track {track}: a counter value on a slice track")
            out.counters.setdefault(track, []).append((t, ev.counter_value or ev.double_counter_value))
    out.errors += [f"track {k}: {len(v)} slice(s) never ended" for k, v in open_.items() if v]
    return out
