"""Hot-path recorder: fixed-size event records in per-thread shared-memory rings.

Hook sites call :func:`emit` (or, on the hottest paths, ``thread_ring().record``). Each call
packs one 32-byte record into the calling thread's ring in POSIX shared memory and
publishes the write cursor: no locks, no I/O, no OpenTelemetry SDK work. Two writers do
it: :class:`Ring` here, the reference, and its compiled twin ``omnitrace/_ringc.c``
(built at install where a C compiler is; tested to write the same bytes), which
:func:`thread_ring` uses when it is there (``OMNITRACE_RECORD_WRITER=python`` keeps the
reference; costs of both: ``benchmarks/record_cost.py``). The agent process attaches to the rings, drains them
and advances the read cursor; rings live on after their writer dies (even by SIGKILL), so
the agent still reads what a crashed process recorded.

Written by hand because no library offers a cross-process, crash-surviving, lock-free
single-producer ring for Python; the layout is kept trivially simple on purpose.

Layout (little endian)::

    header (256 B): magic, version, record size, capacity, write cursor, read cursor,
                    dropped, anchor (perf_counter_ns, time_ns), pid, tid, stage, replica,
                    string slots, role, thread name, process name
    records: capacity x 32 B = (t_ns q, a q, request u32, chunk i32, kind u16, stage i16, b i32)

A full ring drops the *new* record and counts it (exact drop count; nothing is
overwritten). The header's string-slot counter (bumped on the rare interning path only)
makes the events a ring's hook sites wrote exact from its header alone, at any time and
after any death: ``write cursor - string slots + dropped`` (the accounting identity's
first term, ``events_written``). Request ids are interned per ring: the first use writes a STRING record
(request = id number, a = byte length) followed by the raw bytes in the next slots.
Recording is off (``emit`` is a no-op) unless ``OMNITRACE_RUN_ID`` is set.
"""
from __future__ import annotations

import os
import struct
import sys
import threading
import time
from dataclasses import dataclass
import mmap
from typing import Iterator

import numpy as np

from omnitrace import conventions as cv
from omnitrace import rowops

try:
    from omnitrace import _ringc
except ImportError:  # built without a C compiler: the Python writer alone
    _ringc = None
try:  # the decoder's compiled steps (its STRING records, the runs between, the id mapping)
    from omnitrace import _decodec
except ImportError:  # built without a C compiler: the Python and numpy references
    _decodec = None

MAGIC = b"OMNIRING"
VERSION = 1
HEADER_SIZE = 256
RECORD = struct.Struct("<qqIiHhi")
RECORD_SIZE = RECORD.size  # 32
assert RECORD_SIZE == 32
_U64 = struct.Struct("<Q")
_HEAD = struct.Struct("<8sII QQQQ qq qq ii Q 32s 32s 64s")  # see offsets below
OFF_WRITE, OFF_READ, OFF_DROPPED = 24, 32, 40
OFF_STAGE = 80
OFF_STRING_SLOTS = 88
MAX_STRING = 255
MAX_INTERNED = 1 << 12  # the id table is reset past this (re-interning a live id costs one
# STRING record): bounds the writer's and the agent's per-ring tables to 4096 ids
DEFAULT_RECORDS = 1 << 16  # 2 MiB per thread


@dataclass
class ProcessInfo:
    role: str = "other"
    stage: int = cv.API_STAGE
    replica: int = 0
    name: str = ""


def _fit(text: str, n: int) -> bytes:
    return text.encode("utf-8", "replace")[:n]


def string_slots(rid: int, text: str) -> bytes:
    """The STRING record defining request id ``rid`` as ``text`` (cut to MAX_STRING bytes),
    then the slots holding its bytes: what a ring holds for a request's first use."""
    data = _fit(text, MAX_STRING)
    slots = (len(data) + RECORD_SIZE - 1) // RECORD_SIZE
    return RECORD.pack(0, len(data), rid, 0, cv.Ev.STRING, 0, 0) + data.ljust(slots * RECORD_SIZE, b"\0")


