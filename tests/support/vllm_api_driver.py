"""Drive the REAL vLLM-Omni API server path: ``OmniOpenAIServingChat`` behind vLLM-Omni's
own FastAPI router, served by uvicorn on 127.0.0.1, with a stand-in for the engine below it.

Run with a Python whose venv has vLLM-Omni's serving layer (scripts/install-vllm-omni.sh
on the PyPI path), normally under ``omnitrace run``.

Real: vLLM's ``ModelConfig``/``VllmConfig`` (a tiny local model directory written here: a
``config.json`` and a word-level HF tokenizer with a chat template; no weights), vLLM's
renderer and ``OnlineRenderer`` (the chat template is applied and the prompt tokenized),
``OpenAIServingModels``, ``OmniOpenAIServingChat`` built with the arguments vLLM-Omni's
``omni_init_app_state`` passes, vLLM-Omni's ``/v1/chat/completions`` route (request
validation, ``create_chat_completion``, ``StreamingResponse``), uvicorn and the HTTP client.

Stand-in: ``StandInOmni`` replaces ``AsyncOmni`` (which would start the stage processes
and load a model): its ``generate()`` yields the ``OmniRequestOutput`` objects the
orchestrator yields for Qwen3-Omni -- text deltas from stage 0, then one audio packet per
step from the last stage (a deterministic waveform) -- ``step_ms`` apart.

The client sends ``--requests`` streaming requests at once (each with ``x-request-id``, the
first also with ``--traceparent`` if given) and writes the raw bytes of each response to
``--out/<request id>.sse``. Prints one JSON line: request ids, statuses, byte counts.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import sys
import time
from typing import Any, AsyncIterator

WORDS = ["hello", "omni", "world"] + [f"w{i}" for i in range(64)]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {% if m['content'] is string %}"
            "{{ m['content'] }}{% else %}{% for p in m['content'] %}{{ p['text'] }} {% endfor %}"
            "{% endif %} {% endfor %}assistant :")


def write_model_dir(path: str) -> str:
    """A model directory vLLM's ModelConfig accepts offline: config + tokenizer, no weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    os.makedirs(path, exist_ok=True)
    vocab = ["<unk>", "<s>", "</s>", "user", "assistant", ":"] + WORDS
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "chat_template": TEMPLATE}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
                   "num_hidden_layers": 1, "vocab_size": len(vocab), "max_position_embeddings": 4096,
                   "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}, f)
    return path


class StandInOmni:
    """What ``OmniOpenAIServingChat`` reads from its engine client (``AsyncOmni``)."""

    def __init__(self, model_dir: str, text_tokens: int, audio_packets: int, step_ms: float) -> None:
        from vllm.config import ModelConfig, VllmConfig
        from vllm.renderers import renderer_from_config
        from omegaconf import OmegaConf
        from vllm.sampling_params import SamplingParams

        self.model_config = ModelConfig(model=model_dir, tokenizer=model_dir, max_model_len=4096,
                                        dtype="float32")
        self.vllm_config = VllmConfig(model_config=self.model_config)
        self.renderer = renderer_from_config(self.vllm_config)
        self.input_processor = None
        self.io_processor = None
        self.model = model_dir
        self.output_modalities = ["text", "audio"]
        # Qwen3-Omni's stage list, as vLLM-Omni loads its YAML (OmegaConf)
        self.stage_configs = OmegaConf.create([
            {"stage_id": 0, "stage_type": "llm", "is_comprehension": True, "final_output": True,
             "final_output_type": "text", "engine_args": {"model_stage": "thinker"}},
            {"stage_id": 1, "stage_type": "llm", "is_comprehension": False, "final_output": False,
             "engine_args": {"model_stage": "talker"}},
            {"stage_id": 2, "stage_type": "llm", "is_comprehension": False, "final_output": True,
             "final_output_type": "audio", "engine_args": {"model_stage": "code2wav"}}])
        # thinker, talker, code2wav: one SamplingParams per stage, as the stage YAML gives
        self.default_sampling_params_list = [SamplingParams(max_tokens=64) for _ in range(3)]
        self.errored = False
        self.request_states: dict = {}  # the orchestrator's per-request state (none kept here)
        self.is_running = True
        self.dead_error = RuntimeError("engine dead")
        self.text_tokens, self.audio_packets, self.step_s = text_tokens, audio_packets, step_ms / 1000
        self.requests: list[str] = []

    def resolve_entry_stage_id(self, input_modalities: Any) -> int:  # 0.32: every request enters at 0
        return 0

    def get_stage_renderer(self, stage_id: int) -> Any:
        return self.renderer

    async def get_tokenizer(self) -> Any:
        return self.renderer.get_tokenizer()

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    async def is_tracing_enabled(self) -> bool:
        return False

    async def generate(self, prompt: Any, request_id: str, sampling_params_list: Any = None,
                       output_modalities: Any = None, **_: Any) -> AsyncIterator[Any]:
        """Stage 0's text deltas, then the last stage's audio packets, one per step."""
        import torch
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm_omni.outputs import OmniRequestOutput

        self.requests.append(request_id)
        prompt_ids = list(prompt.get("prompt_token_ids") or []) if isinstance(prompt, dict) else []
        n = self.text_tokens
        for i in range(n):
            await asyncio.sleep(self.step_s)
            last = i == n - 1
            out = CompletionOutput(index=0, text=f"{WORDS[3 + i % 64]} ", token_ids=[9 + i % 64],
                                   cumulative_logprob=None, logprobs=None,
                                   finish_reason="length" if last else None)
            ro = RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=prompt_ids,
                               prompt_logprobs=None, outputs=[out], finished=last)
            yield _omni_output(OmniRequestOutput, ro, 0, "text")
        for k in range(self.audio_packets):
            await asyncio.sleep(self.step_s)
            last = k == self.audio_packets - 1
            t = torch.arange(480 * k, 480 * (k + 1), dtype=torch.float32)
            wave = 0.2 * torch.sin(2 * math.pi * 220 * t / 24000)
            out = CompletionOutput(index=0, text="", token_ids=[], cumulative_logprob=None, logprobs=None,
                                   finish_reason="stop" if last else None)
            out.multimodal_output = {"audio": wave, "sr": 24000}
            ro = RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=prompt_ids,
                               prompt_logprobs=None, outputs=[out], finished=last)
            yield _omni_output(OmniRequestOutput, ro, 2, "audio")


