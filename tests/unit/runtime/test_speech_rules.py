"""The speech mode's pure rules, in process: which backend a bench command means and what a
speech request body may hold (how its id is reduced to the client's: tests/unit/test_requestids.py)."""
from __future__ import annotations

import pytest

from omnitrace.bench.client import resolve_backend
from omnitrace.runtime import config, routes

@pytest.mark.parametrize("backend,endpoint,want", [
    (None, None, ("openai-chat-omni", "/v1/chat/completions")),
    ("openai-audio-speech", None, ("openai-audio-speech", "/v1/audio/speech")),
    (None, "/v1/audio/speech", ("openai-audio-speech", "/v1/audio/speech")),
    (None, "/proxy/v1/audio/speech/", ("openai-audio-speech", "/proxy/v1/audio/speech/")),
    ("openai-chat-omni", "/gw/v1/chat/completions", ("openai-chat-omni", "/gw/v1/chat/completions")),
])
def test_backend_and_endpoint_resolved(backend, endpoint, want):
    b, e = resolve_backend(backend, endpoint)
    assert (b.name, e) == want


@pytest.mark.parametrize("backend,endpoint,needle", [
    ("openai-tts", None, "unknown --backend 'openai-tts'"),
    (None, "/v1/completions", "unknown --endpoint '/v1/completions'"),
    ("openai-audio-speech", "/v1/chat/completions", "is not /v1/audio/speech"),
    (None, "v1/audio/speech", "a path starting with /"),
])
def test_bad_backend_or_endpoint_is_one_line(backend, endpoint, needle):
    with pytest.raises(ValueError) as e:
        resolve_backend(backend, endpoint)
    assert needle in str(e.value) and "\n" not in str(e.value)


LIMITS, AUDIO = config.Limits(max_prompt_tokens=100, max_tokens=50), config.AudioConfig()


@pytest.mark.parametrize("body,mode,fmt", [
    ({"input": "hi there"}, "full", "wav"),
    ({"input": "hi", "stream": True}, "sse", "wav"),
    ({"input": "hi", "stream_format": "sse", "response_format": "pcm"}, "sse", "pcm"),
    ({"input": "hi", "stream": True, "stream_format": "audio", "response_format": "pcm"}, "audio", "pcm"),
])
def test_speech_modes_as_vllm_omni_reads_them(body, mode, fmt):
    ask = routes.parse_speech_request(body, LIMITS, AUDIO)
    assert (ask.mode, ask.audio_format, ask.prompt_tokens, ask.max_tokens) == (
        mode, fmt, len(body["input"].split()), routes.DEFAULT_MAX_TOKENS)


def test_streaming_wav_header_is_a_pcm16_header_of_unknown_size():
    h = routes.streaming_wav_header(16000)
    assert len(h) == 44 and h[:4] == b"RIFF" and h[8:16] == b"WAVEfmt " and h[36:40] == b"data"
    assert h[4:8] == h[40:44] == b"\xff\xff\xff\xff"
    assert int.from_bytes(h[24:28], "little") == 16000 and int.from_bytes(h[34:36], "little") == 16
