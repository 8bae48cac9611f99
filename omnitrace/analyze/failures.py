"""Why measured requests failed, by cause: the bench's per-request errors, the trace's
request status, the stage deaths the API server recorded (``STAGE_DIED``) and the MRv2
connector deliveries that timed out (``DELIVERY_TIMEOUT``: vLLM-Omni then quarantines the
stage's sends).

A failed request is a failure of the server or the client, named as such; "no trace" is
left for requests that succeeded and still have none (a tracing gap).
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from omnitrace import conventions as cv

_DIED = re.compile(r"stage (-?\d+) \(([^)]*)\) died")
_MSG = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)')


def cause_of(error: str) -> tuple[str, str]:
    """(cause, how the client saw it) of one bench error string (bench/client.py wording)."""
    text, how, code = error, error, ""
    if error.startswith("HTTP "):
        code = error.split()[1] if len(error.split()) > 1 else "?"
        m = _MSG.search(error)
        text = m.group(1) if m else error
        how = f"refused (HTTP {code})"
    elif error.startswith("stream error"):
        how = "cut off mid-stream"
    m = _DIED.search(text)
    if m:
        return f"stage {m.group(1)} ({m.group(2)}) died", how
    if "server busy" in text:
        return "server busy", how
    if "shutting down" in text:
        return "server shutting down", how
    if error.startswith("cancelled"):
        return "client cancelled", "bench interrupted"
    if error == "timed out":
        return "client timeout", "no answer within --request-timeout"
    if error.startswith("connection failed"):
        return "connection failed", error[:80]
    if error == "server disconnected":
        return "server disconnected", "connection closed mid-stream"
    if code:
        return f"HTTP {code}: {text[:80]}", how
    return text[:80], how


def summarize(bench_rows: Iterable[dict[str, Any]], traced: dict[str, tuple[int, int]],
              stage_deaths: list[tuple[int, int]], stage_label,
              delivery_timeouts: Iterable[tuple[int, int, str, int]] = ()) -> dict[str, Any]:
    """``bench_rows``: the measured bench rows; ``traced``: request id -> (status, end unix
    ns) of measured requests without a bench row (a foreign client); ``stage_deaths``:
    (stage, unix ns); ``delivery_timeouts``: (stage, unix ns, request, chunk). Returns
    ``{failed, failed_ids, causes[], stage_deaths[], delivery_timeouts[]}``."""
    causes: dict[str, dict[str, Any]] = {}
    failed: list[str] = []

    def add(rid: str, cause: str, how: str, example: str) -> None:
        c = causes.setdefault(cause, {"cause": cause, "count": 0, "how": {}, "example": example})
        c["count"] += 1
        c["how"][how] = c["how"].get(how, 0) + 1
        failed.append(rid)

    for r in bench_rows:
        err = r.get("error")
        if err:
            cause, how = cause_of(str(err))
            add(str(r.get("id")), cause, how, str(err)[:200])
    deaths = sorted(stage_deaths, key=lambda d: d[1])
    timeouts = sorted(delivery_timeouts, key=lambda d: d[1])
    for rid, (status, end) in traced.items():
        if status == cv.Status.OK:
            continue
        if status == cv.Status.CANCELLED:
            add(rid, "client cancelled", "client went away (trace)", "status CANCELLED")
            continue
        add(rid, _server_cause(deaths, timeouts, end, stage_label), "error status in the trace",
            "status ERROR")
    return {"failed": len(failed), "failed_ids": failed,
            "causes": sorted(causes.values(), key=lambda c: (-c["count"], c["cause"])),
            "stage_deaths": [{"stage": stage_label(s), "stage_id": s, "unix_ns": t}
                             for s, t in deaths],
            "delivery_timeouts": [{"stage": stage_label(s), "stage_id": s, "request": r, "chunk": c,
                                   "unix_ns": t} for s, t, r, c in timeouts]}


def _server_cause(deaths: list, timeouts: list, end: int, stage_label) -> str:
    """A traced request's error by what the server recorded before its end: the first stage
    death, else the first delivery timeout (a quarantined stage fails its later sends)."""
    died = [d for d in deaths if d[1] <= end]
    if died:
        return f"stage {stage_label(died[0][0])} died"
    late = [d for d in timeouts if d[1] <= end]
    if late:
        return f"stage {stage_label(late[0][0])}: connector delivery timed out"
    return "server error"
