"""Shared-memory chunk connector, as vLLM-Omni's SharedMemoryConnector.

``per-chunk`` (the default, what vLLM-Omni does): ``put`` creates a POSIX segment named by
the key ``{request}_{stage}_{chunk}``, writes header + payload, closes it; ``get`` opens it,
copies the payload out, closes and unlinks it. A miss (segment not there yet) is ``None``.

``pool``: the payload goes into a reused segment (a slot) and the key names a small
descriptor segment pointing at it, so polling, cleanup and the key stay the same while the
page-fault and mmap cost of a fresh multi-MB segment disappears. The consumer reads the
slot in place (a read-only view, no copy) and calls ``release(key)`` when done with it.
Slots come in size classes and are never resized; past ``POOL_MAX_BYTES`` per producer (a
consumer far behind) chunks fall back to per-chunk segments instead of growing the pool.

Segments are opened through ``_posixshmem`` + ``mmap`` (what ``SharedMemory`` does
underneath, mode 0600) rather than ``SharedMemory`` itself: that skips Python's resource
tracker, whose register/unregister round trips per chunk cost time and whose cleanup would
unlink or warn about segments another process owns. Readiness: the header magic is written
last, so a reader that opens a half-written segment sees no magic and treats it as a miss
(vLLM-Omni uses an flock lock file for the same purpose).
"""
from __future__ import annotations

import mmap
import os
import struct
from collections import deque
from dataclasses import dataclass

import _posixshmem  # type: ignore[import-not-found]
import numpy as np

from omnitrace.record import SHM_DIR

MODES = ("per-chunk", "pool")
MAGIC = b"OMC1"
# magic, flags, chunk, n_new, n_context, ndim, dtype, shape[3], nbytes
HDR = struct.Struct("<4sIiiiI8sqqqQ")
HDR_SIZE = 64
assert HDR.size <= HDR_SIZE
F_FINISHED, F_POOL, F_DATA = 1, 2, 4
SLOT_HDR = 64  # pool slot: u32 state (0 free, 1 full) then data
SLOT_FREE, SLOT_FULL = 0, 1
_U32 = struct.Struct("<I")
_SLOT_NAME = struct.Struct("64s")
_MB = 1 << 20
POOL_MAX_BYTES = 1 << 30  # per producer; beyond it chunks fall back to per-chunk segments


@dataclass
class ChunkMeta:
    chunk: int
    finished: bool = False
    n_new: int = 0  # new items (tokens / codec frames) in this chunk
    n_context: int = 0  # left-context frames carried again


class Segment:
    """One mapped POSIX shared-memory segment."""

    __slots__ = ("name", "mm", "size")

    def __init__(self, name: str, mm: mmap.mmap, size: int) -> None:
        self.name, self.mm, self.size = name, mm, size

    @classmethod
    def create(cls, name: str, size: int) -> "Segment":
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR
        try:
            fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        except FileExistsError:  # left by a crashed run under the same request id
            unlink(name)
            fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            unlink(name)
            raise
        os.close(fd)
        return cls(name, mm, size)

    @classmethod
    def open(cls, name: str) -> "Segment | None":
        """Attach, or None if it does not exist (yet) or is still empty."""
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < HDR_SIZE:
                return None
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, mm, size)

    def close(self) -> None:
        self.mm.close()


def _close_quietly(seg: Segment) -> None:
    try:
        seg.close()
    except BufferError:
        pass  # a leased view still uses it; unmapped when the last view is gone


def unlink(name: str) -> bool:
    try:
        _posixshmem.shm_unlink("/" + name)
        return True
    except FileNotFoundError:
        return False


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM_DIR, name))


def pool_slot_name(prefix: str, stage: int, idx: int) -> str:
    # "@" cannot occur in a request id (api._REQ_ID), so no chunk key can collide with a slot
    return f"{prefix}@{stage}.{idx}"


def chunk_key(request_id: str, stage: int, chunk: int) -> str:
    """The connector key and segment name, as vLLM-Omni: ``{request}_{stage}_{chunk}``."""
    return f"{request_id}_{stage}_{chunk}"


