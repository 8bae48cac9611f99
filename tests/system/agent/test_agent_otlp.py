"""OTLP export from real processes to real receivers on the official stubs (gRPC + HTTP)."""
from __future__ import annotations

import json
from collections import defaultdict

from omnitrace import conventions as cv
from tests.support.agent_util import WRITER, clean_env, omnitrace_run, read_json, read_spans
from tests.support.otlp_receiver import HttpReceiver, Store, start_grpc

N_REQ, N_CHUNK = 4, 3


def _val(v):
    return getattr(v, v.WhichOneof("value"))


def test_one_trace_per_request_over_grpc_and_http(tmp_path):
    grpc_store, http_store = Store(), Store()
    server, gport = start_grpc(grpc_store)
    http = HttpReceiver(http_store)
    run_dir = tmp_path / "run"
    out = tmp_path / "w.json"
    try:
        res = omnitrace_run(["--run-dir", str(run_dir), "--exporter", "otlp-grpc,otlp-http",
                             "--otlp-grpc-endpoint", f"127.0.0.1:{gport}",
                             "--otlp-http-endpoint", f"http://127.0.0.1:{http.port}",
                             "--otlp-timeout", "5", "--",
                             "python", WRITER, str(out), "--requests", str(N_REQ),
                             "--chunks", str(N_CHUNK)], env=clean_env())
        assert res.returncode == 0, res.stderr
        expected = N_REQ * (1 + 2 * 2 + N_CHUNK * 7)  # request, 2x(stage, queue), 7 per chunk
        assert grpc_store.wait(lambda s: len(s.spans()) >= expected, 10)
        assert http_store.wait(lambda s: len(s.spans()) >= expected, 10)
        # the live metrics go to the same collectors (OTLP metrics, final push at exit)
        for store in (grpc_store, http_store):
            assert store.wait(lambda s: cv.METRIC_FIFO_RESIDENCE in s.metric_names(), 10)
            assert cv.METRIC_SNAPSHOT in store.metric_names()
    finally:
        server.stop(0)
        http.stop()

    stamps = json.load(open(f"{out}.stage0"))
    for store in (grpc_store, http_store):
        spans = store.spans()
        assert len(spans) == expected
        by_trace = defaultdict(list)
        for res_attrs, s in spans:
            by_trace[s.trace_id.hex()].append((res_attrs, s))
        assert len(by_trace) == N_REQ  # one trace per request
        for trace_hex, items in by_trace.items():
            attrs = [{kv.key: _val(kv.value) for kv in s.attributes} for _, s in items]
            req = {a[cv.ATTR_REQUEST_ID] for a in attrs}
            assert len(req) == 1
            req = req.pop()
            assert trace_hex == f"{cv.trace_id_for(req):032x}"
            by_id = {s.span_id: s for _, s in items}
            names = defaultdict(list)
            for (res_attrs, s), a in zip(items, attrs):
                names[s.name].append((s, a, res_attrs))
                assert s.end_time_unix_nano >= s.start_time_unix_nano
                assert cv.ATTR_INCOMPLETE not in a, (s.name, a)
                if s.name == cv.SPAN_REQUEST:
                    assert not s.parent_span_id
                else:  # correctly parented, inside the same trace
                    assert s.parent_span_id in by_id, s.name
            root = names[cv.SPAN_REQUEST][0][0]
            stages = {a[cv.ATTR_STAGE_ID]: s for s, a, _ in names[cv.SPAN_STAGE]}
            assert set(stages) == {0, 1}
            assert all(s.parent_span_id == root.span_id for s in stages.values())
            # TTFT, TTFP, and the API marks the writer stamped (omni.api.*)
            assert {e.name for e in root.events} - set(cv.API_MARKS.values()) == {cv.EVENT_TTFT, cv.EVENT_TTFP}
            for name, stage in [(cv.SPAN_SNAPSHOT, 0), (cv.SPAN_FIFO, 0), (cv.SPAN_PROCESS, 0),
                                (cv.SPAN_PUT, 0), (cv.SPAN_GET, 1), (cv.SPAN_POLL, 1),
                                (cv.SPAN_WAIT_SCHEDULE, 1)]:
                got = names[name]
                assert sorted(a[cv.ATTR_CHUNK_INDEX] for _, a, _ in got) == list(range(N_CHUNK)), name
                for s, a, res_attrs in got:  # every chunk span under its own stage's span
                    assert s.parent_span_id == stages[stage].span_id, name
                    assert a[cv.ATTR_STAGE_ID] == stage
                    assert _val(res_attrs[cv.ATTR_STAGE_ID]) == stage
            for s, a, _ in names[cv.SPAN_FIFO]:
                key = f"{req}/{a[cv.ATTR_CHUNK_INDEX]}"
                # residence = dequeue - enqueue stamps, to the nanosecond
                assert s.end_time_unix_nano - s.start_time_unix_nano == \
                    stamps["deq"][key] - stamps["enq"][key]
                assert a[cv.ATTR_FIFO_DEPTH] == a[cv.ATTR_FIFO_AHEAD] + 1
                assert a[cv.ATTR_FIFO_BLOCKED_NS] <= s.end_time_unix_nano - s.start_time_unix_nano
    # a FIFO shared by 4 requests: later tasks waited behind other requests' tasks
    fifo = [s for s in read_spans(str(run_dir)) if s["name"] == cv.SPAN_FIFO]
    assert any(s["attrs"][cv.ATTR_FIFO_BLOCKED_NS] > 0 and s["attrs"][cv.ATTR_FIFO_BLOCKED_BY]
               for s in fifo)
    agent = read_json(str(run_dir), "agent.json")
    for kind in ("otlp-grpc", "otlp-http"):
        assert agent["exporters"][kind]["exported"] == expected, agent["exporters"]
        assert agent["exporters"][kind]["failed"] == agent["exporters"][kind]["dropped"] == 0
    assert agent["events_dropped"] == 0
    # `omnitrace export` rebuilds exactly the spans the live exporter sent
    exported = read_spans(str(run_dir))
    assert len(exported) == expected

    def canon_live(s) -> tuple:
        return (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                s.start_time_unix_nano, s.end_time_unix_nano,
                tuple(sorted((kv.key, str(_val(kv.value) if kv.value.WhichOneof("value") != "array_value"
                                         else [_val(x) for x in kv.value.array_value.values]))
                             for kv in s.attributes)))

    def canon_file(d: dict) -> tuple:
        return (d["traceId"], d["spanId"], d.get("parentSpanId", ""), d["name"],
                int(d["startTimeUnixNano"]), int(d["endTimeUnixNano"]),
                tuple(sorted((k, str(v)) for k, v in d["attrs"].items())))

    assert sorted(canon_live(s) for _, s in grpc_store.spans()) == sorted(canon_file(d) for d in exported)


def test_standard_otel_env_configures_the_http_exporter(tmp_path):
    store = Store()
    http = HttpReceiver(store)
    try:
        env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{http.port}",
                        OTEL_EXPORTER_OTLP_TIMEOUT="5")
        res = omnitrace_run(["--run-dir", str(tmp_path / "run"), "--exporter", "otlp-http", "--",
                             "python", WRITER, str(tmp_path / "w.json"), "--requests", "2",
                             "--chunks", "1"], env=env)
        assert res.returncode == 0, res.stderr
        assert store.wait(lambda s: len(s.spans()) >= 2 * (1 + 4 + 7), 10)
    finally:
        http.stop()
    assert len(store.spans()) == 2 * (1 + 4 + 7)
