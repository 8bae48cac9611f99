"""A run directory is owned by one run at a time (issue 25, item 2): two `omnitrace run`s
against the same directory, in every order (A live, finished, dead; B with and without
--overwrite). Either both records survive (B refused: A's files are all A's) or B
replaces a run that is over (the files are all B's); never a mix."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest
import zstandard

from omnitrace.runfiles.claim import claim
from tests.support.agent_util import WRITER, clean_env, omnitrace_run, read_json, read_spans

HEADER = 5  # omnitrace.eventlog's HEADER block type


def _writer(tmp_path, who: str, *extra: str) -> list[str]:
    return [sys.executable, WRITER, str(tmp_path / f"{who}.json"), "--requests", "2",
            "--chunks", "2", "--prefix", who, *extra]


def _run(d, tmp_path, who: str, *opts: str) -> subprocess.CompletedProcess:
    return omnitrace_run(["--run-dir", str(d), "--run-id", f"run-{who}", *opts, "--",
                          *_writer(tmp_path, who)])


def _segment_run_ids(d) -> set[str]:
    """The run id in the HEADER block that opens every event segment."""
    ids = set()
    events = os.path.join(d, "events")
    for name in sorted(os.listdir(events)):
        with open(os.path.join(events, name), "rb") as f:
            raw = zstandard.ZstdDecompressor().stream_reader(f).read(1 << 16)
        kind, _idx, length = struct.unpack_from("<B3xII", raw, 0)
        assert kind == HEADER
        ids.add(json.loads(raw[12:12 + length])["run_id"])
    return ids


def _all_of(d, who: str) -> None:
    """Every file of the run directory is run ``who``'s."""
    assert read_json(str(d), "run.json")["run_id"] == f"run-{who}"
    rings = {r["name"].split(".")[1] for r in read_json(str(d), "agent.json")["rings"]}
    assert rings == {f"run-{who}"}, rings  # ring names: omnitrace.<run id>.<pid>.<tid>
    assert _segment_run_ids(d) == {f"run-{who}"}
    rids = {s["attrs"]["omni.request.id"] for s in read_spans(str(d))}
    assert rids == {f"{who}-0", f"{who}-1"}, rids


class LiveRun:
    """Run A held mid-run: its stage 0 has recorded and waits (a real readiness signal:
    the marker it writes) until the test lets it go."""

    def __init__(self, d, tmp_path) -> None:
        self.marker = tmp_path / "a-holding"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "omnitrace", "run", "--run-dir", str(d), "--run-id", "run-a", "--",
             *_writer(tmp_path, "a", "--hold-stage0", "600", "--kill-marker", str(self.marker))],
            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        deadline = time.monotonic() + 120
        while not self.marker.exists() or not self.marker.read_text():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.proc.communicate()
            time.sleep(0.05)
        self.run_json = read_json(str(d), "run.json")
        assert self.run_json["status"] == "running"

    def release(self) -> str:
        """Let stage 0 go (it ends the sleep by SIGTERM); the run finishes normally."""
        os.kill(int(self.marker.read_text()), signal.SIGTERM)
        _, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, err
        return err

    def kill(self) -> None:
        """The whole run dies: agent (own process group) and `omnitrace run` with its command."""
        os.kill(self.run_json["agent_pid"], signal.SIGKILL)
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate(timeout=60)
        # its rings stay in /dev/shm (nobody left to drain them): ours to remove
        for name in os.listdir("/dev/shm"):
            if name.startswith("omnitrace.run-a."):
                os.unlink(os.path.join("/dev/shm", name))

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.kill()


def _refused(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_a_live_run_is_never_replaced(tmp_path, overwrite):
    d = tmp_path / "D"
    a = LiveRun(d, tmp_path)
    try:
        b = _run(d, tmp_path, "b", *(["--overwrite"] if overwrite else []))
        _refused(b, "still live")
        assert "run-a" in b.stderr
        assert not (tmp_path / "b.json").exists()  # B's command never started
        a.release()
    finally:
        a.cleanup()
    assert read_json(str(d), "run.json")["status"] == "complete"
    _all_of(d, "a")


def test_a_finished_run_is_kept_or_replaced_whole(tmp_path):
    d = tmp_path / "D"
    assert _run(d, tmp_path, "a").returncode == 0
    _refused(_run(d, tmp_path, "b"), "already holds a run")
    _all_of(d, "a")
    r = _run(d, tmp_path, "c", "--overwrite")
    assert r.returncode == 0, r.stderr
    _all_of(d, "c")


def test_a_dead_run_may_be_replaced(tmp_path):
    d = tmp_path / "D"
    a = LiveRun(d, tmp_path)
    a.kill()
    assert read_json(str(d), "run.json")["status"] == "running"  # what a dead run leaves
    _refused(_run(d, tmp_path, "b"), "already holds a run")
    r = _run(d, tmp_path, "c", "--overwrite")
    assert r.returncode == 0, r.stderr
    _all_of(d, "c")


def test_a_run_starting_holds_the_directory(tmp_path):
    """Before run.json exists the lock alone says the directory is taken."""
    d = tmp_path / "D"
    d.mkdir()
    fd = claim(str(d))  # what `omnitrace run` holds from before its agent starts
    try:
        _refused(_run(d, tmp_path, "b", "--overwrite"), "still live")
    finally:
        os.close(fd)
    assert _run(d, tmp_path, "b", "--overwrite").returncode == 0
    _all_of(d, "b")


def test_a_reused_pid_does_not_make_a_run_live(tmp_path):
    """run.json says running and its agent pid is alive, but that pid is not its agent."""
    d = tmp_path / "D"
    assert _run(d, tmp_path, "a").returncode == 0
    meta = read_json(str(d), "run.json")
    meta.update(status="running", agent_pid=os.getpid())
    (d / "run.json").write_text(json.dumps(meta))
    r = _run(d, tmp_path, "c", "--overwrite")
    assert r.returncode == 0, r.stderr
    _all_of(d, "c")
