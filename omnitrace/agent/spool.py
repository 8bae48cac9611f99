"""The agent's raw event spool (``events.bin`` in the run directory).

A drain thread copies ring slots verbatim into this file and frees them at once (a
memcpy per ring and cycle, ~tens of millions of slots/s), so the rings drop only if
that copy cannot keep up; assembly reads the spool at its own pace and may fall behind
real time. The file is on disk, so a backlog costs disk, not agent memory.

Format (little endian): a sequence of blocks, each a 12-byte header
``(type u8, 3 pad, ring u32, length u32)`` and ``length`` payload bytes:

* ``RING``    (1) payload: JSON object describing ring ``ring`` (name, pid, tid,
  thread, role, stage, replica, process, offset_ns); written when a ring is first seen
  and whenever its writer identity changes (role/stage may be set after creation).
* ``RECORDS`` (2) payload: ``length / 32`` consecutive ring slots exactly as in the ring
  (``omnitrace.record.RECORD`` layout, STRING records and their byte slots included;
  a string's bytes may continue in the ring's next RECORDS block).
* ``DIED``    (3) no payload: the ring's writer process is gone; its last records
  precede this block.

Blocks are only appended and a reader never reads past the committed size, so it never
sees a partial block. When assembly has consumed everything, the writer truncates the
file to zero (disk stays small while the agent keeps up); it is removed at the end.
"""
from __future__ import annotations

import os
import struct
import threading

import orjson

from omnitrace import conventions as cv
from omnitrace import record

BLOCK = struct.Struct("<B3xII")
RING, RECORDS, DIED = 1, 2, 3
_RS = record.RECORD_SIZE
_STRING = int(cv.Ev.STRING)


class Spool:
    """One spool file: appended by the drain thread, read by the assembler thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.size = 0  # bytes written (drain thread)
        self.committed = 0  # bytes a reader may read
        self.read_pos = 0  # bytes consumed (assembler thread)
        self.total_written = 0  # over the run, across truncations
        self.total_read = 0
        self.truncations = 0
        self._lock = threading.Lock()  # truncation vs. a read in progress
        self._buf: list[bytes] = []

    # ---------------------------------------------------------------- writer side
    def ring(self, idx: int, info: dict) -> None:
        data = orjson.dumps(info)
        self._buf.append(BLOCK.pack(RING, idx, len(data)))
        self._buf.append(data)

    def records(self, idx: int, raw: bytes) -> None:
        self._buf.append(BLOCK.pack(RECORDS, idx, len(raw)))
        self._buf.append(raw)

    def died(self, idx: int) -> None:
        self._buf.append(BLOCK.pack(DIED, idx, 0))

    def commit(self) -> None:
        """Write this cycle's blocks (one write) and publish them to the reader."""
        with self._lock:
            if self.read_pos == self.committed and self.committed > 0:
                os.ftruncate(self.fd, 0)  # all consumed: start over, disk stays small
                self.size = self.committed = self.read_pos = 0
                self.truncations += 1
            if not self._buf:
                return
            data = b"".join(self._buf)
            self._buf.clear()
            os.pwrite(self.fd, data, self.size)
            self.size += len(data)
            self.total_written += len(data)
            self.committed = self.size

    # ---------------------------------------------------------------- reader side
    def backlog(self) -> int:
        return self.committed - self.read_pos

    def read_blocks(self, max_bytes: int = 4 << 20) -> list[tuple[int, int, bytes]]:
        """Whole blocks from the read position, about ``max_bytes`` of them at most."""
        with self._lock:
            pos, end = self.read_pos, self.committed
            if pos >= end:
                return []
            data = os.pread(self.fd, min(end - pos, max_bytes), pos)
            out = []
            off, n = 0, len(data)
            while off + BLOCK.size <= n:
                kind, idx, length = BLOCK.unpack_from(data, off)
                stop = off + BLOCK.size + length
                if stop > n:
                    if off == 0:  # one block larger than max_bytes: read it whole
                        data = os.pread(self.fd, BLOCK.size + length, pos)
                        out.append((kind, idx, data[BLOCK.size:]))
                        off = len(data)
                    break
                out.append((kind, idx, data[off + BLOCK.size:stop]))
                off = stop
            self.read_pos = pos + off
            self.total_read += off
            return out

    def close(self, remove: bool = True) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
        if remove:
            try:
                os.unlink(self.path)
            except OSError:
                pass


class RingDecoder:
    """Decodes one ring's RECORDS payloads into events, keeping the string table and a
    string cut across two blocks (the same decoding as ``RingReader.read_batch``)."""

    __slots__ = ("strings", "_pending", "_need", "_rid", "_len")

    def __init__(self) -> None:
        self.strings: dict[int, str] = {}
        self._pending = bytearray()
        self._need = 0  # string slots still to come
        self._rid = 0
        self._len = 0

    def decode(self, raw: bytes) -> list[tuple[int, str, int, int, int, int, int]]:
        out: list[tuple[int, str, int, int, int, int, int]] = []
        append, strings = out.append, self.strings
        off = 0
        if self._need:  # the rest of a string begun in the previous block
            take = min(self._need, len(raw) // _RS)
            self._pending += raw[:take * _RS]
            self._need -= take
            off = take * _RS
            if self._need:
                return out
            self._store()
        view = memoryview(raw)[off:]
        skip = 0
        pos = 0
        for t, a, rid, chunk, kind, stage, b in record.RECORD.iter_unpack(view):
            pos += 1
            if skip:
                skip -= 1
                continue
            if kind == _STRING:
                slots = (a + _RS - 1) // _RS
                start = off + pos * _RS
                have = min(slots, (len(raw) - start) // _RS)
                skip = have
                self._rid, self._len = rid, a
                self._pending = bytearray(raw[start:start + have * _RS])
                self._need = slots - have
                if not self._need:
                    self._store()
                continue
            append((kind, strings.get(rid, ""), stage, chunk, a, b, t))
        return out

    def _store(self) -> None:
        if self._rid == 1:
            self.strings.clear()  # the writer reset its table
        self.strings[self._rid] = bytes(self._pending[:self._len]).decode("utf-8", "replace")
        self._pending = bytearray()
