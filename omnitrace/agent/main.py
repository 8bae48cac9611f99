"""`omnitrace agent`: drain the run's rings, assemble spans, export them.

Started by `omnitrace run` with stdin and stdout as pipes: the agent prints one
``READY {json}`` line on stdout once its exporters are up (or a one-line error and exit
status 2), and does its final drain and flush when it reads ``exit CODE`` on stdin, when
stdin closes (its parent died), or on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import os
import resource
import signal
import socket
import sys
import threading
import time

import orjson

from omnitrace import __version__
from omnitrace import conventions as cv
from omnitrace.agent import export_otlp
from omnitrace.agent.assemble import Assembler, Span
from omnitrace.agent.collect import Collector, RingSource
from omnitrace.agent.export_prometheus import Metrics
from omnitrace.agent.rundir import RunDir

EXPORTERS = ("otlp-grpc", "otlp-http", "prometheus", "file")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="omnitrace agent")
    p.add_argument("--run-id", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--exporter", default="file", help="comma list of " + ",".join(EXPORTERS))
    p.add_argument("--otlp-grpc-endpoint")
    p.add_argument("--otlp-http-endpoint")
    p.add_argument("--otlp-timeout", type=float, default=None, help="seconds per export")
    p.add_argument("--otlp-queue-spans", type=int, default=65536)
    p.add_argument("--prometheus-port", type=int, default=9464)
    p.add_argument("--prometheus-addr", default="127.0.0.1")
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--metrics-interval-s", type=float, default=10.0)
    p.add_argument("--command-json", default="[]")
    p.add_argument("--shm-dir", default="/dev/shm")
    return p.parse_args(argv)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.kinds = [k for k in args.exporter.split(",") if k]
        self.rundir = RunDir(args.run_dir)
        self.metrics = Metrics()
        self.pending: list[Span] = []
        # no OTLP exporter: complete chunk spans go straight to spans.jsonl as text
        text_only = not any(k in export_otlp.OTLP_EXPORTERS for k in self.kinds)
        self.assembler = Assembler(self.pending.append, self.metrics, text_only=text_only)
        self.collector = Collector(args.run_id, args.shm_dir)
        self.resources = export_otlp.ResourceCache(args.run_id)
        self.exporters: list[export_otlp.QueuedExporter] = []
        self.processes: dict[int, dict] = {}
        self.procs_dirty = False
        self.exit_code: int | None = None
        self.stop = threading.Event()
        self.started_unix_ns = time.time_ns()
        self.cycles = 0
        self.max_cycle_ms = 0.0
        self.max_rss = 0
        self.warned_drops: dict[str, int] = {}
        self.prom_port = 0
        self._exported_at = 0
        self._last_export_counts: dict[tuple[str, str], int] = {}
        self.meta = {
            "run_id": args.run_id, "command": orjson.loads(args.command_json),
            "host": socket.gethostname(), "started_unix_ns": self.started_unix_ns,
            "ended_unix_ns": None, "status": "running", "exit_code": None,
            "omnitrace_version": __version__, "exporters": ["file"] + [k for k in self.kinds if k != "file"],
        }

    # ------------------------------------------------------------------ start
    def start(self) -> dict:
        endpoints = {"otlp-grpc": self.args.otlp_grpc_endpoint,
                     "otlp-http": self.args.otlp_http_endpoint}
        self.exporters = export_otlp.build([k for k in self.kinds if k in export_otlp.OTLP_EXPORTERS],
                                           endpoints, self.args.otlp_timeout,
                                           self.args.otlp_queue_spans)
        if "prometheus" in self.kinds:
            self.prom_port = self.metrics.serve(self.args.prometheus_port, self.args.prometheus_addr)
            self.meta["prometheus_endpoint"] = f"http://{self.args.prometheus_addr}:{self.prom_port}/metrics"
        self.meta["agent_pid"] = os.getpid()
        self.rundir.write_run(self.meta)
        return {"pid": os.getpid(), "prometheus_port": self.prom_port}

    # ------------------------------------------------------------------ loop
    def _feed(self, src: RingSource, batch: list) -> None:
        h = src.header
        self.assembler.feed(batch, src.offset_ns, h.pid, h.replica, h.role, h.stage, h.process)
        self.metrics.count(cv.METRIC_EVENTS, h.stage, h.replica, len(batch))

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

    BATCH = 4096  # records per ring per cycle: bounds transient memory, and a busy ring
    # cannot starve the others for long (they are visited round-robin)

    def cycle(self, reap: bool) -> bool:
        """One round over every ring; True if some ring had more than one batch waiting."""
        t0 = time.perf_counter()
        backlog = False
        for src in self.collector.discover(time.time_ns()):
            self._note_process(src)
        for src, batch in self.collector.drain(self.BATCH):
            self._note_process(src)
            self._feed(src, batch)
            backlog = backlog or len(batch) >= self.BATCH
            if len(self.pending) >= 4096 or self.assembler.spans_built - self._exported_at >= 8192:
                self.export_pending()
        for src in list(self.collector.sources.values()):
            self._drops(src)
        if reap:
            for src in self.collector.reap():
                # one more drain after the writer is gone, then the ring can go
                batch = src.reader.read_batch()
                if batch:
                    self.collector.stats.events_read += len(batch)
                    src.events += len(batch)
                    self._feed(src, batch)
                self.assembler.process_died(src.header.pid)
                self.collector.retire(src)
                self._drops(src)
                if src.header.pid in self.processes and not self.processes[src.header.pid]["exited"]:
                    self.processes[src.header.pid]["exited"] = True
                    self.procs_dirty = True
            self.assembler.tick()
            self.metrics.queue.set(len(self.assembler.reqs))
        self.export_pending()
        self.cycles += 1
        self.max_cycle_ms = max(self.max_cycle_ms, (time.perf_counter() - t0) * 1e3)
        return backlog

    def export_pending(self) -> None:
        self._exported_at = self.assembler.spans_built
        texts = self.assembler.texts
        if texts:
            self.rundir.write_span_texts(texts, self.resources.attrs)
            texts.clear()
        if not self.pending:
            return
        self.rundir.write_span_objects(self.pending, self.resources.attrs)
        if self.exporters:  # SDK objects only when an OTLP exporter needs them
            spans = [export_otlp.to_readable(s, self.resources) for s in self.pending]
            for exp in self.exporters:
                exp.submit(spans)
        self.pending.clear()

    def counters(self) -> dict:
        rings = []
        for src in self.collector.all_sources():
            h = src.header
            rings.append({"name": src.name, "pid": h.pid, "tid": h.tid, "thread": h.thread,
                          "role": h.role, "stage": h.stage, "replica": h.replica,
                          "capacity": h.capacity, "events": src.events, "dropped": src.dropped,
                          "writer_exited": src.dead})
        rss = _rss_bytes()
        self.max_rss = max(self.max_rss, rss)
        exporters = {"file": {"exported": self.rundir.spans_written, "failed": 0, "dropped": 0}}
        for exp in self.exporters:
            exporters[exp.kind] = exp.counters()
        return {
            "events_read": self.collector.stats.events_read,
            "events_dropped": sum(r["dropped"] for r in rings),
            "rings_seen": self.collector.stats.rings_seen,
            "rings_unlinked": self.collector.stats.rings_unlinked,
            "ring_attach_errors": self.collector.stats.errors,
            "rings": rings,
            "spans_built": self.assembler.spans_built,
            "spans_incomplete": self.assembler.incomplete_spans,
            "step_events": self.assembler.step_events,
            "unknown_events": self.assembler.unknown_events,
            "requests_open": len(self.assembler.reqs),
            "requests_freed": self.assembler.requests_freed,
            "state": self.assembler.state_size(),
            "exporters": exporters,
            "drain_cycles": self.cycles,
            "max_cycle_ms": round(self.max_cycle_ms, 3),
            "rss_bytes": rss,
            "max_rss_bytes": max(self.max_rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        }

    def write_side_files(self) -> None:
        if self.procs_dirty:
            self.rundir.write_processes(list(self.processes.values()))
            self.procs_dirty = False
        c = self.counters()
        self._export_counters(c)
        self.rundir.write_agent(c)

    def _export_counters(self, c: dict) -> None:
        for kind, vals in c["exporters"].items():
            for outcome in ("exported", "failed", "dropped"):
                key = (kind, outcome)
                prev = self._last_export_counts.get(key, 0)
                if vals[outcome] > prev:
                    self.metrics.export_spans.labels(kind, outcome).inc(vals[outcome] - prev)
                    self._last_export_counts[key] = vals[outcome]

    def write_metrics(self) -> None:
        self.rundir.write_metrics(self.metrics.to_otlp(
            {"service.name": cv.SERVICE_NAME, "omnitrace.run.id": self.args.run_id},
            self.started_unix_ns, time.time_ns()))

    def run(self) -> None:
        interval = self.args.interval_ms / 1e3
        next_reap = next_side = time.monotonic()
        next_metrics = time.monotonic() + self.args.metrics_interval_s
        while not self.stop.is_set():
            now = time.monotonic()
            reap = now >= next_reap
            if reap:
                next_reap = now + 0.25
            backlog = self.cycle(reap)
            if now >= next_side:
                self.write_side_files()
                next_side = now + 1.0
            if now >= next_metrics:
                self.write_metrics()
                next_metrics = now + self.args.metrics_interval_s
            if not backlog:  # behind: go again at once, the rings are filling
                self.stop.wait(max(0.0, interval - (time.monotonic() - now)))

    def finish(self, status: str) -> None:
        """Final drain of every ring, incomplete spans, flush exporters, write files."""
        while self.cycle(reap=True):
            pass
        while self.cycle(reap=False):  # rings of processes still alive (e.g. orphans)
            pass
        self.assembler.flush("run-ended")
        self.export_pending()
        for src in self.collector.all_sources():
            self._drops(src, final=True)
        self.collector.close(unlink=True)
        timeout = self.args.otlp_timeout if self.args.otlp_timeout is not None else 10.0
        deadline = max(2.0, min(30.0, timeout + 1.0))
        threads = [threading.Thread(target=e.close, args=(deadline,)) for e in self.exporters]
        for t in threads:
            t.start()
        for t in threads:
            t.join(deadline + 5)
        self.write_metrics()
        self.procs_dirty = True
        self.write_side_files()
        self.meta.update(ended_unix_ns=time.time_ns(), status=status, exit_code=self.exit_code)
        self.rundir.write_run(self.meta)
        self.rundir.close()
        self.metrics.close()
        lost = {k: v for k, v in self.counters()["exporters"].items()
                if v.get("failed") or v.get("dropped")}
        for kind, v in lost.items():
            print(f"omnitrace agent: warning: {kind} lost {v['failed'] + v['dropped']} spans "
                  f"(failed {v['failed']}, dropped {v['dropped']}; {v.get('last_error') or 'queue full'})",
                  file=sys.stderr, flush=True)


def _watch_stdin(agent: Agent) -> None:
    for line in sys.stdin:
        parts = line.split()
        if parts[:1] == ["exit"]:
            try:
                agent.exit_code = int(parts[1])
            except (IndexError, ValueError):
                pass
            break
    agent.stop.set()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    for k in args.exporter.split(","):
        if k and k not in EXPORTERS:
            print(f"omnitrace agent: unknown exporter {k!r} (choose from {', '.join(EXPORTERS)})",
                  file=sys.stderr)
            return 2
    try:
        agent = Agent(args)
        info = agent.start()
    except (OSError, export_otlp.ConfigError, ValueError) as exc:
        print(f"omnitrace agent: cannot start: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    print("READY " + orjson.dumps(info).decode(), flush=True)
    threading.Thread(target=_watch_stdin, args=(agent,), daemon=True).start()
    try:
        agent.run()
    finally:
        agent.finish("complete")
    return 0


if __name__ == "__main__":
    sys.exit(main())
