"""A process tree as /proc shows it, read independently of omnitrace: which processes a
command started (its descendants, by parent pid) and which are still alive."""
from __future__ import annotations

import json
import os


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of ``pid``; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    tail = raw[raw.rindex(b")") + 2:].split()
    return int(tail[1]), tail[0].decode()


def descendants(root: int) -> set[int]:
    """Every live process below ``root``."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None:
                parent[int(d)] = st[0]
    out: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in out}
        out |= frontier
    return out


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie, killed and not yet reaped, is gone)."""
    out = set()
    for p in pids:
        st = _stat(p)
        if st is not None and st[1] not in ("Z", "X"):
            out.add(p)
    return out


def cmdline(pid: int) -> bytes:
    """``pid``'s command line, NUL-separated (empty: gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def json_or_empty(path: str) -> dict:
    """A JSON file a live process rewrites (empty while it is absent or half written)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
