"""A stage process: scheduler loop with continuous batching, compute model, chunk I/O.

Threads, as in a vLLM-Omni stage EngineCore process: the scheduler (main thread: admit,
step, update, snapshot + enqueue), ``input`` (control messages from the API server, the
ZMQ input socket's role), ``sender`` and ``receiver`` (omnitrace.runtime.transfer).

Control messages in (from the API): ``("add", id, prompt_tokens, max_tokens)``,
``("abort", id)``, ``("stop",)``. Messages out (to the API): ``("ready", stage)``,
``("text", id, index, text)``, ``("audio", id, index, wav_bytes)``, ``("finish", id, stage)``,
``("error", id, message)`` (one request failed), ``("fatal", stage, message)``.
"""
from __future__ import annotations

import ctypes
import io
import math
import os
import signal
import threading
import traceback
import wave
from collections import deque
from typing import Any

import numpy as np

from omnitrace import record
from omnitrace.conventions import Ev, Modality, Status
from omnitrace.runtime import compute, config, snapshot
from omnitrace.runtime.shm import ChunkMeta, ShmConnector, chunk_key
from omnitrace.runtime.transfer import CHUNK, Fifo, Receiver, Sender, Task, codec_boundary, make_processor

_EV_ADD, _EV_SCHED = int(Ev.STAGE_ADD), int(Ev.STAGE_SCHEDULE)
_EV_FINISH, _EV_EMIT = int(Ev.STAGE_FINISH), int(Ev.STAGE_EMIT)
_EV_STEP_B, _EV_STEP_E = int(Ev.STEP_BEGIN), int(Ev.STEP_END)
_EV_SNAP_B, _EV_SNAP_E = int(Ev.SNAPSHOT_BEGIN), int(Ev.SNAPSHOT_END)
_EV_CHUNK_SCHED = int(Ev.CHUNK_SCHEDULED)
_OK, _CANCELLED = int(Status.OK), int(Status.CANCELLED)
_TEXT, _AUDIO = int(Modality.TEXT), int(Modality.AUDIO)
_VOCAB = 151_000


class ReqState:
    __slots__ = ("rid", "req", "max_tokens", "target", "produced", "prefilled", "received",
                 "upstream_done", "pending", "label", "label_sent", "packets")

    def __init__(self, rid: str, prompt_tokens: int, max_tokens: int, target: int) -> None:
        self.rid = rid
        seed = sum(rid.encode()) * 7919
        # Placeholder prompt ids (vLLM-Omni prewarms downstream stages with [0]*N as well).
        self.req = snapshot.Request(rid, [(seed + i) % _VOCAB for i in range(prompt_tokens)],
                                    {"upstream_chunks": [], "speaker": "default"})
        self.max_tokens, self.target = max_tokens, target
        self.produced = 0
        self.prefilled = False
        self.received = 0  # upstream chunks taken into the request
        self.upstream_done = False
        self.pending: deque[tuple[ChunkMeta, Any]] = deque()  # generation stage input
        self.label = 0  # chunk index of this request's next put (see transfer.py)
        self.label_sent = 0  # codec frames covered by chunks so far (scheduler's view)
        self.packets = 0  # outputs emitted to the API


