"""Hooks for vLLM-Omni's Model Runner V2 (MRv2) native data plane and talker-first audio.

MRv2 moves a stage's chunks in its **worker** process (``vllm_omni/worker_v2``), not in the
scheduler's ``OmniChunkTransferAdapter``: the model thread hands each step's outputs, one
batch per step, to a bounded queue (``OmniRunnerDataPlane._native_output_queue``, depth 8);
an output-worker thread (``omni-native-output-<stage>``) takes a batch, snapshots each
request (``_NativeRequestState.snapshot``), builds its payload and enqueues it per request
for the save thread (``omni-mixin-save``), which puts it through the connector; the output
worker waits for every put of the batch (``DeliveryTicket``) before it takes the next batch.
Same events and span names as the V1 adapter where the meaning is the same
(``wrappers.py``); stage = the plane's stage, b = the consumer stage (producer events):

* FIFO_ENQUEUE      ``enqueue_outputs`` entry, one per request of the batch; a = batches ahead
                    (the queue's size). A full queue blocks the model thread there, so that
                    wait counts as residence.
* FIFO_DEQUEUE      ``complete_outputs`` entry on the output worker (the batch was just taken
                    off the queue): one stamp for every request of the batch; a = batches left
* SNAPSHOT_BEGIN/END ``_NativeRequestState.snapshot`` (output worker, after the dequeue;
                    a = COPY: a flat list copy of the token history, empty after chunk 0)
* PROCESS_BEGIN/END ``_build_custom_process_payload`` (scalar builders), or the stage's batch
                    builder (``_custom_process_batch_func``: one call, its interval for each
                    request of it); a = bytes of the chunk it led to (0 = no chunk; 1 =
                    a chunk whose put was not seen: another connector, or not done)
* PUT_BEGIN/END     ``SharedMemoryConnector.put`` (the V1 hook) inside the mixin's
                    ``_send_single_request`` on the save thread
* GET_BEGIN/END     ``SharedMemoryConnector.get`` hits on the receiver thread (the V1 hook)
* CHUNK_READY       the receiver's ``_poll_single_request`` returned True (chunk read and
                    staged; async chunks only); chunk = the one it read
* CHUNK_SCHEDULED   ``OmniSchedulingCoordinator.process_pending_chunks``: ids newly in
                    ``requests_with_ready_chunks``, with the request's latest ready chunk.
                    Only where the receiver runs in the scheduler's process (TP = 1, uniproc
                    executor: vLLM-Omni then binds the worker's readiness to the scheduler).
* STAGE_EMIT        b = AUDIO: ``_EngineOutputSink._send`` put the Talker's first audio packet
                    on the engine core's output queue (talker-first audio); a = packet index
* DELIVERY_TIMEOUT  ``OmniDeliveryManager._timeout`` expired a ticket (a = deadline in ms)

Chunks a stage sends outside the queue (terminal markers and aborts: ``emit_chunks`` from
``request_terminal``/``abort_requests``) have snapshot, process and put but no FIFO events.
A batch's events are written by the output worker when the batch is done (each with its own
stamp): the chunk id of a request is only known once its payload is enqueued, and its bytes
once the save thread put it (before the worker's wait returns). A request of the batch that
sent no chunk carries the index its next chunk will have (PROCESS_END a = 0), as on V1.

Cost per batch request: a few ``perf_counter_ns`` calls, a small object and the events
(~0.2-0.5 us each); a receiver poll that misses costs one dict lookup more.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

from omnitrace import conventions as cv
from omnitrace import record
from omnitrace.inject.patching import Hook, hook_failed
from omnitrace.patches.vllm_omni.wrappers import (NO_CHUNK, _chunk_key, _now, _sched_state, _stage_name,
                                                  _tls, api_request_id)

E = cv.Ev
_emit = record.emit
_COPY = int(cv.Snapshot.COPY)
_AUDIO = int(cv.Modality.AUDIO)
_BOUND = 4096  # per-plane stamps kept for batches in flight (more only when batches were lost)

PLANE_MODULE = "vllm_omni.worker_v2.omni_data_plane"
TRANSPORT_MODULE = "vllm_omni.distributed.omni_connectors.model_runner.omni_connector_payload_transport"
COORDINATOR_MODULE = "vllm_omni.core.sched.omni_scheduling_coordinator"
DELIVERY_MODULE = "vllm_omni.worker_v2.delivery"
FIRST_AUDIO_MODULE = "vllm_omni.worker_v2.first_audio_sender"
PLANE = "OmniRunnerDataPlane"
TRANSPORT = "_OmniConnectorPayloadTransportMixin"

# (stage, engine request id) -> (request id, chunk) of the latest chunk its receiver made
# ready in this process, for the scheduler's pickup (CHUNK_SCHEDULED)
_ready: dict[tuple[int, str], tuple[str, int]] = {}


class _Task:
    """What the output worker did for one request of a batch."""

    __slots__ = ("ext", "snap", "proc", "chunk", "put")

    def __init__(self, ext: str) -> None:
        self.ext = ext  # the connector's request id (the external one, unshortened)
        self.snap: tuple[int, int] | None = None
        self.proc: tuple[int, int] | None = None
        self.chunk: int | None = None  # connector chunk id, once enqueued for the save thread
        self.put: list = [0, 0, None]  # wrappers.wrap_put's slot: (t0, t1, bytes, chunk, to)


class _Cohort:
    """One output-worker batch (``fifo``: its queue stamps) or one ``emit_chunks`` call."""

    __slots__ = ("plane", "fifo", "tasks")

    def __init__(self, plane: Any, fifo: tuple[int, int, int, int] | None) -> None:
        self.plane = plane
        self.fifo = fifo  # (enqueue t, batches ahead, dequeue t, batches left)
        self.tasks: dict[str, _Task] = {}  # engine request id -> task, in batch order

    def task(self, rid: str, ext: str) -> _Task:
        t = self.tasks.get(rid)
        if t is None:
            t = self.tasks[rid] = _Task(ext)
        return t


def _cohort_of(rid: str) -> _Task | None:
    cohort = getattr(_tls, "mrv2", None)
    return cohort.tasks.get(rid) if cohort is not None else None


# --------------------------------------------------------------------------- producer
def _instrument_plane(plane: Any, vllm_config: Any) -> None:
    plane._ot_enq = {}  # id(batch req_ids) -> (enqueue t, batches ahead)
    plane._ot_slots = {}  # put key -> the task's put slot, until the save thread takes it
    replica = int(os.environ.get("VLLM_OMNI_REPLICA_ID", "0") or 0)
    record.set_process_info(role="stage", stage=int(plane._stage_id), replica=replica,
                            name=_stage_name(vllm_config))
    batch = plane.__dict__.get("_custom_process_batch_func")
    if batch is not None:
        plane._custom_process_batch_func = _timed_batch_builder(batch)


def wrap_plane_init(orig: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        try:
            _instrument_plane(self, args[0] if args else kwargs.get("vllm_config"))
        except Exception as exc:
            hook_failed("mrv2 plane init", exc)

    return __init__


def wrap_enqueue_outputs(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The batch is known by its ``req_ids`` list: ``complete_outputs`` gets the same object."""

    @functools.wraps(orig)
    def enqueue_outputs(self: Any, *args: Any, **kwargs: Any) -> Any:
        stamps = self.__dict__.get("_ot_enq")
        if stamps is None:
            return orig(self, *args, **kwargs)
        key = id(kwargs.get("req_ids"))
        try:
            if len(stamps) >= _BOUND:
                stamps.clear()
            stamps[key] = (_now(), self._native_output_queue.qsize())
        except Exception as exc:
            hook_failed("mrv2 output queue enqueue", exc)
        try:
            return orig(self, *args, **kwargs)
        except BaseException:
            stamps.pop(key, None)
            raise

    return enqueue_outputs


