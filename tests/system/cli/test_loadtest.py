"""`omnitrace loadtest`: one command from nothing to the report, Ctrl-C at any point, and
the A/B mode on the seed scenario (scaled): real servers, real load, real reports."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.report_util import _env

SMALL = ["--concurrency", "4", "--num-prompts", "8", "--input-len", "200", "--output-len", "12"]


def _loadtest(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnitrace", "loadtest", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env())


def test_loadtest_one_command_to_the_report(tmp_path):
    d = str(tmp_path / "lt")
    r = _loadtest(["--run-dir", d, *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == d  # the run directory is the last line
    assert "Attribution of TTFP" in r.stdout
    bench = json.load(open(os.path.join(d, "bench.json")))
    assert bench["status"] == "complete"
    assert sum(1 for x in bench["requests"] if not x.get("warmup")) == 8
    assert os.path.getsize(os.path.join(d, "report.html")) > 10_000
    run = json.load(open(os.path.join(d, "run.json")))
    assert run["status"] in ("ok", "done", "completed") or run["exit_code"] == 0, run
    # the run directory is the usual one: report and compare work on it
    rep = subprocess.run([sys.executable, "-m", "omnitrace", "report", d, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0 and json.loads(rep.stdout)["window"]["attributed"] == 8


def _requests_finished(run_dir: str) -> int:
    """Requests the agent has seen end (0 until agent.json exists; it is replaced whole)."""
    try:
        with open(os.path.join(run_dir, "agent.json")) as f:
            return int(json.load(f).get("requests_freed", 0))
    except (OSError, ValueError):
        return 0


def test_loadtest_ctrl_c_leaves_a_loadable_run(tmp_path):
    d = str(tmp_path / "lt")
    # output to files, not pipes: a pipe nobody reads while we wait would fill up with
    # the progress bar and stall the load
    out_f, err_f = open(tmp_path / "out", "w+"), open(tmp_path / "err", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "loadtest", "--run-dir", d,
                             "--concurrency", "4", "--num-prompts", "5000", "--input-len", "200",
                             "--output-len", "20"], stdout=out_f, stderr=err_f,
                            text=True, env=_env(), start_new_session=True)
    try:
        # wait until the load is running: a request has gone through the whole pipeline
        # (the agent counts it in agent.json once its end is recorded), so the bench has
        # requests done and in flight. (events/ is no signal: the agent writes the first
        # segment's header before the server even answers.)
        deadline = time.monotonic() + 180
        while _requests_finished(d) < 1:
            assert proc.poll() is None and time.monotonic() < deadline, "the load never got going"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out_f.close()
        err_f.close()
    err = (tmp_path / "err").read_text()
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err and d in err and "Traceback" not in err
    rep = subprocess.run([sys.executable, "-m", "omnitrace", "report", d, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode in (0, 3), rep.stderr
    body = json.loads(rep.stdout)
    assert body["recorder"]["events"] > 0 if "events" in body["recorder"] else True
    bench = json.load(open(os.path.join(d, "bench.json")))
    assert bench["status"] == "interrupted" and bench["requests"]


def _stage_pid(run_dir: str, name: str) -> int | None:
    try:
        with open(os.path.join(run_dir, "processes.jsonl")) as f:
            return next((json.loads(ln)["pid"] for ln in f if ln.strip() and json.loads(ln).get("name") == name),
                        None)
    except (OSError, ValueError):
        return None


def test_loadtest_names_a_frozen_stage(tmp_path):
    """The thinker stopped (SIGSTOP) mid-load: one line says that no request progresses
    and names the stopped stage; once it runs again (SIGCONT), one line says so and the
    load completes. --request-timeout reaches the bench."""
    d = str(tmp_path / "lt")
    err_path = tmp_path / "err"
    thinker = None
    with open(err_path, "w") as err_f:
        proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "loadtest", "--run-dir", d,
                                 "--concurrency", "4", "--num-prompts", "60", "--input-len", "200",
                                 "--output-len", "40", "--stall-after", "2", "--request-timeout", "300"],
                                stdout=subprocess.DEVNULL, stderr=err_f, env=_env(), start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while _requests_finished(d) < 1 or (thinker := _stage_pid(d, "thinker")) is None:
                assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()[-3000:]
                time.sleep(0.1)
            os.kill(thinker, signal.SIGSTOP)
            deadline = time.monotonic() + 120
            while not _stderr_has(err_path, "no request has progressed"):
                assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()[-3000:]
                time.sleep(0.2)
            os.kill(thinker, signal.SIGCONT)
            proc.wait(timeout=300)
        finally:
            if thinker:
                os.kill(thinker, signal.SIGCONT) if os.path.exists(f"/proc/{thinker}") else None
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    err = err_path.read_text()
    assert proc.returncode == 0, err[-3000:]
    stall = [ln for ln in err.splitlines() if "no request has progressed" in ln]
    assert len(stall) == 1 and f"stage 0:thinker is stopped (pid {thinker}" in stall[0], err[-3000:]
    assert "requests progress again" in err
    bench = json.load(open(os.path.join(d, "bench.json")))
    assert bench["args"]["request_timeout"] == 300.0 and bench["args"]["stall_after"] == 2.0


def test_loadtest_ab_seed_scenario(tmp_path):
    """`--ab "--snapshot recursive" "--snapshot copy" --repeats 3`, scaled to minutes on 2
    cores: the thinker's snapshot category falls with a CI that excludes zero, and the
    per-chunk snapshot cost falls >= 10x between the arms' medians. (Two runs
    an arm were too few beside a busy core: the category fell 3.5x, but one A run's
    lower share put zero just inside the runs-level bootstrap's CI.)"""
    d = str(tmp_path / "ab")
    r = _loadtest(["--run-dir", d, "--ab", "--snapshot recursive", "--snapshot copy", "--pattern", "AB",
                   "--repeats", "3", "--concurrency", "8", "--num-prompts", "16", "--input-len", "2500",
                   "--output-len", "12"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = sorted(os.listdir(d))
    arms = ["01-A", "02-B", "03-A", "04-B", "05-A", "06-B"]
    assert [x for x in runs if x[:2].isdigit()] == arms
    res = json.load(open(os.path.join(d, "compare.json")))
    snap = next(x for x in res["rows"] if x["stage"] == "0:thinker" and x["category"] == "snapshot")
    assert snap["significant"] and snap["ci_high_ms"] < 0, snap
    verdict = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("0:thinker snapshot")]
    assert verdict and verdict[0].split()[2].startswith("-"), r.stdout
    assert os.path.getsize(os.path.join(d, "compare.html")) > 10_000
    assert r.stdout.strip().splitlines()[-1] == d
    per_chunk = {}
    for x in arms:
        rep = json.loads(subprocess.run([sys.executable, "-m", "omnitrace", "report", os.path.join(d, x),
                                         "--json"], capture_output=True, text=True, timeout=120).stdout)
        per_chunk[x] = next(s for s in rep["snapshot"] if s["stage_id"] == 0)["p50_us"]
    a, b = ([v for k, v in per_chunk.items() if k.endswith(arm)] for arm in "AB")
    # arm medians: one run's p50 is wall time, and a preempted run on a loaded machine read
    # 48 us against its siblings' 11 (every A run against every B run flipped under load)
    assert len(a) == len(b) == 3 and sorted(a)[1] >= 10 * sorted(b)[1], per_chunk


def test_loadtest_bad_input_is_one_line(tmp_path):
    for args in (["--ab", "x", "y", "--pattern", "ABC"], ["--num-prompts", "0"],
                 ["--base-url", "http://127.0.0.1:1"], ["--serve", "'unclosed"], ["--no-such-option"],
                 ["--concurrency", "0"], ["--concurrency", "8", "x"], ["--warmup", "-1"],
                 ["--request-timeout", "-5"], ["--request-timeout", "0"], ["--stall-after", "-1"],
                 ["--range-ratio", "1.5"], ["--startup-timeout", "-1"], ["--serve", "--port abc"]):
        r = _loadtest(["--run-dir", str(tmp_path / "x"), *args], timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "x")  # nothing started, nothing written


def _stderr_has(path, text: str) -> bool:
    try:
        return text in path.read_text()
    except OSError:
        return False


def _processes_named(run_dir: str, name: str) -> bool:
    try:
        with open(os.path.join(run_dir, "processes.jsonl")) as f:
            return any(json.loads(line).get("name") == name for line in f if line.strip())
    except (OSError, ValueError):
        return False


# moments in the first seconds, each by what has happened, not by a delay: the `omnitrace
# run` child just started (importing), its agent up (run.json: the server command starting
# and importing), the server's API process known to the agent (stages being spawned)
EARLY = {
    "run-starting": lambda d, err: _stderr_has(err, "omnitrace loadtest: starting"),
    "agent-up": lambda d, err: os.path.exists(os.path.join(d, "run.json")),
    "server-starting": lambda d, err: _processes_named(d, "api"),
}


@pytest.mark.parametrize("moment", list(EARLY))
def test_loadtest_ctrl_c_in_the_first_seconds(tmp_path, moment):
    """Issue 25 item 6: Ctrl-C while the children start and import: no traceback from any
    of them, exit 130, and a run.json (if the run got that far) that says interrupted,
    written by an agent that is gone when the prompt returns."""
    d = str(tmp_path / "lt")
    err_path = tmp_path / "err"
    with open(err_path, "w") as err_f:
        proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "loadtest", "--run-dir", d,
                                 *SMALL], stdout=subprocess.DEVNULL, stderr=err_f, env=_env(),
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not EARLY[moment](d, err_path):
                assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.01)
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole group
            proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    err = err_path.read_text()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "Fatal Python error" not in err, err[-3000:]
    assert "interrupted" in err
    run_json = os.path.join(d, "run.json")
    if moment != "run-starting" or os.path.exists(run_json):
        run = json.load(open(run_json))
        assert run["status"] == "interrupted", run
        assert not os.path.exists(f"/proc/{run['agent_pid']}"), "the agent outlived the prompt"


