"""The run's record: every ring slot the agent drained, in compressed, bounded segments.

A run directory's ``events/`` holds ``seg-000000.zst``, ``seg-000001.zst``, ...: each one
zstd frame of blocks, each block a 12-byte header ``(type u8, 3 pad, ring u32, length
u32)`` and ``length`` payload bytes:

* ``HEADER``  (5) JSON ``{run_id, segment, created_unix_ns, offset_ns}``: first block of a
  segment. ``offset_ns`` (unix ns minus ``perf_counter_ns``, one for the whole run: all
  rings of a host share CLOCK_MONOTONIC) converts every record's ``t`` to unix ns.
* ``RING``    (1) JSON describing ring ``ring``: ``{name, pid, tid, thread, role, stage,
  replica, process, capacity}``; written when a ring is first seen, when its writer's
  identity changes, and again at the start of every segment.
* ``STRINGS`` (4) JSON ``{ring id: request id}``: the ring's string table as it stands
  at the start of the segment, so each segment decodes on its own.
* ``RECORDS`` (2) ring slots exactly as in the ring (``omnitrace.record`` layout, STRING
  records included), decoded by ``record.SlotDecoder``, the one decoder of that layout.
* ``DIED``    (3) no payload: the ring's writer process is gone; its last records precede it.
* ``ACCOUNT`` (6) JSON ``{events_written, dropped, events_read}``: ring ``ring``'s final
  counts, from its header once the agent read it for the last time (writer gone, or the
  agent's final drain): what the report's accounting identity starts from. Written even
  past ``max_bytes`` (one small block per ring).

Why hand-made blocks in zstd rather than a columnar file format: the drain thread must
copy slots at memcpy speed without decoding them, and a reader must recover everything
before a tear (agent killed mid-write). zstd streams are flushed at every drain cycle
(``FLUSH_BLOCK``), so a reader decodes all that was committed, and a torn tail loses only
the records of its last, partial block, which are counted.

A segment is closed (zstd frame finished) at ``SEGMENT_RAW_BYTES`` of input. With
``max_bytes`` set (``--max-run-bytes``), recording stops at the first commit that finds
the segments at or past the cap: later events are counted, not written, and nothing
already written is ever removed.
"""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import orjson
import zstandard

from omnitrace import record, rowops, threads
from omnitrace.outages import Outages

try:
    from omnitrace import _decodec
except ImportError:  # built without a C compiler: the numpy references
    _decodec = None

BLOCK = struct.Struct("<B3xII")
RING, RECORDS, DIED, STRINGS, HEADER, ACCOUNT = 1, 2, 3, 4, 5, 6
DIR = "events"
SEGMENT_RAW_BYTES = 64 << 20  # ~2M slots; compresses to a few MB
ZSTD_LEVEL = 1  # the drain thread's budget: level 3 saves ~2% of the bytes for ~1.5x the CPU (agent_results.md)

# A decoded event as readers see it: the record plus its ring, ``t`` in unix ns.
EVENT_DTYPE = np.dtype([("t", "<i8"), ("a", "<i8"), ("req", "<u4"), ("chunk", "<i4"),
                        ("kind", "<u2"), ("stage", "<i2"), ("b", "<i4"), ("ring", "<i4")])


class EventLogError(Exception):
    """An event log that cannot be read (corrupt data): one line for the user."""


def segment_path(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, DIR, f"seg-{index:06d}.zst")


def size(run_dir: str) -> int:
    """The bytes of ``run_dir``'s event segments (compressed: ~5 per event)."""
    return sum(os.path.getsize(p) for p in segments(run_dir))


def segments(run_dir: str) -> list[str]:
    d = os.path.join(run_dir, DIR)
    try:
        names = sorted(n for n in os.listdir(d) if n.startswith("seg-") and n.endswith(".zst"))
    except OSError:  # missing, or a path through a file: no segments here
        return []
    return [os.path.join(d, n) for n in names]


# ----------------------------------------------------------------------------- writer
RETRY_S = 5.0  # after a write error (disk full), how often a fresh segment is tried


