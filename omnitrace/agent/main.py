"""`omnitrace agent`: record the run's events; serve live views of them.

Wiring, nothing more (each part owns its format or its output):

    rings --(drain thread: Collector.read_raw, record.SlotDecoder)--> eventlog segments
                                                                  \\--> decoded batches
    decoded batches --(main thread: spantable.SpanBuilder)--> views (agent.views):
        MetricsView (Prometheus endpoint, metrics.jsonl), OtlpView (live OTLP spans)

The drain thread's work per event is a memcpy, a vectorised decode and its share of a
zstd block, so the record keeps up at any load; the views run on the main thread at
their own pace and, past ``VIEW_BACKLOG_EVENTS`` waiting, skip batches (counted in
agent.json as ``views.events_skipped``): the record stays complete whatever they do.

Started by `omnitrace run` with stdin and stdout as pipes and ``--config`` (an
:class:`~omnitrace.agent.config.AgentConfig` as JSON): the agent prints one ``READY
{json}`` line once its exporters are up (or a one-line error and exit status 2), and
finishes when it reads ``exit CODE`` on stdin, when stdin closes (its parent died), or
on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import bisect
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections import deque

import orjson

from omnitrace import __version__
from omnitrace import conventions as cv
from omnitrace import eventlog, record, rowops, spanload
from omnitrace.eventlog import EVENT_DTYPE
from omnitrace.agent import export_otlp
from omnitrace.agent.collect import Collector, RingSource
from omnitrace.agent.config import AgentConfig
from omnitrace.agent.export_prometheus import Metrics
from omnitrace.agent.attribution_view import AttributionView, RequestView
from omnitrace.agent.views import MetricsView, OtlpView, View
from omnitrace.otlp import SpanConverter
from omnitrace.runfiles import RunDir
from omnitrace.spantable import SpanBuilder


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class Agent:
    LAG_BOUNDS_MS = (5.0, 20.0, 100.0, 500.0)
    RAW_SLOTS = 1 << 15  # slots per ring per drain cycle (1 MiB): bounds the copy in
    # memory, and a busy ring cannot starve the others for long (round-robin)
    VIEW_BACKLOG_EVENTS = 2_000_000  # decoded events waiting for the views (~70 MB)
    VIEW_PERIOD_S = 1.0  # the views take what is waiting this often: a feed's fixed cost
    # (a few hundred numpy calls, ~2 ms) is paid once a second (at 0.25 s it was a third of
    # the views' CPU at c=16: benchmarks/agent_views.py); dashboards scrape every 5-15 s
    VIEW_BATCH_EVENTS = 1 << 17  # ... or sooner when this much is waiting
    DISCOVER_PERIOD_S = 0.25  # new rings (listing /dev/shm) and dead writers, this often
    HURRY_MS = 10.0  # the next drain cycle this soon when a ring filled HURRY_FILL since the last
    HURRY_FILL = 1 / 8
    FINAL_VIEW_S = 2.0  # at the end, the views get this long for what is still waiting

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.rundir = RunDir(cfg.run_dir)
        self.collector = Collector(cfg.run_id, cfg.shm_dir)
        self.requests = record.RequestIds()
        self.log = eventlog.EventLogWriter(cfg.run_dir, cfg.run_id, self.collector.offset_ns,
                                           cfg.max_run_bytes)
        self.rings: dict[int, dict] = {}  # ring index -> description (as in the event log)
        self.builder = SpanBuilder(self.rings)
        self._part = spanload.Part(self.rings, self.requests.strings)  # what the views' feeds refer to
        self.metrics = Metrics()
        self.metrics.run_info.labels(cfg.run_id).set(1)
        self.views: list[View] = [MetricsView(self.metrics, self.requests.strings),
                                  RequestView(self.metrics),
                                  AttributionView(self.metrics, self.requests.strings, self.rings)]
        self.exporters: list[export_otlp.QueuedExporter] = []
        self.metric_pushers: list[export_otlp.MetricsPusher] = []
        self.processes: dict[int, dict] = {}
        self.procs_dirty = False
        self.exit_code: int | None = None
        self.stop = threading.Event()
        self.drained = threading.Event()
        self.started_unix_ns = time.time_ns()
        self.prom_port = 0
        self.warned_drops: dict[str, int] = {}
        # drain thread state
        self.ring_idx: dict[str, int] = {}
        self._ident: dict[int, tuple] = {}
        self.decoders: dict[int, record.SlotDecoder] = {}
        self.pending: deque = deque()  # (ring, records) or (ring, None) = died; for the views
        self.pending_events = 0
        self.events_read = 0
        self.view_events_skipped = 0
        self.cycles = 0
        self.max_cycle_ms = 0.0
        self.max_drain_lag_ms = 0.0
        self.drain_lags = [0] * (len(self.LAG_BOUNDS_MS) + 1)
        self.max_view_backlog_events = 0
        self.max_view_backlog_s = 0.0
        self._oldest_pending = 0.0
        self.final_s = 0.0
        self.views_failed = ""  # why the live views were switched off, if they were
        self.end_status = "complete"  # run.json's at the end; `omnitrace run` may say otherwise
        self.drain_error = ""
        self.max_rss = 0
        self._last_export_counts: dict[tuple[str, str], int] = {}
        self._drain_thread = threading.Thread(target=self._drain_loop, name="omnitrace-drain",
                                              daemon=True)
        self.meta = {
            "run_id": cfg.run_id, "command": list(cfg.command), "host": socket.gethostname(),
            "started_unix_ns": self.started_unix_ns, "ended_unix_ns": None,
            "status": "running", "exit_code": None, "omnitrace_version": __version__,
            "exporters": list(cfg.exporters), "record": "events",
        }

    # ------------------------------------------------------------------ start
    def start(self) -> dict:
        self.exporters = export_otlp.build(self.cfg.otlp_kinds, self.cfg.otlp_endpoints,
                                           self.cfg.otlp_timeout_s, self.cfg.otlp_queue_spans)
        self.metric_pushers = [export_otlp.MetricsPusher(k, self.cfg.otlp_endpoints.get(k),
                                                         self.cfg.otlp_timeout_s)
                               for k in self.cfg.otlp_kinds]
        if self.exporters:
            self.views.append(OtlpView(self.exporters, SpanConverter(
                self.requests.strings, self.rings, self.cfg.run_id)))
        # by0..by2 (a sort over every FIFO wait x sender task overlap) only for the spans
        # a live OTLP exporter sends (omni.fifo.blocked_by); no other view reads them
        self.builder.culprits = any(v.culprits for v in self.views)
        if "prometheus" in self.cfg.exporters:
            try:
                self.prom_port = self.metrics.serve(self.cfg.prometheus_port, self.cfg.prometheus_addr)
            except OSError as exc:
                raise OSError(f"Prometheus endpoint {self.cfg.prometheus_addr}:"
                              f"{self.cfg.prometheus_port}: {exc.strerror or exc} "
                              "(choose another with --prometheus-port)") from None
            self.meta["prometheus_endpoint"] = (f"http://{self.cfg.prometheus_addr}:"
                                                f"{self.prom_port}/metrics")
        self.meta["agent_pid"] = os.getpid()
        self.rundir.write_run(self.meta)
        return {"pid": os.getpid(), "prometheus_port": self.prom_port}

    # ------------------------------------------------------------------ drain thread
    def _note_process(self, src: RingSource) -> None:
        h = src.header
        p = self.processes.get(h.pid)
        if p is None:
            p = self.processes[h.pid] = {"pid": h.pid, "role": h.role, "stage": h.stage,
                                         "replica": h.replica, "name": h.process, "threads": [],
                                         "first_seen_unix_ns": src.first_seen_unix_ns,
                                         "exited": False}
            self.procs_dirty = True
        for k, v in (("role", h.role), ("stage", h.stage), ("replica", h.replica), ("name", h.process)):
            if p[k] != v:
                p[k] = v
                self.procs_dirty = True
        if h.thread not in p["threads"]:
            p["threads"].append(h.thread)
            self.procs_dirty = True

    def _drops(self, src: RingSource, final: bool = False) -> None:
        seen = self.warned_drops.get(src.name, 0)
        if src.dropped > seen:
            h = src.header
            self.metrics.count(cv.METRIC_DROPPED, h.stage, h.replica, src.dropped - seen)
            if seen == 0 or final:
                print(f"omnitrace agent: warning: ring of pid {h.pid} thread {h.thread!r} "
                      f"dropped {src.dropped} events so far (ring full; raise "
                      f"{cv.ENV_RING_RECORDS}, now {h.capacity})", file=sys.stderr, flush=True)
            self.warned_drops[src.name] = src.dropped

    def _ring(self, src: RingSource) -> int:
        """The ring's index; (re)describes it in the event log when its writer changed."""
        idx = self.ring_idx.get(src.name)
        if idx is None:
            idx = self.ring_idx[src.name] = len(self.ring_idx)
            self.decoders[idx] = record.SlotDecoder(self.requests)
        h = src.header
        ident = (h.pid, h.role, h.stage, h.replica, h.process, h.thread)
        if self._ident.get(idx) != ident:
            self._ident[idx] = ident
            info = {"name": src.name, "pid": h.pid, "tid": h.tid, "thread": h.thread,
                    "role": h.role, "stage": h.stage, "replica": h.replica,
                    "process": h.process, "capacity": h.capacity}
            self.log.ring(idx, info)
            self.pending.append((idx, info))
        return idx

    def _take(self, src: RingSource) -> bool:
        """Copy, record and decode one ring's new slots; True if more are waiting or the
        ring filled ``HURRY_FILL`` of its capacity since the last cycle."""
        raw = src.reader.read_raw(self.RAW_SLOTS)
        src.dropped = src.reader.dropped()
        if not raw:
            return False
        src.header = src.reader.header()  # role/stage may be set after creation
        self._note_process(src)
        idx = self._ring(src)
        rec = self.decoders[idx].decode(raw)
        n = len(rec)
        self.log.records(idx, raw, n)
        src.events += n
        self.events_read += n
        if n:
            if self.pending_events + n > self.VIEW_BACKLOG_EVENTS:
                self.view_events_skipped += n  # views behind: the record still has them
            else:
                if not self.pending_events:
                    self._oldest_pending = time.monotonic()
                self.pending.append((idx, rec))
                self.pending_events += n
        return len(raw) >= min(self.RAW_SLOTS, src.reader.capacity * self.HURRY_FILL) * record.RECORD_SIZE

    def _tables(self) -> dict[int, dict[int, str]]:
        return {idx: dec.strings for idx, dec in self.decoders.items()}

    def drain_cycle(self, reap: bool) -> bool:
        """One pass over every ring; True if some ring is filling fast (see :meth:`_take`)."""
        t0 = time.perf_counter()
        backlog = False
        if reap:  # listing /dev/shm every cycle was a visible share of the agent's CPU
            for src in self.collector.discover(time.time_ns()):
                self._note_process(src)
                self._ring(src)
        for src in list(self.collector.sources.values()):
            backlog = self._take(src) or backlog
            self._drops(src)
        if reap:
            for src in self.collector.reap():
                while self._take(src):  # the writer is gone: read it to the end
                    pass
                idx = self._ring(src)
                self.log.died(idx)
                self._account(src, idx)
                self.pending.append((idx, None))
                self.collector.retire(src)
                self._drops(src)
                proc = self.processes.get(src.header.pid)
                if proc is not None and not proc["exited"]:
                    proc["exited"] = True
                    self.procs_dirty = True
        cut = any(dec.cut for dec in self.decoders.values())
        self._say(self.log.commit(self._tables(), can_rotate=not cut))
        self.cycles += 1
        self.max_cycle_ms = max(self.max_cycle_ms, (time.perf_counter() - t0) * 1e3)
        return backlog

    def _account(self, src: RingSource, idx: int) -> None:
        """The ring's final counts into the record, once the agent has read it to the end."""
        h = src.header = src.reader.header()
        src.dropped = h.dropped
        self.log.account(idx, {"events_written": h.events_written, "dropped": h.dropped,
                               "events_read": src.events})

    def _say(self, change: str) -> None:
        """One line when recording stops or resumes (never one per event)."""
        rec = self.log
        if change == "capped":
            msg = (f"warning: the run's event log reached --max-run-bytes ({self.cfg.max_run_bytes} "
                   "bytes): new events are counted, not recorded")
        elif change == "failed":
            msg = (f"warning: cannot write the event log ({rec.failed}): recording stopped, the "
                   f"pipeline is unaffected; events are counted, not recorded (retrying every "
                   f"{eventlog.RETRY_S:.0f} s)")
        elif change == "resumed":
            msg = (f"the event log is writable again: recording resumed "
                   f"({rec.events_not_recorded} events were not recorded)")
        else:
            return
        print(f"omnitrace agent: {msg}", file=sys.stderr, flush=True)

    def _drain_loop(self) -> None:
        interval = self.cfg.interval_ms / 1e3
        next_reap = time.monotonic()
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                reap = now >= next_reap
                if reap:
                    next_reap = now + self.DISCOVER_PERIOD_S
                due = now + (self.HURRY_MS / 1e3 if self.drain_cycle(reap) else interval)
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    break
                # how late this thread got the GIL back (the views run meanwhile)
                lag_ms = (time.monotonic() - due) * 1e3
                self.max_drain_lag_ms = max(self.max_drain_lag_ms, lag_ms)
                self.drain_lags[bisect.bisect_left(self.LAG_BOUNDS_MS, lag_ms)] += 1
            while self.drain_cycle(reap=True):
                pass
            while self.drain_cycle(reap=False):  # rings of processes still alive (orphans)
                pass
            for src in self.collector.sources.values():
                self._account(src, self._ring(src))
            self.collector.close(unlink=True)
            for src in self.collector.all_sources():
                self._drops(src, final=True)
            self.log.close(self._tables())
        except Exception as exc:  # the main thread must still finish
            self.drain_error = f"{type(exc).__name__}: {exc}"
            print(f"omnitrace agent: drain thread failed: {self.drain_error}; recording stopped "
                  "(run.json: status drain-failed)", file=sys.stderr, flush=True)
        finally:
            self.drained.set()

    # ------------------------------------------------------------------ views (main thread)
    def _to_views(self, make_feed) -> None:
        """Build a feed and hand it to the views. A bug in a view must not cost the
        record: the views are switched off with one line on stderr (and in agent.json),
        the drain thread goes on recording every event."""
        if self.views_failed:
            return
        try:
            feed = make_feed()
            for view in self.views:
                view.feed(feed, self._part)
        except Exception as exc:
            import traceback
            self.views_failed = f"{type(exc).__name__}: {exc}"
            print("omnitrace agent: the live views failed and are off for the rest of the run "
                  f"(the run's record is unaffected): {self.views_failed}\n"
                  + traceback.format_exc(), file=sys.stderr, flush=True)

    def process_pending(self, deadline: float | None = None) -> int:
        """Feed what the drain thread decoded to the span builder and the views."""
        parts = []
        n = 0
        while self.pending:
            idx, item = self.pending.popleft()
            if item is None:  # DIED
                pid = self.rings.get(idx, {}).get("pid")
                if pid is not None:
                    self.builder.process_died(pid)
                continue
            if isinstance(item, dict):  # ring description
                self.rings[idx] = item
                self.builder.ring_changed()
                if item.get("role") == "stage":
                    self.metrics.stage_seen(int(item.get("stage", 0)), int(item.get("replica", 0)),
                                            item.get("process") or "")
                continue
            parts.append(eventlog.to_events(item, idx, self.collector.offset_ns))
            n += len(item)
            # a feed holds the GIL through much of its numpy work: bounded, so the drain
            # thread runs between feeds
            if n >= self.VIEW_BATCH_EVENTS or (deadline is not None and time.monotonic() > deadline):
                break
        self.pending_events -= n
        if self.pending_events:
            self._oldest_pending = time.monotonic()
        if parts:
            backlog = time.monotonic() - self._oldest_pending if self.pending_events else 0.0
            self.metrics.lag.set(backlog)
            self.max_view_backlog_s = max(self.max_view_backlog_s, backlog)
            self.max_view_backlog_events = max(self.max_view_backlog_events, n + self.pending_events)
            ev = rowops.concat(parts, EVENT_DTYPE)
            if self.views_failed:
                self.view_events_skipped += len(ev)
            self._to_views(lambda: self.builder.feed(ev, time.monotonic()))
            self.metrics.count_events(ev, self.rings)
        return n

    @staticmethod
    def _header_now(src: RingSource) -> record.RingHeader:
        """A live ring's header as of now (the drain thread refreshes ``src.header`` only
        when it reads); the last one if the drain thread retired the ring meanwhile."""
        try:
            return src.reader.header()
        except (TypeError, ValueError, AttributeError):
            return src.header

    def counters(self) -> dict:
        rings = []
        idx_of = self.ring_idx
        live = set(self.collector.sources)
        for src in self.collector.all_sources():
            h = self._header_now(src) if src.name in live else src.header
            rings.append({"name": src.name, "index": idx_of.get(src.name), "pid": h.pid,
                          "tid": h.tid, "thread": h.thread, "role": h.role, "stage": h.stage,
                          "replica": h.replica, "capacity": h.capacity, "events": src.events,
                          "events_written": h.events_written, "dropped": h.dropped,
                          "writer_exited": src.dead})
        rss = _rss_bytes()
        self.max_rss = max(self.max_rss, rss)
        exporters = {}
        for exp in self.exporters:
            exporters[exp.kind] = exp.counters()
        for pusher in self.metric_pushers:
            exporters.setdefault(pusher.kind, {})["metrics"] = pusher.counters()
        views = {"failed": self.views_failed, "events_skipped": self.view_events_skipped,
                 "backlog_events": self.pending_events,
                 "max_backlog_events": self.max_view_backlog_events,
                 "max_backlog_s": round(self.max_view_backlog_s, 3)}
        for view in self.views:
            views.update(view.counters())
        b = self.builder
        rec = self.log.counters()
        written = sum(r["events_written"] for r in rings)
        dropped = sum(r["dropped"] for r in rings)
        return {
            "events_read": self.events_read,
            "events_dropped": dropped,
            # the accounting identity's terms as the agent knows them now (the report's
            # figures come from the final counts: omnitrace.analyze.accounting)
            "accounting": {"events_written": written, "recorded": rec["events_recorded"],
                           "dropped_in_rings": dropped,
                           "not_drained_yet": written - dropped - self.events_read,
                           "not_recorded": rec["events_not_recorded"],
                           "in_flight": self.events_read - rec["events_recorded"] - rec["events_not_recorded"]},
            "rings_seen": self.collector.stats.rings_seen,
            "rings_unlinked": self.collector.stats.rings_unlinked,
            "ring_attach_errors": self.collector.stats.errors,
            "rings": rings,
            "record": rec,
            "spans_built": b.spans_built,
            "spans_incomplete": b.incomplete_spans,
            "step_events": b.step_events,
            "unknown_events": b.unknown_events,
            "requests_open": b.open_requests(),
            "requests_freed": b.requests_freed,
            "state": b.state_size(),
            "views": views,
            "exporters": exporters,
            "drain_cycles": self.cycles,
            "max_cycle_ms": round(self.max_cycle_ms, 3),
            "max_drain_lag_ms": round(self.max_drain_lag_ms, 3),
            "drain_lag_ms_counts": dict(zip(("<=5", "<=20", "<=100", "<=500", ">500"),
                                            self.drain_lags)),
            "final_s": round(self.final_s, 3),
            "rss_bytes": rss,
            "max_rss_bytes": max(self.max_rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        }

    def write_side_files(self) -> None:
        if self.procs_dirty:
            self.procs_dirty = not self.rundir.write_processes(list(self.processes.values()))
        c = self.counters()
        self._export_counters(c)
        self.rundir.write_agent(c)

    def _export_counters(self, c: dict) -> None:
        """Counters kept as plain ints by other threads and views -> Prometheus counters."""
        for counter, key, value in ((self.metrics.skipped, "skipped", self.view_events_skipped),
                                    (self.metrics.sampled_out, "sampled_out",
                                     c["views"].get("spans_not_exported", 0))):
            prev = self._last_export_counts.get((key, ""), 0)
            if value > prev:
                counter.inc(value - prev)
                self._last_export_counts[(key, "")] = value
        for kind, vals in c["exporters"].items():
            for outcome in ("exported", "failed", "dropped"):
                key = (kind, outcome)
                prev = self._last_export_counts.get(key, 0)
                if vals[outcome] > prev:
                    self.metrics.export_spans.labels(kind, outcome).inc(vals[outcome] - prev)
                    self._last_export_counts[key] = vals[outcome]

    def write_metrics(self) -> None:
        """metrics.jsonl, and the same message to the OTLP collectors."""
        msg = self.metrics.to_otlp(
            {"service.name": cv.SERVICE_NAME, "omnitrace.run.id": self.cfg.run_id},
            self.started_unix_ns, time.time_ns())
        self.rundir.write_metrics(msg)
        for pusher in self.metric_pushers:
            pusher.push(msg)

    def run(self) -> None:
        self._drain_thread.start()
        interval = self.cfg.interval_ms / 1e3
        next_tick = next_side = next_view = time.monotonic()
        next_metrics = time.monotonic() + self.cfg.metrics_interval_s
        while not self.stop.is_set():
            now = time.monotonic()
            busy = False
            if now >= next_view or self.pending_events >= self.VIEW_BATCH_EVENTS:
                busy = self.process_pending() > 0
                next_view = now + self.VIEW_PERIOD_S
            if now >= next_tick:
                self._to_views(lambda: self.builder.tick(now))
                self.metrics.queue.set(self.builder.open_requests())
                next_tick = now + self.VIEW_PERIOD_S
            if now >= next_side:
                self.write_side_files()
                next_side = now + 1.0
            if now >= next_metrics:
                self.write_metrics()
                next_metrics = now + self.cfg.metrics_interval_s
            if not busy:
                due = min(next_view, next_tick, next_side, next_metrics)
                self.stop.wait(max(interval / 4, due - time.monotonic()))

    def finish(self, status: str) -> None:
        """Final drain (drain thread), the views' share of it, exporters, files."""
        if self.log.failed or self.rundir.failing:  # the disk filled up: the space held back
            self.log.final_only = True  # is for the final counts, not for more records
            self.rundir.release_reserve()
        self.stop.set()
        if not self._drain_thread.is_alive() and not self.drained.is_set():
            self._drain_thread.start()  # run() never started it (an early stop)
        t0 = time.monotonic()
        deadline = t0 + self.FINAL_VIEW_S
        while True:
            done = self.drained.is_set()  # read before pending: nothing is added after
            if not self.process_pending(deadline):
                if done:
                    break
                self.drained.wait(0.02)
            if time.monotonic() > deadline and done:
                break
        skipped = self.pending_events
        if skipped:  # the views ran out of time: the record has these events
            self.view_events_skipped += skipped
            print(f"omnitrace agent: the live views skipped the last {skipped} events "
                  "(they are in the run's record; `omnitrace report` reads them)",
                  file=sys.stderr, flush=True)
            while self.pending:
                idx, item = self.pending.popleft()
                if isinstance(item, dict):
                    self.rings[idx] = item
            self.pending_events = 0
        self._to_views(self.builder.flush)
        timeout = self.cfg.otlp_timeout_s if self.cfg.otlp_timeout_s is not None else 10.0
        for view in self.views:
            try:
                view.close(max(2.0, min(30.0, timeout + 1.0)))
            except Exception as exc:  # the run's files must still be written
                print(f"omnitrace agent: closing a view failed: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)
        self.final_s = time.monotonic() - t0
        self.write_metrics()
        for pusher in self.metric_pushers:
            pusher.close(max(2.0, min(30.0, timeout + 1.0)))
        self.procs_dirty = True
        self.write_side_files()
        if self.drain_error:  # the record is not complete, whatever the command did
            status = "drain-failed"
            self.meta["drain_error"] = self.drain_error
        self.meta.update(ended_unix_ns=time.time_ns(), status=status, exit_code=self.exit_code)
        self.rundir.write_run(self.meta)
        self.rundir.close()
        self.metrics.close()
        for kind, v in self.counters()["exporters"].items():
            if v.get("failed") or v.get("dropped"):
                print(f"omnitrace agent: warning: {kind} lost {v['failed'] + v['dropped']} spans "
                      f"(failed {v['failed']}, dropped {v['dropped']}; "
                      f"{v.get('last_error') or 'queue full'})", file=sys.stderr, flush=True)


def _watch_stdin(agent: Agent) -> None:
    for line in sys.stdin:
        parts = line.split()  # "exit RC [STATUS]": STATUS e.g. "interrupted" (Ctrl-C)
        if parts[:1] == ["exit"]:
            try:
                agent.exit_code = int(parts[1])
            except (IndexError, ValueError):
                pass
            if parts[2:3] == ["interrupted"]:
                agent.end_status = "interrupted"
            break
    agent.stop.set()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="omnitrace agent",
                                description="Started by `omnitrace run`; not meant to be run by hand.")
    p.add_argument("--config", required=True, help="AgentConfig as JSON")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        cfg = AgentConfig.from_json(args.config)
        agent = Agent(cfg)
        info = agent.start()
    except (OSError, export_otlp.ConfigError, ValueError, TypeError) as exc:
        print(f"omnitrace agent: cannot start: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    print("READY " + orjson.dumps(info).decode(), flush=True)
    threading.Thread(target=_watch_stdin, args=(agent,), daemon=True).start()
    try:
        agent.run()
    finally:
        agent.finish(agent.end_status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
