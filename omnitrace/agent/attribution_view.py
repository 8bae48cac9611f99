"""Live TTFP attribution and request counts: the views a load-test dashboard reads.

:class:`AttributionView` holds each open request's spans from its arrival until its
``omni.request`` span is built (it ended), then runs the report's own critical-path walk
(the batch walk, :func:`omnitrace.rules.walk.walk`, over span rows) on exactly the rows
the report would use (chunk spans that began before the first audio packet) and adds the
result to
``omnitrace_ttfp_attribution_seconds_total{stage,category}``. So a panel shows, while the
load runs, the same per-category sums ``omnitrace report`` prints afterwards.

What it holds is bounded by the requests in flight: chunk spans that begin after a
request's first packet are dropped as they arrive (attribution never walks them), rows of
a request not seen arriving within :attr:`UNKNOWN_S` are dropped (counted), a run without
API hooks holds nothing after :attr:`NO_API_S`, and a request is released once the record has moved on past its
end (:attr:`SETTLE_NS`), so a stage's span drained a moment later still counts.

The head-of-line leaderboard (agent.json ``views.head_of_line_top_culprits``, what
`omnitrace top` shows) is the report's rule (:mod:`omnitrace.rules.headofline`) applied
to the same walks, over the sender tasks of the last :attr:`BUSY_KEEP_NS`: the report's
head-of-line table summed per culprit.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from omnitrace import conventions as cv
from omnitrace import spanload
from omnitrace.agent.export_prometheus import Metrics
from omnitrace.rules import attribution as at
from omnitrace.rules import headofline, walk
from omnitrace import rowops
from omnitrace.rules.requesttable import RequestTable
from omnitrace.rules.spanobjects import before_first_packet, first_packet_of, spans_from_tables
from omnitrace.spantable import Feed, SpanTables

_STATUS = {int(s): s.name.lower() for s in cv.Status}


def _owned(rows: np.ndarray, num: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` of the requests numbered ``num`` grouped by request (table order within
    one), and each one's index in ``num``: the batch walk's (rows, owner)."""
    rank = np.argsort(num)
    pos = np.minimum(np.searchsorted(num[rank], rows["req"].astype(np.int64)), max(len(num) - 1, 0))
    mine = (num[rank[pos]] == rows["req"]) if len(num) else np.zeros(len(rows), bool)
    owner = rank[pos[mine]]
    o = np.argsort(owner, kind="stable")
    return rows[mine][o], owner[o]


class RequestView:
    """Requests started, finished (by status) and in flight."""

    culprits = False
    steps = False

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.open: set[int] = set()

    def feed(self, feed: Feed, part: spanload.Part) -> None:
        if feed.arrivals:
            self.metrics.started.inc(len(feed.arrivals))
            self.open.update(feed.arrivals)
        for req, status in feed.ends:
            self.metrics.finished.labels(_STATUS.get(status, str(status))).inc()
            self.open.discard(req)
        roots = feed.spans.requests["req"]  # requests the builder gave up on (timeouts) are not in flight
        if len(roots):
            self.open.difference_update(roots.tolist())
        self.metrics.in_flight.set(len(self.open))

    def close(self, deadline_s: float) -> None:
        pass

    def counters(self) -> dict:
        return {}


