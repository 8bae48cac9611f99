"""The reference pipeline over real HTTP with real stage processes and real shared memory."""
from __future__ import annotations

import collections
import http.client
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from omnitrace import record
from omnitrace.conventions import Ev, Modality, Status
from omnitrace.runtime import config
from tests.support.runtime_server import (
    SHM, TAG, assert_stopped_clean, chat_body, check_stream, fast_pipeline, free_port, parse_sse,
    post, Server, shm_entries)


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
