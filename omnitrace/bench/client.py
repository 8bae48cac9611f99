"""One streaming request, sent and parsed like vLLM-Omni's benchmark client does for the
backend (``vllm bench serve --backend``) it names.

``openai-chat-omni`` (``/v1/chat/completions``): mirrors ``vllm_omni/benchmarks/patch/
patch.py: async_request_openai_chat_omni_completions`` and the SSE stream it parses:
messages are split on blank lines, ``:`` comment lines are skipped, ``data: [DONE]`` ends
the stream, a chunk with an ``error`` key fails the request, and the TOP-LEVEL ``modality``
decides text vs audio. TTFT is the first text chunk, TTFP the first audio chunk (even with
empty content).

``openai-audio-speech`` (``/v1/audio/speech``): mirrors ``async_request_openai_audio_speech``:
``stream: true, stream_format: "audio", response_format: "pcm"``, TTFP the first non-empty
body chunk, the end the end of the body (a body cut short fails the request). A response
that is an SSE stream (``--extra-body '{"stream_format": "sse"}'``) is read as vLLM-Omni's
``speech.audio.*`` events: TTFP the first ``speech.audio.delta``, ``speech.audio.error``
fails the request, ``speech.audio.done`` ends it. ``max_new_tokens`` = the output length.

Both relative to ``perf_counter()`` taken just before the POST.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Awaitable, Callable

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


Progress = Callable[[], None] | None  # called on every piece of a body received (the stall watch)
Reader = Callable[[aiohttp.ClientResponse, RequestResult, float, Progress], Awaitable[None]]


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], res: RequestResult,
                read: Reader, headers: dict[str, str] | None = None, progress: Progress = None) -> RequestResult:
    """POST one streaming request and fill ``res`` in with ``read``; never raises for
    HTTP/stream errors."""
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
            await read(resp, res, st, progress)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        res.error = _describe(e)
    finally:
        res.latency_s = time.perf_counter() - st
    return res


async def _chunks(resp: aiohttp.ClientResponse, res: RequestResult, progress: Progress):
    """The body's pieces as they come, counted into ``res.bytes``."""
    async for raw in resp.content.iter_any():
        res.bytes += len(raw)
        if progress is not None:
            progress()
        yield raw


async def _read_messages(resp: aiohttp.ClientResponse, res: RequestResult, st: float, progress: Progress,
                         handle: Callable[[str, RequestResult, float], bool]) -> bool:
    """Feed each blank-line-separated SSE message to ``handle`` until it says the stream
    is over; False if the body ended first."""
    buf = ""
    async for raw in _chunks(resp, res, progress):
        buf += raw.decode("utf-8", errors="replace")
        while "\n\n" in buf:
            msg, buf = buf.split("\n\n", 1)
            if handle(msg.strip(), res, st):
                return True
    return bool(buf.strip()) and handle(buf.strip(), res, st)


async def _read_chat(resp: aiohttp.ClientResponse, res: RequestResult, st: float, progress: Progress) -> None:
    done = await _read_messages(resp, res, st, progress, _handle)
    if res.error is None:
        res.error = _unfinished(res, done)


def _unfinished(res: RequestResult, done: bool) -> str | None:
    """Why a stream that ended without an error is not a success, or None: it ended
    without [DONE] and without audio, or held no text and no audio at all."""
    if not done and res.ttfp_s is None:
        return "stream ended without [DONE] and without audio"
    if not res.text_chunks and not res.audio_chunks:
        return "empty stream: no text and no audio before [DONE]"
    return None


async def send(session: aiohttp.ClientSession, url: str, body: dict[str, Any], res: RequestResult,
               headers: dict[str, str] | None = None, progress: Progress = None) -> RequestResult:
    """One ``openai-chat-omni`` request."""
    return await _post(session, url, body, res, _read_chat, headers, progress)


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


# --------------------------------------------------------------------------- speech
def speech_body(model: str, prompt: str, input_len: int, output_len: int,
                extra_body: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "input": prompt, "stream": True, "stream_format": "audio",
                            "response_format": "pcm", "max_new_tokens": output_len,
                            PROMPT_TOKENS_FIELD: input_len}
    if extra_body:
        body.update(extra_body)
    return body