@dataclass
class ResumeState:
    """Where a restarted agent takes up a run's event log (:func:`resume_state`)."""

    next_segment: int = 0
    rings: dict[int, dict] = field(default_factory=dict)  # ring index -> its RING description
    tables: dict[int, dict[int, str]] = field(default_factory=dict)  # ring -> string table at the end


def resume_state(run_dir: str) -> ResumeState:
    """The log's state at its end, for an agent that takes over from one that died: the
    next segment's number, and each ring the last segment describes with its string table
    as of the last record that reached the disk (the segment's STRINGS head, then its
    records; a torn tail loses what it held). Reads the last two segments only: each
    segment starts with the table of every ring live then (two: the agent may have died
    just after it created the last one)."""
    paths = segments(run_dir)
    if not paths:
        return ResumeState()
    log = EventLog()
    out = ResumeState(next_segment=int(os.path.basename(paths[-1])[4:10]) + 1)
    decoders: dict[int, record.SlotDecoder] = {}
    for path in paths[-2:]:
        for kind, idx, payload in _blocks(path, path == paths[-1], log):
            if kind == RING:
                out.rings[idx] = orjson.loads(payload)
            elif kind in (STRINGS, RECORDS):
                dec = decoders.setdefault(idx, record.SlotDecoder(log.requests))
                if kind == STRINGS:
                    dec.load_table({int(k): v for k, v in orjson.loads(payload).items()})
                else:
                    dec.decode(payload)
    out.tables = {idx: dict(dec.strings) for idx, dec in decoders.items()}
    return out


def last_request_ids(run_dir: str) -> set[str]:
    """The request ids in every ring's string table at the log's end (:func:`resume_state`):
    each ring's last ``record.MAX_INTERNED`` requests, those in flight at the end among them.
    Empty where the log is missing or cannot be read."""
    try:
        tables = resume_state(run_dir).tables
    except EventLogError:
        return set()
    return {rid for table in tables.values() for rid in table.values()}


