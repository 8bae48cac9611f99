"""Who may use a run directory: writable, not another live run's, not an earlier run's
unless --overwrite (whose files are then removed)."""
from __future__ import annotations

import os
import shutil
import socket

from omnitrace import eventlog
from omnitrace.runfiles import names
from omnitrace.runfiles.read import read_or_empty


def check_writable(path: str) -> str | None:
    """None if ``path`` can be created/written as a run directory, else why not."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".omnitrace-write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        return f"{exc.strerror or exc}"
    return None


class RunDirBusy(Exception):
    """One line for the user: another run is live in this directory."""


def claim(path: str) -> int:
    """Make ``path`` this run's: an fd holding an exclusive lock on ``path/.omnitrace-lock``
    (kept open by `omnitrace run` and passed to its agent), or RunDirBusy naming the live
    run. The kernel drops the lock when the last process holding it ends, so a killed
    run never leaves a stale lock; the lock also closes the window before run.json exists.
    A run.json saying "running" whose agent is alive (a run of an omnitrace without the
    lock) is refused as well."""
    import fcntl

    fd = os.open(names.path(path, names.LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirBusy(_busy(path, live_agent(path) or "starting or stopping")) from None
    why = live_agent(path)
    if why is not None:
        os.close(fd)
        raise RunDirBusy(_busy(path, why))
    return fd


def _busy(path: str, who: str) -> str:
    return (f"run directory {path} belongs to a run that is still live ({who}); wait for it "
            "to end, or choose another --run-dir (--overwrite never replaces a live run)")


def live_agent(path: str) -> str | None:
    """'run ID, agent pid N' if run.json says running and that agent process is alive on
    this host, else None (finished, dead, unreadable, or on another host)."""
    meta = read_or_empty(path, names.RUN)
    try:
        run_id, pid = str(meta["run_id"]), int(meta["agent_pid"])
    except (KeyError, TypeError, ValueError):
        return None
    if meta.get("status") != "running" or meta.get("host") != socket.gethostname():
        return None
    return f"run {run_id}, agent pid {pid}" if _is_agent(pid, run_id) else None


def _is_agent(pid: int, run_id: str) -> bool:
    """pid is alive and (where /proc tells) the agent of ``run_id``, not a reused pid."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            return False
        return b"omnitrace.cli.agent" in cmd and run_id.encode() in cmd
    try:  # no /proc here: alive is all we can tell
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def holds_run(path: str) -> str | None:
    """The first file that shows ``path`` already holds a run, or None (an agent that
    could not start leaves at most an empty events/ folder: not a run)."""
    for name in names.RUN_FILES:
        if os.path.exists(names.path(path, name)):
            return name
    segs = eventlog.segments(path)
    return os.path.relpath(segs[0], path) if segs else None


def clear_earlier_run(path: str) -> None:
    """--overwrite: remove the files an earlier run wrote (only those)."""
    for name in names.EARLIER_RUN:
        try:
            os.unlink(names.path(path, name))
        except FileNotFoundError:
            pass
    for seg in eventlog.segments(path):
        os.unlink(seg)
    shutil.rmtree(names.path(path, names.PROFILES), ignore_errors=True)  # --flame's
    shutil.rmtree(names.path(path, names.TABLE_CACHE), ignore_errors=True)  # the tables kept of it