def segment_name(run_id: str, pid: int, tid: int) -> str:
    return f"{cv.SHM_PREFIX}.{run_id}.{pid}.{tid}"


SHM_DIR = "/dev/shm"


def clock_offset_ns(samples: int = 7) -> int:
    """unix ns minus perf_counter_ns, from the tightest of a few (perf, wall, perf) reads:
    a thread preempted between the two clock reads would otherwise skew every converted
    timestamp by the length of the preemption (milliseconds on a loaded machine)."""
    best_width, offset = None, 0
    for _ in range(samples):
        p0 = time.perf_counter_ns()
        wall = time.time_ns()
        p1 = time.perf_counter_ns()
        if best_width is None or p1 - p0 < best_width:
            best_width, offset = p1 - p0, wall - (p0 + p1) // 2
    return offset


class _Segment:
    """A POSIX shared-memory segment (Linux: a file in /dev/shm), mode 0600.

    Not ``multiprocessing.shared_memory``: on Python < 3.13 it registers every segment
    with the resource tracker, which spawns a helper process on first use (on the hot
    path) and unlinks the ring when the writer exits, before the agent has read it.
    """

    __slots__ = ("name", "_mm", "buf")

    def __init__(self, name: str, create: bool = False, size: int = 0) -> None:
        self.name = name
        path = os.path.join(SHM_DIR, name)
        if create:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        else:
            fd = os.open(path, os.O_RDWR)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mm)

    def close(self) -> None:
        try:
            self.buf.release()
            self._mm.close()
        except (BufferError, ValueError):
            pass  # an exported view is still alive; the mapping goes with the process

    def unlink(self) -> None:
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass


