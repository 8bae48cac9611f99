"""Drive the REAL vLLM-Omni Model Runner V2 (MRv2) native data plane across two processes.

MRv2 does not start on a CPU-only machine (vLLM's config check: "Model Runner V2 requires
Triton"), so this runs its data plane's real classes through their own code paths, the
way a stage worker does, without a model (docs/vllm-omni.md says what is real here):

* stage 1 ("talker", this process): a real ``OmniRunnerDataPlane`` with a real
  ``SharedMemoryConnector``. The main thread plays the model thread: it registers the
  requests (``register_request``), reserves and enqueues one batch per step
  (``reserve_outputs``, ``enqueue_outputs``: synthetic codec frames), asks for the terminal
  chunks (``request_terminal``) and drains (``drain_outputs``); the plane's own output
  worker, save thread and connector do the rest, its delivery tickets included. The
  stage's payload builder is this module's ``codec_chunk`` (or, ``--builder batch``,
  ``codec_frames`` with its batch peer ``codec_frames_batch``, the shape of Qwen3-TTS).
* talker-first audio: the real ``FirstAudioSender`` and ``engine_output_queue_sink`` hand
  each request's first audio packet to an engine output queue. Its ``submit`` needs two
  CUDA calls that have no CPU build: ``torch.cuda.Event`` (vLLM's own CPU placeholder,
  ``vllm.v1.worker.cpu.shm``, stands in) and ``torch.empty(..., pin_memory=True)`` ("Found
  no NVIDIA driver"; an unpinned ``torch.empty`` stands in, as vLLM's placeholder does for
  ``Tensor.pin_memory``). The scheduler the sink reads (``requests``, ``vllm_config``) is a
  stand-in holding real ``vllm.v1.request.Request`` objects.
* stage 2 ("code2wav", a process started by vLLM's ``get_mp_context()``): a real
  ``OmniRunnerDataPlane`` receiving, its readiness bound to a real
  ``OmniSchedulingCoordinator`` the way vLLM-Omni binds them for TP = 1
  (``set_omni_connector_output_sink``); its loop does what the scheduler and the runner
  do per step: ``process_pending_chunks``, ``register_receivers``, take the ready requests
  into a step (``pop_local_stage_payload``), ``restore_queues``.
* a real ``OmniDeliveryManager`` ticket that nobody delivers: its own ``wait`` times out.

Prints one JSON line: the driver's own counts (batches per request, builder calls, first
audio packets taken off the engine queue, chunks picked up by the consumer), stamps of its
``enqueue_outputs`` calls, and an (perf_counter_ns, unix ns) anchor.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import queue
import sys
import threading
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

TALKER, CODE2WAV = 1, 2
BUILDERS = {"scalar": "vllm_mrv2_driver.codec_chunk", "batch": "vllm_mrv2_driver.codec_frames"}
_calls: Counter = Counter()  # builder calls per request (external id): one per snapshot
_calls_lock = threading.Lock()
_process_s = 0.0
# the builders wait here until the model thread has enqueued every batch: the queue then
# holds all but the first, whatever the machine's load
gate = threading.Event()


def _chunk_of(codes: Any, is_finished: bool) -> Any:
    import torch
    from vllm_omni.data_entry_keys import CodesStruct, MetaStruct, OmniPayloadStruct

    meta = MetaStruct(left_context_size=0, finished=torch.tensor(is_finished))
    if codes is None or codes.numel() == 0:
        # no frames: no chunk, but a finishing request's last one carries its finish marker
        # (as vLLM-Omni's builders do; 0.30's data plane sends nothing for a None)
        return OmniPayloadStruct(meta=meta) if is_finished else None
    return OmniPayloadStruct(codes=CodesStruct(audio=codes.reshape(-1)), meta=meta)


def _count(request: Any) -> None:
    gate.wait(60)
    with _calls_lock:
        _calls[request.external_req_id] += 1
    time.sleep(_process_s)  # a builder's work


def codec_chunk(transfer_manager: Any, multimodal_output: Any, request: Any, is_finished: bool = False) -> Any:
    """A scalar builder (Qwen3-Omni's shape): one chunk of codec frames per call."""
    _count(request)
    return _chunk_of((multimodal_output or {}).get("codes", {}).get("audio"), is_finished)


def codec_frames(transfer_manager: Any, multimodal_output: Any, request: Any, is_finished: bool = False) -> Any:
    """The scalar twin of ``codec_frames_batch`` (vLLM-Omni loads the batch peer by name)."""
    return codec_chunk(transfer_manager, multimodal_output, request, is_finished)


def codec_frames_batch(transfer_manager: Any, pooling_outputs: list, requests: list, is_finished: list) -> list:
    """A batch builder (Qwen3-TTS's shape): every request's chunk of a step in one call."""
    for r in requests:
        _count(r)
    return [_chunk_of((o or {}).get("codes", {}).get("audio"), f)
            for o, f in zip(pooling_outputs, is_finished, strict=True)]


def _model_config(stage: int, builder: str | None, worker_type: str, name: str) -> Any:
    # The fields the data plane reads; the connector's stage id also in its `extra`.
    return SimpleNamespace(stage_id=stage, async_chunk=True, worker_type=worker_type, max_model_len=8192,
                           model_stage=name, engine_output_type="latent",
                           stage_connector_config={"name": "SharedMemoryConnector", "extra": {"stage_id": stage}},
                           custom_process_next_stage_input_func=builder)


def _anchor() -> list[int]:
    from omnitrace.record import clock_offset_ns
    mono = time.perf_counter_ns()
    return [mono, mono + clock_offset_ns()]


def _load_plugins() -> None:
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what an EngineCore does first: omnitrace's hooks get in here


def _request(rid: str, ext: str) -> Any:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    r = Request(request_id=rid, prompt_token_ids=[0], sampling_params=SamplingParams(max_tokens=64),
                pooling_params=None)
    r.external_req_id = ext
    return r


# --------------------------------------------------------------------------- consumer
def _consume_step(plane: Any, coord: Any, inbox: Any, waiting: Any, running: list,
                  reqs: dict, picked: Counter, done: set) -> None:
    """One scheduler step of the consumer stage, as vLLM-Omni's scheduler and runner do it."""
    ready: set = set()
    finished: set = set()
    while True:
        try:
            out = inbox.get_nowait()
        except queue.Empty:
            break
        ready |= out.chunk_ready_req_ids
        finished |= out.chunk_finished_req_ids
    coord.process_pending_chunks(waiting, running, ready, finished)
    plane.register_receivers(list(coord.pending_chunk_registrations))
    for rid in list(coord.requests_with_ready_chunks):  # taken into a step
        plane.pop_local_stage_payload(rid)
        picked[reqs[rid].external_req_id] += 1
        coord.requests_with_ready_chunks.discard(rid)  # as _clear_chunk_ready after the step
        if rid in coord.finished_requests:
            done.add(rid)
    coord.restore_queues(waiting, running)


def consumer_main(ext_ids: list[str], timeout_s: float, conn: Any) -> None:
    os.environ.setdefault("VLLM_OMNI_REPLICA_ID", "0")
    _load_plugins()
    from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
    from vllm_omni.core.sched.omni_scheduling_coordinator import OmniSchedulingCoordinator
    from vllm_omni.worker_v2.omni_data_plane import OmniRunnerDataPlane

    mc = _model_config(CODE2WAV, None, "generation", "code2wav")
    plane = OmniRunnerDataPlane(SimpleNamespace(model_config=mc), mc)
    coord = OmniSchedulingCoordinator(scheduler_max_num_seqs=64, stage_id=CODE2WAV, async_chunk=True)
    inbox: Any = queue.SimpleQueue()
    plane.set_omni_connector_output_sink(inbox.put)
    waiting = create_request_queue(SchedulingPolicy.FCFS)
    running: list = []
    reqs = {}
    for i, ext in enumerate(ext_ids):
        reqs[f"int-c{i}"] = r = _request(f"int-c{i}", ext)
        waiting.add_request(r)
    picked: Counter = Counter()
    done: set = set()
    conn.send("ready")
    deadline = time.monotonic() + timeout_s
    while len(done) < len(reqs) and time.monotonic() < deadline:
        _consume_step(plane, coord, inbox, waiting, running, reqs, picked, done)
        time.sleep(0.002)
    gets = {reqs[rid].external_req_id: int(plane._get_req_chunk.get(rid, 0)) for rid in reqs}
    plane.close()
    conn.send({"picked": dict(picked), "gets": gets, "done": len(done) == len(reqs)})
    conn.close()


# --------------------------------------------------------------------------- producer
def _first_audio(reqs: dict, mc: Any) -> dict[str, int] | None:
    """Each request's first audio packet through the real FirstAudioSender; one row is
    marked not-audio (``valid``) and one id has no engine route: neither is delivered.
    None where this vLLM-Omni has no talker-first audio (before 0.32)."""
    import importlib.util

    import torch
    if importlib.util.find_spec("vllm_omni.worker_v2.first_audio_sender") is None:
        return None
    import vllm.v1.worker.cpu.shm  # noqa: F401  vLLM's CPU placeholders: torch.cuda.Event/Stream
    from vllm_omni.data_entry_keys import FIRST_AUDIO_KEY
    from vllm_omni.worker_v2.first_audio_sender import FirstAudioSender, engine_output_queue_sink

    out: Any = queue.Queue()
    sched = SimpleNamespace(requests=reqs, vllm_config=SimpleNamespace(model_config=mc))
    sender = FirstAudioSender(engine_output_queue_sink(out, sched))
    ids = [*reqs, "int-no-route"]
    valid = torch.tensor([i != len(reqs) - 1 for i in range(len(ids))])  # the last request: not audio
    empty = torch.empty
    torch.empty = lambda *a, pin_memory=False, **k: empty(*a, **k)  # no pinned memory without CUDA
    try:
        sender.submit(ids, torch.zeros(len(ids), 480), torch.tensor(24000), valid=valid)
    finally:
        torch.empty = empty
    sender.close()  # delivers what was submitted, then stops its thread
    got: Counter = Counter()
    while not out.empty():
        _client, outputs = out.get_nowait()
        for o in outputs.outputs:
            if FIRST_AUDIO_KEY in (o.multimodal_output or {}):
                got[reqs[o.request_id].external_req_id] += 1
    return dict(got)


def _delivery_timeout(ext: str) -> str:
    """A real delivery ticket that nobody delivers: vLLM-Omni's own wait expires it."""
    from vllm_omni.worker_v2.delivery import DeliveryTimeoutError, OmniDeliveryManager

    manager = OmniDeliveryManager(delivery_timeout_s=0.05)
    ticket = manager.create_ticket(request_id=ext, put_key=f"{ext}_{TALKER}_99")
    try:
        ticket.wait()
    except DeliveryTimeoutError as exc:
        return type(exc).__name__
    return "delivered"


def _produce(plane: Any, ext_ids: list[str], steps: int, step_s: float, gate: Any) -> tuple[dict, list, int]:
    """The model thread's part: one batch per step, then the builders' gate opens. Request
    0 has no output at step 1 (no payload: the batch carries it, no chunk); request 1 has
    zero frames at step 2 (its builder makes no chunk). Returns the batches per request,
    each ``enqueue_outputs`` call's (start, end) and when the gate opened."""
    import torch
    from vllm import SamplingParams

    rids = [f"int-p{i}" for i in range(len(ext_ids))]
    for rid, ext in zip(rids, ext_ids):
        plane.register_request(SimpleNamespace(req_id=rid, external_req_id=ext, prompt_token_ids=list(range(300)),
                                               sampling_params=SamplingParams(max_tokens=1000, ignore_eos=True)))
    gen = torch.Generator().manual_seed(0)
    batches: Counter = Counter()
    windows = []
    for step in range(steps):
        outputs = []
        for i in range(len(rids)):
            frames = 0 if (i, step) == (1, 2) else 4
            outputs.append(None if (i, step) == (0, 1) else
                           {"codes.audio": torch.randint(0, 2048, (frames, 16), generator=gen)})
        plane.reserve_outputs(rids)
        t0 = time.perf_counter_ns()
        plane.enqueue_outputs(req_ids=list(rids), inter_stage_outputs=outputs,
                              sampled_token_ids=[[step] for _ in rids])
        windows.append((t0, time.perf_counter_ns()))
        batches.update(ext_ids)
        time.sleep(step_s)
    opened = time.perf_counter_ns()
    gate.set()
    plane.request_terminal(set(rids))  # each request's terminal chunk once its outputs are sent
    plane.drain_outputs()
    return dict(batches), windows, opened


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="model steps (one batch of every request each)")
    ap.add_argument("--builder", choices=sorted(BUILDERS), default="scalar")
    ap.add_argument("--process-ms", type=float, default=1.0, help="the builder's time per request")
    ap.add_argument("--step-ms", type=float, default=1.0, help="the model thread's pause between steps")
    ap.add_argument("--timeout", type=float, default=90.0)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # the module object vLLM-Omni loads the builders from (by dotted path), not __main__
    builders = importlib.import_module(BUILDERS["scalar"].rsplit(".", 1)[0])

    builders._process_s = args.process_ms / 1000
    os.environ.setdefault("VLLM_OMNI_REPLICA_ID", "0")
    _load_plugins()
    from vllm.utils.system_utils import get_mp_context
    from vllm_omni.worker_v2.omni_data_plane import OmniRunnerDataPlane

    # engine ids as AsyncOmni makes them: chatcmpl-<client id>-<8 hex>; ids with underscores
    ext_ids = [f"chatcmpl-mrv2_{os.getpid()}_{i}-{i:08x}" for i in range(args.requests)]
    ctx = get_mp_context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=consumer_main, args=(ext_ids, args.timeout, child),
                       name=f"StageEngineCoreProc_stage{CODE2WAV}_replica0")
    proc.start()
    if not parent.poll(args.timeout) or parent.recv() != "ready":
        print(json.dumps({"error": "consumer did not start"}))
        return 1
    mc = _model_config(TALKER, BUILDERS[args.builder], "ar", "talker")
    plane = OmniRunnerDataPlane(SimpleNamespace(model_config=mc), mc)
    first_audio = _first_audio({f"int-p{i}": _request(f"int-p{i}", e) for i, e in enumerate(ext_ids)}, mc)
    batches, windows, opened = _produce(plane, ext_ids, args.steps, args.step_ms / 1000, builders.gate)
    if not parent.poll(args.timeout + 5):
        print(json.dumps({"error": "consumer timed out"}))
        proc.kill()
        return 1
    result = parent.recv()
    proc.join(30)
    plane.close()
    out = {"ext_ids": ext_ids, "pids": [os.getpid(), os.getppid(), proc.pid], **result,
           "consumer_exit": proc.exitcode, "batches": batches, "builder_calls": dict(builders._calls),
           "first_audio": first_audio, "enqueue_windows": windows, "gate_opened": opened,
           "timeout": _delivery_timeout(ext_ids[0]), "anchor": _anchor()}
    try:
        from omnitrace.inject import patching

        out["patching"] = patching.status()
    except Exception as exc:
        out["patching"] = {"error": repr(exc)}
    print(json.dumps(out))
    return 0 if result["done"] and proc.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
