"""An event log -> the report's tables (:class:`tables.ReportTables`), on two cores.

The pipeline: the log decoded a part at a time and each part's feeds made ready
(``spantable.Prepared``: grouped by kind, request and sender events in time order); the
span builder (:class:`spantable.SpanBuilder`, incremental, as live) taking the feeds on
the calling thread; the report's tables taking each feed's spans on another thread.

All three are mostly numpy, but each holds the GIL between its numpy calls: in one
process, the builder's thread got the CPU for ~70% of the load's wall time, waiting the
rest on the GIL the decoding held (50M events: builder 13.9 s of CPU in 20 s; decoding
and preparing 8.1 s; tables 3.9 s). A large log is therefore decoded and prepared by a
forked helper process, which also applies the sender rule (``spantable.SenderTasks``:
the FIFO senders' busy intervals, from its own copy of the ring descriptions) and hands
each prepared feed over a pipe (its arrays written and read in place); this process only
receives, builds and tabulates. Same feeds, same
order, so the same spans (tests/test_eventload.py). Where fork is unavailable or the
helper fails, the log is decoded here, on a thread: slower, never a different answer. A
corrupt log is the same one-line error either way.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from omnitrace import conventions as cv
from omnitrace import eventlog
from omnitrace import spantable as stt
from omnitrace.analyze import beside, tables

# events per feed: a feed's temporaries (~300 bytes per event) stay in the caches (feeds of
# 1M events took ~1.4x as long)
FEED_EVENTS = 1 << 17
# event segment bytes (~5 per event) from which a helper process decodes the log: below
# it the fork and the pipe cost more than they save (10M events: 52 MB)
HELPER_MIN_BYTES = 16 << 20


class HelperFailed(Exception):
    """The helper process died or failed: the log is decoded here instead."""


@dataclass
class Built:
    """A log's tables, its decoder's account (rings, request ids, warnings, torn records:
    ``eventlog.EventLog`` without events), its event count and its STAGE_DIED events as
    (stage, time)."""

    log: eventlog.EventLog
    acc: tables.ReportTables
    events: int
    died: list[tuple[int, int]]


def build(path: str, skip: frozenset[str], helper: bool | None = None) -> Built | None:
    """The tables of ``path``'s event log (None if it has none); ``skip``: warm-up request
    ids (left out of attribution); ``helper``: decode in a helper process (None: where the
    log is large and this machine has two cores)."""
    if not os.path.isdir(os.path.join(path, eventlog.DIR)):
        return None
    if helper is None:
        helper = _helper_pays(path)
    if helper:
        try:
            return _build_beside(path, skip)
        except HelperFailed:
            pass
    return _build_here(path, skip)


def _helper_pays(path: str) -> bool:
    if not beside.fork_available():
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return cores >= 2 and sum(os.path.getsize(p) for p in eventlog.segments(path)) >= HELPER_MIN_BYTES


class _Reading:
    """The decoding of one log: its parts as feeds, and what it sees besides the events."""

    def __init__(self, path: str) -> None:
        self.log, self._parts = eventlog.stream_event_log(path)
        self.events = 0
        self.died: list[tuple[int, int]] = []

    def parts(self) -> Iterator[tuple[list[np.ndarray], dict]]:
        """Each decoded part's feeds and the rings as described up to it (the decoder
        already changes ``log.rings`` for the next part)."""
        for ev in self._parts:
            self.events += len(ev)
            d = ev[ev["kind"] == cv.Ev.STAGE_DIED]
            self.died.extend(zip(d["stage"].tolist(), d["t"].tolist()))
            yield [ev[lo:lo + FEED_EVENTS] for lo in range(0, len(ev), FEED_EVENTS)], dict(self.log.rings)


def _build_here(path: str, skip: frozenset[str]) -> Built:
    reading = _Reading(path)

    def prepared() -> Iterator[tuple[list[stt.Prepared], dict]]:
        for feeds, rings in reading.parts():  # made ready on the reader thread
            yield [stt.Prepared(f) for f in feeds], rings

    acc = _tabulate(prepared(), _Warmup(reading.log.requests.strings, skip), lambda: reading.log)
    return Built(reading.log, acc, reading.events, reading.died)


def _build_beside(path: str, skip: frozenset[str]) -> Built:
    helper = _Helper(path)
    try:
        strings: list[str] = []
        final: list[tuple] = []

        def prepared() -> Iterator[tuple[list[stt.Prepared], dict]]:
            while True:
                msg = helper.recv_obj()
                if msg[0] == "end":
                    final.append(msg[1:])
                    return
                _, rings, new, values = msg
                strings.extend(new)  # before the feeds that hold them: the tables' warm-up flags
                yield [stt.Prepared.of_arrays(v, [helper.recv_rows(d) for d in stt.Prepared.ARRAY_DTYPES])
                       for v in values], rings

        acc = _tabulate(prepared(), _Warmup(strings, skip), lambda: final[0][0])
        log, events, died = final[0]
        return Built(log, acc, events, died)
    finally:
        helper.close()


def _tabulate(parts: Iterator[tuple[list[stt.Prepared], dict]], warmup: "_Warmup",
              final: Callable[[], eventlog.EventLog]) -> tables.ReportTables:
    """The pipeline: ``parts`` made on a thread, built here, tabulated on another thread;
    ``final()``: the decoder's log once every part is read (its final rings and the
    writers that died)."""
    builder = stt.SpanBuilder({}, culprits=False)  # blocked_by: no report reads it
    acc = tables.ReportTables()
    with _in_order_beside(acc.add) as add:
        for feeds, rings in _read_ahead(parts):
            builder.rings.update(rings)  # a part may add rings or re-describe one (new writer)
            builder.ring_changed()
            for f in feeds:  # the builder takes any cut
                # the flags: a new array when they grow (the tables' thread may hold the old)
                add(builder.feed(f), warmup.flags())
        log = final()
        builder.rings.update(log.rings)
        builder.ring_changed()
        for idx in log.died:
            builder.process_died(int(log.rings.get(idx, {}).get("pid", 0)))
        add(builder.flush(), warmup.flags())
    return acc


class _Warmup:
    """Per request id, True for a warm-up request (attribution skips it); grows with the
    decoder's string table, which the reader thread extends as it reads."""

    def __init__(self, strings: list[str], skip: frozenset[str]) -> None:
        self.strings, self.skip = strings, skip
        self._flags = np.zeros(0, bool)

    def flags(self) -> np.ndarray:
        have, strings = len(self._flags), self.strings
        if have < len(strings):
            self._flags = np.concatenate((self._flags, np.fromiter(
                (r in self.skip for r in strings[have:]), bool, len(strings) - have)))
        return self._flags