class Ring:
    """The writer side of one thread's ring. Only its owning thread calls :meth:`record`."""

    __slots__ = ("pid", "tid", "name", "shm", "buf", "capacity", "_mask", "_w", "_free",
                 "_dropped", "_ids", "_cur", "_string_slots", "_c")

    def __init__(self, run_id: str, info: ProcessInfo, capacity: int = DEFAULT_RECORDS,
                 thread_name: str | None = None) -> None:
        if capacity & (capacity - 1):
            raise ValueError(f"ring capacity must be a power of two, got {capacity}")
        self.pid, self.tid = os.getpid(), threading.get_native_id()
        self.name = segment_name(run_id, self.pid, self.tid)
        self.shm = _Segment(self.name, create=True, size=HEADER_SIZE + capacity * RECORD_SIZE)
        self.buf = self.shm.buf
        # the write cursor as a native u64 view: an item store is ~30 ns cheaper than
        # struct.pack_into, and an aligned 8-byte store is what the reader loads
        self._cur = self.buf[OFF_WRITE:OFF_WRITE + 8].cast("Q")
        self.capacity, self._mask = capacity, capacity - 1
        self._w = 0
        self._free = capacity
        self._dropped = 0
        self._string_slots = 0
        self._ids: dict[str, int] = {}
        self._c = None  # the compiled writer, once writer() made it
        thread_name = thread_name or threading.current_thread().name
        mono = time.perf_counter_ns()
        _HEAD.pack_into(self.buf, 0, MAGIC, VERSION, RECORD_SIZE, capacity, 0, 0, 0,
                        mono, mono + clock_offset_ns(), self.pid, self.tid,
                        info.stage, info.replica, 0, _fit(info.role, 32),
                        _fit(thread_name, 32), _fit(info.name, 64))

    def set_info(self, info: ProcessInfo) -> None:
        struct.pack_into("<ii", self.buf, OFF_STAGE, info.stage, info.replica)
        struct.pack_into("32s", self.buf, 96, _fit(info.role, 32))
        struct.pack_into("64s", self.buf, 160, _fit(info.name, 64))

    def _reserve(self, n: int) -> bool:
        if self._free < n:
            self._free = self.capacity - (self._w - _U64.unpack_from(self.buf, OFF_READ)[0])
            if self._free < n:
                self._dropped += 1
                _U64.pack_into(self.buf, OFF_DROPPED, self._dropped)
                return False
        return True

    def _intern(self, req: str) -> int | None:
        full = len(self._ids) >= MAX_INTERNED
        rid = 1 if full else len(self._ids) + 1
        raw = string_slots(rid, req)
        slots = len(raw) // RECORD_SIZE
        if not self._reserve(slots):
            return None
        if full:
            self._ids.clear()
        w, buf, mask = self._w, self.buf, self._mask
        for i in range(slots):  # slot by slot: the record may wrap around the ring's end
            off = HEADER_SIZE + ((w + i) & mask) * RECORD_SIZE
            buf[off:off + RECORD_SIZE] = raw[i * RECORD_SIZE:(i + 1) * RECORD_SIZE]
        self._w = w + slots
        self._free -= slots
        self._string_slots += slots
        _U64.pack_into(buf, OFF_STRING_SLOTS, self._string_slots)  # before the cursor: a
        _U64.pack_into(buf, OFF_WRITE, self._w)  # reader never sees more slots than counted
        self._ids[req] = rid
        return rid

    def record(self, kind: int, req: str, stage: int, chunk: int = -1, a: int = 0,
               b: int = 0, t: int = 0, _now=time.perf_counter_ns, _pack=RECORD.pack_into) -> None:
        """Append one event stamped now (or at ``t``, a perf_counter_ns taken earlier)."""
        rid = self._ids.get(req) or self._intern(req)
        if rid is None or (not self._free and not self._reserve(1)):
            return
        w = self._w
        buf = self.buf
        _pack(buf, HEADER_SIZE + (w & self._mask) * RECORD_SIZE, t or _now(), a, rid, chunk,
              kind, stage, b)
        self._w = w = w + 1
        self._free -= 1
        self._cur[0] = w

    def writer(self) -> "Ring | _ringc.Writer":
        """What this ring's thread records through: the compiled writer when it is built
        and not turned off (``OMNITRACE_RECORD_WRITER=python``), else the ring itself. The
        compiled writer takes the ring over: from then on write only through it."""
        if (_ringc is None or os.environ.get(cv.ENV_RECORD_WRITER) == "python"
                or sys.byteorder != "little"):  # the compiled writer stores native integers
            return self
        if self._c is None:
            self._c = _ringc.Writer(self.buf, self.capacity, string_slots, MAX_INTERNED)
        return self._c

    def close(self) -> None:
        if self._c is not None:
            self._c.close()
        try:
            self._cur.release()
            self.buf = None  # type: ignore[assignment]
            self.shm.close()
        except (BufferError, ValueError):
            pass


class _NullRing:
    def record(self, *args: object, **kwargs: object) -> None:
        pass


NULL_RING = _NullRing()

# --------------------------------------------------------------------------- process state
_local = threading.local()
_info = ProcessInfo(
    role=os.environ.get(cv.ENV_ROLE, "other"),
    stage=int(os.environ.get(cv.ENV_STAGE, cv.API_STAGE)),
    replica=int(os.environ.get(cv.ENV_REPLICA, 0)),
)
_rings: list[Ring] = []
_rings_lock = threading.Lock()


def run_id() -> str | None:
    return os.environ.get(cv.ENV_RUN_ID) or None


def enabled() -> bool:
    return run_id() is not None


def set_process_info(role: str | None = None, stage: int | None = None,
                     replica: int | None = None, name: str | None = None) -> None:
    """Name this process (role, stage, replica) in every ring it has and will have."""
    if role is not None:
        _info.role = role
    if stage is not None:
        _info.stage = stage
    if replica is not None:
        _info.replica = replica
    if name is not None:
        _info.name = name
    with _rings_lock:
        for ring in _rings:
            ring.set_info(_info)


