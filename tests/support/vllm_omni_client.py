"""vLLM-Omni's own benchmark request functions (the ones ``vllm bench serve --omni`` runs per
request) sending N streaming requests; prints one JSON row per request with the id it sent
and the AUDIO_TTFP it measured. BACKEND: ``openai-chat-omni`` (default: text+audio on
/v1/chat/completions) or ``openai-audio-speech`` (raw PCM on /v1/audio/speech).
Runs in a vLLM-Omni venv:  python vllm_omni_client.py URL MODEL N CONCURRENCY PREFIX [BACKEND]"""
from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput
from vllm_omni.benchmarks.patch.patch import (async_request_openai_audio_speech,
                                              async_request_openai_chat_omni_completions)

BACKENDS = {  # backend -> (request function, route, extra body)
    "openai-chat-omni": (async_request_openai_chat_omni_completions, "/v1/chat/completions",
                         {"modalities": ["text", "audio"]}),
    "openai-audio-speech": (async_request_openai_audio_speech, "/v1/audio/speech", {}),
}


async def main(url: str, model: str, n: int, concurrency: int, prefix: str, backend: str) -> None:
    request, route, extra = BACKENDS[backend]
    sem = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def one(i: int) -> dict:
            async with sem:
                inp = RequestFuncInput(prompt="tell me a short story " * 12, api_url=f"{url}{route}",
                                       prompt_len=60, output_len=16, model=model, ignore_eos=True,
                                       request_id=f"{prefix}{i}", extra_body=dict(extra))
                out = await request(inp, session)
                return {"id": inp.request_id, "success": out.success, "audio_ttfp_s": out.audio_ttfp,
                        "ttft_s": out.ttft, "audio_duration_s": getattr(out, "audio_duration", None),
                        "error": out.error}

        rows = await asyncio.gather(*(one(i) for i in range(n)))
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    u, m, n, c, p = sys.argv[1:6]
    asyncio.run(main(u, m, int(n), int(c), p, sys.argv[6] if len(sys.argv) > 6 else "openai-chat-omni"))
