"""One request's waterfall, from arrival to first packet: every span per stage on one time
axis, the critical path, and for each FIFO wait the other requests whose tasks kept the
sender busy meanwhile (what a trace viewer cannot show: those tasks are in other traces).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from omnitrace import intervals
from omnitrace import spantable as stt
from omnitrace.analyze.stats import NS_TO_MS
from omnitrace.rules import attribution as at
from omnitrace.rules.headofline import Busy

MAX_CULPRIT_TASKS = 24  # per FIFO wait, the longest overlaps


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class Visits(NamedTuple):
    """A request's stage and queue spans: (stage, start, end) each, by stage."""

    stages: list[tuple[int, int, int]]
    queues: list[tuple[int, int, int]]


def build(a: at.Attribution, visits: Visits, rows: np.ndarray, busy: Busy,
          requests: list[str], label: Callable[[int], str], req_index: int) -> dict[str, Any]:
    """``rows``: the request's chunk span rows; ``req_index`` its index in ``requests``."""
    t0, end = a.arrival, a.ttfp

    def ms(t: int) -> float:
        return (t - t0) * NS_TO_MS

    spans: list[list] = []
    for st, start, stop in visits.stages:
        if start <= end:
            spans.append([label(st), "stage", -1, ms(start), ms(min(stop, end)), False, False])
    # a stage's queue is on the critical path only where the path waited in it: the
    # talker's and code2wav's queues usually span the whole request and gate nothing
    queued = {g.stage for g in a.segments if g.category == at.QUEUE}
    for st, start, stop in visits.queues:
        if start <= end:
            spans.append([label(st), "queue", -1, ms(start), ms(min(stop, end)), st in queued, False])
    path = {(p, c, k) for p, c, k in a.hops}
    rows = rows[rows["start"] <= end]
    waits = []
    for name, stage, peer, chunk, replica, start, stop, reason, req in zip(
            rows["name"].tolist(), rows["stage"].tolist(), rows["peer"].tolist(),
            rows["chunk"].tolist(), rows["replica"].tolist(), rows["start"].tolist(),
            rows["end"].tolist(), rows["reason"].tolist(), rows["req"].tolist()):
        producer = name in (stt.N_SNAPSHOT, stt.N_FIFO, stt.N_PROCESS, stt.N_PUT)
        key = (stage, peer, chunk) if producer else (peer, stage, chunk)
        spans.append([label(stage), _short(stt.NAMES[name]), chunk, ms(start), ms(min(stop, end)),
                      key in path, bool(reason)])
        if name == stt.N_FIFO and not reason and stop > start:
            snd = busy.get((stage, replica))
            if snd is None:
                continue
            s0, e0, who = snd
            _, iv, t0s, t1s = intervals.other_pieces(s0, e0, who, np.array([start]), np.array([stop]),
                                                     np.array([req_index]))
            w = who[iv]
            top = np.argsort(t0s - t1s, kind="stable")[:MAX_CULPRIT_TASKS]  # longest overlaps
            top = top[np.lexsort((w[top], t1s[top], t0s[top]))]  # shown in time order
            waits.append({"stage": label(stage), "chunk": chunk, "start_ms": ms(start),
                          "end_ms": ms(stop), "on_path": key in path,
                          "busy": [[ms(x), ms(y), requests[z]] for x, y, z in
                                   zip(t0s[top].tolist(), t1s[top].tolist(), w[top].tolist())],
                          "busy_tasks": len(t0s)})
    return {"id": a.rid, "ttfp_ms": a.ttfp_ns * NS_TO_MS, "arrival_unix_ns": a.arrival,
            "spans": spans,
            "path": [[ms(g.start), g.dur * NS_TO_MS, label(g.stage), g.category] for g in a.segments],
            "waits": waits}