# ---------------------------------------------------------------------- the helper
class _Helper:
    """The forked process that decodes and prepares the log, as this process sees it:
    messages in order, each part ``("part", rings, new request ids, [feed values])``
    followed by each feed's arrays, then ``("end", log without events, event count,
    STAGE_DIED events)``; or ``("error", message)`` (a corrupt log) or ``("failed",
    message)``."""

    def __init__(self, path: str) -> None:
        rfd, wfd = os.pipe()
        try:
            self._proc = mp.get_context("fork").Process(
                target=_helper_main, args=(path, rfd, wfd), daemon=True, name="omnitrace-report-decoder")
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


def _helper_main(path: str, rfd: int, wfd: int) -> None:
    # Ctrl-C is the reader's to handle: it closes the pipe, and the helper leaves on EPIPE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.close(rfd)
    out = _Pipe(wfd=wfd)
    try:
        reading = _Reading(path)
        strings = reading.log.requests.strings
        tasks = stt.SenderTasks()  # the sender rule here: the builder gets the closed tasks
        sent = 0
        for feeds, rings in reading.parts():
            prepared = [stt.Prepared(f) for f in feeds]
            top = max([p.max_ring for p in prepared] + list(rings), default=-1) + 1
            pids = stt.ring_column(rings, top, "pid")  # as the builder's, given these rings
            for p in prepared:
                p.closed = tasks.close(p.senders, pids)
            prepared = [p.arrays() for p in prepared]
            out.send_obj(("part", rings, strings[sent:], [v for v, _ in prepared]))
            sent = len(strings)
            for _, arrays in prepared:
                for a in arrays:
                    out.send_rows(a)
        out.send_obj(("end", reading.log, reading.events, reading.died))
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


# ---------------------------------------------------------------------- threads
def _read_ahead(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, the next one made by a thread while the caller works on this one (a
    part's decompression, decoding and grouping by kind run beside the span building:
    the second core)."""
    q: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def offer(item: tuple) -> bool:
        while not stop.is_set():  # the reader may have left (an error): never block on it
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce() -> None:
        try:
            for x in items:
                if not offer((True, x)):
                    return
            offer((False, None))
        except BaseException as exc:  # handed to the reader, raised there
            offer((False, exc))

    t = threading.Thread(target=produce, name="omnitrace-read-ahead", daemon=True)
    t.start()
    try:
        while True:
            more, x = q.get()
            if not more:
                if x is not None:
                    raise x
                return
            yield x
    finally:
        stop.set()
        t.join()


@contextlib.contextmanager
def _in_order_beside(fn: Callable[..., None], depth: int = 4) -> Iterator[Callable[..., None]]:
    """``submit(*args)`` calls ``fn(*args)`` on one thread, in the order submitted, while
    the caller goes on (the report's tables take one feed's spans while the builder makes
    the next: most of both is numpy, which releases the GIL). Leaving waits for the
    calls; the first error of one is raised then."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    errors: list[BaseException] = []

    def work() -> None:
        while (item := q.get()) is not None:
            if not errors:  # after an error the rest is only drained
                try:
                    fn(*item)
                except BaseException as exc:  # handed to the caller, raised there
                    errors.append(exc)

    t = threading.Thread(target=work, name="omnitrace-report-tables", daemon=True)
    t.start()
    try:
        yield lambda *args: q.put(args)
    finally:
        q.put(None)
        t.join()
    if errors:
        raise errors[0]
