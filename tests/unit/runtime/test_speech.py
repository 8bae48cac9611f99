"""The reference pipeline's ``/v1/audio/speech`` over real HTTP with real stage processes:
the response kinds of vLLM-Omni's speech route (raw PCM/WAV stream, SSE events, one body)
and its bad input. A stage dying under each streaming kind:
tests/system/runtime/test_runtime_speech.py."""
from __future__ import annotations

import base64
import io
import json
import re
import urllib.error
import urllib.request
import wave

import pytest

from omnitrace.runtime import config
from tests.support.runtime_server import (
    RAW, TAG, assert_stopped_clean, fast_pipeline, Server, shm_entries, speech_body)

AUDIO = config.AudioConfig()
# the packaged pipeline: the talker makes 2 codec frames per stage-0 token, each frame
# 480 samples of PCM16 at 24 kHz (tests/unit/runtime/test_server.py: 40 tokens -> 80 frames)
FRAMES_PER_TOKEN = 2


def _pcm_bytes(tokens: int) -> int:
    return tokens * FRAMES_PER_TOKEN * AUDIO.samples_per_frame * 2


def post(srv: Server, body: bytes, rid: str | None = None) -> tuple[int, bytes, dict]:
    headers = {"Content-Type": "application/json", **({"x-request-id": rid} if rid else {})}
    req = urllib.request.Request(srv.url + "/v1/audio/speech", body, headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def sse_events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for msg in raw.decode().split("\n\n"):
        if msg.strip():
            m = re.fullmatch(r"event: (speech\.audio\.\w+)\ndata: (.*)", msg.strip(), re.S)
            assert m, msg[:80]
            out.append((m.group(1), json.loads(m.group(2))))
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(fast_pipeline(tmp_path_factory.mktemp("rts")))
    yield srv
    srv.stop()
    assert_stopped_clean(srv)
@pytest.mark.timeout(60)
def test_raw_pcm_and_wav_streams(server):
    status, pcm, headers = post(server, speech_body(10, response_format="pcm", **RAW), f"{TAG}-pcm")
    assert status == 200 and headers["Content-Type"] == "audio/pcm" and headers["x-request-id"] == f"{TAG}-pcm"
    assert (headers["X-Audio-Sample-Rate"], headers["X-Audio-Channels"]) == (str(AUDIO.sample_rate), "1")
    assert len(pcm) == _pcm_bytes(10)
    status, wav, headers = post(server, speech_body(10, response_format="wav", **RAW), f"{TAG}-wav")
    assert status == 200 and headers["Content-Type"] == "audio/wav"
    # vLLM-Omni's streaming header: PCM16 mono, both sizes unknown (0xFFFFFFFF)
    assert wav[:4] == b"RIFF" and wav[4:8] == b"\xff\xff\xff\xff" and wav[40:44] == b"\xff\xff\xff\xff"
    assert int.from_bytes(wav[24:28], "little") == AUDIO.sample_rate and len(wav) == 44 + _pcm_bytes(10)
    assert shm_entries(f"{TAG}-pcm") == shm_entries(f"{TAG}-wav") == []
@pytest.mark.timeout(60)
def test_sse_events_and_one_body(server):
    status, raw, headers = post(server, speech_body(6, stream=True, response_format="pcm"), f"{TAG}-sse")
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(raw)
    kinds = [k for k, _ in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}
    audio = b"".join(base64.b64decode(e["audio"]) for k, e in events if k == "speech.audio.delta")
    assert len(audio) == _pcm_bytes(6)
    assert all(e["sample_rate"] == AUDIO.sample_rate and e["response_format"] == "pcm"
               for k, e in events[:-1])
    usage = events[-1][1]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (3, 6)  # 3 words; 6 stage-0 tokens
    # wav over SSE: the streaming header is the first delta of its own
    _, raw, _ = post(server, speech_body(6, stream=True), f"{TAG}-ssew")
    first = base64.b64decode(sse_events(raw)[0][1]["audio"])
    assert first[:4] == b"RIFF" and len(first) == 44
    # no streaming: one complete WAV, or the samples alone
    status, body, headers = post(server, speech_body(6), f"{TAG}-full")
    assert status == 200 and headers["Content-Length"] == str(len(body))
    with wave.open(io.BytesIO(body)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, AUDIO.sample_rate)
        assert w.getnframes() * 2 == _pcm_bytes(6)
    _, body, _ = post(server, speech_body(6, response_format="pcm"), f"{TAG}-fullpcm")
    assert len(body) == _pcm_bytes(6)
@pytest.mark.timeout(60)
def test_generated_id_and_prompt_tokens(server):
    status, raw, headers = post(server, speech_body(2, stream=True, omnitrace_prompt_tokens=900))
    assert status == 200 and re.fullmatch(r"speech-[0-9a-f]{32}", headers["x-request-id"])
    assert sse_events(raw)[-1][1]["usage"]["input_tokens"] == 900
@pytest.mark.timeout(60)
@pytest.mark.parametrize("body,needle", [
    (json.dumps({"model": "m"}).encode(), "input: must be a non-empty string"),
    (speech_body(4, text="   "), "input: must be a non-empty string"),
    (speech_body(4, response_format="mp3"), "response_format: the reference pipeline writes"),
    (speech_body(4, stream_format="ogg"), "stream_format: must be"),
    (speech_body(4, stream="yes"), "stream: must be true or false"),
    (speech_body(4, speed=1.5), "speed: the reference pipeline speaks at 1.0 only"),
    (speech_body(4, sample_rate=8000), "sample_rate: the reference pipeline speaks at 24000 Hz"),
    (speech_body(0), "max_new_tokens: must be at least 1"),
    (speech_body(10**9), "max_new_tokens: must be at most 512"),
    (speech_body(4, omnitrace_prompt_tokens="x"), "omnitrace_prompt_tokens: must be an integer"),
])
def test_bad_speech_input_is_400(server, body, needle):
    status, raw, _ = post(server, body, f"{TAG}-bad")
    assert status == 400, raw
    msg = json.loads(raw)["error"]["message"]
    assert needle in msg and "\n" not in msg
