"""W3C Trace Context on the way in: a request that carries ``traceparent`` joins the
caller's trace.

When a request arrives with a valid ``traceparent`` header, its API hook records two
events right after REQUEST_ARRIVE (``Ev.REQUEST_TRACE_HI``: a = trace id bits 127..64;
``Ev.REQUEST_TRACE_LO``: a = bits 63..0, chunk / b = the caller's span id bits 31..0 /
63..32, all two's-complement in their signed fields), so the agent gives every span of that
request the caller's trace id and makes ``omni.request`` a child of the caller's span.
Without one (or with an invalid one, which the spec says to ignore) the trace id stays
``conventions.trace_id_for(request_id)``. ``tracestate`` is not recorded (it would need a
string per request on the hot path); the spans carry an empty trace state.

Parsing by hand: the W3C format is four dash-separated hex fields, and the OpenTelemetry
propagator would need a Context object per request on the API's hot path.
"""
from __future__ import annotations

import re
from typing import Mapping

from omnitrace import record
from omnitrace.conventions import API_STAGE, Ev

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_MASK64 = (1 << 64) - 1


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """``(trace_id, parent_span_id, flags)`` of a valid W3C traceparent, else None."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None:
        return None
    version, trace, span, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or set(trace) == {"0"} or set(span) == {"0"}:
        return None
    return int(trace, 16), int(span, 16), int(flags, 16)


def _signed(x: int, bits: int) -> int:
    return x - (1 << bits) if x >= 1 << (bits - 1) else x


def encode(trace_id: int, parent_span_id: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The two events' (a, chunk, b) fields."""
    hi, lo = trace_id >> 64, trace_id & _MASK64
    return ((_signed(hi, 64), -1, 0),
            (_signed(lo, 64), _signed(parent_span_id & 0xFFFFFFFF, 32), _signed(parent_span_id >> 32, 32)))


def decode(hi_a: int, lo_a: int, lo_chunk: int, lo_b: int) -> tuple[int, int]:
    """``(trace_id, parent_span_id)`` back from the two events' fields."""
    trace = ((hi_a & _MASK64) << 64) | (lo_a & _MASK64)
    parent = ((lo_b & 0xFFFFFFFF) << 32) | (lo_chunk & 0xFFFFFFFF)
    return trace, parent


def record_traceparent(request_id: str, headers: Mapping[str, str], t: int = 0) -> bool:
    """Record the request's incoming trace context (call right after REQUEST_ARRIVE, from
    the API process); True when there was a valid one."""
    ctx = parse_traceparent(headers.get("traceparent"))
    if ctx is None:
        return False
    (ha, hc, hb), (la, lc, lb) = encode(ctx[0], ctx[1])
    record.emit(Ev.REQUEST_TRACE_HI, request_id, API_STAGE, hc, ha, hb, t)
    record.emit(Ev.REQUEST_TRACE_LO, request_id, API_STAGE, lc, la, lb, t)
    return True
