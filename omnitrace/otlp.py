"""Span tables -> OpenTelemetry spans: ids, attributes, resources, and the one OTLP/JSON
encoder (``omnitrace export --otlp-json``; tested against the official protobuf encoder +
``json_format``).

Used by the live OTLP exporter and by `omnitrace export`, so both send the same spans:
ids are deterministic (``conventions.trace_id_for`` / ``span_id_for`` over the span's
identity), so a child names its parent whichever feed or process delivered it.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import orjson

from omnitrace import __version__
from omnitrace import conventions as cv
from omnitrace import spantable as stt

_NO_EVENTS: tuple = ()
_SNAP_NAMES = {int(v): v.name.lower() for v in cv.Snapshot}
_MODALITY = {int(v): v.name.lower() for v in cv.Modality}


class OtlpSpan:
    """A finished span with explicit times (unix ns) and deterministic ids."""

    __slots__ = ("name", "trace_id", "span_id", "parent_id", "start", "end", "attrs",
                 "events", "proc", "error")

    def __init__(self, name: str, trace_id: int, span_id: int, parent_id: int | None,
                 start: int, end: int, attrs: dict, proc: tuple,
                 events: list | tuple = _NO_EVENTS, error: bool = False) -> None:
        self.name, self.trace_id, self.span_id, self.parent_id = name, trace_id, span_id, parent_id
        self.start, self.end = start, max(end, start)
        self.attrs, self.proc, self.events, self.error = attrs, proc, events, error

    def __repr__(self) -> str:  # for test failure messages
        return f"OtlpSpan({self.name} {self.attrs.get(cv.ATTR_REQUEST_ID)} {self.start}->{self.end})"


def proc_of(ring: dict) -> tuple:
    """A ring description -> the process identity its spans' resource names."""
    return (int(ring.get("pid", 0)), str(ring.get("role", "other")),
            int(ring.get("stage", cv.API_STAGE)), int(ring.get("replica", 0)),
            str(ring.get("process", "")))


def resource_attrs(run_id: str, proc: tuple) -> dict:
    pid, role, stage, replica, name = proc
    return {"service.name": cv.SERVICE_NAME, "service.instance.id": f"{run_id}/{pid}",
            cv.ATTR_PID: pid, cv.ATTR_ROLE: role, cv.ATTR_STAGE_ID: stage,
            cv.ATTR_REPLICA: replica, "process.executable.name": name or role,
            "omnitrace.run.id": run_id}


def emit_events(emits: np.ndarray) -> dict[tuple[int, int, int], list]:
    """``omni.emit`` span events of stage spans and the API marks of request spans (stage
    ``API_STAGE``), by (request, stage, replica)."""
    by_stage: dict[tuple[int, int, int], list] = {}
    for req, stage, replica, t, packet, modality in emits.tolist():
        if modality == stt.MARK_MODALITY:  # an API mark of the request span: packet is its event kind
            by_stage.setdefault((req, stage, replica), []).append(
                (cv.API_MARKS.get(packet, f"omni.api.{packet}"), t, {}))
            continue
        by_stage.setdefault((req, stage, replica), []).append(
            (cv.EVENT_EMIT, t, {cv.ATTR_PACKET_INDEX: packet,
                                cv.ATTR_MODALITY: _MODALITY.get(modality, str(modality))}))
    return by_stage


def request_events(ttft: int, ttfp: int, marks) -> list:
    """The root span's events: the first text token and the first audio packet (0: none),
    then the API server's marks."""
    events: list = []
    if ttft:
        events.append((cv.EVENT_TTFT, ttft, {}))
    if ttfp:
        events.append((cv.EVENT_TTFP, ttfp, {}))
    events.extend(marks)
    return events


