"""The reference pipeline over real HTTP with real stage processes and real shared memory."""
from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time

import aiohttp
import pytest

from tests.support.runtime_server import (
    TAG, assert_stopped_clean, chat_body, check_stream, fast_pipeline, parse_sse, post, Server,
    shm_entries)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(fast_pipeline(tmp_path_factory.mktemp("rt")))
    yield srv
    srv.stop()
    assert_stopped_clean(srv)


# --------------------------------------------------------------------------- tests
@pytest.mark.timeout(60)
def test_text_and_audio_stream(server):
    rid = f"{TAG}-one"
    status, raw, headers = post(server, chat_body(40), rid)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert headers["x-request-id"] == rid
    events = parse_sse(raw)
    _, packets, seconds = check_stream(events, rid, 3, 40)
    # talker: 80 frames -> chunks after 4, 29, 54, 79 frames and a terminal one -> 5 packets
    assert packets == 5
    assert seconds == pytest.approx(80 * 480 / 24000)
    # text streams before the stream ends, and the first audio packet comes before the last text
    kinds = [e["modality"] for e in events[:-1]]
    assert kinds.index("audio") < len(kinds) - 1 - kinds[::-1].index("text")
    assert shm_entries(rid) == []
@pytest.mark.timeout(60)
def test_prompt_tokens_field_and_generated_id(server):
    status, raw, headers = post(server, chat_body(3, omnitrace_prompt_tokens=2500))
    assert status == 200
    rid = headers["x-request-id"]
    assert rid.startswith("chatcmpl-")
    check_stream(parse_sse(raw), rid, 2500, 3)
    status, raw, _ = post(server, chat_body(3, prompt_tokens=7), f"{TAG}-pt")
    check_stream(parse_sse(raw), f"{TAG}-pt", 7, 3)
@pytest.mark.timeout(90)
def test_concurrency_32(server):
    async def one(session, i):
        rid = f"{TAG}-c{i}"
        async with session.post(server.url + "/v1/chat/completions", data=chat_body(12 + i % 5),
                                headers={"x-request-id": rid}) as r:
            assert r.status == 200, await r.text()
            raw = await r.read()
        check_stream(parse_sse(raw), rid, 3, 12 + i % 5)

    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=80)) as s:
            await asyncio.gather(*(one(s, i) for i in range(32)))

    asyncio.run(main())
    assert server.health()[1]["in_flight"] == 0
    time.sleep(0.2)
    assert shm_entries(f"{TAG}-c") == []
@pytest.mark.timeout(60)
@pytest.mark.parametrize("body,needle", [
    (b"{not json", "invalid JSON"),
    (b"[1, 2]", "body: must be a JSON object"),
    (chat_body(0), "max_tokens: must be at least 1"),
    (chat_body(-5), "max_tokens: must be at least 1"),
    (chat_body(10**9), "max_tokens: must be at most 512"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "10", "stream": True}).encode(),
     "max_tokens: must be an integer"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4.5, "stream": True}).encode(),
     "max_tokens: must be an integer"),
    (json.dumps({"messages": "hi", "max_tokens": 4, "stream": True}).encode(), "messages: must be a non-empty list"),
    (json.dumps({"messages": [{"role": "user", "content": 5}], "max_tokens": 4, "stream": True}).encode(),
     "messages[0].content"),
    (chat_body(4, text="w " * 5000), "over the limit of 4096"),
    (chat_body(4, prompt_tokens=5000), "prompt_tokens: must be at most 4096"),
    (chat_body(4, omnitrace_prompt_tokens=True), "omnitrace_prompt_tokens: must be an integer"),
    (chat_body(4, stream=False), "stream: only stream=true"),
])
def test_bad_input_is_400(server, body, needle):
    status, raw, _ = post(server, body, f"{TAG}-bad")
    assert status == 400, raw
    msg = json.loads(raw)["error"]["message"]
    assert needle in msg and "\n" not in msg
def test_oversized_body_is_413_as_json(server):
    from omnitrace.runtime.api import MAX_BODY_BYTES
    status, raw, headers = post(server, b"{" + b" " * MAX_BODY_BYTES + b"}", f"{TAG}-big")
    assert status == 413, raw[:200]
    assert headers.get("Content-Type", "").startswith("application/json")
    assert "larger than" in json.loads(raw)["error"]["message"]
@pytest.mark.timeout(60)
def test_bad_request_id_and_duplicates(server):
    status, raw, _ = post(server, chat_body(2), "bad/id")
    assert status == 400 and "x-request-id" in json.loads(raw)["error"]["message"]
    # the server still serves afterwards
    status, raw, _ = post(server, chat_body(2), f"{TAG}-after-bad")
    check_stream(parse_sse(raw), f"{TAG}-after-bad", 3, 2)
@pytest.mark.timeout(60)
def test_cancel_mid_stream_leaves_no_segments(server):
    rid = f"{TAG}-cancel"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    # long prompt -> a 16 MB chunk 0; long output -> many chunks in flight when we hang up
    conn.request("POST", "/v1/chat/completions", chat_body(400, prompt_tokens=2000),
                 {"x-request-id": rid, "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    seen = b""
    while seen.count(b'"modality":"audio"') < 1:  # text and audio both under way
        seen += resp.read1(65536)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (shm_entries(rid) or server.health()[1]["in_flight"]):
        time.sleep(0.05)
    assert shm_entries(rid) == []
    assert server.health()[1]["in_flight"] == 0
    status, raw, _ = post(server, chat_body(5), f"{TAG}-after-cancel")
    check_stream(parse_sse(raw), f"{TAG}-after-cancel", 3, 5)
@pytest.mark.timeout(60)
def test_broken_chunk_fails_only_its_request(server):
    from omnitrace.runtime.shm import HDR, MAGIC, Segment
    rid = f"{TAG}-broken"
    seg = Segment.create(f"{rid}_0_0", 128)  # a corrupt chunk 0 waiting for the talker
    HDR.pack_into(seg.mm, 0, MAGIC, 4, 0, 1, 0, 1, b"bogus", 8, 0, 0, 8)
    seg.close()
    # The talker polls chunk 0 from the moment the request is added; the thinker's real chunk 0
    # (32 MB, which replaces a stale segment) comes only after its prefill step.
    status, raw, _ = post(server, chat_body(20, prompt_tokens=4000), rid)
    assert status == 200
    errors = [e for e in parse_sse(raw) if isinstance(e, dict) and "error" in e]
    assert errors and "stage 1 (talker): chunk 0 get failed" in errors[0]["error"]["message"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and shm_entries(rid):
        time.sleep(0.05)
    assert shm_entries(rid) == []
    assert server.health()[0] == 200  # the stage lives on
    status, raw, _ = post(server, chat_body(4), f"{TAG}-after-broken")
    check_stream(parse_sse(raw), f"{TAG}-after-broken", 3, 4)
