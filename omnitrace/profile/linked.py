"""Span-linked flame graphs: the samples taken *on the thread that did the work* while the
chosen spans were open.

The join key is exact: every ring records its writer's native thread id (``RING`` blocks of
the event log) and py-spy names each sampled thread by the same id; both clocks are
CLOCK_MONOTONIC on the event log's one offset (``omnitrace.profile.finalize``).

Categories (``omnitrace.rules.attribution`` names) -> intervals and the thread that
worked in them (``--thread`` picks another thread of the same process instead):

* ``snapshot``, ``queue``: the producer's snapshot / stage-queue spans; scheduler thread.
* ``compute``: the stage's steps (STEP_BEGIN -> STEP_END); scheduler thread. With a
  request: the steps while that request was in the stage.
* ``fifo_blocked``: for each FIFO span (the victim's chunk waiting from enqueue to
  dequeue), the parts of that wait during which the stage's sender was busy with a task
  of *another* request (the busy intervals ``omni.fifo.blocked_ns`` sums); sender thread.
* ``fifo_own``: the rest of each FIFO wait; sender thread.
* ``process``, ``put``: the sender's own spans; ``get``, ``poll_lag``: the consumer's
  receiver thread; ``wait_schedule`` (ready -> scheduled): the consumer's scheduler.

Reading a run's event log is the slow part, so the finalizer builds what selections need
once, :class:`SpanIndex` (``profiles/spans.npz``: the spans of these categories, the
senders' busy intervals, the steps, which thread each ring is), by one load of the log
(``spanload``, the report's loader: :class:`IndexSink`), and `omnitrace flame` selects
from it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from omnitrace import conventions as cv
from omnitrace import eventlog, keys, rowops, spanload
from omnitrace.intervals import other_pieces
from omnitrace.runfiles import names
from omnitrace import spantable as stt
from omnitrace import categories
from omnitrace.profile.store import Store, save_npz

E = cv.Ev
THREADS = ("scheduler", "sender", "receiver", "api")
# category -> (span name code or None, default thread kind)
_SPANS = {"snapshot": (stt.N_SNAPSHOT, "scheduler"), "fifo_blocked": (stt.N_FIFO, "sender"),
          "fifo_own": (stt.N_FIFO, "sender"), "process": (stt.N_PROCESS, "sender"),
          "put": (stt.N_PUT, "sender"), "get": (stt.N_GET, "receiver"),
          "poll_lag": (stt.N_POLL, "receiver"), "wait_schedule": (stt.N_WAIT, "scheduler"),
          "queue": (stt.N_QUEUE, "scheduler"), "compute": (None, "scheduler")}
# the attribution categories a flame selection can pick (in the vocabulary's order)
CATEGORIES = tuple(c for c in categories.CATEGORIES if c in _SPANS)
assert len(CATEGORIES) == len(_SPANS), "a flame category missing from omnitrace.categories"
INDEX_FILE = "spans.npz"
INDEX_SPAN_DTYPE = np.dtype([("name", "i1"), ("stage", "<i2"), ("req", "<u4"), ("ring", "<i4"),
                             ("start", "<i8"), ("end", "<i8")])
BUSY_DTYPE = np.dtype([("pid", "<i8"), ("stage", "<i2"), ("start", "<i8"), ("end", "<i8"), ("req", "<u4")])
STEP_DTYPE = np.dtype([("ring", "<i4"), ("start", "<i8"), ("end", "<i8")])
# which thread records which kinds (the ring's majority decides its kind)
_THREAD_OF = {}
for _k in (E.REQUEST_ARRIVE, E.REQUEST_DISPATCH, E.REQUEST_FIRST_TEXT, E.REQUEST_FIRST_AUDIO,
           E.REQUEST_END):
    _THREAD_OF[int(_k)] = 3
for _k in (E.STAGE_ADD, E.STAGE_SCHEDULE, E.STAGE_FINISH, E.STAGE_EMIT, E.STEP_BEGIN, E.STEP_END,
           E.SNAPSHOT_BEGIN, E.SNAPSHOT_END, E.FIFO_ENQUEUE, E.CHUNK_SCHEDULED):
    _THREAD_OF[int(_k)] = 0
for _k in (E.FIFO_DEQUEUE, E.PROCESS_BEGIN, E.PROCESS_END, E.PUT_BEGIN, E.PUT_END):
    _THREAD_OF[int(_k)] = 1
for _k in (E.GET_BEGIN, E.GET_END, E.CHUNK_READY):
    _THREAD_OF[int(_k)] = 2


class SelectError(ValueError):
    """A selection that cannot be made (unknown stage, no such thread...): one line."""


@dataclass
class Intervals:
    """Where to look: [start, end) on thread (pid, tid), unix ns."""

    start: np.ndarray
    end: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    spans: int = 0  # spans (or steps) the intervals came from
    notes: list[str] = field(default_factory=list)


@dataclass
class RunThreads:
    """Rings of the run: which (pid, native tid) is which thread of which stage."""

    rings: dict[int, dict]
    kind: dict[int, int]  # ring -> index into THREADS
    requests: list[str]

    def thread_of(self, pid: int, kind: int) -> int | None:
        for idx, info in self.rings.items():
            if int(info.get("pid", 0)) == pid and self.kind.get(idx) == kind:
                return int(info.get("tid", 0))
        if THREADS[kind] in ("scheduler", "api") and any(
                int(i.get("pid", 0)) == pid for i in self.rings.values()):
            # no ring of its own: vLLM-Omni's hooks stamp the scheduler's snapshot and
            # enqueue on its thread but record them from the save thread. The scheduler
            # (EngineCore's busy loop) and the API's event loop are the main thread,
            # whose native id is the pid.
            return pid
        return None

    def pids(self, rings: np.ndarray) -> np.ndarray:
        """The pid of each ring number."""
        return ring_column(self.rings, "pid", rings)


def ring_column(rings: dict[int, dict], field: str, idx: np.ndarray, default: int = 0) -> np.ndarray:
    """``field`` (pid, stage, ...) of each ring number in ``idx``; ``default`` for an
    unknown ring."""
    table = np.full(max(rings, default=0) + 2, default, np.int64)
    for i, info in rings.items():
        table[i] = int(info.get(field, default))
    return table[np.clip(np.asarray(idx, np.int64), 0, len(table) - 1)]


def _ring_kinds(counts: np.ndarray) -> dict[int, int]:
    """A ring's thread kind: the kind of most of its events (``counts[ring, event kind]``,
    ``spanload.Loaded.ring_kinds``); a tie goes to the kind listed first in THREADS."""
    of_kind = np.full(256, -1, np.int64)
    for k, v in _THREAD_OF.items():
        of_kind[k] = v
    per_thread = np.zeros((len(counts), len(THREADS)), np.int64)
    for t in range(len(THREADS)):
        per_thread[:, t] = counts[:, of_kind == t].sum(axis=1)
    rings = np.flatnonzero(per_thread.sum(axis=1))
    return dict(zip(rings.tolist(), per_thread[rings].argmax(axis=1).tolist()))


@dataclass
class SpanIndex:
    """What selections need from a run's event log, built once (``build_index``)."""

    spans: np.ndarray  # INDEX_SPAN_DTYPE: the categories' spans, stage and stage-queue spans
    busy: np.ndarray  # BUSY_DTYPE: every sender's busy intervals, sorted (pid, stage, start)
    steps: np.ndarray  # STEP_DTYPE: every scheduler step
    threads: RunThreads

    def busy_by_sender(self) -> dict[tuple[int, int], np.ndarray]:
        out = {}
        for k, rows in keys.groups(keys.sender_key(self.busy["pid"], self.busy["stage"])):
            b = self.busy[rows]
            out[keys.sender_of(k)] = np.stack((b["start"], b["end"], b["req"].astype(np.int64)), 1)
        return out

    def save(self, path: str) -> None:
        save_npz(path, {"rings": {str(k): v for k, v in self.threads.rings.items()},
                        "kind": {str(k): v for k, v in self.threads.kind.items()},
                        "requests": self.threads.requests},
                 spans=_pack(self.spans), busy=_pack(self.busy), steps=_pack(self.steps))

    @classmethod
    def load(cls, path: str) -> "SpanIndex":
        import orjson
        with np.load(path, allow_pickle=False) as z:
            meta = orjson.loads(z["meta"].tobytes())
            rt = RunThreads({int(k): v for k, v in meta["rings"].items()},
                            {int(k): int(v) for k, v in meta["kind"].items()}, list(meta["requests"]))
            return cls(_unpack(z["spans"], INDEX_SPAN_DTYPE), _unpack(z["busy"], BUSY_DTYPE),
                       _unpack(z["steps"], STEP_DTYPE), rt)


