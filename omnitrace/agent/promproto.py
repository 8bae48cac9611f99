"""Prometheus's protobuf exposition, the one format that carries native histograms.

Prometheus (2.40+, ``--enable-feature=native-histograms``) asks for
``application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily;
encoding=delimited`` first, then text. The body is a run of ``MetricFamily`` messages,
each prefixed by its length as a varint.

Written here because prometheus_client has no native-histogram exposition (open pull
requests at the time of writing) and no well-kept package ships the generated messages.
The messages are the official schema
(prometheus/client_model ``io/prometheus/client/metrics.proto``, the fields omnitrace
fills), declared below as a descriptor so the official protobuf runtime encodes them;
no protoc at install time.
"""
from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

CONTENT_TYPE = ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
                "encoding=delimited")
COUNTER, GAUGE, UNTYPED, HISTOGRAM = 0, 1, 3, 4  # io.prometheus.client.MetricType

_F = descriptor_pb2.FieldDescriptorProto
# message -> (field, number, type, repeated, message type)
_SCHEMA: dict[str, list[tuple[str, int, int, bool, str]]] = {
    "LabelPair": [("name", 1, _F.TYPE_STRING, False, ""), ("value", 2, _F.TYPE_STRING, False, "")],
    "Gauge": [("value", 1, _F.TYPE_DOUBLE, False, "")],
    "Counter": [("value", 1, _F.TYPE_DOUBLE, False, ""), ("exemplar", 2, _F.TYPE_MESSAGE, False, "Exemplar")],
    "Untyped": [("value", 1, _F.TYPE_DOUBLE, False, "")],
    "Exemplar": [("label", 1, _F.TYPE_MESSAGE, True, "LabelPair"), ("value", 2, _F.TYPE_DOUBLE, False, ""),
                 ("timestamp", 3, _F.TYPE_MESSAGE, False, ".google.protobuf.Timestamp")],
    "Bucket": [("cumulative_count", 1, _F.TYPE_UINT64, False, ""), ("upper_bound", 2, _F.TYPE_DOUBLE, False, ""),
               ("exemplar", 3, _F.TYPE_MESSAGE, False, "Exemplar")],
    "BucketSpan": [("offset", 1, _F.TYPE_SINT32, False, ""), ("length", 2, _F.TYPE_UINT32, False, "")],
    "Histogram": [("sample_count", 1, _F.TYPE_UINT64, False, ""), ("sample_sum", 2, _F.TYPE_DOUBLE, False, ""),
                  ("bucket", 3, _F.TYPE_MESSAGE, True, "Bucket"), ("schema", 5, _F.TYPE_SINT32, False, ""),
                  ("zero_threshold", 6, _F.TYPE_DOUBLE, False, ""), ("zero_count", 7, _F.TYPE_UINT64, False, ""),
                  ("positive_span", 12, _F.TYPE_MESSAGE, True, "BucketSpan"),
                  ("positive_delta", 13, _F.TYPE_SINT64, True, ""),
                  ("exemplars", 16, _F.TYPE_MESSAGE, True, "Exemplar")],
    "Metric": [("label", 1, _F.TYPE_MESSAGE, True, "LabelPair"), ("gauge", 2, _F.TYPE_MESSAGE, False, "Gauge"),
               ("counter", 3, _F.TYPE_MESSAGE, False, "Counter"), ("untyped", 5, _F.TYPE_MESSAGE, False, "Untyped"),
               ("histogram", 7, _F.TYPE_MESSAGE, False, "Histogram")],
    "MetricFamily": [("name", 1, _F.TYPE_STRING, False, ""), ("help", 2, _F.TYPE_STRING, False, ""),
                     ("type", 3, _F.TYPE_ENUM, False, "MetricType"),
                     ("metric", 4, _F.TYPE_MESSAGE, True, "Metric"), ("unit", 5, _F.TYPE_STRING, False, "")],
}
_PACKAGE = "io.prometheus.client"


