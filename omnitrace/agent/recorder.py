"""The agent's recorder: the drain thread that copies every ring's new slots into the
run's event log (the record) and hands the decoded batches to the view pump.

Its work per event is a memcpy, a vectorised decode and its share of a zstd block, so the
record keeps up at any load. The hand-off (:class:`Handoff`) is bounded: past
``BACKLOG_EVENTS`` waiting for the views, batches are skipped for the views only (counted:
agent.json ``views.events_skipped``), never for the record.
"""
from __future__ import annotations

import bisect
import threading
import time
from collections import deque

from omnitrace import conventions as cv
from omnitrace import eventlog, record, rowops
from omnitrace.agent.collect import Collector, RingSource
from omnitrace.agent.config import AgentConfig
from omnitrace.agent.export_prometheus import Metrics
from omnitrace import console


class Handoff:
    """What the drain thread gives the view pump, in order: ``(ring, records)``, ``(ring,
    description)`` (a ring described anew) or ``(ring, None)`` (its writer died)."""

    BACKLOG_EVENTS = 2_000_000  # decoded events waiting for the views (~70 MB)

    def __init__(self) -> None:
        self.items: deque = deque()
        self.events = 0  # events waiting
        self.skipped = 0  # events the views never got (the record has them)
        self.oldest = 0.0  # monotonic time the oldest waiting batch came

    def records(self, idx: int, rec) -> None:
        n = len(rec)
        if self.events + n > self.BACKLOG_EVENTS:
            self.skipped += n  # views behind: the record still has them
            return
        if not self.events:
            self.oldest = time.monotonic()
        self.items.append((idx, rec))
        self.events += n

    def note(self, idx: int, item: dict | None) -> None:
        self.items.append((idx, item))


