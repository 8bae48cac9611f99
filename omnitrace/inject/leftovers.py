"""What a served pipeline left in /dev/shm after ``omnitrace run``'s command ended.

vLLM-Omni makes one ``omni_shm_wake_<n>_<stage pid>`` directory per stage process and
never removes it, not even on a clean shutdown; a stage killed mid-request leaves the
chunk segments it had written and nobody read (``<engine request id>_<stage>_<chunk>``,
with their ``shm_<key>_lockfile.lock``). Once the command has ended, the ones of this
run's processes (the pids of its rings) whose process is gone are removed and listed in
run.json (``shm_leftovers``), so the report can say so and the next run starts clean.

A chunk segment counts as the run's when it has the connector's key form with an engine
request id (``<route id>-<uuid8>``), was made while the run was on, and its request is one
the run recorded (``requestids.recorded_id`` in the string tables at the event log's end:
each ring's last 4096 requests, which hold those in flight when a stage died). A segment
of another server's (a replica beside this one, another run) is never touched, even while
that server is reading it: the name is all a segment says of who made it. All of the
run's processes must be gone first (a live one may still read them). Where the log stopped
before the end (``--max-run-bytes``, a full disk) the tables are older than the run, and
chunks of requests only its later part saw stay in /dev/shm.
"""
from __future__ import annotations

import functools
import os
import shutil
from typing import AbstractSet, Callable

from omnitrace import eventlog, requestids
from omnitrace.agent.collect import pid_alive as _alive
from omnitrace.record import SHM_DIR

WAKE_PREFIX = "omni_shm_wake_"


def _wake_pid(name: str) -> int | None:
    tail = name.rsplit("_", 1)[-1]
    return int(tail) if name.startswith(WAKE_PREFIX) and tail.isdigit() else None


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def request_of(name: str) -> str | None:
    """The engine request id of a chunk segment or its lock file (None: another name)."""
    key = name[4:-len("_lockfile.lock")] if name.startswith("shm_") and name.endswith("_lockfile.lock") else name
    try:
        return requestids.chunk_key(key)[0]
    except ValueError:
        return None


def sweep(pids: set[int], since_unix_s: float, recorded: Callable[[], AbstractSet[str]],
          shm_dir: str = SHM_DIR) -> dict[str, list]:
    """Remove the run's stale leftovers; what was removed, by kind. Wake directories go
    per exited stage; chunk segments of the run's requests (``recorded()``, asked once,
    only where a segment might be the run's) only once all of the run's processes are gone
    (a live one may still read them): while some live, the ones found are kept and counted."""
    alive = sorted(p for p in pids if _alive(p))
    ours = functools.cache(recorded)
    out: dict[str, list] = {"wake_dirs": [], "chunk_segments": [], "chunk_segments_kept": [],
                            "alive_pids": alive}
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return out
    for n in names:
        path = os.path.join(shm_dir, n)
        pid = _wake_pid(n)
        rid = None if pid is not None else request_of(n)
        if pid is not None and pid in pids and pid not in alive:
            kind = "wake_dirs"
        elif (rid is not None and requestids.has_engine_suffix(rid)
              and _mtime(path) >= since_unix_s and requestids.recorded_id(rid) in ours()):
            kind = "chunk_segments_kept" if alive else "chunk_segments"
        else:
            continue
        if kind != "chunk_segments_kept":
            try:
                if os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            except OSError:
                continue
        out[kind].append(n)
    return out


def sweep_run(run_dir: str, grace_s: float = 20.0) -> dict[str, list]:
    """After a run's command ended: its ring pids from agent.json, a grace for stage
    processes still shutting down, the sweep, and run.json's ``shm_leftovers`` (only
    when something was removed)."""
    import time

    from omnitrace.runfiles import names
    from omnitrace.runfiles.read import read_or_empty
    from omnitrace.runfiles.write import update_run

    rings = read_or_empty(run_dir, names.AGENT).get("rings") or []
    pids = {int(r["pid"]) for r in rings if isinstance(r, dict) and isinstance(r.get("pid"), int)}
    pids.discard(os.getpid())
    if not pids:
        return {}
    deadline = time.monotonic() + grace_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    since = int(read_or_empty(run_dir, names.RUN).get("started_unix_ns") or 0) / 1e9
    removed = sweep(pids, since, lambda: eventlog.last_request_ids(run_dir))
    if any(removed[k] for k in ("wake_dirs", "chunk_segments", "chunk_segments_kept")):
        try:
            update_run(run_dir, lambda meta: meta.update(shm_leftovers=removed))
        except OSError:
            pass
    return removed