def _classes() -> dict[str, Any]:
    f = descriptor_pb2.FileDescriptorProto(name="io/prometheus/client/metrics.proto", package=_PACKAGE,
                                           syntax="proto2", dependency=["google/protobuf/timestamp.proto"])
    enum = f.enum_type.add(name="MetricType")
    for name, number in (("COUNTER", COUNTER), ("GAUGE", GAUGE), ("SUMMARY", 2), ("UNTYPED", UNTYPED),
                         ("HISTOGRAM", HISTOGRAM), ("GAUGE_HISTOGRAM", 5)):
        enum.value.add(name=name, number=number)
    for message, fields in _SCHEMA.items():
        m = f.message_type.add(name=message)
        for field, number, ftype, repeated, type_name in fields:
            fd = m.field.add(name=field, number=number, type=ftype,
                             label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
            if type_name:
                fd.type_name = type_name if type_name.startswith(".") else f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(f)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in _SCHEMA}


_MSG = _classes()
MetricFamily = _MSG["MetricFamily"]


def wants_protobuf(accept: str) -> bool:
    """Whether a scraper's Accept header offers the delimited MetricFamily format (the one
    Prometheus lists first when native histograms are on)."""
    return any(part.split(";")[0].strip() == "application/vnd.google.protobuf"
               and "io.prometheus.client.MetricFamily" in part and "encoding=delimited" in part
               for part in accept.split(","))


# The length prefixes by hand: protobuf's Python API has no public delimited-stream reader
# or writer (its varint codecs are private, ``google.protobuf.internal``).
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def delimited(families: list) -> bytes:
    """The body: each message after its varint length."""
    parts = []
    for fam in families:
        body = fam.SerializeToString()
        parts += (_varint(len(body)), body)
    return b"".join(parts)


def families(body: bytes) -> list:
    """A delimited body back into its MetricFamily messages."""
    out, pos = [], 0
    while pos < len(body):
        n = shift = 0
        while True:  # the length varint
            byte = body[pos]
            pos += 1
            n |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        out.append(MetricFamily.FromString(body[pos:pos + n]))
        pos += n
    return out


def native_buckets(h) -> dict[int, int]:
    """A Histogram message's positive native buckets, index -> count (the inverse of
    :func:`spans_and_deltas`)."""
    out: dict[int, int] = {}
    deltas = iter(h.positive_delta)
    key, count = None, 0
    for span in h.positive_span:
        key = span.offset if key is None else key + span.offset
        for _ in range(span.length):
            count += next(deltas)
            out[key] = count
            key += 1
    return out


def spans_and_deltas(buckets: dict[int, int]) -> tuple[list[tuple[int, int]], list[int]]:
    """A native histogram's sparse buckets (index -> count) as (offset, length) spans and
    count deltas, the wire form: the first span's offset is its first index, a later one's
    the gap after the previous span; each count is sent as the change from the one before."""
    spans: list[tuple[int, int]] = []
    deltas: list[int] = []
    prev_key, prev_count = None, 0
    for key in sorted(buckets):
        if prev_key is not None and key == prev_key + 1:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((key if prev_key is None else key - prev_key - 1, 1))
        deltas.append(buckets[key] - prev_count)
        prev_key, prev_count = key, buckets[key]
    return spans, deltas


def exemplar(trace_hex: str, value: float, ts: float):
    ex = _MSG["Exemplar"](value=value)
    ex.label.add(name="trace_id", value=trace_hex)
    ex.timestamp.FromNanoseconds(int(ts * 1e9))
    return ex


def from_client(family) -> Any:
    """A prometheus_client metric family (counter, gauge; others untyped) as a MetricFamily."""
    kind = {"counter": COUNTER, "gauge": GAUGE}.get(family.type, UNTYPED)
    name = family.name + "_total" if kind == COUNTER else family.name
    fam = MetricFamily(name=name, help=family.documentation, type=kind)
    for sample in family.samples:
        if sample.name != name:  # a counter's _created
            continue
        m = fam.metric.add()
        for k, v in sample.labels.items():
            m.label.add(name=k, value=v)
        field = {COUNTER: m.counter, GAUGE: m.gauge}.get(kind, m.untyped)
        field.value = sample.value
    return fam
