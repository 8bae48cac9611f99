"""`omnitrace agent`: record the run's events; serve live views of them.

Wiring, nothing more (each part owns its format or its output):

    rings --(drain thread: agent.recorder.Recorder)--> eventlog segments (the record)
                                                   +--> Handoff (decoded batches, bounded)
    Handoff --(main thread: agent.pump.ViewPump, spantable.SpanBuilder)--> views:
        MetricsView (Prometheus endpoint, metrics.jsonl), RequestView, AttributionView,
        OtlpView (live OTLP spans)

The record keeps up at any load; the views run on the main thread at their own pace and,
past ``Handoff.BACKLOG_EVENTS`` waiting, skip batches (counted in agent.json as
``views.events_skipped``): the record stays complete whatever they do. This module owns
the run's lifecycle: start (exporters, the Prometheus endpoint, run.json), the main loop
(views, side files, metrics), the end (final drain, the views' share, files).
Its command (argument, READY line, stdin protocol, signals): :mod:`omnitrace.cli.agent`.
"""
from __future__ import annotations

import os
import resource
import socket
import threading
import time


from omnitrace import __version__
from omnitrace import conventions as cv
from omnitrace.agent import export_otlp
from omnitrace.agent.config import AgentConfig
from omnitrace.agent.export_prometheus import Metrics
from omnitrace.agent.pump import ViewPump
from omnitrace.agent.recorder import Handoff, Recorder
from omnitrace.runfiles import names
from omnitrace.runfiles.read import read_or_empty, read_processes
from omnitrace.runfiles.write import RunDir
from omnitrace import console


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class Agent:
    VIEW_PERIOD_S = 1.0  # the views take what is waiting this often: a feed's fixed cost
    # (a few hundred numpy calls) is paid once a second (benchmarks/agent_views.py);
    # dashboards scrape every 5-15 s
    FINAL_VIEW_S = 2.0  # at the end, the views get this long for what is still waiting

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.rundir = RunDir(cfg.run_dir)
        self.metrics = Metrics()
        self.metrics.run_info.labels(cfg.run_id).set(1)
        self.handoff = Handoff()
        self.exporters: list[export_otlp.QueuedExporter] = []
        self.metric_pushers: list[export_otlp.MetricsPusher] = []
        self.exit_code: int | None = None
        self.stop = threading.Event()
        self.started_unix_ns = time.time_ns()
        self.prom_port = 0
        self.final_s = 0.0
        self.end_status = "complete"  # run.json's at the end; `omnitrace run` may say otherwise
        self.max_rss = 0
        self._last_export_counts: dict[tuple[str, str], int] = {}
        self._old_processes: list[dict] = []
        self.meta = {
            "run_id": cfg.run_id, "command": list(cfg.command), "host": socket.gethostname(),
            "started_unix_ns": self.started_unix_ns, "ended_unix_ns": None,
            "status": "running", "exit_code": None, "omnitrace_version": __version__,
            "exporters": list(cfg.exporters), "record": "events",
        }
        self.recorder = Recorder(cfg, self.metrics, self.handoff, *self._taken_over())
        for p in self._old_processes:  # processes that exited before this agent started
            self.recorder.processes.setdefault(int(p["pid"]), p)
        self.recorder.procs_dirty = bool(self._old_processes)
        self.pump = ViewPump(self.metrics, self.recorder.requests, self.recorder.collector.offset_ns)

    def _taken_over(self) -> tuple:
        """(event log state, ring indices by name) of the agent this one replaces; its
        processes and run.json carried on (the run's start, command, earlier restarts)."""
        gone = self.cfg.takes_over
        if gone is None:
            return None, None
        from omnitrace import eventlog
        old_agent = read_or_empty(self.cfg.run_dir, names.AGENT)
        old_run = read_or_empty(self.cfg.run_dir, names.RUN)
        self.meta.update({k: v for k, v in old_run.items() if k not in ("status", "ended_unix_ns", "agent_pid")})
        restarts = list(self.meta.get("agent_restarts") or [])
        exporters = old_agent.get("exporters") if isinstance(old_agent.get("exporters"), dict) else {}
        restarts.append({**gone, "restarted_unix_ns": time.time_ns(), "new_pid": os.getpid(),
                         "record": old_agent.get("record") or {},  # its outages, with their times
                         "exporter_outages": {k: v.get("outages") for k, v in exporters.items()
                                              if isinstance(v, dict) and v.get("outages")}})
        self.meta["agent_restarts"] = restarts
        self._old_processes = [p for p in read_processes(self.cfg.run_dir) if isinstance(p.get("pid"), int)]
        rings = {str(r["name"]): int(r["index"]) for r in old_agent.get("rings") or ()
                 if isinstance(r, dict) and r.get("name") and isinstance(r.get("index"), int)}
        return eventlog.resume_state(self.cfg.run_dir), rings

    # ------------------------------------------------------------------ start
    def start(self) -> dict:
        self.exporters = export_otlp.build(self.cfg.otlp_kinds, self.cfg.otlp_endpoints,
                                           self.cfg.otlp_timeout_s, self.cfg.otlp_queue_spans)
        self.metric_pushers = [export_otlp.MetricsPusher(k, self.cfg.otlp_endpoints.get(k),
                                                         self.cfg.otlp_timeout_s)
                               for k in self.cfg.otlp_kinds]
        self.pump.add_otlp(self.exporters, self.cfg.run_id)
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

    # ------------------------------------------------------------------ files
    def counters(self) -> dict:
        rss = _rss_bytes()
        self.max_rss = max(self.max_rss, rss)
        exporters = {}
        for exp in self.exporters:
            exporters[exp.kind] = exp.counters()
        for pusher in self.metric_pushers:
            exporters.setdefault(pusher.kind, {})["metrics"] = pusher.counters()
        return {**self.recorder.counters(), **self.pump.counters(self.handoff),
                "exporters": exporters, "final_s": round(self.final_s, 3), "rss_bytes": rss,
                "max_rss_bytes": max(self.max_rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}

    def write_side_files(self) -> None:
        rec = self.recorder
        if rec.procs_dirty:
            rec.procs_dirty = not self.rundir.write_processes(list(rec.processes.values()))
        c = self.counters()
        self._export_counters(c)
        self.rundir.write_agent(c)

    def _export_counters(self, c: dict) -> None:
        """Counters kept as plain ints by other threads and views -> Prometheus counters."""
        for counter, key, value in ((self.metrics.skipped, "skipped", self.handoff.skipped),
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

    # ------------------------------------------------------------------ main loop
    def run(self) -> None:
        self.recorder.start(self.stop)
        interval = self.cfg.interval_ms / 1e3
        next_tick = next_side = next_view = time.monotonic()
        next_metrics = time.monotonic() + self.cfg.metrics_interval_s
        pump = self.pump
        while not self.stop.is_set():
            now = time.monotonic()
            busy = False
            if now >= next_view or self.handoff.events >= pump.BATCH_EVENTS:
                busy = pump.pump(self.handoff) > 0
                next_view = now + self.VIEW_PERIOD_S
            if now >= next_tick:
                pump.to_views(lambda: pump.builder.tick(now))
                self.metrics.queue.set(pump.builder.open_requests())
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
        rec = self.recorder
        if rec.log.failed or self.rundir.failing:  # the disk filled up: the space held back
            rec.log.final_only = True  # is for the final counts, not for more records
            self.rundir.release_reserve()
        self.stop.set()
        rec.start(self.stop)  # run() never started it (an early stop): the final drain
        t0 = time.monotonic()
        deadline = t0 + self.FINAL_VIEW_S
        while True:
            done = rec.drained.is_set()  # read before the hand-off: nothing is added after
            if not self.pump.pump(self.handoff, deadline):
                if done:
                    break
                rec.drained.wait(0.02)
            if time.monotonic() > deadline and done:
                break
        skipped = self.pump.skip_rest(self.handoff)
        if skipped:  # the views ran out of time: the record has these events
            console.say("agent", f"the live views skipped the last {skipped} events "
                        "(they are in the run's record; `omnitrace report` reads them)")
        timeout = self.cfg.otlp_timeout_s if self.cfg.otlp_timeout_s is not None else 10.0
        self.pump.close(max(2.0, min(30.0, timeout + 1.0)))
        self.final_s = time.monotonic() - t0
        self.write_metrics()
        for pusher in self.metric_pushers:
            pusher.close(max(2.0, min(30.0, timeout + 1.0)))
        rec.procs_dirty = True
        self.write_side_files()
        if rec.error:  # the record is not complete, whatever the command did
            status = "drain-failed"
            self.meta["drain_error"] = rec.error
        self.meta.update(ended_unix_ns=time.time_ns(), status=status, exit_code=self.exit_code)
        self.rundir.write_run(self.meta)
        self.rundir.close()
        self.metrics.close()
        for kind, v in self.counters()["exporters"].items():
            if v.get("failed") or v.get("dropped"):
                console.say("agent", f"warning: {kind} lost {v['failed'] + v['dropped']} spans "
                            f"(failed {v['failed']}, dropped {v['dropped']}; "
                            f"{v.get('last_error') or 'queue full'})")
