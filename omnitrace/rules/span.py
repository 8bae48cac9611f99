"""The span object: the data model the loaders fill and the reference
walk (``attribution``) reads. A leaf: it imports nothing of omnitrace."""
from __future__ import annotations

from typing import Any


class Span:
    """One span, flattened. Times are unix ns (ints)."""

    __slots__ = ("name", "rid", "stage", "peer", "chunk", "start", "end", "replica",
                 "blocked_ns", "blocked_by", "depth", "ahead", "nbytes", "incomplete",
                 "events", "attrs", "emit_firsts")

    def __init__(self, name: str, rid: str, stage: int, peer: int, chunk: int, start: int,
                 end: int, replica: int = 0, blocked_ns: int = 0,
                 blocked_by: tuple[str, ...] = (), depth: int = -1, ahead: int = -1,
                 nbytes: int = 0, incomplete: bool = False,
                 events: list[tuple[str, int, dict[str, Any]]] | None = None,
                 attrs: dict[str, Any] | None = None) -> None:
        self.name, self.rid, self.stage, self.peer, self.chunk = name, rid, stage, peer, chunk
        self.start, self.end, self.replica = start, end, replica
        self.blocked_ns, self.blocked_by, self.depth, self.ahead = blocked_ns, blocked_by, depth, ahead
        self.nbytes, self.incomplete = nbytes, incomplete
        self.events = events or []
        self.attrs = attrs or {}
        # a stage span built from the record: (first audio, first) omni.emit time of its
        # events (None: none), what the walk reads of them (_emit_firsts,
        # attribution.emit_firsts)
        self.emit_firsts: tuple[int | None, int | None] | None = None

    @property
    def dur(self) -> int:
        return self.end - self.start

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Span({self.name} rid={self.rid} s={self.stage} p={self.peer} c={self.chunk} "
                f"[{self.start},{self.end}])")
