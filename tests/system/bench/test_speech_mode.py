"""The speech mode end to end on the reference pipeline (real processes, real HTTP):
`omnitrace loadtest --backend openai-audio-speech`, `omnitrace bench` reading the SSE
variant, vLLM-Omni's own ``openai-audio-speech`` request function driving the
instrumented server, and bad backends/endpoints refused before anything starts."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.report_util import _env
from tests.support.runtime_server import Server, fast_pipeline, free_port
from tests.support.vllm_venvs import ROOT, serving_params

CLIENT = ROOT / "tests" / "support" / "vllm_omni_client.py"


def _omnitrace(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnitrace", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env())


def _report(run_dir: Path) -> dict:
    rep = _omnitrace("report", str(run_dir), "--json", timeout=120)
    assert rep.returncode == 0, rep.stderr
    return json.loads(rep.stdout)


def _attributed_and_after_the_server(report: dict, client_ttfp_ms: dict[str, float]) -> None:
    """Every request attributed, its categories summing to its TTFP, and the client's first
    audio no earlier than the server's."""
    rows = {r["id"]: r for r in report["requests"]}
    assert set(rows) == set(client_ttfp_ms)
    assert report["window"]["attributed"] == len(rows) and report["window"]["failed"] == 0
    for rid, r in rows.items():
        assert r["sum_error_ns"] == 0 and r["ttfp_ms"] > 0, r
        assert client_ttfp_ms[rid] >= r["ttfp_ms"], (rid, client_ttfp_ms[rid], r["ttfp_ms"])


@pytest.mark.timeout(300)
def test_loadtest_speech_mode_attributes_every_request(tmp_path):
    d = tmp_path / "lt"
    r = _omnitrace("loadtest", "--run-dir", str(d), "--backend", "openai-audio-speech", "--serve",
                   f"--pipeline {fast_pipeline(tmp_path)}", "--concurrency", "4", "--num-prompts", "16",
                   "--input-len", "200", "--output-len", "12")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == str(d)
    bench = json.loads((d / "bench.json").read_text())
    assert bench["status"] == "complete"
    assert (bench["args"]["backend"], bench["args"]["endpoint"]) == ("openai-audio-speech", "/v1/audio/speech")
    measured = [x for x in bench["requests"] if not x["warmup"]]
    assert len(measured) == 16
    for x in measured:  # raw PCM: 12 tokens -> 24 codec frames of 480 16-bit samples
        assert x["bytes"] == 12 * 2 * 480 * 2 and x["ttft_s"] is None and x["server_id"] == x["id"]
    _attributed_and_after_the_server(_report(d), {x["id"]: x["ttfp_s"] * 1e3 for x in measured})


@pytest.mark.timeout(120)
def test_bench_reads_the_speech_sse_events(tmp_path):
    srv = Server(fast_pipeline(tmp_path))
    try:
        out = tmp_path / "bench.json"
        r = _omnitrace("bench", "--base-url", srv.url, "--endpoint", "/v1/audio/speech", "--out", str(out),
                       "--no-progress", "--concurrency", "2", "--num-prompts", "4", "--output-len", "6",
                       "--extra-body", '{"stream_format": "sse"}', timeout=90)
    finally:
        srv.stop()
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["requests"]
    assert len(rows) == 6
    for x in rows:  # 6 tokens -> 12 frames -> 2 packets (a first one of 4 frames, the rest)
        assert x["error"] is None and x["audio_chunks"] == 2 and x["completion_tokens"] == 6
        assert 0 < x["ttfp_s"] <= x["latency_s"]


@pytest.mark.vllm
@pytest.mark.timeout(420)
@pytest.mark.parametrize("venv", serving_params())
def test_vllm_omni_speech_client_is_joined_by_request_id(venv: Path, tmp_path: Path) -> None:
    """vLLM-Omni's ``async_request_openai_audio_speech`` against `omnitrace run serve`."""
    port, run_dir, tag = free_port(), tmp_path / "run", f"vs{os.getpid()}-"
    server = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(run_dir), "serve",
                               "--port", str(port), "--pipeline", fast_pipeline(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=_env())
    try:
        assert server.stdout is not None
        for line in server.stdout:
            if "listening on" in line:
                break
        else:
            pytest.fail("omnitrace run serve exited before listening")
        client = subprocess.run([str(venv / "bin" / "python"), str(CLIENT), f"http://127.0.0.1:{port}",
                                 "qwen3_omni", "8", "4", tag, "openai-audio-speech"],
                                capture_output=True, text=True, timeout=300, cwd=tmp_path)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()
    assert client.returncode == 0, client.stderr[-3000:]
    rows = [json.loads(ln) for ln in client.stdout.splitlines() if ln.startswith("{")]
    assert len(rows) == 8 and all(x["success"] for x in rows), rows
    # the reference pipeline's default length (64 tokens -> 128 frames of 480 samples at 24 kHz)
    assert all(x["audio_duration_s"] == pytest.approx(128 * 480 / 24000) for x in rows)
    _attributed_and_after_the_server(_report(run_dir), {x["id"]: x["audio_ttfp_s"] * 1e3 for x in rows})


@pytest.mark.parametrize("args,needle", [
    (["--backend", "openai-tts"], "unknown --backend 'openai-tts'; known: openai-chat-omni"),
    (["--endpoint", "/v1/audio/transcriptions"], "unknown --endpoint '/v1/audio/transcriptions'; known: "),
    (["--backend", "openai-audio-speech", "--endpoint", "/v1/chat/completions"], "is not /v1/audio/speech"),
    (["--endpoint", "v1/audio/speech"], "a path starting with /"),
])
def test_unknown_backend_or_endpoint_is_one_line_before_anything(tmp_path, args, needle):
    port = free_port()  # nothing listens: a started load would fail on connecting instead
    for cmd in (["bench", "--base-url", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "b.json")],
                ["loadtest", "--run-dir", str(tmp_path / "lt")]):
        r = _omnitrace(*cmd, *args, timeout=60)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, (cmd, r.stderr)
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "lt").exists()
