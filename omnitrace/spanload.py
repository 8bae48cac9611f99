"""The one loader: a run's event log -> span feeds -> sinks.

Every analysis of a recorded run reads the record this one way, as Perfetto's trace
processor does (one importer fills the tables; every analysis reads them, never the
input): the report's tables (``analyze/tables.py``), ``omnitrace export`` (OTLP), the
flame graphs' span index (``profile/linked.py``) are sinks (:class:`Sink`) of :func:`load`.
Several sinks take one load together; each holds only what it keeps, never the log.

The pipeline: the log decoded a part at a time and each part's feeds made ready
(``spantable.Prepared``: grouped by kind, request and sender events in time order); the
span builder (:class:`spantable.SpanBuilder`, incremental, as live) taking the feeds on
the calling thread; the sinks taking each feed's spans, in order, on another thread.

All three are mostly numpy, but each holds the GIL between its numpy calls: in one
process, the builder's thread got the CPU for ~70% of the load's wall time, waiting the
rest on the GIL the decoding held. A large log is therefore decoded and prepared by a
forked helper process, which also applies the sender rule (``spantable.SenderTasks``:
the FIFO senders' busy intervals, from its own copy of the ring descriptions) and hands
each prepared feed over a pipe (its arrays written and read in place); this process only
receives, builds and hands on. Same feeds, same order, so the same spans
(tests/system/test_spanload.py). Where fork is unavailable or the helper fails, the log is
decoded here, on a thread: slower, never a different answer. A corrupt log is the same
one-line error either way.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from omnitrace import childproc
from omnitrace import conventions as cv
from omnitrace import eventlog, rowops, threads
from omnitrace import spantable as stt
from omnitrace.runfiles import names

# events per feed: a feed's temporaries (~300 bytes per event) stay in the caches (feeds of
# 1M events took ~1.4x as long)
FEED_EVENTS = 1 << 17
# event segment bytes (~5 per event) from which a helper process decodes the log: below
# it the fork and the pipe cost more than they save (10M events: 52 MB)
HELPER_MIN_BYTES = 16 << 20
_STEP_KINDS = [int(cv.Ev.STEP_BEGIN), int(cv.Ev.STEP_END)]
_STEP_MASK = np.isin(np.arange(256), _STEP_KINDS)
STEP_EVENT_DTYPE = np.dtype([("ring", "<i4"), ("kind", "u1"), ("t", "<i8")])


@dataclass(frozen=True)
class Part:
    """What a sink needs beside a feed to read it: the ring descriptions as of the feed,
    and the run's request ids by number (append-only; every id the feed holds is in it)."""

    rings: dict[int, dict]
    requests: list[str]


def replica_of(rings: dict[int, dict]) -> dict[int, int]:
    """pid -> replica of the processes the ring descriptions name."""
    return {int(r["pid"]): int(r.get("replica", 0)) for r in rings.values() if "pid" in r}


@dataclass
class Loaded:
    """What the load saw besides the spans: the decoder's account (rings, request ids,
    warnings, torn records: ``eventlog.EventLog`` without events), the event count, the
    STAGE_DIED events as (stage, time), the DELIVERY_TIMEOUT events as (stage, time, request
    index, chunk), the scheduler steps' events (``STEP_EVENT_DTYPE``, in log order) and the
    events per (ring, kind) (``ring_kinds[ring, kind]``)."""

    log: eventlog.EventLog
    events: int = 0
    died: list[tuple[int, int]] = field(default_factory=list)
    timeouts: list[tuple[int, int, int, int]] = field(default_factory=list)
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, STEP_EVENT_DTYPE))
    ring_kinds: np.ndarray = field(default_factory=lambda: np.zeros((0, 256), np.int64))


