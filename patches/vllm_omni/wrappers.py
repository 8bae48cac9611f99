"""Wrappers for vLLM-Omni's async-chunk path, shared by the per-version hook tables.

Where each event comes from (stage = the recording process's stage, chunk = connector chunk id):

* SNAPSHOT_BEGIN/END  ``OmniChunkTransferAdapter._snapshot_processor_request`` (scheduler thread)
* FIFO_ENQUEUE        a ``deque`` subclass swapped in for ``adapter._pending_save_reqs``:
                      exact stamp taken in ``append``; a = tasks ahead (len before append)
* FIFO_DEQUEUE        ``_send_single_request`` entry (save thread); a = tasks left after the pop
* PROCESS_BEGIN/END   the adapter's ``custom_process_next_stage_input_func`` (save thread);
                      a = bytes of the chunk it led to (0 = no chunk)
* PUT_BEGIN/END       ``SharedMemoryConnector.put``; a = bytes, b = consumer stage
* GET_BEGIN/END       ``SharedMemoryConnector.get``, hits only (a miss returns None and is
                      not recorded); GET_BEGIN is the start of the call that hit
* CHUNK_READY         ``_commit_received_chunk`` returned True (receiver thread)
* CHUNK_SCHEDULED     ``process_pending_chunks`` moved the request into
                      ``requests_with_ready_chunks`` (consumer scheduler thread)
* CHUNK_READY (<= 0.26) ``_poll_single_request`` returned True (get + commit in one method)
* STAGE_ADD           vLLM's ``Scheduler.add_request`` in a stage process (a = waiting depth);
                      the orchestrator's prewarm adds a request to the talker and code2wav
                      at arrival, so their ``queue`` starts there
* STAGE_SCHEDULE      ``OmniSchedulerMixin._wrap_omni_scheduler_output`` (the end of every
                      ``schedule()``): the step's ``scheduled_new_reqs`` (a = running)
* STEP_BEGIN/END      ``EngineCore.step`` / ``step_with_batch_queue``, steps that ran the model
                      (a = requests the step's ``schedule()`` scheduled; b = 0: prefill
                      tokens are not split out here)
* STAGE_EMIT/FINISH   ``update_from_output`` of the AR and generation schedulers: one EMIT
                      per request output of the step (a = index, b = AUDIO where the stage's
                      ``engine_output_type`` is audio), FINISH with its finish reason
* REQUEST_DISPATCH    ``StagePool.submit_initial`` of stage 0 returned (API process,
                      orchestrator thread: the request went to the thinker's engine)
* PACKET_RECEIVED     ``Orchestrator._handle_processed_outputs``: the first output of a
                      request from a stage whose final output is audio
* PACKET_RESUMED      the chat stream handler took that output from its result generator
* STAGE_DIED          ``Orchestrator._handle_dead_replica``: a stage replica's EngineCore died
* REQUEST_ARRIVE / FIRST_TEXT / FIRST_AUDIO / END   ``OmniOpenAIServingChat`` streaming path;
                      with REQUEST_ARRIVE, the caller's W3C ``traceparent`` header (if any)
                      as :func:`omnitrace.tracecontext.record_traceparent` records it

The chunk id of a producer task is only known once its put happens on the save thread, so
the producer events of one task (snapshot, enqueue, dequeue, process, put) are written
together by the save thread when the task is done, each with its own exact timestamp
(``record.emit(..., t=...)``), in time order. A task that produced no chunk (the processor
returned None mid-stream) carries the index the *next* chunk will have (PROCESS_END a = 0),
as ``omnitrace.runtime`` does. ``cleanup_shm``/``release_shm`` tasks share the FIFO and are
written as FIFO_ENQUEUE/DEQUEUE with chunk -1.

Cost: each wrapped call adds two ``perf_counter_ns`` calls and a tuple or a thread-local
store; events are the recorder's ~0.2-0.5 us each. A connector ``get`` miss (the receiver
polls every waiting request each pass) costs one ``perf_counter_ns`` and a None check.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import threading
import time
from collections import deque
from typing import Any, Callable

from omnitrace import conventions as cv
from omnitrace import record, requestids, tracecontext
from omnitrace.inject.patching import Hook, hook_failed

E = cv.Ev
_now = time.perf_counter_ns
_emit = record.emit
_tls = threading.local()
NO_CHUNK = cv.NO_CHUNK
API = cv.API_STAGE

ADAPTER_MODULE = "vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter"
SHM_MODULE = "vllm_omni.distributed.omni_connectors.connectors.shm_connector"
CHAT_MODULE = "vllm_omni.entrypoints.openai.serving_chat"
SCHED_MODULE = "vllm.v1.core.sched.scheduler"
CORE_MODULE = "vllm.v1.engine.core"
MIXIN_MODULE = "vllm_omni.core.sched.omni_scheduler_mixin"
AR_MODULE = "vllm_omni.core.sched.omni_ar_scheduler"
GEN_MODULE = "vllm_omni.core.sched.omni_generation_scheduler"
ORCH_MODULE = "vllm_omni.engine.orchestrator"
POOL_MODULE = "vllm_omni.engine.stage_pool"
ADAPTER = "OmniChunkTransferAdapter"
SHM = "SharedMemoryConnector"
CHAT = "OmniOpenAIServingChat"


# --------------------------------------------------------------------------- request ids
_api_ids: dict[str, str] = {}


def api_request_id(engine_id: str) -> str:
    """The request's id in omnitrace: the one its client gave it (``requestids.recorded_id``:
    both the route's and the engine's affixes dropped), so one request is one trace from
    arrival to its last chunk and joins any client's own records (omnitrace bench,
    vLLM-Omni's benchmark client) without knowing the server's naming: a request that
    failed before its first chunk never saw the server's id. Memoised: the stage hooks ask
    once per event, the answer changes once per request.
    """
    hit = _api_ids.get(engine_id)
    if hit is None:
        if len(_api_ids) >= 8192:  # bounded: old requests are done
            _api_ids.clear()
        hit = _api_ids[engine_id] = requestids.recorded_id(engine_id)
    return hit


def _chunk_key(key: str) -> tuple[str, int, int]:
    """A connector key as (request id, producer stage, chunk)."""
    eid, src, chunk = requestids.chunk_key(key)
    return api_request_id(eid), src, chunk


# --------------------------------------------------------------------------- producer
class StampedDeque(deque):
    """``adapter._pending_save_reqs`` with the exact enqueue stamp and depth kept per task.

    Stamps live beside the task (keyed by ``id(task)``), so the task dict the adapter
    reads is untouched. The save loop looks the attribute up on every iteration, so the
    swap takes effect right after the adapter is built.
    """

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self.stamps: dict[int, tuple[int, int, tuple | None]] = {}

    def append(self, task: Any) -> None:
        try:
            t = _now()
            snap = getattr(_tls, "snap", None)
            if snap is not None:
                _tls.snap = None
                if task.get("request") is not snap[0]:
                    snap = None  # a stale snapshot of a rejected save; not this task's
            stamp = (t, len(self), snap)
            self.stamps[id(task)] = stamp
            batch = task.get("batch")
            if batch:  # 0.32 save_async_batch: one FIFO task for a step's requests
                for inner in batch:
                    self.stamps[id(inner)] = stamp
        except Exception as exc:
            hook_failed("fifo enqueue", exc)
        deque.append(self, task)


def _wrap_processor(func: Callable[..., Any]) -> Callable[..., Any]:
    # functools.wraps keeps inspect.signature (the adapter checks for new_token_ids).
    @functools.wraps(func)
    def processor(*args: Any, **kwargs: Any) -> Any:
        cur = getattr(_tls, "task", None)
        if cur is None:
            return func(*args, **kwargs)
        cur[0] = _now()
        try:
            return func(*args, **kwargs)
        finally:
            cur[1] = _now()

    processor.__omnitrace_hook__ = True  # type: ignore[attr-defined]
    return processor


def _instrument_adapter(adapter: Any, cfg: Any) -> None:
    stage = int(adapter.connector.stage_id)
    adapter._ot_stage = stage
    adapter._ot_ready = {}
    replica = int(os.environ.get("VLLM_OMNI_REPLICA_ID", "0") or 0)
    record.set_process_info(role="stage", stage=stage, replica=replica, name=_stage_name(cfg))
    if not isinstance(adapter._pending_save_reqs, StampedDeque):
        adapter._pending_save_reqs = StampedDeque(adapter._pending_save_reqs)
    func = getattr(adapter, "custom_process_next_stage_input_func", None)
    if func is not None and not getattr(func, "__omnitrace_hook__", False):
        adapter.custom_process_next_stage_input_func = _wrap_processor(func)


def _stage_name(cfg: Any) -> str | None:
    """The stage's model part (``thinker``, ``talker``, ``code2wav``): what a user calls the
    stage; the process name (``StageEngineCoreProc_stage{S}_replica{R}``) where the adapter
    was given no model config (the test harness)."""
    name = getattr(getattr(cfg, "model_config", None), "model_stage", None)
    if isinstance(name, str) and name:
        return name
    pname = multiprocessing.current_process().name
    return None if pname == "MainProcess" else pname


def wrap_init(orig: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        try:
            _instrument_adapter(self, args[0] if args else kwargs.get("vllm_config"))
        except Exception as exc:
            hook_failed("adapter init", exc)

    return __init__


def make_snapshot_wrapper(strategy: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``_snapshot_processor_request`` is a staticmethod: no adapter, no stage; its stamps
    go to a thread-local that the FIFO append (same thread, same save) picks up."""

    def wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def _snapshot_processor_request(request: Any) -> Any:
            t0 = _now()
            snap = orig(request)
            _tls.snap = (snap, t0, _now(), strategy)
            return snap

        return _snapshot_processor_request

    return wrap


