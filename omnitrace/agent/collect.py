"""Find and drain the event rings of one run (the agent's input side).

Rings are /dev/shm segments named ``omnitrace.<run-id>.<pid>.<tid>`` (omnitrace.record).
A ring outlives its writer, so a process killed with SIGKILL is still read to the end;
the collector unlinks a ring only after the final drain that follows its writer's death.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from omnitrace import record


@dataclass
class RingSource:
    """One ring and what the agent knows about its writer thread."""

    name: str
    reader: record.RingReader
    header: record.RingHeader
    offset_ns: int  # unix ns - perf_counter ns
    events: int = 0
    dropped: int = 0
    dead: bool = False
    first_seen_unix_ns: int = 0


@dataclass
class DrainStats:
    rings_seen: int = 0
    rings_unlinked: int = 0
    events_read: int = 0
    attach_errors: int = 0
    errors: list[str] = field(default_factory=list)


def pid_alive(pid: int) -> bool:
    """False for a pid that is gone or a zombie (killed but not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")
    except (OSError, ValueError):
        return False


class Collector:
    """Discovers the rings of ``run_id`` and drains them in batches."""

    def __init__(self, run_id: str, shm_dir: str = record.SHM_DIR) -> None:
        self.run_id = run_id
        self.shm_dir = shm_dir
        self.sources: dict[str, RingSource] = {}
        self.retired: list[RingSource] = []  # unlinked rings, kept for the final counters
        self.stats = DrainStats()
        self._bad: set[str] = set()
        # All rings of a host share CLOCK_MONOTONIC, so one offset for all of them keeps
        # intervals between threads and processes exact (per-ring anchors differ by the
        # jitter of reading two clocks); the anchors stay in agent.json for cross-checks.
        self.offset_ns = record.clock_offset_ns()

    def discover(self, now_unix_ns: int) -> list[RingSource]:
        """Attach to rings that appeared since the last call; returns the new ones."""
        new = []
        for name in record.discover(self.run_id, self.shm_dir):
            if name in self.sources or name in self._bad:
                continue
            try:
                reader = record.RingReader(name)
                header = reader.header()
            except (OSError, ValueError) as exc:
                # a ring being created right now has no magic yet: retry next round
                if isinstance(exc, FileNotFoundError):
                    continue
                self.stats.attach_errors += 1
                if len(self.stats.errors) < 20:
                    self.stats.errors.append(f"{name}: {exc}")
                continue
            if header.capacity == 0:
                reader.close()
                continue
            src = RingSource(name, reader, header, self.offset_ns, first_seen_unix_ns=now_unix_ns)
            self.sources[name] = src
            self.stats.rings_seen += 1
            new.append(src)
        return new

    def reap(self) -> list[RingSource]:
        """Mark rings whose writer process is gone; the caller drains them once more,
        then calls :meth:`retire`."""
        dead = []
        alive: dict[int, bool] = {}
        for src in self.sources.values():
            if src.dead:
                continue
            pid = src.header.pid
            if pid not in alive:
                alive[pid] = pid_alive(pid)
            if not alive[pid]:
                src.dead = True
                dead.append(src)
        return dead

    def retire(self, src: RingSource, unlink: bool = True) -> None:
        self.sources.pop(src.name, None)
        src.dropped = src.reader.dropped()
        src.reader.close(unlink=unlink)
        src.reader.strings = {}  # interned request ids are not needed any more
        if unlink:
            self.stats.rings_unlinked += 1
        self.retired.append(src)

    def all_sources(self) -> list[RingSource]:
        return list(self.sources.values()) + self.retired

    def close(self, unlink: bool = True) -> None:
        for src in list(self.sources.values()):
            self.retire(src, unlink=unlink)
