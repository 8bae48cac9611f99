"""Span-linked flame graphs: the samples taken *on the thread that did the work* while the
chosen spans were open.

The join key is exact: every ring records its writer's native thread id (``RING`` blocks of
the event log) and py-spy names each sampled thread by the same id; both clocks are
CLOCK_MONOTONIC on the event log's one offset (``omnitrace.profile.finalize``).

Categories (``omnitrace.analyze.attribution`` names) -> intervals and the thread that
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
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from omnitrace import conventions as cv
from omnitrace import eventlog
from omnitrace import spantable as stt
from omnitrace.profile.store import Store

E = cv.Ev
THREADS = ("scheduler", "sender", "receiver", "api")
CATEGORIES = ("snapshot", "fifo_blocked", "fifo_own", "process", "put", "get", "poll_lag",
              "wait_schedule", "compute", "queue")
# category -> (span name code or None, default thread kind)
_SPANS = {"snapshot": (stt.N_SNAPSHOT, "scheduler"), "fifo_blocked": (stt.N_FIFO, "sender"),
          "fifo_own": (stt.N_FIFO, "sender"), "process": (stt.N_PROCESS, "sender"),
          "put": (stt.N_PUT, "sender"), "get": (stt.N_GET, "receiver"),
          "poll_lag": (stt.N_POLL, "receiver"), "wait_schedule": (stt.N_WAIT, "scheduler"),
          "queue": (stt.N_QUEUE, "scheduler"), "compute": (None, "scheduler")}
# event kinds each category needs from the log
_KINDS = {
    "snapshot": (E.SNAPSHOT_BEGIN, E.SNAPSHOT_END),
    "fifo_blocked": (E.FIFO_ENQUEUE, E.FIFO_DEQUEUE, E.PROCESS_END, E.PUT_END),
    "fifo_own": (E.FIFO_ENQUEUE, E.FIFO_DEQUEUE, E.PROCESS_END, E.PUT_END),
    "process": (E.PROCESS_BEGIN, E.PROCESS_END), "put": (E.PUT_BEGIN, E.PUT_END),
    "get": (E.GET_BEGIN, E.GET_END), "poll_lag": (E.PUT_END, E.GET_BEGIN),
    "wait_schedule": (E.CHUNK_READY, E.CHUNK_SCHEDULED),
    "queue": (E.STAGE_ADD, E.STAGE_SCHEDULE),
    "compute": (E.STEP_BEGIN, E.STEP_END, E.STAGE_ADD, E.STAGE_SCHEDULE, E.STAGE_FINISH),
}
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

    def stage_names(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for info in self.rings.values():
            if info.get("role") == "stage":
                out.setdefault(int(info.get("stage", -1)), str(info.get("process") or ""))
        return out


def load_events(run_dir: str, kinds: set[int]) -> tuple[np.ndarray, RunThreads]:
    """The run's events of ``kinds`` (all kinds: thread roles are read from them too)."""
    log = eventlog.read_event_log(run_dir)
    if log is None:
        raise SelectError(f"{run_dir}: no event log (events/): nothing to link samples to")
    ev = log.events
    # a ring's thread kind: the kind of most of its events
    kinds_arr = np.full(256, -1, np.int8)
    for k, v in _THREAD_OF.items():
        kinds_arr[k] = v
    tk = kinds_arr[np.minimum(ev["kind"], 255)]
    ring_kind: dict[int, int] = {}
    if len(ev):
        ok = tk >= 0
        pair = ev["ring"][ok].astype(np.int64) * 4 + tk[ok]
        u, c = np.unique(pair, return_counts=True)
        best: dict[int, tuple[int, int]] = {}
        for p, n in zip(u.tolist(), c.tolist()):
            r, k = divmod(p, 4)
            if n > best.get(r, (-1, 0))[1]:
                best[r] = (k, n)
        ring_kind = {r: k for r, (k, _) in best.items()}
    sel = np.isin(ev["kind"], np.fromiter(kinds, np.int64, len(kinds)))
    return ev[sel], RunThreads(log.rings, ring_kind, log.requests.strings)


def build_spans(ev: np.ndarray, threads: RunThreads) -> np.ndarray:
    b = stt.SpanBuilder(dict(threads.rings))
    b.ring_changed()
    return np.concatenate([b.feed(ev).spans, b.flush().spans])


