"""The API-server hooks on vLLM-Omni's REAL ``OmniOpenAIServingChat``, per installed version.

``tests/support/vllm_api_driver.py`` serves the real class behind vLLM-Omni's own chat route (uvicorn
on 127.0.0.1), with a stand-in for the engine below it (what is real and what is not: that
file's docstring and docs/vllm-omni.md), and streams a few requests to it over HTTP. It runs
once bare and once under ``omnitrace run`` (exporting to a real OTLP gRPC receiver); we
compare the bytes the client received and read the run's report and spans.

Needs a venv whose serving layer imports (``scripts/install-vllm-omni.sh`` on its PyPI path
writes ``serving layer yes`` in the venv's ``omnitrace-install.txt``); ``OMNITRACE_VLLM_VENVS``
(os.pathsep list) overrides which venvs are tried.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from omnitrace import conventions as cv
from tests.support.agent_util import clean_env
from tests.support.otlp_receiver import Store, start_grpc
from tests.support.vllm_venvs import ROOT, serving_params as _params

DRIVER = ROOT / "tests" / "support" / "vllm_api_driver.py"
N, TEXT, AUDIO = 3, 6, 3
TRACE, PARENT = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def _driver_args(out: Path, model_dir: Path, tag: str) -> list[str]:
    return [str(DRIVER), "--out", str(out), "--model-dir", str(model_dir), "--requests", str(N),
            "--text-tokens", str(TEXT), "--audio-packets", str(AUDIO), "--tag", tag]


def _last_json(stdout: str) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


_runs: dict[str, dict] = {}


def api_runs(venv: Path, root: Path) -> dict:
    """The driver bare, then under `omnitrace run` exporting to a real OTLP receiver."""
    key = str(venv)
    if key in _runs:
        return _runs[key]
    base = root / venv.name
    py = str(venv / "bin" / "python")
    tag = f"ot{venv.name.replace('.', '').replace('-', '')}"
    bare = subprocess.run([py, *_driver_args(base / "bare", base / "model", tag)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=clean_env())
    store = Store()
    server, port = start_grpc(store)
    run_dir = base / "run"
    try:
        traced = subprocess.run(
            [sys.executable, "-m", "omnitrace", "run", "--run-dir", str(run_dir), "--exporter", "otlp-grpc",
             "--otlp-grpc-endpoint", f"127.0.0.1:{port}", "--otlp-timeout", "10", "--",
             py, *_driver_args(base / "traced", base / "model", tag),
             "--traceparent", f"00-{TRACE}-{PARENT}-01"],
            capture_output=True, text=True, timeout=300, cwd=ROOT, env=clean_env())
        store.wait(lambda s: len([x for _, x in s.spans() if x.name == cv.SPAN_REQUEST]) >= N, 30)
    finally:
        server.stop(0)
    _runs[key] = {"bare": bare, "traced": traced, "base": base, "run_dir": run_dir, "store": store,
                  "bare_out": _last_json(bare.stdout), "traced_out": _last_json(traced.stdout)}
    return _runs[key]


@pytest.fixture(scope="module")
def api_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-api")


def _ok(run: dict) -> None:
    for mode in ("bare", "traced"):
        proc = run[mode]
        assert proc.returncode == 0, f"{mode}: {proc.stderr[-3000:]}"
        assert run[f"{mode}_out"] is not None and run[f"{mode}_out"]["status"] == [200] * N, proc.stdout[-2000:]


def _masked(data: bytes) -> bytes:
    # `created` is the wall-clock second the stream started: the one field that may differ
    return re.sub(rb'"created":\d+', b'"created":0', data)


@pytest.mark.vllm
@pytest.mark.parametrize("venv", _params())
def test_real_serving_class_streams_the_same_bytes_with_hooks(venv: Path, api_root: Path) -> None:
    run = api_runs(venv, api_root)
    _ok(run)
    applied = run["traced_out"]["patching"]["applied"]
    chat = "vllm_omni.entrypoints.openai.serving_chat.OmniOpenAIServingChat."
    assert {chat + "create_chat_completion", chat + "chat_completion_stream_generator"} <= set(applied), applied
    assert run["bare_out"]["patching"]["applied"] == []
    warnings = [ln for ln in run["traced"].stderr.splitlines() if ln.startswith("omnitrace: ")]
    assert not warnings, warnings
    for rid in run["traced_out"]["request_ids"]:
        bare = (run["base"] / "bare" / f"{rid}.sse").read_bytes()
        traced = (run["base"] / "traced" / f"{rid}.sse").read_bytes()
        assert _masked(bare) == _masked(traced), rid
        # what the client got is vLLM-Omni's stream: text deltas, audio packets, [DONE]
        msgs = [m for m in traced.decode().split("\n\n") if m]
        assert msgs[-1] == "data: [DONE]"
        chunks = [json.loads(m.removeprefix("data: ")) for m in msgs[:-1]]
        assert all(c["id"] == f"chatcmpl-{rid}" for c in chunks)
        text = [c for c in chunks if c.get("modality") == "text" and c["choices"] and c["choices"][0]["delta"].get("content")]
        audio = [c for c in chunks if c.get("modality") == "audio"]
        assert len(text) == TEXT and len(audio) == AUDIO, (len(text), len(audio))


@pytest.mark.vllm
@pytest.mark.parametrize("venv", _params())
def test_ttft_and_ttfp_of_every_request_in_the_report(venv: Path, api_root: Path) -> None:
    run = api_runs(venv, api_root)
    _ok(run)
    ids = set(run["traced_out"]["request_ids"])  # recorded as the client named them
    assert set(run["traced_out"]["engine_request_ids"]) == {f"chatcmpl-{rid}" for rid in ids}
    rep = subprocess.run([sys.executable, "-m", "omnitrace", "report", str(run["run_dir"]), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    report = json.loads(rep.stdout)
    assert report["window"]["api_requests"] and report["window"]["failed"] == 0
    assert {r["id"] for r in report["requests"]} == ids
    assert all(r["ttfp_ms"] > 0 for r in report["requests"])
    assert report["ttfp"]["server_ms"]["count"] == N
    # TTFT and TTFP: events of each request span, and the run's histograms
    roots = [s for _, s in run["store"].spans() if s.name == cv.SPAN_REQUEST]
    assert len(roots) == N
    for s in roots:
        ev = {e.name: e.time_unix_nano for e in s.events}
        assert s.start_time_unix_nano < ev[cv.EVENT_TTFT] <= ev[cv.EVENT_TTFP] <= s.end_time_unix_nano
    counts: dict[str, int] = {}
    for line in (run["run_dir"] / "metrics.jsonl").read_text().splitlines():
        for name in (cv.METRIC_TTFT, cv.METRIC_TTFP):
            m = re.search(re.escape(f'"{name}"') + r'.*?"count":"(\d+)"', line)
            if m:
                counts[name] = int(m.group(1))
    assert counts == {cv.METRIC_TTFT: N, cv.METRIC_TTFP: N}, counts


@pytest.mark.vllm
@pytest.mark.parametrize("venv", _params())
def test_traceparent_on_the_real_api_joins_the_callers_trace(venv: Path, api_root: Path) -> None:
    run = api_runs(venv, api_root)
    _ok(run)
    first = run["traced_out"]["request_ids"][0]
    seen = {}
    for _, s in run["store"].spans():
        if s.name == cv.SPAN_REQUEST:
            rid = next(kv.value.string_value for kv in s.attributes if kv.key == cv.ATTR_REQUEST_ID)
            seen[rid] = (s.trace_id.hex(), s.parent_span_id.hex())
    assert len(seen) == N
    assert seen.pop(first) == (TRACE, PARENT)  # the caller's trace, under the caller's span
    for rid, (trace, parent) in seen.items():  # no traceparent: today's derived id, a root
        assert (trace, parent) == (f"{cv.trace_id_for(rid):032x}", ""), rid