class Sink(Protocol):
    """A taker of span feeds, from :func:`load` or from the live agent's builder (its
    views, ``agent/views.py``). ``feed`` is called for each feed in order (by ``load`` on
    one thread that is not the caller's); what a sink does at the end is its owner's call.
    ``culprits``: it reads FIFO spans' ``blocked_by`` (by0..by2), which the builder ranks
    only when some sink does (a sort over every overlap). ``steps``: it reads
    ``Loaded.steps`` and ``Loaded.ring_kinds``, which the load collects only then (~10 ns
    per event). ``chunks`` (True where a sink does not say): it reads chunk spans or
    ``Feed.busy``; a load whose sinks all read neither pairs no chunk stamps (at 150M
    events, most of the load's work)."""

    culprits: bool
    steps: bool
    chunks: bool

    def feed(self, feed: stt.Feed, part: Part) -> None: ...


class HelperFailed(Exception):
    """The helper process died or failed: the log is decoded here instead."""


def load(path: str, sinks: list[Sink], helper: bool | None = None) -> Loaded | None:
    """Feed every span of ``path``'s event log to ``sinks``; what the load saw besides
    (None if the run has no event log). ``helper``: decode in a helper process (None:
    where the log is large and this machine has two cores). A run recorded before the event
    log (spans.jsonl) is one line, ``eventlog.EventLogError``: every reader of a run loads it
    here."""
    if not os.path.isdir(os.path.join(path, eventlog.DIR)):
        if os.path.exists(names.path(path, names.SPANS)):
            raise eventlog.EventLogError(
                f"{path}: recorded before the event log ({names.SPANS}, no {eventlog.DIR}/): "
                "this omnitrace cannot read it")
        return None
    if helper is None:
        helper = helper_pays(path)
    steps, chunks = _wants(sinks, "steps", False), _wants(sinks, "chunks", True)
    if helper:
        try:
            return _load_beside(path, sinks, steps, chunks)
        except HelperFailed:
            pass
    return _load_here(path, sinks, steps, chunks)


def _wants(sinks: list[Sink], what: str, unsaid: bool) -> bool:
    """Whether some sink reads ``what`` (``Sink``'s flags; ``unsaid``: a sink that does not say)."""
    return any(getattr(s, what, unsaid) for s in sinks)


def helper_pays(path: str) -> bool:
    if not childproc.fork_available():
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return cores >= 2 and eventlog.size(path) >= HELPER_MIN_BYTES


class _Reading:
    """The decoding of one log: its parts as prepared feeds, and what it sees besides the
    spans (``chunks``: as ``Prepared`` takes it)."""

    def __init__(self, path: str, steps: bool, chunks: bool) -> None:
        self.log, self._parts = eventlog.stream_event_log(path)
        self._with_steps, self._chunks = steps, chunks
        self.seen = Loaded(self.log)
        self._steps: list[np.ndarray] = []

    def parts(self) -> Iterator[tuple[list[stt.Prepared], dict]]:
        """Each decoded part's feeds, prepared, and the rings as described up to it (the
        decoder already changes ``log.rings`` for the next part)."""
        for ev in self._parts:
            rings = dict(self.log.rings)
            described = max(rings, default=-1) + 1
            prepared = []
            for lo in range(0, len(ev), FEED_EVENTS):
                feed = ev[lo:lo + FEED_EVENTS]
                prepared.append(stt.Prepared(feed, self._chunks, max(described, 1)))
                self._note(feed, prepared[-1].ring_kinds)
            yield prepared, rings

    def _note(self, ev: np.ndarray, ring_kinds: np.ndarray) -> None:
        """What a feed holds besides spans. Its events per ring and kind (the grouping's:
        no pass of its own) say whether a rare kind is there to be looked for."""
        seen = self.seen
        seen.events += len(ev)
        kinds = ring_kinds.sum(axis=0)
        if kinds[cv.Ev.STAGE_DIED]:
            d = ev[ev["kind"] == cv.Ev.STAGE_DIED]
            seen.died.extend(zip(d["stage"].tolist(), d["t"].tolist()))
        if kinds[cv.Ev.DELIVERY_TIMEOUT]:
            d = ev[ev["kind"] == cv.Ev.DELIVERY_TIMEOUT]
            seen.timeouts.extend(zip(d["stage"].tolist(), d["t"].tolist(), d["req"].tolist(), d["chunk"].tolist()))
        if not self._with_steps:
            return
        if kinds[_STEP_KINDS].any():
            s = stt.of_kinds(ev, _STEP_MASK)
            rows = np.zeros(len(s), STEP_EVENT_DTYPE)
            rows["ring"], rows["kind"], rows["t"] = s["ring"], s["kind"], s["t"]
            self._steps.append(rows)
        n = len(ring_kinds)
        if n > len(seen.ring_kinds):
            seen.ring_kinds = np.concatenate(
                (seen.ring_kinds, np.zeros((n - len(seen.ring_kinds), 256), np.int64)))
        seen.ring_kinds[:n] += ring_kinds

    def done(self) -> Loaded:
        if self._steps:
            self.seen.steps = np.concatenate(self._steps)
        return self.seen


