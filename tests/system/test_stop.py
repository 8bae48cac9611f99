"""Every way a run can stop: a signal to `omnitrace loadtest` or `omnitrace run` (a plain
`kill`, not a terminal's group-wide Ctrl-C), or either of them SIGKILLed. Each leaves no
process of the run (checked by pid, from /proc, not from omnitrace's files), nothing of it
in /dev/shm, a run.json whose status says what happened, and a report that says it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.proctree import alive, cmdline, descendants, json_or_empty
from tests.support.report_util import _env

LONG = ["--concurrency", "4", "--num-prompts", "5000", "--input-len", "200", "--output-len", "20"]


def _start_loadtest(tmp_path, d: str, *load: str) -> tuple[subprocess.Popen, object]:
    err = open(tmp_path / "err", "w")  # a file: a pipe nobody reads would stall the load
    proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "loadtest", "--run-dir", d, *LONG, *load,
                             "--no-html"], stdout=err, stderr=err, env=_env(), start_new_session=True)
    return proc, err


def _until_loaded(proc: subprocess.Popen, d: str, tmp_path) -> None:
    """Until requests are going through the whole pipeline (the agent saw some end)."""
    deadline = time.monotonic() + 180
    while int(json_or_empty(os.path.join(d, "agent.json")).get("requests_freed", 0)) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()[-3000:]
        time.sleep(0.2)


def _gone(pids: set[int], timeout_s: float = 60) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def _shm_of(run_id: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if run_id in n]


def _stopped(proc: subprocess.Popen, tree: set[int], tmp_path, d: str) -> tuple[dict, str]:
    try:
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = (tmp_path / "err").read_text()
    assert not _gone(tree), (f"left running: {sorted(alive(tree))}", err[-3000:])
    run = json_or_empty(os.path.join(d, "run.json"))
    assert run.get("run_id") and _shm_of(run["run_id"]) == [], _shm_of(run.get("run_id", "?"))
    assert "Traceback" not in err, err[-3000:]
    return run, err


def _report(d: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "omnitrace", "report", d, "--json"], capture_output=True,
                       text=True, timeout=180, env=_env())
    assert r.returncode in (0, 1, 3) and r.stdout, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("sig, run_status, bench_status", [
    # the run's status is the user's signal, not the planned stop loadtest would have sent
    (signal.SIGTERM, "terminated", "terminated"),
    (signal.SIGHUP, "hangup", "hangup"),
    # `kill -INT` of loadtest alone, not a terminal's Ctrl-C to the group: passed on (it
    # left the load running to its end and the server until a 120-s timeout)
    (signal.SIGINT, "interrupted", "interrupted"),
])
def test_a_plain_kill_of_loadtest_stops_the_whole_run(tmp_path, sig, run_status, bench_status):
    d = str(tmp_path / "lt")
    proc, err = _start_loadtest(tmp_path, d)
    try:
        _until_loaded(proc, d, tmp_path)
        tree = descendants(proc.pid)
        assert len(tree) >= 6, tree  # run, agent, server, its stages, bench
        os.kill(proc.pid, sig)  # loadtest alone, as `kill PID` does
        run, out = _stopped(proc, tree, tmp_path, d)
    finally:
        err.close()
    assert proc.returncode == 128 + sig, out[-3000:]
    assert run["status"] == run_status, run
    bench = json_or_empty(os.path.join(d, "bench.json"))
    assert bench["status"] == bench_status and bench["requests"], bench.get("status")
    rep = _report(d)
    assert rep["recorder"]["accounting"]["closes"], rep["recorder"]["accounting"]


def test_loadtest_sigkilled_takes_its_children_with_it(tmp_path):
    """Nothing can run in loadtest then: its children are bound to it (a parent-death
    signal) and stop as on a hangup; the server's record ends complete."""
    d = str(tmp_path / "lt")
    proc, err = _start_loadtest(tmp_path, d)
    try:
        _until_loaded(proc, d, tmp_path)
        tree = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        run, _ = _stopped(proc, tree, tmp_path, d)
    finally:
        err.close()
    assert run["status"] == "hangup", run
    assert json_or_empty(os.path.join(d, "bench.json"))["status"] == "hangup"
    assert _report(d)["recorder"]["accounting"]["closes"]


@pytest.mark.parametrize("load", [(), ("--request-rate", "10")], ids=["closed-loop", "open-loop"])
def test_omnitrace_run_sigkilled_mid_load(tmp_path, load):
    """The launcher SIGKILLed under a running load: the server stops (it is bound to its
    launcher), the agent records it to its end and says launcher-killed, no event is lost
    unexplained, and loadtest says the server stopped. An open loop's bench is stopped
    with it (its 500-s schedule would outlast the wait)."""
    d = str(tmp_path / "lt")
    proc, err = _start_loadtest(tmp_path, d, *load)
    try:
        _until_loaded(proc, d, tmp_path)
        tree = descendants(proc.pid)
        run_pid = next(p for p in tree if b"omnitrace\x00run\x00" in cmdline(p))
        os.kill(run_pid, signal.SIGKILL)
        run, out = _stopped(proc, tree, tmp_path, d)
    finally:
        err.close()
    assert run["status"] == "launcher-killed", run
    assert proc.returncode == 1 and "the server (omnitrace run) stopped during the load" in out, out[-3000:]
    rep = _report(d)
    acc = rep["recorder"]["accounting"]
    assert acc["closes"] and acc["lost"] == 0, acc
    assert any("launcher-killed" in w for w in rep["warnings"]), rep["warnings"]
    if load:  # stopped by loadtest, not run to its schedule's end
        assert json_or_empty(os.path.join(d, "bench.json"))["status"] == "terminated"


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, "terminated"), (signal.SIGINT, "interrupted"),
                                         (signal.SIGHUP, "hangup")])
def test_a_signal_to_omnitrace_run_is_its_status(tmp_path, sig, status):
    """`omnitrace run serve` signalled alone (not its group): the server stops cleanly,
    every process of the run ends, and run.json names the signal."""
    from omnitrace.bench.serve_and_bench import free_port, wait_healthy
    d, port = str(tmp_path / "r"), free_port()
    with open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", d, "serve", "--port",
                                 str(port)], stdout=err, stderr=err, env=_env(), start_new_session=True)
        try:
            assert wait_healthy(f"http://127.0.0.1:{port}", proc, 180) is None, (tmp_path / "err").read_text()
            tree = descendants(proc.pid)
            os.kill(proc.pid, sig)
            run, out = _stopped(proc, tree, tmp_path, d)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert run["status"] == status and status in out, (run, out[-2000:])