def _omni_output(cls: Any, ro: Any, stage: int, kind: str) -> Any:
    """What the orchestrator yields for a stage's output (0.28+: ``from_stage_output``;
    0.26: ``from_pipeline``, the RequestOutput kept inside)."""
    if hasattr(cls, "from_stage_output"):
        return cls.from_stage_output(ro, stage_id=stage, final_output_type=kind)
    return cls.from_pipeline(stage_id=stage, final_output_type=kind, request_output=ro)


def build_app(engine: StandInOmni) -> Any:
    """vLLM-Omni's chat route on a FastAPI app whose state holds the real serving class,
    built with the arguments ``omni_init_app_state`` passes (CLI defaults)."""
    from fastapi import FastAPI
    from vllm.entrypoints.openai.models.serving import BaseModelPath, OpenAIServingModels
    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm_omni.entrypoints.openai.api_server import router
    from vllm_omni.entrypoints.openai.serving_chat import OmniOpenAIServingChat

    app = FastAPI()
    app.include_router(router)
    state = app.state
    state.engine_client = engine
    state.enable_server_load_tracking = False
    state.server_load_metrics = 0
    state.openai_serving_models = OpenAIServingModels(
        engine_client=engine, base_model_paths=[BaseModelPath(name="qwen3_omni", model_path=engine.model)])
    state.online_renderer = OnlineRenderer(
        model_config=engine.model_config, renderer=engine.renderer, request_logger=None,
        chat_template=None, chat_template_content_format="auto", trust_request_chat_template=False,
        enable_auto_tools=False, exclude_tools_when_tool_choice_none=False, tool_parser=None,
        reasoning_parser="", default_chat_template_kwargs=None)
    state.openai_serving_chat = OmniOpenAIServingChat(
        engine_client=engine, models=state.openai_serving_models, response_role="assistant",
        online_renderer=state.online_renderer, request_logger=None, chat_template=None,
        chat_template_content_format="auto", default_chat_template_kwargs=None,
        trust_request_chat_template=False, return_tokens_as_token_ids=False, enable_auto_tools=False,
        exclude_tools_when_tool_choice_none=False, tool_parser=None, reasoning_parser="",
        enable_prompt_tokens_details=False, enable_force_include_usage=False,
        enable_log_outputs=False, enable_log_deltas=True)
    return app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _post(session: Any, url: str, rid: str, max_tokens: int, headers: dict[str, str]) -> tuple[int, bytes]:
    body = {"model": "qwen3_omni", "messages": [{"role": "user", "content": [{"type": "text", "text": "hello omni world"}]}],
            "temperature": 0.0, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "modalities": ["text", "audio"]}
    async with session.post(url, json=body, headers={"x-request-id": rid, **headers}) as resp:
        return resp.status, await resp.read()


async def serve_and_drive(args: argparse.Namespace) -> dict:
    import aiohttp
    import uvicorn

    engine = StandInOmni(write_model_dir(args.model_dir), args.text_tokens, args.audio_packets, args.step_ms)
    app = build_app(engine)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 60
    while not server.started:
        if task.done() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        await asyncio.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    rids = [f"{args.tag}-{i}" for i in range(args.requests)]
    try:
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(*(
                _post(session, url, rid, args.text_tokens,
                      {"traceparent": args.traceparent} if args.traceparent and i == 0 else {})
                for i, rid in enumerate(rids)))
    finally:
        server.should_exit = True
        await task
    os.makedirs(args.out, exist_ok=True)
    for rid, (_status, data) in zip(rids, results):
        with open(os.path.join(args.out, f"{rid}.sse"), "wb") as f:
            f.write(data)
    return {"request_ids": rids, "engine_request_ids": engine.requests,
            "status": [s for s, _ in results], "bytes": [len(d) for _, d in results]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="directory for the raw SSE bytes per request")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--text-tokens", type=int, default=6)
    ap.add_argument("--audio-packets", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--tag", default="otapi")
    ap.add_argument("--traceparent", default="")
    args = ap.parse_args(argv)
    out = asyncio.run(serve_and_drive(args))
    try:
        from omnitrace.inject import patching

        out["patching"] = patching.status()
    except Exception as exc:
        out["patching"] = {"error": repr(exc)}
    print(json.dumps(out))
    return 0 if all(s == 200 for s in out["status"]) else 1


if __name__ == "__main__":
    sys.exit(main())