class AttributionView:
    # A request is walked once the record has moved SETTLE_NS (event time) past its end,
    # so every ring's events up to then have been drained and fed (a starved drain can
    # lag a ring behind the API's), and at least SETTLE_S after its root span; or, when
    # no newer event comes (the load stopped), SETTLE_MAX_S after it.
    SETTLE_S = 1.0
    SETTLE_NS = 1_000_000_000
    SETTLE_MAX_S = 10.0
    TOP_CULPRITS = 10
    UNKNOWN_S = 10.0  # rows of a request not seen arriving are dropped after this long
    NO_API_S = 30.0  # no arrival at all in this long: a run without API hooks
    DONE_MEMORY = 1 << 12  # attributed requests remembered, so their late rows are dropped
    # sender tasks kept for the head-of-line rule (event time): a victim's waits lie between
    # its arrival and first packet, walked SETTLE_MAX_S after its end at the latest
    BUSY_KEEP_NS = 120 * 10**9

    culprits = False
    steps = False

    def __init__(self, metrics: Metrics, requests: list[str], rings: dict[int, dict],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self.requests = requests
        self.rings = rings
        self.clock = clock
        self.arrived: set[int] = set()
        self.any_arrival = False
        self.started: float | None = None  # the first feed with spans (monotonic)
        self.unknown: dict[int, float] = {}  # held rows, arrival not seen yet: first seen
        self.done: dict[int, None] = {}  # attributed (insertion-ordered, bounded)
        self.ttfp: dict[int, int] = {}  # req -> unix ns of its first audio packet
        self.held: list[SpanTables] = []
        # req -> (monotonic time its root span was seen, its end in unix ns)
        self.ended: dict[int, tuple[float, int]] = {}
        self.newest_ns = 0  # the newest event time the view has seen
        self.attributed = 0
        self.not_attributed = 0  # ended without a first packet, or the walk found no path
        self.rows_dropped = 0  # rows of requests never seen arriving (UNKNOWN_S)
        # culprit request id -> wall ns others' first packets waited behind its tasks
        # (the report's head-of-line rule: rules.headofline), and those others
        self.culprit_ns: dict[str, float] = {}
        self.culprit_victims: dict[str, set[int]] = {}
        # (pid, stage) -> the sender's closed tasks (starts, ends, requests), feed by feed
        self.busy: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}

    def feed(self, feed: Feed, part: spanload.Part) -> None:
        now = self.clock()
        if self.started is None and len(feed.spans):
            self.started = now
        if feed.arrivals:
            self.any_arrival = True
            self.arrived.update(feed.arrivals)
            for r in feed.arrivals:
                self.unknown.pop(r, None)
        # a run without API hooks has no arrivals: NO_API_S after its first spans nothing is
        # held any more (before that, the API's ring may just not be discovered yet: hold).
        # Counted from the first spans, not the agent's start, and after this feed's own
        # arrivals: a load that begins minutes after the server held its first requests'
        # spans from no view, and they stayed "held" unattributed for good
        holding = self.any_arrival or self.started is None or now - self.started < self.NO_API_S
        for kind, req, _replica, _s, t in feed.latencies:
            if kind == cv.Ev.REQUEST_FIRST_AUDIO:
                self.ttfp[req] = t
        spans = feed.spans
        if holding:
            self._hold(spans, now)
        self._keep_busy(feed)
        stale = [r for r, t in self.unknown.items() if now - t >= self.UNKNOWN_S]
        if stale:
            self._drop(stale)
        ends = [t["end"] for t in (spans.requests, spans.visits, spans.chunks) if len(t)]
        if ends:
            self.newest_ns = max(self.newest_ns, *(int(e.max()) for e in ends))
        due = [r for r, (t, end) in self.ended.items()
               if now - t >= self.SETTLE_S and self.newest_ns - end >= self.SETTLE_NS
               or now - t >= self.SETTLE_MAX_S]
        if due:
            self._attribute(due)

    def _hold(self, spans: SpanTables, now: float) -> None:
        """A feed's spans of requests not attributed yet, but for chunk spans that began
        after their request's first packet (when it is known); all its emits."""
        done = np.fromiter(self.done, np.int64, len(self.done))

        def alive(reqs: np.ndarray) -> np.ndarray:
            return ~np.isin(reqs, done) if len(done) else np.ones(len(reqs), bool)

        chunks = spans.chunks
        keep = alive(chunks["req"])
        if len(chunks) and self.ttfp:
            limit = first_packet_of(chunks["req"].astype(np.int64), np.fromiter(self.ttfp, np.int64, len(self.ttfp)),
                                    np.fromiter(self.ttfp.values(), np.int64, len(self.ttfp)),
                                    np.iinfo(np.int64).max)  # not known yet: kept
            keep &= chunks["start"] <= limit
        kept = SpanTables(*(rowops.select(t, alive(t["req"])) for t in (spans.requests, spans.visits)),
                          rowops.select(chunks, keep), spans.emits)
        if not kept.rows():
            return
        self.held.append(kept)
        # the API ring may be drained a little after a stage's: a request's first
        # spans can come before its arrival; they are held UNKNOWN_S for it
        for r in np.unique(kept.span_reqs()).tolist():
            if r not in self.arrived and r not in self.unknown:
                self.unknown[r] = now
        for req, end in zip(kept.requests["req"].tolist(), kept.requests["end"].tolist()):
            self.ended.setdefault(req, (now, end))

    def _take(self, reqs: list[int]) -> SpanTables:
        """Remove and return the held spans and emits of ``reqs``."""
        held = SpanTables.concat(self.held)
        ids = np.asarray(reqs, np.int64)
        rest = held.where_request(lambda r: ~np.isin(r, ids))
        self.held = [rest] if rest.rows() else []
        return held.of(ids)

    def _drop(self, reqs: list[int]) -> None:
        self.rows_dropped += len(self._take(reqs))
        for r in reqs:
            self.unknown.pop(r, None)
            self.ended.pop(r, None)

    def _attribute(self, reqs: list[int]) -> None:
        spans = self._take(reqs)
        totals: dict[tuple[int, str], int] = {}
        hol: dict[int, int] = {}
        victims = []
        found, none = self._walk(spans)
        self.not_attributed += none
        for req, a in found:
            self.attributed += 1
            self.metrics.attributed.inc()
            for key, ns in a.totals().items():
                totals[key] = totals.get(key, 0) + ns
                if key[1] == at.FIFO_BLOCKED:
                    hol[key[0]] = hol.get(key[0], 0) + ns
            victims.append(headofline.Victim(req, a.arrival, a.ttfp, a.hops))
        self._culprits(victims, spans.chunks)
        if victims:
            self.metrics.set_culprits(self.top_culprits())
        for (stage, cat), ns in totals.items():
            self.metrics.attribution.labels(str(stage), cat).inc(ns / 1e9)
        for stage, ns in hol.items():
            self.metrics.hol.labels(str(stage)).inc(ns / 1e9)
        for r in reqs:
            self.ended.pop(r, None)
            self.ttfp.pop(r, None)
            self.arrived.discard(r)
            self.unknown.pop(r, None)
            self.done[r] = None
        while len(self.done) > self.DONE_MEMORY:
            del self.done[next(iter(self.done))]

    def _walk(self, spans: SpanTables) -> tuple[list[tuple[int, at.Attribution]], int]:
        """The report's attribution of the requests in ``spans``: the batch walk
        (:func:`walk.walk`) over the chunk rows begun before their request's first packet,
        as rows (no span objects: they were most of this view's cost); the reference walk
        where the batch keys do not hold the numbers. Returns ((request id number, its
        attribution) per attributed request, how many were not attributed)."""
        table, nums = RequestTable.dense(spans)
        num = nums[1:]
        rids = [self.requests[r] for r in num.tolist()]
        rows, owner = _owned(before_first_packet(spans), num)
        if not walk.fits(rows) or len(rids) >= 1 << 16:
            num_of = dict(zip(rids, num.tolist()))
            objects = spans_from_tables(spans, self.requests, chunks_before_ttfp=True)
            walked = [at.attribute(r) for r in at.index_requests(objects).values()]
            found = [(num_of[a.rid], a) for a in walked if a is not None]
            return found, len(walked) - len(found)
        wk = walk.walk(rids, table, np.arange(1, len(nums)), rows, owner)
        found = [(int(num[i]), wk.attribution(i)) for i in np.flatnonzero(wk.ok).tolist()]
        return found, len(rids) - len(found)

    def _keep_busy(self, feed: Feed) -> None:
        """The sender tasks this feed closed, and none that ended BUSY_KEEP_NS before the
        newest event (no victim walked from now on waited that long ago)."""
        for pid, stage, starts, ends, reqs in feed.busy:
            if len(starts):
                self.busy.setdefault((pid, stage), []).append((starts, ends, reqs))
        horizon = self.newest_ns - self.BUSY_KEEP_NS
        for parts in self.busy.values():
            while parts and parts[0][1][-1] < horizon:
                parts.pop(0)

    def _culprits(self, victims: list[headofline.Victim], table: np.ndarray) -> None:
        """Credit each victim's head-of-line wall time to the requests whose tasks it
        waited behind, by the report's rule (:func:`headofline.blocked_pairs`): the live
        "who blocked whom" leaderboard equals the report's head-of-line table summed per
        culprit."""
        if not victims:
            return
        replica_of = spanload.replica_of(self.rings)
        senders = {k: tuple(np.concatenate(c) for c in zip(*parts)) for k, parts in self.busy.items() if parts}
        hp = headofline.blocked_pairs(victims, table, headofline.busy_by_replica(senders, replica_of))
        for v, c, ns in zip(hp.victim.tolist(), hp.culprit.tolist(), hp.pair_wall.tolist()):
            if ns > 0:
                who = self.requests[c]
                self.culprit_ns[who] = self.culprit_ns.get(who, 0.0) + ns
                self.culprit_victims.setdefault(who, set()).add(victims[v].req)
        if len(self.culprit_ns) > 4 * self.TOP_CULPRITS + 1000:  # bounded: keep the leaders
            top = sorted(self.culprit_ns, key=self.culprit_ns.get, reverse=True)[:4 * self.TOP_CULPRITS]
            self.culprit_ns = {k: self.culprit_ns[k] for k in top}
            self.culprit_victims = {k: self.culprit_victims[k] for k in top}

    def top_culprits(self) -> list[dict]:
        top = sorted(self.culprit_ns, key=self.culprit_ns.get, reverse=True)[:self.TOP_CULPRITS]
        return [{"culprit": who, "blocked_s": round(self.culprit_ns[who] / 1e9, 6),
                 "victims": len(self.culprit_victims[who])} for who in top]

    def close(self, deadline_s: float) -> None:
        if self.ended:
            self._attribute(list(self.ended))

    def counters(self) -> dict:
        return {"head_of_line_top_culprits": self.top_culprits(),
                "requests_attributed": self.attributed,
                "requests_not_attributed": self.not_attributed,
                "attribution_requests_held": len(self.arrived),
                "attribution_rows_dropped": self.rows_dropped}
