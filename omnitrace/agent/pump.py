"""The agent's view pump: the main thread's side of the hand-off. It turns the batches the
drain thread decoded into span feeds (:class:`~omnitrace.spantable.SpanBuilder`, the
builder the report uses) and hands each to the live views (``spanload.Sink``s: metrics,
requests, attribution, OTLP spans). A view that fails switches the views off, with one
line; the record is not touched.
"""
from __future__ import annotations

import time
from typing import Callable

from omnitrace import eventlog, record, rowops, spanload
from omnitrace.agent import export_otlp
from omnitrace.agent.attribution_view import AttributionView, RequestView
from omnitrace.agent.export_prometheus import Metrics
from omnitrace.agent.recorder import Handoff
from omnitrace.agent.views import MetricsView, OtlpView, View
from omnitrace.eventlog import EVENT_DTYPE
from omnitrace.otlp import SpanConverter
from omnitrace.spantable import Feed, SpanBuilder
from omnitrace import console


class ViewPump:
    BATCH_EVENTS = 1 << 17  # a feed holds the GIL through much of its numpy work: bounded,
    # so the drain thread runs between feeds

    def __init__(self, metrics: Metrics, requests: record.RequestIds, offset_ns: int) -> None:
        self.metrics, self.requests, self.offset_ns = metrics, requests, offset_ns
        self.rings: dict[int, dict] = {}  # ring index -> description (as in the event log)
        self.builder = SpanBuilder(self.rings)
        self._part = spanload.Part(self.rings, requests.strings)  # what the feeds refer to
        self.views: list[View] = [MetricsView(metrics, requests.strings), RequestView(metrics),
                                  AttributionView(metrics, requests.strings, self.rings)]
        self.failed = ""  # why the views were switched off, if they were
        self.max_backlog_events = 0
        self.max_backlog_s = 0.0

    def add_otlp(self, exporters: list[export_otlp.QueuedExporter], run_id: str) -> None:
        """Live OTLP spans; by0..by2 (a sort over every FIFO wait x sender task overlap) are
        ranked only for a view that reads them (omni.fifo.blocked_by)."""
        if exporters:
            self.views.append(OtlpView(exporters, SpanConverter(self.requests.strings, self.rings, run_id)))
        self.builder.culprits = any(v.culprits for v in self.views)

    def to_views(self, make_feed: Callable[[], Feed]) -> None:
        """Build a feed and hand it to the views. A bug in a view must not cost the
        record: the views are switched off with one line on stderr (and in agent.json),
        the drain thread goes on recording every event."""
        if self.failed:
            return
        try:
            feed = make_feed()
            for view in self.views:
                view.feed(feed, self._part)
        except Exception as exc:
            import traceback
            self.failed = f"{type(exc).__name__}: {exc}"
            console.say("agent", "the live views failed and are off for the rest of the run "
                        f"(the run's record is unaffected): {self.failed}\n"
                        + traceback.format_exc())

    def _take_note(self, idx: int, item: dict | None) -> None:
        if item is None:  # its writer died
            pid = self.rings.get(idx, {}).get("pid")
            if pid is not None:
                self.builder.process_died(pid)
            return
        self.rings[idx] = item  # a ring described anew
        self.builder.ring_changed()
        if item.get("role") == "stage":
            self.metrics.stage_seen(int(item.get("stage", 0)), int(item.get("replica", 0)),
                                    item.get("process") or "")
        elif item.get("role") == "api":
            self.metrics.api_seen(int(item.get("replica", 0)))

    def pump(self, handoff: Handoff, deadline: float | None = None) -> int:
        """Feed up to ``BATCH_EVENTS`` waiting events to the builder and the views; the
        events taken."""
        parts = []
        n = 0
        while handoff.items:
            idx, item = handoff.items.popleft()
            if item is None or isinstance(item, dict):
                self._take_note(idx, item)
                continue
            parts.append(eventlog.to_events(item, idx, self.offset_ns))
            n += len(item)
            if n >= self.BATCH_EVENTS or (deadline is not None and time.monotonic() > deadline):
                break
        handoff.events -= n
        if handoff.events:
            handoff.oldest = time.monotonic()
        if parts:
            backlog = time.monotonic() - handoff.oldest if handoff.events else 0.0
            self.max_backlog_s = max(self.max_backlog_s, backlog)
            self.max_backlog_events = max(self.max_backlog_events, n + handoff.events)
            ev = rowops.concat(parts, EVENT_DTYPE)
            # the live views' lag: how long the oldest event of this feed waited for them
            # since its hook wrote it (the drain's cycle, the view period, any backlog)
            self.metrics.lag.set(max(0.0, (time.time_ns() - int(ev["t"].min())) / 1e9) if len(ev) else 0.0)
            if self.failed:
                handoff.skipped += len(ev)
            self.to_views(lambda: self.builder.feed(ev, time.monotonic()))
            self.metrics.count_events(ev, self.rings)
        return n

    def skip_rest(self, handoff: Handoff) -> int:
        """What is still waiting at the end, given up (the record has it); ring notes kept."""
        skipped = handoff.events
        handoff.skipped += skipped
        while handoff.items:
            idx, item = handoff.items.popleft()
            if isinstance(item, dict):
                self.rings[idx] = item
        handoff.events = 0
        return skipped

    def close(self, timeout_s: float) -> None:
        """The builder's last spans to the views, then each view closed (exporters flushed
        within ``timeout_s``)."""
        self.to_views(self.builder.flush)
        for view in self.views:
            try:
                view.close(timeout_s)
            except Exception as exc:  # the run's files must still be written
                console.say("agent", f"closing a view failed: {type(exc).__name__}: {exc}")

    def counters(self, handoff: Handoff) -> dict:
        """The views' and the builder's part of agent.json."""
        views = {"failed": self.failed, "events_skipped": handoff.skipped,
                 "backlog_events": handoff.events, "max_backlog_events": self.max_backlog_events,
                 "max_backlog_s": round(self.max_backlog_s, 3)}
        for view in self.views:
            views.update(view.counters())
        b = self.builder
        return {"spans_built": b.spans_built, "spans_incomplete": b.incomplete_spans,
                "step_events": b.step_events, "unknown_events": b.unknown_events,
                "requests_open": b.open_requests(), "requests_freed": b.requests_freed,
                "state": b.state_size(), "views": views}
