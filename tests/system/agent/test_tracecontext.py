"""A request that carries a W3C `traceparent` joins the caller's trace: every span of it
has the caller's trace id and `omni.request` is the child of the caller's span; live
(the real OTLP exporter into the tests' receiver) and in `omnitrace export` alike. A
request without one keeps its derived trace id."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request


from omnitrace import conventions as cv
from tests.support.agent_util import clean_env
from tests.support.otlp_receiver import Store, free_port, start_grpc
from tests.support.traceparent import PARENT, TRACE


def _post(port: int, rid: str, headers: dict) -> None:
    body = json.dumps({"model": "ref", "stream": True, "max_tokens": 6, "omnitrace_prompt_tokens": 64,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "x-request-id": rid,
                                          **headers})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200 and b"[DONE]" in r.read()


def test_traceparent_joins_the_callers_trace(tmp_path):
    store = Store()
    server, gport = start_grpc(store)
    port = free_port()
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(run_dir),
                             "--exporter", "otlp-grpc", "--otlp-endpoint", f"127.0.0.1:{gport}",
                             "serve", "--port", str(port)],
                            env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
                time.sleep(0.3)
        _post(port, "tc-joined", {"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "k=v"})
        _post(port, "tc-own", {})
        _post(port, "tc-invalid", {"traceparent": "00-zz-00f067aa0ba902b7-01"})  # ignored, per spec
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop(0)

    by_rid: dict[str, list] = {}
    for _, s in store.spans():
        rid = next(kv.value.string_value for kv in s.attributes if kv.key == cv.ATTR_REQUEST_ID)
        by_rid.setdefault(rid, []).append(s)
    joined = by_rid["tc-joined"]
    assert len(joined) > 5 and {s.trace_id.hex() for s in joined} == {TRACE}
    root = next(s for s in joined if s.name == cv.SPAN_REQUEST)
    assert root.parent_span_id.hex() == PARENT
    # the rest of the tree hangs under omni.request as before
    assert all(s.parent_span_id for s in joined)
    stage_spans = [s for s in joined if s.name == cv.SPAN_STAGE]
    assert {s.parent_span_id for s in stage_spans} == {root.span_id}
    stage_attrs = {kv.key for kv in stage_spans[0].attributes}
    assert {cv.ATTR_VLLM_OMNI_STAGE_ID, cv.ATTR_VLLM_OMNI_STAGE_NAME, cv.ATTR_VLLM_OMNI_REPLICA_ID} <= stage_attrs
    for rid in ("tc-own", "tc-invalid"):
        spans = by_rid[rid]
        assert {s.trace_id.hex() for s in spans} == {f"{cv.trace_id_for(rid):032x}"}
        assert not next(s for s in spans if s.name == cv.SPAN_REQUEST).parent_span_id

    # the record rebuilds the same: `omnitrace export` gives the same trace and parent
    out = tmp_path / "spans.jsonl"
    r = subprocess.run([sys.executable, "-m", "omnitrace", "export", str(run_dir), "--otlp-json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    exported = {}
    for line in out.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    rid = next(a["value"]["stringValue"] for a in s["attributes"]
                               if a["key"] == cv.ATTR_REQUEST_ID)
                    exported.setdefault(rid, []).append(s)
    assert {s["traceId"] for s in exported["tc-joined"]} == {TRACE}
    assert next(s for s in exported["tc-joined"] if s["name"] == cv.SPAN_REQUEST)["parentSpanId"] == PARENT
    assert len(exported["tc-joined"]) == len(joined)
