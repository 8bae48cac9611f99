"""Cost the vLLM-Omni hooks add to the real classes' hot calls, against the recorder's own.

Run in a vLLM-Omni venv (scripts/install-vllm-omni.sh):
    .venv-vllm/bin/python benchmarks/vllm_hook_overhead.py
Measures, per call, the unpatched and the patched cost of
  * SharedMemoryConnector.get on a miss (the receiver polls every waiting request),
  * SharedMemoryConnector.put + get hit of a small chunk,
  * OmniChunkTransferAdapter._snapshot_processor_request on a 2,500-token request,
and one ``record.emit`` for reference. Recording goes to a throw-away run id.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from types import SimpleNamespace

os.environ.setdefault("OMNITRACE_RUN_ID", "bench-" + uuid.uuid4().hex[:6])


def per_call_ns(fn, n: int, rounds: int = 5) -> float:
    best = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(best)


def main() -> int:
    from vllm import SamplingParams
    from vllm.v1.request import Request
    from vllm_omni.distributed.omni_connectors.connectors.shm_connector import SharedMemoryConnector
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
        OmniChunkTransferAdapter as A,
    )

    from omnitrace import record
    from omnitrace.conventions import Ev
    from omnitrace.inject import patching

    mc = SimpleNamespace(stage_id=1, async_chunk=True, worker_type="generation", max_model_len=8192,
                         stage_connector_config={"name": "SharedMemoryConnector", "extra": {}},
                         custom_process_next_stage_input_func=None)
    adapter = A(SimpleNamespace(model_config=mc, scheduler_config=SimpleNamespace(max_num_seqs=8)))
    conn = adapter.connector
    req = Request(request_id="b", prompt_token_ids=list(range(2500)),
                  sampling_params=SamplingParams(max_tokens=8), pooling_params=None)
    req.external_req_id, req.additional_information = "bench", None
    payload = {"x": list(range(64))}
    counter = iter(range(10**9))

    def get_miss() -> None:
        conn.get("0", "1", "nokey_0_0")

    def put_get() -> None:
        key = f"bench_0_{next(counter)}"
        conn.put("0", "1", key, payload)
        conn.get("0", "1", key)

    def snapshot() -> None:
        A._snapshot_processor_request(req)

    cases = [("get miss", get_miss, 5000), ("put+get hit", put_get, 200), ("snapshot 2500 tok", snapshot, 200)]
    base: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    patched: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    emits = []
    for _ in range(7):  # alternate, so machine noise hits both sides alike
        patching.remove()
        for name, fn, n in cases:
            base[name].append(per_call_ns(fn, n, 1))
        assert patching.apply() is not None, "no hook set for this vLLM-Omni version"
        for name, fn, n in cases:
            patched[name].append(per_call_ns(fn, n, 1))
        emits.append(per_call_ns(lambda: record.emit(Ev.PUT_END, "bench", 0, 1, 2, 3), 5000, 1))
    med = statistics.median
    print(f"vllm-omni hooks, per call (median of 7 alternating rounds); record.emit = {med(emits):.0f} ns")
    for name, _, _ in cases:
        b, p = med(base[name]), med(patched[name])
        print(f"  {name:<18} unpatched {b:>10.0f} ns  patched {p:>10.0f} ns  added {p - b:>7.0f} ns")
    for ring in record.discover(os.environ["OMNITRACE_RUN_ID"]):
        record.RingReader(ring).close(unlink=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
