"""The reference API's two routes: what each request body may hold, and how each frames the
pipeline's outputs (stage-0 text tokens, code2wav's WAV packets) for its client.

* ``POST /v1/chat/completions`` -- vLLM-Omni's ``openai-chat-omni`` SSE stream: top-level
  ``modality`` and ``usage`` on every chunk, text deltas, audio chunks (each a complete
  base64 WAV), ``data: [DONE]``.
* ``POST /v1/audio/speech`` -- vLLM-Omni's speech route (``serving_speech.py``): the input
  text is spoken, no text is sent back. ``stream_format: "audio"``: the raw PCM16 stream
  (``response_format`` ``pcm``, or ``wav``: a streaming header with 0xFFFFFFFF sizes
  first), with ``X-Audio-Sample-Rate`` / ``X-Audio-Channels`` headers; ``stream: true``
  (or ``stream_format: "sse"``): ``speech.audio.delta`` events (base64 audio; for ``wav``
  the header is its own first event), then ``speech.audio.done`` with ``usage`` or
  ``speech.audio.error``; otherwise one complete WAV (or PCM) body. ``max_new_tokens`` is
  the output length (stage-0 tokens), as ``max_tokens`` is on the chat route.
"""
from __future__ import annotations

import base64
import io
import struct
import time
import uuid
import wave
from dataclasses import dataclass
from typing import Any

import orjson

from omnitrace.runtime import config as config_mod

PROMPT_TOKENS_FIELDS = ("omnitrace_prompt_tokens", "prompt_tokens")
DEFAULT_MAX_TOKENS = 64
CHANNELS = 1


class BadRequest(ValueError):
    pass


@dataclass(frozen=True)
class Ask:
    """What a request asks of the pipeline, and how its answer is framed."""

    prompt_tokens: int
    max_tokens: int
    model: str
    mode: str = "chat"  # chat | audio (raw stream) | sse | full (one body)
    audio_format: str = "wav"  # speech: wav | pcm


def _int_field(body: dict, key: str, lo: int, hi: int, limit_name: str) -> int:
    v = body[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{key}: must be an integer, got {type(v).__name__}")
    if v < lo:
        raise BadRequest(f"{key}: must be at least {lo}, got {v}")
    if v > hi:
        raise BadRequest(f"{key}: must be at most {hi} ({limit_name}), got {v}")
    return v


def _prompt_tokens(body: dict, words: int, limits: config_mod.Limits) -> int:
    """An explicit ``omnitrace_prompt_tokens`` (load tests), else one token per word."""
    key = next((k for k in PROMPT_TOKENS_FIELDS if k in body), None)
    if key is not None:
        return _int_field(body, key, 1, limits.max_prompt_tokens, "limits.max_prompt_tokens")
    prompt = max(1, words)
    if prompt > limits.max_prompt_tokens:
        raise BadRequest(f"prompt: {prompt} tokens is over the limit of "
                         f"{limits.max_prompt_tokens} (limits.max_prompt_tokens)")
    return prompt


def _max_tokens(body: dict, keys: tuple[str, ...], limits: config_mod.Limits) -> int:
    key = next((k for k in keys if k in body), None)
    return DEFAULT_MAX_TOKENS if key is None else _int_field(body, key, 1, limits.max_tokens, "limits.max_tokens")


def _model(body: dict) -> str:
    model = body.get("model") or ""
    if not isinstance(model, str):
        raise BadRequest(f"model: must be a string, got {type(model).__name__}")
    return model


def _message_words(msgs: Any) -> int:
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages: must be a non-empty list")
    words = 0
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}]: must be an object")
        content = m.get("content")
        if isinstance(content, str):
            words += len(content.split())
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise BadRequest(f"messages[{i}].content[{j}]: must be {{\"type\": \"text\", \"text\": string}}")
                words += len(part["text"].split())
        else:
            raise BadRequest(f"messages[{i}].content: must be a string or a list of text parts")
    return words