class EventLogWriter:
    """Appends blocks to the current segment; used by the agent's drain thread only.

    A write error (disk full, I/O error) never leaves a half-written block behind: the
    segment is cut back to its last whole flush and closed, the events of that commit and
    of every later one are counted in ``events_not_recorded`` (``failed`` says why), and
    every ``RETRY_S`` a fresh segment is tried; recording resumes when one can be written.
    Ring, death and account blocks wait for it (they are what the report counts with)."""

    def __init__(self, run_dir: str, run_id: str, offset_ns: int, max_bytes: int | None = None,
                 segment_raw_bytes: int = SEGMENT_RAW_BYTES, resume: ResumeState | None = None) -> None:
        os.makedirs(os.path.join(run_dir, DIR), mode=0o700, exist_ok=True)
        self.run_dir, self.run_id, self.offset_ns = run_dir, run_id, offset_ns
        self.max_bytes = max_bytes
        self.segment_raw_bytes = segment_raw_bytes
        self._zc = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        self._fd = -1
        self._obj = None
        # resumed (an agent that died wrote the log so far): the next segment number, and the
        # string tables its first segment starts with, so its rings' records decode
        self.segment = (resume.next_segment if resume else 0) - 1
        self._first_tables = resume.tables if resume else {}
        self._seg_raw = 0
        self._seg_bytes = 0  # the open segment's size on disk (a failed write is cut back to it)
        self._buf: list[bytes] = []
        self._meta: list[bytes] = []  # this commit's non-record blocks (kept if it fails)
        self._buf_events = 0
        self.rings: dict[int, bytes] = {}  # ring -> its RING payload (repeated per segment)
        self.raw_bytes = 0  # block bytes before compression
        self.bytes_written = 0  # compressed bytes on disk
        self.events_recorded = 0
        self.events_not_recorded = 0  # cap or write error: exact, counted by the decoder
        self.capped = False
        self.failed = ""  # the last write error while recording is off ("" = recording)
        self.write_errors = 0
        self.last_error = ""  # kept after recording resumed: why events were not recorded
        self._retry_at = 0.0
        self.final_only = False  # after a write error at the end: only the last blocks
        self.outages = Outages()  # when recording was off after a write error

    def _open_segment(self, tables: dict[int, dict[int, str]]) -> None:
        self.segment += 1
        path = segment_path(self.run_dir, self.segment)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._obj = self._zc.compressobj()
        self._seg_raw = self._seg_bytes = 0
        head = [self._block(HEADER, 0, orjson.dumps({
            "run_id": self.run_id, "segment": self.segment,
            "created_unix_ns": time.time_ns(), "offset_ns": self.offset_ns}))]
        for idx, payload in self.rings.items():
            head.append(self._block(RING, idx, payload))
            table = tables.get(idx)
            if table:
                head.append(self._block(STRINGS, idx, orjson.dumps(
                    {str(k): v for k, v in table.items()})))
        try:
            self._write(b"".join(head))
        except OSError:  # not even its head fits: no empty segment is left behind
            os.close(self._fd)
            self._fd = -1
            os.unlink(path)
            self.segment -= 1
            raise

    @staticmethod
    def _block(kind: int, idx: int, payload: bytes) -> bytes:
        return BLOCK.pack(kind, idx, len(payload)) + payload

    def _meta_block(self, block: bytes) -> None:
        self._buf.append(block)
        self._meta.append(block)

    def ring(self, idx: int, info: dict) -> None:
        payload = orjson.dumps(info)
        self.rings[idx] = payload
        self._meta_block(self._block(RING, idx, payload))

    def records(self, idx: int, raw: bytes, events: int) -> None:
        """``raw`` slots of ring ``idx`` holding ``events`` event records."""
        if self.capped or self.failed:
            self.events_not_recorded += events
            if self.failed:
                self.outages.failed(events)
            return
        self._buf.append(BLOCK.pack(RECORDS, idx, len(raw)))
        self._buf.append(raw)
        self._buf_events += events

    def died(self, idx: int) -> None:
        self._meta_block(self._block(DIED, idx, b""))

    def account(self, idx: int, counts: dict) -> None:
        """Ring ``idx``'s final counts (``ACCOUNT``), after its last records."""
        self._meta_block(self._block(ACCOUNT, idx, orjson.dumps(counts)))

    def _write(self, data: bytes) -> None:
        assert self._obj is not None
        out = self._obj.compress(data) + self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        self._write_out(out)
        self._seg_raw += len(data)
        self.raw_bytes += len(data)

    def _write_out(self, out: bytes) -> None:
        """All of ``out`` or nothing: a partial write (disk full) is cut off again."""
        view, done = memoryview(out), 0
        try:
            while done < len(out):
                done += os.write(self._fd, view[done:])
        except OSError:
            if done:
                os.ftruncate(self._fd, self._seg_bytes)
            raise
        self._seg_bytes += len(out)
        self.bytes_written += len(out)

    def commit(self, tables: dict[int, dict[int, str]], can_rotate: bool = True) -> str:
        """Write this cycle's blocks. Returns what changed, for the agent to say once:
        "capped" (``max_bytes`` reached), "failed" (a write error: ``failed`` says which),
        "resumed" (a fresh segment took writes again), or "".
        ``tables`` and ``can_rotate`` describe the state right after these blocks: each
        ring's string table (the head of the next segment), and False while a string's
        bytes are cut between this cycle's read and the next (no segment may start there)."""
        change = ""
        if self.max_bytes is not None and not self.capped and self.bytes_written >= self.max_bytes:
            self.capped = True  # from the next records() on
            change = "capped"
        if self.failed:
            if self.final_only or not (can_rotate and time.monotonic() >= self._retry_at
                                       and self._resume(tables)):
                return change
            change = "resumed"
        if not self._buf:
            return change
        try:
            if self._fd < 0:  # the first segment's strings are in its records (resumed:
                self._open_segment(self._first_tables)  # and in the tables taken over)
            self._write(b"".join(self._buf))
        except OSError as exc:
            self._fail(exc)
            return "failed"
        self.events_recorded += self._buf_events
        self._buf_events = 0
        self._buf.clear()
        self._meta.clear()
        if can_rotate and self._seg_raw >= self.segment_raw_bytes:
            try:
                self._close_segment()
                self._open_segment(tables)
            except OSError as exc:
                self._fail(exc)
                return "failed"
        return change

    def _fail(self, exc: OSError) -> None:
        """Recording off after a write error; this commit's events are not recorded."""
        self.failed = self.last_error = exc.strerror or str(exc)
        self.write_errors += 1
        self.outages.failed(self._buf_events)
        self.events_not_recorded += self._buf_events
        self._buf_events = 0
        self._buf = list(self._meta)  # the ring/death/account blocks wait for a segment
        self._retry_at = time.monotonic() + RETRY_S
        if self._fd >= 0:
            os.close(self._fd)  # the frame stays unfinished: a reader sees where it ends
            self._fd = -1

    def _resume(self, tables: dict[int, dict[int, str]]) -> bool:
        try:
            self._open_segment(tables)
        except OSError as exc:
            self.failed = exc.strerror or str(exc)
            self._retry_at = time.monotonic() + RETRY_S
            return False
        self.failed = ""
        self.outages.ok()
        return True

    def _close_segment(self) -> None:
        if self._fd >= 0:
            assert self._obj is not None
            self._write_out(self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))
            os.close(self._fd)
            self._fd = -1

    def close(self, tables: dict[int, dict[int, str]] | None = None) -> None:
        """Write what is left and finish the segment; after a write error, one last try at
        a fresh segment for the ring, death and account blocks."""
        if self.failed:
            self._retry_at, self.final_only = 0.0, False
        if self._buf or self.failed:
            self.commit(tables or {})
        try:
            self._close_segment()
        except OSError as exc:
            self._fail(exc)

    def counters(self) -> dict:
        return {"segments": self.segment + 1, "raw_bytes": self.raw_bytes,
                "bytes_written": self.bytes_written, "events_recorded": self.events_recorded,
                "events_not_recorded": self.events_not_recorded, "capped": self.capped,
                "max_bytes": self.max_bytes, "write_error": self.failed,
                "last_write_error": self.last_error, "write_errors": self.write_errors,
                "outages": self.outages.to_list()}


