"""Native histograms and the protobuf exposition, in process: the buckets against a
reference built from the schema's definition, the wire form decoded back, content
negotiation as Prometheus sends it. (A real Prometheus ingesting it: test_live_quantiles,
test_dashboards_live.)"""
from __future__ import annotations

import bisect
import json
import urllib.request

import numpy as np
import pytest
from google.protobuf.internal.decoder import _DecodeVarint32

from omnitrace import conventions as cv
from omnitrace.agent import promproto
from omnitrace.agent.export_prometheus import Metrics, native_key
from omnitrace.runfiles.write import otlp_json
from omnitrace.top.model import quantile
from omnitrace.top.source import UrlSource, native_histogram, parse_otlp, parse_prometheus

# Accept headers as Prometheus sends them: 2.42 with native histograms on, 3.x's default
PROM_2_NATIVE = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,"
                 "application/openmetrics-text;version=1.0.0;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
PROM_3_TEXT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
               "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
               "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


def _reference_key(value: float) -> int:
    """Bucket k holds (base^(k-1), base^k], base = 2^(2^-schema): found by search over the
    boundaries themselves, not by a logarithm."""
    bounds = [2.0 ** (k / cv.NATIVE_PER_DOUBLING) for k in range(-40 * 16, 20 * 16)]
    return bisect.bisect_left(bounds, value) - 40 * 16


def test_native_buckets_follow_the_schema():
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.lognormal(-6, 2, 3000), [1.0, 2.0, 0.5, 1e-5, 30.0]])
    assert [native_key(float(v)) for v in values] == [_reference_key(float(v)) for v in values]
    assert native_key(1.0) == 0 and native_key(1.0001) == 1 and native_key(0.9999) == 0


def test_one_and_many_observations_fill_the_same_buckets():
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.lognormal(-4, 1.5, 5000), np.zeros(7)])
    one, many = Metrics(), Metrics()
    labels = ("0", "0", "0", "1")
    for v in values:
        one.observe(cv.METRIC_PUT, float(v), labels, None)
    many.hist.child(cv.METRIC_PUT, labels).observe_many(values)
    [a], [b] = one.hist.snapshot(cv.METRIC_PUT), many.hist.snapshot(cv.METRIC_PUT)
    assert a.native == b.native and a.zeros == b.zeros == 7 and a.counts == b.counts
    assert sum(a.native.values()) + a.zeros == len(values)


def test_spans_and_deltas_are_the_wire_form():
    spans, deltas = promproto.spans_and_deltas({-3: 2, -2: 5, 0: 1, 7: 4})
    assert spans == [(-3, 2), (1, 1), (6, 1)]  # first offset = first index, later = gap
    assert deltas == [2, 3, -4, 3]
    assert promproto.spans_and_deltas({}) == ([], [])


