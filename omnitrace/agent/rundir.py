"""The run directory (docs/run-directory.md): run.json, processes.jsonl, spans.jsonl,
metrics.jsonl (OTLP JSON lines, the OpenTelemetry file-exporter format) and agent.json.

Spans are encoded with the official OTLP protobuf encoder and printed with
``google.protobuf.json_format``; ids are then rewritten from protobuf-JSON base64 to the
hex that OTLP/JSON requires (json_format alone gets that wrong), and enums are written
as integers, so a Collector's otlpjsonfile receiver can replay the files.
"""
from __future__ import annotations

import base64
import json
import os
from typing import Any

import orjson
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from omnitrace import __version__

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _any(v: Any) -> dict:
    """An OTLP/JSON AnyValue."""
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}  # int64 is a string in OTLP/JSON
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_any(x) for x in v]} if v else {}}
    return {"stringValue": str(v)}


def _attrs(d: dict) -> list[dict]:
    out: list[dict] = []
    app = out.append
    for k, v in d.items():  # str and int first, inline: this is the file exporter's hot loop
        t = type(v)
        if t is str:
            app({"key": k, "value": {"stringValue": v}})
        elif t is int:
            app({"key": k, "value": {"intValue": str(v)}})
        else:
            app({"key": k, "value": _any(v)})
    return out


def spans_request_json(spans: list, resource_attrs: Any) -> dict:
    """omnitrace Spans -> one OTLP/JSON ExportTraceServiceRequest, written directly.

    Same output as the official encoder + json_format + hex ids (tests compare them),
    at a fraction of the cost: the encoder path cost ~130 us per span, which capped the
    agent at a few thousand spans per second.
    """
    groups: dict[tuple, list] = {}
    for s in spans:
        d = {"traceId": f"{s.trace_id:032x}", "spanId": f"{s.span_id:016x}"}
        if s.parent_id:
            d["parentSpanId"] = f"{s.parent_id:016x}"
        d["name"] = s.name
        d["kind"] = 1  # INTERNAL
        d["startTimeUnixNano"] = str(s.start)
        d["endTimeUnixNano"] = str(s.end)
        d["attributes"] = _attrs(s.attrs)
        if s.events:
            d["events"] = [{"timeUnixNano": str(ts), "name": name, "attributes": _attrs(a)}
                           for name, ts, a in s.events]
        d["status"] = {"code": 2} if s.error else {}
        d["flags"] = 256  # as the SDK encoder: "has is_remote", not remote
        groups.setdefault(s.proc, []).append(d)
    return {"resourceSpans": [
        {"resource": {"attributes": _attrs(resource_attrs(proc))},
         "scopeSpans": [{"scope": {"name": "omnitrace.agent", "version": __version__},
                         "spans": items}]}
        for proc, items in groups.items()]}


def _hex_ids(obj: Any) -> None:
    """In place: base64 ids (protobuf JSON) -> lowercase hex (OTLP JSON)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in _ID_KEYS and isinstance(v, str):
                obj[k] = base64.b64decode(v).hex()
            else:
                _hex_ids(v)
    elif isinstance(obj, list):
        for v in obj:
            _hex_ids(v)


_ERR = '{"code":2}'
_KEY_HEAD: dict[str, str] = {}
_STR_CACHE: dict[str, str] = {}


def _key_head(k: str) -> str:
    h = _KEY_HEAD.get(k)
    if h is None:
        h = _KEY_HEAD[k] = '{"key":' + orjson.dumps(k).decode() + ',"value":'
    return h


attr_head = _key_head  # for the assembler's pre-rendered chunk-span attributes


def json_str(v: str) -> str:
    """``v`` as a JSON string literal (escaped, quoted), cached."""
    q = _STR_CACHE.get(v)
    if q is None:
        if len(_STR_CACHE) > 10_000:
            _STR_CACHE.clear()
        q = _STR_CACHE[v] = orjson.dumps(v).decode()
    return q


def _attrs_text(d: dict) -> str:
    parts = []
    app = parts.append
    for k, v in d.items():
        t = type(v)
        if t is str:
            q = _STR_CACHE.get(v)
            if q is None:
                if len(_STR_CACHE) > 10_000:
                    _STR_CACHE.clear()
                q = _STR_CACHE[v] = orjson.dumps(v).decode()  # JSON-escaped, quoted
            app(f'{_key_head(k)}{{"stringValue":{q}}}}}')
        elif t is int:
            app(f'{_key_head(k)}{{"intValue":"{v}"}}}}')
        else:
            app(orjson.dumps({"key": k, "value": _any(v)}).decode())
    return ",".join(parts)


def spans_request_bytes(spans: list, resource_attrs: Any) -> bytes:
    """Same JSON as :func:`spans_request_json`, formatted as text directly: building and
    serialising the nested dicts was most of the file exporter's cost. A span's ``text``
    (the span object pre-rendered by the assembler) is used as is."""
    groups: dict[tuple, list[str]] = {}
    for s in spans:
        if s.text is not None:
            items = groups.get(s.proc)
            if items is None:
                items = groups[s.proc] = []
            items.append(s.text)
            continue
        parent = f'"parentSpanId":"{s.parent_id:016x}",' if s.parent_id else ""
        events = ""
        if s.events:
            events = '"events":[' + ",".join(
                f'{{"timeUnixNano":"{ts}","name":{json_str(name)},'
                f'"attributes":[{_attrs_text(a)}]}}' for name, ts, a in s.events) + "],"
        text = _attrs_text(s.attrs)
        items = groups.get(s.proc)
        if items is None:
            items = groups[s.proc] = []
        items.append(
            f'{{"traceId":"{s.trace_id:032x}","spanId":"{s.span_id:016x}",{parent}'
            f'"name":{json_str(s.name)},"kind":1,'
            f'"startTimeUnixNano":"{s.start}","endTimeUnixNano":"{s.end}",'
            f'"attributes":[{text}],{events}'
            f'"status":{_ERR if s.error else "{}"},"flags":256}}')
    scope = orjson.dumps({"name": "omnitrace.agent", "version": __version__}).decode()
    return ('{"resourceSpans":[' + ",".join(
        f'{{"resource":{{"attributes":[{_attrs_text(resource_attrs(proc))}]}},'
        f'"scopeSpans":[{{"scope":{scope},"spans":[{",".join(items)}]}}]}}'
        for proc, items in groups.items()) + "]}").encode()


def otlp_json(message: Any) -> bytes:
    d = MessageToDict(message, use_integers_for_enums=True)
    _hex_ids(d)
    return orjson.dumps(d)


def write_json_atomic(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    os.replace(tmp, path)


def check_writable(path: str) -> str | None:
    """None if ``path`` can be created/written as a run directory, else why not."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".omnitrace-write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        return f"{exc.strerror or exc}"
    return None


