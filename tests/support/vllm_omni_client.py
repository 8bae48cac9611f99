"""vLLM-Omni's own benchmark request function (``openai-chat-omni``, the one
``vllm bench serve --omni`` runs per request) sending N streaming text+audio requests;
prints one JSON row per request with the id it sent and the AUDIO_TTFP it measured.
Runs in a vLLM-Omni venv:  python vllm_omni_client.py URL MODEL N CONCURRENCY PREFIX"""
from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput
from vllm_omni.benchmarks.patch.patch import async_request_openai_chat_omni_completions


async def main(url: str, model: str, n: int, concurrency: int, prefix: str) -> None:
    sem = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def one(i: int) -> dict:
            async with sem:
                inp = RequestFuncInput(prompt="tell me a short story " * 12, api_url=f"{url}/v1/chat/completions",
                                       prompt_len=60, output_len=16, model=model, ignore_eos=True,
                                       request_id=f"{prefix}{i}",
                                       extra_body={"modalities": ["text", "audio"]})
                out = await async_request_openai_chat_omni_completions(inp, session)
                return {"id": inp.request_id, "success": out.success, "audio_ttfp_s": out.audio_ttfp,
                        "ttft_s": out.ttft, "error": out.error}

        rows = await asyncio.gather(*(one(i) for i in range(n)))
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    u, m, n, c, p = sys.argv[1:6]
    asyncio.run(main(u, m, int(n), int(c), p))