def _handle_speech_event(msg: str, res: RequestResult, st: float) -> bool:
    """One ``speech.audio.*`` SSE event; True when the stream is over."""
    if not msg or msg.startswith(":"):
        return False
    t = time.perf_counter()
    kind, _, data = msg.partition("\n")
    kind = kind.removeprefix("event:").strip()
    if kind == "speech.audio.delta":
        res.audio_chunks += 1
        if res.ttfp_s is None:
            res.ttfp_s = t - st
        return False
    try:
        payload = orjson.loads(data.strip().removeprefix("data:").strip() or b"{}")
    except orjson.JSONDecodeError:
        res.error = f"malformed speech event: {msg[:80]!r}"
        return True
    if kind == "speech.audio.error":
        err = payload.get("error") if isinstance(payload, dict) else None
        res.error = f"stream error: {str(err.get('message', err) if isinstance(err, dict) else err)[:200]}"
        return True
    if kind == "speech.audio.done":
        usage = payload.get("usage") if isinstance(payload, dict) else None
        if isinstance(usage, dict):
            res.completion_tokens, res.prompt_tokens = usage.get("output_tokens"), usage.get("input_tokens")
        return True
    return False


async def _read_speech(resp: aiohttp.ClientResponse, res: RequestResult, st: float, progress: Progress) -> None:
    res.server_id = resp.headers.get("x-request-id")  # the reference server says; vLLM-Omni does not
    if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
        if not await _read_messages(resp, res, st, progress, _handle_speech_event) and res.error is None:
            res.error = "stream ended without speech.audio.done"
        return
    async for raw in _chunks(resp, res, progress):
        if raw:
            if res.ttfp_s is None:
                res.ttfp_s = time.perf_counter() - st
            res.audio_chunks += 1
    if res.ttfp_s is None:
        res.error = "response without audio"


async def send_speech(session: aiohttp.ClientSession, url: str, body: dict[str, Any], res: RequestResult,
                      headers: dict[str, str] | None = None, progress: Progress = None) -> RequestResult:
    """One ``openai-audio-speech`` request."""
    return await _post(session, url, body, res, _read_speech, headers, progress)


# --------------------------------------------------------------------------- backends
@dataclass(frozen=True)
class Backend:
    """A request kind, named as ``vllm bench serve --backend`` names it."""

    name: str
    endpoint: str
    body: Callable[..., dict[str, Any]]
    send: Callable[..., Awaitable[RequestResult]]


BACKENDS = {b.name: b for b in (
    Backend("openai-chat-omni", "/v1/chat/completions", request_body, send),
    Backend("openai-audio-speech", "/v1/audio/speech", speech_body, send_speech))}
DEFAULT_BACKEND = "openai-chat-omni"
BACKEND_HELP = (f"request kind: {', '.join(BACKENDS)} (default: the one --endpoint names, "
                f"else {DEFAULT_BACKEND})")
ENDPOINT_HELP = ("route path (default: the backend's: "
                 + ", ".join(b.endpoint for b in BACKENDS.values()) + ")")


def resolve_backend(backend: str | None, endpoint: str | None) -> tuple[Backend, str]:
    """(backend, endpoint) from what the user gave: a backend (its own endpoint unless one
    ending in that path is given), or an endpoint whose path names one; ValueError with
    one line otherwise."""
    known = ", ".join(f"{b.name} ({b.endpoint})" for b in BACKENDS.values())
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown --backend {backend!r}; known: {known}")
    if endpoint is not None and not endpoint.startswith("/"):
        raise ValueError(f"--endpoint {endpoint!r}: a path starting with / expected, e.g. /v1/audio/speech")
    if backend is None:
        if endpoint is None:
            return BACKENDS[DEFAULT_BACKEND], BACKENDS[DEFAULT_BACKEND].endpoint
        hit = next((b for b in BACKENDS.values() if endpoint.rstrip("/").endswith(b.endpoint)), None)
        if hit is None:
            raise ValueError(f"unknown --endpoint {endpoint!r}; known: {known}")
        return hit, endpoint
    chosen = BACKENDS[backend]
    if endpoint is not None and not endpoint.rstrip("/").endswith(chosen.endpoint):
        raise ValueError(f"--endpoint {endpoint!r} is not {chosen.endpoint}, the path --backend {backend} posts to")
    return chosen, endpoint or chosen.endpoint
