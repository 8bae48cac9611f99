"""Fault injection: every event a hook site writes is accounted for, whatever breaks.

Each test breaks one thing for real (a full ring, the size cap, the agent SIGKILLed at
three moments, a segment cut at 10/50/90 %, a full disk: a real 2 MiB tmpfs) and checks the
report's accounting identity against a count omnitrace does not make: the number of
``record`` calls the writer made. The identity must close to the event, with the loss
named where the user looks (the report's header and warnings, ``omnitrace export``).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

from tests.support.agent_util import WRITER, omnitrace_run, read_json

# A writer of exactly N events (random payloads: they do not compress away), a new request
# id every 50 (string records between them), paced so a default ring never fills; it
# SIGKILLs the run's agent just before event KILL_AT (-1: never) and then waits a moment.
EMITTER = textwrap.dedent("""
    import json, os, random, signal, sys, time
    from omnitrace import record
    n, kill_at, run_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    def kill_agent():
        pid = json.load(open(os.path.join(run_dir, "run.json")))["agent_pid"]
        os.kill(pid, signal.SIGKILL)
        time.sleep(1.5)  # `omnitrace run` notices while the command still runs
    for i in range(n):
        if i == kill_at:
            kill_agent()
        record.emit(200 + i % 3, f"r{i // 50}", 0, a=random.getrandbits(62))  # kinds no span reads
        if i % 2000 == 1999:
            time.sleep(0.005)
    if kill_at == n:
        kill_agent()
""")


def _calls(r: int, c: int) -> int:
    """record() calls pipeline_writer makes for r requests and c chunks."""
    return 12 * r + 12 * c * r


def _emit(run_dir, n: int, kill_at: int = -1, *extra: str) -> subprocess.CompletedProcess:
    return omnitrace_run(["--run-dir", str(run_dir), "--run-id", f"fault-{uuid.uuid4().hex[:8]}", *extra,
                          "--", sys.executable, "-c", EMITTER, str(n), str(kill_at), str(run_dir)],
                         timeout=180)


def _report(run_dir) -> tuple[dict, str]:
    """The report's accounting (--json) and its console text."""
    cmd = [sys.executable, "-m", "omnitrace", "report", str(run_dir)]
    js = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    txt = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    for r in (js, txt):
        assert r.returncode in (0, 3), r.stderr  # 3: no measured request (no bench here)
        assert "Traceback" not in r.stderr, r.stderr
    rep = json.loads(js.stdout)
    return rep, txt.stdout


def _assert_closes(acc: dict, written: int) -> None:
    """The identity, term by term, against the writer's own count."""
    assert acc["known"] and acc["events_written"] == written, acc
    assert (acc["recorded"] + acc["dropped_in_rings"] + acc["never_drained"] + acc["not_recorded"]
            + acc["lost"]) == written, acc
    assert acc["closes"] and acc["lost"] >= 0, acc


def test_a_clean_run_records_every_event_written(tmp_path) -> None:
    d = tmp_path / "run"
    res = omnitrace_run(["--run-dir", str(d), "--", sys.executable, WRITER, str(tmp_path / "w.json"),
                         "--requests", "6", "--chunks", "4"])
    assert res.returncode == 0, res.stderr
    rep, txt = _report(d)
    acc = rep["recorder"]["accounting"]
    _assert_closes(acc, _calls(6, 4))
    assert acc["recorded"] == _calls(6, 4) and acc["lost"] == 0
    assert f"events: {_calls(6, 4)} written = {_calls(6, 4)} recorded (100.0% recorded)" in txt
    assert read_json(str(d), "agent.json")["accounting"]["events_written"] == _calls(6, 4)


def test_full_rings_counted_exactly(tmp_path) -> None:
    d = tmp_path / "run"
    res = omnitrace_run(["--run-dir", str(d), "--ring-records", "64", "--", sys.executable, WRITER,
                         str(tmp_path / "w.json"), "--requests", "4", "--chunks", "20", "--put-sleep-ms", "0"])
    assert res.returncode == 0, res.stderr
    rep, txt = _report(d)
    acc = rep["recorder"]["accounting"]
    _assert_closes(acc, _calls(4, 20))
    assert acc["dropped_in_rings"] > 0 and acc["lost"] == 0
    assert rep["recorder"]["dropped"] == acc["dropped_in_rings"]
    assert "dropped in rings (full)" in txt


def test_size_cap_counted_as_not_recorded(tmp_path) -> None:
    d = tmp_path / "run"
    res = omnitrace_run(["--run-dir", str(d), "--max-run-bytes", "1k", "--", sys.executable, WRITER,
                         str(tmp_path / "w.json"), "--requests", "40", "--chunks", "20"])
    assert res.returncode == 0, res.stderr
    rep, txt = _report(d)
    acc = rep["recorder"]["accounting"]
    _assert_closes(acc, _calls(40, 20))
    assert acc["not_recorded"] > 0 and acc["not_recorded_why"] == "max-run-bytes" and acc["lost"] == 0
    assert "not recorded (max-run-bytes)" in txt


