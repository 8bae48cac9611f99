"""Drive the REAL vLLM-Omni speech route: ``OmniOpenAIServingSpeech`` behind vLLM-Omni's own
FastAPI router (``POST /v1/audio/speech``), served by uvicorn on 127.0.0.1, with a
stand-in for the engine below it.

Run with a Python whose venv has vLLM-Omni's serving layer, normally under ``omnitrace run``.

Real: vLLM's ``ModelConfig`` (the tiny model directory of ``vllm_api_driver.py``),
``OpenAIServingModels``, ``OmniOpenAIServingSpeech`` built with the arguments vLLM-Omni's
``omni_init_app_state`` passes, vLLM-Omni's route (request validation, ``create_speech``,
``_prepare_speech_generation``, ``_generate_audio_chunks``, the SSE and raw-audio stream
responses, the non-streaming WAV), uvicorn and the HTTP client.

Stand-in: ``StandInSpeechEngine`` replaces ``AsyncOmni``. Its two stages are not a TTS
model vLLM-Omni knows, so the route takes its generic path (prompt = the input text, no
model adapter). ``generate()`` yields what the orchestrator yields from the last stage of
an async-chunk TTS pipeline: one audio output per step (``--step-ms`` apart, a
deterministic waveform), or with ``FINAL_ONLY`` sampling params (a non-streaming request)
one output holding the whole waveform. An input containing ``fail`` raises after its
first packet. It keeps the request ids it was given and which generators were closed
before their end (a client gone: the route must close the engine's generator).

The client sends every request of ``--plan`` at once (JSON list of {"mode", "id", "input",
"traceparent", "disconnect"}; mode pcm | wav | sse | full, "id" "" = no x-request-id,
disconnect = leave after the first body chunk) and writes each response's bytes to
``--out/<n>.bin``. Prints one JSON line: per request status, bytes, client TTFP (first
body chunk; for sse the first ``speech.audio.delta`` event), and the engine's records.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from typing import Any, AsyncIterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.support.vllm_api_driver import StandInOmni, _free_port, _omni_output, write_model_dir  # noqa: E402

MODEL = "tiny-tts"
SAMPLES_PER_PACKET = 960


class StandInSpeechEngine(StandInOmni):
    """What ``OmniOpenAIServingSpeech`` reads from its engine client (``AsyncOmni``)."""

    def __init__(self, model_dir: str, audio_packets: int, step_ms: float) -> None:
        super().__init__(model_dir, 0, audio_packets, step_ms)
        from omegaconf import OmegaConf
        from vllm.sampling_params import SamplingParams

        # two stages whose model_stage no speech adapter claims: the route's generic path
        self.stage_configs = OmegaConf.create([
            {"stage_id": 0, "stage_type": "llm", "final_output": False, "engine_args": {"model_stage": "generator"}},
            {"stage_id": 1, "stage_type": "llm", "final_output": True, "final_output_type": "audio",
             "engine_args": {"model_stage": "vocoder"}}])
        self.default_sampling_params_list = [SamplingParams(max_tokens=64) for _ in range(2)]
        self.output_modalities = ["audio"]
        self.closed_early: list[str] = []

    async def generate(self, prompt: Any, request_id: str, sampling_params_list: Any = None,
                       **_: Any) -> AsyncIterator[Any]:
        from vllm.sampling_params import RequestOutputKind

        self.requests.append(request_id)
        text = prompt.get("prompt", "") if isinstance(prompt, dict) else str(prompt)
        final_only = bool(sampling_params_list) and sampling_params_list[0].output_kind == RequestOutputKind.FINAL_ONLY
        done = False
        try:
            if final_only:
                await asyncio.sleep(self.step_s * self.audio_packets)
                yield _audio_output(request_id, 0, self.audio_packets, True)
            else:
                for k in range(self.audio_packets):
                    await asyncio.sleep(self.step_s)
                    if k == 1 and "fail" in text:
                        raise RuntimeError("stand-in engine: stage failed mid-request")
                    yield _audio_output(request_id, k, k + 1, k == self.audio_packets - 1)
            done = True
        finally:
            if not done:
                self.closed_early.append(request_id)


def _audio_output(request_id: str, first: int, end: int, last: bool) -> Any:
    """The last stage's output holding packets ``first`` .. ``end - 1`` of the waveform."""
    import torch
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm_omni.outputs import OmniRequestOutput

    t = torch.arange(SAMPLES_PER_PACKET * first, SAMPLES_PER_PACKET * end, dtype=torch.float32)
    out = CompletionOutput(index=0, text="", token_ids=[], cumulative_logprob=None, logprobs=None,
                           finish_reason="stop" if last else None)
    out.multimodal_output = {"audio": 0.2 * torch.sin(2 * math.pi * 220 * t / 24000), "sr": 24000}
    ro = RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=[1, 2, 3],
                       prompt_logprobs=None, outputs=[out], finished=last)
    return _omni_output(OmniRequestOutput, ro, 1, "audio")


