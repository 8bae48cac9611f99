"""Live OTLP export when the collector cannot keep up: tail-based sampling keeps every
span of the slowest requests and of requests with head-of-line blocking, counts the rest.
Real OTLP/HTTP exporter against a real socket that never answers (a hung collector)."""
from __future__ import annotations


import random

import numpy as np

from omnitrace import spanload
from omnitrace import spantable as stt
from omnitrace.agent import export_otlp
from omnitrace.agent.views import OtlpView
from omnitrace.otlp import SpanConverter
from tests.support.otlp_receiver import HangingEndpoint

RINGS = {0: {"pid": 1, "replica": 0, "role": "api", "stage": -1, "process": "api"}}
PART = spanload.Part(RINGS, [])


def _request(req: int, ttfp_ns: int, blocked: bool, chunks: int = 9) -> stt.SpanTables:
    rows = np.zeros(chunks, stt.CHUNK_DTYPE)
    rows["req"], rows["ring"] = req, 0
    rows["name"] = stt.N_SNAPSHOT
    rows["name"][0] = stt.N_FIFO
    rows["blocked"][0] = 5_000 if blocked else 0
    rows["start"], rows["end"] = 1_000, 2_000
    root = np.zeros(1, stt.REQUEST_DTYPE)
    root["req"], root["start"], root["end"] = req, 0, ttfp_ns + 10
    root["first_audio"], root["prompt_tokens"] = ttfp_ns, -1
    return stt.SpanTables(requests=root, chunks=rows)
def test_sampling_keeps_slow_and_blocked_requests_and_counts_the_rest():
    hang = HangingEndpoint()
    exp = export_otlp.QueuedExporter(
        "otlp-http", export_otlp.make_exporter("otlp-http", f"http://127.0.0.1:{hang.port}/v1/traces", 30.0),
        max_queue_spans=40, max_batch=10)
    n = 300
    requests = [""] + [f"r{i}" for i in range(1, n + 1)]
    view = OtlpView([exp], SpanConverter(requests, RINGS, "t"), head_every=1 << 30)
    rng = random.Random(3)
    blocked = {r for r in range(1, n + 1) if r % 17 == 0}
    ttfp = {r: rng.randint(1, 1000) * 1_000_000 for r in range(1, n + 1)}
    try:
        for r in range(1, n + 1):
            view.feed(stt.Feed(_request(r, ttfp[r], r in blocked)), PART)
        c = view.counters()
        assert c["sampling"] and c["requests_not_exported"] > n // 2
        out = set(view.not_exported_ids)
        assert len(out) == c["requests_not_exported"]
        assert not out & {f"r{r}" for r in blocked}  # head-of-line victims always kept
        slowest = sorted(ttfp, key=ttfp.get)[-10:]
        assert not out & {f"r{r}" for r in slowest}  # the slowest by TTFP kept
        assert c["spans_not_exported"] == 10 * c["requests_not_exported"]
        # every span is accounted for: sent (queued, in flight, dropped at the full queue)
        # or counted as not exported by sampling
        ec = exp.counters()
        sent = ec["queued"] + ec["dropped"] + ec["exported"] + ec["failed"] + exp.in_flight
        assert sent + c["spans_not_exported"] == 10 * n
    finally:
        exp.close(0.5)
        hang.stop()