class Recorder:
    """The drain thread and the state it owns (rings, decoders, the event log writer)."""

    LAG_BOUNDS_MS = (5.0, 20.0, 100.0, 500.0)
    RAW_SLOTS = 1 << 15  # slots per ring per drain cycle (1 MiB): bounds the copy in
    # memory, and a busy ring cannot starve the others for long (round-robin)
    DISCOVER_PERIOD_S = 0.25  # new rings (listing /dev/shm) and dead writers, this often
    HURRY_MS = 10.0  # the next drain cycle this soon when a ring filled HURRY_FILL since the last
    HURRY_FILL = 1 / 8

    def __init__(self, cfg: AgentConfig, metrics: Metrics, handoff: Handoff,
                 resume: eventlog.ResumeState | None = None, known_rings: dict[str, int] | None = None) -> None:
        """``resume``/``known_rings``: an agent taking over from one that died (its event
        log's state; every ring index it gave, by ring name, from its agent.json)."""
        self.cfg, self.metrics, self.handoff = cfg, metrics, handoff
        self.collector = Collector(cfg.run_id, cfg.shm_dir)
        self.requests = record.RequestIds()
        self.log = eventlog.EventLogWriter(cfg.run_dir, cfg.run_id, self.collector.offset_ns,
                                           cfg.max_run_bytes, resume=resume)
        self.processes: dict[int, dict] = {}
        self.procs_dirty = False
        self.warned_drops: dict[str, int] = {}
        # ring name -> index; a resumed agent keeps the dead one's and never reuses one
        self.ring_idx: dict[str, int] = dict(known_rings or {})
        for idx, info in (resume.rings.items() if resume else ()):
            self.ring_idx.setdefault(str(info.get("name")), idx)
        self._next_idx = max(self.ring_idx.values(), default=-1) + 1
        self._tables_taken = resume.tables if resume else {}
        self._ident: dict[int, tuple] = {}
        self.decoders: dict[int, record.SlotDecoder] = {}
        self.events_read = 0
        self.cycles = 0
        self.max_cycle_ms = 0.0
        self.max_drain_lag_ms = 0.0
        self.drain_lags = [0] * (len(self.LAG_BOUNDS_MS) + 1)
        self.error = ""  # why the drain thread failed, if it did
        self.drained = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        """The drain thread, until ``stop`` is set; then a final drain (``drained``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, args=(stop,), name="omnitrace-drain",
                                            daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ rings
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
                console.say("agent", f"warning: ring of pid {h.pid} thread {h.thread!r} "
                            f"dropped {src.dropped} events so far (ring full; raise "
                            f"{cv.ENV_RING_RECORDS}, now {h.capacity})")
            self.warned_drops[src.name] = src.dropped

    def _ring(self, src: RingSource) -> int:
        """The ring's index; (re)describes it in the event log when its writer changed."""
        idx = self.ring_idx.get(src.name)
        if idx is None:
            idx = self.ring_idx[src.name] = self._next_idx
            self._next_idx += 1
        if idx not in self.decoders:
            self.decoders[idx] = dec = record.SlotDecoder(self.requests)
            if idx in self._tables_taken:  # ids the dead agent's decoder had learnt
                dec.load_table(self._tables_taken[idx])
        h = src.header
        ident = (h.pid, h.role, h.stage, h.replica, h.process, h.thread)
        if self._ident.get(idx) != ident:
            self._ident[idx] = ident
            info = {"name": src.name, "pid": h.pid, "tid": h.tid, "thread": h.thread,
                    "role": h.role, "stage": h.stage, "replica": h.replica,
                    "process": h.process, "capacity": h.capacity}
            self.log.ring(idx, info)
            self.handoff.note(idx, info)
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
        dec = self.decoders[idx]
        rec = dec.decode(raw)
        if dec.cut:  # the rest of the string now (the writer publishes it whole): the
            # ring's read cursor never rests inside one, where an agent taking over would
            # read text as records
            rest = src.reader.read_raw(dec.need_slots)
            raw += rest
            rec = rowops.concat((rec, dec.decode(rest)), record.RECORD_DTYPE)
        n = len(rec)
        self.log.records(idx, raw, n)
        src.events += n
        self.events_read += n
        if n:
            self.handoff.records(idx, rec)
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
                self._retire(src)
        cut = any(dec.cut for dec in self.decoders.values())
        self._say(self.log.commit(self._tables(), can_rotate=not cut))
        self.cycles += 1
        self.max_cycle_ms = max(self.max_cycle_ms, (time.perf_counter() - t0) * 1e3)
        return backlog

    def _retire(self, src: RingSource) -> None:
        """A ring whose writer is gone: read to the end, its final counts recorded."""
        while self._take(src):
            pass
        idx = self._ring(src)
        self.log.died(idx)
        self._account(src, idx)
        self.handoff.note(idx, None)
        self.collector.retire(src)
        self._drops(src)
        proc = self.processes.get(src.header.pid)
        if proc is not None and not proc["exited"]:
            proc["exited"] = True
            self.procs_dirty = True

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
        console.say("agent", f"{msg}")

    def _loop(self, stop: threading.Event) -> None:
        interval = self.cfg.interval_ms / 1e3
        next_reap = time.monotonic()
        try:
            while not stop.is_set():
                now = time.monotonic()
                reap = now >= next_reap
                if reap:
                    next_reap = now + self.DISCOVER_PERIOD_S
                due = now + (self.HURRY_MS / 1e3 if self.drain_cycle(reap) else interval)
                if stop.wait(max(0.0, due - time.monotonic())):
                    break
                # how late this thread got the GIL back (the views run meanwhile)
                lag_ms = (time.monotonic() - due) * 1e3
                self.max_drain_lag_ms = max(self.max_drain_lag_ms, lag_ms)
                self.drain_lags[bisect.bisect_left(self.LAG_BOUNDS_MS, lag_ms)] += 1
            self._final_drain()
        except Exception as exc:  # the main thread must still finish
            self.error = f"{type(exc).__name__}: {exc}"
            console.say("agent", f"drain thread failed: {self.error}; recording stopped "
                        "(run.json: status drain-failed)")
        finally:
            self.drained.set()

    def _final_drain(self) -> None:
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

    # ------------------------------------------------------------------ counters
    @staticmethod
    def _header_now(src: RingSource) -> record.RingHeader:
        """A live ring's header as of now (the drain thread refreshes ``src.header`` only
        when it reads); the last one if the drain thread retired the ring meanwhile."""
        try:
            return src.reader.header()
        except (TypeError, ValueError, AttributeError):
            return src.header

    def counters(self) -> dict:
        """The recorder's part of agent.json."""
        rings = []
        live = set(self.collector.sources)
        for src in self.collector.all_sources():
            h = self._header_now(src) if src.name in live else src.header
            rings.append({"name": src.name, "index": self.ring_idx.get(src.name), "pid": h.pid,
                          "tid": h.tid, "thread": h.thread, "role": h.role, "stage": h.stage,
                          "replica": h.replica, "capacity": h.capacity, "events": src.events,
                          "events_written": h.events_written, "dropped": h.dropped,
                          "writer_exited": src.dead})
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
            "drain_cycles": self.cycles,
            "max_cycle_ms": round(self.max_cycle_ms, 3),
            "max_drain_lag_ms": round(self.max_drain_lag_ms, 3),
            "drain_lag_ms_counts": dict(zip(("<=5", "<=20", "<=100", "<=500", ">500"), self.drain_lags)),
        }