def parse_request(body: Any, limits: config_mod.Limits) -> Ask:
    """A chat request, or BadRequest with a message."""
    if not isinstance(body, dict):
        raise BadRequest(f"body: must be a JSON object, got {type(body).__name__}")
    if body.get("stream") is not True:
        raise BadRequest("stream: only stream=true is supported")
    prompt = _prompt_tokens(body, _message_words(body.get("messages")), limits)
    max_tokens = _max_tokens(body, ("max_tokens", "max_completion_tokens"), limits)
    model = _model(body)
    mods = body.get("modalities")
    if mods is not None and (not isinstance(mods, list) or not all(x in ("text", "audio") for x in mods)):
        raise BadRequest("modalities: must be a list of \"text\" and/or \"audio\"")
    return Ask(prompt, max_tokens, model)


def _speech_mode(body: dict) -> str:
    stream, stream_format = body.get("stream", False), body.get("stream_format")
    if not isinstance(stream, bool):
        raise BadRequest(f"stream: must be true or false, got {stream!r}")
    if stream_format not in (None, "sse", "audio"):
        raise BadRequest(f"stream_format: must be \"sse\" or \"audio\", got {stream_format!r}")
    if stream_format == "audio":
        return "audio"
    return "sse" if stream or stream_format == "sse" else "full"


def parse_speech_request(body: Any, limits: config_mod.Limits, audio: config_mod.AudioConfig) -> Ask:
    """A speech request (vLLM-Omni's fields), or BadRequest with a message."""
    if not isinstance(body, dict):
        raise BadRequest(f"body: must be a JSON object, got {type(body).__name__}")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("input: must be a non-empty string")
    mode = _speech_mode(body)
    fmt = body.get("response_format") or "wav"
    if fmt not in ("wav", "pcm"):
        raise BadRequest(f"response_format: the reference pipeline writes \"wav\" or \"pcm\", got {fmt!r}")
    speed = body.get("speed")
    if speed is not None and speed != 1.0:
        raise BadRequest(f"speed: the reference pipeline speaks at 1.0 only, got {speed!r}")
    rate = body.get("sample_rate")
    if rate is not None and rate != audio.sample_rate:
        raise BadRequest(f"sample_rate: the reference pipeline speaks at {audio.sample_rate} Hz, got {rate!r}")
    prompt = _prompt_tokens(body, len(text.split()), limits)
    return Ask(prompt, _max_tokens(body, ("max_new_tokens",), limits), _model(body), mode, fmt)


def default_request_id(route: str) -> str:
    """The name a route gives a request whose client sent no ``x-request-id``."""
    return f"{'speech' if route == 'speech' else 'chatcmpl'}-{uuid.uuid4().hex}"


# --------------------------------------------------------------------------- framing
def pcm_frames(wav_bytes: bytes) -> bytes:
    """The samples of one of code2wav's WAV packets."""
    with wave.open(io.BytesIO(wav_bytes), "rb") as w:
        return w.readframes(w.getnframes())


def streaming_wav_header(rate: int) -> bytes:
    """vLLM-Omni's ``_create_wav_header``: PCM16, sizes unknown (0xFFFFFFFF)."""
    unknown = 0xFFFFFFFF
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", unknown, b"WAVE", b"fmt ", 16, 1, CHANNELS, rate,
                       rate * CHANNELS * 2, CHANNELS * 2, 16, b"data", unknown)


class Framing:
    """How one request's outputs go to its client. Each method returns the bytes to send
    (b"": nothing); ``error`` returns None where the format has no in-band error (the
    connection is then cut, as vLLM-Omni's raw audio stream is)."""

    streaming = True  # False: one body, sent when the request is done

    def __init__(self, rid: str, ask: Ask, model: str, audio: config_mod.AudioConfig) -> None:
        self.rid, self.ask, self.model, self.rate = rid, ask, model, audio.sample_rate
        self.text_tokens = 0
        self.audio_sent = False

    def headers(self) -> dict[str, str]:  # an SSE stream unless the format says otherwise
        return {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "x-request-id": self.rid}

    def text(self, content: str) -> bytes:
        self.text_tokens += 1
        return b""

    def audio(self, wav_bytes: bytes) -> bytes:
        raise NotImplementedError

    def done(self) -> bytes:
        return b""

    def error(self, message: str) -> bytes | None:
        return None