# ----------------------------------------------------------------------------- reader
@dataclass
class EventLog:
    """A run's events, decoded: one ``EVENT_DTYPE`` array (per ring in ring order)."""

    rings: dict[int, dict] = field(default_factory=dict)
    requests: record.RequestIds = field(default_factory=record.RequestIds)
    events: np.ndarray = field(default_factory=lambda: np.empty(0, EVENT_DTYPE))
    died: set[int] = field(default_factory=set)
    accounts: dict[int, dict] = field(default_factory=dict)  # ring -> its ACCOUNT block
    run_ids: set[str] = field(default_factory=set)  # from the segment headers (one, unless mixed)
    offset_ns: int = 0
    segments: int = 0
    torn_records: int = 0
    torn_segments: int = 0  # segments that end early (cut mid-frame): see the accounting
    last_torn: bool = False  # the last one does (also what a live agent's open segment does)
    warnings: list[str] = field(default_factory=list)


INFLATE_BYTES = 1 << 20  # compressed bytes inflated at a time (~6 MB out: heap-sized, reused)


def _pieces(path: str) -> Iterator[memoryview]:
    """The file's bytes, ``INFLATE_BYTES`` at a time, read into one buffer reused (the
    segment read whole was ~12 MB of fresh pages per segment, and each slice of it one more
    copy); the last piece is empty. A piece is valid until the next is taken."""
    buf = bytearray(INFLATE_BYTES)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            yield view[:n]
            if not n:
                return


def _inflated(path: str) -> Iterator[tuple[bytes, bool]]:
    """The segment inflated a read at a time: (bytes, whether its frame ended with them)."""
    dobj = zstandard.ZstdDecompressor().decompressobj()
    for piece in _pieces(path):
        try:
            out = dobj.decompress(piece)
        except zstandard.ZstdError as exc:
            raise EventLogError(f"{path}: corrupt event segment ({exc})") from None
        yield out, dobj.eof
        if dobj.eof:
            return


