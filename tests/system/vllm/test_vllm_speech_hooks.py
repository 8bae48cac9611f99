"""The speech-route hooks (``patches/vllm_omni/speech.py``) on vLLM-Omni's REAL
``OmniOpenAIServingSpeech``, per installed version.

``tests/support/vllm_speech_driver.py`` serves the real class behind vLLM-Omni's own
``/v1/audio/speech`` route (uvicorn on 127.0.0.1), with a stand-in for the engine below it
(that file's docstring says what is real), and sends one request per response kind at
once: raw PCM and WAV streams, an SSE stream, a non-streaming WAV, one request without
``x-request-id``, an engine failure on the SSE and on the raw stream, and a client that
leaves after the first chunk. It runs once bare and once under ``omnitrace run``
(exporting to a real OTLP gRPC receiver). The independent counts are the bytes each
client received, the client's own first-chunk times and the stand-in engine's records
(the request ids it was given, the generators it saw closed before their end).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from omnitrace import conventions as cv
from tests.support.agent_util import clean_env
from tests.support.otlp_receiver import Store, start_grpc
from tests.support.vllm_venvs import ROOT, serving_params

DRIVER = ROOT / "tests" / "support" / "vllm_speech_driver.py"
PACKETS, SAMPLES = 4, 960  # the stand-in's audio: 4 packets of 960 16-bit samples
PCM_BYTES = PACKETS * SAMPLES * 2
TRACE, PARENT = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
PLAN = [  # (mode, x-request-id, input, disconnect)
    ("pcm", "sp-pcm", "hello one", False), ("wav", "sp-wav", "hello two", False),
    ("sse", "sp-sse", "hello three", False), ("full", "sp-full", "hello four", False),
    ("pcm", "", "no id given", False), ("sse", "sp-sse-fail", "please fail", False),
    ("pcm", "sp-pcm-fail", "fail raw", False), ("pcm", "sp-gone", "leave early", True)]
OK_IDS = {"sp-pcm", "sp-wav", "sp-sse", "sp-full"}


def _plan() -> str:
    items = [{"mode": m, "id": rid, "input": text, "disconnect": gone} for m, rid, text, gone in PLAN]
    items[0]["traceparent"] = f"00-{TRACE}-{PARENT}-01"
    return json.dumps(items)


def _last_json(stdout: str) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


_runs: dict[str, dict] = {}


def speech_runs(venv: Path, root: Path) -> dict:
    """The driver bare, then under `omnitrace run` exporting to a real OTLP receiver."""
    if str(venv) in _runs:
        return _runs[str(venv)]
    base = root / venv.name
    py = str(venv / "bin" / "python")

    def args(mode: str) -> list[str]:
        return [py, str(DRIVER), "--out", str(base / mode), "--model-dir", str(base / "model"),
                "--plan", _plan(), "--audio-packets", str(PACKETS)]

    bare = subprocess.run(args("bare"), capture_output=True, text=True, timeout=300, cwd=ROOT, env=clean_env())
    store = Store()
    server, port = start_grpc(store)
    run_dir = base / "run"
    try:
        traced = subprocess.run(
            [sys.executable, "-m", "omnitrace", "run", "--run-dir", str(run_dir), "--exporter", "otlp-grpc",
             "--otlp-grpc-endpoint", f"127.0.0.1:{port}", "--otlp-timeout", "10", "--", *args("traced")],
            capture_output=True, text=True, timeout=300, cwd=ROOT, env=clean_env())
        store.wait(lambda s: len([x for _, x in s.spans() if x.name == cv.SPAN_REQUEST]) >= len(PLAN), 30)
    finally:
        server.stop(0)
    rep = subprocess.run([sys.executable, "-m", "omnitrace", "report", str(run_dir), "--json"],
                         capture_output=True, text=True, timeout=120)
    _runs[str(venv)] = {"bare": bare, "traced": traced, "base": base, "store": store, "report": rep,
                        "bare_out": _last_json(bare.stdout), "traced_out": _last_json(traced.stdout)}
    return _runs[str(venv)]


@pytest.fixture(scope="module")
def speech_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-speech")


def _ok(run: dict) -> None:
    for mode in ("bare", "traced"):
        proc = run[mode]
        assert proc.returncode == 0 and run[f"{mode}_out"] is not None, f"{mode}: {proc.stderr[-3000:]}"


def _received(run: dict, mode: str, n: int) -> bytes:
    return (run["base"] / mode / f"{n}.bin").read_bytes()


@pytest.mark.vllm
@pytest.mark.timeout(900)  # whichever test runs first pays for two driver runs (~1-3 min each)
@pytest.mark.parametrize("venv", serving_params())
def test_the_route_answers_the_same_bytes_with_hooks(venv: Path, speech_root: Path) -> None:
    run = speech_runs(venv, speech_root)
    _ok(run)
    applied = set(run["traced_out"]["patching"]["applied"])
    mod = "vllm_omni.entrypoints.openai.serving_speech."
    assert {mod + "OmniOpenAIServingSpeech.create_speech", mod + "random_uuid",
            mod + "OmniOpenAIServingSpeech._prepare_speech_generation"} <= applied, applied
    assert run["bare_out"]["patching"]["applied"] == []
    warnings = [ln for ln in run["traced"].stderr.splitlines() if ln.startswith("omnitrace: ")]
    assert not warnings, warnings
    for n in range(len(PLAN)):
        assert _received(run, "bare", n) == _received(run, "traced", n), PLAN[n]
    # what the clients got is the route's own framing of the stand-in's 4 packets
    assert len(_received(run, "traced", 0)) == PCM_BYTES
    wav_stream = _received(run, "traced", 1)
    assert wav_stream[:4] == b"RIFF" and wav_stream[4:8] == b"\xff\xff\xff\xff" and len(wav_stream) == 44 + PCM_BYTES
    sse = _received(run, "traced", 2).decode()
    assert sse.count("event: speech.audio.delta") == PACKETS and sse.count("event: speech.audio.done") == 1
    with wave.open(str(run["base"] / "traced" / "3.bin")) as w:
        assert w.getnframes() == PACKETS * SAMPLES
    assert "event: speech.audio.error" in _received(run, "traced", 5).decode()
    results = run["traced_out"]["results"]
    assert results[6]["error"] and "payload" in results[6]["error"].lower()  # the raw stream was cut


@pytest.mark.vllm
@pytest.mark.timeout(900)  # whichever test runs first pays for two driver runs (~1-3 min each)
@pytest.mark.parametrize("venv", serving_params())
def test_the_request_is_named_by_the_clients_id_only_under_omnitrace(venv: Path, speech_root: Path) -> None:
    run = speech_runs(venv, speech_root)
    _ok(run)
    given = {rid for _, rid, _, _ in PLAN if rid}
    engine = run["traced_out"]["engine_request_ids"]
    named = {e.removeprefix("speech-") for e in engine}
    uuids = named - given
    assert given <= named and len(uuids) == 1 and re.fullmatch(r"[0-9a-f]{16,32}", uuids.pop()), engine
    bare = {e.removeprefix("speech-") for e in run["bare_out"]["engine_request_ids"]}
    assert not bare & given  # uninstrumented, the route ignores x-request-id
    # the client that left: its engine generator was closed, as without the hooks
    assert "speech-sp-gone" in run["traced_out"]["closed_early"]
    assert len(run["traced_out"]["closed_early"]) == len(run["bare_out"]["closed_early"]) == 3


@pytest.mark.vllm
@pytest.mark.timeout(900)  # whichever test runs first pays for two driver runs (~1-3 min each)
@pytest.mark.parametrize("venv", serving_params())
def test_every_request_in_the_report_with_its_status_and_ttfp(venv: Path, speech_root: Path) -> None:
    run = speech_runs(venv, speech_root)
    _ok(run)
    assert run["report"].returncode == 0, run["report"].stderr
    report = json.loads(run["report"].stdout)
    engine = {e.removeprefix("speech-") for e in run["traced_out"]["engine_request_ids"]}
    assert {r["id"] for r in report["requests"]} == engine
    causes = {c["cause"]: c["count"] for c in report["failures"]["causes"]}
    assert causes == {"server error": 2, "client cancelled": 1}, causes
    client = {rid: res["ttfp_s"] for (_, rid, _, _), res in zip(PLAN, run["traced_out"]["results"]) if rid}
    for r in report["requests"]:
        assert r["ttfp_ms"] > 0
        if r["id"] in client:  # the client's first chunk cannot come before the server sent it
            assert client[r["id"]] * 1e3 >= r["ttfp_ms"], r["id"]


@pytest.mark.vllm
@pytest.mark.timeout(900)  # whichever test runs first pays for two driver runs (~1-3 min each)
@pytest.mark.parametrize("venv", serving_params())
def test_traceparent_and_ttfp_on_the_speech_spans(venv: Path, speech_root: Path) -> None:
    run = speech_runs(venv, speech_root)
    _ok(run)
    roots = {}
    for _, s in run["store"].spans():
        if s.name == cv.SPAN_REQUEST:
            rid = next(kv.value.string_value for kv in s.attributes if kv.key == cv.ATTR_REQUEST_ID)
            roots[rid] = s
    assert len(roots) == len(PLAN)
    first = roots["sp-pcm"]
    assert (first.trace_id.hex(), first.parent_span_id.hex()) == (TRACE, PARENT)
    for rid in OK_IDS:
        s = roots[rid]
        ev = {e.name: e.time_unix_nano for e in s.events}
        assert cv.EVENT_TTFT not in ev  # speech has no text
        assert s.start_time_unix_nano < ev[cv.EVENT_TTFP] <= s.end_time_unix_nano, rid


@pytest.mark.vllm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("venv", serving_params())
def test_reference_pipelines_streaming_wav_header_is_vllm_omnis(venv: Path) -> None:
    """The reference server's raw WAV stream starts with the header vLLM-Omni's own
    ``_create_wav_header`` writes (PCM16, sizes unknown)."""
    from omnitrace.runtime.routes import streaming_wav_header

    code = ("from vllm_omni.entrypoints.openai.serving_speech import _create_wav_header as h; "
            "print(h(24000).hex(), h(8000).hex())")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         timeout=240, env=clean_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1].split() == [streaming_wav_header(24000).hex(), streaming_wav_header(8000).hex()]
