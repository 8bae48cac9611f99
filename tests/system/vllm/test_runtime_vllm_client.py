"""vLLM-Omni's own benchmark client (`openai-chat-omni`) parses the reference server's stream.

Runs the real ``async_request_openai_chat_omni_completions`` from the vllm-omni wheel in the
venv that .ci/run builds (.venv-vllm, and .venv-vllm-032 where present) against a real
``omnitrace serve``; skipped where that venv is absent.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.runtime_server import TAG, Server, assert_stopped_clean, fast_pipeline
from tests.support.sources import ROOT

VENVS = [os.path.join(ROOT, v, "bin", "python") for v in (".venv-vllm", ".venv-vllm-032")]

DRIVER = r'''
import asyncio, importlib.machinery, json, sys, types
# The client module imports soundfile for a dataset we do not use; the venv may lack it.
if "soundfile" not in sys.modules:
    try:
        import soundfile  # noqa: F401
    except ImportError:
        m = types.ModuleType("soundfile"); m.__spec__ = importlib.machinery.ModuleSpec("soundfile", None)
        sys.modules["soundfile"] = m
import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput
from vllm_omni.benchmarks.patch.patch import async_request_openai_chat_omni_completions as request
url, n, out_len, tag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
async def main():
    async with aiohttp.ClientSession() as s:
        outs = await asyncio.gather(*(request(RequestFuncInput(
            prompt="hello omni world " * 10, api_url=url, prompt_len=30, output_len=out_len,
            model="qwen3_omni", ignore_eos=True, request_id=f"{tag}-vb{i}",
            extra_body={"modalities": ["text", "audio"]}), s) for i in range(n)))
    print(json.dumps([{k: getattr(o, k, None) for k in ("success", "error", "output_tokens", "ttft",
                      "audio_ttfp", "audio_duration", "audio_continuity_ok", "generated_text")} for o in outs]))
asyncio.run(main())
'''


@pytest.mark.vllm
@pytest.mark.timeout(240)
def test_vllm_omni_bench_client_parses_the_stream(tmp_path):
    pythons = [p for p in VENVS if os.path.exists(p)]
    if not pythons:
        pytest.skip("no .venv-vllm here (built by .ci/run)")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    srv = Server(fast_pipeline(tmp_path))
    try:  # every vllm-omni version present drives the same server at once
        procs = [subprocess.Popen([py, str(driver), srv.url + "/v1/chat/completions", "8", "24", f"{TAG}-{i}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
                 for i, py in enumerate(pythons)]
        results = [p.communicate(timeout=200) + (p.returncode,) for p in procs]
    finally:
        srv.stop()
    for py, (out, err, rc) in zip(pythons, results):
        assert rc == 0, f"{py}: {err[-3000:]}"
        outs = json.loads(out.strip().splitlines()[-1])
        assert len(outs) == 8
        for o in outs:
            assert o["success"], o["error"]
            assert o["output_tokens"] == 24 and len(o["generated_text"].split()) == 24
            assert 0 < o["ttft"] < o["audio_ttfp"] + 1
            # talker: 48 frames x 480 samples at 24 kHz, every packet a WAV the client decoded
            assert o["audio_duration"] == pytest.approx(48 * 480 / 24000)
            assert o["audio_continuity_ok"] in (True, None)
    assert_stopped_clean(srv)
