"""What a served pipeline leaves in /dev/shm is removed after the run only when it is the
run's and its process is gone (in-process, on a directory standing in for /dev/shm)."""
from __future__ import annotations

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
    dead, alive_other = _dead_pid(), os.getpid()
    (tmp_path / f"omni_shm_wake_0_{dead}").mkdir()
    (tmp_path / f"omni_shm_wake_0_{alive_other}").mkdir()  # not one of the run's pids
    (tmp_path / "omni_shm_wake_0_999999").mkdir()  # another run's (pid not in the run)
    since = time.time() - 5
    for n in ("chatcmpl-a-0123abcd_1_3", "shm_chatcmpl-a-0123abcd_1_3_lockfile.lock",
              "chatcmpl-b_1_3",  # no engine id suffix: not the engine's key form
              "psm_1234"):
        (tmp_path / n).write_bytes(b"x")
    old = tmp_path / "chatcmpl-c-89abcdef_0_0"
    old.write_bytes(b"x")
    os.utime(old, (since - 100, since - 100))  # made before the run started
    removed = sweep({dead}, since, str(tmp_path))
    assert removed["wake_dirs"] == [f"omni_shm_wake_0_{dead}"]
    assert sorted(removed["chunk_segments"]) == ["chatcmpl-a-0123abcd_1_3", "shm_chatcmpl-a-0123abcd_1_3_lockfile.lock"]
    assert sorted(os.listdir(tmp_path)) == sorted(["omni_shm_wake_0_999999", f"omni_shm_wake_0_{alive_other}",
                                                   "chatcmpl-b_1_3", "psm_1234", "chatcmpl-c-89abcdef_0_0"])


def test_sweep_waits_for_the_runs_processes(tmp_path) -> None:
    """While one of the run's processes lives, its wake directory and every chunk segment
    stay (it may still read them): the segments are counted as kept, naming the process;
    a dead stage's wake directory goes all the same."""
    dead = _dead_pid()
    (tmp_path / f"omni_shm_wake_0_{os.getpid()}").mkdir()
    (tmp_path / f"omni_shm_wake_0_{dead}").mkdir()
    (tmp_path / "chatcmpl-a-0123abcd_0_1").write_bytes(b"x")
    out = sweep({os.getpid(), dead}, 0.0, str(tmp_path))
    assert out == {"wake_dirs": [f"omni_shm_wake_0_{dead}"], "chunk_segments": [],
                   "chunk_segments_kept": ["chatcmpl-a-0123abcd_0_1"], "alive_pids": [os.getpid()]}
    assert sorted(os.listdir(tmp_path)) == sorted([f"omni_shm_wake_0_{os.getpid()}", "chatcmpl-a-0123abcd_0_1"])