class Stage:
    def __init__(self, pipe: config.PipelineConfig, stage_id: int, snapshot_strategy: str,
                 shm_mode: str, pool_prefix: str, in_q: Any, out_q: Any) -> None:
        self.pipe, self.cfg, self.sid = pipe, pipe.stages[stage_id], stage_id
        self.in_q, self.out_q = in_q, out_q
        self.producer = pipe.producer_of(stage_id)
        self.consumer = pipe.consumer_of(stage_id)
        self.snap, self.snap_kind = snapshot.get(snapshot_strategy)
        self.compute = compute.make(self.cfg)
        self.conn = ShmConnector(stage_id, shm_mode, pool_prefix)
        self.waiting: deque[ReqState] = deque()
        self.running: dict[str, ReqState] = {}
        self.states: dict[str, ReqState] = {}
        self.wake = threading.Condition(threading.Lock())
        self.inbox: deque[tuple] = deque()
        self.ready: deque[tuple[str, ChunkMeta, Any, int]] = deque()
        self.stopping = False
        self.fifo: Fifo | None = None
        self.sender: Sender | None = None
        self.receiver: Receiver | None = None
        if self.consumer is not None:
            self.fifo = Fifo()
            self.sender = Sender(self.fifo, self.conn, make_processor(self.cfg), stage_id, self.consumer,
                                 self.cfg.inject_put_delay_ms / 1e3, on_error=self._on_error)
        if self.producer is not None:
            self.receiver = Receiver(self.conn, stage_id, self.producer, self._on_ready, self._on_error)
        self.audio = pipe.audio

    # ------------------------------------------------------------------ other threads
    def _on_ready(self, rid: str, meta: ChunkMeta, data: Any, chunk: int) -> None:
        with self.wake:  # receiver thread: hand the chunk to the scheduler's next step
            self.ready.append((rid, meta, data, chunk))
            self.wake.notify()

    def _on_error(self, rid: str, message: str) -> None:
        # sender/receiver thread: one chunk failed; fail that request only (the API aborts it)
        self.out_q.put(("error", rid, f"stage {self.sid} ({self.cfg.name}): {message}"))

    def _input_loop(self) -> None:
        while True:
            try:
                msg = self.in_q.get()
            except (EOFError, OSError):
                msg = ("stop",)  # the API server went away
            with self.wake:
                self.inbox.append(msg)
                self.wake.notify()
            if msg[0] == "stop":
                return

    # ------------------------------------------------------------------ scheduler
    def run(self) -> None:
        threading.Thread(target=self._input_loop, name="input", daemon=True).start()
        for t in (self.sender, self.receiver):
            if t is not None:
                t.start()
        self.out_q.put(("ready", self.sid))
        ring = record.thread_ring()
        try:
            self._loop(ring)
        finally:
            self._shutdown()

    def _loop(self, ring: Any) -> None:
        sid, wake = self.sid, self.wake
        while not self.stopping:
            for t in (self.sender, self.receiver):
                if t is not None and t.error is not None:
                    raise RuntimeError(f"{t.name} thread failed: {t.error!r}") from t.error
            if self.inbox:
                self._drain_inbox(ring)
            if self.ready:
                self._take_ready(ring)
            if self.waiting:
                self._admit(ring)
            batch = [r for r in self.running.values() if self._has_work(r)]
            if not batch:
                with wake:
                    if not self.inbox and not self.ready and not self.stopping:
                        wake.wait(0.05)
                continue
            prefill = 0
            if self.producer is None:
                prefill = sum(len(r.req.prompt_token_ids) for r in batch if not r.prefilled)
            n = len(batch)
            ring.record(_EV_STEP_B, "", sid, -1, n, prefill)
            self.compute.step(n, prefill)
            ring.record(_EV_STEP_E, "", sid, -1, n, 0)
            for r in batch:
                self._update(r, ring)

    def _drain_inbox(self, ring: Any) -> None:
        while self.inbox:
            with self.wake:
                msg = self.inbox.popleft()
            op = msg[0]
            if op == "add":
                self._add(msg[1], msg[2], msg[3], ring)
            elif op == "abort":
                self._abort(msg[1], ring)
            elif op == "stop":
                self.stopping = True
                return

    def _add(self, rid: str, prompt_tokens: int, max_tokens: int, ring: Any) -> None:
        if self.producer is None:
            target = max_tokens
        elif self.cfg.kind == "ar":
            target = max(1, math.ceil(max_tokens * self.cfg.frames_per_token))
        else:
            target = 0  # generation: until the terminal chunk
        st = ReqState(rid, prompt_tokens, max_tokens, target)
        self.states[rid] = st
        self.waiting.append(st)
        ring.record(_EV_ADD, rid, self.sid, -1, len(self.waiting), 0)
        if self.receiver is not None:
            self.receiver.load(rid, 0)  # prewarmed: wait for the first upstream chunk

    def _abort(self, rid: str, ring: Any) -> None:
        st = self.states.pop(rid, None)
        if st is not None:
            for meta, _ in st.pending:
                self._release(rid, meta.chunk)
            st.pending.clear()
            self.running.pop(rid, None)
            try:
                self.waiting.remove(st)
            except ValueError:
                pass
            ring.record(_EV_FINISH, rid, self.sid, -1, _CANCELLED, 0)
        if self.receiver is not None:
            self.receiver.unregister(rid)
        if self.fifo is not None:
            self.fifo.cancel(rid)  # drops queued tasks, unlinks chunks nobody read
        # ready chunks of the request are dropped in _take_ready (state is gone)

    def _take_ready(self, ring: Any) -> None:
        sid, producer = self.sid, self.producer
        while self.ready:
            with self.wake:
                rid, meta, data, chunk = self.ready.popleft()
            st = self.states.get(rid)
            if st is None:
                self._release(rid, chunk)
                continue  # aborted
            ring.record(_EV_CHUNK_SCHED, rid, sid, chunk, 0, producer)
            st.received += 1
            if meta.finished:
                st.upstream_done = True
            if self.cfg.kind == "generation":
                st.pending.append((meta, data))
            else:  # the talker keeps only what it needs from the hidden states
                st.req.additional_information["upstream_chunks"].append(meta.n_new)
                self._release(rid, chunk)
            if not meta.finished and self.receiver is not None:
                self.receiver.load(rid, chunk + 1)  # at most one chunk per request per step

    def _release(self, rid: str, chunk: int) -> None:
        if self.producer is not None:  # pool mode: hand the slot back to the producer
            self.conn.release(chunk_key(rid, self.producer, chunk))

    def _has_work(self, st: ReqState) -> bool:
        if self.producer is None:
            return st.produced < st.target
        if self.cfg.kind == "generation":
            return bool(st.pending)
        # AR consumer: frame i needs upstream chunk min(i, last) (chunk 0 = prefill)
        return st.upstream_done or st.received > st.produced

    def _admit(self, ring: Any) -> None:
        room = self.cfg.max_batch_size - len(self.running)
        if room <= 0:
            return
        # First stage: new requests prefill in their first step, so admit them within the
        # per-step token budget (vLLM's max_num_batched_tokens; one oversized prompt runs alone).
        budget = self.cfg.max_num_batched_tokens if self.producer is None else 1 << 62
        admitted_tokens = 0
        keep: deque[ReqState] = deque()
        while self.waiting:
            st = self.waiting.popleft()
            need = len(st.req.prompt_token_ids) if self.producer is None else 0
            fits = admitted_tokens == 0 or admitted_tokens + need <= budget
            if room > 0 and fits and self._has_work(st):
                self.running[st.rid] = st
                room -= 1
                admitted_tokens += max(need, 1)
                ring.record(_EV_SCHED, st.rid, self.sid, -1, len(self.running), 0)
            else:
                keep.append(st)  # waiting for its first chunk, for room, or for budget
        self.waiting = keep

    def _update(self, st: ReqState, ring: Any) -> None:
        cfg, sid, rid = self.cfg, self.sid, st.rid
        finished = False
        if self.producer is None:  # thinker: one text token per step (prefill step included)
            st.prefilled = True
            tok = (st.req.prompt_token_ids[-1] if st.req.prompt_token_ids else 0) * 31 + st.produced
            st.req.output_token_ids.append(tok % _VOCAB)
            st.produced += 1
            finished = st.produced >= st.target
            self._emit(st, ("text", rid, st.packets, f"tok{st.produced - 1} "), _TEXT, ring)
        elif cfg.kind == "ar":  # talker: one codec frame per step
            st.req.output_token_ids.append((st.produced * 131 + len(rid)) % 4096)
            st.produced += 1
            finished = st.produced >= st.target
        else:  # code2wav: one codec chunk -> one PCM packet
            meta, data = st.pending.popleft()
            if meta.n_new > 0:
                self._emit(st, ("audio", rid, st.packets, self._wav(meta, data)), _AUDIO, ring)
            del data
            self._release(rid, meta.chunk)
            finished = meta.finished
        if self.fifo is not None:
            self._save(st, finished, ring)
        if finished:
            self.running.pop(rid, None)
            self.states.pop(rid, None)
            ring.record(_EV_FINISH, rid, sid, -1, _OK, 0)
            self.out_q.put(("finish", rid, sid))

    def _save(self, st: ReqState, finished: bool, ring: Any) -> None:
        """save_async: snapshot the live request and enqueue a chunk task (every step)."""
        sid, consumer = self.sid, self.consumer
        if self.cfg.produces == "codec":
            chunk = st.label  # the index the chunk will have, or the next one if none
            if codec_boundary(st.produced, st.label_sent, finished, self.cfg.chunk):
                st.label += 1
                st.label_sent = st.produced
        else:
            chunk = st.label
            st.label += 1
        ring.record(_EV_SNAP_B, st.rid, sid, chunk, 0, consumer)
        snap = self.snap(st.req)
        ring.record(_EV_SNAP_E, st.rid, sid, chunk, self.snap_kind, consumer)
        self.fifo.enqueue(ring, Task(CHUNK, st.rid, chunk, snap, finished), sid, consumer)  # type: ignore[union-attr]

    def _emit(self, st: ReqState, msg: tuple, modality: int, ring: Any) -> None:
        ring.record(_EV_EMIT, st.rid, self.sid, -1, st.packets, modality)
        st.packets += 1
        self.out_q.put(msg)  # pickled and written by the queue's feeder thread

    def _wav(self, meta: ChunkMeta, data: Any) -> bytes:
        """PCM16 mono WAV for the chunk's new frames (a tone whose pitch follows the codes)."""
        spf, rate = self.audio.samples_per_frame, self.audio.sample_rate
        n = meta.n_new * spf
        codes = data[meta.n_context:, 0] if data is not None else np.zeros(meta.n_new, np.int64)
        freq = 200.0 + (np.repeat(codes.astype(np.float64), spf)[:n] % 400.0)
        t = np.arange(n, dtype=np.float64) / rate
        pcm = (np.sin(2 * np.pi * freq * t) * 8000).astype("<i2")
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(pcm.tobytes())
        return buf.getvalue()

    def _shutdown(self) -> None:
        if self.fifo is not None:
            self.fifo.stop()
        if self.receiver is not None:
            self.receiver.stop()
        for t in (self.sender, self.receiver):
            if t is not None and t.is_alive():
                t.join(timeout=2.0)
        self.conn.close()  # unlink chunks nobody read and the pool's segments