class RunDir:
    """Appends spans/metrics lines and rewrites the small JSON files."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self._spans = open(os.path.join(path, "spans.jsonl"), "ab")
        self._metrics = open(os.path.join(path, "metrics.jsonl"), "ab")
        self.span_lines = 0
        self.spans_written = 0

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def write_spans(self, spans: list, max_per_line: int = 512) -> None:
        """``spans``: SDK ReadableSpans; one ExportTraceServiceRequest line per batch."""
        for i in range(0, len(spans), max_per_line):
            batch = spans[i:i + max_per_line]
            self._spans.write(otlp_json(encode_spans(batch)) + b"\n")
            self.span_lines += 1
            self.spans_written += len(batch)
        self._spans.flush()

    def write_span_objects(self, spans: list, resource_attrs: Any, max_per_line: int = 512) -> None:
        """``spans``: omnitrace Spans; ``resource_attrs(proc) -> dict``."""
        lines = []  # one write() per call (per drain cycle), not one per line
        for i in range(0, len(spans), max_per_line):
            batch = spans[i:i + max_per_line]
            lines.append(spans_request_bytes(batch, resource_attrs))
            self.span_lines += 1
            self.spans_written += len(batch)
        if lines:
            lines.append(b"")
            self._spans.write(b"\n".join(lines))
        self._spans.flush()

    def write_span_texts(self, texts: dict, resource_attrs: Any, max_per_line: int = 512) -> None:
        """``texts``: proc -> [span OTLP/JSON object text] (the assembler's text-only
        spans); one ExportTraceServiceRequest line per process and up to 512 spans."""
        scope = orjson.dumps({"name": "omnitrace.agent", "version": __version__}).decode()
        lines = []
        for proc, items in texts.items():
            res = f'{{"resourceSpans":[{{"resource":{{"attributes":[{_attrs_text(resource_attrs(proc))}]}},' \
                  f'"scopeSpans":[{{"scope":{scope},"spans":['
            for i in range(0, len(items), max_per_line):
                batch = items[i:i + max_per_line]
                lines.append(f'{res}{",".join(batch)}]}}]}}]}}\n')
                self.span_lines += 1
                self.spans_written += len(batch)
        if lines:
            self._spans.write("".join(lines).encode())
            self._spans.flush()

    def write_metrics(self, request: Any) -> None:
        self._metrics.write(otlp_json(request) + b"\n")
        self._metrics.flush()

    def write_run(self, meta: dict) -> None:
        write_json_atomic(self.file("run.json"), meta)

    def write_processes(self, procs: list[dict]) -> None:
        tmp = self.file("processes.jsonl.tmp")
        with open(tmp, "wb") as f:
            for p in procs:
                f.write(orjson.dumps(p) + b"\n")
        os.replace(tmp, self.file("processes.jsonl"))

    def write_agent(self, counters: dict) -> None:
        write_json_atomic(self.file("agent.json"), counters)

    def close(self) -> None:
        for f in (self._spans, self._metrics):
            try:
                f.close()
            except OSError:
                pass


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)