def process_info() -> ProcessInfo:
    return _info


def thread_ring() -> Ring | _NullRing:
    """This thread's ring writer (:meth:`Ring.writer`), the ring created on first use; a
    no-op when recording is off."""
    ring = getattr(_local, "ring", None)
    if ring is None:
        rid = run_id()
        if rid is None:
            ring = NULL_RING
        else:
            capacity = int(os.environ.get(cv.ENV_RING_RECORDS, DEFAULT_RECORDS))
            owner = Ring(rid, _info, capacity)
            with _rings_lock:
                _rings.append(owner)
            ring = owner.writer()
        _local.ring = ring
    return ring


def emit(kind: int, req: str, stage: int, chunk: int = -1, a: int = 0, b: int = 0,
         t: int = 0) -> None:
    """Record one event from any thread (one thread-local lookup more than ``Ring.record``)."""
    try:
        ring = _local.ring
    except AttributeError:
        ring = thread_ring()
    ring.record(kind, req, stage, chunk, a, b, t)


def _after_fork_in_child() -> None:
    # A forked child must not write into its parent's rings.
    global _local, _rings
    _local = threading.local()
    _rings = []


os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------- reader side
@dataclass
class RingHeader:
    name: str
    capacity: int
    write: int
    read: int
    dropped: int
    anchor_mono_ns: int
    anchor_wall_ns: int
    pid: int
    tid: int
    stage: int
    replica: int
    string_slots: int
    role: str
    thread: str
    process: str

    @property
    def events_published(self) -> int:
        """Event records this ring's writer published (string slots are not events)."""
        return self.write - self.string_slots

    @property
    def events_written(self) -> int:
        """Events this ring's hook sites wrote: published plus dropped (ring full)."""
        return self.events_published + self.dropped


def _text(b: bytes) -> str:
    return b.rstrip(b"\0").decode("utf-8", "replace")


class RingReader:
    """The agent's side of one ring: read records in order and free their slots."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.shm = _Segment(name)
        self.buf = self.shm.buf
        if bytes(self.buf[:8]) != MAGIC:
            raise ValueError(f"{name}: not an omnitrace ring")
        self.capacity = _U64.unpack_from(self.buf, 16)[0]
        self._mask = self.capacity - 1
        self._decoder: SlotDecoder | None = None

    def header(self) -> RingHeader:
        (_, _, _, cap, write, read, dropped, amono, awall, pid, tid, stage, replica, strs,
         role, thread, proc) = _HEAD.unpack_from(self.buf, 0)
        return RingHeader(self.name, cap, write, read, dropped, amono, awall, pid, tid,
                          stage, replica, strs, _text(role), _text(thread), _text(proc))

    def drain(self, max_records: int = 1 << 20) -> Iterator[tuple[int, str, int, int, int, int, int]]:
        """Yield (kind, request, stage, chunk, a, b, t_ns) for every new record."""
        yield from self.read_batch(max_records)

    def read_batch(self, max_records: int = 1 << 20) -> list[tuple[int, str, int, int, int, int, int]]:
        """All new records as (kind, request, stage, chunk, a, b, t) tuples, and free their
        slots: :meth:`read_raw` decoded by this ring's :class:`SlotDecoder` (tests, tools)."""
        if self._decoder is None:
            self._decoder = SlotDecoder(RequestIds())
        return self._decoder.tuples(self.read_raw(max_records))

    def read_raw(self, max_slots: int = 1 << 20) -> bytes:
        """The new slots as raw bytes (records and string slots, undecoded), and free
        them: the agent's drain path, a copy per contiguous run and nothing per record.
        A string's byte slots may be cut off at ``max_slots``; the next call has them."""
        buf, mask, cap = self.buf, self._mask, self.capacity
        read = _U64.unpack_from(buf, OFF_READ)[0]
        end = min(_U64.unpack_from(buf, OFF_WRITE)[0], read + max_slots)
        if end <= read:
            return b""
        start = read & mask
        n = min(end - read, cap - start)
        base = HEADER_SIZE + start * RECORD_SIZE
        data = bytes(buf[base:base + n * RECORD_SIZE])
        if n < end - read:  # wrapped
            data += bytes(buf[HEADER_SIZE:HEADER_SIZE + (end - read - n) * RECORD_SIZE])
        _U64.pack_into(buf, OFF_READ, end)
        return data

    def dropped(self) -> int:
        return _U64.unpack_from(self.buf, OFF_DROPPED)[0]

    def written(self) -> int:
        """Slots published so far (records plus string-table slots)."""
        return _U64.unpack_from(self.buf, OFF_WRITE)[0]

    def unread(self) -> int:
        """Slots published but not read yet (the drain's backlog in this ring)."""
        return self.written() - _U64.unpack_from(self.buf, OFF_READ)[0]

    def close(self, unlink: bool = False) -> None:
        self._decoder = None
        self.buf = None  # type: ignore[assignment]
        self.shm.close()
        if unlink:
            self.shm.unlink()


