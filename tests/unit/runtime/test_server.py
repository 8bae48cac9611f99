"""The reference pipeline over real HTTP with real stage processes and real shared memory."""
from __future__ import annotations

import asyncio
import base64
import collections
import http.client
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave

import aiohttp
import pytest
import yaml

from omnitrace import record
from omnitrace.conventions import Ev, Modality, Status
from omnitrace.runtime import config
from tests.support.runtime_server import assert_stopped_clean, chat_body, fast_pipeline, free_port, Server, SHM, shm_entries, TAG


# --------------------------------------------------------------------------- helpers


def post(srv: Server, body: bytes, rid: str | None = None, timeout: float = 60) -> tuple[int, bytes, dict]:
    headers = {"Content-Type": "application/json"}
    if rid:
        headers["x-request-id"] = rid
    req = urllib.request.Request(srv.url + "/v1/chat/completions", body, headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def parse_sse(raw: bytes) -> list[dict | str]:
    """Split like vLLM's StreamedResponseHandler: blank-line messages, `data: ` prefix."""
    out: list[dict | str] = []
    for msg in raw.decode().split("\n\n"):
        msg = msg.strip()
        if not msg or msg.startswith(":"):
            continue
        assert msg.startswith("data: "), msg[:80]
        payload = msg[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def check_stream(events: list, rid: str, prompt_tokens: int, max_tokens: int) -> tuple[str, int, float]:
    """Validate what vLLM-Omni's bench client reads; returns (text, audio packets, seconds)."""
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all("error" not in c for c in chunks), [c for c in chunks if "error" in c]
    text, completion, params, audio, seconds = "", 0, None, 0, 0.0
    for c in chunks:
        assert c["id"] == rid and c["object"] == "chat.completion.chunk"
        assert c["modality"] in ("text", "audio")  # top level, on every chunk
        u = c["usage"]  # on every chunk
        assert u["prompt_tokens"] == prompt_tokens and u["completion_tokens"] >= completion
        completion = u["completion_tokens"]
        content = c["choices"][0]["delta"]["content"]
        if c["modality"] == "text":
            text += content
        else:
            with wave.open(io.BytesIO(base64.b64decode(content)), "rb") as w:  # a complete WAV
                p = (w.getnchannels(), w.getsampwidth(), w.getframerate())
                assert params in (None, p)
                params = p
                assert w.getnframes() > 0
                seconds += w.getnframes() / w.getframerate()
            audio += 1
    assert completion == max_tokens  # exact output length (ignore_eos semantics)
    assert len(text.split()) == max_tokens
    assert audio >= 1 and params == (1, 2, 24000)
    return text, audio, seconds


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(fast_pipeline(tmp_path_factory.mktemp("rt")))
    yield srv
    srv.stop()
    assert_stopped_clean(srv)


# --------------------------------------------------------------------------- tests
@pytest.mark.unit
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


@pytest.mark.unit
@pytest.mark.timeout(60)
def test_prompt_tokens_field_and_generated_id(server):
    status, raw, headers = post(server, chat_body(3, omnitrace_prompt_tokens=2500))
    assert status == 200
    rid = headers["x-request-id"]
    assert rid.startswith("chatcmpl-")
    check_stream(parse_sse(raw), rid, 2500, 3)
    status, raw, _ = post(server, chat_body(3, prompt_tokens=7), f"{TAG}-pt")
    check_stream(parse_sse(raw), f"{TAG}-pt", 7, 3)


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
def test_oversized_body_is_413_as_json(server):
    from omnitrace.runtime.api import MAX_BODY_BYTES
    status, raw, headers = post(server, b"{" + b" " * MAX_BODY_BYTES + b"}", f"{TAG}-big")
    assert status == 413, raw[:200]
    assert headers.get("Content-Type", "").startswith("application/json")
    assert "larger than" in json.loads(raw)["error"]["message"]


@pytest.mark.unit
@pytest.mark.timeout(60)
def test_bad_request_id_and_duplicates(server):
    status, raw, _ = post(server, chat_body(2), "bad/id")
    assert status == 400 and "x-request-id" in json.loads(raw)["error"]["message"]
    # the server still serves afterwards
    status, raw, _ = post(server, chat_body(2), f"{TAG}-after-bad")
    check_stream(parse_sse(raw), f"{TAG}-after-bad", 3, 2)


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.timeout(90)
def test_sigint_with_requests_in_flight_stops_everything(tmp_path):
    srv = Server(fast_pipeline(tmp_path), "--shm", "pool", "--snapshot", "recursive")
    rid = f"{TAG}-pool"
    status, raw, _ = post(srv, chat_body(30, prompt_tokens=1000), rid)
    check_stream(parse_sse(raw), rid, 1000, 30)
    assert shm_entries(f"ortpool{srv.proc.pid}@"), "pool mode keeps reusable segments"

    conns = []
    for i in range(4):  # leave requests mid-stream when the signal comes
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        c.request("POST", "/v1/chat/completions", chat_body(500, prompt_tokens=800),
                  {"x-request-id": f"{TAG}-sig{i}", "Content-Type": "application/json"})
        r = c.getresponse()
        r.read1(100)
        conns.append((c, r))
    out = srv.stop(signal.SIGINT)
    assert "stopping" in out
    for c, r in conns:
        rest = r.read()
        assert b"server shutting down" in rest or rest == b""
        c.close()
    assert srv.proc.returncode == 0
    assert_stopped_clean(srv)


@pytest.mark.timeout(60)
def test_api_killed_stages_exit_and_clean_up(tmp_path):
    """Even a SIGKILLed API server takes its stages down (PDEATHSIG) and they unlink their chunks."""
    srv = Server(fast_pipeline(tmp_path), "--shm", "pool")
    conns = []
    for i in range(3):
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        c.request("POST", "/v1/chat/completions", chat_body(500, prompt_tokens=1500),
                  {"x-request-id": f"{TAG}-kill{i}", "Content-Type": "application/json"})
        c.getresponse().read1(100)
        conns.append(c)
    srv.proc.kill()
    srv.proc.communicate()
    for c in conns:
        c.close()
    assert_stopped_clean(srv)


@pytest.mark.timeout(90)
def test_stage_death_ends_requests_with_error(tmp_path):
    run = f"rtt{os.getpid()}death"
    srv = Server(fast_pipeline(tmp_path), env={"OMNITRACE_RUN_ID": run})
    try:
        rid = f"{TAG}-death"
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", chat_body(500),
                     {"x-request-id": rid, "Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read1(100)
        talker = srv.stage_pids[1]
        os.kill(talker, signal.SIGKILL)
        rest = resp.read()  # must end, not hang
        conn.close()
        events = parse_sse(rest.split(b"\n\n", 1)[1] if not rest.startswith(b"data") else rest)
        errors = [e for e in events if isinstance(e, dict) and "error" in e]
        assert errors and "stage 1 (talker) died" in errors[0]["error"]["message"]
        status, health = srv.health()
        assert status == 503 and "stage 1 (talker) died" in health["error"]
        status, raw, _ = post(srv, chat_body(3), f"{TAG}-after-death")
        assert status == 503 and "talker" in json.loads(raw)["error"]["message"]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and shm_entries(rid):
            time.sleep(0.05)
        assert shm_entries(rid) == []
    finally:
        out = srv.stop()
    assert "stage 1 (talker) died" in out
    died = []
    for name in record.discover(run):
        r = record.RingReader(name)
        died += [e for e in r.drain() if e[0] == Ev.STAGE_DIED]
        r.close(unlink=True)
    assert [(e[2]) for e in died] == [1]  # STAGE_DIED, stage = the dead stage
    assert_stopped_clean(srv)


@pytest.mark.timeout(120)
def test_torch_compute_stage(tmp_path):
    pytest.importorskip("torch")
    d = yaml.safe_load(open(fast_pipeline(tmp_path)))
    d["stages"][0].update(compute="torch", torch_hidden=64)
    path = tmp_path / "torch.yaml"
    path.write_text(yaml.safe_dump(d))
    srv = Server(str(path))
    try:
        rid = f"{TAG}-torch"
        status, raw, _ = post(srv, chat_body(8), rid)
        check_stream(parse_sse(raw), rid, 3, 8)
    finally:
        srv.stop()
    assert_stopped_clean(srv)


@pytest.mark.timeout(30)
def test_omnitrace_serve_command_help():
    p = subprocess.run([sys.executable, "-m", "omnitrace", "serve", "--help"], capture_output=True,
                       text=True, timeout=20)
    assert p.returncode == 0
    for flag in ("--host", "--port", "--pipeline", "--snapshot", "--shm"):
        assert flag in p.stdout


@pytest.mark.timeout(90)
def test_hook_sites_recorded(tmp_path):
    run = f"rtt{os.getpid()}hooks"
    srv = Server(fast_pipeline(tmp_path), env={"OMNITRACE_RUN_ID": run})
    rid = f"{TAG}-hooks"
    try:
        status, raw, _ = post(srv, chat_body(30, prompt_tokens=100), rid)
        check_stream(parse_sse(raw), rid, 100, 30)
    finally:
        srv.stop()
    # records: (role, stage, thread, kind, request, stage, chunk, a, b, t)
    events, procs = [], {}
    for name in record.discover(run):
        r = record.RingReader(name)
        h = r.header()
        procs[(h.role, h.stage)] = h.process
        events += [(h.role, h.stage, h.thread) + e for e in r.drain()]
        r.close(unlink=True)
    assert procs[("api", -1)] == "api"
    assert [procs[("stage", i)] for i in range(3)] == ["thinker", "talker", "code2wav"]
    mine = [e for e in events if e[4] in (rid, "")]
    kinds = collections.Counter((e[1], e[2], Ev(e[3]).name) for e in mine)
    for k in ("REQUEST_ARRIVE", "REQUEST_DISPATCH", "REQUEST_FIRST_TEXT", "REQUEST_FIRST_AUDIO", "REQUEST_END"):
        assert kinds[(-1, "MainThread", k)] == 1, k
    arrive = next(e for e in mine if e[3] == Ev.REQUEST_ARRIVE)
    assert (arrive[7], arrive[8]) == (100, 30)
    end = next(e for e in mine if e[3] == Ev.REQUEST_END)
    assert end[7] == Status.OK and end[8] > 0
    for sid in range(3):
        for k in ("STAGE_ADD", "STAGE_SCHEDULE", "STAGE_FINISH", "STEP_BEGIN", "STEP_END"):
            assert kinds[(sid, "MainThread", k)] >= 1, (sid, k)
    assert kinds[(0, "MainThread", "STAGE_EMIT")] == 30  # one text token per step
    # producer side: every step of stage 0 and 1 snapshots and enqueues; the sender dequeues
    # every task; the talker puts only at codec boundaries (PROCESS_END a=0 otherwise).
    assert kinds[(0, "MainThread", "FIFO_ENQUEUE")] == 30 == kinds[(0, "sender", "PUT_END")]
    assert kinds[(1, "MainThread", "FIFO_ENQUEUE")] == 60 == kinds[(1, "sender", "FIFO_DEQUEUE")]
    assert kinds[(1, "sender", "PUT_END")] == 4  # after 4, 29, 54 frames + terminal at 60

    def keyed(kind, stage, thread):
        return collections.Counter(e[6] for e in mine if e[3] == kind and e[1] == stage and e[2] == thread)

    for sid in (0, 1):
        assert keyed(Ev.FIFO_ENQUEUE, sid, "MainThread") == keyed(Ev.FIFO_DEQUEUE, sid, "sender")
        assert keyed(Ev.SNAPSHOT_END, sid, "MainThread") == keyed(Ev.FIFO_ENQUEUE, sid, "MainThread")
    # the same chunk index at producer (PUT) and consumer (GET, READY, SCHEDULED)
    for prod, cons in ((0, 1), (1, 2)):
        puts = {e[6]: e for e in mine if e[3] == Ev.PUT_END and e[1] == prod}
        gets = {e[6]: e for e in mine if e[3] == Ev.GET_END and e[1] == cons}
        sched = {e[6] for e in mine if e[3] == Ev.CHUNK_SCHEDULED and e[1] == cons}
        assert set(puts) == set(gets) == sched == set(range(len(puts)))
        assert all(puts[c][7] == gets[c][7] for c in puts)  # bytes
        assert all(puts[c][8] == cons and gets[c][8] == prod for c in puts)
    assert next(e for e in mine if e[3] == Ev.PUT_END and e[1] == 0 and e[6] == 0)[7] == 100 * 8192
    emits = [e for e in mine if e[3] == Ev.STAGE_EMIT and e[1] == 2]
    assert [e[7] for e in emits] == list(range(4)) and all(e[8] == Modality.AUDIO for e in emits)
    assert not [n for n in os.listdir(SHM) if n.startswith(f"omnitrace.{run}.")]
    assert_stopped_clean(srv)


@pytest.mark.timeout(30)
def test_invalid_pipeline_is_one_line_before_any_process(tmp_path):
    d = yaml.safe_load(open(config.DEFAULT_PIPELINE))
    d["stages"][1]["max_batch_size"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(d))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "omnitrace.cli.serve", "--pipeline", str(bad),
                        "--port", str(free_port())], capture_output=True, text=True, timeout=20)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert lines == ["omnitrace serve: error: stages[1].max_batch_size: must be a positive integer, got 0"]
    assert time.monotonic() - t0 < 10
    p = subprocess.run([sys.executable, "-m", "omnitrace", "serve", "--pipeline", str(tmp_path / "nope.yaml")],
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 2 and "cannot read pipeline config" in p.stderr and len(p.stderr.strip().splitlines()) == 1