def _blocks(path: str, last: bool, log: EventLog) -> Iterator[tuple[int, int, memoryview]]:
    """The segment's blocks as (type, ring, payload). Inflated a slice at a time, not into
    one ~64 MB buffer per segment (fresh pages every segment); a payload is valid until the
    next block is taken. The inflating runs a slice ahead on a thread (zstd frees the GIL):
    ~40% of a long log's decoding, beside the rest of it."""
    name = os.path.basename(path)
    pending = b""  # the start of a block whose end is in the next slice

    def header(buf: bytes | memoryview, off: int) -> tuple[int, int, int]:
        kind, idx, length = BLOCK.unpack_from(buf, off)
        if kind not in (RING, RECORDS, DIED, STRINGS, HEADER, ACCOUNT):
            raise EventLogError(f"{path}: corrupt event segment (block type {kind})")
        return kind, idx, length

    ended = False
    for out, ended in threads.read_ahead(_inflated(path), name="omnitrace-inflate"):
        view = memoryview(out)
        off, n = 0, len(view)
        if pending:  # only the block that straddles the slices is joined, not the slice
            if len(pending) < BLOCK.size:
                off = min(BLOCK.size - len(pending), n)
                pending += bytes(view[:off])
            if len(pending) >= BLOCK.size:
                kind, idx, length = header(pending, 0)
                take = min(BLOCK.size + length - len(pending), n - off)
                pending += bytes(view[off:off + take])
                off += take
                if len(pending) == BLOCK.size + length:
                    yield kind, idx, memoryview(pending)[BLOCK.size:]
                    pending = b""
        if not pending:
            while off + BLOCK.size <= n:
                kind, idx, length = header(view, off)
                stop = off + BLOCK.size + length
                if stop > n:
                    break
                yield kind, idx, view[off + BLOCK.size:stop]
                off = stop
            pending = bytes(view[off:])
        if ended:
            break
    view = memoryview(pending)
    if len(view) >= BLOCK.size:  # torn block: its whole slots still decode, the rest is lost
        kind, idx, length = BLOCK.unpack_from(view, 0)
        if kind == RECORDS:
            have = (len(view) - BLOCK.size) // record.RECORD_SIZE
            log.torn_records += length // record.RECORD_SIZE - have
            yield kind, idx, view[BLOCK.size:BLOCK.size + have * record.RECORD_SIZE]
    if pending or not ended:
        log.torn_segments += 1
        log.last_torn = last
        where = "last segment" if last else "segment"
        log.warnings.append(f"events/{name}: {where} ends early (agent killed mid-write, disk "
                            "full, or the file was cut): see the report's event accounting")


def read_event_log(run_dir: str) -> EventLog | None:
    """Decode every segment of ``run_dir`` in order; None if it has no event log (an
    ``events/`` folder without segments is a run that recorded no event: an empty log).
    ``events`` holds each ring's events together, rings in order of first appearance."""
    stream = stream_event_log(run_dir)
    if stream is None:
        return None
    log, parts = stream
    per_ring: dict[int, list[np.ndarray]] = {}
    for ev in parts:
        for idx in dict.fromkeys(ev["ring"].tolist()) if len(ev) else ():
            per_ring.setdefault(idx, []).append(rowops.select(ev, ev["ring"] == idx))
    log.events = rowops.concat([rowops.concat(p, EVENT_DTYPE) for p in per_ring.values()], EVENT_DTYPE)
    return log


# events per array the stream yields: arrays this small come from the allocator's heap and
# are reused; a segment's events in one array (~70 MB) were fresh pages every segment
# (page faults: a report on 150M events took 12 s longer, 10 s of it system time)
STREAM_EVENTS = 1 << 17


def stream_event_log(run_dir: str) -> tuple[EventLog, Iterator[np.ndarray]] | None:
    """(log, iterator of the events in order, in arrays of about ``STREAM_EVENTS``): the
    segments decoded one at a time, so a reader holds about one segment's data at once.
    ``log``'s rings, request ids, deaths and counters fill in as the iterator advances
    (complete once it is exhausted; as of each array, they describe every event up to its
    end); its ``events`` stays empty. None if the run has no event log."""
    if not os.path.isdir(os.path.join(run_dir, DIR)):
        return None
    paths = segments(run_dir)
    log = EventLog(segments=len(paths))
    return log, _segment_events(paths, log)