# --------------------------------------------------------------------------- the one decoder
# A slot as numpy sees it: the RECORD layout above, field for field.
RECORD_DTYPE = np.dtype([("t", "<i8"), ("a", "<i8"), ("req", "<u4"), ("chunk", "<i4"),
                         ("kind", "<u2"), ("stage", "<i2"), ("b", "<i4")])
assert RECORD_DTYPE.itemsize == RECORD_SIZE
_STRING_KIND = int(cv.Ev.STRING)
_STRINGS_DONE = 0  # _decodec.strings reached the cut's end


class RequestIds:
    """Request id strings <-> dense ints shared by every ring of a run (0 = no request).
    Decoded events carry these ints, so pairing and grouping are integer array work."""

    __slots__ = ("ids", "strings")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {"": 0}
        self.strings: list[str] = [""]

    def intern(self, text: str) -> int:
        i = self.ids.get(text)
        if i is None:
            i = self.ids[text] = len(self.strings)
            self.strings.append(text)
        return i


def map_ids_reference(rec: np.ndarray, lo: int, hi: int, lut: np.ndarray) -> None:
    """Records ``lo:hi`` of ``rec`` (``RECORD_DTYPE``): their ring's request ids -> the
    run-wide ones by ``lut`` (0 past its end), in place. The rule; ``_decodec.map_req`` does
    the same in C."""
    rids = rec["req"][lo:hi]
    rec["req"][lo:hi] = lut[np.minimum(rids, len(lut) - 1)] * (rids < len(lut))


def keep_runs_reference(rec: np.ndarray, drops: list[tuple[int, int]]) -> np.ndarray:
    """``rec`` less the (lo, hi) slot ranges ``drops`` (ascending, disjoint), a copy. The
    rule; ``_decodec.keep_runs`` does the same in C."""
    return rowops.select(rec, _kept_mask(len(rec), drops))


def _kept_mask(n: int, drops: list[tuple[int, int]]) -> np.ndarray:
    keep = np.ones(n, bool)
    for lo, hi in drops:
        keep[lo:hi] = False
    return keep


def keep_runs(rec: np.ndarray, drops: list[tuple[int, int]]) -> np.ndarray:
    if _decodec is None:
        return keep_runs_reference(rec, drops)
    out = np.empty(len(rec), rec.dtype)
    return out[:_decodec.keep_runs(rec, np.array(drops, np.int64).reshape(-1, 2), out)]


def map_ids(rec: np.ndarray, lo: int, hi: int, lut: np.ndarray) -> None:
    if _decodec is None or hi <= lo:
        map_ids_reference(rec, lo, hi, lut)
    else:
        _decodec.map_req(rec, lo, hi, lut)


