"""The reference pipeline's ``/v1/audio/speech`` with a stage killed under each streaming
kind: a raw stream is cut, an SSE one ends with an error event. The response kinds and bad
input: tests/unit/runtime/test_speech.py."""
from __future__ import annotations

import http.client
import json
import os
import signal

import pytest

from omnitrace import record
from omnitrace.conventions import Ev, Status
from tests.support.runtime_server import (
    RAW, TAG, assert_stopped_clean, fast_pipeline, Server, speech_body)


def _start(srv: Server, rid: str, extra: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("POST", "/v1/audio/speech", speech_body(500, **extra),
                 {"x-request-id": rid, "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.read1(100)  # audio is flowing
    return conn, resp


@pytest.mark.timeout(90)
def test_stage_death_cuts_a_raw_stream_and_ends_an_sse_one_with_an_error(tmp_path):
    run = f"rtt{os.getpid()}sdeath"
    srv = Server(fast_pipeline(tmp_path), env={"OMNITRACE_RUN_ID": run})
    try:
        raw_conn, raw_resp = _start(srv, f"{TAG}-sraw", {**RAW, "response_format": "pcm"})
        sse_conn, sse_resp = _start(srv, f"{TAG}-ssse", {"stream": True})
        os.kill(srv.stage_pids[1], signal.SIGKILL)
        with pytest.raises(http.client.IncompleteRead):  # no in-band error: the body is cut
            raw_resp.read()
        rest = sse_resp.read()  # must end, not hang
        assert rest.rstrip().split(b"\n\n")[-1].startswith(b"event: speech.audio.error")
        err = json.loads(rest.rstrip().split(b"\n\n")[-1].split(b"data: ", 1)[1])["error"]
        assert "stage 1 (talker) died" in err["message"] and err["partial_audio"] is True
        for c in (raw_conn, sse_conn):
            c.close()
    finally:
        out = srv.stop()
    assert "stage 1 (talker) died" in out and "Traceback" not in out, out
    ends = {}
    for name in record.discover(run):
        r = record.RingReader(name)
        ends.update({e[1]: e[4] for e in r.drain() if e[0] == Ev.REQUEST_END})
        r.close(unlink=True)
    assert ends == {f"{TAG}-sraw": Status.ERROR, f"{TAG}-ssse": Status.ERROR}
    assert_stopped_clean(srv)
