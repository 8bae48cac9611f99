"""The async-chunk transfer path of one stage process, as vLLM-Omni's chunk adapter.

* :class:`Fifo` -- ONE deque + Condition per stage process; the scheduler thread appends
  a task per request per step, so tasks of all requests queue behind each other
  (head-of-line blocking is real, not modelled).
* :class:`Sender` -- the ONE sender ("save_loop") thread: pops tasks in order, runs the
  processor (payload building; it may return no chunk) and puts the chunk into shared
  memory. It blocks on the Condition when the FIFO is empty (never spins).
* :class:`Receiver` -- the consumer's "recv_loop" thread: polls the next chunk key of
  every registered request, backing off 1 ms when a pass makes no progress.

Chunk index numbering: the producer's chunk index N is the Nth chunk *put* for the request
(key ``{request}_{producer}_{N}``); the consumer asks for exactly that key, so both sides
record the same index. A FIFO task carries the index its chunk will have; a task whose
processor yields no chunk (talker between codec boundaries) carries the index the *next*
chunk will have, so FIFO_ENQUEUE/FIFO_DEQUEUE always pair on (request, stage, chunk).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from omnitrace import record
from omnitrace.conventions import Ev
from omnitrace.runtime.config import ChunkConfig, StageConfig
from omnitrace.runtime.shm import ChunkMeta, ShmConnector, chunk_key, unlink
from omnitrace.runtime.snapshot import Request

_EV_DEQ = int(Ev.FIFO_DEQUEUE)
_EV_ENQ = int(Ev.FIFO_ENQUEUE)
_EV_PROC_B, _EV_PROC_E = int(Ev.PROCESS_BEGIN), int(Ev.PROCESS_END)
_EV_PUT_B, _EV_PUT_E = int(Ev.PUT_BEGIN), int(Ev.PUT_END)
_EV_GET_B, _EV_GET_E = int(Ev.GET_BEGIN), int(Ev.GET_END)
_EV_READY = int(Ev.CHUNK_READY)

CHUNK, CLEANUP = 0, 1


class Task:
    __slots__ = ("kind", "request_id", "chunk", "snapshot", "finished")

    def __init__(self, kind: int, request_id: str, chunk: int, snapshot: Request | None = None,
                 finished: bool = False) -> None:
        self.kind, self.request_id, self.chunk = kind, request_id, chunk
        self.snapshot, self.finished = snapshot, finished


# --------------------------------------------------------------------------- processors
def codec_boundary(n_frames: int, sent: int, finished: bool, ch: ChunkConfig) -> bool:
    """Whether the talker's processor emits a codec chunk after ``n_frames`` frames.

    Pure, so the scheduler can label FIFO tasks with the chunk index the sender will use:
    first chunk after ``initial_codec_chunk_frames``, then every ``codec_chunk_frames``,
    and always a terminal chunk when the request finishes.
    """
    if finished:
        return True
    if sent == 0:
        return n_frames >= ch.initial_codec_chunk_frames
    return n_frames - sent >= ch.codec_chunk_frames


class HiddenProcessor:
    """thinker2talker: chunk 0 = prefill hidden states, then one decode chunk per step."""

    def __init__(self, ch: ChunkConfig) -> None:
        self.ch = ch
        self._sent: dict[str, int] = {}

    def process(self, task: Task) -> tuple[ChunkMeta, np.ndarray] | None:
        n = self._sent.get(task.request_id, 0)
        snap = task.snapshot
        assert snap is not None
        if n == 0:  # embed + hidden states for every prompt token, bf16 stored as 2-byte floats
            p = len(snap.prompt_token_ids)
            data = np.full((p, self.ch.prefill_bytes_per_token // 2), 0.5, dtype=np.float16)
            new = p
        else:
            data = np.full((1, self.ch.decode_bytes // 2), 0.25, dtype=np.float16)
            new = 1
        self._sent[task.request_id] = n + 1
        if task.finished:
            self._sent.pop(task.request_id, None)
        return ChunkMeta(n, task.finished, new, 0), data

    def drop(self, request_id: str) -> None:
        self._sent.pop(request_id, None)


class CodecProcessor:
    """talker2code2wav: 4 frames first, then every 25 with 25 frames of left context;
    returns None between boundaries (no chunk), as vLLM-Omni's processor does."""

    def __init__(self, ch: ChunkConfig) -> None:
        self.ch = ch
        self._state: dict[str, tuple[int, int]] = {}  # request -> (frames sent, chunks sent)
        self._books = np.arange(ch.codebooks, dtype=np.int64)

    def process(self, task: Task) -> tuple[ChunkMeta, np.ndarray | None] | None:
        snap = task.snapshot
        assert snap is not None
        frames = snap.output_token_ids
        n = len(frames)
        sent, idx = self._state.get(task.request_id, (0, 0))
        if not codec_boundary(n, sent, task.finished, self.ch):
            return None
        ctx = min(self.ch.codec_left_context_frames, sent)
        codes = np.asarray(frames[sent - ctx:n], dtype=np.int64)[:, None] * 16 + self._books
        if task.finished:
            self._state.pop(task.request_id, None)
        else:
            self._state[task.request_id] = (n, idx + 1)
        return ChunkMeta(idx, task.finished, n - sent, ctx), (codes if len(codes) else None)

    def drop(self, request_id: str) -> None:
        self._state.pop(request_id, None)