def _segment_events(paths: list[str], log: EventLog) -> Iterator[np.ndarray]:
    decoders: dict[int, record.SlotDecoder] = {}
    parts: list[np.ndarray] = []
    held = 0
    for i, path in enumerate(paths):
        for kind, idx, payload in _blocks(path, i == len(paths) - 1, log):
            if kind == RECORDS:
                dec = decoders.get(idx)
                if dec is None:
                    dec = decoders[idx] = record.SlotDecoder(log.requests)
                rec = dec.decode(payload)
                if len(rec):
                    parts.append((rec, idx))
                    held += len(rec)
                    if held >= STREAM_EVENTS:
                        yield _events_of(parts, log.offset_ns)
                        parts, held = [], 0
                continue
            try:
                obj = orjson.loads(payload) if kind != DIED else None
            except orjson.JSONDecodeError:
                raise EventLogError(f"{path}: corrupt event segment (bad JSON in block type "
                                    f"{kind})") from None
            if kind == RING:
                log.rings[idx] = obj
            elif kind == HEADER:
                if parts and int(obj["offset_ns"]) != log.offset_ns:  # earlier events: the old offset
                    yield _events_of(parts, log.offset_ns)
                    parts, held = [], 0
                log.offset_ns = int(obj["offset_ns"])
                log.run_ids.add(str(obj.get("run_id")))
            elif kind == STRINGS:
                dec = decoders.get(idx)
                if dec is None:
                    dec = decoders[idx] = record.SlotDecoder(log.requests)
                dec.load_table({int(k): v for k, v in obj.items()})
            elif kind == DIED:
                log.died.add(idx)
            elif kind == ACCOUNT:
                log.accounts[idx] = obj
    yield _events_of(parts, log.offset_ns)


# the record's bytes as one field of an event row: the first 32 bytes of EVENT_DTYPE are the
# record layout field for field, so a record becomes an event row by one copy of its bytes
assert all(EVENT_DTYPE.fields[n][1] == off for n, (_, off) in record.RECORD_DTYPE.fields.items())
_RECORD_PART = np.dtype({"names": ["rec"], "formats": [f"V{record.RECORD_SIZE}"], "offsets": [0],
                         "itemsize": EVENT_DTYPE.itemsize})


def to_events(rec: np.ndarray, ring: int, offset_ns: int) -> np.ndarray:
    """Decoded ring records -> ``EVENT_DTYPE`` rows of ring ``ring``, t in unix ns."""
    return _events_of([(rec, ring)], offset_ns)


def _events_of(parts: list[tuple[np.ndarray, int]], offset_ns: int) -> np.ndarray:
    """Several rings' decoded records -> one ``EVENT_DTYPE`` array, in order."""
    if _decodec is None:
        return events_of_reference(parts, offset_ns)
    ev = np.empty(sum(len(r) for r, _ in parts), EVENT_DTYPE)
    lo = 0
    for rec, ring in parts:  # one pass over each record's bytes
        _decodec.events_of(np.ascontiguousarray(rec), ev[lo:], ring, offset_ns)
        lo += len(rec)
    return ev


def events_of_reference(parts: list[tuple[np.ndarray, int]], offset_ns: int) -> np.ndarray:
    """:func:`_events_of`, the rule (``_decodec.events_of`` does the same in C): one copy of
    each record's bytes (field by field, and through a concatenation, cost ~3x as much)."""
    ev = np.empty(sum(len(r) for r, _ in parts), EVENT_DTYPE)
    head = ev.view(_RECORD_PART)["rec"]
    rings = ev["ring"]
    lo = 0
    for rec, ring in parts:
        hi = lo + len(rec)
        head[lo:hi] = np.ascontiguousarray(rec).view(head.dtype)
        rings[lo:hi] = ring
        lo = hi
    ev["t"] += offset_ns
    return ev