def request_attrs(rid: str, status: int, replica: int, prompt_tokens: int, max_tokens: int) -> dict[str, Any]:
    """An ``omni.request`` span's attributes (a request-span row's columns); the tokens
    only where known (``prompt_tokens`` >= 0)."""
    attrs: dict[str, Any] = {cv.ATTR_REQUEST_ID: rid, cv.ATTR_STATUS: status, cv.ATTR_REPLICA: replica}
    if prompt_tokens >= 0:
        attrs[cv.ATTR_PROMPT_TOKENS] = prompt_tokens
        attrs[cv.ATTR_MAX_TOKENS] = max_tokens
    return attrs


def stage_attrs(rid: str, stage: int, name: str, replica: int) -> dict[str, Any]:
    """A stage or stage-queue span's attributes, omnitrace's and the upstream-proposed
    ones."""
    return {cv.ATTR_REQUEST_ID: rid, cv.ATTR_STAGE_ID: stage, cv.ATTR_STAGE_NAME: name,
            cv.ATTR_REPLICA: replica, cv.ATTR_VLLM_OMNI_STAGE_ID: stage,
            cv.ATTR_VLLM_OMNI_STAGE_NAME: name, cv.ATTR_VLLM_OMNI_REPLICA_ID: replica}


class SpanConverter:
    """Span-table rows -> :class:`OtlpSpan` objects (only where spans leave omnitrace:
    a Python object per span is the cost the live record path avoids)."""

    MAX_CONTEXTS = 1 << 18

    def __init__(self, requests: list[str], rings: dict[int, dict], run_id: str = "") -> None:
        self.requests, self.rings, self.run_id = requests, rings, run_id
        self._trace: dict[int, int] = {}
        # req -> (trace id, the caller's span id) from traceparent; kept past forget(): a
        # request's last spans may be built after its root span (bounded, oldest dropped)
        self._ctx: dict[int, tuple[int, int]] = {}
        self._occ: dict[tuple, int] = {}

    def add_contexts(self, contexts) -> None:
        """(req, trace id, parent span id) of requests that arrived with a traceparent:
        their spans join the caller's trace, ``omni.request`` under the caller's span.
        Call with each feed's ``contexts`` before converting its spans."""
        for req, trace, parent in contexts:
            self._ctx[req] = (trace, parent)
            self._trace[req] = trace  # spans converted before it (rare) keep the derived id
        if len(self._ctx) > self.MAX_CONTEXTS:
            for req in list(self._ctx)[:len(self._ctx) - self.MAX_CONTEXTS]:
                del self._ctx[req]

    def trace_id(self, req: int) -> int:
        t = self._trace.get(req)
        if t is None:
            ctx = self._ctx.get(req)
            t = self._trace[req] = ctx[0] if ctx else cv.trace_id_for(self.requests[req])
        return t

    def forget(self, reqs) -> None:
        """Requests that are finished: their trace ids and repeat counters can go."""
        for r in reqs:
            self._trace.pop(r, None)
        if len(self._occ) > 1 << 20:
            self._occ.clear()

    def convert(self, spans: stt.SpanTables) -> list[OtlpSpan]:
        """OTLP spans of the tables, in their span order (``SpanTables.span_reqs``)."""
        by_stage = emit_events(spans.emits)
        procs: dict[int, tuple] = {}

        def proc(ring: int) -> tuple:
            p = procs.get(ring)
            if p is None:
                p = procs[ring] = proc_of(self.rings.get(ring, {}))
            return p

        return (self._chunk_spans(spans.chunks, proc) + self._request_spans(spans.requests, by_stage, proc)
                + self._visit_spans(spans.visits, by_stage, proc))

    def _request_spans(self, table: np.ndarray, by_stage: dict, proc: Callable) -> list[OtlpSpan]:
        out = []
        for (req, reason, error, status, replica, ring, start, end, prompt, max_tokens, first_text,
             first_audio) in table.tolist():
            rid = self.requests[req]
            attrs = _with_reason(request_attrs(rid, status, replica, prompt, max_tokens), reason)
            events = request_events(first_text, first_audio, by_stage.get((req, cv.API_STAGE, replica), ()))
            sid, parent = cv.span_id_for(rid, cv.SPAN_REQUEST), (self._ctx.get(req) or (0, None))[1]
            out.append(OtlpSpan(cv.SPAN_REQUEST, self.trace_id(req), sid, parent, start, end, attrs,
                                proc(ring), events, bool(error)))
        return out

    def _visit_spans(self, table: np.ndarray, by_stage: dict, proc: Callable) -> list[OtlpSpan]:
        out = []
        for name, reason, error, _status, stage, replica, req, ring, start, end in table.tolist():
            rid, p = self.requests[req], proc(ring)
            attrs = _with_reason(stage_attrs(rid, stage, cv.stage_name(p[4], stage), replica), reason)
            if name == stt.N_STAGE:
                sid = cv.span_id_for(rid, cv.SPAN_STAGE, stage, replica)
                parent = cv.span_id_for(rid, cv.SPAN_REQUEST)
                events = by_stage.get((req, stage, replica), _NO_EVENTS)
            else:
                sid = cv.span_id_for(rid, cv.SPAN_STAGE_QUEUE, stage, replica)
                parent = cv.span_id_for(rid, cv.SPAN_STAGE, stage, replica)
                events = _NO_EVENTS
            out.append(OtlpSpan(stt.NAMES[name], self.trace_id(req), sid, parent, start, end, attrs, p,
                                events, bool(error)))
        return out

    def _chunk_spans(self, table: np.ndarray, proc: Callable) -> list[OtlpSpan]:
        out = []
        names, requests = stt.NAMES, self.requests
        # rows as tuples, for speed; figure holds what spantable names by span name
        # (AHEAD, STRATEGY, BYTES)
        for (name, reason, stage, peer, replica, req, chunk, ring, start, end, figure, blocked,
             by0, by1, by2) in table.tolist():
            rid, p = requests[req], proc(ring)
            producer = name in stt.PRODUCER_NAMES
            attrs = {cv.ATTR_REQUEST_ID: rid, cv.ATTR_STAGE_ID: stage,
                     cv.ATTR_PEER_STAGE_ID: peer, cv.ATTR_CHUNK_INDEX: chunk,
                     cv.ATTR_REPLICA: replica, cv.ATTR_VLLM_OMNI_STAGE_ID: stage,
                     cv.ATTR_VLLM_OMNI_STAGE_NAME: cv.stage_name(p[4], stage),
                     cv.ATTR_VLLM_OMNI_REPLICA_ID: replica,
                     cv.ATTR_STAGE_PAIR: cv.stage_pair(stage, peer) if producer
                     else cv.stage_pair(peer, stage)}
            if name == stt.N_FIFO:
                attrs[cv.ATTR_FIFO_AHEAD] = figure
                attrs[cv.ATTR_FIFO_DEPTH] = figure + 1
                if not reason:
                    attrs[cv.ATTR_FIFO_BLOCKED_NS] = blocked
                    attrs[cv.ATTR_FIFO_BLOCKED_BY] = [requests[x] for x in (by0, by1, by2) if x]
            elif name == stt.N_SNAPSHOT:
                attrs[cv.ATTR_SNAPSHOT_STRATEGY] = _SNAP_NAMES.get(figure, str(figure))
            elif name in (stt.N_PUT, stt.N_PROCESS, stt.N_GET):
                attrs[cv.ATTR_TRANSFER_BYTES] = figure
            key = (req, name, stage, chunk, peer)
            n = self._occ.get(key, 0)
            self._occ[key] = n + 1
            # the first span of a key has the documented id; a repeat (retried task) a new one
            sid = cv.span_id_for(rid, names[name], stage, chunk if n == 0 else f"{chunk}.{n}", peer)
            parent = cv.span_id_for(rid, cv.SPAN_STAGE, stage, replica)
            out.append(OtlpSpan(names[name], self.trace_id(req), sid, parent, start, end,
                                _with_reason(attrs, reason), p, _NO_EVENTS, False))
        return out