def make_processor(cfg: StageConfig) -> HiddenProcessor | CodecProcessor:
    return HiddenProcessor(cfg.chunk) if cfg.produces == "hidden" else CodecProcessor(cfg.chunk)


# --------------------------------------------------------------------------- FIFO + sender
class Fifo:
    """The one per-process task FIFO shared by every request's chunks."""

    def __init__(self) -> None:
        self.tasks: deque[Task] = deque()
        self.cond = threading.Condition(threading.Lock())
        self.cancelled: set[str] = set()
        self.stopping = False

    def enqueue(self, ring: Any, task: Task, stage: int, consumer: int) -> None:
        """Scheduler thread: append and wake the sender (FIFO_ENQUEUE a = tasks ahead)."""
        with self.cond:
            ahead = len(self.tasks)
            self.tasks.append(task)
            self.cond.notify()
        if task.kind == CHUNK:
            ring.record(_EV_ENQ, task.request_id, stage, task.chunk, ahead, consumer)

    def cancel(self, request_id: str) -> None:
        """Scheduler thread, on abort: drop the request's queued tasks, then clean up."""
        with self.cond:
            self.cancelled.add(request_id)
            self.tasks.append(Task(CLEANUP, request_id, -1))
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()


class Sender(threading.Thread):
    def __init__(self, fifo: Fifo, conn: ShmConnector, processor: HiddenProcessor | CodecProcessor,
                 stage: int, consumer: int, put_delay_s: float = 0.0,
                 on_error: Callable[[str, str], None] | None = None) -> None:
        super().__init__(name="sender", daemon=True)
        self.on_error = on_error
        self.put_delay_s = put_delay_s  # fault injection (StageConfig.inject_put_delay_ms)
        self.fifo, self.conn, self.processor = fifo, conn, processor
        self.stage, self.consumer = stage, consumer
        self.put_chunk: dict[str, int] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # surfaced by the scheduler thread as a stage failure
            self.error = e

    def _loop(self) -> None:
        ring = record.thread_ring()
        fifo, conn, proc, stage, consumer = self.fifo, self.conn, self.processor, self.stage, self.consumer
        tasks, cond = fifo.tasks, fifo.cond
        while True:
            if not tasks:  # idle: forget consumed keys outside the lock (a few stat calls)
                conn.reap_consumed()
            with cond:
                while not tasks and not fifo.stopping:
                    cond.wait()
                if fifo.stopping:
                    return
                task = tasks.popleft()
                left = len(tasks)
                dropped = task.request_id in fifo.cancelled
                if task.kind == CLEANUP:
                    fifo.cancelled.discard(task.request_id)
            req = task.request_id
            if task.kind == CLEANUP:  # abort: forget state, unlink chunks nobody read
                proc.drop(req)
                self.put_chunk.pop(req, None)
                conn.discard_request(req)
                continue
            ring.record(_EV_DEQ, req, stage, task.chunk, left, consumer)
            if dropped:
                continue
            ring.record(_EV_PROC_B, req, stage, task.chunk, 0, consumer)
            out = proc.process(task)
            if out is None:
                ring.record(_EV_PROC_E, req, stage, task.chunk, 0, consumer)
                continue
            meta, data = out
            nbytes = 0 if data is None else data.nbytes
            ring.record(_EV_PROC_E, req, stage, task.chunk, nbytes, consumer)
            idx = self.put_chunk.get(req, 0)
            meta.chunk = idx
            ring.record(_EV_PUT_B, req, stage, idx, nbytes, consumer)
            if self.put_delay_s:
                time.sleep(self.put_delay_s)
            try:
                conn.put(req, chunk_key(req, stage, idx), meta, data)
            except OSError as e:  # e.g. /dev/shm full: fail this request, keep serving others
                ring.record(_EV_PUT_E, req, stage, idx, 0, consumer)
                with cond:
                    fifo.cancelled.add(req)  # its later tasks are dropped until the abort's cleanup
                if self.on_error is not None:
                    self.on_error(req, f"chunk {idx} put failed: {e}")
                continue
            ring.record(_EV_PUT_E, req, stage, idx, nbytes, consumer)
            if meta.finished:
                self.put_chunk.pop(req, None)
            else:
                self.put_chunk[req] = idx + 1