def sender_busy(ev: np.ndarray, rings: dict[int, dict]) -> dict[tuple[int, int], np.ndarray]:
    """Busy intervals of each sender (pid, stage), the rule of ``spantable``: a task runs
    from its FIFO_DEQUEUE to its PUT_END, or a 0-byte PROCESS_END of its chunk, or the next
    dequeue, whichever comes first. Returns rows (start, end, request) sorted by start."""
    kinds = (E.FIFO_DEQUEUE, E.PROCESS_END, E.PUT_END)
    s = ev[np.isin(ev["kind"], kinds)]
    out: dict[tuple[int, int], np.ndarray] = {}
    if not len(s):
        return out
    pid = np.array([int(rings.get(int(r), {}).get("pid", 0)) for r in s["ring"].tolist()], np.int64)
    key = (pid << 16) | (s["stage"].astype(np.int64) + 1)
    for k in np.unique(key).tolist():
        seq = s[key == k]
        seq = seq[np.argsort(seq["t"], kind="stable")]
        kk = seq["kind"]
        deq = np.flatnonzero(kk == E.FIFO_DEQUEUE)
        rows = []
        closers = np.flatnonzero((kk == E.PUT_END) | ((kk == E.PROCESS_END) & (seq["a"] == 0))
                                 | (kk == E.FIFO_DEQUEUE))
        for d in deq.tolist():
            i = int(np.searchsorted(closers, d, "right"))
            end = None
            while i < len(closers):
                j = int(closers[i])
                if kk[j] == E.FIFO_DEQUEUE:
                    end = int(seq["t"][j])
                    break
                if seq["req"][j] == seq["req"][d] and (kk[j] == E.PUT_END or seq["chunk"][j] == seq["chunk"][d]):
                    end = int(seq["t"][j])
                    break
                i = int(np.searchsorted(deq, j, "right"))  # another task's closer: next dequeue
                end = int(seq["t"][deq[i]]) if i < len(deq) else None
                break
            if end is not None:
                rows.append((int(seq["t"][d]), max(end, int(seq["t"][d])), int(seq["req"][d])))
        out[(k >> 16, (k & 0xFFFF) - 1)] = np.array(rows, np.int64).reshape(-1, 3)
    return out


def _overlaps(busy: np.ndarray, enq: int, deq: int, req: int, other: bool) -> list[tuple[int, int]]:
    lo = int(np.searchsorted(busy[:, 1], enq, "right"))
    hi = int(np.searchsorted(busy[:, 0], deq, "left"))
    out = []
    for s, e, r in busy[lo:hi].tolist():
        if (r != req) == other:
            a, b = max(s, enq), min(e, deq)
            if b > a:
                out.append((a, b))
    return out


