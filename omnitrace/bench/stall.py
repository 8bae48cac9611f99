"""A stalled load, named while it happens: when no request has progressed (no stream
chunk, no request ended) for ``after_s`` seconds while requests are in flight, one line
says so, and, where the run's live record is at hand (a run directory the agent is
writing), which stage stopped stepping.

Which stage: a stage process that is stopped (``T`` in /proc: SIGSTOP, a debugger) is
named outright; otherwise the stage whose rings (agent.json, rewritten every second)
stopped growing first, with how long each stage has been quiet. A stage downstream of a
stalled one goes quiet too, once its own work runs out; the one quiet longest stopped
first.
"""
from __future__ import annotations

import time
from typing import Callable

from omnitrace.runfiles import names
from omnitrace.runfiles.read import read_or_empty, read_processes

DEFAULT_AFTER_S = 10.0


def _stopped(pid: int) -> bool:
    """The process is stopped by a signal or traced (its /proc state)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


class StageActivity:
    """Per stage of a live run: when its rings last grew (this clock), from agent.json."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.written: dict[int, int] = {}  # stage -> events written, last reading
        self.changed: dict[int, float] = {}  # stage -> when that last changed
        self.pids: dict[int, set[int]] = {}
        self.names: dict[int, str] = {}

    def sample(self, now: float) -> None:
        rings = read_or_empty(self.run_dir, names.AGENT).get("rings")
        if not isinstance(rings, list):
            return
        written: dict[int, int] = {}
        for r in rings:
            if isinstance(r, dict) and r.get("role") == "stage" and isinstance(r.get("stage"), int):
                written[r["stage"]] = written.get(r["stage"], 0) + int(r.get("events_written") or 0)
                self.pids.setdefault(r["stage"], set()).add(int(r.get("pid") or 0))
        for stage, n in written.items():
            if self.written.get(stage) != n:
                self.written[stage], self.changed[stage] = n, now
        for p in read_processes(self.run_dir):
            if p.get("role") == "stage" and p.get("name"):
                self.names[int(p.get("stage", -1))] = str(p["name"])

    def label(self, stage: int) -> str:
        return f"{stage}:{self.names[stage]}" if stage in self.names else f"stage {stage}"

    def culprit(self, now: float) -> str:
        """Which stage stopped stepping, in a few words ('' when the record says nothing)."""
        for stage in sorted(self.pids):
            stopped = [p for p in self.pids[stage] if p and _stopped(p)]
            if stopped:
                return f"stage {self.label(stage)} is stopped (pid {stopped[0]}: SIGSTOP or a debugger)"
        if not self.changed:
            return ""
        quiet = sorted(self.changed, key=lambda s: self.changed[s])
        return (f"stage {self.label(quiet[0])} stopped stepping first (quiet: "
                + ", ".join(f"{self.label(s)} {now - self.changed[s]:.0f} s" for s in quiet) + ")")


class StallWatch:
    """Beats on every stream chunk and request end; :meth:`check` (once a second) says one
    line through ``say`` when a stall begins and one when requests move again."""

    def __init__(self, after_s: float, say: Callable[[str], None], run_dir: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s, self.say, self.clock = after_s, say, clock
        self.activity = StageActivity(run_dir) if run_dir else None
        self.last = clock()
        self.stalled_since: float | None = None

    def beat(self) -> None:
        self.last = self.clock()

    def check(self, in_flight: int) -> None:
        now = self.clock()
        if self.activity is not None:
            self.activity.sample(now)
        if self.stalled_since is not None and self.last > self.stalled_since:
            self.say(f"requests progress again (stalled {self.last - self.stalled_since:.0f} s)")
            self.stalled_since = None
        if self.stalled_since is None and in_flight and self.after_s > 0 and now - self.last >= self.after_s:
            self.stalled_since = self.last
            where = self.activity.culprit(now) if self.activity is not None else ""
            self.say(f"no request has progressed for {now - self.last:.0f} s ({in_flight} in flight)"
                     + (f"; {where}" if where else ""))