class SlotDecoder:
    """Decodes one ring's slots, in order, into event records: the only decoder of the
    ring layout (ring reader, agent, event-log reader all use it).

    Input: raw slots exactly as in the ring (``RingReader.read_raw``), in cuts of any
    size, a STRING record's byte slots possibly continuing in the next cut. Output: a
    ``RECORD_DTYPE`` array of the event records (STRING records and their bytes removed)
    whose ``req`` is the run-wide :class:`RequestIds` number, not the ring's own.

    Vectorised: one ``frombuffer`` per cut; only STRING records (one per request per ring)
    and the candidates for them are taken one by one (in C where ``_decodec`` is built, the
    rare ones in Python: :meth:`_take_string`). A writer's table reset (the string
    with ring id 1 is re-interned) splits a cut into windows, each mapped with its own
    lookup table, so an id reused after a reset never takes the old string.
    """

    __slots__ = ("requests", "strings", "_lut", "_pending", "_need", "_rid", "_len")

    def __init__(self, requests: RequestIds) -> None:
        self.requests = requests
        self.strings: dict[int, str] = {}  # ring id -> text (the writer's current table)
        self._lut = np.zeros(1, np.uint32)  # ring id -> run-wide id
        self._pending = bytearray()
        self._need = 0  # byte slots of a cut string still to come
        self._rid = 0
        self._len = 0

    def _define(self, rid: int, data: bytes) -> bool:
        """Store one string; True if it reset the table (ids of earlier records are stale)."""
        reset = rid == 1 and bool(self.strings)
        if reset:
            self.strings.clear()
            self._lut[:] = 0
        text = data.decode("utf-8", "replace")
        self.strings[rid] = text
        if rid >= len(self._lut):
            lut = np.zeros(max(rid + 1, 2 * len(self._lut)), np.uint32)
            lut[:len(self._lut)] = self._lut
            self._lut = lut
        self._lut[rid] = self.requests.intern(text)
        return reset

    def load_table(self, table: dict[int, str]) -> None:
        """Start from a known string table (an event-log segment's STRINGS block), at a
        record boundary (a string cut off before it is dropped)."""
        self.strings.clear()
        self._lut[:] = 0
        self._need, self._pending = 0, bytearray()
        for rid, text in sorted(table.items()):
            self._define(rid, text.encode("utf-8"))

    @property
    def cut(self) -> bool:
        """True while a string's bytes are split between this cut and the next."""
        return self._need > 0

    @property
    def need_slots(self) -> int:
        """Byte slots of a cut string still to come (0: the cut ended at a record)."""
        return self._need

    def decode(self, raw: bytes | memoryview) -> np.ndarray:
        view = memoryview(raw)
        off = 0
        if self._need:  # the rest of a string begun in the previous cut
            take = min(self._need, len(view) // RECORD_SIZE)
            self._pending += view[:take * RECORD_SIZE]
            self._need -= take
            off = take * RECORD_SIZE
            if self._need:
                return np.empty(0, RECORD_DTYPE)
            self._define(self._rid, bytes(self._pending[:self._len]))
            self._pending = bytearray()
        slots = np.frombuffer(view[off:off + (len(view) - off) // RECORD_SIZE * RECORD_SIZE],
                              RECORD_DTYPE)
        if _decodec is not None:
            return self._strings_compiled(view, off, slots)
        n = len(slots)
        cand = np.flatnonzero(slots["kind"] == _STRING_KIND)
        if not len(cand):
            out = slots.copy()
            map_ids(out, 0, n, self._lut)
            return out
        drops: list[tuple[int, int]] = []  # slot ranges of the STRING records and their bytes
        # records are mapped by the table as it stands at the next reset (or at the end): ids
        # only grow between resets. (first slot, table) of each window closed by a reset:
        windows: list[tuple[int, np.ndarray]] = []
        nxt: int | None = 0  # first slot that can hold a record (not string bytes)
        for i, length, rid in zip(cand.tolist(), slots["a"][cand].tolist(), slots["req"][cand].tolist()):
            if i < nxt:
                continue  # string bytes that look like a STRING record
            nxt = self._take_string(view, off, n, i, length, rid, drops, windows)
            if nxt is None:
                break
        return self._kept_records(slots, drops, windows)

    def _strings_compiled(self, view: memoryview, off: int, slots: np.ndarray) -> np.ndarray:
        """``decode``'s loop over the STRING records, the common ones taken by
        ``_decodec.strings`` (~1 us each in Python), the rest by :meth:`_take_string`."""
        n = len(slots)
        drops: list[tuple[int, int]] = []
        windows: list[tuple[int, np.ndarray]] = []
        i, nxt, raw = 0, 0, view[off:off + n * RECORD_SIZE]
        while nxt is not None and i < n:
            status, i, nxt = _decodec.strings(raw, i, nxt, _STRING_KIND, self.strings, self.requests.ids,
                                              self.requests.strings, self._lut, drops)
            if status == _STRINGS_DONE:
                break
            nxt = self._take_string(view, off, n, i, int(slots["a"][i]), int(slots["req"][i]), drops, windows)
            i += 1
        return self._kept_records(slots, drops, windows)

    def _take_string(self, view: memoryview, off: int, n: int, i: int, length: int, rid: int,
                     drops: list[tuple[int, int]], windows: list[tuple[int, np.ndarray]]) -> int | None:
        """The STRING record in slot ``i`` of the cut's ``n`` (its bytes from ``off`` +
        slot * RECORD_SIZE of ``view``): its slots dropped, its string defined (a reset
        first closes a window); the next slot that can hold a record, or None where the
        string is cut off (the rest comes with the next cut)."""
        nbytes_slots = (length + RECORD_SIZE - 1) // RECORD_SIZE
        have = min(nbytes_slots, n - i - 1)
        drops.append((i, i + 1 + have))
        start = off + (i + 1) * RECORD_SIZE
        if have < nbytes_slots:  # cut: the rest comes with the next cut
            self._rid, self._len, self._need = rid, length, nbytes_slots - have
            self._pending = bytearray(view[start:start + have * RECORD_SIZE])
            return None
        if rid == 1 and self.strings:  # reset: what came before takes the old table
            windows.append((i, self._lut.copy()))
        self._define(rid, bytes(view[start:start + length]))
        return i + 1 + nbytes_slots

    def _kept_records(self, slots: np.ndarray, drops: list[tuple[int, int]],
                      windows: list[tuple[int, np.ndarray]]) -> np.ndarray:
        """``slots`` less the ``drops`` ranges (a copy: the cut's buffer may be reused), each
        window's request ids mapped by its table, the last window's by the current one."""
        if all(lo <= hi for lo, hi in drops):  # ascending and disjoint: runs between them
            out = keep_runs(slots, drops)

            def kept_before(at: int) -> int:
                return at - sum(hi - lo for lo, hi in drops if hi <= at)
        else:  # a corrupt negative length: its range taken as a slice, as ever
            keep = _kept_mask(len(slots), drops)
            out = rowops.select(slots, keep)

            def kept_before(at: int) -> int:
                return int(np.count_nonzero(keep[:at]))
        lo = 0
        for at, lut in windows:  # at: a dropped STRING record's slot
            hi = kept_before(at)
            map_ids(out, lo, hi, lut)
            lo = hi
        map_ids(out, lo, len(out), self._lut)
        return out

    def tuples(self, raw: bytes | memoryview) -> list[tuple[int, str, int, int, int, int, int]]:
        """Decoded records as (kind, request text, stage, chunk, a, b, t) tuples."""
        rec = self.decode(raw)
        texts = self.requests.strings
        return [(k, texts[r], s, c, a, b, t) for t, a, r, c, k, s, b in rec.tolist()]


def discover(run_id: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Names of the ring segments of one run."""
    prefix = f"{cv.SHM_PREFIX}.{run_id}."
    try:
        return sorted(n for n in os.listdir(shm_dir) if n.startswith(prefix))
    except FileNotFoundError:
        return []