def build_app(engine: StandInSpeechEngine) -> Any:
    """vLLM-Omni's routes on a FastAPI app whose state holds the real speech serving class,
    built with the arguments ``omni_init_app_state`` passes."""
    from fastapi import FastAPI
    from vllm.entrypoints.openai.models.serving import BaseModelPath, OpenAIServingModels
    from vllm_omni.entrypoints.openai.api_server import router
    from vllm_omni.entrypoints.openai.serving_speech import OmniOpenAIServingSpeech

    app = FastAPI()
    app.include_router(router)
    state = app.state
    state.engine_client = engine
    state.enable_server_load_tracking = False
    state.server_load_metrics = 0
    state.openai_serving_models = OpenAIServingModels(
        engine_client=engine, base_model_paths=[BaseModelPath(name=MODEL, model_path=engine.model)])
    state.openai_serving_speech = OmniOpenAIServingSpeech(
        engine, state.openai_serving_models, request_logger=None, model_name=MODEL,
        forced_aligner_enabled=False)
    return app


def _body(mode: str, text: str) -> dict:
    body: dict[str, Any] = {"model": MODEL, "input": text}
    if mode in ("pcm", "wav"):
        body.update(stream=True, stream_format="audio", response_format=mode)
    elif mode == "sse":
        body.update(stream=True, response_format="pcm")
    return body


async def _post(session: Any, url: str, item: dict) -> dict:
    headers = {"x-request-id": item["id"]} if item["id"] else {}
    if item.get("traceparent"):
        headers["traceparent"] = item["traceparent"]
    data = bytearray()
    ttfp = None
    st = time.perf_counter()
    try:
        async with session.post(url, json=_body(item["mode"], item["input"]), headers=headers) as resp:
            async for chunk in resp.content.iter_any():
                data += chunk
                if ttfp is None and resp.status == 200 and (
                        item["mode"] != "sse" or b"event: speech.audio.delta" in data):
                    ttfp = time.perf_counter() - st
                if item.get("disconnect"):
                    break  # leave mid-stream: the connection is closed under the server
            return {"status": resp.status, "ttfp_s": ttfp, "data": bytes(data), "error": None}
    except Exception as exc:  # a stream cut short by the server
        return {"status": None, "ttfp_s": ttfp, "data": bytes(data), "error": repr(exc)}


async def serve_and_drive(args: argparse.Namespace) -> dict:
    import aiohttp
    import uvicorn

    engine = StandInSpeechEngine(write_model_dir(args.model_dir), args.audio_packets, args.step_ms)
    app = build_app(engine)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 60
    while not server.started:
        if task.done() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        await asyncio.sleep(0.05)
    plan = json.loads(args.plan)
    try:
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(*(
                _post(session, f"http://127.0.0.1:{port}/v1/audio/speech", item) for item in plan))
        await asyncio.sleep(0.5)  # a disconnected stream's close reaches the route
    finally:
        server.should_exit = True
        await task
    os.makedirs(args.out, exist_ok=True)
    for n, res in enumerate(results):
        with open(os.path.join(args.out, f"{n}.bin"), "wb") as f:
            f.write(res.pop("data"))
    return {"results": results, "engine_request_ids": engine.requests, "closed_early": engine.closed_early}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="directory for the bytes each request received")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--plan", required=True, help="JSON list of requests (see the module docstring)")
    ap.add_argument("--audio-packets", type=int, default=4)
    ap.add_argument("--step-ms", type=float, default=20.0)
    args = ap.parse_args(argv)
    os.environ.setdefault("SPEAKER_SAMPLES_DIR", os.path.join(args.out, "speakers"))
    out = asyncio.run(serve_and_drive(args))
    try:
        from omnitrace.inject import patching

        out["patching"] = patching.status()
    except Exception as exc:
        out["patching"] = {"error": repr(exc)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