def _with_reason(attrs: dict[str, Any], reason: int) -> dict[str, Any]:
    """An incomplete span's attributes say so, and why."""
    if reason:
        attrs[cv.ATTR_INCOMPLETE] = True
        attrs[cv.ATTR_INCOMPLETE_REASON] = stt.REASONS[reason]
    return attrs


# ----------------------------------------------------------------------------- OTLP/JSON
_ERROR_STATUS = '{"code":2}'  # STATUS_CODE_ERROR
_KEY_HEAD: dict[str, str] = {}
_STR: dict[str, str] = {}


def _key_head(k: str) -> str:
    h = _KEY_HEAD.get(k)
    if h is None:
        h = _KEY_HEAD[k] = '{"key":' + orjson.dumps(k).decode() + ',"value":'
    return h


def _json_str(v: str) -> str:
    q = _STR.get(v)
    if q is None:
        if len(_STR) > 10_000:
            _STR.clear()
        q = _STR[v] = orjson.dumps(v).decode()
    return q


def _any(v: Any) -> str:
    """An OTLP/JSON AnyValue (int64 as a string, as OTLP/JSON requires)."""
    if isinstance(v, bool):
        return '{"boolValue":true}' if v else '{"boolValue":false}'
    if isinstance(v, int):
        return f'{{"intValue":"{v}"}}'
    if isinstance(v, float):
        return '{"doubleValue":' + orjson.dumps(v).decode() + "}"
    if isinstance(v, (list, tuple)):
        return ('{"arrayValue":{"values":[' + ",".join(_any(x) for x in v) + "]}}") if v \
            else '{"arrayValue":{}}'
    return '{"stringValue":' + _json_str(str(v)) + "}"