class ChatFraming(Framing):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.created = int(time.time())

    def _chunk(self, modality: str, content: str, finish: str | None = None) -> bytes:
        p, n = self.ask.prompt_tokens, self.text_tokens
        return b"data: " + orjson.dumps({
            "id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "modality": modality,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": finish}],
            "usage": {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}}) + b"\n\n"

    def text(self, content: str) -> bytes:
        super().text(content)
        return self._chunk("text", content)

    def audio(self, wav_bytes: bytes) -> bytes:
        return self._chunk("audio", base64.b64encode(wav_bytes).decode())

    def done(self) -> bytes:
        return self._chunk("text", "", "length") + b"data: [DONE]\n\n"

    def error(self, message: str) -> bytes:
        return b"data: " + orjson.dumps({"error": {"message": message, "type": "server_error", "code": 500}}) \
            + b"\n\ndata: [DONE]\n\n"


class _AudioBody(Framing):
    """A body of audio bytes, described by vLLM-Omni's ``X-Audio-*`` headers."""

    def headers(self) -> dict[str, str]:
        return {"Content-Type": f"audio/{self.ask.audio_format}", "X-Audio-Sample-Rate": str(self.rate),
                "X-Audio-Channels": str(CHANNELS), "x-request-id": self.rid}


class RawAudioFraming(_AudioBody):
    """``stream_format: "audio"``: the samples as they come (``wav``: header first)."""

    def audio(self, wav_bytes: bytes) -> bytes:
        head = b"" if self.audio_sent or self.ask.audio_format != "wav" else streaming_wav_header(self.rate)
        self.audio_sent = True
        return head + pcm_frames(wav_bytes)


class SseSpeechFraming(Framing):
    """``stream: true``: OpenAI's ``speech.audio.*`` events, as vLLM-Omni writes them."""

    def _event(self, kind: str, payload: dict) -> bytes:
        return f"event: speech.audio.{kind}\ndata: ".encode() + orjson.dumps(payload) + b"\n\n"

    def _delta(self, data: bytes) -> bytes:
        return self._event("delta", {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode(),
                                     "response_format": self.ask.audio_format, "sample_rate": self.rate,
                                     "channels": CHANNELS})

    def audio(self, wav_bytes: bytes) -> bytes:
        head = b""
        if not self.audio_sent and self.ask.audio_format == "wav":
            head = self._delta(streaming_wav_header(self.rate))
        self.audio_sent = True
        return head + self._delta(pcm_frames(wav_bytes))

    def done(self) -> bytes:
        p, n = self.ask.prompt_tokens, self.text_tokens
        return self._event("done", {"type": "speech.audio.done", "usage": {
            "input_tokens": p, "output_tokens": n, "total_tokens": p + n,
            "input_token_details": {"text_tokens": p, "audio_tokens": 0}}})

    def error(self, message: str) -> bytes:
        err: dict[str, Any] = {"message": message, "type": "server_error", "param": None, "code": 500}
        if self.audio_sent:
            err.update(partial_audio=True, action="discard")
        return self._event("error", {"type": "speech.audio.error", "error": err})


class FullSpeechFraming(_AudioBody):
    """No streaming: one complete WAV (or raw PCM) body once the request is done."""

    streaming = False

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.samples = bytearray()

    def audio(self, wav_bytes: bytes) -> bytes:
        self.samples += pcm_frames(wav_bytes)
        self.audio_sent = True
        return b""

    def done(self) -> bytes:
        if self.ask.audio_format == "pcm":
            return bytes(self.samples)
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(CHANNELS)
            w.setsampwidth(2)
            w.setframerate(self.rate)
            w.writeframes(bytes(self.samples))
        return buf.getvalue()


FRAMINGS = {"chat": ChatFraming, "audio": RawAudioFraming, "sse": SseSpeechFraming, "full": FullSpeechFraming}