def _open_batch(plane: Any, req_ids: Any, t_deq: int) -> _Cohort | None:
    stamps = plane.__dict__.get("_ot_enq")
    if stamps is None:
        return None
    enq = stamps.pop(id(req_ids), None)
    fifo = None if enq is None else (enq[0], enq[1], t_deq, plane._native_output_queue.qsize())
    cohort = _Cohort(plane, fifo)
    states = plane._native_requests
    for rid in dict.fromkeys(req_ids or ()):
        state = states.get(rid)
        if state is not None:
            cohort.task(rid, state.external_req_id)
    return cohort


def _run_cohort(plane: Any, cohort: _Cohort | None, orig: Callable[..., Any], args: tuple,
                kwargs: dict) -> Any:
    if cohort is None:
        return orig(plane, *args, **kwargs)
    prev = getattr(_tls, "mrv2", None)
    _tls.mrv2 = cohort
    try:
        return orig(plane, *args, **kwargs)
    finally:
        _tls.mrv2 = prev
        try:
            _flush(cohort)
        except Exception as exc:
            hook_failed("mrv2 batch", exc)


def wrap_complete_outputs(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def complete_outputs(self: Any, *args: Any, **kwargs: Any) -> Any:
        t_deq = _now()
        try:
            cohort = _open_batch(self, kwargs.get("req_ids"), t_deq)
        except Exception as exc:
            hook_failed("mrv2 output worker batch", exc)
            cohort = None
        return _run_cohort(self, cohort, orig, args, kwargs)

    return complete_outputs


def wrap_emit_chunks(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Chunks sent outside the queue (terminal markers, aborts): their own cohort, no FIFO."""

    @functools.wraps(orig)
    def emit_chunks(self: Any, *args: Any, **kwargs: Any) -> Any:
        cohort = _Cohort(self, None) if "_ot_enq" in self.__dict__ else None
        return _run_cohort(self, cohort, orig, args, kwargs)

    return emit_chunks


def wrap_snapshot(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def snapshot(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = _now()
        res = orig(self, *args, **kwargs)
        t1 = _now()
        cohort = getattr(_tls, "mrv2", None)
        if cohort is not None:
            try:
                cohort.task(self.request_id, self.external_req_id).snap = (t0, t1)
            except Exception as exc:
                hook_failed("mrv2 snapshot", exc)
        return res

    return snapshot


def wrap_build_payload(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``_build_custom_process_payload(request_id, request, pooling_output, ...)``: the
    scalar builder of one request's chunk (``request``: its snapshot)."""

    @functools.wraps(orig)
    def _build_custom_process_payload(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = kwargs["request"] if "request" in kwargs else (args[1] if len(args) > 1 else None)
        task = _cohort_of(getattr(request, "request_id", None)) if request is not None else None
        if task is None:
            return orig(self, *args, **kwargs)
        t0 = _now()
        try:
            return orig(self, *args, **kwargs)
        finally:
            task.proc = (t0, _now())

    return _build_custom_process_payload


def _timed_batch_builder(func: Callable[..., Any]) -> Callable[..., Any]:
    """A stage's batch builder (one call builds every request's payload of a batch)."""

    @functools.wraps(func)
    def batch_builder(*args: Any, **kwargs: Any) -> Any:
        cohort = getattr(_tls, "mrv2", None)
        if cohort is None:
            return func(*args, **kwargs)
        t0 = _now()
        try:
            return func(*args, **kwargs)
        finally:
            t1 = _now()
            for request in kwargs.get("requests") or ():
                task = cohort.tasks.get(getattr(request, "request_id", None))
                if task is not None:
                    task.proc = (t0, t1)

    batch_builder.__omnitrace_hook__ = True  # type: ignore[attr-defined]
    return batch_builder


def wrap_enqueue_chunk(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``_enqueue_chunk_payload(request, payload, ...)`` hands a built chunk to the save
    thread: its put key is known here, so the put's slot is registered before the task is."""

    @functools.wraps(orig)
    def _enqueue_chunk_payload(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        task = _cohort_of(getattr(request, "request_id", None))
        if task is not None:
            try:
                ext = self._resolve_external_req_id(request, request.request_id)
                task.chunk = self._put_req_chunk.get(ext, 0)
                slots = self._ot_slots
                if len(slots) >= _BOUND:
                    slots.clear()
                slots[f"{ext}_{self._stage_id}_{task.chunk}"] = task.put
            except Exception as exc:
                hook_failed("mrv2 chunk enqueue", exc)
        return orig(self, request, *args, **kwargs)

    return _enqueue_chunk_payload


def wrap_save(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The save thread's ``_send_single_request(task)``: the connector put inside it fills
    the task's slot (``wrappers.wrap_put``), read by the output worker's flush for the
    chunk's bytes; the put's own events are written here, on the save thread."""

    @functools.wraps(orig)
    def _send_single_request(self: Any, task: Any, *args: Any, **kwargs: Any) -> Any:
        slots = self.__dict__.get("_ot_slots")
        slot = slots.pop(task.get("put_key"), None) if slots else None
        if slot is None:
            return orig(self, task, *args, **kwargs)
        prev = getattr(_tls, "task", None)
        _tls.task = slot
        try:
            return orig(self, task, *args, **kwargs)
        finally:
            _tls.task = prev
            put = slot[2]
            if put is not None:
                try:
                    ext, stage, chunk = _chunk_key(task["put_key"])
                    _emit(E.PUT_BEGIN, ext, stage, chunk, 0, put[4], put[0])
                    _emit(E.PUT_END, ext, stage, chunk, put[2], put[4], put[1])
                except Exception as exc:
                    hook_failed("mrv2 put", exc)

    return _send_single_request


def _flush(cohort: _Cohort) -> None:
    """The batch's producer events, per request in batch order, each in time order."""
    plane = cohort.plane
    stage, peer = int(plane._stage_id), int(plane._next_stage_id)
    next_chunk = plane._put_req_chunk
    fifo = cohort.fifo
    for task in cohort.tasks.values():
        put = task.put[2]
        # no chunk: the index the next chunk will have (as the V1 hooks record it)
        chunk = task.chunk if task.chunk is not None else next_chunk.get(task.ext, 0)
        ext = api_request_id(task.ext)
        if fifo is not None:
            _emit(E.FIFO_ENQUEUE, ext, stage, chunk, fifo[1], peer, fifo[0])
            _emit(E.FIFO_DEQUEUE, ext, stage, chunk, fifo[3], peer, fifo[2])
        if task.snap is not None:
            _emit(E.SNAPSHOT_BEGIN, ext, stage, chunk, 0, peer, task.snap[0])
            _emit(E.SNAPSHOT_END, ext, stage, chunk, _COPY, peer, task.snap[1])
        if task.proc is not None:
            made = put[2] if put is not None else int(task.chunk is not None)
            _emit(E.PROCESS_BEGIN, ext, stage, chunk, 0, peer, task.proc[0])
            _emit(E.PROCESS_END, ext, stage, chunk, made, peer, task.proc[1])


# --------------------------------------------------------------------------- consumer
def wrap_poll(orig: Callable[..., bool]) -> Callable[..., bool]:
    """Async chunks only: a full payload (``async_chunk: false``) is handed to the scheduler
    by ``process_pending_full_payload_inputs``, which has no chunk to schedule."""

    @functools.wraps(orig)
    def _poll_single_request(self: Any, req_id: str, *args: Any, **kwargs: Any) -> bool:
        chunk = self._get_req_chunk.get(req_id, 0)  # the chunk this poll asks for
        ok = orig(self, req_id, *args, **kwargs)
        if ok and self._async_chunk:
            try:
                stage = int(self._stage_id)
                ext = api_request_id(self._request_ids_mapping.get(req_id, req_id))
                _emit(E.CHUNK_READY, ext, stage, chunk, 0, stage - 1)
                if len(_ready) >= 65536:
                    _ready.clear()
                _ready[(stage, req_id)] = (ext, chunk)
            except Exception as exc:
                hook_failed("mrv2 chunk ready", exc)
        return ok

    return _poll_single_request


def wrap_coordinator_pending(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def process_pending_chunks(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _ready:  # nothing made ready in this process: nothing to diff
            return orig(self, *args, **kwargs)
        before = set(self.requests_with_ready_chunks)
        res = orig(self, *args, **kwargs)
        try:
            new = self.requests_with_ready_chunks.difference(before)
            if new:
                t = _now()
                stage = int(self._stage_id)
                for rid in new:
                    hit = _ready.pop((stage, rid), None)
                    if hit is not None:
                        _emit(E.CHUNK_SCHEDULED, hit[0], stage, hit[1], 0, stage - 1, t)
        except Exception as exc:
            hook_failed("mrv2 chunk scheduled", exc)
        return res

    return process_pending_chunks


# --------------------------------------------------------------------------- delivery
def wrap_delivery_timeout(orig: Callable[..., bool]) -> Callable[..., bool]:
    @functools.wraps(orig)
    def _timeout(self: Any, ticket: Any, *args: Any, **kwargs: Any) -> bool:
        expired = orig(self, ticket, *args, **kwargs)
        if expired:
            try:
                ext, stage, chunk = _chunk_key(ticket.put_key)
                _emit(E.DELIVERY_TIMEOUT, ext, stage, chunk, int(self.delivery_timeout_s * 1000), 0)
            except Exception as exc:
                hook_failed("mrv2 delivery timeout", exc)
        return expired

    return _timeout


def wrap_first_audio_send(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``_EngineOutputSink._send(routes, request_ids, ...)``: each request whose route it
    used up had its first audio packet put on the engine core's output queue."""

    @functools.wraps(orig)
    def _send(self: Any, routes: Any, request_ids: Any, *args: Any, **kwargs: Any) -> Any:
        pending = [r for r in request_ids if r in routes]
        res = orig(self, routes, request_ids, *args, **kwargs)
        try:
            sent = [r for r in pending if r not in routes]
            if sent:
                _emit_first_audio(self.scheduler, sent, _now())
        except Exception as exc:
            hook_failed("talker first audio", exc)
        return res

    return _send


def _emit_first_audio(sched: Any, rids: list[str], t: int) -> None:
    st = _sched_state(sched)
    for rid in rids:
        hit = st.ids.get(rid)  # seen by the stage's add_request hook: its id and packets
        if hit is None:
            req = sched.requests.get(rid)
            hit = [api_request_id(getattr(req, "external_req_id", None) or rid), 0]
        _emit(E.STAGE_EMIT, hit[0], st.stage, NO_CHUNK, hit[1], _AUDIO, t)
        hit[1] += 1


# --------------------------------------------------------------------------- tables
def mrv2_hooks() -> list[Hook]:
    """The native data plane (vLLM-Omni 0.30 on; the same names and signatures in 0.32)."""
    path = cv.PATH_MRV2
    return [
        Hook("mrv2 plane init", PLANE_MODULE, f"{PLANE}.__init__", wrap_plane_init, path=path),
        Hook("mrv2 output queue enqueue", PLANE_MODULE, f"{PLANE}.enqueue_outputs", wrap_enqueue_outputs,
             path=path),
        Hook("mrv2 output worker batch", PLANE_MODULE, f"{PLANE}.complete_outputs", wrap_complete_outputs,
             path=path),
        Hook("mrv2 chunks outside the queue", PLANE_MODULE, f"{PLANE}.emit_chunks", wrap_emit_chunks, path=path),
        Hook("mrv2 snapshot", PLANE_MODULE, "_NativeRequestState.snapshot", wrap_snapshot, path=path),
        Hook("mrv2 payload build", TRANSPORT_MODULE, f"{TRANSPORT}._build_custom_process_payload",
             wrap_build_payload, path=path),
        Hook("mrv2 chunk enqueue", TRANSPORT_MODULE, f"{TRANSPORT}._enqueue_chunk_payload", wrap_enqueue_chunk,
             path=path),
        Hook("mrv2 put", TRANSPORT_MODULE, f"{TRANSPORT}._send_single_request", wrap_save, path=path),
        Hook("mrv2 chunk ready", TRANSPORT_MODULE, f"{TRANSPORT}._poll_single_request", wrap_poll, path=path),
        Hook("mrv2 chunk scheduled", COORDINATOR_MODULE, "OmniSchedulingCoordinator.process_pending_chunks",
             wrap_coordinator_pending, path=path),
        Hook("mrv2 delivery timeout", DELIVERY_MODULE, "OmniDeliveryManager._timeout", wrap_delivery_timeout,
             path=path),
    ]


def talker_first_audio_hooks() -> list[Hook]:
    """The Talker's own first audio packet (``FirstAudioSender``, vLLM-Omni 0.32 on)."""
    return [Hook("talker first audio", FIRST_AUDIO_MODULE, "_EngineOutputSink._send", wrap_first_audio_send,
                 path=cv.PATH_TALKER_FIRST_AUDIO)]
