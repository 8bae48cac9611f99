"""`omnitrace top` in a real terminal (tmux) during a real load, and on the run afterwards.

The reference pipeline runs under `omnitrace run --exporter prometheus`; `omnitrace bench`
loads it; `omnitrace top URL` runs in a tmux pane. The test reads the screen as a user
would (capture-pane), then quits with `q` and with Ctrl-C and checks the exit status.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.support.agent_util import clean_env
from tests.support.otlp_receiver import free_port
from tests.support.report_util import report_json, run_pipeline
from tests.support.system_deps import need

TMUX = shutil.which("tmux") or "tmux"



def _tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([TMUX, "-L", "omnitrace-test", *args], capture_output=True, text=True,
                          check=check, timeout=30)


def _wait(what, timeout: float = 90.0, step: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(step)
    return what()


@pytest.fixture(scope="module")
def live(tmp_path_factory, long_lived_processes):
    need("tmux", "tmux")  # the terminal the tests read
    tmp = tmp_path_factory.mktemp("top")
    port, mport = free_port(), free_port()
    run_dir = tmp / "run"
    proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(run_dir),
                             "--exporter", "prometheus", "--prometheus-port", str(mport),
                             "serve", "--port", str(port)],
                            env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "run.err", "wb"))  # noqa: SIM115 (closed with the process)
    long_lived_processes.add(proc.pid)
    bench = None

    def up() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return True
        except OSError:
            assert proc.poll() is None, (tmp / "run.err").read_text()[-2000:]
            return False
    try:
        assert _wait(up), "server did not come up"
        # steady load for the whole module: the terminal tests read it while it runs
        bench = subprocess.Popen([sys.executable, "-m", "omnitrace", "bench", "--base-url",
                                  f"http://127.0.0.1:{port}", "--concurrency", "4",
                                  "--num-prompts", "4000", "--input-len", "300", "--output-len", "40",
                                  "--no-progress", "--out", str(tmp / "bench.json")],
                                 env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        yield {"url": f"http://127.0.0.1:{mport}", "run_dir": str(run_dir), "tmp": tmp}
    finally:
        if bench is not None and bench.poll() is None:
            bench.send_signal(signal.SIGINT)
            try:
                bench.wait(30)
            except subprocess.TimeoutExpired:
                bench.kill()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
        long_lived_processes.discard(proc.pid)
        _tmux("kill-server", check=False)


def _pane_session(name: str, cmd: str, status_file: str) -> None:
    # the exit status lands in a file, so the test sees how `top` ended. The previous test
    # killed the server's last session, and a loaded tmux server can still be exiting when
    # the next one connects (new-session then fails once): try again after it is gone
    args = ("new-session", "-d", "-s", name, "-x", "120", "-y", "50", f"{cmd}; echo $? > {status_file}; sleep 30")
    for _ in range(5):
        if _tmux(*args, check=False).returncode == 0:
            return
        time.sleep(0.5)
    _tmux(*args)


def _screen(name: str) -> str:
    return _tmux("capture-pane", "-p", "-t", name, check=False).stdout


@pytest.mark.parametrize("quit_key", ["q", "C-c"])
def test_top_in_a_terminal_during_load(live, quit_key):
    status = live["tmp"] / f"status-{quit_key}"
    name = f"top-{quit_key.replace('-', '')}"
    _pane_session(name, f"{sys.executable} -m omnitrace top {live['url']} --interval 0.5", str(status))
    try:
        # requests finish under load: the attribution table and the FIFO table fill in
        def filled() -> str:
            s = _screen(name)
            return s if "0:thinker" in s and "/s in" in s and "compute" in s else ""
        screen = _wait(filled)
        assert screen, _screen(name)
        assert "TTFP      p50" in screen and "Where TTFP goes" in screen
        assert "FIFO residence per stage" in screen and "1:talker" in screen
        assert "Traceback" not in screen
        _tmux("send-keys", "-t", name, quit_key)
        assert _wait(lambda: status.exists() and status.read_text().strip(), timeout=20), _screen(name)
        assert status.read_text().strip() == "0"
        # the terminal is restored: the alternate screen is gone, the shell line is back
        assert "Where TTFP goes" not in _screen(name)
    finally:
        _tmux("kill-session", "-t", name, check=False)


def test_top_plain_tables_on_a_run_directory(live):
    # not a terminal: one plain table; a live run directory reads the agent's endpoint and
    # its agent.json (the head-of-line leaderboard)
    r = subprocess.run([sys.executable, "-m", "omnitrace", "top", live["run_dir"], "-n", "2",
                        "--interval", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("omnitrace top") == 2 and "\x1b[" not in r.stdout
    assert "last 1." in r.stdout or "last 0." in r.stdout  # the second table is a window
    assert "Where TTFP goes" in r.stdout
    # the run's event accounting as the agent knows it now (agent.json)
    line = next(x for x in r.stdout.splitlines() if x.startswith("events: "))
    assert " written = " in line and " recorded" in line, line


def test_top_bad_source_is_one_line():
    r = subprocess.run([sys.executable, "-m", "omnitrace", "top", "/nonexistent/run"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    # no agent there (issue 41: a bare "Connection refused"): which address, what to start
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "omnitrace", "top", f"http://127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"no agent answers at http://127.0.0.1:{port}/metrics" in r.stderr, r.stderr
    assert "omnitrace run --exporter prometheus" in r.stderr and "omnitrace top RUN_DIR" in r.stderr


def test_top_on_a_finished_run_in_80x24_agrees_with_the_report(tmp_path):
    need("tmux", "tmux")
    run_dir = str(tmp_path / "run")
    run_pipeline(run_dir, ["--concurrency", "4", "--num-prompts", "12", "--input-len", "200",
                           "--output-len", "30", "--seed", "3"])
    rep = report_json(run_dir)
    status = tmp_path / "status"
    _tmux("new-session", "-d", "-s", "top-done", "-x", "80", "-y", "24",
          f"{sys.executable} -m omnitrace top {run_dir}; echo $? > {status}; sleep 30")
    try:
        screen = _wait(lambda: (lambda s: s if "(q quits)" in s else "")(_screen("top-done")), timeout=60)
        assert screen, _screen("top-done")
        lines = screen.splitlines()
        assert lines[0].startswith("omnitrace top") and "whole run" in lines[0]  # the header stays
        assert f"{rep['window']['measured']} measured" in screen
        p50 = float(next(x for x in lines if x.startswith("TTFP")).split()[2])
        assert abs(p50 - rep["ttfp"]["server_ms"]["p50"]) <= 0.01 * rep["ttfp"]["server_ms"]["p50"]
        assert "0:thinker" in screen and "FIFO residence per stage" in screen and "Head-of-line" in screen
        _tmux("send-keys", "-t", "top-done", "q")
        assert _wait(lambda: status.exists() and status.read_text().strip(), timeout=20)
        assert status.read_text().strip() == "0"
    finally:
        _tmux("kill-session", "-t", "top-done", check=False)
        _tmux("kill-server", check=False)
