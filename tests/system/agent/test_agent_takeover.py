"""A dead agent is replaced: SIGKILL of the agent under a c=16 load on the reference
pipeline. A successor takes over its rings and event log; what the hook sites wrote after
it took over is recorded (counted from the rings' own headers, which the writers keep,
against the event log), and the report shows the gap with its times."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from omnitrace import eventlog, record
from tests.support.proctree import alive, json_or_empty
from tests.support.report_util import _env


def _written(run_id: str) -> dict[str, int]:
    """Each live ring of the run: the events its writer wrote so far (its header)."""
    out = {}
    for name in record.discover(run_id):
        try:
            reader = record.RingReader(name)
        except (OSError, ValueError):
            continue
        try:
            out[name] = reader.header().events_written
        finally:
            reader.close()
    return out


def test_agent_killed_under_load_is_replaced_and_records_what_follows(tmp_path):
    d = str(tmp_path / "lt")
    with open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "loadtest", "--run-dir", d, "--concurrency",
                                 "16", "--num-prompts", "320", "--input-len", "300", "--no-html"],
                                stdout=err, stderr=err, env=_env(), start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while int(json_or_empty(os.path.join(d, "agent.json")).get("requests_freed", 0)) < 16:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()[-3000:]
                time.sleep(0.1)
            run = json_or_empty(os.path.join(d, "run.json"))
            old = run["agent_pid"]
            os.kill(old, signal.SIGKILL)
            killed = time.monotonic()
            while json_or_empty(os.path.join(d, "run.json")).get("agent_pid") in (old, None):
                assert time.monotonic() - killed < 30, "no agent took over"
                time.sleep(0.01)
            took_over = time.monotonic() - killed
            at_takeover = _written(run["run_id"])  # after the successor's start: a lower bound
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "err").read_text()
    assert proc.returncode == 0 and "took over its rings" in out, out[-3000:]
    assert not alive({old})
    run = json_or_empty(os.path.join(d, "run.json"))
    assert run["status"] == "complete" and len(run["agent_restarts"]) == 1, run
    gap = run["agent_restarts"][0]
    # the successor's start, from the run's own stamps; this test saw it within `took_over`
    assert gap["new_pid"] == run["agent_pid"] and gap["restarted_unix_ns"] >= gap["noticed_unix_ns"]
    # every ring live at the takeover: its final count (the ACCOUNT block) minus the count
    # then, against the events of that ring in the log stamped after the takeover
    log = eventlog.read_event_log(d)
    idx = {info["name"]: i for i, info in log.rings.items()}
    after_written = sum(int(log.accounts[idx[n]]["events_written"]) - w for n, w in at_takeover.items())
    after_recorded = 0
    for name in at_takeover:
        ev = log.events[log.events["ring"] == idx[name]]
        after_recorded += int((ev["t"] >= gap["restarted_unix_ns"]).sum())
    assert after_written > 1000, after_written
    assert after_recorded >= 0.99 * after_written, (after_recorded, after_written, took_over)
    rep = json.loads(subprocess.run([sys.executable, "-m", "omnitrace", "report", d, "--json"],
                                    capture_output=True, text=True, timeout=180, env=_env()).stdout)
    acc = rep["recorder"]["accounting"]
    assert acc["closes"] and acc["agent_died"], acc
    assert any("took over its rings" in w for w in rep["warnings"]), rep["warnings"]
    print(f"takeover seen after {took_over:.2f} s; {after_recorded}/{after_written} events after it recorded")
