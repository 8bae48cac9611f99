"""`omnitrace agent`: drain the run's rings, assemble spans, export them.

Started by `omnitrace run` with stdin and stdout as pipes: the agent prints one
``READY {json}`` line on stdout once its exporters are up (or a one-line error and exit
status 2), and does its final drain and flush when it reads ``exit CODE`` on stdin, when
stdin closes (its parent died), or on SIGTERM/SIGINT.
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

import orjson

from omnitrace import __version__
from omnitrace import conventions as cv
from omnitrace.agent import export_otlp
from omnitrace.agent import spool as spool_mod
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
        # raw spool: the drain thread fills it, assembly (main thread) empties it
        self.spool = spool_mod.Spool(self.rundir.file("events.bin"))
        self.ring_idx: dict[str, int] = {}
        self.ring_src: dict[int, RingSource] = {}
        self._spooled_ident: dict[int, tuple] = {}
        self.ring_meta: dict[int, dict] = {}
        self.decoders: dict[int, spool_mod.RingDecoder] = {}
        self.slots_spooled = 0
        self.max_drain_lag_ms = 0.0
        self.drain_lags = [0] * (len(self.LAG_BOUNDS_MS) + 1)  # wake-up lateness histogram
        self.final_assembly_s = 0.0
        self.started_mono = time.monotonic()
        self.drained = threading.Event()
        self._drain_thread = threading.Thread(target=self._drain_loop, name="omnitrace-drain",
                                              daemon=True)
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

    LAG_BOUNDS_MS = (5.0, 20.0, 100.0, 500.0)
    RAW_SLOTS = 1 << 15  # slots per ring per drain cycle (1 MiB): bounds the copy in
    # memory, and a busy ring cannot starve the others for long (round-robin)

    # ------------------------------------------------------------------ drain thread
    def _ring_idx(self, src: RingSource) -> int:
        idx = self.ring_idx.get(src.name)
        if idx is None:
            idx = self.ring_idx[src.name] = len(self.ring_idx)
            self.ring_src[idx] = src
        h = src.header
        ident = (h.pid, h.role, h.stage, h.replica, h.process)
        if self._spooled_ident.get(idx) != ident:
            self._spooled_ident[idx] = ident
            self.spool.ring(idx, {"name": src.name, "pid": h.pid, "tid": h.tid,
                                  "thread": h.thread, "role": h.role, "stage": h.stage,
                                  "replica": h.replica, "process": h.process,
                                  "offset_ns": src.offset_ns})
        return idx

    def drain_cycle(self, reap: bool) -> bool:
        """Copy every ring's new slots into the spool and free them; True if some ring
        had more than one cycle's worth waiting. Runs on the drain thread only."""
        t0 = time.perf_counter()
        backlog = False
        for src in self.collector.discover(time.time_ns()):
            self._note_process(src)
            self._ring_idx(src)
        for src in list(self.collector.sources.values()):
            raw = src.reader.read_raw(self.RAW_SLOTS)
            src.dropped = src.reader.dropped()
            if raw:
                src.header = src.reader.header()  # role/stage may be set after creation
                self._note_process(src)
                self.spool.records(self._ring_idx(src), raw)
                self.slots_spooled += len(raw) // 32
                backlog = backlog or len(raw) >= self.RAW_SLOTS * 32
            self._drops(src)
        if reap:
            for src in self.collector.reap():
                # one more drain after the writer is gone, then the ring can go
                while True:
                    raw = src.reader.read_raw(self.RAW_SLOTS)
                    if not raw:
                        break
                    self.spool.records(self._ring_idx(src), raw)
                    self.slots_spooled += len(raw) // 32
                self.spool.died(self._ring_idx(src))
                self.collector.retire(src)
                self._drops(src)
                if src.header.pid in self.processes and not self.processes[src.header.pid]["exited"]:
                    self.processes[src.header.pid]["exited"] = True
                    self.procs_dirty = True
        self.spool.commit()
        self.cycles += 1
        self.max_cycle_ms = max(self.max_cycle_ms, (time.perf_counter() - t0) * 1e3)
        return backlog

    def _drain_loop(self) -> None:
        """The drain thread: raw copies every interval, then the final drain at stop."""
        interval = self.args.interval_ms / 1e3
        next_reap = time.monotonic()
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                reap = now >= next_reap
                if reap:
                    next_reap = now + 0.25
                backlog = self.drain_cycle(reap)
                if not backlog:
                    due = now + interval
                    if self.stop.wait(max(0.0, due - time.monotonic())):
                        break
                    # how late this thread got the GIL back after its sleep (assembly runs
                    # meanwhile on the main thread): the measure that drain is not starved
                    lag_ms = (time.monotonic() - due) * 1e3
                    self.max_drain_lag_ms = max(self.max_drain_lag_ms, lag_ms)
                    self.drain_lags[bisect.bisect_left(self.LAG_BOUNDS_MS, lag_ms)] += 1
            while self.drain_cycle(reap=True):
                pass
            while self.drain_cycle(reap=False):  # rings of processes still alive (orphans)
                pass
            self.collector.close(unlink=True)
            for src in self.collector.all_sources():
                self._drops(src, final=True)
        except Exception as exc:  # the main thread must still finish what was spooled
            print(f"omnitrace agent: drain thread failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        finally:
            self.drained.set()

    # ------------------------------------------------------------------ assembly (main thread)
    def assemble_some(self, max_bytes: int = 4 << 20) -> int:
        """Assemble up to ``max_bytes`` of spooled blocks; returns how many blocks."""
        blocks = self.spool.read_blocks(max_bytes)
        for kind, idx, payload in blocks:
            if kind == spool_mod.RECORDS:
                dec = self.decoders.get(idx)
                if dec is None:
                    dec = self.decoders[idx] = spool_mod.RingDecoder()
                batch = dec.decode(payload)
                if batch:
                    m = self.ring_meta[idx]
                    self.assembler.feed(batch, m["offset_ns"], m["pid"], m["replica"],
                                        m["role"], m["stage"], m["process"])
                    self.metrics.count(cv.METRIC_EVENTS, m["stage"], m["replica"], len(batch))
                    self.collector.stats.events_read += len(batch)
                    src = self.ring_src.get(idx)
                    if src is not None:
                        src.events += len(batch)
                if len(self.pending) >= 4096 or self.assembler.spans_built - self._exported_at >= 8192:
                    self.export_pending()
            elif kind == spool_mod.RING:
                self.ring_meta[idx] = orjson.loads(payload)
            elif kind == spool_mod.DIED:
                m = self.ring_meta.get(idx)
                if m is not None:
                    self.assembler.process_died(m["pid"])
                self.decoders.pop(idx, None)  # its interned ids are not needed any more
        return len(blocks)

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
            "max_drain_lag_ms": round(self.max_drain_lag_ms, 3),
            "drain_lag_ms_counts": dict(zip(("<=5", "<=20", "<=100", "<=500", ">500"),
                                            self.drain_lags)),
            "spool": {"slots_spooled": self.slots_spooled,
                      "bytes_written": self.spool.total_written,
                      "bytes_assembled": self.spool.total_read,
                      "backlog_bytes": self.spool.backlog(),
                      "truncations": self.spool.truncations},
            "final_assembly_s": round(self.final_assembly_s, 3),
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
        """Assembly on the main thread, from the spool, at its own pace."""
        interval = self.args.interval_ms / 1e3
        self._drain_thread.start()
        next_tick = next_side = time.monotonic()
        next_metrics = time.monotonic() + self.args.metrics_interval_s
        while not self.stop.is_set():
            now = time.monotonic()
            busy = self.assemble_some() > 0
            self.export_pending()
            if now >= next_tick:
                self.assembler.tick()
                self.metrics.queue.set(len(self.assembler.reqs))
                next_tick = now + 0.25
            if now >= next_side:
                self.write_side_files()
                next_side = now + 1.0
            if now >= next_metrics:
                self.write_metrics()
                next_metrics = now + self.args.metrics_interval_s
            if not busy:
                self.stop.wait(interval)

    def finish(self, status: str) -> None:
        """Final drain of every ring (drain thread), assembly of the whole spool (however
        long it takes, with progress on stderr), incomplete spans, exporters, files."""
        self.stop.set()
        if not self._drain_thread.is_alive() and not self.drained.is_set():
            self._drain_thread.start()  # run() never started it (an early stop)
        t0 = time.monotonic()
        next_note = t0 + 2.0
        next_side = t0 + 1.0
        while True:
            done = self.drained.is_set()  # read before the backlog: nothing spooled after
            if self.assemble_some() == 0:
                if done and self.spool.backlog() == 0:
                    break
                self.drained.wait(0.02)
            self.export_pending()
            now = time.monotonic()
            if now >= next_note:
                left = self.spool.backlog()
                print(f"omnitrace agent: final assembly: {left / 2**20:.1f} MiB of spooled events "
                      f"left ({self.spool.total_read / 2**20:.0f} MiB done, "
                      f"{now - t0:.0f} s so far)", file=sys.stderr, flush=True)
                next_note = now + 5.0
            if now >= next_side:  # keeps agent.json fresh: `omnitrace run` watches it
                self.write_side_files()
                next_side = now + 1.0
        self.final_assembly_s = time.monotonic() - t0
        if self.final_assembly_s >= 2.0:
            print(f"omnitrace agent: final assembly done in {self.final_assembly_s:.1f} s",
                  file=sys.stderr, flush=True)
        self.spool.close(remove=True)
        self.assembler.flush("run-ended")
        self.export_pending()
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