def test_content_negotiation_as_prometheus_asks():
    assert promproto.wants_protobuf(PROM_2_NATIVE)
    assert not promproto.wants_protobuf(PROM_3_TEXT)
    assert not promproto.wants_protobuf("")
    assert not promproto.wants_protobuf("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                                        "encoding=text")


def _families(body: bytes) -> dict:
    """Decoded with protobuf's own varint reader, not promproto's."""
    out, pos = {}, 0
    while pos < len(body):
        n, pos = _DecodeVarint32(body, pos)
        fam = promproto.MetricFamily.FromString(body[pos:pos + n])
        out[fam.name] = fam
        pos += n
    assert [f.name for f in promproto.families(body)] == list(out)
    return out


def test_the_endpoint_serves_protobuf_to_prometheus_and_text_to_others():
    m = Metrics()
    m.api_seen(0)
    rng = np.random.default_rng(5)
    values = rng.lognormal(-3, 1, 400)
    m.hist.child(cv.METRIC_FIFO_RESIDENCE, ("0", "0", "0", "1")).observe_many(
        values, lambda k: f"{k:032x}", np.arange(len(values)))
    m.counters[cv.METRIC_EVENTS].labels("0", "0").inc(12)
    port = m.serve(0)
    try:
        def scrape(accept: str) -> tuple[bytes, str]:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.read(), r.headers["Content-Type"]
        body, ctype = scrape(PROM_2_NATIVE)
        text, ttype = scrape(PROM_3_TEXT)
    finally:
        m.close()
    assert ctype == promproto.CONTENT_TYPE and ttype.startswith("application/openmetrics-text")
    fams = _families(body)
    h = fams["omnitrace_fifo_residence_seconds"].metric[0].histogram
    assert h.sample_count == 400 and h.sample_sum == pytest.approx(values.sum())
    assert h.schema == cv.NATIVE_SCHEMA and h.zero_threshold == cv.NATIVE_ZERO_THRESHOLD
    # the native buckets decode back to one count per value, in the schema's buckets
    want: dict[int, int] = {}
    for v in values:
        want[_reference_key(float(v))] = want.get(_reference_key(float(v)), 0) + 1
    assert promproto.native_buckets(h) == want
    # classic buckets cumulative, exemplars with timestamps in both places
    assert [b.cumulative_count for b in h.bucket] == sorted(b.cumulative_count for b in h.bucket)
    assert h.bucket[-1].upper_bound == cv.LATENCY_BUCKETS_S[-1]
    assert h.exemplars and all(e.timestamp.seconds > 0 and len(e.label[0].value) == 32 for e in h.exemplars)
    # one bucket exemplar, the newest (Prometheus 2.x reads a native histogram's first)
    [newest] = [b.exemplar for b in h.bucket if b.HasField("exemplar")]
    assert newest.timestamp.ToNanoseconds() == max(e.timestamp.ToNanoseconds() for e in h.exemplars)
    # no empty label values; the request histograms exist from the API server's start
    assert {lp.name for lp in fams["omnitrace_fifo_residence_seconds"].metric[0].label} == set(
        ("stage", "replica", "from_stage", "to_stage"))
    assert fams["omnitrace_request_ttfp_seconds"].metric[0].histogram.sample_count == 0
    assert {lp.name for lp in fams["omnitrace_request_ttfp_seconds"].metric[0].label} == {"stage", "replica"}
    assert fams["omnitrace_events_total"].type == promproto.COUNTER
    assert fams["omnitrace_events_total"].metric[0].counter.value == 12
    assert b"omnitrace_fifo_residence_seconds_bucket{" in text and b"# {trace_id=" in text


def test_top_reads_quantiles_from_the_native_buckets():
    """`omnitrace top` on the endpoint: protobuf first, its quantiles within one native
    bucket of the exact ones; over the text format only the classic buckets' precision."""
    m = Metrics()
    rng = np.random.default_rng(11)
    values = rng.lognormal(-2.5, 0.6, 2000)
    m.hist.child(cv.METRIC_FIFO_RESIDENCE, ("0", "0", "0", "1")).observe_many(values)
    port = m.serve(0)
    try:
        got = UrlSource(f"127.0.0.1:{port}").read()
        text = parse_prometheus(m.exposition("text/plain")[0].decode(), 0.0)
    finally:
        m.close()
    key = ("omnitrace_fifo_residence_seconds", (("from_stage", "0"), ("replica", "0"), ("stage", "0"),
                                                ("to_stage", "1")))
    bucket = 2 ** (1 / cv.NATIVE_PER_DOUBLING) - 1
    for q in (0.5, 0.9, 0.99):
        exact = float(np.percentile(values, q * 100))
        assert abs(quantile(q, got.hists[key]) / exact - 1) <= bucket, q
    assert got.hists[key].count == len(values) and got.hists[key].sum == pytest.approx(values.sum())
    assert got.values[("omnitrace_requests_started_total", ())] == 0
    # the negative control: the classic buckets miss p99 by far more than a native bucket
    exact = float(np.percentile(values, 99))
    assert abs(quantile(0.99, text.hists[key]) / exact - 1) > 2 * bucket


def test_metrics_jsonl_carries_the_native_buckets_as_otlp_exponential_histograms():
    """The run directory's metrics.jsonl line (OTLP JSON, as the agent writes it) read back
    by `omnitrace top`: the same buckets, so the same quantiles as the endpoint."""
    m = Metrics()
    rng = np.random.default_rng(13)
    values = np.concatenate([rng.lognormal(-5, 1.2, 1500), np.zeros(3)])
    m.hist.child(cv.METRIC_SNAPSHOT, ("1", "0", "1", "2")).observe_many(values)
    msg = m.to_otlp({"service.name": "omnitrace"}, 1, 2)
    got = parse_otlp(json.loads(otlp_json(msg)), 0.0)  # the bytes metrics.jsonl gets
    [dp] = msg.resource_metrics[0].scope_metrics[0].metrics[0].exponential_histogram.data_points
    assert dp.scale == cv.NATIVE_SCHEMA and dp.count == len(values) and dp.zero_count == 3
    [(_, h)] = [(k, v) for k, v in got.hists.items() if k[0] == "omnitrace_snapshot_duration_seconds"]
    [series] = m.hist.snapshot(cv.METRIC_SNAPSHOT)
    assert h.count == len(values)
    for q in (0.5, 0.99):
        exact = float(np.percentile(values, q * 100))
        assert abs(quantile(q, h) / exact - 1) <= 2 ** (1 / cv.NATIVE_PER_DOUBLING) - 1, q
    # bucket for bucket what the endpoint serves
    assert quantile(0.9, h) == quantile(0.9, native_histogram(series.native, series.zeros, series.sum))