def _pack_header(buf: mmap.mmap, meta: ChunkMeta, data: np.ndarray | None, flags: int) -> None:
    shape = (list(data.shape) + [0, 0, 0])[:3] if data is not None else [0, 0, 0]
    dtype = data.dtype.str.encode() if data is not None else b""
    nbytes = data.nbytes if data is not None else 0
    flags |= (F_FINISHED if meta.finished else 0) | (F_DATA if data is not None else 0)
    HDR.pack_into(buf, 0, b"\0\0\0\0", flags, meta.chunk, meta.n_new, meta.n_context,
                  data.ndim if data is not None else 0, dtype, *shape, nbytes)


def _unpack_header(buf: mmap.mmap) -> tuple[int, ChunkMeta, tuple, str, int] | None:
    magic, flags, chunk, n_new, n_ctx, ndim, dtype, s0, s1, s2, nbytes = HDR.unpack_from(buf, 0)
    if magic != MAGIC:
        return None
    meta = ChunkMeta(chunk, bool(flags & F_FINISHED), n_new, n_ctx)
    return flags, meta, (s0, s1, s2)[:ndim], dtype.rstrip(b"\0").decode(), nbytes


def _size_class(nbytes: int) -> int:
    """Slot capacity: powers of two from 8 KiB to 1 MiB, then whole MiB."""
    if nbytes <= _MB:
        return max(8192, 1 << (max(nbytes, 1) - 1).bit_length())
    return -(-nbytes // _MB) * _MB


def _as_bytes(data: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(data)).cast("B")


class ShmConnector:
    """One stage process's connector: producer side (put) and consumer side (get)."""

    def __init__(self, stage_id: int, mode: str = "per-chunk", pool_prefix: str = "",
                 pool_max_bytes: int = POOL_MAX_BYTES) -> None:
        if mode not in MODES:
            raise ValueError(f"--shm: must be one of {', '.join(MODES)}, got {mode!r}")
        self.stage_id, self.mode = stage_id, mode
        self.pool_prefix = pool_prefix or f"ortpool{os.getpid()}"
        self._live: dict[str, tuple[str, int]] = {}  # key -> (request, pool slot or -1), unread
        self._slots: list[Segment] = []  # producer's pool slots, never resized or renamed
        self._classes: dict[int, deque[int]] = {}  # size class -> slot ids, oldest fill first
        self._pool_bytes = 0
        self.pool_max_bytes = pool_max_bytes
        self._peer_slots: dict[str, Segment] = {}  # consumer's cache, slot name -> mapping
        self._leases: dict[str, Segment] = {}  # consumer: key -> slot still being read

    # ------------------------------------------------------------------ producer
    def put(self, request_id: str, key: str, meta: ChunkMeta, data: np.ndarray | None) -> int:
        """Write one chunk under ``key``; returns the payload bytes written."""
        nbytes = 0 if data is None else data.nbytes
        slot = self._slot_for(nbytes) if self.mode == "pool" and data is not None else None
        if slot is not None:
            seg = self._slots[slot]
            seg.mm[SLOT_HDR:SLOT_HDR + nbytes] = _as_bytes(data)
            _U32.pack_into(seg.mm, 0, SLOT_FULL)
            desc = Segment.create(key, HDR_SIZE + _SLOT_NAME.size)
            try:
                _pack_header(desc.mm, meta, data, F_POOL)
                _SLOT_NAME.pack_into(desc.mm, HDR_SIZE, seg.name.encode())
                desc.mm[0:4] = MAGIC
            finally:
                desc.close()
            self._live[key] = (request_id, slot)
            return nbytes
        seg = Segment.create(key, HDR_SIZE + max(nbytes, 1))
        try:
            if data is not None:
                seg.mm[HDR_SIZE:HDR_SIZE + nbytes] = _as_bytes(data)
            _pack_header(seg.mm, meta, data, 0)
            seg.mm[0:4] = MAGIC  # published: readers treat a segment without magic as a miss
        finally:
            seg.close()
        self._live[key] = (request_id, -1)
        return nbytes

    def _slot_for(self, nbytes: int) -> int | None:
        """A free slot of the payload's size class, or a new one; None past the pool budget.

        Slots of a class are kept in the order they were last filled; consumers release them
        roughly in that order, so checking only the oldest keeps a put O(1).
        """
        cap = _size_class(nbytes)
        ring = self._classes.setdefault(cap, deque())
        if ring and _U32.unpack_from(self._slots[ring[0]].mm, 0)[0] == SLOT_FREE:
            idx = ring.popleft()
            ring.append(idx)
            return idx
        if self._pool_bytes + cap > self.pool_max_bytes:
            return None  # a consumer far behind: fall back to a per-chunk segment
        idx = len(self._slots)
        self._slots.append(Segment.create(pool_slot_name(self.pool_prefix, self.stage_id, idx), SLOT_HDR + cap))
        self._pool_bytes += cap
        ring.append(idx)
        return idx

    def reap_consumed(self, max_keys: int = 16) -> None:
        """Forget keys the consumer already read (its segment is gone), oldest first."""
        for key in list(self._live)[:max_keys]:
            if not exists(key):
                del self._live[key]

    def discard_request(self, request_id: str) -> int:
        """Unlink every chunk of a request that nobody read (abort, stop); returns the count."""
        n = 0
        for key in [k for k, (r, _) in self._live.items() if r == request_id]:
            _, slot = self._live.pop(key)
            if unlink(key):
                n += 1
                if slot >= 0 and slot < len(self._slots):
                    _U32.pack_into(self._slots[slot].mm, 0, SLOT_FREE)
        return n

    # ------------------------------------------------------------------ consumer
    def get(self, key: str) -> tuple[ChunkMeta, np.ndarray | None, int] | None:
        """Read and unlink the chunk under ``key``; None when it is not (fully) there yet."""
        seg = Segment.open(key)
        if seg is None:
            return None
        try:
            head = _unpack_header(seg.mm)
            if head is None:
                return None  # still being written
            flags, meta, shape, dtype, nbytes = head
            data = None
            if flags & F_POOL:
                # Zero-copy: a read-only view on the producer's slot, leased until
                # release(key) (the consumer scheduler calls it once it used the chunk).
                slot_name = _SLOT_NAME.unpack_from(seg.mm, HDR_SIZE)[0].rstrip(b"\0").decode()
                slot = self._peer_slot(slot_name)
                count = nbytes // np.dtype(dtype).itemsize
                data = np.frombuffer(slot.mm, dtype=dtype, count=count, offset=SLOT_HDR).reshape(shape)
                data.flags.writeable = False
                unlink(key)
                self._leases[key] = slot
                return meta, data, nbytes
            if flags & F_DATA:
                raw = seg.mm[HDR_SIZE:HDR_SIZE + nbytes]
                data = np.frombuffer(raw, dtype=dtype).reshape(shape)
            unlink(key)
            return meta, data, nbytes
        finally:
            seg.close()

    def release(self, key: str) -> None:
        """Consumer: done with a pool chunk's data; the producer may reuse its slot."""
        slot = self._leases.pop(key, None)
        if slot is not None:
            _U32.pack_into(slot.mm, 0, SLOT_FREE)

    def _peer_slot(self, name: str) -> Segment:
        seg = self._peer_slots.get(name)
        if seg is None:
            seg = Segment.open(name)
            if seg is None:
                raise FileNotFoundError(name)
            self._peer_slots[name] = seg
        return seg

    def close(self) -> None:
        """Unlink unread chunks and this producer's pool slots; unmap peer slots."""
        for key in list(self._live):
            unlink(key)
        self._live.clear()
        for seg in self._slots:
            seg.close()
            unlink(seg.name)
        self._slots.clear()
        self._classes.clear()
        self._pool_bytes = 0
        for key in list(self._leases):
            self.release(key)
        for seg in self._peer_slots.values():
            _close_quietly(seg)
        self._peer_slots.clear()


def sweep(prefixes: list[str], shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every segment whose name starts with one of ``prefixes``; returns the names."""
    if not prefixes:
        return []
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return []
    pre = tuple(prefixes)
    gone = [n for n in names if n.startswith(pre) and unlink(n)]
    return gone
