"""What a served pipeline leaves in /dev/shm is removed after the run only when it is the
run's and its process is gone (in-process, on a directory standing in for /dev/shm)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time


from omnitrace.inject.leftovers import sweep


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_sweep_removes_only_the_runs_stale_entries(tmp_path) -> None:
    """Wake directories of the run's exited stages; chunk segments of the run's requests
    made while it ran. Another server's segments (a request the run never recorded) stay:
    another run ending beside an MRv2 driver once unlinked its chunks in flight."""
    dead, alive_other = _dead_pid(), os.getpid()
    (tmp_path / f"omni_shm_wake_0_{dead}").mkdir()
    (tmp_path / f"omni_shm_wake_0_{alive_other}").mkdir()  # not one of the run's pids
    (tmp_path / "omni_shm_wake_0_999999").mkdir()  # another run's (pid not in the run)
    since = time.time() - 5
    for n in ("chatcmpl-a-0123abcd_1_3", "shm_chatcmpl-a-0123abcd_1_3_lockfile.lock",
              "chatcmpl-b_1_3",  # no engine id suffix: not the engine's key form
              "chatcmpl-other_1-0123abcd_1_0",  # another server's request, in flight
              "psm_1234"):
        (tmp_path / n).write_bytes(b"x")
    old = tmp_path / "chatcmpl-c-89abcdef_0_0"
    old.write_bytes(b"x")
    os.utime(old, (since - 100, since - 100))  # made before the run started
    asked = []
    removed = sweep({dead}, since, lambda: asked.append(1) or {"a", "c"}, str(tmp_path))
    assert asked == [1]  # the run's ids read once
    assert removed["wake_dirs"] == [f"omni_shm_wake_0_{dead}"]
    assert sorted(removed["chunk_segments"]) == ["chatcmpl-a-0123abcd_1_3", "shm_chatcmpl-a-0123abcd_1_3_lockfile.lock"]
    assert sorted(os.listdir(tmp_path)) == sorted(["omni_shm_wake_0_999999", f"omni_shm_wake_0_{alive_other}",
                                                   "chatcmpl-b_1_3", "psm_1234", "chatcmpl-c-89abcdef_0_0",
                                                   "chatcmpl-other_1-0123abcd_1_0"])


def test_sweep_waits_for_the_runs_processes(tmp_path) -> None:
    """While one of the run's processes lives, its wake directory and every chunk segment
    stay (it may still read them): the segments are counted as kept, naming the process;
    a dead stage's wake directory goes all the same."""
    dead = _dead_pid()
    (tmp_path / f"omni_shm_wake_0_{os.getpid()}").mkdir()
    (tmp_path / f"omni_shm_wake_0_{dead}").mkdir()
    (tmp_path / "chatcmpl-a-0123abcd_0_1").write_bytes(b"x")
    out = sweep({os.getpid(), dead}, 0.0, lambda: {"a"}, str(tmp_path))
    assert out == {"wake_dirs": [f"omni_shm_wake_0_{dead}"], "chunk_segments": [],
                   "chunk_segments_kept": ["chatcmpl-a-0123abcd_0_1"], "alive_pids": [os.getpid()]}
    assert sorted(os.listdir(tmp_path)) == sorted([f"omni_shm_wake_0_{os.getpid()}", "chatcmpl-a-0123abcd_0_1"])


def test_a_run_ending_leaves_another_servers_chunks_alone(tmp_path) -> None:
    """End to end: the command records request ``mine`` and leaves its chunk unread (a
    stage that died); another server's chunk is in flight beside it. After the run, the
    run's is gone and counted, the other's still there (once it was unlinked too: the
    default suite's MRv2 driver lost its chunks to another test's run ending)."""
    uid = f"{os.getpid()}x{time.monotonic_ns() % 10**6}"
    mine, other = f"chatcmpl-mine{uid}-0123abcd_1_0", f"chatcmpl-other{uid}-89abcdef_1_0"
    script = ("import os, sys\nfrom omnitrace import record\nfrom omnitrace.conventions import Ev\n"
              f"record.emit(int(Ev.PUT_BEGIN), 'mine{uid}', 1, 0)\n"
              "for n in sys.argv[1:]:\n    open(os.path.join('/dev/shm', n), 'wb').write(b'x')\n")
    try:
        proc = subprocess.run([sys.executable, "-m", "omnitrace", "run", "--run-dir", str(tmp_path / "run"), "--",
                               sys.executable, "-c", script, mine, other],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        left = set(os.listdir("/dev/shm"))
        assert mine not in left and other in left, proc.stderr
        with open(tmp_path / "run" / "run.json") as f:
            assert json.load(f)["shm_leftovers"]["chunk_segments"] == [mine]
    finally:
        for n in (mine, other):
            try:
                os.unlink(os.path.join("/dev/shm", n))
            except FileNotFoundError:
                pass