def _subtract(lo: int, hi: int, cuts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, cur = [], lo
    for a, b in sorted(cuts):
        if a > cur:
            out.append((cur, min(a, hi)))
        cur = max(cur, b)
    if cur < hi:
        out.append((cur, hi))
    return [(a, b) for a, b in out if b > a]


ALL_KINDS = frozenset(int(k) for ks in _KINDS.values() for k in ks)


def intervals(run_dir: str, category: str, stage: str | None = None, request: str | None = None,
              thread: str | None = None, loaded: tuple[np.ndarray, RunThreads] | None = None
              ) -> tuple[Intervals, RunThreads]:
    """The intervals of ``category`` (on the thread that did the work, or ``thread``).
    ``loaded``: events from ``load_events(run_dir, ALL_KINDS)``, to select several times."""
    if category not in _SPANS:
        raise SelectError(f"unknown category {category!r} (choose from {', '.join(CATEGORIES)})")
    if thread is not None and thread not in THREADS:
        raise SelectError(f"unknown thread {thread!r} (choose from {', '.join(THREADS)})")
    kinds = {int(k) for k in _KINDS[category]}
    if loaded is None:
        ev, rt = load_events(run_dir, kinds)
    else:
        ev, rt = loaded
        ev = ev[np.isin(ev["kind"], np.fromiter(kinds, np.int64, len(kinds)))]
    stage_id = resolve_stage(stage, rt) if stage is not None else None
    req_id = None
    if request is not None:
        try:
            req_id = rt.requests.index(request)
        except ValueError:
            raise SelectError(f"request {request!r} is not in this run") from None
    name, default_kind = _SPANS[category]
    want = THREADS.index(thread or default_kind)
    rows: list[tuple[int, int, int]] = []  # (start, end, ring whose pid worked)
    nspans = 0
    if category == "compute":
        rows, nspans = _compute(ev, rt, stage_id, req_id)
    else:
        sp = build_spans(ev, rt)
        sp = sp[sp["name"] == name]
        if stage_id is not None:
            sp = sp[sp["stage"] == stage_id]
        if req_id is not None:
            sp = sp[sp["req"] == req_id]
        if category in ("fifo_blocked", "fifo_own"):
            busy = sender_busy(ev, rt.rings)
            for r in sp.tolist():
                rec = dict(zip(stt.SPAN_DTYPE.names, r))
                pid = int(rt.rings.get(rec["ring"], {}).get("pid", 0))
                b = busy.get((pid, rec["stage"]))
                blocked = _overlaps(b, rec["start"], rec["end"], rec["req"], True) if b is not None else []
                if category == "fifo_blocked":
                    parts = blocked
                else:
                    parts = _subtract(rec["start"], rec["end"], blocked)
                if parts:
                    nspans += 1
                rows += [(a, c, rec["ring"]) for a, c in parts]
        else:
            nspans = len(sp)
            rows = list(zip(sp["start"].tolist(), sp["end"].tolist(), sp["ring"].tolist()))
    start = np.array([r[0] for r in rows], np.int64)
    end = np.array([r[1] for r in rows], np.int64)
    pids = np.array([int(rt.rings.get(int(r[2]), {}).get("pid", 0)) for r in rows], np.int64)
    tids = np.zeros(len(rows), np.int64)
    notes: list[str] = []
    for p in np.unique(pids).tolist():
        tid = rt.thread_of(p, want)
        if tid is None:
            notes.append(f"pid {p} has no {THREADS[want]} thread in the record: its intervals are skipped")
            tid = -1
        tids[pids == p] = tid
    keep = tids >= 0
    return Intervals(start[keep], end[keep], pids[keep], tids[keep], nspans, notes), rt


def _compute(ev: np.ndarray, rt: RunThreads, stage_id: int | None, req_id: int | None
             ) -> tuple[list[tuple[int, int, int]], int]:
    steps = ev[np.isin(ev["kind"], (E.STEP_BEGIN, E.STEP_END))]
    if stage_id is not None:
        steps = steps[steps["stage"] == stage_id]
    rows = []
    for ring in np.unique(steps["ring"]).tolist():
        s = steps[steps["ring"] == ring]
        s = s[np.argsort(s["t"], kind="stable")]
        b = s["kind"] == E.STEP_BEGIN
        nxt_end = np.zeros(len(s), bool)
        nxt_end[:-1] = s["kind"][1:] == E.STEP_END
        i = np.flatnonzero(b & nxt_end)
        rows += [(int(s["t"][k]), int(s["t"][k + 1]), ring) for k in i.tolist()]
    if req_id is not None:  # only the steps while the request was in the stage
        life = ev[(ev["req"] == req_id) & np.isin(ev["kind"], (E.STAGE_SCHEDULE, E.STAGE_FINISH))]
        keep = []
        for st in np.unique(life["stage"]).tolist():
            li = life[life["stage"] == st]
            a = li["t"][li["kind"] == E.STAGE_SCHEDULE]
            z = li["t"][li["kind"] == E.STAGE_FINISH]
            if not len(a):
                continue
            lo, hi = int(a.min()), int(z.max()) if len(z) else 1 << 62
            pid = {int(rt.rings[int(r)].get("pid", 0)) for r in li["ring"].tolist()}
            keep += [(max(s, lo), min(e, hi), r) for s, e, r in rows
                     if int(rt.rings.get(r, {}).get("pid", 0)) in pid and e > lo and s < hi]
        rows = keep
    return rows, len(rows)


def resolve_stage(text: str, rt: RunThreads) -> int:
    names = rt.stage_names()
    if text == "api":
        return cv.API_STAGE
    for sid, n in names.items():
        if text == n or text in (f"stage{sid}", str(sid)):
            return sid
    known = ", ".join(["api"] + [n or f"stage{s}" for s, n in sorted(names.items())])
    raise SelectError(f"unknown stage {text!r} (this run has: {known})")


def select(store: Store, iv: Intervals) -> np.ndarray:
    """Stretch indices of the samples inside the intervals (their union per thread), one
    entry per sample."""
    if not len(iv.start) or not len(store.stretches):
        return np.zeros(0, np.int64)
    out = []
    st = store.stretches
    key_iv = (iv.pid << 32) | iv.tid
    for k in np.unique(key_iv).tolist():
        pid, tid = k >> 32, k & 0xFFFFFFFF
        mask = (st["pid"] == pid) & (st["tid"] == tid)
        if not mask.any():
            continue
        idx, t = store.samples(mask)
        order = np.argsort(t, kind="stable")
        idx, t = idx[order], t[order]
        m = key_iv == k
        a, b = _union(iv.start[m], iv.end[m])
        lo = np.searchsorted(t, a, "left")
        hi = np.searchsorted(t, b, "left")
        cnt = hi - lo
        pos = np.repeat(lo, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        out.append(idx[pos])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def covered_ns(iv: Intervals) -> int:
    """Wall time the intervals cover (their union per thread, summed over threads)."""
    total = 0
    key = (iv.pid << 32) | iv.tid
    for k in np.unique(key).tolist():
        a, b = _union(iv.start[key == k], iv.end[key == k])
        total += int((b - a).sum())
    return total


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
    path = os.path.join(run_dir, "profiles", FILE)
    if not os.path.exists(path):
        raise SelectError(f"{run_dir}: no profiles (profiles/{FILE}); record the run with "
                          "`omnitrace run --flame`")
    return Store.load(path)
