"""One streaming /v1/chat/completions request, parsed like vLLM-Omni's benchmark client.

Mirrors ``vllm_omni/benchmarks/patch/patch.py: async_request_openai_chat_omni_completions``
and vLLM-Omni's ``openai-chat-omni`` SSE stream: messages are split on blank lines,
``:`` comment lines are skipped, ``data: [DONE]`` ends the stream, a chunk with an ``error``
key fails the request, and the TOP-LEVEL ``modality`` decides text vs audio. TTFT is the
first text chunk, TTFP the first audio chunk (even with empty content), both relative to
``perf_counter()`` taken just before the POST.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import aiohttp
import orjson

# The reference runtime accepts an explicit prompt length for load tests, so a synthetic
# prompt of N words is N tokens there regardless of its tokenizer (omnitrace/runtime/api.py).
PROMPT_TOKENS_FIELD = "omnitrace_prompt_tokens"


@dataclass
class RequestResult:
    id: str
    concurrency: int
    warmup: bool
    input_len: int
    output_len: int
    start_unix_ns: int = 0
    ttft_s: float | None = None
    ttfp_s: float | None = None
    latency_s: float | None = None
    bytes: int = 0
    text_chunks: int = 0
    audio_chunks: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None  # as the server counted them (a real tokenizer: not input_len)
    server_id: str | None = None  # the stream's ``id`` (the server's name for the request)
    status: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["extra"]:
            del d["extra"]
        return d


def request_body(model: str, prompt: str, input_len: int, output_len: int,
                 extra_body: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
        "temperature": 0.0, "max_tokens": output_len, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": True, "modalities": ["text", "audio"],
        PROMPT_TOKENS_FIELD: input_len,
    }
    if extra_body:
        body.update(extra_body)
    return body


def _describe(e: BaseException) -> str:
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"connection failed: {e.os_error.strerror if e.os_error else e}"
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    return f"{e.__class__.__name__}: {str(e)[:200]}"


async def send(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
               res: RequestResult, headers: dict[str, str] | None = None,
               progress: Callable[[], None] | None = None) -> RequestResult:
    """POST one streaming request and fill ``res`` in; never raises for HTTP/stream errors.
    ``progress`` is called on every piece of the stream received (the stall watch)."""
    hdrs = {"x-request-id": res.id, "Content-Type": "application/json"}
    hdrs.update(headers or {})
    res.start_unix_ns = time.time_ns()
    st = time.perf_counter()
    try:
        async with session.post(url, data=orjson.dumps(body), headers=hdrs) as resp:
            res.status = resp.status
            if resp.status != 200:
                text = (await resp.text())[:200].strip()
                res.error = f"HTTP {resp.status} {resp.reason}: {text}"
                return res
            buf = ""
            done = False
            async for raw in resp.content.iter_any():
                res.bytes += len(raw)
                if progress is not None:
                    progress()
                buf += raw.decode("utf-8", errors="replace")
                while "\n\n" in buf and not done:
                    msg, buf = buf.split("\n\n", 1)
                    done = _handle(msg.strip(), res, st)
                if done:
                    break
            if not done and res.error is None and buf.strip():
                done = _handle(buf.strip(), res, st)
            if res.error is None:
                res.error = _unfinished(res, done)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        res.error = _describe(e)
    finally:
        res.latency_s = time.perf_counter() - st
    return res


def _unfinished(res: RequestResult, done: bool) -> str | None:
    """Why a stream that ended without an error is not a success, or None: it ended
    without [DONE] and without audio, or held no text and no audio at all."""
    if not done and res.ttfp_s is None:
        return "stream ended without [DONE] and without audio"
    if not res.text_chunks and not res.audio_chunks:
        return "empty stream: no text and no audio before [DONE]"
    return None


def _handle(msg: str, res: RequestResult, st: float) -> bool:
    """Handle one SSE message; True when the stream is over ([DONE] or error)."""
    if not msg or msg.startswith(":"):
        return False
    chunk = msg.removeprefix("data: ").removeprefix("data:").strip()
    if chunk == "[DONE]":
        return True
    t = time.perf_counter()
    try:
        data = orjson.loads(chunk)
    except orjson.JSONDecodeError:
        res.error = f"malformed stream chunk: {chunk[:80]!r}"
        return True
    if not isinstance(data, dict):
        return False
    if res.server_id is None and isinstance(data.get("id"), str):
        res.server_id = data["id"]
    if (err := data.get("error")) is not None:
        res.error = f"stream error: {str(err.get('message', err) if isinstance(err, dict) else err)[:200]}"
        return True
    usage = data.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        res.completion_tokens = usage["completion_tokens"]
        if usage.get("prompt_tokens") is not None:
            res.prompt_tokens = usage["prompt_tokens"]
    if data.get("choices"):
        modality = data.get("modality")
        if modality == "text":
            res.text_chunks += 1
            if res.ttft_s is None:
                res.ttft_s = t - st
        elif modality == "audio":
            res.audio_chunks += 1
            if res.ttfp_s is None:
                res.ttfp_s = t - st
    return False