def test_loadtest_serves_on_the_port_given_in_serve(tmp_path):
    """Issue 41: `--serve "--port P"` started the server on P and waited 180 s on another
    port; now the load goes to P."""
    from tests.support.runtime_server import free_port
    d, port = str(tmp_path / "lt"), free_port()
    r = _loadtest(["--run-dir", d, "--serve", f"--port {port}", "--startup-timeout", "120", *SMALL])
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.load(open(os.path.join(d, "bench.json")))["base_url"] == f"http://127.0.0.1:{port}"
    assert json.load(open(os.path.join(d, "run.json")))["command"].count("--port") == 1


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def test_a_ctrl_c_that_reaches_the_server_first_says_interrupted(tmp_path):
    """Issue 41: a Ctrl-C during start-up that the server (`omnitrace run`) took before
    loadtest did read "server exited with status 130 before answering". The server gets
    SIGINT the moment it exists (it cannot have answered yet)."""
    d = str(tmp_path / "lt")
    proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "loadtest", "--run-dir", d, *SMALL],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.monotonic() + 120
        while not _children(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        os.kill(_children(proc.pid)[0], signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err and "exited with status" not in err and "Traceback" not in err, err


def test_loadtest_base_url_loads_a_server_it_did_not_start(tmp_path):
    """`loadtest --base-url` against an `omnitrace run` the user started: the load and the
    report, and the server left running (it is not loadtest's). 02e1249 made bench() need the
    server loadtest starts, and this path failed with a TypeError on every call."""
    from tests.support.runtime_server import free_port
    d, port = str(tmp_path / "run"), free_port()
    url = f"http://127.0.0.1:{port}"
    srv = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", d, "serve", "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        from omnitrace.bench.serve_and_bench import wait_healthy
        assert wait_healthy(url, srv, 120) is None
        r = _loadtest(["--base-url", url, "--run-dir", d, *SMALL])
        assert r.returncode == 0, r.stderr[-3000:]
        assert "Attribution of TTFP" in r.stdout
        bench = json.load(open(os.path.join(d, "bench.json")))
        assert bench["status"] == "complete" and bench["base_url"] == url
        assert sum(1 for x in bench["requests"] if not x.get("warmup")) == 8
        assert srv.poll() is None, "loadtest stopped a server it did not start"
    finally:
        srv.send_signal(signal.SIGINT)
        srv.communicate(timeout=60)
