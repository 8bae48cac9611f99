"""Hand-written run directories in the old ``spans.jsonl`` format (OTLP JSON lines: runs
recorded before the event log), read through its importer (analyze/otlp_import.py).

Used for the arithmetic of attribution; tests/support/event_fixture.py writes the same
worked example as events through the real rings and recorder (the production path), and
tests/test_attribution_unit.py checks both read the same.
"""
from __future__ import annotations

import json
import os
from typing import Any

from omnitrace import conventions as cv

T0 = 1_800_000_000_000_000_000  # unix ns origin of synthetic runs
US = 1_000


def _av(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_av(x) for x in v]}}
    return {"stringValue": str(v)}


def span(name: str, rid: str, start_us: float, end_us: float, stage: int | None = None,
         peer: int | None = None, chunk: int | None = None, events: list | None = None,
         **extra: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {cv.ATTR_REQUEST_ID: rid}
    if stage is not None:
        attrs[cv.ATTR_STAGE_ID] = stage
    if peer is not None:
        attrs[cv.ATTR_PEER_STAGE_ID] = peer
    if chunk is not None:
        attrs[cv.ATTR_CHUNK_INDEX] = chunk
    attrs.update(extra)
    d = {"traceId": f"{cv.trace_id_for(rid):032x}", "spanId": f"{cv.span_id_for(name, rid, stage, peer, chunk):016x}",
         "name": name, "kind": 1, "startTimeUnixNano": str(T0 + int(start_us * US)),
         "endTimeUnixNano": str(T0 + int(end_us * US)),
         "attributes": [{"key": k, "value": _av(v)} for k, v in attrs.items()]}
    if events:
        d["events"] = [{"name": n, "timeUnixNano": str(T0 + int(t * US)),
                        "attributes": [{"key": k, "value": _av(v)} for k, v in (a or {}).items()]}
                       for n, t, a in events]
    return d


def line(spans: list[dict[str, Any]]) -> str:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                          "scopeSpans": [{"scope": {"name": "omnitrace"}, "spans": spans}]}]})


def chunk_spans(rid: str, prod: int, cons: int, c: int, snap: tuple, fifo: tuple, proc: tuple,
                put: tuple, poll: tuple, get: tuple, ws: tuple, blocked_us: float = 0.0,
                blocked_by: list[str] | None = None, nbytes: int = 1000) -> list[dict[str, Any]]:
    fx: dict[str, Any] = {cv.ATTR_FIFO_BLOCKED_NS: int(blocked_us * US), cv.ATTR_FIFO_DEPTH: 2}
    if blocked_by:
        fx[cv.ATTR_FIFO_BLOCKED_BY] = blocked_by
    return [
        span(cv.SPAN_SNAPSHOT, rid, *snap, stage=prod, peer=cons, chunk=c),
        span(cv.SPAN_FIFO, rid, *fifo, stage=prod, peer=cons, chunk=c, **fx),
        span(cv.SPAN_PROCESS, rid, *proc, stage=prod, peer=cons, chunk=c, **{cv.ATTR_TRANSFER_BYTES: nbytes}),
        span(cv.SPAN_PUT, rid, *put, stage=prod, peer=cons, chunk=c,
             **{cv.ATTR_TRANSFER_BYTES: nbytes}),
        span(cv.SPAN_POLL, rid, *poll, stage=cons, peer=prod, chunk=c),
        span(cv.SPAN_GET, rid, *get, stage=cons, peer=prod, chunk=c, **{cv.ATTR_TRANSFER_BYTES: nbytes}),
        span(cv.SPAN_WAIT_SCHEDULE, rid, *ws, stage=cons, peer=prod, chunk=c),
    ]


def three_stage_request(rid: str, off: float = 0.0, blocked_by: list[str] | None = None) -> list[dict[str, Any]]:
    """The worked example of tests/test_attribution_unit.py (times in us from `off`)."""
    o = off
    def t(a: float, b: float) -> tuple[float, float]:
        return (o + a, o + b)
    out = [
        span(cv.SPAN_REQUEST, rid, *t(0, 1000), stage=-1,
             events=[(cv.EVENT_TTFT, o + 150, {}), (cv.EVENT_TTFP, o + 900, {})]),
        span(cv.SPAN_STAGE, rid, *t(10, 990), stage=0, **{cv.ATTR_STAGE_NAME: "thinker"},
             events=[(cv.EVENT_EMIT, o + 120, {"omni.emit.modality": "text", "omni.emit.index": 0})]),
        span(cv.SPAN_STAGE_QUEUE, rid, *t(10, 20), stage=0),
        span(cv.SPAN_STAGE, rid, *t(180, 990), stage=1, **{cv.ATTR_STAGE_NAME: "talker"}),
        span(cv.SPAN_STAGE_QUEUE, rid, *t(180, 190), stage=1),
        span(cv.SPAN_STAGE, rid, *t(330, 990), stage=2, **{cv.ATTR_STAGE_NAME: "code2wav"},
             events=[(cv.EVENT_EMIT, o + 800, {"omni.emit.modality": "audio", "omni.emit.index": 0})]),
        span(cv.SPAN_STAGE_QUEUE, rid, *t(345, 346), stage=2),
    ]
    out += chunk_spans(rid, 0, 1, 0, t(100, 110), t(110, 150), t(150, 160), t(160, 170), t(170, 175),
                       t(175, 180), t(180, 200), blocked_us=30, blocked_by=blocked_by or ["other"])
    # a later thinker chunk, scheduled after the talker's snapshot: must NOT gate codec chunk 0
    out += chunk_spans(rid, 0, 1, 1, t(400, 401), t(401, 402), t(402, 403), t(403, 404), t(404, 405),
                       t(405, 406), t(406, 407))
    out += chunk_spans(rid, 1, 2, 0, t(300, 305), t(305, 310), t(310, 320), t(320, 330), t(330, 340),
                       t(340, 345), t(345, 350))
    return out


def write_side_files(d: str, run: dict, agent: dict, bench: dict | None = None) -> None:
    """run.json, agent.json and (if given) bench.json: what every run directory has."""
    for name, doc in (("run.json", run), ("agent.json", agent), ("bench.json", bench)):
        if doc is not None:
            with open(os.path.join(d, name), "w") as f:
                json.dump(doc, f)


def write_run(d: str, lines: list[str], bench: dict | None = None, agent: dict | None = None,
              run: dict | None = None) -> str:
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "spans.jsonl"), "w") as f:
        for ln in lines:
            f.write(ln + "\n")
    write_side_files(d, run or {"run_id": "fixture", "status": "complete", "exit_code": 0},
                     agent if agent is not None else {"events_read": 100, "events_dropped": 0}, bench)
    return d


# the worked example's attribution (three_stage_request), in us per (stage, category)
EXPECTED_US = {
    (-1, "dispatch"): 10, (-1, "deliver"): 100,  # no API marks in this trace: not split further
    (0, "queue"): 10, (0, "compute"): 80, (0, "snapshot"): 10, (0, "fifo_blocked"): 30,
    (0, "fifo_own"): 10, (0, "process"): 10, (0, "put"): 10,
    (1, "poll_lag"): 5, (1, "get"): 5, (1, "wait_schedule"): 20, (1, "compute"): 100,
    (1, "snapshot"): 5, (1, "fifo_own"): 5, (1, "process"): 10, (1, "put"): 10,
    (2, "poll_lag"): 10, (2, "get"): 5, (2, "wait_schedule"): 5, (2, "compute"): 450,
}