# --------------------------------------------------------------------------- receiver
class Receiver(threading.Thread):
    """Polls ``{request}_{producer}_{chunk}`` for every registered request."""

    BACKOFF_S = 0.001  # vLLM-Omni's recv_loop waits 1 ms after a pass without progress
    IDLE_S = 0.1

    def __init__(self, conn: ShmConnector, stage: int, producer: int,
                 on_ready: Callable[[str, ChunkMeta, Any, int], None],
                 on_error: Callable[[str, str], None] | None = None) -> None:
        super().__init__(name="receiver", daemon=True)
        self.conn, self.stage, self.producer, self.on_ready = conn, stage, producer, on_ready
        self.on_error = on_error
        self.cond = threading.Condition(threading.Lock())
        self.loading: dict[str, int] = {}  # request -> chunk index it waits for
        self.stopping = False
        self.error: BaseException | None = None

    def load(self, request_id: str, chunk: int) -> None:
        """Scheduler thread: ask for the request's next chunk (vLLM-Omni's load_async)."""
        with self.cond:
            self.loading[request_id] = chunk
            self.cond.notify()

    def unregister(self, request_id: str) -> None:
        with self.cond:
            self.loading.pop(request_id, None)

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:
            self.error = e

    def _loop(self) -> None:
        ring = record.thread_ring()
        conn, stage, producer, loading, cond = self.conn, self.stage, self.producer, self.loading, self.cond
        now = time.perf_counter_ns
        while True:
            with cond:
                if self.stopping:
                    return
                if not loading:
                    cond.wait(self.IDLE_S)
                    continue
                entries = list(loading.items())
            hit = False
            for req, chunk in entries:
                t0 = now()
                key = chunk_key(req, producer, chunk)
                try:
                    res = conn.get(key)
                except Exception as e:  # a broken segment fails its request only, not the stage
                    unlink(key)  # the reader owns what it read, broken or not
                    self.unregister(req)
                    if self.on_error is not None:
                        self.on_error(req, f"chunk {chunk} get failed: {e}")
                    continue
                if res is None:
                    continue
                with cond:
                    if loading.get(req) != chunk:  # aborted while we read it
                        conn.release(chunk_key(req, producer, chunk))
                        continue
                    del loading[req]
                meta, data, nbytes = res
                ring.record(_EV_GET_B, req, stage, chunk, 0, producer, t0)
                ring.record(_EV_GET_E, req, stage, chunk, nbytes, producer)
                ring.record(_EV_READY, req, stage, chunk, nbytes, producer)
                self.on_ready(req, meta, data, chunk)
                hit = True
            if not hit:
                with cond:
                    if not self.stopping:
                        cond.wait(self.BACKOFF_S)
