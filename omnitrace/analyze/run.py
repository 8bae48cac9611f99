"""A loaded run: what ``rundir`` read from one or several run directories, merged, and
what every analysis reads (the report, compare)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from omnitrace import spantable as stt
from omnitrace.rules.requesttable import RequestTable

if TYPE_CHECKING:  # both import this module's layer-mates at run time: types only
    from omnitrace.analyze.accounting import Ledger
    from omnitrace.analyze.tables import ChunkFigures


@dataclass
class Run:
    """Everything read from the run directories, merged."""

    paths: list[str]
    run_json: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    agent: list[dict[str, Any]] = field(default_factory=list)
    bench: dict[str, Any] | None = None
    # the request, stage and queue spans and their emits (no chunk spans: ``early``,
    # ``figures``); ``req`` indexes ``chunk_requests``
    request_spans: stt.SpanTables = field(default_factory=stt.SpanTables)
    stage_names: dict[int, str] = field(default_factory=dict)  # stage -> its process's name
    warnings: list[str] = field(default_factory=list)
    skipped_spans: int = 0  # spans of warm-up requests, not loaded
    events: int = 0  # events read from event logs
    torn_records: int = 0  # records lost in torn event segments
    ledger: Ledger | None = None  # where every event written went (event-log runs)
    # what the per-stage figures read of the chunk spans (req indexes
    # chunk_requests; every request: the selection is the report's)
    figures: ChunkFigures | None = None
    # the senders' busy intervals, per (stage, replica) (headofline.Busy; warm-up tasks
    # included: they can block a measured request in a FIFO)
    busy: dict = field(default_factory=dict)
    # chunk spans that began before their request's first packet (tables.EARLY_DTYPE; warm-up
    # requests left out): the walk, the head-of-line waits and the waterfalls read them
    early: np.ndarray | None = None
    chunk_requests: list[str] = field(default_factory=lambda: [""])
    span_count: int = 0
    stage_deaths: list[tuple[int, int]] = field(default_factory=list)  # (stage, unix ns) STAGE_DIED
    # (stage, unix ns, request, chunk) DELIVERY_TIMEOUT (MRv2)
    delivery_timeouts: list[tuple[int, int, str, int]] = field(default_factory=list)
    repeated_ids: dict[str, int] = field(default_factory=dict)  # request id -> arrivals after its first

    def request_table(self) -> RequestTable:
        """Per request (``chunk_requests``' numbers) what its request, stage and queue spans say."""
        return RequestTable.of(self.request_spans, len(self.chunk_requests))

    def chunk_index(self) -> dict[str, int]:
        """Request id -> its index in ``chunk_requests`` (the tables' ``req``)."""
        return {r: i for i, r in enumerate(self.chunk_requests)}
