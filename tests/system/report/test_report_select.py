"""Runs without bench.json (a foreign client): requests selected by id prefix, arrival
window and warm-up count; and chunk waits that never ended are marked, not walked. The
builder's mark on a wait never scheduled, in process: tests/unit/test_spantable.py."""
from __future__ import annotations

import json
import subprocess
import sys

from omnitrace.conventions import Ev
from tests.support.event_fixture import EXPECTED_US, TALKER_RECV, US, three_stage_events, write_event_run


def _report(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", *args], capture_output=True,
                       text=True, timeout=60)
    assert "Traceback" not in r.stderr + r.stdout
    return r


def _two_clients(tmp_path) -> str:
    """Client a sends a0..a5 (one per ms from t=0), client b sends b0..b5 from t=20 ms:
    recorded through the rings and the agent's recorder, as a run records them."""
    script = [e for i in range(6) for e in three_stage_events(f"a{i}", off=i * 1000)]
    script += [e for i in range(6) for e in three_stage_events(f"b{i}", off=20_000 + i * 1000)]
    return write_event_run(str(tmp_path / "r"), sorted(script, key=lambda e: e[7]))


def test_requests_by_prefix_window_and_warmup(tmp_path):
    d = _two_clients(tmp_path)
    ids = lambda *a: sorted(r["id"] for r in json.loads(_report(d, "--json", *a).stdout)["requests"])
    assert ids() == sorted([f"a{i}" for i in range(6)] + [f"b{i}" for i in range(6)])
    assert ids("--requests", "b") == [f"b{i}" for i in range(6)]
    assert ids("--requests", "a", "--warmup", "2") == [f"a{i}" for i in range(2, 6)]
    # arrivals 0..10 ms after the first one: client a only; 2.5 ms on: a3 onwards and b
    assert ids("--window", "0:0.010") == [f"a{i}" for i in range(6)]  # seconds
    assert ids("--window", "0.0025:", "--requests", "a") == ["a3", "a4", "a5"]
    rep = json.loads(_report(d, "--json", "--requests", "a", "--warmup", "1").stdout)
    assert rep["window"]["selection"] == "no bench.json: ids starting 'a', first 1 excluded as warm-up"
    assert not any("warm-up not excluded" in w for w in rep["warnings"])


def test_bad_window_is_one_line_exit_2(tmp_path):
    d = _two_clients(tmp_path)
    for bad in ("10", "x:y", "5:1"):
        r = _report(d, "--window", bad)
        assert r.returncode == 2 and "--window" in r.stderr, r.stderr


def test_never_ended_wait_is_not_walked_and_counted(tmp_path):
    """An incomplete wait_schedule (a chunk the talker's receiver made ready at 210 us and
    its scheduler never took: closed at the request's last event, 1000 us, past the codec
    chunk's snapshot) would otherwise gate the talker's output: it is left out, and
    counted, with the builder's reason."""
    events = three_stage_events("w") + [(TALKER_RECV, Ev.CHUNK_READY, "w", 1, 5, 0, 0, 210)]
    d = write_event_run(str(tmp_path / "r"), sorted(events, key=lambda e: e[7]))
    rep = json.loads(_report(d, "--json").stdout)
    (req,) = rep["requests"]
    assert req["hops"] == ["0->1#0", "1->2#0"]
    got = {tuple(k.split("/", 1)): round(v * 1e6 / US) for k, v in req["categories_ms"].items()}
    names = {-1: "api", 0: "0:thinker", 1: "1:talker", 2: "2:code2wav"}
    assert got == {(names[s], c): v for (s, c), v in EXPECTED_US.items()}
    assert rep["incomplete_chunk_spans"] == {"omni.chunk.wait_schedule: consumer-never-scheduled": 1}
    assert any("omni.chunk.wait_schedule" in w for w in rep["warnings"])