def _flush_task(adapter: Any, task: dict, stamp: tuple, t_deq: int, left: int, cur: list) -> None:
    stage = adapter._ot_stage
    peer = stage + 1
    t_enq, ahead, snap = stamp
    req = task.get("request")
    if req is None:  # cleanup_shm / release_shm (batch tasks are written per inner task)
        spec = task.get("cleanup_shm") or task.get("release_shm")
        if spec is None:
            return
        prefix = (spec[0] if isinstance(spec, tuple) else spec).rstrip("_")
        ext = api_request_id(prefix.rsplit("_", 1)[0])
        _emit(E.FIFO_ENQUEUE, ext, stage, NO_CHUNK, ahead, peer, t_enq)
        _emit(E.FIFO_DEQUEUE, ext, stage, NO_CHUNK, left, peer, t_deq)
        return
    ext = api_request_id(req.external_req_id)
    put = cur[2]
    # no put: the index the next chunk will have (as omnitrace.runtime records it)
    chunk = put[3] if put is not None else adapter.put_req_chunk.get(ext, 0)
    if snap is not None:
        _emit(E.SNAPSHOT_BEGIN, ext, stage, chunk, 0, peer, snap[1])
        _emit(E.SNAPSHOT_END, ext, stage, chunk, snap[3], peer, snap[2])
    _emit(E.FIFO_ENQUEUE, ext, stage, chunk, ahead, peer, t_enq)
    _emit(E.FIFO_DEQUEUE, ext, stage, chunk, left, peer, t_deq)
    if cur[0]:
        _emit(E.PROCESS_BEGIN, ext, stage, chunk, 0, peer, cur[0])
        _emit(E.PROCESS_END, ext, stage, chunk, put[2] if put is not None else 0, peer, cur[1])
    if put is not None:
        _emit(E.PUT_BEGIN, ext, stage, chunk, 0, put[4], put[0])
        _emit(E.PUT_END, ext, stage, chunk, put[2], put[4], put[1])