def _load_here(path: str, sinks: list[Sink], steps: bool, chunks: bool) -> Loaded:
    reading = _Reading(path, steps, chunks)
    strings = reading.log.requests.strings

    def prepared() -> Iterator[tuple[list[stt.Prepared], Part]]:
        for feeds, rings in reading.parts():  # made ready on the reader thread
            yield feeds, Part(rings, strings)

    return _feed(prepared(), sinks, reading.done)


def _load_beside(path: str, sinks: list[Sink], steps: bool, chunks: bool) -> Loaded:
    helper = _Helper(path, steps, chunks)
    try:
        strings: list[str] = []
        final: list[Loaded] = []

        def prepared() -> Iterator[tuple[list[stt.Prepared], Part]]:
            while True:
                msg = helper.recv_obj()
                if msg[0] == "end":
                    final.append(msg[1])  # the helper's Loaded
                    return
                _, rings, new, values = msg
                strings.extend(new)  # before the feeds that hold them
                yield [stt.Prepared.of_arrays(v, [helper.recv_rows(d) for d in stt.Prepared.ARRAY_DTYPES])
                       for v in values], Part(rings, strings)

        return _feed(prepared(), sinks, lambda: final[0])
    finally:
        helper.close()


def _feed(parts: Iterator[tuple[list[stt.Prepared], Part]], sinks: list[Sink],
          final: Callable[[], Loaded]) -> Loaded:
    """The pipeline: ``parts`` made on a thread, built here, handed to the sinks on another
    thread; ``final()``: what the load saw, once every part is read (the final rings and
    the writers that died)."""
    builder = stt.SpanBuilder({}, culprits=_wants(sinks, "culprits", False))

    def to_sinks(feed: stt.Feed, part: Part) -> None:
        for s in sinks:
            s.feed(feed, part)

    # the sinks take one feed's spans while the builder makes the next, and the next part
    # is decoded and grouped while the builder works (most of each is numpy: the GIL free)
    with threads.in_order_beside(to_sinks, name="omnitrace-load-sinks") as hand_on:
        for feeds, part in threads.read_ahead(parts, name="omnitrace-load-parts"):
            builder.rings.update(part.rings)  # a part may add rings or re-describe one (new writer)
            builder.ring_changed()
            for f in feeds:  # the builder takes any cut
                hand_on(builder.feed(f), part)
        loaded = final()
        log = loaded.log
        builder.rings.update(log.rings)
        builder.ring_changed()
        for idx in log.died:
            builder.process_died(int(log.rings.get(idx, {}).get("pid", 0)))
        hand_on(builder.flush(), Part(dict(log.rings), log.requests.strings))
    return loaded


# ---------------------------------------------------------------------- the helper
class _Helper:
    """The forked process that decodes and prepares the log, as this process sees it:
    messages in order, each part ``("part", rings, new request ids, [feed values])``
    followed by each feed's arrays, then ``("end", Loaded)``; or ``("error", message)``
    (a corrupt log) or ``("failed", message)``."""

    def __init__(self, path: str, steps: bool, chunks: bool) -> None:
        rfd, wfd = os.pipe()
        try:
            self._proc = mp.get_context("fork").Process(
                target=_helper_main, args=(path, steps, chunks, rfd, wfd), daemon=True, name="omnitrace-load-decoder")
            self._proc.start()
        except OSError as exc:  # no fork (process limit, memory)
            os.close(rfd)
            os.close(wfd)
            raise HelperFailed(str(exc)) from None
        os.close(wfd)
        self._pipe = _Pipe(rfd=rfd)

    def recv_obj(self) -> Any:
        try:
            msg = self._pipe.recv_obj()
        except (EOFError, OSError, pickle.UnpicklingError) as exc:  # it died (killed, memory)
            raise HelperFailed(str(exc)) from None
        if msg[0] == "error":
            raise eventlog.EventLogError(msg[1])
        if msg[0] == "failed":
            raise HelperFailed(msg[1])
        return msg

    def recv_rows(self, dtype: np.dtype) -> np.ndarray:
        try:
            return self._pipe.recv_rows(dtype)
        except (EOFError, OSError) as exc:
            raise HelperFailed(str(exc)) from None

    def close(self) -> None:
        self._pipe.close()  # a helper still writing gets EPIPE and leaves
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()


