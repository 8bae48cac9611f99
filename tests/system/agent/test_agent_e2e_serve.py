"""`omnitrace run serve`: the reference pipeline under instrumentation, several concurrent
streaming requests, spans received by a real OTLP gRPC receiver (official stubs)."""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict

import aiohttp

from omnitrace import conventions as cv
from tests.support.agent_util import clean_env, read_json, read_spans
from tests.support.otlp_receiver import Store, free_port, start_grpc

N_REQ = 6


def _val(v):
    return getattr(v, v.WhichOneof("value"))


async def _stream(session: aiohttp.ClientSession, url: str, rid: str) -> int:
    body = {"model": "ref", "stream": True, "max_tokens": 6, "omnitrace_prompt_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}]}
    audio = 0
    async with session.post(url, json=body, headers={"x-request-id": rid}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data: {"):
                audio += json.loads(line[6:]).get("modality") == "audio"
    return audio


async def _load(port: int) -> list[int]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession() as s:
        return await asyncio.gather(*[_stream(s, url, f"e2e-{i}") for i in range(N_REQ)])


def test_run_serve_concurrent_requests_one_trace_each(tmp_path):
    store = Store()
    server, gport = start_grpc(store)
    port = free_port()
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(run_dir),
                             "--exporter", "otlp-grpc", "--otlp-endpoint", f"127.0.0.1:{gport}",
                             "--otlp-timeout", "5", "serve", "--port", str(port)],
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
                time.sleep(0.3)
        audio = asyncio.run(_load(port))
        assert all(a > 0 for a in audio)
        proc.send_signal(signal.SIGTERM)  # forwarded to the server; the agent then flushes
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err.decode()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop(0)

    spans = store.spans()
    by_trace = defaultdict(list)
    for res, s in spans:
        by_trace[s.trace_id.hex()].append(s)
    rids = {f"e2e-{i}" for i in range(N_REQ)}
    assert {f"{cv.trace_id_for(r):032x}" for r in rids} <= set(by_trace)
    for rid in rids:
        items = by_trace[f"{cv.trace_id_for(rid):032x}"]
        ids = {s.span_id for s in items}
        names = defaultdict(list)
        for s in items:
            a = {kv.key: _val(kv.value) for kv in s.attributes}
            assert a[cv.ATTR_REQUEST_ID] == rid
            assert cv.ATTR_INCOMPLETE not in a, (s.name, a)
            assert s.name == cv.SPAN_REQUEST or s.parent_span_id in ids, s.name
            names[s.name].append(a)
        assert len(names[cv.SPAN_REQUEST]) == 1
        assert {a[cv.ATTR_STAGE_ID] for a in names[cv.SPAN_STAGE]} == {0, 1, 2}
        # every chunk a producer enqueued went through the FIFO and reached its consumer
        for name in (cv.SPAN_FIFO, cv.SPAN_PUT, cv.SPAN_GET, cv.SPAN_WAIT_SCHEDULE):
            assert names[name], name
        prod = {(a[cv.ATTR_STAGE_ID], a[cv.ATTR_CHUNK_INDEX]) for a in names[cv.SPAN_FIFO]}
        put = {(a[cv.ATTR_STAGE_ID], a[cv.ATTR_CHUNK_INDEX]) for a in names[cv.SPAN_PUT]}
        got = {(a[cv.ATTR_PEER_STAGE_ID], a[cv.ATTR_CHUNK_INDEX]) for a in names[cv.SPAN_GET]}
        assert {s for s, _ in prod} == {0, 1}
        assert put <= prod and got <= put and got, (rid, prod - got)
    agent = read_json(str(run_dir), "agent.json")
    assert agent["events_dropped"] == 0
    assert agent["exporters"]["otlp-grpc"]["exported"] == agent["spans_built"] == len(spans)
    assert len(read_spans(str(run_dir))) == len(spans)
    procs = [json.loads(x) for x in open(run_dir / "processes.jsonl")]
    assert {p["stage"] for p in procs if p["role"] == "stage"} == {0, 1, 2}