def wrap_send(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _send_single_request(self: Any, task: dict) -> Any:
        t_deq = _now()
        queue = self._pending_save_reqs
        stamps = getattr(queue, "stamps", None)
        stamp = stamps.pop(id(task), None) if stamps is not None else None
        if stamp is None:
            return orig(self, task)
        left = len(queue)
        prev = getattr(_tls, "task", None)
        cur: list = [0, 0, None]  # process begin, process end, put (t0, t1, bytes, chunk, to)
        _tls.task = cur
        try:
            return orig(self, task)
        finally:
            _tls.task = prev
            try:
                _flush_task(self, task, stamp, t_deq, left, cur)
            except Exception as exc:
                hook_failed("fifo dequeue", exc)

    return _send_single_request


# --------------------------------------------------------------------------- connector
def wrap_put(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def put(self: Any, from_stage: Any, to_stage: Any, put_key: str, data: Any,
            *args: Any, **kwargs: Any) -> Any:
        t0 = _now()
        res = orig(self, from_stage, to_stage, put_key, data, *args, **kwargs)
        t1 = _now()
        try:
            size = int(res[1]) if res and res[0] else 0
            cur = getattr(_tls, "task", None)
            if cur is not None:  # inside an adapter task: written with the task (its id), in order
                cur[2] = (t0, t1, size, int(put_key.rsplit("_", 1)[1]), int(to_stage))
            else:
                ext, _, c = _chunk_key(put_key)
                stage, peer = int(from_stage), int(to_stage)
                _emit(E.PUT_BEGIN, ext, stage, c, 0, peer, t0)
                _emit(E.PUT_END, ext, stage, c, size, peer, t1)
        except Exception as exc:
            hook_failed("connector put", exc)
        return res

    return put


def wrap_get(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def get(self: Any, from_stage: Any, to_stage: Any, get_key: str, *args: Any, **kwargs: Any) -> Any:
        t0 = _now()
        res = orig(self, from_stage, to_stage, get_key, *args, **kwargs)
        if res is None:  # a miss: the receiver polls every waiting request; not an event
            return res
        t1 = _now()
        try:
            ext, peer, c = _chunk_key(get_key)
            stage = int(to_stage)
            size = int(res[1]) if isinstance(res, tuple) and len(res) > 1 else 0
            _emit(E.GET_BEGIN, ext, stage, c, 0, peer, t0)
            _emit(E.GET_END, ext, stage, c, size, peer, t1)
        except Exception as exc:
            hook_failed("connector get", exc)
        return res

    return get


# --------------------------------------------------------------------------- consumer
def wrap_commit(orig: Callable[..., bool]) -> Callable[..., bool]:
    @functools.wraps(orig)
    def _commit_received_chunk(self: Any, request: Any, result: Any, *args: Any, **kwargs: Any) -> bool:
        ok = orig(self, request, result, *args, **kwargs)
        if ok:
            try:
                stage = int(kwargs["stage_id"])
                chunk = int(kwargs["chunk_id"])
                ext = _chunk_key(kwargs["connector_get_key"])[0]
                _emit(E.CHUNK_READY, ext, stage, chunk, 0, stage - 1)
                ready = getattr(self, "_ot_ready", None)
                if ready is not None:
                    ready[kwargs["req_id"]] = (ext, chunk)
            except Exception as exc:
                hook_failed("chunk commit", exc)
        return ok

    return _commit_received_chunk


def wrap_poll_legacy(orig: Callable[..., bool]) -> Callable[..., bool]:
    """<= 0.26: ``_poll_single_request(self, request)`` gets, commits and returns True when
    a chunk is ready; the chunk it committed is the one ``get_req_chunk`` named before."""

    @functools.wraps(orig)
    def _poll_single_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> bool:
        rid = request.request_id
        chunk = self.get_req_chunk.get(rid, 0)
        ok = orig(self, request, *args, **kwargs)
        if ok:
            try:
                stage = int(self.connector.stage_id)
                ext = api_request_id(request.external_req_id)
                _emit(E.CHUNK_READY, ext, stage, int(chunk), 0, stage - 1)
                ready = getattr(self, "_ot_ready", None)
                if ready is not None:
                    ready[rid] = (ext, int(chunk))
            except Exception as exc:
                hook_failed("chunk commit", exc)
        return ok

    return _poll_single_request


def wrap_pending(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def process_pending_chunks(self: Any, *args: Any, **kwargs: Any) -> Any:
        pending = getattr(self, "_ot_ready", None)
        if not pending:  # no committed chunk waits for pickup: nothing to diff
            return orig(self, *args, **kwargs)
        ready = self.requests_with_ready_chunks
        before = set(ready)
        res = orig(self, *args, **kwargs)
        try:
            new = self.requests_with_ready_chunks.difference(before)
            if new:
                t = _now()
                stage = self._ot_stage
                for rid in new:
                    hit = pending.pop(rid, None)
                    if hit is not None:
                        _emit(E.CHUNK_SCHEDULED, hit[0], stage, hit[1], 0, stage - 1, t)
        except Exception as exc:
            hook_failed("chunk scheduled", exc)
        return res

    return process_pending_chunks


# --------------------------------------------------------------------------- stage scheduler
class _SchedState:
    """What a stage scheduler's hooks keep: its stage, output modality and, per engine
    request id, the API id and the outputs emitted so far."""

    __slots__ = ("stage", "modality", "ids", "batch")

    def __init__(self, sched: Any) -> None:
        mc = sched.vllm_config.model_config
        self.stage = int(getattr(mc, "stage_id", 0) or 0)
        audio = getattr(mc, "engine_output_type", None) == "audio"
        self.modality = int(cv.Modality.AUDIO if audio else cv.Modality.TEXT)
        self.ids: dict[str, list] = {}  # engine id -> [api id, outputs emitted]
        self.batch = 0  # requests in the last schedule() (for the step's STEP_BEGIN)
        # named before its first event: a stage's first ring may come before its adapter
        replica = int(os.environ.get("VLLM_OMNI_REPLICA_ID", "0") or 0)
        record.set_process_info(role="stage", stage=self.stage, replica=replica,
                                name=_stage_name(sched.vllm_config))


def _sched_state(sched: Any) -> _SchedState:
    st = sched.__dict__.get("_ot_sched")
    if st is None:
        st = sched.__dict__["_ot_sched"] = _SchedState(sched)
    return st


def wrap_add_request(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        t = _now()
        res = orig(self, request, *args, **kwargs)
        try:
            if getattr(self.vllm_config.model_config, "stage_id", None) is not None:
                st = _sched_state(self)
                eid = request.request_id
                if eid not in st.ids:  # a streaming update re-adds a known request
                    ext = api_request_id(getattr(request, "external_req_id", None) or eid)
                    st.ids[eid] = [ext, 0]
                    _emit(E.STAGE_ADD, ext, st.stage, NO_CHUNK, len(self.waiting), 0, t)
        except Exception as exc:
            hook_failed("stage add", exc)
        return res

    return add_request


def wrap_schedule_output(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _wrap_omni_scheduler_output(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        res = orig(self, scheduler_output, *args, **kwargs)
        try:
            st = _sched_state(self)
            st.batch = len(getattr(res, "num_scheduled_tokens", None) or ())
            new = getattr(res, "scheduled_new_reqs", None)
            if new:
                t = _now()
                for nr in new:
                    hit = st.ids.get(nr.req_id)
                    if hit is not None:
                        _emit(E.STAGE_SCHEDULE, hit[0], st.stage, NO_CHUNK, len(self.running), 0, t)
        except Exception as exc:
            hook_failed("stage schedule", exc)
        return res

    return _wrap_omni_scheduler_output


def wrap_engine_step(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``EngineCore.step`` / ``step_with_batch_queue`` -> (outputs, model_executed). Only a
    step that ran the model is recorded: a stage waiting for chunks polls empty steps
    every millisecond, which would be events without compute. Both events are written at
    the step's end, STEP_BEGIN with the stamp taken at its start."""

    @functools.wraps(orig)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = _now()
        res = orig(self, *args, **kwargs)
        try:
            if res[1]:
                st = self.scheduler.__dict__.get("_ot_sched")  # an Omni stage's scheduler
                if st is not None:
                    _emit(E.STEP_BEGIN, "", st.stage, NO_CHUNK, st.batch, 0, t)
                    _emit(E.STEP_END, "", st.stage, NO_CHUNK, st.batch, 0)
        except Exception as exc:
            hook_failed("stage step", exc)
        return res

    return step


def wrap_update_from_output(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The AR scheduler's ``update_from_output`` calls vLLM's through ``super()``; both
    classes are wrapped, so only the outermost call records (a thread-local depth)."""

    @functools.wraps(orig)
    def update_from_output(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_tls, "ufo", 0)
        _tls.ufo = depth + 1
        try:
            res = orig(self, *args, **kwargs)
        finally:
            _tls.ufo = depth
        if depth == 0 and res:
            try:
                _emit_outputs(self, res)
            except Exception as exc:
                hook_failed("stage emit", exc)
        return res

    return update_from_output


def _emit_outputs(sched: Any, res: dict) -> None:
    t = _now()
    st = _sched_state(sched)
    for eco in res.values():
        for o in getattr(eco, "outputs", ()) or ():
            hit = st.ids.get(o.request_id)
            if hit is None:
                continue
            _emit(E.STAGE_EMIT, hit[0], st.stage, NO_CHUNK, hit[1], st.modality, t)
            hit[1] += 1
            if o.finish_reason is not None:
                aborted = str(getattr(o.finish_reason, "name", o.finish_reason)).upper() in ("ABORT", "ERROR")
                status = cv.Status.ERROR if aborted else cv.Status.OK
                _emit(E.STAGE_FINISH, hit[0], st.stage, NO_CHUNK, int(status), 0, t)
                del st.ids[o.request_id]


# --------------------------------------------------------------------------- orchestrator
def wrap_submit_initial(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``StagePool.submit_initial``: the request entered a stage's engine; for stage 0 that
    is the API's dispatch (prewarm submissions to later stages are not)."""

    @functools.wraps(orig)
    async def submit_initial(self: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        res = await orig(self, request_id, *args, **kwargs)
        if getattr(self, "stage_id", None) == 0:
            try:
                _emit(E.REQUEST_DISPATCH, api_request_id(str(request_id)), API, NO_CHUNK, 0, 0)
            except Exception as exc:
                hook_failed("request dispatch", exc)
        return res

    return submit_initial


def wrap_processed_outputs(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def _handle_processed_outputs(self: Any, stage_id: int, replica_id: int, outputs: Any,
                                        *args: Any, **kwargs: Any) -> Any:
        try:
            pool = self.stage_pools[stage_id]
            if outputs and getattr(pool.stage_client, "final_output_type", None) == "audio":
                t = _now()
                seen = self.__dict__.setdefault("_ot_audio_seen", set())
                for out in outputs:
                    rid = out.request_id
                    if rid not in seen:
                        if len(seen) > 65536:
                            seen.clear()
                        seen.add(rid)
                        _emit(E.PACKET_RECEIVED, api_request_id(rid), API, NO_CHUNK, 0, stage_id, t)
        except Exception as exc:
            hook_failed("packet received", exc)
        return await orig(self, stage_id, replica_id, outputs, *args, **kwargs)

    return _handle_processed_outputs


def wrap_dead_replica(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The orchestrator evicts a stage replica whose EngineCore died (its requests fail)."""

    @functools.wraps(orig)
    async def _handle_dead_replica(self: Any, stage_id: int, *args: Any, **kwargs: Any) -> Any:
        try:
            _emit(E.STAGE_DIED, "", int(stage_id), NO_CHUNK, 0, 0)
        except Exception as exc:
            hook_failed("stage died", exc)
        return await orig(self, stage_id, *args, **kwargs)

    return _handle_dead_replica


# --------------------------------------------------------------------------- API server
_api_named = False


def _api_process() -> None:
    global _api_named
    if not _api_named:
        _api_named = True
        record.set_process_info(role="api", stage=API)


def wrap_create_chat(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Arrival is stamped when the handler is entered. The request id is only known once
    the handler builds the stream, so the stamp waits in a dict keyed by the request
    object (handlers of concurrent requests interleave at awaits on the one loop thread)."""

    @functools.wraps(orig)
    async def create_chat_completion(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = _now()
        arrivals = _arrivals()
        arrivals[id(request)] = t0
        try:
            return await orig(self, request, *args, **kwargs)
        finally:
            arrivals.pop(id(request), None)

    return create_chat_completion


def _arrivals() -> dict[int, int]:
    d = getattr(_tls, "arrivals", None)
    if d is None:
        d = _tls.arrivals = {}
    return d


def wrap_stream(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def chat_completion_stream_generator(self: Any, request: Any, result_generator: Any,
                                         request_id: str, *args: Any, **kwargs: Any) -> Any:
        rid = requestids.route_request_id(str(request_id))
        gen = orig(self, request, _stamp_resumed(result_generator, rid), request_id, *args, **kwargs)
        try:
            _api_process()
            t0 = _arrivals().get(id(request)) or _now()
            max_tokens = getattr(request, "max_completion_tokens", None) or getattr(request, "max_tokens", None) or 0
            _emit(E.REQUEST_ARRIVE, rid, API, NO_CHUNK, 0, int(max_tokens), t0)
            headers = getattr(_raw_request(args, kwargs), "headers", None)
            if headers is not None:  # the caller's W3C trace context, if it sent one
                tracecontext.record_traceparent(rid, headers, t0)
        except Exception as exc:
            hook_failed("request arrival", exc)
            return gen
        return _watch_stream(gen, rid)

    return chat_completion_stream_generator


async def _stamp_resumed(gen: Any, rid: str) -> Any:
    """The engine's outputs as the stream handler takes them; the first audio one stamped.
    Closing this generator closes the engine's (its ``finally`` aborts the request)."""
    audio = False
    try:
        async for out in gen:
            if not audio and getattr(out, "final_output_type", None) == "audio":
                audio = True
                _emit(E.PACKET_RESUMED, rid, API, NO_CHUNK, 0, 0)
            yield out
    finally:
        aclose = getattr(gen, "aclose", None)
        if aclose is not None:
            await aclose()


def _raw_request(args: tuple, kwargs: dict) -> Any:
    """The FastAPI request the route handed down (keyword ``raw_request`` in every version
    so far; positionally, the one argument with ASGI ``scope`` and ``headers``)."""
    raw = kwargs.get("raw_request")
    if raw is None:
        raw = next((a for a in args if hasattr(a, "scope") and hasattr(a, "headers")), None)
    return raw


def _has_text(item: str) -> bool:
    i = item.find('"content":"')
    return i >= 0 and item[i + 11:i + 12] not in ('"', "")


async def _watch_stream(gen: Any, rid: str) -> Any:
    """Re-yield the SSE lines; stamp the first text and the first audio packet."""
    text = audio = False
    sent = 0
    status = cv.Status.OK
    try:
        async for item in gen:
            if not (text and audio) and isinstance(item, str):
                try:
                    if not audio and '"modality":"audio"' in item:
                        audio = True
                        _emit(E.REQUEST_FIRST_AUDIO, rid, API, NO_CHUNK, 0, 0)
                    elif not text and '"modality":"text"' in item and _has_text(item):
                        text = True
                        _emit(E.REQUEST_FIRST_TEXT, rid, API, NO_CHUNK, 0, 0)
                except Exception as exc:
                    hook_failed("first packet", exc)
            sent += len(item)
            yield item
    except GeneratorExit:
        status = cv.Status.CANCELLED
        raise
    except BaseException:
        status = cv.Status.ERROR
        raise
    finally:
        _emit(E.REQUEST_END, rid, API, NO_CHUNK, int(status), sent)
        aclose = getattr(gen, "aclose", None)
        if aclose is not None and status != cv.Status.OK:
            try:
                await aclose()
            except Exception:
                pass


# --------------------------------------------------------------------------- tables
def chunk_hooks(snapshot_strategy: int) -> list[Hook]:
    """The async-chunk hooks whose shape is the same in every supported version."""
    v1 = cv.PATH_V1_ADAPTER
    return [
        Hook("adapter init", ADAPTER_MODULE, f"{ADAPTER}.__init__", wrap_init, path=v1),
        Hook("snapshot", ADAPTER_MODULE, f"{ADAPTER}._snapshot_processor_request",
             make_snapshot_wrapper(snapshot_strategy), static=True, path=v1),
        Hook("fifo dequeue", ADAPTER_MODULE, f"{ADAPTER}._send_single_request", wrap_send, path=v1),
        Hook("chunk commit", ADAPTER_MODULE, f"{ADAPTER}._commit_received_chunk", wrap_commit, path=v1),
        Hook("chunk scheduled", ADAPTER_MODULE, f"{ADAPTER}.process_pending_chunks", wrap_pending, path=v1),
        *connector_hooks(),
    ]


def legacy_chunk_hooks() -> list[Hook]:
    """<= 0.26: no snapshot, and the receiver commits inside ``_poll_single_request``."""
    v1 = cv.PATH_V1_ADAPTER
    return [
        Hook("adapter init", ADAPTER_MODULE, f"{ADAPTER}.__init__", wrap_init, path=v1),
        Hook("fifo dequeue", ADAPTER_MODULE, f"{ADAPTER}._send_single_request", wrap_send, path=v1),
        Hook("chunk commit", ADAPTER_MODULE, f"{ADAPTER}._poll_single_request", wrap_poll_legacy, path=v1),
        Hook("chunk scheduled", ADAPTER_MODULE, f"{ADAPTER}.process_pending_chunks", wrap_pending, path=v1),
        *connector_hooks(),
    ]


def connector_hooks() -> list[Hook]:
    """The SharedMemoryConnector's put and get, whichever chunk path calls them."""
    shm = cv.PATH_SHM_CONNECTOR
    return [
        Hook("connector put", SHM_MODULE, f"{SHM}.put", wrap_put, path=shm),
        Hook("connector get", SHM_MODULE, f"{SHM}.get", wrap_get, path=shm),
    ]


def api_hooks() -> list[Hook]:
    return [
        Hook("api arrival", CHAT_MODULE, f"{CHAT}.create_chat_completion", wrap_create_chat),
        Hook("api stream", CHAT_MODULE, f"{CHAT}.chat_completion_stream_generator", wrap_stream),
    ]


def server_hooks() -> list[Hook]:
    """The stage schedulers and the orchestrator: what only the real server runs (>= 0.30)."""
    return [
        Hook("stage add", SCHED_MODULE, "Scheduler.add_request", wrap_add_request),
        Hook("stage schedule", MIXIN_MODULE, "OmniSchedulerMixin._wrap_omni_scheduler_output",
             wrap_schedule_output),
        Hook("stage emit (ar)", AR_MODULE, "OmniARScheduler.update_from_output", wrap_update_from_output),
        Hook("stage emit (generation)", GEN_MODULE, "OmniGenerationScheduler.update_from_output",
             wrap_update_from_output),
        Hook("stage step", CORE_MODULE, "EngineCore.step", wrap_engine_step),
        Hook("stage step (batch queue)", CORE_MODULE, "EngineCore.step_with_batch_queue", wrap_engine_step),
        Hook("request dispatch", POOL_MODULE, "StagePool.submit_initial", wrap_submit_initial),
        Hook("packet received", ORCH_MODULE, "Orchestrator._handle_processed_outputs",
             wrap_processed_outputs),
        Hook("stage died", ORCH_MODULE, "Orchestrator._handle_dead_replica", wrap_dead_replica),
    ]