def _helper_main(path: str, steps: bool, chunks: bool, rfd: int, wfd: int) -> None:
    # Ctrl-C is the reader's to handle: it closes the pipe, and the helper leaves on EPIPE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.close(rfd)
    out = _Pipe(wfd=wfd)
    try:
        reading = _Reading(path, steps, chunks)
        strings = reading.log.requests.strings
        tasks = stt.SenderTasks()  # the sender rule here: the builder gets the closed tasks
        sent = 0
        for prepared, rings in reading.parts():
            top = max([p.max_ring for p in prepared] + list(rings), default=-1) + 1
            pids = stt.ring_column(rings, top, "pid")  # as the builder's, given these rings
            for p in prepared:
                p.closed = tasks.close(p.senders, pids)
            sendable = [p.arrays() for p in prepared]
            out.send_obj(("part", rings, strings[sent:], [v for v, _ in sendable]))
            sent = len(strings)
            for _, arrays in sendable:
                for a in arrays:
                    out.send_rows(a)
        out.send_obj(("end", reading.done()))
    except OSError:  # the reader left (its error, Ctrl-C), or a file would not read: the
        pass  # reader then decodes the log itself and says why
    except eventlog.EventLogError as exc:
        with contextlib.suppress(OSError):
            out.send_obj(("error", str(exc)))
    except Exception as exc:  # noqa: BLE001 - the reader decodes the log itself instead
        with contextlib.suppress(OSError):
            out.send_obj(("failed", f"{type(exc).__name__}: {exc}"))
    finally:
        out.close()


class _Pipe:
    """Length-framed messages over an OS pipe: pickled objects, and numpy rows written from
    and read into their arrays directly (``multiprocessing.Connection`` reads a message
    into a BytesIO and copies it once more)."""

    def __init__(self, rfd: int = -1, wfd: int = -1) -> None:
        self.rfd, self.wfd = rfd, wfd
        with contextlib.suppress(ImportError, OSError, AttributeError):  # fewer, larger writes and reads
            import fcntl
            fcntl.fcntl(rfd if rfd >= 0 else wfd, fcntl.F_SETPIPE_SZ, 1 << 20)

    def _write(self, data: memoryview) -> None:
        while len(data):
            data = data[os.write(self.wfd, data):]

    def _read(self, into: memoryview) -> None:
        while len(into):
            n = os.readv(self.rfd, [into])
            if not n:
                raise EOFError("the writer closed the pipe")
            into = into[n:]

    def _size(self) -> int:
        head = bytearray(8)
        self._read(memoryview(head))
        return int.from_bytes(head, "little")

    def send_obj(self, obj: Any) -> None:
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        self._write(memoryview(len(data).to_bytes(8, "little") + data))

    def recv_obj(self) -> Any:
        data = bytearray(self._size())
        self._read(memoryview(data))
        return pickle.loads(data)

    def send_rows(self, rows: np.ndarray) -> None:
        raw = np.ascontiguousarray(rows).view(np.uint8)
        self._write(memoryview(raw.nbytes.to_bytes(8, "little")))
        self._write(memoryview(raw))

    def recv_rows(self, dtype: np.dtype) -> np.ndarray:
        out = np.empty(self._size() // dtype.itemsize, dtype)
        self._read(memoryview(out.view(np.uint8)))
        return out

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.rfd = self.wfd = -1