def _attrs(d: dict) -> str:
    return ",".join(f"{_key_head(k)}{_any(v)}}}" for k, v in d.items())


def encode_json(spans: list[OtlpSpan], resource: Callable[[tuple], dict]) -> bytes:
    """One ``ExportTraceServiceRequest`` as OTLP/JSON (the Collector's file-exporter line
    format): the same JSON the official encoder + ``json_format`` + hex ids gives."""
    groups: dict[tuple, list[str]] = {}
    for s in spans:
        parent = f'"parentSpanId":"{s.parent_id:016x}",' if s.parent_id else ""
        events = ""
        if s.events:
            events = '"events":[' + ",".join(
                f'{{"timeUnixNano":"{ts}","name":{_json_str(name)},"attributes":[{_attrs(a)}]}}'
                for name, ts, a in s.events) + "],"
        groups.setdefault(s.proc, []).append(
            f'{{"traceId":"{s.trace_id:032x}","spanId":"{s.span_id:016x}",{parent}'
            f'"name":{_json_str(s.name)},"kind":1,'
            f'"startTimeUnixNano":"{s.start}","endTimeUnixNano":"{s.end}",'
            f'"attributes":[{_attrs(s.attrs)}],{events}'
            f'"status":{_ERROR_STATUS if s.error else "{}"},"flags":256}}')
    scope = orjson.dumps({"name": "omnitrace.agent", "version": __version__}).decode()
    return ('{"resourceSpans":[' + ",".join(
        f'{{"resource":{{"attributes":[{_attrs(resource(proc))}]}},'
        f'"scopeSpans":[{{"scope":{scope},"spans":[{",".join(items)}]}}]}}'
        for proc, items in groups.items()) + "]}").encode()


def encode_json_lines(spans: list[OtlpSpan], resource: Callable[[tuple], dict],
                      per_line: int = 512) -> bytes:
    """Lines of :func:`encode_json`, ``per_line`` spans each, newline-terminated."""
    return b"".join(encode_json(spans[i:i + per_line], resource) + b"\n"
                    for i in range(0, len(spans), per_line))
