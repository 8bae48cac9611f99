"""The span object: the data model the loaders fill and the reference
walk (``attribution``) reads. A leaf: it imports nothing of omnitrace.

Typed fields only: a request span's marks and a stage span's first emits are numbers
read straight from the span rows (``spanobjects``), not OTLP attributes and events (those
are made only where spans leave omnitrace: ``omnitrace.otlp``)."""
from __future__ import annotations

NO_EMITS: tuple[None, None] = (None, None)


class Span:
    """One span, flattened. Times are unix ns (ints); a mark or emit time is None where
    the record has none."""

    __slots__ = ("name", "rid", "stage", "peer", "chunk", "start", "end", "replica",
                 "blocked_ns", "blocked_by", "depth", "ahead", "nbytes", "incomplete",
                 "status", "ttfp", "parsed", "dispatched", "packet_received", "packet_resumed",
                 "emit_firsts")

    def __init__(self, name: str, rid: str, stage: int, peer: int, chunk: int, start: int,
                 end: int, replica: int = 0, blocked_ns: int = 0,
                 blocked_by: tuple[str, ...] = (), depth: int = -1, ahead: int = -1,
                 nbytes: int = 0, incomplete: bool = False) -> None:
        self.name, self.rid, self.stage, self.peer, self.chunk = name, rid, stage, peer, chunk
        self.start, self.end, self.replica = start, end, replica
        self.blocked_ns, self.blocked_by, self.depth, self.ahead = blocked_ns, blocked_by, depth, ahead
        self.nbytes, self.incomplete = nbytes, incomplete
        # a request span's (omni.request): its status (conventions.Status), its first audio
        # packet (TTFP) and its API marks, each the first of its kind
        self.status = 0
        self.ttfp: int | None = None
        self.parsed: int | None = None
        self.dispatched: int | None = None
        self.packet_received: int | None = None
        self.packet_resumed: int | None = None
        # a stage span's: the (first audio, first) omni.emit time of its packets
        self.emit_firsts: tuple[int | None, int | None] = NO_EMITS

    @property
    def dur(self) -> int:
        return self.end - self.start

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Span({self.name} rid={self.rid} s={self.stage} p={self.peer} c={self.chunk} "
                f"[{self.start},{self.end}])")