def _die_with_parent() -> None:
    # If the API server is SIGKILLed, take the stage down too (Linux prctl PR_SET_PDEATHSIG).
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)
    except Exception:
        pass


def stage_main(pipe_dict: dict, stage_id: int, snapshot_strategy: str, shm_mode: str,
               pool_prefix: str, in_q: Any, out_q: Any, parent_pid: int) -> None:
    """Entry point of a stage process (multiprocessing spawn target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the API server stops us in order
    _die_with_parent()
    holder: dict[str, Any] = {"stage": None, "term": False}

    def _term(signum: int, frame: Any) -> None:
        # SIGTERM (from the API's fallback, or PDEATHSIG): only set flags -- a handler that
        # takes a lock can deadlock the very thread it interrupted. The scheduler loop sees
        # the flag within one step (<= 50 ms idle) and shuts down, unlinking what it owns.
        if holder["term"]:
            return
        holder["term"] = True
        stage = holder["stage"]
        if stage is None:
            raise SystemExit(0)  # still starting: nothing to clean up yet
        stage.stopping = True

    signal.signal(signal.SIGTERM, _term)
    if os.getppid() != parent_pid:
        return
    pipe = config.from_dict(pipe_dict)
    name = pipe.stages[stage_id].name
    record.set_process_info(role="stage", stage=stage_id, replica=0, name=name)
    try:
        holder["stage"] = Stage(pipe, stage_id, snapshot_strategy, shm_mode, pool_prefix, in_q, out_q)
        holder["stage"].run()
    except SystemExit:
        pass
    except BaseException as e:
        out_q.put(("fatal", stage_id, f"{type(e).__name__}: {e}"))
        traceback.print_exc()
        out_q.close()
        out_q.join_thread()
        os._exit(1)
    if holder["term"]:
        out_q.cancel_join_thread()  # the API may be gone: never block on a dead pipe
    out_q.close()
    out_q.join_thread()
