"""The launcher's side of the agent's stdout protocol, against real child processes."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from omnitrace.runner import agents


def _child(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_ready_written_with_standby_in_one_write_is_seen_at_once(monkeypatch) -> None:
    """A spare told to take over before its imports were done prints STANDBY and READY
    back to back; both reach the pipe before the launcher reads. READY must be seen then,
    not at the deadline (the pipe's buffered readline read it ahead of select())."""
    monkeypatch.setattr(agents, "AGENT_READY_TIMEOUT_S", 20.0)
    child = _child("import sys, time\n"
                   "sys.stdout.write('STANDBY\\nREADY {\"pid\": 7}\\n'); sys.stdout.flush()\n"
                   "time.sleep(60)")
    try:
        time.sleep(0.5)  # both lines in the pipe before the first read
        t0 = time.monotonic()
        got = agents._ready(child)
        assert got is child and child.info == {"pid": 7}
        assert time.monotonic() - t0 < 5.0
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("script, timeout_s, said", [
    ("import time; time.sleep(60)", 1.0, "did not start in time"),
    # its end of file ends the wait, long before the deadline, however slow its start
    ("import sys; print('STANDBY', flush=True); sys.exit(2)", 60.0, ""),
])
def test_ready_gives_up_on_a_silent_or_exiting_agent(monkeypatch, capsys, script, timeout_s, said) -> None:
    monkeypatch.setattr(agents, "AGENT_READY_TIMEOUT_S", timeout_s)
    child = _child(script)
    assert agents._ready(child) is None
    assert child.poll() is not None
    err = capsys.readouterr().err
    assert (said in err) if said else "did not start" not in err