@pytest.mark.parametrize("moment", ["before-any-event", "mid-run", "after-the-last-event"])
def test_agent_sigkill_accounted_at_every_moment(tmp_path, moment) -> None:
    """The agent SIGKILLed before the first event, halfway, after the last: the command
    goes on; `omnitrace run` says so when it happens; whatever the agent had read and
    not written is the identity's loss, named "agent died"."""
    n = 20_000
    kill_at = {"before-any-event": 0, "mid-run": n // 2, "after-the-last-event": n}[moment]
    d = tmp_path / "run"
    res = _emit(d, n, kill_at, "--agent-restarts", "0")  # no successor: what is lost is counted
    assert res.returncode == 0, res.stderr
    assert "the agent (pid" in res.stderr and "died (signal 9) while the command runs" in res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    run = read_json(str(d), "run.json")
    assert run["status"] == "agent-killed" and run["exit_code"] == 0  # the command's status
    rep, txt = _report(d)
    acc = rep["recorder"]["accounting"]
    _assert_closes(acc, n)
    assert acc["agent_died"] and acc["never_drained"] == run["events_never_drained"]
    if moment == "before-any-event":
        assert acc["recorded"] == 0 and acc["never_drained"] == n
    assert "THE AGENT DIED" in " ".join(rep["warnings"]) or acc["never_drained"] == 0
    assert "written =" in txt
    assert not (d / ".omnitrace-reserve").exists()


# The writer above, SIGKILLing the agent at event KILL_AT, then waiting (up to 30 s) until
# another agent has taken over (run.json's agent_pid changes), then writing the rest with
# kind 201: events it knows were written after the successor started.
TAKEOVER = EMITTER.replace("""    time.sleep(1.5)  # `omnitrace run` notices while the command still runs""", """
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if json.load(open(os.path.join(run_dir, "run.json")))["agent_pid"] != pid:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.01)""").replace("record.emit(200 + i % 3,", "record.emit(200 if i < kill_at else 201,")


@pytest.mark.parametrize("moment", ["before-any-event", "mid-run"])
def test_a_killed_agent_is_replaced_and_records_what_follows(tmp_path, moment) -> None:
    """The agent SIGKILLed: another takes over its rings and its event log; every event
    written after it took over is recorded (the writer's own count), the identity closes
    (a loss only as "agent died"), the run ends complete with the gap in run.json."""
    from omnitrace import eventlog
    n = 20_000
    kill_at = {"before-any-event": 0, "mid-run": n // 2}[moment]
    d = tmp_path / "run"
    res = omnitrace_run(["--run-dir", str(d), "--run-id", f"takeover-{uuid.uuid4().hex[:8]}", "--",
                         sys.executable, "-c", TAKEOVER, str(n), str(kill_at), str(d)], timeout=180)
    assert res.returncode == 0 and "took over its rings" in res.stderr, res.stderr
    run = read_json(str(d), "run.json")
    assert run["status"] == "complete" and len(run["agent_restarts"]) == 1, run
    gap = run["agent_restarts"][0]
    assert gap["restarted_unix_ns"] - gap["noticed_unix_ns"] < 5e9, gap
    log = eventlog.read_event_log(str(d))
    assert int((log.events["kind"] == 201).sum()) == n - kill_at  # all of them, decoded
    rep, txt = _report(d)
    acc = rep["recorder"]["accounting"]
    _assert_closes(acc, n)
    assert acc["recorded"] >= n - kill_at
    assert "took over its rings" in " ".join(rep["warnings"]) and "written =" in txt


TORN_EVENTS = 20_000


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One clean run of TORN_EVENTS events, cut three ways by the test below."""
    d = tmp_path_factory.mktemp("whole") / "run"
    res = _emit(d, TORN_EVENTS)
    assert res.returncode == 0, res.stderr
    return d


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9])
def test_torn_segment_loss_counted_exactly(tmp_path, finished_run, keep) -> None:
    """A segment cut to 10/50/90 % of its bytes: what is gone is the identity's loss (the
    count comes from the rings, not from what is left), named in the report and by
    `omnitrace export`."""
    n = TORN_EVENTS
    d = tmp_path / f"cut-{int(keep * 100)}"
    shutil.copytree(finished_run, d)
    seg = sorted((d / "events").iterdir())[-1]
    data = seg.read_bytes()
    seg.write_bytes(data[:int(len(data) * keep)])
    rep, txt = _report(d)
    acc = rep["recorder"]["accounting"]
    _assert_closes(acc, n)
    assert acc["lost"] > 0 and acc["lost_why"] == "torn segment" and acc["recorded"] < n
    assert f"{acc['lost']} events lost (torn segment)" in " ".join(rep["warnings"])
    ex = subprocess.run([sys.executable, "-m", "omnitrace", "export", str(d), "--otlp-json",
                         str(tmp_path / "x.jsonl")], capture_output=True, text=True, timeout=120)
    assert ex.returncode == 0 and f"{acc['lost']} lost (torn segment)" in ex.stderr, ex.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A real 2 MiB tmpfs (root only: mounting needs CAP_SYS_ADMIN)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or 'not root'}): the disk-full "
                    "case needs one")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_keeps_the_command_going_and_counts_what_was_not_written(tmp_path, small_disk) -> None:
    """The run directory's disk fills up mid-run: one line per outage says so, the command
    is not disturbed, run.json's status is true, and the report accounts for every event
    (the space held back for the final files lets the final counts land)."""
    n = 200_000
    d = small_disk / "run"
    res = _emit(d, n)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    run = read_json(str(d), "run.json")
    assert run["status"] == "complete"
    rep, txt = _report(d)
    acc = rep["recorder"]["accounting"]
    _assert_closes(acc, n)
    assert acc["not_recorded"] > 0 and acc["not_recorded_why"] == "No space left on device", acc
    assert acc["lost"] == 0, acc
    # each outage named with its times, every event not recorded counted in one of them:
    # from when recording stopped to when a fresh segment took writes again (a retry every
    # RETRY_S, and the last try at the run's end once the space held back is given back),
    # or to the end where that last try failed too. How many outages, and whether the last
    # one ends, is the machine's timing (seen: one "to 0.9 s" on a quiet machine, one "to
    # the end" beside three CPU burners); all of them are honest.
    (outage,) = [w for w in rep["warnings"] if w.startswith("event log was out of service from ")]
    parts = re.findall(r"from [0-9.]+ s to ([0-9.]+ s|the end) \((\d+) events not recorded\)", outage)
    assert parts and outage.endswith(" into the run"), outage
    assert sum(int(k) for _, k in parts) == acc["not_recorded"], (outage, acc)
    assert all(end != "the end" for end, _ in parts[:-1]), outage
    said = res.stderr.count("cannot write the event log (No space left on device)")
    assert said == len(parts), res.stderr  # one line per outage, never one per event
    assert "could not be written (No space left on device)" in " ".join(rep["warnings"])


def test_files_of_two_runs_in_one_directory_are_named(tmp_path) -> None:
    """The report checks that the event log, run.json and bench.json are one run's: a
    segment of another run, or a bench file whose requests were sent while the run was
    not on, is named (the report still reads what is there)."""
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        res = omnitrace_run(["--run-dir", str(d), "--", sys.executable, WRITER, str(tmp_path / f"{d.name}.json"),
                             "--requests", "2", "--chunks", "2"])
        assert res.returncode == 0, res.stderr
    shutil.copy(next((a / "events").iterdir()), b / "events" / "seg-000001.zst")
    start = read_json(str(b), "run.json")["started_unix_ns"]
    (b / "bench.json").write_text(json.dumps({"levels": [], "requests": [
        {"id": f"x{i}", "start_unix_ns": start - 3600 * 10**9, "warmup": False} for i in range(4)]}))
    rep, _ = _report(b)
    text = " ".join(rep["warnings"])
    assert "events/ holds segments of 2 runs" in text, text
    assert "bench.json does not belong to this run: 4 of its 4 requests" in text, text


def test_a_live_run_is_reported_as_live_not_torn(tmp_path) -> None:
    """A report on a run whose agent is still running: its open segment is not called
    torn, and the accounting waits for the end instead of claiming a loss."""
    import time
    d = tmp_path / "run"
    script = ("import time\nfrom omnitrace import record\n"
              "for i in range(500):\n    record.emit(200, 'r', 0)\n"
              "open(__import__('sys').argv[1], 'w').close()\ntime.sleep(60)\n")
    ready = tmp_path / "emitted"
    proc = subprocess.Popen([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(d), "--",
                             sys.executable, "-c", script, str(ready)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), "the writer never ran"
        rep, txt = None, ""
        while time.monotonic() < deadline:  # until the agent has drained the 500 events
            rep, txt = _report(d)
            if rep["recorder"]["accounting"] and rep["recorder"]["accounting"]["recorded"] == 500:
                break
            time.sleep(0.2)
        acc = rep["recorder"]["accounting"]
        assert acc["live"] and acc["recorded"] == 500, acc
        assert "500 recorded so far (the run is live" in txt, txt
        assert not any("ends early" in w or "torn" in w or "lost" in w for w in rep["warnings"]), rep["warnings"]
    finally:
        proc.terminate()
        proc.wait(60)