def _pack(a: np.ndarray) -> np.ndarray:
    """Sorted by start, starts as deltas and ends as durations: small numbers that zlib
    packs ~3x tighter than raw unix ns."""
    a = a[np.argsort(a["start"], kind="stable")]
    out = a.copy()
    out["end"] = a["end"] - a["start"]
    out["start"] = np.diff(a["start"], prepend=0)
    return out


def _unpack(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    out = a.astype(dtype, copy=True)
    out["start"] = np.cumsum(a["start"])
    out["end"] = out["start"] + a["end"]
    return out


class IndexSink:
    """The flame index's sink of the one load (``spanload.Sink``): of each feed, the spans
    of the categories' names and the sender tasks it closed (the builder's sender rule, as
    the report's); with what the load saw besides (the steps, each ring's thread kind),
    the :class:`SpanIndex` (:meth:`index`)."""

    culprits = False
    steps = True

    def __init__(self) -> None:
        # grown in place (no concatenation at the end: the spans are ~0.5 per event)
        self._spans = rowops.Growing(INDEX_SPAN_DTYPE)
        self._busy = rowops.Growing(BUSY_DTYPE)

    def feed(self, feed: stt.Feed, part: spanload.Part) -> None:
        for table in (feed.spans.chunks, feed.spans.visits):  # every chunk, stage and queue span
            spans = np.empty(len(table), INDEX_SPAN_DTYPE)
            for col in INDEX_SPAN_DTYPE.names:
                spans[col] = table[col]
            self._spans.append(spans)
        for pid, stage, starts, ends, reqs in feed.busy:
            b = np.zeros(len(starts), BUSY_DTYPE)
            b["pid"], b["stage"], b["start"], b["end"], b["req"] = pid, stage, starts, ends, reqs
            self._busy.append(b)

    def index(self, loaded: spanload.Loaded) -> SpanIndex:
        log = loaded.log
        busy = self._busy.view()
        busy = busy[np.lexsort((busy["start"], busy["stage"], busy["pid"]))]
        spans = self._spans.view()
        rt = RunThreads(log.rings, _ring_kinds(loaded.ring_kinds), log.requests.strings)
        return SpanIndex(spans, busy, _steps(loaded.steps), rt)


def _steps(ev: np.ndarray) -> np.ndarray:
    """Scheduler steps: each STEP_BEGIN followed, on its ring, by a STEP_END."""
    ev = ev[np.lexsort((ev["t"], ev["ring"]))]
    pair = np.zeros(len(ev), bool)
    pair[:-1] = ((ev["kind"][:-1] == E.STEP_BEGIN) & (ev["kind"][1:] == E.STEP_END)
                 & (ev["ring"][1:] == ev["ring"][:-1]))
    i = np.flatnonzero(pair)
    st = np.zeros(len(i), STEP_DTYPE)
    st["ring"], st["start"], st["end"] = ev["ring"][i], ev["t"][i], ev["t"][i + 1]
    return st


def build_index(run_dir: str) -> SpanIndex:
    """The run's index, from one load of its event log (spans by the span builder, as the
    report's)."""
    sink = IndexSink()
    try:
        loaded = spanload.load(run_dir, [sink])
    except eventlog.EventLogError as exc:  # corrupt, or a run from before the event log
        raise SelectError(str(exc)) from None
    if loaded is None:
        raise SelectError(f"{run_dir}: no event log (events/): nothing to link samples to")
    return sink.index(loaded)


def open_index(run_dir: str) -> SpanIndex:
    """The run's index (``profiles/spans.npz``), or built from its event log."""
    path = names.path(run_dir, os.path.join(names.PROFILES, INDEX_FILE))
    if os.path.exists(path):
        return SpanIndex.load(path)
    return build_index(run_dir)


def blocked_parts(fifo: np.ndarray, busy: dict[tuple[int, int], np.ndarray], pids: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For FIFO span rows (``spantable.CHUNK_DTYPE``) whose producer pids are ``pids``: the parts of each
    wait [enqueue, dequeue] during which that stage's sender was busy with a task of another
    request. Returns (span index, start, end), sorted by span then start; per span they sum
    to its ``omni.fifo.blocked_ns``."""
    si_all, a_all, b_all = [], [], []
    for k, sel in keys.groups(keys.sender_key(pids, fifo["stage"])):
        b = busy.get(keys.sender_of(k))
        if b is None or not len(b):
            continue
        q, _, start, end = other_pieces(b[:, 0], b[:, 1], b[:, 2], fifo["start"][sel],
                                        fifo["end"][sel], fifo["req"][sel])
        si_all.append(sel[q])
        a_all.append(start)
        b_all.append(end)
    if not si_all:
        z = np.zeros(0, np.int64)
        return z, z, z
    si, a, e = np.concatenate(si_all), np.concatenate(a_all), np.concatenate(b_all)
    order = np.lexsort((a, si))
    return si[order], a[order], e[order]


def own_parts(fifo: np.ndarray, si: np.ndarray, a: np.ndarray, b: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rest of each wait: [enqueue, dequeue] minus its blocked parts (sorted, disjoint)."""
    n = len(fifo)
    # per span: boundaries enq, (a1, b1), ..., (am, bm), deq -> gaps [enq,a1], [b1,a2], ..., [bm,deq]
    gs = np.concatenate((fifo["start"], b))
    owner = np.concatenate((np.arange(n), si))
    order = np.lexsort((gs, owner))
    owner, gs = owner[order], gs[order]
    # each gap ends at the next blocked part's start of the same span, or at the dequeue
    nxt_same = np.zeros(len(owner), bool)
    nxt_same[:-1] = owner[1:] == owner[:-1]
    next_a = np.empty(len(owner), np.int64)
    a_sorted = np.concatenate((np.full(n, -1, np.int64), a))[order]
    next_a[:-1] = a_sorted[1:]
    end = np.where(nxt_same, next_a, fifo["end"][owner])
    keep = end > gs
    return owner[keep], gs[keep], end[keep]


def intervals(run_dir: str, category: str, stage: str | None = None, request: str | None = None,
              thread: str | None = None, index: SpanIndex | None = None) -> tuple[Intervals, RunThreads]:
    """The intervals of ``category`` on the thread that did the work (or ``thread``)."""
    if category not in _SPANS:
        raise SelectError(f"unknown category {category!r} (choose from {', '.join(CATEGORIES)})")
    if thread is not None and thread not in THREADS:
        raise SelectError(f"unknown thread {thread!r} (choose from {', '.join(THREADS)})")
    idx = index if index is not None else open_index(run_dir)
    rt = idx.threads
    stage_id = resolve_stage(stage, rt) if stage is not None else None
    req_id = None
    if request is not None:
        try:
            req_id = rt.requests.index(request)
        except ValueError:
            raise SelectError(f"request {request!r} is not in this run") from None
    name, default_kind = _SPANS[category]
    want = THREADS.index(thread or default_kind)
    if category == "compute":
        start, end, ring = _compute(idx, stage_id, req_id)
        nspans = len(start)
    else:
        sp = idx.spans[idx.spans["name"] == name]
        if stage_id is not None:
            sp = sp[sp["stage"] == stage_id]
        if req_id is not None:
            sp = sp[sp["req"] == req_id]
        if category in ("fifo_blocked", "fifo_own"):
            si, start, end = blocked_parts(sp, idx.busy_by_sender(), rt.pids(sp["ring"]))
            if category == "fifo_own":
                si, start, end = own_parts(sp, si, start, end)
            nspans = len(np.unique(si))
            ring = sp["ring"][si]
        else:
            nspans = len(sp)
            start, end, ring = sp["start"], sp["end"], sp["ring"]
    pids = rt.pids(ring)
    tids = np.zeros(len(pids), np.int64)
    notes: list[str] = []
    for p in np.unique(pids).tolist():
        tid = rt.thread_of(p, want)
        if tid is None:
            notes.append(f"pid {p} has no {THREADS[want]} thread in the record: its intervals are skipped")
            tid = -1
        tids[pids == p] = tid
    keep = tids >= 0
    return Intervals(start[keep].astype(np.int64), end[keep].astype(np.int64), pids[keep], tids[keep],
                     nspans, notes), rt


def _compute(idx: SpanIndex, stage_id: int | None, req_id: int | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps of the stage; with a request, those while it was in the stage (admitted ->
    finished: its stage-queue span's end -> its stage span's end), cut to that."""
    rt = idx.threads
    st = idx.steps
    if stage_id is not None:
        st = st[ring_column(rt.rings, "stage", st["ring"], default=-9) == stage_id]
    start, end, ring = st["start"].copy(), st["end"].copy(), st["ring"].copy()
    if req_id is None:
        return start, end, ring
    mine = idx.spans[idx.spans["req"] == req_id]
    keep = np.zeros(len(start), bool)
    pids = rt.pids(ring)
    for q in mine[mine["name"] == stt.N_QUEUE]:
        stage_span = mine[(mine["name"] == stt.N_STAGE) & (mine["stage"] == q["stage"])]
        lo = int(q["end"])
        hi = int(stage_span["end"].max()) if len(stage_span) else 1 << 62
        m = (pids == rt.pids(np.array([q["ring"]]))[0]) & (end > lo) & (start < hi)
        keep |= m
        start[m], end[m] = np.maximum(start[m], lo), np.minimum(end[m], hi)
    return start[keep], end[keep], ring[keep]


def resolve_stage(text: str, rt: RunThreads) -> int:
    names = {s: n for s, n in cv.stage_names(rt.rings).items() if s != cv.API_STAGE}
    if text == "api":
        return cv.API_STAGE
    for sid, n in names.items():
        if text == n or text in (f"stage{sid}", str(sid)):
            return sid
    known = ", ".join(["api"] + [n for _, n in sorted(names.items())])
    raise SelectError(f"unknown stage {text!r} (this run has: {known})")


def select(store: Store, iv: Intervals) -> np.ndarray:
    """Stretch indices of the samples inside the intervals (their union per thread), one
    entry per sample."""
    return select_time(store, iv)[0]


# a longer gap is py-spy paused, not a held stack (held stacks of ~10 periods are common:
# a round is written only when some thread of the process changed)
HOLD_MAX_PERIODS = 50


def select_time(store: Store, iv: Intervals) -> tuple[np.ndarray, np.ndarray]:
    """The samples of the working thread inside the intervals (their union per thread), in
    time order, and the seconds each stands for: the real gap until its process's next
    written round, at most ``HOLD_MAX_PERIODS`` periods. py-spy samples at random
    intervals (a period on average) but writes a round only when some thread changed (and
    falls behind under load), so a written round stands for itself and the unwritten ones after it, but not
    for time py-spy provably did not sample (``Store.unsampled``: it fell behind); the
    samples inside the intervals, each weighted by its gap, estimate the sampled part of
    the covered time from the samples alone (samples x the nominal period read 33-43%
    low). Set beside :func:`covered_ns` and :func:`unsampled_ns` they say how much of the
    spans' time py-spy saw."""
    empty = np.zeros(0, np.int64), np.zeros(0)
    if not len(iv.start) or not len(store.stretches):
        return empty
    st = store.stretches
    out_i, out_w, out_t = [], [], []
    for pid, tid, a, b in thread_unions(iv):
        mask = (st["pid"] == pid) & (st["tid"] == tid)
        if not mask.any():
            continue
        idx, t = store.samples(mask)
        j = np.searchsorted(a, t, "right") - 1
        inside = (j >= 0) & (t < b[np.maximum(j, 0)])
        idx, t = idx[inside], t[inside]
        if not len(idx):
            continue
        lo, hi = np.searchsorted(store.rounds["pid"], (pid, pid + 1))
        rounds = store.rounds["t"][lo:hi]
        nxt = np.searchsorted(rounds, t, "right")
        until = np.where(nxt < len(rounds), rounds[np.minimum(nxt, len(rounds) - 1)], t + store.period_ns)
        gaps = store.gaps(pid)[0]  # py-spy fell behind from there: the sample does not stand for it
        if len(gaps):
            k = np.searchsorted(gaps, t, "right")
            until = np.minimum(until, np.where(k < len(gaps), gaps[np.minimum(k, len(gaps) - 1)], until))
        out_i.append(idx)
        out_t.append(t)
        out_w.append(np.minimum(until - t, HOLD_MAX_PERIODS * store.period_ns) / 1e9)
    if not out_i:
        return empty
    order = np.argsort(np.concatenate(out_t), kind="stable")
    return np.concatenate(out_i)[order], np.concatenate(out_w)[order]


def sampling_error_pct(secs: np.ndarray) -> float | None:
    """The relative error (one sigma, %) of a selection's seconds, from the seconds each
    sample stands for (``select_time``): a sample in a span shorter than its gap stands
    for the whole gap, and the gaps are random (py-spy waits exponentially distributed
    times, and writes a round only when some thread changed), so the sum's variance is
    about the sum of the squared gaps. Equal gaps give 1/sqrt(n), py-spy's about
    sqrt(2/n); ``benchmarks/flame_results.md`` sets it beside the spread of the same
    intervals placed at random. None without samples."""
    total = float(secs.sum()) if len(secs) else 0.0
    return 100 * float(np.sqrt(np.square(secs).sum())) / total if total > 0 else None


def split_error_pp(secs: np.ndarray) -> float | None:
    """The sampling error (one sigma, percentage points) of a share of a selection's split
    across code, at its widest (a share of one half): ``sqrt(p(1-p)/n_eff)`` with the
    samples' effective number ``n_eff = (sum w)^2 / sum w^2`` (``secs``: what each stands
    for), i.e. half of :func:`sampling_error_pct`. None without samples."""
    err = sampling_error_pct(secs)
    return None if err is None else err / 2


def exact_split(secs: np.ndarray, covered_s: float) -> np.ndarray:
    """The samples' seconds scaled to sum to the spans' own time ``covered_s``: that total
    is known exactly from the spans; the samples give only its split across code."""
    total = float(secs.sum()) if len(secs) else 0.0
    return secs * (covered_s / total) if total > 0 else secs


def selection_title(secs: np.ndarray, covered_s: float, spans: int, rate_hz: float,
                    unsampled_s: float = 0.0) -> str:
    """A span-linked selection's subtitle: the spans' own time (exact), the samples that
    split it with the split's sampling error, and what the samples alone read (``secs``:
    what each stands for), so 146% of 4 samples reads as what it is."""
    sampled_s, n = float(secs.sum()) if len(secs) else 0.0, len(secs)
    head = f"{covered_s:.3f} s: the {spans} spans' own time on the working thread"
    if not n or covered_s <= 0:
        return head + f"; no sample at {rate_hz:.0f} Hz to split it"
    tail = f", {unsampled_s:.3f} s of it unsampled" if unsampled_s > 0 else ""
    return (head + f"; split across code by {n} samples at {rate_hz:.0f} Hz (±{split_error_pp(secs):.1f} "
            f"points sampling error on a share; the samples alone read {sampled_s:.3f} s, "
            f"{sampled_s / covered_s:.0%}{tail})")


def unsampled_note(unsampled_s: float, covered_s: float) -> list[str]:
    """A note where py-spy missed a noticeable part of the selection's time."""
    if covered_s <= 0 or unsampled_s < 0.05 * covered_s:
        return []
    return [f"py-spy took no sample during {unsampled_s:.3f} s ({unsampled_s / covered_s:.0%}) of these "
            "spans' time (it fell behind while the process ran: its clock thread kept switching); "
            "the split across code is read from the rest"]


def uncalibrated(clock: list[dict], store: Store, idx: np.ndarray) -> list[str]:
    """A note per py-spy chunk whose clock was not calibrated and which holds some of the
    selected samples (``clock``: index.json's notes per chunk). Those samples sit at an
    assumed offset (the other processes' typical py-spy start-up delay), off by a few ms,
    so they can miss or wrongly fall in spans shorter than that."""
    out = []
    st = store.stretches
    for c in clock:
        if c.get("calibrated") or "from_unix_ns" not in c:
            continue
        n = int(((st["pid"][idx] == int(c["pid"])) & (st["t"][idx] >= int(c["from_unix_ns"]))
                 & (st["t"][idx] < int(c["to_unix_ns"]))).sum())
        if n:
            out.append(f"{n} of {len(idx)} samples come from pid {c['pid']}'s py-spy chunk {c['chunk']}, "
                       f"whose clock was not calibrated ({c.get('error', 'no clock samples')}): placed at "
                       f"an assumed offset ({c.get('assumed_offset_ms', 0)} ms), they can miss spans "
                       "shorter than a few ms")
    return out


def unsampled_ns(store: Store, iv: Intervals) -> int:
    """How much of the time the intervals cover py-spy provably did not sample (it fell
    behind: ``finalize.unsampled``). A selection's samples split the rest."""
    total = 0
    for pid, _, a, b in thread_unions(iv):
        gs, ge = store.gaps(pid)
        if len(gs):
            total += int((_inside_before(b, gs, ge) - _inside_before(a, gs, ge)).sum())
    return total


def _inside_before(x: np.ndarray, gs: np.ndarray, ge: np.ndarray) -> np.ndarray:
    """Time of the sorted, disjoint intervals [gs, ge) that lies before each x."""
    cum = np.concatenate(([0], np.cumsum(ge - gs)))
    i = np.searchsorted(gs, x, "right")
    return cum[i] - np.where(i > 0, np.maximum(ge[np.maximum(i - 1, 0)] - x, 0), 0)


def covered_ns(iv: Intervals) -> int:
    """Wall time the intervals cover (their union per thread, summed over threads)."""
    return sum(int((b - a).sum()) for _, _, a, b in thread_unions(iv))


def thread_unions(iv: Intervals) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """(pid, tid, starts, ends): the union of the intervals of each thread."""
    key = (iv.pid << 32) | iv.tid
    for k in np.unique(key).tolist():
        yield k >> 32, k & 0xFFFFFFFF, *_union(iv.start[key == k], iv.end[key == k])


def _union(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    reach = np.maximum.accumulate(b)
    new = np.ones(len(a), bool)
    new[1:] = a[1:] > reach[:-1]
    starts = a[new]
    grp = np.cumsum(new) - 1
    ends = np.zeros(len(starts), np.int64)
    np.maximum.at(ends, grp, b)
    return starts, ends


def profiles_store(run_dir: str) -> Store:
    from omnitrace.profile.store import FILE
    path = names.path(run_dir, os.path.join(names.PROFILES, FILE))
    if not os.path.exists(path):
        raise SelectError(f"{run_dir}: no profiles (profiles/{FILE}); record the run with "
                          "`omnitrace run --flame`")
    return Store.load(path)
